//! The wire between the merging side and a shard: the questions ([`ShardQuery`]), the
//! answers ([`ShardAnswer`]), what the merging side knows of each shard ([`ShardInfo`]), and
//! how a shard in this process answers ([`answer`], [`answer_all`]). Plain data, serde
//! serializable: a shard held by another process answers the same questions the same way.

use crate::error::{Error, Result};
use crate::index::answer_check::check_question;
use crate::index::counting::{self, SuffixGroup};
use crate::index::counts_cache::CountsCache;
use crate::index::query::{CnfPart, Counts, Located, Match, Occ};
use crate::index::{Range, Shard};
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
    /// fixed-order model's counting pass ([`counting`](crate::index::counting)).
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
