//! The repeated-task workload: 30 requests of four templates with different data
//! (extract fields to JSON, rewrite a SQL query, rename in code, fill a form letter), sent in
//! sequence to one server on 127.0.0.1, as agentic pipelines send them. Each request goes
//! twice, greedy: first in `speculative` mode (prompt lookup, the server's past outputs, the
//! Shakespeare index in the model's tokens), then
//! in `neural` mode (plain decoding); the speculative one never sees its own task's plain
//! output (that comes after it), only the outputs of the requests before it.
//!
//! Prints per request and overall (after the first five): the speed-up, tokens per pass, the
//! accepted tokens by drafter, and whether the outputs are identical; then what the past-output
//! index costs: appending each output (against rebuilding a suffix array over all outputs, as a
//! static index would), and drafting from it, per generated token, as a share of a step.
//!
//! `cargo run --release --example bench_decode -- repeated [--model smollm2-135m]`

use infgram::decode::past::PastOutputs;
use infgram::server::{Limits, Server, ServerConfig};
use infgram::service::models::ModelOptions;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Requests sent; the first [`WARMUP`] fill the past outputs and are reported apart.
const REQUESTS: usize = 30;
const WARMUP: usize = 5;

/// The four templates' prompts for request `i` (template `i % 4`, data `i / 4`).
pub fn prompt(i: usize) -> String {
    const PEOPLE: [(&str, u32, &str, &str); 8] = [
        ("Maria Lopez", 34, "Madrid", "architect"),
        ("John Carter", 52, "Denver", "pilot"),
        ("Aiko Tanaka", 27, "Osaka", "nurse"),
        ("Peter Novak", 41, "Prague", "chef"),
        ("Fatima Khan", 38, "Leeds", "lawyer"),
        ("Lucas Silva", 29, "Porto", "teacher"),
        ("Anna Berg", 45, "Oslo", "engineer"),
        ("David Cohen", 63, "Haifa", "farmer"),
    ];
    const TABLES: [(&str, &str, &str, u32); 8] = [
        ("customers", "orders", "total", 100),
        ("students", "grades", "score", 80),
        ("authors", "books", "pages", 300),
        ("teams", "matches", "goals", 2),
        ("users", "payments", "amount", 50),
        ("stores", "sales", "revenue", 1000),
        ("doctors", "visits", "minutes", 30),
        ("cities", "flights", "seats", 150),
    ];
    const RENAMES: [(&str, &str, &str, u32); 8] = [
        ("filter_items", "select_expensive", "price", 20),
        ("get_old", "find_seniors", "age", 65),
        ("big_files", "large_files", "size", 1024),
        ("hot_days", "warm_days", "temperature", 30),
        ("long_books", "thick_books", "pages", 500),
        ("fast_cars", "quick_cars", "speed", 200),
        ("rich_users", "wealthy_users", "balance", 10000),
        ("tall_trees", "high_trees", "height", 40),
    ];
    const LETTERS: [(&str, &str, &str); 8] = [
        ("Mr. Brown", "March 3", "$120.00"),
        ("Ms. Green", "April 14", "$75.50"),
        ("Dr. White", "May 2", "$310.00"),
        ("Mrs. Black", "June 21", "$42.99"),
        ("Mr. Gray", "July 9", "$1,250.00"),
        ("Ms. Young", "August 30", "$18.00"),
        ("Mr. King", "September 5", "$560.25"),
        ("Mrs. Hill", "October 17", "$99.90"),
    ];
    let d = i / 4;
    match i % 4 {
        0 => {
            let (name, age, city, job) = PEOPLE[d];
            format!(
                "Extract the fields name, age, city and occupation from the text below and answer with a JSON object only.\n\nText: {name} is a {age}-year-old {job} who lives in {city}. {name} has worked as a {job} for many years."
            )
        }
        1 => {
            let (a, b, col, n) = TABLES[d];
            format!(
                "Rewrite this SQL query to use an explicit INNER JOIN instead of the comma join, and keep everything else the same:\n\nSELECT {a}.name, {b}.{col} FROM {a}, {b} WHERE {a}.id = {b}.{a}_id AND {b}.{col} > {n} ORDER BY {b}.{col} DESC;"
            )
        }
        2 => {
            let (old, new, field, n) = RENAMES[d];
            format!(
                "Rename the function `{old}` to `{new}` in this code and change nothing else:\n\ndef {old}(items):\n    result = []\n    for item in items:\n        if item.{field} > {n}:\n            result.append(item)\n    return result\n\nprint({old}(data))"
            )
        }
        _ => {
            let (name, date, amount) = LETTERS[d];
            format!(
                "Fill in this letter with the name {name}, the date {date} and the amount {amount}, and change nothing else:\n\nDear [NAME],\n\nThank you for your payment of [AMOUNT] received on [DATE]. Your account is now up to date, and no further action is needed. If you have any questions about your account, please contact our office.\n\nSincerely,\nThe Billing Team"
            )
        }
    }
}

