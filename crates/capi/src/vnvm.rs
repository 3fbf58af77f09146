//! C ABI of vnvm (vNVML, thesis 000 ch. 2) with the thesis' names: `nv_init`, `nv_allocate`,
//! `nv_txbegin`, `nv_write`, `nv_commit`, ... plus the transactional allocator (`nv_tx_alloc`,
//! `nv_tx_free`, `nv_root`, `nv_set_root`).
//!
//! Errno mapping of the Rust errors (also in the header, on `nv_init`): see [`vnvm_errno`] and
//! [`alloc_errno`].

use crate::error::{cstr, fail, guard, handles};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tiermem_vnvm::alloc::{AllocError, TxAlloc};
use tiermem_vnvm::{Mode, Region, Vnvm, VnvmConfig, VnvmError};

/// A vnvm instance (opaque): the pools of one directory, its workers and its regions. Thread
/// safe: any number of threads may use one instance.
#[allow(non_camel_case_types)]
pub struct nv_instance {
    vn: Vnvm,
    /// The region handles of this instance (addresses of boxed `nv_region`s).
    regions: Mutex<Vec<usize>>,
}

/// A region (opaque): a backing file mapped read-only, written through transactions.
#[allow(non_camel_case_types)]
pub struct nv_region {
    region: Region,
    alloc: Mutex<Option<TxAlloc>>,
}

/// `nv_allocate` mode: the region's DRAM cache is private to this process.
pub const NV_PRIVATE: c_int = 1;
/// `nv_allocate` mode: the region is shared between processes (thesis §2.4.4): every process
/// that allocates the same path with NV_SHARED (same size) sees the same committed data; a
/// transaction that writes a shared region writes no other region (-EXDEV).
pub const NV_SHARED: c_int = 2;

/// The errno of a vnvm error: Config → EINVAL, NoInstance → ENOENT, OutOfRegion → EFAULT,
/// UnknownTx / TxNotOpen / TxCommitted → ESRCH (no such open transaction), TxAborted →
/// ECANCELED, LogFull / NoLogObject (the transaction stays open) → ENOSPC, CacheFull → ENOBUFS, Damaged → EBADMSG, Busy / RegionBusy →
/// EBUSY, RegionFreed → EBADF, CrossRegion → EXDEV, Allocate → EEXIST (already allocated) / ENFILE (record table full)
/// / ENAMETOOLONG / EFBIG / EINVAL, media and I/O errors → their own errno, anything else → EIO.
fn vnvm_errno(e: &VnvmError) -> i32 {
    #[allow(unreachable_patterns)]
    match e {
        VnvmError::Media(m) => m.errno(),
        VnvmError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        VnvmError::Config(_) => libc::EINVAL,
        VnvmError::NoInstance { .. } => libc::ENOENT,
        VnvmError::OutOfRegion { .. } => libc::EFAULT,
        VnvmError::UnknownTx(_) | VnvmError::TxNotOpen(_) | VnvmError::TxCommitted(_) => {
            libc::ESRCH
        }
        VnvmError::TxAborted { .. } => libc::ECANCELED,
        VnvmError::LogFull { .. } | VnvmError::NoLogObject { .. } => libc::ENOSPC,
        VnvmError::CacheFull(_) => libc::ENOBUFS,
        VnvmError::Damaged { .. } => libc::EBADMSG,
        VnvmError::Busy(_) | VnvmError::RegionBusy(_) | VnvmError::SingleProcess(_) => libc::EBUSY,
        VnvmError::RegionFreed(_) => libc::EBADF,
        VnvmError::CrossRegion { .. } => libc::EXDEV,
        VnvmError::Allocate { reason, .. } => {
            if reason.contains("already") {
                libc::EEXIST
            } else if reason.contains("full") {
                libc::ENFILE
            } else if reason.contains("longer") {
                libc::ENAMETOOLONG
            } else if reason.contains("too large") {
                libc::EFBIG
            } else {
                libc::EINVAL
            }
        }
        _ => libc::EIO,
    }
}

