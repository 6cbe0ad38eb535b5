//! Every architecture's forward pass from a GGUF file, written with candle ops
//! ([`CandleDecoder`]): the reference the native pass ([`crate::neural::native::decoder::Decoder`])
//! is checked against, and `--backend candle`.
//!
//! Unlike candle-transformers' quantized models, this pass returns the logits of every fed
//! position and keeps a KV cache that can be truncated to any length, and it reads the same
//! [`Architecture`] description as the native pass (candle-transformers' `quantized_gemma3`
//! also runs SiLU where Gemma has GELU, and masks cached positions in multi-token passes).
//! Weights stay in their GGUF quantization and are multiplied with candle's `QMatMul`;
//! embeddings are dequantized once.
//!
//! **Batch-invariant on every device.** A row of a k-token pass is the same bits as the row
//! that k one-token passes give, on the CPU and on CUDA, so that speculative decoding verified
//! by this pass gives exactly the plain output. Three rules make it so:
//! * matrix products run on a fixed number of rows per call ([`RowsPerCall`]): one on the CPU;
//!   on CUDA, quantized weights take candle's matrix-vector kernel on exactly eight rows (a
//!   pass's rows padded with copies of its last row), whose reduction order per row depends
//!   only on that count, and other weights one row per call;
//! * attention reduces with sums whose order does not depend on how many rows are fed or how
//!   many cached positions trail a row's own: scores are element products summed over the head
//!   width, the values are weighted and summed over positions, over a KV cache preallocated in
//!   steps of [`POSITION_STEP`] (zero-filled; a position a row may not see is masked to −∞ in
//!   its scores and so weighs exactly 0);
//! * everything else (norms, rotary embedding, gates) works on one row at a time already.
//!
//! A row gathers the keys and values it sees in the order of its own positions (`Rows`), so
//! a token tree verified in one pass gives each node the bits of its branch fed as a chain.

use crate::error::Result;
use crate::lm::{LanguageModel, Logits, RowForm};
use crate::neural::arch::layers::{rope_frequencies, weights, Backend};
use crate::neural::arch::{describe, Activation, Architecture, RopeStyle};
use crate::neural::load::gguf::Gguf;
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::path::Path;

/// A block: its weights (assembled by [`crate::neural::arch::layers`]) and its KV cache.
struct Layer {
    w: crate::neural::arch::layers::Layer<QMatMul, Tensor>,
    /// Keys and values, `(n_kv_head, capacity, head_dim)` each; the first `cached` positions
    /// are the cache.
    cache: Option<(Tensor, Tensor)>,
}

/// The candle backend's form of a file's tensors: matrices kept in their blocks (re-quantized
/// to `requantize` where asked), on `device`; vectors as f32 tensors there.
struct OnDevice<'a> {
    device: &'a Device,
    requantize: Option<GgmlDType>,
}

impl OnDevice<'_> {
    /// A matrix in its blocks, re-quantized if asked (on the CPU), on the device.
    fn blocks(&self, t: QTensor) -> Result<QTensor> {
        let t = match self.requantize {
            Some(dtype)
                if t.dtype() != dtype
                    && t.shape()
                        .dims()
                        .last()
                        .is_some_and(|d| d % dtype.block_size() == 0) =>
            {
                QTensor::quantize(&t.dequantize(&Device::Cpu)?, dtype)?
            }
            _ => t,
        };
        if self.device.is_cpu() {
            return Ok(t);
        }
        let storage = QStorage::from_data(t.data()?, self.device, t.dtype())?;
        Ok(QTensor::new(storage, t.shape().clone())?)
    }
}

impl Backend for OnDevice<'_> {
    type Matrix = QMatMul;
    type Vector = Tensor;

    fn matrix(&mut self, gguf: &mut Gguf, name: &str) -> Result<QMatMul> {
        Ok(QMatMul::from_qtensor(self.blocks(gguf.tensor(name)?)?)?)
    }

    fn shape(m: &QMatMul) -> (usize, usize) {
        let dims = match m {
            QMatMul::QTensor(t) => t.shape().dims().to_vec(),
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.dims().to_vec(),
        };
        match dims[..] {
            [rows, cols] => (rows, cols),
            _ => (0, 0),
        }
    }

    fn vector(&mut self, values: Vec<f32>) -> Result<Tensor> {
        let len = values.len();
        Ok(Tensor::from_vec(values, len, self.device)?)
    }
}

