//! The native backend: infgram's own CPU kernels and the pass built of them.
//! * [`decoder`] — the forward pass of any [`crate::neural::arch::Architecture`]
//!   ([`decoder::Decoder`]), bit-identical however its rows are fed, with token trees
//!   ([`tree`]: where a tree's rows go in one pass);
//! * [`weights`] — a GGUF file's matrices in the kernels' tiles;
//! * [`kernels`] — quantized matrix products (Q4_1 / Q8_0 and the k-quants against 8-bit
//!   activations; AVX-512 VNNI, AVX2 and scalar paths giving the same bits);
//! * [`attention`] — attention over the KV cache; [`gates`] — SwiGLU and GeGLU;
//! * [`pool`] — the spinning thread pool they share.
//!
//! The kernels know no architecture or file format; a new kernel is a file here with its test
//! against the scalar reference. The layers a pass runs are assembled by
//! [`crate::neural::arch::layers`], as the candle backend's are.

pub mod attention;
pub mod decoder;
pub mod gates;
pub mod kernels;
pub mod pool;
pub mod tree;
pub mod weights;
