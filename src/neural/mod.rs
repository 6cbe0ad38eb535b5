//! Neural language models, each a [`crate::lm::LanguageModel`]. From the top down (imports
//! run down only):
//! * [`source`] — where a `--model` comes from (a short name fetched on first use, a GGUF
//!   file, a safetensors directory, `hf:`) and which pass runs it;
//! * the passes, each over any architecture's layers:
//!   [`native`] — infgram's own CPU kernels (the decoder, weights in the kernels' tiles, token
//!   trees, the kernels, attention, the thread pool), the fast path on a CPU;
//!   [`gpu`] — infgram's own fused CUDA kernels (`--device cuda`), each pass a replayed CUDA
//!   graph, with their CPU reference in the kernels' order of operations;
//!   [`candle`] — passes written with candle ops, on the CPU or on a GPU (`--backend candle`),
//!   batch-invariant on both, and safetensors llamas through candle-transformers;
//! * [`arch`] — architectures: each family's blocks described as data
//!   ([`arch::Architecture`], read from a file by [`arch::describe`]) and the one assembly
//!   of a model's layers from a description ([`arch::layers`]) that both backends load
//!   through;
//! * [`load`] — reading GGUF files: metadata and tensors.
//!
//! This layer knows nothing of the ∞-gram index; the decode loop is where the two meet.

pub mod arch;
pub mod candle;
pub mod gpu;
pub mod load;
pub mod native;
pub mod source;

/// The chat template of SmolLM2-Instruct (ChatML) around one user message. The GGUF's own
/// template also inserts a default system message; with it this 135M model answered "What is
/// the capital of France?" with French gibberish (both backends), without it "Paris", so
/// infgram leaves it out.
pub fn chat_prompt(user: &str) -> String {
    format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
}

/// Whether the model at `path` is meant to be prompted in chat turns: a GGUF file that names
/// a chat template (`tokenizer.chat_template`; base models such as the packaged Gemma 3 270M
/// have none, and continue text), or a model directory (as before: ChatML).
pub fn wants_chat_turns(path: &std::path::Path) -> bool {
    if path.is_dir() {
        return true;
    }
    crate::tokenizer::gguf::read_gguf_metadata(path)
        .is_ok_and(|c| c.metadata.contains_key("tokenizer.chat_template"))
}

/// The chat template of the model whose tokenizer is `tok` around one user message: Gemma's
/// turns when the vocabulary has `<start_of_turn>` (the model's `<bos>` comes from
/// [`crate::lm::LanguageModel::bos_token`]), else ChatML ([`chat_prompt`]: SmolLM2, Qwen).
pub fn chat_prompt_for(tok: &crate::tokenizer::HfTokenizer, user: &str) -> String {
    if tok.token_to_id("<start_of_turn>").is_some() {
        return format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n");
    }
    chat_prompt(user)
}