/// The attended positions of a pass are rounded up to a multiple of this (the cache grows in
/// such steps): then candle's CPU sums (8-lane vectors, 32 elements a step) take every position
/// in their vector part, and its CUDA sums take none in their small-reduction kernel, whatever
/// the length, so positions past a row's own add exact zeros at the end of a fixed order.
pub const POSITION_STEP: usize = 64;

/// How many rows one call of a matrix product takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowsPerCall {
    /// Each row alone.
    One,
    /// Exactly this many, padded with copies of the last row (CUDA's quantized kernels).
    Padded(usize),
}

/// Rows per quantized matrix-vector call on CUDA: candle's kernel takes 1 to 8 and picks its
/// warp layout (and so its reduction order) by the count, so every call takes 8.
const CUDA_ROWS: usize = 8;

/// A quantized model of any supported family loaded from GGUF, run with candle ops.
pub struct CandleDecoder {
    cfg: Architecture,
    embeddings: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: QMatMul,
    /// `(cos, sin)` of each rotary table, `positions × head_dim/2`.
    ropes: Vec<(Tensor, Tensor)>,
    cached: usize,
    vocab: usize,
    device: Device,
    /// Rows per call of the quantized products (the dense ones take one on every device).
    rows_per_call: RowsPerCall,
    /// The cache length before the last pass and the tree's parents, when that pass was a
    /// token tree (until [`LanguageModel::keep_path`] or any other change of the cache).
    tree: Option<(usize, Vec<Option<usize>>)>,
}

/// Positions the rotary tables cover.
const MAX_POSITIONS: usize = 8192;

