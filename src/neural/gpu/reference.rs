//! [`ReferenceDecoder`]: the GPU pass on the CPU, operation for operation in the order the
//! kernels of `kernels.cu` (and `kernels/`) take them: a matrix row is 32 lanes each chaining fused
//! multiply-adds over its groups of 32 columns, then the warp's butterfly; a norm's sum of
//! squares the same; attention's sums the block's fixed trees and its values summed by the
//! kernel's groups of threads. Weights are dequantized by candle (ggml's arithmetic), which the
//! kernels' `decode32` follows operation for operation.
//!
//! So the kernels can be checked on a GPU against a pass written without them (the only
//! operation whose bits may differ is `exp`: CUDA's `expf` and libm's round differently), and
//! the kernels' plan (the parameters, the slots a tree's rows read, the rotation, the gates)
//! is tested on every machine: batch-invariant by construction, and within the native pass's
//! bound of it.

use crate::error::{Error, Result};
use crate::neural::arch::layers::{rope_frequencies, weights, Backend};
use crate::neural::arch::{Activation, Architecture, RopeStyle};
use crate::neural::gpu::{gpu_type, warp_sum, Pass, RowParams, Sequence, ATT_WARPS, CHUNK, WARP};
use crate::neural::load::gguf::Gguf;
use candle_core::quantized::{GgmlDType, QTensor};
use std::ops::Range;
use std::path::Path;

/// A matrix dequantized, `rows × cols`.
pub struct Matrix {
    values: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl Matrix {
    fn row(&self, r: usize) -> &[f32] {
        &self.values[r * self.cols..(r + 1) * self.cols]
    }
}

/// Dequantizes a file's matrices (re-quantized to Q8_0 first where the kernels would).
struct Dequantize;

impl Dequantize {
    fn of(t: QTensor) -> Result<Matrix> {
        let (rows, cols) = match t.shape().dims() {
            [r, c] => (*r, *c),
            other => return Err(Error::Model(format!("a matrix of shape {other:?}"))),
        };
        let cpu = candle_core::Device::Cpu;
        let t = match gpu_type(t.dtype()) {
            Some(_) => t,
            None => QTensor::quantize(&t.dequantize(&cpu)?, GgmlDType::Q8_0)?,
        };
        let values = t.dequantize(&cpu)?.flatten_all()?.to_vec1()?;
        Ok(Matrix { values, rows, cols })
    }
}

impl Backend for Dequantize {
    type Matrix = Matrix;
    type Vector = Vec<f32>;

    fn matrix(&mut self, gguf: &mut Gguf, name: &str) -> Result<Matrix> {
        Dequantize::of(gguf.tensor(name)?)
    }

    fn shape(m: &Matrix) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn vector(&mut self, values: Vec<f32>) -> Result<Vec<f32>> {
        Ok(values)
    }
}

/// `1 / √(mean square + eps)` of `x` as `warp_inv_rms` forms it.
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; WARP];
    for (e, v) in x.iter().enumerate() {
        lanes[e % WARP] = v.mul_add(*v, lanes[e % WARP]);
    }
    let ss = warp_sum(lanes);
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

/// `row · input` as `row_dot` forms it: lane l chains groups l, l + 32, … of 32 columns.
fn row_dot(row: &[f32], input: &[f32]) -> f32 {
    let mut lanes = [0f32; WARP];
    for (g, (w, x)) in row.chunks_exact(32).zip(input.chunks_exact(32)).enumerate() {
        let acc = &mut lanes[g % WARP];
        for (w, x) in w.iter().zip(x) {
            *acc = w.mul_add(*x, *acc);
        }
    }
    warp_sum(lanes)
}

