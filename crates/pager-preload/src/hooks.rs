//! The exported functions: the malloc family and the mapping calls (large requests served from
//! the arena), and the I/O system calls that pin arena buffers in DRAM while the kernel uses
//! them. Each one's fast path is a compare or two and a call of the real function.
//!
//! The real functions are the next definitions after this library (`dlsym(RTLD_NEXT)`),
//! resolved once in the constructor (never lazily: a swap-file `pread` in the page-in path runs
//! in a signal handler); before that, or where `dlsym` finds nothing, the raw system call. The
//! malloc family's real functions are glibc's `__libc_*` names, always there.

use crate::arena::PAGE;
use crate::next::{self, Route};
use crate::{__libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_realloc};
use crate::{arena_for, arena_ready, in_arena, pin_max, COUNTERS};
use crate::{inside, libheap};
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn bump(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Real functions.

macro_rules! real_slots {
    ($($slot:ident = $name:literal;)*) => {
        $(static $slot: AtomicUsize = AtomicUsize::new(0);)*
        /// Resolves every real function (the constructor calls this).
        pub(crate) fn resolve_real() {
            $(
                // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the next definition.
                let f = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) };
                $slot.store(f as usize, Relaxed);
            )*
        }
    };
}

/// glibc's own `malloc_usable_size` (the versioned symbol): the small blocks this library hands
/// out come from glibc, so their size must be asked of glibc even when the program links
/// another allocator after it (redis-server links jemalloc, whose unversioned
/// `malloc_usable_size` would be next and crash on a glibc block).
static R_USABLE: AtomicUsize = AtomicUsize::new(0);

/// Resolves [`R_USABLE`] (the constructor calls this).
pub(crate) fn resolve_glibc_usable() {
    // SAFETY: dlvsym with NUL-terminated name and version.
    let f = unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"malloc_usable_size".as_ptr(),
            c"GLIBC_2.2.5".as_ptr(),
        )
    };
    R_USABLE.store(f as usize, Relaxed);
}

real_slots! {
    R_MMAP = "mmap";
    R_MUNMAP = "munmap";
    R_MREMAP = "mremap";
    R_MADVISE = "madvise";
    R_READ = "read";
    R_WRITE = "write";
    R_PREAD = "pread64";
    R_PWRITE = "pwrite64";
    R_READV = "readv";
    R_WRITEV = "writev";
    R_RECV = "recv";
    R_RECVFROM = "recvfrom";
    R_RECVMSG = "recvmsg";
    R_SEND = "send";
    R_SENDTO = "sendto";
    R_SENDMSG = "sendmsg";
    R_FREAD = "fread";
    R_FREAD_UNLOCKED = "fread_unlocked";
    R_FWRITE = "fwrite";
    R_FWRITE_UNLOCKED = "fwrite_unlocked";
    R_SIGACTION = "sigaction";
    R_EPOLL_WAIT = "epoll_wait";
    R_EPOLL_PWAIT = "epoll_pwait";
    R_POLL = "poll";
    R_PPOLL = "ppoll";
}

/// Calls the real function in `$slot` with type `$ty`, or the raw system call `$sys`.
macro_rules! call_real {
    ($slot:ident as $ty:ty, $sys:expr, ($($a:expr),*)) => {{
        let f = $slot.load(Relaxed);
        if f == 0 {
            // SAFETY: the raw system call with the caller's arguments (the caller's contract).
            unsafe { libc::syscall($sys, $($a),*) as _ }
        } else {
            // SAFETY: `f` is the next definition of this very function, with this signature.
            let f: $ty = unsafe { std::mem::transmute::<usize, $ty>(f) };
            // SAFETY: the caller's arguments, passed on unchanged (the caller's contract).
            unsafe { f($($a),*) }
        }
    }};
}

type MmapFn =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
type MremapFn = unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void;
type MadviseFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;
type RwFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type PrwFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t) -> isize;
type VecFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize;
type SockFn = unsafe extern "C" fn(c_int, *mut c_void, usize, c_int) -> isize;
type SockAddrFn = unsafe extern "C" fn(
    c_int,
    *mut c_void,
    usize,
    c_int,
    *mut libc::sockaddr,
    *mut libc::socklen_t,
) -> isize;
type MsgFn = unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> isize;

