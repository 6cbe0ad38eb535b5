//! A tiny spinning thread pool for the forward pass.
//!
//! A decoding step is about 120 small parallel sections (each matrix product and each layer's
//! attention), tens of microseconds apiece. Rayon's workers fall asleep between sections and
//! take longer to wake than the section takes to run, which made two threads slower than one.
//! Here the helpers spin on an epoch counter while work keeps coming, and park only after a few
//! milliseconds of silence, so a hand-off costs well under a microsecond during generation.
//! Every thousand-odd spins a waiting thread yields its core: with more threads than cores (two
//! models in one process, tests run in parallel) a pure spin could hold the core a descheduled
//! helper needs for a whole time slice (a test file went from 4 s to 78 s that way).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A parallel section: called once with each part index `0..parts`.
type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// Bumped by [`Pool::run`] to publish a job.
    epoch: AtomicUsize,
    /// The current job (a `*const Job` split into a thin pointer to a fat one).
    job: AtomicPtr<&'static Job>,
    /// Helpers that have not finished the current job.
    pending: AtomicUsize,
    /// A helper's job panicked.
    panicked: AtomicBool,
    quit: AtomicBool,
}

/// Spins between yields of the core while waiting (a few microseconds): waiting costs a
/// system call now and then, and a thread that needs the core gets it.
const YIELD_EVERY: u32 = 1024;

/// Spin this long for the next job before parking.
const SPIN: Duration = Duration::from_millis(5);

