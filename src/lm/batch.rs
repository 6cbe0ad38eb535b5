//! Several generations on one model at once (continuous batching): a [`Batcher`] owns a model
//! that holds several sequences ([`super::Sequences`]) on its own thread and hands out
//! [`SequenceModel`]s, each a [`LanguageModel`] over one sequence. Each generation runs its own
//! decode loop (speculative decoding, trees, sampling, stop strings, the guard: every mode as
//! it is) on its own thread; when the loops ask for passes at the same time, their new tokens
//! go through the model in one pass, each sequence attending to its own cache.
//!
//! The pass of several sequences gives every row the bits of the same row scored alone (the
//! model's promise, [`super::Sequences::score_parts`]), so a generation's tokens do not depend on the
//! others that share its passes: an answer is the same under any load.
//!
//! Kept prompts (prefix caching): a sequence that ends keeps its cache, cut to the tokens it
//! is known to hold, within a bound of bytes ([`Batcher::keep_prompts`]; the oldest go first).
//! A new sequence's first tokens read start from a copy of the kept cache that shares the
//! most of them, and only the rest are read: a chat's next turn rereads none of the
//! conversation, and requests that share a system prompt read it once. The kept positions are the bits the
//! sequence would compute (a position's keys and values do not depend on the pass that
//! computed them), so a generation's tokens are the same with or without them.
//!
//! When to run a pass: the batcher takes the first request for a pass, then waits until every
//! sequence of the last pass that is still held has asked again (every held sequence, before
//! a first pass), or for [`Batcher::WINDOW`] at most: a loop that samples or drafts between
//! its passes asks again within microseconds; one that does slower work, or a sequence held
//! but idle, is not waited for again once a pass went without it. Operations on one sequence (cutting its cache back, the held rows of a pass, a
//! token tree) run between passes, in the order each sequence sent them.

use super::{LanguageModel, Logits, RowForm, SeqPart};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a sequence's operation answers: its rows (none for most), the sequence's cache length
/// after it, and for a pass the rows of the other sequences in it.
type Answer = (Result<Vec<Logits>>, usize, Option<usize>);

/// An operation on one sequence, run between passes on the selected sequence.
type Op = Box<dyn FnOnce(&mut dyn LanguageModel) -> Result<Vec<Logits>> + Send>;

enum Call {
    /// New tokens of a sequence for the next pass; `first` rows' logits back now, in `form`.
    Score {
        seq: usize,
        tokens: Vec<u32>,
        first: usize,
        form: RowForm,
        reply: Sender<Answer>,
    },
    /// Anything else, on the sequence alone; answered when `reply` is given.
    Alone {
        seq: usize,
        op: Op,
        reply: Option<Sender<Answer>>,
    },
    /// A free sequence (a new one when none is free), with room for this many positions of
    /// its cache set aside ([`super::Sequences::reserve`]; 0: none).
    Acquire(usize, Sender<Result<usize>>),
    /// Sequence `seq`, empty, reads `tokens` first: it starts from a copy of the positions
    /// of them a kept cache holds (answered with their count).
    Adopt {
        seq: usize,
        tokens: Vec<u32>,
        reply: Sender<Answer>,
    },
    /// The sequence is free again; its cache holds these tokens (kept within the bound, or
    /// emptied).
    Release(usize, Vec<u32>),
    /// Bytes the kept caches may hold together.
    Keep(usize),
}

/// How the passes went: their count and the sequences they took together.
#[derive(Debug, Default)]
pub struct BatchStats {
    /// Passes run over the sequences' new tokens.
    pub passes: AtomicU64,
    /// The sequences those passes took, summed (over `passes`: the mean batch).
    pub sequences: AtomicU64,
    /// Sequences held by a live [`SequenceModel`].
    pub live: AtomicUsize,
    /// Tokens that sequences did not read because a kept cache held them.
    pub reused_tokens: AtomicU64,
    /// Tokens the kept caches hold now.
    pub kept_tokens: AtomicUsize,
}

/// The owner of a model of several sequences, on its own thread; cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    calls: Sender<Call>,
    stats: Arc<BatchStats>,
    about: Arc<About>,
}

/// What a sequence's model says of itself without a pass.
struct About {
    vocab: usize,
    eos: Vec<u32>,
    bos: Option<u32>,
    max_tree_rows: usize,
    cache_bytes_per_token: usize,
    cache_slack_tokens: usize,
}

impl Batcher {
    /// How long a pass waits for the sequences of the last pass that have not asked yet.
    pub const WINDOW: Duration = Duration::from_millis(1);

    /// Tokens of one sequence a pass takes at most: a long prompt goes through in passes of
    /// this many, and the other sequences' tokens go on between them instead of waiting for
    /// the whole prompt (the same bits: a position's logits do not depend on how its
    /// sequence was fed).
    pub const CHUNK: usize = 64;

