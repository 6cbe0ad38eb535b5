//! `POST /v1/completions`: generation in the OpenAI shape (`prompt`, `max_tokens`,
//! `temperature`, `top_p`, `seed`, `stop`, `stream` as server-sent events), with infgram's own
//! options (`mode`: sbis | neural | speculative | mix; `guard`; `index`; `top_k`; `k`). The
//! chat route ([`super::chat`]) is a completion whose prompt is a conversation.
//!
//! Generation runs on one worker thread that owns the neural model (loaded once, at start) and
//! takes jobs from a bounded queue: a full queue answers 429, and queries, which run on other
//! threads, never wait for a generation. A job whose client has gone is skipped; a client that
//! disconnects mid-stream, or a generation past the time limit, stops the decode loop through
//! its [`Cancel`] flag.

use super::api::ApiError;
use super::metrics::TokenMeter;
use super::openai::Completion;
use super::{Limits, Served};
use crate::service::models::{BatchStats, Batcher, ModelOptions};
use crate::service::request::{
    self, CheckedRequest, EstimatorSpec, GenLimits, GenerateRequest, GuardSpec, Sampling, Scorer,
};
use crate::service::run::{generate, GenerationReport, ModelIndex};
use crate::service::run::{Cancel, PastOutputs, PastStats};
use crate::service::{PastStore, Resources, RunOptions};
use crate::service::{Tokenizer, Utf8Stream};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// How a completion is generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// From the index alone (SBIS).
    Sbis,
    /// The neural model, plain decoding.
    Neural,
    /// The neural model, speculative decoding (prompt lookup and the index draft).
    Speculative,
    /// The mixture of the neural model and the ∞-gram of the index.
    Mix,
}

impl Mode {
    /// The mode's name in requests and reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sbis => "sbis",
            Mode::Neural => "neural",
            Mode::Speculative => "speculative",
            Mode::Mix => "mix",
        }
    }
}

/// What the worker sends back while it generates.
#[derive(Debug)]
pub enum Event {
    /// More text (complete UTF-8).
    Text(String),
    /// The end: the summary, or why it failed.
    Done(Result<Summary, ApiError>),
}

/// The end of a completion.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Of them, those a kept cache held (not read again).
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// `length` (max_tokens reached, or the time limit) or `stop` (an end token, a
    /// document's end, or the guard left nothing).
    pub finish_reason: &'static str,
    /// infgram's statistics.
    pub infgram: Value,
}

/// A generation job's resources, resolved and checked: the index to generate from, or the
/// model's drafting index (its tokenizer checked here, once) and the past outputs.
enum Plan {
    Sbis {
        served: Arc<Served>,
    },
    Model {
        index: Option<ModelIndex>,
        past: Option<PastStore>,
        /// Start from a kept prompt, and keep this one (`cache_prompt`).
        kept: bool,
    },
}

/// The server's names of the generation request's fields.
const FIELD_NAMES: &[(&str, &str)] = &[
    ("prompt", "\"prompt\""),
    ("sampling.temperature", "\"temperature\""),
    ("sampling.top_p", "\"top_p\""),
    ("sampling.top_k", "\"top_k\""),
    ("limits.max_tokens", "\"max_tokens\""),
    ("guard.max_span", "\"guard\""),
    ("scorer.estimator.k", "\"k\""),
    ("drafters", "\"speculative\""),
];

struct Job {
    plan: Plan,
    /// The KV cache bytes it may hold ([`CacheBudget`]).
    cache: usize,
    /// Texts that end the completion.
    stop: Vec<String>,
    /// The request, its prompt already tokenized (within the server's limits).
    req: CheckedRequest,
    mode: Mode,
    /// Also decode without drafts (`compare`).
    compare: bool,
    deadline: Instant,
    cancel: Cancel,
    events: UnboundedSender<Event>,
    /// Where its tokens are counted.
    meter: Arc<TokenMeter>,
}

/// The generation worker: its queue and what it serves.
pub struct Generator {
    queue: SyncSender<Job>,
    waiting: Arc<AtomicUsize>,
    /// Jobs running now.
    running_jobs: Arc<AtomicUsize>,
    /// Generations run at once at most (`--parallel`, where the model batches).
    parallel: usize,
    /// The passes of the batched model (none run without one).
    batch: Arc<BatchStats>,
    /// The tokens the generations wrote and read.
    meter: Arc<TokenMeter>,
    /// The KV cache the running generations may hold.
    cache: Arc<CacheBudget>,
    /// Cleared when the worker thread ends, however it ends.
    running: Arc<AtomicBool>,
    backlog: usize,
    /// The model's tokenizer (with a model).
    model_tokenizer: Option<Arc<dyn Tokenizer>>,
    /// The model's name and file (with a model).
    pub model_name: Option<String>,
    /// The outputs of the model's generations, drafted from in speculative mode, and their
    /// file (none when the server keeps no past outputs).
    past: Option<PastStore>,
}

