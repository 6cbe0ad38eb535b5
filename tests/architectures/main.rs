#![cfg(feature = "neural")]
//! Every architecture infgram runs, on tiny GGUF files with random weights written here (in
//! the weight types of `Q4_K_M` files: Q4_K, Q5_K, Q6_K, Q5_0, Q8_0):
//! * the native pass ([`Decoder`]) gives the same bits for a position however it is fed (in
//!   one pass, one token at a time, after a rollback), on every ISA;
//! * it matches the candle-ops reference ([`CandleDecoder`]) at every position within the
//!   tolerance below;
//! * for llama, Qwen 2 and Qwen 3, the reference matches candle-transformers' own
//!   implementation of the family (`quantized_llama`, `quantized_qwen2`, `quantized_qwen3`) at
//!   every position (its models give the last position's logits, so each prefix is run
//!   afresh); its Qwen 3 agrees at the first position only (see the test).
//!   candle-transformers' `quantized_gemma3` runs SiLU where Gemma has GELU, so Gemma 3 is
//!   checked against the reference and, on the real model, against llama.cpp;
//! * a file whose tensor shapes contradict its metadata is refused before any pass.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use infgram::decode::{decode, DecodeConfig, Draft, Drafter, Processor, Sampler, SamplerConfig};
use infgram::lm::{greedy_pick, LanguageModel, Logits, RowForm};
use infgram::neural::candle::decoder::CandleDecoder;
use infgram::neural::native::decoder::Decoder;
use infgram::neural::native::kernels::Isa;
use std::path::{Path, PathBuf};

const DIM: usize = 256;
const FFN: usize = 512;
const VOCAB: usize = 320;

/// `n` pseudo-random values in [−scale, scale].
fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A family's tiny model: its metadata prefix and which block features it has.
struct Family {
    name: &'static str,
    layers: usize,
    heads: (usize, usize),
    /// `key_length` in the metadata (a head width other than DIM / heads), if any.
    head_dim: Option<usize>,
    qk_norm: bool,
    bias: bool,
    post_norms: bool,
    window: Option<usize>,
    tied: bool,
}

const FAMILIES: [Family; 4] = [
    Family {
        name: "llama",
        layers: 2,
        heads: (4, 2),
        head_dim: None,
        qk_norm: false,
        bias: false,
        post_norms: false,
        window: None,
        tied: false,
    },
    Family {
        name: "qwen2",
        layers: 2,
        heads: (4, 2),
        head_dim: None,
        qk_norm: false,
        bias: true,
        post_norms: false,
        window: None,
        tied: true,
    },
    Family {
        name: "qwen3",
        layers: 2,
        heads: (4, 1),
        head_dim: Some(32),
        qk_norm: true,
        bias: false,
        post_norms: false,
        window: None,
        tied: true,
    },
    Family {
        name: "gemma3",
        layers: 6,
        heads: (4, 1),
        head_dim: Some(32),
        qk_norm: true,
        bias: false,
        post_norms: true,
        window: Some(4),
        tied: true,
    },
];

/// Writes `family`'s tiny model into `dir`; `break_shape` gives `blk.0.attn_k` one row too
/// many.
fn write_model(dir: &Path, family: &Family, break_shape: bool) -> PathBuf {
    write_model_with_eos(dir, family, break_shape, 1)
}

