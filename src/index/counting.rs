//! What the fixed-order and Kneser–Ney readers count over a corpus, wherever its shards are:
//! a context's next-token counts, its Kneser–Ney continuation counts, and the counting pass's
//! walk over every suffix grouped by its first tokens.
//!
//! Documents never span shards and no n-gram crosses a document's end, so these merge
//! exactly. Counts add over shards; continuation counts do not (a token seen before `h·x` in
//! two shards is one distinct token), so each shard gives its distinct (next, previous) pairs
//! and the union is counted; the counting pass's groups come from each shard sorted by their
//! first tokens and are merged in that order, as the suffixes of one index of all the
//! documents would come. [`Index`] answers each with its fast paths (the reversed suffix
//! array for continuations, the pass on several threads); shards held elsewhere answer
//! [`ShardQuery::ContinuationPairs`] and [`ShardQuery::SuffixGroups`] (the whole pass: every
//! distinct n-gram of the shard and the tokens before it, so an answer as large as the shard).
//!
//! [`Index`]: super::Index
//! [`ShardQuery::ContinuationPairs`]: super::shards::ShardQuery::ContinuationPairs
//! [`ShardQuery::SuffixGroups`]: super::shards::ShardQuery::SuffixGroups

use super::query::{tally_sorted, Counts, Occ};
use super::{Index, Shard};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Suffixes of a shard with the same first tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuffixGroup {
    /// Their first tokens: the order asked for, fewer where a document ends first.
    pub key: Vec<u32>,
    /// The tokens just before them (the separator at a document's start), sorted, each with
    /// how many of the suffixes it precedes.
    pub lefts: Vec<(u32, u64)>,
}

/// One slice of a corpus's suffixes, fed in order as `(key, token before, suffixes)`: the
/// key is the first tokens padded with the separator to the feeds' width. No group of
/// suffixes that share their first token spans two slices.
pub type SuffixFeed<'a> =
    Box<dyn FnOnce(&mut dyn FnMut(&[u32], u32, u64)) -> Result<()> + Send + 'a>;

/// A corpus's suffixes as slices to count on several threads (what the corpus trait's
/// `suffix_feeds` gives).
pub struct SuffixFeeds<'a> {
    /// The keys' width: the order asked for, or one more than the longest document when that
    /// is less (no n-gram is longer than a document).
    pub width: usize,
    /// The slices, in suffix order.
    pub feeds: Vec<SuffixFeed<'a>>,
}

/// The first `key.len()` tokens at position `p` (the separator from the first separator or
/// the end on) and the token before it (the separator at a document's start).
fn key_at<S: AsRef<[u8]>>(shard: &Shard<S>, p: usize, key: &mut [u32]) -> u32 {
    let sep = shard.separator();
    key.fill(sep);
    for (k, slot) in key.iter_mut().enumerate() {
        let t = if p + k < shard.len() {
            shard.tok(p + k)
        } else {
            sep
        };
        if t == sep {
            break;
        }
        *slot = t;
    }
    if p == 0 {
        sep
    } else {
        shard.tok(p - 1)
    }
}

/// Feeds the suffixes at suffix-array positions `range` of one shard.
fn feed_range<S: AsRef<[u8]>>(
    s: &Shard<S>,
    range: std::ops::Range<usize>,
    width: usize,
    f: &mut dyn FnMut(&[u32], u32, u64),
) {
    let mut key = vec![0u32; width];
    for i in range {
        let left = key_at(s, s.sa(i), &mut key);
        f(&key, left, 1);
    }
}

/// Feeds the suffixes of several shards merged by key (a k-way merge of their suffix arrays).
fn feed_merged<S: AsRef<[u8]>>(
    shards: &[Shard<S>],
    width: usize,
    f: &mut dyn FnMut(&[u32], u32, u64),
) {
    // The head of each shard: its next suffix's position in SA, key and token before.
    let head = |j: usize, i: usize| {
        let s = &shards[j];
        (i < s.len()).then(|| {
            let mut key = vec![0u32; width];
            let left = key_at(s, s.sa(i), &mut key);
            (i, key, left)
        })
    };
    let mut heads: Vec<_> = (0..shards.len()).map(|j| head(j, 0)).collect();
    while let Some(j) = heads
        .iter()
        .enumerate()
        .filter_map(|(j, h)| h.as_ref().map(|(_, key, _)| (j, key)))
        .min_by(|a, b| a.1.cmp(b.1))
        .map(|(j, _)| j)
    {
        let (i, key, left) = heads[j].take().expect("a head");
        f(&key, left, 1);
        heads[j] = head(j, i + 1);
    }
}

