//! The malloc family's large path. glibc maps its large blocks with internal `mmap` calls the
//! mapping hooks never see, so `malloc`, `calloc`, `realloc`, `reallocarray`, `memalign`,
//! `aligned_alloc`, `posix_memalign`, `valloc` and `pvalloc` call the real function and, for a
//! request of at least `TIERMEM_PREFAULT_MIN` bytes that glibc served with its own mapping (an
//! mmapped chunk), register the block's page-aligned interior (ascending: a fresh block is
//! filled from its start). `free` and `realloc` of such a chunk end its registration *before*
//! the real call unmaps or moves it. `malloc_trim` and `mallopt(M_TRIM_THRESHOLD)` take care of
//! `[heap]` (see [`crate::heap`]), which these hooks also follow. The library's own `mallopt`
//! calls switch glibc's dynamic mmap threshold off; `free` emulates it (see
//! [`emulate_dynamic_threshold`]).
//!
//! Fast path: a request below the minimum while the break has not moved goes straight to the
//! real function (a compare, glibc's break compared with the last seen one, a tail call);
//! `free` reads the chunk header's IS_MMAPPED bit. With another allocator than glibc's (e.g.
//! jemalloc) nothing is registered here: its mappings go through the mapping hooks.

use crate::heap;
use crate::real::{self, arena_alloc, arena_size, in_arena};
use crate::state::{self, Kind, FREE_CHECK, MIN_FAST, STATE};
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use tiermem_prefault::Service;

/// glibc's chunk flag: the chunk is a mapping of its own.
const IS_MMAPPED: usize = 2;

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// For a glibc block `p` that is an mmapped chunk, the chunk's size (header included).
#[inline(always)]
fn mmapped_chunk(p: *mut c_void) -> Option<usize> {
    // SAFETY: only called when the real allocator is glibc's (FREE_CHECK) on a live block it
    // returned (never an arena block): its size word precedes it.
    let h = unsafe { *(p as *const usize).sub(1) };
    (h & IS_MMAPPED != 0).then_some(h & !7)
}

/// The slow path's prelude: start a pending child's service, follow the heap; the service if
/// the library serves.
#[cold]
#[inline(never)]
fn prelude() -> Option<&'static Service> {
    if STATE.load(Acquire) == state::CHILD_PENDING {
        state::start_pending_child();
    }
    if !heap::quiet() {
        heap::refresh();
    }
    state::service()
}

/// Registers the page-aligned interior of a block of `size` bytes at `p` that glibc mapped
/// on its own; `filled`: bytes at its start that already hold data (a grown realloc), where
/// the frontier starts instead.
fn register_block(svc: &Service, p: *mut c_void, size: usize, filled: usize) {
    if p.is_null() || size < state::MIN.load(Relaxed) || !FREE_CHECK.load(Relaxed) {
        return;
    }
    if mmapped_chunk(p).is_none() {
        return; // served from an arena: [heap] following covers the main one
    }
    let lo = (p as usize).next_multiple_of(4096);
    let hi = (p as usize + size) & !4095;
    if hi < lo + 4096 {
        return;
    }
    let Some(cfg) = state::config() else { return };
    if let Some(r) = state::register(svc, lo, hi - lo, cfg.sequential(), Kind::Block) {
        let from = (p as usize + filled).saturating_sub(lo);
        if filled > 0 && from < hi - lo {
            svc.hint_raw(r, from & !4095, hi - lo - (from & !4095));
        }
    }
}

/// glibc's `M_MMAP_THRESHOLD`.
const M_MMAP_THRESHOLD: c_int = -3;
/// glibc's default and largest dynamic mmap threshold (64-bit).
const MMAP_THRESHOLD_MIN: usize = 128 << 10;
const MMAP_THRESHOLD_MAX: usize = 32 << 20;
/// The mmap threshold as glibc would have raised it (0: not emulated).
pub static MMAP_THRESHOLD: AtomicUsize = AtomicUsize::new(0);

