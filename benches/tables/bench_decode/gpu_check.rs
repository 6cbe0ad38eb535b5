//! The GPU's fused kernels checked on a real model, on the device (a `cuda` build):
//! 1. against their CPU reference (`neural::gpu::reference`, the kernels' order of operations
//!    on the CPU): relative distance, largest difference, same argmax, bit-identical rows;
//! 2. against the native CPU pass (the bound two implementations keep);
//! 3. batch invariance on the GPU: a prompt in one pass against k-token passes and one token at
//!    a time, and a token tree against its branches fed as chains, bit for bit;
//! 4. CUDA graphs against launches one by one, bit for bit;
//! 5. the device's greedy picks (`RowForm::Greedy`) against `lm::first_max` of the same rows;
//! 6. several sequences in one pass (each in its own room of the cache, the cache grown as they
//!    are added, one started from a copy of another's positions) against each alone.
//!
//! `bench_decode gpu-check --model smollm2-135m` (`scripts/device-check.sh` runs it).

use infgram::lm::{LanguageModel, Logits, RowForm};
use infgram::neural::gpu::reference::ReferenceDecoder;
use infgram::neural::native::decoder::Decoder;
use infgram::service::models::{Backend, Device, ModelOptions};
use std::time::Instant;

fn gpu(path: &std::path::Path, graphs: bool) -> Box<dyn LanguageModel> {
    // Read at load; set before any other thread runs (this program has one).
    std::env::set_var("INFGRAM_CUDA_GRAPHS", if graphs { "1" } else { "0" });
    let opts = ModelOptions {
        backend: Backend::Native,
        device: Device::Cuda,
        ..ModelOptions::default()
    };
    match infgram::service::models::load_model(&path.to_string_lossy(), &opts) {
        Ok(m) => m.model,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

/// ‖a − b‖ / ‖b‖, the largest |a − b|, and whether the argmax agrees.
fn compare(a: &[f32], b: &[f32]) -> (f64, f32, bool) {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i)
    };
    ((num / den).sqrt(), max, argmax(a) == argmax(b))
}

fn summary(name: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    let (mut worst, mut largest, mut same_top, mut identical) = (0f64, 0f32, 0, 0);
    for (g, w) in got.iter().zip(want) {
        let (d, m, top) = compare(g, w);
        worst = worst.max(d);
        largest = largest.max(m);
        same_top += usize::from(top);
        identical += usize::from(g == w);
    }
    println!(
        "| {name} | {} | {worst:.2e} | {largest:.2e} | {same_top}/{} | {identical}/{} |",
        got.len(),
        got.len(),
        got.len()
    );
}

fn bits(name: &str, got: &[Vec<f32>], want: &[Vec<f32>]) -> bool {
    let same = got.len() == want.len() && got.iter().zip(want).all(|(a, b)| a == b);
    println!(
        "| {name} | {} rows | {} |",
        got.len(),
        if same { "identical" } else { "DIFFER" }
    );
    same
}

/// The rows a greedy pass hands out: each row's `first_max` id and logit.
fn want_picks(rows: &[Vec<f32>]) -> Vec<Logits> {
    rows.iter()
        .map(|r| Logits::of_pick(r.len(), infgram::lm::greedy_pick(r)))
        .collect()
}

/// A 16-row pass after 8 tokens in `RowForm::Greedy` (8 rows, then 8 more), and a tree's
/// after 30, against the picks of the rows of one pass.
fn picks(m: &mut dyn LanguageModel, prompt: &[u32], full: &[Vec<f32>]) -> bool {
    m.truncate(8);
    let mut got = m.score_first(&prompt[8..24], 8, RowForm::Greedy).unwrap();
    got.extend(m.score_more(8).unwrap());
    let same = got == want_picks(&full[8..24]);
    println!(
        "| greedy picks of a 16-row pass vs first_max of its rows | {} rows | {} |",
        got.len(),
        if same { "identical" } else { "DIFFER" }
    );
    // The cache holds 24 tokens: the tree goes after 30, as the rows it is checked against.
    m.feed(&prompt[24..30]).unwrap();
    let tree = [prompt[30], prompt[31], prompt[32], 5];
    let parents = [None, Some(0), Some(1), Some(0)];
    let got = m
        .score_tree_first(&tree, &parents, 4, RowForm::Greedy)
        .unwrap();
    let tree_same = got[..3] == want_picks(&full[30..33]);
    println!(
        "| greedy picks of a tree's chain branch vs first_max | 3 rows | {} |",
        if tree_same { "identical" } else { "DIFFER" }
    );
    same && tree_same
}

