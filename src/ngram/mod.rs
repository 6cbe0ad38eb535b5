//! The ∞-gram as a language model: next-token estimators over an index.
//!
//! * [`crate::index::levels`]: the SBIS levels of a context (distinct suffix counts, longest first), counted
//!   through the index's bounded cache of next-token counts
//!   ([`crate::index::counts_cache`]), and the incremental tracker used in generation.
//! * [`sbis`]: the selective backoff interpolation distribution.
//! * [`smoothed`]: interpolated absolute discounting across all levels (finite perplexity).
//! * [`classic`]: fixed-order n-gram models (KenLM's modified Kneser–Ney, add-α) counted on
//!   the suffix array, and [`arpa`], their export in ARPA format.
//! * [`model`]: [`InfgramModel`], the ∞-gram as a [`crate::lm::LanguageModel`] with sparse rows,
//!   so generation, speculative decoding and perplexity run it like any model; [`batch`], its
//!   rows for a whole token sequence in one call (for interpolating any other model).
//!
//! The algorithms, in short, follow.
//!
//! # The estimators
//!
//! **∞-gram** (Liu et al. 2024): the next-token distribution of the longest suffix of the context
//! that occurs in the corpus with a next token; it backs off only when that count is zero. Counts of
//! a suffix only fall as it grows, so the longest occurring suffix is a change point of a monotone
//! function.
//!
//! **Right-anchored contexts.** Ranges of the forward suffix array nest when a query grows to the
//! right; a context's suffixes grow to the left. The index also stores the suffix array of the
//! reversed text (`rsa.bin`), in which they nest: the ranges of all suffixes of a context come from
//! one left-to-right narrowing, one binary search per length. Without `rsa.bin` a forward search per
//! length gives the same answers more slowly.
//!
//! **SBIS** (selective backoff interpolation sampling, from "Generating Shakespeare Without Neural
//! Networks", 2026, and its reference implementation tiny-infini-gram). The *levels* of a context
//! are found by walking suffix lengths from the longest down to 1: take all occurrences of the
//! suffix in the corpus and count the token after each (occurrences at a document's end have none);
//! a length where the occurrence count changes is a candidate, and it is kept only if its next-token
//! total exceeds the total of the previous kept level. Keep at most k levels (k = −1: all). Then
//! `P(x) ∝ Σ_j decay^j · count_j(x)` over kept levels j = 0, 1, … (longest first; decay 0.1);
//! temperature T is applied as `P^(1/T)`. In generation the levels of `c·x` are among the change
//! points of `c` extended by `x`, so `Tracker` extends the previous step's small levels by one token
//! read per occurrence and most steps need no search.
//!
//! **Smoothed** — interpolated absolute discounting across all levels down to the uniform
//! distribution, with Kneser–Ney continuation counts below the longest level; nine discounts (three
//! per class of level total) fitted on held-out train. Finite perplexity with no floor.

pub mod arpa;
pub mod batch;
pub mod classic;
pub mod model;
pub mod sbis;
pub mod smoothed;

pub use model::{InfgramModel, LevelLog};

use crate::index::levels::{Level, LevelAsk, Memo};
use crate::index::shards::Shards;
use smoothed::Discounts;

/// What the ∞-gram knew at one position: the longest suffix of the context with a next token
/// in the corpus (the first level). The mixer's λ depends on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Evidence {
    /// Length of the longest suffix with a next token (0: none, the unigram).
    pub suffix_len: usize,
    /// Its occurrences followed by a token.
    pub count: u64,
    /// Distinct tokens that follow it.
    pub distinct: usize,
}

impl Evidence {
    /// The evidence of a list of levels (longest first).
    pub fn of(levels: &[Level]) -> Evidence {
        match levels.first() {
            Some(l) => Evidence {
                suffix_len: l.len,
                count: l.total,
                distinct: l.counts.len(),
            },
            None => Evidence::default(),
        }
    }

    /// Whether the ∞-gram estimate is sparse: one possible next token (the infini-gram paper's
    /// definition).
    pub fn sparse(&self) -> bool {
        self.distinct == 1
    }
}

/// Which next-token estimator to use.
#[derive(Clone, Debug)]
pub enum Estimator {
    /// SBIS with `k` levels (−1 = all) and the given decay.
    Sbis {
        /// Levels to keep (−1: all).
        k: i64,
        /// Weight ratio between consecutive levels.
        decay: f64,
    },
    /// Interpolated absolute discounting down to uniform.
    Smoothed(Discounts),
    /// A classic fixed-order model ([`classic`]), estimated over the index it meets
    /// ([`InfgramModel`] does that): it has no levels, and answers through
    /// [`classic::ClassicModel`].
    Classic(classic::ClassicSpec),
}

