//! Where a text copies its corpus from: the maximal spans that occur in the corpus with their
//! counts and documents (attribution, as OLMoTrace shows them), and how much of the text is
//! *not* covered by long corpus spans (L-uniqueness and the Creativity Index of Lu et al.,
//! ICLR 2025). Both come from one left-to-right pass, [`Shards::longest_match`]: for each
//! position `j`, the longest span ending at `j` that occurs.
//!
//! A span ending at `j` is maximal (no occurring span contains it) exactly when the span at
//! `j + 1` is not one token longer, so the maximal spans are read off the match lengths
//! directly; a span `[i, j]` occurs only if every span inside it does, so a token is covered
//! by an occurring span of at least `n` tokens exactly when some maximal span of at least `n`
//! tokens contains it.
//!
//! Units are the index's tokens: bytes for a byte index, model tokens for an index built with
//! a model's tokenizer. Lu et al. count words; over a model-token index, `n` tokens are about
//! `0.75 n` words. Ids the index does not hold (past its vocabulary, its separator) are never covered.

use crate::error::{Error, Result};
use crate::index::query::{Document, Match};
use crate::index::shards::Shards;
use serde::Serialize;

/// A maximal span of the text that occurs in the corpus.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Span {
    /// First token of the span in the text.
    pub l: usize,
    /// One past its last token.
    pub r: usize,
    /// `r − l`.
    pub length: usize,
    /// Occurrences in the corpus.
    pub count: u64,
    /// Up to the asked number of documents it occurs in (distinct documents, in suffix-array
    /// order), each a window around the occurrence.
    pub docs: Vec<Document>,
    /// True when documents of this span were left out because the answer had shown
    /// [`ATTRIBUTION_TOKEN_BUDGET`] tokens of documents already.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub docs_cut: bool,
}

/// Tokens of documents one attribution shows at most, over all its spans (each document's
/// window counts its length): what bounds an answer's size and memory whatever the text, the
/// documents per span and the window length asked for. About 2.5 MB of JSON.
pub const ATTRIBUTION_TOKEN_BUDGET: usize = 1 << 18;

/// The match length of every position of `tokens`: like [`Shards::longest_match`], but ids
/// the index does not hold end spans instead of failing the query (an error: shards held
/// elsewhere that did not answer).
pub fn match_lengths(index: &(impl Shards + ?Sized), tokens: &[u32]) -> Result<Vec<Match>> {
    let mut out = Vec::with_capacity(tokens.len());
    for segment in tokens.split_inclusive(|&t| !index.holds_token(t)) {
        let (held, barrier) = match segment.split_last() {
            Some((&last, head)) if !index.holds_token(last) => (head, true),
            _ => (segment, false),
        };
        out.extend(index.longest_match(held)?);
        if barrier {
            out.push(Match { len: 0, count: 0 });
        }
    }
    Ok(out)
}

/// The longest span of `tokens` that occurs in the corpus (0 when none does).
pub fn max_copied_span(index: &(impl Shards + ?Sized), tokens: &[u32]) -> Result<usize> {
    let matches = match_lengths(index, tokens)?;
    Ok(matches.iter().map(|m| m.len).max().unwrap_or(0))
}

/// The maximal spans of `matches` (from [`match_lengths`]) at least `min_len` long, as
/// `(l, r, count)`, left to right.
fn maximal_spans(matches: &[Match], min_len: usize) -> Vec<(usize, usize, u64)> {
    let min_len = min_len.max(1);
    (0..matches.len())
        .filter(|&j| matches[j].len >= min_len)
        .filter(|&j| matches.get(j + 1).is_none_or(|n| n.len <= matches[j].len))
        .map(|j| (j + 1 - matches[j].len, j + 1, matches[j].count))
        .collect()
}

/// Attribution of `tokens`: every maximal span of at least `min_len` tokens that occurs in the
/// corpus, with its count and up to `max_docs` documents (windows of `max_disp_len` tokens
/// around an occurrence).
pub fn attribute(
    index: &(impl Shards + ?Sized),
    tokens: &[u32],
    min_len: usize,
    max_docs: usize,
    max_disp_len: usize,
) -> Result<Vec<Span>> {
    if min_len == 0 {
        return Err(Error::input(
            "the shortest span to attribute must be at least 1 token (--min-len)",
        ));
    }
    let matches = match_lengths(index, tokens)?;
    let mut budget = ATTRIBUTION_TOKEN_BUDGET;
    maximal_spans(&matches, min_len)
        .into_iter()
        .map(|(l, r, count)| {
            let span = &tokens[l..r];
            let (docs, docs_cut) = documents(index, span, max_docs, max_disp_len, &mut budget)?;
            Ok(Span {
                l,
                r,
                length: r - l,
                count,
                docs,
                docs_cut,
            })
        })
        .collect()
}

