//! Mixing SmolLM2-135M with the ∞-gram on Tiny Shakespeare, the protocol of BENCHMARKS.md: the index is
//! the train split (first 90%) in SmolLM2 tokens; λ is fitted on the last 5% of train with the
//! first 95% indexed; everything is scored on val. Prints, for each ∞-gram distribution mixed
//! in (the paper's sparse ∞-gram, SBIS k = 2, the smoothed estimator) and each λ model (the
//! paper's two weights, the table by suffix length): the perplexities and the relative
//! improvement; the time of interpolated against neural-only scoring; the fitted tables
//! (`Mixer::default` holds the SBIS k = 2 one); then decoding speed with that table: plain
//! neural, the mixture, and speculative decoding of the mixture; last, free of timing noise,
//! the speculative runs' passes and the drafters' ceiling (each output replayed with every
//! draft cut exactly where the mixture leaves it) weighed by the mixture's pass costs measured
//! in the run.
//!
//! Decoding runs in rounds (`--rounds`, default 5), the three runs of a prompt back to back
//! in each, so a ratio compares runs made in the same state of a noisy machine; the table gives
//! medians, the range of the ratios, and the three prompts together.
//!
//! `cargo run --release --example bench_decode -- mix [--max-val-tokens N]` (default: all of val, about
//! 36,000 tokens; about 2 minutes on a 2-vCPU AMD EPYC Zen 5)

use infgram::decode::drafters::{CorpusDrafter, PromptLookup};
use infgram::decode::{greedy, CostModel, DecodeConfig, Drafter};
use infgram::lm::{LanguageModel, RowForm};
use infgram::mix::score::{fitting_data, infgram_positions, neural_probs, MixReport};
use infgram::mix::{Interpolated, Mixer, TABLE_EDGES};
use infgram::neural::native::decoder::Decoder;
use infgram::ngram::EstimatorSpec;
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use infgram::Index;
use std::sync::Arc;
use std::time::Instant;

use crate::ceiling;

/// Runs the benchmark on the first `limit` tokens of val (0: all), decoding in `rounds` rounds.
pub fn run(limit: usize, rounds: usize) {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let mut model = Decoder::from_gguf(&path).unwrap().with_threads(2);
    let (train, val) = infgram::assets::tiny_shakespeare_split().unwrap();
    let cut = (0..=train.len() * 95 / 100)
        .rev()
        .find(|&c| train.is_char_boundary(c))
        .unwrap();
    let (train95, heldout) = train.split_at(cut);
    let enc = |s: &str| tok.encode(s).unwrap();
    let index95 = Index::from_docs(tok.spec(), &[enc(train95)], 1, true).unwrap();
    let index = Arc::new(Index::from_docs(tok.spec(), &[enc(&train)], 1, true).unwrap());
    let heldout = enc(heldout);
    let mut val = enc(&val);
    if limit > 0 {
        val.truncate(limit);
    }
    println!(
        "index: {} tokens (train), fitting: {} held-out tokens (index of the first 95%), val: {} tokens",
        index.total_tokens(),
        heldout.len(),
        val.len()
    );

    let table = fit_and_score(&mut model, &index95, &index, &heldout, &val);
    decode_and_bound(&path, &tok, &mut model, index, table, rounds);
}

