//! Quantized matrix kernels for the native forward pass.
//!
//! Weights keep the GGUF file's values (`arch::weights` decodes each ggml block type; others
//! are re-quantized to Q8_0 at load), repacked at load into *tiles* of 16 weight rows × one
//! block of 32 columns: nibbles (Q4_0, Q4_1: 5 bits a weight; Q4_K: 4.6), five-bit quants
//! (Q5_0: 5.5; Q5_1: 6; Q5_K: 5.6), six-bit quants (Q6_K: 6.6) and bytes (Q8_0: 8.5), each at
//! its file's size or within 0.13 bits of it. K-quant tiles keep each row's small integer
//! factors, and the f16 scales of their super-blocks of 256 columns are kept once per 16 rows
//! beside the tiles; the kernels multiply the two, exactly, once per tile. In a tile
//! the rows are interleaved four columns at a time, so one 64-byte load holds the same four
//! columns of 16 rows: a single `vpdpbusd` against four broadcast activation bytes advances 16
//! dot products at once, and a block's integer sums land in one register, one lane per weight
//! row. The per-block float work (convert, scale, accumulate) is then one instruction per 16
//! outputs instead of one per output, which is what made multi-row passes compute-bound.
//!
//! Activations are quantized per row to blocks of 32 signed bytes with a scale `d` and `d·Σq`
//! (ggml's Q8_1). Every ISA computes each block's dot product exactly in integers and then
//! applies the same float operations in the same order (the scalar reference), so every ISA
//! gives the same bits, and an output does not depend on the other rows in the pass: a k-token
//! verification pass gives each position bit-for-bit the logits of a single-token step.

use crate::neural::native::pool::{split_mut, stretches, DisjointOut, Pool};
use half::f16;

/// Weights and activations are quantized in blocks of this many values.
pub const BLOCK: usize = 32;

/// Weight rows interleaved in one tile (one AVX-512 register of 32-bit lanes).
pub const TILE_ROWS: usize = 16;

/// Activation rows multiplied with a tile while its unpacked weights sit in registers, at
/// most: AVX-512's 32 registers hold a block's eight weight registers and eight rows'
/// accumulators ([`rows_per_pass`]); 256-bit ISAs, with 16, take four.
const ROWS_PER_PASS: usize = 8;

/// The activation rows one walk over a tile group multiplies on `isa`.
fn rows_per_pass(isa: Isa) -> usize {
    match isa {
        Isa::Avx512Vnni => ROWS_PER_PASS,
        _ => 4,
    }
}

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
                && std::arch::is_x86_feature_detected!("f16c")
                && std::arch::is_x86_feature_detected!("avx2")
            {
                return Isa::Avx512Vnni;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
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

impl std::str::FromStr for Isa {
    type Err = String;

    /// `scalar`, `avx2`, `avxvnni` or `avx512vnni`, if this CPU runs it.
    fn from_str(name: &str) -> Result<Isa, String> {
        let isa = match name {
            "scalar" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avxvnni" => Isa::AvxVnni,
            "avx512vnni" => Isa::Avx512Vnni,
            other => {
                return Err(format!(
                    "{other}: expected scalar, avx2, avxvnni or avx512vnni"
                ))
            }
        };
        if !Isa::available().contains(&isa) {
            return Err(format!("this CPU cannot run {isa:?}"));
        }
        Ok(isa)
    }
}

fn has_avxvnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avxvnni");
    #[allow(unreachable_code)]
    false
}

/// A weight matrix of `rows × cols` (output features × input features) in quantized tiles.
pub struct QMatrix {
    rows: usize,
    cols: usize,
    quants: Quants,
}

/// Tiles in group-major order: tile `g·nb + b` holds rows `16g..16g+16`, block `b`. Rows past
/// `rows` (padding of the last group) are zero.
enum Quants {
    /// Nibbles with f16 scales and offsets (Q4_1, Q4_0).
    Q4_1(Vec<Q4Tile>),
    /// Five-bit quants with f16 scales and no offsets (Q5_0: `d·(q − 16)`).
    Q5_0(Vec<Q5_0Tile>),
    /// Five-bit quants with f16 scales and offsets (Q5_1).
    Q5(Vec<Q5Tile>),
    /// Bytes with one f16 scale per block (Q8_0).
    Q8_0(Vec<Q8_0Tile>),
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
struct KTiles<T> {
    tiles: Vec<T>,
    supers: Vec<SuperScales>,
}

impl<T> KTiles<T> {
    /// Group g's super-blocks, for `nb` blocks a row.
    fn group_supers(&self, g: usize, nb: usize) -> &[SuperScales] {
        &self.supers[g * nb / 8..(g + 1) * nb / 8]
    }
}

/// The f16 scale `d` and offset scale `m` (ggml's `−dmin`; unused by Q6_K) of 16 rows' super-
/// block: a K-quant block's scale is `d·sc` and its offset `m·mn`, both exact in f32.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct SuperScales {
    d: [f16; TILE_ROWS],
    m: [f16; TILE_ROWS],
}

/// What tiles without super-blocks pass for one (never read).
const NO_SUPER: SuperScales = SuperScales {
    d: [f16::ZERO; TILE_ROWS],
    m: [f16::ZERO; TILE_ROWS],
};

/// 16 rows × 32 columns of nibbles (`value = d·q + m`, q in 0..16); 320 bytes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Q4Tile {
    /// Chunk t, byte 4·i + c: row i's quant at column 4t + c in the low nibble and at column
    /// 4(t + 4) + c in the high nibble.
    qs: [[u8; 64]; 4],
    d: [f16; TILE_ROWS],
    m: [f16; TILE_ROWS],
}

impl Q4Tile {
    const EMPTY: Q4Tile = Q4Tile {
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
struct Q5Tile {
    low: Q4Tile,
    high: TopBits,
}

/// The top bits of a five-bit tile's chunks: byte 4·i + c, bits 2t..2t + 2, are bits 3 and 4
/// of row i's quant at column 4(t + 4) + c (byte 4·i + c of unpacked register t + 4, whose
/// low three bits chunk t keeps), so one shift and a mask put a register's bits in place.
type TopBits = [u8; 64];

/// 16 rows × 32 columns of Q5_0 (`value = d·(q − 16)`, q in 0..32): a [`Q5Tile`] without
/// offsets, the 16 taken out of the integer sum (`16·Σq_a`, from [`QRows`]); 352 bytes, 5.5
/// bits a weight as in ggml's blocks.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Q5_0Tile {
    qs: [[u8; 64]; 4],
    high: TopBits,
    d: [f16; TILE_ROWS],
}

/// 16 rows × 32 columns of Q4_K (`value = d·sc·q + m·mn`, q in 0..16, the 6-bit factors
/// `sc` and `mn` per row, `d` and `m` from the super-block); 288 bytes, 4.6 bits a weight
/// with the super-block's scales (the file's: 4.5).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Q4KTile {
    qs: [[u8; 64]; 4],
    sc: [u8; TILE_ROWS],
    mn: [u8; TILE_ROWS],
}

/// 16 rows × 32 columns of Q5_K: a [`Q4KTile`] holding five-bit bytes and their top bits as in
/// [`Q5Tile`]; 352 bytes, 5.6 bits a weight with the super-block's scales (the file's: 5.5).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Q5KTile {
    qs: [[u8; 64]; 4],
    high: TopBits,
    sc: [u8; TILE_ROWS],
    mn: [u8; TILE_ROWS],
}

