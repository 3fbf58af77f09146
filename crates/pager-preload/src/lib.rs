//! # libtiermem_pager_preload — NVSwap paging for unmodified programs
//!
//! `tiermem pager run --budget 1G [--bound p99=300us] [--nvm 512M] -- CMD` runs `CMD` with this
//! library preloaded. The program's large blocks and large anonymous mappings come from one
//! *paged arena*, a [`tiermem_pager::PagedRegion`] whose pages beyond the DRAM budget live in
//! the NVM paging buffer or the swap file and fault back in, in the faulting thread.
//!
//! * **Served from the arena**: `malloc`, `calloc`, `realloc`, `reallocarray`, `posix_memalign`,
//!   `aligned_alloc`, `memalign`, `valloc`, `pvalloc` of at least `TIERMEM_PAGER_MIN` bytes
//!   (memcached's `-L` cache is one `posix_memalign`), and `mmap`/`mmap64` of private anonymous
//!   read-write memory of at least that size with no address hint (jemalloc's chunks in
//!   redis-server). `free`, `munmap` (partial too), `mremap` (moved by copy), `madvise`
//!   (`MADV_FREE` becomes `MADV_DONTNEED`, which the pager sees) and `malloc_usable_size`
//!   follow. Everything else goes to glibc (its `__libc_*` functions) or the real call.
//!   glibc's own internal `mmap` of large blocks is not interposable, which is why the malloc
//!   family is hooked rather than `mmap` alone.
//! * **A program with its own allocator** (redis-server links jemalloc): when the next `malloc`
//!   after this library is not glibc's, the malloc family goes to it, every block, and the
//!   arena pages that allocator's own memory, its anonymous `mmap`s. tiermem code (the pager's
//!   and the fault engine's threads, a fault being resolved) never enters the program's
//!   allocator: its calls get blocks of a small heap of the library's own, which `free` knows
//!   by address.
//! * **System calls on arena memory**: the kernel cannot fault an evicted page of an in-thread
//!   region in (its access fails with `EFAULT`), so `read`, `write`, `pread(64)`, `pwrite(64)`,
//!   `readv`, `writev`, `recv`, `recvfrom`, `recvmsg`, `send`, `sendto`, `sendmsg` and the
//!   fortified `__read_chk`, `__pread(64)_chk`, `__recv_chk`, `__recvfrom_chk`, and the event
//!   arrays of `epoll_wait`, `epoll_pwait`, `poll` and `ppoll`, pin the arena
//!   pages of their buffers in DRAM for the call ([`tiermem_pager::PagedRegion::pin`]). A
//!   single-buffer call is cut to a quarter of the budget (a short count, which POSIX allows)
//!   so pins never hold the whole budget.
//!
//! The library's own allocations (Rust's global allocator here is glibc's `__libc_*`), and calls
//! made while it sets itself up, never reach the arena. The pager starts at the first large
//! request, so a shell or a short helper run under the library costs nothing.
//!
//! ## Environment (set by `tiermem pager run`)
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TIERMEM_PAGER_BUDGET` | DRAM budget in bytes; unset: the library does nothing | — |
//! | `TIERMEM_PAGER_NVM` | NVM paging buffer in bytes (0: none) | 0 |
//! | `TIERMEM_PAGER_ARENA` | arena size in bytes (virtual; the shadow table costs 28 bytes a page) | 8 × budget, at least 1 GiB |
//! | `TIERMEM_PAGER_MIN` | smallest request served from the arena | 131072 |
//! | `TIERMEM_PAGER_BOUND_NS`, `TIERMEM_PAGER_BOUND_PCT` | page-in bound of the arena (ns, percentile in (0, 1)) | none, 0.99 |
//! | `TIERMEM_PAGER_DIR` | directory of the swap file (a disk) | `/var/tmp` |
//! | `TIERMEM_PAGER_STATS` | file the exit report is appended to (`%p`: the pid) | none |
//! | `TIERMEM_PAGER_POOL` | a shared pager pool (`tiermem pager daemon`) to be a tenant of, instead of a buffer and swap file of its own (`NVM` and `DIR` are then unused) | none |
//!
//! A malformed variable, or a pager that cannot start (e.g. the swap directory on tmpfs),
//! prints one line on stderr and the program runs without paging.
//!
//! ## Limits
//!
//! * `fork`: the arena is not inherited (the pager's regions are `MADV_DONTFORK`); a child that
//!   touches arena memory crashes. A child that execs is fine, and so is one that only
//!   allocates: its large requests go to glibc, its `free` of an inherited arena block does
//!   nothing. A child forked before the pager started starts its own on its first large
//!   request (stress-ng's stressors). redis-server's `BGSAVE` forks: run it without
//!   persistence.
//! * Kernel access to arena memory through other calls (`io_uring`, `splice`, `vmsplice`,
//!   `process_vm_*`, `sendfile` from a mapping) is not pinned and can fail with `EFAULT`.
//! * A program's own `SIGBUS` handler is chained behind the fault engine's (`sigaction` and
//!   `signal` are hooked): it sees only the faults that are not the pager's.
//! * A request larger than the arena's largest free extent goes to glibc (counted).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![allow(clippy::missing_safety_doc)]

pub mod arena;
pub mod hooks;
mod libheap;
mod next;

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// The library's own allocator: glibc's malloc under its internal names, never this library's
/// exported `malloc` (the pager's own tables must not live in the arena it pages).
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
/// A child forked from a process whose pager runs: the arena is not mapped here
/// (`MADV_DONTFORK`) and the pager threads do not exist, so nothing goes to the arena and its
/// blocks are left alone (a `free` of one does nothing).
const FORKED: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static ARENA: OnceLock<arena::Arena> = OnceLock::new();
/// `[LO, HI)`: the arena, 0/0 until it exists (the hooks' one-compare fast path).
static LO: AtomicUsize = AtomicUsize::new(0);
static HI: AtomicUsize = AtomicUsize::new(0);
/// Smallest request served from the arena.
static MIN: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Most bytes one single-buffer system call pins.
static PIN_MAX: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Counters for the exit report.
pub(crate) struct Counters {
    pub(crate) arena_allocs: AtomicU64,
    pub(crate) arena_frees: AtomicU64,
    pub(crate) arena_full: AtomicU64,
    pub(crate) mmaps: AtomicU64,
    pub(crate) munmaps: AtomicU64,
    pub(crate) pinned_calls: AtomicU64,
    pub(crate) cut_calls: AtomicU64,
    /// `sigaction`/`signal` calls for SIGBUS chained behind the fault engine's handler.
    pub(crate) sigbus_chained: AtomicU64,
}

pub(crate) static COUNTERS: Counters = Counters {
    arena_allocs: AtomicU64::new(0),
    arena_frees: AtomicU64::new(0),
    arena_full: AtomicU64::new(0),
    mmaps: AtomicU64::new(0),
    munmaps: AtomicU64::new(0),
    pinned_calls: AtomicU64::new(0),
    cut_calls: AtomicU64::new(0),
    sigbus_chained: AtomicU64::new(0),
};

/// The parsed environment.
struct Config {
    opts: tiermem_pager::PagerOptions,
    arena: usize,
    bound: Option<(f64, u64)>,
    stats: Option<String>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

thread_local! {
    /// True while this thread runs library code (setting the pager up, the exit report):
    /// its calls pass straight to the real functions.
    static IN_LIB: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as inside the library until dropped.
pub(crate) struct Guard(bool);

impl Guard {
    pub(crate) fn enter() -> Guard {
        Guard(IN_LIB.try_with(|c| c.replace(true)).unwrap_or(true))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = IN_LIB.try_with(|c| c.set(self.0));
    }
}

/// Whether the calling thread is inside the library or runs tiermem code (the pager's and
/// the fault engine's threads, a fault being resolved: `tiermem_fault::scope`), or its
/// thread-locals are gone.
#[inline]
pub(crate) fn inside() -> bool {
    IN_LIB.try_with(|c| c.get()).unwrap_or(true) || tiermem_fault::scope::in_library()
}

/// Whether `addr` is in the arena (one load pair; false before it exists).
#[inline]
pub(crate) fn in_arena(addr: usize) -> bool {
    addr >= LO.load(Ordering::Relaxed) && addr < HI.load(Ordering::Relaxed)
}

/// The arena if it exists.
#[inline]
pub(crate) fn arena_ready() -> Option<&'static arena::Arena> {
    if STATE.load(Ordering::Acquire) == READY {
        ARENA.get()
    } else {
        None
    }
}

/// The arena for a request of `bytes`: `None` when it is small, when the library is off or
/// still starting, or when the calling thread is the library's own. Starts the pager on the
/// first large request.
#[inline]
pub(crate) fn arena_for(bytes: usize) -> Option<&'static arena::Arena> {
    if bytes < MIN.load(Ordering::Relaxed) || inside() {
        return None;
    }
    match STATE.load(Ordering::Acquire) {
        READY => ARENA.get(),
        UNINIT => start(),
        _ => None,
    }
}

/// Most bytes a single-buffer system call may pin.
pub(crate) fn pin_max() -> usize {
    PIN_MAX.load(Ordering::Relaxed)
}

#[cold]
fn start() -> Option<&'static arena::Arena> {
    let cfg = CONFIG.get()?;
    if STATE
        .compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return arena_ready();
    }
    let _g = Guard::enter();
    match arena::Arena::new(&cfg.opts, cfg.arena, cfg.bound) {
        Ok(a) => {
            let (lo, hi) = (a.base(), a.base() + a.len());
            if ARENA.set(a).is_err() {
                STATE.store(DISABLED, Ordering::Release);
                return None;
            }
            LO.store(lo, Ordering::Relaxed);
            HI.store(hi, Ordering::Release);
            // SAFETY: registering a plain extern "C" function without arguments.
            unsafe { libc::atexit(at_exit) };
            STATE.store(READY, Ordering::Release);
            ARENA.get()
        }
        Err(e) => {
            eprintln!(
                "tiermem-pager-preload: the pager did not start ({e}); running without paging"
            );
            STATE.store(DISABLED, Ordering::Release);
            None
        }
    }
}

fn env_u64(name: &str) -> Result<Option<u64>, String> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={v:?} is not a whole number")),
    }
}

fn parse_config() -> Result<Option<Config>, String> {
    let Some(budget) = env_u64("TIERMEM_PAGER_BUDGET")? else {
        return Ok(None);
    };
    let nvm = env_u64("TIERMEM_PAGER_NVM")?.unwrap_or(0);
    let arena = env_u64("TIERMEM_PAGER_ARENA")?.unwrap_or((8 * budget).max(1 << 30));
    let min = env_u64("TIERMEM_PAGER_MIN")?.unwrap_or(128 << 10).max(4096);
    let bound = match env_u64("TIERMEM_PAGER_BOUND_NS")? {
        None => None,
        Some(ns) => {
            let pct = match std::env::var("TIERMEM_PAGER_BOUND_PCT") {
                Ok(v) if !v.is_empty() => v
                    .parse::<f64>()
                    .ok()
                    .filter(|p| *p > 0.0 && *p < 1.0)
                    .ok_or_else(|| format!("TIERMEM_PAGER_BOUND_PCT={v:?} is not in (0, 1)"))?,
                _ => 0.99,
            };
            Some((pct, ns))
        }
    };
    let mut opts = tiermem_pager::PagerOptions::new(budget, nvm);
    let dir = std::env::var("TIERMEM_PAGER_DIR").unwrap_or_else(|_| "/var/tmp".into());
    opts.swap_path = Some(
        std::path::PathBuf::from(dir)
            .join(format!("tiermem-pager-run-{}.swap", std::process::id())),
    );
    // Room for every arena page out of DRAM.
    opts.swap_size = Some(arena + (64 << 20));
    if let Ok(p) = std::env::var("TIERMEM_PAGER_POOL") {
        if !p.is_empty() {
            opts.pool = Some(p.into());
        }
    }
    MIN.store(min as usize, Ordering::Relaxed);
    PIN_MAX.store((budget as usize / 4).max(64 << 10), Ordering::Relaxed);
    Ok(Some(Config {
        opts,
        arena: arena as usize,
        bound,
        stats: std::env::var("TIERMEM_PAGER_STATS")
            .ok()
            .filter(|s| !s.is_empty()),
    }))
}

extern "C" fn forked_child() {
    if STATE.load(Ordering::Relaxed) != UNINIT {
        STATE.store(FORKED, Ordering::Relaxed);
    }
}

extern "C" fn init() {
    let _g = Guard::enter();
    hooks::resolve_real();
    hooks::resolve_glibc_usable();
    // SAFETY: registering a plain extern "C" function without arguments for the child side.
    unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    match parse_config() {
        Ok(Some(c)) => {
            let _ = CONFIG.set(c);
        }
        Ok(None) => STATE.store(DISABLED, Ordering::Release),
        Err(e) => {
            eprintln!("tiermem-pager-preload: {e}; running without paging");
            STATE.store(DISABLED, Ordering::Release);
        }
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Whether the exit report was written (`exit` and a direct `_exit` may both come by).
static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The exit report: one JSON line appended to `TIERMEM_PAGER_STATS`, by the process whose
/// pager ran (not by a forked child), once. Called by `exit` (atexit) and by the `_exit` and
/// `_Exit` hooks (stress-ng's stressors end with `_exit`).
pub(crate) extern "C" fn at_exit() {
    let _g = Guard::enter();
    if STATE.load(Ordering::Acquire) != READY || REPORTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let (Some(cfg), Some(a)) = (CONFIG.get(), ARENA.get()) else {
        return;
    };
    let Some(path) = &cfg.stats else {
        return;
    };
    let path = path.replace("%p", &std::process::id().to_string());
    let s = a.pager().stats();
    let (blocks, pages) = a.usage();
    let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let c = &COUNTERS;
    let v = serde_json::json!({
        "pid": std::process::id(),
        "arena_bytes": a.len(),
        "blocks": blocks,
        "block_bytes": pages * arena::PAGE,
        "arena_allocs": l(&c.arena_allocs),
        "arena_frees": l(&c.arena_frees),
        "arena_full": l(&c.arena_full),
        "mmaps": l(&c.mmaps),
        "munmaps": l(&c.munmaps),
        "pinned_calls": l(&c.pinned_calls),
        "sigbus_chained": l(&c.sigbus_chained),
        "cut_calls": l(&c.cut_calls),
        "budget_pages": s.budget_pages,
        "max_resident_pages": s.max_resident_pages,
        "zero_fills": s.zero_fills,
        "pageins_buffer": s.pageins_buffer,
        "pageins_ssd": s.pageins_ssd,
        "pageouts_buffer": s.pageouts_buffer,
        "pageouts_ssd": s.pageouts_ssd,
        "pageouts_clean": s.pageouts_clean,
        "dropped": s.dropped,
        "pinned_skips": s.pinned_skips,
        "fifo_stale": s.fifo_stale,
        "io_errors": s.io_errors,
        "pagein_p50_ns": s.pagein.quantile(0.5),
        "pagein_p99_ns": s.pagein.quantile(0.99),
    });
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = writeln!(f, "{v}");
    }
}
