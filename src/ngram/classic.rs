//! Classic fixed-order n-gram language models on the suffix array: interpolated modified
//! Kneser–Ney as KenLM's `lmplz` estimates it, and add-α (MLE at α = 0).
//!
//! A suffix array answers every count these models need, at any order, without pruning, so
//! the model is never materialized: [`ClassicModel::new`] makes one pass over the suffix array
//! for the count-of-counts (hence the discounts) and the unigram table, and each probability is
//! then a few binary searches and, below the highest order, a scan of the context's
//! occurrences (memoized per context in a [`Memo`]).
//!
//! # Modified Kneser–Ney, as `lmplz` computes it
//!
//! With sentences `<s> w₁ … wₖ </s>` (sentence mode), `G_n` is the set of n-grams found inside
//! a sentence. For `g ∈ G_n` the **adjusted count** `a(g)` is its count when `n = N` (the
//! model's order) or when `g` starts with `<s>`, else the number of distinct words found just
//! before it (its continuation count; `<s>` counts as such a word). The count-of-counts
//! `t_{n,k}` (`k = 1…4`) of the adjusted counts of `G_n` give three discounts per order
//! (Chen & Goodman's eq. 26): `Y = t₁ / (t₁ + 2 t₂)`, `D_k = k − (k+1) Y t_{k+1} / t_k`.
//! For a context `h` of order `n − 1`:
//!
//! * `u(w|h) = (a(hw) − D_{a(hw)}) / Σ_x a(hx)` for `hw ∈ G_n` (0 otherwise),
//! * `γ(h) = (D₁ N₁(h) + D₂ N₂(h) + D₃ N₃₊(h)) / Σ_x a(hx)`, where `N_k(h)` counts the `x`
//!   with `a(hx) = k` (3: three or more),
//! * `p(w|h) = u(w|h) + γ(h) · p(w|h')` with `h'` the context without its first word,
//!   down to the unigrams: `p(w) = u(w) + γ(ε) / |V|`, `|V|` the types seen (`</s>` included,
//!   `<s>` not) and `<unk>`; `<unk>` gets `γ(ε) / |V|`.
//!
//! A context that never occurs with a next word backs off with weight 1, which is what a
//! model in ARPA form (stored probabilities and back-off weights) computes, so
//! [`super::arpa`] writes these same numbers. `<s>` is never predicted.
//!
//! Outside sentence mode (any tokenizer) the same formulas run over documents: no n-gram
//! crosses a document boundary, and a document's start counts as one more distinct word
//! before an n-gram found there. `|V|` is then the tokenizer's vocabulary.
//!
//! # Add-α
//!
//! `p(w|h) = (c(hw) + α) / (c(h·) + α |V|)` with `h` the last `N − 1` tokens (fewer at the
//! start of a sentence or document). At α = 0 (MLE) an unseen n-gram has probability 0: the
//! caller floors it or reports it.

use crate::error::{Error, Result};
use crate::index::counting::SuffixFeed;
use crate::index::levels::count_of;
use crate::index::query::Counts;
use crate::index::shards::Shards;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// How the probabilities are smoothed.
#[derive(Clone, Debug, PartialEq)]
pub enum Smoothing {
    /// Interpolated modified Kneser–Ney; `fallback`: discounts to use for an order whose
    /// count-of-counts cannot give them (KenLM's `--discount_fallback`), else that is an error.
    Mkn {
        /// Discounts `D₁, D₂, D₃₊` for an order where the count-of-counts fail.
        fallback: Option<[f64; 3]>,
    },
    /// Add-α (α ≥ 0; 0 is maximum likelihood).
    AddAlpha {
        /// The pseudo-count.
        alpha: f64,
    },
}

/// A classic model as an [`super::Estimator`] names it before it meets an index: its order
/// and smoothing ([`ClassicModel::new`] estimates it over the index).
#[derive(Clone, Debug, PartialEq)]
pub struct ClassicSpec {
    /// The order N.
    pub order: usize,
    /// The smoothing.
    pub smoothing: Smoothing,
}

