//! `tiermem bench migrate`: every migration method side by side in one run (issue #5; paper
//! 003 §V): synthetic applications owning a region (sequential, uniform, zipfian updates)
//! migrated between two network namespaces that share a FAM directory, by FAM-aware post-copy
//! (FAM with and without the `pcm-fam` delay), socket post-copy as CRIU does it (the real veth,
//! and the `ethernet-10g` model; expiration 0, 3, 100, 150 ms), stop-and-copy and pre-copy;
//! plus the live tiermem-kv case. Reports downtime, busy, total time, degradation and CPU
//! seconds per run, the paper's ratios with their per-CPU counterparts, and a timeline PNG.
//!
//! One process per system (issue #22): every run of a synthetic case — application, source,
//! target and the method's threads — happens in a fresh worker process of its own (this binary
//! re-executed as the hidden `tiermem bench migrate-case`, with its own pair of network
//! namespaces; `bench/worker.rs`), so no method runs in a process an earlier method's threads,
//! mappings and allocator state have been through, and its CPU time is its process's
//! (`cpu_s`: every thread, user + system, over the whole case). The tiermem-kv case's servers
//! are processes of their own already; its `cpu_s` is theirs (see `migrate_kv.rs`).

use crate::plot;
use crate::worker::{self, Worker};
use crate::{cpu, BenchOpts};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

use std::path::PathBuf;
use std::time::{Duration, Instant};
use tiermem_migrate::harness::{run_case, CaseResult, CaseSpec, Method, Sample};
use tiermem_migrate::metrics::Metrics;
use tiermem_migrate::netns::TwoHosts;
use tiermem_migrate::workload::Workload;

/// Options of `tiermem bench migrate`.
#[derive(Args, Clone)]
pub struct MigrateOpts {
    #[command(flatten)]
    pub common: BenchOpts,
    /// Region sizes (e.g. `256m,1g,4g`); default 256m with --quick (plus one FAM run at 4 GiB,
    /// uniform updates, for `total_over_floor_4g`), else 256m,1g,4g,8g. Above 1 GiB only FAM,
    /// FAM with the manifest, socket post-copy (10 Gb/s) at 0 and 100 ms and stop-and-copy
    /// run, at most 3 times; a size whose memory (3 × the region + 1 GiB) is not available is
    /// left out and said so.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<String>>,
    /// Workloads (sequential, uniform, zipfian); default all.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Option<Vec<String>>,
    /// Runs per case, methods interleaved round by round (default 3 with --quick, 5 without;
    /// medians reported with min and max; the tiermem-kv cases run at least 3 times).
    #[arg(long)]
    pub reps: Option<usize>,
    /// The FAM directory both hosts share (default: a fresh directory under /dev/shm,
    /// removed afterwards).
    #[arg(long)]
    pub fam: Option<PathBuf>,
    /// The timeline chart (.png; its SVG is written next to it; or .svg alone).
    #[arg(long, default_value = "migrate-timeline.png")]
    pub timeline: PathBuf,
    /// Leave out the live tiermem-kv case.
    #[arg(long)]
    pub no_kv: bool,
}

/// The methods every workload is migrated by, in report order.
fn methods() -> Vec<Method> {
    let mut m = vec![
        Method::Fam {
            delay: "none".into(),
        },
        Method::Fam {
            delay: "pcm-fam".into(),
        },
        Method::FamHot {
            delay: "pcm-fam".into(),
        },
    ];
    for delay in ["veth", "ethernet-10g"] {
        for e in [0, 3, 100, 150] {
            m.push(Method::Socket {
                delay: delay.into(),
                expiration_ms: e,
            });
        }
    }
    m.push(Method::StopAndCopy {
        delay: "pcm-fam".into(),
    });
    m.push(Method::PreCopy {
        delay: "pcm-fam".into(),
    });
    m
}

/// Regions above this size run [`large_methods`] only (and at most 3 rounds): every page of
/// socket post-copy at 3 and 150 ms, over veth, and pre-copy's rounds take minutes there.
const LARGE: usize = 1 << 30;

/// The methods of regions above [`LARGE`]: FAM (with and without the manifest), socket
/// post-copy over the 10 Gb/s model at 0 and 100 ms, stop-and-copy.
fn large_methods() -> Vec<Method> {
    methods()
        .into_iter()
        .filter(|m| {
            matches!(
                m.label().as_str(),
                "fam/pcm-fam"
                    | "fam+hot/pcm-fam"
                    | "socket/ethernet-10g/0ms"
                    | "socket/ethernet-10g/100ms"
                    | "stop-and-copy/pcm-fam"
            )
        })
        .collect()
}

/// Memory a case needs, bytes: the source region and the FAM file or the socket receive
/// buffer, the target's region, plus 1 GiB for the rest of the worker. FAM post-copy's source
/// gives its pages back as the dump goes and the target reserves what is left, so the source
/// and the target share one region's worth there.
fn case_memory(size: usize, m: &Method) -> u64 {
    let regions = match m {
        Method::Fam { .. } | Method::FamHot { .. } => 2,
        _ => 3,
    };
    regions * size as u64 + (1 << 30)
}

/// The medium's floor for a region of `size` bytes: its time at 2 GB/s (`pcm-fam`), ms.
fn floor_ms(size: usize) -> f64 {
    size as f64 / 2e9 * 1e3
}

/// Parse `256m`, `1g`, `4096k`, or bytes (a multiple of 4 KiB, at least 4 MiB).
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1usize << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (&t[..], 1),
    };
    let n: usize = num
        .parse()
        .with_context(|| format!("{s:?} is not a size (e.g. 256m, 1g)"))?;
    let b = n * mul;
    if b < 4 << 20 || b & 4095 != 0 {
        bail!("region size {s:?} must be a multiple of 4 KiB and at least 4 MiB");
    }
    Ok(b)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One case's medians over its runs.
#[derive(Debug, Clone)]
struct CaseRow {
    workload: String,
    size: usize,
    method: Method,
    downtime_ms: f64,
    busy_ms: f64,
    total_ms: f64,
    degradation: f64,
    steady_ops_per_s: f64,
    during_ops_per_s: f64,
    on_demand: f64,
    from_fam: f64,
    pushed: f64,
    /// Reservation before the freeze (FAM file, target memory), ms: not migration time.
    reserve_ms: f64,
    /// CPU seconds of the system: the case's worker process (synthetic cases) or the source
    /// and target servers after the freeze (kv); median over the runs.
    cpu_s: f64,
    /// Every run's total and busy time, ms, in run order (rep i of every method ran in round
    /// i: methods interleaved).
    totals_ms: Vec<f64>,
    busies_ms: Vec<f64>,
    /// The timeline of the median run (by total time).
    timeline: Vec<tiermem_migrate::harness::Sample>,
}

