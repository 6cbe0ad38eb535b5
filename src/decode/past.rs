//! An index of past outputs that grows online, and the drafter that reads it.
//!
//! Agentic pipelines send the same few tasks again and again with different data, and the
//! model answers each in much the same words: what it wrote before is the best draft of what it
//! writes next (SuffixDecoding's observation). [`PastOutputs`] keeps every generation's output
//! (server-wide, or in a file for `gen --past-outputs`) and makes it draftable as soon as the
//! generation ends; [`PastOutputDrafter`] drafts from it like prompt lookup drafts from the
//! prompt.
//!
//! # The structure
//!
//! A **suffix automaton** of the outputs, documents joined by a separator no context holds (so
//! no match crosses two outputs). It is built online: appending a token costs amortized O(1)
//! states, plus one walk up the suffix links that counts the token's end position in every
//! state it ends (each state's `count` is how often its strings occur, the frequencies that
//! rank continuations). A context is matched by walking its last [`MATCH_WINDOW`] tokens from
//! the root (falling back along suffix links on a mismatch): the longest suffix of the
//! context that the outputs hold, in microseconds, whatever their size. The continuations are
//! the state's edges; the draft follows the most frequent one (ties to the most recent
//! occurrence), each token's confidence from the counts and the match length by prompt
//! lookup's rule.
//!
//! **Why not a suffix array rebuilt?** Appending an output of n tokens to the automaton costs
//! O(n); a suffix array over all outputs would be rebuilt (O(N) for N tokens kept) after every
//! generation. `bench_decode repeated` measures both.
//!
//! **Bounded.** The automaton keeps at most `budget` tokens: when an append passes it, the
//! oldest tokens are dropped until the new output fits in three quarters of the budget (the
//! oldest output kept is cut at its start, not dropped whole: the newest tokens that fit stay)
//! and the automaton is rebuilt from the rest (O(budget), once per quarter budget of appended
//! tokens: amortized O(1) a token). A file holding more than the budget is refused at load,
//! never emptied.
//!
//! **Shared.** [`SharedPastOutputs`] is an `Arc<RwLock<_>>`: drafters of concurrent
//! generations read it, a finished generation appends under the write lock.
//!
//! **Never an exemption.** The copy guard knows nothing of it: a past output is drafted like
//! anything else, and the guard masks and cuts its tokens as it does every draft's.

use super::drafters::copy_confidence;
use super::{Draft, Drafter};
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, RwLock};

/// Joins outputs in the automaton; never a token of a context.
const SEPARATOR: u32 = u32::MAX;

/// Tokens at the end of a context matched against the outputs (a longer match says no more
/// about the continuation: the confidence saturates well before).
pub const MATCH_WINDOW: usize = 64;

/// Tokens kept by default: a few hundred generations, about 25 MB of automaton.
pub const DEFAULT_BUDGET: usize = 1 << 18;

/// A draft stops once the chance that all of it is accepted falls below this (as the other
/// drafters' do).
const MIN_REACH: f64 = 0.05;

/// One state of the automaton: the strings that end at the same set of positions.
#[derive(Clone, Debug)]
struct State {
    /// Length of the longest string of the state.
    len: u32,
    /// The state of the longest suffix that is not in this state.
    link: u32,
    /// How many positions the state's strings end at (occurrences).
    count: u32,
    /// The latest position its strings end at.
    last_end: u32,
    /// Whether the state was made by splitting another (it is no position's own state).
    clone: bool,
    /// Transitions, sorted by token.
    edges: Vec<(u32, u32)>,
}

impl State {
    fn new(len: u32, link: u32) -> Self {
        State {
            len,
            link,
            count: 0,
            last_end: 0,
            clone: false,
            edges: Vec::new(),
        }
    }

    fn edge(&self, token: u32) -> Option<u32> {
        self.edges
            .binary_search_by_key(&token, |e| e.0)
            .ok()
            .map(|i| self.edges[i].1)
    }

