//! The real functions behind the hooks and the library's own allocator.
//!
//! * `mmap`, `munmap`, `mremap`, `madvise`, `mprotect`, `sbrk`, `brk`, `mallopt`,
//!   `malloc_trim`: `dlsym(RTLD_NEXT)`, resolved on first use (raw system calls if dlsym
//!   fails, which it does not on glibc).
//! * The malloc family: `dlsym(RTLD_NEXT)` too, so a program whose allocator is another shared
//!   library (jemalloc) keeps it. The family is resolved together, once; an allocation made
//!   while that runs (dlsym may allocate) comes from a small static bootstrap arena whose
//!   blocks are never given back.
//! * The library's own Rust allocations (the service thread, the exit report) go to glibc's
//!   `__libc_*` functions, never to the exported `malloc`, so they never recurse into the hooks.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Acquire, Ordering::Relaxed};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_valloc(size: usize) -> *mut c_void;
    fn __libc_pvalloc(size: usize) -> *mut c_void;
}

/// glibc's `malloc` (to recognise it as the real one).
pub fn glibc_malloc() -> usize {
    __libc_malloc as *const () as usize
}

// ---------------------------------------------------------------------------------------------
// the library's own allocator
// ---------------------------------------------------------------------------------------------

/// The library's Rust allocator: glibc's malloc under its internal names.
struct LibcAlloc;

