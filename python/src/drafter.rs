//! `Drafter`: infgram's drafters (prompt lookup, past outputs, a corpus index) for a
//! speculative loop that runs its model elsewhere: one session per request, the decode loop's
//! drafts ([`infgram::service::drafts::Drafts`]). Thread-safe; every call releases the GIL.
use crate::index::Index;
use crate::Ans;
use crate::Guarded;
use infgram::service::Tokenizer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Arc;

use infgram::service::drafts::{Drafts, SessionStore, MAX_SESSIONS};

/// A draft: token `i` follows node `parents[i]` (`None`: the end of the context), with the
/// drafter's probability and the drafter that proposed it. A chain's parents are
/// `None, 0, 1, …`.
#[pyclass(frozen, module = "infgram._native")]
pub struct Draft {
    /// The draft's tokens (the main chain first, then each branch of a tree).
    #[pyo3(get)]
    pub(crate) token_ids: Vec<u32>,
    /// The node each token follows (`None`: the context's last token).
    #[pyo3(get)]
    pub(crate) parents: Vec<Option<usize>>,
    /// The drafter's probability of each token.
    #[pyo3(get)]
    pub(crate) probs: Vec<f64>,
    /// Which drafter proposed each token (`prompt`, `past`, `corpus`).
    #[pyo3(get)]
    pub(crate) sources: Vec<String>,
}

#[pymethods]
impl Draft {
    fn __len__(&self) -> usize {
        self.token_ids.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Draft(token_ids={:?}, parents={:?}, sources={:?})",
            self.token_ids,
            self.parents
                .iter()
                .map(|p| p.map_or(-1, |p| p as i64))
                .collect::<Vec<_>>(),
            self.sources
        )
    }

    /// The fields as a dict (`POST /v1/drafts` answers the same).
    fn to_dict(&self, py: Python<'_>) -> Ans {
        let d = PyDict::new(py);
        d.set_item("token_ids", &self.token_ids)?;
        d.set_item("parents", &self.parents)?;
        d.set_item("probs", &self.probs)?;
        d.set_item("sources", &self.sources)?;
        Ok(d.into_any().unbind())
    }
}

impl From<infgram::service::drafts::SessionDraft> for Draft {
    fn from(d: infgram::service::drafts::SessionDraft) -> Self {
        Draft {
            token_ids: d.token_ids,
            parents: d.parents,
            probs: d.probs,
            sources: d.sources,
        }
    }
}

/// A corpus rule by its name (`"sbis"`, `"longest_suffix"`).
pub(crate) fn corpus_rule_named(name: &str) -> PyResult<infgram::service::drafts::CorpusRule> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|_| {
        PyValueError::new_err(format!(
            "corpus_rule {name:?}: give \"sbis\" or \"longest_suffix\""
        ))
    })
}

/// A library error as Python's exception: a missing request is a `KeyError`, a fault of the
/// drafter's own files (past outputs that could not be saved) an `OSError`, the rest
/// `ValueError`.
fn py_err(e: infgram::Error) -> PyErr {
    match e {
        infgram::Error::NotFound(m) => pyo3::exceptions::PyKeyError::new_err(m),
        infgram::Error::Unavailable(m) => pyo3::exceptions::PyOSError::new_err(m),
        e => PyValueError::new_err(e.to_string()),
    }
}

/// Drafts for an engine's speculative loop (see the module docs).
#[pyclass(frozen, module = "infgram._native")]
pub struct Drafter {
    drafts: Arc<Drafts>,
}

