//! Write side: turns tokenized documents into shards (tokens, suffix arrays, document offsets,
//! metadata) in memory or in a directory.
//!
//! Suffix arrays come from libsais (SA-IS; OpenMP-parallel for large shards): `u8` tokens are
//! sorted as bytes, `u16` tokens with the 16-bit variant, `u32` tokens with the integer variant
//! after mapping the separator to `vocab_size` (it stays the largest symbol, so the order is the
//! one [`Shard`](super::Shard) searches in). Pointers are then packed into the fewest bytes
//! that address the shard. Where a directory build writes, and what it may remove, is
//! [`output_dir`](super::output_dir)'s business.

use crate::error::{Error, Result};
use crate::index::format::*;
use libsais::{SuffixArrayConstruction, ThreadCount};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The bytes of one built shard, before they are written or wrapped in a [`Shard`](super::Shard).
#[derive(Clone)]
pub struct ShardBytes {
    /// Token sequence, `width` bytes per token.
    pub tokens: Vec<u8>,
    /// Suffix array, `pointer_width` bytes per pointer, plus padding.
    pub sa: Vec<u8>,
    /// Suffix array of the reversed sequence, if built.
    pub rsa: Option<Vec<u8>>,
    /// Sampled keys of the suffix array (`sample.bin`).
    pub sample: Vec<u8>,
    /// Document start offsets (u64), one more than documents.
    pub docs: Vec<u8>,
    /// Metadata, one JSON line per document.
    pub meta: Vec<u8>,
    /// Offsets (u64) of the metadata lines, one more than documents.
    pub meta_offsets: Vec<u8>,
    /// Bytes per pointer.
    pub pointer_width: u8,
    /// Documents.
    pub documents: u64,
    /// Bytes per token.
    pub width: u8,
}

/// Accumulates documents of one shard.
pub struct ShardWriter {
    width: u8,
    sep: u32,
    tokens: Vec<u8>,
    docs: Vec<u64>,
    meta: Vec<u8>,
    meta_offsets: Vec<u64>,
}

impl ShardWriter {
    /// An empty shard of the given token width.
    pub fn new(width: u8) -> Self {
        ShardWriter {
            width,
            sep: separator_for_width(width),
            tokens: Vec::new(),
            docs: vec![0],
            meta: Vec::new(),
            meta_offsets: vec![0],
        }
    }

    /// Tokens so far (separators included).
    pub fn len(&self) -> usize {
        self.tokens.len() / self.width as usize
    }

    /// Whether no document has been added.
    pub fn is_empty(&self) -> bool {
        self.docs.len() == 1
    }

    /// Appends a document and its separator. Ids must be below the separator.
    pub fn push(&mut self, ids: &[u32], meta: &str) -> Result<()> {
        let w = self.width as usize;
        if let Some(&bad) = ids.iter().find(|&&t| t >= self.sep) {
            return Err(Error::input(format!(
                "token id {bad} does not fit a {w}-byte index (largest id {})",
                self.sep - 1
            )));
        }
        self.tokens.reserve((ids.len() + 1) * w);
        for &t in ids.iter().chain(std::iter::once(&self.sep)) {
            self.tokens.extend_from_slice(&t.to_le_bytes()[..w]);
        }
        self.docs.push(self.len() as u64);
        self.meta.extend_from_slice(meta.as_bytes());
        self.meta.push(b'\n');
        self.meta_offsets.push(self.meta.len() as u64);
        Ok(())
    }

    /// Sorts the suffixes and packs everything into [`ShardBytes`].
    pub fn finish(self, vocab_size: usize, reverse: bool) -> Result<ShardBytes> {
        let n = self.len();
        let pw = pointer_width_for_len(n as u64);
        let sa = suffix_array(&self.tokens, self.width, vocab_size, pw)?;
        let sample = super::shard::sample_keys(&self.tokens, self.width as usize, &sa, pw as usize);
        let rsa = if reverse {
            let w = self.width as usize;
            let mut rev = Vec::with_capacity(self.tokens.len());
            for chunk in self.tokens.chunks_exact(w).rev() {
                rev.extend_from_slice(chunk);
            }
            Some(suffix_array(&rev, self.width, vocab_size, pw)?)
        } else {
            None
        };
        let u64s = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        Ok(ShardBytes {
            documents: (self.docs.len() - 1) as u64,
            docs: u64s(&self.docs),
            meta_offsets: u64s(&self.meta_offsets),
            tokens: self.tokens,
            sa,
            rsa,
            sample,
            meta: self.meta,
            pointer_width: pw,
            width: self.width,
        })
    }
}

