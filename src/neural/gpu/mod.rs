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
//! ([`params_of`]: each row's token, position, sequence and cache slots), the model around a
//! pass ([`Sequence`]: one sequence or several, each in a room of the cache, with its length,
//! chunks, token trees, rows of logits handed out as asked, or only their greedy picks), the
//! rotary tables, the weight types the kernels read.

#[cfg(feature = "cuda")]
pub mod decoder;
pub mod reference;

use crate::error::{Error, Result};
use crate::lm::{LanguageModel, Logits, RowForm, SeqPart, Sequences};
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

/// The length of a pass's parameter array ([`params_of`]).
pub const PARAMS_LEN: usize = BRANCHES + MAX_ROWS * MAX_ROWS;

/// Where each array of a pass's parameters starts ([`params_of`]; the kernels' `row_*` in
/// `kernels/common.cuh`).
const TOKENS_AT: usize = 1;
const POSITIONS_AT: usize = TOKENS_AT + MAX_ROWS;
const CACHED_AT: usize = POSITIONS_AT + MAX_ROWS;
const BASES_AT: usize = CACHED_AT + MAX_ROWS;
const SLOTS_AT: usize = BASES_AT + MAX_ROWS;
/// Where the rows' branches start: what a pass of t rows uploads ends at `BRANCHES + t·T`.
pub const BRANCHES: usize = SLOTS_AT + MAX_ROWS;

/// One sequence's rows in a pass: `tokens` after the `cached` positions of the sequence whose
/// position 0 is cache slot `base`, a chain or the tree of `parents`.
#[derive(Clone, Copy, Debug)]
pub struct PassPart<'a> {
    pub base: usize,
    pub cached: usize,
    pub tokens: &'a [u32],
    pub parents: Option<&'a [Option<usize>]>,
}

/// How a pass of several sequences' rows (`parts`, their rows in order) is described to the
/// kernels, T = [`MAX_ROWS`]: `params[0]` the rows of the pass; for row i, `params[1 + i]` its
/// token, `params[1 + T + i]` its position in its sequence, `params[1 + 2T + i]` the positions
/// its sequence held before the pass (`cached`), `params[1 + 3T + i]` the slot of its
/// sequence's position 0 (`base`), `params[1 + 4T + i]` the slot it is written at, and
/// `params[1 + 5T + i·T + d]` the slot of the node at depth d of its branch. A part's row i is
/// written at slot `base + cached + i` and sees its sequence's positions `0..=position`: slots
/// `base..base + cached`, then its branch. Rows of different parts see nothing of each other.
pub fn params_of(parts: &[PassPart]) -> Result<Vec<i32>> {
    let t: usize = parts.iter().map(|p| p.tokens.len()).sum();
    if t == 0 || t > MAX_ROWS {
        return Err(Error::Model(format!("a GPU pass of {t} rows")));
    }
    let mut params = vec![0i32; PARAMS_LEN];
    params[0] = t as i32;
    let mut at = 0;
    for part in parts {
        let (base, pos, n) = (part.base, part.cached, part.tokens.len());
        if pos + n > CAPACITY {
            return Err(Error::input(format!(
                "--device cuda: the GPU cache holds {CAPACITY} positions a sequence and this \
                 sequence needs {}; shorten the prompt or --max-tokens",
                pos + n
            )));
        }
        let mut depth = vec![0usize; n];
        for i in 0..n {
            let row = at + i;
            params[TOKENS_AT + row] = part.tokens[i] as i32;
            let parent = match part.parents {
                None => i.checked_sub(1),
                Some(p) => p[i],
            };
            let branch = BRANCHES + row * MAX_ROWS;
            if let Some(p) = parent {
                depth[i] = depth[p] + 1;
                let from = BRANCHES + (at + p) * MAX_ROWS;
                params.copy_within(from..from + depth[p] + 1, branch);
            }
            let slot = (base + pos + i) as i32;
            params[branch + depth[i]] = slot;
            params[POSITIONS_AT + row] = (pos + depth[i]) as i32;
            params[CACHED_AT + row] = pos as i32;
            params[BASES_AT + row] = base as i32;
            params[SLOTS_AT + row] = slot;
        }
        at += n;
    }
    Ok(params)
}

/// A row of a pass as its parameters place it ([`params_of`]), read as the kernels read them.
#[derive(Clone, Copy)]
pub(crate) struct RowParams<'a> {
    params: &'a [i32],
    row: usize,
}

impl<'a> RowParams<'a> {
    pub(crate) fn new(params: &'a [i32], row: usize) -> Self {
        RowParams { params, row }
    }

    fn at(&self, array: usize) -> usize {
        self.params[array + self.row] as usize
    }

