//! Compares drafting policies without timing noise: greedy speculative decoding of
//! `bench_decode speculative`'s prompt sets with the cost table frozen (`CostModel::frozen`), so every
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
//! table (drafting, sampling), so it reads a little above `bench_decode speculative`'s timed ratios.
//!
//! `--measured-costs` plans and weighs with this machine's pass costs (measured first, then
//! frozen) instead of the prior table, and adds a perfect drafter's bound (16 right tokens
//! every pass): what no drafter passes here.
//!
//! `--costs 7.31,10.41,12.81,23.29,43.33` plans and weighs with a given table (milliseconds
//! of passes of 1, 2, 4, 8 and 16 rows), also with the perfect drafter's bound: two builds
//! compared on one machine's measured costs without measuring them again.
//!
//! After the table, the drafters' confidences against what the model accepted in the
//! passes of the run-wide calibration (`confidences`).
//!
//! `cargo run --release --example bench_decode -- policy` (about a minute on 2 cores)

use crate::ceiling::ceiling;
use crate::confidences::Confidences;
use crate::prompts::sets;
use infgram::decode::drafters::{CorpusDrafter, PromptLookup};
use infgram::decode::{greedy, CostModel, DecodeConfig, Drafter};
use infgram::neural::chat_prompt;
use infgram::neural::native::decoder::Decoder;
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use std::sync::Arc;

/// The pass costs drafts are planned and weighed with.
pub enum Costs {
    /// The built-in table ([`CostModel::default`]).
    Prior,
    /// This machine's, measured first.
    Measured,
    /// Milliseconds of passes of 1, 2, 4, 8 and 16 rows.
    Given(Vec<f64>),
}

/// Runs the comparison on the `isa` kernels, with the pass costs `costs`.
pub fn run(costs: Costs, isa: infgram::neural::native::kernels::Isa) {
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch the model");
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let index_dir = infgram::service::cached_index(&[], &tok)
        .expect("the Shakespeare index in the model's tokens");
    let index = Arc::new(infgram::Index::open(&index_dir).unwrap());
    let mut model = Decoder::from_gguf(&path)
        .unwrap()
        .with_threads(2)
        .with_isa(isa);
    let measured = !matches!(costs, Costs::Prior);
    let given = |ms: &[(usize, f64)], how: &str| {
        println!("Pass costs {how}: {}\n", crate::ceiling::describe_costs(ms));
        CostModel::from_ms(ms).frozen()
    };
    let cost = match costs {
        Costs::Measured => {
            let context: Vec<u32> = (0..256).map(|i| 100 + i).collect();
            let ms = crate::mix::pass_costs(&mut model, &context);
            given(&ms, &format!("measured here (kernels {isa:?})"))
        }
        Costs::Given(ms) => given(&crate::ceiling::given_costs(ms), "given"),
        Costs::Prior => CostModel::default().frozen(),
    };
    let new_drafters = || -> Vec<Box<dyn Drafter>> {
        vec![
            Box::new(PromptLookup::new(8)),
            Box::new(CorpusDrafter::new(index.clone())),
        ]
    };
    println!("| prompt set | drafting | modeled speed-up, geomean | per prompt (passes) |");
    println!("|---|---|---:|---|");
    let mut confidences: Vec<(&str, Confidences)> = Vec::new();
    for set in sets() {
        let (name, chat) = (set.name, set.chat);
        let mut seen = Confidences::default();
        let mut outputs = Vec::new();
        for (policy, local) in [("run-wide calibration", false), ("+ local evidence", true)] {
            let mut runs = Vec::new();
            outputs.clear();
            for p in &set.prompts {
                let text = if chat { chat_prompt(p) } else { p.clone() };
                let prompt = tok.encode(&text).unwrap();
                let mut drafters = new_drafters();
                let cfg = DecodeConfig {
                    max_tokens: set.max_tokens,
                    trace: true,
                    local_evidence: local,
                    cost: cost.clone(),
                    ..DecodeConfig::default()
                };
                let (ids, stats) = greedy(&mut model, &mut drafters, &prompt, &cfg).unwrap();
                if !local {
                    seen.add(&stats.trace);
                }
                let modeled: f64 = stats.trace.iter().map(|t| cost.cost(t.drafted + 1)).sum();
                runs.push((ids.len(), modeled, stats.trace.len()));
                outputs.push((prompt, ids));
            }
            print_row(name, policy, &runs);
        }
        confidences.push((name, seen));
        let runs: Vec<_> = outputs
            .iter()
            .map(|(prompt, ids)| {
                let (modeled, passes) = ceiling(&mut new_drafters(), &cost, prompt, ids);
                (ids.len(), modeled, passes)
            })
            .collect();
        print_row(
            name,
            "ceiling: drafts cut where the model leaves them",
            &runs,
        );
        if measured {
            let perfect: Vec<_> = outputs
                .iter()
                .map(|(_, ids)| {
                    let (modeled, passes) = crate::ceiling::perfect(&cost, ids.len());
                    (ids.len(), modeled, passes)
                })
                .collect();
            print_row(name, "bound: a perfect drafter (16 right a pass)", &perfect);
        }
    }
    Confidences::print_header();
    for (set, c) in &confidences {
        c.print_rows(set);
    }
}

/// One row of the table: each output's modeled speed-up (its tokens over the table cost of its
/// passes; `runs` holds tokens, cost and passes) and their geometric mean.
fn print_row(set: &str, drafting: &str, runs: &[(usize, f64, usize)]) {
    let speeds: Vec<f64> = runs
        .iter()
        .map(|&(n, modeled, _)| n as f64 / modeled)
        .collect();
    let geomean = (speeds.iter().map(|s| s.ln()).sum::<f64>() / runs.len() as f64).exp();
    let each: Vec<String> = speeds
        .iter()
        .zip(runs)
        .map(|(speed, (_, _, passes))| format!("{speed:.2} ({passes})"))
        .collect();
    println!(
        "| {set} | {drafting} | {geomean:.3}× | {} |",
        each.join(", ")
    );
}
