//! Quantized matrix kernels for the native llama forward pass.
//!
//! Weights keep the GGUF file's Q4_1 blocks (or Q8_0; other types are re-quantized to Q8_0 at
//! load), with the f16 scales widened to f32 and stored apart from the quants. Activations are
//! quantized per row to blocks of 32 signed bytes with a scale `d` and `d·Σq` (ggml's Q8_1), so
//! a block's dot product is an integer dot product of 32 pairs: AVX-VNNI `vpdpbusd` where the
//! CPU has it, AVX2 `vpmaddubsw` otherwise, plain Rust as the last resort.
//!
//! [`matmul`] walks the weight matrix once and multiplies each weight row with every activation
//! row while it is in L1, unpacking each weight block once for up to four rows. Every output is
//! still computed by the same instruction sequence whatever the number of rows in the pass, so a
//! k-token verification pass gives each position bit-for-bit the logits of a single-token step.

use super::pool::{DisjointOut, Pool};

/// Weights and activations are quantized in blocks of this many values.
pub const BLOCK: usize = 32;

/// The instruction set the kernels use, chosen once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    AvxVnni,
    /// AVX-512 with VNNI: two blocks per instruction.
    Avx512Vnni,
}

impl Isa {
    /// The instruction sets this CPU can run, best last.
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni]
            .into_iter()
            .filter(|&isa| match isa {
                Isa::Scalar => true,
                Isa::Avx2 => best != Isa::Scalar,
                Isa::AvxVnni => best == Isa::AvxVnni || (best == Isa::Avx512Vnni && has_avxvnni()),
                Isa::Avx512Vnni => best == Isa::Avx512Vnni,
            })
            .collect()
    }

    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512Vnni;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                if std::arch::is_x86_feature_detected!("avxvnni") {
                    return Isa::AvxVnni;
                }
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }
}

fn has_avxvnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avxvnni");
    #[allow(unreachable_code)]
    false
}

/// A weight matrix of `rows × cols` (output features × input features) in quantized blocks.
pub struct QMatrix {
    rows: usize,
    cols: usize,
    /// Block scales, `rows × cols / 32`.
    d: Vec<f32>,
    quants: Quants,
}

enum Quants {
    /// `value = d·q + m`, q in 0..16; byte j holds values j (low nibble) and j + 16 (high).
    Q4_1 { m: Vec<f32>, qs: Vec<[u8; 16]> },
    /// `value = d·q`, q in −128..128.
    Q8_0 { qs: Vec<[i8; 32]> },
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

impl QMatrix {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// Reads ggml Q4_1 blocks (f16 d, f16 m, 16 bytes of nibbles).
    pub fn from_q4_1(rows: usize, cols: usize, bytes: &[u8]) -> Option<QMatrix> {
        let n = rows * cols / BLOCK;
        if !cols.is_multiple_of(BLOCK) || bytes.len() != n * 20 {
            return None;
        }
        let (mut d, mut m, mut qs) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::new());
        for block in bytes.chunks_exact(20) {
            d.push(f16_at(block, 0));
            m.push(f16_at(block, 2));
            qs.push(block[4..20].try_into().expect("16 bytes"));
        }
        Some(QMatrix {
            rows,
            cols,
            d,
            quants: Quants::Q4_1 { m, qs },
        })
    }

    /// Reads ggml Q8_0 blocks (f16 d, 32 signed bytes).
    pub fn from_q8_0(rows: usize, cols: usize, bytes: &[u8]) -> Option<QMatrix> {
        let n = rows * cols / BLOCK;
        if !cols.is_multiple_of(BLOCK) || bytes.len() != n * 34 {
            return None;
        }
        let (mut d, mut qs) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for block in bytes.chunks_exact(34) {
            d.push(f16_at(block, 0));
            qs.push(std::array::from_fn(|i| block[2 + i] as i8));
        }
        Some(QMatrix {
            rows,
            cols,
            d,
            quants: Quants::Q8_0 { qs },
        })
    }