impl Generator {
    /// Starts the worker, loading `model` (if any) on it: an error to load it is returned here.
    /// `past_output_tokens`: the past outputs' budget (0: none kept); `past_file`: where they
    /// are kept across restarts (read here, written after every completion; a file written
    /// with another tokenizer is refused and left as it is).
    pub fn start(
        model: Option<&str>,
        opts: &ModelOptions,
        limits: &Limits,
        past_file: Option<&std::path::Path>,
    ) -> crate::error::Result<Self> {
        let (backlog, past_output_tokens) = (limits.backlog, limits.past_output_tokens);
        let slots = Slots {
            asked: limits.parallel,
            request_tokens: limits.prompt_tokens + limits.max_tokens,
            kept_bytes: limits.prompt_cache_bytes,
        };
        let (queue, jobs) = sync_channel::<Job>(backlog);
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let running_jobs = Arc::new(AtomicUsize::new(0));
        let batch = Arc::new(BatchStats::default());
        let cache = Arc::new(CacheBudget::new(limits.kv_cache_bytes));
        let shared = Queue {
            jobs: std::sync::Mutex::new(jobs),
            waiting: waiting.clone(),
            running: running_jobs.clone(),
            cache: cache.clone(),
        };
        let spec = model.map(str::to_string);
        let opts = opts.clone();
        let running = Arc::new(AtomicBool::new(true));
        let flags = (running.clone(), batch.clone());
        std::thread::Builder::new()
            .name("infgram-generate".into())
            .spawn(move || {
                let _running = Running(flags.0.clone());
                worker(spec, opts, slots, shared, flags, ready_tx)
            })
            .map_err(|e| {
                crate::error::Error::input(format!("cannot start the generation thread: {e}"))
            })?;
        let loaded = ready.recv().map_err(|_| {
            crate::error::Error::input("the generation thread ended while loading")
        })??;
        let (loaded, parallel) = loaded;
        let (model_tokenizer, model_name) = match loaded {
            Some((tok, name)) => (Some(tok), Some(name)),
            None => (None, None),
        };
        let past = match (&model_tokenizer, past_output_tokens, past_file) {
            (Some(_), 0, _) | (None, _, _) => None,
            (Some(tok), budget, Some(file)) => Some(PastStore::load(file, tok.as_ref(), budget)?),
            (Some(tok), budget, None) => Some(PastStore::new(
                PastOutputs::shared(budget),
                None,
                tok.as_ref(),
            )),
        };
        Ok(Generator {
            queue,
            waiting,
            running_jobs,
            parallel,
            batch,
            meter: Arc::default(),
            cache,
            running,
            backlog,
            past,
            model_tokenizer,
            model_name,
        })
    }

    /// Why the past outputs could not be saved the last time they were (after a completion
    /// or a finished drafting request; `None` when they were, or are not kept in a file):
    /// `/health` reports the server degraded meanwhile.
    pub fn past_outputs_unsaved(&self) -> Option<String> {
        self.past.as_ref()?.unsaved()
    }

    /// The past outputs and their file (`None` when none are kept).
    pub fn past_store(&self) -> Option<PastStore> {
        self.past.clone()
    }

    /// What the past outputs hold (`None` when none are kept).
    pub fn past_output_stats(&self) -> Option<PastStats> {
        self.past
            .as_ref()
            .map(|p| p.outputs.read().unwrap_or_else(|e| e.into_inner()).stats())
    }

    /// Jobs waiting for a worker.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Jobs running now.
    pub fn running_jobs(&self) -> usize {
        self.running_jobs.load(Relaxed)
    }

    /// Generations run at once at most.
    pub fn parallel(&self) -> usize {
        self.parallel
    }

    /// How the batched model's passes went: passes, and the sequences they took.
    pub fn batch_stats(&self) -> &BatchStats {
        &self.batch
    }

    /// The tokens the generations wrote and read.
    pub fn tokens(&self) -> &TokenMeter {
        &self.meter
    }

    /// The KV cache the running generations may hold, and hold now.
    pub fn cache_budget(&self) -> &CacheBudget {
        &self.cache
    }

    /// Whether the worker thread still runs (`/health` reports it).
    pub fn is_running(&self) -> bool {
        self.running.load(Relaxed)
    }

    /// Checks `req`, queues it, and returns the channel its text and end come on (429 when
    /// the queue is full).
    pub fn submit(
        &self,
        req: Completion,
        indexes: &super::Indexes,
        limits: &Limits,
    ) -> Result<(tokio::sync::mpsc::UnboundedReceiver<Event>, Mode), ApiError> {
        let mode = req
            .options
            .mode
            .unwrap_or(if self.model_tokenizer.is_some() {
                Mode::Neural
            } else {
                Mode::Sbis
            });
        check_openai_options(&req)?;
        let stop = stop_sequences(req.options.stop.as_ref())?;
        let (plan, checked) = self.plan(&req, mode, indexes, limits)?;
        let cache = self.cache.admit(cache_tokens(&checked))?;
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let job = Job {
            plan,
            cache,
            stop,
            req: checked,
            mode,
            compare: req.options.compare,
            deadline: Instant::now() + limits.generation_time,
            cancel: Cancel::default(),
            events,
            meter: self.meter.clone(),
        };
        self.waiting.fetch_add(1, Relaxed);
        match self.queue.try_send(job) {
            Ok(()) => Ok((rx, mode)),
            Err(e) => {
                self.waiting.fetch_sub(1, Relaxed);
                Err(match e {
                    TrySendError::Full(_) => ApiError {
                        status: 429,
                        message: format!(
                            "the generation queue is full ({} waiting, {} running); retry later",
                            self.backlog,
                            self.running_jobs()
                        ),
                    },
                    TrySendError::Disconnected(_) => ApiError {
                        status: 503,
                        message: "the generation worker has stopped".into(),
                    },
                })
            }
        }
    }

