//! Completions: SBIS streamed or not against the library's generation, a neural model loaded
//! once, stop sequences and the chat route.

use super::*;

#[test]
fn sbis_completions_are_the_library_generation_streamed_or_not() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let spec = format!("small={}", idx.display());
    let server = Server::start(&["--index", &spec, "--quiet", "--generation-timeout", "30"]);
    let (index, tok) = open_index(&idx, None).unwrap();
    let index = Arc::new(index);
    for (temperature, seed, guard) in [(0.0, 1u64, None), (1.0, 42, None), (0.8, 7, Some(6usize))] {
        let cfg = GenConfig {
            estimator: Estimator::Sbis { k: -1, decay: 0.1 },
            context: 200,
            max_tokens: 60,
            guard: guard.map(infgram::service::GuardConfig::new),
            cancel: None,
        };
        let mut sampler = Sampler::new(
            SamplerConfig {
                temperature,
                top_p: 1.0,
                top_k: 0,
            },
            Some(seed),
        );
        let g = generate_from_corpus(
            index.clone(),
            &tok.encode("the cat").unwrap(),
            &cfg,
            &mut sampler,
            |_| {},
        )
        .unwrap();
        let want = tok.decode(&g.tokens).unwrap();
        let body = json!({"prompt": "the cat", "max_tokens": 60, "temperature": temperature, "seed": seed, "guard": guard});
        let (status, v) = server.post("/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], json!(want));
        assert_eq!(v["usage"]["completion_tokens"], json!(g.tokens.len()));
        assert_eq!(v["usage"]["prompt_tokens"], json!(7));
        let finish = if g.tokens.len() == 60 {
            "length"
        } else {
            "stop"
        };
        assert_eq!(v["choices"][0]["finish_reason"], finish);
        assert_eq!(v["infgram"]["guard"].is_null(), guard.is_none(), "{v}");
        // Streamed: the same text in pieces, the last event with the finish reason, then [DONE].
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (status, text) = server.request("POST", "/v1/completions", Some(&streamed.to_string()));
        assert_eq!(status, 200);
        let (chunks, done) = events(&text);
        assert!(done, "{text}");
        let joined: String = chunks
            .iter()
            .map(|c| c["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(joined, want);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            finish
        );
        assert!(chunks.len() > 10, "one event per token");
    }
    // Token ids as the prompt.
    let (status, v) = server.post(
        "/v1/completions",
        &json!({"prompt": ids("the cat"), "max_tokens": 5, "temperature": 0}).to_string(),
    );
    assert_eq!(status, 200, "{v}");
    // Ids outside the vocabulary are refused as `POST /` refuses them.
    for bad in [999u64, 4_294_967_295] {
        let body = json!({"prompt": [116, bad], "max_tokens": 5}).to_string();
        let e = server.refused("/v1/completions", &body, 400);
        assert!(e.contains("vocabulary"), "{e}");
    }
    // A temperature whose inverse overflows is greedy.
    let greedy = |t: f64| {
        let body = json!({"prompt": "the cat", "max_tokens": 20, "temperature": t, "seed": 3});
        server.post("/v1/completions", &body.to_string())
    };
    let (status, tiny) = greedy(1e-320);
    assert_eq!(status, 200, "{tiny}");
    assert_eq!(
        tiny["choices"][0]["text"],
        greedy(0.0).1["choices"][0]["text"]
    );
    let (_, health) = server.request("GET", "/health", None);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["generation_worker"], "running", "{health}");
    // A generation past the time limit ends with what it has.
    drop(server);
    let server = Server::start(&[
        "--index",
        &spec,
        "--quiet",
        "--generation-timeout",
        "0.000001",
    ]);
    let (status, v) = server.post(
        "/v1/completions",
        r#"{"prompt": "the", "max_tokens": 2000}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["infgram"]["time_limit_reached"], json!(true), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 2000);
}

/// With SmolLM2 loaded once: neural, speculative and mixed completions are the library's
/// greedy generations (speculative decoding is lossless), the copy guard holds, and a client
/// that leaves mid-stream frees the worker at once.
#[cfg(feature = "neural")]
#[test]
fn neural_completions_with_a_model_loaded_once() {
    use infgram::service::request::{
        GenLimits, GenerateRequest, GuardSpec, Prompt, Sampling, Scorer, MAX_GEN_TOKENS,
    };
    use infgram::service::run::{generate, ModelIndex};
    use infgram::service::{Resources, RunOptions};
    let tmp = tempfile::tempdir().unwrap();
    let (train, _) = infgram::assets::tiny_shakespeare_split().unwrap();
    let text = tmp.path().join("ts.txt");
    std::fs::write(&text, &train[..200_000]).unwrap();
    let idx = tmp.path().join("ts-smol");
    run(&[
        "index",
        "--tokenizer",
        "smollm2-135m",
        "-o",
        idx.to_str().unwrap(),
        text.to_str().unwrap(),
    ]);
    let bytes_idx = small_index(tmp.path());
    let (spec, bytes_spec) = (
        format!("ts={}", idx.display()),
        format!("small={}", bytes_idx.display()),
    );
    let past_file = tmp.path().join("past-outputs.bin");
    let past_arg = past_file.to_str().unwrap();
    let model_server = |more: &[&str]| {
        let mut args = vec![
            "--model",
            "smollm2-135m",
            "--index",
            &spec,
            "--threads",
            "1",
            // One generation at a time: the queue test below fills the queue behind it.
            "--parallel",
            "1",
        ];
        args.extend_from_slice(more);
        Server::start(&args)
    };
    let server = model_server(&["--index", &bytes_spec, "--past-outputs", past_arg]);
    let drafting = Arc::new(infgram::Index::open(&idx).unwrap());
    let mut loaded =
        infgram::service::models::load_model("smollm2-135m", &Default::default()).unwrap();
    let prompt = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n";
    let ids = loaded.tokenizer.encode(prompt).unwrap();
    // The library's one generation call, as a front end makes it.
    let library = |loaded: &mut infgram::service::models::LoadedModel,
                   speculative: bool,
                   mix: bool,
                   guard: Option<usize>| {
        let req = GenerateRequest {
            prompt: Prompt::Ids(ids.clone()),
            scorer: if mix { Scorer::Mixture } else { Scorer::Model },
            drafters: if speculative {
                vec![DrafterSpec::PromptLookup, DrafterSpec::Corpus]
            } else {
                Vec::new()
            },
            corpus_rule: Default::default(),
            guard: guard.map(|max_span| GuardSpec {
                max_span,
                ignore_prompt: false,
            }),
            sampling: Sampling {
                temperature: Some(0.0),
                ..Default::default()
            },
            limits: GenLimits {
                max_tokens: Some(24),
                ..Default::default()
            },
        }
        .check(MAX_GEN_TOKENS)
        .unwrap();
        let index = ModelIndex::check(drafting.clone(), &loaded.tokenizer, mix).unwrap();
        let mut res = Resources::model(loaded.model.as_mut(), &loaded.tokenizer, "smollm2-135m")
            .drafting_index(Some(index), None);
        generate(&req, &mut res, &RunOptions::default(), |_| {})
            .unwrap()
            .text
    };
    let plain = library(&mut loaded, false, false, None);
    let mixed = library(&mut loaded, false, true, None);
    let guarded = library(&mut loaded, false, false, Some(4));
    // Requests open no index: the server's opened indexes flow to the drafters, the mixture
    // and the guard (a mixed, guarded request opened one up to three times).
    let counter = |name: &str| {
        let (_, text) = server.request("GET", "/metrics", None);
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no counter {name}: {text}"))
            .to_string();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    let opens = || counter("infgram_index_opens_total");
    let checks = || counter("infgram_tokenizer_checks_total");
    let opened_at_start = opens();
    assert!(opened_at_start >= 2.0, "{opened_at_start}");
    for (mode, guard, want) in [
        ("neural", None, &plain),
        ("speculative", None, &plain),
        ("mix", None, &mixed),
        ("neural", Some(4), &guarded),
        ("speculative", Some(4), &guarded),
    ] {
        let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "mode": mode,
                          "index": "ts", "guard": guard});
        // One completion binds its index once: one tokenizer check, no open.
        let checked_before = checks();
        let (status, v) = server.post("/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{mode}: {v}");
        assert_eq!(
            checks(),
            checked_before + 1.0,
            "{mode}: checks of one completion"
        );
        assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "{mode}");
        assert_eq!(v["infgram"]["mode"], mode);
        assert!(v["model"].as_str().unwrap().contains("smollm2-135m"), "{v}");
        if guard.is_some() {
            assert!(
                v["infgram"]["max_copied_span"].as_u64().unwrap() <= 4,
                "{v}"
            );
        }
    }
    assert_eq!(opens(), opened_at_start, "a request opened an index");
    past_outputs_of_completions(
        &server,
        prompt,
        [&plain, &guarded],
        &model_server,
        past_arg,
        tmp.path(),
    );
    drafting_needs_the_model_s_tokens(&server);
    cli_and_http_give_one_report(&server, prompt, &idx, &guarded);
    a_client_that_leaves_frees_the_queue(&server, prompt);
}

