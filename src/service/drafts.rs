//! Drafts for other engines: infgram's drafters (prompt lookup, past outputs, the corpus
//! index) for a speculative loop that runs its model elsewhere (vLLM, SGLang, a Hugging Face
//! loop). [`Drafts`] holds the drafting sources and one [`DraftSession`] per request; Python's
//! `infgram.Drafter` and `POST /v1/drafts` both call it. A session's drafts are the decode
//! loop's: the same drafters, assembled by [`crate::service::generate::drafters`] in the same
//! order, planned by the same policy.

use crate::decode::drafters::ShardsDrafter;
use crate::decode::past::remember;
use crate::decode::session::DraftSession;
use crate::decode::Drafter;
use crate::error::{Error, Result};
use crate::index::partial::{Shards, SharedShards};
use crate::index::Index;
use crate::service::generate::{drafters, AssemblyOptions};
pub use crate::service::request::CorpusRule;
use crate::service::request::DrafterSpec;
use crate::service::run::PastStore;
use memmap2::Mmap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use crate::decode::session::SessionDraft;

/// Sessions kept at most: starting one more ends the least recently used.
pub const MAX_SESSIONS: usize = 4096;

/// The longest draft asked for.
pub const MAX_DRAFT_TOKENS: usize = 256;

/// What drafts, and the open sessions.
pub struct Drafts {
    corpus: Option<Corpus>,
    past: Option<PastStore>,
    prompt_lookup: bool,
    corpus_rule: CorpusRule,
    sessions: Mutex<Sessions>,
}

/// The corpus the corpus drafter reads.
pub enum Corpus {
    /// An index here.
    Index(Arc<Index<Mmap>>),
    /// Shards held elsewhere (a cluster's, through [`Shards`]): the same drafts as over an
    /// index of the same documents, each draft token a round trip to every shard
    /// ([`ShardsDrafter`]).
    Shards(SharedShards),
}

/// Open sessions by request id, with when each was last used.
#[derive(Default)]
struct Sessions {
    map: HashMap<String, (u64, Arc<Mutex<DraftSession>>)>,
    clock: u64,
}

impl Drafts {
    /// Drafting from `index` (the corpus; built with the engine's tokenizer), `past` (past
    /// outputs, added to when a request finishes) and the request's own context
    /// (`prompt_lookup`), in the decode loop's order; the corpus drafter by `corpus_rule`.
    pub fn new(
        index: Option<Arc<Index<Mmap>>>,
        past: Option<PastStore>,
        prompt_lookup: bool,
        corpus_rule: CorpusRule,
    ) -> Result<Self> {
        Self::with_corpus(index.map(Corpus::Index), past, prompt_lookup, corpus_rule)
    }

    /// [`Drafts::new`] with the corpus here or in shards held elsewhere.
    pub fn with_corpus(
        corpus: Option<Corpus>,
        past: Option<PastStore>,
        prompt_lookup: bool,
        corpus_rule: CorpusRule,
    ) -> Result<Self> {
        if corpus.is_none() && past.is_none() && !prompt_lookup {
            return Err(Error::input(
                "a drafter needs a source: an index, past outputs, or prompt lookup",
            ));
        }
        Ok(Drafts {
            corpus,
            past,
            prompt_lookup,
            corpus_rule,
            sessions: Mutex::default(),
        })
    }

    /// The drafters of a new session: those of the decode loop's speculative decoding (the
    /// corpus drafter over shards last, where [`DrafterSpec::Corpus`] puts the local one).
    fn drafters(&self) -> Result<Vec<Box<dyn Drafter>>> {
        let mut specs = Vec::new();
        if self.prompt_lookup {
            specs.push(DrafterSpec::PromptLookup);
        }
        specs.extend([DrafterSpec::PastOutputs, DrafterSpec::Corpus]);
        let mut list = drafters(&AssemblyOptions {
            drafters: specs,
            corpus_rule: self.corpus_rule,
            drafting_index: match &self.corpus {
                Some(Corpus::Index(index)) => Some(index.clone()),
                _ => None,
            },
            repetition_penalty: 1.0,
            guard: None,
            past_outputs: self.past.as_ref().map(|p| p.outputs.clone()),
        })?;
        if let Some(Corpus::Shards(shards)) = &self.corpus {
            let rule = self.corpus_rule.drafter_rule();
            list.push(Box::new(ShardsDrafter::new(shards.clone(), rule)));
        }
        Ok(list)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = match &self.corpus {
            Some(Corpus::Index(index)) => Some(index.header().tokenizer.vocab_size),
            Some(Corpus::Shards(shards)) => Some(shards.vocab_size()).filter(|&v| v > 0),
            None => None,
        };
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
        self.check_ids(prompt)?;
        let session = DraftSession::start(self.drafters()?, prompt);
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if s.map.len() >= MAX_SESSIONS && !s.map.contains_key(id) {
            let oldest = s
                .map
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                s.map.remove(&k);
            }
        }
        s.clock += 1;
        let now = s.clock;
        s.map
            .insert(id.to_string(), (now, Arc::new(Mutex::new(session))));
        Ok(())
    }

    fn session(&self, id: &str) -> Result<Arc<Mutex<DraftSession>>> {
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        s.clock += 1;
        let now = s.clock;
        match s.map.get_mut(id) {
            Some((used, session)) => {
                *used = now;
                Ok(session.clone())
            }
            None => Err(Error::NotFound(format!(
                "no drafting request {id:?}: start it first (it may have finished, or been \
                 dropped as the least recently used of {MAX_SESSIONS})"
            ))),
        }
    }

    /// Request `id`'s engine kept `new_ids` after its context.
    pub fn extend(&self, id: &str, new_ids: &[u32]) -> Result<()> {
        self.check_ids(new_ids)?;
        let session = self.session(id)?;
        let mut session = session.lock().unwrap_or_else(|e| e.into_inner());
        session.extend(new_ids);
        Ok(())
    }

    /// A draft of at most `max_tokens` tokens for request `id` (a token tree with `tree`).
    pub fn draft(&self, id: &str, max_tokens: usize, tree: bool) -> Result<SessionDraft> {
        check_max(max_tokens)?;
        let session = self.session(id)?;
        let mut session = session.lock().unwrap_or_else(|e| e.into_inner());
        session.draft(max_tokens, tree)
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
        self.check_ids(context)?;
        let extended = match self.session(id) {
            Ok(session) => {
                let mut session = session.lock().unwrap_or_else(|e| e.into_inner());
                let known = session.context().len();
                match context.starts_with(session.context()) {
                    true => {
                        session.extend(&context[known..]);
                        true
                    }
                    false => false,
                }
            }
            Err(_) => false,
        };
        if !extended {
            self.start(id, context)?;
        }
        Ok(())
    }

    /// Ends request `id`: its output goes into the past outputs (saved to their file, if they
    /// have one).
    pub fn finish(&self, id: &str) -> Result<()> {
        let removed = {
            let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            s.map.remove(id)
        };
        let Some((_, session)) = removed else {
            return Err(Error::NotFound(format!("no drafting request {id:?}")));
        };
        let session = session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(past) = &self.past {
            remember(&past.outputs, session.output());
            if let Some(Err(e)) = past.save() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Requests open.
    pub fn open_sessions(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
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
