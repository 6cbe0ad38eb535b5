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
//! Shakespeare's bytes as ids when infgram cannot rebuild its tokenizer; `--isa avx2` runs
//! infgram's kernels on an older instruction set than the CPU's best)
//!
//! `cargo run --release --example bench_model -- --roofline [--model FILE.gguf]`: the
//! memory-bandwidth bound of a decoding step instead. A step reads every weight once, so no
//! implementation of the file's weight types steps faster than (this machine's rate of reading
//! that many bytes again and again, from memory or from a last-level cache that holds them) /
//! (the file's weight bytes per step); the table gives that bound beside infgram's own bytes
//! per step.

mod kinds;

use candle_core::quantized::GgmlDType;
use infgram::lm::{argmax, LanguageModel};
use infgram::neural::candle::decoder::CandleDecoder;
use infgram::neural::native::decoder::Decoder;
use infgram::neural::native::kernels::Isa;
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
    /// Run infgram's kernels on this instruction set (scalar, avx2, avxvnni, avx512vnni).
    #[arg(long)]
    isa: Option<String>,
    /// Print the memory-bandwidth bound of a step instead of timing passes.
    #[arg(long)]
    roofline: bool,
    /// Decode with `--model` and with this file side by side, alternating, each file loaded
    /// first for half of the rounds, and give the ratio.
    #[arg(long)]
    against: Option<std::path::PathBuf>,
    /// Rounds of `--against` and `--stream`.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Two weight types' products at SmolLM2's shapes, alternately: their read rates
    /// (`q4_0`, `q4_1`, `q4k`, `q5_0`, `q5_1`, `q5k`, `q6k`, `q8_0`).
    #[arg(long, value_parser = pair::<String>)]
    stream: Option<[String; 2]>,
    /// Layers of products on each side of `--stream`.
    #[arg(long, value_parser = pair::<usize>, default_value = "30,30")]
    copies: [usize; 2],
    /// Time each weight type's product alone, at SmolLM2's shapes, instead.
    #[arg(long)]
    kinds: bool,
    /// llama.cpp's answers on the same file (python/bench/llamacpp_oracle.py): compare
    /// infgram's with them after the timings.
    #[arg(long)]
    llamacpp: Option<std::path::PathBuf>,
}

#[derive(serde::Deserialize)]
struct Oracle {
    teacher: Teacher,
    greedy: Vec<Greedy>,
    speed: Vec<Speed>,
    /// llama.cpp against itself with an f32 KV cache: top-1 agreement, equal greedy tokens.
    self_top1: Option<f64>,
    self_greedy: Option<Vec<usize>>,
}

#[derive(serde::Deserialize)]
struct Teacher {
    ids: Vec<u32>,
    top_ids: Vec<Vec<u32>>,
    top_logits: Vec<Vec<f32>>,
}

#[derive(serde::Deserialize)]
struct Greedy {
    prompt: String,
    ids: Vec<u32>,
    continuation: Vec<u32>,
}

#[derive(serde::Deserialize)]
struct Speed {
    threads: usize,
    tokens_per_s: f64,
    k1_ms: f64,
    k16_ms: f64,
}

/// infgram's answers against llama.cpp's on the same ids: top-1 agreement over the teacher-
/// forced text (with llama.cpp's margin where they differ), and the greedy continuations.
fn compare_with_llamacpp(path: &std::path::Path, oracle: &Oracle, isa: Isa) {
    let mut m = Decoder::from_gguf(path)
        .unwrap()
        .with_threads(2)
        .with_isa(isa);
    let t = &oracle.teacher;
    let rows = m.forward(&t.ids).unwrap();
    let mut margins = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let ours = argmax(row);
        if ours != t.top_ids[i][0] {
            // llama.cpp's margin of its choice over ours (past its top 5: at least the 5th's).
            let theirs = t.top_ids[i].iter().position(|&id| id == ours);
            let last = t.top_logits[i].len() - 1;
            margins.push(t.top_logits[i][0] - t.top_logits[i][theirs.unwrap_or(last)]);
        }
    }
    let n = rows.len();
    println!(
        "\nTop-1 against llama.cpp, teacher-forced over {n} tokens: {:.1}% agree; where they differ, llama.cpp's margin: median {:.3}, max {:.3} logits",
        100.0 * (n - margins.len()) as f64 / n as f64,
        if margins.is_empty() { 0.0 } else { median(margins.iter().map(|&x| x as f64).collect()) },
        margins.iter().cloned().fold(0f32, f32::max)
    );
    if let Some(top1) = oracle.self_top1 {
        println!(
            "The bound: llama.cpp against itself with its KV cache in f32 instead of f16, {:.1}%",
            100.0 * top1
        );
    }
    println!("\n| prompt | greedy tokens equal to llama.cpp's | first difference: infgram's margin | llama.cpp with an f32 KV cache |");
    println!("|---|---:|---:|---:|");
    for (k, g) in oracle.greedy.iter().enumerate() {
        m.truncate(0);
        let mut row = m.forward(&g.ids).unwrap().pop().unwrap();
        let mut same = 0;
        let mut margin = None;
        for &theirs in &g.continuation {
            let ours = argmax(&row);
            if ours != theirs {
                margin = Some(row[ours as usize] - row[theirs as usize]);
                break;
            }
            same += 1;
            row = m.forward(&[theirs]).unwrap().pop().unwrap();
        }
        let margin = margin.map_or("–".into(), |d| format!("{d:.3}"));
        let own = oracle.self_greedy.as_ref().map_or("".into(), |v| {
            format!("{} / {}", v[k], g.continuation.len())
        });
        println!(
            "| {:?} | {same} / {} | {margin} | {own} |",
            g.prompt,
            g.continuation.len()
        );
    }
}

