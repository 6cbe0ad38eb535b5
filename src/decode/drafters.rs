//! Drafters: where draft tokens come from.
//!
//! - [`PromptLookup`]: a live index of the prompt and everything generated so far (it learns
//!   each accepted token). Grounded answers repeat their prompt, and generated text repeats
//!   itself.
//! - [`CorpusDrafter`]: an ∞-gram index built with the model's tokenizer
//!   (`infgram index --tokenizer smollm2-135m`), or shards of one held elsewhere. It follows the longest suffix of the context
//!   that occurs in the corpus and drafts its most frequent continuation (the argmax chain of
//!   the ∞-gram, which is what greedy decoding can accept).
//!
//! Both extend a draft one token at a time, re-matching the context plus the draft so far, and
//! attach to every token a confidence from the evidence (match length, how many occurrences
//! agree); the decode loop cuts the draft where the expected gain no longer pays for the longer
//! pass, and drafts nothing when nothing is likely.

use super::gram_chains::GramChains;
use super::{Draft, Drafter};
use crate::error::Result;
use crate::index::levels::{Level, LevelAsk, Memo};
use crate::index::shards::Shards;
use crate::index::shards::SharedShards;
use crate::ngram::sbis::sbis_distribution;
use std::sync::{Arc, Mutex};

/// A draft stops growing once the chance that all of it is accepted falls below this.
const MIN_REACH: f64 = 0.05;

/// Extends `seq` one token at a time with `next` (the token and its confidence after the
/// sequence so far, or `None` to stop) until the draft has `max` tokens or the chance that all
/// of it is accepted falls below [`MIN_REACH`].
fn grow_draft(
    seq: &mut Vec<u32>,
    max: usize,
    mut next: impl FnMut(&[u32]) -> Result<Option<(u32, f64)>>,
) -> Result<Draft> {
    let mut draft = Draft::default();
    let mut reach = 1.0;
    while draft.tokens.len() < max {
        let Some((tok, conf)) = next(seq)? else {
            break;
        };
        draft.tokens.push(tok);
        draft.confidence.push(conf);
        seq.push(tok);
        reach *= conf;
        if reach < MIN_REACH {
            break;
        }
    }
    Ok(draft)
}

/// Prompt lookup's confidence that a continuation seen `agree` times out of `total`
/// occurrences of a suffix of `len` tokens comes next again: the agreeing share, with half a
/// pseudo-occurrence for it and one against it that shrinks as the match grows (halving every
/// 4 tokens: a continuation that followed 20 tokens matching the context is a copy in
/// progress, one that followed 2 is a guess), discounted for short matches (1 − 2^−len). A
/// single occurrence gives 0.375 after 1 token, 0.91 after 8, 0.98 after 16. The decode loop
/// calibrates it against the model's acceptances.
pub(super) fn copy_confidence(agree: u64, total: u64, len: usize) -> f64 {
    // The pseudo-occurrence against, by match length (a table: `powf` cost more than the
    // rest of a draft step).
    static AGAINST: std::sync::OnceLock<[f64; 241]> = std::sync::OnceLock::new();
    let against =
        AGAINST.get_or_init(|| std::array::from_fn(|i| 0.5 * 0.5f64.powf(i as f64 / 4.0)));
    let against = against[(len.max(1) - 1).min(240)];
    let share = (agree as f64 + 0.5) / (total as f64 + 0.5 + against);
    let length = 1.0 - 0.5f64.powi(len.min(60) as i32);
    share * length
}

/// Longest match followed back when prompt lookup's n-grams all match: how far the copy runs.
const MAX_MATCH: usize = 256;

/// Occurrences of a suffix that vote for its continuation (the latest ones).
const MAX_VOTES: usize = 16;

/// Longest n-gram prompt lookup indexes.
pub const MAX_NGRAM: usize = 32;

