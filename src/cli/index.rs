//! `infgram index`: build an index of a corpus.

use anyhow::Result;
use clap::Args;
use infgram::service::build::{build_index, build_tokenizer, default_mem_bytes, BuildOptions};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `infgram index`.
#[derive(Args, Debug)]
pub struct IndexArgs {
    /// Output index directory (must not exist, unless --force).
    #[arg(short, long)]
    pub output: PathBuf,
    /// `bytes`, `words` (whitespace-split, the vocabulary taken from the inputs), a
    /// tokenizer.json, a .gguf model file, a model name (`smollm2-135m`, `gemma3-270m`), a safetensors model
    /// directory, or `hf:OWNER/REPO[:FILE]`.
    #[arg(long, default_value = "bytes")]
    pub tokenizer: String,
    /// Memory budget in GB (default: half of the available memory); larger corpora are sharded.
    #[arg(long, value_parser = super::gigabytes)]
    pub mem: Option<f64>,
    /// Do not build the reversed suffix array (smaller index; slower ∞-gram and SBIS queries).
    #[arg(long)]
    pub no_reverse: bool,
    /// Replace an existing index at --output.
    #[arg(long)]
    pub force: bool,
    /// Sentence mode (with `--tokenizer words`): each line is a sentence, a document of its
    /// own, with `<s>` before it and `</s>` after it, as classic n-gram models count.
    #[arg(long)]
    pub sentences: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Input files and directories (.txt, .jsonl, .jsonl.gz, .jsonl.zst).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

/// Runs `infgram index`.
pub fn run(args: IndexArgs) -> Result<()> {
    let tok = build_tokenizer(&args.tokenizer, &args.inputs)?;
    let opts = BuildOptions {
        mem_bytes: args
            .mem
            .map_or_else(default_mem_bytes, |gb| (gb * 1e9) as u64),
        reverse: !args.no_reverse,
        overwrite: args.force,
        progress: std::io::stderr().is_terminal(),
        sentences: args.sentences,
        ..Default::default()
    };
    let s = build_index(&args.inputs, &args.output, tok.as_ref(), &opts)?;
    if args.json {
        outln!("{}", serde_json::to_string(&s)?)?;
    } else {
        outln!(
            "indexed {} tokens in {} documents, {} shard(s), {:.2} bytes/token on disk ({:.1} MB), {:.2} s, peak memory {}",
            s.tokens,
            s.documents,
            s.shards,
            s.bytes_per_token,
            s.disk_bytes as f64 / 1e6,
            s.seconds,
            s.peak_rss_bytes.map_or("unknown".into(), |b| format!("{:.1} MB", b as f64 / 1e6)),
        )?;
    }
    Ok(())
}
