//! Scoring text: perplexity, the infini-gram paper's agreement analysis, and where a text
//! copies its corpus.
//!
//! * [`windowed`]: perplexity of any [`crate::lm::LanguageModel`] (a neural model, the ∞-gram,
//!   and next the mixture) in sliding windows, the protocol of the paper's §D.1.
//! * [`ngram`]: perplexity of an ∞-gram estimator over an index, every position scored in
//!   parallel straight from the levels, with the token-wise agreement by effective n (§4).
//!
//! * [`classic`]: perplexity of a fixed-order n-gram model (modified Kneser–Ney, add-α), per
//!   sentence as KenLM's `query` reports it.
//!
//! The mixture's perplexity is mixing's own ([`crate::mix::score`]).
//! * [`attribution`]: the maximal spans of a text that occur in the corpus (with counts and
//!   documents), the longest copied span, L-uniqueness and the Creativity Index.

pub mod attribution;
pub mod classic;
pub mod ngram;
pub mod windowed;

pub use ngram::{perplexity, Agreement, PplReport};
pub use windowed::windowed_perplexity;
