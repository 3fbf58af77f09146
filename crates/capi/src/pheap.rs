//! C ABI of the persistent heap (`tiermem-pheap`, issue #6) with the paper's names on the
//! process-global heap: `nvh_open`, `nvh_close`, `nvh_malloc`, `nvh_free`, `nvh_realloc`,
//! `nvh_get`, `nvh_ckall`, `nvh_ckone`.
//!
//! Errno mapping of the Rust errors: see [`pheap_errno`].

use crate::error::{cstr, fail, guard};
use std::ffi::{c_char, c_int, c_void};
use tiermem_pheap::{CkStats, Error, HeapOptions};

/// Options of `nvh_open` when it creates a heap (ignored when the heap exists: its geometry
/// is in its file). Zero fields take the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct nvh_options {
    /// User views per superblock: 1 (PGCK, whole written pages copied), 2 (the paper's FGCK,
    /// the default), 4 or 8. 0 = default.
    pub views: u32,
    /// Heap capacity in bytes, a multiple of 64 KiB (fixed for the heap's life). 0 = 64 MiB.
    pub capacity: u64,
}

/// What one checkpoint did (`nvh_ckall`, `nvh_ckone`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct nvh_ckpt_stats {
    /// Complete checkpoints since the heap was created, this one included.
    pub epoch: u64,
    /// User-view pages written since the previous checkpoint (all views).
    pub pages_written: u64,
    /// Objects (wholly or partly) copied.
    pub objects_copied: u64,
    /// Bytes copied into the checkpoint (FGCK: object bytes; PGCK: whole pages).
    pub bytes_copied: u64,
    /// Bytes of allocation metadata written.
    pub meta_bytes: u64,
    /// Wall time of the checkpoint in nanoseconds.
    pub nanos: u64,
}

impl From<CkStats> for nvh_ckpt_stats {
    fn from(s: CkStats) -> Self {
        nvh_ckpt_stats {
            epoch: s.epoch,
            pages_written: s.pages_written as u64,
            objects_copied: s.objects_copied as u64,
            bytes_copied: s.bytes_copied as u64,
            meta_bytes: s.meta_bytes as u64,
            nanos: s.nanos,
        }
    }
}

