//! C ABI of the prefault service (`tiermem-prefault`, issue #18): start a service, register
//! private anonymous ranges (checked against `/proc/self/maps`), hint, read figures, end
//! registrations (also by range, before munmap), stop.
//!
//! Errno mapping: malformed arguments -EINVAL; a range that is not private anonymous
//! read-write memory -EFAULT; an overlap with a live registration -EEXIST; the table full
//! -ENOSPC; a failed system call -EIO. Registrations are 64-bit tokens (no handle to free).

#![allow(clippy::manual_is_multiple_of)] // the workspace targets Rust 1.80

use crate::error::{fail, guard, handles};
use std::ffi::{c_int, c_void};
use std::time::Duration;
use tiermem_prefault::{Error, Options, Order, Policy, Populate, RawRegistration, Service, Thp};

/// A running prefault service (opaque).
pub struct TiermemPrefault {
    svc: Service,
}

/// Order: learned from the footprint.
pub const TIERMEM_PREFAULT_AUTO: c_int = 0;
/// Order: low addresses first.
pub const TIERMEM_PREFAULT_ASCENDING: c_int = 1;
/// Order: high addresses first.
pub const TIERMEM_PREFAULT_DESCENDING: c_int = 2;
/// Order: every n-th page (n learned).
pub const TIERMEM_PREFAULT_STRIDE: c_int = 3;
/// Order: none; the whole region as far as the budget allows.
pub const TIERMEM_PREFAULT_WHOLE: c_int = 4;
/// Populate: private zeroed pages (MADV_POPULATE_WRITE).
pub const TIERMEM_PREFAULT_WRITE: c_int = 0;
/// Populate: the zero page (MADV_POPULATE_READ), for data only read.
pub const TIERMEM_PREFAULT_READ: c_int = 1;
/// Populate: learned per region (the zero page while the application reads first).
pub const TIERMEM_PREFAULT_POPULATE_AUTO: c_int = 2;
/// THP: as the kernel decides for the region.
pub const TIERMEM_PREFAULT_THP_AUTO: c_int = 0;
/// THP: whole 2 MiB units.
pub const TIERMEM_PREFAULT_THP_ON: c_int = 1;
/// THP: 4 KiB chunks with tripwires.
pub const TIERMEM_PREFAULT_THP_OFF: c_int = 2;

/// Service options (`tiermem_prefault_options_default` fills the defaults).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TiermemPrefaultOptions {
    /// Bound on bytes populated ahead and not known to be used (default 64 MiB).
    pub budget_bytes: u64,
    /// Pass interval while idle, µs (default 2000).
    pub interval_us: u32,
    /// Shortest pass interval while entries get used, µs (default 100).
    pub min_interval_us: u32,
    /// Most bytes a 4 KiB-mode populate call covers (default 256 KiB).
    pub max_call_bytes: u64,
    /// Stop populating this close to the memory cgroup's limit (default 32 MiB).
    pub memcg_headroom_bytes: u64,
    /// Non-zero: the service thread runs SCHED_IDLE (default 1).
    pub sched_idle: c_int,
    /// Non-zero: passes speed up while entries get used (default 1).
    pub adaptive: c_int,
}

/// A region's policy (`tiermem_prefault_policy_default` fills the paper's defaults).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TiermemPrefaultPolicy {
    /// TIERMEM_PREFAULT_AUTO / _ASCENDING / _DESCENDING / _STRIDE / _WHOLE.
    pub order: c_int,
    /// TIERMEM_PREFAULT_POPULATE_AUTO (default) / TIERMEM_PREFAULT_WRITE / _READ.
    pub populate: c_int,
    /// Pages per window entry, 1..=64 (default 16).
    pub chunk: u32,
    /// Window entries, 1..=64 (default 64).
    pub entries: u32,
    /// TIERMEM_PREFAULT_THP_AUTO / _ON / _OFF.
    pub thp: c_int,
}

/// The service's figures (`tiermem_prefault_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TiermemPrefaultStats {
    pub regions: u64,
    pub passes: u64,
    pub populate_calls: u64,
    pub populated_bytes: u64,
    pub tripwire_hits: u64,
    pub footprint_pages: u64,
    pub unused_bytes: u64,
    pub peak_unused_bytes: u64,
    pub budget_bytes: u64,
    pub backoffs: u64,
    pub failures: u64,
    pub service_cpu_ns: u64,
    pub sched_idle: c_int,
}

/// One registration's figures (`tiermem_prefault_region_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TiermemPrefaultRegionStats {
    pub populated_bytes: u64,
    pub calls: u64,
    pub hits: u64,
    pub failures: u64,
    pub last_errno: c_int,
    /// The order followed now (TIERMEM_PREFAULT_AUTO while still learning).
    pub order: c_int,
    /// The stride learned, in pages (0 unless order is TIERMEM_PREFAULT_STRIDE).
    pub stride: u64,
}

