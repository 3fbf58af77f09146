//! C ABI of the DBIO buffer pool (`tiermem-iocache`, issue #19): open a pool over a data file,
//! pin pages for reading or writing (a pin token and the page's address), release them, evict,
//! flush, sync, read the counters, close.
//!
//! Errno mapping: malformed arguments -EINVAL; a file system without direct I/O or tmpfs for
//! the direct and dbio modes -EOPNOTSUPP; a path that is not a regular file -EISDIR (a
//! directory) or -EINVAL; every frame pinned -EBUSY; a pinned page asked to be evicted -EBUSY;
//! an unknown pin token -ENOENT; a failed system call its errno.

use crate::error::{cstr, fail, guard, handles};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use tiermem_iocache::{
    Access, AfterHit, ColdRead, Error, EvictClean, Mode, Options, Pool, Probe, RawPin,
};

/// A buffer pool (opaque).
pub struct TiermemIocache {
    pool: Pool,
    /// Pins handed to C, by token.
    pins: Mutex<(u64, HashMap<u64, RawPin>)>,
}

/// Mode: everything through the page cache.
pub const TIERMEM_IOCACHE_BUFFERED: c_int = 0;
/// Mode: everything with O_DIRECT.
pub const TIERMEM_IOCACHE_DIRECT: c_int = 1;
/// Mode: DBIO (the page cache as the pool's victim cache).
pub const TIERMEM_IOCACHE_DBIO: c_int = 2;
/// Evict-clean: write the identical bytes through the page cache.
pub const TIERMEM_IOCACHE_EVICT_WRITE: c_int = 0;
/// Evict-clean: POSIX_FADV_WILLNEED (an asynchronous read) of every victim while the page cache's
/// share is at least the pool, else only of victims hit in the pool since their load.
pub const TIERMEM_IOCACHE_EVICT_READAHEAD: c_int = 1;
/// Evict-clean: nothing.
pub const TIERMEM_IOCACHE_EVICT_DROP: c_int = 2;
/// Evict-clean: readahead every clean victim the page cache lacks, not only pages hit in the
/// pool since their load (`EvictClean::ReadaheadAll`).
pub const TIERMEM_IOCACHE_EVICT_READAHEAD_ALL: c_int = 3;
/// Evict-clean: readahead only victims hit in the pool since their load
/// (`EvictClean::ReadaheadReused`).
pub const TIERMEM_IOCACHE_EVICT_READAHEAD_REUSED: c_int = 4;

/// Cold reads: buffered while the page cache's share is more than twice the pool, else direct.
pub const TIERMEM_IOCACHE_COLD_AUTO: c_int = 0;
/// Cold reads: O_DIRECT (DBIO's path).
pub const TIERMEM_IOCACHE_COLD_DIRECT: c_int = 1;
/// Cold reads: through the page cache.
pub const TIERMEM_IOCACHE_COLD_BUFFERED: c_int = 2;

/// Pool options (`tiermem_iocache_options_default` fills the defaults).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TiermemIocacheOptions {
    /// 4096, 8192 or 16384 (default 4096).
    pub page_size: u32,
    /// TIERMEM_IOCACHE_BUFFERED, _DIRECT or _DBIO (default DBIO).
    pub mode: c_int,
    /// TIERMEM_IOCACHE_EVICT_* (default READAHEAD).
    pub evict_clean: c_int,
    /// Non-zero: probe with preadv2(RWF_NOWAIT) instead of cachestat (default 0).
    pub probe_nowait: c_int,
    /// 1: drop a page read from the page cache; 0: leave it there; -1 (the default): drop it
    /// when uncached misses are read O_DIRECT, leave it under buffered cold reads.
    pub drop_after_hit: c_int,
    /// dbio's read of an uncached miss: TIERMEM_IOCACHE_COLD_AUTO (default), _DIRECT or
    /// _BUFFERED.
    pub cold_read: c_int,
    /// Non-zero: keep the page cache's share of the budget by trimming (default 1).
    pub enforce_budget: c_int,
    /// Non-zero: mlock the pool (default 1; failure is reported in the stats).
    pub lock: c_int,
    /// Non-zero: create the file if missing (default 1).
    pub create: c_int,
    /// Pool and page cache together, bytes (default 256 MiB).
    pub budget_bytes: u64,
    /// The pool, bytes (default 128 MiB).
    pub pool_bytes: u64,
}

