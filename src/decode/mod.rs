//! The generation runtime: one decode loop with pluggable parts.
//!
//! - A **scorer** ([`LanguageModel`]) is fed tokens and returns the logits of every fed
//!   position, dense or sparse ([`Logits`]); its KV cache can be cut back.
//! - **Drafters** ([`Drafter`]) propose tokens that are likely to come next, each with a
//!   confidence (the chance it is accepted if the tokens before it were).
//! - **Processors** ([`Processor`]) edit each position's logits before sampling: the repetition
//!   penalty, and the copy guard ([`guard::CopyGuard`]), which masks tokens that would copy
//!   more than L tokens of a corpus and cuts drafts before them. When processors mask every
//!   candidate, the model is asked for a wider row ([`LanguageModel::backoff`]).
//! - The **sampler** ([`Sampler`]) turns a distribution into a token. A sparse row (the
//!   ∞-gram's support) is sampled and verified over its support alone: no dense softmax.
//!
//! Each step feeds the pending token plus a draft in one pass, verifies the draft left to right
//! and keeps the longest accepted prefix plus one token of the model's own, then rolls the cache
//! back past the rest. Greedy verification accepts a draft token when it is the argmax, so the
//! output equals plain greedy decoding (the native forward pass is batch-invariant, so the
//! logits are the same bits either way). Sampled verification is lossless rejection sampling:
//! accept draft x with probability p(x), otherwise sample from p without x, renormalized.
//! Plain decoding is this loop with no drafter.
//!
//! # How a pass runs and how long a draft is
//!
//! Rows are asked for as
//! verification reaches them (`score_first` with 8 rows, then `score_more` with as many again as
//! it has): the native model runs every layer over the whole pass but its output projection (a
//! fifth of the pass's weights) only over rows that get verified, and the mixture mixes only those;
//! a draft rejected early costs no logits past the rejection. Greedy decoding with no processors
//! asks for rows in `RowForm::Greedy` (`LanguageModel::score_first`): a model whose rows live
//! on a GPU then sends back each row's argmax and its logit instead of the row, the native CPU
//! pass finds them as its output projection goes and never writes the row, and the loop
//! reads nothing else of a row there. Greedy verification accepts a draft
//! token when it is the argmax, so the output equals plain greedy decoding (the native pass is
//! batch-invariant). Sampled verification is rejection sampling: accept draft x with probability
//! p(x), else sample from p without x, renormalized: the output has exactly the model's
//! distribution. Plain decoding is the loop with no drafter; ∞-gram generation is the loop with
//! `InfgramModel` as its model. `DecodeConfig::cancel` (a `Cancel` flag) stops the loop before its
//! next pass from another thread (the server: a client gone, a time limit); `DecodeConfig::trace`
//! records every pass (`PassTrace`: drafter, drafted, accepted, emitted, seconds) for
//! `gen --trace`.
//!
//! How long a draft runs is the drafting policy's choice ([`policy`]).
//!
//! A scorer may return sparse rows (`Logits::Sparse`): the ∞-gram's support is a handful of tokens,
//! and the sampler, verification and processors work on the support alone; a sparse row's softmax
//! is the dense row's softmax bit for bit, so the text is the same for the same seed (tested against
//! dense rows). Processors see each row before verification and may cut a draft before a token
//! they would mask (`Processor::admit`). When the processors mask every candidate, the loop asks the
//! model for a wider row (`LanguageModel::backoff`, given the masked support: the ∞-gram's SBIS
//! over its next k levels, down to the unigram, that have a continuation outside it) and processes
//! that, again while everything is masked; if nothing is left, generation ends
//! (`DecodeStats::exhausted`),
//! never with a masked token and never with a panic.

pub mod drafters;
pub mod gram_chains;
pub mod guard;
pub mod past;
pub mod policy;
pub mod sampler;
pub mod session;

pub use policy::CostModel;
pub use sampler::{Sampler, SamplerConfig};

use crate::error::{Error, Result};
use crate::lm::{LanguageModel, Logits, RowForm};
use std::time::Instant;

/// A draft: tokens to try next, and for each the estimated chance that it is accepted given
/// that the ones before it were.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub confidence: Vec<f64>,
    /// Which part of a composite drafter proposed each token ([`Drafter::part_name`]); empty
    /// when the drafter is one source.
    pub parts: Vec<u8>,
}

