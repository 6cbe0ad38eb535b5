//! Shards asked over a wire answer every query type as the in-process index does: the
//! questions and answers of `index::partial` survive JSON (the form the Python package's Ray
//! router carries to its shard actors), and `service::execute` runs over any `Shards`.

use infgram::index::partial::{answer_all, ShardAnswer, ShardInfo, ShardQuery, Shards};
use infgram::service::{execute, Query};
use infgram::tokenizer::{IdsOnly, TokenizerSpec};
use infgram::{Index, Result};
use proptest::prelude::*;
use std::cell::Cell;

/// An index's shards asked through JSON, as a remote router asks them; counts the round trips.
struct Wire<'a> {
    index: &'a Index<Vec<u8>>,
    trips: Cell<usize>,
}

impl Shards for Wire<'_> {
    fn shard_count(&self) -> usize {
        self.index.shard_count()
    }

    fn infos(&self) -> Vec<ShardInfo> {
        self.index.infos()
    }

    fn separator(&self) -> u32 {
        Shards::separator(self.index)
    }

    fn vocab_size(&self) -> usize {
        Shards::vocab_size(self.index)
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>> {
        self.trips.set(self.trips.get() + 1);
        let sent: Vec<(usize, String)> = asks
            .iter()
            .map(|(s, q)| (*s, serde_json::to_string(q).unwrap()))
            .collect();
        let received = sent
            .iter()
            .map(|(s, q)| (*s, serde_json::from_str(q).unwrap()))
            .collect();
        let answers = answer_all(self.index.shards(), received)?;
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
        let index =
            Index::from_docs(TokenizerSpec::synthetic(vocab), docs, per_shard, true).unwrap();
        let wire = Wire {
            index: &index,
            trips: Cell::new(0),
        };
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
        assert!(wire.trips.get() > 0);
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
    let index = Index::from_docs(TokenizerSpec::synthetic(5), &docs, 1, true).unwrap();
    let wire = Wire {
        index: &index,
        trips: Cell::new(0),
    };
    let trips = |request: &str| {
        let before = wire.trips.get();
        answer(&wire, 5, request);
        wire.trips.get() - before
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
