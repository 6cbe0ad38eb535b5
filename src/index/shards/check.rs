//! A shard's answer checked against its question and the shard's own figures before any merge
//! reads it.
//!
//! Shards held elsewhere answer over a wire (`Shards::ask`): a shard of another build, a
//! damaged one or a hostile one can send anything that parses. Every merge reads answers
//! through `asked` (in the parent module), which refuses an answer of another kind than its question asks for, a
//! range outside the shard or out of order, a length longer than what was asked, a token id
//! outside the vocabulary, counts out of order or summing past the occurrences they count, a
//! document past the shard's documents, and so on: the invariants that the merges and the
//! readers after them index by. A refused answer is an [`Error::Unavailable`] naming the shard
//! and what was wrong, never a hang (a loop bounded by a length the shard gave), a panic (a
//! slice cut by it) or a wrong number passed on.
//!
//! The same figures bound a question on the answering side ([`check_question`]): a position,
//! rank or document past the shard is refused before the shard reads it.

use super::wire::{LevelPoint, ShardAnswer, ShardInfo, ShardQuery};
use crate::error::{Error, Result};
use crate::index::counting::SuffixGroup;
use crate::index::query::{CnfPart, Counts, Located, Occ};
use crate::index::Range;

/// What an answer of one shard is checked against: its figures and the vocabulary.
pub(super) struct Bounds {
    /// Positions (tokens, separators included).
    tokens: u64,
    /// Documents.
    documents: u64,
    /// The separator id (a document's end in counts).
    separator: u32,
    /// The vocabulary's size, when known (ids at or above it cannot occur).
    vocab: Option<u32>,
}

impl Bounds {
    /// The bounds of a shard of `info`, in a corpus whose separator is `separator` and whose
    /// vocabulary holds `vocab` ids (0: unknown).
    pub(super) fn new(info: ShardInfo, separator: u32, vocab: usize) -> Bounds {
        Bounds {
            tokens: info.tokens,
            documents: info.documents,
            separator,
            vocab: (vocab > 0).then(|| u32::try_from(vocab).unwrap_or(u32::MAX)),
        }
    }
}

/// Why an answer was refused.
pub(super) type Wrong = String;

