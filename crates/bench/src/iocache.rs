//! `tiermem bench iocache`: the DBIO buffer pool ([`tiermem_iocache::Pool`]) in its three modes
//! — buffered, direct, dbio — side by side under YCSB-style page workloads (zipfian 0.99, 4 KiB
//! pages) on a data file larger than the memory budget, each run in a worker process of its own
//! inside a v1 memory cgroup whose `memory.limit_in_bytes` is the budget, so that the kernel
//! holds pool and page cache together to it (the paper's setting, §3.4).
//!
//! Per run: the file's page cache is dropped first; the worker joins the cgroup, opens the pool
//! (frames mlocked), runs a warm-up and then the timed operations, and reports ops/s, pool and
//! page-cache hit ratios, device reads and writes per operation (`/proc/self/io`), the page
//! cache's share at the end (`cachestat`) and the pages held twice; the parent reads the
//! group's peak charge (`memory.max_usage_in_bytes`). Modes are interleaved per pool fraction.
//!
//! The z-READ half runs first ([`crate::zread`]): every read method in a worker of its own on a
//! warm page cache, with the `zread_*` ratios against `pread` measured in the same run.

use crate::snapshot::Cgroup;
use crate::worker::{self, Worker};
use crate::{machine, progress, BenchOpts, Report};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tiermem_iocache::{Access, AfterHit, EvictClean, Mode, Options, Pool};
use tiermem_migrate::workload::{PageGen, Workload};

/// Page size of every run.
const PAGE: usize = 4096;
/// Pool sizes, as fractions of the budget.
const FRACTIONS: [f64; 3] = [0.25, 0.5, 0.75];
/// `--dir`'s default: on the root file system (a disk), not tmpfs.
const DEFAULT_DIR: &str = "/var/tmp/tiermem-iocache-bench";

/// Options of `tiermem bench iocache`.
#[derive(Args, Clone, Debug, Default)]
pub struct IocacheOpts {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub bench: BenchOpts,
    /// Directory for the data file, on a block file system (tmpfs is refused).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Memory budget (pool and page cache) in MiB (default 512; 128 with --quick).
    #[arg(long, value_name = "MIB")]
    pub budget_mib: Option<u64>,
    /// Repetitions of every configuration (default 3); medians are reported.
    #[arg(long)]
    pub reps: Option<usize>,
    /// dbio's evict-clean path in the main rows (default: the library's, readahead); the others
    /// run at the 50 % pool as variants.
    #[arg(long, value_parser = ["write", "readahead", "readahead-all", "readahead-reused", "drop"])]
    pub evict_clean: Option<String>,
    /// dbio's treatment of pages read from the page cache in the main rows (default: the
    /// library's, auto: drop them when cold misses are read O_DIRECT, leave them under buffered
    /// cold reads); the other choice (leave for auto and drop, drop for leave) runs at the
    /// 50 % pool as a variant.
    #[arg(long, value_parser = ["leave", "drop", "auto"])]
    pub after_hit: Option<String>,
    /// Run only one half: the DBIO buffer pool or z-READ (the other's keys are null).
    #[arg(long, value_parser = ["dbio", "zread"])]
    pub only: Option<String>,
}

/// One run's request to its worker.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct RunReq {
    file: PathBuf,
    mode: String,
    evict_clean: String,
    after_hit: String,
    budget: u64,
    pool_bytes: u64,
    pages: u64,
    warmup_ops: u64,
    ops: u64,
    read_pct: u64,
    seed: u64,
    /// The cgroup's `cgroup.procs`, joined before the pool is opened.
    cgroup_procs: Option<PathBuf>,
}

/// One run's figures, from its worker.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct RunReply {
    ops_per_s: f64,
    pool_hit_ratio: f64,
    page_cache_hit_ratio: f64,
    device_reads_per_op: f64,
    device_writes_per_op: f64,
    page_cache_bytes: u64,
    duplicate_pct: f64,
    cpu_s: f64,
    wall_s: f64,
    locked: bool,
}

