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

use super::answer_check::{asked, check_question, padded_cmp};
use super::counting::{self, SuffixFeeds, SuffixGroup};
use super::counts_cache::{CacheStats, CountsCache};
use super::levels::{Level, LevelAsk, Memo};
use super::query::{
    merge_counts, sort_and_merge, CnfPart, CountResult, Counts, Document, FindResult, Located,
    Match, NtdResult, Occ, ProbResult, SearchResult, TokenProb,
};
use super::spans::{self, SuffixMatch};
use super::{Index, Range, Shard};
use crate::error::{Error, Result};
use crate::tokenizer::TokenizerSpec;
use serde::{Deserialize, Serialize};

/// What the merging side knows of each shard without asking it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// Positions (tokens, separators included).
    pub tokens: u64,
    /// Documents.
    pub documents: u64,
}

/// A question to one shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case")]
pub enum ShardQuery {
    /// The suffix-array range of `q` (`count`, `prob`, `find`).
    Find {
        /// The n-gram.
        q: Vec<u32>,
    },
    /// Round one of the ∞-gram queries: the longest suffix of `prompt` that occurs in the
    /// shard, and its occurrences there.
    LongestSuffix {
        /// The prompt.
        prompt: Vec<u32>,
    },
    /// The occurrences of `q` and the counts of the tokens after them, a document's end
    /// counted under the separator id. `occ`: where round one found `q` in this shard (a hint
    /// that saves a search; only for the shard that gave it).
    NextCounts {
        /// The context.
        q: Vec<u32>,
        /// The occurrences of `q` in this shard, when known.
        occ: Option<Occ>,
    },
    /// Round one of a CNF search: each clause's occurrences in the shard.
    ClauseTotals {
        /// The clauses (each an OR of n-grams).
        cnf: Vec<Vec<Vec<u32>>>,
    },
    /// Round two of a CNF search: the occurrences of clause `anchor` that every other clause
    /// has an occurrence near, in the same document.
    Cnf {
        /// The clauses.
        cnf: Vec<Vec<Vec<u32>>>,
        /// The rarest clause over all shards.
        anchor: usize,
        /// Largest distance in tokens between clauses.
        max_diff_tokens: usize,
        /// Occurrences per n-gram above which it is sampled.
        max_clause_freq: usize,
        /// Documents to show at most.
        maxnum: usize,
        /// Tokens of each document's window.
        max_disp_len: usize,
    },
    /// The window `[pos − before, pos + after)` of the document holding position `pos`, cut
    /// to the document.
    Window {
        /// A position of the shard.
        pos: usize,
        /// Tokens before it.
        before: usize,
        /// Tokens from it on.
        after: usize,
    },
    /// [`ShardQuery::Window`] at the position of suffix-array rank `rank`.
    RankWindow {
        /// A suffix-array rank of the shard.
        rank: usize,
        /// Tokens before it.
        before: usize,
        /// Tokens from it on.
        after: usize,
    },
    /// The first `max_len` tokens of the shard's document `doc`.
    Doc {
        /// The document, numbered within the shard.
        doc: usize,
        /// Tokens to show at most.
        max_len: usize,
    },
    /// Up to `max_docs` distinct documents of the shard holding `span` (in suffix-array
    /// order), each a window of `before` tokens before an occurrence and `after` from it.
    SpanDocs {
        /// The span.
        span: Vec<u32>,
        /// Documents at most.
        max_docs: usize,
        /// Tokens before the occurrence.
        before: usize,
        /// Tokens from the occurrence on.
        after: usize,
    },
    /// For each position of `tokens`, the longest span ending there that occurs in the shard,
    /// and its occurrences.
    LongestMatches {
        /// The text's tokens.
        tokens: Vec<u32>,
    },
    /// The SBIS change points of `ctx` in the shard: every suffix length where the shard's
    /// occurrence count changes, longest first, with the next-token counts there (documents'
    /// ends under the separator with `keep_end`); the empty suffix too with `include_empty`.
    Levels {
        /// The context.
        ctx: Vec<u32>,
        /// Whether the empty suffix (the unigram counts) is a point.
        include_empty: bool,
        /// Whether an occurrence at a document's end counts for the separator.
        keep_end: bool,
    },
    /// The distinct (next token, token before) pairs of the occurrences of `q` (a document's
    /// start reads as the separator before it): Kneser–Ney continuation counts, which do not
    /// add over shards, are counted from the union of these.
    ContinuationPairs {
        /// The context.
        q: Vec<u32>,
        /// Whether an occurrence at a document's end counts for the separator.
        keep_end: bool,
    },
    /// The shard's suffixes grouped by their first `order` tokens, a page at a time: a
    /// fixed-order model's counting pass ([`super::counting`]).
    SuffixGroups {
        /// Tokens of each key at most.
        order: usize,
        /// The suffix-array rank the page starts at (0, then the last page's `next`).
        from: usize,
        /// Suffixes the page covers at least (whole groups).
        max_suffixes: usize,
    },
}