/// What one completion reported.
struct Completion {
    text: String,
    tokens: usize,
    /// Seconds after the prompt's pass.
    seconds: f64,
    passes: usize,
    tree_passes: usize,
    accepted_by: BTreeMap<String, usize>,
}

impl Completion {
    fn of(v: &Value) -> Completion {
        let stats = &v["infgram"]["stats"];
        let f = |k: &str| stats[k].as_f64().unwrap_or(0.0);
        Completion {
            text: v["choices"][0]["text"].as_str().unwrap_or("").to_string(),
            tokens: f("tokens") as usize,
            seconds: f("seconds") - f("prompt_seconds"),
            passes: f("passes") as usize,
            tree_passes: f("tree_passes") as usize,
            accepted_by: stats["accepted_by_drafter"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0) as usize))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
}

/// Starts a server with `model` and `index` (Shakespeare in the model's tokens: the corpus
/// drafter) on 127.0.0.1, runs `f` with its URL, and shuts it down.
fn with_server<T>(model: &str, index: std::path::PathBuf, f: impl FnOnce(&str) -> T) -> T {
    let config = ServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        indexes: vec![("shakespeare".into(), index)],
        tokenizers: Vec::new(),
        model: Some(model.to_string()),
        model_options: ModelOptions {
            threads: 2,
            ..ModelOptions::default()
        },
        limits: Limits {
            generation_time: Duration::from_secs(600),
            ..Limits::default()
        },
        log_requests: false,
        past_outputs_file: None,
        corpus_rule: Default::default(),
        allowed_hosts: Vec::new(),
    };
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let server = Server::bind(config).await.expect("the server starts");
            addr_tx.send(server.local_addr()).unwrap();
            server
                .run(async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
        });
    });
    let addr = addr_rx.recv().expect("the server's address");
    let out = f(&format!("http://{addr}"));
    let _ = stop_tx.send(());
    thread.join().unwrap();
    out
}

fn complete(agent: &ureq::Agent, url: &str, prompt: &str, mode: &str) -> Value {
    let body = json!({
        "prompt": prompt, "mode": mode, "max_tokens": 256, "temperature": 0.0,
    });
    let mut response = agent
        .post(&format!("{url}/v1/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("a completion");
    let text = response.body_mut().read_to_string().unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Runs the workload with `model` (a short name or a GGUF file).
pub fn run(model: &str) {
    let source = infgram::neural::source::ModelSource::resolve(model).expect("the model");
    let path = source.path().to_path_buf();
    let tok = infgram::tokenizer::HfTokenizer::from_gguf(&path).unwrap();
    let use_chat = infgram::neural::wants_chat_turns(&path);
    let prompts: Vec<String> = (0..REQUESTS)
        .map(|i| match use_chat {
            true => infgram::neural::chat_prompt_for(&tok, &prompt(i)),
            false => prompt(i),
        })
        .collect();
    let index = infgram::service::cached_index(&[], &tok).expect("the Shakespeare index");
    let results: Vec<(Completion, Completion)> = with_server(model, index, |url| {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(900)))
            .build()
            .into();
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let spec = Completion::of(&complete(&agent, url, p, "speculative"));
                let plain = Completion::of(&complete(&agent, url, p, "neural"));
                eprintln!(
                    "request {i:2} (template {}): {} tokens, plain {:.1} tok/s, speculative {:.1} tok/s ({:.2}×), {:.2} tokens/pass, {} tree passes, by drafter {:?}",
                    i % 4,
                    spec.tokens,
                    plain.tokens_per_second(),
                    spec.tokens_per_second(),
                    spec.tokens_per_second() / plain.tokens_per_second(),
                    spec.tokens as f64 / spec.passes.max(1) as f64,
                    spec.tree_passes,
                    spec.accepted_by
                );
                (spec, plain)
            })
            .collect()
    });
    print_table(model, &results);
    print_index_cost(&tok, &results);
    print_ceiling(&path, &tok, &prompts, &results);
}

