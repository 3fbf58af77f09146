//! C ABI of z-READ (`tiermem-iocache`'s `ZFile`): open a file for zero-copy reads (by path or
//! from a caller's fd), take read-only views of the page cache and release them, check a view,
//! read into a caller's buffer (remapping its page-aligned pages onto the page cache where that
//! pays), write through the file in exclusive mode, read the counters, close.
//!
//! Errno mapping (functions returning `int`/`ptrdiff_t` return it negated; those returning a
//! pointer return NULL and set `errno` to it; `tiermem_last_error()` has the text either way):
//! - a NULL pointer argument, an unknown zero-copy mode, a view released through another file:
//!   `EINVAL`; a closed or never-issued file or view handle: `EBADF`;
//! - a path or fd that is a directory: `EISDIR`; another kind of non-regular file (pipe,
//!   socket, device): `EINVAL`; an fd open write-only: `EBADF` (as `read(2)` on it);
//! - `tiermem_zread_write` on a file not opened with `TIERMEM_ZREAD_EXCLUSIVE`: `EPERM`;
//! - a view one of whose pages vanished (the file was truncated under it while privatisation
//!   was off, and the SIGBUS guard read zeros there): `ESTALE` from `tiermem_zread_check`;
//! - a failed system call: its errno (`ENOENT`, `EACCES`, ...), `EIO` when it has none;
//! - an internal error (a caught panic): `EIO`.

use crate::error::{cstr, fail, guard, handles, OnPanic};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::ffi::{c_char, c_int};
use std::os::fd::RawFd;
use tiermem_iocache::{Error, View, ZFile, ZOptions, ZStats, ZeroCopy};

/// Zero copy under a read lease (the default): impossible while anyone has the file open for
/// writing; then every read copies until the lease can be taken again.
pub const TIERMEM_ZREAD_LEASE: c_int = 0;
/// Zero copy because the caller declares every write of the file goes through
/// `tiermem_zread_write` (the file is opened read-write, no lease).
pub const TIERMEM_ZREAD_EXCLUSIVE: c_int = 1;
/// Never zero copy: every read copies (the baseline, through the same API).
pub const TIERMEM_ZREAD_NEVER: c_int = 2;

/// A file opened for z-READ (opaque). Usable from several threads at once; closed once, by
/// `tiermem_zread_close`.
pub struct TiermemZfile {
    z: ZFile,
    mode: ZeroCopy,
    /// The views handed out and not yet released (addresses of their handles).
    views: Mutex<HashSet<usize>>,
}

/// A view returned by `tiermem_zread` (opaque): its bytes stay valid and unchanged until
/// `tiermem_zread_release` or the close of its file.
pub struct TiermemZview {
    view: View,
    /// The file handle it came from.
    owner: usize,
}

/// Options of `tiermem_zread_open` (`tiermem_zread_options_default` fills the defaults).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TiermemZreadOptions {
    /// TIERMEM_ZREAD_LEASE (default), _EXCLUSIVE or _NEVER.
    pub zero_copy: c_int,
    /// Mapped, unreferenced view bytes above which released view pages are unmapped in bulk
    /// (default 256 MiB).
    pub zap_after: u64,
    /// Non-zero (default): when the lease breaks, live views and remapped buffers are made
    /// private so they keep their bytes. 0 only to test the SIGBUS guard.
    pub privatise: c_int,
    /// Non-zero (default): `tiermem_zread_into` asks the loss model whether a remap pays;
    /// 0: it remaps whenever the buffer and offset are equally page-aligned.
    pub model: c_int,
}

