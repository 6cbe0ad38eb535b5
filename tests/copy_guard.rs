//! The copy guard and attribution against brute force on small random corpora: for every L and
//! every way of generating (SBIS at several k, the smoothed estimator as a dense full-vocabulary
//! scorer, greedy and sampled, speculative with adversarial drafters), no span longer than L of
//! the guarded text occurs in the corpus; the guard changes nothing when it never has to act;
//! speculative + guard equals plain + guard; attribution's spans, counts and documents and the
//! L-uniqueness are those of a brute-force search.

use infgram::decode::drafters::CorpusDrafter;
use infgram::decode::guard::CopyGuard;
use infgram::decode::{decode, DecodeConfig, Draft, Drafter, Processor, Sampler, SamplerConfig};
use infgram::eval::attribution::{attribute, creativity};
use infgram::lm::DenseRows;
use infgram::ngram::{Estimator, InfgramModel};
use infgram::service::{generate_from_corpus, GenConfig, GuardConfig, GuardReport};
use infgram::tokenizer::TokenizerSpec;
use infgram::Index;
use proptest::prelude::*;
use std::sync::Arc;

/// Occurrences of `q` inside the documents.
fn brute_count(docs: &[Vec<u32>], q: &[u32]) -> u64 {
    docs.iter()
        .map(|d| d.windows(q.len()).filter(|w| *w == q).count() as u64)
        .sum()
}

/// The longest span of `text` ending at one of the positions `from..` that occurs.
fn longest_copied(docs: &[Vec<u32>], text: &[u32], from: usize) -> usize {
    let mut best = 0;
    for j in from..text.len() {
        for i in (0..=j).rev() {
            if brute_count(docs, &text[i..=j]) == 0 {
                break;
            }
            best = best.max(j + 1 - i);
        }
    }
    best
}

fn corpus() -> impl Strategy<Value = (usize, Vec<Vec<u32>>)> {
    (3usize..6).prop_flat_map(|v| {
        (
            Just(v),
            prop::collection::vec(prop::collection::vec(0..v as u32, 1..40), 1..4),
        )
    })
}

fn estimators() -> Vec<Estimator> {
    vec![
        Estimator::Sbis { k: 1, decay: 0.1 },
        Estimator::Sbis { k: 2, decay: 0.1 },
        Estimator::Sbis { k: -1, decay: 0.1 },
        Estimator::Smoothed(Default::default()),
    ]
}

