//! `infgram index`: reads a corpus, tokenizes it in parallel, cuts it into shards that fit the
//! memory budget, builds each shard and writes the index atomically (see [`super::build`]).

use super::build::{write_shard, ShardWriter};
use super::format::*;
use super::output_dir::TempIndexDir;
use crate::corpus;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of a build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Memory budget in bytes; a shard is cut when its build would exceed it.
    pub mem_bytes: u64,
    /// Also build the reversed suffix array (fast ∞-gram and SBIS queries; +pointer bytes/token).
    pub reverse: bool,
    /// Replace an existing index.
    pub overwrite: bool,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
    /// Sentence mode: each line of a document is a document of the index, `<s>` before it and
    /// `</s>` after it (a tokenizer with sentence marks: `words`).
    pub sentences: bool,
    /// The documents to index, numbered in the order the inputs are read (`0..u64::MAX`: all):
    /// one slice of a distributed build (the Python package's `infgram.ray.build`).
    pub docs: std::ops::Range<u64>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            mem_bytes: default_mem_bytes(),
            reverse: true,
            overwrite: false,
            progress: true,
            sentences: false,
            docs: 0..u64::MAX,
        }
    }
}

/// Half of the memory available now (from /proc/meminfo), at least 1 GiB; 4 GiB if unknown.
pub fn default_mem_bytes() -> u64 {
    let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    });
    avail.map_or(4 << 30, |kb| (kb * 1024 / 2).max(1 << 30))
}

/// Peak resident memory of this process in bytes (VmHWM), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// What a build did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BuildSummary {
    /// Corpus tokens (separators excluded).
    pub tokens: u64,
    /// Documents.
    pub documents: u64,
    /// Shards.
    pub shards: usize,
    /// Bytes of all index files.
    pub disk_bytes: u64,
    /// Disk bytes per corpus token.
    pub bytes_per_token: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: Option<u64>,
}

/// Text read before it is tokenized in parallel (a batch holds more only with one document
/// larger than this).
const BATCH_BYTES: usize = 8 << 20;

/// A document of `tokens` tokens (`meta`: its metadata line, which names its file) that no
/// shard within a budget of `mem` bytes holds (`cap` tokens at most).
fn doc_outgrows_shard(meta: &str, tokens: usize, cap: usize, mem: u64) -> Error {
    let need = mem as f64 * (tokens + 1) as f64 / cap as f64;
    Error::input(format!(
        "a document of {tokens} tokens ({meta}) is larger than a shard built within the memory \
         budget holds ({cap} tokens): a document is indexed whole, in one shard; raise --mem \
         to at least {:.1} GB, or split it into smaller documents (one per line of a .jsonl \
         file)",
        need / 1e9 + 0.05
    ))
}

/// Largest shard (in tokens) whose build fits `mem` bytes.
fn shard_capacity(mem: u64, width: u8, reverse: bool) -> usize {
    // Tokens + a converted copy for 2/4-byte alphabets (or the reversed copy) + 32-bit SA
    // under construction + packed pointers of both arrays.
    let w = width as u64;
    let per_token = w + if width == 1 { w } else { 4 } + 4 + if reverse { 8 } else { 4 };
    ((mem / per_token) as usize).max(1 << 16)
}

