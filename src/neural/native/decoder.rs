//! The forward pass of every architecture ([`Decoder`]) on infgram's own CPU kernels: one
//! loop over the blocks of a [`crate::neural::arch::Architecture`], whose fields switch the
//! family's features on (q/k/v biases, q/k norms, the rotary layout and per-layer base,
//! sliding windows, GeGLU or SwiGLU, norms after the blocks, scaled embeddings).
//!
//! Matrices stay in the file's blocks ([`crate::neural::native::weights`]) and are multiplied
//! by [`crate::neural::native::kernels`], which reuse each weight block across the rows of a
//! verification pass; everything else (RMS norms, rotary embedding, attention over the KV
//! cache, the gate) is plain Rust on f32 rows. Each position is computed by the same
//! operations in the same order whether it is fed alone or in a batch, so incremental
//! decoding, a k-token pass and a full pass give bit-identical logits.
//! [`crate::neural::candle::decoder::CandleDecoder`] is the candle-ops reference this one is
//! tested against.

use crate::error::{Error, Result};
use crate::lm::{LanguageModel, Logits, RowForm};
use crate::neural::arch::layers::{check_shape, rope_frequencies, weights, Backend as _};
use crate::neural::arch::{Activation, Architecture, RopeStyle};
use crate::neural::load::gguf::Gguf;
use crate::neural::native::attention::{attend, KvCache};
use crate::neural::native::gates::{gelu_mul, silu_mul};
use crate::neural::native::kernels::{matmul, matmul_into_rows, matmul_many, Isa, QMatrix, QRows};
use crate::neural::native::pool::{split_mut, stretches, Pool};
use crate::neural::native::tree::{TreeLayout, MAX_TREE_ROWS};
use crate::neural::native::weights::to_matrix;
use candle_core::quantized::GgmlDType;
use std::path::Path;

/// A block: its weights (assembled by [`crate::neural::arch::layers`]) and its KV cache.
struct Layer {
    w: Blocks,
    cache: KvCache,
}

/// A block's weights in the kernels' tiles.
type Blocks = crate::neural::arch::layers::Layer<QMatrix, Vec<f32>>;

/// The native backend's form of a file's tensors: matrices in the kernels' tiles
/// (re-quantized to Q8_0 when `requant`), vectors as they are.
struct Tiles<'a> {
    path: &'a Path,
    requant: bool,
}

impl crate::neural::arch::layers::Backend for Tiles<'_> {
    type Matrix = QMatrix;
    type Vector = Vec<f32>;

    fn matrix(&mut self, gguf: &mut Gguf, name: &str) -> Result<QMatrix> {
        to_matrix(self.path, name, gguf.tensor(name)?, self.requant)
    }

    fn shape(m: &QMatrix) -> (usize, usize) {
        (m.rows(), m.cols())
    }

    fn vector(&mut self, values: Vec<f32>) -> Result<Vec<f32>> {
        Ok(values)
    }
}

/// The rotary angles' `cos` and `sin`, `positions × head_dim/2`, grown on demand.
struct RopeTable {
    freqs: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    fn new(freqs: Vec<f32>) -> Self {
        RopeTable {
            freqs,
            cos: Vec::new(),
            sin: Vec::new(),
        }
    }

    /// Extends the table to cover positions `0..end`.
    fn ensure(&mut self, end: usize) {
        let half = self.freqs.len();
        for p in self.cos.len() / half.max(1)..end {
            for &freq in &self.freqs {
                let angle = p as f32 * freq;
                self.cos.push(angle.cos());
                self.sin.push(angle.sin());
            }
        }
    }
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
    /// `act(gate) · up`.
    act: Vec<f32>,
}

