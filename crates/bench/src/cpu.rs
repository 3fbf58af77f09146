//! CPU time of the system under test, for the `*_cpu_s` figures and `*_per_cpu` ratios every
//! benchmark reports beside wall-clock throughput: on 2 cores a background thread is not free,
//! so a system that finishes sooner by keeping two CPUs busy must not look better per CPU.
//!
//! Three sources: this whole process ([`process_ns`], the process CPU-time clock: user + system
//! of every thread, live or exited, to the nanosecond; for a system that runs in a worker
//! process of its own, as `bench vnvm`'s and `bench migrate`'s do), the calling thread alone
//! ([`this_thread_ns`]; its CPU clock, exact even while it runs, where
//! `/proc/self/task/*/schedstat` lags by up to a scheduler tick), and whole other processes
//! (`/proc/PID/stat` utime + stime of all their threads, clock ticks; for servers and child
//! processes).

/// CPU nanoseconds thread `tid` of this process has used, from its CPU-time clock (the clock id
/// glibc's `pthread_getcpuclockid` builds: `(!tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED`);
/// `None` when the thread is gone.
fn thread_cpu_ns(tid: u32) -> Option<u64> {
    let clock = ((!(tid as libc::clockid_t)) << 3) | 4 | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer; an invalid clock id (a
    // thread that exited) is an error return, not undefined behaviour.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// CPU nanoseconds the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`): for a system that
/// runs on the benchmark's thread alone.
pub fn this_thread_ns() -> u64 {
    thread_cpu_ns(gettid()).unwrap_or(0)
}

/// CPU nanoseconds this process has used so far: user + system time of all its threads, those
/// that exited included (`CLOCK_PROCESS_CPUTIME_ID`; the quantity `getrusage(RUSAGE_SELF)` and
/// `/proc/self/stat` give in microseconds and clock ticks). For a system that runs in a process
/// of its own, background threads and all.
pub fn process_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if r == 0 {
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    } else {
        0
    }
}

/// The calling thread's id.
fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Seconds of CPU (user + system, all threads) process `pid` has used so far, from
/// `/proc/PID/stat`; `None` when it cannot be read (the process is gone).
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

/// Major faults (page-ins from disk, swap-ins included) process `pid` has taken so far, from
/// `/proc/PID/stat`; `None` when it cannot be read.
pub fn process_major_faults(pid: u32) -> Option<u64> {
    // majflt is field 12 of the whole line: 9 here.
    stat_fields(pid)?.get(9)?.parse().ok()
}

/// The fields of `/proc/PID/stat` after the command name (which may hold spaces), from field 3.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Seconds of CPU (user + system) this process, all its threads, and its waited-for children
/// have used so far (`getrusage` SELF + CHILDREN): for a probe that may run threads or a child
/// of its own.
pub fn self_and_children_s() -> f64 {
    rusage_s(libc::RUSAGE_SELF) + rusage_s(libc::RUSAGE_CHILDREN)
}

/// Seconds of CPU (user + system, all threads) used by this process's children that exited and
/// were waited for, so far (`getrusage(RUSAGE_CHILDREN)`): a child's whole CPU time once its
/// `/proc/PID` is gone.
pub fn reaped_children_s() -> f64 {
    rusage_s(libc::RUSAGE_CHILDREN)
}

/// `getrusage(who)`'s user + system seconds.
fn rusage_s(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the zeroed plain-data struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Throughput per CPU-second: `ops` done with `cpu_s` seconds of CPU (`None` without CPU).
pub fn per_cpu(ops: f64, cpu_s: f64) -> Option<f64> {
    (cpu_s > 0.0 && ops.is_finite()).then(|| ops / cpu_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_threads_are_counted_whether_running_or_exited() {
        let p0 = process_ns();
        let t0 = this_thread_ns();
        let spin = std::thread::spawn(|| {
            let end = std::time::Instant::now() + std::time::Duration::from_millis(60);
            let mut x = 0u64;
            while std::time::Instant::now() < end {
                x = x.wrapping_add(1);
            }
            std::hint::black_box(x);
        });
        spin.join().unwrap();
        // The spinner exited: the process clock still counts it, the caller's clock does not.
        let process = (process_ns() - p0) as f64 / 1e9;
        let me = (this_thread_ns() - t0) as f64 / 1e9;
        assert!(process >= me + 0.03, "process {process} s, caller {me} s");
        assert!(me < 0.05, "a waiting caller used {me} s");
        let whole = process_cpu_s(std::process::id()).unwrap();
        assert!(whole >= 0.03, "this process used {whole} s");
        assert!(process_cpu_s(u32::MAX).is_none());
        assert_eq!(per_cpu(10.0, 0.0), None);
        assert_eq!(per_cpu(10.0, 2.0), Some(5.0));
        // The calling thread's own clock counts its spinning: it reaches 1 ms while the thread
        // spins (the wall clock may run ahead of it on a VM whose vCPU is preempted, so the
        // check is that the thread clock gets there, not how fast).
        let a = this_thread_ns();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while this_thread_ns() - a < 1_000_000 && std::time::Instant::now() < deadline {
            std::hint::spin_loop();
        }
        let spun = (this_thread_ns() - a) as f64 / 1e9;
        assert!(spun >= 0.001, "10 s of spinning counted as {spun} s");
    }
}