/// Builds an index of `inputs` into `out`.
pub fn build_index(
    inputs: &[PathBuf],
    out: &Path,
    tokenizer: &dyn Tokenizer,
    opts: &BuildOptions,
) -> Result<BuildSummary> {
    let t0 = Instant::now();
    let files = corpus::list_files(inputs)?;
    if files.is_empty() {
        return Err(Error::input(
            "no input files: pass .txt, .jsonl[.gz|.zst] files or directories",
        ));
    }
    let marks = match (opts.sentences, tokenizer.sentence_marks()) {
        (false, _) => None,
        (true, Some(marks)) => Some(marks),
        (true, None) => {
            return Err(Error::input(format!(
                "sentence mode needs a tokenizer with sentence marks <s> and </s>: pass \
                 --tokenizer words (not {})",
                tokenizer.name()
            )))
        }
    };
    let total_in = corpus::total_bytes(&files);
    let width = token_width_for_vocab(tokenizer.vocab_size());
    let cap = shard_capacity(opts.mem_bytes, width, opts.reverse);
    // A document is read whole and indexed in one shard: one too large for the budget is
    // refused before it is read (a text file before the build starts), or once tokenized when
    // its tokens outgrow a shard.
    let doc_limit = corpus::doc_limit(opts.mem_bytes);
    corpus::check_text_sizes(&files, doc_limit)?;
    let tmp = TempIndexDir::create(out, opts.overwrite, inputs)?;
    let bar = progress_bar(total_in, opts.progress);

    let mut header = Header::new(tokenizer.spec(), width);
    let mut writer = ShardWriter::new(width);
    let mut batch: Vec<corpus::Doc> = Vec::new();
    let mut batch_bytes = 0usize;
    let vocab = tokenizer.vocab_size();

    let flush_shard = |writer: ShardWriter, header: &mut Header| -> Result<()> {
        let name = format!("shard-{:04}", header.shards.len());
        bar.set_message(format!("sorting suffixes of {name}"));
        let bytes = writer.finish(vocab, opts.reverse)?;
        let sh = write_shard(tmp.path(), &name, &bytes, opts.reverse)?;
        header.total_tokens += sh.tokens - sh.documents;
        header.total_documents += sh.documents;
        header.shards.push(sh);
        bar.set_message("tokenizing");
        Ok(())
    };
    let tokenize_batch = |batch: &mut Vec<corpus::Doc>,
                          writer: &mut ShardWriter,
                          header: &mut Header|
     -> Result<()> {
        // A large document's tokens (at most one a byte, two with sentence marks) may not fit
        // beside the shard being filled: build that shard first, so that the document's text
        // and ids are never held beside a shard's suffix sort.
        let most_tokens = |d: &corpus::Doc| d.text.len() * (1 + usize::from(marks.is_some())) + 2;
        let large = batch.iter().map(most_tokens).max().unwrap_or(0);
        if large > BATCH_BYTES && writer.len() + large > cap && !writer.is_empty() {
            let full = std::mem::replace(writer, ShardWriter::new(width));
            flush_shard(full, header)?;
        }
        let encoded: Vec<Result<Vec<Vec<u32>>>> = batch
            .par_iter()
            .map(|d| match marks {
                None => Ok(vec![tokenizer.encode(&d.text)?]),
                Some(marks) => crate::tokenizer::words::encode_sentences(tokenizer, &d.text, marks),
            })
            .collect();
        for (doc, parts) in batch.drain(..).zip(encoded) {
            for ids in parts? {
                if ids.len() + 1 > cap {
                    return Err(doc_outgrows_shard(
                        &doc.meta,
                        ids.len(),
                        cap,
                        opts.mem_bytes,
                    ));
                }
                if writer.len() + ids.len() + 1 > cap && !writer.is_empty() {
                    let full = std::mem::replace(writer, ShardWriter::new(width));
                    flush_shard(full, header)?;
                }
                writer.push(&ids, &doc.meta)?;
            }
        }
        Ok(())
    };
    // A document's `path` metadata: relative to the directory given as input, or the file's
    // name for a file given itself, never an absolute path of the machine that built it (a
    // server shows metadata to its clients).
    let roots: Vec<PathBuf> = inputs.to_vec();
    let rel = |p: &Path| -> String {
        for r in &roots {
            if let Ok(x) = p.strip_prefix(r) {
                if !x.as_os_str().is_empty() {
                    return x.display().to_string();
                }
            }
        }
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    corpus::for_each_doc_in(&files, opts.docs.clone(), doc_limit, rel, |doc, n| {
        bar.inc(n);
        batch_bytes += doc.text.len();
        batch.push(doc);
        if batch_bytes > BATCH_BYTES || batch.len() >= 4096 {
            tokenize_batch(&mut batch, &mut writer, &mut header)?;
            batch_bytes = 0;
        }
        Ok(())
    })?;
    tokenize_batch(&mut batch, &mut writer, &mut header)?;
    if !writer.is_empty() || header.shards.is_empty() {
        flush_shard(writer, &mut header)?;
    }
    for (name, bytes) in tokenizer.index_files() {
        let path = tmp.path().join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        std::io::Write::write_all(&mut f, &bytes).map_err(|e| Error::io(&path, e))?;
        f.sync_all().map_err(|e| Error::io(&path, e))?;
    }
    let summary = finish_build(tmp, header, t0)?;
    bar.finish_and_clear();
    Ok(summary)
}

/// One slice of a corpus for a distributed build: consecutive documents, whole.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Slice {
    /// The documents, numbered in the order the inputs are read ([`BuildOptions::docs`]).
    pub docs: std::ops::Range<u64>,
    /// Their bytes in the input files.
    pub bytes: u64,
}

