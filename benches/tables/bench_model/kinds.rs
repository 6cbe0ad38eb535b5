//! `bench_model -- --kinds`: each weight type the kernels take from a file, timed alone at
//! the shapes of a small model's layer (feed-forward 1536 × 768 and 768 × 1536, attention
//! 768 × 768: K-quants need columns in multiples of 256) with random weights: bytes a product reads, ms, and the read rate (GB/s) at 1
//! and 16 activation rows, 1 and 2 threads. Which tile kinds stream weights as fast as Q4_1's
//! tiles, and which are short of it, is what this table says.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use infgram::neural::native::kernels::{matmul, Isa, QMatrix, QRows};
use infgram::neural::native::pool::Pool;
use infgram::neural::native::weights::native_matrix;
use std::time::Instant;

/// A layer's worth of matrices of one type: (rows, cols).
const SHAPES: [(usize, usize); 4] = [(1536, 768), (1536, 768), (768, 1536), (768, 768)];

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn matrices(dtype: GgmlDType, copies: usize) -> Vec<QMatrix> {
    (0..copies)
        .flat_map(|c| SHAPES.iter().map(move |&s| (c, s)))
        .map(|(c, (rows, cols))| {
            let t = Tensor::from_vec(
                random(rows * cols, c as u64 + 7),
                (rows, cols),
                &Device::Cpu,
            )
            .unwrap();
            let q = QTensor::quantize(&t, dtype).unwrap();
            native_matrix(dtype, rows, cols, &q.data().unwrap()).unwrap()
        })
        .collect()
}

/// Median ms of `runs` passes over every matrix, k activation rows each.
fn time(isa: Isa, ws: &[QMatrix], k: usize, threads: usize) -> f64 {
    let mut pool = Pool::new(threads);
    let mut rows: std::collections::HashMap<usize, QRows> = Default::default();
    for w in ws {
        rows.entry(w.cols()).or_insert_with(|| {
            let mut a = QRows::default();
            a.quantize(&random(k * w.cols(), 3), w.cols());
            a
        });
    }
    let mut out = vec![0.0f32; k * 1536];
    let mut pass = || {
        for w in ws {
            let a = &rows[&w.cols()];
            matmul(isa, w, a, &mut out[..k * w.rows()], &mut pool);
        }
    };
    pass();
    let mut times: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

pub fn run(isa: Isa) {
    // 12 layers' worth (about 50 M weights), more than the last-level caches hold.
    let copies = 12;
    println!("ISA {isa:?}; {copies} copies of a layer's four products, random weights\n");
    println!("| type | MB | k=1, 1 thread: ms (GB/s) | k=1, 2 threads | k=16, 1 thread | k=16, 2 threads |");
    println!("|---|---:|---:|---:|---:|---:|");
    for dtype in [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q4K,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
        GgmlDType::Q8_0,
    ] {
        let ws = matrices(dtype, copies);
        let bytes: usize = ws.iter().map(|w| w.bytes()).sum();
        let mb = bytes as f64 / 1e6;
        let cells: Vec<String> = [(1, 1), (1, 2), (16, 1), (16, 2)]
            .iter()
            .map(|&(k, threads)| {
                let ms = time(isa, &ws, k, threads);
                format!("{ms:.2} ({:.1})", mb / ms)
            })
            .collect();
        println!("| {dtype:?} | {mb:.1} | {} |", cells.join(" | "));
    }
}

/// Ratios of A to B over alternating rounds: their geometric mean (which cancels an effect
/// of order, the order alternating), median, minimum and maximum.
struct Ratios(Vec<f64>);

impl Ratios {
    /// Runs `rounds` rounds of `measure(0)` and `measure(1)` (A first in even rounds), each
    /// giving a speed; returns the speeds of each and the ratios A / B.
    fn alternate(rounds: usize, mut measure: impl FnMut(usize) -> f64) -> ([Vec<f64>; 2], Ratios) {
        let (mut speeds, mut ratios) = ([Vec::new(), Vec::new()], Vec::new());
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            let mut v = [0.0; 2];
            for i in order {
                v[i] = measure(i);
                speeds[i].push(v[i]);
            }
            ratios.push(v[0] / v[1]);
        }
        (speeds, Ratios(ratios))
    }

    fn describe(&self) -> String {
        let geomean = (self.0.iter().map(|r| r.ln()).sum::<f64>() / self.0.len() as f64).exp();
        let (med, lo, hi) = spread(&self.0);
        format!("geometric mean {geomean:.3}; median {med:.3} (min {lo:.3}, max {hi:.3})")
    }
}

