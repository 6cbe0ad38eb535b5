//! The quantized products alone, per instruction set and row count, beside the compute
//! bound ([`super::bound`]): matrices of the weight types and shapes of a Qwen2.5 0.5B layer
//! (4864 × 896 in Q4_1, Q5_0, Q8_0; 896 × 4864 in Q4_K, Q6_K), multiplied with 1, 2, 4, 8
//! and 16 activation rows on two threads. What a several-row pass
//! spends in its products, free of attention, norms and the output projection's size. Each
//! matrix's row counts are timed in rounds (one product of each a round, after three untimed
//! rounds), so a slow spell of the machine falls on all of them alike, and each product is
//! also weighed against a slice of the loop timed just before it ("of the loop, same round").
//!
//! `cargo run --release --example bench_decode -- products [--isa avx2]`

use super::bound::BlockFloats;
use half::f16;
use infgram::neural::native::kernels::{matmul, Isa, KBlock, KQuant, QMatrix, QRows, RowBlock};
use infgram::neural::native::pool::Pool;
use std::time::Instant;

/// A fixed pseudo-random sequence (a multiplicative hash of `i` and `seed`).
fn hash(i: u64, seed: u64) -> u64 {
    (i ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32
}

/// `n` values in [−1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| (hash(i, seed) >> 8) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
        .collect()
}

/// Block `b` of weight row `r`: quants below `levels`, a small scale and offset.
fn block(r: usize, b: usize, levels: u64) -> RowBlock<u8> {
    let at = (r * 1000 + b) as u64 * 32;
    RowBlock {
        d: 0.01 + (hash(at, 7) % 100) as f32 * 1e-4,
        m: -0.05,
        q: std::array::from_fn(|c| (hash(at + c as u64, 3) % levels) as u8),
    }
}

/// A K-quant block of row `r`: quants below `levels`, factors in 0..64 (Q6_K's signed).
fn k_block(r: usize, b: usize, levels: u64) -> KBlock {
    let at = (r * 1000 + b) as u64 * 32;
    KBlock {
        sc: [(hash(at, 5) % 64) as i8 - 32, (hash(at, 6) % 64) as i8 - 32],
        mn: (hash(at, 8) % 64) as u8,
        q: block(r, b, levels).q,
    }
}

/// The matrices: the types and shapes of the Qwen2.5 0.5B GGUF's layers (Q5_0 gate and up,
/// Q8_0 values and output, Q4_K and Q6_K down).
fn matrices() -> Vec<(&'static str, QMatrix)> {
    let sup = |_r: usize, _s: usize| (f16::from_f32(0.002), f16::from_f32(-0.001));
    let byte = |r: usize, b: usize| {
        let nb = block(r, b, 255);
        RowBlock {
            d: nb.d,
            m: 0.0,
            q: nb.q.map(|q| q as i8 - 127),
        }
    };
    vec![
        (
            "4864×896 Q4_1",
            QMatrix::from_nibble_blocks(4864, 896, |r, b| block(r, b, 16)),
        ),
        (
            "4864×896 Q5_0",
            QMatrix::from_q5_0_blocks(4864, 896, |r, b| block(r, b, 32)),
        ),
        ("4864×896 Q8_0", QMatrix::from_byte_blocks(4864, 896, byte)),
        (
            "151936×896 Q8_0 (output)",
            QMatrix::from_byte_blocks(151_936, 896, byte),
        ),
        (
            "896×4864 Q4_K",
            QMatrix::from_k_blocks(KQuant::Q4K, 896, 4864, sup, |r, b| k_block(r, b, 16)),
        ),
        (
            "896×4864 Q6_K",
            QMatrix::from_k_blocks(KQuant::Q6K, 896, 4864, sup, |r, b| k_block(r, b, 64)),
        ),
    ]
}

/// The float work a block of matrix `name`'s type costs (its name ends in the type).
fn block_floats(name: &str) -> BlockFloats {
    if name.contains("Q6_K") {
        BlockFloats::Halves
    } else if name.contains("Q4_1") || name.contains("Q4_K") {
        BlockFloats::WithMin
    } else {
        BlockFloats::Centred
    }
}

/// The activation row counts multiplied.
const ROW_COUNTS: [usize; 5] = [1, 2, 4, 8, 16];

/// Untimed rounds before the timed ones: the matrix in the caches, the threads spinning
/// and the clock up (a first matrix timed without them came out at half its speed).
const WARM_ROUNDS: usize = 3;

/// Rounds of [`super::bound::int8_slice`] timed before each product: about 0.1–0.2 ms of
/// the loop on every thread, the machine's rate of the moment.
const SLICE_ITERS: usize = 50_000;

/// What [`time_in_rounds`] measures for one row count.
struct Cell {
    /// The median seconds of a product.
    seconds: f64,
    /// The median, over rounds, of the product's multiply-adds a second over the loop's
    /// timed just before it (`None` where the ISA has no such loop).
    of_loop: Option<f64>,
}

