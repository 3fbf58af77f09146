//! The fork-less `wp` method: a point-in-time snapshot of live memory by copy-before-write,
//! with extra memory bounded by the staging slots whatever the size or the write rate.
//!
//! * [`Memory`] is snapshot-able memory: private anonymous, `MADV_NOHUGEPAGE` (units and
//!   protection are per 4 KiB page), registered with the fault engine for WP faults only.
//!   Nothing is protected between snapshots, so it costs nothing then; first touches are the
//!   kernel's (MISSING is not registered: a page absent at the pause is zero in the snapshot
//!   whatever is written to it later, so its first touch needs no copy and no signal).
//! * [`begin`] runs in the caller's pause: `PAGEMAP_SCAN` (PRESENT | SWAPPED) of every region
//!   gives the unit bitmaps (MDC's `mincore2`), the file is created at its final length (a full
//!   disk refuses here, with nothing protected), the present pages are write-protected
//!   (`UFFDIO_WRITEPROTECT`, synchronous), and a dumper thread starts.
//! * The dumper takes units in address order: copy the unit's present pages into its buffer,
//!   unprotect the unit, write the copy at the unit's final offset. Staged units go first.
//! * A write to a unit not yet dumped faults (in the writing thread, inside the engine's SIGBUS
//!   handler: async-signal-safe, no allocation, no lock). In order of preference:
//!   1. a free *staging slot* (256 KiB): the thread claims the unit, copies its present pages
//!      into the slot, unprotects the unit and goes on; the dumper writes the slot at the
//!      unit's place (no byte written twice);
//!   2. a free *spill slot* (one page): the thread copies only the page it writes and
//!      unprotects only that page; the dumper appends spill slots to the file's spill area in
//!      batches of up to 63 pages behind a header naming each (unit, page, CRC), sequential
//!      writes at the disk's bandwidth, and the reader lays them over their units. Freeing a
//!      page of staging memory then costs 4 KiB of disk, not the 256 KiB of its unit: under a
//!      writer faster than the disk, writes no longer wait for whole units to reach it;
//!   3. neither: the thread writes the unit to the file itself, straight from the
//!      still-protected pages (`pwritev`), then unprotects it (MDC's dump-before-write).
//!
//! Extra memory: (`staging_slots` + [`DUMPER_BUFFERS`] + spill batches (`staging_slots` / 2,
//! rounded up)) × 256 KiB + 40 B per unit ([`crate::Options::extra_bytes_bound`]).
//!
//! A unit has one owner at a time (`PENDING` → `CLAIMED` by compare-and-swap → `DONE`): a second
//! writer to a claimed unit waits (yielding) until its owner has unprotected it. A page has one
//! spiller: its bit in the unit's `spill_mask`, taken by `fetch_or`; whoever claims the unit
//! seals the mask (all bits) and waits until the pages spilled before are copied (`ready`)
//! before unprotecting it, and leaves their bytes out of the unit's checksum. A removal,
//! unmap or move of a region during the snapshot aborts it: everything is unprotected and the
//! temporary file removed; the previous snapshot at the target stays.

use crate::error::{Result, SnapshotError};
use crate::format::Writer;
use crate::format::{self, Layout, Method, RegionInfo, Reservation, PAGE, UNIT_BYTES, UNIT_PAGES};
use crate::job::{Options, Report};
use std::path::Path;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem_fault::sys::{
    PageRegion, PmScanArg, PAGE_IS_PFNZERO, PAGE_IS_PRESENT, PAGE_IS_SWAPPED,
};
use tiermem_fault::{
    Engine, Fault, FaultOps, ForkPolicy, Modes, Pagemap, RegionEvent, RegionHandle, RegionSpec,
    Resolution, ResolveError, Resolver,
};
use tiermem_media::AlignedBuf;

/// Buffers of the dumper (Q): units it copies and writes together, in flight at once.
pub const DUMPER_BUFFERS: usize = 8;

/// Spill batches (each a header page and [`format::SPILL_PAGES`] page slots) of a job with
/// `staging_slots` staging slots: half as many, rounded up (none without staging).
pub fn spill_batches(staging_slots: usize) -> usize {
    staging_slots.div_ceil(2)
}

/// Pages of one spill batch buffer (its header and its slots).
const BATCH_PAGES: usize = format::SPILL_PAGES + 1;

/// Unit states.
const PENDING: u8 = 1;
const CLAIMED: u8 = 2;
const DONE: u8 = 3;

/// Per region, what its resolver reads: the job it belongs to while a snapshot runs.
struct Shared {
    job: AtomicPtr<JobRegion>,
    /// Resolver calls in progress (a job is freed only once none is).
    inflight: AtomicUsize,
}

/// Memory that can be snapshotted (see the module doc). Unregisters and unmaps on drop.
pub struct Memory {
    name: String,
    ptr: *mut u8,
    len: usize,
    handle: Option<RegionHandle>,
    shared: Arc<Shared>,
    resolution: Resolution,
    /// A job (any method) holds it.
    busy: AtomicBool,
}

// SAFETY: Memory owns its mapping; the raw pointer is only an address.
unsafe impl Send for Memory {}
// SAFETY: shared access hands out the address only; the bytes are the caller's to synchronise.
unsafe impl Sync for Memory {}

impl Memory {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed private anonymous memory named
    /// `name` and registers it for write-protect faults, resolved in the writing thread.
    /// Kernel writes into it (`read(2)` into a buffer there) fail with EFAULT while a snapshot
    /// runs: use [`Memory::map_with`] and [`Resolution::HandlerThread`] for such memory.
    pub fn map(name: &str, len: usize) -> Result<Memory> {
        Memory::map_with(name, len, Resolution::InThread)
    }

