//! infgram: an ∞-gram (infini-gram) engine and text-generation runtime.
//!
//! Layers, bottom to top (a module imports only modules of its own layer or below; drawn in
//! `ARCHITECTURE.md`):
//!
//! 1. [`error`] (and [`diag!`], the notes and warnings that never panic), [`isolate`] (work
//!    on hostile input in a child process bounded in time and memory), [`assets`] (the
//!    in-tree Tiny Shakespeare; fetching the default corpus and model from package
//!    registries), [`corpus`] (reading `.txt` / `.jsonl[.gz|.zst]` inputs),
//!    [`tokenizer`] (bytes, `tokenizer.json`, the tokenizer of a GGUF file), `gguf` (feature
//!    `neural`: GGUF headers through a checked reader before candle reads them).
//! 2. [`index`]: the on-disk, memory-mapped suffix-array index and the infini-gram queries.
//!    [`output_file`]: how every file infgram writes is written (checked, beside, renamed).
//!    [`lm`]: the `LanguageModel` trait every scorer implements, and dense/sparse logits.
//! 3. [`ngram`]: the ∞-gram estimators (SBIS, smoothed) and the ∞-gram as a language model.
//!    `neural` (feature `neural`): the llama forward passes and where models come from.
//! 4. [`decode`]: the generation runtime: one decode loop with drafters, processors and the
//!    sampler, with the copy guard. [`mix`]: the ∞-gram mixed with a neural model, λ per
//!    position. [`eval`]: perplexity of any language model and of the mixture, the ∞-gram's
//!    agreement analysis, attribution.
//! 5. [`service`]: what front ends call: the typed query protocol, opening indexes and models,
//!    assembling generations.
//! 6. `server` (feature `server`): `infgram serve`, the infini-gram HTTP API and
//!    `/v1/completions` over [`service`].
//!
//! The `infgram` binary (`src/cli/`) is a thin layer of clap types over [`service`] and the
//! server. `fuzz_targets` (hidden) holds what the fuzz targets under `fuzz/` run.
//! `FORMAT.md` draws the index format.

// Diagnostics go through `diag!` (in `error`): `eprintln!` panics when standard error cannot
// be written.
#![deny(clippy::print_stderr)]

// First: `diag!` is in the textual scope of every module declared after it.
#[macro_use]
pub mod error;

pub mod assets;
pub mod corpus;
pub mod decode;
pub mod eval;
#[doc(hidden)]
pub mod fuzz_targets;
#[cfg(feature = "neural")]
pub mod gguf;
pub mod index;
pub mod isolate;
pub mod lm;
pub mod mix;
#[cfg(feature = "neural")]
pub mod neural;
pub mod ngram;
pub mod output_file;
#[cfg(feature = "server")]
pub mod server;
pub mod service;
pub mod tokenizer;

pub use error::{Error, Result};
pub use index::Index;
