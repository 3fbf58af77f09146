//! Whether the service thread is starved: a SCHED_IDLE thread only runs on CPU time nobody
//! else wants, so on a machine whose cores are busy it is woken, waits on a run queue for an
//! idle moment, runs a little and is preempted by the next wake-up of an application thread,
//! again and again. Runnable that way, it costs the application as much as a SCHED_IDLE
//! spinner: measured with memcached under memcslap on 2 cores (4 KiB pages, 300 k SETs,
//! medians of 5–12 alternated runs), the service waited 7.0 s on a run queue in a 9 s run and
//! ran 0.28 s, and the load took 4.7 % longer (paired −6.8 %); a `chrt -i 0` busy loop next to
//! plain memcached cost it 5.5 %, a nice-19 one 9.7 %, the same service at normal priority
//! nothing (+0.6 %). The cores never idle while such a thread is runnable, so each
//! application wake-up there preempts it instead of waking an idle core, and the scheduler
//! places the application's threads differently (memcached's workers: 300 k preemptions and
//! 300 k sleeps plain, 180 k and 440 k next to it).
//!
//! So the service measures how long it waited on a run queue (`/proc/thread-self/schedstat`,
//! the second field; without it, the wall time of a pass less its CPU time): a pass that
//! waited more than [`STARVED`] is cut short and the next one is put off by [`PAUSE_PER_WAIT`]
//! times the wait (see `service::run`), so that a starved service is mostly asleep, not
//! runnable. Measured the same way (10 alternated runs, 4 KiB pages), memcached's service
//! then waited 0.39 s on a run queue instead of 7.0 s, and the load took 1.9 % longer than
//! plain (paired −1.4 %, run-to-run noise ±2 %) where the service before this took 10.9 %
//! longer (paired −9.2 %) in the same series; with the system's THP setting (6 noisier runs)
//! the load ran 5.9 % faster than plain, 3.0 % before. It populates little there (6 MB instead of 448 MB: memcached's workers
//! fault as they would without it), which is what SCHED_IDLE promises on busy cores.

use std::time::{Duration, Instant};

/// Run-queue wait that marks a pass (with the wait for it) as starved: well above the few
/// microseconds a kernel thread takes the core for, well below the milliseconds a SCHED_IDLE
/// thread waits between two application threads' wake-ups on busy cores.
pub(crate) const STARVED: Duration = Duration::from_micros(250);

/// A starved pass is followed by a pause this many times the run-queue wait it took (the
/// wait for it included): the thread then waits on a run queue at most ~1/20 of the time.
pub(crate) const PAUSE_PER_WAIT: u32 = 19;

/// The longest such pause: how late the service is back once the cores are free again.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The pause is also at most 2^level intervals, the level rising by one with each starved
/// pass and falling by one with each pass that did not wait (up to 2^9 × 2 ms ≈ 1 s).
pub(crate) const MAX_LEVEL: u32 = 9;

/// The calling thread's run-queue wait.
pub(crate) struct RunDelay {
    /// `/proc/thread-self/schedstat` opened by the service thread (-1: not available).
    fd: i32,
    /// Fallback: the pass's start (wall, thread CPU).
    start: (Instant, Duration),
}

impl RunDelay {
    /// Opens the calling thread's `schedstat` (call it from the service thread).
    pub fn open() -> RunDelay {
        // SAFETY: opening a procfs file read-only, close-on-exec; the path is NUL-terminated.
        let fd = unsafe {
            libc::open(
                c"/proc/thread-self/schedstat".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        let mut d = RunDelay {
            fd,
            start: (Instant::now(), crate::os::thread_cpu()),
        };
        if d.schedstat().is_none() && d.fd >= 0 {
            d.close();
        }
        d
    }

    /// Whether the exact figure (schedstat) is read; else only the time within a pass is
    /// seen.
    pub fn exact(&self) -> bool {
        self.fd >= 0
    }

    fn close(&mut self) {
        if self.fd >= 0 {
            // SAFETY: our own descriptor, closed once.
            unsafe { libc::close(self.fd) };
            self.fd = -1;
        }
    }

    /// Nanoseconds spent waiting on a run queue, cumulative (schedstat's second field).
    fn schedstat(&self) -> Option<u64> {
        if self.fd < 0 {
            return None;
        }
        let mut buf = [0u8; 96];
        // SAFETY: reading into our stack buffer from our descriptor; pread at offset 0
        // regenerates the procfs file.
        let n = unsafe { libc::pread(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        let text = std::str::from_utf8(&buf[..n as usize]).ok()?;
        text.split_ascii_whitespace().nth(1)?.parse().ok()
    }

    /// A mark to measure from: the cumulative wait (schedstat), or, without it, the pass's
    /// own wall-minus-CPU time from now on.
    pub fn mark(&mut self) -> u64 {
        match self.schedstat() {
            Some(ns) => ns,
            None => {
                self.start = (Instant::now(), crate::os::thread_cpu());
                0
            }
        }
    }

    /// Run-queue wait since `mark` (without schedstat: the time since the last `mark` not
    /// spent running, which also counts time blocked in a system call).
    pub fn since(&self, mark: u64) -> Duration {
        match self.schedstat() {
            Some(ns) => Duration::from_nanos(ns.saturating_sub(mark)),
            None => {
                let wall = self.start.0.elapsed();
                let cpu = crate::os::thread_cpu().saturating_sub(self.start.1);
                wall.saturating_sub(cpu)
            }
        }
    }
}

impl Drop for RunDelay {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_delay_reads_and_grows_only_while_waiting() {
        let mut d = RunDelay::open();
        let m = d.mark();
        // Sleeping is not waiting on a run queue.
        std::thread::sleep(Duration::from_millis(20));
        let w = d.since(m);
        if d.exact() {
            assert!(
                w < Duration::from_millis(15),
                "a sleep counted as {w:?} of run-queue wait"
            );
        } else {
            // The fallback sees wall time not spent running, a sleep included.
            assert!(w >= Duration::from_millis(15), "{w:?}");
        }
    }
}