/// Emulation of glibc's dynamic mmap threshold, which the library's `mallopt` calls switch
/// off: as glibc would, freeing a mapped chunk larger than the threshold (up to 32 MiB) raises
/// the threshold to its size, so that blocks of that size come from the heap from then on
/// instead of a fresh mapping each time. Off when the program or its environment sets the
/// threshold.
pub fn emulate_dynamic_threshold() {
    let set_by_user = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("mmap_threshold"));
    if !set_by_user {
        MMAP_THRESHOLD.store(MMAP_THRESHOLD_MIN, Relaxed);
    }
}

/// Ends the registration of a glibc mmapped chunk before it is freed or moved; returns its
/// usable size (0: not such a chunk).
#[inline(always)]
fn release_block(p: *mut c_void) -> usize {
    if !FREE_CHECK.load(Relaxed) {
        return 0;
    }
    let Some(size) = mmapped_chunk(p) else {
        return 0;
    };
    if let Some(svc) = state::service() {
        state::drop_range(svc, p as usize & !4095, size);
    }
    let t = MMAP_THRESHOLD.load(Relaxed);
    if t != 0 && size > t && size <= MMAP_THRESHOLD_MAX {
        raise_threshold(t, size);
    }
    size - 2 * std::mem::size_of::<usize>()
}

#[cold]
fn raise_threshold(old: usize, size: usize) {
    if MMAP_THRESHOLD
        .compare_exchange(old, size, Relaxed, Relaxed)
        .is_ok()
    {
        // SAFETY: the real mallopt with a documented parameter; `size` ≤ 32 MiB fits an int.
        unsafe { (real::mallopt())(M_MMAP_THRESHOLD, size as c_int) };
    }
}

/// `malloc(3)`.
///
/// # Safety
/// As `malloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if size < MIN_FAST.load(Relaxed) && heap::quiet() {
        if let Some(f) = real::malloc() {
            // SAFETY: the real malloc.
            return unsafe { f(size) };
        }
    }
    malloc_slow(size)
}

#[cold]
#[inline(never)]
fn malloc_slow(size: usize) -> *mut c_void {
    let Some(f) = real::malloc() else {
        return arena(size, 16);
    };
    let svc = prelude();
    // SAFETY: the real malloc.
    let p = unsafe { f(size) };
    if let Some(svc) = svc {
        register_block(svc, p, size, 0);
    }
    p
}

fn arena(size: usize, align: usize) -> *mut c_void {
    let p = arena_alloc(size, align);
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

/// `free(3)`: a registered block's registration ends first.
///
/// # Safety
/// As `free(3)`.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || in_arena(p) {
        return;
    }
    release_block(p);
    if let Some(f) = real::free() {
        // SAFETY: the real free of a block the real allocator returned.
        unsafe { f(p) }
    }
}

/// `calloc(3)`.
///
/// # Safety
/// As `calloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let total = n.saturating_mul(size);
    if total < MIN_FAST.load(Relaxed) && heap::quiet() {
        if let Some(f) = real::calloc() {
            // SAFETY: the real calloc.
            return unsafe { f(n, size) };
        }
    }
    calloc_slow(n, size, total)
}

#[cold]
#[inline(never)]
fn calloc_slow(n: usize, size: usize, total: usize) -> *mut c_void {
    let Some(f) = real::calloc() else {
        if total == usize::MAX {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        return arena(total, 16); // the static arena is zeroed
    };
    let svc = prelude();
    // SAFETY: the real calloc.
    let p = unsafe { f(n, size) };
    if let Some(svc) = svc {
        register_block(svc, p, total, 0);
    }
    p
}

/// Waits out a concurrent resolution of the family (only at start-up, only for a block the
/// real allocator returned while another thread resolved it).
fn real_realloc() -> real::ReallocFn {
    loop {
        if let Some(f) = real::realloc() {
            return f;
        }
        std::thread::yield_now();
    }
}

/// `realloc(3)`: a registered block's registration ends before it is moved or freed; a large
/// result glibc mapped is registered, its frontier past the old contents.
///
/// # Safety
/// As `realloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: as malloc.
        return unsafe { malloc(size) };
    }
    if in_arena(p) {
        if size == 0 {
            return ptr::null_mut();
        }
        // SAFETY: as malloc.
        let q = unsafe { malloc(size) };
        if !q.is_null() {
            // SAFETY: `p` holds arena_size(p) bytes, `q` at least `size`.
            unsafe {
                ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, arena_size(p).min(size))
            };
        }
        return q;
    }
    let f = real_realloc();
    let mapped = FREE_CHECK.load(Relaxed) && mmapped_chunk(p).is_some();
    if !mapped && size < MIN_FAST.load(Relaxed) && heap::quiet() {
        // SAFETY: the real realloc.
        return unsafe { f(p, size) };
    }
    realloc_slow(f, p, size)
}

