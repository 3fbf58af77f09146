//! The mapping hooks: `mmap`/`mmap64` register private anonymous read-write mappings of at
//! least `TIERMEM_PREFAULT_MIN` bytes; `munmap`, `mremap`, a purging `madvise`, a
//! write-removing `mprotect`, a `MAP_FIXED` mapping and a shrinking `sbrk`/`brk` end the
//! registrations over their range *before* the real call (which waits for a populate in
//! flight there), so nothing is populated in the range once the call has changed it. A purged
//! range is never registered again. No hook takes a lock or allocates.

use crate::real;
use crate::state::{self, drop_range, page_span, Kind, COUNTERS};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

/// `MADV_DONTNEED_LOCKED` (Linux 5.18).
const MADV_DONTNEED_LOCKED: c_int = 24;
/// `MADV_GUARD_INSTALL` (Linux 6.13): guard entries fault on any access.
const MADV_GUARD_INSTALL: c_int = 102;

/// Whether a new mapping is one to populate ahead: private, anonymous, exactly read-write,
/// not a stack, not hugetlbfs, not already populated.
fn wanted(len: usize, prot: c_int, flags: c_int) -> bool {
    const MAP_TYPE: c_int = 0x0f;
    let skip = libc::MAP_HUGETLB | libc::MAP_STACK | libc::MAP_GROWSDOWN | libc::MAP_POPULATE;
    prot == libc::PROT_READ | libc::PROT_WRITE
        && flags & MAP_TYPE == libc::MAP_PRIVATE
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & skip == 0
        && len >= state::MIN.load(Relaxed)
}

/// `mmap(2)`, registering what the service should populate ahead.
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    let real = real::mmap();
    let Some(svc) = state::service() else {
        // SAFETY: the caller's mmap, unchanged.
        return unsafe { real(addr, len, prot, flags, fd, off) };
    };
    let fixed = flags & libc::MAP_FIXED != 0 && flags & libc::MAP_FIXED_NOREPLACE == 0;
    let (lo, plen) = page_span(addr, len);
    if fixed {
        // Whatever this mapping replaces stops being populated before it is replaced.
        drop_range(svc, lo, plen);
    }
    // SAFETY: the caller's mmap, unchanged.
    let p = unsafe { real(addr, len, prot, flags, fd, off) };
    if p == libc::MAP_FAILED {
        return p;
    }
    let (lo, plen) = page_span(p, len);
    if wanted(plen, prot, flags) {
        if let Some(cfg) = state::config() {
            state::register(svc, lo, plen, cfg.for_mapping(plen), Kind::Mapping);
        }
    } else if !fixed {
        // A fresh mapping: a registration here is a stale one (a system call we could not see).
        drop_range(svc, lo, plen);
    }
    p
}

/// `mmap64(2)`: the same as [`mmap`] (64-bit `off_t`).
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: as mmap.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// `munmap(2)`: the range stops being populated first.
///
/// # Safety
/// As `munmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if let Some(svc) = state::service() {
        let (lo, plen) = page_span(addr, len);
        drop_range(svc, lo, plen);
    }
    // SAFETY: the caller's munmap, unchanged.
    unsafe { (real::munmap())(addr, len) }
}