impl ShardQuery {
    /// What the question asks for, as errors name it.
    pub fn kind(&self) -> &'static str {
        match self {
            ShardQuery::Find { .. } => "a range",
            ShardQuery::LongestSuffix { .. } => "the longest suffix",
            ShardQuery::NextCounts { .. } => "next-token counts",
            ShardQuery::ClauseTotals { .. } => "clause totals",
            ShardQuery::Cnf { .. } => "a CNF search",
            ShardQuery::Window { .. } | ShardQuery::RankWindow { .. } | ShardQuery::Doc { .. } => {
                "a document window"
            }
            ShardQuery::SpanDocs { .. } => "documents of a span",
            ShardQuery::LongestMatches { .. } => "longest matches",
            ShardQuery::Levels { .. } => "the levels",
            ShardQuery::ContinuationPairs { .. } => "the continuation pairs",
            ShardQuery::SuffixGroups { .. } => "the suffix groups",
        }
    }

    /// Whether answering takes long enough that several shards are asked in parallel
    /// (waking the thread pool costs more than a point lookup when the index is in memory).
    fn is_heavy(&self) -> bool {
        !matches!(
            self,
            ShardQuery::Find { .. }
                | ShardQuery::Window { .. }
                | ShardQuery::RankWindow { .. }
                | ShardQuery::Doc { .. }
        )
    }
}

/// One shard's answer to a [`ShardQuery`] (the variant that query asks for). On the wire the
/// kind comes first and the fields after it, under `of` (`{"answer": "levels", "of": {...}}`):
/// read in that order, an answer is parsed as it streams in, never buffered whole first (an
/// internally tagged form is, at many times its size in memory).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", content = "of", rename_all = "snake_case")]
pub enum ShardAnswer {
    /// A suffix-array range.
    Range {
        /// `[lo, hi)`.
        range: Range,
    },
    /// The longest occurring suffix: its length and occurrences.
    Suffix {
        /// Tokens.
        len: usize,
        /// Its occurrences in the shard.
        occ: Occ,
    },
    /// Occurrences of a context and the counts of the tokens after them.
    NextCounts {
        /// Occurrences of the context.
        occurrences: u64,
        /// Sorted `(token, count)`, documents' ends under the separator id.
        counts: Counts,
    },
    /// Each clause's occurrences.
    ClauseTotals {
        /// One per clause.
        totals: Vec<u64>,
    },
    /// A CNF search's part.
    Cnf(CnfPart),
    /// A document window.
    Document(Located),
    /// Document windows.
    Documents {
        /// In the shard's order.
        documents: Vec<Located>,
    },
    /// Per position, the longest occurring span ending there and its count.
    Matches {
        /// One per token.
        matches: Vec<Match>,
    },
    /// A shard's change points of a context, longest first.
    Levels {
        /// The points.
        points: Vec<LevelPoint>,
    },
    /// Distinct (next token, token before) pairs, sorted.
    Pairs {
        /// The pairs.
        pairs: Vec<(u32, u32)>,
    },
    /// A page of the shard's suffixes grouped by their first tokens, in the keys' order.
    SuffixGroups {
        /// The groups.
        groups: Vec<SuffixGroup>,
        /// The rank the next page starts at; `None` after the last.
        next: Option<usize>,
        /// Tokens of the shard's longest document (on the first page; 0 on the others).
        longest: usize,
    },
}

/// A suffix length where a shard's occurrence count of a context's suffixes changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelPoint {
    /// The suffix length.
    pub len: usize,
    /// Occurrences of that suffix in the shard (the same for shorter suffixes down to the next
    /// point).
    pub occurrences: u64,
    /// Their next-token counts.
    pub counts: Counts,
}

