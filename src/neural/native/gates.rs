//! The feed-forward gates' element-wise part, eight values at a time: SwiGLU's
//! `silu(g)·u = g / (1 + e^−g) · u` ([`silu_mul`]) and GeGLU's `gelu(g)·u` with GELU's tanh
//! approximation ([`gelu_mul`]), which is the same form: `0.5·g·(1 + tanh z) = g / (1 + e^−2z)`
//! with `z = √(2/π)·(g + 0.044715·g³)`.
//!
//! The scalar code calls libm's `expf` once per value, about 3 ns each: a 16-token pass spends
//! 5% of its time there. The vector code computes `e^x` with the algorithm of glibc's `expf`
//! (ARM's optimized routines: `x·32/ln 2 = k + r`, 2^(k/32) from a 32-entry table, a cubic
//! for 2^(r/32), all in f64) as glibc's AVX2 + FMA build of it does, with fused multiply-adds
//! for the reduction. Over every float with |x| < 88 (2.2·10⁹ values) that gives glibc's bits
//! exactly, so the pass's logits do not change; larger |x| and NaN take libm's `expf`. Other
//! libms round a few values differently, which the unit test below would show.

use crate::neural::native::kernels::Isa;

/// `out[i] = gate[i] / (1 + e^−gate[i]) · up[i]`, with `isa`'s vectors.
pub fn silu_mul(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: `Isa::detect` saw AVX2 and FMA before choosing a vector ISA.
        return unsafe { gated_avx2::<false>(gate, up, out) };
    }
    let _ = isa;
    silu_mul_scalar(gate, up, out)
}

/// `out[i] = gelu(gate[i]) · up[i]` (GELU's tanh approximation), with `isa`'s vectors.
pub fn gelu_mul(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: `Isa::detect` saw AVX2 and FMA before choosing a vector ISA.
        return unsafe { gated_avx2::<true>(gate, up, out) };
    }
    let _ = isa;
    gated_scalar::<true>(gate, up, out)
}

/// `2·√(2/π)` and `2·√(2/π)·0.044715`: GELU's `2z = g·(C0 + C1·g²)`.
const GELU_C0: f32 = 1.595_769_2;
const GELU_C1: f32 = GELU_C0 * 0.044_715;

/// The exponent's argument: `g` for SiLU, `2z` for GELU (a multiply, an add, a multiply, a
/// multiply: the same operations in the vector code).
#[inline(always)]
fn gate_arg<const GELU: bool>(g: f32) -> f32 {
    if GELU {
        g * (GELU_C0 + GELU_C1 * (g * g))
    } else {
        g
    }
}

/// The definition, with libm's `expf`.
fn silu_mul_scalar(gate: &[f32], up: &[f32], out: &mut [f32]) {
    gated_scalar::<false>(gate, up, out)
}

fn gated_scalar<const GELU: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-gate_arg::<GELU>(*g)).exp()) * u;
    }
}