    fn set_edge(&mut self, token: u32, to: u32) {
        match self.edges.binary_search_by_key(&token, |e| e.0) {
            Ok(i) => self.edges[i].1 = to,
            Err(i) => self.edges.insert(i, (token, to)),
        }
    }
}

/// A suffix automaton over a token sequence, built online, with occurrence counts.
#[derive(Clone, Debug)]
struct Automaton {
    states: Vec<State>,
    /// The state of the whole sequence.
    last: u32,
    /// Tokens appended so far.
    len: u32,
    /// Steps taken to keep the counts (suffix links walked, states recounted): what the
    /// tests bound to show that the counts cost linear time.
    work: u64,
}

impl Automaton {
    fn new() -> Self {
        Automaton {
            states: vec![State::new(0, u32::MAX)],
            last: 0,
            len: 0,
            work: 0,
        }
    }

    /// Appends `token` (Blumer et al.'s online construction; amortized O(1) states). The
    /// counts are updated apart ([`Automaton::count_last`], [`Automaton::recount`]).
    fn push(&mut self, token: u32) {
        let cur = self.states.len() as u32;
        self.states
            .push(State::new(self.states[self.last as usize].len + 1, 0));
        let mut p = self.last;
        loop {
            if self.states[p as usize].edge(token).is_some() {
                break;
            }
            self.states[p as usize].set_edge(token, cur);
            if p == 0 {
                p = u32::MAX;
                break;
            }
            p = self.states[p as usize].link;
        }
        if p != u32::MAX {
            let q = self.states[p as usize].edge(token).expect("found above");
            if self.states[p as usize].len + 1 == self.states[q as usize].len {
                self.states[cur as usize].link = q;
            } else {
                let clone = self.states.len() as u32;
                let mut c = self.states[q as usize].clone();
                c.len = self.states[p as usize].len + 1;
                c.clone = true;
                self.states.push(c);
                self.states[q as usize].link = clone;
                self.states[cur as usize].link = clone;
                let mut r = p;
                while self.states[r as usize].edge(token) == Some(q) {
                    self.states[r as usize].set_edge(token, clone);
                    if r == 0 {
                        break;
                    }
                    r = self.states[r as usize].link;
                }
            }
        }
        self.last = cur;
        self.len += 1;
    }

    /// Counts the end position of the last token appended in every state it ends (a walk up
    /// the suffix links from the last state), taking at most `steps` steps; `false` (the
    /// counts left partly updated) when the walk was longer.
    fn count_last(&mut self, steps: &mut usize) -> bool {
        let end = self.len - 1;
        let mut s = self.last;
        while s != 0 {
            if *steps == 0 {
                return false;
            }
            *steps -= 1;
            self.work += 1;
            let state = &mut self.states[s as usize];
            state.count += 1;
            state.last_end = end;
            s = state.link;
        }
        true
    }

    /// Computes every state's count and latest end anew, in O(states): a state of a position
    /// (its longest string is the whole prefix, so it ends at `len − 1`) counts one, a clone
    /// none, and each state adds its counts to its suffix link's, longest states first.
    fn recount(&mut self) {
        self.work += self.states.len() as u64;
        let mut by_len = vec![0u32; self.len as usize + 2];
        for st in &self.states[1..] {
            by_len[st.len as usize] += 1;
        }
        let mut start = 0u32;
        for b in by_len.iter_mut() {
            (*b, start) = (start, start + *b);
        }
        let mut order = vec![0u32; self.states.len() - 1];
        for (i, st) in self.states.iter().enumerate().skip(1) {
            let slot = &mut by_len[st.len as usize];
            order[*slot as usize] = i as u32;
            *slot += 1;
        }
        for st in &mut self.states {
            st.count = 0;
            st.last_end = 0;
        }
        for &i in &order {
            let st = &mut self.states[i as usize];
            if !st.clone {
                st.count = 1;
                st.last_end = st.len - 1;
            }
        }
        for &i in order.iter().rev() {
            let (link, count, last_end) = {
                let st = &self.states[i as usize];
                (st.link, st.count, st.last_end)
            };
            if link != 0 {
                let l = &mut self.states[link as usize];
                l.count += count;
                l.last_end = l.last_end.max(last_end);
            }
        }
    }

