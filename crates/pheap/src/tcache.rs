//! Per-thread allocation caches (issue #21 part 3): small objects allocated and freed without
//! the heap's lock, and how a checkpoint excludes them.
//!
//! Each thread keeps, per size class, a stack of slots it has taken from the heap
//! ([`Alloc::reserve`]: taken in the superblock's bitmap, no object in them). `malloc` pops
//! one and writes the object's size into its slot entry; `free` checks the entry (an object
//! must be there: a double free or a pointer that is no object's start goes to the locked path,
//! which reports it), clears the size and pushes the slot. Neither touches the superblock, its
//! bitmap or the lock: one entry (in the [`SlotTable`]) and the thread's own stack. Refills and
//! flushes move half a stack at a time under the lock, as jemalloc's tcache does. The dirty
//! flags beside the size are the same as the locked allocator's; only a slot's *first* change
//! since the last checkpoint (which must list its offset) takes the lock.
//!
//! **Checkpoints.** A checkpoint reads the slot entries and must not see them change. It
//! raises the heap's `ck` flag under the lock; a cache operation announces itself in its
//! thread's `busy` flag *before* it reads `ck`, and gives way to the lock when `ck` is up. The
//! checkpoint then waits until no registered thread is busy. The two sides order their store
//! and load with an asymmetric fence: a compiler fence in the cache operation, and
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` in the checkpoint, which runs a full barrier
//! on every CPU running one of the process's threads (liburcu's and folly's scheme). A cache
//! operation thus costs no locked instruction at all, and the checkpoint one system call when
//! another thread has a cache. Without membarrier every call takes the lock.
//!
//! A thread's cache belongs to one heap at a time; when the thread exits, or uses another
//! heap, its slots go back through the heap's `returned` list (the heap's lock is not
//! reachable from there), which the next refill or checkpoint drains.

use crate::alloc::{entry, entry_flags, entry_size, Alloc, CLASSES, FRESH, LISTED};
use std::cell::Cell;
use std::sync::atomic::{
    compiler_fence, AtomicBool, AtomicIsize, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::sync::{Arc, Mutex, Weak};

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 8;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 16;

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        ) == 0
    }
}

/// Whether this process registered for private expedited membarriers (once per process).
fn membarrier_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED))
}

/// A full memory barrier on every CPU running a thread of this process.
fn barrier_all() {
    if membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        return;
    }
    // A forked child may have lost the registration: register again, else the slow global one.
    if membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
        && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
    {
        return;
    }
    membarrier(MEMBARRIER_CMD_GLOBAL);
}

/// The most slots a thread caches of class `c`: 64 of the small classes, fewer of the large
/// ones (32 KiB of slots), at least 8. A table: with a run-time class the division was an
/// instruction on every free.
fn cap(c: usize) -> usize {
    CAP[c]
}

const CAP: [usize; CLASSES.len()] = {
    let mut t = [0usize; CLASSES.len()];
    let mut c = 0;
    while c < CLASSES.len() {
        let n = 32768 / CLASSES[c];
        t[c] = if n < 8 {
            8
        } else if n > 64 {
            64
        } else {
            n
        };
        c += 1;
    }
    t
};

/// What a heap shares with the threads' caches.
pub(crate) struct Shared {
    id: u64,
    table: Arc<crate::alloc::SlotTable>,
    /// The region shift, when caches work on this heap (membarrier available, superblocks a
    /// power of two).
    shift: Option<u32>,
    /// A checkpoint is running: cache operations take the lock.
    ck: AtomicBool,
    /// Some live object has a name: frees take the lock (which drops names).
    pub(crate) names: AtomicBool,
    threads: Mutex<Vec<Arc<ThreadSlot>>>,
    /// Slots of caches whose thread exited or moved to another heap, still taken.
    returned: Mutex<Vec<usize>>,
    /// Objects allocated minus freed by caches whose thread exited.
    exited: AtomicIsize,
}

/// A thread's state as the checkpoint sees it.
struct ThreadSlot {
    /// The thread is inside a cache operation.
    busy: AtomicBool,
    /// Objects allocated minus freed by this thread's cache (written by its thread only).
    delta: AtomicIsize,
    /// The thread's id, to tell a thread that no longer exists (a forked child inherits the
    /// registrations of its parent's other threads, one of which may have been busy).
    tid: libc::pid_t,
}

impl ThreadSlot {
    fn add(&self, d: isize) {
        self.delta.store(self.delta.load(Relaxed) + d, Relaxed);
    }
}

/// One thread's cache for one heap.
struct Cache {
    id: u64,
    heap: Weak<Shared>,
    slot: Arc<ThreadSlot>,
    bins: Vec<Vec<usize>>,
}

impl Drop for Cache {
    fn drop(&mut self) {
        // A section: a stop must not park this thread holding `returned` or `threads`, which
        // the checkpoint takes.
        let _s = tiermem_fault::safepoint::section();
        let Some(sh) = self.heap.upgrade() else {
            return;
        };
        let mut r = sh.returned.lock().unwrap_or_else(|e| e.into_inner());
        for b in &mut self.bins {
            r.append(b);
        }
        drop(r);
        sh.exited.fetch_add(self.slot.delta.load(Relaxed), Relaxed);
        sh.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|t| !Arc::ptr_eq(t, &self.slot));
    }
}

thread_local! {
    /// This thread's cache: null (none yet), [`BUSY`] (in use: a call from a signal handler
    /// interrupted a cache operation), [`DEAD`] (its thread-locals are being torn down), or a
    /// cache leaked from a `Box`. Constant-initialised and without a destructor, so an access
    /// is one thread-local load, without the state tests of a lazily initialised or dropped
    /// thread-local (a `RefCell<Option<Cache>>` here cost ~10 instructions a call).
    static CACHE: Cell<*mut Cache> = const { Cell::new(std::ptr::null_mut()) };
    /// Frees this thread's cache when the thread exits (registered with the first cache).
    static CACHE_OWNER: CacheOwner = const { CacheOwner };
}

/// [`CACHE`] while a cache operation uses it.
const BUSY: *mut Cache = 1 as *mut Cache;
/// [`CACHE`] once its thread is exiting.
const DEAD: *mut Cache = 2 as *mut Cache;

/// Whether a [`CACHE`] value is a cache.
fn is_cache(p: *mut Cache) -> bool {
    !p.is_null() && p != BUSY && p != DEAD
}

/// Drops this thread's cache at thread exit (see [`CACHE`]).
struct CacheOwner;

impl Drop for CacheOwner {
    fn drop(&mut self) {
        let p = CACHE.with(|c| c.replace(DEAD));
        if is_cache(p) {
            // SAFETY: a cache leaked from a Box by `new_cache`, taken out of CACHE just now.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Shared {
    /// The shared state of a heap whose allocator is `a`.
    pub(crate) fn new(a: &Alloc) -> Arc<Shared> {
        let table = a.table().clone();
        let shift = table.region_shift.filter(|_| membarrier_ready());
        Arc::new(Shared {
            id: NEXT_ID.fetch_add(1, Relaxed),
            table,
            shift,
            ck: AtomicBool::new(false),
            names: AtomicBool::new(a.has_names()),
            threads: Mutex::new(Vec::new()),
            returned: Mutex::new(Vec::new()),
            exited: AtomicIsize::new(0),
        })
    }

    /// Live objects: `a`'s count plus what the caches allocated and freed.
    pub(crate) fn live(&self, a: &Alloc) -> usize {
        let t: isize = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|t| t.delta.load(Relaxed))
            .sum();
        (a.count() + self.exited.load(Relaxed) + t).max(0) as usize
    }

    /// Gives the slots of exited threads' caches back to `a` (under the heap's lock).
    pub(crate) fn drain_returned(&self, a: &mut Alloc) {
        let r = std::mem::take(&mut *self.returned.lock().unwrap_or_else(|e| e.into_inner()));
        for off in r {
            a.unreserve(off);
        }
    }

    /// Stops cache operations for a checkpoint (called with the heap's lock held): raises
    /// `ck` and waits until no thread is inside one. Returns a guard that lowers `ck`.
    pub(crate) fn exclude(&self) -> Exclusive<'_> {
        self.ck.store(true, SeqCst);
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let me = CACHE.with(Cell::get);
        // SAFETY: a cache of this thread, not in use (a cache operation of this thread would
        // be BUSY); it lives until this thread replaces or drops it.
        let me = is_cache(me).then(|| Arc::as_ptr(unsafe { &(*me).slot }));
        let others: Vec<&Arc<ThreadSlot>> = threads
            .iter()
            .filter(|t| Some(Arc::as_ptr(t)) != me)
            .collect();
        if !others.is_empty() {
            // Every other thread either has its `busy` store visible now, or will see `ck`.
            barrier_all();
            for t in others {
                let mut spins = 0u32;
                while t.busy.load(Acquire) {
                    std::thread::yield_now();
                    spins += 1;
                    // A cache operation takes well under a microsecond unless its thread is
                    // preempted; after ~a thousand yields, check that the thread still exists.
                    if spins % 1024 == 0 && !thread_alive(t.tid) {
                        break;
                    }
                }
            }
        }
        Exclusive(self)
    }
}

/// Whether thread `tid` of this process exists (its `/proc/self/task` entry).
fn thread_alive(tid: libc::pid_t) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

/// Cache operations are held off while this lives ([`Shared::exclude`]).
pub(crate) struct Exclusive<'a>(&'a Shared);

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        self.0.ck.store(false, Release);
    }
}

/// Runs `f` with this thread's cache for heap `sh` (creating it, and giving back the one of
/// another heap); `None` when the thread has no usable cache (its thread-locals are being torn
/// down, or a signal handler interrupted a cache operation).
#[inline(always)]
fn with_cache<R>(sh: &Arc<Shared>, f: impl FnOnce(&mut Cache) -> Option<R>) -> Option<R> {
    // SAFETY: CACHE is constant-initialised and has no destructor: its storage lives as long
    // as this thread, so the reference outlives this call.
    let cell: &Cell<*mut Cache> = unsafe { &*CACHE.with(|c| c as *const Cell<*mut Cache>) };
    let mut p = cell.get();
    // SAFETY: a cache of this thread, not in use (checked first).
    if !is_cache(p) || unsafe { (*p).id } != sh.id {
        p = new_cache(cell, p, sh)?;
    }
    cell.set(BUSY);
    // SAFETY: this thread's cache, marked in use until `f` returns.
    let r = f(unsafe { &mut *p });
    cell.set(p);
    r
}

/// Makes this thread's cache for heap `sh` (`p`: the current value of `cell`), giving back the
/// cache of another heap; `None` while a cache operation is in progress or after the thread's
/// thread-locals went away.
#[cold]
#[inline(never)]
fn new_cache(cell: &Cell<*mut Cache>, p: *mut Cache, sh: &Arc<Shared>) -> Option<*mut Cache> {
    if p == BUSY || p == DEAD {
        return None;
    }
    // Registers the owner that drops the cache at thread exit (fails once exit has begun).
    CACHE_OWNER.try_with(|_| ()).ok()?;
    cell.set(BUSY);
    if is_cache(p) {
        // SAFETY: a cache leaked from a Box below, owned by CACHE; gives the old heap's slots
        // back (Drop).
        drop(unsafe { Box::from_raw(p) });
    }
    let slot = Arc::new(ThreadSlot {
        busy: AtomicBool::new(false),
        delta: AtomicIsize::new(0),
        // SAFETY: gettid has no preconditions.
        tid: unsafe { libc::gettid() },
    });
    sh.threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(slot.clone());
    let c = Box::into_raw(Box::new(Cache {
        id: sh.id,
        heap: Arc::downgrade(sh),
        slot,
        bins: (0..CLASSES.len())
            .map(|c| Vec::with_capacity(cap(c)))
            .collect(),
    }));
    cell.set(c);
    Some(c)
}

/// Enters a cache operation: false when a checkpoint runs (take the lock instead).
#[inline]
fn enter(sh: &Shared, t: &ThreadSlot) -> bool {
    t.busy.store(true, Relaxed);
    // Orders the store above before the load below against the checkpoint's membarrier.
    compiler_fence(SeqCst);
    if sh.ck.load(Relaxed) {
        t.busy.store(false, Release);
        return false;
    }
    true
}

#[inline]
fn leave(t: &ThreadSlot) {
    t.busy.store(false, Release);
}

/// One cache operation on slot entry `e`: stores `next(current value)` when that is `Some`.
/// False when a checkpoint runs or `next` declines (the caller takes the locked path).
#[inline]
fn update(
    sh: &Shared,
    t: &ThreadSlot,
    e: &std::sync::atomic::AtomicU16,
    next: impl FnOnce(u16) -> Option<u16>,
) -> bool {
    if !enter(sh, t) {
        return false;
    }
    let done = match next(e.load(Relaxed)) {
        Some(v) => {
            e.store(v, Relaxed);
            true
        }
        None => false,
    };
    leave(t);
    done
}

/// The entry of an object of `size` bytes put into (or resized in) a slot whose entry is `v`:
/// `None` unless the slot is listed (its first change since the last checkpoint takes the
/// lock) and, for a new object (`new`), empty, or else holding one.
#[inline]
fn with_object(v: u16, size: usize, new: bool) -> Option<u16> {
    let f = entry_flags(v);
    (f & LISTED != 0 && (entry_size(v) == 0) == new).then(|| entry(size, f | FRESH))
}

/// Allocates an object of `size` bytes (≤ one page) of class `c` from this thread's cache;
/// `lock` gives the allocator under the heap's lock (refills, and a slot's first change since
/// the last checkpoint). Returns the heap offset, or `None` when the cache cannot serve it
/// (the caller takes the locked path, which also reports a full heap).
pub(crate) fn malloc<G: std::ops::DerefMut<Target = Alloc>>(
    sh: &Arc<Shared>,
    c: usize,
    size: usize,
    lock: impl FnOnce() -> G,
) -> Option<usize> {
    let shift = sh.shift?;
    with_cache(sh, |cache| {
        if let Some(&off) = cache.bins[c].last() {
            let e = sh.table.slot_entry(off, c, shift)?;
            if update(sh, &cache.slot, e, |v| with_object(v, size, true)) {
                cache.bins[c].pop();
                cache.slot.add(1);
                return Some(off);
            }
        }
        let mut a = lock();
        if cache.bins[c].is_empty() {
            sh.drain_returned(&mut a);
            a.reserve(c, cap(c) / 2, &mut cache.bins[c]);
        }
        let off = cache.bins[c].pop()?;
        a.take_reserved(off, size);
        Some(off)
    })
}

/// Frees the small object starting at heap offset `off` into this thread's cache. Returns
/// `Some` when done, `None` when the locked path must do it (no object starts there, the
/// slot's first change since the last checkpoint, a checkpoint running, named objects, no
/// cache).
pub(crate) fn free<G: std::ops::DerefMut<Target = Alloc>>(
    sh: &Arc<Shared>,
    off: usize,
    lock: impl FnOnce() -> G,
) -> Option<()> {
    let shift = sh.shift?;
    let c = sh.table.class_at(off, shift)?;
    let e = sh.table.slot_entry(off, c, shift)?;
    if sh.names.load(Relaxed) {
        return None;
    }
    with_cache(sh, |cache| {
        if cache.bins[c].len() >= cap(c) {
            // Full: the older half goes back to the superblocks.
            let mut a = lock();
            sh.drain_returned(&mut a);
            for o in cache.bins[c].drain(..cap(c) / 2) {
                a.unreserve(o);
            }
        }
        let freed = update(sh, &cache.slot, e, |v| {
            let f = entry_flags(v);
            (entry_size(v) != 0 && f & LISTED != 0).then(|| entry(0, f & !FRESH))
        });
        if !freed {
            return None;
        }
        cache.bins[c].push(off);
        cache.slot.add(-1);
        Some(())
    })
}

/// The requested size and class of the small object starting at heap offset `off`, read
/// without the lock; `None` when no small object starts there, when caches do not work on
/// this heap, or when objects have names (the locked path keeps them).
pub(crate) fn small_object(sh: &Shared, off: usize) -> Option<(usize, usize)> {
    let shift = sh.shift?;
    if sh.names.load(Relaxed) {
        return None;
    }
    let c = sh.table.class_at(off, shift)?;
    let size = entry_size(sh.table.slot_entry(off, c, shift)?.load(Relaxed));
    (size != 0).then_some((size, c))
}

/// Changes the requested size of the small object of class `c` at `off` to `size` (at most
/// the class size) in place, as `Alloc::resize_in_place` does (the object is then copied
/// whole by the next checkpoint). `None` when the locked path must do it (the slot's first
/// change since the last checkpoint, a checkpoint running, the object gone).
pub(crate) fn resize(sh: &Arc<Shared>, off: usize, c: usize, size: usize) -> Option<()> {
    let shift = sh.shift?;
    let e = sh.table.slot_entry(off, c, shift)?;
    with_cache(sh, |cache| {
        update(sh, &cache.slot, e, |v| with_object(v, size, false)).then_some(())
    })
}
