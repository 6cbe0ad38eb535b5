use super::*;
use crate::neural::native::pool::Pool;
use half::f16;

pub(in crate::neural) use super::probe::pseudo;
use super::probe::{every_type, five_bits, k_quants};

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

#[test]
fn q8_0_tiles_take_what_ggml_blocks_take() {
    // 8.5 bits a weight: 32 quants and an f16 scale per block of 32, nothing beside.
    let (rows, cols) = (32, 64);
    let m = QMatrix::quantize_q8_0(rows, cols, &pseudo(rows * cols, 5)).unwrap();
    assert_eq!(m.bytes(), rows * cols / BLOCK * 34);
    // Five bits: Q5_0 at its file's 5.5 bits a weight, Q5_1 (with offsets) at 6.
    assert_eq!(
        five_bits(rows, cols, 6, "q5_0").bytes(),
        rows * cols / BLOCK * 22
    );
    assert_eq!(
        five_bits(rows, cols, 6, "q5_1").bytes(),
        rows * cols / BLOCK * 24
    );
    // K-quants: per row and super-block of 256 weights, the file's bytes plus 4 (Q4_K,
    // Q5_K: 16 factors in bytes where the file packs them in 12, and its d and dmin kept
    // once per 16 rows) or 2 (Q6_K: d) — 4.625, 5.625 and 6.625 bits a weight.
    let cols = 512;
    for (kind, ours) in [(KQuant::Q4K, 148), (KQuant::Q5K, 180), (KQuant::Q6K, 212)] {
        let m = k_quants(kind, rows, cols, 7);
        assert_eq!(m.bytes(), rows * cols / SUPER_BLOCK * ours, "{kind:?}");
    }
}

#[test]
fn the_largest_quants_stay_exact_on_every_isa() {
    // Q4_1 blocks whose quants are 15 but for one 0 (the minimum), against activations of
    // ±127: the AVX2 kernel's 16-bit sums of a block reach 2·15·127 per pair, 8 pairs
    // deep (30,480 of 32,767). Q8_0 weights of ±127 reach `vpmaddubsw`'s limit per pair.
    // Nine activation rows: the unpacked walks take every type at nine (`unpacked_min_rows`).
    const ROWS: usize = 9;
    let (rows, cols) = (32, 64);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| if i % 32 == 0 { 0.0 } else { 1.0 })
        .collect();
    let signed: Vec<f32> = (0..rows * cols)
        .map(|i| if (i / 7) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    // Q6_K at its limits: quants of 63 and 0 (after the center: 31 and −32), factors of
    // ±127 and −128; the AVX2 kernel's 16-bit sums reach 2·2·63·127 = 32,004.
    let six_bits = |q: &dyn Fn(usize, usize) -> u8, sc: [i8; 2]| {
        QMatrix::from_k_blocks(
            KQuant::Q6K,
            rows,
            SUPER_BLOCK,
            |_, _| (f16::from_f32(0.5), f16::ZERO),
            |r, b| KBlock {
                sc,
                mn: 0,
                q: std::array::from_fn(|c| q(r, 32 * b + c)),
            },
        )
    };
    let k_nibbles = |kind, top: u8| {
        QMatrix::from_k_blocks(
            kind,
            rows,
            SUPER_BLOCK,
            |_, _| (f16::from_f32(0.1), f16::from_f32(-0.7)),
            |_, _| KBlock {
                sc: [63; 2],
                mn: 63,
                q: std::array::from_fn(|c| if c == 0 { 0 } else { top }),
            },
        )
    };
    let mats = [
        QMatrix::quantize_q4_1(rows, cols, &w).unwrap(),
        QMatrix::quantize_q8_0(rows, cols, &signed).unwrap(),
        // Five-bit quants of 31: the AVX2 kernel's 16-bit sums reach 4·2·31·127 = 31,496.
        QMatrix::from_five_bit_blocks(rows, cols, |_, _| RowBlock {
            d: 0.5,
            m: -8.0,
            q: std::array::from_fn(|c| if c == 0 { 0 } else { 31 }),
        }),
        QMatrix::from_q5_0_blocks(rows, cols, |_, _| RowBlock {
            d: 0.5,
            m: 0.0,
            q: std::array::from_fn(|c| if c == 0 { 0 } else { 31 }),
        }),
        k_nibbles(KQuant::Q4K, 15),
        k_nibbles(KQuant::Q5K, 31),
        six_bits(
            &|r, c| if (r + c / 7) % 2 == 0 { 63 } else { 0 },
            [127, -128],
        ),
        six_bits(&|_, _| 63, [-128, 127]),
        six_bits(&|_, _| 0, [127, 127]),
    ];
    for x in [
        vec![1.0f32; ROWS * SUPER_BLOCK],
        vec![-1.0f32; ROWS * SUPER_BLOCK],
        signed
            .iter()
            .cycle()
            .take(ROWS * SUPER_BLOCK)
            .copied()
            .collect(),
    ] {
        for w in &mats {
            let cols = w.cols();
            let x: Vec<f32> = x
                .chunks(SUPER_BLOCK)
                .flat_map(|r| &r[..cols])
                .copied()
                .collect();
            let mut a = QRows::default();
            a.quantize(&x, cols);
            let mut pool = Pool::new(1);
            let mut scalar = vec![0.0; ROWS * rows];
            matmul(Isa::Scalar, w, &a, &mut scalar, &mut pool);
            let want = reference(w, &x, cols);
            for (g, e) in scalar.iter().zip(&want) {
                assert!((g - e).abs() < 0.05 + 0.01 * e.abs(), "scalar: {g} vs {e}");
            }
            for isa in Isa::available() {
                let mut got = vec![0.0; ROWS * rows];
                matmul(isa, w, &a, &mut got, &mut pool);
                assert_eq!(got, scalar, "{isa:?}");
            }
        }
    }
}

