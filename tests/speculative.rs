//! Speculative decoding is lossless. Greedy: the output equals plain greedy decoding on the
//! real SmolLM2 with adversarial drafters (always wrong, always right, an end token inside the
//! draft, drafts longer than the budget) and over a long prompt-lookup run. Sampling: rejection
//! sampling keeps the scorer's distribution (chi-square test against a stub scorer whose
//! distribution is known; the stub exists only for that test).
#![cfg(feature = "neural")]

use infgram::decode::drafters::PromptLookup;
use infgram::decode::{decode, greedy, DecodeConfig, Draft, Drafter};
use infgram::decode::{Sampler, SamplerConfig};
use infgram::lm::LanguageModel;
use infgram::neural::candle::decoder::CandleDecoder;
use infgram::neural::chat_prompt;
use infgram::neural::native::decoder::Decoder;
use infgram::tokenizer::{HfTokenizer, Tokenizer};

/// Drafts from a fixed script of what comes after the prompt, edited by `edit`.
struct Scripted {
    prompt_len: usize,
    script: Vec<u32>,
    edit: fn(usize, u32) -> u32,
    length: usize,
}

impl Drafter for Scripted {
    fn propose(&mut self, context: &[u32], max: usize) -> infgram::Result<Draft> {
        let at = context.len() - self.prompt_len;
        let tokens: Vec<u32> = (at..at + self.length.min(max.max(self.length)))
            .map(|i| (self.edit)(i, self.script.get(i).copied().unwrap_or(2)))
            .collect();
        Ok(Draft {
            confidence: vec![1.0; tokens.len()],
            tokens,
            ..Draft::default()
        })
    }
    fn name(&self) -> &str {
        "scripted"
    }
}

#[test]
fn greedy_speculative_output_equals_plain_greedy() {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let mut model = Decoder::from_gguf(&path).unwrap().with_threads(2);
    speculative_equals_plain(&mut model, &path);
}

/// The candle pass (the one `--device cuda` runs) is batch-invariant, so speculative decoding
/// over it is lossless too: here on the CPU; `scripts/device-check.sh` runs the prompt sets on
/// a GPU.
#[test]
fn greedy_speculative_output_equals_plain_greedy_on_the_candle_pass() {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let mut model = CandleDecoder::from_gguf(&path).unwrap();
    speculative_equals_plain(&mut model, &path);
}

fn speculative_equals_plain(model: &mut dyn LanguageModel, path: &std::path::Path) {
    let tok = HfTokenizer::from_gguf(path).unwrap();
    let cfg = DecodeConfig {
        max_tokens: 48,
        ..DecodeConfig::default()
    };
    // A chat answer that ends with the end token before the budget.
    let prompt = tok
        .encode(&chat_prompt("What is the capital of France?"))
        .unwrap();
    let (plain, _) = greedy(model, &mut [], &prompt, &cfg).unwrap();
    assert!(
        plain.len() < cfg.max_tokens,
        "the answer should end: {}",
        plain.len()
    );
    let mut script = plain.clone();
    script.push(model.eos_tokens()[0]);
    script.extend([1000, 1001, 1002]);
    type Edit = fn(usize, u32) -> u32;
    let cases: [(&str, Edit, usize); 5] = [
        ("always right", |_, t| t, 4),
        ("always wrong", |_, t| (t + 1) % 49_152, 4),
        (
            "wrong every third",
            |i, t| if i % 3 == 2 { 7 } else { t },
            6,
        ),
        // Runs past the end token: the draft holds the end token and tokens after it.
        ("end token inside the draft", |_, t| t, 40),
        ("longer than the budget", |_, t| t, 500),
    ];
    for (name, edit, length) in cases {
        let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(Scripted {
            prompt_len: prompt.len(),
            script: script.clone(),
            edit,
            length,
        })];
        let (spec, stats) = greedy(model, &mut drafters, &prompt, &cfg).unwrap();
        assert_eq!(spec, plain, "{name}");
        if name == "always right" {
            assert!(stats.passes < plain.len() / 2, "{name}: {stats:?}");
        }
    }
    // The budget ends inside an accepted draft.
    let short = DecodeConfig {
        max_tokens: 5,
        ..DecodeConfig::default()
    };
    let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(Scripted {
        prompt_len: prompt.len(),
        script,
        edit: |_, t| t,
        length: 500,
    })];
    let (spec, _) = greedy(model, &mut drafters, &prompt, &short).unwrap();
    assert_eq!(spec, plain[..5]);
}

