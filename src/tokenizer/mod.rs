//! Tokenizers behind one trait.
//!
//! * [`ByteTokenizer`]: each byte one token (the char-level setting of the seed and of Tiny
//!   Shakespeare). Byte `0xFF` never occurs in UTF-8 text and is reserved as the document
//!   separator of a 1-byte index, so the vocabulary is the 255 values `0..=254`.
//! * [`HfTokenizer`]: a Hugging Face `tokenizer.json`, through the `tokenizers` crate.
//! * [`HfTokenizer::from_gguf`]: the tokenizer embedded in a GGUF model file, rebuilt from its
//!   `tokenizer.ggml.*` metadata. For `tokenizer.ggml.pre = "smollm"` (SmolLM2) the
//!   pre-tokenizer is: digits split one by one, then the GPT-2 regex, byte-level with no prefix
//!   space — exactly the `tokenizer.json` SmolLM2 ships with, which we write out and load.
//!
//! * [`words::WordTokenizer`]: whitespace-split words with a vocabulary taken from the corpus
//!   (classic n-gram language models; KenLM's tokenization), with a sentence mode.
//!
//! Every tokenizer has a *fingerprint*: a hash of everything that decides its ids. The index
//! stores it, and a query with another tokenizer is refused.

pub mod chat;
pub mod fast_bpe;
#[cfg(feature = "neural")]
pub mod gguf;
pub mod words;

use crate::error::{Error, Result};
use std::path::Path;

#[cfg(feature = "neural")]
pub use gguf::gguf_tokenizer_json;

/// Turns text into token ids and back.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text` (no special tokens added).
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Text of `ids`; bytes that do not form UTF-8 are replaced by U+FFFD.
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Raw bytes of `ids` where the tokenizer is byte-level (exact for partial UTF-8).
    fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        Ok(self.decode(ids)?.into_bytes())
    }
    /// Number of ids (the largest id is `vocab_size() - 1`).
    fn vocab_size(&self) -> usize;
    /// Short human-readable name (`bytes`, a file name).
    fn name(&self) -> String;
    /// Hash of everything that decides the ids, as 16 hex digits.
    fn fingerprint(&self) -> String;
    /// Description that lets a reader of the index reload this tokenizer.
    fn spec(&self) -> TokenizerSpec;
    /// Files the index keeps beside its shards to reload this tokenizer (name, contents): the
    /// word vocabulary of [`words::WordTokenizer`]; none for the others.
    fn index_files(&self) -> Vec<(&'static str, Vec<u8>)> {
        Vec::new()
    }
    /// The ids of the sentence start and end marks (`<s>`, `</s>`), for a tokenizer that
    /// has them (sentence mode).
    fn sentence_marks(&self) -> Option<(u32, u32)> {
        None
    }
    /// Token ids of `text` as plain text: the strings of control tokens (`<|im_start|>`) are
    /// ordinary characters here, as llama.cpp tokenizes with `parse_special` off. What a
    /// user's message inside a chat template is tokenized with ([`chat`]). The same as
    /// [`Tokenizer::encode`] for tokenizers without control tokens.
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text)
    }
    /// The model's own chat template, when its file has one.
    fn chat_template(&self) -> Option<&chat::ChatTemplate> {
        None
    }
    /// Whether `token` is a token of the vocabulary (control tokens included).
    fn has_token(&self, token: &str) -> bool {
        let _ = token;
        false
    }
    /// The control tokens' strings in `text`, as [`Tokenizer::encode`] matches them (leftmost,
    /// longest first): `(start, end, id)` each, in order.
    fn control_tokens_in(&self, text: &str) -> Vec<(usize, usize, u32)> {
        let _ = text;
        Vec::new()
    }
}

/// How an index refers to its tokenizer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenizerSpec {
    /// `bytes`, `hf` or `gguf`.
    pub kind: String,
    /// Path of the file it was loaded from (absolute), empty for `bytes`.
    pub path: String,
    /// Fingerprint (see [`Tokenizer::fingerprint`]).
    pub fingerprint: String,
    /// Vocabulary size.
    pub vocab_size: usize,
}

