//! Speculative decoding benchmark (issue #5): three prompt sets of five prompts, 256 new tokens,
//! greedy, SmolLM2-135M (native kernels, 2 threads). For each prompt: plain decoding, then
//! speculative decoding with the live prompt index and an index of Shakespeare's complete works
//! in the model's tokens drafting; the outputs must be identical. Prints one table.
//!
//! `cargo run --release --example bench_speculative` (builds the Shakespeare index into the cache
//! on first use).

use infgram::decode::drafters::{CorpusDrafter, CorpusRule, PromptLookup};
use infgram::decode::{greedy, DecodeConfig, DecodeStats, Drafter};
use infgram::neural::chat_prompt;
use infgram::neural::llama::Llama;
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use std::path::Path;

const GROUNDED: [&str; 5] = [
    "Copy the following paragraph exactly, then stop.\n\nThe committee met on Tuesday to review the budget for the coming year. After a long discussion, the members agreed to increase funding for the public library, to repair the roads in the northern district, and to hire two new teachers for the primary school. The mayor thanked everyone for their patience and closed the meeting at nine o'clock.",
    "Rewrite this list with every item on its own line, keeping the words unchanged: apples, oranges, bananas, grapes, pears, plums, cherries, lemons, limes, peaches, apricots, mangoes, melons, kiwis, figs.",
    "Repeat this function exactly:\n\ndef fibonacci(n):\n    if n < 2:\n        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n    return b\n\ndef factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
    "Correct the spelling in this text and otherwise keep it the same: The quik brown fox jumpd over the lazy dog. The dog was not amused and barkd at the fox, who ran away into the forrest. Later that day, the fox came back with his freinds to play in the feild.",
    "Here is a short story. Copy it word for word.\n\nOnce upon a time, in a small village by the sea, there lived a fisherman named Tom. Every morning he sailed out before sunrise and came back at noon with a basket full of fish. One day he caught a golden fish that could speak. The fish begged to be set free, and Tom let it go.",
];

const SHAKESPEARE: [&str; 5] = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "Friends, Romans, countrymen, lend me your ears;\nI come to bury Caesar, not to praise him.\n",
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n",
    "All the world's a stage,\nAnd all the men and women merely players;\n",
    "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;\n",
];

const OPEN: [&str; 5] = [
    "What are three good habits for staying healthy?",
    "Explain how a bicycle works to a child.",
    "Give me some ideas for a birthday party.",
    "Why is the sky blue?",
    "Write a short poem about autumn leaves.",
];

#[derive(Default)]
struct Row {
    plain_tps: f64,
    spec_tps: f64,
    ratios: Vec<f64>,
    drafted: usize,
    accepted: usize,
    drafted_passes: usize,
    identical: usize,
    prompts: usize,
}

impl Row {
    fn add(&mut self, plain: &DecodeStats, spec: &DecodeStats, identical: bool) {
        self.plain_tps += plain.tokens_per_second();
        self.spec_tps += spec.tokens_per_second();
        self.ratios
            .push(spec.tokens_per_second() / plain.tokens_per_second());
        self.drafted += spec.drafted;
        self.accepted += spec.accepted;
        self.drafted_passes += spec.drafted_passes;
        self.identical += identical as usize;
        self.prompts += 1;
    }
}

/// How often the drafters' first and second candidates for the next token are the model's
/// token: the most a width-2 tree root could add over a chain.
#[derive(Default)]
struct TreeRoot {
    positions: usize,
    with_candidate: usize,
    first_right: usize,
    only_second_right: usize,
    /// Positions where the corpus index matches a suffix of at least two tokens, and how often
    /// its most frequent continuation and the SBIS argmax are the model's token there.
    corpus_positions: usize,
    most_frequent_right: usize,
    sbis_right: usize,
}

impl TreeRoot {
    fn add(&mut self, prompt: &[u32], output: &[u32], index_dir: &Path) {
        let mut prompt_lookup = PromptLookup::new(8);
        let mut corpus = CorpusDrafter::new(std::sync::Arc::new(
            infgram::Index::open(index_dir).unwrap(),
        ));
        let mut frequent = CorpusDrafter::with_rule(
            std::sync::Arc::new(infgram::Index::open(index_dir).unwrap()),
            CorpusRule::MostFrequent,
        );
        let mut context = prompt.to_vec();
        for &want in output {
            let mut candidates = prompt_lookup.alternatives(&context, 2).unwrap();
            if candidates.is_empty() {
                candidates = corpus.alternatives(&context, 2).unwrap();
            }
            self.positions += 1;
            let most_frequent = frequent.alternatives(&context, 1).unwrap();
            if let Some(&(most_frequent, _)) = most_frequent.first() {
                // The two corpus rules over the same context (the same matches: ≥ 2 tokens).
                let sbis = corpus.alternatives(&context, 1).unwrap();
                self.corpus_positions += 1;
                self.most_frequent_right += (most_frequent == want) as usize;
                self.sbis_right += sbis.first().is_some_and(|c| c.0 == want) as usize;
            }
            if let Some(first) = candidates.first() {
                self.with_candidate += 1;
                if first.0 == want {
                    self.first_right += 1;
                } else if candidates.get(1).is_some_and(|c| c.0 == want) {
                    self.only_second_right += 1;
                }
            }
            context.push(want);
        }
    }
}