/// One row of the report (a configuration's median run).
#[derive(Serialize, Debug, Clone)]
pub struct DbioRow {
    /// `ycsb-b` (95 % reads) or `ycsb-a` (50 %).
    pub workload: String,
    /// Data file size over the budget.
    pub data_over_budget: f64,
    /// Pool size over the budget.
    pub pool_fraction: f64,
    /// `buffered`, `direct` or `dbio`.
    pub mode: String,
    /// dbio's evict-clean path (`-` for the other modes).
    pub evict_clean: String,
    /// dbio's treatment of a page read from the page cache: `leave` or `drop` (`-` for the
    /// other modes).
    pub after_hit: String,
    /// Operations per second (median of the repetitions).
    pub ops_per_s: f64,
    /// Smallest and largest ops/s of the repetitions.
    pub ops_per_s_min: f64,
    /// See `ops_per_s_min`.
    pub ops_per_s_max: f64,
    /// Pool hits over page requests.
    pub pool_hit_ratio: f64,
    /// Pool misses served by the page cache.
    pub page_cache_hit_ratio: f64,
    /// Device reads (4 KiB) per operation.
    pub device_reads_per_op: f64,
    /// Device writes (4 KiB) per operation.
    pub device_writes_per_op: f64,
    /// The cgroup's peak charge.
    pub max_usage_bytes: u64,
    /// The file's bytes in the page cache at the end.
    pub page_cache_bytes: u64,
    /// Pool pages also in the page cache at the end, percent.
    pub duplicate_pct: f64,
    /// The worker's CPU seconds in the timed phase.
    pub cpu_s: f64,
    /// Whether the pool's frames were mlocked.
    pub locked: bool,
    /// OOM kills in the cgroup during the run.
    pub oom_kills: u64,
}

/// The report of `tiermem bench iocache`.
#[derive(Serialize, Debug)]
pub struct IocacheReport {
    /// The buffer-pool runs.
    pub dbio: Vec<DbioRow>,
    /// SQLite TPC-C-like runs through the VFS, one row per mode at the same pool size.
    pub tpcc: Vec<crate::tpcc::TpccRow>,
    /// tpmC, dbio over buffered (paper +24 %).
    pub tpcc_dbio_over_buffered: Option<f64>,
    /// tpmC, dbio over direct (paper +128 %).
    pub tpcc_dbio_over_direct: Option<f64>,
    /// z-READ cells (median of the repetitions).
    pub zread: Vec<crate::zread::ZreadRow>,
    /// The loss model's table (Table 4.2) as measured on this machine in this run.
    pub zread_model: serde_json::Value,
    /// YCSB-B at 2× the budget, the pool fraction where the ratio is best: dbio over buffered.
    pub dbio_over_buffered: Option<f64>,
    /// The same against direct.
    pub dbio_over_direct: Option<f64>,
    /// dbio's best pool fraction over the better baseline's best one.
    pub dbio_best_over_best: Option<f64>,
    /// The pool fraction of `dbio_over_buffered`.
    pub dbio_over_buffered_fraction: Option<f64>,
    /// `zread` over `pread`, 4 KiB random reads, warm, 2 threads, data untouched.
    pub zread_over_read_4k: Option<f64>,
    /// The same at 16 KiB.
    pub zread_over_read_16k: Option<f64>,
    /// The same at 128 KiB.
    pub zread_over_read_128k: Option<f64>,
    /// 16 KiB, every word summed after each read.
    pub zread_over_read_16k_consumed: Option<f64>,
    /// 16 KiB random reads of the files on disk (page cache dropped, no warm-up; paper ≈ 1).
    pub zread_over_read_16k_on_disk: Option<f64>,
    /// The same for `zread_into`.
    pub zread_into_over_read_16k_on_disk: Option<f64>,
    /// `zread_into` (loss model on) over `pread`, 16 KiB and 128 KiB, pure reads.
    pub zread_into_over_read_16k: Option<f64>,
    /// See `zread_into_over_read_16k`.
    pub zread_into_over_read_128k: Option<f64>,
    /// `zread_into` with the model over `pread`: the worst of the r/w mixes 100:0, 90:10,
    /// 75:25 and 50:50 at 16 and 128 KiB.
    pub zread_into_min_over_read: Option<f64>,
    /// Without the model (always remap), 50:50: the loss the model avoids (paper −15 %).
    pub zread_into_nomodel_over_read_16k_50_50: Option<f64>,
    /// See `zread_into_nomodel_over_read_16k_50_50`.
    pub zread_into_nomodel_over_read_128k_50_50: Option<f64>,
    /// The co-runner's slowdown (§4.4.5; paper 144 % beside read, 11 % beside z-READ): a
    /// memory-copying program's time beside one `pread` reader over alone, minus 1.
    pub corunner_slowdown_pread: Option<f64>,
    /// The same beside one `zread` reader.
    pub corunner_slowdown_zread: Option<f64>,
    /// Unmodified fio (psync, random 16 KiB reads, 2 jobs) through the preload over plain fio.
    pub fio_zread_preload_over_plain_16k: Option<f64>,
    /// The same with the loss model off (remap whenever aligned).
    pub fio_zread_preload_nomodel_over_plain_16k: Option<f64>,
    /// The device's 4 KiB random O_DIRECT read latency, µs (median of 2000).
    pub device_read_4k_us: f64,
    /// Budget, data sizes, operations, repetitions.
    pub config: serde_json::Value,
    /// What is not built or not measured.
    pub notes: Vec<String>,
    /// The machine.
    pub machine: machine::Machine,
}

