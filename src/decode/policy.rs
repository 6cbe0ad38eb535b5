//! The drafting policy: which drafter's draft a pass verifies, and how much of it. Three
//! scales of evidence decide: each draft token's confidence as its drafter gives it; the
//! drafter's record (a `Calibration` of predicted against accepted tokens, forgetting old
//! passes); and its current run of accepted tokens (`Run`, the rule of succession). The
//! [`CostModel`] turns those chances into the draft length that maximizes expected tokens per
//! unit of time, from measured pass costs. A costly drafter that keeps missing rests for a
//! while (`DrafterState`).
//!
//! # In detail
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
//! source (`bench_decode speculative` prints both policies, and plots tokens per pass with `--plot-dir`).
//! Prompt lookup also keeps the copy's place in the source: it follows the source position while
//! the model writes the source's next token, and remembers where the copy broke off when it does
//! not. For 24 tokens after a break, a short match (under 4 tokens) whose continuation lies at
//! most 8 source tokens past the break is taken as the copy resuming after a changed word, and
//! drafts with the confidence of a match 4 tokens longer; 4 tokens seen before restart the copy
//! (nearest after the break). `CostModel::frozen` plans drafts from the prior table alone and lets
//! no drafter rest for its call time, so greedy decoding makes the same passes in every run:
//! `bench_decode policy` weighs those passes with the table, a speed-up free of timing noise
//! for comparing policies.
//!

use super::{DecodeConfig, Draft, Drafter, Processor};
use crate::error::Result;
use std::time::Instant;

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
    /// Rows of other sequences expected in the next pass ([`CostModel::beside`]).
    beside: usize,
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

/// The share of the best tokens per unit of time over the calibrated pass sizes that
/// [`CostModel::rows_worth_batching`] settles for.
pub const BATCH_GAIN_SHARE: f64 = 0.9;

/// Pass sizes a calibration times ([`calibrate`]).
pub const CALIBRATED_SIZES: [usize; 5] = [1, 2, 4, 8, 16];

/// The pass costs of `model` on this machine: the median of `repeats` passes of each of
/// [`CALIBRATED_SIZES`] new tokens after a 128-token context, as `(n, milliseconds)`
/// ([`CostModel::from_ms`] reads them). The model's cache is cleared after. What the decode
/// loop plans its first drafts with, before its own passes are timed.
///
/// The sizes are timed in rounds, one pass of each size a round (after a round of warm-up),
/// so that a slow spell of a shared machine falls on every size alike instead of on the one
/// being timed: the drafts are planned from the ratios.
pub fn calibrate(
    model: &mut dyn crate::lm::LanguageModel,
    repeats: usize,
) -> Result<Vec<(usize, f64)>> {
    let vocab = model.vocab_size().max(1) as u32;
    let context: Vec<u32> = (0..128u32).map(|i| (i * 7919 + 13) % vocab).collect();
    model.clear();
    model.feed(&context)?;
    let inputs: Vec<Vec<u32>> = CALIBRATED_SIZES
        .iter()
        .map(|&n| (0..n as u32).map(|i| (i * 104_729 + 7) % vocab).collect())
        .collect();
    let mut times = vec![Vec::with_capacity(repeats.max(1)); CALIBRATED_SIZES.len()];
    for round in 0..repeats.max(1) + 1 {
        for (tokens, times) in inputs.iter().zip(times.iter_mut()) {
            let t = Instant::now();
            model.score(tokens)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            model.truncate(context.len());
            if round > 0 {
                times.push(ms);
            }
        }
    }
    model.clear();
    Ok(CALIBRATED_SIZES
        .iter()
        .zip(times.iter_mut())
        .map(|(&n, times)| {
            times.sort_by(f64::total_cmp);
            (n, times[times.len() / 2])
        })
        .collect())
}

/// How [`calibrate`] times the passes, for the key of a file that keeps its figures: a file
/// timed another way is timed again. Change it with the method.
pub const CALIBRATION_METHOD: &str = "sizes in rounds";

/// Whether `(n, milliseconds)` pairs read back from a file are ones [`calibrate`] could have
/// measured: the [`CALIBRATED_SIZES`] in order, each time finite and between a microsecond
/// and a minute, and each pass neither cheaper than an eighth of a single step nor dearer than
/// `8·n` of them (a busy machine's medians have put a 2-token pass at a third of a step).
/// Anything else plans drafts on what no machine does (a pass of 16 tokens for free, or single
/// steps dearer than any draft), and is measured again.
pub fn plausible_costs(points: &[(usize, f64)]) -> bool {
    let sizes_match = points.len() == CALIBRATED_SIZES.len()
        && points.iter().zip(CALIBRATED_SIZES).all(|(p, n)| p.0 == n);
    if !sizes_match || !points.iter().all(|p| (1e-3..=60_000.0).contains(&p.1)) {
        return false;
    }
    let step = points[0].1;
    points
        .iter()
        .all(|&(n, ms)| ms >= step / 8.0 && ms <= 8.0 * n as f64 * step)
}