/// A file's counters since it was opened (`tiermem_zread_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TiermemZreadStats {
    /// `tiermem_zread` calls.
    pub zreads: u64,
    /// Views returned without a copy.
    pub zero_copy_views: u64,
    /// Views that are copies (no lease, or a page could not be mapped).
    pub copied_views: u64,
    /// `MADV_POPULATE_READ` calls for views.
    pub populate_calls: u64,
    /// Pages those calls mapped.
    pub populated_pages: u64,
    /// Bulk unmaps of released view pages.
    pub zaps: u64,
    /// Pages those unmapped.
    pub zapped_pages: u64,
    /// `tiermem_zread_into` calls.
    pub into_calls: u64,
    /// Buffer pages `tiermem_zread_into` remapped onto the page cache.
    pub into_remapped_pages: u64,
    /// Bytes `tiermem_zread_into` copied (unaligned head and tail, the model's choice, no
    /// lease).
    pub into_copied_bytes: u64,
    /// Requests the loss model sent to the copy path.
    pub model_copies: u64,
    /// Leases broken by another opener for writing or a truncation.
    pub lease_breaks: u64,
    /// View pages made private on breaks or exclusive writes.
    pub privatised_pages: u64,
    /// Remapped buffers made private on breaks or exclusive writes.
    pub privatised_buffers: u64,
    /// Writes through `tiermem_zread_write`.
    pub writes: u64,
    /// 1 when reads are zero-copy now (a lease is held, or exclusive mode), else 0.
    pub zero_copy_now: c_int,
}

impl From<ZStats> for TiermemZreadStats {
    fn from(s: ZStats) -> Self {
        TiermemZreadStats {
            zreads: s.zreads,
            zero_copy_views: s.zero_copy_views,
            copied_views: s.copied_views,
            populate_calls: s.populate_calls,
            populated_pages: s.populated_pages,
            zaps: s.zaps,
            zapped_pages: s.zapped_pages,
            into_calls: s.into_calls,
            into_remapped_pages: s.into_remapped_pages,
            into_copied_bytes: s.into_copied_bytes,
            model_copies: s.model_copies,
            lease_breaks: s.lease_breaks,
            privatised_pages: s.privatised_pages,
            privatised_buffers: s.privatised_buffers,
            writes: s.writes,
            zero_copy_now: 0,
        }
    }
}

/// Sets the calling thread's `errno` (for the functions that return NULL on failure).
fn set_errno(code: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = code.abs() };
}

impl OnPanic for *mut TiermemZfile {
    fn on_panic() -> Self {
        set_errno(libc::EIO);
        std::ptr::null_mut()
    }
}

impl OnPanic for *mut TiermemZview {
    fn on_panic() -> Self {
        set_errno(libc::EIO);
        std::ptr::null_mut()
    }
}

impl OnPanic for isize {
    fn on_panic() -> Self {
        -(libc::EIO as isize)
    }
}

/// `-errno` for an iocache error (see the mapping at the top), recorded as the last error.
/// `is_dir` tells a directory from other non-regular files.
fn zread_fail(e: Error, is_dir: impl FnOnce() -> bool) -> c_int {
    let errno = match &e {
        Error::NotRegular { .. } => {
            if is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            }
        }
        Error::NotReadable { .. } => libc::EBADF,
        Error::Truncated => libc::ESTALE,
        Error::InvalidOption(_) => libc::EINVAL,
        Error::NoDirectIo { .. } => libc::EOPNOTSUPP,
        Error::AllPinned { .. } | Error::Pinned { .. } => libc::EBUSY,
        Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
    };
    fail(errno, e)
}

fn fd_is_dir(fd: RawFd) -> bool {
    // SAFETY: stat is plain old data that fstat fills for a valid fd (an invalid fd fails).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; fstat on a caller-owned fd number.
    unsafe { libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR }
}

fn to_options(o: *const TiermemZreadOptions) -> Result<ZOptions, c_int> {
    if o.is_null() {
        return Ok(ZOptions::default());
    }
    // SAFETY: non-NULL options point to a readable struct (ABI contract).
    let o = unsafe { &*o };
    let zero_copy = match o.zero_copy {
        TIERMEM_ZREAD_LEASE => ZeroCopy::Lease,
        TIERMEM_ZREAD_EXCLUSIVE => ZeroCopy::Exclusive,
        TIERMEM_ZREAD_NEVER => ZeroCopy::Never,
        m => return Err(fail(libc::EINVAL, format!("unknown zero_copy mode {m}"))),
    };
    Ok(ZOptions {
        zero_copy,
        zap_after: usize::try_from(o.zap_after).unwrap_or(usize::MAX),
        privatise: o.privatise != 0,
        model: o.model != 0,
    })
}

fn issue_file(z: ZFile, mode: ZeroCopy) -> *mut TiermemZfile {
    handles::issue(TiermemZfile {
        z,
        mode,
        views: Mutex::new(HashSet::new()),
    })
}

