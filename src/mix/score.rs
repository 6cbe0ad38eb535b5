//! Interpolated perplexity: a text scored by the neural model (in the paper's windows), by the
//! ∞-gram (every position straight from the levels, in parallel) and by their mixture, from one
//! pass of each ([`score_both`]); the same per-position numbers fit λ ([`Mixer::fit`]). Also
//! the decontamination check: how much of the text the index already holds.

use super::features::{first_max, top_of_logprobs, Confidence, FitPoint, LambdaModel, NeuralView};
use super::{Mixer, MIX_CONTEXT};
use crate::error::Result;
use crate::eval::ngram::Agreement;
use crate::index::levels::{top_token, Memo};
use crate::index::Index;
use crate::lm::{LanguageModel, Logits};
use crate::ngram::{Estimator, EstimatorSpec, Evidence};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// The n of the decontamination check (13-grams, as the infini-gram paper).
pub const OVERLAP_N: usize = 13;

/// Above this overlap, a scored text is mostly in the index: a warning is due.
pub const OVERLAP_WARN: f64 = 0.2;

/// Above this overlap the infini-gram paper drops a document from its evaluation (its BFF
/// decontamination rule); each such document is named on stderr.
pub const OVERLAP_DROP: f64 = 0.8;

/// What the ∞-gram says at one position of a text.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InfgramPosition {
    /// Probability of the actual token under the mixed-in estimator (may be 0).
    pub p: f64,
    /// … under the smoothed estimator (never 0): the ∞-gram's finite perplexity.
    pub p_smoothed: f64,
    /// What the ∞-gram knew.
    pub evidence: Evidence,
    /// Whether the ∞-gram's argmax (of the longest level) is the actual token.
    pub agrees: bool,
    /// The mixed-in distribution's most likely token and its probability (lowest id on a
    /// tie; `None` without one): what a [`super::LambdaModel`] reads of the ∞-gram's row.
    pub top: Option<(u32, f64)>,
}

/// The ∞-gram at every position `1..` of `tokens` (entry `i` is token `i + 1`), with the
/// last `context` tokens as context, in parallel.
pub fn infgram_positions<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    tokens: &[u32],
    estimator: &EstimatorSpec,
    context: usize,
) -> Result<Vec<InfgramPosition>> {
    let mixed = estimator.estimator()?;
    mixed.check_levels("scoring a mixture")?;
    let smoothed = Estimator::Smoothed(Default::default());
    let vocab = index.vocab_size();
    let scored = each_position(
        tokens.len(),
        || (Memo::new(false), Vec::new()),
        |(memo, dist), i| {
            let ctx = &tokens[i.saturating_sub(context)..i];
            let actual = tokens[i];
            let all = smoothed.levels(index, memo, ctx)?;
            let p_smoothed = smoothed.prob(&all, vocab, actual).unwrap_or(0.0);
            let levels = match mixed {
                Estimator::Smoothed(_) => all.clone(),
                _ => mixed.levels(index, memo, ctx)?,
            };
            let p = mixed.prob(&levels, vocab, actual).unwrap_or(0.0);
            let first = levels.first().filter(|l| l.len > 0);
            let argmax = first.and_then(|l| top_token(&l.counts));
            mixed.distribution_into(&levels, vocab, dist);
            Ok(InfgramPosition {
                p,
                p_smoothed,
                evidence: Evidence::of(first.map(std::slice::from_ref).unwrap_or(&[])),
                agrees: argmax == Some(actual),
                top: first_max(dist.iter().copied(), 0.0),
            })
        },
    );
    scored.into_iter().collect()
}

/// `at(state, i)` at every position `1..len`, in order, computed in parallel chunks that
/// each start from a fresh `init()` (a reader's memo and scratch space).
fn each_position<St, T: Send>(
    len: usize,
    init: impl Fn() -> St + Sync,
    at: impl Fn(&mut St, usize) -> T + Sync,
) -> Vec<T> {
    let positions: Vec<usize> = (1..len).collect();
    let chunk = positions
        .len()
        .div_ceil(rayon::current_num_threads() * 4)
        .max(1);
    positions
        .par_chunks(chunk)
        .flat_map_iter(|chunk| {
            let mut state = init();
            chunk.iter().map(|&i| at(&mut state, i)).collect::<Vec<_>>()
        })
        .collect()
}

