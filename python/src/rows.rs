//! The batch ∞-gram API for any model (`Index.infgram_rows`, `InfgramRows`): every position's
//! ∞-gram next-token distribution of a token sequence in one call, and the mixture of a user's
//! own neural log-probabilities with them by a saved mixer. Arrays cross the boundary as
//! little-endian bytes; `infgram/__init__.py` wraps them as numpy arrays (no copy). Every call
//! releases the GIL.

use crate::Guarded;
use infgram::service::request::EstimatorSpec;
use infgram::service::rows::{infgram_rows, Mixer, Rows, RowsOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::Arc;

type Ans = PyResult<Py<PyAny>>;

fn invalid(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Values of `width` bytes each from little-endian bytes (`what` names the argument).
fn values<T, const W: usize>(bytes: &[u8], what: &str, from: fn([u8; W]) -> T) -> PyResult<Vec<T>> {
    if !bytes.len().is_multiple_of(W) {
        return Err(invalid(format!(
            "{what}: {} bytes are not whole {W}-byte values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(W)
        .map(|c| from(c.try_into().expect("W bytes")))
        .collect())
}

fn le_bytes<T: Copy, const W: usize>(py: Python<'_>, xs: &[T], to: fn(T) -> [u8; W]) -> Py<PyAny> {
    let mut out = Vec::with_capacity(xs.len() * W);
    for &x in xs {
        out.extend_from_slice(&to(x));
    }
    PyBytes::new(py, &out).into_any().unbind()
}

/// A mixer from its JSON (`mix.json`'s text), or the built-in one.
fn mixer_of(json: Option<&str>) -> PyResult<Mixer> {
    let Some(json) = json else {
        return Ok(Mixer::default());
    };
    let mixer: Mixer = serde_json::from_str(json)
        .map_err(|e| invalid(format!("not a mixer (mix.json's fields): {e}")))?;
    mixer.check().map_err(invalid)?;
    Ok(mixer)
}

/// `Index.infgram_rows`: the rows of `tokens` (u32 little-endian bytes).
pub(crate) fn compute(
    py: Python<'_>,
    index: &Arc<crate::Idx>,
    tokens: &[u8],
    window: usize,
    end_token: Option<u32>,
    vocab: Option<usize>,
    estimator_json: Option<&str>,
) -> PyResult<InfgramRows> {
    let tokens = values(tokens, "tokens", u32::from_le_bytes)?;
    let estimator = match estimator_json {
        None => EstimatorSpec::Infgram,
        Some(json) => serde_json::from_str(json).map_err(|e| {
            invalid(format!(
                "estimator: {e} (e.g. {{\"name\": \"infgram\"}}, {{\"name\": \"sbis\", \"k\": 2}})"
            ))
        })?,
    };
    let options = RowsOptions {
        estimator,
        window,
        end_token,
        vocab,
    };
    let index = index.clone();
    let rows = py
        .guarded(|| infgram_rows(index, &tokens, &options))?
        .map_err(invalid)?;
    Ok(InfgramRows { rows })
}

/// The ∞-gram rows of a token sequence (`Index.infgram_rows`): row `j` is the next-token
/// distribution after `tokens[:j + 1]`.
#[pyclass(frozen, module = "infgram._native")]
pub struct InfgramRows {
    rows: Rows,
}

#[pymethods]
impl InfgramRows {
    fn __len__(&self) -> usize {
        self.rows.len()
    }

    /// The ids a row may hold.
    #[getter]
    fn vocab(&self) -> usize {
        self.rows.vocab
    }

    /// The estimator the rows come from, as JSON.
    #[getter]
    fn estimator(&self) -> String {
        serde_json::to_string(&self.rows.estimator).expect("a spec serializes")
    }

    /// The arrays as little-endian bytes: `offsets` (u64, one more than the rows), `ids`
    /// (u32), `logprobs` (f32, natural log), `suffix_len` (u32), `count` (u64), `distinct`
    /// (u32).
    fn raw(&self, py: Python<'_>) -> Ans {
        let r = &self.rows;
        let d = PyDict::new(py);
        d.set_item("offsets", le_bytes(py, &r.offsets, u64::to_le_bytes))?;
        d.set_item("ids", le_bytes(py, &r.ids, u32::to_le_bytes))?;
        d.set_item("logprobs", le_bytes(py, &r.logprobs, f32::to_le_bytes))?;
        d.set_item("suffix_len", le_bytes(py, &r.suffix_len, u32::to_le_bytes))?;
        d.set_item("count", le_bytes(py, &r.count, u64::to_le_bytes))?;
        d.set_item("distinct", le_bytes(py, &r.distinct, u32::to_le_bytes))?;
        Ok(d.into_any().unbind())
    }

    /// λ at every row (f64 bytes) by the mixer (`mix.json`'s text; None: the built-in one).
    #[pyo3(signature = (mixer_json=None))]
    fn lambdas(&self, py: Python<'_>, mixer_json: Option<&str>) -> PyResult<Py<PyAny>> {
        let mixer = mixer_of(mixer_json)?;
        let l = py
            .guarded(|| infgram::service::rows::lambdas(&self.rows, &mixer))?
            .map_err(invalid)?;
        Ok(le_bytes(py, &l, f64::to_le_bytes))
    }

    /// The mixture's log-probabilities of every id at every row (f32 bytes, rows × vocab)
    /// from a neural model's logits (f32 bytes, the same shape, any scale).
    #[pyo3(signature = (logits, mixer_json=None))]
    fn mix(&self, py: Python<'_>, logits: &[u8], mixer_json: Option<&str>) -> PyResult<Py<PyAny>> {
        let mixer = mixer_of(mixer_json)?;
        let mut logits = values(logits, "logits", f32::from_le_bytes)?;
        py.guarded(|| infgram::service::rows::mix_rows(&self.rows, &mut logits, &mixer))?
            .map_err(invalid)?;
        Ok(le_bytes(py, &logits, f32::to_le_bytes))
    }

    /// The mixture's log-probability of each actual next token (f32 bytes) from the targets
    /// (u32 bytes: `tokens[1:]`, or one more) and the neural model's normalized
    /// log-probabilities of them (f32 bytes).
    #[pyo3(signature = (targets, neural_logprobs, mixer_json=None))]
    fn mix_targets(
        &self,
        py: Python<'_>,
        targets: &[u8],
        neural_logprobs: &[u8],
        mixer_json: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let mixer = mixer_of(mixer_json)?;
        let targets = values(targets, "targets", u32::from_le_bytes)?;
        let neural = values(neural_logprobs, "neural_logprobs", f32::from_le_bytes)?;
        let mixed = py
            .guarded(|| infgram::service::rows::mix_targets(&self.rows, &targets, &neural, &mixer))?
            .map_err(invalid)?;
        Ok(le_bytes(py, &mixed, f32::to_le_bytes))
    }
}

/// The built-in mixer (`Mixer::default`, fitted on Tiny Shakespeare) as `mix.json`'s text.
#[pyfunction]
pub fn default_mixer() -> String {
    serde_json::to_string(&Mixer::default()).expect("a mixer serializes")
}
