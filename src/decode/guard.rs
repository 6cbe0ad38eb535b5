//! The copy guard: a processor that keeps generated text from repeating more than `L`
//! consecutive tokens of a reference corpus, exactly (unlike a Bloom filter of n-grams, as
//! MemFree uses, which has false positives and one fixed n).
//!
//! A span of `L + 1` tokens ending at the next position occurs in the corpus only if its first
//! `L` tokens — the last `L` tokens of the context — occur. So at each position the guard looks
//! up the context's last `L` tokens in the index and, when they occur, masks exactly the tokens
//! that follow them somewhere in the corpus (document ends excepted: the separator is not a
//! token). No false positives, no false negatives, any `L`.
//!
//! Most positions need no search. The longest suffix of the context that occurs grows by at
//! most one token per step, so after a search that found it `m < L` tokens long, the next
//! `L − m − 1` positions cannot be blocked. And when it occurs at most 32 times, its
//! occurrences are followed token by token (one read of the corpus per occurrence): while they
//! continue with the generated token, the match grows by one without a search. A search is one
//! narrowing per matched token in the reversed suffix array
//! ([`crate::index::Shard::suffix_occs`]).
//!
//! The prompt counts by default (a model cannot finish a quotation that the prompt began);
//! [`CopyGuard::ignore_prompt`] counts only generated tokens. Ids the index does not hold (past
//! its vocabulary, its separator) break spans, as document ends do.
//!
//! The corpus is any [`Shards`] ([`crate::index::spans`] reads its spans). Over shards held
//! elsewhere a search is one round trip for the longest occurring suffix and, when it is `L`
//! long, one for the tokens that follow it; the bound above still skips most positions, and
//! occurrences are not followed. A search that fails (a shard that stays down) masks every
//! token and is reported by [`CopyGuard::failure`]: the guard never lets a token through
//! unchecked.

use super::Processor;
use crate::index::shards::{Shards, SharedShards};
use crate::index::spans::SuffixMatch;
use crate::lm::Logits;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

/// What a guard did during a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct GuardStats {
    /// The longest span allowed (`L`).
    pub max_span: usize,
    /// Positions where the guard masked at least one candidate.
    pub blocked: usize,
    /// Candidates masked in all (several per blocked position).
    pub masked: usize,
    /// Positions that needed an index search.
    pub searches: usize,
    /// Seconds spent in the guard.
    pub seconds: f64,
}

/// Occurrence sets at most this large are followed from step to step instead of searched.
const TRACK_MAX: usize = 32;

/// The longest suffix of a context that occurs in the corpus (capped at the guard's `L`).
#[derive(Clone, Debug)]
struct MatchState {
    /// Length of the context.
    context_len: usize,
    /// The suffix (its length, or an upper bound on it when not `exact`) and its occurrences,
    /// when exact and at most [`TRACK_MAX`] (and the corpus gives them); none otherwise.
    found: SuffixMatch,
    exact: bool,
}

/// The copy guard over an index (see the module docs).
pub struct CopyGuard {
    corpus: SharedShards,
    max_span: usize,
    ignore_prompt: bool,
    /// Tokens of the prompt (set by [`Processor::start`]).
    prompt_len: usize,
    /// What is known of the longest occurring suffix of the last context seen.
    state: Option<MatchState>,
    /// Scratch space for the tokens to mask.
    next: Vec<u32>,
    stats: Rc<Cell<GuardStats>>,
    /// Why a search over remote shards failed (then every token is masked).
    failure: Rc<RefCell<Option<String>>>,
}

impl CopyGuard {
    /// A guard that allows at most `max_span` consecutive tokens of `corpus` (an index, or
    /// shards held elsewhere; at least 1: the caller refuses 0).
    pub fn new(corpus: SharedShards, max_span: usize) -> Self {
        let max_span = max_span.max(1);
        CopyGuard {
            corpus,
            max_span,
            ignore_prompt: false,
            prompt_len: 0,
            state: None,
            next: Vec::new(),
            stats: Rc::new(Cell::new(GuardStats {
                max_span,
                ..GuardStats::default()
            })),
            failure: Rc::default(),
        }
    }

