//! `bench_model -- --kinds`: each weight type the kernels take from a file, timed alone at
//! the shapes of a small model's layer (feed-forward 1536 × 768 and 768 × 1536, attention
//! 768 × 768: K-quants need columns in multiples of 256) with random weights: bytes a product reads, ms, and the read rate (GB/s) at 1
//! and 16 activation rows, 1 and 2 threads. Which tile kinds stream weights as fast as Q4_1's
//! tiles, and which are short of it, is what this table says.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use infgram::neural::arch::weights::native_matrix;
use infgram::neural::cpu::kernels::{matmul, Isa, QMatrix, QRows};
use infgram::neural::cpu::pool::Pool;
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
    let copies: usize = std::env::var("KINDS_COPIES").map_or(12, |v| v.parse().unwrap());
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
        if let Ok(only) = std::env::var("KINDS_TYPES") {
            if !only.split(',').any(|t| t == format!("{dtype:?}")) {
                continue;
            }
        }
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

/// `bench_model -- --model A.gguf --against B.gguf`: both files' greedy decoding, side by side
/// in one run at 2 threads after the same 256-token context: `rounds` rounds of 64 tokens each,
/// the two alternating so that the machine's drift falls on both, and the ratio of A's speed to
/// B's in each round (median and spread), with each file's bytes per step.
pub fn against(a: &std::path::Path, b: &std::path::Path, isa: Isa, ids: &[u32], rounds: usize) {
    use infgram::lm::{argmax, LanguageModel};
    use infgram::neural::arch::decoder::Decoder;
    let load = |p: &std::path::Path| Decoder::from_gguf(p).unwrap().with_threads(2).with_isa(isa);
    let mut models = [load(a), load(b)];
    let ctx = &ids[..256];
    let firsts: Vec<u32> = models
        .iter_mut()
        .map(|m| argmax(&m.forward(ctx).unwrap().pop().unwrap()))
        .collect();
    let mut decode = |i: usize| {
        let m = &mut models[i];
        m.truncate(256);
        let mut next = firsts[i];
        let t = Instant::now();
        for _ in 0..64 {
            next = argmax(&m.forward(&[next]).unwrap()[0]);
        }
        64.0 / t.elapsed().as_secs_f64()
    };
    decode(0);
    decode(1);
    let (mut speeds, mut ratios) = ([Vec::new(), Vec::new()], Vec::new());
    for round in 0..rounds {
        // A first in even rounds, B first in odd ones.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut tps = [0.0; 2];
        for i in order {
            tps[i] = decode(i);
        }
        ratios.push(tps[0] / tps[1]);
        speeds[0].push(tps[0]);
        speeds[1].push(tps[1]);
    }
    let mb = |m: &Decoder| m.weight_bytes_per_step() as f64 / 1e6;
    let spread = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    println!("ISA {isa:?}, 2 threads, {rounds} rounds of 64 greedy tokens at depth 256\n");
    println!("| file | MB a step | tokens/s: median (min–max) |");
    println!("|---|---:|---:|");
    for (i, p) in [a, b].iter().enumerate() {
        let (med, lo, hi) = spread(&mut speeds[i]);
        println!(
            "| {} | {:.1} | {med:.1} ({lo:.1}–{hi:.1}) |",
            p.file_name().unwrap().to_string_lossy(),
            mb(&models[i])
        );
    }
    let (med, lo, hi) = spread(&mut ratios);
    println!("\nA / B speed, per round: median {med:.3} (min {lo:.3}, max {hi:.3})");
}
