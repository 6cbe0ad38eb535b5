//! Passes run by candle: the candle-ops reference of the llama pass ([`llama`],
//! `--backend candle`, what the native pass is tested against) and safetensors llamas through
//! candle-transformers ([`hf`]).

pub mod hf;
pub mod llama;
