//! Classic n-gram models end to end, infgram against KenLM on the same machine and text: estimate
//! an order-5 modified Kneser–Ney model of a training text (words, one sentence a line) and score
//! a held-out text with it. KenLM: `lmplz -o 5` then `query` on its ARPA file. infgram: `index
//! --tokenizer words --sentences` then `ppl --estimator mkn --order 5 --sentences` (the index
//! is built once; any order after it is free, so orders 10 and ∞ are timed on the same index).
//! Every command runs as a process under `/usr/bin/time` (wall seconds, peak resident memory),
//! `--repeats` times (min–max); both perplexities are printed so the equality is visible.
//!
//! `cargo run --release --example bench_ngram [-- --train T --val V --repeats 3]` (default: Tiny
//! Shakespeare's train and val parts; `bash python/kenlm-oracle.sh VENV` builds `lmplz` and
//! `query` into target/kenlm).
//!
//! The Linux table of BENCHMARKS.md: `apt-get install linux-source-6.1`, unpack
//! `/usr/src/linux-source-6.1.tar.xz` into /tmp/linux, and write the two texts with
//!
//! ```text
//! import os, hashlib
//! root = '/tmp/linux/linux-source-6.1'
//! train, val = open('/tmp/linux/train.txt', 'w'), open('/tmp/linux/val.txt', 'w')
//! for d, _, fs in os.walk(root):
//!     for f in sorted(fs):
//!         if not f.endswith(('.c', '.h')): continue
//!         p = os.path.join(d, f)
//!         try: t = open(p, encoding='utf-8').read().replace('\0', ' ')
//!         except Exception: continue
//!         t += '' if t.endswith('\n') else '\n'
//!         key = ('infgram-ngram:' + os.path.relpath(p, root)).encode()
//!         held = int(hashlib.sha1(key).hexdigest(), 16) % 200 == 0
//!         (val if held else train).write(t)
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// infgram against KenLM on one training text.
#[derive(clap::Parser)]
struct Args {
    /// Training text (one sentence a line; default: Tiny Shakespeare's train part).
    #[arg(long)]
    train: Option<PathBuf>,
    /// Held-out text (default: Tiny Shakespeare's val part).
    #[arg(long)]
    val: Option<PathBuf>,
    /// Runs of each command.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// KenLM's build directory (holding bin/lmplz and bin/query).
    #[arg(long, default_value = "target/kenlm/build/bin")]
    kenlm: PathBuf,
    /// The model's order.
    #[arg(long, default_value_t = 5)]
    order: usize,
}

