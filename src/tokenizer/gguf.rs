//! Rebuilds the tokenizer embedded in a GGUF file from its `tokenizer.ggml.*` metadata.
//!
//! Two kinds of GGUF tokenizer are read:
//! * byte-level BPE (`model = "gpt2"`: SmolLM2, Llama 3, Qwen): a vocabulary (`tokens`,
//!   `token_type`), its `merges` and the name of the pre-tokenizer (`pre`). candle's
//!   `TokenizerFromGguf` ignores `pre` and so splits digits wrongly for SmolLM2; here each
//!   known `pre` value maps to its exact pre-tokenizer, and an unknown one is refused.
//! * SentencePiece BPE (`model = "llama"`: Gemma, Llama 2): a vocabulary with `scores` and no
//!   merges. SentencePiece merges, at each step, the adjacent pair whose concatenation is the
//!   vocabulary's highest-scored piece, and falls back to byte pieces (`<0x41>`) for what no
//!   piece covers; that is BPE with one merge per (piece, split into two pieces) ranked by the
//!   piece's score, which [`spm_merges`] lists (as transformers' GGUF converter does).
//!
//! Either is translated into the `tokenizer.json` Hugging Face would ship for the model and
//! loaded with the `tokenizers` crate.

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
    crate::gguf::read(&mut f, path)
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
    if model == "llama" {
        return spm_tokenizer_json(content, path);
    }
    if model != "gpt2" {
        return Err(Error::Tokenizer(format!(
            "{}: GGUF tokenizer model {model:?} is not supported (byte-level BPE, \"gpt2\", and \
             SentencePiece BPE, \"llama\"); pass a tokenizer.json with --tokenizer instead",
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

/// A GGUF token's type (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The token types of the file (all normal when it has none).
fn token_types(content: &Content, n: usize) -> Vec<i32> {
    match content.metadata.get("tokenizer.ggml.token_type") {
        Some(Value::Array(a)) => a.iter().map(|v| v.to_i32().unwrap_or(NORMAL)).collect(),
        _ => vec![NORMAL; n],
    }
}

/// The BPE merges equivalent to SentencePiece's merging by score: for every normal piece
/// and every split of it into two pieces of the vocabulary, the pair, ranked by the piece's
/// score (highest first; ties by the piece's id, then the split point).
pub(crate) fn spm_merges(
    tokens: &[String],
    scores: &[f32],
    types: &[i32],
) -> Vec<(String, String)> {
    let ids: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types.get(*i) == Some(&NORMAL))
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types.get(id) != Some(&NORMAL) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                merges.push((scores.get(id).copied().unwrap_or(0.0), id, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges
        .into_iter()
        .map(|(_, _, l, r)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}

/// The `tokenizer.json` of a SentencePiece BPE vocabulary (`model = "llama"`): spaces become
/// `▁` (with one in front when the file says `add_space_prefix`), the pieces merge as
/// [`spm_merges`] lists, bytes no piece covers become byte pieces; control and user-defined
/// tokens are matched whole, as llama.cpp does.
fn spm_tokenizer_json(content: &Content, path: &Path) -> Result<String> {
    let tokens = strings(content, "tokenizer.ggml.tokens", path)?;
    let scores: Vec<f32> = match content.metadata.get("tokenizer.ggml.scores") {
        Some(Value::Array(a)) => a.iter().map(|v| v.to_f32().unwrap_or(0.0)).collect(),
        _ => {
            return Err(Error::Tokenizer(format!(
                "{}: a SentencePiece GGUF tokenizer without tokenizer.ggml.scores",
                path.display()
            )))
        }
    };
    let types = token_types(content, tokens.len());
    let merges: Vec<serde_json::Value> = spm_merges(&tokens, &scores, &types)
        .into_iter()
        .map(|(l, r)| json!([l, r]))
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let added: Vec<serde_json::Value> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(types.get(*i), Some(&CONTROL) | Some(&USER_DEFINED)))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": types[i] == CONTROL})
        })
        .collect();
    let space_prefix = content
        .metadata
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(true);
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let normalizer = if space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]})
    } else {
        replace
    };
    let unk = content
        .metadata
        .get("tokenizer.ggml.unknown_token_id")
        .and_then(|v| v.to_u32().ok())
        .and_then(|id| tokens.get(id as usize).cloned());
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"}
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    });
    Ok(tokenizer.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{HfTokenizer, Tokenizer};
    use candle_core::quantized::gguf_file::VersionedMagic;
    use proptest::prelude::*;

    /// A SentencePiece vocabulary: byte pieces, control tokens, single characters and
    /// multi-character pieces, scored by rank (as Gemma's are).
    fn vocabulary() -> (Vec<String>, Vec<f32>, Vec<i32>) {
        let mut tokens: Vec<(String, i32)> = vec![
            ("<pad>".into(), CONTROL),
            ("<eos>".into(), CONTROL),
            ("<bos>".into(), CONTROL),
            ("<unk>".into(), CONTROL),
            ("\n".into(), USER_DEFINED),
        ];
        tokens.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 6)));
        for piece in [
            "▁t", "he", "▁the", "ab", "ba", "aba", "▁a", "bab", "▁ab", "abab", "▁▁", "cc", "c▁",
            "▁", "a", "b", "c", "t", "h", "e", "é",
        ] {
            tokens.push((piece.to_string(), NORMAL));
        }
        let scores = (0..tokens.len())
            .map(|i| {
                if tokens[i].1 == NORMAL {
                    -(i as f32)
                } else {
                    0.0
                }
            })
            .collect();
        let types = tokens.iter().map(|t| t.1).collect();
        (tokens.into_iter().map(|t| t.0).collect(), scores, types)
    }

    /// SentencePiece's BPE as llama.cpp runs it: spaces to `▁`, then repeatedly merge the
    /// adjacent pair whose concatenation is the best-scored normal piece (the leftmost on
    /// ties); pieces not in the vocabulary become their bytes' pieces.
    fn sentencepiece(text: &str, tokens: &[String], scores: &[f32], types: &[i32]) -> Vec<u32> {
        let id = |s: &str| {
            tokens
                .iter()
                .position(|t| t == s)
                .filter(|&i| types[i] == NORMAL)
        };
        let text = text.replace(' ', "▁");
        let mut out = Vec::new();
        for (k, part) in text.split('\n').enumerate() {
            if k > 0 {
                out.push(4);
            }
            let mut pieces: Vec<String> = part.chars().map(String::from).collect();
            loop {
                let best = (0..pieces.len().saturating_sub(1))
                    .filter_map(|i| id(&(pieces[i].clone() + &pieces[i + 1])).map(|t| (i, t)))
                    .fold(None, |best: Option<(usize, usize)>, (i, t)| match best {
                        Some((_, b)) if scores[b] >= scores[t] => best,
                        _ => Some((i, t)),
                    });
                let Some((i, _)) = best else { break };
                let right = pieces.remove(i + 1);
                pieces[i].push_str(&right);
            }
            for p in pieces {
                match id(&p) {
                    Some(t) => out.push(t as u32),
                    None => out.extend(p.bytes().map(|b| 5 + b as u32)),
                }
            }
        }
        out
    }

    fn tokenizer() -> HfTokenizer {
        let (tokens, scores, types) = vocabulary();
        let mut metadata = std::collections::HashMap::new();
        let array = |v: Vec<Value>| Value::Array(v);
        metadata.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        metadata.insert(
            "tokenizer.ggml.tokens".into(),
            array(tokens.into_iter().map(Value::String).collect()),
        );
        metadata.insert(
            "tokenizer.ggml.scores".into(),
            array(scores.into_iter().map(Value::F32).collect()),
        );
        metadata.insert(
            "tokenizer.ggml.token_type".into(),
            array(types.into_iter().map(Value::I32).collect()),
        );
        metadata.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
        metadata.insert("tokenizer.ggml.unknown_token_id".into(), Value::U32(3));
        let content = Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: Default::default(),
            tensor_data_offset: 0,
        };
        let path = Path::new("spm.gguf");
        let json = tokenizer_json_of(&content, path).unwrap();
        HfTokenizer::from_json_str(&json, "gguf", path).unwrap()
    }

    #[test]
    fn sentencepiece_edge_cases() {
        let tok = tokenizer();
        let (tokens, scores, types) = vocabulary();
        for text in [
            "",
            " ",
            "the",
            " the abab",
            "ababab",
            "  cc c  ",
            "x",
            "aé\nb",
            "<bos>",
        ] {
            let want = if text == "<bos>" {
                vec![2]
            } else {
                sentencepiece(text, &tokens, &scores, &types)
            };
            assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
            assert_eq!(tok.decode(&want).unwrap(), text, "{text:?}");
        }
    }

    proptest! {
        /// The rebuilt tokenizer gives the ids of SentencePiece's own merging, on texts of
        /// the vocabulary's characters, spaces, newlines and characters it lacks (bytes).
        #[test]
        fn sentencepiece_merging_is_reproduced(chars in proptest::collection::vec(
            proptest::sample::select(vec!['a', 'b', 'c', 't', 'h', 'e', ' ', ' ', '\n', 'é', 'z', 'ß']),
            0..40,
        )) {
            let text: String = chars.into_iter().collect();
            let (tokens, scores, types) = vocabulary();
            let tok = tokenizer();
            prop_assert_eq!(tok.encode(&text).unwrap(), sentencepiece(&text, &tokens, &scores, &types));
            prop_assert_eq!(tok.decode(&tok.encode(&text).unwrap()).unwrap(), text);
        }
    }
}