fn prefault_fail(e: Error) -> c_int {
    let errno = match &e {
        Error::InvalidArgument(_) => libc::EINVAL,
        Error::BadRange(_) => libc::EFAULT,
        Error::Overlap(_) => libc::EEXIST,
        Error::Full(_) => libc::ENOSPC,
        Error::Os(_) => libc::EIO,
    };
    fail(errno, e)
}

fn to_options(o: &TiermemPrefaultOptions) -> Options {
    Options {
        budget_bytes: o.budget_bytes as usize,
        interval: Duration::from_micros(o.interval_us as u64),
        min_interval: Duration::from_micros(o.min_interval_us as u64),
        max_call_bytes: o.max_call_bytes as usize,
        memcg_headroom_bytes: o.memcg_headroom_bytes as usize,
        sched_idle: o.sched_idle != 0,
        adaptive: o.adaptive != 0,
    }
}

fn to_policy(p: &TiermemPrefaultPolicy) -> Result<Policy, c_int> {
    let order = match p.order {
        TIERMEM_PREFAULT_AUTO => Order::Auto,
        TIERMEM_PREFAULT_ASCENDING => Order::Ascending,
        TIERMEM_PREFAULT_DESCENDING => Order::Descending,
        TIERMEM_PREFAULT_STRIDE => Order::Stride,
        TIERMEM_PREFAULT_WHOLE => Order::Whole,
        o => return Err(fail(libc::EINVAL, format!("unknown order {o}"))),
    };
    let populate = match p.populate {
        TIERMEM_PREFAULT_WRITE => Populate::Write,
        TIERMEM_PREFAULT_READ => Populate::Read,
        TIERMEM_PREFAULT_POPULATE_AUTO => Populate::Auto,
        o => return Err(fail(libc::EINVAL, format!("unknown populate kind {o}"))),
    };
    let thp = match p.thp {
        TIERMEM_PREFAULT_THP_AUTO => Thp::Auto,
        TIERMEM_PREFAULT_THP_ON => Thp::On,
        TIERMEM_PREFAULT_THP_OFF => Thp::Off,
        o => return Err(fail(libc::EINVAL, format!("unknown thp setting {o}"))),
    };
    Ok(Policy {
        order,
        populate,
        chunk: p.chunk,
        entries: p.entries,
        thp,
    })
}

/// The policy a caller passed: NULL for the defaults.
fn policy_arg(policy: *const TiermemPrefaultPolicy) -> Result<Policy, c_int> {
    if policy.is_null() {
        return Ok(Policy::default());
    }
    // SAFETY: a non-NULL policy points to a readable struct (ABI contract).
    to_policy(unsafe { &*policy })
}

/// Fills `*out` with the default options. Returns 0, or -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn tiermem_prefault_options_default(out: *mut TiermemPrefaultOptions) -> c_int {
    guard("tiermem_prefault_options_default", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let d = Options::default();
        // SAFETY: out is non-NULL and points to writable storage (ABI contract).
        unsafe {
            *out = TiermemPrefaultOptions {
                budget_bytes: d.budget_bytes as u64,
                interval_us: d.interval.as_micros() as u32,
                min_interval_us: d.min_interval.as_micros() as u32,
                max_call_bytes: d.max_call_bytes as u64,
                memcg_headroom_bytes: d.memcg_headroom_bytes as u64,
                sched_idle: d.sched_idle as c_int,
                adaptive: d.adaptive as c_int,
            }
        };
        0
    })
}

/// Fills `*out` with the default policy (auto order, auto populate, 16-page chunks, 64
/// entries, THP auto). Returns 0, or -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn tiermem_prefault_policy_default(out: *mut TiermemPrefaultPolicy) -> c_int {
    guard("tiermem_prefault_policy_default", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let d = Policy::default();
        // SAFETY: out is non-NULL and points to writable storage (ABI contract).
        unsafe {
            *out = TiermemPrefaultPolicy {
                order: TIERMEM_PREFAULT_AUTO,
                populate: TIERMEM_PREFAULT_POPULATE_AUTO,
                chunk: d.chunk,
                entries: d.entries,
                thp: TIERMEM_PREFAULT_THP_AUTO,
            }
        };
        0
    })
}

