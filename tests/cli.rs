//! The command-line contract, across processes: an index written by `infgram index` is read by
//! `infgram query`; damaged indexes, wrong tokenizers and bad input give clear errors; a failed
//! build leaves nothing behind.

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

#[test]
fn index_then_query_in_other_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let v = json(&infgram(&[
        "query", idx, "count", "--text", "cat", "--json",
    ]));
    assert_eq!(v["count"], 3);
    let v = json(&infgram(&["query", idx, "count", "--text", "", "--json"]));
    // Every position, one separator per document included (infini-gram's count([])).
    assert_eq!(v["count"], 22 + 22 + 11 + 5 + 4);
    let v = json(&infgram(&[
        "query",
        idx,
        "prob",
        "--text",
        "the ca",
        "--cont-text",
        "t",
        "--json",
    ]));
    assert_eq!(
        (v["prompt_cnt"].as_u64(), v["cont_cnt"].as_u64()),
        (Some(2), Some(2))
    );
    let v = json(&infgram(&[
        "query",
        idx,
        "ntd",
        "--text",
        "sat on the ",
        "--json",
    ]));
    assert_eq!(v["prompt_cnt"], 2);
    assert_eq!(
        v["result_by_token_id"][(b'm' as u32).to_string()]["cont_cnt"],
        1
    );
    let v = json(&infgram(&[
        "query",
        idx,
        "infgram_ntd",
        "--text",
        "xyz the d",
        "--json",
    ]));
    assert_eq!(v["suffix_len"], 5);
    let v = json(&infgram(&["query", idx, "find", "--text", "at", "--json"]));
    assert_eq!(v["cnt"], 7); // cat ×3, sat ×2, mat, ate
    let v = json(&infgram(&[
        "query",
        idx,
        "search_docs",
        "--cnf",
        "cat AND sat",
        "--json",
    ]));
    assert_eq!(v["documents"].as_array().unwrap().len(), 1);
    assert!(v["documents"][0]["metadata"]
        .as_str()
        .unwrap()
        .contains("a.txt"));
    // Metadata of jsonl documents keeps the other fields.
    let v = json(&infgram(&[
        "query",
        idx,
        "search_docs",
        "--cnf",
        "a cat",
        "--json",
    ]));
    assert!(v["documents"][0]["metadata"]
        .as_str()
        .unwrap()
        .contains("gz"));
    // A file given itself is named by its file name, never by an absolute path of this
    // machine (a server shows metadata to its clients: issue 32, item 15).
    let single = tmp.path().join("single");
    let a = tmp.path().join("corpus").join("a.txt");
    ok(&infgram(&[
        "index",
        "-o",
        single.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    let v = json(&infgram(&[
        "query",
        single.to_str().unwrap(),
        "get_doc_by_rank",
        "--rank",
        "0",
        "--json",
    ]));
    assert_eq!(v["metadata"], "{\"path\":\"a.txt\"}", "{v}");
    // A readable table without --json.
    let table = ok(&infgram(&["query", idx, "ntd", "--text", "the "]));
    assert!(table.contains("\"c\"") && table.contains("prompt_cnt"));
    // Batch: one result per line, a bad line gets an error object and the batch goes on.
    let batch = tmp.path().join("q.jsonl");
    std::fs::write(
        &batch,
        "{\"query_type\": \"count\", \"input_ids\": [116, 104, 101]}\n\
         not json\n\
         {\"query_type\": \"prob\", \"prompt_ids\": [116, 104], \"cont_id\": 101}\n\
         {\"query_type\": \"count\", \"input_ids\": [999]}\n\
         {\"query_type\": \"infgram_ntd\", \"text\": \"the c\"}\n",
    )
    .unwrap();
    let out = ok(&infgram(&[
        "query",
        idx,
        "--batch",
        batch.to_str().unwrap(),
    ]));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0]["count"], 5);
    assert!(lines[1]["error"].is_string());
    assert_eq!(lines[2]["prob"], 1.0);
    assert!(lines[3]["error"].as_str().unwrap().contains("vocabulary"));
    assert_eq!(lines[4]["suffix_len"], 5);
    // Stdin works too.
    let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["query", idx, "--batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"query_type\": \"count\", \"text\": \"sat\"}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "{\"approx\":false,\"count\":2}"
    );
    ok(&infgram(&["verify", idx]));
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

#[test]
fn damaged_indexes_are_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let good = build(tmp.path());
    let case = |name: &str, damage: &dyn Fn(&Path), expect: &str| {
        let dir = tmp.path().join(name);
        copy_dir(&good, &dir);
        damage(&dir);
        let e = err(&infgram(&[
            "query",
            dir.to_str().unwrap(),
            "count",
            "--text",
            "cat",
        ]));
        assert!(e.contains(expect), "{name}: {e}");
    };
    let shard = |d: &Path| d.join("shard-0000");
    case(
        "truncated",
        &|d| {
            let f = shard(d).join("sa.bin");
            let len = std::fs::metadata(&f).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap()
                .set_len(len - 3)
                .unwrap();
        },
        "sa.bin",
    );
    case(
        "flipped",
        &|d| {
            let f = shard(d).join("docs.bin");
            let mut b = std::fs::read(&f).unwrap();
            b[9] ^= 0x40;
            std::fs::write(&f, b).unwrap();
        },
        "checksum",
    );
    case(
        "version",
        &|d| {
            let f = d.join("index.json");
            let s = std::fs::read_to_string(&f)
                .unwrap()
                .replace("\"format_version\": 1", "\"format_version\": 99");
            std::fs::write(&f, s).unwrap();
        },
        "version 99",
    );
    case(
        "header",
        &|d| {
            let f = d.join("index.json");
            let s = std::fs::read_to_string(&f).unwrap().replacen(
                "\"documents\": 4",
                "\"documents\": 5",
                1,
            );
            std::fs::write(&f, s).unwrap();
        },
        "checksum",
    );
    case(
        "missing-shard",
        &|d| std::fs::remove_dir_all(shard(d)).unwrap(),
        "shard-0000",
    );
    case(
        "missing-header",
        &|d| std::fs::remove_file(d.join("index.json")).unwrap(),
        "index.json",
    );
    // verify catches damage to a large file that opening does not read.
    let e = err(&infgram(&[
        "query",
        tmp.path().join("nope").to_str().unwrap(),
        "count",
        "--text",
        "x",
    ]));
    assert!(e.contains("infgram index"), "{e}");
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

#[test]
fn wrong_tokenizer_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    // A tiny word-level tokenizer.json: a different tokenizer from `bytes`.
    let tj = word_level_tokenizer(tmp.path());
    let e = err(&infgram(&[
        "query",
        index.to_str().unwrap(),
        "count",
        "--text",
        "cat",
        "--tokenizer",
        tj.to_str().unwrap(),
    ]));
    assert!(e.contains("tokenizer") && e.contains("rebuild"), "{e}");
    // ... while an index built with it answers with it.
    let corpus = tmp.path().join("w.txt");
    std::fs::write(&corpus, "the cat the cat the").unwrap();
    let widx = tmp.path().join("widx");
    ok(&infgram(&[
        "index",
        "-o",
        widx.to_str().unwrap(),
        "--tokenizer",
        tj.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]));
    let v = json(&infgram(&[
        "query",
        widx.to_str().unwrap(),
        "count",
        "--text",
        "the cat",
        "--json",
    ]));
    assert_eq!(v["count"], 2);
}

#[test]
fn failed_builds_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"fine\"}\n{\"no_text\": 1}\n").unwrap();
    let out = tmp.path().join("idx");
    let e = err(&infgram(&[
        "index",
        "-o",
        out.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]));
    assert!(e.contains("bad.jsonl:2") && e.contains("text"), "{e}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "only the input remains: {left:?}");
    // An existing index is not overwritten without --force.
    let good = tmp.path().join("good.txt");
    std::fs::write(&good, "hello").unwrap();
    ok(&infgram(&[
        "index",
        "-o",
        out.to_str().unwrap(),
        good.to_str().unwrap(),
    ]));
    let e = err(&infgram(&[
        "index",
        "-o",
        out.to_str().unwrap(),
        good.to_str().unwrap(),
    ]));
    assert!(e.contains("--force"), "{e}");
    let e = err(&infgram(&[
        "index",
        "-o",
        tmp.path().join("x").to_str().unwrap(),
        "/nonexistent/file.txt",
    ]));
    assert!(e.contains("no such file"), "{e}");
}