    /// Quantizes f32 weights (`rows × cols`, row-major) to Q8_0.
    pub fn quantize_q8_0(rows: usize, cols: usize, values: &[f32]) -> Option<QMatrix> {
        if !cols.is_multiple_of(BLOCK) || values.len() != rows * cols {
            return None;
        }
        let (mut d, mut qs) = (Vec::new(), Vec::new());
        for block in values.chunks_exact(BLOCK) {
            let (scale, q, _) = quantize_block(block);
            d.push(scale);
            qs.push(q);
        }
        Some(QMatrix {
            rows,
            cols,
            d,
            quants: Quants::Q8_0 { qs },
        })
    }

    /// Writes row `r`, dequantized, into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        for (b, chunk) in out[..self.cols].chunks_exact_mut(BLOCK).enumerate() {
            let i = r * nb + b;
            let d = self.d[i];
            match &self.quants {
                Quants::Q4_1 { m, qs } => {
                    for (j, &byte) in qs[i].iter().enumerate() {
                        chunk[j] = d * (byte & 15) as f32 + m[i];
                        chunk[j + 16] = d * (byte >> 4) as f32 + m[i];
                    }
                }
                Quants::Q8_0 { qs } => {
                    for (x, &q) in chunk.iter_mut().zip(&qs[i]) {
                        *x = d * q as f32;
                    }
                }
            }
        }
    }
}

/// Quantizes 32 values to signed bytes: (scale, quants, scale·Σquants).
fn quantize_block(x: &[f32]) -> (f32, [i8; 32], f32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let q: [i8; 32] = std::array::from_fn(|i| (x[i] * id).round() as i8);
    let sum: i32 = q.iter().map(|&v| v as i32).sum();
    (d, q, d * sum as f32)
}

/// Activation rows quantized for [`matmul`]; reused from pass to pass to avoid allocation.
#[derive(Default)]
pub struct QRows {
    rows: usize,
    cols: usize,
    d: Vec<f32>,
    /// `d·Σq` of each block, for Q4_1's offset term.
    s: Vec<f32>,
    qs: Vec<[i8; 32]>,
}

impl QRows {
    /// Quantizes `x` (`rows × cols`, row-major).
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        assert!(cols.is_multiple_of(BLOCK) && x.len().is_multiple_of(cols));
        self.rows = x.len() / cols;
        self.cols = cols;
        self.d.clear();
        self.s.clear();
        self.qs.clear();
        for block in x.chunks_exact(BLOCK) {
            let (d, q, s) = quantize_block(block);
            self.d.push(d);
            self.s.push(s);
            self.qs.push(q);
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    fn row(&self, r: usize) -> Row<'_> {
        let nb = self.cols / BLOCK;
        let span = r * nb..(r + 1) * nb;
        Row {
            d: &self.d[span.clone()],
            s: &self.s[span.clone()],
            qs: &self.qs[span],
        }
    }
}

#[derive(Clone, Copy)]
struct Row<'a> {
    d: &'a [f32],
    s: &'a [f32],
    qs: &'a [[i8; 32]],
}

/// Below this many weight rows per thread a product is not split.
const MIN_ROWS_PER_THREAD: usize = 64;

/// `out[r·n + j] = Σ_c a[r][c]·w[j][c]` for every activation row r and weight row j, where
/// `n = w.rows()`. The weight rows are split across the pool's threads; each output is
/// computed by one thread in the same way, so the result is the same bit for bit.
pub fn matmul(isa: Isa, w: &QMatrix, a: &QRows, out: &mut [f32], pool: &mut Pool) {
    assert_eq!(w.cols, a.cols, "matmul: inner dimensions differ");
    let (n, k) = (w.rows, a.rows);
    assert_eq!(out.len(), n * k);
    let parts = pool.threads().min(n / MIN_ROWS_PER_THREAD).max(1);
    if parts == 1 {
        matmul_span(isa, w, a, 0..n, &mut |j, r, v| out[r * n + j] = v);
        return;
    }
    let span = n.div_ceil(parts);
    let shared = DisjointOut::new(out);
    pool.run(&|part| {
        let js = (part * span).min(n)..((part + 1) * span).min(n);
        // SAFETY: part p writes only the columns j of its own span.
        matmul_span(isa, w, a, js, &mut |j, r, v| unsafe {
            shared.write(r * n + j, v)
        });
    });
}