impl CaseRow {
    fn from_runs(
        workload: &str,
        size: usize,
        method: &Method,
        runs: &[CaseResult],
        cpu_s: &[f64],
    ) -> CaseRow {
        let f = |g: &dyn Fn(&CaseResult) -> f64| median(runs.iter().map(g).collect());
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut by_total: Vec<&CaseResult> = runs.iter().collect();
        by_total.sort_by_key(|r| r.metrics.total_ns);
        CaseRow {
            workload: workload.into(),
            size,
            method: method.clone(),
            downtime_ms: f(&|r| ms(r.metrics.downtime_ns)),
            busy_ms: f(&|r| ms(r.metrics.busy_ns)),
            total_ms: f(&|r| ms(r.metrics.total_ns)),
            degradation: f(&|r| r.degradation),
            steady_ops_per_s: f(&|r| r.steady_ops_per_s),
            during_ops_per_s: f(&|r| r.during_ops_per_s),
            on_demand: f(&|r| r.metrics.pages_on_demand as f64),
            from_fam: f(&|r| r.metrics.faults_from_fam as f64),
            pushed: f(&|r| r.metrics.pages_pushed as f64),
            reserve_ms: f(&|r| ms(r.metrics.reserve_ns)),
            cpu_s: median(cpu_s.to_vec()),
            totals_ms: runs.iter().map(|r| ms(r.metrics.total_ns)).collect(),
            busies_ms: runs.iter().map(|r| ms(r.metrics.busy_ns)).collect(),
            timeline: by_total[by_total.len() / 2].timeline.clone(),
        }
    }

    fn result(&self) -> ResultRow {
        ResultRow {
            workload: self.workload.clone(),
            region_bytes: self.size,
            method: self.method.name(),
            delay: self.method.delay().to_string(),
            expiration_ms: self.method.expiration_ms(),
            downtime_ms: self.downtime_ms,
            busy_ms: self.busy_ms,
            total_ms: self.total_ms,
            total_ms_min: min_max(&self.totals_ms).0,
            total_ms_max: min_max(&self.totals_ms).1,
            busy_ms_min: min_max(&self.busies_ms).0,
            busy_ms_max: min_max(&self.busies_ms).1,
            runs: self.totals_ms.len(),
            degradation: self.degradation,
            steady_ops_per_s: self.steady_ops_per_s,
            during_ops_per_s: self.during_ops_per_s,
            faults_on_demand: self.on_demand,
            faults_from_fam: self.from_fam,
            pages_pushed: self.pushed,
            reserve_ms: self.reserve_ms,
            cpu_s: (self.cpu_s * 1e6).round() / 1e6,
        }
    }
}

/// One case's medians (the JSON `results` entries).
#[derive(Debug, Clone, Serialize)]
pub struct ResultRow {
    pub workload: String,
    pub region_bytes: usize,
    pub method: &'static str,
    pub delay: String,
    pub expiration_ms: Option<u64>,
    pub downtime_ms: f64,
    pub busy_ms: f64,
    pub total_ms: f64,
    /// Smallest and largest total and busy time over the runs (the medians above).
    pub total_ms_min: f64,
    pub total_ms_max: f64,
    pub busy_ms_min: f64,
    pub busy_ms_max: f64,
    /// Runs of the case.
    pub runs: usize,
    pub degradation: f64,
    pub steady_ops_per_s: f64,
    pub during_ops_per_s: f64,
    pub faults_on_demand: f64,
    pub faults_from_fam: f64,
    pub pages_pushed: f64,
    /// Reservation before the freeze (FAM file populated, target memory populated), ms; not
    /// part of any migration time.
    pub reserve_ms: f64,
    /// CPU seconds of the system (see `Report::cpu_method`), to the microsecond.
    pub cpu_s: f64,
}

/// Smallest and largest of `v` (NaN, NaN when empty).
fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::NAN, f64::NAN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// The paper's ratios for one case (the JSON `ratios_by_case` entries).
#[derive(Debug, Clone, Serialize)]
pub struct CaseRatios {
    pub workload: &'static str,
    pub region_bytes: usize,
    pub busy_ratio_socket_over_fam_100ms: f64,
    pub total_gain_fam2gbs_vs_socket10g_0ms_pct: f64,
    /// The total-time gain of each round (FAM's run i against socket's run i, which ran in the
    /// same round), smallest and largest: a sign that flips between rounds shows here.
    pub total_gain_fam2gbs_vs_socket10g_0ms_pct_min: f64,
    pub total_gain_fam2gbs_vs_socket10g_0ms_pct_max: f64,
    pub busy_gain_fam2gbs_vs_socket10g_0ms_pct: f64,
    pub downtime_gain_vs_socket_pct: f64,
    pub busy_ratio_socket_over_fam_100ms_per_cpu: f64,
    pub total_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: f64,
    pub busy_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: f64,
    pub downtime_gain_vs_socket_pct_per_cpu: f64,
}

/// The batching checkpoint against one write per 2 MiB vector (the JSON `batching` entries).
#[derive(Debug, Clone, Serialize)]
pub struct Batching {
    pub delay: &'static str,
    pub region_bytes: usize,
    pub per_vector_ms: f64,
    pub batched_ms: f64,
    pub time_saved_pct: f64,
}

/// On-demand faults with and without the hot-page manifest (the JSON `hot_manifest` entries).
#[derive(Debug, Clone, Serialize)]
pub struct HotManifest {
    pub workload: &'static str,
    pub region_bytes: usize,
    pub faults_on_demand_without: f64,
    pub faults_on_demand_with: f64,
}

/// One region size's scale figures (the JSON `by_size` entries).
#[derive(Debug, Clone, Serialize)]
pub struct SizeRow {
    pub region_bytes: usize,
    /// The medium's floor: region / 2 GB/s, ms.
    pub floor_ms: f64,
    /// FAM (2 GB/s) total time, median over workloads, ms; and over the floor.
    pub fam_total_ms: Option<f64>,
    pub fam_total_over_floor: Option<f64>,
    /// The smallest busy ratio socket(10 Gb/s, 100 ms) / FAM over the workloads.
    pub busy_ratio_socket_over_fam_100ms_min: Option<f64>,
}

