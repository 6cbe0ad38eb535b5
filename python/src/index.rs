//! `Index`: infgram's own API over one index opened in this process (the typed query
//! protocol, generation through the service's one door, perplexity, n-gram models).
use crate::ngram_model::NgramModel;
use crate::Guarded;
use crate::{detokenize_with, runtime, to_py, tokenize_with, Ans, Idx};
use crate::{remote, rows};
use infgram::service::shards::Layout;
use infgram::service::shards::{Shards, SharedShards};
use infgram::service::Tokenizer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Arc;

/// Python's arguments of an SBIS generation (`Index.generate`, over shards here or elsewhere).
pub(crate) struct SbisArgs<'a> {
    pub(crate) prompt: &'a str,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) k: Option<i64>,
    pub(crate) decay: Option<f64>,
    pub(crate) context: Option<usize>,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_k: Option<usize>,
    pub(crate) top_p: Option<f64>,
    pub(crate) seed: Option<u64>,
    pub(crate) guard: Option<usize>,
}

impl SbisArgs<'_> {
    /// The library's request from these arguments, checked (a bad one names Python's
    /// parameter: `ValueError`), run by `run` with the GIL released, as
    /// `{text, tokens, hit_end, natural_end, prompt_tokens[, guard]}` (no timing: the same
    /// request gives the same dict, local or remote). A shard that did not answer
    /// is a `RuntimeError`. `bind` makes the resources it runs over: one call of the service's
    /// generation ([`infgram::service::run::generate`]).
    pub(crate) fn run(
        self,
        py: Python<'_>,
        tok: Arc<dyn Tokenizer>,
        bind: impl for<'t> FnOnce(&'t dyn Tokenizer) -> infgram::service::Resources<'t> + Send,
    ) -> Ans {
        use infgram::service::request::{
            EstimatorSpec, GenLimits, GenerateRequest, GuardSpec, Prompt, Sampling, Scorer,
            MAX_GEN_TOKENS,
        };
        const PARAMETER_NAMES: &[(&str, &str)] = &[
            ("sampling.temperature", "temperature"),
            ("sampling.top_p", "top_p"),
            ("sampling.top_k", "top_k"),
            ("limits.max_tokens", "max_tokens"),
            ("limits.context", "context"),
            ("scorer.estimator.k", "k"),
            ("scorer.estimator.decay", "decay"),
            ("guard.max_span", "guard"),
        ];
        let request = GenerateRequest {
            prompt: Prompt::Text(self.prompt.to_string()),
            scorer: Scorer::Infgram {
                estimator: EstimatorSpec::Sbis {
                    k: self.k,
                    decay: self.decay,
                },
            },
            guard: self.guard.map(|max_span| GuardSpec {
                max_span,
                ignore_prompt: false,
            }),
            sampling: Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                seed: self.seed,
                repetition_penalty: None,
            },
            limits: GenLimits {
                max_tokens: self.max_tokens,
                context: self.context,
                draft_max: None,
            },
            ..Default::default()
        };
        let invalid = |e: infgram::Error| PyValueError::new_err(e.to_string());
        let checked = request
            .check(MAX_GEN_TOKENS)
            .map_err(|e| invalid(e.rename_field(PARAMETER_NAMES)))?;
        let opts = infgram::service::RunOptions::default();
        let report = py
            .guarded(|| {
                let mut res = bind(tok.as_ref());
                infgram::service::run::generate(&checked, &mut res, &opts, |_| {})
            })?
            .map_err(|e| match e {
                infgram::Error::Unavailable(_) => runtime(e),
                e => invalid(e),
            })?;
        let d = PyDict::new(py);
        d.set_item("text", &report.text)?;
        d.set_item("tokens", &report.token_ids)?;
        d.set_item("hit_end", report.stopped_at_document_end.unwrap_or(false))?;
        d.set_item("natural_end", report.natural_end)?;
        d.set_item("prompt_tokens", report.prompt_tokens)?;
        if let Some(g) = report.copying.and_then(|c| c.guard) {
            let stats = PyDict::new(py);
            stats.set_item("max_span", g.max_span)?;
            stats.set_item("blocked", g.blocked)?;
            stats.set_item("masked", g.masked)?;
            d.set_item("guard", stats)?;
        }
        Ok(d.into_any().unbind())
    }
}

