//! A paged region and its page-in path.
//!
//! A region is private anonymous memory registered with the fault engine (MISSING, resolved in
//! the faulting thread's SIGBUS handler, not inherited by `fork`). Its first touch of a page is
//! a zero fill; a touch of an evicted page copies it back from the NVM buffer (one
//! `UFFDIO_COPY` straight from the mapped pool) or reads it from the swap file into a bounce
//! page first. Everything on that path is async-signal-safe: the shadow table's atomics, the
//! lock-free slot maps and FIFO, `pread`, one ioctl, an eventfd write.

use crate::error::{Error, Result};
use crate::hist::AtomicHist;
use crate::pager::{Shared, PAGE_BITS};
use crate::shadow::{Place, Shadow};
use crate::slots::SlotMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use tiermem_fault::{
    Engine, Fault, FaultOps, RegionEvent, RegionHandle, RegionSpec, ResolveError, Resolver,
    PAGE_SIZE,
};
use tiermem_media::now_ns;

#[repr(C, align(4096))]
struct ZeroPage([u8; PAGE_SIZE]);
static ZERO: ZeroPage = ZeroPage([0; PAGE_SIZE]);

/// Page-aligned pages for swap-file reads in the fault path (`O_DIRECT` needs alignment),
/// claimed and released lock-free.
pub(crate) struct Bounce {
    mem: *mut u8,
    n: usize,
    free: SlotMap,
}

// SAFETY: the pages are only touched by the thread that claimed them through `free`.
unsafe impl Send for Bounce {}
// SAFETY: as above.
unsafe impl Sync for Bounce {}

impl Bounce {
    pub(crate) fn new(n: usize) -> Result<Bounce> {
        // SAFETY: anonymous mapping, checked below.
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if mem == libc::MAP_FAILED {
            return Err(Error::last("mmap of the pager's bounce pages"));
        }
        Ok(Bounce {
            mem: mem as *mut u8,
            n,
            free: SlotMap::new(n),
        })
    }

    /// Claims a page (spinning while all are in use) and returns its index and address; the
    /// page is the caller's alone until [`Bounce::release`].
    fn claim(&self) -> (u64, *mut u8) {
        loop {
            if let Some(i) = self.free.alloc() {
                // SAFETY: i < n, so the page is inside the mapping.
                return (i, unsafe { self.mem.add(i as usize * PAGE_SIZE) });
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }

    fn release(&self, i: u64) {
        self.free.release(i);
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.mem as *mut libc::c_void, self.n * PAGE_SIZE) };
    }
}

/// Checks a page-in bound: a percentile in (0, 1) and a latency above 0 ns.
pub(crate) fn check_bound(pct: f64, bound_ns: u64) -> Result<()> {
    if !(pct > 0.0 && pct < 1.0) || bound_ns == 0 || bound_ns == u64::MAX {
        return Err(Error::InvalidOption(format!(
            "a page-in bound is a percentile in (0, 1) and a latency in ns above 0, not \
             p{} ≤ {bound_ns} ns",
            pct * 100.0
        )));
    }
    Ok(())
}

/// What the pager keeps about one region.
pub(crate) struct RegionState {
    pub(crate) base: usize,
    pub(crate) len: usize,
    pub(crate) shadow: Shadow,
    /// Table index and generation, shifted into place: `key | page` is a FIFO entry.
    pub(crate) key: u64,
    /// Page-in latency bound in ns (`u64::MAX`: best effort).
    pub(crate) bound_ns: AtomicU64,
    /// The engine registration, for the evictor's rare put-back of a page it could not place.
    pub(crate) handle: OnceLock<Weak<RegionHandle>>,
    /// Percentile the bound applies to (f64 bits, e.g. 0.99).
    pub(crate) pct: AtomicU64,
    /// This region's page-ins (buffer and swap file), for the monitor.
    pub(crate) hist: AtomicHist,
    /// Served by the buffer this window (Algorithm 1's NS, or over its bound last window).
    pub(crate) ns: AtomicBool,
    /// The pager mapped the memory (`map`) and unmaps it at drop; false for adopted memory
    /// (`adopt`), which is paged back in and left to its owner.
    pub(crate) owned: bool,
    /// An adopted region being given back: out of the evictor's table, its faults do not wait
    /// at the budget's cap.
    pub(crate) releasing: AtomicBool,
}

