//! Every feature on a second architecture: Gemma 3 270M Q4_K_M (`gemma3-270m`,
//! fetched on first use) through the command line and the server, with an index in Gemma's
//! 262,144-token vocabulary (u32 tokens): speculative decoding gives plain decoding's output,
//! mixing is fitted and samples, the copy guard holds, perplexity of the model, the ∞-gram
//! and the mixture, the server's completions equal to the command line's, and the candle
//! reference backend runs the same file.
#![cfg(all(feature = "neural", feature = "server"))]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(run(args))).unwrap()
}

/// `infgram serve --addr 127.0.0.1:0 ARGS`, killed when dropped.
struct Server {
    child: std::process::Child,
    url: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(300))
                .expect("the server did not start");
            if let Some(rest) = line.strip_prefix("listening on http://") {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        assert!(addr.starts_with("127.0.0.1:"), "{addr}");
        Server {
            child,
            url: format!("http://{addr}"),
        }
    }

    fn complete(&self, body: Value) -> Value {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(300)))
            .build()
            .into();
        let mut answer = agent
            .post(&format!("{}/v1/completions", self.url))
            .send_json(&body)
            .unwrap();
        answer.body_mut().read_json().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn gemma3_270m_runs_every_feature() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (train, val) = infgram::assets::tiny_shakespeare_split().unwrap();
    std::fs::write(p("train.txt"), &train[..100_000]).unwrap();
    std::fs::write(p("held.txt"), &train[100_000..101_500]).unwrap();
    std::fs::write(p("val.txt"), &val[..1_500]).unwrap();
    // The candle reference scores a token in about 0.2 s here (134 tokens: 27 s against 1 s
    // natively, 2-vCPU AMD EPYC Zen 3): it is compared with the native backend on 400 bytes.
    std::fs::write(p("short.txt"), &val[..400]).unwrap();
    let idx = p("idx");
    ok(run(&[
        "index",
        "--tokenizer",
        "gemma3-270m",
        "-o",
        &idx,
        &p("train.txt"),
    ]));
    let index = infgram::Index::open(std::path::Path::new(&idx)).unwrap();
    assert_eq!(index.header().token_width, 4, "Gemma's ids need u32 tokens");

    // Plain and speculative decoding: the same tokens (`--compare` runs both).
    let prompt = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n";
    let gen = |more: &[&str]| {
        let mut args = vec![
            "gen",
            "--model",
            "gemma3-270m",
            "--index",
            &idx,
            "--prompt",
            prompt,
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--json",
        ];
        args.extend(more);
        json(&args)
    };
    let spec = gen(&["--speculative", "--compare"]);
    assert_eq!(spec["identical"], true, "{spec}");
    let plain_text = spec["text"].as_str().unwrap().to_string();
    assert!(!plain_text.is_empty());

    // Mixing: fitted on held-out text, then perplexity and sampling with the mixer.
    let mix = p("mix.json");
    ok(run(&[
        "mix",
        "fit",
        "--model",
        "gemma3-270m",
        "--index",
        &idx,
        "--text",
        &p("held.txt"),
        "-o",
        &mix,
    ]));
    let ppl = json(&[
        "ppl",
        "--model",
        "gemma3-270m",
        "--index",
        &idx,
        "--text",
        &p("val.txt"),
        "--mix",
        &mix,
        "--json",
    ]);
    let field = |f: &str| ppl[f].as_f64().unwrap();
    let (mixed, neural, infgram) = (field("ppl"), field("ppl_neural"), field("ppl_infgram"));
    // A 100 KB index helps a 270M model little (on 1,500 characters the mixture came out 12%
    // worse than the model alone, with a mixer fitted on as little): a sane mixture, no gain.
    assert!(
        neural.is_finite() && mixed < infgram && mixed < 1.5 * neural,
        "{ppl}"
    );
    assert!(field("ppl_bound") <= neural, "{ppl}");
    let sampled = gen(&["--mix", &mix, "--speculative", "--compare"]);
    assert_eq!(sampled["identical"], true, "{sampled}");

    // The copy guard: no span of the index longer than 4 tokens in the output.
    let guarded = gen(&["--guard", "4", "--speculative"]);
    assert!(
        guarded["max_copied_span"].as_u64().unwrap() <= 4,
        "{guarded}"
    );

    // The model's own perplexity, and the candle reference on the same file.
    let ppl_native = json(&[
        "ppl",
        "--model",
        "gemma3-270m",
        "--text",
        &p("short.txt"),
        "--json",
    ]);
    let ppl_candle = json(&[
        "ppl",
        "--model",
        "gemma3-270m",
        "--backend",
        "candle",
        "--text",
        &p("short.txt"),
        "--json",
    ]);
    let (native, candle) = (
        ppl_native["ppl"].as_f64().unwrap(),
        ppl_candle["ppl"].as_f64().unwrap(),
    );
    assert!(
        (native / candle - 1.0).abs() < 0.03,
        "native {native} vs candle {candle}"
    );

    // The server: the command line's greedy text, plain and speculative; a guarded answer.
    let server = Server::start(&[
        "--model",
        "gemma3-270m",
        "--index",
        &format!("ts={idx}"),
        "--threads",
        "1",
    ]);
    for mode in ["neural", "speculative"] {
        let v = server.complete(serde_json::json!({"prompt": prompt, "max_tokens": 24,
            "temperature": 0, "mode": mode, "index": "ts"}));
        assert_eq!(
            v["choices"][0]["text"].as_str(),
            Some(plain_text.as_str()),
            "{mode}: {v}"
        );
    }
    let v = server.complete(serde_json::json!({"prompt": prompt, "max_tokens": 24,
        "temperature": 0, "mode": "speculative", "index": "ts", "guard": 4}));
    assert!(
        v["infgram"]["max_copied_span"].as_u64().unwrap() <= 4,
        "{v}"
    );
}
