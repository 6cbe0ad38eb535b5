//! The CPU backend: infgram's own kernels, what an architecture's pass is made of. Quantized
//! matrix products ([`kernels`]: Q4_1 / Q8_0 weights against 8-bit activations, AVX-512 VNNI,
//! AVX2 and scalar paths giving the same bits), attention over the KV cache ([`attention`]),
//! the feed-forward gates SwiGLU and GeGLU ([`gates`]), and the spinning thread pool they share ([`pool`]).
//!
//! Nothing here knows an architecture or a file format; a new kernel is a file here with its
//! test against the scalar reference.

pub mod attention;
pub mod gates;
pub mod kernels;
pub mod pool;
