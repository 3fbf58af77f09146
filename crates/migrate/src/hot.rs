//! The hot-page manifest (issue #5, "beyond the paper"): the source records the pages the
//! application wrote most recently before the freeze ([`HotPageRecorder`]), the checkpoint
//! carries them ([`crate::checkpoint::Checkpoint::hot`]), the source's dumper writes the 2 MiB
//! vectors holding them before its ascending sweep (journaled as out-of-order ranges), and the
//! target touches them first ([`crate::fam::FamTarget::prefetch_hot`]) — from FAM, with no
//! message to the source — so the application's early faults on its working set need no
//! round trip.

use crate::checkpoint::MAX_HOT_PAGES;
use crate::lazyfile::{JOURNAL_SLOTS, VECTOR_SIZE};
use tiermem_fault::{PageRange, TrackerOptions, WriteTracker, PAGE_SIZE};

/// Journal slots left free for the page-server's on-demand vectors: hot vectors take at most
/// `JOURNAL_SLOTS - DEMAND_SLOTS` slots per region.
pub const DEMAND_SLOTS: usize = 64;

/// Most hot vectors dumped first per region (the journal must hold them all).
pub const MAX_HOT_VECTORS: usize = JOURNAL_SLOTS - DEMAND_SLOTS;

/// Records the pages written in one region (userfaultfd WP_ASYNC + PAGEMAP_SCAN through
/// [`WriteTracker`], or its mprotect fallback) so the source can hand them to the checkpoint.
///
/// The tracked range is registered with a private userfaultfd in write-protect mode for the
/// recorder's life: it must not be registered with another userfaultfd (e.g. a fault-engine
/// region), or [`HotPageRecorder::start`] fails. Drop the recorder to stop tracking.
#[derive(Debug)]
pub struct HotPageRecorder {
    tracker: WriteTracker,
    cap: usize,
    ranges: Vec<PageRange>,
}

impl HotPageRecorder {
    /// Start recording writes to `base..base + len` (page aligned, a mapped private anonymous
    /// or shmem range of this process). [`HotPageRecorder::take`] returns at most `cap` pages
    /// (clamped to `1..=MAX_HOT_PAGES`).
    pub fn start(base: *mut u8, len: usize, cap: usize) -> tiermem_fault::Result<Self> {
        Ok(HotPageRecorder {
            tracker: WriteTracker::new(base, len, TrackerOptions::default())?,
            cap: cap.clamp(1, MAX_HOT_PAGES),
            ranges: Vec::new(),
        })
    }

    /// The region offsets (ascending, page aligned) of the pages written since
    /// [`HotPageRecorder::start`] or the previous `take` (the most recent round only), at most
    /// the cap: beyond it the lowest offsets are kept. Re-arms tracking for the next round.
    pub fn take(&mut self) -> tiermem_fault::Result<Vec<u64>> {
        self.tracker.scan(&mut self.ranges)?;
        let mut out = Vec::new();
        for r in &self.ranges {
            for p in 0..r.pages() {
                out.push((r.offset + p * PAGE_SIZE) as u64);
            }
        }
        // A scan that raced with writers may report ranges out of order or twice.
        out.sort_unstable();
        out.dedup();
        out.truncate(self.cap);
        Ok(out)
    }
}

/// The vectors (indices of 2 MiB vectors) holding the hot offsets `hot`, the ones with the
/// most hot pages first (ties: ascending), at most [`MAX_HOT_VECTORS`]. Source and target use
/// the same order: the source dumps in it, the target prefetches in it.
pub fn hot_vectors(hot: &[u64]) -> Vec<u64> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for &o in hot {
        let v = o / VECTOR_SIZE;
        match counts.last_mut() {
            Some((lv, c)) if *lv == v => *c += 1,
            _ => counts.push((v, 1)),
        }
    }
    // The manifest is ascending, so equal vectors are adjacent; sort by count (stable: ties
    // keep ascending order).
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts.truncate(MAX_HOT_VECTORS);
    counts.into_iter().map(|(v, _)| v).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_by_heat_then_address() {
        let v = VECTOR_SIZE;
        let hot = [0, 4096, 3 * v, 3 * v + 4096, 3 * v + 8192, 5 * v];
        assert_eq!(hot_vectors(&hot), vec![3, 0, 5]);
        let many: Vec<u64> = (0..1000).map(|i| i * v).collect();
        assert_eq!(hot_vectors(&many).len(), MAX_HOT_VECTORS);
    }

    #[test]
    fn recorder_reports_the_written_pages_of_the_latest_round() {
        let len = 64 * PAGE_SIZE;
        // SAFETY: a fresh private anonymous mapping; checked; unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        let mut r = HotPageRecorder::start(p, len, 3).unwrap();
        for page in [9usize, 2, 40, 41] {
            // SAFETY: inside the mapping.
            unsafe { p.add(page * PAGE_SIZE + 5).write_volatile(1) };
        }
        // Capped at 3: the lowest offsets.
        assert_eq!(
            r.take().unwrap(),
            vec![2 * 4096, 9 * 4096, 40 * 4096],
            "ascending, capped"
        );
        // SAFETY: inside the mapping.
        unsafe { p.add(7 * PAGE_SIZE).write_volatile(1) };
        assert_eq!(r.take().unwrap(), vec![7 * 4096], "only the latest round");
        drop(r);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }
}
