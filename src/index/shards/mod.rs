//! Queries answered shard by shard, then merged: the one path every query type of
//! [`query`](super::query) takes.
//!
//! A shard answers a [`ShardQuery`] with a [`ShardAnswer`] ([`answer`]): plain data, serde
//! serializable, about that shard alone (its own suffix-array ranges, positions and document
//! numbers). The functions of this module ask the shards through a [`Shards`] and merge their
//! answers into the query's result. The ∞-gram queries take two rounds: each shard's longest
//! occurring suffix of the prompt, the maximum, then counts at that length; a CNF search takes
//! two as well (clause totals, to choose the rarest clause over all shards, then the matches);
//! a document fetch is routed to the one shard that holds it.
//!
//! [`Index`] is a [`Shards`] over its in-process shards. A shard held by another
//! process answers the same queries with [`answer`]; a [`Shards`] that carries them there and
//! back plugs into the same merges.
//!
//! [`Shards`] is the one corpus trait: the readers of a corpus (the ∞-gram's estimators, the
//! corpus drafter, the copy guard) read through it, each written once over a
//! [`SharedShards`]. Its reading operations ([`Shards::levels`], [`Shards::suffix_match`] …)
//! answer by default through [`Shards::ask`] (the merge of the shards' answers: what shards
//! held elsewhere give), and [`Index`] answers them with its own fast paths and memos.
//!
//! Here: the trait, [`SharedShards`], [`AskOnly`] (shards that answer only through `ask`, as a
//! router does) and `asked` (the shards' answers, checked: what every merge reads). `wire`:
//! the questions and answers. `check`: an answer checked against its question, a question
//! against the shard. `answer`: how a shard answers. `merge`: the merges of answers over
//! shards. `local`: [`Index`]'s implementation.
//!
//! [`Index`]: crate::index::Index

mod answer;
mod check;
mod local;
mod merge;
mod wire;

pub use answer::*;
pub use check::check_question;
pub use merge::*;
pub use wire::*;

use crate::error::{Error, Result};
use crate::index::counting::SuffixFeeds;
use crate::index::counts_cache::CacheStats;
use crate::index::levels::{Level, LevelAsk, Memo};
use crate::index::query::{
    CountResult, Counts, Document, FindResult, Match, NtdResult, ProbResult, SearchResult,
};
use crate::index::spans::SuffixMatch;
use crate::index::Range;
use crate::tokenizer::TokenizerSpec;
use check::{check_answer, Bounds};

/// Shards to ask: in this process ([`Index`](crate::index::Index)) or elsewhere (a Python router's actors). Shared
/// between threads (a counting pass asks shards elsewhere from the thread that counts).
pub trait Shards: Sync {
    /// How many shards there are.
    fn shard_count(&self) -> usize;
    /// Positions and documents of each shard, in order.
    fn infos(&self) -> Vec<ShardInfo>;
    /// The separator id: a document's end in next-token counts.
    fn separator(&self) -> u32;
    /// The tokenizer's vocabulary size (0 when unknown).
    fn vocab_size(&self) -> usize;
    /// The answers to `asks` (each a shard and its question), in the same order.
    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>>;

    /// Whether `t` is an id of the vocabulary (below its size and the separator): only those
    /// can occur.
    fn holds_token(&self, t: u32) -> bool {
        t < self.separator() && (t as usize) < self.vocab_size().max(1)
    }

    /// Refuses token ids outside the vocabulary (the separator and above), which every query
    /// does first.
    fn check_tokens(&self, q: &[u32]) -> Result<()> {
        match q.iter().find(|&&t| !self.holds_token(t)) {
            Some(&t) => Err(Error::input(format!(
                "token id {t} is outside the index's vocabulary (0..{})",
                self.vocab_size()
            ))),
            None => Ok(()),
        }
    }

    /// Documents in all shards.
    fn num_docs(&self) -> u64 {
        self.infos().iter().map(|i| i.documents).sum()
    }

    // What the readers of a corpus read (the ∞-gram's estimators, the corpus drafter, the copy
    // guard): written once over these, each answered here through `ask` (the merge of every
    // shard's answers, for shards held elsewhere) and by an index in this process with its own
    // fast paths and memos.