/// Cuts the documents of `inputs` into at most `n` slices of consecutive documents with about
/// the same bytes each (a document is never split: a text file, or one line of a JSON-lines
/// file). Fewer slices when there are fewer documents; none when there are no documents.
pub fn plan_slices(inputs: &[PathBuf], n: usize) -> Result<Vec<Slice>> {
    if n == 0 {
        return Err(Error::input("a build needs at least 1 slice"));
    }
    let sizes = corpus::doc_bytes(&corpus::list_files(inputs)?)?;
    let total: u64 = sizes.iter().sum();
    let mut slices = Vec::with_capacity(n);
    let (mut start, mut bytes, mut done) = (0u64, 0u64, 0u64);
    for (i, &size) in sizes.iter().enumerate() {
        bytes += size;
        done += size;
        let left_docs = (sizes.len() - i - 1) as u64;
        let left_slices = (n - slices.len() - 1) as u64;
        // Cut where this slice reaches its share of the bytes, keeping a document for each
        // slice still to come.
        let share = total as u128 * (slices.len() + 1) as u128 / n as u128;
        if left_slices > 0 && (done as u128 >= share || left_docs == left_slices) {
            let end = i as u64 + 1;
            slices.push(Slice {
                docs: start..end,
                bytes,
            });
            (start, bytes) = (end, 0);
        }
    }
    if start < sizes.len() as u64 {
        slices.push(Slice {
            docs: start..sizes.len() as u64,
            bytes,
        });
    }
    Ok(slices)
}

/// Seals and writes the header, moves the finished index into place, and sums up the build.
fn finish_build(tmp: TempIndexDir, mut header: Header, t0: Instant) -> Result<BuildSummary> {
    header.seal();
    header.write(tmp.path())?;
    let disk_bytes: u64 = header
        .shards
        .iter()
        .flat_map(|s| s.files.values().map(|f| f.bytes))
        .sum();
    tmp.commit()?;
    Ok(BuildSummary {
        tokens: header.total_tokens,
        documents: header.total_documents,
        shards: header.shards.len(),
        disk_bytes,
        bytes_per_token: disk_bytes as f64 / header.total_tokens.max(1) as f64,
        seconds: t0.elapsed().as_secs_f64(),
        peak_rss_bytes: peak_rss_bytes(),
    })
}

fn progress_bar(total: u64, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}) {msg}",
        )
        .expect("valid template"),
    );
    bar.set_message("tokenizing");
    bar
}

