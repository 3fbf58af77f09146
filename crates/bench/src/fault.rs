//! `tiermem bench fault`: what resolving a fault costs in each of the engine's modes against the
//! kernel's own first-touch fault, and written-page scans with userfaultfd WP_ASYNC + PAGEMAP_SCAN
//! against the mprotect + SIGSEGV baseline, on the same region in the same run.
//!
//! Order of measurement (issue #22): the engine's runtime thread (`tiermem-fault`) starts at its
//! first region and stays for the life of the process, and a second thread in the process makes
//! the kernel's write-protect paths (mprotect, userfaultfd write-protect) flush the TLB of every
//! CPU the process may have run on. So every path that does not use the engine — the kernel's
//! first touch, the bare mechanism (in a forked child), mprotect + SIGSEGV and both written-page
//! scans — is measured first, in a process with no thread but the benchmark's, and the three
//! engine paths last; the report lists them in the usual order.

use crate::machine;
use crate::stats::P50P99;
use crate::{cpu, progress, BenchOpts};
use anyhow::{Context, Result};
use serde::Serialize;
use tiermem_fault::{probe, TrackerOptions};

/// `bench fault`'s options: the common ones (`plot` writes the latency CDF).
pub type Options = BenchOpts;

/// One fault path's latency and CPU cost.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRow {
    pub path: &'static str,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p50_over_kernel_first_touch: f64,
    /// CPU microseconds per fault: the process's CPU (all threads, the engine's runtime thread
    /// included, and a probe's child) over the probe, divided by the faults. A handler thread
    /// that spins or wakes costs CPU its latency does not show.
    pub cpu_us_per_fault: f64,
    /// `cpu_us_per_fault` over the kernel first touch's.
    pub cpu_over_kernel_first_touch: f64,
}

/// One written-page scan method's median time.
#[derive(Debug, Clone, Serialize)]
pub struct ScanRow {
    pub method: String,
    pub region_mib: usize,
    pub written_pages: usize,
    pub median_scan_ms: f64,
    pub rounds: usize,
}

/// What `bench fault` measured; `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: machine::Machine,
    pub compared: &'static str,
    pub delay_model: &'static str,
    /// How the paths were kept apart: the ones without the engine were measured before its
    /// runtime thread started, with this many threads in the process.
    pub isolation: String,
    pub faults: Vec<FaultRow>,
    pub scans: Vec<ScanRow>,
    /// Median PAGEMAP_SCAN time over a 1 GiB region with 1 % written.
    pub scan_1gib_ms: f64,
    pub mprotect_over_pagemap_scan: f64,
}

const BARE: &str = "bare SIGBUS + UFFDIO_COPY (no engine)";
const IN_THREAD: &str = "engine, in-thread (SIGBUS)";

