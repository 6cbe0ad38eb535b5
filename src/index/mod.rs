//! The ∞-gram index: build ([`build`]), on-disk format ([`format`](mod@format)), one shard ([`Shard`]),
//! and the whole index ([`Index`]) with its queries ([`query`]), answered shard by shard and
//! merged ([`shards`]). [`shards::Shards`] is the one trait every reader of a corpus reads
//! through, an index here or shards held elsewhere: the queries, a context's SBIS levels
//! ([`levels`]), the copy guard's spans ([`spans`]) and what the fixed-order and Kneser–Ney
//! models count ([`counting`]).
//!
//! An [`Index`] is generic over the bytes of its files: [`Index::open`] memory-maps a directory
//! (`Index<Mmap>`; infgram's format, or infini-gram's read as it is: [`infini_gram`]), [`Index::from_shards`] wraps freshly built bytes (`Index<Vec<u8>>`). The two
//! answer every query identically; tests check that they do.

pub mod build;
pub mod counting;
pub mod counts_cache;
pub mod format;
pub mod infini_gram;
pub mod levels;
pub mod output_dir;
pub mod pipeline;
pub mod query;
mod shard;
pub mod shards;
pub mod spans;

pub use shard::{Layout, Range, Shard};

use crate::error::{Error, Result};
use crate::tokenizer::TokenizerSpec;
use build::ShardBytes;
use format::*;
use memmap2::Mmap;
use std::path::{Path, PathBuf};

/// Indexes [`Index::open`] was asked to open in this process: what the server reports
/// (`infgram_index_opens_total`), so that a request that reopens an index shows.
static OPENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times [`Index::open`] was called in this process.
pub fn opens_so_far() -> u64 {
    OPENS.load(std::sync::atomic::Ordering::Relaxed)
}

/// An index: a header and its shards, and the next-token counts its users have asked for.
pub struct Index<S> {
    header: Header,
    shards: Vec<Shard<S>>,
    dir: Option<PathBuf>,
    counts: counts_cache::CountsCache,
    /// Whether some file was checked at open by sampled blocks only (a large file).
    sampled: bool,
}

/// An index shows where it lives and its size (not its bytes).
impl<S> std::fmt::Debug for Index<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tokens", &self.header.total_tokens)
            .finish_non_exhaustive()
    }
}

/// Memory-maps `path` read-only.
///
/// # Safety
/// The file must not be modified or truncated while the map lives: a write by another process
/// would change answers, and a truncation would make reads fault (`SIGBUS`). infgram never writes
/// to a finished index (builds happen in a temporary directory and are renamed into place).
unsafe fn map_file(path: &Path) -> Result<Mmap> {
    let f = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::corrupt(path, "file missing; the shard is incomplete")
        } else {
            Error::io(path, e)
        }
    })?;
    // SAFETY: forwarded to the caller (see the function's contract).
    let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
    #[cfg(unix)]
    if let Err(e) = map.advise(memmap2::Advice::Random) {
        diag!("warning: madvise on {}: {e}", path.display());
    }
    Ok(map)
}

/// The identity (device, inode) of a directory, to notice that it was swapped.
/// A seed that differs from one opening to the next, so repeated openings check different
/// blocks of large files.
fn open_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

