//! The real functions behind the hooks: the next definition of each symbol after this library
//! (`dlsym(RTLD_NEXT)`, glibc's or another interposer's), resolved on first use and again in
//! the constructor; where `dlsym` cannot find one (it does not fail on glibc), the system call
//! the function makes. `_exit`/`_Exit` are resolved only in the constructor (`dlsym` takes the
//! loader's lock, which must not be taken from an `_exit` wherever it is called).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// `open`, `open64`, `__open_2`-style two-argument calls are given a mode of 0.
pub type OpenFn = unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int;
/// `openat`, `openat64`.
pub type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint) -> c_int;
/// `__open_2`, `__open64_2` (fortified `open` without a mode).
pub type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
/// `__openat_2`, `__openat64_2`.
pub type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
/// `close`.
pub type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
/// `dup`.
pub type DupFn = unsafe extern "C" fn(c_int) -> c_int;
/// `dup2`.
pub type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
/// `dup3`.
pub type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
/// `read`.
pub type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
/// `pread`, `pread64`.
pub type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t) -> isize;
/// `preadv`, `preadv64`.
pub type PreadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t) -> isize;
/// `preadv2`, `preadv64v2`.
pub type Preadv2Fn =
    unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t, c_int) -> isize;
/// `__read_chk` (fortified `read`).
pub type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, usize) -> isize;
/// `__pread_chk`, `__pread64_chk`.
pub type PreadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t, usize) -> isize;
/// `_exit`, `_Exit`.
pub type ExitFn = unsafe extern "C" fn(c_int) -> !;

fn lookup(name: &CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the next definition after this
    // library.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
}

// Fallbacks: the raw system calls (`syscall(2)` returns -1 with errno set already).
unsafe extern "C" fn sys_open(p: *const c_char, f: c_int, m: c_uint) -> c_int {
    // SAFETY: the raw system call with the caller's arguments (the caller's contract).
    unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, p, f, m) as c_int }
}
unsafe extern "C" fn sys_openat(d: c_int, p: *const c_char, f: c_int, m: c_uint) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_openat, d, p, f, m) as c_int }
}
unsafe extern "C" fn sys_open2(p: *const c_char, f: c_int) -> c_int {
    // SAFETY: as above (no mode: the fortified call's contract is that none is needed).
    unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, p, f, 0) as c_int }
}
unsafe extern "C" fn sys_openat2(d: c_int, p: *const c_char, f: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_openat, d, p, f, 0) as c_int }
}
unsafe extern "C" fn sys_close(fd: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close, fd) as c_int }
}
unsafe extern "C" fn sys_dup(fd: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_dup, fd) as c_int }
}
unsafe extern "C" fn sys_dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // dup2 of an fd onto itself only checks it (dup3 would refuse).
        // SAFETY: as above.
        return if unsafe { libc::syscall(libc::SYS_fcntl, old, libc::F_GETFD) } < 0 {
            -1
        } else {
            new
        };
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_dup3, old, new, 0) as c_int }
}
unsafe extern "C" fn sys_dup3(old: c_int, new: c_int, fl: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_dup3, old, new, fl) as c_int }
}
unsafe extern "C" fn sys_read(fd: c_int, b: *mut c_void, n: usize) -> isize {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_read, fd, b, n) as isize }
}
unsafe extern "C" fn sys_pread(fd: c_int, b: *mut c_void, n: usize, o: libc::off_t) -> isize {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_pread64, fd, b, n, o) as isize }
}
unsafe extern "C" fn sys_preadv(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    o: libc::off_t,
) -> isize {
    // SAFETY: as above; a 64-bit offset goes whole in the low word, the high word is 0.
    unsafe { libc::syscall(libc::SYS_preadv, fd, iov, cnt, o, 0) as isize }
}
unsafe extern "C" fn sys_preadv2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    o: libc::off_t,
    fl: c_int,
) -> isize {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_preadv2, fd, iov, cnt, o, 0, fl) as isize }
}
unsafe extern "C" fn chk_read(fd: c_int, b: *mut c_void, n: usize, len: usize) -> isize {
    if n > len {
        // SAFETY: abort has no preconditions (glibc's __chk_fail does the same).
        unsafe { libc::abort() };
    }
    // SAFETY: as sys_read.
    unsafe { sys_read(fd, b, n) }
}
unsafe extern "C" fn chk_pread(
    fd: c_int,
    b: *mut c_void,
    n: usize,
    o: libc::off_t,
    len: usize,
) -> isize {
    if n > len {
        // SAFETY: as above.
        unsafe { libc::abort() };
    }
    // SAFETY: as sys_pread.
    unsafe { sys_pread(fd, b, n, o) }
}

