//! A bounded cache of next-token counts of large occurrence sets.
//!
//! Short contexts recur constantly in generation and scoring, and their next-token counts cost
//! one galloping pass over a large suffix-array range; small ranges are cheaper to recount than
//! to look up. Entries are keyed by shard, context length and range, so a cache serves one
//! index. The cache holds at most a set number of `(token, count)` pairs: past it, the least
//! recently used entries go until half the budget is free (one sort per eviction round, so the
//! cost per lookup stays constant), which keeps a long-running server's memory flat.

use crate::index::query::{Counts, Occ};
use crate::index::Shard;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// (shard, context length, reversed?, lo, hi, keep_end, continuation counts?).
type CacheKey = (usize, usize, bool, usize, usize, bool, bool);

/// Occurrence sets at least this large are cached.
pub const CACHE_MIN: usize = 64;

/// Default budget: 4 M `(token, count)` pairs (64 MB).
pub const DEFAULT_CAPACITY: usize = 1 << 22;

/// How a cache has served: for `--stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that computed and stored their counts.
    pub misses: u64,
    /// Entries dropped to stay within the budget.
    pub evicted: u64,
    /// `(token, count)` pairs held now.
    pub held: usize,
}

impl CacheStats {
    /// `hits / (hits + misses)` (0 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

/// Next-token counts of large occurrence sets, least recently used out first.
pub struct CountsCache {
    /// Entry and the tick of its last use.
    map: HashMap<CacheKey, (Arc<Counts>, u64), foldhash::fast::RandomState>,
    tick: u64,
    capacity: usize,
    stats: CacheStats,
}

impl Default for CountsCache {
    fn default() -> Self {
        CountsCache::with_capacity(DEFAULT_CAPACITY)
    }
}

impl CountsCache {
    /// A cache that holds at most `capacity` `(token, count)` pairs.
    pub fn with_capacity(capacity: usize) -> Self {
        CountsCache {
            map: HashMap::default(),
            tick: 0,
            capacity,
            stats: CacheStats::default(),
        }
    }

    /// What the cache did so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Next-token counts of `occ` (occurrences of `ctx` in shard `s`), or the continuation
    /// counts of [`Shard::occ_continuations`] when `continuation` is set; from the cache when
    /// the set is large.
    pub fn get<S: AsRef<[u8]>>(
        &mut self,
        s: usize,
        sh: &Shard<S>,
        occ: Occ,
        ctx: &[u32],
        keep_end: bool,
        continuation: bool,
    ) -> Arc<Counts> {
        let compute = || {
            Arc::new(if continuation {
                sh.occ_continuations(occ, ctx, keep_end)
            } else {
                sh.occ_counts_ext(occ, ctx, keep_end)
            })
        };
        if occ.len() < CACHE_MIN {
            return compute();
        }
        let (Occ::Fwd((a, b)) | Occ::Rev((a, b))) = occ;
        let rev = matches!(occ, Occ::Rev(_));
        let key = (s, ctx.len(), rev, a, b, keep_end, continuation);
        self.tick += 1;
        if let Some(entry) = self.map.get_mut(&key) {
            entry.1 = self.tick;
            self.stats.hits += 1;
            return entry.0.clone();
        }
        self.stats.misses += 1;
        let counts = compute();
        self.stats.held += counts.len();
        self.map.insert(key, (counts.clone(), self.tick));
        if self.stats.held > self.capacity {
            self.evict();
        }
        counts
    }

    /// Drops the least recently used entries until at most half the budget is held.
    fn evict(&mut self) {
        let mut ticks: Vec<(u64, usize)> = self.map.values().map(|(c, t)| (*t, c.len())).collect();
        ticks.sort_unstable_by_key(|t| std::cmp::Reverse(t.0));
        // Keep the newest entries that fit in half the budget (always the newest one).
        let (mut kept, mut cutoff) = (0usize, u64::MAX);
        for (i, &(t, len)) in ticks.iter().enumerate() {
            if i > 0 && kept + len > self.capacity / 2 {
                break;
            }
            kept += len;
            cutoff = t;
        }
        let before = self.map.len();
        self.map.retain(|_, (_, t)| *t >= cutoff);
        self.stats.evicted += (before - self.map.len()) as u64;
        self.stats.held = kept;
    }
}