/// One command's wall seconds and peak resident memory (MB), and its standard output.
fn timed(cmd: &mut Command, stdin: Option<&Path>, stdout: Option<&Path>) -> (f64, f64, String) {
    let mut full = Command::new("/usr/bin/time");
    full.arg("-f")
        .arg("@@%e %M")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(p) = stdin {
        full.stdin(std::fs::File::open(p).expect("stdin file"));
    }
    match stdout {
        Some(p) => full.stdout(std::fs::File::create(p).expect("stdout file")),
        None => full.stdout(Stdio::piped()),
    };
    let out = full
        .stderr(Stdio::piped())
        .output()
        .expect("run under /usr/bin/time");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{:?} failed: {err}",
        cmd.get_program()
    );
    let line = err
        .lines()
        .rev()
        .find(|l| l.starts_with("@@"))
        .expect("time's line");
    let mut f = line[2..].split(' ');
    let secs: f64 = f.next().unwrap().parse().unwrap();
    let kb: f64 = f.next().unwrap().parse().unwrap();
    (
        secs,
        kb / 1e3,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `infgram ppl --estimator mkn` of `val` at `order` over `index`, as JSON.
fn ppl_command(infgram: &Path, index: &Path, val: &Path, order: usize, fallback: bool) -> Command {
    let mut c = Command::new(infgram);
    c.args(["ppl", "--estimator", "mkn", "--sentences", "--json"])
        .args(["--order", &order.to_string(), "--index"])
        .arg(index)
        .arg("--text")
        .arg(val);
    if fallback {
        c.arg("--discount-fallback");
    }
    c
}

fn spread(xs: &[f64]) -> String {
    let min = xs.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = xs.iter().cloned().fold(0.0, f64::max);
    format!("{min:.2}–{max:.2}")
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let infgram = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("../infgram");
    assert!(
        infgram.exists(),
        "build the binary first: cargo build --release"
    );
    let tmp = tempfile::tempdir().unwrap();
    let (train, val) = match (&args.train, &args.val) {
        (Some(t), Some(v)) => (t.clone(), v.clone()),
        _ => {
            let (train, val) = infgram::assets::tiny_shakespeare_split().unwrap();
            // lmplz drops the </s> of a last line without a line feed: give both one.
            let t = tmp.path().join("train.txt");
            std::fs::write(&t, train + "\n").unwrap();
            let v = tmp.path().join("val.txt");
            std::fs::write(&v, val).unwrap();
            (t, v)
        }
    };
    let (lmplz, query) = (args.kenlm.join("lmplz"), args.kenlm.join("query"));
    assert!(
        lmplz.exists() && query.exists(),
        "KenLM is not built at {}: bash python/kenlm-oracle.sh VENV",
        args.kenlm.display()
    );
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        .unwrap_or_default();
    println!(
        "machine: {cpu}, {} threads; train {} bytes, order {}",
        rayon::current_num_threads(),
        std::fs::metadata(&train).unwrap().len(),
        args.order
    );
    let arpa = tmp.path().join("lm.arpa");
    let index = tmp.path().join("index");
    let order = args.order.to_string();
    let mut rows: Vec<(&str, Vec<f64>, f64)> = vec![
        ("lmplz (estimate, write ARPA)", vec![], 0.0),
        ("query (load ARPA, score)", vec![], 0.0),
        ("infgram index --tokenizer words --sentences", vec![], 0.0),
        ("infgram ppl --estimator mkn (estimate, score)", vec![], 0.0),
    ];
    let (mut kenlm_ppl, mut ours_ppl) = (String::new(), 0.0);
    for _ in 0..args.repeats {
        let mut record = |i: usize, (s, mb, out): (f64, f64, String)| {
            rows[i].1.push(s);
            rows[i].2 = f64::max(rows[i].2, mb);
            out
        };
        let mut c = Command::new(&lmplz);
        c.args(["-o", &order, "-S", "2G", "-T"]).arg(tmp.path());
        record(0, timed(&mut c, Some(&train), Some(&arpa)));
        let out = record(1, timed(Command::new(&query).arg(&arpa), Some(&val), None));
        kenlm_ppl = out
            .lines()
            .find(|l| l.starts_with("Perplexity including OOVs"))
            .unwrap_or("")
            .to_string();
        let mut c = Command::new(&infgram);
        c.args([
            "index",
            "--tokenizer",
            "words",
            "--sentences",
            "--force",
            "-o",
        ])
        .arg(&index)
        .arg(&train);
        record(2, timed(&mut c, None, None));
        let mut c = ppl_command(&infgram, &index, &val, args.order, false);
        let out = record(3, timed(&mut c, None, None));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        ours_ppl = v["ppl"].as_f64().unwrap();
    }
    println!(
        "\n| step | seconds (min–max of {}) | peak MB |",
        args.repeats
    );
    println!("|---|---:|---:|");
    for (name, secs, mb) in &rows {
        println!("| {name} | {} | {mb:.0} |", spread(secs));
    }
    let best = |i: usize| rows[i].1.iter().cloned().fold(f64::INFINITY, f64::min);
    let (kenlm, ours) = (best(0) + best(1), best(2) + best(3));
    println!(
        "\nend to end (best runs): KenLM {kenlm:.2} s, infgram {ours:.2} s: infgram {:.1}× faster",
        kenlm / ours
    );
    println!("KenLM: {kenlm_ppl}; infgram: perplexity {ours_ppl:.4}");

    // Any order from the same index: 10, and ∞ (the longest sentence: no longer n-gram exists;
    // capped at 64, since the count pass keeps a table per order).
    let longest = std::fs::read_to_string(&train)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().count() + 2)
        .max()
        .unwrap_or(2);
    let (infinite, capped) = (longest.min(64), longest > 64);
    println!("\n| order | perplexity | seconds (estimate + score) |");
    println!("|---:|---:|---:|");
    for (label, n) in [
        (order.clone(), args.order),
        ("10".to_string(), 10),
        (
            if capped {
                format!("64 (longest sentence: {longest})")
            } else {
                format!("∞ (= {longest})")
            },
            infinite,
        ),
    ] {
        let mut c = ppl_command(&infgram, &index, &val, n, true);
        let (secs, _, out) = timed(&mut c, None, None);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        println!(
            "| {label} | {:.2} | {secs:.2} |",
            v["ppl"].as_f64().unwrap()
        );
    }
}
