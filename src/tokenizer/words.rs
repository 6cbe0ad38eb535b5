//! The word-level tokenizer of classic n-gram language models (`--tokenizer words`): text is
//! split at whitespace, case kept, and each distinct word is one id, as KenLM's `lmplz` reads
//! its input.
//!
//! * Whitespace is what `lmplz` splits at: space, tab, carriage return, line feed and NUL.
//! * Ids 0, 1 and 2 are `<unk>`, `<s>` and `</s>` (KenLM's own numbering); the corpus's words
//!   follow in order of first appearance. A word of a scored text that the corpus never had is
//!   `<unk>`. Those three strings in a text are whitespace (as `lmplz` treats them).
//! * The vocabulary is built from the corpus by a first pass ([`WordTokenizer::from_corpus`])
//!   and kept in the index directory as [`VOCAB_FILE`] (one word per line, line `i` is id `i`);
//!   the header records its fingerprint, so a changed or damaged vocabulary is refused.
//! * **Sentence mode** ([`WordTokenizer::sentences`]): each line is a sentence, `<s>` before it
//!   and `</s>` after it, and each sentence is a document of the index, so no n-gram crosses a
//!   line. An empty line is the sentence `<s> </s>`; a final line feed ends the last sentence
//!   rather than starting an empty one.

use super::{fnv1a64, Tokenizer, TokenizerSpec};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The file of an index directory that holds its word vocabulary.
pub const VOCAB_FILE: &str = "vocab.words";
/// The tokenizer kind of a word-level index.
pub const KIND: &str = "words";
/// Id of `<unk>`, a word the corpus never had.
pub const UNK: u32 = 0;
/// Id of `<s>`, the start of a sentence (never predicted).
pub const BOS: u32 = 1;
/// Id of `</s>`, the end of a sentence (predicted like a word).
pub const EOS: u32 = 2;
/// The three special words, at their ids.
pub const SPECIALS: [&str; 3] = ["<unk>", "<s>", "</s>"];

/// Whether `c` separates words (`lmplz`'s delimiters).
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n' | '\0')
}

/// The words of `text`, the special words left out (they are whitespace in a corpus).
fn corpus_words(text: &str) -> impl Iterator<Item = &str> {
    text.split(is_space)
        .filter(|w| !w.is_empty() && !SPECIALS.contains(w))
}

/// `text` cut into at most `parts` slices of about equal size, each ending at a line feed
/// (or the end).
pub fn split_at_lines(text: &str, parts: usize) -> Vec<&str> {
    let size = text.len().div_ceil(parts.max(1)).max(1 << 20);
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = if rest.len() <= size {
            rest.len()
        } else {
            rest[size..].find('\n').map_or(rest.len(), |i| size + i + 1)
        };
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out
}

/// Each line of `text` as a sentence of any tokenizer with sentence marks: `bos`, the
/// line's tokens, `eos`. Slices of lines are encoded in parallel (one large file is one
/// document), in order.
pub fn encode_sentences(
    tok: &dyn Tokenizer,
    text: &str,
    (bos, eos): (u32, u32),
) -> Result<Vec<Vec<u32>>> {
    use rayon::prelude::*;
    let lines: Vec<&str> = sentence_lines(text).collect();
    let chunk = lines
        .len()
        .div_ceil(4 * rayon::current_num_threads())
        .max(1);
    let parts: Vec<Result<Vec<Vec<u32>>>> = lines
        .par_chunks(chunk)
        .map(|lines| {
            lines
                .iter()
                .map(|line| {
                    let mut ids = vec![bos];
                    ids.extend(tok.encode(line)?);
                    ids.push(eos);
                    Ok(ids)
                })
                .collect()
        })
        .collect();
    let mut all = Vec::with_capacity(lines.len());
    for p in parts {
        all.extend(p?);
    }
    Ok(all)
}

/// The lines of `text` as sentences (a final line feed does not start an empty one).
pub fn sentence_lines(text: &str) -> impl Iterator<Item = &str> {
    text.strip_suffix('\n').unwrap_or(text).split('\n')
}

/// Whitespace-split words with a vocabulary taken from a corpus.
#[derive(Clone, Debug)]
pub struct WordTokenizer {
    words: Vec<String>,
    ids: HashMap<String, u32>,
    fingerprint: String,
    /// Where the vocabulary was read from (empty when built in memory).
    path: PathBuf,
}

