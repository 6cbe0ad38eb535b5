//! Assembling generations: from the index alone (the decode loop with the ∞-gram as its
//! model), and the drafters and processors of a neural generation from options; the copy
//! guard ([`CopyGuard`]) for either.

use crate::decode::drafters::{Braid, CorpusDrafter, PromptLookup};
use crate::decode::guard::{CopyGuard, GuardStats};
use crate::decode::past::{remember, PastOutputDrafter, SharedPastOutputs};
use crate::decode::{
    decode, Cancel, DecodeConfig, DecodeStats, Drafter, Processor, RepetitionPenalty, Sampler,
    VocabularyLimit,
};
use crate::error::{Error, Result};
use crate::eval::attribution::max_copied_span;
use crate::index::counts_cache::CacheStats;
use crate::index::shards::{Shards, SharedShards};
use crate::index::Index;
use crate::lm::LanguageModel;
use crate::mix::mixture_model;
use crate::mix::Mixer;
use crate::ngram::{Estimator, InfgramModel, LevelLog};
use crate::service::request::{CheckedRequest, CorpusRule, DrafterSpec};
use memmap2::Mmap;
use std::cell::Cell;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// Settings of a generation from the index alone.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// The estimator.
    pub estimator: Estimator,
    /// Tokens of context (the last `context` tokens of prompt + output).
    pub context: usize,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// The copy guard, if any.
    pub guard: Option<GuardConfig>,
    /// Stops generation early when set (a client gone, a time limit passed).
    pub cancel: Option<Cancel>,
}

/// A copy guard as the decode loop takes it, with handles on its statistics and on why a
/// search failed (shards held elsewhere that did not answer).
struct BuiltGuard {
    processor: Box<dyn Processor>,
    stats: Rc<Cell<GuardStats>>,
    failure: Rc<RefCell<Option<String>>>,
}

impl BuiltGuard {
    /// Refuses an output the guard could not check (`Error::Unavailable`).
    fn checked(failure: &Rc<RefCell<Option<String>>>) -> Result<()> {
        match failure.borrow().clone() {
            Some(why) => Err(Error::Unavailable(format!(
                "the copy guard could not check the output (a shard did not answer): {why}"
            ))),
            None => Ok(()),
        }
    }
}

/// Settings of the copy guard ([`CopyGuard`]).
#[derive(Clone, Debug)]
pub struct GuardConfig {
    /// The longest span of the corpus the output may repeat, in tokens (`--guard L`).
    pub max_span: usize,
    /// The index of the corpus to guard against, opened (default: the generation's own index,
    /// or the drafting index of a neural generation).
    pub index: Option<Arc<Index<Mmap>>>,
    /// Count only generated tokens (default: the prompt's tail counts too).
    pub ignore_prompt: bool,
}

impl GuardConfig {
    /// The guard with `max_span` against the default index, the prompt counting.
    pub fn new(max_span: usize) -> Self {
        GuardConfig {
            max_span,
            index: None,
            ignore_prompt: false,
        }
    }

    /// Refuses a guard that would allow no span at all.
    fn check(&self) -> Result<()> {
        if self.max_span == 0 {
            return Err(Error::input(
                "--guard 0 would forbid every token of the corpus: give the longest span the \
                 output may repeat, at least 1 (e.g. --guard 16)",
            ));
        }
        Ok(())
    }

    /// The guard over `corpus`, with its handles.
    fn build(&self, corpus: SharedShards) -> BuiltGuard {
        let guard = CopyGuard::new(corpus, self.max_span).ignore_prompt(self.ignore_prompt);
        BuiltGuard {
            stats: guard.stats(),
            failure: guard.failure(),
            processor: Box::new(guard),
        }
    }
}

/// What the copy guard of a generation did, and the longest corpus span of the output.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct GuardReport {
    /// The guard's statistics (`None` without a guard).
    pub guard: Option<GuardStats>,
    /// The longest span of the output that occurs in the corpus.
    pub max_copied_span: usize,
}

impl GuardReport {
    /// The report of a generation's `output`, its longest copied span measured on `corpus`
    /// (the guard's, or the generation's own).
    pub fn measure(
        guard: Option<GuardStats>,
        corpus: &dyn Shards,
        output: &[u32],
    ) -> Result<GuardReport> {
        Ok(GuardReport {
            guard,
            max_copied_span: max_copied_span(corpus, output)?,
        })
    }
}

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated token ids (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Whether it stopped at a document boundary.
    pub hit_end: bool,
    /// Per-step statistics.
    pub steps: LevelLog,
    /// How the counts cache served.
    pub cache: CacheStats,
    /// What the decode loop did.
    pub decode: DecodeStats,
    /// What the copy guard did (`None` without a guard). The longest copied span is not
    /// measured here (a pass over the output): [`GuardReport::measure`].
    pub guard: Option<GuardStats>,
}

