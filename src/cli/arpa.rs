//! `infgram export-arpa`: the modified Kneser–Ney model of an index in ARPA format.

use anyhow::Result;
use clap::Args;
use infgram::service::files::{Accept, Target};
use infgram::service::score::{mkn_model, write_arpa_file};
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
    let target = infgram::service::files::check(&args.output, Accept::Streams)?;
    let (index, tok) = infgram::service::open_index(&args.index, None)?;
    let model = mkn_model(&index, args.order, args.discount_fallback.as_deref()).map_err(|e| {
        e.rename_field(&[("discount_fallback", "--discount-fallback")])
            .rename_field(super::FLAG_NAMES)
    })?;
    let summary = write_arpa_file(&index, &model, tok.as_ref(), &args.output)?;
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
        infgram::diag!("{line}");
    } else {
        outln!("{line}")?;
    }
    Ok(())
}
