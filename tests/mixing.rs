//! The mixture of two scorers as one language model: every row is a distribution, λ = 0 and
//! λ = 1 give the components, speculative decoding of the mixture equals plain decoding of the
//! mixture (greedy) with adversarial drafters, and sampled decoding keeps the mixture's
//! distribution (chi-square). The "neural" component here is a real full-vocabulary scorer, the
//! smoothed ∞-gram of another corpus, fed as dense rows; `tests/mixing_neural.rs` uses SmolLM2.

use infgram::decode::drafters::CorpusDrafter;
use infgram::decode::{decode, greedy, DecodeConfig, Draft, Drafter, Sampler, SamplerConfig};
use infgram::lm::{DenseRows, LanguageModel, Logits, RowForm};
use infgram::mix::{Interpolated, Mixer};
use infgram::ngram::EstimatorSpec;
use infgram::ngram::{Estimator, InfgramModel};
use infgram::tokenizer::TokenizerSpec;
use infgram::Index;
use proptest::prelude::*;
use std::sync::Arc;

type Ix = Arc<Index<Vec<u8>>>;

fn index(docs: &[Vec<u32>]) -> Ix {
    Arc::new(Index::from_docs(TokenizerSpec::synthetic(6), docs, 1, true).unwrap())
}

/// The stand-in neural model: the smoothed ∞-gram of `docs`, as dense rows.
fn neural(docs: &[Vec<u32>]) -> Box<dyn LanguageModel> {
    let m = InfgramModel::new(index(docs), Estimator::Smoothed(Default::default()), 20).unwrap();
    Box::new(DenseRows(m))
}

fn mixture(a: &[Vec<u32>], b: &[Vec<u32>], mixer: Mixer) -> Interpolated {
    Interpolated::new(neural(a), index(b), mixer, 20).unwrap()
}

fn docs() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(0u32..6, 2..30), 1..4)
}

/// A λ model over standardized inputs (mean 0, scale 1) with the given weights, repeated to
/// the number of inputs.
fn lambda_model(weights: &[f64], bias: f64) -> infgram::mix::LambdaModel {
    let inputs = infgram::mix::features::input_names();
    let d = inputs.len();
    infgram::mix::LambdaModel {
        inputs,
        mean: vec![0.0; d],
        scale: vec![1.0; d],
        weights: weights.iter().cycle().take(d).copied().collect(),
        bias,
    }
}

/// Always drafts the same tokens.
struct Fixed(Vec<u32>);