/// Proposes tokens to follow a context.
pub trait Drafter: Send {
    /// Up to `max` tokens likely to follow `context` (prompt and generated text so far).
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft>;
    /// Up to `n` candidates for the token after `context` with their confidences, best first
    /// (the root of a token tree; `bench_decode speculative` measures what a second candidate would
    /// add). By default the first token of [`Drafter::propose`].
    fn alternatives(&mut self, context: &[u32], n: usize) -> Result<Vec<(u32, f64)>> {
        let draft = self.propose(context, 1)?;
        Ok(draft
            .tokens
            .into_iter()
            .zip(draft.confidence)
            .take(n)
            .collect())
    }
    /// The token after `seq` and its confidence, where `seq` is the context (its first
    /// `context_len` tokens) followed by a draft being grown, without learning the draft as
    /// context. By default the first token of [`Drafter::propose`] over `seq`.
    fn next_after(&mut self, seq: &[u32], context_len: usize) -> Result<Option<(u32, f64)>> {
        let _ = context_len;
        let d = self.propose(seq, 1)?;
        Ok(d.tokens.first().map(|&t| (t, d.confidence[0])))
    }
    /// `context` grew by accepted tokens (live indexes learn them).
    fn observe(&mut self, _context: &[u32]) {}
    /// Bytes this drafter holds for its context (what a drafting session costs beyond the
    /// context itself; shared indexes such as the corpus's are not counted). By default none.
    fn bytes(&self) -> usize {
        0
    }
    /// A short name for statistics.
    fn name(&self) -> &str;
    /// The name of part `part` of a composite drafter ([`Draft::parts`]); by default the
    /// drafter's own.
    fn part_name(&self, _part: u8) -> &str {
        self.name()
    }
}

/// Edits the logits of one position before sampling.
pub trait Processor {
    /// A generation starts after `prompt` (processors with state reset it here).
    fn start(&mut self, _prompt: &[u32]) {}
    /// `context` is everything before the position whose `logits` these are.
    fn process(&mut self, context: &[u32], logits: &mut Logits);
    /// How many leading tokens of `draft` (to follow `context`) this processor can let
    /// through: a draft token it would give probability 0 can never be accepted, so the draft
    /// is cut before it. By default all.
    fn admit(&mut self, _context: &[u32], draft: &[u32]) -> usize {
        draft.len()
    }
}

/// Gives probability 0 to the ids at and past `ids`: a model whose embedding has more rows than
/// its tokenizer has tokens (a `--tokenizer` of fewer ids, a padded vocabulary) never writes
/// an id its tokenizer cannot read, sampled or drafted.
pub struct VocabularyLimit {
    /// The tokenizer's ids: `0..ids`.
    pub ids: usize,
}

impl Processor for VocabularyLimit {
    fn process(&mut self, _context: &[u32], logits: &mut Logits) {
        match logits {
            Logits::Dense(v) => {
                for x in v.iter_mut().skip(self.ids) {
                    *x = f32::NEG_INFINITY;
                }
            }
            Logits::Sparse { entries, .. } => entries.retain(|e| (e.0 as usize) < self.ids),
        }
    }
    fn admit(&mut self, _context: &[u32], draft: &[u32]) -> usize {
        draft
            .iter()
            .position(|&t| t as usize >= self.ids)
            .unwrap_or(draft.len())
    }
}

/// Divides positive logits (multiplies negative ones) of tokens seen in the last `window`
/// tokens by `penalty` (the CTRL / llama.cpp repetition penalty).
pub struct RepetitionPenalty {
    pub penalty: f32,
    pub window: usize,
}

impl Processor for RepetitionPenalty {
    fn process(&mut self, context: &[u32], logits: &mut Logits) {
        let from = context.len().saturating_sub(self.window);
        let mut seen: Vec<u32> = context[from..].to_vec();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(l) = logits.get_mut(t) {
                *l = if *l > 0.0 {
                    *l / self.penalty
                } else {
                    *l * self.penalty
                };
            }
        }
    }
}

