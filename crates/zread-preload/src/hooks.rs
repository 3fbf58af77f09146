//! The interposed functions: the open family records fds on served files, `close` forgets
//! them, the read family serves their reads through z-READ where a page can be remapped. Each
//! calls the real function for everything else, and whenever the library's own path fails or
//! panics: a preload must never break the program.

use crate::table::{self, FALLBACKS, PASSED, ROUTED};
use crate::{active, config, real, Inside};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use tiermem_iocache::zread::PAGE;
use tiermem_iocache::ZOptions;

// ---------------------------------------------------------------------------------------------
// opens and close
// ---------------------------------------------------------------------------------------------

/// `fstat(fd)`'s (device, inode) when `fd` is a regular file.
fn regular(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: stat is plain old data that fstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; fstat touches nothing else.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Records `fd` if it is on a served file (see the crate docs).
fn consider(fd: c_int) {
    let Some(cfg) = config() else { return };
    let Some((dev, ino)) = regular(fd) else {
        return;
    };
    // "/proc/self/fd/N": the kernel's canonical path of what was opened.
    let mut link = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    link[..prefix.len()].copy_from_slice(prefix);
    let mut n = prefix.len();
    let digits = fd.to_string();
    link[n..n + digits.len()].copy_from_slice(digits.as_bytes());
    n += digits.len();
    link[n] = 0;
    let mut path = [0u8; 4096];
    // SAFETY: a NUL-terminated name and a writable buffer of the length given.
    let len = unsafe { libc::readlink(link.as_ptr().cast(), path.as_mut_ptr().cast(), path.len()) };
    let Ok(len) = usize::try_from(len) else {
        return;
    };
    if len >= path.len() || !cfg.matches(&path[..len]) {
        return;
    }
    if table::record(fd, dev, ino) {
        table::add_fd(dev, ino);
    }
}

/// After an open returned `fd`: forget a stale record of that number, record it if served.
fn after_open(fd: c_int, flags: c_int) {
    if fd < 0 {
        return;
    }
    let Some(_inside) = Inside::enter() else {
        // The library's own open: only drop a stale bit (the file table is not touched here,
        // the library may hold its lock).
        let _ = table::unrecord(fd);
        return;
    };
    let e = real::errno();
    let _ = catch_unwind(|| {
        if let Some((dev, ino)) = table::unrecord(fd) {
            // Closed behind our back and reused: that fd is gone from its file.
            if active() {
                table::remove_fd(dev, ino);
            }
        }
        let reject = libc::O_PATH | libc::O_DIRECT;
        if active() && flags & libc::O_ACCMODE == libc::O_RDONLY && flags & reject == 0 {
            consider(fd);
        }
    });
    real::set_errno(e);
}

/// `open(2)` (the mode is read as the third argument, as C passes a variadic one).
///
/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the caller's open, unchanged.
    let fd = unsafe { (real::open())(path, flags, mode) };
    after_open(fd, flags);
    fd
}

/// `open64(2)`: as [`open`].
///
/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the caller's open64, unchanged.
    let fd = unsafe { (real::open64())(path, flags, mode) };
    after_open(fd, flags);
    fd
}

/// `openat(2)`: as [`open`].
///
/// # Safety
/// As `openat(2)`.
#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: the caller's openat, unchanged.
    let fd = unsafe { (real::openat())(dirfd, path, flags, mode) };
    after_open(fd, flags);
    fd
}

/// `openat64(2)`: as [`open`].
///
/// # Safety
/// As `openat(2)`.
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: the caller's openat64, unchanged.
    let fd = unsafe { (real::openat64())(dirfd, path, flags, mode) };
    after_open(fd, flags);
    fd
}

/// `__open_2` (`open` under `_FORTIFY_SOURCE`, no mode): as [`open`].
///
/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's call, unchanged.
    let fd = unsafe { (real::open_2())(path, flags) };
    after_open(fd, flags);
    fd
}

/// `__open64_2`: as [`open`].
///
/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's call, unchanged.
    let fd = unsafe { (real::open64_2())(path, flags) };
    after_open(fd, flags);
    fd
}

/// `__openat_2`: as [`open`].
///
/// # Safety
/// As `openat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's call, unchanged.
    let fd = unsafe { (real::openat_2())(dirfd, path, flags) };
    after_open(fd, flags);
    fd
}

/// `__openat64_2`: as [`open`].
///
/// # Safety
/// As `openat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's call, unchanged.
    let fd = unsafe { (real::openat64_2())(dirfd, path, flags) };
    after_open(fd, flags);
    fd
}