/// Fills `*out` with the default options (lease mode, zap after 256 MiB, privatise on, model
/// on). Returns 0, or -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn tiermem_zread_options_default(out: *mut TiermemZreadOptions) -> c_int {
    guard("tiermem_zread_options_default", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let d = ZOptions::default();
        // SAFETY: out is non-NULL and points to writable storage (ABI contract).
        unsafe {
            *out = TiermemZreadOptions {
                zero_copy: TIERMEM_ZREAD_LEASE,
                zap_after: d.zap_after as u64,
                privatise: c_int::from(d.privatise),
                model: c_int::from(d.model),
            }
        };
        0
    })
}

/// Opens the regular file `path` for z-READ (`opts` NULL: defaults): read-only, or read-write
/// in exclusive mode. In lease mode a lease that cannot be taken now (the file is open for
/// writing somewhere) leaves the file copying until it can. Returns the handle, or NULL with
/// `errno` set (see the mapping at the top of this file).
#[no_mangle]
pub extern "C" fn tiermem_zread_open(
    path: *const c_char,
    opts: *const TiermemZreadOptions,
) -> *mut TiermemZfile {
    guard("tiermem_zread_open", || {
        let r = (|| {
            let path = cstr(path, "path")?;
            let o = to_options(opts)?;
            let mode = o.zero_copy;
            match ZFile::open(path, o) {
                Ok(z) => Ok(issue_file(z, mode)),
                Err(e) => Err(zread_fail(e, || std::path::Path::new(path).is_dir())),
            }
        })();
        r.unwrap_or_else(|e| {
            set_errno(e);
            std::ptr::null_mut()
        })
    })
}

/// Opens the file behind the caller's `fd` (which stays the caller's: z-READ opens its own
/// description of the same file) for z-READ. A write-only fd is `EBADF`, a directory
/// `EISDIR`, a pipe or socket `EINVAL`. Returns the handle, or NULL with `errno` set.
#[no_mangle]
pub extern "C" fn tiermem_zread_open_fd(
    fd: c_int,
    opts: *const TiermemZreadOptions,
) -> *mut TiermemZfile {
    guard("tiermem_zread_open_fd", || {
        let r = (|| {
            let o = to_options(opts)?;
            let mode = o.zero_copy;
            match ZFile::from_fd(fd, o) {
                Ok(z) => Ok(issue_file(z, mode)),
                Err(e) => Err(zread_fail(e, || fd_is_dir(fd))),
            }
        })();
        r.unwrap_or_else(|e| {
            set_errno(e);
            std::ptr::null_mut()
        })
    })
}

/// Reads `len` bytes at `off` (fewer at end of file, 0 past it) as a view: stores the address
/// of its bytes in `*out_ptr` and their count in `*out_len`. The bytes are the page cache's own
/// pages when zero copy is allowed (see `tiermem_zread_view_is_zero_copy`), else a private
/// copy; either way they are read-only and do not change until the view is released, whoever
/// writes or truncates the file meanwhile. Never raises SIGBUS. Returns the view, or NULL with
/// `errno` set (EINVAL for a NULL argument, EBADF for a closed file, a read's errno).
#[no_mangle]
pub extern "C" fn tiermem_zread(
    z: *const TiermemZfile,
    off: u64,
    len: usize,
    out_ptr: *mut *const u8,
    out_len: *mut usize,
) -> *mut TiermemZview {
    guard("tiermem_zread", || {
        let r = (|| {
            let h = handles::get(z, "zread file")?;
            if out_ptr.is_null() || out_len.is_null() {
                return Err(fail(libc::EINVAL, "out_ptr or out_len is NULL"));
            }
            let view = h.z.zread(off, len).map_err(|e| zread_fail(e, || false))?;
            let (p, n) = (view.as_ptr(), view.len());
            let v = handles::issue(TiermemZview {
                view,
                owner: z as usize,
            });
            h.views.lock().insert(v as usize);
            // SAFETY: both out-pointers were checked non-NULL and are writable (ABI contract).
            unsafe {
                *out_ptr = p;
                *out_len = n;
            }
            Ok(v)
        })();
        r.unwrap_or_else(|e| {
            set_errno(e);
            std::ptr::null_mut()
        })
    })
}