/// Settings of the decode loop.
#[derive(Clone, Debug)]
pub struct DecodeConfig {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Longest draft verified in one pass.
    pub draft_max: usize,
    /// What a pass of each length costs (learnt as the loop runs; plans drafts).
    pub cost: CostModel,
    /// Stops the loop before its next pass once set (a client gone, a time limit passed).
    pub cancel: Option<Cancel>,
    /// Record every pass in [`DecodeStats::trace`] (`gen --trace FILE`).
    pub trace: bool,
    /// Verify a tree of drafts in one pass where drafters disagree and the model can
    /// ([`LanguageModel::max_tree_rows`]); else the best draft alone. Off by default: on the
    /// CPUs measured a branch's rows almost never pay (`bench_decode speculative`), and asking
    /// every cheap drafter each step costs a little.
    pub trees: bool,
    /// Trust a drafter by its current run as well as by its whole record: while the model has
    /// accepted `s` of its draft tokens in a row, each next one is taken as likely as the rule of
    /// succession says, `(s + 1) / (s + 2)`, if that beats the calibrated confidence. Drafts
    /// then run long while the model copies, and fall back at the first rejection.
    pub local_evidence: bool,
}

/// One pass of the decode loop, as [`DecodeConfig::trace`] records it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PassTrace {
    /// Tokens generated before this pass.
    pub at: usize,
    /// The drafter whose draft was verified (`None`: a plain step).
    pub drafter: Option<String>,
    /// Draft tokens verified.
    pub drafted: usize,
    /// The drafter's confidence in each token of the main draft, as it gave them (before the
    /// policy's calibration): what `gen --trace` offers for checking a drafter's confidences
    /// against what the model accepted.
    pub confidence: Vec<f64>,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Tokens this pass added (accepted drafts, plus the model's own token unless the pass
    /// ended the generation).
    pub emitted: usize,
    /// Seconds of the pass (the model's scoring of the fed tokens).
    pub seconds: f64,
}

/// A flag that stops a decode loop from another thread: set it, and the loop ends before its
/// next pass with what it has (`DecodeStats::cancelled`).
#[derive(Clone, Debug, Default)]
pub struct Cancel(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Cancel {
    /// Asks the loop to stop.
    pub fn cancel(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether it was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Longest draft verified in one pass when none is given (`service::request::defaults` names
/// this one).
pub const DEFAULT_DRAFT_MAX: usize = 16;

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            max_tokens: 256,
            draft_max: DEFAULT_DRAFT_MAX,
            cost: CostModel::default(),
            cancel: None,
            trace: false,
            trees: false,
            local_evidence: true,
        }
    }
}

/// What a decode run did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DecodeStats {
    /// Tokens generated (end token excluded).
    pub tokens: usize,
    /// Forward passes after the prompt.
    pub passes: usize,
    /// Passes that carried a draft.
    pub drafted_passes: usize,
    /// Drafted passes that verified a tree (branches beside the main draft).
    pub tree_passes: usize,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Seconds in the drafters.
    pub draft_seconds: f64,
    /// Seconds in the model (prompt included; with no drafters, passes are not timed one by
    /// one and this is the whole run).
    pub model_seconds: f64,
    /// Seconds spent reading the prompt (the first pass).
    pub prompt_seconds: f64,
    /// Prompt tokens the model's cache already held (a kept prompt), not read again.
    pub cached_prompt_tokens: usize,
    /// Seconds in all.
    pub seconds: f64,
    /// Positions where the processors masked every candidate and the model's wider
    /// distribution ([`LanguageModel::backoff`]) was used.
    pub backoffs: usize,
    /// Whether generation ended because no token could come next: the processors (the copy
    /// guard) masked every candidate, even of the model's wider distribution.
    pub exhausted: bool,
    /// Whether generation ended because [`DecodeConfig::cancel`] was set.
    pub cancelled: bool,
    /// Accepted draft tokens by the drafter that proposed them ([`Drafter::name`]).
    pub accepted_by_drafter: std::collections::BTreeMap<String, usize>,
    /// Every pass, with [`DecodeConfig::trace`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<PassTrace>,
}

