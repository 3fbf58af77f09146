//! Region descriptions ([`RegionSpec`]) and the engine's async-signal-safe region table.
//!
//! The table is a fixed array of slots. A slot is published with atomics only, so the SIGBUS
//! handler can find the region of a faulting address without locks or allocation. Each slot has
//! an in-flight counter: a lookup increments it before trusting the slot and decrements it when
//! done, and unregistration marks the slot DRAINING and waits for the counter to reach zero
//! before it frees the region (Dekker-style with SeqCst on both sides).

use crate::engine::Ctx;
use crate::error::{Error, Result};
use crate::policy::Resolver;
use crate::sys::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// What backs the registered memory. It decides which userfaultfd modes the kernel can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory (`MAP_PRIVATE | MAP_ANONYMOUS`). MISSING and WP; no MINOR.
    Anonymous,
    /// Shared memory: memfd, `MAP_SHARED | MAP_ANONYMOUS`, SysV shm. MISSING, WP and MINOR.
    Shmem,
    /// A file mapping. On tmpfs (`/dev/shm`) it behaves like [`Backing::Shmem`]; regular-file
    /// mappings cannot be registered for MISSING or MINOR (the kernel returns EINVAL).
    File,
}

/// Which userfaultfd faults a region receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Modes {
    /// `UFFDIO_REGISTER_MODE_MISSING`: accesses to unpopulated pages.
    pub missing: bool,
    /// `UFFDIO_REGISTER_MODE_WP`: writes to uffd-write-protected pages.
    pub wp: bool,
    /// `UFFDIO_REGISTER_MODE_MINOR`: accesses to pages present in the page cache but not mapped
    /// (shmem only).
    pub minor: bool,
}

impl Modes {
    /// MISSING only.
    pub const MISSING: Modes = Modes {
        missing: true,
        wp: false,
        minor: false,
    };
    /// WP only.
    pub const WP: Modes = Modes {
        missing: false,
        wp: true,
        minor: false,
    };
    /// MINOR only.
    pub const MINOR: Modes = Modes {
        missing: false,
        wp: false,
        minor: true,
    };

    pub(crate) fn uffd_bits(&self) -> u64 {
        use crate::sys::*;
        let mut m = 0;
        if self.missing {
            m |= UFFDIO_REGISTER_MODE_MISSING;
        }
        if self.wp {
            m |= UFFDIO_REGISTER_MODE_WP;
        }
        if self.minor {
            m |= UFFDIO_REGISTER_MODE_MINOR;
        }
        m
    }
}

/// Where a region's faults are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// In the faulting thread, inside a SIGBUS handler (UFFD_FEATURE_SIGBUS). The fast path:
    /// ~2.2 µs p50 on the reference VM. Kernel accesses (e.g. `read(2)` into a missing page) fail
    /// with EFAULT instead of faulting; the resolver must be async-signal-safe.
    InThread,
    /// On the engine's runtime thread (poll + read + ioctl). Kernel accesses work. Blocking
    /// (`spin_us == 0`) costs ~70–80 µs per fault on a VM (waking an idle vCPU); with `spin_us >
    /// 0` the runtime keeps polling without sleeping for that many µs after each fault, trading a
    /// core for latency.
    HandlerThread {
        /// Busy-poll time after the last message before the runtime blocks in poll(2) again.
        spin_us: u32,
    },
}

/// What happens to the region in a child created by `fork(2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkPolicy {
    /// The child gets the mapping; its faults reach the same resolver through the child's
    /// userfaultfd (UFFD_EVENT_FORK). Handler-thread regions only.
    ShareWithChild,
    /// The mapping is `MADV_DONTFORK`: absent in the child.
    DontFork,
    /// The child gets the mapping as plain memory: no registration (the kernel drops it from
    /// a context without UFFD_FEATURE_EVENT_FORK, which in-thread contexts never ask for) and
    /// no write protection (uffd-wp bits are cleared in a VMA that is not registered); its
    /// pages are shared copy-on-write with the parent as any private memory. In-thread regions
    /// only. What a forked snapshot child dumps (`tiermem-snapshot`'s fork methods).
    PlainInChild,
}

