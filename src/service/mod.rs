//! The library's service layer: what a front end (the CLI now; the HTTP server and the Python
//! module next) calls, so none of them owns library logic.
//!
//! * [`api`]: the infini-gram HTTP API's request and answer shapes (`POST /` of `infgram
//!   serve`, and Python's `RemoteIndex.api`), over the typed query protocol.
//! * [`drafts`]: infgram's drafters for engines that verify elsewhere (`infgram.Drafter`,
//!   `POST /v1/drafts`): a session per request over the decode loop's drafting.
//! * [`catalog`]: the indexes a front end has opened, by name, shared as `Arc`s.
//! * [`query`]: the typed query protocol ([`query::Query`], serde) and its executor.
//! * [`indexes`]: opening an index with the tokenizer that must go with it, resolving tokenizer
//!   names, and the cached default corpus index.
//! * [`models`]: loading a neural model and its tokenizer from a `--model`
//!   spec with a backend.
//! * [`mod@generate`]: generation from the index alone, and the assembly of a neural generation
//!   (drafters, processors, the copy guard) from options.
//! * [`request`]: the generation request of every front end ([`GenerateRequest`], serde), its
//!   one set of defaults and its checks.
//! * [`run`]: the one door of generation: a checked request over bound [`Resources`] gives one
//!   [`GenerationReport`].

pub mod api;
pub mod catalog;
pub mod drafts;
pub mod generate;
pub mod indexes;
pub mod models;
pub mod query;
pub mod request;
pub mod run;

pub use generate::{
    generate, generate_over_shards, GenConfig, Generation, GuardConfig, GuardReport,
};
pub use indexes::{
    build_tokenizer, cached_byte_index, cached_index, load_tokenizer, open_cached_byte_index,
    open_cached_index, open_index, resolve_tokenizer_name, tiny_shakespeare_index,
};
pub use query::{execute, Answer, Query, QueryLimits};
pub use request::GenerateRequest;
pub use run::{GenerationReport, PastStore, Resources, RunOptions};
