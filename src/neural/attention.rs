//! The KV cache and causal attention of the native llama pass.
//!
//! Keys are stored transposed, `[kv head][dimension][position]`, so the scores of a query
//! against a block of consecutive positions are one broadcast-FMA per dimension across the
//! block: no horizontal sums, and each cached key is read once per query head. Values stay
//! row-major, `[position][kv head·dimension]`, for the weighted sum. Every score and every
//! output element is a fixed sequence of fused multiply-adds (over dimensions, then over
//! positions), the same whether a row is computed alone or in a k-token pass and on any
//! thread split, which keeps the pass batch-invariant. The key lanes run on to a multiple of
//! the score block, so the last, partial block is scored as a whole one; the softmax sums of a
//! row's heads (chains of dependent adds, in position order) run four side by side; threads
//! take even stretches of (row, head) pairs.

use super::gguf::LlamaConfig;
use super::kernels::Isa;
use super::pool::{stretches, DisjointOut, Pool};

/// Positions scored together at most: a block of accumulators that stays in registers (eight
/// AVX-512 registers, enough independent FMA chains to hide the FMA latency). Narrower vectors
/// score smaller blocks ([`attend_heads`]); the scores are the same bits.
const SCORE_BLOCK: usize = 128;

/// Keys and values of the cached positions of one layer.
pub struct KvCache {
    kv_heads: usize,
    head_dim: usize,
    len: usize,
    /// Positions `keys_t` has room for.
    capacity: usize,
    /// `[kv head][dimension][capacity]`, rotary embedding applied.
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
        for (r, key) in keys.chunks_exact(kv_dim).enumerate() {
            for (c, &k) in key.iter().enumerate() {
                self.keys_t[c * self.capacity + self.len + r] = k;
            }
        }
        self.values.truncate(self.len * kv_dim);
        self.values.extend_from_slice(values);
        self.len += rows;
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Grows the transposed keys to hold `need` positions (doubling, to amortize the copy).
    fn reserve(&mut self, need: usize) {
        if need <= self.capacity {
            return;
        }
        // A multiple of the score block: a block that starts before `len` ends inside the
        // lanes, so the last, partial block is scored as a whole one ([`score`]).
        let capacity = need.max(2 * self.capacity).next_multiple_of(SCORE_BLOCK);
        let lanes = self.kv_heads * self.head_dim;
        let mut grown = vec![0.0f32; lanes * capacity];
        for c in 0..lanes {
            let old = &self.keys_t[c * self.capacity..c * self.capacity + self.len];
            grown[c * capacity..c * capacity + self.len].copy_from_slice(old);
        }
        self.keys_t = grown;
        self.capacity = capacity;
    }

    /// Dimension `d` of kv head `g` at positions `j0..j0 + N`, which may run past `len` (not
    /// past the capacity): positions there hold stale or zero keys, whose scores are dropped.
    #[inline(always)]
    fn key_block<const N: usize>(&self, g: usize, d: usize, j0: usize) -> &[f32; N] {
        let at = (g * self.head_dim + d) * self.capacity + j0;
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

/// Causal attention of the query rows `q` (row r at position pos + r) over `cache`, which
/// already holds their keys and values. The (row, head) pairs are split across the pool's
/// threads.
pub fn attend(
    isa: Isa,
    pool: &mut Pool,
    cfg: &LlamaConfig,
    cache: &KvCache,
    q: &[f32],
    pos: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; q.len()];
    let shared = DisjointOut::new(&mut out);
    // The (row, head) pairs, numbered row by row, in one stretch per thread.
    let parts = stretches(q.len() / cfg.dim * cfg.n_head, 1, pool.threads());
    pool.run(&|part| {
        if let Some(units) = parts.get(part) {
            attend_heads(isa, cfg, cache, q, pos, units.clone(), shared);
        }
    });
    out
}

/// [`attend_portable`] compiled for the widest vectors the CPU has (the same operations in
/// the same order).
fn attend_heads(
    isa: Isa,
    cfg: &LlamaConfig,
    cache: &KvCache,
    q: &[f32],
    pos: usize,
    units: std::ops::Range<usize>,
    out: DisjointOut,
) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `Isa::detect` saw these features before choosing the ISA.
        match isa {
            Isa::Avx512Vnni => return unsafe { attend_avx512(cfg, cache, q, pos, units, out) },
            Isa::Avx2 | Isa::AvxVnni => {
                return unsafe { attend_avx2(cfg, cache, q, pos, units, out) }
            }
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    // Baseline x86-64 has sixteen 4-lane registers: 32 scores and 2 × 16 value lanes.
    attend_portable::<32, 16>(cfg, cache, q, pos, units, out)
}

/// Entry points compiled with wider vectors; each is [`attend_portable`] inlined.
/// `$block` positions are scored together and `$lanes` columns of a value summed together:
/// as many accumulators as half the registers (the other half hold broadcasts and loads).
macro_rules! attend_entry {
    ($name:ident, $features:literal, $block:literal, $lanes:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            cfg: &LlamaConfig,
            cache: &KvCache,
            q: &[f32],
            pos: usize,
            units: std::ops::Range<usize>,
            out: DisjointOut,
        ) {
            attend_portable::<$block, $lanes>(cfg, cache, q, pos, units, out)
        }
    };
}

