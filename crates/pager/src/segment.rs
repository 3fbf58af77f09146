//! The pager pool: one NVM paging buffer, one swap file and one control segment shared by
//! several processes (NVSwap's several processes, item 6 of issue #16).
//!
//! The pool is a `media` pool file (tmpfs by default, the `nvmm` delay model). Its data area
//! holds, page-aligned and in this order:
//!
//! | area | what |
//! |---|---|
//! | header | magic, version, sizes, the swap file's path, control parameters and state (S(t), the leader) |
//! | tenant table | [`MAX_TENANTS`] entries: pid and start time, bound, the controller's output, counters, a page-in histogram |
//! | SSD histogram | every tenant's swap-file page-ins (the controller's `Lat_observed`) |
//! | buffer map | slot bitmap words and an owner tag per slot |
//! | swap map | the same for the swap file's slots |
//! | buffer | the NVM paging buffer's slots |
//!
//! Each process maps the pool, registers a tenant ([`PagerPool::register`]) and runs its own
//! evictor and its own page-in path against the shared slot maps; its shadow table stays
//! private (it holds offsets only). One process runs the controller (Algorithm 1 and the
//! monitor) over all tenants each window: `tiermem pager daemon` when it runs, else whichever
//! tenant's evictor finds the leader gone. The daemon also frees the slots of processes that
//! died ([`PagerPool::gc`]): every slot carries its tenant's tag, and a tenant whose pid no
//! longer exists with the recorded start time is dead.
//!
//! Everything here is `repr(C)` atomics at fixed offsets: the daemon, the CLI, the preload
//! shim and programs linking the library are different binaries reading one layout.

use crate::control::{ControlParams, Controller, TenantWindow};
use crate::error::{Error, Result};
use crate::hist::{HistCells, HistSnapshot};
use crate::slots::SlotMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use tiermem_fault::PAGE_SIZE;
use tiermem_media::{DelayModel, OpenOptions, Pool, PoolOptions};

/// Tenants (processes) a pool serves at once.
pub const MAX_TENANTS: usize = 64;

const MAGIC: u64 = u64::from_le_bytes(*b"TMPAGERP");
const VERSION: u32 = 2;
const PATH_MAX: usize = 512;

#[repr(C)]
struct Header {
    magic: u64,
    version: u32,
    max_tenants: u32,
    buffer_slots: u64,
    swap_slots: u64,
    swap_path_len: u64,
    swap_path: [u8; PATH_MAX],
    tenants_off: u64,
    ssd_hist_off: u64,
    bmap_off: u64,
    bown_off: u64,
    smap_off: u64,
    sown_off: u64,
    buffer_off: u64,
    // Control parameters, fixed by the creator.
    enabled: u64,
    gamma_bits: u64,
    s_min: u64,
    s_max: u64,
    s_reserve: u64,
    fixed_queue: u64,
    window_ns: u64,
    // Control state.
    queue: AtomicU64,
    s_core_bits: AtomicU64,
    windows: AtomicU64,
    last_ssd_p99: AtomicU64,
    leader: AtomicU32,
    daemon: AtomicU32,
    gen: AtomicU32,
    _pad: u32,
    /// Buffer slots each tenant holds (by entry index).
    bcount: [AtomicU64; MAX_TENANTS],
}

/// One process using the pool.
#[repr(C)]
pub(crate) struct Tenant {
    /// 0: the entry is free.
    pub(crate) pid: AtomicU32,
    /// Owner tag of its slots: entry index + 1 in the low byte, a generation above.
    pub(crate) tag: AtomicU32,
    /// Its start time (`/proc/PID/stat` field 22), so a reused pid is not taken for it.
    pub(crate) start_time: AtomicU64,
    /// Page-in bound in ns (`u64::MAX`: best effort) and its percentile (f64 bits).
    pub(crate) bound_ns: AtomicU64,
    pub(crate) pct_bits: AtomicU64,
    /// The controller's output: served by the buffer (Algorithm 1's NS or the monitor's).
    pub(crate) ns: AtomicU32,
    _pad: u32,
    /// Bumped when the monitor catches it over its bound: its swap pages are prefetched.
    pub(crate) over_seq: AtomicU64,
    /// Its tail in the last window (ns, 0: none).
    pub(crate) last_p99: AtomicU64,
    /// Swap-file reads in flight (its share of the SSD queue).
    pub(crate) inflight_reads: AtomicU64,
    pub(crate) budget_pages: AtomicU64,
    pub(crate) resident: AtomicU64,
    pub(crate) pageins_buffer: AtomicU64,
    pub(crate) pageins_ssd: AtomicU64,
    pub(crate) pageouts_buffer: AtomicU64,
    pub(crate) pageouts_ssd: AtomicU64,
    /// Every page-in of the process.
    pub(crate) hist: HistCells,
}