fn dir_identity(dir: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

impl Index<Mmap> {
    /// Opens the index in `dir`: validates the header, the presence and size of every file,
    /// and the checksums of the small files. [`Index::verify`] checks the large ones too.
    ///
    /// An index rebuilt with `--force` is swapped in whole; an open that failed because the
    /// directory was swapped under it (its identity changed) is tried again.
    ///
    /// A directory written by infini-gram's indexer (no `index.json`, a `tokenized.0`) is
    /// opened as it is ([`Index::open_infini_gram`]).
    pub fn open(dir: &Path) -> Result<Self> {
        OPENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if infini_gram::is_infini_gram_dir(dir) {
            return Self::open_infini_gram(dir, None);
        }
        let mut tries = 0;
        loop {
            let before = dir_identity(dir);
            match Self::open_once(dir) {
                Err(_) if tries < 3 && dir_identity(dir) != before => tries += 1,
                result => return result,
            }
        }
    }

    fn open_once(dir: &Path) -> Result<Self> {
        Self::open_checked(dir, SMALL_FILE_LIMIT)
    }

    /// Opens the index at `dir`, checking files up to `full_limit` bytes whole and larger ones
    /// by sampled blocks ([`FileInfo::check_at_open`]); for tests of the sampled check.
    #[doc(hidden)]
    pub fn open_checked(dir: &Path, full_limit: u64) -> Result<Self> {
        let header = Header::read(dir)?;
        let mut shards = Vec::with_capacity(header.shards.len());
        for sh in &header.shards {
            // A shard directory is a plain name inside the index, never a path out of it.
            let plain = Path::new(&sh.dir)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain || sh.dir.is_empty() {
                return Err(Error::corrupt(
                    dir.join(HEADER_FILE),
                    format!(
                        "shard directory {:?} is not a name inside the index",
                        sh.dir
                    ),
                ));
            }
            let sdir = dir.join(&sh.dir);
            if !sdir.is_dir() {
                return Err(Error::corrupt(
                    &sdir,
                    "shard directory missing; restore it or rebuild the index",
                ));
            }
            let open = |name: &str| -> Result<Mmap> {
                let path = sdir.join(name);
                let info = sh.files.get(name).ok_or_else(|| {
                    Error::corrupt(dir.join(HEADER_FILE), format!("no entry for {name}"))
                })?;
                // SAFETY: finished indexes are never written to (see `map_file`).
                let map = unsafe { map_file(&path)? };
                if map.len() as u64 != info.bytes {
                    return Err(Error::corrupt(
                        &path,
                        format!(
                            "{} bytes, the header says {} (truncated or overwritten)",
                            map.len(),
                            info.bytes
                        ),
                    ));
                }
                if let Some(what) = info.check_at_open(&map, full_limit, open_seed()) {
                    return Err(Error::corrupt(&path, what));
                }
                Ok(map)
            };
            let w = header.token_width as usize;
            let tokens = open("tokens.bin")?;
            let sa = open("sa.bin")?;
            let rsa = if sh.reverse {
                Some(open("rsa.bin")?)
            } else {
                None
            };
            let docs = open("docs.bin")?;
            let meta = (open("meta.jsonl")?, open("meta_offsets.bin")?);
            // Optional: indexes written before sample.bin existed still open.
            let sample = if sh.files.contains_key("sample.bin") {
                Some(open("sample.bin")?)
            } else {
                None
            };
            let n = sh.tokens as usize;
            let pw = sh.pointer_width as usize;
            let sa_ok = |m: &Mmap| m.len() == n * pw + SA_PADDING;
            if tokens.len() != n * w || !sa_ok(&sa) || rsa.as_ref().is_some_and(|r| !sa_ok(r)) {
                return Err(Error::corrupt(
                    &sdir,
                    "file sizes disagree with the token count",
                ));
            }
            if docs.len() != (sh.documents as usize + 1) * 8 {
                return Err(Error::corrupt(
                    sdir.join("docs.bin"),
                    "size disagrees with the document count",
                ));
            }
            shards.push(
                Shard::new(tokens, sa, rsa, docs, Some(meta), w, pw, header.separator)
                    .with_sample(sample),
            );
        }
        // Files past `full_limit` with block checksums were checked by sampled blocks only.
        let sampled = header
            .shards
            .iter()
            .flat_map(|sh| sh.files.values())
            .any(|f| f.bytes > full_limit && !f.block_crc32.is_empty());
        Ok(Index {
            header,
            shards,
            dir: Some(dir.to_path_buf()),
            counts: Default::default(),
            sampled,
        })
    }

    /// Whether opening checked some file by sampled blocks only (files over 64 MiB), so that
    /// damage elsewhere in it could go unseen until [`Index::verify`] reads every byte.
    pub fn checked_by_sampling(&self) -> bool {
        self.sampled
    }

    /// Checks the checksum of every file, large ones included (reads the whole index, a
    /// block at a time).
    pub fn verify(&self) -> Result<()> {
        use std::io::Read;
        let dir = self.dir.as_ref().expect("opened from a directory");
        let mut buf = vec![0u8; 8 << 20];
        for sh in &self.header.shards {
            for (name, info) in &sh.files {
                let path = dir.join(&sh.dir).join(name);
                let mut file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
                let mut hasher = crc32fast::Hasher::new();
                loop {
                    let n = file.read(&mut buf).map_err(|e| Error::io(&path, e))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                }
                if hasher.finalize() != info.crc32 {
                    return Err(Error::corrupt(&path, "checksum mismatch"));
                }
            }
        }
        Ok(())
    }
}

impl Index<Vec<u8>> {
    /// Builds an in-memory index of tokenized documents, `docs_per_shard` documents a shard.
    pub fn from_docs(
        tokenizer: TokenizerSpec,
        docs: &[Vec<u32>],
        docs_per_shard: usize,
        reverse: bool,
    ) -> Result<Self> {
        let width = token_width_for_vocab(tokenizer.vocab_size);
        let mut built = Vec::new();
        for chunk in docs.chunks(docs_per_shard.max(1)) {
            let mut w = build::ShardWriter::new(width);
            for d in chunk {
                w.push(d, "{}")?;
            }
            built.push(w.finish(tokenizer.vocab_size, reverse)?);
        }
        if built.is_empty() {
            built.push(build::ShardWriter::new(width).finish(tokenizer.vocab_size, reverse)?);
        }
        Ok(Self::from_shards(tokenizer, width, built))
    }

    /// Wraps shards built in memory (tests, small corpora).
    pub fn from_shards(tokenizer: TokenizerSpec, width: u8, built: Vec<ShardBytes>) -> Self {
        let sep = separator_for_width(width);
        let mut header = Header::new(tokenizer, width);
        let mut shards = Vec::new();
        for (i, b) in built.into_iter().enumerate() {
            let n = b.tokens.len() / width as usize;
            header.total_tokens += n as u64 - b.documents;
            header.total_documents += b.documents;
            header.shards.push(ShardHeader {
                dir: format!("shard-{i:04}"),
                tokens: n as u64,
                documents: b.documents,
                pointer_width: b.pointer_width,
                reverse: b.rsa.is_some(),
                files: Default::default(),
            });
            shards.push(
                Shard::new(
                    b.tokens,
                    b.sa,
                    b.rsa,
                    b.docs,
                    Some((b.meta, b.meta_offsets)),
                    width as usize,
                    b.pointer_width as usize,
                    sep,
                )
                .with_sample(Some(b.sample)),
            );
        }
        header.seal();
        Index {
            header,
            shards,
            dir: None,
            counts: Default::default(),
            sampled: false,
        }
    }
}

impl<S: AsRef<[u8]> + Sync> Index<S> {
    /// One index of the shards of several (infini-gram's engine takes a list of index
    /// directories): they must have the same token width and tokenizer.
    pub fn merge(indexes: Vec<Index<S>>) -> Result<Self> {
        let mut it = indexes.into_iter();
        let mut first = it
            .next()
            .ok_or_else(|| Error::input("no index to open: give at least one directory"))?;
        for other in it {
            let (a, b) = (&first.header, &other.header);
            if a.token_width != b.token_width || a.tokenizer.fingerprint != b.tokenizer.fingerprint
            {
                return Err(Error::input(format!(
                    "{} and {} have different tokens ({}-byte, tokenizer {:?} vs {}-byte, {:?}): \
                     they cannot be queried as one",
                    first.dir.as_deref().unwrap_or(Path::new("?")).display(),
                    other.dir.as_deref().unwrap_or(Path::new("?")).display(),
                    a.token_width,
                    a.tokenizer.kind,
                    b.token_width,
                    b.tokenizer.kind
                )));
            }
            first.header.total_tokens += other.header.total_tokens;
            first.header.total_documents += other.header.total_documents;
            first.header.shards.extend(other.header.shards);
            first.shards.extend(other.shards);
            first.sampled |= other.sampled;
        }
        first.counts.clear();
        Ok(first)
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The shards.
    pub fn shards(&self) -> &[Shard<S>] {
        &self.shards
    }
    /// The bounded cache of next-token counts of large occurrence sets that the ∞-gram
    /// estimators on this index share ([`counts_cache`]).
    pub fn counts_cache(&self) -> &counts_cache::CountsCache {
        &self.counts
    }
    /// The directory the index was opened from.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
    /// Corpus tokens, separators excluded.
    pub fn total_tokens(&self) -> u64 {
        self.header.total_tokens
    }
    /// The document separator id.
    pub fn separator(&self) -> u32 {
        self.header.separator
    }
    /// Vocabulary size of the index's tokenizer.
    pub fn vocab_size(&self) -> usize {
        self.header.tokenizer.vocab_size
    }
    /// Whether every shard has the reversed suffix array.
    pub fn has_reverse(&self) -> bool {
        self.shards.iter().all(|s| s.has_reverse())
    }
    /// Tokens of the longest document (separators excluded; 0 for an empty index): no
    /// n-gram of the corpus is longer. One read of the document offsets.
    pub fn longest_document(&self) -> usize {
        self.shards
            .iter()
            .flat_map(|s| (0..s.num_docs()).map(move |d| s.doc_span(d)))
            .map(|(a, b)| b - a)
            .max()
            .unwrap_or(0)
    }
}
