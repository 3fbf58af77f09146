//! C ABI of the pager (`tiermem-pager`, NVSwap, issue #16): one pager per process
//! (`tiermem_pager_init`), regions mapped from it (`tiermem_pager_map`/`unmap`) or adopted
//! memory the program already has (`tiermem_pager_adopt`), a page-in bound
//! per region (`tiermem_pager_set_bound`), counters (`tiermem_pager_stats`), shutdown.
//!
//! Errno mapping: malformed arguments, or a shared pool that is missing or not usable -EINVAL; a budget above the memory available -ENOMEM; a
//! swap file on tmpfs -EOPNOTSUPP; init twice -EEXIST; no pager yet -ENODEV; an address that is
//! not a region's start -ENOENT; shutdown with regions still mapped -EBUSY; a failed system
//! call its errno.

use crate::error::{cstr, fail, guard};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use tiermem_pager::{Error, PagedRegion, Pager, PagerOptions};

/// Pager options (`tiermem_pager_options_default` fills the defaults).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TiermemPagerOptions {
    /// DRAM budget of all regions together, bytes (default 256 MiB; at least 64 pages).
    pub budget_bytes: u64,
    /// NVM paging buffer, bytes (default 128 MiB; 0: page straight to the swap file).
    pub nvm_bytes: u64,
    /// Swap file path on a disk (NULL: /var/tmp/tiermem-pager-PID-N.swap). Unlinked at once.
    pub swap_path: *const c_char,
    /// Swap file size, bytes (0: 4 × the budget + 64 MiB).
    pub swap_bytes: u64,
    /// Non-zero: latency control on (default 1).
    pub control: c_int,
    /// A shared pager pool (`tiermem pager daemon`) to be a tenant of (NULL: a buffer and swap
    /// file of this process's own). Its buffer, swap file and control parameters then replace
    /// `nvm_bytes`, `swap_path`, `swap_bytes` and `control`.
    pub pool_path: *const c_char,
}

/// A pager's counters (`tiermem_pager_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TiermemPagerStats {
    /// Pages in DRAM now.
    pub resident_pages: u64,
    /// Most pages in DRAM at once.
    pub max_resident_pages: u64,
    /// The budget in pages.
    pub budget_pages: u64,
    /// Buffer slots in use.
    pub buffer_used: u64,
    /// Swap slots in use.
    pub swap_used: u64,
    /// First touches filled with zeros.
    pub zero_fills: u64,
    /// Page-ins from the NVM buffer.
    pub pageins_buffer: u64,
    /// Page-ins from the swap file.
    pub pageins_ssd: u64,
    /// Page-outs into the buffer.
    pub pageouts_buffer: u64,
    /// Page-outs to the swap file.
    pub pageouts_ssd: u64,
    /// Buffer pages destaged to the swap file.
    pub destaged: u64,
    /// Page-in p99 so far, ns (0 before the first page-in).
    pub pagein_p99_ns: u64,
    /// The SSD queue size S(t).
    pub queue: u64,
    /// Page-outs and destages that wrote nothing: the page was clean and its swap slot still
    /// held its bytes.
    pub clean_pageouts: u64,
}

struct Global {
    pager: Pager,
    regions: HashMap<usize, PagedRegion>,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

fn pager_fail(e: Error) -> c_int {
    let errno = match &e {
        Error::InvalidOption(_) | Error::Infeasible { .. } | Error::BadPool { .. } => libc::EINVAL,
        Error::BudgetAboveMemory { .. } => libc::ENOMEM,
        Error::SwapOnTmpfs { .. } => libc::EOPNOTSUPP,
        Error::Map { source, .. } | Error::Sys { source, .. } => {
            source.raw_os_error().unwrap_or(libc::EIO)
        }
        Error::Fault(_) | Error::Media(_) => libc::EIO,
    };
    fail(errno, e)
}

/// Fills `*o` with the defaults. -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn tiermem_pager_options_default(o: *mut TiermemPagerOptions) -> c_int {
    guard("tiermem_pager_options_default", || {
        if o.is_null() {
            return fail(libc::EINVAL, "options is NULL");
        }
        // SAFETY: non-NULL, writable (ABI contract).
        unsafe {
            *o = TiermemPagerOptions {
                budget_bytes: 256 << 20,
                nvm_bytes: 128 << 20,
                swap_path: std::ptr::null(),
                swap_bytes: 0,
                control: 1,
                pool_path: std::ptr::null(),
            }
        };
        0
    })
}