fn main() {
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch the model");
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let index_dir = infgram::service::cached_index(&[], &tok)
        .expect("the Shakespeare index in the model's tokens");
    let mut model = Llama::from_gguf(&path).unwrap().with_threads(2);
    let cfg = DecodeConfig {
        max_tokens: 256,
        ..DecodeConfig::default()
    };
    let sets: [(&str, &[&str], bool); 3] = [
        ("grounded (copy / light edit)", &GROUNDED, true),
        ("Shakespeare continuation", &SHAKESPEARE, false),
        ("open questions", &OPEN, true),
    ];
    println!("| prompt set | plain tokens/s | speculative tokens/s | ratio (mean of prompts; min–max) | acceptance | mean accepted | identical |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut trees = Vec::new();
    for (name, prompts, chat) in sets {
        let mut row = Row::default();
        let mut tree = TreeRoot::default();
        for p in prompts {
            let text = if chat { chat_prompt(p) } else { p.to_string() };
            let prompt = tok.encode(&text).unwrap();
            let (plain_ids, plain) = greedy(&mut model, &mut [], &prompt, &cfg).unwrap();
            let mut drafters: Vec<Box<dyn Drafter>> = vec![
                Box::new(PromptLookup::new(8)),
                Box::new(CorpusDrafter::new(std::sync::Arc::new(
                    infgram::Index::open(&index_dir).unwrap(),
                ))),
            ];
            let (ids, spec) = greedy(&mut model, &mut drafters, &prompt, &cfg).unwrap();
            eprintln!(
                "{name}: {} tokens, plain {:.1} tok/s, speculative {:.1} tok/s ({:.2}×), accepted {}/{}, drafting {:.3} s",
                ids.len(),
                plain.tokens_per_second(),
                spec.tokens_per_second(),
                spec.tokens_per_second() / plain.tokens_per_second(),
                spec.accepted,
                spec.drafted,
                spec.draft_seconds
            );
            row.add(&plain, &spec, ids == plain_ids);
            tree.add(&prompt, &plain_ids, &index_dir);
        }
        trees.push((name, tree));
        let n = row.prompts as f64;
        let mean_ratio = row.ratios.iter().sum::<f64>() / n;
        let min = row.ratios.iter().copied().fold(f64::MAX, f64::min);
        let max = row.ratios.iter().copied().fold(0.0, f64::max);
        println!(
            "| {name} | {:.1} | {:.1} | {:.2}× ({:.2}–{:.2}) | {:.1}% | {:.2} | {}/{} |",
            row.plain_tps / n,
            row.spec_tps / n,
            mean_ratio,
            min,
            max,
            100.0 * row.accepted as f64 / row.drafted.max(1) as f64,
            row.accepted as f64 / row.drafted_passes.max(1) as f64,
            row.identical,
            row.prompts
        );
    }
    println!(
        "\nmachine: {} cores; targets: grounded ≥ 1.8×, Shakespeare ≥ 1.5×, open ≥ 0.95×",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("\nThe corpus drafter's rule: most frequent continuation of the longest suffix vs the SBIS argmax (decay 0.1, all levels), where the corpus matches ≥ 2 tokens:\n");
    println!("| prompt set | positions | most frequent right | SBIS argmax right |");
    println!("|---|---:|---:|---:|");
    for (name, t) in &trees {
        let pct = |x: usize| 100.0 * x as f64 / t.corpus_positions.max(1) as f64;
        println!(
            "| {name} | {} | {:.1}% | {:.1}% |",
            t.corpus_positions,
            pct(t.most_frequent_right),
            pct(t.sbis_right)
        );
    }
    println!("\nWhat a token tree's second root candidate could add (drafters asked at every position of the plain output):\n");
    println!("| prompt set | positions | with a candidate | first candidate right | only the second right |");
    println!("|---|---:|---:|---:|---:|");
    for (name, t) in trees {
        let pct = |x: usize| 100.0 * x as f64 / t.positions.max(1) as f64;
        println!(
            "| {name} | {} | {:.1}% | {:.1}% | {:.1}% |",
            t.positions,
            pct(t.with_candidate),
            pct(t.first_right),
            pct(t.only_second_right)
        );
    }
}