/// [`write_model`] with `eos` as its `tokenizer.ggml.eos_token_id` (named in the file's name
/// when it is not 1).
fn write_model_with_eos(dir: &Path, family: &Family, break_shape: bool, eos: u32) -> PathBuf {
    let f = family.name;
    let (n_head, n_kv) = family.heads;
    let hd = family.head_dim.unwrap_or(DIM / n_head);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(f.into())),
        (format!("{f}.block_count"), Value::U32(family.layers as u32)),
        (format!("{f}.embedding_length"), Value::U32(DIM as u32)),
        (format!("{f}.feed_forward_length"), Value::U32(FFN as u32)),
        (format!("{f}.context_length"), Value::U32(4096)),
        (
            format!("{f}.attention.head_count"),
            Value::U32(n_head as u32),
        ),
        (
            format!("{f}.attention.head_count_kv"),
            Value::U32(n_kv as u32),
        ),
        (
            format!("{f}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (format!("{f}.rope.freq_base"), Value::F32(10_000.0)),
        (format!("{f}.rope.dimension_count"), Value::U32(hd as u32)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
    ];
    if let Some(hd) = family.head_dim {
        md.push((format!("{f}.attention.key_length"), Value::U32(hd as u32)));
        md.push((format!("{f}.attention.value_length"), Value::U32(hd as u32)));
    }
    if let Some(w) = family.window {
        md.push((
            format!("{f}.attention.sliding_window"),
            Value::U32(w as u32),
        ));
    }
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut seed = 1u64;
    let mut add = |name: String, shape: (usize, usize), dtype: GgmlDType, scale: f32, base: f32| {
        seed += 1;
        let values: Vec<f32> = noise(shape.0 * shape.1, seed, scale)
            .into_iter()
            .map(|v| v + base)
            .collect();
        let t = Tensor::from_vec(values, shape, &Device::Cpu).unwrap();
        let t = if shape.0 == 1 {
            t.squeeze(0).unwrap()
        } else {
            t
        };
        tensors.push((name, QTensor::quantize(&t, dtype).unwrap()));
    };
    // Matrices: K-quants where the rows allow (multiples of 256), else Q5_0 / Q8_0.
    let kq = |cols: usize, k: GgmlDType, other: GgmlDType| {
        if cols.is_multiple_of(256) {
            k
        } else {
            other
        }
    };
    add(
        "token_embd.weight".into(),
        (VOCAB, DIM),
        GgmlDType::Q6K,
        1.0,
        0.0,
    );
    if !family.tied {
        add(
            "output.weight".into(),
            (VOCAB, DIM),
            GgmlDType::Q8_0,
            0.2,
            0.0,
        );
    }
    add(
        "output_norm.weight".into(),
        (1, DIM),
        GgmlDType::F32,
        0.1,
        1.0,
    );
    let (q_w, kv_w) = (n_head * hd, n_kv * hd);
    for i in 0..family.layers {
        let b = |n: &str| format!("blk.{i}.{n}");
        let k_rows = kv_w + usize::from(break_shape && i == 0);
        add(b("attn_q.weight"), (q_w, DIM), GgmlDType::Q4K, 0.15, 0.0);
        add(
            b("attn_k.weight"),
            (k_rows, DIM),
            GgmlDType::Q5_0,
            0.15,
            0.0,
        );
        add(b("attn_v.weight"), (kv_w, DIM), GgmlDType::Q8_0, 0.15, 0.0);
        let o = kq(q_w, GgmlDType::Q6K, GgmlDType::Q5_0);
        add(b("attn_output.weight"), (DIM, q_w), o, 0.1, 0.0);
        add(b("ffn_gate.weight"), (FFN, DIM), GgmlDType::Q4K, 0.15, 0.0);
        add(b("ffn_up.weight"), (FFN, DIM), GgmlDType::Q5K, 0.15, 0.0);
        add(b("ffn_down.weight"), (DIM, FFN), GgmlDType::Q6K, 0.1, 0.0);
        add(b("attn_norm.weight"), (1, DIM), GgmlDType::F32, 0.1, 1.0);
        add(b("ffn_norm.weight"), (1, DIM), GgmlDType::F32, 0.1, 1.0);
        if family.qk_norm {
            add(b("attn_q_norm.weight"), (1, hd), GgmlDType::F32, 0.1, 1.0);
            add(b("attn_k_norm.weight"), (1, hd), GgmlDType::F32, 0.1, 1.0);
        }
        if family.post_norms {
            add(
                b("post_attention_norm.weight"),
                (1, DIM),
                GgmlDType::F32,
                0.1,
                1.0,
            );
            add(
                b("post_ffw_norm.weight"),
                (1, DIM),
                GgmlDType::F32,
                0.1,
                1.0,
            );
        }
        if family.bias {
            add(b("attn_q.bias"), (1, q_w), GgmlDType::F32, 0.3, 0.0);
            add(b("attn_k.bias"), (1, kv_w), GgmlDType::F32, 0.3, 0.0);
            add(b("attn_v.bias"), (1, kv_w), GgmlDType::F32, 0.3, 0.0);
        }
    }
    let path = dir.join(format!(
        "{f}{}{}.gguf",
        if break_shape { "-broken" } else { "" },
        if eos == 1 {
            String::new()
        } else {
            format!("-eos{eos}")
        }
    ));
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut file = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut file, &md_refs, &t_refs).unwrap();
    path
}

/// ‖a − b‖ / ‖b‖.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Agreement between two implementations' logits: relative L2 distance per position. Both
/// quantize the activations to 8 bits before each matrix (each its own way), which is what
/// separates them.
const TOLERANCE: f32 = 0.08;

fn ids(n: usize, seed: u64) -> Vec<u32> {
    noise(n, seed, 1.0)
        .iter()
        .map(|v| ((v + 1.0) / 2.0 * (VOCAB - 1) as f32) as u32)
        .collect()
}

