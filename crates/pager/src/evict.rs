//! The evictor thread: keeps DRAM under the budget and the paging buffer from filling.
//!
//! **Page-out.** Victims are taken in fault order (the FIFO the page-in path feeds; user space
//! sees no accessed bits, and the buffer is the second chance). Each victim is claimed in the
//! shadow table (`Resident → Evicting`), then `UFFDIO_MOVE`d out of the region into a scratch
//! page: the page-table entry moves atomically, so a store racing the eviction either lands in
//! the moved page or faults and waits for the page to be published. No write-protect round
//! trip, no `madvise` of region memory (which would wait for the fault engine to read a REMOVE
//! event). The scratch pages belong to the evictor's own userfaultfd, which asks for no events,
//! so freeing them after the batch is one `madvise` with no wait. The page is then copied into
//! an NVM buffer slot (non-temporal stores, the pool's write delay charged) or, with no buffer
//! slot free, written to the swap file straight from the scratch page (`O_DIRECT`, one
//! io_uring batch).
//!
//! **Latency groups.** Buffer pages are kept in groups of 64 of one latency bound, in eviction
//! order. When the buffer runs low, whole groups are destaged to the swap file, highest bound
//! (best effort) first, oldest first, each to 64 consecutive swap slots in 16-page writes; the shadow
//! table is switched `Buffer(s) → Ssd(c+i)` page by page, and a page faulted back in meanwhile
//! keeps its own copy (its swap slot is freed).

use crate::control::{Controller, TenantWindow};
use crate::error::{Error, Result};
use crate::hist::HistSnapshot;
use crate::pager::{Shared, GROUP_PAGES};
use crate::region::RegionState;
use crate::shadow::Place;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tiermem_fault::sys::{UFFDIO_REGISTER_MODE_MISSING, UFFD_FEATURE_MOVE, UFFD_FEATURE_SIGBUS};
use tiermem_fault::{Uffd, PAGE_SIZE};
use tiermem_media::{now_ns, AlignedBuf, IoOp};

/// Swap-file writes the evictor keeps in flight at once.
const WRITE_DEPTH: usize = 8;

/// Swap clusters prefetched into the buffer per evictor round.
const PREFETCH_PER_ROUND: usize = 4;

/// Pages per write when a group is destaged.
const DESTAGE_PIECE: usize = 16;

/// One page in the buffer: its FIFO key (region key | page) and its slot.
#[derive(Clone, Copy)]
struct Entry {
    key: u64,
    slot: u64,
}

/// Buffer pages of one bound in eviction order.
struct Group {
    entries: Vec<Entry>,
}

/// The evictor's state (owned by its thread).
pub(crate) struct Evictor {
    sh: Arc<Shared>,
    uffd: Uffd,
    scratch: usize,
    staging: AlignedBuf,
    /// The group filling now, per bound.
    open: HashMap<u64, Group>,
    /// Full groups per bound, oldest first.
    closed: BTreeMap<u64, VecDeque<Group>>,
    victims: Vec<(Arc<RegionState>, usize)>,
    scratch_pages: usize,
    controller: Controller,
    window_start: std::time::Instant,
    last_ssd: HistSnapshot,
    last_tenant: HashMap<u64, HistSnapshot>,
    /// `TIERMEM_PAGER_TRACE` set: one line per control window on stderr.
    trace: bool,
    /// Where [`Evictor::reclaim`] looks next.
    reclaim_cursor: usize,
    /// The shared pool's controller, while this process leads it.
    pool_ctl: Option<crate::segment::PoolController>,
    /// The tenant's prefetch sequence last seen.
    over_seq: u64,
    /// Fault-order entries older than the queue's that did not fit back into it (see
    /// [`Evictor::requeue`]): victims are taken from here first.
    spill: VecDeque<u64>,
}

// SAFETY: the scratch pages are only touched by the evictor thread.
unsafe impl Send for Evictor {}

impl Evictor {
    pub(crate) fn new(sh: Arc<Shared>) -> Result<Evictor> {
        let uffd = Uffd::open(
            UFFD_FEATURE_MOVE | UFFD_FEATURE_SIGBUS,
            "the pager's page-out (UFFDIO_MOVE, Linux 6.8+)",
        )?;
        let c = &sh.control;
        let scratch_pages =
            sh.batch
                .max(c.fixed_queue)
                .max(if c.enabled { c.s_max + c.s_reserve } else { 0 });
        let len = scratch_pages * PAGE_SIZE;
        // SAFETY: anonymous mapping, checked below.
        let scratch = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if scratch == libc::MAP_FAILED {
            return Err(Error::last("mmap of the pager's scratch pages"));
        }
        // SAFETY: our fresh mapping.
        unsafe { libc::madvise(scratch, len, libc::MADV_NOHUGEPAGE) };
        if let Err(e) = uffd.register(scratch as usize, len, UFFDIO_REGISTER_MODE_MISSING) {
            // SAFETY: our mapping.
            unsafe { libc::munmap(scratch, len) };
            return Err(Error::Sys {
                op: "registering the pager's scratch pages",
                source: std::io::Error::from_raw_os_error(e),
            });
        }
        let staging = AlignedBuf::for_device(&sh.swap.dev, GROUP_PAGES * PAGE_SIZE)?;
        Ok(Evictor {
            victims: Vec::with_capacity(scratch_pages),
            scratch_pages,
            controller: Controller::new(sh.control.clone()),
            window_start: std::time::Instant::now(),
            last_ssd: sh.h_ssd.snapshot(),
            last_tenant: HashMap::new(),
            trace: std::env::var_os("TIERMEM_PAGER_TRACE").is_some(),
            reclaim_cursor: 0,
            pool_ctl: None,
            over_seq: sh
                .tenant()
                .map_or(0, |t| t.over_seq.load(Ordering::Relaxed)),
            sh,
            uffd,
            scratch: scratch as usize,
            staging,
            open: HashMap::new(),
            closed: BTreeMap::new(),
            spill: VecDeque::new(),
        })
    }

