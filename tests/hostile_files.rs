//! Model and tokenizer files made to harm, as a user could be handed them, and a damaged
//! cache: SmolLM2's GGUF rewritten with a chat template that loops, one that writes without
//! end, one stored as a number, and a vocabulary shorter than the embedding; a tokenizer.json
//! with a token id of four billion; a cached model with bytes flipped or cut short. Each ends
//! with a clear error, in `gen` and under `serve` (which keeps answering `/health` and stops
//! on SIGTERM), never a hang or an abort. The server's chat route is held to the prompt's
//! bounds, answers its refusals in OpenAI's shape, and refuses pages of other machines and
//! doubled headers. Servers listen on 127.0.0.1 only; every wait is bounded.

#![cfg(all(feature = "neural", feature = "server"))]

mod common;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::QTensor;
use common::infgram_command as infgram;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Waits for `child` at most `limit`; past it the child is killed and the test fails.
fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Runs `cmd` to its end (at most 5 minutes): it must fail, with an error and no panic or
/// abort; returns its stderr.
fn fails(mut cmd: Command, what: &str) -> String {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish(child, Duration::from_secs(300), what);
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{what}: {e}");
    assert!(!e.contains("panicked"), "{what}: {e}");
    e
}

/// Runs `cmd`, which must succeed: what it printed.
fn succeeds(mut cmd: Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// SmolLM2's GGUF rewritten into `dir/name` with its metadata edited by `edit` (the tensors
/// as they are).
fn rewrite(dir: &Path, name: &str, edit: impl FnOnce(&mut Vec<(String, Value)>)) -> PathBuf {
    let src = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let mut file = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut md: Vec<(String, Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    md.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut md);
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(&str, QTensor)> = names
        .iter()
        .map(|n| {
            let t = content
                .tensor(&mut file, n, &candle_core::Device::Cpu)
                .unwrap();
            (n.as_str(), t)
        })
        .collect();
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let path = dir.join(name);
    let mut out = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut out, &md_refs, &t_refs).unwrap();
    path
}

/// `md` with its chat template set to `value`.
fn with_template(md: &mut Vec<(String, Value)>, value: Value) {
    md.retain(|(k, _)| k != "tokenizer.chat_template");
    md.push(("tokenizer.chat_template".into(), value));
}

const LOOPS: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
const WRITES: &str = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}";
const HOARDS: &str = "{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";

/// `gen` with a template that loops, writes 10 GB, doubles a string forty times or is a
/// number: a clear error each,
/// within the test's bound, with the way out (`--raw`, or the model's tokenizer.json); with
/// `--raw` the looping file still generates.
#[test]
fn gen_refuses_hostile_templates() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, template, says) in [
        ("loops.gguf", Value::String(LOOPS.into()), "steps"),
        (
            "writes.gguf",
            Value::String(WRITES.into()),
            "writes more than",
        ),
        ("number.gguf", Value::U32(7), "not text"),
        ("hoards.gguf", Value::String(HOARDS.into()), "MiB of memory"),
    ] {
        let model = rewrite(tmp.path(), name, |md| with_template(md, template));
        let model = model.to_str().unwrap();
        let e = fails(
            infgram(&[
                "gen",
                "--model",
                model,
                "--prompt",
                "hi",
                "--max-tokens",
                "2",
            ]),
            name,
        );
        assert!(e.contains(says), "{name}: {e}");
        assert!(
            e.contains("--raw") || e.contains("--tokenizer"),
            "{name}: {e}"
        );
    }
    let looping = tmp.path().join("loops.gguf");
    succeeds(infgram(&[
        "gen",
        "--model",
        looping.to_str().unwrap(),
        "--prompt",
        "hi",
        "--raw",
        "--max-tokens",
        "2",
        "--temperature",
        "0",
    ]));
}