/// What `bench migrate` measured; `--json` prints it as is. The headline ratios are the
/// medians of `ratios_by_case`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    pub quick: bool,
    pub reps: usize,
    pub machine: crate::machine::Machine,
    pub isolation: &'static str,
    pub isolation_method: &'static str,
    pub cpu_method: &'static str,
    pub results: Vec<ResultRow>,
    pub ratios_by_case: Vec<CaseRatios>,
    pub batching: Vec<Batching>,
    pub hot_manifest: Vec<HotManifest>,
    pub busy_ratio_socket_over_fam_100ms: f64,
    pub total_gain_fam2gbs_vs_socket10g_0ms_pct: f64,
    pub busy_gain_fam2gbs_vs_socket10g_0ms_pct: f64,
    pub downtime_gain_vs_socket_pct: f64,
    pub busy_ratio_socket_over_fam_100ms_per_cpu: f64,
    pub total_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: f64,
    pub busy_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: f64,
    pub downtime_gain_vs_socket_pct_per_cpu: f64,
    pub kv_throughput_gain_3ms_pct: Option<f64>,
    pub kv_throughput_gain_3ms_pct_per_cpu: Option<f64>,
    /// FAM (2 GB/s) total time at 4 GiB over the medium's floor (4 GiB / 2 GB/s), median
    /// over the workloads run there (with --quick: the uniform probe).
    pub total_over_floor_4g: Option<f64>,
    /// Per size: total over floor of FAM, and the smallest busy ratio socket(100 ms)/FAM over
    /// the workloads (null where socket at 100 ms did not run).
    pub by_size: Vec<SizeRow>,
    /// Cases left out, and why (memory).
    pub skipped: Vec<String>,
    pub timeline_png: Option<String>,
    /// Total and busy time against region size, every method (PNG).
    pub sizes_png: Option<String>,
    /// The rows with their method, for the table.
    #[serde(skip)]
    rows: Vec<CaseRow>,
    /// Why the timeline was not written, if it was not.
    #[serde(skip)]
    pub timeline_error: Option<String>,
}

/// The paper's ratios for one (workload, size), and each with CPU seconds in place of time
/// (`*_per_cpu`: the methods' `cpu_s`; a case's CPU is not split at its milestones, so the
/// busy and total gains per CPU are the same figure).
#[derive(Clone, Copy, Debug, Default)]
struct Ratios {
    busy_ratio_socket_over_fam_100ms: f64,
    total_gain_pct: f64,
    /// Per round (see `CaseRatios`): smallest and largest.
    total_gain_pct_range: (f64, f64),
    busy_gain_pct: f64,
    downtime_gain_pct: f64,
    busy_ratio_socket_over_fam_100ms_per_cpu: f64,
    total_gain_pct_per_cpu: f64,
    busy_gain_pct_per_cpu: f64,
    downtime_gain_pct_per_cpu: f64,
}

fn find<'a>(rows: &'a [CaseRow], w: &str, size: usize, label: &str) -> Option<&'a CaseRow> {
    rows.iter()
        .find(|r| r.workload == w && r.size == size && r.method.label() == label)
}

fn ratios(rows: &[CaseRow], w: &str, size: usize) -> Option<Ratios> {
    let fam = find(rows, w, size, "fam/pcm-fam")?;
    let s100 = find(rows, w, size, "socket/ethernet-10g/100ms")?;
    let s0 = find(rows, w, size, "socket/ethernet-10g/0ms")?;
    let sockets = || {
        rows.iter()
            .filter(move |r| r.workload == w && r.size == size && r.method.name() == "socket")
    };
    let socket_downtime = median(sockets().map(|r| r.downtime_ms).collect());
    let socket_cpu = median(sockets().map(|r| r.cpu_s).collect());
    Some(Ratios {
        busy_ratio_socket_over_fam_100ms: s100.busy_ms / fam.busy_ms,
        total_gain_pct: (1.0 - fam.total_ms / s0.total_ms) * 100.0,
        total_gain_pct_range: min_max(
            &fam.totals_ms
                .iter()
                .zip(&s0.totals_ms)
                .map(|(f, s)| (1.0 - f / s) * 100.0)
                .collect::<Vec<_>>(),
        ),
        busy_gain_pct: (1.0 - fam.busy_ms / s0.busy_ms) * 100.0,
        downtime_gain_pct: (1.0 - fam.downtime_ms / socket_downtime) * 100.0,
        busy_ratio_socket_over_fam_100ms_per_cpu: s100.cpu_s / fam.cpu_s,
        total_gain_pct_per_cpu: (1.0 - fam.cpu_s / s0.cpu_s) * 100.0,
        busy_gain_pct_per_cpu: (1.0 - fam.cpu_s / s0.cpu_s) * 100.0,
        downtime_gain_pct_per_cpu: (1.0 - fam.cpu_s / socket_cpu) * 100.0,
    })
}

/// The one request a `bench migrate-case` worker answers: run this case (a [`CaseSpec`] in
/// plain terms) through `fam`.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct CaseRequest {
    workload: String,
    region_len: usize,
    /// [`Method::name`], its delay and (socket) expiration.
    method: String,
    delay: String,
    expiration_ms: u64,
    steady_ms: u64,
    tail_ms: u64,
    seed: u64,
    id: u64,
    fam: PathBuf,
}

/// A case worker's answer: the [`CaseResult`] and its process's CPU over the case.
#[derive(Serialize, Deserialize, Debug)]
struct CaseReply {
    downtime_ns: u64,
    resume_ns: u64,
    busy_ns: u64,
    total_ns: u64,
    pages_on_demand: u64,
    faults_from_fam: u64,
    pages_pushed: u64,
    bytes: u64,
    /// Reservation before the start (FAM file and target memory populated), ns.
    #[serde(default)]
    reserve_ns: u64,
    steady_ops_per_s: f64,
    during_ops_per_s: f64,
    degradation: f64,
    /// (t_ms, ops_per_s, present) per sample.
    timeline: Vec<(f64, f64, f64)>,
    verified: bool,
    /// CPU seconds of the worker process (every thread, user + system) over `run_case`: the
    /// region's fill, the application's warm-up, steady phase and tail, the migration, and
    /// the check of the target's copy.
    cpu_s: f64,
}

impl CaseReply {
    /// Back to the harness's result, with the method's name.
    fn into_result(self, method: &Method) -> CaseResult {
        CaseResult {
            metrics: Metrics {
                method: method.name().to_string(),
                downtime_ns: self.downtime_ns,
                resume_ns: self.resume_ns,
                busy_ns: self.busy_ns,
                total_ns: self.total_ns,
                pages_on_demand: self.pages_on_demand,
                faults_from_fam: self.faults_from_fam,
                pages_pushed: self.pages_pushed,
                bytes: self.bytes,
                reserve_ns: self.reserve_ns,
            },
            steady_ops_per_s: self.steady_ops_per_s,
            during_ops_per_s: self.during_ops_per_s,
            degradation: self.degradation,
            timeline: self
                .timeline
                .iter()
                .map(|&(t_ms, ops_per_s, present)| Sample {
                    t_ms,
                    ops_per_s,
                    present,
                })
                .collect(),
            verified: self.verified,
        }
    }
}

