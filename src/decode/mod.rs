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
//! a draft rejected early costs no logits past the rejection. Greedy verification accepts a draft
//! token when it is the argmax, so the output equals plain greedy decoding (the native pass is
//! batch-invariant). Sampled verification is rejection sampling: accept draft x with probability
//! p(x), else sample from p without x, renormalized: the output has exactly the model's
//! distribution. Plain decoding is the loop with no drafter; ∞-gram generation is the loop with
//! `InfgramModel` as its model. `DecodeConfig::cancel` (a `Cancel` flag) stops the loop before its
//! next pass from another thread (the server: a client gone, a time limit); `DecodeConfig::trace`
//! records every pass (`PassTrace`: drafter, drafted, accepted, emitted, seconds) for
//! `gen --trace`.
//!
//! How long a draft runs is decided by evidence at three scales. (1) The drafter's confidence in
//! each token: prompt lookup follows its match back past its longest n-gram (up to 256 tokens),
//! and the pseudo-occurrence against a continuation shrinks as the match grows, so a copy in
//! progress gets 0.9–0.99 per token while a two-token match is a guess. (2) The drafter's recent
//! record: a calibration factor (accepted / predicted tokens, each pass's evidence weighing 0.9 per
//! later pass, clamped to 0.25–2), which forgets a bad stretch and never falls so low that a sure
//! token is not tried (a one-token draft costs about 7% of a step). (3) Its current run
//! (`DecodeConfig::local_evidence`): after `s ≥ 4` of its tokens were accepted in a row, each next
//! one counts as at least `(s + 1) / (s + 2)` likely (the rule of succession), and the run ends at
//! the first rejection. Drafts run long while the model copies and stop quickly when it leaves the
//! source (`bench_speculative` prints both policies, and plots tokens per pass with `PLOT_DIR`).
//! Prompt lookup also keeps the copy's place in the source: it follows the source position while
//! the model writes the source's next token, and remembers where the copy broke off when it does
//! not. For 24 tokens after a break, a short match (under 4 tokens) whose continuation lies at
//! most 8 source tokens past the break is taken as the copy resuming after a changed word, and
//! drafts with the confidence of a match 4 tokens longer; 4 tokens seen before restart the copy
//! (nearest after the break). `CostModel::frozen` plans drafts from the prior table alone and lets
//! no drafter rest for its call time, so greedy decoding makes the same passes in every run:
//! `examples/draft_policy` weighs those passes with the table, a speed-up free of timing noise
//! for comparing policies.
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
pub mod guard;
pub mod sampler;

pub use sampler::{Sampler, SamplerConfig};

use crate::error::{Error, Result};
use crate::lm::{LanguageModel, Logits};
use std::time::Instant;

/// A draft: tokens to try next, and for each the estimated chance that it is accepted given
/// that the ones before it were.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub confidence: Vec<f64>,
}

/// Proposes tokens to follow a context.
pub trait Drafter {
    /// Up to `max` tokens likely to follow `context` (prompt and generated text so far).
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft>;
    /// Up to `n` candidates for the token after `context` with their confidences, best first
    /// (the root of a token tree; `bench_speculative` measures what a second candidate would
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
    /// `context` grew by accepted tokens (live indexes learn them).
    fn observe(&mut self, _context: &[u32]) {}
    /// A short name for statistics.
    fn name(&self) -> &str;
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

/// The cost of one forward pass over n tokens, relative to a single-token step, and the draft
/// length it makes worth verifying. Starts from a measured table (the prior) and learns the
/// passes it sees: once a size and single steps have each been timed a few times, their ratio
/// replaces the prior's (context depth, thread count and the machine all move it).
#[derive(Clone, Debug)]
pub struct CostModel {
    /// `(n, relative cost)` points, n ascending, starting at (1, 1).
    points: Vec<(usize, f64)>,
    /// Per pass size n: moving average of its seconds and how many passes were timed.
    observed: Vec<(f64, u32)>,
    /// Whether it keeps its table whatever the passes cost ([`CostModel::frozen`]).
    frozen: bool,
}

/// Timed passes of a size (and of single steps) before its measured cost replaces the prior.
const MIN_TIMED: u32 = 3;

/// Weight of the newest pass in the moving average of a size's seconds.
const TIMING_WEIGHT: f64 = 0.2;

impl Default for CostModel {
    /// The native Q4_1 pass with 2 threads at a 256-token context on the 2-core development
    /// machine (`cargo run --release --example bench_model`): 5.7 / 6.1 / 8.6 / 14.0 /
    /// 25.6 ms for n = 1 / 2 / 4 / 8 / 16.
    fn default() -> Self {
        CostModel::from_ms(&[(1, 5.7), (2, 6.1), (4, 8.6), (8, 14.0), (16, 25.6)])
    }
}

impl CostModel {
    /// From measured `(n, milliseconds)` pairs, n ascending from 1.
    pub fn from_ms(points: &[(usize, f64)]) -> CostModel {
        let base = points[0].1;
        CostModel {
            points: points.iter().map(|&(n, ms)| (n, ms / base)).collect(),
            observed: Vec::new(),
            frozen: false,
        }
    }

