//! `infgram._native`: the Python module.
//!
//! * [`InfiniGramEngine`] — a drop-in for `infini_gram.engine.InfiniGramEngine` (infini-gram
//!   2.6.0): the same constructor arguments, methods, keyword arguments and returned dicts, over
//!   infgram's indexes and over infini-gram's own (opened as they are). Bad arguments give an
//!   `{"error": ...}` dict as infini-gram's do; nothing panics across the boundary.
//! * [`Index`] — infgram's own API: the typed query protocol of the CLI and the server
//!   (`query`), SBIS generation and perplexity; [`build_index`] builds an index.
//!
//! Every query releases the GIL while it runs, so Python threads query in parallel.

mod remote;
mod rows;

use infgram::index::partial::{self as ask, ShardAnswer, ShardInfo, ShardQuery, Shards};
use infgram::index::query::{Document, NtdResult, ProbResult};
use infgram::index::Layout;
use infgram::service::query::defaults;
use infgram::tokenizer::Tokenizer;
use memmap2::Mmap;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::path::PathBuf;
use std::sync::Arc;

type Idx = infgram::Index<Mmap>;
type Ans = PyResult<Py<PyAny>>;

/// `{"error": message}`, infini-gram's way of refusing a query.
fn error_dict(py: Python<'_>, msg: impl std::fmt::Display) -> Ans {
    let d = PyDict::new(py);
    d.set_item("error", msg.to_string())?;
    Ok(d.into_any().unbind())
}

fn runtime(e: infgram::Error) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// Token ids from a Python list of ints in `0..=max` (infini-gram accepts lists only).
fn ids_of(obj: &Bound<'_, PyAny>, max: u64, allow_empty: bool) -> Option<Vec<u32>> {
    let list = obj.cast::<PyList>().ok()?;
    if !allow_empty && list.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(list.len());
    for x in list.iter() {
        if x.is_instance_of::<pyo3::types::PyBool>() {
            return None;
        }
        let v: u64 = x.extract().ok()?;
        if v > max {
            return None;
        }
        out.push(v as u32);
    }
    Some(out)
}

/// A CNF: a non-empty list of non-empty lists of non-empty id lists.
fn cnf_of(obj: &Bound<'_, PyAny>, max: u64) -> Option<Vec<Vec<Vec<u32>>>> {
    let clauses = obj.cast::<PyList>().ok()?;
    if clauses.is_empty() {
        return None;
    }
    let mut cnf = Vec::with_capacity(clauses.len());
    for clause in clauses.iter() {
        let grams = clause.cast::<PyList>().ok()?;
        if grams.is_empty() {
            return None;
        }
        let mut c = Vec::with_capacity(grams.len());
        for g in grams.iter() {
            c.push(ids_of(&g, max, false)?);
        }
        cnf.push(c);
    }
    Some(cnf)
}

/// A positive integer argument, or its default when `None`.
fn positive(v: Option<i64>, default: usize) -> Option<usize> {
    match v {
        None => Some(default),
        Some(x) if x > 0 => Some(x as usize),
        Some(_) => None,
    }
}

