//! Safepoints: stopping every other thread of the process at a consistent point.
//!
//! [`stop_others`] signals each other thread of the process (enumerated from
//! `/proc/self/task`, re-read until no new thread appears) with one real-time signal; each
//! parks in the signal handler, on a futex, until the returned [`Stopped`] is dropped. A thread
//! inside a [`Section`] (an allocator call, a heap operation holding a lock) is not parked in
//! the handler: the handler marks the park as deferred and the thread parks when it leaves its
//! outermost section, so the stopper never waits on a lock held by a parked thread. A thread
//! blocked in a system call runs the handler as the signal interrupts the call, parks there,
//! and on resume the call restarts (`SA_RESTART`) or returns `EINTR` as it would for any
//! signal (`epoll_wait`, `nanosleep`).
//!
//! The wait is bounded: threads that do not park within [`StopOptions::timeout`] (one with the
//! signal blocked, one stuck in a section) make [`stop_others`] resume everyone and fail with
//! [`StopError::Timeout`]; nothing was stopped and nothing is left parked.
//!
//! Rounds: each stop is one round number (odd while threads are held). A handler parks only for
//! the round that is active when it runs, at most once per round per thread, and is counted in
//! a round-tagged counter, so a signal delivered late (blocked, then unblocked after its round
//! ended) never parks a thread outside a stop and never counts towards a later round.
//!
//! Limits: writes that the kernel makes on a parked thread's behalf (io_uring, AIO) are not
//! stopped; a program that installs its own handler for the signal breaks the safepoint (the
//! signal is configurable); one stop at a time per process ([`StopError::Busy`]).

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Round number: odd while a stop holds the other threads, even otherwise.
static ROUND: AtomicU32 = AtomicU32::new(0);
/// `round << 32 | threads parked in that round`.
static PARKED: AtomicU64 = AtomicU64::new(0);
/// Bumped (and futex-woken) by every parking thread: what the stopper sleeps on.
static PARK_SEQ: AtomicU32 = AtomicU32::new(0);
/// A stop is in progress (one at a time).
static STOPPING: AtomicBool = AtomicBool::new(false);
/// The signal the handler is installed for (0 = not installed).
static INSTALLED: AtomicI32 = AtomicI32::new(0);

/// `Local::depth` flag: this thread's [`ExitGuard`] is registered.
const REGISTERED: u32 = 1 << 31;
/// `Local::depth` flag: the thread is exiting (its thread-local destructors have begun). It is then in
/// a section for good: glibc frees the thread's malloc caches after those destructors, with
/// an arena lock held and without passing through any interposed `free`, and a thread parked
/// there would hold that lock for the whole stop — the checkpointing thread's next `free`
/// waited for it forever (seen: `multi_threaded_program_checkpoints_at_safepoints` hung). The
/// stopper stops waiting for a thread once it has exited.
const EXITING: u32 = 1 << 30;
/// `Local::depth` bits counting nested sections.
const COUNT: u32 = EXITING - 1;

/// Marks its thread as exiting when the thread's thread-local destructors run (see
/// [`EXITING`]). Registered by the thread's first [`section`].
struct ExitGuard;

impl Drop for ExitGuard {
    fn drop(&mut self) {
        // Not the main thread: `exit` runs its thread-local destructors too, then the
        // program's `atexit` handlers (a last checkpoint among them), and the process frees no
        // thread caches after that.
        // SAFETY: gettid and getpid have no preconditions.
        if unsafe { libc::syscall(libc::SYS_gettid) as i32 == libc::getpid() } {
            return;
        }
        let _ = LOCAL.try_with(|l| l.depth.set(l.depth.get() | EXITING));
    }
}