impl RegionState {
    pub(crate) fn page_addr(&self, p: usize) -> usize {
        self.base + p * PAGE_SIZE
    }
}

/// A region of memory managed by a [`crate::Pager`]. Dereference it through
/// [`PagedRegion::as_ptr`]; dropping it unmaps the memory and frees its buffer and swap slots.
pub struct PagedRegion {
    state: Arc<RegionState>,
    shared: Arc<Shared>,
    handle: Option<Arc<RegionHandle>>,
}

impl PagedRegion {
    pub(crate) fn map(shared: Arc<Shared>, len: usize) -> Result<PagedRegion> {
        if len == 0 {
            return Err(Error::InvalidOption(
                "a paged region needs at least one byte".into(),
            ));
        }
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        check_pages(len)?;
        // SAFETY: anonymous mapping, checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::Map {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        PagedRegion::register(shared, base as usize, len, None)
    }

    /// Takes over `[ptr, ptr + len)`, private anonymous memory the caller already uses: its
    /// pages present now (or in the kernel's swap) count as resident and are paged like any
    /// other from here on. Dropping the region pages everything back in and leaves the memory
    /// to its owner, whole.
    ///
    /// # Safety
    /// The range must stay mapped until the region is dropped, must not be unmapped, remapped
    /// or registered with userfaultfd by anyone else meanwhile, and must not be shared with a
    /// forked child (pages shared copy-on-write cannot be moved out; they stay resident).
    pub(crate) unsafe fn adopt(
        shared: Arc<Shared>,
        ptr: *mut u8,
        len: usize,
    ) -> Result<PagedRegion> {
        let base = ptr as usize;
        if len == 0 || base % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 {
            return Err(Error::InvalidOption(format!(
                "adopt needs a page-aligned, non-empty range, not {len} bytes at {base:#x}"
            )));
        }
        check_pages(len)?;
        check_private_anonymous(base, len)?;
        let present = present_pages(base, len)?;
        PagedRegion::register(shared, base, len, Some(present))
    }

