//! Rebuilds the tokenizer embedded in a GGUF file from its `tokenizer.ggml.*` metadata.
//!
//! GGUF stores a BPE vocabulary (`tokens`, `token_type`), its `merges` and the name of the
//! pre-tokenizer (`pre`). We translate that into the `tokenizer.json` that Hugging Face would
//! ship for the same model and load it with the `tokenizers` crate. candle's
//! `TokenizerFromGguf` ignores `pre` and so splits digits wrongly for SmolLM2; here each known
//! `pre` value maps to its exact pre-tokenizer, and an unknown one is refused.

use crate::error::{Error, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use serde_json::json;
use std::path::Path;

/// Reads the GGUF metadata of `path` (not its tensors).
pub fn read_gguf_metadata(path: &Path) -> Result<Content> {
    let mut f = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::input(format!(
                "model file {} not found; fetch it with `infgram fetch smollm2-135m` (models/README.md in the repository)",
                path.display()
            ))
        } else {
            Error::io(path, e)
        }
    })?;
    Content::read(&mut f).map_err(|e| {
        Error::input(format!(
            "{}: not a readable GGUF file ({e}); fetch the model again (models/README.md in the repository)",
            path.display()
        ))
    })
}

fn strings(content: &Content, key: &str, path: &Path) -> Result<Vec<String>> {
    let v = content.metadata.get(key).ok_or_else(|| {
        Error::Tokenizer(format!("{}: GGUF metadata has no {key}", path.display()))
    })?;
    let arr = v
        .to_vec()
        .map_err(|e| Error::Tokenizer(format!("{}: {key}: {e}", path.display())))?;
    arr.iter()
        .map(|s| {
            s.to_string()
                .cloned()
                .map_err(|e| Error::Tokenizer(format!("{}: {key}: {e}", path.display())))
        })
        .collect()
}

/// The `tokenizer.json` text equivalent to the tokenizer embedded in the GGUF file at `path`.
pub fn gguf_tokenizer_json(path: &Path) -> Result<String> {
    tokenizer_json_of(&read_gguf_metadata(path)?, path)
}

/// The `tokenizer.json` text of GGUF metadata (`path` names the file in errors).
pub(crate) fn tokenizer_json_of(content: &Content, path: &Path) -> Result<String> {
    let get_str = |k: &str| {
        content
            .metadata
            .get(k)
            .and_then(|v| v.to_string().ok().cloned())
    };
    let model = get_str("tokenizer.ggml.model").unwrap_or_default();
    if model != "gpt2" {
        return Err(Error::Tokenizer(format!(
            "{}: GGUF tokenizer model {model:?} is not supported (only byte-level BPE, \"gpt2\"); \
             pass a tokenizer.json with --tokenizer instead",
            path.display()
        )));
    }
    let pre = get_str("tokenizer.ggml.pre").unwrap_or_else(|| "default".into());
    let pre_tokenizer = match pre.as_str() {
        // SmolLM2 / StarCoder: every digit its own piece, then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
            ]
        }),
        "gpt2" | "default" => json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
        }),
        other => {
            return Err(Error::Tokenizer(format!(
            "{}: GGUF pre-tokenizer {other:?} is not supported (known: smollm, starcoder, gpt2); \
                 pass the model's tokenizer.json with --tokenizer instead",
            path.display()
        )))
        }
    };
    let tokens = strings(content, "tokenizer.ggml.tokens", path)?;
    let merges = strings(content, "tokenizer.ggml.merges", path)?;
    let types: Vec<i64> = match content.metadata.get("tokenizer.ggml.token_type") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.to_i32().map(i64::from).unwrap_or(1))
            .collect(),
        _ => vec![1; tokens.len()],
    };
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    // Control (3) and user-defined (4) tokens are matched whole in the input, as in HF.
    let added: Vec<serde_json::Value> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(types.get(*i), Some(3) | Some(4)))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": types[i] == 3})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    });
    Ok(tokenizer.to_string())
}
