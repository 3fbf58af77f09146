//! # libtiermem_pheap_preload — an unmodified program's heap in a tiermem pheap
//!
//! `LD_PRELOAD=libtiermem_pheap_preload.so program ...` routes the program's `malloc`, `free`,
//! `calloc`, `realloc`, `reallocarray`, `posix_memalign`, `aligned_alloc`, `memalign`,
//! `valloc`, `pvalloc` and `malloc_usable_size` into a [`tiermem_pheap::Heap`], and takes
//! incremental checkpoints of it (FGCK with 2, 4 or 8 views; PGCK with 1) every
//! `TIERMEM_CKPT_MS` milliseconds and at exit. See `docs/pheap.md` ("Unmodified programs") for
//! the environment variables, the consistency contract and the limits.
//!
//! Ownership of a pointer is decided by address: inside the heap's views → the pheap, anything
//! else → glibc. The library's own Rust allocations, calls made before the heap is ready and
//! re-entrant calls on a thread that is already inside the library (heap creation, a
//! checkpoint, the exit handler) go to glibc's `__libc_*` functions, so nothing recurses.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::io::Write;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use tiermem_fault::safepoint;
use tiermem_pheap::{Heap, HeapOptions};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// The library's own allocator: glibc's malloc under its internal names, never the exported
/// `malloc` of this library (which would recurse into the heap).
struct LibcAlloc;

