//! The tile formats: 16 weight rows × one block of 32 columns per tile, each GGUF block type
//! at its file's size or within 0.13 bits of it, and how a tile's quants are read back.

use super::*;
use half::f16;

/// A weight matrix of `rows × cols` (output features × input features) in quantized tiles.
pub struct QMatrix {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) quants: Quants,
}

/// Tiles in group-major order: tile `g·nb + b` holds rows `16g..16g+16`, block `b`. Rows past
/// `rows` (padding of the last group) are zero.
pub(super) enum Quants {
    /// Nibbles with f16 scales and offsets (Q4_1, Q4_0).
    Q4_1(PageBuf<Q4Tile>),
    /// Five-bit quants with f16 scales and no offsets (Q5_0: `d·(q − 16)`).
    Q5_0(PageBuf<Q5_0Tile>),
    /// Five-bit quants with f16 scales and offsets (Q5_1).
    Q5(PageBuf<Q5Tile>),
    /// Bytes with one f16 scale per block (Q8_0).
    Q8_0(PageBuf<Q8_0Tile>),
    /// Q4_K: nibbles with integer factors of the super-block's scales.
    Q4K(KTiles<Q4KTile>),
    /// Q5_K: five-bit quants with integer factors of the super-block's scales.
    Q5K(KTiles<Q5KTile>),
    /// Q6_K: six-bit quants with a signed integer factor per half block.
    Q6K(KTiles<Q6KTile>),
}

/// A K-quant matrix: its tiles, and the f16 scales of each group's super-blocks (entry
/// `g·nb/8 + b/8` for tile `g·nb + b`), kept once per 8 tiles as the file keeps them once
/// per 256 columns.
pub(super) struct KTiles<T: Copy> {
    pub(super) tiles: PageBuf<T>,
    pub(super) supers: Vec<SuperScales>,
}

impl<T: Copy> KTiles<T> {
    /// Group g's super-blocks, for `nb` blocks a row.
    pub(super) fn group_supers(&self, g: usize, nb: usize) -> &[SuperScales] {
        &self.supers[g * nb / 8..(g + 1) * nb / 8]
    }
}

/// The f16 scale `d` and offset scale `m` (ggml's `−dmin`; unused by Q6_K) of 16 rows' super-
/// block: a K-quant block's scale is `d·sc` and its offset `m·mn`, both exact in f32.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct SuperScales {
    pub(super) d: [f16; TILE_ROWS],
    pub(super) m: [f16; TILE_ROWS],
}

/// What tiles without super-blocks pass for one (never read).
pub(super) const NO_SUPER: SuperScales = SuperScales {
    d: [f16::ZERO; TILE_ROWS],
    m: [f16::ZERO; TILE_ROWS],
};

/// 16 rows × 32 columns of nibbles (`value = d·q + m`, q in 0..16); 320 bytes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Q4Tile {
    /// Chunk t, byte 4·i + c: row i's quant at column 4t + c in the low nibble and at column
    /// 4(t + 4) + c in the high nibble.
    pub(super) qs: [[u8; 64]; 4],
    pub(super) d: [f16; TILE_ROWS],
    pub(super) m: [f16; TILE_ROWS],
}

impl Q4Tile {
    pub(super) const EMPTY: Q4Tile = Q4Tile {
        qs: [[0; 64]; 4],
        d: [f16::ZERO; TILE_ROWS],
        m: [f16::ZERO; TILE_ROWS],
    };
}

/// 16 rows × 32 columns of five-bit quants (`value = d·q + m`, q in 0..32): a nibble tile's
/// chunks and scales holding [five-bit bytes](put_five_bits), their top bits beside them; 384
/// bytes (6 bits a weight).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Q5Tile {
    pub(super) low: Q4Tile,
    pub(super) high: TopBits,
}

/// The top bits of a five-bit tile's chunks: byte 4·i + c, bits 2t..2t + 2, are bits 3 and 4
/// of row i's quant at column 4(t + 4) + c (byte 4·i + c of unpacked register t + 4, whose
/// low three bits chunk t keeps), so one shift and a mask put a register's bits in place.
pub(super) type TopBits = [u8; 64];

