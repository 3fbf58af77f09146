//! `tiermem bench pager`: NVSwap's page-in tail against kernel swap, side by side in one run on
//! one disk (issue #16).
//!
//! A probe process owns D bytes of 1 KB records filled with incompressible bytes and runs YCSB-A
//! (50 % reads, 50 % updates, zipfian 0.99) on them, timing every operation with the TSC. An
//! operation whose thread took a page-in is a page-in sample: for kernel swap a change of the
//! thread's fault counts (`getrusage(RUSAGE_THREAD)`: a swap-in, from the disk or from the swap
//! cache), for the pager a change of [`tiermem_pager::thread_pageins`] (from the swap file or
//! the NVM buffer). Both probes make the same calls. Every read checks the record's bytes.
//!
//! Systems, each in a worker process of its own (one at a time):
//! * `kernel-swap`: the probe in a v1 memory cgroup whose limit is the budget plus the probe's
//!   own memory before it allocates, with a swap file of this run on `--dir` (`mkswap`,
//!   `swapon` at the highest priority); zswap off for the run. Swap file, cgroup and zswap's
//!   setting are restored even when the run fails.
//! * `pager-lru-ssd`: [`tiermem_pager::Pager`] without NVM buffer and without control.
//! * `pager-nolc` (full runs): with the buffer, without control (queue fixed at 128).
//! * `pager`: with the buffer (D/4) and control, the probe bounded at p99 ≤ 0.5 K, K being this
//!   run's kernel-swap page-in p99.
//!
//!
//! Then the application case (`pager_app.rs`): memcached under kernel swap and under
//! `tiermem pager run`, YCSB-A with `dataintegrity=true`; `app_p99_ratio_vs_kernel_swap.memcached`
//! is the ratio of YCSB's READ p99s.
//!
//! Not built yet, reported as null: the zswap and zram baselines, the concurrent and dynamic
//! cases (several probe processes sharing one pager needs the shared control segment), and
//! redis-server under the LD_PRELOAD shim (it installs its own SIGBUS handler).

use crate::snapshot::Cgroup;
use crate::worker::{self, Worker};
use crate::{machine, progress, BenchOpts, Report};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tiermem_migrate::workload::{PageGen, Workload};

const RECORD: usize = 1024;
const PAGE: usize = 4096;
const DEFAULT_DIR: &str = "/var/tmp/tiermem-pager-bench";

/// Options of `tiermem bench pager`.
#[derive(Args, Clone, Debug, Default)]
pub struct PagerBenchOpts {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub bench: BenchOpts,
    /// Directory for the swap files, on a disk (tmpfs is refused).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Data size D in MiB (default 2048; 256 with --quick). Budget D/2, NVM buffer D/4.
    #[arg(long, value_name = "MIB")]
    pub data_mib: Option<u64>,
    /// Timed seconds per system (default 30; 10 with --quick), after an untimed warm-up.
    #[arg(long)]
    pub seconds: Option<f64>,
}