/// Whether `corpus` was indexed with the `words` tokenizer (KenLM's vocabulary conventions).
pub fn is_words_index(corpus: &(impl Shards + ?Sized)) -> bool {
    corpus
        .tokenizer()
        .is_some_and(|t| t.kind == crate::tokenizer::words::KIND)
}

/// Whether `corpus` was indexed in sentence mode: a words index whose first document starts
/// with `<s>`.
pub fn is_sentence_index(corpus: &(impl Shards + ?Sized)) -> Result<bool> {
    if !is_words_index(corpus) || corpus.num_docs() == 0 {
        return Ok(false);
    }
    let first = corpus.get_doc_by_ix(0, 1)?;
    Ok(first.token_ids.first() == Some(&crate::tokenizer::words::BOS))
}

/// KenLM's default fallback discounts (`--discount_fallback` with no values).
pub const KENLM_FALLBACK: [f64; 3] = [0.5, 1.0, 1.5];

/// What one pass over the suffix array counts, per order `n = 1…N` (index `n − 1`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CountStats {
    /// Distinct n-grams (for unigrams: the types predicted, `<s>` left out).
    pub ngrams: Vec<u64>,
    /// Count-of-counts of adjusted counts: entry `k` is the n-grams with adjusted count
    /// exactly `k` (`k = 1…4`; entry 0 unused).
    pub count_of_counts: Vec<[u64; 5]>,
    /// Adjusted count of each unigram, by id (0 for ids never predicted).
    pub unigram: Vec<u64>,
}

impl CountStats {
    /// Nothing counted yet, for `order` orders and `vocab` ids.
    fn zeros(order: usize, vocab: usize) -> Self {
        CountStats {
            ngrams: vec![0; order],
            count_of_counts: vec![[0; 5]; order],
            unigram: vec![0; vocab],
        }
    }

