//! The ∞-gram rows of a whole sequence in one call (`ngram::batch::infgram_rows`) equal the
//! query API's `infgram_ntd` of every prefix (brute-force checked elsewhere), on random
//! corpora of one and several shards.

use infgram::index::shards::Shards;
use infgram::ngram::batch::{infgram_rows, rows_over, RowsOptions};
use infgram::ngram::EstimatorSpec;
use infgram::tokenizer::TokenizerSpec;
use infgram::Index;
use proptest::prelude::*;
use std::sync::Arc;

fn check(docs: &[Vec<u32>], tokens: &[u32], shards: usize, window: usize, end: Option<u32>) {
    let per_shard = docs.len().div_ceil(shards).max(1);
    let index =
        Arc::new(Index::from_docs(TokenizerSpec::synthetic(4), docs, per_shard, true).unwrap());
    let sep = index.separator();
    let options = RowsOptions {
        window,
        end_token: end,
        ..RowsOptions::default()
    };
    let rows = match infgram_rows(index.clone(), tokens, &options) {
        Ok(rows) => rows,
        Err(e) => {
            assert_eq!(index.total_tokens(), 0, "{e}");
            return;
        }
    };
    assert_eq!(rows.offsets.len(), tokens.len() + 1);
    // The query protocol's path (a level search a position, over any shards) gives the same
    // rows, for every SBIS estimator.
    for estimator in [
        EstimatorSpec::Infgram,
        EstimatorSpec::sbis(2),
        EstimatorSpec::sbis(-1),
    ] {
        let options = RowsOptions {
            estimator,
            ..options.clone()
        };
        let tracked = infgram_rows(index.clone(), tokens, &options).unwrap();
        let searched = rows_over(&*index, tokens, &options).unwrap();
        assert_eq!(tracked, searched, "{:?}", options.estimator);
    }
    let end_id = end.unwrap_or(sep);
    for j in 0..tokens.len() {
        let doc_start = tokens[..=j]
            .iter()
            .rposition(|&t| t == end_id)
            .map_or(0, |p| p + 1);
        let ctx = &tokens[doc_start.max((j + 1).saturating_sub(window))..=j];
        let want = index.infgram_ntd(ctx, Some(end_id)).unwrap();
        let (a, b) = (rows.offsets[j] as usize, rows.offsets[j + 1] as usize);
        let got: Vec<(u32, f64)> = (a..b)
            .map(|i| (rows.ids[i], (rows.logprobs[i] as f64).exp()))
            .collect();
        let want_rows: Vec<(u32, f64)> = want
            .result_by_token_id
            .iter()
            .map(|(&t, p)| (t, p.cont_cnt as f64 / want.prompt_cnt as f64))
            .collect();
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            want_rows.iter().map(|g| g.0).collect::<Vec<_>>(),
            "ids at {j}: ctx {ctx:?}"
        );
        for (g, w) in got.iter().zip(&want_rows) {
            assert!(
                (g.1 - w.1).abs() < 1e-6,
                "p of {} at {j}: {} vs {}",
                g.0,
                g.1,
                w.1
            );
        }
        assert_eq!(
            Some(rows.suffix_len[j] as usize),
            want.suffix_len,
            "suffix at {j}"
        );
        assert_eq!(rows.count[j], want.prompt_cnt, "count at {j}");
        // Distinct continuations in the index: a document's end is one of them even where the
        // end token is also a token of the text (its row merges the two).
        let distinct = index
            .infgram_ntd(ctx, Some(sep))
            .unwrap()
            .result_by_token_id
            .len();
        assert_eq!(rows.distinct[j] as usize, distinct, "distinct at {j}");
    }
}

fn corpus_and_text() -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<u32>)> {
    let tok = prop_oneof![3 => 0..2u32, 1 => 0..4u32];
    let docs = prop::collection::vec(prop::collection::vec(tok.clone(), 0..30), 1..6);
    let text = prop::collection::vec(tok, 0..40);
    (docs, text)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn rows_are_infgram_ntd_of_every_prefix(
        (docs, text) in corpus_and_text(),
        shards in 1usize..4,
        window in prop_oneof![Just(3usize), Just(200)],
    ) {
        check(&docs, &text, shards, window, None);
        // A neural model's end token: a document's end reported as it, and read back from it
        // (an id of its own, and one the text also has).
        check(&docs, &text, shards, window, Some(7));
        check(&docs, &text, shards, window, Some(3));
    }
}