/// What the neural model says at one position.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NeuralPosition {
    /// Its probability of the actual token.
    pub q: f64,
    /// Its confidence there.
    pub view: NeuralView,
    /// Its probability of the ∞-gram's most likely token (0 where the ∞-gram has none).
    pub q_of_infgram_top: f64,
}

impl NeuralPosition {
    /// A position known only by the probability of its token (for λ tables).
    pub fn of_q(q: f64) -> NeuralPosition {
        NeuralPosition {
            q,
            ..Default::default()
        }
    }
}

/// The neural model at every position `1..` of `tokens` (entry `i` is token `i + 1`), in
/// windows of `window` moved by `stride`: its probability of the actual token, its confidence,
/// and its probability of the ∞-gram's favourite there (`infgram_tops[i]`).
pub fn neural_positions(
    model: &mut dyn LanguageModel,
    tokens: &[u32],
    window: usize,
    stride: usize,
    infgram_tops: &[Option<u32>],
) -> Result<Vec<NeuralPosition>> {
    let mut out = Vec::with_capacity(tokens.len().saturating_sub(1));
    let mut dense = Vec::new();
    crate::eval::windowed::windowed_rows(model, tokens, window, stride, |target, row| {
        let logits: &[f32] = match row {
            Logits::Dense(v) => v,
            sparse => {
                dense = sparse.clone().into_dense();
                &dense
            }
        };
        let lse = crate::lm::log_sum_exp_row(logits);
        let p = |id: u32| {
            logits
                .get(id as usize)
                .map_or(0.0, |&x| (x as f64 - lse).exp())
        };
        out.push(NeuralPosition {
            q: p(tokens[target]),
            view: NeuralView::of_logits(logits, lse),
            q_of_infgram_top: infgram_tops
                .get(target - 1)
                .copied()
                .flatten()
                .map_or(0.0, p),
        });
    })?;
    Ok(out)
}

/// The neural model's probability of every token but the first, in windows of `window` moved
/// by `stride`.
pub fn neural_probs(
    model: &mut dyn LanguageModel,
    tokens: &[u32],
    window: usize,
    stride: usize,
) -> Result<Vec<f64>> {
    Ok(
        crate::eval::windowed::windowed_neg_log_probs(model, tokens, window, stride)?
            .into_iter()
            .map(|nll| (-nll).exp())
            .collect(),
    )
}

/// By effective n (the ∞-gram's suffix length + 1): tokens, the ∞-gram's agreement, the mean
/// λ, and the mean −ln p of the neural model and of the mixture.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ByN {
    /// Tokens and how often the ∞-gram's argmax was the actual token.
    pub agreement: Agreement,
    /// Mean λ.
    pub lambda: f64,
    /// Mean −ln p of the neural model.
    pub nll_neural: f64,
    /// Mean −ln p of the mixture.
    pub nll_mix: f64,
}

/// Perplexities of the neural model, the ∞-gram and their mixture on one text.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MixReport {
    /// Perplexity of the mixture.
    pub ppl: f64,
    /// … of the neural model alone.
    pub ppl_neural: f64,
    /// … of the ∞-gram (the smoothed estimator: finite).
    pub ppl_infgram: f64,
    /// `1 − (ppl − 1) / (ppl_neural − 1)` (the infini-gram paper's relative improvement).
    pub relative_improvement: f64,
    /// The perplexity no choice of λ can beat, not even one per position that knew the actual
    /// token: at each position the larger of the two probabilities (a mixture's never exceeds
    /// it). How much the mixed-in ∞-gram can give at all.
    pub ppl_bound: f64,
    /// The relative improvement of [`MixReport::ppl_bound`].
    pub relative_improvement_bound: f64,
    /// Tokens scored.
    pub tokens: usize,
    /// Mean λ.
    pub lambda_mean: f64,
    /// The infini-gram paper's analysis, by effective n.
    pub by_n: BTreeMap<usize, ByN>,
}