/// Converts a JSON value to Python objects.
fn to_py(py: Python<'_>, v: &serde_json::Value) -> Ans {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any().unbind(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any().unbind(),
            _ => n
                .as_f64()
                .unwrap_or(f64::NAN)
                .into_pyobject(py)?
                .into_any()
                .unbind(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(to_py(py, x)?)?;
            }
            l.into_any().unbind()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// The shards an engine asks: opened in this process, or held elsewhere (a Ray router's).
enum Backend {
    Local(Arc<Idx>),
    Remote(remote::RemoteShards),
}

impl Shards for Backend {
    fn shard_count(&self) -> usize {
        match self {
            Backend::Local(i) => i.shard_count(),
            Backend::Remote(r) => r.shard_count(),
        }
    }

    fn infos(&self) -> Vec<ShardInfo> {
        match self {
            Backend::Local(i) => i.infos(),
            Backend::Remote(r) => r.infos(),
        }
    }

    fn separator(&self) -> u32 {
        match self {
            Backend::Local(i) => Shards::separator(i),
            Backend::Remote(r) => r.separator(),
        }
    }

    fn vocab_size(&self) -> usize {
        match self {
            Backend::Local(i) => Shards::vocab_size(i),
            Backend::Remote(r) => r.vocab_size(),
        }
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> infgram::Result<Vec<ShardAnswer>> {
        match self {
            Backend::Local(i) => i.ask(asks),
            Backend::Remote(r) => r.ask(asks),
        }
    }
}

/// Where a document window is anchored: a token position of a shard, or a suffix-array rank.
#[derive(Clone, Copy)]
enum Anchor {
    Pos(usize, usize),
    Rank(usize, usize),
}

/// A drop-in for `infini_gram.engine.InfiniGramEngine`.
///
/// Differences, all documented in the README: distributions are exact (`approx` is always
/// false, whatever `max_support`); `search_docs` returns the first matching documents in
/// suffix-array order rather than a random sample; ids at or above the separator (2^16 − 1 for
/// u16) are refused; `attribute` uses infgram's maximal spans.
#[pyclass(frozen, module = "infgram._native")]
pub struct InfiniGramEngine {
    shards: Backend,
    eos: u32,
    token_id_max: u64,
    width: usize,
    max_support: usize,
    max_clause_freq: usize,
    max_diff_tokens: usize,
    maxnum: usize,
    max_disp_len: usize,
}

fn dtype_width(token_dtype: &str) -> PyResult<u8> {
    match token_dtype {
        "u8" => Ok(1),
        "u16" => Ok(2),
        "u32" => Ok(4),
        other => Err(PyValueError::new_err(format!(
            "Unsupported token dtype: {other} (use 'u8', 'u16' or 'u32')"
        ))),
    }
}

/// Opens one directory: infgram's format, or infini-gram's (then `width` is checked).
fn open_dir(dir: &str, width: u8) -> PyResult<Idx> {
    let path = PathBuf::from(dir);
    let index = if infgram::index::infini_gram::is_infini_gram_dir(&path) {
        Idx::open_infini_gram(&path, Some(width))
    } else {
        Idx::open(&path)
    }
    .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let w = index.header().token_width;
    if w != width {
        return Err(PyValueError::new_err(format!(
            "{dir} holds {w}-byte tokens: pass token_dtype='u{}'",
            8 * w
        )));
    }
    Ok(index)
}

#[pymethods]
impl InfiniGramEngine {
    /// Opens the index directory (or list of directories); arguments as infini-gram's.
    /// `version`, `load_to_ram`, the prefetch depths, `bow_ids_path`, `attribution_block_size`,
    /// `precompute_unigram_logprobs` and `prev_shards_by_index_dir` are accepted and ignored
    /// (indexes are memory-mapped; version 4 is the one format read).
    #[new]
    #[pyo3(signature = (index_dir, eos_token_id, vocab_size=65535, version=4, token_dtype="u16",
        load_to_ram=false, ds_prefetch_depth=1, sa_prefetch_depth=3, od_prefetch_depth=3,
        bow_ids_path=None, attribution_block_size=512, precompute_unigram_logprobs=false,
        prev_shards_by_index_dir=None, max_support=1000,
        max_clause_freq=defaults::MAX_CLAUSE_FREQ as i64,
        max_diff_tokens=defaults::MAX_DIFF_TOKENS as i64, maxnum=defaults::MAXNUM as i64,
        max_disp_len=defaults::MAX_DISP_LEN as i64))]
    #[allow(clippy::too_many_arguments, unused_variables)]
    fn new(
        py: Python<'_>,
        index_dir: &Bound<'_, PyAny>,
        eos_token_id: i64,
        vocab_size: i64,
        version: i64,
        token_dtype: &str,
        load_to_ram: bool,
        ds_prefetch_depth: i64,
        sa_prefetch_depth: i64,
        od_prefetch_depth: i64,
        bow_ids_path: Option<String>,
        attribution_block_size: i64,
        precompute_unigram_logprobs: bool,
        prev_shards_by_index_dir: Option<&Bound<'_, PyAny>>,
        max_support: i64,
        max_clause_freq: i64,
        max_diff_tokens: i64,
        maxnum: i64,
        max_disp_len: i64,
    ) -> PyResult<Self> {
        let dirs: Vec<String> = if let Ok(s) = index_dir.extract::<String>() {
            vec![s]
        } else {
            index_dir
                .extract()
                .map_err(|_| PyValueError::new_err("index_dir must be a path or a list of paths"))?
        };
        if version != 4 {
            return Err(PyValueError::new_err(
                "only version 4 indexes are read (version 5 stores documents reversed)",
            ));
        }
        let limits = [
            max_support,
            max_clause_freq,
            max_diff_tokens,
            maxnum,
            max_disp_len,
        ];
        Self::checked(eos_token_id, vocab_size, token_dtype, limits, |width| {
            let index = py.detach(|| -> PyResult<Idx> {
                let opened = dirs
                    .iter()
                    .map(|d| open_dir(d, width))
                    .collect::<PyResult<Vec<_>>>()?;
                Idx::merge(opened).map_err(|e| PyValueError::new_err(e.to_string()))
            })?;
            Ok(Backend::Local(Arc::new(index)))
        })
    }

    /// An engine over shards held elsewhere (`infgram.ray.Engine` makes one): `ask` answers
    /// `[(shard, query_json), ...]` with `[answer_json, ...]`; `shard_infos` gives each shard's
    /// `(tokens, documents)`, separators counted in tokens; `index_vocab_size` is the
    /// tokenizer's vocabulary size recorded in the shards' headers. The other arguments are the
    /// constructor's. Every answer is merged by the same code as a local engine's.
    #[staticmethod]
    #[pyo3(signature = (ask, shard_infos, separator, index_vocab_size, eos_token_id, vocab_size=65535,
        token_dtype="u16", max_support=1000,
        max_clause_freq=defaults::MAX_CLAUSE_FREQ as i64,
        max_diff_tokens=defaults::MAX_DIFF_TOKENS as i64, maxnum=defaults::MAXNUM as i64,
        max_disp_len=defaults::MAX_DISP_LEN as i64))]
    #[allow(clippy::too_many_arguments)]
    fn over_shards(
        ask: Py<PyAny>,
        shard_infos: Vec<(u64, u64)>,
        separator: u32,
        index_vocab_size: usize,
        eos_token_id: i64,
        vocab_size: i64,
        token_dtype: &str,
        max_support: i64,
        max_clause_freq: i64,
        max_diff_tokens: i64,
        maxnum: i64,
        max_disp_len: i64,
    ) -> PyResult<Self> {
        let limits = [
            max_support,
            max_clause_freq,
            max_diff_tokens,
            maxnum,
            max_disp_len,
        ];
        Self::checked(eos_token_id, vocab_size, token_dtype, limits, |_| {
            let shards = remote::RemoteShards::new(ask, &shard_infos, separator, index_vocab_size);
            Ok(Backend::Remote(shards))
        })
    }

    /// `{cnt, segment_by_shard}`: the suffix-array range of `input_ids` in each shard.
    fn find(&self, py: Python<'_>, input_ids: &Bound<'_, PyAny>) -> Ans {
        let Some(q) = ids_of(input_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("input_ids"));
        };
        let shards = &self.shards;
        let (cnt, segs) = py
            .detach(|| match self.held(&q) {
                true => ask::find(shards, &q).map(|f| (f.cnt, f.segment_by_shard)),
                false => Ok((0, vec![(0, 0); shards.shard_count()])),
            })
            .map_err(runtime)?;
        let d = PyDict::new(py);
        d.set_item("cnt", cnt)?;
        let segs: Vec<Bound<'_, PyTuple>> = segs
            .into_iter()
            .map(|(a, b)| PyTuple::new(py, [a, b]))
            .collect::<PyResult<_>>()?;
        d.set_item("segment_by_shard", segs)?;
        Ok(d.into_any().unbind())
    }

    /// `{cnt, approx, ptrs_by_shard}`: occurrences satisfying the CNF (byte pointers).
    #[pyo3(signature = (cnf, max_clause_freq=None, max_diff_tokens=None))]
    fn find_cnf(
        &self,
        py: Python<'_>,
        cnf: &Bound<'_, PyAny>,
        max_clause_freq: Option<i64>,
        max_diff_tokens: Option<i64>,
    ) -> Ans {
        let (cnf, mcf, mdt) = match self.cnf_args(cnf, max_clause_freq, max_diff_tokens) {
            Ok(x) => x,
            Err(e) => return error_dict(py, e),
        };
        let r = match py.detach(|| self.search(&cnf, 0, mdt, mcf, 0)) {
            Ok(r) => r,
            Err(e) => return error_dict(py, e),
        };
        let d = PyDict::new(py);
        d.set_item("cnt", r.cnt)?;
        d.set_item("approx", r.approx)?;
        let w = self.width;
        let ptrs: Vec<Vec<usize>> = r
            .ptrs_by_shard
            .into_iter()
            .map(|v| v.into_iter().map(|p| p * w).collect())
            .collect();
        d.set_item("ptrs_by_shard", ptrs)?;
        Ok(d.into_any().unbind())
    }

    /// `{count, approx}`.
    fn count(&self, py: Python<'_>, input_ids: &Bound<'_, PyAny>) -> Ans {
        let Some(q) = ids_of(input_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("input_ids"));
        };
        let count = py.detach(|| self.count_ids(&q)).map_err(runtime)?;
        let d = PyDict::new(py);
        d.set_item("count", count)?;
        d.set_item("approx", false)?;
        Ok(d.into_any().unbind())
    }

    /// `{count, approx}` of a CNF.
    #[pyo3(signature = (cnf, max_clause_freq=None, max_diff_tokens=None))]
    fn count_cnf(
        &self,
        py: Python<'_>,
        cnf: &Bound<'_, PyAny>,
        max_clause_freq: Option<i64>,
        max_diff_tokens: Option<i64>,
    ) -> Ans {
        let (cnf, mcf, mdt) = match self.cnf_args(cnf, max_clause_freq, max_diff_tokens) {
            Ok(x) => x,
            Err(e) => return error_dict(py, e),
        };
        match py.detach(|| self.search(&cnf, 0, mdt, mcf, 0)) {
            Ok(r) => {
                let d = PyDict::new(py);
                d.set_item("count", r.cnt)?;
                d.set_item("approx", r.approx)?;
                Ok(d.into_any().unbind())
            }
            Err(e) => error_dict(py, e),
        }
    }

    /// `{prompt_cnt, cont_cnt, prob}`: `count(prompt·cont) / count(prompt)`, -1 when the
    /// prompt does not occur.
    fn prob(
        &self,
        py: Python<'_>,
        prompt_ids: &Bound<'_, PyAny>,
        cont_id: &Bound<'_, PyAny>,
    ) -> Ans {
        let (prompt, cont) = match self.prompt_and_cont(prompt_ids, cont_id) {
            Ok(x) => x,
            Err(e) => return error_dict(py, e),
        };
        let r = py
            .detach(|| -> infgram::Result<ProbResult> {
                let prompt_cnt = self.count_ids(&prompt)?;
                let mut full = prompt.clone();
                full.push(cont);
                let cont_cnt = self.count_ids(&full)?;
                Ok(ProbResult::new(prompt_cnt, cont_cnt, None))
            })
            .map_err(runtime)?;
        prob_dict(py, &r)
    }

    /// `{prompt_cnt, result_by_token_id, approx}`: the exact next-token distribution (the end
    /// of a document counts as `eos_token_id`).
    #[pyo3(signature = (prompt_ids, max_support=None))]
    fn ntd(&self, py: Python<'_>, prompt_ids: &Bound<'_, PyAny>, max_support: Option<i64>) -> Ans {
        if positive(max_support, self.max_support).is_none() {
            return error_dict(py, "max_support must be a positive integer");
        }
        let Some(q) = ids_of(prompt_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("prompt_ids"));
        };
        let r = py
            .detach(|| match self.held(&q) {
                true => ask::ntd(&self.shards, &q, Some(self.eos)),
                false => Ok(empty_ntd(None)),
            })
            .map_err(runtime)?;
        ntd_dict(py, &r)
    }

    /// `{prompt_cnt, cont_cnt, prob, suffix_len}` on the longest suffix of the prompt that
    /// occurs.
    fn infgram_prob(
        &self,
        py: Python<'_>,
        prompt_ids: &Bound<'_, PyAny>,
        cont_id: &Bound<'_, PyAny>,
    ) -> Ans {
        let (prompt, cont) = match self.prompt_and_cont(prompt_ids, cont_id) {
            Ok(x) => x,
            Err(e) => return error_dict(py, e),
        };
        let prompt = self.after_unheld(&prompt);
        let r = py
            .detach(|| -> infgram::Result<ProbResult> {
                if self.shards.holds_token(cont) {
                    return ask::infgram_prob(&self.shards, prompt, cont);
                }
                let r = ask::infgram_ntd(&self.shards, prompt, None)?;
                Ok(ProbResult::new(r.prompt_cnt, 0, r.suffix_len))
            })
            .map_err(runtime)?;
        prob_dict(py, &r)
    }

    /// `{prompt_cnt, result_by_token_id, approx, suffix_len}`.
    #[pyo3(signature = (prompt_ids, max_support=None))]
    fn infgram_ntd(
        &self,
        py: Python<'_>,
        prompt_ids: &Bound<'_, PyAny>,
        max_support: Option<i64>,
    ) -> Ans {
        if positive(max_support, self.max_support).is_none() {
            return error_dict(py, "max_support must be a positive integer");
        }
        let Some(q) = ids_of(prompt_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("prompt_ids"));
        };
        let q = self.after_unheld(&q);
        let r = py
            .detach(|| ask::infgram_ntd(&self.shards, q, Some(self.eos)))
            .map_err(runtime)?;
        ntd_dict(py, &r)
    }

    /// `{cnt, approx, idxs, documents}` of the documents containing `input_ids`.
    #[pyo3(signature = (input_ids, maxnum=None, max_disp_len=None))]
    fn search_docs(
        &self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        maxnum: Option<i64>,
        max_disp_len: Option<i64>,
    ) -> Ans {
        let (Some(maxnum), Some(mdl)) = (
            positive(maxnum, self.maxnum),
            positive(max_disp_len, self.max_disp_len),
        ) else {
            return error_dict(py, "maxnum and max_disp_len must be positive integers");
        };
        let Some(q) = ids_of(input_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("input_ids"));
        };
        if q.is_empty() {
            return self.search_answer(py, 0, false, Vec::new());
        }
        let cnf = vec![vec![q]];
        match py.detach(|| {
            self.search(
                &cnf,
                maxnum,
                self.max_diff_tokens,
                self.max_clause_freq,
                mdl,
            )
        }) {
            Ok(r) => match self.rewindow(r.documents, mdl) {
                Ok(docs) => self.search_answer(py, r.cnt, r.approx, docs),
                Err(e) => error_dict(py, e),
            },
            Err(e) => error_dict(py, e),
        }
    }

    /// `search_docs` of a CNF.
    #[pyo3(signature = (cnf, maxnum=None, max_disp_len=None, max_clause_freq=None, max_diff_tokens=None))]
    fn search_docs_cnf(
        &self,
        py: Python<'_>,
        cnf: &Bound<'_, PyAny>,
        maxnum: Option<i64>,
        max_disp_len: Option<i64>,
        max_clause_freq: Option<i64>,
        max_diff_tokens: Option<i64>,
    ) -> Ans {
        let (Some(maxnum), Some(mdl)) = (
            positive(maxnum, self.maxnum),
            positive(max_disp_len, self.max_disp_len),
        ) else {
            return error_dict(py, "maxnum and max_disp_len must be positive integers");
        };
        let (cnf, mcf, mdt) = match self.cnf_args(cnf, max_clause_freq, max_diff_tokens) {
            Ok(x) => x,
            Err(e) => return error_dict(py, e),
        };
        match py.detach(|| self.search(&cnf, maxnum, mdt, mcf, mdl)) {
            Ok(r) => match self.rewindow(r.documents, mdl) {
                Ok(docs) => self.search_answer(py, r.cnt, r.approx, docs),
                Err(e) => error_dict(py, e),
            },
            Err(e) => error_dict(py, e),
        }
    }

    /// The document around suffix-array rank `rank` of shard `s`.
    #[pyo3(signature = (s, rank, max_disp_len=None))]
    fn get_doc_by_rank(&self, py: Python<'_>, s: i64, rank: i64, max_disp_len: Option<i64>) -> Ans {
        doc_answer(py, self.by_rank(s, rank, max_disp_len))
    }

    /// `get_doc_by_rank` for a list of `(s, rank)`.
    #[pyo3(signature = (list_of_s_and_rank, max_disp_len=None))]
    fn get_docs_by_ranks(
        &self,
        py: Python<'_>,
        list_of_s_and_rank: Vec<(i64, i64)>,
        max_disp_len: Option<i64>,
    ) -> Ans {
        let docs: Result<Vec<Document>, String> = list_of_s_and_rank
            .iter()
            .map(|&(s, r)| self.by_rank(s, r, max_disp_len))
            .collect();
        docs_list(py, docs)
    }

    /// The document around byte offset `ptr` of shard `s`.
    #[pyo3(signature = (s, ptr, max_disp_len=None))]
    fn get_doc_by_ptr(&self, py: Python<'_>, s: i64, ptr: i64, max_disp_len: Option<i64>) -> Ans {
        doc_answer(py, self.by_ptr(s, ptr, max_disp_len))
    }

    /// `get_doc_by_ptr` for a list of `(s, ptr)`.
    #[pyo3(signature = (list_of_s_and_ptr, max_disp_len=None))]
    fn get_docs_by_ptrs(
        &self,
        py: Python<'_>,
        list_of_s_and_ptr: Vec<(i64, i64)>,
        max_disp_len: Option<i64>,
    ) -> Ans {
        let docs: Result<Vec<Document>, String> = list_of_s_and_ptr
            .iter()
            .map(|&(s, p)| self.by_ptr(s, p, max_disp_len))
            .collect();
        docs_list(py, docs)
    }

    /// The first `max_disp_len` tokens of document `doc_ix`.
    #[pyo3(signature = (doc_ix, max_disp_len=None))]
    fn get_doc_by_ix(&self, py: Python<'_>, doc_ix: i64, max_disp_len: Option<i64>) -> Ans {
        doc_answer(py, self.by_ix(doc_ix, max_disp_len))
    }

    /// `get_doc_by_ix` for a list of document indexes.
    #[pyo3(signature = (list_of_doc_ix, max_disp_len=None))]
    fn get_docs_by_ixs(
        &self,
        py: Python<'_>,
        list_of_doc_ix: Vec<i64>,
        max_disp_len: Option<i64>,
    ) -> Ans {
        let docs: Result<Vec<Document>, String> = list_of_doc_ix
            .iter()
            .map(|&d| self.by_ix(d, max_disp_len))
            .collect();
        docs_list(py, docs)
    }

    /// The window `[pos − max_ctx_len, pos + needle_len + max_ctx_len)` around rank `rank`.
    fn get_doc_by_rank_2(
        &self,
        py: Python<'_>,
        s: i64,
        rank: i64,
        needle_len: i64,
        max_ctx_len: i64,
    ) -> Ans {
        match self
            .rank_pos(s, rank)
            .and_then(|at| self.ctx_window(at, needle_len, max_ctx_len))
        {
            Ok(d) => doc_dict(py, &d),
            Err(e) => error_dict(py, e),
        }
    }

    /// The window `[ptr − max_ctx_len, ptr + needle_len + max_ctx_len)` (byte offset `ptr`).
    fn get_doc_by_ptr_2(
        &self,
        py: Python<'_>,
        s: i64,
        ptr: i64,
        needle_len: i64,
        max_ctx_len: i64,
    ) -> Ans {
        match self
            .ptr_pos(s, ptr)
            .and_then(|at| self.ctx_window(at, needle_len, max_ctx_len))
        {
            Ok(d) => doc_dict(py, &d),
            Err(e) => error_dict(py, e),
        }
    }

    /// The first `max_ctx_len` tokens of document `doc_ix`.
    fn get_doc_by_ix_2(&self, py: Python<'_>, doc_ix: i64, max_ctx_len: i64) -> Ans {
        if max_ctx_len < 0 {
            return error_dict(py, "max_ctx_len must be a non-negative integer");
        }
        match self.by_ix(doc_ix, Some(max_ctx_len.max(1))).map(|mut d| {
            if max_ctx_len == 0 {
                d.token_ids.clear();
                d.disp_len = 0;
            }
            d
        }) {
            Ok(d) => doc_dict(py, &d),
            Err(e) => error_dict(py, e),
        }
    }

    /// Documents in the index.
    fn get_total_doc_cnt(&self) -> u64 {
        self.shards.num_docs()
    }

    /// Shards in the index.
    fn get_num_shards(&self) -> usize {
        self.shards.shard_count()
    }

    /// `{rs}`: for each position `i`, one past the end of the longest span starting at `i`
    /// that occurs.
    fn creativity(&self, py: Python<'_>, input_ids: &Bound<'_, PyAny>) -> Ans {
        let Some(q) = ids_of(input_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("input_ids"));
        };
        if q.is_empty() {
            let d = PyDict::new(py);
            d.set_item("rs", PyList::empty(py))?;
            return Ok(d.into_any().unbind());
        }
        match py.detach(|| infgram::eval::attribution::creativity(&self.shards, &q, 1, 1)) {
            Ok(c) => {
                let d = PyDict::new(py);
                d.set_item("rs", c.rs)?;
                Ok(d.into_any().unbind())
            }
            Err(e) => error_dict(py, e),
        }
    }

    /// `{spans}`: maximal spans of `input_ids` of at least `min_len` tokens that occur, with
    /// up to `max_cnt` documents each (`{s, ptr}`, byte pointers). `delim_ids` and
    /// `enforce_bow` are accepted; `unigram_logprob_sum` is −10,000 per token, as infini-gram's
    /// without precomputed unigrams.
    #[pyo3(signature = (input_ids, delim_ids, min_len, max_cnt, enforce_bow))]
    #[allow(unused_variables)]
    fn attribute(
        &self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        delim_ids: &Bound<'_, PyAny>,
        min_len: i64,
        max_cnt: i64,
        enforce_bow: bool,
    ) -> Ans {
        let Some(q) = ids_of(input_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("input_ids"));
        };
        if ids_of(delim_ids, self.token_id_max, true).is_none() {
            return error_dict(py, self.ids_error("delim_ids"));
        }
        if min_len < 0 {
            return error_dict(py, "min_len must be a non-negative integer");
        }
        if max_cnt <= 0 {
            return error_dict(py, "max_cnt must be a positive integer");
        }
        let spans = match py.detach(|| {
            infgram::eval::attribution::attribute(
                &self.shards,
                &q,
                min_len.max(1) as usize,
                max_cnt as usize,
                0,
            )
        }) {
            Ok(s) => s,
            Err(e) => return error_dict(py, e),
        };
        let out = PyList::empty(py);
        for sp in spans {
            let d = PyDict::new(py);
            d.set_item("l", sp.l)?;
            d.set_item("r", sp.r)?;
            d.set_item("length", sp.length)?;
            d.set_item("count", sp.count)?;
            d.set_item("unigram_logprob_sum", -10_000.0 * sp.length as f64)?;
            let docs = PyList::empty(py);
            for doc in &sp.docs {
                let x = PyDict::new(py);
                x.set_item("s", doc.s)?;
                x.set_item("ptr", doc.ptr * self.width)?;
                docs.append(x)?;
            }
            d.set_item("docs", docs)?;
            out.append(d)?;
        }
        let d = PyDict::new(py);
        d.set_item("spans", out)?;
        Ok(d.into_any().unbind())
    }
}