/// `close(2)`: a recorded fd is forgotten first (the last one on a file drops its z-READ
/// file, releasing the lease).
///
/// # Safety
/// As `close(2)`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some((dev, ino)) = table::unrecord(fd) {
        if active() {
            if let Some(_inside) = Inside::enter() {
                let e = real::errno();
                let _ = catch_unwind(|| table::remove_fd(dev, ino));
                real::set_errno(e);
            }
        }
    }
    // SAFETY: the caller's close, unchanged.
    unsafe { (real::close())(fd) }
}

/// After `dup`/`dup2`/`dup3` made `new` a copy of `old`: `new` is forgotten (`dup2` closed
/// what it was), then recorded like `old` if `old` is.
fn after_dup(old: c_int, new: c_int) {
    if new < 0 || old == new {
        return;
    }
    let Some(_inside) = Inside::enter() else {
        let _ = table::unrecord(new);
        return;
    };
    let e = real::errno();
    let _ = catch_unwind(|| {
        if let Some((dev, ino)) = table::unrecord(new) {
            if active() {
                table::remove_fd(dev, ino);
            }
        }
        if active() {
            if let Some((dev, ino)) = table::recorded(old) {
                if table::record(new, dev, ino) {
                    table::add_fd(dev, ino);
                }
            }
        }
    });
    real::set_errno(e);
}

/// `dup(2)`: the copy of a served fd is served too.
///
/// # Safety
/// As `dup(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's dup, unchanged.
    let new = unsafe { (real::dup())(fd) };
    after_dup(fd, new);
    new
}

/// `dup2(2)`: as [`dup`]; what `new` was is forgotten.
///
/// # Safety
/// As `dup2(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: the caller's dup2, unchanged.
    let r = unsafe { (real::dup2())(old, new) };
    after_dup(old, r);
    r
}

/// `dup3(2)`: as [`dup2`].
///
/// # Safety
/// As `dup3(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's dup3, unchanged.
    let r = unsafe { (real::dup3())(old, new, flags) };
    after_dup(old, r);
    r
}

// ---------------------------------------------------------------------------------------------
// reads
// ---------------------------------------------------------------------------------------------

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
}

/// Whether glibc's malloc is the program's (1), not (2), unknown yet (0).
static GLIBC_MALLOC: AtomicUsize = AtomicUsize::new(0);
/// The initial program break (`start_brk`), 0 until read, `usize::MAX` when unavailable.
static START_BRK: AtomicUsize = AtomicUsize::new(0);

fn glibc_malloc() -> bool {
    let mut v = GLIBC_MALLOC.load(Relaxed);
    if v == 0 {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT finds the program's malloc.
        let m = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as usize;
        v = if m == __libc_malloc as *const () as usize {
            1
        } else {
            2
        };
        GLIBC_MALLOC.store(v, Relaxed);
    }
    v == 1
}

/// `start_brk`: field 47 of `/proc/self/stat` (after the parenthesised command name).
fn start_brk() -> Option<usize> {
    let mut v = START_BRK.load(Relaxed);
    if v == 0 {
        v = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                let rest = &s[s.rfind(')')? + 1..];
                // Fields from 3 (state) on: 47 is the 45th of them.
                rest.split_ascii_whitespace().nth(44)?.parse::<usize>().ok()
            })
            .filter(|&b| b != 0)
            .unwrap_or(usize::MAX);
        START_BRK.store(v, Relaxed);
    }
    (v != usize::MAX).then_some(v)
}

/// Whether the buffer `addr..addr+len` may be remapped (see `config::Buffers`).
fn buffer_allowed(addr: usize, len: usize) -> bool {
    match config().map(|c| c.buffers) {
        Some(crate::config::Buffers::Any) => true,
        Some(crate::config::Buffers::Heap) => {
            if !glibc_malloc() {
                return false;
            }
            let Some(lo) = start_brk() else { return false };
            // SAFETY: sbrk(0) only reads the current break.
            let hi = unsafe { libc::sbrk(0) } as usize;
            lo <= addr && addr.checked_add(len).is_some_and(|end| end <= hi)
        }
        None => false,
    }
}

fn options() -> ZOptions {
    ZOptions {
        model: config().map_or(true, |c| c.model),
        ..ZOptions::default()
    }
}