// 32 registers of 16 lanes: 8 of scores, 2 × 4 of value sums.
attend_entry!(attend_avx512, "avx512f,avx2,fma", 128, 64);
// 16 registers of 8 lanes: 8 of scores, 2 × 4 of value sums.
attend_entry!(attend_avx2, "avx2,fma", 64, 32);

/// Attention for the (row, head) pairs `units` (numbered row by row: `r · n_head + h`),
/// written into their columns of `out`. Plain loops
/// over fixed-size blocks, inlined into the entry points above so they vectorize there. `SB`
/// positions are scored at a time and `VC` columns of the values summed at a time; neither
/// changes any score's or output's sequence of operations.
#[inline(always)]
fn attend_portable<const SB: usize, const VC: usize>(
    cfg: &LlamaConfig,
    cache: &KvCache,
    q: &[f32],
    pos: usize,
    units: std::ops::Range<usize>,
    out: DisjointOut,
) {
    let (dim, hd) = (cfg.dim, cfg.head_dim);
    let group = cfg.n_head / cfg.n_kv_head;
    let scale = 1.0 / (hd as f32).sqrt();
    let rows = q.len() / dim;
    // The scores of up to `HEADS_TOGETHER` heads of a row, one stretch of `width` each.
    let width = pos + rows;
    let mut scores = vec![0.0f32; HEADS_TOGETHER * width];
    let mut acc = vec![0.0f32; hd];
    let n_head = cfg.n_head;
    for r in units.start / n_head..units.end.div_ceil(n_head) {
        let seen = pos + r + 1;
        // This part's heads of row r.
        let (mut h0, end) = (
            units.start.max(r * n_head) - r * n_head,
            units.end.min((r + 1) * n_head) - r * n_head,
        );
        while h0 < end {
            let n = (end - h0).min(HEADS_TOGETHER);
            for (c, s) in scores.chunks_exact_mut(width).take(n).enumerate() {
                let h = h0 + c;
                let qh = &q[r * dim + h * hd..r * dim + (h + 1) * hd];
                let s = &mut s[..seen];
                score::<SB>(cache, h / group, qh, scale, s);
                exp_minus_max(s);
            }
            let sums = sum_stretches(&scores, width, seen);
            for (c, s) in scores.chunks_exact_mut(width).take(n).enumerate() {
                let (h, s) = (h0 + c, &mut s[..seen]);
                let inv = 1.0 / sums[c];
                for v in s.iter_mut() {
                    *v *= inv;
                }
                match hd {
                    64 => weigh_values::<64, VC>(cache, h / group, s, &mut acc),
                    128 => weigh_values::<128, VC>(cache, h / group, s, &mut acc),
                    _ => weigh_values_any(cache, h / group, s, &mut acc),
                }
                // SAFETY: only this part computes head h.
                unsafe { out.write_slice(r * dim + h * hd, &acc) };
            }
            h0 += n;
        }
    }
}

/// Heads of a row whose softmax sums run side by side: each sum is a chain of dependent adds
/// (in position order, for the same bits in any pass), so four chains keep the adder busy.
const HEADS_TOGETHER: usize = 4;

/// The sums of the first `seen` values of each of the [`HEADS_TOGETHER`] stretches of
/// `scores`, each added in position order (stretches of absent heads give sums to ignore).
#[inline(always)]
fn sum_stretches(scores: &[f32], width: usize, seen: usize) -> [f32; HEADS_TOGETHER] {
    let mut sums = [0.0f32; HEADS_TOGETHER];
    for j in 0..seen {
        for (c, sum) in sums.iter_mut().enumerate() {
            *sum += scores[c * width + j];
        }
    }
    sums
}

/// `acc = Σ_j p[j]·value_j` of kv head `g`: even and odd positions summed apart, each in
/// order (two independent FMA chains), then added. The columns are summed `VC` at a time (a
/// divisor of the head dimension `HD`), so that the accumulators stay in registers; each
/// column's operations are the same for any `VC`.
#[inline(always)]
fn weigh_values<const HD: usize, const VC: usize>(
    cache: &KvCache,
    g: usize,
    p: &[f32],
    acc: &mut [f32],
) {
    let kv_dim = cache.kv_heads * cache.head_dim;
    let values = &cache.values[..p.len() * kv_dim];
    for c0 in (0..HD).step_by(VC) {
        let (mut even, mut odd) = ([0.0f32; VC], [0.0f32; VC]);
        let at = g * HD + c0;
        let lane = |row: &[f32]| -> [f32; VC] { row[at..at + VC].try_into().expect("columns") };
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
        for (i, a) in acc[c0..c0 + VC].iter_mut().enumerate() {
            *a = even[i] + odd[i];
        }
    }
}

