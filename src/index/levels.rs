//! SBIS levels: the distinct counts among a context's suffixes, longest suffix first.
//!
//! For suffix lengths `l = L, L-1, …, 1` the occurrence count of the last `l` tokens never
//! decreases. A *level* is a length where it changes; its next-token counts are kept when
//! their total exceeds that of the previous kept level (the ∞-gram estimators of `ngram`). The occurrence ranges of
//! all suffixes come from the reversed suffix array in one left-to-right narrowing (ranges
//! nest), so the change points cost one binary search per suffix length that occurs, and the
//! counts are computed only at change points (cached for large, recurring ranges).

use crate::index::counting::continuations_of;
use crate::index::counts_cache::{CacheStats, CountsCache, Lookup};
use crate::index::query::{merge_counts, tally_sorted_into, Counts, Occ};
use crate::index::{Index, Shard};
use std::sync::Arc;

/// One kept level.
#[derive(Clone, Debug)]
pub struct Level {
    /// Suffix length `n` of the level.
    pub len: usize,
    /// Total of its next-token counts `m`.
    pub total: u64,
    /// Next-token counts, sorted by token id.
    pub counts: Arc<Counts>,
    /// Kneser–Ney continuation counts (distinct left neighbours per next token), when asked for.
    pub continuations: Option<Arc<Counts>>,
}

/// Occurrences (shard, start in `T`) of one change-point suffix of the previous context.
#[derive(Clone, Debug)]
struct Tracked {
    len: usize,
    starts: Vec<(usize, usize)>,
    /// The next-token counts last reported for it: refilled in place at the next step once
    /// the caller has dropped its levels (no allocation per step).
    counts: Arc<Counts>,
}

/// Change points with at most this many occurrences are tracked between generation steps.
const TRACK_MAX: usize = 64;

/// The small levels of the previous generation step, extended by each new token without any
/// search (see [`LevelFinder::next_levels_into`]).
#[derive(Default)]
pub struct Tracker {
    tracked: Vec<Tracked>,
    /// Scratch space for the next tokens of a tracked suffix.
    toks: Vec<u32>,
}

impl Tracker {
    /// Forgets the tracked suffixes (the context changed by more than one appended token).
    pub fn reset(&mut self) {
        self.tracked.clear();
    }
}

/// What a reader of a corpus asks for: the first `k` levels of `ctx` (all when `k < 0`) whose
/// next-token counts pass `keep`, longest first (`Shards::levels` of `index::shards`).
#[derive(Clone, Copy)]
pub struct LevelAsk<'a> {
    /// The context.
    pub ctx: &'a [u32],
    /// Levels wanted at most (all when negative).
    pub k: i64,
    /// Whether the empty context (the unigram distribution) may end the list.
    pub include_empty: bool,
    /// Whether every level but the first carries its Kneser–Ney continuation counts (the
    /// smoothed estimator).
    pub continuation: bool,
    /// Levels whose counts it refuses are skipped (and not counted towards `k`).
    pub keep: &'a dyn Fn(&Counts) -> bool,
}

impl<'a> LevelAsk<'a> {
    /// The first `k` levels of `ctx` (all when `k < 0`), the empty context left out.
    pub fn new(ctx: &'a [u32], k: i64) -> Self {
        LevelAsk {
            ctx,
            k,
            include_empty: false,
            continuation: false,
            keep: &|_| true,
        }
    }

    /// The unigram level (the empty context's), for a context of which nothing occurs.
    pub fn unigram() -> Self {
        LevelAsk {
            include_empty: true,
            ..LevelAsk::new(&[], 1)
        }
    }
}

/// What one reader of a corpus (a model, a drafter) keeps between its reads of levels. On an
/// index in this process: its level finder (the counts cache's counters are the reader's) and
/// the small suffixes tracked from one generation step to the next ([`Tracker`]); shards held
/// elsewhere keep their own caches and read only whether documents' ends count.
pub struct Memo {
    pub(crate) finder: LevelFinder,
    pub(crate) tracker: Tracker,
}