impl MixReport {
    /// The report of the mixture `mixer` (a λ table: its λ from the ∞-gram's evidence) over
    /// the scored positions.
    pub fn new(infgram: &[InfgramPosition], neural: &[f64], mixer: &Mixer) -> MixReport {
        let lambdas: Vec<f64> = infgram.iter().map(|g| mixer.lambda(&g.evidence)).collect();
        MixReport::with_lambdas(infgram, neural, &lambdas)
    }

    /// The report of the mixture with λ `lambda[i]` at position `i`.
    pub fn with_lambdas(infgram: &[InfgramPosition], neural: &[f64], lambda: &[f64]) -> MixReport {
        let n = infgram.len().min(neural.len()).min(lambda.len());
        let (mut nll_mix, mut nll_neural, mut nll_inf, mut lambdas) = (0.0, 0.0, 0.0, 0.0);
        let mut nll_bound = 0.0;
        let mut by_n: BTreeMap<usize, ByN> = BTreeMap::new();
        for ((g, &q), &lambda) in infgram.iter().zip(neural).zip(lambda) {
            let mix = -(lambda * g.p + (1.0 - lambda) * q).ln();
            nll_mix += mix;
            nll_neural -= q.ln();
            nll_inf -= g.p_smoothed.ln();
            nll_bound -= g.p.max(q).ln();
            lambdas += lambda;
            let row = by_n.entry(g.evidence.suffix_len + 1).or_default();
            row.agreement.add(g.agrees);
            row.lambda += lambda;
            row.nll_neural -= q.ln();
            row.nll_mix += mix;
        }
        for row in by_n.values_mut() {
            let t = row.agreement.tokens.max(1) as f64;
            row.lambda /= t;
            row.nll_neural /= t;
            row.nll_mix /= t;
        }
        let per = |x: f64| (x / n.max(1) as f64).exp();
        let (ppl, ppl_neural, ppl_bound) = (per(nll_mix), per(nll_neural), per(nll_bound));
        let improvement = |p: f64| 1.0 - (p - 1.0) / (ppl_neural - 1.0);
        MixReport {
            ppl,
            ppl_neural,
            ppl_infgram: per(nll_inf),
            relative_improvement: improvement(ppl),
            ppl_bound,
            relative_improvement_bound: improvement(ppl_bound),
            tokens: n,
            lambda_mean: lambdas / n.max(1) as f64,
            by_n,
        }
    }
}

/// The `(P∞, P_neural, evidence)` triples [`Mixer::fit`] learns from.
pub fn fitting_data(infgram: &[InfgramPosition], neural: &[f64]) -> Vec<(f64, f64, Evidence)> {
    infgram
        .iter()
        .zip(neural)
        .map(|(g, &q)| (g.p, q, g.evidence))
        .collect()
}