/// What the occurrences of a suffix voted for.
struct Votes {
    /// `(token, votes)`, most votes first, ties to the most recent continuation; the first
    /// `len` entries.
    tally: [(u32, u64); MAX_VOTES],
    len: usize,
    /// Occurrences that voted.
    occurrences: u64,
    /// Length of the matched suffix.
    suffix_len: usize,
}

impl Votes {
    /// One occurrence's vote for `token` after a suffix of `suffix_len` tokens.
    fn single(token: u32, suffix_len: usize) -> Votes {
        let mut tally = [(0, 0); MAX_VOTES];
        tally[0] = (token, 1);
        Votes {
            tally,
            len: 1,
            occurrences: 1,
            suffix_len,
        }
    }

    /// `(token, votes)`, most votes first.
    fn ranked(&self) -> &[(u32, u64)] {
        &self.tally[..self.len]
    }
}

/// Tokens that (re)start following a copy: the context's last `RESYNC` tokens seen before.
const RESYNC: usize = 4;

/// After a copy breaks off, a short match whose continuation lies at most this many tokens
/// past the break in the source is taken as the copy resuming (the model changed a word, or
/// skipped a line).
const RESUME_WINDOW: usize = 8;

/// Tokens after a break during which the copy may resume.
const RESUME_LIFE: usize = 24;

/// A resuming match counts as this many tokens longer than it is (its place in the source is
/// evidence too).
const RESUME_BONUS: usize = 4;

/// Where a copy in progress reads from, so that it can resume after the model changes a few
/// tokens.
#[derive(Clone, Copy, Debug, Default)]
struct CopyState {
    /// Position of the source token the copy expects next, while the copy holds.
    source: Option<usize>,
    /// Where the last copy broke off: the source position it expected, and the context
    /// position where the model wrote something else.
    broke: Option<(usize, usize)>,
}

/// How many tokens before `a` in `seq` equal those before `b` (`a < b`), at most `max`.
fn common_tail(seq: &[u32], a: usize, b: usize, max: usize) -> usize {
    let max = max.min(a);
    let mut k = 0;
    // Whole blocks first (a slice compare is vectorized), then token by token.
    const BLOCK: usize = 16;
    while k + BLOCK <= max && seq[a - k - BLOCK..a - k] == seq[b - k - BLOCK..b - k] {
        k += BLOCK;
    }
    while k < max && seq[a - k - 1] == seq[b - k - 1] {
        k += 1;
    }
    k
}

/// Prompt lookup over a live n-gram index of the sequence ([`GramChains`]: each n-gram's
/// occurrences a chain, latest first, a few bytes a token).
///
/// The index and the copy being followed live in a `LookupState` that [`PromptLookup::twin`]
/// shares: a braid's prompt lookup and the one beside it index the same context once.
pub struct PromptLookup {
    state: Arc<Mutex<LookupState>>,
    /// The sequence a draft grows in (kept to spare an allocation per draft).
    scratch: Vec<u32>,
    /// Whether [`Drafter::bytes`] counts the index (the lookup made by `new`; its twins do
    /// not, so a shared index is counted once).
    counts_index: bool,
}

/// What prompt lookup knows of a context: its n-gram chains and the copy it is making.
struct LookupState {
    /// Longest suffix matched.
    max_ngram: usize,
    /// The indexed context (a prefix of the context) and its chains.
    chains: GramChains,
    /// The copy the context is making, if any.
    copy: CopyState,
}

impl PromptLookup {
    /// Prompt lookup matching suffixes of up to `max_ngram` tokens (at most [`MAX_NGRAM`]),
    /// and following a full match back up to 256 tokens.
    pub fn new(max_ngram: usize) -> Self {
        let max_ngram = max_ngram.clamp(1, MAX_NGRAM);
        PromptLookup {
            state: Arc::new(Mutex::new(LookupState {
                max_ngram,
                chains: GramChains::new(max_ngram),
                copy: CopyState::default(),
            })),
            scratch: Vec::new(),
            counts_index: true,
        }
    }

