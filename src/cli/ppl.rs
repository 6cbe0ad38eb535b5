//! `infgram ppl`: perplexity and token-wise agreement of the ∞-gram on a text.

use anyhow::{bail, Context, Result};
use clap::Args;
use infgram::service::score::{
    score, Agreement, ClassicScore, Discounts, Document, ModelPpl, ModelScoring, PplReport,
    Reference, ScoreReport, ScoreRequest,
};
use std::path::{Path, PathBuf};

/// Arguments of `infgram ppl`.
#[derive(Args, Debug)]
pub struct PplArgs {
    /// The text to score. With --model, several files: each is scored on its own (its own
    /// windows, its own decontamination check) and the figures pool their tokens.
    #[arg(long, num_args = 1.., required = true)]
    pub text: Vec<PathBuf>,
    /// With --model and --index: leave the documents (--text files) whose share of 13-token
    /// windows found in the index is above FRACTION out of the headline figures (the
    /// infini-gram paper's decontamination drops those above 0.8); they are listed, and the
    /// figures with them given beside.
    #[arg(long, requires_all = ["model", "index"], value_parser = super::fraction)]
    pub max_overlap: Option<f64>,
    /// Index to score with.
    #[arg(long, conflicts_with_all = ["corpus", "split"])]
    pub index: Option<PathBuf>,
    /// Corpus files to index (byte-level, cached) and score with.
    #[arg(long, num_args = 1..)]
    pub corpus: Vec<PathBuf>,
    /// Index the first FRACTION of --text (one document) and score the rest (the Tiny Shakespeare protocol: 0.9).
    #[arg(long)]
    pub split: Option<f64>,
    /// The estimator and its settings.
    #[command(flatten)]
    pub est: super::EstimatorArgs,
    /// Context length in tokens (at least 1).
    #[arg(long, default_value_t = infgram::service::score::DEFAULT_CONTEXT, value_parser = super::positive)]
    pub context: usize,
    /// Probability given to a token the estimator gives 0, in (0, 1) (the tiny-infini-gram
    /// protocol uses 1e-10).
    #[arg(long, value_parser = super::floor)]
    pub floor: Option<f64>,
    /// Smoothed estimator: discounts `d1,d2,d3` (or nine: three per class of level total
    /// ≤ 4, ≤ 64, more) instead of fitting them.
    #[arg(long, value_delimiter = ',')]
    pub discounts: Option<Vec<f64>>,
    /// Sentence mode (fixed-order models over an index built with `--tokenizer words
    /// --sentences`): each line of --text is a sentence `<s> … </s>`, scored as KenLM's `query`.
    #[arg(long)]
    pub sentences: bool,
    /// mkn: discounts D1,D2,D3+ for an order whose count-of-counts cannot give them (KenLM's
    /// --discount_fallback; with no values 0.5,1,1.5).
    #[arg(long, value_delimiter = ',', num_args = 0..=3)]
    pub discount_fallback: Option<Vec<f64>>,
    /// Print one JSON object (with --sentences: each sentence's log10 probability too).
    #[arg(long)]
    pub json: bool,
    /// Draw agreement and token counts by effective n into this PNG file (a regular file,
    /// written beside and renamed into place; checked before scoring).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Score with a neural model instead (`smollm2-135m`, `gemma3-270m`, a `.gguf` file, a safetensors model
    /// directory or `hf:OWNER/REPO[:FILE]`): windows of --window tokens moved by --stride.
    /// With --index (built with the model's tokenizer): the neural model, the ∞-gram and their
    /// mixture.
    #[arg(long, conflicts_with_all = ["corpus", "split"])]
    pub model: Option<String>,
    /// With --model and --index: the mixer (λ per position) written by `infgram mix fit`
    /// (default: the one fitted on Tiny Shakespeare).
    #[arg(long, requires_all = ["model", "index"])]
    pub mix: Option<PathBuf>,
    /// With --model and --index: other mixers scored on the same passes, for comparison
    /// (`default` for the built-in one); each must mix in the same ∞-gram distribution as
    /// --mix. Their figures follow the main one (JSON `compare`).
    #[arg(long, num_args = 1.., requires_all = ["model", "index"])]
    pub compare: Vec<PathBuf>,
    /// With --model and --index: skip the ∞-gram's own perplexity (the smoothed estimator's,
    /// which the mixture does not need and which is the slow part on a large index); the
    /// ∞-gram's perplexity is then the mixed-in estimator's (infinite where it misses a token).
    #[arg(long, requires_all = ["model", "index"])]
    pub no_infgram_ppl: bool,
    /// With --model: window length in tokens.
    #[arg(long, default_value_t = infgram::service::score::DEFAULT_WINDOW, requires = "model")]
    pub window: usize,
    /// With --model: window stride in tokens.
    #[arg(long, default_value_t = infgram::service::score::DEFAULT_STRIDE, requires = "model")]
    pub stride: usize,
    /// With --model: score only the first N tokens of the text (0: all).
    #[arg(long, default_value_t = 0, requires = "model")]
    pub limit: usize,
    /// With --model: the model's tokenizer.json, in place of the tokenizer its GGUF file
    /// carries (for a file whose pre-tokenizer infgram does not read).
    #[arg(long, value_name = "FILE", requires = "model")]
    pub tokenizer: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model_args: super::ModelArgs,
}

