//! The llama family (SmolLM2, Llama 2 and 3, and kin): its description from a GGUF file's
//! `llama.*` metadata. Block features are read from the tensors present too (`rope_freqs`:
//! Llama 3.1's frequency scaling; q/k norms; biases), so a file is run with what it has.

use crate::error::Result;
use crate::neural::arch::{
    heads_of, Activation, Architecture, Embedding, Norm, Rope, RopeScaling, RopeStyle,
};
use crate::neural::load::gguf::Gguf;

/// The llama family's description.
pub fn describe(gguf: &Gguf) -> Result<Architecture> {
    let dim = gguf.usize("llama.embedding_length")?;
    let scaling = if gguf.has("rope_freqs.weight") {
        RopeScaling::Frequencies
    } else {
        match gguf.f32_or("llama.rope.scaling.factor", 1.0) {
            f if f != 1.0 => RopeScaling::Linear(f),
            _ => RopeScaling::None,
        }
    };
    Ok(Architecture {
        name: "llama".into(),
        n_layer: gguf.usize("llama.block_count")?,
        dim,
        heads: heads_of(gguf, "llama", dim)?,
        norm: Norm {
            eps: gguf.f32("llama.attention.layer_norm_rms_epsilon")?,
            weight_offset: 0.0,
        },
        post_norms: false,
        activation: Activation::Silu,
        rope: Rope {
            base: gguf.f32_or("llama.rope.freq_base", 10_000.0),
            scaling,
            style: RopeStyle::Interleaved,
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