/// A quantized model of any [`ARCHITECTURES`](crate::neural::arch::ARCHITECTURES) family
/// loaded from GGUF, run on infgram's kernels.
pub struct Decoder {
    cfg: Architecture,
    isa: Isa,
    pool: Pool,
    /// Token embeddings, also the output projection when the file ties them (SmolLM2 does).
    embeddings: QMatrix,
    output: Option<QMatrix>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// The rotary tables: the global base's, and the windowed layers' when they differ.
    ropes: Vec<RopeTable>,
    cached: usize,
    /// Reused buffer for quantized activations.
    acts: QRows,
    /// Reused buffers of a pass's activations.
    scratch: Scratch,
    /// The last pass's final-normed rows whose logits are still to come
    /// ([`LanguageModel::score_more`]), `dim` floats each, from row `held_next` of it on.
    held: Vec<f32>,
    held_next: usize,
    /// Rows of logits handed back by [`LanguageModel::recycle`], filled again by later
    /// passes: a fresh row of 150,000 logits costs the kernel a page fault every 4 KiB.
    spare_rows: Vec<Vec<f32>>,
    /// The last pass's token tree and the cache length before it, until
    /// [`LanguageModel::keep_path`] (or any other change of the cache).
    tree: Option<(usize, TreeLayout)>,
}