    /// The state of the longest suffix of `tokens` that occurs, and its length.
    fn match_suffix(&self, tokens: &[u32]) -> (u32, usize) {
        let (mut s, mut len) = (0u32, 0usize);
        for &t in tokens {
            loop {
                if let Some(next) = self.states[s as usize].edge(t) {
                    s = next;
                    len += 1;
                    break;
                }
                if s == 0 {
                    len = 0;
                    break;
                }
                s = self.states[s as usize].link;
                len = self.states[s as usize].len as usize;
            }
        }
        (s, len)
    }

    /// The continuations of state `s`: `(token, next state, occurrences)`, most frequent
    /// first, ties to the most recent; the separator left out.
    fn continuations(&self, s: u32) -> Vec<(u32, u32, u32)> {
        let mut next: Vec<(u32, u32, u32)> = self.states[s as usize]
            .edges
            .iter()
            .filter(|e| e.0 != SEPARATOR)
            .map(|&(t, to)| (t, to, self.states[to as usize].count))
            .collect();
        next.sort_by(|a, b| {
            b.2.cmp(&a.2).then(
                self.states[b.1 as usize]
                    .last_end
                    .cmp(&self.states[a.1 as usize].last_end),
            )
        });
        next
    }

    fn bytes(&self) -> usize {
        self.states
            .iter()
            .map(|s| std::mem::size_of::<State>() + s.edges.capacity() * 8)
            .sum()
    }
}

/// Past outputs, oldest first, and their suffix automaton; at most `budget` tokens.
#[derive(Clone, Debug)]
pub struct PastOutputs {
    budget: usize,
    outputs: VecDeque<Vec<u32>>,
    tokens: usize,
    automaton: Automaton,
}

/// Past outputs shared by the generations of a server (or a program): drafters read, finished
/// generations append.
pub type SharedPastOutputs = Arc<RwLock<PastOutputs>>;

/// Statistics of a [`PastOutputs`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PastStats {
    /// Outputs kept.
    pub outputs: usize,
    /// Their tokens.
    pub tokens: usize,
    /// States of the automaton.
    pub states: usize,
    /// Bytes of the automaton (approximate).
    pub bytes: usize,
}

impl PastOutputs {
    /// An empty index that keeps at most `budget` tokens (at least 1).
    pub fn new(budget: usize) -> Self {
        PastOutputs {
            budget: budget.max(1),
            outputs: VecDeque::new(),
            tokens: 0,
            automaton: Automaton::new(),
        }
    }

    /// A shareable empty index.
    pub fn shared(budget: usize) -> SharedPastOutputs {
        PastOutputs::new(budget).into_shared()
    }

    /// This index, to share.
    pub fn into_shared(self) -> SharedPastOutputs {
        Arc::new(RwLock::new(self))
    }

    /// Appends one output (draftable at once). Empty outputs are skipped; an output longer
    /// than the budget keeps its last `budget` tokens. When the budget is passed, the oldest
    /// tokens go until three quarters of the budget hold the rest and the new output (the
    /// oldest output kept is cut at its start), and the automaton is rebuilt from them.
    ///
    /// The counts are kept by walking up the suffix links after each token, which is short
    /// for text but as long as the match for a repetition (an output of one token repeated);
    /// a walk longer than the automaton is cut and the counts computed anew instead, so an
    /// append costs at most O(its tokens + the automaton's states).
    pub fn append(&mut self, output: &[u32]) {
        let output = &output[output.len().saturating_sub(self.budget)..];
        if output.is_empty() {
            return;
        }
        if self.tokens + output.len() > self.budget {
            let keep = self.budget - self.budget / 4;
            self.keep_newest(keep.saturating_sub(output.len()));
            self.rebuild();
        }
        let mut steps = self.automaton.states.len() + 2 * output.len() + 64;
        let mut counted = true;
        for t in joined(self.automaton.len > 0, output) {
            self.automaton.push(t);
            counted = counted && self.automaton.count_last(&mut steps);
        }
        if !counted {
            self.automaton.recount();
        }
        self.tokens += output.len();
        self.outputs.push_back(output.to_vec());
    }

