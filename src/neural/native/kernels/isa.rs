//! Which instruction set the kernels use (detected once per process, or named for a
//! measurement), and the dispatch of one group of tiles to that set's kernel.

use super::*;

/// The instruction set the kernels use, chosen once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    AvxVnni,
    /// AVX-512 with VNNI: two blocks per instruction.
    Avx512Vnni,
    /// AMX-INT8 for the products where it pays (16 activation rows per tile instruction;
    /// `amx_min_rows`), AVX-512 VNNI for the rest; chosen only after its self-check passes
    /// (the `amx` module).
    Amx,
}

impl Isa {
    /// The instruction sets this CPU can run, best last.
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        let avx512 = matches!(best, Isa::Avx512Vnni | Isa::Amx);
        [
            Isa::Scalar,
            Isa::Avx2,
            Isa::AvxVnni,
            Isa::Avx512Vnni,
            Isa::Amx,
        ]
        .into_iter()
        .filter(|&isa| match isa {
            Isa::Scalar => true,
            Isa::Avx2 => best != Isa::Scalar,
            Isa::AvxVnni => best == Isa::AvxVnni || (avx512 && has_avxvnni()),
            Isa::Avx512Vnni => avx512,
            Isa::Amx => best == Isa::Amx,
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
                if amx::usable() {
                    return Isa::Amx;
                }
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

    /// `scalar`, `avx2`, `avxvnni`, `avx512vnni` or `amx`, if this CPU runs it.
    fn from_str(name: &str) -> Result<Isa, String> {
        let isa = match name {
            "scalar" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avxvnni" => Isa::AvxVnni,
            "avx512vnni" => Isa::Avx512Vnni,
            "amx" => Isa::Amx,
            other => {
                return Err(format!(
                    "{other}: expected scalar, avx2, avxvnni, avx512vnni or amx"
                ))
            }
        };
        if !Isa::available().contains(&isa) {
            return Err(format!("this CPU cannot run {isa:?}"));
        }
        Ok(isa)
    }
}

pub(super) fn has_avxvnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avxvnni");
    #[allow(unreachable_code)]
    false
}

/// The tiles of one group (16 weight rows, all blocks), with their super-blocks' scales.
#[derive(Clone, Copy)]
pub(super) enum Tiles<'a> {
    Q4_1(&'a [Q4Tile]),
    Q5_0(&'a [Q5_0Tile]),
    Q5(&'a [Q5Tile]),
    Q8_0(&'a [Q8_0Tile]),
    Q4K(&'a [Q4KTile], &'a [SuperScales]),
    Q5K(&'a [Q5KTile], &'a [SuperScales]),
    Q6K(&'a [Q6KTile], &'a [SuperScales]),
}

impl Tiles<'_> {
    /// The group's blocks (one tile a block).
    fn blocks(&self) -> usize {
        match self {
            Tiles::Q4_1(t) => t.len(),
            Tiles::Q5_0(t) => t.len(),
            Tiles::Q5(t) => t.len(),
            Tiles::Q8_0(t) => t.len(),
            Tiles::Q4K(t, _) => t.len(),
            Tiles::Q5K(t, _) => t.len(),
            Tiles::Q6K(t, _) => t.len(),
        }
    }
}

/// The fewest activation rows for which the AMX walk of `tiles`' weight type is used
/// (`None`: never; the AVX-512 VNNI walk, the same bits, takes them). Measured with
/// `bench_decode products --isa amx` against `--isa avx512vnni` on a 16-core Intel Xeon with
/// AMX-INT8 (2 threads; that host's figures moved by up to half between runs of one build,
/// so only what held across five pairs of runs is taken): at 16 rows the Q4_K walk was ahead
/// in four pairs of five (0.17–0.37 ms against 0.22–0.37), Q4_1 and Q6_K in two or three with
/// losses up to 2×, Q5_0 and Q8_0 in none; at 8 rows or fewer AMX never paid (one row:
/// 0.12 ms against 0.05 for Q4_K), since each block's tile product is stored and read back
/// for its float work, and a step costs what the products' unpacking and that work cost.
/// On a 2-vCPU Xeon with AMX, timing both walks in the same rounds (`products --isa
/// avx512vnni,amx`, BENCHMARKS.md), Q4_K at 16 rows was again the one product ahead in both
/// runs (0.424 and 0.563 ms against 0.446 and 0.760), every other type behind at 8 and 16.
pub(super) fn amx_min_rows(tiles: Tiles) -> Option<usize> {
    match tiles {
        Tiles::Q4K(..) => Some(ROWS_PER_PASS),
        _ => None,
    }
}

/// One group of tiles times `rows` (at most [`ROWS_PER_PASS`]) into `out[..rows.len()]`, in
/// walks of [`walk_rows`] rows, or, for the weight types and row counts where unpacking each
/// block again for every walk costs most, one unpacked walk ([`unpacked_min_rows`]); on AMX,
/// the AMX walk only for the weight types and row counts where it pays ([`amx_min_rows`]),
/// the AVX-512 VNNI walks elsewhere.
pub(super) fn tile_rows(
    isa: Isa,
    tiles: Tiles,
    rows: &[Row],
    out: &mut [[f32; TILE_ROWS]; ROWS_PER_PASS],
) {
    // The x86 walks index the rows' blocks unchecked (`Row::q` and the rest).
    assert!(
        rows.iter().all(|row| row.holds(tiles.blocks())),
        "tile_rows: an activation row shorter than the tiles"
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx && amx_min_rows(tiles).is_some_and(|min| rows.len() >= min) {
        // SAFETY: `Isa::detect` chose AMX only after its self-check passed.
        return unsafe { amx::tile_rows_amx::<amx::Amx>(tiles, rows, out) };
    }
    // The products AMX does not take run on the AVX-512 VNNI walk (the same bits).
    let isa = if isa == Isa::Amx {
        Isa::Avx512Vnni
    } else {
        isa
    };
    #[cfg(target_arch = "x86_64")]
    if unpacked_min_rows(isa, tiles).is_some_and(|min| rows.len() >= min) {
        // SAFETY: as in `walk`; every unpacked walk gives every ISA's bits, and the AVX2
        // one runs on every x86 ISA but the scalar, for which there is none.
        unsafe {
            match (isa, tiles) {
                (Isa::AvxVnni, _) => avx2::vnni_walks::unpacked(tiles, rows, out),
                (Isa::Avx512Vnni, Tiles::Q6K(t, s)) => avx512::q6k_unpacked(t, s, rows, out),
                _ => avx2::avx2_walks::unpacked(tiles, rows, out),
            }
        }
        return;
    }
    let per_walk = walk_rows(isa, tiles);
    for (c, chunk) in rows.chunks(per_walk).enumerate() {
        walk(isa, tiles, chunk, &mut out[c * per_walk..]);
    }
}

/// The rows one walk of `isa` takes over `tiles`: [`rows_per_pass`], with two exceptions
/// measured on a 2-vCPU AMD EPYC Zen 5 (`bench_decode products`, alternating builds):
/// - Q6_K on AVX-512, four: its eight-row walk (two planes unpacked, two sums a block for
///   every row) cost more per row than two walks of four (896×4864, three pairs: 8 rows
///   0.089–0.107 → 0.080–0.096 ms, 16 rows 0.181–0.203 → 0.155–0.181), as its eight rows
///   already did on a Zen 4 (48% of the bound against 60% at four rows);
/// - Q8_0 on AVX2, eight: its walk keeps one quad's weights live at a time (see
///   `avx2.rs`), so eight rows' sums fit, and the weights' sign flip and magnitudes are paid
///   once for eight (4864×896, three pairs: 16 rows 0.532–0.879 → 0.498–0.534 ms; the 151,936-row
///   output matrix 21.2–23.2 → 19.4–24.2).
fn walk_rows(isa: Isa, tiles: Tiles) -> usize {
    match (isa, tiles) {
        (Isa::Avx512Vnni, Tiles::Q6K(..)) => 4,
        (Isa::Avx2, Tiles::Q8_0(..)) => 8,
        _ => rows_per_pass(isa),
    }
}

/// The fewest activation rows for which `isa` takes a product of `tiles`' weight type
/// through its unpacked walk (`None`: never), which unpacks each block once into an L1
/// buffer and walks the rows over it four at a time, instead of unpacking it again for each
/// walk of [`walk_rows`] rows. Measured on a 2-vCPU Intel Xeon with AMX (Sapphire Rapids;
/// 4864×896 and 896×4864 products on two threads, the two walks alternating in one
/// process, 25th percentiles of 40 products, two or three runs; BENCHMARKS.md), the unpacked
/// walk's time over the other's:
/// - Q6_K, whose two planes cost the most to unpack: AVX2 and AVX-VNNI 0.80–0.90 at 5, 9, 12
///   and 16 rows; AVX-512, whose Q6_K walks take four rows, 0.89–1.02 from nine rows (and
///   1.17 at five, where the buffer cost more than the one unpacking it saved);
/// - Q5_0: AVX2 and AVX-VNNI 0.90–1.02 at 9, 12 and 16 rows (from five to eight rows a row
///   group is walked once or twice);
/// - Q5_1, Q5_K and Q4_K: AVX2 0.90–0.99 at 9–16 rows; AVX-VNNI 0.99–1.10, as Q4_1 (the
///   cheapest to unpack) on every ISA; AVX-512's nibble walks take eight rows, so they
///   unpack once for eight (unpacked, 1.04–1.50);
/// - Q8_0 never: its walks read the tiles as they are.
fn unpacked_min_rows(isa: Isa, tiles: Tiles) -> Option<usize> {
    match (isa, tiles) {
        (Isa::Avx2 | Isa::AvxVnni, Tiles::Q6K(..)) => Some(5),
        (Isa::Avx512Vnni, Tiles::Q6K(..)) => Some(9),
        (Isa::Avx2 | Isa::AvxVnni, Tiles::Q5_0(_)) => Some(9),
        (Isa::Avx2, Tiles::Q5(_) | Tiles::Q5K(..) | Tiles::Q4K(..)) => Some(9),
        _ => None,
    }
}

/// One walk of `isa` over the tiles with `rows` (at most [`walk_rows`]; AMX's
/// products go through [`tile_rows`]), once the rows were checked against the tiles.
fn walk(isa: Isa, tiles: Tiles, rows: &[Row], out: &mut [[f32; TILE_ROWS]]) {
    macro_rules! dispatch {
        ($n:literal) => {{
            let rows: &[Row; $n] = rows.try_into().expect("row count");
            let out: &mut [[f32; TILE_ROWS]; $n] = (&mut out[..$n]).try_into().expect("rows");
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::detect` chose these only after checking the CPU features, and
                // every row holds the tiles' blocks (`tile_rows` checked).
                Isa::Avx512Vnni | Isa::Amx => unsafe {
                    avx512::tile_avx512::<$n>(tiles, rows, out)
                },
                #[cfg(target_arch = "x86_64")]
                Isa::AvxVnni => unsafe { avx2::vnni_walks::tile::<$n>(tiles, rows, out) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { avx2::avx2_walks::tile::<$n>(tiles, rows, out) },
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