impl CandleDecoder {
    /// Loads a GGUF file, keeping its quantization.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        Self::load(path, None)
    }

    /// Loads a GGUF file and re-quantizes every matrix to `dtype` (e.g. Q8_0, which candle
    /// multiplies with SIMD kernels while Q4_1 has none), or keeps the file's types with `None`.
    pub fn load(
        path: &Path,
        requantize: Option<candle_core::quantized::GgmlDType>,
    ) -> Result<Self> {
        Self::load_on(path, requantize, &Device::Cpu)
    }

    /// [`CandleDecoder::load`] onto `device`.
    pub fn load_on(
        path: &Path,
        requantize: Option<candle_core::quantized::GgmlDType>,
        device: &Device,
    ) -> Result<Self> {
        let mut gguf = Gguf::open(path)?;
        let cfg = describe(&gguf)?;
        crate::neural::arch::check_blocks(&gguf, &cfg)?;
        let device = device.clone();
        let mut on = OnDevice {
            device: &device,
            requantize,
        };
        let embd_q = gguf.tensor("token_embd.weight")?;
        let mut embeddings = embd_q.dequantize(&device)?;
        if let Some(scale) = cfg.embedding.scale {
            embeddings = (embeddings * scale as f64)?;
        }
        let vocab = embeddings.dim(0)?;
        let output = match gguf.has("output.weight") {
            true => on.matrix(&mut gguf, "output.weight")?,
            false => QMatMul::from_qtensor(on.blocks(embd_q)?)?,
        };
        let layers = crate::neural::arch::layers::layers(&mut gguf, &cfg, &mut on)?
            .into_iter()
            .map(|w| Layer { w, cache: None })
            .collect();
        let offset = cfg.norm.weight_offset;
        let norm = on.vector(weights(&mut gguf, "output_norm.weight", cfg.dim, offset)?)?;
        let ropes = rope_frequencies(&mut gguf, &cfg)?
            .iter()
            .map(|freqs| rope_table(freqs, &device))
            .collect::<Result<Vec<_>>>()?;
        let rows_per_call = match device.is_cuda() {
            true => RowsPerCall::Padded(CUDA_ROWS),
            false => RowsPerCall::One,
        };
        Ok(CandleDecoder {
            cfg,
            embeddings,
            layers,
            norm,
            output,
            ropes,
            cached: 0,
            vocab,
            device,
            rows_per_call,
            tree: None,
        })
    }

    /// `x · wᵀ` for `x: (1, t, k)`, on a fixed number of rows per call
    /// ([`CandleDecoder::rows_per_call`]), so that a row's product does not depend on `t`.
    fn matmul(&self, w: &QMatMul, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(1)?;
        let per_call = match (w, self.rows_per_call) {
            (QMatMul::QTensor(_), RowsPerCall::Padded(n)) => n,
            _ => 1,
        };
        if t == per_call {
            return Ok(w.forward(x)?);
        }
        let mut parts = Vec::with_capacity(t.div_ceil(per_call));
        for start in (0..t).step_by(per_call) {
            let len = per_call.min(t - start);
            let mut rows = x.narrow(1, start, len)?;
            if len < per_call {
                let last = x.narrow(1, start + len - 1, 1)?;
                let pad = last.broadcast_as((1, per_call - len, x.dim(2)?))?;
                rows = Tensor::cat(&[&rows, &pad.contiguous()?], 1)?;
            }
            parts.push(w.forward(&rows.contiguous()?)?.narrow(1, 0, len)?);
        }
        Ok(Tensor::cat(&parts, 1)?)
    }

    /// RMS normalization with candle-nn's fused kernel. Its rounding matters: activations are
    /// quantized to 8 bits before each quantized matmul, so one-ulp differences here grow into
    /// visible logit differences after 30 layers.
    fn rms_norm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            w,
            self.cfg.norm.eps,
        )?)
    }

    /// The rotary embedding of `x: (1, heads, t, head_dim)`, row i at position
    /// `rows.positions[i]`, from table `table`, in the description's layout.
    fn rope(&self, x: &Tensor, rows: &Rows, table: usize) -> Result<Tensor> {
        let (cos, sin) = &self.ropes[table];
        let (cos, sin) = (
            cos.index_select(&rows.position_ids, 0)?,
            sin.index_select(&rows.position_ids, 0)?,
        );
        let x = x.contiguous()?;
        Ok(match self.cfg.rope.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
        })
    }

    /// The attention block of layer `li` for `x: (1, t, dim)`, fed at cache slots
    /// `pos..pos + t`, its rows placed by `rows` (positions, what each sees); `mask` is the
    /// layer's `(t, attended)` mask ([`Rows::mask`]).
    fn attention(
        &mut self,
        li: usize,
        x: &Tensor,
        pos: usize,
        rows: &Rows,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let heads = self.cfg.heads;
        let (nh, nkv, hd) = (heads.n_head, heads.n_kv_head, heads.head_dim);
        let layer = &self.layers[li];
        let project = |w: &QMatMul, bias: Option<&Tensor>, n: usize| -> Result<Tensor> {
            let mut y = self.matmul(w, x)?;
            if let Some(b) = bias {
                y = y.broadcast_add(b)?;
            }
            Ok(y.reshape((1, t, n, hd))?.transpose(1, 2)?.contiguous()?)
        };
        let bias = |i: usize| layer.w.biases.as_ref().map(|b| &b[i]);
        let mut q = project(&layer.w.wq, bias(0), nh)?;
        let mut k = project(&layer.w.wk, bias(1), nkv)?;
        let v = project(&layer.w.wv, bias(2), nkv)?;
        if let Some([nq, nk]) = &layer.w.qk_norms {
            q = self.rms_norm(&q, nq)?;
            k = self.rms_norm(&k, nk)?;
        }
        let table = layer.w.rope;
        let q = self.rope(&q, rows, table)?;
        let k = self.rope(&k, rows, table)?;
        let attended = rows.attended;
        let (keys, values) = self.cache_append(li, &k.squeeze(0)?, &v.squeeze(0)?, pos)?;
        // Each row's keys and values in the order of its own positions (a tree node's
        // ancestors sit at other slots): what a chain of its branch would have at the same
        // indices, so every sum below takes the same terms in the same order.
        let keys = keys
            .index_select(&rows.slot_ids, 1)?
            .reshape((nkv, 1, t, attended, hd))?;
        let values = values
            .index_select(&rows.slot_ids, 1)?
            .reshape((nkv, 1, t, attended, hd))?;
        // Grouped-query attention: query head h reads key/value head h / rep. Products summed
        // over the head width (not a matmul, whose blocking would depend on t).
        let rep = nh / nkv;
        let q = q.reshape((nkv, rep, t, 1, hd))?;
        let scores = q.broadcast_mul(&keys)?.sum(4)?;
        let scores = (scores / (hd as f64).sqrt())?.broadcast_add(mask)?;
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let y = weights
            .unsqueeze(4)?
            .broadcast_mul(&values)?
            .sum(3)?
            .reshape((nh, t, hd))?
            .transpose(0, 1)?
            .reshape((1, t, nh * hd))?;
        self.matmul(&self.layers[li].w.wo, &y)
    }

    /// Writes `k, v: (n_kv_head, t, head_dim)` at positions `pos..pos + t` of layer `li`'s
    /// cache, growing it (zero-filled, in [`POSITION_STEP`]s) to hold the positions a pass
    /// attends; returns the cache's keys and values.
    fn cache_append(
        &mut self,
        li: usize,
        k: &Tensor,
        v: &Tensor,
        pos: usize,
    ) -> Result<(Tensor, Tensor)> {
        let (nkv, t, hd) = k.dims3()?;
        let need = (pos + t).next_multiple_of(POSITION_STEP);
        let layer = &mut self.layers[li];
        let capacity = layer
            .cache
            .as_ref()
            .map_or(0, |(k, _)| k.dim(1).unwrap_or(0));
        if capacity < need {
            let grown = need.max(2 * capacity).next_multiple_of(POSITION_STEP);
            let keys = Tensor::zeros((nkv, grown, hd), DType::F32, &self.device)?;
            let values = Tensor::zeros((nkv, grown, hd), DType::F32, &self.device)?;
            if let Some((old_k, old_v)) = &layer.cache {
                keys.slice_set(old_k, 1, 0)?;
                values.slice_set(old_v, 1, 0)?;
            }
            layer.cache = Some((keys, values));
        }
        let (keys, values) = layer.cache.as_ref().expect("allocated above");
        keys.slice_set(&k.contiguous()?, 1, pos)?;
        values.slice_set(&v.contiguous()?, 1, pos)?;
        Ok((keys.clone(), values.clone()))
    }

    /// One pass over `tokens` fed after the cache: a chain, or the tree of `parents`. Returns
    /// each row's logits.
    fn pass(&mut self, tokens: &[u32], parents: Option<&[Option<usize>]>) -> Result<Vec<Vec<f32>>> {
        crate::lm::check_vocab(tokens, self.vocab)?;
        self.tree = None;
        let (pos, t) = (self.cached, tokens.len());
        let rows = Rows::new(t, pos, parents, &self.device)?;
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embeddings.index_select(&ids, 0)?.unsqueeze(0)?;
        let global = rows.mask(None, &self.device)?;
        let windowed = match self.layers.iter().find_map(|l| l.w.window) {
            Some(w) => Some(rows.mask(Some(w), &self.device)?),
            None => None,
        };
        for li in 0..self.layers.len() {
            let h = self.rms_norm(&x, &self.layers[li].w.attn_norm)?;
            let mask = match (self.layers[li].w.window, &windowed) {
                (Some(_), Some(m)) => m,
                _ => &global,
            };
            let mut attended = self.attention(li, &h, pos, &rows, mask)?;
            let layer = &self.layers[li];
            if let Some([post_attention, _]) = &layer.w.post_norms {
                attended = self.rms_norm(&attended, post_attention)?;
            }
            x = (attended + x)?;
            let h = self.rms_norm(&x, &layer.w.ffn_norm)?;
            let gate = self.matmul(&layer.w.w_gate, &h)?;
            let gate = match self.cfg.activation {
                Activation::Silu => candle_nn::ops::silu(&gate)?,
                Activation::GeluTanh => gate.gelu()?,
            };
            let up = self.matmul(&layer.w.w_up, &h)?;
            let mut y = self.matmul(&layer.w.w_down, &(gate * up)?)?;
            if let Some([_, post_ffw]) = &layer.w.post_norms {
                y = self.rms_norm(&y, post_ffw)?;
            }
            x = (y + x)?;
        }
        let x = self.rms_norm(&x, &self.norm)?;
        let logits = self
            .matmul(&self.output, &x)?
            .squeeze(0)?
            .to_dtype(DType::F32)?;
        self.cached += t;
        Ok(logits.to_vec2()?)
    }
}