impl TokenizerSpec {
    /// The spec of a synthetic corpus of token ids below `vocab_size` (tests, benchmarks): a
    /// kind no tokenizer is loaded for and a fingerprint no tokenizer has, so a query with a
    /// real tokenizer is refused as with any other index.
    pub fn synthetic(vocab_size: usize) -> TokenizerSpec {
        TokenizerSpec {
            kind: "synthetic".into(),
            path: String::new(),
            fingerprint: "0".into(),
            vocab_size,
        }
    }
}

/// 64-bit FNV-1a, the hash behind fingerprints (stable across platforms and releases).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Each byte of UTF-8 text is one token; byte 0xFF is reserved (it is not valid UTF-8).
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }
    fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        ids.iter()
            .map(|&t| {
                u8::try_from(t).ok().filter(|&b| b != 0xFF).ok_or_else(|| {
                    Error::input(format!("token id {t} is not a byte token (0..=254)"))
                })
            })
            .collect()
    }
    fn vocab_size(&self) -> usize {
        255
    }
    fn name(&self) -> String {
        "bytes".into()
    }
    fn fingerprint(&self) -> String {
        format!("{:016x}", fnv1a64(b"infgram-bytes-v1"))
    }
    fn spec(&self) -> TokenizerSpec {
        TokenizerSpec {
            kind: "bytes".into(),
            path: String::new(),
            fingerprint: self.fingerprint(),
            vocab_size: self.vocab_size(),
        }
    }
}

/// Stands in for the unknown tokenizer of an index that does not record one (an infini-gram
/// index of u16 / u32 tokens): queries by token ids work, text is refused with what to do, and
/// ids are shown as `<id>`.
#[derive(Clone, Copy, Debug)]
pub struct IdsOnly {
    /// The index's id space (ids below the separator).
    pub vocab_size: usize,
}

/// The tokenizer kind of an index that does not record its tokenizer.
pub const UNKNOWN_KIND: &str = "unknown";

impl Tokenizer for IdsOnly {
    fn encode(&self, _text: &str) -> Result<Vec<u32>> {
        Err(Error::input(
            "this index does not record its tokenizer (an infini-gram index): give the query as \
             token ids (--ids, query_ids, input_ids), or name the tokenizer it was built with \
             (`infgram query --tokenizer`, `infgram serve --tokenizer NAME=TOKENIZER`, \
             `infgram.Index(path, tokenizer=...)`)",
        ))
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(ids.iter().map(|t| format!("<{t}>")).collect())
    }
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    fn name(&self) -> String {
        "unknown (token ids only)".into()
    }
    fn fingerprint(&self) -> String {
        String::new()
    }
    fn spec(&self) -> TokenizerSpec {
        TokenizerSpec {
            kind: UNKNOWN_KIND.into(),
            path: String::new(),
            fingerprint: String::new(),
            vocab_size: self.vocab_size,
        }
    }
}

/// A Hugging Face tokenizer (from `tokenizer.json` or rebuilt from GGUF metadata).
#[derive(Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    kind: &'static str,
    path: String,
    fingerprint: String,
    /// GPT-2 byte-level alphabet inverse: char → byte, for exact byte decoding.
    byte_decoder: Option<std::collections::HashMap<char, u8>>,
    id_to_token: Vec<String>,
    /// The same ids faster, where the tokenizer is a GPT-2-style byte-level BPE.
    fast: Option<std::sync::Arc<fast_bpe::FastBpe>>,
    /// `inner` with its control tokens read as text ([`Tokenizer::encode_plain`]), made on
    /// first use.
    plain: std::sync::Arc<std::sync::OnceLock<tokenizers::Tokenizer>>,
    /// The control tokens' strings and ids, made on first use.
    controls: std::sync::Arc<std::sync::OnceLock<Option<Controls>>>,
    /// The model's chat template, from its GGUF file.
    chat: Option<chat::ChatTemplate>,
}

/// A matcher of a tokenizer's control tokens' strings, and the id of each.
type Controls = (aho_corasick::AhoCorasick, Vec<u32>);

