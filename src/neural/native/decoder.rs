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
use crate::lm::{greedy_pick, LanguageModel, Logits, RowForm, SeqPart, Sequences};
use crate::neural::arch::layers::{check_shape, rope_frequencies, weights, Backend as _};
use crate::neural::arch::{Activation, Architecture, RopeStyle};
use crate::neural::load::gguf::Gguf;
use crate::neural::native::attention::{attend, KvCache};
use crate::neural::native::gates::{gelu_mul, silu_mul};
use crate::neural::native::kernels::{
    matmul, matmul_into_rows, matmul_many, matmul_picks, Isa, QMatrix, QRows,
};
use crate::neural::native::pool::{split_mut, stretches, Pool};
use crate::neural::native::tree::{TreeLayout, MAX_TREE_ROWS};
use crate::neural::native::weights::to_matrix;
use candle_core::quantized::GgmlDType;
use std::path::Path;

/// A block's weights in the kernels' tiles (assembled by [`crate::neural::arch::layers`]).
type Blocks = crate::neural::arch::layers::Layer<QMatrix, Vec<f32>>;

/// One sequence the decoder holds ([`Sequences`]): a KV cache per layer, its length, the
/// final-normed rows of its last pass whose logits are still to come
/// ([`LanguageModel::score_more`]), `dim` floats each, from row `held_next` on, the form
/// its last pass's rows come in, and its last token tree with the cache length before it,
/// until [`LanguageModel::keep_path`] (or any other change of the cache).
struct Sequence {
    caches: Vec<KvCache>,
    cached: usize,
    held: Vec<f32>,
    held_next: usize,
    form: RowForm,
    tree: Option<(usize, TreeLayout)>,
}

impl Sequence {
    fn new(cfg: &Architecture) -> Self {
        let heads = cfg.heads;
        Sequence {
            caches: (0..cfg.n_layer)
                .map(|_| KvCache::new(heads.n_kv_head, heads.head_dim))
                .collect(),
            cached: 0,
            held: Vec::new(),
            held_next: 0,
            form: RowForm::Full,
            tree: None,
        }
    }

    /// Keeps the first `len` positions (and no held rows or tree).
    fn truncate(&mut self, len: usize) {
        self.held.clear();
        self.tree = None;
        let len = len.min(self.cached);
        for cache in &mut self.caches {
            cache.truncate(len);
        }
        self.cached = len;
    }
}