#[test]
fn long_prompt_lookup_run_matches_plain_decoding_token_by_token() {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let mut model = Decoder::from_gguf(&path).unwrap().with_threads(2);
    let passage = "The old lighthouse keeper climbed the spiral stairs every evening at dusk. \
        He trimmed the wick, polished the great lens, and wrote the weather in his log. \
        Ships passed safely through the narrow channel because of his care.";
    let prompt = tok
        .encode(&chat_prompt(&format!(
            "Copy this passage twice, word for word:\n\n{passage}"
        )))
        .unwrap();
    let cfg = DecodeConfig {
        max_tokens: 160,
        ..DecodeConfig::default()
    };
    let (plain, _) = greedy(&mut model, &mut [], &prompt, &cfg).unwrap();
    let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(PromptLookup::new(8))];
    let traced = DecodeConfig { trace: true, ..cfg };
    let (spec, stats) = greedy(&mut model, &mut drafters, &prompt, &traced).unwrap();
    for (i, (a, b)) in spec.iter().zip(&plain).enumerate() {
        assert_eq!(a, b, "token {i}");
    }
    assert_eq!(spec.len(), plain.len());
    assert!(
        stats.accepted > 0 && stats.passes < plain.len(),
        "{stats:?}"
    );
    // The trace: one entry per pass, adding up to the run.
    assert_eq!(stats.trace.len(), stats.passes);
    let mut at = 0;
    for pass in &stats.trace {
        assert_eq!(pass.at, at, "{pass:?}");
        assert!(
            pass.accepted <= pass.drafted && pass.emitted <= pass.accepted + 1,
            "{pass:?}"
        );
        assert_eq!(pass.drafter.is_some(), pass.drafted > 0, "{pass:?}");
        assert!(pass.seconds > 0.0);
        at += pass.emitted;
    }
    assert_eq!(at, spec.len());
    let accepted: usize = stats.trace.iter().map(|p| p.accepted).sum();
    assert_eq!(accepted, stats.accepted);
    // `gen --trace FILE` writes the same, one JSON line per pass.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.jsonl");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args([
            "gen",
            "--model",
            "smollm2-135m",
            "--speculative",
            "--temperature",
            "0",
        ])
        .args([
            "--max-tokens",
            "24",
            "--prompt",
            &format!("Copy this passage: {passage}"),
        ])
        .arg("--trace")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let emitted: u64 = lines.iter().map(|l| l["emitted"].as_u64().unwrap()).sum();
    assert!(!lines.is_empty() && emitted <= 24, "{lines:?}");
}

/// A scorer with a known next-token distribution: logits depend only on the previous token.
/// With `tree_rows`, it verifies token trees too (a node's row depends on its own token
/// alone).
struct Stub {
    fed: Vec<u32>,
    tree_rows: usize,
    /// The cache length before the last tree pass, and the tree's tokens.
    tree: Option<(usize, Vec<u32>)>,
}

impl Stub {
    fn new(tree_rows: usize) -> Stub {
        Stub {
            fed: Vec::new(),
            tree_rows,
            tree: None,
        }
    }
}

const STUB_VOCAB: usize = 5;

fn stub_logits(prev: u32) -> Vec<f32> {
    // The end token 4 is unlikely but possible.
    let base = [1.0f32, 0.3, -0.5, 0.8];
    (0..STUB_VOCAB)
        .map(|i| base[(i + prev as usize) % 4] - if i == 4 { 3.0 } else { 0.0 })
        .collect()
}

impl LanguageModel for Stub {
    fn forward(&mut self, tokens: &[u32]) -> infgram::Result<Vec<Vec<f32>>> {
        self.tree = None;
        self.fed.extend_from_slice(tokens);
        Ok(tokens.iter().map(|&t| stub_logits(t)).collect())
    }
    fn cache_len(&self) -> usize {
        self.fed.len()
    }
    fn truncate(&mut self, len: usize) {
        self.fed.truncate(len);
    }
    fn vocab_size(&self) -> usize {
        STUB_VOCAB
    }
    fn eos_tokens(&self) -> &[u32] {
        &[4]
    }
    fn max_tree_rows(&self) -> usize {
        self.tree_rows
    }
    fn score_tree_first(
        &mut self,
        tokens: &[u32],
        parents: &[Option<usize>],
        _first: usize,
        _form: infgram::lm::RowForm,
    ) -> infgram::Result<Vec<infgram::lm::Logits>> {
        assert!(
            parents[0].is_none()
                && parents[1..]
                    .iter()
                    .enumerate()
                    .all(|(i, p)| p.unwrap() <= i)
        );
        self.tree = Some((self.fed.len(), tokens.to_vec()));
        Ok(tokens
            .iter()
            .map(|&t| infgram::lm::Logits::Dense(stub_logits(t)))
            .collect())
    }
    fn keep_path(&mut self, path: &[usize]) -> infgram::Result<()> {
        let (base, tokens) = self.tree.take().expect("a tree pass before keep_path");
        self.fed.truncate(base);
        self.fed.extend(path.iter().map(|&n| tokens[n]));
        Ok(())
    }
}