    /// Another prompt lookup over the same index: what one learns of a context, the other
    /// knows (the same drafts as two lookups of their own, from one index).
    pub fn twin(&self) -> Self {
        PromptLookup {
            state: self.state.clone(),
            scratch: Vec::new(),
            counts_index: false,
        }
    }

    /// The copy being followed.
    #[cfg(test)]
    fn copy(&self) -> CopyState {
        self.state.lock().unwrap().copy
    }

    /// The shared state, synced to `context`.
    fn synced(&self, context: &[u32]) -> std::sync::MutexGuard<'_, LookupState> {
        // A panic while indexing leaves a prefix of the context indexed: read on.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.sync(context);
        state
    }
}

impl LookupState {
    /// Indexes `context` beyond what is indexed (or from scratch if it is not an extension).
    fn sync(&mut self, context: &[u32]) {
        if !context.starts_with(self.chains.seq()) {
            self.chains.clear();
            self.copy = CopyState::default();
        }
        self.chains.reserve(context.len() - self.chains.seq().len());
        for p in self.chains.seq().len()..context.len() {
            // Position p follows the n-grams that end at p - 1.
            self.chains.push(context[p]);
            self.track(context, p);
        }
    }

    /// Follows the copy in progress through the context's token at `p`: it holds while the
    /// token is the source's next one; when it is not, the copy broke there; a copy starts
    /// (or resumes) where the last [`RESYNC`] tokens were seen before, nearest after the
    /// break when there was one, else most recently.
    fn track(&mut self, context: &[u32], p: usize) {
        match self.copy.source {
            Some(q) if q < p && context[q] == context[p] => {
                self.copy.source = Some(q + 1);
                return;
            }
            Some(q) => {
                self.copy = CopyState {
                    source: None,
                    broke: Some((q, p)),
                }
            }
            None => {}
        }
        if self.copy.broke.is_some_and(|(_, at)| p > at + RESUME_LIFE) {
            self.copy.broke = None;
        }
        if p + 1 < RESYNC || self.max_ngram < RESYNC {
            return;
        }
        // Latest first: the nearest after the break is the last one past it.
        let mut found = self.chains.followers(context, p + 1, RESYNC);
        let after_break = self
            .copy
            .broke
            .and_then(|(q, _)| found.clone().take_while(|&f| f > q).last());
        if let Some(f) = after_break.or_else(|| found.next()) {
            self.copy = CopyState {
                source: Some(f),
                broke: None,
            };
        }
    }

    /// Right after a copy broke off: the continuation of the longest short suffix of `seq`
    /// (under [`RESYNC`] tokens) that occurs just past the break in the source.
    fn resume(&self, seq: &[u32]) -> Option<Votes> {
        let (q, _) = self.copy.broke?;
        let longest = (RESYNC - 1).min(self.max_ngram).min(seq.len());
        for m in (1..=longest).rev() {
            // Latest first: the nearest past the break is the last one after it.
            let near = self
                .chains
                .followers(seq, seq.len(), m)
                .take_while(|&f| f > q)
                .filter(|&f| f <= q + RESUME_WINDOW && f < seq.len())
                .last();
            if let Some(f) = near {
                return Some(Votes::single(seq[f], m + RESUME_BONUS));
            }
        }
        None
    }

    /// The continuations of the longest suffix of `seq` seen before in it, over its latest 16
    /// occurrences; right after a copy broke off, a short match just past the break instead.
    fn tally(&self, seq: &[u32]) -> Option<Votes> {
        let votes = self.longest_suffix_votes(seq);
        if votes.as_ref().is_none_or(|v| v.suffix_len < RESYNC) && self.copy.source.is_none() {
            if let Some(resumed) = self.resume(seq) {
                return Some(resumed);
            }
        }
        votes
    }