    /// The library's request for `req` in `mode`, checked (within the server's token limit),
    /// its errors in the server's field names.
    fn request(req: &Completion, mode: Mode, limits: &Limits) -> Result<CheckedRequest, ApiError> {
        let scorer = match mode {
            Mode::Sbis => Scorer::Infgram {
                estimator: EstimatorSpec::Sbis {
                    k: req.k,
                    decay: None,
                },
            },
            Mode::Neural | Mode::Speculative => Scorer::Model,
            Mode::Mix => Scorer::Mixture,
        };
        if mode == Mode::Speculative && req.options.speculative == Some(false) {
            return Err(ApiError::bad(
                "mode \"speculative\" is speculative decoding, and \"speculative\": false \
                 asks for none: leave \"speculative\" out, or ask for mode \"neural\"",
            ));
        }
        if mode == Mode::Sbis && req.options.compare {
            return Err(ApiError::bad(
                "\"compare\" compares speculative with plain decoding of a model; mode \
                 \"sbis\" has neither: leave it out, or ask for mode \"speculative\"",
            ));
        }
        let drafters = match mode == Mode::Speculative || req.options.speculative == Some(true) {
            true => request::defaults::SPECULATIVE_DRAFTERS.to_vec(),
            false => Vec::new(),
        };
        let request = GenerateRequest {
            prompt: req.prompt.clone(),
            scorer,
            drafters,
            corpus_rule: req.options.corpus_rule,
            guard: req.options.guard.map(|max_span| GuardSpec {
                max_span,
                ignore_prompt: false,
            }),
            sampling: Sampling {
                temperature: req.options.temperature,
                top_p: req.options.top_p,
                top_k: req.options.top_k,
                seed: req.options.seed,
                repetition_penalty: None,
            },
            limits: GenLimits {
                max_tokens: req.options.max_tokens,
                context: None,
                draft_max: None,
            },
        };
        request
            .check(limits.max_tokens)
            .map_err(|e| ApiError::from(e.rename_field(FIELD_NAMES)))
    }

    /// The job `req` asks for, its resources resolved and checked, and the checked request
    /// with its prompt tokenized (within the server's limits).
    fn plan(
        &self,
        req: &Completion,
        mode: Mode,
        indexes: &super::Indexes,
        limits: &Limits,
    ) -> Result<(Plan, CheckedRequest), ApiError> {
        let mut checked = Self::request(req, mode, limits)?;
        if mode == Mode::Sbis {
            let served = indexes.get(req.options.index.as_deref())?;
            let prompt = prompt_ids(&checked, served.tokenizer.as_ref(), limits)?;
            checked.prompt = request::Prompt::Ids(prompt);
            return Ok((Plan::Sbis { served }, checked));
        }
        let Some(model_tok) = &self.model_tokenizer else {
            return Err(ApiError::bad(format!(
                "mode {:?} needs a model: start the server with --model (this one serves the \
                 index alone: mode \"sbis\")",
                mode.name()
            )));
        };
        // The index to draft, mix and guard with: the named one, else the first built with
        // the model's tokenizer.
        let index = match &req.options.index {
            Some(name) => Some(indexes.get(Some(name))?),
            None => indexes.with_tokenizer(model_tok.as_ref()),
        };
        if index.is_none() && (mode == Mode::Mix || checked.guard.is_some()) {
            return Err(ApiError::bad(
                "mixing and the copy guard need an index built with the model's tokenizer: \
                 serve one (`infgram index --tokenizer MODEL`) and name it in \"index\"",
            ));
        }
        let index = match index {
            Some(served) => {
                let mixing = mode == Mode::Mix;
                let checked = ModelIndex::check(served.index.clone(), model_tok.as_ref(), mixing);
                Some(checked.map_err(|_| {
                    ApiError::bad(format!(
                        "index {:?} was not built with the model's tokenizer; build one with \
                         `infgram index --tokenizer MODEL` and serve it",
                        served.name
                    ))
                })?)
            }
            None => None,
        };
        let prompt = prompt_ids(&checked, model_tok.as_ref(), limits)?;
        checked.prompt = request::Prompt::Ids(prompt);
        let (past, kept) = (self.past.clone(), req.options.cache_prompt != Some(false));
        Ok((Plan::Model { index, past, kept }, checked))
    }
}

/// Refuses OpenAI options this server does not implement (rather than ignoring them).
fn check_openai_options(req: &Completion) -> Result<(), ApiError> {
    if req.options.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad(
            "\"n\": this server returns one completion per request",
        ));
    }
    Ok(())
}

