//! The service: one SCHED_IDLE thread that, every pass, senses each registered region's window
//! table and populates ahead (see [`crate::window`]), within the process-wide budget and the
//! memory cgroup's room; and the handles callers hold: [`Service`], [`Registration`] (Rust) and
//! [`RawRegistration`] (the preload library and the C ABI).

use crate::busy::{self, RunDelay};
use crate::os::{self, Memcg, Presence, Run};
use crate::policy::{Options, Order, Policy, Thp};
use crate::table::{Table, LIVE, MAX_SLOTS};
use crate::window::{Mode, Window};
use crate::Error;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiermem_fault::{RegionHandle, PAGE_SIZE};

/// What the service did, over all regions since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Live registrations.
    pub regions: usize,
    /// Passes over the table.
    pub passes: u64,
    /// Populate calls (madvise or engine installs).
    pub populate_calls: u64,
    /// Bytes populated ahead.
    pub populated_bytes: u64,
    /// Tripwires hit (4 KiB mode) and windows passed (huge-page mode).
    pub tripwire_hits: u64,
    /// Pages the application faulted in itself, seen by the service.
    pub footprint_pages: u64,
    /// Bytes populated and not known to be used now.
    pub unused_bytes: u64,
    /// The most `unused_bytes` ever were.
    pub peak_unused_bytes: u64,
    /// The budget (`Options::budget_bytes`).
    pub budget_bytes: u64,
    /// Passes that populated nothing because the memory cgroup was near its limit.
    pub backoffs: u64,
    /// Passes of a SCHED_IDLE service that waited on a run queue (the cores were busy): cut
    /// short, and the next one put off (see the module `busy`).
    pub starved_passes: u64,
    /// Starved passes after which the thread moved itself to another CPU (see `run`).
    pub cpu_hops: u64,
    /// Populate calls that failed.
    pub failures: u64,
    /// CPU time of the service thread.
    pub service_cpu: Duration,
    /// Whether the thread runs SCHED_IDLE.
    pub sched_idle: bool,
    /// How presence is read: "PAGEMAP_SCAN" or "mincore".
    pub sensing: &'static str,
}

/// One registration's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// Bytes populated ahead in this region.
    pub populated_bytes: u64,
    /// Populate calls.
    pub calls: u64,
    /// Tripwires hit / windows passed.
    pub hits: u64,
    /// Failed populate calls, and the last errno.
    pub failures: u64,
    /// errno of the last failure (0: none).
    pub last_errno: i32,
    /// The order followed now (`Auto` while still learning).
    pub order: Order,
    /// The stride learned, in pages (0 unless `order` is `Stride`).
    pub stride: usize,
}

pub(crate) struct Shared {
    pub table: Table,
    opts: Options,
    stop: AtomicBool,
    thread: OnceLock<std::thread::Thread>,
    engines: Mutex<Vec<Option<Arc<RegionHandle>>>>,
    passes: AtomicU64,
    calls: AtomicU64,
    populated: AtomicU64,
    hits: AtomicU64,
    footprint: AtomicU64,
    unused: AtomicU64,
    peak_unused: AtomicU64,
    backoffs: AtomicU64,
    starved: AtomicU64,
    hops: AtomicU64,
    failures: AtomicU64,
    cpu_ns: AtomicU64,
    idle: AtomicBool,
    pagemap_scan: AtomicBool,
    running: AtomicBool,
    /// The service thread's kernel thread id (gettid), 0 until it has started.
    tid: AtomicI32,
    /// The thread sleeps longer than one interval (no live region, or every one idle): a new
    /// registration wakes it even where it would not otherwise (see `register_trusted`).
    long_sleep: AtomicBool,
}

impl Shared {
    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// The prefault service: a background thread populating registered regions ahead of the
/// application's first touches. Cheap to clone; the thread stops when the last clone is
/// dropped (or at [`Service::stop`]); registrations outlive it harmlessly (nothing is
/// populated any more).
#[derive(Clone)]
pub struct Service {
    inner: Arc<ServiceInner>,
}

struct ServiceInner {
    shared: Arc<Shared>,
    join: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for ServiceInner {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.wake();
        if let Some(j) = self.join.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = j.join();
        }
        // After the join: no populate can be in flight in a child forked from now on.
        fork::untrack(&self.shared);
    }
}

