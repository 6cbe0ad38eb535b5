//! A smoothed ∞-gram estimator: interpolated absolute discounting across *all* levels of the
//! context (every distinct suffix count, longest first, down to the unigram level), ending in
//! a uniform distribution over the vocabulary. Its probabilities are never zero, so its
//! perplexity is finite without a floor.
//!
//! From the shortest level up: `P_j(x) = max(c_j(x) − D(c_j(x)), 0) / T_j + γ_j · P_{j+1}(x)`.
//! As in Kneser–Ney, `c_j` is the plain count only for the longest level; every shorter level
//! uses *continuation counts* (for each next token, the number of distinct tokens seen just
//! before the context): a lower level only speaks for continuations the longer ones have not
//! seen, and what matters there is in how many different contexts a token follows.
//! with `γ_j = Σ_x D(c_j(x)) [c_j(x) > 0] / T_j`, and `D(c) = d1, d2 or d3` for
//! `c = 1, 2, ≥ 3` (the count-dependent discounts of modified Kneser–Ney, applied to raw
//! counts). Each of three classes of levels has its own three discounts: levels with a total
//! `T_j ≤ 4`, `≤ 64` and more (a continuation seen a few times deserves less trust than one seen
//! in thousands of places). The nine discounts are fitted on a slice of the training text held
//! out from the index ([`fit_discounts`]).

use crate::index::levels::{count_of, Level};
use crate::index::query::Counts;

/// Upper bounds of level totals of each class but the last.
const CLASS_BOUNDS: [u64; CLASSES - 1] = [1, 2, 4, 16, 64, 1024];
/// Classes of levels by total.
pub const CLASSES: usize = 7;

/// Discounts of counts 1, 2 and ≥ 3, for levels with totals ≤ 4, ≤ 64 and more.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Discounts(pub [[f64; 3]; CLASSES]);

impl Default for Discounts {
    /// Fitted on the last 5% of Tiny Shakespeare's train split, indexing the first 95%
    /// (`infgram ppl --text $(infgram fetch tiny-shakespeare) --split 0.9 --estimator smoothed`
    /// fits them and prints them).
    fn default() -> Self {
        Discounts([
            [0.924, 1.000, 1.500],
            [0.963, 1.258, 1.500],
            [0.943, 1.461, 1.641],
            [0.924, 1.535, 1.996],
            [0.832, 1.348, 1.926],
            [0.812, 1.129, 2.059],
            [0.605, 0.010, 2.168],
        ])
    }
}

impl Discounts {
    /// The same three discounts for every class of level.
    pub fn uniform(d: [f64; 3]) -> Self {
        Discounts([d; CLASSES])
    }

    /// Discounts given as numbers (`--discounts`): three `d1, d2, d3` for every class, or three
    /// per class of level total ([`CLASSES`] × 3); each finite and at least 0 (field
    /// `discounts`).
    pub fn from_values(values: &[f64]) -> crate::error::Result<Self> {
        let field = |message: String| crate::error::Error::Field {
            field: "discounts",
            message,
        };
        if values.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(field(format!(
                "must be finite and at least 0 (got {values:?})"
            )));
        }
        match values {
            [a, b, c] => Ok(Discounts::uniform([*a, *b, *c])),
            v if v.len() == 3 * CLASSES => {
                let mut d = Discounts::uniform([0.0; 3]);
                for (k, row) in v.chunks(3).enumerate() {
                    d.0[k] = [row[0], row[1], row[2]];
                }
                Ok(d)
            }
            _ => Err(field(format!(
                "takes three numbers d1,d2,d3, or {} (three per class of level total)",
                3 * CLASSES
            ))),
        }
    }

    #[inline]
    fn class(total: u64) -> usize {
        CLASS_BOUNDS
            .iter()
            .position(|&b| total <= b)
            .unwrap_or(CLASSES - 1)
    }

    #[inline]
    fn of(&self, class: usize, c: u64) -> f64 {
        let d = &self.0[class];
        match c {
            0 => 0.0,
            1 => d[0],
            2 => d[1],
            _ => d[2],
        }
        .min(c as f64)
    }
}

/// The counts a level contributes and their total: its Kneser–Ney continuation counts when
/// the level finder computed them (every level below the longest), else its plain counts.
fn level_counts(level: &Level) -> (&Counts, u64) {
    match &level.continuations {
        Some(c) => (c, c.iter().map(|&(_, n)| n).sum()),
        None => (&level.counts, level.total),
    }
}

/// Backoff weight (discounted mass) of one level.
fn gamma(counts: &Counts, total: u64, d: &Discounts) -> f64 {
    let class = Discounts::class(total);
    let mass: f64 = counts.iter().map(|&(_, c)| d.of(class, c)).sum();
    mass / total as f64
}

