//! Building indexes from Python: files, token ids, and slices of a corpus for a cluster.
use crate::Ans;
use crate::Guarded;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Builds an index of `inputs` (files or directories of .txt / .jsonl[.gz|.zst]) into `out`
/// with `tokenizer` (`bytes`, `words`, a short model name, or a tokenizer file); with
/// `sentences` (and `words`) each line is a sentence `<s> … </s>`, as classic n-gram models
/// count; a progress bar on a terminal when `progress`; `docs=(first, end)`: only those
/// documents of the inputs, in the order they are read (one slice of `infgram.ray.build`).
/// Returns the build summary. A failed build leaves nothing behind.
#[pyfunction]
#[pyo3(signature = (inputs, out, tokenizer="bytes", mem_gb=None, reverse=true, overwrite=false, progress=true, sentences=false, docs=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_index(
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
        .guarded(|| infgram::service::build_tokenizer(tokenizer, &inputs))?
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut opts = infgram::service::build::BuildOptions {
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
        .guarded(|| infgram::service::build::build_index(&inputs, &out, tok.as_ref(), &opts))?
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
pub(crate) fn plan_slices(
    py: Python<'_>,
    inputs: Vec<PathBuf>,
    n: usize,
) -> PyResult<Vec<(u64, u64, u64)>> {
    let slices = py
        .guarded(|| infgram::service::build::plan_slices(&inputs, n))?
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
pub(crate) fn build_index_from_ids(
    py: Python<'_>,
    docs: Vec<Vec<u32>>,
    out: PathBuf,
    vocab_size: usize,
    metadata: Option<Vec<String>>,
    docs_per_shard: Option<usize>,
    reverse: bool,
    overwrite: bool,
) -> Ans {
    let opts = infgram::service::build::BuildOptions {
        reverse,
        overwrite,
        progress: false,
        ..Default::default()
    };
    let per = docs_per_shard.unwrap_or(docs.len().max(1));
    let meta = metadata.unwrap_or_default();
    let summary = py
        .guarded(|| {
            infgram::service::build::build_from_ids(&docs, &meta, vocab_size, per, &out, &opts)
        })?
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("tokens", summary.tokens)?;
    d.set_item("documents", summary.documents)?;
    d.set_item("shards", summary.shards)?;
    d.set_item("disk_bytes", summary.disk_bytes)?;
    d.set_item("seconds", summary.seconds)?;
    Ok(d.into_any().unbind())
}