fn real_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    call_real!(
        R_MADVISE as MadviseFn,
        libc::SYS_madvise,
        (addr, len, advice)
    )
}

/// Drops arena pages (`MADV_DONTNEED`: the pager frees their slots, they read as zeros).
pub(crate) fn drop_pages(addr: usize, len: usize) {
    real_madvise(addr as *mut c_void, len, libc::MADV_DONTNEED);
}

// ---------------------------------------------------------------------------------------------
// The malloc family.

/// A block of the library's own heap (tiermem code calling while the program has its own
/// allocator: see [`libheap`]); null and `ENOMEM` when it has none that large.
fn lib_block(size: usize, align: usize) -> *mut c_void {
    let p = libheap::alloc(size, align);
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

/// A zeroed arena block of `size` bytes aligned to `align`, counted; null when the arena is not
/// for this request or is full.
fn arena_block(size: usize, align: usize) -> *mut c_void {
    match arena_for(size) {
        Some(a) => match a.alloc(size, align) {
            Some(p) => {
                bump(&COUNTERS.arena_allocs);
                p as *mut c_void
            }
            None => {
                bump(&COUNTERS.arena_full);
                ptr::null_mut()
            }
        },
        None => ptr::null_mut(),
    }
}

/// `malloc`: the program's own allocator when it is not glibc's (module `next`); else a large
/// request from the arena, the rest from glibc.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    match next::route() {
        Route::Next if inside() => return lib_block(size, 16),
        // SAFETY: malloc's contract.
        Route::Next => return unsafe { next::malloc(size) },
        // SAFETY: glibc's malloc.
        Route::Early => return next::note_early(unsafe { __libc_malloc(size) }),
        Route::Glibc => {}
    }
    let p = arena_block(size, PAGE);
    if !p.is_null() {
        return p;
    }
    // SAFETY: glibc's malloc.
    unsafe { __libc_malloc(size) }
}

/// `free`: an arena block goes back to the arena (its pages dropped), the rest to glibc.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if libheap::owns(p as usize) {
        return libheap::free(p as usize);
    }
    let route = next::route();
    if route != Route::Glibc {
        // A glibc block handed out during the lookup goes back to glibc (and is forgotten);
        // with the next allocator chosen, every other block is its.
        if next::early(p as usize, true) || route == Route::Early {
            // SAFETY: a glibc block handed out during the lookup.
            unsafe { __libc_free(p) };
        } else {
            // SAFETY: the next allocator's block (the caller's contract).
            unsafe { next::free(p) };
        }
        return;
    }
    if in_arena(p as usize) {
        if let Some(a) = arena_ready() {
            if a.free(p as usize) {
                bump(&COUNTERS.arena_frees);
            }
        }
        return;
    }
    // SAFETY: a glibc block (the caller's contract).
    unsafe { __libc_free(p) }
}

/// `calloc`: arena blocks are zero already.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    match next::route() {
        Route::Next if inside() => {
            let p = lib_block(total, 16);
            if !p.is_null() {
                // SAFETY: a fresh block of `total` bytes (a reused one is not zero).
                unsafe { ptr::write_bytes(p as *mut u8, 0, total) };
            }
            return p;
        }
        // SAFETY: calloc's contract.
        Route::Next => return unsafe { next::calloc(n, size) },
        // SAFETY: glibc's calloc.
        Route::Early => return next::note_early(unsafe { __libc_calloc(n, size) }),
        Route::Glibc => {}
    }
    let p = arena_block(total, PAGE);
    if !p.is_null() {
        return p;
    }
    // SAFETY: glibc's calloc.
    unsafe { __libc_calloc(n, size) }
}

