//! The AMX-INT8 kernel (Intel Xeon since Sapphire Rapids): one `tdpbsud` multiplies a tile's
//! block (16 weight rows × 32 columns) with the same block of up to 16 activation rows, where
//! the AVX-512 kernel spends eight `vpdpbusd` per activation row. Four blocks' products are
//! in flight at once, each in its own sum tile ([`IN_FLIGHT`]); the tile unit still waits on
//! each product's store for the block's float work, so `tile_rows` sends it only the weight
//! types and row counts for which it measured faster than the AVX-512 walk
//! (`isa::amx_min_rows`; BENCHMARKS.md, "AMX"). What bounds it is that float work, which the
//! VNNI kernels' bits fix at three or four vector instructions per 16 outputs of a row and
//! block and which does not overlap the tile unit's products and stores: [`block_loop`], the
//! walk's own work with its operands in L1, ran 1.2–1.5× the AVX-512 walk's on a 2-vCPU
//! Sapphire Rapids, where the bare `tdpbusd` loop runs 5–9× the `vpdpbusd` one.
//!
//! A tile's quants are already in the layout AMX reads its second operand in (each 64-byte
//! chunk holds four columns of the 16 weight rows), so a block's unpacked registers are
//! stored as they are and loaded as one tile; the activation rows of a [`QRows`] lie at one
//! stride, so block b of every row loads as the other tile. The integer sums are exact, as
//! the VNNI kernels' are; they are stored and taken by the AVX-512 kernel's float operations
//! in the same order (start, convert, scale, accumulate), so the output has the same bits as
//! every other ISA's.
//!
//! The tile instructions are reached through [`TileUnit`]: [`Amx`] issues them; the tests
//! run the same kernel over [`Emulated`], which computes what `tdpbsud` is specified to, so
//! every part but the instructions themselves is checked on any AVX-512 machine. Because
//! few machines have AMX, the kernel also checks itself when the ISA is first chosen
//! ([`usable`]): it multiplies the probe matrices of every weight type, first in a forked
//! child (tile instructions that fault stop the child, not the server), then here, and
//! compares the bits with the AVX-512 VNNI kernel's; on any difference (or a fault, or when
//! Linux does not grant the tile state) it is not used, and one warning says why.

use super::probe::every_type;
use super::x86::*;
use super::*;
use std::arch::x86_64::*;

/// Products a tile unit keeps in flight, each in its own sum tile, so that one product's
/// latency overlaps the next ones' instead of every block waiting for the last one's sums.
pub(super) const IN_FLIGHT: usize = 4;

/// What the kernel asks of the tile registers.
pub(super) trait TileUnit {
    /// Readies this thread's tiles for products of `m` activation rows (1..=16) by `quads`
    /// weight quads: 8 (a block) or 4 (half a block).
    unsafe fn begin(m: usize, quads: usize);
    /// `c[i][j] = Σ_{k < 4·quads} a[i·stride + k]·b[k / 4][4j + k % 4]` for the `m` rows of
    /// [`TileUnit::begin`]: signed activation bytes times unsigned weight quads laid out as a
    /// tile keeps them, `tdpbsud`'s product.
    unsafe fn dot(a: *const i8, stride: isize, b: *const [u8; 64], quads: usize, c: &mut Sums);
    /// [`TileUnit::dot`] of each of `ops`' products into `c[j]`.
    #[inline(always)]
    unsafe fn dots(ops: &Operands, c: &mut [Sums; IN_FLIGHT]) {
        in_turn::<Self>(ops, c)
    }
    /// Gives the tile registers back (their state is large to save on a context switch).
    unsafe fn end();
}

/// The operands of up to [`IN_FLIGHT`] products: `a[j]` times `b[j]` for `j < k`, the rows
/// of every `a[j]` at one `stride`, `quads` weight quads each ([`TileUnit::dot`]).
pub(super) struct Operands {
    a: [*const i8; IN_FLIGHT],
    b: [*const [u8; 64]; IN_FLIGHT],
    stride: isize,
    quads: usize,
    k: usize,
}

impl Operands {
    fn new(stride: isize, quads: usize) -> Self {
        Operands {
            a: [std::ptr::null(); IN_FLIGHT],
            b: [std::ptr::null(); IN_FLIGHT],
            stride,
            quads,
            k: 0,
        }
    }
}

/// `ops`' products one at a time, each through [`TileUnit::dot`].
#[inline(always)]
unsafe fn in_turn<U: TileUnit + ?Sized>(ops: &Operands, c: &mut [Sums; IN_FLIGHT]) {
    for (j, c) in c.iter_mut().enumerate().take(ops.k) {
        U::dot(ops.a[j], ops.stride, ops.b[j], ops.quads, c);
    }
}

