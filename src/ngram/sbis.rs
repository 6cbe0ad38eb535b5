//! Selective backoff interpolation sampling (SBIS): the next-token distribution
//! `P(x) ∝ Σ_j decay^j · count_j(x)` over the kept levels `j = 0, 1, …` (longest first), as
//! defined by "Generating Shakespeare Without Neural Networks" (tiny-infini-gram) and written out
//! in the [`crate::ngram`] module docs, "The estimators".

use crate::index::levels::{count_of, Level};

/// Probability of `tok` under SBIS with the given levels, or `None` without levels.
pub fn sbis_prob(levels: &[Level], decay: f64, tok: u32) -> Option<f64> {
    if levels.is_empty() {
        return None;
    }
    let (mut num, mut den, mut w) = (0.0, 0.0, 1.0);
    for lv in levels {
        num += w * count_of(&lv.counts, tok) as f64;
        den += w * lv.total as f64;
        w *= decay;
    }
    Some(num / den)
}

/// The SBIS distribution as `(token, probability)` pairs sorted by token. The shortest
/// level's tokens are a superset of every longer level's (nested occurrence sets).
pub fn sbis_distribution(levels: &[Level], decay: f64) -> Vec<(u32, f64)> {
    let mut out = Vec::new();
    sbis_distribution_into(levels, decay, &mut out);
    out
}

/// [`sbis_distribution`] into `out` (cleared first), reusing its allocation.
pub fn sbis_distribution_into(levels: &[Level], decay: f64, out: &mut Vec<(u32, f64)>) {
    out.clear();
    let Some(base) = levels.last() else {
        return;
    };
    out.extend(base.counts.iter().map(|&(t, _)| (t, 0.0)));
    let (mut den, mut w) = (0.0, 1.0);
    for lv in levels {
        // Merge-join of two sorted lists (a longer level's tokens are among the shortest's;
        // one that is not, from levels that do not nest, is left out rather than read past).
        let mut i = 0;
        for &(t, c) in lv.counts.iter() {
            while i < out.len() && out[i].0 < t {
                i += 1;
            }
            if let Some(slot) = out.get_mut(i).filter(|s| s.0 == t) {
                slot.1 += w * c as f64;
            }
        }
        den += w * lv.total as f64;
        w *= decay;
    }
    for x in out.iter_mut() {
        x.1 /= den;
    }
}