/// `realloc`: an arena block grows by moving (or stays, when it has room); a glibc block that
/// grows past the minimum moves into the arena.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: malloc's contract.
        return unsafe { malloc(size) };
    }
    if libheap::owns(p as usize) {
        return libheap::realloc(p as usize, size);
    }
    match next::route() {
        Route::Next if !next::early(p as usize, false) => {
            // SAFETY: the next allocator's block (the caller's contract).
            return unsafe { next::realloc(p, size) };
        }
        Route::Next => {
            // A glibc block from the lookup moves to the next allocator.
            // SAFETY: malloc's contract; p is a live glibc block of `usable` bytes.
            unsafe {
                let q = next::malloc(size);
                if !q.is_null() {
                    ptr::copy_nonoverlapping(
                        p as *const u8,
                        q as *mut u8,
                        call_usable(p).min(size),
                    );
                    free(p);
                }
                return q;
            }
        }
        Route::Early => {
            next::early(p as usize, true);
            // SAFETY: glibc's realloc of a glibc block.
            return next::note_early(unsafe { __libc_realloc(p, size) });
        }
        Route::Glibc => {}
    }
    if size == 0 {
        // SAFETY: free's contract (glibc's realloc(p, 0) frees and returns NULL).
        unsafe { free(p) };
        return ptr::null_mut();
    }
    if in_arena(p as usize) {
        let Some(old) = arena_ready().and_then(|a| a.block_len(p as usize)) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if size <= old {
            return p;
        }
        // SAFETY: malloc's contract.
        let q = unsafe { malloc(size) };
        if !q.is_null() {
            // SAFETY: both blocks hold at least `old` bytes and do not overlap.
            unsafe { ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old) };
            // SAFETY: p is a live arena block.
            unsafe { free(p) };
        }
        return q;
    }
    let q = arena_block(size, PAGE);
    if !q.is_null() {
        // SAFETY: p is a live glibc block of `usable` bytes; q holds `size` bytes.
        unsafe {
            let usable = call_usable(p);
            ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, usable.min(size));
            __libc_free(p);
        }
        return q;
    }
    // SAFETY: glibc's realloc of a glibc block.
    unsafe { __libc_realloc(p, size) }
}

/// `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: realloc's contract.
        Some(t) => unsafe { realloc(p, t) },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// The aligned allocations' common path (`align` a power of two).
fn aligned(align: usize, size: usize) -> *mut c_void {
    match next::route() {
        Route::Next if inside() => return lib_block(size, align),
        Route::Next => {
            let mut p = ptr::null_mut();
            let align = align.max(std::mem::size_of::<*mut c_void>());
            // SAFETY: posix_memalign's contract (a power-of-two multiple of the pointer size).
            return match unsafe { next::posix_memalign(&mut p, align, size) } {
                0 => p,
                e => {
                    set_errno(e);
                    ptr::null_mut()
                }
            };
        }
        // SAFETY: glibc's memalign.
        Route::Early => return next::note_early(unsafe { __libc_memalign(align, size) }),
        Route::Glibc => {}
    }
    let p = arena_block(size, align.max(PAGE));
    if !p.is_null() {
        return p;
    }
    // SAFETY: glibc's memalign.
    unsafe { __libc_memalign(align, size) }
}

/// `posix_memalign`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: out is writable (the caller's contract).
    unsafe { *out = p };
    0
}

/// `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    aligned(align, size)
}

/// `memalign` (glibc rounds a non-power-of-two alignment up).
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(align.max(1).next_power_of_two(), size)
}

/// `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(PAGE, size)
}

/// `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(PAGE, size.max(1).next_multiple_of(PAGE))
}

unsafe fn call_usable(p: *mut c_void) -> usize {
    let f = R_USABLE.load(Relaxed);
    if f == 0 {
        return 0;
    }
    // SAFETY: glibc's malloc_usable_size of a glibc block.
    unsafe { std::mem::transmute::<usize, UsableFn>(f)(p) }
}

/// `malloc_usable_size`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if libheap::owns(p as usize) {
        return libheap::usable(p as usize);
    }
    if next::route() == Route::Next && !next::early(p as usize, false) {
        // SAFETY: the next allocator's block (the caller's contract).
        return unsafe { next::usable(p) };
    }
    if in_arena(p as usize) {
        return arena_ready()
            .and_then(|a| a.block_len(p as usize))
            .unwrap_or(0);
    }
    // SAFETY: a glibc block (the caller's contract).
    unsafe { call_usable(p) }
}

// ---------------------------------------------------------------------------------------------
// Mappings.

fn real_mmap(
    a: *mut c_void,
    l: usize,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: libc::off_t,
) -> *mut c_void {
    call_real!(R_MMAP as MmapFn, libc::SYS_mmap, (a, l, p, f, fd, o))
}