    /// The row's position in its sequence.
    pub(crate) fn position(&self) -> usize {
        self.at(POSITIONS_AT)
    }

    /// The cache slot the row's keys and values are written at.
    pub(crate) fn slot(&self) -> usize {
        self.at(SLOTS_AT)
    }

    /// The cache slot the row reads for position `j` of its sequence (`j ≤ position`).
    pub(crate) fn slot_of(&self, j: usize) -> usize {
        let cached = self.at(CACHED_AT);
        match j < cached {
            true => self.at(BASES_AT) + j,
            false => self.params[BRANCHES + self.row * MAX_ROWS + (j - cached)] as usize,
        }
    }
}

/// One pass of the plan above, on the device (`decoder::GpuDecoder`) or on the CPU
/// ([`reference::ReferenceDecoder`]); [`Sequence`] makes either a [`LanguageModel`].
pub trait Pass {
    /// The model's description.
    fn architecture(&self) -> &Architecture;
    /// Rows of the output projection.
    fn vocab(&self) -> usize;
    /// Runs a pass of `tokens` (at most [`MAX_ROWS`]), placed by `params` ([`params_of`]). Its
    /// rows of logits stay with the pass (on the device) until [`Pass::rows`] asks for them or
    /// the next pass replaces them.
    fn run(&mut self, params: &[i32], tokens: &[u32]) -> Result<()>;
    /// Rows `rows` of the last pass's logits (each asked for at most once); an empty range
    /// waits for the pass and reports its errors.
    fn rows(&mut self, rows: Range<usize>) -> Result<Vec<Vec<f32>>>;
    /// The greedy pick of each of rows `rows` of the last pass, as [`crate::lm::greedy_pick`]
    /// picks it from the row (id and logit; `None` where no logit is above −∞), without
    /// copying the rows back (each row asked for at most once, as [`Pass::rows`]).
    fn picks(&mut self, rows: Range<usize>) -> Result<Vec<Option<(u32, f32)>>>;
    /// Moves the keys and values at slots `from[i]` to `to + i`, in order, in every layer (a
    /// later slot never reads one an earlier move wrote, where `from` ascends or lies apart).
    fn move_slots(&mut self, from: &[usize], to: usize) -> Result<()>;
    /// Sequences the cache has rooms for ([`CAPACITY`] slots each; sequence s: slots
    /// `s·CAPACITY..`).
    fn rooms(&self) -> usize;
    /// Gives the cache rooms for at least `rooms` sequences, the positions it holds kept.
    fn add_rooms(&mut self, rooms: usize) -> Result<()>;
}

/// A [`Pass`] as a language model of one sequence or several ([`Sequences`]), each in its own
/// room of the cache: its cached length (a rollback is a length change), long inputs in passes
/// of [`MAX_ROWS`], token trees (the last tree kept until a path of it is, or anything else
/// changes the cache), and rows of logits copied back only as they are asked for:
/// `score_first`'s first rows, then `score_more`'s as verification accepts (a 16-row pass
/// whose draft fails early copies 8 of SmolLM2's 49,152-logit rows, not 16), and none for a
/// prompt (`feed`); a pass asked for in [`RowForm::Greedy`] copies back each row's greedy pick
/// ([`Pass::picks`]) instead of the row. Several sequences' new tokens go through one pass
/// ([`Sequences::score_parts`]): each row reads only its sequence's room, and the kernels give
/// a row the same bits whatever else the pass holds.
pub struct Sequence<P> {
    pass: P,
    seqs: Vec<SeqState>,
    /// The sequence the [`LanguageModel`] methods act on.
    current: usize,
    /// Rows of the last pass not handed out yet (after `score_first`), whose sequence they
    /// are, and in what form.
    held: Range<usize>,
    held_by: usize,
    form: RowForm,
}

/// One sequence of a [`Sequence`]: its cached positions, its last token tree (the cached
/// length before it, its parents), and rows of a several-sequence pass not handed out yet.
#[derive(Default)]
struct SeqState {
    cached: usize,
    tree: Option<(usize, Vec<Option<usize>>)>,
    rows: std::collections::VecDeque<Logits>,
}

impl SeqState {
    /// Forgets the tree and the rows held of the sequence's last pass (its cache changes).
    fn forget(&mut self) {
        self.tree = None;
        self.rows.clear();
    }
}

impl<P: Pass> Sequence<P> {
    /// `pass` with one empty sequence.
    pub fn new(pass: P) -> Self {
        Sequence {
            pass,
            seqs: vec![SeqState::default()],
            current: 0,
            held: 0..0,
            held_by: 0,
            form: RowForm::Full,
        }
    }

    /// The pass itself.
    pub fn pass_mut(&mut self) -> &mut P {
        &mut self.pass
    }

