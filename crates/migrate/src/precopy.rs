//! Pre-copy (a live baseline): while the application keeps running, copy the whole region to
//! FAM, then, in rounds, the pages written meanwhile (the fault engine's [`WriteTracker`]:
//! userfaultfd WP_ASYNC + PAGEMAP_SCAN), until a round is small; then freeze the application,
//! copy the last written pages and mark the lazy file complete. The target restores from FAM
//! alone ([`crate::fam::FamTarget::restore`] with no source): downtime is the last round plus
//! the restore.

use crate::checkpoint::Checkpoint;
use crate::fam::{migration_dir, FamError, Result};
use crate::lazyfile::LazyFile;
use crate::metrics::Metrics;
use std::path::Path;
use std::time::Instant;
use tiermem_fault::{PageRange, TrackerOptions, WriteTracker};
use tiermem_media::DelayModel;

/// Pre-copy settings.
#[derive(Clone, Debug)]
pub struct PreCopyOptions {
    /// Stop the live rounds when a round had fewer written bytes than this.
    pub small_round_bytes: u64,
    /// At most this many live rounds (after the full copy).
    pub max_rounds: u32,
    /// Delay model charged on the lazy file.
    pub delay: DelayModel,
}

impl Default for PreCopyOptions {
    fn default() -> Self {
        PreCopyOptions {
            small_round_bytes: 1 << 20,
            max_rounds: 8,
            delay: DelayModel::NONE,
        }
    }
}

/// What pre-copy did, beyond the common metrics.
#[derive(Clone, Debug, Default)]
pub struct PreCopyReport {
    /// The common metrics (downtime: freeze → every page final in FAM; the restore is the
    /// target's and is added by the caller).
    pub metrics: Metrics,
    /// Bytes copied in each round (round 0: the whole region; the last: after the freeze).
    pub round_bytes: Vec<u64>,
}

/// Pre-copy region `base..base + len` of a running application to `FAM/mig-<id>/` with the
/// state `blob`; `freeze` stops the application (it returns once nothing writes the region).
///
/// # Safety
/// `base..base + len` must be a page-aligned, private anonymous mapping of this process that
/// stays mapped until this returns; only the application writes it (and stops in `freeze`).
pub unsafe fn precopy(
    fam: &Path,
    id: u64,
    base: *mut u8,
    len: u64,
    blob: &[u8],
    opts: &PreCopyOptions,
    freeze: impl FnOnce(),
) -> Result<PreCopyReport> {
    let t0 = Instant::now();
    let dir = migration_dir(fam, id);
    std::fs::create_dir_all(&dir)
        .map_err(|e| FamError::Other(format!("creating {}: {e}", dir.display())))?;
    let file = LazyFile::create(&dir, "region-0.lazy", len, opts.delay)?;
    let mut tracker = WriteTracker::new(base, len as usize, TrackerOptions::default())?;
    // SAFETY: caller's contract: the mapping stays for this call.
    let region = unsafe { std::slice::from_raw_parts(base as *const u8, len as usize) };
    let mut ranges: Vec<PageRange> = Vec::new();
    // Round 0: everything (the tracker already records the writes made meanwhile).
    file.write_image(0, region)?;
    let mut round_bytes = vec![len];
    let copy = |ranges: &[PageRange]| -> Result<u64> {
        let mut b = 0;
        for r in ranges {
            file.write_image(r.offset as u64, &region[r.offset..r.offset + r.len])?;
            b += r.len as u64;
        }
        Ok(b)
    };
    for _ in 0..opts.max_rounds {
        tracker.scan(&mut ranges)?;
        let b = copy(&ranges)?;
        round_bytes.push(b);
        if b < opts.small_round_bytes {
            break;
        }
    }
    let frozen = Instant::now();
    freeze();
    tracker.scan(&mut ranges)?;
    let last = copy(&ranges)?;
    round_bytes.push(last);
    Checkpoint {
        region_lens: vec![len],
        blob: blob.to_vec(),
        hot: Vec::new(),
    }
    .write(&dir.join("checkpoint"))?;
    file.mark_complete()?;
    let busy_ns = t0.elapsed().as_nanos() as u64;
    let bytes = round_bytes.iter().sum();
    Ok(PreCopyReport {
        metrics: Metrics {
            method: "pre-copy".into(),
            downtime_ns: frozen.elapsed().as_nanos() as u64,
            busy_ns,
            total_ns: busy_ns,
            pages_pushed: bytes / 4096,
            bytes,
            ..Metrics::default()
        },
        round_bytes,
    })
}
