//! Shards held elsewhere: a [`Shards`] whose questions go to a Python callable. The Ray router
//! of `infgram.ray` passes one that sends each question to the actor holding the shard; the
//! library's own merges (the two rounds of the ∞-gram queries, documents numbered across
//! shards, routed document fetches) then run over it unchanged, so a sharded index on a
//! cluster answers what one index of the same documents answers.
//!
//! The wire is the library's serde form of [`ShardQuery`] and [`ShardAnswer`], as JSON
//! strings: `ask([(shard, query_json), ...]) -> [answer_json, ...]`, in order. An exception of
//! the callable (a shard that stays down past the router's retries) fails the query with an
//! `Unavailable` error carrying its message: never a partial answer.

use infgram::service::shards::{ShardAnswer, ShardInfo, ShardQuery, Shards};
use infgram::service::TokenizerSpec;
use infgram::{Error, Result};
use pyo3::prelude::*;

/// Shards answered by a Python callable (see the module docs).
pub struct RemoteShards {
    infos: Vec<ShardInfo>,
    separator: u32,
    vocab_size: usize,
    tokenizer: Option<TokenizerSpec>,
    ask: Py<PyAny>,
}

impl RemoteShards {
    /// Shards of `(tokens, documents)` each (separators counted in tokens), with the index's
    /// separator id and vocabulary size, asked through `ask`.
    pub fn new(ask: Py<PyAny>, infos: &[(u64, u64)], separator: u32, vocab_size: usize) -> Self {
        RemoteShards {
            infos: infos
                .iter()
                .map(|&(tokens, documents)| ShardInfo { tokens, documents })
                .collect(),
            separator,
            vocab_size,
            tokenizer: None,
            ask,
        }
    }

    /// The shards, saying the tokenizer they were built with (its fingerprint checked against
    /// theirs): the fixed-order models read its kind, and a guard index is checked against it.
    pub fn with_tokenizer(self, tokenizer: TokenizerSpec) -> Self {
        RemoteShards {
            tokenizer: Some(tokenizer),
            ..self
        }
    }
}

impl Shards for RemoteShards {
    fn shard_count(&self) -> usize {
        self.infos.len()
    }

    fn infos(&self) -> Vec<ShardInfo> {
        self.infos.clone()
    }

    fn separator(&self) -> u32 {
        self.separator
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn tokenizer(&self) -> Option<TokenizerSpec> {
        self.tokenizer.clone()
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>> {
        let n = asks.len();
        let requests: Vec<(usize, String)> = asks
            .iter()
            .map(|(s, q)| (*s, serde_json::to_string(q).expect("queries serialize")))
            .collect();
        let replies: Vec<String> = Python::attach(|py| {
            self.ask
                .call1(py, (requests,))
                .and_then(|r| r.extract(py))
                .map_err(|e| {
                    let shown = e.value(py).to_string();
                    if !e.is_instance_of::<pyo3::exceptions::PyException>(py) {
                        hold_exception(e);
                    }
                    Error::Unavailable(shown)
                })
        })?;
        if replies.len() != n {
            return Err(Error::Unavailable(format!(
                "the shards' router answered {} of {n} questions",
                replies.len()
            )));
        }
        replies
            .iter()
            .map(|r| {
                serde_json::from_str(r).map_err(|e| {
                    Error::Unavailable(format!(
                        "a shard's answer is not one this infgram reads (another version?): {e}"
                    ))
                })
            })
            .collect()
    }
}

/// An exception that is not an `Exception` (`KeyboardInterrupt`, `SystemExit`) raised by an
/// `ask`, to raise again as itself when the call that asked returns ([`crate::Guarded`]): the
/// library carries it as an error meanwhile. One slot for the process, not per thread: a
/// reader may ask from a worker thread (perplexity's rows are scored on several), and such an
/// exception stops the program, whichever call it comes out of.
static HELD: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);

fn hold_exception(e: PyErr) {
    *HELD.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
}

/// The exception an `ask` raised that must be raised again as itself, if any.
pub(crate) fn take_held_exception() -> Option<PyErr> {
    HELD.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// A shard's side of the wire: the answers of `index`'s own shards to `requests`
/// (`(shard, query_json)`, shards numbered within `index`), as JSON strings.
pub fn answer_json(
    shards: &(dyn Shards + Send + Sync),
    requests: &[(usize, String)],
) -> Result<Vec<String>> {
    let asks = requests
        .iter()
        .map(|(s, q)| {
            serde_json::from_str(q)
                .map(|q: ShardQuery| (*s, q))
                .map_err(|e| Error::input(format!("not a shard query of this infgram: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(shards
        .ask(asks)?
        .iter()
        .map(|a| serde_json::to_string(a).expect("answers serialize"))
        .collect())
}
