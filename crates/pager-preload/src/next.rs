//! The program's own allocator when it is not glibc's: a program that links another malloc
//! (redis-server links jemalloc) keeps it. The malloc family then goes to the next definitions
//! after this library, every block of every size; what the arena pages is that allocator's own
//! memory, its large anonymous `mmap`s (jemalloc's extents), which the `mmap` hook serves.
//! Splitting its requests between glibc and the arena instead would keep a program's small
//! objects (redis's 1 KB values) out of the arena and hand the allocator pointers it never
//! made (its `malloc_usable_size` crashes on a glibc block).
//!
//! The choice is made once, at the first malloc-family call (before any block exists, so no
//! block ever goes to the wrong `free`): `dlsym(RTLD_NEXT, "malloc")` and `dladdr`, which
//! allocate nothing for a symbol that exists. A block handed out while that lookup runs (a
//! lookup that did allocate) came from glibc and is remembered, so its `free` goes to glibc.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{
    AtomicU8, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

const UNKNOWN: u8 = 0;
const RESOLVING: u8 = 1;
const GLIBC: u8 = 2;
const NEXT: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

thread_local! {
    /// True on the thread running the lookup: its own allocations go to glibc.
    static HERE: Cell<bool> = const { Cell::new(false) };
}

/// The next allocator's functions (valid in `NEXT` mode).
static N_MALLOC: AtomicUsize = AtomicUsize::new(0);
static N_FREE: AtomicUsize = AtomicUsize::new(0);
static N_CALLOC: AtomicUsize = AtomicUsize::new(0);
static N_REALLOC: AtomicUsize = AtomicUsize::new(0);
static N_MEMALIGN: AtomicUsize = AtomicUsize::new(0);
static N_USABLE: AtomicUsize = AtomicUsize::new(0);

/// glibc blocks handed out during the lookup (addresses; 0 = empty), and how many are held.
const EARLY_MAX: usize = 16;
static EARLY: [AtomicUsize; EARLY_MAX] = [const { AtomicUsize::new(0) }; EARLY_MAX];
static EARLY_N: AtomicUsize = AtomicUsize::new(0);

/// Where a malloc-family call goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The next allocator (not glibc's), every block.
    Next,
    /// glibc's, with large requests from the arena (the hooks' own split).
    Glibc,
    /// glibc's, remembered: this thread is doing the lookup.
    Early,
}

/// Where the malloc family goes (resolving it on the first call).
#[inline]
pub(crate) fn route() -> Route {
    match MODE.load(Acquire) {
        NEXT => Route::Next,
        GLIBC => Route::Glibc,
        _ => resolve(),
    }
}

/// Whether `p` is a glibc block handed out during the lookup (and forgets it if `take`).
#[inline]
pub(crate) fn early(p: usize, take: bool) -> bool {
    if EARLY_N.load(Relaxed) == 0 {
        return false;
    }
    for e in &EARLY {
        if e.load(Relaxed) == p {
            if take && e.compare_exchange(p, 0, Relaxed, Relaxed).is_ok() {
                // The last one forgotten puts `free`'s fast path back.
                EARLY_N.fetch_sub(1, Relaxed);
            }
            return true;
        }
    }
    false
}

/// Remembers a glibc block handed out during the lookup (see [`early`]).
pub(crate) fn note_early(p: *mut c_void) -> *mut c_void {
    if !p.is_null() {
        for e in &EARLY {
            if e.compare_exchange(0, p as usize, Relaxed, Relaxed).is_ok() {
                EARLY_N.fetch_add(1, Relaxed);
                break;
            }
        }
    }
    p
}

#[cold]
fn resolve() -> Route {
    if MODE
        .compare_exchange(UNKNOWN, RESOLVING, Acquire, Acquire)
        .is_err()
    {
        if HERE.try_with(|h| h.get()).unwrap_or(true) {
            return Route::Early;
        }
        // Another thread is looking: wait for its answer (a few microseconds, once).
        while MODE.load(Acquire) == RESOLVING {
            std::hint::spin_loop();
        }
        return if MODE.load(Acquire) == NEXT {
            Route::Next
        } else {
            Route::Glibc
        };
    }
    let _ = HERE.try_with(|h| h.set(true));
    let (mode, r) = if lookup() {
        (NEXT, Route::Next)
    } else {
        (GLIBC, Route::Glibc)
    };
    let _ = HERE.try_with(|h| h.set(false));
    MODE.store(mode, Release);
    r
}

/// The base address of the object defining the code at `f`.
fn object_of(f: usize) -> usize {
    // SAFETY: Dl_info is plain old data; dladdr fills it for an address in a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables.
    if unsafe { libc::dladdr(f as *const c_void, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

fn sym(name: &std::ffi::CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
}

/// Finds the next allocator; true when it is not glibc's and has what the hooks need.
fn lookup() -> bool {
    let m = sym(c"malloc");
    let glibc = object_of(crate::__libc_malloc as *const () as usize);
    if m == 0 || glibc == 0 || object_of(m) == glibc {
        return false;
    }
    let (f, c, r, a, u) = (
        sym(c"free"),
        sym(c"calloc"),
        sym(c"realloc"),
        sym(c"posix_memalign"),
        sym(c"malloc_usable_size"),
    );
    // All from the same object, or the blocks of one would reach another's free.
    let obj = object_of(m);
    if [f, c, r, a, u]
        .iter()
        .any(|&x| x == 0 || object_of(x) != obj)
    {
        return false;
    }
    N_MALLOC.store(m, Relaxed);
    N_FREE.store(f, Relaxed);
    N_CALLOC.store(c, Relaxed);
    N_REALLOC.store(r, Relaxed);
    N_MEMALIGN.store(a, Relaxed);
    N_USABLE.store(u, Relaxed);
    true
}

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type MemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;

macro_rules! next_fn {
    ($slot:ident as $ty:ty) => {{
        // Set by `lookup` to the next definition of this function, with this signature, before
        // NEXT mode is published (callers check `route()` first); used inside their unsafe.
        std::mem::transmute::<usize, $ty>($slot.load(Relaxed))
    }};
}

/// The next allocator's `malloc`.
pub(crate) unsafe fn malloc(n: usize) -> *mut c_void {
    // SAFETY: malloc's contract.
    unsafe { next_fn!(N_MALLOC as MallocFn)(n) }
}

/// The next allocator's `free` (of its own block).
pub(crate) unsafe fn free(p: *mut c_void) {
    // SAFETY: free's contract.
    unsafe { next_fn!(N_FREE as FreeFn)(p) }
}

/// The next allocator's `calloc`.
pub(crate) unsafe fn calloc(n: usize, s: usize) -> *mut c_void {
    // SAFETY: calloc's contract.
    unsafe { next_fn!(N_CALLOC as CallocFn)(n, s) }
}

/// The next allocator's `realloc` (of its own block).
pub(crate) unsafe fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: realloc's contract.
    unsafe { next_fn!(N_REALLOC as ReallocFn)(p, n) }
}

/// The next allocator's `posix_memalign`, the one aligned entry every other is built on.
pub(crate) unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> c_int {
    // SAFETY: posix_memalign's contract.
    unsafe { next_fn!(N_MEMALIGN as MemalignFn)(out, align, n) }
}

/// The next allocator's `malloc_usable_size` (of its own block).
pub(crate) unsafe fn usable(p: *mut c_void) -> usize {
    // SAFETY: malloc_usable_size's contract.
    unsafe { next_fn!(N_USABLE as UsableFn)(p) }
}
