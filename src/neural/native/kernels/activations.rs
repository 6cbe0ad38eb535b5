//! Activations quantized per row to blocks of 32 signed bytes with a scale `d` and `d·Σq`
//! (ggml's Q8_1), on every ISA to the same bits.

use super::*;
use crate::neural::native::pool::{split_mut, stretches, Pool};

pub(super) fn quantize_block(x: &[f32]) -> (f32, [i8; 32], f32) {
    let x: &[f32; BLOCK] = x.try_into().expect("a block of 32");
    let mut amax = 0.0f32;
    for v in x {
        let a = v.abs();
        amax = if a > amax { a } else { amax };
    }
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let q: [i8; 32] = std::array::from_fn(|i| round_to_int(x[i] * id) as i8);
    let sum: i32 = q.iter().map(|&v| v as i32).sum();
    (d, q, d * sum as f32)
}

/// Rounds to the nearest integer, ties to even, for |x| < 2²²: adding 1.5·2²³ leaves no
/// fraction bits, and the integer is then the sum's bits less the constant's. Plain arithmetic
/// that vectorizes on any x86-64, where `f32::round` is a libm call per value and `as i32`
/// saturates.
#[inline(always)]
pub(super) fn round_to_int(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// Quantizes the blocks of `x` into the blocks' slots of [`QRows`].
#[inline(always)]
pub(super) fn quantize_blocks(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    qs: &mut [[i8; 32]],
    sums: &mut [[i32; 2]],
) {
    let slots = d.iter_mut().zip(s).zip(qs).zip(sums);
    for (block, (((d, s), q), sum)) in x.chunks_exact(BLOCK).zip(slots) {
        (*d, *q, *s) = quantize_block(block);
        *sum = [0, 16].map(|h| q[h..h + 16].iter().map(|&v| v as i32).sum());
    }
}

/// Values at which quantizing activations is split across threads (about 4 µs of work).
pub(super) const PARALLEL_QUANTIZE: usize = 4096;

/// [`quantize_blocks`] with `isa`'s vectors.
pub(super) fn quantize_blocks_on(isa: Isa, x: &[f32], out: BlocksOut) {
    let BlocksOut {
        d,
        s,
        qs,
        sums,
        starts,
    } = out;
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` saw AVX2 and FMA before choosing a vector ISA.
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni | Isa::Amx => unsafe {
            quantize_blocks_avx2(x, d, s, qs, sums)
        },
        _ => quantize_blocks(x, d, s, qs, sums),
    }
    for (start, &halves) in starts.iter_mut().zip(sums.iter()) {
        *start = Start::of(halves);
    }
}

/// Where [`quantize_blocks_on`] writes a stretch of blocks (the fields of [`QRows`]).
pub(super) struct BlocksOut<'a> {
    pub(super) d: &'a mut [f32],
    pub(super) s: &'a mut [f32],
    pub(super) qs: &'a mut [[i8; 32]],
    pub(super) sums: &'a mut [[i32; 2]],
    pub(super) starts: &'a mut [[i32; 4]],
}

/// Which of a block's [`QRows`] `starts` a weight type's integer sums begin from.
#[derive(Clone, Copy)]
pub(super) enum Start {
    /// Q5_0's quants exceed the signed ones by 16: `−16·Σq_a`.
    Q5_0 = 0,
    /// Q8_0's stored `q + 128`: `−128·Σq_a`.
    Q8_0 = 1,
    /// Half h of a Q6_K block (quants exceed the signed ones by 32): `−32·Σq_a` of that half.
    Q6KHalf0 = 2,
    Q6KHalf1 = 3,
}

impl Start {
    /// A block's starts, indexed by [`Start`], from its halves' `Σq_a`.
    pub(super) fn of([h0, h1]: [i32; 2]) -> [i32; 4] {
        let center = Q5_0Tile::CENTER;
        [-center * (h0 + h1), -128 * (h0 + h1), -32 * h0, -32 * h1]
    }
}

/// [`quantize_blocks`] in AVX2 intrinsics: the same float operations (a multiply, then the
/// rounding constant added; the maximum by compare-and-select, exact in any order), so the
/// same bits for finite values. LLVM's code for the plain loops moved the quants one byte at
/// a time (`vpextrb`): a tenth of a 16-token pass went to quantizing activations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_blocks_avx2(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    qs: &mut [[i8; 32]],
    sums: &mut [[i32; 2]],
) {
    use std::arch::x86_64::*;
    const MAGIC: f32 = 12_582_912.0;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let magic = _mm256_set1_ps(MAGIC);
    let magic_bits = _mm256_set1_epi32(MAGIC.to_bits() as i32);
    // The two packs leave each 128-bit lane's quarters interleaved: put the dwords back.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let slots = d.iter_mut().zip(s).zip(qs).zip(sums);
    for (block, (((d, s), q), half_sums)) in x.chunks_exact(BLOCK).zip(slots) {
        let p = block.as_ptr();
        // SAFETY: a block holds 32 values, four loads of 8.
        let v = [0, 8, 16, 24].map(|o| unsafe { _mm256_loadu_ps(p.add(o)) });
        // `max(a, m)` keeps m when a is NaN, as `if a > m { a } else { m }` does.
        let m = v.iter().fold(_mm256_setzero_ps(), |m, &vi| {
            _mm256_max_ps(_mm256_and_ps(vi, abs), m)
        });
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
        let ints = v.map(|vi| {
            let shifted = _mm256_add_ps(_mm256_mul_ps(vi, inv), magic);
            _mm256_sub_epi32(_mm256_castps_si256(shifted), magic_bits)
        });
        let halves = [(0, 1), (2, 3)].map(|(a, b)| {
            let total = _mm256_add_epi32(ints[a], ints[b]);
            let t4 = _mm_add_epi32(
                _mm256_castsi256_si128(total),
                _mm256_extracti128_si256(total, 1),
            );
            let t2 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
            _mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32(t2, 1)))
        });
        *half_sums = halves;
        let sum = halves[0] + halves[1];
        // |quant| ≤ 127: the saturating packs change nothing.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(ints[0], ints[1]),
            _mm256_packs_epi32(ints[2], ints[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        // SAFETY: 32 bytes each, unaligned stores.
        unsafe {
            _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes);
        }
        (*d, *s) = (scale, scale * sum as f32);
    }
}

/// Activation rows quantized for [`matmul`]; reused from pass to pass to avoid allocation.
#[derive(Default)]
pub struct QRows {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) d: Vec<f32>,
    /// `d·Σq` of each block, for Q4_1's offset term.
    pub(super) s: Vec<f32>,
    pub(super) qs: Vec<[i8; 32]>,
    /// `Σq` of each block's two halves: what the byte tiles' `q + 128` weights add (times
    /// 128) to a product, for the scalar and 256-bit kernels to take back out.
    pub(super) sums: Vec<[i32; 2]>,
    /// What each block's integer sums start from for the weight types that store unsigned
    /// quants above a center ([`Start`]): the centers' products with `Σq_a`, taken out by
    /// starting the sum there instead of by a subtraction per row and block.
    pub(super) starts: Vec<[i32; 4]>,
}

impl QRows {
    /// Quantizes `x` (`rows × cols`, row-major).
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        self.quantize_on(Isa::Scalar, x, cols)
    }

    /// [`QRows::quantize`] with `isa`'s vectors (the same bits on every ISA).
    pub fn quantize_on(&mut self, isa: Isa, x: &[f32], cols: usize) {
        self.resize_for(x, cols);
        quantize_blocks_on(isa, x, self.blocks_out())
    }

    /// [`QRows::quantize_on`], split across `pool`'s threads when `x` is long enough to pay
    /// for the hand-off (a 16-token pass; not a single step). The same bits.
    pub fn quantize_on_pool(&mut self, isa: Isa, pool: &mut Pool, x: &[f32], cols: usize) {
        if x.len() < PARALLEL_QUANTIZE || pool.threads() == 1 {
            return self.quantize_on(isa, x, cols);
        }
        self.resize_for(x, cols);
        let parts = stretches(self.d.len(), 1, pool.threads());
        let xs: Vec<std::ops::Range<usize>> = parts
            .iter()
            .map(|r| r.start * BLOCK..r.end * BLOCK)
            .collect();
        let items: Vec<_> = split_mut(&mut self.d, &parts)
            .into_iter()
            .zip(split_mut(&mut self.s, &parts))
            .zip(split_mut(&mut self.qs, &parts))
            .zip(split_mut(&mut self.sums, &parts))
            .zip(split_mut(&mut self.starts, &parts))
            .zip(xs)
            .collect();
        pool.run_each(items, &|(((((d, s), qs), sums), starts), r)| {
            let out = BlocksOut {
                d,
                s,
                qs,
                sums,
                starts,
            };
            quantize_blocks_on(isa, &x[r], out)
        });
    }

    /// All blocks' slots, for [`quantize_blocks_on`].
    pub(super) fn blocks_out(&mut self) -> BlocksOut<'_> {
        BlocksOut {
            d: &mut self.d,
            s: &mut self.s,
            qs: &mut self.qs,
            sums: &mut self.sums,
            starts: &mut self.starts,
        }
    }

    /// Sizes the buffers for `x` (`cols` a multiple of the block).
    pub(super) fn resize_for(&mut self, x: &[f32], cols: usize) {
        assert!(cols.is_multiple_of(BLOCK) && x.len().is_multiple_of(cols));
        self.rows = x.len() / cols;
        self.cols = cols;
        let blocks = x.len() / BLOCK;
        self.d.resize(blocks, 0.0);
        self.s.resize(blocks, 0.0);
        self.qs.resize(blocks, [0; 32]);
        self.sums.resize(blocks, [0; 2]);
        self.starts.resize(blocks, [0; 4]);
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub(super) fn row(&self, r: usize) -> Row<'_> {
        let nb = self.cols / BLOCK;
        let span = r * nb..(r + 1) * nb;
        Row {
            d: &self.d[span.clone()],
            s: &self.s[span.clone()],
            qs: &self.qs[span.clone()],
            sums: &self.sums[span.clone()],
            starts: &self.starts[span],
        }
    }
}
