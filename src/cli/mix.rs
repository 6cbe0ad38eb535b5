//! `infgram mix fit` and `infgram ppl --model M --index I`: fitting λ and interpolated
//! perplexity ([`infgram::service::score`]).

use anyhow::Result;
use clap::{Args, Subcommand};
#[cfg(feature = "neural")]
use infgram::service::score::{ScoredMixture, OVERLAP_DROP, OVERLAP_N, OVERLAP_WARN};
use std::path::PathBuf;

/// `infgram mix …`.
#[derive(Subcommand, Debug)]
pub enum MixCommand {
    /// Fit λ on held-out text (never the text you will score) and write it as JSON.
    Fit(FitArgs),
}

/// Arguments of `infgram mix fit`.
#[derive(Args, Debug)]
pub struct FitArgs {
    /// The neural model.
    #[arg(long)]
    pub model: String,
    /// An index built with the model's tokenizer (`infgram index --tokenizer MODEL`).
    #[arg(long)]
    pub index: PathBuf,
    /// Held-out text to fit on: one file or several, each scored on its own.
    #[arg(long, num_args = 1.., required = true)]
    pub text: Vec<PathBuf>,
    /// Where to write the mixer.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The ∞-gram distribution mixed in (SBIS with two levels, as in the built-in mixer: on
    /// Tiny Shakespeare it mixes better than the paper's sparse ∞-gram and nearly as well as
    /// the smoothed estimator, with sparse rows).
    #[arg(long, value_enum, default_value_t = super::EstimatorKind::Sbis)]
    pub estimator: super::EstimatorKind,
    /// With --estimator sbis: levels (−1: all).
    #[arg(long, default_value_t = 2, allow_hyphen_values = true, value_parser = super::levels)]
    pub k: i64,
    /// The infini-gram paper's two weights (sparse / not sparse) instead of a table by suffix
    /// length.
    #[arg(long)]
    pub two_weights: bool,
    /// Also fit a λ model over both models' views of each position (the ∞-gram's suffix
    /// length, count, distinct continuations and top probability; the neural model's top
    /// probability, entropy and its probability of the ∞-gram's favourite): a logistic model
    /// fitted by maximum likelihood beside the table, which it then replaces.
    #[arg(long)]
    pub features: bool,
    /// Window length of the neural model, in tokens.
    #[arg(long, default_value_t = 1024)]
    pub window: usize,
    /// Window stride, in tokens.
    #[arg(long, default_value_t = 512)]
    pub stride: usize,
    /// With --model: the model's tokenizer.json, in place of the tokenizer its GGUF file
    /// carries (for a file whose pre-tokenizer infgram does not read).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model_args: super::ModelArgs,
}

/// Runs `infgram mix …`.
pub fn run(cmd: MixCommand) -> Result<()> {
    match cmd {
        #[cfg(feature = "neural")]
        MixCommand::Fit(args) => fit(&args),
        #[cfg(not(feature = "neural"))]
        MixCommand::Fit(_) => Err(super::no_neural()),
    }
}

#[cfg(feature = "neural")]
fn fit(args: &FitArgs) -> Result<()> {
    use infgram::service::score::{fit_mixer, Document, FitRequest, ModelScoring};
    if args.k == 0 {
        anyhow::bail!("--k must be −1 (all levels) or at least 1");
    }
    // Checked before the fit (a refused output costs nothing).
    infgram::service::files::check(&args.output, infgram::service::files::Accept::Files)?;
    let mut texts = Vec::new();
    for path in &args.text {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        texts.push(Document {
            name: path.display().to_string(),
            text,
        });
    }
    let req = FitRequest {
        model: ModelScoring {
            window: args.window,
            stride: args.stride,
            ..ModelScoring::new(
                args.model.clone(),
                infgram::service::models::ModelOptions {
                    tokenizer: args.tokenizer.clone(),
                    ..args.model_args.options()
                },
            )
        },
        index: args.index.clone(),
        texts,
        estimator: args.estimator.spec_with(Some(args.k), None, None, None),
        two_weights: args.two_weights,
        features: args.features,
    };
    let fitted = fit_mixer(&req)?;
    fitted.mixer.save(&args.output)?;
    let r = &fitted.report;
    print_mixture(r)?;
    if let Some(table) = fitted.table_ppl {
        infgram::diag!(
            "on these positions: λ model {:.4}, its table alone {table:.4} (perplexity)",
            r.report.ppl,
        );
    }
    infgram::diag!(
        "wrote {} (fitted on {} tokens of {} file{})",
        args.output.display(),
        r.report.tokens,
        args.text.len(),
        if args.text.len() == 1 { "" } else { "s" }
    );
    Ok(())
}