/// 16 rows × 32 columns of Q6_K (`value = d·sc[h]·(q − 32)` in half h = column / 16, q in
/// 0..64, `sc` a signed byte per row and half, `d` from the super-block): the low four bits
/// as a nibble tile, the top two in a plane beside them, the 32 taken out of the integer sums
/// (`32·Σq_a` per half); 416 bytes, 6.6 bits a weight with the super-block's scales (the
/// file's: 6.56).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Q6KTile {
    qs: [[u8; 64]; 4],
    /// Plane p, byte 4·i + c, bits 2k..2k + 2: the top two bits of row i's quant at column
    /// 4(4p + k) + c (unpacked register 4p + k's byte, shifted into place by one shift).
    high: [[u8; 64]; 2],
    sc: [[i8; TILE_ROWS]; 2],
}

/// A tile's rows' scales and offsets (the offsets unread where [`NibbleTile::CENTER`] is not 0).
#[derive(Clone, Copy)]
enum Scales<'a> {
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
    fn d(self, i: usize) -> f32 {
        match self {
            Scales::Kept { d, .. } => d[i].to_f32(),
            Scales::Factors { sc, sup, .. } => sup.d[i].to_f32() * sc[i] as f32,
        }
    }

    /// Row i's offset.
    #[inline(always)]
    fn m(self, i: usize) -> f32 {
        match self {
            Scales::Kept { m, .. } => m[i].to_f32(),
            Scales::Factors { mn, sup, .. } => sup.m[i].to_f32() * mn[i] as f32,
        }
    }
}

/// The tiles whose quants are four chunks of bytes: nibbles, or five-bit bytes with a plane of
/// top bits (`high`) for the five-bit tiles. One kernel for all, the offset taken either from
/// the integer sum ([`NibbleTile::CENTER`]) or as `m·d_a·Σq_a` (each compiled out where unused).
trait NibbleTile: Copy + 'static {
    /// What a stored quant exceeds the signed one by (Q5_0: 16), subtracted in integers; 0
    /// where the tile keeps offsets `m` instead.
    const CENTER: i32;
    /// The [`QRows`] start that takes `CENTER·Σq_a` out (none where `CENTER` is 0).
    const START: Option<Start>;
    /// Scales come from super-blocks (K-quants).
    const K: bool;
    fn qs(&self) -> &[[u8; 64]; 4];
    fn high(&self) -> Option<&TopBits>;
    /// The rows' scales, `sup` being the tile's super-block's (never read unless [`NibbleTile::K`]).
    fn scales<'a>(&'a self, sup: &'a SuperScales) -> Scales<'a>;
}