/// Shards to ask: in this process ([`Index`]) or elsewhere (a Python router's actors). Shared
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
    /// copy guard's search ([`spans`]).
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
fn ask_all(shards: &(impl Shards + ?Sized), q: ShardQuery) -> Result<Vec<ShardAnswer>> {
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

/// The answer of `shard` to `q` (in this process; a shard elsewhere does the same).
pub fn answer<S: AsRef<[u8]>>(shard: &Shard<S>, q: &ShardQuery) -> ShardAnswer {
    answer_with(shard, None, q)
}

/// [`answer`], with the counts of large occurrence sets from `cache` (this shard's number in
/// it and the cache), when given.
fn answer_with<S: AsRef<[u8]>>(
    shard: &Shard<S>,
    cache: Option<(usize, &CountsCache)>,
    q: &ShardQuery,
) -> ShardAnswer {
    match q {
        ShardQuery::Find { q } => ShardAnswer::Range {
            range: shard.find(q),
        },
        ShardQuery::LongestSuffix { prompt } => {
            let (len, occ) = shard.longest_occurring(prompt);
            ShardAnswer::Suffix { len, occ }
        }
        ShardQuery::NextCounts { q, occ } => {
            let occ = occ.unwrap_or_else(|| Occ::Fwd(shard.find(q)));
            let counts = if occ.is_empty() {
                Counts::new()
            } else {
                shard.occ_counts_ext(occ, q, true)
            };
            ShardAnswer::NextCounts {
                occurrences: occ.len() as u64,
                counts,
            }
        }
        ShardQuery::ClauseTotals { cnf } => ShardAnswer::ClauseTotals {
            totals: cnf
                .iter()
                .map(|clause| {
                    clause
                        .iter()
                        .map(|g| {
                            let r = shard.find(g);
                            (r.1 - r.0) as u64
                        })
                        .sum()
                })
                .collect(),
        },
        ShardQuery::Cnf {
            cnf,
            anchor,
            max_diff_tokens,
            max_clause_freq,
            maxnum,
            max_disp_len,
        } => ShardAnswer::Cnf(shard.cnf_part(
            cnf,
            *anchor,
            *max_diff_tokens,
            *max_clause_freq,
            *maxnum,
            *max_disp_len,
        )),
        &ShardQuery::Window { pos, before, after } => {
            ShardAnswer::Document(shard.window(pos, before, after))
        }
        &ShardQuery::RankWindow {
            rank,
            before,
            after,
        } => ShardAnswer::Document(shard.window(shard.sa(rank), before, after)),
        &ShardQuery::Doc { doc, max_len } => {
            let (a, _) = shard.doc_span(doc);
            ShardAnswer::Document(shard.window(a, 0, max_len))
        }
        ShardQuery::SpanDocs {
            span,
            max_docs,
            before,
            after,
        } => ShardAnswer::Documents {
            documents: shard.span_docs(span, *max_docs, *before, *after),
        },
        ShardQuery::LongestMatches { tokens } => ShardAnswer::Matches {
            matches: shard.longest_matches(tokens),
        },
        ShardQuery::Levels {
            ctx,
            include_empty,
            keep_end,
        } => ShardAnswer::Levels {
            points: shard_level_points(shard, cache, ctx, *include_empty, *keep_end),
        },
        ShardQuery::ContinuationPairs { q, keep_end } => ShardAnswer::Pairs {
            pairs: counting::shard_continuation_pairs(shard, q, *keep_end),
        },
        &ShardQuery::SuffixGroups {
            order,
            from,
            max_suffixes,
        } => {
            let (groups, next) = counting::shard_suffix_groups(shard, order, from, max_suffixes);
            let longest = match from {
                0 => (0..shard.num_docs())
                    .map(|d| shard.doc_span(d))
                    .map(|(a, b)| b - a)
                    .max()
                    .unwrap_or(0),
                _ => 0,
            };
            ShardAnswer::SuffixGroups {
                groups,
                next,
                longest,
            }
        }
    }
}

/// A shard's change points of `ctx` ([`ShardQuery::Levels`]).
fn shard_level_points<S: AsRef<[u8]>>(
    shard: &Shard<S>,
    cache: Option<(usize, &CountsCache)>,
    ctx: &[u32],
    include_empty: bool,
    keep_end: bool,
) -> Vec<LevelPoint> {
    let occs = shard.suffix_occs(ctx);
    let lowest = usize::from(!include_empty);
    let mut points = Vec::new();
    let mut prev = 0;
    for l in (lowest..occs.len()).rev() {
        let occ = occs[l];
        if occ.len() == prev && l > 0 {
            continue;
        }
        prev = occ.len();
        let q = &ctx[ctx.len() - l..];
        let counts = match cache {
            Some((s, cache)) => (*cache.get(s, shard, occ, q, keep_end, false).0).clone(),
            None => shard.occ_counts_ext(occ, q, keep_end),
        };
        points.push(LevelPoint {
            len: l,
            occurrences: occ.len() as u64,
            counts,
        });
    }
    points
}

/// Answers `asks` with the in-process `shards`, in parallel when several are asked something
/// heavy.
pub fn answer_all<S: AsRef<[u8]> + Sync>(
    shards: &[Shard<S>],
    asks: Vec<(usize, ShardQuery)>,
) -> Result<Vec<ShardAnswer>> {
    answer_all_with(shards, None, asks)
}

/// [`answer_all`] with the counts of large occurrence sets from `cache` (an index's).
fn answer_all_with<S: AsRef<[u8]> + Sync>(
    shards: &[Shard<S>],
    cache: Option<&CountsCache>,
    asks: Vec<(usize, ShardQuery)>,
) -> Result<Vec<ShardAnswer>> {
    use rayon::prelude::*;
    if let Some(&(s, _)) = asks.iter().find(|(s, _)| *s >= shards.len()) {
        return Err(Error::input(format!(
            "shard {s} does not exist ({} shards)",
            shards.len()
        )));
    }
    for (s, q) in &asks {
        let shard = &shards[*s];
        let info = ShardInfo {
            tokens: shard.len() as u64,
            documents: shard.num_docs() as u64,
        };
        check_question(q, info)?;
    }
    let one = |(s, q): &(usize, ShardQuery)| answer_with(&shards[*s], cache.map(|c| (*s, c)), q);
    Ok(
        if asks.len() > 1 && asks.iter().any(|(_, q)| q.is_heavy()) {
            asks.par_iter().map(one).collect()
        } else {
            asks.iter().map(one).collect()
        },
    )
}

/// The number of the first document of each shard (documents are numbered across shards in
/// order).
fn first_docs(infos: &[ShardInfo]) -> Vec<u64> {
    infos
        .iter()
        .scan(0u64, |acc, i| {
            let first = *acc;
            *acc += i.documents;
            Some(first)
        })
        .collect()
}

/// A shard's window, numbered across shards.
fn place(located: Located, s: usize, first_docs: &[u64]) -> Document {
    let mut d = located.document;
    d.s = s;
    d.doc_ix += first_docs[s];
    d.ptr = located.ptr;
    d
}

/// Each shard's occurrences and next-token counts (documents' ends under the separator).
fn next_counts_parts(answers: Vec<ShardAnswer>) -> Result<Vec<(u64, Counts)>> {
    answers
        .into_iter()
        .map(|a| match a {
            ShardAnswer::NextCounts {
                occurrences,
                counts,
            } => Ok((occurrences, counts)),
            _ => Err(wrong_answer("next-token counts")),
        })
        .collect()
}

/// The query API's distribution from each shard's occurrences and counts: every occurrence
/// counted, documents' ends under `eos` (left out without it).
fn merge_ntd(
    parts: Vec<(u64, Counts)>,
    sep: u32,
    eos: Option<u32>,
    suffix_len: Option<usize>,
) -> NtdResult {
    let prompt_cnt: u64 = parts.iter().map(|p| p.0).sum();
    let mut all: Counts = parts
        .into_iter()
        .flat_map(|p| p.1)
        .filter_map(|(t, c)| match (t == sep, eos) {
            (true, Some(e)) => Some((e, c)),
            (true, None) => None,
            (false, _) => Some((t, c)),
        })
        .collect();
    sort_and_merge(&mut all);
    NtdResult {
        prompt_cnt,
        result_by_token_id: all
            .into_iter()
            .map(|(t, c)| {
                let prob = c as f64 / prompt_cnt as f64;
                (t, TokenProb { cont_cnt: c, prob })
            })
            .collect(),
        approx: false,
        suffix_len,
    }
}

/// Sums next-token counts of several shards, documents' ends left out.
fn merge_next_counts(parts: &[(u64, Counts)], sep: u32) -> Counts {
    let mut all: Counts = parts
        .iter()
        .flat_map(|p| p.1.iter().copied())
        .filter(|&(t, _)| t != sep)
        .collect();
    sort_and_merge(&mut all);
    all
}

/// Every shard's occurrences of `prompt` and the counts of the tokens after them.
fn next_counts_everywhere(
    shards: &(impl Shards + ?Sized),
    prompt: &[u32],
) -> Result<Vec<(u64, Counts)>> {
    shards.check_tokens(prompt)?;
    next_counts_unchecked(shards, prompt)
}

/// [`next_counts_everywhere`] without the vocabulary check: an id outside it has no counts.
fn next_counts_unchecked(
    shards: &(impl Shards + ?Sized),
    prompt: &[u32],
) -> Result<Vec<(u64, Counts)>> {
    let q = ShardQuery::NextCounts {
        q: prompt.to_vec(),
        occ: None,
    };
    next_counts_parts(ask_all(shards, q)?)
}

/// Round one of the ∞-gram queries: each shard's longest occurring suffix of `prompt`.
fn suffix_round(shards: &(impl Shards + ?Sized), prompt: &[u32]) -> Result<Vec<(usize, Occ)>> {
    let q = ShardQuery::LongestSuffix {
        prompt: prompt.to_vec(),
    };
    ask_all(shards, q)?
        .into_iter()
        .map(|a| match a {
            ShardAnswer::Suffix { len, occ } => Ok((len, occ)),
            _ => Err(wrong_answer("the longest suffix")),
        })
        .collect()
}

/// Round two: the occurrences and next-token counts of the last `l` tokens of `prompt` in
/// every shard where it occurs, given round one's answers `tops` (a shard whose own longest
/// suffix is shorter has none; one whose is exactly `l` long gave its occurrences).
fn counts_round(
    shards: &(impl Shards + ?Sized),
    prompt: &[u32],
    l: usize,
    tops: &[(usize, Occ)],
) -> Result<Vec<(u64, Counts)>> {
    let q = &prompt[prompt.len() - l..];
    let asks: Vec<(usize, ShardQuery)> = tops
        .iter()
        .enumerate()
        .filter(|(_, &(ls, _))| ls >= l)
        .map(|(s, &(ls, occ))| {
            let occ = (ls == l && l > 0).then_some(occ);
            let q = q.to_vec();
            (s, ShardQuery::NextCounts { q, occ })
        })
        .collect();
    next_counts_parts(asked(shards, asks)?)
}

/// The longest suffix of `prompt` that occurs in some shard, and the shards' occurrences and
/// counts at that length: the ∞-gram context of the query API.
fn occurring_suffix(
    shards: &(impl Shards + ?Sized),
    prompt: &[u32],
) -> Result<(usize, Vec<(u64, Counts)>)> {
    shards.check_tokens(prompt)?;
    let tops = suffix_round(shards, prompt)?;
    let l = tops.iter().map(|t| t.0).max().unwrap_or(0);
    Ok((l, counts_round(shards, prompt, l, &tops)?))
}

/// The change points of `ctx` over all shards (each shard's [`ShardQuery::Levels`], merged):
/// every suffix length, longest first, where the total occurrence count changes (and the empty
/// suffix with `include_empty`), with that total and the merged next-token counts. One round
/// trip; what SBIS levels are chosen from ([`levels_over`]).
pub fn level_points(
    shards: &(impl Shards + ?Sized),
    ctx: &[u32],
    include_empty: bool,
    keep_end: bool,
) -> Result<Vec<LevelPoint>> {
    let q = ShardQuery::Levels {
        ctx: ctx.to_vec(),
        include_empty,
        keep_end,
    };
    let per_shard = ask_all(shards, q)?
        .into_iter()
        .map(|a| match a {
            ShardAnswer::Levels { points } => Ok(points),
            _ => Err(wrong_answer("the levels")),
        })
        .collect::<Result<Vec<Vec<LevelPoint>>>>()?;
    let lmax = per_shard
        .iter()
        .filter_map(|p| p.first())
        .map(|p| p.len)
        .max();
    let Some(lmax) = lmax else {
        return Ok(Vec::new());
    };
    let lowest = usize::from(!include_empty);
    let mut out = Vec::new();
    let mut prev = 0;
    for l in (lowest..=lmax).rev() {
        // Shard s's occurrences of the suffix of length l: those of its last point at least
        // l long (its points are longest first), none past its longest.
        let here: Vec<&LevelPoint> = per_shard
            .iter()
            .filter_map(|points| points.iter().rev().find(|p| p.len >= l))
            .filter(|p| p.occurrences > 0)
            .collect();
        let occurrences: u64 = here.iter().map(|p| p.occurrences).sum();
        if occurrences == prev && l > 0 {
            continue;
        }
        prev = occurrences;
        out.push(LevelPoint {
            len: l,
            occurrences,
            counts: merge_counts(here.iter().map(|p| &p.counts)),
        });
    }
    Ok(out)
}

/// The first `k` SBIS levels of `ctx` (all when `k < 0`) whose counts pass `keep`, over
/// shards asked through [`Shards`] (shards of another process or machine): one round trip for
/// every shard's change points ([`level_points`]), documents' ends counted for the
/// separator. The same levels as [`Shards::levels`] on an index of the same documents, by a
/// reader whose memo keeps documents' ends.
pub fn levels_over(
    shards: &(impl Shards + ?Sized),
    ctx: &[u32],
    k: i64,
    include_empty: bool,
    keep: &dyn Fn(&Counts) -> bool,
) -> Result<Vec<Level>> {
    levels_over_with(shards, ctx, k, include_empty, keep, true)
}

/// [`levels_over`], with documents' ends counted for the separator only with `keep_end`: the
/// same levels as [`Shards::levels`] on an index by a reader of that `keep_end` (the corpus
/// drafter's leaves them out).
pub fn levels_over_with(
    shards: &(impl Shards + ?Sized),
    ctx: &[u32],
    k: i64,
    include_empty: bool,
    keep: &dyn Fn(&Counts) -> bool,
    keep_end: bool,
) -> Result<Vec<Level>> {
    let mut kept = Vec::new();
    let mut prev_total = 0;
    for p in level_points(shards, ctx, include_empty, keep_end)? {
        let total: u64 = p.counts.iter().map(|&(_, c)| c).sum();
        if total <= prev_total {
            continue;
        }
        prev_total = total;
        if keep(&p.counts) {
            kept.push(Level {
                len: p.len,
                total,
                counts: std::sync::Arc::new(p.counts),
                continuations: None,
            });
            if k >= 0 && kept.len() as i64 >= k {
                break;
            }
        }
    }
    Ok(kept)
}

/// [`Shards::suffix_feeds`] through the shards' answers: every shard's groups, a page of
/// [`SUFFIX_PAGE`](counting::SUFFIX_PAGE) suffixes at a time, merged by key in one slice (so a
/// shard's groups are never all held at once).
fn suffix_feeds_over(shards: &(impl Shards + ?Sized), order: usize) -> Result<SuffixFeeds<'_>> {
    let page = move |from: usize| ShardQuery::SuffixGroups {
        order,
        from,
        max_suffixes: counting::SUFFIX_PAGE,
    };
    let firsts = asked(
        shards,
        (0..shards.shard_count()).map(|s| (s, page(0))).collect(),
    )?;
    let mut cursors = Vec::with_capacity(firsts.len());
    let mut longest = 0;
    for a in firsts {
        let ShardAnswer::SuffixGroups {
            groups,
            next,
            longest: l,
        } = a
        else {
            return Err(wrong_answer("the suffix groups"));
        };
        longest = longest.max(l);
        cursors.push(PageCursor {
            groups: groups.into(),
            next,
            last: None,
        });
    }
    let width = order.min(longest + 1);
    let sep = shards.separator();
    let feed = move |f: &mut dyn FnMut(&[u32], u32, u64)| -> Result<()> {
        let mut key = vec![sep; width];
        loop {
            for (s, c) in cursors.iter_mut().enumerate() {
                c.refill(shards, s, &page)?;
            }
            let Some(s) = (0..cursors.len())
                .filter(|&s| !cursors[s].groups.is_empty())
                .min_by(|&a, &b| {
                    let (ka, kb) = (&cursors[a].groups[0].key, &cursors[b].groups[0].key);
                    padded_cmp(ka, kb, sep)
                })
            else {
                return Ok(());
            };
            let g = cursors[s].take(s, sep)?;
            if g.key.len() > width {
                return Err(Error::Unavailable(format!(
                    "shard {s} answered wrongly (a key longer than its longest document)"
                )));
            }
            key.fill(sep);
            key[..g.key.len()].copy_from_slice(&g.key);
            for &(left, n) in &g.lefts {
                f(&key, left, n);
            }
        }
    };
    Ok(SuffixFeeds {
        width,
        feeds: vec![Box::new(feed)],
    })
}

