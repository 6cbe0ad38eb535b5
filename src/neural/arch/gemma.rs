//! The Gemma 3 family: GeGLU feed-forward blocks, norms before and after each block, q/k
//! norms, five sliding-window layers (rotary base 10,000) to each global one (rotary base
//! from the file, 10⁶), embeddings scaled by √dim and tied to the output, from `gemma3.*`
//! metadata. llama.cpp's converter stores the norms' weights with Gemma's `1 +` already added,
//! so they are used as they are.

use crate::error::Result;
use crate::neural::arch::{
    heads_of, Activation, Architecture, Embedding, Norm, Rope, RopeScaling, RopeStyle,
    SlidingWindow,
};
use crate::neural::load::gguf::Gguf;

/// Every this-many-th Gemma 3 layer is global (llama.cpp and the reference implementation
/// hard-code it; files do not state it).
const GLOBAL_EVERY: usize = 6;

/// The rotary base of Gemma 3's windowed layers.
const LOCAL_ROPE_BASE: f32 = 10_000.0;

/// Gemma 3's description.
pub fn describe(gguf: &Gguf) -> Result<Architecture> {
    let dim = gguf.usize("gemma3.embedding_length")?;
    let window = gguf.usize("gemma3.attention.sliding_window")?;
    if window == 0 {
        return Err(gguf.error("a sliding window of 0 positions"));
    }
    let scaling = match gguf.f32_or("gemma3.rope.scaling.factor", 1.0) {
        f if f != 1.0 => RopeScaling::Linear(f),
        _ => RopeScaling::None,
    };
    Ok(Architecture {
        name: "gemma3".into(),
        n_layer: gguf.usize("gemma3.block_count")?,
        dim,
        heads: heads_of(gguf, "gemma3", dim)?,
        norm: Norm {
            eps: gguf.f32("gemma3.attention.layer_norm_rms_epsilon")?,
            weight_offset: 0.0,
        },
        post_norms: true,
        activation: Activation::GeluTanh,
        rope: Rope {
            base: gguf.f32_or("gemma3.rope.freq_base", 1_000_000.0),
            scaling,
            style: RopeStyle::Halves,
        },
        qk_norm: true,
        attention_bias: false,
        sliding_window: Some(SlidingWindow {
            size: window,
            global_every: GLOBAL_EVERY,
            local_base: gguf.f32_or("gemma3.rope.local_freq_base", LOCAL_ROPE_BASE),
        }),
        embedding: Embedding {
            tied: !gguf.has("output.weight"),
            scale: Some((dim as f32).sqrt()),
        },
        eos: gemma_eos(gguf),
        bos: gguf.bos_id(),
    })
}

/// The file's end token and `<end_of_turn>` (an instruction-tuned Gemma ends its turn with
/// it, not with `<eos>`).
fn gemma_eos(gguf: &Gguf) -> Vec<u32> {
    let mut eos = gguf.eos_ids();
    if let Some(id) = gguf.token_id("<end_of_turn>") {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    eos
}