/// One sequence's rows in a pass: its new tokens, how many of their rows' logits come out
/// now (the others are held), in what form, and their placement as a token tree.
struct Part<'a> {
    seq: usize,
    tokens: &'a [u32],
    rows: usize,
    form: RowForm,
    tree: Option<&'a TreeLayout>,
}

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
    layers: Vec<Blocks>,
    norm: Vec<f32>,
    /// The rotary tables: the global base's, and the windowed layers' when they differ.
    ropes: Vec<RopeTable>,
    /// The sequences held (one until [`Sequences::add_sequence`]), and the one the
    /// [`LanguageModel`] methods act on.
    seqs: Vec<Sequence>,
    current: usize,
    /// Reused buffer for quantized activations.
    acts: QRows,
    /// Reused buffers of a pass's activations.
    scratch: Scratch,
    /// Held rows of several sequences gathered for one output projection.
    gathered: Vec<f32>,
    /// Rows of logits handed back by [`LanguageModel::recycle`], filled again by later
    /// passes: a fresh row of 150,000 logits costs the kernel a page fault every 4 KiB.
    spare_rows: Vec<Vec<f32>>,
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
        let dim = cfg.dim;
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
        let layers = crate::neural::arch::layers::layers(&mut gguf, &cfg, &mut tiles)?;
        let norm = weights(&mut gguf, "output_norm.weight", dim, cfg.norm.weight_offset)?;
        let ropes = rope_frequencies(&mut gguf, &cfg)?
            .into_iter()
            .map(RopeTable::new)
            .collect();
        Ok(Decoder {
            seqs: vec![Sequence::new(&cfg)],
            current: 0,
            cfg,
            isa: Isa::detect(),
            pool: Pool::new(1),
            embeddings,
            output,
            layers,
            norm,
            ropes,
            acts: QRows::default(),
            scratch: Scratch::default(),
            gathered: Vec::new(),
            spare_rows: Vec::new(),
        })
    }

    /// The weight bytes a one-token step reads: every layer's matrices and the output
    /// projection (the embeddings when tied; one embedding row is all a step reads otherwise).
    pub fn weight_bytes_per_step(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .flat_map(|w| [&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down])
            .map(QMatrix::bytes)
            .sum();
        layers + self.output.as_ref().unwrap_or(&self.embeddings).bytes()
    }

    /// The multiply-adds of the matrix products a row of a pass costs: every layer's
    /// matrices and the output projection (what the kernels' compute bound counts; attention
    /// and the rest are a small share at short contexts).
    pub fn multiply_adds_per_row(&self) -> usize {
        let output = self.output.as_ref().unwrap_or(&self.embeddings);
        self.layer_multiply_adds_per_row() + output.rows() * output.cols()
    }

    /// [`Decoder::multiply_adds_per_row`] without the output projection: what a row of a
    /// prompt costs (its logits are not computed).
    pub fn layer_multiply_adds_per_row(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|w| [&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down])
            .map(|m| m.rows() * m.cols())
            .sum()
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

    /// Feeds `tokens` through every layer into the current sequence's cache and returns the
    /// logits of the first `rows` positions in `form`; the final-normed rows of the others
    /// are held for [`LanguageModel::score_more`].
    fn run(&mut self, tokens: &[u32], rows: usize, form: RowForm) -> Result<Vec<Logits>> {
        self.seqs[self.current].tree = None;
        self.run_placed(tokens, rows, None, form)
    }

    /// [`Decoder::run`] with the rows placed as `tree` says (its padding rows' logits never
    /// come out).
    fn run_placed(
        &mut self,
        tokens: &[u32],
        rows: usize,
        tree: Option<&TreeLayout>,
        form: RowForm,
    ) -> Result<Vec<Logits>> {
        let seq = self.current;
        let part = Part {
            seq,
            tokens,
            rows,
            form,
            tree,
        };
        Ok(self.run_parts(&[part])?.pop().unwrap_or_default())
    }

    /// One pass over the new tokens of several sequences (each at most once): the matrix
    /// products take every part's rows together, rotation, the cache and attention each
    /// part's own. A row's logits are the same bits whatever else the pass holds (the
    /// products are batch-invariant, everything else is per row or per sequence).
    fn run_parts(&mut self, parts: &[Part]) -> Result<Vec<Vec<Logits>>> {
        let vocab = self.vocab_size();
        for (i, part) in parts.iter().enumerate() {
            if part.seq >= self.seqs.len() || parts[..i].iter().any(|p| p.seq == part.seq) {
                return Err(Error::Model(format!(
                    "a pass takes each of the {} sequences at most once (sequence {} again)",
                    self.seqs.len(),
                    part.seq
                )));
            }
            crate::lm::check_vocab(part.tokens, vocab)?;
            let seq = &mut self.seqs[part.seq];
            seq.held.clear();
            seq.held_next = 0;
            seq.form = part.form;
        }
        let t: usize = parts.iter().map(|p| p.tokens.len()).sum();
        if t == 0 {
            return Ok(parts.iter().map(|_| Vec::new()).collect());
        }
        // Each part's first row in the pass, and the position it starts at.
        let starts = row_starts(parts.iter().map(|p| p.tokens.len()));
        // The last layer's work past its keys and values only feeds the logits: rows of the
        // parts that want none (a prompt read) stop there, and the others' rows close up
        // (`kept` says where each part's rows sit after that).
        let wanted: Vec<bool> = parts.iter().map(|p| p.rows > 0).collect();
        let kept = row_starts(
            parts
                .iter()
                .zip(&wanted)
                .map(|(p, &w)| if w { p.tokens.len() } else { 0 }),
        );
        let trim_last = wanted.contains(&false);
        let last = self.layers.len().saturating_sub(1);
        let places: Vec<usize> = parts.iter().map(|p| self.seqs[p.seq].cached).collect();
        let (dim, eps) = (self.cfg.dim, self.cfg.norm.eps);
        let end = parts
            .iter()
            .zip(&places)
            .map(|(p, pos)| pos + p.tokens.len())
            .max();
        for table in &mut self.ropes {
            table.ensure(end.unwrap_or(0));
        }
        let (isa, pool, cfg, acts) = (self.isa, &mut self.pool, &self.cfg, &mut self.acts);
        let (heads, ropes, seqs) = (cfg.heads, &self.ropes, &mut self.seqs);
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
        let tokens = parts.iter().flat_map(|p| p.tokens);
        for (row, &tok) in x.chunks_exact_mut(dim).zip(tokens) {
            self.embeddings.dequantize_row(tok as usize, row);
            if let Some(scale) = cfg.embedding.scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let (qw, kw, hd, style) = (
            heads.q_width(),
            heads.kv_width(),
            heads.head_dim,
            cfg.rope.style,
        );
        for (l, w) in self.layers.iter().enumerate() {
            rms_norm(x, &w.attn_norm, eps, normed);
            acts.quantize_on_pool(isa, pool, normed, dim);
            project_many(isa, pool, acts, [&w.wq, &w.wk, &w.wv], [q, k, v]);
            if let Some([bq, bk, bv]) = &w.biases {
                add_rows(q, bq);
                add_rows(k, bk);
                add_rows(v, bv);
            }
            if let Some([nq, nk]) = &w.qk_norms {
                rms_norm_in_place(q, nq, eps);
                rms_norm_in_place(k, nk, eps);
            }
            let table = &ropes[w.rope];
            let trim = trim_last && l == last;
            let out = sized(attended, q.len());
            for (i, part) in parts.iter().enumerate() {
                let (r0, r1, pos) = (starts[i], starts[i + 1], places[i]);
                let depth = part.tree.map(|t| t.depth.as_slice());
                rope(&mut k[r0 * kw..r1 * kw], kw, hd, (pos, depth), table, style);
                let cache = &mut seqs[part.seq].caches[l];
                cache.append(&k[r0 * kw..r1 * kw], &v[r0 * kw..r1 * kw]);
                if trim && !wanted[i] {
                    continue;
                }
                let (q, out) = (&mut q[r0 * qw..r1 * qw], &mut out[r0 * qw..r1 * qw]);
                rope(q, qw, hd, (pos, depth), table, style);
                let placed = (pos, part.tree.map(TreeLayout::rows));
                attend(isa, pool, &heads, cache, q, placed, w.window, out);
            }
            if trim {
                close_up(x, dim, &starts, &wanted);
                close_up(attended, qw, &starts, &wanted);
                if x.is_empty() {
                    continue;
                }
            }
            acts.quantize_on_pool(isa, pool, attended, qw);
            project(isa, pool, acts, &w.wo, projected);
            if let Some([post_attention, _]) = &w.post_norms {
                rms_norm_in_place(projected, post_attention, eps);
            }
            add_in_place(x, projected);
            rms_norm(x, &w.ffn_norm, eps, normed);
            acts.quantize_on_pool(isa, pool, normed, dim);
            project_many(isa, pool, acts, [&w.w_gate, &w.w_up], [gate, up]);
            gated(isa, pool, cfg.activation, gate, up, act);
            acts.quantize_on_pool(isa, pool, act, w.w_up.rows());
            project(isa, pool, acts, &w.w_down, projected);
            if let Some([_, post_ffw]) = &w.post_norms {
                rms_norm_in_place(projected, post_ffw, eps);
            }
            add_in_place(x, projected);
        }
        for (i, part) in parts.iter().enumerate() {
            let seq = &mut seqs[part.seq];
            seq.cached += part.tokens.len();
            if part.rows == 0 {
                continue;
            }
            rms_norm(
                &x[kept[i] * dim..kept[i + 1] * dim],
                &self.norm,
                eps,
                &mut seq.held,
            );
            if let Some(t) = part.tree.filter(|t| t.padding.contains(&true)) {
                // Padding rows' logits are never asked for: drop their rows.
                let mut kept = 0;
                for (s, _) in t.padding.iter().enumerate().filter(|p| !*p.1) {
                    seq.held.copy_within(s * dim..(s + 1) * dim, kept * dim);
                    kept += 1;
                }
                seq.held.truncate(kept * dim);
            }
        }
        let wants: Vec<(usize, usize)> = parts.iter().map(|p| (p.seq, p.rows)).collect();
        self.held_logits(&wants)
    }

    /// The logits of the next `rows` held rows of each `(sequence, rows)` (fewer when fewer
    /// are held), in one output projection. Each row's are the same bits however the rows are
    /// grouped: activations are quantized row by row and the kernels are batch-invariant.
    /// Rows of a pass asked for in [`RowForm::Greedy`] come as their greedy picks: found as
    /// the projection goes ([`matmul_picks`]: no logit is written out) when every sequence's
    /// pass asked for them, else picked from the full rows.
    fn held_logits(&mut self, wants: &[(usize, usize)]) -> Result<Vec<Vec<Logits>>> {
        let dim = self.cfg.dim;
        let mut counts = Vec::with_capacity(wants.len());
        self.gathered.clear();
        for &(seq, rows) in wants {
            let seq = &mut self.seqs[seq];
            let from = seq.held_next.min(seq.held.len() / dim);
            let to = (from + rows).min(seq.held.len() / dim);
            seq.held_next = to;
            counts.push(to - from);
            // (A copy of `dim` floats a row: nothing beside the row's output projection.)
            self.gathered
                .extend_from_slice(&seq.held[from * dim..to * dim]);
        }
        let total: usize = counts.iter().sum();
        if total == 0 {
            return Ok(wants.iter().map(|_| Vec::new()).collect());
        }
        self.acts
            .quantize_on_pool(self.isa, &mut self.pool, &self.gathered, dim);
        let output = self.output.as_ref().unwrap_or(&self.embeddings);
        let forms: Vec<RowForm> = wants.iter().map(|&(seq, _)| self.seqs[seq].form).collect();
        let greedy = forms.iter().all(|&form| form == RowForm::Greedy);
        let rows: Vec<Logits> = if greedy {
            let vocab = output.rows();
            matmul_picks(self.isa, output, &self.acts, &mut self.pool)
                .into_iter()
                .map(|pick| Logits::of_pick(vocab, pick))
                .collect()
        } else {
            self.dense_rows(total)
        };
        let mut rows = rows.into_iter();
        Ok(counts
            .into_iter()
            .zip(forms)
            .map(|(n, form)| {
                let part = rows.by_ref().take(n);
                match form {
                    RowForm::Greedy if !greedy => part.map(|row| self.picked(row)).collect(),
                    _ => part.collect(),
                }
            })
            .collect())
    }

    /// A full row as its greedy pick, the row kept for reuse.
    fn picked(&mut self, row: Logits) -> Logits {
        let Logits::Dense(v) = row else {
            return row;
        };
        let pick = Logits::of_pick(v.len(), greedy_pick(&v));
        self.recycle(vec![Logits::Dense(v)]);
        pick
    }

    /// The full logits of the `total` rows quantized in `acts`, into spare rows where some
    /// are kept.
    fn dense_rows(&mut self, total: usize) -> Vec<Logits> {
        let output = self.output.as_ref().unwrap_or(&self.embeddings);
        let mut rows: Vec<Vec<f32>> = (0..total)
            .map(|_| {
                let mut row = self.spare_rows.pop().unwrap_or_default();
                row.resize(output.rows(), 0.0);
                row
            })
            .collect();
        let mut outs: Vec<&mut [f32]> = rows.iter_mut().map(Vec::as_mut_slice).collect();
        matmul_into_rows(self.isa, output, &self.acts, &mut outs, &mut self.pool);
        rows.into_iter().map(Logits::Dense).collect()
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

/// Where each part's rows begin, and the end of the last: `0` and the running sums of `rows`.
fn row_starts(rows: impl Iterator<Item = usize>) -> Vec<usize> {
    std::iter::once(0)
        .chain(rows.scan(0, |at, n| {
            *at += n;
            Some(*at)
        }))
        .collect()
}

/// Keeps the rows (`width` floats each) of the parts that `wanted` says, in order, at the
/// front of `v`: part i's rows are `starts[i]..starts[i + 1]`.
fn close_up(v: &mut Vec<f32>, width: usize, starts: &[usize], wanted: &[bool]) {
    let mut to = 0;
    for (i, _) in wanted.iter().enumerate().filter(|w| *w.1) {
        let (r0, r1) = (starts[i], starts[i + 1]);
        v.copy_within(r0 * width..r1 * width, to);
        to += (r1 - r0) * width;
    }
    v.truncate(to);
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
        let rows = self.run(tokens, tokens.len(), RowForm::Full)?;
        Ok(rows.into_iter().map(Logits::into_dense).collect())
    }

    /// Runs every layer over all of `tokens`, and the output projection (a fifth of a pass's
    /// weights) over the first `first` positions only: the others' wait for
    /// [`LanguageModel::score_more`]. In [`RowForm::Greedy`] its rows (and those
    /// `score_more` gives after) are each row's greedy pick, found as the projection goes.
    fn score_first(&mut self, tokens: &[u32], first: usize, form: RowForm) -> Result<Vec<Logits>> {
        self.run(tokens, first.clamp(1, tokens.len().max(1)), form)
    }

    fn score_more(&mut self, count: usize) -> Result<Vec<Logits>> {
        let rows = self.held_logits(&[(self.current, count)])?;
        Ok(rows.into_iter().next().unwrap_or_default())
    }

    /// Skips the output projection (a fifth of a pass's weights, and 49,152 logits per
    /// position): a prompt's logits are not needed.
    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.run(tokens, 0, RowForm::Full).map(drop)
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
        self.seqs[self.current].cached
    }

    fn truncate(&mut self, len: usize) {
        self.seqs[self.current].truncate(len);
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
            .all(|l| l.window.is_none_or(|w| w > MAX_TREE_ROWS));
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
        if self.max_tree_rows() == 0 {
            return Err(Error::Model(
                "a sliding window shorter than a token tree: verify chains".into(),
            ));
        }
        let layout = TreeLayout::new(tokens, parents)?;
        let base = self.cache_len();
        let rows = first.clamp(1, tokens.len());
        let out = self.run_placed(&layout.tokens, rows, Some(&layout), form)?;
        self.seqs[self.current].tree = Some((base, layout));
        Ok(out)
    }

    fn sequences(&mut self) -> Option<&mut dyn Sequences> {
        Some(self)
    }

    fn keep_path(&mut self, path: &[usize]) -> Result<()> {
        let seq = &mut self.seqs[self.current];
        let Some((base, layout)) = seq.tree.take() else {
            return Err(Error::Model(
                "keep_path: no tree pass to keep a path of".into(),
            ));
        };
        let slots = layout.slots_of(path)?;
        for cache in &mut seq.caches {
            cache.keep_slots(base, &slots);
        }
        seq.held.clear();
        seq.cached = base + slots.len();
        Ok(())
    }
}

