//! Neural language models, each a [`crate::lm::LanguageModel`]: the llama pass on infgram's own
//! kernels ([`llama`]), the candle-ops reference ([`candle_llama`]), safetensors llamas through
//! candle-transformers ([`hf_llama`]), and where a `--model` comes from ([`source`]).
//!
//! This layer knows nothing of the ∞-gram index; the decode loop is where the two meet.

pub mod attention;
pub mod candle_llama;
pub mod gguf;
pub mod hf_llama;
pub mod kernels;
pub mod llama;
pub mod pool;
pub mod silu;
pub mod source;

/// The chat template of SmolLM2-Instruct (ChatML) around one user message. The GGUF's own
/// template also inserts a default system message; with it this 135M model answered "What is
/// the capital of France?" with French gibberish (both backends), without it "Paris", so
/// infgram leaves it out.
pub fn chat_prompt(user: &str) -> String {
    format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
}