/// `A,B` as two values.
fn pair<T: std::str::FromStr>(s: &str) -> Result<[T; 2], String> {
    let parts: Vec<T> = s
        .split(',')
        .map(|p| p.parse().map_err(|_| format!("{p}: not a value")))
        .collect::<Result<_, _>>()?;
    parts
        .try_into()
        .map_err(|_| "expected two values: A,B".into())
}

/// A weight type by its lowercase name.
fn parse_type(name: &str) -> GgmlDType {
    match name {
        "q4_0" => GgmlDType::Q4_0,
        "q4_1" => GgmlDType::Q4_1,
        "q4k" => GgmlDType::Q4K,
        "q5_0" => GgmlDType::Q5_0,
        "q5_1" => GgmlDType::Q5_1,
        "q5k" => GgmlDType::Q5K,
        "q6k" => GgmlDType::Q6K,
        "q8_0" => GgmlDType::Q8_0,
        other => panic!("--stream {other}: expected q4_0, q4_1, q4k, q5_0, q5_1, q5k, q6k or q8_0"),
    }
}

fn parse_isa(name: &str) -> Isa {
    name.parse().unwrap_or_else(|e| panic!("--isa {e}"))
}

/// Bytes of the matrices a one-token step reads from the file: every tensor but the
/// embeddings when the file has a separate output matrix.
fn file_bytes_per_step(path: &std::path::Path) -> usize {
    let mut f = std::fs::File::open(path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let untied = content.tensor_infos.contains_key("output.weight");
    content
        .tensor_infos
        .iter()
        .filter(|(name, _)| !(untied && name.as_str() == "token_embd.weight"))
        .map(|(_, t)| {
            let dtype = t.ggml_dtype;
            t.shape.elem_count() / dtype.block_size() * dtype.type_size()
        })
        .sum()
}

/// The wrapping sum of `words` (a multiple of 16), read as the kernels read weights: 256-bit
/// loads, two cache lines at a time, asking for the lines `AHEAD` bytes ahead.
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2<const AHEAD: usize>(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    for lines in words.chunks_exact(16) {
        let p = lines.as_ptr() as *const __m256i;
        _mm_prefetch(p.cast::<i8>().wrapping_add(AHEAD), _MM_HINT_T0);
        _mm_prefetch(p.cast::<i8>().wrapping_add(AHEAD + 64), _MM_HINT_T0);
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(k)));
        }
    }
    let mut out = [0u64; 16];
    for (k, a) in acc.iter().enumerate() {
        _mm256_storeu_si256(out.as_mut_ptr().add(4 * k) as *mut __m256i, *a);
    }
    out.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

/// A way of summing a buffer's words.
type SumFn = unsafe fn(&[u64]) -> u64;