fn mode_of(s: &str) -> Result<Mode> {
    Ok(match s {
        "buffered" => Mode::Buffered,
        "direct" => Mode::Direct,
        "dbio" => Mode::Dbio,
        _ => bail!("unknown mode {s:?}"),
    })
}

fn evict_clean_of(s: &str) -> Result<EvictClean> {
    Ok(match s {
        "write" => EvictClean::Write,
        "readahead" => EvictClean::Readahead,
        "readahead-all" => EvictClean::ReadaheadAll,
        "readahead-reused" => EvictClean::ReadaheadReused,
        "drop" => EvictClean::Drop,
        _ => bail!("unknown evict-clean policy {s:?}"),
    })
}

/// `read_bytes` and `write_bytes` of `/proc/self/io`.
fn proc_io() -> (u64, u64) {
    let t = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        t.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("read_bytes:"), field("write_bytes:"))
}

/// The worker side: one run per request.
pub fn run_worker_main() -> Result<()> {
    worker::serve(|r: RunReq| Ok(Some(serde_json::to_value(one_run(&r)?)?)))
}

fn one_run(r: &RunReq) -> Result<RunReply> {
    if let Some(p) = &r.cgroup_procs {
        std::fs::write(p, "0").with_context(|| format!("joining the cgroup ({})", p.display()))?;
    }
    let pool = Pool::open(
        &r.file,
        Options {
            page_size: PAGE,
            budget: r.budget,
            pool_bytes: r.pool_bytes,
            mode: mode_of(&r.mode)?,
            evict_clean: if r.evict_clean == "-" {
                Options::default().evict_clean
            } else {
                evict_clean_of(&r.evict_clean)?
            },
            after_hit: match r.after_hit.as_str() {
                "drop" => AfterHit::Drop,
                "leave" => AfterHit::Leave,
                _ => Options::default().after_hit,
            },
            // The cgroup holds the budget; the library trims only without one.
            enforce_budget: r.cgroup_procs.is_none(),
            create: false,
            ..Options::default()
        },
    )?;
    let mut keys = PageGen::new(Workload::Zipfian, r.pages, r.seed);
    let mut dice = PageGen::new(Workload::Uniform, 100, r.seed ^ 0xd1ce);
    let mut sum = 0u64;
    let mut step = |pool: &Pool| -> Result<()> {
        let p = keys.next_page();
        if dice.next_page() < r.read_pct {
            let g = pool.get_page(p, Access::Read)?;
            sum = sum.wrapping_add(u64::from(g[p as usize % PAGE]));
        } else {
            let mut g = pool.get_page(p, Access::Write)?;
            if let Some(d) = g.as_mut_slice() {
                let i = 8 + (sum as usize % (PAGE - 16));
                d[i] = d[i].wrapping_add(1);
            }
        }
        Ok(())
    };
    for _ in 0..r.warmup_ops {
        step(&pool)?;
    }
    let s0 = pool.stats();
    let (rb0, wb0) = proc_io();
    let c0 = crate::cpu::process_ns();
    let t0 = Instant::now();
    for _ in 0..r.ops {
        step(&pool)?;
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = (crate::cpu::process_ns() - c0) as f64 / 1e9;
    let (rb1, wb1) = proc_io();
    let s1 = pool.stats();
    let hits = (s1.pool_hits - s0.pool_hits) as f64;
    let misses = (s1.pool_misses - s0.pool_misses) as f64;
    let reads = (rb1 - rb0) as f64 / PAGE as f64;
    let writes = (wb1 - wb0) as f64 / PAGE as f64;
    let page_cache_hit_ratio = match pool.options().mode {
        Mode::Dbio => (s1.cache_hits - s0.cache_hits) as f64 / misses.max(1.0),
        Mode::Buffered => (1.0 - reads / misses.max(1.0)).clamp(0.0, 1.0),
        Mode::Direct => 0.0,
    };
    let page_cache_bytes = pool.file().cached_pages(0, 0)? * 4096;
    let duplicate_pct = pool.duplicate_pct()?;
    std::hint::black_box(sum);
    Ok(RunReply {
        ops_per_s: r.ops as f64 / wall_s,
        pool_hit_ratio: hits / (hits + misses).max(1.0),
        page_cache_hit_ratio,
        device_reads_per_op: reads / r.ops as f64,
        device_writes_per_op: writes / r.ops as f64,
        page_cache_bytes,
        duplicate_pct,
        cpu_s,
        wall_s,
        locked: s1.locked,
    })
}

/// The data file, removed (with its directory) when dropped.
struct DataDir {
    dir: PathBuf,
    file: PathBuf,
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes `pages` pages of pseudo-random bytes (each headed by its page number), synced.
fn make_data(dir: &Path, pages: u64) -> Result<DataDir> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join(format!("data-{}", std::process::id()));
    let d = DataDir {
        dir: dir.to_path_buf(),
        file: file.clone(),
    };
    let f = std::fs::File::create(&file).with_context(|| format!("creating {}", file.display()))?;
    let chunk_pages = 256u64;
    let mut buf = vec![0u8; chunk_pages as usize * PAGE];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut p = 0;
    while p < pages {
        let n = chunk_pages.min(pages - p);
        for (i, page) in buf.chunks_mut(PAGE).take(n as usize).enumerate() {
            for w in page.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            page[..8].copy_from_slice(&(p + i as u64).to_le_bytes());
        }
        f.write_all_at(&buf[..n as usize * PAGE], p * PAGE as u64)
            .with_context(|| format!("writing {}", file.display()))?;
        p += n;
    }
    f.sync_all().context("fsync of the data file")?;
    Ok(d)
}

/// Drops the file's page cache (after writing back whatever is dirty).
/// Writes `file`'s dirty pages and drops it from the page cache.
pub(crate) fn drop_cache(file: &Path) -> Result<()> {
    let f = std::fs::File::open(file)?;
    f.sync_data()?;
    tiermem_iocache::sys::fadvise(
        std::os::fd::AsRawFd::as_raw_fd(&f),
        0,
        0,
        libc::POSIX_FADV_DONTNEED,
    )?;
    Ok(())
}

/// Median 4 KiB O_DIRECT random read latency of the file, µs.
fn device_read_us(file: &Path, pages: u64) -> Result<f64> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)?;
    let mut buf = tiermem_media::AlignedBuf::new(PAGE, PAGE)?;
    let mut gen = PageGen::new(Workload::Uniform, pages, 7);
    let mut v = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let off = gen.next_page() * PAGE as u64;
        let t = Instant::now();
        f.read_exact_at(&mut buf, off)?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Ok(v[v.len() / 2])
}

