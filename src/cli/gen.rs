//! `infgram gen`: generate text from the ∞-gram index with SBIS (or the smoothed estimator), or
//! with a neural model (plain or speculative decoding).

use anyhow::Result;
use clap::Args;
use infgram::service::files::Accept;
use infgram::service::request::{
    defaults, CheckedRequest, CorpusRule, GenLimits, GenerateRequest, GuardSpec, Prompt, Sampling,
    Scorer, MAX_GEN_TOKENS,
};
use infgram::service::run::{generate, Copying};
use infgram::service::{Resources, RunOptions};
use infgram::service::{Tokenizer, Utf8Stream};
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `infgram gen`.
#[derive(Args, Debug)]
pub struct GenArgs {
    /// The prompt (default: none, the start of a document).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Index to generate from (default: Shakespeare's complete works, fetched and indexed on first use).
    #[arg(long, conflicts_with = "corpus")]
    pub index: Option<PathBuf>,
    /// Corpus files to generate from (indexed into the cache on first use, keyed by content).
    #[arg(long, num_args = 1..)]
    pub corpus: Vec<PathBuf>,
    /// The estimator and its settings.
    #[command(flatten)]
    pub est: super::EstimatorArgs,
    /// Sampling temperature, 0 (greedy) to 100 (default 0.8).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass, in (0, 1] (default 1).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Keep only the k most likely tokens (default 0: all).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Context length in tokens, at least 1 (default 200).
    #[arg(long)]
    pub context: Option<usize>,
    /// Tokens to generate at most, up to 100,000,000 (default 500).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Random seed (same seed, same text).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print tokens as they come (default on a terminal).
    #[arg(long)]
    pub stream: bool,
    /// Print per-level statistics and speed.
    #[arg(long)]
    pub stats: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Generate with a neural model instead of the index: a short name (`smollm2-135m`, `gemma3-270m`,
    /// fetched on first use), a `.gguf` file, a safetensors model directory, or
    /// `hf:OWNER/REPO[:FILE]` (downloaded from the Hugging Face Hub). With --speculative, --index is the drafting
    /// index (built with `infgram index --tokenizer` and the same model).
    #[arg(long, conflicts_with = "corpus")]
    pub model: Option<String>,
    /// With --model: speculative decoding. The live prompt index (and --index, if given)
    /// drafts tokens, the model verifies them in one pass; the output is the model's own.
    #[arg(long, requires = "model")]
    pub speculative: bool,
    /// With --model: remember outputs in FILE (created on first use) and, with --speculative,
    /// draft from the outputs of earlier runs: a task run again with other data is drafted
    /// from what the model wrote before. Keeps at most 262,144 tokens (past that, the newest
    /// three quarters); a file holding more is refused. A regular file only:
    /// written beside and renamed over after the generation; checked at start.
    #[arg(long, value_name = "FILE", requires = "model")]
    pub past_outputs: Option<PathBuf>,
    /// With --speculative: verify a tree of drafts in one pass where the drafters part ways
    /// (native models), when the cost model says the branch's rows pay.
    #[arg(long, requires = "speculative")]
    pub draft_trees: bool,
    /// With --speculative: longest draft verified in one pass (default 16).
    #[arg(long, requires = "speculative")]
    pub draft_max: Option<usize>,
    /// With --speculative and --index: how the index drafts: the SBIS argmax, or the longest
    /// matching suffix's most frequent continuation (cheaper; better on a large corpus).
    #[arg(long, value_enum, default_value = "sbis", requires = "speculative")]
    pub corpus_rule: CorpusRule,
    /// With --model: also decode without drafts and print both speeds, the ratio, and whether
    /// the outputs are identical.
    #[arg(long, requires = "model")]
    pub compare: bool,
    /// With --model: repetition penalty over the last 64 tokens, above 0 (default 1: none).
    #[arg(long, requires = "model")]
    pub repetition_penalty: Option<f64>,
    /// With --model: sample from the mixture of the model and the ∞-gram of --index (built
    /// with the model's tokenizer; default: Shakespeare's complete works in the model's tokens,
    /// indexed on first use), λ per position from the mixer file written by `infgram mix fit`
    /// (`--mix` alone or `--mix default`: the mixer fitted on Tiny Shakespeare). With
    /// --speculative the drafts are verified against the mixture.
    #[arg(long, num_args = 0..=1, default_missing_value = "default", value_name = "MIX_JSON", requires = "model")]
    pub mix: Option<PathBuf>,
    /// With --model: write one JSON line per forward pass to FILE (the drafter, tokens drafted
    /// and accepted, tokens emitted, the pass's seconds, and `at`: tokens generated before it).
    /// A regular file is written beside and renamed into place; `-`, a FIFO or a device is
    /// written as a stream.
    #[arg(long, value_name = "FILE", requires = "model")]
    pub trace: Option<PathBuf>,
    /// With --model: use the prompt as is, without the chat template (its control tokens'
    /// strings, `<|im_start|>`, are control tokens).
    #[arg(long, requires = "model")]
    pub raw: bool,
    /// With --model: a system message before the prompt, in the model's chat template.
    #[arg(long, requires = "model", conflicts_with = "raw")]
    pub system: Option<String>,
    /// With --model and a chat template: read control tokens' strings in the prompt and the
    /// system message as control tokens (by default they are text, so a prompt cannot close
    /// its turn and open another).
    #[arg(long, requires = "model", conflicts_with = "raw")]
    pub parse_special: bool,
    /// Copy guard: the output never repeats more than L consecutive tokens of the guard's
    /// corpus (the prompt's tail counts). Exact: tokens that would make a longer copied span
    /// are masked at each step.
    #[arg(long, value_name = "L")]
    pub guard: Option<usize>,
    /// The corpus the guard protects (default: the generation's index; with --model, the
    /// --index drafting index). Must use the generation's tokenizer.
    #[arg(long, value_name = "DIR", requires = "guard")]
    pub guard_index: Option<PathBuf>,
    /// The guard counts only generated tokens: the output may finish a quotation the prompt
    /// began.
    #[arg(long, requires = "guard")]
    pub guard_ignore_prompt: bool,
    /// With --model: the model's tokenizer.json, in place of the tokenizer its GGUF file
    /// carries (for a file whose pre-tokenizer infgram does not read).
    #[arg(long, value_name = "FILE", requires = "model")]
    pub tokenizer: Option<PathBuf>,
    /// With --model: many generations at once from FILE (`-`: standard input), a request a
    /// line in JSON (`{"prompt": "…", "sampling": {"temperature": 0}, "limits":
    /// {"max_tokens": 64}, "drafters": ["prompt_lookup"]}`, a chat as `{"prompt":
    /// {"messages": […]}}`); the reports come out as JSON lines in the file's order.
    #[arg(long, value_name = "FILE", requires = "model", conflicts_with_all = ["prompt", "index", "guard", "past_outputs", "mix", "trace", "compare", "speculative", "stream"])]
    pub batch: Option<PathBuf>,
    /// With --batch: generations run at once, sharing the model's passes. Default: as many
    /// rows as the model's passes still pay for on this machine (of 1, 2, 4, 8 and 16, the
    /// fewest that give 90% of the best tokens/s, from the measured pass costs).
    #[arg(long, requires = "batch", value_parser = super::positive)]
    pub parallel: Option<usize>,
    #[command(flatten)]
    pub model_args: super::ModelArgs,
}

impl GenArgs {
    /// The request the flags make (`prompt`: the text the scorer's tokenizer reads), checked
    /// by the library: no default and no range is the CLI's own.
    fn request(&self, prompt: Option<Prompt>, scorer: Scorer) -> Result<CheckedRequest> {
        let drafters = match self.speculative {
            true => defaults::SPECULATIVE_DRAFTERS.to_vec(),
            false => Vec::new(),
        };
        let request = GenerateRequest {
            prompt: prompt.unwrap_or_default(),
            scorer,
            drafters,
            corpus_rule: self.corpus_rule,
            guard: self.guard.map(|max_span| GuardSpec {
                max_span,
                ignore_prompt: self.guard_ignore_prompt,
            }),
            sampling: Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                seed: self.seed,
                repetition_penalty: self.repetition_penalty,
            },
            limits: GenLimits {
                max_tokens: self.max_tokens,
                context: self.context,
                draft_max: self.draft_max,
            },
        };
        Ok(request
            .check(MAX_GEN_TOKENS)
            .map_err(|e| e.rename_field(super::FLAG_NAMES))?)
    }

