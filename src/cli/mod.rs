//! Subcommands of the `infgram` binary: clap types, turned into [`infgram::service`] calls.

pub mod attribute;
pub mod gen;
pub mod index;
pub mod mix;
#[cfg(feature = "plot")]
pub mod plot;
pub mod ppl;
pub mod query;

use anyhow::Result;
use infgram::ngram::smoothed::Discounts;
use infgram::ngram::Estimator;
use infgram::service::models::{Backend, ModelOptions, Requantize};
use std::path::Path;

/// The ∞-gram estimators.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EstimatorKind {
    /// Selective backoff interpolation (SBIS).
    Sbis,
    /// Interpolated absolute discounting down to uniform (finite perplexity without a floor).
    Smoothed,
}

/// Estimator flags shared by `gen` and `ppl`.
#[derive(clap::Args, Debug)]
pub struct EstimatorArgs {
    /// The estimator.
    #[arg(long, value_enum, default_value_t = EstimatorKind::Sbis)]
    pub estimator: EstimatorKind,
    /// SBIS levels to interpolate (−1: all).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub k: i64,
    /// SBIS weight ratio between consecutive levels.
    #[arg(long, default_value_t = 0.1)]
    pub decay: f64,
}

impl EstimatorArgs {
    /// Whether the smoothed estimator is chosen.
    pub fn is_smoothed(&self) -> bool {
        self.estimator == EstimatorKind::Smoothed
    }

    /// The estimator; the smoothed one uses `discounts` or the fitted defaults.
    pub fn estimator(&self, discounts: Option<Discounts>) -> Result<Estimator> {
        if self.k == 0 {
            anyhow::bail!("--k must be −1 (all levels) or at least 1");
        }
        Ok(match self.estimator {
            EstimatorKind::Smoothed => Estimator::Smoothed(discounts.unwrap_or_default()),
            EstimatorKind::Sbis => Estimator::Sbis {
                k: self.k,
                decay: self.decay,
            },
        })
    }
}

/// How a neural model is loaded and run (`gen --model`, `ppl --model`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// With --model: threads for the forward pass (0: one per core). The logits do not depend
    /// on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// With --model: infgram's kernels (`native`, the default) or the candle-ops reference
    /// (`candle`, several times slower).
    #[arg(long, value_enum, default_value_t = Backend::Native)]
    pub backend: Backend,
    /// With --model: re-quantize the weights at load (`q8_0`; the candle backend also takes
    /// `q4_0`). The file's own Q4_1 is the fastest with the native backend.
    #[arg(long, value_enum)]
    pub requantize: Option<Requantize>,
}

impl ModelArgs {
    /// The service's model options (unused in a build without neural models).
    #[cfg_attr(not(feature = "neural"), allow(dead_code))]
    pub fn options(&self) -> ModelOptions {
        ModelOptions {
            threads: self.threads,
            backend: self.backend,
            requantize: self.requantize,
        }
    }
}

/// The error of a `--model` option in a build without neural models.
#[cfg(not(feature = "neural"))]
pub fn no_neural() -> anyhow::Error {
    anyhow::anyhow!(
        "this infgram was built without the `neural` feature: neural models are not available \
         (build with default features: `cargo install --path .`)"
    )
}

/// `infgram verify INDEX`.
pub fn verify(dir: &Path) -> Result<()> {
    let index = infgram::Index::open(dir)?;
    index.verify()?;
    println!(
        "{}: ok ({} tokens, {} shards)",
        dir.display(),
        index.total_tokens(),
        index.shards().len()
    );
    Ok(())
}

/// `infgram fetch WHAT`.
pub fn fetch(what: &str) -> Result<()> {
    let path = match what {
        "shakespeare" => infgram::assets::ensure_shakespeare()?,
        "tiny-shakespeare" => infgram::assets::ensure_tiny_shakespeare()?,
        name => infgram::assets::ensure_model(name)?,
    };
    println!("{}", path.display());
    Ok(())
}