/// The worker process of one synthetic case run (`tiermem bench migrate-case`, hidden): reads
/// one [`CaseRequest`] from stdin, makes its own two hosts (network namespaces), runs the case
/// in this process alone, answers a [`CaseReply`], and exits at EOF.
pub fn case_worker_main() -> Result<()> {
    worker::serve(|req: CaseRequest| {
        let workload = Workload::parse(&req.workload)
            .with_context(|| format!("unknown workload {:?}", req.workload))?;
        let method = Method::parse(&req.method, &req.delay, req.expiration_ms)
            .map_err(anyhow::Error::msg)?;
        let hosts = TwoHosts::create("tmbench")
            .context("creating the two hosts (network namespaces; needs root and iproute2)")?;
        let spec = CaseSpec {
            workload,
            region_len: req.region_len,
            method,
            steady: Duration::from_millis(req.steady_ms),
            tail: Duration::from_millis(req.tail_ms),
            seed: req.seed,
            id: req.id,
        };
        let c0 = cpu::process_ns();
        let r = run_case(&hosts, &req.fam, &spec).map_err(anyhow::Error::msg)?;
        let cpu_s = cpu::process_ns().saturating_sub(c0) as f64 / 1e9;
        drop(hosts);
        let m = r.metrics;
        Ok(Some(serde_json::to_value(CaseReply {
            downtime_ns: m.downtime_ns,
            resume_ns: m.resume_ns,
            busy_ns: m.busy_ns,
            total_ns: m.total_ns,
            pages_on_demand: m.pages_on_demand,
            faults_from_fam: m.faults_from_fam,
            pages_pushed: m.pages_pushed,
            bytes: m.bytes,
            reserve_ns: m.reserve_ns,
            steady_ops_per_s: r.steady_ops_per_s,
            during_ops_per_s: r.during_ops_per_s,
            degradation: r.degradation,
            timeline: r
                .timeline
                .iter()
                .map(|s| (s.t_ms, s.ops_per_s, s.present))
                .collect(),
            verified: r.verified,
            cpu_s,
        })?))
    })
}

/// Deadline of one case run in its worker.
const CASE_TIMEOUT: Duration = Duration::from_secs(600);

/// Run one case in a fresh worker process; its result and the process's CPU seconds.
fn run_case_in_worker(fam: &std::path::Path, spec: &CaseSpec) -> Result<(CaseResult, f64)> {
    let req = CaseRequest {
        workload: spec.workload.name().to_string(),
        region_len: spec.region_len,
        method: spec.method.name().to_string(),
        delay: spec.method.delay().to_string(),
        expiration_ms: spec.method.expiration_ms().unwrap_or(0),
        steady_ms: spec.steady.as_millis() as u64,
        tail_ms: spec.tail.as_millis() as u64,
        seed: spec.seed,
        id: spec.id,
        fam: fam.to_path_buf(),
    };
    let mut w = Worker::spawn(
        &format!("migrate-case {}", spec.method.label()),
        &["bench".to_string(), "migrate-case".to_string()],
        CASE_TIMEOUT,
        vec![tiermem_migrate::fam::migration_dir(fam, spec.id)],
    )?;
    let reply: CaseReply = w.call(&req, "the case")?;
    w.finish()?;
    let cpu_s = reply.cpu_s;
    Ok((reply.into_result(&spec.method), cpu_s))
}

/// Run the benchmark.
/// `bench migrate`'s options.
pub type Options = MigrateOpts;