impl DecodeStats {
    /// Accepted draft tokens / verified draft tokens (0 with no drafts).
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Accepted draft tokens per pass that carried a draft.
    pub fn mean_accepted(&self) -> f64 {
        self.accepted as f64 / self.drafted_passes.max(1) as f64
    }

    /// Generation speed, the prompt's pass excluded (as llama.cpp reports "eval" speed).
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / (self.seconds - self.prompt_seconds).max(1e-12)
    }
}

/// Generates up to `cfg.max_tokens` tokens after `prompt`. `drafters` may be empty (plain
/// decoding); `on_token` sees each token as it is accepted. Stops at the model's end token
/// (not included).
pub fn decode(
    model: &mut dyn LanguageModel,
    drafters: &mut [Box<dyn Drafter>],
    processors: &mut [Box<dyn Processor>],
    sampler: &mut Sampler,
    prompt: &[u32],
    cfg: &DecodeConfig,
    mut on_token: impl FnMut(u32),
) -> Result<(Vec<u32>, DecodeStats)> {
    let mut run = Decoding::start(model, drafters.len(), processors, prompt, cfg)?;
    let tree_rows = if cfg.trees && drafters.len() > 1 {
        model.max_tree_rows()
    } else {
        0
    };
    while !run.done && run.stats.tokens < cfg.max_tokens {
        if cfg.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
            run.stats.cancelled = true;
            break;
        }
        // A model serving several sequences at once: drafts cost what they add to its pass.
        run.policy.beside(model.rows_beside());
        let planned = run.plan(drafters, processors, cfg, tree_rows)?;
        let tree = DraftTree::of(&planned);
        let pass = run.pass(model, processors, sampler, &tree, cfg, &mut on_token)?;
        run.record(drafters, &planned, &tree, &pass, cfg);
        // Keep the pending token and the accepted drafts; the last token of the context is
        // the new pending one. (When the budget ends on an accepted draft token, that token
        // stays in the cache too; the loop ends there.)
        if planned.branches.is_empty() {
            model.truncate(pass.cached + 1 + pass.accepted);
        } else {
            model.keep_path(&pass.path)?;
        }
        run.pending = *run.context.last().expect("non-empty");
        for d in drafters.iter_mut() {
            d.observe(&run.context);
        }
    }
    Ok(run.finish(prompt.len()))
}

/// A generation in progress: the context, the token not yet fed to the model, the drafting
/// policy's state and the statistics.
struct Decoding {
    started: Instant,
    stats: DecodeStats,
    policy: policy::DraftPolicy,
    eos: Vec<u32>,
    context: Vec<u32>,
    /// The last token of the context, not yet fed to the model.
    pending: u32,
    done: bool,
    /// Whether passes are timed: without drafters nothing needs the pass times (the cost
    /// model plans drafts), and a step of a cheap scorer (the ∞-gram, about a microsecond) is
    /// not worth two clock reads.
    timed: bool,
    /// Scratch: the tokens of a pass, the row's weights in verification, a sparse row's
    /// support.
    fed: Vec<u32>,
    weights: Vec<(u32, f64)>,
    support: Vec<u32>,
}

/// What one pass did.
struct Pass {
    /// The model's cache length before the pass.
    cached: usize,
    /// Draft tokens accepted.
    accepted: usize,
    /// Seconds of the model's scoring (0 when untimed).
    seconds: f64,
    /// Tokens generated before the pass.
    tokens_before: usize,
    /// The nodes of the draft tree kept: 0 (the pending token), then each accepted one.
    path: Vec<usize>,
}

impl Decoding {
    /// Resets the processors and the model and feeds all of the prompt but its last token.
    fn start(
        model: &mut dyn LanguageModel,
        drafters: usize,
        processors: &mut [Box<dyn Processor>],
        prompt: &[u32],
        cfg: &DecodeConfig,
    ) -> Result<Decoding> {
        let Some((&last, head)) = prompt.split_last() else {
            return Err(Error::input("the model needs a non-empty prompt"));
        };
        let started = Instant::now();
        for p in processors.iter_mut() {
            p.start(prompt);
        }
        model.clear();
        let mut stats = DecodeStats::default();
        if !head.is_empty() {
            model.feed(head)?;
            stats.cached_prompt_tokens = model.fed_from_cache();
        }
        stats.prompt_seconds = started.elapsed().as_secs_f64();
        stats.model_seconds = stats.prompt_seconds;
        Ok(Decoding {
            started,
            stats,
            policy: policy::DraftPolicy::new(drafters, cfg.cost.clone()),
            eos: model.eos_tokens().to_vec(),
            context: prompt.to_vec(),
            pending: last,
            done: false,
            timed: drafters > 0 || cfg.trace,
            fed: Vec::with_capacity(cfg.draft_max + 1),
            weights: Vec::new(),
            support: Vec::new(),
        })
    }

