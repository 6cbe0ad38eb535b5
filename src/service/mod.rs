//! The library's service layer: the one room the front ends (the CLI, the HTTP server, the
//! Python module) enter, so none of them owns library logic. A front end names
//! `infgram::service` and the error type only (`tests/waist.rs` checks it); what it handles
//! besides requests and reports (an open [`Index`], a [`Tokenizer`], the [`files`] it writes) is
//! re-exported here.
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
//! * [`score`]: the one door of scoring: a [`score::ScoreRequest`] (∞-gram, fixed-order,
//!   neural model, mixture) gives one [`score::ScoreReport`].
//! * [`build`]: building an index (the pipeline, the tokenizer a build names).
//! * [`shards`]: an index's shards spread over processes or hosts, and their answers.
//! * [`rows`]: the ∞-gram's rows for a model's batch and their mixing (Python's `Index.rows`).
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
pub mod score;

pub use generate::{generate_from_corpus, GenConfig, Generation, GuardConfig, GuardReport};
pub use indexes::{
    build_tokenizer, cached_byte_index, cached_index, load_tokenizer, open_cached_byte_index,
    open_cached_index, open_index, resolve_tokenizer_name, tiny_shakespeare_index,
};
pub use query::{execute, Answer, Query, QueryLimits};
// What the front ends hold besides requests and reports (an open index, its tokenizer, the
// files they write), so that they name `service` alone.
pub use crate::index::Index;
pub use crate::output_file as files;
pub use crate::tokenizer::{chat, Tokenizer, TokenizerSpec, Utf8Stream};
pub use request::GenerateRequest;
// The one door of generation (the index-only loops above are what it runs without a model).
pub use run::{generate, GenerationReport, PastStore, Resources, RunOptions};

// The re-export-only rooms, here rather than in files of their own.

/// Building an index, as the front ends ask for it (`infgram index`, Python's `build_index`,
/// `plan_slices` and `build_from_ids`): the pipeline's entry points, the tokenizer a build
/// names, and the removal of unfinished builds when a signal stops the process.
pub mod build {
    pub use super::indexes::build_tokenizer;
    pub use crate::index::output_dir::remove_unfinished;
    pub use crate::index::pipeline::{
        build_from_ids, build_index, default_mem_bytes, plan_slices, BuildOptions, BuildSummary,
    };
}

/// The ∞-gram's rows for a neural model's batch (Python's `Index.rows`: for each position, the
/// ∞-gram's distribution and what it knew), and the mixing of them with a model's
/// probabilities by a fitted [`Mixer`](crate::mix::Mixer) (`lambdas`, `mix_rows`, `mix_targets`): what an engine
/// that runs its own model calls to mix.
pub mod rows {
    pub use crate::mix::{lambdas, mix_rows, mix_targets, Mixer};
    pub use crate::ngram::batch::{infgram_rows, Rows, RowsOptions, ROWS_WINDOW};
}

/// An index's shards as a front end spreads them over processes or hosts (Python's
/// `RemoteIndex` and `InfiniGramEngine`, the Ray cluster): one shard's typed query and answer,
/// the [`Shards`](crate::index::shards::Shards) a query is asked of (local or remote) with
/// the queries as its methods (`find`, `ntd`, `infgram_prob`…, each merged from the shards'
/// answers), and the answer shapes the front ends return.
pub mod shards {
    pub use crate::index::infini_gram::is_infini_gram_dir;
    pub use crate::index::query::{Document, NtdResult, ProbResult, SearchResult, TokenProb};
    pub use crate::index::shards::{
        self, answer_all, AskOnly, ShardAnswer, ShardInfo, ShardQuery, Shards, SharedShards,
    };
    pub use crate::index::Layout;
}
