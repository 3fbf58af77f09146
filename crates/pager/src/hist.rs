//! A latency histogram that a signal handler can record into: fixed log-linear buckets of
//! atomics (32 per power of two, so a percentile is within about 3 % of the true value).
//!
//! `hdrhistogram` needs `&mut` and may grow; page-ins are recorded by whichever thread faulted,
//! inside its SIGBUS handler, so this one is lock-free and never allocates after `new`.
//! Readers take a [`HistSnapshot`]; the difference of two snapshots is a window (the latency
//! controller's).

use std::sync::atomic::{AtomicU64, Ordering};

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) * SUB as usize) + SUB as usize;

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
    ((e - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The smallest value that lands in bucket `i`.
fn lower(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let e = i / SUB - 1 + SUB_BITS as u64;
    let sub = i % SUB;
    (1u64 << e) | (sub << (e - SUB_BITS as u64))
}

/// The cells of a histogram: plain atomics with a fixed `repr(C)` layout, so they can live in
/// memory shared by processes (the pager pool's tenant table) as well as on the heap.
#[repr(C)]
pub struct HistCells {
    counts: [AtomicU64; BUCKETS],
    max: AtomicU64,
}

impl HistCells {
    /// Records one value (async-signal-safe).
    pub fn record(&self, ns: u64) {
        self.counts[index(ns)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> HistSnapshot {
        HistSnapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            max: self.max.load(Ordering::Relaxed),
        }
    }

    /// Empties it (not atomic as a whole: readers may see a mix while it runs).
    pub fn clear(&self) {
        for c in &self.counts {
            c.store(0, Ordering::Relaxed);
        }
        self.max.store(0, Ordering::Relaxed);
    }
}

/// Lock-free histogram of nanosecond values, on the heap.
pub struct AtomicHist {
    cells: Box<HistCells>,
}

impl Default for AtomicHist {
    fn default() -> Self {
        Self::new()
    }
}

impl AtomicHist {
    /// An empty histogram.
    pub fn new() -> AtomicHist {
        let layout = std::alloc::Layout::new::<HistCells>();
        // SAFETY: a non-zero-sized layout; all-zero bytes are valid atomics (an empty
        // histogram), and the allocation is handed to a Box of the same layout.
        let cells = unsafe {
            let p = std::alloc::alloc_zeroed(layout) as *mut HistCells;
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(p)
        };
        AtomicHist { cells }
    }
}

impl std::ops::Deref for AtomicHist {
    type Target = HistCells;
    fn deref(&self) -> &HistCells {
        &self.cells
    }
}

/// Counts of an [`AtomicHist`] at one moment.
#[derive(Clone)]
pub struct HistSnapshot {
    counts: Vec<u64>,
    max: u64,
}

impl std::fmt::Debug for HistSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{n: {}, p50: {:?}, p99: {:?}, max: {}}}",
            self.count(),
            self.quantile(0.5),
            self.quantile(0.99),
            self.max
        )
    }
}

impl HistSnapshot {
    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The values recorded since `older` (a window); `max` is the all-time maximum.
    pub fn since(&self, older: &HistSnapshot) -> HistSnapshot {
        HistSnapshot {
            counts: self
                .counts
                .iter()
                .zip(&older.counts)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            max: self.max,
        }
    }

    /// The `q`-quantile (0 < q ≤ 1) in ns: the lower bound of the bucket holding it, at most the
    /// maximum recorded. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(lower(i).min(self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_tight() {
        let mut last = 0;
        for v in [
            0u64,
            1,
            31,
            32,
            33,
            63,
            64,
            100,
            1000,
            12_345,
            1 << 40,
            u64::MAX,
        ] {
            let i = index(v);
            assert!(i < BUCKETS, "{v}");
            assert!(i >= last, "{v}");
            last = i;
            let lo = lower(i);
            assert!(lo <= v, "{v}: lower {lo}");
            assert!(v - lo <= v / 32 + 1, "{v}: lower {lo}");
        }
    }

    #[test]
    fn quantiles_of_a_known_spread() {
        let h = AtomicHist::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let s = h.snapshot();
        let p50 = s.quantile(0.5).unwrap() as f64;
        let p99 = s.quantile(0.99).unwrap() as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.04, "{p50}");
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.04, "{p99}");
        let before = h.snapshot();
        h.record(5);
        let w = h.snapshot().since(&before);
        assert_eq!(w.count(), 1);
        assert_eq!(w.quantile(0.99), Some(5));
        assert_eq!(AtomicHist::new().snapshot().quantile(0.5), None);
    }
}