    /// The draft (or draft tree) of this step (timed into the drafters' seconds).
    fn plan(
        &mut self,
        drafters: &mut [Box<dyn Drafter>],
        processors: &mut [Box<dyn Processor>],
        cfg: &DecodeConfig,
        tree_rows: usize,
    ) -> Result<policy::Planned> {
        let budget = cfg.max_tokens - self.stats.tokens;
        let t = self.timed.then(Instant::now);
        let planned =
            self.policy
                .plan(drafters, processors, &self.context, cfg, budget, tree_rows)?;
        if let Some(t) = t {
            self.stats.draft_seconds += t.elapsed().as_secs_f64();
        }
        Ok(planned)
    }

    /// One forward pass over the pending token and the draft tree (a chain without branches),
    /// verified from its root: row `n` predicts the token after node `n`'s branch. Rows past
    /// the first ones are asked for as verification reaches them
    /// (`LanguageModel::score_first`).
    fn pass(
        &mut self,
        model: &mut dyn LanguageModel,
        processors: &mut [Box<dyn Processor>],
        sampler: &mut Sampler,
        tree: &DraftTree,
        cfg: &DecodeConfig,
        on_token: &mut impl FnMut(u32),
    ) -> Result<Pass> {
        self.fed.clear();
        self.fed.push(self.pending);
        self.fed.extend_from_slice(&tree.tokens[1..]);
        let mut pass = Pass {
            cached: model.cache_len(),
            accepted: 0,
            seconds: 0.0,
            tokens_before: self.stats.tokens,
            path: vec![0],
        };
        // Greedy verification with no processors reads a row's argmax alone.
        let form = match sampler.is_greedy() && processors.is_empty() {
            true => RowForm::Greedy,
            false => RowForm::Full,
        };
        let first = rows_to_ask(0, self.fed.len());
        let mut rows = if tree.is_chain() {
            self.timing(&mut pass, || model.score_first(&self.fed, first, form))?
        } else {
            self.timing(&mut pass, || {
                model.score_tree_first(&self.fed, &tree.parents, first, form)
            })?
        };
        self.stats.passes += 1;
        let mut node = 0;
        loop {
            while node >= rows.len() {
                let count = rows_to_ask(rows.len(), self.fed.len());
                let more = self.timing(&mut pass, || model.score_more(count))?;
                if more.is_empty() {
                    return Err(Error::Model(format!(
                        "the model returned {} of a pass's {} rows",
                        rows.len(),
                        self.fed.len()
                    )));
                }
                rows.extend(more);
            }
            if !self.process_row(model, processors, &mut rows[node])? {
                self.stats.exhausted = true;
                self.done = true;
                break;
            }
            let children = tree.children(node);
            let (token, next) = verify(sampler, &rows[node], &children, &mut self.weights)?;
            if self.eos.contains(&token) {
                self.done = true;
                break;
            }
            self.context.push(token);
            self.stats.tokens += 1;
            on_token(token);
            let Some(next) = next else {
                break;
            };
            pass.path.push(next);
            pass.accepted += 1;
            node = next;
            if self.stats.tokens >= cfg.max_tokens {
                break;
            }
        }
        model.recycle(rows);
        Ok(pass)
    }

    /// Runs `f` (a scoring call), adding its time to the pass when passes are timed.
    fn timing<T>(&self, pass: &mut Pass, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = self.timed.then(Instant::now);
        let out = f()?;
        pass.seconds += t.map_or(0.0, |t| t.elapsed().as_secs_f64());
        Ok(out)
    }

