//! Loading a neural model and its tokenizer from a `--model` spec (feature `neural`; the
//! options are there in every build, so front ends parse them alike).

use serde::{Deserialize, Serialize};

/// The model interface a front end drives directly (Python's `Model.step`: feed tokens, read
/// their logits, cut the cache back).
pub use crate::lm::LanguageModel;
// Several generations sharing one model's passes (`serve --parallel`, `gen --batch`).
pub use crate::lm::batch::{BatchStats, Batcher, SequenceModel};
#[cfg(feature = "neural")]
pub use loading::{check_device, load_model, LoadedModel};

/// Which forward pass runs a GGUF model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// infgram's own kernels (the fastest, and the default on every device): the CPU kernels,
    /// or on a GPU the fused kernels of [`crate::neural::gpu`].
    #[default]
    Native,
    /// The candle-ops reference (several times slower).
    Candle,
}

/// A quantization to convert GGUF weights to at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Requantize {
    /// 8-bit blocks (both backends).
    #[cfg_attr(feature = "cli", value(name = "q8_0"))]
    #[serde(rename = "q8_0")]
    Q8_0,
    /// 4-bit blocks (the candle backend only).
    #[cfg_attr(feature = "cli", value(name = "q4_0"))]
    #[serde(rename = "q4_0")]
    Q4_0,
}

/// Where a model's passes run. Every build parses both; a build without the `cuda` feature
/// answers `cuda` with an error that says how to build one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// The CPU (every backend).
    #[default]
    Cpu,
    /// An NVIDIA GPU (feature `cuda`): infgram's fused kernels, or candle's CUDA backend with
    /// [`Backend::Candle`].
    Cuda,
}

/// How a model is loaded and run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelOptions {
    /// Threads of the native pass (0: one per core). The logits do not depend on it.
    pub threads: usize,
    /// The forward pass of GGUF models.
    pub backend: Backend,
    /// Re-quantize GGUF weights at load.
    pub requantize: Option<Requantize>,
    /// Where the passes run.
    #[serde(default)]
    pub device: Device,
    /// The model's `tokenizer.json`, in place of the tokenizer its GGUF file carries (for a
    /// file whose pre-tokenizer infgram does not read); the file's chat template is kept.
    #[serde(default)]
    pub tokenizer: Option<std::path::PathBuf>,
    /// The instruction set of the native CPU kernels (`scalar`, `avx2`, `avxvnni`,
    /// `avx512vnni`, `amx`; one this CPU runs), in place of the best one: the outputs are
    /// the same bits on every one, so this measures or works around a kernel, nothing more.
    #[serde(default)]
    pub isa: Option<String>,
}

/// The loader, in builds with neural models.
#[cfg(feature = "neural")]
mod loading {
    use super::{Backend, Device, ModelOptions, Requantize};
    use crate::decode::policy::{calibrate, plausible_costs, CostModel, CALIBRATION_METHOD};
    use crate::error::{Error, Result};
    use crate::lm::batch::{BatchStats, Batcher};
    use crate::lm::LanguageModel;
    use crate::neural::native::kernels::Isa;
    use crate::neural::source::ModelSource;
    use crate::service::request::Prompt;
    use crate::tokenizer::HfTokenizer;
    use crate::tokenizer::Tokenizer;
    use candle_core::quantized::GgmlDType;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    /// A loaded neural model with its tokenizer.
    pub struct LoadedModel {
        /// The model.
        pub model: Box<dyn LanguageModel + Send>,
        /// Its tokenizer.
        pub tokenizer: HfTokenizer,
        /// The GGUF file or model directory it came from.
        pub path: PathBuf,
        /// How it was loaded (the pass costs' cache key).
        options: ModelOptions,
        /// Its pass costs on this machine, once measured or read ([`LoadedModel::pass_costs`]).
        costs: Option<CostModel>,
    }