/// The one way an ∞-gram estimator is named, wherever one is chosen: a generation request
/// (`scorer.estimator`), a mixer file (`mix.json`'s `estimator`), the CLI's `--estimator`
/// flags, Python. [`EstimatorSpec::estimator`] fills in the defaults, checks the numbers and
/// gives the [`Estimator`] that computes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum EstimatorSpec {
    /// The infini-gram paper's ∞-gram: the next-token distribution of the longest suffix with
    /// a next token (SBIS with one level). Sparse: zero for every token never seen after it.
    Infgram,
    /// Selective backoff interpolation sampling.
    Sbis {
        /// Levels (−1: all; default [`SBIS_K`]).
        #[serde(default)]
        k: Option<i64>,
        /// Weight ratio between consecutive levels, in (0, 1] (default [`SBIS_DECAY`]).
        #[serde(default)]
        decay: Option<f64>,
    },
    /// Interpolated absolute discounting down to uniform (default discounts).
    Smoothed,
    /// A classic fixed-order model: interpolated modified Kneser–Ney as KenLM's `lmplz`
    /// estimates it ([`classic`]).
    Mkn {
        /// The order N (at least 1).
        order: usize,
    },
    /// A classic fixed-order model: add-α (α = 0: maximum likelihood) ([`classic`]).
    AddAlpha {
        /// The order N (at least 1).
        order: usize,
        /// The pseudo-count α ≥ 0 (default 1).
        #[serde(default)]
        alpha: Option<f64>,
    },
}

/// SBIS levels when a spec does not say: all of them.
pub const SBIS_K: i64 = -1;
/// SBIS weight ratio between consecutive levels when a spec does not say.
pub const SBIS_DECAY: f64 = 0.1;
/// Add-α's pseudo-count when a spec does not say (Laplace).
pub const ADD_ALPHA: f64 = 1.0;

impl Default for EstimatorSpec {
    fn default() -> Self {
        EstimatorSpec::Sbis {
            k: None,
            decay: None,
        }
    }
}

impl EstimatorSpec {
    /// Whether this is a fixed-order model (mkn, add-α), not an ∞-gram estimator.
    pub fn is_fixed_order(&self) -> bool {
        matches!(
            self,
            EstimatorSpec::Mkn { .. } | EstimatorSpec::AddAlpha { .. }
        )
    }

    /// The classic fixed-order model this spec names, estimated over `index` (in sentence mode
    /// when the index was built so); `None` for the ∞-gram estimators. `discount_fallback`:
    /// KenLM's `--discount_fallback` (without it, discounts the counts cannot give are an error).
    pub fn classic(
        &self,
        index: &(impl crate::index::shards::Shards + ?Sized),
        discount_fallback: Option<[f64; 3]>,
    ) -> crate::error::Result<Option<classic::ClassicModel>> {
        let Some(mut spec) = self.classic_spec()? else {
            return Ok(None);
        };
        if let classic::Smoothing::Mkn { fallback } = &mut spec.smoothing {
            *fallback = discount_fallback;
        }
        classic::ClassicModel::new(index, spec.order, spec.smoothing).map(Some)
    }

    /// The order and smoothing of a fixed-order spec, checked (an error names
    /// `estimator.order` or `estimator.alpha`), with KenLM's fallback discounts for an order
    /// whose count-of-counts cannot give them (a generation runs on any index); `None` for the
    /// ∞-gram estimators.
    fn classic_spec(&self) -> crate::error::Result<Option<classic::ClassicSpec>> {
        let (order, smoothing) = match *self {
            EstimatorSpec::Mkn { order } => (
                order,
                classic::Smoothing::Mkn {
                    fallback: Some(classic::KENLM_FALLBACK),
                },
            ),
            EstimatorSpec::AddAlpha { order, alpha } => (
                order,
                classic::Smoothing::AddAlpha {
                    alpha: alpha.unwrap_or(ADD_ALPHA),
                },
            ),
            _ => return Ok(None),
        };
        let spec = classic::ClassicSpec { order, smoothing };
        spec.check().map_err(|e| {
            e.rename_field(&[("order", "estimator.order"), ("alpha", "estimator.alpha")])
        })?;
        Ok(Some(spec))
    }

    /// SBIS with `k` levels and the default decay.
    pub fn sbis(k: i64) -> Self {
        EstimatorSpec::Sbis {
            k: Some(k),
            decay: None,
        }
    }

