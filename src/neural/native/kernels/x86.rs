//! What the x86 kernels share: activation quads for broadcasting, prefetching ahead of the
//! weight stream, the shapes written once for both register widths ([`Lanes`]): unpacking
//! a tile's quants into eight registers of bytes and reading its rows' scales, and the chunk
//! loop of the unpacked walks (`over_chunks!`).

use super::formats::{Q6KTile, Scales, TopBits};
use half::f16;
use std::arch::x86_64::*;

/// Activation bytes `4t..4t+4` of a block as one 32-bit word, for broadcasting.
#[inline(always)]
pub(super) unsafe fn quad<T>(q: &[T; 32], t: usize) -> i32 {
    (q.as_ptr().add(4 * t) as *const i32).read_unaligned()
}

/// Asks for the cache lines [`PREFETCH_BYTES`] past `tile`'s: the weights stream from
/// memory once per pass, and the hardware prefetcher alone leaves the loads waiting.
/// (Prefetching past the end of the matrix is harmless: prefetches never fault.)
#[inline(always)]
pub(super) unsafe fn prefetch_ahead<T>(tile: &T) {
    let at = (tile as *const T as *const i8).wrapping_add(PREFETCH_BYTES);
    for line in (0..std::mem::size_of::<T>()).step_by(64) {
        _mm_prefetch(at.wrapping_add(line), _MM_HINT_T0);
    }
}

pub(super) const PREFETCH_BYTES: usize = 2048;

/// A register width of the x86 kernels: the operations the shared shapes below need. AVX2
/// takes a tile's 16 rows in two halves of 8 (`at` = 32 bytes into each 64-byte chunk for
/// the second), AVX-512 all 16 at once (`at` = 0). Every method is `inline(always)` without
/// target features of its own: it takes those of the kernel it is inlined into.
pub(super) trait Lanes {
    /// A register of bytes (and of 32-bit sums).
    type I: Copy;
    /// A register of floats.
    type F: Copy;
    unsafe fn zero() -> Self::I;
    unsafe fn load(p: *const u8) -> Self::I;
    unsafe fn splat8(b: i8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// `w | (x & mask)`.
    unsafe fn or_and(w: Self::I, x: Self::I, mask: Self::I) -> Self::I;
    /// Each 16-bit lane shifted left by `S`.
    unsafe fn shl16<const S: u32>(a: Self::I) -> Self::I;
    /// Each 16-bit lane shifted right by `S` (zeros in).
    unsafe fn shr16<const S: u32>(a: Self::I) -> Self::I;
    /// A register's worth of f16 values (one per 32-bit lane) as floats.
    unsafe fn halves(p: *const f16) -> Self::F;
    /// A register's worth of bytes (one per 32-bit lane) as floats, unsigned or signed.
    unsafe fn bytes(p: *const u8, signed: bool) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
}

/// 256-bit registers (AVX2, AVX-VNNI).
pub(super) struct Lanes256;

/// 512-bit registers (AVX-512).
pub(super) struct Lanes512;

impl Lanes for Lanes256 {
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const __m256i)
    }
    #[inline(always)]
    unsafe fn splat8(b: i8) -> __m256i {
        _mm256_set1_epi8(b)
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline(always)]
    unsafe fn or_and(w: __m256i, x: __m256i, mask: __m256i) -> __m256i {
        _mm256_or_si256(w, _mm256_and_si256(x, mask))
    }
    #[inline(always)]
    unsafe fn shl16<const S: u32>(a: __m256i) -> __m256i {
        _mm256_sll_epi16(a, _mm_cvtsi32_si128(S as i32))
    }
    #[inline(always)]
    unsafe fn shr16<const S: u32>(a: __m256i) -> __m256i {
        _mm256_srl_epi16(a, _mm_cvtsi32_si128(S as i32))
    }
    #[inline(always)]
    unsafe fn halves(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8, signed: bool) -> __m256 {
        let x = _mm_loadl_epi64(p as *const __m128i);
        let x = match signed {
            true => _mm256_cvtepi8_epi32(x),
            false => _mm256_cvtepu8_epi32(x),
        };
        _mm256_cvtepi32_ps(x)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
}

impl Lanes for Lanes512 {
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const __m512i)
    }
    #[inline(always)]
    unsafe fn splat8(b: i8) -> __m512i {
        _mm512_set1_epi8(b)
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }
    #[inline(always)]
    unsafe fn or_and(w: __m512i, x: __m512i, mask: __m512i) -> __m512i {
        // A | (B & C): one instruction.
        _mm512_ternarylogic_epi32(w, x, mask, 0xF8)
    }
    #[inline(always)]
    unsafe fn shl16<const S: u32>(a: __m512i) -> __m512i {
        _mm512_slli_epi16::<S>(a)
    }
    #[inline(always)]
    unsafe fn shr16<const S: u32>(a: __m512i) -> __m512i {
        _mm512_srli_epi16::<S>(a)
    }
    #[inline(always)]
    unsafe fn halves(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8, signed: bool) -> __m512 {
        let x = _mm_loadu_si128(p as *const __m128i);
        let x = match signed {
            true => _mm512_cvtepi8_epi32(x),
            false => _mm512_cvtepu8_epi32(x),
        };
        _mm512_cvtepi32_ps(x)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
}

