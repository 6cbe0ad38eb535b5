//! λ from what *both* models know at a position: the ∞-gram's evidence (suffix length, count,
//! distinct continuations, its top probability) and the neural model's confidence (its top
//! probability, entropy, the probability it gives the ∞-gram's favourite, whether the two
//! favourites agree). A logistic model `λ = σ(b + w·x)` over those inputs ([`LambdaModel`]),
//! fitted by maximum likelihood of the mixture on held-out positions ([`LambdaModel::fit`]).
//!
//! The inputs include the (suffix-length bucket × sparse) cells of the λ table as indicators,
//! so the model can express any table: fitted on the same positions it is never worse than
//! the table there. The fit is EM for a mixture with a logistic gate: the E-step takes each
//! position's posterior of the ∞-gram component `r = λp / (λp + (1 − λ)q)`; the M-step is a
//! weighted logistic regression of `r` (two Newton steps, a small ridge on `w`), which raises
//! the likelihood at every iteration.

use super::TABLE_EDGES;
use crate::error::{Error, Result};
use crate::lm::Logits;
use crate::ngram::Evidence;
use serde::{Deserialize, Serialize};

/// What the two models knew at one position before its token: a mixer's inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Confidence {
    /// The ∞-gram's evidence.
    pub evidence: Evidence,
    /// The ∞-gram row's largest probability (0 without a row).
    pub infgram_top_p: f64,
    /// The neural model's largest probability.
    pub neural_top_p: f64,
    /// The entropy of the neural distribution (nats).
    pub neural_entropy: f64,
    /// The neural model's probability of the ∞-gram's most likely token (0 without a row).
    pub neural_p_of_infgram_top: f64,
    /// Whether the two most likely tokens are the same.
    pub agree: bool,
}

/// The neural model's side of [`Confidence`], from one row of logits.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NeuralView {
    /// Its most likely token.
    pub top: u32,
    /// That token's probability.
    pub top_p: f64,
    /// The distribution's entropy (nats).
    pub entropy: f64,
}

impl NeuralView {
    /// The view of a dense row of logits (any scale) whose log-sum-exp is `lse`.
    pub fn of_logits(logits: &[f32], lse: f64) -> NeuralView {
        let (mut top, mut max) = (0u32, f32::NEG_INFINITY);
        let mut expected = 0.0f64;
        for (i, &x) in logits.iter().enumerate() {
            if x > max {
                (top, max) = (i as u32, x);
            }
            if x.is_finite() {
                let lp = x as f64 - lse;
                expected += lp.exp() * lp;
            }
        }
        NeuralView {
            top,
            top_p: (max as f64 - lse).exp(),
            entropy: -expected,
        }
    }
}

impl Confidence {
    /// Joins the ∞-gram's view (its evidence, and its most likely token with that token's
    /// probability) with the neural model's (`neural`, and `neural_p` of any token).
    pub fn join(
        evidence: Evidence,
        infgram_top: Option<(u32, f64)>,
        neural: NeuralView,
        neural_p: impl Fn(u32) -> f64,
    ) -> Confidence {
        Confidence {
            evidence,
            infgram_top_p: infgram_top.map_or(0.0, |t| t.1),
            neural_top_p: neural.top_p,
            neural_entropy: neural.entropy,
            neural_p_of_infgram_top: infgram_top.map_or(0.0, |t| neural_p(t.0)),
            agree: infgram_top.is_some_and(|t| t.0 == neural.top),
        }
    }

    /// The model's inputs, in the order of [`input_names`].
    fn inputs(&self, out: &mut Vec<f64>) {
        out.clear();
        let ev = &self.evidence;
        let bucket = TABLE_EDGES.partition_point(|&e| e <= ev.suffix_len);
        for b in 0..=TABLE_EDGES.len() {
            out.push(f64::from(u8::from(b == bucket && ev.sparse())));
            out.push(f64::from(u8::from(b == bucket && !ev.sparse())));
        }
        let agree = f64::from(u8::from(self.agree));
        let lq_top = self.neural_p_of_infgram_top.max(1e-10).ln();
        out.extend([
            (1.0 + ev.suffix_len as f64).ln(),
            (1.0 + ev.count as f64).ln(),
            (1.0 + ev.distinct as f64).ln(),
            self.infgram_top_p,
            self.neural_top_p,
            self.neural_entropy,
            self.neural_p_of_infgram_top,
            lq_top,
            agree,
            agree * self.infgram_top_p,
            agree * self.neural_top_p,
            self.infgram_top_p * self.neural_top_p,
            self.infgram_top_p * lq_top,
            (1.0 + ev.count as f64).ln() * self.neural_top_p,
        ]);
    }
}

