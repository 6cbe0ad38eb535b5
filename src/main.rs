//! The `infgram` command-line tool: one file per subcommand under `cli/`.
// Diagnostics go through `infgram::diag!`: `eprintln!` panics when standard error cannot be
// written.
#![deny(clippy::print_stderr)]

mod cli;

use clap::{Parser, Subcommand};

/// What each command writes, and where (`infgram --help`).
const WRITES: &str = "\
What each command writes (and nothing else):
  index -o DIR              the index DIR (built beside it in DIR.tmp-PID, renamed into place)
  gen --corpus, serve       cached indexes under $INFGRAM_CACHE (default ~/.cache/infgram)
  gen --past-outputs FILE   FILE, after the generation
  serve --past-outputs FILE FILE, after each completion
  gen --trace FILE          FILE
  export-arpa -o FILE       FILE
  attribute --html FILE     FILE
  ppl --plot FILE           FILE (PNG)
  mix fit -o FILE           FILE
  verify                    a record under the cache
  fetch                     the cache (models under $INFGRAM_MODELS)
A FILE is written into a new temporary file beside it (created exclusively, never through a
link), synced and renamed over it: a failure leaves the old file and nothing else. A link, a
directory and a path inside an index are refused. export-arpa -o, --trace and --html also
write to - (standard output), a FIFO or a device, as a stream.";

/// infgram: an ∞-gram engine and text generator.
#[derive(Parser, Debug)]
#[command(name = "infgram", version, about, long_about = None, after_help = WRITES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Build an index of a corpus.
    Index(cli::index::IndexArgs),
    /// Query an index (count, prob, ntd, infgram_prob, infgram_ntd, find, search_docs, ...).
    Query(cli::query::QueryArgs),
    /// Generate text from an index with selective backoff interpolation sampling.
    Gen(cli::gen::GenArgs),
    /// Perplexity and agreement of the ∞-gram on a text.
    Ppl(cli::ppl::PplArgs),
    /// Write the modified Kneser–Ney model of an index in ARPA format (KenLM-compatible).
    ExportArpa(cli::arpa::ArpaArgs),
    /// The spans of a text that occur in the corpus, with their counts and documents.
    Attribute(cli::attribute::AttributeArgs),
    /// How much of a text no long corpus span covers: L-uniqueness and the Creativity Index.
    Creativity(cli::attribute::CreativityArgs),
    /// Mix the ∞-gram with a neural model: fit λ on held-out text.
    #[command(subcommand)]
    Mix(cli::mix::MixCommand),
    /// Serve the infini-gram HTTP API and generation (`POST /`, `POST /v1/completions`).
    #[cfg(feature = "server")]
    Serve(cli::serve::ServeArgs),
    /// Write a model's tokenizer (a short name or a `.gguf` file) as a `tokenizer.json`, with
    /// the same ids and fingerprint: for a build that cannot read a GGUF file's tokenizer
    /// (the Python wheel: `infgram.Index(DIR, tokenizer="tokenizer.json")`).
    ExportTokenizer {
        /// The model or tokenizer.
        name: String,
        /// The file to write (beside and renamed into place).
        #[arg(short, long)]
        output: std::path::PathBuf,
    },
    /// Check every checksum of an index.
    Verify {
        /// The index directory.
        index: std::path::PathBuf,
    },
    /// Fetch a known model (`smollm2-135m`, `gemma3-270m`, `qwen2.5-coder-0.5b`,
    /// `qwen2.5-coder-1.5b`) or the default corpus (`shakespeare`).
    Fetch {
        /// What to fetch.
        what: String,
    },
}

/// Whether the command is `serve` (which handles SIGINT / SIGTERM itself).
fn is_serve(command: &Command) -> bool {
    #[cfg(feature = "server")]
    if matches!(command, Command::Serve(_)) {
        return true;
    }
    let _ = command;
    false
}

fn main() {
    // candle's quantized matmul was measured 15–30× slower with 2 threads than with 1 on these
    // 2-core machines; default to one unless the user chose (set before any thread starts).
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    let cli = parse_or_exit();
    // Ctrl-C or SIGTERM during an index build (also the first-use builds of `gen`, `serve`'s
    // default index excepted) removes its temporary directory; `serve` handles them itself.
    #[cfg(unix)]
    if !is_serve(&cli.command) {
        cli::clean_up_on_signals();
    }
    let result = match cli.command {
        Command::Index(a) => cli::index::run(a),
        Command::Query(a) => cli::query::run(a),
        Command::Gen(a) => cli::gen::run(a),
        Command::Ppl(a) => cli::ppl::run(a),
        Command::ExportArpa(a) => cli::arpa::run(a),
        Command::Attribute(a) => cli::attribute::run_attribute(a),
        Command::Creativity(a) => cli::attribute::run_creativity(a),
        Command::Mix(c) => cli::mix::run(c),
        #[cfg(feature = "server")]
        Command::Serve(a) => cli::serve::run(a),
        Command::ExportTokenizer { name, output } => cli::export_tokenizer(&name, &output),
        Command::Verify { index } => cli::verify(&index),
        Command::Fetch { what } => cli::fetch(&what),
    };
    // What the command printed is out before the status says it succeeded (a failed flush is
    // the command's failure, not a silent loss at exit).
    let result = result.and_then(|()| {
        use anyhow::Context as _;
        use std::io::Write as _;
        std::io::stdout().lock().flush().context("standard output")
    });
    if let Err(e) = result {
        // A reader of standard output that stopped reading (`| head`) is not an error; any
        // other broken pipe (a FIFO given as an output, a child's pipe) is.
        if is_broken_pipe(&e) && stdout_reader_gone() {
            std::process::exit(0);
        }
        infgram::diag!("error: {}", message(&e));
        std::process::exit(1);
    }
}

/// Whether `e` or one of its causes is a broken pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Whether standard output is a pipe or socket whose reading end is closed (`poll` reports an
/// error or a hang-up on it without waiting).
fn stdout_reader_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack, a zero timeout.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready == 1 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// The command line, or the process ends: `--help` and `--version` print and exit 0 (1 when
/// their text cannot be written, e.g. to a full disk; 0 on a closed pipe), a usage error
/// exits 2 as clap does.
fn parse_or_exit() -> Cli {
    use clap::error::ErrorKind;
    let e = match Cli::try_parse() {
        Ok(cli) => return cli,
        Err(e) => e,
    };
    if !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let written = write!(out, "{}", e.render()).and_then(|()| out.flush());
    match written {
        Err(w) if w.kind() != std::io::ErrorKind::BrokenPipe => {
            infgram::diag!("error: cannot write the help text to standard output: {w}");
            std::process::exit(1);
        }
        _ => std::process::exit(0),
    }
}

/// The error and its causes, `outer: inner: …`, each cause left out when the message before
/// it already ends with it (the library's I/O errors name their cause in their own message).
fn message(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}
