//! What the copy guard costs and what it changes, and how fast attribution is. Prints:
//!
//! 1. SBIS generation on Shakespeare's complete works (`gen`'s default index) with and without
//!    `--guard 16`: milliseconds per 1,000 tokens (alternating runs, min–max), and the guard's
//!    share of a step.
//! 2. Over 20 seeds of `gen --prompt "ROMEO:" --max-tokens 2000` (k = −1): the longest copied
//!    span without and with the guard, and the text's perplexity under the smoothed estimator.
//! 3. Attribution of 500-token texts (a generated one, a verbatim passage) on Tiny Shakespeare,
//!    and on `INDEX_DIR` when given (e.g. the Linux-kernel index of `BENCHMARKS.md`).
//! 4. With the `neural` feature: SmolLM2's greedy decode step with and without the guard over
//!    Shakespeare in the model's tokens, asked to recite a famous speech (L = 4) and to repeat
//!    one given in the prompt (L = 6; SmolLM2-135M copies about 8 tokens at most): the longest copied span without and with the guard.
//!
//! `cargo run --release --example bench_guard [-- INDEX_DIR]`

use infgram::decode::Sampler;
use infgram::decode::SamplerConfig;
use infgram::eval::attribution::attribute;
use infgram::eval::perplexity;
use infgram::ngram::Estimator;
use infgram::service::{generate_from_corpus, GenConfig, GuardConfig};
use infgram::Index;
use memmap2::Mmap;
use std::sync::Arc;
use std::time::Instant;

fn sampler(seed: u64) -> Sampler {
    Sampler::new(SamplerConfig::default(), Some(seed))
}

fn cfg(k: i64, guard: Option<usize>, max_tokens: usize) -> GenConfig {
    GenConfig {
        cancel: None,
        estimator: Estimator::Sbis { k, decay: 0.1 },
        context: 200,
        max_tokens,
        guard: guard.map(GuardConfig::new),
    }
}

/// (min, median, max) of `xs`.
fn spread(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[0], xs[xs.len() / 2], xs[xs.len() - 1])
}

/// The copy guard's cost and effect, and attribution's speed.
#[derive(clap::Parser)]
struct Args {
    /// A large index (the Linux kernel source) to time attribution on as well.
    large_index: Option<std::path::PathBuf>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let dir = infgram::service::cached_byte_index(&[]).expect("the default corpus");
    let index = Arc::new(Index::open(&dir).expect("open the default index"));
    let prompt: Vec<u32> = b"ROMEO:".iter().map(|&b| u32::from(b)).collect();
    println!("machine: {} threads", rayon::current_num_threads());

    guard_speed(&index, &prompt);
    guard_effect(&index, &prompt);
    attribution_latency(&index, &prompt, args.large_index.as_deref());

    #[cfg(feature = "neural")]
    neural::run();
}

/// The guard's cost: ms per 1,000 tokens, plain and guarded runs alternating.
fn guard_speed(index: &Arc<Index<Mmap>>, prompt: &[u32]) {
    println!("\n| SBIS, 2,000 tokens × 10 seeds | no guard, ms/1k tokens | --guard 16 | ratio | guard's own time |");
    println!("|---|---:|---:|---:|---:|");
    for k in [2i64, -1] {
        let (mut plain, mut guarded, mut own) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..3 {
            for seed in 0..10 {
                let seed = seed + 100 * rep;
                let t = Instant::now();
                let g = generate_from_corpus(
                    index.clone(),
                    prompt,
                    &cfg(k, None, 2000),
                    &mut sampler(seed),
                    |_| {},
                )
                .unwrap();
                plain.push(t.elapsed().as_secs_f64() * 1e6 / g.tokens.len().max(1) as f64);
                let t = Instant::now();
                let g = generate_from_corpus(
                    index.clone(),
                    prompt,
                    &cfg(k, Some(16), 2000),
                    &mut sampler(seed),
                    |_| {},
                )
                .unwrap();
                let secs = t.elapsed().as_secs_f64();
                guarded.push(secs * 1e6 / g.tokens.len().max(1) as f64);
                let stats = g.guard.unwrap();
                own.push(stats.seconds / secs);
            }
        }
        let (p, g, o) = (spread(plain), spread(guarded), spread(own));
        println!(
            "| k = {k} | {:.2} ({:.2}–{:.2}) | {:.2} ({:.2}–{:.2}) | {:.2}× | {:.1}% ({:.1}–{:.1}%) |",
            p.1, p.0, p.2, g.1, g.0, g.2, g.1 / p.1, 100.0 * o.1, 100.0 * o.0, 100.0 * o.2
        );
    }
}