/// Scores held-out and val with the model, fits each estimator's mixers on held-out (with the
/// first 95% of train indexed) and prints their perplexities on val (against all of train);
/// returns the SBIS k = 2 table by n, the default mixer's.
fn fit_and_score(
    model: &mut Decoder,
    index95: &Index<Vec<u8>>,
    index: &Index<Vec<u8>>,
    heldout: &[u32],
    val: &[u32],
) -> Mixer {
    let t = Instant::now();
    let q_held = neural_probs(model, heldout, 1024, 512).unwrap();
    let held_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let q_val = neural_probs(model, val, 1024, 512).unwrap();
    let neural_secs = t.elapsed().as_secs_f64();
    println!("neural scoring: held-out {held_secs:.1} s, val {neural_secs:.1} s");

    println!("\n| ∞-gram mixed in | λ | ppl mixture | ppl SmolLM2 | ppl ∞-gram (smoothed) | relative improvement | best any λ could do | mean λ | ∞-gram time (val) | interpolated / neural time |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut default_table = None;
    let mut tables = Vec::new();
    for est in [
        EstimatorSpec::Infgram,
        EstimatorSpec::sbis(2),
        EstimatorSpec::Smoothed,
    ] {
        let held = infgram_positions(index95, heldout, &est, 100).expect("a valid estimator");
        let fit_data = fitting_data(&held, &q_held);
        let t = Instant::now();
        let g_val = infgram_positions(index, val, &est, 100).expect("a valid estimator");
        let inf_secs = t.elapsed().as_secs_f64();
        for (name, edges) in [("two weights", &[][..]), ("table by n", &TABLE_EDGES[..])] {
            let mixer = Mixer::fit(est.clone(), edges, &fit_data);
            let r = MixReport::new(&g_val, &q_val, &mixer);
            println!(
                "| {est:?} | {name} | {:.3} | {:.3} | {:.3} | {:.1}% | {:.1}% | {:.3} | {inf_secs:.2} s | {:.3}× |",
                r.ppl,
                r.ppl_neural,
                r.ppl_infgram,
                100.0 * r.relative_improvement,
                100.0 * r.relative_improvement_bound,
                r.lambda_mean,
                (neural_secs + inf_secs) / neural_secs
            );
            if !edges.is_empty() {
                let round =
                    |v: &[f64]| -> Vec<f64> { v.iter().map(|x| (x * 1e4).round() / 1e4).collect() };
                tables.push(format!(
                    "{est:?}: sparse {:?}\n{:width$}dense  {:?}",
                    round(&mixer.sparse),
                    "",
                    round(&mixer.dense),
                    width = format!("{est:?}: ").len()
                ));
                if est == EstimatorSpec::sbis(2) {
                    default_table = Some(mixer);
                }
            }
        }
    }
    println!("\nfitted tables (Mixer::default holds the SBIS k = 2 one):");
    for t in &tables {
        println!("{t}");
    }
    default_table.expect("the SBIS k = 2 table")
}

/// Greedy decoding speeds of plain SmolLM2, the mixture (`table`) and the speculative mixture
/// on three prompts, `rounds` rounds each, then what these drafters could reach (the passes
/// made, and each output replayed with every draft cut where the mixture leaves it).
fn decode_and_bound(
    path: &std::path::Path,
    tok: &HfTokenizer,
    model: &mut Decoder,
    index: Arc<Index<Vec<u8>>>,
    table: Mixer,
    rounds: usize,
) {
    // Decoding speed: plain neural, mixture, speculative mixture (greedy, same prompts).
    let prompts = [
        "Continue this scene from Shakespeare:\n\nROMEO:\nBut soft, what light through yonder window breaks?",
        "Continue this speech from Shakespeare:\n\nFirst Citizen:\nBefore we proceed any further, hear me speak.",
        "Continue this scene from Shakespeare:\n\nKING RICHARD III:\nNow is the winter of our discontent",
    ];
    let cfg = DecodeConfig {
        max_tokens: 128,
        trace: true,
        ..Default::default()
    };
    let rounds = rounds.max(1);
    println!(
        "\ndecoding: greedy, {} new tokens, {rounds} rounds of plain / mixture / speculative mixture per prompt \
         (medians; ratios are the median and range of the rounds' ratios, each round's runs back to back)",
        cfg.max_tokens
    );
    println!("\n| prompt | plain SmolLM2 tok/s | mixture tok/s | mixture / plain | speculative mixture tok/s | speculative / mixture | acceptance | identical |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut mixed = Interpolated::new(
        Box::new(Decoder::from_gguf(path).unwrap().with_threads(2)),
        index.clone(),
        table,
        100,
    )
    .unwrap();
    let new_drafters = || -> Vec<Box<dyn Drafter>> {
        vec![
            Box::new(PromptLookup::new(8)),
            Box::new(CorpusDrafter::new(index.clone())),
        ]
    };
    let mut replays = Vec::new();
    // Seconds of generation (the prompt's pass excluded) of each round: plain, mixture,
    // speculative mixture, summed over the prompts for the set's row.
    let mut set_rounds = vec![[0.0f64; 3]; rounds];
    let mut set_tokens = [0usize; 3];
    for p in prompts {
        let prompt = tok.encode(&infgram::neural::chat_prompt(p)).unwrap();
        let mut secs = vec![[0.0f64; 3]; rounds];
        let mut tokens = [0usize; 3];
        let mut identical = true;
        let mut last = None;
        for (r, round) in secs.iter_mut().enumerate() {
            let (_, plain) = greedy(model, &mut [], &prompt, &cfg).unwrap();
            let (out_mix, mix) = greedy(&mut mixed, &mut [], &prompt, &cfg).unwrap();
            let (out_spec, spec) = greedy(&mut mixed, &mut new_drafters(), &prompt, &cfg).unwrap();
            identical &= out_spec == out_mix;
            for (i, s) in [&plain, &mix, &spec].into_iter().enumerate() {
                round[i] = s.seconds - s.prompt_seconds;
                tokens[i] = s.tokens;
                set_rounds[r][i] += round[i];
            }
            last = Some((out_mix, spec));
        }
        for i in 0..3 {
            set_tokens[i] += tokens[i];
        }
        let (out_mix, spec) = last.unwrap();
        let short: String = p
            .chars()
            .skip(p.find('\n').unwrap_or(0) + 2)
            .take(30)
            .collect();
        println!(
            "| {short:?} | {} | {:.0}% | {identical} |",
            Speeds::of(&secs, &tokens).cells(),
            100.0 * spec.acceptance_rate(),
        );
        replays.push((short, prompt, out_mix, spec.trace));
    }
    println!(
        "| the three together (tokens / seconds) | {} | | |",
        Speeds::of(&set_rounds, &set_tokens).cells()
    );

    // How far these drafters could go: the passes the loop made, and the output replayed with
    // every draft cut exactly where the mixture leaves it, weighed by this run's pass costs.
    let (_, prompt, output, _) = &replays[0];
    let table = pass_costs(&mut mixed, &[&prompt[..], output].concat());
    println!(
        "\nmixture pass costs here, n = 1 / 2 / 4 / 8 / 16 tokens, fastest of 20 (ms): {table:?}"
    );
    let cost = CostModel::from_ms(&table).frozen();
    println!("\n| prompt | speculative / mixture, modeled from the passes made | ceiling of the drafters |");
    println!("|---|---:|---:|");
    for (short, prompt, output, trace) in &replays {
        let made: f64 = trace.iter().map(|t| cost.cost(t.drafted + 1)).sum();
        let (best, passes) = ceiling::ceiling(&mut new_drafters(), &cost, prompt, output);
        let n = output.len() as f64;
        println!(
            "| {short:?} | {:.2}× ({} passes) | {:.2}× ({passes} passes) |",
            n / made,
            trace.len(),
            n / best
        );
    }
}

/// Decoding speeds of repeated rounds: each round's seconds for plain, mixture and speculative
/// mixture decoding, and the tokens each made (the same in every round: greedy).
struct Speeds<'a> {
    seconds: &'a [[f64; 3]],
    tokens: &'a [usize; 3],
}