/// The errno of an allocator error: the vnvm errno of a wrapped error; NotAHeap → EMEDIUMTYPE,
/// Damaged → EBADMSG, InvalidSize → EINVAL, OutOfSpace → ENOMEM, BadOffset → EINVAL, DoubleFree
/// → EALREADY, Busy → EBUSY, LogFullAborted → ENOSPC (the transaction was aborted).
fn alloc_errno(e: &AllocError) -> i32 {
    #[allow(unreachable_patterns)]
    match e {
        AllocError::Vnvm(v) => vnvm_errno(v),
        AllocError::NotAHeap { .. } => libc::EMEDIUMTYPE,
        AllocError::Damaged { .. } => libc::EBADMSG,
        AllocError::InvalidSize { .. } | AllocError::BadOffset { .. } => libc::EINVAL,
        AllocError::OutOfSpace { .. } => libc::ENOMEM,
        AllocError::DoubleFree { .. } => libc::EALREADY,
        AllocError::Busy { .. } => libc::EBUSY,
        AllocError::LogFullAborted { .. } => libc::ENOSPC,
        _ => libc::EIO,
    }
}

/// Lock a mutex, ignoring poisoning (a panic caught by `guard` leaves the data consistent:
/// the lists are only pushed to and filtered).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn vfail(e: VnvmError) -> i32 {
    fail(vnvm_errno(&e), e)
}

fn afail(e: AllocError) -> i32 {
    fail(alloc_errno(&e), e)
}

/// Borrow the instance behind a handle, or fail with -EINVAL.
fn inst_ref<'a>(p: *const nv_instance) -> Result<&'a nv_instance, i32> {
    // The instance is Sync.
    handles::get(p, "instance")
}

/// Borrow a region handle of `inst`, or fail with -EINVAL when it is NULL or not a live region
/// of this instance (checked before the pointer is dereferenced).
fn region_ref<'a>(inst: &nv_instance, r: *const nv_region) -> Result<&'a nv_region, i32> {
    // A live handle stays alive until nv_free/nv_release, which the caller must not run
    // concurrently with a call using it (ABI contract).
    let region = handles::get(r, "region")?;
    if !lock(&inst.regions).contains(&(r as usize)) {
        return Err(fail(
            libc::EINVAL,
            "region handle is not a live region of this instance (freed, or of another instance)",
        ));
    }
    Ok(region)
}

/// The region's allocator, opened (and on an all-zero region formatted) on first use.
fn alloc_of(inst: &nv_instance, r: &nv_region) -> Result<TxAlloc, i32> {
    let mut g = lock(&r.alloc);
    if let Some(a) = &*g {
        return Ok(a.clone());
    }
    let a = TxAlloc::open(&inst.vn, &r.region).map_err(afail)?;
    *g = Some(a.clone());
    Ok(a)
}

/// Drop the allocator overlays of transaction `tid` in every region of `inst` (it ended).
fn end_tx(inst: &nv_instance, tid: u64) {
    for &p in lock(&inst.regions).iter() {
        // SAFETY: entries of the list are live Box<nv_region>s (removed before they are freed,
        // under this lock).
        let r = unsafe { &*(p as *const nv_region) };
        if let Some(a) = &*lock(&r.alloc) {
            a.end_tx(tid);
        }
    }
}

