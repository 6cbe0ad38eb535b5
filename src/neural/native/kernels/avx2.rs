//! The AVX2 and AVX-VNNI kernels: 8 weight rows per register, four activation rows per walk
//! (eight for Q8_0 on AVX2); the same integer sums and float operations, in the same order,
//! as the scalar kernel.
//!
//! A walk unpacks each block of its tiles into registers for its four rows, so a 16-row
//! product unpacks every block four times. Where that unpacking costs most (Q6_K's two
//! planes, the five-bit types, Q4_K's scale products; `isa::unpacked_min_rows`), the
//! several-row walk [`unpacked`](avx2_walks::unpacked) unpacks each block once into an L1
//! buffer and walks the rows over the buffer four at a time instead.

use super::x86::*;
use super::*;
use std::arch::x86_64::*;

/// `acc + Σ` of four u8 × i8 products per lane (AVX2: no overflow while |u·s| ≤ 128·127,
/// which nibbles and |Q8_0 weights| ≤ 127 satisfy).
#[inline(always)]
unsafe fn dot_avx2(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(u, s);
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// One nibble block's eight quads `w` times activation block `a`, summed per lane.
/// The 16-bit pair sums are added before widening: a pair is at most 2·15·127 = 3,810 in
/// magnitude, eight of them 30,480 < 2¹⁵, so the sum is exact and one `madd` widens it,
/// instead of one per quad (both instructions use the same multiply ports).
#[inline(always)]
unsafe fn dot_q4_avx2(w: &[__m256i; 8], a: &[i8; 32]) -> __m256i {
    let p: [__m256i; 8] =
        std::array::from_fn(|t| _mm256_maddubs_epi16(w[t], _mm256_set1_epi32(quad(a, t))));
    let low = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
    let high = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
    _mm256_madd_epi16(_mm256_add_epi16(low, high), _mm256_set1_epi16(1))
}

/// [`dot_q4_avx2`] for five-bit quants: a pair reaches 2·31·127 = 7,874, so four pairs
/// (31,496 < 2¹⁵) are added before each of two widenings.
#[inline(always)]
unsafe fn dot_q5_avx2(w: &[__m256i; 8], a: &[i8; 32]) -> __m256i {
    let p: [__m256i; 8] =
        std::array::from_fn(|t| _mm256_maddubs_epi16(w[t], _mm256_set1_epi32(quad(a, t))));
    let low = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
    let high = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
    let ones = _mm256_set1_epi16(1);
    _mm256_add_epi32(_mm256_madd_epi16(low, ones), _mm256_madd_epi16(high, ones))
}

/// [`dot_q4_avx2`] on AVX-VNNI: the even and the odd quads in two chains of `vpdpbusd`,
/// added at the end, so that a row's eight do not each wait for the one before (integer
/// sums: the same values). On a Sapphire Rapids core two chains took 0.82–0.96 of one
/// chain's time in products of one to four rows, and whole passes of four to 16 rows
/// 0.92–0.98 (BENCHMARKS.md, "Two chains a row"); Q6_K's chains of four gained nothing.
#[inline(always)]
unsafe fn dot_q4_vnni(w: &[__m256i; 8], a: &[i8; 32]) -> __m256i {
    let mut s = [_mm256_setzero_si256(); 2];
    for (t, &w) in w.iter().enumerate() {
        s[t % 2] = _mm256_dpbusd_avx_epi32(s[t % 2], w, _mm256_set1_epi32(quad(a, t)));
    }
    _mm256_add_epi32(s[0], s[1])
}

/// Byte-tile weights `w` times signed activation quad `q`. AVX2 takes the weights signed
/// (`q_w = (q_w + 128) ^ 0x80`, flipped once per tile) and moves their signs onto the
/// activations; VNNI takes them unsigned as stored and leaves `128·Σq_a` to subtract.
/// (Moving q's signs onto the weights instead, against a precomputed `|q|`, keeps half
/// the registers and spills nothing with four rows, but its second broadcast per quad
/// made a 16-row product 5–10% slower on an AVX2 EPYC.)
#[inline(always)]
unsafe fn dot_q8_avx2(acc: __m256i, w: __m256i, q: i32) -> __m256i {
    let a = _mm256_sign_epi8(_mm256_set1_epi32(q), w);
    dot_avx2(acc, _mm256_abs_epi8(w), a)
}

#[inline(always)]
unsafe fn dot_q8_vnni(acc: __m256i, w: __m256i, q: i32) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(q))
}

