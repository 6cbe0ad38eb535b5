//! The infini-gram HTTP API: a request `{"index": NAME, "query_type": T, "query": TEXT |
//! "query_ids": [...], ...}` read into the service's [`Query`], and its answer given the API's
//! extra fields (`latency`, `token_ids`, `tokens`).
//!
//! As in the infini-gram API, `prob` and `infgram_prob` take the query's last token as the
//! continuation (unless `cont_id` is given); `count` and `search_docs` read a CNF from a query
//! string with ` AND ` / ` OR ` or from nested `query_ids`; `search_docs` returns one document
//! unless `maxnum` says more.

use crate::index::shards::Shards;
use crate::service::query::{execute_within, parse_cnf, Query, QueryLimits, QUERY_TYPES};
use crate::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// A request the API refuses, with the HTTP status to answer and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// 400 (bad request), 404 (unknown index), 408, 413, 429, 500…
    pub status: u16,
    /// What is wrong and what to do.
    pub message: String,
}

impl ApiError {
    /// A 400 with `message`.
    pub fn bad(message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
        }
    }
}

impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> Self {
        use crate::error::Error;
        let status = match &e {
            Error::Input(_)
            | Error::Field { .. }
            | Error::TokenizerMismatch { .. }
            | Error::Tokenizer(_) => 400,
            Error::NotFound(_) => 404,
            Error::Unavailable(_) => 503,
            _ => 500,
        };
        ApiError {
            status,
            message: e.to_string(),
        }
    }
}

/// A request's query, read and checked against the limits.
#[derive(Debug, Clone)]
pub struct ApiQuery {
    /// The index it asks (`None`: the server's only index).
    pub index: Option<String>,
    /// Its query type.
    pub query_type: &'static str,
    /// What the request gave as its query: text, or ids (for `token_ids` in the answer).
    pub input: Input,
    /// Extra numeric parameters, as given.
    params: Map<String, Value>,
}

/// A request's query: text (`query`) or ids (`query_ids`: a list, or a CNF as nested lists).
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// No query (`get_doc_by_*`).
    None,
    /// A string, tokenized with the index's tokenizer.
    Text(String),
    /// A list of ids.
    Ids(Vec<u32>),
    /// A CNF: clauses of n-grams of ids.
    Cnf(Vec<Vec<Vec<u32>>>),
}

/// Reads a request body into an [`ApiQuery`]; the answer names what is wrong.
pub fn read_request(body: &[u8], limits: &QueryLimits) -> Result<ApiQuery, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::bad(
            "the body must be a JSON object: {\"index\": ..., \"query_type\": ..., \"query\": ...}",
        ));
    };
    let index = match obj.remove("index").or_else(|| obj.remove("corpus")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "\"index\" must be a string, got {other}"
            )))
        }
    };
    let query_type = match obj.remove("query_type") {
        Some(Value::String(t)) => {
            QUERY_TYPES
                .iter()
                .find(|&&q| q == t)
                .copied()
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "unknown query_type {t:?}; one of: {}",
                        QUERY_TYPES.join(", ")
                    ))
                })?
        }
        Some(other) => {
            return Err(ApiError::bad(format!(
                "\"query_type\" must be a string, got {other}"
            )))
        }
        None => {
            return Err(ApiError::bad(format!(
                "the request needs a \"query_type\": one of {}",
                QUERY_TYPES.join(", ")
            )))
        }
    };
    let input = read_input(obj.remove("query"), obj.remove("query_ids"), limits)?;
    Ok(ApiQuery {
        index,
        query_type,
        input,
        params: obj,
    })
}