    /// As [`Memory::map`], resolving faults where `resolution` says.
    pub fn map_with(name: &str, len: usize, resolution: Resolution) -> Result<Memory> {
        if len == 0 {
            return Err(SnapshotError::InvalidArgument(format!(
                "memory {name:?} of 0 bytes"
            )));
        }
        if name.len() > format::MAX_NAME {
            return Err(SnapshotError::InvalidArgument(format!(
                "memory name of {} bytes (at most {})",
                name.len(),
                format::MAX_NAME
            )));
        }
        let len = len.div_ceil(PAGE) * PAGE;
        // SAFETY: a fresh anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SnapshotError::io(
                "mmap",
                Path::new(name),
                std::io::Error::last_os_error(),
            ));
        }
        let ptr = p as *mut u8;
        // SAFETY: the mapping just made; a failed hint only leaves huge pages allowed, which the
        // registration below does not depend on (protection would cover 2 MiB at a time).
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        let shared = Arc::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            inflight: AtomicUsize::new(0),
        });
        // In-thread memory goes to a forked child as plain memory (the fork methods dump it
        // there); a handler-thread context may ask for EVENT_FORK, so its memory stays out.
        let fork = match resolution {
            Resolution::InThread => ForkPolicy::PlainInChild,
            _ => ForkPolicy::DontFork,
        };
        let mut spec = RegionSpec::new(ptr, len)
            .modes(Modes::WP)
            .resolution(resolution)
            .fork(fork);
        spec.protect_on_register = false;
        let handle = match Engine::global().register(
            spec,
            Arc::new(Guard {
                shared: shared.clone(),
            }),
        ) {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: unmapping the mapping made above, never handed out.
                unsafe { libc::munmap(p, len) };
                return Err(e.into());
            }
        };
        Ok(Memory {
            name: name.to_string(),
            ptr,
            len,
            handle: Some(handle),
            shared,
            resolution,
            busy: AtomicBool::new(false),
        })
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: memory has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Its name (the region's name in the snapshot file).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a snapshot of it is running (its job not yet waited for or aborted).
    pub fn in_snapshot(&self) -> bool {
        self.busy.load(SeqCst)
    }

    /// Takes the memory for a job; false if one holds it already.
    pub(crate) fn claim(&self) -> bool {
        self.busy
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_ok()
    }

    /// Gives the memory back after a job ended.
    pub(crate) fn release(&self) {
        self.busy.store(false, SeqCst);
    }

    /// Where its faults are resolved.
    pub fn resolution(&self) -> Resolution {
        self.resolution
    }

    /// Its fault-engine region id.
    pub fn region_id(&self) -> u64 {
        self.handle().id()
    }

    /// Write-protect faults taken so far (writes to units not yet dumped, all snapshots).
    pub fn faults(&self) -> u64 {
        self.handle().faults()
    }

    fn handle(&self) -> &RegionHandle {
        // Present from map until drop.
        self.handle.as_ref().expect("memory handle")
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        drop(self.handle.take());
        // SAFETY: our own mapping; nothing refers to it any more (a job borrows the memory).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The resolver of a [`Memory`]: routes write faults to the running job.
struct Guard {
    shared: Arc<Shared>,
}

impl Resolver for Guard {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        self.shared.inflight.fetch_add(1, SeqCst);
        let jr = self.shared.job.load(SeqCst);
        let r = if jr.is_null() {
            Ok(())
        } else {
            // SAFETY: a job stays alive while its pointer is published and until `inflight`,
            // which this call raised before reading the pointer, is back to zero.
            unsafe { &*jr }.on_write(f.offset, ops)
        };
        // The faulting page is unprotected in any case (its unit is dumped or staged now, or
        // the job ended and unprotected everything; a stray protection must not hang the
        // writer).
        let u = ops.unprotect(f.offset, PAGE);
        self.shared.inflight.fetch_sub(1, SeqCst);
        r.and(u)
    }

    fn on_event(&self, ev: &RegionEvent) {
        if matches!(ev, RegionEvent::Fork { .. }) {
            return;
        }
        self.shared.inflight.fetch_add(1, SeqCst);
        let jr = self.shared.job.load(SeqCst);
        if !jr.is_null() {
            // SAFETY: as in `resolve`.
            let job = unsafe { &*(*jr).job };
            job.fail(ERR_REGION_CHANGED);
        }
        self.shared.inflight.fetch_sub(1, SeqCst);
    }
}

/// Failure codes a signal handler can record (no allocation there).
const ERR_NONE: u32 = 0;
const ERR_REGION_CHANGED: u32 = 1;
const ERR_WRITE: u32 = 2;
const ERR_ABORTED: u32 = 3;

fn err_text(code: u32) -> &'static str {
    match code {
        ERR_REGION_CHANGED => {
            "a region was unmapped, moved or had pages removed (MADV_DONTNEED) during the snapshot"
        }
        ERR_WRITE => "a faulting thread's write of a unit to the snapshot file failed",
        ERR_ABORTED => "aborted by the caller",
        _ => "unknown",
    }
}

/// One region of a running job.
struct JobRegion {
    job: *const JobShared,
    /// Its place in `JobShared::regions`.
    index: usize,
    base: usize,
    len: usize,
    first_unit: usize,
}

