//! Shards asked over a wire answer every query type as the in-process index does: the
//! questions and answers of `index::shards` survive JSON (the form the Python package's Ray
//! router carries to its shard actors), and `service::execute` runs over any `Shards`.

use infgram::decode::{Sampler, SamplerConfig};
use infgram::index::levels::LevelFinder;
use infgram::index::shards::{
    levels_over, ShardAnswer, ShardInfo, ShardQuery, Shards, SharedShards,
};
use infgram::ngram::{Estimator, InfgramModel};
use infgram::service::{execute, generate_from_corpus, GenConfig, GuardConfig, Query};
use infgram::tokenizer::{IdsOnly, TokenizerSpec};
use infgram::{Error, Index, Result};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An index's shards asked through JSON, as a remote router asks them; counts the round trips
/// and, past `fail_after` of them, fails as a shard that stays down; with `mutation`, alters
/// one field of one answer on the way back, as a damaged or hostile shard would.
struct Wire {
    index: Arc<Index<Vec<u8>>>,
    trips: AtomicUsize,
    fail_after: usize,
    mutation: Option<Mutation>,
    answers: AtomicUsize,
    /// Suffixes a page of suffix groups covers, in place of the one asked for.
    page: Option<usize>,
}

/// One field of one answer altered: the `answer`-th answer the wire carries, its `leaf`-th
/// number (counted modulo the answer's numbers) set to a value no true answer of the test's
/// small corpora holds, or its kind changed.
#[derive(Clone, Copy, Debug)]
struct Mutation {
    answer: usize,
    leaf: usize,
    how: How,
}

#[derive(Clone, Copy, Debug)]
enum How {
    /// The number set to this value (past every position, document and id of the corpora).
    Set(u64),
    /// A suffix-array range's two ends swapped (where the number is one: another pair of
    /// numbers swapped can be a true answer).
    Swap,
    /// Another kind of answer, its fields kept.
    Kind,
}

impl Mutation {
    /// Applies the mutation to one answer's JSON.
    fn apply(&self, v: &mut serde_json::Value) {
        if let How::Kind = self.how {
            let kinds = [
                "range",
                "suffix",
                "next_counts",
                "matches",
                "levels",
                "pairs",
            ];
            let now = v["answer"].as_str().unwrap_or("").to_string();
            let other = kinds.iter().find(|k| **k != now).unwrap();
            v["answer"] = serde_json::json!(other);
            return;
        }
        let mut leaves = Vec::new();
        number_paths(v, &mut Vec::new(), &mut leaves);
        if leaves.is_empty() {
            return;
        }
        let path = &leaves[self.leaf % leaves.len()];
        match self.how {
            How::Set(x) => {
                let slot = at_path(v, path);
                *slot = if slot.is_f64() {
                    serde_json::json!(x as f64)
                } else {
                    serde_json::json!(x)
                };
            }
            How::Swap => {
                let (last, parent) = path.split_last().unwrap();
                let ranged = ["range", "fwd", "rev"];
                if !parent.last().is_some_and(|k| ranged.contains(&k.as_str())) {
                    return;
                }
                if let serde_json::Value::Array(a) = at_path(v, parent) {
                    let i: usize = last.parse().unwrap();
                    if i + 1 < a.len() {
                        a.swap(i, i + 1);
                    }
                }
            }
            How::Kind => unreachable!(),
        }
    }
}

/// The paths (keys and indexes) of every number in `v`.
fn number_paths(v: &serde_json::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        serde_json::Value::Number(_) => out.push(path.clone()),
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                path.push(i.to_string());
                number_paths(x, path, out);
                path.pop();
            }
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                path.push(k.clone());
                number_paths(x, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn at_path<'v>(v: &'v mut serde_json::Value, path: &[String]) -> &'v mut serde_json::Value {
    path.iter().fold(v, |v, k| match v {
        serde_json::Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        v => &mut v[k.as_str()],
    })
}

impl Wire {
    fn new(index: &Arc<Index<Vec<u8>>>) -> Wire {
        Wire {
            index: index.clone(),
            trips: AtomicUsize::new(0),
            fail_after: usize::MAX,
            mutation: None,
            answers: AtomicUsize::new(0),
            page: None,
        }
    }

    fn trips(&self) -> usize {
        self.trips.load(Ordering::Relaxed)
    }
}

impl Shards for Wire {
    fn shard_count(&self) -> usize {
        self.index.shard_count()
    }

    fn infos(&self) -> Vec<ShardInfo> {
        self.index.infos()
    }

