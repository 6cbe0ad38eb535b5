//! Mixing a user's own neural model with the ∞-gram rows of a sequence
//! ([`crate::ngram::batch::infgram_rows`]) by a [`Mixer`], outside infgram's decode loop: the
//! whole next-token distribution at every position ([`mix_rows`], for sampling or for a
//! model's loss) or only the actual next token's probability ([`mix_targets`], for
//! perplexity). The arithmetic is the one the [`super::Interpolated`] scorer runs. A mixer
//! whose λ reads the neural model's confidence ([`super::LambdaModel`]) mixes whole rows only.

use super::features::{confidence_of_rows, top_of_logprobs};
use super::Mixer;
use crate::error::{Error, Result};
use crate::ngram::batch::Rows;
use crate::ngram::{Estimator, EstimatorSpec};
use rayon::prelude::*;

/// Whether two specs name the same computation (`infgram` is SBIS with one level).
fn same_estimator(a: &EstimatorSpec, b: &EstimatorSpec) -> bool {
    match (a.estimator(), b.estimator()) {
        (Ok(Estimator::Sbis { k: k1, decay: d1 }), Ok(Estimator::Sbis { k: k2, decay: d2 })) => {
            // One level has no decay to apply.
            k1 == k2 && (d1 == d2 || k1 == 1)
        }
        _ => a == b,
    }
}

fn spec_json(spec: &EstimatorSpec) -> String {
    serde_json::to_string(spec).expect("a spec serializes")
}

/// Refuses rows the mixer was not fitted for.
fn check_rows(rows: &Rows, mixer: &Mixer) -> Result<()> {
    mixer.check()?;
    if !same_estimator(&rows.estimator, &mixer.estimator) {
        return Err(Error::input(format!(
            "the rows come from the estimator {} but the mixer was fitted for {}: compute \
             the rows with the mixer's estimator",
            spec_json(&rows.estimator),
            spec_json(&mixer.estimator)
        )));
    }
    Ok(())
}

/// Refuses a mixer whose λ reads the neural model's confidence where only the ∞-gram's rows
/// (or the neural model's probability of one token) are given.
fn check_table_only(mixer: &Mixer, what: &str) -> Result<()> {
    if mixer.reads_neural() {
        return Err(Error::input(format!(
            "this mixer's λ reads the neural model's confidence (its `features` model), so {what} \
             cannot compute it: mix the model's whole logits with mix_rows, or use a mixer \
             fitted without --features"
        )));
    }
    Ok(())
}

/// λ at every row (a mixer with a λ model needs the neural rows: [`mix_rows`]).
pub fn lambdas(rows: &Rows, mixer: &Mixer) -> Result<Vec<f64>> {
    check_rows(rows, mixer)?;
    check_table_only(mixer, "the ∞-gram rows alone")?;
    Ok((0..rows.len())
        .map(|j| mixer.lambda(&rows.evidence(j)))
        .collect())
}

/// The mixture's log-probabilities `ln(λ·P∞ + (1 − λ)·softmax(logits))` of every id at every
/// row, from a neural model's logits (`rows.len()` rows of `vocab` values each, row-major, any
/// scale: each row is normalized here), in place. Every id of the rows must be below `vocab`
/// (compute the rows with the model's vocabulary).
pub fn mix_rows(rows: &Rows, logits: &mut [f32], mixer: &Mixer) -> Result<()> {
    check_rows(rows, mixer)?;
    let n = rows.len();
    if n == 0 {
        return if logits.is_empty() {
            Ok(())
        } else {
            Err(Error::input("no rows to mix the logits with"))
        };
    }
    if !logits.len().is_multiple_of(n) || logits.is_empty() {
        return Err(Error::input(format!(
            "{} logits are not {n} rows of the same vocabulary: give one row per position",
            logits.len()
        )));
    }
    let vocab = logits.len() / n;
    if let Some(&id) = rows.ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::input(format!(
            "the ∞-gram rows hold id {id}, outside the model's {vocab} logits: compute the rows \
             with the model's vocabulary size (vocab) and end token"
        )));
    }
    logits
        .par_chunks_mut(vocab)
        .enumerate()
        .for_each(|(j, row)| {
            let (ids, lps) = rows.row(j);
            let lambda = match &mixer.features {
                None => mixer.lambda(&rows.evidence(j)),
                Some(model) => {
                    let top = top_of_logprobs(ids.iter().copied().zip(lps.iter().copied()));
                    model.lambda(&confidence_of_rows(rows.evidence(j), row, top))
                }
            };
            super::mix_in_place(row, ids.iter().copied().zip(lps.iter().copied()), lambda);
        });
    Ok(())
}

/// The mixture's log-probability of each actual next token: `ln(λ·P∞(t) + (1 − λ)·q)`, where
/// `targets[j]` is the token row `j` scores (`tokens[j + 1]`) and `neural_logprobs[j]` the
/// neural model's normalized ln q of it. `targets` may be one shorter than the rows (the last
/// row scores the token after the sequence).
pub fn mix_targets(
    rows: &Rows,
    targets: &[u32],
    neural_logprobs: &[f32],
    mixer: &Mixer,
) -> Result<Vec<f32>> {
    check_rows(rows, mixer)?;
    check_table_only(
        mixer,
        "the neural model's probability of the next token alone",
    )?;
    if targets.len() != neural_logprobs.len() || targets.len() > rows.len() {
        return Err(Error::input(format!(
            "{} targets, {} neural log-probabilities and {} rows: give one target and one \
             log-probability per row (the last row may go without)",
            targets.len(),
            neural_logprobs.len(),
            rows.len()
        )));
    }
    Ok(targets
        .iter()
        .zip(neural_logprobs)
        .enumerate()
        .map(|(j, (&t, &lq))| {
            let lambda = mixer.lambda(&rows.evidence(j));
            let p = (rows.logprob(j, t) as f64).exp();
            let q = (lq as f64).exp();
            (lambda * p + (1.0 - lambda) * q).ln() as f32
        })
        .collect())
}