#[test]
fn gen_and_ppl_on_a_small_corpus() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("c.txt");
    std::fs::write(
        &corpus,
        "ROMEO: But soft, what light through yonder window breaks?\n".repeat(3),
    )
    .unwrap();
    let c = corpus.to_str().unwrap();
    let seeded = || {
        json(&infgram(&[
            "gen",
            "--corpus",
            c,
            "--prompt",
            "ROMEO:",
            "--seed",
            "3",
            "--max-tokens",
            "40",
            "--json",
        ]))
    };
    let (a, b) = (seeded(), seeded());
    assert_eq!(a["text"], b["text"]);
    assert!(a["tokens"].as_u64().unwrap() > 0 && a["tokens_per_second"].as_f64().unwrap() > 0.0);
    // A prompt of unseen characters and an empty prompt still generate.
    ok(&infgram(&[
        "gen",
        "--corpus",
        c,
        "--prompt",
        "ζζ",
        "--max-tokens",
        "10",
    ]));
    ok(&infgram(&["gen", "--corpus", c, "--max-tokens", "10"]));
    let e = err(&infgram(&[
        "gen",
        "--index",
        tmp.path().join("none").to_str().unwrap(),
        "--prompt",
        "x",
    ]));
    assert!(e.contains("no index"), "{e}");
    let v = json(&infgram(&[
        "ppl",
        "--corpus",
        c,
        "--text",
        c,
        "--estimator",
        "sbis",
        "--k",
        "2",
        "--floor",
        "1e-10",
        "--json",
    ]));
    assert!(
        v["ppl"].as_f64().unwrap() >= 1.0
            && v["bits_per_token"].is_number()
            && v["seconds"].is_number()
    );
    let png = tmp.path().join("agreement.png");
    let plot = infgram(&[
        "ppl",
        "--corpus",
        c,
        "--text",
        c,
        "--floor",
        "1e-10",
        "--plot",
        png.to_str().unwrap(),
    ]);
    if cfg!(feature = "plot") {
        ok(&plot);
        assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
    } else {
        // A build without plotters says so, and writes nothing.
        assert!(err(&plot).contains("`plot` feature"));
        assert!(!png.exists());
    }
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let e = err(&infgram(&[
        "gen",
        "--corpus",
        empty.to_str().unwrap(),
        "--prompt",
        "x",
    ]));
    assert!(e.contains("empty"), "{e}");
}

#[test]
fn sharded_mmap_index_agrees_with_in_memory_index() {
    use infgram::tokenizer::{ByteTokenizer, Tokenizer};
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    // ~240k bytes in 12 files: a tiny --mem budget forces several shards (≥ 64k tokens each).
    let mut docs = Vec::new();
    let mut x: u64 = 12345;
    for f in 0..12 {
        let text: String = (0..20_000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ["the ", "cat ", "sat ", "on ", "a ", "mat\n"][(x >> 33) as usize % 6]
            })
            .collect::<String>()[..20_000]
            .to_string();
        std::fs::write(corpus.join(format!("{f:02}.txt")), &text).unwrap();
        docs.push(ByteTokenizer.encode(&text).unwrap());
    }
    let dir = tmp.path().join("idx");
    ok(&infgram(&[
        "index",
        "-o",
        dir.to_str().unwrap(),
        "--mem",
        "0.000001",
        corpus.to_str().unwrap(),
    ]));
    let mapped = infgram::Index::open(&dir).unwrap();
    assert!(
        mapped.shards().len() >= 3,
        "{} shards",
        mapped.shards().len()
    );
    let memory = infgram::Index::from_docs(ByteTokenizer.spec(), &docs, docs.len(), true).unwrap();
    let text = std::fs::read_to_string(corpus.join("03.txt")).unwrap();
    for start in (0..19_000).step_by(997) {
        for len in [1usize, 3, 8, 30, 120] {
            let q = ByteTokenizer.encode(&text[start..start + len]).unwrap();
            assert_eq!(mapped.count(&q).unwrap(), memory.count(&q).unwrap());
            assert_eq!(
                mapped.ntd(&q, Some(0)).unwrap(),
                memory.ntd(&q, Some(0)).unwrap()
            );
            assert_eq!(
                mapped.infgram_ntd(&q, Some(0)).unwrap(),
                memory.infgram_ntd(&q, Some(0)).unwrap()
            );
            assert_eq!(
                mapped.longest_match(&q).unwrap(),
                memory.longest_match(&q).unwrap()
            );
        }
    }
}

