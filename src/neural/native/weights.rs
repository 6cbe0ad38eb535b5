//! A GGUF file's weight matrices in the CPU kernels' tiles: each of ggml's block formats
//! decoded into blocks of 32 columns ([`RowBlock`]) that hold exactly the file's values.
//!
//! | file type | values of a block of 32 | tile |
//! |---|---|---|
//! | Q4_0 | `d·(q − 8)`, q in 0..16 | nibbles, f16 scales, offset `−8d` |
//! | Q4_1 | `d·q + m` | nibbles, f16 scales |
//! | Q4_K | `d·sc·q − dmin·mn` (6-bit sc, mn per 32) | nibbles, factors `sc`, `mn` per row; `d`, `−dmin` per super-block |
//! | Q5_0 | `d·(q − 16)`, q in 0..32 | five bits, f16 scales (the 16 taken out in integers) |
//! | Q5_1 | `d·q + m`, q in 0..32 | five bits, f16 scales |
//! | Q5_K | `d·sc·q − dmin·mn`, q in 0..32 | five bits, as Q4_K |
//! | Q8_0 | `d·q` | bytes, one scale |
//! | Q6_K | `d·sc·(q − 32)`, 8-bit sc per 16 columns | six bits, a factor per half; `d` per super-block |
//!
//! The kernels form each scale as the exact product the format defines (an f16 times a small
//! integer fits an f32's mantissa), so no weight changes. Any other type (F32, F16, BF16,
//! Q2_K, Q3_K…) is re-quantized to Q8_0 through f32, which does change weights, slightly.

use crate::error::Result;
use crate::neural::load::gguf::model_err;
use crate::neural::native::kernels::{KBlock, KQuant, QMatrix, RowBlock, BLOCK, SUPER_BLOCK};
use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
use std::path::Path;

/// The file types whose blocks the kernels take as they are.
pub const NATIVE_TYPES: &[GgmlDType] = &[
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q4K,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::Q8_0,
];

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half_at(bytes, at).to_f32()
}

fn half_at(bytes: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// A block's bytes: `bytes` holds `rows` rows of `per_row` blocks of `size` bytes each, and
/// `columns` columns per block.
struct Layout<'a> {
    bytes: &'a [u8],
    size: usize,
    per_row: usize,
}

impl<'a> Layout<'a> {
    /// The layout of `rows × cols` in blocks of `columns` columns and `size` bytes, if the
    /// data has exactly that length.
    fn new(bytes: &'a [u8], rows: usize, cols: usize, columns: usize, size: usize) -> Option<Self> {
        let fits = cols.is_multiple_of(columns) && bytes.len() == rows * (cols / columns) * size;
        fits.then_some(Layout {
            bytes,
            size,
            per_row: cols / columns,
        })
    }

    fn block(&self, r: usize, b: usize) -> &'a [u8] {
        &self.bytes[(r * self.per_row + b) * self.size..][..self.size]
    }
}