impl Drafter for Fixed {
    fn propose(&mut self, _context: &[u32], max: usize) -> infgram::Result<Draft> {
        let tokens: Vec<u32> = self.0.iter().copied().take(max).collect();
        Ok(Draft {
            confidence: vec![0.99; tokens.len()],
            tokens,
            ..Draft::default()
        })
    }
    fn name(&self) -> &str {
        "fixed"
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every mixed row is a distribution, the same when mixed a few at a time; λ = 1 is the
    /// ∞-gram's row, λ = 0 the neural model's.
    #[test]
    fn rows_are_distributions_and_the_ends_are_the_components(
        a in docs(), b in docs(), text in prop::collection::vec(0u32..6, 1..20),
    ) {
        let mut mix = mixture(&a, &b, Mixer::default());
        let rows = mix.score(&text).unwrap();
        // The same rows asked for a few at a time, as verification asks for them.
        let mut grouped = mixture(&a, &b, Mixer::default());
        let mut some = grouped.score_first(&text, 2, RowForm::Full).unwrap();
        while some.len() < text.len() {
            let more = grouped.score_more(3).unwrap();
            prop_assert!(!more.is_empty(), "rows stopped at {} of {}", some.len(), text.len());
            some.extend(more);
        }
        prop_assert!(grouped.score_more(1).unwrap().is_empty());
        prop_assert_eq!(&some, &rows);
        for row in rows {
            let total: f64 = row.into_dense().iter().map(|&x| (x as f64).exp()).sum();
            prop_assert!((total - 1.0).abs() < 1e-5, "Σ = {}", total);
        }
        let mut one = mixture(&a, &b, Mixer::constant(EstimatorSpec::Infgram, 1.0));
        let mut alone = InfgramModel::new(index(&b), Estimator::Sbis { k: 1, decay: 0.1 }, 20)
            .unwrap()
            .with_vocab(256, 255)
            .unwrap();
        prop_assert_eq!(one.score(&text).unwrap(), alone.score(&text).unwrap());
        let mut zero = mixture(&a, &b, Mixer::constant(EstimatorSpec::Infgram, 0.0));
        let mut n = neural(&a);
        for (m, q) in zero.score(&text).unwrap().iter().zip(n.score(&text).unwrap()) {
            for (x, y) in m.softmax().iter().zip(q.softmax()) {
                prop_assert!((x.1 - y.1).abs() < 1e-6);
            }
        }
    }

    /// The batch API mixes a model's logits as the mixture scorer does: the ∞-gram rows of the
    /// whole text (`ngram::batch`) mixed with the neural model's logits by `mix_rows` equal the
    /// `Interpolated` rows, `mix_targets` their entries at the next tokens, `lambdas` its λ.
    #[test]
    fn batch_mixing_equals_the_mixture_scorer(
        a in docs(), b in docs(), text in prop::collection::vec(0u32..6, 1..20),
        lambda in 0.0f64..=1.0,
    ) {
        use infgram::ngram::batch::{infgram_rows, RowsOptions};
        for mixer in [Mixer::default(), Mixer::constant(EstimatorSpec::Infgram, lambda),
                      Mixer::constant(EstimatorSpec::Infgram, 1.0)] {
            let mut mix = mixture(&a, &b, mixer.clone());
            let want = mix.score(&text).unwrap();
            let mut n = neural(&a);
            let options = RowsOptions {
                estimator: mixer.estimator.clone(),
                window: 20,
                end_token: Some(n.eos_tokens()[0]),
                vocab: Some(n.vocab_size()),
            };
            let rows = infgram_rows(index(&b), &text, &options).unwrap();
            prop_assert_eq!(infgram::mix::lambdas(&rows, &mixer).unwrap(), mix.last_lambdas());
            let neural_rows = n.score(&text).unwrap();
            let mut logits: Vec<f32> =
                neural_rows.iter().flat_map(|r| r.clone().into_dense()).collect();
            infgram::mix::mix_rows(&rows, &mut logits, &mixer).unwrap();
            let vocab = n.vocab_size();
            for (j, w) in want.iter().enumerate() {
                let w = w.clone().into_dense();
                for (id, (x, y)) in logits[j * vocab..(j + 1) * vocab].iter().zip(&w).enumerate() {
                    prop_assert!(
                        x == y || (x - y).abs() < 1e-5,
                        "row {} id {}: {} vs {}", j, id, x, y
                    );
                }
            }
            let targets: Vec<u32> = text[1..].to_vec();
            let neural_lp: Vec<f32> = targets
                .iter()
                .enumerate()
                .map(|(j, &t)| {
                    let d = neural_rows[j].clone().into_dense();
                    d[t as usize] - infgram::lm::log_sum_exp_row(&d) as f32
                })
                .collect();
            let mixed = infgram::mix::mix_targets(&rows, &targets, &neural_lp, &mixer).unwrap();
            for (j, (&t, m)) in targets.iter().zip(&mixed).enumerate() {
                let w = want[j].clone().into_dense()[t as usize];
                prop_assert!(*m == w || (m - w).abs() < 1e-5, "target {}: {} vs {}", j, m, w);
            }
        }
    }

    /// A mixer whose λ reads both models' confidence (a `LambdaModel`): each row's λ is the
    /// model's at the confidence of that row's neural and ∞-gram rows, the rows are
    /// distributions, the batch API's `mix_rows` gives the same rows, and the calls that see
    /// no neural rows (`lambdas`, `mix_targets`) refuse it. Speculative decoding of it equals
    /// plain decoding.
    #[test]
    fn a_lambda_model_reads_both_rows(
        a in docs(), b in docs(), text in prop::collection::vec(0u32..6, 1..20),
        weights in prop::collection::vec(-2.0f64..2.0, 32), bias in -2.0f64..2.0,
    ) {
        use infgram::mix::features::{confidence_of_rows, row_top};
        use infgram::ngram::batch::{infgram_rows, RowsOptions};
        let model = lambda_model(&weights, bias);
        let mixer = Mixer { features: Some(model.clone()), ..Mixer::default() };
        let mut mix = mixture(&a, &b, mixer.clone());
        let rows = mix.score(&text).unwrap();
        let mut n = neural(&a);
        let neural_rows = n.score(&text).unwrap();
        let mut g = InfgramModel::new(index(&b), mixer.estimator.estimator().unwrap(), 20)
            .unwrap()
            .with_vocab(256, 255)
            .unwrap();
        let infgram_rows_ = g.score(&text).unwrap();
        for (j, row) in rows.iter().enumerate() {
            let dense = neural_rows[j].clone().into_dense();
            let c = confidence_of_rows(g.last_evidence()[j], &dense, row_top(&infgram_rows_[j]));
            let lambda = model.lambda(&c);
            prop_assert_eq!(mix.last_lambdas()[j], lambda);
            let want = infgram::mix::mix_row(
                Logits::Dense(dense), infgram_rows_[j].clone(), lambda);
            prop_assert_eq!(row, &want);
            let total: f64 = row.clone().into_dense().iter().map(|&x| (x as f64).exp()).sum();
            prop_assert!((total - 1.0).abs() < 1e-5, "Σ = {}", total);
        }
        let options = RowsOptions {
            estimator: mixer.estimator.clone(),
            window: 20,
            end_token: Some(n.eos_tokens()[0]),
            vocab: Some(n.vocab_size()),
        };
        let batch = infgram_rows(index(&b), &text, &options).unwrap();
        let mut logits: Vec<f32> =
            neural_rows.iter().flat_map(|r| r.clone().into_dense()).collect();
        infgram::mix::mix_rows(&batch, &mut logits, &mixer).unwrap();
        let vocab = n.vocab_size();
        for (j, w) in rows.iter().enumerate() {
            let w = w.clone().into_dense();
            for (x, y) in logits[j * vocab..(j + 1) * vocab].iter().zip(&w) {
                prop_assert!(x == y || (x - y).abs() < 1e-5, "row {}: {} vs {}", j, x, y);
            }
        }
        let e = infgram::mix::lambdas(&batch, &mixer).unwrap_err().to_string();
        prop_assert!(e.contains("mix_rows"), "{}", e);
        prop_assert!(infgram::mix::mix_targets(&batch, &[], &[], &mixer).is_err());
        let cfg = DecodeConfig { max_tokens: 20, draft_max: 8, ..Default::default() };
        let prompt = vec![text[0]];
        let (plain, _) = greedy(&mut mixture(&a, &b, mixer.clone()), &mut [], &prompt, &cfg).unwrap();
        let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(CorpusDrafter::new(index(&b)))];
        let (spec, _) = greedy(&mut mixture(&a, &b, mixer), &mut drafters, &prompt, &cfg).unwrap();
        prop_assert_eq!(spec, plain);
    }

