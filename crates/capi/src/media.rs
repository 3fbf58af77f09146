//! C ABI over the media layer: pools, persistence primitives, the delay model.

use crate::error::{cstr, fail, guard, handles};
use std::ffi::{c_char, c_int, c_void};
use tiermem_media::{persist, DelayModel, MediaError, OpenOptions, Pool, PoolKind, PoolOptions};

/// An open NVM or FAM pool (opaque).
pub struct TiermemPool {
    pool: Pool,
}

/// Pool kind: NVM (one process at a time by convention).
pub const TIERMEM_POOL_NVM: c_int = 0;
/// Pool kind: FAM (shared by processes and hosts).
pub const TIERMEM_POOL_FAM: c_int = 1;
/// Creation flag: mode 0660 so the owning group can open the pool.
pub const TIERMEM_POOL_GROUP_SHARED: u32 = 1;

/// Device counters, as returned by `tiermem_pool_stats`.
#[repr(C)]
#[derive(Default)]
pub struct TiermemStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub delay_ns_injected: u64,
    pub reads: u64,
    pub writes: u64,
    pub persists: u64,
    pub fences: u64,
}

fn media_fail(e: MediaError) -> i32 {
    fail(e.errno(), e)
}

/// Borrow the pool behind a live handle, or fail with -EINVAL (NULL) / -EBADF (closed).
/// The pool is Sync, so shared access from several threads is fine.
fn pool_ref<'a>(p: *const TiermemPool) -> Result<&'a Pool, i32> {
    handles::get(p, "pool").map(|h| &h.pool)
}

/// Create a pool file of `size` bytes (including its 4 KiB header) at `path`.
/// `kind` is TIERMEM_POOL_NVM or TIERMEM_POOL_FAM; `flags` may be TIERMEM_POOL_GROUP_SHARED.
/// On success stores the handle in `*out` and returns 0. Never overwrites an existing file.
#[no_mangle]
pub extern "C" fn tiermem_pool_create(
    path: *const c_char,
    size: u64,
    kind: c_int,
    flags: u32,
    out: *mut *mut TiermemPool,
) -> c_int {
    guard("tiermem_pool_create", || {
        let path = match cstr(path, "path") {
            Ok(p) => p,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let kind = match kind {
            TIERMEM_POOL_NVM => PoolKind::Nvm,
            TIERMEM_POOL_FAM => PoolKind::Fam,
            k => return fail(libc::EINVAL, format!("unknown pool kind {k}")),
        };
        let opts = PoolOptions::new(size)
            .kind(kind)
            .group_shared(flags & TIERMEM_POOL_GROUP_SHARED != 0);
        match Pool::create(path, &opts) {
            Ok(pool) => {
                // SAFETY: out was checked non-NULL and points to writable storage (ABI contract).
                unsafe { *out = handles::issue(TiermemPool { pool }) };
                0
            }
            Err(e) => media_fail(e),
        }
    })
}

/// Open and validate an existing pool (header magic, version, checksum, size).
#[no_mangle]
pub extern "C" fn tiermem_pool_open(path: *const c_char, out: *mut *mut TiermemPool) -> c_int {
    guard("tiermem_pool_open", || {
        let path = match cstr(path, "path") {
            Ok(p) => p,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        match Pool::open(path, &OpenOptions::default()) {
            Ok(pool) => {
                // SAFETY: out was checked non-NULL and points to writable storage (ABI contract).
                unsafe { *out = handles::issue(TiermemPool { pool }) };
                0
            }
            Err(e) => media_fail(e),
        }
    })
}

/// Unmap and close a pool. The file stays. NULL is ignored; a handle that is not open (closed
/// twice) only sets tiermem_last_error().
#[no_mangle]
pub extern "C" fn tiermem_pool_close(pool: *mut TiermemPool) {
    guard("tiermem_pool_close", || {
        if !pool.is_null() {
            let _ = handles::take(pool, "pool").map(drop);
        }
    })
}

/// Remove a pool file; refuses files that are not tiermem pools.
#[no_mangle]
pub extern "C" fn tiermem_pool_remove(path: *const c_char) -> c_int {
    guard("tiermem_pool_remove", || match cstr(path, "path") {
        Ok(p) => Pool::remove(p).map(|_| 0).unwrap_or_else(media_fail),
        Err(e) => e,
    })
}

/// Start of the pool's data area (after the header), or NULL for a NULL or closed handle. Loads and stores
/// through it are the fast path; make stores durable with tiermem_pool_persist.
#[no_mangle]
pub extern "C" fn tiermem_pool_base(pool: *const TiermemPool) -> *mut c_void {
    guard("tiermem_pool_base", || {
        pool_ref(pool)
            .map(|p| p.data_ptr().cast())
            .unwrap_or(std::ptr::null_mut())
    })
}

/// Size of the data area in bytes (0 for a NULL or closed handle).
#[no_mangle]
pub extern "C" fn tiermem_pool_size(pool: *const TiermemPool) -> u64 {
    guard("tiermem_pool_size", || {
        pool_ref(pool).map(|p| p.data_len() as u64).unwrap_or(0)
    })
}

/// Copy `len` bytes at data offset `off` into `buf`, charging the read delay model.
#[no_mangle]
pub extern "C" fn tiermem_pool_read(
    pool: *const TiermemPool,
    off: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard("tiermem_pool_read", || {
        let p = match pool_ref(pool) {
            Ok(p) => p,
            Err(e) => return e,
        };
        if buf.is_null() && len > 0 {
            return fail(libc::EINVAL, "buf is NULL");
        }
        let dst: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: buf is non-NULL and the caller guarantees len writable bytes.
            unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
        };
        p.read(off, dst).map(|_| 0).unwrap_or_else(media_fail)
    })
}

/// Copy `len` bytes from `buf` to data offset `off` with non-temporal stores, charging the write
/// delay model, and make them durable (flush + fence) before returning.
#[no_mangle]
pub extern "C" fn tiermem_pool_write(
    pool: *const TiermemPool,
    off: u64,
    buf: *const c_void,
    len: usize,
) -> c_int {
    guard("tiermem_pool_write", || {
        let p = match pool_ref(pool) {
            Ok(p) => p,
            Err(e) => return e,
        };
        if buf.is_null() && len > 0 {
            return fail(libc::EINVAL, "buf is NULL");
        }
        let src: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: buf is non-NULL and the caller guarantees len readable bytes.
            unsafe { std::slice::from_raw_parts(buf.cast(), len) }
        };
        p.write_persist(off, src)
            .map(|_| 0)
            .unwrap_or_else(media_fail)
    })
}

