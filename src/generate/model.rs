//! The ∞-gram as a [`LanguageModel`], so that generation from the index alone runs through the
//! same decode loop as neural decoding ([`crate::decode::decode`] with no drafters).
//!
//! Each fed token's "logits" are the natural logarithms of the estimator's next-token
//! distribution (−∞ for impossible tokens); the sampler's softmax and temperature then give
//! `P^(1/T)`, the ∞-gram generator's rule. The index's document separator is the end token, and
//! feeding it starts a new document: the context after it is empty. The incremental level
//! tracker of [`super::levels`] keeps a step at about a microsecond per corpus occurrence it
//! follows; truncating the context (a rolled-back draft) resets it.

use super::levels::{self, Level, LevelFinder};
use super::{Estimator, StepStats};
use crate::error::Result;
use crate::index::Index;
use crate::neural::LanguageModel;

/// Next-token distributions of the ∞-gram of an index.
pub struct InfgramModel<'a, S: AsRef<[u8]> + Sync> {
    finder: LevelFinder<'a, S>,
    estimator: Estimator,
    /// Tokens of context the estimator looks at.
    window: usize,
    /// Every fed token (separators included).
    fed: Vec<u32>,
    /// Where the current document starts in `fed` (after the last separator).
    doc_start: usize,
    tracker: levels::Tracker,
    /// The token fed since the levels were last computed, for the tracker.
    appended: Option<u32>,
    separator: u32,
    vocab: usize,
    eos: [u32; 1],
    /// The levels used at each scored position, for `--stats`.
    pub steps: Vec<StepStats>,
}

impl<'a, S: AsRef<[u8]> + Sync> InfgramModel<'a, S> {
    /// The ∞-gram of `index` with `estimator`, looking at the last `window` tokens.
    pub fn new(index: &'a Index<S>, estimator: Estimator, window: usize) -> Self {
        let separator = index.separator();
        InfgramModel {
            finder: LevelFinder::new(index, true),
            estimator,
            window: window.max(1),
            fed: Vec::new(),
            doc_start: 0,
            tracker: levels::Tracker::default(),
            appended: None,
            separator,
            vocab: index.vocab_size().max(separator as usize + 1),
            eos: [separator],
            steps: Vec::new(),
        }
    }

    fn push(&mut self, token: u32) {
        if self.appended.is_some() {
            // Two tokens since the last levels: the tracker only advances by one.
            self.tracker = levels::Tracker::default();
        }
        self.fed.push(token);
        if token == self.separator {
            self.doc_start = self.fed.len();
            self.tracker = levels::Tracker::default();
            self.appended = None;
        } else {
            self.appended = Some(token);
        }
    }

    /// The levels after the tokens fed so far (the unigram level when nothing matches).
    fn levels(&mut self) -> Vec<Level> {
        let doc = &self.fed[self.doc_start..];
        let ctx = &doc[doc.len().saturating_sub(self.window)..];
        let appended = self.appended.take();
        let mut levels = match self.estimator {
            Estimator::Sbis { k, .. } if k > 0 => {
                self.finder.next_levels(&mut self.tracker, ctx, appended, k)
            }
            _ => self.estimator.levels(&mut self.finder, ctx),
        };
        if levels.is_empty() {
            // Nothing of the context occurs (e.g. an empty prompt): back off to the unigram.
            levels = self.finder.levels(&[], 1, true);
        }
        levels
    }

    fn logits(&mut self) -> Vec<f32> {
        let levels = self.levels();
        self.steps.push(StepStats {
            levels: levels.iter().map(|l| (l.len, l.total)).collect(),
        });
        let mut logits = vec![f32::NEG_INFINITY; self.vocab];
        for (tok, p) in self.estimator.distribution(&levels, self.vocab) {
            if p > 0.0 {
                logits[tok as usize] = p.ln() as f32;
            }
        }
        logits
    }
}

impl<S: AsRef<[u8]> + Sync> LanguageModel for InfgramModel<'_, S> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let mut rows = Vec::with_capacity(tokens.len());
        for &t in tokens {
            self.push(t);
            rows.push(self.logits());
        }
        Ok(rows)
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        for &t in tokens {
            self.push(t);
        }
        Ok(())
    }

    fn cache_len(&self) -> usize {
        self.fed.len()
    }

    fn truncate(&mut self, len: usize) {
        if len < self.fed.len() {
            self.fed.truncate(len);
            self.doc_start = self
                .fed
                .iter()
                .rposition(|&t| t == self.separator)
                .map_or(0, |p| p + 1);
            self.tracker = levels::Tracker::default();
            self.appended = None;
        }
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }
}
