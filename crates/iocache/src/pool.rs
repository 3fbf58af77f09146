//! The buffer pool: frames of one page each in locked memory, a page table, CLOCK replacement,
//! pins and latches, and the I/O each mode does on a miss, an eviction and a flush.
//!
//! | event | `Buffered` | `Direct` | `Dbio` |
//! |---|---|---|---|
//! | miss | `pread` | `O_DIRECT` read | cached (`cachestat` or `RWF_NOWAIT`)? `pread` : `O_DIRECT` read |
//! | evict dirty | `pwrite` | `O_DIRECT` write | `pwrite`, + `sync_file_range(WRITE)` of the file every [`WRITEBACK_BATCH`] (*evict-dirty*) |
//! | evict clean | nothing | nothing | cached? nothing : [`EvictClean`] (*evict-clean*) |
//! | flush | `pwrite` | `O_DIRECT` write | `O_DIRECT` write (*write-direct*) |
//!
//! Under a buffered cold read ([`ColdRead`]) `Dbio` does nothing on a clean eviction: every
//! page came through the cache.
//!
//! The page cache then holds, in `Dbio`, what the pool let go of: the pool's victim cache
//! (DBIO, §3.3). Without a memory cgroup the pool keeps the page cache's share of the budget
//! itself: every [`TRIM_EVERY`] pages it leaves in the page cache it compares the file's cached
//! pages with `budget − pool` and drops the oldest it left there until under.
//!
//! Concurrency: one mutex guards the table and frame states, never held across I/O; each frame
//! has a latch (a reader–writer lock) held by its [`PageGuard`] and by the pool while it loads
//! or writes the frame, so one page has one I/O at a time (§3.3.3). A page being written back
//! by its eviction is not read again until the write is done.

use crate::error::{Error, Result};
use crate::file::DataFile;
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How the pool reads and writes its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Everything through the page cache: each pool page is held twice.
    Buffered,
    /// Everything with `O_DIRECT`: memory the pool leaves is unused by the file.
    Direct,
    /// DBIO: direct I/O for data the page cache does not hold, the page cache as victim cache.
    Dbio,
}

/// What `Dbio` does with a clean page it evicts that the page cache does not hold
/// (no stock system call caches clean data without I/O).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictClean {
    /// Write the identical bytes through the page cache: one device write, no read.
    Write,
    /// [`EvictClean::ReadaheadAll`] while the page cache's share of the budget is at least the
    /// pool, else [`EvictClean::ReadaheadReused`]. A cache as large as the pool keeps a victim
    /// about as long as the pool kept it, long enough for a page touched once to come back;
    /// a smaller one rarely does (measured, YCSB-B zipfian 0.99: at a 50 % pool selecting
    /// cut the cache hits of misses from 0.50–0.52 to 0.29–0.32, at 75 % from ~0.15–0.22 to
    /// 0.14–0.19 for 10–15 % fewer device reads; docs/iocache.md).
    Readahead,
    /// `POSIX_FADV_WILLNEED` (one asynchronous device read brings it back into the cache) for
    /// every such page.
    ReadaheadAll,
    /// `POSIX_FADV_WILLNEED` only for a page hit in the pool since its load; the others (under
    /// a skewed load most victims: cold pages passing through once) are let go.
    ReadaheadReused,
    /// Let it go: a later miss reads it from the device.
    Drop,
}

/// How `Dbio` learns whether the page cache holds a page on a miss whose cold read is
/// `O_DIRECT` (under a buffered cold read it is always `cachestat`, then `pread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `cachestat(2)` of the page's range, then `pread` or an `O_DIRECT` read.
    Cachestat,
    /// `preadv2(RWF_NOWAIT)` first (one call when cached), an `O_DIRECT` read when it fails.
    /// Measured on 6.18: a failing `RWF_NOWAIT` still starts a device read (readahead, in
    /// large folios, even under `POSIX_FADV_RANDOM`), so a miss costs two device reads.
    Nowait,
}

/// What `Dbio` does with a page it read from the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterHit {
    /// Leave it there (the paper's relaxed choice: it may be held twice for a while, but its
    /// clean eviction then costs no I/O).
    Leave,
    /// Drop it (`POSIX_FADV_DONTNEED`, batched [`DROP_BATCH`] pages at a time): no page held
    /// twice, so the page cache's share holds only victims (an exclusive victim cache), but a
    /// clean eviction of the page reads it back from the device (evict-clean readahead).
    Drop,
    /// The default: `Drop` when uncached misses are read `O_DIRECT` (the page cache is the
    /// pool's victim cache, and a page held twice wastes a victim's room), `Leave` under a
    /// buffered cold read ([`ColdRead`]: every page came through the cache, and a clean
    /// eviction counts on finding it there). Measured at the 50 % pool, YCSB-B at twice the
    /// budget: `Drop` 1.07–1.36× buffered in seven runs (median 1.30), `Leave` 0.89–1.42× in
    /// six (median 1.03); see docs/iocache.md.
    Auto,
}

