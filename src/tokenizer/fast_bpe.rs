//! A fast encoder for byte-level BPE tokenizers (the GPT-2 family: SmolLM2, StarCoder, GPT-2,
//! Llama 3's merges-first variant), giving exactly the ids of the `tokenizers` crate.
//!
//! Why: `tokenizers` runs the GPT-2 pre-tokenizer regex through `fancy-regex` (a backtracking
//! engine, for one look-ahead) and builds a full `Encoding` (offsets, words) per call, which
//! made tokenizing most of an index build of a large corpus (about 1 MB/s here). This encoder
//!
//! 1. splits numeric characters one by one where the tokenizer has `Digits { individual_digits }`
//!    (with `char::is_numeric`, as `tokenizers` does);
//! 2. cuts each remaining run with the GPT-2 regex *without* its look-ahead on the `regex`
//!    crate (a DFA), then applies the look-ahead by hand: a run of several whitespace
//!    characters followed by a non-space gives its last character to the next piece
//!    (`\s+(?!\S)` in the original);
//! 3. encodes each piece with the BPE merges exactly as `tokenizers`' `Word::merge_all` does
//!    (lowest rank first, then leftmost), with a per-thread cache of pieces, since a corpus
//!    repeats its words.
//!
//! A text holding one of the tokenizer's added tokens (`<|im_start|>`, …) is handed to
//! `tokenizers` itself, which matches them whole; so is every tokenizer whose `tokenizer.json`
//! is not of the shape above ([`FastBpe::from_json`] returns `None`). Tests hold the ids
//! equal to `tokenizers`' on random and real texts (`tests/fast_bpe.rs`).

use regex::Regex;
use std::cell::RefCell;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

/// The GPT-2 pre-tokenizer pattern without the look-ahead branch `\s+(?!\S)` (applied by hand).
const PIECES: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// Cached pieces per thread before the cache is cleared.
const CACHE_PIECES: usize = 1 << 20;

/// Pieces longer than this (bytes) are encoded without the cache.
const CACHE_MAX_PIECE: usize = 64;

/// A byte whose character the vocabulary lacks: without an unknown token, `tokenizers` drops
/// such characters from the piece before merging (SmolLM2's vocabulary lacks ten bytes).
const NO_ID: u32 = u32::MAX;

/// Distinguishes encoders in the per-thread caches.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A piece's bytes → its ids.
type PieceCache = HashMap<Vec<u8>, Vec<u32>, foldhash::fast::RandomState>;

thread_local! {
    /// (encoder id, its pieces).
    static CACHE: RefCell<(u64, PieceCache)> = RefCell::new((0, HashMap::default()));
}

/// A byte-level BPE encoder equal to `tokenizers`' for the tokenizers it accepts.
pub struct FastBpe {
    id: u64,
    digits: bool,
    pieces: Regex,
    /// Byte → id of its byte-level character ([`NO_ID`] where the vocabulary lacks it).
    byte_ids: [u32; 256],
    /// (left, right) → (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32), foldhash::fast::RandomState>,
    /// `ignore_merges`: a piece that is itself a token is that token (Llama 3).
    whole: Option<HashMap<Vec<u8>, u32, foldhash::fast::RandomState>>,
    /// The added tokens' texts: a text holding one goes to `tokenizers`.
    added: Option<aho_corasick::AhoCorasick>,
}

/// GPT-2's byte → character table (`bytes_to_unicode`).
pub fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        out[b as usize] = if printable {
            char::from_u32(b).expect("a latin-1 char")
        } else {
            n += 1;
            char::from_u32(255 + n).expect("a valid char")
        };
    }
    out
}

