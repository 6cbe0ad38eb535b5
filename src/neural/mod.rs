//! Neural language models run by candle, behind one trait the generation runtime uses.
//!
//! This layer knows nothing of the ∞-gram index. A [`LanguageModel`] is fed tokens and returns
//! the logits of *every* fed position (speculative verification scores several draft tokens in
//! one pass; mixing needs the full distribution at each step), and its KV cache can be cut back
//! to any length (rolling back rejected drafts).

pub mod attention;
pub mod candle_llama;
pub mod gguf;
pub mod hf_llama;
pub mod kernels;
pub mod llama;
pub mod pool;
pub mod source;

use crate::error::Result;

/// A causal language model with a KV cache.
pub trait LanguageModel {
    /// Feeds `tokens` after the cached ones; returns one row of logits per fed token.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>>;
    /// Feeds `tokens` without returning logits (a prompt): models may skip work.
    fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.forward(tokens).map(drop)
    }
    /// Tokens in the KV cache.
    fn cache_len(&self) -> usize;
    /// Cuts the KV cache back to its first `len` tokens.
    fn truncate(&mut self, len: usize);
    /// Empties the KV cache.
    fn clear(&mut self) {
        self.truncate(0);
    }
    /// Number of logits per position.
    fn vocab_size(&self) -> usize;
    /// Ids that end a generation.
    fn eos_tokens(&self) -> &[u32];
}

/// Refuses token ids at or beyond `vocab` (every model's forward pass checks its input).
pub fn check_vocab(tokens: &[u32], vocab: usize) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(bad) => Err(crate::error::Error::input(format!(
            "token id {bad} is outside the model's vocabulary ({vocab})"
        ))),
        None => Ok(()),
    }
}

/// Index of the largest logit (the smallest id among ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// −ln p(`token`) under the softmax of `logits` (log-sum-exp in f64).
pub fn neg_log_prob(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln() - logits[token as usize] as f64
}

/// Softmax of `logits` as `(id, probability)` pairs, for the shared sampler.
pub fn softmax(logits: &[f32]) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exps: Vec<f64> = logits.iter().map(|&x| (x as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter()
        .enumerate()
        .map(|(i, e)| (i as u32, e / sum))
        .collect()
}

/// The chat template of SmolLM2-Instruct (ChatML) around one user message. The GGUF's own
/// template also inserts a default system message; with it this 135M model answered "What is
/// the capital of France?" with French gibberish (both backends), without it "Paris", so
/// infgram leaves it out.
pub fn chat_prompt(user: &str) -> String {
    format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
}

/// Perplexity of a token sequence under the model, in windows of at most `window` tokens
/// moved by `stride` (DESIGN.md §5): each token is scored once, with the most context its
/// window gives; the first token has no context and is not scored. Returns (mean −ln p, scored).
pub fn perplexity(
    model: &mut dyn LanguageModel,
    tokens: &[u32],
    window: usize,
    stride: usize,
) -> Result<(f64, usize)> {
    if tokens.len() < 2 || window < 2 || stride == 0 || stride > window {
        return Err(crate::Error::input(
            "need at least two tokens, a window of at least 2 and 0 < stride <= window",
        ));
    }
    let (mut nll, mut scored) = (0.0f64, 0usize);
    let mut done = 1; // tokens[0..done] are scored (token 0 never is)
    let mut begin = 0;
    while done < tokens.len() {
        let end = (begin + window).min(tokens.len());
        model.clear();
        let logits = model.forward(&tokens[begin..end])?;
        // Row r predicts tokens[begin + r + 1]; score the targets not scored yet.
        for target in done.max(begin + 1)..end {
            nll += neg_log_prob(&logits[target - begin - 1], tokens[target]);
            scored += 1;
        }
        done = end;
        begin += stride;
    }
    Ok((nll / scored as f64, scored))
}
