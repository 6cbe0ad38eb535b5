//! The infini-gram query types' results (`count`, `prob`, `ntd`, `infgram_prob`,
//! `infgram_ntd`, `find`, documents by rank or pointer, `search_docs` (CNF) and
//! `longest_match`), with the infini-gram Python package's field names, and the one-shard
//! operations they are computed from. The queries themselves, answered shard by shard and
//! merged, are [`shards`](super::shards)'s.
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
//! The estimators need another convention, kept in [`Shards::infgram_counts`] and
//! [`Shards::next_counts`]: there an occurrence at a document's end has no next token, and the
//! ∞-gram backs off past a suffix that has only such occurrences.
//!
//! [`Shards::infgram_counts`]: super::shards::Shards::infgram_counts
//! [`Shards::next_counts`]: super::shards::Shards::next_counts

use super::{Range, Shard};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Reversed-suffix-array ranges up to this size are scanned instead of searched.
const SCAN_LIMIT: usize = 64;
/// Below this many occurrences, suffix ranges are extended by direct comparison.
const SMALL_RANGE: usize = 8;

/// Occurrences of a context in one shard, as a range of the forward or of the reversed suffix
/// array (the reversed one when the context was extended to the left).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Match {
    /// Length of the longest span ending here that occurs in the corpus.
    pub len: usize,
    /// Its occurrences.
    pub count: u64,
}

/// A document window from one shard, its number within the shard, and the position it is
/// anchored at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Located {
    /// The window; `doc_ix` numbers the document within its shard until the merge.
    pub document: Document,
    /// The position in the shard of the match (or of the window's anchor).
    pub ptr: usize,
}