/// Starts this process's pager (NULL options: the defaults): the buffer pool, the swap file and
/// the evictor thread. -EEXIST if it runs already.
#[no_mangle]
pub extern "C" fn tiermem_pager_init(o: *const TiermemPagerOptions) -> c_int {
    guard("tiermem_pager_init", || {
        let mut g = GLOBAL.lock();
        if g.is_some() {
            return fail(libc::EEXIST, "the pager of this process is already running");
        }
        let mut d = TiermemPagerOptions {
            budget_bytes: 0,
            nvm_bytes: 0,
            swap_path: std::ptr::null(),
            swap_bytes: 0,
            control: 0,
            pool_path: std::ptr::null(),
        };
        tiermem_pager_options_default(&mut d);
        let c = if o.is_null() {
            d
        } else {
            // SAFETY: non-NULL options point to a readable struct (ABI contract).
            unsafe { *o }
        };
        let mut opts = PagerOptions::new(c.budget_bytes, c.nvm_bytes);
        if !c.swap_path.is_null() {
            match cstr(c.swap_path, "swap_path") {
                Ok(p) => opts.swap_path = Some(p.into()),
                Err(e) => return e,
            }
        }
        if c.swap_bytes != 0 {
            opts.swap_size = Some(c.swap_bytes);
        }
        opts.control.enabled = c.control != 0;
        if !c.pool_path.is_null() {
            match cstr(c.pool_path, "pool_path") {
                Ok(p) => opts.pool = Some(p.into()),
                Err(e) => return e,
            }
        }
        match Pager::new(&opts) {
            Ok(pager) => {
                *g = Some(Global {
                    pager,
                    regions: HashMap::new(),
                });
                0
            }
            Err(e) => pager_fail(e),
        }
    })
}

