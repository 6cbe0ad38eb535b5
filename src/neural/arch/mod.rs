//! Architectures: the forward pass of each model family, built from the CPU backend's kernels
//! and the hyper-parameters a loader read. Llama today ([`llama`]: SmolLM2 and kin); a new
//! architecture is a file here, its hyper-parameters read by [`load`](super::load), and its
//! test against candle-transformers' implementation of it.

pub mod llama;
