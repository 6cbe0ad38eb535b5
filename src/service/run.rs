//! One door for generation: [`generate`] runs a checked request ([`CheckedRequest`]) over the
//! resources bound to it ([`Resources`]) with the options that are not part of the request
//! ([`RunOptions`]) and returns one typed report ([`GenerationReport`]).
//!
//! The CLI (`infgram gen`), the HTTP server (`POST /v1/completions`) and Python
//! (`Index.generate`) each make one call of it. What they would otherwise each write lives
//! here once: the scorer (the ∞-gram of an index or of shards, the model, the mixture), the
//! tokenizer checks (each made once, when a resource is bound), past outputs (drafted from,
//! added to, saved), `--compare`'s plain run, and the rule of a natural end.

use crate::decode::past::SharedPastOutputs;
use crate::decode::{DecodeConfig, DecodeStats};
use crate::error::Result;
use crate::index::counts_cache::CacheStats;
use crate::index::shards::{Shards, SharedShards};
use crate::index::Index;
use crate::lm::LanguageModel;
use crate::mix::check_mixing_index;
use crate::ngram::LevelLog;
use crate::service::generate::{
    generate_from_corpus, generate_with_model, AssemblyOptions, Generation, GuardConfig,
    GuardReport, ModelGenRequest,
};
use crate::service::request::CheckedRequest;
use crate::tokenizer::{check_fingerprint, Tokenizer};
use memmap2::Mmap;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub use crate::decode::past::{PastOutputs, PastStats, DEFAULT_BUDGET as PAST_OUTPUTS_BUDGET};
pub use crate::decode::policy::CostModel;
pub use crate::decode::Cancel;
pub use crate::mix::{load_mixer, Mixer};

/// The mixer file a `--mix` value names: `None` for `default`, the built-in mixer (which
/// [`load_mixer`] loads for `None`).
pub fn mixer_file(spec: &Path) -> Option<&Path> {
    (spec.as_os_str() != "default").then_some(spec)
}

/// Past outputs shared by the generations of a process (drafted from, added to after each),
/// and the file they are kept in across restarts, if any.
#[derive(Clone)]
pub struct PastStore {
    /// The outputs.
    pub outputs: SharedPastOutputs,
    file: Option<PathBuf>,
    fingerprint: String,
    /// Why the last save failed (`None` once one succeeds), shared by every clone: whichever
    /// route saves (a completion, a finished drafting request), `/health` reads one state.
    unsaved: Arc<std::sync::Mutex<Option<String>>>,
}

impl PastStore {
    /// The outputs kept in `file` (a missing file: none yet) for generations in `tok`'s tokens,
    /// the newest `budget` tokens; refused if the file was written with another tokenizer.
    pub fn load(file: &Path, tok: &dyn Tokenizer, budget: usize) -> Result<PastStore> {
        let fingerprint = tok.fingerprint();
        let outputs = PastOutputs::load(file, &fingerprint, tok.vocab_size(), budget)?;
        Ok(PastStore {
            outputs: outputs.into_shared(),
            file: Some(file.to_path_buf()),
            fingerprint,
            unsaved: Arc::default(),
        })
    }

    /// `outputs` (in `tok`'s tokens), saved to `file` after each generation when given.
    pub fn new(outputs: SharedPastOutputs, file: Option<PathBuf>, tok: &dyn Tokenizer) -> Self {
        PastStore {
            outputs,
            file,
            fingerprint: tok.fingerprint(),
            unsaved: Arc::default(),
        }
    }

    /// The fingerprint of the tokenizer the outputs are in.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Writes the outputs to their file (beside it, renamed into place), if they have one,
    /// and records the outcome ([`PastStore::unsaved`]).
    pub(crate) fn save(&self) -> Option<Result<()>> {
        let file = self.file.as_ref()?;
        let saved = {
            let past = self.outputs.read().unwrap_or_else(|e| e.into_inner());
            past.save(file, &self.fingerprint)
        };
        *self.unsaved.lock().unwrap_or_else(|e| e.into_inner()) =
            saved.as_ref().err().map(ToString::to_string);
        Some(saved)
    }

