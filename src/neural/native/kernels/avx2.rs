//! The AVX2 and AVX-VNNI kernels: 8 weight rows per register, four activation rows per walk
//! (eight for Q8_0 on AVX2);
//! the same integer sums and float operations, in the same order, as the scalar kernel.

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

#[inline(always)]
unsafe fn dot_q4_vnni(w: &[__m256i; 8], a: &[i8; 32]) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for (t, &w) in w.iter().enumerate() {
        s = _mm256_dpbusd_avx_epi32(s, w, _mm256_set1_epi32(quad(a, t)));
    }
    s
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

macro_rules! tile_256 {
    ($name:ident, $dot_q4:ident, $dot_q5:ident, $dot_q6:ident, $dot_q8:ident, $q8_bias:literal, $features:literal) => {
        /// Two halves of 8 weight rows, each a 256-bit register of lanes.
        #[target_feature(enable = $features)]
        pub unsafe fn $name<const N: usize>(
            tiles: Tiles,
            rows: &[Row; N],
            out: &mut [[f32; TILE_ROWS]; N],
        ) {
            /// A nibble tile group's rows `8h..8h + 8`.
            #[inline(always)]
            unsafe fn nibbles<T: NibbleTile, const N: usize>(
                tiles: &[T],
                supers: &[SuperScales],
                rows: &[Row; N],
                h: usize,
                acc: &mut [__m256; N],
            ) {
                for (b, tile) in tiles.iter().enumerate() {
                    // The second half reads the lines the first brought in.
                    if h == 0 {
                        prefetch_ahead(tile);
                    }
                    let w = match tile.high() {
                        Some(high) => five_bit_quads::<Lanes256>(tile.qs(), high, 32 * h),
                        None => nibble_quads::<Lanes256>(tile.qs(), 32 * h),
                    };
                    let scales = tile.scales(super_of::<T>(supers, b));
                    let (dw, mw) = scales_of::<Lanes256>(scales, 8 * h);
                    for i in 0..N {
                        let mut s = match tile.high() {
                            None => $dot_q4(&w, rows[i].q(b)),
                            Some(_) => $dot_q5(&w, rows[i].q(b)),
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
            }

            for h in 0..2 {
                let mut acc = [_mm256_setzero_ps(); N];
                let half = |bytes: *const u8| bytes.add(32 * h) as *const __m256i;
                match tiles {
                    Tiles::Q4_1(tiles) => nibbles(tiles, &[], rows, h, &mut acc),
                    Tiles::Q5_0(tiles) => nibbles(tiles, &[], rows, h, &mut acc),
                    Tiles::Q5(tiles) => nibbles(tiles, &[], rows, h, &mut acc),
                    Tiles::Q4K(tiles, supers) => nibbles(tiles, supers, rows, h, &mut acc),
                    Tiles::Q5K(tiles, supers) => nibbles(tiles, supers, rows, h, &mut acc),
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
                    Tiles::Q6K(tiles, supers) => {
                        for (b, tile) in tiles.iter().enumerate() {
                            if h == 0 {
                                prefetch_ahead(tile);
                            }
                            let w = six_bit_quads::<Lanes256>(tile, 32 * h);
                            let d = Lanes256::halves(supers[b / 8].d[8 * h..].as_ptr());
                            let sc = |k: usize| tile.sc[k][8 * h..].as_ptr() as *const u8;
                            let dw = [
                                _mm256_mul_ps(d, Lanes256::bytes(sc(0), true)),
                                _mm256_mul_ps(d, Lanes256::bytes(sc(1), true)),
                            ];
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
                    }
                }
                for i in 0..N {
                    _mm256_storeu_ps(out[i][8 * h..].as_mut_ptr(), acc[i]);
                }
            }
        }
    };
}

tile_256!(
    tile_avx2,
    dot_q4_avx2,
    dot_q5_avx2,
    dot_q6_avx2,
    dot_q8_avx2,
    false,
    "avx2,fma,f16c"
);
tile_256!(
    tile_vnni,
    dot_q4_vnni,
    dot_q4_vnni,
    dot_q6_vnni,
    dot_q8_vnni,
    true,
    "avx2,fma,f16c,avxvnni"
);