/// A text file's contents (an error names the file).
fn read_text(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))
}

/// The CLI's names of the scoring request's fields.
const SCORE_FLAGS: &[(&str, &str)] = &[
    ("split", "--split"),
    ("discounts", "--discounts"),
    ("discount_fallback", "--discount-fallback"),
    ("floor", "--floor"),
    ("sentences", "--sentences"),
    ("context", "--context"),
];

/// The service's scoring request of these arguments.
fn request(args: &PplArgs) -> Result<ScoreRequest> {
    let mut texts = Vec::new();
    for path in &args.text {
        texts.push(Document {
            name: path.display().to_string(),
            text: read_text(path)?,
        });
    }
    let mut req = ScoreRequest::new(texts);
    req.reference = match (&args.index, &args.corpus, args.split) {
        (Some(dir), _, _) => Some(Reference::Index(dir.clone())),
        (None, files, _) if !files.is_empty() => Some(Reference::Corpus(files.clone())),
        (None, _, Some(frac)) => Some(Reference::Split(frac)),
        (None, _, None) if args.model.is_some() => None,
        (None, _, None) => bail!("give --index DIR, --corpus FILES, or --split FRACTION"),
    };
    if args.model.is_none() {
        if args.text.len() > 1 {
            bail!(
                "several --text files are scored each on its own with --model; the ∞-gram alone \
                 scores one text: give one --text"
            );
        }
        req.estimator = args.est.spec();
    }
    req.discounts = args.discounts.clone();
    req.discount_fallback = args.discount_fallback.clone();
    req.sentences = args.sentences;
    req.context = args.context;
    req.floor = args.floor;
    req.model = args.model.as_ref().map(|model| ModelScoring {
        window: args.window,
        stride: args.stride,
        limit: args.limit,
        mix: args.mix.clone(),
        compare: args
            .compare
            .iter()
            .map(|p| infgram::service::run::mixer_file(p).map(Path::to_path_buf))
            .collect(),
        max_overlap: args.max_overlap,
        infgram_ppl: !args.no_infgram_ppl,
        ..ModelScoring::new(
            model.clone(),
            infgram::service::models::ModelOptions {
                tokenizer: args.tokenizer.clone(),
                ..args.model_args.options()
            },
        )
    });
    Ok(req)
}

/// Runs `infgram ppl`: one call of the service's scoring, printed.
pub fn run(args: PplArgs) -> Result<()> {
    check_flags(&args)?;
    if let Some(path) = &args.plot {
        // Checked before scoring (a refused output costs nothing).
        infgram::service::files::check(path, infgram::service::files::Accept::Files)?;
    }
    #[cfg(not(feature = "neural"))]
    if let Some(model) = &args.model {
        return Err(super::no_neural().context(model.clone()));
    }
    let req = request(&args)?;
    let report =
        score(&req).map_err(|e| e.rename_field(SCORE_FLAGS).rename_field(super::FLAG_NAMES))?;
    match report {
        ScoreReport::Infgram { report, discounts } => {
            if let Some(path) = &args.plot {
                plot(&report, path)?;
            }
            print_report(&report, args.json, discounts)
        }
        ScoreReport::Classic(c) => print_classic(&c, args.json, args.sentences),
        #[cfg(feature = "neural")]
        ScoreReport::Mixture { main, compared } => {
            super::mix::print_mixtures(&main, &compared, args.json)
        }
        #[cfg(not(feature = "neural"))]
        ScoreReport::Mixture { .. } => Err(super::no_neural()),
        ScoreReport::Model(m) => print_model(&m, args.json),
    }
}

/// Draws the agreement by effective n into the PNG `path`.
fn plot(report: &PplReport, path: &std::path::Path) -> Result<()> {
    #[cfg(feature = "plot")]
    infgram::service::files::write_via_path(path, "png", |tmp| {
        super::plot::agreement_by_n(report, tmp)
            .map_err(|e| infgram::Error::input(format!("{}: {e}", path.display())))
    })?;
    #[cfg(not(feature = "plot"))]
    {
        let _ = report;
        bail!(
            "--plot {}: this infgram was built without the `plot` feature",
            path.display()
        );
    }
    #[cfg(feature = "plot")]
    Ok(())
}