    /// Why the last save to the file failed; `None` when it succeeded, none was tried yet,
    /// or the outputs have no file. The server is degraded meanwhile: what is not saved is
    /// lost at the next restart.
    pub fn unsaved(&self) -> Option<String> {
        self.unsaved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What scores the next token.
enum Scorer<'a> {
    /// The ∞-gram of a corpus: an index, or shards held elsewhere.
    Corpus(SharedShards),
    /// A neural model and its name in reports.
    Model {
        model: &'a mut dyn LanguageModel,
        name: String,
    },
}

/// What a generation runs on, bound once: the scorer, the tokenizer its prompt and output are
/// in, the guard's index and the past outputs. Each binding checks, once, that the resource
/// was built with the generation's tokenizer.
pub struct Resources<'a> {
    tokenizer: &'a dyn Tokenizer,
    scorer: Scorer<'a>,
    /// A model's drafting corpus (drafted from, mixed with, guarded against by default).
    drafting_index: Option<SharedShards>,
    /// A model's mixer (default: the built-in one, when the request mixes).
    mixer: Option<Mixer>,
    guard_index: Option<Arc<Index<Mmap>>>,
    past: Option<PastStore>,
    /// What the model's passes cost on this machine (default: the built-in table).
    costs: Option<crate::decode::policy::CostModel>,
}

impl<'a> Resources<'a> {
    /// Generation from the ∞-gram of `corpus` alone, in the tokens of `tok`: an index (the
    /// tokenizer it was opened with: [`crate::service::open_index`] checks them), or shards
    /// held elsewhere (SBIS, one round trip a position; the guard checks the same shards).
    pub fn corpus(corpus: SharedShards, tok: &'a dyn Tokenizer) -> Self {
        Self::with(Scorer::Corpus(corpus), tok)
    }

    /// Generation with `model` (borrowed: a server loads it once), its tokenizer `tok`;
    /// `name` is what reports call it.
    pub fn model(
        model: &'a mut dyn LanguageModel,
        tok: &'a dyn Tokenizer,
        name: impl Into<String>,
    ) -> Self {
        let scorer = Scorer::Model {
            model,
            name: name.into(),
        };
        Self::with(scorer, tok)
    }

    fn with(scorer: Scorer<'a>, tok: &'a dyn Tokenizer) -> Self {
        Resources {
            tokenizer: tok,
            scorer,
            drafting_index: None,
            mixer: None,
            guard_index: None,
            past: None,
            costs: None,
        }
    }

    /// What the model's passes cost on this machine, which speculative decoding plans its
    /// drafts with (`LoadedModel::pass_costs`; default: the built-in table).
    pub fn pass_costs(mut self, costs: crate::decode::policy::CostModel) -> Self {
        self.costs = Some(costs);
        self
    }

    /// The index a model drafts from, mixes with (with `mixer`; without one, a mixing request
    /// takes the built-in mixer) and guards against by default.
    pub fn drafting_index(mut self, index: Option<ModelIndex>, mixer: Option<Mixer>) -> Self {
        self.drafting_index = index.map(|i| i.0);
        self.mixer = mixer;
        self
    }

    /// The copy guard's own index (default: the generation's index, or the model's drafting
    /// index), checked once against the generation's tokenizer.
    pub fn guard_index(mut self, index: Option<Arc<Index<Mmap>>>) -> Result<Self> {
        let Some(index) = index else {
            return Ok(self);
        };
        match &self.scorer {
            // The index-alone generation compares the two indexes' tokenizers (once); over
            // shards it refuses a guard index of its own.
            Scorer::Corpus(_) => {}
            Scorer::Model { .. }
                if self.drafting_index.as_ref().is_some_and(|own| {
                    std::ptr::addr_eq(Arc::as_ptr(own), Arc::as_ptr(&index))
                }) => {}
            Scorer::Model { .. } => check_fingerprint(&index.header().tokenizer, self.tokenizer)?,
        }
        self.guard_index = Some(index);
        Ok(self)
    }

    /// Past outputs to draft from (with the past-outputs drafter), added to (and saved) after
    /// each generation with a model.
    pub fn past_outputs(mut self, past: Option<PastStore>) -> Self {
        self.past = past;
        self
    }
}

/// A corpus checked, once, against the tokenizer of the model it goes with: what a model
/// drafts from, mixes with and guards against. A front end checks it where it resolves the
/// index (a server before it queues the request), then binds it ([`Resources::drafting_index`]).
#[derive(Clone)]
pub struct ModelIndex(SharedShards);

impl ModelIndex {
    /// `index` if it was built with `tok` (`mixing`: the error says what mixing needs).
    pub fn check(index: Arc<Index<Mmap>>, tok: &dyn Tokenizer, mixing: bool) -> Result<Self> {
        match mixing {
            true => check_mixing_index(&index, tok)?,
            false => check_fingerprint(&index.header().tokenizer, tok)?,
        }
        Ok(ModelIndex(index))
    }

    /// Shards held elsewhere, built with `theirs` (the tokenizer their router was opened with,
    /// checked against their fingerprint there), if it is the model's `tok`.
    pub fn elsewhere(
        shards: SharedShards,
        theirs: &dyn Tokenizer,
        tok: &dyn Tokenizer,
    ) -> Result<Self> {
        check_fingerprint(&theirs.spec(), tok)?;
        Ok(ModelIndex(shards))
    }
}