/// The first entry with the largest value above `floor` (the lowest id on a tie, entries
/// coming in ascending id order); `None` when no value is above it.
pub fn first_max<T: PartialOrd + Copy>(
    entries: impl IntoIterator<Item = (u32, T)>,
    floor: T,
) -> Option<(u32, T)> {
    let mut best: Option<(u32, T)> = None;
    for (id, x) in entries {
        if x > floor && best.is_none_or(|b| x > b.1) {
            best = Some((id, x));
        }
    }
    best
}

/// The most likely token of `(id, ln p)` entries and its probability ([`first_max`]).
pub fn top_of_logprobs(entries: impl IntoIterator<Item = (u32, f32)>) -> Option<(u32, f64)> {
    first_max(entries, f32::NEG_INFINITY).map(|(id, lp)| (id, (lp as f64).exp()))
}

/// The most likely token of an ∞-gram row (`ln p` entries) and its probability: the first of
/// the largest (lowest id on a tie); `None` for a row with no support.
pub fn row_top(row: &Logits) -> Option<(u32, f64)> {
    match row {
        Logits::Sparse { entries, .. } => top_of_logprobs(entries.iter().copied()),
        Logits::Dense(v) => top_of_logprobs((0..v.len() as u32).zip(v.iter().copied())),
    }
}

/// What both models knew at a row: the ∞-gram's `evidence` and most likely token with its
/// probability ([`row_top`]), and the neural model's logits there (any scale).
pub fn confidence_of_rows(
    evidence: Evidence,
    neural: &[f32],
    infgram_top: Option<(u32, f64)>,
) -> Confidence {
    let lse = crate::lm::log_sum_exp_row(neural);
    let view = NeuralView::of_logits(neural, lse);
    Confidence::join(evidence, infgram_top, view, |id| {
        neural
            .get(id as usize)
            .map_or(0.0, |&x| (x as f64 - lse).exp())
    })
}

/// The names of the model's inputs, in order (a mixer file names them: one written for other
/// inputs is refused).
pub fn input_names() -> Vec<String> {
    let mut names = Vec::new();
    for b in 0..=TABLE_EDGES.len() {
        names.push(format!("bucket{b}_sparse"));
        names.push(format!("bucket{b}_dense"));
    }
    for n in [
        "ln_suffix_len",
        "ln_count",
        "ln_distinct",
        "infgram_top_p",
        "neural_top_p",
        "neural_entropy",
        "neural_p_of_infgram_top",
        "ln_neural_p_of_infgram_top",
        "agree",
        "agree_x_infgram_top_p",
        "agree_x_neural_top_p",
        "infgram_top_p_x_neural_top_p",
        "infgram_top_p_x_ln_neural_p_of_infgram_top",
        "ln_count_x_neural_top_p",
    ] {
        names.push(n.to_string());
    }
    names
}

/// λ = σ(bias + Σ weight_i · (x_i − mean_i) / scale_i) over the inputs of [`input_names`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaModel {
    /// The inputs' names, in order.
    pub inputs: Vec<String>,
    /// Each input's mean on the fitting data.
    pub mean: Vec<f64>,
    /// … and its standard deviation (1 where it was constant).
    pub scale: Vec<f64>,
    /// The weight of each standardized input.
    pub weights: Vec<f64>,
    /// The bias.
    pub bias: f64,
}

/// One position to fit on: the ∞-gram's and the neural model's probability of the actual
/// token, and what both knew before it.
#[derive(Clone, Copy, Debug)]
pub struct FitPoint {
    /// P∞(actual token).
    pub p: f64,
    /// P_neural(actual token).
    pub q: f64,
    /// The inputs.
    pub confidence: Confidence,
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Ridge on the standardized weights (keeps the one-hot cells and rare inputs finite).
const RIDGE: f64 = 1e-3;
/// EM iterations at most.
const MAX_ITERATIONS: usize = 300;

impl LambdaModel {
    /// λ at a position.
    pub fn lambda(&self, c: &Confidence) -> f64 {
        let mut x = Vec::with_capacity(self.weights.len());
        c.inputs(&mut x);
        self.lambda_of(&x)
    }

    fn lambda_of(&self, x: &[f64]) -> f64 {
        let z = x
            .iter()
            .zip(&self.mean)
            .zip(&self.scale)
            .zip(&self.weights)
            .map(|(((x, m), s), w)| w * (x - m) / s)
            .sum::<f64>();
        sigmoid(self.bias + z)
    }