/// Generates from the ∞-gram of `corpus` alone (an index, or shards held elsewhere: SBIS, one
/// round trip a position), calling `on_token` after each token (for streaming): the decode loop
/// ([`crate::decode::decode`]) with the ∞-gram as its model and no drafters. The prompt starts
/// a document (the separator goes first); generation stops at the next document boundary. The
/// copy guard checks the same corpus, or an index of its own with the same tokenizer; a guard
/// search that failed fails the generation (`Error::Unavailable`): its output was not checked.
pub fn generate_from_corpus(
    corpus: SharedShards,
    prompt: &[u32],
    cfg: &GenConfig,
    sampler: &mut Sampler,
    on_token: impl FnMut(u32),
) -> Result<Generation> {
    let mut guard = None;
    if let Some(g) = &cfg.guard {
        g.check()?;
        guard = Some(match &g.index {
            None => g.build(corpus.clone()),
            Some(other) => {
                same_tokenizer(&*corpus, other)?;
                g.build(other.clone())
            }
        });
    }
    let failure = guard.as_ref().map(|g| g.failure.clone());
    let separator = corpus.separator();
    let model = InfgramModel::new(corpus, cfg.estimator.clone(), cfg.context)?;
    let generation = run_generation(model, guard, separator, prompt, cfg, sampler, on_token)?;
    if let Some(failure) = &failure {
        BuiltGuard::checked(failure)?;
    }
    Ok(generation)
}

/// The decode loop of a generation from the ∞-gram `model` alone, after `prompt` (which starts
/// a document: the separator goes first), with the copy guard when given.
fn run_generation(
    mut model: InfgramModel,
    guard: Option<BuiltGuard>,
    separator: u32,
    prompt: &[u32],
    cfg: &GenConfig,
    sampler: &mut Sampler,
    on_token: impl FnMut(u32),
) -> Result<Generation> {
    let (mut processors, guard_stats) = match guard {
        Some(g) => (vec![g.processor], Some(g.stats)),
        None => (Vec::new(), None),
    };
    let mut fed = Vec::with_capacity(prompt.len() + 1);
    fed.push(separator);
    fed.extend_from_slice(prompt);
    let decode_cfg = DecodeConfig {
        max_tokens: cfg.max_tokens,
        cancel: cfg.cancel.clone(),
        ..Default::default()
    };
    let (tokens, stats) = decode(
        &mut model,
        &mut [],
        &mut processors,
        sampler,
        &fed,
        &decode_cfg,
        on_token,
    )?;
    Ok(Generation {
        hit_end: tokens.len() < cfg.max_tokens && !stats.exhausted && !stats.cancelled,
        tokens,
        cache: model.cache_stats(),
        steps: std::mem::take(&mut model.steps),
        decode: stats,
        guard: guard_stats.map(|stats| stats.get()),
    })
}

/// Refuses a guard index whose tokenizer is not the generation corpus's, and one of its own
/// over shards held elsewhere that do not say their tokenizer.
fn same_tokenizer(corpus: &dyn Shards, guard: &Index<Mmap>) -> Result<()> {
    let Some(a) = corpus.tokenizer() else {
        return Err(Error::input(
            "these shards held elsewhere do not say their tokenizer, so a guard index of its \
             own cannot be checked against them: give no guard index (the copy guard then \
             checks those shards)",
        ));
    };
    let (a, b) = (&a, &guard.header().tokenizer);
    if a.fingerprint != b.fingerprint {
        let at = guard
            .dir()
            .map_or_else(|| "(in memory)".into(), |d| d.display().to_string());
        return Err(Error::input(format!(
            "the guard index {at} was built with another tokenizer ({}, fingerprint {}) than the \
             generation's index ({}, fingerprint {}): rebuild it with the same tokenizer",
            b.kind, b.fingerprint, a.kind, a.fingerprint
        )));
    }
    Ok(())
}