/// The query from `query` (text) or `query_ids` (ids or a CNF), within the limits.
fn read_input(
    query: Option<Value>,
    query_ids: Option<Value>,
    limits: &QueryLimits,
) -> Result<Input, ApiError> {
    match (query, query_ids) {
        (Some(Value::String(text)), None) => {
            limits
                .check_text(&text)
                .map_err(|e| ApiError::from(e.rename_field(FIELD_NAMES)))?;
            Ok(Input::Text(text))
        }
        (Some(other), None) => Err(ApiError::bad(format!(
            "\"query\" must be a string (or give \"query_ids\"), got {}",
            type_name(&other)
        ))),
        (None, Some(ids)) => {
            let input = if ids
                .as_array()
                .and_then(|a| a.first())
                .is_some_and(Value::is_array)
            {
                let cnf: Vec<Vec<Vec<u32>>> = serde_json::from_value(ids).map_err(|e| {
                    ApiError::bad(format!(
                        "\"query_ids\" must be a list of token ids, or a CNF: a list of clauses, \
                         each a list of lists of ids ({e})"
                    ))
                })?;
                Input::Cnf(cnf)
            } else {
                let ids: Vec<u32> = serde_json::from_value(ids).map_err(|e| {
                    ApiError::bad(format!(
                        "\"query_ids\" must be a list of token ids (integers 0..2^32): {e}"
                    ))
                })?;
                Input::Ids(ids)
            };
            check_tokens(&input, limits)?;
            Ok(input)
        }
        (Some(_), Some(_)) => Err(ApiError::bad(
            "give \"query\" (text) or \"query_ids\" (token ids), not both",
        )),
        (None, None) => Ok(Input::None),
    }
}

/// A JSON value's kind, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Refuses queries of more tokens than the limit (before they are copied into a query).
fn check_tokens(input: &Input, limits: &QueryLimits) -> Result<(), ApiError> {
    let n = match input {
        Input::Ids(ids) => ids.len(),
        Input::Cnf(cnf) => cnf.iter().flatten().map(Vec::len).sum(),
        Input::None | Input::Text(_) => 0,
    };
    limits
        .check_tokens(n)
        .map_err(|e| ApiError::from(e.rename_field(FIELD_NAMES)))
}

/// The API's names for the request fields the library's errors name.
pub const FIELD_NAMES: &[(&str, &str)] = &[
    ("text", "the query"),
    ("input_ids", "the query"),
    ("maxnum", "\"maxnum\""),
    ("max_disp_len", "\"max_disp_len\""),
    ("max_diff_tokens", "\"max_diff_tokens\""),
    ("max_clause_freq", "\"max_clause_freq\""),
    ("cont_id", "\"cont_id\""),
];

impl ApiQuery {
    /// The library query this request asks, with the token ids of its query (tokenized with
    /// the index's tokenizer) for the answer. Only the request's shape is read here: its
    /// parameters go to the library as they are, which gives the defaults and checks them.
    pub fn to_query(
        &self,
        tok: &dyn Tokenizer,
        limits: &QueryLimits,
    ) -> Result<(Query, Tokens), ApiError> {
        let tokens = match &self.input {
            Input::None => Tokens::Ids(Vec::new()),
            Input::Ids(ids) => Tokens::Ids(ids.clone()),
            Input::Cnf(cnf) => Tokens::Cnf(cnf.clone()),
            Input::Text(text)
                if self.takes_cnf() && (text.contains(" AND ") || text.contains(" OR ")) =>
            {
                Tokens::Cnf(parse_cnf(text, tok)?)
            }
            Input::Text(text) => Tokens::Ids(tok.encode(text)?),
        };
        check_tokens(&tokens.as_input(), limits)?;
        let mut fields = self.params.clone();
        for field in ["text", "input_ids", "prompt_ids", "cnf", "cont_text"] {
            fields.remove(field);
        }
        fields.insert("query_type".into(), json!(self.query_type));
        match &tokens {
            Tokens::Cnf(cnf) if self.takes_cnf() => {
                fields.insert("cnf".into(), json!(cnf));
            }
            Tokens::Cnf(_) => {
                return Err(ApiError::bad(format!(
                    "{} takes one n-gram, not a CNF (only count and search_docs do)",
                    self.query_type
                )))
            }
            Tokens::Ids(ids) if matches!(self.query_type, "prob" | "infgram_prob") => {
                let (prompt, cont) = self.prompt_and_cont(ids)?;
                fields.insert("prompt_ids".into(), json!(prompt));
                fields.insert("cont_id".into(), json!(cont));
            }
            Tokens::Ids(ids) => {
                fields.insert("input_ids".into(), json!(ids));
            }
        }
        let query = Query::from_value(Value::Object(fields))?;
        Ok((query, tokens))
    }