/// Where the rows of a pass stand: row i, fed at cache slot `pos + i`, stands at position
/// `positions[i]` and sees, in position order, the cached slots `0..pos` and then the slots of
/// its branch (a chain: the rows before it; a tree: its ancestors), `positions[i] + 1` slots.
struct Rows {
    positions: Vec<usize>,
    /// `positions` on the device, for the rotary tables.
    position_ids: Tensor,
    /// Each row's slots in position order, padded to `attended` (with slot 0, masked), all
    /// rows one after another.
    slot_ids: Tensor,
    /// Positions a row's attention spans: the furthest row's, rounded up to
    /// [`POSITION_STEP`].
    attended: usize,
}

impl Rows {
    /// The rows of `t` tokens fed at slot `pos`: a chain, or the tree whose node i follows
    /// `parents[i]` (`None`: the cache; node 0 only; each after its parent).
    fn new(
        t: usize,
        pos: usize,
        parents: Option<&[Option<usize>]>,
        device: &Device,
    ) -> Result<Rows> {
        let mut branches: Vec<Vec<usize>> = Vec::with_capacity(t);
        for i in 0..t {
            let parent = match parents {
                None => i.checked_sub(1),
                Some(p) => p[i],
            };
            let mut branch = match parent {
                Some(p) => branches[p].clone(),
                None => Vec::new(),
            };
            branch.push(pos + i);
            branches.push(branch);
        }
        let positions: Vec<usize> = branches.iter().map(|b| pos + b.len() - 1).collect();
        let furthest = positions.iter().max().map_or(pos, |&p| p + 1);
        let attended = furthest.next_multiple_of(POSITION_STEP);
        let slots: Vec<u32> = branches
            .iter()
            .flat_map(|branch| {
                let seen = (0..pos).chain(branch.iter().copied());
                seen.chain(std::iter::repeat(0))
                    .take(attended)
                    .map(|s| s as u32)
            })
            .collect();
        let ids: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        Ok(Rows {
            position_ids: Tensor::new(ids, device)?,
            slot_ids: Tensor::from_vec(slots, t * attended, device)?,
            positions,
            attended,
        })
    }