/// How `Dbio` reads a miss the page cache does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColdRead {
    /// `O_DIRECT` (DBIO's path): the page is not held twice while pooled, but its clean
    /// eviction costs a device read or write ([`EvictClean`]) to cache it.
    Direct,
    /// Through the page cache: the read that brings the page in also caches it, so its clean
    /// eviction costs nothing; the page is held twice while pooled.
    Buffered,
    /// `Buffered` while the page cache's share of the budget is more than twice the pool (a
    /// small pool: duplicates cost little, evict-clean I/O much), else `Direct` (measured: see
    /// docs/iocache.md).
    Auto,
}

/// How a page is to be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only: shared latch.
    Read,
    /// Written: exclusive latch; the page is dirty once the guard is released.
    Write,
}

/// Options of [`Pool::open`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Page size: 4096, 8192 or 16384 bytes.
    pub page_size: usize,
    /// Memory budget of pool and page cache together, in bytes.
    pub budget: u64,
    /// Pool size in bytes (≤ budget): frames = pool_bytes / page_size.
    pub pool_bytes: u64,
    /// I/O mode.
    pub mode: Mode,
    /// `Dbio`'s evict-clean path.
    pub evict_clean: EvictClean,
    /// `Dbio`'s cache probe.
    pub probe: Probe,
    /// `Dbio`'s treatment of a page read from the page cache.
    pub after_hit: AfterHit,
    /// `Dbio`'s read of a miss the page cache does not hold.
    pub cold_read: ColdRead,
    /// Keep the page cache's share (`budget − pool_bytes`) by trimming pages the pool left there.
    /// Off when a memory cgroup enforces the budget.
    pub enforce_budget: bool,
    /// `mlock` the frames (the paper's pool does not swap); failure is reported in
    /// [`Stats::locked`], not an error.
    pub lock: bool,
    /// Create the file if it does not exist.
    pub create: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            page_size: 4096,
            budget: 256 << 20,
            pool_bytes: 128 << 20,
            mode: Mode::Dbio,
            evict_clean: EvictClean::Readahead,
            probe: Probe::Cachestat,
            after_hit: AfterHit::Auto,
            cold_read: ColdRead::Auto,
            enforce_budget: true,
            lock: true,
            create: true,
        }
    }
}

/// Pages left in the page cache between two budget checks.
pub const TRIM_EVERY: u64 = 64;
/// Pages read from the page cache dropped together under [`AfterHit::Drop`].
pub const DROP_BATCH: usize = 32;
/// `Dbio` dirty evictions between two starts of the file's write-back (one
/// `sync_file_range(WRITE)` over the whole file, so the device gets them as one batch).
pub const WRITEBACK_BATCH: u64 = 32;
/// No page in a frame.
const NONE: u64 = u64::MAX;

/// Counters of a pool (monotonic since open).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `get_page` calls served by a frame.
    pub pool_hits: u64,
    /// `get_page` calls that loaded the page.
    pub pool_misses: u64,
    /// Misses read from the page cache (`Dbio` probe hits; `Buffered` reads the probe saw cached).
    pub cache_hits: u64,
    /// Misses read with `O_DIRECT` (`Direct`, `Dbio` probe misses).
    pub direct_reads: u64,
    /// Misses read through the page cache without a probe (`Buffered`).
    pub buffered_reads: u64,
    /// Pages written with `O_DIRECT`.
    pub direct_writes: u64,
    /// Pages written through the page cache.
    pub buffered_writes: u64,
    /// Dirty pages evicted.
    pub evict_dirty: u64,
    /// Clean pages evicted.
    pub evict_clean: u64,
    /// `Dbio` clean evictions the page cache already held (nothing done).
    pub evict_clean_cached: u64,
    /// `Dbio` clean evictions that issued a readahead.
    pub evict_clean_readahead: u64,
    /// Pages dropped from the page cache to keep the budget.
    pub trimmed_pages: u64,
    /// Pages dropped from the page cache after a hit ([`AfterHit::Drop`]).
    pub dropped_after_hit: u64,
    /// Frames in the pool.
    pub frames: u64,
    /// Whether the frames are locked in memory.
    pub locked: bool,
}

#[derive(Clone, Copy, Debug)]
struct Meta {
    pgno: u64,
    pins: u32,
    dirty: bool,
    referenced: bool,
    /// Hit in the pool since its load ([`EvictClean::ReadaheadReused`] caches only these).
    reused: bool,
    /// The load into this frame failed: waiters retry, the last unpin frees it.
    failed: bool,
}

const EMPTY: Meta = Meta {
    pgno: NONE,
    pins: 0,
    dirty: false,
    referenced: false,
    reused: false,
    failed: false,
};

struct State {
    table: FxHashMap<u64, usize>,
    frames: Vec<Meta>,
    free: Vec<usize>,
    hand: usize,
    /// Pages whose eviction write is in flight: not to be read until it lands.
    writing: FxHashSet<u64>,
    /// Pages the pool left in the page cache, oldest first (budget trimming).
    demoted: VecDeque<u64>,
    since_check: u64,
    /// Pages read from the page cache waiting to be dropped ([`AfterHit::Drop`]).
    to_drop: Vec<u64>,
}

/// Anonymous memory holding the frames, locked when asked and allowed.
struct Arena {
    _map: crate::sys::AnonMap,
    ptr: *mut u8,
    locked: bool,
}