/// How to create a pager pool ([`PagerPool::create`]).
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// NVM paging buffer bytes (0: none).
    pub nvm: u64,
    /// Delay model of the buffer.
    pub nvm_delay: DelayModel,
    /// The swap file, on a disk; created, and removed with the pool.
    pub swap_path: PathBuf,
    /// Swap file bytes.
    pub swap_size: u64,
    /// Control parameters for every tenant.
    pub control: ControlParams,
}

/// A tenant as `tiermem pager status` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TenantStatus {
    /// Process id.
    pub pid: u32,
    /// Whether the process is alive.
    pub alive: bool,
    /// Its bound (`None`: best effort) as (percentile, ns).
    pub bound: Option<(f64, u64)>,
    /// Served by the buffer this window.
    pub ns: bool,
    /// Its tail in the last window, ns.
    pub last_p99_ns: Option<u64>,
    /// DRAM budget and resident pages.
    pub budget_pages: u64,
    /// Pages in DRAM.
    pub resident_pages: u64,
    /// Buffer and swap slots it holds.
    pub buffer_pages: usize,
    /// Swap slots it holds.
    pub swap_pages: usize,
    /// Page-ins from the buffer and from the swap file.
    pub pageins_buffer: u64,
    /// Page-ins from the swap file.
    pub pageins_ssd: u64,
    /// Page-outs to the buffer.
    pub pageouts_buffer: u64,
    /// Page-outs to the swap file.
    pub pageouts_ssd: u64,
    /// p99 of all its page-ins so far, ns.
    pub pagein_p99_ns: Option<u64>,
}

/// The pool as `tiermem pager status` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PoolStatus {
    /// The pool file.
    pub path: PathBuf,
    /// The swap file.
    pub swap_path: PathBuf,
    /// Buffer slots in use and in all.
    pub buffer_used: usize,
    /// Buffer slots.
    pub buffer_slots: usize,
    /// Swap slots in use.
    pub swap_used: usize,
    /// Swap slots.
    pub swap_slots: usize,
    /// The SSD queue S(t).
    pub queue: u64,
    /// Control windows run.
    pub windows: u64,
    /// The last window's SSD page-in p99 (ns, 0: none).
    pub last_ssd_p99_ns: u64,
    /// The pid running the controller (0: none yet).
    pub leader: u32,
    /// The daemon's pid (0: none).
    pub daemon: u32,
    /// Live and dead-but-not-collected tenants.
    pub tenants: Vec<TenantStatus>,
}

/// What [`PagerPool::gc`] freed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Dead tenants removed.
    pub tenants: usize,
    /// Buffer slots given back.
    pub buffer_slots: usize,
    /// Swap slots given back.
    pub swap_slots: usize,
}

/// A mapped pager pool. See the module documentation.
pub struct PagerPool {
    pool: Pool,
    path: PathBuf,
    swap_path: PathBuf,
}

// SAFETY: the mapping is shared memory of atomics; the pool handle is thread-safe.
unsafe impl Send for PagerPool {}
// SAFETY: as above.
unsafe impl Sync for PagerPool {}