#[test]
fn copy_guard_attribution_and_creativity_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("c.txt");
    std::fs::write(
        &corpus,
        "ROMEO: But soft, what light through yonder window breaks? It is the east.\n".repeat(3),
    )
    .unwrap();
    let idx = tmp.path().join("idx");
    ok(&infgram(&[
        "index",
        "-o",
        idx.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]));
    let i = idx.to_str().unwrap();
    let gen = |extra: &[&str]| {
        let mut args = vec![
            "gen",
            "--index",
            i,
            "--prompt",
            "ROMEO: But",
            "--seed",
            "1",
            "--max-tokens",
            "60",
            "--json",
        ];
        args.extend_from_slice(extra);
        json(&infgram(&args))
    };
    // Unguarded SBIS copies the corpus; the guard holds it to 6 bytes.
    let free = gen(&[]);
    assert!(free["max_copied_span"].as_u64().unwrap() > 6, "{free}");
    let guarded = gen(&["--guard", "6"]);
    assert!(
        guarded["max_copied_span"].as_u64().unwrap() <= 6,
        "{guarded}"
    );
    assert!(guarded["guard_blocked"].as_u64().unwrap() > 0, "{guarded}");
    assert!(guarded["guard_seconds"].is_number());
    let e = err(&infgram(&["gen", "--index", i, "--guard", "0"]));
    assert!(e.contains("at least 1"), "{e}");
    // A guard index of another tokenizer is refused.
    let tj = word_level_tokenizer(tmp.path());
    let widx = tmp.path().join("widx");
    ok(&infgram(&[
        "index",
        "-o",
        widx.to_str().unwrap(),
        "--tokenizer",
        tj.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]));
    let e = err(&infgram(&[
        "gen",
        "--index",
        i,
        "--guard",
        "4",
        "--guard-index",
        widx.to_str().unwrap(),
    ]));
    assert!(e.contains("another tokenizer"), "{e}");

    // Attribution: the quoted line is one span, found three times, in its document.
    let text = tmp.path().join("t.txt");
    std::fs::write(
        &text,
        "He said: what light through yonder window breaks? Nothing.",
    )
    .unwrap();
    let t = text.to_str().unwrap();
    let html = tmp.path().join("a.html");
    let v = json(&infgram(&[
        "attribute",
        "--index",
        i,
        "--text",
        t,
        "--min-len",
        "12",
        "--json",
        "--html",
        html.to_str().unwrap(),
    ]));
    let spans = v["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 1, "{v}");
    assert_eq!(
        spans[0]["text"],
        " what light through yonder window breaks? "
    );
    assert_eq!(spans[0]["count"], 3);
    assert_eq!(spans[0]["docs"].as_array().unwrap().len(), 1);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<mark") && page.contains("yonder"));
    let plain = ok(&infgram(&[
        "attribute",
        "--index",
        i,
        "--text",
        t,
        "--min-len",
        "12",
    ]));
    assert!(
        plain.contains("[[ what light through yonder window breaks? ]]"),
        "{plain}"
    );
    // Creativity: uniqueness never grows as n shrinks; the index sums it.
    let v = json(&infgram(&[
        "creativity",
        "--index",
        i,
        "--text",
        t,
        "--min-n",
        "5",
        "--max-n",
        "12",
        "--json",
    ]));
    let u: Vec<f64> = v["uniqueness"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_f64().unwrap())
        .collect();
    assert_eq!(u.len(), 8);
    assert!(u.windows(2).all(|w| w[0] <= w[1]), "{u:?}");
    let sum: f64 = u.iter().sum();
    assert!((v["creativity_index"].as_f64().unwrap() - sum).abs() < 1e-9);
    let e = err(&infgram(&[
        "creativity",
        "--index",
        i,
        "--text",
        t,
        "--min-n",
        "9",
        "--max-n",
        "3",
    ]));
    assert!(e.contains("min n"), "{e}");
    // The batch protocol serves both.
    let batch = tmp.path().join("q.jsonl");
    std::fs::write(
        &batch,
        "{\"query_type\": \"attribute\", \"text\": \"what light through yonder\", \"min_len\": 10}\n\
         {\"query_type\": \"creativity\", \"text\": \"what light\"}\n",
    )
    .unwrap();
    let out = ok(&infgram(&["query", i, "--batch", batch.to_str().unwrap()]));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["spans"][0]["length"], 25, "{}", lines[0]);
    assert!(lines[1]["creativity_index"].is_number(), "{}", lines[1]);
}