// SAFETY: the __libc_* functions implement malloc/free/realloc/memalign with their documented
// contracts; alignments above 16 go through __libc_memalign (and realloc copies by hand).
unsafe impl GlobalAlloc for LibcAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain glibc allocation calls.
        unsafe {
            if l.align() <= 16 {
                __libc_malloc(l.size()) as *mut u8
            } else {
                __libc_memalign(l.align(), l.size()) as *mut u8
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: `p` came from `alloc`/`realloc` above, i.e. from glibc.
        unsafe { __libc_free(p as *mut c_void) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain glibc allocation calls; the memalign result is zeroed by hand.
        unsafe {
            if l.align() <= 16 {
                __libc_calloc(1, l.size()) as *mut u8
            } else {
                let p = self.alloc(l);
                if !p.is_null() {
                    ptr::write_bytes(p, 0, l.size());
                }
                p
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` is a live glibc block of `l.size()` bytes (GlobalAlloc contract).
        unsafe {
            if l.align() <= 16 {
                return __libc_realloc(p as *mut c_void, new) as *mut u8;
            }
            let q = self.alloc(Layout::from_size_align_unchecked(new, l.align()));
            if !q.is_null() {
                ptr::copy_nonoverlapping(p, q, l.size().min(new));
                __libc_free(p as *mut c_void);
            }
            q
        }
    }
}

#[global_allocator]
static GLOBAL: LibcAlloc = LibcAlloc;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;
const DISABLED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static HEAP: AtomicPtr<Heap> = AtomicPtr::new(ptr::null_mut());
/// `[LO, HI)`: all views of the heap (they are adjacent); 0/0 until the heap is ready.
static LO: AtomicUsize = AtomicUsize::new(0);
static HI: AtomicUsize = AtomicUsize::new(0);
/// Set in a forked child: the child's heap is a private copy, never checkpointed.
static IN_CHILD: AtomicU8 = AtomicU8::new(0);

static CKPT_NS: AtomicU64 = AtomicU64::new(0);
static CKPT_CALLS: AtomicU64 = AtomicU64::new(0);
static NEXT_CKPT_NS: AtomicU64 = AtomicU64::new(u64::MAX);
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls served by the heap, counted per thread: a shared counter's locked add waited for the
/// stores before it (the program's writes into its objects) to drain, a third of `malloc`'s
/// and half of `free`'s time in the library under sqlite3.
#[derive(Default)]
struct Counts {
    allocs: AtomicU64,
    frees: AtomicU64,
    /// Every call into the heap (allocations, frees, resizes): paces the clock reads of
    /// [`maybe_checkpoint`].
    calls: AtomicU64,
    /// The call at which this thread next reads the clock, the calls between two reads, and
    /// the last read (see [`count`]).
    clock_at: AtomicU64,
    clock_stride: AtomicU64,
    clock_ns: AtomicU64,
}

impl Counts {
    /// Adds one to `c` (written by its own thread only: a plain load and store).
    fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// Every thread's counts (kept after the thread exits, for the exit statistics).
static ALL_COUNTS: Mutex<Vec<&'static Counts>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread's counts, registered at its first call and never freed (the exit statistics
    /// read them after the thread is gone). A constant initializer with nothing to drop: an
    /// access is one thread-local load, with no lazy-initialisation or destructor state to
    /// test (an `Arc` here cost ~10 instructions a call).
    static COUNTS: Cell<Option<&'static Counts>> = const { Cell::new(None) };
}

/// This thread's counts, registered on first use; `None` once its thread-locals are gone.
#[inline]
fn my_counts() -> Option<&'static Counts> {
    COUNTS
        .try_with(|c| match c.get() {
            Some(x) => x,
            None => register_counts(c),
        })
        .ok()
}

/// Makes and registers this thread's counts (its first call).
#[cold]
#[inline(never)]
fn register_counts(c: &Cell<Option<&'static Counts>>) -> &'static Counts {
    let x: &'static Counts = Box::leak(Box::default());
    lock(&ALL_COUNTS).push(x);
    c.set(Some(x));
    x
}

/// What a call into the heap did, for [`count`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Alloc,
    Free,
    Other,
}

/// Counts one call served by the heap on this thread, and reads the clock when this thread is
/// due to: the time for [`maybe_checkpoint`], or `None` between reads. A thread reads the
/// clock every [`CLOCK_STRIDE_MAX`] calls while its calls come faster than one per
/// [`CLOCK_FAST_NS`] / that many, and on every call once they come slower than one per
/// [`CLOCK_SLOW_NS`] (memcached's threads make a few hundred calls in seconds: a fixed stride
/// of 32 took 3 of its 16 checkpoints). Always reads it when the thread-locals are gone.
fn count(call: Call) -> Option<u64> {
    my_counts()
        .map(|c| {
            match call {
                Call::Alloc => Counts::bump(&c.allocs),
                Call::Free => Counts::bump(&c.frees),
                Call::Other => {}
            }
            Counts::bump(&c.calls);
            let calls = c.calls.load(Ordering::Relaxed);
            if calls < c.clock_at.load(Ordering::Relaxed) {
                return None;
            }
            let now = now_ns();
            let dt = now.saturating_sub(c.clock_ns.load(Ordering::Relaxed));
            let stride = c.clock_stride.load(Ordering::Relaxed).max(1);
            let stride = if dt < CLOCK_FAST_NS {
                (stride * 2).min(CLOCK_STRIDE_MAX)
            } else if dt > CLOCK_SLOW_NS {
                1
            } else {
                stride
            };
            c.clock_stride.store(stride, Ordering::Relaxed);
            c.clock_ns.store(now, Ordering::Relaxed);
            c.clock_at.store(calls + stride, Ordering::Relaxed);
            Some(now)
        })
        .unwrap_or_else(|| Some(now_ns()))
}

/// The calls served by the heap so far, over every thread: (allocations, frees).
fn counts() -> (u64, u64) {
    lock(&ALL_COUNTS).iter().fold((0, 0), |(a, f), c| {
        (
            a + c.allocs.load(Ordering::Relaxed),
            f + c.frees.load(Ordering::Relaxed),
        )
    })
}
static FALLBACK: AtomicU64 = AtomicU64::new(0);
static CHECKPOINTS: AtomicU64 = AtomicU64::new(0);
static SKIPPED: AtomicU64 = AtomicU64::new(0);
static WARNED_FULL: AtomicU8 = AtomicU8::new(0);
static WARNED_BAD_FREE: AtomicU8 = AtomicU8::new(0);

/// glibc's `malloc_usable_size` (the next definition after ours), resolved at init.
static LIBC_USABLE: AtomicUsize = AtomicUsize::new(0);
static STATS_PATH: OnceLock<Option<String>> = OnceLock::new();

/// Marks the current thread as inside the library until dropped: calls it makes go to glibc,
/// and it is a safepoint section (`tiermem_fault::safepoint`): a checkpoint of a
/// multi-threaded program parks this thread only once it has left the library.
struct Guard(safepoint::Section);

impl Guard {
    fn enter() -> Guard {
        Guard(safepoint::section())
    }

    /// True when the thread was already inside the library (a re-entrant call: no safe point).
    fn was_inside(&self) -> bool {
        self.0.nested()
    }

    /// The safepoint section this guard holds (for the heap's `*_in` calls).
    fn section(&self) -> &safepoint::Section {
        &self.0
    }
}

fn in_lib() -> bool {
    safepoint::in_section()
}

/// The heap if it is ready and this thread is not already inside the library.
fn ready_heap() -> Option<&'static Heap> {
    if in_lib() {
        return None;
    }
    heap_if_ready()
}

/// The heap if it is ready (whatever the thread is doing).
fn heap_if_ready() -> Option<&'static Heap> {
    if STATE.load(Ordering::Acquire) != READY {
        return None;
    }
    // SAFETY: HEAP is set (to a leaked Box, never freed) before STATE becomes READY.
    Some(unsafe { &*HEAP.load(Ordering::Acquire) })
}

/// True when `p` lies in one of the heap's views (so the pheap owns it).
fn owned(p: *const c_void) -> bool {
    let a = p as usize;
    a >= LO.load(Ordering::Acquire) && a < HI.load(Ordering::Acquire)
}

/// The heap, for a pointer it owns (`owned(p)` implies the heap was ready).
fn owner_heap() -> &'static Heap {
    // SAFETY: LO/HI are only non-empty once HEAP points to the leaked, never-freed heap.
    unsafe { &*HEAP.load(Ordering::Acquire) }
}

fn warn_once(flag: &AtomicU8, msg: &str) {
    if flag.swap(1, Ordering::Relaxed) == 0 {
        let _ = writeln!(std::io::stderr(), "tiermem-pheap-preload: {msg}");
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_num(name: &str) -> Result<Option<u64>, String> {
    match env(name) {
        None => Ok(None),
        Some(v) => parse_size(&v)
            .map(Some)
            .ok_or_else(|| format!("{name}={v:?} is not a number (optionally with K/M/G)")),
    }
}

/// Parses `123`, `64K`, `256M`, `1G` (binary units).
fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, mul) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1u64 << 10),
        'm' | 'M' => (&v[..v.len() - 1], 1 << 20),
        'g' | 'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass (vDSO, no allocation).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Default heap path: the pheap's per-program, per-user default
/// (`$TIERMEM_DIR` or `/dev/shm/tiermem` + `/pheap/<progname>-<uid>.heap`).
fn default_path() -> String {
    tiermem_pheap::default_path().display().to_string()
}

/// Default capacity: enough for the test programs (Tokyo Cabinet and sqlite3 runs of tens of
/// MiB). The pool file takes about three times this (see docs/pheap.md).
const DEFAULT_CAPACITY: u64 = 128 << 20;

fn init_heap() -> Result<Heap, String> {
    let views = env_num("TIERMEM_PHEAP_VIEWS")?.unwrap_or(2) as usize;
    let capacity = env_num("TIERMEM_PHEAP_CAPACITY")?.unwrap_or(DEFAULT_CAPACITY);
    let sb = 64u64 << 10;
    let capacity = capacity.div_ceil(sb) * sb;
    let ms = env_num("TIERMEM_CKPT_MS")?.unwrap_or(0);
    CKPT_NS.store(ms.saturating_mul(1_000_000), Ordering::Relaxed);
    CKPT_CALLS.store(
        env_num("TIERMEM_CKPT_CALLS")?.unwrap_or(0),
        Ordering::Relaxed,
    );
    let _ = STATS_PATH.set(env("TIERMEM_PHEAP_STATS"));
    if let Some(sig) = env_num("TIERMEM_PHEAP_SIGNAL")? {
        let sig = sig as i32;
        if sig < libc::SIGRTMIN() || sig > libc::SIGRTMAX() {
            return Err(format!(
                "TIERMEM_PHEAP_SIGNAL={sig} is not a real-time signal ({}..={})",
                libc::SIGRTMIN(),
                libc::SIGRTMAX()
            ));
        }
        STOP_SIGNAL.store(sig as usize, Ordering::Relaxed);
    }
    if let Some(ms) = env_num("TIERMEM_SAFEPOINT_TIMEOUT_MS")? {
        STOP_TIMEOUT_MS.store(ms.max(1), Ordering::Relaxed);
    }
    if env("TIERMEM_PHEAP_VERIFY_EACH").is_some_and(|v| v != "0") {
        VERIFY_EACH.store(1, Ordering::Relaxed);
    }
    let path = env("TIERMEM_PHEAP_PATH").unwrap_or_else(default_path);
    let path = std::path::PathBuf::from(path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // A fresh heap per run (an unmodified program cannot use restored state), but only over a
    // heap of ours: anything else at the path is the user's and is left alone.
    match std::fs::symlink_metadata(&path) {
        Ok(md) => {
            replaceable(&path, &md)?;
            std::fs::remove_file(&path)
                .map_err(|e| format!("cannot remove the old heap {}: {e}", path.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot examine {}: {e}", path.display())),
    }
    let opts = HeapOptions {
        capacity: capacity as usize,
        views,
        ..HeapOptions::default()
    };
    Heap::create(&path, &opts).map_err(|e| format!("cannot create heap {}: {e}", path.display()))
}

/// `Ok` when the existing file at `path` is a persistent heap of this library's format that
/// opens cleanly (the previous run's checkpoint, possibly with a committed log or one torn
/// header copy left by a crash), so a new run may replace it. Anything else — not a regular
/// file, read-only, not a pheap pool, another format version, a damaged heap — is refused with
/// the reason and what to do; the file is not touched.
fn replaceable(path: &std::path::Path, md: &std::fs::Metadata) -> Result<(), String> {
    let p = path.display();
    let keep = "left untouched; remove it yourself (`tiermem pheap rm`) or set TIERMEM_PHEAP_PATH to another file";
    if md.is_dir() {
        return Err(format!("TIERMEM_PHEAP_PATH {p} is a directory ({keep})"));
    }
    if !md.is_file() {
        return Err(format!("{p} is not a regular file ({keep})"));
    }
    if md.permissions().readonly() {
        return Err(format!("{p} is read-only ({keep})"));
    }
    let r = tiermem_pheap::inspect::inspect_metadata(path)
        .map_err(|e| format!("{p} is not a tiermem persistent heap ({e}); {keep}"))?;
    if let Some(h) = r.header {
        if h.version != tiermem_pheap::format::HEAP_VERSION {
            return Err(format!(
                "{p} is a persistent heap of format version {}, this library writes version {} ({keep})",
                h.version,
                tiermem_pheap::format::HEAP_VERSION
            ));
        }
    }
    if r.header.is_none() || !r.problems.is_empty() {
        return Err(format!(
            "{p} is not a usable persistent heap ({}); {keep} (`tiermem pheap verify` shows what is wrong)",
            r.problems.join("; ")
        ));
    }
    Ok(())
}

/// Runs once, from the library's constructor (before the program's `main` and its own
/// constructors). Until it has finished every call goes to glibc.
extern "C" fn init() {
    if STATE
        .compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let _g = Guard::enter();
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds glibc's definition.
    let usable = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
    LIBC_USABLE.store(usable as usize, Ordering::Relaxed);
    if env("TIERMEM_PHEAP_DISABLE").is_some() {
        STATE.store(DISABLED, Ordering::Release);
        return;
    }
    let heap = match init_heap() {
        Ok(h) => h,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "tiermem-pheap-preload: {e}; the program runs on glibc malloc"
            );
            STATE.store(DISABLED, Ordering::Release);
            return;
        }
    };
    let bases = heap.view_bases();
    let cap = heap.capacity();
    let lo = bases.iter().copied().min().unwrap_or(0);
    let hi = bases.iter().copied().max().unwrap_or(0) + cap;
    // The views are adjacent (heap.rs maps them as one span); anything else in [lo, hi) would
    // be misattributed, so insist on it.
    if bases.is_empty() || hi - lo != bases.len() * cap {
        let _ = writeln!(
            std::io::stderr(),
            "tiermem-pheap-preload: the heap's views are not adjacent ({bases:x?}); the program runs on glibc malloc"
        );
        STATE.store(DISABLED, Ordering::Release);
        return;
    }
    HEAP.store(Box::into_raw(Box::new(heap)), Ordering::Release);
    LO.store(lo, Ordering::Release);
    HI.store(hi, Ordering::Release);
    let ns = CKPT_NS.load(Ordering::Relaxed);
    if ns > 0 {
        NEXT_CKPT_NS.store(now_ns().saturating_add(ns), Ordering::Relaxed);
    }
    // SAFETY: registering plain extern "C" functions without arguments.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
    }
    STATE.store(READY, Ordering::Release);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// How checkpoints stop the program's other threads (`TIERMEM_PHEAP_SIGNAL`,
/// `TIERMEM_SAFEPOINT_TIMEOUT_MS`), set at init.
static STOP_SIGNAL: AtomicUsize = AtomicUsize::new(0);
static STOP_TIMEOUT_MS: AtomicU64 = AtomicU64::new(100);
/// Pauses of the checkpoints (first signal to resume), microseconds; the most threads stopped.
static PAUSES_US: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static STOP_US: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static THREADS_MAX: AtomicUsize = AtomicUsize::new(0);
static SAFEPOINT_TIMEOUTS: AtomicU64 = AtomicU64::new(0);
/// `TIERMEM_PHEAP_VERIFY_EACH=1`: compare each checkpoint with the heap while the threads are
/// still stopped; mismatches are counted and reported.
static VERIFY_EACH: AtomicU8 = AtomicU8::new(0);
static VERIFIED: AtomicU64 = AtomicU64::new(0);
static VERIFY_FAILED: AtomicU64 = AtomicU64::new(0);

fn stop_options() -> safepoint::StopOptions {
    let sig = STOP_SIGNAL.load(Ordering::Relaxed) as i32;
    safepoint::StopOptions {
        signal: if sig > 0 {
            sig
        } else {
            safepoint::default_signal()
        },
        timeout: std::time::Duration::from_millis(STOP_TIMEOUT_MS.load(Ordering::Relaxed)),
    }
}

/// Checkpoints now, with every other thread of the process parked at a safepoint while it runs
/// (a single-threaded program stops nobody). A failure (threads that would not stop in time,
/// a full device) is counted as skipped and reported on stderr after the threads resume.
/// Must be called with the guard held and with no heap lock held by this thread.
fn checkpoint(h: &Heap) {
    if IN_CHILD.load(Ordering::Relaxed) != 0 {
        return;
    }
    let t0 = std::time::Instant::now();
    let held = match safepoint::stop_others(&stop_options()) {
        Ok(s) => s,
        Err(safepoint::StopError::Busy) => return,
        Err(e) => {
            SKIPPED.fetch_add(1, Ordering::Relaxed);
            if matches!(e, safepoint::StopError::Timeout { .. }) {
                SAFEPOINT_TIMEOUTS.fetch_add(1, Ordering::Relaxed);
            }
            let _ = writeln!(
                std::io::stderr(),
                "tiermem-pheap-preload: checkpoint skipped: {e}"
            );
            return;
        }
    };
    let r = h.ckall();
    let verdict = match (&r, VERIFY_EACH.load(Ordering::Relaxed)) {
        (Ok(_), 1) => Some(h.verify_checkpoint()),
        _ => None,
    };
    let (threads, stop_time) = (held.threads, held.stop_time);
    drop(held);
    let pause = t0.elapsed();
    match r {
        Ok(_) => {
            CHECKPOINTS.fetch_add(1, Ordering::Relaxed);
            THREADS_MAX.fetch_max(threads, Ordering::Relaxed);
            if threads > 0 {
                lock(&PAUSES_US).push(pause.as_micros().min(u32::MAX as u128) as u32);
                lock(&STOP_US).push(stop_time.as_micros().min(u32::MAX as u128) as u32);
            }
        }
        Err(e) => {
            SKIPPED.fetch_add(1, Ordering::Relaxed);
            let _ = writeln!(std::io::stderr(), "tiermem-pheap-preload: checkpoint: {e}");
        }
    }
    match verdict {
        Some(Ok(())) => {
            VERIFIED.fetch_add(1, Ordering::Relaxed);
        }
        Some(Err(e)) => {
            VERIFY_FAILED.fetch_add(1, Ordering::Relaxed);
            let _ = writeln!(
                std::io::stderr(),
                "tiermem-pheap-preload: checkpoint differs from the heap: {e}"
            );
        }
        None => {}
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `{"n":..,"p50":..,"p99":..,"max":..}` of a list of microsecond samples.
fn summary(v: &[u32]) -> String {
    let mut v = v.to_vec();
    v.sort_unstable();
    let q = |p: f64| -> u32 {
        if v.is_empty() {
            0
        } else {
            v[((v.len() - 1) as f64 * p).round() as usize]
        }
    };
    format!(
        "{{\"n\":{},\"p50\":{},\"p99\":{},\"max\":{}}}",
        v.len(),
        q(0.5),
        q(0.99),
        v.last().copied().unwrap_or(0)
    )
}

/// The safe point: called at the start of every allocator call that reaches the heap.
/// The most calls of a thread between two clock reads (a read was 2 % of sqlite3's time under
/// the preload, which makes 1.2 M calls in 0.2 s).
const CLOCK_STRIDE_MAX: u64 = 32;
/// A thread whose reads come closer than this doubles its stride...
const CLOCK_FAST_NS: u64 = 20_000;
/// ... and one whose reads come further apart than this reads on every call again: a
/// checkpoint is at most ~this late on a thread that calls slowly, ~`CLOCK_FAST_NS` on one
/// that calls fast.
const CLOCK_SLOW_NS: u64 = 200_000;

/// Takes a checkpoint when one is due (`TIERMEM_CKPT_MS` elapsed, or every `TIERMEM_CKPT_CALLS`
/// calls); `now` is the time when this thread read the clock for this call ([`count`]).
fn maybe_checkpoint(h: &Heap, now: Option<u64>) {
    let calls = CKPT_CALLS.load(Ordering::Relaxed);
    let due_calls = calls > 0 && CALLS.fetch_add(1, Ordering::Relaxed) % calls == calls - 1;
    let next = NEXT_CKPT_NS.load(Ordering::Relaxed);
    let due_time = match now {
        Some(now) if next != u64::MAX && now >= next => {
            let ns = CKPT_NS.load(Ordering::Relaxed);
            NEXT_CKPT_NS
                .compare_exchange(next, now + ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        }
        _ => false,
    };
    if due_calls || due_time {
        checkpoint(h);
    }
}

extern "C" fn at_exit() {
    let Some(h) = ready_heap() else { return };
    let _g = Guard::enter();
    if IN_CHILD.load(Ordering::Relaxed) != 0 {
        return;
    }
    checkpoint(h);
    if let Some(Some(path)) = STATS_PATH.get() {
        let t = h.totals();
        let (allocs, frees) = counts();
        let json = format!(
            "{{\"views\":{},\"checkpoints\":{},\"bytes_copied\":{},\"objects_copied\":{},\
             \"pages_written\":{},\"ckpt_ns_total\":{},\"allocs\":{},\"frees\":{},\
             \"fallback_allocs\":{},\"ckpt_phase_ns\":{{{}}},\"skipped\":{},\
             \"safepoint_threads_max\":{},\"safepoint_pause_us\":{},\"safepoint_stop_us\":{},\
             \"safepoint_timeouts\":{},\"verified\":{},\"verify_failed\":{},\"heap_path\":{}}}\n",
            h.views(),
            CHECKPOINTS.load(Ordering::Relaxed),
            t.bytes_copied,
            t.objects_copied,
            t.pages_written,
            t.nanos,
            allocs,
            frees,
            FALLBACK.load(Ordering::Relaxed),
            tiermem_pheap::CkStats::PHASES
                .iter()
                .zip(t.phase_ns)
                .map(|(n, v)| format!("\"{n}\":{v}"))
                .collect::<Vec<_>>()
                .join(","),
            SKIPPED.load(Ordering::Relaxed),
            THREADS_MAX.load(Ordering::Relaxed),
            summary(&lock(&PAUSES_US)),
            summary(&lock(&STOP_US)),
            SAFEPOINT_TIMEOUTS.load(Ordering::Relaxed),
            VERIFIED.load(Ordering::Relaxed),
            VERIFY_FAILED.load(Ordering::Relaxed),
            json_str(&h.path().to_string_lossy()),
        );
        if let Err(e) = std::fs::write(path, json) {
            let _ = writeln!(
                std::io::stderr(),
                "tiermem-pheap-preload: write {path}: {e}"
            );
        }
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// `fork` runs with the forking thread inside a safepoint section, from the last prepare
/// handler (ours is registered first, so it runs last, right before glibc locks its malloc
/// arenas) to the parent and child handlers: a checkpoint's stop never parks a thread that
/// holds the arena locks a checkpoint's own allocations need.
///
/// The child copies the heap into a memfd of its own (`after_fork_child`) while the parent
/// would run on and change it: redis-server's `BGSAVE` child then read a half-updated
/// dictionary and crashed. So the parent stops its other threads at a safepoint before the
/// fork and, after it, waits until the child says its copy is complete (a futex in a shared
/// page); the child's heap is the parent's at the instant of the fork. The wait is bounded
/// (`FORK_WAIT_MS`): a child that dies before copying does not hang the parent.
static FORK_SYNC: AtomicPtr<AtomicU32> = AtomicPtr::new(ptr::null_mut());
/// The stop held across a fork (taken in the prepare handler, dropped in the parent's).
static FORK_STOP: Mutex<Option<safepoint::Stopped>> = Mutex::new(None);
const FORK_PENDING: u32 = 0;
const FORK_COPIED: u32 = 1;
const FORK_WAIT_MS: u64 = 30_000;

/// The shared page holding the fork handshake word (created at the first fork).
fn fork_sync() -> Option<&'static AtomicU32> {
    let mut p = FORK_SYNC.load(Ordering::Acquire);
    if p.is_null() {
        // SAFETY: an anonymous shared mapping of one page (shared with every later child).
        let m = unsafe {
            libc::mmap(
                ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return None;
        }
        p = m as *mut AtomicU32;
        if let Err(other) =
            FORK_SYNC.compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: unmapping our own mapping, which lost the race.
            unsafe { libc::munmap(m, 4096) };
            p = other;
        }
    }
    // SAFETY: a live shared page (never unmapped), aligned for a u32.
    Some(unsafe { &*p })
}

extern "C" fn before_fork() {
    safepoint::enter_raw();
    if STATE.load(Ordering::Acquire) != READY {
        return;
    }
    let Some(sync) = fork_sync() else { return };
    sync.store(FORK_PENDING, Ordering::Release);
    let mut tries = 0;
    loop {
        match safepoint::stop_others(&stop_options()) {
            Ok(s) => {
                *lock(&FORK_STOP) = Some(s);
                return;
            }
            // A checkpoint's stop is under way and waits for this thread: leave the section
            // (parking until that checkpoint ends), then try again.
            Err(safepoint::StopError::Busy) if tries < 1000 => {
                tries += 1;
                safepoint::leave_raw();
                std::thread::sleep(std::time::Duration::from_micros(200));
                safepoint::enter_raw();
            }
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "tiermem-pheap-preload: fork: the other threads could not be stopped ({e}); the child's heap may be torn"
                );
                return;
            }
        }
    }
}

extern "C" fn after_fork_parent() {
    let held = lock(&FORK_STOP).take();
    if let (Some(_), Some(sync)) = (&held, fork_sync()) {
        let t0 = std::time::Instant::now();
        while sync.load(Ordering::Acquire) == FORK_PENDING
            && t0.elapsed() < std::time::Duration::from_millis(FORK_WAIT_MS)
        {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 10_000_000,
            };
            // SAFETY: FUTEX_WAIT (shared: the child is another process) on the live word.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    sync.as_ptr(),
                    libc::FUTEX_WAIT,
                    FORK_PENDING,
                    &ts as *const libc::timespec,
                )
            };
        }
    }
    drop(held);
    safepoint::leave_raw();
}

/// Tells a parent waiting in `after_fork_parent` that this child no longer reads the shared
/// heap (copied, failed or not copying).
fn fork_copied() {
    if let Some(sync) = fork_sync() {
        sync.store(FORK_COPIED, Ordering::Release);
        // SAFETY: FUTEX_WAKE (shared) on the live word.
        unsafe { libc::syscall(libc::SYS_futex, sync.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
    }
}

extern "C" fn after_fork_child() {
    // The parent's stop is not the child's (its Drop would end a round here).
    if let Some(s) = lock(&FORK_STOP).take() {
        std::mem::forget(s);
    }
    safepoint::after_fork_child();
    safepoint::leave_raw();
    if STATE.load(Ordering::Acquire) != READY {
        fork_copied();
        return;
    }
    IN_CHILD.store(1, Ordering::Relaxed);
    let h = owner_heap();
    let cap = h.capacity();
    let bases = h.view_bases();
    let fail = |what: &str| -> ! {
        let _ = writeln!(
            std::io::stderr(),
            "tiermem-pheap-preload: fork child: {what}: {}",
            std::io::Error::last_os_error()
        );
        fork_copied();
        // SAFETY: terminating the child; its heap would alias the parent's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: memfd_create/ftruncate on a fresh descriptor.
    let fd = unsafe { libc::memfd_create(c"tiermem-pheap-child".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        fail("memfd_create");
    }
    // SAFETY: ftruncate of our new memfd.
    if unsafe { libc::ftruncate(fd, cap as libc::off_t) } < 0 {
        fail("ftruncate");
    }
    let pages = cap / 4096;
    // SAFETY: glibc allocation of the mincore vector (the child is single-threaded).
    let vec = unsafe { __libc_malloc(pages) } as *mut u8;
    if vec.is_null() {
        fail("malloc");
    }
    let lib = bases[0];
    // SAFETY: the library view is a mapping of `cap` bytes; `vec` has one byte per page.
    if unsafe { libc::mincore(lib as *mut c_void, cap, vec) } < 0 {
        fail("mincore");
    }
    let mut i = 0;
    while i < pages {
        // SAFETY: i < pages, the length of `vec`.
        if unsafe { *vec.add(i) } & 1 == 0 {
            i += 1;
            continue;
        }
        let start = i;
        // SAFETY: as above.
        while i < pages && unsafe { *vec.add(i) } & 1 != 0 {
            i += 1;
        }
        let (off, len) = (start * 4096, (i - start) * 4096);
        let mut done = 0;
        while done < len {
            // SAFETY: reading from the library view (readable, `cap` bytes) into our memfd.
            let n = unsafe {
                libc::pwrite(
                    fd,
                    (lib + off + done) as *const c_void,
                    len - done,
                    (off + done) as libc::off_t,
                )
            };
            if n <= 0 {
                fail("pwrite");
            }
            done += n as usize;
        }
    }
    // SAFETY: freeing the vector allocated above.
    unsafe { __libc_free(vec as *mut c_void) };
    for &b in &bases {
        // SAFETY: replaces exactly the child's view mapping at `b` (the heap's own mapping)
        // with the private copy; all views alias it again.
        let p = unsafe {
            libc::mmap(
                b as *mut c_void,
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            fail("mmap");
        }
    }
    // SAFETY: the mappings keep the memfd alive.
    unsafe { libc::close(fd) };
    fork_copied();
}

/// `aligned` allocation through the heap when the alignment can be honoured by size classes
/// (power-of-two slots are naturally aligned, medium slots 512-aligned; multi-page objects are
/// page-aligned), else glibc.
fn heap_alloc(size: usize, align: usize) -> *mut c_void {
    // The guard first: it says whether this call is re-entrant (from inside the library) with
    // the one thread-local lookup a section costs.
    let g = Guard::enter();
    let h = match heap_if_ready() {
        Some(h) if !g.was_inside() => h,
        // In a section, as the frees in `free`.
        _ => return libc_alloc(size, align),
    };
    let req = if align <= 16 {
        Some(size)
    } else if align <= 4096 {
        let r = size.max(align);
        if r <= 4096 {
            Some(r.next_power_of_two())
        } else if align > 512 {
            // Medium slots are only 512-aligned: a whole-page run instead.
            Some(r.max(tiermem_pheap::alloc::MEDIUM_MAX + 1))
        } else {
            Some(r)
        }
    } else {
        None
    };
    if let Some(req) = req {
        match h.malloc_in(g.section(), req, None) {
            // A mask for the power-of-two alignments (all but memalign's odd ones): the
            // division took a fifth of this function's time.
            Ok(p) if aligned(p as usize, align) => {
                maybe_checkpoint(h, count(Call::Alloc));
                return p as *mut c_void;
            }
            Ok(p) => {
                // Not reached with the current size classes; stay correct if they change.
                let _ = h.free(p);
            }
            Err(_) => warn_once(&WARNED_FULL, "heap full: falling back to glibc malloc"),
        }
    }
    FALLBACK.fetch_add(1, Ordering::Relaxed);
    libc_alloc(size, align)
}

/// glibc's allocation of `size` bytes aligned to `align`.
fn libc_alloc(size: usize, align: usize) -> *mut c_void {
    // SAFETY: plain glibc allocation.
    unsafe {
        if align <= 16 {
            __libc_malloc(size)
        } else {
            __libc_memalign(align, size)
        }
    }
}

/// True when `addr` is a multiple of `align` (0 counts as 1).
fn aligned(addr: usize, align: usize) -> bool {
    if align.is_power_of_two() {
        addr & (align - 1) == 0
    } else {
        addr % align.max(1) == 0
    }
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// `malloc(3)`: from the pheap when it is ready (glibc when it is full, before it is ready, or
/// for re-entrant calls).
///
/// # Safety
/// As `malloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let p = heap_alloc(size, 16);
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

/// `free(3)`: pheap pointers (by address) go back to the pheap, others to glibc.
///
/// # Safety
/// As `free(3)`: `p` is null or a live allocation of this process.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if !owned(p) {
        // In a section: a stop must not park this thread inside glibc's free, holding an
        // arena lock the checkpoint's own allocations may need.
        let _s = safepoint::section();
        // SAFETY: not in the heap's views, so glibc allocated it.
        unsafe { __libc_free(p) };
        return;
    }
    let h = owner_heap();
    let g = Guard::enter();
    let now = if h.free_in(g.section(), p as *mut u8).is_ok() {
        count(Call::Free)
    } else {
        warn_once(
            &WARNED_BAD_FREE,
            "free() of an invalid pheap pointer ignored",
        );
        None
    };
    if !g.was_inside() {
        maybe_checkpoint(h, now);
    }
}

/// `calloc(3)`: zeroed memory (overflow of `n * size` → null, ENOMEM).
///
/// # Safety
/// As `calloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    if ready_heap().is_none() {
        // SAFETY: plain glibc allocation.
        return unsafe { __libc_calloc(n, size) };
    }
    let p = heap_alloc(total, 16);
    if p.is_null() {
        set_errno(libc::ENOMEM);
    } else if owned(p) {
        // SAFETY: `p` is a fresh heap object of at least `total` bytes.
        unsafe { ptr::write_bytes(p as *mut u8, 0, total) };
    } else {
        // Fallback block from __libc_malloc: not zeroed either.
        // SAFETY: `p` is a fresh glibc block of at least `total` bytes.
        unsafe { ptr::write_bytes(p as *mut u8, 0, total) };
    }
    p
}

/// `realloc(3)`: a pheap object stays in the pheap (moving to glibc only when the heap is
/// full), a glibc block stays in glibc. `realloc(p, 0)` frees `p` and returns null (glibc).
///
/// # Safety
/// As `realloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: as malloc.
        return unsafe { malloc(size) };
    }
    if size == 0 {
        // SAFETY: as free.
        unsafe { free(p) };
        return ptr::null_mut();
    }
    if !owned(p) {
        let _s = safepoint::section(); // as in free
                                       // SAFETY: a glibc block.
        return unsafe { __libc_realloc(p, size) };
    }
    let h = owner_heap();
    let g = Guard::enter();
    if !g.was_inside() {
        maybe_checkpoint(h, count(Call::Other));
    }
    match h.realloc_in(g.section(), p as *mut u8, size) {
        Ok(q) => q as *mut c_void,
        Err(tiermem_pheap::Error::OutOfMemory { .. }) => {
            warn_once(&WARNED_FULL, "heap full: falling back to glibc malloc");
            let old = h.size_of(p as *const u8).unwrap_or(0);
            // SAFETY: glibc allocation; copy the old object's bytes; then free it in the heap.
            let q = unsafe { __libc_malloc(size) };
            if q.is_null() {
                set_errno(libc::ENOMEM);
                return ptr::null_mut();
            }
            // SAFETY: `p` has `old` readable bytes, `q` has `size` writable bytes.
            unsafe { ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size)) };
            let _ = h.free(p as *mut u8);
            FALLBACK.fetch_add(1, Ordering::Relaxed);
            q
        }
        Err(_) => {
            warn_once(&WARNED_BAD_FREE, "realloc() of an invalid pheap pointer");
            set_errno(libc::EINVAL);
            ptr::null_mut()
        }
    }
}

