//! A smoothed ∞-gram estimator: interpolated absolute discounting across *all* levels of the
//! context (every distinct suffix count, longest first, down to the unigram level), ending in
//! a uniform distribution over the vocabulary. Its probabilities are never zero, so its
//! perplexity is finite without a floor.
//!
//! From the shortest level up: `P_j(x) = max(c_j(x) − D(c_j(x)), 0) / T_j + γ_j · P_{j+1}(x)`
//! with `γ_j = Σ_x D(c_j(x)) [c_j(x) > 0] / T_j`, and `D(c) = d1, d2 or d3` for
//! `c = 1, 2, ≥ 3` (the count-dependent discounts of modified Kneser–Ney, applied to raw
//! counts). The three discounts are fitted on a slice of the training text held out from the
//! index ([`fit_discounts`]).

use super::levels::{count_of, Level};

/// Discounts of counts 1, 2 and ≥ 3.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Discounts(pub [f64; 3]);

impl Default for Discounts {
    /// Fitted on the last 5% of Tiny Shakespeare's train split, indexing the first 95%
    /// (`infgram ppl --text ../shared/data/tinyshakespeare.txt --split 0.9 --estimator smoothed`
    /// fits them and prints them).
    fn default() -> Self {
        Discounts([0.883, 1.594, 2.836])
    }
}

impl Discounts {
    #[inline]
    fn of(&self, c: u64) -> f64 {
        match c {
            0 => 0.0,
            1 => self.0[0],
            2 => self.0[1],
            _ => self.0[2],
        }
        .min(c as f64)
    }
}

/// Backoff weight and discounted mass of one level.
fn gamma(level: &Level, d: &Discounts) -> f64 {
    let mass: f64 = level.counts.iter().map(|&(_, c)| d.of(c)).sum();
    mass / level.total as f64
}

/// Smoothed probability of `tok` given the context's levels (longest first, ending with the
/// unigram level), over a vocabulary of `vocab` ids.
pub fn smoothed_prob(levels: &[Level], d: &Discounts, vocab: usize, tok: u32) -> f64 {
    let mut p = 1.0 / vocab as f64;
    for lv in levels.iter().rev() {
        let c = count_of(&lv.counts, tok);
        p = (c as f64 - d.of(c)).max(0.0) / lv.total as f64 + gamma(lv, d) * p;
    }
    p
}

/// The full smoothed distribution over `0..vocab` (dense).
pub fn smoothed_distribution(levels: &[Level], d: &Discounts, vocab: usize) -> Vec<f64> {
    let mut p = vec![1.0 / vocab as f64; vocab];
    for lv in levels.iter().rev() {
        let g = gamma(lv, d);
        let inv = 1.0 / lv.total as f64;
        for x in p.iter_mut() {
            *x *= g;
        }
        for &(t, c) in lv.counts.iter() {
            if (t as usize) < vocab {
                p[t as usize] += (c as f64 - d.of(c)).max(0.0) * inv;
            }
        }
    }
    p
}

/// Fits the discounts by coordinate descent on the mean log-likelihood of `tokens`, given a
/// function returning the levels at each position (computed once and reused).
pub fn fit_discounts(levels_by_pos: &[(Vec<Level>, u32)], vocab: usize) -> Discounts {
    let nll = |d: &Discounts| -> f64 {
        levels_by_pos
            .iter()
            .map(|(lv, t)| -smoothed_prob(lv, d, vocab, *t).ln())
            .sum::<f64>()
            / levels_by_pos.len().max(1) as f64
    };
    let mut best = Discounts([0.5, 1.0, 1.5]);
    let mut best_nll = nll(&best);
    let mut step = 0.25;
    while step > 0.005 {
        let mut improved = false;
        for i in 0..3 {
            for dir in [-1.0, 1.0] {
                let mut cand = best;
                cand.0[i] = (cand.0[i] + dir * step).clamp(0.01, (i + 1) as f64 - 0.01);
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
