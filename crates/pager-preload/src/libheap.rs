//! The library's own heap for malloc-family calls made in tiermem code while the program has
//! an allocator of its own ([`crate::next`]): glibc's internals allocate through the hooked
//! names (a thread's first thread-local destructor, `opendir`), and tiermem code runs where
//! the program's allocator must not be entered (see `tiermem_fault::scope`). glibc's heap
//! would do, but its blocks could not be told from the program allocator's at `free`; these
//! come from one reserved range, so `free` knows them by address (one compare pair, like the
//! arena).
//!
//! Size classes of powers of two from 16 B to 4 MiB, each block headed by 16 bytes (its
//! class and its start), free lists per class under one spin lock: the callers are few and
//! their calls rare (thread starts, a directory read per control window).

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{
    AtomicBool, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

const MIN_SHIFT: usize = 4;
const CLASSES: usize = 19; // 16 B << 18 = 4 MiB
const HEADER: usize = 16;
/// Reserved (not committed) address space: pages are committed as blocks are first used.
const RANGE: usize = 1 << 30;

static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
static LOCK: AtomicBool = AtomicBool::new(false);
/// Bump offset of the next fresh block (under LOCK).
static TOP: AtomicUsize = AtomicUsize::new(0);
/// Heads of the free lists (under LOCK): a free block's first word links the next.
static FREE: [AtomicUsize; CLASSES] = [const { AtomicUsize::new(0) }; CLASSES];

struct Locked;

impl Locked {
    fn take() -> Locked {
        while LOCK
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        Locked
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        LOCK.store(false, Release);
    }
}

/// Whether `p` is one of this heap's blocks.
#[inline]
pub(crate) fn owns(p: usize) -> bool {
    p >= BASE.load(Relaxed) && p < END.load(Relaxed)
}

fn class_of(size: usize) -> Option<usize> {
    let need = size.max(1).next_power_of_two().max(1 << MIN_SHIFT);
    let c = need.trailing_zeros() as usize - MIN_SHIFT;
    (c < CLASSES).then_some(c)
}

fn class_bytes(c: usize) -> usize {
    1 << (c + MIN_SHIFT)
}

/// Reserves the range on first use (under LOCK).
fn reserve() -> bool {
    if BASE.load(Relaxed) != 0 {
        return true;
    }
    // SAFETY: a fresh anonymous reservation; the raw system call, not the hooked mmap.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            0usize,
            RANGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0usize,
        )
    } as usize;
    if p as isize == -1 || p == 0 {
        return false;
    }
    END.store(p + RANGE, Relaxed);
    BASE.store(p, Release);
    true
}

/// A block of at least `size` bytes aligned to `align` (a power of two); null when too large.
pub(crate) fn alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(16);
    // Room to move the start up to the alignment, after the header.
    let Some(c) = class_of(size.saturating_add(HEADER + align - 16)) else {
        return ptr::null_mut();
    };
    let _l = Locked::take();
    if !reserve() {
        return ptr::null_mut();
    }
    let base = BASE.load(Relaxed);
    let block = match FREE[c].load(Relaxed) {
        0 => {
            let off = TOP.load(Relaxed);
            if off + class_bytes(c) > RANGE {
                return ptr::null_mut();
            }
            TOP.store(off + class_bytes(c), Relaxed);
            base + off
        }
        b => {
            // SAFETY: a free block of ours: its first word is the next free block.
            FREE[c].store(unsafe { *(b as *const usize) }, Relaxed);
            b
        }
    };
    let user = (block + HEADER).next_multiple_of(align);
    // SAFETY: the header's two words are inside the block, before `user`.
    unsafe {
        *((user - 16) as *mut usize) = c;
        *((user - 8) as *mut usize) = block;
    }
    user as *mut c_void
}

/// Usable bytes of block `p` (one of ours).
pub(crate) fn usable(p: usize) -> usize {
    // SAFETY: `p` is one of our blocks: its header precedes it.
    let (c, block) = unsafe { (*((p - 16) as *const usize), *((p - 8) as *const usize)) };
    block + class_bytes(c) - p
}

/// Frees block `p` (one of ours).
pub(crate) fn free(p: usize) {
    // SAFETY: `p` is one of our blocks: its header precedes it.
    let (c, block) = unsafe { (*((p - 16) as *const usize), *((p - 8) as *const usize)) };
    if c >= CLASSES || !owns(block) {
        return;
    }
    let _l = Locked::take();
    // SAFETY: the block is ours and free now: its first word links the list.
    unsafe { *(block as *mut usize) = FREE[c].load(Relaxed) };
    FREE[c].store(block, Relaxed);
}

/// `realloc` of block `p` (one of ours) to `size` bytes: a new block of this heap.
pub(crate) fn realloc(p: usize, size: usize) -> *mut c_void {
    let old = usable(p);
    if size <= old {
        return p as *mut c_void;
    }
    let q = alloc(size, 16);
    if !q.is_null() {
        // SAFETY: both blocks hold at least `old` bytes and do not overlap.
        unsafe { ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old) };
        free(p);
    }
    q
}
