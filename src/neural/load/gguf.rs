//! Reading a llama-architecture GGUF file: its hyper-parameters and its tensors.
//!
//! Both forward passes ([`crate::neural::arch::llama::Llama`], the native one, and
//! [`crate::neural::candle::llama::CandleLlama`], the candle reference) load through here, so they
//! agree on what a file means and refuse the same bad files with the same messages.

use crate::error::{Error, Result};
use candle_core::quantized::{gguf_file, QTensor};
use candle_core::Device;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Hyper-parameters of a llama-architecture model.
#[derive(Clone, Debug)]
pub struct LlamaConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub dim: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub eos: Vec<u32>,
}

/// An open GGUF file.
pub struct Gguf {
    path: PathBuf,
    file: File,
    content: gguf_file::Content,
}

/// A model error about `path`.
pub(crate) fn model_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Model(format!("{}: {}", path.display(), plain(e)))
}

/// An error's message without the stack backtrace candle appends to its errors' text when
/// `RUST_BACKTRACE` is set.
pub(crate) fn plain(e: impl std::fmt::Display) -> String {
    let text = e.to_string();
    text.split("\n   0: ")
        .next()
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

impl Gguf {
    /// Opens `path` and reads its header; a missing or unreadable file is a clear error.
    pub fn open(path: &Path) -> Result<Gguf> {
        if !path.exists() {
            return Err(Error::input(format!(
                "model file {} not found; fetch it with `infgram fetch smollm2-135m` (models/README.md in the repository)",
                path.display()
            )));
        }
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| {
            model_err(
                path,
                format!(
                    "not a readable GGUF file ({}); fetch it again, or pass another model",
                    plain(e)
                ),
            )
        })?;
        Ok(Gguf {
            path: path.to_path_buf(),
            file,
            content,
        })
    }

    fn metadata(&self, key: &str) -> Result<&gguf_file::Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| model_err(&self.path, format!("GGUF metadata has no {key}")))
    }

    /// The llama hyper-parameters; any other architecture is refused.
    pub fn llama_config(&self) -> Result<LlamaConfig> {
        let err = |e: candle_core::Error| model_err(&self.path, e);
        let arch = self
            .metadata("general.architecture")?
            .to_string()
            .map_err(err)?;
        if arch != "llama" {
            return Err(model_err(
                &self.path,
                format!("architecture {arch:?} is not supported (supported: llama)"),
            ));
        }
        let u =
            |k: &str| -> Result<usize> { Ok(self.metadata(k)?.to_u32().map_err(err)? as usize) };
        let (n_head, dim) = (
            u("llama.attention.head_count")?,
            u("llama.embedding_length")?,
        );
        let get_f32 = |k: &str| self.content.metadata.get(k).and_then(|v| v.to_f32().ok());
        Ok(LlamaConfig {
            n_layer: u("llama.block_count")?,
            n_head,
            n_kv_head: u("llama.attention.head_count_kv")?,
            dim,
            head_dim: dim / n_head,
            eps: self
                .metadata("llama.attention.layer_norm_rms_epsilon")?
                .to_f32()
                .map_err(err)?,
            rope_base: get_f32("llama.rope.freq_base").unwrap_or(10_000.0),
            eos: self
                .content
                .metadata
                .get("tokenizer.ggml.eos_token_id")
                .and_then(|v| v.to_u32().ok())
                .into_iter()
                .collect(),
        })
    }

    /// Whether the file has a tensor of this name.
    pub fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads one tensor in its stored quantization.
    pub fn tensor(&mut self, name: &str) -> Result<QTensor> {
        self.content
            .tensor(&mut self.file, name, &Device::Cpu)
            .map_err(|e| model_err(&self.path, format!("tensor {name}: {e}")))
    }
}