    /// The guard's own index (`--guard-index`), opened once: the guard and the report of the
    /// longest copied span share it.
    fn guard_index(&self) -> Result<Option<Arc<infgram::service::Index<memmap2::Mmap>>>> {
        Ok(match &self.guard_index {
            Some(dir) => Some(Arc::new(infgram::service::Index::open(dir)?)),
            None => None,
        })
    }
}

/// The `--stats` line of a copy guard.
fn guard_line(report: &Copying) -> Option<String> {
    let g = report.guard?;
    Some(format!(
        "copy guard (L = {}): {} steps blocked, {} tokens masked, {} searches, {:.2} ms; longest copied span {} tokens",
        g.max_span,
        g.blocked,
        g.masked,
        g.searches,
        g.seconds * 1e3,
        report.max_copied_span.unwrap_or(0)
    ))
}

/// The line printed when the guard left no token to generate.
const EXHAUSTED: &str =
    "generation stopped: the copy guard masked every token that could come next";

fn stats_line(xs: &mut [f64]) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    xs.sort_by(f64::total_cmp);
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
    format!(
        "median {:>8.1}  mean {:>9.1}  std {:>9.1}",
        xs[xs.len() / 2],
        mean,
        var.sqrt()
    )
}

/// Where the generated text goes: streamed token by token (complete UTF-8 only) or printed
/// at the end, then a JSON object or the text, then statistics on stderr. Both generation paths
/// go through it.
struct Output<'a> {
    tok: &'a dyn Tokenizer,
    stream: bool,
    json: bool,
    out: std::io::StdoutLock<'static>,
    streamer: Utf8Stream,
    io_err: Option<anyhow::Error>,
}