    /// Bytes the caches of ended sequences may hold together by default
    /// ([`Batcher::keep_prompts`]).
    pub const KEPT_BYTES: usize = 256 << 20;

    /// Moves `model` onto the batcher's thread; an error if it holds one sequence only.
    pub fn start(model: Box<dyn LanguageModel + Send>) -> Result<Batcher> {
        Self::with(model, Self::WINDOW, Arc::default())
    }

    /// [`Batcher::start`] with another wait for the sequences that have not asked yet, its
    /// statistics kept in `stats` (a server reports them).
    pub fn with(
        mut model: Box<dyn LanguageModel + Send>,
        window: Duration,
        stats: Arc<BatchStats>,
    ) -> Result<Batcher> {
        let Some((cache_bytes_per_token, cache_slack_tokens)) = model
            .sequences()
            .map(|s| (s.cache_bytes_per_token(), s.cache_slack_tokens()))
        else {
            return Err(Error::Model(
                "this backend runs one sequence at a time; serve one request at a time with it \
                 (the native backend batches, on the CPU or a GPU)"
                    .into(),
            ));
        };
        let about = Arc::new(About {
            vocab: model.vocab_size(),
            eos: model.eos_tokens().to_vec(),
            bos: model.bos_token(),
            max_tree_rows: model.max_tree_rows(),
            cache_bytes_per_token,
            cache_slack_tokens,
        });
        let (calls, inbox) = channel();
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("infgram-batch".into())
            .spawn(move || {
                let spare = Spare::new(cache_bytes_per_token, cache_slack_tokens);
                serve(model.as_mut(), inbox, window, &thread_stats, spare)
            })
            .map_err(|e| Error::Model(format!("cannot start the batching thread: {e}")))?;
        Ok(Batcher {
            calls,
            stats,
            about,
        })
    }

    /// Bytes of cache a token of a sequence takes ([`super::Sequences::cache_bytes_per_token`]).
    pub fn cache_bytes_per_token(&self) -> usize {
        self.about.cache_bytes_per_token
    }

    /// Positions' worth of bytes a sequence from [`Batcher::sequence_for`] may hold beyond
    /// the room it was given ([`super::Sequences::cache_slack_tokens`]).
    pub fn cache_slack_tokens(&self) -> usize {
        self.about.cache_slack_tokens
    }

    /// How the passes went so far.
    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }

    /// Keeps the caches of ended sequences, `bytes` of them at most (the oldest go first; 0:
    /// none), for new sequences whose first tokens they start ([`Batcher::KEPT_BYTES`]
    /// until set).
    pub fn keep_prompts(&self, bytes: usize) -> Result<()> {
        self.calls.send(Call::Keep(bytes)).map_err(|_| stopped())
    }

    /// A sequence of its own, empty: a [`LanguageModel`] whose passes share the model's with
    /// the other live sequences'. Dropping it frees the sequence.
    pub fn sequence(&self) -> Result<SequenceModel> {
        self.sequence_for(0)
    }

    /// [`Batcher::sequence`] with room for `tokens` positions of its cache set aside at once
    /// (a request's prompt, `max_tokens` and drafts): while it stays within them it holds at
    /// most `tokens` plus [`Batcher::cache_slack_tokens`] positions' bytes, instead of up to
    /// twice what it holds as a cache grows.
    pub fn sequence_for(&self, tokens: usize) -> Result<SequenceModel> {
        let (tx, rx) = channel();
        self.calls
            .send(Call::Acquire(tokens, tx))
            .map_err(|_| stopped())?;
        let seq = rx.recv().map_err(|_| stopped())??;
        let (reply, answers) = channel();
        Ok(SequenceModel {
            seq,
            len: 0,
            cached: 0,
            known: Vec::new(),
            tree: None,
            fresh: true,
            fed_from_cache: 0,
            shared: true,
            beside: 0,
            held: std::collections::VecDeque::new(),
            calls: self.calls.clone(),
            reply,
            answers,
            about: self.about.clone(),
        })
    }
}

fn stopped() -> Error {
    Error::Model("the batching thread has stopped".into())
}

/// A sequence's new tokens waiting for the next pass.
struct Pending {
    seq: usize,
    tokens: Vec<u32>,
    first: usize,
    form: RowForm,
    reply: Sender<Answer>,
}

/// The sequences no [`SequenceModel`] holds: empty ones, and kept ones whose caches hold the
/// tokens an ended sequence left (oldest first), within `bound` bytes together.
struct Spare {
    empty: Vec<usize>,
    kept: Vec<(usize, Vec<u32>)>,
    bound: usize,
    token_bytes: usize,
    slack: usize,
}

impl Spare {
    /// Sequence 0, the model's own, empty.
    fn new(token_bytes: usize, slack: usize) -> Self {
        Spare {
            empty: vec![0],
            kept: Vec::new(),
            bound: Batcher::KEPT_BYTES,
            token_bytes,
            slack,
        }
    }