/// `reallocarray(3)`: `realloc(p, n * size)` with overflow → null, ENOMEM.
///
/// # Safety
/// As `reallocarray(3)`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as realloc.
        Some(t) => unsafe { realloc(p, t) },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

fn valid_align(a: usize) -> bool {
    a.is_power_of_two()
}

/// `posix_memalign(3)`: EINVAL unless `align` is a power of two multiple of `sizeof(void *)`.
///
/// # Safety
/// As `posix_memalign(3)`: `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !valid_align(align) || align % std::mem::size_of::<usize>() != 0 {
        return libc::EINVAL;
    }
    let p = heap_alloc(size, align);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable pointer.
    unsafe { *out = p };
    0
}

/// `aligned_alloc(3)`: null and EINVAL unless `align` is a power of two.
///
/// # Safety
/// As `aligned_alloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !valid_align(align) {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let p = heap_alloc(size, align);
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

/// `memalign(3)`: like glibc, a non-power-of-two alignment is rounded up to one.
///
/// # Safety
/// As `memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let Some(a) = align.max(1).checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    let p = heap_alloc(size, a);
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

/// `valloc(3)`: page-aligned.
///
/// # Safety
/// As `valloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    // SAFETY: as memalign.
    unsafe { memalign(4096, size) }
}