/// The integer sums of one product: activation row i, weight row j.
#[repr(C, align(64))]
pub(super) struct Sums([[i32; TILE_ROWS]; ROWS_PER_PASS]);

impl Sums {
    const ZERO: Sums = Sums([[0; TILE_ROWS]; ROWS_PER_PASS]);
}

// `Amx::dots` stores the sum tiles 1,024 bytes apart.
const _: () = assert!(std::mem::size_of::<Sums>() == 1024);

/// A block's unpacked weight quads, stored for the tile load.
#[repr(C, align(64))]
struct Quads([[u8; 64]; 8]);

impl Quads {
    const ZERO: Quads = Quads([[0; 64]; 8]);
}

/// The tile registers themselves.
pub(super) struct Amx;

/// `ldtilecfg`'s operand (palette 1): rows and bytes a row of each tile register.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Palette 1 with tile registers `(number, rows, bytes a row)`, the others unused.
    fn new(tiles: &[(usize, usize, usize)]) -> Self {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for &(tile, rows, bytes) in tiles {
            cfg.rows[tile] = rows as u8;
            cfg.colsb[tile] = bytes as u16;
        }
        cfg
    }
}

/// The tile registers the kernel uses: [`IN_FLIGHT`] sum tiles (0 to 3), then two of
/// activations and two of weights, used in turn (a product's operands load while the last
/// one's multiply).
const A_TILES: usize = 4;
const B_TILES: usize = 6;

impl TileUnit for Amx {
    #[inline(always)]
    unsafe fn begin(m: usize, quads: usize) {
        let cfg = TileConfig::new(&[
            (0, m, 64),
            (1, m, 64),
            (2, m, 64),
            (3, m, 64),
            (A_TILES, m, 4 * quads),
            (A_TILES + 1, m, 4 * quads),
            (B_TILES, quads, 64),
            (B_TILES + 1, quads, 64),
        ]);
        // SAFETY (caller): the CPU has AMX and Linux granted the tile state ([`usable`]).
        std::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) &cfg, options(nostack, readonly));
    }

    /// One product in sum tile 0 (the operands' shapes as [`TileUnit::begin`] set them).
    #[inline(always)]
    unsafe fn dot(a: *const i8, stride: isize, b: *const [u8; 64], _: usize, c: &mut Sums) {
        std::arch::asm!(
            "tilezero tmm0",
            "tileloadd tmm4, [{a} + {stride} * 1]",
            "tileloadd tmm6, [{b} + {row} * 1]",
            "tdpbsud tmm0, tmm4, tmm6",
            "tilestored [{c} + {row} * 1], tmm0",
            a = in(reg) a, stride = in(reg) stride, b = in(reg) b,
            c = in(reg) c.0.as_mut_ptr(), row = in(reg) 64usize,
            options(nostack),
        );
    }

    /// Four products in sum tiles 0 to 3, their operands loaded in turn into tiles 4 and 6,
    /// then 5 and 7; stored after the last (a `Sums` is 1,024 bytes, `c` an array of them).
    #[inline(always)]
    unsafe fn dots(ops: &Operands, c: &mut [Sums; IN_FLIGHT]) {
        if ops.k < IN_FLIGHT {
            return in_turn::<Self>(ops, c);
        }
        std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "mov {t}, [{pa}]",
            "tileloadd tmm4, [{t} + {stride} * 1]",
            "mov {t}, [{pb}]",
            "tileloadd tmm6, [{t} + {row} * 1]",
            "tdpbsud tmm0, tmm4, tmm6",
            "mov {t}, [{pa} + 8]",
            "tileloadd tmm5, [{t} + {stride} * 1]",
            "mov {t}, [{pb} + 8]",
            "tileloadd tmm7, [{t} + {row} * 1]",
            "tdpbsud tmm1, tmm5, tmm7",
            "mov {t}, [{pa} + 16]",
            "tileloadd tmm4, [{t} + {stride} * 1]",
            "mov {t}, [{pb} + 16]",
            "tileloadd tmm6, [{t} + {row} * 1]",
            "tdpbsud tmm2, tmm4, tmm6",
            "mov {t}, [{pa} + 24]",
            "tileloadd tmm5, [{t} + {stride} * 1]",
            "mov {t}, [{pb} + 24]",
            "tileloadd tmm7, [{t} + {row} * 1]",
            "tdpbsud tmm3, tmm5, tmm7",
            "tilestored [{c} + {row} * 1], tmm0",
            "tilestored [{c} + {row} * 1 + 1024], tmm1",
            "tilestored [{c} + {row} * 1 + 2048], tmm2",
            "tilestored [{c} + {row} * 1 + 3072], tmm3",
            pa = in(reg) ops.a.as_ptr(), pb = in(reg) ops.b.as_ptr(), stride = in(reg) ops.stride,
            c = in(reg) c.as_mut_ptr(), row = in(reg) 64usize, t = out(reg) _,
            options(nostack),
        );
    }

    #[inline(always)]
    unsafe fn end() {
        std::arch::asm!("tilerelease", options(nostack, nomem));
    }
}

