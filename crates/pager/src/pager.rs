//! The pager: options, the state its regions, faults and evictor share, and its counters.

use crate::control::ControlParams;
use crate::error::{Error, Result};
use crate::evict::Evictor;
use crate::hist::{AtomicHist, HistSnapshot};
use crate::region::{PagedRegion, RegionState};
use crate::segment::{PagerPool, Tenant};
use crate::zones::{Buffer, Swap};
use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tiermem_fault::PAGE_SIZE;
use tiermem_media::DelayModel;

/// Pages in a latency group (the paper's 64).
pub const GROUP_PAGES: usize = 64;

/// How a [`Pager`] is set up.
#[derive(Clone, Debug)]
pub struct PagerOptions {
    /// DRAM budget in bytes: pages of the pager's regions resident at once, at least one
    /// latency group (64 pages).
    pub budget: u64,
    /// Size of the NVM paging buffer in bytes; 0 pages straight to SSD (the `pager-lru-ssd`
    /// configuration).
    pub nvm: u64,
    /// Delay model of the NVM pool (default: `nvmm`, read +100 ns, write +150 ns).
    pub nvm_delay: DelayModel,
    /// Where the pool file goes (default: the media layer's directory, tmpfs).
    pub nvm_dir: Option<PathBuf>,
    /// The swap file (regular zone) path; its directory must be on a disk (default:
    /// `/var/tmp/tiermem-pager-<pid>-<n>.swap`).
    pub swap_path: Option<PathBuf>,
    /// Swap file size in bytes (default: 4 × the budget + 64 MiB).
    pub swap_size: Option<u64>,
    /// Delay model added to the swap file's real I/O (default: none).
    pub swap_delay: Option<DelayModel>,
    /// Hard cap above the budget, in pages: a fault waits for the evictor while DRAM holds
    /// budget + this many pages (default 32, Linux's SWAP_CLUSTER_MAX).
    pub batch: usize,
    /// Latency control (Eq. 1, Algorithm 1, the monitor).
    pub control: ControlParams,
    /// A pager pool shared with other processes (`tiermem pager daemon`): its buffer, swap
    /// file and control parameters are used instead of `nvm`, `nvm_*`, `swap_*` and `control`,
    /// and the process is one tenant of its controller (default: a pager of its own).
    pub pool: Option<PathBuf>,
}

impl PagerOptions {
    /// Defaults with a DRAM budget of `budget` bytes and an NVM buffer of `nvm` bytes.
    pub fn new(budget: u64, nvm: u64) -> PagerOptions {
        PagerOptions {
            budget,
            nvm,
            nvm_delay: DelayModel::NVMM,
            nvm_dir: None,
            swap_path: None,
            swap_size: None,
            swap_delay: None,
            batch: 32,
            control: ControlParams::default(),
            pool: None,
        }
    }

    /// Checks the options without creating anything (what [`Pager::new`] checks first): a
    /// budget of at least one latency group and at most the memory available, a buffer of 0
    /// or at least one group, sane control parameters, a batch of at most half the budget.
    pub fn validate(&self) -> Result<()> {
        let page = PAGE_SIZE as u64;
        let budget_pages = (self.budget / page) as usize;
        if budget_pages < GROUP_PAGES {
            return Err(Error::InvalidOption(format!(
                "the DRAM budget of {} bytes is below one latency group ({} pages, {} bytes)",
                self.budget,
                GROUP_PAGES,
                GROUP_PAGES as u64 * page
            )));
        }
        if let Some(avail) = tiermem_media::mem_available() {
            if self.budget > avail {
                return Err(Error::BudgetAboveMemory {
                    budget: self.budget,
                    available: avail,
                });
            }
        }
        if self.pool.is_none() && self.nvm != 0 && self.nvm / page < GROUP_PAGES as u64 {
            return Err(Error::InvalidOption(format!(
                "an NVM buffer of {} bytes is below one latency group ({} bytes); use 0 for none",
                self.nvm,
                GROUP_PAGES as u64 * page
            )));
        }
        let c = &self.control;
        if !(c.gamma > 0.0 && c.gamma <= 1.0)
            || c.s_min == 0
            || c.s_max < c.s_min
            || c.fixed_queue == 0
            || c.window.is_zero()
        {
            return Err(Error::InvalidOption(format!(
                "control parameters need 0 < γ ≤ 1, 1 ≤ S_min ≤ S_max, a queue of at least 1 \
                 and a window above 0: {c:?}"
            )));
        }
        if self.batch == 0 || self.batch > budget_pages / 2 {
            return Err(Error::InvalidOption(format!(
                "the eviction batch must be 1..={} pages (half the budget), not {}",
                budget_pages / 2,
                self.batch
            )));
        }
        Ok(())
    }
}

