//! The registration table: a fixed array of slots shared by the callers (any thread, including
//! an `mmap`/`munmap` hook of the preload library) and the one service thread, with no lock and
//! no allocation on the callers' side.
//!
//! A slot goes FREE → CLAIMED (a caller fills it in) → LIVE → DEAD (a caller unregisters) →
//! FREE (its generation incremented). The service populates a LIVE slot's range only between
//! `busy = 1` and `busy = 0`, and checks the state and generation after setting `busy`;
//! unregistering sets DEAD and then waits for `busy == 0`. Both sides use sequentially
//! consistent operations, so either the service sees DEAD and does not populate, or the
//! unregistering caller sees `busy` and waits for the call in flight. After `unregister`
//! returns, nothing is ever populated in the range again: the caller may munmap it, mremap it
//! or hand it to a file mapping.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

/// Most registrations at once.
pub const MAX_SLOTS: usize = 1024;

pub(crate) const FREE: u32 = 0;
pub(crate) const CLAIMED: u32 = 1;
pub(crate) const LIVE: u32 = 2;
pub(crate) const DEAD: u32 = 3;

/// One registration's shared part.
#[derive(Default)]
pub(crate) struct Slot {
    pub state: AtomicU32,
    pub gen: AtomicU32,
    pub busy: AtomicU32,
    pub base: AtomicUsize,
    pub len: AtomicUsize,
    pub policy: AtomicU64,
    /// Engine region index + 1 (0: plain memory).
    pub engine: AtomicU32,
    /// A hint: (page offset + 1) << 32 | pages (0: none).
    pub hint: AtomicU64,
    // Statistics, written by the service.
    pub populated_bytes: AtomicU64,
    pub calls: AtomicU64,
    pub hits: AtomicU64,
    pub failures: AtomicU64,
    /// Last errno of a failed populate.
    pub last_errno: AtomicU32,
    /// The order the service is using (Order as packed in policy bits 0..3), stride << 8.
    pub learned: AtomicU64,
}

/// The slot array, zero-filled by the allocator (a fresh mapping: 120 KiB of it is faulted in
/// page by page as slots are used, instead of all at the service's start, where writing each
/// `Slot::default()` took ~30 page faults in every process under the preload library).
fn zeroed_slots() -> Box<[Slot]> {
    let layout = std::alloc::Layout::array::<Slot>(MAX_SLOTS).expect("a fixed, small array");
    // SAFETY: a non-zero-sized layout. Every field of a Slot is an atomic integer, for which
    // all-zero bytes are a valid value (`Slot::default()` is exactly that), so the zeroed
    // memory is MAX_SLOTS initialised slots, owned by the Box built from it with the same
    // layout.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut Slot;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, MAX_SLOTS))
    }
}

pub(crate) struct Table {
    pub slots: Box<[Slot]>,
    /// One past the highest slot ever claimed.
    pub high: AtomicUsize,
    /// Registrations published and ended so far: the table changed since the service last
    /// looked when it differs (a change ends its quiet time; see `Shared::long_sleep`).
    pub changes: AtomicU64,
}

impl Table {
    pub fn new() -> Table {
        Table {
            slots: zeroed_slots(),
            high: AtomicUsize::new(0),
            changes: AtomicU64::new(0),
        }
    }

    /// Claims a free slot and publishes the registration; no lock, no allocation. Refuses an
    /// overlap with a live registration. Returns (slot, generation).
    pub fn claim(
        &self,
        base: usize,
        len: usize,
        policy: u64,
        engine: u32,
    ) -> Result<(u32, u32), crate::Error> {
        if let Some(i) = self.overlapping(base, len) {
            let s = &self.slots[i];
            return Err(crate::Error::Overlap(format!(
                "{:#x}..{:#x} overlaps the registration {:#x}..{:#x}",
                base,
                base + len,
                s.base.load(SeqCst),
                s.base.load(SeqCst) + s.len.load(SeqCst)
            )));
        }
        for (i, s) in self.slots.iter().enumerate() {
            if s.state
                .compare_exchange(FREE, CLAIMED, SeqCst, SeqCst)
                .is_ok()
            {
                s.base.store(base, SeqCst);
                s.len.store(len, SeqCst);
                s.policy.store(policy, SeqCst);
                s.engine.store(engine, SeqCst);
                s.hint.store(0, SeqCst);
                s.populated_bytes.store(0, SeqCst);
                s.calls.store(0, SeqCst);
                s.hits.store(0, SeqCst);
                s.failures.store(0, SeqCst);
                s.last_errno.store(0, SeqCst);
                s.learned.store(0, SeqCst);
                s.busy.store(0, SeqCst);
                self.high.fetch_max(i + 1, SeqCst);
                let gen = s.gen.load(SeqCst);
                s.state.store(LIVE, SeqCst);
                self.changes.fetch_add(1, SeqCst);
                return Ok((i as u32, gen));
            }
        }
        Err(crate::Error::Full(MAX_SLOTS))
    }

