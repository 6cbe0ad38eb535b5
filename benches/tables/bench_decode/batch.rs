//! Several generations at once on one model (`lm::batch`): aggregate tokens per second of
//! N clients each decoding its own prompt greedily, their passes shared through a `Batcher`,
//! against one client; plain and speculative (prompt lookup). The prompts are the prompt
//! sets' (a chat's through the model's chat template), the copy/edit set first. Every
//! client's tokens are checked against the same prompt decoded alone on a model of its own.
//!
//! `cargo run --release --example bench_decode -- batch --model qwen2.5-coder-0.5b [--device cuda]`

use infgram::decode::drafters::PromptLookup;
use infgram::decode::{decode, DecodeConfig, Drafter, Sampler};
use infgram::lm::batch::Batcher;
use infgram::lm::LanguageModel;
use infgram::service::models::{load_model, Device, ModelOptions};
use infgram::tokenizer::chat::{encode_chat, Message};
use infgram::tokenizer::Tokenizer;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Greedy decoding of `max_tokens` after `prompt`, drafting with prompt lookup when
/// `speculative`.
fn generate(
    m: &mut dyn LanguageModel,
    prompt: &[u32],
    max_tokens: usize,
    speculative: bool,
) -> Vec<u32> {
    let cfg = DecodeConfig {
        max_tokens,
        ..DecodeConfig::default()
    };
    let mut drafters: Vec<Box<dyn Drafter>> = match speculative {
        true => vec![Box::new(PromptLookup::new(8))],
        false => Vec::new(),
    };
    let mut sampler = Sampler::greedy();
    decode(
        m,
        &mut drafters,
        &mut [],
        &mut sampler,
        prompt,
        &cfg,
        |_| {},
    )
    .expect("a generation")
    .0
}

/// Runs the table for `clients` counts of `threads`-thread passes on `device`.
pub fn run(model: &str, device: Device, clients: &[usize], max_tokens: usize, threads: usize) {
    let opts = ModelOptions {
        threads,
        device,
        ..ModelOptions::default()
    };
    let loaded = load_model(model, &opts).expect("the model");
    let mut solo = load_model(model, &opts).expect("the model").model;
    let tok = &loaded.tokenizer;
    let most = clients.iter().copied().max().unwrap_or(1);
    // The prompt sets' texts, a chat's through the model's chat template.
    let texts: Vec<(String, bool)> = super::prompts::sets()
        .into_iter()
        .flat_map(|set| set.prompts.into_iter().map(move |p| (p, set.chat)))
        .collect();
    let prompts: Vec<Vec<u32>> = (0..most)
        .map(|i| match &texts[i % texts.len()] {
            (text, true) => encode_chat(tok, &[Message::new("user", text)], false),
            (text, false) => tok.encode(text),
        })
        .collect::<infgram::Result<_>>()
        .expect("the prompts");
    let batcher = Batcher::start(loaded.model).expect("a batching model");
    // Every run reads its prompts whole: kept caches of the earlier runs' prompts would
    // spare the later runs their prompts (scripts/chat-turns.py measures what they spare).
    batcher.keep_prompts(0).expect("the batcher");
    println!(
        "{model} on {device:?}, {threads} threads, greedy, {max_tokens} tokens a client, a prompt each\n\n\
         | decoding | clients | tokens | seconds | aggregate tokens/s | x one client | mean batch | as alone |\n\
         |---|---:|---:|---:|---:|---:|---:|---|"
    );
    for speculative in [false, true] {
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| generate(solo.as_mut(), p, max_tokens, speculative))
            .collect();
        let mut one = None;
        for &n in clients {
            let (passes, seqs) = (
                batcher.stats().passes.load(Relaxed),
                batcher.stats().sequences.load(Relaxed),
            );
            let t = Instant::now();
            let outs: Vec<Vec<u32>> = std::thread::scope(|s| {
                let handles: Vec<_> = prompts[..n]
                    .iter()
                    .map(|p| {
                        let mut m = batcher.sequence().expect("a sequence");
                        s.spawn(move || generate(&mut m, p, max_tokens, speculative))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a client"))
                    .collect()
            });
            let seconds = t.elapsed().as_secs_f64();
            let tokens: usize = outs.iter().map(Vec::len).sum();
            let rate = tokens as f64 / seconds;
            let one_rate = *one.get_or_insert(rate);
            let passes = batcher.stats().passes.load(Relaxed) - passes;
            let seqs = batcher.stats().sequences.load(Relaxed) - seqs;
            let same = outs.iter().zip(&alone).all(|(a, b)| a == b);
            println!(
                "| {} | {n} | {tokens} | {seconds:.2} | {rate:.1} | {:.2} | {:.2} | {} |",
                if speculative { "speculative" } else { "plain" },
                rate / one_rate,
                seqs as f64 / passes.max(1) as f64,
                if same { "yes" } else { "NO" }
            );
        }
    }
}
