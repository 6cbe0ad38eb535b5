//! A bounded cache of next-token counts of large occurrence sets, shared by everything that
//! reads one index.
//!
//! Short contexts recur constantly in generation and scoring, and their next-token counts cost
//! one galloping pass over a large suffix-array range; small ranges are cheaper to recount than
//! to look up. Entries are keyed by shard, context length and range, so a cache serves one
//! index: every [`crate::Index`] holds one ([`crate::Index::counts_cache`]), and the models,
//! drafters and scorers on it (each generation of a server, each call of the Python module)
//! share what earlier ones counted. The cache holds at most a set number of `(token, count)`
//! pairs: past it, the least recently used entries go until half the budget is free (one sort
//! per eviction round, so the cost per lookup stays constant), which keeps a long-running
//! server's memory flat. A mutex guards the map; it is held for the lookup and the insertion,
//! never while counting.

use super::query::{Counts, Occ};
use super::Shard;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

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

/// What a lookup did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Answered from the cache.
    Hit,
    /// Counted and stored.
    Miss,
    /// Counted, too small to store.
    Uncached,
}

/// Next-token counts of large occurrence sets, least recently used out first.
pub struct CountsCache {
    inner: Mutex<Entries>,
    capacity: usize,
}

/// The map and its bookkeeping.
struct Entries {
    /// Entry and the tick of its last use.
    map: HashMap<CacheKey, (Arc<Counts>, u64), foldhash::fast::RandomState>,
    tick: u64,
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
            inner: Mutex::new(Entries {
                map: HashMap::default(),
                tick: 0,
                stats: CacheStats::default(),
            }),
            capacity,
        }
    }

    /// The map (a panic elsewhere while it was held leaves it consistent: every update is
    /// complete before the next statement can panic).
    fn entries(&self) -> MutexGuard<'_, Entries> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the cache did so far, for all its users.
    pub fn stats(&self) -> CacheStats {
        self.entries().stats
    }

    /// Next-token counts of `occ` (occurrences of `ctx` in shard `s`), or the continuation
    /// counts of [`Shard::occ_continuations`] when `continuation` is set; from the cache when
    /// the set is large.
    pub fn get<S: AsRef<[u8]>>(
        &self,
        s: usize,
        sh: &Shard<S>,
        occ: Occ,
        ctx: &[u32],
        keep_end: bool,
        continuation: bool,
    ) -> (Arc<Counts>, Lookup) {
        let compute = || {
            Arc::new(if continuation {
                sh.occ_continuations(occ, ctx, keep_end)
            } else {
                sh.occ_counts_ext(occ, ctx, keep_end)
            })
        };
        if occ.len() < CACHE_MIN {
            return (compute(), Lookup::Uncached);
        }
        let (Occ::Fwd((a, b)) | Occ::Rev((a, b))) = occ;
        let rev = matches!(occ, Occ::Rev(_));
        let key = (s, ctx.len(), rev, a, b, keep_end, continuation);
        {
            let mut e = self.entries();
            e.tick += 1;
            let tick = e.tick;
            if let Some(entry) = e.map.get_mut(&key) {
                entry.1 = tick;
                let counts = entry.0.clone();
                e.stats.hits += 1;
                return (counts, Lookup::Hit);
            }
        }
        // Counted without the lock; two users may count the same set at once (both store the
        // same counts).
        let counts = compute();
        let mut e = self.entries();
        e.stats.misses += 1;
        let tick = e.tick;
        if let Some(old) = e.map.insert(key, (counts.clone(), tick)) {
            e.stats.held -= old.0.len();
        }
        e.stats.held += counts.len();
        if e.stats.held > self.capacity {
            e.evict(self.capacity);
        }
        (counts, Lookup::Miss)
    }

    /// Forgets every entry (keys name shards by position, which [`crate::Index::merge`]
    /// changes).
    pub fn clear(&self) {
        let mut e = self.entries();
        e.map.clear();
        e.stats.held = 0;
    }
}

impl Entries {
    /// Drops the least recently used entries until at most half the budget is held.
    fn evict(&mut self, capacity: usize) {
        let mut ticks: Vec<(u64, usize)> = self.map.values().map(|(c, t)| (*t, c.len())).collect();
        ticks.sort_unstable_by_key(|t| std::cmp::Reverse(t.0));
        // Keep the newest entries that fit in half the budget (always the newest one).
        let (mut kept, mut cutoff) = (0usize, u64::MAX);
        for (i, &(t, len)) in ticks.iter().enumerate() {
            if i > 0 && kept + len > capacity / 2 {
                break;
            }
            kept += len;
            cutoff = t;
        }
        let before = self.map.len();
        self.map.retain(|_, (_, t)| *t >= cutoff);
        self.stats.evicted += (before - self.map.len()) as u64;
        self.stats.held = self.map.values().map(|(c, _)| c.len()).sum();
    }
}
