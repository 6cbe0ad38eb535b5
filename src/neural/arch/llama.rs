//! The llama architecture (SmolLM2 and kin): its description from a GGUF file's metadata
//! ([`describe`]) and the forward pass on infgram's own CPU kernels ([`Llama`]).
//!
//! This is the forward pass the runtime uses. Matrices stay in the file's Q4_1 (or Q8_0)
//! blocks and are multiplied by [`crate::neural::cpu::kernels`], which reuse each weight block across the
//! rows of a verification pass; everything else (RMS norm, rotary embedding, attention over the
//! KV cache, SiLU) is plain Rust on f32 rows. Each position is computed by the same operations
//! in the same order whether it is fed alone or in a batch, so incremental decoding, a k-token
//! pass and a full pass give bit-identical logits. [`crate::neural::candle::llama::CandleLlama`] is the
//! candle-ops reference this one is tested against.

use crate::error::{Error, Result};
use crate::lm::{LanguageModel, Logits};
use crate::neural::arch::weights::to_matrix;
use crate::neural::arch::{
    Activation, Architecture, Embedding, Norm, Rope, RopeScaling, SlidingWindow,
};
use crate::neural::cpu::attention::Heads;
use crate::neural::cpu::attention::{attend, KvCache};
use crate::neural::cpu::kernels::{matmul, matmul_many, Isa, QMatrix, QRows};
use crate::neural::cpu::pool::{split_mut, stretches, Pool};
use crate::neural::cpu::silu::silu_mul;
use crate::neural::load::gguf::{model_err, Gguf};
use candle_core::quantized::GgmlDType;
use std::path::Path;

struct Layer {
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    wo: QMatrix,
    w_gate: QMatrix,
    w_up: QMatrix,
    w_down: QMatrix,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    cache: KvCache,
}

/// The activations of a pass, `rows × width` floats each, kept from pass to pass: allocating
/// them per layer cost the thread that runs the pass about 5% of its time in `malloc` and
/// `free` while the pool's other threads waited.
#[derive(Default)]
struct Scratch {
    /// The residual stream.
    x: Vec<f32>,
    /// `x` RMS-normalized.
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attended: Vec<f32>,
    /// An output of the attention or feed-forward block, before it joins `x`.
    projected: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// `silu(gate) · up`.
    act: Vec<f32>,
}

/// A quantized llama model loaded from GGUF, run on infgram's kernels.
pub struct Llama {
    cfg: Architecture,
    isa: Isa,
    pool: Pool,
    /// Token embeddings, also the output projection when the file ties them (SmolLM2 does).
    embeddings: QMatrix,
    output: Option<QMatrix>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `cos`/`sin` of the rotary angles, `positions × head_dim/2`, grown on demand.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    cached: usize,
    /// Reused buffer for quantized activations.
    acts: QRows,
    /// Reused buffers of a pass's activations.
    scratch: Scratch,
    /// The last pass's final-normed rows whose logits are still to come
    /// ([`LanguageModel::score_more`]), `dim` floats each, from row `held_next` of it on.
    held: Vec<f32>,
    held_next: usize,
}

fn vector(gguf: &mut Gguf, name: &str) -> Result<Vec<f32>> {
    Ok(gguf
        .tensor(name)?
        .dequantize(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1()?)
}

/// The llama family's description from its GGUF metadata (`llama.*` keys). Block
/// features are read from the tensors present too, so a file that has q/k norms or biases is
/// described as having them (and refused by the pass) rather than run without them.
pub fn describe(gguf: &Gguf) -> Result<Architecture> {
    let (n_head, dim) = (
        gguf.usize("llama.attention.head_count")?,
        gguf.usize("llama.embedding_length")?,
    );
    if n_head == 0 || dim % n_head != 0 {
        return Err(gguf.error(format!("{n_head} heads do not divide the width {dim}")));
    }
    let n_kv_head = gguf.usize("llama.attention.head_count_kv")?;
    if n_kv_head == 0 || n_head % n_kv_head != 0 {
        return Err(gguf.error(format!(
            "{n_kv_head} key/value heads do not divide {n_head} query heads"
        )));
    }
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
        heads: Heads {
            n_head,
            n_kv_head,
            head_dim: dim / n_head,
        },
        norm: Norm {
            eps: gguf.f32("llama.attention.layer_norm_rms_epsilon")?,
            weight_offset: 0.0,
        },
        activation: Activation::Silu,
        rope: Rope {
            base: gguf.f32_or("llama.rope.freq_base", 10_000.0),
            scaling,
        },
        qk_norm: gguf.has("blk.0.attn_q_norm.weight"),
        attention_bias: gguf.has("blk.0.attn_q.bias"),
        sliding_window: None::<SlidingWindow>,
        embedding: Embedding {
            tied: !gguf.has("output.weight"),
            scale: None,
        },
        eos: gguf.eos_ids(),
    })
}