/// Counters of a pager (monotonic, since it started).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) zero_fills: AtomicU64,
    pub(crate) pageins_buffer: AtomicU64,
    pub(crate) pageins_ssd: AtomicU64,
    pub(crate) pageouts_buffer: AtomicU64,
    pub(crate) pageouts_ssd: AtomicU64,
    pub(crate) destaged: AtomicU64,
    pub(crate) pageouts_clean: AtomicU64,
    pub(crate) fifo_stale: AtomicU64,
    pub(crate) destaged_clean: AtomicU64,
    pub(crate) kept_reclaimed: AtomicU64,
    pub(crate) pinned_skips: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) over_budget_waits: AtomicU64,
    pub(crate) swap_full: AtomicU64,
    pub(crate) evict_busy: AtomicU64,
    pub(crate) io_errors: AtomicU64,
    pub(crate) max_resident: AtomicUsize,
    pub(crate) prefetched: AtomicU64,
    pub(crate) windows: AtomicU64,
    pub(crate) ns_tenants: AtomicUsize,
    pub(crate) last_ssd_tail_ns: AtomicU64,
}

/// A snapshot of a pager's counters and latencies.
#[derive(Clone, Debug)]
pub struct PagerStats {
    /// Pages in DRAM now.
    pub resident_pages: usize,
    /// Most pages ever in DRAM at once.
    pub max_resident_pages: usize,
    /// The budget in pages.
    pub budget_pages: usize,
    /// Buffer slots in use / in all.
    pub buffer_used: usize,
    /// Buffer slots.
    pub buffer_slots: usize,
    /// Swap slots in use.
    pub swap_used: usize,
    /// Swap slots.
    pub swap_slots: usize,
    /// First touches filled with zeros.
    pub zero_fills: u64,
    /// Page-ins served from the NVM buffer (one copy).
    pub pageins_buffer: u64,
    /// Page-ins read from the swap file.
    pub pageins_ssd: u64,
    /// Page-outs into the buffer.
    pub pageouts_buffer: u64,
    /// Page-outs straight to the swap file.
    pub pageouts_ssd: u64,
    /// Buffer pages written to the swap file by destaging.
    pub destaged: u64,
    /// Page-outs that wrote nothing: the page was clean and its swap slot still held it.
    pub pageouts_clean: u64,
    /// Buffer pages destaged with no write, for the same reason.
    pub destaged_clean: u64,
    /// Kept swap copies given up to make room for page-outs (those pages are written again).
    pub kept_reclaimed: u64,
    /// Victims passed over because they were pinned ([`PagedRegion::pin`]).
    pub pinned_skips: u64,
    /// Stale fault-order entries dropped (pages freed or already evicted; see the evictor).
    pub fifo_stale: u64,
    /// Pages the program dropped (`MADV_DONTNEED`) or unmapped.
    pub dropped: u64,
    /// Faults that waited for the evictor because DRAM was over budget.
    pub over_budget_waits: u64,
    /// Evictions given up because the buffer and the swap file were full.
    pub swap_full: u64,
    /// Evictions the kernel refused (a page shared with another mapping).
    pub evict_busy: u64,
    /// Failed device reads or writes.
    pub io_errors: u64,
    /// Page-in latency from the buffer (fault to resolved).
    pub pagein_buffer: HistSnapshot,
    /// Page-in latency from the swap file.
    pub pagein_ssd: HistSnapshot,
    /// Both page-in kinds together.
    pub pagein: HistSnapshot,
    /// Page-out latency (a page leaving DRAM until its copy is in place).
    pub pageout: HistSnapshot,
    /// Swap pages brought into the buffer ahead of a fault (NS tenants).
    pub prefetched: u64,
    /// Control windows run.
    pub windows: u64,
    /// The SSD queue size S(t) now (reserve included).
    pub queue: usize,
    /// Tenants served by the buffer in the current window.
    pub ns_tenants: usize,
    /// The last window's SSD page-in p99 (ns; 0 when the SSD served none).
    pub last_ssd_p99_ns: u64,
}