/// Whether `a` can be the answer of a shard of `b`'s figures to `q`.
pub(super) fn check_answer(
    q: &ShardQuery,
    a: &ShardAnswer,
    b: &Bounds,
) -> std::result::Result<(), Wrong> {
    match (q, a) {
        (ShardQuery::Find { .. }, ShardAnswer::Range { range }) => b.range(*range, "range"),
        (ShardQuery::LongestSuffix { prompt }, ShardAnswer::Suffix { len, occ }) => {
            within(*len, prompt.len(), "the suffix's length")?;
            b.occ(*occ)?;
            if *len > 0 && occ.is_empty() {
                return Err("a suffix that occurs has no occurrences".into());
            }
            Ok(())
        }
        (
            ShardQuery::NextCounts { occ, .. },
            ShardAnswer::NextCounts {
                occurrences,
                counts,
            },
        ) => {
            b.count(*occurrences, "occurrences")?;
            if let Some(occ) = occ {
                if *occurrences != occ.len() as u64 {
                    return Err(format!(
                        "{occurrences} occurrences where its own range holds {}",
                        occ.len()
                    ));
                }
            }
            b.counts(counts, *occurrences)
        }
        (ShardQuery::ClauseTotals { cnf }, ShardAnswer::ClauseTotals { totals }) => {
            if totals.len() != cnf.len() {
                return Err(format!("{} totals for {} clauses", totals.len(), cnf.len()));
            }
            for (t, clause) in totals.iter().zip(cnf) {
                let most = b.tokens.saturating_mul(clause.len() as u64);
                if *t > most {
                    return Err(format!("a clause total of {t} (at most {most})"));
                }
            }
            Ok(())
        }
        (
            ShardQuery::Cnf {
                cnf,
                anchor,
                maxnum,
                max_disp_len,
                ..
            },
            ShardAnswer::Cnf(part),
        ) => {
            let grams = cnf.get(*anchor).map_or(0, Vec::len) as u64;
            b.cnf_part(part, *maxnum, *max_disp_len, grams)
        }
        (ShardQuery::Window { before, after, .. }, ShardAnswer::Document(l))
        | (ShardQuery::RankWindow { before, after, .. }, ShardAnswer::Document(l)) => {
            b.located(l, before.saturating_add(*after))
        }
        (ShardQuery::Doc { doc, max_len }, ShardAnswer::Document(l)) => {
            if l.document.doc_ix != *doc as u64 {
                return Err(format!("document {} for document {doc}", l.document.doc_ix));
            }
            b.located(l, *max_len)
        }
        (
            ShardQuery::SpanDocs {
                max_docs,
                before,
                after,
                ..
            },
            ShardAnswer::Documents { documents },
        ) => {
            within(documents.len(), *max_docs, "documents")?;
            let most = before.saturating_add(*after);
            documents.iter().try_for_each(|l| b.located(l, most))
        }
        (ShardQuery::LongestMatches { tokens }, ShardAnswer::Matches { matches }) => {
            if matches.len() != tokens.len() {
                return Err(format!(
                    "{} matches for {} tokens",
                    matches.len(),
                    tokens.len()
                ));
            }
            for (j, m) in matches.iter().enumerate() {
                within(m.len, j + 1, "a match's length")?;
                b.count(m.count, "a match's count")?;
            }
            Ok(())
        }
        (
            ShardQuery::Levels {
                ctx, include_empty, ..
            },
            ShardAnswer::Levels { points },
        ) => b.level_points(points, ctx.len(), *include_empty),
        (ShardQuery::ContinuationPairs { .. }, ShardAnswer::Pairs { pairs }) => {
            b.count(pairs.len() as u64, "pairs")?;
            for (i, &(x, y)) in pairs.iter().enumerate() {
                b.id(x)?;
                b.id(y)?;
                if i > 0 && pairs[i - 1] >= (x, y) {
                    return Err("pairs out of order or repeated".into());
                }
            }
            Ok(())
        }
        (
            ShardQuery::SuffixGroups { order, from, .. },
            ShardAnswer::SuffixGroups {
                groups,
                next,
                longest,
            },
        ) => {
            b.count(*longest as u64, "the longest document")?;
            let end = match next {
                Some(n) if *n <= *from || *n as u64 >= b.tokens => {
                    return Err(format!("the next page at rank {n}"))
                }
                Some(n) => *n as u64,
                None => b.tokens,
            };
            b.suffix_groups(groups, *order, end.saturating_sub(*from as u64))
        }
        _ => Err(format!("{} with another kind of answer", q.kind())),
    }
}

/// `x ≤ most`, or what `what` is and its bound.
fn within(x: usize, most: usize, what: &str) -> std::result::Result<(), Wrong> {
    match x <= most {
        true => Ok(()),
        false => Err(format!("{what} {x} (at most {most})")),
    }
}

impl Bounds {
    /// A token id of the vocabulary, or the separator (a document's end).
    fn id(&self, t: u32) -> std::result::Result<(), Wrong> {
        let inside =
            t == self.separator || (t < self.separator && self.vocab.is_none_or(|v| t < v.max(1)));
        match inside {
            true => Ok(()),
            false => Err(format!("token id {t} is outside the vocabulary")),
        }
    }

    /// A number of positions of the shard.
    fn count(&self, n: u64, what: &str) -> std::result::Result<(), Wrong> {
        match n <= self.tokens {
            true => Ok(()),
            false => Err(format!(
                "{what} {n} (the shard has {} positions)",
                self.tokens
            )),
        }
    }

