//! The compute bound of a several-row pass on this CPU: the 8-bit multiply-adds a second the
//! kernels' instructions can reach, measured with a tight loop of independent chains (AVX2:
//! `vpmaddubsw` + `vpmaddwd` + `vpaddd`, 12 chains; AVX-VNNI and AVX-512 VNNI: `vpdpbusd`, 8
//! chains; AMX: four `tdpbusd` into four sum tiles; each chain's accumulator is its next
//! input, so nothing is hoisted or merged) on every thread of the pass at once, the best of
//! three runs. A pass of k rows does k × (the model's multiply-adds a row) of them, so it
//! cannot take less than that over the rate.

use infgram::neural::native::kernels::{amx_bound_loop, Isa, AMX_BOUND_ROUND};
use std::time::Instant;

/// Multiply-adds a second of `isa`'s dot-product loop on `threads` threads together
/// (`None` for the scalar kernels, which have no such loop).
pub fn int8_rate(isa: Isa, threads: usize) -> Option<f64> {
    let per_call = match isa {
        Isa::Scalar => return None,
        Isa::Avx2 => 12 * 32,
        Isa::AvxVnni => 8 * 32,
        Isa::Avx512Vnni => 8 * 64,
        Isa::Amx => AMX_BOUND_ROUND,
    };
    // An AMX round is 64 times a VNNI one's work.
    let iters = match isa {
        Isa::Amx => 1_000_000,
        _ => 20_000_000,
    };
    let run = || -> i32 {
        // SAFETY: `isa` is one this CPU runs (the caller took it from `Isa::available`).
        unsafe {
            match isa {
                Isa::Avx2 => avx2(iters),
                Isa::AvxVnni => avx_vnni(iters),
                Isa::Amx => i32::from(amx_bound_loop(iters)),
                _ => avx512_vnni(iters),
            }
        }
    };
    run(); // warm-up: the clock and the units

    // The best of three: on a shared machine other tenants only ever slow a run down (one
    // 2-vCPU Xeon gave 245 and 480 G/s for the same AVX-512 loop a minute apart).
    let seconds = (0..3)
        .map(|_| {
            let t = Instant::now();
            let sink: i32 = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(run)).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .fold(0, i32::wrapping_add)
            });
            std::hint::black_box(sink);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    Some((iters * per_call * threads.max(1)) as f64 / seconds)
}

#[target_feature(enable = "avx2")]
unsafe fn avx2(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let (b, ones) = (_mm256_set1_epi8(3), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_si256(); 12];
    for (c, a) in acc.iter_mut().enumerate() {
        *a = _mm256_set1_epi32(c as i32);
    }
    for _ in 0..iters {
        for a in acc.iter_mut() {
            let p = _mm256_maddubs_epi16(*a, b);
            *a = _mm256_add_epi32(*a, _mm256_madd_epi16(p, ones));
        }
    }
    acc.iter().fold(0, |s, a| s ^ _mm256_extract_epi32::<0>(*a))
}

#[target_feature(enable = "avx2,avxvnni")]
unsafe fn avx_vnni(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_epi8(3), _mm256_set1_epi8(5));
    let mut acc = [_mm256_setzero_si256(); 8];
    for (c, s) in acc.iter_mut().enumerate() {
        *s = _mm256_set1_epi32(c as i32);
    }
    for _ in 0..iters {
        for s in acc.iter_mut() {
            *s = _mm256_dpbusd_avx_epi32(*s, a, b);
        }
    }
    acc.iter().fold(0, |s, a| s ^ _mm256_extract_epi32::<0>(*a))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn avx512_vnni(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_epi8(3), _mm512_set1_epi8(5));
    let mut acc = [_mm512_setzero_si512(); 8];
    for (c, s) in acc.iter_mut().enumerate() {
        *s = _mm512_set1_epi32(c as i32);
    }
    for _ in 0..iters {
        for s in acc.iter_mut() {
            *s = _mm512_dpbusd_epi32(*s, a, b);
        }
    }
    acc.iter().fold(0, |s, a| s ^ _mm512_reduce_add_epi32(*a))
}