/// `tdpbsud` in plain integers, with the rows of the last [`TileUnit::begin`] (for tests of
/// the kernel on machines without AMX, and of the self-check).
#[cfg(test)]
pub(super) struct Emulated;

#[cfg(test)]
thread_local! {
    static EMULATED_ROWS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
impl TileUnit for Emulated {
    unsafe fn begin(m: usize, _: usize) {
        EMULATED_ROWS.with(|rows| rows.set(m));
    }

    unsafe fn dot(a: *const i8, stride: isize, b: *const [u8; 64], quads: usize, c: &mut Sums) {
        for i in 0..EMULATED_ROWS.with(|rows| rows.get()) {
            let a = a.offset(i as isize * stride);
            for j in 0..TILE_ROWS {
                c.0[i][j] = (0..4 * quads)
                    .map(|k| *a.add(k) as i32 * (*b.add(k / 4))[4 * j + k % 4] as i32)
                    .sum();
            }
        }
    }

    unsafe fn end() {}
}

/// Where block b of the walk's activation rows lies for the tile load: at one stride in
/// their [`QRows`], or copied to a buffer (one for each product in flight) when rows come
/// from elsewhere.
struct Blocks<'a, const N: usize> {
    rows: &'a [Row<'a>; N],
    stride: Option<isize>,
    copy: [[[i8; BLOCK]; ROWS_PER_PASS]; IN_FLIGHT],
}

impl<'a, const N: usize> Blocks<'a, N> {
    fn new(rows: &'a [Row<'a>; N]) -> Self {
        let at = |i: usize| rows[i].qs.as_ptr() as isize;
        let stride = if N > 1 { at(1) - at(0) } else { BLOCK as isize };
        let even = (0..N).all(|i| at(i) == at(0) + i as isize * stride);
        Blocks {
            rows,
            stride: even.then_some(stride),
            copy: [[[0; BLOCK]; ROWS_PER_PASS]; IN_FLIGHT],
        }
    }

    /// The stride from a row's block to the next row's, as [`Blocks::block`] gives them.
    fn stride(&self) -> isize {
        self.stride.unwrap_or(BLOCK as isize)
    }

    /// Block b of the first row (the others at [`Blocks::stride`]), copied if need be into
    /// buffer `slot` (< [`IN_FLIGHT`]).
    ///
    /// # Safety
    /// Every row holds block b (`tile_rows` checks the rows against the tiles).
    #[inline(always)]
    unsafe fn block(&mut self, b: usize, slot: usize) -> *const i8 {
        match self.stride {
            Some(_) => self.rows[0].q(b).as_ptr(),
            None => {
                let copy = &mut self.copy[slot];
                for (copy, row) in copy.iter_mut().zip(self.rows) {
                    *copy = *row.q(b);
                }
                copy[0].as_ptr()
            }
        }
    }
}

/// Row i's integer sums of block b, from its [`Start`] (if any), as floats times `d_a`: the
/// VNNI kernels' `t`, the same bits.
#[inline(always)]
unsafe fn scaled_sums(c: &Sums, i: usize, row: &Row, b: usize, start: Option<Start>) -> __m512 {
    let mut isum = _mm512_load_si512(c.0[i].as_ptr() as *const __m512i);
    if let Some(which) = start {
        isum = _mm512_add_epi32(isum, _mm512_set1_epi32(row.start(b, which as usize)));
    }
    _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(row.d(b)))
}

/// `acc[i] += t_i·dw` for every row i: each row's block sums from its `start`, scaled
/// ([`scaled_sums`]), times the weights' scales, the VNNI kernels' fused multiply-add.
#[inline(always)]
unsafe fn accumulate<const N: usize>(
    c: &Sums,
    rows: &[Row; N],
    b: usize,
    start: Option<Start>,
    dw: __m512,
    acc: &mut [__m512; N],
) {
    for (i, (acc, row)) in acc.iter_mut().zip(rows).enumerate() {
        *acc = _mm512_fmadd_ps(scaled_sums(c, i, row, b, start), dw, *acc);
    }
}

/// `acc[i] += mw·s_i` for every row i: the offset term of the types with a minimum, after
/// the row's scaled sums of block b, as the VNNI kernels add them.
#[inline(always)]
unsafe fn add_offsets<const N: usize>(
    rows: &[Row; N],
    b: usize,
    mw: __m512,
    acc: &mut [__m512; N],
) {
    for (acc, row) in acc.iter_mut().zip(rows) {
        *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(row.s(b)), *acc);
    }
}