/// Start a vnvm instance (the thesis' `nv_init`) in directory `dir` (NULL: `$TIERMEM_VNVM_DIR`,
/// else `$TIERMEM_DIR/vnvm`, i.e. `/dev/shm/tiermem/vnvm`). `log_size` and `cache_size` are the
/// bytes of the NVM log and NVM write cache pools (0: the default, 64 MiB, or
/// `$TIERMEM_VNVM_LOG_SIZE` / `$TIERMEM_VNVM_CACHE_SIZE`). Creates the pools on first use;
/// after an unclean shutdown it recovers first (committed transactions replayed, uncommitted
/// ones dropped). Stores the handle in `*out`. One instance per directory at a time (-EBUSY).
///
/// The vnvm contract:
///  - Reads are plain loads through nv_region_ptr() and see **committed data only** ("read
///    committed"): a transaction does not see its own writes until it commits.
///  - Writes go through transactions: nv_txbegin, nv_write..., nv_commit (durable when it
///    returns) or nv_abort (nothing of it ever becomes visible). A **direct store** into a
///    region faults: the region is mapped read-only, the store raises SIGSEGV and can never
///    persist.
///  - Ordering (the thesis' rule): when transactions of several threads write the same
///    object, the transaction that writes it first must commit first; vnvm replays in commit
///    order and does not lock objects for you. The allocator below enforces this for its own
///    metadata by letting one transaction at a time hold it until it ends.
///
/// Errors (negative errno; text in tiermem_last_error()): EINVAL bad configuration or
/// argument, EBUSY instance in use, EBADMSG damaged pools (reported, nothing written), ENOENT,
/// EACCES, ENOSPC and the other media errors. Across this API: ESRCH for a tid that is not
/// open (never begun, committed or forgotten), ECANCELED for an aborted one (also when the
/// redo worker aborted it for its age), EFAULT for an nv_write outside the caller's regions,
/// ENOSPC for a full log, EBADF for a freed region, EIO for an internal error.
#[no_mangle]
pub extern "C" fn nv_init(
    dir: *const c_char,
    log_size: u64,
    cache_size: u64,
    out: *mut *mut nv_instance,
) -> c_int {
    guard("nv_init", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let mut cfg = match VnvmConfig::from_env() {
            Ok(c) => c,
            Err(e) => return vfail(e),
        };
        if !dir.is_null() {
            match cstr(dir, "dir") {
                Ok(d) => cfg.dir = d.into(),
                Err(e) => return e,
            }
        }
        if log_size != 0 {
            cfg.log_size = log_size;
        }
        if cache_size != 0 {
            cfg.cache_size = cache_size;
        }
        match tiermem_vnvm::nv_init(&cfg) {
            Ok(vn) => {
                let b = nv_instance {
                    vn,
                    regions: Mutex::new(Vec::new()),
                };
                // SAFETY: out was checked non-NULL and points to writable storage (ABI contract).
                unsafe { *out = handles::issue(b) };
                0
            }
            Err(e) => vfail(e),
        }
    })
}

/// Release an instance (the thesis' `nv_release`): abort its open transactions, apply every
/// committed one, write every dirty cache page back, fdatasync the files and mark the instance
/// cleanly shut down. The handle and every region handle of the instance are freed, also on
/// error (region pointers from nv_region_ptr are unmapped). NULL returns -EINVAL.
#[no_mangle]
pub extern "C" fn nv_release(inst: *mut nv_instance) -> c_int {
    guard("nv_release", || {
        let b = match handles::take(inst, "instance") {
            Ok(b) => b,
            Err(e) => return e,
        };
        for p in lock(&b.regions).drain(..) {
            // Each entry is a live region handle from nv_allocate, freed only here or in
            // nv_free (which removes it from the list first).
            let _ = handles::take(p as *mut nv_region, "region").map(drop);
        }
        let nv_instance { vn, .. } = *b;
        match vn.nv_release() {
            Ok(()) => 0,
            Err(e) => vfail(e),
        }
    })
}