// SAFETY: the arena is plain memory; access to each frame is serialised by its latch.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    fn new(len: usize, lock: bool) -> Result<Arena> {
        let map = crate::sys::AnonMap::new(len)
            .map_err(|e| Error::InvalidOption(format!("cannot map a {len}-byte pool: {e}")))?;
        // mlock failing (RLIMIT_MEMLOCK) leaves the arena usable.
        let locked = lock && map.lock();
        Ok(Arena {
            ptr: map.as_ptr(),
            _map: map,
            locked,
        })
    }
}

#[derive(Default)]
struct Counters {
    pool_hits: AtomicU64,
    pool_misses: AtomicU64,
    cache_hits: AtomicU64,
    direct_reads: AtomicU64,
    buffered_reads: AtomicU64,
    direct_writes: AtomicU64,
    buffered_writes: AtomicU64,
    evict_dirty: AtomicU64,
    evict_clean: AtomicU64,
    evict_clean_cached: AtomicU64,
    evict_clean_readahead: AtomicU64,
    trimmed_pages: AtomicU64,
    dropped_after_hit: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A buffer pool over one data file. Share it between threads by reference (`&Pool`).
pub struct Pool {
    opts: Options,
    file: DataFile,
    arena: Arena,
    latches: Vec<RwLock<()>>,
    state: Mutex<State>,
    /// Signalled when an eviction write completes (`State::writing` shrinks).
    written: Condvar,
    counters: Counters,
    /// `Dbio` dirty evictions since the file's write-back was last started.
    unstarted: AtomicU64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("path", &self.file.path())
            .field("mode", &self.opts.mode)
            .field("frames", &self.latches.len())
            .finish()
    }
}

/// A page pinned by [`Pool::get_page_raw`], released by [`Pool::put_page_raw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawPin {
    frame: usize,
    pgno: u64,
    write: bool,
}

impl RawPin {
    /// The page number.
    pub fn pgno(&self) -> u64 {
        self.pgno
    }

    /// Whether the page was pinned for writing.
    pub fn is_write(&self) -> bool {
        self.write
    }
}

/// A held frame latch; its guard is kept only for its `Drop`, which releases the latch.
#[allow(dead_code)]
enum Latch<'a> {
    Read(RwLockReadGuard<'a, ()>),
    Write(RwLockWriteGuard<'a, ()>),
}

/// A pinned page: its bytes stay in the frame, and no other thread writes them, while the guard
/// lives. Dropping it is `put_page`.
pub struct PageGuard<'a> {
    pool: &'a Pool,
    frame: usize,
    pgno: u64,
    latch: Option<Latch<'a>>,
}

impl PageGuard<'_> {
    /// The page number.
    pub fn pgno(&self) -> u64 {
        self.pgno
    }

    /// The page's bytes, writable: `None` for a guard taken with [`Access::Read`].
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match self.latch {
            // SAFETY: the exclusive latch of this frame is held, so no other reference to its
            // bytes exists; the frame lies inside the arena (frame < frames).
            Some(Latch::Write(_)) => Some(unsafe { self.pool.frame_mut(self.frame) }),
            _ => None,
        }
    }
}

impl std::ops::Deref for PageGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: a latch of this frame is held (shared or exclusive): no writer but us.
        unsafe { self.pool.frame_ref(self.frame) }
    }
}

impl Drop for PageGuard<'_> {
    fn drop(&mut self) {
        let wrote = matches!(self.latch, Some(Latch::Write(_)));
        self.latch = None;
        self.pool.unpin(self.frame, wrote);
    }
}