/// Run `bench fault`: every fault path, then the scans, and the latency CDF to `o.plot` when
/// set. Errors when a probe fails or WP_ASYNC tracking is unavailable.
pub fn run(o: &Options) -> Result<Report> {
    if let Some(p) = &o.plot {
        crate::plot::check_path(p)?;
    }
    let pages = if o.quick { 500 } else { 5000 };
    let rounds = if o.quick { 5 } else { 21 };
    type Probe = fn(usize) -> tiermem_fault::Result<Vec<f64>>;
    let paths: [(&'static str, Probe); 6] = [
        ("kernel first touch (baseline)", probe::first_touch_ns),
        (BARE, probe::uffd_sigbus_bare_ns),
        (IN_THREAD, probe::uffd_in_thread_ns),
        ("engine, handler thread, spinning", |p| {
            probe::uffd_handler_thread_spin_ns(p, 200)
        }),
        (
            "engine, handler thread, blocking",
            probe::uffd_handler_thread_ns,
        ),
        ("mprotect + SIGSEGV", probe::mprotect_fault_ns),
    ];
    // (samples in ns, CPU µs per fault) per path, in `paths`' order; the paths without the
    // engine are measured before its runtime thread exists (see the module doc).
    let mut measured: Vec<Option<(Vec<f64>, f64)>> = vec![None; paths.len()];
    let measure = |i: usize, measured: &mut Vec<Option<(Vec<f64>, f64)>>| -> Result<()> {
        let (name, f) = paths[i];
        progress(o.json, &format!("{pages} faults: {name}"));
        let c0 = cpu::self_and_children_s();
        let samples = f(pages).with_context(|| format!("measuring {name}"))?;
        let cpu_us = (cpu::self_and_children_s() - c0) * 1e6 / pages as f64;
        measured[i] = Some((samples, cpu_us));
        Ok(())
    };
    for i in [0, 1, 5] {
        measure(i, &mut measured)?;
    }
    progress(
        o.json,
        "1 GiB populated region, 1 % written: PAGEMAP_SCAN (WP_ASYNC)",
    );
    let uffd = probe::scan_written(1 << 30, 0.01, rounds, TrackerOptions::default())
        .context("PAGEMAP_SCAN tracking")?;
    progress(
        o.json,
        "1 GiB populated region, 1 % written: mprotect + SIGSEGV",
    );
    let mprot = probe::scan_written(
        1 << 30,
        0.01,
        rounds,
        TrackerOptions {
            force_mprotect: true,
            ..Default::default()
        },
    )
    .context("mprotect tracking")?;
    // The engine's paths last: their runtime thread stays.
    let threads_before_engine = threads();
    for i in [2, 3, 4] {
        measure(i, &mut measured)?;
    }
    let mut faults = Vec::new();
    let mut kernel_p50 = f64::NAN;
    let mut kernel_cpu = f64::NAN;
    let mut raw: Vec<(&'static str, Vec<f64>)> = Vec::new();
    for ((name, _), m) in paths.iter().zip(measured) {
        let (samples, cpu_us) = m.context("a fault path was not measured")?;
        let s = P50P99::from_ns_as_us(&samples);
        raw.push((name, samples.iter().map(|ns| ns / 1e3).collect()));
        if faults.is_empty() {
            kernel_p50 = s.p50;
            kernel_cpu = cpu_us;
        }
        faults.push(FaultRow {
            path: name,
            p50_us: s.p50,
            p99_us: s.p99,
            p50_over_kernel_first_touch: (s.p50 / kernel_p50 * 100.0).round() / 100.0,
            cpu_us_per_fault: (cpu_us * 100.0).round() / 100.0,
            cpu_over_kernel_first_touch: (cpu_us / kernel_cpu * 100.0).round() / 100.0,
        });
    }
    let mut scans = Vec::new();
    for b in [&uffd, &mprot] {
        scans.push(ScanRow {
            method: format!("{:?}", b.method),
            region_mib: (b.region_pages * 4096) >> 20,
            written_pages: b.written_pages,
            median_scan_ms: (b.median_ms * 1000.0).round() / 1000.0,
            rounds: b.scan_ms.len(),
        });
    }
    if format!("{:?}", uffd.method) == format!("{:?}", mprot.method) {
        anyhow::bail!(
            "userfaultfd WP_ASYNC tracking is not available here (fell back to mprotect)"
        );
    }
    let report = Report {
        machine: machine::describe(),
        compared: "fault resolution per engine mode vs the kernel's first-touch fault; written-page scans: WP_ASYNC + PAGEMAP_SCAN vs mprotect + SIGSEGV (each scan verified exact)",
        delay_model: "none (faults and scans touch DRAM only)",
        isolation: format!(
            "kernel first touch, bare mechanism (forked child), mprotect + SIGSEGV and both \
             scans measured before the engine's runtime thread started (threads in the process \
             then: {}), the engine's paths after",
            threads_before_engine.map_or_else(|| "?".to_string(), |n| n.to_string())
        ),
        faults,
        scans,
        scan_1gib_ms: (uffd.median_ms * 1000.0).round() / 1000.0,
        mprotect_over_pagemap_scan: (mprot.median_ms / uffd.median_ms * 100.0).round() / 100.0,
    };
    if let Some(path) = &o.plot {
        let series: Vec<crate::plot::Series> = raw
            .iter()
            .map(|(label, s)| crate::plot::Series { label, samples: s })
            .collect();
        crate::plot::cdf(
            path,
            &format!(
                "Fault resolution latency, {pages} faults per path ({})",
                report.machine.cpu_model
            ),
            "µs per fault (log scale)",
            &series,
        )?;
        progress(
            o.json,
            &format!("latency CDF written to {}", path.display()),
        );
    }
    Ok(report)
}

impl crate::Report for Report {
    fn print_table(&self) {
        let report = self;
        println!("tiermem bench fault — {}", report.compared);
        println!(
            "machine: {}\ndelay model: {}\n",
            report.machine.one_line(),
            report.delay_model
        );
        println!(
            "{:<40} {:>9} {:>9} {:>14} {:>12} {:>14}",
            "fault path", "p50 µs", "p99 µs", "p50 / kernel", "CPU µs", "CPU / kernel"
        );
        for r in &report.faults {
            println!(
                "{:<40} {:>9.2} {:>9.2} {:>13.2}× {:>12.2} {:>13.2}×",
                r.path,
                r.p50_us,
                r.p99_us,
                r.p50_over_kernel_first_touch,
                r.cpu_us_per_fault,
                r.cpu_over_kernel_first_touch
            );
        }
        println!(
            "\n{:<14} {:>10} {:>14} {:>16}",
            "tracking", "region", "pages written", "median scan ms"
        );
        for r in &report.scans {
            println!(
                "{:<14} {:>7} MiB {:>14} {:>16.3}",
                r.method, r.region_mib, r.written_pages, r.median_scan_ms
            );
        }
        let p50 = |path: &str| {
            report
                .faults
                .iter()
                .find(|r| r.path == path)
                .map(|r| r.p50_us)
        };
        if let (Some(engine), Some(bare)) = (p50(IN_THREAD), p50(BARE)) {
            println!(
                "\nthe engine's in-thread path costs {:+.2} µs against the bare mechanism at p50",
                engine - bare
            );
        }
        println!(
            "\nscan_1gib_ms = {:.3} (target ≤ 2); mprotect baseline is {:.2}× slower",
            report.scan_1gib_ms, report.mprotect_over_pagemap_scan
        );
    }
}

/// Threads of this process (`Threads:` of `/proc/self/status`).
fn threads() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}