impl Decoder {
    /// Loads a GGUF file of any supported family, keeping its weights' blocks.
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
        let cfg = crate::neural::arch::describe(&gguf)?;
        crate::neural::arch::check_blocks(&gguf, &cfg)?;
        let (dim, heads) = (cfg.dim, cfg.heads);
        let mut tiles = Tiles { path, requant };
        let embeddings = tiles.matrix(&mut gguf, "token_embd.weight")?;
        let vocab = embeddings.rows();
        check_shape(
            &gguf,
            "token_embd.weight",
            Tiles::shape(&embeddings),
            (vocab, dim),
        )?;
        let output = if gguf.has("output.weight") {
            let output = tiles.matrix(&mut gguf, "output.weight")?;
            let shape = Tiles::shape(&output);
            check_shape(&gguf, "output.weight", shape, (shape.0, dim))?;
            Some(output)
        } else {
            None
        };
        let layers = crate::neural::arch::layers::layers(&mut gguf, &cfg, &mut tiles)?
            .into_iter()
            .map(|w| Layer {
                w,
                cache: KvCache::new(heads.n_kv_head, heads.head_dim),
            })
            .collect();
        let norm = weights(&mut gguf, "output_norm.weight", dim, cfg.norm.weight_offset)?;
        let ropes = rope_frequencies(&mut gguf, &cfg)?
            .into_iter()
            .map(RopeTable::new)
            .collect();
        Ok(Decoder {
            cfg,
            isa: Isa::detect(),
            pool: Pool::new(1),
            embeddings,
            output,
            layers,
            norm,
            ropes,
            cached: 0,
            acts: QRows::default(),
            scratch: Scratch::default(),
            held: Vec::new(),
            held_next: 0,
            spare_rows: Vec::new(),
            tree: None,
        })
    }

    /// The weight bytes a one-token step reads: every layer's matrices and the output
    /// projection (the embeddings when tied; one embedding row is all a step reads otherwise).
    pub fn weight_bytes_per_step(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .flat_map(|l| {
                [
                    &l.w.wq,
                    &l.w.wk,
                    &l.w.wv,
                    &l.w.wo,
                    &l.w.w_gate,
                    &l.w.w_up,
                    &l.w.w_down,
                ]
            })
            .map(QMatrix::bytes)
            .sum();
        layers + self.output.as_ref().unwrap_or(&self.embeddings).bytes()
    }

    /// The description this model runs.
    pub fn architecture(&self) -> &Architecture {
        &self.cfg
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

    /// Feeds `tokens` through every layer into the cache and returns the logits of the first
    /// `rows` positions; the final-normed rows of the others are held for
    /// [`Decoder::held_logits`].
    fn run(&mut self, tokens: &[u32], rows: usize) -> Result<Vec<Vec<f32>>> {
        self.tree = None;
        self.run_placed(tokens, rows, None)
    }

    /// [`Decoder::run`] with the rows placed as `tree` says (its padding rows' logits never
    /// come out).
    fn run_placed(
        &mut self,
        tokens: &[u32],
        rows: usize,
        tree: Option<&TreeLayout>,
    ) -> Result<Vec<Vec<f32>>> {
        self.held.clear();
        self.held_next = 0;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let vocab = self.vocab_size();
        crate::lm::check_vocab(tokens, vocab)?;
        let (t, pos, dim, eps) = (tokens.len(), self.cached, self.cfg.dim, self.cfg.norm.eps);
        for table in &mut self.ropes {
            table.ensure(pos + t);
        }
        let (isa, pool, cfg, acts) = (self.isa, &mut self.pool, &self.cfg, &mut self.acts);
        let (heads, ropes) = (cfg.heads, &self.ropes);
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
            if let Some(scale) = cfg.embedding.scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        for layer in &mut self.layers {
            rms_norm(x, &layer.w.attn_norm, eps, normed);
            acts.quantize_on_pool(isa, pool, normed, dim);
            project_many(
                isa,
                pool,
                acts,
                [&layer.w.wq, &layer.w.wk, &layer.w.wv],
                [q, k, v],
            );
            if let Some([bq, bk, bv]) = &layer.w.biases {
                add_rows(q, bq);
                add_rows(k, bk);
                add_rows(v, bv);
            }
            if let Some([nq, nk]) = &layer.w.qk_norms {
                rms_norm_in_place(q, nq, eps);
                rms_norm_in_place(k, nk, eps);
            }
            let table = &ropes[layer.w.rope];
            let (hd, style) = (heads.head_dim, cfg.rope.style);
            let depth = tree.map(|t| t.depth.as_slice());
            rope(q, heads.q_width(), hd, (pos, depth), table, style);
            rope(k, heads.kv_width(), hd, (pos, depth), table, style);
            layer.cache.append(k, v);
            let out = sized(attended, q.len());
            let placed = (pos, tree.map(TreeLayout::rows));
            attend(
                isa,
                pool,
                &heads,
                &layer.cache,
                q,
                placed,
                layer.w.window,
                out,
            );
            acts.quantize_on_pool(isa, pool, attended, heads.q_width());
            project(isa, pool, acts, &layer.w.wo, projected);
            if let Some([post_attention, _]) = &layer.w.post_norms {
                rms_norm_in_place(projected, post_attention, eps);
            }
            add_in_place(x, projected);
            rms_norm(x, &layer.w.ffn_norm, eps, normed);
            acts.quantize_on_pool(isa, pool, normed, dim);
            project_many(
                isa,
                pool,
                acts,
                [&layer.w.w_gate, &layer.w.w_up],
                [gate, up],
            );
            gated(isa, pool, cfg.activation, gate, up, act);
            acts.quantize_on_pool(isa, pool, act, layer.w.w_up.rows());
            project(isa, pool, acts, &layer.w.w_down, projected);
            if let Some([_, post_ffw]) = &layer.w.post_norms {
                rms_norm_in_place(projected, post_ffw, eps);
            }
            add_in_place(x, projected);
        }
        self.cached += t;
        if rows == 0 {
            return Ok(Vec::new());
        }
        rms_norm(x, &self.norm, eps, &mut self.held);
        if let Some(t) = tree.filter(|t| t.padding.contains(&true)) {
            // Padding rows' logits are never asked for: drop their rows.
            let mut kept = 0;
            for (s, _) in t.padding.iter().enumerate().filter(|p| !*p.1) {
                self.held.copy_within(s * dim..(s + 1) * dim, kept * dim);
                kept += 1;
            }
            self.held.truncate(kept * dim);
        }
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
        let mut rows: Vec<Vec<f32>> = (from..to)
            .map(|_| {
                let mut row = self.spare_rows.pop().unwrap_or_default();
                row.resize(output.rows(), 0.0);
                row
            })
            .collect();
        let mut outs: Vec<&mut [f32]> = rows.iter_mut().map(Vec::as_mut_slice).collect();
        matmul_into_rows(self.isa, output, &self.acts, &mut outs, &mut self.pool);
        Ok(rows)
    }
}

/// Rows of logits [`Decoder`] keeps for reuse: a 16-token verification pass's.
const MAX_SPARE_ROWS: usize = 16;

