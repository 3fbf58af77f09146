//! Tour step `pager`: user-space paging with a DRAM budget (NVSwap). A 16 MiB region is paged
//! through a 2 MiB DRAM budget, a 4 MiB NVM buffer (an emulated pool) and a swap file under
//! `/var/tmp` (a disk): every page is written, then read back in a scrambled order and checked;
//! the step shows where the page-ins came from and that DRAM never held more than the budget
//! plus one eviction batch. Then an unmodified program, coreutils' `sort` with a 16 MiB buffer
//! (one `malloc`), runs under `tiermem pager run` with a 4 MiB budget and must print what it
//! prints without it.

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
    drop(r);
    drop(pager);
    let sorted = sort_under_pager_run(&dir)?;
    let us = |v: Option<u64>| v.map_or(0.0, |n| n as f64 / 1000.0);
    Ok(Outcome::Ok(format!(
        "a 16 MiB region through a 2 MiB DRAM budget: {} page-outs to the NVM buffer, {} \
         destaged to the swap file; {} page-ins from the buffer (p50 {:.1} µs), {} from the \
         swap file (p50 {:.1} µs); every page read back intact, DRAM peaked at {} of {} pages; \
         {sorted}",
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

/// `tiermem pager run --budget 4M -- sort -S 16M` on 4 MB of lines: the same output as plain
/// `sort`, and its exit report's page-ins.
fn sort_under_pager_run(dir: &std::path::Path) -> Result<String> {
    use std::process::Command;
    let input = dir.join("lines.txt");
    let body: String = (0..300_000u64)
        .map(|i| format!("{:012}\n", i.wrapping_mul(2_654_435_761) % 1_000_000_007))
        .collect();
    std::fs::write(&input, body).context("writing sort's input")?;
    let plain = Command::new("sort")
        .args(["-S", "16M", "--parallel=1"])
        .arg(&input)
        .output()
        .context("running sort")?;
    ensure!(plain.status.success(), "sort failed on its own");
    let stats = dir.join("sort-report.json");
    let exe = std::env::current_exe().context("locating tiermem")?;
    let paged = Command::new(exe)
        .args(["pager", "run", "--budget", "4M", "--nvm", "2M", "--dir"])
        .arg(dir)
        .arg("--stats")
        .arg(&stats)
        .args(["--", "sort", "-S", "16M", "--parallel=1"])
        .arg(&input)
        .env_remove("LD_PRELOAD")
        .output()
        .context("running tiermem pager run")?;
    ensure!(
        paged.status.success(),
        "tiermem pager run -- sort failed: {}",
        String::from_utf8_lossy(&paged.stderr)
    );
    ensure!(
        paged.stdout == plain.stdout,
        "sort under tiermem pager run printed something else than plain sort"
    );
    let report = std::fs::read_to_string(&stats).context("reading the exit report")?;
    let v: serde_json::Value = serde_json::from_str(report.lines().next().unwrap_or(""))
        .context("parsing the exit report")?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let ins = n("pageins_buffer") + n("pageins_ssd");
    ensure!(ins > 0, "sort's arena was never paged in: {v}");
    Ok(format!(
        "unmodified sort (16 MiB buffer) under `tiermem pager run --budget 4M`: same output as \
         plain, {ins} page-ins, DRAM peak {} of {} pages",
        n("max_resident_pages"),
        n("budget_pages")
    ))
}