    /// What a kept cache of `tokens` positions holds at most.
    fn bytes(&self, tokens: usize) -> usize {
        (tokens + self.slack) * self.token_bytes
    }

    /// Empties kept caches, the oldest first, until they fit the bound.
    fn evict(&mut self, seqs: &mut dyn super::Sequences, stats: &BatchStats) {
        let mut held: usize = self.kept.iter().map(|(_, t)| self.bytes(t.len())).sum();
        while !self.kept.is_empty() && held > self.bound {
            let (seq, tokens) = self.kept.remove(0);
            held -= self.bytes(tokens.len());
            seqs.release(seq);
            self.empty.push(seq);
        }
        stats
            .kept_tokens
            .store(self.kept.iter().map(|(_, t)| t.len()).sum(), Relaxed);
    }
}

/// The batcher's thread: sequence operations as they come, passes over whoever asked.
fn serve(
    model: &mut dyn LanguageModel,
    inbox: Receiver<Call>,
    window: Duration,
    stats: &BatchStats,
    mut spare: Spare,
) {
    let mut pending: Vec<Pending> = Vec::new();
    // The sequences of the last pass still held: those a pass waits for.
    let mut recent: Vec<usize> = Vec::new();
    while let Ok(call) = inbox.recv() {
        let mut next = Some(call);
        let mut deadline: Option<Instant> = None;
        while let Some(call) = next.take() {
            if let Call::Release(seq, _) = &call {
                recent.retain(|s| s != seq);
            }
            take(model, call, &mut spare, &mut pending, stats);
            let all_asked = match recent.is_empty() {
                true => pending.len() >= stats.live.load(Relaxed),
                false => recent.iter().all(|s| pending.iter().any(|p| p.seq == *s)),
            };
            next = match (pending.is_empty(), all_asked) {
                // Nothing to pass yet: the next call, however long it takes.
                (true, _) => match inbox.recv() {
                    Ok(call) => Some(call),
                    Err(_) => return,
                },
                // Every sequence waited for asked: pass now.
                (false, true) => None,
                // Wait for the others, within the window.
                (false, false) => {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + window);
                    // (Past the window, or with every sender gone: pass what came.)
                    inbox
                        .recv_timeout(d.saturating_duration_since(Instant::now()))
                        .ok()
                }
            };
        }
        if !pending.is_empty() {
            recent = pending.iter().map(|p| p.seq).collect();
            run_pass(model, std::mem::take(&mut pending), stats);
        }
    }
}

/// Takes one call: a sequence's tokens wait for the pass, everything else runs now.
fn take(
    model: &mut dyn LanguageModel,
    call: Call,
    spare: &mut Spare,
    pending: &mut Vec<Pending>,
    stats: &BatchStats,
) {
    match call {
        Call::Score {
            seq,
            tokens,
            first,
            form,
            reply,
        } => pending.push(Pending {
            seq,
            tokens,
            first,
            form,
            reply,
        }),
        Call::Alone { seq, op, reply } => {
            let answer = run_alone(model, seq, op);
            if let Some(reply) = reply {
                let _ = reply.send(answer);
            }
        }
        Call::Acquire(tokens, reply) => {
            let seq = acquire(model, spare, tokens, stats);
            if seq.is_ok() {
                stats.live.fetch_add(1, Relaxed);
            }
            let _ = reply.send(seq);
        }
        Call::Adopt { seq, tokens, reply } => {
            let answer = adopt(model, spare, seq, &tokens, stats);
            let _ = reply.send(answer);
        }
        Call::Release(seq, tokens) => {
            release(model, spare, seq, tokens, stats);
            stats.live.fetch_sub(1, Relaxed);
        }
        Call::Keep(bytes) => {
            spare.bound = bytes;
            if let Some(s) = model.sequences() {
                spare.evict(s, stats);
            }
        }
    }
}

/// An empty sequence (a new one when none is; the oldest kept one, emptied, when the model
/// has no room for a new one), with room for `tokens` positions.
fn acquire(
    model: &mut dyn LanguageModel,
    spare: &mut Spare,
    tokens: usize,
    stats: &BatchStats,
) -> Result<usize> {
    let s = model.sequences().ok_or_else(stopped)?;
    let seq = match spare.empty.pop() {
        Some(seq) => seq,
        None => match s.add_sequence() {
            Ok(seq) => seq,
            Err(e) if spare.kept.is_empty() => return Err(e),
            Err(_) => {
                let (seq, _) = spare.kept.remove(0);
                s.release(seq);
                spare.evict(s, stats);
                seq
            }
        },
    };
    s.reserve(seq, tokens);
    Ok(seq)
}

