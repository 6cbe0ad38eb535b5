//! Every query type against the library's answers, and malformed requests: a 4xx with a
//! message, and the server keeps serving.

use super::*;

#[test]
fn every_query_type_answers_as_the_library_does() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let spec = format!("small={}", idx.display());
    let server = Server::start(&["--index", &spec, "--quiet"]);
    let subject = |s: &str| Subject::ids(ids(s));
    let cont = |c: u8| Continuation {
        cont_id: Some(c as u32),
        cont_text: None,
    };
    // count, with text and with ids; the index named or not (the only one).
    let want = library(
        &idx,
        Query::Count {
            subject: subject("the cat"),
            cnf: None,
            max_diff_tokens: defaults::MAX_DIFF_TOKENS,
            max_clause_freq: defaults::MAX_CLAUSE_FREQ,
        },
    );
    assert!(want["count"].as_u64().unwrap() > 0);
    assert_eq!(
        server.query(json!({"index": "small", "query_type": "count", "query": "the cat"})),
        want
    );
    assert_eq!(
        server.query(json!({"query_type": "count", "query_ids": ids("the cat")})),
        want
    );
    // CNF count: from a query string with AND / OR, and from nested ids.
    let cnf = vec![vec![ids("cat"), ids("dog")], vec![ids("mat")]];
    let want = library(
        &idx,
        Query::Count {
            subject: subject(""),
            cnf: Some(cnf.clone()),
            max_diff_tokens: defaults::MAX_DIFF_TOKENS,
            max_clause_freq: defaults::MAX_CLAUSE_FREQ,
        },
    );
    assert_eq!(
        server.query(json!({"query_type": "count", "query": "cat OR dog AND mat"})),
        want
    );
    assert_eq!(
        server.query(json!({"query_type": "count", "query_ids": cnf})),
        want
    );
    // prob and infgram_prob: the query's last token is the continuation.
    let want = library(
        &idx,
        Query::Prob {
            subject: subject("the ca"),
            cont: cont(b't'),
        },
    );
    assert_eq!(
        server.query(json!({"query_type": "prob", "query": "the cat"})),
        want
    );
    assert_eq!(
        server.query(json!({"query_type": "prob", "query": "the ca", "cont_id": 116})),
        want
    );
    let want = library(
        &idx,
        Query::InfgramProb {
            subject: subject("zzz the ca"),
            cont: cont(b't'),
        },
    );
    assert_eq!(want["suffix_len"], json!(7));
    assert_eq!(
        server.query(json!({"query_type": "infgram_prob", "query": "zzz the cat"})),
        want
    );
    for (qt, q) in [
        (
            "ntd",
            Query::Ntd {
                subject: subject("the "),
                eos_token_id: None,
            },
        ),
        (
            "infgram_ntd",
            Query::InfgramNtd {
                subject: subject("zzz sat on "),
                eos_token_id: None,
            },
        ),
        (
            "infgram_rows",
            Query::InfgramRows {
                subject: subject("the cat sat"),
                eos_token_id: None,
                window: infgram::ngram::batch::ROWS_WINDOW,
                vocab: None,
                estimator: None,
            },
        ),
        (
            "find",
            Query::Find {
                subject: subject("dog ran"),
            },
        ),
        (
            "longest_match",
            Query::LongestMatch {
                subject: subject("the cat sat on the log"),
            },
        ),
    ] {
        let text = String::from_utf8(
            q.subject()
                .input_ids
                .clone()
                .unwrap()
                .iter()
                .map(|&b| b as u8)
                .collect(),
        )
        .unwrap();
        assert_eq!(
            server.query(json!({"query_type": qt, "query": text})),
            library(&idx, q),
            "{qt}"
        );
    }
    rows_documents_and_the_service_routes(&server, &idx);
}