/// Serves a read of `len` bytes into `buf` from the recorded `fd` at `off` (`None`: at the
/// fd's offset, which is advanced) through z-READ. `None`: not served (the caller makes the
/// real call; nothing observable has changed but possibly the bytes of `buf`).
fn serve(fd: c_int, buf: *mut c_void, len: usize, off: Option<i64>) -> Option<isize> {
    if !active() {
        return None;
    }
    let (dev, ino) = table::recorded(fd)?;
    let _inside = Inside::enter()?;
    if buf.is_null() || len == 0 || len > isize::MAX as usize {
        return None;
    }
    let e = real::errno();
    let r = catch_unwind(AssertUnwindSafe(|| {
        serve_inner(fd, buf, len, off, dev, ino)
    }))
    .unwrap_or_else(|_| {
        FALLBACKS.fetch_add(1, Relaxed);
        None
    });
    real::set_errno(e);
    r
}

fn serve_inner(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    off: Option<i64>,
    dev: u64,
    ino: u64,
) -> Option<isize> {
    let pos = match off {
        Some(o) => u64::try_from(o).ok()?,
        None => {
            // SAFETY: lseek on a descriptor touches no memory.
            let p = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
            u64::try_from(p).ok()?
        }
    };
    let addr = buf as usize;
    let head = (PAGE - addr % PAGE) % PAGE;
    if (addr as u64 ^ pos) % PAGE as u64 != 0 || len < head + PAGE || !buffer_allowed(addr, len) {
        PASSED.fetch_add(1, Relaxed);
        return None;
    }
    // Whether the model was asked already (and said remap): zread_into need not ask again.
    let mut remap_decided = false;
    if let Some(z) = table::ready(dev, ino) {
        remap_decided = z.would_remap(pos, buf.cast::<u8>(), len);
        if !remap_decided {
            // The loss model would copy: the program's own read does that best, and needs no
            // check that the fd is still the file's (the fstat below costs as much as a 4 KiB
            // copy).
            PASSED.fetch_add(1, Relaxed);
            return None;
        }
    }
    if regular(fd) != Some((dev, ino)) {
        // Closed behind our back and reused for something else.
        if table::unrecord(fd).is_some() {
            table::remove_fd(dev, ino);
        }
        return None;
    }
    let z = table::zfile(fd, dev, ino, &options())?;
    // SAFETY: buf..buf+len is the caller's writable buffer (the read's contract), lent to us
    // for the duration of the call.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    let r = if remap_decided {
        z.zread_into_remapping(pos, b)
    } else {
        z.zread_into(pos, b)
    };
    let n = match r {
        Ok(n) => n,
        Err(_) => {
            FALLBACKS.fetch_add(1, Relaxed);
            return None;
        }
    };
    if off.is_none() {
        // SAFETY: as above.
        let to = unsafe { libc::lseek(fd, (pos + n as u64) as libc::off_t, libc::SEEK_SET) };
        if to < 0 {
            // The offset did not move: the real read redoes it.
            FALLBACKS.fetch_add(1, Relaxed);
            return None;
        }
    }
    ROUTED.fetch_add(1, Relaxed);
    Some(n as isize)
}

/// The one buffer of a one-`iovec` vectored read.
///
/// # Safety
/// `iov` points to `cnt` readable `iovec`s when `cnt` is 1.
unsafe fn single(iov: *const libc::iovec, cnt: c_int) -> Option<(*mut c_void, usize)> {
    if cnt != 1 || iov.is_null() {
        return None;
    }
    // SAFETY: one readable iovec (this function's contract, the caller's read contract).
    let v = unsafe { *iov };
    Some((v.iov_base, v.iov_len))
}

/// `read(2)`: a served fd's read goes through z-READ at its offset.
///
/// # Safety
/// As `read(2)`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize {
    if let Some(n) = serve(fd, buf, count, None) {
        return n;
    }
    // SAFETY: the caller's read, unchanged.
    unsafe { (real::read())(fd, buf, count) }
}

/// `pread(2)`: a served fd's read goes through z-READ.
///
/// # Safety
/// As `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn pread(
    fd: c_int,
    buf: *mut c_void,
    count: usize,
    off: libc::off_t,
) -> isize {
    if let Some(n) = serve(fd, buf, count, Some(off)) {
        return n;
    }
    // SAFETY: the caller's pread, unchanged.
    unsafe { (real::pread())(fd, buf, count, off) }
}

/// `pread64(2)`: as [`pread`].
///
/// # Safety
/// As `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn pread64(
    fd: c_int,
    buf: *mut c_void,
    count: usize,
    off: libc::off_t,
) -> isize {
    if let Some(n) = serve(fd, buf, count, Some(off)) {
        return n;
    }
    // SAFETY: the caller's pread64, unchanged.
    unsafe { (real::pread64())(fd, buf, count, off) }
}