    /// Adds the counts of another slice of the suffix array (whose n-grams are not these').
    fn add(&mut self, other: &CountStats) {
        for (a, b) in self.ngrams.iter_mut().zip(&other.ngrams) {
            *a += b;
        }
        for (a, b) in self.count_of_counts.iter_mut().zip(&other.count_of_counts) {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
        for (a, b) in self.unigram.iter_mut().zip(&other.unigram) {
            *a += b;
        }
    }
}

/// A classic n-gram model of fixed order over an index.
#[derive(Clone, Debug)]
pub struct ClassicModel {
    order: usize,
    smoothing: Smoothing,
    /// `<s>` of sentence mode (its n-grams keep raw counts; it is never predicted).
    bos: Option<u32>,
    /// Per order: `[0, D₁, D₂, D₃₊]` (MKN).
    discounts: Vec<[f64; 4]>,
    /// `|V|`, the size of the uniform distribution at the bottom.
    uniform: usize,
    /// Complete unigram probabilities by id (MKN).
    unigram: Vec<f64>,
    stats: CountStats,
}

/// Memoized statistics of contexts (one per thread). Bounded: cleared when it holds
/// [`MEMO_LIMIT`] contexts.
#[derive(Default)]
pub struct Memo {
    contexts: HashMap<Vec<u32>, Option<Arc<ContextStats>>>,
}

/// Contexts a [`Memo`] holds at most.
pub const MEMO_LIMIT: usize = 1 << 20;

/// The counts that follow one context.
#[derive(Debug)]
struct ContextStats {
    /// `(x, a(hx))` sorted by `x`.
    counts: Counts,
    /// `Σ_x a(hx)`.
    total: u64,
    /// Back-off weight γ(h) (MKN).
    gamma: f64,
}

impl ClassicSpec {
    /// Checks the order (at least 1) and α (finite, at least 0); an error names the field
    /// (`order`, `alpha`).
    pub fn check(&self) -> Result<()> {
        if self.order == 0 {
            return Err(Error::Field {
                field: "order",
                message: "must be at least 1".into(),
            });
        }
        if let Smoothing::AddAlpha { alpha } = self.smoothing {
            if !(alpha >= 0.0 && alpha.is_finite()) {
                return Err(Error::Field {
                    field: "alpha",
                    message: format!(
                        "must be finite and at least 0, got {}",
                        crate::error::shown(alpha)
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The highest order of a fixed-order model, refused above with the field named: the count
/// pass costs O(tokens × order) time and O(order × vocabulary) memory a thread (at order
/// 5,000 a 283 k-token word index took 1 GB) up to the longest document, and no model of the
/// field conditions on 255 tokens.
pub const MAX_ORDER: usize = 256;

/// Refuses an order above [`MAX_ORDER`]; the error names the field `order`.
fn check_order_bound(order: usize) -> Result<()> {
    if order <= MAX_ORDER {
        return Ok(());
    }
    Err(Error::Field {
        field: "order",
        message: format!(
            "{order} is above {MAX_ORDER}, the highest order infgram's fixed-order models take \
             (the count pass costs time and memory in proportion to the order): give at most \
             {MAX_ORDER}"
        ),
    })
}

impl ClassicModel {
    /// The model of `order` over `corpus` (an index here or shards held elsewhere) with
    /// `smoothing`, in sentence mode when the index was built so ([`is_sentence_index`];
    /// `<s>` = [`crate::tokenizer::words::BOS`]). One pass over the suffixes.
    pub fn new(
        corpus: &(impl Shards + ?Sized),
        order: usize,
        smoothing: Smoothing,
    ) -> Result<Self> {
        let spec = ClassicSpec { order, smoothing };
        spec.check()?;
        let ClassicSpec { order, smoothing } = spec;
        check_order_bound(order)?;
        let bos = is_sentence_index(corpus)?.then_some(crate::tokenizer::words::BOS);
        let vocab = corpus.vocab_size().max(1);
        let mut stats = count_pass(corpus, order, bos, vocab)?;
        stats.ngrams.resize(order, 0);
        stats.count_of_counts.resize(order, [0; 5]);
        let seen = stats.unigram.iter().filter(|&&a| a > 0).count();
        let uniform = if is_words_index(corpus) {
            // KenLM's: the types seen and <unk> (<s> is not predicted).
            seen + usize::from(stats.unigram[crate::tokenizer::words::UNK as usize] == 0)
        } else {
            vocab
        };
        let mut model = ClassicModel {
            order,
            smoothing,
            bos,
            discounts: Vec::new(),
            uniform: uniform.max(1),
            unigram: Vec::new(),
            stats,
        };
        match model.smoothing.clone() {
            Smoothing::Mkn { fallback } => {
                model.discounts = (0..order)
                    .map(|n| discounts(&model.stats.count_of_counts[n], n + 1, fallback))
                    .collect::<Result<_>>()?;
                model.unigram = model.mkn_unigrams();
            }
            Smoothing::AddAlpha { .. } => {}
        }
        Ok(model)
    }

    /// The order N.
    pub fn order(&self) -> usize {
        self.order
    }

    /// The smoothing.
    pub fn smoothing(&self) -> &Smoothing {
        &self.smoothing
    }

    /// `|V|`, the size of the uniform distribution at the bottom.
    pub fn uniform_size(&self) -> usize {
        self.uniform
    }

    /// What the pass over the suffix array counted.
    pub fn stats(&self) -> &CountStats {
        &self.stats
    }

    /// The discounts `[0, D₁, D₂, D₃₊]` of each order (MKN; empty for add-α).
    pub fn discounts(&self) -> &[[f64; 4]] {
        &self.discounts
    }

    /// The start-of-sentence id in sentence mode.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    fn mkn_unigrams(&self) -> Vec<f64> {
        let a = &self.stats.unigram;
        let d = &self.discounts[0];
        let total: u64 = a.iter().sum::<u64>().max(1);
        let gamma = discounted_mass(d, a.iter().copied(), total);
        let base = gamma / self.uniform as f64;
        let mut p: Vec<f64> = a.iter().map(|&c| discounted(d, c, total) + base).collect();
        if let Some(b) = self.bos {
            // KenLM gives <s> probability 1: it is never predicted, only a context.
            p[b as usize] = 1.0;
        }
        p
    }

    /// The probability of `w` after `ctx` (the tokens before it in its sentence or document;
    /// only the last `N − 1` count). Add-α at α = 0 gives 0 for an unseen n-gram.
    pub fn prob(
        &self,
        corpus: &(impl Shards + ?Sized),
        memo: &mut Memo,
        ctx: &[u32],
        w: u32,
    ) -> Result<f64> {
        let h = &ctx[ctx.len().saturating_sub(self.order - 1)..];
        match self.smoothing {
            Smoothing::AddAlpha { alpha } => {
                let (c, total) = match self.context(corpus, memo, h)? {
                    Some(st) => (count_of(&st.counts, w) as f64, st.total as f64),
                    None => (0.0, 0.0),
                };
                let den = total + alpha * self.uniform as f64;
                Ok(if den > 0.0 { (c + alpha) / den } else { 0.0 })
            }
            Smoothing::Mkn { .. } => {
                let mut p = self.unigram.get(w as usize).copied().unwrap_or_else(|| {
                    // An id past the index's vocabulary: never seen, as <unk>.
                    self.unigram[crate::tokenizer::words::UNK as usize]
                });
                for j in 1..=h.len() {
                    let Some(st) = self.context(corpus, memo, &h[h.len() - j..])? else {
                        break;
                    };
                    let a = count_of(&st.counts, w);
                    p = discounted(&self.discounts[j], a, st.total) + st.gamma * p;
                }
                Ok(p)
            }
        }
    }

    /// The whole next-token distribution after `ctx`, dense over the index's ids, into `out`
    /// (`<s>` and the separator get 0). Each entry equals [`ClassicModel::prob`].
    pub fn distribution_into(
        &self,
        corpus: &(impl Shards + ?Sized),
        memo: &mut Memo,
        ctx: &[u32],
        out: &mut Vec<f64>,
    ) -> Result<()> {
        let vocab = corpus.vocab_size();
        let h = &ctx[ctx.len().saturating_sub(self.order - 1)..];
        out.clear();
        match self.smoothing {
            Smoothing::AddAlpha { alpha } => {
                let st = self.context(corpus, memo, h)?;
                let total = st.as_ref().map_or(0, |s| s.total) as f64;
                let den = total + alpha * self.uniform as f64;
                out.resize(vocab, if den > 0.0 { alpha / den } else { 0.0 });
                if let Some(st) = st {
                    for &(t, c) in &st.counts {
                        if let Some(x) = out.get_mut(t as usize) {
                            *x = (c as f64 + alpha) / den;
                        }
                    }
                }
            }
            Smoothing::Mkn { .. } => {
                out.extend_from_slice(&self.unigram[..vocab.min(self.unigram.len())]);
                out.resize(vocab, self.unigram[crate::tokenizer::words::UNK as usize]);
                for j in 1..=h.len() {
                    let Some(st) = self.context(corpus, memo, &h[h.len() - j..])? else {
                        break;
                    };
                    let d = &self.discounts[j];
                    for x in out.iter_mut() {
                        *x *= st.gamma;
                    }
                    for &(t, a) in &st.counts {
                        if let Some(x) = out.get_mut(t as usize) {
                            *x += discounted(d, a, st.total);
                        }
                    }
                }
            }
        }
        if let Some(b) = self.bos {
            if let Some(x) = out.get_mut(b as usize) {
                *x = 0.0;
            }
        }
        Ok(())
    }

    /// The context a generation has after `doc` (the tokens of its current document): in
    /// sentence mode, `<s>` and the words since the last `</s>`.
    pub fn context_of(&self, doc: &[u32]) -> Vec<u32> {
        let keep = self.order.saturating_sub(1);
        match self.bos {
            Some(bos) => {
                let eos = crate::tokenizer::words::EOS;
                let start = doc.iter().rposition(|&t| t == eos).map_or(0, |p| p + 1);
                let words = &doc[start..];
                let mut ctx = vec![bos];
                ctx.extend_from_slice(&words[words.len().saturating_sub(keep)..]);
                ctx
            }
            None => doc[doc.len().saturating_sub(keep)..].to_vec(),
        }
    }

    /// The back-off weight γ(h) of a context (1 for one that never occurs with a next word),
    /// as ARPA stores it.
    pub fn backoff(
        &self,
        corpus: &(impl Shards + ?Sized),
        memo: &mut Memo,
        h: &[u32],
    ) -> Result<f64> {
        Ok(self.context(corpus, memo, h)?.map_or(1.0, |st| st.gamma))
    }

    /// The statistics of context `h` (`|h| < N`; empty only for add-α), memoized; `None` when it never occurs
    /// with a next token.
    fn context(
        &self,
        corpus: &(impl Shards + ?Sized),
        memo: &mut Memo,
        h: &[u32],
    ) -> Result<Option<Arc<ContextStats>>> {
        if let Some(st) = memo.contexts.get(h) {
            return Ok(st.clone());
        }
        if memo.contexts.len() >= MEMO_LIMIT {
            memo.contexts.clear();
        }
        let st = self.context_stats(corpus, h)?.map(Arc::new);
        memo.contexts.insert(h.to_vec(), st.clone());
        Ok(st)
    }

    fn context_stats(
        &self,
        corpus: &(impl Shards + ?Sized),
        h: &[u32],
    ) -> Result<Option<ContextStats>> {
        let order = h.len() + 1;
        let raw = matches!(self.smoothing, Smoothing::AddAlpha { .. })
            || order == self.order
            || self.bos.is_some_and(|b| h[0] == b);
        let counts = if raw {
            let mut counts = corpus.next_counts(h)?;
            if let Some(b) = self.bos {
                // Only the empty context (add-α's unigrams) is followed by <s>: not predicted.
                counts.retain(|&(x, _)| x != b);
            }
            counts
        } else {
            let mut counts = corpus.continuation_counts(&[h], false)?;
            counts.pop().unwrap_or_default()
        };
        let total: u64 = counts.iter().map(|&(_, c)| c).sum();
        if total == 0 {
            return Ok(None);
        }
        let gamma = match self.smoothing {
            Smoothing::Mkn { .. } => discounted_mass(
                &self.discounts[order - 1],
                counts.iter().map(|&(_, c)| c),
                total,
            ),
            Smoothing::AddAlpha { .. } => 0.0,
        };
        Ok(Some(ContextStats {
            counts,
            total,
            gamma,
        }))
    }
}

/// `(a − D(a)) / total`: what an adjusted count `a` keeps of its share after discounting with
/// `d = [0, D₁, D₂, D₃₊]` (0 for `a = 0`, since `D(0) = 0`).
fn discounted(d: &[f64; 4], a: u64, total: u64) -> f64 {
    (a as f64 - d[a.min(3) as usize]) / total as f64
}

/// γ: the mass the discounts `d` take from adjusted counts `counts` summing to `total`.
fn discounted_mass(d: &[f64; 4], counts: impl Iterator<Item = u64>, total: u64) -> f64 {
    counts.map(|a| d[a.min(3) as usize]).sum::<f64>() / total as f64
}

/// KenLM's discounts of one order from its count-of-counts (computed in `f32` as `lmplz` does).
fn discounts(t: &[u64; 5], n: usize, fallback: Option<[f64; 3]>) -> Result<[f64; 4]> {
    let fail = |why: String| -> Result<[f64; 4]> {
        match fallback {
            Some(f) => Ok([0.0, f[0], f[1], f[2]]),
            None => Err(Error::Option {
                option: "discount_fallback",
                message: format!(
                    "could not estimate Kneser–Ney discounts for {n}-grams: {why} (their \
                     adjusted counts 1, 2, 3 and 4 occur {}, {}, {} and {} times); the corpus \
                     is small or artificial (try deduplicating it), or pass {{option}}",
                    t[1], t[2], t[3], t[4]
                ),
            }),
        }
    };
    if let Some(k) = (1..4).find(|&k| t[k] == 0) {
        return fail(format!("no {n}-gram has adjusted count {k}"));
    }
    let y = t[1] as f32 / (t[1] as f32 + 2.0 * t[2] as f32);
    let mut d = [0.0f64; 4];
    for k in 1..4 {
        let dk = k as f32 - (k + 1) as f32 * y * t[k + 1] as f32 / t[k] as f32;
        if !(0.0..=k as f32).contains(&dk) {
            return fail(format!(
                "the discount of adjusted count {k} is {dk}, out of [0, {k}]"
            ));
        }
        d[k] = dk as f64;
    }
    Ok(d)
}

/// The pass over the corpus's suffixes: distinct n-grams, count-of-counts of adjusted counts
/// per order, and the unigrams' adjusted counts (the slices of [`Shards::suffix_feeds`] on
/// several threads, their counts added).
fn count_pass(
    corpus: &(impl Shards + ?Sized),
    order: usize,
    bos: Option<u32>,
    vocab: usize,
) -> Result<CountStats> {
    let sep = corpus.separator();
    let feeds = corpus.suffix_feeds(order)?;
    let counted = feeds.width;
    let partial: Vec<CountStats> = feeds
        .feeds
        .into_par_iter()
        .map(|feed| count_groups(counted, bos, vocab, sep, feed))
        .collect::<Result<_>>()?;
    let mut stats = CountStats::zeros(counted, vocab);
    for p in &partial {
        stats.add(p);
    }
    Ok(stats)
}

/// The count pass's groups over the suffixes `feed` gives (in suffix order): each distinct
/// n-gram's adjusted count, into count-of-counts and the unigram table.
fn count_groups(
    order: usize,
    bos: Option<u32>,
    vocab: usize,
    sep: u32,
    feed: SuffixFeed<'_>,
) -> Result<CountStats> {
    let mut stats = CountStats::zeros(order, vocab);
    // Per order: the open group's count and distinct left tokens (stamped by group number).
    let mut count = vec![0u64; order];
    let mut distinct = vec![0u64; order];
    let mut group = vec![0u32; order];
    let mut stamps: Vec<Vec<u32>> = vec![vec![0; vocab + 1]; order.saturating_sub(1)];
    let mut prev: Vec<u32> = vec![sep; order];
    let close = |n: usize, key: &[u32], count: u64, distinct: u64, stats: &mut CountStats| {
        if n == 0 && bos == Some(key[0]) {
            return; // <s> is never predicted: not a unigram of the model.
        }
        let raw = n + 1 == order || bos == Some(key[0]);
        let a = if raw { count } else { distinct };
        stats.ngrams[n] += 1;
        if a <= 4 {
            stats.count_of_counts[n][a as usize] += 1;
        }
        if n == 0 && (key[0] as usize) < vocab {
            stats.unigram[key[0] as usize] = a;
        }
    };
    let mut first = true;
    feed(&mut |key: &[u32], left: u32, suffixes: u64| {
        let lcp = if first {
            0
        } else {
            key.iter()
                .zip(&prev)
                .take_while(|(a, b)| a == b && **a != sep)
                .count()
        };
        // Close the groups of the previous key that end here (longest first).
        if !first {
            for n in (lcp..order).rev() {
                if prev[n] != sep {
                    close(n, &prev, count[n], distinct[n], &mut stats);
                }
            }
        }
        first = false;
        for n in 0..order {
            if key[n] == sep {
                break;
            }
            if n >= lcp {
                count[n] = 0;
                distinct[n] = 0;
                group[n] = group[n].wrapping_add(1);
            }
            count[n] += suffixes;
            if n + 1 < order {
                let slot = &mut stamps[n][(left as usize).min(vocab)];
                if *slot != group[n] {
                    *slot = group[n];
                    distinct[n] += 1;
                }
            }
        }
        prev.copy_from_slice(key);
    })?;
    if !first {
        for n in (0..order).rev() {
            if prev[n] != sep {
                close(n, &prev, count[n], distinct[n], &mut stats);
            }
        }
    }
    Ok(stats)
}
