//! `infgram export-arpa`: the modified Kneser–Ney model of an index in ARPA format.

use anyhow::Result;
use clap::Args;
use infgram::output_file::{Accept, Target};
use std::path::PathBuf;

/// Arguments of `infgram export-arpa`.
#[derive(Args, Debug)]
pub struct ArpaArgs {
    /// The index (built with `--tokenizer words`, in sentence mode for KenLM's conventions).
    #[arg(long)]
    pub index: PathBuf,
    /// The order N.
    #[arg(long, value_parser = super::positive)]
    pub order: usize,
    /// Discounts D1,D2,D3+ for an order whose count-of-counts cannot give them (KenLM's
    /// --discount_fallback; with no values 0.5,1,1.5).
    #[arg(long, value_delimiter = ',', num_args = 0..=3)]
    pub discount_fallback: Option<Vec<f64>>,
    /// The ARPA file to write: a regular file is written beside it and renamed into place when
    /// complete; `-` (standard output), a FIFO or a character device is written as a stream.
    /// A link, a directory or a path inside an index is refused.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Runs `infgram export-arpa`.
pub fn run(args: ArpaArgs) -> Result<()> {
    // Checked before the model is built (a refused output costs nothing).
    let target = infgram::output_file::check(&args.output, Accept::Streams)?;
    let (index, tok) = infgram::service::open_index(&args.index, None)?;
    let sentences = infgram::ngram::classic::is_sentence_index(&index);
    let est = super::EstimatorArgs {
        estimator: Some(super::EstimatorKind::Mkn),
        k: None,
        decay: None,
        order: Some(args.order),
        alpha: None,
    };
    let model = super::ppl::classic_model(&est, &index, sentences, &args.discount_fallback)?;
    let summary = infgram::output_file::write_file(&args.output, Accept::Streams, |out| {
        infgram::ngram::arpa::write_arpa(&model, &index, tok.as_ref(), out)
    })?;
    let counts: Vec<String> = summary.ngrams.iter().map(u64::to_string).collect();
    let line = format!(
        "wrote {} ({} n-grams by order: {}) in {:.2} s",
        args.output.display(),
        summary.ngrams.iter().sum::<u64>(),
        counts.join(", "),
        summary.seconds
    );
    // On standard output the model is the output: the summary goes to stderr.
    if target == Target::Stdout {
        eprintln!("{line}");
    } else {
        outln!("{line}")?;
    }
    Ok(())
}