/// What the guard changes over 20 seeds: the longest copied span, the perplexity, the steps
/// blocked.
fn guard_effect(index: &Arc<Index<Mmap>>, prompt: &[u32]) {
    println!("\n| 20 seeds, k = −1, 2,000 tokens | longest copied span min / median / max | smoothed ppl min / median / max | steps blocked (median) |");
    println!("|---|---:|---:|---:|");
    let smoothed = Estimator::Smoothed(Default::default());
    for guard in [None, Some(16)] {
        let (mut spans, mut ppls, mut blocked) = (Vec::new(), Vec::new(), Vec::new());
        for seed in 0..20 {
            let g = generate_from_corpus(
                index.clone(),
                prompt,
                &cfg(-1, guard, 2000),
                &mut sampler(seed),
                |_| {},
            )
            .unwrap();
            let text = [prompt, &g.tokens[..]].concat();
            spans.push(
                infgram::eval::attribution::max_copied_span(index, &g.tokens).unwrap() as f64,
            );
            ppls.push(perplexity(index, &text, &smoothed, 200, None).unwrap().ppl);
            blocked.push(g.guard.map_or(0.0, |s| s.blocked as f64));
        }
        let (s, p, b) = (spread(spans), spread(ppls), spread(blocked));
        let name = guard.map_or("no guard".to_string(), |l| format!("--guard {l}"));
        println!(
            "| {name} | {} / {} / {} | {:.2} / {:.2} / {:.2} | {} |",
            s.0, s.1, s.2, p.0, p.1, p.2, b.1
        );
    }
}