    /// [`LookupState::tally`] without the copy's place: the longest suffix's votes. Each key
    /// length's chain finds the suffixes from its length up to the next one's, longest first.
    fn longest_suffix_votes(&self, seq: &[u32]) -> Option<Votes> {
        let mut hi = self.max_ngram.min(seq.len());
        while hi >= 1 {
            let k = self.chains.key_length(hi);
            if let Some(votes) = self.votes_on_chain(seq, k, hi) {
                return Some(votes);
            }
            hi = k - 1;
        }
        None
    }

    /// The longest suffix of `seq` of `k..=hi` tokens seen before (a walk down the chain of
    /// its last `k` tokens, measuring each occurrence's match) and the votes of its latest
    /// [`MAX_VOTES`] occurrences.
    fn votes_on_chain(&self, seq: &[u32], k: usize, hi: usize) -> Option<Votes> {
        let end = seq.len();
        let (mut best, mut found, mut n_found) = (0, [0usize; MAX_VOTES], 0);
        for p in self.chains.chain(seq, end, k).filter(|&p| p < end) {
            let len = k + common_tail(seq, p - k, end - k, hi - k);
            if len > best {
                (best, n_found) = (len, 0);
            }
            if len == best && n_found < MAX_VOTES {
                found[n_found] = p;
                n_found += 1;
            }
            if best == hi && n_found == MAX_VOTES {
                break;
            }
        }
        let found = &found[..n_found];
        if found.is_empty() {
            return None;
        }
        let mut tally = [(0u32, 0u64); MAX_VOTES];
        let mut len = 0;
        for &p in found {
            let v = seq[p];
            match tally[..len].iter_mut().find(|t| t.0 == v) {
                Some(t) => t.1 += 1,
                None => {
                    tally[len] = (v, 1);
                    len += 1;
                }
            }
        }
        // Stable: among equal votes the most recent continuation stays first.
        tally[..len].sort_by_key(|t| std::cmp::Reverse(t.1));
        // When the longest n-gram looked up matches, follow the match further back (the most
        // recent occurrence of the winning continuation): how far the copy runs.
        let suffix_len = if best == self.max_ngram {
            let winner = tally[0].0;
            found
                .iter()
                .find(|&&p| seq[p] == winner)
                .map_or(best, |&p| common_tail(seq, p, end, MAX_MATCH).max(best))
        } else {
            best
        };
        Some(Votes {
            tally,
            len,
            occurrences: found.len() as u64,
            suffix_len,
        })
    }

    /// The majority continuation of `seq`: (token, agreeing occurrences, occurrences, suffix
    /// length).
    fn next(&self, seq: &[u32]) -> Option<(u32, u64, u64, usize)> {
        self.tally(seq)
            .map(|v| (v.tally[0].0, v.tally[0].1, v.occurrences, v.suffix_len))
    }

    /// The next token after `seq` and its confidence.
    fn next_confident(&self, seq: &[u32]) -> Option<(u32, f64)> {
        self.next(seq)
            .map(|(tok, agree, total, len)| (tok, copy_confidence(agree, total, len)))
    }
}

impl Drafter for PromptLookup {
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft> {
        // Positions inside the draft are not indexed; `next` only follows indexed ones.
        let mut seq = std::mem::take(&mut self.scratch);
        seq.clear();
        seq.reserve(context.len() + max);
        seq.extend_from_slice(context);
        let state = self.synced(context);
        let draft = grow_draft(&mut seq, max, |seq| Ok(state.next_confident(seq)));
        drop(state);
        self.scratch = seq;
        draft
    }

    fn alternatives(&mut self, context: &[u32], n: usize) -> Result<Vec<(u32, f64)>> {
        let state = self.synced(context);
        Ok(state.tally(context).map_or(Vec::new(), |v| {
            v.ranked()
                .iter()
                .take(n)
                .map(|&(tok, agree)| (tok, copy_confidence(agree, v.occurrences, v.suffix_len)))
                .collect()
        }))
    }