fn align_up(v: usize) -> usize {
    v.div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// Where [`PagerPool::create`] puts each area, from the data area's start.
struct Layout {
    tenants: usize,
    ssd_hist: usize,
    bmap: usize,
    bown: usize,
    smap: usize,
    sown: usize,
    buffer: usize,
    total: usize,
}

impl Layout {
    fn new(buffer_slots: usize, swap_slots: usize) -> Layout {
        let tenants = align_up(std::mem::size_of::<Header>());
        let ssd_hist = tenants + align_up(MAX_TENANTS * std::mem::size_of::<Tenant>());
        let bmap = ssd_hist + align_up(std::mem::size_of::<HistCells>());
        let bown = bmap + align_up(SlotMap::cell_bytes(buffer_slots));
        let smap = bown + align_up(buffer_slots * 4);
        let sown = smap + align_up(SlotMap::cell_bytes(swap_slots));
        let buffer = sown + align_up(swap_slots * 4);
        Layout {
            tenants,
            ssd_hist,
            bmap,
            bown,
            smap,
            sown,
            buffer,
            total: buffer + buffer_slots * PAGE_SIZE,
        }
    }
}

/// The default pool path: `pager.pool` in the media layer's directory (tmpfs).
pub fn default_pool_path() -> PathBuf {
    tiermem_media::default_dir().join("pager.pool")
}

/// Whether process `pid` is alive and is the one that started at `start_time` (0: any).
pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    if pid == 0 {
        return false;
    }
    match proc_start_time(pid) {
        Some(t) => start_time == 0 || t == start_time,
        None => false,
    }
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks since boot).
pub(crate) fn proc_start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    // rest starts at field 3 (state); field 22 is the 20th from here.
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.first() == Some(&"Z") || f.first() == Some(&"X") {
        return None;
    }
    f.get(19)?.parse().ok()
}