impl Quads {
    /// Stores a block's eight unpacked registers for the tile load.
    #[inline(always)]
    unsafe fn store(&mut self, regs: [__m512i; 8]) {
        for (to, q) in self.0.iter_mut().zip(regs) {
            _mm512_store_si512(to.as_mut_ptr() as *mut __m512i, q);
        }
    }
}

/// The nibble and five-bit walks: [`IN_FLIGHT`] blocks unpacked and multiplied at a time,
/// then each block's sums scaled and accumulated in block order.
#[inline(always)]
unsafe fn nibbles_amx<U: TileUnit, T: NibbleTile, const N: usize>(
    tiles: &[T],
    supers: &[SuperScales],
    rows: &[Row; N],
    acc: &mut [__m512; N],
) {
    let mut blocks = Blocks::new(rows);
    let (mut w, mut c) = ([Quads::ZERO; IN_FLIGHT], [Sums::ZERO; IN_FLIGHT]);
    let mut ops = Operands::new(blocks.stride(), 8);
    for (g, group) in tiles.chunks(IN_FLIGHT).enumerate() {
        for (j, tile) in group.iter().enumerate() {
            prefetch_ahead(tile);
            w[j].store(match tile.high() {
                Some(high) => five_bit_quads::<Lanes512>(tile.qs(), high, 0),
                None => nibble_quads::<Lanes512>(tile.qs(), 0),
            });
            ops.a[j] = blocks.block(g * IN_FLIGHT + j, j);
            ops.b[j] = w[j].0.as_ptr();
        }
        ops.k = group.len();
        U::dots(&ops, &mut c);
        for (j, tile) in group.iter().enumerate() {
            let b = g * IN_FLIGHT + j;
            let (dw, mw) = scales_of::<Lanes512>(tile.scales(super_of::<T>(supers, b)), 0);
            accumulate(&c[j], rows, b, T::START, dw, acc);
            if T::CENTER == 0 {
                add_offsets(rows, b, mw, acc);
            }
        }
    }
}

/// The Q8_0 walk: the stored `q + 128` load as they are; the sums start at −128·Σq_a.
#[inline(always)]
unsafe fn q8_0_amx<U: TileUnit, const N: usize>(
    tiles: &[Q8_0Tile],
    rows: &[Row; N],
    acc: &mut [__m512; N],
) {
    let mut blocks = Blocks::new(rows);
    let mut c = [Sums::ZERO; IN_FLIGHT];
    let mut ops = Operands::new(blocks.stride(), 8);
    for (g, group) in tiles.chunks(IN_FLIGHT).enumerate() {
        for (j, tile) in group.iter().enumerate() {
            prefetch_ahead(tile);
            ops.a[j] = blocks.block(g * IN_FLIGHT + j, j);
            ops.b[j] = tile.qs.as_ptr();
        }
        ops.k = group.len();
        U::dots(&ops, &mut c);
        for (j, tile) in group.iter().enumerate() {
            let dw = Lanes512::halves(tile.d.as_ptr());
            accumulate(&c[j], rows, g * IN_FLIGHT + j, Some(Start::Q8_0), dw, acc);
        }
    }
}

/// The Q6_K walk: half blocks, [`IN_FLIGHT`] halves (two blocks) at a time; half h of a
/// block, then the next, as the VNNI kernels take them.
#[inline(always)]
unsafe fn q6k_amx<U: TileUnit, const N: usize>(
    tiles: &[Q6KTile],
    supers: &[SuperScales],
    rows: &[Row; N],
    acc: &mut [__m512; N],
) {
    const BLOCKS: usize = IN_FLIGHT / 2;
    let mut blocks = Blocks::new(rows);
    let (mut w, mut c) = ([Quads::ZERO; BLOCKS], [Sums::ZERO; IN_FLIGHT]);
    let mut ops = Operands::new(blocks.stride(), 4);
    for (g, group) in tiles.chunks(BLOCKS).enumerate() {
        for (j, tile) in group.iter().enumerate() {
            prefetch_ahead(tile);
            w[j].store(six_bit_quads::<Lanes512>(tile, 0));
            let block = blocks.block(g * BLOCKS + j, j);
            for h in 0..2 {
                ops.a[2 * j + h] = block.add(16 * h);
                ops.b[2 * j + h] = w[j].0[4 * h..].as_ptr();
            }
        }
        ops.k = 2 * group.len();
        U::dots(&ops, &mut c);
        for (j, tile) in group.iter().enumerate() {
            let b = g * BLOCKS + j;
            let d = Lanes512::halves(supers[b / 8].d.as_ptr());
            for (h, start) in [(0, Start::Q6KHalf0), (1, Start::Q6KHalf1)] {
                let dw = _mm512_mul_ps(d, Lanes512::bytes(tile.sc[h].as_ptr() as *const u8, true));
                accumulate(&c[2 * j + h], rows, b, Some(start), dw, acc);
            }
        }
    }
}