/// `x` normed as a kernel's input: `x · inv · w`.
fn normed(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let inv = inv_rms(x, eps);
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// `m · input` (+ bias), every row.
fn matvec(m: &Matrix, input: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    (0..m.rows)
        .map(|r| {
            let v = row_dot(m.row(r), input);
            bias.map_or(v, |b| v + b[r])
        })
        .collect()
}

/// One head's attention for one row, in the kernel's order (`attend` in kernels/attention.cu): the
/// positions `first..n` in chunks of [`CHUNK`], warp w of a chunk taking its positions w, w + 8,
/// …; a score is the lanes' chains over their dimensions and the warp's butterfly; the chunk's
/// max, weights, per-warp sums and value chains, the warps added in order; then the chunks
/// combined in order against their max. `key(j)`, `value(j)`: position j's vectors.
fn attend<'a>(
    q: &[f32],
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    (first, n): (usize, usize),
    scale: f32,
) -> Vec<f32> {
    let hd = q.len();
    let mut chunks = Vec::new();
    for start in (first..n).step_by(CHUNK) {
        let end = (start + CHUNK).min(n);
        let warp_positions = |w: usize| (start + w..end).step_by(ATT_WARPS);
        let score = |j: usize| {
            let k = key(j);
            let mut lanes = [0f32; WARP];
            for (l, lane) in lanes.iter_mut().enumerate() {
                *lane = (l..hd)
                    .step_by(WARP)
                    .fold(0f32, |a, e| q[e].mul_add(k[e], a));
            }
            warp_sum(lanes) * scale
        };
        let scores: Vec<Vec<(usize, f32)>> = (0..ATT_WARPS)
            .map(|w| warp_positions(w).map(|j| (j, score(j))).collect())
            .collect();
        let m = scores
            .iter()
            .flatten()
            .fold(f32::NEG_INFINITY, |a, &(_, s)| a.max(s));
        let (mut sum, mut out) = (None::<f32>, vec![None::<f32>; hd]);
        for warp in &scores {
            let (mut s, mut acc) = (0f32, vec![0f32; hd]);
            for &(j, sc) in warp {
                let p = (sc - m).exp();
                s += p;
                for (a, v) in acc.iter_mut().zip(value(j)) {
                    *a = p.mul_add(*v, *a);
                }
            }
            sum = Some(sum.map_or(s, |t| t + s));
            for (o, a) in out.iter_mut().zip(acc) {
                *o = Some(o.map_or(a, |t| t + a));
            }
        }
        let out: Vec<f32> = out.into_iter().map(|o| o.unwrap_or(0.0)).collect();
        chunks.push((m, sum.unwrap_or(0.0), out));
    }
    let big_m = chunks
        .iter()
        .fold(f32::NEG_INFINITY, |a, (m, _, _)| a.max(*m));
    // Each chunk's factor against the max (the kernel forms it where it is used: the same bits).
    let factors: Vec<f32> = chunks.iter().map(|(m, _, _)| (m - big_m).exp()).collect();
    let total = chunks
        .iter()
        .zip(&factors)
        .fold(0f32, |a, ((_, s, _), f)| a + s * f);
    (0..hd)
        .map(|d| {
            chunks
                .iter()
                .zip(&factors)
                .fold(0f32, |a, ((_, _, o), f)| a + o[d] * f)
                / total
        })
        .collect()
}

/// A layer: weights, and its cache (`n_kv_head` vectors of `slots × head_dim`).
struct Layer {
    w: crate::neural::arch::layers::Layer<Matrix, Vec<f32>>,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

/// The GPU pass on the CPU (see the module's docs).
pub struct ReferenceDecoder {
    cfg: Architecture,
    embeddings: Matrix,
    output: Option<Matrix>,
    norm: Vec<f32>,
    layers: Vec<Layer>,
    freqs: Vec<Vec<f32>>,
    /// The last pass's rows of logits, until [`Pass::rows`] hands them out.
    logits: Vec<Vec<f32>>,
    /// Sequences it holds ([`Pass::rooms`]).
    rooms: usize,
}

impl ReferenceDecoder {
    /// Loads a GGUF file (its matrices dequantized: several times the file's size in memory).
    pub fn load(path: &Path) -> Result<Sequence<Self>> {
        let mut gguf = Gguf::open(path)?;
        let cfg = crate::neural::arch::describe(&gguf)?;
        crate::neural::arch::check_blocks(&gguf, &cfg)?;
        crate::neural::gpu::check_shapes(&cfg)?;
        let embeddings = Dequantize::of(gguf.tensor("token_embd.weight")?)?;
        let output = match gguf.has("output.weight") {
            true => Some(Dequantize.matrix(&mut gguf, "output.weight")?),
            false => None,
        };
        let nkv = cfg.heads.n_kv_head;
        let layers = crate::neural::arch::layers::layers(&mut gguf, &cfg, &mut Dequantize)?
            .into_iter()
            .map(|w| Layer {
                w,
                keys: vec![Vec::new(); nkv],
                values: vec![Vec::new(); nkv],
            })
            .collect();
        let norm = weights(
            &mut gguf,
            "output_norm.weight",
            cfg.dim,
            cfg.norm.weight_offset,
        )?;
        let freqs = rope_frequencies(&mut gguf, &cfg)?;
        Ok(Sequence::new(ReferenceDecoder {
            cfg,
            embeddings,
            output,
            norm,
            layers,
            freqs,
            logits: Vec::new(),
            rooms: 1,
        }))
    }
}

impl Pass for ReferenceDecoder {
    fn architecture(&self) -> &Architecture {
        &self.cfg
    }

