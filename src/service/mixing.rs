//! Mixing the ∞-gram with a neural model, from options: the mixer file, the mixture as a
//! scorer for generation, interpolated perplexity and fitting λ.

use crate::error::{Error, Result};
use crate::eval::mixture::{fitting_data, infgram_positions, neural_probs, overlap, MixReport};
use crate::index::Index;
use crate::lm::LanguageModel;
use crate::mix::{Interpolated, MixEstimator, Mixer};
use crate::tokenizer::{check_fingerprint, Tokenizer};
use memmap2::Mmap;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Tokens of context the ∞-gram looks at when mixing.
pub const MIX_CONTEXT: usize = 100;

/// The n of the decontamination check (13-grams, as the infini-gram paper).
pub const OVERLAP_N: usize = 13;

/// Above this overlap, a scored text is mostly in the index: a warning is due.
pub const OVERLAP_WARN: f64 = 0.2;

/// The mixer of `path`, or the default one (fitted on Tiny Shakespeare).
pub fn load_mixer(path: Option<&Path>) -> Result<Mixer> {
    match path {
        Some(p) => Mixer::load(p),
        None => Ok(Mixer::default()),
    }
}

/// Opens an index for mixing with a model whose tokenizer is `tok` (refused otherwise).
pub fn open_mixing_index(dir: &Path, tok: &dyn Tokenizer) -> Result<Arc<Index<Mmap>>> {
    let index = Arc::new(Index::open(dir)?);
    check_mixing_index(&index, tok)?;
    Ok(index)
}

/// Refuses an index for mixing unless it was built with the model's tokenizer `tok`.
pub fn check_mixing_index<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    tok: &dyn Tokenizer,
) -> Result<()> {
    check_fingerprint(&index.header().tokenizer, tok).map_err(|e| {
        Error::input(format!(
            "{e}; mixing needs an index built with the model's tokenizer \
             (`infgram index --tokenizer MODEL -o DIR FILES`)"
        ))
    })
}

/// The mixture of `neural` and the ∞-gram of `index` as one scorer.
pub fn mixture_model<N: LanguageModel>(
    neural: N,
    index: Arc<Index<Mmap>>,
    mixer: Mixer,
) -> Result<Interpolated<Mmap, N>> {
    Interpolated::new(neural, index, mixer, MIX_CONTEXT)
}

/// Interpolated perplexity of a text, with how long each part took and the overlap.
#[derive(Clone, Debug, Serialize)]
pub struct ScoredMixture {
    /// Perplexities and the analysis by effective n.
    #[serde(flatten)]
    pub report: MixReport,
    /// Share of the text's 13-token windows found in the index.
    pub overlap: f64,
    /// Seconds in all.
    pub seconds: f64,
    /// … of which the neural model.
    pub neural_seconds: f64,
    /// … and the ∞-gram.
    pub infgram_seconds: f64,
    /// The mixer in use.
    pub mixer: Mixer,
}

/// What one pass of both models over a text gives: the ∞-gram's and the neural model's view
/// of every position.
pub struct Scoring {
    infgram: Vec<crate::eval::mixture::InfgramPosition>,
    neural: Vec<f64>,
    neural_seconds: f64,
    infgram_seconds: f64,
    overlap: f64,
}

/// Scores `tokens` with `neural` (windows of `window` moved by `stride`) and with the ∞-gram
/// of `index` (`estimator`).
pub fn score_both<S: AsRef<[u8]> + Sync>(
    neural: &mut dyn LanguageModel,
    index: &Index<S>,
    tokens: &[u32],
    estimator: MixEstimator,
    window: usize,
    stride: usize,
) -> Result<Scoring> {
    let t = Instant::now();
    let infgram = infgram_positions(index, tokens, estimator, MIX_CONTEXT);
    let overlap = overlap(index, tokens, OVERLAP_N);
    let infgram_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let neural_p = neural_probs(neural, tokens, window, stride)?;
    Ok(Scoring {
        infgram,
        neural: neural_p,
        neural_seconds: t.elapsed().as_secs_f64(),
        infgram_seconds,
        overlap,
    })
}

impl Scoring {
    /// The mixture's perplexity report under `mixer`.
    pub fn report(&self, mixer: &Mixer) -> ScoredMixture {
        ScoredMixture {
            report: MixReport::new(&self.infgram, &self.neural, mixer),
            overlap: self.overlap,
            seconds: self.neural_seconds + self.infgram_seconds,
            neural_seconds: self.neural_seconds,
            infgram_seconds: self.infgram_seconds,
            mixer: mixer.clone(),
        }
    }

    /// λ fitted on these positions (a table over `edges`; empty: the paper's two weights).
    pub fn fit(&self, estimator: MixEstimator, edges: &[usize]) -> Mixer {
        Mixer::fit(estimator, edges, &fitting_data(&self.infgram, &self.neural))
    }
}