    /// Interpolated perplexity (`score_both`, what `ppl --mix` runs: the ∞-gram's rows from the
    /// level tracker, the neural model's in windows) equals the mixture scorer's probability
    /// of each next token, for the default table and for a λ model.
    #[test]
    fn interpolated_perplexity_is_the_mixture_scorers(
        a in docs(), b in docs(), text in prop::collection::vec(0u32..6, 2..20),
        weights in prop::collection::vec(-1.0f64..1.0, 32),
    ) {
        let model = lambda_model(&weights, -1.0);
        for mixer in [Mixer::default(), Mixer { features: Some(model.clone()), ..Mixer::default() }] {
            let mut mix = mixture(&a, &b, mixer.clone());
            let rows = mix.score(&text).unwrap();
            let want: f64 = rows
                .iter()
                .zip(&text[1..])
                .map(|(r, &t)| r.neg_log_prob(t))
                .sum::<f64>()
                / (text.len() - 1) as f64;
            let scoring = infgram::mix::score_both(
                neural(&a).as_mut(), &index(&b), &text, &mixer.estimator, (64, 32), false,
            ).unwrap();
            let got = scoring.report(&mixer).report.ppl.ln();
            prop_assert!((got - want).abs() < 1e-5, "{} vs {}", got, want);
        }
    }

    /// Greedy speculative decoding of the mixture equals plain greedy decoding of the mixture,
    /// with drafters that copy the ∞-gram's corpus and with a fixed wrong one.
    #[test]
    fn speculative_mixture_equals_plain_mixture(a in docs(), b in docs(), start in 0u32..6) {
        let cfg = DecodeConfig { max_tokens: 30, draft_max: 12, ..Default::default() };
        let prompt = vec![start];
        let (plain, _) = greedy(&mut mixture(&a, &b, Mixer::default()), &mut [], &prompt, &cfg).unwrap();
        let drafter_sets: Vec<Vec<Box<dyn Drafter>>> = vec![
            vec![Box::new(CorpusDrafter::new(index(&b)))],
            vec![Box::new(Fixed(vec![1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]))],
        ];
        for mut drafters in drafter_sets {
            let (spec, _) = greedy(&mut mixture(&a, &b, Mixer::default()), &mut drafters, &prompt, &cfg)
                .unwrap();
            prop_assert_eq!(&spec, &plain);
        }
    }
}