macro_rules! lazy_real {
    ($(#[$doc:meta])* $name:ident, $sym:literal, $ty:ty, $fallback:expr) => {
        $(#[$doc])*
        #[inline]
        pub fn $name() -> $ty {
            static P: AtomicUsize = AtomicUsize::new(0);
            let mut p = P.load(Relaxed);
            if p == 0 {
                p = lookup($sym);
                if p == 0 {
                    p = $fallback as $ty as usize;
                }
                P.store(p, Relaxed);
            }
            // SAFETY: `p` is the address of a function of type `$ty` (dlsym's answer for the
            // symbol of that C prototype, or our fallback of that type).
            unsafe { std::mem::transmute::<usize, $ty>(p) }
        }
    };
}

lazy_real!(
    /// The real `open`.
    open, c"open", OpenFn, sys_open
);
lazy_real!(
    /// The real `open64`.
    open64, c"open64", OpenFn, sys_open
);
lazy_real!(
    /// The real `openat`.
    openat, c"openat", OpenatFn, sys_openat
);
lazy_real!(
    /// The real `openat64`.
    openat64, c"openat64", OpenatFn, sys_openat
);
lazy_real!(
    /// The real `__open_2`.
    open_2, c"__open_2", Open2Fn, sys_open2
);
lazy_real!(
    /// The real `__open64_2`.
    open64_2, c"__open64_2", Open2Fn, sys_open2
);
lazy_real!(
    /// The real `__openat_2`.
    openat_2, c"__openat_2", Openat2Fn, sys_openat2
);
lazy_real!(
    /// The real `__openat64_2`.
    openat64_2, c"__openat64_2", Openat2Fn, sys_openat2
);
lazy_real!(
    /// The real `close`.
    close, c"close", CloseFn, sys_close
);
lazy_real!(
    /// The real `dup`.
    dup, c"dup", DupFn, sys_dup
);
lazy_real!(
    /// The real `dup2`.
    dup2, c"dup2", Dup2Fn, sys_dup2
);
lazy_real!(
    /// The real `dup3`.
    dup3, c"dup3", Dup3Fn, sys_dup3
);
lazy_real!(
    /// The real `read`.
    read, c"read", ReadFn, sys_read
);
lazy_real!(
    /// The real `pread`.
    pread, c"pread", PreadFn, sys_pread
);
lazy_real!(
    /// The real `pread64`.
    pread64, c"pread64", PreadFn, sys_pread
);
lazy_real!(
    /// The real `preadv`.
    preadv, c"preadv", PreadvFn, sys_preadv
);
lazy_real!(
    /// The real `preadv64`.
    preadv64, c"preadv64", PreadvFn, sys_preadv
);
lazy_real!(
    /// The real `preadv2`.
    preadv2, c"preadv2", Preadv2Fn, sys_preadv2
);
lazy_real!(
    /// The real `preadv64v2`.
    preadv64v2, c"preadv64v2", Preadv2Fn, sys_preadv2
);
lazy_real!(
    /// The real `__read_chk`.
    read_chk, c"__read_chk", ReadChkFn, chk_read
);
lazy_real!(
    /// The real `__pread_chk`.
    pread_chk, c"__pread_chk", PreadChkFn, chk_pread
);
lazy_real!(
    /// The real `__pread64_chk`.
    pread64_chk, c"__pread64_chk", PreadChkFn, chk_pread
);

/// Resolves every function above now (from the constructor), so that the hooks rarely call
/// `dlsym` themselves.
pub fn resolve_all() {
    let _ = (open(), open64(), openat(), openat64());
    let _ = (open_2(), open64_2(), openat_2(), openat64_2());
    let _ = (close(), dup(), dup2(), dup3());
    let _ = (read(), pread(), pread64());
    let _ = (preadv(), preadv64(), preadv2(), preadv64v2());
    let _ = (read_chk(), pread_chk(), pread64_chk());
    for (slot, name) in [(&REAL_EXIT, c"_exit"), (&REAL_UNDERSCORE_EXIT, c"_Exit")] {
        slot.store(lookup(name), Relaxed);
    }
}

/// The real `_exit` and `_Exit` (resolved by [`resolve_all`]; 0 before).
pub static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);
/// See [`REAL_EXIT`].
pub static REAL_UNDERSCORE_EXIT: AtomicUsize = AtomicUsize::new(0);

/// Calls the real `_exit`/`_Exit` in `slot`, or makes the `exit_group` system call.
pub fn exit_with(slot: &AtomicUsize, status: c_int) -> ! {
    let p = slot.load(Relaxed);
    // SAFETY: `p` is dlsym's next definition of `_exit`/`_Exit` (C prototype ExitFn); without
    // it, the system call those make.
    unsafe {
        if p != 0 {
            let f = std::mem::transmute::<usize, ExitFn>(p);
            f(status);
        }
        libc::syscall(libc::SYS_exit_group, status);
    }
    unreachable!("exit_group returned")
}

/// `errno` of the calling thread.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets `errno` of the calling thread.
pub fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
}
