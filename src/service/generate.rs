//! Assembling generations: from the index alone (the decode loop with the ∞-gram as its
//! model), and the drafters and processors of a neural generation from options.

use crate::decode::drafters::{CorpusDrafter, PromptLookup};
use crate::decode::{
    decode, DecodeConfig, DecodeStats, Drafter, Processor, RepetitionPenalty, Sampler,
};
use crate::error::Result;
use crate::index::Index;
use crate::ngram::cache::CacheStats;
use crate::ngram::{Estimator, InfgramModel, LevelLog};
use crate::tokenizer::{check_fingerprint, Tokenizer};
use std::path::PathBuf;
use std::sync::Arc;

/// Settings of a generation from the index alone.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// The estimator.
    pub estimator: Estimator,
    /// Tokens of context (the last `context` tokens of prompt + output).
    pub context: usize,
    /// Tokens to generate at most.
    pub max_tokens: usize,
}

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated token ids (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Whether it stopped at a document boundary.
    pub hit_end: bool,
    /// Per-step statistics.
    pub steps: LevelLog,
    /// How the counts cache served.
    pub cache: CacheStats,
    /// What the decode loop did.
    pub decode: DecodeStats,
}

/// Generates from the index alone, calling `on_token` after each token (for streaming): the
/// decode loop ([`crate::decode::decode`]) with the ∞-gram as its model and no drafters. The
/// prompt starts a document (the separator goes first); generation stops at the next
/// document boundary.
pub fn generate<S: AsRef<[u8]> + Sync>(
    index: Arc<Index<S>>,
    prompt: &[u32],
    cfg: &GenConfig,
    sampler: &mut Sampler,
    on_token: impl FnMut(u32),
) -> Result<Generation> {
    let separator = index.separator();
    let mut model = InfgramModel::new(index, cfg.estimator.clone(), cfg.context)?;
    let mut fed = Vec::with_capacity(prompt.len() + 1);
    fed.push(separator);
    fed.extend_from_slice(prompt);
    let decode_cfg = DecodeConfig {
        max_tokens: cfg.max_tokens,
        ..Default::default()
    };
    let (tokens, stats) = decode(
        &mut model,
        &mut [],
        &mut [],
        sampler,
        &fed,
        &decode_cfg,
        on_token,
    )?;
    Ok(Generation {
        hit_end: tokens.len() < cfg.max_tokens,
        tokens,
        cache: model.cache_stats(),
        steps: std::mem::take(&mut model.steps),
        decode: stats,
    })
}

/// How a neural generation's decode loop is assembled.
#[derive(Clone, Debug, PartialEq)]
pub struct AssemblyOptions {
    /// Speculative decoding: prompt lookup drafts, and the drafting index if given.
    pub speculative: bool,
    /// An index in the model's tokens to draft from (with `speculative`).
    pub drafting_index: Option<PathBuf>,
    /// Repetition penalty over the last [`REPETITION_WINDOW`] tokens (1: none).
    pub repetition_penalty: f32,
}

/// Tokens the repetition penalty looks back over.
pub const REPETITION_WINDOW: usize = 64;

/// The drafters of a generation: none for plain decoding; with `speculative`, prompt lookup and
/// the drafting index (refused unless it was built with `tok`).
pub fn drafters(opts: &AssemblyOptions, tok: &dyn Tokenizer) -> Result<Vec<Box<dyn Drafter>>> {
    let mut drafters: Vec<Box<dyn Drafter>> = Vec::new();
    if !opts.speculative {
        return Ok(drafters);
    }
    drafters.push(Box::new(PromptLookup::new(8)));
    if let Some(dir) = &opts.drafting_index {
        let index = Index::open(dir)?;
        check_fingerprint(&index.header().tokenizer, tok)?;
        drafters.push(Box::new(CorpusDrafter::new(Arc::new(index))));
    }
    Ok(drafters)
}

/// The processors of a generation (the repetition penalty when it is not 1).
pub fn processors(opts: &AssemblyOptions) -> Vec<Box<dyn Processor>> {
    if opts.repetition_penalty == 1.0 {
        return Vec::new();
    }
    vec![Box::new(RepetitionPenalty {
        penalty: opts.repetition_penalty,
        window: REPETITION_WINDOW,
    })]
}