impl<'a> Speeds<'a> {
    fn of(seconds: &'a [[f64; 3]], tokens: &'a [usize; 3]) -> Self {
        Speeds { seconds, tokens }
    }

    fn tokens_per_second(&self, round: usize, run: usize) -> f64 {
        self.tokens[run] as f64 / self.seconds[round][run].max(1e-12)
    }

    /// The table's five speed cells: plain, mixture, mixture / plain, speculative mixture,
    /// speculative / mixture.
    fn cells(&self) -> String {
        [
            self.median(0),
            self.median(1),
            self.ratio(1, 0),
            self.median(2),
            self.ratio(2, 1),
        ]
        .join(" | ")
    }

    /// The median tokens/s of `run`.
    fn median(&self, run: usize) -> String {
        let v = sorted((0..self.seconds.len()).map(|r| self.tokens_per_second(r, run)));
        format!("{:.1}", v[v.len() / 2])
    }

    /// The median and range over the rounds of `run`'s speed over `base`'s.
    fn ratio(&self, run: usize, base: usize) -> String {
        let v = sorted(
            (0..self.seconds.len())
                .map(|r| self.tokens_per_second(r, run) / self.tokens_per_second(r, base)),
        );
        format!("{:.2}× ({:.2}–{:.2})", v[v.len() / 2], v[0], v[v.len() - 1])
    }
}

fn sorted(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The milliseconds of a pass of n = 1, 2, 4, 8, 16 tokens of `model` after `context`, every
/// row scored (fastest of 20 each).
pub fn pass_costs(model: &mut dyn LanguageModel, context: &[u32]) -> Vec<(usize, f64)> {
    model.truncate(0);
    model.feed(context).unwrap();
    [1, 2, 4, 8, 16]
        .into_iter()
        .map(|n| {
            let tokens = &context[..n];
            let fastest = (0..20)
                .map(|_| {
                    let t = Instant::now();
                    model.score_first(tokens, n, RowForm::Full).unwrap();
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    model.truncate(context.len());
                    ms
                })
                .fold(f64::INFINITY, f64::min);
            (n, (fastest * 100.0).round() / 100.0)
        })
        .collect()
}
