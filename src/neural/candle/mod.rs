//! Passes run by candle: the candle-ops reference of every architecture's pass
//! ([`decoder`], `--backend candle`, what the native pass is tested against) and safetensors
//! llamas through candle-transformers ([`hf`]), on the CPU or on a GPU ([`cuda`]).

pub mod cuda;
pub mod decoder;
pub mod hf;
