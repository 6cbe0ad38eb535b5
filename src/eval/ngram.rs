//! Perplexity of the ∞-gram estimators over a token sequence, and the infini-gram paper's §4
//! analysis: token-wise agreement of the ∞-gram's argmax with the actual token, overall, by
//! effective n (suffix length + 1), and for sparse (one possible next token) and non-sparse
//! estimates.

use crate::error::{Error, Result};
use crate::index::levels::Memo;
use crate::index::shards::Shards;
use crate::ngram::Estimator;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

/// Agreement counts of one bucket.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Agreement {
    /// Tokens in the bucket.
    pub tokens: u64,
    /// Of which the ∞-gram's argmax was the actual token.
    pub agree: u64,
}

impl Agreement {
    pub(crate) fn add(&mut self, hit: bool) {
        self.tokens += 1;
        self.agree += hit as u64;
    }
    fn merge(&mut self, o: &Agreement) {
        self.tokens += o.tokens;
        self.agree += o.agree;
    }
    /// `agree / tokens`.
    pub fn rate(&self) -> f64 {
        self.agree as f64 / self.tokens.max(1) as f64
    }
}

/// Result of a perplexity run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PplReport {
    /// Perplexity: `exp(mean −ln p)`.
    pub ppl: f64,
    /// Predicted tokens.
    pub tokens: u64,
    /// `log2(ppl)`.
    pub bits_per_token: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Tokens that got the floor probability.
    pub floored: u64,
    /// Agreement of the ∞-gram argmax, all tokens.
    pub agreement: Agreement,
    /// … for sparse ∞-gram estimates (one possible next token).
    pub agreement_sparse: Agreement,
    /// … for non-sparse estimates.
    pub agreement_nonsparse: Agreement,
    /// … by effective n (suffix length + 1).
    pub agreement_by_n: BTreeMap<usize, Agreement>,
}

#[derive(Default)]
struct Partial {
    nll: f64,
    tokens: u64,
    floored: u64,
    all: Agreement,
    sparse: Agreement,
    nonsparse: Agreement,
    by_n: BTreeMap<usize, Agreement>,
}

/// Scores `tokens[1..]`, each with the previous `context` tokens (of `tokens` only) as context.
/// `floor` replaces a zero probability (or a position without any level); without a floor such
/// a position is an error.
pub fn perplexity(
    index: &(impl Shards + ?Sized),
    tokens: &[u32],
    estimator: &Estimator,
    context: usize,
    floor: Option<f64>,
) -> Result<PplReport> {
    let t0 = std::time::Instant::now();
    estimator.check_levels("this perplexity")?;
    if context == 0 {
        return Err(Error::Field {
            field: "context",
            message: "must be at least 1 token".into(),
        });
    }
    if tokens.len() < 2 {
        return Err(Error::input("need at least two tokens of text to score"));
    }
    let vocab = index.vocab_size();
    let positions: Vec<usize> = (1..tokens.len()).collect();
    let chunk = positions
        .len()
        .div_ceil(rayon::current_num_threads() * 4)
        .max(1);
    let parts: Vec<Result<Partial>> = positions
        .par_chunks(chunk)
        .map(|chunk| {
            let mut memo = Memo::new(false);
            let mut p = Partial::default();
            for &i in chunk {
                let ctx = &tokens[i.saturating_sub(context)..i];
                let actual = tokens[i];
                let levels = estimator.levels(index, &mut memo, ctx)?;
                let prob = estimator.prob(&levels, vocab, actual).unwrap_or(0.0);
                let prob = if prob > 0.0 {
                    prob
                } else if let Some(f) = floor {
                    p.floored += 1;
                    f
                } else {
                    return Err(Error::Option {
                        option: "floor",
                        message: format!(
                            "token {i} has probability 0 under this estimator; pass {{option}} \
                             or use the smoothed estimator"
                        ),
                    });
                };
                p.nll -= prob.ln();
                p.tokens += 1;
                // The ∞-gram proper: the longest level with any continuation.
                if let Some(top) = levels.first().filter(|l| l.len > 0) {
                    let argmax = crate::index::levels::top_token(&top.counts);
                    let hit = argmax == Some(actual);
                    p.all.add(hit);
                    if top.counts.len() == 1 {
                        p.sparse.add(hit)
                    } else {
                        p.nonsparse.add(hit)
                    }
                    p.by_n.entry(top.len + 1).or_default().add(hit);
                } else {
                    p.all.add(false);
                    p.nonsparse.add(false);
                    p.by_n.entry(1).or_default().add(false);
                }
            }
            Ok(p)
        })
        .collect();
    let mut r = PplReport::default();
    let mut nll = 0.0;
    for p in parts {
        let p = p?;
        nll += p.nll;
        r.tokens += p.tokens;
        r.floored += p.floored;
        r.agreement.merge(&p.all);
        r.agreement_sparse.merge(&p.sparse);
        r.agreement_nonsparse.merge(&p.nonsparse);
        for (n, a) in &p.by_n {
            r.agreement_by_n.entry(*n).or_default().merge(a);
        }
    }
    r.ppl = (nll / r.tokens as f64).exp();
    r.bits_per_token = r.ppl.log2();
    r.seconds = t0.elapsed().as_secs_f64();
    Ok(r)
}