/// Releases a view of `z`: its bytes must not be read afterwards. Returns 0, -EINVAL when the
/// view is NULL or belongs to another file, -EBADF when `z` or the view is not open.
#[no_mangle]
pub extern "C" fn tiermem_zread_release(z: *const TiermemZfile, view: *mut TiermemZview) -> c_int {
    guard("tiermem_zread_release", || {
        let h = match handles::get(z, "zread file") {
            Ok(h) => h,
            Err(e) => return e,
        };
        let v = match handles::get(view.cast_const(), "zread view") {
            Ok(v) => v,
            Err(e) => return e,
        };
        if v.owner != z as usize || !h.views.lock().remove(&(view as usize)) {
            return fail(
                libc::EINVAL,
                format!("view {view:p} was not taken from zread file {z:p}"),
            );
        }
        match handles::take(view, "zread view") {
            Ok(v) => {
                drop(v);
                0
            }
            Err(e) => e,
        }
    })
}

/// Whether a view's bytes are the file's: 0 when they are, -ESTALE when one of its pages
/// vanished under it (the file was truncated while privatisation was off, and the SIGBUS guard
/// read zeros there), -EINVAL/-EBADF for a NULL or released view.
#[no_mangle]
pub extern "C" fn tiermem_zread_check(view: *const TiermemZview) -> c_int {
    guard("tiermem_zread_check", || {
        let v = match handles::get(view, "zread view") {
            Ok(v) => v,
            Err(e) => return e,
        };
        match v.view.check() {
            Ok(()) => 0,
            Err(e) => zread_fail(e, || false),
        }
    })
}

/// 1 when the view's bytes are the page cache's own pages (no copy was made), 0 when they are a
/// copy, -EINVAL/-EBADF for a NULL or released view.
#[no_mangle]
pub extern "C" fn tiermem_zread_view_is_zero_copy(view: *const TiermemZview) -> c_int {
    guard("tiermem_zread_view_is_zero_copy", || {
        match handles::get(view, "zread view") {
            Ok(v) => c_int::from(v.view.is_zero_copy()),
            Err(e) => e,
        }
    })
}

/// Reads `len` bytes at `off` into `buf` (fewer at end of file; the rest of `buf` is zeroed).
/// Where `buf` and `off` are equally page-aligned, whole pages of `buf` are remapped
/// copy-on-write onto the page cache when zero copy is allowed and the loss model (or
/// `model = 0`) says so; everything else is copied. Remapped pages become a private file
/// mapping: keep such buffers for I/O, and do not hand them back to an allocator that assumes
/// `MADV_DONTNEED` zero-fills memory (glibc's thread arenas, jemalloc). Returns the bytes read
/// (≥ 0) or -errno.
#[no_mangle]
pub extern "C" fn tiermem_zread_into(
    z: *const TiermemZfile,
    off: u64,
    buf: *mut u8,
    len: usize,
) -> isize {
    guard("tiermem_zread_into", || {
        let h = match handles::get(z, "zread file") {
            Ok(h) => h,
            Err(e) => return e as isize,
        };
        if buf.is_null() {
            return fail(libc::EINVAL, "buf is NULL") as isize;
        }
        // SAFETY: buf..buf+len is writable memory of the caller, not used by anything else
        // during the call (ABI contract).
        let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        match h.z.zread_into(off, b) {
            Ok(n) => n.min(isize::MAX as usize) as isize,
            Err(e) => zread_fail(e, || false) as isize,
        }
    })
}

