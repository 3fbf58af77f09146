//! The shadow mapping table: where each page of a paged region is, as one atomic word per page.
//!
//! The paper's table records the SSD address of pages flushed from the paging buffer without
//! touching the page table; here it records every page's place, because user space has no PTE
//! to look at. Entries hold offsets (slot numbers), never addresses. Every transition is a
//! compare-and-swap, so the fault path (in a signal handler) and the evictor thread agree on who
//! owns a page without a lock:
//!
//! ```text
//!   Zero ──fault──▶ Loading ──▶ Resident ──evictor──▶ Evicting ──▶ Buffer(slot) ──destage──▶ Ssd(slot)
//!     ▲                ▲                                              │                       │
//!     └─program drop   └──────────────────────── fault ───────────────┴───────────────────────┘
//! ```
//!
//! `Loading` and `Evicting` are held by one thread for the length of one copy; a fault that
//! finds them waits (yields) until they end.
//!
//! **Kept swap copies.** A page read back from the swap file keeps its slot while it is resident
//! or in the buffer (the kernel's swap cache does the same), and the table records, per page,
//! that slot and a 128-bit hash (XXH3) of the bytes last paged out. An eviction whose page hashes
//! to the same value is clean: it goes back to its kept slot with no write. Invariant: a kept
//! slot exists only while the page is `Resident`, `Buffer`, `Loading` or `Evicting`, and only the
//! thread that holds the page (a fault in `Loading`, the evictor or a drop in `Evicting`, or the
//! evictor for a `Buffer` page it claims) sets or takes it, except that the evictor may *steal*
//! a kept slot at any time to free swap space (one compare-and-swap: the slot goes to exactly one
//! of them); the hash is the evictor's alone.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Where a page is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Never written, or dropped by the program: reads as zeros, occupies nothing.
    Zero,
    /// In DRAM (mapped in the region), counted against the budget.
    Resident,
    /// Being copied into DRAM by a fault.
    Loading,
    /// Being moved out of DRAM by the evictor.
    Evicting,
    /// In the NVM paging buffer, slot `n`.
    Buffer(u64),
    /// In the regular zone (SSD swap file), slot `n`.
    Ssd(u64),
}

const SHIFT: u32 = 60;
const SLOT_MASK: u64 = (1 << SHIFT) - 1;

impl Place {
    /// The packed word.
    pub fn encode(self) -> u64 {
        match self {
            Place::Zero => 0,
            Place::Resident => 1 << SHIFT,
            Place::Loading => 2 << SHIFT,
            Place::Evicting => 3 << SHIFT,
            Place::Buffer(s) => (4 << SHIFT) | (s & SLOT_MASK),
            Place::Ssd(s) => (5 << SHIFT) | (s & SLOT_MASK),
        }
    }

    /// Unpacks a word written by [`Place::encode`] (unknown tags read as `Zero`, which cannot
    /// happen: only this module writes the table).
    pub fn decode(w: u64) -> Place {
        match w >> SHIFT {
            1 => Place::Resident,
            2 => Place::Loading,
            3 => Place::Evicting,
            4 => Place::Buffer(w & SLOT_MASK),
            5 => Place::Ssd(w & SLOT_MASK),
            _ => Place::Zero,
        }
    }
}

/// One entry per page of a region.
pub struct Shadow {
    entries: Box<[AtomicU64]>,
    /// Kept swap slot + 1 per page (0: none).
    kept: Box<[AtomicU64]>,
    /// XXH3-128 of each page's bytes when it was last paged out (two words per page).
    sums: Box<[AtomicU64]>,
    /// Pins per page: a pinned page is not evicted (a system call is using it).
    pins: Box<[AtomicU32]>,
}

