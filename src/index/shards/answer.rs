//! How a shard answers a question, in this process: [`answer`] for one shard, [`answer_all`]
//! for questions to several (in parallel when heavy), each question first checked against the
//! shard's figures. A shard held by another process answers through the same functions.

use super::check::check_question;
use super::wire::{LevelPoint, ShardAnswer, ShardInfo, ShardQuery};
use crate::error::{Error, Result};
use crate::index::counting::{self};
use crate::index::counts_cache::CountsCache;
use crate::index::query::{Counts, Occ};
use crate::index::Shard;

/// The answer of `shard` to `q` (in this process; a shard elsewhere does the same).
pub fn answer<S: AsRef<[u8]>>(shard: &Shard<S>, q: &ShardQuery) -> ShardAnswer {
    answer_with(shard, None, q)
}

/// [`answer`], with the counts of large occurrence sets from `cache` (this shard's number in
/// it and the cache), when given.
pub(crate) fn answer_with<S: AsRef<[u8]>>(
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
pub(crate) fn shard_level_points<S: AsRef<[u8]>>(
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
pub(crate) fn answer_all_with<S: AsRef<[u8]> + Sync>(
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
