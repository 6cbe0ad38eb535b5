//! The KV cache and causal attention of the native llama pass.
//!
//! Keys are stored transposed, `[kv head][dimension][position]`, so the scores of a query
//! against a block of consecutive positions are one broadcast-FMA per dimension across the
//! block: no horizontal sums, and each cached key is read once per query head. Values stay
//! row-major, `[position][kv head·dimension]`, for the weighted sum. Every score and every
//! output element is a fixed sequence of fused multiply-adds (over dimensions, then over
//! positions), the same whether a row is computed alone or in a k-token pass and on any
//! thread split, which keeps the pass batch-invariant.

use super::gguf::LlamaConfig;
use super::kernels::Isa;
use super::pool::{DisjointOut, Pool};

/// Positions scored together: a block of accumulators that stays in registers (eight
/// AVX-512 registers, enough independent FMA chains to hide the FMA latency).
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
        let capacity = need.max(2 * self.capacity).max(SCORE_BLOCK);
        let lanes = self.kv_heads * self.head_dim;
        let mut grown = vec![0.0f32; lanes * capacity];
        for c in 0..lanes {
            let old = &self.keys_t[c * self.capacity..c * self.capacity + self.len];
            grown[c * capacity..c * capacity + self.len].copy_from_slice(old);
        }
        self.keys_t = grown;
        self.capacity = capacity;
    }

    /// Dimension `d` of kv head `g` at positions `0..len`.
    #[inline(always)]
    fn key_lane(&self, g: usize, d: usize) -> &[f32] {
        let at = (g * self.head_dim + d) * self.capacity;
        &self.keys_t[at..at + self.len]
    }

    /// The value of kv head `g` at position `j`.
    #[inline(always)]
    fn value(&self, j: usize, g: usize) -> &[f32] {
        let at = j * self.kv_heads * self.head_dim + g * self.head_dim;
        &self.values[at..at + self.head_dim]
    }
}

/// Causal attention of the query rows `q` (row r at position pos + r) over `cache`, which
/// already holds their keys and values. The heads are split across the pool's threads.
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
    let parts = pool.threads().min(cfg.n_head);
    let per = cfg.n_head.div_ceil(parts);
    pool.run(&|part| {
        let heads = (part * per).min(cfg.n_head)..((part + 1) * per).min(cfg.n_head);
        attend_heads(isa, cfg, cache, q, pos, heads, shared);
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
    heads: std::ops::Range<usize>,
    out: DisjointOut,
) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `Isa::detect` saw these features before choosing the ISA.
        match isa {
            Isa::Avx512Vnni => return unsafe { attend_avx512(cfg, cache, q, pos, heads, out) },
            Isa::Avx2 | Isa::AvxVnni => {
                return unsafe { attend_avx2(cfg, cache, q, pos, heads, out) }
            }
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    attend_portable(cfg, cache, q, pos, heads, out)
}

/// Entry points compiled with wider vectors; each is [`attend_portable`] inlined.
macro_rules! attend_entry {
    ($name:ident, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            cfg: &LlamaConfig,
            cache: &KvCache,
            q: &[f32],
            pos: usize,
            heads: std::ops::Range<usize>,
            out: DisjointOut,
        ) {
            attend_portable(cfg, cache, q, pos, heads, out)
        }
    };
}

attend_entry!(attend_avx512, "avx512f,avx2,fma");
attend_entry!(attend_avx2, "avx2,fma");

/// Attention for the query heads `heads`, written into their columns of `out`. Plain loops
/// over fixed-size blocks, inlined into the entry points above so they vectorize there.
#[inline(always)]
fn attend_portable(
    cfg: &LlamaConfig,
    cache: &KvCache,
    q: &[f32],
    pos: usize,
    heads: std::ops::Range<usize>,
    out: DisjointOut,
) {
    let (dim, hd) = (cfg.dim, cfg.head_dim);
    let group = cfg.n_head / cfg.n_kv_head;
    let scale = 1.0 / (hd as f32).sqrt();
    let rows = q.len() / dim;
    let mut scores = vec![0.0f32; pos + rows];
    let mut acc = vec![0.0f32; hd];
    for r in 0..rows {
        let seen = pos + r + 1;
        for h in heads.clone() {
            let g = h / group;
            let qh = &q[r * dim + h * hd..r * dim + (h + 1) * hd];
            let s = &mut scores[..seen];
            score(cache, g, qh, scale, s);
            softmax_in_place(s);
            match hd {
                64 => weigh_values::<64>(cache, g, s, &mut acc),
                128 => weigh_values::<128>(cache, g, s, &mut acc),
                _ => weigh_values_any(cache, g, s, &mut acc),
            }
            // SAFETY: only this part computes head h.
            unsafe { out.write_slice(r * dim + h * hd, &acc) };
        }
    }
}