/// Gives empty sequence `seq` the start of the kept cache that starts with the most of
/// `tokens` (the most recent of equals, which becomes the most recent kept): a copy of those
/// positions, in the room `seq` was given.
fn adopt(
    model: &mut dyn LanguageModel,
    spare: &mut Spare,
    seq: usize,
    tokens: &[u32],
    stats: &BatchStats,
) -> Answer {
    let best = (spare.kept.iter().enumerate())
        .map(|(i, (_, kept))| (super::common_start(kept, tokens), i))
        .max()
        .filter(|&(n, _)| n > 0);
    let (Some((n, i)), 0) = (best, cache_len(model, seq)) else {
        return (Ok(Vec::new()), cache_len(model, seq), None);
    };
    let kept = spare.kept.remove(i);
    let copied = match model.sequences() {
        Some(s) => s.copy_cache(kept.0, seq, n),
        None => Err(stopped()),
    };
    spare.kept.push(kept);
    if copied.is_ok() {
        stats.reused_tokens.fetch_add(n as u64, Relaxed);
    }
    (copied.map(|()| Vec::new()), cache_len(model, seq), None)
}

/// Frees sequence `seq`, whose cache holds `tokens` first: kept, cut to them, while the kept
/// caches fit their bound (a kept cache that starts the same tokens goes), else emptied.
fn release(
    model: &mut dyn LanguageModel,
    spare: &mut Spare,
    seq: usize,
    mut tokens: Vec<u32>,
    stats: &BatchStats,
) {
    tokens.truncate(cache_len(model, seq));
    let keep = !tokens.is_empty() && spare.bytes(tokens.len()) <= spare.bound;
    if keep {
        model.truncate(tokens.len());
    }
    let Some(s) = model.sequences() else {
        return;
    };
    if !keep {
        s.release(seq);
        spare.empty.push(seq);
        return;
    }
    s.fit(seq);
    let (starts, others): (Vec<_>, Vec<_>) = std::mem::take(&mut spare.kept)
        .into_iter()
        .partition(|(_, kept)| tokens.starts_with(kept));
    for (old, _) in starts {
        s.release(old);
        spare.empty.push(old);
    }
    spare.kept = others;
    spare.kept.push((seq, tokens));
    spare.evict(s, stats);
}

/// Runs `op` on sequence `seq`: its rows and the sequence's cache length after.
fn run_alone(model: &mut dyn LanguageModel, seq: usize, op: Op) -> Answer {
    if let Err(e) = select(model, seq) {
        return (Err(e), 0, None);
    }
    let rows = op(&mut *model);
    (rows, model.cache_len(), None)
}

fn select(model: &mut dyn LanguageModel, seq: usize) -> Result<()> {
    match model.sequences() {
        Some(s) => s.select(seq),
        None => Err(stopped()),
    }
}

/// One pass over every pending sequence's new tokens; each answered with its rows.
fn run_pass(model: &mut dyn LanguageModel, mut pending: Vec<Pending>, stats: &BatchStats) {
    // A sequence's bad tokens fail its own call, not the pass.
    let vocab = model.vocab_size();
    pending.retain(|p| match super::check_vocab(&p.tokens, vocab) {
        Ok(()) => true,
        Err(e) => {
            let _ = p.reply.send((Err(e), cache_len(model, p.seq), None));
            false
        }
    });
    if pending.is_empty() {
        return;
    }
    stats.passes.fetch_add(1, Relaxed);
    stats.sequences.fetch_add(pending.len() as u64, Relaxed);
    let parts: Vec<SeqPart> = pending
        .iter()
        .map(|p| SeqPart {
            seq: p.seq,
            tokens: &p.tokens,
            first: p.first,
            form: p.form,
        })
        .collect();
    let result = match model.sequences() {
        Some(s) => s.score_parts(&parts),
        None => Err(stopped()),
    };
    let total: usize = pending.iter().map(|p| p.tokens.len()).sum();
    match result {
        Ok(rows) => {
            for (p, rows) in pending.into_iter().zip(rows) {
                let beside = Some(total - p.tokens.len());
                let _ = p.reply.send((Ok(rows), cache_len(model, p.seq), beside));
            }
        }
        Err(e) => {
            for p in pending {
                let e = Error::Model(e.to_string());
                let _ = p.reply.send((Err(e), cache_len(model, p.seq), None));
            }
        }
    }
}

/// Sequence `seq`'s cache length (0 when there is no such sequence).
fn cache_len(model: &mut dyn LanguageModel, seq: usize) -> usize {
    select(model, seq).map_or(0, |()| model.cache_len())
}