/// Run `bench migrate`: every synthetic case in a worker of its own, the batching checkpoint,
/// the live tiermem-kv case (unless `no_kv`) and the timeline chart (`o.timeline`; failing to
/// write it is reported in `Report::timeline_error`, not an error).
pub fn run(o: &Options) -> Result<Report> {
    crate::plot::check_path(&o.timeline)?;
    let quick = o.common.quick;
    let sizes: Vec<usize> = match &o.sizes {
        Some(v) => v.iter().map(|s| parse_size(s)).collect::<Result<_>>()?,
        None if quick => vec![256 << 20],
        None => vec![256 << 20, 1 << 30, 4 << 30, 8 << 30],
    };
    let workloads: Vec<Workload> = match &o.workloads {
        Some(v) => v
            .iter()
            .map(|s| {
                Workload::parse(s).with_context(|| {
                    format!("unknown workload {s:?} (sequential, uniform, zipfian)")
                })
            })
            .collect::<Result<_>>()?,
        None => Workload::ALL.to_vec(),
    };
    // Every case several times (3 with --quick, 5 in the full run), methods interleaved: round
    // i runs every case once, so a machine's slow minute touches every method alike.
    let reps = o.reps.unwrap_or(if quick { 3 } else { 5 }).max(1);
    let methods = methods();
    // The FAM directory must hold the largest region (the lazy file is reserved whole).
    let own_fam = o.fam.is_none();
    let fam = match &o.fam {
        Some(p) => p.clone(),
        None => {
            let p = PathBuf::from(format!(
                "/dev/shm/tiermem-bench-migrate-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
            p
        }
    };
    // Remove a FAM directory of our own whatever happens (errors included).
    struct RemoveOnDrop(Option<PathBuf>);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            if let Some(p) = &self.0 {
                let _ = std::fs::remove_dir_all(p);
            }
        }
    }
    let _fam_guard = RemoveOnDrop(own_fam.then(|| fam.clone()));
    // The cases: every method at every size up to LARGE, the large methods above it; with
    // --quick (one size) also the 4 GiB probe of FAM's total time against the medium's floor,
    // uniform updates, one run. A case whose memory does not fit is left out and said so.
    let mut cases: Vec<(usize, Workload, Method, usize)> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for &size in &sizes {
        let (ms, r) = if size > LARGE {
            (large_methods(), reps.min(3))
        } else {
            (methods.clone(), reps)
        };
        for &w in &workloads {
            for m in &ms {
                cases.push((size, w, m.clone(), r));
            }
        }
    }
    if quick && o.sizes.is_none() {
        cases.push((
            4 << 30,
            Workload::Uniform,
            Method::Fam {
                delay: "pcm-fam".into(),
            },
            1,
        ));
    }
    let avail = tiermem_media::mem_available();
    cases.retain(|(size, w, m, _)| match avail {
        Some(a) if case_memory(*size, m) > a => {
            skipped.push(format!(
                "{} MiB {} {}: needs {:.1} GiB (source, FAM file or receive buffer, target), \
                 {:.1} GiB available",
                size >> 20,
                w.name(),
                m.label(),
                case_memory(*size, m) as f64 / (1u64 << 30) as f64,
                a as f64 / (1u64 << 30) as f64
            ));
            false
        }
        _ => true,
    });
    for sk in &skipped {
        crate::progress::step(&format!("left out: {sk}"));
    }
    let max_reps = cases.iter().map(|c| c.3).max().unwrap_or(0);
    let total_cases: usize = cases.iter().map(|c| c.3).sum();
    crate::progress::plan("bench migrate", Some(total_cases as u64));
    let started = Instant::now();
    let mut done = 0usize;
    let mut rows: Vec<CaseRow> = Vec::new();
    let mut id = (std::process::id() as u64) << 32;
    let mut runs: Vec<Vec<CaseResult>> = cases.iter().map(|_| Vec::new()).collect();
    let mut cpus: Vec<Vec<f64>> = cases.iter().map(|_| Vec::new()).collect();
    for rep in 0..max_reps {
        for (c, (size, w, m, r)) in cases.iter().enumerate() {
            if rep >= *r {
                continue;
            }
            let (size, w) = (*size, *w);
            id += 1;
            let spec = CaseSpec {
                workload: w,
                region_len: size,
                method: m.clone(),
                steady: Duration::from_millis(if quick { 150 } else { 300 }),
                tail: Duration::from_millis(if quick { 50 } else { 100 }),
                seed: id,
                id,
            };
            let (r, cpu_s) = run_case_in_worker(&fam, &spec).map_err(|e| {
                anyhow::anyhow!("{} MiB {} {}: {e:#}", size >> 20, w.name(), m.label())
            })?;
            let _ = std::fs::remove_dir_all(tiermem_migrate::fam::migration_dir(&fam, id));
            done += 1;
            crate::progress::step(&format!(
                "[{done}/{total_cases}, {:.0} s] {} MiB {:<10} {:<26} run {}: downtime \
                 {:.1} ms, busy {:.1} ms, total {:.1} ms, degradation {:.2}, CPU {:.3} s",
                started.elapsed().as_secs_f64(),
                size >> 20,
                w.name(),
                m.label(),
                rep + 1,
                r.metrics.downtime_ns as f64 / 1e6,
                r.metrics.busy_ns as f64 / 1e6,
                r.metrics.total_ns as f64 / 1e6,
                r.degradation,
                cpu_s
            ));
            runs[c].push(r);
            cpus[c].push(cpu_s);
        }
    }
    for (c, (size, w, m, _)) in cases.iter().enumerate() {
        rows.push(CaseRow::from_runs(w.name(), *size, m, &runs[c], &cpus[c]));
    }
    // The batching checkpoint (thesis §3.3.3): one pwritev per batch of vectors against one
    // per 2 MiB vector, the same region, FAM with and without the delay.
    let mut batching = Vec::new();
    for delay in ["none", "pcm-fam"] {
        let d = tiermem_migrate::harness::delay_model(delay).map_err(anyhow::Error::msg)?;
        let (per_vector, batched) = tiermem_migrate::lazyfile::batching_ratio_in(
            &fam,
            sizes[0] as u64,
            d,
            if quick { 3 } else { 5 },
        )
        .context("the batching checkpoint measurement")?;
        crate::progress::step(&format!(
            "[{:.0} s] batching checkpoint, {} MiB, FAM {delay}: one pwritev per 2 MiB \
             vector {:.1} ms, batched {:.1} ms",
            started.elapsed().as_secs_f64(),
            sizes[0] >> 20,
            per_vector * 1e3,
            batched * 1e3
        ));
        batching.push((delay, per_vector, batched));
    }

    // The live tiermem-kv case.
    let mut kv_gain: Option<f64> = None;
    let mut kv_gain_per_cpu: Option<f64> = None;
    if !o.no_kv {
        // The kv servers are processes of their own; the load clients run here.
        let hosts = TwoHosts::create("tmbench")
            .context("creating the two hosts (network namespaces; needs root and iproute2)")?;
        let (heap, heap_bytes, keys, ops_after) = if quick {
            ("256mb", 256usize << 20, 200_000u64, 20_000u64)
        } else {
            ("1gb", 1 << 30, 1_000_000, 100_000)
        };
        let kv_methods = [
            Method::Fam {
                delay: "pcm-fam".into(),
            },
            Method::Socket {
                delay: "ethernet-10g".into(),
                expiration_ms: 3,
            },
            Method::Socket {
                delay: "ethernet-10g".into(),
                expiration_ms: 150,
            },
        ];
        // The kv cases are short and noisy: at least three runs each.
        let kv_reps = reps.max(3);
        for m in &kv_methods {
            let mut runs = Vec::new();
            for rep in 0..kv_reps {
                id += 1;
                let r = crate::migrate_kv::run_kv_case(
                    &hosts,
                    &fam,
                    m,
                    heap,
                    keys,
                    4,
                    Duration::from_millis(300),
                    ops_after,
                    id,
                )
                .with_context(|| format!("tiermem-kv {}", m.label()))?;
                let _ = std::fs::remove_dir_all(tiermem_migrate::fam::migration_dir(&fam, id));
                crate::progress::step(&format!(
                    "[{:.0} s] tiermem-kv {heap} {:<26} run {}: downtime {:.1} ms, busy {:.1} \
                     ms, total {:.1} ms, {} ops after the freeze at {:.0} ops/s (steady {:.0}), \
                     degradation {:.2}, servers' CPU {:.3} s",
                    started.elapsed().as_secs_f64(),
                    m.label(),
                    rep + 1,
                    r.downtime_ms,
                    r.busy_ms,
                    r.total_ms,
                    ops_after,
                    r.after_ops_per_s,
                    r.steady_ops_per_s,
                    r.degradation,
                    r.cpu_s
                ));
                runs.push(r);
            }
            let f = |g: &dyn Fn(&crate::migrate_kv::KvResult) -> f64| {
                median(runs.iter().map(g).collect())
            };
            rows.push(CaseRow {
                workload: "kv".into(),
                size: heap_bytes,
                method: m.clone(),
                downtime_ms: f(&|r| r.downtime_ms),
                busy_ms: f(&|r| r.busy_ms),
                total_ms: f(&|r| r.total_ms),
                degradation: f(&|r| r.degradation),
                steady_ops_per_s: f(&|r| r.steady_ops_per_s),
                during_ops_per_s: f(&|r| r.after_ops_per_s),
                on_demand: f64::NAN,
                from_fam: f64::NAN,
                pushed: f64::NAN,
                reserve_ms: f64::NAN,
                cpu_s: f(&|r| r.cpu_s),
                totals_ms: runs.iter().map(|r| r.total_ms).collect(),
                busies_ms: runs.iter().map(|r| r.busy_ms).collect(),
                timeline: runs[runs.len() / 2]
                    .timeline
                    .iter()
                    .map(|&(t_ms, ops_per_s)| tiermem_migrate::harness::Sample {
                        t_ms,
                        ops_per_s,
                        present: f64::NAN,
                    })
                    .collect(),
            });
        }
        let tput = |label: &str| {
            rows.iter()
                .find(|r| r.workload == "kv" && r.method.label() == label)
                .map(|r| r.during_ops_per_s)
        };
        if let (Some(f), Some(s3)) = (tput("fam/pcm-fam"), tput("socket/ethernet-10g/3ms")) {
            kv_gain = Some((f / s3 - 1.0) * 100.0);
        }
        // The same per second of the servers' CPU: the first ops_after operations after the
        // freeze over the CPU the source and target servers used meanwhile.
        let per_cpu = |label: &str| {
            rows.iter()
                .find(|r| r.workload == "kv" && r.method.label() == label)
                .and_then(|r| cpu::per_cpu(ops_after as f64, r.cpu_s))
        };
        if let (Some(f), Some(s3)) = (per_cpu("fam/pcm-fam"), per_cpu("socket/ethernet-10g/3ms")) {
            kv_gain_per_cpu = Some((f / s3 - 1.0) * 100.0);
        }
        drop(hosts);
    }

    // The paper's ratios: per (workload, size), and their medians as the headline.
    let mut per_case = Vec::new();
    for &size in &sizes {
        for &w in &workloads {
            if let Some(r) = ratios(&rows, w.name(), size) {
                per_case.push((w.name(), size, r));
            }
        }
    }
    let med = |f: &dyn Fn(&Ratios) -> f64| median(per_case.iter().map(|c| f(&c.2)).collect());
    let headline = Ratios {
        busy_ratio_socket_over_fam_100ms: med(&|r| r.busy_ratio_socket_over_fam_100ms),
        total_gain_pct: med(&|r| r.total_gain_pct),
        // Over every case and round.
        total_gain_pct_range: per_case.iter().fold((f64::NAN, f64::NAN), |(lo, hi), c| {
            (
                lo.min(c.2.total_gain_pct_range.0),
                hi.max(c.2.total_gain_pct_range.1),
            )
        }),
        busy_gain_pct: med(&|r| r.busy_gain_pct),
        downtime_gain_pct: med(&|r| r.downtime_gain_pct),
        busy_ratio_socket_over_fam_100ms_per_cpu: med(&|r| {
            r.busy_ratio_socket_over_fam_100ms_per_cpu
        }),
        total_gain_pct_per_cpu: med(&|r| r.total_gain_pct_per_cpu),
        busy_gain_pct_per_cpu: med(&|r| r.busy_gain_pct_per_cpu),
        downtime_gain_pct_per_cpu: med(&|r| r.downtime_gain_pct_per_cpu),
    };

    // The hot-page manifest: the target's on-demand faults (requests to the source) with and
    // without it, FAM at 2 GB/s.
    let mut hot = Vec::new();
    for &size in &sizes {
        for &w in &workloads {
            if let (Some(a), Some(b)) = (
                find(&rows, w.name(), size, "fam/pcm-fam"),
                find(&rows, w.name(), size, "fam+hot/pcm-fam"),
            ) {
                hot.push((w.name(), size, a.on_demand, b.on_demand));
            }
        }
    }

    let timeline_written = write_timeline(&rows, sizes[0], &o.timeline);
    let sizes_path = o.timeline.with_file_name(
        o.timeline
            .file_name()
            .and_then(|n| n.to_str())
            .map_or("migrate-sizes.png".to_string(), |n| {
                n.replacen("timeline", "sizes", 1)
            }),
    );
    let sizes_path = if sizes_path == o.timeline {
        o.timeline.with_file_name("migrate-sizes.png")
    } else {
        sizes_path
    };
    let sizes_written = write_sizes(&rows, &sizes_path);
    let mut all_sizes: Vec<usize> = rows
        .iter()
        .filter(|r| r.workload != "kv")
        .map(|r| r.size)
        .collect();
    all_sizes.sort_unstable();
    all_sizes.dedup();
    let by_size: Vec<SizeRow> = all_sizes
        .iter()
        .map(|&size| {
            let fam: Vec<f64> = rows
                .iter()
                .filter(|r| r.workload != "kv" && r.size == size)
                .filter(|r| r.method.label() == "fam/pcm-fam")
                .map(|r| r.total_ms)
                .collect();
            let fam_total = (!fam.is_empty()).then(|| median(fam));
            let ratios: Vec<f64> = per_case
                .iter()
                .filter(|c| c.1 == size)
                .map(|c| c.2.busy_ratio_socket_over_fam_100ms)
                .filter(|x| x.is_finite())
                .collect();
            SizeRow {
                region_bytes: size,
                floor_ms: floor_ms(size),
                fam_total_ms: fam_total,
                fam_total_over_floor: fam_total.map(|t| t / floor_ms(size)),
                busy_ratio_socket_over_fam_100ms_min: ratios.into_iter().reduce(f64::min),
            }
        })
        .collect();
    let total_over_floor_4g = by_size
        .iter()
        .find(|r| r.region_bytes == 4 << 30)
        .and_then(|r| r.fam_total_over_floor);

    let report = Report {
        benchmark: "migrate",
        quick,
        reps,
        machine: crate::machine::describe(),
        isolation: "one process per system",
        isolation_method: "every run of a synthetic case (application, source, target and \
                the method's threads) in a fresh worker process of its own (this binary, `bench \
                migrate-case`, with its own pair of network namespaces), one after the other; \
                the tiermem-kv case's source and target servers are processes of their own, its \
                load clients run in the benchmark's process for every method alike",
        cpu_method: "cpu_s per row, median over the runs. Synthetic cases: CPU time (user + \
                system, every thread, the process CPU-time clock) of the case's worker process \
                over the whole case: the region's fill, the application's warm-up (50 ms), \
                steady phase and tail, the migration, and the check of the target's copy — all \
                but the migration are the same work for every method. tiermem-kv: CPU time of \
                the source server from the freeze to its exit plus the target server's from its \
                start to the ops_after-th operation after the freeze (/proc/PID/stat, getrusage \
                of the reaped source). *_per_cpu: the headline ratio with cpu_s in place of the \
                time (busy and total gains per CPU are the same figure: a case's CPU is not \
                split at its milestones); kv: of operations per server CPU-second",
        results: rows.iter().map(CaseRow::result).collect(),
        ratios_by_case: per_case
            .iter()
            .map(|&(w, s, r)| CaseRatios {
                workload: w,
                region_bytes: s,
                busy_ratio_socket_over_fam_100ms: r.busy_ratio_socket_over_fam_100ms,
                total_gain_fam2gbs_vs_socket10g_0ms_pct: r.total_gain_pct,
                total_gain_fam2gbs_vs_socket10g_0ms_pct_min: r.total_gain_pct_range.0,
                total_gain_fam2gbs_vs_socket10g_0ms_pct_max: r.total_gain_pct_range.1,
                busy_gain_fam2gbs_vs_socket10g_0ms_pct: r.busy_gain_pct,
                downtime_gain_vs_socket_pct: r.downtime_gain_pct,
                busy_ratio_socket_over_fam_100ms_per_cpu: r
                    .busy_ratio_socket_over_fam_100ms_per_cpu,
                total_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: r.total_gain_pct_per_cpu,
                busy_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: r.busy_gain_pct_per_cpu,
                downtime_gain_vs_socket_pct_per_cpu: r.downtime_gain_pct_per_cpu,
            })
            .collect(),
        batching: batching
            .iter()
            .map(|&(d, pv, b)| Batching {
                delay: d,
                region_bytes: sizes[0],
                per_vector_ms: pv * 1e3,
                batched_ms: b * 1e3,
                time_saved_pct: (1.0 - b / pv) * 100.0,
            })
            .collect(),
        hot_manifest: hot
            .iter()
            .map(|&(w, s, without, with)| HotManifest {
                workload: w,
                region_bytes: s,
                faults_on_demand_without: without,
                faults_on_demand_with: with,
            })
            .collect(),
        busy_ratio_socket_over_fam_100ms: headline.busy_ratio_socket_over_fam_100ms,
        total_gain_fam2gbs_vs_socket10g_0ms_pct: headline.total_gain_pct,
        busy_gain_fam2gbs_vs_socket10g_0ms_pct: headline.busy_gain_pct,
        downtime_gain_vs_socket_pct: headline.downtime_gain_pct,
        busy_ratio_socket_over_fam_100ms_per_cpu: headline.busy_ratio_socket_over_fam_100ms_per_cpu,
        total_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: headline.total_gain_pct_per_cpu,
        busy_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu: headline.busy_gain_pct_per_cpu,
        downtime_gain_vs_socket_pct_per_cpu: headline.downtime_gain_pct_per_cpu,
        kv_throughput_gain_3ms_pct: kv_gain,
        kv_throughput_gain_3ms_pct_per_cpu: kv_gain_per_cpu,
        total_over_floor_4g,
        by_size,
        skipped,
        timeline_png: timeline_written
            .as_ref()
            .ok()
            .map(|p| p.display().to_string()),
        sizes_png: match &sizes_written {
            Ok(p) => Some(p.display().to_string()),
            Err(e) => {
                eprintln!("tiermem bench migrate: the size chart was not written: {e:#}");
                None
            }
        },
        rows,
        timeline_error: timeline_written.as_ref().err().map(|e| format!("{e:#}")),
    };
    if let Some(e) = &report.timeline_error {
        eprintln!("tiermem bench migrate: the timeline chart was not written: {e}");
    }
    Ok(report)
}