impl Llama {
    /// Loads a llama-architecture GGUF file, keeping its Q4_1/Q8_0 blocks.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        Self::load(path, None)
    }

    /// Loads a GGUF file; `requantize` may be Q8_0 (every matrix re-quantized through f32).
    pub fn load(path: &Path, requantize: Option<GgmlDType>) -> Result<Self> {
        let requant = match requantize {
            None => false,
            Some(GgmlDType::Q8_0) => true,
            Some(other) => {
                return Err(Error::input(format!(
                    "the native runtime re-quantizes to q8_0 only, not {other:?}"
                )))
            }
        };
        let mut gguf = Gguf::open(path)?;
        let cfg = super::describe(&gguf)?;
        cfg.check_runnable(&gguf)?;
        let matrix = |gguf: &mut Gguf, name: &str| -> Result<QMatrix> {
            let t = gguf.tensor(name)?;
            to_matrix(path, name, t, requant)
        };
        let embeddings = matrix(&mut gguf, "token_embd.weight")?;
        let output = if gguf.has("output.weight") {
            Some(matrix(&mut gguf, "output.weight")?)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let mut m = |n: &str| matrix(&mut gguf, &format!("blk.{i}.{n}.weight"));
            layers.push(Layer {
                wq: m("attn_q")?,
                wk: m("attn_k")?,
                wv: m("attn_v")?,
                wo: m("attn_output")?,
                w_gate: m("ffn_gate")?,
                w_up: m("ffn_up")?,
                w_down: m("ffn_down")?,
                attn_norm: vector(&mut gguf, &format!("blk.{i}.attn_norm.weight"))?,
                ffn_norm: vector(&mut gguf, &format!("blk.{i}.ffn_norm.weight"))?,
                cache: KvCache::new(cfg.heads.n_kv_head, cfg.heads.head_dim),
            });
        }
        let norm = vector(&mut gguf, "output_norm.weight")?;
        let kv_dim = cfg.heads.kv_width();
        if layers[0].wq.rows() != cfg.heads.q_width() || layers[0].wk.rows() != kv_dim {
            return Err(model_err(
                path,
                "attention shapes disagree with the metadata",
            ));
        }
        Ok(Llama {
            cfg,
            isa: Isa::detect(),
            pool: Pool::new(1),
            embeddings,
            output,
            layers,
            norm,
            rope_cos: Vec::new(),
            rope_sin: Vec::new(),
            cached: 0,
            acts: QRows::default(),
            scratch: Scratch::default(),
            held: Vec::new(),
            held_next: 0,
        })
    }

    /// Splits matrix products and attention across `threads` threads (1 by default). The
    /// logits are the same bit for bit.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.pool = Pool::new(threads);
        self
    }

    /// Forces an instruction set (tests compare them); `Isa::detect()` is the default.
    pub fn with_isa(mut self, isa: Isa) -> Self {
        if Isa::available().contains(&isa) {
            self.isa = isa;
        }
        self
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Extends the rotary tables to cover positions `0..end`.
    fn ensure_rope(&mut self, end: usize) {
        let half = self.cfg.heads.head_dim / 2;
        let have = self.rope_cos.len() / half;
        for p in have..end {
            for i in 0..half {
                let freq = 1.0
                    / self
                        .cfg
                        .rope
                        .base
                        .powf(2.0 * i as f32 / self.cfg.heads.head_dim as f32);
                let angle = p as f32 * freq;
                self.rope_cos.push(angle.cos());
                self.rope_sin.push(angle.sin());
            }
        }
    }

    /// Feeds `tokens` through every layer into the cache and returns the logits of the first
    /// `rows` positions; the final-normed rows of the others are held for
    /// [`Llama::held_logits`].
    fn run(&mut self, tokens: &[u32], rows: usize) -> Result<Vec<Vec<f32>>> {
        self.held.clear();
        self.held_next = 0;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let vocab = self.vocab_size();
        crate::lm::check_vocab(tokens, vocab)?;
        let (t, pos, dim, eps) = (tokens.len(), self.cached, self.cfg.dim, self.cfg.norm.eps);
        let kv_dim = self.cfg.heads.kv_width();
        self.ensure_rope(pos + t);
        let (isa, pool, cfg, acts) = (self.isa, &mut self.pool, &self.cfg, &mut self.acts);
        let Scratch {
            x,
            normed,
            q,
            k,
            v,
            attended,
            projected,
            gate,
            up,
            act,
        } = &mut self.scratch;
        sized(x, t * dim);
        for (row, &tok) in x.chunks_exact_mut(dim).zip(tokens) {
            self.embeddings.dequantize_row(tok as usize, row);
        }
        for layer in &mut self.layers {
            rms_norm(x, &layer.attn_norm, eps, normed);
            acts.quantize_on_pool(isa, pool, normed, dim);
            project_many(
                isa,
                pool,
                acts,
                [&layer.wq, &layer.wk, &layer.wv],
                [q, k, v],
            );
            let hd = cfg.heads.head_dim;
            rope(
                q,
                cfg.heads.q_width(),
                hd,
                pos,
                &self.rope_cos,
                &self.rope_sin,
            );
            rope(k, kv_dim, hd, pos, &self.rope_cos, &self.rope_sin);
            layer.cache.append(k, v);
            attend(
                isa,
                pool,
                &cfg.heads,
                &layer.cache,
                q,
                pos,
                sized(attended, q.len()),
            );
            acts.quantize_on_pool(isa, pool, attended, cfg.heads.q_width());
            project(isa, pool, acts, &layer.wo, projected);
            add_in_place(x, projected);
            rms_norm(x, &layer.ffn_norm, eps, normed);
            acts.quantize_on_pool(isa, pool, normed, dim);
            project_many(isa, pool, acts, [&layer.w_gate, &layer.w_up], [gate, up]);
            swiglu(isa, pool, gate, up, act);
            acts.quantize_on_pool(isa, pool, act, layer.w_up.rows());
            project(isa, pool, acts, &layer.w_down, projected);
            add_in_place(x, projected);
        }
        self.cached += t;
        if rows == 0 {
            return Ok(Vec::new());
        }
        rms_norm(x, &self.norm, eps, &mut self.held);
        self.held_logits(rows)
    }

    /// The logits of the next `rows` held rows (fewer when fewer are held). Each row's are the
    /// same bits however the rows are grouped: activations are quantized row by row and the
    /// kernels are batch-invariant.
    fn held_logits(&mut self, rows: usize) -> Result<Vec<Vec<f32>>> {
        let dim = self.cfg.dim;
        let from = self.held_next.min(self.held.len() / dim);
        let to = (from + rows).min(self.held.len() / dim);
        if from == to {
            return Ok(Vec::new());
        }
        self.held_next = to;
        let held = &self.held[from * dim..to * dim];
        self.acts
            .quantize_on_pool(self.isa, &mut self.pool, held, dim);
        let output = self.output.as_ref().unwrap_or(&self.embeddings);
        let mut logits = Vec::new();
        project(self.isa, &mut self.pool, &self.acts, output, &mut logits);
        if to - from == 1 {
            return Ok(vec![logits]);
        }
        Ok(logits
            .chunks_exact(output.rows())
            .map(<[f32]>::to_vec)
            .collect())
    }
}