/// Refuses flags that do not apply to the scoring asked for (each is otherwise ignored).
fn check_flags(args: &PplArgs) -> Result<()> {
    use super::EstimatorKind::{Infgram, Mkn, Sbis, Smoothed};
    args.model_args
        .refuse_without_model(args.model.as_deref())?;
    if args.model.is_some() {
        let because = "with --model (a mixture's ∞-gram is the mixer file's)";
        args.est.refuse_all(because)?;
        for (flag, given) in [
            ("--discounts", args.discounts.is_some()),
            ("--discount-fallback", args.discount_fallback.is_some()),
            ("--sentences", args.sentences),
            ("--plot", args.plot.is_some()),
        ] {
            if given {
                bail!("{flag} does not apply {because}: leave it out");
            }
        }
        return Ok(());
    }
    args.est.check_applies()?;
    let kind = args.est.kind();
    super::check_flag_applies("--discounts", args.discounts.is_some(), kind, &[Smoothed])?;
    let fallback = args.discount_fallback.is_some();
    super::check_flag_applies("--discount-fallback", fallback, kind, &[Mkn])?;
    // The plot is the ∞-gram's agreement by effective n.
    let plot = args.plot.is_some();
    super::check_flag_applies("--plot", plot, kind, &[Infgram, Sbis, Smoothed])
}

/// Prints a fixed-order model's score (`sentences`: with each sentence's log10 probability).
fn print_classic(c: &ClassicScore, json: bool, sentences: bool) -> Result<()> {
    let r = &c.report;
    if json {
        let mut v = serde_json::to_value(c)?;
        if !sentences {
            v.as_object_mut().map(|o| o.remove("sentence_log10"));
        }
        outln!("{v}")?;
        return Ok(());
    }
    outln!("perplexity      {:.4}", r.ppl)?;
    outln!("log10 prob      {:.4}", r.log10_prob)?;
    outln!("tokens          {}", r.tokens)?;
    if sentences {
        outln!("sentences       {}", r.sentences)?;
    }
    outln!("oov             {}", r.oov)?;
    if r.floored > 0 {
        outln!("floored         {}", r.floored)?;
    }
    for (n, d) in c.discounts.iter().enumerate() {
        outln!(
            "discounts {}     {:.4},{:.4},{:.4}",
            n + 1,
            d[1],
            d[2],
            d[3]
        )?;
    }
    outln!(
        "seconds         {:.3} estimate, {:.3} score",
        c.estimate_seconds,
        r.seconds
    )?;
    Ok(())
}

/// Prints a neural model's perplexity.
fn print_model(m: &ModelPpl, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_value(m)?)?;
        return Ok(());
    }
    outln!("perplexity      {:.4}", m.ppl)?;
    outln!("bits per token  {:.4}", m.bits_per_token)?;
    outln!("bits per byte   {:.4}", m.bits_per_byte)?;
    outln!("tokens          {}", m.tokens)?;
    outln!("seconds         {:.2}", m.seconds)?;
    Ok(())
}

fn print_report(r: &PplReport, json: bool, discounts: Option<Discounts>) -> Result<()> {
    if json {
        let mut v = serde_json::to_value(r)?;
        if let Some(d) = discounts {
            v["discounts"] = serde_json::to_value(d.0)?;
        }
        outln!("{v}")?;
        return Ok(());
    }
    outln!("perplexity      {:.4}", r.ppl)?;
    outln!("bits per token  {:.4}", r.bits_per_token)?;
    outln!("tokens          {}", r.tokens)?;
    outln!("seconds         {:.3}", r.seconds)?;
    if r.floored > 0 {
        outln!("floored         {}", r.floored)?;
    }
    if let Some(d) = discounts {
        let rows: Vec<String> =
            d.0.iter()
                .map(|r| format!("{:.3},{:.3},{:.3}", r[0], r[1], r[2]))
                .collect();
        outln!("discounts       {}", rows.join(","))?;
    }
    outln!("\n∞-gram agreement (argmax = actual token)")?;
    outln!("{:<14}{:>10}{:>10}", "", "tokens", "agree")?;
    let row =
        |name: &str, a: &Agreement| outln!("{name:<14}{:>10}{:>9.1}%", a.tokens, 100.0 * a.rate());
    row("all", &r.agreement)?;
    row("sparse", &r.agreement_sparse)?;
    row("non-sparse", &r.agreement_nonsparse)?;
    for (n, a) in &r.agreement_by_n {
        row(&format!("n = {n}"), a)?;
    }
    Ok(())
}
