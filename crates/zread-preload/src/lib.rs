//! # libtiermem_zread_preload — z-READ for unmodified programs
//!
//! `LD_PRELOAD=libtiermem_zread_preload.so TIERMEM_ZREAD=/data/file program ...` serves the
//! program's reads of the named files through z-READ ([`tiermem_iocache::ZFile::zread_into`]):
//! where the program's buffer and the file offset are equally page-aligned, the buffer's whole
//! pages are remapped copy-on-write onto the page cache instead of being copied (the paper's
//! transparent form), under a read lease that keeps the bytes consistent if someone else opens
//! the file for writing (the buffers are then made private first, and reads copy until the
//! lease can be retaken).
//!
//! * **opens**: `open`, `open64`, `openat`, `openat64` and the fortified `__open_2`,
//!   `__open64_2`, `__openat_2`, `__openat64_2`: an fd opened read-only (not `O_PATH`, not
//!   `O_DIRECT`) on a regular file whose path (`/proc/self/fd/N`, the kernel's canonical
//!   name) is one of the `TIERMEM_ZREAD` entries or lies under one is recorded. Opens for
//!   writing are never served: the lease could not be taken while they are open anyway.
//! * **reads** of a recorded fd: `pread`, `pread64`, `read` (at the fd's offset, which is then
//!   advanced with `lseek`), `preadv`, `preadv64`, `preadv2`, `preadv64v2` with one `iovec`
//!   (and `preadv2` flags 0), the fortified `__read_chk`, `__pread_chk`, `__pread64_chk`: when
//!   the request can remap at least one page (buffer and offset equally aligned, a whole page
//!   in it, a buffer the policy allows) it goes to the file's `ZFile` (one per file, made at the
//!   first such read with [`tiermem_iocache::ZFile::from_fd`], default options but the model
//!   switch); everything else, and any error, goes to the real call.
//! * **`close`** of a recorded fd forgets it; the last one on a file drops its `ZFile` (lease
//!   released). **`dup`, `dup2`, `dup3`** of a recorded fd record the copy (`dd if=F` reopens
//!   its input as fd 0 that way).
//! * Every other call passes straight through (the real functions are `dlsym(RTLD_NEXT)`'s),
//!   after one atomic load. Calls the library makes itself (z-READ's own opens and reads, the
//!   loss model's calibration) and calls from a signal handler that interrupted the library
//!   pass through too (a thread-local flag), so nothing recurses.
//!
//! ## Environment
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TIERMEM_ZREAD` | colon-separated files and directories (a directory covers every file under it); unset or empty: the library does nothing | none |
//! | `TIERMEM_ZREAD_MODEL` | `1`: the loss model decides copy or remap per read; `0`: remap whenever aligned | `1` |
//! | `TIERMEM_ZREAD_BUFFERS` | `heap`: remap only buffers in glibc's main-arena heap; `any`: any aligned buffer (see below) | `heap` |
//! | `TIERMEM_ZREAD_STATS` | file to append the exit report to (`%p`: the pid) | none |
//!
//! A malformed variable prints one line on stderr naming it, and the program runs plain.
//!
//! ## Which buffers may be remapped
//!
//! A remapped buffer page is a private file mapping until the program writes it. An allocator
//! that later purges that memory with `MADV_DONTNEED` and assumes it then reads as zeros (glibc's
//! thread arenas when they shrink, jemalloc, tcmalloc) would hand out file bytes where it
//! promises zeros (`calloc`). So by default ([`config::Buffers::Heap`]) only buffers inside
//! glibc's main-arena heap are remapped, while glibc's malloc is the program's: that heap shrinks
//! with `brk`, which unmaps the remapped pages, and glibc assumes zeros only of memory the
//! kernel gives it fresh. Other reads are copied by the real call. `TIERMEM_ZREAD_BUFFERS=any`
//! lifts that for programs whose read buffers are their own mappings (`fio --mem=mmap`, a
//! database's I/O buffers).
//!
//! ## The exit report
//!
//! At `exit` (an `atexit` handler) and at `_exit`/`_Exit` (hooked: fio's job processes end
//! that way), a process that read a served fd appends one line to
//! `TIERMEM_ZREAD_STATS`: a JSON object with `pid`, `files` (z-READ files made), `live_files`,
//! `routed` (reads served through z-READ), `passed` (reads of served fds given to the real
//! call), `fallbacks` (z-READ errors, the read then done by the real call), `open_failures`,
//! and every counter of [`tiermem_iocache::ZStats`] summed over the process's files
//! (`into_remapped_pages`, `into_copied_bytes`, `model_copies`, `lease_breaks`, ...).
//!
//! ## Limits
//!
//! * `fork`: a child of a process that has made z-READ files runs plain (the files' locks and
//!   lease watcher thread belong to the parent); a child of one that has only recorded fds
//!   serves them itself. `exec` starts afresh.
//! * `read` of a served fd is three system calls (`lseek`, the read, `lseek`) and is not
//!   atomic with respect to the fd's offset: threads sharing one fd with `read` may interleave
//!   differently than with the real call (`pread` has no such issue).
//! * A short read at end of file zero-fills the rest of the buffer (`read(2)` leaves it).
//! * stdio (`fopen`/`fread`) opens and reads inside glibc, where no interposer can see them:
//!   such files are not served. fds at or above 65536 are not served.
//! * With `TIERMEM_ZREAD_BUFFERS=any`, a bad buffer pointer is remapped rather than failing
//!   with `EFAULT`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![allow(clippy::missing_safety_doc)]

pub mod config;
pub mod hooks;
pub mod real;
pub mod report;
pub mod table;

use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::OnceLock;

/// The library's state: [`OFF`] until the constructor has read a configuration, [`ON`] while
/// it serves, [`DISABLED`] in a forked child that must run plain.
pub static STATE: AtomicU8 = AtomicU8::new(OFF);
/// Not (yet) serving: every hook passes through.
pub const OFF: u8 = 0;
/// Serving the configured files.
pub const ON: u8 = 1;
/// A forked child of a process with z-READ files: every hook passes through.
pub const DISABLED: u8 = 2;

static CONFIG: OnceLock<config::Config> = OnceLock::new();

/// The configuration, once the library serves.
pub fn config() -> Option<&'static config::Config> {
    CONFIG.get()
}

/// Whether the library serves in this process now.
#[inline]
pub fn active() -> bool {
    STATE.load(SeqCst) == ON
}

thread_local! {
    /// True while this thread runs library code: its own calls pass through the hooks.
    static IN_LIB: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as inside the library until dropped.
pub struct Inside(());

impl Inside {
    /// Enters the library; `None` when the thread is already inside (a call the library made
    /// itself, or a signal handler that interrupted it), or its thread-locals are gone
    /// (thread exit): the caller then passes the call through.
    #[inline]
    pub fn enter() -> Option<Inside> {
        match IN_LIB.try_with(|c| c.replace(true)) {
            Ok(false) => Some(Inside(())),
            _ => None,
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = IN_LIB.try_with(|c| c.set(false));
    }
}

/// Whether `FILES` was locked by the fork-prepare handler (else the child runs plain).
static LOCKED_FOR_FORK: AtomicBool = AtomicBool::new(false);

extern "C" fn before_fork() {
    // Only try: a fork from a signal handler that interrupted a holder must not deadlock.
    LOCKED_FOR_FORK.store(table::lock_for_fork(), SeqCst);
}

extern "C" fn after_fork_parent() {
    if LOCKED_FOR_FORK.swap(false, SeqCst) {
        // SAFETY: before_fork locked it on this thread.
        unsafe { table::unlock_after_fork() };
    }
}

extern "C" fn after_fork_child() {
    let locked = LOCKED_FOR_FORK.swap(false, SeqCst);
    if locked {
        // SAFETY: the forking thread locked it in before_fork (this thread in the child).
        unsafe { table::unlock_after_fork() };
    }
    // z-READ files made by the parent share its lease watcher and locks, which may be held by
    // threads that do not exist here: run plain rather than risk them.
    if !locked || table::CREATED.load(SeqCst) > 0 {
        let _ = STATE.compare_exchange(ON, DISABLED, SeqCst, SeqCst);
    }
}

/// Runs once, from the library's constructor (before the program's `main`): resolves the real
/// functions, reads the environment, registers the fork and exit handlers, then serves.
extern "C" fn init() {
    let Some(_inside) = Inside::enter() else {
        return;
    };
    real::resolve_all();
    let cfg = match config::from_env() {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "tiermem-zread-preload: {e}; the program runs without z-READ"
            );
            return;
        }
    };
    let _ = CONFIG.set(cfg);
    // SAFETY: registering plain extern "C" functions without arguments.
    unsafe {
        libc::atexit(report::at_exit);
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
    }
    STATE.store(ON, SeqCst);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