impl HfTokenizer {
    /// Loads a `tokenizer.json` (of at most [`MAX_TOKENIZER_BYTES`]).
    pub fn from_json_file(path: &Path) -> Result<Self> {
        let json = read_capped(path, MAX_TOKENIZER_BYTES)?;
        Self::from_json_str(&json, "hf", path)
    }

    /// Rebuilds the tokenizer embedded in a GGUF model file, with the file's chat template.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        #[cfg(feature = "neural")]
        {
            let content = gguf::read_gguf_metadata(path)?;
            let json = gguf::tokenizer_json_of(&content, path)?;
            let mut tok = Self::from_json_str(&json, "gguf", path)?;
            tok.chat = gguf::chat_template_of(&content, path)?;
            Ok(tok)
        }
        #[cfg(not(feature = "neural"))]
        Err(Error::input(format!(
            "{}: reading the tokenizer of a GGUF file needs infgram built with the `neural` \
             feature (the default build has it); `infgram export-tokenizer FILE -o \
             tokenizer.json` writes it as a tokenizer.json, which this build reads",
            path.display()
        )))
    }

    /// A tokenizer from the text of a `tokenizer.json` (`kind`: how an index records it;
    /// `path`: the file it came from).
    pub fn from_json_str(json: &str, kind: &'static str, path: &Path) -> Result<Self> {
        let inner: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let vocab = inner.get_vocab(true);
        let size = vocab.values().map(|&v| v as usize + 1).max().unwrap_or(0);
        check_id_range(size, vocab.len(), path)?;
        let mut id_to_token = vec![String::new(); size];
        for (tok, id) in vocab {
            id_to_token[id as usize] = tok;
        }
        let byte_level = json.contains("\"ByteLevel\"");
        let parsed = serde_json::from_str::<serde_json::Value>(json).ok();
        let fast = parsed
            .as_ref()
            .and_then(fast_bpe::FastBpe::from_json)
            .map(std::sync::Arc::new);
        let canonical = match &parsed {
            Some(v) => canonical_model_json(v),
            None => json.to_string(),
        };
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(HfTokenizer {
            fingerprint: format!("{:016x}", fnv1a64(canonical.as_bytes())),
            inner,
            kind,
            path: abs.display().to_string(),
            byte_decoder: byte_level.then(gpt2_byte_decoder),
            id_to_token,
            fast,
            plain: Default::default(),
            controls: Default::default(),
            chat: None,
        })
    }

    /// A matcher of the control tokens' strings and their ids.
    fn controls(&self) -> Option<&Controls> {
        self.controls
            .get_or_init(|| {
                let (ids, texts): (Vec<u32>, Vec<String>) = self
                    .inner
                    .get_added_tokens_decoder()
                    .into_iter()
                    .filter(|(_, t)| t.special && !t.content.is_empty())
                    .map(|(id, t)| (id, t.content))
                    .unzip();
                let matcher = aho_corasick::AhoCorasick::builder()
                    .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                    .build(&texts)
                    .ok()?;
                Some((matcher, ids))
            })
            .as_ref()
    }

    /// This tokenizer with `chat` as its chat template.
    pub fn with_chat_template(self, chat: Option<chat::ChatTemplate>) -> Self {
        HfTokenizer { chat, ..self }
    }

    /// `inner` with its control tokens read as text.
    fn plain(&self) -> &tokenizers::Tokenizer {
        self.plain.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The ids of `text` from the `tokenizers` crate itself (what [`Tokenizer::encode`] gives,
    /// without the fast path of [`fast_bpe`]; tests compare the two).
    pub fn encode_reference(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Whether [`Tokenizer::encode`] has the fast path for this tokenizer.
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// The id of a token string (special tokens included), if any.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Bytes of a `tokenizer.json` at most (the largest vocabularies' files are tens of
/// megabytes).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// Ids a vocabulary may span: one past its largest id at most (the largest vocabularies
/// models ship have about a quarter of a million tokens).
pub const MAX_VOCAB_IDS: usize = 1 << 24;

/// The text of `path`, refused past `limit` bytes before they are read (a device or FIFO is
/// read up to the limit and no further).
pub fn read_capped(path: &Path, limit: u64) -> Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let too_big = || {
        Error::input(format!(
            "{}: larger than the {} MiB infgram reads of such a file; is it the right file? \
             (a tokenizer.json, a model's config)",
            path.display(),
            limit >> 20
        ))
    };
    if file
        .metadata()
        .is_ok_and(|m| m.is_file() && m.len() > limit)
    {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_big());
    }
    String::from_utf8(bytes)
        .map_err(|e| Error::Tokenizer(format!("{}: not UTF-8 text: {e}", path.display())))
}

/// Refuses a vocabulary whose ids span `size` (its largest id + 1) with `entries` tokens when
/// the span is past [`MAX_VOCAB_IDS`] or mostly holes: the table of tokens by id is allocated
/// for the span.
fn check_id_range(size: usize, entries: usize, path: &Path) -> Result<()> {
    if size > MAX_VOCAB_IDS || size > 2 * entries + 1024 {
        return Err(Error::Tokenizer(format!(
            "{}: a token id of {} in a vocabulary of {entries} tokens; ids run from 0 with few \
             gaps, below {MAX_VOCAB_IDS} (the file is damaged, or not a tokenizer of a model)",
            path.display(),
            size - 1
        )));
    }
    Ok(())
}

/// The parts of a tokenizer.json that decide ids, serialized canonically (keys sorted), so
/// that whitespace or key order do not change the fingerprint.
fn canonical_model_json(v: &serde_json::Value) -> String {
    let keep = ["model", "normalizer", "pre_tokenizer", "added_tokens"];
    let parts: Vec<String> = keep
        .iter()
        .map(|k| serde_json::to_string(&v.get(*k)).unwrap_or_default())
        .collect();
    parts.join("\n")
}

/// The inverse of GPT-2's bytes→unicode table ([`fast_bpe::byte_chars`]).
fn gpt2_byte_decoder() -> std::collections::HashMap<char, u8> {
    fast_bpe::byte_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.fast {
            Some(fast) if fast.takes(text) => Ok(fast.encode(text)),
            _ => self.encode_reference(text),
        }
    }
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        match &self.fast {
            Some(fast) if fast.takes(text) => Ok(fast.encode(text)),
            _ => {
                let enc = self
                    .plain()
                    .encode_fast(text, false)
                    .map_err(|e| Error::Tokenizer(e.to_string()))?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }
    fn chat_template(&self) -> Option<&chat::ChatTemplate> {
        self.chat.as_ref()
    }
    fn has_token(&self, token: &str) -> bool {
        self.inner.token_to_id(token).is_some()
    }
    fn control_tokens_in(&self, text: &str) -> Vec<(usize, usize, u32)> {
        let Some((matcher, ids)) = self.controls() else {
            return Vec::new();
        };
        matcher
            .find_iter(text)
            .map(|m| (m.start(), m.end(), ids[m.pattern().as_usize()]))
            .collect()
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        if self.byte_decoder.is_some() {
            return Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned());
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }
    fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let Some(dec) = &self.byte_decoder else {
            return Ok(self.decode(ids)?.into_bytes());
        };
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let tok = self
                .id_to_token
                .get(id as usize)
                .ok_or_else(|| Error::input(format!("token id {id} is outside the vocabulary")))?;
            // Special tokens (e.g. <|im_start|>) are not byte-encoded: emit them verbatim.
            if tok.chars().all(|c| dec.contains_key(&c)) {
                out.extend(tok.chars().map(|c| dec[&c]));
            } else {
                out.extend_from_slice(tok.as_bytes());
            }
        }
        Ok(out)
    }
    fn vocab_size(&self) -> usize {
        self.id_to_token.len()
    }
    fn name(&self) -> String {
        Path::new(&self.path)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.clone())
    }
    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
    fn spec(&self) -> TokenizerSpec {
        TokenizerSpec {
            kind: self.kind.into(),
            path: self.path.clone(),
            fingerprint: self.fingerprint(),
            vocab_size: self.vocab_size(),
        }
    }
}

