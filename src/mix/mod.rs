//! Mixing the ∞-gram with a neural model at every step:
//! `P = λ·P∞ + (1 − λ)·P_neural`, with λ chosen per position from what the ∞-gram knew there
//! ([`Evidence`]: the length of the longest matching suffix and whether its continuation is
//! unique), as the infini-gram paper (Liu et al. 2024, §5) does with two weights and its
//! time-shifted experiment does with features.
//!
//! * [`Mixer`]: λ as a table over (suffix-length bucket, sparse), fitted by maximum likelihood
//!   (EM, each cell on its own) on held-out positions ([`Mixer::fit`]); read from and written to
//!   `mix.json`. [`Mixer::default`] was fitted on Tiny Shakespeare.
//! * [`Interpolated`]: the mixture as a [`LanguageModel`], so generation, speculative decoding
//!   (the ∞-gram drafts, the mixture verifies) and scoring get it like any model.
//!
//! # How the mixture is computed
//!
//! `mix::Interpolated` is a `LanguageModel` over a neural model and an `InfgramModel` of an index
//! built with the neural model's tokenizer (the ∞-gram gets exactly the model's vocabulary; the
//! separator is the model's end token). Both are fed the same tokens and cut back together; each
//! row is `ln(λ·P∞ + (1 − λ)·P_neural)`, computed densely once per row (the neural row shifted by
//! `ln(1 − λ) − logsumexp`, then the ∞-gram's support, a handful of ids, mixed exactly). λ comes
//! from `mix::Mixer`, a table over what the ∞-gram knew at the position (`ngram::Evidence`: the
//! length of the longest suffix with a next token, and whether that next token is unique — the
//! paper's "sparse"): nine suffix-length buckets × sparse or not, or one bucket (the paper's two
//! weights). Each cell is fitted on held-out positions by EM, which maximizes
//! `Σ ln(λ·p + (1 − λ)·q)` (concave in λ): λ ← the mean posterior of the ∞-gram component. Being a
//! scorer, the mixture gets generation, speculative decoding (drafts verified against the
//! mixture: lossless by the loop's construction) and perplexity for free.
//!
//! Interpolated perplexity ([`score`]) does not run the `Interpolated`
//! model: a perplexity needs only the probability of the actual token, so the neural model scores
//! the text once in the paper's windows, the ∞-gram scores every position in parallel straight from
//! the levels, and any mixer (fitted or given) combines the two columns. The same columns fit λ.
//! The decontamination check reports the share of the text's 13-token windows that occur in the
//! index (the paper's BFF check used 13-grams and 80%).

pub mod batch;
pub mod features;
pub mod open;
pub mod score;

pub use batch::{lambdas, mix_rows, mix_targets};
pub use features::{Confidence, LambdaModel};
pub use open::{
    check_mixing_index, load_mixer, mixing_needs_an_index, mixture_model, open_mixing_index,
    MIX_CONTEXT,
};
pub use score::{score_both, MixReport, ScoredMixture, Scoring};

use crate::error::{Error, Result};
use crate::lm::{LanguageModel, Logits, RowForm};
use crate::ngram::{EstimatorSpec, Evidence, InfgramModel};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::Path;

/// How `mix.json` files written before [`EstimatorSpec`] named their estimator
/// (`"infgram"`, `{"sbis": {"k": 2}}`, `"smoothed"`); still read.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum LegacyEstimator {
    Infgram,
    Sbis { k: i64 },
    Smoothed,
}

/// A mixer file's estimator in either form; an error is the current form's (what a user
/// writes today), never serde's "did not match any variant".
fn read_estimator<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<EstimatorSpec, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    let spec_error = match EstimatorSpec::deserialize(&value) {
        Ok(spec) => return Ok(spec),
        Err(e) => e,
    };
    match LegacyEstimator::deserialize(&value) {
        Ok(LegacyEstimator::Infgram) => Ok(EstimatorSpec::Infgram),
        Ok(LegacyEstimator::Sbis { k }) => Ok(EstimatorSpec::sbis(k)),
        Ok(LegacyEstimator::Smoothed) => Ok(EstimatorSpec::Smoothed),
        Err(_) => Err(serde::de::Error::custom(format!(
            "estimator {value}: {spec_error} (write it as {{\"name\": \"sbis\", \"k\": 2}})"
        ))),
    }
}