    /// Refuses a model for other inputs, or with numbers that are not finite.
    pub fn check(&self) -> Result<()> {
        let names = input_names();
        if self.inputs != names {
            return Err(Error::input(format!(
                "the mixer's λ model takes the inputs {:?}, but this infgram computes {:?}: fit \
                 it again with `infgram mix fit --features`",
                self.inputs, names
            )));
        }
        let n = names.len();
        if self.mean.len() != n || self.scale.len() != n || self.weights.len() != n {
            return Err(Error::input(format!(
                "the mixer's λ model needs {n} means, scales and weights"
            )));
        }
        let all = self.mean.iter().chain(&self.scale).chain(&self.weights);
        if !self.bias.is_finite() || all.clone().any(|x| !x.is_finite()) {
            return Err(Error::input(
                "the mixer's λ model has a number that is not finite",
            ));
        }
        if self.scale.iter().any(|&s| s <= 0.0) {
            return Err(Error::input(
                "the mixer's λ model has a scale that is not positive",
            ));
        }
        Ok(())
    }

    /// Fits the model by maximum likelihood of `Σ ln(λp + (1 − λ)q)` on `points` (EM with a
    /// logistic gate; see the module docs).
    pub fn fit(points: &[FitPoint]) -> LambdaModel {
        let names = input_names();
        let d = names.len();
        let n = points.len();
        let mut xs = vec![0.0; n * d];
        let mut row = Vec::with_capacity(d);
        for (i, p) in points.iter().enumerate() {
            p.confidence.inputs(&mut row);
            xs[i * d..(i + 1) * d].copy_from_slice(&row);
        }
        let mut mean = vec![0.0; d];
        let mut scale = vec![1.0; d];
        if n > 0 {
            for j in 0..d {
                let m = (0..n).map(|i| xs[i * d + j]).sum::<f64>() / n as f64;
                let v = (0..n).map(|i| (xs[i * d + j] - m).powi(2)).sum::<f64>() / n as f64;
                mean[j] = m;
                scale[j] = if v > 1e-12 { v.sqrt() } else { 1.0 };
            }
            for i in 0..n {
                for j in 0..d {
                    xs[i * d + j] = (xs[i * d + j] - mean[j]) / scale[j];
                }
            }
        }
        let pooled = super::em_lambda(points.iter().map(|p| (p.p, p.q))).clamp(1e-4, 1.0 - 1e-4);
        // theta = [bias, weights…] over standardized inputs.
        let mut theta = vec![0.0; d + 1];
        theta[0] = (pooled / (1.0 - pooled)).ln();
        let z = |theta: &[f64], x: &[f64]| {
            theta[0] + x.iter().zip(&theta[1..]).map(|(a, b)| a * b).sum::<f64>()
        };
        let loglik = |theta: &[f64]| -> f64 {
            (0..n)
                .map(|i| {
                    let l = sigmoid(z(theta, &xs[i * d..(i + 1) * d]));
                    let p = &points[i];
                    (l * p.p + (1.0 - l) * p.q).max(1e-300).ln()
                })
                .sum()
        };
        let mut last = loglik(&theta);
        let mut r = vec![0.0; n];
        for _ in 0..MAX_ITERATIONS {
            for i in 0..n {
                let l = sigmoid(z(&theta, &xs[i * d..(i + 1) * d]));
                let p = &points[i];
                let m = l * p.p + (1.0 - l) * p.q;
                r[i] = if m > 0.0 { l * p.p / m } else { l };
            }
            let before = theta.clone();
            for _ in 0..2 {
                newton_step(&mut theta, &xs, &r, d);
            }
            let now = loglik(&theta);
            if now < last {
                // A Newton step overshot: keep the last parameters (EM never loses likelihood).
                theta = before;
                break;
            }
            let gained = now - last;
            last = now;
            if gained < 1e-9 * n.max(1) as f64 {
                break;
            }
        }
        LambdaModel {
            inputs: names,
            mean,
            scale,
            weights: theta[1..].to_vec(),
            bias: theta[0],
        }
    }
}

/// One Newton step of the weighted logistic regression of soft targets `r` on the rows of
/// `xs` (`d` inputs each, plus a bias), with a ridge on the weights.
fn newton_step(theta: &mut [f64], xs: &[f64], r: &[f64], d: usize) {
    let k = d + 1;
    let mut grad = vec![0.0; k];
    let mut hess = vec![0.0; k * k];
    let mut x1 = vec![1.0; k];
    for (i, &ri) in r.iter().enumerate() {
        x1[1..].copy_from_slice(&xs[i * d..(i + 1) * d]);
        let z: f64 = x1.iter().zip(theta.iter()).map(|(a, b)| a * b).sum();
        let s = sigmoid(z);
        let w = (s * (1.0 - s)).max(1e-12);
        let g = ri - s;
        for a in 0..k {
            grad[a] += g * x1[a];
            let wa = w * x1[a];
            for b in a..k {
                hess[a * k + b] += wa * x1[b];
            }
        }
    }
    for a in 1..k {
        grad[a] -= RIDGE * r.len() as f64 * theta[a];
        hess[a * k + a] += RIDGE * r.len() as f64;
    }
    for a in 0..k {
        for b in 0..a {
            hess[a * k + b] = hess[b * k + a];
        }
    }
    if let Some(step) = solve_spd(&mut hess, &grad, k) {
        for (t, s) in theta.iter_mut().zip(step) {
            *t += s;
        }
    }
}

/// Solves `A x = b` for a symmetric positive definite `A` (`k × k`, overwritten) by Cholesky;
/// `None` when it is not positive definite.
fn solve_spd(a: &mut [f64], b: &[f64], k: usize) -> Option<Vec<f64>> {
    for j in 0..k {
        let mut s = a[j * k + j];
        for m in 0..j {
            s -= a[j * k + m] * a[j * k + m];
        }
        if s <= 0.0 || !s.is_finite() {
            return None;
        }
        let l = s.sqrt();
        a[j * k + j] = l;
        for i in j + 1..k {
            let mut s = a[i * k + j];
            for m in 0..j {
                s -= a[i * k + m] * a[j * k + m];
            }
            a[i * k + j] = s / l;
        }
    }
    let mut y = vec![0.0; k];
    for i in 0..k {
        let s: f64 = (0..i).map(|m| a[i * k + m] * y[m]).sum();
        y[i] = (b[i] - s) / a[i * k + i];
    }
    let mut x = vec![0.0; k];
    for i in (0..k).rev() {
        let s: f64 = (i + 1..k).map(|m| a[m * k + i] * x[m]).sum();
        x[i] = (y[i] - s) / a[i * k + i];
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Positions whose token comes from the ∞-gram with a λ that depends on the neural
    /// model's confidence: the fitted model finds that dependence, beats the best constant λ,
    /// and never loses likelihood against the table's cells.
    #[test]
    fn fit_learns_a_lambda_that_depends_on_the_neural_model() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let points: Vec<FitPoint> = (0..20_000)
            .map(|_| {
                let neural_top_p: f64 = rng.random::<f64>();
                // The ∞-gram is trusted where the model is unsure.
                let truth = 0.9 * (1.0 - neural_top_p);
                let from_infgram = rng.random::<f64>() < truth;
                let (p, q) = if from_infgram {
                    (0.8, 0.05)
                } else {
                    (0.01, 0.6)
                };
                FitPoint {
                    p,
                    q,
                    confidence: Confidence {
                        evidence: Evidence {
                            suffix_len: rng.random_range(0..20),
                            count: rng.random_range(1..100),
                            distinct: rng.random_range(1..5),
                        },
                        infgram_top_p: 0.5,
                        neural_top_p,
                        neural_entropy: 1.0,
                        neural_p_of_infgram_top: 0.1,
                        agree: false,
                    },
                }
            })
            .collect();
        let model = LambdaModel::fit(&points);
        model.check().unwrap();
        let at = |t: f64| {
            let mut c = points[0].confidence;
            c.neural_top_p = t;
            model.lambda(&c)
        };
        assert!(
            at(0.05) > 0.6 && at(0.95) < 0.2,
            "{} {}",
            at(0.05),
            at(0.95)
        );
        let ll = |f: &dyn Fn(&FitPoint) -> f64| -> f64 {
            points
                .iter()
                .map(|p| {
                    let l = f(p);
                    (l * p.p + (1.0 - l) * p.q).ln()
                })
                .sum()
        };
        let constant = super::super::em_lambda(points.iter().map(|p| (p.p, p.q)));
        assert!(ll(&|p| model.lambda(&p.confidence)) > ll(&|_| constant) + 100.0);
    }

    #[test]
    fn models_for_other_inputs_are_refused() {
        let mut m = LambdaModel::fit(&[]);
        m.check().unwrap();
        m.inputs.pop();
        assert!(m.check().unwrap_err().to_string().contains("--features"));
        let mut m = LambdaModel::fit(&[]);
        m.weights[0] = f64::NAN;
        assert!(m.check().is_err());
    }

    #[test]
    fn cholesky_solves() {
        let mut a = vec![4.0, 2.0, 2.0, 3.0];
        let x = solve_spd(&mut a, &[2.0, 1.0], 2).unwrap();
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12, "{x:?}");
    }
}