/// What regions, their faults and the evictor share.
pub(crate) struct Shared {
    pub(crate) budget_pages: usize,
    /// The evictor works down to this many resident pages.
    pub(crate) target_pages: usize,
    /// Faults wait above this many resident pages.
    pub(crate) cap_pages: usize,
    pub(crate) batch: usize,
    pub(crate) control: ControlParams,
    /// The SSD queue size S(t): swap-file requests the pager keeps in flight, reads first.
    pub(crate) queue: AtomicUsize,
    /// Swap-file reads in flight (faults).
    pub(crate) inflight_reads: AtomicUsize,
    /// Swap clusters to bring into the buffer (an NS tenant faulted on one).
    pub(crate) prefetch_q: ArrayQueue<u64>,
    pub(crate) resident: AtomicUsize,
    pub(crate) buffer: Option<Buffer>,
    pub(crate) swap: Swap,
    /// Resident pages in fault order (region key | page); may hold stale entries.
    pub(crate) fifo: ArrayQueue<u64>,
    pub(crate) regions: Mutex<RegionTable>,
    pub(crate) c: Counters,
    pub(crate) h_buffer: AtomicHist,
    pub(crate) h_ssd: AtomicHist,
    pub(crate) h_pagein: AtomicHist,
    pub(crate) h_pageout: AtomicHist,
    /// eventfd that wakes the evictor.
    pub(crate) kick_fd: RawFd,
    pub(crate) kicked: AtomicBool,
    pub(crate) stop: AtomicBool,
    /// Rounds the evictor has finished (each ends with no batch or destage in progress).
    pub(crate) rounds: AtomicU64,
    /// Aligned pages for swap-file reads in the fault path, claimed lock-free.
    pub(crate) bounce: crate::region::Bounce,
    /// The shared pool this process is a tenant of, if any.
    pub(crate) seg: Option<SegLink>,
}

/// A process's link to a shared pager pool: the pool and its tenant entry.
pub(crate) struct SegLink {
    pub(crate) pool: Arc<PagerPool>,
    pub(crate) idx: usize,
    pub(crate) tag: u32,
}