/// Reliability: numeric options are checked at parse time, a CNF past the limits or with
/// `max_clause_freq` 0 gets an error object and the batch goes on, every input line of a batch
/// gets an output line (blank and non-UTF-8 ones an error), huge `max_diff_tokens` does not
/// overflow, and a write error other than a closed pipe is an error.
#[test]
fn bad_numbers_bad_lines_and_write_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let corpus = tmp.path().join("corpus").join("a.txt");
    let c = corpus.to_str().unwrap();
    for (args, what) in [
        (vec!["gen", "--index", idx, "--decay", "NaN"], "--decay"),
        (vec!["gen", "--index", idx, "--decay", "inf"], "--decay"),
        (
            vec!["ppl", "--index", idx, "--decay", "NaN", "--text", c],
            "--decay",
        ),
        (
            vec!["gen", "--index", idx, "--temperature", "NaN"],
            "--temperature",
        ),
        (vec!["gen", "--index", idx, "--top-p", "0"], "--top-p"),
        (vec!["gen", "--index", idx, "--k", "-5"], "--k"),
        (vec!["gen", "--index", idx, "--context", "0"], "--context"),
        (
            vec!["gen", "--index", idx, "--max-tokens", "1000000000"],
            "--max-tokens",
        ),
        (
            vec!["gen", "--index", idx, "--repetition-penalty", "0"],
            "--repetition-penalty",
        ),
        (
            vec!["ppl", "--index", idx, "--text", c, "--floor", "0"],
            "--floor",
        ),
        (
            vec!["ppl", "--index", idx, "--text", c, "--floor", "inf"],
            "--floor",
        ),
        (
            vec![
                "ppl",
                "--index",
                idx,
                "--text",
                c,
                "--estimator",
                "smoothed",
                "--discounts",
                "NaN,1,1",
            ],
            "--discounts",
        ),
        (
            vec!["query", idx, "count", "--text", "a", "--ids", "1"],
            "cannot be used with",
        ),
        (
            vec!["ppl", "--index", idx, "--text", "/nonexistent/val.txt"],
            "/nonexistent/val.txt: No such file",
        ),
        (
            vec!["ppl", "--index", idx, "--text", c, c],
            "the ∞-gram alone scores one text",
        ),
        (
            vec!["ppl", "--index", idx, "--text", c, "--max-overlap", "0.8"],
            "--model",
        ),
        (
            vec!["query", idx, "--batch", tmp.path().to_str().unwrap()],
            "reading ",
        ),
        (vec!["index", "-o", "x", "--mem", "0", c], "--mem"),
        (vec!["index", "-o", "x", "--mem=-1", c], "--mem"),
    ] {
        let e = err(&infgram(&args));
        assert!(e.contains(what), "{args:?}: {e}");
    }
    let batch = tmp.path().join("q.jsonl");
    let mut lines: Vec<u8> = Vec::new();
    lines.extend_from_slice(
        b"{\"query_type\": \"search_docs\", \"cnf\": [[[116]]], \"max_clause_freq\": 0}\n",
    );
    lines.extend_from_slice(b"\n");
    lines.extend_from_slice(b"{\"query_type\": \"count\", \"text\": \"\xff\xfe\"}\n");
    lines.extend_from_slice(b"\xff\xfe not utf-8\n");
    lines.extend_from_slice(
        b"{\"query_type\": \"search_docs\", \"cnf\": [[[1]],[[2]],[[3]],[[4]],[[5]]]}\n",
    );
    lines.extend_from_slice(
        b"{\"query_type\": \"search_docs\", \"text\": \"cat\", \"max_diff_tokens\": 18446744073709551615}\n",
    );
    lines.extend_from_slice(b"{\"query_type\": \"count\", \"text\": \"sat\"}\n");
    std::fs::write(&batch, lines).unwrap();
    let out = ok(&infgram(&[
        "query",
        idx,
        "--batch",
        batch.to_str().unwrap(),
    ]));
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v.len(), 7, "{out}");
    assert!(v[0]["error"].as_str().unwrap().contains("max_clause_freq"));
    assert!(v[1]["error"].as_str().unwrap().contains("line 2"));
    assert!(v[2]["error"].is_string());
    assert!(v[3]["error"].as_str().unwrap().contains("UTF-8"));
    assert!(v[4]["error"]
        .as_str()
        .unwrap()
        .contains("at most 4 clauses"));
    assert_eq!(v[5]["cnt"], 3, "{}", v[5]);
    assert_eq!(v[6]["count"], 2);
    // A full disk is an error, not a quiet success.
    if std::path::Path::new("/dev/full").exists() {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(["query", idx, "--batch", batch.to_str().unwrap()])
            .stdout(full)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("space") && !e.contains("panicked"), "{e}");
    }
}

/// Every subcommand's output: a closed pipe (`| head`) ends it quietly with success, a full disk
/// is an error — never a panic.
#[test]
fn closed_pipes_and_full_disks() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let corpus = tmp.path().join("corpus").join("a.txt");
    let c = corpus.to_str().unwrap();
    let commands: [Vec<&str>; 5] = [
        vec!["verify", idx],
        vec!["ppl", "--index", idx, "--text", c, "--floor", "1e-10"],
        vec!["fetch", "tiny-shakespeare"],
        vec!["--help"],
        vec!["--version"],
    ];
    for args in &commands {
        let mut child = infgram_command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before anything is written
        let out = child.wait_with_output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !e.contains("panicked"),
            "{args:?}: {e}"
        );
        if std::path::Path::new("/dev/full").exists() {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            let out = infgram_command(args).stdout(full).output().unwrap();
            let e = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && e.contains("space") && !e.contains("panicked"),
                "{args:?}: {e}"
            );
        }
    }
}