impl InfiniGramEngine {
    /// An engine over the shards `open(width)` gives, after checking the arguments as
    /// infini-gram does (`limits`: max_support, max_clause_freq, max_diff_tokens, maxnum,
    /// max_disp_len).
    fn checked(
        eos_token_id: i64,
        vocab_size: i64,
        token_dtype: &str,
        limits: [i64; 5],
        open: impl FnOnce(u8) -> PyResult<Backend>,
    ) -> PyResult<Self> {
        if !(0..vocab_size).contains(&eos_token_id) {
            return Err(PyValueError::new_err(format!(
                "eos_token_id must be in [0, vocab_size) = [0, {vocab_size}), got {eos_token_id}"
            )));
        }
        let names = [
            "max_support",
            "max_clause_freq",
            "max_diff_tokens",
            "maxnum",
            "max_disp_len",
        ];
        if let Some((name, v)) = names.iter().zip(limits).find(|(_, v)| *v <= 0) {
            return Err(PyValueError::new_err(format!(
                "{name} must be a positive integer, got {v}"
            )));
        }
        let width = dtype_width(token_dtype)?;
        let [max_support, max_clause_freq, max_diff_tokens, maxnum, max_disp_len] =
            limits.map(|v| v as usize);
        Ok(InfiniGramEngine {
            shards: open(width)?,
            eos: eos_token_id as u32,
            token_id_max: if width == 4 {
                u32::MAX as u64
            } else {
                (1u64 << (8 * width)) - 1
            },
            width: width as usize,
            max_support,
            max_clause_freq,
            max_diff_tokens,
            maxnum,
            max_disp_len,
        })
    }