/// `acc = Σ_j p[j]·value_j` of kv head `g`: even and odd positions summed apart, each in
/// order (two independent FMA chains), then added; the accumulators stay in registers (`HD`
/// is the head dimension).
#[inline(always)]
fn weigh_values<const HD: usize>(cache: &KvCache, g: usize, p: &[f32], acc: &mut [f32]) {
    let (mut even, mut odd) = ([0.0f32; HD], [0.0f32; HD]);
    let value = |j: usize| -> &[f32; HD] { cache.value(j, g).try_into().expect("head dimension") };
    let mut pairs = p.chunks_exact(2);
    let mut j = 0;
    for pair in pairs.by_ref() {
        let (v0, v1) = (value(j), value(j + 1));
        for i in 0..HD {
            even[i] = pair[0].mul_add(v0[i], even[i]);
            odd[i] = pair[1].mul_add(v1[i], odd[i]);
        }
        j += 2;
    }
    if let [last] = pairs.remainder() {
        let v = value(j);
        for i in 0..HD {
            even[i] = last.mul_add(v[i], even[i]);
        }
    }
    for (i, a) in acc.iter_mut().enumerate() {
        *a = even[i] + odd[i];
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

/// `s[j] = scale · Σ_d q[d]·key_j[d]` for the positions `j < s.len()`, by blocks of
/// [`SCORE_BLOCK`] positions, each summed over d in order.
#[inline(always)]
fn score(cache: &KvCache, g: usize, q: &[f32], scale: f32, s: &mut [f32]) {
    let mut blocks = s.chunks_exact_mut(SCORE_BLOCK);
    let mut j0 = 0;
    for block in blocks.by_ref() {
        let mut acc = [0.0f32; SCORE_BLOCK];
        for (d, &qd) in q.iter().enumerate() {
            let lane: &[f32; SCORE_BLOCK] = cache.key_lane(g, d)[j0..j0 + SCORE_BLOCK]
                .try_into()
                .expect("a full block");
            for i in 0..SCORE_BLOCK {
                acc[i] = qd.mul_add(lane[i], acc[i]);
            }
        }
        for (x, a) in block.iter_mut().zip(acc) {
            *x = a * scale;
        }
        j0 += SCORE_BLOCK;
    }
    let tail = blocks.into_remainder();
    if tail.is_empty() {
        return;
    }
    let n = tail.len();
    let mut acc = [0.0f32; SCORE_BLOCK];
    for (d, &qd) in q.iter().enumerate() {
        let lane = &cache.key_lane(g, d)[j0..j0 + n];
        for (a, &k) in acc.iter_mut().zip(lane) {
            *a = qd.mul_add(k, *a);
        }
    }
    for (x, a) in tail.iter_mut().zip(acc) {
        *x = a * scale;
    }
}

#[inline(always)]
fn softmax_in_place(x: &mut [f32]) {
    // Compare-and-select (not `f32::max`, whose NaN rule keeps it scalar); no NaN reaches here.
    let mut max = f32::NEG_INFINITY;
    for &v in x.iter() {
        max = if v > max { v } else { max };
    }
    for v in x.iter_mut() {
        *v = exp_nonpositive(*v - max);
    }
    let sum: f32 = x.iter().sum();
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
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
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_2e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e_r = p.mul_add(r * r, r + 1.0);
    let e = e_r * f32::from_bits(((n as i32 + 127) << 23) as u32);
    if underflow {
        0.0
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::exp_nonpositive;

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
