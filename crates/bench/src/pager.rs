//! `tiermem bench pager`: NVSwap's page-in tail against kernel swap, side by side in one run on
//! one disk (issue #16).
//!
//! A probe process owns D bytes of 1 KB records filled with incompressible bytes and runs YCSB-A
//! (50 % reads, 50 % updates, zipfian 0.99) on them, timing every operation with the TSC. An
//! operation whose thread took a page-in is a page-in sample: for the kernel a change of the
//! thread's fault counts (`getrusage(RUSAGE_THREAD)`: a swap-in, from the disk, from zswap's
//! pool, from zram or from the swap cache), for the pager a change of
//! [`tiermem_pager::thread_pageins`] (from the swap file or the NVM buffer). Both probes make the
//! same calls. Every read checks the record's bytes. (Swap-ins from zswap and from zram are
//! major faults like the disk's: checked on this kernel, 6.18, with a C probe in a 48 MiB memcg
//! touching 96 MiB of random bytes — about 10,050 of 20,000 touches took a major fault and none
//! only a minor one, under each of the three.)
//!
//! Systems, each in a worker process of its own (one at a time):
//! * `kernel-swap`: the probe in a v1 memory cgroup whose limit is the budget plus the probe's
//!   own memory before it allocates, with a swap file of this run on `--dir` (`mkswap`,
//!   `swapon` at the highest priority); zswap off for the run. Swap file, cgroup and zswap's
//!   setting are restored even when the run fails.
//! * `kernel-zswap` (full runs): the same cgroup and swap file, zswap on in front of it with
//!   its pool capped at the NVM buffer's size (`max_pool_percent`, whole percents of RAM,
//!   rounded up, so up to 1 % of RAM more), its compressor left as set, swap readahead off
//!   (`vm.page-cluster` 0: with it on, memcg v1 OOM-kills the probe behind zswap, see
//!   `ZswapOn`). Every parameter written is restored.
//! * `kernel-zram` (full runs): a zram device of this run (`hot_add`, disksize = the NVM
//!   buffer's size, zswap's compressor where zram has it) as swap at the highest priority, the
//!   same swap file one below it (zram before the file), zswap off. The device is swapped off,
//!   reset and removed after. Neither zswap's pool nor zram's memory is charged to a v1 memory
//!   cgroup: like the pager's buffer, the compressed tier is outside the budget. The data is
//!   incompressible, so both hold about a page per page. Where zswap or zram cannot be set up,
//!   the system is skipped with the reason in the notes and its key is null.
//! * `pager-lru-ssd`: [`tiermem_pager::Pager`] without NVM buffer and without control.
//! * `pager-nolc` (full runs): with the buffer, without control (queue fixed at 128).
//! * `pager`: with the buffer (D/4) and control, the probe bounded at p99 ≤ 0.5 K, K being this
//!   run's kernel-swap page-in p99.
//!
//! `--systems` runs a subset (kernel-swap always: it gives K).
//!
//! Then the application cases (`pager_app.rs`): memcached and redis-server, each under kernel
//! swap and under `tiermem pager run`, YCSB-A with `dataintegrity=true`;
//! `app_p99_ratio_vs_kernel_swap.memcached` and `.redis` are the ratios of YCSB's READ p99s.
//!
//! Not built yet: the kernel-swap side of the concurrent case.

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
    /// Run only these systems, comma-separated: kernel-swap, kernel-zswap, kernel-zram,
    /// pager-lru-ssd, pager-nolc, pager, concurrent, dynamic, and memcached and redis for the
    /// application cases. kernel-swap always runs (its page-in p99 is K). Default: all of
    /// them; with --quick kernel-swap, pager-lru-ssd, pager, concurrent, memcached and redis.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub systems: Vec<String>,
}

/// Every system `--systems` can name, in the order they run.
const SYSTEMS: [&str; 10] = [
    "kernel-swap",
    "kernel-zswap",
    "kernel-zram",
    "pager-lru-ssd",
    "pager-nolc",
    "pager",
    "concurrent",
    "dynamic",
    "memcached",
    "redis",
];

/// The systems this run runs, in [`SYSTEMS`]' order: `asked` (with kernel-swap), or the
/// default set of a full or a quick run.
fn selected_systems(quick: bool, asked: &[String]) -> Result<Vec<&'static str>> {
    for a in asked {
        if !SYSTEMS.contains(&a.as_str()) {
            bail!(
                "--systems: no system {a:?} (systems: {})",
                SYSTEMS.join(", ")
            );
        }
    }
    Ok(SYSTEMS
        .into_iter()
        .filter(|s| {
            if !asked.is_empty() {
                *s == "kernel-swap" || asked.iter().any(|a| a == s)
            } else {
                !quick
                    || !matches!(
                        *s,
                        "kernel-zswap" | "kernel-zram" | "pager-nolc" | "dynamic"
                    )
            }
        })
        .collect())
}

/// The request that runs a probe with `spec` (for `pager_multi`).
pub(crate) fn probe_request(spec: RunSpec) -> impl Serialize {
    ProbeReq::Run(Box::new(spec))
}

