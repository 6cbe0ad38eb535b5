//! The infini-gram query types on an [`Index`]: `count`, `prob`, `ntd`, `infgram_prob`,
//! `infgram_ntd`, `find`, documents by rank or pointer, `search_docs` (CNF) and
//! `longest_match`. Field names of the result types follow the infini-gram Python package.
//!
//! Semantics (those of infini-gram 2.6.0's engine, compared query by query in the Python
//! tests), for a corpus of documents each with one separator:
//! * `count(q)`: occurrences of `q`; `count([])` is the number of positions, one separator per
//!   document included (infini-gram's `count([])`).
//! * `prob(p, c)`: `count(p·c) / count(p)` (no backoff; `prob` is -1 when `count(p)` is 0).
//! * `ntd(p, eos)`: `prompt_cnt = count(p)`, every occurrence; for every token `x` that follows
//!   an occurrence, `count(p·x)`, and the occurrences at a document's end reported under the
//!   end-of-document id `eos` when one is given (infini-gram's `eos_token_id`), left out of the
//!   list otherwise; `prob = cont_cnt / prompt_cnt`.
//! * `infgram_*`: the same on the longest suffix of the prompt that occurs (`suffix_len` tokens
//!   long; 0 means the unigram distribution).
//!
//! The estimators need another convention, kept in [`Index::infgram_counts`] and
//! [`Index::next_counts`]: there an occurrence at a document's end has no next token, and the
//! ∞-gram backs off past a suffix that has only such occurrences.

use super::{Index, Range, Shard};
use crate::error::{Error, Result};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

/// Reversed-suffix-array ranges up to this size are scanned instead of searched.
const SCAN_LIMIT: usize = 64;
/// Below this many occurrences, suffix ranges are extended by direct comparison.
const SMALL_RANGE: usize = 8;

/// Occurrences of a context in one shard, as a range of the forward or of the reversed suffix
/// array (the reversed one when the context was extended to the left).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Occ {
    /// A range of `SA`.
    Fwd(Range),
    /// A range of `RSA`.
    Rev(Range),
}

impl Occ {
    /// Number of occurrences.
    pub fn len(&self) -> usize {
        let (Occ::Fwd((a, b)) | Occ::Rev((a, b))) = *self;
        b - a
    }
    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `{cont_cnt, prob}` of one next token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenProb {
    /// Occurrences of prompt·token.
    pub cont_cnt: u64,
    /// `cont_cnt / prompt_cnt`.
    pub prob: f64,
}

/// Result of `count`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CountResult {
    /// Occurrences.
    pub count: u64,
    /// Always false: counts are exact.
    pub approx: bool,
}

/// Result of `prob` and `infgram_prob`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbResult {
    /// Occurrences of the (suffix of the) prompt.
    pub prompt_cnt: u64,
    /// Occurrences of it followed by the continuation.
    pub cont_cnt: u64,
    /// `cont_cnt / prompt_cnt`, or -1 when `prompt_cnt` is 0.
    pub prob: f64,
    /// For `infgram_prob`: length of the suffix used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffix_len: Option<usize>,
}

impl ProbResult {
    /// `cont_cnt / prompt_cnt`, or -1 when the prompt does not occur.
    pub fn new(prompt_cnt: u64, cont_cnt: u64, suffix_len: Option<usize>) -> Self {
        let prob = if prompt_cnt == 0 {
            -1.0
        } else {
            cont_cnt as f64 / prompt_cnt as f64
        };
        ProbResult {
            prompt_cnt,
            cont_cnt,
            prob,
            suffix_len,
        }
    }
}

/// Result of `ntd` and `infgram_ntd`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NtdResult {
    /// Occurrences of the (suffix of the) prompt, those at a document's end included.
    pub prompt_cnt: u64,
    /// Next token id → `{cont_cnt, prob}` (documents' ends under the `eos` id when given).
    pub result_by_token_id: BTreeMap<u32, TokenProb>,
    /// Always false: distributions are exact.
    pub approx: bool,
    /// For `infgram_ntd`: length of the suffix used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffix_len: Option<usize>,
}