    /// The levels `ask` asks for, longest first, through `memo` (the reader's own). Over shards
    /// held elsewhere: one round trip for every shard's change points ([`level_points`]), and
    /// one more for the continuation counts of the smoothed estimator when asked for them.
    fn levels(&self, memo: &mut Memo, ask: LevelAsk<'_>) -> Result<Vec<Level>> {
        let keep_end = memo.keep_end();
        let mut levels =
            levels_over_with(self, ask.ctx, ask.k, ask.include_empty, ask.keep, keep_end)?;
        if ask.continuation && levels.len() > 1 {
            let ctx = ask.ctx;
            let hs: Vec<&[u32]> = levels[1..]
                .iter()
                .map(|l| &ctx[ctx.len() - l.len..])
                .collect();
            let continuations = self.continuation_counts(&hs, keep_end)?;
            for (level, c) in levels[1..].iter_mut().zip(continuations) {
                level.continuations = Some(std::sync::Arc::new(c));
            }
        }
        Ok(levels)
    }

    /// The first `k` levels of `ctx` (all when `k < 0`) during generation, where `ctx` is the
    /// context of the last call plus `appended` (`None`: anything else), into `levels`
    /// (cleared first). An index in this process extends the last step's small levels by the
    /// one token ([`next_levels_into`](super::levels::LevelFinder::next_levels_into)); the
    /// same levels as [`Shards::levels`] of `ctx`.
    fn next_levels(
        &self,
        memo: &mut Memo,
        ctx: &[u32],
        appended: Option<u32>,
        k: i64,
        levels: &mut Vec<Level>,
    ) -> Result<()> {
        let _ = appended;
        *levels = self.levels(memo, LevelAsk::new(ctx, k))?;
        Ok(())
    }

    /// The corpus drafter's chain: the level of `q` (a level's suffix of the last call,
    /// `q[..len-1]`, followed by one of its continuations) when it has a next token, found by
    /// narrowing the ranges of the shorter suffix (`ranges`: `None` the first time, then the
    /// last call's, updated). `None`: search for it (always, over shards held elsewhere).
    fn narrowed_level(
        &self,
        memo: &mut Memo,
        q: &[u32],
        ranges: &mut Option<Vec<Range>>,
    ) -> Option<Level> {
        let _ = (memo, q, ranges);
        None
    }

    /// How the counts cache served `memo`'s reads (nothing to say over shards held elsewhere:
    /// their own caches serve them).
    fn cache_stats(&self, memo: &Memo) -> CacheStats {
        let _ = memo;
        CacheStats::default()
    }

    /// The longest suffix of `window` that occurs, its occurrences when at most `track` (an
    /// index in this process only) and the tokens that follow it when it is `full` long: the
    /// copy guard's search ([`spans`](crate::index::spans)).
    fn suffix_match(&self, window: &[u32], full: usize, track: usize) -> Result<SuffixMatch> {
        let _ = track;
        suffix_match_over(self, window, full)
    }

    /// The occurrences of `m` (the match of a window) that continue with `x`, as the match of
    /// the window extended by `x`; `None` when none does (or `m` holds none).
    fn follow(&self, m: &SuffixMatch, x: u32, full: usize) -> Option<SuffixMatch> {
        let _ = (m, x, full);
        None
    }

    /// The exact next-token counts of `h` over every shard, documents' ends left out (the
    /// estimators' view; an id outside the vocabulary has none). One round trip.
    fn next_counts(&self, h: &[u32]) -> Result<Counts> {
        let parts = next_counts_unchecked(self, h)?;
        Ok(merge_next_counts(&parts, self.separator()))
    }

    /// The Kneser–Ney continuation counts of each context of `hs`: for each next token, the
    /// distinct tokens seen just before the context followed by it, over all shards (a
    /// document's start counts as one; with `keep_end`, a document's end counts as the
    /// separator after the context). Over shards held elsewhere: one round trip.
    fn continuation_counts(&self, hs: &[&[u32]], keep_end: bool) -> Result<Vec<Counts>> {
        continuation_counts_over(self, hs, keep_end)
    }

