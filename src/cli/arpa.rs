//! `infgram export-arpa`: the modified Kneser–Ney model of an index in ARPA format.

use anyhow::{Context, Result};
use clap::Args;
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
    /// The ARPA file to write (written beside it and renamed into place when complete).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Runs `infgram export-arpa`.
pub fn run(args: ArpaArgs) -> Result<()> {
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
    let name = args
        .output
        .file_name()
        .context("--output must name a file")?
        .to_string_lossy()
        .into_owned();
    let tmp = args
        .output
        .with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let write = || -> Result<infgram::ngram::arpa::ArpaSummary> {
        let file = std::fs::File::create(&tmp).with_context(|| tmp.display().to_string())?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let s = infgram::ngram::arpa::write_arpa(&model, &index, tok.as_ref(), &mut out)?;
        out.into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()
            .with_context(|| tmp.display().to_string())?;
        Ok(s)
    };
    let summary = match write() {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, &args.output).with_context(|| args.output.display().to_string())?;
    let counts: Vec<String> = summary.ngrams.iter().map(u64::to_string).collect();
    outln!(
        "wrote {} ({} n-grams by order: {}) in {:.2} s",
        args.output.display(),
        summary.ngrams.iter().sum::<u64>(),
        counts.join(", "),
        summary.seconds
    )?;
    Ok(())
}
