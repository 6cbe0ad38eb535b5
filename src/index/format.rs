//! The on-disk header (`index.json`) and the checks run when an index is opened.
//! `FORMAT.md` at the top of the repository draws the whole layout.

use crate::error::{Error, Result};
use crate::tokenizer::TokenizerSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Identifies an infgram index header.
pub const MAGIC: &str = "infgram-index";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Name of the header file in an index directory.
pub const HEADER_FILE: &str = "index.json";
/// Files up to this size are checksummed every time the index is opened.
pub const SMALL_FILE_LIMIT: u64 = 64 << 20;
/// Zero bytes after the last pointer of a suffix-array file, so that every pointer can be read
/// with one unaligned 8-byte load.
pub const SA_PADDING: usize = 8;

/// Size and checksum of one file of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Exact length in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE) of the whole file.
    pub crc32: u32,
    /// CRC-32 of each [`BLOCK_BYTES`] block (the last one shorter), for files of more than one
    /// block: opening checks [`SAMPLED_BLOCKS`] of them instead of a file larger than
    /// [`SMALL_FILE_LIMIT`]. Empty for one-block files and for indexes written before it
    /// existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_crc32: Vec<u32>,
}

/// Bytes per checksummed block of a large file.
pub const BLOCK_BYTES: usize = 1 << 20;

/// Blocks of a large file checked when an index is opened: the first, the last, and others
/// spread over the file at random.
pub const SAMPLED_BLOCKS: usize = 8;

impl FileInfo {
    /// The size and checksums of `bytes` (block checksums when it is more than one block).
    pub fn of(bytes: &[u8]) -> FileInfo {
        let block_crc32 = if bytes.len() > BLOCK_BYTES {
            bytes.chunks(BLOCK_BYTES).map(crc32fast::hash).collect()
        } else {
            Vec::new()
        };
        FileInfo {
            bytes: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
            block_crc32,
        }
    }

    /// Checks `bytes` against the header at open: the whole file up to `full_limit` bytes,
    /// else [`SAMPLED_BLOCKS`] blocks (the first, the last, the rest picked by `seed`). Returns
    /// what is wrong.
    pub fn check_at_open(&self, bytes: &[u8], full_limit: u64, seed: u64) -> Option<String> {
        if self.bytes <= full_limit || self.block_crc32.is_empty() {
            if self.bytes <= full_limit && crc32fast::hash(bytes) != self.crc32 {
                return Some("checksum mismatch".into());
            }
            return None;
        }
        let blocks = self.block_crc32.len();
        if bytes.len().div_ceil(BLOCK_BYTES) != blocks {
            return Some(format!("the header lists {blocks} blocks"));
        }
        let mut x = seed | 1;
        let picks = [0, blocks - 1]
            .into_iter()
            .chain((2..SAMPLED_BLOCKS).map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % blocks as u64) as usize
            }));
        for b in picks {
            let block = &bytes[b * BLOCK_BYTES..((b + 1) * BLOCK_BYTES).min(bytes.len())];
            if crc32fast::hash(block) != self.block_crc32[b] {
                return Some(format!(
                    "checksum mismatch in block {b} (bytes from {})",
                    b * BLOCK_BYTES
                ));
            }
        }
        None
    }
}

/// One shard: a self-contained index of a contiguous run of documents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardHeader {
    /// Sub-directory of the shard, relative to the index directory.
    pub dir: String,
    /// Tokens in `tokens.bin`, separators included.
    pub tokens: u64,
    /// Documents in the shard.
    pub documents: u64,
    /// Bytes per suffix-array pointer.
    pub pointer_width: u8,
    /// Whether `rsa.bin` (suffix array of the reversed token sequence) exists.
    pub reverse: bool,
    /// Every file of the shard, with size and checksum.
    pub files: BTreeMap<String, FileInfo>,
}

/// The header of an index: everything needed to read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`MAGIC`].
    pub magic: String,
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// "little": all integers in the index are little-endian.
    pub byte_order: String,
    /// The tokenizer the index was built with.
    pub tokenizer: TokenizerSpec,
    /// Bytes per token: 1, 2 or 4.
    pub token_width: u8,
    /// The document separator id: all bits of a token set.
    pub separator: u32,
    /// Corpus tokens in all shards, separators excluded.
    pub total_tokens: u64,
    /// Documents in all shards.
    pub total_documents: u64,
    /// The shards, in corpus order.
    pub shards: Vec<ShardHeader>,
    /// Version of infgram that wrote the index.
    pub created_by: String,
    /// CRC-32 of this header serialized with `header_crc32 = 0`.
    pub header_crc32: u32,
}