    fn ids_error(&self, name: &str) -> String {
        format!(
            "{name} must be a list of integers in range [0, {}]",
            self.token_id_max
        )
    }

    /// Whether every id is one the index can hold (an id outside it simply does not occur).
    fn held(&self, q: &[u32]) -> bool {
        q.iter().all(|&t| self.shards.holds_token(t))
    }

    /// The part of `q` after its last id that the index cannot hold: no occurring suffix
    /// reaches past it.
    fn after_unheld<'a>(&self, q: &'a [u32]) -> &'a [u32] {
        match q.iter().rposition(|&t| !self.shards.holds_token(t)) {
            Some(i) => &q[i + 1..],
            None => q,
        }
    }

    fn count_ids(&self, q: &[u32]) -> infgram::Result<u64> {
        if !self.held(q) {
            return Ok(0);
        }
        Ok(ask::count(&self.shards, q)?.count)
    }

    fn prompt_and_cont(
        &self,
        prompt_ids: &Bound<'_, PyAny>,
        cont_id: &Bound<'_, PyAny>,
    ) -> Result<(Vec<u32>, u32), String> {
        let prompt = ids_of(prompt_ids, self.token_id_max, true).ok_or_else(|| {
            format!(
                "prompt_ids must be a non-empty list of integers in range [0, {}]",
                self.token_id_max
            )
        })?;
        let cont = if cont_id.is_instance_of::<pyo3::types::PyBool>() {
            None
        } else {
            cont_id
                .extract::<u64>()
                .ok()
                .filter(|&c| c <= self.token_id_max)
        }
        .ok_or_else(|| {
            format!(
                "cont_id must be an integer in range [0, {}]",
                self.token_id_max
            )
        })?;
        Ok((prompt, cont as u32))
    }

    #[allow(clippy::type_complexity)]
    fn cnf_args(
        &self,
        cnf: &Bound<'_, PyAny>,
        max_clause_freq: Option<i64>,
        max_diff_tokens: Option<i64>,
    ) -> Result<(Vec<Vec<Vec<u32>>>, usize, usize), String> {
        let mcf = positive(max_clause_freq, self.max_clause_freq)
            .ok_or("max_clause_freq must be a positive integer")?;
        let mdt = positive(max_diff_tokens, self.max_diff_tokens)
            .ok_or("max_diff_tokens must be a positive integer")?;
        let cnf = cnf_of(cnf, self.token_id_max).ok_or_else(|| {
            format!(
                "cnf must be a non-empty, triply-nested list of integers in range [0, {}]",
                self.token_id_max
            )
        })?;
        Ok((cnf, mcf, mdt))
    }

    /// `search_docs` over the CNF with n-grams of ids the index cannot hold dropped (they
    /// never occur; a clause left empty matches nothing).
    fn search(
        &self,
        cnf: &[Vec<Vec<u32>>],
        maxnum: usize,
        max_diff_tokens: usize,
        max_clause_freq: usize,
        max_disp_len: usize,
    ) -> infgram::Result<infgram::index::query::SearchResult> {
        let held: Vec<Vec<Vec<u32>>> = cnf
            .iter()
            .map(|c| c.iter().filter(|g| self.held(g)).cloned().collect())
            .collect();
        if held.iter().any(|c: &Vec<Vec<u32>>| c.is_empty()) {
            return Ok(infgram::index::query::SearchResult {
                cnt: 0,
                approx: false,
                documents: Vec::new(),
                ptrs_by_shard: vec![Vec::new(); self.shards.shard_count()],
            });
        }
        ask::search_docs(
            &self.shards,
            &held,
            maxnum,
            max_diff_tokens,
            max_clause_freq,
            max_disp_len,
        )
    }

    /// infini-gram's window: `max_disp_len / 2` tokens each side of the match's start.
    fn rewindow(&self, docs: Vec<Document>, max_disp_len: usize) -> infgram::Result<Vec<Document>> {
        let before = max_disp_len / 2;
        docs.into_iter()
            .map(|d| ask::window_at(&self.shards, d.s, d.ptr, before, max_disp_len - before))
            .collect()
    }

    fn search_answer(&self, py: Python<'_>, cnt: u64, approx: bool, docs: Vec<Document>) -> Ans {
        let d = PyDict::new(py);
        d.set_item("cnt", cnt)?;
        d.set_item("approx", approx)?;
        d.set_item("idxs", (0..docs.len() as u64).collect::<Vec<_>>())?;
        let list = PyList::empty(py);
        for doc in &docs {
            list.append(doc_dict(py, doc)?)?;
        }
        d.set_item("documents", list)?;
        Ok(d.into_any().unbind())
    }

    fn shard_len(&self, s: i64) -> Result<(usize, usize), String> {
        let infos = self.shards.infos();
        let n = infos.len();
        if s < 0 || s as usize >= n {
            return Err(format!("s must be an integer in range [0, {n})"));
        }
        Ok((s as usize, infos[s as usize].tokens as usize))
    }

    fn rank_pos(&self, s: i64, rank: i64) -> Result<Anchor, String> {
        let (s, n) = self.shard_len(s)?;
        if rank < 0 || rank as usize >= n {
            return Err(format!("ptr must be an integer in range [0, {n})"));
        }
        Ok(Anchor::Rank(s, rank as usize))
    }

    fn ptr_pos(&self, s: i64, ptr: i64) -> Result<Anchor, String> {
        let (s, n) = self.shard_len(s)?;
        let bytes = n * self.width;
        if ptr < 0 || ptr as usize >= bytes || !(ptr as usize).is_multiple_of(self.width) {
            return Err(format!(
                "ptr must be an integer in range [0, {bytes}), a multiple of {}",
                self.width
            ));
        }
        Ok(Anchor::Pos(s, ptr as usize / self.width))
    }

    /// The window `[pos − before, pos + after)` of the document at `at`, cut to the document.
    fn window(&self, at: Anchor, before: usize, after: usize) -> Result<Document, String> {
        match at {
            Anchor::Pos(s, pos) => ask::window_at(&self.shards, s, pos, before, after),
            Anchor::Rank(s, rank) => ask::window_at_rank(&self.shards, s, rank, before, after),
        }
        .map_err(|e| e.to_string())
    }

    fn disp_len(&self, v: Option<i64>) -> Result<usize, String> {
        positive(v, self.max_disp_len)
            .ok_or_else(|| "max_disp_len must be a positive integer".into())
    }

    /// infini-gram's window: `max_disp_len / 2` tokens before `pos`, the rest from it.
    fn disp_window(&self, at: Anchor, max_disp_len: Option<i64>) -> Result<Document, String> {
        let len = self.disp_len(max_disp_len)?;
        self.window(at, len / 2, len - len / 2)
    }

    fn by_rank(&self, s: i64, rank: i64, max_disp_len: Option<i64>) -> Result<Document, String> {
        self.disp_window(self.rank_pos(s, rank)?, max_disp_len)
    }

    fn by_ptr(&self, s: i64, ptr: i64, max_disp_len: Option<i64>) -> Result<Document, String> {
        self.disp_window(self.ptr_pos(s, ptr)?, max_disp_len)
    }

    fn by_ix(&self, doc_ix: i64, max_disp_len: Option<i64>) -> Result<Document, String> {
        let len = self.disp_len(max_disp_len)?;
        let total = self.shards.num_docs();
        if doc_ix < 0 || doc_ix as u64 >= total {
            return Err(format!("doc_ix must be an integer in range [0, {total})"));
        }
        ask::get_doc_by_ix(&self.shards, doc_ix as u64, len).map_err(|e| e.to_string())
    }

    fn ctx_window(
        &self,
        at: Anchor,
        needle_len: i64,
        max_ctx_len: i64,
    ) -> Result<Document, String> {
        if needle_len < 0 {
            return Err("needle_len must be a non-negative integer".into());
        }
        if max_ctx_len < 0 {
            return Err("max_ctx_len must be a non-negative integer".into());
        }
        let (n, c) = (needle_len as usize, max_ctx_len as usize);
        self.window(at, c, n + c)
    }
}