/// The index a model's completion drafts from must be in the model's tokens (SBIS still serves
/// the byte index), and drafts need the model to verify them.
fn drafting_needs_the_model_s_tokens(server: &Server) {
    // The index named must be in the model's tokens; sbis still serves the byte index.
    let e = server.refused(
        "/v1/completions",
        r#"{"prompt": "x", "mode": "speculative", "index": "small"}"#,
        400,
    );
    assert!(e.contains("tokenizer"), "{e}");
    let (status, _) = server.post(
        "/v1/completions",
        r#"{"prompt": "the", "mode": "sbis", "index": "small", "max_tokens": 5}"#,
    );
    assert_eq!(status, 200);
    // Drafts are verified by the model: `speculative` with the index alone is refused, named.
    let e = server.refused(
        "/v1/completions",
        r#"{"prompt": "the", "mode": "sbis", "index": "small", "speculative": true}"#,
        400,
    );
    assert!(e.contains("\"speculative\""), "{e}");
}

/// The server's past outputs after `neural_completions_…`'s five completions: the same task
/// drafts from them (`want`: the plain and the guarded output), a guarded request still copies
/// at most 4 tokens, a restarted server (`model_server`) reads all seven from `past_arg`, and a
/// file that is not one (in `dir`) is refused at start, as is the option without a model.
fn past_outputs_of_completions(
    server: &Server,
    prompt: &str,
    [plain, guarded]: [&String; 2],
    model_server: &dyn Fn(&[&str]) -> Server,
    past_arg: &str,
    dir: &Path,
) {
    // Every completion's output went into the server's past outputs; the same task again
    // drafts from them (output still the plain one), and a guarded request still copies at
    // most 4 tokens of the corpus though an unguarded answer is among the past outputs.
    let (_, health) = server.request("GET", "/health", None);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["past_outputs"]["outputs"], 5, "{health}");
    for (guard, want) in [(None, plain), (Some(4), guarded)] {
        let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0,
                          "mode": "speculative", "index": "ts", "guard": guard});
        let (status, v) = server.post("/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want);
        let by = &v["infgram"]["stats"]["accepted_by_drafter"];
        assert!(by["past"].as_u64().unwrap_or(0) > 0, "{v}");
        if guard.is_some() {
            assert!(
                v["infgram"]["max_copied_span"].as_u64().unwrap() <= 4,
                "{v}"
            );
        }
    }
    // The past outputs were written after every completion: a server started on the file
    // drafts from all seven at once.
    let restarted = model_server(&["--past-outputs", past_arg, "--quiet"]);
    let (_, health) = restarted.request("GET", "/health", None);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["past_outputs"]["outputs"], 7, "{health}");
    drop(restarted);
    // A file that is not a past-outputs file is refused at start and left as it is, and so is
    // the option without a model.
    let foreign = dir.join("notes.txt");
    std::fs::write(&foreign, "my notes\n").unwrap();
    let e = fails(&[
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--model",
        "smollm2-135m",
        "--past-outputs",
        foreign.to_str().unwrap(),
    ]);
    assert!(
        e.contains("past outputs") || e.contains("past-outputs"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "my notes\n");
    let e = fails(&["serve", "--addr", "127.0.0.1:0", "--past-outputs", past_arg]);
    assert!(e.contains("--model"), "{e}");
}

