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

#[allow(unused_imports)]
use super::*;
use infgram::index::partial::{answer_all, ShardAnswer, ShardInfo, ShardQuery, Shards};
use infgram::{Error, Result};
use pyo3::prelude::*;

/// Shards answered by a Python callable (see the module docs).
pub struct RemoteShards {
    infos: Vec<ShardInfo>,
    separator: u32,
    vocab_size: usize,
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
            ask,
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
                .map_err(|e| Error::Unavailable(e.value(py).to_string()))
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

/// A shard's side of the wire: the answers of `index`'s own shards to `requests`
/// (`(shard, query_json)`, shards numbered within `index`), as JSON strings.
pub fn answer_json<S: AsRef<[u8]> + Sync>(
    index: &infgram::Index<S>,
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
    Ok(answer_all(index.shards(), asks)?
        .iter()
        .map(|a| serde_json::to_string(a).expect("answers serialize"))
        .collect())
}

/// infgram's query protocol and the infini-gram HTTP API over shards held elsewhere (the
/// Ray router of `infgram.ray`): `ask` answers `[(shard, query_json), ...]` with
/// `[answer_json, ...]`; the tokenizer is loaded by name here and must have the shards'
/// fingerprint.
#[pyclass(frozen, module = "infgram._native")]
pub struct RemoteIndex {
    pub(crate) shards: Arc<remote::RemoteShards>,
    pub(crate) tok: Arc<dyn Tokenizer>,
    pub(crate) limits: infgram::service::QueryLimits,
    pub(crate) name: String,
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
            limits: infgram::service::QueryLimits::SERVED,
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
        use infgram::service::api;
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