/// A thread's safepoint state, in one thread-local so that a section costs one thread-local
/// lookup (in a shared library each is a call to `__tls_get_addr`: 8 % of the preload
/// library's time under sqlite3 went there).
struct Local {
    /// Nesting depth of [`Section`]s on this thread ([`COUNT`] bits), and the [`REGISTERED`]
    /// and [`EXITING`] flags.
    depth: Cell<u32>,
    /// A round whose park was deferred because the signal arrived inside a section (0: none).
    deferred: Cell<u32>,
    /// The last round this thread parked in (a thread parks at most once per round).
    last: Cell<u32>,
}

thread_local! {
    // Const-initialised and without a destructor: its storage lives as long as its thread,
    // so a `Section` may keep a pointer to it.
    static LOCAL: Local = const {
        Local {
            depth: Cell::new(0),
            deferred: Cell::new(0),
            last: Cell::new(0),
        }
    };
    static EXIT_GUARD: ExitGuard = const { ExitGuard };
}

/// Default signal: `SIGRTMAX - 6` (glibc and most runtimes use the low real-time signals).
pub fn default_signal() -> i32 {
    libc::SIGRTMAX() - 6
}

/// How [`stop_others`] stops threads.
#[derive(Debug, Clone, Copy)]
pub struct StopOptions {
    /// Signal sent to each thread (a real-time signal the program does not use).
    pub signal: i32,
    /// Longest wait for every thread to park before giving up.
    pub timeout: Duration,
}

impl Default for StopOptions {
    fn default() -> Self {
        StopOptions {
            signal: default_signal(),
            timeout: Duration::from_millis(100),
        }
    }
}

/// Why [`stop_others`] stopped nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopError {
    /// Another thread's stop is in progress.
    Busy,
    /// The signal has a handler that is not ours (the program's), or it could not be installed.
    Signal(String),
    /// Not every thread parked in time; all were resumed.
    Timeout {
        /// Threads that parked.
        parked: usize,
        /// Threads that should have.
        expected: usize,
    },
    /// `/proc/self/task` could not be read.
    Proc(String),
}

impl std::fmt::Display for StopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopError::Busy => write!(f, "another safepoint is in progress"),
            StopError::Signal(s) => write!(f, "safepoint signal: {s}"),
            StopError::Timeout { parked, expected } => write!(
                f,
                "safepoint timed out: {parked} of {expected} other threads parked (one may block \
                 the signal or be stuck inside an allocator call)"
            ),
            StopError::Proc(s) => write!(f, "cannot list the process's threads: {s}"),
        }
    }
}

impl std::error::Error for StopError {}

/// Marks the current thread as inside a critical section until dropped: a stop does not park
/// it there but when its outermost section ends. Sections nest. Cheap (one thread-local
/// increment); not `Send`.
pub struct Section {
    nested: bool,
    /// This thread's [`LOCAL`] (null: its thread-locals are gone); the raw pointer also makes
    /// the guard neither `Send` nor `Sync`.
    local: *const Local,
}

/// Enters a [`Section`] on the current thread.
#[inline]
pub fn section() -> Section {
    match LOCAL.try_with(|l| l as *const Local) {
        // SAFETY: a pointer to this thread's LOCAL, just obtained.
        Ok(p) => enter(unsafe { &*p }, p),
        Err(_) => Section {
            nested: true,
            local: std::ptr::null(),
        },
    }
}

#[inline]
fn enter(l: &Local, p: *const Local) -> Section {
    let d = &l.depth;
    if d.get() & REGISTERED == 0 {
        d.set(d.get() | REGISTERED);
        // Registers the guard's destructor (once per thread).
        let _ = EXIT_GUARD.try_with(|_| ());
    }
    let n = d.get();
    d.set(n + 1);
    Section {
        nested: n & !REGISTERED != 0,
        local: p,
    }
}

impl Section {
    /// True when the thread was already inside a section when this one began (with its
    /// thread-locals torn down, true as well: see [`in_section`]).
    #[inline]
    pub fn nested(&self) -> bool {
        self.nested
    }
}