/// The CLI and the server make one service call for a generation and give one report: the
/// same guarded request (`guarded`: its text) has the same fields through both, on the index
/// `idx` (served as `ts`).
fn cli_and_http_give_one_report(server: &Server, prompt: &str, idx: &Path, guarded: &str) {
    // `how` is the CLI's
    // flags for the HTTP `mode`; both reports come back, their texts checked equal.
    let cli_and_http = |how: &[&str], mode: &str| {
        let idx = idx.to_str().unwrap();
        let mut args = vec!["gen", "--model", "smollm2-135m", "--index", idx];
        args.extend(how);
        args.extend([
            "--guard",
            "4",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--raw",
            "--threads",
            "1",
            "--json",
            "--prompt",
            prompt,
        ]);
        let out = output(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
        let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0,
                          "mode": mode, "index": "ts", "guard": 4});
        let (status, v) = server.post("/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{v}");
        assert_eq!(cli["text"], v["choices"][0]["text"], "{cli} {v}");
        (cli, v)
    };
    let (cli, v) = cli_and_http(&["--speculative"], "speculative");
    assert_eq!(cli["text"].as_str().unwrap(), guarded);
    for key in [
        "token_ids",
        "tokens",
        "prompt_tokens",
        "natural_end",
        "max_copied_span",
        "guard_exhausted",
        "speculative",
        "mix",
    ] {
        assert_eq!(cli[key], v["infgram"][key], "{key}: {cli} {v}");
    }
    // … and so does a guarded mixture (the mixer's statistics included).
    let (cli, v) = cli_and_http(&["--mix", "default"], "mix");
    assert_eq!(cli["mix"], true, "{cli}");
    for key in [
        "token_ids",
        "tokens",
        "prompt_tokens",
        "natural_end",
        "max_copied_span",
        "guard_exhausted",
        "guard_blocked",
        "mix",
    ] {
        assert_eq!(cli[key], v["infgram"][key], "{key}: {cli} {v}");
    }
}