/// Upper ends (exclusive) of the suffix-length buckets of the λ table ([`Mixer`]): 0, 1, 2, 3, 4–5,
/// 6–7, 8–11, 12–15, 16 and more.
pub const TABLE_EDGES: [usize; 8] = [1, 2, 3, 4, 6, 8, 12, 16];

/// λ per position: a table over (suffix-length bucket, sparse or not). A file with a field
/// it does not know is refused (a misspelt field is never ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mixer {
    /// The ∞-gram distribution mixed in.
    #[serde(deserialize_with = "read_estimator")]
    pub estimator: EstimatorSpec,
    /// Upper ends (exclusive) of the suffix-length buckets; empty: one bucket.
    pub edges: Vec<usize>,
    /// λ of each bucket where the ∞-gram estimate is sparse (one possible next token).
    pub sparse: Vec<f64>,
    /// λ of each bucket where it is not.
    pub dense: Vec<f64>,
    /// λ from what both models know at a position ([`LambdaModel`], fitted by `infgram mix fit
    /// --features`): where present it decides λ, and the table is what it was fitted beside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<LambdaModel>,
}

impl Default for Mixer {
    /// SBIS with two levels and the table by suffix length, fitted with SmolLM2-135M on Tiny
    /// Shakespeare: index = the first 95% of train, λ fitted on the rest of train
    /// (`cargo run --release --example bench_decode -- mix` prints it; `BENCHMARKS.md`, "Mixing"). Of the
    /// three ∞-gram distributions it scores within 0.3% of the best (the smoothed estimator)
    /// while its rows stay sparse, so mixing costs a handful of ids per step.
    fn default() -> Self {
        Mixer {
            estimator: EstimatorSpec::sbis(2),
            edges: TABLE_EDGES.to_vec(),
            sparse: vec![
                0.0707, 0.0536, 0.0528, 0.0904, 0.098, 0.0905, 0.3842, 0.1457, 0.0707,
            ],
            dense: vec![
                0.0, 0.0428, 0.0913, 0.1362, 0.089, 0.1079, 0.0344, 0.0707, 0.0707,
            ],
            features: None,
        }
    }
}

impl Mixer {
    /// One λ everywhere.
    pub fn constant(estimator: EstimatorSpec, lambda: f64) -> Mixer {
        Mixer {
            estimator,
            edges: Vec::new(),
            sparse: vec![lambda],
            dense: vec![lambda],
            features: None,
        }
    }

    /// The bucket of a suffix length.
    fn bucket(&self, suffix_len: usize) -> usize {
        self.edges.partition_point(|&e| e <= suffix_len)
    }

    /// The table's λ at a position with this evidence (a mixer with a [`LambdaModel`] needs
    /// both models' views: [`Mixer::lambda_at`]).
    pub fn lambda(&self, ev: &Evidence) -> f64 {
        let b = self.bucket(ev.suffix_len);
        if ev.sparse() {
            self.sparse[b]
        } else {
            self.dense[b]
        }
    }

    /// λ at a position where both models' views are known: the λ model's when there is one,
    /// else the table's.
    pub fn lambda_at(&self, c: &Confidence) -> f64 {
        match &self.features {
            Some(model) => model.lambda(c),
            None => self.lambda(&c.evidence),
        }
    }

    /// Whether λ reads the neural model's confidence (it has a [`LambdaModel`]), so that only
    /// callers with the neural model's whole rows can compute it.
    pub fn reads_neural(&self) -> bool {
        self.features.is_some()
    }

