//! Shards asked over a wire answer every query type as the in-process index does: the
//! questions and answers of `index::partial` survive JSON (the form the Python package's Ray
//! router carries to its shard actors), and `service::execute` runs over any `Shards`.

use infgram::decode::{Sampler, SamplerConfig};
use infgram::index::partial::{ShardAnswer, ShardInfo, ShardQuery, Shards, SharedShards};
use infgram::ngram::levels::{levels_over, LevelFinder};
use infgram::ngram::Estimator;
use infgram::service::{
    execute, generate_from_index, generate_over_shards, GenConfig, GuardConfig, Query,
};
use infgram::tokenizer::{IdsOnly, TokenizerSpec};
use infgram::{Error, Index, Result};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An index's shards asked through JSON, as a remote router asks them; counts the round trips
/// and, past `fail_after` of them, fails as a shard that stays down.
struct Wire {
    index: Arc<Index<Vec<u8>>>,
    trips: AtomicUsize,
    fail_after: usize,
}

impl Wire {
    fn new(index: &Arc<Index<Vec<u8>>>) -> Wire {
        Wire {
            index: index.clone(),
            trips: AtomicUsize::new(0),
            fail_after: usize::MAX,
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
            .map(|(s, q)| (*s, serde_json::from_str(q).unwrap()))
            .collect();
        let answers = self.index.ask(received)?;
        Ok(answers
            .iter()
            .map(|a| serde_json::from_str(&serde_json::to_string(a).unwrap()).unwrap())
            .collect())
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

fn corpus_and_queries(vocab: u32) -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<Vec<u32>>)> {
    let tok = prop_oneof![3 => 0..2u32.min(vocab), 1 => 0..vocab + 1];
    let docs = prop::collection::vec(prop::collection::vec(tok.clone(), 0..30), 1..8);
    let qs = prop::collection::vec(prop::collection::vec(tok, 0..5), 1..4);
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
                let key = |l: &infgram::ngram::levels::Level| (l.len, l.total, (*l.counts).clone());
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
        let local = generate_from_index(index.clone(), &prompt, &cfg, &mut sampler(temperature, seed), |_| {});
        let remote = generate_over_shards(wire.clone(), &prompt, &cfg, &mut sampler(temperature, seed), |_| {});
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
            let e = generate_over_shards(
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
    // Only SBIS runs over remote shards.
    let shards: SharedShards = Arc::new(Wire::new(&index));
    let cfg = GenConfig {
        estimator: Estimator::Smoothed(Default::default()),
        ..gen_config(1, None)
    };
    let e = generate_over_shards(shards, &[1], &cfg, &mut sampler(0.0, 1), |_| {}).unwrap_err();
    assert!(e.to_string().contains("SBIS"), "{e}");
}