/// 16 rows × 32 columns of Q5_0 (`value = d·(q − 16)`, q in 0..32): a [`Q5Tile`] without
/// offsets, the 16 taken out of the integer sum (`16·Σq_a`, from [`QRows`]); 352 bytes, 5.5
/// bits a weight as in ggml's blocks.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct Q5_0Tile {
    pub(super) qs: [[u8; 64]; 4],
    pub(super) high: TopBits,
    pub(super) d: [f16; TILE_ROWS],
}

/// 16 rows × 32 columns of Q4_K (`value = d·sc·q + m·mn`, q in 0..16, the 6-bit factors
/// `sc` and `mn` per row, `d` and `m` from the super-block); 288 bytes, 4.6 bits a weight
/// with the super-block's scales (the file's: 4.5).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct Q4KTile {
    pub(super) qs: [[u8; 64]; 4],
    pub(super) sc: [u8; TILE_ROWS],
    pub(super) mn: [u8; TILE_ROWS],
}

/// 16 rows × 32 columns of Q5_K: a [`Q4KTile`] holding five-bit bytes and their top bits as in
/// [`Q5Tile`]; 352 bytes, 5.6 bits a weight with the super-block's scales (the file's: 5.5).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct Q5KTile {
    pub(super) qs: [[u8; 64]; 4],
    pub(super) high: TopBits,
    pub(super) sc: [u8; TILE_ROWS],
    pub(super) mn: [u8; TILE_ROWS],
}

/// 16 rows × 32 columns of Q6_K (`value = d·sc[h]·(q − 32)` in half h = column / 16, q in
/// 0..64, `sc` a signed byte per row and half, `d` from the super-block): the low four bits
/// as a nibble tile, the top two in a plane beside them, the 32 taken out of the integer sums
/// (`32·Σq_a` per half); 416 bytes, 6.6 bits a weight with the super-block's scales (the
/// file's: 6.56).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct Q6KTile {
    pub(super) qs: [[u8; 64]; 4],
    /// Plane p, byte 4·i + c, bits 2k..2k + 2: the top two bits of row i's quant at column
    /// 4(4p + k) + c (unpacked register 4p + k's byte, shifted into place by one shift).
    pub(super) high: [[u8; 64]; 2],
    pub(super) sc: [[i8; TILE_ROWS]; 2],
}

/// A tile's rows' scales and offsets (the offsets unread where [`NibbleTile::CENTER`] is not 0).
#[derive(Clone, Copy)]
pub(super) enum Scales<'a> {
    /// f16 values kept in the tile.
    Kept {
        d: &'a [f16; TILE_ROWS],
        m: &'a [f16; TILE_ROWS],
    },
    /// K-quants: each row's integer factors of its super-block's f16 scales.
    Factors {
        sc: &'a [u8; TILE_ROWS],
        mn: &'a [u8; TILE_ROWS],
        sup: &'a SuperScales,
    },
}

impl Scales<'_> {
    /// Row i's scale.
    #[inline(always)]
    pub(super) fn d(self, i: usize) -> f32 {
        match self {
            Scales::Kept { d, .. } => d[i].to_f32(),
            Scales::Factors { sc, sup, .. } => sup.d[i].to_f32() * sc[i] as f32,
        }
    }

    /// Row i's offset.
    #[inline(always)]
    pub(super) fn m(self, i: usize) -> f32 {
        match self {
            Scales::Kept { m, .. } => m[i].to_f32(),
            Scales::Factors { mn, sup, .. } => sup.m[i].to_f32() * mn[i] as f32,
        }
    }
}

/// The tiles whose quants are four chunks of bytes: nibbles, or five-bit bytes with a plane of
/// top bits (`high`) for the five-bit tiles. One kernel for all, the offset taken either from
/// the integer sum ([`NibbleTile::CENTER`]) or as `m·d_a·Σq_a` (each compiled out where unused).
pub(super) trait NibbleTile: Copy + 'static {
    /// What a stored quant exceeds the signed one by (Q5_0: 16), subtracted in integers; 0
    /// where the tile keeps offsets `m` instead.
    const CENTER: i32;
    /// The [`QRows`] start that takes `CENTER·Σq_a` out (none where `CENTER` is 0).
    const START: Option<Start>;
    /// Scales come from super-blocks (K-quants).
    const K: bool;
    /// Quants of five bits ([`NibbleTile::high`] is `Some`), whose 16-bit pair sums the
    /// AVX2 walk widens twice a block instead of once.
    const FIVE_BITS: bool;
    fn qs(&self) -> &[[u8; 64]; 4];
    fn high(&self) -> Option<&TopBits>;
    /// The rows' scales, `sup` being the tile's super-block's (never read unless [`NibbleTile::K`]).
    fn scales<'a>(&'a self, sup: &'a SuperScales) -> Scales<'a>;
}