    /// The same table, never replaced by measured passes, and no drafter set to rest for what
    /// its calls cost: drafts are planned the same way whatever the machine's load, so greedy
    /// decoding makes the same passes in every run (benchmarks count passes and weigh them
    /// with the table: a speed-up free of timing noise).
    pub fn frozen(mut self) -> CostModel {
        self.frozen = true;
        self
    }

    /// Whether the table is [`CostModel::frozen`].
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Records that a pass over `n` tokens took `seconds` (nothing when frozen).
    pub fn observe(&mut self, n: usize, seconds: f64) {
        if self.frozen {
            return;
        }
        if self.observed.len() <= n {
            self.observed.resize(n + 1, (0.0, 0));
        }
        let (avg, count) = &mut self.observed[n];
        *avg = if *count == 0 {
            seconds
        } else {
            *avg + TIMING_WEIGHT * (seconds - *avg)
        };
        *count += 1;
    }

    /// Relative cost of a pass over `n` tokens: measured if timed enough, else the prior, but
    /// never below the measured cost of a smaller pass (the prior's scale may be off).
    pub fn cost(&self, n: usize) -> f64 {
        if let Some(c) = self.measured(n) {
            return c;
        }
        let floor = (2..n).filter_map(|m| self.measured(m)).fold(1.0, f64::max);
        self.prior(n).max(floor)
    }

    /// The measured relative cost of `n` tokens, once `n` and single steps were timed enough.
    fn measured(&self, n: usize) -> Option<f64> {
        let timed = |n: usize| self.observed.get(n).filter(|o| o.1 >= MIN_TIMED);
        match (timed(1), timed(n)) {
            (Some(one), Some(this)) if n > 1 => Some((this.0 / one.0).max(1.0)),
            _ => None,
        }
    }

    /// The prior table's cost of `n` tokens (linear between points, extrapolated after).
    fn prior(&self, n: usize) -> f64 {
        let p = &self.points;
        let i = p
            .iter()
            .position(|&(m, _)| m >= n)
            .unwrap_or(p.len() - 1)
            .max(1);
        let ((n0, c0), (n1, c1)) = (p[i - 1], p[i]);
        c0 + (c1 - c0) * (n as f64 - n0 as f64) / (n1 as f64 - n0 as f64)
    }