/// `mmap`: private anonymous read-write memory of at least the minimum, with no address
/// wanted, comes from the arena.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    let plain = addr.is_null()
        && fd == -1
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags
            & (libc::MAP_FIXED
                | libc::MAP_FIXED_NOREPLACE
                | libc::MAP_SHARED
                | libc::MAP_HUGETLB
                | libc::MAP_GROWSDOWN
                | libc::MAP_STACK)
            == 0;
    if plain && len > 0 {
        let p = arena_block(len, PAGE);
        if !p.is_null() {
            bump(&COUNTERS.mmaps);
            return p;
        }
    }
    real_mmap(addr, len, prot, flags, fd, off)
}

/// `mmap64` (the same call on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: mmap's contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// Whether `[addr, addr + len)` overlaps the arena.
#[inline]
fn touches(addr: usize, len: usize) -> bool {
    len > 0
        && (in_arena(addr) || in_arena(addr.saturating_add(len - 1)) || {
            let (lo, hi) = (crate::LO.load(Relaxed), crate::HI.load(Relaxed));
            lo != 0 && addr < lo && addr.saturating_add(len) > hi
        })
}

/// `munmap`: arena pages (whole blocks or parts) go back to the arena.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if touches(addr as usize, len) {
        if let Some(a) = arena_ready() {
            if addr as usize % PAGE != 0 {
                set_errno(libc::EINVAL);
                return -1;
            }
            a.release(addr as usize, len);
            bump(&COUNTERS.munmaps);
            return 0;
        }
    }
    call_real!(R_MUNMAP as MunmapFn, libc::SYS_munmap, (addr, len))
}

/// `mremap`: an arena block shrinks in place or moves by copy (`MREMAP_FIXED` of arena memory
/// is refused with `EINVAL`). The fifth argument is read only with `MREMAP_FIXED` (x86-64 passes
/// variadic pointer arguments in the same registers).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let Some(a) = arena_ready().filter(|_| in_arena(old as usize)) else {
        return call_real!(
            R_MREMAP as MremapFn,
            libc::SYS_mremap,
            (old, old_len, new_len, flags, new_addr)
        );
    };
    if flags & libc::MREMAP_FIXED != 0 || old as usize % PAGE != 0 || new_len == 0 {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let old_pages = old_len.div_ceil(PAGE) * PAGE;
    let new_pages = new_len.div_ceil(PAGE) * PAGE;
    if new_pages <= old_pages {
        a.release(old as usize + new_pages, old_pages - new_pages);
        return old;
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    }
    let mut q = arena_block(new_len, PAGE);
    if q.is_null() {
        q = real_mmap(
            ptr::null_mut(),
            new_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if q == libc::MAP_FAILED {
            return q;
        }
    }
    // SAFETY: `old` holds old_len bytes of arena memory, q at least new_len > old_len.
    unsafe { ptr::copy_nonoverlapping(old as *const u8, q as *mut u8, old_len) };
    a.release(old as usize, old_pages);
    q
}

/// `madvise`: `MADV_HUGEPAGE` of arena memory is ignored (jemalloc's `thp` option), and
/// `MADV_FREE` of arena memory becomes `MADV_DONTNEED` (the pager sees a drop; a
/// lazily freed page would fault as missing while the pager thinks it resident).
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    if advice == libc::MADV_HUGEPAGE && touches(addr as usize, len) {
        // The pager moves 4 KiB pages; a huge page would be faulted and evicted whole.
        return 0;
    }
    let advice = if advice == libc::MADV_FREE && touches(addr as usize, len) {
        libc::MADV_DONTNEED
    } else {
        advice
    };
    real_madvise(addr, len, advice)
}

// ---------------------------------------------------------------------------------------------
// SIGBUS: the fault engine's, with the program's chained behind it.

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

/// The real `sigaction` (resolved now if the constructor has not run yet: never in a handler).
fn real_sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let mut f = R_SIGACTION.load(Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()) } as usize;
        if f == 0 {
            set_errno(libc::ENOSYS);
            return -1;
        }
        R_SIGACTION.store(f, Relaxed);
    }
    // SAFETY: the next definition of sigaction, with its signature.
    let f: SigactionFn = unsafe { std::mem::transmute::<usize, SigactionFn>(f) };
    // SAFETY: the caller's arguments, unchanged.
    unsafe { f(sig, act, old) }
}