/// Always drafts `token` three times, with `confidence`: deterministic drafts that are
/// often wrong.
struct Always {
    token: u32,
    confidence: f64,
}

impl Drafter for Always {
    fn propose(&mut self, _: &[u32], max: usize) -> infgram::Result<Draft> {
        let n = max.min(3);
        Ok(Draft {
            tokens: vec![self.token; n],
            confidence: vec![self.confidence; n],
            ..Draft::default()
        })
    }
    fn name(&self) -> &str {
        "always"
    }
}

/// Sampling at temperature 1 from `seed`.
fn sampler(seed: u64) -> Sampler {
    Sampler::new(
        SamplerConfig {
            temperature: 1.0,
            ..SamplerConfig::default()
        },
        Some(seed),
    )
}

#[test]
fn rejection_sampling_keeps_the_scorer_distribution() {
    let cfg = DecodeConfig {
        max_tokens: 3,
        ..DecodeConfig::default()
    };
    let mut sampler = sampler(7);
    // Count the second generated token after prompt [1]: its law given the first is known.
    let runs = 20_000;
    let mut observed = vec![vec![0f64; STUB_VOCAB]; STUB_VOCAB];
    for _ in 0..runs {
        let mut model = Stub::new(0);
        let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(Always {
            token: 0,
            confidence: 0.99,
        })];
        let (out, _) = decode(
            &mut model,
            &mut drafters,
            &mut [],
            &mut sampler,
            &[1],
            &cfg,
            |_| {},
        )
        .unwrap();
        if out.len() >= 2 {
            observed[out[0] as usize][out[1] as usize] += 1.0;
        }
    }
    for prev in 0..4u32 {
        let n: f64 = observed[prev as usize].iter().sum();
        if n < 500.0 {
            continue;
        }
        let p: Vec<(u32, f64)> = infgram::lm::softmax(&stub_logits(prev));
        // Token 4 ends the text, so the second token is drawn from p restricted to 0..4.
        let mass: f64 = p[..4].iter().map(|x| x.1).sum();
        let chi2: f64 = (0..4)
            .map(|t| {
                let expected = n * p[t].1 / mass;
                (observed[prev as usize][t] - expected).powi(2) / expected
            })
            .sum();
        // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
        assert!(
            chi2 < 16.27,
            "after {prev}: chi2 {chi2}, {:?}",
            observed[prev as usize]
        );
    }
}