/// A byte tile's 32 bytes at `at` as the `dot_q8` of the ISA takes them: unsigned as
/// stored for VNNI (`unsigned`), signed otherwise.
#[inline(always)]
unsafe fn byte_quads(at: *const u8, unsigned: bool) -> __m256i {
    let w = _mm256_loadu_si256(at as *const __m256i);
    if unsigned {
        w
    } else {
        _mm256_xor_si256(w, _mm256_set1_epi8(0x80u8 as i8))
    }
}

/// Quads `4k..4k + 4` of six-bit weights `w` times activation block `a`, summed per
/// lane: a pair reaches 2·63·127 = 16,002, so two pairs (32,004 < 2¹⁵) are added before
/// each of two widenings.
#[inline(always)]
unsafe fn dot_q6_avx2(w: &[__m256i; 8], a: &[i8; 32], k: usize) -> __m256i {
    let p: [__m256i; 4] = std::array::from_fn(|t| {
        _mm256_maddubs_epi16(w[4 * k + t], _mm256_set1_epi32(quad(a, 4 * k + t)))
    });
    let ones = _mm256_set1_epi16(1);
    _mm256_add_epi32(
        _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), ones),
        _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), ones),
    )
}

#[inline(always)]
unsafe fn dot_q6_vnni(w: &[__m256i; 8], a: &[i8; 32], k: usize) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for (t, &w) in w.iter().enumerate().skip(4 * k).take(4) {
        s = _mm256_dpbusd_avx_epi32(s, w, _mm256_set1_epi32(quad(a, t)));
    }
    s
}

/// Half a tile unpacked: its eight quad registers and the rows' scales (nibble types: the
/// scale and the offset's; Q6_K: its two halves' scales).
#[derive(Clone, Copy)]
struct Unpacked {
    w: [__m256i; 8],
    scales: [__m256; 2],
}

/// Half h (weight rows `8h..8h + 8`) of nibble tile `tile`, block b of its group: its quads
/// and its rows' scale and offset's scale.
#[inline(always)]
unsafe fn unpack_nibbles<T: NibbleTile>(
    tile: &T,
    supers: &[SuperScales],
    b: usize,
    h: usize,
) -> Unpacked {
    let w = match tile.high() {
        Some(high) => five_bit_quads::<Lanes256>(tile.qs(), high, 32 * h),
        None => nibble_quads::<Lanes256>(tile.qs(), 32 * h),
    };
    let (dw, mw) = scales_of::<Lanes256>(tile.scales(super_of::<T>(supers, b)), 8 * h);
    Unpacked {
        w,
        scales: [dw, mw],
    }
}

/// Half h of Q6_K tile `tile`, block b of its group: its quads and the scales of its two
/// halves of 16 columns.
#[inline(always)]
unsafe fn unpack_six_bits(tile: &Q6KTile, supers: &[SuperScales], b: usize, h: usize) -> Unpacked {
    let w = six_bit_quads::<Lanes256>(tile, 32 * h);
    let d = Lanes256::halves(supers[b / 8].d[8 * h..].as_ptr());
    let sc = |k: usize| tile.sc[k][8 * h..].as_ptr() as *const u8;
    let dw = [
        _mm256_mul_ps(d, Lanes256::bytes(sc(0), true)),
        _mm256_mul_ps(d, Lanes256::bytes(sc(1), true)),
    ];
    Unpacked { w, scales: dw }
}

