//! The KV cache and causal attention of the native llama pass.
//!
//! Keys are stored transposed, `[kv head][dimension][position]`, so the scores of a query
//! against a block of consecutive positions are one broadcast-FMA per dimension across the
//! block: no horizontal sums. Values stay row-major, `[position][kv head·dimension]`, for the
//! weighted sum. The (row, head) pairs that read the same kv head (the query heads of a group,
//! in every row of the pass) go through the cache together, a block of positions at a time
//! and two pairs per load, so a block of keys or values comes from memory once and then from
//! L1, where one pair at a time streamed a head's keys and values from L2 for every pair.
//! Every score and every output element is a fixed sequence of fused multiply-adds (over
//! dimensions, then over positions), the same whether a row is computed alone or in a k-token
//! pass, on any thread split and any ISA, which keeps the pass batch-invariant. The key lanes
//! run on to a multiple of the score block, so a partial block is scored as a whole one (its
//! extra scores dropped); on AVX-512, where at most half a block is left, it is scored as a
//! block half as wide; the softmax sums (chains of dependent adds, in position order) run four
//! side by side; threads take even stretches of (row, head) pairs.

pub use crate::neural::arch::Heads;
use crate::neural::native::kernels::Isa;
use crate::neural::native::pool::{stretches, DisjointOut, Pool};

/// Positions scored together at most: a block of accumulators that stays in registers (eight
/// AVX-512 registers per pair, two pairs at once: enough independent FMA chains to hide the
/// FMA latency). Narrower vectors score smaller blocks ([`attend_heads`]); the scores are the
/// same bits.
const SCORE_BLOCK: usize = 128;

/// Floats after each lane of the transposed keys (one cache line). Capacities double, so
/// without it the lanes of a block would lie a power of two apart, all in a few of L1's sets,
/// and evict each other while the pairs of a kv head read them (a third slower at 256
/// positions, where the capacity is 512).
const LANE_PAD: usize = 16;

/// Keys and values of the cached positions of one layer.
pub struct KvCache {
    kv_heads: usize,
    head_dim: usize,
    len: usize,
    /// Positions `keys_t` has room for.
    capacity: usize,
    /// `[kv head][dimension][stride]`, rotary embedding applied: positions `0..capacity` of
    /// each lane, then [`LANE_PAD`].
    keys_t: Vec<f32>,
    /// `[position][kv head·dimension]`.
    values: Vec<f32>,
}

