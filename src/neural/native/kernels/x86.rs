//! What the x86 kernels share: activation quads for broadcasting and prefetching ahead of
//! the weight stream.

use std::arch::x86_64::*;

/// Activation bytes `4t..4t+4` of a block as one 32-bit word, for broadcasting.
#[inline(always)]
pub(super) unsafe fn quad<T>(q: &[T; 32], t: usize) -> i32 {
    (q.as_ptr().add(4 * t) as *const i32).read_unaligned()
}

/// Asks for the cache lines [`PREFETCH_BYTES`] past `tile`'s: the weights stream from
/// memory once per pass, and the hardware prefetcher alone leaves the loads waiting.
/// (Prefetching past the end of the matrix is harmless: prefetches never fault.)
#[inline(always)]
pub(super) unsafe fn prefetch_ahead<T>(tile: &T) {
    let at = (tile as *const T as *const i8).wrapping_add(PREFETCH_BYTES);
    for line in (0..std::mem::size_of::<T>()).step_by(64) {
        _mm_prefetch(at.wrapping_add(line), _MM_HINT_T0);
    }
}

pub(super) const PREFETCH_BYTES: usize = 2048;