/// One tile group times `N` activation rows (at most 16) on the tile unit `U`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn tile_amx<U: TileUnit, const N: usize>(
    tiles: Tiles,
    rows: &[Row; N],
    out: &mut [[f32; TILE_ROWS]; N],
) {
    let mut acc = [_mm512_setzero_ps(); N];
    // Q6_K's products take half blocks.
    let quads = if matches!(tiles, Tiles::Q6K(..)) {
        4
    } else {
        8
    };
    U::begin(N, quads);
    match tiles {
        Tiles::Q4_1(tiles) => nibbles_amx::<U, _, N>(tiles, &[], rows, &mut acc),
        Tiles::Q5_0(tiles) => nibbles_amx::<U, _, N>(tiles, &[], rows, &mut acc),
        Tiles::Q5(tiles) => nibbles_amx::<U, _, N>(tiles, &[], rows, &mut acc),
        Tiles::Q4K(tiles, supers) => nibbles_amx::<U, _, N>(tiles, supers, rows, &mut acc),
        Tiles::Q5K(tiles, supers) => nibbles_amx::<U, _, N>(tiles, supers, rows, &mut acc),
        Tiles::Q8_0(tiles) => q8_0_amx::<U, N>(tiles, rows, &mut acc),
        Tiles::Q6K(tiles, supers) => q6k_amx::<U, N>(tiles, supers, rows, &mut acc),
    }
    U::end();
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm512_storeu_ps(out.as_mut_ptr(), acc);
    }
}