/// `pvalloc(3)`: page-aligned, size rounded up to whole pages.
///
/// # Safety
/// As `pvalloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let Some(s) = size.max(1).checked_next_multiple_of(4096) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    // SAFETY: as memalign.
    unsafe { memalign(4096, s) }
}

/// `malloc_usable_size(3)`: for a pheap object its requested size (always usable), else
/// glibc's answer.
///
/// # Safety
/// As `malloc_usable_size(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if owned(p) {
        let _g = Guard::enter();
        return owner_heap().size_of(p as *const u8).unwrap_or(0);
    }
    let f = LIBC_USABLE.load(Ordering::Relaxed);
    if f == 0 {
        return 0;
    }
    // SAFETY: `f` is glibc's malloc_usable_size (dlsym RTLD_NEXT) and `p` a glibc block.
    unsafe {
        let f: unsafe extern "C" fn(*mut c_void) -> usize = std::mem::transmute(f);
        f(p)
    }
}

// jemalloc's non-standard API. A program linked with jemalloc (Debian's redis-server) calls
// these beside malloc/free; with malloc interposed they must describe the pheap's objects, not
// jemalloc's (a `nallocx` larger than `malloc_usable_size` would let the program write past an
// object; a `mallctl("background_thread", true)` would start a thread that blocks every
// signal, so no checkpoint's safepoint could stop it).