/// A pool's counters (`tiermem_iocache_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TiermemIocacheStats {
    /// Requests served by a frame.
    pub pool_hits: u64,
    /// Requests that loaded the page.
    pub pool_misses: u64,
    /// Misses read from the page cache.
    pub cache_hits: u64,
    /// Misses read with O_DIRECT.
    pub direct_reads: u64,
    /// Misses read through the page cache without a probe (buffered mode).
    pub buffered_reads: u64,
    /// Pages written with O_DIRECT.
    pub direct_writes: u64,
    /// Pages written through the page cache.
    pub buffered_writes: u64,
    /// Dirty pages evicted.
    pub evict_dirty: u64,
    /// Clean pages evicted.
    pub evict_clean: u64,
    /// Pages trimmed from the page cache for the budget.
    pub trimmed_pages: u64,
    /// Frames in the pool.
    pub frames: u64,
    /// 1 when the frames are mlocked.
    pub locked: c_int,
}

fn to_options(o: &TiermemIocacheOptions) -> Result<Options, c_int> {
    let mode = match o.mode {
        TIERMEM_IOCACHE_BUFFERED => Mode::Buffered,
        TIERMEM_IOCACHE_DIRECT => Mode::Direct,
        TIERMEM_IOCACHE_DBIO => Mode::Dbio,
        m => return Err(fail(libc::EINVAL, format!("unknown mode {m}"))),
    };
    let evict_clean = match o.evict_clean {
        TIERMEM_IOCACHE_EVICT_WRITE => EvictClean::Write,
        TIERMEM_IOCACHE_EVICT_READAHEAD => EvictClean::Readahead,
        TIERMEM_IOCACHE_EVICT_DROP => EvictClean::Drop,
        TIERMEM_IOCACHE_EVICT_READAHEAD_ALL => EvictClean::ReadaheadAll,
        TIERMEM_IOCACHE_EVICT_READAHEAD_REUSED => EvictClean::ReadaheadReused,
        m => {
            return Err(fail(
                libc::EINVAL,
                format!("unknown evict-clean policy {m}"),
            ))
        }
    };
    let cold_read = match o.cold_read {
        TIERMEM_IOCACHE_COLD_AUTO => ColdRead::Auto,
        TIERMEM_IOCACHE_COLD_DIRECT => ColdRead::Direct,
        TIERMEM_IOCACHE_COLD_BUFFERED => ColdRead::Buffered,
        m => return Err(fail(libc::EINVAL, format!("unknown cold-read choice {m}"))),
    };
    Ok(Options {
        page_size: o.page_size as usize,
        cold_read,
        budget: o.budget_bytes,
        pool_bytes: o.pool_bytes,
        mode,
        evict_clean,
        probe: if o.probe_nowait != 0 {
            Probe::Nowait
        } else {
            Probe::Cachestat
        },
        after_hit: match o.drop_after_hit {
            -1 => AfterHit::Auto,
            0 => AfterHit::Leave,
            1 => AfterHit::Drop,
            m => {
                return Err(fail(
                    libc::EINVAL,
                    format!("drop_after_hit {m}: 1, 0 or -1"),
                ))
            }
        },
        enforce_budget: o.enforce_budget != 0,
        lock: o.lock != 0,
        create: o.create != 0,
    })
}

fn iocache_fail(e: Error) -> c_int {
    let errno = match &e {
        Error::InvalidOption(_) | Error::NotRegular { .. } => libc::EINVAL,
        Error::NoDirectIo { .. } => libc::EOPNOTSUPP,
        Error::AllPinned { .. } | Error::Pinned { .. } => libc::EBUSY,
        Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        // z-READ's errors; the pool never returns them.
        Error::Truncated | Error::NotReadable { .. } => libc::EIO,
    };
    fail(errno, e)
}

