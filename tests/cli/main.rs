//! The command-line contract, across processes: an index written by `infgram index` is read by
//! `infgram query`; damaged indexes, wrong tokenizers and bad input give clear errors; a failed
//! build leaves nothing behind.

#[path = "../common/mod.rs"]
mod common;

use common::infgram_command;
use infgram::index::shards::Shards;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn infgram(args: &[&str]) -> Output {
    infgram_command(args).output().expect("run infgram")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn err(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "should fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!e.contains("panicked"), "panic instead of an error: {e}");
    let causes: Vec<&str> = e.trim().split(": ").collect();
    assert!(
        !causes.windows(2).any(|w| w[0] == w[1]),
        "a cause said twice: {e}"
    );
    e
}

/// A corpus of .txt, .jsonl and .jsonl.gz files; returns (dir, index dir).
fn build(tmp: &Path) -> PathBuf {
    let corpus = tmp.join("corpus");
    std::fs::create_dir_all(corpus.join("sub")).unwrap();
    std::fs::write(corpus.join("a.txt"), "the cat sat on the mat").unwrap();
    std::fs::write(corpus.join("sub/b.txt"), "the dog sat on the log").unwrap();
    std::fs::write(
        corpus.join("c.jsonl"),
        "{\"text\": \"the cat ate\", \"id\": 7}\n",
    )
    .unwrap();
    let gz = std::fs::File::create(corpus.join("d.jsonl.gz")).unwrap();
    let mut enc = flate2::write::GzEncoder::new(gz, flate2::Compression::default());
    enc.write_all(b"{\"text\": \"a cat\", \"source\": \"gz\"}\n")
        .unwrap();
    enc.finish().unwrap();
    let index = tmp.join("idx");
    ok(&infgram(&[
        "index",
        "-o",
        index.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]));
    index
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(ok(out).trim()).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Writes a tiny word-level `tokenizer.json` into `dir` (a tokenizer other than `bytes`).
fn word_level_tokenizer(dir: &Path) -> PathBuf {
    let tj = dir.join("tokenizer.json");
    std::fs::write(
        &tj,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"the":1,"cat":2},"unk_token":"[UNK]"}}"#,
    )
    .unwrap();
    tj
}

/// Every path under `dir` with its contents (files only), for before/after comparisons.
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                files.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    files
}

/// `infgram ARGS` with standard error `stderr`; its output.
fn infgram_with_stderr(args: &[&str], stderr: Stdio) -> Output {
    infgram_command(args)
        .stderr(stderr)
        .output()
        .expect("run infgram")
}

/// A word-level index of Tiny Shakespeare (the in-tree text), for outputs larger than a pipe
/// holds.
fn shakespeare_words(tmp: &Path) -> PathBuf {
    let text = ok(&infgram(&["fetch", "tiny-shakespeare"]));
    let index = tmp.join("words");
    ok(&infgram(&[
        "index",
        "--tokenizer",
        "words",
        "-o",
        index.to_str().unwrap(),
        text.trim(),
    ]));
    index
}

/// `export-arpa` of the bigram model of index `words` to `out`.
fn export_arpa<'a>(words: &'a str, out: &'a str) -> [&'a str; 8] {
    [
        "export-arpa",
        "--index",
        words,
        "--order",
        "2",
        "--discount-fallback",
        "-o",
        out,
    ]
}

mod bad_input;
mod builds;
mod generation;
mod queries;