/// The stop sequences `stop` names: none (`null`), a string, or a list of at most 4; none
/// empty.
fn stop_sequences(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::bad("\"stop\" is a string or a list of at most 4 strings, none empty");
    let stops: Vec<String> = match stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    match stops.iter().any(String::is_empty) {
        true => Err(bad()),
        false => Ok(stops),
    }
}

/// A completion's text cut at the first of its stop sequences: text is passed on as soon as
/// no stop sequence can begin in it.
#[derive(Default)]
struct StopAt {
    stops: Vec<String>,
    /// The text so far (all of it: a stop sequence may span many tokens).
    text: String,
    /// Bytes of `text` passed on.
    sent: usize,
    /// Whether a stop sequence was found.
    hit: bool,
}

impl StopAt {
    fn new(stops: Vec<String>) -> Self {
        StopAt {
            stops,
            ..Default::default()
        }
    }

    /// `more` text: what may be passed on now.
    fn push(&mut self, more: &str) -> String {
        if self.hit {
            return String::new();
        }
        self.text.push_str(more);
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        // A stop sequence ending in the new text starts at most `longest` bytes before it.
        let from = self.sent.saturating_sub(longest);
        let from = (from..=self.sent)
            .find(|&i| self.text.is_char_boundary(i))
            .unwrap_or(self.sent);
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        let upto = match found {
            Some(at) => {
                self.hit = true;
                at.max(self.sent)
            }
            // Held back: the longest tail that could begin a stop sequence.
            None => {
                let mut safe = self.text.len().saturating_sub(longest.saturating_sub(1));
                while !self.text.is_char_boundary(safe) {
                    safe -= 1;
                }
                safe.max(self.sent)
            }
        };
        let out = self.text[self.sent..upto].to_string();
        self.sent = upto;
        out
    }

    /// The text held back, at the end (none after a stop sequence).
    fn finish(&mut self) -> String {
        if self.hit {
            return String::new();
        }
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }
}

/// The prompt's tokens (the library tokenizes and checks them), within the server's limits.
fn prompt_ids(
    req: &CheckedRequest,
    tok: &dyn Tokenizer,
    limits: &Limits,
) -> Result<Vec<u32>, ApiError> {
    // A conversation's messages together are held to a prompt's bound (their count to the
    // library's, checked with their roles before the template renders).
    let chars = match &req.prompt {
        request::Prompt::Text(t) => t.chars().count(),
        request::Prompt::Chat { messages, .. } => {
            messages.iter().map(|m| m.content.chars().count()).sum()
        }
        request::Prompt::Ids(_) => 0,
    };
    if chars > limits.prompt_chars {
        let what = match req.prompt {
            request::Prompt::Chat { .. } => "the messages are",
            _ => "the prompt is",
        };
        return Err(ApiError::bad(format!(
            "{what} {chars} characters; this server takes at most {}",
            limits.prompt_chars
        )));
    }
    let ids = req
        .prompt_ids(tok)
        .map_err(|e| ApiError::from(e.rename_field(FIELD_NAMES)))?;
    if ids.len() > limits.prompt_tokens {
        return Err(ApiError::bad(format!(
            "the prompt is {} tokens; this server takes at most {}",
            ids.len(),
            limits.prompt_tokens
        )));
    }
    Ok(ids)
}

/// A loaded model's tokenizer and name, for the handlers.
type ModelInfo = (Arc<dyn Tokenizer>, String);

/// The KV cache the running generations may hold together (`--kv-cache-mib`): a job holds
/// what its sequence may grow to while it runs, and waits while the others' leave too little;
/// a job that could never fit is refused when it is submitted, never by running out.
pub struct CacheBudget {
    /// Bytes in all.
    bytes: usize,
    /// Bytes a token's keys and values take (0: the model holds one sequence, or none).
    per_token: AtomicUsize,
    /// Positions' worth of bytes a sequence's cache may hold beyond the room it was given
    /// (its rounding, as the batcher reports it).
    slack: AtomicUsize,
    held: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

impl CacheBudget {
    fn new(bytes: usize) -> Self {
        CacheBudget {
            bytes,
            per_token: AtomicUsize::new(0),
            slack: AtomicUsize::new(0),
            held: std::sync::Mutex::new(0),
            freed: std::sync::Condvar::new(),
        }
    }

    /// What a sequence given room for `tokens` positions holds at most: the room, set aside
    /// when the job starts (the batcher's `sequence_for`), and its rounding.
    fn need(&self, tokens: usize) -> usize {
        (tokens + self.slack.load(Relaxed)) * self.per_token.load(Relaxed)
    }

    /// Refuses a job whose cache could never fit; else what it may hold.
    fn admit(&self, tokens: usize) -> Result<usize, ApiError> {
        let need = self.need(tokens);
        if need > self.bytes {
            return Err(ApiError {
                status: 413,
                message: format!(
                    "this request's prompt and max_tokens ({tokens} tokens) may need {} MiB of \
                     KV cache; this server holds {} MiB for all its generations \
                     (--kv-cache-mib): ask for fewer tokens",
                    need.div_ceil(1 << 20),
                    self.bytes >> 20
                ),
            });
        }
        Ok(need)
    }