    /// A suffix-array range of the shard, in order.
    fn range(&self, (lo, hi): Range, what: &str) -> std::result::Result<(), Wrong> {
        if lo > hi || hi as u64 > self.tokens {
            return Err(format!(
                "{what} [{lo}, {hi}) (the shard has {} positions)",
                self.tokens
            ));
        }
        Ok(())
    }

    fn occ(&self, occ: Occ) -> std::result::Result<(), Wrong> {
        let (Occ::Fwd(r) | Occ::Rev(r)) = occ;
        self.range(r, "occurrences")
    }

    /// Next-token counts: sorted by id without repeats, each id in the vocabulary, each count
    /// at least one, summing to at most `occurrences`.
    fn counts(&self, counts: &Counts, occurrences: u64) -> std::result::Result<(), Wrong> {
        let mut sum = 0u64;
        for (i, &(t, c)) in counts.iter().enumerate() {
            self.id(t)?;
            if i > 0 && counts[i - 1].0 >= t {
                return Err("counts out of order or repeated".into());
            }
            if c == 0 {
                return Err(format!("a count of 0 for token {t}"));
            }
            sum = sum
                .checked_add(c)
                .filter(|&s| s <= occurrences)
                .ok_or_else(|| format!("counts summing past {occurrences} occurrences"))?;
        }
        Ok(())
    }

    /// A document window of at most `most` tokens.
    fn located(&self, l: &Located, most: usize) -> std::result::Result<(), Wrong> {
        let d = &l.document;
        if l.ptr as u64 >= self.tokens.max(1) {
            return Err(format!(
                "position {} (the shard has {})",
                l.ptr, self.tokens
            ));
        }
        if d.doc_ix >= self.documents {
            return Err(format!(
                "document {} (the shard has {})",
                d.doc_ix, self.documents
            ));
        }
        self.count(d.doc_len as u64, "a document's length")?;
        within(d.token_ids.len(), most.min(d.doc_len), "a window's tokens")?;
        if d.disp_len != d.token_ids.len() {
            return Err(format!(
                "a window of {} tokens said to show {}",
                d.token_ids.len(),
                d.disp_len
            ));
        }
        within(d.needle_offset, d.disp_len, "a window's offset")?;
        d.token_ids.iter().try_for_each(|&t| self.id(t))
    }

    fn cnf_part(
        &self,
        part: &CnfPart,
        maxnum: usize,
        max_disp_len: usize,
        anchor_grams: u64,
    ) -> std::result::Result<(), Wrong> {
        self.count(part.matched, "matches")?;
        if part.ptrs.len() as u64 != part.matched {
            return Err(format!(
                "{} positions for {} matches",
                part.ptrs.len(),
                part.matched
            ));
        }
        if let Some(p) = part.ptrs.iter().find(|&&p| p as u64 >= self.tokens) {
            return Err(format!("position {p} (the shard has {})", self.tokens));
        }
        // Sampling scales the matches up to at most the anchor clause's occurrences.
        let most = self.tokens as f64 * anchor_grams.max(1) as f64;
        let scaled = part.matched as f64 * part.factor;
        if !(part.factor >= 1.0 && scaled <= most) {
            return Err(format!("a sampling factor of {}", part.factor));
        }
        within(part.documents.len(), maxnum, "documents")?;
        // A window holds half the display length each side of the match.
        let most = max_disp_len.saturating_add(self.tokens as usize);
        part.documents
            .iter()
            .try_for_each(|l| self.located(l, most))
    }

    /// A shard's change points of a context `ctx_len` long: lengths within it, longest first
    /// (none below 1 unless the empty suffix was asked for), occurrences growing as the suffix
    /// shortens, counts as [`Bounds::counts`].
    fn level_points(
        &self,
        points: &[LevelPoint],
        ctx_len: usize,
        include_empty: bool,
    ) -> std::result::Result<(), Wrong> {
        let lowest = usize::from(!include_empty);
        for (i, p) in points.iter().enumerate() {
            within(p.len, ctx_len, "a level's length")?;
            if p.len < lowest {
                return Err("the empty suffix, not asked for".into());
            }
            self.count(p.occurrences, "occurrences")?;
            if i > 0 {
                let before = &points[i - 1];
                if before.len <= p.len || before.occurrences > p.occurrences {
                    return Err("levels out of order".into());
                }
                nested(&before.counts, &p.counts)?;
            }
            self.counts(&p.counts, p.occurrences)?;
        }
        Ok(())
    }