/// True while the current thread is inside a [`Section`] (true as well while its thread-locals
/// are being torn down, when nothing may be assumed about it).
#[inline]
pub fn in_section() -> bool {
    LOCAL
        .try_with(|l| l.depth.get() & !REGISTERED != 0)
        .unwrap_or(true)
}

impl Drop for Section {
    #[inline]
    fn drop(&mut self) {
        if self.local.is_null() {
            return;
        }
        // SAFETY: `local` points to this thread's LOCAL (a Section is not Send), whose storage
        // outlives the thread's code (const, no destructor).
        let l = unsafe { &*self.local };
        let mut n = l.depth.get();
        if n & COUNT != 0 {
            n -= 1;
        }
        l.depth.set(n);
        if n & !REGISTERED == 0 {
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            let r = l.deferred.replace(0);
            if r != 0 {
                park(r);
            }
        }
    }
}

fn futex(addr: &AtomicU32, op: i32, val: u32, timeout: Option<&libc::timespec>) {
    let ts = timeout.map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT/WAKE on a live, aligned u32; the timeout (if any) outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr.as_ptr(),
            op | libc::FUTEX_PRIVATE_FLAG,
            val,
            ts,
        )
    };
}

/// Parks the current thread for `round` if that round is still active and the thread has not
/// parked in it yet. Async-signal-safe: atomics, futex calls, const thread-locals.
fn park(round: u32) {
    if round & 1 == 0 || LOCAL.try_with(|l| l.last.get()).unwrap_or(round) == round {
        return;
    }
    // Count ourselves in this round only if it is still the active one.
    let mut cur = PARKED.load(Ordering::Acquire);
    loop {
        if (cur >> 32) as u32 != round {
            return;
        }
        match PARKED.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(c) => cur = c,
        }
    }
    let _ = LOCAL.try_with(|l| l.last.set(round));
    PARK_SEQ.fetch_add(1, Ordering::Release);
    futex(&PARK_SEQ, libc::FUTEX_WAKE, 1, None);
    while ROUND.load(Ordering::Acquire) == round {
        futex(&ROUND, libc::FUTEX_WAIT, round, None);
    }
}