/// Weight rows `js` times all activation rows; `put(j, r, value)` stores each output.
fn matmul_span(
    isa: Isa,
    w: &QMatrix,
    a: &QRows,
    js: std::ops::Range<usize>,
    put: &mut impl FnMut(usize, usize, f32),
) {
    let nb = w.blocks_per_row();
    let k = a.rows;
    let rows: Vec<Row> = (0..k).map(|r| a.row(r)).collect();
    let mut o = [0.0f32; 4];
    for j in js {
        let wd = &w.d[j * nb..(j + 1) * nb];
        let mut r = 0;
        while r < k {
            let group = (k - r).min(4);
            let rs = &rows[r..r + group];
            match &w.quants {
                Quants::Q4_1 { m, qs } => {
                    let (wm, wq) = (&m[j * nb..(j + 1) * nb], &qs[j * nb..(j + 1) * nb]);
                    match group {
                        4 => q4_1_rows::<4>(isa, wd, wm, wq, rs, &mut o),
                        3 => q4_1_rows::<3>(isa, wd, wm, wq, rs, &mut o),
                        2 => q4_1_rows::<2>(isa, wd, wm, wq, rs, &mut o),
                        _ => q4_1_rows::<1>(isa, wd, wm, wq, rs, &mut o),
                    }
                }
                Quants::Q8_0 { qs } => {
                    let wq = &qs[j * nb..(j + 1) * nb];
                    match group {
                        4 => q8_0_rows::<4>(isa, wd, wq, rs, &mut o),
                        3 => q8_0_rows::<3>(isa, wd, wq, rs, &mut o),
                        2 => q8_0_rows::<2>(isa, wd, wq, rs, &mut o),
                        _ => q8_0_rows::<1>(isa, wd, wq, rs, &mut o),
                    }
                }
            }
            for (i, &v) in o[..group].iter().enumerate() {
                put(j, r + i, v);
            }
            r += group;
        }
    }
}