impl crate::Report for Report {
    fn print_table(&self) {
        let reps = self.reps;
        let rows = &self.rows;
        println!(
            "tiermem bench migrate — {} run(s) per case, medians; time 0 = freeze (pre-copy: first round)",
            reps
        );
        println!(
            "{:>6} {:<10} {:<26} {:>9} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>8}",
            "MiB",
            "workload",
            "method/delay/expiration",
            "down ms",
            "busy ms",
            "total ms",
            "degr",
            "demand",
            "fromFAM",
            "pushed",
            "CPU s"
        );
        for r in rows {
            println!(
                "{:>6} {:<10} {:<26} {:>9.2} {:>9.1} {:>9.1} {:>6.2} {:>8.0} {:>8.0} {:>8.0} {:>8.3}",
                r.size >> 20,
                r.workload,
                r.method.label(),
                r.downtime_ms,
                r.busy_ms,
                r.total_ms,
                r.degradation,
                r.on_demand,
                r.from_fam,
                r.pushed,
                r.cpu_s
            );
        }
        println!();
        for r in &self.ratios_by_case {
            println!(
                "{:>6} MiB {:<10} busy socket(10G,100ms)/FAM(2GB/s) {:>6.1}×  total gain {:>5.1} %  \
                 busy gain {:>5.1} %  downtime gain {:>5.1} %",
                r.region_bytes >> 20,
                r.workload,
                r.busy_ratio_socket_over_fam_100ms,
                r.total_gain_fam2gbs_vs_socket10g_0ms_pct,
                r.busy_gain_fam2gbs_vs_socket10g_0ms_pct,
                r.downtime_gain_vs_socket_pct
            );
        }
        for x in &self.batching {
            let d = x.delay;
            println!(
                "{:>6} MiB batching checkpoint, FAM {d}: per 2 MiB vector {:.1} ms, batched {:.1} \
                 ms ({:+.1} % time saved; the paper saw 15 %)",
                x.region_bytes >> 20,
                x.per_vector_ms,
                x.batched_ms,
                x.time_saved_pct
            );
        }
        for h in &self.hot_manifest {
            let (without, with) = (h.faults_on_demand_without, h.faults_on_demand_with);
            println!(
                "{:>6} MiB {:<10} hot-page manifest: faults asking the source {without:.0} without, \
                 {with:.0} with",
                h.region_bytes >> 20,
                h.workload
            );
        }
        for z in &self.by_size {
            println!(
                "{:>6} MiB floor {:.0} ms (2 GB/s): FAM total {} ({}× the floor); busy ratio \
                 socket(100 ms)/FAM, smallest over workloads: {}",
                z.region_bytes >> 20,
                z.floor_ms,
                z.fam_total_ms
                    .map_or_else(|| "—".to_string(), |t| format!("{t:.0} ms")),
                z.fam_total_over_floor
                    .map_or_else(|| "—".to_string(), |t| format!("{t:.2}")),
                z.busy_ratio_socket_over_fam_100ms_min
                    .map_or_else(|| "—".to_string(), |t| format!("{t:.1}"))
            );
        }
        for sk in &self.skipped {
            println!("left out: {sk}");
        }
        println!(
            "median: busy_ratio_socket_over_fam_100ms {:.1} (≥ 10), total gain {:.1} % (≥ 15), \
             busy gain {:.1} % (≥ 33), downtime gain {:.1} % (≥ 23)",
            self.busy_ratio_socket_over_fam_100ms,
            self.total_gain_fam2gbs_vs_socket10g_0ms_pct,
            self.busy_gain_fam2gbs_vs_socket10g_0ms_pct,
            self.downtime_gain_vs_socket_pct
        );
        println!(
            "per CPU-second (each method's cpu_s in place of its time): busy ratio {:.2}, total \
             and busy gain {:.1} %, downtime gain {:.1} %",
            self.busy_ratio_socket_over_fam_100ms_per_cpu,
            self.total_gain_fam2gbs_vs_socket10g_0ms_pct_per_cpu,
            self.downtime_gain_vs_socket_pct_per_cpu
        );
        match self.kv_throughput_gain_3ms_pct {
            Some(g) => println!(
                "tiermem-kv throughput during migration (first operations after the freeze), FAM \
                 (2 GB/s) over socket (10 Gb/s, 3 ms expiration): {g:+.1} % (≥ 12); per server \
                 CPU-second {}",
                self.kv_throughput_gain_3ms_pct_per_cpu
                    .map_or_else(|| "—".to_string(), |x| format!("{x:+.1} %"))
            ),
            None => println!("tiermem-kv case not run (--no-kv)"),
        }
        match (&self.timeline_png, &self.timeline_error) {
            (Some(p), _) => println!("timeline: {p}"),
            (None, e) => println!("timeline not written: {}", e.as_deref().unwrap_or("?")),
        }
    }
}