/// `--force` never destroys what is not an index, never an input, and swaps a rebuilt index in
/// whole: queries running during rebuilds see the old index or the new one, never a hole.
#[test]
fn force_replaces_only_indexes_and_readers_never_see_a_hole() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let corpus = tmp.path().join("corpus");
    let c = corpus.to_str().unwrap();
    // A directory of the user's files, and the input itself, are refused.
    let e = err(&infgram(&["index", "-o", c, "--force", c]));
    assert!(e.contains("not an infgram index"), "{e}");
    assert!(corpus.join("a.txt").exists());
    // Rebuild four times while another thread queries (bounded in count).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let idx = idx.to_string();
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            for _ in 0..400 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let out = infgram(&["query", &idx, "count", "--text", "cat", "--json"]);
                if !out.status.success() {
                    failures.push(String::from_utf8_lossy(&out.stderr).into_owned());
                }
            }
            failures
        })
    };
    for _ in 0..4 {
        ok(&infgram(&["index", "-o", idx, "--force", c]));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failures = reader.join().unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-") || n.contains(".old-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Inputs that are neither files nor directories are named for what they are (issue 32, item
/// 13): a FIFO or a device, a loop of symbolic links, a missing path.
#[cfg(unix)]
#[test]
fn inputs_that_are_not_files_are_named_for_what_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path in our temporary directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let a = tmp.path().join("loop-a");
    let b = tmp.path().join("loop-b");
    std::os::unix::fs::symlink(&a, &b).unwrap();
    std::os::unix::fs::symlink(&b, &a).unwrap();
    let out = tmp.path().join("idx");
    for (input, says) in [
        (fifo.to_str().unwrap(), "FIFO, device or socket"),
        ("/dev/null", "FIFO, device or socket"),
        (a.to_str().unwrap(), "loop of symbolic links"),
        (tmp.path().join("nothing").to_str().unwrap(), "no such file"),
    ] {
        let e = err(&infgram(&["index", "-o", out.to_str().unwrap(), input]));
        assert!(e.contains(says), "{input}: {e}");
        assert!(!out.exists());
    }
}

/// A damaged index in the `gen --corpus` cache is rebuilt, with a note, instead of an error
/// that asks the user to rebuild a cache path (issue 32, item 14).
#[test]
fn a_damaged_cached_index_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "the cat sat on the mat. ".repeat(20)).unwrap();
    let gen = || {
        Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(["gen", "--corpus", corpus.to_str().unwrap()])
            .args([
                "--prompt",
                "the",
                "--seed",
                "1",
                "--max-tokens",
                "20",
                "--json",
            ])
            .env("INFGRAM_CACHE", &cache)
            .output()
            .unwrap()
    };
    let first = json(&gen());
    let indexes: Vec<PathBuf> = std::fs::read_dir(cache.join("indexes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(indexes.len(), 1, "{indexes:?}");
    let tokens = indexes[0].join("shard-0000/tokens.bin");
    let mut bytes = std::fs::read(&tokens).unwrap();
    bytes[3] ^= 0x20;
    std::fs::write(&tokens, bytes).unwrap();
    let out = gen();
    let note = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(note.contains("rebuilding"), "{note}");
    assert_eq!(json(&out)["text"], first["text"]);
    // The header gone (a build cut short long ago): rebuilt as well.
    std::fs::remove_file(indexes[0].join("index.json")).unwrap();
    assert_eq!(json(&gen())["text"], first["text"]);
}

/// Two ways of saying one thing are refused, not one of them silently ignored (issue 32, item
/// 12): a continuation by id and by text, query flags beside `--batch`, a batch line with both
/// text and ids, a creativity span length past its bound (item 5).
#[test]
fn conflicting_options_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let e = err(&infgram(&[
        "query",
        idx,
        "prob",
        "--text",
        "the",
        "--cont-id",
        "65",
        "--cont-text",
        "O",
    ]));
    assert!(e.contains("cannot be used with"), "{e}");
    let batch = tmp.path().join("batch.jsonl");
    std::fs::write(
        &batch,
        "{\"query_type\": \"count\", \"text\": \"cat\", \"input_ids\": [1]}\n",
    )
    .unwrap();
    let b = batch.to_str().unwrap();
    let e = err(&infgram(&[
        "query", idx, "count", "--text", "x", "--batch", b,
    ]));
    assert!(e.contains("cannot be used with"), "{e}");
    let out = ok(&infgram(&["query", idx, "--batch", b]));
    assert!(out.contains("one way"), "{out}");
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, "the cat sat").unwrap();
    let t = text.to_str().unwrap();
    for max_n in ["18446744073709551615", "4294967296", "100000000"] {
        let e = err(&infgram(&[
            "creativity",
            "--index",
            idx,
            "--text",
            t,
            "--max-n",
            max_n,
        ]));
        assert!(e.contains("max n"), "{max_n}: {e}");
    }
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

