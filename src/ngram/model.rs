//! The ∞-gram as a [`LanguageModel`], so that generation from the index alone runs through the
//! same decode loop as neural decoding, and the ∞-gram can be scored, mixed and verified like
//! any model.
//!
//! Each fed token's row holds the natural logarithms of the estimator's next-token
//! probabilities, as a sparse row over the estimator's support (SBIS gives a handful of
//! tokens; the decode loop never builds a dense row for it); the sampler's softmax and
//! temperature then give `P^(1/T)`, the ∞-gram generator's rule. The index's document separator
//! is the end token, and feeding the end token starts a new document: the context after it is
//! empty. The incremental level tracker of [`crate::index::levels`] keeps a step at about a microsecond
//! per corpus occurrence it follows; truncating the context (a rolled-back draft) resets it.
//!
//! Vocabulary: over a byte index (255 byte ids, separator 255) the model has 256 ids and the
//! separator is its own end token. Over an index built with a neural model's tokenizer
//! (separator 65,535 or 2³²−1, far past the vocabulary), [`InfgramModel::with_vocab`] gives the
//! model's exact vocabulary and maps the separator to the model's end token, so the two
//! distributions line up id for id.

use super::classic::{ClassicModel, Memo as ClassicMemo};
use super::Estimator;
use crate::error::{Error, Result};
use crate::index::levels::{Level, LevelAsk, Memo};
use crate::index::shards::{Shards, SharedShards};
use crate::lm::{LanguageModel, Logits};

/// The levels used at each scored position, for `--stats`: suffix length `n` and total `m`
/// of each kept level, longest first. One flat list, so recording a step allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct LevelLog {
    /// Where each step's levels end in `levels`.
    ends: Vec<usize>,
    levels: Vec<(usize, u64)>,
}

/// Steps a [`LevelLog`] records at most (the first ones): its memory stays bounded (a few
/// tens of MB) however long a generation runs; statistics come from these steps.
pub const LEVEL_LOG_STEPS: usize = 100_000;

impl LevelLog {
    /// Records one step's levels (nothing after the first [`LEVEL_LOG_STEPS`] steps).
    pub fn push(&mut self, levels: impl IntoIterator<Item = (usize, u64)>) {
        if self.ends.len() >= LEVEL_LOG_STEPS {
            return;
        }
        self.levels.extend(levels);
        self.ends.push(self.levels.len());
    }

    /// Steps recorded.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no step was recorded.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The `(n, m)` of each level of every step, in order.
    pub fn steps(&self) -> impl Iterator<Item = &[(usize, u64)]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.levels[a..b])
    }
}

/// Next-token distributions of the ∞-gram of a corpus: an index in this process or shards
/// held elsewhere ([`Shards`]).
pub struct InfgramModel {
    corpus: SharedShards,
    /// The model's reads of levels (the tracked suffixes of the last step among them).
    memo: Memo,
    estimator: Estimator,
    /// Tokens of context the estimator looks at.
    window: usize,
    /// Every fed token, in index ids (end tokens mapped to the separator).
    fed: Vec<u32>,
    /// Where the current document starts in `fed` (after the last separator).
    doc_start: usize,
    /// The token fed since the levels were last computed, for the tracker.
    appended: Option<u32>,
    separator: u32,
    /// Ids the estimator ranges over: the index's vocabulary and the separator.
    index_vocab: usize,
    /// Ids of the rows (the model's vocabulary with [`InfgramModel::with_vocab`]).
    vocab: usize,
    /// The id the separator is reported as (and read back from).
    eos: [u32; 1],
    /// Scratch space for the estimator's distribution.
    dist: Vec<(u32, f64)>,
    /// The levels of the current step (kept between steps for their allocation).
    levels: Vec<Level>,
    /// Allocations of recycled rows: the list, and the rows' entries.
    spare_rows: Vec<Logits>,
    spare_entries: Vec<Vec<(u32, f32)>>,
    /// The levels used at each scored position, for `--stats`.
    pub steps: LevelLog,
    /// The evidence of each row of the last [`LanguageModel::score`] call.
    evidence: Vec<super::Evidence>,
    /// A classic fixed-order model ([`Estimator::Classic`]), estimated over the index, and
    /// its memo of contexts; its rows come from it, not from levels.
    classic: Option<(ClassicModel, ClassicMemo)>,
    /// Scratch space for a classic model's dense distribution.
    dense: Vec<f64>,
}