/// What no drafting policy passes on these outputs, with this machine's pass costs: the
/// drafters' ceiling (each pass drafts exactly the longest prefix of the output that the
/// braid, prompt lookup or past outputs propose, as a policy that knew the output would) and
/// a perfect drafter's (every pass 16 right tokens).
fn print_ceiling(
    path: &std::path::Path,
    tok: &dyn infgram::tokenizer::Tokenizer,
    prompts: &[String],
    results: &[(Completion, Completion)],
) {
    use infgram::decode::past::remember;
    use infgram::decode::CostModel;
    use infgram::service::generate::{drafters, AssemblyOptions};
    use infgram::service::request::DrafterSpec;
    let mut model = infgram::neural::native::decoder::Decoder::from_gguf(path)
        .unwrap()
        .with_threads(2);
    let context: Vec<u32> = (0..160).map(|i| 100 + i).collect();
    let ms = crate::mix::pass_costs(&mut model, &context);
    let cost = CostModel::from_ms(&ms).frozen();
    let past = PastOutputs::shared(infgram::decode::past::DEFAULT_BUDGET);
    let assembly = AssemblyOptions {
        drafters: vec![DrafterSpec::PromptLookup, DrafterSpec::PastOutputs],
        corpus_rule: Default::default(),
        drafting_index: None,
        repetition_penalty: 1.0,
        guard: None,
        past_outputs: Some(past.clone()),
        vocabulary: None,
    };
    let (mut ceiling, mut perfect) = (Vec::new(), Vec::new());
    for (p, (spec, _)) in prompts.iter().zip(results) {
        let prompt = tok.encode(p).unwrap();
        let output = tok.encode(&spec.text).unwrap();
        // The drafters a server's speculative completion has, but the corpus.
        let mut drafters = drafters(&assembly).unwrap();
        let (modeled, _) = crate::ceiling::ceiling(&mut drafters, &cost, &prompt, &output);
        ceiling.push(output.len() as f64 / modeled.max(1e-9));
        let (best, _) = crate::ceiling::perfect(&cost, output.len());
        perfect.push(output.len() as f64 / best.max(1e-9));
        // As the server did: the speculative and the plain output (the same text).
        remember(&past, &output);
        remember(&past, &output);
    }
    let show = |v: &[f64]| {
        let (g, min, max) = geomean(v.iter().copied());
        format!("{g:.2}× ({min:.2}–{max:.2})")
    };
    println!(
        "\nBounds after the first 5, modeled with this machine's passes ({}):\n",
        crate::ceiling::describe_costs(&ms)
    );
    println!("| bound | speed-up, geomean (min–max) |");
    println!("|---|---:|");
    println!(
        "| the drafters' ceiling (each pass drafts the longest right prefix any of them offers) | {} |",
        show(&ceiling[WARMUP..])
    );
    println!(
        "| a perfect drafter (16 right tokens a pass) | {} |",
        show(&perfect[WARMUP..])
    );
}

fn geomean(r: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let v: Vec<f64> = r.collect();
    let g = (v.iter().map(|x| x.ln()).sum::<f64>() / v.len().max(1) as f64).exp();
    let min = v.iter().copied().fold(f64::MAX, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (g, min, max)
}

/// A set of requests in figures: the speed-ups (geomean, min, max), the time ratio, tokens
/// per pass, tree passes, passes, tokens accepted from prompt / past / corpus, identical
/// outputs, requests.
struct Summary {
    speedup: (f64, f64, f64),
    time_ratio: f64,
    tokens_per_pass: f64,
    tree_passes: usize,
    passes: usize,
    accepted: [usize; 3],
    identical: usize,
    requests: usize,
}

impl Summary {
    fn of(part: &[&(Completion, Completion)]) -> Summary {
        let sum = |f: &dyn Fn(&Completion) -> usize| part.iter().map(|(s, _)| f(s)).sum::<usize>();
        let seconds = |plain: bool| -> f64 {
            part.iter()
                .map(|(s, p)| if plain { p.seconds } else { s.seconds })
                .sum()
        };
        let passes = sum(&|s| s.passes);
        let by = |d: &str| sum(&|s| s.accepted_by.get(d).copied().unwrap_or(0));
        Summary {
            speedup: geomean(
                part.iter()
                    .map(|(s, p)| s.tokens_per_second() / p.tokens_per_second()),
            ),
            time_ratio: seconds(true) / seconds(false).max(1e-9),
            tokens_per_pass: sum(&|s| s.tokens) as f64 / passes.max(1) as f64,
            tree_passes: sum(&|s| s.tree_passes),
            passes,
            accepted: [by("prompt"), by("past"), by("corpus")],
            identical: part.iter().filter(|(s, p)| s.text == p.text).count(),
            requests: part.len(),
        }
    }

    fn speedup(&self) -> String {
        let (g, min, max) = self.speedup;
        format!("{g:.2}× ({min:.2}–{max:.2})")
    }

    fn accepted(&self) -> String {
        let [p, past, c] = self.accepted;
        format!("{p} / {past} / {c}")
    }
}

fn print_table(model: &str, results: &[(Completion, Completion)]) {
    println!(
        "Repeated tasks through one server on 127.0.0.1: {REQUESTS} requests of 4 templates, greedy, 256 tokens at most, {model}, 2 threads, kernels {:?}; each request speculative (prompt lookup + past outputs + corpus) then plain; ratios of tokens/s after the prompt's pass, same run.\n",
        infgram::neural::native::kernels::Isa::detect()
    );
    println!("| requests | speed-up, geomean (min–max) | time ratio (Σ plain s / Σ speculative s) | tokens per pass | tree passes / passes | accepted: prompt / past / corpus | identical |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let requests = |keep: &dyn Fn(usize) -> bool| -> Vec<&(Completion, Completion)> {
        results
            .iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, r)| r)
            .collect()
    };
    for (name, range) in [
        ("first 5", 0..WARMUP),
        ("after the first 5", WARMUP..results.len()),
        ("all", 0..results.len()),
    ] {
        let s = Summary::of(&requests(&|i| range.contains(&i)));
        println!(
            "| {name} | {} | {:.2}× | {:.2} | {} / {} | {} | {}/{} |",
            s.speedup(),
            s.time_ratio,
            s.tokens_per_pass,
            s.tree_passes,
            s.passes,
            s.accepted(),
            s.identical,
            s.requests
        );
    }
    println!("\nPer template, after the first 5:\n");
    println!("| template | speed-up, geomean (min–max) | tokens per pass | accepted: prompt / past / corpus |");
    println!("|---|---:|---:|---:|");
    let templates = [
        "extract to JSON",
        "rewrite SQL",
        "rename in code",
        "form letter",
    ];
    for (t, name) in templates.iter().enumerate() {
        let s = Summary::of(&requests(&|i| i >= WARMUP && i % 4 == t));
        println!(
            "| {name} | {} | {:.2} | {} |",
            s.speedup(),
            s.tokens_per_pass,
            s.accepted()
        );
    }
}