impl NibbleTile for Q4Tile {
    const CENTER: i32 = 0;
    const START: Option<Start> = None;
    const K: bool = false;
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
struct Q8_0Tile {
    /// Chunk t, byte 4·i + c: row i's quant at column 4t + c, plus 128.
    qs: [[u8; 64]; 8],
    d: [f16; TILE_ROWS],
}

/// A signed quant as the byte tiles keep it.
#[inline(always)]
fn biased(q: i8) -> u8 {
    q.max(-127) as u8 ^ 0x80
}

/// A byte tile's quant back as a signed integer.
#[inline(always)]
fn unbiased(u: u8) -> i32 {
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
fn put_nibbles(qs: &mut [[u8; 64]; 4], i: usize, q: &[u8; BLOCK]) {
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
fn put_five_bits(qs: &mut [[u8; 64]; 4], high: &mut TopBits, i: usize, q: &[u8; BLOCK]) {
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
fn q4_1_slot(c: usize) -> (usize, usize, bool) {
    ((c / 4) % 4, c % 4, c >= 16)
}

/// Row i's quant at column c of a nibble (or five-bit) tile.
#[inline(always)]
fn nibble<T: NibbleTile>(tile: &T, i: usize, c: usize) -> u8 {
    match tile.high() {
        None => nibble_of(tile.qs(), i, c),
        Some(high) => five_bits_of(tile.qs(), high, i, c),
    }
}

/// Row i's low four bits at column c of a nibble tile's chunks.
#[inline(always)]
fn nibble_of(qs: &[[u8; 64]; 4], i: usize, c: usize) -> u8 {
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
fn five_bits_of(qs: &[[u8; 64]; 4], high: &TopBits, i: usize, c: usize) -> u8 {
    let (t, k) = (c / 4, c % 4);
    if t < 4 {
        qs[t][4 * i + k] & 31
    } else {
        qs[t - 4][4 * i + k] >> 5 | (high[4 * i + k] >> (2 * (t - 4)) & 3) << 3
    }
}

/// Row i's quant (0..64) at column c of a Q6_K tile.
#[inline(always)]
fn six_bits(tile: &Q6KTile, i: usize, c: usize) -> u8 {
    let t = c / 4;
    let top = (tile.high[t / 4][4 * i + c % 4] >> (2 * (t % 4))) & 3;
    nibble_of(&tile.qs, i, c) | top << 4
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

    /// The bytes its tiles (and super-block scales) take: what a pass over all its rows
    /// reads from memory.
    pub fn bytes(&self) -> usize {
        fn k<T>(k: &KTiles<T>) -> usize {
            std::mem::size_of_val(k.tiles.as_slice()) + std::mem::size_of_val(k.supers.as_slice())
        }
        match &self.quants {
            Quants::Q4_1(t) => std::mem::size_of_val(t.as_slice()),
            Quants::Q5_0(t) => std::mem::size_of_val(t.as_slice()),
            Quants::Q5(t) => std::mem::size_of_val(t.as_slice()),
            Quants::Q8_0(t) => std::mem::size_of_val(t.as_slice()),
            Quants::Q4K(t) => k(t),
            Quants::Q5K(t) => k(t),
            Quants::Q6K(t) => k(t),
        }
    }

    fn groups(&self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }

    /// Tiles `rows × cols` from `block(row, b)`; padding rows are zero.
    fn tiled<B, T: Copy>(
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize) -> B,
        empty: T,
        put: impl Fn(&mut T, usize, &B),
    ) -> Vec<T> {
        let nb = cols / BLOCK;
        let groups = rows.div_ceil(TILE_ROWS);
        let mut tiles = vec![empty; groups * nb];
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
    fn put_row_scales(tile: &mut Q4Tile, i: usize, rb: &RowBlock<u8>) {
        tile.d[i] = f16::from_f32(rb.d);
        tile.m[i] = f16::from_f32(rb.m);
    }

    /// Row i's scale, offset and low four bits of its quants in a nibble tile.
    fn put_nibble_row(tile: &mut Q4Tile, i: usize, rb: &RowBlock<u8>) {
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

fn dequantize_nibbles<T: NibbleTile>(tile: &T, sup: &SuperScales, i: usize, out: &mut [f32]) {
    let scales = tile.scales(sup);
    let d = scales.d(i);
    for (c, x) in out.iter_mut().enumerate() {
        *x = match T::CENTER {
            0 => d * nibble(tile, i, c) as f32 + scales.m(i),
            center => d * (nibble(tile, i, c) as i32 - center) as f32,
        };
    }
}

fn quantize_block(x: &[f32]) -> (f32, [i8; 32], f32) {
    let x: &[f32; BLOCK] = x.try_into().expect("a block of 32");
    let mut amax = 0.0f32;
    for v in x {
        let a = v.abs();
        amax = if a > amax { a } else { amax };
    }
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let q: [i8; 32] = std::array::from_fn(|i| round_to_int(x[i] * id) as i8);
    let sum: i32 = q.iter().map(|&v| v as i32).sum();
    (d, q, d * sum as f32)
}

/// Rounds to the nearest integer, ties to even, for |x| < 2²²: adding 1.5·2²³ leaves no
/// fraction bits, and the integer is then the sum's bits less the constant's. Plain arithmetic
/// that vectorizes on any x86-64, where `f32::round` is a libm call per value and `as i32`
/// saturates.
#[inline(always)]
fn round_to_int(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// Quantizes the blocks of `x` into the blocks' slots of [`QRows`].
#[inline(always)]
fn quantize_blocks(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    qs: &mut [[i8; 32]],
    sums: &mut [[i32; 2]],
) {
    let slots = d.iter_mut().zip(s).zip(qs).zip(sums);
    for (block, (((d, s), q), sum)) in x.chunks_exact(BLOCK).zip(slots) {
        (*d, *q, *s) = quantize_block(block);
        *sum = [0, 16].map(|h| q[h..h + 16].iter().map(|&v| v as i32).sum());
    }
}

/// Values at which quantizing activations is split across threads (about 4 µs of work).
const PARALLEL_QUANTIZE: usize = 4096;

/// [`quantize_blocks`] with `isa`'s vectors.
fn quantize_blocks_on(isa: Isa, x: &[f32], out: BlocksOut) {
    let BlocksOut {
        d,
        s,
        qs,
        sums,
        starts,
    } = out;
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` saw AVX2 and FMA before choosing a vector ISA.
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => unsafe {
            quantize_blocks_avx2(x, d, s, qs, sums)
        },
        _ => quantize_blocks(x, d, s, qs, sums),
    }
    for (start, &halves) in starts.iter_mut().zip(sums.iter()) {
        *start = Start::of(halves);
    }
}

/// Where [`quantize_blocks_on`] writes a stretch of blocks (the fields of [`QRows`]).
struct BlocksOut<'a> {
    d: &'a mut [f32],
    s: &'a mut [f32],
    qs: &'a mut [[i8; 32]],
    sums: &'a mut [[i32; 2]],
    starts: &'a mut [[i32; 4]],
}

/// Which of a block's [`QRows`] `starts` a weight type's integer sums begin from.
#[derive(Clone, Copy)]
enum Start {
    /// Q5_0's quants exceed the signed ones by 16: `−16·Σq_a`.
    Q5_0 = 0,
    /// Q8_0's stored `q + 128`: `−128·Σq_a`.
    Q8_0 = 1,
    /// Half h of a Q6_K block (quants exceed the signed ones by 32): `−32·Σq_a` of that half.
    Q6KHalf0 = 2,
    Q6KHalf1 = 3,
}

impl Start {
    /// A block's starts, indexed by [`Start`], from its halves' `Σq_a`.
    fn of([h0, h1]: [i32; 2]) -> [i32; 4] {
        let center = Q5_0Tile::CENTER;
        [-center * (h0 + h1), -128 * (h0 + h1), -32 * h0, -32 * h1]
    }
}

/// [`quantize_blocks`] in AVX2 intrinsics: the same float operations (a multiply, then the
/// rounding constant added; the maximum by compare-and-select, exact in any order), so the
/// same bits for finite values. LLVM's code for the plain loops moved the quants one byte at
/// a time (`vpextrb`): a tenth of a 16-token pass went to quantizing activations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_blocks_avx2(
    x: &[f32],
    d: &mut [f32],
    s: &mut [f32],
    qs: &mut [[i8; 32]],
    sums: &mut [[i32; 2]],
) {
    use std::arch::x86_64::*;
    const MAGIC: f32 = 12_582_912.0;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let magic = _mm256_set1_ps(MAGIC);
    let magic_bits = _mm256_set1_epi32(MAGIC.to_bits() as i32);
    // The two packs leave each 128-bit lane's quarters interleaved: put the dwords back.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let slots = d.iter_mut().zip(s).zip(qs).zip(sums);
    for (block, (((d, s), q), half_sums)) in x.chunks_exact(BLOCK).zip(slots) {
        let p = block.as_ptr();
        // SAFETY: a block holds 32 values, four loads of 8.
        let v = [0, 8, 16, 24].map(|o| unsafe { _mm256_loadu_ps(p.add(o)) });
        // `max(a, m)` keeps m when a is NaN, as `if a > m { a } else { m }` does.
        let m = v.iter().fold(_mm256_setzero_ps(), |m, &vi| {
            _mm256_max_ps(_mm256_and_ps(vi, abs), m)
        });
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
        let ints = v.map(|vi| {
            let shifted = _mm256_add_ps(_mm256_mul_ps(vi, inv), magic);
            _mm256_sub_epi32(_mm256_castps_si256(shifted), magic_bits)
        });
        let halves = [(0, 1), (2, 3)].map(|(a, b)| {
            let total = _mm256_add_epi32(ints[a], ints[b]);
            let t4 = _mm_add_epi32(
                _mm256_castsi256_si128(total),
                _mm256_extracti128_si256(total, 1),
            );
            let t2 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
            _mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32(t2, 1)))
        });
        *half_sums = halves;
        let sum = halves[0] + halves[1];
        // |quant| ≤ 127: the saturating packs change nothing.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(ints[0], ints[1]),
            _mm256_packs_epi32(ints[2], ints[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        // SAFETY: 32 bytes each, unaligned stores.
        unsafe {
            _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes);
        }
        (*d, *s) = (scale, scale * sum as f32);
    }
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
    /// `Σq` of each block's two halves: what the byte tiles' `q + 128` weights add (times
    /// 128) to a product, for the scalar and 256-bit kernels to take back out.
    sums: Vec<[i32; 2]>,
    /// What each block's integer sums start from for the weight types that store unsigned
    /// quants above a center ([`Start`]): the centers' products with `Σq_a`, taken out by
    /// starting the sum there instead of by a subtraction per row and block.
    starts: Vec<[i32; 4]>,
}

impl QRows {
    /// Quantizes `x` (`rows × cols`, row-major).
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        self.quantize_on(Isa::Scalar, x, cols)
    }

    /// [`QRows::quantize`] with `isa`'s vectors (the same bits on every ISA).
    pub fn quantize_on(&mut self, isa: Isa, x: &[f32], cols: usize) {
        self.resize_for(x, cols);
        quantize_blocks_on(isa, x, self.blocks_out())
    }

    /// [`QRows::quantize_on`], split across `pool`'s threads when `x` is long enough to pay
    /// for the hand-off (a 16-token pass; not a single step). The same bits.
    pub fn quantize_on_pool(&mut self, isa: Isa, pool: &mut Pool, x: &[f32], cols: usize) {
        if x.len() < PARALLEL_QUANTIZE || pool.threads() == 1 {
            return self.quantize_on(isa, x, cols);
        }
        self.resize_for(x, cols);
        let parts = stretches(self.d.len(), 1, pool.threads());
        let xs: Vec<std::ops::Range<usize>> = parts
            .iter()
            .map(|r| r.start * BLOCK..r.end * BLOCK)
            .collect();
        let items: Vec<_> = split_mut(&mut self.d, &parts)
            .into_iter()
            .zip(split_mut(&mut self.s, &parts))
            .zip(split_mut(&mut self.qs, &parts))
            .zip(split_mut(&mut self.sums, &parts))
            .zip(split_mut(&mut self.starts, &parts))
            .zip(xs)
            .collect();
        pool.run_each(items, &|(((((d, s), qs), sums), starts), r)| {
            let out = BlocksOut {
                d,
                s,
                qs,
                sums,
                starts,
            };
            quantize_blocks_on(isa, &x[r], out)
        });
    }

    /// All blocks' slots, for [`quantize_blocks_on`].
    fn blocks_out(&mut self) -> BlocksOut<'_> {
        BlocksOut {
            d: &mut self.d,
            s: &mut self.s,
            qs: &mut self.qs,
            sums: &mut self.sums,
            starts: &mut self.starts,
        }
    }

    /// Sizes the buffers for `x` (`cols` a multiple of the block).
    fn resize_for(&mut self, x: &[f32], cols: usize) {
        assert!(cols.is_multiple_of(BLOCK) && x.len().is_multiple_of(cols));
        self.rows = x.len() / cols;
        self.cols = cols;
        let blocks = x.len() / BLOCK;
        self.d.resize(blocks, 0.0);
        self.s.resize(blocks, 0.0);
        self.qs.resize(blocks, [0; 32]);
        self.sums.resize(blocks, [0; 2]);
        self.starts.resize(blocks, [0; 4]);
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
            qs: &self.qs[span.clone()],
            sums: &self.sums[span.clone()],
            starts: &self.starts[span],
        }
    }
}

#[derive(Clone, Copy)]
struct Row<'a> {
    d: &'a [f32],
    s: &'a [f32],
    qs: &'a [[i8; 32]],
    sums: &'a [[i32; 2]],
    starts: &'a [[i32; 4]],
}

/// Below this many tile groups (of 16 weight rows) per thread a product is not split.
const MIN_GROUPS_PER_THREAD: usize = 4;

/// `out[r·n + j] = Σ_c a[r][c]·w[j][c]` for every activation row r and weight row j, where
/// `n = w.rows()`. The tile groups are split across the pool's threads; each output is
/// computed by one thread in the same way, so the result is the same bit for bit.
pub fn matmul(isa: Isa, w: &QMatrix, a: &QRows, out: &mut [f32], pool: &mut Pool) {
    matmul_many(isa, &[w], a, &mut [out], pool)
}

/// [`matmul`] of the same activations with several matrices (`outs[i]` for `ws[i]`) in one
/// parallel section: their tile groups, taken in order, are split across the threads, so a
/// layer's q, k and v (or gate and up) cost one hand-off and one wait instead of three (or
/// two). The same bits as separate products.
pub fn matmul_many(isa: Isa, ws: &[&QMatrix], a: &QRows, outs: &mut [&mut [f32]], pool: &mut Pool) {
    assert_eq!(ws.len(), outs.len(), "matmul: a matrix for every output");
    for (w, out) in ws.iter().zip(outs.iter()) {
        assert_eq!(out.len(), w.rows * a.rows);
    }
    let shared: Vec<DisjointOut> = outs.iter_mut().map(|o| DisjointOut::new(o)).collect();
    products(isa, ws, a, pool, &|i, r, j0, v| {
        // SAFETY: each (r, j) of output i is written once, by the part that owns its group.
        unsafe { shared[i].write_slice(r * ws[i].rows + j0, v) }
    });
}

/// [`matmul`] with activation row r's outputs in `rows[r]` (`w.rows()` floats each): the
/// logits of a pass go straight into the rows the caller keeps, with no copy.
pub fn matmul_into_rows(
    isa: Isa,
    w: &QMatrix,
    a: &QRows,
    rows: &mut [&mut [f32]],
    pool: &mut Pool,
) {
    assert_eq!(
        rows.len(),
        a.rows,
        "matmul: an output row for every activation row"
    );
    assert!(
        rows.iter().all(|r| r.len() == w.rows),
        "matmul: rows of w.rows() outputs"
    );
    let shared: Vec<DisjointOut> = rows.iter_mut().map(|o| DisjointOut::new(o)).collect();
    products(isa, &[w], a, pool, &|_, r, j0, v| {
        // SAFETY: each (r, j) is written once, by the part that owns its group.
        unsafe { shared[r].write_slice(j0, v) }
    });
}

/// Where [`products`] stores outputs: `(matrix, activation row, first weight row, values)`.
type PutOutputs<'a> = dyn Fn(usize, usize, usize, &[f32]) + Sync + 'a;

/// The products of the activations with every matrix of `ws`, in one parallel section:
/// `put(i, r, j0, values)` takes the outputs of matrix i's weight rows `j0..` for
/// activation row r. The concatenated tile groups are split across the pool's threads.
fn products(isa: Isa, ws: &[&QMatrix], a: &QRows, pool: &mut Pool, put: &PutOutputs) {
    for w in ws {
        assert_eq!(w.cols, a.cols, "matmul: inner dimensions differ");
    }
    // Global group g of the concatenation is group g − starts[i] of matrix i.
    let starts: Vec<usize> = ws
        .iter()
        .scan(0, |at, w| {
            let start = *at;
            *at += w.groups();
            Some(start)
        })
        .collect();
    let groups: usize = ws.iter().map(|w| w.groups()).sum();
    let run = |gs: std::ops::Range<usize>| {
        for (i, w) in ws.iter().enumerate() {
            let (first, n) = (starts[i], w.rows);
            let local =
                gs.start.max(first) - first..gs.end.min(first + w.groups()).max(first) - first;
            if local.is_empty() {
                continue;
            }
            matmul_groups(isa, w, a, local, &mut |j0, r, v| {
                put(i, r, j0, &v[..TILE_ROWS.min(n - j0)])
            });
        }
    };
    let parts = pool.threads().min(groups / MIN_GROUPS_PER_THREAD).max(1);
    if parts == 1 {
        return run(0..groups);
    }
    let bounds = split_by_bytes(ws, parts);
    // The pool runs a part per thread; those past `parts` have nothing to do.
    pool.run(&|part| {
        if part < parts {
            run(bounds[part]..bounds[part + 1])
        }
    });
}

/// Where `parts` threads' shares of the concatenated tile groups of `ws` begin and end
/// (`parts + 1` bounds): each share about the same bytes, since a step streams its weights
/// and groups of different types differ in size (a layer's q and k in Q5_0 beside v in Q8_0).
fn split_by_bytes(ws: &[&QMatrix], parts: usize) -> Vec<usize> {
    let total: usize = ws.iter().map(|w| w.bytes()).sum();
    let mut bounds = vec![0];
    let (mut group, mut bytes) = (0, 0);
    for w in ws {
        let per_group = w.bytes() / w.groups();
        for _ in 0..w.groups() {
            group += 1;
            bytes += per_group;
            // Close share p once its bytes reach p/parts of the total.
            if bounds.len() < parts && bytes * parts >= total * bounds.len() {
                bounds.push(group);
            }
        }
    }
    bounds.resize(parts + 1, group);
    bounds
}

/// Tile groups `gs` times all activation rows; `put(j0, r, values)` stores the outputs of
/// weight rows `j0..j0 + 16` for activation row r.
fn matmul_groups(
    isa: Isa,
    w: &QMatrix,
    a: &QRows,
    gs: std::ops::Range<usize>,
    put: &mut impl FnMut(usize, usize, &[f32; TILE_ROWS]),
) {
    let nb = w.blocks_per_row();
    let k = a.rows;
    let rows: Vec<Row> = (0..k).map(|r| a.row(r)).collect();
    let mut o = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
    let per_pass = rows_per_pass(isa);
    for g in gs {
        let tiles = g * nb..(g + 1) * nb;
        let mut r = 0;
        while r < k {
            let n = (k - r).min(per_pass);
            let rs = &rows[r..r + n];
            let tiles = match &w.quants {
                Quants::Q4_1(t) => Tiles::Q4_1(&t[tiles.clone()]),
                Quants::Q5_0(t) => Tiles::Q5_0(&t[tiles.clone()]),
                Quants::Q5(t) => Tiles::Q5(&t[tiles.clone()]),
                Quants::Q8_0(t) => Tiles::Q8_0(&t[tiles.clone()]),
                Quants::Q4K(k) => Tiles::Q4K(&k.tiles[tiles.clone()], k.group_supers(g, nb)),
                Quants::Q5K(k) => Tiles::Q5K(&k.tiles[tiles.clone()], k.group_supers(g, nb)),
                Quants::Q6K(k) => Tiles::Q6K(&k.tiles[tiles.clone()], k.group_supers(g, nb)),
            };
            tile_rows(isa, tiles, rs, &mut o);
            for (i, v) in o[..n].iter().enumerate() {
                put(g * TILE_ROWS, r + i, v);
            }
            r += n;
        }
    }
}

/// The tiles of one group (16 weight rows, all blocks), with their super-blocks' scales.
#[derive(Clone, Copy)]
enum Tiles<'a> {
    Q4_1(&'a [Q4Tile]),
    Q5_0(&'a [Q5_0Tile]),
    Q5(&'a [Q5Tile]),
    Q8_0(&'a [Q8_0Tile]),
    Q4K(&'a [Q4KTile], &'a [SuperScales]),
    Q5K(&'a [Q5KTile], &'a [SuperScales]),
    Q6K(&'a [Q6KTile], &'a [SuperScales]),
}

/// One group of tiles times `rows` (at most [`ROWS_PER_PASS`]) into `out[..rows.len()]`.
fn tile_rows(isa: Isa, tiles: Tiles, rows: &[Row], out: &mut [[f32; TILE_ROWS]; ROWS_PER_PASS]) {
    macro_rules! dispatch {
        ($n:literal) => {{
            let rows: &[Row; $n] = rows.try_into().expect("row count");
            let out: &mut [[f32; TILE_ROWS]; $n] = (&mut out[..$n]).try_into().expect("rows");
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::detect` chose these only after checking the CPU features.
                Isa::Avx512Vnni => unsafe { x86::tile_avx512::<$n>(tiles, rows, out) },
                #[cfg(target_arch = "x86_64")]
                Isa::AvxVnni => unsafe { x86::tile_vnni::<$n>(tiles, rows, out) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { x86::tile_avx2::<$n>(tiles, rows, out) },
                _ => tile_scalar::<$n>(tiles, rows, out),
            }
        }};
    }
    match rows.len() {
        8 => dispatch!(8),
        7 => dispatch!(7),
        6 => dispatch!(6),
        5 => dispatch!(5),
        4 => dispatch!(4),
        3 => dispatch!(3),
        2 => dispatch!(2),
        _ => dispatch!(1),
    }
}

/// The reference every ISA reproduces bit for bit: per block, the exact integer dot product
/// `isum`, then `acc = fma(isum·d_a, d_w, acc)` and, for nibbles with offsets, `acc = fma(m_w,
/// d_a·Σq_a, acc)`. Q6_K blocks take the two halves' sums in turn.
fn tile_scalar<const N: usize>(tiles: Tiles, rows: &[Row; N], out: &mut [[f32; TILE_ROWS]; N]) {
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
fn super_of<T: NibbleTile>(supers: &[SuperScales], b: usize) -> &SuperScales {
    if T::K {
        &supers[b / 8]
    } else {
        &NO_SUPER
    }
}

fn nibbles_scalar<T: NibbleTile>(tiles: &[T], supers: &[SuperScales], row: &Row, i: usize) -> f32 {
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! SIMD versions of [`super::tile_scalar`]: the same integer sums and the same float
    //! operations in the same order, 16 (AVX-512) or 8 (AVX2) weight rows per register.
    use super::{
        super_of, NibbleTile, Q6KTile, Q8_0Tile, Row, Scales, Start, SuperScales, Tiles, TILE_ROWS,
    };
    use std::arch::x86_64::*;

    /// Activation bytes `4t..4t+4` of a block as one 32-bit word, for broadcasting.
    #[inline(always)]
    unsafe fn quad<T>(q: &[T; 32], t: usize) -> i32 {
        (q.as_ptr().add(4 * t) as *const i32).read_unaligned()
    }

    /// Asks for the cache lines [`PREFETCH_BYTES`] past `tile`'s: the weights stream from
    /// memory once per pass, and the hardware prefetcher alone leaves the loads waiting.
    /// (Prefetching past the end of the matrix is harmless: prefetches never fault.)
    #[inline(always)]
    unsafe fn prefetch_ahead<T>(tile: &T) {
        let at = (tile as *const T as *const i8).wrapping_add(PREFETCH_BYTES);
        for line in (0..std::mem::size_of::<T>()).step_by(64) {
            _mm_prefetch(at.wrapping_add(line), _MM_HINT_T0);
        }
    }

    const PREFETCH_BYTES: usize = 2048;

    /// 16 f16 values as floats.
    #[inline(always)]
    unsafe fn halves16(s: &[half::f16; TILE_ROWS]) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr() as *const __m256i))
    }

    /// 16 bytes as floats, unsigned or signed.
    #[inline(always)]
    unsafe fn bytes16(b: *const u8, signed: bool) -> __m512 {
        let x = _mm_loadu_si128(b as *const __m128i);
        let x = if signed {
            _mm512_cvtepi8_epi32(x)
        } else {
            _mm512_cvtepu8_epi32(x)
        };
        _mm512_cvtepi32_ps(x)
    }

    /// The 16 rows' scales and offsets as floats (products of the super-block's and the
    /// rows' factors for K-quants: exact, the scalar reference's values).
    #[inline(always)]
    unsafe fn scales16(s: Scales) -> (__m512, __m512) {
        match s {
            Scales::Kept { d, m } => (halves16(d), halves16(m)),
            Scales::Factors { sc, mn, sup } => (
                _mm512_mul_ps(halves16(&sup.d), bytes16(sc.as_ptr(), false)),
                _mm512_mul_ps(halves16(&sup.m), bytes16(mn.as_ptr(), false)),
            ),
        }
    }

    /// 8 f16 values from `s` as floats.
    #[inline(always)]
    unsafe fn halves8(s: &[half::f16]) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr() as *const __m128i))
    }