    /// Runs the processors on one row; while they mask every candidate, asks the model for a
    /// wider distribution, each with a candidate outside every support masked so far (so this
    /// ends). `false` when nothing is left.
    fn process_row(
        &mut self,
        model: &mut dyn LanguageModel,
        processors: &mut [Box<dyn Processor>],
        logits: &mut Logits,
    ) -> Result<bool> {
        // A sparse row's support, kept in case the processors mask all of it.
        self.support.clear();
        if let (false, Logits::Sparse { entries, .. }) = (processors.is_empty(), &*logits) {
            self.support.extend(entries.iter().map(|e| e.0));
        }
        for p in processors.iter_mut() {
            p.process(&self.context, logits);
        }
        while !logits.has_support() {
            let Some(mut wider) = model.backoff(&self.context, &self.support)? else {
                break;
            };
            wider.support_into(&mut self.support);
            for p in processors.iter_mut() {
                p.process(&self.context, &mut wider);
            }
            self.stats.backoffs += 1;
            *logits = wider;
        }
        Ok(logits.has_support())
    }

    /// Records the pass in the statistics, the trace and the drafting policy.
    fn record(
        &mut self,
        drafters: &[Box<dyn Drafter>],
        planned: &policy::Planned,
        tree: &DraftTree,
        pass: &Pass,
        cfg: &DecodeConfig,
    ) {
        if self.timed {
            self.stats.model_seconds += pass.seconds;
        }
        let drafted = tree.tokens.len() - 1;
        if cfg.trace {
            self.stats.trace.push(PassTrace {
                at: pass.tokens_before,
                drafter: planned.chosen.map(|d| drafters[d].name().to_string()),
                drafted,
                confidence: planned.draft.confidence.clone(),
                accepted: pass.accepted,
                emitted: self.stats.tokens - pass.tokens_before,
                seconds: pass.seconds,
            });
        }
        if planned.chosen.is_some() {
            for &n in &pass.path[1..] {
                let (d, part) = tree.source[n];
                let name = match part {
                    Some(part) => drafters[d].part_name(part),
                    None => drafters[d].name(),
                };
                // A drafter's name is allocated once per generation, not per token.
                match self.stats.accepted_by_drafter.get_mut(name) {
                    Some(count) => *count += 1,
                    None => {
                        self.stats.accepted_by_drafter.insert(name.to_string(), 1);
                    }
                }
            }
            self.stats.drafted_passes += 1;
            self.stats.drafted += drafted;
            self.stats.accepted += pass.accepted;
            if !planned.branches.is_empty() {
                self.stats.tree_passes += 1;
            }
        }
        let (on_main, branch) = tree.split_path(&pass.path);
        let mean_step =
            (self.stats.model_seconds - self.stats.prompt_seconds) / self.stats.passes as f64;
        let timing = self.timed.then_some((self.fed.len(), pass.seconds));
        self.policy
            .learn(planned, on_main, branch, timing, mean_step);
    }

    /// The generated tokens and the statistics.
    fn finish(mut self, prompt_len: usize) -> (Vec<u32>, DecodeStats) {
        self.stats.seconds = self.started.elapsed().as_secs_f64();
        if !self.timed {
            // Everything but the sampler was the model.
            self.stats.model_seconds = self.stats.seconds;
        }
        (self.context.split_off(prompt_len), self.stats)
    }
}

/// Greedy [`decode`] with `drafters`, no processors and no streaming: what benchmarks and tests
/// compare (plain greedy decoding is `greedy(model, &mut [], prompt, cfg)`).
pub fn greedy(
    model: &mut dyn LanguageModel,
    drafters: &mut [Box<dyn Drafter>],
    prompt: &[u32],
    cfg: &DecodeConfig,
) -> Result<(Vec<u32>, DecodeStats)> {
    decode(
        model,
        drafters,
        &mut [],
        &mut Sampler::greedy(),
        prompt,
        cfg,
        |_| {},
    )
}

/// Rows of a pass the decode loop asks for first; then as many again as it has, while
/// verification accepts (`LanguageModel::score_first`). Each call costs hand-offs to the
/// threads, and a neural model's output projection over 8 rows costs about 3 of one row's:
/// in two in-process A/Bs (`bench_decode speculative`'s prompts, fastest of 3) 8 was 0.2–8% faster
/// than 4 on every set.
const FIRST_ROWS: usize = 8;

