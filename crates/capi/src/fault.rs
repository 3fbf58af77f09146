//! C ABI over the fault engine: lazily filled regions with a C fill callback, and written-page
//! tracking.

use crate::error::{fail, guard, handles};
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use tiermem_fault::{
    Engine, Error as FaultError, Fault, FaultOps, PageRange, RegionHandle, RegionSpec,
    ResolveError, Resolver, TrackerOptions, TrackingMethod, WriteTracker, PAGE_SIZE,
};

/// Resolve faults in the faulting thread (SIGBUS handler): fastest; the kernel's own accesses to
/// unfilled pages (read(2) into them) fail with EFAULT; not inherited by fork.
pub const TIERMEM_RESOLVE_IN_THREAD: c_int = 0;
/// Resolve faults on the engine's handler thread: kernel accesses work; slower wake-up.
pub const TIERMEM_RESOLVE_HANDLER_THREAD: c_int = 1;

/// Tracker flag: use mprotect + SIGSEGV even where userfaultfd WP_ASYNC is available.
pub const TIERMEM_TRACK_FORCE_MPROTECT: u32 = 1;
/// Tracking method reported by tiermem_tracker_method: userfaultfd WP_ASYNC + PAGEMAP_SCAN.
pub const TIERMEM_TRACK_UFFD_WP_ASYNC: c_int = 0;
/// Tracking method reported by tiermem_tracker_method: mprotect + SIGSEGV.
pub const TIERMEM_TRACK_MPROTECT: c_int = 1;

/// Fill callback: write the 4096 bytes of the page at region offset `offset` into `page` and
/// return 0, or return a negative errno to fail the access (the process then gets SIGBUS).
/// For TIERMEM_RESOLVE_IN_THREAD regions it runs inside a signal handler on the faulting thread:
/// async-signal-safe code only (no malloc, no locks, no stdio).
pub type TiermemFillFn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, offset: u64, page: *mut c_void) -> c_int>;

/// A registered region (opaque).
pub struct TiermemRegion {
    handle: Option<RegionHandle>,
}

/// A written-page tracker (opaque).
pub struct TiermemTracker {
    tracker: WriteTracker,
    /// Ranges found by the last scan and not yet handed to the caller.
    pending: Vec<PageRange>,
    cursor: usize,
}

/// A run of written pages, as byte offsets from the tracked base.
#[repr(C)]
pub struct TiermemPageRange {
    pub offset: u64,
    pub len: u64,
}

/// The errno a C caller sees for a fault-engine error.
pub(crate) fn fault_errno(e: &FaultError) -> i32 {
    match e {
        FaultError::UffdUnavailable { .. } => libc::ENOSYS,
        FaultError::MissingFeature { .. } | FaultError::Unsupported(_) => libc::EOPNOTSUPP,
        FaultError::InvalidArgument(_) => libc::EINVAL,
        FaultError::Overlap { .. } => libc::EBUSY,
        FaultError::TooManyRegions(_) => libc::ENOSPC,
        FaultError::Syscall { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        FaultError::TrackingUnavailable { .. } => libc::ENOSYS,
        _ => libc::EIO,
    }
}

fn fault_fail(e: FaultError) -> i32 {
    fail(fault_errno(&e), e)
}

/// Calls the C fill function into a stack page, then UFFDIO_COPYs it in.
struct CFill {
    fill: unsafe extern "C" fn(*mut c_void, u64, *mut c_void) -> c_int,
    ctx: usize,
}

impl Resolver for CFill {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        // A stack buffer: async-signal-safe (no allocation), one page of the handler's stack.
        let mut page = [0u8; PAGE_SIZE];
        // SAFETY: the callback's contract (registration docs): it writes at most PAGE_SIZE bytes
        // into `page` and is safe to call from this context; ctx is the caller's pointer.
        let rc = unsafe {
            (self.fill)(
                self.ctx as *mut c_void,
                f.offset as u64,
                page.as_mut_ptr().cast(),
            )
        };
        if rc < 0 {
            return Err(ResolveError::Resolver(
                "the C fill callback returned an error",
            ));
        }
        ops.copy(f.offset, &page, false).map(|_| ())
    }
}