/// The Q4_1 offset term `Σ_b m_b·s_b` of one output, summed in eight lanes (which the
/// compiler vectorizes) and reduced in a fixed order.
#[inline(always)]
fn offset_term(m: &[f32], s: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (cm, cs) = (m.chunks_exact(8), s.chunks_exact(8));
    let tail = cm
        .remainder()
        .iter()
        .zip(cs.remainder())
        .fold(0.0f32, |acc, (m, s)| acc + m * s);
    for (m, s) in cm.zip(cs) {
        for i in 0..8 {
            lanes[i] += m[i] * s[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

fn q4_1_rows<const N: usize>(
    isa: Isa,
    d: &[f32],
    m: &[f32],
    qs: &[[u8; 16]],
    rows: &[Row],
    out: &mut [f32],
) {
    let rows: [Row; N] = std::array::from_fn(|i| rows[i]);
    let dots: [f32; N] = match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` chose these only after checking the CPU features.
        Isa::Avx512Vnni => unsafe { x86::q4_1_avx512::<N>(d, m, qs, &rows) },
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => unsafe { x86::q4_1_vnni::<N>(d, m, qs, &rows) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::q4_1_avx2::<N>(d, m, qs, &rows) },
        _ => std::array::from_fn(|i| {
            let row = rows[i];
            (0..d.len()).fold(0.0f32, |acc, b| {
                let mut sum = 0i32;
                for (j, &byte) in qs[b].iter().enumerate() {
                    sum += (byte & 15) as i32 * row.qs[b][j] as i32;
                    sum += (byte >> 4) as i32 * row.qs[b][j + 16] as i32;
                }
                acc + sum as f32 * (d[b] * row.d[b])
            }) + offset_term(m, row.s)
        }),
    };
    out[..N].copy_from_slice(&dots);
}

fn q8_0_rows<const N: usize>(isa: Isa, d: &[f32], qs: &[[i8; 32]], rows: &[Row], out: &mut [f32]) {
    let rows: [Row; N] = std::array::from_fn(|i| rows[i]);
    let dots: [f32; N] = match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` chose these only after checking the CPU features.
        Isa::Avx512Vnni => unsafe { x86::q8_0_avx512::<N>(d, qs, &rows) },
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => unsafe { x86::q8_0_vnni::<N>(d, qs, &rows) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::q8_0_avx2::<N>(d, qs, &rows) },
        _ => std::array::from_fn(|i| {
            let row = rows[i];
            (0..d.len()).fold(0.0f32, |acc, b| {
                let sum: i32 = (0..BLOCK)
                    .map(|j| qs[b][j] as i32 * row.qs[b][j] as i32)
                    .sum();
                acc + sum as f32 * (d[b] * row.d[b])
            })
        }),
    };
    out[..N].copy_from_slice(&dots);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 and AVX-VNNI block dot products. Each row keeps its own 8-lane accumulator and
    //! is reduced in a fixed order, so a row's result does not depend on its neighbours.
    use super::{offset_term, Row};
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// The 32 nibbles of a Q4_1 block as bytes 0..16, in value order.
    #[inline(always)]
    unsafe fn unpack_nibbles(qs: &[u8; 16]) -> __m256i {
        let raw = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
    }

    #[inline(always)]
    unsafe fn load_i8(qs: &[i8; 32]) -> __m256i {
        _mm256_loadu_si256(qs.as_ptr() as *const __m256i)
    }

    /// Eight partial sums of 32 unsigned × signed byte products (AVX2; no overflow while
    /// |u·s| ≤ 128·127, which Q4 nibbles and |weights| of Q8_0 satisfy).
    #[inline(always)]
    unsafe fn dot_u8i8_avx2(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn dot_u8i8_vnni(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
    }

    macro_rules! kernels {
        ($q4:ident, $q8:ident, $dot:ident, $features:literal) => {
            #[target_feature(enable = $features)]
            pub unsafe fn $q4<const N: usize>(
                d: &[f32],
                m: &[f32],
                qs: &[[u8; 16]],
                rows: &[Row; N],
            ) -> [f32; N] {
                let mut acc = [_mm256_setzero_ps(); N];
                for b in 0..d.len() {
                    let w = unpack_nibbles(&qs[b]);
                    for i in 0..N {
                        let p = $dot(w, load_i8(&rows[i].qs[b]));
                        let scale = _mm256_set1_ps(d[b] * rows[i].d[b]);
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[i]);
                    }
                }
                let mut out = [0.0f32; N];
                for i in 0..N {
                    out[i] = hsum(acc[i]) + offset_term(m, rows[i].s);
                }
                out
            }

            #[target_feature(enable = $features)]
            pub unsafe fn $q8<const N: usize>(
                d: &[f32],
                qs: &[[i8; 32]],
                rows: &[Row; N],
            ) -> [f32; N] {
                let mut acc = [_mm256_setzero_ps(); N];
                for b in 0..d.len() {
                    let w = load_i8(&qs[b]);
                    let w_abs = _mm256_sign_epi8(w, w);
                    for i in 0..N {
                        let a = _mm256_sign_epi8(load_i8(&rows[i].qs[b]), w);
                        let p = $dot(w_abs, a);
                        let scale = _mm256_set1_ps(d[b] * rows[i].d[b]);
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[i]);
                    }
                }
                std::array::from_fn(|i| hsum(acc[i]))
            }
        };
    }

    kernels!(q4_1_avx2, q8_0_avx2, dot_u8i8_avx2, "avx2,fma");
    kernels!(q4_1_vnni, q8_0_vnni, dot_u8i8_vnni, "avx2,fma,avxvnni");

    /// `[d_w[b]·d_a[b] × 8, d_w[b+1]·d_a[b+1] × 8]`: the scales of a pair of blocks.
    #[inline(always)]
    unsafe fn pair_scales(dw: &[f32], da: &[f32], b: usize) -> __m512 {
        let w = _mm_castpd_ps(_mm_load_sd(dw.as_ptr().add(b) as *const f64));
        let a = _mm_castpd_ps(_mm_load_sd(da.as_ptr().add(b) as *const f64));
        let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(w, a)))
    }

    /// Sums the two accumulators of a row and reduces them in a fixed order.
    #[inline(always)]
    unsafe fn reduce_pair(a: __m512, b: __m512) -> f32 {
        let s = _mm512_add_ps(a, b);
        let lo = _mm512_castps512_ps256(s);
        let hi = _mm512_extractf32x8_ps(s, 1);
        hsum(_mm256_add_ps(lo, hi))
    }

    /// AVX-512 Q4_1: two blocks per `vpdpbusd`, two accumulators per row (even and odd pairs)
    /// so consecutive FMAs do not wait on each other; an odd last block goes through 256 bits.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma")]
    pub unsafe fn q4_1_avx512<const N: usize>(
        d: &[f32],
        m: &[f32],
        qs: &[[u8; 16]],
        rows: &[Row; N],
    ) -> [f32; N] {
        let nb = d.len();
        let mut acc = [[_mm512_setzero_ps(); 2]; N];
        let lanes = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
        let mask = _mm512_set1_epi8(0x0F);
        let mut b = 0;
        while b + 2 <= nb {
            let raw = _mm256_loadu_si256(qs.as_ptr().add(b) as *const __m256i);
            let x = _mm512_permutexvar_epi64(lanes, _mm512_castsi256_si512(raw));
            let w = _mm512_and_si512(
                _mm512_mask_blend_epi64(0xCC, x, _mm512_srli_epi16(x, 4)),
                mask,
            );
            let slot = (b / 2) & 1;
            for i in 0..N {
                let a = _mm512_loadu_si512(rows[i].qs.as_ptr().add(b) as *const __m512i);
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
                let scale = pair_scales(d, rows[i].d, b);
                acc[i][slot] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[i][slot]);
            }
            b += 2;
        }
        let mut tail = [0.0f32; N];
        if b < nb {
            // No offsets (`m` empty): the whole row's offset term is added below.
            tail = q4_1_avx2::<N>(&d[b..], &[], &qs[b..], &rows_from(rows, b));
        }
        let mut out = [0.0f32; N];
        for i in 0..N {
            out[i] = reduce_pair(acc[i][0], acc[i][1]) + tail[i] + offset_term(m, rows[i].s);
        }
        out
    }

    /// AVX-512 Q8_0, laid out like [`q4_1_avx512`]; signs move from the weights to the
    /// activations so the weights can enter `vpdpbusd` as unsigned bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma")]
    pub unsafe fn q8_0_avx512<const N: usize>(
        d: &[f32],
        qs: &[[i8; 32]],
        rows: &[Row; N],
    ) -> [f32; N] {
        let nb = d.len();
        let mut acc = [[_mm512_setzero_ps(); 2]; N];
        let mut b = 0;
        while b + 2 <= nb {
            let w = _mm512_loadu_si512(qs.as_ptr().add(b) as *const __m512i);
            let negative = _mm512_movepi8_mask(w);
            let w_abs = _mm512_abs_epi8(w);
            let slot = (b / 2) & 1;
            for i in 0..N {
                let a = _mm512_loadu_si512(rows[i].qs.as_ptr().add(b) as *const __m512i);
                let a = _mm512_mask_sub_epi8(a, negative, _mm512_setzero_si512(), a);
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w_abs, a);
                let scale = pair_scales(d, rows[i].d, b);
                acc[i][slot] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[i][slot]);
            }
            b += 2;
        }
        let mut tail = [0.0f32; N];
        if b < nb {
            tail = q8_0_avx2::<N>(&d[b..], &qs[b..], &rows_from(rows, b));
        }
        std::array::from_fn(|i| reduce_pair(acc[i][0], acc[i][1]) + tail[i])
    }

    /// Rows `rows` seen from block `from` on.
    fn rows_from<'a, const N: usize>(rows: &[Row<'a>; N], from: usize) -> [Row<'a>; N] {
        std::array::from_fn(|i| Row {
            d: &rows[i].d[from..],
            s: &rows[i].s[from..],
            qs: &rows[i].qs[from..],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(w: &QMatrix, x: &[f32], cols: usize) -> Vec<f32> {
        let k = x.len() / cols;
        let mut row = vec![0.0; cols];
        let mut out = vec![0.0; k * w.rows()];
        for j in 0..w.rows() {
            w.dequantize_row(j, &mut row);
            for r in 0..k {
                out[r * w.rows() + j] = (0..cols).map(|c| row[c] * x[r * cols + c]).sum();
            }
        }
        out
    }

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn q4_1_matrix(rows: usize, cols: usize, seed: u32) -> QMatrix {
        let v = pseudo(rows * cols, seed);
        let mut bytes = Vec::new();
        for block in v.chunks_exact(BLOCK) {
            let min = block.iter().cloned().fold(f32::MAX, f32::min);
            let max = block.iter().cloned().fold(f32::MIN, f32::max);
            let d = (max - min) / 15.0;
            bytes.extend(half::f16::from_f32(d).to_le_bytes());
            bytes.extend(half::f16::from_f32(min).to_le_bytes());
            let q = |x: f32| ((x - min) / d).round().clamp(0.0, 15.0) as u8;
            for j in 0..16 {
                bytes.push(q(block[j]) | (q(block[j + 16]) << 4));
            }
        }
        QMatrix::from_q4_1(rows, cols, &bytes).unwrap()
    }

    #[test]
    fn every_isa_matches_the_dequantized_product_and_is_batch_invariant() {
        let (rows, cols) = (150, 96 + 32);
        let mats = [
            q4_1_matrix(rows, cols, 7),
            QMatrix::quantize_q8_0(rows, cols, &pseudo(rows * cols, 9)).unwrap(),
        ];
        let isas = Isa::available();
        for w in &mats {
            for k in [1usize, 2, 3, 5, 9] {
                let x = pseudo(k * cols, 3 + k as u32);
                let want = reference(w, &x, cols);
                let mut a = QRows::default();
                a.quantize(&x, cols);
                for &isa in &isas {
                    for threads in [1, 2] {
                        let mut pool = Pool::new(threads);
                        let mut got = vec![0.0; k * rows];
                        matmul(isa, w, &a, &mut got, &mut pool);
                        for (g, e) in got.iter().zip(&want) {
                            assert!((g - e).abs() < 0.05 + 0.01 * e.abs(), "{isa:?}: {g} vs {e}");
                        }
                        // Row r alone gives the same bits as row r inside the batch.
                        let r = k - 1;
                        let mut one = QRows::default();
                        one.quantize(&x[r * cols..], cols);
                        let mut alone = vec![0.0; rows];
                        matmul(isa, w, &one, &mut alone, &mut pool);
                        assert_eq!(alone[..], got[r * rows..], "{isa:?} k={k}");
                    }
                }
            }
        }
    }
}