/// Result of `find`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FindResult {
    /// Occurrences in all shards.
    pub cnt: u64,
    /// `[lo, hi)` of the suffix array of each shard.
    pub segment_by_shard: Vec<(usize, usize)>,
}

/// A document (or a window of it) returned by `get_doc_by_*` and `search_docs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Document {
    /// Shard of the document.
    pub s: usize,
    /// Document index in the whole index.
    pub doc_ix: u64,
    /// Tokens in the document.
    pub doc_len: usize,
    /// Tokens shown.
    pub disp_len: usize,
    /// Position of the match in the window.
    pub needle_offset: usize,
    /// The document's metadata line.
    pub metadata: String,
    /// Token ids of the window.
    pub token_ids: Vec<u32>,
    /// Position in the shard of the match (or of the window's anchor).
    #[serde(skip)]
    pub ptr: usize,
}

/// Result of `search_docs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchResult {
    /// Matching occurrences of the CNF (occurrences of its rarest clause that satisfy all).
    pub cnt: u64,
    /// True when a clause had more occurrences than `max_clause_freq` and was sampled.
    pub approx: bool,
    /// Up to `maxnum` matching documents.
    pub documents: Vec<Document>,
    /// Positions of the matching occurrences (of the rarest clause), by shard.
    #[serde(skip)]
    pub ptrs_by_shard: Vec<Vec<usize>>,
}

/// One position of `longest_match`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Match {
    /// Length of the longest span ending here that occurs in the corpus.
    pub len: usize,
    /// Its occurrences.
    pub count: u64,
}

/// A next-token distribution as sorted `(token, count)` pairs.
pub type Counts = Vec<(u32, u64)>;

/// Sums next-token counts of several shards.
pub fn merge_counts<C: std::borrow::Borrow<Counts>>(parts: impl IntoIterator<Item = C>) -> Counts {
    let mut acc: BTreeMap<u32, u64> = BTreeMap::new();
    for p in parts {
        for &(t, c) in p.borrow() {
            *acc.entry(t).or_default() += c;
        }
    }
    acc.into_iter().collect()
}

/// Counts of the tokens of a sorted sequence, as sorted `(token, count)` pairs.
pub fn tally_sorted(sorted: impl IntoIterator<Item = u32>) -> Counts {
    let mut out: Counts = Vec::with_capacity(16);
    tally_sorted_into(sorted, &mut out);
    out
}

/// [`tally_sorted`] into `out` (cleared first), reusing its allocation.
pub fn tally_sorted_into(sorted: impl IntoIterator<Item = u32>, out: &mut Counts) {
    out.clear();
    for t in sorted {
        match out.last_mut() {
            Some((x, c)) if *x == t => *c += 1,
            _ => out.push((t, 1)),
        }
    }
}

/// Counts of runs that came in suffix order: the end of `T` (`u32::MAX`) counted as the
/// separator (dropped unless `keep_end`), then sorted by token with equal tokens merged.
fn normalize_counts(out: &mut Counts, sep: u32, keep_end: bool) {
    for x in out.iter_mut() {
        if x.0 == u32::MAX {
            x.0 = sep;
        }
    }
    out.retain(|x| keep_end || x.0 != sep);
    sort_and_merge(out);
}

/// Sorts `(token, count)` pairs by token and adds up the counts of equal tokens.
fn sort_and_merge(out: &mut Counts) {
    out.sort_unstable_by_key(|&(t, _)| t);
    out.dedup_by(|b, a| {
        let same = a.0 == b.0;
        if same {
            a.1 += b.1;
        }
        same
    });
}

impl<S: AsRef<[u8]>> Shard<S> {
    /// Next-token counts (separator excluded) of the occurrences `occ` of `ctx`.
    pub fn occ_counts(&self, occ: Occ, ctx: &[u32]) -> Counts {
        self.occ_counts_ext(occ, ctx, false)
    }

