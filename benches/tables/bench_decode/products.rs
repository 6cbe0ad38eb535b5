//! The quantized products alone, per instruction set and row count, beside the compute
//! bound ([`super::bound`]): matrices of the weight types and shapes of a Qwen2.5 0.5B layer
//! (4864 × 896 in Q4_1, Q5_0, Q8_0; 896 × 4864 in Q4_K, Q6_K), multiplied with 1, 2, 4, 8
//! and 16 activation rows on two threads. What a several-row pass
//! spends in its products, free of attention, norms and the output projection's size. Each
//! matrix's row counts are timed in rounds (one product of each a round, after three untimed
//! rounds), so a slow spell of the machine falls on all of them alike, and each product is
//! also weighed against a slice of the loop timed just before it ("of the loop, same round").
//! With several ISAs (the default: every one this CPU runs but the scalar) each round takes
//! every ISA in turn, so their figures come from the same minutes of a shared machine.
//!
//! `cargo run --release --example bench_decode -- products [--isa avx2[,avx512vnni…]]`

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

/// Rounds of [`super::bound::int8_slice`] timed before each product: about 0.1–0.3 ms of
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

/// `w`'s product on each of `isas` with each of [`ROW_COUNTS`] activation rows, timed in
/// rounds of one product per ISA and row count (after [`WARM_ROUNDS`]), so that a slow spell
/// of a shared machine falls on every ISA and row count alike instead of on the one being
/// timed (two ISAs timed one after the other on such a machine differ by the minute they ran
/// in as much as by their kernels); before each product a slice of the ISA's loop on the same
/// threads, so that each product is also weighed against the bound of its own moment (on a
/// VM whose loop rate moves 1.5× from minute to minute, a share of a bound measured once says
/// little). `cells[i][j]`: ISA i, row count j.
fn time_in_rounds(isas: &[Isa], w: &QMatrix, repeats: usize, pool: &mut Pool) -> Vec<Vec<Cell>> {
    let (rows, cols) = (w.rows(), w.cols());
    /// An ISA's row count: its activations, output, and what its rounds timed.
    struct Timed {
        isa: Isa,
        k: usize,
        per_slice: Option<usize>,
        a: QRows,
        out: Vec<f32>,
        times: Vec<f64>,
        shares: Vec<f64>,
    }
    let mut cells: Vec<Timed> = isas
        .iter()
        .flat_map(|&isa| {
            // One slice of the ISA's loop run here, which also says its multiply-adds.
            let per_slice = super::bound::int8_slice(isa, SLICE_ITERS);
            ROW_COUNTS.iter().map(move |&k| (isa, per_slice, k))
        })
        .map(|(isa, per_slice, k)| {
            let mut a = QRows::default();
            a.quantize_on(isa, &values(k * cols, 2), cols);
            Timed {
                isa,
                k,
                per_slice,
                a,
                out: vec![0.0; k * rows],
                times: Vec::new(),
                shares: Vec::new(),
            }
        })
        .collect();
    let threads = pool.threads();
    for round in 0..WARM_ROUNDS + repeats.max(1) {
        for cell in &mut cells {
            let isa = cell.isa;
            // The loop's rate of this moment on the same threads (`None`: no loop to slice).
            let rate = cell.per_slice.map(|per_slice| {
                let t = Instant::now();
                pool.run(&|_| {
                    super::bound::int8_slice(isa, SLICE_ITERS);
                });
                (threads * per_slice) as f64 / t.elapsed().as_secs_f64()
            });
            let t = Instant::now();
            matmul(isa, w, &cell.a, &mut cell.out, pool);
            let seconds = t.elapsed().as_secs_f64();
            if round >= WARM_ROUNDS {
                cell.times.push(seconds);
                if let Some(rate) = rate {
                    cell.shares
                        .push((cell.k * rows * cols) as f64 / seconds / rate);
                }
            }
        }
    }
    let mut cells = cells.into_iter().map(|timed| Cell {
        seconds: super::median(timed.times).expect("at least one round timed"),
        of_loop: super::median(timed.shares),
    });
    isas.iter()
        .map(|_| cells.by_ref().take(ROW_COUNTS.len()).collect())
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
    // The AMX walk's own work likewise (`bound::amx_block_rate`): its ceiling.
    let amx = isas.contains(&Isa::Amx);
    for floats in [BlockFloats::Centred, BlockFloats::WithMin] {
        if let Some(rate) = amx
            .then(|| super::bound::amx_block_rate(floats, 2))
            .flatten()
        {
            println!("AMX blocks of 16 rows, {floats:?}: {:.1} G/s", rate / 1e9);
        }
    }
    if avx512 || amx {
        println!();
    }
    println!(
        "| matrix | ISA | rows | ms | G/s | of the bound | of the loop, same round | of the block loop |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let rates: Vec<Option<f64>> = isas
        .iter()
        .map(|&isa| super::bound::int8_rate(isa, 2))
        .collect();
    for (name, w) in &matrices {
        let (rows, cols) = (w.rows(), w.cols());
        let timed = time_in_rounds(isas, w, repeats, &mut pool);
        for ((&isa, rate), cells) in isas.iter().zip(&rates).zip(timed) {
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
