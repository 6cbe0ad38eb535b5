//! Every position's ∞-gram next-token distribution of a token sequence in one call: what a user
//! of any neural model (PyTorch, Hugging Face) needs to interpolate it with the ∞-gram, as the
//! infini-gram paper does, without this crate's decode loop. [`crate::mix::mix_rows`] and
//! [`crate::mix::mix_targets`] then mix the user's own log-probabilities with them by a mixer.
//!
//! Row `j` is the distribution of the token after `tokens[..=j]` (so row `j` scores
//! `tokens[j + 1]`, and the last row the token after the sequence). With the default
//! estimator ([`EstimatorSpec::Infgram`]) it is the paper's ∞-gram: the next-token
//! distribution of the longest suffix of the context (at most `window` tokens, cut at the last
//! document separator) that occurs with a next token, a document's end counted for the end
//! token; those rows equal the query API's `infgram_ntd` of each prefix (tested). Any other
//! estimator gives the rows [`InfgramModel`] gives `gen` and `ppl` (SBIS with more levels, the
//! smoothed estimator — dense rows —, a classic model). The rows are computed incrementally:
//! the level tracker follows a match from one position to the next without a new search.
//!
//! [`rows_over`] computes the same rows over any [`Shards`] (an index borrowed by the query
//! protocol, shards on other machines), SBIS estimators only, one level search a position:
//! it serves the `infgram_rows` query of the CLI, the server and Python's `query`.

use super::{Estimator, EstimatorSpec, Evidence, InfgramModel};
use crate::error::{Error, Result};

use crate::index::shards::{self, Shards};
use crate::index::Index;
use crate::lm::{LanguageModel, Logits};
use std::sync::Arc;

/// How [`infgram_rows`] computes its rows.
#[derive(Clone, Debug, PartialEq)]
pub struct RowsOptions {
    /// The estimator (default: the paper's ∞-gram).
    pub estimator: EstimatorSpec,
    /// Context tokens looked at (the last `window` of each prefix).
    pub window: usize,
    /// A neural model's end-of-text id: a document's end is reported as it, and read back from
    /// it in `tokens`. Without it, the index's separator id.
    pub end_token: Option<u32>,
    /// The ids a row may hold (a neural model's vocabulary size): corpus tokens at or beyond
    /// it are left out. Default: the index's vocabulary (and the end token).
    pub vocab: Option<usize>,
}

/// Context tokens a row looks at unless told: the infini-gram paper's ∞-gram has no limit; a
/// bound keeps the suffix search's cost bounded.
pub const ROWS_WINDOW: usize = 500;

impl Default for RowsOptions {
    fn default() -> Self {
        RowsOptions {
            estimator: EstimatorSpec::Infgram,
            window: ROWS_WINDOW,
            end_token: None,
            vocab: None,
        }
    }
}

/// The rows of a sequence, flattened: row `j` is `ids[offsets[j]..offsets[j + 1]]` with
/// `logprobs` (natural log) alongside, sorted by id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    /// The estimator the rows come from (a mixer checks it is its own).
    pub estimator: EstimatorSpec,
    /// The ids a row may hold.
    pub vocab: usize,
    /// `tokens.len() + 1` offsets into `ids` / `logprobs`.
    pub offsets: Vec<u64>,
    /// Token ids with p > 0, row after row.
    pub ids: Vec<u32>,
    /// Their ln p.
    pub logprobs: Vec<f32>,
    /// Per row: the length of the longest suffix with a next token (0: none; the unigram).
    pub suffix_len: Vec<u32>,
    /// Per row: that suffix's occurrences followed by a token (or by a document's end).
    pub count: Vec<u64>,
    /// Per row: the distinct tokens that follow it in the index, a document's end counted as one
    /// (1: the paper's "sparse").
    pub distinct: Vec<u32>,
}

impl Rows {
    /// The number of rows.
    pub fn len(&self) -> usize {
        self.suffix_len.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.suffix_len.is_empty()
    }

    /// Row `j`: its ids and their ln p.
    pub fn row(&self, j: usize) -> (&[u32], &[f32]) {
        let (a, b) = (self.offsets[j] as usize, self.offsets[j + 1] as usize);
        (&self.ids[a..b], &self.logprobs[a..b])
    }

    /// What the ∞-gram knew at row `j` (what a mixer's λ depends on).
    pub fn evidence(&self, j: usize) -> Evidence {
        Evidence {
            suffix_len: self.suffix_len[j] as usize,
            count: self.count[j],
            distinct: self.distinct[j] as usize,
        }
    }

    /// ln p of `id` in row `j` (−∞ when the row does not hold it).
    pub fn logprob(&self, j: usize, id: u32) -> f32 {
        let (ids, lps) = self.row(j);
        ids.binary_search(&id).map_or(f32::NEG_INFINITY, |i| lps[i])
    }
}

/// Refuses a window of no tokens.
fn check_window(window: usize) -> Result<()> {
    if window == 0 {
        return Err(Error::Field {
            field: "window",
            message: "is the number of context tokens a row looks at: at least 1".into(),
        });
    }
    Ok(())
}

