//! Repacking a matrix of GGUF blocks into tiles at load, and reading values back (rows,
//! dequantization) for the paths that need floats.

use super::*;
use half::f16;

impl QMatrix {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(super) fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// The bytes its tiles (and super-block scales) take: what a pass over all its rows
    /// reads from memory.
    pub fn bytes(&self) -> usize {
        fn k<T: Copy>(k: &KTiles<T>) -> usize {
            std::mem::size_of_val(&k.tiles[..]) + std::mem::size_of_val(k.supers.as_slice())
        }
        match &self.quants {
            Quants::Q4_1(t) => std::mem::size_of_val(&t[..]),
            Quants::Q5_0(t) => std::mem::size_of_val(&t[..]),
            Quants::Q5(t) => std::mem::size_of_val(&t[..]),
            Quants::Q8_0(t) => std::mem::size_of_val(&t[..]),
            Quants::Q4K(t) => k(t),
            Quants::Q5K(t) => k(t),
            Quants::Q6K(t) => k(t),
        }
    }

    pub(super) fn groups(&self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }

    /// Tiles `rows × cols` from `block(row, b)`; padding rows are zero.
    pub(super) fn tiled<B, T: Copy>(
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize) -> B,
        empty: T,
        put: impl Fn(&mut T, usize, &B),
    ) -> PageBuf<T> {
        let nb = cols / BLOCK;
        let groups = rows.div_ceil(TILE_ROWS);
        let mut tiles = PageBuf::filled(groups * nb, empty);
        for (t, tile) in tiles.iter_mut().enumerate() {
            let (g, b) = (t / nb, t % nb);
            for i in 0..TILE_ROWS {
                let r = g * TILE_ROWS + i;
                if r < rows {
                    put(tile, i, &block(r, b));
                }
            }
        }
        tiles
    }

    /// Row i's scale and offset in a nibble tile (or a five-bit tile's scales).
    pub(super) fn put_row_scales(tile: &mut Q4Tile, i: usize, rb: &RowBlock<u8>) {
        tile.d[i] = f16::from_f32(rb.d);
        tile.m[i] = f16::from_f32(rb.m);
    }

    /// Row i's scale, offset and low four bits of its quants in a nibble tile.
    pub(super) fn put_nibble_row(tile: &mut Q4Tile, i: usize, rb: &RowBlock<u8>) {
        Self::put_row_scales(tile, i, rb);
        put_nibbles(&mut tile.qs, i, &rb.q);
    }

    /// A matrix of Q5_0 blocks (`value = d·(q − 16)`, `q` in 0..32, `d` an f16; `m` ignored).
    pub fn from_q5_0_blocks(
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize) -> RowBlock<u8>,
    ) -> QMatrix {
        let empty = Q5_0Tile {
            qs: [[0; 64]; 4],
            high: [0; 64],
            d: [f16::ZERO; TILE_ROWS],
        };
        let tiles = Self::tiled(rows, cols, block, empty, |tile, i, rb| {
            tile.d[i] = f16::from_f32(rb.d);
            put_five_bits(&mut tile.qs, &mut tile.high, i, &rb.q);
        });
        QMatrix {
            rows,
            cols,
            quants: Quants::Q5_0(tiles),
        }
    }

    /// A matrix of five-bit blocks with offsets (`q` in 0..32; `d` and `m` f16 values: Q5_1).
    pub fn from_five_bit_blocks(
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize) -> RowBlock<u8>,
    ) -> QMatrix {
        let empty = Q5Tile {
            low: Q4Tile::EMPTY,
            high: [0; 64],
        };
        let tiles = Self::tiled(rows, cols, block, empty, |tile, i, rb| {
            Self::put_row_scales(&mut tile.low, i, rb);
            put_five_bits(&mut tile.low.qs, &mut tile.high, i, &rb.q);
        });
        QMatrix {
            rows,
            cols,
            quants: Quants::Q5(tiles),
        }
    }

    /// A matrix of nibble blocks (`q` in 0..16; `d` and `m` f16 values: Q4_1, Q4_0).
    pub fn from_nibble_blocks(
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize) -> RowBlock<u8>,
    ) -> QMatrix {
        let tiles = Self::tiled(rows, cols, block, Q4Tile::EMPTY, Self::put_nibble_row);
        QMatrix {
            rows,
            cols,
            quants: Quants::Q4_1(tiles),
        }
    }

    /// A K-quant matrix (`cols` a multiple of [`SUPER_BLOCK`]): `block(row, b)` gives block
    /// b's quants and factors, `sup(row, s)` super-block s's f16 scale `d` and offset scale
    /// `m` (ggml's `−dmin`; 0 for Q6_K).
    pub fn from_k_blocks(
        kind: KQuant,
        rows: usize,
        cols: usize,
        sup: impl Fn(usize, usize) -> (f16, f16),
        block: impl Fn(usize, usize) -> KBlock,
    ) -> QMatrix {
        assert!(cols.is_multiple_of(SUPER_BLOCK), "K-quant columns");
        let per_group = cols / SUPER_BLOCK;
        let mut supers = vec![NO_SUPER; rows.div_ceil(TILE_ROWS) * per_group];
        for r in 0..rows {
            for s in 0..per_group {
                let (d, m) = sup(r, s);
                let at = &mut supers[r / TILE_ROWS * per_group + s];
                at.d[r % TILE_ROWS] = d;
                at.m[r % TILE_ROWS] = m;
            }
        }
        let quants = match kind {
            KQuant::Q4K => {
                let empty = Q4KTile {
                    qs: [[0; 64]; 4],
                    sc: [0; TILE_ROWS],
                    mn: [0; TILE_ROWS],
                };
                let tiles = Self::tiled(rows, cols, block, empty, |tile, i, kb| {
                    (tile.sc[i], tile.mn[i]) = (kb.sc[0] as u8, kb.mn);
                    put_nibbles(&mut tile.qs, i, &kb.q);
                });
                Quants::Q4K(KTiles { tiles, supers })
            }
            KQuant::Q5K => {
                let empty = Q5KTile {
                    qs: [[0; 64]; 4],
                    high: [0; 64],
                    sc: [0; TILE_ROWS],
                    mn: [0; TILE_ROWS],
                };
                let tiles = Self::tiled(rows, cols, block, empty, |tile, i, kb| {
                    (tile.sc[i], tile.mn[i]) = (kb.sc[0] as u8, kb.mn);
                    put_five_bits(&mut tile.qs, &mut tile.high, i, &kb.q);
                });
                Quants::Q5K(KTiles { tiles, supers })
            }
            KQuant::Q6K => {
                let empty = Q6KTile {
                    qs: [[0; 64]; 4],
                    high: [[0; 64]; 2],
                    sc: [[0; TILE_ROWS]; 2],
                };
                let tiles = Self::tiled(rows, cols, block, empty, |tile, i, kb| {
                    tile.sc[0][i] = kb.sc[0];
                    tile.sc[1][i] = kb.sc[1];
                    put_nibbles(&mut tile.qs, i, &kb.q);
                    for (c, &q) in kb.q.iter().enumerate() {
                        let t = c / 4;
                        tile.high[t / 4][4 * i + c % 4] |= (q >> 4 & 3) << (2 * (t % 4));
                    }
                });
                Quants::Q6K(KTiles { tiles, supers })
            }
        };
        QMatrix { rows, cols, quants }
    }

    /// A matrix of signed-byte blocks with one scale per block (Q8_0: `q` in −127..=127;
    /// `m` ignored).
    pub fn from_byte_blocks(
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize) -> RowBlock<i8>,
    ) -> QMatrix {
        let empty = Q8_0Tile {
            qs: [[128; 64]; 8],
            d: [f16::ZERO; TILE_ROWS],
        };
        let tiles = Self::tiled(rows, cols, block, empty, |tile, i, rb| {
            // Q8_0's scales are f16 values, kept exactly.
            tile.d[i] = f16::from_f32(rb.d);
            debug_assert_eq!(tile.d[i].to_f32(), rb.d, "a Q8_0 scale that is no f16");
            // ggml writes −128 never; clamp so the AVX2 sign trick stays exact regardless.
            for (c, &q) in rb.q.iter().enumerate() {
                tile.qs[c / 4][4 * i + c % 4] = biased(q);
            }
        });
        QMatrix {
            rows,
            cols,
            quants: Quants::Q8_0(tiles),
        }
    }

    /// Quantizes `values` (`rows × cols`, row-major) to Q8_0, as ggml does: quants by the f32
    /// scale `amax/127`, the scale then stored in f16.
    pub fn quantize_q8_0(rows: usize, cols: usize, values: &[f32]) -> Option<QMatrix> {
        if !cols.is_multiple_of(BLOCK) || values.len() != rows * cols {
            return None;
        }
        Some(Self::from_byte_blocks(rows, cols, |r, b| {
            let (d, q, _) = quantize_block(&values[r * cols + b * BLOCK..][..BLOCK]);
            RowBlock {
                d: f16::from_f32(d).to_f32(),
                m: 0.0,
                q,
            }
        }))
    }

    /// Quantizes `values` (`rows × cols`, row-major) to Q4_1, as ggml does: per block of 32,
    /// `d = (max − min)/15` and the minimum as offset, both stored in f16.
    pub fn quantize_q4_1(rows: usize, cols: usize, values: &[f32]) -> Option<QMatrix> {
        if !cols.is_multiple_of(BLOCK) || values.len() != rows * cols {
            return None;
        }
        Some(Self::from_nibble_blocks(rows, cols, |r, b| {
            let x = &values[r * cols + b * BLOCK..][..BLOCK];
            let min = x.iter().copied().fold(f32::MAX, f32::min);
            let max = x.iter().copied().fold(f32::MIN, f32::max);
            let d = (max - min) / 15.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            RowBlock {
                d: f16::from_f32(d).to_f32(),
                m: f16::from_f32(min).to_f32(),
                q: std::array::from_fn(|c| ((x[c] - min) * id).round().clamp(0.0, 15.0) as u8),
            }
        }))
    }

    /// Writes row `r`, dequantized, into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        let (g, i) = (r / TILE_ROWS, r % TILE_ROWS);
        for (b, chunk) in out[..self.cols].chunks_exact_mut(BLOCK).enumerate() {
            let t = g * nb + b;
            match &self.quants {
                Quants::Q4_1(tiles) => dequantize_nibbles(&tiles[t], &NO_SUPER, i, chunk),
                Quants::Q5_0(tiles) => dequantize_nibbles(&tiles[t], &NO_SUPER, i, chunk),
                Quants::Q5(tiles) => dequantize_nibbles(&tiles[t], &NO_SUPER, i, chunk),
                Quants::Q4K(k) => {
                    dequantize_nibbles(&k.tiles[t], &k.group_supers(g, nb)[b / 8], i, chunk)
                }
                Quants::Q5K(k) => {
                    dequantize_nibbles(&k.tiles[t], &k.group_supers(g, nb)[b / 8], i, chunk)
                }
                Quants::Q8_0(tiles) => {
                    let tile = &tiles[t];
                    for (c, x) in chunk.iter_mut().enumerate() {
                        *x = tile.d[i].to_f32() * unbiased(tile.qs[c / 4][4 * i + c % 4]) as f32;
                    }
                }
                Quants::Q6K(k) => {
                    let (tile, d) = (&k.tiles[t], k.group_supers(g, nb)[b / 8].d[i].to_f32());
                    for (c, x) in chunk.iter_mut().enumerate() {
                        let q = six_bits(tile, i, c) as i32 - 32;
                        *x = d * tile.sc[c / 16][i] as f32 * q as f32;
                    }
                }
            }
        }
    }
}

pub(super) fn dequantize_nibbles<T: NibbleTile>(
    tile: &T,
    sup: &SuperScales,
    i: usize,
    out: &mut [f32],
) {
    let scales = tile.scales(sup);
    let d = scales.d(i);
    for (c, x) in out.iter_mut().enumerate() {
        *x = match T::CENTER {
            0 => d * nibble(tile, i, c) as f32 + scales.m(i),
            center => d * (nibble(tile, i, c) as i32 - center) as f32,
        };
    }
}
