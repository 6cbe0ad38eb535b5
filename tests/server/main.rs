//! `infgram serve` across processes, on 127.0.0.1 only: every endpoint against the library's
//! answers, the limits and malformed requests (4xx, and the server keeps serving), streaming,
//! a client that disconnects mid-stream, slow clients, a bounded burst of concurrent requests,
//! Python's standard-library client, and a graceful stop on SIGTERM. Every request loop is
//! bounded in count, and every client read in time.

#![cfg(feature = "server")]

use infgram::decode::{Sampler, SamplerConfig};
use infgram::ngram::Estimator;
use infgram::service::query::{defaults, Continuation, Query, Subject};
use infgram::service::request::DrafterSpec;
use infgram::service::{execute, generate_from_corpus, open_index, GenConfig};
#[cfg(feature = "neural")]
use infgram::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// A server child process, killed when dropped.
struct Server {
    child: Child,
    url: String,
    addr: String,
    log: std::sync::Mutex<std::sync::mpsc::Receiver<String>>,
}

impl Server {
    /// Starts `infgram serve --addr 127.0.0.1:0 ARGS` and waits until it listens.
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .arg("serve")
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .env(
                "INFGRAM_CACHE",
                std::env::temp_dir().join("infgram-test-cache"),
            )
            .env("INFGRAM_MODELS", infgram::assets::models_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start infgram serve");
        // Drain stderr (one line per request) on a thread, passing lines on.
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut seen = Vec::new();
        let addr = loop {
            let line = log
                .recv_timeout(Duration::from_secs(300))
                .unwrap_or_else(|_| panic!("the server did not start: {seen:?}"));
            if let Some(rest) = line.strip_prefix("listening on http://") {
                break rest.split_whitespace().next().unwrap().to_string();
            }
            seen.push(line);
        };
        assert!(addr.starts_with("127.0.0.1:"), "{addr}");
        Server {
            child,
            url: format!("http://{addr}"),
            addr,
            log: std::sync::Mutex::new(log),
        }
    }

    /// POSTs `body` to `path`: (status, JSON answer).
    fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let (status, text) = self.request("POST", path, Some(body));
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?} for {body}"));
        (status, v)
    }

    /// One request: (status, body text).
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let url = format!("{}{path}", self.url);
        let response = match (method, body) {
            ("POST", Some(b)) => agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(b),
            ("GET", None) => agent.get(&url).call(),
            other => panic!("no such request in these tests: {other:?}"),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().unwrap();
        (status, text)
    }

    /// A query of the infini-gram API that must succeed: its answer without the API's
    /// per-request fields.
    fn query(&self, body: Value) -> Value {
        let (status, mut v) = self.post("/", &body.to_string());
        assert_eq!(status, 200, "{body} → {v}");
        let obj = v.as_object_mut().unwrap();
        assert!(obj.remove("latency").unwrap().as_f64().unwrap() >= 0.0);
        for k in ["token_ids", "tokens", "token_idsss", "tokensss"] {
            if obj.get(k).is_some_and(Value::is_array) {
                obj.remove(k);
            }
        }
        v
    }

    /// A request that must be refused with `status`: its error message.
    fn refused(&self, path: &str, body: &str, status: u16) -> String {
        let (got, v) = self.post(path, body);
        assert_eq!(got, status, "{body} → {v}");
        v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message: {v}"))
            .to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(args: &[&str]) {
    let out = output(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `infgram ARGS` and returns what it printed and how it ended.
fn output(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(args)
        .env(
            "INFGRAM_CACHE",
            std::env::temp_dir().join("infgram-test-cache"),
        )
        .env("INFGRAM_MODELS", infgram::assets::models_dir())
        .output()
        .unwrap()
}

/// Runs `infgram ARGS`, which must fail: its stderr.
fn fails(args: &[&str]) -> String {
    let out = output(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A corpus of a few documents of a small vocabulary, indexed byte-level at `dir/idx`.
fn small_index(dir: &Path) -> PathBuf {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "log"];
    let mut x = 7u64;
    for d in 0..6 {
        let text: Vec<&str> = (0..400)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                words[(x >> 33) as usize % words.len()]
            })
            .collect();
        std::fs::write(corpus.join(format!("d{d}.txt")), text.join(" ")).unwrap();
    }
    let idx = dir.join("idx");
    run(&[
        "index",
        "-o",
        idx.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]);
    idx
}

/// Sends `POST path` with `body` on a new connection and returns it unread (for clients that
/// leave, stall or queue).
fn raw_post(addr: &str, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// The library's answer, as JSON (written and read back, as the server's answers are: serde
/// reads floats to within an ulp).
fn library(idx: &Path, q: Query) -> Value {
    let (index, tok) = open_index(idx, None).unwrap();
    let mut v = execute(&index, tok.as_ref(), &q).unwrap().to_value();
    v.as_object_mut().unwrap().remove("token_ids"); // the server's answers are compared without it
    serde_json::from_str(&v.to_string()).unwrap()
}

fn ids(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// Parses a server-sent event stream: the JSON of each `data:` line but `[DONE]`, and whether
/// `[DONE]` came.
fn events(text: &str) -> (Vec<Value>, bool) {
    let mut out = Vec::new();
    let mut done = false;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            done = true;
        } else {
            out.push(serde_json::from_str(line).unwrap());
        }
    }
    (out, done)
}

/// The same draft: tokens, parents and sources exactly, probabilities to JSON's precision
/// (serde_json reads floats to within an ulp).
fn same_draft(got: &Value, want: &Value, what: &str) {
    for key in ["token_ids", "parents", "sources"] {
        assert_eq!(got[key], want[key], "{what}: {key}");
    }
    let (a, b) = (
        got["probs"].as_array().unwrap(),
        want["probs"].as_array().unwrap(),
    );
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!(
            (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-12,
            "{what}: {x} {y}"
        );
    }
}

/// The resident memory of process `pid`, in bytes (`VmRSS`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

/// A gauge or counter of `/metrics` (the first line of that name).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Sends `head` (a request line and headers, each line ending in CRLF) and `body` on a new
/// connection: the status of the answer.
fn raw_status(addr: &str, head: &str, body: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "{head}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = String::new();
    let _ = BufReader::new(s).read_line(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"))
}

mod clients;
mod completions;
mod drafts;
mod past;
mod queries;