/// One request to a probe worker.
#[derive(Serialize, Deserialize, Debug, Clone)]
enum ProbeReq {
    /// Join this cgroup (its `cgroup.procs`) and report the process's RSS in bytes.
    Join { procs: PathBuf },
    /// Run the probe.
    Run(Box<RunSpec>),
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct RunSpec {
    pub(crate) system: String,
    pub(crate) data: u64,
    pub(crate) budget: u64,
    pub(crate) nvm: u64,
    pub(crate) control: bool,
    pub(crate) swap_dir: PathBuf,
    pub(crate) bound_ns: Option<u64>,
    pub(crate) warmup_s: f64,
    pub(crate) seconds: f64,
    pub(crate) seed: u64,
    /// kernel-zram: the zram device's number (its reads are the page-ins it served).
    #[serde(default)]
    pub(crate) zram_dev: Option<u32>,
    /// A shared pager pool to be a tenant of (the concurrent and dynamic cases).
    #[serde(default)]
    pub(crate) pool: Option<PathBuf>,
    /// Share of reads among the operations, percent (YCSB A 50, B 95, C 100; default 50).
    #[serde(default)]
    pub(crate) read_pct: Option<u32>,
    /// Phases of the timed part: (start as a fraction of it, the bound from then on, ns); the
    /// probe sets its own bound at each start and reports each phase's page-in p99.
    #[serde(default)]
    pub(crate) phases: Vec<(f64, u64)>,
    /// Share of the wall time the probe spends in operations (1.0 or none: all of it); after
    /// each batch it sleeps the rest. Several probes on 2 cores otherwise time the scheduler.
    #[serde(default)]
    pub(crate) duty: Option<f64>,
    /// Probes that run together meet here (see [`Rendezvous`]) after filling their data and
    /// again after their timed part, so every timed window overlaps the others' timed windows
    /// only: not another probe's fill or its final read-back of every record.
    #[serde(default)]
    pub(crate) rendezvous: Option<Rendezvous>,
}

/// A meeting point of `n` probe processes: a directory where each arriving probe leaves a file
/// named after the point and its seed, then waits until `n` such files exist (polled every
/// millisecond; untimed). A probe that never arrives makes the others fail after `timeout_s`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Rendezvous {
    pub(crate) dir: PathBuf,
    pub(crate) n: usize,
    pub(crate) timeout_s: f64,
}