impl Service {
    /// Starts the service thread (`tiermem-prefault`, SCHED_IDLE when `opts.sched_idle`).
    /// Fails on nonsensical options.
    pub fn start(opts: Options) -> Result<Service, Error> {
        if opts.budget_bytes < PAGE_SIZE {
            return Err(Error::InvalidArgument(format!(
                "budget {} bytes: at least one page",
                opts.budget_bytes
            )));
        }
        if opts.max_call_bytes < PAGE_SIZE || opts.max_call_bytes % PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(format!(
                "max_call_bytes {}: a positive multiple of 4096",
                opts.max_call_bytes
            )));
        }
        if opts.min_interval > opts.interval || opts.interval.is_zero() {
            return Err(Error::InvalidArgument(
                "interval must be positive and at least min_interval".into(),
            ));
        }
        let shared = Arc::new(Shared {
            table: Table::new(),
            opts,
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
            engines: Mutex::new(vec![None; MAX_SLOTS]),
            passes: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            populated: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            footprint: AtomicU64::new(0),
            unused: AtomicU64::new(0),
            peak_unused: AtomicU64::new(0),
            backoffs: AtomicU64::new(0),
            starved: AtomicU64::new(0),
            hops: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            idle: AtomicBool::new(false),
            pagemap_scan: AtomicBool::new(false),
            running: AtomicBool::new(true),
            tid: AtomicI32::new(0),
            long_sleep: AtomicBool::new(false),
        });
        fork::track(&shared);
        os::open_maps();
        let s2 = shared.clone();
        let join = std::thread::Builder::new()
            .name("tiermem-prefault".into())
            .spawn(move || run(s2))
            .map_err(|e| Error::Os(format!("starting the service thread: {e}")))?;
        let _ = shared.thread.set(join.thread().clone());
        Ok(Service {
            inner: Arc::new(ServiceInner {
                shared,
                join: Mutex::new(Some(join)),
            }),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// Registers `[ptr, ptr+len)`: private anonymous memory, readable and writable, page
    /// aligned, not overlapping another registration (checked against `/proc/self/maps`; the
    /// error says what is wrong). Populating starts at the next pass. The returned
    /// [`Registration`] ends it when dropped, after any populate in flight there.
    pub fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        policy: Policy,
    ) -> Result<Registration, Error> {
        check_args(ptr as usize, len, &policy)?;
        os::check_mapping(ptr as usize, len)?;
        let raw = self.register_trusted(ptr, len, policy)?;
        Ok(Registration {
            shared: self.shared().clone(),
            raw,
        })
    }

    /// Maps `len` bytes of private anonymous read-write memory and registers them: POE's entry
    /// point (the paper builds its page-table paths at mmap). The range needs no
    /// `PROCMAP_QUERY` check, since it was just mapped here, so this is `register`'s cost less
    /// ~1-3.5 µs. `policy.thp` `On` advises `MADV_HUGEPAGE`, `Off` `MADV_NOHUGEPAGE`, `Auto`
    /// leaves the system's setting. The mapping is unregistered and unmapped when the returned
    /// [`Mapped`] drops.
    pub fn map(&self, len: usize, policy: Policy) -> Result<Mapped, Error> {
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(format!(
                "length {len}: a positive multiple of 4096"
            )));
        }
        policy.validate().map_err(Error::InvalidArgument)?;
        // SAFETY: a new anonymous private mapping at an address of the kernel's choosing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Os(format!(
                "mmap of {len} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut m = Mapped {
            ptr: p as *mut u8,
            len,
            reg: None,
        };
        let advice = match policy.thp {
            Thp::On => Some(libc::MADV_HUGEPAGE),
            Thp::Off => Some(libc::MADV_NOHUGEPAGE),
            Thp::Auto => None,
        };
        if let Some(a) = advice {
            // SAFETY: advice on the mapping made above. (A kernel without THP refuses it:
            // harmless, the region then has 4 KiB pages.)
            unsafe { libc::madvise(p, len, a) };
        }
        let raw = self.register_trusted(m.ptr, len, policy)?;
        m.reg = Some(Registration {
            shared: self.shared().clone(),
            raw,
        });
        Ok(m)
    }

    /// Registers a `tiermem-fault` engine region (MISSING mode): filled ahead with
    /// `RegionHandle::install` (zeroed pages; policy `Write`) or `install_zero` (`Read`), never
    /// madvise (which would fault into the engine). The service keeps the handle alive until
    /// the registration ends.
    pub fn register_engine(
        &self,
        region: Arc<RegionHandle>,
        policy: Policy,
    ) -> Result<Registration, Error> {
        let (base, len) = (region.base() as usize, region.len());
        check_args(base, len, &policy)?;
        if !region.is_alive() {
            return Err(Error::BadRange("the engine region is unregistered".into()));
        }
        if !region.modes().missing {
            return Err(Error::BadRange(
                "the engine region is not registered for MISSING faults: install needs them".into(),
            ));
        }
        let mut engines = self
            .shared()
            .engines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (slot, gen) = self.shared().table.claim(base, len, policy.pack(), 1)?;
        engines[slot as usize] = Some(region);
        drop(engines);
        self.shared().wake();
        Ok(Registration {
            shared: self.shared().clone(),
            raw: RawRegistration { slot, gen },
        })
    }

    /// Registers without reading `/proc/self/maps` and without allocating: for a caller that
    /// knows the range is private anonymous read-write memory (the preload library, right
    /// after its own `mmap`). Alignment, length, policy and overlap are still checked.
    /// Pair with [`Service::unregister_raw`] or [`Service::unregister_range`].
    pub fn register_trusted(
        &self,
        ptr: *mut u8,
        len: usize,
        policy: Policy,
    ) -> Result<RawRegistration, Error> {
        check_args(ptr as usize, len, &policy)?;
        let (slot, gen) = self
            .shared()
            .table
            .claim(ptr as usize, len, policy.pack(), 0)?;
        // Wake the service only when it has something to do at once: an `Auto` region needs a
        // footprint first, which the next pass (≤ `interval`) sees. Waking a sleeping thread on
        // another vCPU is an inter-processor interrupt, tens of µs on a VM, on the caller's
        // path — the mmap hook's, for the preload library.
        // Nor is it woken for an `Auto` region while it runs its passes; but in a long sleep
        // (nothing else registered, or all idle) it would not look for up to a second.
        if policy.order != Order::Auto || self.shared().long_sleep.load(SeqCst) {
            self.shared().wake();
        }
        Ok(RawRegistration { slot, gen })
    }

    /// Ends a raw registration; returns after any populate in flight in it. No-op when it
    /// already ended.
    pub fn unregister_raw(&self, r: RawRegistration) {
        release(self.shared(), r);
    }

    /// Ends every registration overlapping `[addr, addr+len)` (call it *before* munmap,
    /// mremap, MADV_DONTNEED or a MAP_FIXED mapping over the range); returns how many. No lock,
    /// no allocation.
    pub fn unregister_range(&self, addr: *mut u8, len: usize) -> usize {
        self.shared().table.release_range(addr as usize, len)
    }

    /// Moves a raw registration's frontier to `offset` (bytes from its start).
    pub fn hint_raw(&self, r: RawRegistration, offset: usize, len: usize) {
        hint(self.shared(), r, offset, len);
    }

    /// A raw registration's figures (`None` when it ended).
    pub fn region_stats_raw(&self, r: RawRegistration) -> Option<RegionStats> {
        region_stats(self.shared(), r)
    }

    /// In a child after `fork`: the service thread does not exist there; mark every populate
    /// as finished so that unregistering never waits, and stop serving. Call from a
    /// `pthread_atfork` child handler (async-signal-safe: atomics only).
    pub fn after_fork_child(&self) {
        self.shared().table.after_fork_child();
        self.shared().running.store(false, SeqCst);
    }

    /// Whether the service thread serves this process (false in a forked child, or stopped).
    pub fn is_running(&self) -> bool {
        self.shared().running.load(SeqCst) && !self.shared().stop.load(SeqCst)
    }

    /// The service thread's kernel thread id (`gettid`), for reading its figures in
    /// `/proc/self/task/<tid>/`: `None` until the thread has started, and once it is not
    /// running (stopped, or in a forked child, where the thread does not exist).
    pub fn thread_id(&self) -> Option<i32> {
        let tid = self.shared().tid.load(SeqCst);
        (tid != 0 && self.is_running()).then_some(tid)
    }

    /// The service's figures.
    pub fn stats(&self) -> Stats {
        let s = self.shared();
        let regions = (0..s.table.high.load(SeqCst))
            .filter(|&i| s.table.slots[i].state.load(SeqCst) == LIVE)
            .count();
        Stats {
            regions,
            passes: s.passes.load(Relaxed),
            populate_calls: s.calls.load(Relaxed),
            populated_bytes: s.populated.load(Relaxed),
            tripwire_hits: s.hits.load(Relaxed),
            footprint_pages: s.footprint.load(Relaxed),
            unused_bytes: s.unused.load(Relaxed),
            peak_unused_bytes: s.peak_unused.load(Relaxed),
            budget_bytes: s.opts.budget_bytes as u64,
            backoffs: s.backoffs.load(Relaxed),
            starved_passes: s.starved.load(Relaxed),
            cpu_hops: s.hops.load(Relaxed),
            failures: s.failures.load(Relaxed),
            // The thread's clock while it runs (skipped passes store nothing); the last
            // stored figure once it has stopped.
            service_cpu: s
                .running
                .load(SeqCst)
                .then(|| os::cpu_of_thread(s.tid.load(SeqCst)))
                .flatten()
                .unwrap_or(Duration::from_nanos(s.cpu_ns.load(Relaxed))),
            sched_idle: s.idle.load(Relaxed),
            sensing: if s.pagemap_scan.load(Relaxed) {
                "PAGEMAP_SCAN"
            } else {
                "mincore"
            },
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> &Options {
        &self.shared().opts
    }

    /// Stops the thread now (registrations stay valid and inert). Idempotent.
    pub fn stop(&self) {
        self.shared().stop.store(true, SeqCst);
        self.shared().wake();
        let j = self
            .inner
            .join
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(j) = j {
            let _ = j.join();
        }
    }
}

fn check_args(base: usize, len: usize, policy: &Policy) -> Result<(), Error> {
    policy.validate().map_err(Error::InvalidArgument)?;
    if base == 0 || base % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 {
        return Err(Error::InvalidArgument(format!(
            "{base:#x} + {len}: start and length must be multiples of 4096"
        )));
    }
    if len == 0 {
        return Err(Error::InvalidArgument("zero-length range".into()));
    }
    if base.checked_add(len).is_none() {
        return Err(Error::InvalidArgument("range wraps around".into()));
    }
    Ok(())
}

fn release(s: &Shared, r: RawRegistration) {
    if s.table.release(r.slot, r.gen) {
        let e = s.table.slots[r.slot as usize].engine.load(SeqCst);
        if e != 0 {
            s.engines.lock().unwrap_or_else(|e| e.into_inner())[r.slot as usize] = None;
        }
    }
}

fn hint(s: &Shared, r: RawRegistration, offset: usize, len: usize) {
    let slot = &s.table.slots[r.slot as usize];
    if slot.gen.load(SeqCst) != r.gen {
        return;
    }
    let page = (offset / PAGE_SIZE) as u64;
    let pages = len.div_ceil(PAGE_SIZE).min(u32::MAX as usize) as u64;
    slot.hint.store((page + 1) << 32 | pages, SeqCst);
    s.wake();
}

fn region_stats(s: &Shared, r: RawRegistration) -> Option<RegionStats> {
    let slot = &s.table.slots[r.slot as usize];
    if slot.gen.load(SeqCst) != r.gen || slot.state.load(SeqCst) != LIVE {
        return None;
    }
    let learned = slot.learned.load(SeqCst);
    Some(RegionStats {
        populated_bytes: slot.populated_bytes.load(Relaxed),
        calls: slot.calls.load(Relaxed),
        hits: slot.hits.load(Relaxed),
        failures: slot.failures.load(Relaxed),
        last_errno: slot.last_errno.load(Relaxed) as i32,
        order: match learned & 0xff {
            1 => Order::Ascending,
            2 => Order::Descending,
            3 => Order::Stride,
            4 => Order::Whole,
            _ => Order::Auto,
        },
        stride: if learned & 0xff == 3 {
            (learned >> 8) as usize
        } else {
            0
        },
    })
}

/// A raw registration: slot and generation, `Copy`, no destructor (the preload library and
/// the C ABI keep these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRegistration {
    slot: u32,
    gen: u32,
}

