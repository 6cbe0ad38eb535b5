//! `gen`, `ppl`, the copy guard, attribution and creativity from the command line, and
//! `--device cuda` without a GPU.

use super::*;

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
    creativity_and_the_batch_protocol(tmp.path(), i, t);
}

/// Creativity from the command line over the index `i` for the text file `t`, and both
/// attribution and creativity through the batch protocol (files written in `dir`).
fn creativity_and_the_batch_protocol(dir: &Path, i: &str, t: &str) {
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
    let batch = dir.join("q.jsonl");
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
        ("--isa", "scalar"),
    ] {
        let e = err(&infgram(
            &[&gen[..], &["--index", idx, flag, value]].concat(),
        ));
        assert!(e.contains(flag) && e.contains("--model"), "{flag}: {e}");
    }
}

/// `--isa`: every instruction set this CPU runs gives the same greedy text, bit for bit
/// (the default, the best, is one of them); one it cannot run, a name it does not know, or a
/// backend without the native CPU kernels is refused with what to do.
#[cfg(feature = "neural")]
#[test]
fn every_instruction_set_writes_the_same_text() {
    let gen = [
        "gen",
        "--model",
        "smollm2-135m",
        "--prompt",
        "ROMEO:",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        "--json",
    ];
    let text = |more: &[&str]| {
        let out = ok(&infgram(&[&gen[..], more].concat()));
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["text"].as_str().expect("a text").to_string()
    };
    let best = text(&[]);
    for isa in infgram::neural::native::kernels::Isa::available() {
        let name = format!("{isa:?}").to_lowercase();
        assert_eq!(text(&["--isa", &name]), best, "{name}");
    }
    let e = err(&infgram(&[&gen[..], &["--isa", "sse9"]].concat()));
    assert!(e.contains("--isa") && e.contains("this CPU runs"), "{e}");
    let e = err(&infgram(
        &[&gen[..], &["--isa", "scalar", "--backend", "candle"]].concat(),
    ));
    assert!(e.contains("--isa") && e.contains("native"), "{e}");
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

/// `gen --batch FILE`: a request a line (text, a seeded sample, drafts, a chat), answered as
/// JSON lines in the file's order; with `--parallel 3` the passes are shared and every answer
/// is the one `--parallel 1` gives; a malformed line is refused, by its number, before any
/// generation runs.
#[cfg(feature = "neural")]
#[test]
fn gen_batch_answers_each_line_as_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("requests.jsonl");
    let lines = [
        r#"{"prompt": "The capital of France is", "sampling": {"temperature": 0}, "limits": {"max_tokens": 24}}"#,
        r#"{"prompt": "Once upon a time", "sampling": {"temperature": 0.8, "seed": 5}, "limits": {"max_tokens": 24}}"#,
        r#"{"prompt": "one two three one two three one two", "sampling": {"temperature": 0}, "limits": {"max_tokens": 24}, "drafters": ["prompt_lookup"]}"#,
        r#"{"prompt": {"messages": [{"role": "user", "content": "Name a colour."}]}, "sampling": {"temperature": 0}, "limits": {"max_tokens": 16}}"#,
    ];
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let f = file.to_str().unwrap();
    let run = |parallel: &str| -> Vec<serde_json::Value> {
        let args = [
            "gen",
            "--model",
            "smollm2-135m",
            "--threads",
            "2",
            "--batch",
            f,
        ];
        let out = ok(&infgram(&[&args[..], &["--parallel", parallel]].concat()));
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let one = run("1");
    assert_eq!(one.len(), lines.len());
    let texts = |v: &[serde_json::Value]| -> Vec<String> {
        v.iter()
            .map(|a| a["text"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        one.iter().all(|a| a["tokens"].as_u64().unwrap() > 0),
        "{one:?}"
    );
    assert_eq!(texts(&run("3")), texts(&one));
    std::fs::write(&file, format!("{}\n{{\"prompt\": 7}}\n", lines[0])).unwrap();
    let out = infgram(&["gen", "--model", "smollm2-135m", "--batch", f]);
    assert!(!out.status.success());
    assert!(err(&out).contains("line 2"), "{}", err(&out));
}
