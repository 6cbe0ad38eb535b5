//! The merges of the shards' answers into each query's result: document numbers across
//! shards, next-token counts, the ∞-gram's two rounds (longest occurring suffix, then counts
//! at that length), SBIS levels, the counting pass's pages of suffix groups, continuation
//! counts and suffix matches.

use super::check::padded_cmp;
use crate::error::{Error, Result};
use crate::index::counting::{self, SuffixFeeds, SuffixGroup};
use crate::index::levels::Level;
use crate::index::query::{
    merge_counts, sort_and_merge, Counts, Document, Located, NtdResult, Occ, TokenProb,
};
use crate::index::spans::SuffixMatch;

use super::*;

/// The number of the first document of each shard (documents are numbered across shards in
/// order).
pub(crate) fn first_docs(infos: &[ShardInfo]) -> Vec<u64> {
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
pub(crate) fn place(located: Located, s: usize, first_docs: &[u64]) -> Document {
    let mut d = located.document;
    d.s = s;
    d.doc_ix += first_docs[s];
    d.ptr = located.ptr;
    d
}

/// Each shard's occurrences and next-token counts (documents' ends under the separator).
pub(crate) fn next_counts_parts(answers: Vec<ShardAnswer>) -> Result<Vec<(u64, Counts)>> {
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
pub(crate) fn merge_ntd(
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
pub(crate) fn merge_next_counts(parts: &[(u64, Counts)], sep: u32) -> Counts {
    let mut all: Counts = parts
        .iter()
        .flat_map(|p| p.1.iter().copied())
        .filter(|&(t, _)| t != sep)
        .collect();
    sort_and_merge(&mut all);
    all
}

/// Every shard's occurrences of `prompt` and the counts of the tokens after them.
pub(crate) fn next_counts_everywhere(
    shards: &(impl Shards + ?Sized),
    prompt: &[u32],
) -> Result<Vec<(u64, Counts)>> {
    shards.check_tokens(prompt)?;
    next_counts_unchecked(shards, prompt)
}

/// [`next_counts_everywhere`] without the vocabulary check: an id outside it has no counts.
pub(crate) fn next_counts_unchecked(
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
pub(crate) fn suffix_round(
    shards: &(impl Shards + ?Sized),
    prompt: &[u32],
) -> Result<Vec<(usize, Occ)>> {
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
pub(crate) fn counts_round(
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
pub(crate) fn occurring_suffix(
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
pub(crate) fn suffix_feeds_over(
    shards: &(impl Shards + ?Sized),
    order: usize,
) -> Result<SuffixFeeds<'_>> {
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
pub(crate) fn continuation_counts_over(
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
pub(crate) fn fetch_window(
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
pub(crate) fn check_position(
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