    /// Next-token counts of the occurrences `occ` of `ctx`; with `keep_end`, occurrences at a
    /// document's end count for the separator id (the "end of document" token of generation).
    pub fn occ_counts_ext(&self, occ: Occ, ctx: &[u32], keep_end: bool) -> Counts {
        let sep = self.separator();
        let keep = |t: u32| keep_end || t != sep;
        match occ {
            Occ::Rev(r) if r.1 - r.0 <= SCAN_LIMIT => {
                let mut v: Vec<u32> = Vec::with_capacity(r.1 - r.0);
                v.extend(
                    (r.0..r.1)
                        .filter_map(|i| self.rnext(i))
                        .filter(|&t| keep(t)),
                );
                v.sort_unstable();
                tally_sorted(v)
            }
            Occ::Rev(_) => self.occ_counts_ext(Occ::Fwd(self.find(ctx)), ctx, keep_end),
            Occ::Fwd(r) => {
                let mut out: Counts = Vec::with_capacity(64);
                self.runs(r, ctx.len(), |t, c, _| {
                    // The end of T (u32::MAX) ends a document as the separator does (for 4-byte
                    // tokens the two are the same id).
                    if keep(t.min(sep)) {
                        out.push((t, c as u64));
                    }
                });
                // In infgram's layout T ends with a separator, so a context never runs into
                // the end of T; in infini-gram's the last document ends there (its run comes
                // first, key -1): the same as a separator. Runs come in suffix order, which is
                // token order unless the shard sorts tokens by their bytes (infini-gram's u16 /
                // u32 tables).
                if self.byte_ordered() || out.first().is_some_and(|x| x.0 == u32::MAX) {
                    normalize_counts(&mut out, sep, keep_end);
                }
                out
            }
        }
    }

    /// Kneser–Ney continuation counts of the occurrences `occ` of `ctx`: for each next token
    /// `x`, the number of distinct tokens found just before an occurrence of `ctx·x` (the
    /// start of a document counts as one more such token). Scans every occurrence. Over several
    /// shards these counts are added, so a pair present in two shards counts twice.
    pub fn occ_continuations(&self, occ: Occ, ctx: &[u32], keep_end: bool) -> Counts {
        let sep = self.separator();
        let d = ctx.len();
        let prev = |start: usize| if start == 0 { sep } else { self.tok(start - 1) };
        let mut pairs: Vec<(u32, u32)> = match occ {
            Occ::Rev((a, b)) => (a..b)
                .filter_map(|i| self.rnext(i).map(|x| (x, prev(self.rstart(i, d)))))
                .collect(),
            Occ::Fwd((a, b)) => (a..b)
                .filter_map(|i| {
                    let p = self.sa(i);
                    (p + d < self.len()).then(|| (self.tok(p + d), prev(p)))
                })
                .collect(),
        };
        pairs.retain(|&(x, _)| keep_end || x != sep);
        pairs.sort_unstable();
        pairs.dedup();
        tally_sorted(pairs.into_iter().map(|(x, _)| x))
    }

    /// Occurrences of the suffixes of `ctx`, for lengths `0, 1, …` while they occur (and at most
    /// `ctx.len()`): entry `l` holds the occurrences of the last `l` tokens.
    pub fn suffix_occs(&self, ctx: &[u32]) -> Vec<Occ> {
        let n = self.len();
        let mut out = Vec::with_capacity(16);
        if self.has_reverse() {
            // The empty context: every position (the reversed array cannot give the first one).
            let mut r = (0, n);
            out.push(Occ::Fwd(r));
            // The first two steps from the memo where it applies.
            let mut skip = 0;
            let mut rev = ctx.iter().rev();
            if let (Some(&x0), x1) = (rev.next(), rev.next()) {
                if let Some(r1) = self.rrange_short(x0, None) {
                    if r1.0 == r1.1 {
                        return out;
                    }
                    out.push(Occ::Rev(r1));
                    r = r1;
                    skip = 1;
                    if let Some(r2) = x1.and_then(|&x1| self.rrange_short(x0, Some(x1))) {
                        if r2.0 == r2.1 {
                            return out;
                        }
                        out.push(Occ::Rev(r2));
                        r = r2;
                        skip = 2;
                    }
                }
            }
            for (d, &x) in ctx.iter().rev().enumerate().skip(skip) {
                if r.1 - r.0 <= SMALL_RANGE {
                    self.extend_small(r, d, ctx, &mut out);
                    break;
                }
                r = self.rnarrow(r, d, x);
                if r.0 == r.1 {
                    break;
                }
                out.push(Occ::Rev(r));
            }
        } else {
            out.push(Occ::Fwd((0, n)));
            for l in 1..=ctx.len() {
                let r = self.find(&ctx[ctx.len() - l..]);
                if r.0 == r.1 {
                    break;
                }
                out.push(Occ::Fwd(r));
            }
        }
        out
    }