/// How a neural generation's decode loop is assembled.
#[derive(Clone, Debug)]
pub struct AssemblyOptions {
    /// The drafters, in order (none: plain decoding; the corpus drafter needs the drafting
    /// index).
    pub drafters: Vec<DrafterSpec>,
    /// How the corpus drafter drafts.
    pub corpus_rule: CorpusRule,
    /// A corpus in the model's tokens to draft from (with `speculative`), mix with, and guard
    /// against by default: an opened index, or shards of one held elsewhere.
    pub drafting_index: Option<SharedShards>,
    /// Repetition penalty over the last [`REPETITION_WINDOW`] tokens (1: none).
    pub repetition_penalty: f32,
    /// The copy guard (its index defaults to the drafting index).
    pub guard: Option<GuardConfig>,
    /// Past outputs to draft from (with [`DrafterSpec::PastOutputs`]); the generation's output
    /// is appended to them when it ends.
    pub past_outputs: Option<SharedPastOutputs>,
    /// The ids the tokenizer can read, where the model scores more (its embedding padded, or a
    /// `--tokenizer` of fewer ids): the rest are never sampled ([`VocabularyLimit`]).
    pub vocabulary: Option<usize>,
}

/// A neural generation's copy guard: its corpus (for the longest copied span afterwards), its
/// statistics and why a search failed.
pub struct GuardHandle {
    /// The guard's corpus.
    pub corpus: SharedShards,
    /// The guard's statistics, updated as the decode loop runs.
    pub stats: Rc<Cell<GuardStats>>,
    failure: Rc<RefCell<Option<String>>>,
}

impl GuardHandle {
    /// The guard's statistics and the longest span of `output` found in its corpus; an error
    /// when a search of the guard failed (the output was not checked).
    pub fn report(&self, output: &[u32]) -> Result<GuardReport> {
        BuiltGuard::checked(&self.failure)?;
        GuardReport::measure(Some(self.stats.get()), &*self.corpus, output)
    }
}

/// Tokens the repetition penalty looks back over.
pub const REPETITION_WINDOW: usize = 64;

/// The drafters of a generation, as `opts.drafters` lists them: prompt lookup, the corpus
/// drafter over the drafting index (left out when there is none; [`crate::service::Resources`]
/// checked its tokenizer when it was bound), and past outputs (left out when there are none to read).
/// Prompt lookup and past outputs together draft as one [`Braid`], token by token, where
/// prompt lookup stands in the list, followed by each alone (branches of a draft tree).
pub fn drafters(opts: &AssemblyOptions) -> Result<Vec<Box<dyn Drafter>>> {
    let mut drafters: Vec<Box<dyn Drafter>> = Vec::new();
    let past = opts.past_outputs.as_ref();
    let braided = past.is_some()
        && opts.drafters.contains(&DrafterSpec::PromptLookup)
        && opts.drafters.contains(&DrafterSpec::PastOutputs);
    for spec in &opts.drafters {
        match spec {
            DrafterSpec::PromptLookup if braided => {
                let past = past.expect("braided only with past outputs");
                // One index of the context serves the braid's prompt lookup and its twin.
                let lookup = PromptLookup::new(8);
                drafters.push(Box::new(Braid::new(vec![
                    Box::new(lookup.twin()),
                    Box::new(PastOutputDrafter::new(past.clone())),
                ])));
                // Each alone too: where they part from the braid, a branch of the tree.
                drafters.push(Box::new(lookup));
                drafters.push(Box::new(PastOutputDrafter::new(past.clone())));
            }
            DrafterSpec::PastOutputs if braided => {}
            DrafterSpec::PromptLookup => drafters.push(Box::new(PromptLookup::new(8))),
            DrafterSpec::Corpus => {
                if let Some(index) = &opts.drafting_index {
                    let rule = opts.corpus_rule.drafter_rule();
                    drafters.push(Box::new(CorpusDrafter::with_rule(index.clone(), rule)));
                }
            }
            DrafterSpec::PastOutputs => {
                if let Some(past) = &opts.past_outputs {
                    drafters.push(Box::new(PastOutputDrafter::new(past.clone())));
                }
            }
        }
    }
    Ok(drafters)
}

/// The processors of a decode loop, applied in order.
pub type Processors = Vec<Box<dyn Processor>>;