impl FastBpe {
    /// The encoder of a `tokenizer.json`, or `None` when it is not a byte-level BPE of the
    /// shape this encoder reproduces exactly (then `tokenizers` encodes).
    pub fn from_json(json: &serde_json::Value) -> Option<FastBpe> {
        if !json.get("normalizer").is_none_or(|n| n.is_null()) {
            return None;
        }
        let digits = pre_tokenizer_digits(json.get("pre_tokenizer")?)?;
        let model = json.get("model")?;
        let is = |k: &str, v: &str| model.get(k).and_then(|x| x.as_str()) == Some(v);
        let off = |k: &str| match model.get(k) {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::Bool(b)) => !b,
            Some(serde_json::Value::String(s)) => s.is_empty(),
            _ => false,
        };
        if !is("type", "BPE")
            || !off("dropout")
            || !off("continuing_subword_prefix")
            || !off("end_of_word_suffix")
            || !off("byte_fallback")
        {
            return None;
        }
        let ignore_merges = model.get("ignore_merges").and_then(|x| x.as_bool()) == Some(true);
        let vocab: HashMap<&str, u32> = model
            .get("vocab")?
            .as_object()?
            .iter()
            .map(|(k, v)| Some((k.as_str(), u32::try_from(v.as_u64()?).ok()?)))
            .collect::<Option<_>>()?;
        let chars = byte_chars();
        let mut byte_ids = [0u32; 256];
        let mut buf = [0u8; 4];
        for (b, c) in chars.iter().enumerate() {
            byte_ids[b] = vocab
                .get(&*c.encode_utf8(&mut buf))
                .copied()
                .unwrap_or(NO_ID);
        }
        let mut merges = HashMap::default();
        for (rank, m) in model.get("merges")?.as_array()?.iter().enumerate() {
            let (a, b) = match m {
                serde_json::Value::String(s) => s.split_once(' ')?,
                serde_json::Value::Array(p) if p.len() == 2 => (p[0].as_str()?, p[1].as_str()?),
                _ => return None,
            };
            let merged = vocab.get(format!("{a}{b}").as_str())?;
            merges.insert((*vocab.get(a)?, *vocab.get(b)?), (rank as u32, *merged));
        }
        let whole = ignore_merges.then(|| {
            let decode = super::gpt2_byte_decoder();
            vocab
                .iter()
                .filter_map(|(t, &id)| {
                    let bytes: Option<Vec<u8>> =
                        t.chars().map(|c| decode.get(&c).copied()).collect();
                    Some((bytes?, id))
                })
                .collect()
        });
        let added: Vec<String> = json
            .get("added_tokens")
            .and_then(|a| a.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.get("content")?.as_str().map(str::to_string))
                    .filter(|t| !t.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let added = if added.is_empty() {
            None
        } else {
            Some(aho_corasick::AhoCorasick::new(&added).ok()?)
        };
        Some(FastBpe {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            digits,
            pieces: Regex::new(PIECES).expect("the GPT-2 pattern compiles"),
            byte_ids,
            merges,
            whole,
            added,
        })
    }

    /// Whether this encoder takes `text` (it holds none of the added tokens).
    pub fn takes(&self, text: &str) -> bool {
        self.added.as_ref().is_none_or(|a| !a.is_match(text))
    }

