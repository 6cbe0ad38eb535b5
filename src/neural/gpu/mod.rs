//! The GPU step on infgram's own kernels (`--device cuda`).
//!
//! * `kernels.cu`: the fused kernels of a pass (five launches a layer, eight for Gemma;
//!   `build.rs` compiles them with the pinned nvcc into a fat binary, sm_90 code and PTX, in a
//!   build with the `cuda` feature);
//! * `decoder` (`cuda` feature): `GpuDecoder`, the model on the GPU, each pass replayed from
//!   a CUDA graph captured once per row count;
//! * [`mod@reference`]: the same pass on the CPU in the kernels' order of operations (lanes,
//!   butterflies, trees), every build: the oracle the kernels are checked against on a GPU,
//!   and, tested here, batch-invariant and in agreement with the native pass.
//!
//! What the two share is here: the shapes the kernels take, the pass's parameters
//! ([`params`]), the model around a pass ([`Sequence`]: cache length, chunks, token trees,
//! rows of logits handed out as asked, or only their greedy picks), the rotary tables, the
//! weight types the kernels read.

#[cfg(feature = "cuda")]
pub mod decoder;
pub mod reference;

use crate::error::{Error, Result};
use crate::lm::{LanguageModel, Logits, RowForm};
use crate::neural::arch::Architecture;
use candle_core::quantized::GgmlDType;
use std::ops::Range;

/// Positions the GPU's KV cache holds (allocated at load) and its rotary tables cover.
pub const CAPACITY: usize = 8192;
/// Rows one pass takes (a token tree's nodes, or a chunk of a longer prompt).
pub const MAX_ROWS: usize = 64;
/// Rows of a pass the widest matrix-kernel block takes together (`TOKENS` in
/// `kernels/common.cuh`; blocks of 1, 2 and 4 rows serve shorter passes).
pub const TOKENS: usize = 8;
/// Positions of one attention block's chunk (`CHUNK` in `kernels/common.cuh`).
pub const CHUNK: usize = 32;
/// Warps of an attention block (`ATT_WARPS`): warp w takes a chunk's positions w, w + 8, ….
pub const ATT_WARPS: usize = 8;
/// Chunks a row's attention has at most (`MAX_CHUNKS`): the stride of its partials.
pub const MAX_CHUNKS: usize = CAPACITY / CHUNK;
/// Logits of a row one `pick_part` block takes (`GREEDY_CHUNK`).
pub const GREEDY_CHUNK: usize = 4096;
/// Lanes of a warp.
const WARP: usize = 32;

/// The GGML id of a block type the kernels decode (`decode32`), or `None` (such matrices
/// are re-quantized to Q8_0 at load, as the native backend does).
pub fn gpu_type(t: GgmlDType) -> Option<i32> {
    Some(match t {
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        _ => return None,
    })
}

