//! SBIS levels and weights against a brute-force implementation of their definition (the `ngram` module docs, "The estimators") on random
//! corpora; the smoothed distribution sums to 1; seeded generation is reproducible.

use infgram::decode::{decode, DecodeConfig};
use infgram::decode::{Sampler, SamplerConfig};
use infgram::index::levels::{self, LevelFinder};
use infgram::lm::{DenseRows, LanguageModel};
use infgram::ngram::smoothed::{smoothed_distribution, smoothed_prob, Discounts, CLASSES};
use infgram::ngram::{sbis, Estimator, InfgramModel};
use infgram::service::{generate_from_corpus, GenConfig};
use infgram::tokenizer::TokenizerSpec;
use infgram::Index;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The definition of tiny-infini-gram (the reference SBIS implementation), literally: for l = len..1, count the token after every occurrence of
/// the suffix (inside a document); keep a level if its total exceeds the last kept total.
fn brute_levels(docs: &[Vec<u32>], ctx: &[u32], k: i64) -> Vec<(usize, u64, BTreeMap<u32, u64>)> {
    let mut kept = Vec::new();
    let mut prev = 0u64;
    for l in (1..=ctx.len()).rev() {
        let q = &ctx[ctx.len() - l..];
        let mut m = BTreeMap::new();
        for d in docs {
            for i in 0..d.len() {
                if i + l < d.len() && d[i..i + l] == *q {
                    *m.entry(d[i + l]).or_insert(0u64) += 1;
                }
            }
        }
        let total: u64 = m.values().sum();
        if total > prev {
            prev = total;
            kept.push((l, total, m));
            if k >= 0 && kept.len() as i64 >= k {
                break;
            }
        }
    }
    kept
}