/// A client that leaves mid-stream: its generation stops, and the next one runs at once; while
/// it runs the queue takes 8 more and the next is told 429, and queries are answered.
fn a_client_that_leaves_frees_the_queue(server: &Server, prompt: &str) {
    let body = json!({"prompt": prompt, "max_tokens": 2048, "stream": true, "temperature": 0.7,
                      "seed": 3})
    .to_string();
    let mut reader = BufReader::new(raw_post(&server.addr, "/v1/completions", &body));
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    // While it runs, the queue takes 8 more (the default backlog), and the next is told 429.
    let queued: Vec<TcpStream> = (0..8)
        .map(|_| {
            raw_post(
                &server.addr,
                "/v1/completions",
                r#"{"prompt": "Hi", "max_tokens": 1}"#,
            )
        })
        .collect();
    let mut health = Value::Null;
    for _ in 0..300 {
        health = serde_json::from_str(&server.request("GET", "/health", None).1).unwrap();
        if health["generation_waiting"] == json!(8) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(health["generation_waiting"], json!(8), "{health}");
    let e = server.refused(
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 1}"#,
        429,
    );
    assert!(e.contains("queue is full"), "{e}");
    // Queries are answered meanwhile.
    let (status, _) = server.post(
        "/",
        r#"{"index": "small", "query_type": "count", "query": "cat"}"#,
    );
    assert_eq!(status, 200);
    drop(reader);
    drop(queued);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut stopped = false;
    while !stopped && std::time::Instant::now() < deadline {
        if let Ok(l) = server
            .log
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(1))
        {
            stopped = l.contains("the client left");
        }
    }
    assert!(stopped, "the generation went on after its client left");
    // The worker skips the queued jobs whose clients left; until it has, the queue may still
    // be full (429): a bounded number of tries.
    let mut answer = (0, Value::Null);
    for _ in 0..100 {
        answer = server.post(
            "/v1/completions",
            r#"{"prompt": "Hello", "max_tokens": 3, "temperature": 0}"#,
        );
        if answer.0 != 429 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(answer.0, 200, "{}", answer.1);
}