/// Loads a tokenizer from a command-line name: `bytes`, a `tokenizer.json`, or a `.gguf` file.
pub fn load(name: &str) -> Result<Box<dyn Tokenizer>> {
    if name == "bytes" {
        return Ok(Box::new(ByteTokenizer));
    }
    if name == words::KIND {
        return Err(Error::input(
            "the `words` tokenizer takes its vocabulary from a corpus: `infgram index \
             --tokenizer words` builds it, and an index built so reloads it by itself",
        ));
    }
    let path = Path::new(name);
    if !path.exists() {
        return Err(Error::input(format!(
            "tokenizer {name:?} not found: pass `bytes`, a tokenizer.json or a .gguf model file"
        )));
    }
    if name.ends_with(".gguf") {
        Ok(Box::new(HfTokenizer::from_gguf(path)?))
    } else {
        Ok(Box::new(HfTokenizer::from_json_file(path)?))
    }
}

/// Reloads the tokenizer an index was built with (an index in memory: one that keeps no
/// tokenizer file).
pub fn from_spec(spec: &TokenizerSpec) -> Result<Box<dyn Tokenizer>> {
    from_spec_in(spec, None)
}

/// Reloads the tokenizer an index was built with; `dir`, the index's directory, holds the
/// files of a tokenizer that keeps them there (the word vocabulary).
pub fn from_spec_in(spec: &TokenizerSpec, dir: Option<&Path>) -> Result<Box<dyn Tokenizer>> {
    let tok: Box<dyn Tokenizer> = match spec.kind.as_str() {
        "bytes" => Box::new(ByteTokenizer),
        words::KIND => {
            let dir = dir.ok_or_else(|| {
                Error::input(
                    "a word-level index's vocabulary is in its directory: open it from disk",
                )
            })?;
            Box::new(words::WordTokenizer::load(
                &dir.join(words::VOCAB_FILE),
                Some(&spec.fingerprint),
            )?)
        }
        UNKNOWN_KIND => Box::new(IdsOnly {
            vocab_size: spec.vocab_size,
        }),
        "hf" | "gguf" => load(&spec.path).map_err(|e| {
            Error::input(format!(
                "the index's tokenizer {} cannot be loaded ({e}); pass --tokenizer FILE",
                spec.path
            ))
        })?,
        other => {
            return Err(Error::input(format!(
                "unknown tokenizer kind {other:?} in index"
            )))
        }
    };
    check_fingerprint(spec, tok.as_ref())?;
    Ok(tok)
}

