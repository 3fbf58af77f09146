//! Per-device access counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters a device updates on every access; all relaxed atomics, cheap to update from any
/// thread. Read them consistently enough for reporting with [`DeviceStats::snapshot`].
#[derive(Debug, Default)]
pub struct DeviceStats {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    delay_ns_injected: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    persists: AtomicU64,
    fences: AtomicU64,
}

/// A copy of [`DeviceStats`] at one instant (each counter read individually).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Bytes read (including bytes charged through `charge_read`).
    pub bytes_read: u64,
    /// Bytes written (including bytes charged through `charge_write`).
    pub bytes_written: u64,
    /// Total nanoseconds of delay injected by the delay model.
    pub delay_ns_injected: u64,
    /// Read operations.
    pub reads: u64,
    /// Write operations.
    pub writes: u64,
    /// Persist operations (flush + fence of a range, or msync/fsync).
    pub persists: u64,
    /// Store fences issued (including the one inside each persist).
    pub fences: u64,
}

impl StatsSnapshot {
    /// Counter-wise difference `self - earlier` (saturating at 0), for measuring an interval.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            delay_ns_injected: self
                .delay_ns_injected
                .saturating_sub(earlier.delay_ns_injected),
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            persists: self.persists.saturating_sub(earlier.persists),
            fences: self.fences.saturating_sub(earlier.fences),
        }
    }
}

impl DeviceStats {
    /// New zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Count one read of `bytes` bytes that was charged `delay_ns`.
    pub fn record_read(&self, bytes: u64, delay_ns: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.delay_ns_injected
            .fetch_add(delay_ns, Ordering::Relaxed);
    }

    /// Count one write of `bytes` bytes that was charged `delay_ns`.
    pub fn record_write(&self, bytes: u64, delay_ns: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        self.delay_ns_injected
            .fetch_add(delay_ns, Ordering::Relaxed);
    }

    /// Count one persist (which includes a fence, counted too).
    pub fn record_persist(&self) {
        self.persists.fetch_add(1, Ordering::Relaxed);
        self.fences.fetch_add(1, Ordering::Relaxed);
    }

    /// Count one stand-alone fence.
    pub fn record_fence(&self) {
        self.fences.fetch_add(1, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            delay_ns_injected: self.delay_ns_injected.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            persists: self.persists.load(Ordering::Relaxed),
            fences: self.fences.load(Ordering::Relaxed),
        }
    }

    /// Zero every counter.
    pub fn reset(&self) {
        for c in [
            &self.bytes_read,
            &self.bytes_written,
            &self.delay_ns_injected,
            &self.reads,
            &self.writes,
            &self.persists,
            &self.fences,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_accumulate_and_reset() {
        let s = DeviceStats::new();
        s.record_read(100, 7);
        s.record_write(50, 3);
        s.record_write(50, 0);
        s.record_persist();
        s.record_fence();
        let a = s.snapshot();
        assert_eq!(
            a,
            StatsSnapshot {
                bytes_read: 100,
                bytes_written: 100,
                delay_ns_injected: 10,
                reads: 1,
                writes: 2,
                persists: 1,
                fences: 2
            }
        );
        s.record_read(1, 1);
        assert_eq!(s.snapshot().since(&a).reads, 1);
        s.reset();
        assert_eq!(s.snapshot(), StatsSnapshot::default());
    }
}