struct Config {
    workload: &'static str,
    read_pct: u64,
    data_over_budget: f64,
    fraction: f64,
    mode: &'static str,
    evict_clean: &'static str,
    after_hit: &'static str,
}

fn ec_name(e: EvictClean) -> &'static str {
    match e {
        EvictClean::Write => "write",
        EvictClean::Readahead => "readahead",
        EvictClean::ReadaheadAll => "readahead-all",
        EvictClean::ReadaheadReused => "readahead-reused",
        EvictClean::Drop => "drop",
    }
}

fn ah_name(a: AfterHit) -> &'static str {
    match a {
        AfterHit::Leave => "leave",
        AfterHit::Drop => "drop",
        AfterHit::Auto => "auto",
    }
}

/// One run of configuration `c` (repetition `rep`) in a fresh worker inside a fresh cgroup
/// limited to `budget`: the worker's figures, the group's peak charge and its OOM kills.
fn one_config(
    c: &Config,
    d: &DataDir,
    pages: u64,
    budget: u64,
    rep: usize,
) -> Result<(RunReply, u64, u64)> {
    progress::step(&format!(
        "{} {:.2}x pool {:.0}% {} {} {} (rep {})",
        c.workload,
        c.data_over_budget,
        c.fraction * 100.0,
        c.mode,
        c.evict_clean,
        c.after_hit,
        rep + 1
    ));
    drop_cache(&d.file)?;
    let cg = Cgroup::create(&format!("tiermem-iocache-{}", std::process::id()))?;
    cg.set_limit(budget)?;
    let req = RunReq {
        file: d.file.clone(),
        mode: c.mode.to_string(),
        evict_clean: c.evict_clean.to_string(),
        after_hit: c.after_hit.to_string(),
        budget,
        pool_bytes: ((budget as f64 * c.fraction) as u64) / PAGE as u64 * PAGE as u64,
        pages,
        warmup_ops: 2 * pages,
        ops: 2 * pages,
        read_pct: c.read_pct,
        seed: 42 + rep as u64,
        cgroup_procs: Some(cg.procs_path()),
    };
    let mut w = Worker::spawn(
        &format!("iocache {} {}", c.mode, c.evict_clean),
        &["bench".to_string(), "iocache-run".to_string()],
        Duration::from_secs(1800),
        Vec::new(),
    )?;
    let reply: RunReply = w.call(&req, "a run")?;
    w.finish()?;
    let max_usage = cg.max_usage()?;
    let ooms = cg.oom_kills();
    Ok((reply, max_usage, ooms))
}