/// Calls of [`check_fingerprint`] in this process: what the server reports
/// (`infgram_tokenizer_checks_total`), so that a request that checks an index twice shows.
static CHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times [`check_fingerprint`] was called in this process.
pub fn checks_so_far() -> u64 {
    CHECKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Refuses a tokenizer whose fingerprint differs from the index's.
///
/// An index that does not record its tokenizer (kind `unknown`, an infini-gram index) takes
/// the one named, unchecked, if its ids fit.
pub fn check_fingerprint(spec: &TokenizerSpec, tok: &dyn Tokenizer) -> Result<()> {
    CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if spec.kind == UNKNOWN_KIND {
        if tok.vocab_size() > spec.vocab_size {
            return Err(Error::input(format!(
                "the tokenizer {} has {} ids, more than the index holds ({})",
                tok.name(),
                tok.vocab_size(),
                spec.vocab_size
            )));
        }
        return Ok(());
    }
    if spec.fingerprint != tok.fingerprint() {
        return Err(Error::TokenizerMismatch {
            index: if spec.path.is_empty() {
                spec.kind.clone()
            } else {
                spec.path.clone()
            },
            index_fp: spec.fingerprint.clone(),
            query: tok.name(),
            query_fp: tok.fingerprint(),
        });
    }
    Ok(())
}

/// Turns the bytes of tokens, given one token at a time, into text that is complete UTF-8:
/// a character split across tokens waits for its last byte (streaming output).
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// The text that `bytes` complete (possibly empty); invalid bytes come out lossily.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let chunk: Vec<u8> = self.pending.drain(..valid).collect();
        String::from_utf8_lossy(&chunk).into_owned()
    }

    /// What is left (an unfinished character, lossily).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}
