//! `infgram gen --model M --batch FILE`: many generations at once, offline. FILE (or `-`,
//! standard input) holds one request a line, the library's `GenerateRequest` in JSON
//! (`{"prompt": "…"}`, or `{"prompt": {"messages": […]}}`, with `sampling`, `limits`,
//! `drafters` as the server takes them; the scorer is the model unless the line says
//! otherwise); the answers come out on standard output as JSON lines, one a request in the
//! file's order, each the report `gen --json` gives (or `{"error": …}` for a request that
//! failed). Up to `--parallel` run at once and share the model's passes (the native CPU
//! backend; another runs them one at a time), each answer the one the request gets alone.

use super::gen::GenArgs;
use anyhow::{Context, Result};
use infgram::service::models::LanguageModel;
use infgram::service::request::CheckedRequest;
use infgram::service::{generate, GenerateRequest, Resources, RunOptions};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::channel;

/// The requests of `file`, checked, a line each (blank lines skipped).
fn read_requests(file: &Path) -> Result<Vec<CheckedRequest>> {
    let mut text = String::new();
    if file == Path::new("-") {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read --batch {}", file.display()))?;
    }
    let mut requests = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("--batch {} line {}", file.display(), i + 1);
        let mut v: Value = serde_json::from_str(line).with_context(at)?;
        if let Some(fields) = v.as_object_mut() {
            fields
                .entry("scorer")
                .or_insert_with(|| serde_json::json!({"kind": "model"}));
        }
        let request: GenerateRequest = serde_json::from_value(v)
            .with_context(|| format!("{}: not a generation request", at()))?;
        let checked = request
            .check(infgram::service::request::MAX_GEN_TOKENS)
            .with_context(at)?;
        requests.push(checked);
    }
    Ok(requests)
}

/// Runs `gen --batch`.
pub fn run_batch(args: &GenArgs, model: &str, file: &Path) -> Result<()> {
    let requests = read_requests(file)?;
    let opts = infgram::service::models::ModelOptions {
        tokenizer: args.tokenizer.clone(),
        ..args.model_args.options()
    };
    let mut loaded = infgram::service::models::load_model(model, &opts)?;
    let batcher = match loaded.model.sequences().is_some() {
        true => Some(loaded.batch(Default::default())?),
        false => None,
    };
    let (costs, tok) = (loaded.pass_costs(), loaded.tokenizer.clone());
    let name = loaded.path.display().to_string();
    // Without a batcher, one worker owns the model.
    let workers = if batcher.is_some() {
        args.parallel
            .unwrap_or_else(|| costs.rows_worth_batching())
            .max(1)
    } else {
        1
    };
    let mut own = batcher.is_none().then_some(loaded.model);
    let next = AtomicUsize::new(0);
    let (done, answers) = channel::<(usize, Value)>();
    let failed = std::thread::scope(|s| -> Result<usize> {
        for w in 0..workers {
            let (done, next, requests, tok, name, costs) =
                (done.clone(), &next, &requests, &tok, &name, &costs);
            let batcher = batcher.clone();
            let mut own = if w == 0 { own.take() } else { None };
            s.spawn(move || loop {
                let i = next.fetch_add(1, Relaxed);
                let Some(request) = requests.get(i) else {
                    return;
                };
                let mut sequence = None;
                let model: &mut dyn LanguageModel = match (&batcher, own.as_mut()) {
                    (Some(b), _) => match b.sequence() {
                        Ok(m) => sequence.insert(m),
                        Err(e) => {
                            let _ = done.send((i, serde_json::json!({"error": e.to_string()})));
                            continue;
                        }
                    },
                    (None, Some(m)) => m.as_mut(),
                    (None, None) => return,
                };
                let mut res = Resources::model(model, tok, name.as_str()).pass_costs(costs.clone());
                let answer = match generate(request, &mut res, &RunOptions::default(), |_| {}) {
                    Ok(report) => serde_json::to_value(&report)
                        .unwrap_or_else(|e| serde_json::json!({"error": e.to_string()})),
                    Err(e) => serde_json::json!({"error": e.to_string()}),
                };
                let _ = done.send((i, answer));
            });
        }
        drop(done);
        // The answers in the file's order, each as soon as those before it are out.
        let (mut waiting, mut at, mut failed) = (BTreeMap::new(), 0, 0);
        let mut out = std::io::stdout().lock();
        for (i, answer) in answers {
            waiting.insert(i, answer);
            while let Some(answer) = waiting.remove(&at) {
                failed += usize::from(answer.get("error").is_some());
                writeln!(out, "{answer}")?;
                out.flush()?;
                at += 1;
            }
        }
        Ok(failed)
    })?;
    match failed {
        0 => Ok(()),
        n => anyhow::bail!(
            "{n} of the {} requests failed (their lines say why)",
            requests.len()
        ),
    }
}