/// Share of the text's `n`-token windows that occur in the corpus (the decontamination check
/// of the infini-gram paper uses 13-grams; it dropped documents with more than 80% overlap).
pub fn overlap<S: AsRef<[u8]> + Sync>(index: &Index<S>, tokens: &[u32], n: usize) -> f64 {
    if tokens.len() < n || n == 0 {
        return 0.0;
    }
    // An index in this process answers every query.
    let matches = crate::eval::attribution::match_lengths(index, tokens).unwrap_or_default();
    let found = matches[n - 1..].iter().filter(|m| m.len >= n).count();
    found as f64 / (tokens.len() + 1 - n) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scoring of `n` positions, each with the ∞-gram's `p` and the model's `q`.
    fn scoring(n: usize, p: f64, q: f64, overlap: f64, name: &str) -> Scoring {
        Scoring {
            infgram: vec![
                InfgramPosition {
                    p,
                    p_smoothed: p,
                    evidence: Evidence::default(),
                    agrees: false,
                    top: None,
                };
                n
            ],
            neural: vec![NeuralPosition::of_q(q); n],
            neural_seconds: 1.0,
            infgram_seconds: 0.5,
            smoothed_seconds: 0.0,
            smoothed: true,
            overlap,
            documents: vec![DocumentOverlap {
                document: String::new(),
                tokens: n,
                overlap,
                left_out: false,
                windows: n.saturating_sub(OVERLAP_N - 2),
            }],
            all: None,
        }
        .named(name)
    }

    #[test]
    fn documents_pool_their_positions_and_the_overlapping_ones_are_left_out() {
        let mixer = Mixer::constant(EstimatorSpec::Infgram, 0.3);
        let (a, b, c) = (
            scoring(40, 0.2, 0.1, 0.1, "a"),
            scoring(100, 0.9, 0.05, 0.95, "b"),
            scoring(60, 0.0, 0.3, 0.5, "c"),
        );
        let joined = Scoring::join(vec![a.clone(), b.clone(), c.clone()]);
        let report = joined.report(&mixer);
        assert_eq!(report.report.tokens, 200);
        let (wa, wb, wc) = (29.0, 89.0, 49.0);
        let pooled = (0.1 * wa + 0.95 * wb + 0.5 * wc) / (wa + wb + wc);
        assert!((report.overlap - pooled).abs() < 1e-12);
        assert_eq!(report.seconds, 4.5);
        let names: Vec<&str> = report
            .overlap_by_document
            .iter()
            .map(|d| d.document.as_str())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(report.with_left_out.is_none());
        // Above 0.8: b is left out; the headline is a and c alone, the whole beside it.
        let kept = joined.leave_out_above(0.8).report(&mixer);
        let alone = Scoring::join(vec![a, c]).report(&mixer);
        assert_eq!(kept.report.ppl, alone.report.ppl);
        assert_eq!(kept.report.tokens, 100);
        assert_eq!(kept.overlap, alone.overlap);
        let left: Vec<bool> = kept
            .overlap_by_document
            .iter()
            .map(|d| d.left_out)
            .collect();
        assert_eq!(left, [false, true, false]);
        let all = kept.with_left_out.as_ref().unwrap();
        assert_eq!(all.ppl, report.report.ppl);
        assert_eq!(all.tokens, 200);
        // Nothing above the limit: nothing changes.
        let same = Scoring::join(vec![scoring(5, 0.5, 0.5, 0.2, "x")]).leave_out_above(0.8);
        assert!(same.report(&mixer).with_left_out.is_none());
    }

    #[test]
    fn no_lambda_beats_the_bound_and_the_components_reach_it() {
        // Positions where each component is sometimes the better one.
        let mut x = 99u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 11) as f64 / (1u64 << 53) as f64).max(1e-6)
        };
        let positions: Vec<InfgramPosition> = (0..500)
            .map(|_| InfgramPosition {
                p: next(),
                p_smoothed: 0.5,
                evidence: Evidence::default(),
                agrees: false,
                top: None,
            })
            .collect();
        let neural: Vec<f64> = (0..500).map(|_| next()).collect();
        let bound = MixReport::new(
            &positions,
            &neural,
            &Mixer::constant(EstimatorSpec::Infgram, 0.5),
        );
        for lambda in [0.0, 0.1, 0.5, 0.9, 1.0] {
            let r = MixReport::new(
                &positions,
                &neural,
                &Mixer::constant(EstimatorSpec::Infgram, lambda),
            );
            assert!(
                r.ppl >= r.ppl_bound * (1.0 - 1e-12),
                "λ {lambda}: {} < {}",
                r.ppl,
                r.ppl_bound
            );
            assert!(r.relative_improvement <= r.relative_improvement_bound + 1e-12);
            assert_eq!(
                r.ppl_bound, bound.ppl_bound,
                "the bound does not depend on λ"
            );
        }
        // Where one component always wins, the bound is that component.
        let higher: Vec<f64> = positions.iter().map(|g| (g.p * 1.5).min(1.0)).collect();
        let r = MixReport::new(
            &positions,
            &higher,
            &Mixer::constant(EstimatorSpec::Infgram, 0.0),
        );
        assert!((r.ppl - r.ppl_bound).abs() < 1e-9 * r.ppl);
        assert!(r.relative_improvement_bound.abs() < 1e-9);
    }
}