    fn vocab(&self) -> usize {
        self.embeddings.rows
    }

    /// One pass, as the kernels run it.
    fn run(&mut self, params: &[i32], tokens: &[u32]) -> Result<()> {
        let cfg = &self.cfg;
        let (t, eps) = (tokens.len(), cfg.norm.eps);
        let heads = cfg.heads;
        let (nh, nkv, hd) = (heads.n_head, heads.n_kv_head, heads.head_dim);
        let row = |i: usize| RowParams::new(params, i);
        let position = |i: usize| row(i).position();
        let mut x: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&tok| {
                let row = self.embeddings.row(tok as usize);
                match cfg.embedding.scale {
                    Some(s) if s != 0.0 => row.iter().map(|v| v * s).collect(),
                    _ => row.to_vec(),
                }
            })
            .collect();
        let end = (0..t).map(|i| row(i).slot() + 1).max().unwrap_or(0);
        for layer in &mut self.layers {
            for kv in layer.keys.iter_mut().chain(layer.values.iter_mut()) {
                if kv.len() < end * hd {
                    kv.resize(end * hd, 0.0);
                }
            }
            let w = &layer.w;
            let mut attended = Vec::with_capacity(t);
            // q, k, v of every row, then the cache writes (the kernels' launch order).
            let mut qs = Vec::with_capacity(t);
            for (i, xi) in x.iter().enumerate() {
                let h = normed(xi, &w.attn_norm, eps);
                let b = |n: usize| w.biases.as_ref().map(|b| b[n].as_slice());
                let mut q = matvec(&w.wq, &h, b(0));
                let mut k = matvec(&w.wk, &h, b(1));
                let v = matvec(&w.wv, &h, b(2));
                let (qn, kn) = match &w.qk_norms {
                    Some([q, k]) => (Some(q.as_slice()), Some(k.as_slice())),
                    None => (None, None),
                };
                let freqs = &self.freqs[w.rope];
                let p = position(i);
                for head in q.chunks_exact_mut(hd) {
                    rotate(head, qn, eps, freqs, p, cfg.rope.style);
                }
                for head in k.chunks_exact_mut(hd) {
                    rotate(head, kn, eps, freqs, p, cfg.rope.style);
                }
                let slot = row(i).slot();
                for kh in 0..nkv {
                    layer.keys[kh][slot * hd..(slot + 1) * hd]
                        .copy_from_slice(&k[kh * hd..(kh + 1) * hd]);
                    layer.values[kh][slot * hd..(slot + 1) * hd]
                        .copy_from_slice(&v[kh * hd..(kh + 1) * hd]);
                }
                qs.push(q);
            }
            let scale = 1.0 / (hd as f32).sqrt();
            for (i, q) in qs.iter().enumerate() {
                let n = position(i) + 1;
                let first = w.window.map_or(0, |win| n.saturating_sub(win));
                let mut out = vec![0f32; nh * hd];
                for h in 0..nh {
                    let kh = h / (nh / nkv);
                    let (keys, values) = (&layer.keys[kh], &layer.values[kh]);
                    let at = |j: usize| row(i).slot_of(j) * hd;
                    let head = attend(
                        &q[h * hd..(h + 1) * hd],
                        |j| &keys[at(j)..at(j) + hd],
                        |j| &values[at(j)..at(j) + hd],
                        (first, n),
                        scale,
                    );
                    out[h * hd..(h + 1) * hd].copy_from_slice(&head);
                }
                attended.push(out);
            }
            for (xi, att) in x.iter_mut().zip(&attended) {
                let y = matvec(&w.wo, att, None);
                add_block(xi, &y, w.post_norms.as_ref().map(|p| p[0].as_slice()), eps);
                let h = normed(xi, &w.ffn_norm, eps);
                let gate = matvec(&w.w_gate, &h, None);
                let up = matvec(&w.w_up, &h, None);
                let act: Vec<f32> = gate
                    .iter()
                    .zip(&up)
                    .map(|(&g, &u)| gated(cfg.activation, g, u))
                    .collect();
                let y = matvec(&w.w_down, &act, None);
                add_block(xi, &y, w.post_norms.as_ref().map(|p| p[1].as_slice()), eps);
            }
        }
        let output = self.output.as_ref().unwrap_or(&self.embeddings);
        self.logits = x
            .iter()
            .map(|xi| matvec(output, &normed(xi, &self.norm, eps), None))
            .collect();
        Ok(())
    }

