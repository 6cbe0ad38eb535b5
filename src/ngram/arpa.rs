//! ARPA export of a [`ClassicModel`]: every n-gram of orders 1…N with its log10 probability
//! and, below the highest order, its log10 back-off weight — the format KenLM's `kenlm.Model`,
//! SRILM and speech decoders read.
//!
//! Streaming: one pass over the suffix array per order writes that order's section, so
//! memory stays bounded (the model's memo of contexts is capped) whatever the corpus size.
//! What ARPA holds is exactly what [`ClassicModel::prob`] computes: the probability of a seen
//! n-gram is the interpolated one, and an unseen one backs off through the stored weights.
//! As `lmplz` writes them: `<unk>` is a unigram, `<s>` has log10 probability 0 (it is never
//! predicted) and n-grams ending in `</s>` or `<unk>` carry no back-off weight.

use super::classic::{ClassicModel, Memo, Smoothing};
use crate::error::{Error, Result};
use crate::index::shards::Shards;
use crate::tokenizer::Tokenizer;
use std::io::Write;

/// What an export wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ArpaSummary {
    /// N-grams written per order.
    pub ngrams: Vec<u64>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Writes `model` (MKN) over `corpus` (an index, or shards held elsewhere) in ARPA format to
/// `out`, words spelled by `tok`.
pub fn write_arpa(
    model: &ClassicModel,
    corpus: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    out: &mut dyn Write,
) -> Result<ArpaSummary> {
    let t0 = std::time::Instant::now();
    if !matches!(model.smoothing(), Smoothing::Mkn { .. }) {
        return Err(Error::input(
            "ARPA export writes the modified Kneser–Ney model: pass --estimator mkn",
        ));
    }
    let unk = crate::tokenizer::words::UNK;
    let words_kind = super::classic::is_words_index(corpus);
    let eos = model.bos().map(|_| crate::tokenizer::words::EOS);
    let spell = |ids: &[u32]| -> Result<String> {
        let words: Result<Vec<String>> = ids
            .iter()
            .map(|&t| {
                if words_kind {
                    match crate::tokenizer::words::SPECIALS.get(t as usize) {
                        Some(special) => Ok(special.to_string()),
                        None => tok.decode(&[t]),
                    }
                } else {
                    // Any other tokenizer: ids, since a token's text may hold whitespace.
                    Ok(format!("<{t}>"))
                }
            })
            .collect();
        Ok(words?.join(" "))
    };
    let io = |e: std::io::Error| Error::io("the ARPA file being written", e);
    let order = model.order();
    let stats = model.stats();
    // The unigrams: the types seen, <unk> and <s> (in sentence mode) as lmplz writes them.
    let mut extra_unigrams: Vec<u32> = Vec::new();
    if words_kind && stats.unigram.get(unk as usize) == Some(&0) {
        extra_unigrams.push(unk);
    }
    if let Some(b) = model.bos() {
        extra_unigrams.push(b);
    }
    let mut counts = stats.ngrams.clone();
    counts[0] += extra_unigrams.len() as u64;
    writeln!(out, "\\data\\").map_err(io)?;
    for (n, c) in counts.iter().enumerate() {
        writeln!(out, "ngram {}={c}", n + 1).map_err(io)?;
    }
    let mut memo = Memo::default();
    let sep = corpus.separator();
    for n in 1..=order {
        writeln!(out, "\n\\{n}-grams:").map_err(io)?;
        let mut line = |g: &[u32], memo: &mut Memo| -> Result<()> {
            let (h, w) = g.split_at(n - 1);
            let p = if Some(w[0]) == model.bos() {
                1.0
            } else {
                model.prob(corpus, memo, h, w[0])?
            };
            let words = spell(g)?;
            let lp = log10(p);
            if n < order {
                let last = w[0];
                let bo = if last == unk && words_kind || Some(last) == eos {
                    0.0
                } else {
                    log10(model.backoff(corpus, memo, g)?)
                };
                writeln!(out, "{lp}\t{words}\t{bo}").map_err(io)
            } else {
                writeln!(out, "{lp}\t{words}").map_err(io)
            }
        };
        if n == 1 {
            for &t in &extra_unigrams {
                line(&[t], &mut memo)?;
            }
        }
        let mut prev: Option<Vec<u32>> = None;
        let mut failed: Option<Error> = None;
        let feeds = corpus.suffix_feeds(n)?;
        if feeds.width < n {
            continue; // no document is n tokens long
        }
        for feed in feeds.feeds {
            feed(&mut |key, _, _| {
                if failed.is_some() || key.contains(&sep) || prev.as_deref() == Some(key) {
                    return;
                }
                if n == 1 && Some(key[0]) == model.bos() {
                    return; // written above
                }
                if let Err(e) = line(key, &mut memo) {
                    failed = Some(e);
                }
                prev = Some(key.to_vec());
            })?;
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
    writeln!(out, "\n\\end\\").map_err(io)?;
    out.flush().map_err(io)?;
    Ok(ArpaSummary {
        ngrams: counts,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// log10 as ARPA writes it (single precision, as `lmplz` stores it).
fn log10(p: f64) -> f32 {
    (p.log10() as f32).min(0.0)
}
