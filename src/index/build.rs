//! Write side: turns tokenized documents into shards (tokens, suffix arrays, document offsets,
//! metadata) in memory or in a directory.
//!
//! Suffix arrays come from libsais (SA-IS; OpenMP-parallel for large shards): `u8` tokens are
//! sorted as bytes, `u16` tokens with the 16-bit variant, `u32` tokens with the integer variant
//! after mapping the separator to `vocab_size` (it stays the largest symbol, so the order is the
//! one [`Shard`](super::Shard) searches in). Pointers are then packed into the fewest bytes
//! that address the shard. A directory build happens in `OUT.tmp-PID` and is renamed to `OUT`
//! only when every file and the header are written; a failure removes the temporary directory.

use crate::error::{Error, Result};
use crate::index::format::*;
use libsais::{SuffixArrayConstruction, ThreadCount};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

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

/// A directory being built: removed on drop unless [`TempIndexDir::commit`] renamed it.
pub struct TempIndexDir {
    tmp: PathBuf,
    out: PathBuf,
    overwrite: bool,
    done: bool,
}

/// The temporary directories of this process's builds in progress: what
/// [`remove_unfinished`] removes when the process is told to stop.
static UNFINISHED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// The list of unfinished builds (a panic elsewhere while it was held leaves it usable).
fn unfinished() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    UNFINISHED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes the temporary directories of this process's builds in progress: for a signal
/// handler (SIGINT, SIGTERM) to call before the process exits, so an interrupted build leaves
/// nothing behind. (A build killed outright, SIGKILL, is cleaned up by the next build beside it.)
pub fn remove_unfinished() {
    for dir in unfinished().drain(..) {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Whether `dir` is an infgram index (it has a header): only those are replaced by `--force`.
fn is_index(dir: &Path) -> bool {
    dir.join(super::format::HEADER_FILE).is_file()
}

/// Refuses to replace `out` unless it is an index, and never when an input lies inside it.
fn check_replaceable(out: &Path, inputs: &[PathBuf]) -> Result<()> {
    if !is_index(out) {
        return Err(Error::input(format!(
            "{} exists and is not an infgram index (no {}): --force replaces only an index; \
             choose another -o or remove it yourself",
            out.display(),
            super::format::HEADER_FILE
        )));
    }
    let out_abs = out.canonicalize().map_err(|e| Error::io(out, e))?;
    for input in inputs {
        if input
            .canonicalize()
            .is_ok_and(|i| i.starts_with(&out_abs) || out_abs.starts_with(&i))
        {
            return Err(Error::input(format!(
                "{} holds the input {} (or lies inside it): it will not be replaced",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// Whether process `pid` is alive (on Linux; elsewhere every process counts as alive).
fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Removes `NAME.tmp-PID` and `NAME.old-PID` directories in `parent` left by builds that died.
fn remove_stale(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let file = file.to_string_lossy();
        let pid = [".tmp-", ".old-"]
            .iter()
            .find_map(|tag| file.strip_prefix(name)?.strip_prefix(tag))
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| p != std::process::id() && !process_alive(p)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// `OUT.TAG-PID` beside `out`: this process's temporary (`tmp`) or replaced (`old`) directory.
fn sibling(out: &Path, tag: &str) -> PathBuf {
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    out.with_file_name(format!("{name}.{tag}-{}", std::process::id()))
}

/// Swaps two directory entries atomically (Linux `renameat2(RENAME_EXCHANGE)`); `false` where
/// the system cannot.
fn exchange(a: &Path, b: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let (Ok(a), Ok(b)) = (
            std::ffi::CString::new(a.as_os_str().as_bytes()),
            std::ffi::CString::new(b.as_os_str().as_bytes()),
        ) else {
            return false;
        };
        // SAFETY: both paths are valid NUL-terminated strings for the duration of the call.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        r == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (a, b);
        false
    }
}

impl TempIndexDir {
    /// Creates `OUT.tmp-PID` beside `out` (removing those of builds that died). Fails if `out`
    /// exists, unless `overwrite` and `out` is an index that holds none of `inputs`.
    pub fn create(out: &Path, overwrite: bool, inputs: &[PathBuf]) -> Result<Self> {
        if out.exists() {
            if !overwrite {
                return Err(Error::input(format!(
                    "{} already exists; choose another -o or pass --force to replace it",
                    out.display()
                )));
            }
            check_replaceable(out, inputs)?;
        }
        let name = out
            .file_name()
            .ok_or_else(|| Error::input(format!("{}: not a directory name", out.display())))?
            .to_string_lossy()
            .into_owned();
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        remove_stale(parent, &name);
        let tmp = sibling(out, "tmp");
        if tmp.exists() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        unfinished().push(tmp.clone());
        Ok(TempIndexDir {
            tmp,
            out: out.to_path_buf(),
            overwrite,
            done: false,
        })
    }

    /// The temporary directory.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished directory into place. A new `out` is a plain rename, which fails if
    /// something appeared at `out` meanwhile (nothing is removed that this build did not
    /// create). An index being replaced (`--force`) is swapped atomically where the system
    /// can (readers see the old index or the new one, never a hole), then deleted.
    pub fn commit(mut self) -> Result<()> {
        if self.out.exists() {
            if !self.overwrite {
                return Err(Error::input(format!(
                    "{} appeared while this index was being built; it was left alone and the \
                     new index discarded",
                    self.out.display()
                )));
            }
            if !is_index(&self.out) {
                return Err(Error::input(format!(
                    "{} is no longer an infgram index; it was left alone",
                    self.out.display()
                )));
            }
            if exchange(&self.tmp, &self.out) {
                // `tmp` now holds the old index.
                self.done = true;
                let _ = std::fs::remove_dir_all(&self.tmp);
                return Ok(());
            }
            let old = sibling(&self.out, "old");
            std::fs::rename(&self.out, &old).map_err(|e| Error::io(&self.out, e))?;
            std::fs::rename(&self.tmp, &self.out).map_err(|e| Error::io(&self.out, e))?;
            self.done = true;
            let _ = std::fs::remove_dir_all(&old);
            return Ok(());
        }
        std::fs::rename(&self.tmp, &self.out).map_err(|e| Error::io(&self.out, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for TempIndexDir {
    fn drop(&mut self) {
        unfinished().retain(|d| d != &self.tmp);
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Writes one shard's files into `dir/name` and returns its header entry.
pub fn write_shard(dir: &Path, name: &str, s: &ShardBytes, reverse: bool) -> Result<ShardHeader> {
    let sdir = dir.join(name);
    std::fs::create_dir_all(&sdir).map_err(|e| Error::io(&sdir, e))?;
    let mut files = BTreeMap::new();
    let mut put = |file: &str, bytes: &[u8]| -> Result<()> {
        let path = sdir.join(file);
        let mut f = std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
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

#[cfg(test)]
mod temp_dir_tests {
    use super::*;

    fn index_dir(path: &Path, marker: &str) {
        std::fs::create_dir_all(path).unwrap();
        std::fs::write(path.join(super::super::format::HEADER_FILE), marker).unwrap();
    }

    #[test]
    fn a_directory_that_appears_during_the_build_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("idx");
        let tmp = TempIndexDir::create(&out, false, &[]).unwrap();
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("mine.txt"), "keep").unwrap();
        let e = tmp.commit().unwrap_err().to_string();
        assert!(e.contains("appeared"), "{e}");
        assert_eq!(
            std::fs::read_to_string(out.join("mine.txt")).unwrap(),
            "keep"
        );
        assert_eq!(
            std::fs::read_dir(t.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn force_replaces_only_an_index_and_swaps_it_whole() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("idx");
        // Not an index: refused, untouched.
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("thesis.txt"), "years of work").unwrap();
        let e = TempIndexDir::create(&out, true, &[])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not an infgram index"), "{e}");
        assert!(out.join("thesis.txt").exists());
        std::fs::remove_dir_all(&out).unwrap();
        // An index holding an input: refused.
        index_dir(&out, "old");
        let input = out.join("corpus.txt");
        std::fs::write(&input, "text").unwrap();
        let e = TempIndexDir::create(&out, true, std::slice::from_ref(&input))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("holds the input"), "{e}");
        std::fs::remove_file(&input).unwrap();
        // An index: replaced whole, nothing left beside it.
        let tmp = TempIndexDir::create(&out, true, &[]).unwrap();
        index_dir(tmp.path(), "new");
        tmp.commit().unwrap();
        let header = std::fs::read_to_string(out.join(super::super::format::HEADER_FILE)).unwrap();
        assert_eq!(header, "new");
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    }

    #[test]
    fn temporaries_of_dead_builds_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("idx");
        // No process has this id (above Linux's pid_max).
        let stale = t.path().join("idx.tmp-4294967");
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("sa.bin"), "half").unwrap();
        let other = t.path().join("other.tmp-4294967");
        std::fs::create_dir(&other).unwrap();
        let tmp = TempIndexDir::create(&out, false, &[]).unwrap();
        assert!(!stale.exists() || !cfg!(target_os = "linux"));
        assert!(other.exists(), "another index's temporaries are not ours");
        drop(tmp);
    }
}
