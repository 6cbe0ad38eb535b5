//! Past outputs kept in a file: files that would fail are refused at start, and a failed save
//! shows in `/health` for every route.

use super::*;

/// Past-outputs files that would fail later are refused at start and left as they are: ids
/// outside the model's vocabulary (every speculative completion drafting them failed while
/// `/health` said ok), a header line longer than a save accepts (loaded, then never saved),
/// a file larger than the budget can fill, a path in a missing directory. A save that fails
/// while serving shows in `/health` (503, degraded) until one succeeds.
#[test]
fn past_output_files_that_would_fail_are_refused_at_start_and_failed_saves_show_in_health() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("past.bin");
    let path = file.to_str().unwrap();
    let model = ["--model", "smollm2-135m", "--threads", "1"];
    // A valid file of this model's, written by a completion.
    let server = Server::start(&[&model[..], &["--past-outputs", path, "--quiet"]].concat());
    // Links planted at the names saves once used (`FILE.tmp-PID`) are neither followed nor
    // consumed.
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, "the victim's\n").unwrap();
    let pid = server.child.id();
    for planted in [
        format!("past.bin.tmp-{pid}"),
        format!(".past.bin.tmp-{pid}"),
    ] {
        std::os::unix::fs::symlink(&victim, tmp.path().join(planted)).unwrap();
    }
    let body = r#"{"prompt": "Say hi", "max_tokens": 3, "temperature": 0}"#;
    let (status, _) = server.post("/v1/completions", body);
    assert_eq!(status, 200);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the victim's\n");
    assert!(file.symlink_metadata().unwrap().file_type().is_file());
    let valid = std::fs::read(&file).unwrap();
    let header_end = valid.iter().position(|&b| b == b'\n').unwrap() + 1;
    // While serving, the file becomes something a save must not replace: the completion is
    // answered, /health says why nothing is saved; once the file is back, saves go on.
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    let (status, _) = server.post("/v1/completions", body);
    assert_eq!(status, 200);
    let (status, health) = server.request("GET", "/health", None);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(
        health["past_outputs_not_saved"]
            .as_str()
            .is_some_and(|e| e.contains("is a directory")),
        "{health}"
    );
    std::fs::remove_dir(&file).unwrap();
    let (status, _) = server.post("/v1/completions", body);
    assert_eq!(status, 200);
    let (status, health) = server.request("GET", "/health", None);
    assert_eq!(status, 200, "{health}");
    drop(server);
    let refused = |bytes: &[u8], why: &str| {
        std::fs::write(&file, bytes).unwrap();
        let e = fails(
            &[
                &["serve", "--addr", "127.0.0.1:0"][..],
                &model,
                &["--past-outputs", path],
            ]
            .concat(),
        );
        assert!(e.contains(why), "{why}: {e}");
        assert_eq!(
            std::fs::read(&file).unwrap(),
            bytes,
            "{why}: the file changed"
        );
    };
    // An output holding an id past the vocabulary.
    let mut oov = valid.clone();
    oov.extend(1u32.to_le_bytes());
    oov.extend(4_000_000_000u32.to_le_bytes());
    refused(&oov, "outside this model's vocabulary");
    // The same header padded past 4 KB.
    let header: Value = serde_json::from_slice(&valid[..header_end - 1]).unwrap();
    let mut padded = header.clone();
    padded["pad"] = "x".repeat(5000).into();
    let mut long = serde_json::to_vec(&padded).unwrap();
    long.push(b'\n');
    refused(&long, "not a past-outputs file");
    // More bytes than a budget of 100 tokens can fill (1,000 outputs of one token).
    let mut big = valid.clone();
    for _ in 0..1000 {
        big.extend(1u32.to_le_bytes());
        big.extend(1u32.to_le_bytes());
    }
    std::fs::write(&file, &big).unwrap();
    let budget = ["--past-outputs", path, "--past-output-tokens", "100"];
    let e = fails(&[&["serve", "--addr", "127.0.0.1:0"][..], &model, &budget].concat());
    assert!(e.contains("more than past outputs of 100 tokens"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), big);
    // A directory that is not there.
    let nowhere = tmp.path().join("missing/past.bin");
    let e = fails(
        &[
            &["serve", "--addr", "127.0.0.1:0"][..],
            &model,
            &["--past-outputs", nowhere.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(e.contains("does not exist"), "{e}");
}

/// A failed save of the past outputs when a drafting request finished was
/// a 400 and left `/health` ok; a good save there did not clear a completion's failure. One
/// state, whichever route saves; a server fault is 5xx. And a past-outputs file over the
/// budget is refused at start and kept (it loaded as nothing and the next save emptied it).
#[cfg(feature = "neural")]
#[test]
fn past_output_saves_of_every_route_share_one_health_state() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("past.bin");
    let path = file.to_str().unwrap();
    let corpus = tmp.path().join("corpus.txt");
    std::fs::write(
        &corpus,
        "Say hi to the cat. The cat says hi back to you.\n".repeat(20),
    )
    .unwrap();
    let idx = tmp.path().join("idx");
    run(&[
        "index",
        "--tokenizer",
        "smollm2-135m",
        "-o",
        idx.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]);
    let model = ["--model", "smollm2-135m", "--threads", "1"];
    let index = format!("m={}", idx.display());
    let server = Server::start(
        &[
            &model[..],
            &["--index", &index, "--past-outputs", path, "--quiet"],
        ]
        .concat(),
    );
    let tok = infgram::service::load_tokenizer("smollm2-135m").unwrap();
    let ids = tok.encode("Say hi to the cat. The cat says hi").unwrap();
    let finish = |id: &str| {
        let start = json!({"index": "m", "context_ids": &ids[..4], "request_id": id});
        assert_eq!(server.post("/v1/drafts", &start.to_string()).0, 200);
        let end = json!({"index": "m", "context_ids": ids, "request_id": id, "finish": true});
        server.post("/v1/drafts", &end.to_string())
    };
    let health = || {
        let (status, text) = server.request("GET", "/health", None);
        (status, serde_json::from_str::<Value>(&text).unwrap())
    };
    assert_eq!(finish("a").0, 200);
    assert!(file.symlink_metadata().unwrap().file_type().is_file());
    // FILE replaced by a link: the drafts save fails, a server fault, and /health says so.
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, "the victim's\n").unwrap();
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&victim, &file).unwrap();
    let (status, v) = finish("b");
    assert_eq!(status, 503, "{v}");
    assert!(v["error"].as_str().unwrap().contains("not be saved"), "{v}");
    let (status, h) = health();
    assert_eq!((status, &h["status"]), (503, &json!("degraded")), "{h}");
    assert!(h["past_outputs_not_saved"].is_string(), "{h}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the victim's\n");
    // The link gone: a good save through drafts clears the state.
    std::fs::remove_file(&file).unwrap();
    assert_eq!(finish("c").0, 200);
    let (status, h) = health();
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["past_outputs_not_saved"], Value::Null, "{h}");
    // A completion's failed save, then a good save through drafts: ok again.
    let saved = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    let body = r#"{"prompt": "Say hi", "max_tokens": 3, "temperature": 0}"#;
    assert_eq!(server.post("/v1/completions", body).0, 200);
    assert_eq!(health().0, 503);
    std::fs::remove_dir(&file).unwrap();
    assert_eq!(finish("d").0, 200);
    assert_eq!(health().0, 200);
    assert!(
        std::fs::read(&file).unwrap().len() > saved.len(),
        "the outputs grew"
    );
    drop(server);
    // Over the budget: refused at start, the file kept.
    let before = std::fs::read(&file).unwrap();
    let kept = before.len() - before.iter().position(|&b| b == b'\n').unwrap() - 1;
    let e = fails(
        &[
            &["serve", "--addr", "127.0.0.1:0"][..],
            &model,
            &["--past-outputs", path, "--past-output-tokens", "2"],
        ]
        .concat(),
    );
    assert!(e.contains("more than this run keeps (2)"), "{e}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "{kept} bytes of outputs"
    );
}