macro_rules! tile_256 {
    ($walks:ident, $dot_q4:ident, $dot_q5:ident, $dot_q6:ident, $dot_q8:ident, $q8_bias:literal, $features:literal) => {
        pub mod $walks {
            use super::*;

            /// Block b of every row against half h of the block's nibble tiles, unpacked
            /// (`u`): each row's integer sum, scaled, into its accumulators.
            #[inline(always)]
            unsafe fn nibble_block<T: NibbleTile, const N: usize>(
                u: &Unpacked,
                rows: &[Row; N],
                b: usize,
                acc: &mut [__m256; N],
            ) {
                // (Copied out of the buffer, so that they stay in registers for every row.)
                let (w, [dw, mw]) = (u.w, u.scales);
                for i in 0..N {
                    let mut s = match T::FIVE_BITS {
                        false => $dot_q4(&w, rows[i].q(b)),
                        true => $dot_q5(&w, rows[i].q(b)),
                    };
                    if let Some(which) = T::START {
                        let start = rows[i].start(b, which as usize);
                        s = _mm256_add_epi32(s, _mm256_set1_epi32(start));
                    }
                    let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(rows[i].d(b)));
                    acc[i] = _mm256_fmadd_ps(t, dw, acc[i]);
                    if T::CENTER == 0 {
                        acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(rows[i].s(b)), acc[i]);
                    }
                }
            }

            /// [`nibble_block`] for a Q6_K block: two sums a row, one for each half of
            /// 16 columns, each scaled by its own factor.
            #[inline(always)]
            unsafe fn six_bit_block<const N: usize>(
                u: &Unpacked,
                rows: &[Row; N],
                b: usize,
                acc: &mut [__m256; N],
            ) {
                let (w, dw) = (u.w, u.scales);
                for i in 0..N {
                    let q = rows[i].q(b);
                    let da = _mm256_set1_ps(rows[i].d(b));
                    for k in 0..2 {
                        let s = $dot_q6(&w, q, k);
                        let start = rows[i].start(b, Start::Q6KHalf0 as usize + k);
                        let s = _mm256_add_epi32(s, _mm256_set1_epi32(start));
                        let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), da);
                        acc[i] = _mm256_fmadd_ps(t, dw[k], acc[i]);
                    }
                }
            }

            /// One walk: N rows over a tile group, two halves of 8 weight rows, each a
            /// 256-bit register of lanes.
            #[target_feature(enable = $features)]
            pub unsafe fn tile<const N: usize>(
                tiles: Tiles,
                rows: &[Row; N],
                out: &mut [[f32; TILE_ROWS]; N],
            ) {
                for h in 0..2 {
                    let mut acc = [_mm256_setzero_ps(); N];
                    // (Loops, not closures: closures do not inherit the target features.)
                    macro_rules! blocks {
                        ($tiles:expr, $supers:expr, $unpack:ident, $block:expr) => {
                            for (b, tile) in $tiles.iter().enumerate() {
                                // The second half reads the lines the first brought in.
                                if h == 0 {
                                    prefetch_ahead(tile);
                                }
                                $block(&$unpack(tile, $supers, b, h), rows, b, &mut acc);
                            }
                        };
                    }
                    let half = |bytes: *const u8| bytes.add(32 * h) as *const __m256i;
                    match tiles {
                        Tiles::Q4_1(t) => {
                            blocks!(t, &[], unpack_nibbles, nibble_block::<Q4Tile, N>)
                        }
                        Tiles::Q5_0(t) => {
                            blocks!(t, &[], unpack_nibbles, nibble_block::<Q5_0Tile, N>)
                        }
                        Tiles::Q5(t) => blocks!(t, &[], unpack_nibbles, nibble_block::<Q5Tile, N>),
                        Tiles::Q4K(t, supers) => {
                            blocks!(t, supers, unpack_nibbles, nibble_block::<Q4KTile, N>)
                        }
                        Tiles::Q5K(t, supers) => {
                            blocks!(t, supers, unpack_nibbles, nibble_block::<Q5KTile, N>)
                        }
                        Tiles::Q6K(t, supers) => {
                            blocks!(t, supers, unpack_six_bits, six_bit_block::<N>)
                        }
                        Tiles::Q8_0(tiles) => {
                            for (b, tile) in tiles.iter().enumerate() {
                                if h == 0 {
                                    prefetch_ahead(tile);
                                }
                                // Quads outer, rows inner: one quad's weights (and on AVX2
                                // their magnitudes) live at a time, so every row's sum stays in
                                // a register; holding the block's eight quads and eight
                                // magnitudes took all 16 and spilled.
                                let mut sums = [_mm256_setzero_si256(); N];
                                for t in 0..8 {
                                    let at = half(tile.qs[t].as_ptr()) as *const u8;
                                    let w = byte_quads(at, $q8_bias);
                                    for (s, row) in sums.iter_mut().zip(rows) {
                                        *s = $dot_q8(*s, w, quad(row.q(b), t));
                                    }
                                }
                                let dw = Lanes256::halves(tile.d[8 * h..].as_ptr());
                                for i in 0..N {
                                    let mut s = sums[i];
                                    if $q8_bias {
                                        let start = rows[i].start(b, Start::Q8_0 as usize);
                                        s = _mm256_add_epi32(s, _mm256_set1_epi32(start));
                                    }
                                    let t = _mm256_mul_ps(
                                        _mm256_cvtepi32_ps(s),
                                        _mm256_set1_ps(rows[i].d(b)),
                                    );
                                    acc[i] = _mm256_fmadd_ps(t, dw, acc[i]);
                                }
                            }
                        }
                    }
                    for i in 0..N {
                        _mm256_storeu_ps(out[i][8 * h..].as_mut_ptr(), acc[i]);
                    }
                }
            }

            /// A tile group times any number of rows: each block's two halves unpacked
            /// once into an L1 buffer, [`CHUNK`] blocks at a time (`over_chunks!`), then
            /// the rows walked over the buffer four at a time as [`tile`] walks the tiles,
            /// each row's accumulators carried from one chunk to the next in `out`. The same float
            /// operations in the same order, so the same bits. Byte tiles are not unpacked
            /// (their walk reads them as they are): they go through [`tile`].
            #[target_feature(enable = $features)]
            pub unsafe fn unpacked(tiles: Tiles, rows: &[Row], out: &mut [[f32; TILE_ROWS]]) {
                let out = &mut out[..rows.len()];
                out.fill([0.0; TILE_ROWS]);
                /// Rows `rs` (from row r) over a chunk's unpacked blocks, by `$block`.
                macro_rules! walk {
                    ($n:ident, $rs:ident, $r:ident, $units:ident, $blocks:ident, $block:expr) => {
                        for h in 0..2 {
                            let out = &mut out[$r..$r + $n];
                            let mut acc = [_mm256_setzero_ps(); $n];
                            for i in 0..$n {
                                acc[i] = _mm256_loadu_ps(out[i][8 * h..].as_ptr());
                            }
                            for (u, b) in $units.iter().zip($blocks.clone()) {
                                $block(&u[h], $rs, b, &mut acc);
                            }
                            for i in 0..$n {
                                _mm256_storeu_ps(out[i][8 * h..].as_mut_ptr(), acc[i]);
                            }
                        }
                    };
                }
                /// Both halves of block b of `$tiles`, unpacked by `$unpack`.
                macro_rules! halves {
                    ($tiles:expr, $supers:expr, $unpack:ident, $b:ident) => {{
                        let tile = &$tiles[$b];
                        prefetch_ahead(tile);
                        [$unpack(tile, $supers, $b, 0), $unpack(tile, $supers, $b, 1)]
                    }};
                }
                macro_rules! nibbles {
                    ($tiles:expr, $supers:expr, $t:ty) => {
                        over_chunks!(
                            $tiles.len(),
                            rows,
                            [Unpacked; 2],
                            |b| halves!($tiles, $supers, unpack_nibbles, b),
                            |units, blocks, N, rs, r| {
                                walk!(N, rs, r, units, blocks, nibble_block::<$t, N>)
                            }
                        )
                    };
                }
                match tiles {
                    Tiles::Q4_1(t) => nibbles!(t, &[], Q4Tile),
                    Tiles::Q5_0(t) => nibbles!(t, &[], Q5_0Tile),
                    Tiles::Q5(t) => nibbles!(t, &[], Q5Tile),
                    Tiles::Q4K(t, supers) => nibbles!(t, supers, Q4KTile),
                    Tiles::Q5K(t, supers) => nibbles!(t, supers, Q5KTile),
                    Tiles::Q6K(t, supers) => over_chunks!(
                        t.len(),
                        rows,
                        [Unpacked; 2],
                        |b| halves!(t, supers, unpack_six_bits, b),
                        |units, blocks, N, rs, r| {
                            walk!(N, rs, r, units, blocks, six_bit_block::<N>)
                        }
                    ),
                    // Never sent here (`unpacked_min_rows`); the same bits all the same.
                    Tiles::Q8_0(_) => {
                        for (row, o) in rows.iter().zip(out.iter_mut()) {
                            tile::<1>(tiles, &[*row], std::array::from_mut(o));
                        }
                    }
                }
            }
        }
    };
}

tile_256!(
    avx2_walks,
    dot_q4_avx2,
    dot_q5_avx2,
    dot_q6_avx2,
    dot_q8_avx2,
    false,
    "avx2,fma,f16c"
);
tile_256!(
    vnni_walks,
    dot_q4_vnni,
    dot_q4_vnni,
    dot_q6_vnni,
    dot_q8_vnni,
    true,
    "avx2,fma,f16c,avxvnni"
);