    fn next_after(&mut self, seq: &[u32], context_len: usize) -> Result<Option<(u32, f64)>> {
        Ok(self.synced(&seq[..context_len]).next_confident(seq))
    }

    fn observe(&mut self, context: &[u32]) {
        drop(self.synced(context));
    }

    fn bytes(&self) -> usize {
        let index = match self.counts_index {
            true => {
                let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                state.chains.bytes()
            }
            false => 0,
        };
        index + 4 * self.scratch.capacity()
    }

    fn name(&self) -> &str {
        "prompt"
    }
}

/// Drafters that draft together, token by token: each next token is the one the most
/// confident part proposes after the context and the draft so far. A repeated task's answer
/// takes its frame from past outputs and its data from the prompt; a braid drafts both in one
/// pass where either alone would stop at the first switch. [`Draft::parts`] says which part
/// proposed each token.
pub struct Braid {
    parts: Vec<Box<dyn Drafter>>,
}

impl Braid {
    /// At most 256 parts.
    pub fn new(parts: Vec<Box<dyn Drafter>>) -> Self {
        assert!(parts.len() <= 256, "a braid has at most 256 parts");
        Braid { parts }
    }
}

impl Drafter for Braid {
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft> {
        let mut parts = Vec::new();
        let mut seq = context.to_vec();
        seq.reserve(max);
        let mut draft = grow_draft(&mut seq, max, |seq| {
            let mut best: Option<(u32, f64, u8)> = None;
            for (i, part) in self.parts.iter_mut().enumerate() {
                if let Some((t, c)) = part.next_after(seq, context.len())? {
                    if best.is_none_or(|b| c > b.1) {
                        best = Some((t, c, i as u8));
                    }
                }
            }
            Ok(best.map(|(token, confidence, part)| {
                parts.push(part);
                (token, confidence)
            }))
        })?;
        draft.parts = parts;
        Ok(draft)
    }

    fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.bytes()).sum()
    }

    fn observe(&mut self, context: &[u32]) {
        for p in &mut self.parts {
            p.observe(context);
        }
    }

    fn name(&self) -> &str {
        "braid"
    }

    fn part_name(&self, part: u8) -> &str {
        self.parts.get(part as usize).map_or("braid", |p| p.name())
    }
}

/// Shortest suffix match the corpus drafters draft from.
const MIN_CORPUS_MATCH: usize = 2;

/// The context is cut to its last this many tokens before the corpus drafters match it.
const CORPUS_WINDOW: usize = 64;

/// How the corpus drafter picks the next token of the context's longest matching suffix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CorpusRule {
    /// The SBIS distribution over all levels (weights `decay^j`): its argmax chain. The default:
    /// on `bench_decode speculative`'s outputs it is the model's next token more often (10.8% vs 6.8%
    /// of open-question positions, 26.2% vs 20.8% in Shakespeare, in the last run).
    Sbis { decay: f64 },
    /// The most frequent continuation of the longest matching suffix alone.
    MostFrequent,
}

/// Where the longest-suffix rule stands: a sequence drafted from, the length of its level's
/// suffix, and each shard's forward suffix-array range of that suffix (found on the first step
/// that needs it, on an index in this process: [`Shards::narrowed_level`](crate::index::shards::Shards::narrowed_level)).
///
/// The next step's sequence is this one plus the token drafted, `t`, one of the level's
/// continuations, so the suffix followed by `t` occurs, and no longer suffix of the new
/// sequence does (it would make a longer level of this one). Its occurrences are those of the
/// level's suffix narrowed by `t`: one binary search in a small range per shard, where a
/// search anew narrows the reversed suffix array once per token of the match. Only when none
/// of them has a next token (each at a document's end) is the new level searched for.
///
/// The next draft starts where the engine took the last one: its context ends with one of the
/// last draft's sequences (the tokens it accepted) and the model's own token, so its first
/// step follows that sequence's level the same way ([`Chain::leads_to`]).
#[derive(Clone)]
struct Chain {
    seq: Vec<u32>,
    len: usize,
    ranges: Option<Vec<crate::index::Range>>,
}