    /// Drops the oldest tokens until at most `room` are left: whole outputs first, then the
    /// start of the oldest one left.
    fn keep_newest(&mut self, room: usize) {
        while self.tokens > room {
            let excess = self.tokens - room;
            let oldest = self.outputs.front_mut().expect("tokens are in outputs");
            if oldest.len() <= excess {
                self.tokens -= oldest.len();
                self.outputs.pop_front();
            } else {
                oldest.drain(..excess);
                self.tokens -= excess;
            }
        }
    }

    /// Builds the automaton anew from the outputs kept, in O(their tokens): the structure
    /// first, the counts once at the end.
    fn rebuild(&mut self) {
        self.automaton = Automaton::new();
        let outputs = std::mem::take(&mut self.outputs);
        for o in &outputs {
            for t in joined(self.automaton.len > 0, o) {
                self.automaton.push(t);
            }
        }
        self.automaton.recount();
        self.outputs = outputs;
    }

    /// An index of `outputs` (oldest first, at most `budget` tokens in all); built in O(their
    /// tokens).
    fn from_outputs(budget: usize, outputs: Vec<Vec<u32>>) -> Self {
        let mut past = PastOutputs::new(budget);
        past.outputs = outputs.into_iter().filter(|o| !o.is_empty()).collect();
        past.tokens = past.outputs.iter().map(Vec::len).sum();
        debug_assert!(past.tokens <= past.budget);
        past.rebuild();
        past
    }

    /// The outputs kept, oldest first.
    pub fn outputs(&self) -> impl Iterator<Item = &[u32]> {
        self.outputs.iter().map(Vec::as_slice)
    }

    /// What it holds.
    pub fn stats(&self) -> PastStats {
        PastStats {
            outputs: self.outputs.len(),
            tokens: self.tokens,
            states: self.automaton.states.len(),
            bytes: self.automaton.bytes(),
        }
    }

    /// The longest suffix of `context` (within its last [`MATCH_WINDOW`] tokens) that the
    /// outputs hold: its length and its continuations `(token, occurrences)`, most frequent
    /// first, ties to the most recent.
    pub fn continuations(&self, context: &[u32]) -> (usize, Vec<(u32, u32)>) {
        let tail = &context[context.len().saturating_sub(MATCH_WINDOW)..];
        let (s, len) = self.automaton.match_suffix(tail);
        if len == 0 {
            return (0, Vec::new());
        }
        let next = self.automaton.continuations(s);
        (len, next.into_iter().map(|(t, _, c)| (t, c)).collect())
    }

    /// A draft of up to `max` tokens after `context`: the most frequent continuation of the
    /// longest matching suffix, followed on while the chance that all of it is accepted stays
    /// above 5%.
    pub fn draft(&self, context: &[u32], max: usize) -> Draft {
        let tail = &context[context.len().saturating_sub(MATCH_WINDOW)..];
        let (mut s, mut len) = self.automaton.match_suffix(tail);
        let mut draft = Draft::default();
        let mut reach = 1.0;
        while len > 0 && draft.tokens.len() < max {
            let next = self.automaton.continuations(s);
            let Some(&(token, to, agree)) = next.first() else {
                break;
            };
            let total: u32 = next.iter().map(|n| n.2).sum();
            let confidence = copy_confidence(agree as u64, total as u64, len);
            draft.tokens.push(token);
            draft.confidence.push(confidence);
            reach *= confidence;
            (s, len) = (to, len + 1);
            if reach < MIN_REACH {
                break;
            }
        }
        draft
    }