impl PagerPool {
    /// Creates a pool at `path` (refused if a file is there) and its swap file (refused on
    /// tmpfs or if it exists).
    pub fn create(path: &Path, spec: &PoolSpec) -> Result<PagerPool> {
        let page = PAGE_SIZE as u64;
        if spec.nvm != 0 && spec.nvm / page < crate::GROUP_PAGES as u64 {
            return Err(Error::InvalidOption(format!(
                "an NVM buffer of {} bytes is below one latency group ({} bytes); use 0 for none",
                spec.nvm,
                crate::GROUP_PAGES as u64 * page
            )));
        }
        let sp = spec.swap_path.as_os_str().as_encoded_bytes();
        if sp.is_empty() || sp.len() > PATH_MAX {
            return Err(Error::InvalidOption(format!(
                "the swap file path must be 1..={PATH_MAX} bytes: {}",
                spec.swap_path.display()
            )));
        }
        let c = &spec.control;
        if !(c.gamma > 0.0 && c.gamma <= 1.0) || c.s_min == 0 || c.s_max < c.s_min {
            return Err(Error::InvalidOption(format!(
                "bad control parameters: {c:?}"
            )));
        }
        if spec.swap_path.exists() {
            return Err(Error::InvalidOption(format!(
                "{} exists: a pool creates its own swap file (remove it, or give another --swap)",
                spec.swap_path.display()
            )));
        }
        let buffer_slots = (spec.nvm / page) as usize;
        let swap_slots = (spec.swap_size / page) as usize;
        let swap = crate::zones::Swap::create_kept(&spec.swap_path, spec.swap_size)?;
        drop(swap);
        let l = Layout::new(buffer_slots, swap_slots);
        let opts = PoolOptions::new((l.total + PAGE_SIZE) as u64)
            .delay(spec.nvm_delay)
            .tag("pager-pool");
        let pool = match Pool::create(path, &opts) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_file(&spec.swap_path);
                return Err(e.into());
            }
        };
        let me = PagerPool {
            pool,
            path: path.to_path_buf(),
            swap_path: spec.swap_path.clone(),
        };
        {
            // SAFETY: the data area starts with the header's room, zeroed (a fresh file);
            // nobody else maps the pool before this function returns... except a process that
            // opens it early, which checks the magic, written last.
            let h = unsafe { &mut *(me.pool.data_ptr() as *mut Header) };
            h.version = VERSION;
            h.max_tenants = MAX_TENANTS as u32;
            h.buffer_slots = buffer_slots as u64;
            h.swap_slots = swap_slots as u64;
            h.swap_path_len = sp.len() as u64;
            h.swap_path[..sp.len()].copy_from_slice(sp);
            h.tenants_off = l.tenants as u64;
            h.ssd_hist_off = l.ssd_hist as u64;
            h.bmap_off = l.bmap as u64;
            h.bown_off = l.bown as u64;
            h.smap_off = l.smap as u64;
            h.sown_off = l.sown as u64;
            h.buffer_off = l.buffer as u64;
            h.enabled = c.enabled as u64;
            h.gamma_bits = c.gamma.to_bits();
            h.s_min = c.s_min as u64;
            h.s_max = c.s_max as u64;
            h.s_reserve = c.s_reserve as u64;
            h.fixed_queue = c.fixed_queue as u64;
            h.window_ns = c.window.as_nanos() as u64;
            let q = if c.enabled {
                c.fixed_queue + c.s_reserve
            } else {
                c.fixed_queue
            };
            h.queue.store(q as u64, Ordering::Relaxed);
            h.s_core_bits
                .store((c.fixed_queue as f64).to_bits(), Ordering::Relaxed);
        }
        me.buffer_map(0).init();
        me.swap_map(0).init();
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: as above; the magic is the last word written.
        unsafe { std::ptr::write_volatile(me.pool.data_ptr() as *mut u64, MAGIC) };
        Ok(me)
    }

    /// Opens the pool at `path`.
    ///
    /// Errors: no such file, not a media pool, a media pool that is not a pager pool, another
    /// layout version, a swap file that is gone.
    pub fn open(path: &Path) -> Result<PagerPool> {
        let pool = Pool::open(path, &OpenOptions::default()).map_err(|e| match e {
            tiermem_media::MediaError::NotFound { .. } => Error::InvalidOption(format!(
                "{}: no pager pool here (start one with `tiermem pager daemon --pool {}`)",
                path.display(),
                path.display()
            )),
            e => e.into(),
        })?;
        let bad = |why: String| Error::BadPool {
            path: path.to_path_buf(),
            why,
        };
        if pool.data_len() < std::mem::size_of::<Header>() {
            return Err(bad("too small for a pager pool's header".into()));
        }
        // SAFETY: the data area is at least a header long (checked above) and mapped.
        let h = unsafe { &*(pool.data_ptr() as *const Header) };
        // SAFETY: the magic is read with a volatile load (a creator may still be writing).
        let magic = unsafe { std::ptr::read_volatile(pool.data_ptr() as *const u64) };
        if magic != MAGIC {
            return Err(bad(format!(
                "not a pager pool (tag {:?}), or its creator died before finishing it",
                pool.tag()
            )));
        }
        if h.version != VERSION {
            return Err(bad(format!(
                "layout version {} where this build reads {VERSION}: restart the daemon with \
                 this build",
                h.version
            )));
        }
        let l = Layout::new(h.buffer_slots as usize, h.swap_slots as usize);
        let offs = [
            (h.tenants_off, l.tenants),
            (h.ssd_hist_off, l.ssd_hist),
            (h.bmap_off, l.bmap),
            (h.bown_off, l.bown),
            (h.smap_off, l.smap),
            (h.sown_off, l.sown),
            (h.buffer_off, l.buffer),
        ];
        if h.max_tenants as usize != MAX_TENANTS
            || offs.iter().any(|&(a, b)| a != b as u64)
            || l.total > pool.data_len()
            || h.swap_path_len as usize > PATH_MAX
            || h.swap_path_len == 0
        {
            return Err(bad(
                "its header does not describe a layout this build reads".into(),
            ));
        }
        let swap_path = PathBuf::from(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
                &h.swap_path[..h.swap_path_len as usize],
            ),
        );
        if !swap_path.exists() {
            return Err(bad(format!(
                "its swap file {} is gone",
                swap_path.display()
            )));
        }
        Ok(PagerPool {
            pool,
            path: path.to_path_buf(),
            swap_path,
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: checked by create/open; the mapping lives as long as self.
        unsafe { &*(self.pool.data_ptr() as *const Header) }
    }

    fn area(&self, off: u64) -> *mut u8 {
        // SAFETY: offsets come from a header checked against the layout and the mapping.
        unsafe { self.pool.data_ptr().add(off as usize) }
    }

    pub(crate) fn tenant(&self, i: usize) -> &Tenant {
        assert!(i < MAX_TENANTS);
        // SAFETY: inside the tenant table (checked layout), aligned to a page.
        unsafe { &*(self.area(self.header().tenants_off) as *const Tenant).add(i) }
    }

    pub(crate) fn ssd_hist(&self) -> &HistCells {
        // SAFETY: the SSD histogram's area.
        unsafe { &*(self.area(self.header().ssd_hist_off) as *const HistCells) }
    }

    /// The buffer's slot map, writing owner tag `tag`.
    pub(crate) fn buffer_map(&self, tag: u32) -> SlotMap {
        let h = self.header();
        // SAFETY: the buffer map's areas, laid out for its size at creation.
        unsafe {
            SlotMap::at(
                self.area(h.bmap_off),
                self.area(h.bown_off),
                h.buffer_slots as usize,
                tag,
                h.bcount.as_ptr(),
            )
        }
    }

    /// Whether another live tenant with a looser bound than `mine` holds buffer slots: the
    /// pool destages highest bound first, so that one's groups go before ours.
    pub(crate) fn looser_holds_buffer(&self, me: usize, mine: u64) -> bool {
        let h = self.header();
        (0..MAX_TENANTS).filter(|&i| i != me).any(|i| {
            let t = self.tenant(i);
            t.pid.load(Ordering::Relaxed) != 0
                && t.bound_ns.load(Ordering::Relaxed) > mine
                && h.bcount[i].load(Ordering::Relaxed) >= 2 * crate::GROUP_PAGES as u64
        })
    }

    /// The swap file's slot map, writing owner tag `tag`.
    pub(crate) fn swap_map(&self, tag: u32) -> SlotMap {
        let h = self.header();
        // SAFETY: the swap map's areas, laid out for its size at creation.
        unsafe {
            SlotMap::at(
                self.area(h.smap_off),
                self.area(h.sown_off),
                h.swap_slots as usize,
                tag,
                std::ptr::null(),
            )
        }
    }

    /// First byte of the buffer's slots.
    pub(crate) fn buffer_base(&self) -> *mut u8 {
        self.area(self.header().buffer_off)
    }

    /// Buffer slots.
    pub fn buffer_slots(&self) -> usize {
        self.header().buffer_slots as usize
    }

    /// The media pool (its delay model charges buffer copies).
    pub(crate) fn media(&self) -> &Pool {
        &self.pool
    }

    /// The pool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The swap file.
    pub fn swap_path(&self) -> &Path {
        &self.swap_path
    }

    /// The control parameters the pool was created with.
    pub fn control(&self) -> ControlParams {
        let h = self.header();
        ControlParams {
            enabled: h.enabled != 0,
            gamma: f64::from_bits(h.gamma_bits),
            s_min: h.s_min as usize,
            s_max: h.s_max as usize,
            s_reserve: h.s_reserve as usize,
            fixed_queue: h.fixed_queue as usize,
            window: Duration::from_nanos(h.window_ns),
            // Not in the pool's layout: every pool aims where a pager of its own would.
            goal_frac: ControlParams::default().goal_frac,
        }
    }

    /// The SSD queue S(t) now (reserve included).
    pub(crate) fn queue(&self) -> usize {
        self.header().queue.load(Ordering::Relaxed) as usize
    }

    /// Swap-file reads in flight across all tenants.
    pub(crate) fn inflight_reads(&self) -> usize {
        (0..MAX_TENANTS)
            .map(|i| self.tenant(i))
            .filter(|t| t.pid.load(Ordering::Relaxed) != 0)
            .map(|t| t.inflight_reads.load(Ordering::Relaxed) as usize)
            .sum()
    }

    /// Whether any live tenant is served by the buffer (NS) this window.
    pub(crate) fn any_ns(&self) -> bool {
        (0..MAX_TENANTS).map(|i| self.tenant(i)).any(|t| {
            t.pid.load(Ordering::Relaxed) != 0
                && t.ns.load(Ordering::Relaxed) != 0
                && t.bound_ns.load(Ordering::Relaxed) != u64::MAX
        })
    }

    /// Registers the calling process as a tenant with a budget of `budget_pages`; returns its
    /// entry index and owner tag.
    pub(crate) fn register(&self, budget_pages: usize) -> Result<(usize, u32)> {
        let pid = std::process::id();
        let start = proc_start_time(pid).unwrap_or(0);
        for i in 0..MAX_TENANTS {
            let t = self.tenant(i);
            if t.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let gen = self.header().gen.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
                let tag = (gen << 8) | (i as u32 + 1);
                t.start_time.store(start, Ordering::Relaxed);
                t.bound_ns.store(u64::MAX, Ordering::Relaxed);
                t.pct_bits.store(0.99f64.to_bits(), Ordering::Relaxed);
                t.ns.store(0, Ordering::Relaxed);
                t.last_p99.store(0, Ordering::Relaxed);
                t.inflight_reads.store(0, Ordering::Relaxed);
                t.budget_pages.store(budget_pages as u64, Ordering::Relaxed);
                for c in [
                    &t.resident,
                    &t.pageins_buffer,
                    &t.pageins_ssd,
                    &t.pageouts_buffer,
                    &t.pageouts_ssd,
                ] {
                    c.store(0, Ordering::Relaxed);
                }
                t.hist.clear();
                t.tag.store(tag, Ordering::Release);
                return Ok((i, tag));
            }
        }
        Err(Error::InvalidOption(format!(
            "the pager pool {} serves {MAX_TENANTS} processes already (tiermem pager status; \
             tiermem pager gc frees dead ones)",
            self.path.display()
        )))
    }

    /// Leaves: gives back any slot still tagged with `tag` and frees entry `i`.
    pub(crate) fn unregister(&self, i: usize, tag: u32) {
        let t = self.tenant(i);
        if t.tag.load(Ordering::Acquire) != tag {
            return;
        }
        self.buffer_map(0).release_owned_by(tag);
        self.swap_map(0).release_owned_by(tag);
        t.tag.store(0, Ordering::Release);
        t.pid.store(0, Ordering::Release);
    }

    /// Sets the page-in bound of tenant `pid` (`None`: best effort). Errors when no live
    /// tenant has that pid.
    pub fn set_bound(&self, pid: u32, bound: Option<(f64, u64)>) -> Result<()> {
        if let Some((pct, ns)) = bound {
            crate::region::check_bound(pct, ns)?;
        }
        for i in 0..MAX_TENANTS {
            let t = self.tenant(i);
            if t.pid.load(Ordering::Acquire) == pid {
                match bound {
                    Some((pct, ns)) => {
                        t.pct_bits.store(pct.to_bits(), Ordering::Relaxed);
                        t.bound_ns.store(ns, Ordering::Release);
                    }
                    None => t.bound_ns.store(u64::MAX, Ordering::Release),
                }
                return Ok(());
            }
        }
        Err(Error::InvalidOption(format!(
            "no process {pid} uses the pager pool {} (tiermem pager status lists them)",
            self.path.display()
        )))
    }

    /// The bounds of the live tenants, ns (admission's `admitted`).
    pub fn bounds_ns(&self) -> Vec<u64> {
        (0..MAX_TENANTS)
            .map(|i| self.tenant(i))
            .filter(|t| {
                let pid = t.pid.load(Ordering::Acquire);
                pid != 0 && process_alive(pid, t.start_time.load(Ordering::Relaxed))
            })
            .map(|t| t.bound_ns.load(Ordering::Relaxed))
            .filter(|&b| b != u64::MAX)
            .collect()
    }

    /// Frees the entries and slots of tenants whose process is gone. With no live tenant left,
    /// also frees used slots with no owner tag (a process killed between taking a slot and
    /// tagging it).
    pub fn gc(&self) -> GcReport {
        let mut r = GcReport::default();
        let (bm, sm) = (self.buffer_map(0), self.swap_map(0));
        let mut live = 0;
        for i in 0..MAX_TENANTS {
            let t = self.tenant(i);
            let pid = t.pid.load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            let tag = t.tag.load(Ordering::Acquire);
            if process_alive(pid, t.start_time.load(Ordering::Relaxed)) {
                live += 1;
                continue;
            }
            if tag == 0 {
                // Registering now (pid taken, tag not yet written), or died doing so: the
                // registration writes the start time before the tag, so a dead one is dead.
                if t.start_time.load(Ordering::Relaxed) == 0 {
                    continue;
                }
            }
            r.buffer_slots += bm.release_owned_by(tag);
            r.swap_slots += sm.release_owned_by(tag);
            t.tag.store(0, Ordering::Release);
            t.inflight_reads.store(0, Ordering::Relaxed);
            if t.pid
                .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                r.tenants += 1;
            }
        }
        if live == 0 {
            r.buffer_slots += bm.release_untagged();
            r.swap_slots += sm.release_untagged();
        }
        r
    }

    /// Live tenants (alive or not yet collected).
    pub fn live_tenants(&self) -> usize {
        (0..MAX_TENANTS)
            .filter(|&i| self.tenant(i).pid.load(Ordering::Relaxed) != 0)
            .count()
    }

    /// Marks the calling process as the daemon and the controller's leader.
    pub fn claim_daemon(&self) -> Result<()> {
        let h = self.header();
        let me = std::process::id();
        let d = h.daemon.load(Ordering::Acquire);
        if d != 0 && d != me && process_alive(d, 0) {
            return Err(Error::InvalidOption(format!(
                "a pager daemon (pid {d}) serves {} already",
                self.path.display()
            )));
        }
        h.daemon.store(me, Ordering::Release);
        h.leader.store(me, Ordering::Release);
        Ok(())
    }

    /// Gives up the daemon's role (at its exit).
    pub fn release_daemon(&self) {
        let h = self.header();
        let me = std::process::id();
        let _ = h
            .daemon
            .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
        let _ = h
            .leader
            .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Whether the calling process runs the controller this window: it is the leader, or the
    /// leader is gone and it takes over.
    pub(crate) fn try_lead(&self) -> bool {
        let h = self.header();
        let me = std::process::id();
        let l = h.leader.load(Ordering::Acquire);
        if l == me {
            return true;
        }
        if l != 0 && process_alive(l, 0) {
            return false;
        }
        h.leader
            .compare_exchange(l, me, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Removes the pool file and its swap file (the daemon, at exit with no tenant left).
    pub fn remove(self) -> Result<()> {
        let (path, swap) = (self.path.clone(), self.swap_path.clone());
        drop(self);
        let _ = std::fs::remove_file(&swap);
        Pool::remove(&path)?;
        Ok(())
    }

    /// The pool's state now.
    pub fn status(&self) -> PoolStatus {
        let h = self.header();
        let (bm, sm) = (self.buffer_map(0), self.swap_map(0));
        let mut tenants = Vec::new();
        for i in 0..MAX_TENANTS {
            let t = self.tenant(i);
            let pid = t.pid.load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            let tag = t.tag.load(Ordering::Acquire);
            let bound = t.bound_ns.load(Ordering::Relaxed);
            let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
            let p99 = l(&t.last_p99);
            tenants.push(TenantStatus {
                pid,
                alive: process_alive(pid, l(&t.start_time)),
                bound: (bound != u64::MAX).then(|| (f64::from_bits(l(&t.pct_bits)), bound)),
                ns: t.ns.load(Ordering::Relaxed) != 0,
                last_p99_ns: (p99 != 0).then_some(p99),
                budget_pages: l(&t.budget_pages),
                resident_pages: l(&t.resident),
                buffer_pages: bm.held_by(tag) as usize,
                swap_pages: sm.owned_by(tag),
                pageins_buffer: l(&t.pageins_buffer),
                pageins_ssd: l(&t.pageins_ssd),
                pageouts_buffer: l(&t.pageouts_buffer),
                pageouts_ssd: l(&t.pageouts_ssd),
                pagein_p99_ns: t.hist.snapshot().quantile(0.99),
            });
        }
        PoolStatus {
            path: self.path.clone(),
            swap_path: self.swap_path.clone(),
            buffer_used: bm.capacity() - bm.free(),
            buffer_slots: bm.capacity(),
            swap_used: sm.capacity() - sm.free(),
            swap_slots: sm.capacity(),
            queue: h.queue.load(Ordering::Relaxed),
            windows: h.windows.load(Ordering::Relaxed),
            last_ssd_p99_ns: h.last_ssd_p99.load(Ordering::Relaxed),
            leader: h.leader.load(Ordering::Relaxed),
            daemon: h.daemon.load(Ordering::Relaxed),
            tenants,
        }
    }
}

/// The controller's state in the process running it for a pool: Eq. 1's S(t) (kept in the
/// pool, so a new leader continues from it), the monitor's holds, and last window's snapshots.
pub struct PoolController {
    ctl: Controller,
    last: HashMap<u32, HistSnapshot>,
    last_ssd: Option<HistSnapshot>,
}

/// One window of a pool's controller, for traces and the daemon's log.
#[derive(Clone, Debug)]
pub struct PoolWindow {
    /// The window's SSD page-in p99, ns.
    pub ssd_p99_ns: Option<u64>,
    /// S(t+1), reserve included.
    pub queue: usize,
    /// (pid, bound ns, observed tail ns, ns) of each bounded tenant.
    pub tenants: Vec<(u32, u64, Option<u64>, bool)>,
}

impl PoolController {
    /// A controller for `pool`, continuing from the S(t) it holds.
    pub fn new(pool: &PagerPool) -> PoolController {
        let mut ctl = Controller::new(pool.control());
        ctl.set_core(f64::from_bits(
            pool.header().s_core_bits.load(Ordering::Relaxed),
        ));
        PoolController {
            ctl,
            last: HashMap::new(),
            last_ssd: None,
        }
    }

    /// One window over every live tenant: Algorithm 1 on the window's SSD tail, the monitor on
    /// each tenant's own tail; writes S(t+1), each tenant's NS flag, and bumps the prefetch
    /// sequence of each tenant caught over its bound.
    pub fn window(&mut self, pool: &PagerPool) -> PoolWindow {
        let h = pool.header();
        let mut tenants = Vec::new();
        let mut seen = HashMap::new();
        let mut idx = Vec::new();
        for i in 0..MAX_TENANTS {
            let t = pool.tenant(i);
            let tag = t.tag.load(Ordering::Acquire);
            if t.pid.load(Ordering::Relaxed) == 0 || tag == 0 {
                continue;
            }
            let now = t.hist.snapshot();
            let bound = t.bound_ns.load(Ordering::Relaxed);
            let pct = f64::from_bits(t.pct_bits.load(Ordering::Relaxed));
            let observed = match self.last.get(&tag) {
                Some(old) => now.since(old).quantile(pct),
                None => now.quantile(pct),
            };
            t.last_p99.store(observed.unwrap_or(0), Ordering::Relaxed);
            if bound != u64::MAX {
                tenants.push(TenantWindow {
                    id: tag as u64,
                    bound_ns: bound,
                    observed_ns: observed,
                });
            }
            idx.push(i);
            seen.insert(tag, now);
        }
        self.last = seen;
        let ssd_now = pool.ssd_hist().snapshot();
        let ssd_tail = match &self.last_ssd {
            Some(old) => ssd_now.since(old).quantile(0.99),
            None => None,
        };
        self.last_ssd = Some(ssd_now);
        let d = self.ctl.step(&tenants, ssd_tail);
        h.queue.store(d.queue as u64, Ordering::Relaxed);
        h.s_core_bits
            .store(self.ctl.core().to_bits(), Ordering::Relaxed);
        h.last_ssd_p99
            .store(ssd_tail.unwrap_or(0), Ordering::Relaxed);
        h.windows.fetch_add(1, Ordering::Relaxed);
        for &i in &idx {
            let t = pool.tenant(i);
            let tag = t.tag.load(Ordering::Relaxed) as u64;
            t.ns.store(d.ns.contains(&tag) as u32, Ordering::Relaxed);
            if d.over.contains(&tag) {
                t.over_seq.fetch_add(1, Ordering::Release);
            }
        }
        PoolWindow {
            ssd_p99_ns: ssd_tail,
            queue: d.queue,
            tenants: tenants
                .iter()
                .map(|tw| {
                    let i = (tw.id & 0xff) as usize - 1;
                    let pid = pool.tenant(i).pid.load(Ordering::Relaxed);
                    (pid, tw.bound_ns, tw.observed_ns, d.ns.contains(&tw.id))
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_structs_have_one_layout() {
        // The layout is read by several binaries: sizes are part of the format (VERSION).
        assert_eq!(std::mem::size_of::<Header>() % 8, 0);
        assert!(std::mem::size_of::<Header>() <= PAGE_SIZE);
        assert_eq!(std::mem::align_of::<Tenant>(), 8);
        let l = Layout::new(100, 1000);
        assert!(l.tenants < l.ssd_hist && l.ssd_hist < l.bmap && l.bown < l.smap);
        assert!(l.sown < l.buffer && l.buffer % PAGE_SIZE == 0);
        assert_eq!(l.total, l.buffer + 100 * PAGE_SIZE);
    }

    #[test]
    fn start_time_of_this_process_and_of_no_process() {
        let me = std::process::id();
        let t = proc_start_time(me).unwrap();
        assert!(process_alive(me, t));
        assert!(!process_alive(me, t + 1));
        assert!(!process_alive(0, 0));
        assert!(!process_alive(4_000_000, 0));
    }
}
