//! Subcommands of the `infgram` binary: clap types, turned into [`infgram::service`] calls.

/// `println!` that returns a write error instead of panicking: `main` treats a closed pipe as
/// success and any other write error (a full disk) as an error.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

pub mod arpa;
pub mod attribute;
pub mod gen;
#[cfg(feature = "neural")]
pub mod gen_batch;
pub mod index;
pub mod mix;
#[cfg(feature = "plot")]
pub mod plot;
pub mod ppl;
pub mod query;
#[cfg(feature = "server")]
pub mod serve;

use anyhow::Result;
use infgram::service::models::{Backend, Device, ModelOptions, Requantize};
use infgram::service::request::EstimatorSpec;
use std::path::Path;

/// Parses a finite number in `lo..=hi` (each end excluded when `open`), naming the range in
/// the error.
fn number_in(s: &str, lo: (f64, bool), hi: (f64, bool)) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    let above = if lo.1 { x > lo.0 } else { x >= lo.0 };
    let below = if hi.1 { x < hi.0 } else { x <= hi.0 };
    if x.is_finite() && above && below {
        return Ok(x);
    }
    let (l, h) = (if lo.1 { "(" } else { "[" }, if hi.1 { ")" } else { "]" });
    Err(format!("{s} is outside {l}{}, {}{h}", lo.0, hi.0))
}

/// Makes SIGINT and SIGTERM remove the temporary directories of index builds and the
/// temporary files of writes in progress before the process exits (status 130 / 143, as a shell reports a process the signal
/// killed). The signals are blocked in every thread and taken by one thread that waits for
/// them; call it before any other thread starts. (Not for `serve`, whose runtime handles them.)
#[cfg(unix)]
pub fn clean_up_on_signals() {
    // SAFETY: sigset operations on a local set; pthread_sigmask on the calling thread, before
    // other threads exist (they inherit the mask).
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        set
    };
    let waiter = std::thread::Builder::new()
        .name("infgram-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait on a set of blocked signals, into a local.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                infgram::service::build::remove_unfinished();
                std::process::exit(128 + sig);
            }
        });
    if waiter.is_err() {
        // No waiting thread: let the signals act as before.
        // SAFETY: unblocking the same set on the calling thread.
        unsafe {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }
}

/// A probability floor in (0, 1).
pub fn floor(s: &str) -> Result<f64, String> {
    number_in(s, (0.0, true), (1.0, true))
}

/// A fraction in [0, 1].
pub fn fraction(s: &str) -> Result<f64, String> {
    number_in(s, (0.0, false), (1.0, false))
}

/// A memory budget in GB: finite, above 0.
pub fn gigabytes(s: &str) -> Result<f64, String> {
    number_in(s, (0.0, true), (1e6, false))
}

/// A count of at least 1.
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s}: give a whole number ≥ 1")),
    }
}

/// A size in MiB whose bytes fit in memory's addresses (at most 2^40 MiB); 0 allowed.
pub fn mib(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n <= 1 << 40 => Ok(n),
        _ => Err(format!("{s}: give a whole number of MiB, at most 2^40")),
    }
}

/// [`mib`], at least 1.
pub fn positive_mib(s: &str) -> Result<usize, String> {
    match mib(s) {
        Ok(0) => Err(format!("{s}: give a whole number of MiB ≥ 1")),
        other => other,
    }
}

/// SBIS levels: −1 (all) or at least 1.
pub fn levels(s: &str) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(k) if k == -1 || k >= 1 => Ok(k),
        _ => Err(format!(
            "{s}: give −1 (all levels) or a number of levels ≥ 1"
        )),
    }
}

/// The ∞-gram estimators, as flags name them (the library's [`EstimatorSpec`] without its
/// numbers, which come from their own flags).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EstimatorKind {
    /// The infini-gram paper's ∞-gram: the longest suffix with a next token (sparse).
    Infgram,
    /// Selective backoff interpolation (SBIS).
    Sbis,
    /// Interpolated absolute discounting down to uniform (finite perplexity without a floor).
    Smoothed,
    /// Fixed-order interpolated modified Kneser–Ney, as KenLM's lmplz (`--order N`; ppl, gen,
    /// export-arpa).
    Mkn,
    /// Fixed-order add-α (`--order N --alpha A`; α = 0 is MLE; ppl, gen).
    AddAlpha,
}