    /// Every suffix of the corpus by its first `order` tokens, in slices to count on several
    /// threads: a fixed-order model's counting pass. Over shards held elsewhere each shard
    /// sends its groups ([`ShardQuery::SuffixGroups`]), merged here.
    fn suffix_feeds(&self, order: usize) -> Result<SuffixFeeds<'_>> {
        suffix_feeds_over(self, order)
    }

    /// The tokenizer the corpus was indexed with, when these shards know it.
    fn tokenizer(&self) -> Option<TokenizerSpec> {
        None
    }

    // The query types, each merged from the shards' answers (`Index` answers them the same
    // way, through `ask`).

    /// Occurrences of `q` (`count([])` = positions, separators included).
    fn count(&self, q: &[u32]) -> Result<CountResult> {
        let count = if q.is_empty() {
            self.check_tokens(q)?;
            self.infos().iter().map(|i| i.tokens).sum()
        } else {
            self.find(q)?.cnt
        };
        Ok(CountResult {
            count,
            approx: false,
        })
    }

    /// `count(prompt·cont) / count(prompt)`.
    fn prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult> {
        let prompt_cnt = self.count(prompt)?.count;
        let mut full = prompt.to_vec();
        full.push(cont);
        let cont_cnt = self.count(&full)?.count;
        Ok(ProbResult::new(prompt_cnt, cont_cnt, None))
    }

    /// Suffix-array segments of `q` in every shard.
    fn find(&self, q: &[u32]) -> Result<FindResult> {
        self.check_tokens(q)?;
        let segs = ask_all(self, ShardQuery::Find { q: q.to_vec() })?
            .into_iter()
            .map(|a| match a {
                ShardAnswer::Range { range } => Ok(range),
                _ => Err(wrong_answer("find")),
            })
            .collect::<Result<Vec<Range>>>()?;
        Ok(FindResult {
            cnt: segs.iter().map(|r| (r.1 - r.0) as u64).sum(),
            segment_by_shard: segs,
        })
    }

    /// Exact next-token distribution of `prompt` as the query API reports it.
    fn ntd(&self, prompt: &[u32], eos: Option<u32>) -> Result<NtdResult> {
        let parts = next_counts_everywhere(self, prompt)?;
        Ok(merge_ntd(parts, self.separator(), eos, None))
    }

    /// The length of the longest suffix of `prompt` that occurs in some shard (round one of the
    /// ∞-gram queries alone).
    fn longest_suffix(&self, prompt: &[u32]) -> Result<usize> {
        self.check_tokens(prompt)?;
        Ok(suffix_round(self, prompt)?
            .iter()
            .map(|t| t.0)
            .max()
            .unwrap_or(0))
    }

    /// ∞-gram next-token distribution of the query API: [`Shards::ntd`] of the longest suffix of
    /// `prompt` that occurs.
    fn infgram_ntd(&self, prompt: &[u32], eos: Option<u32>) -> Result<NtdResult> {
        let (l, parts) = occurring_suffix(self, prompt)?;
        Ok(merge_ntd(parts, self.separator(), eos, Some(l)))
    }

    /// ∞-gram probability of `cont` after `prompt`: [`Shards::prob`] of the longest suffix of `prompt`
    /// that occurs.
    fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult> {
        self.check_tokens(&[cont])?;
        let (l, parts) = occurring_suffix(self, prompt)?;
        let prompt_cnt: u64 = parts.iter().map(|p| p.0).sum();
        let cont_cnt: u64 = parts
            .iter()
            .map(|(_, counts)| {
                counts
                    .binary_search_by_key(&cont, |c| c.0)
                    .map_or(0, |i| counts[i].1)
            })
            .sum();
        Ok(ProbResult::new(prompt_cnt, cont_cnt, Some(l)))
    }

    /// Next-token counts of the ∞-gram: those of the longest suffix of `prompt` followed by a
    /// token somewhere (a suffix found only at documents' ends is backed off past).
    fn infgram_counts(&self, prompt: &[u32]) -> Result<(usize, Counts)> {
        self.check_tokens(prompt)?;
        let tops = suffix_round(self, prompt)?;
        let mut l = tops.iter().map(|t| t.0).max().unwrap_or(0);
        let sep = self.separator();
        loop {
            let counts = merge_next_counts(&counts_round(self, prompt, l, &tops)?, sep);
            if l == 0 || !counts.is_empty() {
                return Ok((l, counts));
            }
            l -= 1;
        }
    }

    /// The window `[pos − before, pos + after)` of the document holding position `pos` of shard
    /// `s`, cut to the document.
    fn window_at(&self, s: usize, pos: usize, before: usize, after: usize) -> Result<Document> {
        let infos = check_position(self, s, pos, "position")?;
        fetch_window(self, s, ShardQuery::Window { pos, before, after }, &infos)
    }

    /// The first `max_len` tokens of document `doc_ix` (numbered across shards).
    fn get_doc_by_ix(&self, doc_ix: u64, max_len: usize) -> Result<Document> {
        let infos = self.infos();
        let firsts = first_docs(&infos);
        let s = (0..infos.len())
            .find(|&s| doc_ix >= firsts[s] && doc_ix - firsts[s] < infos[s].documents)
            .ok_or_else(|| {
                Error::input(format!(
                    "document {doc_ix} does not exist ({} documents)",
                    infos.iter().map(|i| i.documents).sum::<u64>()
                ))
            })?;
        let doc = (doc_ix - firsts[s]) as usize;
        fetch_window(self, s, ShardQuery::Doc { doc, max_len }, &infos)
    }

    /// The window `[pos − before, pos + after)` of the document holding the suffix of rank `rank`
    /// of shard `s` (at position `pos`), cut to the document.
    fn window_at_rank(
        &self,
        s: usize,
        rank: usize,
        before: usize,
        after: usize,
    ) -> Result<Document> {
        let infos = check_position(self, s, rank, "rank")?;
        let q = ShardQuery::RankWindow {
            rank,
            before,
            after,
        };
        fetch_window(self, s, q, &infos)
    }

    /// The document around suffix-array rank `rank` of shard `s` (a window of `max_disp_len`).
    fn get_doc_by_rank(
        &self,
        s: usize,
        rank: usize,
        needle_len: usize,
        max_disp_len: usize,
    ) -> Result<Document> {
        let half = max_disp_len / 2;
        self.window_at_rank(s, rank, half, needle_len + half)
    }

    /// The document around token position `ptr` of shard `s`.
    fn get_doc_by_ptr(
        &self,
        s: usize,
        ptr: usize,
        needle_len: usize,
        max_disp_len: usize,
    ) -> Result<Document> {
        let infos = check_position(self, s, ptr, "pointer")?;
        let half = max_disp_len / 2;
        let q = ShardQuery::Window {
            pos: ptr,
            before: half,
            after: needle_len + half,
        };
        fetch_window(self, s, q, &infos)
    }

    /// Documents matching a CNF: every clause (an OR of n-grams) has an occurrence within
    /// `max_diff_tokens` of an occurrence of the rarest clause, in the same document. An n-gram
    /// with more than `max_clause_freq` occurrences in a shard is sampled, and the count scaled
    /// back up (`approx`).
    fn search_docs(
        &self,
        cnf: &[Vec<Vec<u32>>],
        maxnum: usize,
        max_diff_tokens: usize,
        max_clause_freq: usize,
        max_disp_len: usize,
    ) -> Result<SearchResult> {
        if cnf.is_empty()
            || cnf
                .iter()
                .any(|c| c.is_empty() || c.iter().any(|g| g.is_empty()))
        {
            return Err(Error::input(
                "search_docs needs at least one clause, and no empty clause or n-gram",
            ));
        }
        for g in cnf.iter().flatten() {
            self.check_tokens(g)?;
        }
        if max_clause_freq == 0 {
            return Err(Error::input(
                "max_clause_freq must be at least 1 (occurrences per n-gram before sampling)",
            ));
        }
        // The anchor: the clause with the fewest occurrences in the whole index (one choice for
        // all shards, so the count does not depend on how documents are sharded).
        let anchor = if cnf.len() == 1 {
            0
        } else {
            let mut totals = vec![0u64; cnf.len()];
            for a in ask_all(self, ShardQuery::ClauseTotals { cnf: cnf.to_vec() })? {
                let ShardAnswer::ClauseTotals { totals: t } = a else {
                    return Err(wrong_answer("clause totals"));
                };
                for (sum, x) in totals.iter_mut().zip(t) {
                    *sum += x;
                }
            }
            (0..cnf.len()).min_by_key(|&i| totals[i]).unwrap_or(0)
        };
        let q = ShardQuery::Cnf {
            cnf: cnf.to_vec(),
            anchor,
            max_diff_tokens,
            max_clause_freq,
            maxnum,
            max_disp_len,
        };
        let firsts = first_docs(&self.infos());
        let mut result = SearchResult {
            cnt: 0,
            approx: false,
            documents: Vec::new(),
            ptrs_by_shard: Vec::new(),
        };
        for (s, a) in ask_all(self, q)?.into_iter().enumerate() {
            let ShardAnswer::Cnf(part) = a else {
                return Err(wrong_answer("a CNF search"));
            };
            result.cnt += (part.matched as f64 * part.factor).round() as u64;
            result.approx |= part.approx;
            let room = maxnum.saturating_sub(result.documents.len());
            let placed = part.documents.into_iter().take(room);
            result
                .documents
                .extend(placed.map(|l| place(l, s, &firsts)));
            result.ptrs_by_shard.push(part.ptrs);
        }
        Ok(result)
    }

    /// Up to `max_docs` distinct documents holding `span`, shard by shard in suffix-array order,
    /// each a window of `around` tokens around an occurrence (half before it) and the span.
    fn span_documents(
        &self,
        span: &[u32],
        max_docs: usize,
        around: usize,
    ) -> Result<Vec<Document>> {
        self.check_tokens(span)?;
        if span.is_empty() || max_docs == 0 {
            return Ok(Vec::new());
        }
        let q = ShardQuery::SpanDocs {
            span: span.to_vec(),
            max_docs,
            before: around / 2,
            after: span.len() + around / 2,
        };
        let firsts = first_docs(&self.infos());
        let mut out = Vec::new();
        for (s, a) in ask_all(self, q)?.into_iter().enumerate() {
            let ShardAnswer::Documents { documents } = a else {
                return Err(wrong_answer("documents of a span"));
            };
            let room = max_docs.saturating_sub(out.len());
            out.extend(
                documents
                    .into_iter()
                    .take(room)
                    .map(|l| place(l, s, &firsts)),
            );
        }
        Ok(out)
    }

    /// For each position `j` of `tokens`, the longest span ending at `j` that occurs in the
    /// corpus, and its count: each shard's longest, the longest of those, and the counts of the
    /// shards that have it.
    fn longest_match(&self, tokens: &[u32]) -> Result<Vec<Match>> {
        self.check_tokens(tokens)?;
        let q = ShardQuery::LongestMatches {
            tokens: tokens.to_vec(),
        };
        let mut out: Vec<Match> = vec![Match { len: 0, count: 0 }; tokens.len()];
        for a in ask_all(self, q)? {
            let ShardAnswer::Matches { matches } = a else {
                return Err(wrong_answer("longest matches"));
            };
            if matches.len() != tokens.len() {
                return Err(wrong_answer("longest matches"));
            }
            for (o, m) in out.iter_mut().zip(matches) {
                if m.len > o.len {
                    *o = m;
                } else if m.len == o.len && m.len > 0 {
                    o.count += m.count;
                }
            }
        }
        Ok(out)
    }
}