/// jemalloc `MALLOCX_LG_ALIGN` / `MALLOCX_ZERO` flags: alignment and zeroing.
fn mallocx_flags(flags: i32) -> (usize, bool) {
    let lg = (flags & 0x3f) as u32;
    (
        if lg == 0 { 16 } else { 1usize << lg.min(30) },
        flags & 0x40 != 0,
    )
}

/// jemalloc `nallocx`: the usable size an allocation of `size` would have (the requested size,
/// as [`malloc_usable_size`] reports for heap objects).
#[no_mangle]
pub extern "C" fn nallocx(size: usize, _flags: i32) -> usize {
    size.max(1)
}

/// jemalloc `mallctl`: no jemalloc controls exist under the pheap; every name is `ENOENT`.
///
/// # Safety
/// Any arguments (none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn mallctl(
    _name: *const libc::c_char,
    _oldp: *mut c_void,
    _oldlenp: *mut usize,
    _newp: *mut c_void,
    _newlen: usize,
) -> i32 {
    libc::ENOENT
}

/// jemalloc `malloc_stats_print`: one line saying the heap is a tiermem pheap, through the
/// callback when given (else stderr).
///
/// # Safety
/// `cb`, when not null, is a valid callback taking `opaque` and a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn malloc_stats_print(
    cb: Option<unsafe extern "C" fn(*mut c_void, *const libc::c_char)>,
    opaque: *mut c_void,
    _opts: *const libc::c_char,
) {
    let msg =
        c"tiermem pheap preload: malloc is a tiermem persistent heap; no jemalloc statistics\n";
    match cb {
        // SAFETY: the caller's callback with its own opaque pointer.
        Some(f) => unsafe { f(opaque, msg.as_ptr()) },
        None => {
            let _ = std::io::stderr().write_all(msg.to_bytes());
        }
    }
}

