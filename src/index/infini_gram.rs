//! Opening an index directory written by infini-gram's indexer, as it is: read-only, no
//! re-indexing, through the same [`Index`] API (`FORMAT.md`, "infini-gram's format").
//!
//! infini-gram (v4 indexes, package `infini-gram` 2.x) writes, per shard `N`:
//! `tokenized.N` (each document preceded by a separator of all-ones bits, tokens little-endian
//! u8 / u16 / u32), `table.N` (the suffix array of the token positions, each a *byte* offset
//! into `tokenized.N`, in `⌈log2(bytes)/8⌉` bytes, suffixes sorted by their bytes),
//! `offset.N` (one u64 byte offset per document, where its separator is) and optionally
//! `metadata.N` / `metaoff.N` (one JSON line per document and its u64 byte offset). The files
//! record neither the token width nor the tokenizer: the width is the one that makes the
//! table's size agree with the tokens' (it is unambiguous), and the tokenizer is bytes for u8
//! (the indexer's default, UTF-8 bytes) and unknown otherwise.

use super::format::{separator_for_width, Header, ShardHeader};
use super::{map_file, Index, Shard};
use crate::error::{Error, Result};
use crate::tokenizer::{ByteTokenizer, IdsOnly, Tokenizer};
use memmap2::Mmap;
use std::path::{Path, PathBuf};

/// Above this many documents, a shard's offsets are checked at a sample of them, not all.
const FULL_OFFSET_CHECK: usize = 1 << 20;
/// Offsets checked in a sampled check.
const SAMPLED_OFFSETS: usize = 4096;

/// Whether `dir` looks like an infini-gram index: no `index.json`, and a first shard's tokens
/// and suffix array.
pub fn is_infini_gram_dir(dir: &Path) -> bool {
    !dir.join(super::format::HEADER_FILE).exists()
        && dir.join("tokenized.0").is_file()
        && dir.join("table.0").is_file()
}

/// Bytes per suffix-array pointer for `bytes` bytes of tokens: `⌈log2(bytes) / 8⌉`, as
/// infini-gram's indexer computes it (at least 1).
pub fn pointer_bytes(bytes: u64) -> usize {
    let bits = 64 - bytes.saturating_sub(1).leading_zeros() as usize; // ⌈log2(bytes)⌉
    bits.div_ceil(8).max(1)
}

/// The token width (1, 2 or 4) at which `table_bytes` is the size of the suffix array of
/// `tokens_bytes` bytes of tokens.
fn detect_width(tokens_bytes: u64, table_bytes: u64) -> Option<u8> {
    [1u8, 2, 4].into_iter().find(|&w| {
        tokens_bytes.is_multiple_of(w as u64)
            && (tokens_bytes / w as u64) * pointer_bytes(tokens_bytes) as u64 == table_bytes
    })
}

fn shard_file(dir: &Path, name: &str, s: usize) -> PathBuf {
    dir.join(format!("{name}.{s}"))
}

/// Maps `path` (see [`map_file`] for the contract: infini-gram indexes are never written after
/// they are built, and infgram only reads them).
fn map(path: &Path) -> Result<Mmap> {
    // SAFETY: the index is read-only to us; its files are not modified while it is open.
    unsafe { map_file(path) }
}