/// Builds an index of documents given as token ids (a corpus tokenized elsewhere, e.g. in
/// Python): `docs_per_shard` documents a shard, each with its metadata line (`"{}"` when
/// `meta` is shorter). The index records an unknown tokenizer of `vocab_size` ids (queries by
/// ids; text needs `--tokenizer`). Like [`build_index`], it is written into a temporary
/// directory and renamed into place, so a failed build leaves nothing behind.
pub fn build_from_ids(
    docs: &[Vec<u32>],
    meta: &[String],
    vocab_size: usize,
    docs_per_shard: usize,
    out: &Path,
    opts: &BuildOptions,
) -> Result<BuildSummary> {
    let t0 = Instant::now();
    let spec = crate::tokenizer::IdsOnly { vocab_size }.spec();
    let width = token_width_for_vocab(vocab_size);
    let sep = separator_for_width(width) as usize;
    if vocab_size == 0 || vocab_size > sep {
        return Err(Error::input(format!(
            "vocab_size must be between 1 and {} (ids below the separator), got {vocab_size}",
            u32::MAX
        )));
    }
    if let Some(t) = docs.iter().flatten().find(|&&t| t as usize >= vocab_size) {
        return Err(Error::input(format!(
            "token id {t} is not below vocab_size {vocab_size}"
        )));
    }
    let tmp = TempIndexDir::create(out, opts.overwrite, &[])?;
    let mut header = Header::new(spec, width);
    let chunks: Vec<&[Vec<u32>]> = if docs.is_empty() {
        vec![&[]]
    } else {
        docs.chunks(docs_per_shard.max(1)).collect()
    };
    let mut first = 0;
    for chunk in chunks {
        let mut writer = ShardWriter::new(width);
        for (i, d) in chunk.iter().enumerate() {
            writer.push(d, meta.get(first + i).map_or("{}", |m| m.as_str()))?;
        }
        first += chunk.len();
        let bytes = writer.finish(vocab_size, opts.reverse)?;
        let name = format!("shard-{:04}", header.shards.len());
        let sh = write_shard(tmp.path(), &name, &bytes, opts.reverse)?;
        header.total_tokens += sh.tokens - sh.documents;
        header.total_documents += sh.documents;
        header.shards.push(sh);
    }
    finish_build(tmp, header, t0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::shards::Shards;
    use crate::index::Index;
    use crate::tokenizer::ByteTokenizer;

    /// Text files and a JSON-lines file (a blank line, extra fields) in a tree.
    fn corpus(dir: &Path) {
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.txt"), "the first file, a long one ".repeat(9)).unwrap();
        let lines: Vec<String> = (0..7)
            .map(|i| {
                format!(
                    "{{\"text\": \"line {i} {}\", \"i\": {i}}}",
                    "x".repeat(i * 5)
                )
            })
            .collect();
        std::fs::write(dir.join("b.jsonl"), lines.join("\n\n") + "\n").unwrap();
        std::fs::write(dir.join("sub/c.txt"), "").unwrap();
        std::fs::write(dir.join("sub/d.txt"), "the last file").unwrap();
    }

    /// Slices cover every document once, in order, with their bytes; and indexes built slice
    /// by slice hold the documents (tokens and metadata) of the index built at once.
    #[test]
    fn slices_rebuild_the_whole_index() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        corpus(&data);
        let inputs = vec![data.clone()];
        let quiet = BuildOptions {
            progress: false,
            ..Default::default()
        };
        build_index(&inputs, &tmp.path().join("all"), &ByteTokenizer, &quiet).unwrap();
        let all = Index::open(&tmp.path().join("all")).unwrap();
        let docs = all.num_docs();
        assert_eq!(docs, 10);
        let sizes = corpus::doc_bytes(&corpus::list_files(&inputs).unwrap()).unwrap();
        for n in 1..=12 {
            let slices = plan_slices(&inputs, n).unwrap();
            assert_eq!(slices.len(), n.min(docs as usize), "{n} slices");
            assert_eq!(slices[0].docs.start, 0);
            assert_eq!(slices.last().unwrap().docs.end, docs);
            for (s, next) in slices.iter().zip(slices.iter().skip(1)) {
                assert_eq!(s.docs.end, next.docs.start);
            }
            for s in &slices {
                assert!(!s.docs.is_empty());
                let want: u64 = sizes[s.docs.start as usize..s.docs.end as usize]
                    .iter()
                    .sum();
                assert_eq!(s.bytes, want);
            }
            let parts: Vec<Index<memmap2::Mmap>> = slices
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let out = tmp.path().join(format!("n{n}-{i}"));
                    let opts = BuildOptions {
                        docs: s.docs.clone(),
                        progress: false,
                        ..Default::default()
                    };
                    build_index(&inputs, &out, &ByteTokenizer, &opts).unwrap();
                    Index::open(&out).unwrap()
                })
                .collect();
            let merged = Index::merge(parts).unwrap();
            for d in 0..docs {
                let (a, b) = (
                    all.get_doc_by_ix(d, 1000).unwrap(),
                    merged.get_doc_by_ix(d, 1000).unwrap(),
                );
                assert_eq!(
                    (a.token_ids, a.metadata),
                    (b.token_ids, b.metadata),
                    "doc {d}"
                );
            }
        }
        assert!(plan_slices(&inputs, 0).is_err());
    }
}