/// An infgram index with its tokenizer, its shards here or held elsewhere: the typed query
/// protocol, the infini-gram HTTP API, generation, perplexity; over shards here also n-gram
/// models, batch rows and what a shard server answers.
#[pyclass(frozen, subclass, module = "infgram._native")]
pub struct Index {
    /// The shards: here (its directory, memory-mapped), or behind a Python callable (the Ray
    /// router of `infgram.ray`: each shard on the actor that holds it).
    pub(crate) corpus: SharedShards,
    /// The index's files, when they are here.
    pub(crate) files: Option<Arc<Idx>>,
    pub(crate) tok: Arc<dyn Tokenizer>,
    /// The name the infini-gram API's `"index"` field must give (any, when it is left out).
    pub(crate) name: String,
}

impl Index {
    /// The shards here, or an error saying that `what` needs them.
    pub(crate) fn local(&self, what: &str) -> PyResult<&Arc<Idx>> {
        match &self.files {
            Some(index) => Ok(index),
            None => Err(PyValueError::new_err(format!(
                "{what} needs the index's files here; an index over shards held elsewhere \
                 answers queries, the API and generate: open the directory with Index(path)"
            ))),
        }
    }

    /// An index over shards that `ask` answers for (see [`remote::RemoteShards`]): the
    /// tokenizer `tokenizer` (a name or file) must have the shards' `fingerprint`.
    pub(crate) fn over_remote(
        py: Python<'_>,
        ask: Py<PyAny>,
        shard_infos: &[(u64, u64)],
        separator: u32,
        tokenizer: &str,
        fingerprint: &str,
        name: &str,
    ) -> PyResult<Self> {
        let tok = py
            .guarded(|| infgram::service::load_tokenizer(tokenizer))?
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        if tok.fingerprint() != fingerprint {
            return Err(PyValueError::new_err(format!(
                "tokenizer {tokenizer} has fingerprint {}, the shards were built with {fingerprint}: \
                 pass the tokenizer the index was built with",
                tok.fingerprint()
            )));
        }
        check_remote_figures(shard_infos, separator, tok.vocab_size())?;
        let shards = remote::RemoteShards::new(ask, shard_infos, separator, tok.vocab_size())
            .with_tokenizer(tok.spec());
        Ok(Index {
            corpus: Arc::new(shards),
            files: None,
            tok: Arc::from(tok),
            name: name.to_string(),
        })
    }
}

/// Positions a shard may hold at most (2⁴⁸: past any index's suffix-array pointers).
const MAX_SHARD_TOKENS: u64 = 1 << 48;

/// Refuses shard figures and a separator that no index has: a shard with more documents than
/// positions (each document ends with a separator) or more positions than any index holds,
/// and a separator inside the tokenizer's vocabulary.
fn check_remote_figures(shard_infos: &[(u64, u64)], separator: u32, vocab: usize) -> PyResult<()> {
    if (separator as usize) < vocab {
        return Err(PyValueError::new_err(format!(
            "separator {separator} is an id of the tokenizer's vocabulary (0..{vocab}): pass              the index's separator (Index(path).identity()[\"separator\"])"
        )));
    }
    for (s, &(tokens, documents)) in shard_infos.iter().enumerate() {
        if documents > tokens || tokens > MAX_SHARD_TOKENS {
            return Err(PyValueError::new_err(format!(
                "shard_infos[{s}] = ({tokens}, {documents}) is no shard's (positions, \
                 documents): at most 2**48 positions, and no more documents than positions; \
                 pass Index(path).identity()[\"shard_infos\"] of the shards"
            )));
        }
    }
    Ok(())
}

