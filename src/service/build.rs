//! Building an index, as the front ends ask for it (`infgram index`, Python's `build_index`,
//! `plan_slices` and `build_from_ids`): the pipeline's entry points, the tokenizer a build
//! names, and the removal of unfinished builds when a signal stops the process.

pub use super::indexes::build_tokenizer;
pub use crate::index::output_dir::remove_unfinished;
pub use crate::index::pipeline::{
    build_from_ids, build_index, default_mem_bytes, plan_slices, BuildOptions, BuildSummary,
};
