//! Keeps a `fork(2)` by any thread of the process from deadlocking with the runtime thread.
//!
//! glibc's `fork` takes every malloc arena lock (and the stdio list lock) before it copies the
//! address space, and releases them only when `fork` returns in the parent. When a handler
//! context has `UFFD_FEATURE_EVENT_FORK`, the kernel makes that fork wait, in the middle, until
//! the runtime thread has read the context's `UFFD_EVENT_FORK` (one event per such context, one
//! after the other). A runtime thread that calls `malloc` or `free` inside that window (a
//! resolver, a vector growing, a deferred fault, the bookkeeping of the first fork event before
//! the second is read) waits for the forker's lock while the forker waits for it: both hang.
//! glibc's per-thread cache usually hides it; the fork test hung about once in a hundred runs.
//!
//! The handshake: a `pthread_atfork` prepare handler (glibc runs those before it takes its
//! locks) counts the fork in, then waits until the runtime is outside its dispatch section. The
//! runtime enters its dispatch section only when no fork is counted: each side stores its own
//! flag, then reads the other's, both sequentially consistent, so at least one of them sees the
//! other. While a fork is counted, the runtime only reads messages into a preallocated list
//! (`Runtime::ride_out_fork`) and dispatches them after the parent handler (run once glibc has
//! released its locks) has counted the fork out. Until a context with `EVENT_FORK` exists, no
//! fork waits for the runtime, and the handlers do nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::Once;

/// Capacity of the runtime's held-message list. Each faulting thread has at most one pending
/// fault per context, so the list fills only with thousands of faulting threads; when it is full
/// the runtime stops reading until the fork is over (a fork event behind the full list would then
/// wait, which is the old hang, made unreachable in practice).
pub(crate) const HELD_CAP: usize = 4096;

/// True once a handler context with `UFFD_FEATURE_EVENT_FORK` exists.
static ARMED: AtomicBool = AtomicBool::new(false);
/// Forks between their prepare and parent handlers.
static FORKS: AtomicU32 = AtomicU32::new(0);
/// True while the runtime thread is in its dispatch section (where it may allocate).
static DISPATCHING: AtomicBool = AtomicBool::new(false);
/// Kernel thread id of the runtime thread (0 before it starts).
static RUNTIME_TID: AtomicI32 = AtomicI32::new(0);
static INSTALL: Once = Once::new();

thread_local! {
    /// This thread's fork was counted in by `prepare` (the engine may be armed in between).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Registers the `pthread_atfork` handlers (once per process). Call before the runtime starts.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: the three handlers are `extern "C"` functions that only touch atomics and
        // make async-signal-safe system calls; pthread_atfork keeps the pointers forever.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// Called when a context with `UFFD_FEATURE_EVENT_FORK` is created: from now on forks wait for
/// the runtime's safe point.
pub(crate) fn arm() {
    ARMED.store(true, Ordering::SeqCst);
}

/// Called by the runtime thread when it starts.
pub(crate) fn runtime_started() {
    // SAFETY: gettid has no preconditions.
    RUNTIME_TID.store(unsafe { libc::gettid() }, Ordering::SeqCst);
}

/// The runtime asks to enter its dispatch section: false if a fork is in progress (then it must
/// not allocate until [`forking`] turns false; it has not entered).
pub(crate) fn enter_dispatch() -> bool {
    DISPATCHING.store(true, Ordering::SeqCst);
    if FORKS.load(Ordering::SeqCst) > 0 {
        DISPATCHING.store(false, Ordering::SeqCst);
        return false;
    }
    true
}

/// The runtime leaves its dispatch section (it will not allocate until it enters again).
pub(crate) fn leave_dispatch() {
    DISPATCHING.store(false, Ordering::SeqCst);
}

/// True while some thread is between its fork's prepare and parent handlers.
pub(crate) fn forking() -> bool {
    FORKS.load(Ordering::SeqCst) > 0
}

extern "C" fn prepare() {
    if !ARMED.load(Ordering::SeqCst) {
        return;
    }
    FORKS.fetch_add(1, Ordering::SeqCst);
    COUNTED.with(|c| c.set(true));
    // SAFETY: gettid has no preconditions.
    if unsafe { libc::gettid() } == RUNTIME_TID.load(Ordering::SeqCst) {
        // A resolver forking (documented as forbidden): waiting for ourselves would never end.
        return;
    }
    let mut spins = 0u32;
    while DISPATCHING.load(Ordering::SeqCst) {
        spins += 1;
        if spins < 64 {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        } else {
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 20_000,
            };
            // SAFETY: nanosleep with a valid timespec and no remainder.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
    }
}

extern "C" fn parent() {
    if COUNTED.with(|c| c.replace(false)) {
        FORKS.fetch_sub(1, Ordering::SeqCst);
    }
}

extern "C" fn child() {
    // The child has no runtime thread; a fork it makes must not wait for one.
    COUNTED.with(|c| c.set(false));
    FORKS.store(0, Ordering::SeqCst);
    DISPATCHING.store(false, Ordering::SeqCst);
    RUNTIME_TID.store(0, Ordering::SeqCst);
}