/// Removes what an earlier run killed by a signal left: its cgroup (`tiermem-iocache-PID`) and
/// files (`DIR/data-PID`, z-READ's `DIR/zread-T-PID`, the TPC-C databases
/// `DIR/tpcc-*-PID.db[-journal]`), for PIDs no longer running.
fn clear_leftovers(dir: &Path) {
    let dead = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|&pid| pid != std::process::id())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    let names = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .map(|it| {
                it.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    for n in names(Path::new("/sys/fs/cgroup/memory")) {
        if dead(&n, "tiermem-iocache-") {
            // Creating it again empties and replaces it; dropping it removes it.
            drop(Cgroup::create(&n));
        }
    }
    for n in names(dir) {
        let stem = n.trim_end_matches("-journal").trim_end_matches(".db");
        let owner = stem.rsplit_once('-').map_or("", |(_, pid)| pid);
        if dead(owner, "") {
            let _ = std::fs::remove_file(dir.join(n));
        }
    }
}

/// Runs the benchmark.
pub fn run(o: &IocacheOpts) -> Result<IocacheReport> {
    let quick = o.bench.quick;
    let budget = o.budget_mib.unwrap_or(if quick { 128 } else { 512 }) << 20;
    let reps = o.reps.unwrap_or(3).max(1);
    let dir = o.dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    if let Some(p) = &o.bench.plot {
        crate::plot::check_path(p)?;
    }
    clear_leftovers(&dir);
    let shapes: Vec<(&'static str, u64, f64)> = if quick {
        vec![("ycsb-b", 95, 2.0)]
    } else {
        vec![
            ("ycsb-b", 95, 2.0),
            ("ycsb-a", 50, 2.0),
            ("ycsb-b", 95, 1.25),
        ]
    };
    let lib = Options::default();
    let main_ec = ec_name(match o.evict_clean.as_deref() {
        Some(e) => evict_clean_of(e)?,
        None => lib.evict_clean,
    });
    let main_ah = match o.after_hit.as_deref() {
        Some("drop") => "drop",
        Some("leave") => "leave",
        _ => ah_name(lib.after_hit),
    };
    let mut configs = Vec::new();
    let shapes = if o.only.as_deref() == Some("zread") {
        Vec::new()
    } else {
        shapes
    };
    for &(workload, read_pct, dob) in &shapes {
        for &fraction in &FRACTIONS {
            for mode in ["buffered", "direct", "dbio"] {
                configs.push(Config {
                    workload,
                    read_pct,
                    data_over_budget: dob,
                    fraction,
                    mode,
                    evict_clean: if mode == "dbio" { main_ec } else { "-" },
                    after_hit: if mode == "dbio" { main_ah } else { "-" },
                });
            }
            if workload == "ycsb-b" && dob == 2.0 && fraction == 0.5 {
                // The other evict-clean paths, and dropping pages read from the page cache.
                for ec in ["write", "readahead", "readahead-reused", "drop"]
                    .into_iter()
                    .filter(|&e| e != main_ec)
                {
                    configs.push(Config {
                        workload,
                        read_pct,
                        data_over_budget: dob,
                        fraction,
                        mode: "dbio",
                        evict_clean: ec,
                        after_hit: main_ah,
                    });
                }
                configs.push(Config {
                    workload,
                    read_pct,
                    data_over_budget: dob,
                    fraction,
                    mode: "dbio",
                    evict_clean: main_ec,
                    // (`auto` drops at this size: cold reads are O_DIRECT here.)
                    after_hit: if main_ah == "leave" { "drop" } else { "leave" },
                });
            }
        }
    }
    progress::plan("bench iocache", Some((configs.len() * reps) as u64));
    let z = if o.only.as_deref() == Some("dbio") {
        crate::zread::ZreadResult::default()
    } else {
        crate::zread::run(&dir, quick, reps)?
    };
    let mut rows = Vec::new();
    let mut device_read_4k_us = 0.0;
    let mut data: Option<(f64, DataDir, u64)> = None;
    let mut notes = Vec::new();
    if let Some(n) = &z.fio_note {
        notes.push(n.clone());
    }
    // Configurations of one data size share a file; within it, every repetition runs all of
    // them in turn (modes interleaved, never one mode's repetitions back to back).
    let mut groups: Vec<(f64, Vec<usize>)> = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if g.0 == c.data_over_budget => g.1.push(i),
            _ => groups.push((c.data_over_budget, vec![i])),
        }
    }
    let mut runs_of: Vec<Vec<(RunReply, u64, u64)>> = vec![Vec::new(); configs.len()];
    for (dob, members) in &groups {
        let pages = (budget as f64 * dob) as u64 / PAGE as u64;
        drop(data.take()); // its file has the name the next one takes
        progress::note(&format!(
            "writing a {} MiB data file in {}",
            (pages * PAGE as u64) >> 20,
            dir.display()
        ));
        let d = make_data(&dir, pages)?;
        if device_read_4k_us == 0.0 {
            device_read_4k_us = device_read_us(&d.file, pages)?;
        }
        data = Some((*dob, d, pages));
        let (_, d, pages) = data.as_ref().ok_or_else(|| anyhow!("no data file"))?;
        for rep in 0..reps {
            for &i in members {
                let c = &configs[i];
                runs_of[i].push(one_config(c, d, *pages, budget, rep)?);
            }
        }
    }
    drop(data);
    let tp = if o.only.as_deref() == Some("zread") {
        crate::tpcc::TpccResult::default()
    } else {
        crate::tpcc::run(&dir, quick, reps)?
    };
    // ops/s per configuration in repetition order, for the ratios within a repetition.
    let per_rep: Vec<Vec<f64>> = runs_of
        .iter()
        .map(|v| v.iter().map(|r| r.0.ops_per_s).collect())
        .collect();
    for (c, mut runs) in configs.iter().zip(runs_of) {
        runs.sort_by(|a, b| a.0.ops_per_s.total_cmp(&b.0.ops_per_s));
        let (min, max) = (runs[0].0.ops_per_s, runs[runs.len() - 1].0.ops_per_s);
        let (m, max_usage, ooms) = runs[runs.len() / 2].clone();
        rows.push(DbioRow {
            workload: c.workload.to_string(),
            data_over_budget: c.data_over_budget,
            pool_fraction: c.fraction,
            mode: c.mode.to_string(),
            evict_clean: c.evict_clean.to_string(),
            after_hit: c.after_hit.to_string(),
            ops_per_s: m.ops_per_s.round(),
            ops_per_s_min: min.round(),
            ops_per_s_max: max.round(),
            pool_hit_ratio: round3(m.pool_hit_ratio),
            page_cache_hit_ratio: round3(m.page_cache_hit_ratio),
            device_reads_per_op: round3(m.device_reads_per_op),
            device_writes_per_op: round3(m.device_writes_per_op),
            max_usage_bytes: max_usage,
            page_cache_bytes: m.page_cache_bytes,
            duplicate_pct: (m.duplicate_pct * 10.0).round() / 10.0,
            cpu_s: round3(m.cpu_s),
            locked: m.locked,
            oom_kills: ooms,
        });
    }
    // The ratio keys compare configurations within one repetition (they ran minutes apart at
    // most; the device's latency drifts more than that between repetitions) and take the
    // median over repetitions.
    let find = |mode: &str, f: f64, rep: usize| {
        let i = configs.iter().position(|c| {
            c.workload == "ycsb-b"
                && c.data_over_budget == 2.0
                && c.fraction == f
                && c.mode == mode
                && (c.mode != "dbio" || (c.evict_clean == main_ec && c.after_hit == main_ah))
        })?;
        per_rep[i].get(rep).copied()
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let ratio_at = |base: &str| {
        FRACTIONS
            .iter()
            .filter_map(|&f| {
                let r = (0..reps).filter_map(|k| Some(find("dbio", f, k)? / find(base, f, k)?));
                Some((median(r.collect())?, f))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    let best = |mode: &str, k: usize| {
        FRACTIONS
            .iter()
            .filter_map(|&f| find(mode, f, k))
            .max_by(|a, b| a.total_cmp(b))
    };
    let over_buffered = ratio_at("buffered");
    let over_direct = ratio_at("direct");
    let best_over_best = median(
        (0..reps)
            .filter_map(|k| Some(best("dbio", k)? / best("buffered", k)?.max(best("direct", k)?)))
            .collect(),
    )
    .map(round3);
    if rows.iter().any(|r| !r.locked) {
        notes.push("some pools could not be mlocked (RLIMIT_MEMLOCK)".into());
    }
    if let Some(n) = &tp.note {
        notes.push(n.clone());
    }
    let tpmc = |m: &str| tp.rows.iter().find(|r| r.mode == m).map(|r| r.tpmc);
    let tratio = |b: &str| Some(round3(tpmc("dbio")? / tpmc(b)?.max(1.0)));
    let report = IocacheReport {
        tpcc_dbio_over_buffered: tratio("buffered"),
        tpcc_dbio_over_direct: tratio("direct"),
        tpcc: tp.rows.clone(),
        dbio: rows,
        zread: z.rows,
        zread_model: z.model,
        dbio_over_buffered: over_buffered.map(|x| round3(x.0)),
        dbio_over_direct: over_direct.map(|x| round3(x.0)),
        dbio_best_over_best: best_over_best,
        dbio_over_buffered_fraction: over_buffered.map(|x| x.1),
        zread_over_read_4k: z.keys.get("zread_over_read_4k").copied(),
        zread_over_read_16k: z.keys.get("zread_over_read_16k").copied(),
        zread_over_read_128k: z.keys.get("zread_over_read_128k").copied(),
        zread_over_read_16k_consumed: z.keys.get("zread_over_read_16k_consumed").copied(),
        zread_over_read_16k_on_disk: z.keys.get("zread_over_read_16k_on_disk").copied(),
        zread_into_over_read_16k_on_disk: z.keys.get("zread_into_over_read_16k_on_disk").copied(),
        zread_into_over_read_16k: z.keys.get("zread_into_over_read_16k").copied(),
        zread_into_over_read_128k: z.keys.get("zread_into_over_read_128k").copied(),
        zread_into_min_over_read: z.keys.get("zread_into_min_over_read").copied(),
        zread_into_nomodel_over_read_16k_50_50: z
            .keys
            .get("zread_into_nomodel_over_read_16k_50_50")
            .copied(),
        zread_into_nomodel_over_read_128k_50_50: z
            .keys
            .get("zread_into_nomodel_over_read_128k_50_50")
            .copied(),
        corunner_slowdown_pread: z.keys.get("corunner_slowdown_pread").copied(),
        corunner_slowdown_zread: z.keys.get("corunner_slowdown_zread").copied(),
        fio_zread_preload_over_plain_16k: z.keys.get("fio_zread_preload_over_plain_16k").copied(),
        fio_zread_preload_nomodel_over_plain_16k: z
            .keys
            .get("fio_zread_preload_nomodel_over_plain_16k")
            .copied(),
        device_read_4k_us: round3(device_read_4k_us),
        config: serde_json::json!({
            "budget_bytes": budget,
            "page_size": PAGE,
            "repetitions": reps,
            "operations": "warm-up 2 x data pages, then 2 x data pages timed",
            "distribution": "scrambled zipfian 0.99 (YCSB's)",
            "dir": dir,
            "zread": z.config,
            "tpcc": tp.config,
        }),
        notes,
        machine: machine::describe(),
    };
    if let Some(p) = &o.bench.plot {
        plot(&report, p)?;
    }
    Ok(report)
}

/// One grouped bar chart: a series per label, one value per group.
fn labelled_bars(
    path: &Path,
    labels: &[&str],
    title: &str,
    y_label: &str,
    groups: &[&str],
    values: &[Vec<Option<f64>>],
) -> Result<()> {
    let bars: Vec<crate::plot::Bars<'_>> = labels
        .iter()
        .zip(values)
        .map(|(m, v)| crate::plot::Bars {
            label: m,
            values: v,
        })
        .collect();
    crate::plot::bars(path, title, y_label, groups, &bars)
}

/// The charts: z-READ GiB/s per request size and method (random, warm, 2 threads, data
/// untouched) to `path`; the buffer pool's ops/s per pool fraction and mode (YCSB-B, 2× the
/// budget) to `<stem>-dbio.<ext>` beside it.
fn plot(r: &IocacheReport, path: &Path) -> Result<()> {
    if !r.zread.is_empty() {
        let sizes = [4096usize, 16384, 131072];
        let methods = crate::zread::METHODS;
        let values: Vec<Vec<Option<f64>>> = methods
            .iter()
            .map(|m| {
                sizes
                    .iter()
                    .map(|&s| {
                        r.zread
                            .iter()
                            .find(|x| {
                                x.method == *m
                                    && x.size == s
                                    && x.pattern == "random"
                                    && x.threads == 2
                                    && !x.consume
                                    && x.write_pct == 0
                            })
                            .map(|x| x.gib_per_s)
                    })
                    .collect()
            })
            .collect();
        labelled_bars(
            path,
            &methods,
            "tiermem bench iocache: z-READ, random reads of a warm page cache, 2 threads",
            "GiB/s (log scale; zread: data not touched)",
            &["4 KiB", "16 KiB", "128 KiB"],
            &values,
        )?;
    }
    if !r.dbio.is_empty() {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("iocache");
        let ext = path.extension().and_then(|s| s.to_str()).unwrap_or("png");
        let p2 = path.with_file_name(format!("{stem}-dbio.{ext}"));
        let modes = ["buffered", "direct", "dbio"];
        let values: Vec<Vec<Option<f64>>> = modes
            .iter()
            .map(|m| {
                FRACTIONS
                    .iter()
                    .map(|&f| {
                        r.dbio
                            .iter()
                            .find(|x| {
                                x.mode == *m
                                    && x.workload == "ycsb-b"
                                    && x.data_over_budget == 2.0
                                    && x.pool_fraction == f
                                    && (x.mode != "dbio"
                                        || x.evict_clean == ec_name(Options::default().evict_clean))
                                    && (x.mode != "dbio"
                                        || x.after_hit == ah_name(Options::default().after_hit))
                            })
                            .map(|x| x.ops_per_s)
                    })
                    .collect()
            })
            .collect();
        labelled_bars(
            &p2,
            &modes,
            "tiermem bench iocache: YCSB-B on data twice the budget, memory cgroup = budget",
            "operations/s (log scale)",
            &["pool 25 %", "pool 50 %", "pool 75 %"],
            &values,
        )?;
    }
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl Report for IocacheReport {
    fn print_table(&self) {
        println!(
            "{:<7} {:>5} {:>5} {:<8} {:<9} {:<5} {:>10} {:>6} {:>6} {:>7} {:>7} {:>9} {:>5}",
            "work",
            "data",
            "pool",
            "mode",
            "evict",
            "hit",
            "ops/s",
            "poolh",
            "cacheh",
            "rd/op",
            "wr/op",
            "maxuse MB",
            "dup%"
        );
        for r in &self.dbio {
            println!(
                "{:<7} {:>5.2} {:>5.2} {:<8} {:<9} {:<5} {:>10.0} {:>6.3} {:>6.3} {:>7.3} {:>7.3} {:>9} {:>5.1}",
                r.workload,
                r.data_over_budget,
                r.pool_fraction,
                r.mode,
                r.evict_clean,
                r.after_hit,
                r.ops_per_s,
                r.pool_hit_ratio,
                r.page_cache_hit_ratio,
                r.device_reads_per_op,
                r.device_writes_per_op,
                r.max_usage_bytes >> 20,
                r.duplicate_pct
            );
        }
        let f = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.3}"));
        println!(
            "\ndbio_over_buffered {} (pool fraction {}), dbio_over_direct {}, dbio_best_over_best {}; device 4 KiB read {:.1} µs",
            f(self.dbio_over_buffered),
            f(self.dbio_over_buffered_fraction),
            f(self.dbio_over_direct),
            f(self.dbio_best_over_best),
            self.device_read_4k_us
        );
        if !self.tpcc.is_empty() {
            println!("\nsqlite TPC-C-like through the iocache VFS (tpmC, median; min-max)");
            for r in &self.tpcc {
                println!(
                    "  {:<8} pool {:>3.0} %  tpmC {:>9.0} ({:.0}-{:.0})  txns {:>7}  errors {}  peak {} MiB",
                    r.mode,
                    r.pool_fraction * 100.0,
                    r.tpmc,
                    r.tpmc_min,
                    r.tpmc_max,
                    r.txns,
                    r.errors,
                    r.max_usage_bytes >> 20
                );
            }
            println!(
                "  tpcc_dbio_over_buffered {}, tpcc_dbio_over_direct {}",
                f(self.tpcc_dbio_over_buffered),
                f(self.tpcc_dbio_over_direct)
            );
        }
        println!(
            "\nz-READ (GiB/s, median; random unless said; 'mix' = % of reads followed by a write-back)"
        );
        println!(
            "{:<20} {:>6} {:<10} {:>2} {:<6} {:>4} {:>8} {:>8} {:>9}",
            "method", "KiB", "pattern", "t", "summed", "mix", "GiB/s", "cpu/wall", "copied"
        );
        for r in &self.zread {
            println!(
                "{:<20} {:>6} {:<10} {:>2} {:<6} {:>4} {:>8.3} {:>8.2} {:>9}",
                r.method,
                r.size / 1024,
                r.pattern,
                r.threads,
                if r.consume { "yes" } else { "no" },
                r.write_pct,
                r.gib_per_s,
                r.cpu_per_wall,
                r.model_copy_share
                    .map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0))
            );
        }
        if let Some(rows) = self.zread_model.as_array() {
            println!(
                "loss model (Table 4.2 re-measured, ns): pages read read+mod zread zread+mod+cow"
            );
            for r in rows {
                println!(
                    "  {:>3} {:>8} {:>8} {:>8} {:>8}",
                    r["pages"],
                    r["read_ns"],
                    r["read_mod_ns"],
                    r["zread_ns"],
                    r["zread_mod_cow_ns"]
                );
            }
        }
        println!(
            "zread_over_read_4k {}, _16k {}, _128k {}, _16k_consumed {}; zread_into_min_over_read {} (without the model at 50:50: 16k {}, 128k {})",
            f(self.zread_over_read_4k),
            f(self.zread_over_read_16k),
            f(self.zread_over_read_128k),
            f(self.zread_over_read_16k_consumed),
            f(self.zread_into_min_over_read),
            f(self.zread_into_nomodel_over_read_16k_50_50),
            f(self.zread_into_nomodel_over_read_128k_50_50)
        );
        println!(
            "co-runner slowdown beside a pread reader {}, beside a zread reader {} (paper 1.44 and 0.11)",
            f(self.corunner_slowdown_pread),
            f(self.corunner_slowdown_zread)
        );
        for n in &self.notes {
            println!("note: {n}");
        }
    }
}
