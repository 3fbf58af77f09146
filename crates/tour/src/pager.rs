//! Tour step `pager`: user-space paging with a DRAM budget (NVSwap). A 16 MiB region is paged
//! through a 2 MiB DRAM budget, a 4 MiB NVM buffer (an emulated pool) and a swap file under
//! `/var/tmp` (a disk): every page is written, then read back in a scrambled order and checked;
//! the step shows where the page-ins came from and that DRAM never held more than the budget
//! plus one eviction batch.

use super::{Ctx, Outcome};
use anyhow::{ensure, Context, Result};
use tiermem_pager::{Pager, PagerOptions};

const PS: usize = 4096;

/// Run the step; the swap file and the pool are removed at the end.
pub fn run(_ctx: &Ctx) -> Result<Outcome> {
    if !super::is_root() {
        return Ok(Outcome::Skipped(
            "needs root (userfaultfd for every user, a swap file under /var/tmp)".into(),
        ));
    }
    let dir = std::path::PathBuf::from(format!(
        "/var/tmp/tiermem-tour-pager-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _gone = super::RemoveOnDrop::dir(&dir);
    let budget = 2u64 << 20;
    let mut o = PagerOptions::new(budget, 4 << 20);
    o.swap_path = Some(dir.join("swap"));
    o.swap_size = Some(32 << 20);
    // Without control every page goes through the buffer, so both zones are seen.
    o.control.enabled = false;
    let pager = Pager::new(&o)?;
    let len = 16usize << 20;
    let pages = len / PS;
    let r = pager.map(len)?;
    let word = |p: usize| (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for p in 0..pages {
        // SAFETY: inside the region.
        unsafe { std::ptr::write_volatile(r.as_ptr().add(p * PS) as *mut u64, word(p)) };
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..pages {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = (x % pages as u64) as usize;
        // SAFETY: inside the region.
        let got = unsafe { std::ptr::read_volatile(r.as_ptr().add(p * PS) as *const u64) };
        ensure!(
            got == word(p),
            "page {p} reads {got:#x}, not what was written"
        );
    }
    for p in 0..pages {
        // SAFETY: inside the region.
        let got = unsafe { std::ptr::read_volatile(r.as_ptr().add(p * PS) as *const u64) };
        ensure!(got == word(p), "page {p} reads {got:#x} at the end");
    }
    let s = pager.stats();
    ensure!(
        s.pageins_buffer > 0 && s.pageins_ssd > 0,
        "expected page-ins from both zones: {} from the buffer, {} from the swap file",
        s.pageins_buffer,
        s.pageins_ssd
    );
    ensure!(
        s.max_resident_pages <= s.budget_pages + 32,
        "DRAM held {} pages, over the budget of {} + 32",
        s.max_resident_pages,
        s.budget_pages
    );
    let us = |v: Option<u64>| v.map_or(0.0, |n| n as f64 / 1000.0);
    Ok(Outcome::Ok(format!(
        "a 16 MiB region through a 2 MiB DRAM budget: {} page-outs to the NVM buffer, {} \
         destaged to the swap file; {} page-ins from the buffer (p50 {:.1} µs), {} from the \
         swap file (p50 {:.1} µs); every page read back intact, DRAM peaked at {} of {} pages",
        s.pageouts_buffer,
        s.destaged,
        s.pageins_buffer,
        us(s.pagein_buffer.quantile(0.5)),
        s.pageins_ssd,
        us(s.pagein_ssd.quantile(0.5)),
        s.max_resident_pages,
        s.budget_pages
    )))
}