fn empty_ntd(suffix_len: Option<usize>) -> NtdResult {
    NtdResult {
        prompt_cnt: 0,
        result_by_token_id: Default::default(),
        approx: false,
        suffix_len,
    }
}

fn prob_dict(py: Python<'_>, r: &ProbResult) -> Ans {
    let d = PyDict::new(py);
    d.set_item("prompt_cnt", r.prompt_cnt)?;
    d.set_item("cont_cnt", r.cont_cnt)?;
    d.set_item("prob", r.prob)?;
    if let Some(l) = r.suffix_len {
        d.set_item("suffix_len", l)?;
    }
    Ok(d.into_any().unbind())
}

fn ntd_dict(py: Python<'_>, r: &NtdResult) -> Ans {
    let d = PyDict::new(py);
    d.set_item("prompt_cnt", r.prompt_cnt)?;
    let by = PyDict::new(py);
    for (t, p) in &r.result_by_token_id {
        let x = PyDict::new(py);
        x.set_item("cont_cnt", p.cont_cnt)?;
        x.set_item("prob", p.prob)?;
        by.set_item(t, x)?;
    }
    d.set_item("result_by_token_id", by)?;
    d.set_item("approx", r.approx)?;
    if let Some(l) = r.suffix_len {
        d.set_item("suffix_len", l)?;
    }
    Ok(d.into_any().unbind())
}

