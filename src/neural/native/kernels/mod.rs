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
//!
//! The files, by role: `isa` (detection and dispatch), `formats` (the tiles), `pages` (the
//! huge pages they live in), `repack` (GGUF blocks into tiles), `activations` (quantizing the
//! rows multiplied), `schedule` (a product over threads, or each row's greedy pick of it),
//! and the kernels: `scalar` (the reference), `avx2` (AVX2 and AVX-VNNI), `avx512` (AVX-512
//! VNNI) and `amx` (AMX-INT8, with the self-check that decides whether it is used), with what
//! the x86 ones share in `x86`; `probe` makes matrices of every weight type for the
//! self-check and the tests. A walk multiplies a tile group with up to `rows_per_pass`
//! rows; a product with more walks the group again, unpacking its tiles again, except where
//! `isa::unpacked_min_rows` sends the rows to an unpacked walk (each block unpacked once
//! into an L1 buffer, the rows walked over it).

/// Weights and activations are quantized in blocks of this many values.
pub const BLOCK: usize = 32;

/// Weight rows interleaved in one tile (one AVX-512 register of 32-bit lanes).
pub const TILE_ROWS: usize = 16;

/// Activation rows multiplied with a tile group in one walk over it, at most: an AMX tile
/// register's 16 rows ([`rows_per_pass`]).
const ROWS_PER_PASS: usize = 16;

/// The activation rows one walk over a tile group multiplies on `isa`: AMX, a tile register's
/// 16; AVX-512, whose 32 registers hold a block's eight weight registers and eight rows'
/// accumulators, eight; 256-bit ISAs, with 16 registers, four (`isa::walk_rows` makes
/// exceptions per weight type).
fn rows_per_pass(isa: Isa) -> usize {
    match isa {
        Isa::Amx => ROWS_PER_PASS,
        Isa::Avx512Vnni => 8,
        _ => 4,
    }
}

mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod formats;
mod isa;
mod pages;
mod probe;
mod repack;
mod scalar;
mod schedule;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use activations::*;
#[cfg(target_arch = "x86_64")]
pub use amx::{
    block_loop as amx_block_loop, bound_loop as amx_bound_loop, BLOCK_ROUND as AMX_BLOCK_ROUND,
    BOUND_ROUND as AMX_BOUND_ROUND,
};
pub use formats::*;
pub use isa::*;
use pages::PageBuf;

use scalar::*;
pub use schedule::*;

#[cfg(test)]
pub(in crate::neural) mod tests;
