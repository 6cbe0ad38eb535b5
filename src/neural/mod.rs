//! Neural language models, each a [`crate::lm::LanguageModel`]. From the top down (imports
//! run down only):
//! * [`source`] — where a `--model` comes from (a short name fetched on first use, a GGUF
//!   file, a safetensors directory, `hf:`) and which pass runs it;
//! * [`candle`] — passes run by candle: the reference llama, safetensors llamas;
//! * [`arch`] — architectures: each family's blocks described as data
//!   ([`arch::Architecture`], read from a file by [`arch::describe`]) and the pass that runs
//!   them on infgram's kernels ([`arch::decoder::Decoder`]);
//! * [`cpu`] — the CPU backend: kernels, attention, activation, the thread pool;
//! * [`load`] — reading GGUF files: metadata and tensors.
//!
//! This layer knows nothing of the ∞-gram index; the decode loop is where the two meet.

pub mod arch;
pub mod candle;
pub mod cpu;
pub mod load;
pub mod source;

/// The chat template of SmolLM2-Instruct (ChatML) around one user message. The GGUF's own
/// template also inserts a default system message; with it this 135M model answered "What is
/// the capital of France?" with French gibberish (both backends), without it "Paris", so
/// infgram leaves it out.
pub fn chat_prompt(user: &str) -> String {
    format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
}