    /// A handle on why a search over remote shards failed (`None` while none did): a
    /// generation with a failed guard search must not be reported as guarded.
    pub fn failure(&self) -> Rc<RefCell<Option<String>>> {
        self.failure.clone()
    }

    /// Counts only generated tokens: spans that begin in the prompt are not checked.
    pub fn ignore_prompt(mut self, ignore: bool) -> Self {
        self.ignore_prompt = ignore;
        self
    }

    /// A handle on the guard's statistics, readable after the decode loop took the guard.
    pub fn stats(&self) -> Rc<Cell<GuardStats>> {
        self.stats.clone()
    }

    /// The part of `context` the guard looks at: its last `max_span` tokens, cut after the
    /// last id the index does not hold (and after the prompt, when it is ignored).
    fn window<'c>(&self, context: &'c [u32]) -> &'c [u32] {
        let from = if self.ignore_prompt {
            self.prompt_len.min(context.len())
        } else {
            0
        };
        let tail = &context[from.max(context.len().saturating_sub(self.max_span))..];
        match tail.iter().rposition(|&t| !self.corpus.holds_token(t)) {
            Some(p) => &tail[p + 1..],
            None => tail,
        }
    }

    /// The longest suffix of `window` that occurs (capped at its length) with its occurrences
    /// when they are few, and when it is `max_span` long, the tokens that follow it in the
    /// corpus into `next` (sorted, distinct). A search that fails is recorded in `failure`.
    fn search(&mut self, window: &[u32]) -> SuffixMatch {
        match self.corpus.suffix_match(window, self.max_span, TRACK_MAX) {
            Ok(mut found) => {
                self.next.append(&mut found.next);
                found
            }
            Err(e) => {
                self.failure.borrow_mut().get_or_insert(e.to_string());
                SuffixMatch::default()
            }
        }
    }

    /// Follows the tracked occurrences of `state` (one token shorter context) by `x`: the new
    /// state when some continue with `x` (then the longest occurring suffix is one longer), and
    /// the tokens after it into `next` when it is `max_span` long.
    fn extend(&mut self, state: &MatchState, x: u32) -> Option<MatchState> {
        let mut found = self.corpus.follow(&state.found, x, self.max_span)?;
        self.next.append(&mut found.next);
        Some(MatchState {
            context_len: state.context_len + 1,
            found,
            exact: true,
        })
    }

    /// The tokens that may not follow `context`, into `self.next` (empty when none), and what
    /// is known of the context's match for the next position.
    fn forbidden(&mut self, context: &[u32]) {
        self.next.clear();
        let window = self.window(context);
        let n = context.len();
        let state = self.state.take().filter(|st| st.context_len <= n);
        // One token appended to a context whose few occurrences are known: follow them.
        if let (Some(st), Some(&x)) = (&state, context.last()) {
            let appended = st.context_len + 1 == n && !window.is_empty();
            let (len, starts) = (st.found.len, &st.found.starts);
            if appended && st.exact && !starts.is_empty() && len < self.max_span {
                if let Some(next) = self.extend(st, x) {
                    self.state = Some(next);
                    return;
                }
            }
        }
        // The longest occurring suffix grows by at most one token per appended token (and not
        // at all past a token whose tracked occurrences do not continue with it).
        let bound = match &state {
            Some(st) if st.context_len + 1 == n && st.exact && !st.found.starts.is_empty() => {
                st.found.len
            }
            Some(st) => st.found.len + (n - st.context_len),
            None => self.max_span,
        }
        .min(self.max_span)
        .min(window.len());
        if bound < self.max_span {
            self.state = Some(MatchState {
                context_len: n,
                found: SuffixMatch {
                    len: bound,
                    ..SuffixMatch::default()
                },
                exact: false,
            });
            return;
        }
        let window = window.to_vec();
        let found = self.search(&window);
        let mut stats = self.stats.get();
        stats.searches += 1;
        self.stats.set(stats);
        self.state = Some(MatchState {
            context_len: n,
            found,
            exact: true,
        });
    }

    fn add_time(&self, since: Instant) {
        let mut stats = self.stats.get();
        stats.seconds += since.elapsed().as_secs_f64();
        self.stats.set(stats);
    }
}