/// One tile group times `rows` (1 to 16) into `out[..rows.len()]` on the tile unit `U`.
///
/// # Safety
/// The CPU runs AVX-512 VNNI, `U` is [`Amx`] only where [`usable`] said so, and every row
/// holds the tiles' blocks ([`Row::holds`]; `tile_rows` checks it, the probes' rows are
/// quantized for their matrix).
pub(super) unsafe fn tile_rows_amx<U: TileUnit>(
    tiles: Tiles,
    rows: &[Row],
    out: &mut [[f32; TILE_ROWS]; ROWS_PER_PASS],
) {
    macro_rules! walk {
        ($($n:literal)*) => {
            match rows.len() {
                $($n => tile_amx::<U, $n>(
                    tiles,
                    rows.try_into().expect("row count"),
                    (&mut out[..$n]).try_into().expect("rows"),
                ),)*
                n => panic!("an AMX walk takes 1 to 16 rows, not {n}"),
            }
        };
    }
    walk!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// Multiply-adds of one round of [`bound_loop`]: four `tdpbusd` of 16 × 16 × 64.
pub const BOUND_ROUND: usize = 4 * 16 * 16 * 64;

/// `rounds` rounds of four independent `tdpbusd` into four sum tiles, nothing else: the tile
/// unit's multiply-add rate, for `bench_decode`'s bound. `false` (nothing run) where the
/// kernels do not use AMX.
pub fn bound_loop(rounds: usize) -> bool {
    if !usable() || rounds == 0 {
        return false;
    }
    // Four sum tiles, two tiles of activations and two of weights, all 16 rows of 64 bytes.
    let cfg = TileConfig::new(&std::array::from_fn::<_, 8, _>(|tile| (tile, 16, 64)));
    let zeros = [0u8; 16 * 64];
    // SAFETY: `usable` saw AMX and had the tile state granted; the loads read `zeros`.
    unsafe {
        std::arch::asm!(
            "ldtilecfg [{cfg}]",
            "tileloadd tmm4, [{z} + {row} * 1]",
            "tileloadd tmm5, [{z} + {row} * 1]",
            "tileloadd tmm6, [{z} + {row} * 1]",
            "tileloadd tmm7, [{z} + {row} * 1]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tdpbusd tmm0, tmm4, tmm6",
            "tdpbusd tmm1, tmm4, tmm7",
            "tdpbusd tmm2, tmm5, tmm6",
            "tdpbusd tmm3, tmm5, tmm7",
            "dec {n}",
            "jnz 2b",
            "tilerelease",
            cfg = in(reg) &cfg, z = in(reg) zeros.as_ptr(), row = in(reg) 64usize,
            n = inout(reg) rounds => _,
            options(nostack),
        );
    }
    true
}

/// Multiply-adds of one round of [`block_loop`]: `IN_FLIGHT` blocks of 16 activation rows
/// times 16 weight rows.
pub const BLOCK_ROUND: usize = IN_FLIGHT * 16 * TILE_ROWS * BLOCK;

/// `rounds` rounds of the AMX walk's own work with its operands in L1: `IN_FLIGHT` blocks'
/// tile products of 16 rows (`TileUnit::dots`, their sums stored) and every row's float work
/// on them (`with_min`: Q4_1's, the scaled sums and the minimum's term; else Q8_0's, the sums
/// from their start), as the kernel does them, without unpacking or streaming weights. The
/// AMX walk keeps the VNNI kernels' bits, which fixes that float work, so this loop's
/// rate bounds every AMX walk of our blocks; `bench_decode products` shows it beside them.
/// `false` (nothing run) where the kernels do not use AMX.
pub fn block_loop(rounds: usize, with_min: bool) -> bool {
    if !usable() || rounds == 0 {
        return false;
    }
    let mut a = QRows::default();
    a.quantize(
        &super::probe::pseudo(ROWS_PER_PASS * IN_FLIGHT * BLOCK, 71),
        IN_FLIGHT * BLOCK,
    );
    let rows: Vec<Row> = (0..ROWS_PER_PASS).map(|r| a.row(r)).collect();
    let rows: &[Row; ROWS_PER_PASS] = rows[..].try_into().expect("16 rows");
    // SAFETY: `usable` saw AMX and AVX-512 VNNI and had the tile state granted; the rows
    // hold the blocks the loop reads.
    let out = unsafe { block_loop_on(rounds, rows, with_min) };
    std::hint::black_box(out);
    true
}

/// [`block_loop`] on `rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn block_loop_on(rounds: usize, rows: &[Row; ROWS_PER_PASS], with_min: bool) -> f32 {
    let mut w = Quads::ZERO;
    for (t, quad) in w.0.iter_mut().enumerate() {
        for (i, q) in quad.iter_mut().enumerate() {
            *q = (t * 37 + i * 11) as u8 & 0x0f;
        }
    }
    let mut blocks = Blocks::new(rows);
    let mut ops = Operands::new(blocks.stride(), 8);
    for j in 0..IN_FLIGHT {
        ops.a[j] = blocks.block(j, j);
        ops.b[j] = w.0.as_ptr();
    }
    ops.k = IN_FLIGHT;
    let mut c = [Sums::ZERO; IN_FLIGHT];
    let mut acc = [_mm512_setzero_ps(); ROWS_PER_PASS];
    let (dw, mw) = (_mm512_set1_ps(0.5), _mm512_set1_ps(-0.25));
    Amx::begin(ROWS_PER_PASS, 8);
    for _ in 0..rounds {
        Amx::dots(&ops, &mut c);
        for (b, c) in c.iter().enumerate() {
            if with_min {
                accumulate(c, rows, b, None, dw, &mut acc);
                add_offsets(rows, b, mw, &mut acc);
            } else {
                accumulate(c, rows, b, Some(Start::Q8_0), dw, &mut acc);
            }
        }
    }
    Amx::end();
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

/// Whether the kernels may use AMX: the CPU has AMX-INT8 (and AVX-512 VNNI for the float
/// work), Linux grants this process the tile state, and the kernel passes its self-check.
/// Decided once per process; a refusal is said once on standard error.
pub(super) fn usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        if !cpu_has_amx() {
            return false;
        }
        let probe = Probe::new();
        // SAFETY: the CPU has AMX and, once `request_tile_state` returns, the tile state is
        // granted; the self-check runs in this process only after it ran in a child.
        let verdict = request_tile_state()
            .and_then(|()| unsafe { runs_in_a_child::<Amx>(&probe) })
            .and_then(|()| unsafe { self_check::<Amx>(&probe) });
        match verdict {
            Ok(()) => true,
            Err(why) => {
                crate::diag!("warning: not using AMX: {why}; the products use AVX-512 VNNI");
                false
            }
        }
    })
}