#[test]
fn activations_quantize_to_the_same_bits_on_every_isa() {
    let cols = 128;
    let mut x = pseudo(5 * cols, 11);
    x[..32].fill(0.0); // an all-zero block: scale 0
    x[32] = 1e-30; // a tiny maximum
    for (i, v) in x[64..96].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 1e4; // large values, and exact ties after scaling
    }
    x[96..128].copy_from_slice(&[-127.0, 127.0, 63.5, -63.5, 0.5, -0.5, 1.5, -1.5].repeat(4));
    let mut want = QRows::default();
    want.quantize(&x, cols);
    for (b, q) in want.qs.iter().enumerate() {
        let block = &x[b * BLOCK..][..BLOCK];
        let d = want.d[b];
        for (&v, &q) in block.iter().zip(q) {
            let exact = if d > 0.0 { v / d } else { 0.0 };
            assert!(
                (q as f32 - exact).abs() <= 0.5 + 1e-3,
                "{v} → {q} (scale {d})"
            );
        }
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        assert_eq!(want.s[b], d * sum as f32);
    }
    let long: Vec<f32> = x.iter().cycle().take(40 * cols).copied().collect();
    let mut want_long = QRows::default();
    want_long.quantize(&long, cols);
    for isa in Isa::available() {
        for threads in [2, 3] {
            let mut got = QRows::default();
            got.quantize_on_pool(isa, &mut Pool::new(threads), &long, cols);
            assert_eq!((&got.d, &got.s), (&want_long.d, &want_long.s), "{isa:?}");
            assert_eq!(
                (&got.qs, &got.sums),
                (&want_long.qs, &want_long.sums),
                "{isa:?}"
            );
        }
        let mut got = QRows::default();
        got.quantize_on(isa, &x, cols);
        assert_eq!(got.d, want.d, "{isa:?}");
        assert_eq!(got.s, want.s, "{isa:?}");
        assert_eq!(got.qs, want.qs, "{isa:?}");
        assert_eq!(got.sums, want.sums, "{isa:?}");
    }
}