/// Interpolated perplexity of a text, with how long each part took and the overlap.
#[derive(Clone, Debug, Serialize)]
pub struct ScoredMixture {
    /// Perplexities and the analysis by effective n.
    #[serde(flatten)]
    pub report: MixReport,
    /// Share of the text's 13-token windows found in the index.
    pub overlap: f64,
    /// Seconds in all.
    pub seconds: f64,
    /// … of which the neural model.
    pub neural_seconds: f64,
    /// … and the ∞-gram's rows (what the mixture needs) with the overlap check.
    pub infgram_seconds: f64,
    /// … and the smoothed ∞-gram's own perplexity (0 when skipped).
    pub smoothed_seconds: f64,
    /// Whether `ppl_infgram` is the smoothed estimator's (else the mixed-in one's, skipped
    /// for speed).
    pub infgram_ppl_smoothed: bool,
    /// The mixer in use.
    pub mixer: Mixer,
    /// Each document's decontamination check (one entry for a single text).
    pub overlap_by_document: Vec<DocumentOverlap>,
    /// The report over every document, those left out of the headline figure included
    /// ([`Scoring::leave_out_above`]); absent when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with_left_out: Option<MixReport>,
}

/// One scored document's decontamination check.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DocumentOverlap {
    /// Its name (a file's path).
    pub document: String,
    /// Positions scored.
    pub tokens: usize,
    /// Share of its [`OVERLAP_N`]-token windows that occur in the index.
    pub overlap: f64,
    /// Whether it is left out of the headline figure (its overlap is above the limit).
    pub left_out: bool,
    /// Its windows (the weight of its overlap in the pooled one).
    #[serde(skip)]
    windows: usize,
}

/// What one pass of both models over a text gives: the ∞-gram's and the neural model's view
/// of every position.
#[derive(Clone)]
pub struct Scoring {
    infgram: Vec<InfgramPosition>,
    neural: Vec<NeuralPosition>,
    neural_seconds: f64,
    infgram_seconds: f64,
    smoothed_seconds: f64,
    /// Whether `p_smoothed` is the smoothed estimator's.
    smoothed: bool,
    overlap: f64,
    /// The documents, in the order of their positions.
    documents: Vec<DocumentOverlap>,
    /// The report over every document when some were left out.
    all: Option<Box<Scoring>>,
}

/// The smoothed ∞-gram's probability of every token but the first (entry `i` is token
/// `i + 1`), with the last `context` tokens as context, in parallel: the ∞-gram's own finite
/// perplexity, which the mixture does not need.
pub fn smoothed_probs<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    tokens: &[u32],
    context: usize,
) -> Result<Vec<f64>> {
    let smoothed = Estimator::Smoothed(Default::default());
    let vocab = index.vocab_size();
    each_position(
        tokens.len(),
        || Memo::new(false),
        |memo, i| {
            let levels = smoothed.levels(index, memo, &tokens[i.saturating_sub(context)..i])?;
            Ok(smoothed.prob(&levels, vocab, tokens[i]).unwrap_or(0.0))
        },
    )
    .into_iter()
    .collect()
}

/// The ∞-gram at every position `1..` of `tokens` for an SBIS estimator, from its rows in one
/// pass of the level tracker ([`crate::ngram::batch::infgram_rows`]: a document's end is the
/// neural model's `end`, ids below `vocab`, as the [`super::Interpolated`] scorer sees them)
/// instead of a search per position; `p_smoothed` comes from [`smoothed_probs`] when
/// `smoothed` is set (else it is `p`). Returns the positions and the seconds of the rows and
/// of the smoothed pass.
pub fn tracked_positions<S: AsRef<[u8]> + Send + Sync + 'static>(
    index: &std::sync::Arc<Index<S>>,
    tokens: &[u32],
    estimator: &EstimatorSpec,
    context: usize,
    (end, vocab): (u32, usize),
    smoothed: bool,
) -> Result<(Vec<InfgramPosition>, f64, f64)> {
    let t = Instant::now();
    let options = crate::ngram::batch::RowsOptions {
        estimator: estimator.clone(),
        window: context,
        end_token: Some(end),
        vocab: Some(vocab),
    };
    let rows = crate::ngram::batch::infgram_rows(index.clone(), tokens, &options)?;
    let mut positions: Vec<InfgramPosition> = (1..tokens.len())
        .map(|i| {
            let j = i - 1;
            let lp = rows.logprob(j, tokens[i]);
            let p = if lp > f32::NEG_INFINITY {
                (lp as f64).exp()
            } else {
                0.0
            };
            let (ids, lps) = rows.row(j);
            let top = top_of_logprobs(ids.iter().copied().zip(lps.iter().copied()));
            InfgramPosition {
                p,
                p_smoothed: p,
                evidence: rows.evidence(j),
                agrees: top.is_some_and(|t| t.0 == tokens[i]),
                top,
            }
        })
        .collect();
    let rows_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    if smoothed {
        for (g, p) in positions
            .iter_mut()
            .zip(smoothed_probs(index, tokens, context)?)
        {
            g.p_smoothed = p;
        }
    }
    Ok((positions, rows_seconds, t.elapsed().as_secs_f64()))
}