    /// Reads outputs saved by [`PastOutputs::save`] for a tokenizer with `fingerprint` and
    /// `vocab` ids, in time linear in the file; a missing file is an empty index. The path
    /// must be one that [`PastOutputs::save`] can write (checked here, at start, not after the
    /// first generation). Refused with the reason, and left as they are: a file that is not
    /// ours (a header line over `HEADER_MAX` bytes included), another tokenizer's, a
    /// truncated one, one holding an id outside the vocabulary, one larger than `budget`
    /// tokens can fill ([`max_file_bytes`]; read no further than that), and one holding more
    /// than `budget` tokens (loading it would drop outputs the file kept: the next save would
    /// lose them).
    pub fn load(path: &Path, fingerprint: &str, vocab: usize, budget: usize) -> Result<Self> {
        crate::output_file::check_writable(path)?;
        let Some(file) = open_existing(path)? else {
            return Ok(PastOutputs::new(budget));
        };
        let cap = max_file_bytes(budget);
        let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if size > cap {
            return Err(Error::input(format!(
                "{}: {size} bytes, more than past outputs of {budget} tokens can fill ({cap} \
                 bytes): raise the budget (serve --past-output-tokens) or name another file \
                 with --past-outputs",
                path.display()
            )));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(cap + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(path, e))?;
        let bad = |what: &str| {
            Error::input(format!(
                "{}: not a past-outputs file of infgram ({what}); name another file with \
                 --past-outputs, or move this one away",
                path.display()
            ))
        };
        if bytes.len() as u64 > cap {
            return Err(bad("it grew while it was read"));
        }
        let Some((header, body_at)) = our_header(&bytes) else {
            return Err(bad("its first line is not the header"));
        };
        if header["version"] != VERSION {
            return Err(bad(&format!("format version {}", header["version"])));
        }
        if header["tokenizer"] != fingerprint {
            return Err(Error::input(format!(
                "{}: past outputs written with another tokenizer (fingerprint {}, this model's \
                 is {fingerprint}): name another file with --past-outputs",
                path.display(),
                header["tokenizer"]
            )));
        }
        let body = &bytes[body_at..];
        if !body.len().is_multiple_of(4) {
            return Err(bad("a truncated body"));
        }
        let mut words = body
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        let mut outputs = Vec::new();
        while let Some(n) = words.next() {
            let output: Vec<u32> = words.by_ref().take(n as usize).collect();
            if output.len() != n as usize {
                return Err(bad("a truncated output"));
            }
            if let Some(&id) = output.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::input(format!(
                    "{}: holds token id {id}, outside this model's vocabulary of {vocab} ids \
                     (a damaged file, or another model's): name another file with \
                     --past-outputs, or move this one away",
                    path.display()
                )));
            }
            outputs.push(output);
        }
        let tokens: usize = outputs.iter().map(Vec::len).sum();
        if tokens > budget {
            return Err(Error::input(format!(
                "{}: holds {tokens} tokens of past outputs, more than this run keeps ({budget}); \
                 loading it would drop the oldest at the next save: serve it with \
                 --past-output-tokens {tokens} or more, or name another file with \
                 --past-outputs (the file is left as it is)",
                path.display()
            )));
        }
        Ok(PastOutputs::from_outputs(budget, outputs))
    }

    /// Writes the outputs to `path` for a tokenizer with `fingerprint`, as every infgram file
    /// is written ([`crate::output_file`]: beside it, synced, renamed over it; a crash leaves
    /// the old file whole). Refuses to replace a file that is not a past-outputs file, and
    /// anything but a regular file.
    pub fn save(&self, path: &Path, fingerprint: &str) -> Result<()> {
        let header =
            serde_json::json!({"magic": MAGIC, "version": VERSION, "tokenizer": fingerprint});
        let mut bytes = serde_json::to_vec(&header).expect("a JSON value");
        bytes.push(b'\n');
        if bytes.len() as u64 > HEADER_MAX {
            return Err(Error::input(format!(
                "{}: the tokenizer's fingerprint is too long for a past-outputs header",
                path.display()
            )));
        }
        for o in &self.outputs {
            bytes.extend((o.len() as u32).to_le_bytes());
            for t in o {
                bytes.extend(t.to_le_bytes());
            }
        }
        // `path` is checked once, by the writer; what is there is read before the new file
        // is renamed over it (a refusal discards the new file).
        crate::output_file::write_file(path, crate::output_file::Accept::Files, |out| {
            refuse_foreign(path)?;
            out.write_all(&bytes).map_err(|e| Error::io(path, e))
        })
    }
}