impl Sequences for Decoder {
    fn sequence_count(&self) -> usize {
        self.seqs.len()
    }

    fn add_sequence(&mut self) -> Result<usize> {
        self.seqs.push(Sequence::new(&self.cfg));
        Ok(self.seqs.len() - 1)
    }

    fn select(&mut self, seq: usize) -> Result<()> {
        if seq >= self.seqs.len() {
            return Err(Error::Model(format!(
                "sequence {seq} of {}: add it first",
                self.seqs.len()
            )));
        }
        self.current = seq;
        Ok(())
    }

    fn release(&mut self, seq: usize) {
        if let Some(s) = self.seqs.get_mut(seq) {
            *s = Sequence::new(&self.cfg);
        }
    }

    fn cache_bytes_per_token(&self) -> usize {
        // Keys and values, f32, every layer.
        2 * self.cfg.heads.kv_width() * std::mem::size_of::<f32>() * self.cfg.n_layer
    }

    fn reserve(&mut self, seq: usize, tokens: usize) {
        if let Some(s) = self.seqs.get_mut(seq) {
            for cache in &mut s.caches {
                cache.reserve_exact(tokens);
            }
        }
    }

    fn cache_slack_tokens(&self) -> usize {
        KvCache::SLACK_TOKENS
    }

    fn fit(&mut self, seq: usize) {
        if let Some(s) = self.seqs.get_mut(seq) {
            s.truncate(s.cached);
            s.held.shrink_to_fit();
            for cache in &mut s.caches {
                cache.fit();
            }
        }
    }

    fn copy_cache(&mut self, from: usize, to: usize, len: usize) -> Result<()> {
        let count = self.seqs.len();
        if from.max(to) >= count || from == to {
            return Err(Error::Model(format!(
                "a cache copied from sequence {from} to {to} of {count}: two sequences held"
            )));
        }
        let (low, high) = self.seqs.split_at_mut(from.max(to));
        let (source, target) = match from < to {
            true => (&low[from], &mut high[0]),
            false => (&high[0], &mut low[to]),
        };
        target.truncate(0);
        for (cache, source) in target.caches.iter_mut().zip(&source.caches) {
            cache.copy_from(source, len);
        }
        target.cached = len.min(source.cached);
        Ok(())
    }

    fn score_parts(&mut self, parts: &[SeqPart]) -> Result<Vec<Vec<Logits>>> {
        for p in parts {
            if let Some(seq) = self.seqs.get_mut(p.seq) {
                seq.tree = None;
            }
        }
        let parts: Vec<Part> = parts
            .iter()
            .map(|p| Part {
                seq: p.seq,
                tokens: p.tokens,
                rows: p.first.min(p.tokens.len()),
                form: p.form,
                tree: None,
            })
            .collect();
        self.run_parts(&parts)
    }
}