/// Maps a paged region of `len` bytes (zero-filled) and returns its address, NULL on error
/// (see `tiermem_last_error`). Faults are resolved in the faulting thread: a system call that
/// reads or writes an evicted page gets EFAULT.
#[no_mangle]
pub extern "C" fn tiermem_pager_map(len: usize) -> *mut c_void {
    guard("tiermem_pager_map", || {
        let mut g = GLOBAL.lock();
        let Some(gl) = g.as_mut() else {
            fail(libc::ENODEV, "tiermem_pager_init was not called");
            return std::ptr::null_mut();
        };
        match gl.pager.map(len) {
            Ok(r) => {
                let p = r.as_ptr();
                gl.regions.insert(p as usize, r);
                p.cast()
            }
            Err(e) => {
                pager_fail(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Pages `[ptr, ptr + len)`, memory the program already has (a large `malloc` block or an
/// anonymous `mmap`, page-aligned): its pages count against the budget and those beyond it
/// move out. `tiermem_pager_unmap(ptr)` later pages everything back in and gives the memory
/// back untouched (it is not freed). -EINVAL for an unaligned or empty range or memory that is
/// not private anonymous read-write; -EEXIST if a region starts at `ptr` already. The range
/// must stay mapped until then and is not inherited by `fork`.
#[no_mangle]
pub extern "C" fn tiermem_pager_adopt(ptr: *mut c_void, len: usize) -> c_int {
    guard("tiermem_pager_adopt", || {
        let mut g = GLOBAL.lock();
        let Some(gl) = g.as_mut() else {
            return fail(libc::ENODEV, "tiermem_pager_init was not called");
        };
        if gl.regions.contains_key(&(ptr as usize)) {
            return fail(libc::EEXIST, format!("{ptr:p} is a paged region already"));
        }
        // SAFETY: the caller's contract (documented above): the range stays mapped and is not
        // registered elsewhere until tiermem_pager_unmap.
        match unsafe { gl.pager.adopt(ptr.cast(), len) } {
            Ok(r) => {
                gl.regions.insert(ptr as usize, r);
                0
            }
            Err(e) => pager_fail(e),
        }
    })
}

/// Unmaps the region starting at `ptr`, freeing its buffer and swap slots (an adopted range is
/// paged back in and left mapped). -ENOENT if `ptr` is not a region's start.
#[no_mangle]
pub extern "C" fn tiermem_pager_unmap(ptr: *mut c_void) -> c_int {
    guard("tiermem_pager_unmap", || {
        let mut g = GLOBAL.lock();
        let Some(gl) = g.as_mut() else {
            return fail(libc::ENODEV, "tiermem_pager_init was not called");
        };
        match gl.regions.remove(&(ptr as usize)) {
            Some(r) => {
                drop(r);
                0
            }
            None => fail(
                libc::ENOENT,
                format!("{ptr:p} is not the start of a paged region"),
            ),
        }
    })
}

/// Bounds the page-in latency of the region at `ptr`: its `pct` quantile (0 < pct < 1) at most
/// `bound_ns`. -ENOENT for an unknown region, -EINVAL for a bound out of range.
#[no_mangle]
pub extern "C" fn tiermem_pager_set_bound(ptr: *mut c_void, pct: f64, bound_ns: u64) -> c_int {
    guard("tiermem_pager_set_bound", || {
        let g = GLOBAL.lock();
        let Some(gl) = g.as_ref() else {
            return fail(libc::ENODEV, "tiermem_pager_init was not called");
        };
        match gl.regions.get(&(ptr as usize)) {
            Some(r) => match r.set_bound(pct, bound_ns) {
                Ok(()) => 0,
                Err(e) => pager_fail(e),
            },
            None => fail(
                libc::ENOENT,
                format!("{ptr:p} is not the start of a paged region"),
            ),
        }
    })
}

/// Fills `*out` with the pager's counters.
#[no_mangle]
pub extern "C" fn tiermem_pager_stats(out: *mut TiermemPagerStats) -> c_int {
    guard("tiermem_pager_stats", || {
        if out.is_null() {
            return fail(libc::EINVAL, "stats is NULL");
        }
        let g = GLOBAL.lock();
        let Some(gl) = g.as_ref() else {
            return fail(libc::ENODEV, "tiermem_pager_init was not called");
        };
        let s = gl.pager.stats();
        // SAFETY: non-NULL, writable (ABI contract).
        unsafe {
            *out = TiermemPagerStats {
                resident_pages: s.resident_pages as u64,
                max_resident_pages: s.max_resident_pages as u64,
                budget_pages: s.budget_pages as u64,
                buffer_used: s.buffer_used as u64,
                swap_used: s.swap_used as u64,
                zero_fills: s.zero_fills,
                pageins_buffer: s.pageins_buffer,
                pageins_ssd: s.pageins_ssd,
                pageouts_buffer: s.pageouts_buffer,
                pageouts_ssd: s.pageouts_ssd,
                destaged: s.destaged,
                pagein_p99_ns: s.pagein.quantile(0.99).unwrap_or(0),
                queue: s.queue as u64,
                clean_pageouts: s.pageouts_clean + s.destaged_clean,
            }
        };
        0
    })
}

/// Stops the pager (evictor thread, buffer, swap file). -EBUSY while regions are mapped.
#[no_mangle]
pub extern "C" fn tiermem_pager_shutdown() -> c_int {
    guard("tiermem_pager_shutdown", || {
        let mut g = GLOBAL.lock();
        match g.as_ref() {
            None => fail(libc::ENODEV, "tiermem_pager_init was not called"),
            Some(gl) if !gl.regions.is_empty() => fail(
                libc::EBUSY,
                format!("{} paged regions are still mapped", gl.regions.len()),
            ),
            Some(_) => {
                *g = None;
                0
            }
        }
    })
}