    /// The estimator this spec asks for, its defaults filled in and its numbers checked (an
    /// error names the field: `estimator.k`, `estimator.decay`).
    pub fn estimator(&self) -> crate::error::Result<Estimator> {
        let field = |field, message| crate::error::Error::Field { field, message };
        match *self {
            EstimatorSpec::Infgram => Ok(Estimator::Sbis {
                k: 1,
                decay: SBIS_DECAY,
            }),
            EstimatorSpec::Smoothed => Ok(Estimator::Smoothed(Discounts::default())),
            EstimatorSpec::Mkn { .. } | EstimatorSpec::AddAlpha { .. } => Ok(Estimator::Classic(
                self.classic_spec()?.expect("a fixed-order spec"),
            )),
            EstimatorSpec::Sbis { k, decay } => {
                let k = k.unwrap_or(SBIS_K);
                if k == 0 || k < -1 {
                    return Err(field(
                        "estimator.k",
                        format!("is the number of SBIS levels: -1 (all) or at least 1, got {k}"),
                    ));
                }
                let decay = decay.unwrap_or(SBIS_DECAY);
                if !(decay > 0.0 && decay <= 1.0) {
                    return Err(field(
                        "estimator.decay",
                        format!("must be in (0, 1], got {}", crate::error::shown(decay)),
                    ));
                }
                Ok(Estimator::Sbis { k, decay })
            }
        }
    }
}

impl Estimator {
    /// What this estimator reads of a context's levels (`None`: a classic model reads counts
    /// of its own).
    pub fn level_ask<'a>(&self, ctx: &'a [u32]) -> Option<LevelAsk<'a>> {
        match self {
            Estimator::Sbis { k, .. } => Some(LevelAsk::new(ctx, *k)),
            Estimator::Smoothed(_) => Some(LevelAsk {
                include_empty: true,
                continuation: true,
                ..LevelAsk::new(ctx, -1)
            }),
            Estimator::Classic(_) => None,
        }
    }

    /// The levels this estimator needs for a context, read from `corpus` through `memo` (an
    /// index here or shards held elsewhere; the smoothed estimator needs an index here).
    pub fn levels(
        &self,
        corpus: &(impl Shards + ?Sized),
        memo: &mut Memo,
        ctx: &[u32],
    ) -> crate::error::Result<Vec<Level>> {
        match self.level_ask(ctx) {
            Some(ask) => corpus.levels(memo, ask),
            None => Ok(Vec::new()),
        }
    }

    /// The distribution given the levels, as `(token, probability)` pairs sorted by token
    /// (SBIS: its support only; smoothed: every token of the vocabulary; a classic model has
    /// no levels: empty, [`classic::ClassicModel::distribution_into`] gives its).
    pub fn distribution(&self, levels: &[Level], vocab: usize) -> Vec<(u32, f64)> {
        let mut out = Vec::new();
        self.distribution_into(levels, vocab, &mut out);
        out
    }

    /// [`Estimator::distribution`] into `out` (cleared first), reusing its allocation.
    pub fn distribution_into(&self, levels: &[Level], vocab: usize, out: &mut Vec<(u32, f64)>) {
        match self {
            Estimator::Sbis { decay, .. } => sbis::sbis_distribution_into(levels, *decay, out),
            Estimator::Smoothed(d) => {
                out.clear();
                let dense = smoothed::smoothed_distribution(levels, d, vocab);
                out.extend(dense.into_iter().enumerate().map(|(t, p)| (t as u32, p)));
            }
            Estimator::Classic(_) => out.clear(),
        }
    }

    /// Probability of `tok` given the levels (`None` when SBIS has no level, and for a
    /// classic model, which has no levels).
    pub fn prob(&self, levels: &[Level], vocab: usize, tok: u32) -> Option<f64> {
        match self {
            Estimator::Sbis { decay, .. } => sbis::sbis_prob(levels, *decay, tok),
            Estimator::Smoothed(d) => Some(smoothed::smoothed_prob(levels, d, vocab, tok)),
            Estimator::Classic(_) => None,
        }
    }

    /// Refuses a classic model where only level-based estimators can run (`what` says where).
    pub fn check_levels(&self, what: &str) -> crate::error::Result<()> {
        match self {
            Estimator::Classic(_) => Err(crate::error::Error::Field {
                field: "estimator",
                message: format!(
                    "{what} runs the ∞-gram estimators (infgram, sbis, smoothed); a fixed-order \
                     model (mkn, add_alpha) is scored by `infgram ppl --estimator mkn` and \
                     generates with `infgram gen`"
                ),
            }),
            _ => Ok(()),
        }
    }
}