    /// 8 bytes from `b` as floats, unsigned or signed.
    #[inline(always)]
    unsafe fn bytes8(b: *const u8, signed: bool) -> __m256 {
        let x = _mm_loadl_epi64(b as *const __m128i);
        let x = if signed {
            _mm256_cvtepi8_epi32(x)
        } else {
            _mm256_cvtepu8_epi32(x)
        };
        _mm256_cvtepi32_ps(x)
    }

    /// [`scales16`] of rows `8h..8h + 8`.
    #[inline(always)]
    unsafe fn scales8(s: Scales, h: usize) -> (__m256, __m256) {
        let r = 8 * h;
        match s {
            Scales::Kept { d, m } => (halves8(&d[r..]), halves8(&m[r..])),
            Scales::Factors { sc, mn, sup } => (
                _mm256_mul_ps(halves8(&sup.d[r..]), bytes8(sc[r..].as_ptr(), false)),
                _mm256_mul_ps(halves8(&sup.m[r..]), bytes8(mn[r..].as_ptr(), false)),
            ),
        }
    }

    /// Block b of every row times the weight quads `quads` of a block's eight registers: one
    /// chain of `vpdpbusd` per row from the row's [`Start`] (or zero), the rows' chains
    /// interleaved so that no instruction waits on the one before it (integer sums: any order
    /// gives the same values).
    #[inline(always)]
    unsafe fn dot_rows<const N: usize>(
        w: &[__m512i; 8],
        quads: std::ops::Range<usize>,
        rows: &[Row; N],
        b: usize,
        start: Option<Start>,
    ) -> [__m512i; N] {
        let mut sums = [_mm512_setzero_si512(); N];
        if let Some(which) = start {
            // (A loop, not `array::from_fn`: closures do not inherit the target features.)
            for (s, row) in sums.iter_mut().zip(rows) {
                *s = _mm512_set1_epi32(row.starts[b][which as usize]);
            }
        }
        for t in quads {
            for (s, row) in sums.iter_mut().zip(rows) {
                *s = _mm512_dpbusd_epi32(*s, w[t], _mm512_set1_epi32(quad(&row.qs[b], t)));
            }
        }
        sums
    }

