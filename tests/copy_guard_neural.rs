//! The copy guard on the real SmolLM2: asked to copy a passage that is in the guarded corpus,
//! the guarded model never repeats more than L of its tokens, and speculative decoding with
//! drafters that propose exactly the copy (prompt lookup, and the guarded corpus itself) gives
//! the same greedy text as plain guarded decoding.
#![cfg(feature = "neural")]

use infgram::decode::drafters::{CorpusDrafter, PromptLookup};
use infgram::decode::guard::CopyGuard;
use infgram::decode::{decode, DecodeConfig, Drafter, Processor, Sampler};
use infgram::eval::attribution::max_copied_span;
use infgram::neural::chat_prompt;
use infgram::neural::native::decoder::Decoder;
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use infgram::Index;
use std::sync::Arc;

#[test]
fn guarded_model_does_not_copy_and_speculation_changes_nothing() {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let mut model = Decoder::from_gguf(&path).unwrap().with_threads(2);
    let passage = "The old lighthouse keeper climbed the spiral stairs every evening at dusk. \
        He trimmed the wick, polished the great lens, and wrote the weather in his log.";
    let index =
        Arc::new(Index::from_docs(tok.spec(), &[tok.encode(passage).unwrap()], 1, true).unwrap());
    let prompt = tok
        .encode(&chat_prompt(&format!(
            "Copy this passage word for word:\n\n{passage}"
        )))
        .unwrap();
    let cfg = DecodeConfig {
        max_tokens: 40,
        ..DecodeConfig::default()
    };
    const L: usize = 6;
    let mut run = |drafters: &mut [Box<dyn Drafter>], guard: bool| {
        let mut processors: Vec<Box<dyn Processor>> = Vec::new();
        let mut stats = None;
        if guard {
            let g = CopyGuard::new(index.clone(), L);
            stats = Some(g.stats());
            processors.push(Box::new(g));
        }
        let (out, _) = decode(
            &mut model,
            drafters,
            &mut processors,
            &mut Sampler::greedy(),
            &prompt,
            &cfg,
            |_| {},
        )
        .unwrap();
        (out, stats.map(|s| s.get()))
    };
    let (free, _) = run(&mut [], false);
    assert!(
        max_copied_span(&index, &free).unwrap() > 2 * L,
        "the unguarded model should copy: {:?}",
        tok.decode(&free)
    );
    let (plain, stats) = run(&mut [], true);
    assert!(
        max_copied_span(&index, &plain).unwrap() <= L,
        "{:?}",
        tok.decode(&plain)
    );
    assert!(stats.unwrap().blocked > 0);
    let mut drafters: Vec<Box<dyn Drafter>> = vec![
        Box::new(PromptLookup::new(8)),
        Box::new(CorpusDrafter::new(index.clone())),
    ];
    let (speculative, _) = run(&mut drafters, true);
    assert_eq!(speculative, plain);
}