/// The `(cos, sin)` tables of `freqs` for `positions` positions, as the native pass forms
/// them (`p as f32 · freq`, then libm's cos and sin).
pub fn rope_table(freqs: &[f32], positions: usize) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(positions * freqs.len());
    let mut sin = Vec::with_capacity(positions * freqs.len());
    for p in 0..positions {
        for &f in freqs {
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// Checks that the kernels take `cfg`'s shapes (before anything is put on a device).
pub fn check_shapes(cfg: &Architecture) -> Result<()> {
    let hd = cfg.heads.head_dim;
    let dims_ok = [32, 64, 128, 256].contains(&hd)
        && cfg.dim.is_multiple_of(32)
        && cfg.heads.n_kv_head > 0
        && cfg.heads.n_head.is_multiple_of(cfg.heads.n_kv_head);
    if !dims_ok {
        return Err(Error::input(format!(
            "--device cuda: the GPU kernels take heads of 32, 64, 128 or 256 dimensions \
             and widths in multiples of 32; this model's heads are {hd} wide and \
             its width {}: run it on the CPU (leave --device out)",
            cfg.dim
        )));
    }
    Ok(())
}

/// The length of a pass's parameter array ([`params`]).
pub const PARAMS_LEN: usize = 1 + 2 * MAX_ROWS + MAX_ROWS * MAX_ROWS;

/// How a pass of `tokens` after `pos` cached positions, a chain or the tree of `parents`, is
/// described to the kernels: `params[0]` the cached positions before it; `params[1 + i]` row
/// i's token; `params[1 + T + i]` its position; `params[1 + 2T + i·T + d]` the cache slot of the
/// node at depth d of its branch (T = [`MAX_ROWS`]). Row i is written at slot `pos + i` and
/// sees positions `0..=position` (slots `0..pos`, then its branch).
pub fn params(pos: usize, tokens: &[u32], parents: Option<&[Option<usize>]>) -> Result<Vec<i32>> {
    let t = tokens.len();
    if t == 0 || t > MAX_ROWS {
        return Err(Error::Model(format!("a GPU pass of {t} rows")));
    }
    if pos + t > CAPACITY {
        return Err(Error::input(format!(
            "--device cuda: the GPU cache holds {CAPACITY} positions and this sequence \
             needs {}; shorten the prompt or --max-tokens",
            pos + t
        )));
    }
    let mut params = vec![0i32; PARAMS_LEN];
    params[0] = pos as i32;
    let mut depth = vec![0usize; t];
    for i in 0..t {
        params[1 + i] = tokens[i] as i32;
        let parent = match parents {
            None => i.checked_sub(1),
            Some(p) => p[i],
        };
        let base = 1 + 2 * MAX_ROWS;
        if let Some(p) = parent {
            depth[i] = depth[p] + 1;
            for d in 0..depth[p] + 1 {
                params[base + i * MAX_ROWS + d] = params[base + p * MAX_ROWS + d];
            }
        }
        params[base + i * MAX_ROWS + depth[i]] = (pos + i) as i32;
        params[1 + MAX_ROWS + i] = (pos + depth[i]) as i32;
    }
    Ok(params)
}

/// One pass of the plan above, on the device (`decoder::GpuDecoder`) or on the CPU
/// ([`reference::ReferenceDecoder`]); [`Sequence`] makes either a [`LanguageModel`].
pub trait Pass {
    /// The model's description.
    fn architecture(&self) -> &Architecture;
    /// Rows of the output projection.
    fn vocab(&self) -> usize;
    /// Runs a pass of `tokens` (at most [`MAX_ROWS`]) after `pos` cached positions, placed by
    /// `params` ([`params`]). Its rows of logits stay with the pass (on the device) until
    /// [`Pass::rows`] asks for them or the next pass replaces them.
    fn run(&mut self, params: &[i32], pos: usize, tokens: &[u32]) -> Result<()>;
    /// Rows `rows` of the last pass's logits (each asked for at most once); an empty range
    /// waits for the pass and reports its errors.
    fn rows(&mut self, rows: Range<usize>) -> Result<Vec<Vec<f32>>>;
    /// The greedy pick of each of rows `rows` of the last pass, as [`crate::lm::greedy_pick`]
    /// picks it from the row (id and logit; `None` where no logit is above −∞), without
    /// copying the rows back (each row asked for at most once, as [`Pass::rows`]).
    fn picks(&mut self, rows: Range<usize>) -> Result<Vec<Option<(u32, f32)>>>;
    /// Moves the keys and values at slots `base + path[i]` to `base + i`, in order.
    fn move_path(&mut self, base: usize, path: &[usize]) -> Result<()>;
}

/// A [`Pass`] as a language model: the cached length (a rollback is a length change), long
/// inputs in passes of [`MAX_ROWS`], token trees (the last tree kept until a path of it is, or
/// anything else changes the cache), and rows of logits copied back only as they are asked
/// for: `score_first`'s first rows, then `score_more`'s as verification accepts (a 16-row
/// pass whose draft fails early copies 8 of SmolLM2's 49,152-logit rows, not 16), and none
/// for a prompt (`feed`); a pass asked for in [`RowForm::Greedy`] copies back each row's
/// greedy pick ([`Pass::picks`]) instead of the row.
pub struct Sequence<P> {
    pass: P,
    cached: usize,
    tree: Option<(usize, Vec<Option<usize>>)>,
    /// Rows of the last pass not handed out yet (after `score_first`), and in what form.
    held: Range<usize>,
    form: RowForm,
}

impl<P: Pass> Sequence<P> {
    /// `pass` with an empty cache.
    pub fn new(pass: P) -> Self {
        Sequence {
            pass,
            cached: 0,
            tree: None,
            held: 0..0,
            form: RowForm::Full,
        }
    }

    /// The pass itself.
    pub fn pass_mut(&mut self) -> &mut P {
        &mut self.pass
    }

    /// One pass after the cache: a chain, or the tree of `parents`; its rows held.
    fn step(&mut self, tokens: &[u32], parents: Option<&[Option<usize>]>) -> Result<()> {
        let params = params(self.cached, tokens, parents)?;
        (self.held, self.form) = (0..0, RowForm::Full);
        self.pass.run(&params, self.cached, tokens)?;
        self.cached += tokens.len();
        self.held = 0..tokens.len();
        Ok(())
    }

    /// The next at most `count` held rows' range, no longer held.
    fn next_held(&mut self, count: usize) -> Range<usize> {
        let end = self.held.end.min(self.held.start + count);
        let next = self.held.start..end;
        self.held.start = end;
        next
    }

    /// The next at most `count` held rows (none once all were handed out).
    fn take(&mut self, count: usize) -> Result<Vec<Vec<f32>>> {
        let next = self.next_held(count);
        self.pass.rows(next)
    }

    /// The next at most `count` held rows as the decode loop's rows, in the pass's form.
    fn take_logits(&mut self, count: usize) -> Result<Vec<Logits>> {
        if self.form == RowForm::Full {
            return Ok(self.take(count)?.into_iter().map(Logits::Dense).collect());
        }
        let next = self.next_held(count);
        let vocab = self.pass.vocab();
        let picks = self.pass.picks(next)?;
        Ok(picks
            .into_iter()
            .map(|p| Logits::of_pick(vocab, p))
            .collect())
    }
}

impl<P: Pass> LanguageModel for Sequence<P> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        crate::lm::check_vocab(tokens, self.pass.vocab())?;
        self.tree = None;
        let mut rows = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(MAX_ROWS) {
            self.step(chunk, None)?;
            rows.extend(self.take(chunk.len())?);
        }
        Ok(rows)
    }

    /// The passes of `tokens`, no row copied back.
    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        crate::lm::check_vocab(tokens, self.pass.vocab())?;
        self.tree = None;
        for chunk in tokens.chunks(MAX_ROWS) {
            self.step(chunk, None)?;
        }
        self.held = 0..0;
        self.pass.rows(0..0).map(drop)
    }

    /// A pass of at most [`MAX_ROWS`] copies back its first `first` rows (or their picks); a
    /// longer input runs as `forward`.
    fn score_first(&mut self, tokens: &[u32], first: usize, form: RowForm) -> Result<Vec<Logits>> {
        if tokens.is_empty() || tokens.len() > MAX_ROWS {
            return self.score(tokens);
        }
        crate::lm::check_vocab(tokens, self.pass.vocab())?;
        self.tree = None;
        self.step(tokens, None)?;
        self.form = form;
        self.take_logits(first.max(1))
    }

    fn score_more(&mut self, count: usize) -> Result<Vec<Logits>> {
        self.take_logits(count)
    }

    fn cache_len(&self) -> usize {
        self.cached
    }

    fn truncate(&mut self, len: usize) {
        self.cached = len.min(self.cached);
        self.tree = None;
        self.held = 0..0;
    }

    fn vocab_size(&self) -> usize {
        self.pass.vocab()
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.pass.architecture().eos
    }

    fn bos_token(&self) -> Option<u32> {
        self.pass.architecture().bos
    }

    fn max_tree_rows(&self) -> usize {
        MAX_ROWS
    }

    fn score_tree_first(
        &mut self,
        tokens: &[u32],
        parents: &[Option<usize>],
        first: usize,
        form: RowForm,
    ) -> Result<Vec<Logits>> {
        crate::lm::check_tree_within(tokens.len(), parents, MAX_ROWS)?;
        crate::lm::check_vocab(tokens, self.pass.vocab())?;
        let base = self.cached;
        self.step(tokens, Some(parents))?;
        self.tree = Some((base, parents.to_vec()));
        self.form = form;
        self.take_logits(first.max(1))
    }

    fn keep_path(&mut self, path: &[usize]) -> Result<()> {
        let Some((base, parents)) = self.tree.take() else {
            return Err(Error::Model(
                "keep_path: no tree pass to keep a path of".into(),
            ));
        };
        crate::lm::check_path(path, &parents)?;
        self.held = 0..0;
        self.pass.move_path(base, path)?;
        self.cached = base + path.len();
        Ok(())
    }
}

