//! Prints the engine's speed tables on Tiny Shakespeare (byte tokens, index in RAM): µs per
//! query for each query type, seconds to score val with SBIS, and milliseconds to generate
//! 1,000 characters; each beside the published reference figures (infini-gram 2.6.0's engine
//! and tiny-infini-gram's Go engine, measured on this machine class; see `BENCHMARKS.md`) and a
//! baseline measured in the same run (a linear scan for queries; for generation, the same decode
//! loop fed dense rows, as it was before scorers could return sparse ones).
//!
//! `cargo run --release --example bench_queries [-- PATH_TO_A_TEXT]` (default: the in-tree Tiny
//! Shakespeare)

use infgram::decode::{decode, DecodeConfig, Sampler, SamplerConfig};
use infgram::eval::perplexity;
use infgram::index::shards::Shards;
use infgram::lm::DenseRows;
use infgram::ngram::{Estimator, InfgramModel};
use infgram::service::{generate_from_corpus, GenConfig};
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use infgram::Index;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

/// Milliseconds per 1,000 generated characters over `reps` seeded runs (T = 0.8, prompt
/// "ROMEO:"); generation stops at a document end, so each run restarts until 1,000 are made.
/// Returns (mean, min, max, first) over the runs.
fn generation_ms(
    reps: u64,
    mut run: impl FnMut(&mut Sampler, usize) -> usize,
) -> (f64, f64, f64, f64) {
    let mut per_run = Vec::new();
    for s in 0..reps {
        let mut sampler = Sampler::new(
            SamplerConfig {
                temperature: 0.8,
                ..Default::default()
            },
            Some(s),
        );
        let t = Instant::now();
        let mut got = 0;
        while got < 1000 {
            got += run(&mut sampler, 1000 - got).max(1);
        }
        per_run.push(t.elapsed().as_secs_f64() * 1000.0 * 1000.0 / got as f64);
    }
    let mean = per_run.iter().sum::<f64>() / per_run.len() as f64;
    let min = per_run.iter().copied().fold(f64::INFINITY, f64::min);
    let max = per_run.iter().copied().fold(0.0, f64::max);
    (mean, min, max, per_run[0])
}

fn time_per<F: FnMut(usize)>(n: usize, mut f: F) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    t.elapsed().as_secs_f64() / n as f64
}

/// Queries, scoring and generation on Tiny Shakespeare (or another text).
#[derive(clap::Parser)]
struct Args {
    /// A UTF-8 text to use instead of Tiny Shakespeare (train = its first 90%).
    text: Option<std::path::PathBuf>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let text = match &args.text {
        Some(path) => std::fs::read_to_string(path).expect("a UTF-8 text file"),
        None => infgram::assets::tiny_shakespeare().expect("the in-tree Tiny Shakespeare"),
    };
    let cut = text.len() * 9 / 10;
    let tok = ByteTokenizer;
    let train = tok.encode(&text[..cut]).unwrap();
    let val = tok.encode(&text[cut..]).unwrap();
    let t = Instant::now();
    let index =
        Arc::new(Index::from_docs(tok.spec(), std::slice::from_ref(&train), 1, true).unwrap());
    let build = t.elapsed().as_secs_f64();
    println!("machine: {} cores; index of {} tokens built in {:.3} s (forward + reversed suffix arrays)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()), train.len(), build);

    query_table(&index, &train, &val);
    sbis_tables(&index, &val);
}

/// Each query type on 20,000 queries cut from val, beside infini-gram's figures and a linear
/// scan.
fn query_table(index: &Index<Vec<u8>>, train: &[u32], val: &[u32]) {
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
        black_box(index.ntd(q(i, 5), None).unwrap());
    });
    let ntd1 = time_per(2000, |i| {
        black_box(index.ntd(q(i, 1), None).unwrap());
    });
    let iprob = time_per(n, |i| {
        black_box(index.infgram_prob(q(i, 100), q(i, 101)[100]).unwrap());
    });
    let intd = time_per(n, |i| {
        black_box(index.infgram_ntd(q(i, 100), None).unwrap());
    });
    let lm = time_per(200, |i| {
        black_box(index.longest_match(q(i, 100)).unwrap());
    });
    // A text the corpus holds whole (20,000 tokens of train): one match as long as the text,
    // where finding each position's span afresh takes time quadratic in the length.
    let copied = &train[100_000..120_000];
    let lm_copied = time_per(3, |_| {
        black_box(index.longest_match(copied).unwrap());
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
    row("longest_match (20,000 tokens found whole)", lm_copied, None);
    row("baseline: linear scan count (10 bytes)", naive, None);
    println!();
}

/// SBIS scoring of val under the tiny-infini-gram protocol, and generation of 1,000 characters
/// against the same loop with dense rows.
fn sbis_tables(index: &Arc<Index<Vec<u8>>>, val: &[u32]) {
    let tok = ByteTokenizer;
    println!(
        "| SBIS (tiny-infini-gram protocol) | infgram | tiny-infini-gram Go engine | ratio | ppl |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (k, seed_s) in [(3i64, 7.0), (5, 32.9), (-1, 116.0)] {
        let r = perplexity(
            index,
            val,
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
    println!();
    println!("| generate 1,000 chars, T = 0.8 | infgram ms (min–max) | first run, empty counts cache | dense rows, same run | tiny-infini-gram Go engine | vs Go |");
    println!("|---|---:|---:|---:|---:|---:|");
    let prompt = tok.encode("ROMEO:").unwrap();
    for (k, seed_ms) in [(2i64, 67.0), (3, 74.0), (-1, 1169.0)] {
        let cfg = GenConfig {
            cancel: None,
            estimator: Estimator::Sbis { k, decay: 0.1 },
            context: 200,
            max_tokens: 1000,
            guard: None,
        };
        let reps = 20;
        // The index's counts cache is shared by the runs, as by a server's generations: the
        // first run starts with it empty, as a single `infgram gen` does.
        index.counts_cache().clear();
        let sparse = generation_ms(reps, |sampler, budget| {
            let cfg = GenConfig {
                max_tokens: budget,
                ..cfg.clone()
            };
            generate_from_corpus(index.clone(), &prompt, &cfg, sampler, |_| {})
                .unwrap()
                .tokens
                .len()
        });
        // The baseline: the same model and loop, rows made dense.
        let dense = generation_ms(reps, |sampler, budget| {
            let model =
                InfgramModel::new(index.clone(), cfg.estimator.clone(), cfg.context).unwrap();
            let mut fed = vec![index.separator()];
            fed.extend_from_slice(&prompt);
            let dcfg = DecodeConfig {
                max_tokens: budget,
                ..Default::default()
            };
            decode(
                &mut DenseRows(model),
                &mut [],
                &mut [],
                sampler,
                &fed,
                &dcfg,
                |_| {},
            )
            .unwrap()
            .0
            .len()
        });
        println!(
            "| k = {k} | {:.2} ({:.2}–{:.2}) | {:.2} | {:.2} ({:.1}× slower) | {seed_ms} | {:.0}× |",
            sparse.0, sparse.1, sparse.2, sparse.3, dense.0, dense.0 / sparse.0, seed_ms / sparse.0
        );
    }
}