/// Fills `*out` with the default options. Returns 0, or -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn tiermem_iocache_options_default(out: *mut TiermemIocacheOptions) -> c_int {
    guard("tiermem_iocache_options_default", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let d = Options::default();
        // SAFETY: out is non-NULL and points to writable storage (ABI contract).
        unsafe {
            *out = TiermemIocacheOptions {
                page_size: d.page_size as u32,
                mode: TIERMEM_IOCACHE_DBIO,
                evict_clean: match d.evict_clean {
                    EvictClean::Write => TIERMEM_IOCACHE_EVICT_WRITE,
                    EvictClean::Readahead => TIERMEM_IOCACHE_EVICT_READAHEAD,
                    EvictClean::Drop => TIERMEM_IOCACHE_EVICT_DROP,
                    EvictClean::ReadaheadAll => TIERMEM_IOCACHE_EVICT_READAHEAD_ALL,
                    EvictClean::ReadaheadReused => TIERMEM_IOCACHE_EVICT_READAHEAD_REUSED,
                },
                probe_nowait: 0,
                drop_after_hit: match d.after_hit {
                    AfterHit::Auto => -1,
                    AfterHit::Leave => 0,
                    AfterHit::Drop => 1,
                },
                cold_read: TIERMEM_IOCACHE_COLD_AUTO,
                enforce_budget: 1,
                lock: 1,
                create: 1,
                budget_bytes: d.budget,
                pool_bytes: d.pool_bytes,
            }
        };
        0
    })
}

/// Opens a pool over the file `path` (`opts` NULL: defaults) and stores its handle in `*out`.
#[no_mangle]
pub extern "C" fn tiermem_iocache_open(
    path: *const c_char,
    opts: *const TiermemIocacheOptions,
    out: *mut *mut TiermemIocache,
) -> c_int {
    guard("tiermem_iocache_open", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let path = match cstr(path, "path") {
            Ok(p) => p,
            Err(e) => return e,
        };
        let o = if opts.is_null() {
            Options::default()
        } else {
            // SAFETY: non-NULL options point to a readable struct (ABI contract).
            match to_options(unsafe { &*opts }) {
                Ok(o) => o,
                Err(e) => return e,
            }
        };
        match Pool::open(path, o) {
            Ok(pool) => {
                let h = TiermemIocache {
                    pool,
                    pins: Mutex::new((1, HashMap::new())),
                };
                // SAFETY: out was checked non-NULL.
                unsafe { *out = handles::issue(h) };
                0
            }
            Err(e) => iocache_fail(e),
        }
    })
}

/// Pins page `pgno` (for writing when `write` is non-zero): stores the address of its
/// page_size bytes in `*data` and a pin token in `*pin`, both valid until
/// `tiermem_iocache_put_page(pin)`. A written page is dirty once released.
#[no_mangle]
pub extern "C" fn tiermem_iocache_get_page(
    p: *const TiermemIocache,
    pgno: u64,
    write: c_int,
    data: *mut *mut c_void,
    pin: *mut u64,
) -> c_int {
    guard("tiermem_iocache_get_page", || {
        let h = match handles::get(p, "iocache") {
            Ok(h) => h,
            Err(e) => return e,
        };
        if data.is_null() || pin.is_null() {
            return fail(libc::EINVAL, "data or pin is NULL");
        }
        let access = if write != 0 {
            Access::Write
        } else {
            Access::Read
        };
        match h.pool.get_page_raw(pgno, access) {
            Ok((raw, ptr)) => {
                let mut g = h.pins.lock();
                let token = g.0;
                g.0 += 1;
                g.1.insert(token, raw);
                // SAFETY: both out-pointers were checked non-NULL.
                unsafe {
                    *data = ptr.cast();
                    *pin = token;
                }
                0
            }
            Err(e) => iocache_fail(e),
        }
    })
}

