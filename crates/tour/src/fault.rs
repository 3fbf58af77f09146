//! Tour step `fault`: an anonymous region filled lazily from an NVM pool by the userfaultfd
//! engine in the faulting thread (every page checked), then written-page tracking (one scan
//! returns exactly the pages written since the last one).

use super::{Ctx, Outcome};
use anyhow::{bail, ensure, Result};
use std::sync::Arc;
use std::time::Instant;
use tiermem_fault::{
    Engine, Fault, FaultOps, RegionSpec, ResolveError, Resolver, TrackerOptions, WriteTracker,
    PAGE_SIZE,
};
use tiermem_media::{Pool, PoolKind, PoolOptions};

/// Run the step in `ctx`'s directory; the pool it creates is removed before it returns.
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    let path = ctx.file("fault.nvm");
    let _cleanup = super::RemoveOnDrop::files(&[&path]);
    let pool = Arc::new(Pool::create(
        &path,
        &PoolOptions::new(64 << 20).kind(PoolKind::Nvm).tag("tour"),
    )?);
    let mut page = vec![0u8; PAGE_SIZE];
    for i in 0..pool.data_len() / PAGE_SIZE {
        fill_page(&mut page, i);
        pool.write((i * PAGE_SIZE) as u64, &page)?;
    }
    pool.persist(0, pool.data_len())?;
    say!("filled a 64 MiB NVM pool with a per-page pattern: the region below starts empty and is filled from it");
    let (pages, us) = fault_tour(&pool)?;
    let (tracked, ms) = tracking_tour()?;
    Ok(Outcome::Ok(format!(
        "{pages} pages filled on first touch ({us:.2} µs each, contents checked); a scan found exactly the {tracked} written pages in {ms:.2} ms"
    )))
}

/// Serves missing pages of an anonymous region from the pool (async-signal-safe: one copy).
struct PoolBacked {
    pool: Arc<Pool>,
}

impl Resolver for PoolBacked {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        // SAFETY: the region is no larger than the pool's data area (checked at registration
        // below), so [offset, offset + PAGE_SIZE) is inside the mapping, which outlives the region.
        let src =
            unsafe { std::slice::from_raw_parts(self.pool.data_ptr().add(f.offset), PAGE_SIZE) };
        self.pool.charge_read(PAGE_SIZE as u64);
        ops.copy(f.offset, src, false).map(|_| ())
    }
}

/// Returns the page count and the µs per page.
fn fault_tour(pool: &Arc<Pool>) -> Result<(usize, f64)> {
    let len = (pool.data_len() / PAGE_SIZE) * PAGE_SIZE;
    let region = AnonMap::new(len)?;
    let handle = Engine::global().register(
        RegionSpec::new(region.ptr, len).in_thread(),
        Arc::new(PoolBacked { pool: pool.clone() }),
    )?;
    say!(
        "registered {} MiB of anonymous memory (MISSING, {:?}); nothing is copied yet",
        len >> 20,
        handle.resolution()
    );
    let t = Instant::now();
    let mut expect = vec![0u8; PAGE_SIZE];
    let pages = len / PAGE_SIZE;
    for i in 0..pages {
        // SAFETY: i * PAGE_SIZE < len, inside the mapping; reading it triggers the fault.
        let got = unsafe { std::slice::from_raw_parts(region.ptr.add(i * PAGE_SIZE), PAGE_SIZE) };
        if i < 512 || i % 97 == 0 {
            fill_page(&mut expect, i);
            ensure!(
                got == &expect[..],
                "page {i} of the lazily filled region is wrong"
            );
        } else {
            std::hint::black_box(got[0]);
        }
    }
    let el = t.elapsed();
    say!(
        "touched all {pages} pages: {} faults resolved in-thread, {:.2} µs per page including the 4 KiB copy; contents verified",
        handle.faults(),
        el.as_secs_f64() * 1e6 / pages as f64
    );
    ensure!(
        handle.faults() as usize >= pages,
        "fewer faults than pages: the region was not lazy"
    );
    handle.unregister()?;
    Ok((pages, el.as_secs_f64() * 1e6 / pages as f64))
}

/// Returns the number of pages written and the scan's time in ms.
fn tracking_tour() -> Result<(usize, f64)> {
    let len = 256usize << 20;
    let region = AnonMap::new(len)?;
    // Populate it first, as a working set would be.
    for i in (0..len).step_by(PAGE_SIZE) {
        // SAFETY: i < len, inside our mapping.
        unsafe { region.ptr.add(i).write_volatile(1) };
    }
    let mut tracker = WriteTracker::new(region.ptr, len, TrackerOptions::default())?;
    let mut out = Vec::new();
    tracker.scan(&mut out)?;
    let pages = len / PAGE_SIZE;
    let written: Vec<usize> = (0..pages).filter(|p| p % 100 == 37).collect();
    for &p in &written {
        // SAFETY: p < pages, inside our mapping.
        unsafe { region.ptr.add(p * PAGE_SIZE + 8).write_volatile(2) };
    }
    let t = Instant::now();
    let n = tracker.scan(&mut out)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let mut got: Vec<usize> = out
        .iter()
        .flat_map(|r| (r.offset / PAGE_SIZE)..((r.offset + r.len) / PAGE_SIZE))
        .collect();
    got.sort_unstable();
    ensure!(
        got == written,
        "scan returned {} pages, {} were written",
        got.len(),
        written.len()
    );
    say!(
        "{} MiB populated, {} pages (1 %) written: one scan ({:?}) returned exactly those {n} pages in {ms:.3} ms and re-protected them",
        len >> 20,
        written.len(),
        tracker.method()
    );
    let n2 = tracker.scan(&mut out)?;
    ensure!(n2 == 0, "a second scan with no writes returned {n2} pages");
    say!("a second scan with no writes in between returned 0 pages");
    Ok((written.len(), ms))
}

/// Page `i` of the demo pattern.
pub(super) fn fill_page(buf: &mut [u8], i: usize) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8;
    }
}

/// An anonymous private mapping, unmapped on drop (also the prefault step's).
pub(super) struct AnonMap {
    pub(super) ptr: *mut u8,
    len: usize,
}

impl AnonMap {
    pub(super) fn new(len: usize) -> Result<AnonMap> {
        // SAFETY: a fresh anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(AnonMap { ptr: p.cast(), len })
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: we own this mapping.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
