//! The AVX-512 VNNI kernel: 16 weight rows per register, up to eight activation rows per
//! walk over a tile group; the same integer sums and float operations, in the same order,
//! as the scalar kernel.

use super::x86::*;
use super::*;
use std::arch::x86_64::*;

/// 16 f16 values as floats.
#[inline(always)]
unsafe fn halves16(s: &[half::f16; TILE_ROWS]) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr() as *const __m256i))
}

/// 16 bytes as floats, unsigned or signed.
#[inline(always)]
unsafe fn bytes16(b: *const u8, signed: bool) -> __m512 {
    let x = _mm_loadu_si128(b as *const __m128i);
    let x = if signed {
        _mm512_cvtepi8_epi32(x)
    } else {
        _mm512_cvtepu8_epi32(x)
    };
    _mm512_cvtepi32_ps(x)
}

/// The 16 rows' scales and offsets as floats (products of the super-block's and the
/// rows' factors for K-quants: exact, the scalar reference's values).
#[inline(always)]
unsafe fn scales16(s: Scales) -> (__m512, __m512) {
    match s {
        Scales::Kept { d, m } => (halves16(d), halves16(m)),
        Scales::Factors { sc, mn, sup } => (
            _mm512_mul_ps(halves16(&sup.d), bytes16(sc.as_ptr(), false)),
            _mm512_mul_ps(halves16(&sup.m), bytes16(mn.as_ptr(), false)),
        ),
    }
}

/// Block b of every row times the weight quads `quads` of a block's eight registers: one
/// chain of `vpdpbusd` per row from the row's [`Start`] (or zero), the rows' chains
/// interleaved so that no instruction waits on the one before it (integer sums: any order
/// gives the same values).
#[inline(always)]
unsafe fn dot_rows<const N: usize>(
    w: &[__m512i; 8],
    quads: std::ops::Range<usize>,
    rows: &[Row; N],
    b: usize,
    start: Option<Start>,
) -> [__m512i; N] {
    let mut sums = [_mm512_setzero_si512(); N];
    if let Some(which) = start {
        // (A loop, not `array::from_fn`: closures do not inherit the target features.)
        for (s, row) in sums.iter_mut().zip(rows) {
            *s = _mm512_set1_epi32(row.starts[b][which as usize]);
        }
    }
    for t in quads {
        for (s, row) in sums.iter_mut().zip(rows) {
            *s = _mm512_dpbusd_epi32(*s, w[t], _mm512_set1_epi32(quad(&row.qs[b], t)));
        }
    }
    sums
}

#[inline(always)]
unsafe fn nibbles_avx512<T: NibbleTile, const N: usize>(
    tiles: &[T],
    supers: &[SuperScales],
    rows: &[Row; N],
    acc: &mut [__m512; N],
) {
    let mask = _mm512_set1_epi8(0x0F);
    for (b, tile) in tiles.iter().enumerate() {
        prefetch_ahead(tile);
        let mut w = [_mm512_setzero_si512(); 8];
        // (The closure only finds the address: closures do not inherit the target features.)
        let chunk = |t: usize| tile.qs()[t].as_ptr() as *const __m512i;
        if let Some(high) = tile.high() {
            // Five-bit bytes (`put_five_bits`): w_t = x & 31, w_{t+4} = (x >> 5 & 7) |
            // (top bits shifted to 3..5 & 0x18).
            let top = _mm512_loadu_si512(high.as_ptr() as *const __m512i);
            let tops = [
                _mm512_slli_epi16(top, 3),
                _mm512_slli_epi16(top, 1),
                _mm512_srli_epi16(top, 1),
                _mm512_srli_epi16(top, 3),
            ];
            let (five, seven) = (_mm512_set1_epi8(31), _mm512_set1_epi8(7));
            let top_mask = _mm512_set1_epi8(0x18);
            for t in 0..4 {
                let x = _mm512_loadu_si512(chunk(t));
                w[t] = _mm512_and_si512(x, five);
                let tops = _mm512_and_si512(tops[t], top_mask);
                // (x >> 5 & 7) | tops
                w[t + 4] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(x, 5), seven, tops, 0xEA);
            }
        } else {
            for t in 0..4 {
                let x = _mm512_loadu_si512(chunk(t));
                w[t] = _mm512_and_si512(x, mask);
                w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
            }
        }
        let (dw, mw) = scales16(tile.scales(super_of::<T>(supers, b)));
        let sums = dot_rows(&w, 0..8, rows, b, T::START);
        for i in 0..N {
            let isum = sums[i];
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(rows[i].d[b]));
            acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
            if T::CENTER == 0 {
                acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(rows[i].s[b]), acc[i]);
            }
        }
    }
}