    /// Finishes [`Shard::suffix_occs`] for a small `RSA` range `r` of the last `d` tokens of
    /// `ctx`: the match length of each occurrence is found by direct comparison (sequential
    /// reads of `T`, no search); the occurrences matching `d + k` tokens are a contiguous
    /// sub-range of `r` (they share a prefix in `RSA` order).
    fn extend_small(&self, r: Range, d: usize, ctx: &[u32], out: &mut Vec<Occ>) {
        let rest = &ctx[..ctx.len() - d];
        let mut m = [0usize; SMALL_RANGE];
        for (k, i) in (r.0..r.1).enumerate() {
            let start = self.rstart(i, d); // T position of the occurrence's first token
            m[k] = rest
                .iter()
                .rev()
                .zip((0..start).rev())
                .take_while(|&(&x, p)| self.tok(p) == x)
                .count();
        }
        let m = &m[..r.1 - r.0];
        let longest = m.iter().copied().max().unwrap_or(0);
        for k in 1..=longest {
            let lo = m
                .iter()
                .position(|&x| x >= k)
                .expect("some occurrence matches");
            let hi = m
                .iter()
                .rposition(|&x| x >= k)
                .expect("some occurrence matches");
            out.push(Occ::Rev((r.0 + lo, r.0 + hi + 1)));
        }
    }

    /// The longest suffix of `ctx` that occurs, and its occurrences: by narrowing in `RSA`, or
    /// without it by binary search on the length (counts never grow with it), `O(log |ctx|)`
    /// forward searches (infini-gram paper, §A.4).
    pub fn longest_occurring(&self, ctx: &[u32]) -> (usize, Occ) {
        if self.has_reverse() {
            let occs = self.suffix_occs(ctx);
            return (occs.len() - 1, *occs.last().expect("the empty context"));
        }
        let (mut lo, mut hi) = (0usize, ctx.len() + 1); // lo occurs, hi does not
        let mut best = (0, self.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let r = self.find(&ctx[ctx.len() - mid..]);
            if r.0 < r.1 {
                lo = mid;
                best = r;
            } else {
                hi = mid;
            }
        }
        (lo, Occ::Fwd(best))
    }

    /// Occurrences of `q` followed by a token (not at a document's end).
    fn cont_count(&self, occ: Occ, q: &[u32]) -> u64 {
        match occ {
            _ if occ.is_empty() => 0,
            Occ::Rev(r) if r.1 - r.0 <= SCAN_LIMIT => (r.0..r.1)
                .filter(|&i| self.rnext(i).is_some_and(|t| t != self.separator()))
                .count() as u64,
            _ => {
                let mut qs = q.to_vec();
                qs.push(self.separator());
                let f = self.find(&qs);
                // In infini-gram's layout the last document ends at the end of T, no separator.
                let at_end =
                    self.len() >= q.len() && self.slice(self.len() - q.len(), self.len()) == q;
                (occ.len() - (f.1 - f.0)).saturating_sub(usize::from(at_end)) as u64
            }
        }
    }
}

impl<S: AsRef<[u8]> + Sync> Index<S> {
    /// Whether `t` is an id of the index's vocabulary (below its size and its separator): only
    /// those can occur.
    pub fn holds_token(&self, t: u32) -> bool {
        t < self.separator() && (t as usize) < self.vocab_size().max(1)
    }

    /// Refuses token ids outside the index's vocabulary (the separator and above), which
    /// every query does first.
    pub fn check_tokens(&self, q: &[u32]) -> Result<()> {
        self.check_query(q)
    }