/// Map the file at `path` as a region of `size` bytes (the thesis' `nv_allocate`): created
/// (0600) if missing, extended if shorter; its current contents are the region's committed
/// data. `mode` is NV_PRIVATE (a DRAM cache of this process) or NV_SHARED (the file mapped
/// MAP_SHARED; other processes of the instance allocating the same path share it). Stores the
/// handle in `*out`.
///
/// Errors: EINVAL (size 0, bad mode, NULL, shared with another size), EEXIST (path already
/// allocated in this instance), ENFILE (record table or shared slots full), ENAMETOOLONG,
/// EFBIG, I/O errors.
#[no_mangle]
pub extern "C" fn nv_allocate(
    inst: *mut nv_instance,
    path: *const c_char,
    size: usize,
    mode: c_int,
    out: *mut *mut nv_region,
) -> c_int {
    guard("nv_allocate", || {
        let i = match inst_ref(inst) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let path = match cstr(path, "path") {
            Ok(p) => p,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let mode = match mode {
            NV_PRIVATE => Mode::Private,
            NV_SHARED => Mode::Shared,
            m => return fail(libc::EINVAL, format!("unknown mode {m}")),
        };
        match i.vn.nv_allocate(path, size, mode) {
            Ok(region) => {
                let p = handles::issue(nv_region {
                    region,
                    alloc: Mutex::new(None),
                });
                lock(&i.regions).push(p as usize);
                // SAFETY: out was checked non-NULL and points to writable storage (ABI contract).
                unsafe { *out = p };
                0
            }
            Err(e) => vfail(e),
        }
    })
}

/// Start of a region: a **read-only** mapping showing committed data. Load through it; never
/// store (SIGSEGV: use nv_write). NULL for a NULL handle. Valid until nv_free / nv_release.
#[no_mangle]
pub extern "C" fn nv_region_ptr(region: *const nv_region) -> *const c_void {
    guard("nv_region_ptr", || {
        handles::get(region, "region").map_or(std::ptr::null(), |r| r.region.as_ptr().cast())
    })
}

/// Size of a region in bytes (0 for a NULL handle).
#[no_mangle]
pub extern "C" fn nv_region_size(region: *const nv_region) -> usize {
    guard("nv_region_size", || {
        handles::get(region, "region").map_or(0, |r| r.region.len())
    })
}

/// Unmap a region (the thesis' `nv_free`): apply its committed transactions, write it back,
/// fdatasync the file, delete its record, and free the handle. On error the handle stays
/// valid.
///
/// Errors: EINVAL (not a region of this instance), EBUSY (an open transaction wrote into it:
/// commit or abort it first), I/O errors.
#[no_mangle]
pub extern "C" fn nv_free(inst: *mut nv_instance, region: *mut nv_region) -> c_int {
    guard("nv_free", || {
        let i = match inst_ref(inst) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let r = match region_ref(i, region) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if let Err(e) = i.vn.nv_free(r.region.clone()) {
            return vfail(e);
        }
        lock(&i.regions).retain(|&p| p != region as usize);
        // Checked live by region_ref just above.
        let _ = handles::take(region, "region").map(drop);
        0
    })
}

/// Begin a transaction (the thesis' `nv_txbegin`); returns its id, never 0 (0 for a NULL
/// instance).
#[no_mangle]
pub extern "C" fn nv_txbegin(inst: *mut nv_instance) -> u64 {
    guard("nv_txbegin", || match inst_ref(inst) {
        Ok(i) => i.vn.nv_txbegin(),
        Err(_) => 0,
    })
}

/// Log `n` bytes from `src` as transaction `tid`'s write to region memory at `dst` (the thesis'
/// `nv_write`; `dst` is an address inside a region, e.g. `nv_region_ptr(r) + off`; it is not
/// stored to). Nothing is visible until nv_commit. Returns the bytes logged: `n`, or fewer when
/// the log ran out of pages (call nv_wait_log_space and write the rest, or nv_abort); or a
/// negative errno: EFAULT (`dst..dst+n` not inside one region of this instance), ESRCH /
/// ECANCELED (tid not open / aborted), ENOSPC (log full, nothing logged), EBADF (region being
/// freed), EINVAL (NULL).
#[no_mangle]
pub extern "C" fn nv_write(
    inst: *mut nv_instance,
    tid: u64,
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
) -> i64 {
    let mut logged = 0i64;
    let rc = guard("nv_write", || {
        let i = match inst_ref(inst) {
            Ok(i) => i,
            Err(e) => return e,
        };
        if src.is_null() && n > 0 {
            return fail(libc::EINVAL, "src is NULL");
        }
        let data: &[u8] = if n == 0 {
            &[]
        } else {
            // SAFETY: src is non-NULL and the caller guarantees n readable bytes.
            unsafe { std::slice::from_raw_parts(src.cast(), n) }
        };
        match i.vn.nv_write(tid, dst as *const u8, data) {
            Ok(k) => {
                logged = k as i64;
                0
            }
            Err(e) => vfail(e),
        }
    });
    if rc < 0 {
        rc as i64
    } else {
        logged
    }
}

/// Wait up to `timeout_ms` milliseconds for a free log page: 0 when one is free, -ETIMEDOUT
/// otherwise, -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn nv_wait_log_space(inst: *mut nv_instance, timeout_ms: u64) -> c_int {
    guard("nv_wait_log_space", || match inst_ref(inst) {
        Ok(i) => {
            if i.vn.nv_wait_log_space(Duration::from_millis(timeout_ms)) {
                0
            } else {
                fail(
                    libc::ETIMEDOUT,
                    format!("no log page became free within {timeout_ms} ms"),
                )
            }
        }
        Err(e) => e,
    })
}

