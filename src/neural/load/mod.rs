//! Loaders: reading a GGUF file's hyper-parameters ([`gguf::LlamaConfig`]) and tensors, which
//! every pass loads through so that they agree on what a file means and refuse the same bad
//! files. The bottom room of `neural/`: the backend sizes its buffers from these
//! hyper-parameters.

pub mod gguf;