fn one_scale<Q>(d: f32, m: f32, q: [Q; BLOCK]) -> RowBlock<Q> {
    RowBlock { d, m, q }
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K / Q5_K super-block (ggml's
/// `get_scale_min_k4`).
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// `t`'s blocks in the kernels' tiles, with the values the file holds; `None` when the type
/// is not one of [`NATIVE_TYPES`] or its data does not have the length its shape needs.
pub fn native_matrix(dtype: GgmlDType, rows: usize, cols: usize, bytes: &[u8]) -> Option<QMatrix> {
    // A K-quant super-block's d and −dmin (at bytes 0 and 2 of Q4_K and Q5_K).
    let d_dmin = |raw: &[u8]| (half_at(raw, 0), -half_at(raw, 2));
    match dtype {
        GgmlDType::Q4_0 => {
            let l = Layout::new(bytes, rows, cols, BLOCK, 18)?;
            Some(QMatrix::from_nibble_blocks(rows, cols, |r, b| {
                let raw = l.block(r, b);
                let d = f16_at(raw, 0);
                // −8d is an f16 whenever d is (a power of two apart), short of overflow.
                one_scale(
                    d,
                    -8.0 * d,
                    std::array::from_fn(|c| low_high(raw[2 + c % 16], c)),
                )
            }))
        }
        GgmlDType::Q4_1 => {
            let l = Layout::new(bytes, rows, cols, BLOCK, 20)?;
            Some(QMatrix::from_nibble_blocks(rows, cols, |r, b| {
                let raw = l.block(r, b);
                let q = std::array::from_fn(|c| low_high(raw[4 + c % 16], c));
                one_scale(f16_at(raw, 0), f16_at(raw, 2), q)
            }))
        }
        GgmlDType::Q8_0 => {
            let l = Layout::new(bytes, rows, cols, BLOCK, 34)?;
            Some(QMatrix::from_byte_blocks(rows, cols, |r, b| {
                let raw = l.block(r, b);
                one_scale(
                    f16_at(raw, 0),
                    0.0,
                    std::array::from_fn(|c| raw[2 + c] as i8),
                )
            }))
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
            let offset = dtype == GgmlDType::Q5_1;
            let size = if offset { 24 } else { 22 };
            let l = Layout::new(bytes, rows, cols, BLOCK, size)?;
            let block = |r, b| {
                let raw = l.block(r, b);
                let at = if offset { 4 } else { 2 };
                let qh = u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
                let q = std::array::from_fn(|c| {
                    low_high(raw[at + 4 + c % 16], c) | (((qh >> c) & 1) << 4) as u8
                });
                let m = if offset { f16_at(raw, 2) } else { 0.0 };
                one_scale(f16_at(raw, 0), m, q)
            };
            Some(match offset {
                true => QMatrix::from_five_bit_blocks(rows, cols, block),
                false => QMatrix::from_q5_0_blocks(rows, cols, block),
            })
        }
        GgmlDType::Q4K => {
            let l = Layout::new(bytes, rows, cols, SUPER_BLOCK, 144)?;
            let sup = |r, s| d_dmin(l.block(r, s));
            Some(QMatrix::from_k_blocks(
                KQuant::Q4K,
                rows,
                cols,
                sup,
                |r, b| {
                    let raw = l.block(r, b / 8);
                    let j = b % 8;
                    let (sc, mn) = scale_min_k4(j, &raw[4..16]);
                    let qs = &raw[16 + 32 * (j / 2)..][..32];
                    let q =
                        std::array::from_fn(|c| if j % 2 == 0 { qs[c] & 0xF } else { qs[c] >> 4 });
                    KBlock {
                        sc: [sc as i8; 2],
                        mn,
                        q,
                    }
                },
            ))
        }
        GgmlDType::Q5K => {
            let l = Layout::new(bytes, rows, cols, SUPER_BLOCK, 176)?;
            let sup = |r, s| d_dmin(l.block(r, s));
            Some(QMatrix::from_k_blocks(
                KQuant::Q5K,
                rows,
                cols,
                sup,
                |r, b| {
                    let raw = l.block(r, b / 8);
                    let j = b % 8;
                    let (sc, mn) = scale_min_k4(j, &raw[4..16]);
                    let (qh, qs) = (&raw[16..48], &raw[48 + 32 * (j / 2)..][..32]);
                    let q = std::array::from_fn(|c| {
                        let low = if j % 2 == 0 { qs[c] & 0xF } else { qs[c] >> 4 };
                        low | (((qh[c] >> j) & 1) << 4)
                    });
                    KBlock {
                        sc: [sc as i8; 2],
                        mn,
                        q,
                    }
                },
            ))
        }
        GgmlDType::Q6K => {
            let l = Layout::new(bytes, rows, cols, SUPER_BLOCK, 210)?;
            let sup = |r, s| (half_at(l.block(r, s), 208), f16::ZERO);
            Some(QMatrix::from_k_blocks(
                KQuant::Q6K,
                rows,
                cols,
                sup,
                |r, b| {
                    let raw = l.block(r, b / 8);
                    let (ql, qh, sc) = (&raw[..128], &raw[128..192], &raw[192..208]);
                    let q = std::array::from_fn(|c| {
                        // Element e of the super-block: half n, quarter, lane l (ggml's loop).
                        let e = 32 * (b % 8) + c;
                        let (n, quarter, l) = (e / 128, (e % 128) / 32, e % 32);
                        let low = ql[64 * n + l + 32 * (quarter % 2)];
                        let low = if quarter < 2 { low & 0xF } else { low >> 4 };
                        let high = (qh[32 * n + l] >> (2 * quarter)) & 3;
                        low | (high << 4)
                    });
                    let e = 32 * (b % 8);
                    KBlock {
                        sc: [sc[e / 16] as i8, sc[e / 16 + 1] as i8],
                        mn: 0,
                        q,
                    }
                },
            ))
        }
        _ => None,
    }
}

/// Column c's nibble of a 16-byte ggml quant array: low nibbles hold columns 0..16, high
/// nibbles 16..32.
fn low_high(byte: u8, c: usize) -> u8 {
    if c < 16 {
        byte & 15
    } else {
        byte >> 4
    }
}

/// Converts a GGUF matrix to the kernels' tiles: [`NATIVE_TYPES`] as they are, unless
/// `requantize` (every matrix through f32 to Q8_0); other types always through f32 to Q8_0.
pub fn to_matrix(path: &Path, name: &str, t: QTensor, requantize: bool) -> Result<QMatrix> {
    let (rows, cols) = t
        .shape()
        .dims2()
        .map_err(|e| model_err(path, format!("tensor {name}: {e}")))?;
    let dtype = t.dtype();
    if !requantize && NATIVE_TYPES.contains(&dtype) {
        return native_matrix(dtype, rows, cols, &t.data()?).ok_or_else(|| {
            model_err(
                path,
                format!("tensor {name}: {dtype:?} data does not fit its shape {rows} × {cols}"),
            )
        });
    }
    let values = t
        .dequantize(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1()?;
    QMatrix::quantize_q8_0(rows, cols, &values).ok_or_else(|| {
        model_err(
            path,
            format!("tensor {name}: {cols} columns are not a multiple of {BLOCK}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neural::native::kernels::tests::pseudo;
    use candle_core::{Device, Tensor};

    /// Every native type decodes to the values candle's dequantization gives, bit for bit, on
    /// random weights and on the formats' limits (zeros, equal values, large and tiny
    /// magnitudes, one outlier per block).
    #[test]
    fn every_native_type_holds_the_files_values() {
        let (rows, cols) = (19, 512);
        let mut limits = pseudo(rows * cols, 5);
        for (i, v) in limits.iter_mut().enumerate() {
            match (i / cols) % 5 {
                0 => *v = 0.0,
                1 => *v = 0.25,
                2 => *v *= 6e4,
                3 => *v *= 1e-6,
                _ => {
                    if i % 37 == 0 {
                        *v = 40.0
                    }
                }
            }
        }
        for values in [pseudo(rows * cols, 3), limits] {
            let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
            for &dtype in NATIVE_TYPES {
                let q = QTensor::quantize(&t, dtype).unwrap();
                let want: Vec<f32> = q
                    .dequantize(&Device::Cpu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let m = native_matrix(dtype, rows, cols, &q.data().unwrap()).unwrap();
                let mut row = vec![0.0; cols];
                for r in 0..rows {
                    m.dequantize_row(r, &mut row);
                    for (c, (g, w)) in row.iter().zip(&want[r * cols..]).enumerate() {
                        assert!(
                            g == w || (g - w).abs() <= 1e-6 * w.abs(),
                            "{dtype:?} row {r} col {c}: {g} vs {w}"
                        );
                    }
                }
                // Data of the wrong length is refused.
                let data = q.data().unwrap();
                assert!(native_matrix(dtype, rows, cols, &data[1..]).is_none());
                assert!(native_matrix(dtype, rows + 1, cols, &data).is_none());
            }
        }
    }
}