impl RawRegistration {
    /// As one word (for the C ABI): generation << 32 | slot.
    pub fn to_u64(self) -> u64 {
        (self.gen as u64) << 32 | self.slot as u64
    }
    /// The inverse of [`RawRegistration::to_u64`]; `None` for a slot out of range.
    pub fn from_u64(w: u64) -> Option<RawRegistration> {
        let slot = w as u32;
        ((slot as usize) < MAX_SLOTS).then_some(RawRegistration {
            slot,
            gen: (w >> 32) as u32,
        })
    }
}

/// A registered region. Dropping it ends the registration: it waits for a populate in flight
/// in the range (one call, ≤ 256 KiB or one huge page) and nothing is populated there after.
pub struct Registration {
    shared: Arc<Shared>,
    raw: RawRegistration,
}

impl Registration {
    /// Moves the frontier: the application will next touch `[offset, offset+len)` (bytes from
    /// the region's start), in the region's order from there.
    pub fn hint(&self, offset: usize, len: usize) {
        hint(&self.shared, self.raw, offset, len);
    }

    /// This region's figures.
    pub fn stats(&self) -> RegionStats {
        region_stats(&self.shared, self.raw).unwrap_or_default()
    }

    /// The raw handle (valid while this registration lives).
    pub fn raw(&self) -> RawRegistration {
        self.raw
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        release(&self.shared, self.raw);
    }
}