/// One shard's page of suffix groups being merged, and where its next page starts.
struct PageCursor {
    groups: std::collections::VecDeque<SuffixGroup>,
    next: Option<usize>,
    /// The key last taken, which the next must follow.
    last: Option<Vec<u32>>,
}

impl PageCursor {
    /// Asks shard `s` for its next page when this one is done and there is one.
    fn refill(
        &mut self,
        shards: &(impl Shards + ?Sized),
        s: usize,
        page: &dyn Fn(usize) -> ShardQuery,
    ) -> Result<()> {
        while self.groups.is_empty() {
            let Some(from) = self.next else {
                return Ok(());
            };
            match asked(shards, vec![(s, page(from))])?.pop() {
                Some(ShardAnswer::SuffixGroups { groups, next, .. }) => {
                    if next.is_some_and(|n| n <= from) {
                        return Err(Error::Unavailable(format!(
                            "shard {s} answered wrongly (a page of suffix groups that does \
                             not advance)"
                        )));
                    }
                    self.groups = groups.into();
                    self.next = next;
                }
                _ => return Err(wrong_answer("the suffix groups")),
            }
        }
        Ok(())
    }

    /// The next group, which must follow the last one taken (pages in the keys' order).
    fn take(&mut self, s: usize, sep: u32) -> Result<SuffixGroup> {
        let g = self.groups.pop_front().expect("a group to take");
        if let Some(last) = &self.last {
            if padded_cmp(last, &g.key, sep).is_ge() {
                return Err(Error::Unavailable(format!(
                    "shard {s} answered wrongly (suffix groups out of order across pages)"
                )));
            }
        }
        self.last = Some(g.key.clone());
        Ok(g)
    }
}