    /// Registers `[base, base + len)` (page-aligned) with the pager and the fault engine.
    /// `present`: adopted memory's pages already there (`None`: a fresh mapping we own).
    fn register(
        shared: Arc<Shared>,
        base: usize,
        len: usize,
        present: Option<Vec<bool>>,
    ) -> Result<PagedRegion> {
        let pages = len / PAGE_SIZE;
        let owned = present.is_none();
        let release = |base: usize| {
            if owned {
                // SAFETY: our mapping.
                unsafe { libc::munmap(base as *mut libc::c_void, len) };
            }
        };
        let base = base as *mut libc::c_void;
        // No transparent huge pages: the pager moves 4 KiB pages.
        // SAFETY: the region's range: our fresh mapping, or adopted memory (adopt's contract).
        unsafe { libc::madvise(base, len, libc::MADV_NOHUGEPAGE) };
        let (idx, state) = {
            let mut t = shared.regions.lock();
            let idx = match t.slots.iter().position(|s| s.is_none()) {
                Some(i) => i,
                None => {
                    t.slots.push(None);
                    t.gens.push(0);
                    t.slots.len() - 1
                }
            };
            if idx >= 1 << 12 {
                drop(t);
                release(base as usize);
                return Err(Error::InvalidOption(
                    "a pager holds at most 4096 regions at once".into(),
                ));
            }
            t.gens[idx] = t.gens[idx].wrapping_add(1);
            let key = ((idx as u64) << (PAGE_BITS + 16)) | ((t.gens[idx] as u64) << PAGE_BITS);
            let st = Arc::new(RegionState {
                base: base as usize,
                len,
                shadow: Shadow::new(pages),
                key,
                bound_ns: AtomicU64::new(u64::MAX),
                handle: OnceLock::new(),
                pct: AtomicU64::new(0.99f64.to_bits()),
                hist: AtomicHist::new(),
                ns: AtomicBool::new(false),
                owned,
                releasing: AtomicBool::new(false),
            });
            t.slots[idx] = Some(st.clone());
            (idx, st)
        };
        let resolver = Arc::new(PageIn {
            st: state.clone(),
            sh: shared.clone(),
        });
        let handle = match Engine::global()
            .register(RegionSpec::new(base as *mut u8, len).in_thread(), resolver)
        {
            Ok(h) => Arc::new(h),
            Err(e) => {
                shared.regions.lock().slots[idx] = None;
                release(base as usize);
                return Err(e.into());
            }
        };
        let _ = state.handle.set(Arc::downgrade(&handle));
        if let Some(present) = present {
            // Adopted pages already there are resident: counted, and queued in fault order.
            for (p, _) in present.iter().enumerate().filter(|(_, &y)| y) {
                state.shadow.set(p, Place::Resident);
                let n = shared.resident.fetch_add(1, Ordering::AcqRel) + 1;
                shared.c.max_resident.fetch_max(n, Ordering::Relaxed);
                let mut e = state.key | p as u64;
                while let Err(back) = shared.fifo.push(e) {
                    e = back;
                    shared.kick();
                    std::thread::yield_now();
                }
            }
            shared.kick();
        }
        Ok(PagedRegion {
            state,
            shared,
            handle: Some(handle),
        })
    }

    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.state.base as *mut u8
    }

    /// Length in bytes (a page multiple).
    pub fn len(&self) -> usize {
        self.state.len
    }

    /// Never true (regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.state.len == 0
    }

    /// Bounds this region's page-in latency: its `pct` quantile (0 < pct < 1, e.g. 0.99) must
    /// stay at or below `bound_ns`. The controller holds it (Algorithm 1 and the monitor), and
    /// its pages are destaged from the buffer after best-effort ones.
    ///
    /// In a shared pool ([`crate::PagerOptions::pool`]) the bound is the process's: it is
    /// written to its tenant entry too, and `tiermem pager set-bound` can change it later.
    pub fn set_bound(&self, pct: f64, bound_ns: u64) -> Result<()> {
        check_bound(pct, bound_ns)?;
        self.state.pct.store(pct.to_bits(), Ordering::Relaxed);
        self.state.bound_ns.store(bound_ns, Ordering::Relaxed);
        if let Some(t) = self.shared.tenant() {
            t.pct_bits.store(pct.to_bits(), Ordering::Relaxed);
            t.bound_ns.store(bound_ns, Ordering::Release);
        }
        Ok(())
    }

    /// Makes this region best effort again.
    pub fn clear_bound(&self) {
        self.state.bound_ns.store(u64::MAX, Ordering::Relaxed);
        self.state.ns.store(false, Ordering::Relaxed);
        if let Some(t) = self.shared.tenant() {
            t.bound_ns.store(u64::MAX, Ordering::Release);
        }
    }

    /// Whether the controller serves this region from the NVM buffer this window.
    pub fn served_by_buffer(&self) -> bool {
        self.state.ns.load(Ordering::Relaxed)
    }

    /// This region's page-in latencies so far.
    pub fn pagein_hist(&self) -> crate::hist::HistSnapshot {
        self.state.hist.snapshot()
    }

    /// Pins the pages of `[off, off + len)` in DRAM: pages them in (a read of one byte each, in
    /// the calling thread) and keeps the evictor off them until [`PagedRegion::unpin`] of the
    /// same range. For memory the kernel itself will read or write (a `read(2)` into it, a
    /// `send(2)` from it): the kernel's access to an evicted page of an in-thread region fails
    /// with `EFAULT` rather than faulting into the pager. Pins nest; pinning more than the
    /// budget holds makes faults wait at the cap until pins are dropped. A range outside the
    /// region is clamped to it.
    pub fn pin(&self, off: usize, len: usize) {
        // A range the program just dropped (MADV_DONTNEED: its REMOVE event read, `on_event`
        // not yet run) can still read `Resident` here though its pages are gone, and the system
        // call then fails with EFAULT on them: let the event be handled first, as `resolve`
        // does. One atomic load when none is in flight. (sort under `tiermem pager run`, reading
        // into a buffer it had freed and allocated again, failed so in ~1 run in 30 with three
        // runs at once, and never with this wait; an artificial 2 ms delay of the dispatch did
        // not reproduce it, so the exact interleaving is not pinned down.)
        tiermem_fault::engine::wait_for_event_dispatch();
        let st = &self.state;
        let (first, end) = page_span(off, len, st.shadow.len());
        for p in first..end {
            st.shadow.pin(p);
            let mut spins = 0u32;
            while st.shadow.get(p) != Place::Resident {
                // SAFETY: p is inside the region; a volatile read faults the page in (or waits
                // for the evictor to finish with it and then faults it in).
                unsafe { std::ptr::read_volatile(st.page_addr(p) as *const u8) };
                spins += 1;
                if spins > 64 {
                    // Loading by another thread, or a drop's event in flight: let it finish.
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Drops the pins [`PagedRegion::pin`] took on `[off, off + len)`.
    pub fn unpin(&self, off: usize, len: usize) {
        let st = &self.state;
        let (first, end) = page_span(off, len, st.shadow.len());
        for p in first..end {
            st.shadow.unpin(p);
        }
    }

    /// Where page `p` is now (tests and diagnostics).
    pub fn place(&self, p: usize) -> Place {
        self.state.shadow.get(p)
    }
}

impl Drop for PagedRegion {
    fn drop(&mut self) {
        if !self.state.owned {
            // Adopted memory goes back to its owner whole: out of the evictor's table first
            // (no new victim is taken from it), then every page out of DRAM is read back in, a
            // fault each, not waiting at the cap; pages the evictor is moving out are waited
            // for and read back too. Only then does the engine let go of the range.
            let st = &self.state;
            st.releasing.store(true, Ordering::Release);
            let idx = (st.key >> (PAGE_BITS + 16)) as usize;
            self.shared.regions.lock().slots[idx] = None;
            // A batch the evictor began before may still move pages out: a second pass after
            // it finished two more rounds catches those.
            let sh = &self.shared;
            for pass in 0..2 {
                if pass == 1 {
                    let r0 = sh.rounds.load(Ordering::Acquire);
                    for _ in 0..100_000 {
                        if sh.rounds.load(Ordering::Acquire) >= r0 + 2 {
                            break;
                        }
                        sh.kick();
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                }
                for p in 0..st.shadow.len() {
                    loop {
                        match st.shadow.get(p) {
                            Place::Evicting | Place::Loading => std::thread::yield_now(),
                            Place::Buffer(_) | Place::Ssd(_) => {
                                // SAFETY: inside the region; a volatile read faults it in.
                                unsafe { std::ptr::read_volatile(st.page_addr(p) as *const u8) };
                            }
                            Place::Resident | Place::Zero => break,
                        }
                    }
                }
            }
        }
        // Unregister first: no fault runs after this (the engine waits for running ones).
        drop(self.handle.take());
        let sh = &self.shared;
        let idx = (self.state.key >> (PAGE_BITS + 16)) as usize;
        sh.regions.lock().slots[idx] = None;
        // The evictor may still hold the state for a batch it started: it sees the region gone
        // only at its next lookup, so wait for pages it holds in Evicting.
        let st = &self.state;
        for p in 0..st.shadow.len() {
            loop {
                match st.shadow.get(p) {
                    Place::Evicting | Place::Loading => {
                        std::thread::yield_now();
                        continue;
                    }
                    Place::Resident => {
                        if st.shadow.cas(p, Place::Resident, Place::Zero) {
                            sh.resident.fetch_sub(1, Ordering::AcqRel);
                        } else {
                            continue;
                        }
                    }
                    Place::Buffer(s) => {
                        if st.shadow.cas(p, Place::Buffer(s), Place::Zero) {
                            if let Some(b) = &sh.buffer {
                                b.slots.release(s);
                            }
                        } else {
                            continue;
                        }
                    }
                    Place::Ssd(s) => {
                        if st.shadow.cas(p, Place::Ssd(s), Place::Zero) {
                            sh.swap.slots.release(s);
                        } else {
                            continue;
                        }
                    }
                    Place::Zero => {}
                }
                break;
            }
            // Zero now, and no fault or evictor can claim it again: its kept slot is ours.
            if let Some(k) = st.shadow.take_kept(p) {
                sh.swap.slots.release(k);
            }
        }
        if st.owned {
            // SAFETY: our mapping; nothing references it now.
            unsafe { libc::munmap(st.base as *mut libc::c_void, st.len) };
        }
    }
}

/// A region's page count must fit a fault-order key.
fn check_pages(len: usize) -> Result<()> {
    if (len / PAGE_SIZE) as u64 >= 1 << PAGE_BITS {
        return Err(Error::InvalidOption(format!(
            "a paged region is limited to {} bytes",
            (1u64 << PAGE_BITS) * PAGE_SIZE as u64
        )));
    }
    Ok(())
}

/// Whether `[base, base + len)` lies in private anonymous mappings (`/proc/self/maps`: no path,
/// `p` in the permissions, readable and writable).
fn check_private_anonymous(base: usize, len: usize) -> Result<()> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|source| Error::Sys {
        op: "reading /proc/self/maps",
        source,
    })?;
    let mut at = base;
    let end = base + len;
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(3);
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if a <= at && at < b {
            let anon = path.is_none() || path == Some("[heap]");
            if !anon || !perms.starts_with("rw") || perms.as_bytes().get(3) != Some(&b'p') {
                return Err(Error::InvalidOption(format!(
                    "adopt needs private anonymous read-write memory; {at:#x} is in {l:?}"
                )));
            }
            at = b;
            if at >= end {
                return Ok(());
            }
        }
    }
    Err(Error::InvalidOption(format!(
        "adopt: {at:#x} (in {base:#x}+{len}) is not mapped"
    )))
}

/// Which pages of `[base, base + len)` are in memory or in the kernel's swap
/// (`/proc/self/pagemap` bits 63 and 62).
fn present_pages(base: usize, len: usize) -> Result<Vec<bool>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").map_err(|source| Error::Sys {
        op: "opening /proc/self/pagemap",
        source,
    })?;
    let pages = len / PAGE_SIZE;
    let mut buf = vec![0u8; pages * 8];
    f.read_exact_at(&mut buf, (base / PAGE_SIZE * 8) as u64)
        .map_err(|source| Error::Sys {
            op: "reading /proc/self/pagemap",
            source,
        })?;
    Ok(buf
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) >> 62 != 0)
        .collect())
}

