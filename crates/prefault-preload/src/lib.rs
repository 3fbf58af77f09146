//! # libtiermem_prefault_preload — first touches that do not fault, for unmodified programs
//!
//! `LD_PRELOAD=libtiermem_prefault_preload.so program ...` (or `tiermem prefault run -- program
//! ...`) starts one [`tiermem_prefault::Service`] in the library's constructor and registers
//! the program's large anonymous memory with it, so that its pages are populated (allocated,
//! zeroed, mapped) by the service's thread ahead of the program's first touches:
//!
//! * **mappings**: `mmap`/`mmap64` of private anonymous read-write memory of at least
//!   `TIERMEM_PREFAULT_MIN` bytes (jemalloc's extents, Python's arenas, a program's own
//!   buffers);
//! * **glibc's large blocks**: glibc maps them with internal calls, so `malloc`, `calloc`,
//!   `realloc`, `reallocarray`, `memalign`, `aligned_alloc`, `posix_memalign`, `valloc` and
//!   `pvalloc` register the page-aligned interior of a block of at least the minimum that glibc
//!   mapped on its own;
//! * **`[heap]`**: glibc's main arena grows with `sbrk`; the library sets `M_TOP_PAD` so the
//!   break runs ahead of malloc's need and `M_TRIM_THRESHOLD` out of reach so a trim cannot
//!   race a populate, and registers each growth (see [`heap`]).
//!
//! Before the range of a `munmap`, `mremap`, purging `madvise` (`MADV_DONTNEED`, `_FREE`,
//! `_REMOVE`, `_DONTNEED_LOCKED`, a guard install), write-removing `mprotect`, `MAP_FIXED`
//! mapping, shrinking `sbrk`/`brk`, `malloc_trim`, or a `free`/`realloc` of a registered
//! block changes, its registrations end (waiting for a populate in flight there): nothing is
//! populated in the range after the call, and what an allocator purged is not populated again.
//! No hook takes a lock or allocates (the registration table is lock-free), so none can wait
//! for the service thread's locks; in a forked child the `pthread_atfork` handler tells the
//! table the thread is gone and the child runs plain, or starts its own service at its next
//! malloc-family call with `TIERMEM_PREFAULT_CHILD=restart`.
//!
//! ## Environment
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TIERMEM_PREFAULT_DISABLE` | `1`: run the program plain | `0` |
//! | `TIERMEM_PREFAULT_BUDGET` | bytes populated ahead and not yet used, at most (`k`/`m`/`g`) | `64m` |
//! | `TIERMEM_PREFAULT_MIN` | smallest mapping or malloc request registered (`k`/`m`/`g`) | `256k` |
//! | `TIERMEM_PREFAULT_CHUNK` | pages per window entry, 1..=64 | `16` |
//! | `TIERMEM_PREFAULT_ENTRIES` | window entries per region, 1..=64 | `64` |
//! | `TIERMEM_PREFAULT_ORDER` | `auto`, `ascending`, `descending`, `stride`, `whole` | `auto` |
//! | `TIERMEM_PREFAULT_POPULATE` | `write` (private zeroed pages) or `read` (the zero page) | `write` |
//! | `TIERMEM_PREFAULT_THP` | `auto`, `on` (whole 2 MiB units), `off` (4 KiB chunks) | `auto` |
//! | `TIERMEM_PREFAULT_INTERVAL_US` | microseconds between the service's passes while idle | `2000` |
//! | `TIERMEM_PREFAULT_HEAP` | `1`: follow `[heap]`; `0`: do not (nor tune glibc) | `1` |
//! | `TIERMEM_PREFAULT_STATS` | file the exit report is written to (`%p`: the pid) | none |
//! | `TIERMEM_PREFAULT_STATS_PID` | the process that writes it (`tiermem prefault run`: the command's) | each |
//! | `TIERMEM_PREFAULT_CHILD` | a forked child runs `plain` or `restart`s its own service | `plain` |
//! | `TIERMEM_PREFAULT_SCHED_IDLE` | `1`: the service thread runs SCHED_IDLE; `0`: normal priority | `1` |
//!
//! Under `auto`, malloc blocks, heap growth and mappings below 4 MiB are filled ascending (an
//! allocator hands them out from their start; a learned order would begin 2 MiB past the first
//! touches); larger mappings learn their order from the footprint. A malformed variable prints
//! one line on stderr naming it, and the program runs plain; nothing makes the library abort a
//! program.
//!
//! The exit report (at `exit` and at `_exit`/`_Exit`, which the library hooks for that; not
//! after a fatal signal or a raw `exit_group`) is one JSON object: the
//! service's figures (`regions`, `passes`, `populate_calls`, `populated_bytes`,
//! `tripwire_hits`, `footprint_pages`, `unused_bytes`, `peak_unused_bytes`, `budget_bytes`,
//! `backoffs`, `starved_passes`, `failures`, `service_cpu_ns`, `sched_idle`, `sensing`), the
//! minor and major faults of the whole process, of the service thread (`service_minflt`,
//! `service_tid`) and of the application's threads (`app_minflt`: the process's less the
//! service's), and the library's counters (`mmap_regions`, `malloc_blocks`, `heap_growths`,
//! `registered_bytes`, `register_failures`, `dropped`, `purged`). It is written by the process
//! whose pid is `TIERMEM_PREFAULT_STATS_PID` (`tiermem prefault run` sets it to the command's,
//! which an `exec` chain keeps, so the programs a command starts do not overwrite its report), by
//! default by every process the library is loaded in (not by a forked child), and with `%p`
//! in the path by every process into its own file.
//!
//! ## Limits
//!
//! * Memory changed by raw system calls (`syscall(SYS_munmap, ...)`, as Go's runtime does) is
//!   not seen: a registration left over such a range is ended when a later mapping lands there.
//! * glibc's secondary arenas (threads' heaps) are not followed; their large blocks are.
//! * A purge ends the whole registration it touches (jemalloc's decay purges end its extent's).
//! * A region registered with userfaultfd by the program would see the service's populates as
//!   missing-page faults (and a handler thread unmapping it would wait for a populate that
//!   waits for it).
//! * With `[heap]` followed, glibc keeps freed heap memory (no automatic trim) until the
//!   program calls `malloc_trim`: the price of trims that cannot race a populate
//!   (`TIERMEM_PREFAULT_HEAP=0` leaves glibc as it is).
//! * Each process loading the library prints its own warning for a malformed variable (a
//!   shell script warns once per program it runs).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![allow(clippy::missing_safety_doc)]

pub mod config;
pub mod heap;
pub mod hooks;
pub mod malloc;
pub mod real;
pub mod state;
pub mod stats;

use state::{CONFIG, IS_GLIBC, ORIGIN_PID, STATE};
use std::io::Write;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use tiermem_prefault::Service;

/// Runs once, from the library's constructor (before the program's `main`): reads the
/// environment, starts the service, registers the fork and exit handlers. Until it has
/// finished, and for good when it fails, every hook passes through.
extern "C" fn init() {
    if STATE
        .compare_exchange(state::UNINIT, state::STARTING, SeqCst, SeqCst)
        .is_err()
    {
        return;
    }
    real::resolve_family();
    stats::resolve_exits();
    let cfg = match config::from_env() {
        Ok(Some(c)) => c,
        Ok(None) => {
            state::off();
            return;
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "tiermem-prefault-preload: {e}; the program runs without prefaulting"
            );
            state::off();
            return;
        }
    };
    IS_GLIBC.store(
        real::FAMILY.malloc.load(Relaxed) == real::glibc_malloc(),
        Relaxed,
    );
    let svc = match Service::start(cfg.opts.clone()) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "tiermem-prefault-preload: cannot start the service: {e}; the program runs without prefaulting"
            );
            state::off();
            return;
        }
    };
    let cfg = CONFIG.get_or_init(|| cfg);
    ORIGIN_PID.store(cfg.stats_pid.unwrap_or(std::process::id() as i32), Relaxed);
    // SAFETY: registering plain extern "C" functions without arguments.
    unsafe {
        libc::atexit(stats::at_exit);
        libc::pthread_atfork(None, None, Some(state::after_fork_child));
    }
    state::serve(svc, cfg);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// For tests and tools: 1 when the library serves this process (a service runs and the hooks
/// register), else 0.
#[no_mangle]
pub extern "C" fn tiermem_prefault_preload_active() -> i32 {
    i32::from(state::service().is_some())
}

/// For tests and tools: the passes the service has made (0 when none serves). A test waits
/// for it to advance to know that the service has looked at the table since.
#[no_mangle]
pub extern "C" fn tiermem_prefault_preload_passes() -> u64 {
    state::service().map_or(0, |s| s.stats().passes)
}

/// For tests and tools: bytes the service has populated (0 when none serves).
#[no_mangle]
pub extern "C" fn tiermem_prefault_preload_populated_bytes() -> u64 {
    state::service().map_or(0, |s| s.stats().populated_bytes)
}

/// For tests and tools: live registrations (0 when none serves).
#[no_mangle]
pub extern "C" fn tiermem_prefault_preload_regions() -> u64 {
    state::service().map_or(0, |s| s.stats().regions as u64)
}