/// Writes `len` bytes of `buf` at `off` (TIERMEM_ZREAD_EXCLUSIVE only, else -EPERM): live views
/// of the written pages keep their old bytes, and buffers remapped onto them are made private
/// first. Returns 0 or -errno.
#[no_mangle]
pub extern "C" fn tiermem_zread_write(
    z: *const TiermemZfile,
    off: u64,
    buf: *const u8,
    len: usize,
) -> c_int {
    guard("tiermem_zread_write", || {
        let h = match handles::get(z, "zread file") {
            Ok(h) => h,
            Err(e) => return e,
        };
        if buf.is_null() && len > 0 {
            return fail(libc::EINVAL, "buf is NULL");
        }
        if h.mode != ZeroCopy::Exclusive {
            return fail(
                libc::EPERM,
                "tiermem_zread_write needs a file opened with TIERMEM_ZREAD_EXCLUSIVE \
                 (the file's writes must all go through z-READ)",
            );
        }
        let data = if len == 0 {
            &[][..]
        } else {
            // SAFETY: buf..buf+len is readable memory of the caller (ABI contract).
            unsafe { std::slice::from_raw_parts(buf, len) }
        };
        match h.z.write_at(off, data) {
            Ok(()) => 0,
            Err(e) => zread_fail(e, || false),
        }
    })
}

/// 1 when reads of `z` are zero-copy now; 0 when they copy, with the reason as
/// `tiermem_last_error()` (no lease: the file is open for writing somewhere; the lease was
/// broken; TIERMEM_ZREAD_NEVER); -EINVAL/-EBADF for a bad handle.
#[no_mangle]
pub extern "C" fn tiermem_zread_is_zero_copy(z: *const TiermemZfile) -> c_int {
    guard("tiermem_zread_is_zero_copy", || {
        let h = match handles::get(z, "zread file") {
            Ok(h) => h,
            Err(e) => return e,
        };
        match h.z.zero_copy_reason() {
            None => 1,
            Some(why) => {
                fail(0, why);
                0
            }
        }
    })
}

/// Fills `*out` with the counters of `z` since it was opened. Returns 0 or -errno.
#[no_mangle]
pub extern "C" fn tiermem_zread_stats(
    z: *const TiermemZfile,
    out: *mut TiermemZreadStats,
) -> c_int {
    guard("tiermem_zread_stats", || {
        let h = match handles::get(z, "zread file") {
            Ok(h) => h,
            Err(e) => return e,
        };
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let mut s = TiermemZreadStats::from(h.z.stats());
        s.zero_copy_now = c_int::from(h.z.zero_copy_reason().is_none());
        // SAFETY: out was checked non-NULL and is writable (ABI contract).
        unsafe { *out = s };
        0
    })
}

/// Releases every view of `z` still held (their bytes must not be read afterwards) and closes
/// it (its lease is released; buffers it remapped keep their bytes). Returns 0, or
/// -EINVAL/-EBADF for a NULL or already closed handle.
#[no_mangle]
pub extern "C" fn tiermem_zread_close(z: *mut TiermemZfile) -> c_int {
    guard("tiermem_zread_close", || {
        let h = match handles::take(z, "zread file") {
            Ok(h) => h,
            Err(e) => return e,
        };
        let views: Vec<usize> = h.views.lock().drain().collect();
        for v in views {
            let _ = handles::take(v as *mut TiermemZview, "zread view");
        }
        drop(h);
        0
    })
}

/// `tiermem_zread_into` on the file behind the caller's `fd`, with default options (lease
/// mode): the file is opened for z-READ at the first call and kept (recognised by device and
/// inode on every call, an `fstat`) until `tiermem_zforget(fd)`. Returns the bytes read or
/// -errno (-EBADF for a write-only fd, -EINVAL for a NULL buffer or a non-regular file).
#[no_mangle]
pub extern "C" fn tiermem_zread_into_fd(fd: c_int, off: u64, buf: *mut u8, len: usize) -> isize {
    guard("tiermem_zread_into_fd", || {
        if buf.is_null() {
            return fail(libc::EINVAL, "buf is NULL") as isize;
        }
        // SAFETY: buf..buf+len is writable memory of the caller, not used by anything else
        // during the call (ABI contract).
        let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        match tiermem_iocache::zread_into(fd, off, b) {
            Ok(n) => n.min(isize::MAX as usize) as isize,
            Err(e) => zread_fail(e, || fd_is_dir(fd)) as isize,
        }
    })
}

/// Forgets the z-READ state of the caller's `fd` (call before closing it, to release the lease
/// at once). Returns 0.
#[no_mangle]
pub extern "C" fn tiermem_zforget(fd: c_int) -> c_int {
    guard("tiermem_zforget", || {
        tiermem_iocache::zforget(fd);
        0
    })
}
