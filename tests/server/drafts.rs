//! `POST /v1/drafts`: the library's drafts, a soak of sessions within the byte budget, and
//! requests under concurrent eviction.

use super::*;

/// `POST /v1/drafts`: the drafts of the library's drafting sessions for the same
/// contexts, with and without a request id; bad requests get 4xx and the server keeps serving.
#[test]
fn drafts_route_answers_the_library_drafts() {
    use infgram::service::drafts::Drafts;
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let server = Server::start(&["--index", &format!("small={}", idx.display()), "--quiet"]);
    let index = Arc::new(infgram::Index::open(&idx).unwrap());
    let library = Drafts::new(Some(index.clone()), None, true, Default::default()).unwrap();
    let text = infgram::tokenizer::ByteTokenizer
        .encode("the cat sat on the mat the dog ran on a log the cat sat on")
        .unwrap();
    let mut x = 3u64;
    for case in 0..40 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let cut = 3 + (x >> 33) as usize % (text.len() - 3);
        let (max, tree) = (1 + case % 16, case % 3 == 0);
        let context = &text[..cut];
        let body =
            json!({"index": "small", "context_ids": context, "max_tokens": max, "tree": tree});
        let (status, v) = server.post("/v1/drafts", &body.to_string());
        assert_eq!(status, 200, "{v}");
        let want = serde_json::to_value(library.draft_once(context, max, tree).unwrap()).unwrap();
        same_draft(&v, &want, &format!("case {case}"));
    }
    // A request's session: each call sends its whole context; the server's session learns what
    // was kept, as a session driven by extend does.
    library.start("r", &text[..10]).unwrap();
    let mut at = 10;
    while at + 4 <= text.len() {
        let body = json!({"context_ids": &text[..at], "max_tokens": 6, "request_id": "r"});
        let (status, v) = server.post("/v1/drafts", &body.to_string());
        assert_eq!(status, 200, "{v}");
        let want = serde_json::to_value(library.draft("r", 6, false).unwrap()).unwrap();
        same_draft(&v, &want, &format!("at {at}"));
        library.extend("r", &text[at..at + 4]).unwrap();
        at += 4;
    }
    let body = json!({"context_ids": &text[..at], "request_id": "r", "finish": true});
    assert_eq!(server.post("/v1/drafts", &body.to_string()).0, 200);
    for (body, status, says) in [
        (
            r#"{"context_ids": [1, 2], "max_tokens": 100000}"#,
            400,
            "max_tokens",
        ),
        (
            r#"{"context_ids": [1, 2], "finish": true}"#,
            400,
            "request_id",
        ),
        (r#"{"context_ids": [1, 2], "index": "nope"}"#, 404, "nope"),
        (r#"{"context_ids": [999]}"#, 400, "context_ids"),
        (r#"{"context": [1]}"#, 400, "drafting request"),
        (r#"[1, 2]"#, 400, "drafting request"),
    ] {
        let e = server.refused("/v1/drafts", body, status);
        assert!(e.contains(says), "{body}: {e}");
    }
    let (status, _) = server.post("/v1/drafts", r#"{"context_ids": [116, 104, 101]}"#);
    assert_eq!(status, 200);
}

/// Drafting sessions had no memory bound (5,000 sessions of 4,000 tokens took a
/// server from 47 MB to 3.62 GB). A soak of 5,000 sessions, each a context of 4,000 tokens,
/// stays within the stated budget: resident memory measured, sessions past it dropped and
/// counted, the newest still drafting.
#[test]
fn a_soak_of_draft_sessions_stays_within_the_byte_budget() {
    const SESSIONS: usize = 5000;
    const BUDGET: u64 = 48 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let server = Server::start(&[
        "--index",
        &format!("small={}", idx.display()),
        "--draft-session-bytes",
        &BUDGET.to_string(),
        "--quiet",
    ]);
    let pid = server.child.id();
    // A warm-up session, then the resident memory before the soak.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut context = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 200) as u32 + 32
            })
            .collect()
    };
    let warm = json!({"context_ids": context(4000), "max_tokens": 4, "request_id": "warm"});
    assert_eq!(server.post("/v1/drafts", &warm.to_string()).0, 200);
    let before = rss(pid);
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let mut peak = before;
    let mut last = Vec::new();
    for i in 0..SESSIONS {
        assert!(
            std::time::Instant::now() < deadline,
            "the soak ran past 600 s"
        );
        last = context(4000);
        let body = json!({"context_ids": last, "max_tokens": 4, "request_id": format!("s{i}")});
        let (status, v) = server.post("/v1/drafts", &body.to_string());
        assert_eq!(status, 200, "session {i}: {v}");
        if i % 250 == 0 {
            peak = peak.max(rss(pid));
        }
    }
    peak = peak.max(rss(pid));
    let (_, metrics) = server.request("GET", "/metrics", None);
    let held = metric(&metrics, "infgram_draft_session_bytes");
    let open = metric(&metrics, "infgram_draft_sessions");
    let dropped = metric(&metrics, "infgram_draft_sessions_dropped_total");
    eprintln!(
        "{SESSIONS} sessions of 4,000 tokens: resident {} MB before, peak {} MB; {open} open \
         holding {} MB; {dropped} dropped",
        before >> 20,
        peak >> 20,
        held as u64 >> 20
    );
    assert!(held <= BUDGET as f64, "{held} bytes held");
    assert!(
        dropped > 0.0 && open + dropped >= SESSIONS as f64,
        "{metrics}"
    );
    // Within twice the budget: room for the allocator's own pages (freed pages its per-thread
    // arenas keep) and the request buffers. Measured: 53–68 MB of growth in four runs on 2
    // cores, one run past 1.5 × 48 MB; unbounded, the 5,000 sessions would hold about 575 MB.
    assert!(
        peak - before <= 2 * BUDGET,
        "resident memory grew by {} MB for a budget of {} MB",
        (peak - before) >> 20,
        BUDGET >> 20
    );
    // The newest session is kept: it finishes (a dropped one would be started anew).
    let id = format!("s{}", SESSIONS - 1);
    let body = json!({"context_ids": last, "request_id": id, "finish": true});
    let (status, v) = server.post("/v1/drafts", &body.to_string());
    assert_eq!(status, 200, "{v}");
    let (_, after) = server.request("GET", "/metrics", None);
    assert_eq!(metric(&after, "infgram_draft_sessions"), open - 1.0);
    assert!(
        metric(&metrics, "infgram_requests_total{endpoint=\"drafts\"}") >= SESSIONS as f64,
        "/v1/drafts counted under its own endpoint: {metrics}"
    );
}

/// A request that sends its context is answered from it while other requests' sessions end
/// it in the store (once: 82 of 1,920 requests were answered 404 when 32 clients cycled
/// their request ids under a small byte budget).
#[test]
fn draft_requests_with_their_context_are_answered_under_concurrent_eviction() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let server = Server::start(&[
        "--index",
        &format!("small={}", idx.display()),
        "--draft-session-bytes",
        "1000000",
        "--quiet",
    ]);
    let server = Arc::new(server);
    let context: Vec<u32> = ids("the cat sat on the mat the dog ran on a log ").repeat(40);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|client| {
                let (server, context) = (server.clone(), &context);
                scope.spawn(move || {
                    let mut failed = Vec::new();
                    for i in 0..60 {
                        let cut = 100 + (i * 37 + client * 11) % (context.len() - 100);
                        let body = json!({
                            "context_ids": &context[..cut],
                            "max_tokens": 8,
                            "request_id": format!("c{client}-r{}", i % 4),
                        });
                        let (status, v) = server.post("/v1/drafts", &body.to_string());
                        if status != 200 {
                            failed.push(format!("client {client} request {i}: {status} {v}"));
                        }
                    }
                    failed
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let (_, metrics) = server.request("GET", "/metrics", None);
    assert!(
        metric(&metrics, "infgram_draft_sessions_dropped_total") > 0.0,
        "no session was evicted: {metrics}"
    );
    assert!(metrics.contains("# TYPE infgram_draft_sessions_dropped_total counter"));
}
