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

use std::sync::atomic::{AtomicU64, Ordering};

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
}

impl Shadow {
    /// A table of `pages` entries, all [`Place::Zero`].
    pub fn new(pages: usize) -> Shadow {
        Shadow {
            entries: (0..pages).map(|_| AtomicU64::new(0)).collect(),
        }
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
}