fn corpus() -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<u32>, usize)> {
    (
        prop::collection::vec(prop::collection::vec(0u32..3, 0..60), 1..4),
        prop::collection::vec(0u32..3, 0..12),
        1usize..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn levels_match_brute_force((docs, ctx, shards) in corpus(), k in prop_oneof![Just(-1i64), 1i64..4]) {
        for reverse in [true, false] {
            let index = Index::from_docs(TokenizerSpec::synthetic(3), &docs, shards, reverse).unwrap();
            let mut f = LevelFinder::new(false);
            let got = f.levels(&index, &ctx, k, false);
            let want = brute_levels(&docs, &ctx, k);
            prop_assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                prop_assert_eq!(g.len, w.0);
                prop_assert_eq!(g.total, w.1);
                let gm: BTreeMap<u32, u64> = g.counts.iter().copied().collect();
                prop_assert_eq!(&gm, &w.2);
            }
            // SBIS weights: P(x) ∝ Σ_j 0.1^j count_j(x).
            let dist = sbis::sbis_distribution(&got, 0.1);
            let den: f64 = want.iter().enumerate().map(|(j, w)| 0.1f64.powi(j as i32) * w.1 as f64).sum();
            for &(t, p) in &dist {
                let num: f64 = want.iter().enumerate()
                    .map(|(j, w)| 0.1f64.powi(j as i32) * *w.2.get(&t).unwrap_or(&0) as f64).sum();
                prop_assert!((p - num / den).abs() < 1e-12);
                prop_assert!((sbis::sbis_prob(&got, 0.1, t).unwrap() - p).abs() < 1e-12);
            }
            if !dist.is_empty() {
                prop_assert!((dist.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-9);
            }
            // The smoothed estimator is a distribution over the whole vocabulary.
            let all = f.levels_with(&index, &ctx, -1, true, true);
            // Continuation counts: distinct left neighbours (or a document start) per next token.
            // (Over several shards they add up, counting a pair once per shard it occurs in.)
            for lv in all.iter().skip(1).filter(|_| index.shards().len() == 1) {
                let q = &ctx[ctx.len() - lv.len..];
                let mut want: BTreeMap<u32, std::collections::BTreeSet<Option<u32>>> = BTreeMap::new();
                for d in &docs {
                    for i in 0..d.len() {
                        if i + q.len() < d.len() && d[i..i + q.len()] == *q {
                            let prev = i.checked_sub(1).map(|j| d[j]);
                            want.entry(d[i + q.len()]).or_default().insert(prev);
                        }
                    }
                }
                let want: BTreeMap<u32, u64> = want.into_iter().map(|(x, s)| (x, s.len() as u64)).collect();
                let got: BTreeMap<u32, u64> = lv.continuations.as_ref().unwrap().iter().copied().collect();
                prop_assert_eq!(got, want, "continuations of {:?}", q);
            }
            let mut d = Discounts::uniform([0.6, 1.1, 1.7]);
            d.0[0] = [0.3, 0.9, 2.5];
            d.0[CLASSES - 1] = [0.8, 1.5, 2.9];
            let p = smoothed_distribution(&all, &d, 3);
            prop_assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            for (t, &pt) in p.iter().enumerate() {
                prop_assert!(pt > 0.0);
                prop_assert!((smoothed_prob(&all, &d, 3, t as u32) - pt).abs() < 1e-12);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The amortized levels of generation equal levels computed from scratch at every step.
    #[test]
    fn incremental_levels_match_scratch(
        (docs, start, shards) in corpus(),
        steps in prop::collection::vec(0u32..3, 1..40),
        k in prop_oneof![Just(-1i64), 1i64..4],
        window in 2usize..12,
    ) {
        let index = Index::from_docs(TokenizerSpec::synthetic(3), &docs, shards, true).unwrap();
        let mut inc = LevelFinder::new(true);
        let mut scratch = LevelFinder::new(true);
        let mut tracker = levels::Tracker::default();
        let mut ctx = start.clone();
        let mut appended = None;
        for &x in std::iter::once(&u32::MAX).chain(&steps) {
            if x != u32::MAX {
                ctx.push(x);
                appended = Some(x);
            }
            let w = &ctx[ctx.len().saturating_sub(window)..];
            let mut a = Vec::new();
            inc.next_levels_into(&index, &mut tracker, w, appended, k, &mut a);
            let b = scratch.levels(&index, w, k, false);
            prop_assert_eq!(a.len(), b.len());
            for (a, b) in a.iter().zip(&b) {
                prop_assert_eq!((a.len, a.total, &a.counts), (b.len, b.total, &b.counts));
            }
        }
    }
}

#[test]
fn seeded_generation_is_reproducible() {
    let text = "to be or not to be, that is the question; to sleep, perchance to dream";
    let docs = vec![text.bytes().map(u32::from).collect::<Vec<_>>()];
    let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(255), &docs, 1, true).unwrap());
    let cfg = GenConfig {
        cancel: None,
        estimator: Estimator::Sbis { k: -1, decay: 0.1 },
        context: 200,
        max_tokens: 200,
        guard: None,
    };
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig::default(), Some(seed));
        generate_from_corpus(
            index.clone(),
            b"to ".map(u32::from).as_ref(),
            &cfg,
            &mut s,
            |_| {},
        )
        .unwrap()
        .tokens
    };
    assert_eq!(run(7), run(7));
    assert!(
        (0..5).any(|s| run(s) != run(7)),
        "different seeds should differ"
    );
    // Greedy generation follows the corpus.
    let mut g = Sampler::new(
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        },
        None,
    );
    let out = generate_from_corpus(
        index.clone(),
        &b"to be or not".map(u32::from),
        &cfg,
        &mut g,
        |_| {},
    )
    .unwrap();
    let s: String = out.tokens.iter().map(|&t| t as u8 as char).collect();
    assert!(s.starts_with(" to be, that is"), "{s:?}");
    assert!(
        out.hit_end,
        "greedy copying reaches the document end and stops there"
    );
    // An empty prompt and an unseen prompt back off instead of failing.
    let mut s = Sampler::new(SamplerConfig::default(), Some(1));
    assert!(
        !generate_from_corpus(index.clone(), &[], &cfg, &mut s, |_| {})
            .unwrap()
            .tokens
            .is_empty()
    );
    assert!(
        !generate_from_corpus(index.clone(), &[200, 201], &cfg, &mut s, |_| {})
            .unwrap()
            .tokens
            .is_empty()
    );
    // An empty index is an error, not a panic.
    let empty = Index::from_docs(TokenizerSpec::synthetic(255), &[], 1, true).unwrap();
    assert!(generate_from_corpus(Arc::new(empty), &[1], &cfg, &mut s, |_| {}).is_err());
}