    /// Refuses a malformed table (wrong lengths, λ outside [0, 1], edges not increasing).
    pub fn check(&self) -> Result<()> {
        let cells = self.edges.len() + 1;
        if self.sparse.len() != cells || self.dense.len() != cells {
            return Err(Error::input(format!(
                "a mixer with {} edges needs {cells} λ for sparse and {cells} for dense positions (got {} and {})",
                self.edges.len(),
                self.sparse.len(),
                self.dense.len()
            )));
        }
        if let Some(l) = self
            .sparse
            .iter()
            .chain(&self.dense)
            .find(|l| !(0.0..=1.0).contains(*l))
        {
            return Err(Error::input(format!("λ must be between 0 and 1 (got {l})")));
        }
        if self.edges.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::input("the mixer's edges must increase"));
        }
        self.estimator
            .estimator()
            .map_err(|e| Error::input(format!("the mixer's estimator: {e}")))?;
        if let Some(model) = &self.features {
            model.check()?;
        }
        Ok(())
    }

    /// Reads `mix.json` (written by [`Mixer::save`]).
    pub fn load(path: &Path) -> Result<Mixer> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::input(format!(
                    "no mixer file {}: write one with `infgram mix fit … -o FILE`; the \
                     built-in mixer needs none (`gen --mix` alone, `ppl` without `--mix`)",
                    path.display()
                ))
            } else {
                Error::io(path, e)
            }
        })?;
        let mixer: Mixer = serde_json::from_str(&text).map_err(|e| {
            Error::input(format!(
                "{} is not a mixer file (write one with `infgram mix fit`): {e}",
                path.display()
            ))
        })?;
        mixer.check()?;
        Ok(mixer)
    }

    /// Writes the mixer as JSON (a regular file, written beside and renamed into place:
    /// [`crate::output_file`]).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a mixer serializes");
        crate::output_file::write_bytes(path, (text + "\n").as_bytes())
    }

    /// Fits λ by maximum likelihood on held-out positions, each cell of the table on its own
    /// (EM: λ ← mean posterior of the ∞-gram component, from 0.5 until it moves less than
    /// 1e-7). `positions` are `(P∞(actual), P_neural(actual), evidence)`. Cells with fewer
    /// than `MIN_CELL` positions take the λ fitted on all positions.
    pub fn fit(
        estimator: EstimatorSpec,
        edges: &[usize],
        positions: &[(f64, f64, Evidence)],
    ) -> Mixer {
        const MIN_CELL: usize = 30;
        let mut mixer = Mixer {
            estimator,
            edges: edges.to_vec(),
            sparse: vec![0.0; edges.len() + 1],
            dense: vec![0.0; edges.len() + 1],
            features: None,
        };
        let pooled = em_lambda(positions.iter().map(|p| (p.0, p.1)));
        for b in 0..=edges.len() {
            for sparse in [true, false] {
                let cell: Vec<(f64, f64)> = positions
                    .iter()
                    .filter(|p| mixer.bucket(p.2.suffix_len) == b && p.2.sparse() == sparse)
                    .map(|p| (p.0, p.1))
                    .collect();
                let l = if cell.len() < MIN_CELL {
                    pooled
                } else {
                    em_lambda(cell.iter().copied())
                };
                if sparse {
                    mixer.sparse[b] = l;
                } else {
                    mixer.dense[b] = l;
                }
            }
        }
        mixer
    }
}

/// The λ maximizing `Σ ln(λ·p + (1 − λ)·q)` over `(p, q)` pairs (EM; 0.5 without data).
pub fn em_lambda(pairs: impl Iterator<Item = (f64, f64)> + Clone) -> f64 {
    let n = pairs.clone().count();
    if n == 0 {
        return 0.5;
    }
    let mut lambda = 0.5;
    for _ in 0..1000 {
        let post: f64 = pairs
            .clone()
            .map(|(p, q)| {
                let mix = lambda * p + (1.0 - lambda) * q;
                if mix > 0.0 {
                    lambda * p / mix
                } else {
                    0.0
                }
            })
            .sum();
        let next = post / n as f64;
        let moved = (next - lambda).abs();
        lambda = next;
        if moved < 1e-7 {
            break;
        }
    }
    lambda
}

/// One mixed row: `ln(λ·P∞ + (1 − λ)·softmax(neural))` for every id, from the neural model's
/// dense logits and the ∞-gram's row (log-probabilities, sparse). λ = 0 gives the neural
/// distribution and λ = 1 the ∞-gram's (its row as it is).
pub fn mix_row(neural: Logits, infgram: Logits, lambda: f64) -> Logits {
    if lambda >= 1.0 {
        return infgram;
    }
    let mut out = neural.into_dense();
    match infgram {
        Logits::Sparse { entries, .. } => mix_in_place(&mut out, entries, lambda),
        dense => {
            let v = dense.into_dense();
            mix_in_place(&mut out, (0..v.len() as u32).zip(v), lambda)
        }
    }
    Logits::Dense(out)
}

