//! `POST /v1/drafts`: infgram's drafters for an engine in another process, language or host.
//! The body names a served index and the request's whole context; the answer is a draft, the
//! fields of Python's `infgram.Draft`:
//!
//! ```text
//! {"index": NAME, "context_ids": [...], "max_tokens": 16, "tree": false, "request_id": "r1"}
//! → {"token_ids": [...], "parents": [null, 0, ...], "probs": [...], "sources": ["prompt", ...]}
//! ```
//!
//! With a `request_id`, the server keeps the request's drafting session: each call sends the
//! full context, the session learns what was kept since the last call (how much of its draft
//! was accepted), and `"finish": true` ends it, adding the output to the server's past outputs
//! (shared by every caller, kept across restarts with `--past-outputs`). Without one, each
//! call drafts for its context alone.

use super::api::ApiError;
use super::Limits;
use crate::service::catalog::{Indexes, Served};
use crate::service::drafts::{CorpusRule, Drafts, SessionStore, MAX_SESSIONS};
use crate::service::PastStore;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Draft tokens asked for when the request names no number.
pub const DEFAULT_DRAFT_TOKENS: usize = 16;

/// A drafting request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftRequest {
    /// The served index to draft from (default: the only one).
    #[serde(default)]
    index: Option<String>,
    /// The request's context: its prompt and every token kept so far.
    context_ids: Vec<u32>,
    /// Draft tokens at most (default 16).
    #[serde(default)]
    max_tokens: Option<usize>,
    /// A token tree where the drafters part ways.
    #[serde(default)]
    tree: bool,
    /// The request this context belongs to (its session is kept between calls).
    #[serde(default)]
    request_id: Option<String>,
    /// Ends the request: its output joins the past outputs; no draft is made.
    #[serde(default)]
    finish: bool,
}

/// Each served index's drafting, made on first use, with the server's past outputs where they
/// are in the index's tokens.
pub struct DraftService {
    by_index: Mutex<HashMap<String, Arc<Drafts>>>,
    past: Option<PastStore>,
    corpus_rule: CorpusRule,
    /// Every index's sessions, under one bound.
    store: Arc<SessionStore>,
}

impl DraftService {
    /// Drafting over the server's indexes, with `past` (the model's past outputs) for those
    /// built with their tokenizer; the corpus drafter by `corpus_rule`; the sessions of all
    /// indexes within `session_bytes`.
    pub fn new(past: Option<PastStore>, corpus_rule: CorpusRule, session_bytes: usize) -> Self {
        DraftService {
            by_index: Mutex::default(),
            past,
            corpus_rule,
            store: Arc::new(SessionStore::new(MAX_SESSIONS, session_bytes)),
        }
    }

    /// Where the sessions are kept (for `/metrics`).
    pub fn store(&self) -> &SessionStore {
        &self.store
    }

    fn drafts_for(&self, served: &Served) -> Result<Arc<Drafts>, ApiError> {
        let mut map = self.by_index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = map.get(&served.name) {
            return Ok(d.clone());
        }
        let fingerprint = served.tokenizer.fingerprint();
        let past = self.past.clone().filter(|p| p.fingerprint() == fingerprint);
        let drafts = Arc::new(Drafts::with_store(
            Some(served.index.clone()),
            past,
            true,
            self.corpus_rule,
            self.store.clone(),
        )?);
        map.insert(served.name.clone(), drafts.clone());
        Ok(drafts)
    }

    /// Answers one request.
    pub fn answer(
        &self,
        indexes: &Indexes,
        body: &[u8],
        limits: &Limits,
    ) -> Result<Value, ApiError> {
        let req: DraftRequest = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad(format!("not a drafting request: {e}")))?;
        if req.context_ids.len() > limits.prompt_tokens {
            return Err(ApiError::bad(format!(
                "\"context_ids\" holds {} tokens; this server takes at most {}",
                req.context_ids.len(),
                limits.prompt_tokens
            )));
        }
        let served = indexes.get(req.index.as_deref())?;
        let drafts = self.drafts_for(&served)?;
        let max = req.max_tokens.unwrap_or(DEFAULT_DRAFT_TOKENS);
        let rename = |e: crate::error::Error| ApiError::from(e.rename_field(FIELD_NAMES));
        let draft = match (&req.request_id, req.finish) {
            (None, true) => {
                return Err(ApiError::bad(
                    "\"finish\" ends a request: give its \"request_id\"",
                ))
            }
            (None, false) => drafts
                .draft_once(&req.context_ids, max, req.tree)
                .map_err(rename)?,
            (Some(id), true) => {
                drafts
                    .sync_and_finish(id, &req.context_ids)
                    .map_err(rename)?;
                Default::default()
            }
            (Some(id), false) => drafts
                .sync_and_draft(id, &req.context_ids, max, req.tree)
                .map_err(rename)?,
        };
        Ok(serde_json::to_value(draft).expect("a draft serializes"))
    }
}

/// The route's names of the fields the library's errors name.
const FIELD_NAMES: &[(&str, &str)] = &[
    ("context_ids", "\"context_ids\""),
    ("max_tokens", "\"max_tokens\""),
];