/// What a run needs that is not part of the request.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Stops the generation early when set (a client gone, a time limit passed).
    pub cancel: Option<Cancel>,
    /// Record each forward pass (in the report's `stats.trace`).
    pub trace: bool,
    /// Verify trees of drafts where the drafters part ways.
    pub trees: bool,
    /// Also decode without drafts and report both speeds and whether the outputs are the same.
    pub compare: bool,
    /// Measure the longest span of the output found in the corpus also without a guard (a pass
    /// over the output).
    pub measure_copying: bool,
}

/// What the copy guard did and the longest span of the output found in its corpus.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Copying {
    /// The longest span of the output that occurs in the corpus (not measured over shards).
    pub max_copied_span: Option<usize>,
    /// The guard's statistics (`None` without a guard).
    pub guard: Option<crate::decode::guard::GuardStats>,
    /// Steps at which the guard masked a token.
    pub guard_blocked: Option<usize>,
    /// Seconds the guard spent.
    pub guard_seconds: Option<f64>,
}

impl From<GuardReport> for Copying {
    fn from(r: GuardReport) -> Self {
        Copying {
            max_copied_span: Some(r.max_copied_span),
            guard: r.guard,
            guard_blocked: r.guard.map(|g| g.blocked),
            guard_seconds: r.guard.map(|g| g.seconds),
        }
    }
}

/// Speculative decoding against plain decoding of the same request (`RunOptions::compare`).
/// Each is `None` (null in JSON) when either generation was stopped before its end (a time
/// limit, a client that left): plain decoding did not run, or not to the same end.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Plain decoding's speed.
    pub plain_tokens_per_second: Option<f64>,
    /// Speculative tokens per second over plain.
    pub speedup: Option<f64>,
    /// Whether both wrote the same tokens.
    pub identical: Option<bool>,
}

/// What a generation produced: one type, which the CLI prints (`--json`), the server maps to
/// an OpenAI completion (its `infgram` field) and Python returns.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GenerationReport {
    /// The generated text (the prompt excluded).
    pub text: String,
    /// Tokens generated.
    pub tokens: usize,
    /// Their ids.
    pub token_ids: Vec<u32>,
    /// The prompt's tokens as fed (a model's first token included).
    pub prompt_tokens: usize,
    /// Seconds the generation took.
    pub seconds: f64,
    /// Tokens per second.
    pub tokens_per_second: f64,
    /// It ended by itself (an end token, the end of a document, or no token left by the
    /// guard), not at `max_tokens` nor cancelled.
    pub natural_end: bool,
    /// Stopped early (a client gone, a time limit).
    pub cancelled: bool,
    /// The copy guard masked every token that could come next.
    pub guard_exhausted: bool,
    /// From an index alone: whether it stopped at a document boundary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at_document_end: Option<bool>,
    /// From an index alone: how the counts cache served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheStats>,
    /// With a model: its name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// With a model: drafts were verified (speculative decoding).
    pub speculative: bool,
    /// With a model: the mixture scored.
    pub mix: bool,
    /// With a model: what the decode loop did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<DecodeStats>,
    /// With a model: the share of drafted tokens accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acceptance_rate: Option<f64>,
    /// With a model: tokens accepted per pass that had a draft.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_accepted: Option<f64>,
    /// With a model: tokens in its cache at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<usize>,
    /// The copy guard's report (with a guard, or when measured).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub copying: Option<Copying>,
    /// Plain decoding of the same request (`RunOptions::compare`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// Why the past outputs could not be saved (the output is returned all the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub past_outputs_not_saved: Option<String>,
    /// From an index alone: per-step statistics of the ∞-gram's levels.
    #[serde(skip)]
    pub steps: LevelLog,
}

/// The report of a generation from the ∞-gram alone (the text and speed filled in after).
fn infgram_report(
    g: Generation,
    copying: Option<Copying>,
    req: &CheckedRequest,
    prompt_tokens: usize,
) -> GenerationReport {
    GenerationReport {
        natural_end: !g.decode.cancelled && (g.tokens.len() < req.max_tokens || g.decode.exhausted),
        cancelled: g.decode.cancelled,
        guard_exhausted: g.decode.exhausted,
        stopped_at_document_end: Some(g.hit_end),
        cache: Some(g.cache),
        copying,
        steps: g.steps,
        stats: Some(g.decode),
        prompt_tokens,
        token_ids: g.tokens,
        ..Default::default()
    }
}