impl KvCache {
    pub fn new(kv_heads: usize, head_dim: usize) -> Self {
        KvCache {
            kv_heads,
            head_dim,
            len: 0,
            capacity: 0,
            keys_t: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the keys and values of `rows` positions (each `rows × kv_heads·head_dim`).
    pub fn append(&mut self, keys: &[f32], values: &[f32]) {
        let kv_dim = self.kv_heads * self.head_dim;
        let rows = keys.len() / kv_dim;
        self.reserve(self.len + rows);
        let stride = self.stride();
        for (r, key) in keys.chunks_exact(kv_dim).enumerate() {
            for (c, &k) in key.iter().enumerate() {
                self.keys_t[c * stride + self.len + r] = k;
            }
        }
        self.values.truncate(self.len * kv_dim);
        self.values.extend_from_slice(values);
        self.len += rows;
    }

    /// Holds the first `len` positions of `other` (a cache of the same shape) instead of its
    /// own.
    pub fn copy_from(&mut self, other: &KvCache, len: usize) {
        let len = len.min(other.len);
        let lanes = self.kv_heads * self.head_dim;
        self.len = 0;
        self.reserve(len);
        let (stride, from) = (self.stride(), other.stride());
        for c in 0..lanes {
            self.keys_t[c * stride..c * stride + len]
                .copy_from_slice(&other.keys_t[c * from..c * from + len]);
        }
        self.values.clear();
        self.values.extend_from_slice(&other.values[..len * lanes]);
        self.len = len;
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Keeps the first `base` positions and then the positions `base + s` for `s` in `slots`
    /// (ascending), moved to follow them in that order: a tree pass's accepted path.
    pub fn keep_slots(&mut self, base: usize, slots: &[usize]) {
        let (stride, kv_dim) = (self.stride(), self.kv_heads * self.head_dim);
        for (i, &s) in slots.iter().enumerate() {
            let (from, to) = (base + s, base + i);
            assert!(s >= i && from < self.len, "slots ascend inside the cache");
            if from == to {
                continue;
            }
            for c in 0..kv_dim {
                self.keys_t[c * stride + to] = self.keys_t[c * stride + from];
            }
            self.values
                .copy_within(from * kv_dim..(from + 1) * kv_dim, to * kv_dim);
        }
        self.len = base + slots.len();
    }

    /// Positions' worth of bytes beyond `n` that the room [`KvCache::reserve_exact`] makes
    /// for `n` positions may hold: the keys' room rounded up to the score block, and their
    /// padding (half a position's bytes each: keys and values take a position's bytes
    /// together).
    pub const SLACK_TOKENS: usize = (SCORE_BLOCK + LANE_PAD).div_ceil(2);

    /// Makes room for `need` positions at once, exactly (rounded up to the score block): the
    /// cache then holds `need` positions without growing, and no more bytes than
    /// `(need + SLACK_TOKENS)` positions take.
    pub fn reserve_exact(&mut self, need: usize) {
        let lanes = self.kv_heads * self.head_dim;
        self.values
            .reserve_exact((need * lanes).saturating_sub(self.values.len()));
        self.regrow(need.next_multiple_of(SCORE_BLOCK));
    }

    /// Gives back the room beyond the cached positions: the cache then holds no more bytes
    /// than `(len + SLACK_TOKENS)` positions take (a prompt kept for a later request).
    pub fn fit(&mut self) {
        let lanes = self.kv_heads * self.head_dim;
        self.values.truncate(self.len * lanes);
        self.values.shrink_to_fit();
        let capacity = self.len.next_multiple_of(SCORE_BLOCK);
        if capacity < self.capacity {
            self.relayout(capacity);
        }
    }

    /// Bytes the cache holds (its room, not only its positions).
    pub fn bytes(&self) -> usize {
        (self.keys_t.capacity() + self.values.capacity()) * std::mem::size_of::<f32>()
    }

    /// Grows the transposed keys to hold `need` positions (doubling, to amortize the copy).
    fn reserve(&mut self, need: usize) {
        if need <= self.capacity {
            return;
        }
        // A multiple of the score block: a block that starts before `len` ends inside the
        // lanes, so the last, partial block is scored as a whole one ([`score`]).
        self.regrow(need.max(2 * self.capacity).next_multiple_of(SCORE_BLOCK));
    }

    /// Moves the transposed keys to lanes of `capacity` positions (a multiple of the score
    /// block), if that is more than they have.
    fn regrow(&mut self, capacity: usize) {
        if capacity > self.capacity {
            self.relayout(capacity);
        }
    }

    /// Moves the transposed keys to lanes of `capacity` positions (a multiple of the score
    /// block, at least `len`).
    fn relayout(&mut self, capacity: usize) {
        let (lanes, old_stride) = (self.kv_heads * self.head_dim, self.stride());
        let stride = capacity + LANE_PAD;
        let mut moved = vec![0.0f32; lanes * stride];
        for c in (0..lanes).filter(|_| self.len > 0) {
            let old = &self.keys_t[c * old_stride..c * old_stride + self.len];
            moved[c * stride..c * stride + self.len].copy_from_slice(old);
        }
        self.keys_t = moved;
        self.capacity = capacity;
    }

    /// Distance between the lanes of `keys_t`.
    fn stride(&self) -> usize {
        self.capacity + LANE_PAD
    }

    /// Dimension `d` of kv head `g` at positions `j0..j0 + N`, which may run past `len` (not
    /// past the capacity): positions there hold stale or zero keys, whose scores are dropped.
    #[inline(always)]
    fn key_block<const N: usize>(&self, g: usize, d: usize, j0: usize) -> &[f32; N] {
        let at = (g * self.head_dim + d) * self.stride() + j0;
        self.keys_t[at..at + N]
            .try_into()
            .expect("a block inside the lanes")
    }

    /// The value of kv head `g` at position `j`.
    #[inline(always)]
    fn value(&self, j: usize, g: usize) -> &[f32] {
        let at = j * self.kv_heads * self.head_dim + g * self.head_dim;
        &self.values[at..at + self.head_dim]
    }
}

/// The rows of a pass that verifies a token tree: which rows of the pass each row sees.
///
/// Row r sits in the cache at slot pos + r but stands at position pos + `depth[r]` of its
/// own branch, and sees the cached positions and the pass rows whose bits are set in
/// `visible[r]` (its ancestors and itself; at most 64 rows). Every other slot's score is −∞,
/// so its weight is exactly 0 and adds nothing to any sum: a row's output is the same bits as
/// a chain's of its branch, provided that each row's slot has the parity of its position
/// (the weighted values are summed over even and odd slots apart), which the caller arranges.
#[derive(Clone, Copy, Debug)]
pub struct TreeRows<'a> {
    pub depth: &'a [usize],
    pub visible: &'a [u64],
}

/// `out` = causal attention of the query rows `q` (row r at position pos + r) over `cache`,
/// which already holds their keys and values; with a `window`, a row sees only its last
/// `window` positions (itself included); with a `tree`, each row sees only the cached
/// positions and its branch ([`TreeRows`]). The (row, head) pairs are split across the
/// pool's threads.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    isa: Isa,
    pool: &mut Pool,
    cfg: &Heads,
    cache: &KvCache,
    q: &[f32],
    (pos, tree): (usize, Option<TreeRows>),
    window: Option<usize>,
    out: &mut [f32],
) {
    assert_eq!(out.len(), q.len(), "attend: an output for every query");
    let shared = DisjointOut::new(out);
    // The (row, head) pairs, numbered row by row, in one stretch per thread.
    let parts = stretches(q.len() / cfg.q_width() * cfg.n_head, 1, pool.threads());
    let at = Placement { pos, window, tree };
    pool.run(&|part| {
        if let Some(units) = parts.get(part) {
            attend_heads(isa, cfg, cache, q, at, units.clone(), shared);
        }
    });
}

/// Where the rows of a pass stand: after `pos` cached positions, in a chain or a tree, with
/// or without a sliding window.
#[derive(Clone, Copy)]
struct Placement<'a> {
    pos: usize,
    window: Option<usize>,
    tree: Option<TreeRows<'a>>,
}

