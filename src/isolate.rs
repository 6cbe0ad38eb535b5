//! Work on input that may have been made to harm, run where it cannot take the process down.
//!
//! A chat template is a program that comes with a model file. Its interpreter bounds its steps
//! (minijinja's fuel), but one step can still take a long time (a filter over a long list) or
//! a lot of memory (a string doubled forty times is a terabyte), and an allocation that fails
//! aborts a Rust process. So on Linux [`call`] hands such work to a worker process: a child
//! forked on first use (no `exec`: it has the parent's code and memory, copied on write),
//! which serves one request at a time over a socket, each under limits it sets itself before
//! it starts: CPU time (`RLIMIT_CPU`, its own time so far plus [`Bounds::cpu`]) and address
//! space (`RLIMIT_AS`, its size so far plus [`Bounds::memory`]). The parent waits for the
//! answer within a deadline of its own and kills a worker that passes it. A worker that runs
//! out of either ends alone; the caller gets [`Stopped`], never an abort or a hang, and the
//! next call forks a new worker.
//!
//! The worker is forked once, not per request, because a fork copies the page tables of
//! everything the process holds: a chat prompt of Qwen2.5-Coder 0.5B (its weights loaded)
//! took 23 ms forked per render, 0.25 ms through the running worker and 0.10 ms rendered in
//! process (Zen 4, 2 cores). The worker runs only the
//! function it was forked for (no threads; its standard error and every descriptor but its
//! socket closed), and leaves with `_exit` when the parent closes the socket, so nothing of the
//! parent's (its buffers, its destructors, its listening sockets) lives on in it. Elsewhere
//! than Linux the work runs in the calling thread, bounded by the caller's own limits alone.
//!
//! A fork copies the parent's locks as they stand, and another thread may hold one: the
//! standard library's report of a failed allocation takes its backtrace lock, which a thread
//! printing a panic holds. A worker forked at that moment hung on its first failed allocation
//! until its deadline (`cargo test --release --lib` with `RUST_BACKTRACE=1`: 2 runs in 5, a
//! hoard reported as `Time`). So the crate's allocator ([`Allocator`], the system's) ends a
//! worker whose allocation fails with `abort` at once, before any of that runs. A panic in the
//! worker still runs the panic hook, which can meet the same lock: such a worker is killed at
//! its deadline and the caller gets `Time`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set in a worker process, before its first request.
static IN_WORKER: AtomicBool = AtomicBool::new(false);

/// The allocator of every process built from this crate: the system's, except that in a
/// worker an allocation that fails aborts at once (the parent reads `SIGABRT` as
/// [`Stopped::Memory`]) instead of reporting through the standard library, whose report takes
/// a lock a thread of the parent may have held when the worker was forked (the module docs).
/// Allocations that succeed cost what the system's do.
pub struct Allocator;

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

impl Allocator {
    /// `ptr`, or the end of a worker whose allocation failed.
    #[inline]
    fn checked(ptr: *mut u8) -> *mut u8 {
        if ptr.is_null() && IN_WORKER.load(Ordering::Relaxed) {
            // abort ends the process at once; it takes no lock of the parent's.
            std::process::abort()
        }
        ptr
    }
}

// SAFETY: every call is the system allocator's, with the caller's arguments; a null it
// returns is passed on, or ends the process.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::checked(System.alloc(layout))
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::checked(System.alloc_zeroed(layout))
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::checked(System.realloc(ptr, layout, new_size))
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

/// What one request may use.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// CPU time (counted in whole seconds, at least one).
    pub cpu: Duration,
    /// Memory past what the worker holds when the request starts, in bytes.
    pub memory: u64,
}

/// Why isolated work did not finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It used its CPU time or passed the deadline.
    Time(Duration),
    /// It ran out of memory (an allocation failed: the worker aborted) or crashed.
    Memory(u64),
    /// The worker could not be started or answered nothing readable.
    Failed(String),
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopped::Time(t) => write!(f, "it ran for more than {:.1} s", t.as_secs_f64()),
            Stopped::Memory(m) => write!(f, "it needed more than {} MiB of memory", m >> 20),
            Stopped::Failed(why) => write!(f, "it could not be run apart: {why}"),
        }
    }
}