#[inline(always)]
unsafe fn q8_0_avx512<const N: usize>(tiles: &[Q8_0Tile], rows: &[Row; N], acc: &mut [__m512; N]) {
    for (b, tile) in tiles.iter().enumerate() {
        prefetch_ahead(tile);
        let w: [__m512i; 8] =
            std::array::from_fn(|t| _mm512_loadu_si512(tile.qs[t].as_ptr() as *const __m512i));
        let dw = halves16(&tile.d);
        // Weights q + 128 against signed activations: the sums start at −128·Σq_a.
        let sums = dot_rows(&w, 0..8, rows, b, Some(Start::Q8_0));
        for i in 0..N {
            let isum = sums[i];
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(rows[i].d[b]));
            acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
        }
    }
}

/// A Q6_K tile's six-bit quants as eight registers of bytes: the nibbles, with the top
/// two bits of plane `p` shifted into bits 4..6 of register `4p + k`.
#[inline(always)]
unsafe fn six_bits_avx512(tile: &Q6KTile) -> [__m512i; 8] {
    let (mask, top) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let mut w = [_mm512_setzero_si512(); 8];
    for t in 0..4 {
        let x = _mm512_loadu_si512(tile.qs[t].as_ptr() as *const __m512i);
        w[t] = _mm512_and_si512(x, mask);
        w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
    }
    for p in 0..2 {
        let h = _mm512_loadu_si512(tile.high[p].as_ptr() as *const __m512i);
        let shifted = [
            _mm512_slli_epi16(h, 4),
            _mm512_slli_epi16(h, 2),
            h,
            _mm512_srli_epi16(h, 2),
        ];
        for (k, x) in shifted.into_iter().enumerate() {
            // w | (x & 0x30)
            w[4 * p + k] = _mm512_ternarylogic_epi32(w[4 * p + k], x, top, 0xF8);
        }
    }
    w
}

#[inline(always)]
unsafe fn q6k_avx512<const N: usize>(
    tiles: &[Q6KTile],
    supers: &[SuperScales],
    rows: &[Row; N],
    acc: &mut [__m512; N],
) {
    for (b, tile) in tiles.iter().enumerate() {
        prefetch_ahead(tile);
        let w = six_bits_avx512(tile);
        let d = halves16(&supers[b / 8].d);
        // (No closure here: it would not inherit the target features.)
        let dw = [
            _mm512_mul_ps(d, bytes16(tile.sc[0].as_ptr() as *const u8, true)),
            _mm512_mul_ps(d, bytes16(tile.sc[1].as_ptr() as *const u8, true)),
        ];
        // Half h of every row, then the next: each row's two terms keep their order.
        let halves = [(0..4, Start::Q6KHalf0), (4..8, Start::Q6KHalf1)];
        for ((quads, start), dw) in halves.into_iter().zip(dw) {
            let sums = dot_rows(&w, quads, rows, b, Some(start));
            for i in 0..N {
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(sums[i]), _mm512_set1_ps(rows[i].d[b]));
                acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
pub unsafe fn tile_avx512<const N: usize>(
    tiles: Tiles,
    rows: &[Row; N],
    out: &mut [[f32; TILE_ROWS]; N],
) {
    let mut acc = [_mm512_setzero_ps(); N];
    match tiles {
        Tiles::Q4_1(tiles) => nibbles_avx512(tiles, &[], rows, &mut acc),
        Tiles::Q5_0(tiles) => nibbles_avx512(tiles, &[], rows, &mut acc),
        Tiles::Q5(tiles) => nibbles_avx512(tiles, &[], rows, &mut acc),
        Tiles::Q4K(tiles, supers) => nibbles_avx512(tiles, supers, rows, &mut acc),
        Tiles::Q5K(tiles, supers) => nibbles_avx512(tiles, supers, rows, &mut acc),
        Tiles::Q8_0(tiles) => q8_0_avx512(tiles, rows, &mut acc),
        Tiles::Q6K(tiles, supers) => q6k_avx512(tiles, supers, rows, &mut acc),
    }
    for i in 0..N {
        _mm512_storeu_ps(out[i].as_mut_ptr(), acc[i]);
    }
}