fn sampler(temperature: f64, seed: u64) -> Sampler {
    Sampler::new(
        SamplerConfig {
            temperature,
            ..Default::default()
        },
        Some(seed),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Generation from the index alone, every estimator, greedy and sampled, the prompt counting
    /// or not: no span longer than L occurs.
    #[test]
    fn guarded_generation_never_copies_more_than_l(
        (vocab, docs) in corpus(),
        l in 1usize..6,
        prompt_len in 0usize..6,
        seed in 0u64..1000,
        ignore_prompt in any::<bool>(),
    ) {
        let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(vocab), &docs, 2, true).unwrap());
        // The prompt: the start of a document (a copy to begin with).
        let prompt: Vec<u32> = docs[0].iter().copied().take(prompt_len).collect();
        for estimator in estimators() {
            for temperature in [0.0, 0.8] {
                let cfg = GenConfig {
                    cancel: None,
                    estimator: estimator.clone(),
                    context: 50,
                    max_tokens: 60,
                    guard: Some(GuardConfig { max_span: l, index: None, ignore_prompt }),
                };
                let g = generate_from_corpus(index.clone(), &prompt, &cfg, &mut sampler(temperature, seed), |_| {})
                    .unwrap();
                let (text, from) = if ignore_prompt {
                    (g.tokens.clone(), 0)
                } else {
                    ([prompt.clone(), g.tokens.clone()].concat(), prompt.len())
                };
                let copied = longest_copied(&docs, &text, from);
                prop_assert!(copied <= l, "{estimator:?} T={temperature}: copied {copied} > {l}");
                let report = GuardReport::measure(g.guard, &*index, &g.tokens).unwrap();
                prop_assert_eq!(report.max_copied_span, longest_copied(&docs, &g.tokens, 0));
            }
        }
    }

    /// A guard that never has to act (L longer than any document) changes nothing.
    #[test]
    fn an_idle_guard_changes_nothing((vocab, docs) in corpus(), seed in 0u64..1000) {
        let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(vocab), &docs, 2, true).unwrap());
        let prompt = vec![docs[0][0]];
        for estimator in estimators() {
            let cfg = GenConfig { cancel: None, estimator, context: 50, max_tokens: 80, guard: None };
            let plain = generate_from_corpus(index.clone(), &prompt, &cfg, &mut sampler(0.8, seed), |_| {}).unwrap();
            let guarded_cfg = GenConfig { guard: Some(GuardConfig::new(100)), ..cfg };
            let guarded = generate_from_corpus(index.clone(), &prompt, &guarded_cfg, &mut sampler(0.8, seed), |_| {})
                .unwrap();
            prop_assert_eq!(&plain.tokens, &guarded.tokens);
            prop_assert_eq!(guarded.guard.unwrap().blocked, 0);
        }
    }

    /// A dense scorer over the whole vocabulary (as a neural model gives), plain and
    /// speculative, drafting from the guarded corpus itself (the most adversarial drafter: it
    /// proposes exactly the copies the guard forbids) and from a fixed wrong script: the same
    /// text, and no span longer than L.
    #[test]
    fn speculative_with_guard_equals_plain_with_guard(
        (vocab, docs) in corpus(),
        l in 1usize..5,
        start in 0usize..3,
    ) {
        let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(vocab), &docs, 1, true).unwrap());
        let prompt: Vec<u32> = docs[0].iter().copied().skip(start).take(4).collect();
        prop_assume!(!prompt.is_empty());
        let cfg = DecodeConfig { max_tokens: 40, draft_max: 6, ..Default::default() };
        let run = |drafters: &mut [Box<dyn Drafter>]| {
            let model = InfgramModel::new(index.clone(), Estimator::Smoothed(Default::default()), 50)
                .unwrap();
            let mut model = DenseRows(model);
            let mut processors: Vec<Box<dyn Processor>> = vec![Box::new(CopyGuard::new(index.clone(), l))];
            decode(&mut model, drafters, &mut processors, &mut Sampler::greedy(), &prompt, &cfg, |_| {})
                .unwrap()
                .0
        };
        let plain = run(&mut []);
        let copying: Vec<Box<dyn Drafter>> = vec![Box::new(CorpusDrafter::new(index.clone()))];
        let wrong: Vec<Box<dyn Drafter>> = vec![Box::new(Fixed(vec![0, 1, 2, 0, 1, 2]))];
        for mut drafters in [copying, wrong] {
            prop_assert_eq!(&run(&mut drafters), &plain);
        }
        let text = [prompt.clone(), plain.clone()].concat();
        prop_assert!(longest_copied(&docs, &text, prompt.len()) <= l);
    }

    /// Attribution: every maximal occurring span of at least `min_len` tokens, with its count
    /// and documents that contain it; L-uniqueness and `rs` as brute force finds them.
    #[test]
    fn attribution_and_creativity_match_brute_force(
        (vocab, docs) in corpus(),
        text in prop::collection::vec(0u32..6, 0..30),
        min_len in 1usize..4,
        max_docs in 1usize..4,
    ) {
        let text: Vec<u32> = text.into_iter().map(|t| t % vocab as u32).collect();
        let index = Index::from_docs(TokenizerSpec::synthetic(vocab), &docs, 2, true).unwrap();
        let spans = attribute(&index, &text, min_len, max_docs, 20).unwrap();
        // Brute force: maximal occurring spans.
        let occurs = |a: usize, b: usize| brute_count(&docs, &text[a..b]) > 0;
        let mut want = Vec::new();
        for a in 0..text.len() {
            for b in a + min_len..=text.len() {
                let maximal = occurs(a, b)
                    && (a == 0 || !occurs(a - 1, b))
                    && (b == text.len() || !occurs(a, b + 1));
                if maximal {
                    want.push((a, b));
                }
            }
        }
        let got: Vec<(usize, usize)> = spans.iter().map(|s| (s.l, s.r)).collect();
        prop_assert_eq!(got, want);
        for s in &spans {
            let span = &text[s.l..s.r];
            prop_assert_eq!(s.count, brute_count(&docs, span));
            let containing = docs.iter().filter(|d| brute_count(&[d.to_vec()], span) > 0).count();
            prop_assert_eq!(s.docs.len(), containing.min(max_docs));
            for d in &s.docs {
                let shown = &d.token_ids[d.needle_offset..d.needle_offset + span.len()];
                prop_assert_eq!(shown, span);
            }
            let mut ids: Vec<u64> = s.docs.iter().map(|d| d.doc_ix).collect();
            ids.dedup();
            prop_assert_eq!(ids.len(), s.docs.len());
        }
        // Creativity: token i is covered at n when an occurring span of ≥ n tokens holds it.
        let c = creativity(&index, &text, 1, 6).unwrap();
        for &(n, u) in &c.uniqueness {
            let covered = (0..text.len())
                .filter(|&i| {
                    (0..=i).any(|a| (i + 1..=text.len()).any(|b| b - a >= n && occurs(a, b)))
                })
                .count();
            let want = if text.is_empty() { 1.0 } else { 1.0 - covered as f64 / text.len() as f64 };
            prop_assert!((u - want).abs() < 1e-12, "n={}: {} vs {}", n, u, want);
        }
        for (i, &r) in c.rs.iter().enumerate() {
            let want = (i..=text.len()).rev().find(|&b| b == i || occurs(i, b)).unwrap();
            prop_assert_eq!(r, want);
        }
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

#[test]
fn edge_cases() {
    let docs = vec![vec![1, 2, 3, 4], vec![2, 3, 5]];
    let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(6), &docs, 1, true).unwrap());
    // L = 0 is refused with a message.
    let cfg = GenConfig {
        cancel: None,
        estimator: Estimator::Sbis { k: -1, decay: 0.1 },
        context: 50,
        max_tokens: 10,
        guard: Some(GuardConfig::new(0)),
    };
    let e = generate_from_corpus(index.clone(), &[1], &cfg, &mut Sampler::greedy(), |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("at least 1"), "{e}");
    // The corpus is all copies: with L = 1 the guard leaves SBIS nothing but other tokens, and
    // generation either finds one or stops, never copying two tokens.
    let cfg = GenConfig {
        cancel: None,
        guard: Some(GuardConfig::new(1)),
        ..cfg
    };
    let g =
        generate_from_corpus(index.clone(), &[1], &cfg, &mut Sampler::greedy(), |_| {}).unwrap();
    let text = [vec![1], g.tokens.clone()].concat();
    assert!(longest_copied(&docs, &text, 1) <= 1, "{text:?}");
    // Empty text: nothing to attribute, uniqueness 1.
    assert!(attribute(&*index, &[], 1, 3, 10).unwrap().is_empty());
    let c = creativity(&*index, &[], 2, 3).unwrap();
    assert_eq!(c.uniqueness, vec![(2, 1.0), (3, 1.0)]);
    assert!(attribute(&*index, &[1, 2], 0, 3, 10).is_err());
    assert!(creativity(&*index, &[1, 2], 3, 2).is_err());
    // One span in two documents.
    let spans = attribute(&*index, &[0, 2, 3, 0], 2, 5, 10).unwrap();
    assert_eq!(spans.len(), 1);
    assert_eq!((spans[0].l, spans[0].r, spans[0].count), (1, 3, 2));
    assert_eq!(spans[0].docs.len(), 2);
}