/// The second half of `every_query_type_answers_as_the_library_does`: infgram_rows, document
/// search and fetches, attribution and creativity, the API's own fields, and the health,
/// metrics and models routes, on `server` over the index `idx`.
fn rows_documents_and_the_service_routes(server: &Server, idx: &Path) {
    let subject = |s: &str| Subject::ids(ids(s));
    // infgram_rows with its parameters: a window, an end token read back from the text, SBIS.
    let want = library(
        idx,
        Query::InfgramRows {
            subject: subject("the cat. the dog"),
            eos_token_id: Some(b'.' as u32),
            window: 3,
            vocab: Some(300),
            estimator: Some(infgram::ngram::EstimatorSpec::sbis(2)),
        },
    );
    assert_eq!(want["rows"].as_array().unwrap().len(), 16);
    assert_eq!(
        server.query(
            json!({"query_type": "infgram_rows", "query": "the cat. the dog",
            "eos_token_id": 46, "window": 3, "vocab": 300,
            "estimator": {"name": "sbis", "k": 2}})
        ),
        want
    );
    // search_docs: one document unless maxnum says more.
    let q = |maxnum| Query::SearchDocs {
        subject: subject(""),
        cnf: Some(vec![vec![ids("cat sat")]]),
        maxnum,
        max_diff_tokens: defaults::MAX_DIFF_TOKENS,
        max_clause_freq: defaults::MAX_CLAUSE_FREQ,
        max_disp_len: 30,
    };
    assert_eq!(
        server.query(json!({"query_type": "search_docs", "query": "cat sat", "max_disp_len": 30})),
        library(idx, q(1))
    );
    let three = server.query(
        json!({"query_type": "search_docs", "query": "cat sat", "maxnum": 3, "max_disp_len": 30}),
    );
    assert_eq!(three, library(idx, q(3)));
    assert_eq!(three["documents"].as_array().unwrap().len(), 3);
    // attribute and creativity.
    let text = "the cat sat on the mat and the dog ran on a log";
    let want = library(
        idx,
        Query::Attribute {
            subject: subject(text),
            min_len: 6,
            maxnum: 2,
            max_disp_len: 20,
        },
    );
    assert_eq!(server.query(json!({"query_type": "attribute", "query": text, "min_len": 6, "maxnum": 2, "max_disp_len": 20})), want);
    let want = library(
        idx,
        Query::Creativity {
            subject: subject(text),
            min_n: 5,
            max_n: 12,
        },
    );
    assert_eq!(
        server.query(json!({"query_type": "creativity", "query": text})),
        want
    );
    // Documents by rank and by pointer.
    let want = library(
        idx,
        Query::GetDocByRank {
            subject: subject(""),
            s: 0,
            rank: 17,
            max_disp_len: 25,
        },
    );
    assert_eq!(
        server.query(
            json!({"query_type": "get_doc_by_rank", "s": 0, "rank": 17, "max_disp_len": 25})
        ),
        want
    );
    let want = library(
        idx,
        Query::GetDocByPtr {
            subject: subject(""),
            s: 0,
            ptr: 900,
            max_disp_len: 25,
        },
    );
    assert_eq!(
        server.query(json!({"query_type": "get_doc_by_ptr", "ptr": 900, "max_disp_len": 25})),
        want
    );
    // The API's own fields.
    let (_, v) = server.post("/", r#"{"query_type": "count", "query": "cat"}"#);
    assert_eq!(v["token_ids"], json!(ids("cat")));
    assert_eq!(v["tokens"], json!(["c", "a", "t"]));
    // health, metrics, models.
    let (status, health) = server.request("GET", "/health", None);
    assert_eq!(status, 200);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["indexes"][0]["name"], "small");
    let (status, metrics) = server.request("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        metrics.contains("infgram_requests_total{endpoint=\"count\"} 5"),
        "{metrics}"
    );
    assert!(metrics
        .contains("infgram_request_duration_seconds_bucket{endpoint=\"prob\",le=\"+Inf\"} 2"));
    let (status, models) = server.request("GET", "/v1/models", None);
    assert_eq!(status, 200);
    assert!(models.contains("infgram-sbis"));
}