/// Prints an interpolated-perplexity report and, after it, the headline figures of other
/// mixers on the same passes (JSON with `json`: theirs under `compare`).
#[cfg(feature = "neural")]
pub fn print_mixtures(
    r: &ScoredMixture,
    compared: &[(String, ScoredMixture)],
    json: bool,
) -> Result<()> {
    if json {
        let mut v = serde_json::to_value(r)?;
        if !compared.is_empty() {
            let list: Vec<serde_json::Value> = compared
                .iter()
                .map(|(name, c)| {
                    let mut one = serde_json::json!({
                        "mixer": name,
                        "ppl": c.report.ppl,
                        "relative_improvement": c.report.relative_improvement,
                        "lambda_mean": c.report.lambda_mean,
                    });
                    if let Some(all) = &c.with_left_out {
                        one["with_left_out"] = serde_json::json!({
                            "ppl": all.ppl,
                            "relative_improvement": all.relative_improvement,
                        });
                    }
                    one
                })
                .collect();
            v["compare"] = serde_json::Value::Array(list);
        }
        print_warnings(r);
        outln!("{v}")?;
        return Ok(());
    }
    print_mixture(r)?;
    if !compared.is_empty() {
        outln!("\nother mixers on the same passes:")?;
        for (name, c) in compared {
            outln!(
                "  {name}: mixture {:.4}, relative improvement {:.1}%, mean λ {:.3}{}",
                c.report.ppl,
                100.0 * c.report.relative_improvement,
                c.report.lambda_mean,
                c.with_left_out
                    .as_ref()
                    .map_or(String::new(), |all| format!(
                        " (with the left-out documents: {:.4}, {:.1}%)",
                        all.ppl,
                        100.0 * all.relative_improvement
                    ))
            )?;
        }
    }
    Ok(())
}

/// Warns on stderr about documents and texts largely in the index.
#[cfg(feature = "neural")]
fn print_warnings(r: &ScoredMixture) {
    for d in r
        .overlap_by_document
        .iter()
        .filter(|d| d.overlap > OVERLAP_DROP)
    {
        infgram::diag!(
            "warning: {}: {:.0}% of its {OVERLAP_N}-token windows are in the index (the infini-gram \
             paper drops documents above {:.0}%){}",
            d.document,
            100.0 * d.overlap,
            100.0 * OVERLAP_DROP,
            if d.left_out {
                "; left out of the figures"
            } else {
                "; --max-overlap 0.8 leaves such documents out"
            }
        );
    }
    if r.overlap > OVERLAP_WARN {
        infgram::diag!(
            "warning: {:.0}% of the text's {OVERLAP_N}-token windows are in the index: the text is \
             largely part of the corpus (the infini-gram paper drops documents above 80%), so the \
             mixture's gain is inflated",
            100.0 * r.overlap
        );
    }
}

/// Prints an interpolated-perplexity report as text (the JSON is [`print_mixtures`]').
#[cfg(feature = "neural")]
fn print_mixture(r: &ScoredMixture) -> Result<()> {
    print_warnings(r);
    let several = r.overlap_by_document.len() > 1;
    let m = &r.report;
    outln!("perplexity (mixture)  {:.4}", m.ppl)?;
    outln!("perplexity (neural)   {:.4}", m.ppl_neural)?;
    outln!(
        "perplexity (∞-gram)   {:.4}  ({})",
        m.ppl_infgram,
        if r.infgram_ppl_smoothed {
            "smoothed estimator"
        } else {
            "the mixed-in estimator; the smoothed one skipped"
        }
    )?;
    outln!(
        "relative improvement  {:.1}%  (1 − (ppl − 1)/(ppl_neural − 1))",
        100.0 * m.relative_improvement
    )?;
    outln!(
        "best any λ could do   {:.4}  (relative improvement {:.1}%: the larger probability at each position)",
        m.ppl_bound,
        100.0 * m.relative_improvement_bound
    )?;
    outln!("mean λ                {:.3}", m.lambda_mean)?;
    outln!("tokens                {}", m.tokens)?;
    outln!(
        "{OVERLAP_N}-gram overlap        {:.1}% of the text's windows occur in the index",
        100.0 * r.overlap
    )?;
    if let Some(all) = &r.with_left_out {
        let left = r.overlap_by_document.iter().filter(|d| d.left_out).count();
        outln!(
            "with the {left} left-out document{} included: mixture {:.4}, neural {:.4}, relative improvement {:.1}% (bound {:.1}%), {} tokens",
            if left == 1 { "" } else { "s" },
            all.ppl,
            all.ppl_neural,
            100.0 * all.relative_improvement,
            100.0 * all.relative_improvement_bound,
            all.tokens
        )?;
    }
    if several {
        outln!("\n{:>8} {:>8}  document", "tokens", "overlap")?;
        for d in &r.overlap_by_document {
            let mark = if d.left_out { "  (left out)" } else { "" };
            outln!(
                "{:>8} {:>7.1}%  {}{mark}",
                d.tokens,
                100.0 * d.overlap,
                d.document
            )?;
        }
        outln!()?;
    }
    outln!(
        "seconds               {:.2} (neural {:.2}, ∞-gram rows {:.2}, smoothed ∞-gram perplexity {:.2})",
        r.seconds,
        r.neural_seconds,
        r.infgram_seconds,
        r.smoothed_seconds
    )?;
    outln!(
        "\n{:>4} {:>8} {:>8} {:>8} {:>10} {:>10}",
        "n",
        "tokens",
        "agree",
        "λ",
        "ppl neural",
        "ppl mix"
    )?;
    for (n, row) in &m.by_n {
        outln!(
            "{n:>4} {:>8} {:>7.1}% {:>8.3} {:>10.3} {:>10.3}",
            row.agreement.tokens,
            100.0 * row.agreement.rate(),
            row.lambda,
            row.nll_neural.exp(),
            row.nll_mix.exp()
        )?;
    }
    Ok(())
}