/// A GGUF whose vocabulary is shorter than its embedding is refused at load (it would fail in
/// the middle of a sampled generation); a tokenizer.json with a token id of four billion is
/// refused before anything is allocated for it, and a tokenizer "file" without end is read no
/// further than the bound.
#[test]
fn inconsistent_vocabularies_are_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    // The vocabulary cut to 47,000 tokens, and its merges to those it still spells.
    let short = rewrite(tmp.path(), "short.gguf", |md| {
        let mut kept = std::collections::HashSet::new();
        for (k, v) in md.iter_mut() {
            if k == "tokenizer.ggml.tokens" || k == "tokenizer.ggml.token_type" {
                if let Value::Array(a) = v {
                    a.truncate(47_000);
                    for t in a.iter() {
                        if let Value::String(t) = t {
                            kept.insert(t.clone());
                        }
                    }
                }
            }
        }
        for (k, v) in md.iter_mut() {
            if let (true, Value::Array(merges)) = (k == "tokenizer.ggml.merges", v) {
                merges.retain(|m| match m {
                    Value::String(m) => m.split_once(' ').is_some_and(|(a, b)| {
                        kept.contains(a) && kept.contains(b) && kept.contains(&format!("{a}{b}"))
                    }),
                    _ => false,
                });
            }
        }
    });
    let e = fails(
        infgram(&[
            "gen",
            "--model",
            short.to_str().unwrap(),
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
        ]),
        "short vocabulary",
    );
    assert!(
        e.contains("vocabulary has 47000 tokens and its embedding 49152 rows"),
        "{e}"
    );

    let huge_id = tmp.path().join("tokenizer.json");
    std::fs::write(
        &huge_id,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"[UNK]":0,"a":1,"b":4000000000},"unk_token":"[UNK]"}}"#,
    )
    .unwrap();
    let e = infgram::tokenizer::HfTokenizer::from_json_file(&huge_id)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("a token id of 4000000000"), "{e}");
    let model = infgram::assets::ensure_model("smollm2-135m").unwrap();
    for tokenizer in [huge_id.as_path(), Path::new("/dev/zero")] {
        let e = fails(
            infgram(&[
                "gen",
                "--model",
                model.to_str().unwrap(),
                "--tokenizer",
                tokenizer.to_str().unwrap(),
                "--prompt",
                "hi",
            ]),
            "hostile tokenizer",
        );
        assert!(
            e.contains("4000000000") || e.contains("MiB infgram reads"),
            "{e}"
        );
    }
}

/// A cached model with 8 KB flipped, or cut short, is found damaged by `fetch` and by `gen`:
/// fetched again, and where the package index cannot be reached (here: pip told to use none)
/// refused with the command that fixes it. The damaged file is left as it was.
#[test]
fn a_damaged_cached_model_is_fetched_again_or_refused() {
    let good = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cached = tmp.path().join(good.file_name().unwrap());
    let mut bytes = std::fs::read(&good).unwrap();
    for b in &mut bytes[1 << 20..(1 << 20) + 8192] {
        *b ^= 0x5a;
    }
    for (damaged, says) in [
        (bytes.clone(), "its SHA-256 is"),
        (
            bytes[..1000].to_vec(),
            "1000 bytes where 98362432 were expected",
        ),
        (Vec::new(), "0 bytes where"),
    ] {
        std::fs::write(&cached, &damaged).unwrap();
        for args in [
            &["fetch", "smollm2-135m"][..],
            &["gen", "--model", "smollm2-135m", "--prompt", "hi"],
        ] {
            let mut cmd = infgram(args);
            cmd.env("INFGRAM_MODELS", tmp.path())
                .env("PIP_NO_INDEX", "1")
                .env_remove("PIP_FIND_LINKS");
            let e = fails(cmd, "damaged cache");
            assert!(
                e.contains("is damaged") && e.contains(says),
                "{args:?}: {e}"
            );
            assert!(e.contains("run `infgram fetch smollm2-135m`"), "{e}");
            assert_eq!(std::fs::read(&cached).unwrap(), damaged);
        }
    }
}

/// A server child process, killed when dropped.
struct Served {
    child: Child,
    addr: String,
}