    /// Holds `need` bytes until the returned guard drops, waiting while they do not fit.
    fn hold(&self, need: usize) -> HeldCache<'_> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        while *held + need > self.bytes && *held > 0 {
            held = self.freed.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        *held += need;
        HeldCache { budget: self, need }
    }

    /// Bytes held now by the running generations.
    pub fn held(&self) -> usize {
        *self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The cache positions a job may fill: its prompt, `max_tokens`, and the draft rows of its
/// last pass beyond them (what it is admitted with, and the room its sequence is given).
fn cache_tokens(req: &CheckedRequest) -> usize {
    let prompt = match &req.prompt {
        request::Prompt::Ids(ids) => ids.len(),
        _ => 0,
    };
    prompt + req.max_tokens + req.draft_max + 1
}

/// A running job's share of the [`CacheBudget`], given back when dropped.
struct HeldCache<'a> {
    budget: &'a CacheBudget,
    need: usize,
}

impl Drop for HeldCache<'_> {
    fn drop(&mut self) {
        let mut held = self.budget.held.lock().unwrap_or_else(|e| e.into_inner());
        *held -= self.need;
        self.budget.freed.notify_all();
    }
}

/// Clears its flag when dropped: the worker thread holds one, so the flag says whether the
/// thread still runs, even after a panic outside a job.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Relaxed);
    }
}

/// The model as a worker holds it: the model itself (one worker), or a sequence of the
/// batcher's for each job (several workers, their passes shared).
#[cfg(feature = "neural")]
enum ServedModel {
    Own(Box<crate::service::models::LoadedModel>),
    Shared {
        batcher: Batcher,
        tokenizer: Arc<dyn Tokenizer>,
        costs: crate::service::run::CostModel,
    },
}

/// What a worker holds: the model, if any, and its name.
struct Worker {
    #[cfg(feature = "neural")]
    model: Option<ServedModel>,
    /// The model's name in reports.
    #[cfg_attr(not(feature = "neural"), allow(dead_code))]
    name: String,
}

/// What the workers share: the queue, its count, and the jobs running now.
struct Queue<J = Job> {
    jobs: std::sync::Mutex<std::sync::mpsc::Receiver<J>>,
    waiting: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    cache: Arc<CacheBudget>,
}

/// How many generations run at once: `asked` (`--parallel`; 0: [`Slots::chosen`]), and the
/// longest request, prompt and `max_tokens` (what the KV budget must hold for each); and the
/// bytes of the caches of ended generations kept for the next (`--prompt-cache-mib`).
#[derive(Clone, Copy)]
struct Slots {
    asked: usize,
    request_tokens: usize,
    kept_bytes: usize,
}

/// Generations at once without a model, where `--parallel` is not given: SBIS generations
/// side by side, as many as before the default was chosen per model.
const UNBATCHED_PARALLEL: usize = 4;

impl Slots {
    /// The generations a batched model runs at once where none were asked for: the rows its
    /// passes still pay for (`CostModel::rows_worth_batching`; 8 on a 2-vCPU Zen 4 with
    /// Qwen2.5-Coder 0.5B), and no more than the KV budget holds at the longest request
    /// each (so that every one admitted can run at once).
    #[cfg(feature = "neural")]
    fn chosen(&self, costs: &crate::service::run::CostModel, cache: &CacheBudget) -> usize {
        if self.asked > 0 {
            return self.asked;
        }
        let each = cache.need(self.request_tokens).max(1);
        costs.rows_worth_batching().min(cache.bytes / each).max(1)
    }
}

