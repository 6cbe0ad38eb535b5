//! Library use, part 3: score a text with any [`LanguageModel`].
//!
//! [`windowed_perplexity`] takes any scorer: here the ∞-gram of Tiny Shakespeare's training
//! split (the smoothed estimator, so no token has probability 0), scored on the first 20,000
//! bytes of val in windows of 1,024 tokens moved by 512; with the `neural` feature and
//! `-- --model smollm2-135m`, the same call scores the neural model (fetched on first use).
//!
//! `cargo run --release --example score_text [-- --model smollm2-135m]`

use infgram::eval::windowed_perplexity;
use infgram::lm::LanguageModel;
use infgram::ngram::{smoothed::Discounts, Estimator, InfgramModel};
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use std::sync::Arc;

fn report(name: &str, model: &mut dyn LanguageModel, tokens: &[u32]) -> infgram::Result<()> {
    let t = std::time::Instant::now();
    let (nll, scored) = windowed_perplexity(model, tokens, 1024, 512)?;
    println!(
        "{name}: perplexity {:.3} over {scored} tokens ({:.2} s)",
        nll.exp(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> infgram::Result<()> {
    let (_, val) = infgram::assets::tiny_shakespeare_split()?;
    let val = &val[..20_000];
    let tok = ByteTokenizer;
    let index = Arc::new(infgram::service::tiny_shakespeare_index()?);
    let estimator = Estimator::Smoothed(Discounts::default());
    let mut infgram = InfgramModel::new(index, estimator, 100)?;
    report(
        "∞-gram (smoothed, byte tokens)",
        &mut infgram,
        &tok.encode(val)?,
    )?;

    let args: Vec<String> = std::env::args().collect();
    if let Some(spec) = args
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| args.get(i + 1))
    {
        #[cfg(feature = "neural")]
        {
            let options = infgram::service::models::ModelOptions::default();
            let mut loaded = infgram::service::models::load_model(spec, &options)?;
            let tokens = loaded.tokenizer.encode(val)?;
            report(spec, loaded.model.as_mut(), &tokens)?;
        }
        #[cfg(not(feature = "neural"))]
        eprintln!("{spec}: this build has no neural models (the `neural` feature)");
    }
    Ok(())
}