impl Shadow {
    /// A table of `pages` entries, all [`Place::Zero`].
    pub fn new(pages: usize) -> Shadow {
        Shadow {
            entries: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            kept: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            sums: (0..2 * pages).map(|_| AtomicU64::new(0)).collect(),
            pins: (0..pages).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Pins page `p` (counted). With [`Shadow::pinned_after_claim`] this is Dekker's pattern:
    /// the pinner counts, then reads the place; the evictor claims, then reads the count; at
    /// least one of them sees the other, so a page is never moved out while pinned and seen
    /// `Resident` by its pinner.
    pub fn pin(&self, p: usize) {
        self.pins[p].fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Drops one pin of page `p`.
    pub fn unpin(&self, p: usize) {
        let prev = self.pins[p].fetch_sub(1, Ordering::SeqCst);
        debug_assert!(prev > 0, "unpin of an unpinned page");
    }

    /// For the evictor, after it claimed page `p`: whether someone pinned it (the claim must
    /// then be undone).
    pub fn pinned_after_claim(&self, p: usize) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.pins[p].load(Ordering::SeqCst) > 0
    }

    /// The swap slot page `p` keeps (a copy of its bytes as last paged out), if any.
    pub fn kept(&self, p: usize) -> Option<u64> {
        self.kept[p].load(Ordering::Acquire).checked_sub(1)
    }

    /// Records `slot` as page `p`'s kept swap copy. Only the thread holding the page may call
    /// this, and only when the page keeps no slot yet.
    pub fn set_kept(&self, p: usize, slot: u64) {
        self.kept[p].store(slot + 1, Ordering::Release);
    }

    /// Forgets page `p`'s kept slot and returns it (the caller frees or reuses it). Only the
    /// thread holding the page may call this.
    pub fn take_kept(&self, p: usize) -> Option<u64> {
        self.kept[p].swap(0, Ordering::AcqRel).checked_sub(1)
    }

    /// Takes page `p`'s kept slot away if it is still `slot` (the evictor reclaiming swap space
    /// whatever the page's state); true if the caller now owns the slot. Safe against the
    /// holder's [`Shadow::take_kept`]: exactly one of them gets the slot.
    pub fn steal_kept(&self, p: usize, slot: u64) -> bool {
        self.kept[p]
            .compare_exchange(slot + 1, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The hash recorded for page `p` at its last page-out (0 before any).
    pub fn sum(&self, p: usize) -> u128 {
        let lo = self.sums[2 * p].load(Ordering::Relaxed) as u128;
        let hi = self.sums[2 * p + 1].load(Ordering::Relaxed) as u128;
        (hi << 64) | lo
    }

    /// Records the hash of page `p`'s bytes as paged out now (the evictor only).
    pub fn set_sum(&self, p: usize, h: u128) {
        self.sums[2 * p].store(h as u64, Ordering::Relaxed);
        self.sums[2 * p + 1].store((h >> 64) as u64, Ordering::Relaxed);
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True for a table of no pages.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Where page `p` is now (acquire: the bytes of the slot it names are visible).
    pub fn get(&self, p: usize) -> Place {
        Place::decode(self.entries[p].load(Ordering::Acquire))
    }

    /// Moves page `p` from `from` to `to` if it is still at `from`; false if another thread
    /// moved it first.
    pub fn cas(&self, p: usize, from: Place, to: Place) -> bool {
        self.entries[p]
            .compare_exchange(
                from.encode(),
                to.encode(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Publishes page `p` at `to` (release). Only the thread that holds the page in `Loading`
    /// or `Evicting` may call this.
    pub fn set(&self, p: usize, to: Place) {
        self.entries[p].store(to.encode(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_round_trips_through_its_word() {
        for p in [
            Place::Zero,
            Place::Resident,
            Place::Loading,
            Place::Evicting,
            Place::Buffer(0),
            Place::Buffer(SLOT_MASK),
            Place::Ssd(7),
            Place::Ssd(1 << 40),
        ] {
            assert_eq!(Place::decode(p.encode()), p);
        }
    }

    #[test]
    fn a_cas_from_a_stale_place_fails() {
        let s = Shadow::new(2);
        assert!(s.cas(1, Place::Zero, Place::Loading));
        assert!(!s.cas(1, Place::Zero, Place::Loading));
        s.set(1, Place::Buffer(9));
        assert_eq!(s.get(1), Place::Buffer(9));
        assert_eq!(s.get(0), Place::Zero);
    }

    #[test]
    fn a_kept_slot_and_a_sum_are_per_page() {
        let s = Shadow::new(3);
        assert_eq!(s.kept(1), None);
        s.set_kept(1, 0);
        assert_eq!(s.kept(1), Some(0));
        assert_eq!(s.kept(2), None);
        assert_eq!(s.take_kept(1), Some(0));
        assert_eq!(s.take_kept(1), None);
        let h = (7u128 << 64) | 9;
        s.set_sum(2, h);
        assert_eq!(s.sum(2), h);
        assert_eq!(s.sum(1), 0);
    }
}