/// Shards to share between threads and owners: an index opened once, or a router over shards
/// held elsewhere.
pub type SharedShards = std::sync::Arc<dyn Shards + Send + Sync>;

/// Shared shards show how many there are and their size (requests holding them derive
/// `Debug`).
impl std::fmt::Debug for dyn Shards + Send + Sync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let infos = self.infos();
        f.debug_struct("Shards")
            .field("shards", &infos.len())
            .field("tokens", &infos.iter().map(|i| i.tokens).sum::<u64>())
            .finish()
    }
}

/// Asks every shard the same question.
pub(crate) fn ask_all(shards: &(impl Shards + ?Sized), q: ShardQuery) -> Result<Vec<ShardAnswer>> {
    asked(
        shards,
        (0..shards.shard_count()).map(|s| (s, q.clone())).collect(),
    )
}

/// The shards' answers must be of the kind their questions ask for.
pub(crate) fn wrong_answer(what: &str) -> Error {
    Error::input(format!(
        "a shard answered {what} with another kind of answer (a shard of another version?)"
    ))
}

/// Shards shared by `Arc` (an index opened once and handed around) are asked as they are.
impl<T: Shards + ?Sized + Send> Shards for std::sync::Arc<T> {
    fn shard_count(&self) -> usize {
        (**self).shard_count()
    }