impl NibbleTile for Q4Tile {
    const CENTER: i32 = 0;
    const START: Option<Start> = None;
    const K: bool = false;
    const FIVE_BITS: bool = false;
    #[inline(always)]
    fn qs(&self) -> &[[u8; 64]; 4] {
        &self.qs
    }
    #[inline(always)]
    fn high(&self) -> Option<&TopBits> {
        None
    }
    #[inline(always)]
    fn scales<'a>(&'a self, _: &'a SuperScales) -> Scales<'a> {
        Scales::Kept {
            d: &self.d,
            m: &self.m,
        }
    }
}

impl NibbleTile for Q5Tile {
    const CENTER: i32 = 0;
    const START: Option<Start> = None;
    const K: bool = false;
    const FIVE_BITS: bool = true;
    #[inline(always)]
    fn qs(&self) -> &[[u8; 64]; 4] {
        &self.low.qs
    }
    #[inline(always)]
    fn high(&self) -> Option<&TopBits> {
        Some(&self.high)
    }
    #[inline(always)]
    fn scales<'a>(&'a self, _: &'a SuperScales) -> Scales<'a> {
        self.low.scales(&NO_SUPER)
    }
}

impl NibbleTile for Q5_0Tile {
    const CENTER: i32 = 16;
    const START: Option<Start> = Some(Start::Q5_0);
    const K: bool = false;
    const FIVE_BITS: bool = true;
    #[inline(always)]
    fn qs(&self) -> &[[u8; 64]; 4] {
        &self.qs
    }
    #[inline(always)]
    fn high(&self) -> Option<&TopBits> {
        Some(&self.high)
    }
    /// No offsets: the scales stand in, never read.
    #[inline(always)]
    fn scales<'a>(&'a self, _: &'a SuperScales) -> Scales<'a> {
        Scales::Kept {
            d: &self.d,
            m: &self.d,
        }
    }
}

impl NibbleTile for Q4KTile {
    const CENTER: i32 = 0;
    const START: Option<Start> = None;
    const K: bool = true;
    const FIVE_BITS: bool = false;
    #[inline(always)]
    fn qs(&self) -> &[[u8; 64]; 4] {
        &self.qs
    }
    #[inline(always)]
    fn high(&self) -> Option<&TopBits> {
        None
    }
    #[inline(always)]
    fn scales<'a>(&'a self, sup: &'a SuperScales) -> Scales<'a> {
        Scales::Factors {
            sc: &self.sc,
            mn: &self.mn,
            sup,
        }
    }
}

impl NibbleTile for Q5KTile {
    const CENTER: i32 = 0;
    const START: Option<Start> = None;
    const K: bool = true;
    const FIVE_BITS: bool = true;
    #[inline(always)]
    fn qs(&self) -> &[[u8; 64]; 4] {
        &self.qs
    }
    #[inline(always)]
    fn high(&self) -> Option<&TopBits> {
        Some(&self.high)
    }
    #[inline(always)]
    fn scales<'a>(&'a self, sup: &'a SuperScales) -> Scales<'a> {
        Scales::Factors {
            sc: &self.sc,
            mn: &self.mn,
            sup,
        }
    }
}

/// 16 rows × 32 columns of Q8_0 (`value = d·q`, q in −127..=127, d an f16); 544 bytes,
/// 8.5 bits a weight as in ggml's blocks.
///
/// The quants are kept as `q + 128` (unsigned): VNNI's `vpdpbusd` multiplies unsigned by
/// signed bytes, so the weights take the unsigned side and the activations stay signed; the
/// kernels then subtract `128·Σq_a`, one number per activation block (held by [`QRows`]),
/// where a signed-weight layout would need `128·Σq_w` stored beside every weight row.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct Q8_0Tile {
    /// Chunk t, byte 4·i + c: row i's quant at column 4t + c, plus 128.
    pub(super) qs: [[u8; 64]; 8],
    pub(super) d: [f16; TILE_ROWS],
}

/// A signed quant as the byte tiles keep it.
#[inline(always)]
pub(super) fn biased(q: i8) -> u8 {
    q.max(-127) as u8 ^ 0x80
}