/// What a running job shares between the caller, the dumper and faulting threads.
struct JobShared {
    writer: Writer,
    state: Vec<AtomicU8>,
    regions: Vec<JobRegion>,
    /// Owns the staging buffers `slot_ptr` points into (only ever accessed through those).
    #[allow(dead_code)]
    slots: Vec<AlignedBuf>,
    /// `slots[s]`'s first byte, taken from the owned buffer (writes go through these).
    slot_ptr: Vec<SendPtr<u8>>,
    /// Bit s set: slot s is free.
    free: AtomicU64,
    /// Slot s holds unit `slot_unit[s] - 1` for the dumper (0: nothing).
    slot_unit: Vec<AtomicUsize>,
    /// The checksum of slot s's unit (its pages outside the spilled ones).
    slot_crc: Vec<AtomicU32>,
    /// Per unit: pages taken by a spiller; all bits once a thread claimed the unit.
    spill_mask: Vec<AtomicU64>,
    /// Per unit: spilled pages whose copy is complete.
    spill_ready: Vec<AtomicU64>,
    /// Owns the spill batch buffers (`spill_ptr` points into it): batch b is pages
    /// `b * BATCH_PAGES ..`, its header first.
    #[allow(dead_code)]
    spill_buf: Option<AlignedBuf>,
    spill_ptr: SendPtr<u8>,
    /// Per batch, bit i set: its slot i is free.
    spill_free: Vec<AtomicU64>,
    /// Per spill slot (batch × SPILL_PAGES + i): `(unit << 6 | page) + 1` once its page is
    /// copied (0: nothing for the dumper).
    spill_slot: Vec<AtomicU64>,
    /// Per spill slot: the page's `page_crc`.
    spill_crc: Vec<AtomicU32>,
    /// Whether faulting threads may spill (a file target with room reserved ahead).
    spill_on: AtomicBool,
    spilled: AtomicU64,
    error: AtomicU32,
    done_units: AtomicUsize,
    staged_units: AtomicU64,
    self_written: AtomicU64,
    dumped: AtomicU64,
    waits: AtomicU64,
}

// SAFETY: the raw pointers in JobRegion point into the JobShared itself (pinned in a Box) and
// at memory the job borrows; all mutation is through atomics.
unsafe impl Send for JobShared {}
// SAFETY: as above.
unsafe impl Sync for JobShared {}

impl JobShared {
    fn fail(&self, code: u32) {
        let _ = self.error.compare_exchange(ERR_NONE, code, AcqRel, Acquire);
    }

    fn failed(&self) -> bool {
        self.error.load(Acquire) != ERR_NONE
    }

    /// Pages of global unit `g` (region `r`, unit `u` in it): (address, bytes).
    fn unit_range(&self, r: usize, u: usize) -> (usize, usize) {
        let jr = &self.regions[r];
        let n = format::pages_in_unit(jr.len as u64, u);
        (jr.base + u * UNIT_BYTES, n * PAGE)
    }

    /// Copies the present pages of unit (r, u) with bitmap `bm` into `dst`; returns bytes.
    /// Async-signal-safe.
    fn copy_unit(&self, r: usize, u: usize, bm: u64, dst: &mut [u8]) -> usize {
        let (addr, _) = self.unit_range(r, u);
        let mut k = 0;
        for p in 0..UNIT_PAGES {
            if bm >> p & 1 == 1 {
                // SAFETY: page p of the unit lies inside the region the job borrows; dst has
                // room for every set bit (UNIT_BYTES).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (addr + p * PAGE) as *const u8,
                        dst.as_mut_ptr().add(k * PAGE),
                        PAGE,
                    )
                };
                k += 1;
            }
        }
        k * PAGE
    }

    /// Writes unit (r, u) to the file straight from its (protected) pages and records it,
    /// the spilled pages `skip` left out of its checksum (their bytes in the file are
    /// overridden by the spill area). Async-signal-safe: one `pwritev` (retried on a short
    /// write), checksums computed in place.
    fn write_unit_in_place(&self, g: usize, r: usize, u: usize, skip: u64) -> bool {
        let bm = self.writer.layout().bitmap(g);
        let (addr, _) = self.unit_range(r, u);
        let (off, len) = self.writer.layout().unit_extent(g);
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; UNIT_PAGES];
        let mut n = 0;
        let mut crc = 0u32;
        for p in 0..UNIT_PAGES {
            if bm >> p & 1 == 1 {
                let a = addr + p * PAGE;
                if skip >> p & 1 == 0 {
                    // SAFETY: page p lies inside the borrowed region and is protected: stable.
                    crc ^= format::page_crc(p, unsafe {
                        std::slice::from_raw_parts(a as *const u8, PAGE)
                    });
                }
                iov[n] = libc::iovec {
                    iov_base: a as *mut libc::c_void,
                    iov_len: PAGE,
                };
                n += 1;
            }
        }
        let mut done = 0usize;
        let mut first = 0usize;
        while done < len {
            // SAFETY: iov[first..n] describe readable pages; the fd is the writer's, open.
            let w = unsafe {
                libc::pwritev(
                    self.writer.raw_fd(),
                    iov[first..n].as_ptr(),
                    (n - first) as i32,
                    (self.writer.raw_base() + off + done as u64) as libc::off_t,
                )
            };
            if w < 0 {
                // SAFETY: reading errno.
                if unsafe { *libc::__errno_location() } == libc::EINTR {
                    continue;
                }
                return false;
            }
            if w == 0 {
                return false;
            }
            // Advance past whole pages written; a partial page (not on direct I/O) continues
            // from its middle.
            let mut left = w as usize;
            done += left;
            while left > 0 {
                if left >= iov[first].iov_len {
                    left -= iov[first].iov_len;
                    first += 1;
                } else {
                    iov[first].iov_base =
                        (iov[first].iov_base as usize + left) as *mut libc::c_void;
                    iov[first].iov_len -= left;
                    left = 0;
                }
            }
        }
        self.writer.record_unit(g, crc);
        true
    }

    /// Claims unit `g` for the caller (`PENDING` → `CLAIMED`) and seals its spill mask;
    /// returns the pages spilled before, or None if another thread has the unit.
    /// Async-signal-safe.
    fn claim_unit(&self, g: usize) -> Option<u64> {
        self.state[g]
            .compare_exchange(PENDING, CLAIMED, AcqRel, Acquire)
            .ok()?;
        Some(self.spill_mask[g].fetch_or(u64::MAX, AcqRel) & self.writer.layout().bitmap(g))
    }

    /// Waits until the pages `spilled` of unit `g` are copied by their spillers (the unit's
    /// owner must not unprotect them before). Async-signal-safe.
    fn wait_spilled(&self, g: usize, spilled: u64) {
        while self.spill_ready[g].load(Acquire) & spilled != spilled {
            // SAFETY: sched_yield is async-signal-safe.
            unsafe { libc::sched_yield() };
        }
    }

    /// Takes a free spill slot; None if none (or spilling is off). Async-signal-safe.
    fn take_spill_slot(&self) -> Option<usize> {
        if !self.spill_on.load(Acquire) {
            return None;
        }
        self.spill_free
            .iter()
            .enumerate()
            .find_map(|(b, w)| take_slot(w).map(|i| b * format::SPILL_PAGES + i))
    }

    /// Gives spill slot `s` back.
    fn free_spill_slot(&self, s: usize) {
        let (b, i) = (s / format::SPILL_PAGES, s % format::SPILL_PAGES);
        self.spill_free[b].fetch_or(1 << i, AcqRel);
    }

    /// Spill slot `s`'s page.
    fn spill_page(&self, s: usize) -> *mut u8 {
        let (b, i) = (s / format::SPILL_PAGES, s % format::SPILL_PAGES);
        (self.spill_ptr.0 as usize + (b * BATCH_PAGES + 1 + i) * PAGE) as *mut u8
    }
}