impl Served {
    fn start(args: &[&str]) -> Served {
        let mut child = infgram(&["serve", "--addr", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(300))
                .expect("the server starts");
            if let Some(rest) = line.strip_prefix("listening on http://") {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        Served { child, addr }
    }

    /// Sends `head` (the request line and headers, without the blank line) and `body` as they
    /// are; returns the status and the body (the connection closed after, read for at most
    /// two minutes).
    fn raw(&self, head: &str, body: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let request = format!(
            "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        // A server that refuses before the body may close while the body is still going.
        let _ = s.write_all(request.as_bytes());
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status: {text:?}"));
        let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
        (status, body)
    }

    /// POSTs JSON `body` to `path` from a program (Host: the server's address).
    fn post(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json",
            self.addr
        );
        let (status, text) = self.raw(&head, body);
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        (status, v)
    }

    /// SIGTERM, and the server ends within its grace period and a margin.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) with a pid this test started and has not waited for.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "SIGTERM did not stop the server"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The OpenAI error object of a chat refusal: its message.
fn openai_error(v: &serde_json::Value) -> &str {
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    v["error"]["message"].as_str().unwrap()
}

/// A served model whose template loops: chat requests are refused one after another while
/// `/health` answers, and SIGTERM stops the server.
#[test]
fn a_looping_template_neither_freezes_nor_outlives_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let model = rewrite(tmp.path(), "loops.gguf", |md| {
        with_template(md, Value::String(LOOPS.into()))
    });
    let server = Served::start(&["--model", model.to_str().unwrap()]);
    let chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    for _ in 0..3 {
        let (status, v) = server.post("/v1/chat/completions", chat);
        assert_eq!(status, 400, "{v}");
        assert!(openai_error(&v).contains("steps"), "{v}");
    }
    let head = format!("GET /health HTTP/1.1\r\nHost: {}", server.addr);
    assert_eq!(server.raw(&head, "").0, 200);
    // The raw prompt needs no template.
    let (status, v) = server.post(
        "/v1/completions",
        r#"{"prompt":"hi","max_tokens":2,"temperature":0}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert!(server.stop().success());
}

/// The chat route: the messages held to the prompt's bound and the library's count, a body
/// past `--max-body` answered 413 in OpenAI's shape, pages of other machines and doubled or
/// forged headers refused.
#[test]
fn the_chat_route_is_bounded_and_guarded() {
    let model = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let server = Served::start(&["--model", model.to_str().unwrap(), "--max-body", "300000"]);
    let many = serde_json::json!({
        "messages": vec![serde_json::json!({"role": "user", "content": ""}); 4097],
        "max_tokens": 1,
    });
    let (status, v) = server.post("/v1/chat/completions", &many.to_string());
    assert_eq!(status, 400);
    assert!(openai_error(&v).contains("at most 4096"), "{v}");
    let long = serde_json::json!({
        "messages": vec![serde_json::json!({"role": "user", "content": "x".repeat(1000)}); 30],
        "max_tokens": 1,
    });
    let (status, v) = server.post("/v1/chat/completions", &long.to_string());
    assert_eq!(status, 400);
    assert!(
        openai_error(&v).contains("the messages are 30000 characters"),
        "{v}"
    );
    let big = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(300_100)
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json",
        server.addr
    );
    let (status, text) = server.raw(&head, &big);
    assert_eq!(status, 413, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(openai_error(&v).contains("--max-body"), "{v}");

    let body = r#"{"prompt":"hi","max_tokens":1,"temperature":0}"#;
    let host = format!("Host: {}", server.addr);
    let post = "POST /v1/completions HTTP/1.1";
    for (head, status) in [
        // A typeless body from a page served at a bare IP address.
        (
            format!("{post}\r\n{host}\r\nOrigin: http://203.0.113.5"),
            403,
        ),
        (
            format!("{post}\r\nHost: localhost:evil.example\r\nContent-Type: application/json"),
            403,
        ),
        (
            format!("{post}\r\n{host}\r\nHost: evil.example\r\nContent-Type: application/json"),
            400,
        ),
        (
            format!(
                "{post}\r\n{host}\r\nContent-Type: application/json\r\nContent-Type: text/plain"
            ),
            400,
        ),
        (
            format!("{post}\r\n{host}\r\nOrigin: http://{}", server.addr),
            200,
        ),
    ] {
        let (got, text) = server.raw(&head, body);
        assert_eq!(got, status, "{head}: {text}");
    }
    // A chat route's refusal of a page is in OpenAI's shape too.
    let head =
        format!("POST /v1/chat/completions HTTP/1.1\r\n{host}\r\nOrigin: https://evil.example");
    let (got, text) = server.raw(&head, r#"{"messages":[]}"#);
    assert_eq!(got, 403);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(openai_error(&v).contains("another site"), "{v}");
}

/// A `--tokenizer` of fewer ids than the model's embedding rows: the ids past it are never
/// sampled (at a temperature that reaches every id), where they failed the generation in its
/// middle ("token id … is outside the vocabulary").
#[test]
fn a_smaller_tokenizer_is_never_handed_ids_past_it() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full.json");
    succeeds(infgram(&[
        "export-tokenizer",
        "smollm2-135m",
        "-o",
        full.to_str().unwrap(),
    ]));
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&full).unwrap()).unwrap();
    const KEEP: u64 = 47_000;
    let model = &mut json["model"];
    let vocab = model["vocab"].as_object_mut().unwrap();
    vocab.retain(|_, id| id.as_u64().unwrap() < KEEP);
    let kept: std::collections::HashSet<String> = vocab.keys().cloned().collect();
    let spelled = |a: &str, b: &str| {
        kept.contains(a) && kept.contains(b) && kept.contains(&format!("{a}{b}"))
    };
    model["merges"].as_array_mut().unwrap().retain(|m| match m {
        serde_json::Value::String(m) => m.split_once(' ').is_some_and(|(a, b)| spelled(a, b)),
        serde_json::Value::Array(p) => spelled(p[0].as_str().unwrap(), p[1].as_str().unwrap()),
        _ => false,
    });
    json["added_tokens"]
        .as_array_mut()
        .unwrap()
        .retain(|t| t["id"].as_u64().unwrap() < KEEP);
    let small = tmp.path().join("small.json");
    std::fs::write(&small, json.to_string()).unwrap();
    let model = infgram::assets::ensure_model("smollm2-135m").unwrap();
    let out = succeeds(infgram(&[
        "gen",
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        small.to_str().unwrap(),
        "--prompt",
        "Once upon a time",
        "--raw",
        "--temperature",
        "8",
        "--seed",
        "3",
        "--max-tokens",
        "96",
        "--json",
    ]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = report["token_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 96, "{report}");
    assert!(ids.iter().all(|t| t.as_u64().unwrap() < KEEP), "{report}");
}
