//! An index's shards as a front end spreads them over processes or hosts (Python's
//! `RemoteIndex` and `InfiniGramEngine`, the Ray cluster): one shard's typed query and answer,
//! the [`Shards`] a query is asked of (local or remote), the queries over them
//! ([`partial`]: `find`, `ntd`, `infgram_prob`… each merged from the shards' answers), and the
//! answer shapes the front ends return.

pub use crate::index::infini_gram::is_infini_gram_dir;
pub use crate::index::partial::{
    self, answer_all, ShardAnswer, ShardInfo, ShardQuery, Shards, SharedShards,
};
pub use crate::index::query::{Document, NtdResult, ProbResult, SearchResult, TokenProb};
pub use crate::index::Layout;
