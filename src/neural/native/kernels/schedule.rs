//! A product scheduled over the pool's threads: tile groups split by bytes, each output
//! computed by one thread the same way, so the result does not depend on the split. Or, for
//! greedy decoding, each row's greedy pick of the product, found as it goes
//! ([`matmul_picks`]).

use super::*;
use crate::neural::native::pool::{DisjointOut, Pool};

/// One activation row's blocks: scales, sums, quants and kept starts, block b at index b.
#[derive(Clone, Copy)]
pub(super) struct Row<'a> {
    pub(super) d: &'a [f32],
    pub(super) s: &'a [f32],
    pub(super) qs: &'a [[i8; 32]],
    pub(super) sums: &'a [[i32; 2]],
    pub(super) starts: &'a [[i32; 4]],
}

/// Block b of a row without a bounds check, for the x86 walks: [`tile_rows`] checks once per
/// walk that every row holds the tiles' blocks. (Checked indexing cost a load, a compare and a
/// branch per row and block, and on Intel cores a branch can take the port of the vector
/// multiplies: on a 2-vCPU Xeon the AVX-512 walk's 8- and 16-row products took 27–37% longer
/// with the checks, 142 compares in its eight-row kernel.)
impl<'a> Row<'a> {
    /// Whether every per-block array holds at least `blocks` blocks.
    pub(super) fn holds(&self, blocks: usize) -> bool {
        [
            self.d.len(),
            self.s.len(),
            self.qs.len(),
            self.sums.len(),
            self.starts.len(),
        ]
        .iter()
        .all(|&n| n >= blocks)
    }

    /// # Safety
    /// `b` is below a block count [`Row::holds`] answered true for.
    #[inline(always)]
    pub(super) unsafe fn q(&self, b: usize) -> &'a [i8; 32] {
        self.qs.get_unchecked(b)
    }

    /// # Safety
    /// As [`Row::q`].
    #[inline(always)]
    pub(super) unsafe fn d(&self, b: usize) -> f32 {
        *self.d.get_unchecked(b)
    }

    /// # Safety
    /// As [`Row::q`].
    #[inline(always)]
    pub(super) unsafe fn s(&self, b: usize) -> f32 {
        *self.s.get_unchecked(b)
    }

    /// # Safety
    /// As [`Row::q`].
    #[inline(always)]
    pub(super) unsafe fn start(&self, b: usize, which: usize) -> i32 {
        self.starts.get_unchecked(b)[which]
    }
}

/// Below this many tile groups (of 16 weight rows) per thread a product is not split.
pub(super) const MIN_GROUPS_PER_THREAD: usize = 4;

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

/// Each activation row's greedy pick of its product with `w`: the first largest output above
/// −∞ (NaN never counts) and its value, or `None` — [`crate::lm::greedy_pick`] of the row
/// [`matmul_into_rows`] would write, without writing it. A greedy pass's output projection
/// reads the picks alone, so its rows (151,936 floats each for Qwen2.5) never go to memory
/// and back. The tile groups are split across the threads as [`matmul`] splits them; each
/// thread keeps its groups' picks (lane by lane: `PickLanes`), and the threads' picks are
/// merged in the order of their groups.
pub fn matmul_picks(isa: Isa, w: &QMatrix, a: &QRows, pool: &mut Pool) -> Picks {
    assert_eq!(w.cols, a.cols, "matmul: inner dimensions differ");
    // Each part's picks, in the order of the parts' groups.
    let found: Vec<std::sync::Mutex<Picks>> =
        (0..pool.threads()).map(|_| Default::default()).collect();
    over_threads(&[w], pool, &|part, gs| {
        let mut lanes = vec![PickLanes::EMPTY; a.rows];
        matmul_groups(isa, w, a, gs, &mut |j0, r, v| {
            lanes[r].add(j0, v, w.rows - j0);
        });
        *found[part].lock().unwrap_or_else(|e| e.into_inner()) =
            lanes.iter().map(PickLanes::pick).collect();
    });
    let mut picks = vec![None; a.rows];
    for part in found {
        let part = part.into_inner().unwrap_or_else(|e| e.into_inner());
        for (pick, found) in picks.iter_mut().zip(part) {
            // A later part's pick counts only if larger: ties keep the smaller id.
            if found.is_some_and(|f| pick.is_none_or(|p: (u32, f32)| f.1 > p.1)) {
                *pick = found;
            }
        }
    }
    picks
}

/// Each row's greedy pick: its id and value, or `None` (no output above −∞).
pub type Picks = Vec<Option<(u32, f32)>>;

/// A row's greedy pick over the outputs of tile groups taken in id order, kept per lane of a
/// group: each lane's largest output and the id where it first came (a comparison and two
/// blends per group, no horizontal work); [`PickLanes::pick`] takes the largest of the
/// lanes, the smallest id among ties, which is the row's first largest output.
#[derive(Clone, Copy)]
struct PickLanes {
    top: [f32; TILE_ROWS],
    at: [u32; TILE_ROWS],
}