fn doc_dict(py: Python<'_>, doc: &Document) -> Ans {
    let d = PyDict::new(py);
    d.set_item("doc_ix", doc.doc_ix)?;
    d.set_item("doc_len", doc.doc_len)?;
    d.set_item("disp_len", doc.disp_len)?;
    d.set_item("needle_offset", doc.needle_offset)?;
    // infini-gram returns the metadata line with its newline.
    let meta = if doc.metadata.is_empty() {
        String::new()
    } else {
        format!("{}\n", doc.metadata)
    };
    d.set_item("metadata", meta)?;
    d.set_item("token_ids", &doc.token_ids)?;
    d.set_item("blocked", false)?;
    Ok(d.into_any().unbind())
}

/// A document's dict, or infini-gram's `{"error"}`.
fn doc_answer(py: Python<'_>, doc: Result<Document, String>) -> Ans {
    match doc {
        Ok(d) => doc_dict(py, &d),
        Err(e) => error_dict(py, e),
    }
}

fn docs_list(py: Python<'_>, docs: Result<Vec<Document>, String>) -> Ans {
    match docs {
        Ok(docs) => {
            let l = PyList::empty(py);
            for d in &docs {
                l.append(doc_dict(py, d)?)?;
            }
            Ok(l.into_any().unbind())
        }
        Err(e) => error_dict(py, e),
    }
}

/// Python's arguments of an SBIS generation (`Index.generate`, `RemoteIndex.generate`).
struct SbisArgs<'a> {
    prompt: &'a str,
    max_tokens: Option<usize>,
    k: Option<i64>,
    decay: Option<f64>,
    context: Option<usize>,
    temperature: Option<f64>,
    top_k: Option<usize>,
    top_p: Option<f64>,
    seed: Option<u64>,
    guard: Option<usize>,
}