/// One sequence of a [`Batcher`]'s model, as a [`LanguageModel`] of its own (`Send`: a
/// generation thread owns it).
pub struct SequenceModel {
    seq: usize,
    /// The sequence's cache length: what the last answer gave, cut back by `truncate`.
    len: usize,
    /// The positions the model's cache holds, as the last answer gave them: more than `len`
    /// after a `truncate`, whose cut waits for the next operation (the tokens read next may
    /// be the ones cut, still there).
    cached: usize,
    /// The tokens at the cache's first positions, as far as they are known (never more than
    /// `cached`): what a new sequence may start from when this one ends.
    known: Vec<u32>,
    /// The cache length before the last token tree, and its tokens (until `keep_path`).
    tree: Option<(usize, Vec<u32>)>,
    /// Nothing read yet: the first tokens fed may start from a kept cache.
    fresh: bool,
    /// Tokens of the last `feed` the cache already held.
    fed_from_cache: usize,
    /// Its cache is kept when it ends ([`SequenceModel::unshared`]: not).
    shared: bool,
    /// Rows of the other sequences in its last pass.
    beside: usize,
    /// Rows of its last pass not asked for yet ([`LanguageModel::score_more`]): a pass
    /// computes every row's logits, in the one output projection of all the sequences'
    /// rows, rather than a projection of its own for each later ask (each reads the whole
    /// output matrix again; the rows' bits are the same either way).
    held: std::collections::VecDeque<Logits>,
    calls: Sender<Call>,
    reply: Sender<Answer>,
    answers: Receiver<Answer>,
    about: Arc<About>,
}

impl SequenceModel {
    /// The sequence's number in the model.
    pub fn sequence(&self) -> usize {
        self.seq
    }

    /// The sequence, starting from no kept cache and leaving its own to none when it ends
    /// (a request that asks its prompt not to be kept).
    pub fn unshared(mut self) -> Self {
        (self.fresh, self.shared) = (false, false);
        self
    }

    /// Sends `call` after the cut a `truncate` left waiting, and waits for its answer.
    fn ask(&mut self, call: Call) -> Result<Vec<Logits>> {
        self.held.clear();
        self.settle();
        self.calls.send(call).map_err(|_| stopped())?;
        let (rows, len, beside) = self.answers.recv().map_err(|_| stopped())?;
        (self.len, self.cached) = (len, len);
        self.known.truncate(len);
        if let Some(beside) = beside {
            self.beside = beside;
        }
        rows
    }

    /// Cuts the model's cache to `len`, if a `truncate` left it longer (not waited for).
    fn settle(&mut self) {
        if self.cached <= self.len {
            return;
        }
        let len = self.len;
        (self.cached, self.tree) = (len, None);
        self.known.truncate(len);
        let op: Op = Box::new(move |m| {
            m.truncate(len);
            Ok(Vec::new())
        });
        let _ = self.calls.send(Call::Alone {
            seq: self.seq,
            op,
            reply: None,
        });
    }

    fn alone(&mut self, op: Op) -> Result<Vec<Logits>> {
        let reply = Some(self.reply.clone());
        self.ask(Call::Alone {
            seq: self.seq,
            op,
            reply,
        })
    }

    /// How many of `tokens`, read after the first `len` positions, the cache already holds:
    /// the start of a kept cache copied when the sequence reads its first tokens, or its own
    /// positions still there after a `truncate`.
    fn held_already(&mut self, tokens: &[u32]) -> Result<usize> {
        if std::mem::take(&mut self.fresh) && self.cached == 0 && !tokens.is_empty() {
            let reply = self.reply.clone();
            self.calls
                .send(Call::Adopt {
                    seq: self.seq,
                    tokens: tokens.to_vec(),
                    reply,
                })
                .map_err(|_| stopped())?;
            let (answer, len, _) = self.answers.recv().map_err(|_| stopped())?;
            answer?;
            self.cached = len;
            self.known = tokens[..len.min(tokens.len())].to_vec();
        }
        let known = self.known.get(self.len..).unwrap_or_default();
        Ok(super::common_start(known, tokens))
    }

    /// Feeds `tokens` (every row's logits back, or none when `all` is false) in passes of
    /// at most [`Batcher::CHUNK`] of them, checked first as one pass would check them. Fed
    /// without logits, those the cache already holds are not read again.
    fn score(&mut self, tokens: &[u32], all: bool, form: RowForm) -> Result<Vec<Logits>> {
        super::check_vocab(tokens, self.about.vocab)?;
        self.held.clear();
        let tokens = match all {
            true => tokens,
            false => {
                let skip = self.held_already(tokens)?;
                self.len += skip;
                self.fed_from_cache = skip;
                &tokens[skip..]
            }
        };
        let mut rows = Vec::new();
        for chunk in tokens.chunks(Batcher::CHUNK) {
            let reply = self.reply.clone();
            self.settle();
            let before = (self.len, self.known.len());
            let answer = self.ask(Call::Score {
                seq: self.seq,
                tokens: chunk.to_vec(),
                first: if all { chunk.len() } else { 0 },
                form,
                reply,
            });
            if before.0 == before.1 && self.cached == before.0 + chunk.len() {
                self.known.extend_from_slice(chunk);
            }
            rows.extend(answer?);
        }
        Ok(rows)
    }
}

impl Drop for SequenceModel {
    fn drop(&mut self) {
        let known = match self.shared {
            true => std::mem::take(&mut self.known),
            false => Vec::new(),
        };
        let _ = self.calls.send(Call::Release(self.seq, known));
    }
}