/// How many rows to ask for next, with `done` of a pass's `total` rows returned: at least
/// [`FIRST_ROWS`] and as many again as there are, but all that are left where fewer than
/// [`FIRST_ROWS`] would be left after. Each call streams the output projection (Qwen2.5's
/// 136 MB) from memory once, which on a 2-vCPU EPYC costs about a third of a one-token
/// step, while its rows past the first cost a few percent each: a 17-row pass asked for as
/// 8, 8 and 1 rows cost 5.6 steps where a 16-row pass cost 4.4 (`bench_decode edits`, code
/// edits with the 0.5B model on AVX2); as 8 and 9 it streams the matrix twice.
fn rows_to_ask(done: usize, total: usize) -> usize {
    let left = total.saturating_sub(done);
    let ask = done.max(FIRST_ROWS);
    if left.saturating_sub(ask) < FIRST_ROWS {
        left.max(1)
    } else {
        ask
    }
}

/// Decides the token at one position: a draft token of `candidates` (`(node, token)`, the
/// children of the node whose row `logits` is, distinct tokens, best first) if verification
/// accepts it, otherwise the model's own choice. Returns (token, the accepted candidate's
/// node). Greedy decoding takes the argmax of the logits directly (the sampler's argmax of the
/// softmax, smallest id among ties), saving a softmax per position, and accepts the candidate
/// that holds it. Sampling is rejection sampling over the candidates in turn: accept x with
/// probability p(x), else remove x from p and renormalize, and try the next; after the last,
/// sample from what is left. Each candidate is a point mass, so every token comes out with
/// exactly its probability under p. A sparse row is sampled over its support. An error when
/// every token has probability 0 (processors masked them all).
fn verify(
    sampler: &mut Sampler,
    logits: &Logits,
    candidates: &[(usize, u32)],
    weights: &mut Vec<(u32, f64)>,
) -> Result<(u32, Option<usize>)> {
    let nothing = || Error::input("no token can come next: every candidate has probability 0");
    if sampler.is_greedy() {
        let target = logits.argmax().ok_or_else(nothing)?;
        let accepted = candidates.iter().find(|c| c.1 == target).map(|c| c.0);
        return Ok((target, accepted));
    }
    sampler.target_weights_of(logits, weights);
    for &(node, x) in candidates {
        let total: f64 = weights.iter().map(|w| w.1).sum();
        let px = weights.iter().find(|w| w.0 == x).map_or(0.0, |w| w.1) / total;
        if sampler.uniform() < px {
            return Ok((x, Some(node)));
        }
        // Rejected: p with x removed, renormalized (by the next total).
        weights.retain(|w| w.0 != x);
    }
    let token = sampler.draw_weighted(weights).ok_or_else(nothing)?;
    Ok((token, None))
}

/// A step's drafts as one tree: node 0 is the pending token, nodes 1..=m the main draft,
/// then each branch's tokens, each node after its parent (the order rows are fed and come).
#[derive(Clone, Debug, Default)]
struct DraftTree {
    tokens: Vec<u32>,
    /// Node 0's is `None`: it follows the cache.
    parents: Vec<Option<usize>>,
    /// Who proposed each node: drafter and part ([`Draft::parts`]).
    source: Vec<(usize, Option<u8>)>,
    /// Nodes of the main draft (after node 0).
    main: usize,
    /// Each branch's first node.
    branch_starts: Vec<usize>,
}

impl DraftTree {
    fn of(planned: &policy::Planned) -> DraftTree {
        let d = &planned.draft;
        let chosen = planned.chosen.unwrap_or(0);
        let mut t = DraftTree {
            tokens: vec![0],
            parents: vec![None],
            source: vec![(chosen, None)],
            main: d.tokens.len(),
            branch_starts: Vec::new(),
        };
        t.add(&d.tokens, &d.parts, 0, chosen);
        for b in &planned.branches {
            t.branch_starts.push(t.tokens.len());
            t.add(&b.draft.tokens, &b.draft.parts, b.at, b.drafter);
        }
        t
    }