/// Description of a region to register. Build with [`RegionSpec::new`] and the chained setters.
///
/// Defaults: anonymous backing, MISSING mode, in-thread resolution, no async WP, `DontFork`,
/// write-protect the whole range at registration when WP mode is on.
#[derive(Debug, Clone, Copy)]
pub struct RegionSpec {
    /// Page-aligned base address of an existing mapping.
    pub base: *mut u8,
    /// Length in bytes, a non-zero multiple of the page size.
    pub len: usize,
    /// What backs the mapping.
    pub backing: Backing,
    /// Fault modes to register.
    pub modes: Modes,
    /// Where faults are resolved.
    pub resolution: Resolution,
    /// Use UFFD_FEATURE_WP_ASYNC: writes to protected pages are resolved by the kernel itself
    /// (no WriteProtect faults reach the resolver); needs `modes.wp`. The context also has
    /// WP_UNPOPULATED, so holes of a MISSING+WP region are uffd-wp markers: fill them with
    /// [`crate::FaultOps::copy`], not `zero` (UFFDIO_ZEROPAGE refuses markers with EEXIST).
    pub wp_async: bool,
    /// Fork behaviour.
    pub fork: ForkPolicy,
    /// With `modes.wp`, write-protect the whole range right after registration.
    pub protect_on_register: bool,
}

impl RegionSpec {
    /// A spec for `[base, base+len)` with the defaults listed on [`RegionSpec`].
    pub fn new(base: *mut u8, len: usize) -> RegionSpec {
        RegionSpec {
            base,
            len,
            backing: Backing::Anonymous,
            modes: Modes::MISSING,
            resolution: Resolution::InThread,
            wp_async: false,
            fork: ForkPolicy::DontFork,
            protect_on_register: true,
        }
    }
    /// Sets the backing.
    pub fn backing(mut self, b: Backing) -> Self {
        self.backing = b;
        self
    }
    /// Sets all modes.
    pub fn modes(mut self, m: Modes) -> Self {
        self.modes = m;
        self
    }
    /// Enables/disables MISSING.
    pub fn missing(mut self, on: bool) -> Self {
        self.modes.missing = on;
        self
    }
    /// Enables/disables WP.
    pub fn wp(mut self, on: bool) -> Self {
        self.modes.wp = on;
        self
    }
    /// Enables/disables MINOR.
    pub fn minor(mut self, on: bool) -> Self {
        self.modes.minor = on;
        self
    }
    /// Sets the resolution mode.
    pub fn resolution(mut self, r: Resolution) -> Self {
        self.resolution = r;
        self
    }
    /// Shorthand for [`Resolution::InThread`].
    pub fn in_thread(self) -> Self {
        self.resolution(Resolution::InThread)
    }
    /// Shorthand for [`Resolution::HandlerThread`].
    pub fn handler_thread(self, spin_us: u32) -> Self {
        self.resolution(Resolution::HandlerThread { spin_us })
    }
    /// Sets async write protection (see the field).
    pub fn wp_async(mut self, on: bool) -> Self {
        self.wp_async = on;
        self
    }
    /// Sets the fork policy.
    pub fn fork(mut self, f: ForkPolicy) -> Self {
        self.fork = f;
        self
    }
    /// Sets whether WP regions are write-protected at registration.
    pub fn protect_on_register(mut self, on: bool) -> Self {
        self.protect_on_register = on;
        self
    }