impl InfgramModel {
    /// The ∞-gram of `corpus` (an index, or shards held elsewhere) with `estimator`, looking
    /// at the last `window` tokens. Its vocabulary is the corpus's ids and the separator, which
    /// is the end token (for a byte index: 256 ids, end token 255). An index of a neural
    /// model's tokens wants [`InfgramModel::with_vocab`]. Over shards held elsewhere each
    /// position asks every shard once for its change points (and once more for the smoothed
    /// estimator's continuation counts); a classic estimator's counting pass asks each shard
    /// for all its suffixes once, here.
    pub fn new(corpus: SharedShards, estimator: Estimator, window: usize) -> Result<Self> {
        if corpus.infos().iter().all(|i| i.tokens == i.documents) {
            return Err(Error::input(
                "the index is empty: index a corpus with some text first",
            ));
        }
        let classic = match &estimator {
            Estimator::Classic(spec) => {
                let model = ClassicModel::new(&*corpus, spec.order, spec.smoothing.clone())?;
                Some((model, ClassicMemo::default()))
            }
            _ => None,
        };
        let separator = corpus.separator();
        let index_vocab = corpus.vocab_size().max(separator as usize + 1);
        Ok(InfgramModel {
            corpus,
            memo: Memo::new(true),
            estimator,
            window: window.max(1),
            fed: Vec::new(),
            doc_start: 0,
            appended: None,
            separator,
            index_vocab,
            vocab: index_vocab,
            eos: [separator],
            dist: Vec::new(),
            levels: Vec::new(),
            spare_rows: Vec::new(),
            spare_entries: Vec::new(),
            steps: LevelLog::default(),
            evidence: Vec::new(),
            classic,
            dense: Vec::new(),
        })
    }

    /// The same model over exactly `vocab` ids, with the separator reported as `end_token` (a
    /// neural model's end-of-text id) and `end_token` fed back read as the separator. Corpus
    /// tokens at or beyond `vocab` (none, for an index built with the model's tokenizer) are
    /// left out of the rows.
    pub fn with_vocab(mut self, vocab: usize, end_token: u32) -> Result<Self> {
        if end_token as usize >= vocab {
            return Err(Error::input(format!(
                "end token {end_token} is outside the vocabulary of {vocab} ids"
            )));
        }
        self.vocab = vocab;
        self.eos = [end_token];
        Ok(self)
    }

    /// What the ∞-gram knew at each row of the last [`LanguageModel::score`] call.
    pub fn last_evidence(&self) -> &[super::Evidence] {
        &self.evidence
    }

    /// How the level finder's counts cache has served (nothing to say over remote shards:
    /// their own caches serve them).
    pub fn cache_stats(&self) -> crate::index::counts_cache::CacheStats {
        self.corpus.cache_stats(&self.memo)
    }

    /// A token of the model's vocabulary as an index id.
    fn to_index_id(&self, token: u32) -> u32 {
        if token == self.eos[0] {
            self.separator
        } else {
            token
        }
    }

    fn push(&mut self, token: u32) {
        let token = self.to_index_id(token);
        if self.appended.is_some() {
            // Two tokens since the last levels: the tracker only advances by one.
            self.memo.forget_steps();
        }
        self.fed.push(token);
        if token == self.separator {
            self.doc_start = self.fed.len();
            self.memo.forget_steps();
            self.appended = None;
        } else {
            self.appended = Some(token);
        }
    }

    /// The levels after the tokens fed so far (the unigram level when nothing matches), into
    /// `self.levels`.
    fn find_levels(&mut self) -> Result<()> {
        let doc = &self.fed[self.doc_start..];
        let ctx = &doc[doc.len().saturating_sub(self.window)..];
        let appended = self.appended.take();
        let corpus = &*self.corpus;
        match self.estimator {
            Estimator::Sbis { k, .. } => {
                corpus.next_levels(&mut self.memo, ctx, appended, k, &mut self.levels)?
            }
            _ => self.levels = self.estimator.levels(corpus, &mut self.memo, ctx)?,
        }
        if self.levels.is_empty() {
            // Nothing of the context occurs (e.g. an empty prompt): back off to the unigram.
            self.levels = corpus.levels(&mut self.memo, LevelAsk::unigram())?;
        }
        Ok(())
    }