/// Starts a service (`opts` NULL: defaults) and stores its handle in `*out`.
#[no_mangle]
pub extern "C" fn tiermem_prefault_start(
    opts: *const TiermemPrefaultOptions,
    out: *mut *mut TiermemPrefault,
) -> c_int {
    guard("tiermem_prefault_start", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let o = if opts.is_null() {
            Options::default()
        } else {
            // SAFETY: non-NULL options point to a readable struct (ABI contract).
            to_options(unsafe { &*opts })
        };
        match Service::start(o) {
            Ok(svc) => {
                // SAFETY: out was checked non-NULL.
                unsafe { *out = handles::issue(TiermemPrefault { svc }) };
                0
            }
            Err(e) => prefault_fail(e),
        }
    })
}

/// Stops the service and frees its handle; live registrations become inert (their ranges are
/// never populated again). Returns 0, -EINVAL/-EBADF for a bad handle.
#[no_mangle]
pub extern "C" fn tiermem_prefault_stop(p: *mut TiermemPrefault) -> c_int {
    guard("tiermem_prefault_stop", || {
        match handles::take(p, "prefault") {
            Ok(h) => {
                h.svc.stop();
                0
            }
            Err(e) => e,
        }
    })
}

/// Registers `[addr, addr+len)` (page aligned, private anonymous read-write memory, checked)
/// with `policy` (NULL: defaults); stores the registration token in `*out`.
#[no_mangle]
pub extern "C" fn tiermem_prefault_register(
    p: *const TiermemPrefault,
    addr: *mut c_void,
    len: usize,
    policy: *const TiermemPrefaultPolicy,
    out: *mut u64,
) -> c_int {
    guard("tiermem_prefault_register", || {
        let h = match handles::get(p, "prefault") {
            Ok(h) => h,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let pol = match policy_arg(policy) {
            Ok(p) => p,
            Err(e) => return e,
        };
        if let Err(e) = pol.validate() {
            return fail(libc::EINVAL, e);
        }
        let base = addr as usize;
        if base == 0 || base % 4096 != 0 || len == 0 || len % 4096 != 0 {
            return fail(
                libc::EINVAL,
                format!("{base:#x} + {len}: start and length must be non-zero multiples of 4096"),
            );
        }
        if let Err(e) = tiermem_prefault::os::check_mapping(base, len) {
            return prefault_fail(e);
        }
        match h.svc.register_trusted(addr as *mut u8, len, pol) {
            Ok(r) => {
                // SAFETY: out was checked non-NULL.
                unsafe { *out = r.to_u64() };
                0
            }
            Err(e) => prefault_fail(e),
        }
    })
}

/// Maps `len` bytes (a non-zero multiple of 4096) of private anonymous read-write memory and
/// registers them with `policy` (NULL: defaults; its thp ON/OFF also advises
/// MADV_HUGEPAGE/MADV_NOHUGEPAGE): no range check is needed, so this is the cheapest way to
/// fresh memory the service fills ahead. Stores the address in `*addr` and the registration
/// token in `*out`. Free with `tiermem_prefault_unmap`.
#[no_mangle]
pub extern "C" fn tiermem_prefault_map(
    p: *const TiermemPrefault,
    len: usize,
    policy: *const TiermemPrefaultPolicy,
    addr: *mut *mut c_void,
    out: *mut u64,
) -> c_int {
    guard("tiermem_prefault_map", || {
        let h = match handles::get(p, "prefault") {
            Ok(h) => h,
            Err(e) => return e,
        };
        if addr.is_null() || out.is_null() {
            return fail(libc::EINVAL, "addr or out is NULL");
        }
        let pol = match policy_arg(policy) {
            Ok(p) => p,
            Err(e) => return e,
        };
        match h.svc.map(len, pol) {
            Ok(m) => {
                let (ptr, _, raw) = m.into_raw();
                // SAFETY: both pointers were checked non-NULL.
                unsafe {
                    *addr = ptr.cast();
                    *out = raw.to_u64();
                }
                0
            }
            Err(e) => prefault_fail(e),
        }
    })
}

/// Ends the registrations in `[addr, addr+len)` (waiting for a populate in flight) and unmaps
/// it: the counterpart of `tiermem_prefault_map`. Returns 0 or a negative errno.
#[no_mangle]
pub extern "C" fn tiermem_prefault_unmap(
    p: *const TiermemPrefault,
    addr: *mut c_void,
    len: usize,
) -> c_int {
    guard("tiermem_prefault_unmap", || {
        let h = match handles::get(p, "prefault") {
            Ok(h) => h,
            Err(e) => return e,
        };
        let base = addr as usize;
        if base == 0 || base % 4096 != 0 || len == 0 || len % 4096 != 0 {
            return fail(
                libc::EINVAL,
                format!("{base:#x} + {len}: start and length must be non-zero multiples of 4096"),
            );
        }
        h.svc.unregister_range(addr as *mut u8, len);
        // SAFETY: the caller's mapping (ABI contract: from tiermem_prefault_map).
        if unsafe { libc::munmap(addr, len) } != 0 {
            return fail(
                libc::EINVAL,
                format!("munmap: {}", std::io::Error::last_os_error()),
            );
        }
        0
    })
}

fn token(reg: u64) -> Result<RawRegistration, c_int> {
    RawRegistration::from_u64(reg).ok_or_else(|| {
        fail(
            libc::EINVAL,
            format!("{reg:#x} is not a registration token"),
        )
    })
}

/// Ends a registration; returns after a populate in flight in it. An ended registration is a
/// no-op (0).
#[no_mangle]
pub extern "C" fn tiermem_prefault_unregister(p: *const TiermemPrefault, reg: u64) -> c_int {
    guard("tiermem_prefault_unregister", || {
        let h = match handles::get(p, "prefault") {
            Ok(h) => h,
            Err(e) => return e,
        };
        match token(reg) {
            Ok(r) => {
                h.svc.unregister_raw(r);
                0
            }
            Err(e) => e,
        }
    })
}

/// Ends every registration overlapping `[addr, addr+len)` (call before munmap, mremap,
/// MADV_DONTNEED or a MAP_FIXED mapping there). Returns how many, or a negative errno.
#[no_mangle]
pub extern "C" fn tiermem_prefault_unregister_range(
    p: *const TiermemPrefault,
    addr: *mut c_void,
    len: usize,
) -> c_int {
    guard("tiermem_prefault_unregister_range", || {
        match handles::get(p, "prefault") {
            Ok(h) => h.svc.unregister_range(addr as *mut u8, len) as c_int,
            Err(e) => e,
        }
    })
}

/// The application will next touch `[offset, offset+len)` of the registration.
#[no_mangle]
pub extern "C" fn tiermem_prefault_hint(
    p: *const TiermemPrefault,
    reg: u64,
    offset: usize,
    len: usize,
) -> c_int {
    guard("tiermem_prefault_hint", || {
        let h = match handles::get(p, "prefault") {
            Ok(h) => h,
            Err(e) => return e,
        };
        match token(reg) {
            Ok(r) => {
                h.svc.hint_raw(r, offset, len);
                0
            }
            Err(e) => e,
        }
    })
}

/// The service's figures into `*out`.
#[no_mangle]
pub extern "C" fn tiermem_prefault_stats(
    p: *const TiermemPrefault,
    out: *mut TiermemPrefaultStats,
) -> c_int {
    guard("tiermem_prefault_stats", || {
        let h = match handles::get(p, "prefault") {
            Ok(h) => h,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let s = h.svc.stats();
        // SAFETY: out was checked non-NULL.
        unsafe {
            *out = TiermemPrefaultStats {
                regions: s.regions as u64,
                passes: s.passes,
                populate_calls: s.populate_calls,
                populated_bytes: s.populated_bytes,
                tripwire_hits: s.tripwire_hits,
                footprint_pages: s.footprint_pages,
                unused_bytes: s.unused_bytes,
                peak_unused_bytes: s.peak_unused_bytes,
                budget_bytes: s.budget_bytes,
                backoffs: s.backoffs,
                failures: s.failures,
                service_cpu_ns: s.service_cpu.as_nanos() as u64,
                sched_idle: s.sched_idle as c_int,
            }
        };
        0
    })
}

/// One registration's figures into `*out`; -ENOENT when it ended.
#[no_mangle]
pub extern "C" fn tiermem_prefault_region_stats(
    p: *const TiermemPrefault,
    reg: u64,
    out: *mut TiermemPrefaultRegionStats,
) -> c_int {
    guard("tiermem_prefault_region_stats", || {
        let h = match handles::get(p, "prefault") {
            Ok(h) => h,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let r = match token(reg) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let Some(s) = h.svc.region_stats_raw(r) else {
            return fail(libc::ENOENT, format!("registration {reg:#x} has ended"));
        };
        // SAFETY: out was checked non-NULL.
        unsafe {
            *out = TiermemPrefaultRegionStats {
                populated_bytes: s.populated_bytes,
                calls: s.calls,
                hits: s.hits,
                failures: s.failures,
                last_errno: s.last_errno,
                order: match s.order {
                    Order::Auto => TIERMEM_PREFAULT_AUTO,
                    Order::Ascending => TIERMEM_PREFAULT_ASCENDING,
                    Order::Descending => TIERMEM_PREFAULT_DESCENDING,
                    Order::Stride => TIERMEM_PREFAULT_STRIDE,
                    Order::Whole => TIERMEM_PREFAULT_WHOLE,
                },
                stride: s.stride as u64,
            }
        };
        0
    })
}
