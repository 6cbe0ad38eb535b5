//! Corpus input: `.txt` files (one document per file), `.jsonl`, `.jsonl.gz` and `.jsonl.zst`
//! (one document per line, its `text` field; the other fields are kept as the document's
//! metadata, as infini-gram's indexer does), directories walked recursively in sorted order.

use crate::error::{Error, Result};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// One document: its text and a JSON metadata line.
pub struct Doc {
    /// The text.
    pub text: String,
    /// Metadata as one line of JSON.
    pub meta: String,
}

/// How a file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    Jsonl,
    JsonlGz,
    JsonlZst,
}

fn kind_of(path: &Path) -> Kind {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    if name.ends_with(".jsonl.gz") || name.ends_with(".json.gz") {
        Kind::JsonlGz
    } else if name.ends_with(".jsonl.zst") || name.ends_with(".json.zst") {
        Kind::JsonlZst
    } else if name.ends_with(".jsonl") {
        Kind::Jsonl
    } else {
        Kind::Text
    }
}

/// Expands inputs (files and directories) into the list of files, sorted within directories.
pub fn list_files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            // Symbolic links are followed; a loop or a broken link is skipped with a warning.
            let walk = walkdir::WalkDir::new(input)
                .follow_links(true)
                .sort_by_file_name();
            for entry in walk {
                let entry = match entry {
                    Ok(entry) => entry,
                    // A loop to an ancestor, a dangling link, or a link that points at
                    // itself (or into a cycle of links: ELOOP).
                    Err(e)
                        if e.loop_ancestor().is_some()
                            || e.io_error().is_some_and(|io| {
                                io.kind() == std::io::ErrorKind::NotFound
                                    || io.raw_os_error() == Some(libc::ELOOP)
                            }) =>
                    {
                        let at = e.path().map_or(input.clone(), Path::to_path_buf);
                        diag!("warning: skipping {}: {e}", at.display());
                        continue;
                    }
                    Err(e) => return Err(Error::input(format!("{}: {e}", input.display()))),
                };
                if entry.file_type().is_file() {
                    files.push(entry.into_path());
                }
            }
        } else if input.is_file() {
            files.push(input.clone());
        } else {
            return Err(not_an_input(input));
        }
    }
    Ok(files)
}

/// Why `input`, neither a file nor a directory, cannot be read: missing, a loop of symbolic
/// links, unreadable, or a FIFO, device or socket.
fn not_an_input(input: &Path) -> Error {
    let shown = input.display();
    match std::fs::metadata(input) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Error::input(format!("{shown}: no such file or directory"))
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Error::input(format!(
            "{shown}: a loop of symbolic links; point it at a file or directory"
        )),
        Err(e) => Error::io(input, e),
        Ok(_) => Error::input(format!(
            "{shown}: not a regular file or directory (a FIFO, device or socket); give files \
             or directories of text (write a stream to a file first)"
        )),
    }
}

/// A document longer than a build can hold within its memory budget: `bytes` (at least) of
/// `path`'s `place`, against `limit`.
fn too_large(path: &Path, place: &str, bytes: u64, limit: u64) -> Error {
    Error::input(format!(
        "{}{place}: a document of {} MB, more than the {} MB this build reads within its memory \
         budget (a document is indexed whole, in one shard); raise --mem to at least {:.1} GB \
         (a tenth of the budget is the largest document), \
         or split the text into smaller documents (one per line of a .jsonl file)",
        path.display(),
        bytes.div_ceil(1_000_000),
        limit / 1_000_000,
        bytes.saturating_mul(DOC_SHARE) as f64 / 1e9 + 0.05,
    ))
}

/// A document may take this fraction (1 / `DOC_SHARE`) of a build's memory budget in bytes:
/// its text and its token ids (4 bytes each, at most one a byte) are held while it is read and
/// tokenized, beside a shard being built.
const DOC_SHARE: u64 = 10;

/// The largest document, in bytes, that a build within `mem_bytes` reads (64 KiB at least, as
/// a shard holds 64 Ki tokens at least).
pub fn doc_limit(mem_bytes: u64) -> u64 {
    (mem_bytes / DOC_SHARE).max(1 << 16)
}

/// Reads the documents of a JSON-lines stream (`path` names it in errors): one object per
/// non-blank line with a string field `text`; the other fields become the metadata.
pub fn for_each_jsonl_doc(
    reader: impl Read,
    path: &Path,
    f: impl FnMut(Doc, u64) -> Result<()>,
) -> Result<()> {
    for_each_jsonl_doc_within(reader, path, u64::MAX, f)
}