impl Processor for CopyGuard {
    fn start(&mut self, prompt: &[u32]) {
        self.prompt_len = prompt.len();
        self.state = None;
    }

    fn process(&mut self, context: &[u32], logits: &mut Logits) {
        let t = Instant::now();
        self.forbidden(context);
        if self.failure.borrow().is_some() {
            // Unchecked: nothing may pass.
            self.next.clear();
            self.next.extend(0..logits.vocab() as u32);
        }
        if !self.next.is_empty() {
            let mut masked = 0;
            for &x in &self.next {
                if logits.get(x) > f32::NEG_INFINITY {
                    logits.mask(x);
                    masked += 1;
                }
            }
            let mut stats = self.stats.get();
            stats.blocked += usize::from(masked > 0);
            stats.masked += masked;
            self.stats.set(stats);
        }
        self.add_time(t);
    }

    fn admit(&mut self, context: &[u32], draft: &[u32]) -> usize {
        let t = Instant::now();
        // Walk the draft without touching the state kept for the real context.
        let saved = self.state.clone();
        let mut seq = context.to_vec();
        let mut admitted = draft.len();
        for (i, &x) in draft.iter().enumerate() {
            self.forbidden(&seq);
            if self.failure.borrow().is_some() || self.next.binary_search(&x).is_ok() {
                admitted = i;
                break;
            }
            seq.push(x);
        }
        self.state = saved;
        self.add_time(t);
        admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Index;
    use std::sync::Arc;

    fn index(docs: &[&[u32]]) -> Arc<Index<Vec<u8>>> {
        let docs: Vec<Vec<u32>> = docs.iter().map(|d| d.to_vec()).collect();
        let spec = crate::tokenizer::TokenizerSpec::synthetic(10);
        Arc::new(Index::from_docs(spec, &docs, 1, true).expect("index"))
    }

    fn masked_after(guard: &mut CopyGuard, context: &[u32]) -> Vec<u32> {
        let mut logits = Logits::Dense(vec![0.0; 10]);
        guard.process(context, &mut logits);
        (0..10u32)
            .filter(|&t| logits.get(t) == f32::NEG_INFINITY)
            .collect()
    }

    #[test]
    fn masks_exactly_the_continuations_of_a_copied_span() {
        let ix = index(&[&[1, 2, 3, 4], &[2, 3, 5]]);
        let mut guard = CopyGuard::new(ix, 2);
        guard.start(&[]);
        // "2 3" occurs, followed by 4 and 5.
        assert_eq!(masked_after(&mut guard, &[7, 2, 3]), vec![4, 5]);
        // "1 2" occurs, followed by 3 only.
        guard.start(&[]);
        assert_eq!(masked_after(&mut guard, &[1, 2]), vec![3]);
        // "3 4" ends a document: nothing follows it.
        guard.start(&[]);
        assert_eq!(masked_after(&mut guard, &[3, 4]), Vec::<u32>::new());
        // "4 2" does not occur.
        guard.start(&[]);
        assert_eq!(masked_after(&mut guard, &[4, 2]), Vec::<u32>::new());
    }

    #[test]
    fn an_ignored_prompt_does_not_count() {
        let ix = index(&[&[1, 2, 3, 4]]);
        let mut guard = CopyGuard::new(ix.clone(), 2).ignore_prompt(true);
        guard.start(&[1]);
        assert_eq!(masked_after(&mut guard, &[1, 2]), Vec::<u32>::new());
        assert_eq!(masked_after(&mut guard, &[1, 2, 3]), vec![4]);
        let mut counting = CopyGuard::new(ix, 2);
        counting.start(&[1]);
        assert_eq!(masked_after(&mut counting, &[1, 2]), vec![3]);
    }

    #[test]
    fn drafts_are_cut_before_the_first_violation() {
        let ix = index(&[&[1, 2, 3, 4, 5]]);
        let mut guard = CopyGuard::new(ix, 2);
        guard.start(&[1]);
        assert_eq!(guard.admit(&[1], &[2, 6, 7]), 3);
        assert_eq!(guard.admit(&[1], &[2, 3, 9]), 1);
        assert_eq!(guard.admit(&[9], &[2, 3, 4]), 2);
    }
}
