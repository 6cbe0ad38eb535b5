//! Passes run by candle: the candle-ops reference of every architecture's pass
//! ([`decoder`], `--backend candle`, what the native pass is tested against) and safetensors
//! llamas through candle-transformers ([`hf`]).

pub mod decoder;
pub mod hf;