// SAFETY: the __libc_* functions implement malloc/free/realloc/memalign with their documented
// contracts; alignments above 16 go through __libc_memalign (and realloc copies by hand).
unsafe impl GlobalAlloc for LibcAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain glibc allocation calls.
        unsafe {
            if l.align() <= 16 {
                __libc_malloc(l.size()) as *mut u8
            } else {
                __libc_memalign(l.align(), l.size()) as *mut u8
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: `p` came from `alloc`/`realloc` above, i.e. from glibc.
        unsafe { __libc_free(p as *mut c_void) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain glibc allocation calls; the memalign result is zeroed by hand.
        unsafe {
            if l.align() <= 16 {
                __libc_calloc(1, l.size()) as *mut u8
            } else {
                let p = self.alloc(l);
                if !p.is_null() {
                    ptr::write_bytes(p, 0, l.size());
                }
                p
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` is a live glibc block of `l.size()` bytes (GlobalAlloc contract).
        unsafe {
            if l.align() <= 16 {
                return __libc_realloc(p as *mut c_void, new) as *mut u8;
            }
            let q = self.alloc(Layout::from_size_align_unchecked(new, l.align()));
            if !q.is_null() {
                ptr::copy_nonoverlapping(p, q, l.size().min(new));
                __libc_free(p as *mut c_void);
            }
            q
        }
    }
}

#[global_allocator]
static GLOBAL: LibcAlloc = LibcAlloc;

// ---------------------------------------------------------------------------------------------
// function types
// ---------------------------------------------------------------------------------------------

/// `malloc`, `valloc`, `pvalloc`.
pub type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
/// `free`.
pub type FreeFn = unsafe extern "C" fn(*mut c_void);
/// `calloc`.
pub type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
/// `realloc`.
pub type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
/// `memalign`, `aligned_alloc`.
pub type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
/// `posix_memalign`.
pub type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
/// `mmap`.
pub type MmapFn =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void;
/// `munmap`.
pub type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
/// `mremap` (variadic: the new address follows when MREMAP_FIXED is set).
pub type MremapFn = unsafe extern "C" fn(*mut c_void, usize, usize, c_int, ...) -> *mut c_void;
/// `madvise`, `mprotect`.
pub type AdviseFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
/// `sbrk`.
pub type SbrkFn = unsafe extern "C" fn(libc::intptr_t) -> *mut c_void;
/// `brk`.
pub type BrkFn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `mallopt`.
pub type MalloptFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
/// `malloc_trim`.
pub type TrimFn = unsafe extern "C" fn(usize) -> c_int;

fn lookup(name: &CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the next definition after this
    // library (glibc's, or another allocator's).
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
}

// ---------------------------------------------------------------------------------------------
// the mmap family: resolved one by one, on first use
// ---------------------------------------------------------------------------------------------

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

fn errno_ret<T>(r: libc::c_long, fail: T, ok: impl FnOnce(libc::c_long) -> T) -> T {
    if r < 0 {
        fail
    } else {
        ok(r)
    }
}

unsafe extern "C" fn sys_mmap(
    a: *mut c_void,
    l: usize,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: libc::off_t,
) -> *mut c_void {
    // SAFETY: the raw system call with the caller's arguments (the caller's contract).
    let r = unsafe { libc::syscall(libc::SYS_mmap, a, l, p, f, fd, o) };
    errno_ret(r, libc::MAP_FAILED, |r| r as *mut c_void)
}
unsafe extern "C" fn sys_munmap(a: *mut c_void, l: usize) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_munmap, a, l) as c_int }
}
unsafe extern "C" fn sys_madvise(a: *mut c_void, l: usize, adv: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_madvise, a, l, adv) as c_int }
}
unsafe extern "C" fn sys_mprotect(a: *mut c_void, l: usize, p: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_mprotect, a, l, p) as c_int }
}
unsafe extern "C" fn no_sbrk(_i: libc::intptr_t) -> *mut c_void {
    usize::MAX as *mut c_void
}
unsafe extern "C" fn no_brk(_a: *mut c_void) -> c_int {
    -1
}
unsafe extern "C" fn no_mallopt(_p: c_int, _v: c_int) -> c_int {
    0
}
unsafe extern "C" fn no_trim(_pad: usize) -> c_int {
    0
}

lazy_real!(
    /// The real `mmap`.
    mmap, c"mmap", MmapFn, sys_mmap
);
lazy_real!(
    /// The real `munmap`.
    munmap, c"munmap", MunmapFn, sys_munmap
);
lazy_real!(
    /// The real `madvise`.
    madvise, c"madvise", AdviseFn, sys_madvise
);
lazy_real!(
    /// The real `mprotect`.
    mprotect, c"mprotect", AdviseFn, sys_mprotect
);
lazy_real!(
    /// The real `sbrk`.
    sbrk, c"sbrk", SbrkFn, no_sbrk
);
lazy_real!(
    /// The real `brk`.
    brk, c"brk", BrkFn, no_brk
);
lazy_real!(
    /// The real `mallopt`.
    mallopt, c"mallopt", MalloptFn, no_mallopt
);
lazy_real!(
    /// The real `malloc_trim`.
    malloc_trim, c"malloc_trim", TrimFn, no_trim
);

/// The real `mremap`; `None` if dlsym cannot find it (the hook then makes the system call).
pub fn mremap() -> Option<MremapFn> {
    static P: AtomicUsize = AtomicUsize::new(0);
    let mut p = P.load(Relaxed);
    if p == 0 {
        p = lookup(c"mremap");
        if p == 0 {
            return None;
        }
        P.store(p, Relaxed);
    }
    // SAFETY: dlsym's answer for mremap, whose C prototype is MremapFn.
    Some(unsafe { std::mem::transmute::<usize, MremapFn>(p) })
}

// ---------------------------------------------------------------------------------------------
// the malloc family: resolved together, once
// ---------------------------------------------------------------------------------------------

/// The resolved malloc family (addresses; 0 until resolved).
pub struct Family {
    /// `malloc`.
    pub malloc: AtomicUsize,
    /// `free`.
    pub free: AtomicUsize,
    /// `calloc`.
    pub calloc: AtomicUsize,
    /// `realloc`.
    pub realloc: AtomicUsize,
    /// `memalign`.
    pub memalign: AtomicUsize,
    /// `aligned_alloc`.
    pub aligned_alloc: AtomicUsize,
    /// `posix_memalign`.
    pub posix_memalign: AtomicUsize,
    /// `valloc`.
    pub valloc: AtomicUsize,
    /// `pvalloc`.
    pub pvalloc: AtomicUsize,
}

/// The family's addresses.
pub static FAMILY: Family = Family {
    malloc: AtomicUsize::new(0),
    free: AtomicUsize::new(0),
    calloc: AtomicUsize::new(0),
    realloc: AtomicUsize::new(0),
    memalign: AtomicUsize::new(0),
    aligned_alloc: AtomicUsize::new(0),
    posix_memalign: AtomicUsize::new(0),
    valloc: AtomicUsize::new(0),
    pvalloc: AtomicUsize::new(0),
};

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const RESOLVED: u8 = 2;
static FAMILY_STATE: AtomicU8 = AtomicU8::new(UNRESOLVED);

unsafe extern "C" fn fallback_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
) -> c_int {
    if !align.is_power_of_two() || align % std::mem::size_of::<usize>() != 0 {
        return libc::EINVAL;
    }
    // SAFETY: plain glibc allocation; `out` is the caller's writable pointer.
    unsafe {
        let p = __libc_memalign(align, size);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
    }
    0
}

/// Resolves the malloc family. Returns false while another call on some thread is resolving
/// it (dlsym allocating): the caller then serves from the bootstrap arena.
pub fn resolve_family() -> bool {
    match FAMILY_STATE.compare_exchange(UNRESOLVED, RESOLVING, Acquire, Acquire) {
        Ok(_) => {}
        Err(RESOLVED) => return true,
        Err(_) => return false,
    }
    let get = |name: &CStr, fallback: usize| match lookup(name) {
        0 => fallback,
        p => p,
    };
    let f = &FAMILY;
    f.free
        .store(get(c"free", __libc_free as *const () as usize), Relaxed);
    f.calloc
        .store(get(c"calloc", __libc_calloc as *const () as usize), Relaxed);
    f.realloc.store(
        get(c"realloc", __libc_realloc as *const () as usize),
        Relaxed,
    );
    f.memalign.store(
        get(c"memalign", __libc_memalign as *const () as usize),
        Relaxed,
    );
    f.aligned_alloc.store(
        get(c"aligned_alloc", __libc_memalign as *const () as usize),
        Relaxed,
    );
    f.posix_memalign.store(
        get(
            c"posix_memalign",
            fallback_posix_memalign as *const () as usize,
        ),
        Relaxed,
    );
    f.valloc
        .store(get(c"valloc", __libc_valloc as *const () as usize), Relaxed);
    f.pvalloc.store(
        get(c"pvalloc", __libc_pvalloc as *const () as usize),
        Relaxed,
    );
    // malloc last: its address being set is what the hooks' fast paths test.
    f.malloc
        .store(get(c"malloc", __libc_malloc as *const () as usize), Relaxed);
    FAMILY_STATE.store(RESOLVED, std::sync::atomic::Ordering::Release);
    true
}

macro_rules! family_fn {
    ($(#[$doc:meta])* $name:ident, $ty:ty) => {
        $(#[$doc])*
        /// `None` while the family is being resolved (use the bootstrap arena).
        #[inline(always)]
        pub fn $name() -> Option<$ty> {
            let mut p = FAMILY.$name.load(Relaxed);
            if p == 0 {
                if !resolve_family() {
                    return None;
                }
                p = FAMILY.$name.load(Relaxed);
            }
            // SAFETY: `p` is the address of the next definition of this symbol (dlsym) or
            // glibc's own, both with the C prototype `$ty`.
            Some(unsafe { std::mem::transmute::<usize, $ty>(p) })
        }
    };
}

family_fn!(
    /// The real `malloc`.
    malloc, MallocFn
);
family_fn!(
    /// The real `free`.
    free, FreeFn
);
family_fn!(
    /// The real `calloc`.
    calloc, CallocFn
);
family_fn!(
    /// The real `realloc`.
    realloc, ReallocFn
);
family_fn!(
    /// The real `memalign`.
    memalign, MemalignFn
);
family_fn!(
    /// The real `aligned_alloc`.
    aligned_alloc, MemalignFn
);
family_fn!(
    /// The real `posix_memalign`.
    posix_memalign, PosixMemalignFn
);
family_fn!(
    /// The real `valloc`.
    valloc, MallocFn
);
family_fn!(
    /// The real `pvalloc`.
    pvalloc, MallocFn
);

// ---------------------------------------------------------------------------------------------
// the bootstrap arena
// ---------------------------------------------------------------------------------------------

const ARENA_BYTES: usize = 256 << 10;

#[repr(C, align(4096))]
struct Arena(std::cell::UnsafeCell<[u8; ARENA_BYTES]>);
// SAFETY: blocks are handed out by an atomic bump pointer: each byte belongs to one block.
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena(std::cell::UnsafeCell::new([0; ARENA_BYTES]));
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

fn arena_base() -> usize {
    ARENA.0.get() as usize
}

/// Whether `p` is a bootstrap-arena block (never freed, never handed to the real allocator).
#[inline(always)]
pub fn in_arena(p: *mut c_void) -> bool {
    (p as usize).wrapping_sub(arena_base()) < ARENA_BYTES
}

/// A zeroed arena block of `size` bytes aligned to `align` (a power of two ≤ 4096), its size
/// stored in the 8 bytes before it; null when the arena is exhausted.
pub fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.clamp(16, 4096);
    let base = arena_base();
    let mut used = ARENA_USED.load(Relaxed);
    loop {
        let start = (base + used + 16).next_multiple_of(align);
        let end = match start.checked_add(size) {
            Some(e) if e <= base + ARENA_BYTES => e,
            _ => return ptr::null_mut(),
        };
        match ARENA_USED.compare_exchange_weak(used, end - base, Relaxed, Relaxed) {
            Ok(_) => {
                // SAFETY: [start - 8, end) lies in the arena and belongs to this block only
                // (the static is zero-initialised and never reused).
                unsafe { *((start - 8) as *mut usize) = size };
                return start as *mut c_void;
            }
            Err(u) => used = u,
        }
    }
}

/// The size of an arena block.
pub fn arena_size(p: *mut c_void) -> usize {
    // SAFETY: `p` is an arena block: its size is stored in the 8 bytes before it.
    unsafe { *((p as usize - 8) as *const usize) }
}