impl WordTokenizer {
    /// A vocabulary of the specials and then `words` in order (duplicates and specials
    /// skipped).
    pub fn from_words<'a>(words: impl IntoIterator<Item = &'a str>) -> Self {
        let mut tok = WordTokenizer {
            words: Vec::new(),
            ids: HashMap::new(),
            fingerprint: String::new(),
            path: PathBuf::new(),
        };
        for w in SPECIALS.into_iter().chain(words) {
            tok.add(w);
        }
        tok.sealed()
    }

    /// Gives `w` the next id unless it has one.
    fn add(&mut self, w: &str) {
        if !self.ids.contains_key(w) {
            self.ids.insert(w.to_string(), self.words.len() as u32);
            self.words.push(w.to_string());
        }
    }

    /// The tokenizer with the fingerprint of its finished vocabulary.
    fn sealed(mut self) -> Self {
        self.fingerprint = fingerprint_of(&self.words);
        self
    }

    /// The vocabulary of a corpus's documents (texts), in order of first appearance.
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut tok = WordTokenizer::from_words(std::iter::empty());
        for t in texts {
            tok.extend(t);
        }
        tok.sealed()
    }

    /// The vocabulary of the documents of corpus files (a first pass over them).
    pub fn from_corpus(files: &[PathBuf]) -> Result<Self> {
        let mut tok = WordTokenizer::from_words(std::iter::empty());
        crate::corpus::for_each_doc(
            files,
            |_| String::new(),
            |doc, _| {
                tok.extend(&doc.text);
                Ok(())
            },
        )?;
        Ok(tok.sealed())
    }

    /// Adds the new words of `text`, in order of first appearance (the fingerprint waits for
    /// [`WordTokenizer::sealed`]). A large text is cut at line feeds into slices whose
    /// distinct words are listed in parallel, then merged in slice order (the same order a
    /// single pass gives).
    fn extend(&mut self, text: &str) {
        use rayon::prelude::*;
        let slices = split_at_lines(text, 4 * rayon::current_num_threads());
        let firsts: Vec<Vec<&str>> = slices
            .par_iter()
            .map(|slice| {
                let mut seen = std::collections::HashSet::new();
                corpus_words(slice).filter(|w| seen.insert(*w)).collect()
            })
            .collect();
        for w in firsts.into_iter().flatten() {
            self.add(w);
        }
    }

    /// Reads a vocabulary file ([`VOCAB_FILE`]) and checks it against the fingerprint the
    /// index recorded.
    pub fn load(path: &Path, expected_fingerprint: Option<&str>) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let words: Vec<&str> = text.split('\n').collect();
        if words.len() < 3 || words[..3] != SPECIALS {
            return Err(Error::input(format!(
                "{}: not a word vocabulary (its first lines must be <unk>, <s>, </s>); rebuild \
                 the index with `infgram index --tokenizer words`",
                path.display()
            )));
        }
        let mut tok = WordTokenizer::from_words(words[3..].iter().copied());
        if tok.words.len() != words.len() {
            return Err(Error::input(format!(
                "{}: a word is listed twice; the vocabulary is damaged: rebuild the index",
                path.display()
            )));
        }
        if let Some(fp) = expected_fingerprint {
            if tok.fingerprint != fp {
                return Err(Error::input(format!(
                    "{}: the vocabulary's fingerprint {} is not the one the index recorded ({fp}): \
                     the file was changed or damaged; rebuild the index",
                    path.display(),
                    tok.fingerprint
                )));
            }
        }
        tok.path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(tok)
    }

    /// The vocabulary file's contents (one word per line, line `i` is id `i`).
    pub fn file_contents(&self) -> String {
        self.words.join("\n")
    }

    /// The id of a word (`<unk>` for a word the vocabulary does not hold).
    pub fn id(&self, word: &str) -> u32 {
        self.ids.get(word).copied().unwrap_or(UNK)
    }

    /// The word of an id.
    pub fn word(&self, id: u32) -> Option<&str> {
        self.words.get(id as usize).map(String::as_str)
    }

    /// Each line of `text` as a sentence: `<s>`, its words, `</s>`.
    pub fn sentences(&self, text: &str) -> Vec<Vec<u32>> {
        encode_sentences(self, text, (BOS, EOS)).expect("encoding words cannot fail")
    }
}

