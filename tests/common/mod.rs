//! Helpers shared by the neural-model tests.
// Each test file that includes this module uses some of its helpers.
#![allow(dead_code)]

use infgram::lm::{argmax, neg_log_prob, LanguageModel, Logits, RowForm};

/// The `infgram` binary with `args`, in the tests' environment: a cache of their own, the
/// models where the library fetches them.
pub fn infgram_command(args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"));
    c.args(args)
        .env(
            "INFGRAM_CACHE",
            std::env::temp_dir().join("infgram-test-cache"),
        )
        .env("INFGRAM_MODELS", infgram::assets::models_dir());
    c
}

/// Mean −ln p of `ids[1..]` given the logits of a full pass over `ids`.
pub fn mean_loss(logits: &[Vec<f32>], ids: &[u32]) -> f64 {
    let nll: f64 = (1..ids.len())
        .map(|t| neg_log_prob(&logits[t - 1], ids[t]))
        .sum();
    nll / (ids.len() - 1) as f64
}

/// Two passes over the same text agree as two implementations of one model should when one of
/// them quantizes activations to 8 bits (which flips near-ties): the text's loss within 2%, and
/// the same top-1 token at ≥ 80% of positions. Returns the two losses.
pub fn assert_same_model(
    got: &[Vec<f32>],
    want: &[Vec<f32>],
    ids: &[u32],
    what: &str,
) -> (f64, f64) {
    let (ours, theirs) = (mean_loss(got, ids), mean_loss(want, ids));
    assert!(
        (ours / theirs - 1.0).abs() < 0.02,
        "{what}: loss {ours} vs {theirs}"
    );
    let agree = got
        .iter()
        .zip(want)
        .filter(|(g, w)| argmax(g) == argmax(w))
        .count();
    assert!(
        agree * 10 >= ids.len() * 8,
        "{what}: top-1 agrees at {agree}/{}",
        ids.len()
    );
    (ours, theirs)
}

/// `infgram gen --model MODEL ARGS… --temperature 0 --json`, which must succeed; its JSON.
pub fn greedy_gen_json(model: &str, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["gen", "--model", model])
        .args(args)
        .args(["--temperature", "0", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Scores `ids` after the cached tokens as the decode loop does: the first `first` rows, then
/// as many again as it has until every row came. Checks that the rows then stop.
pub fn rows_in_groups(model: &mut dyn LanguageModel, ids: &[u32], first: usize) -> Vec<Logits> {
    let mut rows = model.score_first(ids, first, RowForm::Full).unwrap();
    assert!(!rows.is_empty() && rows.len() <= ids.len());
    while rows.len() < ids.len() {
        let more = model.score_more(rows.len()).unwrap();
        assert!(
            !more.is_empty(),
            "the rows stopped at {} of {}",
            rows.len(),
            ids.len()
        );
        rows.extend(more);
    }
    assert_eq!(rows.len(), ids.len());
    assert!(model.score_more(1).unwrap().is_empty());
    rows
}