impl Placement<'_> {
    /// Row `row`'s pair: the slots it runs to, where its window starts (by its position in
    /// its branch), and which pass rows it sees.
    fn pair(&self, row: usize, head: usize) -> Pair {
        let seen = self.pos + row + 1;
        let (at, mask) = match self.tree {
            Some(t) => (self.pos + t.depth[row] + 1, t.visible[row]),
            None => (seen, u64::MAX),
        };
        Pair {
            row,
            head,
            seen,
            first: self.window.map_or(0, |w| at.saturating_sub(w)),
            pass_start: self.pos,
            mask,
        }
    }
}

/// [`attend_portable`] compiled for the widest vectors the CPU has (the same operations in
/// the same order).
fn attend_heads(
    isa: Isa,
    cfg: &Heads,
    cache: &KvCache,
    q: &[f32],
    pos: Placement,
    units: std::ops::Range<usize>,
    out: DisjointOut,
) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `Isa::detect` saw these features before choosing the ISA.
        match isa {
            Isa::Avx512Vnni | Isa::Amx => {
                return unsafe { attend_avx512(cfg, cache, q, pos, units, out) }
            }
            Isa::Avx2 | Isa::AvxVnni => {
                return unsafe { attend_avx2(cfg, cache, q, pos, units, out) }
            }
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    // Baseline x86-64 has sixteen 4-lane registers: 2 × 16 scores or 2 × 2 × 8 value lanes.
    attend_portable::<16, 16, 8>(cfg, cache, q, pos, units, out)
}

/// Entry points compiled with wider vectors; each is [`attend_portable`] inlined.
/// `$block` positions are scored together (`$tail` where at most half a block is left) and
/// `$lanes` columns of a value summed together, for two pairs at once: as many accumulators as
/// half the registers (the other half hold broadcasts and loads).
macro_rules! attend_entry {
    ($name:ident, $features:literal, $block:literal, $tail:literal, $lanes:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            cfg: &Heads,
            cache: &KvCache,
            q: &[f32],
            pos: Placement,
            units: std::ops::Range<usize>,
            out: DisjointOut,
        ) {
            attend_portable::<$block, $tail, $lanes>(cfg, cache, q, pos, units, out)
        }
    };
}

// 32 registers of 16 lanes: 2 × 8 of scores, or 2 × 2 × 4 of value sums (two pairs at once);
// a last half block of 2 × 4 registers of scores: eight FMA chains still, where 2 × 2 (blocks
// of 32) left the FMAs waiting on each other and a one-row pass's attention 30% slower
// (`cargo bench --bench kernels -- attention`, a 2-vCPU Zen 5).
attend_entry!(attend_avx512, "avx512f,avx2,fma", 128, 64, 64);
// 16 registers of 8 lanes: 2 × 4 of scores, or 2 × 2 × 2 of value sums; no narrower last
// block (2 × 2 registers would leave the FMAs waiting on each other).
attend_entry!(attend_avx2, "avx2,fma", 32, 32, 16);

/// Attention for the (row, head) pairs `units` (numbered row by row: `r · n_head + h`),
/// written into their columns of `out`. Plain loops over fixed-size blocks, inlined into the
/// entry points above so they vectorize there. `SB` positions are scored at a time and `VC`
/// columns of the values summed at a time (`TB` positions at a time where at most half of `SB`
/// is left); none of them changes any score's or output's sequence of operations.
///
/// The pairs that read the same kv head (a group's query heads, of every row of this part)
/// are taken together, a block of positions at a time: a block of keys or values is read from
/// memory once and then from L1 by each of them, where one pair at a time streamed a head's
/// 64 KiB of keys and 64 KiB of values (at 256 positions) from L2 for every pair.
#[inline(always)]
fn attend_portable<const SB: usize, const TB: usize, const VC: usize>(
    cfg: &Heads,
    cache: &KvCache,
    q: &[f32],
    at: Placement,
    units: std::ops::Range<usize>,
    out: DisjointOut,
) {
    let (n_head, pos) = (cfg.n_head, at.pos);
    let group = n_head / cfg.n_kv_head;
    // Every row sees at most `width` positions; each pair's scores get a stretch that long.
    let width = pos + q.len() / cfg.q_width();
    // The scratch is taken out of its thread-local and put back after, so that the work runs
    // here, inlined into the entry point with its target features: in a closure passed to
    // `LocalKey::with` it was inlined or not as LLVM chose, and where it was not, every
    // `mul_add` became a call of `fmaf` (a completion of SmolLM2 three times slower).
    let (mut pairs, mut scores) = SCRATCH.with_borrow_mut(std::mem::take);
    for g in 0..cfg.n_kv_head {
        pairs.clear();
        pairs.extend(
            units
                .clone()
                .map(|u| (u / n_head, u % n_head))
                .filter(|&(_, h)| h / group == g)
                .map(|(row, head)| at.pair(row, head)),
        );
        if pairs.is_empty() {
            continue;
        }
        // Whole sets of `HEADS_TOGETHER` stretches, for the softmax sums.
        scores.clear();
        scores.resize(pairs.len().next_multiple_of(HEADS_TOGETHER) * width, 0.0);
        let head = KvHead {
            cfg,
            cache,
            g,
            q,
            pairs: &pairs,
            width,
        };
        score_pairs::<SB, TB>(&head, &mut scores);
        softmax_pairs(&pairs, &mut scores, width);
        weigh_pairs::<VC>(cfg, cache, g, &pairs, &scores, width, out);
    }
    SCRATCH.set((pairs, scores));
}

