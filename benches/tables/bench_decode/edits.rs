//! Code edits with a real coder model: speculative decoding against plain decoding, as a user
//! of `infgram gen --model M --speculative` (or a greedy chat completion) gets it.
//!
//! The tasks: 32 functions of CPython's standard library (the `python3` on this machine; its
//! version is printed), each with an edit instruction (rename, type hints, a parameter, a
//! rewrite), asked through the model's own chat template as "INSTRUCTION Answer with the whole
//! edited function in a Python code block." plus the function in a code block; and the five
//! open questions of the other benchmarks. Greedy, the service's speculative drafters (prompt
//! lookup; no index), each task decoded speculatively and then plainly (`compare`): the speed-up,
//! tokens per pass and whether the two outputs are the same. A second table sets each draft
//! token's confidence, as its drafter gave it, against whether the model accepted it: per set
//! and band of confidence, the tokens tried (those up to a pass's first rejection) and the
//! share accepted, for all of them and for a draft's first token alone. A third gives what
//! the speculative passes cost as decoding timed them, per rows fed, in steps (the mean of
//! the set's one-row passes), beside the load-time calibration the drafts start from.
//!
//! With `--modeled`, drafts are planned from the load-time calibration frozen
//! (`CostModel::frozen`; `--costs MS,…` a given table instead) and plain decoding is not run:
//! every run makes the same passes, and each task's speed-up is modeled as its tokens over
//! the table cost of its passes, as `bench_decode policy` does with SmolLM2: drafting
//! policies compared on this model free of timing noise.
//!
//! `cargo run --release --example bench_decode -- edits --model qwen2.5-coder-0.5b`;
//! `--dump FILE` writes the conversations as JSON lines (`{"set", "messages"}`) for
//! `scripts/llama-server-edits.py`, which runs the same tasks through llama.cpp's server.

use crate::confidences::Confidences;
use infgram::decode::policy::CALIBRATED_SIZES;
use infgram::decode::CostModel;
use infgram::service::chat::Message;
use infgram::service::models::{load_model, Device, ModelOptions};
use infgram::service::request::{defaults, GenLimits, GenerateRequest, Prompt, Sampling, Scorer};
use infgram::service::run::GenerationReport;
use infgram::service::{generate, Resources, RunOptions};
use std::path::{Path, PathBuf};

/// (file of the standard library, function, instruction).
pub const TASKS: [(&str, &str, &str); 32] = [
    ("textwrap.py", "indent", "Add type hints to the parameters and the return value."),
    ("shlex.py", "quote", "Rename the parameter `s` to `text` everywhere in this function."),
    ("fnmatch.py", "filter", "Rename the variable `result` to `matches` everywhere."),
    ("posixpath.py", "relpath", "Rename the parameter `start` to `base` everywhere in this function."),
    ("posixpath.py", "commonpath", "Add a short comment above each `if` statement saying what it checks."),
    ("glob.py", "glob", "Change the default value of `recursive` to True and update the docstring to say so."),
    ("heapq.py", "_siftup", "Rename `childpos` to `child` and `rightpos` to `right` everywhere."),
    ("bisect.py", "bisect_left", "Remove the docstring and keep the code unchanged."),
    ("colorsys.py", "rgb_to_hls", "Add type hints: the three parameters are floats and the function returns a tuple of three floats."),
    ("colorsys.py", "hsv_to_rgb", "Rewrite the chain of `if` statements on `i` as a lookup in a tuple of tuples."),
    ("statistics.py", "median", "Rename the variable `n` to `count` everywhere in this function."),
    ("statistics.py", "mode", "Rename the variable `pairs` to `counts` everywhere in this function."),
    ("statistics.py", "multimode", "Add type hints to the parameter and the return value."),
    ("statistics.py", "covariance", "Rename the parameters `x` and `y` to `xs` and `ys` everywhere."),
    ("base64.py", "b64decode", "Rename the parameter `validate` to `strict` everywhere, the docstring included."),
    ("base64.py", "b16decode", "Rename the parameter `casefold` to `ignore_case` everywhere, the docstring included."),
    ("base64.py", "b85encode", "Add type hints to the parameters and the return value."),
    ("quopri.py", "unhex", "Add a docstring that says what the function returns."),
    ("html/__init__.py", "escape", "Add a parameter `apostrophe=True` that says whether single quotes are escaped, and use it."),
    ("difflib.py", "IS_CHARACTER_JUNK", "Change the default of `ws` to also hold the newline character."),
    ("difflib.py", "restore", "Rename `which` to `side` everywhere in this function."),
    ("string.py", "capwords", "Add type hints to the parameters and the return value."),
    ("genericpath.py", "commonprefix", "Rename `m` to `paths` everywhere in this function."),
    ("shutil.py", "copyfileobj", "Rename `fsrc` to `source` and `fdst` to `destination` everywhere."),
    ("shutil.py", "ignore_patterns", "Add type hints to the outer and the inner function."),
    ("shutil.py", "copy2", "Rename the parameter `follow_symlinks` to `follow_links` everywhere, the docstring included."),
    ("tokenize.py", "untokenize", "Rename the variable `out` to `result` everywhere in this function."),
    ("gettext.py", "_expand_lang", "Rename `mask` to `flags` everywhere in this function."),
    ("mimetypes.py", "guess_extension", "Add type hints to the parameters and the return value."),
    ("ipaddress.py", "ip_network", "Rename the parameter `strict` to `exact` everywhere, the docstring included."),
    ("urllib/parse.py", "urldefrag", "Rename the variable `frag` to `fragment` everywhere in this function."),
    ("urllib/parse.py", "quote_plus", "Rename the parameter `safe` to `allowed` everywhere, the docstring included."),
];