#[test]
fn every_family_is_the_same_bits_however_fed_and_matches_the_candle_reference() {
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let tokens = ids(14, 7);
        let mut reference = CandleDecoder::from_gguf(&path).unwrap();
        let want = reference.forward(&tokens).unwrap();
        // The reference's own cache: a rollback and one token at a time give its rows again,
        // bit for bit (the candle pass is batch-invariant; see the next test).
        reference.truncate(6);
        for (i, &t) in tokens[6..].iter().enumerate() {
            let row = reference.forward(&[t]).unwrap().remove(0);
            assert_eq!(row, want[6 + i], "{}: reference row {}", family.name, 6 + i);
        }
        for isa in Isa::available() {
            let mut native = Decoder::from_gguf(&path).unwrap().with_isa(isa);
            let full = native.forward(&tokens).unwrap();
            for (i, (got, want)) in full.iter().zip(&want).enumerate() {
                let d = rel_diff(got, want);
                assert!(d < TOLERANCE, "{} {isa:?} position {i}: {d}", family.name);
            }
            native.truncate(5);
            let mut again = native.forward(&tokens[5..9]).unwrap();
            for &t in &tokens[9..] {
                again.extend(native.forward(&[t]).unwrap());
            }
            assert_eq!(
                again,
                full[5..],
                "{} {isa:?}: rows after a rollback",
                family.name
            );
            let mut threaded = Decoder::from_gguf(&path)
                .unwrap()
                .with_isa(isa)
                .with_threads(2);
            assert_eq!(
                threaded.forward(&tokens).unwrap(),
                full,
                "{} {isa:?}",
                family.name
            );
        }
    }
}

/// The candle pass (`--backend candle`, and so `--device cuda`) gives a position the same bits
/// however it is fed: in one pass, in passes of any length, one token at a time, after a
/// rollback over positions a longer pass had written, and across the cache's growth steps
/// (`POSITION_STEP`). Speculative decoding verified by this pass is then lossless: a row of a
/// k-token verification is the row plain decoding computes. The same rules hold on CUDA; the
/// device check (`scripts/device-check.sh`) compares the outputs there.
#[test]
fn the_candle_pass_gives_a_position_the_same_bits_however_fed() {
    use infgram::neural::candle::decoder::POSITION_STEP;
    let dir = tempfile::tempdir().unwrap();
    let n = POSITION_STEP + 20;
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let tokens = ids(n, 11);
        let mut model = CandleDecoder::from_gguf(&path).unwrap();
        let full = model.forward(&tokens).unwrap();
        for sizes in [&[1usize][..], &[5, 16, 3, 9], &[17, 1, 2]] {
            model.clear();
            let (mut rows, mut at) = (Vec::new(), 0);
            for &size in sizes.iter().cycle() {
                if at == n {
                    break;
                }
                let end = (at + size).min(n);
                rows.extend(model.forward(&tokens[at..end]).unwrap());
                at = end;
            }
            for (i, (got, want)) in rows.iter().zip(&full).enumerate() {
                assert_eq!(got, want, "{} fed in {sizes:?}: position {i}", family.name);
            }
        }
        // A draft of 16 written over positions 50.., rolled back, then the true tokens.
        model.truncate(50);
        let draft = ids(16, 99);
        model.forward(&draft).unwrap();
        model.truncate(50);
        for (i, &t) in tokens[50..].iter().enumerate() {
            let row = model.forward(&[t]).unwrap().remove(0);
            assert_eq!(
                row,
                full[50 + i],
                "{}: after a rollback, {}",
                family.name,
                50 + i
            );
        }
    }
}

