//! `exp` over a whole dense row, in f64: the softmax sums of mixing, perplexity and sampling.
//!
//! A mixed row, a perplexity step and a sampled token each take `exp` of every one of a neural
//! model's logits (49,152 for SmolLM2), in f64 so that the sum keeps every digit an f32 result
//! needs. libm's scalar `exp` makes that about 0.3 ms a row, as much as a twentieth of a model
//! step. With AVX2 and FMA, four at a time: Cody–Waite reduction `x = n·ln 2 + r` with
//! `|r| ≤ ln 2 / 2`, a degree-13 Taylor polynomial for `exp(r)` (its truncation error is below
//! 10⁻¹⁷ relative) and `2ⁿ` put straight into the exponent bits. The results are within a few
//! units in the last place of libm's, and the sums (four lanes, then added) agree with libm's
//! one-after-another sums to about 10⁻¹⁴ relative, as close as summing in another order does,
//! far below the f32 precision (6·10⁻⁸) of the logits built from them. Every input is
//! `≤ 0` (logits shifted by their maximum); below −708 the result is 0 (the true value is
//! subnormal and cannot move a sum that holds the maximum's `exp(0) = 1`). With AVX-512, sums
//! take eight at a time: the same operations on each value (the same terms, bit for bit),
//! summed in eight lanes.

/// `Σ exp((x − shift)·scale)` over `xs`, in f64, for `shift ≥` every `x` and `scale > 0`.
pub fn sum_exp(xs: &[f32], shift: f64, scale: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if avx512_available() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { avx512::sum_exp(xs, shift, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { avx2::sum_exp(xs, shift, scale) };
    }
    xs.iter().map(|&x| scalar(x, shift, scale)).sum()
}

/// Calls `f(i, exp((xs[i] − shift)·scale))` for each `i` in order, as [`sum_exp`].
pub fn for_each_exp(xs: &[f32], shift: f64, scale: f64, mut f: impl FnMut(usize, f64)) {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { avx2::for_each_exp(xs, shift, scale, f) };
    }
    for (i, &x) in xs.iter().enumerate() {
        f(i, scalar(x, shift, scale));
    }
}

/// The scalar form: libm's `exp`.
fn scalar(x: f32, shift: f64, scale: f64) -> f64 {
    ((x as f64 - shift) * scale).exp()
}

