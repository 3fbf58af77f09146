//! The process-global fault engine: userfaultfd contexts, the SIGBUS (in-thread) path and the
//! runtime thread (handler-thread path and non-cooperative events).
//!
//! Shape (after Firecracker's uffd handlers and CRIU's `uffd.c`): one runtime, one small policy
//! ([`Resolver`]) per region, one event switch (`Runtime::dispatch`).
//!
//! # Contexts
//! A VMA can be registered with only one userfaultfd, and features are fixed per fd, so the engine
//! keeps one context per configuration, created lazily:
//!
//! | key | features |
//! |---|---|
//! | in-thread | SIGBUS + REMOVE/UNMAP/REMAP events (never FORK) |
//! | in-thread, wp_async | the same + WP_ASYNC |
//! | handler | THREAD_ID + FORK/REMOVE/UNMAP/REMAP events |
//! | handler, wp_async | the same + WP_ASYNC |
//!
//! plus MISSING_SHMEM, MINOR_SHMEM, WP_HUGETLBFS_SHMEM, MOVE, POISON wherever the kernel offers
//! them. WP_UNPOPULATED only comes with WP_ASYNC: elsewhere WP on anonymous memory protects the
//! populated pages only (classic semantics), because with uffd-wp PTE markers a MISSING+WP
//! region's holes become markers and UFFDIO_ZEROPAGE refuses them with EEXIST (UFFDIO_COPY
//! accepts them). Every context requests events, so the runtime thread polls all of them:
//! the kernel makes `munmap`/`madvise`/`mremap`/`fork` wait until the event has been *read*, so
//! an unread event would block the caller forever. The runtime thread therefore starts with the
//! first registration and never stops.
//!
//! # Caveats
//! * Resolvers and `on_event` callbacks must not `munmap`, `madvise(MADV_DONTNEED)` or `mremap`
//!   registered memory, nor fork: the runtime thread would wait for itself to read the event.
//!   Other threads may fork at any time: `fork_guard` parks the runtime at a point where it
//!   does not allocate while glibc's fork holds the malloc locks.
//! * Unregistering a region from inside its own resolver deadlocks (it waits for in-flight
//!   resolutions of that region to finish).

use crate::error::{Error, ResolveError, Result};
use crate::fork_guard;
use crate::policy::{Fault, FaultKind, FaultOps, RegionEvent, Resolver};
use crate::region::{self, ForkPolicy, Modes, RegionInner, RegionSpec, Resolution};
use crate::sig::{Chain, StackBuf};
use crate::sys::{self, *};
use parking_lot::Mutex;
use std::cell::Cell;
use std::fmt::Write as _;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// One userfaultfd context of the engine.
pub(crate) struct Ctx {
    pub(crate) uffd: Uffd,
    pub(crate) in_thread: bool,
    pub(crate) wp_async: bool,
}

struct State {
    contexts: Vec<Arc<Ctx>>,
    next_id: u64,
    runtime_started: bool,
}

#[derive(Default)]
struct Stats {
    faults_in_thread: AtomicU64,
    faults_handler: AtomicU64,
    faults_child: AtomicU64,
    events_remove: AtomicU64,
    events_unmap: AtomicU64,
    events_remap: AtomicU64,
    events_fork: AtomicU64,
    resolve_errors: AtomicU64,
    stray_faults: AtomicU64,
    children_live: AtomicU64,
}

/// Counters of the engine since process start (see [`Engine::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Faults resolved in the faulting thread (SIGBUS path).
    pub faults_in_thread: u64,
    /// Faults resolved by the runtime thread for this process.
    pub faults_handler_thread: u64,
    /// Faults resolved by the runtime thread for forked children.
    pub faults_child: u64,
    /// UFFD_EVENT_REMOVE seen.
    pub events_remove: u64,
    /// UFFD_EVENT_UNMAP seen.
    pub events_unmap: u64,
    /// UFFD_EVENT_REMAP seen.
    pub events_remap: u64,
    /// UFFD_EVENT_FORK seen.
    pub events_fork: u64,
    /// Resolver failures (each one crashed the faulting access).
    pub resolve_errors: u64,
    /// Fault messages for addresses no region claims (stale messages; woken and ignored).
    pub stray_faults: u64,
    /// Forked children whose faults the runtime currently serves.
    pub children_live: u64,
    /// Registered regions.
    pub regions: u64,
    /// Open userfaultfd contexts of this process.
    pub contexts: u64,
}

/// The process-global fault engine. Obtain it with [`Engine::global`].
pub struct Engine {
    state: Mutex<State>,
    stats: Stats,
    /// Bumped whenever the parent-context list changes; the runtime re-reads it.
    gen: AtomicU64,
    /// eventfd that wakes the runtime thread (-1 before it starts).
    wake_fd: AtomicI32,
    features: OnceLock<UffdFeatures>,
    regions: AtomicU64,
    /// Process that created the engine: a forked child inherits this memory but not the runtime
    /// thread, and its copies of the contexts belong to the parent's address space.
    pid: u32,
}

static ENGINE: OnceLock<Engine> = OnceLock::new();
static SIGBUS_CHAIN: Chain = Chain::new();
static SIGBUS_INSTALLED: AtomicBool = AtomicBool::new(false);

/// A program's `sigaction(SIGBUS, act, oldact)` seen by a preload library: while the engine's
/// SIGBUS handler is installed, `act` becomes the handler the engine forwards faults that are
/// not its own to, and `oldact` gets the previous one ([`Chain::replace_prev`]); the engine's
/// handler stays. Returns false, having done nothing, before the engine installed its handler
/// (the caller then calls the real `sigaction`, and the engine chains to it when it installs).
///
/// # Safety
/// `act` and `oldact` are NULL or valid, as for `sigaction(2)`.
pub unsafe fn interpose_sigbus(act: *const libc::sigaction, oldact: *mut libc::sigaction) -> bool {
    // SAFETY: forwarded contract.
    unsafe { SIGBUS_CHAIN.replace_prev(act, oldact) }
}
/// True while the runtime thread is reading or dispatching messages. The kernel lets
/// `mremap`/`munmap` return as soon as their event has been *read*, before the runtime has
/// updated the region table; an in-thread fault at a just-moved address that misses the table
/// waits for this flag to drop and looks again before treating the address as foreign.
static RT_BUSY: AtomicBool = AtomicBool::new(false);

/// Waits (yielding, at most about a million times) while the runtime thread is reading or
/// dispatching events. `madvise(MADV_DONTNEED)`, `munmap` and `mremap` return as soon as their
/// event has been *read*, before [`Resolver::on_event`] has run, so the calling thread can fault
/// on the range while the resolver still holds its old state. An in-thread resolver that would
/// act on state an event changes (e.g. page an evicted page back in over a program's drop) calls
/// this first, before it claims anything an `on_event` might wait for. Async-signal-safe; one
/// atomic load when no event is in flight.
pub fn wait_for_event_dispatch() {
    let mut n = 0u32;
    while RT_BUSY.load(Ordering::SeqCst) && n < 1_000_000 {
        n += 1;
        // SAFETY: sched_yield is async-signal-safe.
        unsafe { libc::sched_yield() };
    }
}