/// The errno of a heap error: InvalidArgument → EINVAL, OutOfMemory → ENOMEM, InvalidPointer
/// → EINVAL, NameTaken → EEXIST, NoSuchName → ENOENT, AddressTaken → EADDRINUSE, Corrupt →
/// EBADMSG, VersionMismatch → EPROTO, MetadataFull → ENOSPC, NotOpen → EBADF, AlreadyOpen →
/// EBUSY, Safepoint → ETIMEDOUT, media errors → their errno, OS errors → their errno, anything else → EIO.
fn pheap_errno(e: &Error) -> i32 {
    #[allow(unreachable_patterns)]
    match e {
        Error::InvalidArgument(_) | Error::InvalidPointer(_) => libc::EINVAL,
        Error::OutOfMemory { .. } => libc::ENOMEM,
        Error::NameTaken(_) => libc::EEXIST,
        Error::NoSuchName(_) => libc::ENOENT,
        Error::AddressTaken { .. } => libc::EADDRINUSE,
        Error::Corrupt { .. } => libc::EBADMSG,
        Error::VersionMismatch { .. } => libc::EPROTO,
        Error::MetadataFull { .. } => libc::ENOSPC,
        Error::NotOpen => libc::EBADF,
        Error::AlreadyOpen => libc::EBUSY,
        Error::Safepoint(_) => libc::ETIMEDOUT,
        Error::Media(m) => m.errno(),
        Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

fn pfail(e: Error) -> i32 {
    fail(pheap_errno(&e), e)
}

/// Optional object name: NULL → None.
fn opt_name<'a>(name: *const c_char) -> Result<Option<&'a str>, i32> {
    if name.is_null() {
        Ok(None)
    } else {
        cstr(name, "name").map(Some)
    }
}

/// Writes `s` to `out` when `out` is not NULL.
fn put_stats(out: *mut nvh_ckpt_stats, s: CkStats) {
    if !out.is_null() {
        // SAFETY: a non-NULL `out` points to writable storage for one nvh_ckpt_stats (ABI
        // contract).
        unsafe { out.write(s.into()) };
    }
}

/// Opens the persistent heap whose checkpoint file is `path` (NULL: this program's and user's
/// default, `$TIERMEM_DIR/pheap/<program>-<uid>.heap`) as this process's heap, creating
/// it when the file does not exist (with `opts`, or the defaults when `opts` is NULL: 2 views,
/// 64 MiB). Reopening maps the heap at the addresses it was created at and restores its last
/// complete checkpoint (a crash in the middle of a checkpoint restarts from the previous one).
/// One heap per process at a time.
///
/// Returns 0 or a negative errno (text in tiermem_last_error()): EBUSY a heap is already open,
/// EINVAL bad options or path, EADDRINUSE the heap's addresses are taken in this process,
/// EBADMSG a corrupt checkpoint file (both header copies bad, checksum failures), EPROTO a
/// file of another format version, ENOENT/EACCES/ENOSPC media errors.
#[no_mangle]
pub extern "C" fn nvh_open(path: *const c_char, opts: *const nvh_options) -> c_int {
    guard("nvh_open", || {
        // NULL: this program's and user's default heap.
        let path: std::path::PathBuf = if path.is_null() {
            tiermem_pheap::default_path()
        } else {
            match cstr(path, "path") {
                Ok(p) => p.into(),
                Err(e) => return e,
            }
        };
        let mut o = HeapOptions::default();
        if !opts.is_null() {
            // SAFETY: a non-NULL `opts` points to a readable nvh_options (ABI contract).
            let c = unsafe { opts.read() };
            if c.views != 0 {
                o.views = c.views as usize;
            }
            if c.capacity != 0 {
                o.capacity = c.capacity as usize;
            }
        }
        match tiermem_pheap::nvh_open_with(&path, &o) {
            Ok(()) => 0,
            Err(e) => pfail(e),
        }
    })
}

/// Takes a final checkpoint of the heap and closes it (every pointer into it becomes invalid;
/// nvh_open can open it, or another heap, again). The heap is closed even if the checkpoint
/// fails. Returns 0, -EBADF when no heap is open, or the checkpoint's error.
#[no_mangle]
pub extern "C" fn nvh_close() -> c_int {
    guard("nvh_close", || match tiermem_pheap::nvh_close() {
        Ok(_) => 0,
        Err(e) => pfail(e),
    })
}

/// Allocates `size` bytes (not zeroed) in the heap; `name` (NULL: anonymous) makes the object
/// findable with nvh_get after a restart and must be unique. Returns the pointer, or NULL with
/// the reason in tiermem_last_error() (no heap open, name taken, heap full, bad name).
#[no_mangle]
pub extern "C" fn nvh_malloc(size: usize, name: *const c_char) -> *mut c_void {
    let mut out: *mut c_void = std::ptr::null_mut();
    guard("nvh_malloc", || {
        let name = match opt_name(name) {
            Ok(n) => n,
            Err(e) => return e,
        };
        match tiermem_pheap::nvh_malloc(size, name) {
            Ok(p) => {
                out = p.cast();
                0
            }
            Err(e) => pfail(e),
        }
    });
    out
}

/// Frees an object of the heap (NULL is a no-op). Returns 0, -EINVAL when `ptr` is not the
/// start of a live object (double free included), -EBADF when no heap is open. The free is
/// durable at the next checkpoint.
#[no_mangle]
pub extern "C" fn nvh_free(ptr: *mut c_void) -> c_int {
    guard("nvh_free", || {
        if ptr.is_null() {
            return 0;
        }
        match tiermem_pheap::nvh_free(ptr.cast()) {
            Ok(()) => 0,
            Err(e) => pfail(e),
        }
    })
}

/// Resizes an object (NULL `ptr` = nvh_malloc(size, NULL)), keeping its contents up to the
/// smaller size and its name; it may move. Returns the new pointer, or NULL with the reason in
/// tiermem_last_error() (the old object is then unchanged).
#[no_mangle]
pub extern "C" fn nvh_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    let mut out: *mut c_void = std::ptr::null_mut();
    guard("nvh_realloc", || {
        match tiermem_pheap::nvh_realloc(ptr.cast(), size) {
            Ok(p) => {
                out = p.cast();
                0
            }
            Err(e) => pfail(e),
        }
    });
    out
}

/// The object named `name`, or NULL (reason in tiermem_last_error(): no such name, no heap
/// open, bad name). After a restart it holds the object's bytes of the last checkpoint.
#[no_mangle]
pub extern "C" fn nvh_get(name: *const c_char) -> *mut c_void {
    let mut out: *mut c_void = std::ptr::null_mut();
    guard("nvh_get", || {
        let name = match cstr(name, "name") {
            Ok(n) => n,
            Err(e) => return e,
        };
        match tiermem_pheap::nvh_get(name) {
            Some(p) => {
                out = p.cast();
                0
            }
            None => {
                let e = if tiermem_pheap::nvh_is_open() {
                    Error::NoSuchName(name.to_string())
                } else {
                    Error::NotOpen
                };
                pfail(e)
            }
        }
    });
    out
}

/// Checkpoints the heap atomically: copies the objects written since the previous checkpoint
/// (FGCK: the objects visible through written view pages; PGCK, 1 view: whole written pages)
/// and the allocation changes; durable when it returns. No thread may write heap objects while
/// it runs. Fills `*out` when it is not NULL. Returns 0 or a negative errno.
#[no_mangle]
pub extern "C" fn nvh_ckall(out: *mut nvh_ckpt_stats) -> c_int {
    guard("nvh_ckall", || match tiermem_pheap::nvh_ckall() {
        Ok(s) => {
            put_stats(out, s);
            0
        }
        Err(e) => pfail(e),
    })
}

/// `nvh_ckall` with every other thread of the process stopped: each is signalled (signal
/// `SIGRTMAX - 6`) and parks in the handler (a thread inside an `nvh_*` call finishes it
/// first) until the checkpoint is durable, so threads may keep writing heap objects at any
/// time. Waits at most `timeout_ms` for the threads to park, else checkpoints nothing, resumes
/// them and returns -ETIMEDOUT (a thread that blocks the signal). Fills `*out` when it is not
/// NULL and `*pause_us` (first signal to resume, microseconds) when it is not NULL. Returns 0
/// or a negative errno.
#[no_mangle]
pub extern "C" fn nvh_ckall_stopping_threads(
    timeout_ms: u32,
    out: *mut nvh_ckpt_stats,
    pause_us: *mut u64,
) -> c_int {
    guard("nvh_ckall_stopping_threads", || {
        let t = std::time::Duration::from_millis(timeout_ms as u64);
        match tiermem_pheap::nvh_ckall_stopping_threads(t) {
            Ok((s, pause)) => {
                put_stats(out, s);
                if !pause_us.is_null() {
                    // SAFETY: the caller passes NULL or a writable u64.
                    unsafe { *pause_us = pause.as_micros() as u64 };
                }
                0
            }
            Err(e) => pfail(e),
        }
    })
}

/// Checkpoints the one object named `name` (in full) plus the allocation changes, atomically.
/// Returns 0, -ENOENT when no object has that name, or another negative errno.
#[no_mangle]
pub extern "C" fn nvh_ckone(name: *const c_char) -> c_int {
    guard("nvh_ckone", || {
        let name = match cstr(name, "name") {
            Ok(n) => n,
            Err(e) => return e,
        };
        match tiermem_pheap::nvh_ckone(name) {
            Ok(_) => 0,
            Err(e) => pfail(e),
        }
    })
}