/// The generation thread: loads the model, reports it and the generations run at once,
/// starts the other workers (that many when the model batches or there is none), then runs
/// jobs until the queue closes.
fn worker(
    spec: Option<String>,
    opts: ModelOptions,
    slots: Slots,
    queue: Queue,
    flags: (Arc<AtomicBool>, Arc<BatchStats>),
    ready: std::sync::mpsc::Sender<crate::error::Result<(Option<ModelInfo>, usize)>>,
) {
    crate::service::catalog::lower_priority();
    let (running, stats) = flags;
    let workers = load(spec.as_deref(), &opts)
        .and_then(|(w, info)| Ok((share(w, slots, stats, &queue.cache)?, info)));
    let mut workers = match workers {
        Ok((workers, info)) => {
            let _ = ready.send(Ok((info, workers.len())));
            workers
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let Some(mut first) = workers.pop() else {
        return;
    };
    let queue = Arc::new(queue);
    for (i, mut state) in workers.into_iter().enumerate() {
        let (queue, running) = (queue.clone(), Running(running.clone()));
        let spawned = std::thread::Builder::new()
            .name(format!("infgram-generate-{}", i + 1))
            .spawn(move || {
                let _running = running;
                crate::service::catalog::lower_priority();
                run_jobs(&queue, |job| run_job(&mut state, job));
            });
        if let Err(e) = spawned {
            diag!("a generation worker did not start ({e}); serving with fewer");
        }
    }
    run_jobs(&queue, |job| run_job(&mut first, job));
}

/// The workers for `state`: [`Slots::chosen`] of them sharing a batcher when its model holds
/// several sequences, or as many as asked with no model; one when its model holds one
/// sequence (a backend that does not batch is served one request at a time).
fn share(
    state: Worker,
    slots: Slots,
    stats: Arc<BatchStats>,
    cache: &CacheBudget,
) -> crate::error::Result<Vec<Worker>> {
    let mut parallel = match slots.asked {
        0 => UNBATCHED_PARALLEL,
        n => n,
    };
    let name = state.name.clone();
    #[cfg(feature = "neural")]
    let model = match state.model {
        // (Batched at `--parallel 1` too: its one worker's ended generations leave their
        // caches to the next.)
        Some(ServedModel::Own(mut loaded)) => {
            if loaded.model.sequences().is_none() {
                if slots.asked > 1 {
                    diag!("this model's backend runs one sequence at a time: --parallel {parallel} serves one request at a time");
                }
                return Ok(vec![Worker {
                    model: Some(ServedModel::Own(loaded)),
                    name,
                }]);
            }
            let batcher = loaded.batch(stats)?;
            batcher.keep_prompts(slots.kept_bytes)?;
            let (costs, tokenizer) = (loaded.pass_costs(), loaded.tokenizer.clone());
            let tokenizer: Arc<dyn Tokenizer> = Arc::new(tokenizer);
            cache
                .per_token
                .store(batcher.cache_bytes_per_token(), Relaxed);
            cache.slack.store(batcher.cache_slack_tokens(), Relaxed);
            parallel = slots.chosen(&costs, cache);
            Some((batcher, tokenizer, costs))
        }
        Some(shared) => {
            return Ok(vec![Worker {
                model: Some(shared),
                name,
            }])
        }
        None => None,
    };
    #[cfg(not(feature = "neural"))]
    let _ = (state, stats, cache);
    Ok((0..parallel)
        .map(|_| Worker {
            #[cfg(feature = "neural")]
            model: model
                .clone()
                .map(|(batcher, tokenizer, costs)| ServedModel::Shared {
                    batcher,
                    tokenizer,
                    costs,
                }),
            name: name.clone(),
        })
        .collect())
}

/// A job on the queue: where its events go, and the KV cache it may hold.
trait Queued {
    fn events(&self) -> &UnboundedSender<Event>;
    fn cache(&self) -> usize;
}

impl Queued for Job {
    fn events(&self) -> &UnboundedSender<Event> {
        &self.events
    }
    fn cache(&self) -> usize {
        self.cache
    }
}

/// Runs the queue's jobs in turn until it closes, skipping those whose client left while they
/// waited. A panic fails its job (500), never the worker: the next job starts afresh (the
/// decode loop resets the model's cache at its start).
fn run_jobs<J: Queued>(queue: &Queue<J>, mut run: impl FnMut(J) -> Result<Summary, ApiError>) {
    let next = || {
        queue
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv()
            .ok()
    };
    while let Some(job) = next() {
        queue.waiting.fetch_sub(1, Relaxed);
        if job.events().is_closed() {
            continue;
        }
        let events = job.events().clone();
        let cache = queue.cache.hold(job.cache());
        queue.running.fetch_add(1, Relaxed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(job)))
            .unwrap_or_else(|panic| Err(panicked(panic.as_ref())));
        queue.running.fetch_sub(1, Relaxed);
        // Its share of the cache is given back before the answer goes out, so a client that
        // asks /health after its answer sees the job gone from the budget too.
        drop(cache);
        let _ = events.send(Event::Done(result));
    }
}

/// The 500 of a job that panicked, with the panic's message.
fn panicked(panic: &(dyn std::any::Any + Send)) -> ApiError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    diag!("a generation failed with an internal error: {what}");
    ApiError {
        status: 500,
        message: format!(
            "internal error while generating ({what}); the server goes on serving: please \
             report this request"
        ),
    }
}

/// Loads the model (with the `neural` feature).
fn load(
    spec: Option<&str>,
    opts: &ModelOptions,
) -> crate::error::Result<(Worker, Option<ModelInfo>)> {
    match spec {
        None => Ok((
            Worker {
                #[cfg(feature = "neural")]
                model: None,
                name: String::new(),
            },
            None,
        )),
        #[cfg(feature = "neural")]
        Some(spec) => {
            let loaded = crate::service::models::load_model(spec, opts)?;
            let tok: Arc<dyn Tokenizer> = Arc::new(loaded.tokenizer.clone());
            // A name, never the file's path on this machine: clients see it.
            let name = served_model_name(spec);
            Ok((
                Worker {
                    model: Some(ServedModel::Own(Box::new(loaded))),
                    name: name.clone(),
                },
                Some((tok, name)),
            ))
        }
        #[cfg(not(feature = "neural"))]
        Some(_) => {
            let _ = opts;
            Err(crate::error::Error::input(
                "this infgram was built without neural models (feature `neural`); rebuild with \
                 default features to serve --model",
            ))
        }
    }
}