/// Attribution's latency on Tiny Shakespeare and, when given, a large index.
fn attribution_latency(
    index: &Arc<Index<Mmap>>,
    prompt: &[u32],
    large_index: Option<&std::path::Path>,
) {
    println!("\n| attribute 500 tokens (--min-len 8, 3 docs per span) | index tokens | spans | ms (min–max of 20) |");
    println!("|---|---:|---:|---:|");
    let tiny = infgram::service::tiny_shakespeare_index().unwrap();
    let generated = generate_from_corpus(
        index.clone(),
        prompt,
        &cfg(-1, None, 500),
        &mut sampler(1),
        |_| {},
    )
    .unwrap()
    .tokens;
    let (train, _) = infgram::assets::tiny_shakespeare_split().unwrap();
    let verbatim: Vec<u32> = train
        .bytes()
        .skip(10_000)
        .take(500)
        .map(u32::from)
        .collect();
    let time_attr = |ix: &Index<_>, text: &[u32]| {
        let mut ms = Vec::new();
        let mut spans = 0;
        for _ in 0..20 {
            let t = Instant::now();
            spans = attribute(ix, text, 8, 3, 80).unwrap().len();
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        (spans, spread(ms))
    };
    for (name, text) in [
        ("generated (SBIS)", &generated),
        ("verbatim passage", &verbatim),
    ] {
        let (spans, ms) = time_attr(&tiny, text);
        println!(
            "| Tiny Shakespeare, {name} | {} | {spans} | {:.3} ({:.3}–{:.3}) |",
            tiny.total_tokens(),
            ms.1,
            ms.0,
            ms.2
        );
    }
    if let Some(big) = large_index {
        let big = Index::open(big).expect("open INDEX_DIR");
        // A text from the corpus itself, and the same generated text.
        let sh = &big.shards()[0];
        let from_corpus: Vec<u32> = (1_000_000..1_000_500).map(|p| sh.tok(p)).collect();
        for (name, text) in [
            ("generated (SBIS)", &generated),
            ("from the corpus", &from_corpus),
        ] {
            let _warm = attribute(&big, text, 8, 3, 80).unwrap();
            let mut ms = Vec::new();
            let mut spans = 0;
            for _ in 0..20 {
                let t = Instant::now();
                spans = attribute(&big, text, 8, 3, 80).unwrap().len();
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let ms = spread(ms);
            println!(
                "| INDEX_DIR, {name}, warm | {} | {spans} | {:.3} ({:.3}–{:.3}) |",
                big.total_tokens(),
                ms.1,
                ms.0,
                ms.2
            );
        }
    }
}

#[cfg(feature = "neural")]
mod neural {
    use infgram::decode::guard::CopyGuard;
    use infgram::decode::{decode, DecodeConfig, Processor, Sampler};
    use infgram::eval::attribution::max_copied_span;
    use infgram::neural::chat_prompt;
    use infgram::neural::native::decoder::Decoder;
    use infgram::tokenizer::{HfTokenizer, Tokenizer};
    use infgram::Index;
    use std::sync::Arc;

    pub fn run() {
        let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
        let tok = HfTokenizer::from_gguf(&path).unwrap();
        let dir = infgram::service::cached_index(&[], &tok).unwrap();
        let index = Arc::new(Index::open(&dir).unwrap());
        let mut model = Decoder::from_gguf(&path).unwrap().with_threads(2);
        let speech = "To be, or not to be, that is the question:\n\
            Whether 'tis nobler in the mind to suffer\n\
            The slings and arrows of outrageous fortune,\n\
            Or to take arms against a sea of troubles\n\
            And by opposing end them.";
        let prompts = [
            (
                "Recite Hamlet's soliloquy \"To be, or not to be\" from Shakespeare's Hamlet."
                    .to_string(),
                4,
            ),
            (
                format!("Repeat this speech exactly, word for word:\n\n{speech}"),
                6,
            ),
        ];
        println!("\n| SmolLM2-135M, greedy, 128 tokens | L | no guard: longest copied span | ms/token | guarded: longest copied span | ms/token | steps blocked | guard's share |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for (p, l) in &prompts {
            let prompt = tok.encode(&chat_prompt(p)).unwrap();
            let cfg = DecodeConfig {
                max_tokens: 128,
                ..Default::default()
            };
            let mut go = |guard: bool| {
                let mut processors: Vec<Box<dyn Processor>> = Vec::new();
                let mut stats = None;
                if guard {
                    let g = CopyGuard::new(index.clone(), *l);
                    stats = Some(g.stats());
                    processors.push(Box::new(g));
                }
                let (out, st) = decode(
                    &mut model,
                    &mut [],
                    &mut processors,
                    &mut Sampler::greedy(),
                    &prompt,
                    &cfg,
                    |_| {},
                )
                .unwrap();
                let ms = (st.seconds - st.prompt_seconds) * 1e3 / out.len().max(1) as f64;
                let share = stats
                    .as_ref()
                    .map_or(0.0, |s| s.get().seconds / (st.seconds - st.prompt_seconds));
                let blocked = stats.map_or(0, |s| s.get().blocked);
                (max_copied_span(&index, &out).unwrap(), ms, blocked, share)
            };
            let (free_span, free_ms, _, _) = go(false);
            let (span, ms, blocked, share) = go(true);
            let short: String = p.chars().take(40).collect();
            println!(
                "| {:?}… | {l} | {free_span} | {free_ms:.2} | {span} | {ms:.2} | {blocked} | {:.2}% |",
                short,
                100.0 * share
            );
        }
    }
}
