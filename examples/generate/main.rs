//! Library use, part 4: generate with a neural model, drafting from an index.
//!
//! Loads a model by short name or GGUF path (`smollm2-135m`, fetched on first use), indexes a
//! small corpus in the model's tokens (a few lines written to a temporary folder), and
//! generates greedily with speculative decoding: the prompt, past outputs and the index draft
//! tokens, the model verifies each draft in one pass. `compare` also decodes without drafts and
//! reports both speeds and whether the outputs are the same tokens (they must be).
//!
//! `cargo run --release --example generate [-- --model qwen2.5-coder-0.5b]`

use infgram::index::pipeline::{build_index, BuildOptions};
use infgram::service::models::{load_model, ModelOptions};
use infgram::service::request::{defaults, GenLimits, GenerateRequest, Prompt, Sampling, Scorer};
use infgram::service::run::ModelIndex;
use infgram::service::{generate, Index, Resources, RunOptions};
use std::sync::Arc;

/// The corpus the index drafts from: what the answer is likely to repeat.
const CORPUS: &str = "The quick brown fox jumps over the lazy dog. The lazy dog sleeps in the sun.
def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n
The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.\n";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().skip_while(|a| *a != "--model").nth(1);
    let spec = spec.map_or("smollm2-135m", String::as_str);
    let mut loaded = load_model(spec, &ModelOptions::default())?;
    let costs = loaded.pass_costs(); // what a pass costs here: how long a draft pays

    // The index: the corpus in the model's tokens, built in a temporary folder.
    let dir = tempfile::tempdir()?;
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, CORPUS)?;
    let out = dir.path().join("index");
    build_index(&[corpus], &out, &loaded.tokenizer, &BuildOptions::default())?;
    let index = ModelIndex::check(Arc::new(Index::open(&out)?), &loaded.tokenizer, false)?;

    let request = GenerateRequest {
        prompt: Prompt::Text("def fibonacci(n):\n".into()),
        scorer: Scorer::Model,
        drafters: defaults::SPECULATIVE_DRAFTERS.to_vec(),
        sampling: Sampling {
            temperature: Some(0.0), // greedy: speculative decoding gives plain decoding's tokens
            ..Default::default()
        },
        limits: GenLimits {
            max_tokens: Some(48),
            ..Default::default()
        },
        ..Default::default()
    }
    .check(defaults::MAX_TOKENS)?;
    let name = loaded.path.display().to_string();
    let tok = &loaded.tokenizer;
    let mut resources = Resources::model(loaded.model.as_mut(), tok, name)
        .drafting_index(Some(index), None)
        .pass_costs(costs);
    let options = RunOptions {
        compare: true,
        ..Default::default()
    };
    let report = generate(&request, &mut resources, &options, |_| {})?;

    println!("{}", report.text);
    let stats = report.stats.unwrap_or_default();
    println!(
        "\n{} tokens in {} passes ({} drafted, {} accepted): {:.1} tokens/s",
        report.tokens, stats.passes, stats.drafted, stats.accepted, report.tokens_per_second
    );
    if let Some(c) = report.comparison {
        let (speedup, same) = (c.speedup.unwrap_or(f64::NAN), c.identical == Some(true));
        println!("{speedup:.2}x plain decoding's speed; the same tokens: {same}");
        anyhow::ensure!(same, "speculative decoding changed the output");
    }
    Ok(())
}