/// `sigaction`: a program installing its own `SIGBUS` handler (redis-server's crash reporter)
/// after the pager started would replace the fault engine's, and the first touch of an evicted
/// page would kill it. While the engine's handler is installed, the program's goes behind it:
/// faults that are not the pager's reach it, and `oldact` answers as if it owned the signal.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: act and old are the caller's, valid or NULL per sigaction(2).
    if sig == libc::SIGBUS && unsafe { tiermem_fault::engine::interpose_sigbus(act, old) } {
        bump(&COUNTERS.sigbus_chained);
        return 0;
    }
    real_sigaction(sig, act, old)
}

/// `signal`: as [`sigaction`] for `SIGBUS` (glibc's `signal` calls its internal sigaction,
/// which is not interposable); other signals go to the real `sigaction` with `signal`'s BSD
/// semantics (`SA_RESTART`).
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: sigaction is plain old data; zeroed is a valid empty value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: sigaction is plain old data.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both point to valid structs.
    if unsafe { sigaction(sig, &sa, &mut old) } < 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// `_exit`: the exit report first (a program that ends with `_exit` skips `atexit`), then the
/// process ends as `_exit` ends it (`exit_group`).
#[no_mangle]
pub extern "C" fn _exit(status: c_int) -> ! {
    crate::at_exit();
    loop {
        // SAFETY: exit_group ends the process; it does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// `_Exit`: as [`_exit`].
#[no_mangle]
pub extern "C" fn _Exit(status: c_int) -> ! {
    _exit(status)
}

// ---------------------------------------------------------------------------------------------
// System calls on arena buffers.

/// Pins the arena part of each `(addr, len)` for the length of `f`.
fn pinned<R>(bufs: &[(usize, usize)], f: impl FnOnce() -> R) -> R {
    let Some(a) = arena_ready() else {
        return f();
    };
    let pins: Vec<(usize, usize)> = bufs.iter().filter_map(|&(p, l)| a.pin(p, l)).collect();
    if !pins.is_empty() {
        bump(&COUNTERS.pinned_calls);
    }
    let r = f();
    for p in pins {
        a.unpin(p);
    }
    r
}

/// A single buffer's length cut to what one call may pin (a short count is allowed).
fn cut(len: usize) -> usize {
    let m = pin_max();
    if len > m {
        bump(&COUNTERS.cut_calls);
        m
    } else {
        len
    }
}

/// Defines a hook for a call with one buffer `(buf, len)`: pinned when it touches the arena.
macro_rules! one_buffer {
    ($(#[$m:meta])* fn $name:ident($fd:ident: c_int, $buf:ident: $bt:ty, $len:ident: usize $(, $a:ident: $at:ty)*) via $slot:ident as $ty:ty, $sys:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($fd: c_int, $buf: $bt, $len: usize $(, $a: $at)*) -> isize {
            if !touches($buf as usize, $len) {
                return call_real!($slot as $ty, $sys, ($fd, $buf as *mut c_void, $len $(, $a)*));
            }
            let $len = cut($len);
            pinned(&[($buf as usize, $len)], || {
                call_real!($slot as $ty, $sys, ($fd, $buf as *mut c_void, $len $(, $a)*))
            })
        }
    };
}

one_buffer!(
    /// `read` into arena memory pins it.
    fn read(fd: c_int, buf: *mut c_void, len: usize) via R_READ as RwFn, libc::SYS_read);
one_buffer!(
    /// `write` from arena memory pins it.
    fn write(fd: c_int, buf: *const c_void, len: usize) via R_WRITE as RwFn, libc::SYS_write);
one_buffer!(
    /// `pread`.
    fn pread(fd: c_int, buf: *mut c_void, len: usize, off: libc::off_t) via R_PREAD as PrwFn, libc::SYS_pread64);
one_buffer!(
    /// `pread64`.
    fn pread64(fd: c_int, buf: *mut c_void, len: usize, off: libc::off_t) via R_PREAD as PrwFn, libc::SYS_pread64);
one_buffer!(
    /// `pwrite`.
    fn pwrite(fd: c_int, buf: *const c_void, len: usize, off: libc::off_t) via R_PWRITE as PrwFn, libc::SYS_pwrite64);
one_buffer!(
    /// `pwrite64`.
    fn pwrite64(fd: c_int, buf: *const c_void, len: usize, off: libc::off_t) via R_PWRITE as PrwFn, libc::SYS_pwrite64);
one_buffer!(
    /// `recv` (its system call is `recvfrom` with no address).
    fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) via R_RECV as SockFn, libc::SYS_recvfrom);
one_buffer!(
    /// `send` (its system call is `sendto` with no address).
    fn send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) via R_SEND as SockFn, libc::SYS_sendto);