/// An attribution shows at most `ATTRIBUTION_TOKEN_BUDGET` tokens of documents, whatever the
/// documents per span and the window length asked for; the spans past the budget say that
/// their documents were cut (one small request made a 150 MB answer).
#[test]
fn attribution_answers_are_bounded() {
    use infgram::eval::attribution::ATTRIBUTION_TOKEN_BUDGET;
    let mut x = 7u64;
    let doc: Vec<u32> = (0..1000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 50) as u32
        })
        .collect();
    let docs = vec![doc.clone(); 300];
    let index = Index::from_docs(TokenizerSpec::synthetic(60), &docs, 100, true).unwrap();
    // 40 segments of 12 tokens of the document, each ended by an id the index does not hold.
    let text: Vec<u32> = (0..40)
        .flat_map(|i| doc[i * 20..i * 20 + 12].iter().copied().chain([59]))
        .collect();
    let spans = attribute(&index, &text, 8, 300, 10_000).unwrap();
    assert_eq!(spans.len(), 40);
    let shown: usize = spans.iter().flat_map(|s| &s.docs).map(|d| d.disp_len).sum();
    assert!(shown <= ATTRIBUTION_TOKEN_BUDGET, "{shown}");
    assert!(spans[0].docs.len() > 200, "{}", spans[0].docs.len());
    assert!(spans[39].docs.is_empty() && spans[39].docs_cut);
    assert!(spans.iter().all(|s| s.count == 300));
}