/// CPUID: AMX-TILE and AMX-INT8 (leaf 7, EDX bits 24 and 25), with the AVX-512 VNNI the
/// kernel's float work and its self-check need.
fn cpu_has_amx() -> bool {
    // (Leaf 7 reads as zeros on CPUs too old to have it.)
    let leaf7 = __cpuid_count(7, 0);
    let amx = leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0;
    amx && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("fma")
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// without which the first tile instruction faults.
fn request_tile_state() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a request for a permission; it changes nothing else.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        if rc != 0 {
            return Err(format!(
                "Linux did not grant the tile state ({})",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    Err("the tile state is requested only on Linux".into())
}

/// Runs the probe products on `U` in a forked child first, so that tile instructions that
/// fault (a CPU or hypervisor that reports AMX and does not run it) stop the child, not this
/// process. Everything the child touches is made before the fork: it allocates nothing, takes
/// no lock and leaves by `_exit`.
///
/// # Safety
/// The CPU runs AVX-512 VNNI.
pub(super) unsafe fn runs_in_a_child<U: TileUnit>(probe: &Probe) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        let rows = probe.rows();
        let mut out = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
        let pid = libc::fork();
        if pid == 0 {
            for (w, rows) in probe.mats.iter().zip(&rows) {
                for n in 1..=ROWS_PER_PASS {
                    tile_rows_amx::<U>(w.group(0), &rows[..n], &mut out);
                }
            }
            std::hint::black_box(&out);
            libc::_exit(0);
        }
        if pid < 0 {
            return Err(format!(
                "no child process to try it in ({})",
                std::io::Error::last_os_error()
            ));
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("its trial process was lost ({error})"));
            }
        }
        match (libc::WIFEXITED(status), libc::WIFSIGNALED(status)) {
            (true, _) if libc::WEXITSTATUS(status) == 0 => Ok(()),
            (_, true) => Err(format!(
                "its tile instructions stopped a trial process (signal {})",
                libc::WTERMSIG(status)
            )),
            _ => Err(format!("its trial process failed (status {status})")),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = probe;
        Err("it is tried only on Linux".into())
    }
}

/// What the self-check multiplies: a group of 16 weight rows of every weight type, and 16
/// activation rows of each one's width.
pub(super) struct Probe {
    mats: [QMatrix; 7],
    acts: Vec<QRows>,
}

impl Probe {
    /// The types' names, in the order of [`every_type`].
    const NAMES: [&'static str; 7] = ["Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"];

    pub(super) fn new() -> Self {
        let mats = every_type(TILE_ROWS, 41);
        let acts = mats
            .iter()
            .map(|w| {
                let mut a = QRows::default();
                a.quantize(
                    &super::probe::pseudo(ROWS_PER_PASS * w.cols(), 43),
                    w.cols(),
                );
                a
            })
            .collect();
        Probe { mats, acts }
    }

    /// Each matrix's activation rows.
    fn rows(&self) -> Vec<Vec<Row<'_>>> {
        self.acts
            .iter()
            .map(|a| (0..ROWS_PER_PASS).map(|r| a.row(r)).collect())
            .collect()
    }
}