    #[inline(always)]
    unsafe fn nibbles_avx512<T: NibbleTile, const N: usize>(
        tiles: &[T],
        supers: &[SuperScales],
        rows: &[Row; N],
        acc: &mut [__m512; N],
    ) {
        let mask = _mm512_set1_epi8(0x0F);
        for (b, tile) in tiles.iter().enumerate() {
            prefetch_ahead(tile);
            let mut w = [_mm512_setzero_si512(); 8];
            // (The closure only finds the address: closures do not inherit the target features.)
            let chunk = |t: usize| tile.qs()[t].as_ptr() as *const __m512i;
            if let Some(high) = tile.high() {
                // Five-bit bytes (`put_five_bits`): w_t = x & 31, w_{t+4} = (x >> 5 & 7) |
                // (top bits shifted to 3..5 & 0x18).
                let top = _mm512_loadu_si512(high.as_ptr() as *const __m512i);
                let tops = [
                    _mm512_slli_epi16(top, 3),
                    _mm512_slli_epi16(top, 1),
                    _mm512_srli_epi16(top, 1),
                    _mm512_srli_epi16(top, 3),
                ];
                let (five, seven) = (_mm512_set1_epi8(31), _mm512_set1_epi8(7));
                let top_mask = _mm512_set1_epi8(0x18);
                for t in 0..4 {
                    let x = _mm512_loadu_si512(chunk(t));
                    w[t] = _mm512_and_si512(x, five);
                    let tops = _mm512_and_si512(tops[t], top_mask);
                    // (x >> 5 & 7) | tops
                    w[t + 4] =
                        _mm512_ternarylogic_epi32(_mm512_srli_epi16(x, 5), seven, tops, 0xEA);
                }
            } else {
                for t in 0..4 {
                    let x = _mm512_loadu_si512(chunk(t));
                    w[t] = _mm512_and_si512(x, mask);
                    w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
                }
            }
            let (dw, mw) = scales16(tile.scales(super_of::<T>(supers, b)));
            let sums = dot_rows(&w, 0..8, rows, b, T::START);
            for i in 0..N {
                let isum = sums[i];
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(rows[i].d[b]));
                acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
                if T::CENTER == 0 {
                    acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(rows[i].s[b]), acc[i]);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn q8_0_avx512<const N: usize>(
        tiles: &[Q8_0Tile],
        rows: &[Row; N],
        acc: &mut [__m512; N],
    ) {
        for (b, tile) in tiles.iter().enumerate() {
            prefetch_ahead(tile);
            let w: [__m512i; 8] =
                std::array::from_fn(|t| _mm512_loadu_si512(tile.qs[t].as_ptr() as *const __m512i));
            let dw = halves16(&tile.d);
            // Weights q + 128 against signed activations: the sums start at −128·Σq_a.
            let sums = dot_rows(&w, 0..8, rows, b, Some(Start::Q8_0));
            for i in 0..N {
                let isum = sums[i];
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(rows[i].d[b]));
                acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
            }
        }
    }

    /// A Q6_K tile's six-bit quants as eight registers of bytes: the nibbles, with the top
    /// two bits of plane `p` shifted into bits 4..6 of register `4p + k`.
    #[inline(always)]
    unsafe fn six_bits_avx512(tile: &Q6KTile) -> [__m512i; 8] {
        let (mask, top) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let mut w = [_mm512_setzero_si512(); 8];
        for t in 0..4 {
            let x = _mm512_loadu_si512(tile.qs[t].as_ptr() as *const __m512i);
            w[t] = _mm512_and_si512(x, mask);
            w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
        }
        for p in 0..2 {
            let h = _mm512_loadu_si512(tile.high[p].as_ptr() as *const __m512i);
            let shifted = [
                _mm512_slli_epi16(h, 4),
                _mm512_slli_epi16(h, 2),
                h,
                _mm512_srli_epi16(h, 2),
            ];
            for (k, x) in shifted.into_iter().enumerate() {
                // w | (x & 0x30)
                w[4 * p + k] = _mm512_ternarylogic_epi32(w[4 * p + k], x, top, 0xF8);
            }
        }
        w
    }

    #[inline(always)]
    unsafe fn q6k_avx512<const N: usize>(
        tiles: &[Q6KTile],
        supers: &[SuperScales],
        rows: &[Row; N],
        acc: &mut [__m512; N],
    ) {
        for (b, tile) in tiles.iter().enumerate() {
            prefetch_ahead(tile);
            let w = six_bits_avx512(tile);
            let d = halves16(&supers[b / 8].d);
            // (No closure here: it would not inherit the target features.)
            let dw = [
                _mm512_mul_ps(d, bytes16(tile.sc[0].as_ptr() as *const u8, true)),
                _mm512_mul_ps(d, bytes16(tile.sc[1].as_ptr() as *const u8, true)),
            ];
            // Half h of every row, then the next: each row's two terms keep their order.
            let halves = [(0..4, Start::Q6KHalf0), (4..8, Start::Q6KHalf1)];
            for ((quads, start), dw) in halves.into_iter().zip(dw) {
                let sums = dot_rows(&w, quads, rows, b, Some(start));
                for i in 0..N {
                    let t =
                        _mm512_mul_ps(_mm512_cvtepi32_ps(sums[i]), _mm512_set1_ps(rows[i].d[b]));
                    acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub unsafe fn tile_avx512<const N: usize>(
        tiles: Tiles,
        rows: &[Row; N],
        out: &mut [[f32; TILE_ROWS]; N],
    ) {
        let mut acc = [_mm512_setzero_ps(); N];
        match tiles {
            Tiles::Q4_1(tiles) => nibbles_avx512(tiles, &[], rows, &mut acc),
            Tiles::Q5_0(tiles) => nibbles_avx512(tiles, &[], rows, &mut acc),
            Tiles::Q5(tiles) => nibbles_avx512(tiles, &[], rows, &mut acc),
            Tiles::Q4K(tiles, supers) => nibbles_avx512(tiles, supers, rows, &mut acc),
            Tiles::Q5K(tiles, supers) => nibbles_avx512(tiles, supers, rows, &mut acc),
            Tiles::Q8_0(tiles) => q8_0_avx512(tiles, rows, &mut acc),
            Tiles::Q6K(tiles, supers) => q6k_avx512(tiles, supers, rows, &mut acc),
        }
        for i in 0..N {
            _mm512_storeu_ps(out[i].as_mut_ptr(), acc[i]);
        }
    }

    /// `acc + Σ` of four u8 × i8 products per lane (AVX2: no overflow while |u·s| ≤ 128·127,
    /// which nibbles and |Q8_0 weights| ≤ 127 satisfy).
    #[inline(always)]
    unsafe fn dot_avx2(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        let pairs = _mm256_maddubs_epi16(u, s);
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }

    /// One nibble block's eight quads `w` times activation block `a`, summed per lane.
    /// The 16-bit pair sums are added before widening: a pair is at most 2·15·127 = 3,810 in
    /// magnitude, eight of them 30,480 < 2¹⁵, so the sum is exact and one `madd` widens it,
    /// instead of one per quad (both instructions use the same multiply ports).
    #[inline(always)]
    unsafe fn dot_q4_avx2(w: &[__m256i; 8], a: &[i8; 32]) -> __m256i {
        let p: [__m256i; 8] =
            std::array::from_fn(|t| _mm256_maddubs_epi16(w[t], _mm256_set1_epi32(quad(a, t))));
        let low = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
        let high = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
        _mm256_madd_epi16(_mm256_add_epi16(low, high), _mm256_set1_epi16(1))
    }

    /// [`dot_q4_avx2`] for five-bit quants: a pair reaches 2·31·127 = 7,874, so four pairs
    /// (31,496 < 2¹⁵) are added before each of two widenings.
    #[inline(always)]
    unsafe fn dot_q5_avx2(w: &[__m256i; 8], a: &[i8; 32]) -> __m256i {
        let p: [__m256i; 8] =
            std::array::from_fn(|t| _mm256_maddubs_epi16(w[t], _mm256_set1_epi32(quad(a, t))));
        let low = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
        let high = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
        let ones = _mm256_set1_epi16(1);
        _mm256_add_epi32(_mm256_madd_epi16(low, ones), _mm256_madd_epi16(high, ones))
    }

    /// Rows `8h..8h + 8` of a five-bit tile's quants as eight registers of bytes
    /// (`put_five_bits`): register t < 4 is chunk t's low five bits, register t + 4 its top
    /// three bits with the plane's two above them.
    #[inline(always)]
    unsafe fn five_bits_256(qs: &[[u8; 64]; 4], high: &super::TopBits, h: usize) -> [__m256i; 8] {
        let top = _mm256_loadu_si256(high.as_ptr().add(32 * h) as *const __m256i);
        let tops = [
            _mm256_slli_epi16(top, 3),
            _mm256_slli_epi16(top, 1),
            _mm256_srli_epi16(top, 1),
            _mm256_srli_epi16(top, 3),
        ];
        let (five, seven) = (_mm256_set1_epi8(31), _mm256_set1_epi8(7));
        let top_mask = _mm256_set1_epi8(0x18);
        let mut w = [_mm256_setzero_si256(); 8];
        // (A loop, not a closure: closures do not inherit the target features.)
        for t in 0..4 {
            let x = _mm256_loadu_si256(qs[t].as_ptr().add(32 * h) as *const __m256i);
            w[t] = _mm256_and_si256(x, five);
            let low3 = _mm256_and_si256(_mm256_srli_epi16(x, 5), seven);
            w[t + 4] = _mm256_or_si256(low3, _mm256_and_si256(tops[t], top_mask));
        }
        w
    }

    #[inline(always)]
    unsafe fn dot_q4_vnni(w: &[__m256i; 8], a: &[i8; 32]) -> __m256i {
        let mut s = _mm256_setzero_si256();
        for (t, &w) in w.iter().enumerate() {
            s = _mm256_dpbusd_avx_epi32(s, w, _mm256_set1_epi32(quad(a, t)));
        }
        s
    }

    /// Byte-tile weights `w` times signed activation quad `q`. AVX2 takes the weights signed
    /// (`q_w = (q_w + 128) ^ 0x80`, flipped once per tile) and moves their signs onto the
    /// activations; VNNI takes them unsigned as stored and leaves `128·Σq_a` to subtract.
    /// (Moving q's signs onto the weights instead, against a precomputed `|q|`, keeps half
    /// the registers and spills nothing with four rows, but its second broadcast per quad
    /// made a 16-row product 5–10% slower on an AVX2 EPYC.)
    #[inline(always)]
    unsafe fn dot_q8_avx2(acc: __m256i, w: __m256i, q: i32) -> __m256i {
        let a = _mm256_sign_epi8(_mm256_set1_epi32(q), w);
        dot_avx2(acc, _mm256_abs_epi8(w), a)
    }

    #[inline(always)]
    unsafe fn dot_q8_vnni(acc: __m256i, w: __m256i, q: i32) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(q))
    }

    /// A byte tile's 32 bytes at `at` as the `dot_q8` of the ISA takes them: unsigned as
    /// stored for VNNI (`unsigned`), signed otherwise.
    #[inline(always)]
    unsafe fn byte_quads(at: *const u8, unsigned: bool) -> __m256i {
        let w = _mm256_loadu_si256(at as *const __m256i);
        if unsigned {
            w
        } else {
            _mm256_xor_si256(w, _mm256_set1_epi8(0x80u8 as i8))
        }
    }

    /// Quads `4k..4k + 4` of six-bit weights `w` times activation block `a`, summed per
    /// lane: a pair reaches 2·63·127 = 16,002, so two pairs (32,004 < 2¹⁵) are added before
    /// each of two widenings.
    #[inline(always)]
    unsafe fn dot_q6_avx2(w: &[__m256i; 8], a: &[i8; 32], k: usize) -> __m256i {
        let p: [__m256i; 4] = std::array::from_fn(|t| {
            _mm256_maddubs_epi16(w[4 * k + t], _mm256_set1_epi32(quad(a, 4 * k + t)))
        });
        let ones = _mm256_set1_epi16(1);
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), ones),
            _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), ones),
        )
    }

    #[inline(always)]
    unsafe fn dot_q6_vnni(w: &[__m256i; 8], a: &[i8; 32], k: usize) -> __m256i {
        let mut s = _mm256_setzero_si256();
        for (t, &w) in w.iter().enumerate().skip(4 * k).take(4) {
            s = _mm256_dpbusd_avx_epi32(s, w, _mm256_set1_epi32(quad(a, t)));
        }
        s
    }

    /// Rows `8h..8h + 8` of a Q6_K tile's six-bit quants as eight registers of bytes (as
    /// `six_bits_avx512`).
    #[inline(always)]
    unsafe fn six_bits_256(tile: &Q6KTile, h: usize) -> [__m256i; 8] {
        let half = |bytes: &[u8; 64]| bytes.as_ptr().add(32 * h) as *const __m256i;
        let (mask, top) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let mut w = [_mm256_setzero_si256(); 8];
        for t in 0..4 {
            let x = _mm256_loadu_si256(half(&tile.qs[t]));
            w[t] = _mm256_and_si256(x, mask);
            w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
        }
        for p in 0..2 {
            let x = _mm256_loadu_si256(half(&tile.high[p]));
            let shifted = [
                _mm256_slli_epi16(x, 4),
                _mm256_slli_epi16(x, 2),
                x,
                _mm256_srli_epi16(x, 2),
            ];
            for (k, x) in shifted.into_iter().enumerate() {
                w[4 * p + k] = _mm256_or_si256(w[4 * p + k], _mm256_and_si256(x, top));
            }
        }
        w
    }

    macro_rules! tile_256 {
        ($name:ident, $dot_q4:ident, $dot_q5:ident, $dot_q6:ident, $dot_q8:ident, $q8_bias:literal, $features:literal) => {
            /// Two halves of 8 weight rows, each a 256-bit register of lanes.
            #[target_feature(enable = $features)]
            pub unsafe fn $name<const N: usize>(
                tiles: Tiles,
                rows: &[Row; N],
                out: &mut [[f32; TILE_ROWS]; N],
            ) {
                /// A nibble tile group's rows `8h..8h + 8`.
                #[inline(always)]
                unsafe fn nibbles<T: NibbleTile, const N: usize>(
                    tiles: &[T],
                    supers: &[SuperScales],
                    rows: &[Row; N],
                    h: usize,
                    acc: &mut [__m256; N],
                ) {
                    let half = |bytes: *const u8| bytes.add(32 * h) as *const __m256i;
                    let mask = _mm256_set1_epi8(0x0F);
                    for (b, tile) in tiles.iter().enumerate() {
                        // The second half reads the lines the first brought in.
                        if h == 0 {
                            prefetch_ahead(tile);
                        }
                        let w = match tile.high() {
                            Some(high) => five_bits_256(tile.qs(), high, h),
                            None => {
                                let mut w = [_mm256_setzero_si256(); 8];
                                for t in 0..4 {
                                    let x = _mm256_loadu_si256(half(tile.qs()[t].as_ptr()));
                                    w[t] = _mm256_and_si256(x, mask);
                                    w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
                                }
                                w
                            }
                        };
                        let (dw, mw) = scales8(tile.scales(super_of::<T>(supers, b)), h);
                        for i in 0..N {
                            let mut s = match tile.high() {
                                None => $dot_q4(&w, &rows[i].qs[b]),
                                Some(_) => $dot_q5(&w, &rows[i].qs[b]),
                            };
                            if T::CENTER != 0 {
                                let [h0, h1] = rows[i].sums[b];
                                let center = _mm256_set1_epi32(T::CENTER * (h0 + h1));
                                s = _mm256_sub_epi32(s, center);
                            }
                            let t =
                                _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(rows[i].d[b]));
                            acc[i] = _mm256_fmadd_ps(t, dw, acc[i]);
                            if T::CENTER == 0 {
                                acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(rows[i].s[b]), acc[i]);
                            }
                        }
                    }
                }

                for h in 0..2 {
                    let mut acc = [_mm256_setzero_ps(); N];
                    let half = |bytes: *const u8| bytes.add(32 * h) as *const __m256i;
                    match tiles {
                        Tiles::Q4_1(tiles) => nibbles(tiles, &[], rows, h, &mut acc),
                        Tiles::Q5_0(tiles) => nibbles(tiles, &[], rows, h, &mut acc),
                        Tiles::Q5(tiles) => nibbles(tiles, &[], rows, h, &mut acc),
                        Tiles::Q4K(tiles, supers) => nibbles(tiles, supers, rows, h, &mut acc),
                        Tiles::Q5K(tiles, supers) => nibbles(tiles, supers, rows, h, &mut acc),
                        Tiles::Q8_0(tiles) => {
                            for (b, tile) in tiles.iter().enumerate() {
                                if h == 0 {
                                    prefetch_ahead(tile);
                                }
                                let w: [__m256i; 8] = std::array::from_fn(|t| {
                                    byte_quads(half(tile.qs[t].as_ptr()) as *const u8, $q8_bias)
                                });
                                let dw = halves8(&tile.d[8 * h..]);
                                for i in 0..N {
                                    let q = &rows[i].qs[b];
                                    let mut s = _mm256_setzero_si256();
                                    for t in 0..8 {
                                        s = $dot_q8(s, w[t], quad(q, t));
                                    }
                                    if $q8_bias {
                                        let [h0, h1] = rows[i].sums[b];
                                        let bias = _mm256_set1_epi32(128 * (h0 + h1));
                                        s = _mm256_sub_epi32(s, bias);
                                    }
                                    let t = _mm256_mul_ps(
                                        _mm256_cvtepi32_ps(s),
                                        _mm256_set1_ps(rows[i].d[b]),
                                    );
                                    acc[i] = _mm256_fmadd_ps(t, dw, acc[i]);
                                }
                            }
                        }
                        Tiles::Q6K(tiles, supers) => {
                            for (b, tile) in tiles.iter().enumerate() {
                                if h == 0 {
                                    prefetch_ahead(tile);
                                }
                                let w = six_bits_256(tile, h);
                                let d = halves8(&supers[b / 8].d[8 * h..]);
                                let sc = |k: usize| tile.sc[k][8 * h..].as_ptr() as *const u8;
                                let dw = [
                                    _mm256_mul_ps(d, bytes8(sc(0), true)),
                                    _mm256_mul_ps(d, bytes8(sc(1), true)),
                                ];
                                for i in 0..N {
                                    let q = &rows[i].qs[b];
                                    let da = _mm256_set1_ps(rows[i].d[b]);
                                    for k in 0..2 {
                                        let s = $dot_q6(&w, q, k);
                                        let center = 32 * rows[i].sums[b][k];
                                        let s = _mm256_sub_epi32(s, _mm256_set1_epi32(center));
                                        let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), da);
                                        acc[i] = _mm256_fmadd_ps(t, dw[k], acc[i]);
                                    }
                                }
                            }
                        }
                    }
                    for i in 0..N {
                        _mm256_storeu_ps(out[i][8 * h..].as_mut_ptr(), acc[i]);
                    }
                }
            }
        };
    }

    tile_256!(
        tile_avx2,
        dot_q4_avx2,
        dot_q5_avx2,
        dot_q6_avx2,
        dot_q8_avx2,
        false,
        "avx2,fma,f16c"
    );
    tile_256!(
        tile_vnni,
        dot_q4_vnni,
        dot_q4_vnni,
        dot_q6_vnni,
        dot_q8_vnni,
        true,
        "avx2,fma,f16c,avxvnni"
    );
}