/// jemalloc `mallocx`: `malloc` with `MALLOCX_LG_ALIGN` and `MALLOCX_ZERO` honoured.
///
/// # Safety
/// As `malloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn mallocx(size: usize, flags: i32) -> *mut c_void {
    let (align, zero) = mallocx_flags(flags);
    let p = heap_alloc(size.max(1), align);
    if zero && !p.is_null() {
        // SAFETY: a fresh block of at least `size` bytes.
        unsafe { ptr::write_bytes(p as *mut u8, 0, size) };
    }
    p
}

/// jemalloc `rallocx`: `realloc` (an alignment above 16 moves the object to a block aligned
/// so; `MALLOCX_ZERO` zeroes the grown tail).
///
/// # Safety
/// As `realloc(3)` with a non-null `p`.
#[no_mangle]
pub unsafe extern "C" fn rallocx(p: *mut c_void, size: usize, flags: i32) -> *mut c_void {
    let (align, zero) = mallocx_flags(flags);
    // SAFETY: as malloc_usable_size of a live block.
    let old = unsafe { malloc_usable_size(p) };
    let q = if align <= 16 {
        // SAFETY: as realloc.
        unsafe { realloc(p, size.max(1)) }
    } else {
        let q = heap_alloc(size.max(1), align);
        if !q.is_null() {
            // SAFETY: `p` has `old` bytes, `q` at least `size`; then the old block is freed.
            unsafe {
                ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size));
                free(p);
            }
        }
        q
    };
    if zero && !q.is_null() && size > old {
        // SAFETY: `q` has at least `size` bytes.
        unsafe { ptr::write_bytes((q as *mut u8).add(old), 0, size - old) };
    }
    q
}

