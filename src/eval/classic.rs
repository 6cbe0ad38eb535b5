//! Perplexity of a classic fixed-order n-gram model ([`crate::ngram::classic`]) on a text, the
//! way KenLM's `query` reports it: in sentence mode every line is scored as
//! `<s> words </s>`, `</s>` scored and `<s>` not, and the perplexity counts every word and every
//! `</s>` (out-of-vocabulary words included, as `<unk>`). Each sentence's log10 probability is
//! kept, as `kenlm.Model.score` gives it.

use crate::error::{Error, Result};
use crate::index::shards::Shards;
use crate::ngram::classic::{ClassicModel, Memo};
use crate::tokenizer::Tokenizer;
use rayon::prelude::*;
use serde::Serialize;

/// The score of a text under a classic model.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClassicReport {
    /// Perplexity: `10^(−Σ log10 p / tokens)`.
    pub ppl: f64,
    /// Scored tokens (words and `</s>`).
    pub tokens: u64,
    /// Sentences (sentence mode) or 1.
    pub sentences: u64,
    /// Scored words the index never had (`<unk>`; words tokenizer only).
    pub oov: u64,
    /// Tokens that had probability 0 (add-α at α = 0) and got the floor.
    pub floored: u64,
    /// Sum of the log10 probabilities.
    pub log10_prob: f64,
    /// Log10 probability of each sentence (sentence mode), in order.
    pub sentence_log10: Vec<f64>,
    /// Wall-clock seconds of the scoring.
    pub seconds: f64,
}

/// The token sequences a text is scored as: one per line with `<s>` and `</s>` in sentence
/// mode (a tokenizer with sentence marks), else the whole text.
pub fn scored_sequences(tok: &dyn Tokenizer, text: &str, sentences: bool) -> Result<Vec<Vec<u32>>> {
    if !sentences {
        return Ok(vec![tok.encode(text)?]);
    }
    let marks = tok.sentence_marks().ok_or_else(|| {
        Error::input(format!(
            "sentence mode needs a tokenizer with <s> and </s>: an index built with \
             `--tokenizer words --sentences` (this one's is {})",
            tok.name()
        ))
    })?;
    crate::tokenizer::words::encode_sentences(tok, text, marks)
}

/// Scores `sequences` (each a sentence or document; its first token is context only): each
/// token with the tokens before it in its sequence. A probability of 0 takes `floor`, or is an
/// error without one.
pub fn score(
    corpus: &(impl Shards + ?Sized),
    model: &ClassicModel,
    sequences: &[Vec<u32>],
    floor: Option<f64>,
) -> Result<ClassicReport> {
    let t0 = std::time::Instant::now();
    let words_kind = crate::ngram::classic::is_words_index(corpus);
    // One slice a thread: each keeps its own memo of contexts, and a context of a large
    // corpus (its continuation counts) is worth computing once per thread, not per slice.
    let chunk = sequences
        .len()
        .div_ceil(rayon::current_num_threads())
        .max(1);
    type Part = (Vec<f64>, u64, u64, u64);
    let parts: Vec<Result<Part>> = sequences
        .par_chunks(chunk)
        .map(|chunk| {
            let mut memo = Memo::default();
            let (mut logs, mut tokens, mut oov, mut floored) = (Vec::new(), 0, 0, 0);
            for seq in chunk {
                let mut sum = 0.0;
                for i in 1..seq.len() {
                    let w = seq[i];
                    let mut p = model.prob(corpus, &mut memo, &seq[..i], w)?;
                    if p <= 0.0 {
                        p = floor.ok_or_else(|| Error::Option {
                            option: "floor",
                            message: format!(
                                "token {i} of a sequence has probability 0 under this model \
                                 (an unseen n-gram at α = 0): pass {{option}} or an α above 0"
                            ),
                        })?;
                        floored += 1;
                    }
                    sum += p.log10();
                    tokens += 1;
                    oov += u64::from(words_kind && w == crate::tokenizer::words::UNK);
                }
                logs.push(sum);
            }
            Ok((logs, tokens, oov, floored))
        })
        .collect();
    let mut r = ClassicReport::default();
    for part in parts {
        let (logs, tokens, oov, floored) = part?;
        r.sentence_log10.extend(logs);
        r.tokens += tokens;
        r.oov += oov;
        r.floored += floored;
    }
    if r.tokens == 0 {
        return Err(Error::input("the text has nothing to score"));
    }
    r.sentences = sequences.len() as u64;
    r.log10_prob = r.sentence_log10.iter().sum();
    r.ppl = 10f64.powf(-r.log10_prob / r.tokens as f64);
    r.seconds = t0.elapsed().as_secs_f64();
    Ok(r)
}