one_buffer!(
    /// `recvfrom`.
    fn recvfrom(fd: c_int, buf: *mut c_void, len: usize, flags: c_int, addr: *mut libc::sockaddr, alen: *mut libc::socklen_t) via R_RECVFROM as SockAddrFn, libc::SYS_recvfrom);

/// `sendto`.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> isize {
    type SendtoFn = unsafe extern "C" fn(
        c_int,
        *const c_void,
        usize,
        c_int,
        *const libc::sockaddr,
        libc::socklen_t,
    ) -> isize;
    let go = |len: usize| {
        call_real!(
            R_SENDTO as SendtoFn,
            libc::SYS_sendto,
            (fd, buf, len, flags, addr, alen)
        )
    };
    if !touches(buf as usize, len) {
        return go(len);
    }
    let len = cut(len);
    pinned(&[(buf as usize, len)], || go(len))
}

/// The arena-touching entries of an iovec array.
fn iov_bufs(iov: *const libc::iovec, n: c_int) -> Option<Vec<(usize, usize)>> {
    if iov.is_null() || n <= 0 {
        return None;
    }
    // SAFETY: the caller passes `n` iovecs (the system call's contract; a bad pointer would
    // have made the real call fail with EFAULT, and the kernel checks it again).
    let v = unsafe { std::slice::from_raw_parts(iov, n.min(1024) as usize) };
    let bufs: Vec<(usize, usize)> = v
        .iter()
        .map(|e| (e.iov_base as usize, e.iov_len))
        .filter(|&(p, l)| touches(p, l))
        .collect();
    (!bufs.is_empty()).then_some(bufs)
}

/// `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    let go = || call_real!(R_READV as VecFn, libc::SYS_readv, (fd, iov, n));
    match iov_bufs(iov, n) {
        None => go(),
        Some(b) => pinned(&b, go),
    }
}

/// `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    let go = || call_real!(R_WRITEV as VecFn, libc::SYS_writev, (fd, iov, n));
    match iov_bufs(iov, n) {
        None => go(),
        Some(b) => pinned(&b, go),
    }
}

/// The arena-touching buffers of a `msghdr`.
fn msg_bufs(m: *const libc::msghdr) -> Option<Vec<(usize, usize)>> {
    if m.is_null() || crate::LO.load(Relaxed) == 0 {
        return None;
    }
    // SAFETY: the caller's msghdr (the system call's contract).
    let m = unsafe { &*m };
    iov_bufs(m.msg_iov, m.msg_iovlen as c_int)
}

/// `recvmsg`.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    let go = || call_real!(R_RECVMSG as MsgFn, libc::SYS_recvmsg, (fd, msg, flags));
    match msg_bufs(msg) {
        None => go(),
        Some(b) => pinned(&b, go),
    }
}

/// `sendmsg` (memcached's replies: iovecs into item memory).
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    type SendmsgFn = unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> isize;
    let go = || call_real!(R_SENDMSG as SendmsgFn, libc::SYS_sendmsg, (fd, msg, flags));
    match msg_bufs(msg) {
        None => go(),
        Some(b) => pinned(&b, go),
    }
}

// Event arrays the kernel writes: `epoll_wait`'s events (redis-server's is a 120 KB block of
// its allocator, in the arena) and `poll`'s fds.