    fn infos(&self) -> Vec<ShardInfo> {
        (**self).infos()
    }

    fn separator(&self) -> u32 {
        (**self).separator()
    }

    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>> {
        (**self).ask(asks)
    }

    fn levels(&self, memo: &mut Memo, ask: LevelAsk<'_>) -> Result<Vec<Level>> {
        (**self).levels(memo, ask)
    }

    fn next_levels(
        &self,
        memo: &mut Memo,
        ctx: &[u32],
        appended: Option<u32>,
        k: i64,
        levels: &mut Vec<Level>,
    ) -> Result<()> {
        (**self).next_levels(memo, ctx, appended, k, levels)
    }

    fn narrowed_level(
        &self,
        memo: &mut Memo,
        q: &[u32],
        ranges: &mut Option<Vec<Range>>,
    ) -> Option<Level> {
        (**self).narrowed_level(memo, q, ranges)
    }

    fn cache_stats(&self, memo: &Memo) -> CacheStats {
        (**self).cache_stats(memo)
    }

    fn suffix_match(&self, window: &[u32], full: usize, track: usize) -> Result<SuffixMatch> {
        (**self).suffix_match(window, full, track)
    }

    fn follow(&self, m: &SuffixMatch, x: u32, full: usize) -> Option<SuffixMatch> {
        (**self).follow(m, x, full)
    }

