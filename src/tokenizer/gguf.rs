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
//!   piece's score, which `spm_merges` lists (as transformers' GGUF converter does).
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
pub fn tokenizer_json_of(content: &Content, path: &Path) -> Result<String> {
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
    let Some((pre_tokenizer, ignore_merges)) = byte_level_pre_tokenizer(&pre) else {
        return Err(Error::Tokenizer(format!(
            "{}: GGUF pre-tokenizer {pre:?} is not supported (known: {}); pass the model's \
             tokenizer.json with --tokenizer FILE (Python: Model(..., tokenizer=FILE))",
            path.display(),
            PRE_TOKENIZERS
                .iter()
                .map(|f| f.names[0])
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let tokens = strings(content, "tokenizer.ggml.tokens", path)?;
    let merges = strings(content, "tokenizer.ggml.merges", path)?;
    let types = token_types(content, tokens.len());
    let vocab = vocabulary(&tokens);
    let added = added_tokens(&tokens, &types);
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
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges
        }
    });
    Ok(tokenizer.to_string())
}

/// A family of byte-level BPE pre-tokenizers, as llama.cpp splits text for it
/// (`llama-vocab.cpp`, `llm_tokenizer_bpe`): the `tokenizer.ggml.pre` values that name it, its
/// regular expressions, applied one after another (each splits every piece the ones before it
/// made, keeping what it does not match as pieces of their own), and whether a piece that is
/// a token of the vocabulary is that token before any merge (`ignore_merges`).
pub struct PreTokenizer {
    /// The `tokenizer.ggml.pre` values of the family (the first is its name).
    pub names: &'static [&'static str],
    /// The splitting expressions.
    pub regexes: &'static [&'static str],
    /// Whether whole pieces of the vocabulary skip the merges.
    pub ignore_merges: bool,
}

/// GPT-2's expression (llama.cpp's form: the trailing `\s+` of the original is what its
/// pieces leave unmatched).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's expression, with llama.cpp's case-insensitive contractions written out.
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The byte-level BPE families infgram reads from a GGUF's `tokenizer.ggml.pre`: each
/// byte-level family llama.cpp names for the architectures infgram loads (Llama, Qwen 2/2.5/3,
/// SmolLM, StarCoder, DeepSeek, Mistral's Tekken, GPT-2), with its exact split.
pub const PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer {
        names: &["llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral"],
        regexes: &[LLAMA3_REGEX],
        ignore_merges: true,
    },
    PreTokenizer {
        names: &["dbrx", "smaug-bpe"],
        regexes: &[LLAMA3_REGEX],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["qwen2", "deepseek-r1-qwen", "stablelm2"],
        regexes: &[r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["deepseek-llm"],
        regexes: &[
            "[\r\n]",
            "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
            "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
            "\\s+$",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}+",
        ],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["deepseek-coder"],
        regexes: &[
            "[\r\n]",
            "\\s?\\p{L}+",
            "\\s?\\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}",
        ],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["tekken"],
        regexes: &[r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
        ignore_merges: true,
    },
    PreTokenizer {
        names: &["smollm", "starcoder", "refact", "command-r", "codeshell"],
        regexes: &[r"\p{N}", GPT2_REGEX],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["gpt-2", "gpt2", "phi-2", "mpt", "olmo"],
        regexes: &[GPT2_REGEX],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["default"],
        regexes: &[
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2_REGEX,
            r"\p{N}+",
            "[0-9][0-9][0-9]",
        ],
        ignore_merges: false,
    },
];

/// The `tokenizer.json` pre-tokenizer of the family named `pre` (its regular expressions as
/// isolated splits, then the byte-level alphabet) and its `ignore_merges`.
fn byte_level_pre_tokenizer(pre: &str) -> Option<(serde_json::Value, bool)> {
    let family = PRE_TOKENIZERS.iter().find(|f| f.names.contains(&pre))?;
    // GPT-2's split is the byte-level pre-tokenizer's own regex (and digits one by one,
    // `Digits`): the form Hugging Face ships for these models, which the fast encoder
    // (`fast_bpe`) reads and indexes built with them record in their fingerprint.
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
    });
    match family.regexes {
        [GPT2_REGEX] => return Some((byte_level, family.ignore_merges)),
        [r"\p{N}", GPT2_REGEX] => {
            let digits = json!({"type": "Digits", "individual_digits": true});
            let steps = json!({"type": "Sequence", "pretokenizers": [digits, byte_level]});
            return Some((steps, family.ignore_merges));
        }
        _ => {}
    }
    let mut steps: Vec<serde_json::Value> = family
        .regexes
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
        .collect();
    steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}));
    Some((
        json!({"type": "Sequence", "pretokenizers": steps}),
        family.ignore_merges,
    ))
}

/// The chat template of GGUF metadata (`tokenizer.chat_template`), with the texts of its
/// first and end tokens; `None` for a file without one (a base model). A template that is not
/// text (a number, an array) is refused: the file is damaged, and an instruct model prompted
/// without its turns would answer as garbage without a word.
pub fn chat_template_of(
    content: &Content,
    path: &Path,
) -> Result<Option<super::chat::ChatTemplate>> {
    let Some(value) = content.metadata.get("tokenizer.chat_template") else {
        return Ok(None);
    };
    let source = value.to_string().map_err(|_| {
        Error::Tokenizer(format!(
            "{}: tokenizer.chat_template is a {:?}, not text (the file is damaged); pass the \
             model's tokenizer.json with --tokenizer FILE, whose turns are ChatML's or \
             Gemma's",
            path.display(),
            value.value_type()
        ))
    })?;
    let tokens = strings(content, "tokenizer.ggml.tokens", path)?;
    let token = |key: &str| {
        content
            .metadata
            .get(key)
            .and_then(|v| v.to_u32().ok())
            .and_then(|id| tokens.get(id as usize).cloned())
            .unwrap_or_default()
    };
    let (bos, eos) = (
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    );
    super::chat::ChatTemplate::new(source, &bos, &eos)
        .map(Some)
        .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))
}

/// The `tokenizer.json` vocabulary: each token's text to its id.
fn vocabulary(tokens: &[String]) -> serde_json::Map<String, serde_json::Value> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect()
}

/// The tokens matched whole in the input before it is split, as llama.cpp matches them: user
/// defined ones always, control and unknown ones as control tokens (`special`: matched only
/// where control tokens are read, [`crate::tokenizer::Tokenizer::encode`], not in plain text).
/// A token whose text is one llama.cpp takes for an end of generation (`</s>`,
/// `<|endoftext|>`, `<eos>`, …) is a control token whatever its type in the file, as
/// llama.cpp overrides it ("control-looking token … its type will be overridden").
fn added_tokens(tokens: &[String], types: &[i32]) -> Vec<serde_json::Value> {
    tokens
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let ty = types.get(i).copied().unwrap_or(NORMAL);
            let control = matches!(ty, CONTROL | UNKNOWN) || END_LOOKING.contains(&t.as_str());
            (control || ty == USER_DEFINED).then(|| {
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": control})
            })
        })
        .collect()
}

/// Texts llama.cpp reads as ends of generation, and so as control tokens (`llama-vocab.cpp`).
const END_LOOKING: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// A GGUF token's type (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
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
    let vocab = vocabulary(&tokens);
    let added = added_tokens(&tokens, &types);
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