thread_local! {
    /// Each thread's pairs of a kv head and their stretches of scores, kept from call to call
    /// (allocating them per call and layer was a visible share of a pass in `malloc`).
    static SCRATCH: std::cell::RefCell<(Vec<Pair>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// A (row, head) pair of the pass and the positions its row sees: `first..seen`.
#[derive(Clone, Copy)]
struct Pair {
    row: usize,
    head: usize,
    seen: usize,
    /// Positions before this one are outside a sliding window: their scores are set to −∞,
    /// so their weights are exactly 0 and the sums are those of the window alone.
    first: usize,
    /// The slot of the pass's first row.
    pass_start: usize,
    /// Bit r: the row sees the pass's row r (all bits: a chain; [`TreeRows`]). Rows it does not
    /// see get −∞ scores, as positions outside a window do.
    mask: u64,
}

/// Positions whose values are summed together for all the pairs of a kv head before the next
/// block (64 positions of a 64-dimension head: 16 KiB, which stays in L1). Even, so that a
/// block starts on an even position.
const VALUE_BLOCK: usize = 64;

/// The scores of every pair of kv head `g` into its stretch of `scores` (stretch `i` at
/// `i · width`): `s[j] = scale · Σ_d q[d]·key_j[d]` for `j < seen`, by blocks of `SB`
/// positions (a divisor of [`SCORE_BLOCK`]), and where at most half of one is left, by blocks
/// of `TB` (a divisor of `SB`); each score summed over d in order, whatever its block. A
/// partial block is scored as a whole one (the lanes run on to a multiple of `SCORE_BLOCK`)
/// and its extra scores dropped: the same operations for the positions kept. (At 272
/// positions, AVX-512's last block of 128 scored 16 positions; a block of 64 scores them now.)
#[inline(always)]
fn score_pairs<const SB: usize, const TB: usize>(head: &KvHead, scores: &mut [f32]) {
    let most = head.pairs.iter().map(|p| p.seen).max().unwrap_or(0);
    let mut j0 = 0;
    while j0 < most {
        if most - j0 > SB / 2 {
            score_block::<SB>(head, scores, j0);
            j0 += SB;
        } else {
            score_block::<TB>(head, scores, j0);
            j0 += TB;
        }
    }
}

/// What the scores of one kv head's pairs read: the queries `q` of the pass, the pairs of kv
/// head `g`, and the width of each pair's stretch of scores.
struct KvHead<'a> {
    cfg: &'a Heads,
    cache: &'a KvCache,
    g: usize,
    q: &'a [f32],
    pairs: &'a [Pair],
    width: usize,
}

/// The scores of the block of `N` positions from `j0` (a multiple of `N`), for every pair
/// whose row sees it: blocks are the outer loop, so that a block of keys is read from L1 by
/// every pair after the first, and two pairs at a time share each load.
#[inline(always)]
fn score_block<const N: usize>(head: &KvHead, scores: &mut [f32], j0: usize) {
    let KvHead {
        cfg,
        cache,
        g,
        q,
        pairs,
        width,
    } = *head;
    let hd = cfg.head_dim;
    let scale = 1.0 / (hd as f32).sqrt();
    let query = |pair: &Pair| &q[pair.row * cfg.q_width() + pair.head * hd..][..hd];
    let live: Vec<usize> = (0..pairs.len()).filter(|&i| pairs[i].seen > j0).collect();
    let mut twos = live.chunks_exact(2);
    for two in twos.by_ref() {
        let (qa, qb) = (query(&pairs[two[0]]), query(&pairs[two[1]]));
        let (mut a, mut b) = ([0.0f32; N], [0.0f32; N]);
        for d in 0..hd {
            let lane = cache.key_block::<N>(g, d, j0);
            let (x, y) = (qa[d], qb[d]);
            for i in 0..N {
                a[i] = x.mul_add(lane[i], a[i]);
                b[i] = y.mul_add(lane[i], b[i]);
            }
        }
        for (&i, acc) in two.iter().zip([a, b]) {
            keep_scores(&mut scores[i * width..], j0, pairs[i].seen, &acc, scale);
        }
    }
    for &i in twos.remainder() {
        let qa = query(&pairs[i]);
        let mut a = [0.0f32; N];
        for (d, &x) in qa.iter().enumerate() {
            let lane = cache.key_block::<N>(g, d, j0);
            for i in 0..N {
                a[i] = x.mul_add(lane[i], a[i]);
            }
        }
        keep_scores(&mut scores[i * width..], j0, pairs[i].seen, &a, scale);
    }
}

/// Writes the scores of a block of positions from `j0` that a row seeing `seen` keeps.
#[inline(always)]
fn keep_scores(stretch: &mut [f32], j0: usize, seen: usize, acc: &[f32], scale: f32) {
    let kept = (seen - j0).min(acc.len());
    for (x, a) in stretch[j0..j0 + kept].iter_mut().zip(acc) {
        *x = a * scale;
    }
}

/// Turns each pair's stretch of scores into its softmax: `e^(s − max)` over the sum. The sums
/// of [`HEADS_TOGETHER`] pairs (each a chain of dependent adds in position order, for the same
/// bits in any pass) run side by side.
#[inline(always)]
fn softmax_pairs(pairs: &[Pair], scores: &mut [f32], width: usize) {
    for (i, pair) in pairs.iter().enumerate() {
        let stretch = &mut scores[i * width..][..pair.seen];
        stretch[..pair.first].fill(f32::NEG_INFINITY);
        if pair.mask != u64::MAX {
            for (r, s) in stretch[pair.pass_start..].iter_mut().enumerate() {
                if pair.mask >> r & 1 == 0 {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
        exp_minus_max(stretch);
    }
    for (set, together) in pairs.chunks(HEADS_TOGETHER).enumerate() {
        let stretches = &mut scores[set * HEADS_TOGETHER * width..][..HEADS_TOGETHER * width];
        let sums = sum_stretches(stretches, width, together);
        for ((s, pair), sum) in stretches.chunks_exact_mut(width).zip(together).zip(sums) {
            let inv = 1.0 / sum;
            for v in s[..pair.seen].iter_mut() {
                *v *= inv;
            }
        }
    }
}

/// Pairs whose softmax sums run side by side: each sum is a chain of dependent adds (in
/// position order, for the same bits in any pass), so four chains keep the adder busy.
const HEADS_TOGETHER: usize = 4;

/// The sum of the first `seen` values of each of the [`HEADS_TOGETHER`] stretches of
/// `scores` (one per pair of `pairs`; the sums of absent pairs are to be ignored), each added
/// in position order: side by side as far as all of them reach, then each on its own.
#[inline(always)]
fn sum_stretches(scores: &[f32], width: usize, pairs: &[Pair]) -> [f32; HEADS_TOGETHER] {
    let mut sums = [0.0f32; HEADS_TOGETHER];
    let common = pairs.iter().map(|p| p.seen).min().unwrap_or(0);
    for j in 0..common {
        for (c, sum) in sums.iter_mut().enumerate() {
            *sum += scores[c * width + j];
        }
    }
    for (c, pair) in pairs.iter().enumerate() {
        for &v in &scores[c * width + common..c * width + pair.seen] {
            sums[c] += v;
        }
    }
    sums
}

/// `Σ_j p[j]·value_j` of kv head `g` for every pair (`p` its softmax, stretch `i` of
/// `scores`) into its columns of `out`: even and odd positions summed apart, each in order
/// (two independent FMA chains per column), then added. Blocks of [`VALUE_BLOCK`] positions are
/// the outer loop, so that a block of values is read from L1 by every pair after the first;
/// each pair's sums wait in memory between blocks, which changes no operation.
#[inline(always)]
fn weigh_pairs<const VC: usize>(
    cfg: &Heads,
    cache: &KvCache,
    g: usize,
    pairs: &[Pair],
    scores: &[f32],
    width: usize,
    out: DisjointOut,
) {
    let hd = cfg.head_dim;
    let mut even = vec![0.0f32; pairs.len() * hd];
    let mut odd = vec![0.0f32; pairs.len() * hd];
    let most = pairs.iter().map(|p| p.seen).max().unwrap_or(0);
    for j0 in (0..most).step_by(VALUE_BLOCK) {
        // The block's weights of pair i (shorter in its row's last block).
        let weights =
            |i: usize| &scores[i * width + j0..i * width + pairs[i].seen.min(j0 + VALUE_BLOCK)];
        let live: Vec<usize> = (0..pairs.len()).filter(|&i| pairs[i].seen > j0).collect();
        // Two pairs at a time share each load of the values over the positions both see,
        // then each goes on alone (from an even offset: the same even and odd positions).
        for two in live.chunks(2) {
            let mut done = [0, 0];
            if let ([a, b], 64 | 128) = (two, hd) {
                let (pa, pb) = (weights(*a), weights(*b));
                let both = pa.len().min(pb.len()) & !1;
                let (ea, eb) = two_mut(&mut even, *a * hd, *b * hd, hd);
                let (oa, ob) = two_mut(&mut odd, *a * hd, *b * hd, hd);
                let (wa, wb) = (&pa[..both], &pb[..both]);
                match hd {
                    64 => weigh_two::<64, VC>(cache, g, j0, [wa, wb], [ea, oa, eb, ob]),
                    _ => weigh_two::<128, VC>(cache, g, j0, [wa, wb], [ea, oa, eb, ob]),
                }
                done = [both, both];
            }
            for (&i, from) in two.iter().zip(done) {
                let p = &weights(i)[from..];
                let (e, o) = (&mut even[i * hd..][..hd], &mut odd[i * hd..][..hd]);
                let at = j0 + from;
                match hd {
                    64 => weigh_block::<64, VC>(cache, g, at, p, e, o),
                    128 => weigh_block::<128, VC>(cache, g, at, p, e, o),
                    _ => weigh_block_any(cache, g, at, p, e, o),
                }
            }
        }
    }
    let mut acc = vec![0.0f32; hd];
    for (i, pair) in pairs.iter().enumerate() {
        for ((a, e), o) in acc.iter_mut().zip(&even[i * hd..]).zip(&odd[i * hd..]) {
            *a = e + o;
        }
        // SAFETY: only this part computes the pair's head of its row.
        unsafe { out.write_slice(pair.row * cfg.q_width() + pair.head * hd, &acc) };
    }
}

/// Adds `p[t]·value_{j0+t}` of kv head `g` to the even (`j0 + t` even) or odd sums, in position
/// order (`j0` is even). The columns are summed `VC` at a time (a divisor of the head
/// dimension `HD`), so that the sums stay in registers; each column's operations are the same
/// for any `VC`.
#[inline(always)]
fn weigh_block<const HD: usize, const VC: usize>(
    cache: &KvCache,
    g: usize,
    j0: usize,
    p: &[f32],
    even_sums: &mut [f32],
    odd_sums: &mut [f32],
) {
    let (kv_dim, values) = value_rows(cache, j0, p.len());
    for c0 in (0..HD).step_by(VC) {
        let (mut even, mut odd) = (columns::<VC>(even_sums, c0), columns::<VC>(odd_sums, c0));
        let lane = |row: &[f32]| columns::<VC>(row, g * HD + c0);
        let mut pairs = values.chunks_exact(2 * kv_dim);
        for (pair, two) in p.chunks_exact(2).zip(pairs.by_ref()) {
            let (v0, v1) = (lane(two), lane(&two[kv_dim..]));
            for i in 0..VC {
                even[i] = pair[0].mul_add(v0[i], even[i]);
                odd[i] = pair[1].mul_add(v1[i], odd[i]);
            }
        }
        if p.len() % 2 == 1 {
            let (last, v) = (p[p.len() - 1], lane(pairs.remainder()));
            for i in 0..VC {
                even[i] = last.mul_add(v[i], even[i]);
            }
        }
        even_sums[c0..c0 + VC].copy_from_slice(&even);
        odd_sums[c0..c0 + VC].copy_from_slice(&odd);
    }
}

/// The row width of the cached values and their rows for positions `j0..j0 + n`.
#[inline(always)]
fn value_rows(cache: &KvCache, j0: usize, n: usize) -> (usize, &[f32]) {
    let kv_dim = cache.kv_heads * cache.head_dim;
    (kv_dim, &cache.values[j0 * kv_dim..(j0 + n) * kv_dim])
}

/// `VC` columns of `row` from `c0`, by value (so that they can sit in registers).
#[inline(always)]
fn columns<const VC: usize>(row: &[f32], c0: usize) -> [f32; VC] {
    row[c0..c0 + VC]
        .try_into()
        .expect("VC columns inside the row")
}

/// The stretches `[a, a + len)` and `[b, b + len)` of `x` (`a < b`, not overlapping).
fn two_mut(x: &mut [f32], a: usize, b: usize, len: usize) -> (&mut [f32], &mut [f32]) {
    let (low, high) = x.split_at_mut(b);
    (&mut low[a..a + len], &mut high[..len])
}

/// [`weigh_block`] for two pairs over the same even number of positions from `j0`: each load
/// of a value feeds both (`sums`: the first pair's even and odd sums, then the second's).
#[inline(always)]
fn weigh_two<const HD: usize, const VC: usize>(
    cache: &KvCache,
    g: usize,
    j0: usize,
    [pa, pb]: [&[f32]; 2],
    sums: [&mut [f32]; 4],
) {
    let (kv_dim, values) = value_rows(cache, j0, pa.len());
    let [ea_sums, oa_sums, eb_sums, ob_sums] = sums;
    for c0 in (0..HD).step_by(VC) {
        let (mut ea, mut oa) = (columns::<VC>(ea_sums, c0), columns::<VC>(oa_sums, c0));
        let (mut eb, mut ob) = (columns::<VC>(eb_sums, c0), columns::<VC>(ob_sums, c0));
        let lane = |row: &[f32]| columns::<VC>(row, g * HD + c0);
        for ((x, y), two) in pa
            .chunks_exact(2)
            .zip(pb.chunks_exact(2))
            .zip(values.chunks_exact(2 * kv_dim))
        {
            let (v0, v1) = (lane(two), lane(&two[kv_dim..]));
            for i in 0..VC {
                ea[i] = x[0].mul_add(v0[i], ea[i]);
                oa[i] = x[1].mul_add(v1[i], oa[i]);
                eb[i] = y[0].mul_add(v0[i], eb[i]);
                ob[i] = y[1].mul_add(v1[i], ob[i]);
            }
        }
        ea_sums[c0..c0 + VC].copy_from_slice(&ea);
        oa_sums[c0..c0 + VC].copy_from_slice(&oa);
        eb_sums[c0..c0 + VC].copy_from_slice(&eb);
        ob_sums[c0..c0 + VC].copy_from_slice(&ob);
    }
}

/// [`weigh_block`] for other head dimensions (the same operations, in memory).
fn weigh_block_any(
    cache: &KvCache,
    g: usize,
    j0: usize,
    p: &[f32],
    even_sums: &mut [f32],
    odd_sums: &mut [f32],
) {
    for (t, &pj) in p.iter().enumerate() {
        let sums = if t % 2 == 0 {
            &mut *even_sums
        } else {
            &mut *odd_sums
        };
        for (a, &v) in sums.iter_mut().zip(cache.value(j0 + t, g)) {
            *a = pj.mul_add(v, *a);
        }
    }
}

/// `x[j] = e^(x[j] − max x)`: the numerators of a softmax. The maximum is taken in eight
/// lanes by compare-and-select (exact in any order; `f32::max`'s NaN rule keeps it scalar),
/// and no NaN reaches here.
#[inline(always)]
fn exp_minus_max(x: &mut [f32]) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in chunks.by_ref() {
        for i in 0..8 {
            lanes[i] = if chunk[i] > lanes[i] {
                chunk[i]
            } else {
                lanes[i]
            };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        max = if v > max { v } else { max };
    }
    for v in x.iter_mut() {
        *v = exp_nonpositive(*v - max);
    }
}

/// `e^x` for `x ≤ 0` (softmax after subtracting the maximum) in plain arithmetic that
/// vectorizes, where `f32::exp` is a libm call per value: `x = n·ln 2 + r` with |r| ≤ ln 2 / 2,
/// Cephes' degree-6 polynomial for `e^r` (within 2 ulp), and `2^n` built in the exponent bits.
/// Below −87 the result is 0 (as far as a softmax weight can tell).
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding and subtracting it rounds to an integer
                                     // Selects rather than an early return, so that a loop over values vectorizes.
    let underflow = x < -87.0;
    let x = if underflow { -87.0 } else { x };
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_2e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e_r = p.mul_add(r * r, r + 1.0);
    // n sits in the low bits of `shifted` (its unit is 1): 2^n without a float-to-int cast.
    let biased = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    let e = e_r * f32::from_bits(biased << 23);
    if underflow {
        0.0
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neural::native::kernels::tests::pseudo;

    /// A cache given room for n positions holds them without growing, within
    /// `(n + SLACK_TOKENS)` positions' bytes; past them it grows as before, keeping what it
    /// held.
    #[test]
    fn a_reserved_cache_holds_its_positions_without_growing() {
        let (heads, hd) = (2, 64);
        let position_bytes = 2 * heads * hd * std::mem::size_of::<f32>();
        for n in [1, 127, 128, 300, 1000] {
            let mut cache = KvCache::new(heads, hd);
            cache.reserve_exact(n);
            let room = cache.bytes();
            assert!(
                room <= (n + KvCache::SLACK_TOKENS) * position_bytes,
                "{n}: {room}"
            );
            let rows = pseudo(n * heads * hd, n as u32);
            for row in rows.chunks(heads * hd) {
                cache.append(row, row);
                assert_eq!(
                    cache.bytes(),
                    room,
                    "{n} positions reserved, {}",
                    cache.len()
                );
            }
            cache.append(&rows[..heads * hd], &rows[..heads * hd]);
            assert!(cache.bytes() > room);
            assert_eq!(cache.len(), n + 1);
            assert_eq!(
                cache.value(n - 1, 1),
                &rows[(n - 1) * heads * hd + hd..][..hd]
            );
            assert_eq!(
                cache.key_block::<1>(1, 3, n - 1)[0],
                rows[(n - 1) * heads * hd + hd + 3]
            );
        }
    }

    /// A cache cut back and fitted keeps its first positions' keys and values and holds no
    /// more than `(len + SLACK_TOKENS)` positions' bytes; it grows again from there.
    #[test]
    fn a_fitted_cache_keeps_its_positions_in_its_own_room() {
        let (heads, hd) = (2, 64);
        let (width, position_bytes) = (heads * hd, 2 * heads * hd * std::mem::size_of::<f32>());
        for (n, kept) in [(300, 0), (300, 1), (300, 129), (1000, 256), (5, 5)] {
            let mut cache = KvCache::new(heads, hd);
            let rows = pseudo(n * width, n as u32 + 7);
            cache.append(&rows, &rows);
            cache.truncate(kept);
            cache.fit();
            assert!(
                cache.bytes() <= (kept + KvCache::SLACK_TOKENS) * position_bytes,
                "{n} cut to {kept}: {} bytes",
                cache.bytes()
            );
            cache.append(&rows[..width], &rows[..width]);
            assert_eq!(cache.len(), kept + 1);
            for j in 0..kept {
                assert_eq!(
                    cache.value(j, 1),
                    &rows[j * width + hd..][..hd],
                    "{n}/{kept}"
                );
                assert_eq!(cache.key_block::<1>(1, 3, j)[0], rows[j * width + hd + 3]);
            }
            assert_eq!(cache.value(kept, 0), &rows[..hd]);
            assert_eq!(cache.key_block::<1>(0, 5, kept)[0], rows[5]);
        }
    }

    /// Causal attention in f64, one query row and head at a time.
    fn naive(
        cfg: &Heads,
        keys: &[f32],
        values: &[f32],
        q: &[f32],
        (pos, window): (usize, Option<usize>),
    ) -> Vec<f64> {
        let (dim, hd, kv_dim) = (cfg.q_width(), cfg.head_dim, cfg.n_kv_head * cfg.head_dim);
        let mut out = vec![0.0; q.len()];
        for r in 0..q.len() / dim {
            for h in 0..cfg.n_head {
                let g = h / (cfg.n_head / cfg.n_kv_head);
                let qh = &q[r * dim + h * hd..][..hd];
                let first = window.map_or(0, |w| (pos + r + 1).saturating_sub(w));
                let s: Vec<(usize, f64)> = (first..=pos + r)
                    .map(|j| {
                        let k = &keys[j * kv_dim + g * hd..][..hd];
                        let dot: f64 = qh.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                        (j, dot / (hd as f64).sqrt())
                    })
                    .collect();
                let max = s.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = s.iter().map(|(_, x)| (x - max).exp()).sum();
                for &(j, ref x) in &s {
                    let p = (x - max).exp() / total;
                    for i in 0..hd {
                        out[r * dim + h * hd + i] += p * values[j * kv_dim + g * hd + i] as f64;
                    }
                }
            }
        }
        out
    }

    /// Every ISA and thread split gives the scalar bits, at cache lengths inside, at and just
    /// past the score and value blocks (the partial last block is scored as a whole one), after
    /// the cache grew and was cut back, for head dimensions with and without a kernel of their
    /// own; each row gives the same bits alone as in the pass (batch invariance); and the result
    /// is causal attention, over all positions or a sliding window of them.
    #[test]
    fn attention_is_the_same_bits_on_every_isa_split_and_pass_and_matches_the_definition() {
        for (hd, window) in [
            (64, None),
            (128, None),
            (32, None),
            (64, Some(5)),
            (32, Some(64)),
        ] {
            let cfg = Heads {
                n_head: 6,
                n_kv_head: 2,
                head_dim: hd,
            };
            let kv_dim = 2 * hd;
            for (pos, rows) in [
                (0, 1),
                (5, 3),
                (63, 1),
                (64, 2),
                (127, 5),
                (128, 1),
                (200, 9),
                (150, 20),
                (0, 70),
            ] {
                let n = pos + rows;
                let (keys, values) = (pseudo(n * kv_dim, 1 + n as u32), pseudo(n * kv_dim, 2));
                let q = pseudo(rows * cfg.q_width(), 3 + pos as u32);
                let mut cache = KvCache::new(2, hd);
                // Stale keys past the end: fill beyond n, then cut back and append the real ones.
                cache.append(&pseudo((n + 40) * kv_dim, 9), &pseudo((n + 40) * kv_dim, 9));
                cache.truncate(0);
                cache.append(&keys, &values);
                let want = attended(Isa::Scalar, 1, &cfg, &cache, &q, (pos, window));
                let exact = naive(&cfg, &keys, &values, &q, (pos, window));
                for (w, e) in want.iter().zip(&exact) {
                    assert!(
                        (*w as f64 - e).abs() < 1e-4,
                        "hd {hd}, pos {pos}: {w} vs {e}"
                    );
                }
                for isa in Isa::available() {
                    for threads in [1, 2, 3] {
                        let got = attended(isa, threads, &cfg, &cache, &q, (pos, window));
                        let at = format!("{isa:?}, {threads} threads, hd {hd}, pos {pos}");
                        assert_eq!(got, want, "{at}, {rows} rows");
                    }
                    for (r, (row, want)) in q
                        .chunks(cfg.q_width())
                        .zip(want.chunks(cfg.q_width()))
                        .enumerate()
                    {
                        let alone = attended(isa, 1, &cfg, &cache, row, (pos + r, window));
                        assert_eq!(alone, want, "{isa:?}, hd {hd}, row {r} of {rows} alone");
                    }
                }
            }
        }
    }

    /// [`attend`] into a new vector, on a pool of `threads`.
    fn attended(
        isa: Isa,
        threads: usize,
        cfg: &Heads,
        cache: &KvCache,
        q: &[f32],
        (pos, window): (usize, Option<usize>),
    ) -> Vec<f32> {
        let mut out = vec![0.0; q.len()];
        let mut pool = Pool::new(threads);
        attend(isa, &mut pool, cfg, cache, q, (pos, None), window, &mut out);
        out
    }

    #[test]
    fn exp_matches_libm_within_a_few_ulp() {
        let mut worst = 0.0f32;
        for i in 0..=87_000 {
            let x = -(i as f32) / 1000.0;
            let (got, want) = (exp_nonpositive(x), x.exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 4.0 * f32::EPSILON, "relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }
}
