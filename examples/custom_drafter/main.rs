//! Library use, part 2: write a [`Drafter`] and run it in the decode loop.
//!
//! The decode loop takes any scorer ([`LanguageModel`]), any drafters, processors and the
//! sampler. Here the scorer is the ∞-gram of Tiny Shakespeare (no model download), and the
//! drafter is a toy that proposes "the spelling of the last word again" — wrong most of the
//! time. Greedy speculative decoding is lossless whatever the drafter: the output equals plain
//! greedy decoding, and the statistics show how many drafted tokens the scorer accepted.
//!
//! `cargo run --release --example custom_drafter`

use infgram::decode::drafters::PromptLookup;
use infgram::decode::{greedy, DecodeConfig, Draft, Drafter};
use infgram::ngram::{Estimator, InfgramModel};
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use std::sync::Arc;

/// Proposes the last word of the context again, with a modest confidence per token.
struct RepeatLastWord;

impl Drafter for RepeatLastWord {
    fn propose(&mut self, context: &[u32], max: usize) -> infgram::Result<Draft> {
        let is_space = |t: &u32| *t == b' ' as u32 || *t == b'\n' as u32;
        let end = context.len();
        let start = context.iter().rposition(is_space).map_or(0, |p| p + 1);
        let mut tokens: Vec<u32> = context[start..end].to_vec();
        tokens.insert(0, b' ' as u32);
        tokens.truncate(max);
        let confidence = vec![0.5; tokens.len()];
        Ok(Draft {
            tokens,
            confidence,
            ..Draft::default()
        })
    }

    fn name(&self) -> &str {
        "repeat-last-word"
    }
}

fn main() -> infgram::Result<()> {
    let tok = ByteTokenizer;
    let index = Arc::new(infgram::service::tiny_shakespeare_index()?);
    let estimator = Estimator::Sbis { k: -1, decay: 0.1 };
    let mut prompt = vec![index.separator()]; // the prompt starts a document
    prompt.extend(tok.encode("ROMEO:\nWhat light through yonder")?);
    let cfg = DecodeConfig {
        max_tokens: 200,
        ..Default::default()
    };
    let mut model = InfgramModel::new(index.clone(), estimator, 200)?;
    let (plain, _) = greedy(&mut model, &mut [], &prompt, &cfg)?;
    let mut drafters: Vec<Box<dyn Drafter>> =
        vec![Box::new(RepeatLastWord), Box::new(PromptLookup::new(8))];
    let (drafted, stats) = greedy(&mut model, &mut drafters, &prompt, &cfg)?;
    println!("{}", tok.decode(&drafted)?);
    println!(
        "\n{} tokens; {} passes; {} drafted, {} accepted ({:.0}%); identical to plain greedy: {}",
        stats.tokens,
        stats.passes,
        stats.drafted,
        stats.accepted,
        100.0 * stats.acceptance_rate(),
        plain == drafted
    );
    assert_eq!(plain, drafted, "greedy speculative decoding is lossless");
    Ok(())
}