/// `out = silu(gate) · up`, element by element, `silu(g) = g / (1 + e^−g)` ([`silu_mul`]);
/// split across the pool's threads when long enough to pay for the hand-off.
fn swiglu(isa: Isa, pool: &mut Pool, gate: &[f32], up: &[f32], out: &mut Vec<f32>) {
    const PARALLEL: usize = 2048;
    let out = sized(out, gate.len());
    let threads = if gate.len() >= PARALLEL {
        pool.threads()
    } else {
        1
    };
    let parts = stretches(gate.len(), 64, threads);
    let silu = |(out, r): (&mut [f32], std::ops::Range<usize>)| {
        silu_mul(isa, &gate[r.clone()], &up[r], out)
    };
    let items: Vec<_> = split_mut(out, &parts)
        .into_iter()
        .zip(parts.clone())
        .collect();
    if items.len() == 1 {
        items.into_iter().for_each(silu);
    } else {
        pool.run_each(items, &silu);
    }
}

/// Rotates the interleaved pairs of every head of every row of `x` (rows of `width`); row r is
/// at position pos + r. `cos`/`sin` are the tables of [`Llama::ensure_rope`].
fn rope(x: &mut [f32], width: usize, head_dim: usize, pos: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        let at = (pos + r) * half..(pos + r + 1) * half;
        let (cos, sin) = (&cos[at.clone()], &sin[at]);
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos[i] - b * sin[i];
                head[2 * i + 1] = a * sin[i] + b * cos[i];
            }
        }
    }
}