    /// What a pass over a GGUF file is loaded from.
    struct Gguf<'a> {
        path: &'a Path,
        requantize: Option<GgmlDType>,
        threads: usize,
        device: Device,
        /// The native CPU kernels' instruction set.
        isa: Isa,
    }

    type Loaded = Result<Box<dyn LanguageModel + Send>>;

    /// How one backend loads a GGUF file on one device.
    type LoadPass = fn(&Gguf) -> Loaded;

    /// The pass of each backend on each device, for GGUF files: a new backend (or device) is a
    /// row here and a variant of [`Backend`] (or [`Device`]).
    const GGUF_PASSES: &[(Backend, Device, LoadPass)] = &[
        (Backend::Native, Device::Cpu, native_cpu),
        (Backend::Native, Device::Cuda, native_gpu),
        (Backend::Candle, Device::Cpu, candle),
        (Backend::Candle, Device::Cuda, candle),
    ];

    /// infgram's CPU kernels.
    fn native_cpu(g: &Gguf) -> Loaded {
        let decoder = crate::neural::native::decoder::Decoder::load(g.path, g.requantize)?;
        Ok(Box::new(decoder.with_threads(g.threads).with_isa(g.isa)))
    }

    /// infgram's fused GPU kernels (a build with the `cuda` feature).
    #[cfg(feature = "cuda")]
    fn native_gpu(g: &Gguf) -> Loaded {
        let decoder = crate::neural::gpu::decoder::GpuDecoder::load(g.path, g.requantize)?;
        Ok(Box::new(decoder))
    }

    /// In a build without the `cuda` feature: the error that says how to get one.
    #[cfg(not(feature = "cuda"))]
    fn native_gpu(_: &Gguf) -> Loaded {
        Err(crate::neural::candle::cuda::not_built())
    }

    /// The candle-ops pass, on the CPU or candle's CUDA backend.
    fn candle(g: &Gguf) -> Loaded {
        let device = candle_device(g.device)?;
        let decoder =
            crate::neural::candle::decoder::CandleDecoder::load_on(g.path, g.requantize, &device)?;
        Ok(Box::new(decoder))
    }

    fn candle_device(device: Device) -> Result<candle_core::Device> {
        match device {
            Device::Cpu => Ok(candle_core::Device::Cpu),
            Device::Cuda => crate::neural::candle::cuda::device(),
        }
    }

    /// Whether `opts.device` can run a model here: a GPU asked of a build without the `cuda`
    /// feature, or of a machine without CUDA, is refused before anything else is done (a
    /// server refuses it before it builds its indexes).
    pub fn check_device(opts: &ModelOptions) -> Result<()> {
        match opts.device {
            Device::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda => crate::neural::candle::cuda::device().map(drop),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda => Err(crate::neural::candle::cuda::not_built()),
        }
    }

    /// Resolves `spec` (a short name, fetched on first use; a `.gguf` file; a safetensors
    /// directory; or `hf:OWNER/REPO[:FILE]`) and loads it.
    pub fn load_model(spec: &str, opts: &ModelOptions) -> Result<LoadedModel> {
        let source = ModelSource::resolve(spec)?;
        let requantize = opts.requantize.map(|r| match r {
            Requantize::Q8_0 => GgmlDType::Q8_0,
            Requantize::Q4_0 => GgmlDType::Q4_0,
        });
        let threads = match opts.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let path = source.path().to_path_buf();
        let native_cpu = matches!(source, ModelSource::Gguf(_))
            && opts.backend == Backend::Native
            && opts.device == Device::Cpu;
        if opts.isa.is_some() && !native_cpu {
            return Err(Error::input(
                "--isa chooses the native CPU kernels' instruction set: it applies to a GGUF \
                 model on --backend native --device cpu (the defaults)",
            ));
        }
        let model = match &source {
            ModelSource::Safetensors(_) if requantize.is_some() => {
                return Err(Error::input("--requantize applies to GGUF models only"))
            }
            ModelSource::Safetensors(_) => source.load_safetensors(&candle_device(opts.device)?)?,
            ModelSource::Gguf(_) => {
                let (_, _, load) = GGUF_PASSES
                    .iter()
                    .find(|(b, d, _)| *b == opts.backend && *d == opts.device)
                    .ok_or_else(|| {
                        Error::input(format!(
                            "--backend {:?} does not run on --device {:?}",
                            opts.backend, opts.device
                        ))
                    })?;
                load(&Gguf {
                    path: &path,
                    requantize,
                    threads,
                    device: opts.device,
                    isa: opts.kernels_isa()?,
                })?
            }
        };
        let tokenizer = match &opts.tokenizer {
            Some(file) => source.tokenizer_from(file)?,
            None => source.tokenizer()?,
        };
        // A GGUF file's vocabulary and its embedding's rows are one list (llama.cpp pads the
        // vocabulary to the rows): a shorter one would load, decode greedily, and fail in the
        // middle of a sampled generation at the first id past it.
        let own_vocabulary = opts.tokenizer.is_none() && matches!(source, ModelSource::Gguf(_));
        if own_vocabulary && tokenizer.vocab_size() != model.vocab_size() {
            return Err(Error::input(format!(
                "{}: its vocabulary has {} tokens and its embedding {} rows, which a model file \
                 has as many of (the file is damaged or was converted wrongly); fetch or \
                 convert it again, or pass the model's tokenizer.json with --tokenizer FILE",
                path.display(),
                tokenizer.vocab_size(),
                model.vocab_size()
            )));
        }
        if tokenizer.vocab_size() > model.vocab_size() {
            return Err(Error::input(format!(
                "the tokenizer has {} ids, more than the model's {}: pass the model's own \
                 tokenizer.json",
                tokenizer.vocab_size(),
                model.vocab_size()
            )));
        }
        Ok(LoadedModel {
            model,
            tokenizer,
            path,
            options: opts.clone(),
            costs: None,
        })
    }

    /// Pass sizes' medians a calibration takes.
    const CALIBRATION_REPEATS: usize = 5;

    impl LoadedModel {
        /// What a pass over 1, 2, 4, 8 and 16 new tokens costs with this model on this machine,
        /// as speculative decoding plans its drafts with: measured once ([`calibrate`], a
        /// second or two) and kept in the cache (`CACHE/calibration/`, one small file per
        /// model file, machine and options), read from there afterwards. The decode loop goes
        /// on measuring its own passes; this is what it plans its first drafts with, where the
        /// built-in table (measured on SmolLM2) would plan a larger model's too long. A
        /// calibration that fails leaves the built-in table; a file whose figures no machine
        /// measures ([`plausible_costs`]: absurd times, free drafts) is measured again.
        pub fn pass_costs(&mut self) -> CostModel {
            if let Some(c) = &self.costs {
                return c.clone();
            }
            let file = crate::assets::cache_dir()
                .join("calibration")
                .join(format!("{}.json", self.calibration_key()));
            let points: Option<Vec<(usize, f64)>> = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .filter(|p: &Vec<(usize, f64)>| plausible_costs(p));
            let points = match points {
                Some(p) => Some(p),
                None => match calibrate(self.model.as_mut(), CALIBRATION_REPEATS) {
                    Ok(p) => {
                        if let Err(e) = write_calibration(&file, &p) {
                            diag!("warning: the pass costs were not kept: {e}");
                        }
                        Some(p)
                    }
                    Err(e) => {
                        diag!("warning: the pass costs could not be measured: {e}");
                        None
                    }
                },
            };
            let costs = points.map_or_else(CostModel::default, |p| CostModel::from_ms(&p));
            self.costs = Some(costs.clone());
            costs
        }

        /// What the pass costs depend on: the model file (its path, size and time), the CPU,
        /// the kernels' ISA and the options it runs with (and how they were timed).
        fn calibration_key(&self) -> String {
            let meta = std::fs::metadata(&self.path).ok();
            let cpu = std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|c| {
                    c.lines()
                        .find(|l| l.starts_with("model name"))
                        .map(str::to_string)
                })
                .unwrap_or_default();
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let key = format!(
                "{}|{:?}|{:?}|{cpu}|{threads}|{:?}|{:?}|{CALIBRATION_METHOD}",
                self.path.display(),
                meta.as_ref().map(|m| m.len()),
                meta.and_then(|m| m.modified().ok()),
                self.options.kernels_isa().unwrap_or_else(|_| Isa::detect()),
                self.options,
            );
            format!("{:016x}", crate::tokenizer::fnv1a64(key.as_bytes()))
        }
    }

    impl ModelOptions {
        /// The native kernels' instruction set these options name (`--isa`), or the best
        /// this CPU runs.
        pub fn kernels_isa(&self) -> Result<Isa> {
            match &self.isa {
                None => Ok(Isa::detect()),
                Some(name) => name.parse().map_err(|e: String| {
                    let runs: Vec<String> = Isa::available()
                        .iter()
                        .map(|i| format!("{i:?}").to_lowercase())
                        .collect();
                    Error::input(format!("--isa {e}; this CPU runs {}", runs.join(", ")))
                }),
            }
        }
    }

    /// Writes the pass costs to `file`, beside it under a fresh name and renamed over it.
    fn write_calibration(file: &Path, points: &[(usize, f64)]) -> Result<()> {
        let dir = file.parent().expect("a file in the cache");
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".calibration.")
            .tempfile_in(dir)
            .map_err(|e| Error::io(dir, e))?;
        let json = serde_json::to_vec(points).expect("numbers serialize");
        std::io::Write::write_all(&mut tmp, &json).map_err(|e| Error::io(tmp.path(), e))?;
        tmp.persist(file).map_err(|e| Error::io(file, e.error))?;
        Ok(())
    }

    /// What a [`LoadedModel`] holds for the instant its model moves onto a batcher's thread.
    struct Moved;

    impl LanguageModel for Moved {
        fn forward(&mut self, _: &[u32]) -> Result<Vec<Vec<f32>>> {
            Err(Error::Model(
                "the model moved onto its batcher's thread".into(),
            ))
        }
        fn cache_len(&self) -> usize {
            0
        }
        fn truncate(&mut self, _: usize) {}
        fn vocab_size(&self) -> usize {
            0
        }
        fn eos_tokens(&self) -> &[u32] {
            &[]
        }
    }

    impl LoadedModel {
        /// Moves the model onto a [`Batcher`]'s thread, so that generations on several threads
        /// share its passes (`Batcher::sequence` each), and puts a sequence of it in its place
        /// (this `LoadedModel` goes on working, on one sequence of its own). Its pass costs
        /// are measured first, on the model alone. `stats`: where the batcher counts its
        /// passes. An error, the model left as it was, when its backend holds one sequence.
        pub fn batch(&mut self, stats: Arc<BatchStats>) -> Result<Batcher> {
            if self.model.sequences().is_none() {
                return Err(Error::input(
                    "this backend runs one sequence at a time: several generations at once \
                     need the native backend (--backend native, on the CPU or --device cuda)",
                ));
            }
            self.pass_costs();
            let model = std::mem::replace(&mut self.model, Box::new(Moved));
            let batcher = Batcher::with(model, Batcher::WINDOW, stats)?;
            self.model = Box::new(batcher.sequence()?);
            Ok(batcher)
        }

        /// Whether the model is prompted in chat turns: a GGUF file with a chat template (base
        /// models such as the packaged Gemma 3 270M have none, and continue text), or a model
        /// directory (the hard-coded turns of its vocabulary).
        pub fn chats(&self) -> bool {
            self.tokenizer.chat_template().is_some() || self.path.is_dir()
        }

        /// The prompt a generation starts from: `prompt` as it is when `raw` or when the model
        /// is a base model, else a conversation of `system` (if any) and `prompt` as the
        /// user's message (an empty one without a prompt), rendered by the model's chat
        /// template with the messages' texts as text (`parse_special`: their control tokens'
        /// strings are control tokens). `None`: no prompt, raw.
        pub fn prompt(
            &self,
            prompt: Option<&str>,
            system: Option<&str>,
            raw: bool,
            parse_special: bool,
        ) -> Option<Prompt> {
            match prompt {
                Some(p) if raw || !self.chats() => Some(Prompt::Text(p.to_string())),
                None if raw || !self.chats() => None,
                _ => Some(Prompt::Chat {
                    messages: crate::tokenizer::chat::conversation(
                        system,
                        prompt.unwrap_or_default(),
                    ),
                    parse_special,
                }),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Every backend has a pass on every device (one row each), so no pair falls through.
        #[test]
        fn every_backend_has_one_pass_on_every_device() {
            for backend in [Backend::Native, Backend::Candle] {
                for device in [Device::Cpu, Device::Cuda] {
                    let rows = GGUF_PASSES
                        .iter()
                        .filter(|(b, d, _)| *b == backend && *d == device)
                        .count();
                    assert_eq!(rows, 1, "{backend:?} on {device:?}");
                }
            }
        }
    }
}