impl JobRegion {
    /// A write fault at region offset `offset` (async-signal-safe).
    fn on_write(&self, offset: usize, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        // SAFETY: the job outlives its published regions (see `Guard::resolve`).
        let job = unsafe { &*self.job };
        let u = offset / UNIT_BYTES;
        let p = offset % UNIT_BYTES / PAGE;
        let g = self.first_unit + u;
        let r = self.index;
        let bm = job.writer.layout().bitmap(g);
        if bm >> p & 1 == 0 {
            // Not a stored page: never protected by this job.
            return Ok(());
        }
        let bit = 1u64 << p;
        let mut waited = false;
        let mut wait = || {
            if !waited {
                waited = true;
                job.waits.fetch_add(1, Relaxed);
            }
            // SAFETY: sched_yield is async-signal-safe.
            unsafe { libc::sched_yield() };
        };
        loop {
            match job.state[g].load(Acquire) {
                DONE => return Ok(()),
                CLAIMED => {
                    // Its owner unprotects the unit when done; a page spilled before the
                    // claim is free to write once copied.
                    if job.spill_ready[g].load(Acquire) & bit != 0 {
                        return Ok(());
                    }
                    wait();
                }
                _ => {
                    if job.spill_mask[g].load(Acquire) & bit != 0 {
                        // Another thread spills this page: go on once it is copied.
                        if job.spill_ready[g].load(Acquire) & bit != 0 {
                            return Ok(());
                        }
                        wait();
                        continue;
                    }
                    // 1. A free staging slot: the whole unit.
                    if let Some(s) = take_slot(&job.free) {
                        let Some(spilled) = job.claim_unit(g) else {
                            job.free.fetch_or(1 << s, AcqRel);
                            continue;
                        };
                        // SAFETY: slot s is ours until the dumper frees it; the slot buffers
                        // are never resized, so this &mut does not alias a live reference of
                        // anyone else.
                        let buf = unsafe {
                            std::slice::from_raw_parts_mut(job.slot_ptr[s].0 as *mut u8, UNIT_BYTES)
                        };
                        let n = job.copy_unit(r, u, bm, buf);
                        job.slot_crc[s]
                            .store(format::unit_checksum(bm, &buf[..n], spilled), Relaxed);
                        job.slot_unit[s].store(g + 1, Release);
                        job.staged_units.fetch_add(1, Relaxed);
                        return job.release_unit(r, u, g, spilled, ops);
                    }
                    // 2. A free spill slot: this page only.
                    if let Some(s) = job.take_spill_slot() {
                        if job.spill_mask[g].fetch_or(bit, AcqRel) & bit != 0 {
                            // Someone spilled it or claimed the unit meanwhile.
                            job.free_spill_slot(s);
                            continue;
                        }
                        let dst = job.spill_page(s);
                        // SAFETY: the page lies in the borrowed region and is still protected
                        // (whoever claims the unit waits for `ready` before unprotecting it);
                        // spill slot s is ours until the dumper frees it.
                        let c = unsafe {
                            std::ptr::copy_nonoverlapping(
                                (self.base + u * UNIT_BYTES + p * PAGE) as *const u8,
                                dst,
                                PAGE,
                            );
                            format::page_crc(p, std::slice::from_raw_parts(dst, PAGE))
                        };
                        job.writer.record_spilled_page(g, c);
                        job.spill_crc[s].store(c, Relaxed);
                        job.spill_slot[s].store(((g as u64) << 6 | p as u64) + 1, Release);
                        job.spill_ready[g].fetch_or(bit, Release);
                        job.spilled.fetch_add(1, Relaxed);
                        // The caller unprotects the page.
                        return Ok(());
                    }
                    // 3. The unit to the file, by this thread.
                    let Some(spilled) = job.claim_unit(g) else {
                        continue;
                    };
                    if !job.write_unit_in_place(g, r, u, spilled) {
                        job.fail(ERR_WRITE);
                    }
                    job.self_written.fetch_add(1, Relaxed);
                    return job.release_unit(r, u, g, spilled, ops);
                }
            }
        }
    }
}