    /// Whether the query type reads a CNF.
    fn takes_cnf(&self) -> bool {
        matches!(self.query_type, "count" | "search_docs")
    }

    /// `prob`'s prompt and continuation: `cont_id` if given, else the query's last token.
    fn prompt_and_cont(&self, ids: &[u32]) -> Result<(Vec<u32>, u32), ApiError> {
        if let Some(v) = self.params.get("cont_id").filter(|v| !v.is_null()) {
            let cont = v
                .as_u64()
                .and_then(|c| u32::try_from(c).ok())
                .ok_or_else(|| ApiError::bad(format!("\"cont_id\" must be a token id, got {v}")))?;
            return Ok((ids.to_vec(), cont));
        }
        match ids.split_last() {
            Some((&cont, prompt)) => Ok((prompt.to_vec(), cont)),
            None => Err(ApiError::bad(format!(
                "{} needs a query of at least one token: its last token is the continuation",
                self.query_type
            ))),
        }
    }
}

/// The tokens of a query, for the answer's `token_ids` / `tokens`.
#[derive(Debug, Clone, PartialEq)]
pub enum Tokens {
    /// One n-gram.
    Ids(Vec<u32>),
    /// A CNF (`token_idsss` / `tokensss`, as the infini-gram API names them).
    Cnf(Vec<Vec<Vec<u32>>>),
}

impl Tokens {
    fn as_input(&self) -> Input {
        match self {
            Tokens::Ids(ids) => Input::Ids(ids.clone()),
            Tokens::Cnf(cnf) => Input::Cnf(cnf.clone()),
        }
    }
}

/// The text of each token (decoded one by one).
fn token_texts(ids: &[u32], tok: &dyn Tokenizer) -> Vec<String> {
    ids.iter()
        .map(|&t| tok.decode(&[t]).unwrap_or_default())
        .collect()
}

/// Answers a request read by [`read_request`] over `shards` with `tok`: the library's answer
/// with the API's fields added ([`finish_answer`]). What `POST /` runs on its blocking pool,
/// and what a front end over remote shards runs (the Python package's Ray Serve deployment).
pub fn answer(
    shards: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    request: &ApiQuery,
    limits: &QueryLimits,
) -> Result<Value, ApiError> {
    let started = std::time::Instant::now();
    let (query, tokens) = request.to_query(tok, limits)?;
    let mut answer = execute_within(shards, tok, &query, limits)
        .map_err(|e| e.rename_field(FIELD_NAMES))?
        .to_value();
    let latency_ms = started.elapsed().as_secs_f64() * 1e3;
    finish_answer(&mut answer, &tokens, tok, latency_ms);
    Ok(answer)
}

/// Adds the API's fields to an answer: `latency` (ms), and `token_ids` / `tokens` (or
/// `token_idsss` / `tokensss` for a CNF) where the answer has no field of that name (a
/// `creativity` answer's `tokens` is its length).
pub fn finish_answer(answer: &mut Value, tokens: &Tokens, tok: &dyn Tokenizer, latency_ms: f64) {
    let Value::Object(obj) = answer else {
        return;
    };
    obj.insert("latency".into(), json!(latency_ms));
    let (ids_key, texts_key, ids, texts) = match tokens {
        Tokens::Ids(ids) => (
            "token_ids",
            "tokens",
            json!(ids),
            json!(token_texts(ids, tok)),
        ),
        Tokens::Cnf(cnf) => {
            let texts: Vec<Vec<Vec<String>>> = cnf
                .iter()
                .map(|c| c.iter().map(|g| token_texts(g, tok)).collect())
                .collect();
            ("token_idsss", "tokensss", json!(cnf), json!(texts))
        }
    };
    obj.entry(ids_key).or_insert(ids);
    obj.entry(texts_key).or_insert(texts);
}
