//! `InfiniGramEngine`: the drop-in for infini-gram 2.6.0's engine, over infgram's indexes
//! and infini-gram's own, local or held elsewhere.
use crate::remote;
use crate::Guarded;
use crate::{cnf_of, error_dict, ids_of, positive, runtime, Ans, Idx};
use infgram::service::query::defaults;
use infgram::service::shards::{Document, NtdResult, ProbResult};
use infgram::service::shards::{Shards, SharedShards};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::path::PathBuf;
use std::sync::Arc;

/// Where a document window is anchored: a token position of a shard, or a suffix-array rank.
#[derive(Clone, Copy)]
pub(crate) enum Anchor {
    Pos(usize, usize),
    Rank(usize, usize),
}

/// A drop-in for `infini_gram.engine.InfiniGramEngine`.
///
/// Differences, all documented in docs/python.md: distributions are exact (`approx` is always
/// false, whatever `max_support`); `search_docs` returns the first matching documents in
/// suffix-array order rather than a random sample; ids at or above the separator (2^16 − 1 for
/// u16) are refused; `attribute` uses infgram's maximal spans.
#[pyclass(frozen, module = "infgram._native")]
pub struct InfiniGramEngine {
    pub(crate) shards: SharedShards,
    pub(crate) eos: u32,
    pub(crate) token_id_max: u64,
    pub(crate) width: usize,
    pub(crate) max_support: usize,
    pub(crate) max_clause_freq: usize,
    pub(crate) max_diff_tokens: usize,
    pub(crate) maxnum: usize,
    pub(crate) max_disp_len: usize,
}

pub(crate) fn dtype_width(token_dtype: &str) -> PyResult<u8> {
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
pub(crate) fn open_dir(dir: &str, width: u8) -> PyResult<Idx> {
    let path = PathBuf::from(dir);
    let index = if infgram::service::shards::is_infini_gram_dir(&path) {
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
            let index = py.guarded(|| -> PyResult<Idx> {
                let opened = dirs
                    .iter()
                    .map(|d| open_dir(d, width))
                    .collect::<PyResult<Vec<_>>>()?;
                Idx::merge(opened).map_err(|e| PyValueError::new_err(e.to_string()))
            })??;
            Ok(Arc::new(index) as SharedShards)
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
            Ok(Arc::new(shards) as SharedShards)
        })
    }

    /// `{cnt, segment_by_shard}`: the suffix-array range of `input_ids` in each shard.
    fn find(&self, py: Python<'_>, input_ids: &Bound<'_, PyAny>) -> Ans {
        let Some(q) = ids_of(input_ids, self.token_id_max, true) else {
            return error_dict(py, self.ids_error("input_ids"));
        };
        let shards = &self.shards;
        let (cnt, segs) = py
            .guarded(|| match self.held(&q) {
                true => shards.find(&q).map(|f| (f.cnt, f.segment_by_shard)),
                false => Ok((0, vec![(0, 0); shards.shard_count()])),
            })?
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
        let r = match py.guarded(|| self.search(&cnf, 0, mdt, mcf, 0))? {
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
        let count = py.guarded(|| self.count_ids(&q))?.map_err(runtime)?;
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
        match py.guarded(|| self.search(&cnf, 0, mdt, mcf, 0))? {
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
            .guarded(|| -> infgram::Result<ProbResult> {
                let prompt_cnt = self.count_ids(&prompt)?;
                let mut full = prompt.clone();
                full.push(cont);
                let cont_cnt = self.count_ids(&full)?;
                Ok(ProbResult::new(prompt_cnt, cont_cnt, None))
            })?
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
            .guarded(|| match self.held(&q) {
                true => self.shards.ntd(&q, Some(self.eos)),
                false => Ok(empty_ntd(None)),
            })?
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
            .guarded(|| -> infgram::Result<ProbResult> {
                if self.shards.holds_token(cont) {
                    return self.shards.infgram_prob(prompt, cont);
                }
                let r = self.shards.infgram_ntd(prompt, None)?;
                Ok(ProbResult::new(r.prompt_cnt, 0, r.suffix_len))
            })?
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
            .guarded(|| self.shards.infgram_ntd(q, Some(self.eos)))?
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
        match py.guarded(|| {
            self.search(
                &cnf,
                maxnum,
                self.max_diff_tokens,
                self.max_clause_freq,
                mdl,
            )
        })? {
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
        match py.guarded(|| self.search(&cnf, maxnum, mdt, mcf, mdl))? {
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
        match py.guarded(|| infgram::service::query::creativity(&self.shards, &q, 1, 1))? {
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
        let spans = match py.guarded(|| {
            infgram::service::query::attribute(
                &self.shards,
                &q,
                min_len.max(1) as usize,
                max_cnt as usize,
                0,
            )
        })? {
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
        open: impl FnOnce(u8) -> PyResult<SharedShards>,
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
        Ok(self.shards.count(q)?.count)
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
    ) -> infgram::Result<infgram::service::shards::SearchResult> {
        let held: Vec<Vec<Vec<u32>>> = cnf
            .iter()
            .map(|c| c.iter().filter(|g| self.held(g)).cloned().collect())
            .collect();
        if held.iter().any(|c: &Vec<Vec<u32>>| c.is_empty()) {
            return Ok(infgram::service::shards::SearchResult {
                cnt: 0,
                approx: false,
                documents: Vec::new(),
                ptrs_by_shard: vec![Vec::new(); self.shards.shard_count()],
            });
        }
        self.shards.search_docs(
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
            .map(|d| {
                self.shards
                    .window_at(d.s, d.ptr, before, max_disp_len - before)
            })
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
            Anchor::Pos(s, pos) => self.shards.window_at(s, pos, before, after),
            Anchor::Rank(s, rank) => self.shards.window_at_rank(s, rank, before, after),
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
        self.shards
            .get_doc_by_ix(doc_ix as u64, len)
            .map_err(|e| e.to_string())
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

pub(crate) fn empty_ntd(suffix_len: Option<usize>) -> NtdResult {
    NtdResult {
        prompt_cnt: 0,
        result_by_token_id: Default::default(),
        approx: false,
        suffix_len,
    }
}

pub(crate) fn prob_dict(py: Python<'_>, r: &ProbResult) -> Ans {
    let d = PyDict::new(py);
    d.set_item("prompt_cnt", r.prompt_cnt)?;
    d.set_item("cont_cnt", r.cont_cnt)?;
    d.set_item("prob", r.prob)?;
    if let Some(l) = r.suffix_len {
        d.set_item("suffix_len", l)?;
    }
    Ok(d.into_any().unbind())
}

pub(crate) fn ntd_dict(py: Python<'_>, r: &NtdResult) -> Ans {
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

pub(crate) fn doc_dict(py: Python<'_>, doc: &Document) -> Ans {
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
pub(crate) fn doc_answer(py: Python<'_>, doc: Result<Document, String>) -> Ans {
    match doc {
        Ok(d) => doc_dict(py, &d),
        Err(e) => error_dict(py, e),
    }
}

pub(crate) fn docs_list(py: Python<'_>, docs: Result<Vec<Document>, String>) -> Ans {
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