/// Median, minimum and maximum.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `bench_model -- --model A.gguf --against B.gguf`: both files' greedy decoding, side by side
/// in one run at 2 threads after the same 256-token context: `rounds` rounds of 64 tokens each
/// (after 16 untimed ones), the two alternating so that the machine's drift falls on both, and
/// the ratio of A's speed to B's, with each file's bytes per step. The files are loaded twice,
/// A first for the first half of the rounds and B first for the second: on a Zen 3 EPYC the
/// file loaded first decoded 3–5% slower whatever it was (A against A: 0.954, 0.970), so a
/// ratio measured in one loading order holds that bias and the two halves' ratios cancel it.
pub fn against(a: &std::path::Path, b: &std::path::Path, isa: Isa, ids: &[u32], rounds: usize) {
    use infgram::lm::{argmax, LanguageModel};
    use infgram::neural::native::decoder::Decoder;
    let load = |p: &std::path::Path| Decoder::from_gguf(p).unwrap().with_threads(2).with_isa(isa);
    let ctx = &ids[..256];
    let mut speeds: [Vec<f64>; 2] = Default::default();
    let mut halves = Vec::new();
    let mut mb = [0.0; 2];
    for a_first in [true, false] {
        let mut models = if a_first {
            let first = load(a);
            [first, load(b)]
        } else {
            let first = load(b);
            [load(a), first]
        };
        let firsts: Vec<u32> = models
            .iter_mut()
            .map(|m| argmax(&m.forward(ctx).unwrap().pop().unwrap()))
            .collect();
        for (i, m) in models.iter().enumerate() {
            mb[i] = m.weight_bytes_per_step() as f64 / 1e6;
        }
        // A file decoded right after the other finds its weights evicted from the last-level
        // cache, which a file decoding on its own never does (here that made whichever file ran
        // first in a round up to 15% faster): each timing follows 16 untimed tokens of its file.
        let (half_speeds, ratios) = Ratios::alternate(rounds.div_ceil(2), |i| {
            let m = &mut models[i];
            let mut next = firsts[i];
            let mut t = Instant::now();
            m.truncate(256 - 16);
            for step in 0..16 + 64 {
                if step == 16 {
                    t = Instant::now();
                }
                next = argmax(&m.forward(&[next]).unwrap()[0]);
            }
            64.0 / t.elapsed().as_secs_f64()
        });
        for (all, half) in speeds.iter_mut().zip(half_speeds) {
            all.extend(half);
        }
        halves.push(ratios);
    }
    println!("ISA {isa:?}, 2 threads, {rounds} rounds of 64 greedy tokens at depth 256\n");
    println!("| file | MB a step | tokens/s: median (min–max) |");
    println!("|---|---:|---:|");
    for (i, p) in [a, b].iter().enumerate() {
        let (med, lo, hi) = spread(&speeds[i]);
        let name = p.file_name().unwrap().to_string_lossy();
        println!("| {name} | {:.1} | {med:.1} ({lo:.1}–{hi:.1}) |", mb[i]);
    }
    println!(
        "\nA / B speed per round, A loaded first: {}",
        halves[0].describe()
    );
    println!(
        "A / B speed per round, B loaded first: {}",
        halves[1].describe()
    );
    let all = Ratios(halves.iter().flat_map(|r| r.0.iter().copied()).collect());
    println!("A / B speed per round, both orders: {}", all.describe());
}

/// `bench_model -- --stream TYPE,TYPE [--copies A,B]`: the products of a SmolLM2-135M step
/// with one activation row (`copies` layers of q, k, v, o, gate, up and down in each type; 7
/// products of 576 × 1536 a layer for the K-quants, whose rows must be multiples of 256),
/// timed alternately at 2 threads after a warm pass: each side's weight bytes and its read
/// rate, and the ratio of A's rate to B's. With one type on both sides and different copies,
/// what more bytes alone cost on this machine.
pub fn stream(isa: Isa, types: [GgmlDType; 2], copies: [usize; 2], rounds: usize) {
    let k_quant = types
        .iter()
        .any(|d| matches!(d, GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K));
    let shapes = if k_quant {
        [(576, 1536); 7]
    } else {
        [
            (576, 576),
            (192, 576),
            (192, 576),
            (576, 576),
            (1536, 576),
            (1536, 576),
            (576, 1536),
        ]
    };
    let make = |dtype: GgmlDType, copies: usize| -> Vec<QMatrix> {
        (0..copies)
            .flat_map(|c| shapes.iter().map(move |&s| (c, s)))
            .map(|(c, (rows, cols))| {
                let values = random(rows * cols, c as u64 + 7);
                let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
                let q = QTensor::quantize(&t, dtype).unwrap();
                native_matrix(dtype, rows, cols, &q.data().unwrap()).unwrap()
            })
            .collect()
    };
    let ws = [make(types[0], copies[0]), make(types[1], copies[1])];
    let mut pool = Pool::new(2);
    let acts: std::collections::HashMap<usize, QRows> = [576usize, 1536]
        .into_iter()
        .map(|c| {
            let mut q = QRows::default();
            q.quantize(&random(c, 3), c);
            (c, q)
        })
        .collect();
    let mut out = vec![0.0f32; 1536];
    let bytes = [0, 1].map(|i| ws[i].iter().map(|w| w.bytes()).sum::<usize>() as f64);
    let (rates, ratios) = Ratios::alternate(rounds, |i| {
        let mut pass = || {
            for w in &ws[i] {
                matmul(isa, w, &acts[&w.cols()], &mut out[..w.rows()], &mut pool);
            }
        };
        pass();
        let t = Instant::now();
        for _ in 0..10 {
            pass();
        }
        bytes[i] * 10.0 / t.elapsed().as_secs_f64() / 1e9
    });
    println!("ISA {isa:?}, 2 threads, {rounds} rounds of 10 passes, one activation row\n");
    println!("| side | type | MB a pass | GB/s: median (min–max) |");
    println!("|---|---|---:|---:|");
    for i in 0..2 {
        let (med, lo, hi) = spread(&rates[i]);
        let side = ["A", "B"][i];
        println!(
            "| {side} | {:?} | {:.1} | {med:.1} ({lo:.1}–{hi:.1}) |",
            types[i],
            bytes[i] / 1e6
        );
    }
    println!("\nA / B read rate per round: {}", ratios.describe());
}