    pub(crate) fn run(mut self) {
        loop {
            let mut pfd = libc::pollfd {
                fd: self.sh.kick_fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 20) };
            let mut v = 0u64;
            // SAFETY: reading 8 bytes from our eventfd.
            unsafe { libc::read(self.sh.kick_fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
            self.sh.kicked.store(false, Ordering::Release);
            if self.sh.stop.load(Ordering::Acquire) {
                break;
            }
            if self.window_start.elapsed() >= self.sh.control.window {
                self.control_step();
            }
            self.compact_fifo();
            while self.sh.resident() > self.sh.target_pages {
                if self.evict_batch() == 0 {
                    break;
                }
                self.destage_if_needed();
                self.prefetch();
            }
            self.destage_if_needed();
            self.prefetch();
            self.sh.publish();
            self.sh.rounds.fetch_add(1, Ordering::Release);
        }
    }

    /// Drops stale entries from the fault-order queue once it is over half full: pages no longer
    /// resident (the program dropped them, or an earlier entry of the same page evicted it) and
    /// second entries of one page. A program that frees and reallocates memory under its budget
    /// (sqlite3's page cache) otherwise fills the queue with such entries while the evictor,
    /// below its target, pops none, and every fault then waits for room that never comes.
    /// Entries of resident pages keep their order. Re-pushing cannot fail for long: the entries
    /// kept and those faulting threads push meanwhile are resident pages, at most two entries
    /// each, fewer than the queue holds.
    ///
    /// The evictor never waits for room here: faulting threads may fill the room its pops
    /// make while it works (and wait themselves for room only the evictor makes), so a kept
    /// entry that does not fit goes to [`Evictor::spill`], where it keeps its place in front.
    fn compact_fifo(&mut self) {
        let sh = self.sh.clone();
        let n = sh.fifo.len();
        if n + self.spill.len() <= sh.fifo.capacity() / 2 {
            return;
        }
        let mut seen = std::collections::HashSet::with_capacity(n + self.spill.len());
        let t = sh.regions.lock();
        let mut dropped = 0u64;
        let live = |e: u64| {
            t.lookup(e)
                .is_some_and(|(st, p)| p < st.shadow.len() && st.shadow.get(p) == Place::Resident)
        };
        let spilled = std::mem::take(&mut self.spill);
        let mut kept: VecDeque<u64> = VecDeque::with_capacity(spilled.len());
        for e in spilled {
            if live(e) && seen.insert(e) {
                kept.push_back(e);
            } else {
                dropped += 1;
            }
        }
        for _ in 0..n {
            let Some(e) = sh.fifo.pop() else { break };
            if !(live(e) && seen.insert(e)) {
                dropped += 1;
                continue;
            }
            // Entries ahead of it that are still spilled stay ahead: it joins them.
            if !kept.is_empty() {
                kept.push_back(e);
            } else if let Err(e) = sh.fifo.push(e) {
                kept.push_back(e);
            }
        }
        drop(t);
        // Older than everything in the queue now: they go in front, as the spill.
        self.spill = kept;
        sh.c.fifo_stale.fetch_add(dropped, Ordering::Relaxed);
    }

    /// The oldest fault-order entry: the spill's first, then the queue's.
    fn next_entry(&mut self) -> Option<u64> {
        self.spill.pop_front().or_else(|| self.sh.fifo.pop())
    }

    /// Puts an entry back at the end of fault order; when the queue is full (faulting threads
    /// filled it) it waits in the spill instead of blocking the evictor, which alone makes room.
    fn requeue(&mut self, e: u64) {
        if let Err(e) = self.sh.fifo.push(e) {
            self.spill.push_back(e);
        }
    }

    fn scratch_page(&self, i: usize) -> usize {
        self.scratch + i * PAGE_SIZE
    }

    /// Takes up to one batch of victims out of DRAM; returns how many left it.
    fn evict_batch(&mut self) -> usize {
        let sh = self.sh.clone();
        let free =
            |sh: &Shared| sh.buffer.as_ref().map_or(0, |b| b.slots.free()) + sh.swap.slots.free();
        let mut room = free(&sh);
        // Full, but kept copies hold slots: take some back (those pages are written again).
        while room < sh.batch && self.reclaim(false) {
            room = free(&sh);
        }
        // At most S(t) pages a round (the paper's replacement of SWAP_CLUSTER_MAX), minus the
        // swap reads in flight (reads first), and no more than DRAM needs.
        let queue = sh.queue_now();
        let reads = sh.inflight_now();
        let need = sh.resident().saturating_sub(sh.target_pages) + sh.batch;
        let want = queue
            .saturating_sub(reads)
            .max(1)
            .min(need)
            .min(self.scratch_pages)
            .min(room);
        if want == 0 {
            sh.c.swap_full.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        self.victims.clear();
        {
            let t = sh.regions.lock();
            // One pass over the entries there are now at most: pinned pages go back in, and
            // when every resident page is pinned there is nothing to take (the faults wait).
            let mut left = sh.fifo.len() + self.spill.len();
            while self.victims.len() < want && left > 0 {
                left -= 1;
                let Some(e) = self.next_entry() else { break };
                if let Some((st, p)) = t.lookup(e) {
                    if p < st.shadow.len() && st.shadow.cas(p, Place::Resident, Place::Evicting) {
                        if st.shadow.pinned_after_claim(p) {
                            // A system call is using it: it stays, and comes round again.
                            st.shadow.set(p, Place::Resident);
                            self.requeue(e);
                            sh.c.pinned_skips.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        self.victims.push((st, p));
                    }
                }
            }
        }
        if self.victims.is_empty() {
            return 0;
        }
        let t0 = now_ns();
        // Move each victim into its scratch page.
        let victims = std::mem::take(&mut self.victims);
        let mut moved: Vec<usize> = Vec::with_capacity(victims.len());
        let mut out = 0usize;
        let mut dropped = 0usize;
        for (i, (st, p)) in victims.iter().enumerate() {
            match self
                .uffd
                .move_pages(self.scratch_page(i), st.page_addr(*p), PAGE_SIZE, 0)
            {
                Ok(n) if n == PAGE_SIZE => moved.push(i),
                Err(libc::ENOENT) => {
                    // Not present: the program dropped it and the event is still in flight.
                    if let Some(k) = st.shadow.take_kept(*p) {
                        sh.swap.slots.release(k);
                    }
                    st.shadow.set(*p, Place::Zero);
                    sh.resident.fetch_sub(1, Ordering::AcqRel);
                    sh.c.dropped.fetch_add(1, Ordering::Relaxed);
                    dropped += 1;
                }
                _ => {
                    // Shared with another mapping (EBUSY) or refused: it stays.
                    st.shadow.set(*p, Place::Resident);
                    self.requeue(st.key | *p as u64);
                    sh.c.evict_busy.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Destinations: the buffer first, then the swap file.
        let mut need_ssd: Vec<usize> = Vec::new();
        for &i in &moved {
            let (st, p) = &victims[i];
            // Clean if it still hashes to what its kept swap slot holds; a dirty page's kept
            // slot is stale and freed.
            // SAFETY: the scratch page holds the moved page until the batch ends.
            let bytes =
                unsafe { std::slice::from_raw_parts(self.scratch_page(i) as *const u8, PAGE_SIZE) };
            let h = xxhash_rust::xxh3::xxh3_128(bytes);
            let clean = st.shadow.kept(*p).is_some() && st.shadow.sum(*p) == h;
            st.shadow.set_sum(*p, h);
            if !clean {
                if let Some(k) = st.shadow.take_kept(*p) {
                    sh.swap.slots.release(k);
                }
            }
            // With control, NS tenants page out to the buffer and the others to the regular
            // zone, except while more than half the buffer is free: that spare half takes
            // anyone's pages (destaged first, best effort before bounded) instead of idling.
            // Without control, every page goes through the buffer.
            let spare = sh
                .buffer
                .as_ref()
                .is_some_and(|b| b.slots.free() > b.capacity() / 2);
            let via_buffer = !sh.control.enabled || st.ns.load(Ordering::Relaxed) || spare;
            let slot = if via_buffer {
                sh.buffer.as_ref().and_then(|b| b.slots.alloc())
            } else {
                None
            };
            match slot {
                Some(s) => {
                    let b = sh.buffer.as_ref().expect("slot from the buffer");
                    // SAFETY: the scratch page holds the moved page; slot s is ours.
                    unsafe {
                        tiermem_media::nt_copy(
                            b.slot_ptr(s),
                            self.scratch_page(i) as *const u8,
                            PAGE_SIZE,
                        )
                    };
                    b.pool.charge_write(PAGE_SIZE as u64);
                    st.shadow.set(*p, Place::Buffer(s));
                    let bound = st.bound_ns.load(Ordering::Relaxed);
                    self.add_to_group(bound, st.key | *p as u64, s);
                    sh.c.pageouts_buffer.fetch_add(1, Ordering::Relaxed);
                    sh.h_pageout.record(now_ns().saturating_sub(t0));
                    out += 1;
                }
                None if clean => {
                    // Its bytes are already in its kept slot: no write.
                    let k = st.shadow.take_kept(*p).expect("a clean page keeps a slot");
                    st.shadow.set(*p, Place::Ssd(k));
                    sh.c.pageouts_clean.fetch_add(1, Ordering::Relaxed);
                    sh.h_pageout.record(now_ns().saturating_sub(t0));
                    out += 1;
                }
                None => need_ssd.push(i),
            }
        }
        // Swap slots: whole clusters while a run is long enough to use one (consecutive slots
        // make one write of the run), single slots for the rest.
        let mut to_ssd: Vec<(usize, u64)> = Vec::with_capacity(need_ssd.len());
        let mut k = 0;
        while k < need_ssd.len() {
            let left = need_ssd.len() - k;
            let cluster = if left >= DESTAGE_PIECE {
                sh.swap
                    .slots
                    .alloc_cluster()
                    .or_else(|| self.reclaim(true).then(|| sh.swap.slots.alloc_cluster())?)
            } else {
                None
            };
            if let Some(c) = cluster {
                let n = left.min(GROUP_PAGES);
                for j in 0..GROUP_PAGES {
                    if j < n {
                        to_ssd.push((need_ssd[k + j], c + j as u64));
                    } else {
                        sh.swap.slots.release(c + j as u64);
                    }
                }
                k += n;
                continue;
            }
            let single = sh
                .swap
                .slots
                .alloc()
                .or_else(|| self.reclaim(false).then(|| sh.swap.slots.alloc()).flatten());
            match single {
                Some(s) => to_ssd.push((need_ssd[k], s)),
                None => {
                    let (st, p) = &victims[need_ssd[k]];
                    self.put_back(st, *p, need_ssd[k]);
                }
            }
            k += 1;
        }
        if !to_ssd.is_empty() {
            let ok = self.write_runs(&to_ssd);
            for (k, &(i, s)) in to_ssd.iter().enumerate() {
                let (st, p) = &victims[i];
                if ok[k] {
                    sh.swap.owner[s as usize].store(st.key | *p as u64, Ordering::Relaxed);
                    st.shadow.set(*p, Place::Ssd(s));
                    sh.c.pageouts_ssd.fetch_add(1, Ordering::Relaxed);
                    sh.h_pageout.record(now_ns().saturating_sub(t0));
                    out += 1;
                } else {
                    sh.c.io_errors.fetch_add(1, Ordering::Relaxed);
                    sh.swap.slots.release(s);
                    self.put_back(st, *p, i);
                }
            }
        }
        // Free the scratch pages (own userfaultfd without events: no wait).
        // SAFETY: our scratch mapping.
        unsafe {
            libc::madvise(
                self.scratch as *mut libc::c_void,
                victims.len() * PAGE_SIZE,
                libc::MADV_DONTNEED,
            )
        };
        sh.resident.fetch_sub(out, Ordering::AcqRel);
        self.victims = victims;
        self.victims.clear();
        out + dropped
    }

    /// One control window: Algorithm 1 and the monitor decide the queue size and which tenants
    /// the buffer serves; tenants over their bound get their swap pages prefetched.
    fn control_step(&mut self) {
        if self.sh.seg.is_some() {
            return self.pool_step();
        }
        let sh = self.sh.clone();
        self.window_start = std::time::Instant::now();
        let regions: Vec<Arc<RegionState>> =
            sh.regions.lock().slots.iter().flatten().cloned().collect();
        let mut tenants = Vec::new();
        let mut live = HashMap::new();
        for r in &regions {
            let now = r.hist.snapshot();
            let bound = r.bound_ns.load(Ordering::Relaxed);
            if bound != u64::MAX {
                let pct = f64::from_bits(r.pct.load(Ordering::Relaxed));
                let observed = match self.last_tenant.get(&r.key) {
                    Some(old) => now.since(old).quantile(pct),
                    None => now.quantile(pct),
                };
                tenants.push(TenantWindow {
                    id: r.key,
                    bound_ns: bound,
                    observed_ns: observed,
                });
            }
            live.insert(r.key, now);
        }
        self.last_tenant = live;
        let ssd_now = sh.h_ssd.snapshot();
        let ssd_tail = ssd_now.since(&self.last_ssd).quantile(0.99);
        self.last_ssd = ssd_now;
        let d = self.controller.step(&tenants, ssd_tail);
        sh.queue.store(d.queue, Ordering::Relaxed);
        for r in &regions {
            r.ns.store(d.ns.contains(&r.key), Ordering::Relaxed);
        }
        sh.c.ns_tenants.store(d.ns.len(), Ordering::Relaxed);
        sh.c.last_ssd_tail_ns
            .store(ssd_tail.unwrap_or(0), Ordering::Relaxed);
        sh.c.windows.fetch_add(1, Ordering::Relaxed);
        if self.trace {
            eprintln!(
                "tiermem-pager: window {}: ssd p99 {:?} µs, queue {}, tenants {:?}, ns {}, over {}, \
                 inflight reads {}, buffer free {:?}",
                sh.c.windows.load(Ordering::Relaxed),
                ssd_tail.map(|v| v / 1000),
                d.queue,
                tenants
                    .iter()
                    .map(|t| (t.bound_ns / 1000, t.observed_ns.map(|o| o / 1000)))
                    .collect::<Vec<_>>(),
                d.ns.len(),
                d.over.len(),
                sh.inflight_now(),
                sh.buffer.as_ref().map(|b| b.slots.free()),
            );
        }
        // The monitor: a tenant over its bound in this window is served by the buffer in the
        // next one, its swap pages brought there ahead of its faults.
        let over: Vec<Arc<RegionState>> = regions
            .into_iter()
            .filter(|r| d.over.contains(&r.key))
            .collect();
        self.queue_prefetch(&over);
    }

    /// A window in a shared pool: the process is one tenant. It runs the pool's controller
    /// when it leads (no daemon, or the daemon died), then follows the pool: its bound (which
    /// `tiermem pager set-bound` may have changed), its NS flag, and a prefetch when the
    /// monitor caught it over its bound.
    fn pool_step(&mut self) {
        let sh = self.sh.clone();
        let link = sh.seg.as_ref().expect("a shared pool");
        self.window_start = std::time::Instant::now();
        if link.pool.try_lead() {
            let ctl = self
                .pool_ctl
                .get_or_insert_with(|| crate::segment::PoolController::new(&link.pool));
            let w = ctl.window(&link.pool);
            if self.trace {
                eprintln!(
                    "tiermem-pager: pool window (leader {}): {w:?}",
                    std::process::id()
                );
            }
        } else {
            self.pool_ctl = None;
        }
        let t = link.pool.tenant(link.idx);
        let bound = t.bound_ns.load(Ordering::Acquire);
        let pct = t.pct_bits.load(Ordering::Relaxed);
        let ns = t.ns.load(Ordering::Relaxed) != 0;
        let regions: Vec<Arc<RegionState>> =
            sh.regions.lock().slots.iter().flatten().cloned().collect();
        for r in &regions {
            r.bound_ns.store(bound, Ordering::Relaxed);
            r.pct.store(pct, Ordering::Relaxed);
            r.ns.store(ns && bound != u64::MAX, Ordering::Relaxed);
        }
        sh.c.ns_tenants
            .store((ns && bound != u64::MAX) as usize, Ordering::Relaxed);
        sh.c.windows.fetch_add(1, Ordering::Relaxed);
        let seq = t.over_seq.load(Ordering::Acquire);
        if seq != self.over_seq {
            self.over_seq = seq;
            self.queue_prefetch(&regions);
        }
    }

    /// Queues the swap clusters of `regions`' pages for prefetch into the buffer (at most 256
    /// per region a window).
    fn queue_prefetch(&mut self, regions: &[Arc<RegionState>]) {
        let sh = self.sh.clone();
        for r in regions {
            let mut queued = 0;
            let mut last = u64::MAX;
            for p in 0..r.shadow.len() {
                if let Place::Ssd(s) = r.shadow.get(p) {
                    let c = s / crate::slots::CLUSTER as u64;
                    if c != last && sh.prefetch_q.push(c).is_ok() {
                        last = c;
                        queued += 1;
                    }
                    if queued >= 256 {
                        break;
                    }
                }
            }
        }
    }

    /// Brings queued swap clusters into the buffer: one read per cluster, then each of its
    /// pages that still lives there and belongs to an NS tenant moves to a buffer slot.
    fn prefetch(&mut self) {
        let sh = self.sh.clone();
        let Some(b) = sh.buffer.as_ref() else {
            while sh.prefetch_q.pop().is_some() {}
            return;
        };
        // A few clusters a round: each is a 256 KiB read the evictor waits for, and page-outs
        // must not starve behind a monitor's whole queue (up to 256 clusters a window).
        for _ in 0..PREFETCH_PER_ROUND {
            if sh.inflight_now() >= sh.queue_now() {
                return;
            }
            let Some(c) = sh.prefetch_q.pop() else {
                return;
            };
            // Only into room destaging would not have to make again: prefetching more than the
            // buffer holds spare cycles pages between buffer and swap file (measured: 630,000
            // pages prefetched and destaged again in a 10 s quick run).
            if b.slots.free() < 2 * buffer_low(b) {
                while sh.prefetch_q.pop().is_some() {}
                return;
            }
            let first = c * crate::slots::CLUSTER as u64;
            let n = (crate::slots::CLUSTER as u64).min(sh.swap.slots.capacity() as u64 - first);
            let cand: Vec<(Arc<RegionState>, usize, u64)> = {
                let t = sh.regions.lock();
                (first..first + n)
                    .filter_map(|s| {
                        let key = sh.swap.owner[s as usize].load(Ordering::Relaxed);
                        let (st, p) = t.lookup(key)?;
                        (p < st.shadow.len()
                            && st.ns.load(Ordering::Relaxed)
                            && st.shadow.get(p) == Place::Ssd(s))
                        .then_some((st, p, s))
                    })
                    .collect()
            };
            if cand.is_empty() {
                continue;
            }
            let len = n as usize * PAGE_SIZE;
            if sh
                .swap
                .dev
                .read_at(first * PAGE_SIZE as u64, &mut self.staging[..len])
                .is_err()
            {
                sh.c.io_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            for (st, p, s) in cand {
                let Some(bs) = b.slots.alloc() else { break };
                let k = (s - first) as usize;
                // SAFETY: bs is ours; the staging buffer holds the cluster.
                unsafe {
                    tiermem_media::nt_copy(
                        b.slot_ptr(bs),
                        self.staging[k * PAGE_SIZE..].as_ptr(),
                        PAGE_SIZE,
                    )
                };
                // Claimed (Evicting) while its kept slot is recorded.
                if st.shadow.cas(p, Place::Ssd(s), Place::Evicting) {
                    st.shadow.set_kept(p, s);
                    st.shadow.set(p, Place::Buffer(bs));
                    let bound = st.bound_ns.load(Ordering::Relaxed);
                    self.add_to_group(bound, st.key | p as u64, bs);
                    sh.c.prefetched.fetch_add(1, Ordering::Relaxed);
                } else {
                    b.slots.release(bs);
                }
            }
            b.pool.charge_write((n as usize * PAGE_SIZE) as u64);
        }
    }

    /// Writes scratch pages to swap slots (`(scratch index, slot)` pairs): runs where both
    /// are consecutive become one request of up to a group's size, and at most
    /// [`WRITE_DEPTH`] requests are in flight at once, so a page-in's read waits behind a few
    /// writes, not a whole round's. Returns, per pair, whether its page was written.
    fn write_runs(&self, pairs: &[(usize, u64)]) -> Vec<bool> {
        let mut runs: Vec<(usize, usize)> = Vec::new(); // (first pair, length)
        for (k, &(i, s)) in pairs.iter().enumerate() {
            match runs.last_mut() {
                Some((f, n))
                    if *n < GROUP_PAGES
                        && pairs[*f + *n - 1].0 + 1 == i
                        && pairs[*f + *n - 1].1 + 1 == s =>
                {
                    *n += 1
                }
                _ => runs.push((k, 1)),
            }
        }
        let mut ok = vec![false; pairs.len()];
        for chunk in runs.chunks(WRITE_DEPTH) {
            let mut ops: Vec<IoOp<'_>> = chunk
                .iter()
                .map(|&(f, n)| {
                    let (i, s) = pairs[f];
                    // SAFETY: the scratch pages i..i+n hold moved pages until the batch ends.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(self.scratch_page(i) as *const u8, n * PAGE_SIZE)
                    };
                    IoOp::write(s * PAGE_SIZE as u64, bytes)
                })
                .collect();
            if let Ok(r) = self.sh.swap.dev.submit_batch(&mut ops) {
                for (&(f, n), res) in chunk.iter().zip(r) {
                    if matches!(res, Ok(b) if b == n * PAGE_SIZE) {
                        ok[f..f + n].iter_mut().for_each(|x| *x = true);
                    }
                }
            }
        }
        ok
    }

    /// Frees swap space held by kept copies (pages resident or in the buffer whose swap slot the
    /// pager kept, like the kernel's swap cache): their slots are stolen, and those pages are
    /// written again when they leave. With `whole`, frees one cluster whose used slots are all
    /// kept copies (for a contiguous write); without, every kept slot of the first cluster that
    /// has any. Looks at up to 512 clusters from where it stopped last; true if it freed what
    /// was asked.
    fn reclaim(&mut self, whole: bool) -> bool {
        let sh = self.sh.clone();
        let slots = &sh.swap.slots;
        let words = slots.words();
        let t = sh.regions.lock();
        for _ in 0..words.min(512) {
            let w = self.reclaim_cursor % words;
            self.reclaim_cursor = (w + 1) % words;
            if whole && slots.capacity() - w * 64 < 64 {
                continue;
            }
            let used = slots.used_mask(w);
            if whole && used == 0 {
                return true;
            }
            let mut kept = Vec::with_capacity(used.count_ones() as usize);
            let mut bits = used;
            while bits != 0 {
                let s = (w * 64) as u64 + bits.trailing_zeros() as u64;
                bits &= bits - 1;
                let key = sh.swap.owner[s as usize].load(Ordering::Relaxed);
                // For a whole cluster, only copies of resident pages: a buffer page's copy makes
                // its destage free, and stealing it to destage another group trades one write
                // for another.
                match t.lookup(key) {
                    Some((st, p))
                        if p < st.shadow.len()
                            && st.shadow.kept(p) == Some(s)
                            && (!whole || st.shadow.get(p) == Place::Resident) =>
                    {
                        kept.push((st, p, s))
                    }
                    _ if whole => break,
                    _ => {}
                }
            }
            if kept.is_empty() || (whole && kept.len() != used.count_ones() as usize) {
                continue;
            }
            let mut freed = 0;
            for (st, p, s) in kept {
                if st.shadow.steal_kept(p, s) {
                    slots.release(s);
                    freed += 1;
                }
            }
            sh.c.kept_reclaimed.fetch_add(freed, Ordering::Relaxed);
            if (whole && slots.used_mask(w) == 0) || (!whole && freed > 0) {
                return true;
            }
        }
        false
    }

    /// A moved-out page that found no place (swap full, write failed) goes back into its
    /// region, copied from its scratch page, and stays resident.
    fn put_back(&mut self, st: &RegionState, p: usize, i: usize) {
        // SAFETY: the scratch page holds the moved page.
        let page =
            unsafe { std::slice::from_raw_parts(self.scratch_page(i) as *const u8, PAGE_SIZE) };
        let handle = st.handle.get().and_then(std::sync::Weak::upgrade);
        // Without a handle the region is being unmapped: its bytes no longer matter.
        if let Some(h) = handle {
            if h.install(p * PAGE_SIZE, page).is_err() {
                self.sh.c.io_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        st.shadow.set(p, Place::Resident);
        self.requeue(st.key | p as u64);
        self.sh.c.swap_full.fetch_add(1, Ordering::Relaxed);
    }

    fn add_to_group(&mut self, bound: u64, key: u64, slot: u64) {
        let g = self.open.entry(bound).or_insert_with(|| Group {
            entries: Vec::with_capacity(GROUP_PAGES),
        });
        g.entries.push(Entry { key, slot });
        if g.entries.len() == GROUP_PAGES {
            let full = std::mem::replace(
                g,
                Group {
                    entries: Vec::with_capacity(GROUP_PAGES),
                },
            );
            self.closed.entry(bound).or_default().push_back(full);
        }
    }

    /// The next group to destage: the oldest full group of the highest bound, else the largest
    /// open group.
    fn take_group(&mut self) -> Option<Group> {
        if let Some(mut e) = self.closed.last_entry() {
            let g = e.get_mut().pop_front();
            if e.get().is_empty() {
                e.remove();
            }
            return g;
        }
        let bound = self
            .open
            .iter()
            .filter(|(_, g)| !g.entries.is_empty())
            .max_by_key(|(b, g)| (g.entries.len(), **b))
            .map(|(b, _)| *b)?;
        self.open.remove(&bound)
    }

    /// Destages groups while the buffer has fewer free slots than its low mark.
    fn destage_if_needed(&mut self) {
        let sh = self.sh.clone();
        let Some(b) = sh.buffer.as_ref() else {
            return;
        };
        let mut low = buffer_low(b);
        if let Some(l) = &sh.seg {
            // A shared buffer: highest bound first, across processes. While a tenant with a
            // looser bound holds buffer groups, this one destages only when the buffer is
            // nearly full (they destage first); a tenant with none looser, while any tenant is
            // NS, keeps room for its prefetch (which only fills room above twice the mark).
            let t = l.pool.tenant(l.idx);
            let mine = t.bound_ns.load(Ordering::Relaxed);
            if l.pool.looser_holds_buffer(l.idx, mine) {
                low /= 4;
            } else if l.pool.any_ns() {
                low = (3 * low).min(b.capacity() / 2);
            }
        }
        while b.slots.free() < low {
            if !self.destage_one() {
                break;
            }
        }
    }

    /// Writes one group's live pages to consecutive swap slots; false when there is nothing to
    /// destage or no swap space.
    fn destage_one(&mut self) -> bool {
        let sh = self.sh.clone();
        let b = sh.buffer.as_ref().expect("destage needs a buffer");
        let Some(g) = self.take_group() else {
            return false;
        };
        // The pages still in the buffer at the slot the group recorded.
        let live: Vec<(Arc<RegionState>, usize, u64)> = {
            let t = sh.regions.lock();
            g.entries
                .iter()
                .filter_map(|e| {
                    let (st, p) = t.lookup(e.key)?;
                    (p < st.shadow.len() && st.shadow.get(p) == Place::Buffer(e.slot))
                        .then_some((st, p, e.slot))
                })
                .collect()
        };
        // Pages whose kept swap slot still holds their bytes go back to it with no write.
        let live: Vec<(Arc<RegionState>, usize, u64)> = live
            .into_iter()
            .filter(|(st, p, slot)| {
                if st.shadow.kept(*p).is_none() {
                    return true;
                }
                if st.shadow.cas(*p, Place::Buffer(*slot), Place::Evicting) {
                    let k = st
                        .shadow
                        .take_kept(*p)
                        .expect("checked above; only we change it");
                    st.shadow.set(*p, Place::Ssd(k));
                    b.slots.release(*slot);
                    sh.c.destaged_clean.fetch_add(1, Ordering::Relaxed);
                }
                false
            })
            .collect();
        if live.is_empty() {
            return true;
        }
        let n = live.len();
        let cluster = sh
            .swap
            .slots
            .alloc_cluster()
            .or_else(|| self.reclaim(true).then(|| sh.swap.slots.alloc_cluster())?);
        let (first, contiguous) = match cluster {
            Some(c) => (c, true),
            None => match sh
                .swap
                .slots
                .alloc()
                .or_else(|| self.reclaim(false).then(|| sh.swap.slots.alloc()).flatten())
            {
                Some(s) => (s, false),
                None => {
                    self.closed.entry(u64::MAX).or_default().push_front(g);
                    sh.c.swap_full.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            },
        };
        let mut slots = Vec::with_capacity(n);
        if contiguous {
            slots.extend(first..first + n as u64);
            for s in first + n as u64..first + GROUP_PAGES as u64 {
                sh.swap.slots.release(s);
            }
        } else {
            slots.push(first);
            while slots.len() < n {
                match sh.swap.slots.alloc() {
                    Some(s) => slots.push(s),
                    None => break,
                }
            }
        }
        let m = slots.len();
        for (k, (_, _, slot)) in live.iter().take(m).enumerate() {
            // SAFETY: slot is this page's buffer copy (or, if it was faulted in meanwhile, a
            // slot no one else can be given before this function returns).
            let src = unsafe { std::slice::from_raw_parts(b.slot_ptr(*slot), PAGE_SIZE) };
            self.staging[k * PAGE_SIZE..(k + 1) * PAGE_SIZE].copy_from_slice(src);
        }
        b.pool.charge_read((m * PAGE_SIZE) as u64);
        let ok: Vec<bool> = if contiguous {
            // In pieces of DESTAGE_PIECE pages, one after the other: a page-in's read then
            // waits behind one piece, not the whole group.
            let mut ok = vec![false; m];
            for c in (0..m).step_by(DESTAGE_PIECE) {
                let e = (c + DESTAGE_PIECE).min(m);
                let r = sh.swap.dev.write_at(
                    (first + c as u64) * PAGE_SIZE as u64,
                    &self.staging[c * PAGE_SIZE..e * PAGE_SIZE],
                );
                ok[c..e].iter_mut().for_each(|x| *x = r.is_ok());
            }
            ok
        } else {
            // Scattered slots: single-page writes, at most WRITE_DEPTH in flight.
            let mut ok = Vec::with_capacity(m);
            for (c, chunk) in slots.chunks(WRITE_DEPTH).enumerate() {
                let mut ops: Vec<IoOp<'_>> = chunk
                    .iter()
                    .enumerate()
                    .map(|(j, &s)| {
                        let k = c * WRITE_DEPTH + j;
                        IoOp::write(
                            s * PAGE_SIZE as u64,
                            &self.staging[k * PAGE_SIZE..(k + 1) * PAGE_SIZE],
                        )
                    })
                    .collect();
                match sh.swap.dev.submit_batch(&mut ops) {
                    Ok(r) => ok.extend(r.iter().map(|x| matches!(x, Ok(n) if *n == PAGE_SIZE))),
                    Err(_) => ok.resize(ok.len() + chunk.len(), false),
                }
            }
            ok
        };
        let mut rest = Group {
            entries: Vec::new(),
        };
        for (k, (st, p, slot)) in live.iter().enumerate() {
            if k >= m || !ok[k] {
                if k < m {
                    sh.c.io_errors.fetch_add(1, Ordering::Relaxed);
                    sh.swap.slots.release(slots[k]);
                }
                rest.entries.push(Entry {
                    key: st.key | *p as u64,
                    slot: *slot,
                });
                continue;
            }
            sh.swap.owner[slots[k] as usize].store(st.key | *p as u64, Ordering::Relaxed);
            if st
                .shadow
                .cas(*p, Place::Buffer(*slot), Place::Ssd(slots[k]))
            {
                b.slots.release(*slot);
                sh.c.destaged.fetch_add(1, Ordering::Relaxed);
            } else {
                sh.swap.slots.release(slots[k]);
            }
        }
        if !rest.entries.is_empty() {
            self.closed.entry(u64::MAX).or_default().push_front(rest);
            return rest_progress(m, &ok);
        }
        true
    }
}

/// Free buffer slots below which groups are destaged: an eighth of the buffer, at least two
/// groups, at most half.
fn buffer_low(b: &crate::zones::Buffer) -> usize {
    (2 * GROUP_PAGES)
        .max(b.capacity() / 8)
        .min(b.capacity() / 2)
}

/// Whether a partly failed destage still moved something (so the caller may go on).
fn rest_progress(m: usize, ok: &[bool]) -> bool {
    m > 0 && ok.iter().any(|&x| x)
}

impl Drop for Evictor {
    fn drop(&mut self) {
        // SAFETY: our scratch mapping.
        unsafe {
            libc::munmap(
                self.scratch as *mut libc::c_void,
                self.scratch_pages * PAGE_SIZE,
            )
        };
    }
}