#[test]
fn sampled_speculative_mixture_keeps_the_mixture_distribution() {
    let a = vec![vec![0, 1, 2, 3, 4, 5, 0, 2, 4, 1, 3, 5]];
    let b = vec![vec![1, 2, 1, 2, 1, 3, 1, 2, 5]];
    let mixer = Mixer::constant(EstimatorSpec::Infgram, 0.6);
    let prompt = [1u32];
    // The mixture's row after the prompt.
    let row: Logits = mixture(&a, &b, mixer.clone())
        .score(&prompt)
        .unwrap()
        .remove(0);
    let p = row.softmax();
    let cfg = DecodeConfig {
        max_tokens: 2,
        ..DecodeConfig::default()
    };
    let mut sampler = Sampler::new(
        SamplerConfig {
            temperature: 1.0,
            ..SamplerConfig::default()
        },
        Some(11),
    );
    let runs = 6000;
    let mut observed = vec![0f64; 256];
    let mut mix = mixture(&a, &b, mixer);
    for _ in 0..runs {
        // Drafts "2" (the ∞-gram's favourite) at the first position: accepted or rejected by
        // rejection sampling against the mixture.
        let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(Fixed(vec![2]))];
        let (out, _) = decode(
            &mut mix,
            &mut drafters,
            &mut [],
            &mut sampler,
            &prompt,
            &cfg,
            |_| {},
        )
        .unwrap();
        // An end token (255) first gives an empty output.
        observed[out.first().map_or(255, |&t| t as usize)] += 1.0;
    }
    let cells: Vec<(usize, f64)> = p
        .iter()
        .filter(|x| x.1 * runs as f64 >= 20.0)
        .map(|x| (x.0 as usize, x.1))
        .collect();
    let chi2: f64 = cells
        .iter()
        .map(|&(t, q)| {
            let expected = runs as f64 * q;
            (observed[t] - expected).powi(2) / expected
        })
        .sum();
    // At most 6 degrees of freedom here: P(chi2 > 22.46) = 0.001.
    assert!(cells.len() <= 7, "{cells:?}");
    assert!(
        chi2 < 22.46,
        "chi2 {chi2}: {cells:?} vs {:?}",
        &observed[..6]
    );
}

#[test]
fn bad_mixer_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.json");
    assert!(Mixer::load(&missing).is_err());
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"estimator\": 3}").unwrap();
    let e = Mixer::load(&bad).unwrap_err().to_string();
    assert!(e.contains("not a mixer file"), "{e}");
    let mut m = Mixer::default();
    m.dense[2] = -0.1;
    let out = dir.path().join("m.json");
    m.save(&out).unwrap();
    let e = Mixer::load(&out).unwrap_err().to_string();
    assert!(e.contains("between 0 and 1"), "{e}");
    Mixer::default().save(&out).unwrap();
    assert_eq!(Mixer::load(&out).unwrap(), Mixer::default());
    // A mixer that refuses itself is refused by the mixture too.
    assert!(Interpolated::new(neural(&[vec![1, 2]]), index(&[vec![1, 2]]), m, 20).is_err());
    // A λ model is saved and read back with the table; one for other inputs is refused with
    // what to do, and a file without one (written before it) still reads.
    let model = infgram::mix::LambdaModel::fit(&[]);
    let with = Mixer {
        features: Some(model.clone()),
        ..Mixer::default()
    };
    with.save(&out).unwrap();
    assert_eq!(Mixer::load(&out).unwrap(), with);
    let mut other = model;
    other.inputs[0] = "something_else".into();
    Mixer {
        features: Some(other),
        ..Mixer::default()
    }
    .save(&out)
    .unwrap();
    let e = Mixer::load(&out).unwrap_err().to_string();
    assert!(e.contains("mix fit --features"), "{e}");
    assert!(!serde_json::to_string(&Mixer::default())
        .unwrap()
        .contains("features"));
}
