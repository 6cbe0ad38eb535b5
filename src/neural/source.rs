//! Where a `--model` comes from: a short name (fetched into the models cache on first use), a local
//! GGUF file, a local safetensors model directory, or `hf:OWNER/REPO[:FILE]` from the Hugging
//! Face Hub through hf-hub. The Hub is the only network access infgram makes at run time, and
//! only when a user names a Hub model; offline it fails with a message that says what to do.

use crate::error::{Error, Result};
use crate::lm::LanguageModel;
use crate::tokenizer::HfTokenizer;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// A resolved model: its files are on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A GGUF file (llama, Qwen 2 / 3, Gemma 3), run by the native runtime ([`crate::neural::native::decoder::Decoder`]).
    Gguf(PathBuf),
    /// A safetensors model directory, run by candle-transformers ([`crate::neural::candle::hf::HfLlama`]).
    Safetensors(PathBuf),
}

impl ModelSource {
    /// Resolves a `--model` argument, fetching what it names if needed.
    pub fn resolve(spec: &str) -> Result<ModelSource> {
        if let Some(hub) = spec.strip_prefix("hf:") {
            return from_hub(hub);
        }
        let path = Path::new(spec);
        if path.is_dir() {
            if !path.join("config.json").exists() {
                return Err(Error::input(format!(
                    "{spec} has no config.json: a safetensors model directory holds config.json, \
                     tokenizer.json and the .safetensors weights"
                )));
            }
            return Ok(ModelSource::Safetensors(path.to_path_buf()));
        }
        if spec.ends_with(".gguf") {
            if !path.exists() {
                return Err(Error::input(format!(
                    "model file {spec} not found; pass an existing .gguf file, a model \
                     directory, a short name such as smollm2-135m, or hf:OWNER/REPO[:FILE]"
                )));
            }
            return Ok(ModelSource::Gguf(path.to_path_buf()));
        }
        if path.exists() {
            return Err(Error::input(format!(
                "{spec} is neither a .gguf file nor a model directory"
            )));
        }
        crate::assets::ensure_model(spec).map(ModelSource::Gguf)
    }

    /// The GGUF file or the model directory.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Gguf(p) | ModelSource::Safetensors(p) => p,
        }
    }

    /// The file the tokenizer comes from: the GGUF itself, or the directory's tokenizer.json.
    pub fn tokenizer_file(&self) -> PathBuf {
        match self {
            ModelSource::Gguf(p) => p.clone(),
            ModelSource::Safetensors(dir) => dir.join("tokenizer.json"),
        }
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> Result<HfTokenizer> {
        match self {
            ModelSource::Gguf(p) => HfTokenizer::from_gguf(p),
            ModelSource::Safetensors(_) => HfTokenizer::from_json_file(&self.tokenizer_file()),
        }
    }

    /// The tokenizer of `file` (a `tokenizer.json`) for this model, with the chat template of
    /// its GGUF file when it has one: `--tokenizer FILE` for a file whose own tokenizer infgram
    /// does not read.
    pub fn tokenizer_from(&self, file: &Path) -> Result<HfTokenizer> {
        let tok = HfTokenizer::from_json_file(file)?;
        Ok(match self {
            ModelSource::Gguf(p) => {
                let content = crate::tokenizer::gguf::read_gguf_metadata(p)?;
                tok.with_chat_template(crate::tokenizer::gguf::chat_template_of(&content, p)?)
            }
            ModelSource::Safetensors(_) => tok,
        })
    }

    /// Loads a safetensors model (GGUF files have their own loaders with backend options).
    pub fn load_safetensors(
        &self,
        device: &candle_core::Device,
    ) -> Result<Box<dyn LanguageModel + Send>> {
        match self {
            ModelSource::Safetensors(dir) => Ok(Box::new(
                crate::neural::candle::hf::HfLlama::load_on(dir, device)?,
            )),
            ModelSource::Gguf(p) => Err(Error::input(format!(
                "{} is a GGUF file, not a safetensors directory",
                p.display()
            ))),
        }
    }
}

/// `OWNER/REPO[:FILE]` from the Hub: a `.gguf` FILE, or the repository's safetensors model.
fn from_hub(spec: &str) -> Result<ModelSource> {
    let (repo, file) = match spec.split_once(':') {
        Some((repo, file)) => (repo, Some(file)),
        None => (spec, None),
    };
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(Error::input(format!(
            "hf:{spec}: write hf:OWNER/REPO for a safetensors model or hf:OWNER/REPO:FILE.gguf"
        )));
    }
    // One line even when stderr is not a terminal (no progress bar then): a fetch is never silent.
    diag!("resolving hf:{spec} on the Hugging Face Hub (files download on first use only) ...");
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(std::io::stderr().is_terminal())
        .build()
        .map_err(|e| hub_err(repo, "", e))?;
    let hub = api.model(repo.to_string());
    let get = |f: &str| hub.get(f).map_err(|e| hub_err(repo, f, e));
    match file {
        Some(f) if f.ends_with(".gguf") => Ok(ModelSource::Gguf(get(f)?)),
        Some(f) => Err(Error::input(format!(
            "hf:{spec}: FILE must be a .gguf file; without :FILE the repository's safetensors \
             model is used ({f} is neither)"
        ))),
        None => {
            let config = get("config.json")?;
            get("tokenizer.json")?;
            match hub.get("model.safetensors.index.json") {
                Ok(index) => {
                    for shard in crate::neural::candle::hf::shard_names(&index)? {
                        get(&shard)?;
                    }
                }
                Err(_) => {
                    get("model.safetensors")?;
                }
            }
            let dir = config.parent().expect("a file in a snapshot directory");
            Ok(ModelSource::Safetensors(dir.to_path_buf()))
        }
    }
}

fn hub_err(repo: &str, file: &str, e: impl std::fmt::Display) -> Error {
    Error::Model(format!(
        "could not fetch {repo}/{file} from the Hugging Face Hub ({e}). infgram uses the network \
         only for hf: models; offline, copy the model's files (a .gguf, or a directory with \
         config.json, tokenizer.json and *.safetensors) to this machine and pass the path to \
         --model"
    ))
}