/// No build removes a path outside its output and its own temporary directory: not with
/// `--force` onto a directory whose `index.json` is not infgram's (also as `-o "$PWD"`), not a
/// user's `OUT.old-2023` beside the output (not even when it is the build's input), and not a
/// look-alike of a build's temporary after a build was killed with SIGKILL (issue 32, items 1–2).
#[test]
fn builds_never_remove_a_users_files() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let text = "the cat sat on the mat and the dog sat on the log";
    // 1. `--force -o u` where u holds a user's notes and a foreign index.json.
    let u = root.join("u");
    std::fs::create_dir(&u).unwrap();
    std::fs::write(u.join("notes.txt"), "precious").unwrap();
    std::fs::write(u.join("index.json"), "{}").unwrap();
    let a = root.join("a.txt");
    std::fs::write(&a, text).unwrap();
    // `index --force -o OUT a.txt`, which must fail: its error.
    let force = |out: &Path| {
        err(&infgram(&[
            "index",
            "--force",
            "-o",
            out.to_str().unwrap(),
            a.to_str().unwrap(),
        ]))
    };
    let before = snapshot(&root);
    let e = force(&u);
    assert!(e.contains("not an infgram index"), "{e}");
    // The same with the working directory as the output.
    let out = Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["index", "--force", "-o", u.to_str().unwrap(), "../a.txt"])
        .current_dir(&u)
        .output()
        .unwrap();
    assert!(err(&out).contains("not an infgram index"));
    assert_eq!(snapshot(&root), before, "a failed --force changed files");
    // Issue 56, 7: `--force -o LINK`, LINK a link to an index, replaced the link by a new
    // directory and left the index stale. Refused; both left as they were.
    let linked = root.join("linked");
    ok(&infgram(&[
        "index",
        "-o",
        linked.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    std::os::unix::fs::symlink(&linked, root.join("link")).unwrap();
    let before = snapshot(&root);
    let e = force(&root.join("link"));
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(snapshot(&root), before, "--force onto a link changed files");
    // A real index holding a user's file is not replaced either.
    let idx = root.join("idx");
    ok(&infgram(&[
        "index",
        "-o",
        idx.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    std::fs::write(idx.join("my-notes.txt"), "mine").unwrap();
    let e = err(&infgram(&[
        "index",
        "--force",
        "-o",
        idx.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    assert!(e.contains("my-notes.txt"), "{e}");
    assert!(idx.join("my-notes.txt").exists());
    std::fs::remove_file(idx.join("my-notes.txt")).unwrap();

    // 2. A user's `data.old-2023` beside `-o data`, given as the input, and a directory named
    // like a dead build's temporary: both survive, and so do they after a killed build.
    let s = root.join("s");
    std::fs::create_dir_all(s.join("data.old-2023")).unwrap();
    std::fs::write(s.join("data.old-2023/tiny.txt"), text).unwrap();
    std::fs::create_dir_all(s.join("data.tmp-4294967")).unwrap();
    std::fs::write(s.join("data.tmp-4294967/draft.txt"), "draft").unwrap();
    let users = snapshot(&s);
    let data = s.join("data");
    let input = s.join("data.old-2023");
    ok(&infgram(&[
        "index",
        "-o",
        data.to_str().unwrap(),
        input.to_str().unwrap(),
    ]));
    ok(&infgram(&[
        "index",
        "--force",
        "-o",
        data.to_str().unwrap(),
        input.to_str().unwrap(),
    ]));
    let after = snapshot(&s);
    for (path, bytes) in &users {
        assert_eq!(after.get(path), Some(bytes), "{} changed", path.display());
    }
    // The other commands that write (an HTML page, the cache's corpus and index, a fetched
    // text) write their own files and remove nothing of the user's.
    let cache = root.join("cache");
    let before = snapshot(&s);
    let page = s.join("page.html");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(args)
            .env("INFGRAM_CACHE", &cache)
            .env("INFGRAM_MODELS", infgram::assets::models_dir())
            .output()
            .unwrap();
        ok(&out);
    };
    let tiny = s.join("data.old-2023/tiny.txt");
    let (d, t) = (data.to_str().unwrap(), tiny.to_str().unwrap());
    run(&[
        "attribute",
        "--index",
        d,
        "--text",
        t,
        "--html",
        page.to_str().unwrap(),
    ]);
    run(&["gen", "--corpus", t, "--prompt", "the", "--max-tokens", "5"]);
    run(&["fetch", "tiny-shakespeare"]);
    let after = snapshot(&s);
    for (path, bytes) in &before {
        assert_eq!(after.get(path), Some(bytes), "{} changed", path.display());
    }
    assert!(page.exists());
    // A build killed outright leaves its marked temporary; the next build removes exactly that.
    #[cfg(unix)]
    {
        let big = root.join("big.txt");
        std::fs::write(&big, text.repeat(200_000)).unwrap();
        let data2 = s.join("data2");
        let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args([
                "index",
                "-o",
                data2.to_str().unwrap(),
                big.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let left = s.join(format!("data2.tmp-{}", child.id()));
        for _ in 0..2000 {
            if left.join(".infgram-build.json").exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        if !data2.exists() {
            assert!(left.exists(), "the killed build left no temporary");
            ok(&infgram(&[
                "index",
                "-o",
                data2.to_str().unwrap(),
                a.to_str().unwrap(),
            ]));
            assert!(!left.exists(), "a dead build's temporary was kept");
        }
        let after = snapshot(&s);
        for (path, bytes) in &users {
            assert_eq!(after.get(path), Some(bytes), "{} changed", path.display());
        }
    }
}

/// SIGINT or SIGTERM during a build removes its temporary directory, and the process ends with
/// the shell's status for the signal.
#[cfg(unix)]
#[test]
fn interrupted_builds_leave_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    // Enough text that the build is still running when the signal comes (it takes seconds).
    let corpus = tmp.path().join("big.txt");
    let mut x = 1u64;
    let text: Vec<u8> = (0..8_000_000)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            b"abcdefgh ijklmnop\n"[(x >> 59) as usize % 18]
        })
        .collect();
    std::fs::write(&corpus, text).unwrap();
    for (signal, status) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let out = tmp.path().join(format!("idx{signal}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args([
                "index",
                "-o",
                out.to_str().unwrap(),
                corpus.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let tmp_dir = tmp.path().join(format!("idx{signal}.tmp-{}", child.id()));
        let mut started = false;
        for _ in 0..2000 {
            if tmp_dir.exists() {
                started = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(started, "the build did not start");
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let code = child.wait().unwrap().code();
        assert_eq!(code, Some(status), "signal {signal}");
        assert!(!tmp_dir.exists(), "{} left behind", tmp_dir.display());
        assert!(!out.exists());
    }
}

/// Symbolic links in an input directory are followed (loops, links to themselves and broken
/// links are skipped with a warning), and a `.txt` file that is not UTF-8 is indexed with a warning that counts the bytes.
#[cfg(unix)]
#[test]
fn symlinks_are_followed_and_lossy_text_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("linked.txt"), "zebra crossing").unwrap();
    let corpus = tmp.path().join("corpus");
    std::fs::create_dir_all(corpus.join("sub")).unwrap();
    std::fs::write(corpus.join("plain.txt"), "plain text").unwrap();
    std::fs::write(corpus.join("binary.txt"), b"ok \xff\xfe\x80 ok").unwrap();
    std::os::unix::fs::symlink(outside.join("linked.txt"), corpus.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&corpus, corpus.join("sub/loop")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), corpus.join("broken.txt")).unwrap();
    std::os::unix::fs::symlink(corpus.join("self.txt"), corpus.join("self.txt")).unwrap();
    let idx = tmp.path().join("idx");
    let out = infgram(&[
        "index",
        "-o",
        idx.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]);
    ok(&out);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("binary.txt: 3 bytes are not UTF-8"), "{e}");
    assert!(e.contains("skipping") && e.contains("loop"), "{e}");
    assert!(e.contains("broken.txt"), "{e}");
    assert!(e.contains("skipping") && e.contains("self.txt"), "{e}");
    let count = json(&infgram(&[
        "query",
        idx.to_str().unwrap(),
        "count",
        "--text",
        "zebra",
        "--json",
    ]));
    assert_eq!(count["count"], 1, "the linked file is indexed once");
}

/// A header whose shard directory points out of the index is refused as corrupt, not followed,
/// even with a valid checksum.
#[test]
fn a_shard_directory_outside_the_index_is_refused() {
    use infgram::index::format::Header;
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    // A copy of the shard outside the index, where a rewritten header could send the reader.
    copy_dir(&index.join("shard-0000"), &tmp.path().join("elsewhere"));
    let original = std::fs::read(index.join("index.json")).unwrap();
    for bad in ["../elsewhere", "/etc", "", "./shard-0000/.."] {
        let mut header = Header::read(&index).unwrap();
        header.shards[0].dir = bad.to_string();
        header.seal();
        header.write(&index).unwrap();
        let e = err(&infgram(&[
            "query",
            index.to_str().unwrap(),
            "count",
            "--text",
            "cat",
        ]));
        assert!(e.contains("not a name inside the index"), "{bad:?}: {e}");
    }
    std::fs::write(index.join("index.json"), &original).unwrap();
    ok(&infgram(&[
        "query",
        index.to_str().unwrap(),
        "count",
        "--text",
        "cat",
    ]));
}

/// Options that do not apply to the request are refused with both named, never accepted and
/// ignored; orders past the bound, a link loop and a huge temperature give one clear line
/// (issue 45, items 5 and 11, and the small ones).
#[test]
fn options_that_do_not_apply_and_numbers_past_their_bounds_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, "the cat sat").unwrap();
    let t = text.to_str().unwrap();
    let gen = [
        "gen",
        "--index",
        idx,
        "--prompt",
        "the",
        "--max-tokens",
        "3",
    ];
    for (more, named) in [
        (&["--estimator", "smoothed", "--order", "3"][..], "--order"),
        (&["--estimator", "sbis", "--alpha", "0.1"], "--alpha"),
        (&["--estimator", "mkn", "--k", "2"], "--k"),
        (&["--estimator", "mkn", "--decay", "0.5"], "--decay"),
    ] {
        let e = err(&infgram(&[&gen[..], more].concat()));
        assert!(
            e.contains(named) && e.contains("--estimator"),
            "{more:?}: {e}"
        );
    }
    let ppl = ["ppl", "--index", idx, "--text", t];
    for (more, named) in [
        (
            &["--discounts", "0.5,1,1.5", "--estimator", "sbis"][..],
            "--discounts",
        ),
        (
            &["--estimator", "smoothed", "--discount-fallback"],
            "--discount-fallback",
        ),
        (&["--estimator", "mkn", "--plot", "p.png"], "--plot"),
    ] {
        let e = err(&infgram(&[&ppl[..], more].concat()));
        assert!(e.contains(named), "{more:?}: {e}");
    }
    // Issue 56, 5: options that changed nothing were accepted; each is refused, naming the
    // option it needs.
    for (command, more, needs) in [
        (&ppl[..], &["--limit", "5"][..], "--model"),
        (&ppl, &["--window", "8"], "--model"),
        (&ppl, &["--stride", "4"], "--model"),
        (&gen, &["--repetition-penalty", "5"], "--model"),
        (&gen, &["--raw"], "--model"),
        (&gen, &["--draft-max", "1"], "--speculative"),
        (
            &["gen", "--model", "smollm2-135m"],
            &["--draft-max", "4"],
            "--speculative",
        ),
    ] {
        let e = err(&infgram(&[command, more].concat()));
        assert!(e.contains(needs), "{more:?}: {e}");
    }
    // The library refuses what the flags would let through.
    let e = infgram::service::request::GenerateRequest {
        sampling: infgram::service::request::Sampling {
            repetition_penalty: Some(5.0),
            ..Default::default()
        },
        ..Default::default()
    }
    .check(100)
    .unwrap_err()
    .to_string();
    assert!(e.contains("sampling.repetition_penalty"), "{e}");
    let q = |more: &[&str]| err(&infgram(&[&["query", idx][..], more].concat()));
    let e = q(&["count", "--text", "a", "--cont-text", "b"]);
    assert!(e.contains("--cont-text") && e.contains("count"), "{e}");
    let e = q(&["count", "--cnf", "a AND b", "--text", "x"]);
    assert!(e.contains("--cnf") && e.contains("--text"), "{e}");
    let e = q(&["find", "--text", "a", "--maxnum", "3"]);
    assert!(e.contains("--maxnum") && e.contains("find"), "{e}");
    // Orders: one error above the bound, whatever the number; an order past the longest
    // document is the model of that length + 1, not an allocation by the order.
    for order in ["257", "100000000", "18446744073709551615"] {
        let e = err(&infgram(
            &[&ppl[..], &["--estimator", "mkn", "--order", order]].concat(),
        ));
        assert!(
            e.contains("--order") && e.contains("at most 256"),
            "{order}: {e}"
        );
    }
    let out = infgram(
        &[
            &ppl[..],
            &["--estimator", "add-alpha", "--order", "256", "--json"],
        ]
        .concat(),
    );
    let long = json(&out);
    let out = infgram(
        &[
            &ppl[..],
            &["--estimator", "add-alpha", "--order", "64", "--json"],
        ]
        .concat(),
    );
    let short = json(&out);
    assert!(long["ppl"].as_f64().is_some(), "{long}");
    assert_eq!(long["ppl"], short["ppl"], "{long} {short}");
    assert_eq!(long["log10_prob"], short["log10_prob"], "{long} {short}");
    // A link loop is named as one; a huge number is shown short.
    let looped = tmp.path().join("LOOP");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let e = err(&infgram(&[
        "query",
        looped.to_str().unwrap(),
        "count",
        "--text",
        "a",
    ]));
    assert!(e.contains("loop"), "{e}");
    let e = err(&infgram(&[&gen[..], &["--temperature", "1e308"]].concat()));
    assert!(e.contains("1e308") && e.len() < 200, "{e}");
}

/// `--device cuda`: refused with what to do in a build without the `cuda` feature (the tests'
/// build) or on a machine without CUDA, never a crash, with either backend (the fused kernels,
/// the default, or candle's); model options without `--model`, refused rather than ignored.
#[cfg(feature = "neural")]
#[test]
fn device_cuda_without_a_gpu_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let model = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let model = model.to_str().unwrap();
    let gen = ["gen", "--prompt", "The", "--max-tokens", "2"];
    for backend in [&[][..], &["--backend", "native"], &["--backend", "candle"]] {
        let e = err(&infgram(
            &[&gen[..], &["--model", model, "--device", "cuda"], backend].concat(),
        ));
        assert!(
            e.contains("--device cuda")
                && (e.contains("built without the `cuda` feature") || e.contains("library path")),
            "{backend:?}: {e}"
        );
    }
    for (flag, value) in [
        ("--device", "cuda"),
        ("--backend", "candle"),
        ("--threads", "1"),
    ] {
        let e = err(&infgram(
            &[&gen[..], &["--index", idx, flag, value]].concat(),
        ));
        assert!(e.contains(flag) && e.contains("--model"), "{flag}: {e}");
    }
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

/// Issue 56, 3: a diagnostic that cannot be written (standard error full, or a closed pipe)
/// panicked (exit 101, the answer lost). It is dropped; the output and the status stay.
#[test]
fn diagnostics_that_cannot_be_written_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let words = shakespeare_words(tmp.path());
    let w = words.to_str().unwrap();
    let commands: [&[&str]; 3] = [
        &[
            "gen",
            "--index",
            idx,
            "--prompt",
            "the",
            "--max-tokens",
            "20",
            "--seed",
            "3",
            "--stats",
        ],
        &export_arpa(w, "-"),
        &["query", idx, "count", "--text", "the cat", "--json"],
    ];
    for args in commands {
        let normal = infgram(args);
        let want = ok(&normal);
        assert!(!want.is_empty(), "{args:?}");
        if args[0] != "query" {
            assert!(!normal.stderr.is_empty(), "{args:?} writes no diagnostic");
        }
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = infgram_with_stderr(args, Stdio::from(full));
        assert_eq!(out.status.code(), Some(0), "{args:?} with 2>/dev/full");
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{args:?}");
        // A closed pipe: the reader is gone before anything is written.
        let mut child = infgram_command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stderr.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?} with stderr closed");
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{args:?}");
    }
}

/// Issue 56, 9: any broken pipe in an error's causes ended the process with status 0 and no
/// word (as a closed standard output does, `| head`). A FIFO output whose reader goes is an
/// error; standard output's reader going is still not.
#[test]
fn a_broken_pipe_is_success_only_on_standard_output() {
    let tmp = tempfile::tempdir().unwrap();
    let words = shakespeare_words(tmp.path());
    let w = words.to_str().unwrap();
    let fifo = tmp.path().join("arpa.fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    // The reader takes one byte and goes; the model is megabytes.
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut f = std::fs::File::open(&fifo).unwrap();
            let mut byte = [0u8; 1];
            f.read_exact(&mut byte).unwrap();
        })
    };
    let args = export_arpa(w, fifo.to_str().unwrap());
    let e = err(&infgram(&args));
    reader.join().unwrap();
    assert!(e.contains("arpa.fifo") && e.contains("Broken pipe"), "{e}");
    // The same model to standard output, whose reader goes: success, as `| head` is.
    let mut child = infgram_command(&args[..args.len() - 1])
        .arg("-")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `index --mem` bounds a build whatever its documents: a text file larger than a tenth of the
/// budget is refused before anything is read or written (the 300 MB file here is sparse:
/// reading it would hold 300 MB); so is a JSON line as long, once reached, without holding it;
/// and a document whose tokens outgrow a shard of the budget is refused once tokenized. Each
/// error says what to do, and leaves no output.
#[test]
fn index_mem_bounds_one_large_document() {
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big.txt");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300_000_000)
        .unwrap();
    let out = tmp.path().join("out.idx");
    let o = out.to_str().unwrap();
    let started = std::time::Instant::now();
    let e = err(&infgram(&[
        "index",
        "--mem",
        "0.5",
        "-o",
        o,
        big.to_str().unwrap(),
    ]));
    assert!(
        e.contains("big.txt") && e.contains("300 MB") && e.contains("--mem to at least 3.0 GB"),
        "{e}"
    );
    eprintln!("refused in {:?}", started.elapsed());
    assert!(!out.exists());
    // A JSON line of 200 kB with a budget of 1 MB (documents up to 100 kB).
    let lines = tmp.path().join("lines.jsonl");
    let long = format!("{{\"text\": \"{}\"}}", "ab ".repeat(70_000));
    std::fs::write(&lines, format!("{{\"text\": \"short\"}}\n{long}\n")).unwrap();
    let e = err(&infgram(&[
        "index",
        "--mem",
        "0.001",
        "-o",
        o,
        lines.to_str().unwrap(),
    ]));
    assert!(
        e.contains("lines.jsonl:2") && e.contains("raise --mem"),
        "{e}"
    );
    assert!(!out.exists());
    // 90 kB of text is read within 1 MB, but its 90,000 byte tokens outgrow a shard of
    // 71,428 tokens (1 MB at 14 bytes a token).
    let mid = tmp.path().join("mid.txt");
    std::fs::write(&mid, "the cat sat ".repeat(7_500)).unwrap();
    let e = err(&infgram(&[
        "index",
        "--mem",
        "0.001",
        "-o",
        o,
        mid.to_str().unwrap(),
    ]));
    assert!(
        e.contains("90000 tokens") && e.contains("mid.txt") && e.contains("raise --mem"),
        "{e}"
    );
    assert!(!out.exists());
    // The same text within 2 MB is indexed.
    ok(&infgram(&[
        "index",
        "--mem",
        "0.002",
        "-o",
        o,
        mid.to_str().unwrap(),
    ]));
}

/// `serve --model M --device cuda` in a build without CUDA (or on a machine without it) is
/// refused before the server fetches or indexes anything (it indexed Shakespeare for 14 s
/// first).
#[cfg(not(feature = "cuda"))]
#[test]
fn serve_refuses_a_missing_device_before_it_builds_indexes() {
    let cache = tempfile::tempdir().unwrap();
    let out = infgram_command(&[
        "serve",
        "--model",
        "smollm2-135m",
        "--device",
        "cuda",
        "--addr",
        "127.0.0.1:0",
    ])
    .env("INFGRAM_CACHE", cache.path())
    .env("INFGRAM_MODELS", infgram::assets::models_dir())
    .output()
    .unwrap();
    let e = err(&out);
    assert!(e.contains("cuda"), "{e}");
    assert!(
        !cache.path().join("corpora").exists(),
        "the corpus was fetched first"
    );
    assert!(
        !cache.path().join("indexes").exists(),
        "an index was built first"
    );
}
