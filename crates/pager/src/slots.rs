//! Slot allocation for the paging buffer and the regular zone: a bitmap of free 4 KiB slots.
//!
//! The evictor thread allocates; faults free (a page read back into DRAM gives its slot up),
//! from a signal handler, so both sides are lock-free word operations. Allocation is next-fit
//! from a cursor; [`SlotMap::alloc_cluster`] takes one whole free word, 64 consecutive slots,
//! for a latency group destaged to consecutive slots (the paper's cluster-based slot management).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Slots per cluster (one bitmap word).
pub const CLUSTER: usize = 64;

/// A fixed set of slots, each free or used.
pub struct SlotMap {
    /// Bit set = slot free.
    words: Box<[AtomicU64]>,
    slots: usize,
    free: AtomicUsize,
    cursor: AtomicUsize,
}

impl SlotMap {
    /// `slots` slots, all free.
    pub fn new(slots: usize) -> SlotMap {
        let nwords = slots.div_ceil(64);
        let words: Box<[AtomicU64]> = (0..nwords)
            .map(|w| {
                let lo = w * 64;
                let n = (slots - lo).min(64);
                AtomicU64::new(if n == 64 { u64::MAX } else { (1u64 << n) - 1 })
            })
            .collect();
        SlotMap {
            words,
            slots,
            free: AtomicUsize::new(slots),
            cursor: AtomicUsize::new(0),
        }
    }

    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.slots
    }

    /// Free slots now.
    pub fn free(&self) -> usize {
        self.free.load(Ordering::Relaxed)
    }

    /// Takes one free slot (next-fit), or `None` when all are used.
    pub fn alloc(&self) -> Option<u64> {
        let n = self.words.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor.load(Ordering::Relaxed) % n;
        for i in 0..n {
            let w = (start + i) % n;
            let word = &self.words[w];
            let mut cur = word.load(Ordering::Relaxed);
            while cur != 0 {
                let bit = cur.trailing_zeros();
                match word.compare_exchange_weak(
                    cur,
                    cur & !(1u64 << bit),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.free.fetch_sub(1, Ordering::Relaxed);
                        self.cursor.store(w, Ordering::Relaxed);
                        return Some((w * 64) as u64 + bit as u64);
                    }
                    Err(now) => cur = now,
                }
            }
        }
        None
    }

    /// Takes [`CLUSTER`] consecutive free slots (one whole free word) and returns the first, or
    /// `None` when no word is entirely free.
    pub fn alloc_cluster(&self) -> Option<u64> {
        let n = self.words.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor.load(Ordering::Relaxed) % n;
        for i in 0..n {
            let w = (start + i) % n;
            if self.words[w]
                .compare_exchange(u64::MAX, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.free.fetch_sub(CLUSTER, Ordering::Relaxed);
                self.cursor.store(w + 1, Ordering::Relaxed);
                return Some((w * 64) as u64);
            }
        }
        None
    }

    /// Bitmap words (clusters), the last one possibly partial.
    pub fn words(&self) -> usize {
        self.words.len()
    }

    /// The used slots of word `w` as a bit mask (bit i: slot `64 w + i`).
    pub fn used_mask(&self, w: usize) -> u64 {
        let lo = w * 64;
        let n = (self.slots - lo).min(64);
        let valid = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        !self.words[w].load(Ordering::Acquire) & valid
    }

    /// Gives slot `s` back. Freeing a free slot is a bug in the caller; it is ignored (debug
    /// builds assert) so a count never goes wrong.
    pub fn release(&self, s: u64) {
        let (w, bit) = ((s / 64) as usize, s % 64);
        if w >= self.words.len() {
            debug_assert!(false, "slot {s} out of range");
            return;
        }
        let prev = self.words[w].fetch_or(1u64 << bit, Ordering::AcqRel);
        if prev & (1u64 << bit) == 0 {
            self.free.fetch_add(1, Ordering::Relaxed);
        } else {
            debug_assert!(false, "slot {s} freed twice");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_handed_out_once_and_come_back() {
        let m = SlotMap::new(130);
        let mut got: Vec<u64> = (0..130).map(|_| m.alloc().unwrap()).collect();
        assert!(m.alloc().is_none());
        assert_eq!(m.free(), 0);
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 130);
        assert!(got.iter().all(|&s| s < 130));
        m.release(5);
        assert_eq!(m.free(), 1);
        assert_eq!(m.alloc(), Some(5));
    }

    #[test]
    fn a_cluster_is_one_whole_free_word() {
        let m = SlotMap::new(200);
        let a = m.alloc().unwrap();
        let c = m.alloc_cluster().unwrap();
        assert_eq!(c % 64, 0);
        assert!(a < c || a >= c + 64);
        assert_eq!(m.free(), 200 - 1 - 64);
        // 200 slots: words 0..2 full, word 3 has 8 slots; one is taken by `a` and one by `c`.
        assert!(m.alloc_cluster().is_some());
        assert!(m.alloc_cluster().is_none());
        for s in c..c + 64 {
            m.release(s);
        }
        assert_eq!(m.alloc_cluster(), Some(c));
    }
}