/// The corpus trait's `suffix_feeds` over an index in this process: one shard on as many
/// threads as rayon has, cut where the first token changes; several shards merged in one
/// slice. An index that sorts suffixes by bytes (infini-gram's) is refused: its suffix order
/// is not the keys'.
pub(crate) fn index_suffix_feeds<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    order: usize,
) -> Result<SuffixFeeds<'_>> {
    if index.shards().iter().any(|s| s.byte_ordered()) {
        return Err(Error::input(
            "classic n-gram models need an index built by infgram (this one sorts its \
             suffixes by bytes, as infini-gram's u16 indexes do): rebuild it with `infgram index`",
        ));
    }
    let width = order.min(index.longest_document() + 1);
    let parts = rayon::current_num_threads();
    let feeds: Vec<SuffixFeed<'_>> = match index.shards() {
        [s] => {
            let first_token = |i: usize| s.tok(s.sa(i));
            let mut cuts: Vec<usize> = (0..=parts).map(|k| k * s.len() / parts).collect();
            for c in cuts.iter_mut().take(parts).skip(1) {
                while *c > 0 && *c < s.len() && first_token(*c) == first_token(*c - 1) {
                    *c += 1;
                }
            }
            cuts.windows(2)
                .map(|w| {
                    let range = w[0]..w[1].max(w[0]);
                    Box::new(move |f: &mut dyn FnMut(&[u32], u32, u64)| {
                        feed_range(s, range, width, f);
                        Ok(())
                    }) as SuffixFeed<'_>
                })
                .collect()
        }
        shards => vec![Box::new(move |f: &mut dyn FnMut(&[u32], u32, u64)| {
            feed_merged(shards, width, f);
            Ok(())
        })],
    };
    Ok(SuffixFeeds { width, feeds })
}

/// Suffixes a page of a shard's [`ShardQuery::SuffixGroups`] answer covers at least (one
/// group more may end it): what bounds the memory of a counting pass over shards held
/// elsewhere, a page per shard at a time.
///
/// [`ShardQuery::SuffixGroups`]: super::shards::ShardQuery::SuffixGroups
pub const SUFFIX_PAGE: usize = 1 << 16;

/// One page of a shard's suffixes grouped by their first `order` tokens (cut before the
/// separator), in the order of those padded with the separator: the groups of the suffixes
/// from suffix-array rank `from` on, at least `max_suffixes` of them (whole groups), and the
/// rank where the next page starts (`None`: the last). A shard whose suffix order is not the
/// padded keys' order (infini-gram's layout, sorted by bytes or ending without a separator)
/// gives all its groups in one page.
pub(crate) fn shard_suffix_groups<S: AsRef<[u8]>>(
    shard: &Shard<S>,
    order: usize,
    from: usize,
    max_suffixes: usize,
) -> (Vec<SuffixGroup>, Option<usize>) {
    let sep = shard.separator();
    let in_key_order = shard.layout() == super::Layout::Infgram;
    let (from, stop) = match in_key_order {
        true => (from.min(shard.len()), max_suffixes.max(1)),
        false => (0, usize::MAX),
    };
    let mut groups: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
    let mut key = vec![0u32; order];
    let mut i = from;
    while i < shard.len() {
        let left = key_at(shard, shard.sa(i), &mut key);
        match groups.last_mut() {
            Some((k, lefts)) if *k == key => lefts.push(left),
            _ if i - from >= stop => break,
            _ => groups.push((key.clone(), vec![left])),
        }
        i += 1;
    }
    let next = (i < shard.len()).then_some(i);
    // Outside infgram's layout, suffix order is not the padded keys' order: sort, and join
    // the groups a key's suffixes fell into.
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let mut groups = groups.into_iter().peekable();
    let mut out = Vec::new();
    while let Some((mut k, mut lefts)) = groups.next() {
        while let Some((_, more)) = groups.next_if(|(k2, _)| *k2 == k) {
            lefts.extend(more);
        }
        lefts.sort_unstable();
        k.truncate(k.iter().position(|&t| t == sep).unwrap_or(k.len()));
        out.push(SuffixGroup {
            key: k,
            lefts: tally_sorted(lefts),
        });
    }
    (out, next)
}