#[test]
fn sparse_rows_generate_the_same_text_as_dense_rows() {
    let text = "to be or not to be, that is the question; to sleep, perchance to dream. \
                the rest is silence. to thine own self be true.";
    let docs: Vec<Vec<u32>> = text
        .split(". ")
        .map(|d| d.bytes().map(u32::from).collect())
        .collect();
    let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(255), &docs, 2, true).unwrap());
    let estimators = [
        Estimator::Sbis { k: 2, decay: 0.1 },
        Estimator::Sbis { k: -1, decay: 0.1 },
        Estimator::Smoothed(Discounts::default()),
    ];
    for est in estimators {
        for (seed, temperature, top_p) in [(1, 0.8, 1.0), (2, 1.0, 0.9), (3, 0.0, 1.0)] {
            let sampler = || {
                Sampler::new(
                    SamplerConfig {
                        temperature,
                        top_p,
                        top_k: 0,
                    },
                    Some(seed),
                )
            };
            let mut fed = vec![index.separator()];
            fed.extend(b"to ".map(u32::from));
            let cfg = DecodeConfig {
                max_tokens: 150,
                ..Default::default()
            };
            let run = |model: &mut dyn LanguageModel| {
                let out = decode(model, &mut [], &mut [], &mut sampler(), &fed, &cfg, |_| {});
                out.unwrap().0
            };
            let model = || InfgramModel::new(index.clone(), est.clone(), 50).unwrap();
            let sparse = run(&mut model());
            let dense = run(&mut DenseRows(model()));
            assert_eq!(sparse, dense, "{est:?} seed {seed}");
        }
    }
}

#[test]
fn infgram_model_takes_a_model_vocabulary_with_the_separator_as_end_token() {
    // Tokens 0..3 in documents; the separator (255) is reported as end token 3 of a
    // 4-token vocabulary.
    let docs = vec![vec![0, 1, 2], vec![0, 1, 0, 1, 2]];
    let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(3), &docs, 1, true).unwrap());
    let est = Estimator::Sbis { k: -1, decay: 0.1 };
    let plain = InfgramModel::new(index.clone(), est.clone(), 10).unwrap();
    assert_eq!(plain.vocab_size(), 256);
    assert_eq!(plain.eos_tokens(), &[255]);
    let mut m = InfgramModel::new(index.clone(), est.clone(), 10)
        .unwrap()
        .with_vocab(4, 3)
        .unwrap();
    assert_eq!(m.vocab_size(), 4);
    assert_eq!(m.eos_tokens(), &[3]);
    let rows = m.score(&[3, 0, 1, 2]).unwrap();
    for row in &rows {
        assert_eq!(row.vocab(), 4);
    }
    // After "0 1 2" every document ends: the end token is certain.
    assert_eq!(rows[3].argmax(), Some(3));
    assert!(rows[3].get(3) > -1e-6);
    // The end token read back starts a new document: the context is empty again.
    let again = m.score(&[3]).unwrap();
    assert_eq!(again[0], rows[0]);
    // The dense form of the same rows has exactly 4 logits.
    assert_eq!(m.forward(&[0]).unwrap()[0].len(), 4);
    assert!(InfgramModel::new(index, est, 10)
        .unwrap()
        .with_vocab(3, 3)
        .is_err());
}

