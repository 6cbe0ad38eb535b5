//! The compute bound of a several-row pass on this CPU: the 8-bit multiply-adds a second the
//! kernels' instructions can reach, measured with a tight loop of independent chains (AVX2:
//! `vpmaddubsw` + `vpmaddwd` + `vpaddd`; AVX-VNNI and AVX-512 VNNI: `vpdpbusd`; 12 chains
//! each; AMX: four `tdpbusd` into four sum tiles; each chain's accumulator is its next
//! input, so nothing is hoisted or merged) on every thread of the pass at once, the best of
//! three runs. A pass of k rows does k × (the model's multiply-adds a row) of them, so it
//! cannot take less than that over the rate.
//!
//! The chains must outnumber what the multiply units hold in flight, or the loop measures the
//! instruction's latency instead of its throughput. On a 2-vCPU Sapphire Rapids (2026-12-03,
//! one thread, best of five) `vpdpbusd` on 512 bits gave 107, 210, 311 and 302–326 G/s with 4,
//! 8, 12 and 16 chains (each `vpdpbusd` waits five to six cycles for the one before, and two
//! issue a cycle), and on 256 bits 126–131, 163–164 and 161–164 with 8, 12 and 16: with the
//! eight chains used until then, this file's bound was two-thirds of the real one there.

use infgram::neural::native::kernels::{
    amx_block_loop, amx_bound_loop, Isa, AMX_BLOCK_ROUND, AMX_BOUND_ROUND,
};
use std::time::Instant;

/// Multiply-adds a second of `isa`'s dot-product loop on `threads` threads together
/// (`None` for the scalar kernels, which have no such loop).
pub fn int8_rate(isa: Isa, threads: usize) -> Option<f64> {
    let per_round = per_round(isa)?;
    // An AMX round is 64 times a VNNI one's work.
    let iters = match isa {
        Isa::Amx => 1_000_000,
        _ => 20_000_000,
    };
    // SAFETY: `isa` is one this CPU runs (the caller took it from `Isa::available`).
    let run = || unsafe { run_loop(isa, iters) };
    Some(best_rate(iters * per_round, threads, run))
}

/// One thread's slice of `isa`'s loop, as [`int8_rate`] times it: `iters` rounds, returning
/// the multiply-adds done (`None` for the scalar kernels and AMX, which the products below
/// do not time against a slice). For timing the loop beside other work in the same round.
pub fn int8_slice(isa: Isa, iters: usize) -> Option<usize> {
    if isa == Isa::Amx {
        return None;
    }
    let per_round = per_round(isa)?;
    // SAFETY: as in `int8_rate`.
    std::hint::black_box(unsafe { run_loop(isa, iters) });
    Some(iters * per_round)
}

/// The multiply-adds of one round of `isa`'s loop (`None`: the scalar kernels have none).
fn per_round(isa: Isa) -> Option<usize> {
    Some(match isa {
        Isa::Scalar => return None,
        Isa::Avx2 => CHAINS * 32,
        Isa::AvxVnni => CHAINS * 32,
        Isa::Avx512Vnni => CHAINS * 64,
        Isa::Amx => AMX_BOUND_ROUND,
    })
}

/// `iters` rounds of `isa`'s loop on this thread (the scalar kernels: none).
///
/// # Safety
/// The CPU must run `isa`.
unsafe fn run_loop(isa: Isa, iters: usize) -> i32 {
    match isa {
        Isa::Scalar => 0,
        Isa::Avx2 => avx2(iters),
        Isa::AvxVnni => avx_vnni(iters),
        Isa::Avx512Vnni => avx512_vnni(iters),
        Isa::Amx => i32::from(amx_bound_loop(iters)),
    }
}

/// Multiply-adds a second of `run` (which does `per_run` of them) on `threads` threads at
/// once: a warm-up run (the clock and the units), then the best of three. On a shared
/// machine other tenants only ever slow a run down (one 2-vCPU Xeon gave 245 and 480 G/s for
/// the same AVX-512 loop a minute apart).
fn best_rate<T: Send>(per_run: usize, threads: usize, run: impl Fn() -> T + Sync) -> f64 {
    run();
    let seconds = (0..3)
        .map(|_| {
            let t = Instant::now();
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(&run)).collect();
                for h in handles {
                    std::hint::black_box(h.join().unwrap());
                }
            });
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    (per_run * threads.max(1)) as f64 / seconds
}

/// Independent chains in each loop: enough to keep two multiply units busy through a
/// five- to six-cycle latency, and few enough for AVX2's 16 registers (12 sums and the operands).
const CHAINS: usize = 12;

#[target_feature(enable = "avx2")]
unsafe fn avx2(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let (b, ones) = (_mm256_set1_epi8(3), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_si256(); CHAINS];
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
    let mut acc = [_mm256_setzero_si256(); CHAINS];
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
    let mut acc = [_mm512_setzero_si512(); CHAINS];
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

/// What a block costs on AVX-512 after its `vpdpbusd`: the float work the kernels do per
/// activation row and block so that every ISA gives the scalar kernel's bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFloats {
    /// Convert the block's sum, times the row's scale, add times the weights' scales: three
    /// instructions (Q5_0, Q8_0).
    Centred,
    /// The same and the block's minimum times the row's sum: four (Q4_1, Q4_K).
    WithMin,
    /// Two halves of four quads, each converted and scaled: six (Q6_K).
    Halves,
}