/// Takes a free slot from the bitmap `free`; None if none. Async-signal-safe.
fn take_slot(free: &AtomicU64) -> Option<usize> {
    let mut f = free.load(Acquire);
    while f != 0 {
        let s = f.trailing_zeros() as usize;
        match free.compare_exchange(f, f & !(1 << s), AcqRel, Acquire) {
            Ok(_) => return Some(s),
            Err(now) => f = now,
        }
    }
    None
}

impl JobShared {
    /// Ends a thread's claim on unit (r, u) = `g` whose bytes are safe (staged or written):
    /// waits for the pages spilled before the claim, unprotects the unit, marks it done.
    /// Async-signal-safe.
    fn release_unit(
        &self,
        r: usize,
        u: usize,
        g: usize,
        spilled: u64,
        ops: &FaultOps<'_>,
    ) -> Result<(), ResolveError> {
        self.wait_spilled(g, spilled);
        let (_, len) = self.unit_range(r, u);
        let res = ops.unprotect(u * UNIT_BYTES, len);
        self.state[g].store(DONE, Release);
        self.done_units.fetch_add(1, Relaxed);
        res
    }
}

/// A running `wp` snapshot. [`WpJob::wait`] for its report; dropping it unfinished aborts it.
pub(crate) struct WpJob<'a> {
    shared: Option<Box<JobShared>>,
    mem: Vec<&'a Memory>,
    dumper: Option<std::thread::JoinHandle<Result<u64>>>,
    started: Instant,
    pause: Duration,
    bound: u64,
    app: Vec<u8>,
}

