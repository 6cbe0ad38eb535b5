//! Criterion benches of the quantized matrix product on every instruction set this CPU has,
//! for the shapes of SmolLM2-135M's feed-forward (1536 × 576, Q4_1) and output (49152 × 576,
//! Q8_0) at 1 and 8 activation rows. The scalar kernel is the baseline of the same run; each
//! ISA is first checked to give the scalar result bit for bit.
//! `cargo bench --bench kernels`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use infgram::neural::kernels::{matmul, Isa, QMatrix, QRows};
use infgram::neural::pool::Pool;
use std::hint::black_box;

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Q4_1 blocks of `values` in ggml's layout (f16 d, f16 min, 16 bytes of nibbles).
fn q4_1(rows: usize, cols: usize, values: &[f32]) -> QMatrix {
    let mut bytes = Vec::new();
    for block in values.chunks_exact(32) {
        let min = block.iter().copied().fold(f32::MAX, f32::min);
        let max = block.iter().copied().fold(f32::MIN, f32::max);
        let d = (max - min) / 15.0;
        bytes.extend(half::f16::from_f32(d).to_le_bytes());
        bytes.extend(half::f16::from_f32(min).to_le_bytes());
        let q = |x: f32| ((x - min) / d).round().clamp(0.0, 15.0) as u8;
        for j in 0..16 {
            bytes.push(q(block[j]) | (q(block[j + 16]) << 4));
        }
    }
    QMatrix::from_q4_1(rows, cols, &bytes).expect("Q4_1 blocks")
}

fn products(c: &mut Criterion) {
    let cols = 576;
    let shapes = [
        (
            "ffn 1536x576 Q4_1",
            q4_1(1536, cols, &pseudo(1536 * cols, 1)),
        ),
        (
            "output 49152x576 Q8_0",
            QMatrix::quantize_q8_0(49_152, cols, &pseudo(49_152 * cols, 2)).unwrap(),
        ),
    ];
    let mut pool = Pool::new(1);
    for (name, w) in &shapes {
        let mut g = c.benchmark_group(*name);
        g.sample_size(10);
        for k in [1usize, 8] {
            let mut a = QRows::default();
            a.quantize(&pseudo(k * cols, 3), cols);
            let mut want = vec![0.0; k * w.rows()];
            matmul(Isa::Scalar, w, &a, &mut want, &mut pool);
            g.throughput(Throughput::Elements((k * w.rows() * cols) as u64));
            for isa in Isa::available() {
                let mut out = vec![0.0; k * w.rows()];
                matmul(isa, w, &a, &mut out, &mut pool);
                assert_eq!(out, want, "{isa:?} gives the scalar bits");
                g.bench_with_input(BenchmarkId::new(format!("{isa:?}"), k), &k, |b, _| {
                    b.iter(|| matmul(isa, black_box(w), &a, &mut out, &mut pool))
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, products);
criterion_main!(benches);