    /// The prefix length k of a draft with per-token acceptance chances `confidence` that
    /// maximizes expected tokens per unit of time, (1 + Σ_{i≤k} Π_{j≤i} c_j) / cost(k + 1).
    /// Returns (k, expected speed relative to plain decoding).
    pub fn best_length(&self, confidence: &[f64]) -> (usize, f64) {
        let (mut best, mut best_speed) = (0, 1.0);
        let (mut expected, mut reach) = (1.0, 1.0);
        for (i, &c) in confidence.iter().enumerate() {
            reach *= c.clamp(0.0, 1.0);
            expected += reach;
            let speed = expected / self.cost(i + 2);
            if speed > best_speed {
                (best, best_speed) = (i + 1, speed);
            }
        }
        (best, best_speed)
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

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            max_tokens: 256,
            draft_max: 16,
            cost: CostModel::default(),
            cancel: None,
            trace: false,
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

/// Calibrates a drafter's confidences against what the model accepts: the ratio of accepted
/// to predicted draft tokens over its recent passes (older passes count less and less, so a
/// bad stretch is forgotten once drafts work again), with a prior of a few tokens at face
/// value. The factor never falls below [`Calibration::FLOOR`]: a drafter sure of a token
/// still gets one-token drafts (a two-token pass costs about 7% more than one step here), so
/// its calibration can recover instead of locking at "never draft".
#[derive(Clone, Debug)]
struct Calibration {
    predicted: f64,
    accepted: f64,
}

impl Calibration {
    const PRIOR: f64 = 4.0;
    /// Weight of the evidence of a pass, per later pass of the same drafter.
    const MEMORY: f64 = 0.9;
    const FLOOR: f64 = 0.25;

    fn new() -> Self {
        Calibration {
            predicted: 0.0,
            accepted: 0.0,
        }
    }

    fn factor(&self) -> f64 {
        ((self.accepted + Self::PRIOR) / (self.predicted + Self::PRIOR)).clamp(Self::FLOOR, 2.0)
    }

    fn record(&mut self, confidence: &[f64], accepted: usize) {
        // Token i was tried only if 0..i were accepted: count tries up to the first rejection.
        let tried = (accepted + 1).min(confidence.len());
        self.predicted = Self::MEMORY * self.predicted + confidence[..tried].iter().sum::<f64>();
        self.accepted = Self::MEMORY * self.accepted + accepted as f64;
    }
}

/// A drafter whose calls cost more than this share of a model step sits out after calls that
/// brought no accepted token.
const COSTLY_SHARE: f64 = 0.02;

/// Longest rest, in steps, of a costly drafter that keeps missing.
const MAX_REST: usize = 64;

/// A drafter's current run: its draft tokens the model accepted in a row (across passes,
/// back to 0 at a rejection). The local evidence that it is being followed.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    accepted: usize,
}

/// Accepted tokens in a row before the run's estimate is used at all (one accepted pass of a
/// short draft is no evidence of copying).
const MIN_RUN: usize = 4;

impl Run {
    /// After a pass of this drafter's draft of `drafted` tokens, `accepted` of them kept.
    fn record(&mut self, drafted: usize, accepted: usize) {
        self.accepted = if accepted == drafted {
            self.accepted + accepted
        } else {
            0
        };
    }

    /// The chance that the next draft token is accepted given the run: the rule of
    /// succession, `(s + 1) / (s + 2)` for `s` tokens accepted in a row; 0 before
    /// [`MIN_RUN`].
    fn confidence(&self) -> f64 {
        if self.accepted < MIN_RUN {
            return 0.0;
        }
        let s = self.accepted as f64;
        (s + 1.0) / (s + 2.0)
    }
}

/// What the loop knows about one drafter: its calibration, its current run, what its calls
/// cost, and how long it sits out. A drafter that is cheap next to a model step (prompt lookup, microseconds) is asked
/// every step; a costly one (a suffix-array search over a large corpus) that keeps proposing
/// nothing useful rests for 1, 3, 7, … (2^misses − 1, at most 64) steps, and is asked every
/// step again once it helps.
#[derive(Clone, Debug)]
struct DrafterState {
    calibration: Calibration,
    run: Run,
    calls: usize,
    seconds: f64,
    /// Consecutive calls that brought no accepted token.
    misses: u32,
    /// Steps left to sit out.
    rest: usize,
    /// Asked in the current step.
    asked: bool,
}

impl DrafterState {
    fn new() -> Self {
        DrafterState {
            calibration: Calibration::new(),
            run: Run::default(),
            calls: 0,
            seconds: 0.0,
            misses: 0,
            rest: 0,
            asked: false,
        }
    }