/// Commit transaction `tid` (the thesis' `nv_commit`): durable when it returns, then visible
/// through the region pointers. Also ends `tid`'s hold on the regions' allocators.
///
/// Errors: ESRCH (not open), ECANCELED (aborted, e.g. for its age), media errors.
#[no_mangle]
pub extern "C" fn nv_commit(inst: *mut nv_instance, tid: u64) -> c_int {
    guard("nv_commit", || {
        let i = match inst_ref(inst) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let r = i.vn.nv_commit(tid);
        end_tx(i, tid);
        match r {
            Ok(()) => 0,
            Err(e) => vfail(e),
        }
    })
}

/// Abort transaction `tid` (the thesis' `nv_abort`): none of its writes, allocations or frees
/// ever becomes visible.
///
/// Errors: ESRCH (not open), ECANCELED (already aborted).
#[no_mangle]
pub extern "C" fn nv_abort(inst: *mut nv_instance, tid: u64) -> c_int {
    guard("nv_abort", || {
        let i = match inst_ref(inst) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let r = i.vn.nv_abort(tid);
        end_tx(i, tid);
        match r {
            Ok(()) => 0,
            Err(e) => vfail(e),
        }
    })
}

/// Wait until the redo worker has applied every transaction committed so far to the NVM
/// write cache.
#[no_mangle]
pub extern "C" fn nv_drain(inst: *mut nv_instance) -> c_int {
    guard("nv_drain", || match inst_ref(inst) {
        Ok(i) => i.vn.drain().map(|_| 0).unwrap_or_else(vfail),
        Err(e) => e,
    })
}

/// Recover the (not running) instance in `dir` (NULL: the default directory): write dirty
/// cache pages back, replay committed logs in order, fdatasync the files. Idempotent; a
/// damaged structure is reported (-EBADMSG) and nothing is written. -ENOENT when `dir` holds
/// no instance, -EBUSY when it is running.
#[no_mangle]
pub extern "C" fn nv_recover(dir: *const c_char) -> c_int {
    guard("nv_recover", || {
        let d = if dir.is_null() {
            match VnvmConfig::from_env() {
                Ok(c) => c.dir,
                Err(e) => return vfail(e),
            }
        } else {
            match cstr(dir, "dir") {
                Ok(d) => d.into(),
                Err(e) => return e,
            }
        };
        tiermem_vnvm::recover(d).map(|_| 0).unwrap_or_else(vfail)
    })
}

