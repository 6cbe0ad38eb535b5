//! Drafts for other engines: infgram's drafters (prompt lookup, past outputs, the corpus
//! index) for a speculative loop that runs its model elsewhere (vLLM, SGLang, a Hugging Face
//! loop). [`Drafts`] holds the drafting sources and one [`DraftSession`] per request; Python's
//! `infgram.Drafter` and `POST /v1/drafts` both call it. A session's drafts are the decode
//! loop's: the same drafters, assembled by [`crate::service::generate::drafters`] in the same
//! order, planned by the same policy.

use crate::decode::past::remember;
use crate::decode::session::DraftSession;
use crate::decode::Drafter;
use crate::error::{Error, Result};
use crate::index::shards::SharedShards;
use crate::service::generate::{drafters, AssemblyOptions};
pub use crate::service::request::CorpusRule;
use crate::service::request::DrafterSpec;
use crate::service::run::PastStore;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

pub use crate::decode::session::SessionDraft;

/// Sessions kept at most by default: one more ends the least recently used.
pub const MAX_SESSIONS: usize = 4096;

/// Bytes the sessions of a store may hold by default (their contexts and what their drafters
/// keep of them, about 30 bytes a token): past it the least recently used end.
pub const DEFAULT_SESSION_BYTES: usize = 256 << 20;

/// Bytes of a session's entry in the store beside its state and request id (the map's and
/// the order's slots, the session's allocation).
const ENTRY_BYTES: usize = 128;

/// The longest draft asked for.
pub const MAX_DRAFT_TOKENS: usize = 256;

/// What drafts, and where its open sessions are kept.
pub struct Drafts {
    /// The corpus the corpus drafter reads: an index here or shards held elsewhere (the same
    /// drafts over the same documents).
    corpus: Option<SharedShards>,
    past: Option<PastStore>,
    prompt_lookup: bool,
    corpus_rule: CorpusRule,
    store: Arc<SessionStore>,
    /// This drafting's sessions in the store (a store may hold several's).
    space: u64,
}

/// Open drafting sessions, bounded in count and bytes: past either bound the least recently
/// used end (counted in [`SessionStore::dropped`]). One store may hold the sessions of
/// several [`Drafts`] (a server's indexes) under one bound.
pub struct SessionStore {
    max_sessions: usize,
    max_bytes: usize,
    sessions: Mutex<Sessions>,
    spaces: AtomicU64,
    dropped: AtomicU64,
}

/// A session's key: its drafting's space and its request id.
type Key = (u64, String);

/// The sessions, by key and by last use.
#[derive(Default)]
struct Sessions {
    map: HashMap<Key, Entry>,
    /// Keys by last use, oldest first.
    order: BTreeMap<u64, Key>,
    clock: u64,
    /// Bytes of every session, as last measured.
    bytes: usize,
}

struct Entry {
    used: u64,
    bytes: usize,
    session: Arc<Mutex<DraftSession>>,
}

impl Sessions {
    /// A new tick of the clock, for `key` (which must be in the map).
    fn touch(&mut self, key: &Key) {
        self.clock += 1;
        let now = self.clock;
        let e = self.map.get_mut(key).expect("a session of the map");
        let before = std::mem::replace(&mut e.used, now);
        self.order.remove(&before);
        self.order.insert(now, key.clone());
    }

    /// Opens `session` under `key` (a session open under it ends), used now.
    fn insert(&mut self, key: Key, session: Arc<Mutex<DraftSession>>) {
        self.remove(&key);
        self.clock += 1;
        let used = self.clock;
        self.order.insert(used, key.clone());
        let entry = Entry {
            used,
            bytes: 0,
            session,
        };
        self.map.insert(key, entry);
    }

    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let e = self.map.remove(key)?;
        self.order.remove(&e.used);
        self.bytes -= e.bytes;
        Some(e)
    }
}

impl Default for SessionStore {
    fn default() -> Self {
        SessionStore::new(MAX_SESSIONS, DEFAULT_SESSION_BYTES)
    }
}