impl Pool {
    /// Opens a pool over `path` (see [`Options`]). Refuses a page size other than 4, 8 or
    /// 16 KiB, a pool smaller than two pages or larger than the budget, and (for `Direct` and
    /// `Dbio`) a file system without direct I/O such as tmpfs.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Pool> {
        let path = path.as_ref();
        if ![4096, 8192, 16384].contains(&opts.page_size) {
            return Err(Error::InvalidOption(format!(
                "page size {} is not 4096, 8192 or 16384",
                opts.page_size
            )));
        }
        let frames = opts.pool_bytes / opts.page_size as u64;
        if frames < 2 {
            return Err(Error::InvalidOption(format!(
                "a pool of {} bytes holds fewer than two {}-byte pages",
                opts.pool_bytes, opts.page_size
            )));
        }
        if opts.pool_bytes > opts.budget {
            return Err(Error::InvalidOption(format!(
                "the pool ({} bytes) is larger than the budget ({} bytes)",
                opts.pool_bytes, opts.budget
            )));
        }
        let avail = tiermem_media::mem_available().unwrap_or(u64::MAX);
        if opts.pool_bytes > avail {
            return Err(Error::InvalidOption(format!(
                "the pool ({} bytes) is larger than the memory available ({avail} bytes)",
                opts.pool_bytes
            )));
        }
        let frames = usize::try_from(frames)
            .map_err(|_| Error::InvalidOption("pool too large for this machine".into()))?;
        let file = DataFile::open(
            path,
            opts.create,
            opts.mode != Mode::Buffered,
            opts.page_size,
        )?;
        let arena = Arena::new(frames * opts.page_size, opts.lock)?;
        Ok(Pool {
            file,
            arena,
            latches: (0..frames).map(|_| RwLock::new(())).collect(),
            state: Mutex::new(State {
                table: FxHashMap::default(),
                frames: vec![EMPTY; frames],
                free: (0..frames).rev().collect(),
                hand: 0,
                writing: FxHashSet::default(),
                demoted: VecDeque::new(),
                since_check: 0,
                to_drop: Vec::new(),
            }),
            written: Condvar::new(),
            counters: Counters::default(),
            unstarted: AtomicU64::new(0),
            opts,
        })
    }

    /// The options the pool was opened with.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The data file.
    pub fn file(&self) -> &DataFile {
        &self.file
    }

    /// # Safety
    /// The caller holds frame `f`'s latch (either way) and `f < frames`.
    unsafe fn frame_ref(&self, f: usize) -> &[u8] {
        let ps = self.opts.page_size;
        std::slice::from_raw_parts(self.arena.ptr.add(f * ps), ps)
    }

    /// # Safety
    /// The caller holds frame `f`'s latch exclusively and `f < frames`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn frame_mut(&self, f: usize) -> &mut [u8] {
        let ps = self.opts.page_size;
        std::slice::from_raw_parts_mut(self.arena.ptr.add(f * ps), ps)
    }

    fn offset(&self, pgno: u64) -> u64 {
        pgno * self.opts.page_size as u64
    }

    /// Pins page `pgno` and returns its guard, loading it on a miss (evicting a victim by
    /// CLOCK). Errors: [`Error::AllPinned`] when every frame is pinned, I/O errors of the
    /// load or of the victim's write-back (the pool is unchanged but for the victim, which
    /// stays cached and dirty if its write failed).
    pub fn get_page(&self, pgno: u64, access: Access) -> Result<PageGuard<'_>> {
        if pgno == NONE || pgno.checked_mul(self.opts.page_size as u64).is_none() {
            return Err(Error::InvalidOption(format!(
                "page number {pgno} is out of range"
            )));
        }
        loop {
            let mut st = self.state.lock();
            if st.writing.contains(&pgno) {
                self.written.wait(&mut st);
                continue;
            }
            if let Some(&f) = st.table.get(&pgno) {
                let m = &mut st.frames[f];
                m.pins += 1;
                m.referenced = true;
                m.reused = true;
                drop(st);
                let latch = self.latch(f, access);
                let mut st = self.state.lock();
                let m = st.frames[f];
                if m.pgno != pgno || m.failed {
                    // Its load failed while we waited: let go and look again.
                    drop(latch);
                    self.unpin_locked(&mut st, f, false);
                    continue;
                }
                drop(st);
                bump(&self.counters.pool_hits);
                return Ok(PageGuard {
                    pool: self,
                    frame: f,
                    pgno,
                    latch: Some(latch),
                });
            }
            // A miss: take a frame.
            let f = match self.victim(&mut st) {
                Some(f) => f,
                None => {
                    return Err(Error::AllPinned {
                        frames: self.latches.len(),
                    })
                }
            };
            let old = st.frames[f];
            if old.pgno != NONE {
                st.table.remove(&old.pgno);
                st.writing.insert(old.pgno);
            }
            st.table.insert(pgno, f);
            st.frames[f] = Meta {
                pgno,
                pins: 1,
                dirty: false,
                referenced: true,
                reused: false,
                failed: false,
            };
            drop(st);
            bump(&self.counters.pool_misses);
            // Nobody else holds this latch: the frame was unpinned, and new pinners of `pgno`
            // wait on it until the load below is done.
            let w = self.latches[f].write();
            if old.pgno != NONE {
                // SAFETY: exclusive latch held; f < frames.
                let data = unsafe { self.frame_ref(f) };
                let res = self.evict_io(old.pgno, old.dirty, old.reused, data);
                let mut st = self.state.lock();
                st.writing.remove(&old.pgno);
                self.written.notify_all();
                if let Err(e) = res {
                    // Put the victim back as it was (still dirty); the new page is not loaded.
                    // Threads that pinned `pgno` meanwhile keep their pins: they find the frame
                    // holding another page, unpin and look again.
                    st.table.remove(&pgno);
                    st.table.insert(old.pgno, f);
                    let waiters = st.frames[f].pins.saturating_sub(1);
                    st.frames[f] = Meta {
                        pins: waiters,
                        referenced: true,
                        ..old
                    };
                    drop(st);
                    drop(w);
                    return Err(e);
                }
                drop(st);
                self.note_demoted(old.pgno, old.dirty, old.reused);
            }
            // SAFETY: exclusive latch held; f < frames.
            let res = self.load(pgno, unsafe { self.frame_mut(f) });
            if let Err(e) = res {
                let mut st = self.state.lock();
                st.table.remove(&pgno);
                st.frames[f].failed = true;
                drop(w);
                self.unpin_locked(&mut st, f, false);
                return Err(e);
            }
            let latch = match access {
                Access::Write => Latch::Write(w),
                Access::Read => Latch::Read(RwLockWriteGuard::downgrade(w)),
            };
            return Ok(PageGuard {
                pool: self,
                frame: f,
                pgno,
                latch: Some(latch),
            });
        }
    }

    fn latch(&self, f: usize, access: Access) -> Latch<'_> {
        match access {
            Access::Read => Latch::Read(self.latches[f].read()),
            Access::Write => Latch::Write(self.latches[f].write()),
        }
    }

    /// [`Pool::get_page`] without a guard, for callers that cannot hold one (the C ABI): the
    /// page stays pinned and latched until [`Pool::put_page_raw`]. Returns the pin and the
    /// address of the page's `page_size` bytes (writable only for [`Access::Write`]).
    pub fn get_page_raw(&self, pgno: u64, access: Access) -> Result<(RawPin, *mut u8)> {
        let mut g = std::mem::ManuallyDrop::new(self.get_page(pgno, access)?);
        // The latch stays held (its guard forgotten) and the pin stays counted (the page guard
        // is never dropped) until put_page_raw releases both.
        if let Some(l) = g.latch.take() {
            std::mem::forget(l);
        }
        let pin = RawPin {
            frame: g.frame,
            pgno,
            write: access == Access::Write,
        };
        // SAFETY: frame < frames, so the offset lies inside the arena.
        let ptr = unsafe { self.arena.ptr.add(g.frame * self.opts.page_size) };
        Ok((pin, ptr))
    }

    /// Releases a page pinned by [`Pool::get_page_raw`].
    ///
    /// # Safety
    /// `pin` came from this pool's `get_page_raw` and has not been released yet, and nothing
    /// uses the page's address any more.
    pub unsafe fn put_page_raw(&self, pin: RawPin) {
        use parking_lot::lock_api::RawRwLock as _;
        let raw = self.latches[pin.frame].raw();
        // SAFETY: by the caller's contract this pin's latch is held, in the mode it records,
        // by a guard get_page_raw forgot.
        unsafe {
            if pin.write {
                raw.unlock_exclusive();
            } else {
                raw.unlock_shared();
            }
        }
        self.unpin(pin.frame, pin.write);
    }

    /// Releases a page: the same as dropping its guard.
    pub fn put_page(&self, guard: PageGuard<'_>) {
        drop(guard);
    }

    fn unpin(&self, f: usize, wrote: bool) {
        let mut st = self.state.lock();
        self.unpin_locked(&mut st, f, wrote);
    }

    fn unpin_locked(&self, st: &mut State, f: usize, wrote: bool) {
        let m = &mut st.frames[f];
        m.pins = m.pins.saturating_sub(1);
        if wrote && !m.failed {
            m.dirty = true;
        }
        if m.failed && m.pins == 0 {
            *m = EMPTY;
            st.free.push(f);
        }
    }

    /// A frame to reuse: a free one, else CLOCK over unpinned frames (a referenced frame gets a
    /// second chance). Caller holds the state lock.
    fn victim(&self, st: &mut State) -> Option<usize> {
        if let Some(f) = st.free.pop() {
            return Some(f);
        }
        let n = st.frames.len();
        for _ in 0..2 * n {
            let f = st.hand;
            st.hand = (st.hand + 1) % n;
            let m = &mut st.frames[f];
            if m.pins > 0 || m.failed {
                continue;
            }
            if m.referenced {
                m.referenced = false;
                continue;
            }
            return Some(f);
        }
        None
    }

    /// Reads page `pgno` into `buf` the way the mode does.
    fn load(&self, pgno: u64, buf: &mut [u8]) -> Result<()> {
        let off = self.offset(pgno);
        match self.opts.mode {
            Mode::Buffered => {
                self.file.read_buffered(buf, off)?;
                bump(&self.counters.buffered_reads);
                self.note_cached(pgno);
            }
            Mode::Direct => {
                self.file.read_direct(buf, off)?;
                bump(&self.counters.direct_reads);
            }
            Mode::Dbio => {
                let cold_buffered = self.cold_buffered();
                let hit = match self.opts.probe {
                    // Not `RWF_NOWAIT` before a buffered cold read, though the read it starts
                    // on a miss would be wanted: it reads large folios around the page
                    // (measured on 6.18 under POSIX_FADV_RANDOM, where `pread` reads one).
                    _ if cold_buffered => {
                        let cached = self.page_cached(off)?;
                        self.file.read_buffered(buf, off)?;
                        cached
                    }
                    Probe::Cachestat => {
                        if self.page_cached(off)? {
                            self.file.read_buffered(buf, off)?;
                            true
                        } else {
                            false
                        }
                    }
                    Probe::Nowait => self.file.read_cached(buf, off)?,
                };
                if hit {
                    bump(&self.counters.cache_hits);
                    if self.after_hit() == AfterHit::Drop {
                        self.queue_drop(pgno)?;
                    }
                } else if cold_buffered {
                    bump(&self.counters.buffered_reads);
                    self.note_cached(pgno);
                } else {
                    self.file.read_direct(buf, off)?;
                    bump(&self.counters.direct_reads);
                }
            }
        }
        Ok(())
    }

    /// Whether the page cache holds every byte of the page at `off` (`cachestat`).
    fn page_cached(&self, off: u64) -> Result<bool> {
        let ps = self.opts.page_size as u64;
        Ok(self.file.cached_pages(off, ps)? >= ps.div_ceil(4096))
    }

    /// The evict-clean path in force: [`EvictClean::Readahead`] resolved by the pool's and the
    /// page cache's sizes.
    fn evict_clean(&self) -> EvictClean {
        match self.opts.evict_clean {
            EvictClean::Readahead
                if self.opts.budget - self.opts.pool_bytes >= self.opts.pool_bytes =>
            {
                EvictClean::ReadaheadAll
            }
            EvictClean::Readahead => EvictClean::ReadaheadReused,
            e => e,
        }
    }

    /// The after-hit treatment in force: [`AfterHit::Auto`] resolved by the cold read.
    fn after_hit(&self) -> AfterHit {
        match self.opts.after_hit {
            AfterHit::Auto if self.cold_buffered() => AfterHit::Leave,
            AfterHit::Auto => AfterHit::Drop,
            a => a,
        }
    }

    /// Whether `Dbio` reads uncached misses through the page cache ([`ColdRead`]).
    fn cold_buffered(&self) -> bool {
        match self.opts.cold_read {
            ColdRead::Direct => false,
            ColdRead::Buffered => true,
            ColdRead::Auto => self.opts.budget - self.opts.pool_bytes > 2 * self.opts.pool_bytes,
        }
    }

    /// The write-back (and, for `Dbio`, the caching) of an evicted page.
    fn evict_io(&self, pgno: u64, dirty: bool, reused: bool, data: &[u8]) -> Result<()> {
        let off = self.offset(pgno);
        let ps = self.opts.page_size as u64;
        if dirty {
            bump(&self.counters.evict_dirty);
        } else {
            bump(&self.counters.evict_clean);
        }
        match (self.opts.mode, dirty) {
            (Mode::Buffered, true) => {
                self.file.write_buffered(data, off)?;
                bump(&self.counters.buffered_writes);
            }
            (Mode::Direct, true) => {
                self.file.write_direct(data, off)?;
                bump(&self.counters.direct_writes);
            }
            (Mode::Dbio, true) => {
                self.file.write_buffered(data, off)?;
                bump(&self.counters.buffered_writes);
                // Cgroup v1 does not throttle a group's dirty pages: start their write-back
                // every WRITEBACK_BATCH evictions, all at once (one call and one batch of
                // device requests rather than one of each per page).
                if self.unstarted.fetch_add(1, Ordering::Relaxed) + 1 >= WRITEBACK_BATCH {
                    self.unstarted.store(0, Ordering::Relaxed);
                    self.file.start_writeback(0, 0)?;
                }
            }
            (Mode::Buffered | Mode::Direct, false) => {}
            // Read through the page cache when loaded: it is there unless the kernel found
            // colder pages than it to keep, exactly as in `Buffered`.
            (Mode::Dbio, false) if self.cold_buffered() => {}
            (Mode::Dbio, false) => {
                if self.page_cached(off)? {
                    bump(&self.counters.evict_clean_cached);
                    return Ok(());
                }
                match (self.evict_clean(), reused) {
                    (EvictClean::Write, _) => {
                        self.file.write_buffered(data, off)?;
                        bump(&self.counters.buffered_writes);
                    }
                    (EvictClean::ReadaheadAll, _) | (EvictClean::ReadaheadReused, true) => {
                        self.file.read_ahead(off, ps)?;
                        bump(&self.counters.evict_clean_readahead);
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Records that an eviction left `pgno` in the page cache (for the budget).
    fn note_demoted(&self, pgno: u64, dirty: bool, reused: bool) {
        let left = match self.opts.mode {
            Mode::Buffered => dirty,
            Mode::Direct => false,
            Mode::Dbio => {
                dirty
                    || match self.evict_clean() {
                        EvictClean::Write | EvictClean::ReadaheadAll => true,
                        // (`Readahead` is resolved to one of the other two.)
                        EvictClean::Readahead | EvictClean::ReadaheadReused => reused,
                        EvictClean::Drop => false,
                    }
            }
        };
        if left {
            self.note_cached(pgno);
        }
    }

    /// Records that `pgno` is (now) in the page cache because of the pool; every
    /// [`TRIM_EVERY`] such pages, trims to the budget.
    fn note_cached(&self, pgno: u64) {
        if !self.opts.enforce_budget {
            return;
        }
        let check = {
            let mut st = self.state.lock();
            st.demoted.push_back(pgno);
            // Bounded: entries far older than the allowance are long gone from the cache.
            let cap = 4 * ((self.opts.budget - self.opts.pool_bytes) / 4096).max(TRIM_EVERY);
            if st.demoted.len() as u64 > cap {
                st.demoted.pop_front();
            }
            st.since_check += 1;
            if st.since_check >= TRIM_EVERY {
                st.since_check = 0;
                true
            } else {
                false
            }
        };
        if check {
            // Trimming is best effort: a failed fadvise leaves more cached, never loses data.
            let _ = self.trim();
        }
    }

    /// Drops the oldest pages the pool left in the page cache until the file's cached bytes
    /// fit `budget − pool_bytes`. Returns the pages dropped.
    pub fn trim(&self) -> Result<u64> {
        let ps = self.opts.page_size as u64;
        let allowance = (self.opts.budget - self.opts.pool_bytes) / 4096;
        let cached = self.file.cached_pages(0, 0)?;
        if cached <= allowance {
            return Ok(0);
        }
        let mut over = (cached - allowance).div_ceil(ps / 4096);
        let victims: Vec<u64> = {
            let mut st = self.state.lock();
            let mut v = Vec::new();
            while over > 0 {
                match st.demoted.pop_front() {
                    Some(p) if !st.table.contains_key(&p) => {
                        v.push(p);
                        over -= 1;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            v
        };
        let n = self.drop_pages(victims, true)?;
        self.counters.trimmed_pages.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    /// `POSIX_FADV_DONTNEED` over `pages`, coalesced into runs; with `settle`, their dirty
    /// pages are written first (DONTNEED skips dirty and under-write-back pages). Returns the
    /// pages dropped.
    fn drop_pages(&self, mut pages: Vec<u64>, settle: bool) -> Result<u64> {
        pages.sort_unstable();
        pages.dedup();
        let ps = self.opts.page_size as u64;
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 {
                j += 1;
            }
            let (off, len) = (self.offset(pages[i]), (j - i) as u64 * ps);
            if settle {
                self.file.settle(off, len)?;
            }
            self.file.drop_cached(off, len)?;
            i = j;
        }
        Ok(pages.len() as u64)
    }

    fn queue_drop(&self, pgno: u64) -> Result<()> {
        let batch = {
            let mut st = self.state.lock();
            st.to_drop.push(pgno);
            if st.to_drop.len() < DROP_BATCH {
                return Ok(());
            }
            std::mem::take(&mut st.to_drop)
        };
        let n = self.drop_pages(batch, false)?;
        self.counters
            .dropped_after_hit
            .fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Evicts page `pgno` now if the pool holds it (write-back or caching as on a
    /// replacement). Returns whether it was held. [`Error::Pinned`] if a guard holds it.
    pub fn evict(&self, pgno: u64) -> Result<bool> {
        let mut st = self.state.lock();
        while st.writing.contains(&pgno) {
            self.written.wait(&mut st);
        }
        let Some(&f) = st.table.get(&pgno) else {
            return Ok(false);
        };
        let m = st.frames[f];
        if m.pins > 0 {
            return Err(Error::Pinned { pgno });
        }
        st.table.remove(&pgno);
        st.writing.insert(pgno);
        st.frames[f] = Meta { pins: 1, ..m };
        drop(st);
        let w = self.latches[f].write();
        // SAFETY: exclusive latch held; f < frames.
        let res = self.evict_io(pgno, m.dirty, m.reused, unsafe { self.frame_ref(f) });
        drop(w);
        let mut st = self.state.lock();
        st.writing.remove(&pgno);
        self.written.notify_all();
        match res {
            Ok(()) => {
                st.frames[f] = EMPTY;
                st.free.push(f);
                drop(st);
                self.note_demoted(pgno, m.dirty, m.reused);
                Ok(true)
            }
            Err(e) => {
                st.table.insert(pgno, f);
                st.frames[f] = Meta { pins: 0, ..m };
                Err(e)
            }
        }
    }

    /// Drops every page numbered `first` or higher from the pool *without writing it back*
    /// (a dirty page's changes are lost): for a caller that knows the file is newer than the
    /// pool (another process wrote it) or is cutting the file short. Waits for eviction writes
    /// of those pages in flight to land first. Returns the pages dropped. [`Error::Pinned`] (and
    /// nothing dropped) if a guard holds one of them.
    pub fn discard_from(&self, first: u64) -> Result<usize> {
        let mut st = self.state.lock();
        while st.writing.iter().any(|&p| p >= first) {
            self.written.wait(&mut st);
        }
        let victims: Vec<(u64, usize)> = st
            .table
            .iter()
            .filter(|(&p, _)| p >= first)
            .map(|(&p, &f)| (p, f))
            .collect();
        if let Some(&(pgno, _)) = victims.iter().find(|&&(_, f)| st.frames[f].pins > 0) {
            return Err(Error::Pinned { pgno });
        }
        // Unpinned frames have no latch holder (a guard, a flush or a load pins first).
        for &(p, f) in &victims {
            st.table.remove(&p);
            st.frames[f] = EMPTY;
            st.free.push(f);
        }
        Ok(victims.len())
    }

    /// Cuts the file to `len` bytes: pages wholly past `len` leave the pool unwritten
    /// ([`Pool::discard_from`]), the pool's copy of the page `len` falls in (if held and `len`
    /// is not a page boundary) gets zeros past `len`, then the file is truncated. A later
    /// write-back of that straddling page lengthens the file to the page's end again (with
    /// zeros); callers that need an exact length not on a page boundary truncate again after
    /// [`Pool::flush`]. [`Error::Pinned`] if a guard holds a page concerned (the file is then
    /// not truncated; the straddling page may already be zeroed past `len`).
    pub fn truncate(&self, len: u64) -> Result<()> {
        let ps = self.opts.page_size as u64;
        let keep = len.div_ceil(ps);
        let tail = len % ps;
        if tail != 0 {
            // The straddling page: pin it if held, zero past `len` in its frame.
            let pgno = len / ps;
            let frame = {
                let mut st = self.state.lock();
                while st.writing.contains(&pgno) {
                    self.written.wait(&mut st);
                }
                match st.table.get(&pgno).copied() {
                    Some(f) if st.frames[f].pins > 0 => return Err(Error::Pinned { pgno }),
                    Some(f) => {
                        st.frames[f].pins += 1;
                        Some(f)
                    }
                    None => None,
                }
            };
            if let Some(f) = frame {
                let w = self.latches[f].write();
                // SAFETY: exclusive latch held; f < frames.
                let page = unsafe { self.frame_mut(f) };
                page[tail as usize..].fill(0);
                drop(w);
                self.unpin(f, false);
            }
        }
        self.discard_from(keep)?;
        let len_t = libc::off_t::try_from(len)
            .map_err(|_| Error::InvalidOption(format!("length {len} is out of range")))?;
        // SAFETY: ftruncate on the pool's own open descriptor; no memory is involved.
        if unsafe { libc::ftruncate(self.file.fd(), len_t) } != 0 {
            return Err(Error::Io {
                op: "ftruncate",
                path: self.file.path().to_path_buf(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Writes every dirty page back (`Buffered`: through the page cache; `Direct` and `Dbio`:
    /// with `O_DIRECT`, the write-direct path) and keeps it cached, clean. Waits for writers
    /// holding a page, so the calling thread must not hold a [`PageGuard`] itself. Returns the
    /// pages written.
    pub fn flush(&self) -> Result<u64> {
        let dirty: Vec<(usize, u64)> = {
            let mut st = self.state.lock();
            let list: Vec<(usize, u64)> = st
                .frames
                .iter()
                .enumerate()
                .filter(|(_, m)| m.dirty && m.pgno != NONE && !m.failed)
                .map(|(f, m)| (f, m.pgno))
                .collect();
            for &(f, _) in &list {
                st.frames[f].pins += 1;
            }
            list
        };
        let mut written = 0;
        let mut first_err = None;
        for (f, pgno) in dirty {
            let r = self.latches[f].read();
            let still = {
                let mut st = self.state.lock();
                let m = &mut st.frames[f];
                // Cleared before the write: a writer after us sets it again on release.
                let still = m.pgno == pgno && m.dirty && !m.failed;
                if still {
                    m.dirty = false;
                }
                still
            };
            if still {
                // SAFETY: shared latch held; f < frames.
                let data = unsafe { self.frame_ref(f) };
                let off = self.offset(pgno);
                let res = match self.opts.mode {
                    Mode::Buffered => self
                        .file
                        .write_buffered(data, off)
                        .map(|()| bump(&self.counters.buffered_writes)),
                    Mode::Direct | Mode::Dbio => self
                        .file
                        .write_direct(data, off)
                        .map(|()| bump(&self.counters.direct_writes)),
                };
                match res {
                    Ok(()) => written += 1,
                    Err(e) => {
                        self.state.lock().frames[f].dirty = true;
                        first_err.get_or_insert(e);
                    }
                }
            }
            drop(r);
            self.unpin(f, false);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }

    /// [`Pool::flush`], then `fdatasync`: every page written so far is durable.
    pub fn sync(&self) -> Result<()> {
        self.flush()?;
        self.file.sync()
    }

    /// The pool's counters.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            pool_hits: l(&c.pool_hits),
            pool_misses: l(&c.pool_misses),
            cache_hits: l(&c.cache_hits),
            direct_reads: l(&c.direct_reads),
            buffered_reads: l(&c.buffered_reads),
            direct_writes: l(&c.direct_writes),
            buffered_writes: l(&c.buffered_writes),
            evict_dirty: l(&c.evict_dirty),
            evict_clean: l(&c.evict_clean),
            evict_clean_cached: l(&c.evict_clean_cached),
            evict_clean_readahead: l(&c.evict_clean_readahead),
            trimmed_pages: l(&c.trimmed_pages),
            dropped_after_hit: l(&c.dropped_after_hit),
            frames: self.latches.len() as u64,
            locked: self.arena.locked,
        }
    }

    /// Pages the pool holds now.
    pub fn resident(&self) -> usize {
        self.state.lock().table.len()
    }

    /// The page numbers the pool holds now (unordered).
    pub fn resident_pages(&self) -> Vec<u64> {
        self.state.lock().table.keys().copied().collect()
    }

    /// Of the pages the pool holds, the percentage the page cache holds too (pages kept twice);
    /// one `cachestat` per page.
    pub fn duplicate_pct(&self) -> Result<f64> {
        let pages = self.resident_pages();
        if pages.is_empty() {
            return Ok(0.0);
        }
        let ps = self.opts.page_size as u64;
        let mut dup = 0u64;
        for p in &pages {
            if self.file.cached_pages(self.offset(*p), ps)? > 0 {
                dup += 1;
            }
        }
        Ok(100.0 * dup as f64 / pages.len() as f64)
    }
}

impl Drop for Pool {
    /// Writes dirty pages back (best effort, not synced): call [`Pool::sync`] for durability
    /// and to see errors.
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
