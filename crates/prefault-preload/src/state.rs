//! The library's global state, all atomics: whether it serves (and why not), the one
//! [`Service`] (leaked, never dropped: a forked child must not join a thread it does not
//! have), the configuration, the bounds of everything ever registered (a filter that spares
//! most unmapping calls the scan of the registration table), the counters of the exit report,
//! and the two ways to talk to the service from a hook: [`register`] and [`drop_range`].
//! Neither takes a lock or allocates.

use crate::config::{Config, MAX_REGION};
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering::Acquire,
    Ordering::Relaxed, Ordering::Release, Ordering::SeqCst,
};
use std::sync::OnceLock;
use tiermem_prefault::{Error, Policy, RawRegistration, Service};

/// Before the constructor has run.
pub const UNINIT: u8 = 0;
/// The constructor (or a restarting child) is starting the service: hooks pass through.
pub const STARTING: u8 = 1;
/// The service runs: hooks register and unregister.
pub const READY: u8 = 2;
/// Pass-through for good (disabled, malformed variable, no service, a plain forked child).
pub const OFF: u8 = 3;
/// A forked child with `TIERMEM_PREFAULT_CHILD=restart` whose service is not started yet (the
/// next malloc-family call starts it).
pub const CHILD_PENDING: u8 = 4;

/// One of the states above.
pub static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static SVC: AtomicPtr<Service> = AtomicPtr::new(std::ptr::null_mut());
/// The configuration (set once by the constructor; a forked child keeps it).
pub static CONFIG: OnceLock<Config> = OnceLock::new();
/// The smallest registration, bytes.
pub static MIN: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The malloc hooks' fast-path bound: requests below it go straight to the real function.
/// `usize::MAX` while nothing is registered from the malloc family, 0 in a child whose
/// service is pending (every call takes the slow path once, which starts it).
pub static MIN_FAST: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The real allocator is glibc's (its chunk headers can be read; `[heap]` is its main arena).
pub static IS_GLIBC: AtomicBool = AtomicBool::new(false);
/// `free`/`realloc` look at glibc's chunk header for an mmapped chunk (a registered block).
pub static FREE_CHECK: AtomicBool = AtomicBool::new(false);
/// The process whose service writes the stats file (the one the constructor ran in).
pub static ORIGIN_PID: AtomicI32 = AtomicI32::new(0);

/// Lowest address ever registered (since the service started).
static LO: AtomicUsize = AtomicUsize::new(usize::MAX);
/// One past the highest address ever registered.
static HI: AtomicUsize = AtomicUsize::new(0);

/// Counters of the exit report.
pub struct Counters {
    /// Mappings registered by the mmap/mremap hooks.
    pub mmap_regions: AtomicU64,
    /// Blocks registered by the malloc family.
    pub malloc_blocks: AtomicU64,
    /// `[heap]` growths registered.
    pub heap_growths: AtomicU64,
    /// Bytes registered, all kinds.
    pub registered_bytes: AtomicU64,
    /// Registrations refused (table full, overlap).
    pub register_failures: AtomicU64,
    /// Registrations ended by a hook (munmap, mremap, madvise, mprotect, MAP_FIXED, free...).
    pub dropped: AtomicU64,
    /// Of those, by a purge (MADV_DONTNEED, _FREE, _REMOVE, _DONTNEED_LOCKED, guard).
    pub purged: AtomicU64,
}

/// The counters.
pub static COUNTERS: Counters = Counters {
    mmap_regions: AtomicU64::new(0),
    malloc_blocks: AtomicU64::new(0),
    heap_growths: AtomicU64::new(0),
    registered_bytes: AtomicU64::new(0),
    register_failures: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    purged: AtomicU64::new(0),
};

/// What is being registered (for the counters).
#[derive(Clone, Copy)]
pub enum Kind {
    /// A mapping (mmap, mremap).
    Mapping,
    /// A malloc-family block.
    Block,
    /// Growth of `[heap]`.
    Heap,
}

/// The service, when the library serves.
#[inline(always)]
pub fn service() -> Option<&'static Service> {
    if STATE.load(Acquire) != READY {
        return None;
    }
    let p = SVC.load(Acquire);
    // SAFETY: SVC points to a leaked Box<Service> (never freed) whenever STATE is READY.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The service even when not serving (exit report, introspection): the last one started.
pub fn any_service() -> Option<&'static Service> {
    let p = SVC.load(Acquire);
    // SAFETY: as in `service`: a leaked, never-freed Box<Service>.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The configuration (a dummy only reachable before the constructor, never used then).
pub fn config() -> Option<&'static Config> {
    CONFIG.get()
}