/// A registered region. Unregisters on drop.
pub struct RegionHandle {
    region: Arc<RegionInner>,
}

impl std::fmt::Debug for RegionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionHandle")
            .field("id", &self.region.id)
            .field("base", &self.base())
            .field("len", &self.len())
            .field("resolution", &self.region.resolution)
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl RegionHandle {
    /// Engine-unique id of the region.
    pub fn id(&self) -> u64 {
        self.region.id
    }
    /// Where this region's faults are resolved.
    pub fn resolution(&self) -> Resolution {
        self.region.resolution
    }
    /// Registered modes.
    pub fn modes(&self) -> Modes {
        self.region.modes
    }
    /// Current base address (changes after `mremap`); null once the region is gone.
    pub fn base(&self) -> *mut u8 {
        if self.is_alive() {
            region::slot_range(self.region.slot).0 as *mut u8
        } else {
            std::ptr::null_mut()
        }
    }
    /// Current length in bytes (0 once the region is gone).
    pub fn len(&self) -> usize {
        if self.is_alive() {
            region::slot_range(self.region.slot).1
        } else {
            0
        }
    }
    /// True when the region has no bytes (it is gone).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// False once the region was unregistered or entirely unmapped.
    pub fn is_alive(&self) -> bool {
        self.region.alive.load(Ordering::Acquire)
            && region::slot_holds(self.region.slot, Arc::as_ptr(&self.region))
    }
    /// Faults resolved for this region (both modes, children included).
    pub fn faults(&self) -> u64 {
        self.region.faults.load(Ordering::Relaxed)
    }
    /// Write-protects `[offset, offset+len)` (WP regions), e.g. to re-arm WP faults.
    pub fn protect(&self, offset: usize, len: usize) -> Result<()> {
        self.wp(offset, len, true)
    }
    /// Removes write protection from `[offset, offset+len)` (WP regions) and wakes waiters.
    pub fn unprotect(&self, offset: usize, len: usize) -> Result<()> {
        self.wp(offset, len, false)
    }
    fn wp(&self, offset: usize, len: usize, on: bool) -> Result<()> {
        let (base, rlen) = region::slot_range(self.region.slot);
        if !self.is_alive()
            || offset % PAGE_SIZE != 0
            || len % PAGE_SIZE != 0
            || offset.checked_add(len).map_or(true, |e| e > rlen)
        {
            return Err(Error::InvalidArgument(format!(
                "range {offset:#x}+{len:#x} is unaligned or outside the region ({rlen:#x} bytes)"
            )));
        }
        self.region
            .ctx
            .uffd
            .writeprotect(base + offset, len, on, false)
            .map_err(|e| Error::errno("UFFDIO_WRITEPROTECT", e))
    }
    /// Installs `src` at region offset `offset` outside any fault (MISSING regions): one
    /// `UFFDIO_COPY` of the whole run (threads waiting on these pages are woken); pages already
    /// present are skipped and keep their contents. Returns the bytes installed. For
    /// background completion (prefetch) without taking a fault per page.
    pub fn install(&self, offset: usize, src: &[u8]) -> Result<usize> {
        let dst = self.checked(offset, src.len())?;
        self.region
            .ctx
            .uffd
            .copy(dst, src.as_ptr() as usize, src.len(), 0)
            .map_err(|e| Error::errno("UFFDIO_COPY", e))
    }
    /// Maps zero pages over `[offset, offset+len)` outside any fault (MISSING regions); present
    /// pages are skipped. Returns the bytes mapped.
    pub fn install_zero(&self, offset: usize, len: usize) -> Result<usize> {
        let dst = self.checked(offset, len)?;
        self.region
            .ctx
            .uffd
            .zeropage(dst, len, 0)
            .map_err(|e| Error::errno("UFFDIO_ZEROPAGE", e))
    }
    /// Moves `len` bytes of this process's private anonymous memory at `src` into the region
    /// at `offset` outside any fault (`UFFDIO_MOVE`; MISSING regions on anonymous memory): the
    /// page-table entries move, no byte is copied and no page is allocated, and `src` is left
    /// unmapped. Pages already present in the region are skipped and their source pages stay
    /// where they are. Threads waiting on the moved pages are woken. Returns the bytes moved.
    /// Errors: an unaligned `src` or range ([`Error::InvalidArgument`]); the kernel refusing
    /// (e.g. `EBUSY` for source pages shared with a forked child, `ENOENT` for a source hole):
    /// the caller then copies instead.
    ///
    /// # Safety
    /// `[src, src + len)` must be private anonymous memory of this process that nothing else
    /// uses: its pages leave it.
    pub unsafe fn install_move(&self, offset: usize, src: *const u8, len: usize) -> Result<usize> {
        let dst = self.checked(offset, len)?;
        if (src as usize) % PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(format!(
                "move source {src:p} is not page aligned"
            )));
        }
        self.region
            .ctx
            .uffd
            .move_pages(dst, src as usize, len, 0)
            .map_err(|e| Error::errno("UFFDIO_MOVE", e))
    }
    fn checked(&self, offset: usize, len: usize) -> Result<usize> {
        let (base, rlen) = region::slot_range(self.region.slot);
        if !self.is_alive()
            || offset % PAGE_SIZE != 0
            || len % PAGE_SIZE != 0
            || len == 0
            || offset.checked_add(len).map_or(true, |e| e > rlen)
        {
            return Err(Error::InvalidArgument(format!(
                "range {offset:#x}+{len:#x} is unaligned, empty or outside the region ({rlen:#x} bytes)"
            )));
        }
        Ok(base + offset)
    }
    /// Unregisters the region now (same as dropping the handle, but reports errors). Threads
    /// faulting on it concurrently retry and then see ordinary memory.
    pub fn unregister(self) -> Result<()> {
        let r = Engine::global().unregister_region(&self.region);
        std::mem::forget(self);
        r
    }
}

impl Drop for RegionHandle {
    fn drop(&mut self) {
        if let Err(e) = Engine::global().unregister_region(&self.region) {
            eprintln!(
                "tiermem-fault: unregistering region {}: {e}",
                self.region.id
            );
        }
    }
}