/// [`Shards::continuation_counts`] through the shards' answers: one round trip for every
/// context.
fn continuation_counts_over(
    shards: &(impl Shards + ?Sized),
    hs: &[&[u32]],
    keep_end: bool,
) -> Result<Vec<Counts>> {
    let n = shards.shard_count();
    let asks = hs
        .iter()
        .flat_map(|h| {
            (0..n).map(move |s| {
                let q = ShardQuery::ContinuationPairs {
                    q: h.to_vec(),
                    keep_end,
                };
                (s, q)
            })
        })
        .collect();
    let answers = asked(shards, asks)?;
    if answers.len() != hs.len() * n {
        return Err(Error::input(
            "the shards gave another number of answers than questions",
        ));
    }
    answers
        .chunks(n.max(1))
        .take(hs.len())
        .map(|per_shard| {
            let mut pairs = Vec::new();
            for a in per_shard {
                match a {
                    ShardAnswer::Pairs { pairs: p } => pairs.extend_from_slice(p),
                    _ => return Err(wrong_answer("the continuation pairs")),
                }
            }
            Ok(counting::tally_union(pairs))
        })
        .collect()
}

/// [`Shards::suffix_match`] through the shards' answers (shards held elsewhere): no
/// occurrences.
pub fn suffix_match_over(
    shards: &(impl Shards + ?Sized),
    window: &[u32],
    full: usize,
) -> Result<SuffixMatch> {
    let len = shards.longest_suffix(window)?;
    let mut next = Vec::new();
    if len == full {
        let counts = shards.next_counts(&window[window.len() - len..])?;
        next.extend(
            counts
                .iter()
                .map(|&(t, _)| t)
                .filter(|&t| shards.holds_token(t)),
        );
    }
    Ok(SuffixMatch {
        len,
        starts: Vec::new(),
        next,
    })
}