impl<'a> Output<'a> {
    fn new(args: &GenArgs, tok: &'a dyn Tokenizer) -> Self {
        Output {
            tok,
            stream: !args.json && (args.stream || std::io::stdout().is_terminal()),
            json: args.json,
            out: std::io::stdout().lock(),
            streamer: Utf8Stream::default(),
            io_err: None,
        }
    }

    /// Shows `echo` (the prompt, when the output continues it) before the first token.
    fn start(&mut self, echo: &str) -> Result<()> {
        if self.stream {
            self.out.write_all(echo.as_bytes())?;
        }
        Ok(())
    }

    /// One generated token (shown at once when streaming).
    fn token(&mut self, t: u32) {
        if self.stream && self.io_err.is_none() {
            let shown = self
                .tok
                .decode_bytes(&[t])
                .map_err(anyhow::Error::from)
                .and_then(|b| {
                    let text = self.streamer.push(&b);
                    self.out.write_all(text.as_bytes())?;
                    Ok(self.out.flush()?)
                });
            self.io_err = shown.err();
        }
    }

    /// Prints the result: `fields` as JSON with `--json`; else `echo` and the text of `tokens`
    /// unless they were streamed (the same pieces a stream shows); then `stats` lines on stderr.
    fn finish(mut self, echo: &str, tokens: &[u32], fields: Value, stats: &[String]) -> Result<()> {
        if let Some(e) = self.io_err.take() {
            return Err(e);
        }
        if self.json {
            writeln!(self.out, "{fields}")?;
        } else if self.stream {
            writeln!(self.out)?;
        } else {
            let text = String::from_utf8_lossy(&self.tok.decode_bytes(tokens)?).into_owned();
            writeln!(self.out, "{echo}{text}")?;
        }
        self.out.flush()?;
        for line in stats {
            infgram::diag!("{line}");
        }
        Ok(())
    }
}

/// Runs `infgram gen`.
pub fn run(args: GenArgs) -> Result<()> {
    args.model_args
        .refuse_without_model(args.model.as_deref())?;
    if args.model.is_some() {
        args.est.refuse_all(
            "with --model (the model generates; a mixture's ∞-gram is the mixer file's)",
        )?;
    } else {
        args.est.check_applies()?;
    }
    match args.model.clone() {
        #[cfg(feature = "neural")]
        Some(model) => match &args.batch {
            Some(file) => super::gen_batch::run_batch(&args, &model, file),
            None => run_model(&args, &model),
        },
        #[cfg(not(feature = "neural"))]
        Some(_) => Err(super::no_neural()),
        None => run_infgram(&args),
    }
}

