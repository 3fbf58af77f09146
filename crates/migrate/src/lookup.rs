//! The target's lookup table of dumped pages (paper 003 §IV: "a lookup table", an LRU list in
//! the CRIU prototype): which region offsets are known to be in the lazy-page file, so a fault
//! on them is served from FAM with no message to the source.
//!
//! Two facts, both only ever growing: the dump **watermark** (every page below it is dumped and
//! persisted) and a set of **ranges** dumped out of order on demand (the page-server's replies).
//! The table is read by fault resolvers that may run in a signal handler (in-thread resolution):
//! [`DumpedLookup::contains`] is lock-free and allocation-free — atomics over a fixed array.
//! Writers ([`DumpedLookup::advance`], [`DumpedLookup::insert`]) may run concurrently with
//! readers and with each other.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Ranges the table can hold before the oldest are forgotten (a forgotten range only costs a
/// message to the page-server again, never a wrong page).
pub const RANGE_SLOTS: usize = 1024;

/// Lock-free table of dumped region offsets (see the module documentation).
pub struct DumpedLookup {
    watermark: AtomicU64,
    /// Each slot: `start` and `end` (exclusive) of a dumped range; `end == 0` = empty. A slot is
    /// published by storing `end` last (Release) after `start`; readers load `end` (Acquire)
    /// first, then `start`, then `end` again to detect a concurrent overwrite.
    starts: Box<[AtomicU64]>,
    ends: Box<[AtomicU64]>,
    next: AtomicUsize,
}

impl Default for DumpedLookup {
    fn default() -> Self {
        Self::new()
    }
}

impl DumpedLookup {
    /// An empty table (watermark 0, no ranges).
    pub fn new() -> DumpedLookup {
        DumpedLookup {
            watermark: AtomicU64::new(0),
            starts: (0..RANGE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ends: (0..RANGE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// The dump watermark: every offset below it is dumped.
    #[inline]
    pub fn watermark(&self) -> u64 {
        self.watermark.load(Ordering::Acquire)
    }

    /// Raise the watermark to `w` (a lower value is ignored: the watermark never goes back).
    pub fn advance(&self, w: u64) {
        self.watermark.fetch_max(w, Ordering::AcqRel);
    }

    /// Record that `start..start + len` is dumped. When all slots are used the oldest range is
    /// overwritten (forgetting is safe; see [`RANGE_SLOTS`]).
    pub fn insert(&self, start: u64, len: u64) {
        if len == 0 || start.saturating_add(len) <= self.watermark() {
            return;
        }
        let i = self.next.fetch_add(1, Ordering::AcqRel) % RANGE_SLOTS;
        // Retire the slot first, so no reader pairs the old end with the new start.
        self.ends[i].store(0, Ordering::Release);
        self.starts[i].store(start, Ordering::Release);
        self.ends[i].store(start + len, Ordering::Release);
    }

    /// Whether `off` is known to be dumped. Async-signal-safe: loads only.
    #[inline]
    pub fn contains(&self, off: u64) -> bool {
        if off < self.watermark() {
            return true;
        }
        let used = self.next.load(Ordering::Acquire).min(RANGE_SLOTS);
        for i in 0..used {
            let end = self.ends[i].load(Ordering::Acquire);
            if end == 0 || off >= end {
                continue;
            }
            let start = self.starts[i].load(Ordering::Acquire);
            // Re-check that the slot was not rewritten between the two loads.
            if off >= start && self.ends[i].load(Ordering::Acquire) == end {
                return true;
            }
        }
        false
    }

    /// The dumped run that contains `off`, as `(start, end)`, bounded by `limit` bytes on each
    /// side of `off` (resolvers copy a whole known run at once); `None` if `off` is not known to
    /// be dumped.
    pub fn run_around(&self, off: u64, limit: u64) -> Option<(u64, u64)> {
        let w = self.watermark();
        if off < w {
            return Some((off.saturating_sub(limit), w.min(off.saturating_add(limit))));
        }
        let used = self.next.load(Ordering::Acquire).min(RANGE_SLOTS);
        for i in 0..used {
            let end = self.ends[i].load(Ordering::Acquire);
            if end == 0 || off >= end {
                continue;
            }
            let start = self.starts[i].load(Ordering::Acquire);
            if off >= start && self.ends[i].load(Ordering::Acquire) == end {
                return Some((
                    start.max(off.saturating_sub(limit)),
                    end.min(off.saturating_add(limit)),
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn watermark_and_ranges() {
        let t = DumpedLookup::new();
        assert!(!t.contains(0));
        t.advance(8192);
        assert!(t.contains(0) && t.contains(8191) && !t.contains(8192));
        t.advance(4096);
        assert_eq!(t.watermark(), 8192, "the watermark never goes back");
        t.insert(1 << 20, 2 << 20);
        assert!(t.contains(1 << 20) && t.contains((3 << 20) - 1));
        assert!(!t.contains(3 << 20) && !t.contains((1 << 20) - 1));
        assert_eq!(
            t.run_around(2 << 20, 4096),
            Some(((2 << 20) - 4096, (2 << 20) + 4096))
        );
        assert_eq!(t.run_around(100, 4096), Some((0, 4196)));
        assert_eq!(t.run_around(3 << 20, 4096), None);
    }

    #[test]
    fn overflow_forgets_oldest_but_never_lies() {
        let t = DumpedLookup::new();
        for i in 0..(RANGE_SLOTS as u64 + 10) {
            t.insert(i * 8192 + (1 << 30), 4096);
        }
        // The first ten ranges were forgotten; the rest are known; gaps never are.
        assert!(!t.contains(1 << 30));
        assert!(t.contains((1 << 30) + 10 * 8192));
        for i in 0..(RANGE_SLOTS as u64 + 10) {
            assert!(!t.contains(i * 8192 + 4096 + (1 << 30)), "gap {i}");
        }
    }

    #[test]
    fn concurrent_readers_see_only_dumped_offsets() {
        let t = Arc::new(DumpedLookup::new());
        for i in 0..RANGE_SLOTS as u64 {
            t.insert((2 * i + 1) * 4096, 4096); // known odd pages before the readers start
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Writer: ranges of odd 4 KiB pages only; readers check that no even page ever shows.
        let w = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    t.insert((2 * (i % 5000) + 1) * 4096, 4096);
                    i += 1;
                }
            })
        };
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut seen = 0u64;
                    for k in 0..200_000u64 {
                        let page = (k * 7 + r) % 10_000;
                        if t.contains(page * 4096) {
                            assert_eq!(page % 2, 1, "even page {page} reported dumped");
                            seen += 1;
                        }
                    }
                    seen
                })
            })
            .collect();
        let seen: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        w.join().unwrap();
        assert!(seen > 0);
    }
}
