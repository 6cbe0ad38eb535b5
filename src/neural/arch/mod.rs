//! Architectures: what a model family's blocks are, as data ([`Architecture`]: norms,
//! activation, rotary embedding and its scaling, q/k norms, biases, sliding-window layers, tied
//! or scaled embeddings), read from a GGUF file's metadata by the family's own `describe`
//! function ([`ARCHITECTURES`]), and the forward pass that runs a description on the CPU
//! backend ([`llama::Llama`]).
//!
//! Adding an architecture is a file here with its `describe`, a row of [`ARCHITECTURES`], and
//! a test against a reference implementation; the pass refuses, by name, any block feature it
//! does not run yet ([`Architecture::unsupported_by_native`]) rather than computing something
//! else.

pub mod llama;
pub mod weights;

use crate::error::Result;
use crate::neural::cpu::attention::Heads;
use crate::neural::load::gguf::Gguf;

/// The normalization before each block (RMS norm in every family infgram reads).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Norm {
    /// ε inside the square root.
    pub eps: f32,
    /// Added to the stored weights (Gemma stores `w − 1`: 1.0; llama: 0.0).
    pub weight_offset: f32,
}

/// The feed-forward block's gate activation (`act(gate) · up`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (llama, Qwen).
    Silu,
    /// GELU, tanh approximation (Gemma).
    GeluTanh,
}

/// How rotary angles are scaled beyond the trained context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// None: `θ_i = base^(−2i/d)`.
    None,
    /// Positions divided by a factor (linear scaling).
    Linear(f32),
    /// Per-frequency factors stored in the file (`rope_freqs.weight`: Llama 3.1's scaling).
    Frequencies,
}

/// The rotary position embedding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// The base of the angles.
    pub base: f32,
    /// Scaling beyond the trained context.
    pub scaling: RopeScaling,
}

/// Layers that attend to a window of recent positions only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Positions a windowed layer sees.
    pub size: usize,
    /// Every this-many-th layer attends globally (Gemma 3: 6); the others are windowed.
    pub global_every: usize,
}

/// The token embeddings and the output projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Embedding {
    /// The output projection is the embedding matrix (no `output.weight`).
    pub tied: bool,
    /// Embeddings are multiplied by this (Gemma: √dim).
    pub scale: Option<f32>,
}

/// One model family's decoder, described: everything a forward pass needs beyond the tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Architecture {
    /// The family (`general.architecture`).
    pub name: String,
    /// Blocks.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub dim: usize,
    /// Attention heads and their width.
    pub heads: Heads,
    /// The norm before each block (and at the end).
    pub norm: Norm,
    /// The feed-forward gate's activation.
    pub activation: Activation,
    /// The rotary embedding.
    pub rope: Rope,
    /// Queries and keys are RMS-normed per head before the rotation (Qwen 3, Gemma 3).
    pub qk_norm: bool,
    /// The q, k, v projections have biases (Qwen 2).
    pub attention_bias: bool,
    /// Windowed layers, if any.
    pub sliding_window: Option<SlidingWindow>,
    /// The embeddings.
    pub embedding: Embedding,
    /// End-of-sequence ids.
    pub eos: Vec<u32>,
}

/// Reads one family's description from a GGUF file's metadata.
pub type Describe = fn(&Gguf) -> Result<Architecture>;

/// The families infgram reads, each with the function that reads its description.
pub const ARCHITECTURES: &[(&str, Describe)] = &[("llama", llama::describe)];

/// The description of the model in `gguf`; a family not in [`ARCHITECTURES`] is refused by
/// name.
pub fn describe(gguf: &Gguf) -> Result<Architecture> {
    let name = gguf.architecture()?;
    match ARCHITECTURES.iter().find(|(family, _)| *family == name) {
        Some((_, describe)) => describe(gguf),
        None => {
            let known: Vec<&str> = ARCHITECTURES.iter().map(|(f, _)| *f).collect();
            Err(gguf.error(format!(
                "architecture {name:?} is not supported (supported: {})",
                known.join(", ")
            )))
        }
    }
}

