//! Generation and scoring with the ∞-gram alone.
//!
//! * [`levels`]: the SBIS levels of a context (distinct suffix counts, longest first).
//! * [`sbis`]: the selective backoff interpolation distribution.
//! * [`smoothed`]: interpolated absolute discounting across all levels (finite perplexity).
//! * [`sampler`]: temperature / top-k / top-p sampling with a seeded RNG.
//! * [`model`]: the ∞-gram as a language model of the decode loop ([`generate`] runs it).
//! * [`eval`]: perplexity and the paper's token-wise agreement analysis.

pub mod eval;
pub mod levels;
pub mod model;
pub mod sampler;
pub mod sbis;
pub mod smoothed;

use crate::decode::{decode, DecodeConfig};
use crate::error::{Error, Result};
use crate::index::Index;
use levels::{Level, LevelFinder};
use model::InfgramModel;
use sampler::Sampler;
use smoothed::Discounts;

/// Which next-token estimator to use.
#[derive(Clone, Debug)]
pub enum Estimator {
    /// SBIS with `k` levels (−1 = all) and the given decay.
    Sbis {
        /// Levels to keep (−1: all).
        k: i64,
        /// Weight ratio between consecutive levels.
        decay: f64,
    },
    /// Interpolated absolute discounting down to uniform.
    Smoothed(Discounts),
}

impl Estimator {
    /// The levels this estimator needs for a context.
    pub fn levels<S: AsRef<[u8]> + Sync>(
        &self,
        finder: &mut LevelFinder<'_, S>,
        ctx: &[u32],
    ) -> Vec<Level> {
        match self {
            Estimator::Sbis { k, .. } => finder.levels(ctx, *k, false),
            Estimator::Smoothed(_) => finder.levels_with(ctx, -1, true, true),
        }
    }

    /// The distribution given the levels, as `(token, probability)` pairs.
    pub fn distribution(&self, levels: &[Level], vocab: usize) -> Vec<(u32, f64)> {
        match self {
            Estimator::Sbis { decay, .. } => sbis::sbis_distribution(levels, *decay),
            Estimator::Smoothed(d) => smoothed::smoothed_distribution(levels, d, vocab)
                .into_iter()
                .enumerate()
                .map(|(t, p)| (t as u32, p))
                .collect(),
        }
    }

    /// Probability of `tok` given the levels (`None` when SBIS has no level).
    pub fn prob(&self, levels: &[Level], vocab: usize, tok: u32) -> Option<f64> {
        match self {
            Estimator::Sbis { decay, .. } => sbis::sbis_prob(levels, *decay, tok),
            Estimator::Smoothed(d) => Some(smoothed::smoothed_prob(levels, d, vocab, tok)),
        }
    }
}

/// Settings of a generation.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// The estimator.
    pub estimator: Estimator,
    /// Tokens of context (the last `context` tokens of prompt + output).
    pub context: usize,
    /// Tokens to generate at most.
    pub max_tokens: usize,
}

/// Per-step record for `--stats`: suffix length `n` and total `m` of each kept level.
#[derive(Clone, Debug, Default)]
pub struct StepStats {
    /// `(n, m)` of each kept level, longest first.
    pub levels: Vec<(usize, u64)>,
}

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated token ids (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Whether it stopped at a document boundary.
    pub hit_end: bool,
    /// Per-step statistics.
    pub steps: Vec<StepStats>,
}

/// Generates from the index alone, calling `on_token` after each token (for streaming): the
/// decode loop ([`crate::decode::decode`]) with the ∞-gram as its model and no drafters. The
/// prompt starts a document (the separator goes first); generation stops at the next
/// document boundary.
pub fn generate<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    prompt: &[u32],
    cfg: &GenConfig,
    sampler: &mut Sampler,
    on_token: impl FnMut(u32),
) -> Result<Generation> {
    if index.total_tokens() == 0 {
        return Err(Error::input(
            "the index is empty: index a corpus with some text first",
        ));
    }
    let mut model = InfgramModel::new(index, cfg.estimator.clone(), cfg.context);
    let mut fed = Vec::with_capacity(prompt.len() + 1);
    fed.push(index.separator());
    fed.extend_from_slice(prompt);
    let decode_cfg = DecodeConfig {
        max_tokens: cfg.max_tokens,
        ..Default::default()
    };
    let (tokens, _) = decode(
        &mut model,
        &mut [],
        &mut [],
        sampler,
        &fed,
        &decode_cfg,
        on_token,
    )?;
    Ok(Generation {
        hit_end: tokens.len() < cfg.max_tokens,
        tokens,
        steps: model.steps,
    })
}
