//! Loaders: reading a GGUF file's metadata and tensors ([`gguf::Gguf`]), which every pass
//! loads through so that they agree on what a file means and refuse the same bad files. The
//! bottom room of `neural/`; what the metadata means for each architecture is read in
//! [`crate::neural::arch`].

pub mod gguf;