/// Continuation counts from (next, previous) pairs of every shard: their union, tallied by
/// next token.
pub(crate) fn tally_union(mut pairs: Vec<(u32, u32)>) -> Counts {
    pairs.sort_unstable();
    pairs.dedup();
    tally_sorted(pairs.into_iter().map(|(x, _)| x))
}

/// The continuation counts of `q` from its occurrences `parts` in each of several shards: the
/// union of their (next, previous) pairs (an index in this process, shards in one place).
pub(crate) fn continuations_of<'s, S: AsRef<[u8]> + 's>(
    parts: impl IntoIterator<Item = (&'s Shard<S>, Occ)>,
    q: &[u32],
    keep_end: bool,
) -> Counts {
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    for (s, occ) in parts {
        pairs.extend(s.continuation_pairs(occ, q, keep_end));
    }
    tally_union(pairs)
}

/// A shard's answer to a `ContinuationPairs` question.
pub(crate) fn shard_continuation_pairs<S: AsRef<[u8]>>(
    shard: &Shard<S>,
    q: &[u32],
    keep_end: bool,
) -> Vec<(u32, u32)> {
    shard.continuation_pairs(Occ::Fwd(shard.find(q)), q, keep_end)
}

/// For each token `x` after an occurrence of `h`: the number of distinct tokens found just
/// before `h·x` over all shards (a document's start counts as one; with `keep_end`, `x` may
/// be the separator, for an occurrence at a document's end).
///
/// Two ways, the cheaper chosen per context: scan every occurrence of `h` and collect the
/// distinct (next, previous) pairs, or — one shard with its reversed suffix array, documents'
/// ends left out — count, for each distinct next token `x`, the runs of previous tokens in
/// the reversed range of `h·x` ([`Shard::distinct_left`]). A context seen millions of times
/// (`}` in code) is followed by far fewer distinct tokens, so the second is what makes large
/// corpora fast.
pub(crate) fn index_continuation_counts<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    h: &[u32],
    keep_end: bool,
) -> Counts {
    let d = h.len();
    if let [s] = index.shards() {
        let r = s.find(h);
        let occurrences = r.1 - r.0;
        let next = s.occ_counts(Occ::Fwd(r), h);
        // A reversed search costs (|h| + 1) binary searches of ~log2(T) probes, and the runs.
        let probes = (d + 2) * (usize::BITS - s.len().leading_zeros()) as usize;
        if !keep_end && s.has_reverse() && next.len() * probes < occurrences {
            return continuation_by_reverse(s, h, next);
        }
    }
    continuation_by_scan(index.shards(), h, keep_end)
}

/// [`index_continuation_counts`] on one shard through its reversed suffix array, for the next
/// tokens `next` of `h`.
fn continuation_by_reverse<S: AsRef<[u8]>>(s: &Shard<S>, h: &[u32], next: Counts) -> Counts {
    let mut hx = h.to_vec();
    hx.push(0);
    next.into_iter()
        .map(|(x, _)| {
            hx[h.len()] = x;
            (x, s.distinct_left(&hx).expect("a reversed suffix array"))
        })
        .collect()
}

/// [`index_continuation_counts`] by scanning every occurrence of `h` in every shard: the
/// union of the shards' (next, previous) pairs.
pub(crate) fn continuation_by_scan<S: AsRef<[u8]>>(
    shards: &[Shard<S>],
    h: &[u32],
    keep_end: bool,
) -> Counts {
    continuations_of(shards.iter().map(|s| (s, Occ::Fwd(s.find(h)))), h, keep_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::TokenizerSpec;
    use proptest::prelude::*;

    proptest! {
        /// The reversed-suffix-array way of counting continuations equals the scan, documents'
        /// starts (the text's first one among them) included.
        #[test]
        fn continuations_by_reverse_equal_the_scan(
            docs in prop::collection::vec(prop::collection::vec(0u32..4, 1..12), 1..8),
            h in prop::collection::vec(0u32..4, 0..3),
        ) {
            let index = Index::from_docs(TokenizerSpec::synthetic(4), &docs, docs.len(), true)
                .unwrap();
            let s = &index.shards()[0];
            let next = s.occ_counts(Occ::Fwd(s.find(&h)), &h);
            prop_assert_eq!(
                continuation_by_reverse(s, &h, next),
                continuation_by_scan(index.shards(), &h, false)
            );
        }
    }
}
