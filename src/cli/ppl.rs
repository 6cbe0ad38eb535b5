//! `infgram ppl`: perplexity and token-wise agreement of the ∞-gram on a text.

use anyhow::{bail, Context, Result};
use clap::Args;
use infgram::eval::{perplexity, PplReport};
use infgram::ngram::smoothed::{fit_on_train, Discounts};
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use infgram::Index;
use std::path::PathBuf;

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
    #[arg(long, default_value_t = 100, value_parser = super::positive)]
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
    #[arg(long, default_value_t = 1024)]
    pub window: usize,
    /// With --model: window stride in tokens.
    #[arg(long, default_value_t = 512)]
    pub stride: usize,
    /// With --model: score only the first N tokens of the text (0: all).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    #[command(flatten)]
    pub model_args: super::ModelArgs,
}

/// A text file's contents (an error names the file).
fn read_text(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))
}

/// Runs `infgram ppl`.
pub fn run(args: PplArgs) -> Result<()> {
    check_flags(&args)?;
    if let Some(path) = &args.plot {
        // Checked before scoring (a refused output costs nothing).
        infgram::output_file::check(path, infgram::output_file::Accept::Files)?;
    }
    if let Some(model) = &args.model {
        #[cfg(feature = "neural")]
        return run_model(&args, model);
        #[cfg(not(feature = "neural"))]
        return Err(super::no_neural().context(model.clone()));
    }
    let [text] = args.text.as_slice() else {
        bail!(
            "several --text files are scored each on its own with --model; the ∞-gram alone \
             scores one text: give one --text"
        );
    };
    let raw = read_text(text)?;
    if matches!(
        args.est.spec(),
        infgram::ngram::EstimatorSpec::Mkn { .. } | infgram::ngram::EstimatorSpec::AddAlpha { .. }
    ) {
        return run_classic(&args, &raw);
    }
    if args.sentences {
        bail!("--sentences scores with a fixed-order model: pass --estimator mkn or add-alpha");
    }
    let smoothed = args.est.is_smoothed();
    let given = args
        .discounts
        .as_deref()
        .map(Discounts::from_values)
        .transpose()
        .map_err(|e| e.rename_field(&[("discounts", "--discounts")]))?;
    let make_est = |d: Option<Discounts>| args.est.estimator(d);
    let report: PplReport;
    let mut discounts = given;
    if let Some(frac) = args.split {
        if !(0.0..1.0).contains(&frac) || frac == 0.0 {
            bail!("--split must be a fraction between 0 and 1");
        }
        let tok = ByteTokenizer;
        let cut = (raw.len() as f64 * frac) as usize;
        let cut = (0..=cut)
            .rev()
            .find(|&c| raw.is_char_boundary(c))
            .unwrap_or(0);
        let train = tok.encode(&raw[..cut])?;
        let val = tok.encode(&raw[cut..])?;
        if smoothed && discounts.is_none() {
            discounts = Some(fit_on_train(&train, tok.spec(), args.context)?);
        }
        let index = Index::from_docs(tok.spec(), &[train], 1, true)?;
        report = perplexity(
            &index,
            &val,
            &make_est(discounts)?,
            args.context,
            args.floor,
        )?;
    } else {
        let (index, tok) = match &args.index {
            Some(d) => infgram::service::open_index(d, None)?,
            None if !args.corpus.is_empty() => {
                infgram::service::open_cached_byte_index(&args.corpus)?
            }
            None => bail!("give --index DIR, --corpus FILES, or --split FRACTION"),
        };
        let tokens = tok.encode(&raw)?;
        report = perplexity(
            &index,
            &tokens,
            &make_est(discounts)?,
            args.context,
            args.floor,
        )?;
    }
    if let Some(path) = &args.plot {
        #[cfg(feature = "plot")]
        infgram::output_file::write_via_path(path, "png", |tmp| {
            super::plot::agreement_by_n(&report, tmp)
                .map_err(|e| infgram::Error::input(format!("{}: {e}", path.display())))
        })?;
        #[cfg(not(feature = "plot"))]
        bail!(
            "--plot {}: this infgram was built without the `plot` feature",
            path.display()
        );
    }
    print_report(&report, args.json, discounts.filter(|_| smoothed))
}

