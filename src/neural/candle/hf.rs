//! Llama models from a Hugging Face safetensors directory, run by candle-transformers.
//!
//! A directory with `config.json` (`"model_type": "llama"`), `tokenizer.json` and the weights
//! (`model.safetensors`, or the shards named by `model.safetensors.index.json`) loads into
//! candle-transformers' `llama::Llama` in f32. That model returns only the last position's
//! logits and its cache cannot be cut, so this wrapper feeds verification tokens one at a
//! time (k tokens cost k steps) and rolls back by rebuilding the cache from the kept tokens
//! in one pass, lazily before the next feed. It is correct for every use of
//! [`LanguageModel`] but has none of the native GGUF path's speed: speculative decoding gains
//! nothing with it.

use crate::error::{Error, Result};
use crate::lm::{check_vocab, LanguageModel};
use crate::neural::load::gguf::model_err;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Config, Llama, LlamaConfig, LlamaEosToks};
use std::path::{Path, PathBuf};

/// A safetensors llama run by candle-transformers.
pub struct HfLlama {
    model: Llama,
    config: Config,
    cache: Cache,
    /// Tokens whose keys and values the cache should hold.
    tokens: Vec<u32>,
    /// The cache holds more than `tokens` (after a truncation) and must be rebuilt.
    stale: bool,
    eos: Vec<u32>,
    device: Device,
}

/// Bytes of a model directory's JSON files (`config.json`, the shards' index) at most.
const MAX_JSON_BYTES: u64 = 16 << 20;

/// The shard file names a `model.safetensors.index.json` lists, sorted, each once.
pub(crate) fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = crate::tokenizer::read_capped(index, MAX_JSON_BYTES)?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| model_err(index, e))?;
    let map = json["weight_map"]
        .as_object()
        .ok_or_else(|| model_err(index, "no weight_map"))?;
    let mut names: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// The weight files of a model directory: the shards of `model.safetensors.index.json`, or
/// every `*.safetensors` file.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    let mut files: Vec<PathBuf> = if index.exists() {
        shard_names(&index)?
            .into_iter()
            .map(|f| dir.join(f))
            .collect()
    } else {
        std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect()
    };
    files.sort();
    files.dedup();
    if files.is_empty() {
        return Err(Error::Model(format!(
            "{}: no .safetensors weights in this directory",
            dir.display()
        )));
    }
    Ok(files)
}

/// Reads `config.json` and refuses architectures other than llama.
fn read_config(dir: &Path) -> Result<LlamaConfig> {
    let path = dir.join("config.json");
    let text = crate::tokenizer::read_capped(&path, MAX_JSON_BYTES)?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| model_err(&path, e))?;
    let kind = json["model_type"].as_str().unwrap_or("(none)");
    if kind != "llama" {
        return Err(Error::Model(format!(
            "{}: unsupported architecture {kind:?}; infgram runs llama models (model_type \
             \"llama\") from safetensors directories, and llama GGUF files",
            path.display()
        )));
    }
    serde_json::from_value(json).map_err(|e| model_err(&path, e))
}

impl HfLlama {
    /// Loads the model in `dir` (see the module docs for the files it needs).
    pub fn load(dir: &Path) -> Result<HfLlama> {
        Self::load_on(dir, &Device::Cpu)
    }

    /// [`HfLlama::load`] onto `device`.
    pub fn load_on(dir: &Path, device: &Device) -> Result<HfLlama> {
        let config = read_config(dir)?.into_config(false);
        let files = weight_files(dir)?;
        let device = device.clone();
        // SAFETY: the files are memory-mapped read-only; like every mmap user we rely on
        // them not being modified while the model is loaded (the weights are copied out).
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &device) }
            .map_err(|e| model_err(dir, e))?;
        let model = Llama::load(vb, &config).map_err(|e| model_err(dir, e))?;
        let cache =
            Cache::new(true, DType::F32, &config, &device).map_err(|e| model_err(dir, e))?;
        let eos = match &config.eos_token_id {
            Some(LlamaEosToks::Single(t)) => vec![*t],
            Some(LlamaEosToks::Multiple(ts)) => ts.clone(),
            None => Vec::new(),
        };
        Ok(HfLlama {
            model,
            config,
            cache,
            tokens: Vec::new(),
            stale: false,
            eos,
            device,
        })
    }

    /// One candle pass over `tokens` after the cache; the last position's logits.
    fn pass(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let err = |e: candle_core::Error| Error::Model(e.to_string());
        let x = Tensor::new(tokens, &self.device)
            .and_then(|x| x.unsqueeze(0))
            .map_err(err)?;
        let logits = self
            .model
            .forward(&x, self.tokens.len(), &mut self.cache)
            .and_then(|l| l.squeeze(0))
            .and_then(|l| l.to_vec1::<f32>())
            .map_err(err)?;
        self.tokens.extend_from_slice(tokens);
        Ok(logits)
    }

    /// Rebuilds the cache from the kept tokens after a truncation.
    fn refresh(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.stale) {
            return Ok(());
        }
        let kept = std::mem::take(&mut self.tokens);
        self.cache = Cache::new(true, DType::F32, &self.config, &self.device)
            .map_err(|e| Error::Model(e.to_string()))?;
        if !kept.is_empty() {
            // From an empty cache candle-transformers takes many tokens in one pass.
            self.pass(&kept)?;
        }
        Ok(())
    }
}

impl LanguageModel for HfLlama {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        check_vocab(tokens, self.config.vocab_size)?;
        self.refresh()?;
        tokens.iter().map(|&t| self.pass(&[t])).collect()
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        check_vocab(tokens, self.config.vocab_size)?;
        self.refresh()?;
        match tokens.len() {
            0 => Ok(()),
            _ if self.tokens.is_empty() => self.pass(tokens).map(drop),
            _ => self.forward(tokens).map(drop),
        }
    }

    fn cache_len(&self) -> usize {
        self.tokens.len()
    }

    fn truncate(&mut self, len: usize) {
        if len < self.tokens.len() {
            self.tokens.truncate(len);
            self.stale = true;
        }
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }
}
