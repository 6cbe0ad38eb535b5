//! The ∞-gram's rows for a neural model's batch (Python's `Index.rows`: for each position, the
//! ∞-gram's distribution and what it knew), and the mixing of them with a model's
//! probabilities by a fitted [`Mixer`] (`lambdas`, `mix_rows`, `mix_targets`): what an engine
//! that runs its own model calls to mix.

pub use crate::mix::{lambdas, mix_rows, mix_targets, Mixer};
pub use crate::ngram::batch::{infgram_rows, Rows, RowsOptions, ROWS_WINDOW};