    /// Checks what can be checked without the kernel: alignment, length, mode combinations.
    pub(crate) fn validate(&self) -> Result<()> {
        let base = self.base as usize;
        if base == 0 || base % PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(format!(
                "region base {base:#x} is not page aligned ({PAGE_SIZE} bytes) or is null"
            )));
        }
        if self.len == 0 {
            return Err(Error::InvalidArgument("region length is zero".into()));
        }
        if self.len % PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(format!(
                "region length {:#x} is not a multiple of the page size ({PAGE_SIZE})",
                self.len
            )));
        }
        if base.checked_add(self.len).is_none() {
            return Err(Error::InvalidArgument(
                "region wraps the address space".into(),
            ));
        }
        if !self.modes.missing && !self.modes.wp && !self.modes.minor {
            return Err(Error::InvalidArgument(
                "no fault mode selected (missing, wp or minor)".into(),
            ));
        }
        if self.modes.minor && self.backing == Backing::Anonymous {
            return Err(Error::Unsupported(
                "MINOR faults need shmem or hugetlbfs memory (a page cache); anonymous memory \
                 has none — use MISSING, or back the region with a memfd"
                    .into(),
            ));
        }
        if self.wp_async && !self.modes.wp {
            return Err(Error::InvalidArgument(
                "wp_async needs WP mode (modes.wp = true)".into(),
            ));
        }
        if self.fork == ForkPolicy::PlainInChild && self.resolution != Resolution::InThread {
            return Err(Error::Unsupported(
                "ForkPolicy::PlainInChild needs in-thread resolution: a handler-thread context \
                 asks for UFFD_FEATURE_EVENT_FORK where it may, and its child would inherit the \
                 registration"
                    .into(),
            ));
        }
        if self.fork == ForkPolicy::ShareWithChild && self.resolution == Resolution::InThread {
            return Err(Error::Unsupported(
                "ForkPolicy::ShareWithChild needs handler-thread resolution: an in-thread \
                 (UFFD_FEATURE_SIGBUS) child would take SIGBUS faults with no handler able to \
                 resolve them; in-thread regions are DontFork"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Engine-private state of one registered region.
pub(crate) struct RegionInner {
    pub(crate) id: u64,
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) resolver: Arc<dyn Resolver>,
    pub(crate) resolution: Resolution,
    pub(crate) modes: Modes,
    pub(crate) fork: ForkPolicy,
    pub(crate) faults: AtomicU64,
    pub(crate) alive: AtomicBool,
    /// Slot index in [`SLOTS`] while registered.
    pub(crate) slot: usize,
}

// ---------------------------------------------------------------------------------------------
// Slot table
// ---------------------------------------------------------------------------------------------

/// Capacity of the signal-safe region table.
pub const MAX_REGIONS: usize = 256;

const FREE: u32 = 0;
const ACTIVE: u32 = 2;
/// Being unregistered: still matched by lookups, whose callers must not resolve (the access is
/// retried and becomes an ordinary fault once UFFDIO_UNREGISTER is done).
const DRAINING: u32 = 3;
/// Unregistered, waiting for in-flight lookups to drain; not matched.
const DEAD: u32 = 4;

pub(crate) struct Slot {
    state: AtomicU32,
    /// Seqlock over (base, len): odd while being updated.
    seq: AtomicU32,
    base: AtomicUsize,
    len: AtomicUsize,
    inflight: AtomicU32,
    region: AtomicPtr<RegionInner>,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU32::new(FREE),
            seq: AtomicU32::new(0),
            base: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            inflight: AtomicU32::new(0),
            region: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Consistent (base, len) snapshot. Async-signal-safe.
    #[inline]
    fn range(&self) -> (usize, usize, u32) {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let b = self.base.load(Ordering::Acquire);
            let l = self.len.load(Ordering::Acquire);
            let s2 = self.seq.load(Ordering::Acquire);
            if s1 == s2 {
                return (b, l, s1);
            }
        }
    }
}

pub(crate) static SLOTS: [Slot; MAX_REGIONS] = [const { Slot::new() }; MAX_REGIONS];
/// One past the highest slot ever used (bounds the lookup scan).
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// A pinned lookup result: the region cannot be freed while the guard lives.
pub(crate) struct SlotGuard {
    slot: &'static Slot,
    /// The region is being unregistered: do not resolve, let the access retry.
    pub(crate) draining: bool,
    region: *const RegionInner,
    pub(crate) base: usize,
    pub(crate) len: usize,
}

impl SlotGuard {
    #[inline]
    pub(crate) fn region(&self) -> &RegionInner {
        // SAFETY: the in-flight count held by this guard keeps the region allocated (unregister
        // waits for it to drop to zero before freeing).
        unsafe { &*self.region }
    }
}

impl Drop for SlotGuard {
    #[inline]
    fn drop(&mut self) {
        self.slot.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Finds the active region containing `addr`, optionally restricted to those of context `ctx`.
/// Async-signal-safe: atomics only.
#[inline]
pub(crate) fn lookup(addr: usize, ctx: Option<*const Ctx>) -> Option<SlotGuard> {
    let high = HIGH.load(Ordering::Acquire);
    for slot in SLOTS.iter().take(high) {
        let st = slot.state.load(Ordering::Acquire);
        if st != ACTIVE && st != DRAINING {
            continue;
        }
        let (b, l, _) = slot.range();
        if addr < b || addr - b >= l {
            continue;
        }
        slot.inflight.fetch_add(1, Ordering::SeqCst);
        let st = slot.state.load(Ordering::SeqCst);
        if st != ACTIVE && st != DRAINING {
            slot.inflight.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (b, l, _) = slot.range();
        let region = slot.region.load(Ordering::Acquire);
        let ok = addr >= b && addr - b < l && !region.is_null();
        let ok = ok
            && match ctx {
                // SAFETY: region is pinned by our in-flight count.
                Some(c) => std::ptr::eq(Arc::as_ptr(unsafe { &(*region).ctx }), c),
                None => true,
            };
        if !ok {
            slot.inflight.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        return Some(SlotGuard {
            slot,
            draining: st == DRAINING,
            region,
            base: b,
            len: l,
        });
    }
    None
}

/// Returns the first active region overlapping `[base, base+len)` as (base, len). Caller holds
/// the engine registration lock.
pub(crate) fn find_overlap(base: usize, len: usize) -> Option<(usize, usize)> {
    let high = HIGH.load(Ordering::Acquire);
    for slot in SLOTS.iter().take(high) {
        if slot.state.load(Ordering::Acquire) != ACTIVE {
            continue;
        }
        let (b, l, _) = slot.range();
        if base < b + l && b < base + len {
            return Some((b, l));
        }
    }
    None
}

/// Snapshot of every active region: (slot index, base, len, region). Caller holds the
/// registration lock (so regions cannot be freed while it uses them).
pub(crate) fn snapshot() -> Vec<(usize, usize, usize, Arc<RegionInner>)> {
    let high = HIGH.load(Ordering::Acquire);
    let mut v = Vec::new();
    for (i, slot) in SLOTS.iter().enumerate().take(high) {
        if slot.state.load(Ordering::Acquire) != ACTIVE {
            continue;
        }
        let (b, l, _) = slot.range();
        let p = slot.region.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: p came from Arc::into_raw in `publish` and is alive while the slot is ACTIVE
        // and the registration lock is held; we add one strong count for the snapshot.
        let arc = unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        };
        v.push((i, b, l, arc));
    }
    v
}

/// Reserves a free slot index (caller holds the registration lock).
pub(crate) fn reserve() -> Result<usize> {
    for (i, slot) in SLOTS.iter().enumerate() {
        if slot.state.load(Ordering::Acquire) == FREE && slot.inflight.load(Ordering::SeqCst) == 0 {
            return Ok(i);
        }
    }
    Err(Error::TooManyRegions(MAX_REGIONS))
}

/// Publishes `region` in slot `i` (reserved by [`reserve`], caller holds the lock).
pub(crate) fn publish(i: usize, base: usize, len: usize, region: Arc<RegionInner>) {
    let slot = &SLOTS[i];
    set_range(i, base, len);
    slot.region
        .store(Arc::into_raw(region) as *mut RegionInner, Ordering::Release);
    slot.state.store(ACTIVE, Ordering::SeqCst);
    HIGH.fetch_max(i + 1, Ordering::AcqRel);
}

/// Moves slot `i` to a new range (mremap). Caller holds the lock.
pub(crate) fn set_range(i: usize, base: usize, len: usize) {
    let slot = &SLOTS[i];
    let s = slot.seq.load(Ordering::Relaxed);
    slot.seq.store(s.wrapping_add(1), Ordering::Release);
    std::sync::atomic::fence(Ordering::Release);
    slot.base.store(base, Ordering::Release);
    slot.len.store(len, Ordering::Release);
    slot.seq.store(s.wrapping_add(2), Ordering::Release);
}

/// Current range of slot `i`.
pub(crate) fn slot_range(i: usize) -> (usize, usize) {
    let (b, l, _) = SLOTS[i].range();
    (b, l)
}

/// Whether slot `i` currently holds `region`.
pub(crate) fn slot_holds(i: usize, region: *const RegionInner) -> bool {
    let slot = &SLOTS[i];
    slot.state.load(Ordering::Acquire) == ACTIVE
        && std::ptr::eq(slot.region.load(Ordering::Acquire), region)
}

/// First half of retiring slot `i`: lookups still match it but report `draining`, so
/// concurrent faults retry instead of resolving. Call before UFFDIO_UNREGISTER. Caller holds the
/// lock. Returns false if the slot was not active.
pub(crate) fn begin_retire(i: usize) -> bool {
    SLOTS[i]
        .state
        .compare_exchange(ACTIVE, DRAINING, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// Second half of retiring slot `i` (after UFFDIO_UNREGISTER or after the range was unmapped):
/// stops lookups from matching, waits for in-flight handlers to finish, frees the slot and
/// returns its region reference. Caller holds the lock. Must not be called from a resolver of
/// the same region (it would wait for itself).
pub(crate) fn finish_retire(i: usize) -> Option<Arc<RegionInner>> {
    let slot = &SLOTS[i];
    let st = slot.state.load(Ordering::SeqCst);
    if st != DRAINING && st != ACTIVE {
        return None;
    }
    slot.state.store(DEAD, Ordering::SeqCst);
    let mut spins = 0u32;
    while slot.inflight.load(Ordering::SeqCst) != 0 {
        spins += 1;
        if spins < 100 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let p = slot.region.swap(std::ptr::null_mut(), Ordering::AcqRel);
    slot.state.store(FREE, Ordering::SeqCst);
    if p.is_null() {
        None
    } else {
        // SAFETY: p came from Arc::into_raw in publish; we take that reference back exactly once.
        Some(unsafe { Arc::from_raw(p) })
    }
}