impl Chain {
    /// Bytes it holds.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Chain>()
            + 4 * self.seq.capacity()
            + self.ranges.as_ref().map_or(0, |r| {
                r.capacity() * std::mem::size_of::<crate::index::Range>()
            })
    }
}

impl Default for CorpusRule {
    /// SBIS with decay 0.1 over every level.
    fn default() -> Self {
        CorpusRule::Sbis { decay: 0.1 }
    }
}

/// Drafts from the ∞-gram of a corpus in the model's tokens: an index in this process or
/// shards held elsewhere ([`Shards`]: the same drafts from the same documents, each step one
/// round trip to every shard). It keeps one memo of its reads (the level finder and its counts
/// cache's counters) across drafts.
pub struct CorpusDrafter {
    corpus: SharedShards,
    memo: Memo,
    rule: CorpusRule,
    /// The longest-suffix rule's place in the draft being grown.
    chain: Option<Chain>,
    /// Its place after each step of the last draft (where the next draft may start).
    history: Vec<Chain>,
    /// Shortest suffix match worth drafting from.
    min_match: usize,
    /// The context is cut to its last this many tokens before matching.
    max_context: usize,
}

impl Chain {
    /// Whether `seq` is this chain's sequence plus one token, as far as levels go: its tokens
    /// before the last are the chain's sequence, or a longer sequence ending with it (when the
    /// level is shorter than the chain's sequence, no longer suffix of the longer one has a
    /// next token either), or a shorter one that ends it (the context window moved on) and
    /// still holds the level's suffix.
    fn leads_to(&self, seq: &[u32]) -> bool {
        let Some((_, before)) = seq.split_last() else {
            return false;
        };
        let q = &self.seq[..];
        match before.len().cmp(&q.len()) {
            std::cmp::Ordering::Equal => before == q,
            std::cmp::Ordering::Greater => self.len < q.len() && before.ends_with(q),
            std::cmp::Ordering::Less => self.len <= before.len() && q.ends_with(before),
        }
    }
}

impl CorpusDrafter {
    /// Drafts the SBIS argmax chain (decay 0.1, all levels).
    pub fn new(corpus: SharedShards) -> Self {
        Self::with_rule(corpus, CorpusRule::default())
    }

    /// Drafts by `rule`. Documents' ends are not drafted.
    pub fn with_rule(corpus: SharedShards, rule: CorpusRule) -> Self {
        CorpusDrafter {
            corpus,
            memo: Memo::new(false),
            rule,
            chain: None,
            history: Vec::new(),
            min_match: MIN_CORPUS_MATCH,
            max_context: CORPUS_WINDOW,
        }
    }

    /// The longest-suffix level of `seq` from the last step's ([`Chain`]), with each shard's
    /// range of its suffix, when the last step's sequence leads to `seq` and one of
    /// the narrowed occurrences has a next token; `None`: search (a sequence the last one does
    /// not lead to included, [`Chain::leads_to`]).
    fn chained(&mut self, seq: &[u32]) -> Option<(Level, Option<Vec<crate::index::Range>>)> {
        let chain = self.chain.take()?;
        if !chain.leads_to(seq) {
            return None;
        }
        let q = &seq[seq.len() - 1 - chain.len..];
        let mut ranges = chain.ranges;
        let level = self.corpus.narrowed_level(&mut self.memo, q, &mut ranges)?;
        Some((level, ranges))
    }