#[pymethods]
impl Drafter {
    /// `index`: an `Index` to draft from (the corpus, built with the engine's tokenizer; one
    /// over shards held elsewhere drafts the same, each draft token a round trip to them);
    /// `past_outputs`: a file of past outputs (created on first use, written after each
    /// `finish`), in the tokens of `index`'s tokenizer or of `tokenizer` (a short model name,
    /// `bytes`, or a tokenizer file); `prompt_lookup`: draft from the request's own context;
    /// `corpus_rule`: how the index drafts, `"sbis"` (the SBIS argmax) or `"longest_suffix"`
    /// (the longest matching suffix's most frequent continuation: cheaper, and better on a
    /// large corpus); `session_bytes`: what the open requests may hold (about 30 bytes a token
    /// of context), past which (or 4,096 requests) the least recently used end.
    #[new]
    #[pyo3(signature = (index=None, past_outputs=None, prompt_lookup=true, tokenizer=None, corpus_rule="sbis", session_bytes=infgram::service::drafts::DEFAULT_SESSION_BYTES))]
    fn new(
        py: Python<'_>,
        index: Option<PyRef<'_, Index>>,
        past_outputs: Option<PathBuf>,
        prompt_lookup: bool,
        tokenizer: Option<String>,
        corpus_rule: &str,
        session_bytes: usize,
    ) -> PyResult<Self> {
        let corpus_rule = corpus_rule_named(corpus_rule)?;
        // The corpus: an index here, or shards held elsewhere (asked per draft token).
        let (corpus, index_tok) = match &index {
            Some(i) => (Some(i.corpus.clone()), Some(i.tok.clone())),
            None => (None, None),
        };
        let drafts = py
            .guarded(|| -> infgram::Result<Drafts> {
                let past = match past_outputs {
                    None => None,
                    Some(file) => {
                        let tok: Arc<dyn Tokenizer> = match (&tokenizer, index_tok) {
                            (Some(name), _) => Arc::from(infgram::service::load_tokenizer(name)?),
                            (None, Some(tok)) => tok,
                            (None, None) => {
                                return Err(infgram::Error::input(
                                    "past_outputs are kept in a tokenizer's ids: give index= \
                                     or tokenizer=",
                                ))
                            }
                        };
                        let budget = infgram::service::run::PAST_OUTPUTS_BUDGET;
                        Some(infgram::service::PastStore::load(
                            &file,
                            tok.as_ref(),
                            budget,
                        )?)
                    }
                };
                let store = SessionStore::new(MAX_SESSIONS, session_bytes);
                Drafts::with_store(corpus, past, prompt_lookup, corpus_rule, Arc::new(store))
            })?
            .map_err(py_err)?;
        Ok(Drafter {
            drafts: Arc::new(drafts),
        })
    }

    /// Starts request `request_id` after `prompt_ids` (an open request of that id starts over).
    fn start(&self, py: Python<'_>, request_id: &str, prompt_ids: Vec<u32>) -> PyResult<()> {
        py.guarded(|| self.drafts.start(request_id, &prompt_ids))?
            .map_err(py_err)
    }

    /// The engine kept `new_ids` after the request's context (the accepted draft tokens and
    /// its own next token).
    fn extend(&self, py: Python<'_>, request_id: &str, new_ids: Vec<u32>) -> PyResult<()> {
        py.guarded(|| self.drafts.extend(request_id, &new_ids))?
            .map_err(py_err)
    }

    /// A draft of at most `max_tokens` tokens for the request (a token tree with `tree`);
    /// empty when no drafter has one worth verifying.
    #[pyo3(signature = (request_id, max_tokens=16, tree=false))]
    fn draft(
        &self,
        py: Python<'_>,
        request_id: &str,
        max_tokens: usize,
        tree: bool,
    ) -> PyResult<Draft> {
        py.guarded(|| self.drafts.draft(request_id, max_tokens, tree))?
            .map(Draft::from)
            .map_err(py_err)
    }

    /// Drafts for a batch: `requests` is a list of `(request_id, max_tokens)`.
    #[pyo3(signature = (requests, tree=false))]
    fn draft_many(
        &self,
        py: Python<'_>,
        requests: Vec<(String, usize)>,
        tree: bool,
    ) -> PyResult<Vec<Draft>> {
        py.guarded(|| {
            requests
                .iter()
                .map(|(id, max)| self.drafts.draft(id, *max, tree).map(Draft::from))
                .collect::<infgram::Result<Vec<_>>>()
        })?
        .map_err(py_err)
    }

    /// A draft for `context_ids` alone, without a request.
    #[pyo3(signature = (context_ids, max_tokens=16, tree=false))]
    fn draft_once(
        &self,
        py: Python<'_>,
        context_ids: Vec<u32>,
        max_tokens: usize,
        tree: bool,
    ) -> PyResult<Draft> {
        py.guarded(|| self.drafts.draft_once(&context_ids, max_tokens, tree))?
            .map(Draft::from)
            .map_err(py_err)
    }

    /// Ends the request: its output joins the past outputs (and their file).
    fn finish(&self, py: Python<'_>, request_id: &str) -> PyResult<()> {
        py.guarded(|| self.drafts.finish(request_id))?
            .map_err(py_err)
    }

    /// Requests open.
    #[getter]
    fn open_requests(&self) -> usize {
        self.drafts.open_sessions()
    }

    /// Bytes the open requests hold (as last measured).
    #[getter]
    fn session_bytes(&self) -> usize {
        self.drafts.store().bytes()
    }

    /// Requests ended because a bound was passed (the least recently used first).
    #[getter]
    fn dropped_requests(&self) -> u64 {
        self.drafts.store().dropped()
    }
}