#[test]
fn every_isa_gives_the_scalar_bits_matches_the_dequantized_product_and_is_batch_invariant() {
    let rows = 150;
    let mats = every_type(150, 7);
    let isas = Isa::available();
    for (mi, w) in mats.iter().enumerate() {
        let cols = w.cols();
        // Every count of rows one walk over a tile takes, and walks of every size after.
        for k in [1usize, 2, 3, 4, 5, 7, 8, 9, 17] {
            let x = pseudo(k * cols, 3 + k as u32);
            let mut a = QRows::default();
            a.quantize(&x, cols);
            // The product of the weights with the activations as quantized: the kernels'
            // only error against it is float rounding.
            let quantized: Vec<f32> = (0..k * cols)
                .map(|i| a.d[i / BLOCK] * a.qs[i / BLOCK][i % BLOCK] as f32)
                .collect();
            let want = reference(w, &quantized, cols);
            for &isa in &isas {
                for threads in [1, 2] {
                    let mut pool = Pool::new(threads);
                    let mut got = vec![0.0; k * rows];
                    matmul(isa, w, &a, &mut got, &mut pool);
                    for (g, e) in got.iter().zip(&want) {
                        let tolerance = 1e-4 + 1e-5 * e.abs();
                        assert!((g - e).abs() < tolerance, "{isa:?} matrix {mi}: {g} vs {e}");
                    }
                    // Row r alone gives the same bits as row r inside the batch.
                    let mut scalar = vec![0.0; k * rows];
                    matmul(Isa::Scalar, w, &a, &mut scalar, &mut pool);
                    assert_eq!(got, scalar, "{isa:?} differs from the scalar reference");
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

/// The unpacked walks carry each row's sums from one buffer of blocks to the next: every
/// weight type over 40 blocks (two full buffers and part of a third), with the row counts
/// that take them on some ISA, gives the scalar bits on every ISA.
#[test]
fn unpacked_walks_over_several_buffers_give_the_scalar_bits() {
    let (rows, cols) = (40, 5 * SUPER_BLOCK);
    let mats = [
        QMatrix::quantize_q4_1(rows, cols, &pseudo(rows * cols, 61)).unwrap(),
        five_bits(rows, cols, 62, "q5_0"),
        five_bits(rows, cols, 63, "q5_1"),
        k_quants(KQuant::Q4K, rows, cols, 64),
        k_quants(KQuant::Q5K, rows, cols, 65),
        k_quants(KQuant::Q6K, rows, cols, 66),
    ];
    let mut pool = Pool::new(2);
    for w in &mats {
        for k in [5, 9, 12, 16] {
            let mut a = QRows::default();
            a.quantize(&pseudo(k * cols, 67 + k as u32), cols);
            let mut scalar = vec![0.0; k * rows];
            matmul(Isa::Scalar, w, &a, &mut scalar, &mut pool);
            for isa in Isa::available() {
                let mut got = vec![0.0; k * rows];
                matmul(isa, w, &a, &mut got, &mut pool);
                assert_eq!(got, scalar, "{isa:?}, {k} rows");
            }
        }
    }
}

/// Several matrices in one section give the bits of separate products, whatever the
/// split of their groups across the threads (sizes that put part boundaries inside each
/// matrix and between them).
#[test]
fn products_together_are_products_apart() {
    let cols = 256;
    let mats = [
        QMatrix::quantize_q4_1(200, cols, &pseudo(200 * cols, 21)).unwrap(),
        QMatrix::quantize_q8_0(48, cols, &pseudo(48 * cols, 22)).unwrap(),
        QMatrix::quantize_q4_1(130, cols, &pseudo(130 * cols, 23)).unwrap(),
        k_quants(KQuant::Q4K, 40, cols, 25),
        k_quants(KQuant::Q6K, 70, cols, 26),
    ];
    let k = 5;
    let mut a = QRows::default();
    a.quantize(&pseudo(k * cols, 24), cols);
    for &isa in &Isa::available() {
        for threads in [1, 2, 3] {
            let mut pool = Pool::new(threads);
            let mut outs: Vec<Vec<f32>> = mats.iter().map(|w| vec![0.0; k * w.rows]).collect();
            let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            matmul_many(
                isa,
                &mats.iter().collect::<Vec<_>>(),
                &a,
                &mut slices,
                &mut pool,
            );
            for (w, got) in mats.iter().zip(&outs) {
                let mut want = vec![0.0; k * w.rows];
                matmul(isa, w, &a, &mut want, &mut pool);
                assert_eq!(got, &want, "{isa:?}, {threads} threads, {} rows", w.rows);
                // Each activation row's outputs straight into a row of their own.
                let mut rows = vec![vec![0.0; w.rows]; k];
                let mut outs: Vec<&mut [f32]> = rows.iter_mut().map(|r| &mut r[..]).collect();
                matmul_into_rows(isa, w, &a, &mut outs, &mut pool);
                assert_eq!(rows.concat(), want, "{isa:?}, {threads} threads, into rows");
            }
        }
    }
}

/// Each row's greedy pick of a product, found as the product goes, is `greedy_pick` of the
/// row the product writes: every weight type, ISA, row count and thread split; and where
/// outputs tie (weight rows repeated every three, so every thread's share holds the largest
/// value), the smallest id.
#[test]
fn greedy_picks_are_the_first_largest_output_of_each_row() {
    let repeated = |w: &QMatrix| {
        let mut row = vec![0.0; w.cols()];
        let values: Vec<f32> = (0..w.rows())
            .flat_map(|j| {
                w.dequantize_row(j % 3, &mut row);
                row.clone()
            })
            .collect();
        QMatrix::quantize_q8_0(w.rows(), w.cols(), &values).unwrap()
    };
    let mats = every_type(150, 11);
    let tied = repeated(&mats[0]);
    for (mi, w) in mats.iter().chain([&tied]).enumerate() {
        let (rows, cols) = (w.rows(), w.cols());
        for k in [1usize, 3, 9, 17] {
            let mut a = QRows::default();
            a.quantize(&pseudo(k * cols, 40 + k as u32), cols);
            for &isa in &Isa::available() {
                for threads in [1, 2, 3] {
                    let mut pool = Pool::new(threads);
                    let mut full = vec![0.0; k * rows];
                    matmul(isa, w, &a, &mut full, &mut pool);
                    let want: Vec<_> = full.chunks(rows).map(crate::lm::greedy_pick).collect();
                    let got = matmul_picks(isa, w, &a, &mut pool);
                    assert_eq!(
                        got, want,
                        "{isa:?}, matrix {mi}, {k} rows, {threads} threads"
                    );
                    if mi == mats.len() {
                        assert!(got.iter().all(|p| p.is_some_and(|p| p.0 < 3)), "ties");
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "shorter than the tiles")]
fn a_walk_refuses_activation_rows_shorter_than_its_tiles() {
    // The x86 walks index a row's blocks unchecked, so `tile_rows` checks every row first:
    // here 2 blocks of activations against a group of 4 blocks' tiles.
    let w = QMatrix::quantize_q8_0(16, 128, &pseudo(16 * 128, 3)).unwrap();
    let mut a = QRows::default();
    a.quantize(&pseudo(64, 4), 64);
    let mut out = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
    tile_rows(Isa::detect(), w.group(0), &[a.row(0)], &mut out);
}
