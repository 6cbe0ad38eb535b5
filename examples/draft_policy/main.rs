//! Compares drafting policies without timing noise: greedy speculative decoding of
//! `bench_speculative`'s prompt sets with the cost table frozen (`CostModel::frozen`), so every
//! run makes the same passes, and each output's speed-up modeled as its tokens over the summed
//! table cost of its passes (a plain step costs 1). Prints, per set, the geometric mean and
//! each prompt's modeled speed-up (passes in brackets), for drafts planned with and without the
//! current run's evidence (`DecodeConfig::local_evidence`), and the ceiling of the same
//! drafters: each output replayed with every draft cut to exactly the prefix the model accepts
//! (the best drafter's, at most 16 tokens; no token wasted, none missed), which no policy that
//! does not know the output can beat.
//!
//! Wall-clock ratios on these machines move by ±0.1× between runs of the same build, as much as
//! the effects being tuned; this count does not move. It leaves out what a pass costs beyond the
//! table (drafting, sampling), so it reads a little above `bench_speculative`'s timed ratios.
//!
//! `cargo run --release --example draft_policy` (about a minute on 2 cores)

#[path = "../bench_speculative/prompts.rs"]
mod prompts;

use infgram::decode::drafters::{CorpusDrafter, PromptLookup};
use infgram::decode::{greedy, CostModel, DecodeConfig, Drafter};
use infgram::neural::chat_prompt;
use infgram::neural::llama::Llama;
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use prompts::SETS;
use std::sync::Arc;

fn main() {
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch the model");
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let index_dir = infgram::service::cached_index(&[], &tok)
        .expect("the Shakespeare index in the model's tokens");
    let index = Arc::new(infgram::Index::open(&index_dir).unwrap());
    let mut model = Llama::from_gguf(&path).unwrap().with_threads(2);
    let cost = CostModel::default().frozen();
    let new_drafters = || -> Vec<Box<dyn Drafter>> {
        vec![
            Box::new(PromptLookup::new(8)),
            Box::new(CorpusDrafter::new(index.clone())),
        ]
    };
    println!("| prompt set | drafting | modeled speed-up, geomean | per prompt (passes) |");
    println!("|---|---|---:|---|");
    for (name, prompts, chat) in SETS {
        let mut outputs = Vec::new();
        for (policy, local) in [("run-wide calibration", false), ("+ local evidence", true)] {
            let mut log_sum = 0.0;
            let mut each = Vec::new();
            outputs.clear();
            for p in prompts {
                let text = if chat { chat_prompt(p) } else { p.to_string() };
                let prompt = tok.encode(&text).unwrap();
                let mut drafters = new_drafters();
                let cfg = DecodeConfig {
                    max_tokens: 256,
                    trace: true,
                    local_evidence: local,
                    cost: cost.clone(),
                    ..DecodeConfig::default()
                };
                let (ids, stats) = greedy(&mut model, &mut drafters, &prompt, &cfg).unwrap();
                let modeled: f64 = stats.trace.iter().map(|t| cost.cost(t.drafted + 1)).sum();
                let speed = ids.len() as f64 / modeled;
                log_sum += speed.ln();
                each.push(format!("{speed:.2} ({})", stats.trace.len()));
                outputs.push((prompt, ids));
            }
            let geomean = (log_sum / prompts.len() as f64).exp();
            println!(
                "| {name} | {policy} | {geomean:.3}× | {} |",
                each.join(", ")
            );
        }
        let mut log_sum = 0.0;
        let mut each = Vec::new();
        for (prompt, ids) in &outputs {
            let (modeled, passes) = ceiling(&mut new_drafters(), &cost, prompt, ids);
            let speed = ids.len() as f64 / modeled;
            log_sum += speed.ln();
            each.push(format!("{speed:.2} ({passes})"));
        }
        let geomean = (log_sum / outputs.len() as f64).exp();
        println!(
            "| {name} | ceiling: drafts cut where the model leaves them | {geomean:.3}× | {} |",
            each.join(", ")
        );
    }
}

/// The table cost and passes of writing `output` after `prompt` when each pass drafts exactly
/// the longest prefix of `output` that one of `drafters` proposes (at most 16 tokens).
fn ceiling(
    drafters: &mut [Box<dyn Drafter>],
    cost: &CostModel,
    prompt: &[u32],
    output: &[u32],
) -> (f64, usize) {
    let mut context = prompt.to_vec();
    let (mut at, mut modeled, mut passes) = (0, 0.0, 0);
    while at < output.len() {
        let max = 16.min(output.len() - at - 1);
        let mut right = 0;
        for d in drafters.iter_mut() {
            let draft = d.propose(&context, max).unwrap();
            let agree = draft.tokens.iter().zip(&output[at..]);
            right = right.max(agree.take_while(|(x, y)| x == y).count().min(max));
        }
        modeled += cost.cost(right + 1);
        passes += 1;
        context.extend_from_slice(&output[at..at + right + 1]);
        at += right + 1;
        for d in drafters.iter_mut() {
            d.observe(&context);
        }
    }
    (modeled, passes)
}
