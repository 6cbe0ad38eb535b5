//! One assembly of a model's layers from its description, for both backends: which tensors a
//! block reads (by their GGUF names), which of them a family has (q/k/v biases, q/k norms,
//! norms after the blocks), the shape each must have, which layers are windowed and which
//! rotary table each uses. A backend says only what it makes of a tensor ([`Backend`]: a
//! matrix in its own form, a vector of weights), so the native pass and the candle pass read
//! a file alike and refuse the same inconsistent files.

use crate::error::Result;
use crate::neural::arch::{Architecture, Rope, RopeScaling};
use crate::neural::load::gguf::Gguf;

/// What a backend makes of a file's tensors.
pub trait Backend {
    /// A weight matrix in the backend's form.
    type Matrix;
    /// A vector of weights (a norm, a bias) in the backend's form.
    type Vector;
    /// Reads the matrix `name`.
    fn matrix(&mut self, gguf: &mut Gguf, name: &str) -> Result<Self::Matrix>;
    /// Its shape: output rows × input columns.
    fn shape(matrix: &Self::Matrix) -> (usize, usize);
    /// A vector of weights from its values.
    fn vector(&mut self, values: Vec<f32>) -> Result<Self::Vector>;
}

/// One block's weights, and where the block sits.
pub struct Layer<M, V> {
    /// The attention's projections: queries, keys, values, output.
    pub wq: M,
    pub wk: M,
    pub wv: M,
    pub wo: M,
    /// The feed-forward block's matrices: `down(act(gate · x) · (up · x))`.
    pub w_gate: M,
    pub w_up: M,
    pub w_down: M,
    /// The norms before the attention and the feed-forward blocks.
    pub attn_norm: V,
    pub ffn_norm: V,
    /// q, k and v biases (Qwen 2).
    pub biases: Option<[V; 3]>,
    /// Per-head norms of q and k (Qwen 3, Gemma 3), `head_dim` weights each.
    pub qk_norms: Option<[V; 2]>,
    /// Norms of the attention and feed-forward outputs (Gemma).
    pub post_norms: Option<[V; 2]>,
    /// The positions this layer sees (a sliding window), if not all.
    pub window: Option<usize>,
    /// Which rotary table it uses ([`rope_frequencies`]): 0 global, 1 the windowed layers'.
    pub rope: usize,
}