/// `row` (a neural model's logits, any scale) becomes `ln(λ·P∞ + (1 − λ)·softmax(row))`, the
/// ∞-gram's row given as `(id, ln p)` entries (ids outside `row` are left out).
fn mix_in_place(row: &mut [f32], infgram: impl IntoIterator<Item = (u32, f32)>, lambda: f64) {
    if lambda >= 1.0 {
        row.fill(f32::NEG_INFINITY);
        for (id, lp) in infgram {
            if let Some(x) = row.get_mut(id as usize) {
                *x = lp;
            }
        }
        return;
    }
    let lse = crate::lm::log_sum_exp_row(row);
    let base = ((1.0 - lambda).ln() - lse) as f32;
    for x in row.iter_mut() {
        *x += base;
    }
    if lambda > 0.0 {
        for (id, lp) in infgram {
            if let Some(x) = row.get_mut(id as usize) {
                let q = (*x as f64 - (1.0 - lambda).ln()).exp(); // P_neural(id)
                let p = (lp as f64).exp();
                *x = (lambda * p + (1.0 - lambda) * q).ln() as f32;
            }
        }
    }
}

/// The mixture of a neural model and the ∞-gram as one [`LanguageModel`]: every fed position
/// gets `ln(λ·P∞ + (1 − λ)·P_neural)`, λ from the ∞-gram's evidence there.
///
/// The neural model is owned (`Box<dyn LanguageModel>`, the default) or borrowed (`&mut M`, a
/// server's model loaded once and mixed for one request).
pub struct Interpolated<N: LanguageModel = Box<dyn LanguageModel>> {
    neural: N,
    infgram: InfgramModel,
    mixer: Mixer,
    /// λ of each row of the last `score` call.
    lambdas: Vec<f64>,
    /// Rows of the last [`LanguageModel::score_first`] pass not mixed yet: the neural
    /// model's that it returned early and the ∞-gram's (front first), and the next row's index.
    neural_rows: VecDeque<Logits>,
    infgram_rows: VecDeque<Logits>,
    next_row: usize,
}

impl<N: LanguageModel> Interpolated<N> {
    /// Mixes `neural` with the ∞-gram of `corpus` (an index built with the neural model's
    /// tokenizer: the caller checks the fingerprint; or shards of one held elsewhere) over the
    /// last `context` tokens.
    pub fn new(
        neural: N,
        corpus: crate::index::shards::SharedShards,
        mixer: Mixer,
        context: usize,
    ) -> Result<Self> {
        mixer.check()?;
        let eos = *neural
            .eos_tokens()
            .first()
            .ok_or_else(|| Error::input("the neural model has no end token"))?;
        let infgram = InfgramModel::new(corpus, mixer.estimator.estimator()?, context)?
            .with_vocab(neural.vocab_size(), eos)?;
        Ok(Interpolated {
            neural,
            infgram,
            mixer,
            lambdas: Vec::new(),
            neural_rows: VecDeque::new(),
            infgram_rows: VecDeque::new(),
            next_row: 0,
        })
    }

    /// λ of each row of the last score call.
    pub fn last_lambdas(&self) -> &[f64] {
        &self.lambdas
    }

    /// The mixer.
    pub fn mixer(&self) -> &Mixer {
        &self.mixer
    }

    /// Mixes the next at most `count` rows of the last pass, asking the neural model for the
    /// ones it has not returned yet.
    fn mix_next(&mut self, count: usize) -> Result<Vec<Logits>> {
        let count = count.min(self.infgram_rows.len());
        if self.neural_rows.len() < count {
            let more = self.neural.score_more(count - self.neural_rows.len())?;
            self.neural_rows.extend(more);
        }
        let count = count.min(self.neural_rows.len());
        let rows = self
            .neural_rows
            .drain(..count)
            .zip(self.infgram_rows.drain(..count));
        let at = self.next_row..self.next_row + count;
        let lambdas = &mut self.lambdas[at.clone()];
        let evidence = &self.infgram.last_evidence()[at];
        let lambda_model = self.mixer.features.as_ref();
        let mixed = rows
            .zip(lambdas.iter_mut().zip(evidence))
            .map(|((n, g), (l, ev))| match lambda_model {
                None => mix_row(n, g, *l),
                Some(model) => {
                    let dense = n.into_dense();
                    let top = features::row_top(&g);
                    *l = model.lambda(&features::confidence_of_rows(*ev, &dense, top));
                    mix_row(Logits::Dense(dense), g, *l)
                }
            })
            .collect();
        self.next_row += count;
        Ok(mixed)
    }