/// `maxevents` cut so the events array pins at most what one call may pin (fewer events a call
/// is allowed: the rest stay ready for the next), and the array's arena part pinned.
fn epoll_events<R>(ev: *mut libc::epoll_event, max: c_int, f: impl FnOnce(c_int) -> R) -> R {
    let size = std::mem::size_of::<libc::epoll_event>();
    let bytes = (max.max(0) as usize).saturating_mul(size);
    if !touches(ev as usize, bytes) {
        return f(max);
    }
    let max = (cut(bytes) / size).max(1) as c_int;
    pinned(&[(ev as usize, max as usize * size)], || f(max))
}

/// `epoll_wait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;
    epoll_events(ev, max, |max| {
        call_real!(
            R_EPOLL_WAIT as F,
            libc::SYS_epoll_wait,
            (epfd, ev, max, timeout)
        )
    })
}

/// `epoll_pwait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    type F = unsafe extern "C" fn(
        c_int,
        *mut libc::epoll_event,
        c_int,
        c_int,
        *const libc::sigset_t,
    ) -> c_int;
    // Without the real function (before the constructor), the raw system call, which takes
    // the kernel's sigset size as a sixth argument.
    epoll_events(ev, max, |max| {
        let f = R_EPOLL_PWAIT.load(Relaxed);
        if f == 0 {
            // SAFETY: the caller's arguments (epoll_pwait's contract).
            return unsafe {
                libc::syscall(libc::SYS_epoll_pwait, epfd, ev, max, timeout, mask, 8usize) as c_int
            };
        }
        // SAFETY: the next definition of epoll_pwait, with its signature; the caller's arguments.
        unsafe { std::mem::transmute::<usize, F>(f)(epfd, ev, max, timeout, mask) }
    })
}

/// `poll`: the fds array is read and written by the kernel, all of it (not cut).
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    type F = unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int;
    let go = || call_real!(R_POLL as F, libc::SYS_poll, (fds, n, timeout));
    let bytes = (n as usize).saturating_mul(std::mem::size_of::<libc::pollfd>());
    if !touches(fds as usize, bytes) {
        return go();
    }
    pinned(&[(fds as usize, bytes)], go)
}

/// `ppoll`.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    type F = unsafe extern "C" fn(
        *mut libc::pollfd,
        libc::nfds_t,
        *const libc::timespec,
        *const libc::sigset_t,
    ) -> c_int;
    let go = || {
        let f = R_PPOLL.load(Relaxed);
        if f == 0 {
            // SAFETY: the caller's arguments; the kernel's sigset is 8 bytes.
            return unsafe { libc::syscall(libc::SYS_ppoll, fds, n, ts, mask, 8usize) as c_int };
        }
        // SAFETY: the next definition of ppoll, with its signature; the caller's arguments.
        unsafe { std::mem::transmute::<usize, F>(f)(fds, n, ts, mask) }
    };
    let bytes = (n as usize).saturating_mul(std::mem::size_of::<libc::pollfd>());
    if !touches(fds as usize, bytes) {
        return go();
    }
    pinned(&[(fds as usize, bytes)], go)
}

// The fortified variants (`_FORTIFY_SOURCE`): checked here, then the hooks above.

fn chk_fail() -> ! {
    extern "C" {
        fn __chk_fail() -> !;
    }
    // SAFETY: glibc's buffer-overflow abort.
    unsafe { __chk_fail() }
}

/// `__read_chk`.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: usize, buflen: usize) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: read's contract.
    unsafe { read(fd, buf, n) }
}

/// `__pread_chk`.
#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    off: libc::off_t,
    buflen: usize,
) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: pread's contract.
    unsafe { pread(fd, buf, n, off) }
}

/// `__pread64_chk`.
#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    off: libc::off_t,
    buflen: usize,
) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: pread's contract.
    unsafe { pread(fd, buf, n, off) }
}

/// `__recv_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    buflen: usize,
    flags: c_int,
) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: recv's contract.
    unsafe { recv(fd, buf, n, flags) }
}

/// `__recvfrom_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    buflen: usize,
    flags: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: recvfrom's contract.
    unsafe { recvfrom(fd, buf, n, flags, addr, alen) }
}

// ---------------------------------------------------------------------------------------------
// stdio: a large `fread` or `fwrite` moves the data between the file and the caller's buffer
// with glibc's internal `read`/`write`, which no hook sees (coreutils' `sort` reads its input
// into its buffer so). The buffer is pinned around the real call, in pieces of at most what one
// call may pin: a sequence of freads of whole items is the same as one.

