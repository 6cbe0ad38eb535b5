//! Perplexity of any language model in sliding windows.

use crate::error::{Error, Result};
use crate::lm::LanguageModel;

/// Perplexity of a token sequence under the model, in windows of at most `window` tokens
/// moved by `stride` (the infini-gram paper's protocol: 1,024 and 512; see `ARCHITECTURE.md`,
/// "Evaluation protocols"): each token is scored once, with the most context its window gives;
/// the first token has no context and is not scored. Returns (mean −ln p, tokens scored).
pub fn windowed_perplexity(
    model: &mut dyn LanguageModel,
    tokens: &[u32],
    window: usize,
    stride: usize,
) -> Result<(f64, usize)> {
    let nll = windowed_neg_log_probs(model, tokens, window, stride)?;
    Ok((nll.iter().sum::<f64>() / nll.len() as f64, nll.len()))
}

/// −ln p of every token but the first (entry `i` is token `i + 1`), scored in windows as
/// [`windowed_perplexity`] does.
pub fn windowed_neg_log_probs(
    model: &mut dyn LanguageModel,
    tokens: &[u32],
    window: usize,
    stride: usize,
) -> Result<Vec<f64>> {
    let mut nll = Vec::with_capacity(tokens.len().saturating_sub(1));
    windowed_rows(model, tokens, window, stride, |target, row| {
        nll.push(row.neg_log_prob(tokens[target]));
    })?;
    Ok(nll)
}

/// Calls `each(target, row)` with the model's row predicting `tokens[target]`, for every
/// target but the first in order, scored in windows as [`windowed_perplexity`] does.
pub fn windowed_rows(
    model: &mut dyn LanguageModel,
    tokens: &[u32],
    window: usize,
    stride: usize,
    mut each: impl FnMut(usize, &crate::lm::Logits),
) -> Result<()> {
    if tokens.len() < 2 || window < 2 || stride == 0 || stride > window {
        return Err(Error::input(
            "need at least two tokens, a window of at least 2 and 0 < stride <= window",
        ));
    }
    let mut done = 1; // tokens[0..done] are scored (token 0 never is)
    let mut begin = 0;
    while done < tokens.len() {
        let end = (begin + window).min(tokens.len());
        model.clear();
        let rows = model.score(&tokens[begin..end])?;
        // Row r predicts tokens[begin + r + 1]; score the targets not scored yet.
        for target in done.max(begin + 1)..end {
            each(target, &rows[target - begin - 1]);
        }
        done = end;
        begin += stride;
    }
    Ok(())
}