/// Ends every registration overlapping `[addr, addr+len)` and waits for a populate in flight
/// there; returns how many ended. Call it *before* the real call that unmaps, moves, purges or
/// write-protects the range. No lock, no allocation.
#[inline]
pub fn drop_range(svc: &Service, addr: usize, len: usize) -> usize {
    let end = addr.saturating_add(len);
    if addr >= HI.load(SeqCst) || end <= LO.load(SeqCst) || len == 0 {
        return 0;
    }
    let n = svc.unregister_range(addr as *mut u8, end - addr);
    if n > 0 {
        COUNTERS.dropped.fetch_add(n as u64, Relaxed);
    }
    n
}

/// Registers `[addr, addr+len)` (page aligned, private anonymous read-write memory the caller
/// just obtained) with `policy`. Registrations left over a range a call this library could not
/// see made (a raw system call) are ended first: the range is this caller's now. Failures are
/// counted, never reported (a hook cannot).
pub fn register(
    svc: &Service,
    addr: usize,
    len: usize,
    policy: Policy,
    kind: Kind,
) -> Option<RawRegistration> {
    if len == 0 || len > MAX_REGION {
        return None;
    }
    drop_range(svc, addr, len);
    // Widen the filter before publishing, so a drop that follows the registration sees it.
    LO.fetch_min(addr, SeqCst);
    HI.fetch_max(addr + len, SeqCst);
    match svc.register_trusted(addr as *mut u8, len, policy) {
        Ok(r) => {
            let c = match kind {
                Kind::Mapping => &COUNTERS.mmap_regions,
                Kind::Block => &COUNTERS.malloc_blocks,
                Kind::Heap => &COUNTERS.heap_growths,
            };
            c.fetch_add(1, Relaxed);
            COUNTERS.registered_bytes.fetch_add(len as u64, Relaxed);
            Some(r)
        }
        Err(Error::Full(_)) | Err(_) => {
            COUNTERS.register_failures.fetch_add(1, Relaxed);
            None
        }
    }
}

/// Publishes a started service and serves.
pub fn serve(svc: Service, cfg: &Config) {
    LO.store(usize::MAX, SeqCst);
    HI.store(0, SeqCst);
    SVC.store(Box::into_raw(Box::new(svc)), Release);
    MIN.store(cfg.min, Relaxed);
    let glibc = IS_GLIBC.load(Relaxed);
    FREE_CHECK.store(glibc, Relaxed);
    STATE.store(READY, Release);
    if glibc {
        crate::heap::start(cfg);
    }
    MIN_FAST.store(if glibc { cfg.min } else { usize::MAX }, Release);
}

/// Stops serving (pass-through from now on).
pub fn off() {
    STATE.store(OFF, Release);
    MIN_FAST.store(usize::MAX, Release);
    FREE_CHECK.store(false, Relaxed);
    crate::heap::forget();
}

/// Called from the malloc family's slow path in a child whose service is pending: starts a
/// fresh service (the parent's thread does not exist here). Only allocator entry points call
/// it, where no allocator lock is held (starting a thread allocates).
#[cold]
pub fn start_pending_child() {
    if STATE
        .compare_exchange(CHILD_PENDING, STARTING, SeqCst, SeqCst)
        .is_err()
    {
        return;
    }
    let Some(cfg) = config() else {
        off();
        return;
    };
    match Service::start(cfg.opts.clone()) {
        Ok(svc) => serve(svc, cfg),
        Err(_) => off(),
    }
}

/// The `pthread_atfork` child handler: async-signal-safe (atomics only). The parent's
/// service thread does not exist in the child: its table is told so (nothing waits for a
/// populate that will not finish), and the child runs plain or, with
/// `TIERMEM_PREFAULT_CHILD=restart`, starts its own service at its next malloc-family call.
pub extern "C" fn after_fork_child() {
    let state = STATE.load(SeqCst);
    if state != READY && state != STARTING {
        return;
    }
    STATE.store(STARTING, SeqCst);
    MIN_FAST.store(usize::MAX, SeqCst);
    FREE_CHECK.store(false, SeqCst);
    crate::heap::forget();
    if let Some(svc) = any_service() {
        svc.after_fork_child();
    }
    if config().is_some_and(|c| c.child_restart) {
        STATE.store(CHILD_PENDING, SeqCst);
        MIN_FAST.store(0, SeqCst);
    } else {
        STATE.store(OFF, SeqCst);
    }
}

/// `[addr, addr+len)` rounded out to pages.
#[inline]
pub fn page_span(addr: *mut c_void, len: usize) -> (usize, usize) {
    let a = addr as usize;
    let lo = a & !4095;
    let hi = a.saturating_add(len).saturating_add(4095) & !4095;
    (lo, hi - lo)
}