#[cfg(target_arch = "x86_64")]
fn simd_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::scalar;
    use std::arch::x86_64::*;

    /// Below this, `exp` gives 0 (see the module docs).
    pub(super) const LOWEST: f64 = -708.0;
    /// ln 2 split so that `n·LN2_HI` is exact for |n| < 2¹¹ (fdlibm's constants).
    pub(super) const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    pub(super) const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

    /// `exp` of four shifted and scaled values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp4(x: __m128, shift: __m256d, scale: __m256d) -> __m256d {
        let t = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(x), shift), scale);
        // max(LOWEST, t) keeps a NaN (the second operand is returned when one is NaN).
        let clamped = _mm256_max_pd(_mm256_set1_pd(LOWEST), t);
        let n = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_pd(clamped, _mm256_set1_pd(std::f64::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_HI), clamped);
        let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_LO), r);
        let mut p = _mm256_set1_pd(1.0 / 6_227_020_800.0); // 1/13!
        for c in TAYLOR {
            p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c));
        }
        // 2ⁿ for n in [−1022, 0]: (n + 1023) in the exponent bits.
        let n32 = _mm_add_epi32(_mm256_cvtpd_epi32(n), _mm_set1_epi32(1023));
        let two_n = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_cvtepi32_epi64(n32)));
        let e = _mm256_mul_pd(p, two_n);
        // t < LOWEST (−∞ included) gives 0; a NaN compares false and stays NaN.
        _mm256_andnot_pd(_mm256_cmp_pd::<_CMP_LT_OQ>(t, _mm256_set1_pd(LOWEST)), e)
    }

    /// 1/12!, 1/11!, …, 1/1!, 1/0!: Horner's coefficients after 1/13!.
    pub(super) const TAYLOR: [f64; 13] = [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sum_exp(xs: &[f32], shift: f64, scale: f64) -> f64 {
        let (s, k) = (_mm256_set1_pd(shift), _mm256_set1_pd(scale));
        let chunks = xs.chunks_exact(4);
        let rest = chunks.remainder();
        let mut acc = _mm256_setzero_pd();
        for c in chunks {
            acc = _mm256_add_pd(acc, exp4(_mm_loadu_ps(c.as_ptr()), s, k));
        }
        let mut lanes = [0.0f64; 4];
        _mm256_storeu_pd(lanes.as_mut_ptr(), acc);
        let tail: f64 = rest.iter().map(|&x| scalar(x, shift, scale)).sum();
        lanes.iter().sum::<f64>() + tail
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn for_each_exp(
        xs: &[f32],
        shift: f64,
        scale: f64,
        mut f: impl FnMut(usize, f64),
    ) {
        let (s, k) = (_mm256_set1_pd(shift), _mm256_set1_pd(scale));
        let chunks = xs.chunks_exact(4);
        let done = xs.len() - chunks.remainder().len();
        let mut four = [0.0f64; 4];
        for (c, x) in chunks.enumerate() {
            _mm256_storeu_pd(four.as_mut_ptr(), exp4(_mm_loadu_ps(x.as_ptr()), s, k));
            for (j, &e) in four.iter().enumerate() {
                f(4 * c + j, e);
            }
        }
        for (i, &x) in xs.iter().enumerate().skip(done) {
            f(i, scalar(x, shift, scale));
        }
    }
}

/// [`avx2`]'s `exp` eight at a time: the same operations on each value, so the same terms.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::avx2::{LN2_HI, LN2_LO, LOWEST, TAYLOR};
    use super::scalar;
    use std::arch::x86_64::*;

    /// `exp` of eight shifted and scaled values, as `avx2::exp4` does four.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp8(x: __m256, shift: __m512d, scale: __m512d) -> __m512d {
        let t = _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(x), shift), scale);
        let clamped = _mm512_max_pd(_mm512_set1_pd(LOWEST), t);
        let n = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_pd(clamped, _mm512_set1_pd(std::f64::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_HI), clamped);
        let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_LO), r);
        let mut p = _mm512_set1_pd(1.0 / 6_227_020_800.0);
        for c in TAYLOR {
            p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c));
        }
        let n32 = _mm256_add_epi32(_mm512_cvtpd_epi32(n), _mm256_set1_epi32(1023));
        let two_n = _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_cvtepi32_epi64(n32)));
        let e = _mm512_mul_pd(p, two_n);
        let below = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(t, _mm512_set1_pd(LOWEST));
        _mm512_maskz_mov_pd(!below, e)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_exp(xs: &[f32], shift: f64, scale: f64) -> f64 {
        let (s, k) = (_mm512_set1_pd(shift), _mm512_set1_pd(scale));
        let chunks = xs.chunks_exact(8);
        let rest = chunks.remainder();
        let mut acc = _mm512_setzero_pd();
        for c in chunks {
            acc = _mm512_add_pd(acc, exp8(_mm256_loadu_ps(c.as_ptr()), s, k));
        }
        let mut lanes = [0.0f64; 8];
        _mm512_storeu_pd(lanes.as_mut_ptr(), acc);
        let tail: f64 = rest.iter().map(|&x| scalar(x, shift, scale)).sum();
        lanes.iter().sum::<f64>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of input the rows hold: ordinary logits, the extremes of `exp`'s range,
    /// −∞ (masked ids), exact multiples of ln 2, and lengths that leave a remainder of 0–3.
    fn rows() -> Vec<Vec<f32>> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut rows = vec![
            vec![0.0],
            vec![f32::NEG_INFINITY, 0.0, -745.5, -708.0, -707.9, -700.0],
            (0..40)
                .map(|i| -(i as f32) * std::f32::consts::LN_2)
                .collect(),
        ];
        for len in [1, 2, 3, 5, 1000, 49_155] {
            rows.push((0..len).map(|_| (next() * 40.0 - 20.0) as f32).collect());
        }
        rows
    }

    #[test]
    fn exp_of_a_row_is_libm_s_to_a_few_ulps_and_sums_agree() {
        for row in rows() {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            for scale in [1.0, 1.25, 1.0 / 0.7] {
                let mut fast = Vec::new();
                for_each_exp(&row, max, scale, |i, e| {
                    assert_eq!(i, fast.len());
                    fast.push(e)
                });
                assert_eq!(fast.len(), row.len());
                for (&x, &got) in row.iter().zip(&fast) {
                    let want = scalar(x, max, scale);
                    let t = (x as f64 - max) * scale;
                    if t < -708.0 {
                        assert!(got == 0.0 && want < 1e-307, "{x}: {got} vs {want}");
                    } else {
                        assert!(
                            (got - want).abs() <= 4.0 * f64::EPSILON * want,
                            "{x}: {got} vs {want}"
                        );
                    }
                }
                // The sums differ by their order more than by their terms: the scalar one adds
                // 49,155 terms one after another (rounding error up to about √n·ε ≈ 3·10⁻¹⁴).
                let want: f64 = row.iter().map(|&x| scalar(x, max, scale)).sum();
                let got = sum_exp(&row, max, scale);
                assert!((got - want).abs() <= 1e-13 * want, "{got} vs {want}");
            }
        }
        for_each_exp(&[], 0.0, 1.0, |_, _| panic!("an empty row has no exp"));
        #[cfg(target_arch = "x86_64")]
        if avx512_available() && simd_available() {
            for row in rows() {
                // Eight at a time, the same terms as four at a time, bit for bit.
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                for c in row.chunks_exact(8) {
                    use std::arch::x86_64::*;
                    let (mut eight, mut four) = ([0.0f64; 8], [0.0f64; 8]);
                    // SAFETY: the CPU has AVX-512F, AVX2 and FMA (checked above).
                    unsafe {
                        let (s8, k8) = (_mm512_set1_pd(max), _mm512_set1_pd(1.25));
                        let e = avx512::exp8(_mm256_loadu_ps(c.as_ptr()), s8, k8);
                        _mm512_storeu_pd(eight.as_mut_ptr(), e);
                        let (s4, k4) = (_mm256_set1_pd(max), _mm256_set1_pd(1.25));
                        for h in 0..2 {
                            let e = avx2::exp4(_mm_loadu_ps(c[4 * h..].as_ptr()), s4, k4);
                            _mm256_storeu_pd(four[4 * h..].as_mut_ptr(), e);
                        }
                    }
                    assert_eq!(eight.map(f64::to_bits), four.map(f64::to_bits), "{c:?}");
                }
            }
        }
        assert_eq!(sum_exp(&[], 0.0, 1.0), 0.0);
        assert!(sum_exp(&[f32::NAN, 0.0, 0.0, 0.0], 0.0, 1.0).is_nan());
    }
}