/// `out = act(gate) · up`, element by element ([`silu_mul`], [`gelu_mul`]); split across
/// the pool's threads when long enough to pay for the hand-off.
fn gated(
    isa: Isa,
    pool: &mut Pool,
    activation: Activation,
    gate: &[f32],
    up: &[f32],
    out: &mut Vec<f32>,
) {
    const PARALLEL: usize = 2048;
    let out = sized(out, gate.len());
    let threads = if gate.len() >= PARALLEL {
        pool.threads()
    } else {
        1
    };
    let parts = stretches(gate.len(), 64, threads);
    let silu = |(out, r): (&mut [f32], std::ops::Range<usize>)| match activation {
        Activation::Silu => silu_mul(isa, &gate[r.clone()], &up[r], out),
        Activation::GeluTanh => gelu_mul(isa, &gate[r.clone()], &up[r], out),
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

/// Rotates the pairs of every head of every row of `x` (rows of `width`); row r is at
/// position pos + r, or pos + depth[r] in a tree pass. The pairs are `(2i, 2i + 1)` or
/// `(i, i + d/2)` by `style`.
fn rope(
    x: &mut [f32],
    width: usize,
    head_dim: usize,
    (pos, depth): (usize, Option<&[usize]>),
    table: &RopeTable,
    style: RopeStyle,
) {
    let half = head_dim / 2;
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        let p = pos + depth.map_or(r, |d| d[r]);
        let at = p * half..(p + 1) * half;
        let (cos, sin) = (&table.cos[at.clone()], &table.sin[at]);
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (j, k) = match style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Halves => (i, i + half),
                };
                let (a, b) = (head[j], head[k]);
                head[j] = a * cos[i] - b * sin[i];
                head[k] = a * sin[i] + b * cos[i];
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

/// RMS-normalizes every `w.len()`-wide stretch of `x` (a row, or a head) in place, scaled by
/// `w`: the same operations as [`rms_norm`].
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        let mean_sq = dot(row, row) / w.len() as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * inv * w);
    }
}

/// Adds `bias` to every row of `x`.
fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

impl LanguageModel for Decoder {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.run(tokens, tokens.len())
    }

    /// Runs every layer over all of `tokens`, and the output projection (a fifth of a pass's
    /// weights) over the first `first` positions only: the others' wait for
    /// [`LanguageModel::score_more`]. Its rows are full in any `form` (they stay in memory).
    fn score_first(&mut self, tokens: &[u32], first: usize, form: RowForm) -> Result<Vec<Logits>> {
        let _ = form;
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

    /// Keeps dense rows (up to a pass's worth) for the next passes' logits.
    fn recycle(&mut self, rows: Vec<Logits>) {
        for row in rows {
            if let Logits::Dense(v) = row {
                if self.spare_rows.len() < MAX_SPARE_ROWS && v.capacity() >= self.vocab_size() {
                    self.spare_rows.push(v);
                }
            }
        }
    }

    fn cache_len(&self) -> usize {
        self.cached
    }

    fn truncate(&mut self, len: usize) {
        self.held.clear();
        self.tree = None;
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

    fn bos_token(&self) -> Option<u32> {
        self.cfg.bos
    }

    /// Trees need every layer's window (if any) longer than a tree is deep.
    fn max_tree_rows(&self) -> usize {
        let windows_fit = self
            .layers
            .iter()
            .all(|l| l.w.window.is_none_or(|w| w > MAX_TREE_ROWS));
        if windows_fit {
            MAX_TREE_ROWS
        } else {
            0
        }
    }

    fn score_tree_first(
        &mut self,
        tokens: &[u32],
        parents: &[Option<usize>],
        first: usize,
        form: RowForm,
    ) -> Result<Vec<Logits>> {
        let _ = form;
        if self.max_tree_rows() == 0 {
            return Err(Error::Model(
                "a sliding window shorter than a token tree: verify chains".into(),
            ));
        }
        let layout = TreeLayout::new(tokens, parents)?;
        let base = self.cached;
        let rows = first.clamp(1, tokens.len());
        let out = self.run_placed(&layout.tokens, rows, Some(&layout))?;
        self.tree = Some((base, layout));
        Ok(out.into_iter().map(Logits::Dense).collect())
    }

    fn keep_path(&mut self, path: &[usize]) -> Result<()> {
        let Some((base, layout)) = self.tree.take() else {
            return Err(Error::Model(
                "keep_path: no tree pass to keep a path of".into(),
            ));
        };
        let slots = layout.slots_of(path)?;
        for layer in &mut self.layers {
            layer.cache.keep_slots(base, &slots);
        }
        self.held.clear();
        self.cached = base + slots.len();
        Ok(())
    }
}