    /// The row after the tokens fed so far: ln p of every token with p > 0, by model id.
    fn row(&mut self) -> Result<Logits> {
        if let Some((model, memo)) = &mut self.classic {
            let ctx = model.context_of(&self.fed[self.doc_start..]);
            model.distribution_into(&*self.corpus, memo, &ctx, &mut self.dense)?;
            self.steps.push(std::iter::empty());
            self.evidence.push(super::Evidence::default());
            self.dist.clear();
            self.dist
                .extend(self.dense.iter().enumerate().map(|(t, &p)| (t as u32, p)));
            return Ok(self.row_from_dist());
        }
        self.find_levels()?;
        let levels = std::mem::take(&mut self.levels);
        self.steps.push(levels.iter().map(|l| (l.len, l.total)));
        self.evidence.push(super::Evidence::of(&levels));
        let row = self.row_of(&levels);
        self.levels = levels;
        // Dropped now, so the tracker can refill their counts at the next step.
        self.levels.clear();
        Ok(row)
    }

    /// The estimator's row over `levels`, by model id.
    fn row_of(&mut self, levels: &[Level]) -> Logits {
        self.estimator
            .distribution_into(levels, self.index_vocab, &mut self.dist);
        self.row_from_dist()
    }

    /// The row of the distribution in `self.dist` (index ids), by model id.
    fn row_from_dist(&mut self) -> Logits {
        // Index ids as ids of the model's vocabulary (the separator as the end token; none
        // outside the vocabulary).
        let (separator, eos, vocab) = (self.separator, self.eos[0], self.vocab);
        let to_model_id = |id: u32| {
            let t = if id == separator { eos } else { id };
            ((t as usize) < vocab).then_some(t)
        };
        let mut entries = self.spare_entries.pop().unwrap_or_default();
        entries.clear();
        entries.extend(
            self.dist
                .iter()
                .filter(|&&(_, p)| p > 0.0)
                .filter_map(|&(id, p)| Some((to_model_id(id)?, p.ln() as f32))),
        );
        if self.eos[0] != self.separator {
            // The separator moved to the end token's place: restore the id order.
            entries.sort_unstable_by_key(|e| e.0);
        }
        Logits::Sparse {
            vocab: self.vocab,
            entries,
        }
    }
}

impl LanguageModel for InfgramModel {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        Ok(self
            .score(tokens)?
            .into_iter()
            .map(Logits::into_dense)
            .collect())
    }

    fn score(&mut self, tokens: &[u32]) -> Result<Vec<Logits>> {
        self.evidence.clear();
        let mut rows = std::mem::take(&mut self.spare_rows);
        rows.clear();
        rows.reserve(tokens.len());
        for &t in tokens {
            self.push(t);
            rows.push(self.row()?);
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
            self.memo.forget_steps();
            self.appended = None;
        }
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn recycle(&mut self, mut rows: Vec<Logits>) {
        for row in rows.drain(..) {
            if let (Logits::Sparse { entries, .. }, true) = (row, self.spare_entries.len() < 64) {
                self.spare_entries.push(entries);
            }
        }
        self.spare_rows = rows;
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }

    /// SBIS over the first `k` levels of the context, down to the unigram (the empty
    /// context), that have a continuation outside `masked`: when a processor (the copy guard)
    /// masked every continuation of the kept levels, the next shorter levels whose
    /// continuations are allowed take over, with the same decay. The smoothed estimator's rows
    /// already cover the vocabulary: `None`.
    fn backoff(&mut self, context: &[u32], masked: &[u32]) -> Result<Option<Logits>> {
        let Estimator::Sbis { k, .. } = self.estimator else {
            return Ok(None);
        };
        // The masked ids as index ids, sorted for lookups.
        let mut masked: Vec<u32> = masked.iter().map(|&t| self.to_index_id(t)).collect();
        masked.sort_unstable();
        let allowed = |counts: &crate::index::query::Counts| {
            counts.iter().any(|c| masked.binary_search(&c.0).is_err())
        };
        let ids: Vec<u32> = context.iter().map(|&t| self.to_index_id(t)).collect();
        let doc = match ids.iter().rposition(|&t| t == self.separator) {
            Some(p) => &ids[p + 1..],
            None => &ids[..],
        };
        let ctx = &doc[doc.len().saturating_sub(self.window)..];
        let ask = LevelAsk {
            include_empty: true,
            keep: &allowed,
            ..LevelAsk::new(ctx, k)
        };
        let levels = self.corpus.levels(&mut self.memo, ask)?;
        if levels.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.row_of(&levels)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_log_keeps_the_first_steps_only() {
        let mut log = LevelLog::default();
        for i in 0..LEVEL_LOG_STEPS + 50 {
            log.push([(i, 1), (i + 1, 2)]);
        }
        assert_eq!(log.len(), LEVEL_LOG_STEPS);
        assert_eq!(log.steps().next().unwrap(), &[(0, 1), (1, 2)]);
        assert_eq!(log.steps().last().unwrap()[0].0, LEVEL_LOG_STEPS - 1);
    }
}