/// `infgram gen` from the index alone.
fn run_infgram(args: &GenArgs) -> Result<()> {
    let (index, tok) = match &args.index {
        Some(d) => infgram::service::open_index(d, None)?,
        None => infgram::service::open_cached_byte_index(&args.corpus)?,
    };
    let estimator = args.est.spec();
    let req = args.request(
        args.prompt.clone().map(Prompt::Text),
        Scorer::Infgram { estimator },
    )?;
    let shown = args.prompt.as_deref().unwrap_or_default();
    let mut res =
        Resources::corpus(Arc::new(index), tok.as_ref()).guard_index(args.guard_index()?)?;
    let opts = RunOptions {
        // The longest copied span (a pass over the output), when it is shown.
        measure_copying: args.stats || args.json,
        ..Default::default()
    };
    let mut out = Output::new(args, tok.as_ref());
    out.start(shown)?;
    let r = generate(&req, &mut res, &opts, |t| out.token(t))?;
    let mut fields = serde_json::to_value(&r)?;
    fields["prompt"] = shown.into();
    let mut stats = Vec::new();
    if r.guard_exhausted && !args.json {
        stats.push(EXHAUSTED.to_string());
    }
    if args.stats {
        stats.push(format!(
            "{} tokens in {:.4} s ({:.0} tokens/s)",
            r.tokens, r.seconds, r.tokens_per_second
        ));
        let depth = r.steps.steps().map(<[_]>::len).max().unwrap_or(0);
        for j in 0..depth {
            let level = |f: fn(&(usize, u64)) -> f64| -> Vec<f64> {
                r.steps.steps().filter_map(|s| s.get(j)).map(f).collect()
            };
            let (mut n, mut m) = (level(|l| l.0 as f64), level(|l| l.1 as f64));
            stats.push(format!(
                "level {j}: steps {:>5}  n: {}  m: {}",
                n.len(),
                stats_line(&mut n),
                stats_line(&mut m)
            ));
        }
        let cache = r.cache.unwrap_or_default();
        stats.push(format!(
            "counts cache: {} hits, {} misses (hit rate {:.1}%), {} evicted, {} pairs held",
            cache.hits,
            cache.misses,
            100.0 * cache.hit_rate(),
            cache.evicted,
            cache.held
        ));
        let copying = r.copying.unwrap_or_default();
        stats.push(format!(
            "longest span of the output found in the corpus: {} tokens",
            copying.max_copied_span.unwrap_or(0)
        ));
        stats.extend(guard_line(&copying));
        let backoffs = r.stats.as_ref().map_or(0, |s| s.backoffs);
        if backoffs > 0 {
            stats.push(format!(
                "{backoffs} steps backed off to shorter levels (the guard masked the kept levels' continuations)"
            ));
        }
    }
    out.finish(shown, &r.token_ids, fields, &stats)
}