fn fingerprint_of(words: &[String]) -> String {
    let mut bytes = b"infgram-words-v1\n".to_vec();
    for w in words {
        bytes.extend_from_slice(w.as_bytes());
        bytes.push(b'\n');
    }
    format!("{:016x}", fnv1a64(&bytes))
}

impl Tokenizer for WordTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(corpus_words(text).map(|w| self.id(w)).collect())
    }
    /// Words joined by spaces; `</s>` ends a line and `<s>` is left out (a generation in
    /// sentence mode reads as lines).
    fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &t in ids {
            let word = self.word(t).ok_or_else(|| {
                Error::input(format!(
                    "token id {t} is outside the vocabulary of {} words",
                    self.words.len()
                ))
            })?;
            match t {
                BOS => {}
                EOS => out.push('\n'),
                _ => {
                    if !out.is_empty() && !out.ends_with('\n') {
                        out.push(' ');
                    }
                    out.push_str(word);
                }
            }
        }
        Ok(out)
    }
    /// Token by token (streamed output): each word with a space before it, `</s>` a line
    /// feed, `<s>` nothing, so pieces shown one after another read as words.
    fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &t in ids {
            match t {
                BOS => {}
                EOS => out.push(b'\n'),
                _ => {
                    out.push(b' ');
                    out.extend_from_slice(self.decode(&[t])?.as_bytes());
                }
            }
        }
        Ok(out)
    }
    fn vocab_size(&self) -> usize {
        self.words.len()
    }
    fn name(&self) -> String {
        "words".into()
    }
    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
    fn spec(&self) -> TokenizerSpec {
        TokenizerSpec {
            kind: KIND.into(),
            path: VOCAB_FILE.into(),
            fingerprint: self.fingerprint(),
            vocab_size: self.vocab_size(),
        }
    }
    fn index_files(&self) -> Vec<(&'static str, Vec<u8>)> {
        vec![(VOCAB_FILE, self.file_contents().into_bytes())]
    }
    fn sentence_marks(&self) -> Option<(u32, u32)> {
        Some((BOS, EOS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_get_ids_in_order_of_first_appearance_after_the_specials() {
        let tok = WordTokenizer::from_texts(["the quick brown fox", "the <s> quick\tred\r\nfox"]);
        assert_eq!(tok.vocab_size(), 8);
        assert_eq!(tok.encode("the fox red cat").unwrap(), vec![3, 6, 7, UNK]);
        assert_eq!(
            tok.sentences("the fox\n\nred\n"),
            vec![vec![BOS, 3, 6, EOS], vec![BOS, EOS], vec![BOS, 7, EOS]]
        );
        assert_eq!(tok.decode(&[1, 3, 4, 2, 1, 5]).unwrap(), "the quick\nbrown");
        assert!(tok.decode(&[99]).is_err());
    }

    #[test]
    fn a_large_text_gets_the_order_of_a_single_pass() {
        // Over 1 MiB, so the text is cut into slices listed in parallel.
        let mut x: u64 = 7;
        let text: String = (0..400_000)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let sep = if i % 9 == 0 { "\n" } else { " " };
                format!("w{}{sep}", (x >> 33) % (1 + i as u64 / 10))
            })
            .collect();
        assert!(split_at_lines(&text, 8).len() > 1);
        let mut want: Vec<&str> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for w in corpus_words(&text) {
            if seen.insert(w) {
                want.push(w);
            }
        }
        let tok = WordTokenizer::from_texts([text.as_str()]);
        assert_eq!(tok.words[3..], want[..]);
        assert_eq!(split_at_lines(&text, 8).concat(), text);
    }

    #[test]
    fn the_vocabulary_file_round_trips_and_a_changed_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tok = WordTokenizer::from_texts(["a b c a"]);
        let path = dir.path().join(VOCAB_FILE);
        std::fs::write(&path, tok.file_contents()).unwrap();
        let back = WordTokenizer::load(&path, Some(&tok.fingerprint())).unwrap();
        assert_eq!(back.encode("c b a").unwrap(), tok.encode("c b a").unwrap());
        std::fs::write(&path, tok.file_contents().replace('b', "x")).unwrap();
        let err = WordTokenizer::load(&path, Some(&tok.fingerprint())).unwrap_err();
        assert!(err.to_string().contains("rebuild the index"), "{err}");
    }
}