/// `stop` ends a completion where a stop sequence first appears, whole or streamed (the stream
/// never sends the text of a stop sequence); the chat route without a model refuses in
/// OpenAI's error shape.
#[test]
fn stop_sequences_end_completions_and_the_chat_route_needs_a_model() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
    let server = Server::start(&["--index", &format!("small={}", idx.display()), "--quiet"]);
    let full = r#"{"prompt": "the", "max_tokens": 300, "seed": 5, "temperature": 1.0}"#;
    let (status, v) = server.post("/v1/completions", full);
    assert_eq!(status, 200);
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let stop = " dog";
    let cut = text.find(stop).expect("the text holds the stop sequence");
    let body = r#"{"prompt": "the", "max_tokens": 300, "seed": 5, "temperature": 1.0, "stop": [" dog", "zzz"]}"#;
    let (status, v) = server.post("/v1/completions", body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], json!(text[..cut]));
    assert_eq!(v["choices"][0]["finish_reason"], json!("stop"));
    assert_eq!(v["infgram"]["stopped_at_stop_sequence"], json!(true));
    let streamed = body.replace("\"stop\"", "\"stream\": true, \"stop\"");
    let (status, sse) = server.request("POST", "/v1/completions", Some(&streamed));
    assert_eq!(status, 200);
    let (events, done) = events(&sse);
    assert!(done);
    let joined: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, text[..cut]);
    let (status, v) = server.post(
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
    );
    assert_eq!(status, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("--model"),
        "{v}"
    );
    assert_eq!(v["error"]["type"], json!("invalid_request_error"));
}

/// Without `--parallel`, a batched model runs as many generations at once as its passes still
/// pay for (one of the calibrated pass sizes), and no more than the KV cache holds at the
/// longest request each.
#[test]
fn the_generations_at_once_are_chosen_from_the_pass_costs_and_the_cache() {
    let parallel = |more: &[&str]| {
        let args = [&["--model", "smollm2-135m", "--threads", "2"][..], more].concat();
        let server = Server::start(&args);
        let (_, health) = server.request("GET", "/health", None);
        let health: Value = serde_json::from_str(&health).unwrap();
        health["parallel"].as_u64().expect("a number")
    };
    // 512-token requests: SmolLM2's 46 KB a token (and 72 tokens' rounding) fit 159 times
    // in 4 GiB.
    let chosen = parallel(&["--max-prompt-tokens", "256", "--max-tokens", "256"]);
    assert!([1, 2, 4, 8, 16].contains(&chosen), "{chosen}");
    // The longest request (4,096 + 2,048 tokens) may hold 286 MB: one fits in 300 MiB.
    assert_eq!(parallel(&["--kv-cache-mib", "300"]), 1);
}