/// Multiplies the probe matrices of every weight type (one group of 16 weight rows each)
/// with 1 to 16 activation rows on `U` and on the AVX-512 VNNI kernel: `Err` names the
/// first output whose bits differ.
///
/// # Safety
/// The CPU runs AVX-512 VNNI, and `U` can run here.
pub(super) unsafe fn self_check<U: TileUnit>(probe: &Probe) -> Result<(), String> {
    for ((w, rows), name) in probe.mats.iter().zip(probe.rows()).zip(Probe::NAMES) {
        let mut want = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
        tile_rows(Isa::Avx512Vnni, w.group(0), &rows, &mut want);
        for n in 1..=ROWS_PER_PASS {
            let mut got = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
            tile_rows_amx::<U>(w.group(0), &rows[..n], &mut got);
            for (i, (g, e)) in got[..n].iter().zip(&want).enumerate() {
                if let Some(j) = (0..TILE_ROWS).find(|&j| g[j].to_bits() != e[j].to_bits()) {
                    return Err(format!(
                        "its probe product differs from the AVX-512 VNNI kernel's ({name}, \
                         {n} rows: row {i}, output {j}: {} against {})",
                        g[j], e[j]
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tdpbsud` with one product's sign turned: what a wrong tile layout would give.
    struct Faulty;

    impl TileUnit for Faulty {
        unsafe fn begin(m: usize, quads: usize) {
            Emulated::begin(m, quads)
        }
        unsafe fn dot(a: *const i8, stride: isize, b: *const [u8; 64], quads: usize, c: &mut Sums) {
            Emulated::dot(a, stride, b, quads, c);
            c.0[0][TILE_ROWS - 1] += 1;
        }
        unsafe fn end() {}
    }

    /// A tile unit whose instructions fault.
    struct Faulting;

    impl TileUnit for Faulting {
        unsafe fn begin(_: usize, _: usize) {}
        unsafe fn dot(_: *const i8, _: isize, _: *const [u8; 64], _: usize, _: &mut Sums) {
            libc::abort()
        }
        unsafe fn end() {}
    }

    fn has_avx512() -> bool {
        Isa::available().contains(&Isa::Avx512Vnni)
    }

    #[test]
    fn the_kernel_over_the_emulated_tiles_gives_the_scalar_bits() {
        if !has_avx512() {
            crate::diag!("skipped: the AMX kernel's float work needs AVX-512 VNNI");
            return;
        }
        for w in every_type(3 * TILE_ROWS + 5, 51) {
            let cols = w.cols();
            let mut a = QRows::default();
            a.quantize(&super::super::probe::pseudo(ROWS_PER_PASS * cols, 53), cols);
            let rows: Vec<Row> = (0..ROWS_PER_PASS).map(|r| a.row(r)).collect();
            for g in 0..w.groups() {
                for n in 1..=ROWS_PER_PASS {
                    let mut want = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
                    let mut got = want;
                    for (r, row) in rows[..n].iter().enumerate() {
                        let mut one = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
                        tile_rows(Isa::Scalar, w.group(g), std::slice::from_ref(row), &mut one);
                        want[r] = one[0];
                    }
                    // SAFETY: AVX-512 VNNI is here; the emulated unit runs anywhere.
                    unsafe { tile_rows_amx::<Emulated>(w.group(g), &rows[..n], &mut got) };
                    assert_eq!(got[..n], want[..n], "group {g}, {n} rows");
                    // Rows that do not lie at one stride (copied block by block).
                    let mut shuffled = rows[..n].to_vec();
                    shuffled.reverse();
                    let mut back = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
                    unsafe { tile_rows_amx::<Emulated>(w.group(g), &shuffled, &mut back) };
                    let mut reversed = want[..n].to_vec();
                    reversed.reverse();
                    assert_eq!(back[..n], reversed[..], "group {g}, {n} rows reversed");
                }
            }
        }
    }

    /// On `Isa::Amx`, the products the tile unit does not take (`amx_min_rows`) run on the
    /// AVX-512 VNNI walk, eight rows at a time, with the scalar bits: checked with no tile
    /// instruction, so on any AVX-512 machine.
    #[test]
    fn products_the_tile_unit_does_not_take_give_the_scalar_bits() {
        if !has_avx512() {
            crate::diag!("skipped: the AVX-512 VNNI walk needs AVX-512 VNNI");
            return;
        }
        let mut checked = 0;
        for w in every_type(TILE_ROWS, 61) {
            let cols = w.cols();
            let mut a = QRows::default();
            a.quantize(&super::super::probe::pseudo(ROWS_PER_PASS * cols, 67), cols);
            let rows: Vec<Row> = (0..ROWS_PER_PASS).map(|r| a.row(r)).collect();
            let tiles = w.group(0);
            let min = super::super::isa::amx_min_rows(tiles).unwrap_or(usize::MAX);
            for n in (1..=ROWS_PER_PASS).filter(|&n| n < min) {
                let mut got = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
                tile_rows(Isa::Amx, tiles, &rows[..n], &mut got);
                for (r, row) in rows[..n].iter().enumerate() {
                    let mut one = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
                    tile_rows(Isa::Scalar, tiles, std::slice::from_ref(row), &mut one);
                    assert_eq!(got[r], one[0], "{n} rows, row {r}");
                }
                checked += 1;
            }
        }
        // Every type below its threshold, the ones AMX never takes at 9 to 16 rows too.
        assert!(checked > 7 * 8, "{checked}");
    }

    /// The self-check passes the emulated tiles and refuses a unit that gets one sum wrong;
    /// the trial in a child passes them and reports a unit whose instructions fault, this
    /// process going on.
    #[test]
    fn right_units_pass_and_wrong_or_faulting_ones_are_refused() {
        if !has_avx512() {
            crate::diag!("skipped: the self-check compares with the AVX-512 VNNI kernel");
            return;
        }
        // SAFETY: AVX-512 VNNI is here; the emulated units run anywhere.
        let probe = Probe::new();
        let (checked, tried) = unsafe {
            (
                self_check::<Emulated>(&probe),
                runs_in_a_child::<Emulated>(&probe),
            )
        };
        assert_eq!((checked, tried), (Ok(()), Ok(())));
        let refusals = unsafe {
            [
                (
                    self_check::<Faulty>(&probe),
                    "Q4_1, 1 rows: row 0, output 15",
                ),
                (
                    runs_in_a_child::<Faulting>(&probe),
                    "stopped a trial process (signal 6)",
                ),
            ]
        };
        for (refused, says) in refusals {
            let e = refused.unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn amx_is_chosen_only_where_the_cpu_has_it_and_it_checks_out() {
        let chosen = Isa::detect() == Isa::Amx;
        assert_eq!(chosen, cpu_has_amx() && usable());
        // The bench loops run exactly where the kernels use AMX (on the real tiles).
        assert_eq!(
            (bound_loop(2), block_loop(2, false), block_loop(2, true)),
            (chosen, chosen, chosen)
        );
        if cpu_has_amx() {
            // Where the CPU has AMX, the real instructions must pass the check.
            assert!(usable(), "the AMX kernel failed its self-check on this CPU");
        } else {
            assert!(!Isa::available().contains(&Isa::Amx));
            assert!("amx".parse::<Isa>().is_err());
        }
    }
}
