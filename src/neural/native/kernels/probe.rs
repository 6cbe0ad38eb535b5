//! Matrices of every weight type made from a seed: quants and factors over their whole
//! ranges, scales that are no round numbers. The AMX kernel's self-check multiplies them when
//! it is first chosen, and the tests of every ISA against the scalar kernel use them.

use super::*;
use half::f16;

/// `n` pseudo-random values in [−1, 1] (xorshift), the same for the same seed.
pub(in crate::neural) fn pseudo(n: usize, seed: u32) -> Vec<f32> {
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

/// A K-quant matrix (`cols` a multiple of 256): random factors over their whole range,
/// super-block scales that are no round numbers, quants over their range.
pub(super) fn k_quants(kind: KQuant, rows: usize, cols: usize, seed: u32) -> QMatrix {
    let v = pseudo(rows * cols + 3 * rows * cols / BLOCK, seed);
    let n = rows * cols;
    let top = match kind {
        KQuant::Q4K => 15.9,
        KQuant::Q5K => 31.9,
        KQuant::Q6K => 63.9,
    };
    QMatrix::from_k_blocks(
        kind,
        rows,
        cols,
        |r, s| {
            let k = (r * cols / SUPER_BLOCK + s) * 8;
            let d = f16::from_f32((v[n + 3 * k].abs() + 0.01) * 0.003_456_7);
            let m = f16::from_f32(-v[n + 3 * k + 1].abs() * 0.002_345_6);
            (d, if kind == KQuant::Q6K { f16::ZERO } else { m })
        },
        |r, b| {
            let k = r * cols / BLOCK + b;
            let factor = |x: f32| match kind {
                KQuant::Q6K => (x * 127.9).floor() as i8,
                _ => ((x + 1.0) * 31.9) as i8,
            };
            KBlock {
                sc: [factor(v[n + 3 * k + 1]), factor(v[n + 3 * k + 2])],
                mn: ((v[n + 3 * k] + 1.0) * 31.9) as u8,
                q: std::array::from_fn(|c| ((v[r * cols + 32 * b + c] + 1.0) / 2.0 * top) as u8),
            }
        },
    )
}

/// A five-bit matrix: Q5_0-shaped (f16 scales, offset −16d) or Q5_1-shaped (f16 scales
/// and offsets).
pub(super) fn five_bits(rows: usize, cols: usize, seed: u32, shape: &str) -> QMatrix {
    let v = pseudo(rows * cols + 2 * rows * cols / BLOCK, seed);
    let n = rows * cols;
    let f16 = |x: f32| f16::from_f32(x).to_f32();
    let block = |r: usize, b: usize| {
        let k = r * cols / BLOCK + b;
        let d = f16((v[n + 2 * k].abs() + 0.01) * 0.023_456_7);
        RowBlock {
            d,
            m: match shape {
                "q5_0" => -16.0 * d,
                _ => f16(v[n + 2 * k + 1] * 0.5),
            },
            q: std::array::from_fn(|c| ((v[r * cols + 32 * b + c] + 1.0) * 15.9) as u8),
        }
    };
    match shape {
        "q5_0" => QMatrix::from_q5_0_blocks(rows, cols, block),
        _ => QMatrix::from_five_bit_blocks(rows, cols, block),
    }
}

/// A matrix of each weight type the kernels read, `rows` weight rows: Q4_1, Q8_0, Q5_0 and
/// Q5_1 over 128 columns, Q4_K, Q5_K and Q6_K over 512 (two super-blocks a row).
pub(super) fn every_type(rows: usize, seed: u32) -> [QMatrix; 7] {
    let cols = 128;
    let q = |values: Option<QMatrix>| values.expect("probe shapes are whole blocks");
    [
        q(QMatrix::quantize_q4_1(
            rows,
            cols,
            &pseudo(rows * cols, seed),
        )),
        q(QMatrix::quantize_q8_0(
            rows,
            cols,
            &pseudo(rows * cols, seed + 1),
        )),
        five_bits(rows, cols, seed + 2, "q5_0"),
        five_bits(rows, cols, seed + 3, "q5_1"),
        k_quants(KQuant::Q4K, rows, 512, seed + 4),
        k_quants(KQuant::Q5K, rows, 512, seed + 5),
        k_quants(KQuant::Q6K, rows, 512, seed + 6),
    ]
}