/// Begins a `wp` snapshot (see [`crate::begin`] and [`crate::begin_paused`]; `pause: None`:
/// the caller paused already).
pub(crate) fn start<'a, G>(
    mem: &[&'a Memory],
    target: &Path,
    app: Vec<u8>,
    opts: Options,
    pause: Option<impl FnOnce() -> G>,
) -> Result<WpJob<'a>> {
    let t0 = Instant::now();
    let pm = Pagemap::open()?;
    let infos: Vec<RegionInfo> = crate::job::region_infos(mem);
    let scan_all = || -> Result<(Vec<u64>, Vec<Vec<Run>>)> {
        let mut bitmaps = Vec::new();
        let mut runs = Vec::new();
        for m in mem {
            let (b, r) = scan(&pm, m.ptr as usize, m.len)?;
            bitmaps.extend(b);
            runs.push(r);
        }
        Ok((bitmaps, runs))
    };
    let mut slots = Vec::with_capacity(opts.staging_slots);
    for _ in 0..opts.staging_slots {
        slots.push(AlignedBuf::new(UNIT_BYTES, PAGE)?);
    }
    let slot_ptr = slots
        .iter_mut()
        .map(|b| SendPtr(b.as_mut_ptr() as *const u8))
        .collect();
    let batches = spill_batches(opts.staging_slots);
    let mut spill_buf = if batches > 0 {
        Some(AlignedBuf::new(batches * BATCH_PAGES * PAGE, PAGE)?)
    } else {
        None
    };
    let spill_ptr = SendPtr(
        spill_buf
            .as_mut()
            .map_or(std::ptr::null(), |b| b.as_mut_ptr() as *const u8),
    );
    // The pause starts here for `begin` (its caller paused), after the file's creation for
    // `begin_paused`.
    let (reservation, guard, tp, scanned) = match pause {
        None => {
            let (bitmaps, runs) = scan_all()?;
            let layout = Layout::new(infos.clone(), bitmaps, app.len() as u64)?;
            let r = Reservation::new_in(target, layout.file_len(), opts.target)?;
            (r, None, t0, Some((layout, runs)))
        }
        Some(pause) => {
            let r = crate::job::reserve_estimate(mem, &pm, target, app.len() as u64, opts.target)?;
            let g = pause();
            (r, Some(g), Instant::now(), None)
        }
    };
    let (layout, runs) = match scanned {
        Some(lr) => lr,
        None => {
            let (bitmaps, runs) = scan_all()?;
            (Layout::new(infos, bitmaps, app.len() as u64)?, runs)
        }
    };
    let units = layout.units();
    let writer = reservation.into_writer(layout, Method::Wp)?;
    let mut first = 0;
    let mut regions = Vec::with_capacity(mem.len());
    for (index, m) in mem.iter().enumerate() {
        regions.push(JobRegion {
            job: std::ptr::null(),
            index,
            base: m.ptr as usize,
            len: m.len,
            first_unit: first,
        });
        first += format::units_of(m.len as u64);
    }
    let state: Vec<AtomicU8> = (0..units)
        .map(|g| {
            AtomicU8::new(if writer.layout().bitmap(g) == 0 {
                DONE
            } else {
                PENDING
            })
        })
        .collect();
    for g in 0..units {
        if writer.layout().bitmap(g) == 0 {
            writer.record_unit(g, 0);
        }
    }
    let empty = state.iter().filter(|s| s.load(Relaxed) == DONE).count();
    let free = if opts.staging_slots == 64 {
        u64::MAX
    } else {
        (1u64 << opts.staging_slots) - 1
    };
    let mut shared = Box::new(JobShared {
        writer,
        state,
        regions,
        slots,
        slot_ptr,
        free: AtomicU64::new(free),
        slot_unit: (0..opts.staging_slots)
            .map(|_| AtomicUsize::new(0))
            .collect(),
        slot_crc: (0..opts.staging_slots).map(|_| AtomicU32::new(0)).collect(),
        spill_mask: (0..units).map(|_| AtomicU64::new(0)).collect(),
        spill_ready: (0..units).map(|_| AtomicU64::new(0)).collect(),
        spill_buf,
        spill_ptr,
        spill_free: (0..batches)
            .map(|_| AtomicU64::new((1u64 << format::SPILL_PAGES) - 1))
            .collect(),
        spill_slot: (0..batches * format::SPILL_PAGES)
            .map(|_| AtomicU64::new(0))
            .collect(),
        spill_crc: (0..batches * format::SPILL_PAGES)
            .map(|_| AtomicU32::new(0))
            .collect(),
        // The dumper turns it on once it has reserved room in the file.
        spill_on: AtomicBool::new(false),
        spilled: AtomicU64::new(0),
        error: AtomicU32::new(ERR_NONE),
        done_units: AtomicUsize::new(empty),
        staged_units: AtomicU64::new(0),
        self_written: AtomicU64::new(0),
        dumped: AtomicU64::new(0),
        waits: AtomicU64::new(0),
    });
    let sp: *const JobShared = &*shared;
    for jr in shared.regions.iter_mut() {
        jr.job = sp;
    }
    // Publish before protecting: every WP fault from here on finds the job.
    for (i, m) in mem.iter().enumerate() {
        m.shared.job.store(
            &shared.regions[i] as *const JobRegion as *mut JobRegion,
            SeqCst,
        );
    }
    let mut job = WpJob {
        shared: Some(shared),
        mem: mem.to_vec(),
        dumper: None,
        started: t0,
        pause: Duration::ZERO,
        bound: opts.extra_bytes_bound(units),
        app,
    };
    // One UFFDIO_WRITEPROTECT per region, over the span of its runs: without WP_UNPOPULATED
    // (the engine asks for it only with WP_ASYNC) write protection of anonymous memory covers
    // present and swapped pages and leaves holes alone, so the span protects exactly the runs,
    // in one page-table walk instead of one per run (64 MiB with every third page a hole:
    // 5,461 ioctls and an 84 ms pause before).
    for (i, m) in mem.iter().enumerate() {
        let (Some(first), Some(last)) = (runs[i].first(), runs[i].last()) else {
            continue;
        };
        let (start, end) = (first.0, last.0 + last.1);
        if let Err(e) = m.handle().protect(start, end - start) {
            // Drop unprotects what was protected and removes the file.
            drop(job);
            return Err(e.into());
        }
    }
    job.pause = tp.elapsed();
    drop(guard);
    // The dumper.
    let sp = SendPtr(sp);
    let handles: Vec<SendPtr<RegionHandle>> = mem
        .iter()
        .map(|m| SendPtr(m.handle() as *const RegionHandle))
        .collect();
    job.dumper = Some(
        std::thread::Builder::new()
            .name("tiermem-snapdump".into())
            .spawn(move || {
                let sp = sp;
                let handles = handles;
                // SAFETY: the job (and the memory it borrows) outlives this thread: Job joins
                // it before freeing anything.
                let job = unsafe { &*sp.0 };
                let hs: Vec<&RegionHandle> = handles.iter().map(|h| unsafe { &*h.0 }).collect();
                dump(job, &hs)
            })
            .map_err(|e| SnapshotError::io("spawn", target, e))?,
    );
    Ok(job)
}

/// A run of pages with frames: (region offset, bytes).
pub(crate) type Run = (usize, usize);

pub(crate) struct SendPtr<T>(pub(crate) *const T);
// SAFETY: only an address handed to the dumper thread (see `begin`).
unsafe impl<T> Send for SendPtr<T> {}

/// The unit bitmaps of `[base, base+len)` and its runs of pages with frames (region offsets).
/// PAGEMAP_SCAN walks page tables only: it neither faults pages in nor allocates.
pub(crate) fn scan(pm: &Pagemap, base: usize, len: usize) -> Result<(Vec<u64>, Vec<Run>)> {
    let mut bitmaps = vec![0u64; format::units_of(len as u64)];
    let mut runs = Vec::new();
    let mut buf = vec![PageRegion::default(); 512];
    scan_runs(pm, base, len, &mut buf, |s, e| {
        runs.push((s, e - s));
        for p in s / PAGE..e / PAGE {
            bitmaps[p / UNIT_PAGES] |= 1 << (p % UNIT_PAGES);
        }
    })
    .map_err(|e| {
        SnapshotError::io(
            "ioctl(PAGEMAP_SCAN)",
            Path::new("/proc/self/pagemap"),
            std::io::Error::from_raw_os_error(e),
        )
    })?;
    Ok((bitmaps, runs))
}

