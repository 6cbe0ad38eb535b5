//! `infgram gen`: generate text from the ∞-gram index with SBIS (or the smoothed estimator).

use anyhow::Result;
use clap::Args;
use infgram::generate::sampler::{Sampler, SamplerConfig};
use infgram::generate::{generate, GenConfig};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// Arguments of `infgram gen`.
#[derive(Args, Debug)]
pub struct GenArgs {
    /// The prompt.
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Index to generate from (default: Shakespeare's complete works, fetched and indexed on first use).
    #[arg(long, conflicts_with = "corpus")]
    pub index: Option<PathBuf>,
    /// Corpus files to generate from (indexed into the cache on first use, keyed by content).
    #[arg(long, num_args = 1..)]
    pub corpus: Vec<PathBuf>,
    /// The estimator and its settings.
    #[command(flatten)]
    pub est: super::EstimatorArgs,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Keep only the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Context length in tokens.
    #[arg(long, default_value_t = 200)]
    pub context: usize,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 500)]
    pub max_tokens: usize,
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
    /// Generate with a neural model instead of the index: a short name (`smollm2-135m`,
    /// fetched on first use), a `.gguf` file, a safetensors model directory, or
    /// `hf:OWNER/REPO[:FILE]` (downloaded from the Hugging Face Hub). With --speculative, --index is the drafting
    /// index (built with `infgram index --tokenizer` and the same model).
    #[arg(long, conflicts_with = "corpus")]
    pub model: Option<String>,
    /// With --model: speculative decoding. The live prompt index (and --index, if given)
    /// drafts tokens, the model verifies them in one pass; the output is the model's own.
    #[arg(long, requires = "model")]
    pub speculative: bool,
    /// With --speculative: longest draft verified in one pass.
    #[arg(long, default_value_t = 16)]
    pub draft_max: usize,
    /// With --model: also decode without drafts and print both speeds, the ratio, and whether
    /// the outputs are identical.
    #[arg(long, requires = "model")]
    pub compare: bool,
    /// With --model: repetition penalty (1: none) over the last 64 tokens.
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// With --model: use the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    #[command(flatten)]
    pub model_args: super::ModelArgs,
}

/// Incremental decoder that prints only complete UTF-8.
struct Stream {
    pending: Vec<u8>,
}

impl Stream {
    fn push(&mut self, bytes: &[u8], out: &mut impl Write) -> std::io::Result<()> {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(), // invalid bytes: flush them lossily
        };
        let chunk: Vec<u8> = self.pending.drain(..valid).collect();
        out.write_all(String::from_utf8_lossy(&chunk).as_bytes())?;
        out.flush()
    }
}

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

/// The shared sampler with the command's settings.
fn sampler_for(args: &GenArgs) -> Sampler {
    Sampler::new(
        SamplerConfig {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
        },
        args.seed,
    )
}

/// Runs a generation, printing each token as it comes when `stream` (complete UTF-8 only);
/// returns its result and the seconds it took.
fn streamed<T>(
    tok: &dyn infgram::tokenizer::Tokenizer,
    stream: bool,
    out: &mut impl Write,
    run: impl FnOnce(&mut dyn FnMut(u32)) -> infgram::Result<T>,
) -> Result<(T, f64)> {
    let mut streamer = Stream {
        pending: Vec::new(),
    };
    let mut io_err = None;
    let t0 = std::time::Instant::now();
    let result = run(&mut |t| {
        if stream && io_err.is_none() {
            let shown = tok
                .decode_bytes(&[t])
                .map_err(anyhow::Error::from)
                .and_then(|b| Ok(streamer.push(&b, out)?));
            io_err = shown.err();
        }
    })?;
    let secs = t0.elapsed().as_secs_f64();
    match io_err {
        Some(e) => Err(e),
        None => Ok((result, secs)),
    }
}

/// Runs `infgram gen`.
pub fn run(args: GenArgs) -> Result<()> {
    if let Some(model) = args.model.clone() {
        return run_model(&args, &model);
    }
    let dir = match &args.index {
        Some(d) => d.clone(),
        None => super::cached_byte_index(&args.corpus)?,
    };
    let (index, tok) = super::query::open_index(&dir, None)?;
    let estimator = args.est.estimator(None)?;
    let prompt = tok.encode(&args.prompt)?;
    let cfg = GenConfig {
        estimator,
        context: args.context.max(1),
        max_tokens: args.max_tokens,
    };
    let mut sampler = sampler_for(&args);
    let stream = !args.json && (args.stream || std::io::stdout().is_terminal());
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if stream {
        out.write_all(args.prompt.as_bytes())?;
    }
    let (g, secs) = streamed(tok.as_ref(), stream, &mut out, |emit| {
        generate(&index, &prompt, &cfg, &mut sampler, emit)
    })?;
    let text = tok.decode(&g.tokens)?;
    let tps = g.tokens.len() as f64 / secs.max(1e-12);
    if args.json {
        let v = serde_json::json!({
            "prompt": args.prompt,
            "text": text,
            "tokens": g.tokens.len(),
            "token_ids": g.tokens,
            "seconds": secs,
            "tokens_per_second": tps,
            "stopped_at_document_end": g.hit_end,
        });
        writeln!(out, "{v}")?;
    } else if !stream {
        writeln!(out, "{}{}", args.prompt, text)?;
    } else {
        writeln!(out)?;
    }
    if args.stats {
        let depth = g.steps.iter().map(|s| s.levels.len()).max().unwrap_or(0);
        eprintln!(
            "{} tokens in {:.4} s ({:.0} tokens/s)",
            g.tokens.len(),
            secs,
            tps
        );
        for j in 0..depth {
            let mut n: Vec<f64> = g
                .steps
                .iter()
                .filter_map(|s| s.levels.get(j))
                .map(|l| l.0 as f64)
                .collect();
            let mut m: Vec<f64> = g
                .steps
                .iter()
                .filter_map(|s| s.levels.get(j))
                .map(|l| l.1 as f64)
                .collect();
            eprintln!(
                "level {j}: steps {:>5}  n: {}  m: {}",
                n.len(),
                stats_line(&mut n),
                stats_line(&mut m)
            );
        }
    }
    Ok(())
}