    fn continuation_counts(&self, hs: &[&[u32]], keep_end: bool) -> Result<Vec<Counts>> {
        (**self).continuation_counts(hs, keep_end)
    }

    fn suffix_feeds(&self, order: usize) -> Result<SuffixFeeds<'_>> {
        (**self).suffix_feeds(order)
    }

    fn tokenizer(&self) -> Option<TokenizerSpec> {
        (**self).tokenizer()
    }
}

/// Shards asked only through [`Shards::ask`], as shards held elsewhere are: every reader takes
/// the merge of the shards' answers, never an index's own fast paths (tests compare the two).
pub struct AskOnly<T>(pub T);

impl<T: Shards> Shards for AskOnly<T> {
    fn shard_count(&self) -> usize {
        self.0.shard_count()
    }

    fn infos(&self) -> Vec<ShardInfo> {
        self.0.infos()
    }

    fn separator(&self) -> u32 {
        self.0.separator()
    }

    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>> {
        self.0.ask(asks)
    }
}

/// The answers to `asks` from `shards.ask`, each checked against its question: what every
/// merge reads. A wrong answer is an error naming its shard.
pub(crate) fn asked(
    shards: &(impl Shards + ?Sized),
    asks: Vec<(usize, ShardQuery)>,
) -> Result<Vec<ShardAnswer>> {
    let infos = shards.infos();
    if let Some(&(s, _)) = asks.iter().find(|(s, _)| *s >= infos.len()) {
        return Err(Error::input(format!(
            "shard {s} does not exist ({} shards)",
            infos.len()
        )));
    }
    let questions: Vec<(usize, ShardQuery)> = asks.clone();
    let answers = shards.ask(asks)?;
    if answers.len() != questions.len() {
        return Err(Error::Unavailable(format!(
            "the shards gave {} answers to {} questions",
            answers.len(),
            questions.len()
        )));
    }
    let (separator, vocab) = (shards.separator(), shards.vocab_size());
    for ((s, q), a) in questions.iter().zip(&answers) {
        let bounds = Bounds::new(infos[*s], separator, vocab);
        check_answer(q, a, &bounds).map_err(|why| {
            Error::Unavailable(format!(
                "shard {s} answered wrongly ({why}); its answer is not used: check that every \
                 shard holds the index it was built from and runs this infgram"
            ))
        })?;
    }
    Ok(answers)
}