#[test]
fn the_reference_matches_candle_transformers_for_llama_and_qwen() {
    use candle_transformers::models::{quantized_llama, quantized_qwen2, quantized_qwen3};
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES[..3] {
        let path = write_model(dir.path(), family, false);
        let tokens = ids(9, 11);
        let ours = CandleDecoder::from_gguf(&path)
            .unwrap()
            .forward(&tokens)
            .unwrap();
        for end in 1..=tokens.len() {
            let mut file = std::fs::File::open(&path).unwrap();
            let content = gguf_file::Content::read(&mut file).unwrap();
            let x = Tensor::new(&tokens[..end], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let dev = Device::Cpu;
            let logits = match family.name {
                "llama" => quantized_llama::ModelWeights::from_gguf(content, &mut file, &dev)
                    .unwrap()
                    .forward(&x, 0),
                "qwen2" => quantized_qwen2::ModelWeights::from_gguf(content, &mut file, &dev)
                    .unwrap()
                    .forward(&x, 0),
                _ => quantized_qwen3::ModelWeights::from_gguf(content, &mut file, &dev)
                    .unwrap()
                    .forward(&x, 0),
            }
            .unwrap();
            let theirs: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
            let d = rel_diff(&ours[end - 1], &theirs);
            // candle-transformers 0.11.1's qwen3 agrees while attention cannot depend on q and
            // k (one position), then differs by 1–3% (also fed token by token); the same
            // blocks (q/k norms, rotary halves) agree with llama.cpp on Gemma 3. Its figure
            // is checked at the first position only.
            // Elsewhere the two differ by the order of their float sums (ours are fixed per
            // row for batch invariance, theirs are matrix products): where that moves an
            // activation across a rounding boundary of its 8-bit quantization, a row moves by
            // up to a few 1e-3. A cache fed at a wrong position moves it by 0.02 to 0.6.
            if family.name != "qwen3" || end == 1 {
                assert!(d < 5e-3, "{} position {}: {d}", family.name, end - 1);
            }
        }
    }
}

#[test]
fn shapes_that_contradict_the_metadata_are_refused_before_any_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path(), &FAMILIES[3], true);
    let e = Decoder::from_gguf(&path)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("blk.0.attn_k.weight") && e.contains("metadata implies 32 × 256"),
        "{e}"
    );
    let mut other = write_model(dir.path(), &FAMILIES[0], false);
    let mut bytes = std::fs::read(&other).unwrap();
    let at = bytes.windows(5).position(|w| w == b"llama").unwrap();
    bytes[at..at + 5].copy_from_slice(b"mamba");
    other.set_file_name("mamba.gguf");
    std::fs::write(&other, bytes).unwrap();
    let e = Decoder::from_gguf(&other)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("\"mamba\" is not supported (supported: llama, qwen2, qwen3, gemma3)"),
        "{e}"
    );
}

/// An end-of-sequence id outside the vocabulary was accepted, and generation
/// never ended naturally. Both backends refuse it by its key.
#[test]
fn a_special_id_outside_the_vocabulary_is_refused_by_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model_with_eos(dir.path(), &FAMILIES[0], false, 4_000_000_000);
    let native = Decoder::from_gguf(&path)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        native.contains("tokenizer.ggml.eos_token_id is 4000000000")
            && native.contains(&format!("vocabulary of {VOCAB} tokens")),
        "{native}"
    );
    let candle = CandleDecoder::from_gguf(&path)
        .err()
        .expect("refused")
        .to_string();
    assert_eq!(candle, native);
    // The last id of the vocabulary is one.
    let last = write_model_with_eos(dir.path(), &FAMILIES[0], false, VOCAB as u32 - 1);
    assert!(Decoder::from_gguf(&last).is_ok());
}

/// Gemma 3 270M Q4_K_M itself (`gemma3-270m`, fetched on first use): its tokenizer rebuilt
/// from the GGUF gives llama.cpp's ids (control tokens included), and greedy decoding after
/// `<bos>` gives llama.cpp's first 11 tokens (llama-cpp-python 0.3.36 on the same file; at the
/// 12th the two pick different tokens of a near tie). Why a longer identical run is not a
/// fair oracle: BENCHMARKS.md, "Gemma 3 270M".
#[test]
fn gemma3_270m_tokenizes_and_continues_as_llama_cpp_does() {
    use infgram::tokenizer::{HfTokenizer, Tokenizer};
    let path = infgram::assets::ensure_model("gemma3-270m").expect("fetch gemma3-270m");
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    assert_eq!(tok.vocab_size(), 262_144);
    let chat =
        "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n";
    assert_eq!(
        tok.encode(chat).unwrap(),
        [105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107]
    );
    let prompt = tok.encode("The capital of France is").unwrap();
    assert_eq!(prompt, [818, 5279, 529, 7001, 563]);
    let mut model = Decoder::from_gguf(&path).unwrap();
    assert_eq!(model.bos_token(), Some(2));
    assert!(model.eos_tokens().contains(&1) && model.eos_tokens().contains(&106));
    let mut fed = vec![2];
    fed.extend(&prompt);
    let mut out = Vec::new();
    let mut rows = model.forward(&fed).unwrap();
    for _ in 0..11 {
        let next = infgram::lm::argmax(rows.last().unwrap());
        out.push(next);
        rows = model.forward(&[next]).unwrap();
    }
    assert_eq!(
        out,
        [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506]
    );
    assert_eq!(
        tok.decode(&out).unwrap(),
        " the capital of the country of France. It is the"
    );
}

mod batch;
mod passes;