/// Memory from [`Service::map`]: registered while it lives; dropping it ends the registration
/// (waiting for a populate in flight) and then unmaps the range.
pub struct Mapped {
    ptr: *mut u8,
    len: usize,
    reg: Option<Registration>,
}

// SAFETY: `Mapped` owns its mapping as a `Vec` owns its buffer; the registration is Send + Sync.
unsafe impl Send for Mapped {}
// SAFETY: shared access hands out only the address and the registration's figures.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// The mapping's first byte (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The registration (hints, figures).
    pub fn registration(&self) -> &Registration {
        self.reg
            .as_ref()
            .expect("a Mapped is registered until it drops")
    }

    /// Gives up ownership (the C ABI's tokens): the address, the length and the raw
    /// registration, which the caller ends with [`Service::unregister_raw`] or
    /// [`Service::unregister_range`] before it unmaps the range.
    pub fn into_raw(mut self) -> (*mut u8, usize, RawRegistration) {
        let reg = self
            .reg
            .take()
            .expect("a Mapped is registered until it drops");
        let raw = reg.raw;
        // The registration stays: only its handle on the service is released.
        let reg = std::mem::ManuallyDrop::new(reg);
        // SAFETY: `reg` is never used or dropped again; its Arc is released exactly once.
        drop(unsafe { std::ptr::read(&reg.shared) });
        let (ptr, len) = (self.ptr, self.len);
        std::mem::forget(self);
        (ptr, len, raw)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // The registration first: nothing may be populated at an address the kernel may reuse.
        drop(self.reg.take());
        // SAFETY: the mapping made by `Service::map`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Fork safety: a child has no service thread, but its copy of a registration table may say a
/// populate was in flight (`busy`) at the fork, and an unregistering hook would wait for it
/// forever. A `pthread_atfork` child handler, installed once, marks every running service of
/// the child as stopped and idle. The services are found through a fixed array of pointers
/// (no lock: the child may not take a lock another thread of the parent held at the fork).
mod fork {
    use super::Shared;
    use std::sync::atomic::{AtomicPtr, Ordering::SeqCst};
    use std::sync::{Arc, Once};

    const MAX: usize = 64;
    static SERVICES: [AtomicPtr<Shared>; MAX] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX];
    static INSTALL: Once = Once::new();

    extern "C" fn child() {
        for p in SERVICES.iter() {
            let p = p.load(SeqCst);
            if !p.is_null() {
                // SAFETY: a tracked pointer is a live Arc<Shared> (untracked before the last
                // reference goes); the child's memory is a copy of the parent's.
                let s = unsafe { &*p };
                s.table.after_fork_child();
                s.running.store(false, SeqCst);
            }
        }
    }

    pub(super) fn track(s: &Arc<Shared>) {
        INSTALL.call_once(|| {
            // SAFETY: registering a plain function as the child handler.
            unsafe { libc::pthread_atfork(None, None, Some(child)) };
        });
        let p = Arc::as_ptr(s) as *mut Shared;
        for slot in SERVICES.iter() {
            if slot
                .compare_exchange(std::ptr::null_mut(), p, SeqCst, SeqCst)
                .is_ok()
            {
                return;
            }
        }
        // More than 64 services at once: forks of this process are not covered for the rest.
    }

    pub(super) fn untrack(s: &Arc<Shared>) {
        let p = Arc::as_ptr(s) as *mut Shared;
        for slot in SERVICES.iter() {
            let _ = slot.compare_exchange(p, std::ptr::null_mut(), SeqCst, SeqCst);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the service thread
// ---------------------------------------------------------------------------------------------

struct Local {
    gen: u32,
    base: usize,
    engine: Option<Arc<RegionHandle>>,
    win: Window,
    failed: bool,
    /// When the service first saw it: a region still learning its order is sensed at the
    /// shortest interval for its first 100 ms, so the application faults less before the
    /// service knows where to go.
    born: Instant,
}

/// Sleeps until the next pass: one `interval`, or `due` intervals (a region's next pass, or
/// [`MAX_SKIP`] with none) once nothing happened for [`QUIET_BEFORE_LONG_SLEEP`], woken by a
/// registration then (see `Shared::long_sleep`). Returns the passes skipped besides the next.
///
/// Why not always the long sleep: a registration during one wakes the thread on the
/// registering thread's path (a futex wake, ~2.7 µs here, a quarter of a fresh mapping's time
/// to first touch), which a process that registers now and then should not pay each time.
fn nap(s: &Shared, interval: Duration, due: u64, changes: u64, quiet_since: &mut Instant) -> u64 {
    if s.table.changes.load(SeqCst) != changes || due <= 1 {
        *quiet_since = Instant::now();
    }
    if due <= 1 || quiet_since.elapsed() < QUIET_BEFORE_LONG_SLEEP {
        std::thread::park_timeout(interval);
        return 0;
    }
    // Published before the check of table changes: a registration then wakes it (the counter
    // and the flag are SeqCst: either the claim is seen here or the flag is seen by the
    // registering thread).
    s.long_sleep.store(true, SeqCst);
    let mut skipped = 0;
    if s.table.changes.load(SeqCst) == changes {
        let t = Instant::now();
        std::thread::park_timeout(interval * due as u32);
        // Whole intervals slept count as passes skipped.
        let slept = (t.elapsed().as_nanos() / interval.as_nanos().max(1)).min(due as u128) as u64;
        skipped = slept.saturating_sub(1);
    }
    s.long_sleep.store(false, SeqCst);
    skipped
}

/// Passes from `pass` until region `l` is sensed (0: at `pass`): every pass, unless it has
/// been idle for more than 8 passes, then every 2nd, 4th, … up to every 32nd.
fn passes_until_sensed(l: &Local, pass: u64) -> u64 {
    let idle_passes = l.win.idle_passes;
    if idle_passes <= 8 {
        return 0;
    }
    let every = 1u64 << (idle_passes - 8).min(5);
    (every - pass % every) % every
}

/// How long the service keeps its passes at `interval` after the last registration or the
/// last region sensed at every pass, before it sleeps until a region is due (see `run`).
const QUIET_BEFORE_LONG_SLEEP: Duration = Duration::from_millis(20);

/// The longest sleep, in intervals, with no region due (nothing live): new registrations
/// wake the thread (see `Shared::long_sleep`); this bounds the cost of a missed wake-up.
const MAX_SKIP: u64 = 500;

/// How long a new region still learning keeps the passes at `min_interval`.
const LEARNING_FAST: Duration = Duration::from_millis(100);

fn run(s: Arc<Shared>) {
    // SAFETY: gettid has no preconditions.
    s.tid.store(unsafe { libc::gettid() }, SeqCst);
    let idle = s.opts.sched_idle && os::set_sched_idle();
    s.idle.store(idle, Relaxed);
    let mut presence = Presence::new();
    s.pagemap_scan.store(presence.uses_pagemap_scan(), Relaxed);
    let memcg = Memcg::of_self();
    // Grown to the table's high mark as slots get used (1,024 × 240 bytes up front were ~60
    // page faults at every start and a munmap at every exit).
    let mut locals: Vec<Option<Local>> = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    let mut zeros: Vec<u8> = Vec::new();
    let mut interval = s.opts.interval;
    let mut pass: u64 = 0;
    let mut memcg_check = Instant::now() - Duration::from_secs(1);
    let mut memcg_limited = memcg.as_ref().map_or(false, |m| m.room().is_some());
    // Starvation (SCHED_IDLE only: at normal priority the thread takes its share of busy
    // cores, as asked): the run-queue wait since the thread went to sleep.
    let mut delay = RunDelay::open();
    let mut slept = if idle { delay.mark() } else { 0 };
    let mut level = 0u32;
    let mut quiet_since = Instant::now();
    // Whether the last pass had a region: with none and no registration since, a pass has
    // nothing to do and is skipped (no run-queue or CPU clock reads: an empty table cost
    // ~28 µs of CPU per 2 ms interval, 1.4 % of a core).
    let mut any_live = false;
    let mut last_changes = u64::MAX;
    while !s.stop.load(SeqCst) {
        pass += 1;
        let changes = s.table.changes.load(SeqCst);
        if !any_live && changes == last_changes {
            // A look at an empty table counts as a pass (what callers waiting for passes want:
            // the service has seen the table as it is now).
            s.passes.fetch_add(1, Relaxed);
            pass += nap(&s, interval, MAX_SKIP, changes, &mut quiet_since);
            continue;
        }
        if changes != last_changes {
            // A registration or an ended one: not quiet.
            quiet_since = Instant::now();
        }
        last_changes = changes;
        // One schedstat read at each end of a pass (each is a procfs read, ~2-3 µs here): the
        // mark that starts the pass also ends the sleep before it.
        let start = if idle { delay.mark() } else { 0 };
        let waited = if idle && delay.exact() {
            Duration::from_nanos(start.saturating_sub(slept))
        } else {
            Duration::ZERO
        };
        // A pass cannot have waited longer than it lasted: the clock first, schedstat only
        // once the pass is that long.
        let began = Instant::now();
        let starving = |d: &RunDelay| {
            idle && began.elapsed() > busy::STARVED && d.since(start) > busy::STARVED
        };
        let mut cut = false;
        let mut sensed_regions = 0u32;
        s.passes.fetch_add(1, Relaxed);
        // Follow the table.
        let high = s.table.high.load(SeqCst);
        if locals.len() < high {
            locals.resize_with(high, || None);
        }
        for (i, local) in locals.iter_mut().enumerate().take(high) {
            let slot = &s.table.slots[i];
            let state = slot.state.load(SeqCst);
            let gen = slot.gen.load(SeqCst);
            let current = matches!(local, Some(l) if l.gen == gen);
            if state == LIVE && !current {
                let base = slot.base.load(SeqCst);
                let len = slot.len.load(SeqCst);
                let policy = Policy::unpack(slot.policy.load(SeqCst));
                let engine = if slot.engine.load(SeqCst) != 0 {
                    s.engines.lock().unwrap_or_else(|e| e.into_inner())[i].clone()
                } else {
                    None
                };
                if slot.engine.load(SeqCst) != 0 && engine.is_none() {
                    continue; // published before its handle: next pass
                }
                *local = Some(Local {
                    gen,
                    base,
                    engine,
                    win: Window::new(base, len, policy),
                    failed: false,
                    born: Instant::now(),
                });
            } else if state != LIVE && local.is_some() {
                *local = None;
            }
        }
        // The memory cgroup's room (re-read whether it is limited every second).
        if memcg_check.elapsed() > Duration::from_secs(1) {
            memcg_limited = memcg.as_ref().map_or(false, |m| m.room().is_some());
            memcg_check = Instant::now();
        }
        let mut room: Option<u64> = if memcg_limited {
            memcg.as_ref().and_then(|m| m.room())
        } else {
            None
        };
        let mut backoff = false;
        let mut total_unused: usize = locals
            .iter()
            .take(high)
            .flatten()
            .map(|l| l.win.unused_pages + l.win.stranded_pages)
            .sum();
        let mut active = false;
        for (i, l) in locals.iter_mut().enumerate().take(high) {
            let Some(l) = l.as_mut() else { continue };
            if l.win.mode == Mode::Learning && !l.failed && l.born.elapsed() < LEARNING_FAST {
                active = true;
            }
            if l.failed {
                continue;
            }
            sensed_regions += 1;
            if sensed_regions % 16 == 0 && starving(&delay) {
                // Waited for busy cores: stop here, runnable no longer.
                cut = true;
                break;
            }
            // Idle regions are sensed less often (up to every 32nd pass).
            if passes_until_sensed(l, pass) != 0 {
                continue;
            }
            let slot = &s.table.slots[i];
            let h = slot.hint.swap(0, SeqCst);
            if h != 0 {
                l.win.hint(((h >> 32) - 1) as usize);
                l.win.idle_passes = 0;
            }
            let (lo, hi) = l.win.scan_range();
            if hi > lo {
                if let Err(e) =
                    presence.scan(l.base + lo * PAGE_SIZE, (hi - lo) * PAGE_SIZE, &mut runs)
                {
                    slot.failures.fetch_add(1, Relaxed);
                    slot.last_errno.store(e as u32, Relaxed);
                    l.failed = true;
                    continue;
                }
            } else {
                runs.clear();
            }
            let before = l.win.unused_pages + l.win.stranded_pages;
            let sensed = l.win.sense(&runs, (lo, hi));
            total_unused = total_unused + (l.win.unused_pages + l.win.stranded_pages) - before;
            if sensed.hits > 0 || (sensed.footprint > 0 && l.win.mode == Mode::Learning) {
                active = true;
            }
            if sensed.hits > 0 || sensed.footprint > 0 {
                slot.hits.fetch_add(sensed.hits, Relaxed);
                s.hits.fetch_add(sensed.hits, Relaxed);
                s.footprint.fetch_add(sensed.footprint, Relaxed);
            }
            slot.learned.store(l.win.mode.packed(), Relaxed);
            // Refill.
            while l.win.wants_more() && !backoff {
                let budget_pages = (s.opts.budget_bytes / PAGE_SIZE).saturating_sub(total_unused);
                let Some((_call, list)) = l.win.plan(budget_pages) else {
                    break;
                };
                let bytes = (list.len() * PAGE_SIZE) as u64;
                if let Some(r) = room {
                    if r < s.opts.memcg_headroom_bytes as u64 + bytes {
                        l.win.undo(&list);
                        backoff = true;
                        break;
                    }
                }
                if !s.table.enter(i, l.gen) {
                    l.win.undo(&list);
                    l.failed = true;
                    break;
                }
                let write = !l.win.populate_read;
                let r = populate_list(&s, l, &list, write, &mut zeros);
                s.table.leave(i);
                if r.is_ok() && starving(&delay) {
                    cut = true;
                }
                match r {
                    Ok(calls) => {
                        // Work done: keep this region sensed, and passes short.
                        active = true;
                        l.win.idle_passes = 0;
                        slot.calls.fetch_add(calls, Relaxed);
                        total_unused += list.len();
                        room = room.map(|r| r.saturating_sub(bytes));
                        slot.populated_bytes.fetch_add(bytes, Relaxed);
                        s.populated.fetch_add(bytes, Relaxed);
                        if cut {
                            break;
                        }
                    }
                    Err(e) => {
                        l.win.undo(&list);
                        slot.failures.fetch_add(1, Relaxed);
                        slot.last_errno.store(e as u32, Relaxed);
                        s.failures.fetch_add(1, Relaxed);
                        if e == libc::ENOMEM && l.engine.is_none() {
                            // Out of memory (or unmapped under us): back off this pass.
                            backoff = true;
                        } else {
                            l.failed = true;
                        }
                        break;
                    }
                }
            }
            if l.win.mode == Mode::Learning {
                slot.learned.store(0, Relaxed);
            }
            if cut {
                break;
            }
        }
        if backoff {
            s.backoffs.fetch_add(1, Relaxed);
        }
        let unused = (total_unused * PAGE_SIZE) as u64;
        s.unused.store(unused, Relaxed);
        s.peak_unused.fetch_max(unused, Relaxed);
        s.cpu_ns.store(os::thread_cpu().as_nanos() as u64, Relaxed);
        if s.opts.adaptive {
            interval = if active {
                (interval / 4).max(s.opts.min_interval)
            } else {
                (interval * 2).min(s.opts.interval)
            };
        }
        // The cores are busy: sleep PAUSE_PER_WAIT times as long as this pass waited on a
        // run queue (with the wait for it), deaf to wake-ups (registrations, hints) until
        // then, so that the thread is runnable at most ~1/20 of the time; but no longer than
        // 2^level intervals, the level rising with each starved pass and falling with each
        // that did not wait, so that one long wait (a new thread not yet moved to an idle
        // core) does not put the service to sleep for a second. The adaptive interval again
        // after a pass that did not wait.
        let end = if idle && delay.exact() {
            delay.mark()
        } else {
            0
        };
        let wait = waited
            + if idle && delay.exact() {
                Duration::from_nanos(end.saturating_sub(start))
            } else if idle {
                delay.since(start)
            } else {
                Duration::ZERO
            };
        let starved = cut || wait > busy::STARVED;
        if starved {
            s.starved.fetch_add(1, Relaxed);
        }
        // The first starved pass after one that was not: the thread may be queued behind an
        // application thread on one CPU while another idles. The kernel's idle balancing takes
        // milliseconds to pull a SCHED_IDLE thread (weight 3) over, and its timer fires, and
        // wakes it, on the busy CPU again, so the pause below would keep it there: pass after
        // pass starved, the window overtaken (the microbenchmark's worker did 15 passes in
        // 110 ms, 5 of them starved, and 80 % of its touches faulted; 250 passes and 30 %
        // with the hop). It moves itself instead and runs its next pass on time; if that one
        // is starved too (every CPU busy), it pauses as below (`level` 1: no hop back).
        let hopped = starved && level == 0 && os::hop_off_this_cpu();
        if hopped {
            s.hops.fetch_add(1, Relaxed);
        }
        if starved && !hopped {
            interval = s.opts.interval;
            level = (level + 1).min(busy::MAX_LEVEL);
            let pause = (wait * busy::PAUSE_PER_WAIT)
                .min(s.opts.interval * (1 << level))
                .min(busy::MAX_PAUSE)
                .max(s.opts.interval);
            let until = Instant::now() + pause;
            slept = if delay.exact() { end } else { delay.mark() };
            loop {
                let now = Instant::now();
                if s.stop.load(SeqCst) || now >= until {
                    break;
                }
                std::thread::park_timeout(until - now);
            }
        } else {
            level = if hopped { 1 } else { level.saturating_sub(1) };
            if idle {
                slept = if delay.exact() { end } else { delay.mark() };
            }
            // Passes until a region is due: 1 while any is sensed every pass; the next pass
            // of an idle region's schedule when all are idle; none live, a long sleep (see
            // `nap`). An idle process then costs a wake-up per idle region's schedule, not
            // every interval (on this VM, 94 passes of an empty table took 5 ms of CPU in
            // 0.2 s).
            let due = locals
                .iter()
                .take(high)
                .flatten()
                .filter(|l| !l.failed)
                .map(|l| 1 + passes_until_sensed(l, pass + 1))
                .min()
                .unwrap_or(MAX_SKIP);
            pass += nap(&s, interval, due, changes, &mut quiet_since);
        }
        any_live = locals.iter().take(high).any(Option::is_some);
    }
    s.cpu_ns.store(os::thread_cpu().as_nanos() as u64, Relaxed);
    s.running.store(false, SeqCst);
}

/// Populates the pages of `list` (region page indices, ascending), one call per contiguous
/// run, each at most `max_call_bytes` (a 2 MiB unit is one call).
fn populate_list(
    s: &Shared,
    l: &Local,
    list: &[usize],
    write: bool,
    zeros: &mut Vec<u8>,
) -> Result<u64, i32> {
    let mut calls = 0;
    let max_pages = if l.win.thp {
        crate::window::UNIT
    } else {
        (s.opts.max_call_bytes / PAGE_SIZE).max(1)
    };
    let mut i = 0;
    while i < list.len() {
        let mut j = i + 1;
        while j < list.len() && list[j] == list[j - 1] + 1 && j - i < max_pages {
            j += 1;
        }
        let (first, pages) = (list[i], j - i);
        s.calls.fetch_add(1, Relaxed);
        calls += 1;
        match &l.engine {
            None => os::populate(l.base + first * PAGE_SIZE, pages * PAGE_SIZE, write)?,
            Some(region) => {
                let len = pages * PAGE_SIZE;
                let r = if write {
                    if zeros.len() < len {
                        zeros.resize(len, 0);
                    }
                    region.install(first * PAGE_SIZE, &zeros[..len])
                } else {
                    region.install_zero(first * PAGE_SIZE, len)
                };
                if let Err(e) = r {
                    return Err(match e {
                        tiermem_fault::Error::Syscall { source, .. } => {
                            source.raw_os_error().unwrap_or(libc::EIO)
                        }
                        _ => libc::EINVAL,
                    });
                }
            }
        }
        i = j;
    }
    Ok(calls)
}
