//! Spans of a context in the corpus, as the copy guard reads them: the longest suffix of a
//! window that occurs, its occurrences when they are few (to follow token by token), and the
//! tokens that follow it when it is as long as the guard allows.
//!
//! Two implementations behind `Shards` (`index::shards`): on an index in this process
//! ([`suffix_match_local`], [`follow_local`]) a search is one narrowing per matched token in the
//! reversed suffix array ([`crate::index::Shard::suffix_occs`]) and occurrences are read from
//! the corpus; over shards held elsewhere (`shards::suffix_match_over`) it is one round trip for
//! the longest occurring suffix and, when it is full length, one for the tokens that follow it,
//! and no occurrence comes back.

use super::query::Occ;
use super::Index;

/// The longest suffix of a window that occurs in the corpus, as far as a reader needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SuffixMatch {
    /// Its length (at most the window's).
    pub len: usize,
    /// Its occurrences `(shard, start in T)` when they are at most the `track` asked for and
    /// the corpus can give them (an index in this process); empty otherwise.
    pub starts: Vec<(usize, usize)>,
    /// When it is `full` tokens long: the tokens of the vocabulary that follow it somewhere,
    /// sorted and distinct (documents' ends left out); empty otherwise.
    pub next: Vec<u32>,
}

/// `Shards::suffix_match` on an index in this process; `held`: whether an id is of the
/// vocabulary.
pub fn suffix_match_local<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    window: &[u32],
    (full, track): (usize, usize),
    held: impl Fn(u32) -> bool,
) -> SuffixMatch {
    let shards = index.shards();
    let per_shard: Vec<Vec<Occ>> = shards.iter().map(|sh| sh.suffix_occs(window)).collect();
    let len = per_shard.iter().map(|o| o.len() - 1).max().unwrap_or(0);
    let occs = || {
        shards
            .iter()
            .zip(&per_shard)
            .enumerate()
            .filter_map(move |(s, (sh, o))| Some((s, sh, *o.get(len)?)))
    };
    let mut next = Vec::new();
    if len == full {
        for (_, sh, occ) in occs() {
            let counts = sh.occ_counts_ext(occ, window, false);
            next.extend(counts.iter().map(|&(t, _)| t).filter(|&t| held(t)));
        }
        next.sort_unstable();
        next.dedup();
    }
    let mut starts = Vec::new();
    if len > 0 && occs().map(|o| o.2.len()).sum::<usize>() <= track {
        for (s, sh, occ) in occs() {
            match occ {
                Occ::Rev((a, b)) => starts.extend((a..b).map(|i| (s, sh.rstart(i, len)))),
                Occ::Fwd((a, b)) => starts.extend((a..b).map(|i| (s, sh.sa(i)))),
            }
        }
    }
    SuffixMatch { len, starts, next }
}

/// `Shards::follow` on an index in this process: the occurrences of `m` that continue with
/// `x`, read from the corpus; `held`: whether an id is of the vocabulary.
pub fn follow_local<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    m: &SuffixMatch,
    (x, full): (u32, usize),
    held: impl Fn(u32) -> bool,
) -> Option<SuffixMatch> {
    let shards = index.shards();
    let at = |s: usize, p: usize| (p < shards[s].len()).then(|| shards[s].tok(p));
    let starts: Vec<(usize, usize)> = m
        .starts
        .iter()
        .copied()
        .filter(|&(s, p)| at(s, p + m.len) == Some(x))
        .collect();
    if starts.is_empty() {
        return None;
    }
    let len = m.len + 1;
    let mut next = Vec::new();
    if len == full {
        next.extend(
            starts
                .iter()
                .filter_map(|&(s, p)| at(s, p + len))
                .filter(|&t| held(t)),
        );
        next.sort_unstable();
        next.dedup();
    }
    Some(SuffixMatch { len, starts, next })
}