/// [`weigh_values`] for other head dimensions (the same operations, in memory).
fn weigh_values_any(cache: &KvCache, g: usize, p: &[f32], acc: &mut [f32]) {
    let mut sum = vec![vec![0.0f32; acc.len()]; 2];
    for (j, &pj) in p.iter().enumerate() {
        for (a, &v) in sum[j & 1].iter_mut().zip(cache.value(j, g)) {
            *a = pj.mul_add(v, *a);
        }
    }
    for (i, a) in acc.iter_mut().enumerate() {
        *a = sum[0][i] + sum[1][i];
    }
}

/// `s[j] = scale · Σ_d q[d]·key_j[d]` for the positions `j < s.len()`, by blocks of `SB`
/// positions (a divisor of [`SCORE_BLOCK`]), each summed over d in order. The last, partial
/// block is scored as a whole one (the lanes run on to a multiple of `SCORE_BLOCK`) and its
/// extra scores dropped: the same operations for the positions kept.
#[inline(always)]
fn score<const SB: usize>(cache: &KvCache, g: usize, q: &[f32], scale: f32, s: &mut [f32]) {
    for (b, block) in s.chunks_mut(SB).enumerate() {
        let mut acc = [0.0f32; SB];
        for (d, &qd) in q.iter().enumerate() {
            let lane = cache.key_block::<SB>(g, d, b * SB);
            for i in 0..SB {
                acc[i] = qd.mul_add(lane[i], acc[i]);
            }
        }
        for (x, a) in block.iter_mut().zip(acc) {
            *x = a * scale;
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
    use super::super::kernels::tests::pseudo;
    use super::*;

    /// Causal attention in f64, one query row and head at a time.
    fn naive(cfg: &LlamaConfig, keys: &[f32], values: &[f32], q: &[f32], pos: usize) -> Vec<f64> {
        let (dim, hd, kv_dim) = (cfg.dim, cfg.head_dim, cfg.n_kv_head * cfg.head_dim);
        let mut out = vec![0.0; q.len()];
        for r in 0..q.len() / dim {
            for h in 0..cfg.n_head {
                let g = h / (cfg.n_head / cfg.n_kv_head);
                let qh = &q[r * dim + h * hd..][..hd];
                let s: Vec<f64> = (0..=pos + r)
                    .map(|j| {
                        let k = &keys[j * kv_dim + g * hd..][..hd];
                        let dot: f64 = qh.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                        dot / (hd as f64).sqrt()
                    })
                    .collect();
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = s.iter().map(|x| (x - max).exp()).sum();
                for (j, x) in s.iter().enumerate() {
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
    /// past the score blocks (the partial last block is scored as a whole one), after the cache
    /// grew and was cut back; and the result is causal attention.
    #[test]
    fn attention_is_the_same_bits_on_every_isa_and_split_and_matches_the_definition() {
        let cfg = LlamaConfig {
            n_layer: 1,
            n_head: 6,
            n_kv_head: 2,
            dim: 6 * 64,
            head_dim: 64,
            eps: 1e-5,
            rope_base: 1e4,
            eos: vec![],
        };
        let kv_dim = 2 * 64;
        for (pos, rows) in [
            (0, 1),
            (5, 3),
            (63, 1),
            (64, 2),
            (127, 5),
            (128, 1),
            (200, 9),
        ] {
            let n = pos + rows;
            let (keys, values) = (pseudo(n * kv_dim, 1 + n as u32), pseudo(n * kv_dim, 2));
            let q = pseudo(rows * cfg.dim, 3 + pos as u32);
            let mut cache = KvCache::new(2, 64);
            // Stale keys past the end: fill beyond n, then cut back and append the real ones.
            cache.append(&pseudo((n + 40) * kv_dim, 9), &pseudo((n + 40) * kv_dim, 9));
            cache.truncate(0);
            cache.append(&keys, &values);
            let want = attend(Isa::Scalar, &mut Pool::new(1), &cfg, &cache, &q, pos);
            let exact = naive(&cfg, &keys, &values, &q, pos);
            for (w, e) in want.iter().zip(&exact) {
                assert!((*w as f64 - e).abs() < 1e-4, "pos {pos}: {w} vs {e}");
            }
            for isa in Isa::available() {
                for threads in [1, 2, 3] {
                    let got = attend(isa, &mut Pool::new(threads), &cfg, &cache, &q, pos);
                    assert_eq!(
                        got, want,
                        "{isa:?}, {threads} threads, pos {pos}, {rows} rows"
                    );
                }
            }
        }
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
