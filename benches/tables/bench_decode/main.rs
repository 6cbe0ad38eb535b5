//! The decoding benchmarks, one program with a subcommand each; they share the prompt sets
//! and the drafters' ceiling:
//!
//! * `speculative`: speculative decoding against plain decoding, per prompt set;
//! * `mix`: mixing SmolLM2 with the ∞-gram (perplexity, fitted λ, decoding speed);
//! * `policy`: drafting policies compared free of timing noise;
//! * `repeated`: the repeated-task workload through one server (past outputs drafting).
//!
//! `cargo run --release --example bench_decode -- speculative --repeats 3` (`--help` lists the
//! options). The tables are those of `BENCHMARKS.md`.

use clap::{Parser, Subcommand};
use infgram::neural::cpu::kernels::Isa;

mod ceiling;
mod mix;
mod policy;
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
    },
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
        /// The kernels' instruction set (`avx2`, `avx512vnni`…; default: the best this CPU has).
        #[arg(long)]
        isa: Option<Isa>,
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
        } => speculative::run(&model, repeats, plot_dir, isa.unwrap_or_else(Isa::detect)),
        Bench::Mix {
            max_val_tokens,
            rounds,
        } => mix::run(max_val_tokens, rounds),
        Bench::Policy {
            measured_costs,
            isa,
        } => policy::run(measured_costs, isa.unwrap_or_else(Isa::detect)),
        Bench::Repeated { model } => repeated::run(&model),
    }
}