    fn rows(&mut self, rows: Range<usize>) -> Result<Vec<Vec<f32>>> {
        self.logits
            .get_mut(rows)
            .map(|r| r.iter_mut().map(std::mem::take).collect())
            .ok_or_else(|| Error::Model("rows past the last pass's".into()))
    }

    fn picks(&mut self, rows: Range<usize>) -> Result<Vec<Option<(u32, f32)>>> {
        Ok(self
            .rows(rows)?
            .iter()
            .map(|row| crate::lm::greedy_pick(row))
            .collect())
    }

    fn move_slots(&mut self, from: &[usize], to: usize) -> Result<()> {
        let hd = self.cfg.heads.head_dim;
        let end = (to + from.len()).max(from.iter().map(|&f| f + 1).max().unwrap_or(0));
        for layer in &mut self.layers {
            for kv in layer.keys.iter_mut().chain(layer.values.iter_mut()) {
                if kv.len() < end * hd {
                    kv.resize(end * hd, 0.0);
                }
                for (i, &f) in from.iter().enumerate() {
                    let (from, to) = (f * hd, (to + i) * hd);
                    kv.copy_within(from..from + hd, to);
                }
            }
        }
        Ok(())
    }

    fn rooms(&self) -> usize {
        self.rooms
    }

    /// The reference's cache grows as slots are written: rooms are only counted.
    fn add_rooms(&mut self, rooms: usize) -> Result<()> {
        self.rooms = self.rooms.max(rooms);
        Ok(())
    }
}

/// `x += y`, or `x += rms_norm(y) · w` after the block (Gemma's `norm_add`).
fn add_block(x: &mut [f32], y: &[f32], post: Option<&[f32]>, eps: f32) {
    match post {
        Some(w) => {
            let inv = inv_rms(y, eps);
            for ((x, y), w) in x.iter_mut().zip(y).zip(w) {
                *x += y * inv * w;
            }
        }
        None => x.iter_mut().zip(y).for_each(|(x, y)| *x += y),
    }
}

/// `act(g) · u` as `gated` forms it: `g / (1 + e^(−arg)) · u`.
fn gated(activation: Activation, g: f32, u: f32) -> f32 {
    let a = match activation {
        Activation::Silu => g,
        Activation::GeluTanh => g * (1.595_769_2 + (1.595_769_2f32 * 0.044_715) * (g * g)),
    };
    g / (1.0 + (-a).exp()) * u
}

/// A head normed (when `norm`) and rotated to position `p`, as `rope_cache` does it.
fn rotate(
    head: &mut [f32],
    norm: Option<&[f32]>,
    eps: f32,
    freqs: &[f32],
    p: usize,
    style: RopeStyle,
) {
    let half = head.len() / 2;
    let inv = norm.map(|_| inv_rms(head, eps));
    for (i, &f) in freqs.iter().enumerate().take(half) {
        let angle = p as f32 * f;
        let (c, s) = (angle.cos(), angle.sin());
        let (ai, bi) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Halves => (i, i + half),
        };
        let (mut a, mut b) = (head[ai], head[bi]);
        if let (Some(w), Some(inv)) = (norm, inv) {
            a = a * inv * w[ai];
            b = b * inv * w[bi];
        }
        head[ai] = a * c - b * s;
        head[bi] = a * s + b * c;
    }
}
