//! `NgramModel`: a classic fixed-order n-gram model over an index (here or in shards held
//! elsewhere), scored as KenLM scores.
use crate::Guarded;
use crate::{to_py, Ans};
use infgram::service::Tokenizer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;

/// A classic fixed-order n-gram model over an index (`Index.ngram_model`), scored as KenLM's
/// `kenlm.Model` scores: `score(sentence)` is the log10 probability of `<s> sentence </s>`.
#[pyclass(frozen, module = "infgram._native")]
pub struct NgramModel {
    /// The corpus it was estimated over: an index here or shards held elsewhere.
    pub(crate) corpus: infgram::service::shards::SharedShards,
    /// The index's tokenizer (shared with its `Index`).
    pub(crate) tok: Arc<dyn Tokenizer>,
    pub(crate) model: infgram::service::score::ClassicModel,
}

#[pymethods]
impl NgramModel {
    /// The order N.
    #[getter]
    fn order(&self) -> usize {
        self.model.order()
    }

    /// The discounts `[D1, D2, D3+]` of each order (mkn).
    #[getter]
    fn discounts(&self) -> Vec<[f64; 3]> {
        self.model
            .discounts()
            .iter()
            .map(|d| [d[1], d[2], d[3]])
            .collect()
    }

    /// Log10 probability of one sentence (sentence mode: `<s>` before it, `</s>` after it
    /// and scored, as `kenlm.Model.score(sentence)`; line feeds are spaces); over plain
    /// documents, of its tokens after the first. `-inf` when an n-gram has probability 0
    /// (add-α at α = 0).
    fn score(&self, py: Python<'_>, sentence: &str) -> PyResult<f64> {
        let r = self.report(py, &sentence.replace('\n', " "), Some(0.0))?;
        Ok(r.log10_prob)
    }

    /// Perplexity of a text (sentence mode: one sentence a line), as KenLM's `query` reports
    /// it: `{ppl, tokens, sentences, oov, log10_prob, sentence_log10, floored, seconds}`.
    /// `floor` replaces a probability of 0 (add-α at α = 0), else that is an error.
    #[pyo3(signature = (text, floor=None))]
    fn perplexity(&self, py: Python<'_>, text: &str, floor: Option<f64>) -> Ans {
        let r = self.report(py, text, floor)?;
        let v = serde_json::to_value(&r).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        to_py(py, &v)
    }

    /// Writes the model (mkn) in ARPA format to `path`; returns `{ngrams, seconds}`.
    fn export_arpa(&self, py: Python<'_>, path: PathBuf) -> Ans {
        let summary = py
            .guarded(|| {
                infgram::service::score::write_arpa_file(
                    &*self.corpus,
                    &self.model,
                    self.tok.as_ref(),
                    &path,
                )
            })?
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let v =
            serde_json::to_value(&summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        to_py(py, &v)
    }
}

impl NgramModel {
    fn report(
        &self,
        py: Python<'_>,
        text: &str,
        floor: Option<f64>,
    ) -> PyResult<infgram::service::score::ClassicReport> {
        py.guarded(|| {
            infgram::service::score::classic_report(
                &*self.corpus,
                &self.model,
                self.tok.as_ref(),
                text,
                floor,
            )
        })?
        .map_err(|e| PyValueError::new_err(e.rename_field(crate::PARAMETER_NAMES).to_string()))
    }
}