/// The document window shard `s` answers `q` with, numbered across shards (`infos`: every
/// shard's).
fn fetch_window(
    shards: &(impl Shards + ?Sized),
    s: usize,
    q: ShardQuery,
    infos: &[ShardInfo],
) -> Result<Document> {
    match asked(shards, vec![(s, q)])?.into_iter().next() {
        Some(ShardAnswer::Document(l)) => Ok(place(l, s, &first_docs(infos))),
        _ => Err(wrong_answer("a document window")),
    }
}

/// The shards' infos, after checking that shard `s` exists and `i` is one of its positions
/// (`what` names `i` in errors).
fn check_position(
    shards: &(impl Shards + ?Sized),
    s: usize,
    i: usize,
    what: &str,
) -> Result<Vec<ShardInfo>> {
    let infos = shards.infos();
    let info = infos.get(s).ok_or_else(|| {
        Error::input(format!("shard {s} does not exist ({} shards)", infos.len()))
    })?;
    if i as u64 >= info.tokens {
        return Err(Error::input(format!(
            "{what} {i} is outside shard {s} (0..{})",
            info.tokens
        )));
    }
    Ok(infos)
}

/// The in-process shards of an index, asked directly.
impl<S: AsRef<[u8]> + Sync> Shards for Index<S> {
    fn shard_count(&self) -> usize {
        self.shards().len()
    }