/// `2^(i/32)`'s bits less `i << 47` (glibc's `__exp2f_data.tab`): adding `k << 47` for
/// `k ≡ i (mod 32)` gives `2^(k/32)`.
#[cfg(target_arch = "x86_64")]
const EXP2_TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// [`silu_mul`] (or, with `GELU`, [`gelu_mul`]) with AVX2 and FMA: eight values at a time,
/// `e^−arg` in two halves of four f64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_avx2<const GELU: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    const N: f64 = 32.0;
    let inv_ln2_n = _mm256_set1_pd(f64::from_bits(0x3ff71547652b82fe) * N);
    let shift = _mm256_set1_pd(f64::from_bits(0x4338000000000000)); // 1.5·2⁵², rounds to int
    let c0 = _mm256_set1_pd(f64::from_bits(0x3fac6af84b912394) / N / N / N);
    let c1 = _mm256_set1_pd(f64::from_bits(0x3fcebfce50fac4f3) / N / N);
    let c2 = _mm256_set1_pd(f64::from_bits(0x3fe62e42ff0c52d6) / N);
    let one_d = _mm256_set1_pd(1.0);
    let low5 = _mm256_set1_epi64x(31);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let limit = _mm256_set1_ps(88.0);
    let one = _mm256_set1_ps(1.0);
    let (gelu_c0, gelu_c1) = (_mm256_set1_ps(GELU_C0), _mm256_set1_ps(GELU_C1));
    // e^x for four values with |x| < 88, as glibc computes it.
    let exp4 = |x: __m128| -> __m128 {
        let xd = _mm256_cvtps_pd(x);
        let kd = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
        let ki = _mm256_castpd_si256(kd);
        let kd = _mm256_sub_pd(kd, shift);
        let r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
        let index = _mm256_and_si256(ki, low5);
        // SAFETY: the indices are below 32.
        let t = unsafe { _mm256_i64gather_epi64::<8>(EXP2_TABLE.as_ptr().cast(), index) };
        let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
        let z = _mm256_fmadd_pd(c0, r, c1);
        let r2 = _mm256_mul_pd(r, r);
        let y = _mm256_fmadd_pd(c2, r, one_d);
        let y = _mm256_fmadd_pd(z, r2, y);
        _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
    };
    let n = gate.len().min(up.len()).min(out.len());
    let whole = n - n % 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 ≤ n, the length of all three.
        let (g, u) = unsafe {
            (
                _mm256_loadu_ps(gate.as_ptr().add(i)),
                _mm256_loadu_ps(up.as_ptr().add(i)),
            )
        };
        let arg = if GELU {
            let square = _mm256_mul_ps(g, g);
            _mm256_mul_ps(g, _mm256_add_ps(gelu_c0, _mm256_mul_ps(gelu_c1, square)))
        } else {
            g
        };
        // |arg| ≥ 88 or NaN (unordered): glibc's special cases, left to libm.
        let special = _mm256_cmp_ps::<_CMP_NLT_UQ>(_mm256_and_ps(arg, abs), limit);
        if _mm256_movemask_ps(special) != 0 {
            gated_scalar::<GELU>(&gate[i..i + 8], &up[i..i + 8], &mut out[i..i + 8]);
            continue;
        }
        let minus = _mm256_sub_ps(_mm256_setzero_ps(), arg);
        let e = _mm256_set_m128(
            exp4(_mm256_extractf128_ps::<1>(minus)),
            exp4(_mm256_castps256_ps128(minus)),
        );
        let y = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
        // SAFETY: as the loads.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), y) };
    }
    gated_scalar::<GELU>(&gate[whole..n], &up[whole..n], &mut out[whole..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector code gives libm's bits: at a million spread-out values, at the edges of its
    /// range (±88, where libm takes over, NaN, ±∞, ±0, subnormals) and at lengths that leave
    /// a remainder.
    #[test]
    fn silu_is_libm_s_bits_on_every_isa() {
        let mut gate: Vec<f32> = (0..1_000_003u32)
            .map(|i| {
                f32::from_bits(i.wrapping_mul(2_654_435_761) % 0x42c0_0000)
                    * [1.0, -1.0][i as usize % 2]
            })
            .collect();
        gate.extend([
            88.0,
            -88.0,
            87.999_99,
            -87.999_99,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            20.0,
            -20.0,
            104.0,
            -104.0,
        ]);
        let up: Vec<f32> = (0..gate.len()).map(|i| 0.5 + (i % 7) as f32).collect();
        for len in [gate.len(), 7, 9, 16] {
            let (g, u) = (&gate[gate.len() - len..], &up[..len]);
            let mut want = vec![0.0f32; len];
            silu_mul_scalar(g, u, &mut want);
            let mut want_gelu = vec![0.0f32; len];
            gated_scalar::<true>(g, u, &mut want_gelu);
            for isa in Isa::available() {
                let mut got = vec![0.0f32; len];
                gelu_mul(isa, g, u, &mut got);
                for (i, (a, b)) in got.iter().zip(&want_gelu).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{isa:?}: gelu({})·{} = {a}, libm gives {b}",
                        g[i],
                        u[i]
                    );
                }
                let mut got = vec![0.0f32; len];
                silu_mul(isa, g, u, &mut got);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{isa:?}: silu({})·{} = {a}, libm gives {b}",
                        g[i],
                        u[i]
                    );
                }
            }
        }
    }

    /// Every float below 88 in magnitude, eight at a time (about half a minute in release:
    /// `cargo test --release -- --ignored silu`).
    /// GELU's tanh form as written: `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))`.
    #[test]
    fn gelu_is_the_tanh_approximation() {
        let g: Vec<f32> = (-800..=800).map(|i| i as f32 / 100.0).collect();
        let u = vec![1.0f32; g.len()];
        let mut got = vec![0.0f32; g.len()];
        gelu_mul(Isa::detect(), &g, &u, &mut got);
        for (x, y) in g.iter().zip(&got) {
            let x64 = *x as f64;
            let z = (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
            let want = 0.5 * x64 * (1.0 + z.tanh());
            assert!(
                (*y as f64 - want).abs() < 2e-6 * (1.0 + want.abs()),
                "gelu({x}) = {y}, want {want}"
            );
        }
    }

    #[test]
    #[ignore]
    fn silu_is_libm_s_bits_at_every_float() {
        let isa = Isa::detect();
        let up = [1.0f32; 1 << 16];
        let (mut got, mut want) = (vec![0.0f32; 1 << 16], vec![0.0f32; 1 << 16]);
        for top in 0..1u32 << 16 {
            let gate: Vec<f32> = (0..1u32 << 16)
                .map(|low| f32::from_bits(top << 16 | low))
                .collect();
            silu_mul(isa, &gate, &up, &mut got);
            silu_mul_scalar(&gate, &up, &mut want);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "silu({}) = {a}, libm gives {b}",
                    gate[i]
                );
            }
        }
    }
}