type StdioFn = unsafe extern "C" fn(*mut c_void, usize, usize, *mut libc::FILE) -> usize;

/// Calls the real stdio function in `slot` for `n` items of `size` bytes at `ptr`, pinned in
/// pieces when the buffer touches the arena.
fn stdio_pinned(
    slot: &AtomicUsize,
    ptr: *mut c_void,
    size: usize,
    n: usize,
    stream: *mut libc::FILE,
) -> usize {
    let f = slot.load(Relaxed);
    if f == 0 {
        set_errno(libc::ENOSYS);
        return 0;
    }
    // SAFETY: `f` is the next definition of this very function, with this signature.
    let f: StdioFn = unsafe { std::mem::transmute::<usize, StdioFn>(f) };
    let total = size.saturating_mul(n);
    if total == 0 || !touches(ptr as usize, total) {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { f(ptr, size, n, stream) };
    }
    let per = (pin_max() / size).max(1);
    let mut done = 0;
    while done < n {
        let k = per.min(n - done);
        let p = (ptr as usize + done * size) as *mut c_void;
        // SAFETY: the caller's buffer, stream and item size; `k` items from item `done` on.
        let got = pinned(&[(p as usize, k * size)], || unsafe {
            f(p, size, k, stream)
        });
        done += got;
        if got < k {
            break;
        }
    }
    done
}

/// `fread`.
#[no_mangle]
pub unsafe extern "C" fn fread(
    ptr: *mut c_void,
    size: usize,
    n: usize,
    stream: *mut libc::FILE,
) -> usize {
    stdio_pinned(&R_FREAD, ptr, size, n, stream)
}

/// `fread_unlocked` (gnulib's `unlocked-io` makes coreutils call it).
#[no_mangle]
pub unsafe extern "C" fn fread_unlocked(
    ptr: *mut c_void,
    size: usize,
    n: usize,
    stream: *mut libc::FILE,
) -> usize {
    stdio_pinned(&R_FREAD_UNLOCKED, ptr, size, n, stream)
}

/// `fwrite`.
#[no_mangle]
pub unsafe extern "C" fn fwrite(
    ptr: *const c_void,
    size: usize,
    n: usize,
    stream: *mut libc::FILE,
) -> usize {
    stdio_pinned(&R_FWRITE, ptr as *mut c_void, size, n, stream)
}

/// `fwrite_unlocked`.
#[no_mangle]
pub unsafe extern "C" fn fwrite_unlocked(
    ptr: *const c_void,
    size: usize,
    n: usize,
    stream: *mut libc::FILE,
) -> usize {
    stdio_pinned(&R_FWRITE_UNLOCKED, ptr as *mut c_void, size, n, stream)
}

extern "C" {
    fn __chk_fail() -> !;
}

/// `_FORTIFY_SOURCE`'s check of a read of `n` items of `size` into a buffer of `ptrlen`
/// bytes: glibc's failure report (the process ends) when it does not fit.
fn fortify_check(ptrlen: usize, size: usize, n: usize) {
    if size.checked_mul(n).map_or(true, |t| t > ptrlen) {
        // SAFETY: glibc's fortify failure report; it does not return.
        unsafe { __chk_fail() }
    }
}

/// `__fread_chk` (`_FORTIFY_SOURCE`): the size check, then [`fread`].
#[no_mangle]
pub unsafe extern "C" fn __fread_chk(
    ptr: *mut c_void,
    ptrlen: usize,
    size: usize,
    n: usize,
    stream: *mut libc::FILE,
) -> usize {
    fortify_check(ptrlen, size, n);
    stdio_pinned(&R_FREAD, ptr, size, n, stream)
}

/// `__fread_unlocked_chk`.
#[no_mangle]
pub unsafe extern "C" fn __fread_unlocked_chk(
    ptr: *mut c_void,
    ptrlen: usize,
    size: usize,
    n: usize,
    stream: *mut libc::FILE,
) -> usize {
    fortify_check(ptrlen, size, n);
    stdio_pinned(&R_FREAD_UNLOCKED, ptr, size, n, stream)
}