/// A byte tile's quant back as a signed integer.
#[inline(always)]
pub(super) fn unbiased(u: u8) -> i32 {
    u as i32 - 128
}

/// One block of 32 columns of one weight row, decoded from a file's format: `value = d·q + m`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowBlock<Q> {
    pub d: f32,
    pub m: f32,
    pub q: [Q; BLOCK],
}

/// One block of 32 columns of one K-quant weight row: its quants and its integer factors of
/// the super-block's scales. Q4_K, Q5_K: `value = d·sc[0]·q + m·mn` (`sc[0]`, `mn` in 0..64,
/// `m` = ggml's `−dmin`); Q6_K: `value = d·sc[h]·(q − 32)` in half h (`sc` signed, `mn` unused).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KBlock {
    pub sc: [i8; 2],
    pub mn: u8,
    pub q: [u8; BLOCK],
}

/// The K-quant block formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KQuant {
    Q4K,
    Q5K,
    Q6K,
}

/// Columns in a K-quant super-block.
pub const SUPER_BLOCK: usize = 256;

/// Puts row i's quants' low four bits in a nibble tile's chunks.
pub(super) fn put_nibbles(qs: &mut [[u8; 64]; 4], i: usize, q: &[u8; BLOCK]) {
    for (c, &q) in q.iter().enumerate() {
        let (t, k, high) = q4_1_slot(c);
        let low = q & 15;
        qs[t][4 * i + k] |= if high { low << 4 } else { low };
    }
}

/// Puts row i's five-bit quants in a five-bit tile: chunk t, byte 4·i + k holds the quant at
/// column 4t + k (unpacked register t) in its low five bits and the low three bits of the quant
/// at column 4(t + 4) + k (register t + 4) above them; `high` keeps that quant's top two bits.
/// Unpacking a register then takes one mask (t < 4) or two shifts, two masks and an or,
/// where nibbles and a plane of fifth bits took three to five operations a register.
pub(super) fn put_five_bits(qs: &mut [[u8; 64]; 4], high: &mut TopBits, i: usize, q: &[u8; BLOCK]) {
    for (c, &q) in q.iter().enumerate() {
        let (t, k) = (c / 4, c % 4);
        if t < 4 {
            qs[t][4 * i + k] |= q & 31;
        } else {
            qs[t - 4][4 * i + k] |= (q & 7) << 5;
            high[4 * i + k] |= (q >> 3 & 3) << (2 * (t - 4));
        }
    }
}

/// Where column c of a tile row lives: (chunk, byte offset within the 4 of the row, high nibble).
#[inline(always)]
pub(super) fn q4_1_slot(c: usize) -> (usize, usize, bool) {
    ((c / 4) % 4, c % 4, c >= 16)
}

/// Row i's quant at column c of a nibble (or five-bit) tile.
#[inline(always)]
pub(super) fn nibble<T: NibbleTile>(tile: &T, i: usize, c: usize) -> u8 {
    match tile.high() {
        None => nibble_of(tile.qs(), i, c),
        Some(high) => five_bits_of(tile.qs(), high, i, c),
    }
}

/// Row i's low four bits at column c of a nibble tile's chunks.
#[inline(always)]
pub(super) fn nibble_of(qs: &[[u8; 64]; 4], i: usize, c: usize) -> u8 {
    let (t, k, high) = q4_1_slot(c);
    let byte = qs[t][4 * i + k];
    if high {
        byte >> 4
    } else {
        byte & 15
    }
}

/// Row i's quant at column c of a five-bit tile (see [`put_five_bits`]).
#[inline(always)]
pub(super) fn five_bits_of(qs: &[[u8; 64]; 4], high: &TopBits, i: usize, c: usize) -> u8 {
    let (t, k) = (c / 4, c % 4);
    if t < 4 {
        qs[t][4 * i + k] & 31
    } else {
        qs[t - 4][4 * i + k] >> 5 | (high[4 * i + k] >> (2 * (t - 4)) & 3) << 3
    }
}

/// Row i's quant (0..64) at column c of a Q6_K tile.
#[inline(always)]
pub(super) fn six_bits(tile: &Q6KTile, i: usize, c: usize) -> u8 {
    let t = c / 4;
    let top = (tile.high[t / 4][4 * i + c % 4] >> (2 * (t % 4))) & 3;
    nibble_of(&tile.qs, i, c) | top << 4
}
