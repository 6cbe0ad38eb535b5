//! The scalar kernel: the reference every ISA reproduces bit for bit.

use super::*;

/// The reference every ISA reproduces bit for bit: per block, the exact integer dot product
/// `isum`, then `acc = fma(isum·d_a, d_w, acc)` and, for nibbles with offsets, `acc = fma(m_w,
/// d_a·Σq_a, acc)`. Q6_K blocks take the two halves' sums in turn.
pub(super) fn tile_scalar<const N: usize>(
    tiles: Tiles,
    rows: &[Row; N],
    out: &mut [[f32; TILE_ROWS]; N],
) {
    for (row, o) in rows.iter().zip(out.iter_mut()) {
        for (i, acc) in o.iter_mut().enumerate() {
            *acc = match tiles {
                Tiles::Q4_1(tiles) => nibbles_scalar(tiles, &[], row, i),
                Tiles::Q5_0(tiles) => nibbles_scalar(tiles, &[], row, i),
                Tiles::Q5(tiles) => nibbles_scalar(tiles, &[], row, i),
                Tiles::Q4K(tiles, supers) => nibbles_scalar(tiles, supers, row, i),
                Tiles::Q5K(tiles, supers) => nibbles_scalar(tiles, supers, row, i),
                Tiles::Q8_0(tiles) => {
                    let mut acc = 0.0f32;
                    for (b, tile) in tiles.iter().enumerate() {
                        let isum: i32 = (0..BLOCK)
                            .map(|c| unbiased(tile.qs[c / 4][4 * i + c % 4]) * row.qs[b][c] as i32)
                            .sum();
                        let t = isum as f32 * row.d[b];
                        acc = t.mul_add(tile.d[i].to_f32(), acc);
                    }
                    acc
                }
                Tiles::Q6K(tiles, supers) => {
                    let mut acc = 0.0f32;
                    for (b, tile) in tiles.iter().enumerate() {
                        let d = supers[b / 8].d[i].to_f32();
                        for h in 0..2 {
                            let isum: i32 = (16 * h..16 * h + 16)
                                .map(|c| six_bits(tile, i, c) as i32 * row.qs[b][c] as i32)
                                .sum();
                            let isum = isum - 32 * row.sums[b][h];
                            let t = isum as f32 * row.d[b];
                            acc = t.mul_add(d * tile.sc[h][i] as f32, acc);
                        }
                    }
                    acc
                }
            };
        }
    }
}

/// The super-block of block `b` of a group (`supers` empty for tiles without).
#[inline(always)]
pub(super) fn super_of<T: NibbleTile>(supers: &[SuperScales], b: usize) -> &SuperScales {
    if T::K {
        &supers[b / 8]
    } else {
        &NO_SUPER
    }
}

pub(super) fn nibbles_scalar<T: NibbleTile>(
    tiles: &[T],
    supers: &[SuperScales],
    row: &Row,
    i: usize,
) -> f32 {
    let mut acc = 0.0f32;
    for (b, tile) in tiles.iter().enumerate() {
        let isum: i32 = (0..BLOCK)
            .map(|c| nibble(tile, i, c) as i32 * row.qs[b][c] as i32)
            .sum();
        let [h0, h1] = row.sums[b];
        let isum = isum - T::CENTER * (h0 + h1);
        let t = isum as f32 * row.d[b];
        let scales = tile.scales(super_of::<T>(supers, b));
        acc = t.mul_add(scales.d(i), acc);
        if T::CENTER == 0 {
            acc = scales.m(i).mul_add(row.s[b], acc);
        }
    }
    acc
}