/// Scores `tokens` with `neural` (windows of `window` moved by `stride`) and with the ∞-gram
/// of `index` (`estimator`). An SBIS estimator's rows come from the level tracker in one pass
/// ([`tracked_positions`]); the smoothed ∞-gram's own perplexity, a figure the mixture does not
/// need, is computed (and timed) apart, or not at all without `smoothed` (its perplexity is then
/// the mixed-in estimator's, infinite where it gives the actual token no mass).
pub fn score_both<S: AsRef<[u8]> + Send + Sync + 'static>(
    neural: &mut dyn LanguageModel,
    index: &std::sync::Arc<Index<S>>,
    tokens: &[u32],
    estimator: &EstimatorSpec,
    (window, stride): (usize, usize),
    smoothed: bool,
) -> Result<Scoring> {
    let t = Instant::now();
    // Whether `p_smoothed` holds the smoothed estimator's probabilities.
    let (infgram, rows_seconds, smoothed_seconds, smoothed) = match estimator.estimator()? {
        Estimator::Sbis { .. } => {
            let end = *neural
                .eos_tokens()
                .first()
                .ok_or_else(|| crate::error::Error::input("the neural model has no end token"))?;
            let ends = (end, neural.vocab_size());
            let (positions, rows_seconds, smoothed_seconds) =
                tracked_positions(index, tokens, estimator, MIX_CONTEXT, ends, smoothed)?;
            (positions, rows_seconds, smoothed_seconds, smoothed)
        }
        _ => {
            let positions = infgram_positions(index, tokens, estimator, MIX_CONTEXT)?;
            (positions, t.elapsed().as_secs_f64(), 0.0, true)
        }
    };
    let t = Instant::now();
    let overlap = overlap(index, tokens, OVERLAP_N);
    let infgram_seconds = rows_seconds + t.elapsed().as_secs_f64();
    let t = Instant::now();
    let tops: Vec<Option<u32>> = infgram.iter().map(|g| g.top.map(|t| t.0)).collect();
    let neural_p = neural_positions(neural, tokens, window, stride, &tops)?;
    let document = DocumentOverlap {
        document: String::new(),
        tokens: infgram.len(),
        overlap,
        left_out: false,
        windows: (tokens.len() + 1).saturating_sub(OVERLAP_N),
    };
    Ok(Scoring {
        infgram,
        neural: neural_p,
        neural_seconds: t.elapsed().as_secs_f64(),
        infgram_seconds,
        smoothed_seconds,
        smoothed,
        overlap,
        documents: vec![document],
        all: None,
    })
}

impl Scoring {
    /// The same scoring with its (single) document named `name`.
    pub fn named(mut self, name: &str) -> Scoring {
        for d in &mut self.documents {
            d.document = name.to_string();
        }
        self
    }

    /// Documents scored each on its own, as one text: their positions pooled (so their
    /// perplexity is over all their tokens), the overlap pooled over their windows.
    pub fn join(parts: Vec<Scoring>) -> Scoring {
        let mut out = Scoring {
            infgram: Vec::new(),
            neural: Vec::new(),
            neural_seconds: 0.0,
            infgram_seconds: 0.0,
            smoothed_seconds: 0.0,
            smoothed: true,
            overlap: 0.0,
            documents: Vec::new(),
            all: None,
        };
        for part in parts {
            out.infgram.extend(part.infgram);
            out.neural.extend(part.neural);
            out.neural_seconds += part.neural_seconds;
            out.infgram_seconds += part.infgram_seconds;
            out.smoothed_seconds += part.smoothed_seconds;
            out.smoothed &= part.smoothed;
            out.documents.extend(part.documents);
        }
        let windows: usize = out.documents.iter().map(|d| d.windows).sum();
        let found: f64 = out
            .documents
            .iter()
            .map(|d| d.overlap * d.windows as f64)
            .sum();
        out.overlap = if windows == 0 {
            0.0
        } else {
            found / windows as f64
        };
        out
    }