/// `n` documents of `len` pseudo-random tokens over 3 ids (a linear congruential generator
/// from `seed`): short contexts have thousands of occurrences.
fn three_token_docs(seed: u64, n: usize, len: usize) -> Vec<Vec<u32>> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % 3) as u32
                })
                .collect()
        })
        .collect()
}

#[test]
fn a_bounded_counts_cache_stays_within_its_budget_and_changes_no_level() {
    // Long documents over 3 tokens: short contexts have thousands of occurrences (cached).
    let docs = three_token_docs(12345, 4, 4000);
    let index = Index::from_docs(TokenizerSpec::synthetic(3), &docs, 2, true).unwrap();
    let capacity = 64;
    let mut bounded = LevelFinder::with_cache_capacity(false, capacity);
    let mut unbounded = LevelFinder::new(false);
    for i in 0..300 {
        let d = &docs[i % 4];
        let ctx = &d[(i * 37) % 3000..][..(i % 7) + 1];
        let a = bounded.levels_with(&index, ctx, -1, true, true);
        let b = unbounded.levels_with(&index, ctx, -1, true, true);
        assert_eq!(a.len(), b.len());
        for (a, b) in a.iter().zip(&b) {
            assert_eq!((a.len, a.total, &a.counts), (b.len, b.total, &b.counts));
            assert_eq!(a.continuations, b.continuations);
        }
        assert!(
            bounded.cache_stats(&index).held <= capacity,
            "{:?}",
            bounded.cache_stats(&index)
        );
    }
    let (s, u) = (bounded.cache_stats(&index), unbounded.cache_stats(&index));
    assert!(s.evicted > 0 && s.hits > 0, "{s:?}");
    assert_eq!(u.evicted, 0);
    assert!(u.hit_rate() > s.hit_rate(), "{u:?} vs {s:?}");
}

/// A level's suffix length, total and next-token counts.
type LevelFacts = (usize, u64, Vec<(u32, u64)>);

#[test]
fn finders_on_one_index_share_its_counts_cache_across_threads() {
    // Short contexts over 3 tokens have thousands of occurrences: their counts are cached.
    let docs = three_token_docs(777, 3, 3000);
    let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(3), &docs, 2, true).unwrap());
    let contexts: Vec<Vec<u32>> = (0..200)
        .map(|i| docs[i % 3][(i * 41) % 2900..][..(i % 6) + 1].to_vec())
        .collect();
    // Each finder with a cache of its own: the answers to hold the shared cache to.
    let expected: Vec<Vec<LevelFacts>> = contexts
        .iter()
        .map(|ctx| {
            LevelFinder::with_cache_capacity(false, 1 << 20)
                .levels(&index, ctx, -1, true)
                .iter()
                .map(|l| (l.len, l.total, l.counts.to_vec()))
                .collect()
        })
        .collect();
    // Four threads at once on the index's shared cache.
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (index, contexts, expected) = (&index, &contexts, &expected);
            scope.spawn(move || {
                let mut finder = LevelFinder::new(false);
                for (i, ctx) in contexts.iter().enumerate().skip(t) {
                    let got: Vec<_> = finder
                        .levels(index, ctx, -1, true)
                        .iter()
                        .map(|l| (l.len, l.total, l.counts.to_vec()))
                        .collect();
                    assert_eq!(got, expected[i], "context {ctx:?}");
                }
            });
        }
    });
    // A new finder (a new generation) finds what the others counted.
    let mut late = LevelFinder::new(false);
    late.levels(&index, &contexts[0], -1, true);
    let stats = late.cache_stats(&index);
    assert!(stats.hits > 0 && stats.misses == 0, "{stats:?}");
    assert!(index.counts_cache().stats().held > 0);
}