/// The name a model is served under: a short name or `hf:` reference as given, a file or
/// directory by its last component.
#[cfg(feature = "neural")]
fn served_model_name(spec: &str) -> String {
    if spec.starts_with("hf:") || !spec.contains(std::path::MAIN_SEPARATOR) {
        return spec.to_string();
    }
    std::path::Path::new(spec)
        .file_name()
        .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Runs one job, sending its text as it comes: one call of the service's generation.
fn run_job(state: &mut Worker, job: Job) -> Result<Summary, ApiError> {
    let Job {
        plan,
        cache: _,
        stop,
        req,
        mode,
        compare,
        deadline,
        cancel,
        events,
        meter,
    } = job;
    let mut stream = Utf8Stream::default();
    let mut stop = StopAt::new(stop);
    let (mut timed_out, mut client_gone) = (false, false);
    let mut emit = |tok: &dyn Tokenizer, t: u32| {
        meter.generated();
        let text = stop.push(&stream.push(&tok.decode_bytes(&[t]).unwrap_or_default()));
        if !text.is_empty() && events.send(Event::Text(text)).is_err() {
            client_gone = true;
            cancel.cancel();
        }
        if stop.hit {
            cancel.cancel();
        }
        if Instant::now() > deadline {
            timed_out = true;
            cancel.cancel();
        }
    };
    let opts = RunOptions {
        cancel: Some(cancel.clone()),
        compare,
        ..Default::default()
    };
    let report = match plan {
        Plan::Sbis { served } => {
            let tok = served.tokenizer.clone();
            let mut res = Resources::corpus(served.index.clone(), tok.as_ref());
            generate(&req, &mut res, &opts, |t| emit(tok.as_ref(), t))?
        }
        Plan::Model { index, past, kept } => {
            let resources = (index, past, kept);
            model_job(state, &req, resources, &opts, &mut emit)?
        }
    };
    if client_gone {
        diag!(
            "generation stopped after {} tokens: the client left",
            report.tokens
        );
    }
    let rest = stop.push(&stream.finish()) + &stop.finish();
    if !rest.is_empty() {
        let _ = events.send(Event::Text(rest));
    }
    let mut infgram = serde_json::to_value(&report).map_err(|e| ApiError {
        status: 500,
        message: format!("the report did not serialize: {e}"),
    })?;
    // The text is the completion's own; the rest is infgram's report.
    if let Some(fields) = infgram.as_object_mut() {
        fields.remove("text");
    }
    infgram["mode"] = json!(mode.name());
    infgram["time_limit_reached"] = json!(timed_out);
    infgram["stopped_at_stop_sequence"] = json!(stop.hit);
    let cached_tokens = report.stats.as_ref().map_or(0, |s| s.cached_prompt_tokens);
    meter.read(report.prompt_tokens.saturating_sub(cached_tokens));
    Ok(Summary {
        prompt_tokens: report.prompt_tokens,
        cached_tokens,
        completion_tokens: report.tokens,
        finish_reason: if (report.natural_end && !timed_out) || stop.hit {
            "stop"
        } else {
            "length"
        },
        infgram,
    })
}

/// A job of the neural model, over its drafting index and the server's past outputs (saved
/// after it; a failure shows in `/health` until a save succeeds).
#[cfg(feature = "neural")]
fn model_job(
    state: &mut Worker,
    req: &CheckedRequest,
    (index, past, kept): (Option<ModelIndex>, Option<PastStore>, bool),
    opts: &RunOptions,
    emit: &mut dyn FnMut(&dyn Tokenizer, u32),
) -> Result<GenerationReport, ApiError> {
    let mut sequence = None;
    let (model, tok, costs): (
        &mut dyn crate::service::models::LanguageModel,
        &dyn Tokenizer,
        _,
    ) = match state.model.as_mut() {
        None => return Err(ApiError::bad("this server has no model")),
        Some(ServedModel::Own(loaded)) => {
            let costs = loaded.pass_costs();
            (loaded.model.as_mut(), &loaded.tokenizer, costs)
        }
        Some(ServedModel::Shared {
            batcher,
            tokenizer,
            costs,
        }) => {
            // A sequence of the model's for this job, with room for what it was admitted
            // with, freed when it ends.
            let own = batcher.sequence_for(cache_tokens(req))?;
            let sequence = sequence.insert(if kept { own } else { own.unshared() });
            (sequence, &**tokenizer, costs.clone())
        }
    };
    let mut res = Resources::model(model, tok, state.name.clone())
        .drafting_index(index, None)
        .past_outputs(past)
        .pass_costs(costs);
    let report = generate(req, &mut res, opts, |t| emit(tok, t))?;
    // The completion is answered whether or not its output could be kept; the store records
    // the failure for `/health` until a save succeeds.
    if let Some(e) = &report.past_outputs_not_saved {
        diag!("the past outputs were not saved: {e}");
    }
    Ok(report)
}

/// Without the `neural` feature there is no model job.
#[cfg(not(feature = "neural"))]
fn model_job(
    _state: &mut Worker,
    _req: &CheckedRequest,
    _resources: (Option<ModelIndex>, Option<PastStore>, bool),
    _opts: &RunOptions,
    _emit: &mut dyn FnMut(&dyn Tokenizer, u32),
) -> Result<GenerationReport, ApiError> {
    Err(ApiError::bad(
        "this infgram was built without neural models",
    ))
}

/// The OpenAI completion object (`chunk`: one event of a stream, no usage).
pub fn completion_json(
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    finish_reason: Option<&str>,
    summary: Option<&Summary>,
) -> Value {
    let mut v = json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    });
    if let Some(s) = summary {
        v["usage"] = usage(s);
        v["infgram"] = s.infgram.clone();
    }
    v
}