/// Suffix array of a little-endian token sequence, packed into `pw`-byte pointers (the
/// 32- or 64-bit array libsais returns is packed straight away, never widened: peak memory is
/// tokens + libsais's array + the packed one).
fn suffix_array(tokens: &[u8], width: u8, vocab_size: usize, pw: u8) -> Result<Vec<u8>> {
    let n = tokens.len() / width as usize;
    if n == 0 {
        return Ok(pack_pointers(&[] as &[i32], pw));
    }
    let threads = if n > 1 << 20 {
        ThreadCount::openmp_default()
    } else {
        ThreadCount::fixed(1)
    };
    let err =
        |e: libsais::LibsaisError| Error::input(format!("suffix array construction failed: {e:?}"));
    let small = n < (i32::MAX as usize) - 16;
    macro_rules! run {
        ($c:expr) => {{
            if small {
                let sa = $c
                    .in_owned_buffer32()
                    .multi_threaded(threads)
                    .run()
                    .map_err(err)?;
                pack_pointers(sa.suffix_array(), pw)
            } else {
                let sa = $c
                    .in_owned_buffer64()
                    .multi_threaded(threads)
                    .run()
                    .map_err(err)?;
                pack_pointers(sa.suffix_array(), pw)
            }
        }};
    }
    Ok(match width {
        1 => run!(SuffixArrayConstruction::for_text(tokens)),
        2 => {
            let t: Vec<u16> = tokens
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            run!(SuffixArrayConstruction::for_text(&t))
        }
        _ => {
            // Dense alphabet: ids < vocab_size, separator mapped to vocab_size (still largest).
            let sep_code = vocab_size as i32;
            let mut t: Vec<i32> = tokens
                .chunks_exact(4)
                .map(|c| {
                    let x = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    if x == u32::MAX {
                        sep_code
                    } else {
                        x as i32
                    }
                })
                .collect();
            if t.iter().any(|&x| x < 0 || x > sep_code) {
                return Err(Error::input(format!(
                    "a token id is not below the vocabulary size {vocab_size}"
                )));
            }
            let alphabet = libsais::suffix_array::AlphabetSize::new(sep_code + 1);
            if small {
                let c = SuffixArrayConstruction::for_text_mut(&mut t)
                    .in_owned_buffer32()
                    .multi_threaded(threads);
                // SAFETY: every value of `t` was checked to lie in [0, sep_code].
                let c = unsafe { c.with_alphabet_size(alphabet) };
                pack_pointers(c.run().map_err(err)?.suffix_array(), pw)
            } else {
                let alphabet = libsais::suffix_array::AlphabetSize::new(sep_code as i64 + 1);
                let mut t64: Vec<i64> = t.iter().map(|&x| x as i64).collect();
                drop(t);
                let c = SuffixArrayConstruction::for_text_mut(&mut t64)
                    .in_owned_buffer64()
                    .multi_threaded(threads);
                // SAFETY: as above.
                let c = unsafe { c.with_alphabet_size(alphabet) };
                pack_pointers(c.run().map_err(err)?.suffix_array(), pw)
            }
        }
    })
}

/// Packs pointers into `pw` little-endian bytes each, followed by [`SA_PADDING`] zero bytes.
fn pack_pointers<P: Copy + TryInto<u64>>(sa: &[P], pw: u8) -> Vec<u8> {
    let pw = pw as usize;
    let mut out = Vec::with_capacity(sa.len() * pw + SA_PADDING);
    for &p in sa {
        let p: u64 = p.try_into().unwrap_or(0); // libsais pointers are never negative
        out.extend_from_slice(&p.to_le_bytes()[..pw]);
    }
    out.extend_from_slice(&[0u8; SA_PADDING]);
    out
}

/// Writes one shard's files into `dir/name` and returns its header entry.
pub fn write_shard(dir: &Path, name: &str, s: &ShardBytes, reverse: bool) -> Result<ShardHeader> {
    let sdir = dir.join(name);
    std::fs::create_dir_all(&sdir).map_err(|e| Error::io(&sdir, e))?;
    let mut files = BTreeMap::new();
    let mut put = |file: &str, bytes: &[u8]| -> Result<()> {
        let path = sdir.join(file);
        // A new file in the build's own directory (never one planted there).
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        f.write_all(bytes).map_err(|e| Error::io(&path, e))?;
        f.sync_all().map_err(|e| Error::io(&path, e))?;
        files.insert(file.to_string(), FileInfo::of(bytes));
        Ok(())
    };
    put("tokens.bin", &s.tokens)?;
    put("sa.bin", &s.sa)?;
    if let Some(rsa) = &s.rsa {
        put("rsa.bin", rsa)?;
    }
    put("sample.bin", &s.sample)?;
    put("docs.bin", &s.docs)?;
    put("meta.jsonl", &s.meta)?;
    put("meta_offsets.bin", &s.meta_offsets)?;
    Ok(ShardHeader {
        dir: name.to_string(),
        tokens: (s.tokens.len() / s.width as usize) as u64,
        documents: s.documents,
        pointer_width: s.pointer_width,
        reverse,
        files,
    })
}