/// Register `[base, base+len)` (page aligned, an existing anonymous or shmem mapping) for MISSING
/// faults: the first access to each page calls `fill(ctx, offset, page)` and maps the result.
/// `resolution` is TIERMEM_RESOLVE_IN_THREAD or TIERMEM_RESOLVE_HANDLER_THREAD (then `spin_us`
/// is how long the handler keeps polling after a fault before it sleeps). `ctx` must stay valid
/// until tiermem_region_unregister.
#[no_mangle]
pub extern "C" fn tiermem_region_register(
    base: *mut c_void,
    len: usize,
    resolution: c_int,
    spin_us: u32,
    fill: TiermemFillFn,
    ctx: *mut c_void,
    out: *mut *mut TiermemRegion,
) -> c_int {
    guard("tiermem_region_register", || {
        let Some(fill) = fill else {
            return fail(libc::EINVAL, "fill callback is NULL");
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let spec = RegionSpec::new(base.cast(), len);
        let spec = match resolution {
            TIERMEM_RESOLVE_IN_THREAD => spec.in_thread(),
            TIERMEM_RESOLVE_HANDLER_THREAD => spec.handler_thread(spin_us),
            r => return fail(libc::EINVAL, format!("unknown resolution mode {r}")),
        };
        let resolver = Arc::new(CFill {
            fill,
            ctx: ctx as usize,
        });
        match Engine::global().register(spec, resolver) {
            Ok(handle) => {
                // SAFETY: out was checked non-NULL (ABI contract: writable).
                unsafe {
                    *out = handles::issue(TiermemRegion {
                        handle: Some(handle),
                    })
                };
                0
            }
            Err(e) => fault_fail(e),
        }
    })
}

/// Number of faults resolved so far in a region (0 for NULL).
#[no_mangle]
pub extern "C" fn tiermem_region_faults(region: *const TiermemRegion) -> u64 {
    guard("tiermem_region_faults", || {
        handles::get(region, "region").map_or(0, |r| r.handle.as_ref().map_or(0, |h| h.faults()))
    })
}

/// Unregister a region and free the handle; pages already filled stay mapped. NULL is ignored.
#[no_mangle]
pub extern "C" fn tiermem_region_unregister(region: *mut TiermemRegion) -> c_int {
    if region.is_null() {
        return 0;
    }
    guard("tiermem_region_unregister", || {
        let mut r = match handles::take(region, "region") {
            Ok(r) => r,
            Err(e) => return e,
        };
        match r.handle.take().map(|h| h.unregister()) {
            Some(Err(e)) => fault_fail(e),
            _ => 0,
        }
    })
}

/// Start tracking writes to `[base, base+len)` (page aligned, mapped): all pages are
/// write-protected now; tiermem_tracker_scan reports the ones written since.
#[no_mangle]
pub extern "C" fn tiermem_tracker_create(
    base: *mut c_void,
    len: usize,
    flags: u32,
    out: *mut *mut TiermemTracker,
) -> c_int {
    guard("tiermem_tracker_create", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let opts = TrackerOptions {
            force_mprotect: flags & TIERMEM_TRACK_FORCE_MPROTECT != 0,
            ..Default::default()
        };
        match WriteTracker::new(base.cast(), len, opts) {
            Ok(tracker) => {
                let t = TiermemTracker {
                    tracker,
                    pending: Vec::new(),
                    cursor: 0,
                };
                // SAFETY: out was checked non-NULL (ABI contract: writable).
                unsafe { *out = handles::issue(t) };
                0
            }
            Err(e) => fault_fail(e),
        }
    })
}

/// Store up to `cap` runs of pages written since the previous scan into `ranges` and return how
/// many were stored (≥ 0), or a negative errno. The pages are write-protected again by the scan.
/// When a scan finds more than `cap` runs, the rest are kept and returned by the next calls
/// before a new scan is made, so nothing is lost: a return value equal to `cap` means "call again".
#[no_mangle]
pub extern "C" fn tiermem_tracker_scan(
    tracker: *mut TiermemTracker,
    ranges: *mut TiermemPageRange,
    cap: usize,
) -> i64 {
    i64::from(guard("tiermem_tracker_scan", || {
        if ranges.is_null() && cap > 0 {
            return fail(libc::EINVAL, "ranges is NULL");
        }
        // Used by one thread at a time (documented contract).
        let t = match handles::get_mut(tracker, "tracker") {
            Ok(t) => t,
            Err(e) => return e,
        };
        if t.cursor >= t.pending.len() {
            t.pending.clear();
            t.cursor = 0;
            if let Err(e) = t.tracker.scan(&mut t.pending) {
                return fault_fail(e);
            }
        }
        let n = (t.pending.len() - t.cursor).min(cap).min(i32::MAX as usize);
        for i in 0..n {
            let r = t.pending[t.cursor + i];
            // SAFETY: i < cap and the caller provides cap writable entries.
            unsafe {
                *ranges.add(i) = TiermemPageRange {
                    offset: r.offset as u64,
                    len: r.len as u64,
                }
            };
        }
        t.cursor += n;
        n as i32
    }))
}

/// How a tracker observes writes: TIERMEM_TRACK_UFFD_WP_ASYNC or TIERMEM_TRACK_MPROTECT
/// (-EINVAL for NULL, -EBADF for a closed handle).
#[no_mangle]
pub extern "C" fn tiermem_tracker_method(tracker: *const TiermemTracker) -> c_int {
    guard("tiermem_tracker_method", || {
        match handles::get(tracker, "tracker").map(|t| t.tracker.method()) {
            Ok(TrackingMethod::UffdWpAsync) => TIERMEM_TRACK_UFFD_WP_ASYNC,
            Ok(TrackingMethod::Mprotect) => TIERMEM_TRACK_MPROTECT,
            Err(e) => e,
        }
    })
}

/// Stop tracking (pages are made writable again) and free the handle. NULL is ignored.
#[no_mangle]
pub extern "C" fn tiermem_tracker_destroy(tracker: *mut TiermemTracker) {
    guard("tiermem_tracker_destroy", || {
        if !tracker.is_null() {
            let _ = handles::take(tracker, "tracker").map(drop);
        }
    })
}