/// `infgram gen --model M`: decoding with the neural model, plain or speculative.
fn run_model(args: &GenArgs, model: &str) -> Result<()> {
    use infgram::decode::{decode, DecodeConfig, Drafter, Processor, RepetitionPenalty};
    use infgram::tokenizer::Tokenizer;
    let super::LoadedModel {
        model: mut llm,
        tokenizer: tok,
        path,
    } = args.model_args.load(model)?;
    let text = if args.raw {
        args.prompt.clone()
    } else {
        infgram::neural::chat_prompt(&args.prompt)
    };
    let prompt = tok.encode(&text)?;
    let mut drafters: Vec<Box<dyn Drafter>> = Vec::new();
    if args.speculative {
        drafters.push(Box::new(infgram::decode::drafters::PromptLookup::new(8)));
        if let Some(dir) = &args.index {
            let index = infgram::Index::open(dir)?;
            infgram::tokenizer::check_fingerprint(&index.header().tokenizer, &tok)?;
            drafters.push(Box::new(infgram::decode::drafters::CorpusDrafter::new(
                index,
            )));
        }
    }
    let processors = || -> Vec<Box<dyn Processor>> {
        if args.repetition_penalty == 1.0 {
            return Vec::new();
        }
        vec![Box::new(RepetitionPenalty {
            penalty: args.repetition_penalty,
            window: 64,
        })]
    };
    let cfg = DecodeConfig {
        max_tokens: args.max_tokens,
        draft_max: args.draft_max,
        ..DecodeConfig::default()
    };
    let mut sampler = sampler_for(args);
    let stream = !args.json && (args.stream || std::io::stdout().is_terminal());
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let ((ids, stats), _) = streamed(&tok, stream, &mut out, |emit| {
        decode(
            llm.as_mut(),
            &mut drafters,
            &mut processors(),
            &mut sampler,
            &prompt,
            &cfg,
            emit,
        )
    })?;
    let plain = if args.compare {
        let mut sampler = sampler_for(args);
        Some(decode(
            llm.as_mut(),
            &mut [],
            &mut processors(),
            &mut sampler,
            &prompt,
            &cfg,
            |_| {},
        )?)
    } else {
        None
    };
    let generated = tok.decode(&ids)?;
    let tps = stats.tokens_per_second();
    if args.json {
        let mut v = serde_json::json!({
            "prompt": args.prompt, "text": generated, "tokens": ids.len(), "token_ids": ids,
            "seconds": stats.seconds, "tokens_per_second": tps, "model": path.display().to_string(),
            "prompt_tokens": prompt.len(), "context_tokens": llm.cache_len(),
            "speculative": args.speculative, "acceptance_rate": stats.acceptance_rate(),
            "mean_accepted": stats.mean_accepted(), "stats": stats,
        });
        if let Some((plain_ids, plain_stats)) = &plain {
            v["plain_tokens_per_second"] = plain_stats.tokens_per_second().into();
            v["speedup"] = (tps / plain_stats.tokens_per_second()).into();
            v["identical"] = (plain_ids == &ids).into();
        }
        writeln!(out, "{v}")?;
        return Ok(());
    }
    if !stream {
        write!(out, "{generated}")?;
    }
    writeln!(out)?;
    out.flush()?;
    eprintln!(
        "{} tokens in {:.2} s ({:.1} tokens/s, prompt {} tokens)",
        ids.len(),
        stats.seconds,
        tps,
        prompt.len()
    );
    if args.stats && args.speculative {
        eprintln!(
            "speculative: {} passes, {} drafted, {} accepted (acceptance {:.1}%, mean accepted {:.2} per drafted pass); drafting {:.3} s, model {:.3} s",
            stats.passes,
            stats.drafted,
            stats.accepted,
            100.0 * stats.acceptance_rate(),
            stats.mean_accepted(),
            stats.draft_seconds,
            stats.model_seconds
        );
    }
    if let Some((plain_ids, plain_stats)) = &plain {
        eprintln!(
            "plain decoding: {:.1} tokens/s; speculative: {:.1} tokens/s; speed-up {:.2}×; outputs {}",
            plain_stats.tokens_per_second(),
            tps,
            tps / plain_stats.tokens_per_second(),
            if plain_ids == &ids { "identical" } else { "differ (sampling)" }
        );
    }
    Ok(())
}
