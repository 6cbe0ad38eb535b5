//! The AVX-512 VNNI kernel: 16 weight rows per register, up to eight activation rows per
//! walk over a tile group (four for Q6_K); the same integer sums and float operations, in
//! the same order, as the scalar kernel. Q6_K's several-row products unpack each block once
//! into an L1 buffer and walk the rows over it ([`q6k_unpacked`]).

use super::x86::*;
use super::*;
use std::arch::x86_64::*;

/// Block b of every row times the weight quads `quads` of a block's eight registers: one
/// chain of `vpdpbusd` per row from the row's [`Start`] (or zero), the rows' chains
/// interleaved so that no instruction waits on the one before it (integer sums: any order
/// gives the same values). With `split`, the odd quads go to a second chain a row, added at
/// the end: with four rows or fewer, one chain of eight a row left the multiply units
/// waiting (`nibbles_avx512`; Q6_K's chains are four long, and Q8_0's gained nothing).
#[inline(always)]
unsafe fn dot_rows<const N: usize>(
    w: &[__m512i; 8],
    quads: std::ops::Range<usize>,
    rows: &[Row; N],
    b: usize,
    start: Option<Start>,
    split: bool,
) -> [__m512i; N] {
    let mut sums = [_mm512_setzero_si512(); N];
    if let Some(which) = start {
        // (A loop, not `array::from_fn`: closures do not inherit the target features.)
        for (s, row) in sums.iter_mut().zip(rows) {
            *s = _mm512_set1_epi32(row.start(b, which as usize));
        }
    }
    let mut odd = [_mm512_setzero_si512(); N];
    for t in quads {
        // (Two loops, not a reference to either array: the arrays stay in registers.)
        if split && t % 2 == 1 {
            for (s, row) in odd.iter_mut().zip(rows) {
                *s = _mm512_dpbusd_epi32(*s, w[t], _mm512_set1_epi32(quad(row.q(b), t)));
            }
        } else {
            for (s, row) in sums.iter_mut().zip(rows) {
                *s = _mm512_dpbusd_epi32(*s, w[t], _mm512_set1_epi32(quad(row.q(b), t)));
            }
        }
    }
    if split {
        for (s, odd) in sums.iter_mut().zip(odd) {
            *s = _mm512_add_epi32(*s, odd);
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
    for (b, tile) in tiles.iter().enumerate() {
        prefetch_ahead(tile);
        let w = match tile.high() {
            Some(high) => five_bit_quads::<Lanes512>(tile.qs(), high, 0),
            None => nibble_quads::<Lanes512>(tile.qs(), 0),
        };
        let (dw, mw) = scales_of::<Lanes512>(tile.scales(super_of::<T>(supers, b)), 0);
        // Two chains a row up to four rows: 0.86–0.96 of one chain's time in products of one
        // to four rows on a Sapphire Rapids core, no clear difference at eight and 16
        // (BENCHMARKS.md, "Two chains a row").
        let sums = dot_rows(&w, 0..8, rows, b, T::START, N <= 4);
        for i in 0..N {
            let isum = sums[i];
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(rows[i].d(b)));
            acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
            if T::CENTER == 0 {
                acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(rows[i].s(b)), acc[i]);
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
        let dw = Lanes512::halves(tile.d.as_ptr());
        // Weights q + 128 against signed activations: the sums start at −128·Σq_a.
        let sums = dot_rows(&w, 0..8, rows, b, Some(Start::Q8_0), false);
        for i in 0..N {
            let isum = sums[i];
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(rows[i].d(b)));
            acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
        }
    }
}

/// Block b of a Q6_K tile group, unpacked: its eight quad registers and the scales of its
/// two halves of 16 columns.
#[derive(Clone, Copy)]
struct SixBits {
    w: [__m512i; 8],
    dw: [__m512; 2],
}

#[inline(always)]
unsafe fn unpack_six_bits(tile: &Q6KTile, supers: &[SuperScales], b: usize) -> SixBits {
    let w = six_bit_quads::<Lanes512>(tile, 0);
    let d = Lanes512::halves(supers[b / 8].d.as_ptr());
    // (No closure here: it would not inherit the target features.)
    let dw = [
        _mm512_mul_ps(d, Lanes512::bytes(tile.sc[0].as_ptr() as *const u8, true)),
        _mm512_mul_ps(d, Lanes512::bytes(tile.sc[1].as_ptr() as *const u8, true)),
    ];
    SixBits { w, dw }
}

/// Block b of every row against the block's unpacked weights `u`: two sums a row, one for
/// each half of 16 columns, each scaled by its own factor, into the row's accumulators.
#[inline(always)]
unsafe fn six_bit_block<const N: usize>(
    u: &SixBits,
    rows: &[Row; N],
    b: usize,
    acc: &mut [__m512; N],
) {
    // (Copied out of the buffer, so that they stay in registers for every row.)
    let w = u.w;
    // Half h of every row, then the next: each row's two terms keep their order.
    let halves = [(0..4, Start::Q6KHalf0), (4..8, Start::Q6KHalf1)];
    for ((quads, start), dw) in halves.into_iter().zip(u.dw) {
        let sums = dot_rows(&w, quads, rows, b, Some(start), false);
        for i in 0..N {
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(sums[i]), _mm512_set1_ps(rows[i].d(b)));
            acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
        }
    }
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
        six_bit_block(&unpack_six_bits(tile, supers, b), rows, b, acc);
    }
}

/// A Q6_K tile group times any number of rows: each block unpacked once into an L1 buffer,
/// [`CHUNK`] blocks at a time (`over_chunks!`), then the rows walked over the buffer four at a time (as
/// [`walk_rows`](super::isa) takes them on the tiles), each row's accumulators carried from
/// one chunk to the next in `out`. The same float operations in the same order, so the same
/// bits as [`tile_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
pub unsafe fn q6k_unpacked(
    tiles: &[Q6KTile],
    supers: &[SuperScales],
    rows: &[Row],
    out: &mut [[f32; TILE_ROWS]],
) {
    let out = &mut out[..rows.len()];
    out.fill([0.0; TILE_ROWS]);
    over_chunks!(
        tiles.len(),
        rows,
        SixBits,
        |b| {
            let tile = &tiles[b];
            prefetch_ahead(tile);
            unpack_six_bits(tile, supers, b)
        },
        |units, blocks, N, rs, r| {
            let out = &mut out[r..r + N];
            let mut acc = [_mm512_setzero_ps(); N];
            for i in 0..N {
                acc[i] = _mm512_loadu_ps(out[i].as_ptr());
            }
            for (u, b) in units.iter().zip(blocks.clone()) {
                six_bit_block(u, rs, b, &mut acc);
            }
            for i in 0..N {
                _mm512_storeu_ps(out[i].as_mut_ptr(), acc[i]);
            }
        }
    )
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