    /// The ids of `text`, which [`FastBpe::takes`].
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.0 != self.id {
                *cache = (self.id, HashMap::default());
            }
            let map = &mut cache.1;
            let mut piece = |p: &str| self.encode_piece(p.as_bytes(), map, &mut out);
            if self.digits {
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    if c.is_numeric() {
                        self.split(&text[start..i], &mut piece);
                        piece(&text[i..i + c.len_utf8()]);
                        start = i + c.len_utf8();
                    }
                }
                self.split(&text[start..], &mut piece);
            } else {
                self.split(text, &mut piece);
            }
        });
        out
    }

    /// Calls `piece` on each pre-token of `text` (one run between digits) in order.
    fn split(&self, text: &str, piece: &mut impl FnMut(&str)) {
        let mut at = 0;
        while at < text.len() {
            let m = self
                .pieces
                .find_at(text, at)
                .expect("every character starts a piece");
            debug_assert_eq!(m.start(), at);
            let mut end = m.end();
            // `\s+(?!\S)`: a whitespace run before a non-space keeps its last character back.
            if end < text.len() {
                let s = m.as_str();
                let mut chars = s.chars();
                if let (Some(_), Some(last)) = (chars.next(), chars.next_back()) {
                    if s.chars().all(char::is_whitespace) {
                        end -= last.len_utf8();
                    }
                }
            }
            piece(&text[at..end]);
            at = end;
        }
    }

    fn encode_piece(&self, piece: &[u8], cache: &mut PieceCache, out: &mut Vec<u32>) {
        if piece.len() == 1 {
            let id = self.byte_ids[piece[0] as usize];
            if id != NO_ID {
                out.push(id);
            }
            return;
        }
        if piece.len() <= CACHE_MAX_PIECE {
            if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
        }
        let start = out.len();
        self.merge_into(piece, out);
        if piece.len() <= CACHE_MAX_PIECE {
            if cache.len() >= CACHE_PIECES {
                cache.clear();
            }
            cache.insert(piece.to_vec(), out[start..].to_vec());
        }
    }

    /// BPE of one piece, as `tokenizers`' `Word::merge_all`: a min-heap of (rank, position)
    /// over adjacent pairs, stale entries skipped.
    fn merge_into(&self, piece: &[u8], out: &mut Vec<u32>) {
        if let Some(id) = self.whole.as_ref().and_then(|w| w.get(piece)) {
            out.push(*id);
            return;
        }
        let mut id: Vec<u32> = piece
            .iter()
            .map(|&b| self.byte_ids[b as usize])
            .filter(|&id| id != NO_ID)
            .collect();
        let n = id.len();
        if n == 0 {
            return;
        }
        let mut prev: Vec<isize> = (0..n as isize).map(|i| i - 1).collect();
        let mut next: Vec<isize> = (1..=n as isize).collect();
        next[n - 1] = -1;
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            if let Some(&(rank, new)) = self.merges.get(&(id[i], id[i + 1])) {
                heap.push(std::cmp::Reverse((rank, i, new)));
            }
        }
        while let Some(std::cmp::Reverse((_, pos, new))) = heap.pop() {
            if !alive[pos] || next[pos] < 0 {
                continue;
            }
            let right = next[pos] as usize;
            if self.merges.get(&(id[pos], id[right])).map(|m| m.1) != Some(new) {
                continue;
            }
            id[pos] = new;
            alive[right] = false;
            next[pos] = next[right];
            if next[right] >= 0 {
                prev[next[right] as usize] = pos as isize;
            }
            if prev[pos] >= 0 {
                let p = prev[pos] as usize;
                if let Some(&(rank, m)) = self.merges.get(&(id[p], id[pos])) {
                    heap.push(std::cmp::Reverse((rank, p, m)));
                }
            }
            if next[pos] >= 0 {
                let r = next[pos] as usize;
                if let Some(&(rank, m)) = self.merges.get(&(id[pos], id[r])) {
                    heap.push(std::cmp::Reverse((rank, pos, m)));
                }
            }
        }
        out.extend((0..n).filter(|&i| alive[i]).map(|i| id[i]));
    }
}

/// Whether a pre-tokenizer is the GPT-2 byte-level one this encoder reproduces:
/// `Some(false)` for `ByteLevel` with the regex and no prefix space, `Some(true)` for that
/// after `Digits { individual_digits: true }`, `None` for anything else.
fn pre_tokenizer_digits(pre: &serde_json::Value) -> Option<bool> {
    if is_byte_level(pre) {
        return Some(false);
    }
    if pre.get("type")?.as_str()? != "Sequence" {
        return None;
    }
    match pre.get("pretokenizers")?.as_array()?.as_slice() {
        [d, b]
            if d.get("type")?.as_str()? == "Digits"
                && d.get("individual_digits")?.as_bool()?
                && is_byte_level(b) =>
        {
            Some(true)
        }
        [b] if is_byte_level(b) => Some(false),
        _ => None,
    }
}

/// `ByteLevel` with the GPT-2 regex and no prefix space (`tokenizers`' defaults are the regex
/// and a prefix space, so the latter must be said).
fn is_byte_level(p: &serde_json::Value) -> bool {
    p.get("type").and_then(|t| t.as_str()) == Some("ByteLevel")
        && p.get("use_regex").and_then(|x| x.as_bool()) != Some(false)
        && p.get("add_prefix_space").and_then(|x| x.as_bool()) == Some(false)
}