/// One method's curves in a timeline panel: label, colour, throughput, pages present.
type PlotLine = (String, usize, Vec<(f64, f64)>, Vec<(f64, f64)>);

/// The size chart: total time (top) and busy time (bottom) against region size, the median
/// over the workloads, for every method that ran at two sizes or more, with the medium's floor
/// (region / 2 GB/s).
fn write_sizes(rows: &[CaseRow], png: &std::path::Path) -> Result<PathBuf> {
    let mut labels: Vec<String> = Vec::new();
    for r in rows.iter().filter(|r| r.workload != "kv") {
        if !labels.contains(&r.method.label()) {
            labels.push(r.method.label());
        }
    }
    let curve = |label: &str, busy: bool| -> Vec<(f64, f64)> {
        let mut sizes: Vec<usize> = rows
            .iter()
            .filter(|r| r.workload != "kv" && r.method.label() == label)
            .map(|r| r.size)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
            .iter()
            .map(|&z| {
                let v: Vec<f64> = rows
                    .iter()
                    .filter(|r| r.workload != "kv" && r.size == z && r.method.label() == label)
                    .map(|r| if busy { r.busy_ms } else { r.total_ms })
                    .collect();
                (z as f64 / (1u64 << 30) as f64, median(v) / 1e3)
            })
            .collect()
    };
    let mut lines: Vec<PlotLine> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (l.clone(), i, curve(l, false), curve(l, true)))
        .filter(|l| l.2.len() >= 2)
        .collect();
    if lines.is_empty() {
        bail!("no method ran at two sizes or more");
    }
    let xs: Vec<f64> = lines.iter().flat_map(|l| l.2.iter().map(|p| p.0)).collect();
    let floor: Vec<(f64, f64)> = xs
        .iter()
        .map(|&x| (x, floor_ms((x * (1u64 << 30) as f64) as usize) / 1e3))
        .collect();
    let mut floor = floor;
    floor.sort_by(|a, b| a.0.total_cmp(&b.0));
    floor.dedup_by(|a, b| a.0 == b.0);
    lines.push((
        "medium floor (2 GB/s)".into(),
        labels.len(),
        floor.clone(),
        floor,
    ));
    let y_max = |busy: bool| {
        lines
            .iter()
            .flat_map(|l| if busy { &l.3 } else { &l.2 }.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            * 1.05
    };
    let panel = |busy: bool| plot::AxisPanel {
        panel: plot::Panel {
            title: if busy {
                "busy time (the source's work)"
            } else {
                "total migration time (every page at the target)"
            },
            lines: lines
                .iter()
                .map(|l| plot::Line {
                    label: &l.0,
                    color: l.1,
                    dashed: l.0.starts_with("medium"),
                    points: if busy { &l.3 } else { &l.2 },
                })
                .collect(),
        },
        y_label: "seconds",
        y_max: y_max(busy).max(1e-3),
    };
    plot::timeline_axes(
        png,
        "Migration time against region size (median over the workloads)",
        "region size, GiB",
        &[panel(false), panel(true)],
    )?;
    Ok(png.to_path_buf())
}

