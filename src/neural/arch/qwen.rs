//! The Qwen 2 and Qwen 3 families: llama blocks with the rotary pairs in halves, biases on
//! q, k and v (Qwen 2, 2.5) or per-head RMS norms of q and k (Qwen 3), from `qwen2.*` /
//! `qwen3.*` metadata.

use crate::error::Result;
use crate::neural::arch::{
    heads_of, Activation, Architecture, Embedding, Norm, Rope, RopeScaling, RopeStyle,
};
use crate::neural::load::gguf::Gguf;

fn describe(gguf: &Gguf, family: &str) -> Result<Architecture> {
    let key = |k: &str| format!("{family}.{k}");
    let dim = gguf.usize(&key("embedding_length"))?;
    Ok(Architecture {
        name: family.into(),
        n_layer: gguf.usize(&key("block_count"))?,
        dim,
        heads: heads_of(gguf, family, dim)?,
        norm: Norm {
            eps: gguf.f32(&key("attention.layer_norm_rms_epsilon"))?,
            weight_offset: 0.0,
        },
        post_norms: false,
        activation: Activation::Silu,
        rope: Rope {
            base: gguf.f32_or(&key("rope.freq_base"), 1_000_000.0),
            scaling: RopeScaling::None,
            style: RopeStyle::Halves,
        },
        qk_norm: gguf.has("blk.0.attn_q_norm.weight"),
        attention_bias: gguf.has("blk.0.attn_q.bias"),
        sliding_window: None,
        embedding: Embedding {
            tied: !gguf.has("output.weight"),
            scale: None,
        },
        eos: gguf.eos_ids(),
        bos: gguf.bos_id(),
    })
}

/// Qwen 2 and 2.5 (q, k, v biases).
pub fn describe_qwen2(gguf: &Gguf) -> Result<Architecture> {
    describe(gguf, "qwen2")
}

/// Qwen 3 (q and k normed per head).
pub fn describe_qwen3(gguf: &Gguf) -> Result<Architecture> {
    describe(gguf, "qwen3")
}