impl SbisArgs<'_> {
    /// The library's request from these arguments, checked (a bad one names Python's
    /// parameter: `ValueError`), run by `run` with the GIL released, as
    /// `{text, tokens, hit_end[, guard]}` and the report's speed. A shard that did not answer
    /// is a `RuntimeError`. `bind` makes the resources it runs over: one call of the service's
    /// generation ([`infgram::service::run::generate`]).
    fn run(
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
            .detach(|| {
                let mut res = bind(tok.as_ref());
                infgram::service::run::generate(&checked, &mut res, &opts, |_| {})
            })
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
        d.set_item("seconds", report.seconds)?;
        d.set_item("tokens_per_second", report.tokens_per_second)?;
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

/// An infgram index with its tokenizer: the typed query protocol, generation and perplexity.
#[pyclass(frozen, subclass, module = "infgram._native")]
pub struct Index {
    index: Arc<Idx>,
    tok: Arc<dyn Tokenizer>,
}

#[pymethods]
impl Index {
    /// Opens an index directory (infgram's or infini-gram's); `tokenizer` names the one to
    /// tokenize text with (default: the index's own).
    #[new]
    #[pyo3(signature = (path, tokenizer=None))]
    fn new(py: Python<'_>, path: PathBuf, tokenizer: Option<String>) -> PyResult<Self> {
        let (index, tok) = py
            .detach(|| infgram::service::open_index(&path, tokenizer.as_deref()))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Index {
            index: Arc::new(index),
            tok: Arc::from(tok),
        })
    }

    /// Answers one query of the protocol shared with `infgram query --batch` and the server,
    /// given as a JSON string (`{"query_type": "count", "text": "the cat"}`); returns the
    /// answer as a JSON string, or `{"error": ...}`.
    fn query_json(&self, py: Python<'_>, request: &str) -> String {
        py.detach(|| {
            let answer = infgram::service::Query::from_json(request)
                .and_then(|q| infgram::service::execute(&self.index, self.tok.as_ref(), &q));
            match answer {
                Ok(a) => a.to_value().to_string(),
                Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
            }
        })
    }

    /// Token ids of `text` with the index's tokenizer.
    fn tokenize(&self, text: &str) -> PyResult<Vec<u32>> {
        self.tok
            .encode(text)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Text of token ids.
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        self.tok
            .decode(&ids)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Corpus tokens (separators excluded), documents and shards.
    fn stats(&self, py: Python<'_>) -> Ans {
        let d = PyDict::new(py);
        d.set_item("tokens", self.index.total_tokens())?;
        d.set_item("documents", self.index.num_docs())?;
        d.set_item("shards", self.index.shards().len())?;
        d.set_item("token_width", self.index.header().token_width)?;
        d.set_item("reverse", self.index.has_reverse())?;
        d.set_item(
            "format",
            match self.index.shards().first().map(|s| s.layout()) {
                Some(Layout::InfiniGram) => "infini-gram",
                _ => "infgram",
            },
        )?;
        Ok(d.into_any().unbind())
    }

    /// What a distributed manifest records of this index and checks at start: `header_crc32`
    /// (the header's own checksum, which covers every file's checksum), `tokenizer` (`kind`,
    /// `fingerprint`, `vocab_size`), `separator`, `token_width` and `shard_infos` (each
    /// shard's `[tokens, documents]`, separators counted in tokens).
    fn identity(&self, py: Python<'_>) -> Ans {
        let h = self.index.header();
        let d = PyDict::new(py);
        d.set_item("header_crc32", h.header_crc32)?;
        let t = PyDict::new(py);
        t.set_item("kind", &h.tokenizer.kind)?;
        t.set_item("fingerprint", &h.tokenizer.fingerprint)?;
        t.set_item("vocab_size", h.tokenizer.vocab_size)?;
        d.set_item("tokenizer", t)?;
        d.set_item("separator", self.index.separator())?;
        d.set_item("token_width", h.token_width)?;
        let infos: Vec<(u64, u64)> = self
            .index
            .infos()
            .iter()
            .map(|i| (i.tokens, i.documents))
            .collect();
        d.set_item("shard_infos", infos)?;
        Ok(d.into_any().unbind())
    }

    /// A shard server's side of `infgram.ray`: the answers of this index's shards to
    /// `[(shard, query_json), ...]` (shards numbered within this index), as JSON strings.
    /// Releases the GIL.
    fn answer_shard_queries(
        &self,
        py: Python<'_>,
        requests: Vec<(usize, String)>,
    ) -> PyResult<Vec<String>> {
        py.detach(|| remote::answer_json(&self.index, &requests))
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
        let index = self.index.clone();
        args.run(py, self.tok.clone(), move |tok| {
            infgram::service::Resources::index(index, tok)
        })
    }

    /// Every position's ∞-gram next-token distribution of `tokens` (u32 little-endian bytes)
    /// in one call, with its suffix length, count and distinct continuations (see
    /// `infgram.Index.infgram_rows`). Releases the GIL.
    #[pyo3(signature = (tokens, window=infgram::ngram::batch::ROWS_WINDOW, end_token=None, vocab=None, estimator_json=None))]
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
            &self.index,
            tokens,
            window,
            end_token,
            vocab,
            estimator_json,
        )
    }

    /// A classic n-gram model of fixed `order` over this index: `estimator` `"mkn"`
    /// (interpolated modified Kneser–Ney, as KenLM's lmplz) or `"add_alpha"` (with `alpha`;
    /// 0 is MLE). Sentence mode follows the index (built with `sentences=True`).
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
            "mkn" => infgram::ngram::EstimatorSpec::Mkn { order },
            "add_alpha" | "add-alpha" => infgram::ngram::EstimatorSpec::AddAlpha { order, alpha },
            other => {
                return Err(PyValueError::new_err(format!(
                    "estimator {other:?}: a fixed-order model is \"mkn\" or \"add_alpha\""
                )))
            }
        };
        let model = py
            .detach(|| spec.classic(&*self.index, discount_fallback))
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .ok_or_else(|| PyValueError::new_err("not a fixed-order model"))?;
        Ok(NgramModel {
            index: self.index.clone(),
            tok: self.tok.clone(),
            model,
        })
    }

    /// Perplexity of `text` under the ∞-gram (SBIS with `k` levels and `decay`), with the
    /// agreement analysis: `{ppl, tokens, bits_per_token, seconds, floored, ...}`.
    #[pyo3(signature = (text, k=-1, decay=0.1, context=200))]
    fn perplexity(&self, py: Python<'_>, text: &str, k: i64, decay: f64, context: usize) -> Ans {
        let ids = self.tokenize(text)?;
        let est = infgram::ngram::Estimator::Sbis { k, decay };
        let report = py
            .detach(|| infgram::eval::ngram::perplexity(&self.index, &ids, &est, context, None))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let v =
            serde_json::to_value(&report).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        to_py(py, &v)
    }
}