    /// A page of the counting pass's groups: keys of at most `order` ids, in order, holding
    /// the page's `suffixes` exactly.
    fn suffix_groups(
        &self,
        groups: &[SuffixGroup],
        order: usize,
        suffixes_of_page: u64,
    ) -> std::result::Result<(), Wrong> {
        let mut suffixes = 0u64;
        for (i, g) in groups.iter().enumerate() {
            within(g.key.len(), order, "a key's length")?;
            g.key.iter().try_for_each(|&t| self.id(t))?;
            if i > 0 && padded_cmp(&groups[i - 1].key, &g.key, self.separator).is_ge() {
                return Err("suffix groups out of order or repeated".into());
            }
            for (j, &(t, n)) in g.lefts.iter().enumerate() {
                self.id(t)?;
                if j > 0 && g.lefts[j - 1].0 >= t {
                    return Err("tokens before a group out of order".into());
                }
                suffixes = suffixes
                    .checked_add(n)
                    .filter(|&s| s <= suffixes_of_page)
                    .ok_or_else(|| format!("more suffixes than the page's {suffixes_of_page}"))?;
            }
        }
        match suffixes == suffixes_of_page {
            true => Ok(()),
            false => Err(format!(
                "{suffixes} suffixes in a page of {suffixes_of_page}"
            )),
        }
    }
}

/// A longer suffix's counts within a shorter one's: each of its tokens there, counted as
/// often at least.
fn nested(longer: &Counts, shorter: &Counts) -> std::result::Result<(), Wrong> {
    let mut i = 0;
    for &(t, c) in longer {
        while i < shorter.len() && shorter[i].0 < t {
            i += 1;
        }
        match shorter.get(i) {
            Some(&(u, d)) if u == t && d >= c => {}
            _ => return Err(format!("token {t} counted more after a longer suffix")),
        }
    }
    Ok(())
}

/// Keys compared as the counting pass orders them: padded with the separator.
pub(crate) fn padded_cmp(a: &[u32], b: &[u32], sep: u32) -> std::cmp::Ordering {
    let at = |k: &[u32], i: usize| k.get(i).copied().unwrap_or(sep);
    (0..a.len().max(b.len()))
        .map(|i| at(a, i).cmp(&at(b, i)))
        .find(|o| o.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}

/// Refuses a question that reads past shard `info` (a position, a rank, a document or
/// occurrences it does not have): what a shard checks before it answers.
pub fn check_question(q: &ShardQuery, info: ShardInfo) -> Result<()> {
    let past = |what: &str, i: u64, n: u64| {
        Err(Error::input(format!(
            "{what} {i} is outside the shard (0..{n})"
        )))
    };
    match *q {
        ShardQuery::Window { pos: i, .. } if i as u64 >= info.tokens => {
            past("position", i as u64, info.tokens)
        }
        ShardQuery::RankWindow { rank: i, .. } if i as u64 >= info.tokens => {
            past("rank", i as u64, info.tokens)
        }
        ShardQuery::Doc { doc, .. } if doc as u64 >= info.documents => {
            past("document", doc as u64, info.documents)
        }
        ShardQuery::NextCounts { occ: Some(occ), .. } => {
            let (Occ::Fwd((lo, hi)) | Occ::Rev((lo, hi))) = occ;
            match lo <= hi && hi as u64 <= info.tokens {
                true => Ok(()),
                false => past("occurrence range end", hi as u64, info.tokens + 1),
            }
        }
        _ => Ok(()),
    }
}
