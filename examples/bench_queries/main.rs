//! Prints the speed table of issue 2 and 3 on Tiny Shakespeare (byte tokens, index in RAM /
//! warm page cache): µs per query for each query type, seconds to score val with SBIS, and
//! milliseconds to generate 1,000 characters; each against the reference figures of
//! DESIGN.md §7 and a naive baseline measured in the same run.
//!
//! `cargo run --release --example bench_queries [-- PATH_TO_tinyshakespeare.txt]`

use infgram::generate::eval::perplexity;
use infgram::generate::sampler::{Sampler, SamplerConfig};
use infgram::generate::{generate, Estimator, GenConfig};
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use infgram::Index;
use std::hint::black_box;
use std::time::Instant;

fn time_per<F: FnMut(usize)>(n: usize, mut f: F) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    t.elapsed().as_secs_f64() / n as f64
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "../shared/data/tinyshakespeare.txt".into());
    let text = std::fs::read_to_string(&path).expect("tinyshakespeare.txt");
    let cut = text.len() * 9 / 10;
    let tok = ByteTokenizer;
    let train = tok.encode(&text[..cut]).unwrap();
    let val = tok.encode(&text[cut..]).unwrap();
    let t = Instant::now();
    let index = Index::from_docs(tok.spec(), std::slice::from_ref(&train), 1, true).unwrap();
    let build = t.elapsed().as_secs_f64();
    println!("machine: {} cores; index of {} tokens built in {:.3} s (forward + reversed suffix arrays)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()), train.len(), build);

    // Queries cut from val (some occur in train, some do not), like real use.
    let n = 20_000;
    let starts: Vec<usize> = (0..n).map(|i| (i * 7919) % (val.len() - 200)).collect();
    let q = |i: usize, len: usize| &val[starts[i]..starts[i] + len];
    // Baseline: a linear scan of the corpus (what an index saves).
    let naive = time_per(20, |i| {
        let p = q(i, 10);
        black_box(train.windows(10).filter(|w| *w == p).count());
    });
    let count = time_per(n, |i| {
        black_box(index.count(q(i, 10)).unwrap());
    });
    let prob = time_per(n, |i| {
        black_box(index.prob(q(i, 4), q(i, 5)[4]).unwrap());
    });
    let ntd = time_per(n, |i| {
        black_box(index.ntd(q(i, 5)).unwrap());
    });
    let ntd1 = time_per(2000, |i| {
        black_box(index.ntd(q(i, 1)).unwrap());
    });
    let iprob = time_per(n, |i| {
        black_box(index.infgram_prob(q(i, 100), q(i, 101)[100]).unwrap());
    });
    let intd = time_per(n, |i| {
        black_box(index.infgram_ntd(q(i, 100)).unwrap());
    });
    let lm = time_per(200, |i| {
        black_box(index.longest_match(q(i, 100)).unwrap());
    });
    println!(
        "| query (Tiny Shakespeare train, warm) | infgram µs | infini-gram 2.6.0 µs | ratio |"
    );
    println!("|---|---:|---:|---:|");
    let row = |name: &str, ours: f64, theirs: Option<f64>| {
        let us = ours * 1e6;
        match theirs {
            Some(t) => println!("| {name} | {us:.2} | {t:.0} | {:.0}× |", t / us),
            None => println!("| {name} | {us:.2} | – | – |"),
        }
    };
    row("count (10 bytes)", count, Some(137.0));
    row("prob (4 + 1)", prob, Some(242.0));
    row("ntd (n = 5, exact)", ntd, Some(6769.0));
    row("ntd (n = 2, exact, ~40 next tokens)", ntd1, None);
    row("infgram_prob (ctx 100)", iprob, Some(1314.0));
    row("infgram_ntd (ctx 100)", intd, Some(2068.0));
    row("longest_match (100 tokens, all positions)", lm, None);
    row("baseline: linear scan count (10 bytes)", naive, None);
    println!();

    println!("| SBIS (seed protocol) | infgram | seed Go engine | ratio | ppl |");
    println!("|---|---:|---:|---:|---:|");
    for (k, seed_s) in [(3i64, 7.0), (5, 32.9), (-1, 116.0)] {
        let r = perplexity(
            &index,
            &val,
            &Estimator::Sbis { k, decay: 0.1 },
            100,
            Some(1e-10),
        )
        .unwrap();
        println!(
            "| score val, k = {k} | {:.3} s | {seed_s} s | {:.0}× | {:.2} |",
            r.seconds,
            seed_s / r.seconds,
            r.ppl
        );
    }
    for (k, seed_ms) in [(2i64, 67.0), (3, 74.0), (-1, 1169.0)] {
        let cfg = GenConfig {
            estimator: Estimator::Sbis { k, decay: 0.1 },
            context: 200,
            max_tokens: 1000,
        };
        let reps = 20;
        let mut total = 0.0;
        let mut made = 0;
        for s in 0..reps {
            let mut sampler = Sampler::new(
                SamplerConfig {
                    temperature: 0.8,
                    ..Default::default()
                },
                Some(s),
            );
            let prompt = tok.encode("ROMEO:").unwrap();
            let t = Instant::now();
            // Generation stops at a document end; restart until 1,000 characters are made.
            let mut got = 0;
            while got < 1000 {
                let g = generate(
                    &index,
                    &prompt,
                    &GenConfig {
                        max_tokens: 1000 - got,
                        ..cfg.clone()
                    },
                    &mut sampler,
                    |_| {},
                )
                .unwrap();
                got += g.tokens.len().max(1);
            }
            total += t.elapsed().as_secs_f64();
            made += got;
        }
        let ms = total / reps as f64 * 1000.0 * 1000.0 / (made as f64 / reps as f64);
        println!(
            "| generate 1,000 chars, k = {k}, T = 0.8 | {ms:.3} ms | {seed_ms} ms | {:.0}× | |",
            seed_ms / ms
        );
    }
}