/// A classic fixed-order n-gram model over an index (`Index.ngram_model`), scored as KenLM's
/// `kenlm.Model` scores: `score(sentence)` is the log10 probability of `<s> sentence </s>`.
#[pyclass(frozen, module = "infgram._native")]
pub struct NgramModel {
    index: Arc<Idx>,
    /// The index's tokenizer (shared with its `Index`).
    tok: Arc<dyn Tokenizer>,
    model: infgram::ngram::classic::ClassicModel,
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
            .detach(|| -> infgram::Result<_> {
                use infgram::output_file::{write_file, Accept};
                write_file(&path, Accept::Streams, |out| {
                    infgram::ngram::arpa::write_arpa(
                        &self.model,
                        &self.index,
                        self.tok.as_ref(),
                        out,
                    )
                })
            })
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
    ) -> PyResult<infgram::eval::classic::ClassicReport> {
        py.detach(|| {
            let sentences = self.model.bos().is_some();
            let seqs =
                infgram::eval::classic::scored_sequences(self.tok.as_ref(), text, sentences)?;
            infgram::eval::classic::score(&self.index, &self.model, &seqs, floor)
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

/// Builds an index of `inputs` (files or directories of .txt / .jsonl[.gz|.zst]) into `out`
/// with `tokenizer` (`bytes`, `words`, a short model name, or a tokenizer file); with
/// `sentences` (and `words`) each line is a sentence `<s> … </s>`, as classic n-gram models
/// count; a progress bar on a terminal when `progress`; `docs=(first, end)`: only those
/// documents of the inputs, in the order they are read (one slice of `infgram.ray.build`).
/// Returns the build summary. A failed build leaves nothing behind.
#[pyfunction]
#[pyo3(signature = (inputs, out, tokenizer="bytes", mem_gb=None, reverse=true, overwrite=false, progress=true, sentences=false, docs=None))]
#[allow(clippy::too_many_arguments)]
fn build_index(
    py: Python<'_>,
    inputs: Vec<PathBuf>,
    out: PathBuf,
    tokenizer: &str,
    mem_gb: Option<f64>,
    reverse: bool,
    overwrite: bool,
    progress: bool,
    sentences: bool,
    docs: Option<(u64, u64)>,
) -> Ans {
    let tok = py
        .detach(|| infgram::service::build_tokenizer(tokenizer, &inputs))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut opts = infgram::index::pipeline::BuildOptions {
        reverse,
        overwrite,
        progress,
        sentences,
        docs: docs.map_or(0..u64::MAX, |(a, b)| a..b),
        ..Default::default()
    };
    if let Some(g) = mem_gb {
        opts.mem_bytes = (g * (1u64 << 30) as f64) as u64;
    }
    let summary = py
        .detach(|| infgram::index::pipeline::build_index(&inputs, &out, tok.as_ref(), &opts))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("tokens", summary.tokens)?;
    d.set_item("documents", summary.documents)?;
    d.set_item("shards", summary.shards)?;
    d.set_item("disk_bytes", summary.disk_bytes)?;
    d.set_item("seconds", summary.seconds)?;
    Ok(d.into_any().unbind())
}

/// Cuts the documents of `inputs` into at most `n` slices of consecutive whole documents with
/// about the same bytes each: `[(first, end, bytes), ...]` (what `infgram.ray.build` builds,
/// one Ray task a slice). Text files are not read; JSON-lines files are split into lines.
#[pyfunction]
fn plan_slices(py: Python<'_>, inputs: Vec<PathBuf>, n: usize) -> PyResult<Vec<(u64, u64, u64)>> {
    let slices = py
        .detach(|| infgram::index::pipeline::plan_slices(&inputs, n))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(slices
        .into_iter()
        .map(|s| (s.docs.start, s.docs.end, s.bytes))
        .collect())
}

/// Builds an index of documents given as token ids (a corpus tokenized in Python):
/// `docs_per_shard` documents a shard, `metadata` one JSON line per document (optional). The
/// index is queried by ids (its tokenizer is unknown to it). Returns the build summary.
#[pyfunction]
#[pyo3(signature = (docs, out, vocab_size, metadata=None, docs_per_shard=None, reverse=true, overwrite=false))]
#[allow(clippy::too_many_arguments)]
fn build_index_from_ids(
    py: Python<'_>,
    docs: Vec<Vec<u32>>,
    out: PathBuf,
    vocab_size: usize,
    metadata: Option<Vec<String>>,
    docs_per_shard: Option<usize>,
    reverse: bool,
    overwrite: bool,
) -> Ans {
    let opts = infgram::index::pipeline::BuildOptions {
        reverse,
        overwrite,
        progress: false,
        ..Default::default()
    };
    let per = docs_per_shard.unwrap_or(docs.len().max(1));
    let meta = metadata.unwrap_or_default();
    let summary = py
        .detach(|| {
            infgram::index::pipeline::build_from_ids(&docs, &meta, vocab_size, per, &out, &opts)
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("tokens", summary.tokens)?;
    d.set_item("documents", summary.documents)?;
    d.set_item("shards", summary.shards)?;
    d.set_item("disk_bytes", summary.disk_bytes)?;
    d.set_item("seconds", summary.seconds)?;
    Ok(d.into_any().unbind())
}

/// infgram's query protocol and the infini-gram HTTP API over shards held elsewhere (the
/// Ray router of `infgram.ray`): `ask` answers `[(shard, query_json), ...]` with
/// `[answer_json, ...]`; the tokenizer is loaded by name here and must have the shards'
/// fingerprint.
#[pyclass(frozen, module = "infgram._native")]
pub struct RemoteIndex {
    shards: Arc<remote::RemoteShards>,
    tok: Arc<dyn Tokenizer>,
    limits: infgram::server::Limits,
    name: String,
}

#[pymethods]
impl RemoteIndex {
    #[new]
    #[pyo3(signature = (ask, shard_infos, separator, tokenizer, fingerprint, name="index"))]
    fn new(
        py: Python<'_>,
        ask: Py<PyAny>,
        shard_infos: Vec<(u64, u64)>,
        separator: u32,
        tokenizer: &str,
        fingerprint: &str,
        name: &str,
    ) -> PyResult<Self> {
        let tok = py
            .detach(|| infgram::service::load_tokenizer(tokenizer))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        if tok.fingerprint() != fingerprint {
            return Err(PyValueError::new_err(format!(
                "tokenizer {tokenizer} has fingerprint {}, the shards were built with {fingerprint}: \
                 pass the tokenizer the index was built with",
                tok.fingerprint()
            )));
        }
        let shards = remote::RemoteShards::new(ask, &shard_infos, separator, tok.vocab_size());
        Ok(RemoteIndex {
            shards: Arc::new(shards),
            tok: Arc::from(tok),
            limits: infgram::server::Limits::default(),
            name: name.to_string(),
        })
    }

    /// Answers one query of infgram's protocol (as `Index.query_json`).
    fn query_json(&self, py: Python<'_>, request: &str) -> String {
        py.detach(|| {
            let answer = infgram::service::Query::from_json(request)
                .and_then(|q| infgram::service::execute(&self.shards, self.tok.as_ref(), &q));
            match answer {
                Ok(a) => a.to_value().to_string(),
                Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
            }
        })
    }

    /// Answers one body of the infini-gram HTTP API (`POST /` of `infgram serve`, with its
    /// default limits) and returns `(status, json)`: the same shapes, limits and errors (an
    /// `"index"` other than this one's name is a 404, as on a server of one index).
    fn api(&self, py: Python<'_>, body: &[u8]) -> (u16, String) {
        use infgram::server::api;
        py.detach(|| {
            let answer = api::read_request(body, &self.limits).and_then(|r| match &r.index {
                Some(name) if *name != self.name => Err(api::ApiError {
                    status: 404,
                    message: format!("no index {name:?} here; this server has: {}", self.name),
                }),
                _ => api::answer(&self.shards, self.tok.as_ref(), &r, &self.limits),
            });
            match answer {
                Ok(v) => (200, v.to_string()),
                Err(e) => (
                    e.status,
                    serde_json::json!({ "error": e.message }).to_string(),
                ),
            }
        })
    }

    /// Token ids of `text`.
    fn tokenize(&self, text: &str) -> PyResult<Vec<u32>> {
        self.tok
            .encode(text)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// `Index.generate` over the shards: SBIS, one round trip to every shard a token, the copy
    /// guard (`guard`) checked against the same shards. A shard that stays down fails the
    /// generation (`RuntimeError`), never an unchecked output.
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
        let shards: ask::SharedShards = self.shards.clone();
        args.run(py, self.tok.clone(), move |tok| {
            infgram::service::Resources::shards(shards, tok)
        })
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<InfiniGramEngine>()?;
    m.add_class::<Index>()?;
    m.add_class::<RemoteIndex>()?;
    m.add_class::<NgramModel>()?;
    m.add_class::<rows::InfgramRows>()?;
    m.add_function(wrap_pyfunction!(rows::default_mixer, m)?)?;
    m.add_function(wrap_pyfunction!(build_index, m)?)?;
    m.add_function(wrap_pyfunction!(build_index_from_ids, m)?)?;
    m.add_function(wrap_pyfunction!(plan_slices, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