    fn infos(&self) -> Vec<ShardInfo> {
        self.shards()
            .iter()
            .map(|s| ShardInfo {
                tokens: s.len() as u64,
                documents: s.num_docs() as u64,
            })
            .collect()
    }

    fn separator(&self) -> u32 {
        Index::separator(self)
    }

    fn vocab_size(&self) -> usize {
        Index::vocab_size(self)
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>> {
        answer_all_with(self.shards(), Some(self.counts_cache()), asks)
    }

    fn levels(&self, memo: &mut Memo, ask: LevelAsk<'_>) -> Result<Vec<Level>> {
        Ok(memo.finder.levels_asked(self, ask))
    }

    fn next_levels(
        &self,
        memo: &mut Memo,
        ctx: &[u32],
        appended: Option<u32>,
        k: i64,
        levels: &mut Vec<Level>,
    ) -> Result<()> {
        let Memo { finder, tracker } = memo;
        finder.next_levels_into(self, tracker, ctx, appended, k, levels);
        Ok(())
    }

    fn narrowed_level(
        &self,
        memo: &mut Memo,
        q: &[u32],
        ranges: &mut Option<Vec<Range>>,
    ) -> Option<Level> {
        let (&t, shorter) = q.split_last()?;
        let shards = self.shards();
        let found = match ranges.take() {
            Some(r) => r,
            None => shards.iter().map(|sh| sh.find(shorter)).collect(),
        };
        let narrowed: Vec<Range> = shards
            .iter()
            .zip(&found)
            .map(|(sh, &r)| match r.0 < r.1 {
                true => sh.narrow(r, shorter.len(), t),
                false => r,
            })
            .collect();
        let occs = narrowed.iter().map(|&r| Some(Occ::Fwd(r)));
        let level = memo.finder.level_of(self, occs, q)?;
        *ranges = Some(narrowed);
        Some(level)
    }

    fn cache_stats(&self, memo: &Memo) -> CacheStats {
        memo.finder.cache_stats(self)
    }

    fn suffix_match(&self, window: &[u32], full: usize, track: usize) -> Result<SuffixMatch> {
        Ok(spans::suffix_match_local(
            self,
            window,
            (full, track),
            |t| self.holds_token(t),
        ))
    }

    fn follow(&self, m: &SuffixMatch, x: u32, full: usize) -> Option<SuffixMatch> {
        spans::follow_local(self, m, (x, full), |t| self.holds_token(t))
    }

    fn continuation_counts(&self, hs: &[&[u32]], keep_end: bool) -> Result<Vec<Counts>> {
        Ok(hs
            .iter()
            .map(|h| counting::index_continuation_counts(self, h, keep_end))
            .collect())
    }

    fn suffix_feeds(&self, order: usize) -> Result<SuffixFeeds<'_>> {
        counting::index_suffix_feeds(self, order)
    }

    fn tokenizer(&self) -> Option<TokenizerSpec> {
        Some(self.header().tokenizer.clone())
    }
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