/// `gen --past-outputs FILE`: the first run writes its output there, the second drafts from it
/// (the output still plain decoding's); a file that is not ours is refused and left as it is.
#[test]
fn gen_drafts_from_the_outputs_of_earlier_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("past.bin");
    let gen = |file: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args([
                "gen",
                "--model",
                "smollm2-135m",
                "--speculative",
                "--compare",
            ])
            .args(["--prompt", "Write a list of five fruits, one per line."])
            .args(["--max-tokens", "32", "--temperature", "0", "--json"])
            .arg("--draft-trees")
            .arg("--past-outputs")
            .arg(file)
            .output()
            .unwrap()
    };
    let runs: Vec<serde_json::Value> = (0..2)
        .map(|_| {
            let out = gen(&file);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect();
    for r in &runs {
        assert_eq!(r["identical"], true, "{r}");
    }
    assert_eq!(runs[0]["text"], runs[1]["text"]);
    let by = &runs[1]["stats"]["accepted_by_drafter"];
    assert!(by["past"].as_u64().unwrap_or(0) > 0, "{}", runs[1]);
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "mine\n").unwrap();
    let out = gen(&notes);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("not a past-outputs file"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\n");
}

/// Passes cost the same whatever their rows (as on a GPU): every branch with a chance pays.
fn flat_cost() -> infgram::decode::CostModel {
    infgram::decode::CostModel::from_ms(&[(1, 1.0), (64, 1.0)]).frozen()
}

/// Draft trees (two drafters that disagree at every token: a branch of each) sample exactly
/// the scorer's distribution: the first and the second token, chi-square tested.
#[test]
fn rejection_sampling_over_a_draft_tree_keeps_the_scorer_distribution() {
    let cfg = DecodeConfig {
        max_tokens: 3,
        cost: flat_cost(),
        trees: true,
        ..DecodeConfig::default()
    };
    let mut sampler = sampler(11);
    let runs = 20_000;
    let mut first = vec![0f64; STUB_VOCAB];
    let mut second = vec![vec![0f64; STUB_VOCAB]; STUB_VOCAB];
    let mut tree_passes = 0;
    for _ in 0..runs {
        let mut model = Stub::new(64);
        let always = |token| -> Box<dyn Drafter> {
            Box::new(Always {
                token,
                confidence: 0.6,
            })
        };
        let mut drafters = vec![always(0), always(2)];
        let (out, stats) = decode(
            &mut model,
            &mut drafters,
            &mut [],
            &mut sampler,
            &[1],
            &cfg,
            |_| {},
        )
        .unwrap();
        tree_passes += stats.tree_passes;
        first[out.first().copied().unwrap_or(4) as usize] += 1.0;
        if out.len() >= 2 {
            second[out[0] as usize][out[1] as usize] += 1.0;
        } else if out.len() == 1 {
            second[out[0] as usize][4] += 1.0;
        }
    }
    assert!(tree_passes > runs / 2, "trees were verified: {tree_passes}");
    let chi2 = |observed: &[f64], prev: u32| {
        let n: f64 = observed.iter().sum();
        let p = infgram::lm::softmax(&stub_logits(prev));
        (0..STUB_VOCAB)
            .map(|t| {
                let expected = n * p[t].1;
                (observed[t] - expected).powi(2) / expected
            })
            .sum::<f64>()
    };
    // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
    let c = chi2(&first, 1);
    assert!(c < 18.47, "first token: chi2 {c}, {first:?}");
    for prev in 0..4u32 {
        if second[prev as usize].iter().sum::<f64>() < 500.0 {
            continue;
        }
        let c = chi2(&second[prev as usize], prev);
        assert!(
            c < 18.47,
            "after {prev}: chi2 {c}, {:?}",
            second[prev as usize]
        );
    }
}

/// Greedy decoding with a draft tree (drafters that part from each other) on SmolLM2 gives
/// plain greedy decoding's tokens, and the tree passes happen.
#[test]
fn greedy_tree_decoding_equals_plain_greedy() {
    let path = infgram::neural::source::ModelSource::resolve("smollm2-135m")
        .unwrap()
        .path()
        .to_path_buf();
    let mut model = Decoder::from_gguf(&path).unwrap().with_threads(2);
    tree_decoding_equals_plain(&mut model, &path);
}

/// The candle pass (the one `--device cuda` runs) verifies draft trees losslessly too.
#[test]
fn greedy_tree_decoding_equals_plain_greedy_on_the_candle_pass() {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let mut model = CandleDecoder::from_gguf(&path).unwrap();
    tree_decoding_equals_plain(&mut model, &path);
}

fn tree_decoding_equals_plain(model: &mut dyn LanguageModel, path: &std::path::Path) {
    let tok = HfTokenizer::from_gguf(path).unwrap();
    let prompt = tok
        .encode(&chat_prompt(
            "Repeat exactly: the cat sat on the mat, the dog sat on the log, the bird sat on the word.",
        ))
        .unwrap();
    let cfg = DecodeConfig {
        max_tokens: 48,
        cost: flat_cost(),
        trees: true,
        ..DecodeConfig::default()
    };
    let (plain, _) = greedy(model, &mut [], &prompt, &cfg).unwrap();
    // A script of the plain output; one drafter errs at every third token, one at every
    // fourth: where one errs the other is right, a branch.
    let scripted = |edit: fn(usize, u32) -> u32| -> Box<dyn Drafter> {
        Box::new(Scripted {
            prompt_len: prompt.len(),
            script: plain.clone(),
            edit,
            length: 6,
        })
    };
    let mut drafters = vec![
        scripted(|i, t| if i % 3 == 2 { t + 1 } else { t }),
        scripted(|i, t| if i % 4 == 3 { t + 1 } else { t }),
    ];
    let (out, stats) = greedy(model, &mut drafters, &prompt, &cfg).unwrap();
    assert_eq!(out, plain);
    assert!(stats.tree_passes > 0, "{stats:?}");
}