/// The rows of `tokens` over `index` (see the module's documentation).
pub fn infgram_rows<S: AsRef<[u8]> + Send + Sync + 'static>(
    index: Arc<Index<S>>,
    tokens: &[u32],
    options: &RowsOptions,
) -> Result<Rows> {
    check_window(options.window)?;
    let mut model = InfgramModel::new(index, options.estimator.estimator()?, options.window)?;
    if options.end_token.is_some() || options.vocab.is_some() {
        let end = options.end_token.unwrap_or(model.eos_tokens()[0]);
        let vocab = options
            .vocab
            .unwrap_or_else(|| model.vocab_size().max(end as usize + 1));
        model = model.with_vocab(vocab, end)?;
    }
    let mut rows = Rows {
        estimator: options.estimator.clone(),
        vocab: model.vocab_size(),
        offsets: vec![0],
        ..Rows::default()
    };
    // A bounded number of rows at a time: the rows of a long text are not all held at once.
    for chunk in tokens.chunks(4096) {
        let scored = model.score(chunk)?;
        for (row, evidence) in scored.iter().zip(model.last_evidence()) {
            push_row(&mut rows, row, evidence);
        }
        model.recycle(scored);
    }
    Ok(rows)
}

/// Appends a row, its entries sorted by id; an end token that is also a token of the text (so
/// in the row twice: as itself and for a document's end) gets their summed probability.
fn push_row(rows: &mut Rows, row: &Logits, evidence: &Evidence) {
    let first = rows.ids.len();
    let mut push = |id: u32, l: f32| {
        if rows.ids.len() > first && rows.ids.last() == Some(&id) {
            let last = rows.logprobs.last_mut().expect("a logprob per id");
            *last = ((*last as f64).exp() + (l as f64).exp()).ln() as f32;
        } else {
            rows.ids.push(id);
            rows.logprobs.push(l);
        }
    };
    match row {
        Logits::Sparse { entries, .. } => entries.iter().for_each(|&(id, l)| push(id, l)),
        Logits::Dense(v) => v
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .for_each(|(id, &l)| push(id as u32, l)),
    }
    rows.offsets.push(rows.ids.len() as u64);
    rows.suffix_len.push(evidence.suffix_len as u32);
    rows.count.push(evidence.count);
    rows.distinct.push(evidence.distinct as u32);
}

/// The rows of `tokens` over any [`Shards`], as [`infgram_rows`] computes them over an index of
/// the same documents (tested), for the SBIS estimators (`infgram`, `sbis`): each position's
/// levels searched afresh ([`shards::levels_over`]), the unigram when nothing matches.
pub fn rows_over(
    shards: &(impl Shards + ?Sized),
    tokens: &[u32],
    options: &RowsOptions,
) -> Result<Rows> {
    check_window(options.window)?;
    let Estimator::Sbis { k, decay } = options.estimator.estimator()? else {
        return Err(Error::Field {
            field: "estimator",
            message: "the infgram_rows query runs the SBIS estimators (infgram, sbis); the \
                      smoothed and fixed-order rows come from Python's Index.infgram_rows or \
                      the library's ngram::batch::infgram_rows"
                .into(),
        });
    };
    if shards.infos().iter().all(|i| i.tokens == i.documents) {
        return Err(Error::input(
            "the index is empty: index a corpus with some text first",
        ));
    }
    let separator = shards.separator();
    let end = options.end_token.unwrap_or(separator);
    let vocab = options.vocab.unwrap_or_else(|| {
        shards
            .vocab_size()
            .max(separator as usize + 1)
            .max(end as usize + 1)
    });
    if end as usize >= vocab {
        return Err(Error::input(format!(
            "end token {end} is outside the vocabulary of {vocab} ids"
        )));
    }
    let estimator = Estimator::Sbis { k, decay };
    let mut rows = Rows {
        estimator: options.estimator.clone(),
        vocab,
        offsets: vec![0],
        ..Rows::default()
    };
    let mut doc_start = 0;
    let mut ctx: Vec<u32> = Vec::new();
    let mut dist = Vec::new();
    let mut entries: Vec<(u32, f32)> = Vec::new();
    for (j, &t) in tokens.iter().enumerate() {
        if t == end {
            doc_start = j + 1;
        }
        let from = doc_start.max((j + 1).saturating_sub(options.window));
        ctx.clear();
        ctx.extend_from_slice(&tokens[from..=j]);
        let mut levels = shards::levels_over(shards, &ctx, k, false, &|_| true)?;
        if levels.is_empty() {
            levels = shards::levels_over(shards, &[], 1, true, &|_| true)?;
        }
        estimator.distribution_into(&levels, vocab, &mut dist);
        entries.clear();
        entries.extend(dist.iter().filter(|e| e.1 > 0.0).filter_map(|&(id, p)| {
            let id = if id == separator { end } else { id };
            ((id as usize) < vocab).then_some((id, p.ln() as f32))
        }));
        entries.sort_by_key(|e| e.0);
        push_row(
            &mut rows,
            &Logits::Sparse {
                vocab,
                entries: std::mem::take(&mut entries),
            },
            &Evidence::of(&levels),
        );
    }
    Ok(rows)
}
