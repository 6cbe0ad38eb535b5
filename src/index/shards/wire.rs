//! The wire between the merging side and a shard: the questions ([`ShardQuery`]), the
//! answers ([`ShardAnswer`]) and what the merging side knows of each shard ([`ShardInfo`]).
//! Plain data, serde serializable: a shard held by another process answers the same questions
//! the same way (`answer`).

use crate::index::counting::SuffixGroup;
use crate::index::query::{CnfPart, Counts, Located, Match, Occ};
use crate::index::Range;
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
    pub(super) fn is_heavy(&self) -> bool {
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