#[cold]
#[inline(never)]
fn realloc_slow(f: real::ReallocFn, p: *mut c_void, size: usize) -> *mut c_void {
    let svc = prelude();
    let old = release_block(p);
    // SAFETY: the real realloc.
    let q = unsafe { f(p, size) };
    if let Some(svc) = svc {
        register_block(svc, q, size, old.min(size));
    }
    q
}

/// `reallocarray(3)`: `realloc(p, n * size)`, null and ENOMEM on overflow.
///
/// # Safety
/// As `reallocarray(3)`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as realloc.
        Some(t) => unsafe { realloc(p, t) },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// The aligned allocators' common path: `call` makes the real call (`None`: the family is
/// being resolved: the arena serves).
#[inline(always)]
fn aligned(size: usize, align: usize, call: impl FnOnce() -> Option<*mut c_void>) -> *mut c_void {
    if size < MIN_FAST.load(Relaxed) && heap::quiet() {
        if let Some(p) = call() {
            return p;
        }
        return arena(size, align);
    }
    let svc = prelude();
    let Some(p) = call() else {
        return arena(size, align);
    };
    if let Some(svc) = svc {
        register_block(svc, p, size, 0);
    }
    p
}

/// `memalign(3)`.
///
/// # Safety
/// As `memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: the real memalign.
    aligned(size, align, || {
        real::memalign().map(|f| unsafe { f(align, size) })
    })
}

/// `aligned_alloc(3)`.
///
/// # Safety
/// As `aligned_alloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    // SAFETY: the real aligned_alloc.
    aligned(size, align, || {
        real::aligned_alloc().map(|f| unsafe { f(align, size) })
    })
}

/// `valloc(3)`.
///
/// # Safety
/// As `valloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    // SAFETY: the real valloc.
    aligned(size, 4096, || real::valloc().map(|f| unsafe { f(size) }))
}

/// `pvalloc(3)`.
///
/// # Safety
/// As `pvalloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    // SAFETY: the real pvalloc.
    aligned(size, 4096, || real::pvalloc().map(|f| unsafe { f(size) }))
}

/// `posix_memalign(3)`.
///
/// # Safety
/// As `posix_memalign(3)`: `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    let mut rc = 0;
    let p = aligned(size, align, || {
        real::posix_memalign().map(|f| {
            let mut q = ptr::null_mut();
            // SAFETY: the real posix_memalign with our out-parameter.
            rc = unsafe { f(&mut q, align, size) };
            q
        })
    });
    if rc != 0 {
        return rc;
    }
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's writable out-parameter.
    unsafe { *out = p };
    0
}

/// `malloc_trim(3)`: the heap's registrations end before glibc gives memory back; following
/// resumes past the break it leaves.
///
/// # Safety
/// As `malloc_trim(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc_trim(pad: usize) -> c_int {
    let real = real::malloc_trim();
    if state::service().is_none() {
        // SAFETY: the real malloc_trim.
        return unsafe { real(pad) };
    }
    heap::drop_all();
    // SAFETY: the real malloc_trim.
    let r = unsafe { real(pad) };
    heap::resume();
    r
}

/// `mallopt(3)`: a program setting its own trim threshold takes `[heap]` out of following
/// (glibc may then give the top back at any free).
///
/// # Safety
/// As `mallopt(3)`.
#[no_mangle]
pub unsafe extern "C" fn mallopt(param: c_int, value: c_int) -> c_int {
    if param == heap::M_TRIM_THRESHOLD && state::service().is_some() {
        heap::stop();
    }
    if param == M_MMAP_THRESHOLD {
        MMAP_THRESHOLD.store(0, Relaxed);
    }
    // SAFETY: the real mallopt.
    unsafe { (real::mallopt())(param, value) }
}