    fn separator(&self) -> u32 {
        Shards::separator(&*self.index)
    }

    fn vocab_size(&self) -> usize {
        Shards::vocab_size(&*self.index)
    }

    fn tokenizer(&self) -> Option<TokenizerSpec> {
        Shards::tokenizer(&*self.index)
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>> {
        if self.trips.fetch_add(1, Ordering::Relaxed) >= self.fail_after {
            return Err(Error::Unavailable("slice 1 did not answer".into()));
        }
        let sent: Vec<(usize, String)> = asks
            .iter()
            .map(|(s, q)| (*s, serde_json::to_string(q).unwrap()))
            .collect();
        let received = sent
            .iter()
            .map(|(s, q)| {
                let mut q: ShardQuery = serde_json::from_str(q).unwrap();
                if let (ShardQuery::SuffixGroups { max_suffixes, .. }, Some(page)) =
                    (&mut q, self.page)
                {
                    *max_suffixes = page;
                }
                (*s, q)
            })
            .collect();
        let answers = self.index.ask(received)?;
        answers
            .iter()
            .map(|a| {
                let mut v = serde_json::to_value(a).unwrap();
                let i = self.answers.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = self.mutation.filter(|m| m.answer == i) {
                    m.apply(&mut v);
                }
                serde_json::from_value(v)
                    .map_err(|e| Error::Unavailable(format!("not a shard answer: {e}")))
            })
            .collect()
    }
}

/// Every query type of the protocol on `q` (and `b`, a second n-gram).
fn requests(q: &[u32], b: &[u32]) -> Vec<String> {
    let (qj, bj) = (
        serde_json::to_string(q).unwrap(),
        serde_json::to_string(b).unwrap(),
    );
    let mut out: Vec<String> = [
        "count",
        "ntd",
        "infgram_ntd",
        "find",
        "longest_match",
        "creativity",
    ]
    .iter()
    .map(|t| format!(r#"{{"query_type": "{t}", "input_ids": {qj}}}"#))
    .collect();
    out.push(format!(
        r#"{{"query_type": "count", "cnf": [[{qj}], [{bj}]], "max_diff_tokens": 3}}"#
    ));
    out.push(format!(
        r#"{{"query_type": "ntd", "input_ids": {qj}, "eos_token_id": 0}}"#
    ));
    if let Some((last, prompt)) = q.split_last() {
        let pj = serde_json::to_string(prompt).unwrap();
        for t in ["prob", "infgram_prob"] {
            out.push(format!(
                r#"{{"query_type": "{t}", "prompt_ids": {pj}, "cont_id": {last}}}"#
            ));
        }
        out.push(format!(
            r#"{{"query_type": "search_docs", "input_ids": {qj}, "maxnum": 3, "max_disp_len": 7}}"#
        ));
        out.push(format!(
            r#"{{"query_type": "search_docs", "cnf": [[{qj}, {bj}]], "maxnum": 2}}"#
        ));
        out.push(format!(
            r#"{{"query_type": "attribute", "input_ids": {qj}, "min_len": 1, "maxnum": 2}}"#
        ));
    }
    for s in 0..3 {
        for at in [0, 3, 40] {
            out.push(format!(
                r#"{{"query_type": "get_doc_by_rank", "s": {s}, "rank": {at}, "input_ids": {qj}}}"#
            ));
            out.push(format!(
                r#"{{"query_type": "get_doc_by_ptr", "s": {s}, "ptr": {at}, "max_disp_len": 5}}"#
            ));
        }
    }
    out
}

/// The answer (or error) as JSON text.
fn answer(shards: &(impl Shards + ?Sized), vocab: usize, request: &str) -> String {
    let tok = IdsOnly { vocab_size: vocab };
    match Query::from_json(request).and_then(|q| execute(shards, &tok, &q)) {
        Ok(a) => a.to_value().to_string(),
        Err(e) => format!("error: {e}"),
    }
}

fn check(docs: &[Vec<u32>], vocab: usize, queries: &[Vec<u32>]) {
    for shards in [1, 2, 3] {
        let per_shard = docs.len().div_ceil(shards).max(1);
        let index = Arc::new(
            Index::from_docs(TokenizerSpec::synthetic(vocab), docs, per_shard, true).unwrap(),
        );
        let wire = Wire::new(&index);
        for (i, q) in queries.iter().enumerate() {
            let b = &queries[(i + 1) % queries.len()];
            for request in requests(q, b) {
                let (here, there) = (
                    answer(&index, vocab, &request),
                    answer(&wire, vocab, &request),
                );
                assert_eq!(here, there, "{request} over {shards} shards");
            }
        }
        assert!(wire.trips() > 0);
    }
}

/// Documents of ids in the vocabulary (`0..vocab`, as every index of a tokenizer holds), and
/// queries that may hold the id past it.
fn corpus_and_queries(vocab: u32) -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<Vec<u32>>)> {
    let tok = prop_oneof![3 => 0..2u32.min(vocab), 1 => 0..vocab];
    let query_tok = prop_oneof![3 => 0..2u32.min(vocab), 1 => 0..vocab + 1];
    let docs = prop::collection::vec(prop::collection::vec(tok, 0..30), 1..8);
    let qs = prop::collection::vec(prop::collection::vec(query_tok, 0..5), 1..4);
    (docs, qs).prop_map(|(docs, mut qs)| {
        for d in docs.iter().filter(|d| d.len() >= 3) {
            qs.push(d[1..d.len().min(4)].to_vec());
        }
        (docs, qs)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn every_query_type_survives_the_wire((docs, qs) in corpus_and_queries(5)) {
        check(&docs, 5, &qs);
    }
}

/// The ∞-gram queries take two rounds, a count one, a document fetch one (to one shard).
#[test]
fn round_trips_per_query() {
    let docs = vec![vec![1, 2, 3, 1, 2], vec![2, 3], vec![1, 2, 4]];
    let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(5), &docs, 1, true).unwrap());
    let wire = Wire::new(&index);
    let trips = |request: &str| {
        let before = wire.trips();
        answer(&wire, 5, request);
        wire.trips() - before
    };
    assert_eq!(trips(r#"{"query_type": "count", "input_ids": [1, 2]}"#), 1);
    assert_eq!(
        trips(r#"{"query_type": "infgram_ntd", "input_ids": [3, 1, 2]}"#),
        2
    );
    assert_eq!(
        trips(r#"{"query_type": "get_doc_by_ptr", "s": 1, "ptr": 0}"#),
        1
    );
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

fn gen_config(k: i64, guard: Option<usize>) -> GenConfig {
    GenConfig {
        estimator: Estimator::Sbis { k, decay: 0.1 },
        context: 50,
        max_tokens: 40,
        guard: guard.map(|max_span| GuardConfig {
            max_span,
            index: None,
            ignore_prompt: false,
        }),
        cancel: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// SBIS levels over the wire are the in-process finder's, and a generation over the wire
    /// (SBIS, with and without the copy guard) is the in-process one, token for token.
    #[test]
    fn generation_over_the_wire_is_the_local_generation(
        (docs, ctxs) in corpus_and_queries(4),
        shards in 1usize..4,
        k in prop_oneof![Just(1i64), Just(2), Just(-1)],
        guard in prop_oneof![Just(None), (1usize..5).prop_map(Some)],
        temperature in prop_oneof![Just(0.0), Just(0.9)],
        seed in 0u64..1000,
    ) {
        let per_shard = docs.len().div_ceil(shards).max(1);
        let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(4), &docs, per_shard, true).unwrap());
        let wire: SharedShards = Arc::new(Wire::new(&index));
        for ctx in &ctxs {
            for include_empty in [false, true] {
                let here = LevelFinder::new(true).levels(&index, ctx, k, include_empty);
                let there = levels_over(&*wire, ctx, k, include_empty, &|_| true).unwrap();
                let key = |l: &infgram::index::levels::Level| (l.len, l.total, (*l.counts).clone());
                prop_assert_eq!(here.iter().map(key).collect::<Vec<_>>(), there.iter().map(key).collect::<Vec<_>>());
            }
        }
        let prompt: Vec<u32> = ctxs[0].iter().copied().filter(|&t| t < 4).collect();
        let cfg = gen_config(k, guard);
        // The tokens, whether it ended by itself and what the guard masked; or the error (an
        // empty index).
        let outcome = |g: Result<infgram::service::Generation>| match g {
            Ok(g) => Ok((g.tokens, g.hit_end, g.guard.map(|s| (s.blocked, s.masked)))),
            Err(e) => Err(e.to_string()),
        };
        let local = generate_from_corpus(index.clone(), &prompt, &cfg, &mut sampler(temperature, seed), |_| {});
        let remote = generate_from_corpus(wire.clone(), &prompt, &cfg, &mut sampler(temperature, seed), |_| {});
        prop_assert_eq!(outcome(local), outcome(remote));
    }
}

/// A shard that stops answering fails the generation (model or guard) with its error: never
/// an unchecked or partial output.
#[test]
fn a_generation_whose_shard_stops_answering_fails() {
    let docs = vec![vec![1, 2, 3, 1, 2, 3, 1, 2], vec![2, 3, 1, 2, 3]];
    let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(4), &docs, 1, true).unwrap());
    for guard in [None, Some(2)] {
        for fail_after in [0, 1, 2] {
            let wire = Wire {
                fail_after,
                ..Wire::new(&index)
            };
            let shards: SharedShards = Arc::new(wire);
            let e = generate_from_corpus(
                shards,
                &[1, 2],
                &gen_config(-1, guard),
                &mut sampler(0.0, 1),
                |_| {},
            )
            .unwrap_err();
            assert!(e.to_string().contains("slice 1 did not answer"), "{e}");
        }
    }
    // The whole-corpus estimators too: the smoothed one's continuation counts and the fixed-
    // order model's counting pass and contexts.
    let classic = infgram::ngram::EstimatorSpec::Mkn { order: 2 };
    for estimator in [
        Estimator::Smoothed(Default::default()),
        classic.estimator().unwrap(),
    ] {
        for fail_after in [0, 1, 2] {
            let wire = Wire {
                fail_after,
                ..Wire::new(&index)
            };
            let cfg = GenConfig {
                estimator: estimator.clone(),
                ..gen_config(-1, None)
            };
            let shards: SharedShards = Arc::new(wire);
            let e = generate_from_corpus(shards, &[1, 2], &cfg, &mut sampler(0.0, 1), |_| {})
                .unwrap_err();
            assert!(e.to_string().contains("slice 1 did not answer"), "{e}");
        }
    }
}

/// The documents as one index in this process and as 3 shards answering over the wire.
fn here_and_there(docs: &[Vec<u32>], vocab: usize) -> (Arc<Index<Vec<u8>>>, SharedShards) {
    let per_shard = docs.len().div_ceil(3).max(1);
    let spec = TokenizerSpec::synthetic(vocab);
    let index = Arc::new(Index::from_docs(spec, docs, per_shard, true).unwrap());
    let wire: SharedShards = Arc::new(Wire::new(&index));
    (index, wire)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Every reader of the corpus, written once over `Shards`, reads 3 shards held elsewhere
    /// as it reads the index in this process: the corpus drafter under both rules, the copy
    /// guard, the ∞-gram's rows (perplexity) and its backoff past masked tokens.
    #[test]
    fn every_reader_reads_shards_elsewhere_as_the_index(
        (docs, ctxs) in corpus_and_queries(4),
        k in prop_oneof![Just(1i64), Just(-1)],
        max_span in 1usize..4,
    ) {
        use infgram::decode::drafters::{CorpusDrafter, CorpusRule};
        use infgram::decode::guard::CopyGuard;
        use infgram::decode::{Drafter, Processor};
        use infgram::lm::{LanguageModel, Logits};
        let (index, wire) = here_and_there(&docs, 4);
        let here: SharedShards = index.clone();
        for rule in [CorpusRule::default(), CorpusRule::MostFrequent] {
            let mut a = CorpusDrafter::with_rule(here.clone(), rule);
            let mut b = CorpusDrafter::with_rule(wire.clone(), rule);
            for ctx in &ctxs {
                let (x, y) = (a.propose(ctx, 6), b.propose(ctx, 6));
                match (x, y) {
                    (Ok(x), Ok(y)) => {
                        prop_assert_eq!(&x.tokens, &y.tokens);
                        prop_assert_eq!(&x.confidence, &y.confidence);
                    }
                    (x, y) => prop_assert_eq!(
                        x.as_ref().err().map(ToString::to_string),
                        y.as_ref().err().map(ToString::to_string),
                        "{:?}", ctx
                    ),
                }
                if let (Ok(x), Ok(y)) = (a.alternatives(ctx, 3), b.alternatives(ctx, 3)) {
                    prop_assert_eq!(x, y);
                }
            }
        }
        let masked = |guard: &mut CopyGuard, ctx: &[u32]| {
            let mut logits = Logits::Dense(vec![0.0; 5]);
            guard.process(ctx, &mut logits);
            (0..5u32).filter(|&t| logits.get(t) == f32::NEG_INFINITY).collect::<Vec<_>>()
        };
        let mut a = CopyGuard::new(here.clone(), max_span);
        let mut b = CopyGuard::new(wire.clone(), max_span);
        a.start(&[]);
        b.start(&[]);
        for ctx in &ctxs {
            // Each context, then grown a token at a time (the guard follows its matches).
            for end in 0..=ctx.len() {
                prop_assert_eq!(masked(&mut a, &ctx[..end]), masked(&mut b, &ctx[..end]));
            }
        }
        let text: Vec<u32> = ctxs.concat();
        let estimator = Estimator::Sbis { k, decay: 0.1 };
        let model = |corpus: &SharedShards| InfgramModel::new(corpus.clone(), estimator.clone(), 20);
        match (model(&here), model(&wire)) {
            (Ok(mut a), Ok(mut b)) => {
                prop_assert_eq!(a.score(&text).unwrap(), b.score(&text).unwrap());
                for ctx in &ctxs {
                    let mask: Vec<u32> = ctx.iter().copied().take(2).collect();
                    prop_assert_eq!(a.backoff(ctx, &mask).unwrap(), b.backoff(ctx, &mask).unwrap());
                }
            }
            (a, b) => prop_assert_eq!(a.err().map(|e| e.to_string()), b.err().map(|e| e.to_string())),
        }
        // Perplexity (with a floor: a position may have no level).
        let ppl = |corpus: &SharedShards| {
            infgram::eval::ngram::perplexity(&**corpus, &text, &estimator, 20, Some(1e-6))
                .map(|r| (r.ppl.to_bits(), r.tokens, r.floored, r.agreement.agree))
                .map_err(|e| e.to_string())
        };
        prop_assert_eq!(ppl(&here), ppl(&wire));
    }
}

/// A draft step chained from the last one (the index here chains) refuses an id outside the
/// vocabulary as a step that searches does: the case that found a chained step reading it
/// unchecked, in an index whose documents hold an id past its tokenizer's vocabulary. Shards
/// elsewhere that answer with such an id are refused at their answer.
#[test]
fn a_chained_draft_step_refuses_an_id_outside_the_vocabulary() {
    use infgram::decode::drafters::{CorpusDrafter, CorpusRule};
    use infgram::decode::Drafter;
    let (index, wire) = here_and_there(&[vec![1, 4, 4]], 4);
    let here: SharedShards = index;
    for rule in [CorpusRule::default(), CorpusRule::MostFrequent] {
        let mut drafter = CorpusDrafter::with_rule(here.clone(), rule);
        assert!(drafter.propose(&[1], 6).is_ok());
        let e = drafter.propose(&[1, 4], 6).unwrap_err().to_string();
        assert!(e.contains("token id 4 is outside"), "{e}");
        let mut drafter = CorpusDrafter::with_rule(wire.clone(), rule);
        let e = drafter.propose(&[1], 6).unwrap_err().to_string();
        assert!(
            e.contains("answered wrongly (token id 4 is outside the vocabulary)"),
            "{e}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// The estimators that read the whole corpus (the smoothed ∞-gram's continuation counts, the
    /// fixed-order models' counting pass and contexts) read 3 shards held elsewhere as the index
    /// of those shards and as one index of the same documents: the same rows, the same
    /// perplexity bits, the same generation.
    #[test]
    fn the_whole_corpus_estimators_read_shards_elsewhere_as_one_index(
        (docs, ctxs) in corpus_and_queries(4),
        order in 1usize..5,
        temperature in prop_oneof![Just(0.0), Just(0.9)],
        seed in 0u64..1000,
    ) {
        use infgram::lm::LanguageModel;
        use infgram::ngram::EstimatorSpec;
        let (index, wire) = here_and_there(&docs, 4);
        let here: SharedShards = index;
        let one: SharedShards =
            Arc::new(Index::from_docs(TokenizerSpec::synthetic(4), &docs, docs.len(), true).unwrap());
        let estimators = [
            Estimator::Smoothed(Default::default()),
            EstimatorSpec::Mkn { order }.estimator().unwrap(),
            EstimatorSpec::AddAlpha { order, alpha: Some(0.5) }.estimator().unwrap(),
        ];
        let text: Vec<u32> = ctxs.concat().into_iter().filter(|&t| t < 4).collect();
        for estimator in estimators {
            let rows = |corpus: &SharedShards| {
                InfgramModel::new(corpus.clone(), estimator.clone(), 20)
                    .and_then(|mut m| m.score(&text))
                    .map(|rows| format!("{rows:?}"))
                    .map_err(|e| e.to_string())
            };
            let want = rows(&one);
            prop_assert_eq!(&rows(&here), &want, "{:?}", estimator);
            prop_assert_eq!(&rows(&wire), &want, "{:?}", estimator);
            let ppl = |corpus: &SharedShards| {
                infgram::eval::ngram::perplexity(&**corpus, &text, &estimator, 20, Some(1e-6))
                    .map(|r| (r.ppl.to_bits(), r.tokens, r.floored))
                    .map_err(|e| e.to_string())
            };
            if !matches!(estimator, Estimator::Classic(_)) {
                prop_assert_eq!(ppl(&wire), ppl(&one));
            }
            let prompt: Vec<u32> = ctxs[0].iter().copied().filter(|&t| t < 4).collect();
            let cfg = GenConfig {
                estimator: estimator.clone(),
                ..gen_config(-1, None)
            };
            let outcome = |corpus: &SharedShards| {
                generate_from_corpus(corpus.clone(), &prompt, &cfg, &mut sampler(temperature, seed), |_| {})
                    .map(|g| (g.tokens, g.hit_end))
                    .map_err(|e| e.to_string())
            };
            prop_assert_eq!(outcome(&wire), outcome(&one));
        }
        // The fixed-order model itself: its counts and discounts.
        for smoothing in [
            infgram::ngram::classic::Smoothing::Mkn { fallback: Some([0.5, 1.0, 1.5]) },
            infgram::ngram::classic::Smoothing::AddAlpha { alpha: 0.0 },
        ] {
            let model = |corpus: &SharedShards| {
                infgram::ngram::classic::ClassicModel::new(&**corpus, order, smoothing.clone())
                    .map(|m| format!("{:?} {:?}", m.stats(), m.discounts()))
                    .map_err(|e| e.to_string())
            };
            prop_assert_eq!(model(&wire), model(&one));
            prop_assert_eq!(model(&here), model(&one));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The counting pass's suffixes, sent by 3 shards as groups a page at a time and merged,
    /// are the index's own walk: the same width, the same keys with the same tokens before
    /// them.
    #[test]
    fn suffix_groups_merged_are_the_index_walk(
        docs in prop::collection::vec(prop::collection::vec(0u32..4, 0..10), 1..8),
        order in 1usize..5,
        page in 1usize..6,
    ) {
        use infgram::index::counting::SuffixFeeds;
        let (index, _) = here_and_there(&docs, 4);
        let walk = |feeds: SuffixFeeds<'_>| {
            let mut seen: Vec<(Vec<u32>, u32, u64)> = Vec::new();
            for feed in feeds.feeds {
                feed(&mut |k: &[u32], l, n| seen.push((k.to_vec(), l, n))).unwrap();
            }
            // Keys come in order; one entry per (key, token before).
            let in_order = seen.windows(2).all(|w| w[0].0 <= w[1].0);
            let mut joined: Vec<(Vec<u32>, u32, u64)> = Vec::new();
            seen.sort();
            for (k, l, n) in seen {
                match joined.last_mut() {
                    Some((k2, l2, m)) if *k2 == k && *l2 == l => *m += n,
                    _ => joined.push((k, l, n)),
                }
            }
            (feeds.width, in_order, joined)
        };
        let here = walk(Shards::suffix_feeds(&*index, order).unwrap());
        // Pages of a few suffixes each (the wire asks for `page`), so groups come in many.
        let wire = Wire { page: Some(page), ..Wire::new(&index) };
        let there = walk(wire.suffix_feeds(order).unwrap());
        prop_assert!(there.1, "merged groups out of key order");
        prop_assert_eq!((here.0, &here.2), (there.0, &there.2));
    }
}

/// The service's scoring (what Python's `Index.perplexity` runs) reads 3 shards held
/// elsewhere as the index: every estimator, the fixed-order models among them, gives the
/// index's report.
#[test]
fn scoring_reads_shards_elsewhere_as_the_index() {
    use infgram::ngram::EstimatorSpec;
    use infgram::service::score::{score_over, Document, ScoreReport, ScoreRequest};
    use infgram::tokenizer::ByteTokenizer;
    let text = "the cat sat on the mat. the dog sat on the log. a cat ate the rat";
    let docs: Vec<Vec<u32>> = text
        .split(". ")
        .map(|d| d.bytes().map(u32::from).collect())
        .collect();
    let (index, wire) = here_and_there(&docs, 255);
    let here: SharedShards = index;
    let score = |corpus: &SharedShards, estimator: EstimatorSpec| {
        let mut req = ScoreRequest::new(vec![Document {
            name: "text".into(),
            text: "the cat sat on the log".into(),
        }]);
        if matches!(estimator, EstimatorSpec::Mkn { .. }) {
            req.discount_fallback = Some(Vec::new());
        }
        (req.estimator, req.floor) = (estimator, Some(1e-6));
        match score_over(&**corpus, &ByteTokenizer, &req) {
            Ok(ScoreReport::Infgram { mut report, .. }) => {
                report.seconds = 0.0;
                Ok(serde_json::to_string(&report).unwrap())
            }
            Ok(ScoreReport::Classic(mut c)) => {
                (c.report.seconds, c.estimate_seconds) = (0.0, 0.0);
                Ok(serde_json::to_string(&c).unwrap())
            }
            Ok(_) => Err("another report".to_string()),
            Err(e) => Err(e.to_string()),
        }
    };
    for estimator in [
        EstimatorSpec::Infgram,
        EstimatorSpec::Sbis {
            k: Some(-1),
            decay: None,
        },
        EstimatorSpec::Smoothed,
        EstimatorSpec::AddAlpha {
            order: 2,
            alpha: None,
        },
        EstimatorSpec::Mkn { order: 3 },
    ] {
        let want = score(&here, estimator.clone());
        assert!(want.is_ok(), "{estimator:?}: {want:?}");
        assert_eq!(score(&wire, estimator), want);
    }
}

/// A model generation with `speculative` drafts from shards held elsewhere as from the index,
/// with the output of plain decoding. (How much is drafted is not compared: the draft policy
/// rests a drafter whose calls cost much next to a step, a timing.)
#[test]
fn a_model_generation_drafts_from_shards_held_elsewhere() {
    use infgram::service::request::{DrafterSpec, GenLimits, Prompt, Sampling};
    use infgram::service::run::{generate, ModelIndex, Resources, RunOptions};
    use infgram::service::GenerateRequest;
    let docs: Vec<Vec<u32>> = (0..9)
        .map(|d| {
            (0..40)
                .map(|i| ((i * (d % 3 + 1) + d) % 7) as u32)
                .collect()
        })
        .collect();
    let (index, wire) = here_and_there(&docs, 8);
    let tok = IdsOnly { vocab_size: 8 };
    let request = |drafters: Vec<DrafterSpec>| {
        GenerateRequest {
            prompt: Prompt::Ids(docs[4][..6].to_vec()),
            scorer: infgram::service::request::Scorer::Model,
            drafters,
            sampling: Sampling {
                temperature: Some(0.0),
                ..Default::default()
            },
            limits: GenLimits {
                max_tokens: Some(30),
                ..Default::default()
            },
            ..Default::default()
        }
        .check(1000)
        .unwrap()
    };
    // The model that verifies: the ∞-gram of the first documents (a real language model).
    let verifier = || {
        let some =
            Arc::new(Index::from_docs(TokenizerSpec::synthetic(8), &docs[..5], 2, true).unwrap());
        InfgramModel::new(some, Estimator::Sbis { k: -1, decay: 0.1 }, 20).unwrap()
    };
    let run = |drafting: Option<SharedShards>, drafters: Vec<DrafterSpec>| {
        let mut model = verifier();
        let mut res = Resources::model(&mut model, &tok, "infgram").drafting_index(
            drafting.map(|d| ModelIndex::elsewhere(d, &tok, &tok).unwrap()),
            None,
        );
        generate(&request(drafters), &mut res, &RunOptions::default(), |_| {}).unwrap()
    };
    let plain = run(None, vec![]);
    let local = run(Some(index.clone()), vec![DrafterSpec::Corpus]);
    let remote = run(Some(wire.clone()), vec![DrafterSpec::Corpus]);
    assert_eq!(local.token_ids, plain.token_ids);
    assert_eq!(remote.token_ids, plain.token_ids);
    let stats = remote.stats.as_ref().unwrap();
    assert!(stats.accepted > 0, "{stats:?}");
}

/// Every reader of the corpus over `shards`, one outcome each (an answer, or "error: …"): the
/// query types, generation (SBIS with the guard, the smoothed estimator), the ∞-gram's rows,
/// the corpus drafter, a fixed-order model and perplexity.
fn every_reader(shards: &SharedShards, queries: &[Vec<u32>], vocab: usize) -> Vec<String> {
    use infgram::decode::drafters::{CorpusDrafter, CorpusRule};
    use infgram::decode::Drafter;
    use infgram::lm::LanguageModel;
    fn shown<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Ok(x) => format!("{x:?}"),
            Err(e) => format!("error: {e}"),
        }
    }
    let mut out = Vec::new();
    for (i, q) in queries.iter().enumerate() {
        for request in requests(q, &queries[(i + 1) % queries.len()]) {
            out.push(answer(&**shards, vocab, &request));
        }
    }
    let prompt: Vec<u32> = queries[0]
        .iter()
        .copied()
        .filter(|&t| t < vocab as u32)
        .collect();
    let text: Vec<u32> = queries
        .concat()
        .into_iter()
        .filter(|&t| t < vocab as u32)
        .collect();
    for (estimator, guard) in [
        (Estimator::Sbis { k: -1, decay: 0.1 }, Some(2)),
        (Estimator::Smoothed(Default::default()), None),
    ] {
        let cfg = GenConfig {
            estimator: estimator.clone(),
            max_tokens: 12,
            ..gen_config(-1, guard)
        };
        for temperature in [0.0, 0.9] {
            let g = generate_from_corpus(
                shards.clone(),
                &prompt,
                &cfg,
                &mut sampler(temperature, 7),
                |_| {},
            );
            out.push(shown(g.map(|g| (g.tokens, g.hit_end))));
        }
        let rows = InfgramModel::new(shards.clone(), estimator.clone(), 20)
            .and_then(|mut m| m.score(&text));
        out.push(shown(rows));
        let ppl = infgram::eval::ngram::perplexity(&**shards, &text, &estimator, 20, Some(1e-6));
        out.push(shown(ppl.map(|r| (r.ppl.to_bits(), r.tokens, r.floored))));
    }
    for rule in [CorpusRule::default(), CorpusRule::MostFrequent] {
        let mut drafter = CorpusDrafter::with_rule(shards.clone(), rule);
        for q in queries {
            out.push(shown(
                drafter.propose(q, 6).map(|d| (d.tokens, d.confidence)),
            ));
            out.push(shown(drafter.alternatives(q, 3)));
        }
    }
    let smoothing = infgram::ngram::classic::Smoothing::Mkn {
        fallback: Some([0.5, 1.0, 1.5]),
    };
    let model = infgram::ngram::classic::ClassicModel::new(&**shards, 3, smoothing);
    out.push(shown(
        model.map(|m| format!("{:?} {:?}", m.stats(), m.discounts())),
    ));
    out
}

/// Runs `f` on a thread of its own: its value, or what went wrong (a panic, or no answer
/// within `limit`: a hang).
fn bounded<T: Send + 'static>(
    limit: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(r.map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        }));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(x)) => Ok(x),
        Ok(Err(panic)) => Err(format!("panicked: {panic}")),
        Err(_) => Err(format!("no answer within {limit:?}: a hang")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    /// A shard's answer altered in one field (a number past every position, document and id,
    /// a range's ends swapped, another kind of answer) never hangs a reader and never panics
    /// it: each reader gives its true outcome or an error.
    #[test]
    fn a_wrong_answer_is_an_error_never_a_hang_a_panic_or_a_wrong_number(
        (docs, qs) in corpus_and_queries(5),
        shards in 1usize..4,
        answer in any::<prop::sample::Index>(),
        leaf in 0usize..64,
        how in prop_oneof![
            Just(How::Set(999_999)),
            Just(How::Set(1 << 32)),
            Just(How::Set(u64::MAX)),
            Just(How::Swap),
            Just(How::Kind),
        ],
    ) {
        let per_shard = docs.len().div_ceil(shards).max(1);
        let index = Arc::new(Index::from_docs(TokenizerSpec::synthetic(5), &docs, per_shard, true).unwrap());
        // Pages of 4 suffixes, so that a counting pass's merge reads several.
        let clean = Arc::new(Wire { page: Some(4), ..Wire::new(&index) });
        let shared: SharedShards = clean.clone();
        let truth = every_reader(&shared, &qs, 5);
        let carried = clean.answers.load(Ordering::Relaxed).max(1);
        let mutation = Mutation { answer: answer.index(carried), leaf, how };
        let wire: SharedShards = Arc::new(Wire { mutation: Some(mutation), page: Some(4), ..Wire::new(&index) });
        let limit = std::time::Duration::from_secs(60);
        let seen = bounded(limit, move || every_reader(&wire, &qs, 5));
        let seen = seen.map_err(|e| TestCaseError::fail(format!("{mutation:?}: {e}")))?;
        prop_assert_eq!(seen.len(), truth.len());
        let short = |s: &str| s.chars().take(300).collect::<String>();
        for (got, want) in seen.iter().zip(&truth) {
            prop_assert!(got == want || got.starts_with("error: "), "{:?}: {} instead of {}", mutation, short(got), short(want));
        }
    }
}