impl Index<Mmap> {
    /// Opens the infini-gram index in `dir` (see the module docs). `token_width` (1, 2 or 4),
    /// when given, must agree with the files (it is detected otherwise).
    pub fn open_infini_gram(dir: &Path, token_width: Option<u8>) -> Result<Self> {
        let shards_n = (0..)
            .take_while(|&s| shard_file(dir, "tokenized", s).is_file())
            .count();
        if shards_n == 0 {
            return Err(Error::input(format!(
                "{} is not an index: it has neither index.json (infgram) nor tokenized.0 \
                 (infini-gram); build one with `infgram index`",
                dir.display()
            )));
        }
        let mut width: Option<u8> = token_width;
        let mut parts = Vec::with_capacity(shards_n);
        for s in 0..shards_n {
            let tokens = map(&shard_file(dir, "tokenized", s))?;
            let table_path = shard_file(dir, "table", s);
            let table = map(&table_path)?;
            let found = detect_width(tokens.len() as u64, table.len() as u64);
            let w = match (found, width) {
                (Some(f), Some(w)) if f == w => w,
                (Some(f), None) => f,
                (found, w) => {
                    return Err(Error::corrupt(
                        &table_path,
                        format!(
                            "{} bytes do not make the suffix array of tokenized.{s} ({} bytes){}; \
                             the table is incomplete or the token width is wrong",
                            table.len(),
                            tokens.len(),
                            match (found, w) {
                                (Some(f), Some(w)) => format!(
                                    " at {w}-byte tokens (it does at {f}-byte tokens: \
                                     token_dtype u{})",
                                    8 * f
                                ),
                                _ => String::new(),
                            }
                        ),
                    ))
                }
            };
            width = Some(w);
            let offsets_path = shard_file(dir, "offset", s);
            let offsets = map(&offsets_path)?;
            check_offsets(&offsets_path, &offsets, &tokens, w)?;
            let meta = open_metadata(dir, s, offsets.len())?;
            parts.push((tokens, table, offsets, meta));
        }
        let width = width.expect("at least one shard");
        let sep = separator_for_width(width);
        let spec = if width == 1 {
            ByteTokenizer.spec()
        } else {
            IdsOnly {
                vocab_size: sep as usize,
            }
            .spec()
        };
        let mut header = Header::new(spec, width);
        let mut shards = Vec::with_capacity(parts.len());
        for (s, (tokens, table, offsets, meta)) in parts.into_iter().enumerate() {
            let pw = pointer_bytes(tokens.len() as u64);
            let shard = Shard::new(tokens, table, None, offsets, meta, width as usize, pw, sep)
                .infini_gram();
            let (n, docs) = (shard.len() as u64, shard.num_docs() as u64);
            header.total_tokens += n - docs;
            header.total_documents += docs;
            header.shards.push(ShardHeader {
                dir: format!("tokenized.{s}"),
                tokens: n,
                documents: docs,
                pointer_width: pw as u8,
                reverse: false,
                files: Default::default(),
            });
            shards.push(shard);
        }
        header.created_by = "infini-gram (read as it is)".into();
        Ok(Index {
            header,
            shards,
            dir: Some(dir.to_path_buf()),
            counts: Default::default(),
            // infini-gram's files carry no checksums: nothing is sampled, nothing verified.
            sampled: false,
        })
    }
}

/// Checks a shard's document offsets: one u64 per document, the first at 0, increasing, each
/// on a token boundary inside the tokens and pointing at a separator (all of them up to
/// [`FULL_OFFSET_CHECK`] documents, a sample beyond).
fn check_offsets(path: &Path, offsets: &[u8], tokens: &[u8], w: u8) -> Result<()> {
    let w = w as usize;
    if !offsets.len().is_multiple_of(8) {
        return Err(Error::corrupt(path, "size is not a multiple of 8 bytes"));
    }
    let n_docs = offsets.len() / 8;
    if n_docs == 0 {
        return if tokens.is_empty() {
            Ok(())
        } else {
            Err(Error::corrupt(
                path,
                "no document offsets for a shard of tokens",
            ))
        };
    }
    let off = |d: usize| {
        u64::from_le_bytes(offsets[8 * d..8 * d + 8].try_into().expect("8 bytes")) as usize
    };
    let step = if n_docs <= FULL_OFFSET_CHECK {
        1
    } else {
        n_docs / SAMPLED_OFFSETS
    };
    let sep_at = |o: usize| {
        tokens
            .get(o..o + w)
            .is_some_and(|b| b.iter().all(|&x| x == 0xFF))
    };
    for d in (0..n_docs).step_by(step).chain([n_docs - 1]) {
        let o = off(d);
        let next = if d + 1 < n_docs {
            off(d + 1)
        } else {
            tokens.len()
        };
        let ok = (d > 0 || o == 0) && o % w == 0 && o < next && next <= tokens.len() && sep_at(o);
        if !ok {
            return Err(Error::corrupt(
                path,
                format!(
                    "document {d}'s offset {o} is not the separator before it (next offset \
                     {next}, {} bytes of tokens): the index is damaged or not infini-gram's",
                    tokens.len()
                ),
            ));
        }
    }
    Ok(())
}

/// `metadata.N` and `metaoff.N` if both are present (one offset per document).
fn open_metadata(dir: &Path, s: usize, offsets_bytes: usize) -> Result<Option<(Mmap, Mmap)>> {
    let (mt, om) = (
        shard_file(dir, "metadata", s),
        shard_file(dir, "metaoff", s),
    );
    if !mt.is_file() || !om.is_file() {
        return Ok(None);
    }
    let (meta, metaoff) = (map(&mt)?, map(&om)?);
    if metaoff.len() != offsets_bytes {
        return Err(Error::corrupt(
            &om,
            format!(
                "{} bytes for {} documents: one u64 per document was expected",
                metaoff.len(),
                offsets_bytes / 8
            ),
        ));
    }
    Ok(Some((meta, metaoff)))
}
