//! Scoring text: perplexity and the infini-gram paper's agreement analysis.
//!
//! * [`windowed`]: perplexity of any [`crate::lm::LanguageModel`] (a neural model, the ∞-gram,
//!   and next the mixture) in sliding windows, the protocol of the paper's §D.1.
//! * [`ngram`]: perplexity of an ∞-gram estimator over an index, every position scored in
//!   parallel straight from the levels, with the token-wise agreement by effective n (§4).

pub mod ngram;
pub mod windowed;

pub use ngram::{perplexity, Agreement, PplReport};
pub use windowed::windowed_perplexity;