/// `infgram gen --model M`: decoding with the neural model, plain or speculative.
#[cfg(feature = "neural")]
fn run_model(args: &GenArgs, model: &str) -> Result<()> {
    use infgram::service::run::{load_mixer, ModelIndex, PAST_OUTPUTS_BUDGET};
    let opts = infgram::service::models::ModelOptions {
        tokenizer: args.tokenizer.clone(),
        ..args.model_args.options()
    };
    let loaded = infgram::service::models::load_model(model, &opts)?;
    let prompt = loaded.prompt(
        args.prompt.as_deref(),
        args.system.as_deref(),
        args.raw,
        args.parse_special,
    );
    // The pass costs speculative decoding plans with (measured once per machine and model).
    let mut loaded = loaded;
    let costs = match args.speculative {
        true => Some(loaded.pass_costs()),
        false => None,
    };
    let infgram::service::models::LoadedModel {
        model: mut llm,
        tokenizer: tok,
        path,
        ..
    } = loaded;
    // With --mix the scorer is the mixture of the model and the ∞-gram of --index.
    let mix = match &args.mix {
        Some(mix) => Some(load_mixer(infgram::service::run::mixer_file(mix))?),
        None => None,
    };
    let shown = args.prompt.as_deref().unwrap_or_default();
    let scorer = if mix.is_some() {
        Scorer::Mixture
    } else {
        Scorer::Model
    };
    let req = args.request(prompt, scorer)?;
    let drafting_index = match (&args.index, &mix) {
        (Some(dir), _) => Some(Arc::new(infgram::service::Index::open(dir)?)),
        // The mixture's default ∞-gram: the default corpus in the model's tokens.
        (None, Some(_)) => Some(Arc::new(infgram::service::open_cached_index(&[], &tok)?.1)),
        (None, None) => None,
    };
    // --guard-index naming the --index directory: the index opened once.
    let guard_index = match (&args.guard_index, &args.index, &drafting_index) {
        (Some(g), Some(i), Some(opened)) if same_dir(g, i) => Some(opened.clone()),
        _ => args.guard_index()?,
    };
    let drafting_index = drafting_index
        .map(|index| ModelIndex::check(index, &tok, mix.is_some()))
        .transpose()?;
    if let Some(file) = &args.trace {
        // Checked before the generation (a refused output costs nothing).
        infgram::service::files::check(file, Accept::Streams)?;
    }
    let past = match &args.past_outputs {
        Some(file) => Some(infgram::service::PastStore::load(
            file,
            &tok,
            PAST_OUTPUTS_BUDGET,
        )?),
        None => None,
    };
    let name = path.display().to_string();
    let mut res = Resources::model(llm.as_mut(), &tok, name)
        .drafting_index(drafting_index, mix)
        .guard_index(guard_index)?
        .past_outputs(past);
    if let Some(costs) = costs {
        res = res.pass_costs(costs);
    }
    let opts = RunOptions {
        trace: args.trace.is_some(),
        trees: args.draft_trees,
        compare: args.compare,
        ..Default::default()
    };
    let mut out = Output::new(args, &tok);
    let r = generate(&req, &mut res, &opts, |t| out.token(t))?;
    let stats = r.stats.clone().unwrap_or_default();
    if let Some(file) = &args.trace {
        infgram::service::files::write_file(file, Accept::Streams, |out| {
            for pass in &stats.trace {
                let line = serde_json::to_string(pass).expect("a pass serializes");
                writeln!(out, "{line}").map_err(|e| infgram::Error::io(file, e))?;
            }
            Ok(())
        })?;
    }
    if let Some(why) = &r.past_outputs_not_saved {
        anyhow::bail!("the past outputs were not saved: {why}");
    }
    let mut fields = serde_json::to_value(&r)?;
    fields["prompt"] = shown.into();
    let mut lines = vec![format!(
        "{} tokens in {:.2} s ({:.1} tokens/s, prompt {} tokens)",
        r.tokens, r.seconds, r.tokens_per_second, r.prompt_tokens
    )];
    if args.stats && args.speculative {
        lines.push(format!(
            "speculative: {} passes, {} drafted, {} accepted (acceptance {:.1}%, mean accepted {:.2} per drafted pass); drafting {:.3} s, model {:.3} s",
            stats.passes,
            stats.drafted,
            stats.accepted,
            100.0 * stats.acceptance_rate(),
            stats.mean_accepted(),
            stats.draft_seconds,
            stats.model_seconds
        ));
    }
    if r.guard_exhausted {
        lines.push(EXHAUSTED.to_string());
    }
    if args.stats {
        lines.extend(r.copying.as_ref().and_then(guard_line));
    }
    if let Some(c) = &r.comparison {
        lines.push(match (c.plain_tokens_per_second, c.speedup, c.identical) {
            (Some(plain), Some(speedup), Some(identical)) => format!(
                "plain decoding: {plain:.1} tokens/s; speculative: {:.1} tokens/s; speed-up \
                 {speedup:.2}×; outputs {}",
                r.tokens_per_second,
                if identical {
                    "identical"
                } else {
                    "differ (sampling)"
                }
            ),
            _ => "plain decoding not compared: the generation was stopped before its end \
                  (a time limit, or a client that left)"
                .to_string(),
        });
    }
    if args.json {
        lines.clear();
    }
    out.finish("", &r.token_ids, fields, &lines)
}

/// Whether two paths name one directory.
#[cfg(feature = "neural")]
fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