/// Releases a page pinned by `tiermem_iocache_get_page`. -ENOENT for an unknown or released pin.
#[no_mangle]
pub extern "C" fn tiermem_iocache_put_page(p: *const TiermemIocache, pin: u64) -> c_int {
    guard("tiermem_iocache_put_page", || {
        let h = match handles::get(p, "iocache") {
            Ok(h) => h,
            Err(e) => return e,
        };
        let Some(raw) = h.pins.lock().1.remove(&pin) else {
            return fail(libc::ENOENT, format!("pin {pin} is not held"));
        };
        // SAFETY: the pin came from this pool's get_page_raw and was just removed from the
        // table of held pins, so it is released once.
        unsafe { h.pool.put_page_raw(raw) };
        0
    })
}

fn with_pool(
    p: *const TiermemIocache,
    name: &'static str,
    f: impl FnOnce(&Pool) -> c_int,
) -> c_int {
    guard(name, || match handles::get(p, "iocache") {
        Ok(h) => f(&h.pool),
        Err(e) => e,
    })
}

/// Evicts page `pgno` now (write-back or caching as on a replacement). Returns 1 if the pool
/// held it, 0 if not, -EBUSY if it is pinned.
#[no_mangle]
pub extern "C" fn tiermem_iocache_evict(p: *const TiermemIocache, pgno: u64) -> c_int {
    with_pool(p, "tiermem_iocache_evict", |pool| match pool.evict(pgno) {
        Ok(held) => c_int::from(held),
        Err(e) => iocache_fail(e),
    })
}

/// Writes every dirty page back (keeping it cached). Do not call while this thread holds a
/// write pin. Returns the pages written (≥ 0) or an error.
#[no_mangle]
pub extern "C" fn tiermem_iocache_flush(p: *const TiermemIocache) -> c_int {
    with_pool(p, "tiermem_iocache_flush", |pool| match pool.flush() {
        Ok(n) => n.min(c_int::MAX as u64) as c_int,
        Err(e) => iocache_fail(e),
    })
}

/// Flush, then fdatasync: everything written is durable.
#[no_mangle]
pub extern "C" fn tiermem_iocache_sync(p: *const TiermemIocache) -> c_int {
    with_pool(p, "tiermem_iocache_sync", |pool| match pool.sync() {
        Ok(()) => 0,
        Err(e) => iocache_fail(e),
    })
}

/// Fills `*out` with the pool's counters.
#[no_mangle]
pub extern "C" fn tiermem_iocache_stats(
    p: *const TiermemIocache,
    out: *mut TiermemIocacheStats,
) -> c_int {
    with_pool(p, "tiermem_iocache_stats", |pool| {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let s = pool.stats();
        // SAFETY: out was checked non-NULL.
        unsafe {
            *out = TiermemIocacheStats {
                pool_hits: s.pool_hits,
                pool_misses: s.pool_misses,
                cache_hits: s.cache_hits,
                direct_reads: s.direct_reads,
                buffered_reads: s.buffered_reads,
                direct_writes: s.direct_writes,
                buffered_writes: s.buffered_writes,
                evict_dirty: s.evict_dirty,
                evict_clean: s.evict_clean,
                trimmed_pages: s.trimmed_pages,
                frames: s.frames,
                locked: c_int::from(s.locked),
            }
        };
        0
    })
}

/// Releases every pin still held, syncs and frees the pool. Returns the sync's result (the
/// handle is freed either way); addresses of pages still pinned are invalid afterwards.
#[no_mangle]
pub extern "C" fn tiermem_iocache_close(p: *mut TiermemIocache) -> c_int {
    guard("tiermem_iocache_close", || {
        let h = match handles::take(p, "iocache") {
            Ok(h) => h,
            Err(e) => return e,
        };
        let held: Vec<RawPin> = h.pins.lock().1.drain().map(|(_, r)| r).collect();
        for raw in held {
            // SAFETY: each pin came from this pool and leaves the table here, released once.
            unsafe { h.pool.put_page_raw(raw) };
        }
        match h.pool.sync() {
            Ok(()) => 0,
            Err(e) => iocache_fail(e),
        }
    })
}
