//! Reading a GGUF file: its metadata (hyper-parameters) and its tensors.
//!
//! Both forward passes ([`crate::neural::native::decoder::Decoder`], the native one, and
//! [`crate::neural::candle::decoder::CandleDecoder`], the candle reference) load through here, and
//! read what a file's architecture means through [`crate::neural::arch::describe`], so they
//! agree on a file and refuse the same bad files with the same messages.

use crate::error::{Error, Result};
use candle_core::quantized::{gguf_file, QTensor};
use candle_core::Device;
use std::fs::File;
use std::path::{Path, PathBuf};

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
        let content = crate::gguf::read(&mut file, path)?;
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

    /// The file's `general.architecture` (`llama`, `qwen2`, `gemma3`…).
    pub fn architecture(&self) -> Result<String> {
        self.metadata("general.architecture")?
            .to_string()
            .cloned()
            .map_err(|e| model_err(&self.path, e))
    }

    /// An integer hyper-parameter (`llama.block_count`); a missing one is an error.
    pub fn usize(&self, key: &str) -> Result<usize> {
        Ok(self
            .metadata(key)?
            .to_u32()
            .map_err(|e| model_err(&self.path, e))? as usize)
    }

    /// A real hyper-parameter; a missing one is an error.
    pub fn f32(&self, key: &str) -> Result<f32> {
        self.metadata(key)?
            .to_f32()
            .map_err(|e| model_err(&self.path, e))
    }

    /// A real hyper-parameter, or `default` when the file has none.
    pub fn f32_or(&self, key: &str, default: f32) -> f32 {
        self.content
            .metadata
            .get(key)
            .and_then(|v| v.to_f32().ok())
            .unwrap_or(default)
    }

    /// The end-of-sequence token ids the file names (none or one).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.content
            .metadata
            .get("tokenizer.ggml.eos_token_id")
            .and_then(|v| v.to_u32().ok())
            .into_iter()
            .collect()
    }

    /// The special token ids the file names (`tokenizer.ggml.*_token_id`: bos, eos,
    /// unknown, padding…), each with its key, as the integers they are (any integer type).
    pub fn special_ids(&self) -> Vec<(&str, i128)> {
        use gguf_file::Value as V;
        let mut ids: Vec<(&str, i128)> = self
            .content
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer.ggml.") && k.ends_with("_token_id"))
            .filter_map(|(k, v)| {
                let id = match *v {
                    V::U8(x) => x as i128,
                    V::I8(x) => x as i128,
                    V::U16(x) => x as i128,
                    V::I16(x) => x as i128,
                    V::U32(x) => x as i128,
                    V::I32(x) => x as i128,
                    V::U64(x) => x as i128,
                    V::I64(x) => x as i128,
                    _ => return None,
                };
                Some((k.as_str(), id))
            })
            .collect();
        ids.sort();
        ids
    }

    /// How many tokens the file's tokenizer has (`tokenizer.ggml.tokens`), if it has one.
    pub fn token_count(&self) -> Option<usize> {
        let tokens = self.content.metadata.get("tokenizer.ggml.tokens")?;
        tokens.to_vec().ok().map(Vec::len)
    }

    /// The id of the token spelled `text` in the file's vocabulary, if it has one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        let tokens = self
            .content
            .metadata
            .get("tokenizer.ggml.tokens")?
            .to_vec()
            .ok()?;
        tokens
            .iter()
            .position(|t| t.to_string().is_ok_and(|t| t == text))
            .map(|i| i as u32)
    }

    /// The token the file asks to put first (`tokenizer.ggml.bos_token_id` when
    /// `tokenizer.ggml.add_bos_token` is true: Gemma), if any.
    pub fn bos_id(&self) -> Option<u32> {
        let md = &self.content.metadata;
        let add = md.get("tokenizer.ggml.add_bos_token")?.to_bool().ok()?;
        add.then(|| md.get("tokenizer.ggml.bos_token_id")?.to_u32().ok())
            .flatten()
    }

    /// A model error about this file.
    pub fn error(&self, e: impl std::fmt::Display) -> Error {
        model_err(&self.path, e)
    }

    /// Whether the file's metadata has this key.
    pub fn has_metadata(&self, key: &str) -> bool {
        self.content.metadata.contains_key(key)
    }

    /// The shape of tensor `name` as the file states it (innermost dimension last), without
    /// reading it.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.content
            .tensor_infos
            .get(name)
            .map(|info| info.shape.dims().to_vec())
    }

    /// How many tensors the file has.
    pub fn tensor_count(&self) -> usize {
        self.content.tensor_infos.len()
    }

    /// The names of the file's tensors.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
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