/// Multiply-adds a second of the AVX-512 walk's arithmetic with its operands in registers:
/// eight rows, each block eight `vpdpbusd` a row (the rows' chains interleaved, as
/// `kernels/avx512.rs` does) and then `floats`' instructions a row, on `threads` threads. No
/// walk of that shape (a broadcast quad per row and a chain a row) that keeps the scalar
/// kernel's bits can beat it on this CPU: it leaves out only the weights' loads and
/// unpacking. (Two chains a row did not lift it on a Sapphire Rapids: BENCHMARKS.md, "The
/// bound loop's chains".) `None` where the CPU lacks AVX-512 VNNI.
pub fn block_rate(floats: BlockFloats, threads: usize) -> Option<f64> {
    if !Isa::available().contains(&Isa::Avx512Vnni) {
        return None;
    }
    const ROUND: usize = 8 * 8 * 64;
    let iters = 4_000_000;
    let run = || -> f32 {
        // SAFETY: the CPU runs AVX-512 VNNI (checked above).
        unsafe {
            match floats {
                BlockFloats::Centred => avx512_blocks::<3>(iters),
                BlockFloats::WithMin => avx512_blocks::<4>(iters),
                BlockFloats::Halves => avx512_blocks::<6>(iters),
            }
        }
    };
    Some(best_rate(iters * ROUND, threads, run))
}

/// The AMX walk's own work with its operands in L1 (`amx_block_loop`: four blocks' tile
/// products of 16 rows, their sums stored, and each row's float work, which keeping the VNNI
/// kernels' bits fixes), in multiply-adds a second on `threads` threads: the rate no AMX walk
/// of these blocks can pass. `None` where the kernels do not use AMX, and for Q6_K's halves.
pub fn amx_block_rate(floats: BlockFloats, threads: usize) -> Option<f64> {
    let with_min = match floats {
        BlockFloats::Centred => false,
        BlockFloats::WithMin => true,
        BlockFloats::Halves => return None,
    };
    if !Isa::available().contains(&Isa::Amx) {
        return None;
    }
    let rounds = 100_000;
    let run = || amx_block_loop(rounds, with_min);
    Some(best_rate(rounds * AMX_BLOCK_ROUND, threads, run))
}

/// `iters` blocks of eight rows: `FLOATS` is 3 ([`BlockFloats::Centred`]), 4 (`WithMin`) or
/// 6 (`Halves`). The rows' quads and scales come from a small table indexed by the block, as
/// the kernels' broadcasts come from the activation rows, so nothing is hoisted.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn avx512_blocks<const FLOATS: usize>(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    const ROWS: usize = 8;
    // Sixteen blocks of every row's eight quads and scale (its start is a quad shifted).
    let mut quads = [[[0i32; 8]; ROWS]; 16];
    let mut scales = [[0f32; ROWS]; 16];
    for (b, block) in quads.iter_mut().enumerate() {
        for (i, row) in block.iter_mut().enumerate() {
            for (t, q) in row.iter_mut().enumerate() {
                *q = (b * 131 + i * 17 + t * 3) as i32 & 0x3f3f_3f3f;
            }
            scales[b][i] = 1e-3 * (1 + b + i) as f32;
        }
    }
    let (quads, scales) = std::hint::black_box((&quads, &scales));
    let mut w = [_mm512_setzero_si512(); 8];
    for (t, w) in w.iter_mut().enumerate() {
        *w = _mm512_set1_epi8(3 + t as i8);
    }
    let (dw, mw) = (_mm512_set1_ps(0.5), _mm512_set1_ps(-0.25));
    let mut acc = [_mm512_setzero_ps(); ROWS];
    // The quads each sum covers: a block's eight, or Q6_K's two halves of four.
    let spans: &[(usize, usize)] = if FLOATS == 6 {
        &[(0, 4), (4, 8)]
    } else {
        &[(0, 8)]
    };
    for k in 0..iters {
        let (q, d) = (&quads[k & 15], &scales[k & 15]);
        for &(from, to) in spans {
            let mut sums = [_mm512_setzero_si512(); ROWS];
            for (s, row) in sums.iter_mut().zip(q) {
                *s = _mm512_set1_epi32(row[0] >> 8);
            }
            for t in from..to {
                for (s, row) in sums.iter_mut().zip(q) {
                    *s = _mm512_dpbusd_epi32(*s, w[t], _mm512_set1_epi32(row[t]));
                }
            }
            for i in 0..ROWS {
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(sums[i]), _mm512_set1_ps(d[i]));
                acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
                if FLOATS == 4 {
                    acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(d[i]), acc[i]);
                }
            }
        }
    }
    acc.iter().map(|a| _mm512_reduce_add_ps(*a)).sum()
}
