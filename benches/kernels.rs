//! Criterion benches of the quantized matrix product on every instruction set this CPU has,
//! for the shapes of SmolLM2-135M's feed-forward (1536 × 576, Q4_1) and output (49152 × 576,
//! Q8_0) at 1 and 8 activation rows. The scalar kernel is the baseline of the same run; each
//! ISA is first checked to give the scalar result bit for bit. Beside them, attention with
//! SmolLM2's heads, and the greedy pick over a row of logits. `cargo bench --bench kernels`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use infgram::neural::native::attention::{attend, Heads, KvCache};
use infgram::neural::native::kernels::{matmul, Isa, QMatrix, QRows};
use infgram::neural::native::pool::Pool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;

/// `n` values in [−1, 1) from a seeded generator.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn products(c: &mut Criterion) {
    let cols = 576;
    let shapes = [
        (
            "ffn 1536x576 Q4_1",
            QMatrix::quantize_q4_1(1536, cols, &values(1536 * cols, 1)).unwrap(),
        ),
        (
            "output 49152x576 Q8_0",
            QMatrix::quantize_q8_0(49_152, cols, &values(49_152 * cols, 2)).unwrap(),
        ),
    ];
    let mut pool = Pool::new(1);
    for (name, w) in &shapes {
        let mut g = c.benchmark_group(*name);
        g.sample_size(10);
        for k in [1usize, 8] {
            let mut a = QRows::default();
            a.quantize(&values(k * cols, 3), cols);
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

/// Causal attention of 1 and 16 new rows after 256 cached positions (272 in all: the last
/// score block partly used), with SmolLM2's heads (9 query heads, 3 kv heads of 64) and with
/// Qwen2.5 0.5B's (14 query heads, 2 kv heads of 64: groups of seven, where attention takes
/// about a tenth of a 16-row pass), on every instruction set, each first checked to give the
/// scalar bits; 2 threads, as the passes run here. `cargo bench --bench kernels -- attention`
fn attention(c: &mut Criterion) {
    for (name, n_head, n_kv_head) in [("9x64 heads", 9, 3), ("14x64 heads, 2 kv", 14, 2)] {
        let heads = Heads {
            n_head,
            n_kv_head,
            head_dim: 64,
        };
        attention_of(c, &format!("attention {name} after 256"), &heads);
    }
}

fn attention_of(c: &mut Criterion, group: &str, heads: &Heads) {
    let kv = heads.n_kv_head * heads.head_dim;
    let mut pool = Pool::new(2);
    let mut g = c.benchmark_group(group);
    for rows in [1usize, 16] {
        let pos = 256;
        let mut cache = KvCache::new(heads.n_kv_head, heads.head_dim);
        let n = pos + rows;
        cache.append(&values(n * kv, 5), &values(n * kv, 6));
        let q = values(rows * heads.q_width(), 7);
        let mut want = vec![0.0; q.len()];
        let at = (pos, None);
        attend(
            Isa::Scalar,
            &mut pool,
            heads,
            &cache,
            &q,
            at,
            None,
            &mut want,
        );
        for isa in Isa::available() {
            let mut out = vec![0.0; q.len()];
            attend(isa, &mut pool, heads, &cache, &q, at, None, &mut out);
            assert_eq!(out, want, "{isa:?} gives the scalar bits");
            g.bench_with_input(BenchmarkId::new(format!("{isa:?}"), rows), &rows, |b, _| {
                b.iter(|| {
                    attend(
                        isa,
                        &mut pool,
                        heads,
                        black_box(&cache),
                        &q,
                        at,
                        None,
                        &mut out,
                    )
                })
            });
        }
    }
    g.finish();
}

/// The greedy pick over a row of logits (`lm::first_max`) against the one-pass loop it
/// replaced (the baseline of the same run), for SmolLM2's 49,152 and Gemma 3's 262,144 ids.
/// `cargo bench --bench kernels -- argmax`
fn argmax(c: &mut Criterion) {
    let one_pass = |v: &[f32]| {
        let mut best: Option<(u32, f32)> = None;
        for (i, &x) in v.iter().enumerate() {
            if x > best.map_or(f32::NEG_INFINITY, |b| b.1) {
                best = Some((i as u32, x));
            }
        }
        best.map(|b| b.0)
    };
    let mut g = c.benchmark_group("argmax");
    for vocab in [49_152usize, 262_144] {
        let row = values(vocab, 4);
        assert_eq!(infgram::lm::first_max(&row), one_pass(&row));
        g.throughput(Throughput::Elements(vocab as u64));
        g.bench_with_input(BenchmarkId::new("one pass", vocab), &row, |b, r| {
            b.iter(|| one_pass(black_box(r)))
        });
        g.bench_with_input(BenchmarkId::new("first_max", vocab), &row, |b, r| {
            b.iter(|| infgram::lm::first_max(black_box(r)))
        });
    }
    g.finish();
}

criterion_group!(benches, products, attention, argmax);
criterion_main!(benches);