/// Pages `[first, end)` that bytes `[off, off + len)` touch, clamped to `pages`.
fn page_span(off: usize, len: usize, pages: usize) -> (usize, usize) {
    if len == 0 {
        return (0, 0);
    }
    let first = (off / PAGE_SIZE).min(pages);
    let end = off.saturating_add(len).div_ceil(PAGE_SIZE).min(pages);
    (first, end.max(first))
}

thread_local! {
    /// Page-ins (buffer or swap file, not zero fills) resolved on this thread.
    static THREAD_PAGEINS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Page-ins (from the buffer or the swap file; first-touch zero fills excluded) that faults of
/// the calling thread have taken so far. A probe reads it around an operation to know whether
/// the operation paged in, as `getrusage(RUSAGE_THREAD).ru_majflt` tells for kernel swap.
pub fn thread_pageins() -> u64 {
    THREAD_PAGEINS.with(|c| c.get())
}

fn count_thread_pagein() {
    // A const-initialised Copy thread local: no allocation, no destructor (signal-safe).
    THREAD_PAGEINS.with(|c| c.set(c.get() + 1));
}

/// The resolver of one region: the page-in path.
struct PageIn {
    st: Arc<RegionState>,
    sh: Arc<Shared>,
}

impl PageIn {
    /// Before installing a page: wait while DRAM is at its hard cap (the evictor frees it).
    fn admit(&self) -> bool {
        let sh = &self.sh;
        // An adopted region being given back pages in without waiting (and without a
        // reservation: `installed` counts the page).
        if self.st.releasing.load(Ordering::Relaxed) {
            return false;
        }
        let mut waited = false;
        loop {
            // Reserve the page's place under the cap: checking and counting apart let two
            // threads faulting at once go over it.
            let r = sh.resident.load(Ordering::Acquire);
            if r < sh.cap_pages {
                if sh
                    .resident
                    .compare_exchange_weak(r, r + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            if sh.stop.load(Ordering::Acquire) {
                return false;
            }
            if !waited {
                sh.c.over_budget_waits.fetch_add(1, Ordering::Relaxed);
                waited = true;
            }
            sh.kick();
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }

    /// A page-in that reserved its place (`admit`) and then failed gives it back.
    fn unreserve(&self, reserved: bool) {
        if reserved {
            self.sh.resident.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// After installing page `p`: count it (unless `admit` reserved it) and queue it for
    /// eviction in fault order.
    fn installed(&self, p: usize, reserved: bool) {
        let sh = &self.sh;
        let n = if reserved {
            sh.resident.load(Ordering::Acquire)
        } else {
            sh.resident.fetch_add(1, Ordering::AcqRel) + 1
        };
        sh.c.max_resident.fetch_max(n, Ordering::Relaxed);
        let mut e = self.st.key | p as u64;
        while let Err(back) = sh.fifo.push(e) {
            e = back;
            sh.kick();
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        if n > sh.target_pages {
            sh.kick();
        }
    }
}

impl Resolver for PageIn {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> std::result::Result<(), ResolveError> {
        let t0 = now_ns();
        let p = f.offset / PAGE_SIZE;
        let st = &self.st;
        let sh = &self.sh;
        let mut waits = 0u32;
        // A program's MADV_DONTNEED returns once its REMOVE event is read, before on_event has
        // marked the pages Zero: let that finish before paging old bytes back in over a drop.
        tiermem_fault::engine::wait_for_event_dispatch();
        loop {
            let at = st.shadow.get(p);
            match at {
                Place::Loading | Place::Evicting => {}
                Place::Resident => {
                    // Present, or dropped by the program with the event still being handled
                    // (the engine reads REMOVE before the kernel zaps): wait, then zero-fill.
                    if waits > 100_000 {
                        ops.copy(f.offset, &ZERO.0, false)?;
                        return Ok(());
                    }
                }
                Place::Zero => {
                    if st.shadow.cas(p, at, Place::Loading) {
                        let rsv = self.admit();
                        if let Err(e) = ops.copy(f.offset, &ZERO.0, false) {
                            st.shadow.set(p, at);
                            self.unreserve(rsv);
                            return Err(e);
                        }
                        st.shadow.set(p, Place::Resident);
                        self.installed(p, rsv);
                        sh.c.zero_fills.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                }
                Place::Buffer(s) => {
                    if st.shadow.cas(p, at, Place::Loading) {
                        let rsv = self.admit();
                        let b = sh.buffer.as_ref().expect("a buffer slot implies a buffer");
                        // SAFETY: slot s holds this page's bytes until we release it.
                        let src = unsafe { std::slice::from_raw_parts(b.slot_ptr(s), PAGE_SIZE) };
                        if let Err(e) = ops.copy(f.offset, src, false) {
                            st.shadow.set(p, at);
                            self.unreserve(rsv);
                            return Err(e);
                        }
                        b.pool.charge_read(PAGE_SIZE as u64);
                        st.shadow.set(p, Place::Resident);
                        b.slots.release(s);
                        self.installed(p, rsv);
                        sh.c.pageins_buffer.fetch_add(1, Ordering::Relaxed);
                        count_thread_pagein();
                        let d = now_ns().saturating_sub(t0);
                        sh.h_buffer.record(d);
                        sh.h_pagein.record(d);
                        st.hist.record(d);
                        sh.record_shared(d, false);
                        return Ok(());
                    }
                }
                Place::Ssd(s) => {
                    if st.shadow.cas(p, at, Place::Loading) {
                        let rsv = self.admit();
                        let (bi, page) = sh.bounce.claim();
                        sh.read_begin();
                        // SAFETY: the claimed bounce page is ours until released below.
                        let buf = unsafe { std::slice::from_raw_parts_mut(page, PAGE_SIZE) };
                        let read = sh.swap.dev.read_at(s * PAGE_SIZE as u64, buf);
                        sh.read_end();
                        if read.is_err() {
                            sh.bounce.release(bi);
                            st.shadow.set(p, at);
                            self.unreserve(rsv);
                            sh.c.io_errors.fetch_add(1, Ordering::Relaxed);
                            return Err(ResolveError::Resolver(
                                "reading the page back from the pager's swap file failed",
                            ));
                        }
                        let r = ops.copy(f.offset, buf, false);
                        sh.bounce.release(bi);
                        if let Err(e) = r {
                            st.shadow.set(p, at);
                            self.unreserve(rsv);
                            return Err(e);
                        }
                        // Keep the swap copy: a clean eviction then needs no write (see
                        // `shadow`); the evictor reclaims kept copies when it needs the space.
                        st.shadow.set_kept(p, s);
                        st.shadow.set(p, Place::Resident);
                        self.installed(p, rsv);
                        sh.c.pageins_ssd.fetch_add(1, Ordering::Relaxed);
                        count_thread_pagein();
                        let d = now_ns().saturating_sub(t0);
                        sh.h_ssd.record(d);
                        sh.h_pagein.record(d);
                        st.hist.record(d);
                        sh.record_shared(d, true);
                        if st.ns.load(Ordering::Relaxed) {
                            // NS: bring the rest of its swap cluster into the buffer.
                            let _ = sh.prefetch_q.push(s / crate::slots::CLUSTER as u64);
                            sh.kick();
                        }
                        return Ok(());
                    }
                }
            }
            waits += 1;
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }

    fn on_event(&self, ev: &RegionEvent) {
        let (offset, len) = match *ev {
            RegionEvent::Remove { offset, len } | RegionEvent::Unmap { offset, len } => {
                (offset, len)
            }
            _ => return,
        };
        let st = &self.st;
        let sh = &self.sh;
        let first = offset / PAGE_SIZE;
        let end = ((offset + len) / PAGE_SIZE).min(st.shadow.len());
        for p in first..end {
            loop {
                let at = st.shadow.get(p);
                match at {
                    Place::Zero => break,
                    // A fault or the evictor holds it for one copy: let it finish.
                    Place::Loading | Place::Evicting => {
                        std::thread::yield_now();
                        continue;
                    }
                    _ => {}
                }
                // Claim it (a kept slot may only change under a claim), then drop it.
                if !st.shadow.cas(p, at, Place::Evicting) {
                    continue;
                }
                if let Some(k) = st.shadow.take_kept(p) {
                    sh.swap.slots.release(k);
                }
                st.shadow.set(p, Place::Zero);
                match at {
                    Place::Resident => {
                        sh.resident.fetch_sub(1, Ordering::AcqRel);
                    }
                    Place::Buffer(s) => {
                        if let Some(b) = &sh.buffer {
                            b.slots.release(s);
                        }
                    }
                    Place::Ssd(s) => sh.swap.slots.release(s),
                    _ => {}
                }
                sh.c.dropped.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
}
