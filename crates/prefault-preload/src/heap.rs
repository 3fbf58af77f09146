//! Following `[heap]`: glibc's main arena grows with (internal, unhookable) `sbrk` calls, so
//! the malloc hooks compare glibc's break (`__curbrk`, one load) with the last one seen and,
//! when it grew, register the growth `[last registered end, break)` (ascending: the arena's top
//! chunk is carved from its low end). `mallopt(M_TOP_PAD)` makes each growth run well ahead of
//! malloc's need (so there is room to populate ahead) and `mallopt(M_TRIM_THRESHOLD)` large
//! keeps glibc from giving the top back (so a trim cannot race a populate). The last
//! [`SEGMENTS`] growths stay registered; older ones (behind the application) are ended.
//! `malloc_trim`, a shrinking `sbrk`/`brk` or the program's own trim threshold end them all,
//! and what was purged is not registered again: following resumes from the break after it.

use crate::config::Config;
use crate::state::{self, Kind};
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst,
};
use tiermem_prefault::RawRegistration;

/// Growths kept registered.
pub const SEGMENTS: usize = 8;
/// A growth smaller than this waits to be registered with the next one.
const MIN_GROWTH: usize = 64 << 10;
const NONE: u64 = u64::MAX;

/// Compared with [`SEEN`] on the malloc fast path: while not following, a dummy that always
/// equals it.
static DUMMY: AtomicUsize = AtomicUsize::new(0);
static CURBRK: AtomicPtr<AtomicUsize> = AtomicPtr::new(&DUMMY as *const _ as *mut _);
/// The break as last seen.
static SEEN: AtomicUsize = AtomicUsize::new(0);
/// One past the last registered page (page aligned).
static END: AtomicUsize = AtomicUsize::new(0);
/// Someone is updating (a try-flag: a hook never waits for it).
static BUSY: AtomicBool = AtomicBool::new(false);
static RING: [AtomicU64; SEGMENTS] = [const { AtomicU64::new(NONE) }; SEGMENTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Whether following is on (the program did not take over trimming).
static ON: AtomicBool = AtomicBool::new(false);

/// glibc's `M_TRIM_THRESHOLD`, `M_TOP_PAD` (mallopt parameters).
pub const M_TRIM_THRESHOLD: i32 = -1;
/// See [`M_TRIM_THRESHOLD`].
pub const M_TOP_PAD: i32 = -2;

/// True while the break has not moved since it was last seen (the malloc fast path).
#[inline(always)]
pub fn quiet() -> bool {
    // SAFETY: CURBRK points to DUMMY or to glibc's `__curbrk`, a pointer-sized, aligned
    // variable that lives as long as the process; it is read as an atomic word (glibc writes
    // it with plain stores under its arena lock: we may read a stale value, never a torn one).
    unsafe { (*CURBRK.load(Relaxed)).load(Relaxed) == SEEN.load(Relaxed) }
}

/// The top pad: room to populate ahead (the window's reach in 4 KiB mode, twice), at least
/// 2 MiB, at most 32 MiB and the budget.
pub fn top_pad(cfg: &Config) -> usize {
    let window = cfg.policy.entries as usize * cfg.policy.chunk as usize * 4096 * 2;
    window.min(cfg.opts.budget_bytes).clamp(2 << 20, 32 << 20)
}

/// Starts following (glibc only, `TIERMEM_PREFAULT_HEAP` not 0): tunes glibc and records the
/// break as it is now (what is below it is the application's already).
pub fn start(cfg: &Config) {
    if !cfg.heap {
        return;
    }
    let mallopt = crate::real::mallopt();
    // SAFETY: mallopt with documented parameters; int values.
    unsafe {
        mallopt(M_TOP_PAD, top_pad(cfg) as i32);
        mallopt(M_TRIM_THRESHOLD, i32::MAX);
    }
    crate::malloc::emulate_dynamic_threshold();
    let sym = c"__curbrk";
    // SAFETY: dlsym of glibc's exported break variable (a `void *`).
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, sym.as_ptr()) } as *mut AtomicUsize;
    if p.is_null() {
        return;
    }
    // SAFETY: sbrk(0) only reads the break (and initialises __curbrk if it was not).
    let brk = unsafe { (crate::real::sbrk())(0) } as usize;
    if brk == 0 || brk == usize::MAX {
        return;
    }
    for r in &RING {
        r.store(NONE, SeqCst);
    }
    END.store(brk.next_multiple_of(4096), SeqCst);
    SEEN.store(brk, SeqCst);
    BUSY.store(false, SeqCst);
    ON.store(true, SeqCst);
    CURBRK.store(p, SeqCst);
}