/// [`for_each_jsonl_doc`], refusing a line longer than `limit` bytes before it is held whole.
fn for_each_jsonl_doc_within(
    reader: impl Read,
    path: &Path,
    limit: u64,
    mut f: impl FnMut(Doc, u64) -> Result<()>,
) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    let mut bytes = Vec::new();
    for lineno in 0.. {
        bytes.clear();
        let n = (&mut reader)
            .take(limit.saturating_add(1))
            .read_until(b'\n', &mut bytes)
            .map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        } else if n as u64 > limit {
            return Err(too_large(
                path,
                &format!(":{}", lineno + 1),
                n as u64,
                limit,
            ));
        }
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        let line = std::str::from_utf8(&bytes).map_err(|e| {
            Error::io(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let n = line.len() as u64 + 1;
        let mut value: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
            .map_err(|e| {
                Error::input(format!(
                    "{}:{}: not a JSON object ({e})",
                    path.display(),
                    lineno + 1
                ))
            })?;
        let text = match value.remove("text") {
            Some(serde_json::Value::String(s)) => s,
            _ => {
                return Err(Error::input(format!(
                    "{}:{}: no string field \"text\"",
                    path.display(),
                    lineno + 1
                )))
            }
        };
        let meta = serde_json::Value::Object(value).to_string();
        f(Doc { text, meta }, n)?;
    }
    Ok(())
}

/// Bytes of `bytes` that are not part of valid UTF-8.
fn invalid_utf8_bytes(bytes: &[u8]) -> usize {
    bytes.utf8_chunks().map(|c| c.invalid().len()).sum()
}

/// Total size in bytes of `files` on disk (for progress).
pub fn total_bytes(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Reads every document of `files` in order, calling `f(doc, bytes_read)`.
pub fn for_each_doc(
    files: &[PathBuf],
    root_of: impl Fn(&Path) -> String,
    f: impl FnMut(Doc, u64) -> Result<()>,
) -> Result<()> {
    for_each_doc_in(files, 0..u64::MAX, u64::MAX, root_of, f)
}

/// Refuses, before anything is read, a text file (one document) larger than `limit` bytes.
pub fn check_text_sizes(files: &[PathBuf], limit: u64) -> Result<()> {
    for path in files.iter().filter(|p| kind_of(p) == Kind::Text) {
        let bytes = std::fs::metadata(path)
            .map_err(|e| Error::io(path, e))?
            .len();
        if bytes > limit {
            return Err(too_large(path, "", bytes, limit));
        }
    }
    Ok(())
}

/// Reads the documents numbered `docs` of `files` (in the order [`for_each_doc`] reads them),
/// calling `f(doc, bytes_read)`: one slice of a corpus. Text files before the slice are not
/// read; JSON-lines files are read up to the slice's end. A document longer than `limit`
/// bytes is refused before it is held whole.
pub fn for_each_doc_in(
    files: &[PathBuf],
    docs: std::ops::Range<u64>,
    limit: u64,
    root_of: impl Fn(&Path) -> String,
    mut f: impl FnMut(Doc, u64) -> Result<()>,
) -> Result<()> {
    let mut ix = 0u64;
    for path in files {
        if ix >= docs.end {
            break;
        }
        let kind = kind_of(path);
        if kind == Kind::Text && ix < docs.start {
            ix += 1;
            continue;
        }
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        if kind == Kind::Text {
            ix += 1;
            let mut bytes = Vec::new();
            BufReader::new(file)
                .take(limit.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(|e| Error::io(path, e))?;
            if bytes.len() as u64 > limit {
                return Err(too_large(path, "", bytes.len() as u64, limit));
            }
            let n = bytes.len() as u64;
            let text = match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(e) => {
                    let bytes = e.into_bytes();
                    diag!(
                        "warning: {}: {} bytes are not UTF-8 and are indexed as U+FFFD (a binary \
                         file?)",
                        path.display(),
                        invalid_utf8_bytes(&bytes)
                    );
                    String::from_utf8_lossy(&bytes).into_owned()
                }
            };
            let meta = serde_json::json!({ "path": root_of(path) }).to_string();
            f(Doc { text, meta }, n)?;
            continue;
        }
        for_each_jsonl_doc_within(jsonl_reader(path, kind, file)?, path, limit, |doc, n| {
            ix += 1;
            match docs.contains(&(ix - 1)) {
                true => f(doc, n),
                false => Ok(()),
            }
        })?;
    }
    Ok(())
}

/// The decompressing reader of a JSON-lines file of kind `kind`.
fn jsonl_reader(path: &Path, kind: Kind, file: std::fs::File) -> Result<Box<dyn Read>> {
    Ok(match kind {
        Kind::JsonlGz => Box::new(flate2::read::MultiGzDecoder::new(file)),
        Kind::JsonlZst => Box::new(zstd::Decoder::new(file).map_err(|e| Error::io(path, e))?),
        _ => Box::new(file),
    })
}

/// The size in bytes of every document of `files`, in order (a text file's size, a JSON-lines
/// document's line): what a distributed build balances its slices by. Text files are not
/// read, and JSON-lines files only split into lines (each non-blank line is a document or an
/// error, so a bad line fails the slice that holds it, named there).
pub fn doc_bytes(files: &[PathBuf]) -> Result<Vec<u64>> {
    let mut sizes = Vec::new();
    for path in files {
        let kind = kind_of(path);
        if kind == Kind::Text {
            let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
            sizes.push(meta.len());
            continue;
        }
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut reader = BufReader::with_capacity(1 << 16, jsonl_reader(path, kind, file)?);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(|e| Error::io(path, e))?;
            if n == 0 {
                break;
            }
            if !String::from_utf8_lossy(&line).trim().is_empty() {
                sizes.push(n as u64);
            }
        }
    }
    Ok(sizes)
}