impl Shared {
    /// Wakes the evictor (at most one eventfd write until it runs; async-signal-safe).
    pub(crate) fn kick(&self) {
        if !self.kicked.swap(true, Ordering::AcqRel) {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to our eventfd.
            unsafe { libc::write(self.kick_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    pub(crate) fn resident(&self) -> usize {
        self.resident.load(Ordering::Acquire)
    }

    /// This process's tenant entry in a shared pool.
    pub(crate) fn tenant(&self) -> Option<&Tenant> {
        self.seg.as_ref().map(|l| l.pool.tenant(l.idx))
    }

    /// The SSD queue S(t) now: the pool's in a shared pool, else this pager's.
    pub(crate) fn queue_now(&self) -> usize {
        match &self.seg {
            Some(l) => l.pool.queue(),
            None => self.queue.load(Ordering::Relaxed),
        }
    }

    /// Swap-file reads in flight: every tenant's in a shared pool.
    pub(crate) fn inflight_now(&self) -> usize {
        match &self.seg {
            Some(l) => l.pool.inflight_reads(),
            None => self.inflight_reads.load(Ordering::Relaxed),
        }
    }

    /// A page-in starts reading the swap file (async-signal-safe).
    pub(crate) fn read_begin(&self) {
        self.inflight_reads.fetch_add(1, Ordering::AcqRel);
        if let Some(t) = self.tenant() {
            t.inflight_reads.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// ... and is done with it.
    pub(crate) fn read_end(&self) {
        self.inflight_reads.fetch_sub(1, Ordering::AcqRel);
        if let Some(t) = self.tenant() {
            t.inflight_reads.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Records a page-in of `ns` in the shared pool's histograms (async-signal-safe).
    pub(crate) fn record_shared(&self, ns: u64, ssd: bool) {
        if let Some(l) = &self.seg {
            l.pool.tenant(l.idx).hist.record(ns);
            if ssd {
                l.pool.ssd_hist().record(ns);
            }
        }
    }

    /// Copies this process's counters into its tenant entry (for `tiermem pager status`).
    pub(crate) fn publish(&self) {
        if let Some(t) = self.tenant() {
            let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
            t.resident.store(self.resident() as u64, Ordering::Relaxed);
            t.pageins_buffer
                .store(l(&self.c.pageins_buffer), Ordering::Relaxed);
            t.pageins_ssd
                .store(l(&self.c.pageins_ssd), Ordering::Relaxed);
            t.pageouts_buffer
                .store(l(&self.c.pageouts_buffer), Ordering::Relaxed);
            t.pageouts_ssd
                .store(l(&self.c.pageouts_ssd), Ordering::Relaxed);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: our eventfd, closed once.
        unsafe { libc::close(self.kick_fd) };
    }
}

impl Drop for SegLink {
    /// Leaving the pool: the tenant entry and any slot still tagged with it are freed.
    fn drop(&mut self) {
        self.pool.unregister(self.idx, self.tag);
    }
}

/// Slot index and generation of each live region. Keys in the FIFO carry both, so an entry of
/// an unmapped region never matches a region mapped later in the same slot.
#[derive(Default)]
pub(crate) struct RegionTable {
    pub(crate) slots: Vec<Option<Arc<RegionState>>>,
    pub(crate) gens: Vec<u16>,
}

/// Bits of a FIFO entry given to the page number.
pub(crate) const PAGE_BITS: u32 = 36;

impl RegionTable {
    pub(crate) fn lookup(&self, key: u64) -> Option<(Arc<RegionState>, usize)> {
        let idx = (key >> (PAGE_BITS + 16)) as usize;
        let gen = ((key >> PAGE_BITS) & 0xffff) as u16;
        let page = (key & ((1 << PAGE_BITS) - 1)) as usize;
        match self.slots.get(idx) {
            Some(Some(r)) if self.gens[idx] == gen => Some((r.clone(), page)),
            _ => None,
        }
    }
}

/// A user-space pager: regions whose pages beyond a DRAM budget live in an NVM paging buffer or
/// an SSD swap file and come back on first access. See the crate documentation.
pub struct Pager {
    shared: Arc<Shared>,
    evictor: Option<tiermem_fault::scope::LibraryThread<()>>,
}

static SWAP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Pager {
    /// Sets up the buffer pool, the swap file and the evictor thread.
    ///
    /// Errors: a budget below one latency group or above the memory available, a buffer
    /// smaller than one group (when not 0), a swap file on tmpfs or that cannot be created,
    /// a kernel without `UFFDIO_MOVE` (Linux 6.8+).
    pub fn new(opts: &PagerOptions) -> Result<Pager> {
        opts.validate()?;
        let page = PAGE_SIZE as u64;
        let budget_pages = (opts.budget / page) as usize;
        // Calibrate the clock now: the first call takes ~20 ms and must not be in a fault.
        let _ = tiermem_media::now_ns();
        let seq = SWAP_SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        if let Some(path) = &opts.pool {
            let pool = Arc::new(PagerPool::open(path)?);
            let (idx, tag) = pool.register(budget_pages)?;
            let link = SegLink {
                pool: pool.clone(),
                idx,
                tag,
            };
            let buffer = (pool.buffer_slots() > 0).then(|| Buffer::shared(pool.clone(), tag));
            let swap = Swap::shared(&pool, tag, opts.swap_delay)?;
            let mut o = opts.clone();
            o.control = pool.control();
            return Pager::start(&o, budget_pages, buffer, swap, Some(link));
        }
        let buffer = if opts.nvm == 0 {
            None
        } else {
            let dir = match &opts.nvm_dir {
                Some(d) => d.clone(),
                None => tiermem_media::ensure_default_dir()?,
            };
            let path = dir.join(format!("pager-{pid}-{seq}.pool"));
            Some(Buffer::create(&path, opts.nvm, opts.nvm_delay)?)
        };
        let swap_path = opts
            .swap_path
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/var/tmp/tiermem-pager-{pid}-{seq}.swap")));
        let swap_size = opts.swap_size.unwrap_or(4 * opts.budget + (64 << 20));
        let swap = Swap::create(&swap_path, swap_size, opts.swap_delay)?;
        Pager::start(opts, budget_pages, buffer, swap, None)
    }

    /// Starts a pager over its zones: the shared state and the evictor thread. A tenant's
    /// entry is freed on error (the shared state's drop).
    fn start(
        opts: &PagerOptions,
        budget_pages: usize,
        buffer: Option<Buffer>,
        swap: Swap,
        seg: Option<SegLink>,
    ) -> Result<Pager> {
        // SAFETY: plain syscall.
        let kick_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if kick_fd < 0 {
            return Err(Error::last("eventfd"));
        }
        let batch = opts.batch;
        let shared = Arc::new(Shared {
            budget_pages,
            // Like kswapd's high watermark: the evictor works down to 1/32 of the budget below
            // it, so faults rarely meet the hard cap while it destages a group.
            target_pages: budget_pages - batch.max(budget_pages / 32),
            cap_pages: budget_pages + batch,
            batch,
            queue: AtomicUsize::new(if opts.control.enabled {
                opts.control.fixed_queue + opts.control.s_reserve
            } else {
                opts.control.fixed_queue
            }),
            control: opts.control.clone(),
            inflight_reads: AtomicUsize::new(0),
            prefetch_q: ArrayQueue::new(4096),
            resident: AtomicUsize::new(0),
            buffer,
            swap,
            fifo: ArrayQueue::new(2 * budget_pages + 4 * batch + 1024),
            regions: Mutex::new(RegionTable::default()),
            c: Counters::default(),
            h_buffer: AtomicHist::new(),
            h_ssd: AtomicHist::new(),
            h_pagein: AtomicHist::new(),
            h_pageout: AtomicHist::new(),
            kick_fd,
            kicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            bounce: crate::region::Bounce::new(64)?,
            seg,
        });
        let ev = Evictor::new(shared.clone())?;
        let evictor = tiermem_fault::scope::spawn_library_thread("tiermem-pager", move || ev.run())
            .map_err(|source| Error::Sys {
                op: "spawning the pager's evictor thread",
                source,
            })?;
        Ok(Pager {
            shared,
            evictor: Some(evictor),
        })
    }

    /// Maps a paged region of `len` bytes (rounded up to pages), zero-filled, whose pages count
    /// against this pager's budget. Faults are resolved in the faulting thread, so a system call
    /// that reads or writes an evicted page gets `EFAULT` (touch the buffer first).
    pub fn map(&self, len: usize) -> Result<PagedRegion> {
        PagedRegion::map(self.shared.clone(), len)
    }

    /// Takes over `[ptr, ptr + len)` (page-aligned), private anonymous memory the program
    /// already uses (a large `malloc` block, an anonymous `mmap`): its pages count against the
    /// budget from now on, and those beyond it move out like a mapped region's. Dropping the
    /// region pages every page back in and leaves the memory to its owner.
    ///
    /// Errors: an unaligned or empty range, memory that is not private anonymous read-write.
    ///
    /// # Safety
    /// The range must stay mapped until the region is dropped and must not be unmapped,
    /// remapped or registered with userfaultfd by anyone else meanwhile. Pages shared with a
    /// forked child copy-on-write cannot be moved out (they stay resident, counted as
    /// `evict_busy`), and the range is not inherited by later forks (`MADV_DONTFORK`).
    pub unsafe fn adopt(&self, ptr: *mut u8, len: usize) -> Result<PagedRegion> {
        // SAFETY: forwarded contract.
        unsafe { PagedRegion::adopt(self.shared.clone(), ptr, len) }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        (self.shared.budget_pages * PAGE_SIZE) as u64
    }

    /// Counters and latency histograms now.
    pub fn stats(&self) -> PagerStats {
        let s = &self.shared;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (bu, bs) = s.buffer.as_ref().map_or((0, 0), |b| {
            (b.slots.capacity() - b.slots.free(), b.slots.capacity())
        });
        PagerStats {
            resident_pages: s.resident(),
            max_resident_pages: s.c.max_resident.load(Ordering::Relaxed),
            budget_pages: s.budget_pages,
            buffer_used: bu,
            buffer_slots: bs,
            swap_used: s.swap.slots.capacity() - s.swap.slots.free(),
            swap_slots: s.swap.slots.capacity(),
            zero_fills: l(&s.c.zero_fills),
            pageins_buffer: l(&s.c.pageins_buffer),
            pageins_ssd: l(&s.c.pageins_ssd),
            pageouts_buffer: l(&s.c.pageouts_buffer),
            pageouts_ssd: l(&s.c.pageouts_ssd),
            destaged: l(&s.c.destaged),
            pageouts_clean: l(&s.c.pageouts_clean),
            destaged_clean: l(&s.c.destaged_clean),
            kept_reclaimed: l(&s.c.kept_reclaimed),
            pinned_skips: l(&s.c.pinned_skips),
            fifo_stale: l(&s.c.fifo_stale),
            dropped: l(&s.c.dropped),
            over_budget_waits: l(&s.c.over_budget_waits),
            swap_full: l(&s.c.swap_full),
            evict_busy: l(&s.c.evict_busy),
            io_errors: l(&s.c.io_errors),
            pagein_buffer: s.h_buffer.snapshot(),
            pagein_ssd: s.h_ssd.snapshot(),
            pagein: s.h_pagein.snapshot(),
            pageout: s.h_pageout.snapshot(),
            prefetched: l(&s.c.prefetched),
            windows: l(&s.c.windows),
            queue: s.queue_now(),
            ns_tenants: s.c.ns_tenants.load(Ordering::Relaxed),
            last_ssd_p99_ns: l(&s.c.last_ssd_tail_ns),
        }
    }

    /// Waits until the evictor has brought DRAM down to the budget and finished a whole round
    /// begun after this call (no page-out or destage half done), or 10 s. Tests, benchmarks.
    pub fn settle(&self) {
        let s = &self.shared;
        let r0 = s.rounds.load(Ordering::Acquire);
        for _ in 0..100_000 {
            if s.resident() <= s.budget_pages && s.rounds.load(Ordering::Acquire) >= r0 + 2 {
                return;
            }
            s.kick();
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.kicked.store(false, Ordering::Release);
        self.shared.kick();
        if let Some(h) = self.evictor.take() {
            let _ = h.join();
        }
    }
}