#[pymethods]
impl Index {
    /// Opens an index directory (infgram's or infini-gram's); `tokenizer` names the one to
    /// tokenize text with (default: the index's own). Or, with `ask` instead of a path, an
    /// index over shards held elsewhere: `ask([(shard, query_json), ...])` returns
    /// `[answer_json, ...]` (the Ray router of `infgram.ray`), `shard_infos` gives each shard's
    /// `(tokens, documents)`, `separator` the separator id, and `tokenizer` (required then) must
    /// have the shards' `fingerprint`. `name`: the index's name in the infini-gram API.
    #[new]
    #[pyo3(signature = (path=None, tokenizer=None, *, ask=None, shard_infos=None, separator=None, fingerprint=None, name="index"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: Option<PathBuf>,
        tokenizer: Option<String>,
        ask: Option<Py<PyAny>>,
        shard_infos: Option<Vec<(u64, u64)>>,
        separator: Option<u32>,
        fingerprint: Option<String>,
        name: &str,
    ) -> PyResult<Self> {
        match (path, ask) {
            (Some(path), None) => {
                if shard_infos.is_some() || separator.is_some() || fingerprint.is_some() {
                    return Err(PyValueError::new_err(
                        "shard_infos, separator and fingerprint go with ask=, not with a path",
                    ));
                }
                let (index, tok) = py
                    .guarded(|| infgram::service::open_index(&path, tokenizer.as_deref()))?
                    .map_err(|e| PyValueError::new_err(e.to_string()))?;
                let index = Arc::new(index);
                Ok(Index {
                    corpus: index.clone(),
                    files: Some(index),
                    tok: Arc::from(tok),
                    name: name.to_string(),
                })
            }
            (None, Some(ask)) => match (shard_infos, separator, tokenizer, fingerprint) {
                (Some(infos), Some(sep), Some(tok), Some(fp)) => {
                    Index::over_remote(py, ask, &infos, sep, &tok, &fp, name)
                }
                _ => Err(PyValueError::new_err(
                    "an index over shards held elsewhere needs ask, shard_infos, separator, \
                     tokenizer and fingerprint",
                )),
            },
            (Some(_), Some(_)) => Err(PyValueError::new_err(
                "give a path or ask= (shards held elsewhere), not both",
            )),
            (None, None) => Err(PyValueError::new_err(
                "give the index's directory (or ask= for shards held elsewhere)",
            )),
        }
    }

    /// Whether the shards are held elsewhere (made with `ask=`).
    #[getter]
    fn is_remote(&self) -> bool {
        self.files.is_none()
    }

    /// Answers one query of the protocol shared with `infgram query --batch` and the server,
    /// given as a JSON string (`{"query_type": "count", "text": "the cat"}`); returns the
    /// answer as a JSON string, or `{"error": ...}`.
    fn query_json(&self, py: Python<'_>, request: &str) -> PyResult<String> {
        py.guarded(|| {
            let answer = infgram::service::Query::from_json(request)
                .and_then(|q| infgram::service::execute(&self.corpus, self.tok.as_ref(), &q));
            match answer {
                Ok(a) => a.to_value().to_string(),
                Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
            }
        })
    }

    /// Answers one body of the infini-gram HTTP API (`POST /` of `infgram serve`, with its
    /// default limits) and returns `(status, json)`: the same shapes, limits and errors (an
    /// `"index"` other than this one's `name` is a 404, as on a server of one index).
    fn api(&self, py: Python<'_>, body: &[u8]) -> PyResult<(u16, String)> {
        use infgram::service::api;
        let limits = infgram::service::QueryLimits::SERVED;
        let answered = py.guarded(|| {
            let answer = api::read_request(body, &limits).and_then(|r| match &r.index {
                Some(name) if *name != self.name => Err(api::ApiError {
                    status: 404,
                    message: format!("no index {name:?} here; this server has: {}", self.name),
                }),
                _ => api::answer(&self.corpus, self.tok.as_ref(), &r, &limits),
            });
            match answer {
                Ok(v) => (200, v.to_string()),
                Err(e) => (
                    e.status,
                    serde_json::json!({ "error": e.message }).to_string(),
                ),
            }
        });
        // A failure inside is the server's error (a 500, as `infgram serve` answers), not the
        // caller's; a KeyboardInterrupt or SystemExit of the shards' `ask` goes up as itself.
        match answered {
            Err(e) if e.is_instance_of::<PyRuntimeError>(py) => {
                let message = e.value(py).to_string();
                Ok((500, serde_json::json!({ "error": message }).to_string()))
            }
            answered => answered,
        }
    }

    /// Token ids of `text` with the index's tokenizer.
    fn tokenize(&self, text: &str) -> PyResult<Vec<u32>> {
        tokenize_with(self.tok.as_ref(), text)
    }

    /// Text of token ids.
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        detokenize_with(self.tok.as_ref(), &ids)
    }

    /// Corpus tokens (separators excluded), documents and shards; with the index's files here,
    /// also `token_width`, `reverse` and `format` (over shards held elsewhere, `None`: what the
    /// shards tell of themselves, their sizes, answers the rest).
    fn stats(&self, py: Python<'_>) -> Ans {
        let infos = self.corpus.infos();
        let d = PyDict::new(py);
        d.set_item(
            "tokens",
            infos.iter().map(|i| i.tokens - i.documents).sum::<u64>(),
        )?;
        d.set_item("documents", infos.iter().map(|i| i.documents).sum::<u64>())?;
        d.set_item("shards", infos.len())?;
        let files = self.files.as_ref();
        d.set_item("token_width", files.map(|i| i.header().token_width))?;
        d.set_item("reverse", files.map(|i| i.has_reverse()))?;
        d.set_item(
            "format",
            files.map(|i| match i.shards().first().map(|s| s.layout()) {
                Some(Layout::InfiniGram) => "infini-gram",
                _ => "infgram",
            }),
        )?;
        Ok(d.into_any().unbind())
    }

    /// What a distributed manifest records of this index and checks at start: `header_crc32`
    /// (the header's own checksum, which covers every file's checksum), `tokenizer` (`kind`,
    /// `fingerprint`, `vocab_size`), `separator`, `token_width` and `shard_infos` (each
    /// shard's `[tokens, documents]`, separators counted in tokens).
    fn identity(&self, py: Python<'_>) -> Ans {
        let index = self.local("identity")?;
        let h = index.header();
        let d = PyDict::new(py);
        d.set_item("header_crc32", h.header_crc32)?;
        let t = PyDict::new(py);
        t.set_item("kind", &h.tokenizer.kind)?;
        t.set_item("fingerprint", &h.tokenizer.fingerprint)?;
        t.set_item("vocab_size", h.tokenizer.vocab_size)?;
        d.set_item("tokenizer", t)?;
        d.set_item("separator", index.separator())?;
        d.set_item("token_width", h.token_width)?;
        let infos: Vec<(u64, u64)> = index
            .infos()
            .iter()
            .map(|i| (i.tokens, i.documents))
            .collect();
        d.set_item("shard_infos", infos)?;
        Ok(d.into_any().unbind())
    }

    /// A shard server's side of `infgram.ray`: the answers of this index's shards to
    /// `[(shard, query_json), ...]` (shards numbered within this index), as JSON strings, each
    /// question checked against its shard first. Over shards held elsewhere, the questions are
    /// passed on to them (a router that serves as a shard). Releases the GIL.
    fn answer_shard_queries(
        &self,
        py: Python<'_>,
        requests: Vec<(usize, String)>,
    ) -> PyResult<Vec<String>> {
        let corpus = self.corpus.clone();
        py.guarded(|| remote::answer_json(corpus.as_ref(), &requests))?
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Generates text from the index alone with SBIS (`k` levels, −1 = all; `decay` between
    /// levels), sampling with `temperature` / `top_k` / `top_p` and `seed`; `guard`: the longest
    /// span of the corpus the output may repeat (the copy guard). Every parameter left out takes
    /// the library's default (`infgram gen` and the server use the same ones). Returns
    /// `{text, tokens, hit_end}` (and `guard`, its statistics, when guarded).
    #[pyo3(signature = (prompt, max_tokens=None, k=None, decay=None, context=None, temperature=None, top_k=None, top_p=None, seed=None, guard=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &str,
        max_tokens: Option<usize>,
        k: Option<i64>,
        decay: Option<f64>,
        context: Option<usize>,
        temperature: Option<f64>,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: Option<u64>,
        guard: Option<usize>,
    ) -> Ans {
        let args = SbisArgs {
            prompt,
            max_tokens,
            k,
            decay,
            context,
            temperature,
            top_k,
            top_p,
            seed,
            guard,
        };
        let corpus = self.corpus.clone();
        args.run(py, self.tok.clone(), move |tok| {
            infgram::service::Resources::corpus(corpus, tok)
        })
    }

    /// Every position's ∞-gram next-token distribution of `tokens` (u32 little-endian bytes)
    /// in one call, with its suffix length, count and distinct continuations (see
    /// `infgram.Index.infgram_rows`). Releases the GIL.
    #[pyo3(signature = (tokens, window=infgram::service::rows::ROWS_WINDOW, end_token=None, vocab=None, estimator_json=None))]
    fn infgram_rows(
        &self,
        py: Python<'_>,
        tokens: &[u8],
        window: usize,
        end_token: Option<u32>,
        vocab: Option<usize>,
        estimator_json: Option<&str>,
    ) -> PyResult<rows::InfgramRows> {
        rows::compute(
            py,
            self.local("infgram_rows")?,
            tokens,
            window,
            end_token,
            vocab,
            estimator_json,
        )
    }

    /// A classic n-gram model of fixed `order` over this index: `estimator` `"mkn"`
    /// (interpolated modified Kneser–Ney, as KenLM's lmplz) or `"add_alpha"` (with `alpha`;
    /// 0 is MLE). Sentence mode follows the index (built with `sentences=True`). Over shards
    /// held elsewhere each shard sends all its suffixes once, grouped by their first tokens.
    /// `discount_fallback`: three discounts for an order whose count-of-counts cannot give
    /// them (KenLM's `--discount_fallback`).
    #[pyo3(signature = (order, estimator="mkn", alpha=None, discount_fallback=None))]
    fn ngram_model(
        &self,
        py: Python<'_>,
        order: usize,
        estimator: &str,
        alpha: Option<f64>,
        discount_fallback: Option<[f64; 3]>,
    ) -> PyResult<NgramModel> {
        let spec = match estimator {
            "mkn" => infgram::service::request::EstimatorSpec::Mkn { order },
            "add_alpha" | "add-alpha" => {
                infgram::service::request::EstimatorSpec::AddAlpha { order, alpha }
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "estimator {other:?}: a fixed-order model is \"mkn\" or \"add_alpha\""
                )))
            }
        };
        let model = py
            .guarded(|| spec.classic(&*self.corpus, discount_fallback))?
            .map_err(|e| PyValueError::new_err(e.rename_field(crate::PARAMETER_NAMES).to_string()))?
            .ok_or_else(|| PyValueError::new_err("not a fixed-order model"))?;
        Ok(NgramModel {
            corpus: self.corpus.clone(),
            tok: self.tok.clone(),
            model,
        })
    }

    /// Perplexity of `text` under the ∞-gram (SBIS with `k` levels and `decay`), looking at
    /// `context` tokens (`floor`: the probability of a token the ∞-gram gives none, else that
    /// is an error), with the agreement analysis: `{ppl, tokens, bits_per_token, seconds,
    /// floored, ...}`. Each left out takes the library's default (as `infgram gen` and the
    /// server do: all levels, decay 0.1, 200 tokens); a bad one is a `ValueError` naming it.
    #[pyo3(signature = (text, k=None, decay=None, context=None, floor=None))]
    fn perplexity(
        &self,
        py: Python<'_>,
        text: &str,
        k: Option<i64>,
        decay: Option<f64>,
        context: Option<usize>,
        floor: Option<f64>,
    ) -> Ans {
        use infgram::service::request::defaults;
        use infgram::service::score::{score_over, Document, ScoreReport, ScoreRequest};
        let invalid = |e: infgram::Error| {
            PyValueError::new_err(
                e.rename_field(&[("estimator.k", "k"), ("estimator.decay", "decay")])
                    .rename_field(crate::PARAMETER_NAMES)
                    .to_string(),
            )
        };
        let mut req = ScoreRequest::new(vec![Document {
            name: "text".into(),
            text: text.to_string(),
        }]);
        req.estimator = infgram::service::request::EstimatorSpec::Sbis { k, decay };
        req.context = context.unwrap_or(defaults::CONTEXT);
        req.floor = floor;
        let report = py
            .guarded(|| score_over(&*self.corpus, self.tok.as_ref(), &req))?
            .map_err(invalid)?;
        let ScoreReport::Infgram { report, .. } = report else {
            return Err(PyRuntimeError::new_err(
                "an SBIS scoring gave another report",
            ));
        };
        let v =
            serde_json::to_value(&report).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        to_py(py, &v)
    }
}

/// `RemoteIndex(ask, shard_infos, separator, tokenizer, fingerprint, name="index")`: the
/// [`Index`] over shards held elsewhere that `Index(ask=..., ...)` makes (kept under its old
/// name for callers of the Ray router).
#[pyfunction(name = "RemoteIndex")]
#[pyo3(signature = (ask, shard_infos, separator, tokenizer, fingerprint, name="index"))]
pub fn remote_index(
    py: Python<'_>,
    ask: Py<PyAny>,
    shard_infos: Vec<(u64, u64)>,
    separator: u32,
    tokenizer: &str,
    fingerprint: &str,
    name: &str,
) -> PyResult<Index> {
    Index::over_remote(
        py,
        ask,
        &shard_infos,
        separator,
        tokenizer,
        fingerprint,
        name,
    )
}