/// Token width for a vocabulary of `vocab_size` ids, keeping the all-ones id free as separator.
pub fn token_width_for_vocab(vocab_size: usize) -> u8 {
    // Ids are 0..vocab_size; the separator (all bits set) must stay above the largest id.
    if vocab_size <= 0xFF {
        1
    } else if vocab_size <= 0xFFFF {
        2
    } else {
        4
    }
}

/// The separator id (all bits set) of a token width.
pub fn separator_for_width(width: u8) -> u32 {
    match width {
        1 => 0xFF,
        2 => 0xFFFF,
        _ => u32::MAX,
    }
}

/// Bytes per pointer for a shard of `n` tokens (as few as can address `0..=n`).
pub fn pointer_width_for_len(n: u64) -> u8 {
    let bits = 64 - n.leading_zeros();
    (bits.div_ceil(8)).max(1) as u8
}

impl Header {
    /// The header of an index with no shard yet, written by this version.
    pub fn new(tokenizer: TokenizerSpec, token_width: u8) -> Self {
        Header {
            magic: MAGIC.into(),
            format_version: FORMAT_VERSION,
            byte_order: "little".into(),
            tokenizer,
            token_width,
            separator: separator_for_width(token_width),
            total_tokens: 0,
            total_documents: 0,
            shards: Vec::new(),
            created_by: concat!("infgram ", env!("CARGO_PKG_VERSION")).into(),
            header_crc32: 0,
        }
    }

    fn crc(&self) -> u32 {
        let mut h = self.clone();
        h.header_crc32 = 0;
        crc32fast::hash(&serde_json::to_vec(&h).expect("header serializes"))
    }

    /// Fills in the header checksum.
    pub fn seal(&mut self) {
        self.header_crc32 = self.crc();
    }

    /// Writes the header to `dir/index.json`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(HEADER_FILE);
        let text = serde_json::to_string_pretty(self).expect("header serializes");
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    }

    /// Reads and validates `dir/index.json` (magic, version, checksum, widths).
    pub fn read(dir: &Path) -> Result<Header> {
        let path = dir.join(HEADER_FILE);
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(Error::input(format!(
                    "{}: a symbolic link that leads back to itself (a loop): name the index \
                     directory itself",
                    dir.display()
                )));
            }
            Ok(_) => {
                return Err(Error::input(format!(
                    "{}: a file, not an index directory: name the directory `infgram index -o` \
                     wrote",
                    dir.display()
                )));
            }
            Err(_) => {
                return Err(Error::input(format!(
                    "{}: no index here; build one with `infgram index -o {} FILES...`",
                    dir.display(),
                    dir.display()
                )));
            }
        }
        let text = std::fs::read(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::corrupt(&path, "the header file is missing (an unfinished build?)")
            } else {
                Error::io(&path, e)
            }
        })?;
        let value: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| Error::corrupt(&path, format!("not valid JSON ({e})")))?;
        if value.get("magic").and_then(|m| m.as_str()) != Some(MAGIC) {
            return Err(Error::corrupt(
                &path,
                "not an infgram index header (bad magic)",
            ));
        }
        let got = value
            .get("format_version")
            .and_then(|v| v.as_u64())
            .unwrap_or(0) as u32;
        if got != FORMAT_VERSION {
            return Err(Error::Version {
                path,
                expected: FORMAT_VERSION,
                got,
            });
        }
        let header: Header = serde_json::from_value(value)
            .map_err(|e| Error::corrupt(&path, format!("malformed header ({e})")))?;
        if header.crc() != header.header_crc32 {
            return Err(Error::corrupt(&path, "header checksum mismatch"));
        }
        if header.byte_order != "little" || !matches!(header.token_width, 1 | 2 | 4) {
            return Err(Error::corrupt(
                &path,
                "unsupported byte order or token width",
            ));
        }
        if header.separator != separator_for_width(header.token_width) {
            return Err(Error::corrupt(
                &path,
                "separator does not match the token width",
            ));
        }
        Ok(header)
    }
}
