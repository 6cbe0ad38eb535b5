//! The decoding benchmarks, one program with a subcommand each; they share the prompt sets
//! and the drafters' ceiling:
//!
//! * `speculative`: speculative decoding against plain decoding, per prompt set;
//! * `mix`: mixing SmolLM2 with the ∞-gram (perplexity, fitted λ, decoding speed);
//! * `policy`: drafting policies compared free of timing noise;
//! * `repeated`: the repeated-task workload through one server (past outputs drafting);
//! * `passes`: what a pass of k tokens costs against a one-token step, on the CPU or a GPU;
//! * `edits`: code edits with a real coder model, speculative against plain decoding;
//! * `batch`: several clients at once on one model, their passes shared;
//! * `products`: the quantized products alone per ISA and row count, beside the bound.
//!
//! `cargo run --release --example bench_decode -- speculative --repeats 3` (`--help` lists the
//! options). The tables are those of `BENCHMARKS.md`.

use clap::{Parser, Subcommand};
use infgram::neural::native::kernels::Isa;
use infgram::service::models::{Backend, Device};

mod batch;
mod bound;
mod ceiling;
mod confidences;
mod edits;
mod gpu_check;
mod mix;
mod passes;
mod policy;
mod products;
mod prompts;
mod repeated;
mod speculative;