/// The standard library of the `python3` on this machine, and its version.
fn stdlib() -> (PathBuf, String) {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, sysconfig; print(sysconfig.get_paths()['stdlib']); print(sys.version.split()[0])",
        ])
        .output()
        .expect("python3 (the standard library's source is the tasks' code)");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    (
        PathBuf::from(lines.next().unwrap()),
        lines.next().unwrap_or("?").to_string(),
    )
}

/// The source of the top-level function `name` of `file`: its `def` line and every line after
/// it up to the next line that starts at the left margin.
fn function(file: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("def {name}(")))
        .unwrap_or_else(|| panic!("no function {name} in {}", file.display()));
    let end = (start + 1..lines.len())
        .find(|&i| !lines[i].is_empty() && !lines[i].starts_with([' ', '\t', ')']))
        .unwrap_or(lines.len());
    let mut body: Vec<&str> = lines[start..end].to_vec();
    while body.last().is_some_and(|l| l.trim().is_empty()) {
        body.pop();
    }
    body.join("\n") + "\n"
}

/// The conversations of the benchmark: (set, the user's message).
pub fn conversations() -> (Vec<(&'static str, String)>, String) {
    let (lib, version) = stdlib();
    let mut out: Vec<(&str, String)> = TASKS
        .iter()
        .map(|(file, name, instruction)| {
            let code = function(&lib.join(file), name);
            let ask = format!(
                "{instruction} Answer with the whole edited function in a Python code block.\n\n```python\n{code}```"
            );
            ("code edits", ask)
        })
        .collect();
    out.extend(
        crate::prompts::OPEN
            .iter()
            .map(|q| ("open questions", q.to_string())),
    );
    (out, version)
}

/// One set's results.
#[derive(Default)]
struct Row {
    ratios: Vec<f64>,
    plain_tps: Vec<f64>,
    spec_tps: Vec<f64>,
    tokens: usize,
    passes: usize,
    identical: usize,
    confidences: Confidences,
    /// Per rows fed (index), the speculative passes' seconds and count.
    pass_seconds: Vec<(f64, usize)>,
}

impl Row {
    /// Adds a task's report: timed against plain decoding, or with `modeled`, its speed-up
    /// modeled with that frozen table.
    fn add(&mut self, r: &GenerationReport, modeled: Option<&CostModel>) {
        let stats = r.stats.as_ref().expect("a model's stats");
        self.tokens += stats.tokens;
        self.passes += stats.passes;
        if let Some(cost) = modeled {
            let passes: f64 = stats.trace.iter().map(|t| cost.cost(t.drafted + 1)).sum();
            self.ratios.push(stats.tokens as f64 / passes.max(1.0));
        } else {
            // Decoding speeds (the prompt's pass left out), as `compare` measures both.
            let c = r.comparison.expect("compare ran");
            let (plain, speedup) = (
                c.plain_tokens_per_second.expect("plain decoding ran"),
                c.speedup.expect("plain decoding ran"),
            );
            self.ratios.push(speedup);
            self.plain_tps.push(plain);
            self.spec_tps.push(plain * speedup);
            self.identical += usize::from(c.identical == Some(true));
        }
        for pass in &stats.trace {
            let rows = pass.drafted + 1;
            if self.pass_seconds.len() <= rows {
                self.pass_seconds.resize(rows + 1, (0.0, 0));
            }
            self.pass_seconds[rows].0 += pass.seconds;
            self.pass_seconds[rows].1 += 1;
        }
        self.confidences.add(&stats.trace);
    }

    /// The pass-cost table's row of this set: rows fed, passes and their mean cost in steps,
    /// for every size timed at least three times.
    fn print_costs(&self, set: &str) {
        let mean = |(s, n): (f64, usize)| s / n.max(1) as f64;
        let Some(&step) = self.pass_seconds.get(1) else {
            return;
        };
        let cells: Vec<String> = self
            .pass_seconds
            .iter()
            .enumerate()
            .filter(|(rows, &(_, n))| *rows > 1 && n >= 3)
            .map(|(rows, &t)| format!("{rows}: {:.2} ({})", mean(t) / mean(step), t.1))
            .collect();
        println!(
            "| {set} | {:.2} ms ({}) | {} |",
            mean(step) * 1e3,
            step.1,
            cells.join(", ")
        );
    }

    /// The set's row of the main table (with `modeled`, the speed-ups modeled and each
    /// task's listed after the row; no speeds or comparison).
    fn print(&self, set: &str, modeled: bool) {
        let geo = |v: &[f64]| (v.iter().map(|r| r.ln()).sum::<f64>() / v.len().max(1) as f64).exp();
        let min = self.ratios.iter().copied().fold(f64::MAX, f64::min);
        let max = self.ratios.iter().copied().fold(0.0, f64::max);
        let mean = |v: &[f64]| format!("{:.1}", v.iter().sum::<f64>() / v.len().max(1) as f64);
        let (plain, spec, identical) = match modeled {
            true => ("–".into(), "–".into(), "–".into()),
            false => (
                mean(&self.plain_tps),
                mean(&self.spec_tps),
                format!("{}/{}", self.identical, self.ratios.len()),
            ),
        };
        println!(
            "| {set} | {} | {plain} | {spec} | {:.2}× ({:.2}–{:.2}) | {:.2} | {identical} |",
            self.ratios.len(),
            geo(&self.ratios),
            min,
            max,
            self.tokens as f64 / self.passes.max(1) as f64,
        );
    }
}

/// How the drafts are planned and the speed-ups measured.
pub enum Plan {
    /// The live cost model; timed against plain decoding.
    Timed,
    /// A frozen table, the load-time calibration's or the milliseconds of passes of 1, 2, 4,
    /// 8 and 16 rows given; speed-ups modeled with it.
    Modeled(Option<Vec<f64>>),
}

/// Runs the benchmark with `model`, `max_tokens` a task, `threads` threads (0: one per core),
/// on `device` (on the CPU with the kernels' instruction set `isa`, default the best), as
/// `plan` says; with `dump`, only writes the conversations there.
pub fn run(
    model: &str,
    max_tokens: usize,
    threads: usize,
    device: Device,
    dump: Option<PathBuf>,
    isa: Option<String>,
    plan: Plan,
) {
    let (tasks, version) = conversations();
    if let Some(path) = dump {
        let lines: Vec<String> = tasks
            .iter()
            .map(|(set, ask)| {
                serde_json::json!({"set": set, "messages": [{"role": "user", "content": ask}]})
                    .to_string()
            })
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        eprintln!(
            "{} conversations written to {}",
            tasks.len(),
            path.display()
        );
        return;
    }
    let opts = ModelOptions {
        threads,
        device,
        isa,
        ..ModelOptions::default()
    };
    let mut loaded = match load_model(model, &opts) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let tok = loaded.tokenizer.clone();
    // The instruction set the kernels run (the load took `--isa`, so it names one).
    let kernels = opts
        .kernels_isa()
        .map_or_else(|e| e.to_string(), |isa| format!("{isa:?}"));
    println!(
        "{} code edits from Python {version}'s standard library and {} open questions, \
         {model}, greedy, at most {max_tokens} tokens, on {device:?} (CPU kernels: {kernels}), {} \
         threads",
        TASKS.len(),
        crate::prompts::OPEN.len(),
        if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        }
    );
    let calibration = loaded.pass_costs();
    let modeled = match plan {
        Plan::Timed => None,
        Plan::Modeled(None) => Some(calibration.clone().frozen()),
        Plan::Modeled(Some(ms)) => {
            Some(CostModel::from_ms(&crate::ceiling::given_costs(ms)).frozen())
        }
    };
    if let Some(cost) = &modeled {
        println!(
            "Drafts planned and weighed with a frozen table: {}",
            describe(cost)
        );
    }
    let mut rows: Vec<(&str, Row)> = Vec::new();
    for (i, (set, ask)) in tasks.iter().enumerate() {
        let request = GenerateRequest {
            prompt: Prompt::Chat {
                messages: vec![Message::new("user", ask)],
                parse_special: false,
            },
            scorer: Scorer::Model,
            drafters: defaults::SPECULATIVE_DRAFTERS.to_vec(),
            sampling: Sampling {
                temperature: Some(0.0),
                ..Default::default()
            },
            limits: GenLimits {
                max_tokens: Some(max_tokens),
                ..Default::default()
            },
            ..Default::default()
        }
        .check(max_tokens)
        .unwrap();
        let run = RunOptions {
            compare: modeled.is_none(),
            trace: true,
            ..Default::default()
        };
        let costs = modeled.clone().unwrap_or_else(|| calibration.clone());
        let mut res = Resources::model(loaded.model.as_mut(), &tok, model).pass_costs(costs);
        let report = generate(&request, &mut res, &run, |_| {}).unwrap();
        if let Some(c) = report.comparison {
            let (plain, speedup) = (
                c.plain_tokens_per_second.unwrap_or(0.0),
                c.speedup.unwrap_or(0.0),
            );
            eprintln!(
                "{set} #{i}: {} tokens, plain {plain:.1} tok/s, speculative {:.1} tok/s ({speedup:.2}×), {}",
                report.tokens,
                plain * speedup,
                if c.identical == Some(true) {
                    "identical"
                } else {
                    "DIFFERENT"
                }
            );
        }
        match rows.iter_mut().find(|r| r.0 == *set) {
            Some(r) => r.1.add(&report, modeled.as_ref()),
            None => {
                let mut row = Row::default();
                row.add(&report, modeled.as_ref());
                rows.push((set, row));
            }
        }
    }
    println!("| set | tasks | plain tokens/s | speculative tokens/s | speed-up, geometric mean (min–max) | tokens per pass | identical |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (set, row) in &rows {
        row.print(set, modeled.is_some());
    }
    if modeled.is_some() {
        println!("\nModeled speed-up of each task, in order:\n");
        for (set, row) in &rows {
            let each: Vec<String> = row.ratios.iter().map(|r| format!("{r:.2}")).collect();
            println!("- {set}: {}", each.join(", "));
        }
    }
    Confidences::print_header();
    for (set, row) in &rows {
        row.confidences.print_rows(set);
    }
    println!(
        "\nSpeculative passes as decoding timed them, in steps (passes in brackets); the drafts \
         start from the load-time calibration: {}\n",
        describe(&calibration)
    );
    println!("| set | step | rows fed: steps (passes) |");
    println!("|---|---:|---|");
    for (set, row) in &rows {
        row.print_costs(set);
    }
}

/// A cost table's passes of [`CALIBRATED_SIZES`] rows, in steps.
fn describe(cost: &CostModel) -> String {
    CALIBRATED_SIZES
        .iter()
        .map(|&n| format!("{n} rows {:.2}", cost.cost(n)))
        .collect::<Vec<_>>()
        .join(", ")
}