/// The timeline chart: for each workload at `size`, application throughput (relative to its
/// steady state) and the fraction of the region present at the target, over time, for the
/// methods worth comparing.
fn write_timeline(rows: &[CaseRow], size: usize, png: &std::path::Path) -> Result<PathBuf> {
    let shown = [
        "fam/pcm-fam",
        "socket/ethernet-10g/0ms",
        "socket/ethernet-10g/100ms",
        "stop-and-copy/pcm-fam",
        "pre-copy/pcm-fam",
        "socket/ethernet-10g/3ms",
        "socket/ethernet-10g/150ms",
    ];
    let mut data: Vec<(String, Vec<PlotLine>)> = Vec::new();
    let names = Workload::ALL.iter().map(|w| w.name()).chain(["kv"]);
    for w in names {
        let mut lines = Vec::new();
        for (ci, label) in shown.iter().enumerate() {
            // Synthetic panels: the first five methods; the kv panel: FAM and socket at 3 and
            // 150 ms (the paper's Fig. 8).
            if (w == "kv") != (ci == 0 || ci >= 5) && !(w != "kv" && ci == 0) {
                continue;
            }
            let r = if w == "kv" {
                rows.iter()
                    .find(|r| r.workload == "kv" && r.method.label() == *label)
            } else {
                find(rows, w, size, label)
            };
            let Some(r) = r else {
                continue;
            };
            let steady = r.steady_ops_per_s.max(1.0);
            let tput = r
                .timeline
                .iter()
                .map(|s| (s.t_ms, s.ops_per_s / steady))
                .collect();
            let present = r
                .timeline
                .iter()
                .filter(|s| !s.present.is_nan())
                .map(|s| (s.t_ms, s.present))
                .collect();
            lines.push((label.to_string(), ci, tput, present));
        }
        if !lines.is_empty() {
            data.push((w.to_string(), lines));
        }
    }
    if data.is_empty() {
        bail!("no case to plot");
    }
    let labels: Vec<Vec<(String, String)>> = data
        .iter()
        .map(|(_, ls)| {
            ls.iter()
                .map(|(l, ..)| (format!("{l} throughput"), format!("{l} present")))
                .collect()
        })
        .collect();
    let titles: Vec<String> = data
        .iter()
        .map(|(w, _)| {
            if w == "kv" {
                "tiermem-kv under YCSB-A-like load (clients reconnect to the target)".to_string()
            } else {
                format!("{w} updates, {} MiB region", size >> 20)
            }
        })
        .collect();
    let panels: Vec<plot::Panel<'_>> = data
        .iter()
        .enumerate()
        .map(|(pi, (_, ls))| plot::Panel {
            title: &titles[pi],
            lines: ls
                .iter()
                .enumerate()
                .flat_map(|(li, (_, ci, tput, present))| {
                    let mut v = vec![plot::Line {
                        label: &labels[pi][li].0,
                        color: *ci,
                        dashed: false,
                        points: tput,
                    }];
                    if !present.is_empty() {
                        v.push(plot::Line {
                            label: &labels[pi][li].1,
                            color: *ci,
                            dashed: true,
                            points: present,
                        });
                    }
                    v
                })
                .collect(),
        })
        .collect();
    let title = "Migration timeline: application throughput / steady state (solid), fraction of the region at the target (dashed)";
    let (x_label, y_label) = ("ms since the migration started", "relative");
    plot::timeline(png, title, x_label, y_label, 1.2, &panels)?;
    plot::timeline(
        &png.with_extension("svg"),
        title,
        x_label,
        y_label,
        1.2,
        &panels,
    )?;
    Ok(png.to_path_buf())
}
