//! Work on input that may have been made to harm, run where it cannot take the process down.
//!
//! A chat template is a program that comes with a model file. Its interpreter bounds its steps
//! (minijinja's fuel), but one step can still take a long time (a filter over a long list) or
//! a lot of memory (a string doubled forty times is a terabyte), and an allocation that fails
//! aborts a Rust process. So on Linux [`run`] does such work in a child process (`fork`, no
//! `exec`: the child has the parent's memory, copied on write) with a limit of CPU time
//! (`RLIMIT_CPU`) and of address space (`RLIMIT_AS`: the parent's size when it forked, plus
//! [`Bounds::memory`]); the parent reads the child's answer through a pipe within a deadline
//! of its own and kills a child that passes it. A child that runs out of either ends alone,
//! and the caller gets [`Stopped`], never an abort or a hang.
//!
//! The child runs only the closure it was given (no threads, no I/O but its pipe; its standard
//! error goes to `/dev/null`) and leaves with `_exit`, so nothing of the parent's (its
//! buffers, its destructors) runs twice.
//! Elsewhere than Linux the work runs in the calling thread, bounded by the caller's own
//! limits alone.

use std::time::Duration;

/// What a child may use.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// CPU time.
    pub cpu: Duration,
    /// Memory past what the process had mapped when the child started, in bytes.
    pub memory: u64,
}

/// Why isolated work did not finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It used its CPU time or passed the deadline.
    Time(Duration),
    /// It ran out of memory (an allocation failed: the child aborted) or crashed.
    Memory(u64),
    /// The child could not be started or answered nothing readable.
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

/// Runs `work` bounded by `bounds` and returns the bytes it gives.
pub fn run(bounds: Bounds, work: impl FnOnce() -> Vec<u8>) -> Result<Vec<u8>, Stopped> {
    #[cfg(target_os = "linux")]
    {
        linux::run(bounds, work)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = bounds;
        Ok(work())
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use super::{Bounds, Stopped};
    use std::time::{Duration, Instant};

    /// The process's mapped size in bytes (`/proc/self/statm`'s first field, in pages).
    fn mapped_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(pages * u64::try_from(page).ok()?)
    }

    pub(super) fn run(bounds: Bounds, work: impl FnOnce() -> Vec<u8>) -> Result<Vec<u8>, Stopped> {
        let failed =
            |what: &str| Stopped::Failed(format!("{what}: {}", std::io::Error::last_os_error()));
        let address_space = mapped_bytes()
            .ok_or_else(|| Stopped::Failed("cannot read /proc/self/statm".into()))?
            .saturating_add(bounds.memory);
        let cpu_seconds = bounds.cpu.as_secs().max(1);
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(failed("pipe"));
        }
        let (read_fd, write_fd) = (fds[0], fds[1]);
        // SAFETY: the child runs `work` alone and leaves with _exit (below); the parent goes
        // on as before.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let e = failed("fork");
            // SAFETY: closing the descriptors pipe2 gave.
            unsafe {
                libc::close(read_fd);
                libc::close(write_fd);
            }
            return Err(e);
        }
        if pid == 0 {
            child(read_fd, write_fd, cpu_seconds, address_space, work);
        }
        // SAFETY: the parent's copy of the write end is not used.
        unsafe { libc::close(write_fd) };
        let deadline = Instant::now() + Duration::from_secs(cpu_seconds * 2 + 1);
        let answer = read_until(read_fd, deadline);
        // SAFETY: the read end is ours; kill and waitpid name the child we forked.
        let status = unsafe {
            libc::close(read_fd);
            if answer.is_none() {
                libc::kill(pid, libc::SIGKILL);
            }
            let mut status = 0;
            while libc::waitpid(pid, &mut status, 0) < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
            status
        };
        let time = Stopped::Time(Duration::from_secs(cpu_seconds));
        match answer {
            None => Err(time),
            Some(bytes) if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => Ok(bytes),
            Some(_) if libc::WIFSIGNALED(status) => match libc::WTERMSIG(status) {
                libc::SIGXCPU | libc::SIGKILL => Err(time),
                _ => Err(Stopped::Memory(bounds.memory)),
            },
            Some(_) => Err(Stopped::Failed(format!(
                "the child ended with status {}",
                libc::WEXITSTATUS(status)
            ))),
        }
    }

    /// The child: limits, the work, its bytes down the pipe, `_exit`.
    fn child(
        read_fd: i32,
        write_fd: i32,
        cpu_seconds: u64,
        address_space: u64,
        work: impl FnOnce() -> Vec<u8>,
    ) -> ! {
        // SAFETY: plain system calls on the child's own descriptors and limits.
        unsafe {
            libc::close(read_fd);
            // The child's last words (an allocation that failed) are not the user's business:
            // the parent says what stopped it.
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            if null >= 0 {
                libc::dup2(null, 2);
                libc::close(null);
            }
            let cpu = libc::rlimit {
                rlim_cur: cpu_seconds,
                rlim_max: cpu_seconds + 1,
            };
            let memory = libc::rlimit {
                rlim_cur: address_space,
                rlim_max: address_space,
            };
            if libc::setrlimit(libc::RLIMIT_CPU, &cpu) != 0
                || libc::setrlimit(libc::RLIMIT_AS, &memory) != 0
            {
                libc::_exit(3);
            }
        }
        let bytes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let Ok(bytes) = bytes else {
            // SAFETY: leaving the child without running the parent's exit handlers.
            unsafe { libc::_exit(2) }
        };
        let mut at = 0;
        while at < bytes.len() {
            // SAFETY: writing from a live buffer to the pipe's write end.
            let n = unsafe { libc::write(write_fd, bytes[at..].as_ptr().cast(), bytes.len() - at) };
            if n <= 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // SAFETY: as above.
                unsafe { libc::_exit(4) }
            }
            at += n as usize;
        }
        // SAFETY: as above.
        unsafe { libc::_exit(0) }
    }

    /// Everything the child writes until it closes the pipe; `None` past `deadline`.
    fn read_until(fd: i32, deadline: Instant) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1 << 16];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one pollfd, alive for the call.
            let ready = unsafe { libc::poll(&mut poll, 1, ms.max(1)) };
            if ready < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return None;
            }
            if ready == 0 {
                continue;
            }
            // SAFETY: reading into a live buffer from the pipe's read end.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                0 => return Some(out),
                n if n > 0 => out.extend_from_slice(&buf[..n as usize]),
                _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        cpu: Duration::from_secs(1),
        memory: 256 << 20,
    };

    /// Work that finishes gives its bytes; work that spins, or allocates past the bound, is
    /// stopped while this process goes on.
    #[test]
    fn work_gives_its_bytes_or_is_stopped_alone() {
        let big = vec![7u8; 300_000];
        assert_eq!(run(BOUNDS, || big.clone()).unwrap(), big);
        #[cfg(target_os = "linux")]
        {
            let spin = run(BOUNDS, || loop {
                std::hint::black_box(0);
            });
            assert_eq!(spin, Err(Stopped::Time(Duration::from_secs(1))));
            let hog = run(BOUNDS, || {
                let mut v: Vec<Vec<u8>> = Vec::new();
                for _ in 0..64 {
                    v.push(vec![1u8; 64 << 20]);
                }
                vec![v.len() as u8]
            });
            assert_eq!(hog, Err(Stopped::Memory(256 << 20)));
            assert!(run(BOUNDS, || panic!("in the child")).is_err());
        }
    }
}