extern "C" fn on_signal(_sig: i32, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno; saved and restored around the
    // futex calls so the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    let round = ROUND.load(Ordering::Acquire);
    if round & 1 == 1 {
        if LOCAL.try_with(|l| l.depth.get() & !REGISTERED).unwrap_or(1) != 0 {
            let _ = LOCAL.try_with(|l| l.deferred.set(round));
        } else {
            park(round);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handler for `sig` once. Refuses a signal that already has a handler.
fn install(sig: i32) -> Result<(), StopError> {
    let cur = INSTALLED.load(Ordering::Acquire);
    if cur == sig {
        return Ok(());
    }
    if cur != 0 {
        return Err(StopError::Signal(format!(
            "the safepoint already uses signal {cur}, not {sig}"
        )));
    }
    // SAFETY: sigaction with zeroed structs we own; reading the old disposition first.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return Err(StopError::Signal(format!(
                "signal {sig}: {}",
                std::io::Error::last_os_error()
            )));
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            return Err(StopError::Signal(format!(
                "signal {sig} already has a handler (the program's); choose another signal"
            )));
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err(StopError::Signal(format!(
                "signal {sig}: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    INSTALLED.store(sig, Ordering::Release);
    Ok(())
}

/// Other threads of this process now: ids from `/proc/self/task`, without the caller.
fn other_threads(me: i32) -> Result<BTreeSet<i32>, StopError> {
    let rd = std::fs::read_dir("/proc/self/task").map_err(|e| StopError::Proc(e.to_string()))?;
    Ok(rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&t| t != me)
        .collect())
}

/// Call in a forked child (a `pthread_atfork` child handler): the child has one thread and
/// none of the parent's stop, so it forgets any stop in progress and any deferred park, and
/// leaves the sections the forking thread was in (its parent and child handlers are where the
/// parent's `fork` leaves them). Async-signal-safe.
pub fn after_fork_child() {
    let r = ROUND.load(Ordering::Relaxed);
    if r & 1 == 1 {
        ROUND.store(r.wrapping_add(1), Ordering::Relaxed);
    }
    STOPPING.store(false, Ordering::Relaxed);
    let _ = LOCAL.try_with(|l| l.deferred.set(0));
}

/// Enters a section without a guard, for code whose start and end are separate callbacks
/// (`pthread_atfork` prepare and parent/child handlers); pair each with [`leave_raw`].
pub fn enter_raw() {
    std::mem::forget(section());
}

/// Leaves a section entered with [`enter_raw`] (parking now if a stop was deferred).
pub fn leave_raw() {
    drop(Section {
        nested: false,
        local: LOCAL
            .try_with(|l| l as *const Local)
            .unwrap_or(std::ptr::null()),
    });
}

/// Other threads held by [`stop_others`]; dropping it resumes them.
#[derive(Debug)]
pub struct Stopped {
    round: u32,
    /// Threads parked.
    pub threads: usize,
    /// Time from the first signal until every thread had parked.
    pub stop_time: Duration,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        ROUND.store(self.round.wrapping_add(1), Ordering::Release);
        futex(&ROUND, libc::FUTEX_WAKE, i32::MAX as u32, None);
        STOPPING.store(false, Ordering::Release);
    }
}

/// Stops every other thread of the process (see the module contract) and returns when all of
/// them are parked, or resumes them and fails after `opts.timeout`. Must not be called from a
/// signal handler. The caller must not hold a lock that a thread needs to leave its section.
pub fn stop_others(opts: &StopOptions) -> Result<Stopped, StopError> {
    if STOPPING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(StopError::Busy);
    }
    let clear = |e: StopError| {
        STOPPING.store(false, Ordering::Release);
        e
    };
    install(opts.signal).map_err(clear)?;
    let t0 = Instant::now();
    // SAFETY: plain syscalls without pointers.
    let (pid, me) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid) as i32) };
    let round = ROUND.load(Ordering::Acquire).wrapping_add(1) | 1;
    PARKED.store((round as u64) << 32, Ordering::Release);
    ROUND.store(round, Ordering::Release);
    let stopped = Stopped {
        round,
        threads: 0,
        stop_time: Duration::ZERO,
    };
    let mut signalled: BTreeSet<i32> = BTreeSet::new();
    loop {
        let now = other_threads(me)?;
        let new: Vec<i32> = now.difference(&signalled).copied().collect();
        // Threads that exited without parking no longer count.
        signalled.retain(|t| now.contains(t));
        for t in new {
            // SAFETY: tgkill to a thread id of this process; ESRCH (exited) is harmless.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, t, opts.signal) };
            if r == 0 {
                signalled.insert(t);
            }
        }
        let parked = (PARKED.load(Ordering::Acquire) & 0xffff_ffff) as usize;
        if parked >= signalled.len() {
            // Everyone signalled so far is parked; a parked thread creates no thread, so one
            // more listing that finds nothing new means all are held.
            let again = other_threads(me)?;
            if again.is_subset(&signalled) {
                let mut s = stopped;
                s.threads = parked;
                s.stop_time = t0.elapsed();
                return Ok(s);
            }
            continue;
        }
        let left = opts.timeout.saturating_sub(t0.elapsed());
        if left.is_zero() {
            let e = StopError::Timeout {
                parked,
                expected: signalled.len(),
            };
            drop(stopped);
            return Err(e);
        }
        let seq = PARK_SEQ.load(Ordering::Acquire);
        if (PARKED.load(Ordering::Acquire) & 0xffff_ffff) as usize == parked {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: left.min(Duration::from_millis(2)).as_nanos() as i64,
            };
            futex(&PARK_SEQ, libc::FUTEX_WAIT, seq, Some(&ts));
        }
    }
}