/// In a forked child (async-signal-safe): stop following; the ring's registrations belong to
/// the parent's table.
pub fn forget() {
    CURBRK.store(&DUMMY as *const _ as *mut _, SeqCst);
    SEEN.store(0, SeqCst);
    ON.store(false, SeqCst);
    BUSY.store(false, SeqCst);
    for r in &RING {
        r.store(NONE, SeqCst);
    }
}

/// The break moved: register the growth (or, if it shrank behind our back, end what is gone).
#[cold]
pub fn refresh() {
    let Some(svc) = state::service() else { return };
    if !ON.load(SeqCst) || BUSY.swap(true, SeqCst) {
        return;
    }
    // SAFETY: as in `quiet`.
    let brk = unsafe { (*CURBRK.load(Relaxed)).load(Relaxed) };
    let end = END.load(SeqCst);
    let top = brk & !4095;
    if top >= end + MIN_GROWTH {
        if let Some(cfg) = state::config() {
            if let Some(r) = state::register(svc, end, top - end, cfg.sequential(), Kind::Heap) {
                let i = NEXT.fetch_add(1, SeqCst) % SEGMENTS;
                let old = RING[i].swap(r.to_u64(), SeqCst);
                if let Some(old) = (old != NONE)
                    .then(|| RawRegistration::from_u64(old))
                    .flatten()
                {
                    svc.unregister_raw(old);
                }
            }
        }
        END.store(top, SeqCst);
    } else if brk < end {
        let from = brk.next_multiple_of(4096);
        state::drop_range(svc, from, end.saturating_sub(from));
        END.store(from, SeqCst);
    }
    SEEN.store(brk, SeqCst);
    BUSY.store(false, SeqCst);
}

/// Ends every heap registration (before a trim or a shrinking `sbrk`/`brk`) and holds off
/// following until [`resume`], which must follow (it resumes from the break after the call).
/// Waits for a concurrent [`refresh`] to finish (it never blocks).
pub fn drop_all() {
    while BUSY.swap(true, SeqCst) {
        std::thread::yield_now();
    }
    let Some(svc) = state::service() else { return };
    for r in &RING {
        let w = r.swap(NONE, SeqCst);
        if let Some(raw) = (w != NONE).then(|| RawRegistration::from_u64(w)).flatten() {
            svc.unregister_raw(raw);
            state::COUNTERS.purged.fetch_add(1, Relaxed);
        }
    }
}

/// After a trim: what is below the break now is the application's (or was purged); register
/// only growth past it. Ends what [`drop_all`] began.
pub fn resume() {
    // SAFETY: as in `quiet`.
    let brk = unsafe { (*CURBRK.load(Relaxed)).load(Relaxed) };
    if ON.load(SeqCst) {
        END.store(brk.next_multiple_of(4096), SeqCst);
        SEEN.store(brk, SeqCst);
    }
    BUSY.store(false, SeqCst);
}

/// The program set its own trim threshold: glibc may give the top back whenever it likes, so
/// stop following.
pub fn stop() {
    drop_all();
    ON.store(false, SeqCst);
    CURBRK.store(&DUMMY as *const _ as *mut _, SeqCst);
    SEEN.store(0, SeqCst);
    BUSY.store(false, SeqCst);
}