/// `--parallel 4` with the native CPU backend: four requests at once (greedy speculative,
/// greedy plain, seeded sampling, a chat) share the model's passes, and each answer is the
/// one the request gets alone, twice over; `/health` and `/metrics` report the batching.
#[test]
fn concurrent_completions_share_passes_and_answer_as_alone() {
    let server = Server::start(&[
        "--model",
        "smollm2-135m",
        "--threads",
        "2",
        "--parallel",
        "4",
    ]);
    let prompt = "First Citizen:\nBefore we proceed any further, hear me speak.\n";
    let requests = [
        (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 40, "temperature": 0,
                                   "mode": "speculative"}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 40,
                                   "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 40, "temperature": 0.8,
                                   "seed": 11}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user",
                                        "content": "Name three colours."}],
                                        "max_tokens": 40, "temperature": 0}),
        ),
    ];
    let text = |v: &Value| {
        let choice = &v["choices"][0];
        choice["text"]
            .as_str()
            .or_else(|| choice["message"]["content"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let alone: Vec<String> = requests
        .iter()
        .map(|(path, body)| {
            let (status, v) = server.post(path, &body.to_string());
            assert_eq!(status, 200, "{v}");
            text(&v)
        })
        .collect();
    assert!(alone.iter().all(|t| !t.is_empty()), "{alone:?}");
    for round in 0..2 {
        let together: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = requests
                .iter()
                .map(|(path, body)| {
                    let server = &server;
                    s.spawn(move || {
                        let (status, v) = server.post(path, &body.to_string());
                        assert_eq!(status, 200, "{v}");
                        text(&v)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(together, alone, "round {round}");
    }
    let (_, health) = server.request("GET", "/health", None);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["parallel"], 4, "{health}");
    let (_, metrics) = server.request("GET", "/metrics", None);
    let passes = metrics
        .lines()
        .find_map(|l| l.strip_prefix("infgram_batch_passes_total "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(passes.is_some_and(|p| p > 0.0), "{metrics}");
    // (The repeated prompts started from the kept caches of the earlier ones.)
    assert!(metric(&metrics, "infgram_prompt_cache_reused_tokens_total") > 0.0);
    // Every answer's tokens counted (12 answers of at most 40 tokens).
    let generated = metric(&metrics, "infgram_generated_tokens_total");
    assert!(generated > 12.0 && generated <= 480.0, "{generated}");
    assert!(
        metrics.contains("infgram_generated_tokens_per_second "),
        "{metrics}"
    );
}

/// A metric's value in `/metrics` text (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A greedy chat turn of 24 tokens: its answer, its prompt tokens and those a kept cache held
/// (`cache_prompt`: the request's field).
fn chat_turn(server: &Server, messages: &Value, cache_prompt: bool) -> (String, f64, f64) {
    let body = json!({"messages": messages, "max_tokens": 24, "temperature": 0,
                      "cache_prompt": cache_prompt});
    let (status, v) = server.post("/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{v}");
    let answer = v["choices"][0]["message"]["content"].as_str();
    let usage = &v["usage"];
    (
        answer.unwrap_or_default().to_string(),
        usage["prompt_tokens"].as_f64().expect("prompt tokens"),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .expect("cached tokens"),
    )
}

/// Kept prompts (`--prompt-cache-mib`, also at `--parallel 1`): a chat's second turn, sent
/// with the first turn's answer, and a chat that shares only the template's start, read from
/// the kept caches, and their answers are the ones a server that keeps nothing gives; a
/// request with `"cache_prompt": false` reads its prompt whole and leaves nothing kept.
#[test]
fn a_chat_s_next_turn_reads_only_its_new_tokens_with_the_same_answer() {
    let first = json!({"role": "user", "content": "Name three colours."});
    let second = |one: &str| {
        json!([first, {"role": "assistant", "content": one},
               {"role": "user", "content": "And three more?"}])
    };
    let metrics =
        |server: &Server, name: &str| metric(&server.request("GET", "/metrics", None).1, name);
    let turns = |server: &Server| {
        let (one, ..) = chat_turn(server, &json!([first]), true);
        let (two, prompt, cached) = chat_turn(server, &second(&one), true);
        let (three, ..) = chat_turn(
            server,
            &json!([{"role": "user", "content": "Count to five."}]),
            true,
        );
        let reused = metrics(server, "infgram_prompt_cache_reused_tokens_total");
        let read = metrics(server, "infgram_prompt_tokens_read_total");
        ((one, two, three), (prompt, cached), (reused, read))
    };
    let start = |parallel: &str, kept: &str| {
        Server::start(&[
            "--model",
            "smollm2-135m",
            "--threads",
            "2",
            "--parallel",
            parallel,
            "--prompt-cache-mib",
            kept,
        ])
    };
    let (cold, (_, none_cached), (none, all_read)) = turns(&start("2", "0"));
    assert_eq!((none, none_cached), (0.0, 0.0), "nothing kept");
    // (One generation at a time keeps them too.)
    let server = start("1", "64");
    let (kept, (prompt, cached), (reused, read)) = turns(&server);
    assert_eq!(read + reused, all_read, "prompt tokens read or not");
    assert_eq!(kept, cold, "answers with kept prompts");
    assert!(!cold.1.is_empty(), "{cold:?}");
    // The second turn rereads none of the first (its prompt and answer), as its usage says;
    // the third shares the template's start.
    assert!(
        cached > prompt / 2.0 && cached < prompt,
        "{cached} of {prompt}"
    );
    assert!(
        reused > cached,
        "{reused} reused, {cached} in the second turn"
    );
    // Not kept: read whole, the same answer, and the kept caches as they were (counted after
    // the first: an answer goes out before its sequence is handed back).
    let (two, _, none) = chat_turn(&server, &second(&kept.0), false);
    assert_eq!((two.as_str(), none), (kept.1.as_str(), 0.0));
    let held = metrics(&server, "infgram_prompt_cache_tokens");
    let (_, _, none) = chat_turn(&server, &second(&kept.0), false);
    assert_eq!(none, 0.0);
    assert_eq!(metrics(&server, "infgram_prompt_cache_tokens"), held);
    assert_eq!(
        metrics(&server, "infgram_prompt_cache_reused_tokens_total"),
        reused
    );
    // A new chat sent not kept, then kept: the second reads its message again.
    let new = json!([{"role": "user", "content": "Spell the word cat."}]);
    let (private, _, none) = chat_turn(&server, &new, false);
    let (public, prompt, cached) = chat_turn(&server, &new, true);
    assert_eq!((private, none), (public, 0.0));
    assert!(cached + 4.0 < prompt, "{cached} of {prompt} kept");
}

/// `--kv-cache-mib`: a generation whose prompt and `max_tokens` could never fit the KV cache
/// budget is answered 413 before it runs (and says which option), one that fits is served,
/// and the budget held is back to 0 after it.
#[test]
fn a_generation_whose_cache_cannot_fit_is_refused_before_it_runs() {
    // SmolLM2: 30 layers of 3 KV heads of 64, f32: 46,080 bytes a token, and room for 72
    // more (the cache's rounding): 400 tokens need 21.9 MB, 4 tokens 3.6 MB.
    let server = Server::start(&[
        "--model",
        "smollm2-135m",
        "--threads",
        "2",
        "--kv-cache-mib",
        "8",
    ]);
    let e = server.refused(
        "/v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 400, "temperature": 0}"#,
        413,
    );
    assert!(e.contains("--kv-cache-mib"), "{e}");
    let (status, v) = server.post(
        "/v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 4, "temperature": 0, "speculative": false}"#,
    );
    assert_eq!(status, 200, "{v}");
    let (_, health) = server.request("GET", "/health", None);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["kv_cache_bytes_held"], 0, "{health}");
}

/// Clients that leave mid-generation, in waves, with `--parallel 4`: every running
/// generation stops and frees its sequence and its share of the KV cache, the queue drains,
/// and the server goes on answering (a bounded number of waves and requests).
#[test]
fn clients_that_leave_mid_generation_free_their_sequences() {
    let server = Server::start(&[
        "--model",
        "smollm2-135m",
        "--threads",
        "2",
        "--parallel",
        "4",
        "--backlog",
        "64",
    ]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0.7,
                      "seed": 1, "stream": true})
    .to_string();
    for _wave in 0..3 {
        let streams: Vec<TcpStream> = (0..24)
            .map(|_| raw_post(&server.addr, "/v1/completions", &body))
            .collect();
        // Half wait for their first text, the rest leave without reading.
        for s in streams.iter().step_by(2).take(4) {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut reader = BufReader::new(s);
            let mut line = String::new();
            while !line.starts_with("data: ") {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
            }
        }
        drop(streams);
    }
    let mut health = Value::Null;
    for _ in 0..600 {
        health = serde_json::from_str(&server.request("GET", "/health", None).1).unwrap();
        let idle = |k: &str| health[k] == json!(0);
        if idle("generation_running") && idle("generation_waiting") && idle("kv_cache_bytes_held") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(health["generation_running"], 0, "{health}");
    assert_eq!(health["generation_waiting"], 0, "{health}");
    assert_eq!(health["kv_cache_bytes_held"], 0, "{health}");
    assert_eq!(health["status"], "ok", "{health}");
    let (status, v) = server.post(
        "/v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 4, "temperature": 0}"#,
    );
    assert_eq!(status, 200, "{v}");
}