#[cfg(test)]
pub(in crate::neural) mod tests {
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
    fn k_quants(kind: KQuant, rows: usize, cols: usize, seed: u32) -> QMatrix {
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
                    q: std::array::from_fn(|c| {
                        ((v[r * cols + 32 * b + c] + 1.0) / 2.0 * top) as u8
                    }),
                }
            },
        )
    }

    /// A five-bit matrix: Q5_0-shaped (f16 scales, offset −16d) or Q5_1-shaped (f16 scales
    /// and offsets).
    fn five_bits(rows: usize, cols: usize, seed: u32, shape: &str) -> QMatrix {
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
            vec![1.0f32; 5 * SUPER_BLOCK],
            vec![-1.0f32; 5 * SUPER_BLOCK],
            signed
                .iter()
                .cycle()
                .take(5 * SUPER_BLOCK)
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
                let mut scalar = vec![0.0; 5 * rows];
                matmul(Isa::Scalar, w, &a, &mut scalar, &mut pool);
                let want = reference(w, &x, cols);
                for (g, e) in scalar.iter().zip(&want) {
                    assert!((g - e).abs() < 0.05 + 0.01 * e.abs(), "scalar: {g} vs {e}");
                }
                for isa in Isa::available() {
                    let mut got = vec![0.0; 5 * rows];
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
        let (rows, cols) = (150, 96 + 32);
        let mats = [
            QMatrix::quantize_q4_1(rows, cols, &pseudo(rows * cols, 7)).unwrap(),
            QMatrix::quantize_q8_0(rows, cols, &pseudo(rows * cols, 9)).unwrap(),
            five_bits(rows, cols, 14, "q5_0"),
            five_bits(rows, cols, 15, "q5_1"),
            // Two super-blocks a row.
            k_quants(KQuant::Q4K, rows, 512, 10),
            k_quants(KQuant::Q5K, rows, 512, 16),
            k_quants(KQuant::Q6K, rows, 512, 12),
        ];
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
}