impl PickLanes {
    const EMPTY: PickLanes = PickLanes {
        top: [f32::NEG_INFINITY; TILE_ROWS],
        at: [0; TILE_ROWS],
    };

    /// The outputs `values` of weight rows `first..`, the first `valid` of them real (the
    /// last group of a matrix whose rows are not a multiple of [`TILE_ROWS`] has fewer).
    #[inline]
    fn add(&mut self, first: usize, values: &[f32; TILE_ROWS], valid: usize) {
        let lanes = self.top.iter_mut().zip(&mut self.at).zip(values);
        for (l, ((top, at), &x)) in lanes.enumerate().take(valid) {
            // (NaN is never above: it never counts, as in `first_max`.)
            if x > *top {
                *top = x;
                *at = (first + l) as u32;
            }
        }
    }

    /// The largest output above −∞ and its first id, or `None`.
    fn pick(&self) -> Option<(u32, f32)> {
        let mut best: Option<(u32, f32)> = None;
        for (&x, &at) in self.top.iter().zip(&self.at) {
            let better = match best {
                None => x > f32::NEG_INFINITY,
                // (Equal values, +0 and −0 among them, go to the smaller id.)
                Some((id, top)) => x > top || (x == top && at < id),
            };
            if better {
                best = Some((at, x));
            }
        }
        best
    }
}

/// Where [`products`] stores outputs: `(matrix, activation row, first weight row, values)`.
pub(super) type PutOutputs<'a> = dyn Fn(usize, usize, usize, &[f32]) + Sync + 'a;

/// The products of the activations with every matrix of `ws`, in one parallel section:
/// `put(i, r, j0, values)` takes the outputs of matrix i's weight rows `j0..` for
/// activation row r. The concatenated tile groups are split across the pool's threads.
pub(super) fn products(isa: Isa, ws: &[&QMatrix], a: &QRows, pool: &mut Pool, put: &PutOutputs) {
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
    over_threads(ws, pool, &|_, gs| {
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
    });
}

/// Runs `run(part, groups)` over the concatenated tile groups of `ws`, split into shares of
/// about the same bytes ([`split_by_bytes`]) among the pool's threads, part `p` on thread `p`
/// (one part, on this thread, when there are too few groups to split), in one parallel
/// section.
fn over_threads(
    ws: &[&QMatrix],
    pool: &mut Pool,
    run: &(dyn Fn(usize, std::ops::Range<usize>) + Sync),
) {
    let groups: usize = ws.iter().map(|w| w.groups()).sum();
    let parts = pool.threads().min(groups / MIN_GROUPS_PER_THREAD).max(1);
    if parts == 1 {
        return run(0, 0..groups);
    }
    let bounds = split_by_bytes(ws, parts);
    // The pool runs a part per thread; those past `parts` have nothing to do.
    pool.run(&|part| {
        if part < parts {
            run(part, bounds[part]..bounds[part + 1])
        }
    });
}

/// Where `parts` threads' shares of the concatenated tile groups of `ws` begin and end
/// (`parts + 1` bounds): each share about the same bytes, since a step streams its weights
/// and groups of different types differ in size (a layer's q and k in Q5_0 beside v in Q8_0).
pub(super) fn split_by_bytes(ws: &[&QMatrix], parts: usize) -> Vec<usize> {
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
pub(super) fn matmul_groups(
    isa: Isa,
    w: &QMatrix,
    a: &QRows,
    gs: std::ops::Range<usize>,
    put: &mut impl FnMut(usize, usize, &[f32; TILE_ROWS]),
) {
    let k = a.rows;
    let rows: Vec<Row> = (0..k).map(|r| a.row(r)).collect();
    let mut o = [[0.0f32; TILE_ROWS]; ROWS_PER_PASS];
    // `tile_rows` splits each call into its ISA's walks over the group.
    for g in gs {
        let mut r = 0;
        while r < k {
            let n = (k - r).min(ROWS_PER_PASS);
            tile_rows(isa, w.group(g), &rows[r..r + n], &mut o);
            for (i, v) in o[..n].iter().enumerate() {
                put(g * TILE_ROWS, r + i, v);
            }
            r += n;
        }
    }
}

impl QMatrix {
    /// Tile group g: weight rows `16g..16g + 16`, every block.
    pub(super) fn group(&self, g: usize) -> Tiles<'_> {
        let nb = self.blocks_per_row();
        let tiles = g * nb..(g + 1) * nb;
        match &self.quants {
            Quants::Q4_1(t) => Tiles::Q4_1(&t[tiles]),
            Quants::Q5_0(t) => Tiles::Q5_0(&t[tiles]),
            Quants::Q5(t) => Tiles::Q5(&t[tiles]),
            Quants::Q8_0(t) => Tiles::Q8_0(&t[tiles]),
            Quants::Q4K(k) => Tiles::Q4K(&k.tiles[tiles], k.group_supers(g, nb)),
            Quants::Q5K(k) => Tiles::Q5K(&k.tiles[tiles], k.group_supers(g, nb)),
            Quants::Q6K(k) => Tiles::Q6K(&k.tiles[tiles], k.group_supers(g, nb)),
        }
    }
}