/// `serve(request)` in a worker process bounded by `bounds` (see the module docs): the bytes
/// it answers. `serve` is what the worker runs for every request it is sent; it must not
/// depend on anything the process changes after the worker was forked.
pub fn call(
    bounds: Bounds,
    serve: fn(&[u8]) -> Vec<u8>,
    request: &[u8],
) -> Result<Vec<u8>, Stopped> {
    #[cfg(target_os = "linux")]
    {
        linux::call(bounds, serve, request)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = bounds;
        Ok(serve(request))
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use super::{Bounds, Stopped};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// A running worker: its process and the parent's end of its socket.
    struct Worker {
        pid: libc::pid_t,
        socket: OwnedFd,
        serve: usize,
    }

    /// The workers, one per function served; a call holds the lock while its worker works.
    static WORKERS: Mutex<Vec<Worker>> = Mutex::new(Vec::new());

    pub(super) fn call(
        bounds: Bounds,
        serve: fn(&[u8]) -> Vec<u8>,
        request: &[u8],
    ) -> Result<Vec<u8>, Stopped> {
        let mut workers = WORKERS.lock().unwrap_or_else(|p| p.into_inner());
        let key = serve as usize;
        let at = match workers.iter().position(|w| w.serve == key) {
            Some(at) => at,
            None => {
                workers.push(spawn(serve)?);
                workers.len() - 1
            }
        };
        let cpu = bounds.cpu.as_secs().max(1);
        let mut frame = Vec::with_capacity(24 + request.len());
        for x in [request.len() as u64, cpu, bounds.memory] {
            frame.extend_from_slice(&x.to_le_bytes());
        }
        frame.extend_from_slice(request);
        let deadline = Instant::now() + Duration::from_secs(2 * cpu + 1);
        let fd = workers[at].socket.as_raw_fd();
        let answer = match send_all(fd, &frame) {
            Some(()) => read_frame(fd, deadline),
            None => Err(Gone::Closed),
        };
        let gone = match answer {
            Ok(bytes) => return Ok(bytes),
            Err(gone) => gone,
        };
        // The worker passed its deadline, ran out of a limit or crashed: it goes, and the
        // next call forks another.
        let worker = workers.swap_remove(at);
        drop(workers);
        let status = end(worker, gone);
        let time = Stopped::Time(Duration::from_secs(cpu));
        Err(match status {
            Some(s) if libc::WIFSIGNALED(s) => match libc::WTERMSIG(s) {
                libc::SIGXCPU | libc::SIGKILL => time,
                // An allocation that failed aborts; past the address space, a stack or a
                // mapping can also fault.
                _ => Stopped::Memory(bounds.memory),
            },
            Some(s) => Stopped::Failed(format!(
                "the worker ended with status {}",
                libc::WEXITSTATUS(s)
            )),
            None => time,
        })
    }

    /// How a worker failed to answer.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Gone {
        /// Past the deadline: it is still running.
        Timeout,
        /// It closed its end: it ended (a limit, a crash).
        Closed,
    }

    /// Ends a worker: the exit status of one that ended by itself, `None` for one that was
    /// still running past its deadline (killed here).
    fn end(worker: Worker, gone: Gone) -> Option<i32> {
        drop(worker.socket);
        let mut status = 0;
        // SAFETY: waitpid and kill name the child this process forked and has not reaped.
        unsafe {
            if gone == Gone::Timeout {
                libc::kill(worker.pid, libc::SIGKILL);
            }
            while libc::waitpid(worker.pid, &mut status, 0) < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
        }
        (gone == Gone::Closed).then_some(status)
    }

    /// Forks a worker serving `serve`.
    fn spawn(serve: fn(&[u8]) -> Vec<u8>) -> Result<Worker, Stopped> {
        let failed =
            |what: &str| Stopped::Failed(format!("{what}: {}", std::io::Error::last_os_error()));
        let mut fds = [0i32; 2];
        // SAFETY: socketpair writes two descriptors into the array it is given.
        let made = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if made != 0 {
            return Err(failed("socketpair"));
        }
        // SAFETY: the descriptors are new and owned here.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: the child runs `worker` alone and leaves with _exit; the parent goes on.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(failed("fork"));
        }
        if pid == 0 {
            let fd = theirs.as_raw_fd();
            std::mem::forget(ours);
            std::mem::forget(theirs);
            worker(fd, serve);
        }
        drop(theirs);
        Ok(Worker {
            pid,
            socket: ours,
            serve: serve as usize,
        })
    }

    /// The worker: every descriptor but its socket closed, then requests until the socket
    /// closes, each under the limits it names.
    fn worker(fd: i32, serve: fn(&[u8]) -> Vec<u8>) -> ! {
        super::IN_WORKER.store(true, std::sync::atomic::Ordering::Relaxed);
        close_all_but(fd);
        loop {
            let Some(head) = read_exact(fd, 24) else {
                exit(0)
            };
            let word = |i: usize| u64::from_le_bytes(head[8 * i..8 * i + 8].try_into().unwrap());
            let (len, cpu, memory) = (word(0), word(1), word(2));
            let Some(request) = usize::try_from(len).ok().and_then(|n| read_exact(fd, n)) else {
                exit(0)
            };
            limit(cpu, memory);
            let answer = match std::panic::catch_unwind(|| serve(&request)) {
                Ok(a) => a,
                Err(_) => exit(2),
            };
            let mut frame = (answer.len() as u64).to_le_bytes().to_vec();
            frame.extend_from_slice(&answer);
            if send_all(fd, &frame).is_none() {
                exit(0);
            }
        }
    }

    /// Leaves the worker without running anything of the parent's.
    fn exit(code: i32) -> ! {
        // SAFETY: _exit ends the process at once.
        unsafe { libc::_exit(code) }
    }

    /// Closes every descriptor but `keep`; standard error goes to `/dev/null` (the worker's
    /// last words, an allocation that failed, are the parent's to tell).
    fn close_all_but(keep: i32) {
        let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        // SAFETY: closing descriptors of this (single-threaded) child; dup2 onto 2.
        unsafe {
            for fd in fds {
                if fd != keep {
                    libc::close(fd);
                }
            }
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 && null != 2 {
                libc::dup2(null, 2);
                libc::close(null);
            }
        }
    }

    /// The request's limits: `cpu` seconds past the worker's CPU time so far, `memory` bytes
    /// past its size so far (soft limits: the hard ones stay, so the next request can raise
    /// them again).
    fn limit(cpu: u64, memory: u64) {
        // SAFETY: getrusage and setrlimit on this process, with live structs.
        unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            let used = usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1;
            set_soft(libc::RLIMIT_CPU, used as u64 + cpu);
            let pages = std::fs::read_to_string("/proc/self/statm")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
            let page = libc::sysconf(libc::_SC_PAGESIZE) as u64;
            if let Some(pages) = pages {
                set_soft(libc::RLIMIT_AS, pages * page + memory);
            }
        }
    }

    /// Sets the soft limit of `resource` to `value` (at most its hard limit).
    unsafe fn set_soft(resource: libc::__rlimit_resource_t, value: u64) {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(resource, &mut lim) == 0 {
            lim.rlim_cur = value.min(lim.rlim_max);
            libc::setrlimit(resource, &lim);
        }
    }

    /// Sends all of `bytes` (no SIGPIPE when the peer is gone); `None` when it cannot.
    fn send_all(fd: i32, bytes: &[u8]) -> Option<()> {
        let mut at = 0;
        while at < bytes.len() {
            // SAFETY: sending from a live buffer on our socket.
            let n = unsafe {
                libc::send(
                    fd,
                    bytes[at..].as_ptr().cast(),
                    bytes.len() - at,
                    libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                return None;
            }
            at += n as usize;
        }
        Some(())
    }

    /// Exactly `n` bytes from `fd` (the worker's side: it waits as long as it takes).
    fn read_exact(fd: i32, n: usize) -> Option<Vec<u8>> {
        let mut out = vec![0u8; n];
        let mut at = 0;
        while at < n {
            // SAFETY: reading into a live buffer from our socket.
            let got = unsafe { libc::read(fd, out[at..].as_mut_ptr().cast(), n - at) };
            if got < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
                continue;
            }
            if got <= 0 {
                return None;
            }
            at += got as usize;
        }
        Some(out)
    }

    /// One answer frame (length, bytes) from the worker, before `deadline`.
    fn read_frame(fd: i32, deadline: Instant) -> Result<Vec<u8>, Gone> {
        let head = read_by(fd, 8, deadline)?;
        let len = u64::from_le_bytes(head.try_into().map_err(|_| Gone::Closed)?);
        read_by(
            fd,
            usize::try_from(len).map_err(|_| Gone::Closed)?,
            deadline,
        )
    }

    /// Exactly `n` bytes from `fd` before `deadline`.
    fn read_by(fd: i32, n: usize, deadline: Instant) -> Result<Vec<u8>, Gone> {
        let mut out = Vec::with_capacity(n.min(1 << 20));
        let mut buf = [0u8; 1 << 16];
        while out.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Gone::Timeout);
            }
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one pollfd, alive for the call.
            let ready = unsafe { libc::poll(&mut poll, 1, ms) };
            if ready <= 0 {
                if ready < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    return Err(Gone::Timeout);
                }
                continue;
            }
            let want = (n - out.len()).min(buf.len());
            // SAFETY: reading into a live buffer from our socket.
            let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), want) };
            match got {
                0 => return Err(Gone::Closed),
                g if g > 0 => out.extend_from_slice(&buf[..g as usize]),
                _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
                _ => return Err(Gone::Closed),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        cpu: Duration::from_secs(1),
        memory: 256 << 20,
    };

    /// What the test worker does with a request: echo it, spin, hoard memory or panic.
    fn serve(request: &[u8]) -> Vec<u8> {
        match request {
            b"spin" => loop {
                std::hint::black_box(0);
            },
            b"hoard" => {
                // Address space taken, not written: the bound is on address space, and
                // faulting pages in takes time that depends on the machine.
                let mut v: Vec<Vec<u8>> = Vec::new();
                for _ in 0..64 {
                    v.push(std::hint::black_box(Vec::with_capacity(64 << 20)));
                }
                vec![v.len() as u8]
            }
            b"panic" => panic!("in the worker"),
            other => other.to_vec(),
        }
    }

    /// Work that finishes gives its bytes; work that spins, or allocates past the bound, is
    /// stopped while this process goes on, and the next request gets a new worker.
    #[test]
    fn work_gives_its_bytes_or_is_stopped_alone() {
        let big = vec![7u8; 300_000];
        assert_eq!(call(BOUNDS, serve, &big).unwrap(), big);
        assert_eq!(call(BOUNDS, serve, b"again").unwrap(), b"again");
        #[cfg(target_os = "linux")]
        {
            let spin = call(BOUNDS, serve, b"spin");
            assert_eq!(spin, Err(Stopped::Time(Duration::from_secs(1))));
            assert_eq!(call(BOUNDS, serve, b"after").unwrap(), b"after");
            // The memory bound is the one this work must meet: its time (and so its wall-clock
            // deadline, 2·cpu + 1 s) leaves room for a machine busy with other tests.
            let roomy = Bounds {
                cpu: Duration::from_secs(10),
                memory: BOUNDS.memory,
            };
            let hog = call(roomy, serve, b"hoard");
            assert_eq!(hog, Err(Stopped::Memory(256 << 20)));
            assert!(call(BOUNDS, serve, b"panic").is_err());
            assert_eq!(call(BOUNDS, serve, &big).unwrap(), big);
        }
    }

    /// A worker forked while another thread holds the standard library's backtrace lock (as a
    /// thread printing a panic does) still reports a failed allocation as memory, at once.
    /// Before the crate's allocator ended such workers itself, this test hung on its first
    /// forks until their deadlines and got `Time`.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_worker_forked_beside_a_printed_backtrace_reports_its_memory() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let capturing = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(120) {
                    drop(std::hint::black_box(
                        std::backtrace::Backtrace::force_capture(),
                    ));
                }
            })
        };
        // Each hoard ends its worker, so each call forks a new one.
        let hogs: Vec<_> = (0..20).map(|_| call(BOUNDS, serve, b"hoard")).collect();
        stop.store(true, Ordering::Relaxed);
        capturing.join().unwrap();
        for hog in hogs {
            assert_eq!(hog, Err(Stopped::Memory(256 << 20)));
        }
    }
}