/// Up to `max_docs` distinct documents that contain `span`, shard by shard in suffix-array
/// order (through the index's per-shard path), their windows' tokens taken from `budget`; and
/// whether the budget cut them short.
fn documents(
    index: &(impl Shards + ?Sized),
    span: &[u32],
    max_docs: usize,
    max_disp_len: usize,
    budget: &mut usize,
) -> Result<(Vec<Document>, bool)> {
    // A window shows the span and up to `max_disp_len` tokens around it. (The span is a
    // maximal span of the text, so it occurs: with no budget left its documents are cut.)
    if *budget <= span.len() {
        return Ok((Vec::new(), max_docs > 0));
    }
    let around = max_disp_len.min(*budget - span.len());
    let found = index.span_documents(span, max_docs, around)?;
    let mut docs = Vec::with_capacity(found.len());
    for d in found {
        let cost = d.disp_len.max(1);
        if cost > *budget {
            return Ok((docs, true));
        }
        *budget -= cost;
        docs.push(d);
    }
    Ok((docs, false))
}

/// How much of a text its corpus does not cover, per span length.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Creativity {
    /// Tokens of the text.
    pub tokens: usize,
    /// `(n, uniqueness)`: the share of tokens not covered by any span of at least `n` tokens
    /// that occurs in the corpus, for `n = min_n ..= max_n`.
    pub uniqueness: Vec<(usize, f64)>,
    /// The Creativity Index: the sum of the uniqueness over `n` (Lu et al. sum `n = 5..=12`).
    pub creativity_index: f64,
    /// For each position `i`, one past the end of the longest span starting at `i` that
    /// occurs (`rs` of infini-gram's `creativity`; `i` when none does).
    pub rs: Vec<usize>,
    /// The longest span that occurs.
    pub max_span: usize,
}

/// The longest span length [`creativity`] scores: one row of the answer per length, so the
/// bound keeps a request's work and answer small.
pub const MAX_CREATIVITY_N: usize = 1000;

/// L-uniqueness of `tokens` for `n = min_n ..= max_n` and the Creativity Index.
pub fn creativity(
    index: &(impl Shards + ?Sized),
    tokens: &[u32],
    min_n: usize,
    max_n: usize,
) -> Result<Creativity> {
    if min_n == 0 || min_n > max_n || max_n > MAX_CREATIVITY_N {
        return Err(Error::input(format!(
            "need 1 ≤ min n ≤ max n ≤ {MAX_CREATIVITY_N} (got {min_n} and {max_n}): \
             e.g. --min-n 5 --max-n 12"
        )));
    }
    let matches = match_lengths(index, tokens)?;
    let spans = maximal_spans(&matches, 1);
    let total = tokens.len();
    let uniqueness: Vec<(usize, f64)> = (min_n..=max_n)
        .map(|n| {
            let covered = covered_tokens(&spans, n);
            let unique = if total == 0 {
                1.0
            } else {
                1.0 - covered as f64 / total as f64
            };
            (n, unique)
        })
        .collect();
    Ok(Creativity {
        tokens: total,
        creativity_index: uniqueness.iter().map(|u| u.1).sum(),
        uniqueness,
        rs: span_ends(&matches),
        max_span: matches.iter().map(|m| m.len).max().unwrap_or(0),
    })
}

/// Tokens inside some maximal span of at least `n` tokens (the spans start and end in
/// increasing order, so their union is counted in one pass).
fn covered_tokens(spans: &[(usize, usize, u64)], n: usize) -> usize {
    let mut covered = 0;
    let mut reach = 0; // end of the union so far
    for &(l, r, _) in spans.iter().filter(|s| s.1 - s.0 >= n) {
        covered += r - l.max(reach).min(r);
        reach = reach.max(r);
    }
    covered
}

/// For each start `i`, the end of the longest occurring span starting there: the end of the
/// last span (ending at `j`, starting at `j − len + 1`) that starts at or before `i`. Starts
/// never decrease with `j`, so one forward pass suffices.
fn span_ends(matches: &[Match]) -> Vec<usize> {
    let mut rs = Vec::with_capacity(matches.len());
    let mut j = 0;
    for i in 0..matches.len() {
        j = j.max(i);
        while j < matches.len() && j + 1 - matches[j].len <= i && matches[j].len > 0 {
            j += 1;
        }
        rs.push(j.max(i));
    }
    rs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(lens: &[usize]) -> Vec<Match> {
        lens.iter().map(|&len| Match { len, count: 1 }).collect()
    }

    #[test]
    fn maximal_spans_and_coverage() {
        // Spans: [0,3) then [2,5) then [6,7).
        let matches = m(&[1, 2, 3, 2, 3, 0, 1]);
        let spans = maximal_spans(&matches, 1);
        assert_eq!(
            spans.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
            vec![(0, 3), (2, 5), (6, 7)]
        );
        assert_eq!(covered_tokens(&spans, 1), 6);
        assert_eq!(covered_tokens(&spans, 3), 5);
        assert_eq!(covered_tokens(&spans, 4), 0);
        assert_eq!(span_ends(&matches), vec![3, 3, 5, 5, 5, 5, 7]);
    }
}