/// GB/s reading a buffer of `bytes` again and again with `threads` threads (each summing
/// its part), as decoding steps read the weights: for the best of several prefetch distances,
/// the best and the median of 9 passes after one to warm the caches (a CPU whose last-level
/// cache holds the buffer reads it from there), and the distance.
fn read_bandwidth(bytes: usize, threads: usize) -> (f64, f64, usize) {
    let sums: [(usize, SumFn); 5] = [
        (0, sum_avx2::<0>),
        (2048, sum_avx2::<2048>),
        (4096, sum_avx2::<4096>),
        (8192, sum_avx2::<8192>),
        (16384, sum_avx2::<16384>),
    ];
    sums.into_iter()
        .map(|(ahead, sum)| {
            let (best, med) = read_rate(bytes, threads, sum);
            (best, med, ahead)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap()
}

fn read_rate(bytes: usize, threads: usize, sum: SumFn) -> (f64, f64) {
    assert!(
        std::arch::is_x86_feature_detected!("avx2"),
        "--roofline needs AVX2"
    );
    let words = bytes.div_ceil(128) * 16;
    let buf: Vec<u64> = (0..words as u64).collect();
    let pass = || {
        std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(words.div_ceil(threads).next_multiple_of(16))
                .map(|part| {
                    // SAFETY: the CPU has AVX2.
                    s.spawn(move || unsafe { sum(part) })
                })
                .collect();
            let total = parts.into_iter().map(|h| h.join().unwrap()).sum::<u64>();
            std::hint::black_box(total)
        })
    };
    pass();
    let mut rates = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        pass();
        rates.push((words * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let best = rates.iter().cloned().fold(0.0, f64::max);
    (best, median(rates))
}

fn roofline(path: &std::path::Path) {
    let file_bytes = file_bytes_per_step(path);
    let file = file_bytes as f64 / 1e6;
    let ours = Decoder::from_gguf(path).unwrap().weight_bytes_per_step() as f64 / 1e6;
    println!("weights a step reads: {file:.1} MB in the file's blocks, {ours:.1} MB in infgram's tiles\n");
    println!("| threads | read GB/s, best (median) of 9 | prefetch distance | bound, file's blocks: tokens/s | bound, infgram's tiles: tokens/s |");
    println!("|---:|---:|---:|---:|---:|");
    for threads in [1, 2] {
        let (best, med, ahead) = read_bandwidth(file_bytes, threads);
        println!(
            "| {threads} | {best:.1} ({med:.1}) | {ahead} | {:.1} | {:.1} |",
            best * 1e3 / file,
            best * 1e3 / ours
        );
    }
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    let file_types = match args.model {
        Some(_) => "the file's types",
        None => "Q4_1 (file)",
    };
    let path = match args.model {
        Some(path) => path,
        None => infgram::assets::ensure_model("smollm2-135m").expect("fetch the model"),
    };
    let isa = args
        .isa
        .as_deref()
        .map(parse_isa)
        .unwrap_or_else(Isa::detect);
    if let Some(types) = &args.stream {
        let types = [parse_type(&types[0]), parse_type(&types[1])];
        return kinds::stream(isa, types, args.copies, args.rounds);
    }
    if args.kinds {
        return kinds::run(isa);
    }
    if args.roofline {
        return roofline(&path);
    }
    let text = infgram::assets::tiny_shakespeare().expect("the in-tree Tiny Shakespeare");
    let ids = match HfTokenizer::from_gguf(&path) {
        Ok(tok) => tok.encode(&text[..4000]).unwrap(),
        Err(_) => text.bytes().take(4000).map(|b| b as u32 + 100).collect(),
    };
    if let Some(other) = &args.against {
        return kinds::against(&path, other, isa, &ids, args.rounds);
    }
    let ctx = &ids[..256];
    let mut reference: Option<Vec<f32>> = None;
    println!("| forward pass | weights | decode tokens/s | k=1 ms | k=2 | k=4 | k=8 | k=16 | k=16 / k=1 | max logit diff vs the first row |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    type Loader = Box<dyn Fn() -> Box<dyn LanguageModel>>;
    let q8 = Some(GgmlDType::Q8_0);
    let p = path.clone();
    let native = move |dtype, threads| -> Loader {
        let p = p.clone();
        Box::new(move || {
            Box::new(
                Decoder::load(&p, dtype)
                    .unwrap()
                    .with_threads(threads)
                    .with_isa(isa),
            )
        })
    };
    let p = path.clone();
    let candle = move |dtype| -> Loader {
        let p = p.clone();
        Box::new(move || Box::new(CandleDecoder::load(&p, dtype).unwrap()))
    };
    let rows: Vec<(&str, &str, Loader)> = vec![
        ("candle ops, 1 thread", file_types, candle(None)),
        ("candle ops, 1 thread", "Q8_0 (re-quantized)", candle(q8)),
        ("infgram kernels, 1 thread", file_types, native(None, 1)),
        ("infgram kernels, 2 threads", file_types, native(None, 2)),
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
            cost[4] / cost[0]
        );
    }
    let oracle: Option<Oracle> = args.llamacpp.as_ref().map(|p| {
        serde_json::from_slice(&std::fs::read(p).expect("read the --llamacpp file"))
            .expect("the JSON llamacpp_oracle.py writes")
    });
    if let Some(oracle) = &oracle {
        for s in &oracle.speed {
            println!(
                "| llama.cpp, {} thread(s) | {file_types} | {:.1} | {:.1} | | | | {:.1} | {:.1}× | |",
                s.threads,
                s.tokens_per_s,
                s.k1_ms,
                s.k16_ms,
                s.k16_ms / s.k1_ms
            );
        }
        compare_with_llamacpp(&path, oracle, isa);
        return;
    }
    println!("\nllama.cpp (BENCHMARKS.md, 2 threads): 177 tokens/s; k = 1/2/4/8/16: 6.7 / 13.0 / 19.3 / 35.0 / 56.6 ms (Q4_0: 5.9 / 8.4 / 11.7 / 16.8 / 24.8)");
}