#[derive(Parser)]
#[command(about = "infgram's decoding benchmarks")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Speculative decoding against plain decoding on the prompt sets.
    Speculative {
        /// Alternating runs of plain and speculative decoding per prompt; each keeps its
        /// fastest (the ratios then move far less on a noisy machine).
        #[arg(long, default_value_t = 1)]
        repeats: usize,
        /// Also draw, per prompt, the tokens each pass emitted (feature `plot`).
        #[arg(long)]
        plot_dir: Option<std::path::PathBuf>,
        /// The model: a short name (`smollm2-135m`, `gemma3-270m`) or a GGUF file.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// The kernels' instruction set (`avx2`, `avx512vnni`…; default: the best this CPU has).
        #[arg(long)]
        isa: Option<Isa>,
        /// Where the model runs: `cpu` (the native kernels) or `cuda` (the candle pass on a GPU,
        /// a build with the `cuda` feature).
        #[arg(long, value_enum, default_value_t = Device::Cpu)]
        device: Device,
        /// Only the prompt sets whose names start with this (`copy`, `Shakespeare`, `open`, `questions`).
        #[arg(long)]
        set: Option<String>,
        /// On CUDA: `native` (infgram's fused kernels) or `candle` (the candle pass).
        #[arg(long, value_enum, default_value_t = Backend::Native)]
        backend: Backend,
    },
    /// Several clients decoding at once on one model, their passes shared, against one.
    Batch {
        /// The model: a short name or a GGUF file (the native backend).
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// `cpu` (the native kernels) or `cuda` (infgram's fused GPU kernels).
        #[arg(long, value_enum, default_value_t = Device::Cpu)]
        device: Device,
        /// Client counts to run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        clients: Vec<usize>,
        /// Tokens each client generates at most.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// Threads of the model's passes.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
    /// What a pass over k new tokens costs against a one-token step (after a 256-token prompt).
    Passes {
        /// The model: a short name (`smollm2-135m`, `gemma3-270m`) or a GGUF file.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
        /// `cpu` (the native kernels) or `cuda` (the candle pass on a GPU).
        #[arg(long, value_enum, default_value_t = Device::Cpu)]
        device: Device,
        /// Timed repetitions of each pass length (the median is printed).
        #[arg(long, default_value_t = 30)]
        repeats: usize,
        /// On CUDA: `native` (infgram's fused kernels) or `candle` (the candle pass).
        #[arg(long, value_enum, default_value_t = Backend::Native)]
        backend: Backend,
        /// On the CPU: the kernels' instruction set (`scalar`, `avx2`, `avxvnni`,
        /// `avx512vnni`; any this CPU runs; default: its best), so that one machine measures
        /// every ISA's walk.
        #[arg(long)]
        isa: Option<Isa>,
    },
    /// The quantized products alone (a layer's feed-forward shapes) per ISA and row count,
    /// beside the compute bound.
    Products {
        /// Only these instruction sets, comma-separated, timed in the same rounds (default:
        /// every one this CPU runs but the scalar).
        #[arg(long, value_delimiter = ',')]
        isa: Vec<Isa>,
        /// Timed products per shape and row count (the median is printed).
        #[arg(long, default_value_t = 21)]
        repeats: usize,
    },
    /// The GPU's fused kernels checked on a real model (a `cuda` build on a GPU): against
    /// their CPU reference, against the native CPU pass, and for batch invariance (k-token
    /// passes, one token at a time, token trees, with and without CUDA graphs).
    GpuCheck {
        /// The model: a short name (`smollm2-135m`, `gemma3-270m`) or a GGUF file.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
    },
    /// The prompt sets as JSON lines (`{"set", "chat", "prompt"}`), for baselines outside
    /// infgram (`scripts/hf_baseline.py`).
    Prompts,
    /// SmolLM2 mixed with the ∞-gram on Tiny Shakespeare.
    Mix {
        /// Score only the first N tokens of val (0: all, about 36,000).
        #[arg(long, default_value_t = 0)]
        max_val_tokens: usize,
        /// Rounds of plain / mixture / speculative mixture decoding per prompt.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// Drafting policies compared by modeled speed-up (a frozen cost table).
    Policy {
        /// Plan and weigh with this machine's pass costs (and print a perfect drafter's bound).
        #[arg(long)]
        measured_costs: bool,
        /// Plan and weigh with this table instead: the milliseconds of passes of 1, 2, 4, 8
        /// and 16 rows, comma-separated (a table measured once, so that two builds are
        /// compared on the same costs).
        #[arg(long, value_delimiter = ',', conflicts_with = "measured_costs")]
        costs: Option<Vec<f64>>,
        /// The kernels' instruction set (`avx2`, `avx512vnni`…; default: the best this CPU has).
        #[arg(long)]
        isa: Option<Isa>,
    },
    /// Code edits (functions of Python's standard library) and open questions with a coder
    /// model: speculative against plain decoding, through its chat template.
    Edits {
        /// The model: a short name (`qwen2.5-coder-0.5b`, `qwen2.5-coder-1.5b`) or a GGUF file.
        #[arg(long, default_value = "qwen2.5-coder-0.5b")]
        model: String,
        /// Tokens a task generates at most.
        #[arg(long, default_value_t = 384)]
        max_tokens: usize,
        /// Threads of the native pass (0: one per core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// `cpu` (the native kernels) or `cuda` (infgram's fused kernels on a GPU, a `cuda`
        /// build).
        #[arg(long, value_enum, default_value_t = Device::Cpu)]
        device: Device,
        /// Only write the conversations as JSON lines to FILE (for other engines).
        #[arg(long)]
        dump: Option<std::path::PathBuf>,
        /// On the CPU: the kernels' instruction set (`avx2`, `avx512vnni`…; default: the
        /// best this CPU has), so that one machine measures the sets per ISA.
        #[arg(long)]
        isa: Option<String>,
        /// Plan from the load-time calibration frozen and model the speed-ups with it, plain
        /// decoding not run: the same passes in every run (policies compared free of noise).
        #[arg(long)]
        modeled: bool,
        /// With `--modeled`: this table instead, the milliseconds of passes of 1, 2, 4, 8 and
        /// 16 rows, comma-separated.
        #[arg(long, value_delimiter = ',', requires = "modeled")]
        costs: Option<Vec<f64>>,
    },
    /// The repeated-task workload through one server: past outputs drafting.
    Repeated {
        /// The model: a short name (`smollm2-135m`, `gemma3-270m`) or a GGUF file.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
    },
}

fn main() {
    match Cli::parse().bench {
        Bench::Speculative {
            repeats,
            plot_dir,
            model,
            isa,
            device,
            set,
            backend,
        } => speculative::run(
            &model,
            repeats,
            plot_dir,
            isa.unwrap_or_else(Isa::detect),
            device,
            backend,
            set.as_deref(),
        ),
        Bench::Passes {
            model,
            device,
            repeats,
            backend,
            isa,
        } => passes::run(&model, device, backend, repeats, isa),
        Bench::GpuCheck { model } => gpu_check::run(&model),
        Bench::Batch {
            model,
            device,
            clients,
            max_tokens,
            threads,
        } => batch::run(&model, device, &clients, max_tokens, threads),
        Bench::Prompts => {
            for set in prompts::sets() {
                for p in &set.prompts {
                    let line = serde_json::json!({"set": set.name, "chat": set.chat, "prompt": p});
                    println!("{line}");
                }
            }
        }
        Bench::Mix {
            max_val_tokens,
            rounds,
        } => mix::run(max_val_tokens, rounds),
        Bench::Policy {
            measured_costs,
            costs,
            isa,
        } => {
            let costs = match (measured_costs, costs) {
                (true, _) => policy::Costs::Measured,
                (false, Some(ms)) => policy::Costs::Given(ms),
                (false, None) => policy::Costs::Prior,
            };
            policy::run(costs, isa.unwrap_or_else(Isa::detect))
        }
        Bench::Products { isa, repeats } => {
            let isas: Vec<Isa> = if isa.is_empty() {
                Isa::available()
                    .into_iter()
                    .filter(|&i| i != Isa::Scalar)
                    .collect()
            } else {
                isa
            };
            products::run(&isas, repeats)
        }
        Bench::Repeated { model } => repeated::run(&model),
        Bench::Edits {
            model,
            max_tokens,
            threads,
            device,
            dump,
            isa,
            modeled,
            costs,
        } => {
            let plan = match modeled {
                false => edits::Plan::Timed,
                true => edits::Plan::Modeled(costs),
            };
            edits::run(&model, max_tokens, threads, device, dump, isa, plan)
        }
    }
}

/// The median of timed values (the upper one of an even count); `None` when none were timed.
fn median(mut times: Vec<f64>) -> Option<f64> {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied()
}