/// Smoothed probability of `tok` given the context's levels (longest first, ending with the
/// unigram level), over a vocabulary of `vocab` ids.
pub fn smoothed_prob(levels: &[Level], d: &Discounts, vocab: usize, tok: u32) -> f64 {
    let mut p = 1.0 / vocab as f64;
    for lv in levels.iter().rev() {
        let (counts, total) = level_counts(lv);
        let c = count_of(counts, tok);
        let class = Discounts::class(total);
        p = (c as f64 - d.of(class, c)).max(0.0) / total as f64 + gamma(counts, total, d) * p;
    }
    p
}

/// The full smoothed distribution over `0..vocab` (dense).
pub fn smoothed_distribution(levels: &[Level], d: &Discounts, vocab: usize) -> Vec<f64> {
    let mut p = vec![1.0 / vocab as f64; vocab];
    for lv in levels.iter().rev() {
        let (counts, total) = level_counts(lv);
        let g = gamma(counts, total, d);
        let class = Discounts::class(total);
        let inv = 1.0 / total as f64;
        for x in p.iter_mut() {
            *x *= g;
        }
        for &(t, c) in counts.iter() {
            if (t as usize) < vocab {
                p[t as usize] += (c as f64 - d.of(class, c)).max(0.0) * inv;
            }
        }
    }
    p
}

/// What the fit needs of one level at one position: its class, total, the number of tokens
/// seen once, twice and more, and the count of the actual token.
struct LevelFacts {
    class: usize,
    total: f64,
    n: [f64; 3],
    actual: u64,
}

fn facts(levels: &[Level], tok: u32) -> Vec<LevelFacts> {
    levels
        .iter()
        .map(|lv| {
            let (counts, total) = level_counts(lv);
            let mut n = [0.0; 3];
            for &(_, c) in counts.iter() {
                n[(c.min(3) - 1) as usize] += 1.0;
            }
            LevelFacts {
                class: Discounts::class(total),
                total: total as f64,
                n,
                actual: count_of(counts, tok),
            }
        })
        .collect()
}

/// [`smoothed_prob`] from precomputed facts (`γ = (d1·n1 + d2·n2 + d3·n3) / T`, as
/// `d1 < 1 ≤ d2 < 2 ≤ d3 < 3` keeps every discount below its count).
fn prob_from_facts(facts: &[LevelFacts], d: &Discounts, vocab: usize) -> f64 {
    let mut p = 1.0 / vocab as f64;
    for f in facts.iter().rev() {
        let dc = &d.0[f.class];
        let gamma = (dc[0] * f.n[0] + dc[1] * f.n[1] + dc[2] * f.n[2]) / f.total;
        p = (f.actual as f64 - d.of(f.class, f.actual)).max(0.0) / f.total + gamma * p;
    }
    p
}

/// Fits the discounts by coordinate descent on the mean log-likelihood of the actual tokens,
/// given the levels at each held-out position.
pub fn fit_discounts(levels_by_pos: &[(Vec<Level>, u32)], vocab: usize) -> Discounts {
    let data: Vec<Vec<LevelFacts>> = levels_by_pos.iter().map(|(lv, t)| facts(lv, *t)).collect();
    let nll = |d: &Discounts| -> f64 {
        data.iter()
            .map(|f| -prob_from_facts(f, d, vocab).ln())
            .sum::<f64>()
            / data.len().max(1) as f64
    };
    let mut best = Discounts::uniform([0.5, 1.0, 1.5]);
    let mut best_nll = nll(&best);
    let mut step = 0.25;
    while step > 0.002 {
        let mut improved = false;
        for (class, i) in (0..CLASSES).flat_map(|k| (0..3).map(move |i| (k, i))) {
            for dir in [-1.0, 1.0] {
                let mut cand = best;
                let x = &mut cand.0[class][i];
                *x = (*x + dir * step).clamp(0.01, (i + 1) as f64 - 0.01);
                let v = nll(&cand);
                if v < best_nll {
                    best = cand;
                    best_nll = v;
                    improved = true;
                }
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    best
}

/// Fits the discounts for an index of `train`: indexes its first 95% (one document) and fits
/// on the last 5%, each position with the previous `context` tokens of that slice.
pub fn fit_on_train(
    train: &[u32],
    spec: crate::tokenizer::TokenizerSpec,
    context: usize,
) -> crate::error::Result<Discounts> {
    let cut = train.len() * 95 / 100;
    let (head, held) = (&train[..cut], &train[cut..]);
    let index = crate::Index::from_docs(spec, &[head.to_vec()], 1, true)?;
    let mut memo = crate::index::levels::Memo::new(false);
    let est = super::Estimator::Smoothed(Discounts::default());
    let data = (1..held.len())
        .map(|i| {
            let ctx = &held[i.saturating_sub(context)..i];
            Ok((est.levels(&index, &mut memo, ctx)?, held[i]))
        })
        .collect::<crate::error::Result<Vec<_>>>()?;
    Ok(fit_discounts(&data, index.vocab_size()))
}