#[test]
fn bad_requests_get_4xx_with_a_message_and_the_server_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let (a, b) = (
        format!("a={}", idx.display()),
        format!("b={}", idx.display()),
    );
    let server = Server::start(&[
        "--index",
        &a,
        "--index",
        &b,
        "--max-body",
        "2000",
        "--max-maxnum",
        "5",
    ]);
    let cases = bad_requests();
    for (i, (body, status, says)) in cases.iter().enumerate() {
        let path = if body.contains("\"prompt\"") || body.contains("frobnicate") {
            "/v1/completions"
        } else {
            "/"
        };
        if *status == 200 {
            assert_eq!(server.post(path, body).0, 200, "{body}");
            continue;
        }
        let e = server.refused(path, body, *status);
        assert!(
            e.contains(says),
            "case {i}: {body} → {e:?} should say {says:?}"
        );
        // Between bad requests, good ones are still answered.
        assert_eq!(
            server.query(json!({"index": "b", "query_type": "count", "query": "cat"}))["approx"],
            json!(false)
        );
    }
    // Wrong methods and paths: JSON errors too.
    let (status, text) = server.request("GET", "/", None);
    assert_eq!(status, 405, "{text}");
    assert!(text.contains("\"error\""));
    let (status, text) = server.request("GET", "/nowhere", None);
    assert_eq!(status, 404, "{text}");
    // One log line per request, none a panic.
    std::thread::sleep(Duration::from_millis(200));
    let lines: Vec<String> = server.log.lock().unwrap().try_iter().collect();
    assert!(lines.len() >= 2 * cases.len(), "{} log lines", lines.len());
    assert!(
        lines.iter().any(|l| l.contains("POST / 404 count")),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("panicked")), "{lines:?}");
    let (_, metrics) = server.request("GET", "/metrics", None);
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("infgram_server_errors_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// Malformed or refused requests to the server of `bad_requests_get_4xx_…` (indexes `a` and
/// `b`, `--max-body 2000`, `--max-maxnum 5`): each body, the status it gets, and what its
/// message says (200: a request near a limit that passes).
fn bad_requests() -> Vec<(String, u16, &'static str)> {
    let long = "x".repeat(1001);
    let many: Vec<u32> = vec![1; 501];
    vec![
        ("{not json".into(), 400, "not valid JSON"),
        ("[1, 2]".into(), 400, "JSON object"),
        (r#"{"index": "a"}"#.into(), 400, "query_type"),
        (
            r#"{"index": "a", "query_type": "nope", "query": "x"}"#.into(),
            400,
            "unknown query_type",
        ),
        (
            r#"{"index": "a", "query_type": 3}"#.into(),
            400,
            "must be a string",
        ),
        (
            r#"{"index": 3, "query_type": "count", "query": "x"}"#.into(),
            400,
            "\"index\" must be a string",
        ),
        (
            r#"{"query_type": "count", "query": "x"}"#.into(),
            400,
            "several indexes",
        ),
        (
            r#"{"index": "zz", "query_type": "count", "query": "x"}"#.into(),
            404,
            "no index \"zz\"",
        ),
        (
            r#"{"index": "a", "query_type": "count", "query": ["x"]}"#.into(),
            400,
            "must be a string",
        ),
        (
            r#"{"index": "a", "query_type": "count", "query": "x", "query_ids": [1]}"#.into(),
            400,
            "not both",
        ),
        (
            r#"{"index": "a", "query_type": "count", "query_ids": [-1]}"#.into(),
            400,
            "token ids",
        ),
        (
            r#"{"index": "a", "query_type": "count", "query_ids": [1.5]}"#.into(),
            400,
            "token ids",
        ),
        (
            format!(r#"{{"index": "a", "query_type": "count", "query": "{long}"}}"#),
            400,
            "at most 1000",
        ),
        (
            json!({"index": "a", "query_type": "count", "query_ids": many}).to_string(),
            400,
            "at most 500",
        ),
        (
            r#"{"index": "a", "query_type": "infgram_rows", "query": "cat", "estimator": {"name": "smoothed"}}"#.into(),
            400,
            "SBIS estimators",
        ),
        (
            r#"{"index": "a", "query_type": "infgram_rows", "query": "cat", "window": 0}"#.into(),
            400,
            "window",
        ),
        (
            r#"{"index": "a", "query_type": "infgram_rows", "query": "cat", "eos_token_id": 9, "vocab": 5}"#.into(),
            400,
            "outside the vocabulary",
        ),
        (
            r#"{"index": "a", "query_type": "search_docs", "query": "cat", "maxnum": 6}"#.into(),
            400,
            "\"maxnum\" must be an integer between 0 and 5",
        ),
        (
            r#"{"index": "a", "query_type": "search_docs", "query": "cat", "max_disp_len": 10001}"#
                .into(),
            400,
            "max_disp_len",
        ),
        (
            r#"{"index": "a", "query_type": "search_docs", "query": "cat", "max_clause_freq": 0}"#
                .into(),
            400,
            "max_clause_freq",
        ),
        (
            r#"{"index": "a", "query_type": "count", "query": "a AND b AND c AND d AND e"}"#.into(),
            400,
            "at most 4 clauses",
        ),
        (
            r#"{"index": "a", "query_type": "count", "query": "a OR b OR c OR d OR e"}"#.into(),
            400,
            "at most 4 clauses",
        ),
        (
            r#"{"index": "a", "query_type": "prob", "query": ""}"#.into(),
            400,
            "at least one token",
        ),
        (
            r#"{"index": "a", "query_type": "prob", "query": "ab", "cont_id": "x"}"#.into(),
            400,
            "cont_id",
        ),
        (
            r#"{"index": "a", "query_type": "ntd", "query": "a AND b"}"#.into(),
            200,
            "",
        ),
        (
            r#"{"index": "a", "query_type": "find", "query_ids": [[[1]]]}"#.into(),
            400,
            "not a CNF",
        ),
        (
            r#"{"index": "a", "query_type": "get_doc_by_rank", "rank": 99999999}"#.into(),
            400,
            "rank",
        ),
        (
            r#"{"index": "a", "query_type": "get_doc_by_ptr"}"#.into(),
            400,
            "needs \"ptr\"",
        ),
        (
            r#"{"index": "a", "query_type": "get_doc_by_ptr", "ptr": 0, "s": 7}"#.into(),
            400,
            "shard",
        ),
        (
            format!(r#"{{"pad": "{}"}}"#, "y".repeat(3000)),
            413,
            "larger than",
        ),
    ]
    .into_iter()
    .chain(bad_completions())
    .collect()
}

/// The completion requests of [`bad_requests`].
fn bad_completions() -> Vec<(String, u16, &'static str)> {
    vec![
        (
            r#"{"prompt": "the", "index": "a", "max_tokens": 0}"#.into(),
            400,
            "max_tokens",
        ),
        (
            r#"{"prompt": "the", "index": "a", "max_tokens": 100000}"#.into(),
            400,
            "max_tokens",
        ),
        (
            r#"{"prompt": "the", "index": "a", "temperature": -1}"#.into(),
            400,
            "temperature",
        ),
        (
            r#"{"prompt": "the", "index": "a", "top_p": 0}"#.into(),
            400,
            "top_p",
        ),
        (
            r#"{"prompt": "the", "index": "a", "n": 2}"#.into(),
            400,
            "one completion",
        ),
        (
            r#"{"prompt": "the", "index": "a", "stop": [""]}"#.into(),
            400,
            "stop",
        ),
        (
            r#"{"prompt": "the", "index": "a", "stop": ["a", "b", "c", "d", "e"]}"#.into(),
            400,
            "at most 4",
        ),
        (
            r#"{"prompt": "the", "index": "a", "guard": 0}"#.into(),
            400,
            "at least 1",
        ),
        (
            r#"{"prompt": "the", "index": "a", "k": -5}"#.into(),
            400,
            "\"k\"",
        ),
        (
            r#"{"prompt": "the", "index": "a", "mode": "neural"}"#.into(),
            400,
            "needs a model",
        ),
        (
            r#"{"prompt": "the", "index": "a", "mode": "telepathy"}"#.into(),
            400,
            "unknown variant",
        ),
        // Settings that would change nothing are refused by name.
        (
            r#"{"prompt": "the", "index": "a", "mode": "sbis", "compare": true}"#.into(),
            400,
            "\"compare\"",
        ),
        (
            r#"{"prompt": "the", "index": "a", "mode": "speculative", "speculative": false}"#
                .into(),
            400,
            "\"speculative\": false",
        ),
        (
            r#"{"prompt": "the", "index": "zz"}"#.into(),
            404,
            "no index",
        ),
        (r#"{"prompt": 5}"#.into(), 400, "not a completion request"),
        (
            r#"{"prompt": "the", "index": "a", "frobnicate": 1}"#.into(),
            400,
            "unknown field",
        ),
        (
            r#"{"prompt": "the", "index": "a", "max_tokens": 4, "bogus": }"#.into(),
            400,
            "not a completion request",
        ),
    ]
}
