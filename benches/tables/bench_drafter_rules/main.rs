//! The corpus drafter's two rules on one index: what a draft costs and how many tokens a step
//! keeps, for prompt lookup alone and beside the corpus drafter under each rule (SBIS, the
//! default; the ∞-gram's longest suffix alone).
//!
//!     cargo run --release --example bench_drafter_rules -- INDEX TOKENIZER FILE...
//!
//! INDEX: an index in the tokens of TOKENIZER (a name or a `tokenizer.json`); FILE: held-out
//! texts. Each file gives one request: 200 tokens at a spread offset as the prompt, the next
//! 1,088 as the continuation a verifier keeps. A FILE ending in `.json` is a list of requests
//! instead, `[[prompt_ids, continuation_ids], …]`, as `bench_drafter.py --save-requests`
//! writes them (the model's greedy continuations: the Python protocol's requests). Each step drafts 16 tokens (a
//! `decode::session::DraftSession`, as `infgram.Drafter` runs it) and keeps the continuation's
//! tokens the draft got right, plus one. Times are of `draft` and of `extend` (with the kept
//! tokens), in this thread; each rule runs
//! on the index opened anew (an empty counts cache; the page cache as the earlier rows left it).

use infgram::decode::drafters::{CorpusDrafter, CorpusRule, PromptLookup};
use infgram::decode::session::DraftSession;
use infgram::decode::Drafter;
use infgram::Index;
use std::sync::Arc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: bench_drafter_rules INDEX TOKENIZER FILE...");
        std::process::exit(2);
    }
    let open = || Arc::new(Index::open(std::path::Path::new(&args[0])).expect("the index"));
    let tok = infgram::service::load_tokenizer(&args[1]).expect("the tokenizer");
    let mut requests = Vec::new();
    for (r, file) in args[2..].iter().enumerate() {
        if file.ends_with(".json") {
            let text = std::fs::read_to_string(file).expect("a requests file");
            let list: Vec<(Vec<u32>, Vec<u32>)> =
                serde_json::from_str(&text).expect("[[prompt_ids, continuation_ids], …]");
            requests.extend(list);
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a held-out text");
        let t = tok.encode(&text).expect("tokens");
        if t.len() < 1400 {
            continue;
        }
        let at = (r * 997) % (t.len() - 1300);
        requests.push((t[at..at + 200].to_vec(), t[at + 200..at + 1288].to_vec()));
    }
    println!("{} requests over {}\n", requests.len(), args[0]);
    println!(
        "| drafting | draft p50 µs | draft p90 µs | draft mean µs | extend p50 µs | tokens per step | calls |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let rules: [(&str, Option<CorpusRule>); 3] = [
        ("prompt lookup alone", None),
        (
            "+ corpus, SBIS (default)",
            Some(CorpusRule::Sbis { decay: 0.1 }),
        ),
        ("+ corpus, longest suffix", Some(CorpusRule::MostFrequent)),
    ];
    for (label, rule) in rules {
        // Each rule on the index opened anew: its own (empty) counts cache.
        let index = open();
        let (mut times, mut extends, mut kept) = (Vec::new(), Vec::new(), 0usize);
        for (prompt, truth) in &requests {
            let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(PromptLookup::new(8))];
            if let Some(rule) = rule {
                drafters.push(Box::new(CorpusDrafter::with_rule(index.clone(), rule)));
            }
            let mut session = DraftSession::start(drafters, prompt);
            let mut pos = 0;
            while pos + 17 < truth.len() {
                let t0 = std::time::Instant::now();
                let d = session.draft(16, false).expect("a draft");
                times.push(t0.elapsed().as_secs_f64() * 1e6);
                let k = d
                    .token_ids
                    .iter()
                    .zip(&truth[pos..])
                    .take_while(|(a, b)| a == b)
                    .count();
                let t0 = std::time::Instant::now();
                session.extend(&truth[pos..pos + k + 1]);
                extends.push(t0.elapsed().as_secs_f64() * 1e6);
                pos += k + 1;
                kept += k + 1;
            }
        }
        let n = times.len().max(1);
        let mean = times.iter().sum::<f64>() / n as f64;
        times.sort_by(f64::total_cmp);
        extends.sort_by(f64::total_cmp);
        let at = |q: f64| times.get((q * n as f64) as usize).copied().unwrap_or(0.0);
        let extend = extends.get(extends.len() / 2).copied().unwrap_or(0.0);
        println!(
            "| {label} | {:.1} | {:.1} | {mean:.1} | {extend:.2} | {:.3} | {} |",
            at(0.5),
            at(0.9),
            kept as f64 / n as f64,
            times.len()
        );
    }
}