/// The sum of one value per lane as the warp's butterfly forms it (every lane ends with
/// these bits).
fn warp_sum(mut lanes: [f32; WARP]) -> f32 {
    let mut m = WARP / 2;
    while m > 0 {
        let before = lanes;
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = before[l] + before[l ^ m];
        }
        m /= 2;
    }
    lanes[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes and GGML type ids the kernels (`kernels.cu` and the parts it includes) define
    /// for themselves are the ones the decoder allocates, launches and tags matrices by (a
    /// partials buffer sized for other chunks would be overrun; a matrix tagged with another
    /// type's id would be decoded as that type).
    #[test]
    fn the_kernels_sizes_and_type_ids_are_the_decoder_s() {
        let cu = [
            include_str!("kernels.cu"),
            include_str!("kernels/common.cuh"),
            include_str!("kernels/matvec.cu"),
            include_str!("kernels/embed_norm.cu"),
            include_str!("kernels/rope.cu"),
            include_str!("kernels/attention.cu"),
            include_str!("kernels/pick.cu"),
        ]
        .concat();
        let types = [
            ("Q4_0", GgmlDType::Q4_0),
            ("Q4_1", GgmlDType::Q4_1),
            ("Q5_0", GgmlDType::Q5_0),
            ("Q5_1", GgmlDType::Q5_1),
            ("Q8_0", GgmlDType::Q8_0),
            ("Q4_K", GgmlDType::Q4K),
            ("Q5_K", GgmlDType::Q5K),
            ("Q6_K", GgmlDType::Q6K),
        ];
        let type_ids = types.map(|(name, t)| {
            let id = gpu_type(t).expect("a type the kernels decode");
            format!("#define {name} {id}")
        });
        for line in [
            format!("#define TOKENS {TOKENS}"),
            format!("#define CHUNK {CHUNK}"),
            format!("#define ATT_WARPS {ATT_WARPS}"),
            format!("#define MAX_CHUNKS ({CAPACITY} / CHUNK)"),
            format!("#define GREEDY_CHUNK {GREEDY_CHUNK}"),
        ]
        .into_iter()
        .chain(type_ids)
        {
            assert!(cu.lines().any(|l| l == line), "kernels.cu lacks `{line}`");
        }
    }
}
