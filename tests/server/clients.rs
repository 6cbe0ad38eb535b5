//! Clients: slow, vanishing, bursting, Python's standard library, web pages of other sites, a
//! client that leaves; SIGTERM, and standard error full.

use super::*;

#[test]
fn slow_and_vanishing_clients_do_not_hold_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let spec = format!("small={}", idx.display());
    let server = Server::start(&["--index", &spec, "--quiet", "--client-timeout", "0.5"]);
    // A client that sends half a request line and stalls: the server closes the connection.
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    slow.write_all(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let mut buf = Vec::new();
    let read = slow.read_to_end(&mut buf);
    assert!(read.is_ok(), "the server kept a stalled client: {read:?}");
    // A client that promises a body and never sends it.
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    slow.write_all(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    let mut buf = String::new();
    let read = slow.read_to_string(&mut buf);
    assert!(read.is_ok(), "the server kept a stalled body: {read:?}");
    assert!(buf.is_empty() || buf.starts_with("HTTP/1.1 4"), "{buf}");
    // A client that sends its body a byte every 0.1 s: the time limit is for the body as a
    // whole, not from byte to byte, so it is answered 408 long before its 100 bytes are sent
    // (200 such clients held their connections).
    let mut trickle = TcpStream::connect(&server.addr).unwrap();
    trickle
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    trickle
        .write_all(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    let mut sent = 0;
    while sent < 100 && trickle.write_all(b" ").is_ok() {
        sent += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut answer = String::new();
    let _ = trickle.read_to_string(&mut answer);
    // Closed before the body was whole (the 408 may be lost to the reset of a closed socket).
    assert!(
        sent < 100 || answer.starts_with("HTTP/1.1 408"),
        "{sent} bytes sent: {answer}"
    );
    // Clients that leave mid-stream and mid-request: the server goes on.
    for _ in 0..5 {
        let mut s = raw_post(
            &server.addr,
            "/v1/completions",
            r#"{"prompt": "the", "max_tokens": 2000, "stream": true}"#,
        );
        let mut first = [0u8; 64];
        let _ = s.read(&mut first);
        drop(s);
        let mut s = TcpStream::connect(&server.addr).unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{\"query")
            .unwrap();
        drop(s);
    }
    assert_eq!(
        server.query(json!({"query_type": "count", "query": "cat"}))["approx"],
        json!(false)
    );
    let (status, _) = server.post("/v1/completions", r#"{"prompt": "the", "max_tokens": 5}"#);
    assert_eq!(status, 200);
}

#[test]
fn a_bounded_burst_of_concurrent_requests_is_answered_without_error() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let spec = format!("small={}", idx.display());
    let server = Arc::new(Server::start(&[
        "--index",
        &spec,
        "--quiet",
        "--concurrent-queries",
        "4",
    ]));
    let queries = [
        json!({"query_type": "count", "query": "the cat"}),
        json!({"query_type": "ntd", "query": "sat on "}),
        json!({"query_type": "infgram_prob", "query": "a dog ran"}),
        json!({"query_type": "search_docs", "query": "dog AND log", "maxnum": 3}),
        json!({"query_type": "attribute", "query": "the cat sat on the mat by the log"}),
    ];
    let want: Vec<Value> = queries.iter().map(|q| server.query(q.clone())).collect();
    let want = Arc::new(want);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (server, want, queries) = (server.clone(), want.clone(), queries.clone());
            std::thread::spawn(move || {
                for i in 0..60 {
                    let k = (t + i) % queries.len();
                    assert_eq!(server.query(queries[k].clone()), want[k]);
                    if i % 20 == 0 {
                        let (status, _) = server
                            .post("/v1/completions", r#"{"prompt": "the", "max_tokens": 20}"#);
                        assert!(status == 200 || status == 429, "{status}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn python_standard_library_client_works_unchanged_but_for_the_url() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let spec = format!("small={}", idx.display());
    let server = Server::start(&["--index", &spec, "--quiet"]);
    // As the infini-gram API documentation shows it, with urllib instead of requests.
    let script = r#"
import json, sys, urllib.request, urllib.error
url = sys.argv[1]
def post(payload):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={'Content-Type': 'application/json'})
    try:
        return json.loads(urllib.request.urlopen(req, timeout=60).read())
    except urllib.error.HTTPError as e:
        return {'status': e.code, **json.loads(e.read())}
payload = {
    'index': 'small',
    'query_type': 'count',
    'query': 'the cat',
}
result = post(payload)
assert result['count'] > 0 and result['approx'] is False, result
assert result['tokens'] == ['t', 'h', 'e', ' ', 'c', 'a', 't'], result
r = post({'index': 'small', 'query_type': 'infgram_ntd', 'query_ids': [116, 104, 101]})
assert r['suffix_len'] == 3 and r['prompt_cnt'] > 0, r
r = post({'index': 'nope', 'query_type': 'count', 'query': 'x'})
assert r['status'] == 404 and 'nope' in r['error'], r
print(json.dumps(result))
"#;
    let out = Command::new("python3")
        .args(["-c", script, &format!("{}/", server.url)])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = library(
        &idx,
        Query::Count {
            subject: Subject::ids(ids("the cat")),
            cnf: None,
            max_diff_tokens: defaults::MAX_DIFF_TOKENS,
            max_clause_freq: defaults::MAX_CLAUSE_FREQ,
        },
    );
    assert_eq!(got["count"], want["count"]);
}

#[test]
fn sigterm_stops_the_server_gracefully() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let spec = format!("small={}", idx.display());
    let mut server = Server::start(&["--index", &spec]);
    assert_eq!(
        server.query(json!({"query_type": "count", "query": "cat"}))["approx"],
        json!(false)
    );
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let mut status = None;
    for _ in 0..300 {
        if let Some(s) = server.child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = status.expect("the server did not stop within 30 s of SIGTERM");
    assert!(status.success(), "{status:?}");
    let lines: Vec<String> = server.log.lock().unwrap().iter().collect();
    assert!(lines.iter().any(|l| l == "stopped"), "{lines:?}");
}

/// `serve` panicked at start when standard error could not be written. With
/// 2>/dev/full it serves.
#[test]
fn serve_starts_with_standard_error_full() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
        .args(["--index", &format!("small={}", idx.display())])
        .stdout(Stdio::null())
        .stderr(full)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let answered = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve exited with {status} (standard error full)");
        }
        let got = ureq::get(&format!("http://127.0.0.1:{port}/health")).call();
        if let Ok(r) = got {
            break r.status().as_u16();
        }
        assert!(std::time::Instant::now() < deadline, "serve never answered");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answered, 200);
}

/// A web page cannot reach the server: a `Host` that is not an address, `localhost` or a name
/// given with --allow-host is refused (DNS rebinding), and so is another site's `Origin`, and
/// a JSON route's `text/plain` or form body (what a page may send without asking); programs
/// (no Origin, a JSON body) are answered.
#[test]
fn requests_from_web_pages_of_other_sites_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let spec = format!("small={}", idx.display());
    let server = Server::start(&["--index", &spec, "--quiet", "--allow-host", "ngram.test"]);
    let body = r#"{"query_type": "count", "query": "cat"}"#;
    let json = "Content-Type: application/json\r\n";
    let post = |host: &str, extra: &str| format!("POST / HTTP/1.1\r\nHost: {host}\r\n{extra}");
    for (head, want) in [
        (post("127.0.0.1", json), 200),
        (post("localhost:1234", json), 200),
        (post("ngram.test", json), 200),
        (post("127.0.0.1", ""), 200),
        (post("evil.example", json), 403),
        (post("ngram.test.evil.example:80", json), 403),
        (
            post(
                "127.0.0.1",
                &format!("{json}Origin: https://evil.example\r\n"),
            ),
            403,
        ),
        (post("127.0.0.1", &format!("{json}Origin: null\r\n")), 403),
        (
            post(
                "127.0.0.1",
                &format!("{json}Origin: http://127.0.0.1:8080\r\n"),
            ),
            200,
        ),
        (post("127.0.0.1", "Content-Type: text/plain\r\n"), 415),
        (
            post(
                "127.0.0.1",
                "Content-Type: application/x-www-form-urlencoded\r\n",
            ),
            415,
        ),
    ] {
        assert_eq!(raw_status(&server.addr, &head, body), want, "{head}");
    }
    let completion = r#"{"prompt": "the", "max_tokens": 3}"#;
    let head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n";
    assert_eq!(raw_status(&server.addr, head, completion), 415);
    let (status, _) = server.post("/v1/completions", completion);
    assert_eq!(status, 200);
}

/// A completion whose client leaves before its answer is counted in `/metrics` and logged
/// (status 499), not lost; and `compare` of a generation stopped by the time limit reports
/// plain decoding's figures as null (plain decoding never ran to the same end).
#[cfg(feature = "neural")]
#[test]
fn a_request_whose_client_left_is_counted_and_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let server = Server::start(&[
        "--index",
        &format!("small={}", idx.display()),
        "--model",
        "smollm2-135m",
        "--generation-timeout",
        "0.3",
    ]);
    let before = server.request("GET", "/metrics", None).1;
    let errors = |m: &str| metric(m, "infgram_client_errors_total{endpoint=\"completions\"}");
    // A long generation holds the worker (until the time limit); a completion queued behind
    // it is left by its client.
    let long = r#"{"prompt": "Count from 1 to 1000.", "max_tokens": 2000, "temperature": 1.0, "seed": 3, "compare": true}"#;
    let held = raw_post(&server.addr, "/v1/completions", long);
    std::thread::sleep(Duration::from_millis(50));
    let left = raw_post(&server.addr, "/v1/completions", long);
    std::thread::sleep(Duration::from_millis(100));
    drop(left);
    let mut answer = String::new();
    held.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let _ = BufReader::new(held).read_to_string(&mut answer);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let report = v["infgram"].as_object().unwrap();
    for field in ["plain_tokens_per_second", "speedup", "identical"] {
        assert_eq!(report.get(field), Some(&Value::Null), "{field}: {v}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let logged = loop {
        let line = server
            .log
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(60))
            .expect("a log line");
        if line.contains("/v1/completions 499 completions") {
            break line;
        }
        assert!(std::time::Instant::now() < deadline, "no 499 logged");
    };
    let after = server.request("GET", "/metrics", None).1;
    assert!(errors(&after) > errors(&before), "{logged}\n{after}");
}