impl Engine {
    /// The one engine of this process (created on first use; its runtime thread starts with the
    /// first registration).
    pub fn global() -> &'static Engine {
        ENGINE.get_or_init(|| Engine {
            state: Mutex::new(State {
                contexts: Vec::new(),
                next_id: 1,
                runtime_started: false,
            }),
            stats: Stats::default(),
            gen: AtomicU64::new(0),
            wake_fd: AtomicI32::new(-1),
            features: OnceLock::new(),
            regions: AtomicU64::new(0),
            pid: std::process::id(),
        })
    }

    /// The kernel's userfaultfd features (probed once).
    pub fn features(&self) -> Result<UffdFeatures> {
        if let Some(f) = self.features.get() {
            return Ok(*f);
        }
        let f = probe_features()?;
        Ok(*self.features.get_or_init(|| f))
    }

    /// How this process obtains its userfaultfds ([`UffdAccess`]; probed once, with
    /// [`Engine::features`]). With [`UffdAccess::UserModeOnly`] (an unprivileged user without
    /// `vm.unprivileged_userfaultfd=1` or access to `/dev/userfaultfd`) the engine works for
    /// user-mode faults only: a kernel access to a missing page of a handler-thread region fails
    /// with EFAULT instead of waiting for the resolver (in-thread regions behave so anyway).
    pub fn access(&self) -> Result<UffdAccess> {
        Ok(self.features()?.access)
    }

    /// Counters since process start.
    pub fn stats(&self) -> EngineStats {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EngineStats {
            faults_in_thread: l(&s.faults_in_thread),
            faults_handler_thread: l(&s.faults_handler),
            faults_child: l(&s.faults_child),
            events_remove: l(&s.events_remove),
            events_unmap: l(&s.events_unmap),
            events_remap: l(&s.events_remap),
            events_fork: l(&s.events_fork),
            resolve_errors: l(&s.resolve_errors),
            stray_faults: l(&s.stray_faults),
            children_live: l(&s.children_live),
            regions: l(&self.regions),
            contexts: self.state.lock().contexts.len() as u64,
        }
    }

    /// Registers `[spec.base, spec.base + spec.len)` with userfaultfd and routes its faults to
    /// `resolver`. The memory must already be mapped with the backing `spec.backing` says.
    ///
    /// Errors: [`Error::InvalidArgument`] (alignment, length, no mode), [`Error::Unsupported`]
    /// (MINOR on anonymous memory, MISSING/MINOR on a regular file, in-thread + ShareWithChild),
    /// [`Error::Overlap`], [`Error::MissingFeature`] (naming the UFFD_FEATURE_* flag),
    /// [`Error::UffdUnavailable`], [`Error::TooManyRegions`], [`Error::Syscall`].
    pub fn register(
        &'static self,
        spec: RegionSpec,
        resolver: Arc<dyn Resolver>,
    ) -> Result<RegionHandle> {
        spec.validate()?;
        if std::process::id() != self.pid {
            return Err(Error::Unsupported(
                "this process is a fork of the one that started the fault engine: the engine's \
                 contexts and runtime thread belong to the parent (regions shared with children \
                 are served by the parent's runtime; exec to use the engine afresh)"
                    .into(),
            ));
        }
        if page_size() != PAGE_SIZE {
            return Err(Error::Unsupported(format!(
                "page size {} (this engine is built for {PAGE_SIZE}-byte pages)",
                page_size()
            )));
        }
        let f = self.features()?;
        let in_thread = spec.resolution == Resolution::InThread;
        let shm = spec.backing != region::Backing::Anonymous;
        let need = |ok: bool, feature: &'static str, needed_for: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(Error::MissingFeature {
                    feature,
                    needed_for,
                })
            }
        };
        if in_thread {
            need(f.sigbus, "UFFD_FEATURE_SIGBUS", "in-thread resolution")?;
        }
        if spec.modes.missing && shm {
            need(
                f.missing_shmem,
                "UFFD_FEATURE_MISSING_SHMEM",
                "MISSING faults on shmem/file memory",
            )?;
        }
        if spec.modes.minor {
            need(
                f.minor_shmem,
                "UFFD_FEATURE_MINOR_SHMEM",
                "MINOR faults on shmem",
            )?;
        }
        if spec.modes.wp {
            need(
                f.wp,
                "UFFD_FEATURE_PAGEFAULT_FLAG_WP",
                "write-protect (WP) faults",
            )?;
            if shm {
                need(
                    f.wp_hugetlbfs_shmem,
                    "UFFD_FEATURE_WP_HUGETLBFS_SHMEM",
                    "WP on shmem/file memory",
                )?;
            }
        }
        if spec.wp_async {
            need(
                f.wp_async,
                "UFFD_FEATURE_WP_ASYNC",
                "async write protection",
            )?;
        }
        if spec.fork == ForkPolicy::ShareWithChild && f.event_fork_denied {
            return Err(Error::Unsupported(
                "ForkPolicy::ShareWithChild needs UFFD_FEATURE_EVENT_FORK, which the kernel grants \
                 only to a process with CAP_SYS_PTRACE (run as root, or register with \
                 ForkPolicy::DontFork)"
                    .into(),
            ));
        }
        if spec.fork == ForkPolicy::ShareWithChild {
            need(
                f.event_fork,
                "UFFD_FEATURE_EVENT_FORK",
                "ForkPolicy::ShareWithChild",
            )?;
        }

        let base = spec.base as usize;
        let len = spec.len;
        let mut st = self.state.lock();
        if let Some((ob, ol)) = region::find_overlap(base, len) {
            return Err(Error::Overlap {
                base,
                len,
                other_base: ob,
                other_len: ol,
            });
        }
        let ctx = self.context(&mut st, in_thread, spec.wp_async, &f)?;
        if !st.runtime_started {
            self.start_runtime()?;
            st.runtime_started = true;
        }
        if in_thread {
            install_sigbus()?;
        }
        let advice = match spec.fork {
            ForkPolicy::DontFork => libc::MADV_DONTFORK,
            ForkPolicy::ShareWithChild | ForkPolicy::PlainInChild => libc::MADV_DOFORK,
        };
        // SAFETY: madvise on a caller-provided range; the kernel validates it (ENOMEM if unmapped).
        if unsafe { libc::madvise(base as *mut libc::c_void, len, advice) } < 0 {
            return Err(Error::last("madvise(MADV_DONTFORK/MADV_DOFORK)"));
        }

        let slot = region::reserve()?;
        let id = st.next_id;
        st.next_id += 1;
        let inner = Arc::new(RegionInner {
            id,
            ctx: ctx.clone(),
            resolver,
            resolution: spec.resolution,
            modes: spec.modes,
            fork: spec.fork,
            faults: AtomicU64::new(0),
            alive: AtomicBool::new(true),
            slot,
        });
        // Publish before registering: a fault can arrive the instant UFFDIO_REGISTER returns and
        // the SIGBUS handler / runtime must already find the region.
        region::publish(slot, base, len, inner.clone());
        let fail = |e: Error| {
            region::begin_retire(slot);
            region::finish_retire(slot);
            e
        };
        let ioctls = match ctx.uffd.register(base, len, spec.modes.uffd_bits()) {
            Ok(m) => m,
            Err(e) => return Err(fail(register_error(e, &spec))),
        };
        let mut needed = Vec::new();
        if spec.modes.missing && ioctls & (1 << _UFFDIO_COPY) == 0 {
            needed.push("UFFDIO_COPY");
        }
        if spec.modes.wp && ioctls & (1 << _UFFDIO_WRITEPROTECT) == 0 {
            needed.push("UFFDIO_WRITEPROTECT");
        }
        if spec.modes.minor && ioctls & (1 << _UFFDIO_CONTINUE) == 0 {
            needed.push("UFFDIO_CONTINUE");
        }
        if !needed.is_empty() {
            let _ = ctx.uffd.unregister(base, len);
            return Err(fail(Error::Unsupported(format!(
                "the kernel does not allow {} on this {:?} mapping",
                needed.join(", "),
                spec.backing
            ))));
        }
        if spec.modes.wp && spec.protect_on_register {
            if let Err(e) = ctx.uffd.writeprotect(base, len, true, true) {
                let _ = ctx.uffd.unregister(base, len);
                return Err(fail(Error::errno("UFFDIO_WRITEPROTECT", e)));
            }
        }
        self.regions.fetch_add(1, Ordering::Relaxed);
        drop(st);
        Ok(RegionHandle { region: inner })
    }

    fn unregister_region(&self, r: &Arc<RegionInner>) -> Result<()> {
        let st = self.state.lock();
        if !r.alive.swap(false, Ordering::AcqRel) || !region::slot_holds(r.slot, Arc::as_ptr(r)) {
            return Ok(());
        }
        let (base, len) = region::slot_range(r.slot);
        region::begin_retire(r.slot);
        // UFFDIO_UNREGISTER wakes threads blocked on the range; in-thread faulters that already
        // entered the SIGBUS handler see `draining` and simply retry the access.
        let res = r.ctx.uffd.unregister(base, len);
        region::finish_retire(r.slot);
        self.regions.fetch_sub(1, Ordering::Relaxed);
        drop(st);
        match res {
            // The range may be gone already (munmap raced with us): nothing left to unregister.
            Ok(()) | Err(libc::EINVAL) | Err(libc::ENOMEM) | Err(libc::ENOENT) => Ok(()),
            Err(e) => Err(Error::errno("UFFDIO_UNREGISTER", e)),
        }
    }

    /// Finds or creates the parent context for (in_thread, wp_async). Caller holds the lock.
    fn context(
        &self,
        st: &mut State,
        in_thread: bool,
        wp_async: bool,
        f: &UffdFeatures,
    ) -> Result<Arc<Ctx>> {
        if let Some(c) = st
            .contexts
            .iter()
            .find(|c| c.in_thread == in_thread && c.wp_async == wp_async)
        {
            return Ok(c.clone());
        }
        let required =
            UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;
        let missing = required & !f.raw;
        if missing != 0 {
            return Err(Error::MissingFeature {
                feature: feature_name(1 << missing.trailing_zeros()),
                needed_for: "tracking munmap/madvise/mremap of registered regions",
            });
        }
        let optional = UFFD_FEATURE_PAGEFAULT_FLAG_WP
            | UFFD_FEATURE_MISSING_SHMEM
            | UFFD_FEATURE_MISSING_HUGETLBFS
            | UFFD_FEATURE_MINOR_SHMEM
            | UFFD_FEATURE_MINOR_HUGETLBFS
            | UFFD_FEATURE_WP_HUGETLBFS_SHMEM
            | UFFD_FEATURE_MOVE
            | UFFD_FEATURE_POISON
            | if in_thread {
                0
            } else {
                UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EVENT_FORK
            };
        // EVENT_FORK is in `raw` when the kernel offers it, but a process without
        // CAP_SYS_PTRACE may not ask for it (the whole handshake would fail with EPERM).
        let usable = if f.event_fork {
            f.raw
        } else {
            f.raw & !UFFD_FEATURE_EVENT_FORK
        };
        let mut want = required | (optional & usable);
        if in_thread {
            want |= UFFD_FEATURE_SIGBUS;
        }
        if wp_async {
            want |= UFFD_FEATURE_WP_ASYNC | (UFFD_FEATURE_WP_UNPOPULATED & f.raw);
        }
        let mut uffd = Uffd::open(
            want,
            if in_thread {
                "an in-thread fault context"
            } else {
                "a handler-thread fault context"
            },
        )?;
        // Handler contexts are resolved on the runtime thread, which must defer on EAGAIN.
        uffd.set_eagain_retry(in_thread);
        if want & UFFD_FEATURE_EVENT_FORK != 0 {
            fork_guard::arm();
        }
        let ctx = Arc::new(Ctx {
            uffd,
            in_thread,
            wp_async,
        });
        st.contexts.push(ctx.clone());
        self.gen.fetch_add(1, Ordering::AcqRel);
        self.kick();
        Ok(ctx)
    }

    fn kick(&self) {
        let fd = self.wake_fd.load(Ordering::Acquire);
        if fd >= 0 {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to our eventfd.
            unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    fn start_runtime(&'static self) -> Result<()> {
        // SAFETY: plain syscall.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(Error::last("eventfd"));
        }
        self.wake_fd.store(efd, Ordering::Release);
        fork_guard::install();
        crate::scope::spawn_library_thread("tiermem-fault", move || Runtime::new(self, efd).run())
            .map_err(|source| Error::Syscall {
                op: "spawning the fault runtime thread",
                source,
            })?;
        Ok(())
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn register_error(e: i32, spec: &RegionSpec) -> Error {
    match e {
        libc::EBUSY => Error::InvalidArgument(format!(
            "range {:p}+{:#x} is already registered with another userfaultfd (an engine region \
             of another mode, a WriteTracker, or foreign code)",
            spec.base, spec.len
        )),
        libc::EINVAL if spec.backing == region::Backing::File => Error::Unsupported(format!(
            "userfaultfd cannot register this file mapping with {:?}: MISSING, MINOR and \
             synchronous WP need anonymous, shmem (memfd, tmpfs such as /dev/shm) or hugetlbfs \
             memory (UFFDIO_REGISTER: EINVAL)",
            spec.modes
        )),
        libc::EINVAL | libc::ENOMEM => Error::InvalidArgument(format!(
            "UFFDIO_REGISTER rejected {:p}+{:#x} with {:?} ({}): the range must be fully mapped, \
             and the backing ({:?}) must support the modes",
            spec.base,
            spec.len,
            spec.modes,
            std::io::Error::from_raw_os_error(e),
            spec.backing
        )),
        libc::EPERM => Error::Unsupported(format!(
            "UFFDIO_REGISTER: permission denied ({:?} on a mapping the process may not write, or \
             a sealed memfd)",
            spec.modes
        )),
        _ => Error::errno("UFFDIO_REGISTER", e),
    }
}

// ---------------------------------------------------------------------------------------------
// In-thread path: the SIGBUS handler
// ---------------------------------------------------------------------------------------------

fn install_sigbus() -> Result<()> {
    if SIGBUS_INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    // No SA_ONSTACK: resolvers need a real stack, and a sigaltstack (Rust gives every thread a
    // small one for stack-overflow reports) may be only a few KiB. SA_NODEFER: a resolver may
    // read another in-thread region and take a nested SIGBUS.
    SIGBUS_CHAIN
        .install(
            libc::SIGBUS,
            sigbus_handler,
            libc::SA_NODEFER | libc::SA_RESTART,
        )
        .map_err(|e| Error::errno("sigaction(SIGBUS)", e))?;
    SIGBUS_INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Page-fault error code bits (x86 `X86_PF_*`), delivered in `uc_mcontext.gregs[REG_ERR]`.
const PF_PROT: u64 = 1 << 0;
const PF_WRITE: u64 = 1 << 1;

extern "C" fn sigbus_handler(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let saved_errno = sys::errno();
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR {
        let mut found = region::lookup(addr, None);
        if found.is_none() && RT_BUSY.load(Ordering::SeqCst) {
            let mut n = 0u32;
            while RT_BUSY.load(Ordering::SeqCst) && n < 1_000_000 {
                n += 1;
                // SAFETY: sched_yield is async-signal-safe.
                unsafe { libc::sched_yield() };
            }
            found = region::lookup(addr, None);
        }
        if let Some(g) = found {
            if g.region().resolution == Resolution::InThread {
                if !g.draining {
                    // SAFETY: uctx is the kernel-provided ucontext of this signal.
                    let err = unsafe {
                        (*(uctx as *const libc::ucontext_t)).uc_mcontext.gregs
                            [libc::REG_ERR as usize] as u64
                    };
                    resolve_in_thread(&g, addr, err);
                }
                drop(g);
                sys::set_errno(saved_errno);
                return;
            }
        }
    }
    SIGBUS_CHAIN.forward(sig, info, uctx);
    sys::set_errno(saved_errno);
}

#[inline]
fn resolve_in_thread(g: &region::SlotGuard, addr: usize, err: u64) {
    let r = g.region();
    let page = addr & !(PAGE_SIZE - 1);
    let write = err & PF_WRITE != 0;
    let kind = classify(r.modes, err & PF_PROT != 0, write, page);
    let fault = Fault {
        addr: page,
        offset: page - g.base,
        kind,
        write,
        mode: Resolution::InThread,
        tid: None,
        in_child: false,
    };
    let ops = FaultOps {
        uffd: &r.ctx.uffd,
        base: g.base,
        len: g.len,
        in_thread: true,
        fault_addr: page,
        woke: Cell::new(false),
        progress: Cell::new(false),
    };
    // The resolver runs tiermem code on the program's thread (see `scope`).
    let scope = crate::scope::LibraryScope::enter();
    let res = r.resolver.resolve(&fault, &ops);
    drop(scope);
    match res {
        Ok(()) => {
            r.faults.fetch_add(1, Ordering::Relaxed);
            Engine::global()
                .stats
                .faults_in_thread
                .fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            if !r.alive.load(Ordering::Acquire) {
                // Unregistered while we resolved: the retried access is an ordinary fault.
                return;
            }
            Engine::global()
                .stats
                .resolve_errors
                .fetch_add(1, Ordering::Relaxed);
            let mut m = StackBuf::new();
            let _ = writeln!(
                m,
                "tiermem-fault: in-thread resolver of region {} failed for {:?} fault at offset \
                 {:#x} (addr {:#x}): {e}; crashing with SIGBUS",
                r.id, kind, fault.offset, page
            );
            m.flush_stderr();
            // Restore the default action: the access restarts, faults again and kills the
            // process with SIGBUS at the faulting instruction instead of looping forever.
            crate::sig::reset_default(libc::SIGBUS);
        }
    }
}

/// Consecutive resolutions of the same page that changed nothing before the engine declares a
/// fault loop (a lost race repeats at most a few times).
const NO_PROGRESS_LIMIT: u32 = 10_000;

thread_local! {
    /// (page, count) of consecutive no-progress in-thread resolutions on this thread. A
    /// const-initialised, drop-free thread local: plain TLS access, async-signal-safe.
    static NO_PROGRESS: Cell<(usize, u32)> = const { Cell::new((0, 0)) };
}

/// Records a resolution that made no progress on `page`; true when it looks like a loop.
fn no_progress_loop(page: usize) -> bool {
    NO_PROGRESS.with(|c| {
        let (p, n) = c.get();
        let n = if p == page { n + 1 } else { 1 };
        c.set((page, n));
        n > NO_PROGRESS_LIMIT
    })
}

/// Classifies an in-thread fault from the page-fault error code and the region's modes.
///
/// * protection violation on a write → WriteProtect (a present, uffd-wp page);
/// * not present → Missing or Minor, whichever the region registered; with both, `mincore`
///   tells whether the page cache holds the page (Minor) or not (Missing) — one extra syscall,
///   only for regions that registered both;
/// * not present, write, WP-only region → WriteProtect (a uffd-wp PTE marker: shmem or
///   WP_UNPOPULATED anonymous memory).
#[inline]
fn classify(m: Modes, present: bool, write: bool, page: usize) -> FaultKind {
    if present {
        return FaultKind::WriteProtect;
    }
    match (m.missing, m.minor) {
        (true, false) => FaultKind::Missing,
        (false, true) => FaultKind::Minor,
        (true, true) => {
            let mut v: u8 = 0;
            // SAFETY: mincore on one page of a mapped range; v receives one byte.
            let r = unsafe { libc::mincore(page as *mut libc::c_void, PAGE_SIZE, &mut v) };
            if r == 0 && v & 1 != 0 {
                FaultKind::Minor
            } else {
                FaultKind::Missing
            }
        }
        (false, false) => {
            let _ = write;
            FaultKind::WriteProtect
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Handler-thread path: the runtime thread
// ---------------------------------------------------------------------------------------------

struct ChildRegion {
    base: usize,
    len: usize,
    region: Arc<RegionInner>,
}

struct Child {
    ctx: Arc<Ctx>,
    regions: Vec<ChildRegion>,
    dead: bool,
}

/// The runtime thread's private state.
struct Runtime {
    engine: &'static Engine,
    wake_fd: RawFd,
    parents: Vec<Arc<Ctx>>,
    children: Vec<Child>,
    seen_gen: u64,
    spin_until: Option<Instant>,
    last_liveness: Instant,
    stray: (usize, u32),
    /// Faults whose resolution hit EAGAIN (an event is pending on that context): retried after
    /// the pending messages have been read.
    deferred: Vec<(Arc<Ctx>, UffdMsg)>,
}

/// Address used to ask "is this child's address space still alive?": UFFDIO_UNREGISTER of a
/// page that is never mapped in practice (just above the default mmap_min_addr). The kernel
/// validates the range, then fails with ENOMEM/ESRCH once the mm is gone; on a live mm it
/// finds no VMA there and does nothing.
const LIVENESS_PROBE_ADDR: usize = 0x10000;

impl Runtime {
    fn new(engine: &'static Engine, wake_fd: RawFd) -> Runtime {
        Runtime {
            engine,
            wake_fd,
            parents: Vec::new(),
            children: Vec::new(),
            seen_gen: u64::MAX,
            spin_until: None,
            last_liveness: Instant::now(),
            stray: (0, 0),
            deferred: Vec::new(),
        }
    }

    fn run(mut self) {
        let mut msgs = [UffdMsg::default(); 64];
        // Reused, like `ready` and `held`: see [`fork_guard`] for why this loop allocates only
        // inside its dispatch sections.
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        let mut ready: Vec<bool> = Vec::new();
        let mut held: Vec<(usize, UffdMsg)> = Vec::with_capacity(fork_guard::HELD_CAP);
        fork_guard::runtime_started();
        loop {
            if !fork_guard::enter_dispatch() {
                self.ride_out_fork(&mut msgs, &mut held);
                continue;
            }
            let g = self.engine.gen.load(Ordering::Acquire);
            if g != self.seen_gen {
                self.parents = self.engine.state.lock().contexts.clone();
                self.seen_gen = g;
            }
            let spinning = self.spin_until.is_some_and(|t| Instant::now() < t);
            // Which contexts to read: all of them while spinning, the ready ones otherwise.
            let n_parents = self.parents.len();
            let total = n_parents + self.children.len();
            ready.clear();
            ready.resize(total, spinning);
            if !spinning {
                self.spin_until = None;
                pfds.clear();
                pfds.push(libc::pollfd {
                    fd: self.wake_fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                for c in &self.parents {
                    pfds.push(libc::pollfd {
                        fd: c.uffd.fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
                for c in &self.children {
                    pfds.push(libc::pollfd {
                        fd: c.ctx.uffd.fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
                let timeout = if !self.deferred.is_empty() {
                    1
                } else if self.children.is_empty() {
                    -1
                } else {
                    500
                };
                // A fork may start while this thread sleeps in poll: it must not wait for us.
                fork_guard::leave_dispatch();
                // SAFETY: pfds is a valid array of pollfd.
                let n =
                    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
                if !fork_guard::enter_dispatch() {
                    // The contexts poll found ready are read by ride_out_fork; the next turn
                    // polls again (level-triggered).
                    self.ride_out_fork(&mut msgs, &mut held);
                    continue;
                }
                if n < 0 {
                    fork_guard::leave_dispatch();
                    continue; // EINTR
                }
                if pfds[0].revents != 0 {
                    let mut v: u64 = 0;
                    // SAFETY: reading 8 bytes from our eventfd.
                    unsafe { libc::read(self.wake_fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
                }
                for (i, p) in pfds.iter().enumerate().skip(1) {
                    ready[i - 1] = p.revents != 0;
                }
                if !self.children.is_empty()
                    && self.last_liveness.elapsed() > Duration::from_millis(500)
                {
                    self.check_children();
                }
            }
            let mut new_children = Vec::new();
            for (i, is_ready) in ready.iter().enumerate().take(total) {
                if !*is_ready {
                    continue;
                }
                loop {
                    let (ctx, is_child) = self.context_at(i);
                    RT_BUSY.store(true, Ordering::SeqCst);
                    let n = match ctx.uffd.read_msgs(&mut msgs) {
                        Ok(n) => n,
                        Err(_) => {
                            if let Some(ci) = is_child {
                                self.children[ci].dead = true;
                            }
                            0
                        }
                    };
                    if n == 0 {
                        RT_BUSY.store(false, Ordering::SeqCst);
                        break;
                    }
                    for m in &msgs[..n] {
                        self.dispatch(&ctx, is_child, m, &mut new_children);
                    }
                    RT_BUSY.store(false, Ordering::SeqCst);
                }
            }
            self.children.extend(new_children);
            self.after_reading();
            fork_guard::leave_dispatch();
        }
    }

    /// Context `i` of the runtime's combined list (parents, then children), and its child index.
    fn context_at(&self, i: usize) -> (Arc<Ctx>, Option<usize>) {
        let n_parents = self.parents.len();
        if i < n_parents {
            (self.parents[i].clone(), None)
        } else {
            (
                self.children[i - n_parents].ctx.clone(),
                Some(i - n_parents),
            )
        }
    }

    /// End of a turn, once every context has been read dry: retries the deferred faults and
    /// forgets dead children.
    fn after_reading(&mut self) {
        // The events that made these faults fail with EAGAIN have been consumed: retry them
        // (those still failing stay deferred).
        if !self.deferred.is_empty() {
            let retry = std::mem::take(&mut self.deferred);
            for (ctx, m) in retry {
                let child = self.children.iter().position(|c| Arc::ptr_eq(&c.ctx, &ctx));
                let is_parent = self.parents.iter().any(|c| Arc::ptr_eq(c, &ctx));
                if child.is_some() || is_parent {
                    self.on_pagefault(&ctx, child, &m);
                }
            }
        }
        let before = self.children.len();
        self.children.retain(|c| !c.dead);
        if self.children.len() != before {
            self.engine
                .stats
                .children_live
                .store(self.children.len() as u64, Ordering::Relaxed);
        }
    }

    /// A thread of this process is forking (see [`fork_guard`]): read every context without
    /// allocating, holding the messages in `held` (preallocated), until the fork has returned
    /// in the parent; then dispatch them in the order they were read. Reading is what lets the
    /// fork go on: the kernel makes it wait until each `UFFD_EVENT_FORK` has been read.
    fn ride_out_fork(&mut self, msgs: &mut [UffdMsg; 64], held: &mut Vec<(usize, UffdMsg)>) {
        let total = self.parents.len() + self.children.len();
        RT_BUSY.store(true, Ordering::SeqCst);
        while fork_guard::forking() {
            for i in 0..total {
                let room = (held.capacity() - held.len()).min(msgs.len());
                if room == 0 {
                    break;
                }
                let ctx = if i < self.parents.len() {
                    &self.parents[i]
                } else {
                    &self.children[i - self.parents.len()].ctx
                };
                // A read error (a dead child) is seen again, and handled, by the next turn.
                if let Ok(n) = ctx.uffd.read_msgs(&mut msgs[..room]) {
                    for m in &msgs[..n] {
                        held.push((i, *m));
                    }
                }
            }
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 20_000,
            };
            // SAFETY: nanosleep with a valid timespec and no remainder.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
        if !fork_guard::enter_dispatch() {
            // Another fork began already; keep holding (the list is dispatched after it, and
            // RT_BUSY stays up while messages wait undispatched).
            if held.is_empty() {
                RT_BUSY.store(false, Ordering::SeqCst);
            }
            return;
        }
        let mut new_children = Vec::new();
        for &(i, m) in held.iter() {
            let (ctx, is_child) = self.context_at(i);
            self.dispatch(&ctx, is_child, &m, &mut new_children);
        }
        held.clear();
        self.children.extend(new_children);
        RT_BUSY.store(false, Ordering::SeqCst);
        self.after_reading();
        fork_guard::leave_dispatch();
    }

    /// Drops the contexts of children whose address space is gone (exit or exec).
    fn check_children(&mut self) {
        self.last_liveness = Instant::now();
        for c in &mut self.children {
            match c.ctx.uffd.unregister(LIVENESS_PROBE_ADDR, PAGE_SIZE) {
                Err(libc::ENOMEM) | Err(libc::ESRCH) => c.dead = true,
                _ => {}
            }
        }
    }

    /// The one event switch.
    fn dispatch(
        &mut self,
        ctx: &Arc<Ctx>,
        child: Option<usize>,
        m: &UffdMsg,
        new_children: &mut Vec<Child>,
    ) {
        let st = &self.engine.stats;
        match m.event {
            UFFD_EVENT_PAGEFAULT => self.on_pagefault(ctx, child, m),
            UFFD_EVENT_FORK => {
                st.events_fork.fetch_add(1, Ordering::Relaxed);
                self.on_fork(ctx, child, m, new_children);
            }
            UFFD_EVENT_REMAP => {
                st.events_remap.fetch_add(1, Ordering::Relaxed);
                let (from, to, len) = m.remap();
                self.on_remap(ctx, child, from as usize, to as usize, len as usize);
            }
            UFFD_EVENT_REMOVE => {
                st.events_remove.fetch_add(1, Ordering::Relaxed);
                let (s, e) = m.remove();
                self.on_remove(ctx, child, s as usize, e as usize, false);
            }
            UFFD_EVENT_UNMAP => {
                st.events_unmap.fetch_add(1, Ordering::Relaxed);
                let (s, e) = m.remove();
                self.on_remove(ctx, child, s as usize, e as usize, true);
            }
            _ => {}
        }
    }

    fn on_pagefault(&mut self, ctx: &Arc<Ctx>, child: Option<usize>, m: &UffdMsg) {
        let addr = m.pf_address() as usize & !(PAGE_SIZE - 1);
        let flags = m.pf_flags();
        let kind = if flags & UFFD_PAGEFAULT_FLAG_WP != 0 {
            FaultKind::WriteProtect
        } else if flags & UFFD_PAGEFAULT_FLAG_MINOR != 0 {
            FaultKind::Minor
        } else {
            FaultKind::Missing
        };
        let write = flags & UFFD_PAGEFAULT_FLAG_WRITE != 0;
        let tid = if ctx.uffd.features().thread_id {
            Some(m.pf_ptid() as i32)
        } else {
            None
        };
        // Resolve the region: parents through the slot table, children through their own list.
        let (region, base, len, _guard) = match child {
            None => match region::lookup(addr, Some(Arc::as_ptr(ctx))) {
                Some(g) if !g.draining => (None, g.base, g.len, Some(g)),
                _ => return self.stray_fault(ctx, addr),
            },
            Some(ci) => match self.children[ci]
                .regions
                .iter()
                .find(|r| addr >= r.base && addr - r.base < r.len)
            {
                Some(r) => (Some(r.region.clone()), r.base, r.len, None),
                None => return self.stray_fault(ctx, addr),
            },
        };
        let region: &RegionInner = match (&region, &_guard) {
            (Some(r), _) => r,
            (None, Some(g)) => g.region(),
            (None, None) => return,
        };
        let spin_us = match region.resolution {
            Resolution::HandlerThread { spin_us } => spin_us,
            Resolution::InThread => 0,
        };
        let fault = Fault {
            addr,
            offset: addr - base,
            kind,
            write,
            mode: region.resolution,
            tid,
            in_child: child.is_some(),
        };
        let ops = FaultOps {
            uffd: &ctx.uffd,
            base,
            len,
            in_thread: false,
            fault_addr: addr,
            woke: Cell::new(false),
            progress: Cell::new(false),
        };
        let mut result = region.resolver.resolve(&fault, &ops);
        if result.is_ok() && !ops.progress.get() && no_progress_loop(addr) {
            result = Err(ResolveError::Resolver(
                "the fault keeps coming back and the resolver changes nothing (fault loop)",
            ));
        }
        match result {
            Ok(()) => {
                if !ops.woke.get() {
                    // The resolver did not touch the faulting page (EEXIST, or it resolved with
                    // DONTWAKE): make sure the faulting thread is not left asleep.
                    let _ = ctx.uffd.wake(addr, PAGE_SIZE);
                }
                region.faults.fetch_add(1, Ordering::Relaxed);
                let c = if child.is_some() {
                    &self.engine.stats.faults_child
                } else {
                    &self.engine.stats.faults_handler
                };
                c.fetch_add(1, Ordering::Relaxed);
            }
            Err(ResolveError::Ioctl {
                errno: libc::EAGAIN,
                ..
            }) => {
                // mmap_changing: a REMOVE/UNMAP/REMAP/FORK event on this context is waiting to be
                // read — by us. Defer the fault; the faulting thread stays blocked meanwhile.
                self.deferred.push((ctx.clone(), *m));
                return;
            }
            Err(ResolveError::ProcessGone) => {
                if let Some(ci) = child {
                    self.children[ci].dead = true;
                }
            }
            Err(e) => {
                if child.is_none() && !region.alive.load(Ordering::Acquire) {
                    let _ = ctx.uffd.wake(addr, PAGE_SIZE);
                    return;
                }
                self.engine
                    .stats
                    .resolve_errors
                    .fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "tiermem-fault: handler-thread resolver of region {} failed for {:?} fault at \
                     offset {:#x} (addr {addr:#x}{}): {e}; poisoning the page so the access \
                     crashes with SIGBUS",
                    region.id,
                    kind,
                    fault.offset,
                    if child.is_some() {
                        ", in a forked child"
                    } else {
                        ""
                    }
                );
                if ctx.uffd.poison(addr, PAGE_SIZE).is_err() {
                    if child.is_some() {
                        // Never take the parent down for a child's failure; drop the child.
                        self.children[child.unwrap_or(0)].dead = true;
                        return;
                    }
                    eprintln!(
                        "tiermem-fault: UFFDIO_POISON unavailable or failed; aborting instead of \
                         leaving the faulting thread blocked forever"
                    );
                    std::process::abort();
                }
            }
        }
        if spin_us > 0 {
            let t = Instant::now() + Duration::from_micros(spin_us as u64);
            self.spin_until = Some(self.spin_until.map_or(t, |u| u.max(t)));
        }
    }

    /// A fault no region claims: a stale message for a region unregistered meanwhile (the kernel
    /// already woke its waiters), or a part of a region we lost track of. Wake the thread; if the
    /// same address keeps coming back, it is not stale: fail it loudly.
    fn stray_fault(&mut self, ctx: &Arc<Ctx>, addr: usize) {
        self.engine
            .stats
            .stray_faults
            .fetch_add(1, Ordering::Relaxed);
        if self.stray.0 == addr {
            self.stray.1 += 1;
        } else {
            self.stray = (addr, 1);
        }
        if self.stray.1 > 1000 {
            eprintln!(
                "tiermem-fault: address {addr:#x} keeps faulting on a userfaultfd but belongs to \
                 no registered region; poisoning it"
            );
            let _ = ctx.uffd.poison(addr, PAGE_SIZE);
            self.stray = (0, 0);
        }
        let _ = ctx.uffd.wake(addr, PAGE_SIZE);
    }

    /// UFFD_EVENT_FORK: the kernel created a userfaultfd for the child (the fd was installed in
    /// our fd table when we read the message) and the child's copies of this context's
    /// ShareWithChild VMAs are registered with it. DontFork regions are VM_DONTCOPY and were not
    /// copied. fork() in the parent is blocked until we read this message, so the region table
    /// still describes the layout the child got.
    fn on_fork(
        &mut self,
        ctx: &Arc<Ctx>,
        child: Option<usize>,
        m: &UffdMsg,
        new_children: &mut Vec<Child>,
    ) {
        // SAFETY: the kernel installed this fd for us while we read the FORK message.
        let uffd = unsafe { Uffd::from_fork_fd(m.fork_ufd() as RawFd, ctx.uffd.features().raw) };
        let cctx = Arc::new(Ctx {
            uffd,
            in_thread: false,
            wp_async: ctx.wp_async,
        });
        let mut regions = Vec::new();
        let mut notify = Vec::new();
        match child {
            None => {
                let _st = self.engine.state.lock();
                for (_, b, l, r) in region::snapshot() {
                    if std::ptr::eq(Arc::as_ptr(&r.ctx), Arc::as_ptr(ctx))
                        && r.fork == ForkPolicy::ShareWithChild
                    {
                        notify.push(r.clone());
                        regions.push(ChildRegion {
                            base: b,
                            len: l,
                            region: r,
                        });
                    }
                }
            }
            Some(ci) => {
                for r in &self.children[ci].regions {
                    regions.push(ChildRegion {
                        base: r.base,
                        len: r.len,
                        region: r.region.clone(),
                    });
                }
            }
        }
        new_children.push(Child {
            ctx: cctx,
            regions,
            dead: false,
        });
        self.engine.stats.children_live.store(
            (self.children.len() + new_children.len()) as u64,
            Ordering::Relaxed,
        );
        for r in notify {
            r.resolver.on_event(&RegionEvent::Fork { child_pid: None });
        }
    }

    /// UFFD_EVENT_REMAP: mremap moved [from, from+len) to `to`. The kernel kept the registration
    /// on the new VMA (we asked for EVENT_REMAP), and mremap does not return before we read the
    /// event, so by the time the caller can touch the new range the slot already points there —
    /// unless the caller touches it from another thread before we finish this function; such a
    /// fault is then a stray for a moment and is woken and retried.
    fn on_remap(
        &mut self,
        ctx: &Arc<Ctx>,
        child: Option<usize>,
        from: usize,
        to: usize,
        len: usize,
    ) {
        let mut notify = Vec::new();
        match child {
            None => {
                let _st = self.engine.state.lock();
                for (i, b, l, r) in region::snapshot() {
                    if !std::ptr::eq(Arc::as_ptr(&r.ctx), Arc::as_ptr(ctx)) {
                        continue;
                    }
                    if b >= from && b < from + len {
                        let nb = to + (b - from);
                        let nl = l.min(from + len - b);
                        region::set_range(i, nb, nl);
                        notify.push((r, nb, nl));
                    }
                }
            }
            Some(ci) => {
                for r in &mut self.children[ci].regions {
                    if r.base >= from && r.base < from + len {
                        r.len = r.len.min(from + len - r.base);
                        r.base = to + (r.base - from);
                    }
                }
            }
        }
        for (r, nb, nl) in notify {
            r.resolver.on_event(&RegionEvent::Remap {
                new_base: nb,
                new_len: nl,
            });
        }
    }

    /// UFFD_EVENT_REMOVE (`unmap == false`): madvise(DONTNEED/REMOVE) over [s, e). Sent *before*
    /// the kernel zaps the pages; the madvise caller waits until we have read it, and resolution
    /// ioctls on this context fail with EAGAIN until then (mmap_changing), which `Uffd` retries.
    ///
    /// UFFD_EVENT_UNMAP (`unmap == true`): munmap of [s, e), sent after the range is gone. A
    /// region entirely inside is retired (its handle reports `is_alive() == false`).
    fn on_remove(&mut self, ctx: &Arc<Ctx>, child: Option<usize>, s: usize, e: usize, unmap: bool) {
        if let Some(ci) = child {
            if unmap {
                let c = &mut self.children[ci];
                c.regions.retain(|r| !(r.base >= s && r.base + r.len <= e));
            }
            return;
        }
        let mut notify = Vec::new();
        {
            let _st = self.engine.state.lock();
            for (i, b, l, r) in region::snapshot() {
                if !std::ptr::eq(Arc::as_ptr(&r.ctx), Arc::as_ptr(ctx)) {
                    continue;
                }
                let lo = s.max(b);
                let hi = e.min(b + l);
                if lo >= hi {
                    continue;
                }
                let ev = if unmap {
                    RegionEvent::Unmap {
                        offset: lo - b,
                        len: hi - lo,
                    }
                } else {
                    RegionEvent::Remove {
                        offset: lo - b,
                        len: hi - lo,
                    }
                };
                if unmap && lo == b && hi == b + l && r.alive.swap(false, Ordering::AcqRel) {
                    region::begin_retire(i);
                    region::finish_retire(i);
                    self.engine.regions.fetch_sub(1, Ordering::Relaxed);
                }
                notify.push((r, ev));
            }
        }
        for (r, ev) in notify {
            r.resolver.on_event(&ev);
        }
    }
}