/// Refuses to replace `path` when it exists and is not a past-outputs file (its header line
/// only is read: a user's file may be large).
fn refuse_foreign(path: &Path) -> Result<()> {
    let Some(file) = open_existing(path)? else {
        return Ok(());
    };
    let mut head = Vec::new();
    file.take(HEADER_MAX)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    if our_header(&head).is_none() {
        return Err(Error::input(format!(
            "{}: exists and is not a past-outputs file of infgram; it is left as it is: name \
             another file with --past-outputs",
            path.display()
        )));
    }
    Ok(())
}

/// The most bytes a past-outputs file of at most `budget` tokens takes: its header line and,
/// per output (at least one token each), a length and its tokens, 4 bytes each.
pub fn max_file_bytes(budget: usize) -> u64 {
    HEADER_MAX + 8 * budget as u64
}

/// `path` opened for reading without following a link; `None` when it does not exist.
fn open_existing(path: &Path) -> Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// The header's magic of a past-outputs file.
const MAGIC: &str = "infgram-past-outputs";

/// The format version of a past-outputs file.
const VERSION: u32 = 1;

/// Longest header line read.
const HEADER_MAX: u64 = 4096;

/// The header of a past-outputs file's `bytes` (its first line, with our magic, within
/// [`HEADER_MAX`] bytes) and where the body starts after it; `None` when they are not such a
/// file's.
fn our_header(bytes: &[u8]) -> Option<(serde_json::Value, usize)> {
    let head = &bytes[..bytes.len().min(HEADER_MAX as usize)];
    let newline = head.iter().position(|&b| b == b'\n')?;
    let header: serde_json::Value = serde_json::from_slice(&bytes[..newline]).ok()?;
    (header["magic"] == MAGIC).then_some((header, newline + 1))
}

/// The tokens that append `output` to the automaton: a separator when outputs come before
/// it (`after`), then its tokens (one equal to the separator, which no vocabulary has, mapped
/// below it so it cannot join outputs).
fn joined(after: bool, output: &[u32]) -> impl Iterator<Item = u32> + '_ {
    after
        .then_some(SEPARATOR)
        .into_iter()
        .chain(
            output
                .iter()
                .map(|&t| if t == SEPARATOR { t - 1 } else { t }),
        )
}

/// Drafts from the outputs of past generations ([`PastOutputs`]).
pub struct PastOutputDrafter {
    past: SharedPastOutputs,
}

impl PastOutputDrafter {
    pub fn new(past: SharedPastOutputs) -> Self {
        PastOutputDrafter { past }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, PastOutputs> {
        // A writer that panicked left whole outputs behind (appends are not torn): read on.
        self.past.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drafter for PastOutputDrafter {
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Draft> {
        Ok(self.read().draft(context, max))
    }

    fn alternatives(&mut self, context: &[u32], n: usize) -> Result<Vec<(u32, f64)>> {
        let (len, next) = self.read().continuations(context);
        let total: u32 = next.iter().map(|c| c.1).sum();
        Ok(next
            .into_iter()
            .take(n)
            .map(|(t, c)| (t, copy_confidence(c as u64, total as u64, len)))
            .collect())
    }

    fn name(&self) -> &str {
        "past"
    }
}

/// Appends `output` to `past`, whatever a panicking writer left (whole outputs only).
pub fn remember(past: &SharedPastOutputs, output: &[u32]) {
    past.write()
        .unwrap_or_else(|e| e.into_inner())
        .append(output);
}

#[cfg(test)]
mod tests;