impl Architecture {
    /// The block features of this description that infgram's forward passes do not run yet
    /// (empty: the model runs). Named so that a refusal says what is missing.
    pub fn unsupported_by_native(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.norm.weight_offset != 0.0 {
            missing.push("offset norm weights");
        }
        if self.activation != Activation::Silu {
            missing.push("a GELU feed-forward");
        }
        if self.rope.scaling != RopeScaling::None {
            missing.push("rotary scaling");
        }
        if self.qk_norm {
            missing.push("q/k norms");
        }
        if self.attention_bias {
            missing.push("attention biases");
        }
        if self.sliding_window.is_some() {
            missing.push("sliding-window layers");
        }
        if self.embedding.scale.is_some() {
            missing.push("scaled embeddings");
        }
        missing
    }

    /// `Ok` when the passes run every feature of the description, else an error naming the
    /// features they lack.
    pub fn check_runnable(&self, gguf: &Gguf) -> Result<()> {
        let missing = self.unsupported_by_native();
        if missing.is_empty() {
            return Ok(());
        }
        Err(gguf.error(format!(
            "this {} model uses {}, which infgram's forward passes do not run yet",
            self.name,
            missing.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    /// A GGUF file of `metadata` and one small f32 tensor per name in `tensors`.
    fn gguf(dir: &std::path::Path, metadata: &[(&str, Value)], tensors: &[&str]) -> Gguf {
        let path = dir.join("m.gguf");
        let qt: Vec<(String, QTensor)> = tensors
            .iter()
            .map(|n| {
                let t = Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
                (
                    n.to_string(),
                    QTensor::quantize(&t, candle_core::quantized::GgmlDType::F32).unwrap(),
                )
            })
            .collect();
        let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let ts: Vec<(&str, &QTensor)> = qt.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut f = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut f, &md, &ts).unwrap();
        Gguf::open(&path).unwrap()
    }

    fn llama_metadata() -> Vec<(&'static str, Value)> {
        vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.attention.head_count", Value::U32(4)),
            ("llama.attention.head_count_kv", Value::U32(2)),
            ("llama.embedding_length", Value::U32(64)),
            ("llama.block_count", Value::U32(3)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ]
    }

    /// A llama file is described from its metadata and tensors; a family infgram does not
    /// read, and a llama file with a block feature the passes do not run, are refused by name.
    #[test]
    fn descriptions_name_what_they_cannot_run() {
        let t = tempfile::tempdir().unwrap();
        let file = gguf(t.path(), &llama_metadata(), &["token_embd.weight"]);
        let arch = describe(&file).unwrap();
        assert_eq!(
            arch.heads,
            Heads {
                n_head: 4,
                n_kv_head: 2,
                head_dim: 16
            }
        );
        assert_eq!((arch.n_layer, arch.dim), (3, 64));
        assert_eq!(
            arch.rope,
            Rope {
                base: 10_000.0,
                scaling: RopeScaling::None
            }
        );
        assert!(arch.embedding.tied && !arch.qk_norm && !arch.attention_bias);
        assert!(arch.check_runnable(&file).is_ok());

        let with_norms = gguf(
            t.path(),
            &llama_metadata(),
            &[
                "token_embd.weight",
                "blk.0.attn_q_norm.weight",
                "rope_freqs.weight",
            ],
        );
        let arch = describe(&with_norms).unwrap();
        assert!(arch.qk_norm);
        assert_eq!(arch.rope.scaling, RopeScaling::Frequencies);
        let e = arch.check_runnable(&with_norms).unwrap_err().to_string();
        assert!(
            e.contains("q/k norms") && e.contains("rotary scaling"),
            "{e}"
        );

        let mut qwen = llama_metadata();
        qwen[0].1 = Value::String("qwen3".into());
        let e = describe(&gguf(t.path(), &qwen, &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"qwen3\" is not supported (supported: llama)"),
            "{e}"
        );

        let mut bad = llama_metadata();
        bad[2].1 = Value::U32(3);
        let e = describe(&gguf(t.path(), &bad, &[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("do not divide"), "{e}");
    }
}