/// Runs `req` over `res` as `opts` says, calling `on_token` after each token (for streaming).
pub fn generate(
    req: &CheckedRequest,
    res: &mut Resources<'_>,
    opts: &RunOptions,
    mut on_token: impl FnMut(u32),
) -> Result<GenerationReport> {
    let tok = res.tokenizer;
    let prompt = req.prompt_ids(tok)?;
    let guard = |index: Option<Arc<Index<Mmap>>>| {
        req.guard.map(|g| GuardConfig {
            max_span: g.max_span,
            index,
            ignore_prompt: g.ignore_prompt,
        })
    };
    let cfg = crate::service::GenConfig {
        estimator: req.estimator.clone(),
        context: req.context,
        max_tokens: req.max_tokens,
        guard: guard(res.guard_index.clone()),
        cancel: opts.cancel.clone(),
    };
    let started = Instant::now();
    let mut report = match &mut res.scorer {
        Scorer::Corpus(corpus) => {
            let mut sampler = req.sampler();
            let g =
                generate_from_corpus(corpus.clone(), &prompt, &cfg, &mut sampler, &mut on_token)?;
            // The longest copied span, on the guard's index or the generation's corpus.
            let copying = match opts.measure_copying || g.guard.is_some() {
                true => {
                    let on: &dyn Shards = match &res.guard_index {
                        Some(index) => &**index,
                        None => &**corpus,
                    };
                    Some(GuardReport::measure(g.guard, on, &g.tokens)?)
                }
                false => None,
            };
            infgram_report(g, copying.map(Copying::from), req, prompt.len())
        }
        Scorer::Model { model, name } => {
            let index = &res.drafting_index;
            let mut model_req = ModelGenRequest {
                prompt,
                assembly: AssemblyOptions {
                    drafters: req.drafters.clone(),
                    corpus_rule: req.corpus_rule,
                    drafting_index: index.clone(),
                    repetition_penalty: req.repetition_penalty,
                    guard: guard(res.guard_index.clone()),
                    past_outputs: res.past.as_ref().map(|p| p.outputs.clone()),
                    vocabulary: Some(res.tokenizer.vocab_size())
                        .filter(|&ids| ids < model.vocab_size()),
                },
                mix: req.mix.then(|| res.mixer.clone().unwrap_or_default()),
                decode: DecodeConfig {
                    max_tokens: req.max_tokens,
                    draft_max: req.draft_max,
                    cost: res.costs.clone().unwrap_or_default(),
                    cancel: opts.cancel.clone(),
                    trace: opts.trace,
                    trees: opts.trees,
                    ..Default::default()
                },
            };
            if model_req.mix.is_some() && index.is_none() {
                return Err(crate::mix::mixing_needs_an_index());
            }
            let g =
                generate_with_model(&mut **model, &model_req, &mut req.sampler(), &mut on_token)?;
            let past_outputs_not_saved = res
                .past
                .as_ref()
                .and_then(PastStore::save)
                .and_then(|saved| saved.err())
                .map(|e| e.to_string());
            let comparison = match opts.compare {
                true if g.stats.cancelled => Some(Comparison {
                    plain_tokens_per_second: None,
                    speedup: None,
                    identical: None,
                }),
                true => {
                    model_req.assembly.drafters.clear();
                    model_req.assembly.past_outputs = None;
                    model_req.decode.trace = false;
                    let plain =
                        generate_with_model(&mut **model, &model_req, &mut req.sampler(), |_| {})?;
                    let tps = g.stats.tokens_per_second();
                    let plain_tps = plain.stats.tokens_per_second();
                    let ran = !plain.stats.cancelled;
                    Some(Comparison {
                        plain_tokens_per_second: ran.then_some(plain_tps),
                        speedup: ran.then_some(tps / plain_tps),
                        identical: ran.then_some(plain.tokens == g.tokens),
                    })
                }
                false => None,
            };
            let s = &g.stats;
            GenerationReport {
                natural_end: !s.cancelled && (g.tokens.len() < req.max_tokens || s.exhausted),
                cancelled: s.cancelled,
                guard_exhausted: s.exhausted,
                model: Some(name.clone()),
                speculative: !req.drafters.is_empty(),
                mix: model_req.mix.is_some(),
                acceptance_rate: Some(s.acceptance_rate()),
                mean_accepted: Some(s.mean_accepted()),
                context_tokens: Some(g.context_tokens),
                copying: g.guard.map(Copying::from),
                comparison,
                past_outputs_not_saved,
                prompt_tokens: model_req.prompt.len(),
                stats: Some(g.stats),
                token_ids: g.tokens,
                ..Default::default()
            }
        }
    };
    report.seconds = match &report.stats {
        Some(stats) => stats.seconds,
        None => started.elapsed().as_secs_f64(),
    };
    report.tokens = report.token_ids.len();
    report.tokens_per_second = report.tokens as f64 / report.seconds.max(1e-12);
    report.text = tok.decode(&report.token_ids)?;
    Ok(report)
}