    /// The selected sequence.
    fn seq(&mut self) -> &mut SeqState {
        &mut self.seqs[self.current]
    }

    /// The slot of sequence `seq`'s position 0.
    fn base(seq: usize) -> usize {
        seq * CAPACITY
    }

    /// One pass after the selected sequence's cache (whose last pass the caller forgot:
    /// `changed`): a chain, or the tree of `parents`; its rows held.
    fn step(&mut self, tokens: &[u32], parents: Option<&[Option<usize>]>) -> Result<()> {
        let current = self.current;
        let part = PassPart {
            base: Self::base(current),
            cached: self.seqs[current].cached,
            tokens,
            parents,
        };
        let params = params_of(&[part])?;
        (self.held, self.form) = (0..0, RowForm::Full);
        self.pass.run(&params, tokens)?;
        self.seq().cached += tokens.len();
        (self.held, self.held_by) = (0..tokens.len(), current);
        Ok(())
    }

    /// The next at most `count` held rows' range, no longer held (none when the last pass
    /// was another sequence's).
    fn next_held(&mut self, count: usize) -> Range<usize> {
        if self.held_by != self.current {
            return 0..0;
        }
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

    /// The next at most `count` held rows as the decode loop's rows, in the pass's form
    /// (first those a several-sequence pass left the sequence).
    fn take_logits(&mut self, count: usize) -> Result<Vec<Logits>> {
        let kept = &mut self.seqs[self.current].rows;
        if !kept.is_empty() {
            let n = count.min(kept.len());
            return Ok(kept.drain(..n).collect());
        }
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

    /// Forgets the selected sequence's tree and held rows (its cache changes).
    fn changed(&mut self) {
        let current = self.current;
        self.seq().forget();
        if self.held_by == current {
            self.held = 0..0;
        }
    }

    /// Sequence `seq`, or an error naming it.
    fn check_seq(&self, seq: usize) -> Result<()> {
        match seq < self.seqs.len() {
            true => Ok(()),
            false => Err(Error::Model(format!("no sequence {seq}"))),
        }
    }
}

impl<P: Pass> LanguageModel for Sequence<P> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        crate::lm::check_vocab(tokens, self.pass.vocab())?;
        self.changed();
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
        self.changed();
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
        self.changed();
        self.step(tokens, None)?;
        self.form = form;
        self.take_logits(first.max(1))
    }

    fn score_more(&mut self, count: usize) -> Result<Vec<Logits>> {
        self.take_logits(count)
    }

    fn cache_len(&self) -> usize {
        self.seqs[self.current].cached
    }

    fn truncate(&mut self, len: usize) {
        self.changed();
        let s = self.seq();
        s.cached = len.min(s.cached);
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
        self.changed();
        let base = self.seq().cached;
        self.step(tokens, Some(parents))?;
        self.seq().tree = Some((base, parents.to_vec()));
        self.form = form;
        self.take_logits(first.max(1))
    }

    fn keep_path(&mut self, path: &[usize]) -> Result<()> {
        let Some((base, parents)) = self.seq().tree.take() else {
            return Err(Error::Model(
                "keep_path: no tree pass to keep a path of".into(),
            ));
        };
        crate::lm::check_path(path, &parents)?;
        self.changed();
        let at = Self::base(self.current) + base;
        let from: Vec<usize> = path.iter().map(|&n| at + n).collect();
        self.pass.move_slots(&from, at)?;
        self.seq().cached = base + path.len();
        Ok(())
    }

    fn sequences(&mut self) -> Option<&mut dyn Sequences> {
        Some(self)
    }
}

impl<P: Pass> Sequences for Sequence<P> {
    fn sequence_count(&self) -> usize {
        self.seqs.len()
    }

    /// A new sequence in a room of its own (the cache grows when every room is taken).
    fn add_sequence(&mut self) -> Result<usize> {
        let n = self.seqs.len() + 1;
        if n > self.pass.rooms() {
            self.pass.add_rooms(n)?;
        }
        self.seqs.push(SeqState::default());
        Ok(n - 1)
    }

    fn select(&mut self, seq: usize) -> Result<()> {
        self.check_seq(seq)?;
        self.current = seq;
        Ok(())
    }

    /// Empties sequence `seq`; its room stays with it (the cache does not shrink).
    fn release(&mut self, seq: usize) {
        if let Some(s) = self.seqs.get_mut(seq) {
            *s = SeqState::default();
            if self.held_by == seq {
                self.held = 0..0;
            }
        }
    }

    fn cache_bytes_per_token(&self) -> usize {
        let cfg = self.pass.architecture();
        2 * cfg.heads.kv_width() * std::mem::size_of::<f32>() * cfg.n_layer
    }

    /// A sequence holds its whole room, however few positions it uses.
    fn cache_slack_tokens(&self) -> usize {
        CAPACITY
    }