/// Make `len` bytes at data offset `off` durable: clwb/clflushopt + sfence on DAX and tmpfs, msync
/// on a block-backed file.
#[no_mangle]
pub extern "C" fn tiermem_pool_persist(pool: *const TiermemPool, off: u64, len: usize) -> c_int {
    guard("tiermem_pool_persist", || match pool_ref(pool) {
        Ok(p) => p.persist(off, len).map(|_| 0).unwrap_or_else(media_fail),
        Err(e) => e,
    })
}

/// Set the pool's delay model from text: a preset (`none`, `pcm-fam`, `nvmm`, `ethernet-10g`) or
/// explicit values (`read=1us,write=1us,bw=2GB/s`).
#[no_mangle]
pub extern "C" fn tiermem_pool_set_delay(pool: *const TiermemPool, model: *const c_char) -> c_int {
    guard("tiermem_pool_set_delay", || {
        let p = match pool_ref(pool) {
            Ok(p) => p,
            Err(e) => return e,
        };
        let text = match cstr(model, "model") {
            Ok(t) => t,
            Err(e) => return e,
        };
        match text.parse::<DelayModel>() {
            Ok(m) => {
                p.set_delay(m);
                0
            }
            Err(e) => media_fail(e),
        }
    })
}

/// Copy the pool's counters into `*out`.
#[no_mangle]
pub extern "C" fn tiermem_pool_stats(pool: *const TiermemPool, out: *mut TiermemStats) -> c_int {
    guard("tiermem_pool_stats", || {
        let p = match pool_ref(pool) {
            Ok(p) => p,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let s = p.stats().snapshot();
        // SAFETY: out was checked non-NULL and points to a TiermemStats (ABI contract).
        unsafe {
            *out = TiermemStats {
                bytes_read: s.bytes_read,
                bytes_written: s.bytes_written,
                delay_ns_injected: s.delay_ns_injected,
                reads: s.reads,
                writes: s.writes,
                persists: s.persists,
                fences: s.fences,
            }
        };
        0
    })
}

/// Non-temporal copy of `len` bytes ending with a store fence. The ranges must not overlap.
///
/// # Safety
/// `dst` and `src` must be valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tiermem_nt_copy(dst: *mut c_void, src: *const c_void, len: usize) {
    guard("tiermem_nt_copy", || {
        // SAFETY: forwarded caller contract.
        unsafe { persist::nt_copy(dst.cast(), src.cast(), len) }
    })
}

/// Write back the cache lines of `[addr, addr+len)` (clwb, else clflushopt, else clflush) without
/// a fence. Pair with tiermem_fence.
///
/// # Safety
/// The range must be mapped.
#[no_mangle]
pub unsafe extern "C" fn tiermem_flush(addr: *const c_void, len: usize) {
    guard("tiermem_flush", || {
        // SAFETY: forwarded caller contract.
        unsafe { persist::flush_lines(addr.cast(), len) }
    })
}

/// Store fence (sfence): orders earlier flushes and non-temporal stores before later stores.
#[no_mangle]
pub extern "C" fn tiermem_fence() {
    guard("tiermem_fence", persist::fence)
}