/// `w`'s product with each of [`ROW_COUNTS`] activation rows, timed in rounds of one product
/// per row count (after [`WARM_ROUNDS`]), so that a slow spell of a shared machine falls on
/// every row count alike instead of on the one being timed; before each product a slice of
/// the ISA's loop on the same threads, so that each product is also weighed against the
/// bound of its own moment (on a VM whose loop rate moves 1.5× from minute to minute, a
/// share of a bound measured once says little).
fn time_in_rounds(isa: Isa, w: &QMatrix, repeats: usize, pool: &mut Pool) -> Vec<Cell> {
    let (rows, cols) = (w.rows(), w.cols());
    /// A row count's activations, output, and what its rounds timed.
    struct Timed {
        a: QRows,
        out: Vec<f32>,
        times: Vec<f64>,
        shares: Vec<f64>,
    }
    let mut cells: Vec<Timed> = ROW_COUNTS
        .iter()
        .map(|&k| {
            let mut a = QRows::default();
            a.quantize_on(isa, &values(k * cols, 2), cols);
            Timed {
                a,
                out: vec![0.0; k * rows],
                times: Vec::new(),
                shares: Vec::new(),
            }
        })
        .collect();
    let threads = pool.threads();
    let per_slice = super::bound::int8_slice(isa, SLICE_ITERS);
    let slice = |pool: &mut Pool| -> Option<f64> {
        let per_slice = per_slice?;
        let t = Instant::now();
        pool.run(&|_| {
            super::bound::int8_slice(isa, SLICE_ITERS);
        });
        Some((threads * per_slice) as f64 / t.elapsed().as_secs_f64())
    };
    for round in 0..WARM_ROUNDS + repeats.max(1) {
        for (
            &k,
            Timed {
                a,
                out,
                times,
                shares,
            },
        ) in ROW_COUNTS.iter().zip(&mut cells)
        {
            let rate = slice(pool);
            let t = Instant::now();
            matmul(isa, w, a, out, pool);
            let seconds = t.elapsed().as_secs_f64();
            if round >= WARM_ROUNDS {
                times.push(seconds);
                if let Some(rate) = rate {
                    shares.push((k * rows * cols) as f64 / seconds / rate);
                }
            }
        }
    }
    cells
        .into_iter()
        .map(|Timed { times, shares, .. }| Cell {
            seconds: super::median(times).expect("at least one round timed"),
            of_loop: super::median(shares),
        })
        .collect()
}

pub fn run(isas: &[Isa], repeats: usize) {
    let matrices = matrices();
    let mut pool = Pool::new(2);
    println!("median of {repeats} products, two threads; G = 10⁹ 8-bit multiply-adds\n");
    // AVX-512's walk beside its own arithmetic as well (`bound::block_rate`), where it runs.
    let avx512 = isas.contains(&Isa::Avx512Vnni);
    let blocks = [
        BlockFloats::Centred,
        BlockFloats::WithMin,
        BlockFloats::Halves,
    ]
    .map(|floats| {
        (
            floats,
            avx512
                .then(|| super::bound::block_rate(floats, 2))
                .flatten(),
        )
    });
    for (floats, rate) in blocks {
        if let Some(rate) = rate {
            println!(
                "AVX-512 blocks of eight rows, {floats:?}: {:.1} G/s",
                rate / 1e9
            );
        }
    }
    if avx512 {
        println!();
    }
    println!(
        "| matrix | ISA | rows | ms | G/s | of the bound | of the loop, same round | of the block loop |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for isa in isas.iter().copied() {
        let rate = super::bound::int8_rate(isa, 2);
        for (name, w) in &matrices {
            let (rows, cols) = (w.rows(), w.cols());
            let cells = time_in_rounds(isa, w, repeats, &mut pool);
            for (k, cell) in ROW_COUNTS.into_iter().zip(cells) {
                let median = cell.seconds;
                let g = (k * rows * cols) as f64 / median / 1e9;
                let of_loop = cell
                    .of_loop
                    .map_or("–".into(), |r| format!("{:.0}%", 100.0 * r));
                let share = rate.map_or("–".into(), |r| format!("{:.0}%", 100.0 * g * 1e9 / r));
                let floats = block_floats(name);
                let block = blocks
                    .iter()
                    .find(|(f, _)| *f == floats)
                    .and_then(|(_, rate)| *rate)
                    .filter(|_| isa == Isa::Avx512Vnni)
                    .map_or("–".into(), |r| format!("{:.0}%", 100.0 * g * 1e9 / r));
                println!(
                    "| {name} | {isa:?} | {k} | {:.3} | {g:.1} | {share} | {of_loop} | {block} |",
                    median * 1e3
                );
            }
        }
    }
}