impl EstimatorKind {
    /// The library's spec of this estimator with the numbers of its flags (a fixed-order
    /// model's order 3 unless given).
    pub fn spec_with(
        self,
        k: Option<i64>,
        decay: Option<f64>,
        order: Option<usize>,
        alpha: Option<f64>,
    ) -> EstimatorSpec {
        let order = order.unwrap_or(3);
        match self {
            EstimatorKind::Mkn => EstimatorSpec::Mkn { order },
            EstimatorKind::AddAlpha => EstimatorSpec::AddAlpha { order, alpha },
            EstimatorKind::Infgram => EstimatorSpec::Infgram,
            EstimatorKind::Sbis => EstimatorSpec::Sbis { k, decay },
            EstimatorKind::Smoothed => EstimatorSpec::Smoothed,
        }
    }
}

/// Estimator flags shared by `gen` and `ppl` (defaults and ranges: the library's
/// [`EstimatorSpec`]).
#[derive(clap::Args, Debug)]
pub struct EstimatorArgs {
    /// The estimator (default: SBIS).
    #[arg(long, value_enum)]
    pub estimator: Option<EstimatorKind>,
    /// SBIS levels to interpolate (−1: all, the default).
    #[arg(long, allow_hyphen_values = true)]
    pub k: Option<i64>,
    /// SBIS weight ratio between consecutive levels, in (0, 1] (default 0.1).
    #[arg(long)]
    pub decay: Option<f64>,
    /// Fixed-order models (mkn, add-alpha): the order N (default 3).
    #[arg(long, value_parser = positive)]
    pub order: Option<usize>,
    /// add-alpha: the pseudo-count α ≥ 0 (default 1; 0 is MLE, where an unseen n-gram needs
    /// --floor).
    #[arg(long)]
    pub alpha: Option<f64>,
}

/// The CLI's names of the generation request's fields.
pub const FLAG_NAMES: &[(&str, &str)] = &[
    ("prompt", "--prompt"),
    ("sampling.temperature", "--temperature"),
    ("sampling.top_p", "--top-p"),
    ("sampling.top_k", "--top-k"),
    ("sampling.repetition_penalty", "--repetition-penalty"),
    ("limits.max_tokens", "--max-tokens"),
    ("limits.context", "--context"),
    ("limits.draft_max", "--draft-max"),
    ("guard.max_span", "--guard"),
    ("scorer.estimator.k", "--k"),
    ("scorer.estimator.decay", "--decay"),
    ("estimator.k", "--k"),
    ("estimator.decay", "--decay"),
    ("order", "--order"),
    ("alpha", "--alpha"),
    ("estimator.order", "--order"),
    ("estimator.alpha", "--alpha"),
    ("scorer.estimator.order", "--order"),
    ("scorer.estimator.alpha", "--alpha"),
    ("drafters", "--speculative"),
    ("floor", "--floor"),
    ("discount_fallback", "--discount-fallback"),
];

impl EstimatorArgs {
    /// The estimator chosen (SBIS when none is).
    pub fn kind(&self) -> EstimatorKind {
        self.estimator.unwrap_or(EstimatorKind::Sbis)
    }

    /// Refuses every estimator flag (with `--model`, whose ∞-gram, if mixed, the mixer file
    /// names): `because` says why.
    pub fn refuse_all(&self, because: &str) -> Result<()> {
        let given = [
            ("--estimator", self.estimator.is_some()),
            ("--k", self.k.is_some()),
            ("--decay", self.decay.is_some()),
            ("--order", self.order.is_some()),
            ("--alpha", self.alpha.is_some()),
        ];
        match given.iter().find(|g| g.1) {
            Some((flag, _)) => anyhow::bail!("{flag} does not apply {because}: leave it out"),
            None => Ok(()),
        }
    }

    /// Refuses a flag given for an estimator it does not apply to (`--order` with SBIS,
    /// `--k` with mkn…), naming both: a flag is never accepted and ignored.
    pub fn check_applies(&self) -> Result<()> {
        use EstimatorKind::*;
        let kind = self.kind();
        let flags: [(&str, bool, &[EstimatorKind]); 4] = [
            ("--k", self.k.is_some(), &[Sbis]),
            ("--decay", self.decay.is_some(), &[Sbis]),
            ("--order", self.order.is_some(), &[Mkn, AddAlpha]),
            ("--alpha", self.alpha.is_some(), &[AddAlpha]),
        ];
        for (flag, given, applies) in flags {
            check_flag_applies(flag, given, kind, applies)?;
        }
        Ok(())
    }

    /// The estimator as the request names it.
    pub fn spec(&self) -> EstimatorSpec {
        self.estimator
            .unwrap_or(EstimatorKind::Sbis)
            .spec_with(self.k, self.decay, self.order, self.alpha)
    }
}

