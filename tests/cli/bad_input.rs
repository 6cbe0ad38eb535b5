//! Bad numbers, lines and options refused clearly; closed pipes, full disks and diagnostics
//! that cannot be written change nothing else.

use super::*;

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
            vec!["serve", "--prompt-cache-mib", "99999999999999999"],
            "--prompt-cache-mib",
        ),
        (vec!["serve", "--kv-cache-mib", "0"], "--kv-cache-mib"),
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

/// Two ways of saying one thing are refused, not one of them silently ignored: a continuation
/// by id and by text, query flags beside `--batch`, a batch line with both text and ids, a
/// creativity span length past its bound.
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

/// Options that do not apply to the request are refused with both named, never accepted and
/// ignored; orders past the bound, a link loop and a huge temperature give one clear line.
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
    // Options that changed nothing were accepted; each is refused, naming the
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

/// A diagnostic that cannot be written (standard error full, or a closed pipe)
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

/// Any broken pipe in an error's causes ended the process with status 0 and no
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
