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
    let mut counts = hot_vectors_all(hot);
    counts.truncate(MAX_HOT_VECTORS);
    counts.into_iter().map(|(v, _)| v).collect()
}

/// Every vector holding hot offsets, with its count of hot pages, hottest first (ties:
/// ascending).
fn hot_vectors_all(hot: &[u64]) -> Vec<(u64, usize)> {
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
    counts
}

/// How much of the medium's time the hot vectors may take before the sweep: what FAM
/// delivers in the first milliseconds after the target resumes. Dumping more ahead of the
/// sweep only reorders it (and a target waiting for them waits longer).
pub const HOT_BUDGET_NS: u64 = 4_000_000;

/// Vectors the medium `delay` writes within [`HOT_BUDGET_NS`] (at least 1, at most
/// [`MAX_HOT_VECTORS`]; 16 without a bandwidth model).
pub fn budget_vectors(delay: &tiermem_media::DelayModel) -> usize {
    let per_vec = delay.write_delay_ns(VECTOR_SIZE);
    if per_vec == 0 {
        return 16;
    }
    ((HOT_BUDGET_NS / per_vec) as usize).clamp(1, MAX_HOT_VECTORS)
}

/// A manifest pays only where the writes before the freeze were concentrated: its top
/// vectors must hold at least this many times their share of the region's vectors of the hot
/// pages (or 90 % of them, where that share is large).
pub const MIN_CONCENTRATION: f64 = 2.0;

/// The manifest the source sends (see [`crate::fam::FamSource::checkpoint_reserved_with_hot`]):
/// the pages of `hot` (ascending offsets in a region of `region_len` bytes) inside its
/// `max_vectors` hottest vectors ([`hot_vectors`] order), or none when those vectors hold less
/// than [`MIN_CONCENTRATION`] times their share of the region (at most 90 %) of the hot pages:
/// writes spread evenly over the region (a uniform or a scrambled zipfian update pattern) say
/// nothing about where the application goes next, and dumping some vectors first would only
/// delay the others.
pub fn select(hot: &[u64], max_vectors: usize, region_len: u64) -> Vec<u64> {
    let all = hot_vectors_all(hot);
    if all.is_empty() || max_vectors == 0 {
        return Vec::new();
    }
    let top: Vec<u64> = all.iter().take(max_vectors).map(|c| c.0).collect();
    let in_top: usize = all.iter().take(max_vectors).map(|c| c.1).sum();
    let share = top.len() as f64 / region_len.div_ceil(VECTOR_SIZE).max(1) as f64;
    let held = in_top as f64 / hot.len() as f64;
    if top.len() < all.len() && held < (MIN_CONCENTRATION * share).min(0.9) {
        return Vec::new();
    }
    hot.iter()
        .copied()
        .filter(|o| top.contains(&(o / VECTOR_SIZE)))
        .collect()
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
    fn the_manifest_keeps_concentrated_writes_and_drops_spread_ones() {
        let v = VECTOR_SIZE;
        let p = PAGE_SIZE as u64;
        // A sequential writer's frontier: 300 pages in vector 7, a few strays elsewhere.
        let mut seq: Vec<u64> = (0..300).map(|i| 7 * v + i * p).collect();
        seq.extend([v, 20 * v, 40 * v]);
        seq.sort_unstable();
        let region = 64 * v;
        let m = select(&seq, 2, region);
        assert_eq!(m.len(), 301, "vector 7 and one stray vector kept");
        assert!(m.iter().all(|o| o / v == 7 || o / v == 1));
        // Writes spread evenly over the 64 vectors (uniform updates): no manifest.
        let spread: Vec<u64> = (0..64)
            .flat_map(|x| (0..10).map(move |i| x * v + i * p))
            .collect();
        assert!(select(&spread, 4, region).is_empty());
        // The same spread within 8 of the 64 vectors: concentrated enough.
        let eighth: Vec<u64> = (56..64)
            .flat_map(|x| (0..10).map(move |i| x * v + i * p))
            .collect();
        assert_eq!(select(&eighth, 4, region).len(), 40);
        // Everything fits in the budget: kept whole.
        assert_eq!(select(&spread[..20], 4, region), spread[..20].to_vec());
        assert!(select(&[], 4, region).is_empty());
    }

    #[test]
    fn the_budget_is_what_the_medium_writes_in_the_first_milliseconds() {
        // pcm-fam: 2 GB/s, a 2 MiB vector in ~1 ms: 4 ms hold 3 vectors (rounded down).
        let fam = tiermem_media::DelayModel::preset("pcm-fam").unwrap();
        let n = budget_vectors(&fam);
        assert!((3..=4).contains(&n), "{n}");
        assert_eq!(budget_vectors(&tiermem_media::DelayModel::NONE), 16);
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