    /// The documents whose overlap is above `max` left out of the headline figure (the
    /// infini-gram paper's decontamination drops those above 0.8): listed as left out, with
    /// the report over every document kept beside it.
    pub fn leave_out_above(self, max: f64) -> Scoring {
        if !self.documents.iter().any(|d| d.overlap > max) {
            return self;
        }
        let mut kept = Vec::new();
        let mut at = 0;
        let mut documents = self.documents.clone();
        for d in &mut documents {
            let range = at..at + d.tokens;
            at += d.tokens;
            d.left_out = d.overlap > max;
            if !d.left_out {
                kept.push(Scoring {
                    infgram: self.infgram[range.clone()].to_vec(),
                    neural: self.neural[range].to_vec(),
                    neural_seconds: 0.0,
                    infgram_seconds: 0.0,
                    smoothed_seconds: 0.0,
                    smoothed: self.smoothed,
                    overlap: d.overlap,
                    documents: vec![d.clone()],
                    all: None,
                });
            }
        }
        let mut out = Scoring::join(kept);
        out.neural_seconds = self.neural_seconds;
        out.infgram_seconds = self.infgram_seconds;
        out.smoothed_seconds = self.smoothed_seconds;
        out.documents = documents;
        out.all = Some(Box::new(self));
        out
    }

    /// What both models knew at each position.
    fn confidences(&self) -> impl Iterator<Item = Confidence> + '_ {
        self.infgram
            .iter()
            .zip(&self.neural)
            .map(|(g, q)| Confidence::join(g.evidence, g.top, q.view, |_| q.q_of_infgram_top))
    }

    /// The report of `mixer` over these positions.
    fn mix_report(&self, mixer: &Mixer) -> MixReport {
        let lambdas: Vec<f64> = self.confidences().map(|c| mixer.lambda_at(&c)).collect();
        let q: Vec<f64> = self.neural.iter().map(|n| n.q).collect();
        MixReport::with_lambdas(&self.infgram, &q, &lambdas)
    }

    /// The mixture's perplexity report under `mixer`.
    pub fn report(&self, mixer: &Mixer) -> ScoredMixture {
        ScoredMixture {
            report: self.mix_report(mixer),
            overlap: self.overlap,
            seconds: self.neural_seconds + self.infgram_seconds + self.smoothed_seconds,
            neural_seconds: self.neural_seconds,
            infgram_seconds: self.infgram_seconds,
            smoothed_seconds: self.smoothed_seconds,
            infgram_ppl_smoothed: self.smoothed,
            mixer: mixer.clone(),
            overlap_by_document: self.documents.clone(),
            with_left_out: self.all.as_ref().map(|all| all.mix_report(mixer)),
        }
    }

    /// λ fitted on these positions (a table over `edges`; empty: the paper's two weights).
    pub fn fit(&self, estimator: EstimatorSpec, edges: &[usize]) -> Mixer {
        let q: Vec<f64> = self.neural.iter().map(|n| n.q).collect();
        Mixer::fit(estimator, edges, &fitting_data(&self.infgram, &q))
    }

    /// The table of [`Scoring::fit`] and, beside it, a [`LambdaModel`] fitted on the same
    /// positions from both models' views, which then decides λ.
    pub fn fit_features(&self, estimator: EstimatorSpec, edges: &[usize]) -> Mixer {
        let mut mixer = self.fit(estimator, edges);
        let points: Vec<FitPoint> = self
            .infgram
            .iter()
            .zip(&self.neural)
            .zip(self.confidences())
            .map(|((g, n), confidence)| FitPoint {
                p: g.p,
                q: n.q,
                confidence,
            })
            .collect();
        mixer.features = Some(LambdaModel::fit(&points));
        mixer
    }
}