    /// Hands rows of the last pass that were never mixed back to the ∞-gram model.
    fn drop_held_rows(&mut self) {
        self.neural_rows.clear();
        if !self.infgram_rows.is_empty() {
            self.infgram.recycle(self.infgram_rows.drain(..).collect());
        }
    }
}

impl<N: LanguageModel> LanguageModel for Interpolated<N> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        Ok(self
            .score(tokens)?
            .into_iter()
            .map(Logits::into_dense)
            .collect())
    }

    /// Mixes the first `first` rows only (a mixed row costs a softmax over the vocabulary,
    /// and the neural model may hold back its own): the others on
    /// [`LanguageModel::score_more`]. The ∞-gram's rows and every λ are computed at once.
    /// Its rows are full whatever `form` asks: a mixed row is a distribution.
    fn score_first(&mut self, tokens: &[u32], first: usize, form: RowForm) -> Result<Vec<Logits>> {
        let _ = form;
        self.drop_held_rows();
        let neural = self.neural.score_first(tokens, first, RowForm::Full)?;
        let infgram = self.infgram.score(tokens)?;
        let mixer = &self.mixer;
        self.lambdas.clear();
        self.lambdas
            .extend(self.infgram.last_evidence().iter().map(|e| mixer.lambda(e)));
        self.neural_rows.extend(neural);
        self.infgram_rows.extend(infgram);
        self.next_row = 0;
        self.mix_next(first.max(1))
    }

    fn score_more(&mut self, count: usize) -> Result<Vec<Logits>> {
        self.mix_next(count)
    }

    fn score(&mut self, tokens: &[u32]) -> Result<Vec<Logits>> {
        self.score_first(tokens, tokens.len(), RowForm::Full)
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.drop_held_rows();
        self.neural.feed(tokens)?;
        self.infgram.feed(tokens)
    }

    fn cache_len(&self) -> usize {
        self.neural.cache_len()
    }

    fn truncate(&mut self, len: usize) {
        self.drop_held_rows();
        self.neural.truncate(len);
        self.infgram.truncate(len);
    }

    fn vocab_size(&self) -> usize {
        self.neural.vocab_size()
    }

    fn eos_tokens(&self) -> &[u32] {
        self.neural.eos_tokens()
    }

    fn bos_token(&self) -> Option<u32> {
        self.neural.bos_token()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_rows_are_distributions_and_the_ends_are_the_components() {
        let neural = Logits::Dense(vec![1.0, 2.0, 0.5, -1.0]);
        let infgram = Logits::Sparse {
            vocab: 4,
            entries: vec![(1, 0.25f32.ln()), (3, 0.75f32.ln())],
        };
        for lambda in [0.0, 0.3, 0.9, 1.0] {
            let row = mix_row(neural.clone(), infgram.clone(), lambda);
            let p = row.softmax();
            let total: f64 = row
                .clone()
                .into_dense()
                .iter()
                .map(|&x| (x as f64).exp())
                .sum();
            assert!((total - 1.0).abs() < 1e-6, "λ={lambda}: Σ = {total}");
            let q = neural.softmax();
            let g = infgram.clone().into_dense();
            for id in 0..4u32 {
                let want =
                    lambda * (g[id as usize] as f64).exp() + (1.0 - lambda) * q[id as usize].1;
                let got = p.iter().find(|x| x.0 == id).map_or(0.0, |x| x.1);
                assert!(
                    (got - want).abs() < 1e-6,
                    "λ={lambda} id={id}: {got} vs {want}"
                );
            }
        }
        assert_eq!(mix_row(neural.clone(), infgram.clone(), 1.0), infgram);
    }

    #[test]
    fn em_recovers_the_generating_lambda() {
        // Tokens drawn from λ·p + (1 − λ)·q over 4 ids with a seeded generator.
        use rand::{Rng, SeedableRng};
        let p = [0.7, 0.1, 0.1, 0.1];
        let q = [0.1, 0.2, 0.3, 0.4];
        for truth in [0.2, 0.5, 0.8] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let pairs: Vec<(f64, f64)> = (0..20_000)
                .map(|_| {
                    let dist = if rng.random::<f64>() < truth { &p } else { &q };
                    let mut u = rng.random::<f64>();
                    let mut x = 0;
                    while u >= dist[x] && x < 3 {
                        u -= dist[x];
                        x += 1;
                    }
                    (p[x], q[x])
                })
                .collect();
            let got = em_lambda(pairs.iter().copied());
            assert!((got - truth).abs() < 0.03, "{got} vs {truth}");
        }
    }

    #[test]
    fn mixer_files_are_checked() {
        let mut m = Mixer::default();
        m.check().unwrap();
        m.sparse[0] = 1.5;
        assert!(m
            .check()
            .unwrap_err()
            .to_string()
            .contains("between 0 and 1"));
        let mut m = Mixer::default();
        m.dense.pop();
        assert!(m.check().is_err());
        // SBIS levels as the CLI takes them (a file with k = 0 was taken).
        for (k, ok) in [(0, false), (-2, false), (-1, true), (1, true), (7, true)] {
            let m = Mixer {
                features: None,
                estimator: EstimatorSpec::sbis(k),
                ..Mixer::default()
            };
            assert_eq!(m.check().is_ok(), ok, "k = {k}");
        }
        let dir = tempfile::tempdir().unwrap();
        // The estimator in the spec's form, and in the form of files written before it.
        for (estimator, want) in [
            (r#"{"name": "sbis", "k": 3}"#, EstimatorSpec::sbis(3)),
            (r#"{"name": "infgram"}"#, EstimatorSpec::Infgram),
            (r#"{"sbis": {"k": 2}}"#, EstimatorSpec::sbis(2)),
            (r#""infgram""#, EstimatorSpec::Infgram),
            (r#""smoothed""#, EstimatorSpec::Smoothed),
        ] {
            let file = dir.path().join("m.json");
            let text = format!(
                r#"{{"estimator": {estimator}, "edges": [], "sparse": [0.5], "dense": [0.1]}}"#
            );
            std::fs::write(&file, text).unwrap();
            assert_eq!(Mixer::load(&file).unwrap().estimator, want, "{estimator}");
        }
        let missing = Mixer::load(&dir.path().join("mix.json")).unwrap_err();
        assert!(missing.to_string().contains("infgram mix fit"), "{missing}");
        std::fs::write(dir.path().join("bad.json"), "nonsense").unwrap();
        let bad = Mixer::load(&dir.path().join("bad.json")).unwrap_err();
        assert!(bad.to_string().contains("is not a mixer file"), "{bad}");
        // Unknown fields are refused, at the top and in the estimator, by name; serde's
        // "untagged enum" never reaches a user.
        for (text, want) in [
            (
                r#"{"estimator": {"name": "sbis"}, "edges": [], "sparse": [0.5], "dense": [0.1], "lambda": 1}"#,
                "lambda",
            ),
            (
                r#"{"estimator": {"name": "sbis", "kk": 2}, "edges": [], "sparse": [0.5], "dense": [0.1]}"#,
                "kk",
            ),
            (
                r#"{"estimator": {"sbis": {"k": 2, "x": 1}}, "edges": [], "sparse": [0.5], "dense": [0.1]}"#,
                "estimator",
            ),
        ] {
            std::fs::write(dir.path().join("bad.json"), text).unwrap();
            let e = Mixer::load(&dir.path().join("bad.json"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && !e.contains("untagged"), "{e}");
        }
        let ev = |n, d| Evidence {
            suffix_len: n,
            count: 5,
            distinct: d,
        };
        let m = Mixer::default();
        assert_eq!(m.lambda(&ev(0, 1)), m.sparse[0]);
        assert_eq!(m.lambda(&ev(20, 3)), m.dense[8]);
        assert_eq!(m.lambda(&ev(5, 3)), m.dense[4]);
    }
}