/// Calls `f(start, end)` (region offsets) for each run of pages of `[base, base+len)` that
/// have frames: present or swapped, and not the shared zero page (read but never written:
/// zero in the snapshot without storing it, and a later write copies nothing). `buf` is the
/// ioctl's output vector. Allocates nothing (a forked child may call it); errors are errnos.
pub(crate) fn scan_runs(
    pm: &Pagemap,
    base: usize,
    len: usize,
    buf: &mut [PageRegion],
    mut f: impl FnMut(usize, usize),
) -> std::result::Result<(), i32> {
    let mut start = base;
    let end = base + len;
    while start < end {
        let mut arg = PmScanArg {
            start: start as u64,
            end: end as u64,
            vec: buf.as_mut_ptr() as u64,
            vec_len: buf.len() as u64,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            category_inverted: PAGE_IS_PFNZERO,
            category_mask: PAGE_IS_PFNZERO,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            ..Default::default()
        };
        let n = pm.scan(&mut arg)?;
        for r in &buf[..n] {
            f(r.start as usize - base, r.end as usize - base);
        }
        if arg.walk_end as usize <= start {
            break;
        }
        start = arg.walk_end as usize;
    }
    Ok(())
}

/// The dumper: spilled pages and staged units first, then pending units in address order,
/// until every unit is in the file. Each round copies up to [`DUMPER_BUFFERS`] pending units
/// into its buffers (unprotecting each as soon as it is copied: writers never wait for the
/// disk on its account) and writes them, with the staged slots and the spill batches that
/// have pages, as one batch in flight together.
fn dump(job: &JobShared, handles: &[&RegionHandle]) -> Result<u64> {
    let units = job.state.len();
    let mut bufs = Vec::with_capacity(DUMPER_BUFFERS);
    for _ in 0..DUMPER_BUFFERS {
        bufs.push(AlignedBuf::new(UNIT_BYTES, PAGE)?);
    }
    let batches = job.spill_free.len();
    // Room for every spill slot beyond what is written, always: a slot filled is a page
    // that must reach the file. No room: no spilling (staging and dump-before-write only).
    let headroom = (batches * BATCH_PAGES * PAGE) as u64;
    if batches > 0 && job.writer.can_spill() && job.writer.reserve_spill(headroom).is_ok() {
        job.spill_on.store(true, Release);
    }
    let mut next = 0usize;
    let mut entries: Vec<(u32, u32, u32)> = Vec::with_capacity(format::SPILL_PAGES);
    loop {
        if job.failed() {
            return Err(SnapshotError::Aborted(
                err_text(job.error.load(Acquire)).into(),
            ));
        }
        // Spill batches: per batch buffer, the slots whose pages are copied (published
        // before `spill_slot`), written as its header and the prefix of slots up to the last
        // of them (a slot not listed is skipped by readers).
        let mut spill: Vec<(usize, usize, Vec<usize>)> = Vec::new();
        for b in 0..batches {
            let mut listed = Vec::new();
            let mut last = 0;
            entries.clear();
            for i in 0..format::SPILL_PAGES {
                let v = job.spill_slot[b * format::SPILL_PAGES + i].load(Acquire);
                if v == 0 {
                    entries.push((u32::MAX, 0, 0));
                    continue;
                }
                let (g, p) = ((v - 1) >> 6, (v - 1) & 63);
                let c = job.spill_crc[b * format::SPILL_PAGES + i].load(Relaxed);
                entries.push((g as u32, p as u32, c));
                listed.push(b * format::SPILL_PAGES + i);
                last = i + 1;
            }
            if listed.is_empty() {
                continue;
            }
            entries.truncate(last);
            // SAFETY: a batch's header page is the dumper's alone (writers use its slots).
            let h = unsafe {
                std::slice::from_raw_parts_mut(
                    (job.spill_ptr.0 as usize + b * BATCH_PAGES * PAGE) as *mut u8,
                    PAGE,
                )
            };
            format::encode_spill_header(h, job.writer.uuid(), &entries);
            spill.push((b, last, listed));
        }
        // Staged slots (filled before `slot_unit` was published).
        let mut slots = Vec::new();
        for (s, su) in job.slot_unit.iter().enumerate() {
            let v = su.load(Acquire);
            if v != 0 {
                slots.push((s, v - 1));
            }
        }
        // Pending units into the dumper's buffers.
        let mut copied = Vec::new();
        let mut used = 0;
        while used < DUMPER_BUFFERS && next < units {
            let g = next;
            next += 1;
            let Some(spilled) = job.claim_unit(g) else {
                continue;
            };
            let (r, u) = job.writer.layout().locate(g);
            let bm = job.writer.layout().bitmap(g);
            let n = job.copy_unit(r, u, bm, &mut bufs[used]);
            let crc = format::unit_checksum(bm, &bufs[used][..n], spilled);
            job.wait_spilled(g, spilled);
            let (addr, len) = job.unit_range(r, u);
            let res = handles[r].unprotect(addr - job.regions[r].base, len);
            job.state[g].store(DONE, Release);
            job.done_units.fetch_add(1, Relaxed);
            res?;
            copied.push((g, used, n, crc));
            used += 1;
        }
        if spill.is_empty() && slots.is_empty() && copied.is_empty() {
            // Everything is claimed: wait for writers still staging, spilling or writing
            // units (a unit is done only once its spilled pages are published).
            if next >= units
                && job.done_units.load(Acquire) == units
                && job.writer.complete()
                && job.spill_slot.iter().all(|v| v.load(Acquire) == 0)
            {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        let mut ops: Vec<(u64, &[u8])> = Vec::with_capacity(slots.len() + copied.len());
        for &(s, g) in &slots {
            let (off, n) = job.writer.layout().unit_extent(g);
            // SAFETY: the slot was filled before `slot_unit` was published (Acquire above)
            // and nobody writes it until it is freed below.
            ops.push((off, unsafe {
                std::slice::from_raw_parts(job.slot_ptr[s].0, n)
            }));
        }
        for &(g, i, n, _) in &copied {
            let off = job.writer.layout().unit_extent(g).0;
            ops.push((off, &bufs[i][..n]));
        }
        let spill_bytes: Vec<&[u8]> = spill
            .iter()
            .map(|&(b, last, _)| {
                // SAFETY: the batch buffer is live for the job; its listed slots are stable
                // until freed below, the others are not read by anyone who trusts them.
                unsafe {
                    std::slice::from_raw_parts(
                        (job.spill_ptr.0 as usize + b * BATCH_PAGES * PAGE) as *const u8,
                        (1 + last) * PAGE,
                    )
                }
            })
            .collect();
        job.writer.write_spill_and(&spill_bytes, &ops)?;
        drop(ops);
        for &(s, g) in &slots {
            job.writer.record_unit(g, job.slot_crc[s].load(Relaxed));
            job.slot_unit[s].store(0, Release);
            job.free.fetch_or(1 << s, AcqRel);
        }
        for &(g, _, _, crc) in &copied {
            job.writer.record_unit(g, crc);
        }
        for (_, _, listed) in &spill {
            for &s in listed {
                job.spill_slot[s].store(0, Release);
                job.free_spill_slot(s);
            }
        }
        if !spill.is_empty()
            && job.spill_on.load(Acquire)
            && job.writer.reserve_spill(headroom).is_err()
        {
            // The disk is full: the slots still filled fit the room reserved before.
            job.spill_on.store(false, Release);
        }
        job.dumped.fetch_add(copied.len() as u64, Relaxed);
    }
    Ok(0)
}

impl<'a> WpJob<'a> {
    /// Units done (dumped, staged or empty) and units in all.
    pub fn progress(&self) -> (usize, usize) {
        let s = self.shared.as_ref().expect("job");
        (s.done_units.load(Relaxed), s.state.len())
    }

    /// The application's pause inside [`begin`].
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// Waits for the dump, finishes the file (durable, renamed over the target) and reports.
    /// On an error the previous snapshot at the target is intact and no page stays protected.
    pub fn wait(mut self) -> Result<Report> {
        let res = self
            .dumper
            .take()
            .map(|d| {
                d.join()
                    .unwrap_or_else(|_| Err(SnapshotError::Aborted("the dumper panicked".into())))
            })
            .unwrap_or(Ok(0));
        let shared = self.end();
        res?;
        // An event dispatched after the dumper's last look (pages removed while it copied).
        // What this cannot see: an event the engine's runtime has read (the kernel then
        // discards the pages) but not yet handed to `on_event` when this check runs; the
        // window is the runtime's dispatch of one message, and the snapshot then holds zeros
        // for pages the application itself dropped during the snapshot.
        if shared.failed() {
            return Err(SnapshotError::Aborted(
                err_text(shared.error.load(Acquire)).into(),
            ));
        }
        let report = Report {
            file_bytes: 0,
            present_pages: shared.writer.layout().present_pages(),
            units: shared.state.len(),
            pause: self.pause,
            total: Duration::ZERO,
            dumped_units: shared.dumped.load(Relaxed),
            staged_units: shared.staged_units.load(Relaxed),
            self_written_units: shared.self_written.load(Relaxed),
            spilled_pages: shared.spilled.load(Relaxed),
            claim_waits: shared.waits.load(Relaxed),
            extra_bytes_bound: self.bound,
            direct: shared.writer.direct(),
        };
        let shared = *shared;
        let file_bytes = shared.writer.finish(&self.app)?;
        Ok(Report {
            file_bytes,
            total: self.started.elapsed(),
            ..report
        })
    }

    /// Aborts: stops the dumper, unprotects everything, removes the temporary file.
    pub fn abort(mut self) {
        if let Some(s) = &self.shared {
            s.fail(ERR_ABORTED);
        }
        if let Some(d) = self.dumper.take() {
            let _ = d.join();
        }
        drop(self.end());
    }

    /// Unpublishes the job, unprotects all memory, waits for resolvers in flight; returns the
    /// shared state for the caller to finish or drop.
    fn end(&mut self) -> Box<JobShared> {
        let shared = self.shared.take().expect("job ended once");
        for m in &self.mem {
            m.shared.job.store(std::ptr::null_mut(), SeqCst);
        }
        for m in &self.mem {
            if m.handle().is_alive() {
                let _ = m.handle().unprotect(0, m.len);
            }
            while m.shared.inflight.load(SeqCst) != 0 {
                std::thread::yield_now();
            }
        }
        shared
    }
}

impl Drop for WpJob<'_> {
    fn drop(&mut self) {
        if self.shared.is_some() {
            if let Some(s) = &self.shared {
                s.fail(ERR_ABORTED);
            }
            if let Some(d) = self.dumper.take() {
                let _ = d.join();
            }
            drop(self.end());
        }
    }
}