    /// The first live slot overlapping `[base, base+len)`.
    pub fn overlapping(&self, base: usize, len: usize) -> Option<usize> {
        let high = self.high.load(SeqCst);
        (0..high).find(|&i| {
            let s = &self.slots[i];
            if s.state.load(SeqCst) != LIVE {
                return false;
            }
            let b = s.base.load(SeqCst);
            let l = s.len.load(SeqCst);
            b < base + len && base < b + l
        })
    }

    /// Ends the registration (slot, gen) if it is still that one: after this returns no
    /// populate is in flight in its range and none will start. Returns whether it was live.
    pub fn release(&self, slot: u32, gen: u32) -> bool {
        let s = &self.slots[slot as usize];
        if s.gen.load(SeqCst) != gen
            || s.state
                .compare_exchange(LIVE, DEAD, SeqCst, SeqCst)
                .is_err()
        {
            return false;
        }
        while s.busy.load(SeqCst) != 0 {
            std::hint::spin_loop();
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        s.gen.fetch_add(1, SeqCst);
        s.state.store(FREE, SeqCst);
        self.changes.fetch_add(1, SeqCst);
        true
    }

    /// Ends every registration overlapping `[base, base+len)`; returns how many.
    pub fn release_range(&self, base: usize, len: usize) -> usize {
        let mut n = 0;
        while let Some(i) = self.overlapping(base, len) {
            let gen = self.slots[i].gen.load(SeqCst);
            if self.release(i as u32, gen) {
                n += 1;
            }
        }
        n
    }

    /// The service's side: enter a populate of slot `i` if it is still (LIVE, gen). The caller
    /// must call [`Table::leave`] after the populate when this returned true.
    pub fn enter(&self, i: usize, gen: u32) -> bool {
        let s = &self.slots[i];
        s.busy.store(1, SeqCst);
        if s.state.load(SeqCst) == LIVE && s.gen.load(SeqCst) == gen {
            return true;
        }
        s.busy.store(0, SeqCst);
        false
    }

    /// Ends a populate entered with [`Table::enter`].
    pub fn leave(&self, i: usize) {
        self.slots[i].busy.store(0, SeqCst);
    }

    /// In a child after fork: no service thread runs, so no populate is in flight whatever
    /// `busy` said at the fork.
    pub fn after_fork_child(&self) {
        for s in self.slots.iter() {
            s.busy.store(0, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn claim_refuses_overlap_and_release_frees() {
        let t = Table::new();
        let (a, ga) = t.claim(0x10000, 0x4000, 0, 0).unwrap();
        assert!(t.claim(0x13000, 0x4000, 0, 0).is_err());
        let (b, _) = t.claim(0x14000, 0x4000, 0, 0).unwrap();
        assert_ne!(a, b);
        assert!(t.release(a, ga));
        assert!(
            !t.release(a, ga),
            "a second release of the same generation is a no-op"
        );
        assert_eq!(t.release_range(0, 0x100000), 1);
        assert!(t.overlapping(0, 0x100000).is_none());
    }

    #[test]
    fn release_waits_for_the_populate_in_flight() {
        let t = Arc::new(Table::new());
        let (i, g) = t.claim(0x10000, 0x4000, 0, 0).unwrap();
        assert!(t.enter(i as usize, g));
        let done = Arc::new(AtomicBool::new(false));
        let (t2, d2) = (t.clone(), done.clone());
        let h = std::thread::spawn(move || {
            t2.release(i, g);
            d2.store(true, SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !done.load(SeqCst),
            "release returned while a populate was in flight"
        );
        t.leave(i as usize);
        h.join().unwrap();
        assert!(done.load(SeqCst));
        assert!(!t.enter(i as usize, g), "a released slot is never entered");
    }
}
