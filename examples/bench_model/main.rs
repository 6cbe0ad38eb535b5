//! The neural runtime's speed table: for each weight representation (the GGUF's Q4_1, and
//! re-quantized at load), greedy decoding tokens/s and the cost of one forward pass over k new
//! tokens after a 256-token context (k = 1, 2, 4, 8, 16: the speculative decoder's cost
//! table), plus the largest logit difference from the Q4_1 reference. Compare with llama.cpp's
//! figures in DESIGN.md §7.
//!
//! `cargo run --release --example bench_model` (one thread: CANDLE_NUM_THREADS=1 by default)

use candle_core::quantized::GgmlDType;
use infgram::neural::llama::Llama;
use infgram::neural::{argmax, LanguageModel};
use infgram::tokenizer::{HfTokenizer, Tokenizer};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    let path = infgram::assets::ensure_model("smollm2-135m").expect("fetch the model");
    let tok = HfTokenizer::from_gguf(&path).unwrap();
    let text = std::fs::read_to_string("../shared/data/tinyshakespeare.txt")
        .unwrap_or_else(|_| "To be or not to be. ".repeat(200));
    let ids = tok.encode(&text[..4000]).unwrap();
    let ctx = &ids[..256];
    let mut reference: Option<Vec<f32>> = None;
    println!("| weights | decode tokens/s | k=1 ms | k=2 | k=4 | k=8 | k=16 | k=8 / k=1 | max logit diff vs Q4_1 |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, dtype) in [
        ("Q4_1 (file)", None),
        ("Q8_0 (re-quantized)", Some(GgmlDType::Q8_0)),
        ("Q4_0 (re-quantized)", Some(GgmlDType::Q4_0)),
    ] {
        let mut m = Llama::load(&path, dtype).unwrap();
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
            "| {name} | {tps:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}× | {diff:.3} |",
            cost[0],
            cost[1],
            cost[2],
            cost[3],
            cost[4],
            cost[3] / cost[0]
        );
    }
    println!("\nllama.cpp (DESIGN.md §7, 2 threads): 177 tokens/s; k = 1/2/4/8/16: 6.7 / 13.0 / 19.3 / 35.0 / 56.6 ms (Q4_0: 5.9 / 8.4 / 11.7 / 16.8 / 24.8)");
}
