//! One shard of an index, read side: token access, suffix-array searches, next-token runs.
//!
//! A shard holds the token sequence `T` (documents, each followed by the separator), its
//! suffix array `SA`, optionally the suffix array `RSA` of the reversed sequence
//! `R[j] = T[n-1-j]`, document offsets and metadata. It is generic over its bytes (`S:
//! AsRef<[u8]>`): a `Vec<u8>` in tests, a memory map in production.
//!
//! ## Searches
//! * **Forward range** of a pattern `q` ([`Shard::find`]): two binary searches over `SA`,
//!   `O(|q| log n)` token comparisons but only `O(log n)` random probes.
//! * **Narrowing** ([`Shard::narrow`], [`Shard::rnarrow`]): inside the range of `q`, suffixes are
//!   sorted by the token at offset `|q|`, so the range of `q·x` is found by a binary search on one
//!   token per probe. In `RSA` the same step extends a *right-anchored* context to the left,
//!   which is what ∞-gram queries and SBIS need: the ranges of a prompt's suffixes nest.
//! * **Next-token runs** ([`Shard::runs`]): within the forward range of `q` each distinct next
//!   token is one run; galloping finds all `D` runs in `O(D log range)` probes, exactly.

use crate::index::format::SA_PADDING;
use std::cmp::Ordering;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

/// A half-open range `[lo, hi)` of a suffix array.
pub type Range = (usize, usize);

/// Where a shard's documents keep their separator, and how its suffix array is written: the
/// two on-disk formats that [`Shard`] reads (`FORMAT.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// infgram's format: every document followed by the separator, `docs.bin` holding
    /// `documents + 1` token offsets, suffix-array pointers in tokens, padded by 8 bytes, and
    /// suffixes sorted by token value.
    Infgram,
    /// infini-gram's format: every document preceded by the separator, `offset.N` holding one
    /// byte offset per document, suffix-array pointers in bytes, unpadded, and suffixes sorted
    /// by their little-endian bytes (so u16 / u32 tokens are not in numeric order).
    InfiniGram,
}

/// Read side of one shard.
pub struct Shard<S> {
    pub(crate) tokens: S,
    pub(crate) sa: S,
    pub(crate) rsa: Option<S>,
    /// Every [`SAMPLE_STEP`]-th suffix's first 8 bytes of tokens (`sample.bin`), if present.
    sample: Option<S>,
    pub(crate) docs: S,
    pub(crate) meta: Option<(S, S)>,
    pub(crate) n: usize,
    pub(crate) width: usize,
    pub(crate) ptr_width: usize,
    pub(crate) sep: u32,
    pub(crate) n_docs: usize,
    layout: Layout,
    /// Suffixes are sorted by the tokens' little-endian bytes (infini-gram's u16 / u32 tables):
    /// comparisons go through [`Shard::order`].
    byte_order: bool,
    /// Suffix-array pointers count bytes: shift them right by this to get token positions.
    ptr_shift: u32,
    /// Memo of `RSA` ranges of 1- and 2-token contexts (see [`Shard::rrange_short`]): the
    /// first two narrowing steps are the most expensive ones (ranges of ~n and ~n/σ). For
    /// 1-byte tokens every context has its entry (65,536 two-token contexts); for wider tokens
    /// each id below 2^16 has one and the pairs share a direct-mapped table.
    short_ranges: std::sync::OnceLock<Box<[AtomicU64]>>,
}

/// Marks an entry of the short-range memo as not computed yet.
const UNKNOWN: u64 = u64::MAX;

/// Token ids with a memo entry of their own (wider tokens).
const WIDE_SINGLES: usize = 1 << 16;

/// Slots of the pair table (wider tokens): each slot is two words, `key << 32 | lo` and
/// `key << 32 | hi`, so a read that sees another pair's key in either word (a slot being
/// rewritten) is a miss, never a wrong range.
const WIDE_PAIR_SLOTS: usize = 1 << 16;