/// The fallback discounts of `--discount-fallback` (KenLM's defaults when it has no values).
pub fn fallback_discounts(given: &Option<Vec<f64>>) -> Result<Option<[f64; 3]>> {
    Ok(match given.as_deref() {
        None => None,
        Some([]) => Some(infgram::ngram::classic::KENLM_FALLBACK),
        Some(&[a, b, c]) => Some([a, b, c]),
        Some(_) => bail!("--discount-fallback takes no values or three: D1,D2,D3+"),
    })
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

/// The fixed-order model the estimator flags name, estimated over `index`.
pub fn classic_model<S: AsRef<[u8]> + Sync>(
    est: &super::EstimatorArgs,
    index: &Index<S>,
    sentences: bool,
    fallback: &Option<Vec<f64>>,
) -> Result<infgram::ngram::classic::ClassicModel> {
    use infgram::ngram::classic::is_sentence_index;
    if sentences != is_sentence_index(index) {
        bail!(if sentences {
            "--sentences needs an index built in sentence mode: `infgram index --tokenizer words --sentences`"
        } else {
            "this index was built in sentence mode: pass --sentences"
        });
    }
    let model = est
        .spec()
        .classic(index, fallback_discounts(fallback)?)
        .map_err(|e| e.rename_field(super::FLAG_NAMES))?;
    model.context("the estimator is not a fixed-order model")
}

/// `infgram ppl --estimator mkn|add-alpha`: a fixed-order model's perplexity.
fn run_classic(args: &PplArgs, raw: &str) -> Result<()> {
    use infgram::eval::classic::{score, scored_sequences};
    let (index, tok) = match &args.index {
        Some(d) => infgram::service::open_index(d, None)?,
        None if !args.corpus.is_empty() => infgram::service::open_cached_byte_index(&args.corpus)?,
        None => bail!("a fixed-order model needs --index DIR or --corpus FILES"),
    };
    let t0 = std::time::Instant::now();
    let model = classic_model(&args.est, &index, args.sentences, &args.discount_fallback)?;
    let estimate_seconds = t0.elapsed().as_secs_f64();
    let seqs = scored_sequences(tok.as_ref(), raw, args.sentences)?;
    let r = score(&index, &model, &seqs, args.floor)?;
    if args.json {
        let mut v = serde_json::to_value(&r)?;
        v["order"] = model.order().into();
        v["discounts"] = serde_json::to_value(model.discounts())?;
        v["estimate_seconds"] = estimate_seconds.into();
        v["ngrams"] = serde_json::to_value(&model.stats().ngrams)?;
        if !args.sentences {
            v.as_object_mut().map(|o| o.remove("sentence_log10"));
        }
        outln!("{v}")?;
        return Ok(());
    }
    outln!("perplexity      {:.4}", r.ppl)?;
    outln!("log10 prob      {:.4}", r.log10_prob)?;
    outln!("tokens          {}", r.tokens)?;
    if args.sentences {
        outln!("sentences       {}", r.sentences)?;
    }
    outln!("oov             {}", r.oov)?;
    if r.floored > 0 {
        outln!("floored         {}", r.floored)?;
    }
    for (n, d) in model.discounts().iter().enumerate() {
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
        estimate_seconds,
        r.seconds
    )?;
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
    let row = |name: &str, a: &infgram::eval::Agreement| {
        outln!("{name:<14}{:>10}{:>9.1}%", a.tokens, 100.0 * a.rate())
    };
    row("all", &r.agreement)?;
    row("sparse", &r.agreement_sparse)?;
    row("non-sparse", &r.agreement_nonsparse)?;
    for (n, a) in &r.agreement_by_n {
        row(&format!("n = {n}"), a)?;
    }
    Ok(())
}

/// `infgram ppl --model M`: perplexity of the neural model.
#[cfg(feature = "neural")]
fn run_model(args: &PplArgs, model: &str) -> Result<()> {
    let infgram::service::models::LoadedModel {
        model: mut llm,
        tokenizer: tok,
        path: _,
    } = infgram::service::models::load_model(model, &args.model_args.options())?;
    // Each --text file on its own: its tokens (the first --limit of each), after the
    // model's first token when it asks for one (Gemma's <bos>, never scored itself).
    let mut documents = Vec::new();
    for path in &args.text {
        let mut ids = tok.encode(&read_text(path)?)?;
        if args.limit > 0 {
            ids.truncate(args.limit);
        }
        if let Some(bos) = llm.bos_token() {
            ids.insert(0, bos);
        }
        documents.push((path.display().to_string(), ids));
    }
    if let Some(dir) = &args.index {
        // The mixture of the model and the ∞-gram of the index.
        use infgram::mix::{load_mixer, open_mixing_index, score_both, Scoring};
        let mixer = load_mixer(args.mix.as_deref())?;
        let mut others = Vec::new();
        for path in &args.compare {
            let other = if path.as_os_str() == "default" {
                load_mixer(None)?
            } else {
                load_mixer(Some(path))?
            };
            if other.estimator != mixer.estimator {
                anyhow::bail!(
                    "{} mixes in the estimator {} but --mix mixes in {}: --compare takes \
                     mixers of the same ∞-gram distribution (fit them with the same --estimator)",
                    path.display(),
                    serde_json::to_string(&other.estimator)?,
                    serde_json::to_string(&mixer.estimator)?
                );
            }
            others.push((path.display().to_string(), other));
        }
        let index = open_mixing_index(dir, &tok)?;
        let mut parts = Vec::new();
        for (name, ids) in &documents {
            let part = score_both(
                llm.as_mut(),
                &index,
                ids,
                &mixer.estimator,
                (args.window, args.stride),
                !args.no_infgram_ppl,
            )
            .with_context(|| name.clone())?;
            parts.push(part.named(name));
        }
        let mut scoring = Scoring::join(parts);
        if let Some(max) = args.max_overlap {
            scoring = scoring.leave_out_above(max);
        }
        let compared: Vec<_> = others
            .iter()
            .map(|(name, other)| (name.clone(), scoring.report(other)))
            .collect();
        return super::mix::print_mixtures(&scoring.report(&mixer), &compared, args.json);
    }
    let t0 = std::time::Instant::now();
    let (mut total_nll, mut scored, mut bytes) = (0.0, 0, 0);
    for (name, ids) in &documents {
        let (nll, n) =
            infgram::eval::windowed_perplexity(llm.as_mut(), ids, args.window, args.stride)
                .with_context(|| name.clone())?;
        total_nll += nll * n as f64;
        scored += n;
        // Per byte as well, to compare with byte-level models (the ∞-gram's char-level
        // perplexity).
        bytes += tok.decode_bytes(&ids[1.min(ids.len())..])?.len();
    }
    let nll = total_nll / scored.max(1) as f64;
    let secs = t0.elapsed().as_secs_f64();
    let ppl = nll.exp();
    let bits_per_byte = total_nll / bytes.max(1) as f64 / std::f64::consts::LN_2;
    if args.json {
        outln!(
            "{}",
            serde_json::json!({"ppl": ppl, "tokens": scored, "bits_per_token": ppl.log2(),
                "bits_per_byte": bits_per_byte, "seconds": secs, "window": args.window, "stride": args.stride})
        )?;
    } else {
        outln!("perplexity      {ppl:.4}")?;
        outln!("bits per token  {:.4}", ppl.log2())?;
        outln!("bits per byte   {bits_per_byte:.4}")?;
        outln!("tokens          {scored}")?;
        outln!("seconds         {secs:.2}")?;
    }
    Ok(())
}