impl CostModel {
    /// From measured `(n, milliseconds)` pairs, n ascending from 1; a pass that costs less
    /// than a smaller one is read at the smaller one's cost. More rows never cost less, but a
    /// noisy calibration can say so (a busy 2-vCPU Xeon measured 4 rows at 1.34 steps and 2
    /// at 1.42, where 15 repeats gave 1.59 and 1.15), and planned from such a table a 3-token
    /// draft looks cheaper than a 1-token one.
    pub fn from_ms(points: &[(usize, f64)]) -> CostModel {
        let base = points[0].1;
        let mut dearest = 1.0f64;
        CostModel {
            points: points
                .iter()
                .map(|&(n, ms)| {
                    dearest = dearest.max(ms / base);
                    (n, dearest)
                })
                .collect(),
            observed: Vec::new(),
            frozen: false,
            beside: 0,
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

    /// Plans the next passes beside `rows` rows of other sequences (a model serving several
    /// at once, [`crate::lm::LanguageModel::rows_beside`]), for the tokens of all of them: a
    /// pass of `b` others' rows and one of this sequence's gives `b + 1` tokens in `T(b + 1)`;
    /// with `n` rows of this one it takes `T(b + n)`, and its draft must make up for what
    /// every sequence lost, so `n` rows cost `(b + 1)·T(b + n)/T(b + 1) − b` steps (`T(n)/T(1)`
    /// alone). So drafts shrink as a batch fills where rows cost more as they grow (a CPU
    /// past four rows), and stay where they cost nothing (a GPU). 0: a pass of its own.
    pub fn beside(&mut self, rows: usize) {
        self.beside = rows;
    }

    /// Records that a pass over `n` tokens took `seconds` (nothing when frozen, or when the
    /// pass was shared: its time is the other sequences' too).
    pub fn observe(&mut self, n: usize, seconds: f64) {
        if self.frozen || self.beside > 0 {
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

    /// Relative cost of a pass over `n` tokens of this sequence: measured if timed enough,
    /// else the prior, but never below the measured cost of a smaller pass (the prior's scale
    /// may be off); beside other sequences' rows, what the `n` rows cost them all
    /// ([`CostModel::beside`]).
    pub fn cost(&self, n: usize) -> f64 {
        match self.beside {
            0 => self.alone(n),
            b => {
                let b1 = (b + 1) as f64;
                (b1 * self.alone(b + n) / self.alone(b + 1) - b as f64).max(1.0)
            }
        }
    }

    /// [`CostModel::cost`] of a pass of this sequence alone.
    fn alone(&self, n: usize) -> f64 {
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

    /// The fewest rows a pass should take to give nearly all that passes can: the smallest
    /// of [`CALIBRATED_SIZES`] whose tokens per unit of time, `n / cost(n)`, reach
    /// [`BATCH_GAIN_SHARE`] of the best of them. Where each further row costs a step's share
    /// (a CPU past its knee) more rows only make every sequence slower; where rows are nearly
    /// free (a GPU) it is the largest size.
    pub fn rows_worth_batching(&self) -> usize {
        let rate = |n: usize| n as f64 / self.alone(n);
        let best = CALIBRATED_SIZES
            .iter()
            .map(|&n| rate(n))
            .fold(0.0, f64::max);
        CALIBRATED_SIZES
            .into_iter()
            .find(|&n| rate(n) >= BATCH_GAIN_SHARE * best)
            .unwrap_or(1)
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

    /// Whether its calls cost under [`COSTLY_SHARE`] of a step of `step_seconds`.
    fn is_cheap(&self, step_seconds: f64) -> bool {
        self.seconds / (self.calls.max(1) as f64) < COSTLY_SHARE * step_seconds
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

/// A drafter's draft in one step: as proposed (cut where processors refuse it), with its
/// calibrated confidences, the length of its best prefix and that prefix's expected speed.
#[derive(Clone, Debug)]
struct Offer {
    draft: Draft,
    drafter: usize,
    calibrated: Vec<f64>,
    best_len: usize,
    speed: f64,
}

impl Offer {
    /// The first `k` tokens.
    fn cut(mut self, k: usize) -> Offer {
        self.draft.tokens.truncate(k);
        self.draft.confidence.truncate(k);
        self.draft.parts.truncate(k);
        self.calibrated.truncate(k);
        self
    }
}

/// A branch of a draft tree: `draft` follows the main draft's first `at` tokens, in place of
/// its token `at`.
#[derive(Clone, Debug)]
pub(super) struct Branch {
    pub at: usize,
    pub draft: Draft,
    pub drafter: usize,
}

/// What a step verifies: the main draft (from drafter `chosen`), and branches off it.
#[derive(Clone, Debug, Default)]
pub(super) struct Planned {
    pub draft: Draft,
    pub chosen: Option<usize>,
    pub branches: Vec<Branch>,
}

/// Expected speed-up at which the drafters after the one that offers it are not asked.
const GOOD_ENOUGH: f64 = 1.3;

/// The policy's state over one generation: what it knows of each drafter and of pass costs.
pub(super) struct DraftPolicy {
    states: Vec<DrafterState>,
    cost: CostModel,
    /// Seconds of a model step so far (infinite until measured, or with a frozen cost model).
    step: f64,
}

impl DraftPolicy {
    /// A policy for `drafters` drafters, planning from `cost`.
    pub(super) fn new(drafters: usize, cost: CostModel) -> Self {
        DraftPolicy {
            states: vec![DrafterState::new(); drafters],
            cost,
            step: f64::INFINITY,
        }
    }

    /// Plans beside `rows` rows of other sequences ([`CostModel::beside`]).
    pub(super) fn beside(&mut self, rows: usize) {
        self.cost.beside(rows);
    }

    /// Asks the drafters in order and keeps the draft (cut to its best length) with the
    /// highest expected speed; `None` when no draft beats plain decoding. `budget`: tokens
    /// the generation may still add. With `tree_rows` (the rows a tree pass may have; 0: no
    /// trees), the other drafts asked become branches of the best where they part from it and
    /// pay for their rows ([`DraftPolicy::branches`]).
    pub(super) fn plan(
        &mut self,
        drafters: &mut [Box<dyn Drafter>],
        processors: &mut [Box<dyn Processor>],
        context: &[u32],
        cfg: &DecodeConfig,
        budget: usize,
        tree_rows: usize,
    ) -> Result<Planned> {
        let trees = tree_rows > 0;
        let max = cfg.draft_max.min(budget.saturating_sub(1));
        let mut offers: Vec<Offer> = Vec::new();
        let mut best: Option<usize> = None;
        let best_speed =
            |offers: &[Offer], best: Option<usize>| best.map_or(1.0, |b| offers[b].speed);
        if max == 0 {
            return Ok(Planned::default());
        }
        for (d, (drafter, state)) in drafters.iter_mut().zip(self.states.iter_mut()).enumerate() {
            if best_speed(&offers, best) >= GOOD_ENOUGH && !(trees && state.is_cheap(self.step)) {
                // An earlier (cheaper) drafter already has a good draft: skip the rest (but
                // for a tree, ask the cheap ones too: their drafts may branch).
                continue;
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
            draft.parts.truncate(draft.tokens.len());
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
            let (k, speed) = self.cost.best_length(&calibrated);
            if k > 0 && speed > best_speed(&offers, best) {
                best = Some(offers.len());
            }
            offers.push(Offer {
                draft,
                drafter: d,
                calibrated,
                best_len: k,
                speed,
            });
        }
        let Some(b) = best else {
            return Ok(Planned::default());
        };
        // Branches are cut from the other offers as they were proposed.
        let main = if trees {
            offers[b].clone()
        } else {
            offers.swap_remove(b)
        };
        let main = {
            let k = main.best_len;
            main.cut(k)
        };
        let branches = if trees {
            self.branches(&main, &offers, tree_rows)
        } else {
            Vec::new()
        };
        Ok(Planned {
            chosen: Some(main.drafter),
            draft: main.draft,
            branches,
        })
    }

    /// Branches for the tree of `main`: each other offer that parts from it at position `a`
    /// (the same `a` tokens, then another) hangs off there, as long as its prefix that most
    /// raises the expected speed, if any does: the chance to reach it is that of accepting
    /// `main`'s first `a` tokens and rejecting its next, times the branch's own chances.
    /// At most `max_rows` rows in all (the pending token's, and a padding row counted for
    /// each branch).
    fn branches(&self, main: &Offer, offers: &[Offer], max_rows: usize) -> Vec<Branch> {
        let m = &main.draft.tokens;
        let mut reach = vec![1.0];
        for c in &main.calibrated {
            reach.push(reach.last().copied().unwrap_or(1.0) * c);
        }
        let mut expected: f64 = reach.iter().sum();
        let mut rows = 1 + m.len();
        let mut speed = expected / self.cost.cost(rows);
        let mut out: Vec<Branch> = Vec::new();
        for o in offers.iter().filter(|o| o.drafter != main.drafter) {
            let t = &o.draft.tokens;
            let a = crate::lm::common_start(m, t);
            if a >= m.len()
                || a >= t.len()
                || out.iter().any(|b| b.at == a && b.draft.tokens[0] == t[a])
            {
                continue;
            }
            let mut r = reach[a] * (1.0 - main.calibrated[a]);
            let (mut gain, mut best) = (0.0, (0, 0.0, speed));
            for j in a..t.len() {
                r *= o.calibrated[j];
                gain += r;
                let n = rows + (j - a + 1) + 1;
                if n > max_rows {
                    break;
                }
                let s = (expected + gain) / self.cost.cost(n);
                if s > best.2 {
                    best = (j - a + 1, gain, s);
                }
            }
            let (len, gained, s) = best;
            if len == 0 {
                continue;
            }
            let mut draft = o.draft.clone();
            draft.tokens = t[a..a + len].to_vec();
            draft.confidence = draft.confidence[a..a + len].to_vec();
            draft.parts = draft
                .parts
                .get(a..a + len)
                .map_or(Vec::new(), <[u8]>::to_vec);
            out.push(Branch {
                at: a,
                draft,
                drafter: o.drafter,
            });
            expected += gained;
            rows += len + 1;
            speed = s;
        }
        out
    }

    /// After a pass in which `accepted` tokens of `planned`'s main draft were kept, and
    /// `branch`: the branch the accepted path went on in and its tokens kept there, if it left
    /// the main draft; `timing` is the pass's (tokens fed, seconds) when passes are timed, and
    /// `mean_step_seconds` the mean time of a model step so far.
    pub(super) fn learn(
        &mut self,
        planned: &Planned,
        accepted: usize,
        branch: Option<(usize, usize)>,
        timing: Option<(usize, f64)>,
        mean_step_seconds: f64,
    ) {
        if let Some((fed, seconds)) = timing {
            self.cost.observe(fed, seconds);
        }
        let draft = &planned.draft;
        let chosen = planned.chosen;
        if let Some(d) = chosen {
            self.states[d]
                .calibration
                .record(&draft.confidence, accepted);
        }
        // The drafter of the branch taken: its own draft from where it parted.
        let taken = branch.map(|(b, kept)| (&planned.branches[b], kept));
        if let Some((b, kept)) = taken {
            self.states[b.drafter]
                .calibration
                .record(&b.draft.confidence, kept);
        }
        for (d, state) in self.states.iter_mut().enumerate() {
            // A run ends at a rejection, or when the model went on without this drafter.
            match (chosen, taken) {
                (_, Some((b, kept))) if b.drafter == d => {
                    state.run.record(b.draft.tokens.len(), kept)
                }
                (Some(c), _) if c == d => state.run.record(draft.tokens.len(), accepted),
                _ => state.run = Run::default(),
            }
        }
        // A frozen cost model plans without the clock: no drafter rests for its call time.
        let step_seconds = if self.cost.is_frozen() || mean_step_seconds <= 0.0 {
            f64::INFINITY
        } else {
            mean_step_seconds
        };
        self.step = step_seconds;
        for (d, state) in self.states.iter_mut().enumerate() {
            let mut gained = if chosen == Some(d) { accepted } else { 0 };
            if let Some((_, kept)) = taken.filter(|(b, _)| b.drafter == d) {
                gained += kept;
            }
            state.settle(gained, step_seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_the_rows_that_still_pay() {
        // AVX-512 VNNI on a 2-vCPU Zen 4, Qwen2.5-Coder 0.5B: 16 rows give 5% more tokens
        // per second than 8, each sequence half the speed.
        let zen4 = [(1, 13.81), (2, 14.5), (4, 16.3), (8, 21.96), (16, 41.8)];
        assert_eq!(CostModel::from_ms(&zen4).rows_worth_batching(), 8);
        // Rows nearly free (a GPU): the largest pass.
        let flat = [(1, 10.0), (2, 10.0), (4, 10.0), (8, 10.5), (16, 11.0)];
        assert_eq!(CostModel::from_ms(&flat).rows_worth_batching(), 16);
        // Each row a whole step: no batch pays.
        let linear = [(1, 10.0), (2, 20.0), (4, 40.0), (8, 80.0), (16, 160.0)];
        assert_eq!(CostModel::from_ms(&linear).rows_worth_batching(), 1);
        // The built-in table (SmolLM2 on the development machine): 8 rows at 14.0 ms give
        // 3.3 steps' tokens, 16 at 25.6 ms 3.6.
        assert_eq!(CostModel::default().rows_worth_batching(), 8);
    }

    /// Pass costs read back from a calibration file are taken only when a machine could have
    /// measured them: the built-in table, a GPU's flat costs and a slow machine's pass; not
    /// absurd times, free drafts, steps dearer than drafts, other sizes or NaN.
    #[test]
    fn implausible_pass_costs_are_measured_again() {
        let table = [(1, 5.7), (2, 6.1), (4, 8.6), (8, 14.0), (16, 25.6)];
        assert!(plausible_costs(&table));
        assert!(plausible_costs(&[
            (1, 0.2),
            (2, 0.2),
            (4, 0.21),
            (8, 0.2),
            (16, 0.22)
        ]));
        assert!(plausible_costs(&[
            (1, 900.0),
            (2, 1000.0),
            (4, 1300.0),
            (8, 2e3),
            (16, 4e3)
        ]));
        // A busy machine's medians (a calibration written while two test suites ran).
        assert!(plausible_costs(&[
            (1, 14.4),
            (2, 4.4),
            (4, 19.0),
            (8, 28.7),
            (16, 40.0)
        ]));
        let with = |i: usize, ms: f64| {
            let mut p = table;
            p[i].1 = ms;
            p
        };
        for (i, ms) in [
            (0, 1e30),
            (4, 1e30),
            (4, 1e-9),
            (4, 0.1),
            (0, 100.0),
            (2, f64::NAN),
            (1, f64::INFINITY),
            (3, -1.0),
        ] {
            assert!(!plausible_costs(&with(i, ms)), "{i} {ms}");
        }
        assert!(!plausible_costs(&table[..4]));
        let mut sizes = table;
        sizes[4].0 = 32;
        assert!(!plausible_costs(&sizes));
        assert!(!plausible_costs(&[(1, 1e30); 5]));
    }

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

    /// A calibration that says a larger pass costs less than a smaller one (noise) is read
    /// at the smaller one's cost: a longer draft is never planned as the cheaper one.
    #[test]
    fn a_larger_pass_never_costs_less_than_a_smaller_in_the_table() {
        // A calibration on a busy 2-vCPU Xeon (AVX2 kernels, Qwen2.5-Coder 0.5B).
        let noisy = [(1, 29.15), (2, 41.5), (4, 39.1), (8, 73.22), (16, 136.56)];
        let cost = CostModel::from_ms(&noisy);
        let at: Vec<f64> = (1..=20).map(|n| cost.cost(n)).collect();
        assert!(at.windows(2).all(|w| w[1] >= w[0]), "{at:?}");
        assert!((cost.cost(4) - 41.5 / 29.15).abs() < 1e-12);
        // A draft whose first token is a long shot and whose next ones would follow: with 4
        // rows read at their table cost (1.34 steps) its three tokens looked worth a pass.
        assert_eq!(cost.best_length(&[0.25, 0.385, 0.708]).0, 0);
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

    /// Beside other sequences' rows a draft costs what it takes from all of them: on the
    /// CPU's table (8 rows 2.5 steps, 16 rows 4.5) a draft of 3 that pays alone does not
    /// beside 7 rows; on a flat table (a GPU) it costs nothing more beside them; passes
    /// shared with others teach the table nothing.
    #[test]
    fn drafts_beside_other_sequences_pay_for_what_they_add() {
        let mut cost = CostModel::default();
        let alone = cost.best_length(&[0.8; 3]);
        cost.beside(7);
        let prior = CostModel::default();
        assert!((cost.cost(1) - 1.0).abs() < 1e-12);
        let want = 8.0 * prior.cost(11) / prior.cost(8) - 7.0;
        assert!((cost.cost(4) - want).abs() < 1e-12, "{}", cost.cost(4));
        let shared = cost.best_length(&[0.8; 3]);
        assert_eq!(alone.0, 3);
        assert_eq!(shared.0, 0, "{shared:?} beside 7 rows, {alone:?} alone");
        let mut flat = CostModel::from_ms(&[(1, 1.0), (64, 1.0)]);
        flat.beside(7);
        assert_eq!(flat.best_length(&[0.8; 3]).0, 3);
        for _ in 0..MIN_TIMED {
            cost.observe(1, 0.010);
            cost.observe(4, 0.011);
        }
        cost.beside(0);
        assert_eq!(
            cost.cost(4),
            prior.cost(4),
            "a shared pass's time was learned"
        );
    }
}