/// `mremap(2)` (`new_addr` is read only with `MREMAP_FIXED`, as the kernel does): the old
/// range (and a fixed destination) stop being populated first; a moved or grown mapping that
/// was registered is registered again at its new place, its frontier past the old length.
///
/// # Safety
/// As `mremap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let fixed = flags & libc::MREMAP_FIXED != 0;
    let call = |na: *mut c_void| match real::mremap() {
        // SAFETY: the caller's mremap, unchanged (the fifth argument only with MREMAP_FIXED).
        Some(f) => unsafe {
            if fixed {
                f(old, old_len, new_len, flags, na)
            } else {
                f(old, old_len, new_len, flags)
            }
        },
        None => {
            // SAFETY: the raw system call with the caller's arguments.
            let r = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, na) };
            if r < 0 {
                libc::MAP_FAILED
            } else {
                r as *mut c_void
            }
        }
    };
    let Some(svc) = state::service() else {
        return call(new_addr);
    };
    let (lo, plen) = page_span(old, old_len);
    let was = drop_range(svc, lo, plen);
    if fixed {
        let (nlo, nplen) = page_span(new_addr, new_len);
        drop_range(svc, nlo, nplen);
    }
    let p = call(new_addr);
    if p == libc::MAP_FAILED || was == 0 {
        return p;
    }
    // The old range was registered: one VMA (mremap refuses to span several), so all of it is
    // private anonymous read-write memory, and so is the result.
    let (nlo, nplen) = page_span(p, new_len);
    if nplen >= state::MIN.load(Relaxed) {
        if let Some(cfg) = state::config() {
            let r = state::register(svc, nlo, nplen, cfg.for_mapping(nplen), Kind::Mapping);
            if let Some(r) = r {
                if nplen > plen {
                    svc.hint_raw(r, plen, nplen - plen);
                }
            }
        }
    }
    p
}

/// `madvise(2)`: a purge (`MADV_DONTNEED`, `_FREE`, `_REMOVE`, `_DONTNEED_LOCKED`, a guard
/// install) ends the registrations over the range first, for good: what an allocator purged
/// is not populated again.
///
/// # Safety
/// As `madvise(2)`.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    if matches!(
        advice,
        libc::MADV_DONTNEED
            | libc::MADV_FREE
            | libc::MADV_REMOVE
            | MADV_DONTNEED_LOCKED
            | MADV_GUARD_INSTALL
    ) {
        if let Some(svc) = state::service() {
            let (lo, plen) = page_span(addr, len);
            let n = drop_range(svc, lo, plen);
            if n > 0 {
                COUNTERS.purged.fetch_add(n as u64, Relaxed);
            }
        }
    }
    // SAFETY: the caller's madvise, unchanged.
    unsafe { (real::madvise())(addr, len, advice) }
}

/// `mprotect(2)`: removing write access ends the registrations over the range first.
///
/// # Safety
/// As `mprotect(2)`.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    if prot & libc::PROT_WRITE == 0 {
        if let Some(svc) = state::service() {
            let (lo, plen) = page_span(addr, len);
            drop_range(svc, lo, plen);
        }
    }
    // SAFETY: the caller's mprotect, unchanged.
    unsafe { (real::mprotect())(addr, len, prot) }
}

/// `sbrk(2)`: a shrinking call ends the heap's registrations first.
///
/// # Safety
/// As `sbrk(2)`.
#[no_mangle]
pub unsafe extern "C" fn sbrk(incr: libc::intptr_t) -> *mut c_void {
    let real = real::sbrk();
    if incr >= 0 || state::service().is_none() {
        // SAFETY: the caller's sbrk, unchanged.
        return unsafe { real(incr) };
    }
    crate::heap::drop_all();
    if let Some(svc) = state::service() {
        // SAFETY: sbrk(0) reads the break.
        let cur = unsafe { real(0) } as usize;
        let from = cur.saturating_add_signed(incr) & !4095;
        drop_range(svc, from, cur.saturating_sub(from));
    }
    // SAFETY: the caller's sbrk, unchanged.
    let r = unsafe { real(incr) };
    crate::heap::resume();
    r
}

/// `brk(2)`: moving the break down ends the heap's registrations first.
///
/// # Safety
/// As `brk(2)`.
#[no_mangle]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> c_int {
    let Some(svc) = state::service() else {
        // SAFETY: the caller's brk, unchanged.
        return unsafe { (real::brk())(addr) };
    };
    // SAFETY: sbrk(0) reads the break.
    let cur = unsafe { (real::sbrk())(0) } as usize;
    if (addr as usize) >= cur {
        // SAFETY: the caller's brk, unchanged.
        return unsafe { (real::brk())(addr) };
    }
    crate::heap::drop_all();
    let from = addr as usize & !4095;
    drop_range(svc, from, cur - from);
    // SAFETY: the caller's brk, unchanged.
    let r = unsafe { (real::brk())(addr) };
    crate::heap::resume();
    r
}