    fn copy_cache(&mut self, from: usize, to: usize, len: usize) -> Result<()> {
        self.check_seq(from)?;
        self.check_seq(to)?;
        if len > self.seqs[from].cached || from == to {
            return Err(Error::Model(format!(
                "copy_cache: {len} positions of sequence {from} into {to}"
            )));
        }
        let slots: Vec<usize> = (0..len).map(|j| Self::base(from) + j).collect();
        self.pass.move_slots(&slots, Self::base(to))?;
        self.release(to);
        self.seqs[to].cached = len;
        Ok(())
    }

    /// The parts' rows in passes of at most [`MAX_ROWS`] (a long part goes on in the next),
    /// each part's rows copied back whole when it asks for any (only their greedy picks in
    /// [`RowForm::Greedy`]).
    fn score_parts(&mut self, parts: &[SeqPart]) -> Result<Vec<Vec<Logits>>> {
        let vocab = self.pass.vocab();
        for (i, part) in parts.iter().enumerate() {
            self.check_seq(part.seq)?;
            crate::lm::check_vocab(part.tokens, vocab)?;
            if parts[..i].iter().any(|p| p.seq == part.seq) {
                return Err(Error::Model(format!(
                    "score_parts: sequence {} twice in one pass",
                    part.seq
                )));
            }
        }
        self.held = 0..0;
        let mut rows: Vec<Vec<Logits>> = vec![Vec::new(); parts.len()];
        // Tokens of each part already passed.
        let mut done = vec![0usize; parts.len()];
        for part in parts {
            self.seqs[part.seq].forget();
        }
        while let Some(pass) = next_pass(parts, &done) {
            let pieces: Vec<PassPart> = pass
                .iter()
                .map(|(i, r)| PassPart {
                    base: Self::base(parts[*i].seq),
                    cached: self.seqs[parts[*i].seq].cached,
                    tokens: &parts[*i].tokens[r.clone()],
                    parents: None,
                })
                .collect();
            let tokens: Vec<u32> = pieces.iter().flat_map(|p| p.tokens).copied().collect();
            self.pass.run(&params_of(&pieces)?, &tokens)?;
            let mut at = 0;
            for (i, r) in pass {
                let n = r.len();
                match (parts[i].first, parts[i].form) {
                    (0, _) => {}
                    (_, RowForm::Full) => {
                        let got = self.pass.rows(at..at + n)?;
                        rows[i].extend(got.into_iter().map(Logits::Dense));
                    }
                    (_, RowForm::Greedy) => {
                        let got = self.pass.picks(at..at + n)?;
                        rows[i].extend(got.into_iter().map(|p| Logits::of_pick(vocab, p)));
                    }
                }
                self.seqs[parts[i].seq].cached += n;
                done[i] = r.end;
                at += n;
            }
            self.pass.rows(0..0)?;
        }
        for (part, rows) in parts.iter().zip(rows.iter_mut()) {
            if part.first > 0 {
                let first = part.first.min(rows.len());
                self.seqs[part.seq].rows = rows.split_off(first).into();
            }
        }
        Ok(rows)
    }
}

/// The parts' tokens the next pass of [`Sequence::score_parts`] takes, as (part, range of its
/// tokens): from each part in order, what is left of it, until [`MAX_ROWS`] rows; `None` when
/// every part is done (`done[i]`: tokens of part i already passed).
fn next_pass(parts: &[SeqPart], done: &[usize]) -> Option<Vec<(usize, Range<usize>)>> {
    let mut room = MAX_ROWS;
    let mut pass = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let left = part.tokens.len() - done[i];
        if left == 0 || room == 0 {
            continue;
        }
        let n = left.min(room);
        pass.push((i, done[i]..done[i] + n));
        room -= n;
    }
    (!pass.is_empty()).then_some(pass)
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
        // The parameters' arrays where `params_of` puts them (T = MAX_ROWS).
        let t = MAX_ROWS;
        assert_eq!(
            [
                TOKENS_AT,
                POSITIONS_AT,
                CACHED_AT,
                BASES_AT,
                SLOTS_AT,
                BRANCHES
            ],
            [1, 1 + t, 1 + 2 * t, 1 + 3 * t, 1 + 4 * t, 1 + 5 * t]
        );
        for line in [
            "return params[1 + row]; }",
            "return params[1 + T + row]; }",
            "return params[1 + 2 * T + row]; }",
            "return params[1 + 3 * T + row]; }",
            "return params[1 + 4 * T + row]; }",
            "return params + 1 + 5 * T + row * T; }",
        ] {
            assert!(
                cu.lines().any(|l| l.ends_with(line)),
                "kernels.cu lacks `{line}`"
            );
        }
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