/// A nibble tile's quants at byte `at` of its four chunks as eight registers of bytes:
/// register t < 4 is chunk t's low nibbles, register t + 4 its high ones.
#[inline(always)]
pub(super) unsafe fn nibble_quads<V: Lanes>(qs: &[[u8; 64]; 4], at: usize) -> [V::I; 8] {
    let mask = V::splat8(0x0F);
    let mut w = [V::zero(); 8];
    // (Loops, not closures: closures do not inherit the target features.)
    for t in 0..4 {
        let x = V::load(qs[t].as_ptr().add(at));
        w[t] = V::and(x, mask);
        w[t + 4] = V::and(V::shr16::<4>(x), mask);
    }
    w
}

/// A five-bit tile's quants at byte `at` (`put_five_bits`): register t < 4 is chunk t's
/// low five bits, register t + 4 its top three bits with the plane's two above them:
/// `w[t] = x & 31`, `w[t + 4] = (x >> 5 & 7) | (top bits shifted to 3..5 & 0x18)`.
#[inline(always)]
pub(super) unsafe fn five_bit_quads<V: Lanes>(
    qs: &[[u8; 64]; 4],
    high: &TopBits,
    at: usize,
) -> [V::I; 8] {
    let top = V::load(high.as_ptr().add(at));
    let tops = [
        V::shl16::<3>(top),
        V::shl16::<1>(top),
        V::shr16::<1>(top),
        V::shr16::<3>(top),
    ];
    let (five, seven, top_mask) = (V::splat8(31), V::splat8(7), V::splat8(0x18));
    let mut w = [V::zero(); 8];
    for t in 0..4 {
        let x = V::load(qs[t].as_ptr().add(at));
        w[t] = V::and(x, five);
        w[t + 4] = V::or_and(V::and(V::shr16::<5>(x), seven), tops[t], top_mask);
    }
    w
}

/// A Q6_K tile's six-bit quants at byte `at` as eight registers of bytes: the nibbles, with
/// the top two bits of plane `p` shifted into bits 4..6 of register `4p + k`.
#[inline(always)]
pub(super) unsafe fn six_bit_quads<V: Lanes>(tile: &Q6KTile, at: usize) -> [V::I; 8] {
    let mut w = nibble_quads::<V>(&tile.qs, at);
    let top = V::splat8(0x30);
    for p in 0..2 {
        let x = V::load(tile.high[p].as_ptr().add(at));
        let shifted = [V::shl16::<4>(x), V::shl16::<2>(x), x, V::shr16::<2>(x)];
        for (k, x) in shifted.into_iter().enumerate() {
            w[4 * p + k] = V::or_and(w[4 * p + k], x, top);
        }
    }
    w
}

/// The scales and offsets of a register's rows from row `r` on, as floats (products of the super-block's
/// and the rows' factors for K-quants: exact, the scalar reference's values).
#[inline(always)]
pub(super) unsafe fn scales_of<V: Lanes>(s: Scales, r: usize) -> (V::F, V::F) {
    match s {
        Scales::Kept { d, m } => (V::halves(d[r..].as_ptr()), V::halves(m[r..].as_ptr())),
        Scales::Factors { sc, mn, sup } => (
            V::mul(
                V::halves(sup.d[r..].as_ptr()),
                V::bytes(sc[r..].as_ptr(), false),
            ),
            V::mul(
                V::halves(sup.m[r..].as_ptr()),
                V::bytes(mn[r..].as_ptr(), false),
            ),
        ),
    }
}

/// Blocks a several-row walk unpacks into its L1 buffer at a time (`over_chunks!`): 16, so
/// that the buffer (10 KiB for both widths) stays in L1 beside the rows' blocks.
pub(super) const CHUNK: usize = 16;

/// The rows of a several-row walk over `$count` blocks in chunks of [`CHUNK`]: for each chunk,
/// block `$b` unpacked by `$fill` (a `$t`) into the walk's buffer, then `$walk` run for rows
/// `$r..$r + $n` (`$rs`, four at a time, `$n` a constant) with `$units` (the chunk's unpacked
/// blocks) and `$blocks` (their indices). The buffer is never zeroed (it is rewritten for
/// every chunk, and a call is one tile group): every entry a walk reads was written for its
/// chunk first. (A macro, not a function taking closures, which would not inherit the target
/// features; and each walk's row count a constant.)
macro_rules! over_chunks {
    (
        $count:expr, $rows:expr, $t:ty,
        |$b:ident| $fill:expr,
        |$units:ident, $blocks:ident, $n:ident, $rs:ident, $r:ident| $walk:expr
    ) => {{
        let rows: &[Row] = $rows;
        let count: usize = $count;
        let mut buf = std::mem::MaybeUninit::<[$t; CHUNK]>::uninit();
        let slots = buf.as_mut_ptr() as *mut $t;
        let mut start = 0;
        while start < count {
            let $blocks = start..(start + CHUNK).min(count);
            for (k, $b) in $blocks.clone().enumerate() {
                slots.add(k).write($fill);
            }
            // SAFETY: entries 0..len were written just above.
            let $units: &[$t] = std::slice::from_raw_parts(slots, $blocks.len());
            let mut $r = 0;
            while $r < rows.len() {
                let n = (rows.len() - $r).min(4);
                macro_rules! rows_of {
                    ($k:literal) => {{
                        const $n: usize = $k;
                        let $rs: &[Row; $k] = rows[$r..$r + $k].try_into().expect("rows");
                        $walk
                    }};
                }
                match n {
                    4 => rows_of!(4),
                    3 => rows_of!(3),
                    2 => rows_of!(2),
                    _ => rows_of!(1),
                }
                $r += n;
            }
            start += CHUNK;
        }
    }};
}
pub(super) use over_chunks;