/// One shard's part of a CNF search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CnfPart {
    /// Matching occurrences of the anchor clause (among those sampled).
    pub matched: u64,
    /// Occurrences over sampled occurrences, multiplied over the clauses (1 when none was
    /// sampled): what scales `matched` back up.
    pub factor: f64,
    /// Whether some n-gram was sampled.
    pub approx: bool,
    /// Positions of the matching occurrences.
    pub ptrs: Vec<usize>,
    /// The first `maxnum` matching documents, one window each.
    pub documents: Vec<Located>,
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
pub(super) fn sort_and_merge(out: &mut Counts) {
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
    /// shards these do not add (a pair present in two shards counts once): readers count the
    /// union of the shards' [`Shard::continuation_pairs`].
    pub fn occ_continuations(&self, occ: Occ, ctx: &[u32], keep_end: bool) -> Counts {
        let pairs = self.continuation_pairs(occ, ctx, keep_end);
        tally_sorted(pairs.into_iter().map(|(x, _)| x))
    }

    /// The distinct (next token, token before) pairs of the occurrences `occ` of `ctx`, sorted
    /// (a document's start reads as the separator before it).
    pub fn continuation_pairs(&self, occ: Occ, ctx: &[u32], keep_end: bool) -> Vec<(u32, u32)> {
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
        pairs
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

    /// The window `[pos − before, pos + after)` of the document holding position `pos`, cut to
    /// the document; its `doc_ix` numbers the document within this shard.
    pub fn window(&self, pos: usize, before: usize, after: usize) -> Located {
        let d = self.doc_of(pos);
        let (a, b) = self.doc_span(d);
        let lo = pos.saturating_sub(before).max(a);
        let hi = pos.saturating_add(after).min(b).max(lo);
        let document = Document {
            s: 0,
            doc_ix: d as u64,
            doc_len: b - a,
            disp_len: hi - lo,
            needle_offset: pos.saturating_sub(lo),
            metadata: self.doc_meta(d).unwrap_or("").to_string(),
            token_ids: self.slice(lo, hi),
            ptr: pos,
        };
        Located { document, ptr: pos }
    }

    /// This shard's part of a CNF search anchored at clause `anchor` (see
    /// [`search_docs`](super::shards::Shards::search_docs)): the anchor's occurrences that every other clause has an
    /// occurrence near (within `max_diff_tokens`, in the same document), the first `maxnum`
    /// of their documents, and the factor that scales sampled counts back up.
    pub fn cnf_part(
        &self,
        cnf: &[Vec<Vec<u32>>],
        anchor: usize,
        max_diff_tokens: usize,
        max_clause_freq: usize,
        maxnum: usize,
        max_disp_len: usize,
    ) -> CnfPart {
        // Positions (start, end) of each clause's occurrences, sorted by start. An n-gram with
        // more than `max_clause_freq` occurrences is sampled; the matches are scaled back up
        // by the product over clauses of occurrences / sampled (infini-gram's subsampling
        // factor).
        let mut clauses: Vec<Vec<(usize, usize)>> = Vec::with_capacity(cnf.len());
        let (mut factor, mut approx) = (1.0f64, false);
        for clause in cnf {
            let mut pos = Vec::new();
            let mut occurrences = 0usize;
            for g in clause {
                let r = self.find(g);
                let len = r.1 - r.0;
                occurrences += len;
                let step = if len > max_clause_freq.max(1) {
                    approx = true;
                    len.div_ceil(max_clause_freq.max(1))
                } else {
                    1
                };
                pos.extend(
                    (r.0..r.1)
                        .step_by(step)
                        .map(|i| (self.sa(i), self.sa(i) + g.len())),
                );
            }
            if !pos.is_empty() {
                factor *= occurrences as f64 / pos.len() as f64;
            }
            pos.sort_unstable();
            clauses.push(pos);
        }
        let mut part = CnfPart {
            matched: 0,
            factor,
            approx,
            ptrs: Vec::new(),
            documents: Vec::new(),
        };
        let mut seen_docs = std::collections::HashSet::new();
        let half = max_disp_len / 2;
        for &(p, e) in clauses.get(anchor).map_or(&[][..], |c| &c[..]) {
            let doc = self.doc_of(p);
            let (da, db) = self.doc_span(doc);
            let ok = clauses.iter().enumerate().all(|(ci, occ)| {
                ci == anchor || {
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
                part.matched += 1;
                part.ptrs.push(p);
                if part.documents.len() < maxnum && seen_docs.insert(doc) {
                    part.documents.push(self.window(p, half, e - p + half));
                }
            }
        }
        part
    }

    /// Up to `max_docs` distinct documents of this shard holding `span`, in suffix-array
    /// order, each the window `[pos − before, pos + after)` around its first occurrence.
    pub fn span_docs(
        &self,
        span: &[u32],
        max_docs: usize,
        before: usize,
        after: usize,
    ) -> Vec<Located> {
        let (a, b) = self.find(span);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for i in a..b {
            if out.len() >= max_docs {
                break;
            }
            let pos = self.sa(i);
            if seen.insert(self.doc_of(pos)) {
                out.push(self.window(pos, before, after));
            }
        }
        out
    }

    /// For each position `j` of `tokens`, the longest span ending at `j` that occurs in this
    /// shard, and its count.
    ///
    /// The span at `j + 1` is at most one token longer than the span at `j`. So the span at `j`
    /// is carried forward with its suffix-array range: when the range narrowed by the next
    /// token is not empty, that is the next span (one binary search); only where the match
    /// breaks is the span found afresh, leftwards from `j` (through the reversed array when
    /// there is one). A text the corpus holds whole costs one search per token, not time
    /// quadratic in its length.
    pub fn longest_matches(&self, tokens: &[u32]) -> Vec<Match> {
        let mut out = Vec::with_capacity(tokens.len());
        // The span ending at the previous position: its length and `SA` range.
        let mut carried: Option<(usize, Range)> = None;
        for j in 0..tokens.len() {
            if let Some((len, r)) = carried {
                let next = self.narrow(r, len, tokens[j]);
                if next.0 < next.1 {
                    out.push(Match {
                        len: len + 1,
                        count: (next.1 - next.0) as u64,
                    });
                    carried = Some((len + 1, next));
                    continue;
                }
            }
            let prev = carried.map_or(0, |c| c.0);
            let start = (j + 1).saturating_sub(prev + 1);
            let occs = self.suffix_occs(&tokens[start..=j]);
            let len = occs.len() - 1;
            let count = if len == 0 { 0 } else { occs[len].len() as u64 };
            out.push(Match { len, count });
            carried = match occs[len] {
                _ if len == 0 => None,
                Occ::Fwd(r) => Some((len, r)),
                Occ::Rev(_) => Some((len, self.find(&tokens[j + 1 - len..=j]))),
            };
        }
        out
    }
}