    /// After a step: `accepted` tokens came from this drafter's draft.
    fn settle(&mut self, accepted: usize, step_seconds: f64) {
        if !std::mem::take(&mut self.asked) {
            return;
        }
        if accepted > 0 {
            self.misses = 0;
            return;
        }
        self.misses += 1;
        let call = self.seconds / self.calls.max(1) as f64;
        if call > COSTLY_SHARE * step_seconds {
            self.rest = (1usize << self.misses.min(16)).min(MAX_REST) - 1;
        }
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
    let Some((&last, head)) = prompt.split_last() else {
        return Err(Error::input("the model needs a non-empty prompt"));
    };
    let start = Instant::now();
    let mut stats = DecodeStats::default();
    let mut states = vec![DrafterState::new(); drafters.len()];
    let mut cost = cfg.cost.clone();
    let eos = model.eos_tokens().to_vec();
    let mut context = prompt.to_vec();
    for p in processors.iter_mut() {
        p.start(prompt);
    }
    model.clear();
    if !head.is_empty() {
        model.feed(head)?;
    }
    stats.prompt_seconds = start.elapsed().as_secs_f64();
    stats.model_seconds += stats.prompt_seconds;
    // `pending` is the last token of the context, not yet fed to the model.
    let mut pending = last;
    // Scratch space of verification: the row's probabilities and the sampler's weights.
    let mut weights = Vec::new();
    let mut done = false;
    // Without drafters nothing needs the pass times (the cost model plans drafts): a step of a
    // cheap scorer (the ∞-gram, about a microsecond) is not worth two clock reads.
    let timed = !drafters.is_empty() || cfg.trace;
    let mut fed = Vec::with_capacity(cfg.draft_max + 1);
    let mut support = Vec::new();
    while !done && stats.tokens < cfg.max_tokens {
        if cfg.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
            stats.cancelled = true;
            break;
        }
        let budget = cfg.max_tokens - stats.tokens;
        let t = timed.then(Instant::now);
        let (draft, chosen) = plan_draft(
            drafters,
            &mut states,
            processors,
            &context,
            &cost,
            cfg,
            budget,
        )?;
        if let Some(t) = t {
            stats.draft_seconds += t.elapsed().as_secs_f64();
        }

        fed.clear();
        fed.push(pending);
        fed.extend_from_slice(&draft.tokens);
        let cached = model.cache_len();
        let t = timed.then(Instant::now);
        let mut rows = model.score_first(&fed, FIRST_ROWS)?;
        let mut pass_seconds = t.map_or(0.0, |t| t.elapsed().as_secs_f64());
        stats.passes += 1;
        let tokens_before = stats.tokens;

        // Verify left to right; row i predicts the token after fed[i]. Rows past the first
        // ones are asked for as verification reaches them (`LanguageModel::score_first`).
        let mut accepted = 0;
        for i in 0..fed.len() {
            if i == rows.len() {
                let t = timed.then(Instant::now);
                let more = model.score_more(rows.len().max(FIRST_ROWS))?;
                pass_seconds += t.map_or(0.0, |t| t.elapsed().as_secs_f64());
                if more.is_empty() {
                    return Err(Error::Model(format!(
                        "the model returned {i} of a pass's {} rows",
                        fed.len()
                    )));
                }
                rows.extend(more);
            }
            let logits = &mut rows[i];
            // A sparse row's support, kept in case the processors mask all of it.
            support.clear();
            if let (false, Logits::Sparse { entries, .. }) = (processors.is_empty(), &*logits) {
                support.extend(entries.iter().map(|e| e.0));
            }
            for p in processors.iter_mut() {
                p.process(&context, logits);
            }
            // Every candidate was masked: ask the model for wider distributions, each with a
            // candidate outside every support masked so far (so this ends).
            while !logits.has_support() {
                let Some(mut wider) = model.backoff(&context, &support)? else {
                    break;
                };
                wider.support_into(&mut support);
                for p in processors.iter_mut() {
                    p.process(&context, &mut wider);
                }
                stats.backoffs += 1;
                *logits = wider;
            }
            if !logits.has_support() {
                stats.exhausted = true;
                done = true;
                break;
            }
            let proposal = draft.tokens.get(i).copied();
            let (token, is_draft) = verify(sampler, logits, proposal, &mut weights)?;
            if eos.contains(&token) {
                done = true;
                break;
            }
            context.push(token);
            stats.tokens += 1;
            on_token(token);
            if !is_draft {
                break;
            }
            accepted += 1;
            if stats.tokens >= cfg.max_tokens {
                break;
            }
        }
        model.recycle(rows);
        if timed {
            stats.model_seconds += pass_seconds;
            cost.observe(fed.len(), pass_seconds);
        }
        if cfg.trace {
            stats.trace.push(PassTrace {
                at: tokens_before,
                drafter: chosen.map(|d| drafters[d].name().to_string()),
                drafted: draft.tokens.len(),
                accepted,
                emitted: stats.tokens - tokens_before,
                seconds: pass_seconds,
            });
        }
        if let Some(d) = chosen {
            stats.drafted_passes += 1;
            stats.drafted += draft.tokens.len();
            stats.accepted += accepted;
            states[d].calibration.record(&draft.confidence, accepted);
        }
        for (d, state) in states.iter_mut().enumerate() {
            // A run ends at a rejection, or when the model went on without this drafter.
            match chosen {
                Some(c) if c == d => state.run.record(draft.tokens.len(), accepted),
                _ => state.run = Run::default(),
            }
        }
        // A frozen cost model plans without the clock: no drafter rests for its call time.
        let step_seconds = if cost.is_frozen() {
            f64::INFINITY
        } else {
            (stats.model_seconds - stats.prompt_seconds) / stats.passes as f64
        };
        for (d, state) in states.iter_mut().enumerate() {
            let gained = if chosen == Some(d) { accepted } else { 0 };
            state.settle(gained, step_seconds);
        }
        // Keep the pending token and the accepted drafts; the last token of the context is
        // the new pending one. (When the budget ends on an accepted draft token, that token
        // stays in the cache too; the loop ends there.)
        model.truncate(cached + 1 + accepted);
        pending = *context.last().expect("non-empty");
        for d in drafters.iter_mut() {
            d.observe(&context);
        }
    }
    stats.seconds = start.elapsed().as_secs_f64();
    if !timed {
        // Everything but the sampler was the model.
        stats.model_seconds = stats.seconds;
    }
    Ok((context[prompt.len()..].to_vec(), stats))
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
/// in two in-process A/Bs (`bench_speculative`'s prompts, fastest of 3) 8 was 0.2–8% faster
/// than 4 on every set.
const FIRST_ROWS: usize = 8;

/// Expected speed-up at which the drafters after the one that offers it are not asked.
const GOOD_ENOUGH: f64 = 1.3;

/// Asks the drafters in order and keeps the draft (cut to its best length) with the highest expected
/// speed; `None` when no draft beats plain decoding.
fn plan_draft(
    drafters: &mut [Box<dyn Drafter>],
    states: &mut [DrafterState],
    processors: &mut [Box<dyn Processor>],
    context: &[u32],
    cost: &CostModel,
    cfg: &DecodeConfig,
    budget: usize,
) -> Result<(Draft, Option<usize>)> {
    let max = cfg.draft_max.min(budget.saturating_sub(1));
    let mut best: (Draft, Option<usize>, f64) = (Draft::default(), None, 1.0);
    if max == 0 {
        return Ok((best.0, None));
    }
    for (d, (drafter, state)) in drafters.iter_mut().zip(states.iter_mut()).enumerate() {
        if best.2 >= GOOD_ENOUGH {
            // An earlier (cheaper) drafter already has a good draft: skip the rest.
            break;
        }
        if state.rest > 0 {
            state.rest -= 1;
            continue;
        }
        let t = Instant::now();
        let mut draft = drafter.propose(context, max)?;
        state.seconds += t.elapsed().as_secs_f64();
        state.calls += 1;
        state.asked = true;
        draft.tokens.truncate(max);
        // Tokens a processor would mask cannot be accepted: cut the draft before them.
        for p in processors.iter_mut() {
            let admitted = p.admit(context, &draft.tokens);
            draft.tokens.truncate(admitted);
        }
        draft.confidence.truncate(draft.tokens.len());
        let f = state.calibration.factor();
        let local = if cfg.local_evidence {
            state.run.confidence()
        } else {
            0.0
        };
        let calibrated: Vec<f64> = draft
            .confidence
            .iter()
            .map(|c| (c * f).max(local).min(0.99))
            .collect();
        let (k, speed) = cost.best_length(&calibrated);
        if k > 0 && speed > best.2 {
            draft.tokens.truncate(k);
            draft.confidence.truncate(k);
            best = (draft, Some(d), speed);
        }
    }
    Ok((best.0, best.1))
}

/// Decides the token at one position: the draft token if verification accepts it, otherwise
/// the model's own choice. Returns (token, whether it is the draft token). Greedy decoding
/// takes the argmax of the logits directly (the sampler's argmax of the softmax, smallest id
/// among ties), saving a softmax per position; a sparse row is sampled over its support. An
/// error when every token has probability 0 (processors masked them all).
fn verify(
    sampler: &mut Sampler,
    logits: &Logits,
    proposal: Option<u32>,
    weights: &mut Vec<(u32, f64)>,
) -> Result<(u32, bool)> {
    let nothing = || Error::input("no token can come next: every candidate has probability 0");
    if sampler.is_greedy() {
        let target = logits.argmax().ok_or_else(nothing)?;
        return Ok((target, proposal == Some(target)));
    }
    sampler.target_weights_of(logits, weights);
    if let Some(x) = proposal {
        let total: f64 = weights.iter().map(|w| w.1).sum();
        let px = weights.iter().find(|w| w.0 == x).map_or(0.0, |w| w.1) / total;
        if sampler.uniform() < px {
            return Ok((x, true));
        }
        // Rejected: sample from p with x removed and renormalized.
        weights.retain(|w| w.0 != x);
    }
    let token = sampler.draw_weighted(weights).ok_or_else(nothing)?;
    Ok((token, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_follows_recent_passes_and_never_locks() {
        let mut c = Calibration::new();
        assert_eq!(c.factor(), 1.0);
        for _ in 0..30 {
            c.record(&[0.9; 4], 0);
        }
        assert!(
            c.factor() < 0.35,
            "a bad stretch lowers the factor: {}",
            c.factor()
        );
        assert!(c.factor() >= Calibration::FLOOR);
        for _ in 0..30 {
            c.record(&[0.5; 4], 4);
        }
        assert!(
            c.factor() > 1.5,
            "and it is forgotten once drafts work: {}",
            c.factor()
        );
    }

    #[test]
    fn a_run_grows_while_drafts_are_accepted_and_ends_at_a_rejection() {
        let mut run = Run::default();
        run.record(2, 2);
        assert_eq!(run.confidence(), 0.0, "two tokens are no evidence yet");
        run.record(6, 6);
        assert_eq!(run.accepted, 8);
        assert!((run.confidence() - 0.9).abs() < 1e-12);
        run.record(8, 8);
        assert!(run.confidence() > 0.94);
        run.record(8, 5);
        assert_eq!((run.accepted, run.confidence()), (0, 0.0));
    }

    #[test]
    fn best_length_trades_confidence_against_pass_cost() {
        let cost = CostModel::default();
        assert_eq!(cost.best_length(&[]), (0, 1.0));
        // Weak drafts are not worth a longer pass.
        assert_eq!(cost.best_length(&[0.05, 0.05]).0, 0);
        // Sure drafts are taken in full.
        assert_eq!(cost.best_length(&[0.99; 8]).0, 8);
        // A confident head and a weak tail: only the head.
        assert_eq!(cost.best_length(&[0.95, 0.95, 0.95, 0.95, 0.1, 0.1]).0, 4);
        assert!((cost.cost(1) - 1.0).abs() < 1e-12);
        assert!(cost.cost(3) > cost.cost(2) && cost.cost(20) > cost.cost(16));
    }

    #[test]
    fn measured_pass_costs_replace_the_prior() {
        let mut cost = CostModel::default();
        let prior = cost.cost(4);
        for _ in 0..MIN_TIMED {
            cost.observe(1, 0.010);
            cost.observe(4, 0.030);
        }
        assert!(
            (cost.cost(4) - 3.0).abs() < 1e-9,
            "{} (prior {prior})",
            cost.cost(4)
        );
        // Untimed sizes keep the prior, raised to the measured cost of a smaller pass (the
        // prior says 8 tokens cost 2.5 steps, but 4 were measured at 3); a draft worth 3
        // tokens under the prior is cut to 2.
        assert_eq!(cost.cost(8), 3.0);
        assert_eq!(cost.cost(16), CostModel::default().cost(16));
        assert_eq!(CostModel::default().best_length(&[0.9; 3]).0, 3);
        assert_eq!(cost.best_length(&[0.9; 3]).0, 2);
    }

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
}