/// jemalloc `xallocx`: resizing in place is not offered; returns the current usable size.
///
/// # Safety
/// As `malloc_usable_size(3)`.
#[no_mangle]
pub unsafe extern "C" fn xallocx(
    p: *mut c_void,
    _size: usize,
    _extra: usize,
    _flags: i32,
) -> usize {
    // SAFETY: as malloc_usable_size.
    unsafe { malloc_usable_size(p) }
}

/// jemalloc `sallocx`: the usable size of `p`.
///
/// # Safety
/// As `malloc_usable_size(3)`.
#[no_mangle]
pub unsafe extern "C" fn sallocx(p: *const c_void, _flags: i32) -> usize {
    // SAFETY: as malloc_usable_size.
    unsafe { malloc_usable_size(p as *mut c_void) }
}

/// jemalloc `dallocx`: `free`.
///
/// # Safety
/// As `free(3)`.
#[no_mangle]
pub unsafe extern "C" fn dallocx(p: *mut c_void, _flags: i32) {
    // SAFETY: as free.
    unsafe { free(p) }
}

/// jemalloc `sdallocx`: `free` (the size hint is not needed).
///
/// # Safety
/// As `free(3)`.
#[no_mangle]
pub unsafe extern "C" fn sdallocx(p: *mut c_void, _size: usize, _flags: i32) {
    // SAFETY: as free.
    unsafe { free(p) }
}