/// OpenAI's `usage` of a completion: its tokens, and those of the prompt a kept cache held.
pub fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// Seconds since the Unix epoch.
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long a generation may run, by default.
pub const DEFAULT_GENERATION_TIME: Duration = Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;

    struct Probe {
        events: UnboundedSender<Event>,
        panics: bool,
    }

    impl Queued for Probe {
        fn events(&self) -> &UnboundedSender<Event> {
            &self.events
        }
        fn cache(&self) -> usize {
            1
        }
    }

    #[test]
    #[cfg(feature = "neural")]
    fn models_are_served_by_name_not_path() {
        assert_eq!(served_model_name("smollm2-135m"), "smollm2-135m");
        assert_eq!(
            served_model_name("hf:owner/repo:f.gguf"),
            "hf:owner/repo:f.gguf"
        );
        assert_eq!(served_model_name("/home/u/models/m.gguf"), "m.gguf");
        assert_eq!(served_model_name("models/dir/"), "dir");
    }

    /// Stop sequences cut the text where the first begins, across tokens; text is passed on
    /// as soon as no stop sequence can begin in it; without one, nothing is held.
    #[test]
    fn stop_sequences_cut_the_text() {
        let run = |stops: &[&str], pieces: &[&str]| {
            let mut s = StopAt::new(stops.iter().map(|s| s.to_string()).collect());
            let mut out: Vec<String> = pieces.iter().map(|p| s.push(p)).collect();
            out.push(s.finish());
            (out, s.hit)
        };
        let (out, hit) = run(&["END"], &["ab", "cE", "N", "Dxyz"]);
        assert_eq!((out.concat(), hit), ("abc".to_string(), true));
        let (out, hit) = run(
            &["\n\n", "```"],
            &["def f():\n", "  return 1", "\n", "\nmore"],
        );
        assert_eq!(
            (out.concat(), hit),
            ("def f():\n  return 1".to_string(), true)
        );
        let (out, hit) = run(&[], &["a", "b"]);
        assert_eq!(out, vec!["a", "b", ""]);
        assert!(!hit);
        let (out, hit) = run(&["zz"], &["é", "z", "é"]);
        assert_eq!((out.concat(), hit), ("ézé".to_string(), false));
        let (out, _) = run(&["STOP"], &["xSTO"]);
        assert_eq!(out[0], "x", "a tail that may begin a stop sequence waits");
        assert!(stop_sequences(Some(&json!(["a", "b", "c", "d", "e"]))).is_err());
        assert!(stop_sequences(Some(&json!([""]))).is_err());
        assert!(stop_sequences(Some(&json!(7))).is_err());
        assert_eq!(stop_sequences(Some(&json!("x"))).unwrap(), vec!["x"]);
        assert!(stop_sequences(Some(&Value::Null)).unwrap().is_empty());
    }

    /// A job that panics answers 500 with the panic's message, and the jobs after it run
    /// (a panic took the worker, and every later completion, down).
    #[test]
    fn a_panicking_job_fails_alone() {
        let (mut receivers, mut jobs) = (Vec::new(), Vec::new());
        for panics in [false, true, false] {
            let (events, rx) = tokio::sync::mpsc::unbounded_channel();
            receivers.push(rx);
            jobs.push(Probe { events, panics });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let queue = Queue {
            waiting: Arc::new(AtomicUsize::new(jobs.len())),
            running: Arc::default(),
            cache: Arc::new(CacheBudget::new(1)),
            jobs: std::sync::Mutex::new(rx),
        };
        jobs.into_iter().for_each(|job| tx.send(job).unwrap());
        drop(tx);
        run_jobs(&queue, |job| {
            assert!(!job.panics, "index out of bounds (a test's panic)");
            Ok(Summary {
                prompt_tokens: 1,
                cached_tokens: 0,
                completion_tokens: 2,
                finish_reason: "length",
                infgram: Value::Null,
            })
        });
        assert_eq!(queue.waiting.load(Relaxed), 0);
        assert_eq!(queue.running.load(Relaxed), 0);
        assert_eq!(queue.cache.held(), 0, "every job gave its cache back");
        let ends: Vec<Result<usize, (u16, String)>> = receivers
            .iter_mut()
            .map(|rx| match rx.try_recv() {
                Ok(Event::Done(r)) => r
                    .map(|s| s.completion_tokens)
                    .map_err(|e| (e.status, e.message)),
                other => panic!("no end: {other:?}"),
            })
            .collect();
        assert_eq!(ends[0], Ok(2));
        assert_eq!(ends[2], Ok(2));
        let (status, message) = ends[1].clone().unwrap_err();
        assert_eq!(status, 500);
        assert!(message.contains("index out of bounds"), "{message}");
    }
}