    /// The `n` likeliest next tokens after `seq` with their confidences, best first (ties to
    /// the smaller id); none when the longest match is shorter than `min_match`.
    fn ranked(&mut self, seq: &[u32], n: usize) -> Result<Vec<(u32, f64)>> {
        // Every step checks its whole sequence, chained from the last step or not: whether a
        // step chains depends on where the shards are, and an id outside the vocabulary is
        // refused wherever they are.
        self.corpus.check_tokens(seq)?;
        let (len, mut scored) = match self.rule {
            CorpusRule::MostFrequent => {
                // The first level: the longest suffix with a next token (the ∞-gram's), its
                // counts from the index's counts cache; after a drafted token, from the last
                // step's level ([`Chain`]).
                let (level, ranges) = match self.chained(seq) {
                    Some((level, ranges)) => (level, ranges),
                    None => {
                        let ask = LevelAsk::new(seq, 1);
                        let levels = self.corpus.levels(&mut self.memo, ask)?;
                        let Some(level) = levels.into_iter().next() else {
                            return Ok(Vec::new());
                        };
                        (level, None)
                    }
                };
                self.chain = Some(Chain {
                    seq: seq.to_vec(),
                    len: level.len,
                    ranges,
                });
                (level.len, level_shares(&level))
            }
            CorpusRule::Sbis { decay } => {
                let levels = self.corpus.levels(&mut self.memo, LevelAsk::new(seq, -1))?;
                let len = levels.first().map_or(0, |l| l.len);
                (len, sbis_distribution(&levels, decay))
            }
        };
        // Only ids of the vocabulary are drafted (an index built in memory may hold others).
        scored.retain(|&(t, _)| self.corpus.holds_token(t));
        Ok(best_scored(len, scored, n, self.min_match))
    }
}

/// The longest-suffix rule's probabilities: each continuation's share of the level's count,
/// with half a pseudo-count for it and one in all.
fn level_shares(level: &Level) -> Vec<(u32, f64)> {
    let total = level.total.max(1) as f64;
    level
        .counts
        .iter()
        .map(|&(t, c)| (t, (c as f64 + 0.5) / (total + 1.0)))
        .collect()
}

/// The `n` best of `scored` after a longest match of `len` tokens, best first (ties to the
/// smaller id), discounted for short matches as prompt lookup's confidences are; none when
/// the match is shorter than `min_match`.
fn best_scored(
    len: usize,
    mut scored: Vec<(u32, f64)>,
    n: usize,
    min_match: usize,
) -> Vec<(u32, f64)> {
    if len < min_match {
        return Vec::new();
    }
    let order = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if n == 1 {
        // The draft's chain needs only the best: no sort of a long tail.
        scored = scored.into_iter().min_by(order).into_iter().collect();
    } else {
        scored.sort_by(order);
        scored.truncate(n);
    }
    let length = 1.0 - 0.5f64.powi(len.min(60) as i32);
    scored.into_iter().map(|(t, p)| (t, p * length)).collect()
}

impl Drafter for CorpusDrafter {
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft> {
        let from = context.len().saturating_sub(self.max_context);
        let mut seq = Vec::with_capacity(context.len() - from + max);
        seq.extend_from_slice(&context[from..]);
        // The chain holds within one draft, whose every step adds the token just drafted, and
        // from the step of the last draft that the engine kept.
        let mut history = std::mem::take(&mut self.history);
        self.chain = history.drain(..).rev().find(|c| c.leads_to(&seq));
        self.history = history;
        let draft = grow_draft(&mut seq, max, |seq| {
            let next = self.ranked(seq, 1)?.into_iter().next();
            self.history.extend(self.chain.clone());
            Ok(next)
        });
        self.chain = None;
        draft
    }

    fn alternatives(&mut self, context: &[u32], n: usize) -> Result<Vec<(u32, f64)>> {
        let from = context.len().saturating_sub(self.max_context);
        self.chain = None;
        let ranked = self.ranked(&context[from..], n);
        self.chain = None;
        ranked
    }

    fn bytes(&self) -> usize {
        self.chain
            .iter()
            .chain(&self.history)
            .map(Chain::bytes)
            .sum()
    }

    fn name(&self) -> &str {
        "corpus"
    }
}

#[cfg(test)]
mod tests;