impl Memo {
    /// A reader's memo; with `keep_end`, documents' ends count as the separator token.
    pub fn new(keep_end: bool) -> Self {
        Memo {
            finder: LevelFinder::new(keep_end),
            tracker: Tracker::default(),
        }
    }

    /// Whether documents' ends count as the separator token.
    pub fn keep_end(&self) -> bool {
        self.finder.keep_end
    }

    /// Forgets the suffixes tracked from the last step (the context changed by more than one
    /// appended token).
    pub fn forget_steps(&mut self) {
        self.tracker.reset();
    }
}

/// Computes levels on an index, caching next-token counts of large occurrence sets. The index
/// is passed to each call, so the owner of both (a model, a drafter) keeps one finder for its
/// whole life. The counts go to the index's own cache ([`Index::counts_cache`], shared by every
/// finder on the index) unless the finder was given a cache of its own.
pub struct LevelFinder {
    own_cache: Option<CountsCache>,
    keep_end: bool,
    /// This finder's lookups: (hits, misses).
    lookups: (u64, u64),
}

impl LevelFinder {
    /// A finder on the index's shared cache; with `keep_end`, document ends count as the
    /// separator token.
    pub fn new(keep_end: bool) -> Self {
        LevelFinder {
            own_cache: None,
            keep_end,
            lookups: (0, 0),
        }
    }

    /// A finder with a cache of its own that holds at most `capacity` `(token, count)` pairs
    /// (a finder, and so its cache, serves one index).
    pub fn with_cache_capacity(keep_end: bool, capacity: usize) -> Self {
        LevelFinder {
            own_cache: Some(CountsCache::with_capacity(capacity)),
            ..LevelFinder::new(keep_end)
        }
    }

    /// How the counts cache has served this finder on `index`: its own hits and misses, and
    /// the evictions and size of the cache it uses (the index's, shared, unless it has its own).
    pub fn cache_stats<S: AsRef<[u8]> + Sync>(&self, index: &Index<S>) -> CacheStats {
        let cache = self.cache(index).stats();
        CacheStats {
            hits: self.lookups.0,
            misses: self.lookups.1,
            ..cache
        }
    }

    /// The cache this finder uses on `index`.
    fn cache<'a, S: AsRef<[u8]> + Sync>(&'a self, index: &'a Index<S>) -> &'a CountsCache {
        self.own_cache.as_ref().unwrap_or(index.counts_cache())
    }

    /// Occurrences of the suffixes of `ctx` in every shard (see [`crate::index::Shard::suffix_occs`]).
    fn suffix_occs<S: AsRef<[u8]> + Sync>(index: &Index<S>, ctx: &[u32]) -> Vec<Vec<Occ>> {
        index.shards().iter().map(|s| s.suffix_occs(ctx)).collect()
    }