/// `out` = the products of the quantized activation rows with `w`, row-major.
fn project(isa: Isa, pool: &mut Pool, acts: &QRows, w: &QMatrix, out: &mut Vec<f32>) {
    matmul(isa, w, acts, sized(out, acts.rows() * w.rows()), pool);
}

/// [`project`] with several matrices in one parallel section ([`matmul_many`]).
fn project_many<const N: usize>(
    isa: Isa,
    pool: &mut Pool,
    acts: &QRows,
    ws: [&QMatrix; N],
    outs: [&mut Vec<f32>; N],
) {
    let mut slices: Vec<&mut [f32]> = outs
        .into_iter()
        .zip(ws)
        .map(|(o, w)| sized(o, acts.rows() * w.rows()))
        .collect();
    matmul_many(isa, &ws, acts, &mut slices, pool);
}

/// `v` resized to `len` floats, as a slice. Its old values stay (every user overwrites all of
/// them), so a buffer reused at the same size costs nothing.
fn sized(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    v.resize(len, 0.0);
    v
}

/// Dot product in sixteen lanes (two AVX registers), reduced in a fixed order.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let mut tail = 0.0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            lanes[i] += x[i] * y[i];
        }
    }
    // Pairwise reduction: short dependency chains, still one fixed order.
    for width in [8, 4, 2, 1] {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
    }
    lanes[0] + tail
}

/// `out` = the RMS normalization of every row of `x`, scaled by `w`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.clear();
    for row in x.chunks_exact(w.len()) {
        let mean_sq = dot(row, row) / w.len() as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(v, w)| v * inv * w));
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

impl LanguageModel for Llama {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.run(tokens, tokens.len())
    }

    /// Runs every layer over all of `tokens`, and the output projection (a fifth of a pass's
    /// weights) over the first `first` positions only: the others' wait for
    /// [`LanguageModel::score_more`].
    fn score_first(&mut self, tokens: &[u32], first: usize) -> Result<Vec<Logits>> {
        let rows = self.run(tokens, first.clamp(1, tokens.len().max(1)))?;
        Ok(rows.into_iter().map(Logits::Dense).collect())
    }

    fn score_more(&mut self, count: usize) -> Result<Vec<Logits>> {
        let rows = self.held_logits(count)?;
        Ok(rows.into_iter().map(Logits::Dense).collect())
    }

    /// Skips the output projection (a fifth of a pass's weights, and 49,152 logits per
    /// position): a prompt's logits are not needed.
    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.run(tokens, 0).map(drop)
    }

    fn cache_len(&self) -> usize {
        self.cached
    }

    fn truncate(&mut self, len: usize) {
        self.held.clear();
        let len = len.min(self.cached);
        for layer in &mut self.layers {
            layer.cache.truncate(len);
        }
        self.cached = len;
    }

    fn vocab_size(&self) -> usize {
        self.output.as_ref().unwrap_or(&self.embeddings).rows()
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.cfg.eos
    }
}