    fn check_query(&self, q: &[u32]) -> Result<()> {
        if let Some(&t) = q.iter().find(|&&t| !self.holds_token(t)) {
            return Err(Error::input(format!(
                "token id {t} is outside the index's vocabulary (0..{})",
                self.vocab_size()
            )));
        }
        Ok(())
    }

    /// Runs `f` on every shard, in parallel when there are several. Point lookups (`count`,
    /// `find`) do not use it: waking the pool costs more than their probes when the index is
    /// in memory (measured on the Linux-kernel index: 29 µs parallel vs 11 µs sequential per
    /// count, while from a cold cache parallel wins, 5.8 vs 9.5 ms).
    fn par_shards<T: Send>(&self, f: impl Fn(&Shard<S>) -> T + Sync + Send) -> Vec<T> {
        if self.shards().len() > 1 {
            self.shards().par_iter().map(f).collect()
        } else {
            self.shards().iter().map(f).collect()
        }
    }

    /// Occurrences of `q` (`count([])` = positions, separators included).
    pub fn count(&self, q: &[u32]) -> Result<CountResult> {
        self.check_query(q)?;
        let count = if q.is_empty() {
            self.shards().iter().map(|s| s.len() as u64).sum()
        } else {
            self.shards()
                .iter()
                .map(|s| {
                    let r = s.find(q);
                    (r.1 - r.0) as u64
                })
                .sum()
        };
        Ok(CountResult {
            count,
            approx: false,
        })
    }

    /// `count(prompt·cont) / count(prompt)`.
    pub fn prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult> {
        let prompt_cnt = self.count(prompt)?.count;
        let mut full = prompt.to_vec();
        full.push(cont);
        let cont_cnt = self.count(&full)?.count;
        Ok(ProbResult::new(prompt_cnt, cont_cnt, None))
    }

    /// Exact next-token counts of `prompt`, all shards merged.
    pub fn next_counts(&self, prompt: &[u32]) -> Result<Counts> {
        self.check_query(prompt)?;
        Ok(merge_counts(self.par_shards(|s| {
            let r = s.find(prompt);
            s.occ_counts(Occ::Fwd(r), prompt)
        })))
    }

    /// Exact next-token distribution of `prompt` as the query API reports it: every occurrence
    /// counted, documents' ends under `eos` (see the module docs).
    pub fn ntd(&self, prompt: &[u32], eos: Option<u32>) -> Result<NtdResult> {
        self.check_query(prompt)?;
        let occs: Vec<Occ> = self
            .shards()
            .iter()
            .map(|s| Occ::Fwd(s.find(prompt)))
            .collect();
        Ok(self.api_ntd(prompt, &occs, eos, None))
    }