    /// Next-token counts of the suffix of length `l` of `ctx`, merged over shards.
    fn counts_at<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        per_shard: &[Vec<Occ>],
        ctx: &[u32],
        l: usize,
        continuation: bool,
    ) -> Arc<Counts> {
        let occs = per_shard.iter().map(|occs| occs.get(l).copied());
        self.counts_of(index, occs, &ctx[ctx.len() - l..], continuation)
    }

    /// The level of `q` given its occurrences in each shard (`None` or an empty range: none
    /// there), its counts through the cache; `None` when no occurrence has a next token.
    pub fn level_of<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        occs: impl Iterator<Item = Option<Occ>>,
        q: &[u32],
    ) -> Option<Level> {
        let counts = self.counts_of(index, occs, q, false);
        let total: u64 = counts.iter().map(|&(_, c)| c).sum();
        (total > 0).then_some(Level {
            len: q.len(),
            total,
            counts,
            continuations: None,
        })
    }

    /// Next-token counts of `q` given its occurrences in each shard, merged over shards.
    fn counts_of<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        occs: impl Iterator<Item = Option<Occ>>,
        q: &[u32],
        continuation: bool,
    ) -> Arc<Counts> {
        let found = index
            .shards()
            .iter()
            .zip(occs)
            .enumerate()
            .filter_map(|(s, (sh, occ))| Some((s, sh, occ?)))
            .filter(|(_, _, occ)| !occ.is_empty());
        if !continuation {
            return self.merged(index, found, q, false);
        }
        let found: Vec<_> = found.collect();
        if found.len() < 2 {
            return self.merged(index, found.into_iter(), q, true);
        }
        // Distinct tokens before a continuation do not add over shards: count the union of
        // their pairs, as one index of all the documents would.
        let parts = found.into_iter().map(|(_, sh, occ)| (sh, occ));
        Arc::new(continuations_of(parts, q, self.keep_end))
    }

    /// The counts (continuation counts with `continuation`) of `q` at each `(shard number,
    /// shard, occurrences)` of `parts`, through the cache, added over shards.
    fn merged<'s, S: AsRef<[u8]> + Sync + 's>(
        &mut self,
        index: &Index<S>,
        parts: impl Iterator<Item = (usize, &'s Shard<S>, Occ)>,
        q: &[u32],
        continuation: bool,
    ) -> Arc<Counts> {
        let mut parts = parts.map(|(s, sh, occ)| {
            let (counts, lookup) =
                self.cache(index)
                    .get(s, sh, occ, q, self.keep_end, continuation);
            match lookup {
                Lookup::Hit => self.lookups.0 += 1,
                Lookup::Miss => self.lookups.1 += 1,
                Lookup::Uncached => {}
            }
            counts
        });
        // Most indexes have one shard, or the suffix occurs in one: no merge, no list.
        match (parts.next(), parts.next()) {
            (None, _) => Arc::new(Vec::new()),
            (Some(one), None) => one,
            (Some(a), Some(b)) => Arc::new(merge_counts([a, b].into_iter().chain(parts))),
        }
    }

    /// Up to `k` levels of `ctx` (all when `k < 0`), longest suffix first. With
    /// `include_empty`, the empty context (the unigram distribution) may end the list.
    pub fn levels<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        ctx: &[u32],
        k: i64,
        include_empty: bool,
    ) -> Vec<Level> {
        self.levels_with(index, ctx, k, include_empty, false)
    }

    /// [`LevelFinder::levels`], with the continuation counts of every level but the first when
    /// `continuation` is set (for the smoothed estimator).
    pub fn levels_with<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        ctx: &[u32],
        k: i64,
        include_empty: bool,
        continuation: bool,
    ) -> Vec<Level> {
        let ask = LevelAsk {
            include_empty,
            continuation,
            ..LevelAsk::new(ctx, k)
        };
        self.levels_asked(index, ask)
    }

    /// The levels `ask` asks for (`Shards::levels` on an index in this process): the first
    /// `k` whose next-token counts pass `ask.keep`, chosen as by [`LevelFinder::levels`]; those
    /// `keep` refuses are skipped (for SBIS after a processor masked every continuation of the
    /// kept levels: the next levels that have an allowed continuation).
    pub fn levels_asked<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        ask: LevelAsk<'_>,
    ) -> Vec<Level> {
        let per_shard = Self::suffix_occs(index, ask.ctx);
        let mut kept = Vec::with_capacity(16);
        self.levels_from(
            index,
            &per_shard,
            ask.ctx,
            ask.k,
            ask.include_empty,
            ask.continuation,
            (0, 0),
            ask.keep,
            &mut kept,
        );
        kept
    }

    /// The levels, given the occurrences of `ctx`'s suffixes in every shard, appended to
    /// `kept`. `prev` is the (occurrence count, total) of the level just longer than `ctx`,
    /// when levels of a longer context come before these ((0, 0) otherwise). Levels whose
    /// counts `keep` refuses are left out (and not counted towards `k`).
    #[allow(clippy::too_many_arguments)]
    fn levels_from<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        per_shard: &[Vec<Occ>],
        ctx: &[u32],
        k: i64,
        include_empty: bool,
        continuation: bool,
        prev: (usize, u64),
        keep: &dyn Fn(&Counts) -> bool,
        kept: &mut Vec<Level>,
    ) {
        let lmax = per_shard.iter().map(|o| o.len() - 1).max().unwrap_or(0);
        let raw = |l: usize| raw_count(per_shard, l);
        let mut added = 0i64;
        let (mut prev_raw, mut prev_total) = prev;
        let lowest = if include_empty { 0 } else { 1 };
        for l in (lowest..=lmax).rev() {
            let r = raw(l);
            if r == prev_raw && l > 0 {
                continue;
            }
            prev_raw = r;
            let counts = self.counts_at(index, per_shard, ctx, l, false);
            let total: u64 = counts.iter().map(|&(_, c)| c).sum();
            if total > prev_total {
                prev_total = total;
                if !keep(&counts) {
                    continue;
                }
                let continuations = (continuation && added > 0)
                    .then(|| self.counts_at(index, per_shard, ctx, l, true));
                kept.push(Level {
                    len: l,
                    total,
                    counts,
                    continuations,
                });
                added += 1;
                if k >= 0 && added >= k {
                    break;
                }
            }
        }
    }

    /// The first `k` SBIS levels of `ctx` (all when `k < 0`) during generation, where `ctx` is
    /// the previous step's context plus `appended` (cut to the context window).
    ///
    /// Amortized: the change points of `c·x` are among `{L·x : L a change point of c}` (two
    /// suffixes of `c` with the same occurrences keep the same occurrences when extended by
    /// `x`). The tracker holds the longest change points of the previous step, those with at
    /// most `TRACK_MAX` occurrences, with their occurrences; extending them by `x` (one token
    /// read per occurrence) gives an exact prefix of the new level list: a change point that
    /// comes from an untracked (more frequent, so shorter) suffix is shorter than all of them.
    /// The levels past that prefix (short suffixes, frequent, their counts mostly cached) are
    /// searched for in the context cut just below the shortest tracked length, and the small
    /// ones among them tracked for the next step. When the longest tracked suffix outgrows the
    /// window, everything is searched again. Equal to `levels(ctx, k, false)` with `keep_end`
    /// (tested).
    ///
    /// The levels go into `levels` (cleared first). A caller that keeps one list for every
    /// step, and has dropped the previous step's levels by the next call, lets the tracked
    /// levels' counts be refilled in place: no allocation in most steps.
    pub fn next_levels_into<S: AsRef<[u8]> + Sync>(
        &mut self,
        index: &Index<S>,
        tracker: &mut Tracker,
        ctx: &[u32],
        appended: Option<u32>,
        k: i64,
        levels: &mut Vec<Level>,
    ) {
        levels.clear();
        // The tracker reads the token after each occurrence, which infini-gram's layout lacks
        // at the end of a shard (its last document has no separator after it).
        let unterminated = index
            .shards()
            .iter()
            .any(|sh| sh.layout() == crate::index::Layout::InfiniGram);
        if k == 0 || !self.keep_end || unterminated {
            levels.extend(self.levels(index, ctx, k, false));
            return;
        }
        let want = usize::try_from(k).unwrap_or(usize::MAX);
        // Without the one appended token the tracked suffixes say nothing about `ctx`.
        match appended {
            Some(x) => Self::advance(index, tracker, x, ctx.len(), want, levels),
            None => tracker.reset(),
        }
        if levels.len() >= want {
            return;
        }
        // The rest: suffixes shorter than the shortest tracked one.
        let (shortest, prev) = match tracker.tracked.last() {
            Some(t) => (t.len, (t.starts.len(), t.starts.len() as u64)),
            None => (ctx.len() + 1, (0, 0)),
        };
        let tail = &ctx[ctx.len() + 1 - shortest..];
        let per_shard = Self::suffix_occs(index, tail);
        let lmax = per_shard.iter().map(|o| o.len() - 1).max().unwrap_or(0);
        let mut prev_raw = prev.0;
        for l in (1..=lmax).rev() {
            let raw = raw_count(&per_shard, l);
            if raw == prev_raw {
                continue;
            }
            if raw > TRACK_MAX {
                break;
            }
            prev_raw = raw;
            let mut starts = Vec::with_capacity(raw);
            for (s, (sh, occs)) in index.shards().iter().zip(&per_shard).enumerate() {
                match occs.get(l) {
                    Some(&Occ::Rev((a, b))) => starts.extend((a..b).map(|i| (s, sh.rstart(i, l)))),
                    Some(&Occ::Fwd((a, b))) => starts.extend((a..b).map(|i| (s, sh.sa(i)))),
                    None => {}
                }
            }
            tracker.tracked.push(Tracked {
                len: l,
                starts,
                counts: Arc::default(),
            });
        }
        let rest = if k < 0 {
            -1
        } else {
            (want - levels.len()) as i64
        };
        self.levels_from(
            index,
            &per_shard,
            tail,
            rest,
            false,
            false,
            prev,
            &|_| true,
            levels,
        );
    }

    /// Extends the tracked suffixes by `x` and appends the levels they give to `levels`, at
    /// most `want` (longest first); clears them when the longest outgrows the window.
    fn advance<S: AsRef<[u8]> + Sync>(
        index: &Index<S>,
        tracker: &mut Tracker,
        x: u32,
        window: usize,
        want: usize,
        levels: &mut Vec<Level>,
    ) {
        let shards = index.shards();
        // Extend every tracked suffix by `x` in place, then keep the first of each count.
        for t in tracker.tracked.iter_mut() {
            let len = t.len;
            t.starts.retain(|&(s, p)| shards[s].tok(p + len) == x);
            t.len += 1;
        }
        let mut prev = 0;
        tracker.tracked.retain(|t| {
            let keep = t.starts.len() > prev;
            if keep {
                prev = t.starts.len();
            }
            keep
        });
        if tracker.tracked.first().is_some_and(|t| t.len > window) {
            tracker.tracked.clear();
            return;
        }
        let toks = &mut tracker.toks;
        levels.extend(tracker.tracked.iter_mut().take(want).map(|t| {
            toks.clear();
            toks.extend(t.starts.iter().map(|&(s, p)| shards[s].tok(p + t.len)));
            toks.sort_unstable();
            match Arc::get_mut(&mut t.counts) {
                Some(counts) => tally_sorted_into(toks.iter().copied(), counts),
                None => {
                    let mut counts = Counts::with_capacity(toks.len().min(16));
                    tally_sorted_into(toks.iter().copied(), &mut counts);
                    t.counts = Arc::new(counts);
                }
            }
            Level {
                len: t.len,
                total: t.starts.len() as u64,
                counts: t.counts.clone(),
                continuations: None,
            }
        }));
    }
}

/// Occurrences, over all shards, of the suffix of length `l` (0 past a shard's longest).
fn raw_count(per_shard: &[Vec<Occ>], l: usize) -> usize {
    per_shard
        .iter()
        .filter_map(|o| o.get(l))
        .map(|o| o.len())
        .sum()
}

/// Count of `tok` in sorted `counts`.
#[inline]
pub fn count_of(counts: &Counts, tok: u32) -> u64 {
    counts
        .binary_search_by_key(&tok, |&(t, _)| t)
        .map_or(0, |i| counts[i].1)
}

/// The most frequent token of `counts` (the smallest id among ties).
pub fn top_token(counts: &Counts) -> Option<u32> {
    counts
        .iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|x| x.0)
}
