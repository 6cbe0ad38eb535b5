//! [`Index`] as [`Shards`]: its in-process shards asked directly, with its own fast paths and
//! memos (the level tracker, the counts cache, reversed-suffix-array narrowing).

use crate::error::Result;
use crate::index::counting::{self, SuffixFeeds};
use crate::index::counts_cache::CacheStats;
use crate::index::levels::{Level, LevelAsk, Memo};
use crate::index::query::{Counts, Occ};
use crate::index::spans::{self, SuffixMatch};
use crate::index::{Index, Range};
use crate::tokenizer::TokenizerSpec;

use super::*;

/// The in-process shards of an index, asked directly.
impl<S: AsRef<[u8]> + Sync> Shards for Index<S> {
    fn shard_count(&self) -> usize {
        self.shards().len()
    }

    fn infos(&self) -> Vec<ShardInfo> {
        self.shards()
            .iter()
            .map(|s| ShardInfo {
                tokens: s.len() as u64,
                documents: s.num_docs() as u64,
            })
            .collect()
    }

    fn separator(&self) -> u32 {
        Index::separator(self)
    }

    fn vocab_size(&self) -> usize {
        Index::vocab_size(self)
    }

    fn ask(&self, asks: Vec<(usize, ShardQuery)>) -> Result<Vec<ShardAnswer>> {
        answer_all_with(self.shards(), Some(self.counts_cache()), asks)
    }

    fn levels(&self, memo: &mut Memo, ask: LevelAsk<'_>) -> Result<Vec<Level>> {
        Ok(memo.finder.levels_asked(self, ask))
    }

    fn next_levels(
        &self,
        memo: &mut Memo,
        ctx: &[u32],
        appended: Option<u32>,
        k: i64,
        levels: &mut Vec<Level>,
    ) -> Result<()> {
        let Memo { finder, tracker } = memo;
        finder.next_levels_into(self, tracker, ctx, appended, k, levels);
        Ok(())
    }

    fn narrowed_level(
        &self,
        memo: &mut Memo,
        q: &[u32],
        ranges: &mut Option<Vec<Range>>,
    ) -> Option<Level> {
        let (&t, shorter) = q.split_last()?;
        let shards = self.shards();
        let found = match ranges.take() {
            Some(r) => r,
            None => shards.iter().map(|sh| sh.find(shorter)).collect(),
        };
        let narrowed: Vec<Range> = shards
            .iter()
            .zip(&found)
            .map(|(sh, &r)| match r.0 < r.1 {
                true => sh.narrow(r, shorter.len(), t),
                false => r,
            })
            .collect();
        let occs = narrowed.iter().map(|&r| Some(Occ::Fwd(r)));
        let level = memo.finder.level_of(self, occs, q)?;
        *ranges = Some(narrowed);
        Some(level)
    }

    fn cache_stats(&self, memo: &Memo) -> CacheStats {
        memo.finder.cache_stats(self)
    }

    fn suffix_match(&self, window: &[u32], full: usize, track: usize) -> Result<SuffixMatch> {
        Ok(spans::suffix_match_local(
            self,
            window,
            (full, track),
            |t| self.holds_token(t),
        ))
    }

    fn follow(&self, m: &SuffixMatch, x: u32, full: usize) -> Option<SuffixMatch> {
        spans::follow_local(self, m, (x, full), |t| self.holds_token(t))
    }

    fn continuation_counts(&self, hs: &[&[u32]], keep_end: bool) -> Result<Vec<Counts>> {
        Ok(hs
            .iter()
            .map(|h| counting::index_continuation_counts(self, h, keep_end))
            .collect())
    }

    fn suffix_feeds(&self, order: usize) -> Result<SuffixFeeds<'_>> {
        counting::index_suffix_feeds(self, order)
    }

    fn tokenizer(&self) -> Option<TokenizerSpec> {
        Some(self.header().tokenizer.clone())
    }
}