/// What the past-output index costs on this workload's outputs: appending each output
/// against rebuilding a suffix array over all of them, and a draft at every position.
fn print_index_cost(tok: &dyn infgram::tokenizer::Tokenizer, results: &[(Completion, Completion)]) {
    let outputs: Vec<Vec<u32>> = results
        .iter()
        .map(|(s, _)| tok.encode(&s.text).unwrap())
        .collect();
    let tokens: usize = outputs.iter().map(Vec::len).sum();
    let step = results.iter().map(|(_, p)| p.seconds).sum::<f64>()
        / results.iter().map(|(_, p)| p.tokens).sum::<usize>().max(1) as f64;
    let mut best = (f64::MAX, f64::MAX, f64::MAX);
    let mut drafts = 0usize;
    for _ in 0..5 {
        let mut past = PastOutputs::new(infgram::decode::past::DEFAULT_BUDGET);
        let (mut append, mut rebuild, mut draft) = (0.0, 0.0, 0.0);
        drafts = 0;
        for (i, o) in outputs.iter().enumerate() {
            let t = Instant::now();
            for p in 1..=o.len() {
                std::hint::black_box(past.draft(&o[..p], 16));
            }
            draft += t.elapsed().as_secs_f64();
            drafts += o.len();
            let t = Instant::now();
            past.append(o);
            append += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let spec = infgram::tokenizer::TokenizerSpec::synthetic(tok.vocab_size());
            let docs: Vec<Vec<u32>> = outputs[..=i].to_vec();
            std::hint::black_box(
                infgram::Index::from_docs(spec, &docs, docs.len(), false).unwrap(),
            );
            rebuild += t.elapsed().as_secs_f64();
        }
        best = (best.0.min(append), best.1.min(rebuild), best.2.min(draft));
    }
    let per = |s: f64| 1e6 * s / tokens.max(1) as f64;
    println!(
        "\nThe past-output index on these {} outputs ({tokens} tokens; fastest of 5; a plain step took {:.2} ms):\n",
        outputs.len(),
        1e3 * step
    );
    println!("| operation | µs per generated token | share of a step |");
    println!("|---|---:|---:|");
    println!(
        "| append the output to the suffix automaton | {:.3} | {:.3}% |",
        per(best.0),
        100.0 * best.0 / tokens.max(1) as f64 / step
    );
    println!(
        "| rebuild a suffix array over all outputs after each request (instead) | {:.3} | {:.3}% |",
        per(best.1),
        100.0 * best.1 / tokens.max(1) as f64 / step
    );
    println!(
        "| draft 16 tokens at a position | {:.3} | {:.3}% |",
        1e6 * best.2 / drafts.max(1) as f64,
        100.0 * best.2 / drafts.max(1) as f64 / step
    );
}
