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
//!
//! Rooms: `engine` (`InfiniGramEngine`), `index` (`Index`), `drafter` (`Drafter`: drafts for
//! another engine's speculative loop), `model` (`Model`: a neural model's generation and its
//! `step` for a speculative loop; feature `neural`), `ngram_model` (`NgramModel`),
//! `build` (building indexes), `remote` (the shards a Python callable answers, for an
//! `Index` over shards held elsewhere), `rows` (`InfgramRows`); this file holds the conversions
//! they share and the module's registration. Each room names what it takes from another (no
//! glob imports between rooms; pyo3's prelude aside). The library is reached through `infgram::service` (generation,
//! queries, the infini-gram API) without the HTTP server's crates.

mod build;
mod drafter;
mod engine;
mod index;
#[cfg(feature = "neural")]
mod model;
mod ngram_model;
mod remote;
mod rows;

use crate::engine::InfiniGramEngine;
use crate::index::Index;
use crate::ngram_model::NgramModel;

use infgram::service::Tokenizer;
use memmap2::Mmap;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

type Idx = infgram::service::Index<Mmap>;
type Ans = PyResult<Py<PyAny>>;

/// `{"error": message}`, infini-gram's way of refusing a query.
fn error_dict(py: Python<'_>, msg: impl std::fmt::Display) -> Ans {
    let d = PyDict::new(py);
    d.set_item("error", msg.to_string())?;
    Ok(d.into_any().unbind())
}

/// Token ids of `text` with `tok` (a bad text is a `ValueError`).
fn tokenize_with(tok: &dyn Tokenizer, text: &str) -> PyResult<Vec<u32>> {
    tok.encode(text)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Text of `ids` with `tok` (an id past its vocabulary is a `ValueError`).
fn detokenize_with(tok: &dyn Tokenizer, ids: &[u32]) -> PyResult<String> {
    tok.decode(ids)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Work run with the GIL released, as `Python::detach` runs it, that never lets a panic or a
/// Python exception other than an `Exception` be lost on the way back: a panic inside becomes a
/// `RuntimeError` (PyO3's own `PanicException` is not an `Exception`, so `except Exception`
/// would not see it), and a `KeyboardInterrupt` or `SystemExit` raised by a callable the work
/// called (the `ask` of shards held elsewhere) is raised again as itself.
pub(crate) trait Guarded {
    /// `f`'s value, or the error that stopped it.
    fn guarded<T: Send, F: FnOnce() -> T + Send>(self, f: F) -> PyResult<T>;
}

impl Guarded for Python<'_> {
    fn guarded<T: Send, F: FnOnce() -> T + Send>(self, f: F) -> PyResult<T> {
        let done = self.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        if let Some(e) = remote::take_held_exception() {
            return Err(e);
        }
        done.map_err(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            PyRuntimeError::new_err(format!(
                "infgram failed inside ({what}); this is a bug: please report it with the call \
                 that caused it"
            ))
        })
    }
}

/// The library's names of the options its errors suggest, as Python's keyword arguments.
pub(crate) const PARAMETER_NAMES: &[(&str, &str)] = &[
    ("floor", "floor="),
    ("discount_fallback", "discount_fallback="),
];

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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<InfiniGramEngine>()?;
    m.add_class::<Index>()?;
    m.add_function(wrap_pyfunction!(index::remote_index, m)?)?;
    m.add_class::<NgramModel>()?;
    #[cfg(feature = "neural")]
    m.add_class::<model::Model>()?;
    m.add_class::<drafter::Drafter>()?;
    m.add_class::<drafter::Draft>()?;
    m.add_class::<rows::InfgramRows>()?;
    m.add_function(wrap_pyfunction!(rows::default_mixer, m)?)?;
    m.add_function(wrap_pyfunction!(build::build_index, m)?)?;
    m.add_function(wrap_pyfunction!(build::build_index_from_ids, m)?)?;
    m.add_function(wrap_pyfunction!(build::plan_slices, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