/// The error of `flag` (given when `given`) for estimator `kind`, when it applies only to
/// `applies`.
pub fn check_flag_applies(
    flag: &str,
    given: bool,
    kind: EstimatorKind,
    applies: &[EstimatorKind],
) -> Result<()> {
    if !given || applies.contains(&kind) {
        return Ok(());
    }
    let name = |k: &EstimatorKind| {
        clap::ValueEnum::to_possible_value(k)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    };
    let names: Vec<String> = applies.iter().map(name).collect();
    anyhow::bail!(
        "{flag} applies to --estimator {} only, not to --estimator {}: leave {flag} out, or \
         choose that estimator",
        names.join(" or "),
        name(&kind)
    )
}

/// How a neural model is loaded and run (`gen --model`, `ppl --model`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// With --model: threads for the forward pass (0: one per core). The logits do not depend
    /// on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// With --model: infgram's kernels (`native`, the default: the CPU kernels, or on a GPU
    /// the fused CUDA kernels) or the candle-ops pass (`candle`: the reference, several times
    /// slower on either device).
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// With --model: re-quantize the weights at load (`q8_0`; the candle backend also takes
    /// `q4_0`). The file's own Q4_1 is the fastest with the native backend.
    #[arg(long, value_enum)]
    pub requantize: Option<Requantize>,
    /// With --model: where the passes run: `cpu`, or `cuda` (an NVIDIA GPU; a binary built
    /// with the `cuda` feature, see docs/gpu.md).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// With --model: the native CPU kernels' instruction set (`scalar`, `avx2`, `avxvnni`,
    /// `avx512vnni`, `amx`; one this CPU runs) instead of the best: the same outputs, bit
    /// for bit, on every one (for measuring, or to step around a kernel).
    #[arg(long)]
    pub isa: Option<String>,
}

impl ModelArgs {
    /// Refuses these flags where no `--model` is named (each would otherwise be ignored).
    pub fn refuse_without_model(&self, model: Option<&str>) -> Result<()> {
        if model.is_some() {
            return Ok(());
        }
        for (flag, given) in [
            ("--threads", self.threads != 0),
            ("--backend", self.backend.is_some()),
            ("--requantize", self.requantize.is_some()),
            ("--device", self.device != Device::Cpu),
            ("--isa", self.isa.is_some()),
        ] {
            if given {
                anyhow::bail!(
                    "{flag} applies with --model only: name a model, or leave {flag} out"
                );
            }
        }
        Ok(())
    }

    /// The service's model options (unused in a build without neural models).
    #[cfg_attr(not(feature = "neural"), allow(dead_code))]
    pub fn options(&self) -> ModelOptions {
        // More threads than cores oversubscribes the spinning pool (46 s for 5 tokens with 8
        // threads on 2 cores): cap them.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if self.threads > cores {
            infgram::diag!(
                "warning: --threads {} is more than the {cores} cores here; using {cores}",
                self.threads
            );
            cores
        } else {
            self.threads
        };
        ModelOptions {
            tokenizer: None,
            threads,
            backend: self.backend.unwrap_or_default(),
            requantize: self.requantize,
            device: self.device,
            isa: self.isa.clone(),
        }
    }
}

/// The error of a `--model` option in a build without neural models.
#[cfg(not(feature = "neural"))]
pub fn no_neural() -> anyhow::Error {
    anyhow::anyhow!(
        "this infgram was built without the `neural` feature: neural models are not available \
         (build with default features: `cargo install --path .`)"
    )
}

/// `infgram verify INDEX`.
pub fn verify(dir: &Path) -> Result<()> {
    let index = infgram::service::indexes::verify(dir)?;
    outln!(
        "{}: ok ({} tokens, {} shards; recorded as verified)",
        dir.display(),
        index.total_tokens(),
        index.shards().len()
    )?;
    Ok(())
}

/// `infgram export-tokenizer NAME -o FILE`.
pub fn export_tokenizer(name: &str, output: &Path) -> Result<()> {
    use infgram::service::files::{check, write_file, Accept};
    // Checked before the model is fetched (a refused output costs nothing).
    check(output, Accept::Files)?;
    let json = infgram::service::indexes::tokenizer_json(name)?;
    write_file(output, Accept::Files, |out| {
        out.write_all(json.as_bytes())
            .map_err(|e| infgram::Error::io(output, e))
    })?;
    outln!("wrote {} ({} bytes)", output.display(), json.len())?;
    Ok(())
}

/// `infgram fetch WHAT`.
pub fn fetch(what: &str) -> Result<()> {
    let path = infgram::service::indexes::fetch(what)?;
    outln!("{}", path.display())?;
    Ok(())
}