/// A vectored read of a served fd with one `iovec` and a usable offset (`off`: as
/// [`serve`]'s; `None`: flags the library does not serve), through z-READ; `None`: the real
/// call.
///
/// # Safety
/// `iov` points to `cnt` readable `iovec`s.
unsafe fn serve_vectored(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<Option<i64>>,
) -> Option<isize> {
    table::recorded(fd)?;
    // SAFETY: this function's contract.
    let (b, l) = unsafe { single(iov, cnt) }?;
    serve(fd, b, l, off?)
}

/// `preadv(2)`: one `iovec` on a served fd goes through z-READ.
///
/// # Safety
/// As `preadv(2)`.
#[no_mangle]
pub unsafe extern "C" fn preadv(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    // SAFETY: the caller passes cnt readable iovecs.
    if let Some(n) = unsafe { serve_vectored(fd, iov, cnt, Some(Some(off))) } {
        return n;
    }
    // SAFETY: the caller's preadv, unchanged.
    unsafe { (real::preadv())(fd, iov, cnt, off) }
}

/// `preadv64(2)`: as [`preadv`].
///
/// # Safety
/// As `preadv(2)`.
#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
) -> isize {
    // SAFETY: the caller passes cnt readable iovecs.
    if let Some(n) = unsafe { serve_vectored(fd, iov, cnt, Some(Some(off))) } {
        return n;
    }
    // SAFETY: the caller's preadv64, unchanged.
    unsafe { (real::preadv64())(fd, iov, cnt, off) }
}

/// The offset argument of `preadv2` for a request z-READ may serve: `Some(None)` for the fd's
/// offset (-1), `Some(Some(off))`, or `None` (flags set: the real call).
fn v2_offset(off: libc::off_t, flags: c_int) -> Option<Option<i64>> {
    if flags != 0 {
        return None;
    }
    Some(if off == -1 { None } else { Some(off) })
}

/// `preadv2(2)`: one `iovec` and no flags on a served fd goes through z-READ (offset -1: at
/// the fd's offset, advanced).
///
/// # Safety
/// As `preadv2(2)`.
#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the caller passes cnt readable iovecs.
    if let Some(n) = unsafe { serve_vectored(fd, iov, cnt, v2_offset(off, flags)) } {
        return n;
    }
    // SAFETY: the caller's preadv2, unchanged.
    unsafe { (real::preadv2())(fd, iov, cnt, off, flags) }
}

/// `preadv64v2(2)`: as [`preadv2`].
///
/// # Safety
/// As `preadv2(2)`.
#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> isize {
    // SAFETY: the caller passes cnt readable iovecs.
    if let Some(n) = unsafe { serve_vectored(fd, iov, cnt, v2_offset(off, flags)) } {
        return n;
    }
    // SAFETY: the caller's preadv64v2, unchanged.
    unsafe { (real::preadv64v2())(fd, iov, cnt, off, flags) }
}

/// `__read_chk` (`read` under `_FORTIFY_SOURCE`): as [`read`] when the buffer is large enough
/// (else the real one, which aborts).
///
/// # Safety
/// As `read(2)`.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    count: usize,
    buflen: usize,
) -> isize {
    if count <= buflen {
        if let Some(n) = serve(fd, buf, count, None) {
            return n;
        }
    }
    // SAFETY: the caller's call, unchanged.
    unsafe { (real::read_chk())(fd, buf, count, buflen) }
}

/// `__pread_chk`: as [`pread`] when the buffer is large enough.
///
/// # Safety
/// As `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    count: usize,
    off: libc::off_t,
    buflen: usize,
) -> isize {
    if count <= buflen {
        if let Some(n) = serve(fd, buf, count, Some(off)) {
            return n;
        }
    }
    // SAFETY: the caller's call, unchanged.
    unsafe { (real::pread_chk())(fd, buf, count, off, buflen) }
}

/// `__pread64_chk`: as [`pread`] when the buffer is large enough.
///
/// # Safety
/// As `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    count: usize,
    off: libc::off_t,
    buflen: usize,
) -> isize {
    if count <= buflen {
        if let Some(n) = serve(fd, buf, count, Some(off)) {
            return n;
        }
    }
    // SAFETY: the caller's call, unchanged.
    unsafe { (real::pread64_chk())(fd, buf, count, off, buflen) }
}