impl LanguageModel for SequenceModel {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let rows = self.score(tokens, true, RowForm::Full)?;
        Ok(rows.into_iter().map(Logits::into_dense).collect())
    }

    /// Every row's logits come out of the shared pass; those past `first` wait here.
    fn score_first(&mut self, tokens: &[u32], first: usize, form: RowForm) -> Result<Vec<Logits>> {
        let mut rows = self.score(tokens, true, form)?;
        let first = first.clamp(1, rows.len().max(1)).min(rows.len());
        self.held = rows.split_off(first).into();
        Ok(rows)
    }

    fn score_more(&mut self, count: usize) -> Result<Vec<Logits>> {
        let n = count.min(self.held.len());
        Ok(self.held.drain(..n).collect())
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.score(tokens, false, RowForm::Full).map(drop)
    }

    fn cache_len(&self) -> usize {
        self.len
    }

    fn fed_from_cache(&self) -> usize {
        self.fed_from_cache
    }

    /// Cuts the sequence back before its next operation (not waited for; at once after a
    /// token tree, which the cut ends).
    fn truncate(&mut self, len: usize) {
        self.held.clear();
        self.len = self.len.min(len);
        if self.tree.is_some() {
            self.settle();
        }
    }

    fn vocab_size(&self) -> usize {
        self.about.vocab
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.about.eos
    }

    fn bos_token(&self) -> Option<u32> {
        self.about.bos
    }

    fn max_tree_rows(&self) -> usize {
        self.about.max_tree_rows
    }

    fn rows_beside(&self) -> usize {
        self.beside
    }

    /// A token tree runs as a pass of its own sequence alone (every row's logits at once, as
    /// [`LanguageModel::score_first`]).
    fn score_tree_first(
        &mut self,
        tokens: &[u32],
        parents: &[Option<usize>],
        first: usize,
        form: RowForm,
    ) -> Result<Vec<Logits>> {
        let (nodes, parents) = (tokens.to_vec(), parents.to_vec());
        let all = tokens.len();
        let base = self.len;
        let rows = self.alone(Box::new(move |m| {
            m.score_tree_first(&nodes, &parents, all, form)
        }));
        self.tree = Some((base, tokens.to_vec()));
        let mut rows = rows?;
        let first = first.clamp(1, rows.len().max(1)).min(rows.len());
        self.held = rows.split_off(first).into();
        Ok(rows)
    }

    fn keep_path(&mut self, path: &[usize]) -> Result<()> {
        let tree = self.tree.take();
        let nodes = path.to_vec();
        self.alone(Box::new(move |m| m.keep_path(&nodes).map(|()| Vec::new())))?;
        // The path's tokens follow the known ones, when those reached the tree.
        if let Some((base, tokens)) = tree {
            let kept: Option<Vec<u32>> = path.iter().map(|&n| tokens.get(n).copied()).collect();
            match kept {
                Some(kept) if self.known.len() == base && self.cached == base + kept.len() => {
                    self.known.extend(kept)
                }
                _ => self.known.truncate(base),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lm::Sequences;
    use proptest::prelude::*;

    /// Logits a row: the 4-bit digits of the state at its position.
    const VOCAB: usize = 8;
    /// What [`Chain`] says a cache's rounding may hold beyond its positions.
    const SLACK: usize = 2;

    /// A model of several sequences whose state at a position (its "keys and values") is a
    /// hash of every token up to it, and whose row is that state's digits: a cache that holds
    /// a position for other tokens than the sequence's shows in every later row. Cut caches
    /// keep their states past the cut until the next tokens overwrite them, as
    /// `attention::KvCache` does.
    struct Chain {
        seqs: Vec<(Vec<u64>, usize)>,
        current: usize,
        /// Sequences it has room for (a GPU's caches).
        rooms: usize,
    }

    fn next_state(state: u64, token: u32) -> u64 {
        (state ^ u64::from(token) ^ 0x5bd1_e995)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(23)
    }

    fn row(state: u64) -> Vec<f32> {
        (0..VOCAB)
            .map(|i| ((state >> (4 * i)) & 15) as f32)
            .collect()
    }

    /// Every position's row of `tokens` read from an empty cache.
    fn oracle(tokens: &[u32]) -> Vec<Vec<f32>> {
        let mut state = 0;
        tokens
            .iter()
            .map(|&t| {
                state = next_state(state, t);
                row(state)
            })
            .collect()
    }

    impl Chain {
        fn new() -> Self {
            Chain::with_rooms(usize::MAX)
        }

        fn with_rooms(rooms: usize) -> Self {
            Chain {
                seqs: vec![(Vec::new(), 0)],
                current: 0,
                rooms,
            }
        }

        fn append(&mut self, seq: usize, tokens: &[u32]) -> Vec<Vec<f32>> {
            let (states, len) = &mut self.seqs[seq];
            states.truncate(*len);
            let rows = tokens
                .iter()
                .map(|&t| {
                    let state = next_state(states.last().copied().unwrap_or(0), t);
                    states.push(state);
                    row(state)
                })
                .collect();
            *len = states.len();
            rows
        }
    }

    impl LanguageModel for Chain {
        fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
            Ok(self.append(self.current, tokens))
        }
        fn cache_len(&self) -> usize {
            self.seqs[self.current].1
        }
        fn truncate(&mut self, len: usize) {
            let (_, held) = &mut self.seqs[self.current];
            *held = (*held).min(len);
        }
        fn vocab_size(&self) -> usize {
            VOCAB
        }
        fn eos_tokens(&self) -> &[u32] {
            &[]
        }
        fn sequences(&mut self) -> Option<&mut dyn Sequences> {
            Some(self)
        }
    }

    impl Sequences for Chain {
        fn sequence_count(&self) -> usize {
            self.seqs.len()
        }
        fn add_sequence(&mut self) -> Result<usize> {
            if self.seqs.len() >= self.rooms {
                return Err(Error::input("no room for another sequence"));
            }
            self.seqs.push((Vec::new(), 0));
            Ok(self.seqs.len() - 1)
        }
        fn select(&mut self, seq: usize) -> Result<()> {
            if seq >= self.seqs.len() {
                return Err(Error::Model(format!("no sequence {seq}")));
            }
            self.current = seq;
            Ok(())
        }
        fn release(&mut self, seq: usize) {
            self.seqs[seq] = (Vec::new(), 0);
        }
        fn cache_bytes_per_token(&self) -> usize {
            1
        }
        fn cache_slack_tokens(&self) -> usize {
            SLACK
        }
        fn fit(&mut self, seq: usize) {
            let (states, len) = &mut self.seqs[seq];
            states.truncate(*len);
        }
        fn copy_cache(&mut self, from: usize, to: usize, len: usize) -> Result<()> {
            let (states, held) = &self.seqs[from];
            let kept = states[..len.min(*held)].to_vec();
            let n = kept.len();
            self.seqs[to] = (kept, n);
            Ok(())
        }
        fn score_parts(&mut self, parts: &[SeqPart]) -> Result<Vec<Vec<Logits>>> {
            Ok(parts
                .iter()
                .map(|p| {
                    let mut rows = self.append(p.seq, p.tokens);
                    rows.truncate(p.first);
                    rows.into_iter().map(Logits::Dense).collect()
                })
                .collect())
        }
    }

    /// One step of a client of the batcher, on client slot `slot` (three of them).
    #[derive(Clone, Debug)]
    enum Op {
        /// A new sequence in the slot (the old one, if any, dropped).
        New,
        Drop,
        /// Feeds `take` tokens of tokens once cut at this length (one of them, by `base`), or
        /// else of base text `base`, then `tail`.
        Feed {
            base: usize,
            take: usize,
            tail: Vec<u32>,
        },
        /// Scores tokens (every row checked).
        Score(Vec<u32>),
        Truncate(usize),
        Clear,
    }

    fn op() -> impl Strategy<Value = (usize, Op)> {
        let tokens = || proptest::collection::vec(0..VOCAB as u32, 0..6);
        let op = prop_oneof![
            Just(Op::New),
            Just(Op::Drop),
            (0..3usize, 0..40usize, tokens()).prop_map(|(base, take, tail)| Op::Feed {
                base,
                take,
                tail
            }),
            proptest::collection::vec(0..VOCAB as u32, 1..4).prop_map(Op::Score),
            (0..50usize).prop_map(Op::Truncate),
            Just(Op::Clear),
        ];
        (0..3usize, op)
    }

    /// A client slot: its sequence, the tokens it was fed (what its rows must follow) and the
    /// tokens each cut took, with the length they followed.
    #[derive(Default)]
    struct Client {
        model: Option<SequenceModel>,
        history: Vec<u32>,
        cuts: Vec<(usize, Vec<u32>)>,
    }

    /// Cut, fed other tokens, cut again at the same length: the first tokens fed again are
    /// read again (the positions hold the others now), and the same tokens fed after a cut
    /// are not.
    #[test]
    fn tokens_written_over_a_cut_are_not_taken_for_the_cut_ones() {
        let batcher = Batcher::start(Box::new(Chain::new())).unwrap();
        let mut m = batcher.sequence().unwrap();
        let (first, other) = (vec![1, 2, 3, 4, 5, 6], vec![7, 7]);
        m.feed(&first).unwrap();
        m.truncate(2);
        m.feed(&first[2..4]).unwrap();
        assert_eq!(m.fed_from_cache(), 2, "the cut positions still hold them");
        m.truncate(2);
        m.feed(&other).unwrap();
        assert_eq!(m.fed_from_cache(), 0);
        m.clear();
        m.feed(&first).unwrap();
        assert_eq!(
            m.fed_from_cache(),
            2,
            "positions 2.. hold the other tokens now"
        );
        let rows = m.forward(&[3]).unwrap();
        let want = oracle(&[first.clone(), vec![3]].concat());
        assert_eq!(rows.last(), want.last());
    }

    /// A model with room for two sequences: a third is refused while no ended one is kept,
    /// and takes the oldest kept one's place (emptied) once one is.
    #[test]
    fn a_model_out_of_room_gives_a_new_sequence_the_oldest_kept_one() {
        let batcher = Batcher::start(Box::new(Chain::with_rooms(2))).unwrap();
        let (mut a, mut b) = (batcher.sequence().unwrap(), batcher.sequence().unwrap());
        let e = batcher.sequence().err().expect("no room for a third");
        assert!(e.to_string().contains("no room"), "{e}");
        a.feed(&[1, 2, 3]).unwrap();
        b.feed(&[4, 5]).unwrap();
        drop(a);
        drop(b);
        // Both rooms are taken by kept caches (their 5 tokens): the new sequences take them,
        // the oldest first. (A sequence is answered after the ends sent before it.)
        let kept = |b: &Batcher| b.stats().kept_tokens.load(Relaxed);
        let mut c = batcher.sequence().unwrap();
        assert_eq!((c.sequence(), kept(&batcher)), (0, 2));
        let rows = c.forward(&[4, 5, 6]).unwrap();
        assert_eq!(
            rows,
            oracle(&[4, 5, 6]),
            "its own tokens, not the kept ones'"
        );
        let d = batcher.sequence().unwrap();
        assert_eq!((d.sequence(), kept(&batcher)), (1, 0));
        assert!(batcher.sequence().is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Any interleaving of sequences that start, feed (often the start of a text another
        /// fed, or tokens they had cut), score, cut back and end: every row is the one the
        /// tokens give read from an empty cache, every feed reads no token twice that a
        /// kept or cut cache held for it, and the kept caches stay within their bound.
        #[test]
        fn kept_and_cut_caches_give_every_row_of_the_tokens_alone(
            bound in prop_oneof![Just(0usize), 8..40usize, Just(1000usize)],
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let bases: Vec<Vec<u32>> = (0..3u32)
                .map(|b| (0..40u32).map(|i| (i * 7 + b * 3 + i / 5 * b) % VOCAB as u32).collect())
                .collect();
            let batcher = Batcher::start(Box::new(Chain::new())).unwrap();
            batcher.keep_prompts(bound).unwrap();
            let mut clients: Vec<Client> = (0..3).map(|_| Client::default()).collect();
            for (slot, op) in ops {
                let c = &mut clients[slot];
                match (op, c.model.as_mut()) {
                    (Op::New, _) => {
                        c.model = None;
                        c.model = Some(batcher.sequence().unwrap());
                        c.history.clear();
                        c.cuts.clear();
                    }
                    (Op::Drop, _) => c.model = None,
                    (_, None) => {}
                    (Op::Feed { base, take, tail }, Some(m)) => {
                        let at = c.history.len();
                        let cuts: Vec<&Vec<u32>> =
                            c.cuts.iter().filter(|(l, _)| *l == at).map(|(_, t)| t).collect();
                        let from = match cuts.is_empty() {
                            true => &bases[base],
                            false => cuts[base % cuts.len()],
                        };
                        let tokens = [&from[..take.min(from.len())], &tail[..]].concat();
                        m.feed(&tokens).unwrap();
                        prop_assert!(m.fed_from_cache() <= tokens.len());
                        c.history.extend(&tokens);
                    }
                    (Op::Score(tokens), Some(m)) => {
                        let rows = m.forward(&tokens).unwrap();
                        c.history.extend(&tokens);
                        let want = oracle(&c.history);
                        prop_assert_eq!(&rows[..], &want[want.len() - tokens.len()..]);
                    }
                    (Op::Truncate(n), Some(m)) => {
                        m.truncate(n);
                        if n < c.history.len() {
                            c.cuts.push((n, c.history.split_off(n)));
                        }
                    }
                    (Op::Clear, Some(m)) => {
                        m.clear();
                        c.cuts.push((0, std::mem::take(&mut c.history)));
                    }
                }
                if let Some(m) = &c.model {
                    prop_assert_eq!(m.cache_len(), c.history.len());
                }
            }
            // Every live sequence goes on from exactly its tokens.
            for c in &mut clients {
                if let Some(m) = c.model.as_mut() {
                    c.history.push(1);
                    let got = m.forward(&[1]).unwrap();
                    let want = oracle(&c.history);
                    prop_assert_eq!(got.last(), want.last());
                }
            }
            drop(clients);
            // (A call answered after the releases: they ran before it.)
            let _ = batcher.sequence().unwrap();
            let kept = batcher.stats().kept_tokens.load(Relaxed);
            prop_assert!(kept == 0 || kept + SLACK <= bound, "{} kept of {}", kept, bound);
        }
    }
}