    /// The query API's distribution of the occurrences `occs` (one per shard) of `q`.
    fn api_ntd(
        &self,
        q: &[u32],
        occs: &[Occ],
        eos: Option<u32>,
        suffix_len: Option<usize>,
    ) -> NtdResult {
        let prompt_cnt: u64 = occs.iter().map(|o| o.len() as u64).sum();
        let sep = self.separator();
        let per_shard = self.par_shards_with(occs, |s, &o| {
            if o.is_empty() {
                Counts::new()
            } else {
                s.occ_counts_ext(o, q, true)
            }
        });
        // Every shard's counts in one sorted list (documents' ends under `eos`, or dropped),
        // equal tokens merged; the map is then built from sorted pairs in one go.
        let mut all: Counts = per_shard
            .into_iter()
            .flatten()
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

    /// Runs `f` on every shard with its item of `items`, in parallel when there are several.
    fn par_shards_with<T: Send, I: Sync>(
        &self,
        items: &[I],
        f: impl Fn(&Shard<S>, &I) -> T + Sync + Send,
    ) -> Vec<T> {
        if self.shards().len() > 1 {
            self.shards()
                .par_iter()
                .zip(items)
                .map(|(s, i)| f(s, i))
                .collect()
        } else {
            self.shards()
                .iter()
                .zip(items)
                .map(|(s, i)| f(s, i))
                .collect()
        }
    }

    /// The longest suffix of `prompt` that occurs in some shard (`suffix_len`), and its
    /// occurrences in each shard: the ∞-gram context of the query API.
    pub fn occurring_suffix(&self, prompt: &[u32]) -> Result<(usize, Vec<Occ>)> {
        self.check_query(prompt)?;
        let tops = self.par_shards(|s| s.longest_occurring(prompt));
        let l = tops.iter().map(|t| t.0).max().unwrap_or(0);
        Ok((l, self.suffix_occs_of(prompt, l, &tops)))
    }

    /// Occurrences in each shard of the last `l` tokens of `prompt`, given each shard's longest
    /// occurring suffix `tops` (at least as long as `l` in some shard).
    fn suffix_occs_of(&self, prompt: &[u32], l: usize, tops: &[(usize, Occ)]) -> Vec<Occ> {
        let q = &prompt[prompt.len() - l..];
        self.shards()
            .iter()
            .zip(tops)
            .map(|(s, &(ls, occ))| match l {
                0 => Occ::Fwd((0, s.len())),
                _ if ls == l => occ,
                _ if ls > l => Occ::Fwd(s.find(q)),
                _ => Occ::Fwd((0, 0)),
            })
            .collect()
    }

    /// Length of the longest suffix of `prompt` that is followed by a token somewhere (not only
    /// by documents' ends), and the occurrences of that suffix in each shard: the estimators'
    /// ∞-gram context.
    pub fn longest_suffix(&self, prompt: &[u32]) -> Result<(usize, Vec<Occ>)> {
        self.check_query(prompt)?;
        let tops = self.par_shards(|s| s.longest_occurring(prompt));
        let mut l = tops.iter().map(|t| t.0).max().unwrap_or(0);
        loop {
            let q = &prompt[prompt.len() - l..];
            let occs = self.suffix_occs_of(prompt, l, &tops);
            // Occurrences only at documents' ends have no next token: back off further.
            let cont: u64 = self
                .shards()
                .iter()
                .zip(&occs)
                .map(|(s, &o)| s.cont_count(o, q))
                .sum();
            if l == 0 || cont > 0 {
                return Ok((l, occs));
            }
            l -= 1;
        }
    }

    /// Next-token counts of the ∞-gram: those of the longest suffix of `prompt` that has any.
    pub fn infgram_counts(&self, prompt: &[u32]) -> Result<(usize, Counts)> {
        let (l, occs) = self.longest_suffix(prompt)?;
        let q = &prompt[prompt.len() - l..];
        let counts = merge_counts(
            self.shards()
                .iter()
                .zip(occs)
                .filter(|(_, o)| !o.is_empty())
                .map(|(s, o)| s.occ_counts(o, q)),
        );
        Ok((l, counts))
    }

    /// ∞-gram next-token distribution of the query API: [`Index::ntd`] of the longest suffix
    /// of `prompt` that occurs.
    pub fn infgram_ntd(&self, prompt: &[u32], eos: Option<u32>) -> Result<NtdResult> {
        let (l, occs) = self.occurring_suffix(prompt)?;
        Ok(self.api_ntd(&prompt[prompt.len() - l..], &occs, eos, Some(l)))
    }

    /// ∞-gram probability of `cont` after `prompt`: [`Index::prob`] of the longest suffix of
    /// `prompt` that occurs.
    pub fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult> {
        self.check_query(&[cont])?;
        let (l, occs) = self.occurring_suffix(prompt)?;
        let q = &prompt[prompt.len() - l..];
        let prompt_cnt: u64 = occs.iter().map(|o| o.len() as u64).sum();
        // count(q·cont), from the next-token counts of the occurrences already found.
        let cont_cnt = self
            .par_shards_with(&occs, |s, &o| {
                if o.is_empty() {
                    return 0;
                }
                let counts = s.occ_counts(o, q);
                counts
                    .binary_search_by_key(&cont, |c| c.0)
                    .map_or(0, |i| counts[i].1)
            })
            .into_iter()
            .sum();
        Ok(ProbResult::new(prompt_cnt, cont_cnt, Some(l)))
    }

    /// Suffix-array segments of `q` in every shard.
    pub fn find(&self, q: &[u32]) -> Result<FindResult> {
        self.check_query(q)?;
        let segs: Vec<Range> = self.shards().iter().map(|s| s.find(q)).collect();
        Ok(FindResult {
            cnt: segs.iter().map(|r| (r.1 - r.0) as u64).sum(),
            segment_by_shard: segs,
        })
    }

    fn doc_window(&self, s: usize, pos: usize, needle_len: usize, max_disp_len: usize) -> Document {
        let half = max_disp_len / 2;
        self.window_at(s, pos, half, needle_len + half)
    }

    /// The window `[pos - before, pos + after)` of the document holding position `pos` of
    /// shard `s`, cut to the document (the infini-gram engine's `*_2` document getters).
    pub fn window_at(&self, s: usize, pos: usize, before: usize, after: usize) -> Document {
        let sh = &self.shards()[s];
        let d = sh.doc_of(pos);
        let (a, b) = sh.doc_span(d);
        let lo = pos.saturating_sub(before).max(a);
        let hi = pos.saturating_add(after).min(b).max(lo);
        let first: u64 = self.shards()[..s].iter().map(|x| x.num_docs() as u64).sum();
        Document {
            s,
            doc_ix: first + d as u64,
            doc_len: b - a,
            disp_len: hi - lo,
            needle_offset: pos.saturating_sub(lo),
            metadata: sh.doc_meta(d).unwrap_or("").to_string(),
            token_ids: sh.slice(lo, hi),
            ptr: pos,
        }
    }

    /// Documents in all shards.
    pub fn num_docs(&self) -> u64 {
        self.shards().iter().map(|s| s.num_docs() as u64).sum()
    }

    /// The first `max_len` tokens of document `doc_ix` (numbered across shards).
    pub fn get_doc_by_ix(&self, doc_ix: u64, max_len: usize) -> Result<Document> {
        let mut rest = doc_ix;
        for (s, sh) in self.shards().iter().enumerate() {
            let n = sh.num_docs() as u64;
            if rest < n {
                let (a, _) = sh.doc_span(rest as usize);
                return Ok(self.window_at(s, a, 0, max_len));
            }
            rest -= n;
        }
        Err(Error::input(format!(
            "document {doc_ix} does not exist ({} documents)",
            self.num_docs()
        )))
    }

    /// Shard `s` after checking that `i` is one of its positions (`what` names `i` in errors).
    fn shard_position(&self, s: usize, i: usize, what: &str) -> Result<&Shard<S>> {
        let shards = self.shards();
        let sh = shards.get(s).ok_or_else(|| {
            Error::input(format!(
                "shard {s} does not exist ({} shards)",
                shards.len()
            ))
        })?;
        if i >= sh.len() {
            return Err(Error::input(format!(
                "{what} {i} is outside shard {s} (0..{})",
                sh.len()
            )));
        }
        Ok(sh)
    }

    /// The document around suffix-array rank `rank` of shard `s` (a window of `max_disp_len`).
    pub fn get_doc_by_rank(
        &self,
        s: usize,
        rank: usize,
        needle_len: usize,
        max_disp_len: usize,
    ) -> Result<Document> {
        let sh = self.shard_position(s, rank, "rank")?;
        Ok(self.doc_window(s, sh.sa(rank), needle_len, max_disp_len))
    }

    /// The document around token position `ptr` of shard `s`.
    pub fn get_doc_by_ptr(
        &self,
        s: usize,
        ptr: usize,
        needle_len: usize,
        max_disp_len: usize,
    ) -> Result<Document> {
        self.shard_position(s, ptr, "pointer")?;
        Ok(self.doc_window(s, ptr, needle_len, max_disp_len))
    }

    /// Documents matching a CNF: every clause (an OR of n-grams) has an occurrence within
    /// `max_diff_tokens` of an occurrence of the rarest clause, in the same document.
    pub fn search_docs(
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
            self.check_query(g)?;
        }
        if max_clause_freq == 0 {
            return Err(Error::input(
                "max_clause_freq must be at least 1 (occurrences per n-gram before sampling)",
            ));
        }
        let mut cnt = 0u64;
        let mut approx = false;
        let mut documents = Vec::new();
        let mut seen_docs = std::collections::HashSet::new();
        let mut ptrs_by_shard = vec![Vec::new(); self.shards().len()];
        // The anchor: the clause with the fewest occurrences in the whole index (one choice for
        // all shards, so the count does not depend on how documents are sharded).
        let total = |clause: &Vec<Vec<u32>>| -> usize {
            let per = |sh: &Shard<S>| {
                clause
                    .iter()
                    .map(|g| sh.find(g))
                    .map(|r| r.1 - r.0)
                    .sum::<usize>()
            };
            self.shards().iter().map(per).sum()
        };
        let rarest = (0..cnf.len()).min_by_key(|&i| total(&cnf[i])).unwrap_or(0);
        for (s, sh) in self.shards().iter().enumerate() {
            // Positions (start, end) of each clause's occurrences, sorted by start. An n-gram
            // with more than `max_clause_freq` occurrences is sampled; the shard's matches
            // are scaled back up by the product over clauses of occurrences / sampled
            // (infini-gram's subsampling factor).
            let mut clauses: Vec<Vec<(usize, usize)>> = Vec::with_capacity(cnf.len());
            let mut factor = 1.0f64;
            for clause in cnf {
                let mut pos = Vec::new();
                let mut occurrences = 0usize;
                for g in clause {
                    let r = sh.find(g);
                    let len = r.1 - r.0;
                    occurrences += len;
                    let step = if len > max_clause_freq {
                        approx = true;
                        len.div_ceil(max_clause_freq)
                    } else {
                        1
                    };
                    pos.extend(
                        (r.0..r.1)
                            .step_by(step)
                            .map(|i| (sh.sa(i), sh.sa(i) + g.len())),
                    );
                }
                if !pos.is_empty() {
                    factor *= occurrences as f64 / pos.len() as f64;
                }
                pos.sort_unstable();
                clauses.push(pos);
            }
            let mut matched = 0u64;
            for &(p, e) in &clauses[rarest] {
                let doc = sh.doc_of(p);
                let (da, db) = sh.doc_span(doc);
                let ok = clauses.iter().enumerate().all(|(ci, occ)| {
                    ci == rarest || {
                        let lo = p.saturating_sub(max_diff_tokens).max(da);
                        let hi = e.saturating_add(max_diff_tokens);
                        let k = occ.partition_point(|&(a, _)| a < lo);
                        occ[k..]
                            .iter()
                            .take_while(|&&(a, _)| a <= hi && a < db)
                            .any(|&(_, b)| b <= db)
                    }
                });
                if ok {
                    matched += 1;
                    ptrs_by_shard[s].push(p);
                    if documents.len() < maxnum && seen_docs.insert((s, doc)) {
                        documents.push(self.doc_window(s, p, e - p, max_disp_len));
                    }
                }
            }
            cnt += (matched as f64 * factor).round() as u64;
        }
        Ok(SearchResult {
            cnt,
            approx,
            documents,
            ptrs_by_shard,
        })
    }

    /// For each position `j` of `tokens`, the longest span ending at `j` that occurs in the
    /// corpus, and its count. Uses that the span at `j+1` is at most one token longer.
    pub fn longest_match(&self, tokens: &[u32]) -> Result<Vec<Match>> {
        self.check_query(tokens)?;
        let mut out = Vec::with_capacity(tokens.len());
        let mut prev = 0usize;
        for j in 0..tokens.len() {
            let start = (j + 1).saturating_sub(prev + 1);
            let ctx = &tokens[start..=j];
            let per_shard = self.par_shards(|s| s.suffix_occs(ctx));
            let len = per_shard.iter().map(|o| o.len() - 1).max().unwrap_or(0);
            let count = per_shard
                .iter()
                .filter_map(|o| o.get(len))
                .map(|o| o.len() as u64)
                .sum();
            out.push(Match {
                len,
                count: if len == 0 { 0 } else { count },
            });
            prev = len;
        }
        Ok(out)
    }
}