    /// Adds a chain after node `parent`.
    fn add(&mut self, tokens: &[u32], parts: &[u8], mut parent: usize, drafter: usize) {
        for (i, &tok) in tokens.iter().enumerate() {
            self.tokens.push(tok);
            self.parents.push(Some(parent));
            self.source.push((drafter, parts.get(i).copied()));
            parent = self.tokens.len() - 1;
        }
    }

    fn is_chain(&self) -> bool {
        self.branch_starts.is_empty()
    }

    /// The children of `node`, `(node, token)`, in node order (the main draft's first), a
    /// token already held by an earlier child left out.
    fn children(&self, node: usize) -> Vec<(usize, u32)> {
        let mut kids: Vec<(usize, u32)> = Vec::new();
        for c in node + 1..self.tokens.len() {
            if self.parents[c] == Some(node) && !kids.iter().any(|k| k.1 == self.tokens[c]) {
                kids.push((c, self.tokens[c]));
            }
        }
        kids
    }

    /// The accepted path's tokens kept on the main draft, and the branch it went on in (its
    /// index and tokens kept there), if it left the main draft.
    /// The nodes `tokens` walk from the root (0, then each token that is a child of the last
    /// node), stopping at the first that is not.
    fn follow(&self, tokens: &[u32]) -> Vec<usize> {
        let mut path = vec![0];
        for &t in tokens {
            let at = *path.last().expect("the root");
            let child = (at + 1..self.tokens.len())
                .find(|&n| self.parents[n] == Some(at) && self.tokens[n] == t);
            match child {
                Some(n) => path.push(n),
                None => break,
            }
        }
        path
    }

    fn split_path(&self, path: &[usize]) -> (usize, Option<(usize, usize)>) {
        let on_main = path[1..].iter().take_while(|&&n| n <= self.main).count();
        let branch = path.get(1 + on_main).map(|&n| {
            let b = self
                .branch_starts
                .iter()
                .rposition(|&s| s <= n)
                .expect("a node past the main draft is in a branch");
            (b, path.len() - 1 - on_main)
        });
        (on_main, branch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_penalty_pushes_seen_tokens_down() {
        let mut p = RepetitionPenalty {
            penalty: 2.0,
            window: 2,
        };
        let mut logits = Logits::Dense(vec![4.0, -4.0, 4.0, 4.0]);
        p.process(&[2, 0, 1], &mut logits);
        assert_eq!(logits, Logits::Dense(vec![2.0, -8.0, 4.0, 4.0]));
        let mut sparse = Logits::Sparse {
            vocab: 4,
            entries: vec![(0, 4.0), (1, -4.0), (3, 4.0)],
        };
        p.process(&[2, 0, 1], &mut sparse);
        assert_eq!(sparse.into_dense(), vec![2.0, -8.0, f32::NEG_INFINITY, 4.0]);
    }

    /// The calls a pass of `total` rows makes when every row is read.
    fn calls(total: usize) -> Vec<usize> {
        let mut done = 0;
        let mut asks = Vec::new();
        while done < total {
            let ask = rows_to_ask(done, total);
            asks.push(ask);
            done += ask;
        }
        asks
    }

    #[test]
    fn a_pass_asks_for_its_rows_in_few_calls_and_never_past_its_end() {
        let table: [(usize, &[usize]); 9] = [
            (1, &[1]),
            (2, &[2]),
            (8, &[8]),
            (15, &[15]),
            (16, &[8, 8]),
            (17, &[8, 9]),
            (24, &[8, 8, 8]),
            (25, &[8, 8, 9]),
            (64, &[8, 8, 16, 32]),
        ];
        for (total, want) in table {
            assert_eq!(calls(total), want, "{total} rows");
        }
        for total in 1..200 {
            let asks = calls(total);
            assert_eq!(asks.iter().sum::<usize>(), total, "{total} rows");
            // Never a call for fewer than FIRST_ROWS rows but the pass's only one, and never
            // more calls than doubling from FIRST_ROWS takes.
            assert!(asks.len() == 1 || asks.iter().all(|&a| a >= FIRST_ROWS));
            let mut reach = FIRST_ROWS;
            let mut doubling = 1;
            while reach < total {
                reach *= 2;
                doubling += 1;
            }
            assert!(asks.len() <= doubling, "{total} rows: {asks:?}");
        }
    }
}