/// Sequence 0 after 20 tokens; two sequences added (the cache grows to four rooms, its
/// positions copied); one starts from a copy of sequence 0's first 10 positions; then one
/// pass of the three sequences' next rows, each against the same positions of one pass.
fn several(m: &mut dyn LanguageModel, prompt: &[u32], full: &[Vec<f32>]) -> bool {
    m.truncate(0);
    m.feed(&prompt[..20]).unwrap();
    let Some(s) = m.sequences() else {
        println!("| several sequences in one pass | – | NOT HELD |");
        return false;
    };
    let (a, b) = (s.add_sequence().unwrap(), s.add_sequence().unwrap());
    s.copy_cache(0, a, 10).unwrap();
    fn part(seq: usize, tokens: &[u32]) -> infgram::lm::SeqPart<'_> {
        infgram::lm::SeqPart {
            seq,
            tokens,
            first: tokens.len(),
            form: RowForm::Full,
        }
    }
    let parts = [
        part(0, &prompt[20..30]),
        part(a, &prompt[10..24]),
        part(b, &prompt[..16]),
    ];
    let rows: Vec<Vec<Vec<f32>>> = s
        .score_parts(&parts)
        .unwrap()
        .into_iter()
        .map(|rows| rows.into_iter().map(Logits::into_dense).collect())
        .collect();
    let mut ok = bits(
        "3 sequences in one pass: the first",
        &rows[0],
        &full[20..30],
    );
    ok &= bits("… one from a copied start", &rows[1], &full[10..24]);
    ok &= bits("… one from nothing", &rows[2], &full[..16]);
    s.select(0).unwrap();
    let next = m.forward(&prompt[30..34]).unwrap();
    ok & bits("the first sequence's next pass", &next, &full[30..34])
}

/// Runs the checks; exits 1 when a bit-for-bit one fails.
pub fn run(model: &str) {
    let source = infgram::neural::source::ModelSource::resolve(model).expect("the model");
    let path = source.path();
    let mut m = gpu(path, true);
    let vocab = m.vocab_size() as u32;
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let t = Instant::now();
    let full = m.forward(&prompt).unwrap();
    println!(
        "GPU prompt pass (40 tokens, first use): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    println!("\n| against | rows | worst ‖Δ‖/‖ref‖ | largest |Δ| | same argmax | bit-identical |");
    println!("|---|---:|---:|---:|---:|---:|");
    // The CPU passes over the first 16 rows (the reference is slow: plain loops in the
    // kernels' order).
    let t = Instant::now();
    let reference = ReferenceDecoder::load(path)
        .unwrap()
        .forward(&prompt[..16])
        .unwrap();
    let ref_s = t.elapsed().as_secs_f64();
    summary("CPU reference (kernels' order)", &full[..16], &reference);
    let native = Decoder::from_gguf(path)
        .unwrap()
        .with_threads(8)
        .forward(&prompt[..16])
        .unwrap();
    summary("native CPU pass", &full[..16], &native);
    summary("(reference vs native)", &reference, &native);
    println!("(reference: {ref_s:.1} s on the CPU)");
    println!("\n| GPU batch invariance | compared | result |");
    println!("|---|---:|---|");
    let mut ok = true;
    m.truncate(8);
    let mut again = Vec::new();
    for chunk in prompt[8..].chunks(5) {
        again.extend(m.forward(chunk).unwrap());
    }
    ok &= bits("5-token passes vs one pass", &again, &full[8..]);
    m.truncate(20);
    let mut single = Vec::new();
    for &tok in &prompt[20..] {
        single.extend(m.forward(&[tok]).unwrap());
    }
    ok &= bits("one token at a time vs one pass", &single, &full[20..]);
    // A tree after 30 tokens: node 0 (prompt[30]) with two branches of 3.
    let base = 30;
    let tree = [prompt[30], prompt[31], prompt[32], prompt[33], 5, 6, 7];
    let parents = [None, Some(0), Some(1), Some(2), Some(0), Some(4), Some(5)];
    m.truncate(base);
    let rows: Vec<Vec<f32>> = m
        .score_tree_first(&tree, &parents, tree.len(), RowForm::Full)
        .unwrap()
        .into_iter()
        .map(|l| l.into_dense())
        .collect();
    ok &= bits("tree, chain branch vs one pass", &rows[..4], &full[30..34]);
    m.truncate(base);
    let chain: Vec<Vec<f32>> = m.forward(&[tree[0], 5, 6, 7]).unwrap();
    ok &= bits("tree, other branch vs its chain", &rows[4..], &chain[1..]);
    m.truncate(base);
    m.score_tree_first(&tree, &parents, 1, RowForm::Full)
        .unwrap();
    m.keep_path(&[0, 4, 5, 6]).unwrap();
    let after = m.forward(&[9]).unwrap();
    m.truncate(base);
    let want = m.forward(&[tree[0], 5, 6, 7, 9]).unwrap();
    ok &= bits("after keeping a branch", &after, &want[4..]);
    ok &= picks(&mut *m, &prompt, &full);
    ok &= several(&mut *m, &prompt, &full);
    m.truncate(0);
    ok &= bits(
        "40-row graph replay vs first launch",
        &m.forward(&prompt).unwrap(),
        &full,
    );
    let mut plain = gpu(path, false);
    ok &= bits(
        "no CUDA graphs vs graphs",
        &plain.forward(&prompt).unwrap(),
        &full,
    );
    if !ok {
        println!("\ngpu-check: a bit-for-bit check FAILED");
        std::process::exit(1);
    }
    println!("\ngpu-check: every bit-for-bit check passed");
}