impl Rendezvous {
    /// Arrives at point `name` as probe `who` and returns once all `n` probes have.
    pub(crate) fn meet(&self, name: &str, who: u64) -> Result<()> {
        std::fs::write(self.dir.join(format!("{name}-{who}")), b"")
            .with_context(|| format!("rendezvous {name} in {}", self.dir.display()))?;
        let prefix = format!("{name}-");
        let t = Instant::now();
        loop {
            let here = std::fs::read_dir(&self.dir)?
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|f| f.starts_with(&prefix))
                })
                .count();
            if here >= self.n {
                return Ok(());
            }
            if t.elapsed().as_secs_f64() > self.timeout_s {
                bail!(
                    "rendezvous {name}: {here} of {} probes arrived in {} s",
                    self.n,
                    self.timeout_s
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct RunReply {
    pub(crate) ops: u64,
    pub(crate) wall_s: f64,
    pub(crate) cpu_s: f64,
    pub(crate) pageins: u64,
    pub(crate) pagein_p50_us: f64,
    pub(crate) pagein_p99_us: f64,
    pub(crate) op_p99_us: f64,
    /// Up to 4000 page-in samples (µs), evenly spread over the sorted set, for the CDF.
    pub(crate) cdf_us: Vec<f64>,
    pub(crate) verify_errors: u64,
    pub(crate) pageout_p99_us: Option<f64>,
    pub(crate) nvm_served_frac: Option<f64>,
    pub(crate) max_resident_bytes: Option<u64>,
    pub(crate) leaked_slots: Option<u64>,
    pub(crate) queue: Option<usize>,
    /// The pager's own view of its page-ins in the timed part: from the swap file, from the
    /// buffer (p99, µs), and faults that waited for the evictor at the hard cap.
    pub(crate) ssd_pagein_p99_us: Option<f64>,
    pub(crate) buffer_pagein_p99_us: Option<f64>,
    pub(crate) over_budget_waits: Option<u64>,
    pub(crate) swap_write_pages: Option<u64>,
    pub(crate) clean_pageout_frac: Option<f64>,
    /// Per phase of [`RunSpec::phases`]: page-in p99 (µs) and page-ins.
    #[serde(default)]
    pub(crate) phase_p99_us: Vec<Option<f64>>,
    #[serde(default)]
    pub(crate) phase_pageins: Vec<u64>,
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
    /// Share of the pages read back that came from the NVM buffer (pager rows) or from the
    /// compressed tier (kernel-zswap: zswap's pool, kernel-zram: the zram device), the rest
    /// from the swap file; the kernel's count readahead's pages too.
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
            "p99 vs kernel-swap {} (≤ 0.5), vs lru-ssd {} (≤ 0.5), vs kernel-zram {} (≤ 1.0), p50 \
             vs kernel-swap {}, page-out p99 vs lru-ssd {}, throughput vs kernel-swap {}",
            r(self.p99_ratio_vs_kernel_swap),
            r(self.p99_ratio_vs_lru_ssd),
            r(self.p99_ratio_vs_kernel_zram),
            r(self.p50_ratio_vs_kernel_swap),
            r(self.pageout_p99_ratio_vs_lru_ssd),
            r(self.throughput_ratio_vs_kernel_swap)
        );
        println!(
            "YCSB-A READ p99 (op p99 column) under the pager vs kernel swap: memcached {} (≤ 0.9), \
             redis {}",
            r(self.app_p99_ratio_vs_kernel_swap.memcached),
            r(self.app_p99_ratio_vs_kernel_swap.redis)
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

/// kernel-zswap and kernel-zram: (pages read back from the compressed tier, pages read back in
/// all), counted since boot (`/proc/vmstat`'s `zswpin` and `pswpin`, which does not count zswap's
/// loads; the zram device's read requests, one a page: zram swap has no readahead). The probe is
/// the only program paging here. `None` for the other systems or when a counter is missing.
fn tier_reads(spec: &RunSpec) -> Option<(u64, u64)> {
    let vmstat = std::fs::read_to_string("/proc/vmstat").ok()?;
    let count = |name: &str| -> Option<u64> {
        vmstat.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse().ok()).flatten()
        })
    };
    match spec.system.as_str() {
        "kernel-zswap" => {
            let (z, d) = (count("zswpin")?, count("pswpin")?);
            Some((z, z + d))
        }
        "kernel-zram" => {
            let st = std::fs::read_to_string(format!("/sys/block/zram{}/stat", spec.zram_dev?));
            let reads: u64 = st.ok()?.split_whitespace().next()?.parse().ok()?;
            Some((reads, count("pswpin")?))
        }
        _ => None,
    }
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
        o.pool = spec.pool.clone();
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
    let read_pct = u64::from(spec.read_pct.unwrap_or(50).min(100));
    let mut op = |mem: &mut [u8], versions: &mut [u32]| -> (u64, bool) {
        let r = keys.next_page();
        let at = r as usize * RECORD;
        let f0 = thread_faults();
        let p0 = tiermem_pager::thread_pageins();
        let t0 = tiermem_media::now_ns();
        if dice.next_page() < read_pct {
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
    if let Some(r) = &spec.rendezvous {
        r.meet("filled", spec.seed)?;
    }
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < spec.warmup_s {
        for _ in 0..256 {
            op(mem, &mut versions);
        }
    }
    let s0 = pager.as_ref().map(|p| p.stats());
    if std::env::var_os("TIERMEM_PAGER_TRACE").is_some() {
        eprintln!("tiermem-pager: stats before the timed part: {s0:?}");
    }
    let tier0 = tier_reads(spec);
    let c0 = crate::cpu::process_ns();
    let t0 = Instant::now();
    let mut ops = 0u64;
    let mut all = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut pageins: Vec<u64> = Vec::with_capacity(1 << 20);
    let mut phase = 0usize;
    let mut by_phase: Vec<Vec<u64>> = vec![Vec::new(); spec.phases.len()];
    let set_phase = |i: usize| -> Result<()> {
        if let (Some(r), Some(&(_, b))) = (&region, spec.phases.get(i)) {
            r.set_bound(0.99, b)?;
        }
        Ok(())
    };
    set_phase(0)?;
    loop {
        let f = t0.elapsed().as_secs_f64() / spec.seconds;
        if f >= 1.0 {
            break;
        }
        while phase + 1 < spec.phases.len() && f >= spec.phases[phase + 1].0 {
            phase += 1;
            set_phase(phase)?;
        }
        let b0 = Instant::now();
        for _ in 0..256 {
            let (d, paged) = op(mem, &mut versions);
            all.record(d.max(1))?;
            if paged {
                pageins.push(d);
                if let Some(v) = by_phase.get_mut(phase) {
                    v.push(d);
                }
            }
            ops += 1;
        }
        if let Some(duty) = spec.duty.filter(|d| *d > 0.0 && *d < 1.0) {
            std::thread::sleep(b0.elapsed().mul_f64((1.0 - duty) / duty));
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = (crate::cpu::process_ns() - c0) as f64 / 1e9;
    let tier1 = tier_reads(spec);
    let s1 = pager.as_ref().map(|p| p.stats());
    if let Some(r) = &spec.rendezvous {
        r.meet("timed", spec.seed)?;
    }
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
    let phase_p99_us = by_phase
        .iter_mut()
        .map(|v| {
            v.sort_unstable();
            let i = (0.99 * v.len() as f64).ceil() as usize;
            (!v.is_empty()).then(|| v[i.clamp(1, v.len()) - 1] as f64 / 1000.0)
        })
        .collect();
    let phase_pageins = by_phase.iter().map(|v| v.len() as u64).collect();
    let mut reply = RunReply {
        phase_p99_us,
        phase_pageins,
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
    if let (Some((c0, all0)), Some((c1, all1))) = (tier0, tier1) {
        let (c, all) = (c1.saturating_sub(c0), all1.saturating_sub(all0));
        reply.nvm_served_frac = Some(c as f64 / all.max(1) as f64);
    }
    if let (Some(pg), Some(s0), Some(s1)) = (&pager, s0, s1) {
        // Rates and latencies of the timed part (s1, taken before the read-back); the peak
        // residency of the whole run.
        let peak = pg.stats().max_resident_pages;
        let out = s1.pageout.since(&s0.pageout);
        reply.pageout_p99_us = out.quantile(0.99).map(|v| v as f64 / 1000.0);
        let from_nvm = s1.pageins_buffer - s0.pageins_buffer;
        let from_ssd = s1.pageins_ssd - s0.pageins_ssd;
        reply.nvm_served_frac = Some(from_nvm as f64 / (from_nvm + from_ssd).max(1) as f64);
        reply.max_resident_bytes = Some((peak * PAGE) as u64);
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

/// The highest swap priority (`swapon`'s 32767): kernel-swap's file and kernel-zram's device.
const SWAP_PRIO_TOP: i32 = 32767;

fn c_path(path: &Path) -> Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    Ok(std::ffi::CString::new(path.as_os_str().as_bytes())?)
}

/// `mkswap PATH`, then `swapon` at priority `prio`.
fn mkswap_swapon(path: &Path, prio: i32) -> Result<()> {
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
    let c = c_path(path)?;
    const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
    // SAFETY: swapon with a valid path.
    if unsafe { libc::swapon(c.as_ptr(), SWAP_FLAG_PREFER | prio) } != 0 {
        bail!(
            "swapon {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// `swapoff PATH`; a failure is a warning (this runs in `drop`).
fn swapoff_warn(path: &Path) {
    if let Ok(c) = c_path(path) {
        // SAFETY: swapoff with a valid path.
        if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
            progress::note(&format!(
                "warning: swapoff {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
    }
}

/// A swap file of this run: created, `mkswap`ed and enabled at priority `prio`; disabled and
/// removed on drop.
struct SwapFile {
    path: PathBuf,
    on: bool,
}

impl SwapFile {
    fn create(path: &Path, bytes: u64, prio: i32) -> Result<SwapFile> {
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
        mkswap_swapon(path, prio)?;
        sw.on = true;
        Ok(sw)
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if self.on {
            swapoff_warn(&self.path);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// zswap turned off for the run (kernel swap must reach the disk), restored on drop.
struct ZswapOff {
    was: Option<String>,
}

const ZSWAP_PARAMS: &str = "/sys/module/zswap/parameters";
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

/// Kernel parameters (sysfs files) written for the run; each one's earlier value is written
/// back on drop, the last written first.
#[derive(Default)]
struct SysParams {
    saved: Vec<(PathBuf, String)>,
}

impl SysParams {
    /// Writes `value` to `path` unless it holds it already.
    fn set(&mut self, path: &Path, value: &str) -> Result<()> {
        let was = std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .to_string();
        if was == value {
            return Ok(());
        }
        std::fs::write(path, value)
            .with_context(|| format!("writing {value} to {}", path.display()))?;
        self.saved.push((path.to_path_buf(), was));
        Ok(())
    }
}

impl Drop for SysParams {
    fn drop(&mut self) {
        for (path, was) in self.saved.iter().rev() {
            if let Err(e) = std::fs::write(path, was) {
                progress::note(&format!(
                    "warning: restoring {} to {was}: {e}",
                    path.display()
                ));
            }
        }
    }
}

/// zswap's `max_pool_percent` for a pool of at least `pool` bytes on a machine of `ram` bytes:
/// whole percents of RAM, rounded up, at least 1.
fn zswap_pool_percent(pool: u64, ram: u64) -> u64 {
    (pool as u128 * 100)
        .div_ceil(ram.max(1) as u128)
        .clamp(1, 100) as u64
}

/// RAM as the kernel counts it for zswap's pool limit (`MemTotal`, bytes).
fn mem_total() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/meminfo")?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("no MemTotal in /proc/meminfo"))?;
    Ok(kb * 1024)
}

const PAGE_CLUSTER: &str = "/proc/sys/vm/page-cluster";

/// zswap on for kernel-zswap: its pool capped at about `pool` bytes, its compressor as set, and
/// swap readahead off (`vm.page-cluster` 0). With readahead on (the default, 3: 8 pages a
/// fault, each decompressed at once and charged to the cgroup), memcg v1 OOM-kills the program
/// behind zswap: a C program writing random 1 KB records over 96 MiB in a 48 MiB cgroup was
/// killed 6 times in 6 with page-cluster 3 and 0 in 6 with 0 (0 in 6 too with the swap file
/// alone, zswap off). zram swap has no readahead in any case.
struct ZswapOn {
    _params: SysParams,
    compressor: String,
    percent: u64,
    ram: u64,
    /// `vm.page-cluster` before the run.
    page_cluster_was: String,
}

impl ZswapOn {
    fn new(pool: u64) -> Result<ZswapOn> {
        let dir = Path::new(ZSWAP_PARAMS);
        if !dir.is_dir() {
            bail!("this kernel has no zswap ({ZSWAP_PARAMS} is missing)");
        }
        let compressor = std::fs::read_to_string(dir.join("compressor"))
            .context("reading zswap's compressor")?
            .trim()
            .to_string();
        let ram = mem_total()?;
        let percent = zswap_pool_percent(pool, ram);
        let page_cluster_was = std::fs::read_to_string(PAGE_CLUSTER)
            .context("reading vm.page-cluster")?
            .trim()
            .to_string();
        let mut params = SysParams::default();
        params.set(Path::new(PAGE_CLUSTER), "0")?;
        // The cap before turning it on; restored in the reverse order.
        params.set(&dir.join("max_pool_percent"), &percent.to_string())?;
        params.set(&dir.join("enabled"), "Y")?;
        Ok(ZswapOn {
            _params: params,
            compressor,
            percent,
            ram,
            page_cluster_was,
        })
    }
}

const ZRAM_CONTROL: &str = "/sys/class/zram-control";

/// Whether zram devices can be added (`/sys/class/zram-control`), after `modprobe zram
/// num_devices=0` where it is missing; the reason when not.
fn zram_available() -> std::result::Result<(), String> {
    if Path::new(ZRAM_CONTROL).is_dir() {
        return Ok(());
    }
    let tried = match std::process::Command::new("modprobe")
        .args(["zram", "num_devices=0"])
        .output()
    {
        Ok(o) if o.status.success() => String::new(),
        Ok(o) => format!(
            " (modprobe zram: {})",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!(" (modprobe: {e})"),
    };
    if Path::new(ZRAM_CONTROL).is_dir() {
        Ok(())
    } else {
        Err(format!("no zram: {ZRAM_CONTROL} is missing{tried}"))
    }
}

/// A zram device of this run as swap: added (`hot_add`), sized, `mkswap`ed and enabled at
/// priority `prio`; on drop swapped off, reset and removed (`hot_remove`).
struct ZramSwap {
    dev: u32,
    on: bool,
    algorithm: String,
}

impl ZramSwap {
    /// A device of `bytes`, compressing with `algorithm` where zram offers it (else its
    /// default).
    fn create(bytes: u64, algorithm: &str, prio: i32) -> Result<ZramSwap> {
        let add = Path::new(ZRAM_CONTROL).join("hot_add");
        let dev: u32 = std::fs::read_to_string(&add)
            .with_context(|| format!("adding a zram device ({})", add.display()))?
            .trim()
            .parse()
            .context("zram's hot_add gave no device number")?;
        let mut z = ZramSwap {
            dev,
            on: false,
            algorithm: String::new(),
        };
        let sys = z.sys();
        // "lzo-rle [lzo] lz4": the one in brackets is in use. Set before disksize.
        let algs = std::fs::read_to_string(sys.join("comp_algorithm")).unwrap_or_default();
        if algs
            .split_whitespace()
            .any(|a| a.trim_matches(|c| c == '[' || c == ']') == algorithm)
        {
            std::fs::write(sys.join("comp_algorithm"), algorithm)
                .with_context(|| format!("setting zram{dev}'s comp_algorithm to {algorithm}"))?;
        }
        z.algorithm = std::fs::read_to_string(sys.join("comp_algorithm"))
            .unwrap_or_default()
            .split_whitespace()
            .find_map(|a| a.strip_prefix('[')?.strip_suffix(']').map(str::to_string))
            .unwrap_or_else(|| "?".into());
        std::fs::write(sys.join("disksize"), bytes.to_string())
            .with_context(|| format!("setting zram{dev}'s disksize to {bytes}"))?;
        let node = z.node();
        // devtmpfs makes the node as the disk appears; give it a moment all the same.
        for _ in 0..50 {
            if node.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        mkswap_swapon(&node, prio)?;
        z.on = true;
        Ok(z)
    }

    fn sys(&self) -> PathBuf {
        PathBuf::from(format!("/sys/block/zram{}", self.dev))
    }

    fn node(&self) -> PathBuf {
        PathBuf::from(format!("/dev/zram{}", self.dev))
    }

    /// The most memory the device has used (`mm_stat`'s mem_used_max), bytes.
    fn mem_used_max(&self) -> Option<u64> {
        std::fs::read_to_string(self.sys().join("mm_stat"))
            .ok()?
            .split_whitespace()
            .nth(4)?
            .parse()
            .ok()
    }
}

impl Drop for ZramSwap {
    fn drop(&mut self) {
        if self.on {
            swapoff_warn(&self.node());
        }
        let reset = self.sys().join("reset");
        if let Err(e) = std::fs::write(&reset, "1") {
            progress::note(&format!("warning: {}: {e}", reset.display()));
        }
        let remove = Path::new(ZRAM_CONTROL).join("hot_remove");
        if let Err(e) = std::fs::write(&remove, self.dev.to_string()) {
            progress::note(&format!(
                "warning: removing zram{} ({}): {e}",
                self.dev,
                remove.display()
            ));
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

/// Runs a kernel baseline's probe in a v1 memory cgroup of its own (see [`run_one`]); the swap
/// setup is the caller's. memcg v1 has no dirty throttling: a small probe is sometimes
/// OOM-killed while swap writeback lags behind its faults (seen with other disk traffic beside
/// it). Rerun it in a fresh cgroup with the same limit, at most twice, and say so.
fn run_kernel_probe(
    system: &str,
    spec: RunSpec,
    timeout: Duration,
    notes: &mut Vec<String>,
) -> Result<Measured> {
    let budget = spec.budget;
    let mut attempt = 0u64;
    let (reply, peak, ok, limit) = loop {
        let cg = Cgroup::create(&format!(
            "tiermem-pager-bench-{}-{system}-{attempt}",
            std::process::id()
        ))?;
        match run_one(system, spec.clone(), Some(&cg), timeout) {
            Ok(r) => break r,
            Err(e) if attempt < 2 && oom_killed(&e) => {
                attempt += 1;
                notes.push(format!(
                    "{system} was OOM-killed by its memory cgroup (attempt {attempt}) and rerun"
                ));
                progress::step(&format!("{system} (again, after an OOM kill)"));
            }
            Err(e) => return Err(e),
        }
    };
    Ok(Measured {
        limit_over_budget: limit.saturating_sub(budget),
        system: system.into(),
        bound_ns: None,
        reply,
        peak,
        budget_ok: ok,
    })
}

/// Whether a probe's error is its memory cgroup's OOM kill (SIGKILL).
fn oom_killed(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("killed by signal 9")
}

/// A share as a percentage for the notes ("?" when unknown).
fn pct(v: Option<f64>) -> String {
    v.map_or("?".into(), |x| format!("{:.0} %", x * 100.0))
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
    let reply: RunReply = w.call(&ProbeReq::Run(Box::new(spec)), "run")?;
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
    let systems = selected_systems(quick, &o.systems)?;
    let runs = |s: &str| systems.contains(&s);
    let mut notes = Vec::new();
    // Calibration, each system, each application's two runs, the second concurrent case.
    let steps = 1
        + systems.len() as u64
        + u64::from(runs("memcached"))
        + u64::from(runs("redis"))
        + u64::from(runs("concurrent") && !quick);
    progress::plan("bench pager", Some(steps));
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
        zram_dev: None,
        pool: None,
        read_pct: None,
        phases: Vec::new(),
        duty: None,
        rendezvous: None,
    };
    let swap_file = |system: &str, prio: i32| {
        SwapFile::create(
            &dir.join(format!("{system}-{}.swap", std::process::id())),
            data + (64 << 20),
            prio,
        )
    };
    let mut measured: Vec<Measured> = Vec::new();
    // kernel-swap first: its p99 is K.
    progress::step("kernel-swap");
    {
        let _z = ZswapOff::new();
        let _swap = swap_file("kernel-swap", SWAP_PRIO_TOP)?;
        let spec = spec("kernel-swap", 0, false, None);
        measured.push(run_kernel_probe("kernel-swap", spec, timeout, &mut notes)?);
    }
    let k_us = measured[0].reply.pagein_p99_us;
    if measured[0].reply.pageins == 0 {
        bail!("kernel-swap took no page-in: the budget holds the whole working set");
    }
    // kernel-zswap: the same swap file behind zswap's pool of about the NVM buffer's size.
    if runs("kernel-zswap") {
        progress::step("kernel-zswap");
        let _swap = swap_file("kernel-zswap", SWAP_PRIO_TOP)?;
        match ZswapOn::new(nvm) {
            Err(e) => notes.push(format!(
                "kernel-zswap skipped: zswap could not be set up: {}",
                crate::error_chain(&e)
            )),
            Ok(z) => {
                let spec = spec("kernel-zswap", nvm, false, None);
                match run_kernel_probe("kernel-zswap", spec, timeout, &mut notes) {
                    Ok(m) => {
                        notes.push(format!(
                            "kernel-zswap: zswap on ({}, max_pool_percent {} = {} MiB of {} MiB \
                             RAM, for the NVM buffer's {} MiB) in front of the swap file, swap \
                             readahead off (vm.page-cluster 0, was {}: with readahead memcg v1 \
                             OOM-kills the probe); {} of the pages read back came from zswap's \
                             pool",
                            z.compressor,
                            z.percent,
                            (z.ram / 100 * z.percent) >> 20,
                            z.ram >> 20,
                            nvm >> 20,
                            z.page_cluster_was,
                            pct(m.reply.nvm_served_frac)
                        ));
                        measured.push(m);
                    }
                    Err(e) if oom_killed(&e) => notes.push(
                        "kernel-zswap not measured: OOM-killed by its memory cgroup three times"
                            .into(),
                    ),
                    Err(e) => return Err(e),
                }
                drop(z);
            }
        }
    }
    // kernel-zram: a zram device of the NVM buffer's size before the same swap file.
    if runs("kernel-zram") {
        progress::step("kernel-zram");
        let _z = ZswapOff::new();
        let _swap = swap_file("kernel-zram", SWAP_PRIO_TOP - 1)?;
        let zram = zram_available().map_err(|e| anyhow!(e)).and_then(|()| {
            // zswap's compressor, where zram has it: the two compress alike.
            let alg = std::fs::read_to_string(Path::new(ZSWAP_PARAMS).join("compressor"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            ZramSwap::create(nvm, &alg, SWAP_PRIO_TOP)
        });
        match zram {
            Err(e) => notes.push(format!(
                "kernel-zram skipped (p99_ratio_vs_kernel_zram null): zram could not be set up: \
                 {}",
                crate::error_chain(&e)
            )),
            Ok(z) => {
                let mut spec = spec("kernel-zram", nvm, false, None);
                spec.zram_dev = Some(z.dev);
                match run_kernel_probe("kernel-zram", spec, timeout, &mut notes) {
                    Ok(m) => {
                        notes.push(format!(
                            "kernel-zram: zram{} ({}, {} MiB, swap priority {SWAP_PRIO_TOP}) \
                             before the swap file (priority {}), zswap off; it used up to {} \
                             MiB; {} of the pages read back came from it",
                            z.dev,
                            z.algorithm,
                            nvm >> 20,
                            SWAP_PRIO_TOP - 1,
                            z.mem_used_max()
                                .map_or("?".into(), |b| (b >> 20).to_string()),
                            pct(m.reply.nvm_served_frac)
                        ));
                        measured.push(m);
                    }
                    Err(e) if oom_killed(&e) => notes.push(
                        "kernel-zram not measured (p99_ratio_vs_kernel_zram null): OOM-killed \
                         by its memory cgroup three times"
                            .into(),
                    ),
                    Err(e) => return Err(e),
                }
                drop(z);
            }
        }
    }
    let bound_ns = (k_us * 0.5 * 1000.0).max(1.0) as u64;
    let pagers: [(&str, u64, bool, Option<u64>); 3] = [
        ("pager-lru-ssd", 0, false, None),
        ("pager-nolc", nvm, false, None),
        ("pager", nvm, true, Some(bound_ns)),
    ];
    for (name, nvm_b, control, bound) in pagers {
        if !runs(name) {
            continue;
        }
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
    // Several probe processes sharing one pool (pager_multi).
    let k_ns = k_us * 1000.0;
    let mut multi: Vec<crate::pager_multi::CaseResult> = Vec::new();
    let (mut concurrent_met, mut dynamic_met) = (None::<bool>, None::<bool>);
    if runs("concurrent") {
        use crate::pager_multi::{concurrent_probes, run_case};
        let base = spec("concurrent", nvm, true, None);
        let mut cases = vec![("concurrent", [("A1", 50), ("A2", 50), ("A3", 50)])];
        if !quick {
            cases.push(("concurrent-abc", [("A", 50), ("B", 95), ("C", 100)]));
        }
        for (case, w) in cases {
            progress::step(&format!(
                "{case}: three probes in one pager pool, bounds 3/1.5/0.9 K"
            ));
            let r = run_case(
                case,
                &concurrent_probes(k_ns, w),
                &base,
                data / 3,
                budget / 3,
                nvm,
                timeout,
            )?;
            concurrent_met = Some(concurrent_met.unwrap_or(true) && r.bounds_met);
            multi.push(r);
        }
    }
    if runs("dynamic") {
        use crate::pager_multi::{dynamic_probes, run_case};
        progress::step("dynamic: A at 0.3 K beside C at 3 → 2.4 → 1.8 K");
        let base = spec("dynamic", nvm, true, None);
        let r = run_case(
            "dynamic",
            &dynamic_probes(k_ns),
            &base,
            data / 2,
            budget / 2,
            nvm,
            timeout,
        )?;
        // A unaffected by C: A in its bound in each of C's phases.
        dynamic_met = Some(
            r.rows
                .iter()
                .filter(|row| row.process.starts_with("A@"))
                .all(|row| row.bound_met == Some(true)),
        );
        multi.push(r);
    }
    // The application cases: each under kernel swap and under the shim.
    let mut apps = Vec::new();
    for app in [
        crate::pager_app::App::Memcached,
        crate::pager_app::App::Redis,
    ] {
        if runs(app.name()) {
            if let Some(r) = run_app(app, quick, data, &dir, bound_ns, &mut notes)? {
                apps.push(r);
            }
        }
    }
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
    for m in &multi {
        rows.extend(m.rows.iter().cloned());
    }
    let mut app_ratios = AppRatios::default();
    for (ka, pa, spec) in &apps {
        let ratio = Some(pa.read_p99_us / ka.read_p99_us.max(1e-9));
        match spec.app {
            crate::pager_app::App::Memcached => app_ratios.memcached = ratio,
            crate::pager_app::App::Redis => app_ratios.redis = ratio,
        }
        for (system, a) in [("kernel-swap", ka), ("pager", pa)] {
            rows.push(Row {
                case: format!("app-{}", spec.app.name()),
                system: system.into(),
                process: spec.app.program().into(),
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
    let (ks, zram, lru, pg) = (
        get("kernel-swap"),
        get("kernel-zram"),
        get("pager-lru-ssd"),
        get("pager"),
    );
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
            .chain(multi.iter().flat_map(|m| {
                m.cdf
                    .iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(l, v)| crate::plot::Series {
                        label: l,
                        samples: v,
                    })
            }))
            .collect();
        match crate::plot::cdf(&path, "page-in latency per system and case", "µs", &series) {
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
    if !multi.is_empty() {
        notes.push(
            "concurrent and dynamic cases: probes in processes of their own, tenants of one \
             pool served by `tiermem pager daemon` (NVM buffer D/4, one swap file), each with \
             its share of the data and of the budget; a probe phase without page-ins counts as \
             in bound; leaked_slots includes slots or tenants left in the pool after they left"
                .into(),
        );
    }
    if !o.systems.is_empty() {
        notes.push(format!(
            "--systems: only {} ran; the others' rows are missing and their keys null",
            systems.join(", ")
        ));
    } else if quick {
        notes.push(
            "--quick: one repetition; pager-nolc, kernel-zswap and kernel-zram not run \
             (p99_ratio_vs_kernel_zram null: full runs only)"
                .into(),
        );
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
        p99_ratio_vs_kernel_zram: ratio(p99(pg), p99(zram)),
        p50_ratio_vs_kernel_swap: ratio(pg.map(|r| r.pagein_p50_us), ks.map(|r| r.pagein_p50_us)),
        p99_ratio_vs_lru_ssd: ratio(p99(pg), p99(lru)),
        pageout_p99_ratio_vs_lru_ssd: ratio(
            pg.and_then(|r| r.pageout_p99_us),
            lru.and_then(|r| r.pageout_p99_us),
        ),
        throughput_ratio_vs_kernel_swap: ratio(pg.map(|r| r.ops_per_s), ks.map(|r| r.ops_per_s)),
        app_p99_ratio_vs_kernel_swap: app_ratios,
        bounds_met: BoundsMet {
            single: pg.and_then(|r| r.bound_met),
            concurrent: concurrent_met,
            dynamic: dynamic_met,
        },
        verify_errors: measured.iter().map(|m| m.reply.verify_errors).sum::<u64>()
            + multi.iter().map(|m| m.verify_errors).sum::<u64>(),
        leaked_slots: measured
            .iter()
            .filter_map(|m| m.reply.leaked_slots)
            .sum::<u64>()
            + multi.iter().map(|m| m.leaked_slots).sum::<u64>(),
        cdf_png,
        results: rows,
        notes,
    })
}

/// An application case (see [`crate::pager_app`]): `app` with half of this run's data under
/// kernel swap, then under the shim, budget half of it, NVM a quarter, the single case's bound.
/// `None`, with a note, when the program or the YCSB binding is missing.
fn run_app(
    app: crate::pager_app::App,
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
    if !crate::on_path(app.program()) {
        notes.push(format!(
            "{} is not installed (scripts/setup.sh installs it): no app case",
            app.program()
        ));
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
        app,
        data: app_data,
        budget: app_data / 2,
        nvm: app_data / 4,
        bound_ns: Some(bound_ns),
        ops: 0,
        dir: dir.to_path_buf(),
        logs: dir.join(format!("app-logs-{}-{}", app.name(), std::process::id())),
    };
    spec.ops = (if quick { 40_000 } else { 200_000 }).min(2 * spec.records());
    std::fs::create_dir_all(&spec.logs)
        .with_context(|| format!("creating {}", spec.logs.display()))?;
    let say = |m: &str| progress::note(m);
    progress::step(&format!("{} under kernel-swap (YCSB-A)", app.program()));
    let kernel = {
        let _z = ZswapOff::new();
        let _swap = SwapFile::create(
            &dir.join(format!("kernel-app-{}.swap", std::process::id())),
            app_data * 2 + (64 << 20),
            SWAP_PRIO_TOP,
        )?;
        // Rerun in a fresh cgroup with the same limit after an OOM kill, at most twice, and
        // say so (as `run_kernel_probe` does for the probes).
        let mut attempt = 0u32;
        loop {
            let cg = format!(
                "tiermem-pager-bench-app-{}-{}-{attempt}",
                app.name(),
                std::process::id()
            );
            match run_kernel(&spec, &ycsb, &cg, &say) {
                Ok(r) => break r,
                Err(e)
                    if attempt < 2
                        && e.downcast_ref::<crate::pager_app::KernelOomKill>()
                            .is_some() =>
                {
                    attempt += 1;
                    notes.push(format!(
                        "{} under kernel swap was OOM-killed by its memory cgroup (attempt \
                         {attempt}) and rerun",
                        app.program()
                    ));
                    progress::step(&format!(
                        "{} under kernel-swap (again, after an OOM kill)",
                        app.program()
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    };
    // The pager gets what the kernel got for the items: the budget and the slack (the server's
    // memory at start is outside the arena there too).
    progress::step(&format!("{} under the pager (YCSB-A)", app.program()));
    let pager = run_pager(
        &AppSpec {
            app,
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
    let what = match app {
        crate::pager_app::App::Memcached => format!(
            "memcached (-m {} MiB, 2 threads)",
            2 * app_data.div_ceil(1 << 20)
        ),
        crate::pager_app::App::Redis => {
            "redis-server (no persistence, hashes as listpacks, its own jemalloc)".to_string()
        }
    };
    notes.push(format!(
        "app case: {what} with {} YCSB records (~{} MiB of items), \
         budget {} MiB, NVM {} MiB; one YCSB-A warm-up of {} then {} timed operations, \
         dataintegrity=true; op p99 is YCSB's READ p99; kernel-swap's cgroup allowed {} MiB over \
         the budget (the server's memory at start + the probe's slack), the pager's arena budget \
         is the budget + that slack ({} MiB)",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zswap_pool_percent_rounds_up_to_whole_percents() {
        const MIB: u64 = 1 << 20;
        // The full run's 512 MiB buffer on this VM's 24,105 MiB: 2.1 % → 3 %.
        assert_eq!(zswap_pool_percent(512 * MIB, 24_105 * MIB), 3);
        // Exactly 1 %, and a pool far below 1 %.
        assert_eq!(zswap_pool_percent(100 * MIB, 10_000 * MIB), 1);
        assert_eq!(zswap_pool_percent(16 * MIB, 64_000 * MIB), 1);
        // Just over 1 %.
        assert_eq!(zswap_pool_percent(100 * MIB + 1, 10_000 * MIB), 2);
        // A pool of all of RAM or more stays at 100; no RAM does not divide by zero.
        assert_eq!(zswap_pool_percent(2 * 1024 * MIB, 1024 * MIB), 100);
        assert_eq!(zswap_pool_percent(MIB, 0), 100);
        // Never below the pool asked for.
        for ram in [1000 * MIB, 7777 * MIB, 24_105 * MIB] {
            for pool in [MIB, 64 * MIB, 512 * MIB] {
                let p = zswap_pool_percent(pool, ram);
                assert!(ram as u128 * p as u128 >= pool as u128 * 100);
            }
        }
    }

    #[test]
    fn systems_by_default_quick_and_asked() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(selected_systems(false, &[]).unwrap(), SYSTEMS.to_vec());
        assert_eq!(
            selected_systems(true, &[]).unwrap(),
            [
                "kernel-swap",
                "pager-lru-ssd",
                "pager",
                "concurrent",
                "memcached",
                "redis"
            ]
        );
        // kernel-swap always, the order is the run's whatever the order asked.
        assert_eq!(
            selected_systems(true, &s(&["kernel-zram", "kernel-zswap"])).unwrap(),
            ["kernel-swap", "kernel-zswap", "kernel-zram"]
        );
        assert!(selected_systems(false, &s(&["zram"])).is_err());
    }

    #[test]
    fn sys_params_restore_in_reverse() {
        let dir = std::env::temp_dir().join(format!("tiermem-sysparams-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, "20\n").unwrap();
        std::fs::write(&b, "N\n").unwrap();
        {
            let mut p = SysParams::default();
            p.set(&a, "3").unwrap();
            p.set(&b, "Y").unwrap();
            p.set(&b, "Y").unwrap();
            assert_eq!(std::fs::read_to_string(&a).unwrap(), "3");
            assert_eq!(std::fs::read_to_string(&b).unwrap(), "Y");
            assert_eq!(p.saved.len(), 2);
            assert!(p.set(&dir.join("missing"), "1").is_err());
        }
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "20");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "N");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
