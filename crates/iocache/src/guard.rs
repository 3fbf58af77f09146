//! The SIGBUS guard of z-READ's view mappings: a page of a file mapping that vanished (the file
//! was truncated under it without the lease being able to privatise it first) is replaced by a
//! zero page instead of killing the process, and the page is marked so that the view reading it
//! reports [`crate::Error::Truncated`].
//!
//! It also holds writers off a buffer while it is being made private ([`hold_writes`]): the
//! buffer is read-only for those microseconds, and a thread that writes to it waits in the
//! `SIGSEGV` handler until the private copy is in place, then its write lands there. Without
//! that, a write between the copy and the `mremap` would be lost. A writer whose fault the
//! kernel raised during a hold may reach the handler only after the hold ended: the handler
//! finds the range among the recently ended holds and retries the write once (a second fault
//! at the same address with no hold is a real one and goes to the previous disposition).
//!
//! Ranges live in a fixed table of atomics so that the handler, in signal context, can look them
//! up without locks or allocation; a `SIGBUS` outside every range goes to the previously
//! installed disposition (`tiermem_fault::sig::Chain`, the one chaining mechanism of the
//! project).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tiermem_fault::sig::Chain;

/// Guarded ranges at once (one per live view mapping generation, so per file read with
/// zero copy). The handler scans them only on a `SIGBUS`.
pub const SLOTS: usize = 4096;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    /// One bit per page of the range, set when the guard zero-filled the page.
    zeroed: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    zeroed: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static CHAIN: Chain = Chain::new();
static SEGV_CHAIN: Chain = Chain::new();
/// Ranges being made private: (start, len), start 0 = free.
static HOLD: [(AtomicUsize, AtomicUsize); 8] = [
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
];
/// Ranges whose hold ended most recently (ring of [`RECENT`] entries, written at `RECENT_AT`):
/// a fault raised during the hold may be handled after it.
const RECENT: usize = 16;
static ENDED: [(AtomicUsize, AtomicUsize); RECENT] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; RECENT];
static RECENT_AT: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    /// The address this thread last retried after its hold had ended, and how many holds had
    /// ended then (0: none). Const-initialised and without a destructor, so the signal handler
    /// can use it.
    static RETRIED: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}
/// Pages zero-filled by the guard since the process started.
static HITS: AtomicU64 = AtomicU64::new(0);

/// A registered range; dropping it unregisters the range.
pub struct Guard {
    slot: usize,
}

/// Pages the guard zero-filled in this process so far.
pub fn hits() -> u64 {
    HITS.load(Ordering::Relaxed)
}

/// Guards `start..start+len` (page-aligned): a `SIGBUS` there maps a zero page and sets the
/// page's bit in `zeroed` (which must hold one bit per page and outlive the returned guard).
/// Returns `None` when every slot is taken or the handler could not be installed: the range is
/// then unguarded, and the caller should not hand out zero-copy views of it.
pub fn register(start: *const u8, len: usize, zeroed: &[AtomicU64]) -> Option<Guard> {
    if CHAIN
        .install(libc::SIGBUS, on_sigbus, libc::SA_NODEFER)
        .is_err()
    {
        return None;
    }
    for (i, s) in TABLE.iter().enumerate() {
        if s.start.load(Ordering::Relaxed) != 0 {
            continue;
        }
        // Claim the slot with a placeholder so the handler never sees a half-written entry.
        if s.start
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        s.len.store(len, Ordering::Relaxed);
        s.zeroed.store(zeroed.as_ptr() as usize, Ordering::Relaxed);
        s.start.store(start as usize, Ordering::Release);
        return Some(Guard { slot: i });
    }
    None
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        s.start.store(1, Ordering::Release);
        s.len.store(0, Ordering::Relaxed);
        s.zeroed.store(0, Ordering::Relaxed);
        s.start.store(0, Ordering::Release);
    }
}

/// Writers to `start..start+len` wait (in the `SIGSEGV` handler) while the returned value
/// lives; the caller makes the range read-only, replaces it, and drops the hold. `None` when
/// the handler cannot be installed or every hold slot is busy.
pub fn hold_writes(start: usize, len: usize) -> Option<Hold> {
    SEGV_CHAIN
        .install(libc::SIGSEGV, on_sigsegv, libc::SA_NODEFER)
        .ok()?;
    for (i, (s, l)) in HOLD.iter().enumerate() {
        if s.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            l.store(len, Ordering::Relaxed);
            s.store(start, Ordering::Release);
            return Some(Hold { slot: i });
        }
    }
    None
}

/// A range whose writers wait; dropping it lets them go on.
pub struct Hold {
    slot: usize,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let (s, l) = &HOLD[self.slot];
        let (start, len) = (s.load(Ordering::Relaxed), l.load(Ordering::Relaxed));
        let (es, el) = &ENDED[RECENT_AT.fetch_add(1, Ordering::AcqRel) % RECENT];
        es.store(0, Ordering::Release);
        el.store(len, Ordering::Relaxed);
        es.store(start, Ordering::Release);
        l.store(0, Ordering::Relaxed);
        s.store(0, Ordering::Release);
    }
}

extern "C" fn on_sigsegv(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for (s, l) in HOLD.iter() {
        let start = s.load(Ordering::Acquire);
        if start > 1 && addr >= start && addr < start + l.load(Ordering::Relaxed) {
            // Wait until the private copy replaces the range, then retry the write there.
            while s.load(Ordering::Acquire) == start {
                // SAFETY: sched_yield is async-signal-safe.
                unsafe { libc::sched_yield() };
            }
            return;
        }
    }
    // The fault may have been raised during a hold that ended before this handler ran: retry
    // the write once (the range is writable again). A second fault there is a real one.
    let recent = ENDED.iter().any(|(s, l)| {
        let start = s.load(Ordering::Acquire);
        start > 1 && addr >= start && addr < start + l.load(Ordering::Relaxed)
    });
    // A retry is allowed again at the same address once another hold has ended since.
    let now = (addr, RECENT_AT.load(Ordering::Acquire));
    if recent && RETRIED.with(|r| r.replace(now)) != now {
        return;
    }
    RETRIED.with(|r| r.set((0, 0)));
    SEGV_CHAIN.forward(sig, info, uctx);
}

extern "C" fn on_sigbus(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in TABLE.iter() {
        let start = s.start.load(Ordering::Acquire);
        if start <= 1 {
            continue;
        }
        let len = s.len.load(Ordering::Relaxed);
        if addr < start || addr >= start + len {
            continue;
        }
        let page = addr & !(crate::zread::PAGE - 1);
        // SAFETY: the page lies inside a registered view mapping, which this module's owner
        // (a view generation) keeps mapped while registered; replacing its vanished page with
        // an anonymous zero page is the guard's purpose. mmap is a plain system call.
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                crate::zread::PAGE,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            break;
        }
        let bits = s.zeroed.load(Ordering::Relaxed) as *const AtomicU64;
        if !bits.is_null() {
            let idx = (page - start) / crate::zread::PAGE;
            // SAFETY: the bitmap holds one bit per page of the range (register's contract) and
            // outlives the registration.
            unsafe { (*bits.add(idx / 64)).fetch_or(1 << (idx % 64), Ordering::Relaxed) };
        }
        HITS.fetch_add(1, Ordering::Relaxed);
        return;
    }
    CHAIN.forward(sig, info, uctx);
}