/// Allocate `size` bytes inside `region` in transaction `tid` (`*off` = the payload's offset
/// from nv_region_ptr, 16-byte aligned; offsets persist, pointers do not). The region holds a
/// heap: the first use on an all-zero region formats one (its first 256 bytes) in a
/// transaction of its own. The block is allocated when `tid` commits; an abort or crash leaves
/// it free. Its contents are unspecified until written with nv_write. Sizes up to 64 KiB use
/// power-of-two classes (16-byte header each); larger ones are 4 KiB multiples.
///
/// Read committed applies to the allocator too: `tid` holds the region's allocator from its
/// first nv_tx_alloc / nv_tx_free / nv_set_root until nv_commit / nv_abort; another
/// transaction's allocator call waits for it (up to 10 s, then -EBUSY).
///
/// Errors: EINVAL (size 0 or larger than the region), ENOMEM (heap full), EMEDIUMTYPE (the
/// region holds other data, not a heap), EBADMSG (damaged heap: nothing written), EBUSY, ESRCH
/// / ECANCELED (tid), ENOSPC (log full for good: `tid` was aborted).
#[no_mangle]
pub extern "C" fn nv_tx_alloc(
    inst: *mut nv_instance,
    region: *mut nv_region,
    tid: u64,
    size: usize,
    off: *mut u64,
) -> c_int {
    with_alloc("nv_tx_alloc", inst, region, |i, a| {
        if off.is_null() {
            return fail(libc::EINVAL, "off is NULL");
        }
        match a.nv_tx_alloc(&i.vn, tid, size as u64) {
            Ok(o) => {
                // SAFETY: off was checked non-NULL and points to a uint64_t (ABI contract).
                unsafe { *off = o };
                0
            }
            Err(e) => afail(e),
        }
    })
}

/// Free the block at offset `off` of `region` in transaction `tid` (free when `tid` commits).
///
/// Errors: EINVAL (not an allocated block: outside the heap, misaligned, inside a block, or the
/// root object), EALREADY (double free), and the errors of nv_tx_alloc.
#[no_mangle]
pub extern "C" fn nv_tx_free(
    inst: *mut nv_instance,
    region: *mut nv_region,
    tid: u64,
    off: u64,
) -> c_int {
    with_alloc("nv_tx_free", inst, region, |i, a| {
        a.nv_tx_free(&i.vn, tid, off)
            .map(|_| 0)
            .unwrap_or_else(afail)
    })
}

/// The region's root object offset into `*out` (0: none). `tid` 0 gives the committed root;
/// the tid holding the region's allocator sees its own nv_set_root.
#[no_mangle]
pub extern "C" fn nv_root(
    inst: *mut nv_instance,
    region: *mut nv_region,
    tid: u64,
    out: *mut u64,
) -> c_int {
    with_alloc("nv_root", inst, region, |_, a| {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        match a.nv_root((tid != 0).then_some(tid)) {
            Ok(o) => {
                // SAFETY: out was checked non-NULL and points to a uint64_t (ABI contract).
                unsafe { *out = o };
                0
            }
            Err(e) => afail(e),
        }
    })
}

/// Make the allocated block at `off` the region's root object (0 clears it) in transaction
/// `tid`. Errors: EINVAL / EALREADY (not an allocated block), and those of nv_tx_alloc.
#[no_mangle]
pub extern "C" fn nv_set_root(
    inst: *mut nv_instance,
    region: *mut nv_region,
    tid: u64,
    off: u64,
) -> c_int {
    with_alloc("nv_set_root", inst, region, |i, a| {
        a.nv_set_root(&i.vn, tid, off)
            .map(|_| 0)
            .unwrap_or_else(afail)
    })
}

fn with_alloc(
    name: &'static str,
    inst: *mut nv_instance,
    region: *mut nv_region,
    f: impl FnOnce(&nv_instance, &TxAlloc) -> i32,
) -> i32 {
    guard(name, || {
        let i = match inst_ref(inst) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let r = match region_ref(i, region) {
            Ok(r) => r,
            Err(e) => return e,
        };
        match alloc_of(i, r) {
            Ok(a) => f(i, &a),
            Err(e) => e,
        }
    })
}
