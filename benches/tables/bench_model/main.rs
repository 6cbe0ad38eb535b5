//! The neural runtime's speed table: for each forward pass (candle ops, the baseline measured in
//! the same run, and infgram's own kernels) and weight representation (the GGUF's Q4_1, or
//! re-quantized to Q8_0 at load), greedy decoding tokens/s and the cost of one forward pass over k new
//! tokens after a 256-token context (k = 1, 2, 4, 8, 16: the speculative decoder's cost
//! table), plus the largest logit difference from the candle Q4_1 reference. Compare with llama.cpp's
//! figures in BENCHMARKS.md.
//!
//! `cargo run --release --example bench_model [-- FILTER] [--model FILE.gguf]` (candle with
//! CANDLE_NUM_THREADS=1 unless set; FILTER keeps only the rows whose pass name contains it,
//! e.g. `infgram`; `--model` times another GGUF file, of any architecture, fed Tiny
//! Shakespeare's bytes as ids when infgram cannot rebuild its tokenizer)

use candle_core::quantized::GgmlDType;
use infgram::lm::{argmax, LanguageModel};
use infgram::neural::arch::decoder::Decoder;
use infgram::neural::candle::decoder::CandleDecoder;
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The forward pass of each backend, by pass size.
#[derive(clap::Parser)]
struct Args {
    /// Run only the rows whose backend contains this (`infgram` skips the slow candle rows).
    filter: Option<String>,
    /// A GGUF file to time instead of SmolLM2.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    let path = match args.model {
        Some(path) => path,
        None => infgram::assets::ensure_model("smollm2-135m").expect("fetch the model"),
    };
    let text = infgram::assets::tiny_shakespeare().expect("the in-tree Tiny Shakespeare");
    let ids = match HfTokenizer::from_gguf(&path) {
        Ok(tok) => tok.encode(&text[..4000]).unwrap(),
        Err(_) => text.bytes().take(4000).map(|b| b as u32 + 100).collect(),
    };
    let ctx = &ids[..256];
    let mut reference: Option<Vec<f32>> = None;
    println!("| forward pass | weights | decode tokens/s | k=1 ms | k=2 | k=4 | k=8 | k=16 | k=8 / k=1 | max logit diff vs Q4_1 |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    type Loader = Box<dyn Fn() -> Box<dyn LanguageModel>>;
    let q8 = Some(GgmlDType::Q8_0);
    let p = path.clone();
    let native = move |dtype, threads| -> Loader {
        let p = p.clone();
        Box::new(move || Box::new(Decoder::load(&p, dtype).unwrap().with_threads(threads)))
    };
    let p = path.clone();
    let candle = move |dtype| -> Loader {
        let p = p.clone();
        Box::new(move || Box::new(CandleDecoder::load(&p, dtype).unwrap()))
    };
    let rows: Vec<(&str, &str, Loader)> = vec![
        ("candle ops, 1 thread", "Q4_1 (file)", candle(None)),
        ("candle ops, 1 thread", "Q8_0 (re-quantized)", candle(q8)),
        ("infgram kernels, 1 thread", "Q4_1 (file)", native(None, 1)),
        ("infgram kernels, 2 threads", "Q4_1 (file)", native(None, 2)),
        (
            "infgram kernels, 1 thread",
            "Q8_0 (re-quantized)",
            native(q8, 1),
        ),
        (
            "infgram kernels, 2 threads",
            "Q8_0 (re-quantized)",
            native(q8, 2),
        ),
    ];
    let filter = args.filter.unwrap_or_default();
    for (pass, name, load) in rows {
        if !pass.contains(&filter) {
            continue;
        }
        let mut m = load();
        let last = m.forward(ctx).unwrap().pop().unwrap();
        let diff = match &reference {
            None => {
                reference = Some(last.clone());
                0.0
            }
            Some(r) => r
                .iter()
                .zip(&last)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max),
        };
        // k-token passes at depth 256.
        let mut cost = Vec::new();
        for k in [1usize, 2, 4, 8, 16] {
            let mut times = Vec::new();
            for _ in 0..5 {
                m.truncate(256);
                let t = Instant::now();
                m.forward(&ids[256..256 + k]).unwrap();
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            cost.push(median(times));
        }
        // Greedy decoding of 64 tokens after the context.
        m.truncate(256);
        let mut next = argmax(&last);
        let t = Instant::now();
        for _ in 0..64 {
            next = argmax(&m.forward(&[next]).unwrap()[0]);
        }
        let tps = 64.0 / t.elapsed().as_secs_f64();
        println!(
            "| {pass} | {name} | {tps:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}× | {diff:.3} |",
            cost[0],
            cost[1],
            cost[2],
            cost[3],
            cost[4],
            cost[3] / cost[0]
        );
    }
    println!("\nllama.cpp (BENCHMARKS.md, 2 threads): 177 tokens/s; k = 1/2/4/8/16: 6.7 / 13.0 / 19.3 / 35.0 / 56.6 ms (Q4_0: 5.9 / 8.4 / 11.7 / 16.8 / 24.8)");
}