impl SessionStore {
    /// A store of at most `max_sessions` sessions holding at most `max_bytes` bytes.
    pub fn new(max_sessions: usize, max_bytes: usize) -> Self {
        SessionStore {
            max_sessions: max_sessions.max(1),
            max_bytes,
            sessions: Mutex::default(),
            spaces: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions open.
    pub fn open(&self) -> usize {
        self.lock().map.len()
    }

    /// Bytes they hold (as last measured, after each call on a session).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Sessions ended because a bound was reached (not finished by their request).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// Measures `key`'s session anew (if it is still the one open under that key) and ends
    /// the least recently used others while a bound is passed. A session over the byte bound
    /// alone is ended too, and refused.
    fn account(&self, key: &Key, session: &Arc<Mutex<DraftSession>>) -> Result<()> {
        // The session's state, and its request id, held twice (the map's key, the order's).
        let state = session.lock().unwrap_or_else(|e| e.into_inner()).bytes();
        let bytes = state + 2 * key.1.len() + ENTRY_BYTES;
        let mut s = self.lock();
        let Some(e) = s
            .map
            .get_mut(key)
            .filter(|e| Arc::ptr_eq(&e.session, session))
        else {
            return Ok(());
        };
        let before = std::mem::replace(&mut e.bytes, bytes);
        s.bytes = s.bytes - before + bytes;
        if bytes > self.max_bytes {
            s.remove(key);
            self.dropped.fetch_add(1, Relaxed);
            return Err(Error::input(format!(
                "drafting request {:?} holds {bytes} bytes of state, more than all sessions may \
                 ({}): send a shorter context, or raise the bound (serve \
                 --draft-session-bytes, Python's Drafter(session_bytes=))",
                key.1, self.max_bytes
            )));
        }
        while s.bytes > self.max_bytes || s.map.len() > self.max_sessions {
            let Some(oldest) = s.order.values().find(|k| *k != key).cloned() else {
                break;
            };
            s.remove(&oldest);
            self.dropped.fetch_add(1, Relaxed);
        }
        Ok(())
    }
}

impl Drafts {
    /// Drafting from `corpus` (an index built with the engine's tokenizer, or shards of one
    /// held elsewhere), `past` (past outputs, added to when a request finishes) and the
    /// request's own context (`prompt_lookup`), in the decode loop's order; the corpus drafter
    /// by `corpus_rule`.
    pub fn new(
        corpus: Option<SharedShards>,
        past: Option<PastStore>,
        prompt_lookup: bool,
        corpus_rule: CorpusRule,
    ) -> Result<Self> {
        let store = Arc::new(SessionStore::default());
        Self::with_store(corpus, past, prompt_lookup, corpus_rule, store)
    }

    /// [`Drafts::new`] keeping its sessions in `store` (shared, under one bound).
    pub fn with_store(
        corpus: Option<SharedShards>,
        past: Option<PastStore>,
        prompt_lookup: bool,
        corpus_rule: CorpusRule,
        store: Arc<SessionStore>,
    ) -> Result<Self> {
        if corpus.is_none() && past.is_none() && !prompt_lookup {
            return Err(Error::input(
                "a drafter needs a source: an index, past outputs, or prompt lookup",
            ));
        }
        let space = store.spaces.fetch_add(1, Relaxed);
        Ok(Drafts {
            corpus,
            past,
            prompt_lookup,
            corpus_rule,
            store,
            space,
        })
    }

    /// Where the sessions are kept.
    pub fn store(&self) -> &Arc<SessionStore> {
        &self.store
    }

    fn key(&self, id: &str) -> Key {
        (self.space, id.to_string())
    }

    /// The drafters of a new session: those of the decode loop's speculative decoding.
    fn drafters(&self) -> Result<Vec<Box<dyn Drafter>>> {
        let specs: Vec<DrafterSpec> = crate::service::request::defaults::SPECULATIVE_DRAFTERS
            .into_iter()
            .filter(|&d| self.prompt_lookup || d != DrafterSpec::PromptLookup)
            .collect();
        drafters(&AssemblyOptions {
            drafters: specs,
            corpus_rule: self.corpus_rule,
            drafting_index: self.corpus.clone(),
            repetition_penalty: 1.0,
            guard: None,
            past_outputs: self.past.as_ref().map(|p| p.outputs.clone()),
            vocabulary: None,
        })
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self
            .corpus
            .as_ref()
            .map(|corpus| corpus.vocab_size())
            .filter(|&v| v > 0);
        if let Some(vocab) = vocab {
            if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::Field {
                    field: "context_ids",
                    message: format!(
                        "token id {t} is not in the index's vocabulary (below {vocab})"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Starts request `id` after `prompt` (a request of that id already open starts over).
    pub fn start(&self, id: &str, prompt: &[u32]) -> Result<()> {
        self.started(id, prompt).map(drop)
    }

    /// [`Drafts::start`], giving the session started.
    fn started(&self, id: &str, prompt: &[u32]) -> Result<(Key, Arc<Mutex<DraftSession>>)> {
        self.check_ids(prompt)?;
        let session = Arc::new(Mutex::new(DraftSession::start(self.drafters()?, prompt)));
        let key = self.key(id);
        self.store.lock().insert(key.clone(), session.clone());
        // The prompt is indexed now, so that the session is measured with it.
        session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe_prompt();
        self.store.account(&key, &session)?;
        Ok((key, session))
    }

    /// Request `id`'s session, marked as used now.
    fn session(&self, id: &str) -> Result<(Key, Arc<Mutex<DraftSession>>)> {
        let key = self.key(id);
        let mut s = self.store.lock();
        let Some(e) = s.map.get(&key) else {
            return Err(Error::NotFound(format!(
                "no drafting request {id:?}: start it first (it may have finished, or been \
                 dropped as the least recently used past the sessions' bounds: {} sessions, \
                 {} bytes)",
                self.store.max_sessions, self.store.max_bytes
            )));
        };
        let session = e.session.clone();
        s.touch(&key);
        Ok((key, session))
    }

    /// Request `id`'s engine kept `new_ids` after its context.
    pub fn extend(&self, id: &str, new_ids: &[u32]) -> Result<()> {
        self.check_ids(new_ids)?;
        let (key, session) = self.session(id)?;
        session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(new_ids);
        self.store.account(&key, &session)
    }

    /// A draft of at most `max_tokens` tokens for request `id` (a token tree with `tree`).
    pub fn draft(&self, id: &str, max_tokens: usize, tree: bool) -> Result<SessionDraft> {
        check_max(max_tokens)?;
        let (key, session) = self.session(id)?;
        self.draft_in(&key, &session, max_tokens, tree)
    }

    /// A draft from `session`, held by the caller: another request that ends it in the store
    /// meanwhile (the least recently used, past a bound) does not take it from this one.
    fn draft_in(
        &self,
        key: &Key,
        session: &Arc<Mutex<DraftSession>>,
        max_tokens: usize,
        tree: bool,
    ) -> Result<SessionDraft> {
        let draft = session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .draft(max_tokens, tree)?;
        self.store.account(key, session)?;
        Ok(draft)
    }

    /// A draft for `context` alone, without a session (what a first call of a request
    /// drafts).
    pub fn draft_once(
        &self,
        context: &[u32],
        max_tokens: usize,
        tree: bool,
    ) -> Result<SessionDraft> {
        check_max(max_tokens)?;
        self.check_ids(context)?;
        DraftSession::start(self.drafters()?, context).draft(max_tokens, tree)
    }

    /// Request `id` continues with the full `context`: the session is extended by what follows
    /// its own context, or started afresh when `context` does not continue it. What a
    /// stateless caller (`POST /v1/drafts` with a `request_id`) sends each time.
    pub fn sync(&self, id: &str, context: &[u32]) -> Result<()> {
        self.synced(id, context).map(drop)
    }

    /// [`Drafts::sync`], then a draft of at most `max_tokens` tokens from the session synced
    /// (held from one to the other, so that a request that sends its context is answered from
    /// it even when other requests end its session in the store meanwhile).
    pub fn sync_and_draft(
        &self,
        id: &str,
        context: &[u32],
        max_tokens: usize,
        tree: bool,
    ) -> Result<SessionDraft> {
        check_max(max_tokens)?;
        let (key, session) = self.synced(id, context)?;
        self.draft_in(&key, &session, max_tokens, tree)
    }

    /// [`Drafts::sync`], then [`Drafts::finish`] of the session synced (held from one to the
    /// other, as [`Drafts::sync_and_draft`] holds it).
    pub fn sync_and_finish(&self, id: &str, context: &[u32]) -> Result<()> {
        let (key, session) = self.synced(id, context)?;
        let mut s = self.store.lock();
        if s.map
            .get(&key)
            .is_some_and(|e| Arc::ptr_eq(&e.session, &session))
        {
            s.remove(&key);
        }
        drop(s);
        self.finish_session(&session)
    }

    /// [`Drafts::sync`], giving the session synced.
    fn synced(&self, id: &str, context: &[u32]) -> Result<(Key, Arc<Mutex<DraftSession>>)> {
        self.check_ids(context)?;
        if let Ok((key, session)) = self.session(id) {
            let extended = {
                let mut s = session.lock().unwrap_or_else(|e| e.into_inner());
                let known = s.context().len();
                let extends = context.starts_with(s.context());
                if extends {
                    s.extend(&context[known..]);
                }
                extends
            };
            if extended {
                self.store.account(&key, &session)?;
                return Ok((key, session));
            }
        }
        self.started(id, context)
    }

    /// Ends request `id`: its output goes into the past outputs (saved to their file, if they
    /// have one). A save that fails is the server's fault, not the request's
    /// ([`Error::Unavailable`]; the output stays in memory, and the store records the failure
    /// for `/health` until a save succeeds).
    pub fn finish(&self, id: &str) -> Result<()> {
        let removed = self.store.lock().remove(&self.key(id));
        let Some(Entry { session, .. }) = removed else {
            return Err(Error::NotFound(format!("no drafting request {id:?}")));
        };
        self.finish_session(&session)
    }

    /// A session's output into the past outputs ([`Drafts::finish`]).
    fn finish_session(&self, session: &Arc<Mutex<DraftSession>>) -> Result<()> {
        let session = session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(past) = &self.past {
            remember(&past.outputs, session.output());
            if let Some(Err(e)) = past.save() {
                return Err(Error::Unavailable(format!(
                    "the request finished and its output is kept in memory, but the past \
                     outputs could not be saved to their file: {e}"
                )));
            }
        }
        Ok(())
    }

    /// Requests open (in the store: those of every drafting that shares it).
    pub fn open_sessions(&self) -> usize {
        self.store.open()
    }
}

fn check_max(max_tokens: usize) -> Result<()> {
    if max_tokens > MAX_DRAFT_TOKENS {
        return Err(Error::Field {
            field: "max_tokens",
            message: format!("must be between 0 and {MAX_DRAFT_TOKENS}, got {max_tokens}"),
        });
    }
    Ok(())
}