/// The processors of a neural generation: the tokenizer's vocabulary where the model scores
/// more ids, the repetition penalty when it is not 1, then the
/// copy guard (its index checked when bound, [`crate::service::Resources`]), with a handle on
/// the guard.
pub fn processors(opts: &AssemblyOptions) -> Result<(Processors, Option<GuardHandle>)> {
    let mut processors: Vec<Box<dyn Processor>> = Vec::new();
    if let Some(ids) = opts.vocabulary {
        processors.push(Box::new(VocabularyLimit { ids }));
    }
    if opts.repetition_penalty != 1.0 {
        processors.push(Box::new(RepetitionPenalty {
            penalty: opts.repetition_penalty,
            window: REPETITION_WINDOW,
        }));
    }
    let Some(g) = &opts.guard else {
        return Ok((processors, None));
    };
    g.check()?;
    let own = g.index.clone().map(|index| index as SharedShards);
    let Some(corpus) = own.or_else(|| opts.drafting_index.clone()) else {
        return Err(Error::input(
            "the copy guard needs an index built with the model's tokenizer \
             (`infgram index --tokenizer MODEL`): give it with --guard-index DIR or --index DIR",
        ));
    };
    let built = g.build(corpus.clone());
    processors.push(built.processor);
    let handle = GuardHandle {
        corpus,
        stats: built.stats,
        failure: built.failure,
    };
    Ok((processors, Some(handle)))
}

/// A generation with a (neural) model: plain or speculative, mixed with an index or not,
/// guarded or not.
#[derive(Clone, Debug)]
pub struct ModelGenRequest {
    /// The prompt's tokens (a chat template already applied, if wanted).
    pub prompt: Vec<u32>,
    /// Drafters, processors and the copy guard.
    pub assembly: AssemblyOptions,
    /// Sample from the mixture of the model and the ∞-gram of the drafting index
    /// (`assembly.drafting_index`, built with the model's tokenizer), λ from this mixer.
    pub mix: Option<Mixer>,
    /// The decode loop's settings.
    pub decode: DecodeConfig,
}

/// What a generation with a model produced.
#[derive(Clone, Debug)]
pub struct ModelGeneration {
    /// Generated token ids (the prompt excluded).
    pub tokens: Vec<u32>,
    /// What the decode loop did.
    pub stats: DecodeStats,
    /// The copy guard's report (`None` without a guard).
    pub guard: Option<GuardReport>,
    /// Tokens in the model's cache at the end.
    pub context_tokens: usize,
}

/// Generates with `model` (borrowed: a server loads it once) as `req` asks, calling `on_token`
/// after each token: the drafters and processors of [`drafters`] and [`processors`], the
/// mixture of [`crate::mix::mixture_model`] when `req.mix` is set. The indexes in `req` were
/// checked against the model's tokenizer when bound ([`crate::service::Resources`]); front
/// ends call [`crate::service::run::generate`].
pub fn generate_with_model(
    model: &mut dyn LanguageModel,
    req: &ModelGenRequest,
    sampler: &mut Sampler,
    on_token: impl FnMut(u32),
) -> Result<ModelGeneration> {
    let mut drafters = drafters(&req.assembly)?;
    let (mut processors, guard) = processors(&req.assembly)?;
    let prompt = fed_prompt(model, &req.prompt);
    let run = |scorer: &mut dyn LanguageModel| {
        let (tokens, stats) = decode(
            scorer,
            &mut drafters,
            &mut processors,
            sampler,
            &prompt,
            &req.decode,
            on_token,
        )?;
        let context_tokens = scorer.cache_len();
        Ok::<_, Error>((tokens, stats, context_tokens))
    };
    let (tokens, stats, context_tokens) = match &req.mix {
        None => run(model)?,
        Some(mixer) => {
            let Some(index) = &req.assembly.drafting_index else {
                return Err(crate::mix::mixing_needs_an_index());
            };
            let mut mixed = mixture_model(&mut *model, index.clone(), mixer.clone())?;
            run(&mut mixed)?
        }
    };
    if let Some(past) = &req.assembly.past_outputs {
        remember(past, &tokens);
    }
    Ok(ModelGeneration {
        guard: guard.as_ref().map(|g| g.report(&tokens)).transpose()?,
        tokens,
        stats,
        context_tokens,
    })
}

/// The prompt as `model` is fed it: after its first token when it asks for one (Gemma's
/// `<bos>`) and the prompt does not start with it.
pub fn fed_prompt<'p>(model: &dyn LanguageModel, prompt: &'p [u32]) -> std::borrow::Cow<'p, [u32]> {
    match model.bos_token() {
        Some(bos) if prompt.first() != Some(&bos) => {
            std::iter::once(bos).chain(prompt.iter().copied()).collect()
        }
        _ => std::borrow::Cow::Borrowed(prompt),
    }
}

impl CheckedRequest {
    /// The sampler the request asks for.
    pub fn sampler(&self) -> Sampler {
        Sampler::new(self.sampler.clone(), self.seed)
    }
}
