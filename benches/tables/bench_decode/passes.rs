//! What a pass over k new tokens costs against a one-token step: the price of verifying a
//! k-token draft. On the CPU's native kernels a 16-token pass costs 2.6–5 steps; on a GPU a
//! pass should cost about one. Prints the median of `repeats` timed passes per k, after a
//! 256-token prompt, each pass rolled back before the next. Passes of 32 and 64 tokens are
//! read as a prompt is (`feed`: no row's logits; a batch reads prompts 64 tokens a pass), so
//! their per-token column is what a prompt token costs. The last column times each pass as
//! greedy decoding asks for it (`RowForm::Greedy`: every row's greedy pick, no row of logits
//! written out), in the same rounds.
//!
//! `cargo run --release --example bench_decode -- passes --device cuda` (a `cuda` build).

use infgram::lm::{LanguageModel, Logits, RowForm};
use infgram::neural::native::decoder::Decoder;
use infgram::neural::native::kernels::Isa;
use infgram::service::models::{Backend, Device, ModelOptions};
use std::path::Path;
use std::time::Instant;

/// The model at `path` on `device`: the native kernels (two threads, `isa`) on the CPU; on
/// CUDA, `backend`'s pass (native: the fused kernels; candle: the candle ops).
pub fn load(path: &Path, device: Device, isa: Isa, backend: Backend) -> Box<dyn LanguageModel> {
    match device {
        Device::Cpu => Box::new(cpu_decoder(path, isa)),
        Device::Cuda => {
            let opts = ModelOptions {
                backend,
                device,
                ..ModelOptions::default()
            };
            let spec = path.to_string_lossy();
            match infgram::service::models::load_model(&spec, &opts) {
                Ok(loaded) => loaded.model,
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(2);
                }
            }
        }
    }
}

/// The native kernels' model at `path`: two threads, the kernels of `isa`.
fn cpu_decoder(path: &Path, isa: Isa) -> Decoder {
    Decoder::from_gguf(path)
        .unwrap()
        .with_threads(2)
        .with_isa(isa)
}

/// The pass sizes timed: those up to 16 with every row's logits, 32 and 64 as a prompt.
const SIZES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The median milliseconds of a pass of each of [`SIZES`] after the `cached` tokens of `lm`,
/// each rolled back after, and for those with logits the same pass as greedy decoding asks
/// for it (`RowForm::Greedy`, every row's pick read): timed in rounds of one pass of each
/// (after two untimed rounds), so that a slow spell of a shared machine falls on every size
/// alike and the ratios to the step hold (timed one size after another, the same run's
/// ratios moved by a tenth between runs on a 2-vCPU VM).
fn time_in_rounds(
    lm: &mut dyn LanguageModel,
    cached: usize,
    repeats: usize,
) -> Vec<(f64, Option<f64>)> {
    let vocab = lm.vocab_size() as u32;
    let mut times = vec![(Vec::with_capacity(repeats), Vec::new()); SIZES.len()];
    let timed = |round: usize, times: &mut Vec<f64>, pass: &mut dyn FnMut()| {
        let t = Instant::now();
        pass();
        if round >= 2 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    };
    for round in 0..repeats.max(1) + 2 {
        for (&k, (full, greedy)) in SIZES.iter().zip(times.iter_mut()) {
            let draft: Vec<u32> = (0..k as u32).map(|i| (i * 104_729 + 7) % vocab).collect();
            timed(round, full, &mut || match k > 16 {
                true => lm.feed(&draft).unwrap(),
                false => drop(lm.forward(&draft).unwrap()),
            });
            lm.truncate(cached);
            if k <= 16 {
                timed(round, greedy, &mut || {
                    let rows = lm.score_first(&draft, k, RowForm::Greedy).unwrap();
                    std::hint::black_box(rows.iter().map(Logits::argmax).count());
                });
                lm.truncate(cached);
            }
        }
    }
    let median = super::median;
    times
        .into_iter()
        .map(|(full, greedy)| {
            (
                median(full).expect("at least one round timed"),
                median(greedy),
            )
        })
        .collect()
}

/// Times passes of 1, 2, 4, 8 and 16 tokens, and prompts of 32 and 64, after a 256-token
/// prompt; on the CPU, with the kernels of `isa` (default: the best this CPU has) and beside
/// the compute bound of each pass on it ([`super::bound`]).
pub fn run(model: &str, device: Device, backend: Backend, repeats: usize, isa: Option<Isa>) {
    let source = infgram::neural::source::ModelSource::resolve(model).expect("the model");
    // (`--isa` names only an ISA this CPU runs: `Isa::from_str` checks.)
    let isa = isa.unwrap_or_else(Isa::detect);
    // The compute bound: the model's multiply-adds a row over the rate of the ISA's loop
    // (read from the model timed, not a second copy of it).
    let (mut lm, bound): (Box<dyn LanguageModel>, _) = match device {
        Device::Cpu => {
            let model = cpu_decoder(source.path(), isa);
            let macs = (
                model.multiply_adds_per_row(),
                model.layer_multiply_adds_per_row(),
            );
            let bound = super::bound::int8_rate(isa, 2).map(|rate| (macs, rate));
            (Box::new(model), bound)
        }
        Device::Cuda => (load(source.path(), device, isa, backend), None),
    };
    let vocab = lm.vocab_size() as u32;
    let prompt: Vec<u32> = (0..256u32).map(|i| (i * 7919 + 13) % vocab).collect();
    lm.feed(&prompt).unwrap();
    println!(
        "{} on {device:?} ({backend:?}{}{}): median of {repeats} passes after a {}-token prompt\n",
        source
            .path()
            .file_name()
            .unwrap_or_default()
            .to_string_lossy(),
        match std::env::var("INFGRAM_CUDA_GRAPHS").as_deref() {
            Ok("0") => ", no CUDA graphs",
            _ => "",
        },
        match device {
            Device::Cpu => format!(", {isa:?}, 2 threads"),
            Device::Cuda => String::new(),
        },
        prompt.len()
    );
    if let Some(((macs, prompt_macs), rate)) = bound {
        println!(
            "compute bound: {:.1} G 8-bit multiply-adds/s on 2 threads ({isa:?} loop, \
             bench_decode/bound.rs); {:.3} G a row of this model, {:.3} G a prompt's row (no \
             logits)\n",
            rate / 1e9,
            macs as f64 / 1e9,
            prompt_macs as f64 / 1e9
        );
    }
    println!("| new tokens | pass, ms | per token, ms | pass / one-token step | bound, ms | of the bound | greedy picks, ms |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let medians = time_in_rounds(lm.as_mut(), prompt.len(), repeats);
    let step = medians[0].0;
    for (k, (median, greedy)) in SIZES.into_iter().zip(medians) {
        let prompt_like = k > 16;
        let (floor, share) = match bound {
            Some(((macs, prompt_macs), rate)) => {
                let macs = if prompt_like { prompt_macs } else { macs };
                let floor = (k * macs) as f64 / rate * 1e3;
                (
                    format!("{floor:.2}"),
                    format!("{:.0}%", 100.0 * floor / median),
                )
            }
            None => ("–".into(), "–".into()),
        };
        let label = match prompt_like {
            true => format!("{k}, a prompt's"),
            false => k.to_string(),
        };
        println!(
            "| {label} | {median:.2} | {:.3} | {:.2}× | {floor} | {share} | {} |",
            median / k as f64,
            median / step,
            greedy.map_or("–".into(), |ms| format!("{ms:.2}"))
        );
    }
}