/// One request to a probe worker.
#[derive(Serialize, Deserialize, Debug, Clone)]
enum ProbeReq {
    /// Join this cgroup (its `cgroup.procs`) and report the process's RSS in bytes.
    Join { procs: PathBuf },
    /// Run the probe.
    Run(RunSpec),
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct RunSpec {
    system: String,
    data: u64,
    budget: u64,
    nvm: u64,
    control: bool,
    swap_dir: PathBuf,
    bound_ns: Option<u64>,
    warmup_s: f64,
    seconds: f64,
    seed: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct RunReply {
    ops: u64,
    wall_s: f64,
    cpu_s: f64,
    pageins: u64,
    pagein_p50_us: f64,
    pagein_p99_us: f64,
    op_p99_us: f64,
    /// Up to 4000 page-in samples (µs), evenly spread over the sorted set, for the CDF.
    cdf_us: Vec<f64>,
    verify_errors: u64,
    pageout_p99_us: Option<f64>,
    nvm_served_frac: Option<f64>,
    max_resident_bytes: Option<u64>,
    leaked_slots: Option<u64>,
    queue: Option<usize>,
    /// The pager's own view of its page-ins in the timed part: from the swap file, from the
    /// buffer (p99, µs), and faults that waited for the evictor at the hard cap.
    ssd_pagein_p99_us: Option<f64>,
    buffer_pagein_p99_us: Option<f64>,
    over_budget_waits: Option<u64>,
    swap_write_pages: Option<u64>,
    clean_pageout_frac: Option<f64>,
}

/// One row of the report.
#[derive(Serialize, Debug, Clone)]
pub struct Row {
    pub case: String,
    pub system: String,
    pub process: String,
    pub bound_us: Option<f64>,
    pub pagein_p50_us: f64,
    pub pagein_p99_us: f64,
    pub pageout_p99_us: Option<f64>,
    pub op_p99_us: f64,
    pub ops_per_s: f64,
    pub cpu_s: f64,
    pub pageins: u64,
    pub bound_met: Option<bool>,
    pub nvm_served_frac: Option<f64>,
    pub budget_respected: bool,
    pub peak_bytes: u64,
    /// Pager rows: page-in p99 from the swap file and from the buffer, µs, and faults that
    /// waited for the evictor at the hard cap (the timed part).
    pub ssd_pagein_p99_us: Option<f64>,
    pub buffer_pagein_p99_us: Option<f64>,
    pub over_budget_waits: Option<u64>,
    /// Pager rows: pages written to the swap file in the timed part (page-outs and destages),
    /// and the share of swap-bound page-outs that wrote nothing (clean, kept swap copy).
    pub swap_write_pages: Option<u64>,
    pub clean_pageout_frac: Option<f64>,
    /// Application rows: YCSB's UPDATE p99, µs (`op_p99_us` is READ's).
    pub update_p99_us: Option<f64>,
}

/// Bounds met per case (null: the case did not run).
#[derive(Serialize, Debug, Clone, Default)]
pub struct BoundsMet {
    pub single: Option<bool>,
    pub concurrent: Option<bool>,
    pub dynamic: Option<bool>,
}

/// Application p99 ratios under the shim (null: not built yet).
#[derive(Serialize, Debug, Clone, Default)]
pub struct AppRatios {
    pub memcached: Option<f64>,
    pub redis: Option<f64>,
}

/// The report of `tiermem bench pager`.
#[derive(Serialize, Debug)]
pub struct PagerReport {
    pub machine: machine::Machine,
    pub quick: bool,
    pub data_bytes: u64,
    pub budget_bytes: u64,
    pub nvm_bytes: u64,
    pub seconds: f64,
    pub results: Vec<Row>,
    pub kernel_p99_us: f64,
    pub ssd_iops: f64,
    pub nvm_iops: f64,
    pub p99_ratio_vs_kernel_swap: Option<f64>,
    pub p99_ratio_vs_kernel_zram: Option<f64>,
    pub p50_ratio_vs_kernel_swap: Option<f64>,
    pub p99_ratio_vs_lru_ssd: Option<f64>,
    pub pageout_p99_ratio_vs_lru_ssd: Option<f64>,
    pub throughput_ratio_vs_kernel_swap: Option<f64>,
    pub app_p99_ratio_vs_kernel_swap: AppRatios,
    pub bounds_met: BoundsMet,
    pub verify_errors: u64,
    pub leaked_slots: u64,
    pub cdf_png: Option<String>,
    pub notes: Vec<String>,
}

impl Report for PagerReport {
    fn print_table(&self) {
        println!(
            "bench pager: D {} MiB, budget {} MiB, NVM buffer {} MiB, {} s per system{}",
            self.data_bytes >> 20,
            self.budget_bytes >> 20,
            self.nvm_bytes >> 20,
            self.seconds,
            if self.quick { " (quick)" } else { "" }
        );
        println!(
            "{:<24} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>6} {:>6} {:>7} {:>7}",
            "system",
            "bound µs",
            "in p50 µs",
            "in p99 µs",
            "out p99 µs",
            "op p99 µs",
            "ops/s",
            "page-ins",
            "CPU s",
            "NVM %",
            "clean %",
            "met"
        );
        let pc = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{:.0}", x * 100.0));
        let o = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
        for r in &self.results {
            println!(
                "{:<24} {:>9} {:>10} {:>10} {:>10} {:>10.1} {:>10.0} {:>8} {:>6.1} {:>6} {:>7} {:>7}",
                if r.case == "single" {
                    r.system.clone()
                } else {
                    format!("{}/{}", r.case, r.system)
                },
                o(r.bound_us),
                o(Some(r.pagein_p50_us).filter(|x| x.is_finite())),
                o(Some(r.pagein_p99_us).filter(|x| x.is_finite())),
                o(r.pageout_p99_us),
                r.op_p99_us,
                r.ops_per_s,
                r.pageins,
                r.cpu_s,
                pc(r.nvm_served_frac),
                pc(r.clean_pageout_frac),
                r.bound_met.map_or("-", |b| if b { "yes" } else { "NO" })
            );
        }
        println!(
            "K (kernel-swap page-in p99) {:.1} µs; calibrated SSD {:.0} IOPS, NVM {:.0} IOPS",
            self.kernel_p99_us, self.ssd_iops, self.nvm_iops
        );
        let r = |v: Option<f64>| v.map_or("null".to_string(), |x| format!("{x:.3}"));
        println!(
            "p99 vs kernel-swap {} (≤ 0.5), vs lru-ssd {} (≤ 0.5), p50 vs kernel-swap {}, page-out \
             p99 vs lru-ssd {}, throughput vs kernel-swap {}",
            r(self.p99_ratio_vs_kernel_swap),
            r(self.p99_ratio_vs_lru_ssd),
            r(self.p50_ratio_vs_kernel_swap),
            r(self.pageout_p99_ratio_vs_lru_ssd),
            r(self.throughput_ratio_vs_kernel_swap)
        );
        println!(
            "memcached (YCSB-A READ p99, op p99 column) under the pager vs kernel swap: {} (≤ 0.9)",
            r(self.app_p99_ratio_vs_kernel_swap.memcached)
        );
        println!(
            "verify errors {}, leaked slots {}, CDF {}",
            self.verify_errors,
            self.leaked_slots,
            self.cdf_png.as_deref().unwrap_or("-")
        );
        for n in &self.notes {
            println!("note: {n}");
        }
    }

    /// A run that read back a wrong byte or leaked a slot failed, whatever its latencies.
    fn outcome(&self) -> Result<()> {
        if self.verify_errors > 0 || self.leaked_slots > 0 {
            bail!(
                "bench pager: {} verify errors, {} leaked slots",
                self.verify_errors,
                self.leaked_slots
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The probe (worker side).
// ---------------------------------------------------------------------------------------------

/// The worker side: `tiermem bench pager-run`.
pub fn run_worker_main() -> Result<()> {
    worker::serve(|r: ProbeReq| match r {
        ProbeReq::Join { procs } => {
            std::fs::write(&procs, "0")
                .with_context(|| format!("joining the cgroup ({})", procs.display()))?;
            Ok(Some(serde_json::to_value(self_rss()?)?))
        }
        ProbeReq::Run(spec) => Ok(Some(serde_json::to_value(probe(&spec)?)?)),
    })
}

fn self_rss() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in /proc/self/status"))?;
    Ok(kb * 1024)
}

/// Record `r`'s bytes at `version`: a xorshift stream (incompressible), tagged at the start.
fn fill_record(dst: &mut [u8], r: u64, version: u32) {
    let mut x = tiermem_migrate::workload::mix64(r ^ ((version as u64) << 40)) | 1;
    for w in dst.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
}

/// Whether the record's first 64 and last 8 bytes are what `version` wrote.
fn check_record(src: &[u8], r: u64, version: u32) -> bool {
    let mut want = [0u8; RECORD];
    fill_record(&mut want, r, version);
    src[..64] == want[..64] && src[RECORD - 8..] == want[RECORD - 8..]
}

fn thread_faults() -> u64 {
    // SAFETY: getrusage fills a zeroed struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (ru.ru_majflt + ru.ru_minflt) as u64
}

fn probe(spec: &RunSpec) -> Result<RunReply> {
    let records = spec.data / RECORD as u64;
    let kernel = spec.system.starts_with("kernel");
    let mut pager = None;
    let mut region = None;
    let base: *mut u8 = if kernel {
        // SAFETY: anonymous mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                spec.data as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mmap of {} bytes: {}",
                spec.data,
                std::io::Error::last_os_error()
            );
        }
        // 4 KiB pages, as the pager moves them.
        // SAFETY: our mapping.
        unsafe { libc::madvise(p, spec.data as usize, libc::MADV_NOHUGEPAGE) };
        p as *mut u8
    } else {
        let mut o = tiermem_pager::PagerOptions::new(spec.budget, spec.nvm);
        o.swap_path = Some(
            spec.swap_dir
                .join(format!("pager-{}.swap", std::process::id())),
        );
        o.swap_size = Some(spec.data + (64 << 20));
        o.control.enabled = spec.control;
        let pg = tiermem_pager::Pager::new(&o)?;
        let r = pg.map(spec.data as usize)?;
        if let Some(b) = spec.bound_ns {
            r.set_bound(0.99, b)?;
        }
        let p = r.as_ptr();
        pager = Some(pg);
        region = Some(r);
        p
    };
    // SAFETY: the mapping is ours for the whole probe; one thread uses it.
    let mem = unsafe { std::slice::from_raw_parts_mut(base, spec.data as usize) };
    let mut versions = vec![0u32; records as usize];
    for r in 0..records {
        let at = r as usize * RECORD;
        fill_record(&mut mem[at..at + RECORD], r, 0);
    }
    let mut keys = PageGen::new(Workload::Zipfian, records, spec.seed);
    let mut dice = PageGen::new(Workload::Uniform, 100, spec.seed ^ 0xd1ce);
    let mut verify_errors = 0u64;
    let mut op = |mem: &mut [u8], versions: &mut [u32]| -> (u64, bool) {
        let r = keys.next_page();
        let at = r as usize * RECORD;
        let f0 = thread_faults();
        let p0 = tiermem_pager::thread_pageins();
        let t0 = tiermem_media::now_ns();
        if dice.next_page() < 50 {
            if !check_record(&mem[at..at + RECORD], r, versions[r as usize]) {
                verify_errors += 1;
            }
        } else {
            let v = versions[r as usize].wrapping_add(1);
            fill_record(&mut mem[at..at + RECORD], r, v);
            versions[r as usize] = v;
        }
        let d = tiermem_media::now_ns() - t0;
        let paged = if kernel {
            thread_faults() != f0
        } else {
            thread_faults();
            tiermem_pager::thread_pageins() != p0
        };
        (d, paged)
    };
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < spec.warmup_s {
        for _ in 0..256 {
            op(mem, &mut versions);
        }
    }
    let s0 = pager.as_ref().map(|p| p.stats());
    let c0 = crate::cpu::process_ns();
    let t0 = Instant::now();
    let mut ops = 0u64;
    let mut all = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut pageins: Vec<u64> = Vec::with_capacity(1 << 20);
    while t0.elapsed().as_secs_f64() < spec.seconds {
        for _ in 0..256 {
            let (d, paged) = op(mem, &mut versions);
            all.record(d.max(1))?;
            if paged {
                pageins.push(d);
            }
            ops += 1;
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = (crate::cpu::process_ns() - c0) as f64 / 1e9;
    // Everything read back once, untimed.
    for r in 0..records {
        let at = r as usize * RECORD;
        if !check_record(&mem[at..at + RECORD], r, versions[r as usize]) {
            verify_errors += 1;
        }
    }
    pageins.sort_unstable();
    let pct = |q: f64| -> f64 {
        if pageins.is_empty() {
            return 0.0;
        }
        let i = ((q * pageins.len() as f64).ceil() as usize).clamp(1, pageins.len()) - 1;
        pageins[i] as f64 / 1000.0
    };
    let step = (pageins.len() / 4000).max(1);
    let cdf_us: Vec<f64> = pageins
        .iter()
        .step_by(step)
        .map(|&d| d as f64 / 1000.0)
        .collect();
    let mut reply = RunReply {
        ops,
        wall_s,
        cpu_s,
        pageins: pageins.len() as u64,
        pagein_p50_us: pct(0.5),
        pagein_p99_us: pct(0.99),
        op_p99_us: all.value_at_quantile(0.99) as f64 / 1000.0,
        cdf_us,
        verify_errors,
        ..RunReply::default()
    };
    if let (Some(pg), Some(s0)) = (&pager, s0) {
        let s1 = pg.stats();
        let out = s1.pageout.since(&s0.pageout);
        reply.pageout_p99_us = out.quantile(0.99).map(|v| v as f64 / 1000.0);
        let from_nvm = s1.pageins_buffer - s0.pageins_buffer;
        let from_ssd = s1.pageins_ssd - s0.pageins_ssd;
        reply.nvm_served_frac = Some(from_nvm as f64 / (from_nvm + from_ssd).max(1) as f64);
        reply.max_resident_bytes = Some((s1.max_resident_pages * PAGE) as u64);
        reply.queue = Some(s1.queue);
        let us = |v: Option<u64>| v.map(|n| n as f64 / 1000.0);
        reply.ssd_pagein_p99_us = us(s1.pagein_ssd.since(&s0.pagein_ssd).quantile(0.99));
        reply.buffer_pagein_p99_us = us(s1.pagein_buffer.since(&s0.pagein_buffer).quantile(0.99));
        reply.over_budget_waits = Some(s1.over_budget_waits - s0.over_budget_waits);
        if std::env::var_os("TIERMEM_PAGER_TRACE").is_some() {
            eprintln!("tiermem-pager: stats after the timed part: {s1:?}");
        }
        let written = (s1.pageouts_ssd - s0.pageouts_ssd) + (s1.destaged - s0.destaged);
        let clean =
            (s1.pageouts_clean - s0.pageouts_clean) + (s1.destaged_clean - s0.destaged_clean);
        reply.swap_write_pages = Some(written);
        reply.clean_pageout_frac = Some(clean as f64 / (clean + written).max(1) as f64);
        drop(region.take());
        pg.settle();
        let s2 = pg.stats();
        reply.leaked_slots = Some((s2.buffer_used + s2.swap_used + s2.resident_pages) as u64);
    } else {
        // SAFETY: our mapping.
        unsafe { libc::munmap(base as *mut libc::c_void, spec.data as usize) };
    }
    Ok(reply)
}

// ---------------------------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------------------------

/// A swap file of this run: created, `mkswap`ed and enabled at the highest priority; disabled
/// and removed on drop.
struct SwapFile {
    path: PathBuf,
    on: bool,
}

impl SwapFile {
    fn create(path: &Path, bytes: u64) -> Result<SwapFile> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(path);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("creating the swap file {}", path.display()))?;
        let mut sw = SwapFile {
            path: path.to_path_buf(),
            on: false,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: fallocate on our open file.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, bytes as libc::off_t) } != 0 {
            bail!(
                "allocating {} bytes for {}: {}",
                bytes,
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        drop(f);
        let out = std::process::Command::new("mkswap")
            .arg(path)
            .output()
            .context("running mkswap (util-linux)")?;
        if !out.status.success() {
            bail!(
                "mkswap {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
        const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
        // SAFETY: swapon with a valid path.
        if unsafe { libc::swapon(c.as_ptr(), SWAP_FLAG_PREFER | 32767) } != 0 {
            bail!(
                "swapon {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        sw.on = true;
        Ok(sw)
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        if self.on {
            if let Ok(c) = std::ffi::CString::new(self.path.as_os_str().as_bytes()) {
                // SAFETY: swapoff with a valid path.
                if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
                    progress::note(&format!(
                        "warning: swapoff {}: {}",
                        self.path.display(),
                        std::io::Error::last_os_error()
                    ));
                }
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// zswap turned off for the run (kernel swap must reach the disk), restored on drop.
struct ZswapOff {
    was: Option<String>,
}

const ZSWAP: &str = "/sys/module/zswap/parameters/enabled";

impl ZswapOff {
    fn new() -> ZswapOff {
        let was = std::fs::read_to_string(ZSWAP)
            .ok()
            .map(|s| s.trim().to_string());
        if was.as_deref() == Some("Y") {
            let _ = std::fs::write(ZSWAP, "N");
        }
        ZswapOff { was }
    }
}

impl Drop for ZswapOff {
    fn drop(&mut self) {
        if self.was.as_deref() == Some("Y") {
            let _ = std::fs::write(ZSWAP, "Y");
        }
    }
}

struct Measured {
    /// Bytes the kernel-swap cgroup allowed over the budget (0 for the pager).
    limit_over_budget: u64,
    system: String,
    bound_ns: Option<u64>,
    reply: RunReply,
    peak: u64,
    budget_ok: bool,
}

/// What kernel swap's cgroup gets beyond the budget and the program's own memory at start:
/// room for the swap cache's readahead. With only a few MiB over the working set, memcg v1 (no
/// dirty throttling) OOM-kills the program while swap writeback lags (seen at 64 MiB).
pub(crate) fn kernel_slack(budget: u64) -> u64 {
    (16 << 20) + budget / 32
}

fn run_one(
    system: &str,
    spec: RunSpec,
    cgroup: Option<&Cgroup>,
    timeout: Duration,
) -> Result<(RunReply, u64, bool, u64)> {
    let mut w = Worker::spawn(
        system,
        &["bench".into(), "pager-run".into()],
        timeout,
        vec![],
    )?;
    let mut limit = None;
    if let Some(cg) = cgroup {
        let rss: u64 = w.call(
            &ProbeReq::Join {
                procs: cg.procs_path(),
            },
            "join",
        )?;
        // The budget for the data, plus what the probe held before allocating it, plus room
        // for the swap cache's readahead: with only a few MiB over the working set, memcg v1
        // (no dirty throttling) OOM-kills the probe while swap writeback lags (seen at 64 MiB).
        let l = spec.budget + rss + kernel_slack(spec.budget);
        cg.set_limit(l)?;
        limit = Some(l);
    }
    let budget = spec.budget;
    let reply: RunReply = w.call(&ProbeReq::Run(spec), "run")?;
    w.finish()?;
    let (peak, ok) = match (cgroup, limit) {
        (Some(cg), Some(l)) => {
            let p = cg.max_usage()?;
            (p, p <= l)
        }
        _ => {
            let p = reply.max_resident_bytes.unwrap_or(0);
            // The pager's hard cap: the budget plus one eviction batch (32 pages).
            (p, p <= budget + 32 * PAGE as u64)
        }
    };
    Ok((reply, peak, ok, limit.unwrap_or(0)))
}

/// Runs the benchmark.
pub fn run(o: &PagerBenchOpts) -> Result<PagerReport> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench pager needs root: swapon, a memory cgroup and userfaultfd");
    }
    let quick = o.bench.quick;
    let data = o.data_mib.unwrap_or(if quick { 256 } else { 2048 }) << 20;
    if data < 64 << 20 {
        bail!("--data-mib must be at least 64");
    }
    let budget = data / 2;
    let nvm = data / 4;
    let seconds = o.seconds.unwrap_or(if quick { 10.0 } else { 30.0 });
    let warmup_s = if quick { 3.0 } else { 10.0 };
    let dir = o.dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if tiermem_media::on_tmpfs(&dir).unwrap_or(false) {
        bail!(
            "{}: tmpfs is memory, not a disk; give --dir on ext4 or xfs",
            dir.display()
        );
    }
    let timeout = Duration::from_secs_f64(seconds + warmup_s + 600.0);
    let mut notes = Vec::new();
    progress::plan("bench pager", Some(if quick { 6 } else { 7 }));
    progress::step("calibrating the zones (Ch. 5)");
    let cap = tiermem_pager::calibrate(
        &dir,
        tiermem_media::DelayModel::NVMM,
        Duration::from_millis(if quick { 200 } else { 500 }),
    )?;
    let spec = |system: &str, nvm: u64, control: bool, bound_ns: Option<u64>| RunSpec {
        system: system.into(),
        data,
        budget,
        nvm,
        control,
        swap_dir: dir.clone(),
        bound_ns,
        warmup_s,
        seconds,
        seed: 42,
    };
    let mut measured: Vec<Measured> = Vec::new();
    // kernel-swap first: its p99 is K.
    progress::step("kernel-swap");
    {
        let _z = ZswapOff::new();
        let _swap = SwapFile::create(
            &dir.join(format!("kernel-{}.swap", std::process::id())),
            data + (64 << 20),
        )?;
        // memcg v1 has no dirty throttling: a small probe is sometimes OOM-killed while swap
        // writeback lags behind its faults (seen with other disk traffic beside it). Rerun it
        // in a fresh cgroup with the same limit, at most twice, and say so.
        let mut attempt = 0u64;
        let (reply, peak, ok, peak_limit) = loop {
            let cg = Cgroup::create(&format!(
                "tiermem-pager-bench-{}-{attempt}",
                std::process::id()
            ))?;
            match run_one(
                "kernel-swap",
                spec("kernel-swap", 0, false, None),
                Some(&cg),
                timeout,
            ) {
                Ok(r) => break r,
                Err(e) if attempt < 2 && format!("{e:#}").contains("killed by signal 9") => {
                    attempt += 1;
                    notes.push(format!(
                        "kernel-swap was OOM-killed by its memory cgroup (attempt {attempt}) \
                         and rerun"
                    ));
                    progress::step("kernel-swap (again, after an OOM kill)");
                }
                Err(e) => return Err(e),
            }
        };
        measured.push(Measured {
            limit_over_budget: peak_limit.saturating_sub(budget),
            system: "kernel-swap".into(),
            bound_ns: None,
            reply,
            peak,
            budget_ok: ok,
        });
    }
    let k_us = measured[0].reply.pagein_p99_us;
    if measured[0].reply.pageins == 0 {
        bail!("kernel-swap took no page-in: the budget holds the whole working set");
    }
    let bound_ns = (k_us * 0.5 * 1000.0).max(1.0) as u64;
    let mut systems: Vec<(&str, u64, bool, Option<u64>)> = vec![("pager-lru-ssd", 0, false, None)];
    if !quick {
        systems.push(("pager-nolc", nvm, false, None));
    }
    systems.push(("pager", nvm, true, Some(bound_ns)));
    for (name, nvm_b, control, bound) in systems {
        progress::step(name);
        let (reply, peak, ok, _) = run_one(name, spec(name, nvm_b, control, bound), None, timeout)?;
        measured.push(Measured {
            limit_over_budget: 0,
            system: name.into(),
            bound_ns: bound,
            reply,
            peak,
            budget_ok: ok,
        });
    }
    // The application case: memcached under kernel swap and under the shim.
    let app = run_app(quick, data, &dir, bound_ns, &mut notes)?;
    progress::done();
    let mut rows: Vec<Row> = measured
        .iter()
        .map(|m| Row {
            case: "single".into(),
            system: m.system.clone(),
            process: "probe".into(),
            bound_us: m.bound_ns.map(|b| b as f64 / 1000.0),
            pagein_p50_us: m.reply.pagein_p50_us,
            pagein_p99_us: m.reply.pagein_p99_us,
            pageout_p99_us: m.reply.pageout_p99_us,
            op_p99_us: m.reply.op_p99_us,
            ops_per_s: m.reply.ops as f64 / m.reply.wall_s,
            cpu_s: m.reply.cpu_s,
            pageins: m.reply.pageins,
            bound_met: m
                .bound_ns
                .map(|b| m.reply.pagein_p99_us * 1000.0 <= b as f64),
            nvm_served_frac: m.reply.nvm_served_frac,
            budget_respected: m.budget_ok,
            peak_bytes: m.peak,
            ssd_pagein_p99_us: m.reply.ssd_pagein_p99_us,
            buffer_pagein_p99_us: m.reply.buffer_pagein_p99_us,
            over_budget_waits: m.reply.over_budget_waits,
            swap_write_pages: m.reply.swap_write_pages,
            clean_pageout_frac: m.reply.clean_pageout_frac,
            update_p99_us: None,
        })
        .collect();
    let mut app_ratio = None;
    if let Some((ka, pa, spec)) = &app {
        app_ratio = Some(pa.read_p99_us / ka.read_p99_us.max(1e-9));
        for (system, a) in [("kernel-swap", ka), ("pager", pa)] {
            rows.push(Row {
                case: "app-memcached".into(),
                system: system.into(),
                process: "memcached".into(),
                bound_us: (system == "pager")
                    .then_some(spec.bound_ns)
                    .flatten()
                    .map(|b| b as f64 / 1000.0),
                pagein_p50_us: a.pagein_p50_us.unwrap_or(f64::NAN),
                pagein_p99_us: a.pagein_p99_us.unwrap_or(f64::NAN),
                pageout_p99_us: None,
                op_p99_us: a.read_p99_us,
                ops_per_s: a.ops_per_s,
                cpu_s: a.cpu_s,
                pageins: a.pageins,
                bound_met: match (system, spec.bound_ns, a.pagein_p99_us) {
                    ("pager", Some(b), Some(p)) => Some(p * 1000.0 <= b as f64),
                    _ => None,
                },
                nvm_served_frac: a.nvm_served_frac,
                budget_respected: a.budget_ok,
                peak_bytes: a.peak_bytes,
                ssd_pagein_p99_us: None,
                buffer_pagein_p99_us: None,
                over_budget_waits: None,
                swap_write_pages: None,
                clean_pageout_frac: None,
                update_p99_us: Some(a.update_p99_us),
            });
        }
    }
    let get = |s: &str| rows.iter().find(|r| r.system == s && r.case == "single");
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let (ks, lru, pg) = (get("kernel-swap"), get("pager-lru-ssd"), get("pager"));
    let p99 = |r: Option<&Row>| r.map(|r| r.pagein_p99_us);
    let cdf_png = {
        let path = o
            .bench
            .plot
            .clone()
            .unwrap_or_else(|| PathBuf::from("pager-pagein-cdf.png"));
        let series: Vec<crate::plot::Series<'_>> = measured
            .iter()
            .filter(|m| !m.reply.cdf_us.is_empty())
            .map(|m| crate::plot::Series {
                label: &m.system,
                samples: &m.reply.cdf_us,
            })
            .collect();
        match crate::plot::cdf(
            &path,
            "page-in latency (single probe, YCSB-A)",
            "µs",
            &series,
        ) {
            Ok(()) => Some(path.display().to_string()),
            Err(e) => {
                notes.push(format!("no CDF chart: {}", crate::error_chain(&e)));
                None
            }
        }
    };
    notes.push(format!(
        "kernel-swap's cgroup limit is the budget + the probe's RSS before it allocates + 16 MiB \
         + budget/32 ({} MiB over the budget here): with less, memcg v1 OOM-kills the probe \
         while swap writeback lags; the pager's regions get the budget alone",
        measured[0].limit_over_budget >> 20
    ));
    notes.push(
        "not built yet (null): kernel-zswap and kernel-zram, the concurrent and dynamic cases \
         (probes in several processes sharing one pager), redis-server under the shim (it sets \
         its own SIGBUS handler: sigaction is not interposed yet)"
            .into(),
    );
    if quick {
        notes.push("--quick: one repetition, pager-nolc not run".into());
    }
    Ok(PagerReport {
        machine: machine::describe(),
        quick,
        data_bytes: data,
        budget_bytes: budget,
        nvm_bytes: nvm,
        seconds,
        kernel_p99_us: k_us,
        ssd_iops: cap.ssd_iops,
        nvm_iops: cap.nvm_iops,
        p99_ratio_vs_kernel_swap: ratio(p99(pg), p99(ks)),
        p99_ratio_vs_kernel_zram: None,
        p50_ratio_vs_kernel_swap: ratio(pg.map(|r| r.pagein_p50_us), ks.map(|r| r.pagein_p50_us)),
        p99_ratio_vs_lru_ssd: ratio(p99(pg), p99(lru)),
        pageout_p99_ratio_vs_lru_ssd: ratio(
            pg.and_then(|r| r.pageout_p99_us),
            lru.and_then(|r| r.pageout_p99_us),
        ),
        throughput_ratio_vs_kernel_swap: ratio(pg.map(|r| r.ops_per_s), ks.map(|r| r.ops_per_s)),
        app_p99_ratio_vs_kernel_swap: AppRatios {
            memcached: app_ratio,
            redis: None,
        },
        bounds_met: BoundsMet {
            single: pg.and_then(|r| r.bound_met),
            concurrent: None,
            dynamic: None,
        },
        verify_errors: measured.iter().map(|m| m.reply.verify_errors).sum(),
        leaked_slots: measured.iter().filter_map(|m| m.reply.leaked_slots).sum(),
        cdf_png,
        results: rows,
        notes,
    })
}

/// The application case (see [`crate::pager_app`]): memcached with half of this run's data
/// under kernel swap, then under the shim, budget half of it, NVM a quarter, the single case's
/// bound. `None`, with a note, when memcached or the YCSB binding is missing.
fn run_app(
    quick: bool,
    data: u64,
    dir: &Path,
    bound_ns: u64,
    notes: &mut Vec<String>,
) -> Result<
    Option<(
        crate::pager_app::AppRun,
        crate::pager_app::AppRun,
        crate::pager_app::AppSpec,
    )>,
> {
    use crate::pager_app::{run_kernel, run_pager, AppSpec};
    if !crate::on_path("memcached") {
        notes.push("memcached is not installed (scripts/setup.sh installs it): no app case".into());
        return Ok(None);
    }
    let ycsb = match crate::kv_harness::Ycsb::locate().and_then(|y| y.build().map(|()| y)) {
        Ok(y) => y,
        Err(e) => {
            notes.push(format!("no app case: {}", crate::error_chain(&e)));
            return Ok(None);
        }
    };
    let app_data = data / 2;
    let mut spec = AppSpec {
        data: app_data,
        budget: app_data / 2,
        nvm: app_data / 4,
        bound_ns: Some(bound_ns),
        ops: 0,
        dir: dir.to_path_buf(),
        logs: dir.join(format!("app-logs-{}", std::process::id())),
    };
    spec.ops = (if quick { 40_000 } else { 200_000 }).min(2 * spec.records());
    std::fs::create_dir_all(&spec.logs)
        .with_context(|| format!("creating {}", spec.logs.display()))?;
    let say = |m: &str| progress::note(m);
    progress::step("memcached under kernel-swap (YCSB-A)");
    let kernel = {
        let _z = ZswapOff::new();
        let _swap = SwapFile::create(
            &dir.join(format!("kernel-app-{}.swap", std::process::id())),
            app_data * 2 + (64 << 20),
        )?;
        run_kernel(
            &spec,
            &ycsb,
            &format!("tiermem-pager-bench-app-{}", std::process::id()),
            &say,
        )?
    };
    // The pager gets what the kernel got for the items: the budget and the slack (memcached's
    // memory at start is outside the arena there too).
    progress::step("memcached under the pager (YCSB-A)");
    let pager = run_pager(
        &AppSpec {
            budget: spec.budget + kernel_slack(spec.budget),
            nvm: spec.nvm,
            bound_ns: spec.bound_ns,
            data: spec.data,
            ops: spec.ops,
            dir: spec.dir.clone(),
            logs: spec.logs.clone(),
        },
        &ycsb,
        &say,
    )?;
    // Kept when a run fails (its error quotes them); removed after a good one.
    let _ = std::fs::remove_dir_all(&spec.logs);
    notes.push(format!(
        "app case: memcached (-m {} MiB, 2 threads) with {} YCSB records (~{} MiB of items), \
         budget {} MiB, NVM {} MiB; one YCSB-A warm-up of {} then {} timed operations, \
         dataintegrity=true; op p99 is YCSB's READ p99; kernel-swap's cgroup allowed {} MiB over \
         the budget (memcached's memory at start + the probe's slack), the pager's arena budget \
         is the budget + that slack ({} MiB)",
        2 * app_data.div_ceil(1 << 20),
        spec.records(),
        app_data >> 20,
        spec.budget >> 20,
        spec.nvm >> 20,
        spec.ops / 4,
        spec.ops,
        kernel.limit_over_budget >> 20,
        (spec.budget + kernel_slack(spec.budget)) >> 20
    ));
    Ok(Some((kernel, pager, spec)))
}