    /// The additive mask over each row's `attended` positions: row i sees positions
    /// `first..=positions[i]`, where `first` is 0, or the start of a `window`.
    fn mask(&self, window: Option<usize>, device: &Device) -> Result<Tensor> {
        let attended = self.attended;
        let mask: Vec<f32> = self
            .positions
            .iter()
            .flat_map(|&p| {
                let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
                (0..attended).map(move |j| {
                    if j > p || j < first {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        Ok(Tensor::from_vec(
            mask,
            (self.positions.len(), attended),
            device,
        )?)
    }
}

/// The `(cos, sin)` tables of `freqs` for [`MAX_POSITIONS`] positions.
fn rope_table(freqs: &[f32], device: &Device) -> Result<(Tensor, Tensor)> {
    let angles: Vec<f32> = (0..MAX_POSITIONS)
        .flat_map(|p| freqs.iter().map(move |f| p as f32 * f))
        .collect();
    let angles = Tensor::from_vec(angles, (MAX_POSITIONS, freqs.len()), device)?;
    Ok((angles.cos()?, angles.sin()?))
}

impl LanguageModel for CandleDecoder {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        self.pass(tokens, None)
    }

    fn cache_len(&self) -> usize {
        self.cached
    }

    fn truncate(&mut self, len: usize) {
        // Positions past `len` stay in the cache, masked out of every later pass (a row weighs
        // them exactly 0) until a pass writes over them.
        self.cached = len.min(self.cached);
        self.tree = None;
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.cfg.eos
    }

    fn bos_token(&self) -> Option<u32> {
        self.cfg.bos
    }

    fn max_tree_rows(&self) -> usize {
        MAX_TREE_ROWS
    }

    /// Every row at once; each is the same bits as its branch fed as a chain (its keys are
    /// gathered in the order of its own positions, `Rows`).
    fn score_tree_first(
        &mut self,
        tokens: &[u32],
        parents: &[Option<usize>],
        _first: usize,
        _form: RowForm,
    ) -> Result<Vec<Logits>> {
        crate::lm::check_tree_within(tokens.len(), parents, MAX_TREE_ROWS)?;
        let base = self.cached;
        let rows = self.pass(tokens, Some(parents))?;
        self.tree = Some((base, parents.to_vec()));
        Ok(rows.into_iter().map(Logits::Dense).collect())
    }

    fn keep_path(&mut self, path: &[usize]) -> Result<()> {
        let Some((base, parents)) = self.tree.take() else {
            return Err(crate::error::Error::Model(
                "keep_path: no tree pass to keep a path of".into(),
            ));
        };
        crate::lm::check_path(path, &parents)?;
        // The path's keys and values move to the slots a chain of it would have filled.
        let slots: Vec<u32> = path.iter().map(|&n| (base + n) as u32).collect();
        let slots = Tensor::new(slots, &self.device)?;
        for layer in &mut self.layers {
            if let Some((keys, values)) = &layer.cache {
                let (k, v) = (
                    keys.index_select(&slots, 1)?,
                    values.index_select(&slots, 1)?,
                );
                keys.slice_set(&k, 1, base)?;
                values.slice_set(&v, 1, base)?;
            }
        }
        self.cached = base + path.len();
        Ok(())
    }
}

/// Nodes a token tree verified in one pass may have.
const MAX_TREE_ROWS: usize = 64;