impl<S: AsRef<[u8]>> Shard<S> {
    /// Assembles a shard from its parts; sizes must already be validated.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        tokens: S,
        sa: S,
        rsa: Option<S>,
        docs: S,
        meta: Option<(S, S)>,
        width: usize,
        ptr_width: usize,
        sep: u32,
    ) -> Self {
        let n = tokens.as_ref().len() / width;
        let n_docs = (docs.as_ref().len() / 8).saturating_sub(1);
        Shard {
            layout: Layout::Infgram,
            byte_order: false,
            ptr_shift: 0,
            tokens,
            sa,
            rsa,
            sample: None,
            docs,
            meta,
            n,
            width,
            ptr_width,
            sep,
            n_docs,
            short_ranges: std::sync::OnceLock::new(),
        }
    }

    /// Reads the shard as infini-gram's format (see [`Layout::InfiniGram`]): `docs` holds one
    /// byte offset per document.
    pub(crate) fn infini_gram(mut self) -> Self {
        self.layout = Layout::InfiniGram;
        self.byte_order = self.width > 1;
        self.ptr_shift = self.width.trailing_zeros();
        self.n_docs = self.docs.as_ref().len() / 8;
        self
    }

    /// The shard's on-disk layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether suffixes are sorted by their tokens' bytes rather than by token value (then
    /// next-token runs do not come in token order).
    pub fn byte_ordered(&self) -> bool {
        self.byte_order
    }

    /// The key a token sorts by in this shard's suffix array: the token itself, or for
    /// byte-ordered shards its bytes read big-endian (an involution: `order(order(t)) = t`).
    #[inline(always)]
    fn order(&self, t: u32) -> u32 {
        if !self.byte_order {
            t
        } else if self.width == 2 {
            (t as u16).swap_bytes() as u32
        } else {
            t.swap_bytes()
        }
    }

    /// Tokens in the shard, separators included.
    pub fn len(&self) -> usize {
        self.n
    }
    /// Whether the shard holds no token.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Documents in the shard.
    pub fn num_docs(&self) -> usize {
        self.n_docs
    }
    /// Corpus tokens (separators excluded).
    pub fn content_tokens(&self) -> usize {
        self.n.saturating_sub(self.n_docs)
    }
    /// Whether the reversed suffix array is present.
    pub fn has_reverse(&self) -> bool {
        self.rsa.is_some()
    }

    /// Token at position `i` of `T`.
    #[inline(always)]
    pub fn tok(&self, i: usize) -> u32 {
        let t = self.tokens.as_ref();
        match self.width {
            1 => t[i] as u32,
            2 => u16::from_le_bytes([t[2 * i], t[2 * i + 1]]) as u32,
            _ => u32::from_le_bytes([t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]]),
        }
    }

    /// The sort key of the token at position `i` of `T`: the token, or for byte-ordered
    /// shards its bytes read big-endian (`order(tok(i))` in one read).
    #[inline(always)]
    fn key_tok(&self, i: usize) -> u32 {
        if self.byte_order {
            return self.byte_key(i);
        }
        self.tok(i)
    }

    /// [`Shard::key_tok`] of a byte-ordered shard.
    #[inline]
    fn byte_key(&self, i: usize) -> u32 {
        let t = self.tokens.as_ref();
        if self.width == 2 {
            u16::from_be_bytes([t[2 * i], t[2 * i + 1]]) as u32
        } else {
            u32::from_be_bytes([t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]])
        }
    }

    #[inline(always)]
    fn read_ptr(&self, bytes: &[u8], i: usize) -> usize {
        let o = i * self.ptr_width;
        let word = match bytes.get(o..o + SA_PADDING) {
            Some(w) => u64::from_le_bytes(w.try_into().expect("8 bytes")),
            // infini-gram's tables are not padded: the last pointers are read byte by byte.
            None => read_unpadded(bytes, o, self.ptr_width),
        };
        let mask = if self.ptr_width >= 8 {
            u64::MAX
        } else {
            (1u64 << (8 * self.ptr_width)) - 1
        };
        // A damaged file may hold pointers past the end: clamp them to the end (an empty
        // suffix), so reads stay in bounds; the checksums at open and `verify` report the damage.
        (((word & mask) >> self.ptr_shift) as usize).min(self.n)
    }

    /// `SA[i]`: start in `T` of the `i`-th smallest suffix.
    #[inline(always)]
    pub fn sa(&self, i: usize) -> usize {
        match self.layout {
            Layout::Infgram => self.read_padded(self.sa.as_ref(), i),
            Layout::InfiniGram => self.read_ptr(self.sa.as_ref(), i),
        }
    }

    /// `RSA[i]`: start in `R` of the `i`-th smallest suffix of the reversed sequence (only
    /// infgram's layout has one).
    #[inline(always)]
    fn rsa(&self, i: usize) -> usize {
        self.read_padded(self.rsa.as_ref().expect("reverse index").as_ref(), i)
    }

    /// A pointer of infgram's layout: in tokens, in a table padded by 8 bytes (one load and a
    /// mask), clamped to the end of `T` as [`Shard::read_ptr`] does.
    #[inline(always)]
    fn read_padded(&self, bytes: &[u8], i: usize) -> usize {
        let o = i * self.ptr_width;
        let word = u64::from_le_bytes(bytes[o..o + SA_PADDING].try_into().expect("8 bytes"));
        let mask = if self.ptr_width >= 8 {
            u64::MAX
        } else {
            (1u64 << (8 * self.ptr_width)) - 1
        };
        ((word & mask) as usize).min(self.n)
    }

    /// Token at offset `d` of the suffix `SA[i]`, or -1 past the end of `T`.
    #[inline(always)]
    fn key(&self, i: usize, d: usize) -> i64 {
        let p = self.sa(i) + d;
        if p < self.n {
            self.key_tok(p) as i64
        } else {
            -1
        }
    }

    /// Token at offset `d` of the reversed suffix `RSA[i]` (i.e. `d` tokens left of its end in
    /// `T`), or -1 past the start of `T`.
    #[inline(always)]
    fn rkey(&self, i: usize, d: usize) -> i64 {
        let r = self.rsa(i) + d;
        if r < self.n {
            // Only infgram's layout has RSA: tokens sort by value.
            self.tok(self.n - 1 - r) as i64
        } else {
            -1
        }
    }

    /// Compares the suffix of `T` at `pos`, cut to `q.len()` tokens, with `q`.
    #[inline]
    fn cmp_suffix(&self, pos: usize, q: &[u32]) -> Ordering {
        if self.width == 1 {
            let t = self.tokens.as_ref();
            let end = (pos + q.len()).min(self.n);
            // u8 tokens: compare bytes directly; q holds bytes only when all ids < 256.
            for (k, &b) in t[pos..end].iter().enumerate() {
                let c = (b as u32).cmp(&q[k]);
                if c != Ordering::Equal {
                    return c;
                }
            }
            return (end - pos).cmp(&q.len());
        }
        for (k, &x) in q.iter().enumerate() {
            let p = pos + k;
            if p >= self.n {
                return Ordering::Less;
            }
            let c = self.key_tok(p).cmp(&self.order(x));
            if c != Ordering::Equal {
                return c;
            }
        }
        Ordering::Equal
    }

    /// Adds the sampled keys of `sample.bin` (see [`sample_keys`]); they are ignored unless
    /// their count matches the shard.
    pub(crate) fn with_sample(mut self, sample: Option<S>) -> Self {
        self.sample = sample.filter(|b| b.as_ref().len() == sample_len(self.n) * 8);
        self
    }

    /// `[lo, hi)` bounds of the `SA` range of `q` from the sampled keys: a key below every
    /// possible key of `q` puts its suffix before the range, one above after it.
    fn sample_bracket(&self, q: &[u32]) -> Range {
        let Some(sample) = &self.sample else {
            return (0, self.n);
        };
        let b = sample.as_ref();
        let m = b.len() / 8;
        let key = |j: usize| u64::from_le_bytes(b[8 * j..8 * j + 8].try_into().expect("8 bytes"));
        let (qlow, qhigh) = query_keys(q, self.width);
        let (mut lo, mut hi) = (0usize, m);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if key(mid) < qlow {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let below = lo; // entries 0..below are < q
        hi = m;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if key(mid) <= qhigh {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let start = if below == 0 {
            0
        } else {
            (below - 1) * SAMPLE_STEP + 1
        };
        let end = if lo >= m { self.n } else { lo * SAMPLE_STEP };
        (start.min(self.n), end.min(self.n))
    }

    /// Range of `SA` whose suffixes start with `q` (the whole array for an empty `q`).
    ///
    /// The sampled keys (when present) narrow the search to a bracket of at most
    /// `SAMPLE_STEP` entries for any query of 8 bytes or more, without touching `SA` or `T`.
    /// Then `split_search` over the bracket: the shared part of the two bounds probed once.
    pub fn find(&self, q: &[u32]) -> Range {
        let bracket = if q.is_empty() {
            (0, self.n)
        } else {
            self.sample_bracket(q)
        };
        Self::split_search(bracket, |i| self.cmp_suffix(self.sa(i), q))
    }

    /// Sub-range of `r` where `key(i) == x`, for keys sorted within `r`. One binary search
    /// until a probe hits `x`; the two bounds are then searched for on either side of it, in
    /// what is left of the range (fewer probes than two searches over all of `r`).
    #[inline]
    fn equal_range(r: Range, x: i64, key: impl Fn(usize) -> i64) -> Range {
        Self::split_search(r, |i| key(i).cmp(&x))
    }

    /// The sub-range of `r` whose entries `probe` finds equal to the target (`probe(i)`: entry
    /// i against it; entries sorted within `r`). One binary search while the probes miss; at
    /// the first probe inside the range, a lower-bound search on its left and an upper-bound
    /// search on its right, in what is left of `r`: the shared part is probed once, not twice.
    #[inline]
    fn split_search(r: Range, probe: impl Fn(usize) -> Ordering) -> Range {
        let (mut lo, mut hi) = r;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match probe(mid) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => {
                    // The first equal entry is in [lo, mid], the last in [mid, hi).
                    let (mut a, mut b) = (lo, mid);
                    while a < b {
                        let m = a + (b - a) / 2;
                        if probe(m) == Ordering::Less {
                            a = m + 1;
                        } else {
                            b = m;
                        }
                    }
                    let (mut c, mut d) = (mid + 1, hi);
                    while c < d {
                        let m = c + (d - c) / 2;
                        if probe(m) == Ordering::Greater {
                            d = m;
                        } else {
                            c = m + 1;
                        }
                    }
                    return (a, c);
                }
            }
        }
        (lo, lo)
    }

    /// Given the `SA` range `r` of some `q` with `|q| = d`, the range of `q·x`.
    pub fn narrow(&self, r: Range, d: usize, x: u32) -> Range {
        match self.layout {
            Layout::Infgram => Self::equal_range(r, x as i64, |i| self.plain_key(i, d)),
            Layout::InfiniGram => Self::equal_range(r, self.order(x) as i64, |i| self.key(i, d)),
        }
    }

    /// Given the `RSA` range `r` of a reversed context of length `d`, the range of the context
    /// extended by `x` on its left. The full range is `(0, len())`.
    pub fn rnarrow(&self, r: Range, d: usize, x: u32) -> Range {
        Self::equal_range(r, x as i64, |i| self.rkey(i, d))
    }

    /// The number of distinct tokens found just before the occurrences of `q` (a document's
    /// start counts as one: the separator), through the reversed suffix array: the occurrences
    /// of `q` are one `RSA` range, sorted by the token before them, so this is a count of runs
    /// (a galloping search each), not a scan of the occurrences. `None` without `rsa.bin`.
    pub fn distinct_left(&self, q: &[u32]) -> Option<u64> {
        self.rsa.as_ref()?;
        let mut r = (0, self.n);
        for (d, &t) in q.iter().rev().enumerate() {
            r = self.rnarrow(r, d, t);
            if r.0 >= r.1 {
                return Some(0);
            }
        }
        let d = q.len();
        let (mut i, hi) = r;
        let mut runs = 0;
        // The start of T (key -1) and a separator are both a document's start: one neighbour.
        let (mut at_text_start, mut after_separator) = (false, false);
        while i < hi {
            let key = self.rkey(i, d);
            let mut step = 1;
            while i + step < hi && self.rkey(i + step, d) == key {
                step *= 2;
            }
            let (mut lo, mut up) = (i + step / 2 + 1, (i + step).min(hi));
            while lo < up {
                let mid = lo + (up - lo) / 2;
                if self.rkey(mid, d) == key {
                    lo = mid + 1;
                } else {
                    up = mid;
                }
            }
            runs += 1;
            at_text_start |= key < 0;
            after_separator |= key == self.separator() as i64;
            i = lo;
        }
        Some(runs - u64::from(at_text_start && after_separator))
    }

    /// `RSA` range of the context `[.., x1, x0]` cut to its last one (`x1 = None`) or two
    /// tokens, memoized; `None` when the memo does not apply (no `RSA`, a shard of 2^32 tokens
    /// or more, an id past the memo).
    pub fn rrange_short(&self, x0: u32, x1: Option<u32>) -> Option<Range> {
        if self.rsa.is_none() || self.n >= u32::MAX as usize {
            return None;
        }
        let narrow = |x1: Option<u32>| {
            let r1 = self.rnarrow((0, self.n), 0, x0);
            match x1 {
                None => r1,
                Some(x1) => self.rnarrow(r1, 1, x1),
            }
        };
        let pack = |r: Range| ((r.0 as u64) << 32) | r.1 as u64;
        let unpack = |v: u64| ((v >> 32) as usize, (v & 0xFFFF_FFFF) as usize);
        if self.width == 1 {
            let memo = self.short_ranges.get_or_init(|| {
                (0..256 + 256 * 256)
                    .map(|_| AtomicU64::new(UNKNOWN))
                    .collect()
            });
            let slot = match x1 {
                None if x0 <= 0xFF => x0 as usize,
                Some(x1) if x0 <= 0xFF && x1 <= 0xFF => 256 + ((x0 as usize) << 8 | x1 as usize),
                _ => return None,
            };
            let v = memo[slot].load(AtomicOrdering::Relaxed);
            if v != UNKNOWN {
                return Some(unpack(v));
            }
            let r = narrow(x1);
            memo[slot].store(pack(r), AtomicOrdering::Relaxed);
            return Some(r);
        }
        if x0 as usize >= WIDE_SINGLES || x1.is_some_and(|x| x as usize >= WIDE_SINGLES) {
            return None;
        }
        let memo = self.short_ranges.get_or_init(|| {
            (0..WIDE_SINGLES + 2 * WIDE_PAIR_SLOTS)
                .map(|_| AtomicU64::new(UNKNOWN))
                .collect()
        });
        let Some(x1) = x1 else {
            let v = memo[x0 as usize].load(AtomicOrdering::Relaxed);
            if v != UNKNOWN {
                return Some(unpack(v));
            }
            let r = narrow(None);
            memo[x0 as usize].store(pack(r), AtomicOrdering::Relaxed);
            return Some(r);
        };
        let key = (x0 as u64) << 16 | x1 as u64;
        let hash = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize % WIDE_PAIR_SLOTS;
        let (a, b) = (WIDE_SINGLES + 2 * hash, WIDE_SINGLES + 2 * hash + 1);
        let (lo, hi) = (
            memo[a].load(AtomicOrdering::Relaxed),
            memo[b].load(AtomicOrdering::Relaxed),
        );
        if lo != UNKNOWN && hi != UNKNOWN && lo >> 32 == key && hi >> 32 == key {
            return Some(((lo & 0xFFFF_FFFF) as usize, (hi & 0xFFFF_FFFF) as usize));
        }
        let start = self.rrange_short(x0, None)?;
        let r = self.rnarrow(start, 1, x1);
        memo[a].store(key << 32 | r.0 as u64, AtomicOrdering::Relaxed);
        memo[b].store(key << 32 | r.1 as u64, AtomicOrdering::Relaxed);
        Some(r)
    }

    /// The next token (in `T`) after the occurrence of a context of length `d` whose reversed
    /// occurrence starts at `RSA[i]`; `None` at the end of `T`.
    #[inline]
    pub fn rnext(&self, i: usize) -> Option<u32> {
        let r = self.rsa(i);
        (r >= 1).then(|| self.tok(self.n - r))
    }

    /// Start in `T` of the occurrence of a length-`d` context recorded at `RSA[i]`.
    #[inline]
    pub fn rstart(&self, i: usize, d: usize) -> usize {
        // Saturating: a damaged `rsa.bin` may point too near the end for a context of length `d`.
        self.n.saturating_sub(self.rsa(i) + d)
    }

    /// Calls `f(token, count)` for each run of equal next tokens (offset `d`) in the forward
    /// range `r`, in suffix order (token order unless [`Shard::byte_ordered`]); the separator
    /// and the end of `T` are included (as the separator id and `u32::MAX` respectively) so
    /// callers decide what to drop.
    pub fn runs(&self, r: Range, d: usize, f: impl FnMut(u32, usize, Range)) {
        // One loop per layout, so infgram's (the hot one) reads keys as directly as it can.
        match self.layout {
            Layout::Infgram => self.runs_by(r, |i| self.plain_key(i, d), |t| t, f),
            Layout::InfiniGram => self.runs_by(r, |i| self.key(i, d), |t| self.order(t), f),
        }
    }

    /// [`Shard::runs`] over the keys `key(i)`, each turned back into a token by `token`.
    #[inline(always)]
    fn runs_by(
        &self,
        r: Range,
        key: impl Fn(usize) -> i64,
        token: impl Fn(u32) -> u32,
        mut f: impl FnMut(u32, usize, Range),
    ) {
        let (mut i, hi) = r;
        while i < hi {
            let t = key(i);
            // Gallop: double the step while the run continues, then binary-search its end.
            let mut step = 1;
            while i + step < hi && key(i + step) == t {
                step *= 2;
            }
            let (mut lo, mut up) = (i + step / 2 + 1, (i + step).min(hi));
            while lo < up {
                let mid = lo + (up - lo) / 2;
                if key(mid) == t {
                    lo = mid + 1;
                } else {
                    up = mid;
                }
            }
            let tok = if t < 0 { u32::MAX } else { token(t as u32) };
            f(tok, lo - i, (i, lo));
            i = lo;
        }
    }

    /// [`Shard::key`] of infgram's layout: a padded table of token positions, tokens sorted by
    /// value.
    #[inline(always)]
    fn plain_key(&self, i: usize, d: usize) -> i64 {
        let p = self.read_padded(self.sa.as_ref(), i) + d;
        if p < self.n {
            self.tok(p) as i64
        } else {
            -1
        }
    }

    /// Document index of position `pos` of `T` (a separator belongs to the document it ends,
    /// or in infini-gram's layout to the one it starts).
    pub fn doc_of(&self, pos: usize) -> usize {
        let (mut lo, mut hi) = (0usize, self.n_docs);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if self.doc_boundary(mid) <= pos {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Where document `d`'s part of `T` begins (its first token, or in infini-gram's layout
    /// its leading separator); `len()` for `d ≥ num_docs()`.
    fn doc_boundary(&self, d: usize) -> usize {
        let b = self.docs.as_ref();
        // Damaged offsets (past the end, or a document past the last) read as the end, so a
        // damage no check caught cannot send a read out of bounds.
        let off = b
            .get(8 * d..8 * d + 8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")) as usize);
        match self.layout {
            Layout::Infgram => off.map_or(self.n, |o| o.min(self.n)),
            Layout::InfiniGram if d < self.n_docs => {
                off.map_or(self.n, |o| (o >> self.ptr_shift).min(self.n))
            }
            Layout::InfiniGram => self.n,
        }
    }

    /// Tokens of document `d` without its separator (`a ≤ b` even in a damaged index).
    pub fn doc_span(&self, d: usize) -> Range {
        let (a, b) = match self.layout {
            Layout::Infgram => {
                let a = self.doc_boundary(d);
                (a, self.doc_boundary(d + 1).saturating_sub(1))
            }
            Layout::InfiniGram => (
                (self.doc_boundary(d) + 1).min(self.n),
                self.doc_boundary(d + 1),
            ),
        };
        (a, b.max(a))
    }

    /// Metadata line of document `d`, if the shard stores metadata.
    pub fn doc_meta(&self, d: usize) -> Option<&str> {
        let (meta, offs) = self.meta.as_ref()?;
        let o = offs.as_ref();
        let a = u64::from_le_bytes(o.get(8 * d..8 * d + 8)?.try_into().ok()?) as usize;
        // infini-gram's `metaoff.N` has no entry after the last line.
        let b = o
            .get(8 * d + 8..8 * d + 16)
            .map_or(meta.as_ref().len(), |w| {
                u64::from_le_bytes(w.try_into().expect("8 bytes")) as usize
            });
        std::str::from_utf8(meta.as_ref().get(a..b)?)
            .ok()
            .map(|s| s.trim_end())
    }

    /// Tokens `T[a..b]`.
    pub fn slice(&self, a: usize, b: usize) -> Vec<u32> {
        (a..b).map(|i| self.tok(i)).collect()
    }

    /// Separator id of the shard.
    pub fn separator(&self) -> u32 {
        self.sep
    }
}

/// The pointer of `width` bytes at `o`, near the end of an unpadded table (zeros past it).
#[cold]
#[inline(never)]
fn read_unpadded(bytes: &[u8], o: usize, width: usize) -> u64 {
    let mut w = [0u8; 8];
    let end = (o + width).min(bytes.len());
    if o < end {
        w[..end - o].copy_from_slice(&bytes[o..end]);
    }
    u64::from_le_bytes(w)
}

/// One sampled key every this many suffixes.
pub const SAMPLE_STEP: usize = 256;

/// Number of sampled keys of a shard of `n` tokens.
pub fn sample_len(n: usize) -> usize {
    n.div_ceil(SAMPLE_STEP)
}

/// The first 8 bytes of tokens from `tokens[0..]` as a number whose order is the suffix order
/// (tokens big-endian, missing tokens as 0: a shorter suffix sorts first).
fn pack_key(tokens: impl Iterator<Item = u32>, width: usize, fill: u32) -> u64 {
    let per = 8 / width;
    let bits = 8 * width as u32;
    let mut key = 0u64;
    let mut it = tokens;
    for _ in 0..per {
        let t = it.next().unwrap_or(fill) as u64;
        key = if bits == 64 { t } else { (key << bits) | t };
    }
    key
}

/// The smallest and largest keys of suffixes starting with `q`.
fn query_keys(q: &[u32], width: usize) -> (u64, u64) {
    let max = if width >= 4 {
        u32::MAX
    } else {
        (1u32 << (8 * width)) - 1
    };
    (
        pack_key(q.iter().copied(), width, 0),
        pack_key(q.iter().copied(), width, max),
    )
}

/// `sample.bin` of a shard: the key of every [`SAMPLE_STEP`]-th suffix, u64 little-endian.
pub fn sample_keys(tokens: &[u8], width: usize, sa: &[u8], pw: usize) -> Vec<u8> {
    let n = tokens.len() / width;
    let tok = |i: usize| -> u32 {
        let mut b = [0u8; 4];
        b[..width].copy_from_slice(&tokens[width * i..width * i + width]);
        u32::from_le_bytes(b)
    };
    let mut out = Vec::with_capacity(sample_len(n) * 8);
    for i in (0..n).step_by(SAMPLE_STEP) {
        let mut p = [0u8; 8];
        p[..pw].copy_from_slice(&sa[i * pw..i * pw + pw]);
        let start = u64::from_le_bytes(p) as usize;
        let key = pack_key((start..n).map(tok), width, 0);
        out.extend_from_slice(&key.to_le_bytes());
    }
    out
}