/// The calling thread plus `threads − 1` helpers.
pub struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` (the caller included); `threads <= 1` runs everything inline.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            quit: AtomicBool::new(false),
        });
        let helpers = (1..threads.max(1))
            .map(|part| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("infgram-pool-{part}"))
                    .spawn(move || helper(&shared, part))
                    .expect("spawn a pool thread")
            })
            .collect();
        Pool { shared, helpers }
    }

    /// Number of parts a job is split into.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Runs `job(0)` on this thread and `job(1..threads)` on the helpers, returning when all
    /// are done. Panics if a part panicked.
    pub fn run<'a>(&mut self, job: &'a (dyn Fn(usize) + Sync + 'a)) {
        if self.helpers.is_empty() {
            job(0);
            return;
        }
        // SAFETY: the helpers only use the job between the epoch bump below and their
        // `pending` decrement, and this function waits for every decrement before returning,
        // so the borrow outlives every use. `&mut self` keeps runs from overlapping.
        let fat: &'static Job =
            unsafe { std::mem::transmute::<&'a (dyn Fn(usize) + Sync + 'a), &'static Job>(job) };
        let slot = Box::into_raw(Box::new(fat));
        self.shared.job.store(slot, Ordering::Relaxed);
        self.shared
            .pending
            .store(self.helpers.len(), Ordering::Relaxed);
        self.shared.epoch.fetch_add(1, Ordering::Release);
        for h in &self.helpers {
            h.thread().unpark();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0)));
        let mut spins = 0u32;
        while self.shared.pending.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(YIELD_EVERY) {
                // A helper may be waiting for this core (more threads than cores: two models
                // in one process, tests in parallel): let it run.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: `slot` came from `Box::into_raw` above and no helper uses it any more.
        drop(unsafe { Box::from_raw(slot) });
        if let Err(e) = mine {
            std::panic::resume_unwind(e);
        }
        if self.shared.panicked.swap(false, Ordering::Relaxed) {
            panic!("a pool thread panicked");
        }
    }
}

fn helper(shared: &Shared, part: usize) {
    let mut seen = 0;
    loop {
        let idle = Instant::now();
        let mut spins = 0u32;
        loop {
            if shared.quit.load(Ordering::Acquire) {
                return;
            }
            let epoch = shared.epoch.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(YIELD_EVERY) {
                std::hint::spin_loop();
            } else if idle.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::park_timeout(Duration::from_millis(50));
            }
        }
        let slot = shared.job.load(Ordering::Relaxed);
        // SAFETY: `run` published `slot` before bumping the epoch (Release/Acquire) and keeps
        // it alive until `pending` reaches zero, which happens only after this call.
        let job: &Job = unsafe { *slot };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(part))).is_err() {
            shared.panicked.store(true, Ordering::Relaxed);
        }
        shared.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Release);
        for h in self.helpers.drain(..) {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Pool {
    /// Runs `job` on each of `items` (at most one per thread), in parallel: the safe way to
    /// hand each part its own `&mut` slices. Returns when all are done.
    pub fn run_each<T: Send>(&mut self, items: Vec<T>, job: &(dyn Fn(T) + Sync)) {
        assert!(items.len() <= self.threads(), "more items than threads");
        let slots: Vec<std::sync::Mutex<Option<T>>> = items
            .into_iter()
            .map(|item| std::sync::Mutex::new(Some(item)))
            .collect();
        self.run(&|part| {
            let item = slots
                .get(part)
                .and_then(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take());
            if let Some(item) = item {
                job(item);
            }
        });
    }
}

/// Splits `len` items into at most `parts` stretches of whole `unit`s (as even as the units
/// allow), as `start..end` ranges; fewer when there are fewer units.
pub fn stretches(len: usize, unit: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let units = len.div_ceil(unit.max(1));
    let per = units.div_ceil(parts.clamp(1, units.max(1)));
    (0..units)
        .step_by(per.max(1))
        .map(|u| (u * unit).min(len)..((u + per) * unit).min(len))
        .collect()
}

/// Cuts `slice` into consecutive pieces ending at the ends of `ranges` (which start at 0 and
/// follow each other, as [`stretches`] gives them).
pub fn split_mut<'a, T>(
    mut slice: &'a mut [T],
    ranges: &[std::ops::Range<usize>],
) -> Vec<&'a mut [T]> {
    let mut pieces = Vec::with_capacity(ranges.len());
    let mut at = 0;
    for r in ranges {
        let (piece, rest) = std::mem::take(&mut slice).split_at_mut(r.end - at);
        pieces.push(piece);
        slice = rest;
        at = r.end;
    }
    pieces
}

/// A raw view of an output buffer that parallel parts write at disjoint indices.
#[derive(Clone, Copy)]
pub struct DisjointOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: parts write disjoint indices (the caller's contract in `write_slice`), and the owner
// does not touch the buffer until `Pool::run` returns.
unsafe impl Sync for DisjointOut {}
unsafe impl Send for DisjointOut {}

impl DisjointOut {
    pub fn new(out: &mut [f32]) -> DisjointOut {
        DisjointOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        }
    }

    /// Writes `values` at `i..i + values.len()`.
    ///
    /// # Safety
    /// No other part may access those indices during the same [`Pool::run`].
    #[inline(always)]
    pub unsafe fn write_slice(self, i: usize, values: &[f32]) {
        assert!(i + values.len() <= self.len);
        std::ptr::copy_nonoverlapping(values.as_ptr(), self.ptr.add(i), values.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once_per_job() {
        let mut pool = Pool::new(3);
        for round in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|part| {
                hits[part].fetch_add(round, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == round));
        }
    }

    #[test]
    fn each_item_runs_once_and_stretches_cover_the_range() {
        let mut pool = Pool::new(3);
        let mut data = vec![0u32; 10];
        let (a, b) = data.split_at_mut(4);
        pool.run_each(vec![(1, a), (2, b)], &|(v, s): (u32, &mut [u32])| s.fill(v));
        assert_eq!(data, [1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        for (len, unit, parts) in [
            (0, 32, 2),
            (32, 32, 2),
            (96, 32, 2),
            (100, 32, 3),
            (7, 1, 9),
        ] {
            let s = stretches(len, unit, parts);
            assert!(s.len() <= parts.max(1), "{s:?}");
            let mut at = 0;
            for r in &s {
                assert_eq!(r.start, at);
                assert!(r.end > r.start && (r.start % unit == 0));
                at = r.end;
            }
            assert_eq!(at, len, "{len} {unit} {parts}: {s:?}");
        }
    }

    #[test]
    fn a_panicking_part_is_reported_and_the_pool_survives() {
        let mut pool = Pool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(&|part| assert_ne!(part, 1));
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