/// Every block of the model at `gguf`, described by `cfg`, in `backend`'s form; a matrix or
/// vector whose shape contradicts the description is refused, naming the tensor.
pub fn layers<B: Backend>(
    gguf: &mut Gguf,
    cfg: &Architecture,
    backend: &mut B,
) -> Result<Vec<Layer<B::Matrix, B::Vector>>> {
    let (dim, heads, offset) = (cfg.dim, cfg.heads, cfg.norm.weight_offset);
    let (q_width, kv_width) = (heads.q_width(), heads.kv_width());
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for i in 0..cfg.n_layer {
        let name = |n: &str| format!("blk.{i}.{n}.weight");
        // A matrix, checked to be rows × dim (`wide`: dim × rows).
        let mut m = |g: &mut Gguf, n: &str, rows: Option<usize>, wide: bool| -> Result<B::Matrix> {
            let matrix = backend.matrix(g, &name(n))?;
            let got = B::shape(&matrix);
            let rows = rows.unwrap_or(if wide { got.1 } else { got.0 });
            let want = if wide { (dim, rows) } else { (rows, dim) };
            check_shape(g, &name(n), got, want)?;
            Ok(matrix)
        };
        let wq = m(gguf, "attn_q", Some(q_width), false)?;
        let wk = m(gguf, "attn_k", Some(kv_width), false)?;
        let wv = m(gguf, "attn_v", Some(kv_width), false)?;
        let wo = m(gguf, "attn_output", Some(q_width), true)?;
        // The feed-forward width is the gate's.
        let w_gate = m(gguf, "ffn_gate", None, false)?;
        let ffn = B::shape(&w_gate).0;
        let w_up = m(gguf, "ffn_up", Some(ffn), false)?;
        let w_down = m(gguf, "ffn_down", Some(ffn), true)?;
        let mut vector = |g: &mut Gguf, name: String, len: usize, offset: f32| {
            backend.vector(weights(g, &name, len, offset)?)
        };
        let attn_norm = vector(gguf, name("attn_norm"), dim, offset)?;
        let ffn_norm = vector(gguf, name("ffn_norm"), dim, offset)?;
        let qk_norms = match cfg.qk_norm {
            true => Some([
                vector(gguf, name("attn_q_norm"), heads.head_dim, offset)?,
                vector(gguf, name("attn_k_norm"), heads.head_dim, offset)?,
            ]),
            false => None,
        };
        let post_norms = match cfg.post_norms {
            true => Some([
                vector(gguf, name("post_attention_norm"), dim, offset)?,
                vector(gguf, name("post_ffw_norm"), dim, offset)?,
            ]),
            false => None,
        };
        let biases = match cfg.attention_bias {
            true => {
                let bias = |n: &str| format!("blk.{i}.{n}.bias");
                Some([
                    vector(gguf, bias("attn_q"), q_width, 0.0)?,
                    vector(gguf, bias("attn_k"), kv_width, 0.0)?,
                    vector(gguf, bias("attn_v"), kv_width, 0.0)?,
                ])
            }
            false => None,
        };
        let windowed = cfg.sliding_window.filter(|w| w.windowed(i));
        layers.push(Layer {
            wq,
            wk,
            wv,
            wo,
            w_gate,
            w_up,
            w_down,
            attn_norm,
            ffn_norm,
            biases,
            qk_norms,
            post_norms,
            window: windowed.map(|w| w.size),
            rope: usize::from(windowed.is_some()),
        });
    }
    Ok(layers)
}

/// Refuses the matrix `name` of shape `got` (rows × columns) where the description implies
/// `want`, before any pass runs.
pub fn check_shape(
    gguf: &Gguf,
    name: &str,
    got: (usize, usize),
    want: (usize, usize),
) -> Result<()> {
    if got == want {
        return Ok(());
    }
    Err(gguf.error(format!(
        "tensor {name} is {} × {} where the metadata implies {} × {}; the file is inconsistent",
        got.0, got.1, want.0, want.1
    )))
}

/// The values of the vector `name` (dequantized on the CPU), `offset` added to each, checked
/// to be `len` long.
pub fn weights(gguf: &mut Gguf, name: &str, len: usize, offset: f32) -> Result<Vec<f32>> {
    let mut w: Vec<f32> = gguf
        .tensor(name)?
        .dequantize(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1()?;
    if w.len() != len {
        return Err(gguf.error(format!(
            "tensor {name} has {} weights where the metadata implies {len}",
            w.len()
        )));
    }
    if offset != 0.0 {
        w.iter_mut().for_each(|v| *v += offset);
    }
    Ok(w)
}

/// The angle per position of each pair of a head's dimensions, for each rotary table a layer
/// names ([`Layer::rope`]): the description's (scaled by the file's `rope_freqs.weight` where
/// it says so), then, with sliding windows, the windowed layers' base.
pub fn rope_frequencies(gguf: &mut Gguf, cfg: &Architecture) -> Result<Vec<Vec<f32>>> {
    let head_dim = cfg.heads.head_dim;
    let factors = match cfg.rope.scaling {
        RopeScaling::Frequencies => Some(weights(gguf, "rope_freqs.weight", head_dim / 2, 0.0)?),
        _ => None,
    };
    let mut tables = vec![cfg.rope.frequencies(head_dim, factors.as_deref())];
    if let Some(w) = cfg.sliding_window {
        let local = Rope {
            base: w.local_base,
            scaling: RopeScaling::None,
            ..cfg.rope
        };
        tables.push(local.frequencies(head_dim, None));
    }
    Ok(tables)
}
