//! `tiermem bench kv`: tiermem-kv against Redis, driven by the same unmodified clients
//! (`redis-benchmark`, YCSB 0.17.0 over Jedis), every system in one run, on one machine, with one
//! storage directory.
//!
//! Systems (each started fresh, on an empty storage directory, for every measurement):
//! * **tiermem-kv-vnvm** — `tiermem kv serve --engine vnvm --new --dir D --port P --durability pipeline`
//!   (this same binary, `current_exe`): every acknowledged write is durable;
//! * **tiermem-kv-volatile** — `tiermem kv serve --engine volatile --dir D --port P`;
//! * **redis-aof-always** — `redis-server` 7 with `appendonly yes`, `appendfsync always`,
//!   `save ""`, `dir D`;
//! * **redis-aof-everysec** — the same with `appendfsync everysec` (up to a second of
//!   acknowledged writes lost on a crash).
//!
//! `TIERMEM_BENCH_KV_SERVE_ARGS` (whitespace-separated) is appended to both `tiermem kv serve`
//! command lines (e.g. a heap size). tiermem-kv is stopped with SIGTERM, redis with
//! `SHUTDOWN NOSAVE`; a server still running 10 s later is killed and a warning reported.
//!
//! Workloads, per system and repetition (the redis-benchmark ones at least 5 times, so the
//! durable ratios are medians of at least 5 interleaved runs even with `--quick`):
//! * **redis-benchmark-set / -get** — `redis-benchmark -t set,get -P 16 -n N -q --csv` (50
//!   clients, 3-byte values, one key: redis-benchmark's defaults); ops/s is its requests/s,
//!   p99 its `p99_latency_ms` (per request, pipelined) in µs; one server for both tests;
//! * **disk-set-c50 / disk-set-p16** — the durable systems only (tiermem-kv-vnvm,
//!   redis-aof-always), their data under `--disk-dir` (default /var/tmp, a disk file system
//!   here): `redis-benchmark -t set -c 50` without pipelining (`--disk-requests`, 400 000;
//!   200 000 with `--quick`), then with -P 16. A durable write there costs a device flush.
//! * **ycsb-a / ycsb-b** — YCSB core workloads A (50 % read, 50 % update) and B (95 % read, 5 %
//!   update), zipfian, 1 KB records (10 fields × 100 bytes); a fresh server is loaded once
//!   (`ycsb.sh load`, not reported in `results` but in `ycsb_load`), then A runs, then B runs on
//!   the same data. ops/s is YCSB's `[OVERALL] Throughput(ops/sec)`; p99 is the 99th percentile of
//!   every operation of the run, reads and updates merged (nearest rank over YCSB's raw
//!   per-operation samples, `measurementtype=hdrhistogram+raw`); the per-type p99s of YCSB's
//!   HdrHistogram are in `details`.
//!
//! Sizes (flags override each): 100 000 YCSB records, 200 000 operations per YCSB run, 2 000 000
//! redis-benchmark requests per test, 3 repetitions; `--quick`: 20 000, 100 000, 1 000 000, 1.
//! A redis-benchmark run lasts at least about a second (0.2 s runs, the earlier `--quick`
//! size, moved by ±20 % from run to run with the VM's scheduling, for either server).
//! YCSB runs 2 client threads (one connection each): on this project's 2-core machines, where
//! client and server share the cores, redis' throughput grows from 1 to 2 threads (~22k to ~26k
//! ops/s on workload A) and not beyond, while its p99 grows from ~0.2 ms to 1-4 ms at 4 and 8.
//!
//! Repetitions (3; 1 with `--quick`) run the systems in rotating order; each reported number is
//! the median over the repetitions, ops/s and p99 taken separately. A system that fails (does not
//! start, errors on a client operation) is reported in `errors`, skipped for the remaining
//! repetitions and left out of `results`; the others go on, and the command exits non-zero at the
//! end. Servers are killed and the storage directory removed however the run ends (drop guards;
//! SIGINT/SIGTERM are caught for that; servers and clients also die with this process).

use crate::cpu;
use crate::kv_harness::{
    self as h, BenchRow, RedisBenchmark, Server, Stop, Ycsb, YcsbReport, YcsbWorkload,
};
use crate::machine;
use crate::stats::percentile;
use crate::{progress, BenchOpts};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The systems, in the order of the table (and of the first repetition).
pub const SYSTEMS: [&str; 4] = [
    "tiermem-kv-vnvm",
    "tiermem-kv-volatile",
    "redis-aof-always",
    "redis-aof-everysec",
];
/// The workloads, in the order of the table. The two `disk-` ones run only the durable
/// systems (tiermem-kv-vnvm, redis-aof-always), with their data under `--disk-dir`.
pub const WORKLOADS: [&str; 7] = [
    "redis-benchmark-set",
    "redis-benchmark-get",
    "redis-benchmark-set-new-keys",
    "ycsb-a",
    "ycsb-b",
    "disk-set-c50",
    "disk-set-p16",
];
/// Runs behind each redis-benchmark median (tmpfs and disk) whatever `--repetitions` says: the
/// durable ratios are medians of at least this many interleaved runs. Five, not three: on this
/// 2-vCPU VM a pipelined redis-benchmark run lands in one of two modes ~15 % apart (both servers
/// alike: 1.15-1.25 or 1.40-1.50 M GET/s), and a median of three flipped the GET ratio.
const RATIO_RUNS: usize = 5;
/// redis-benchmark's `-r` for the SET of new keys.
const NEW_KEYS: u64 = 100_000_000;
/// The systems the disk workloads run.
const DURABLE: [&str; 2] = ["tiermem-kv-vnvm", "redis-aof-always"];
/// Environment variable: extra arguments for `tiermem kv serve`.
const SERVE_ARGS_ENV: &str = "TIERMEM_BENCH_KV_SERVE_ARGS";
/// Environment variable: the storage directory (the `--dir` flag wins).
const DIR_ENV: &str = "TIERMEM_BENCH_KV_DIR";
/// `--disk-dir`'s default: on the root file system (a disk), not tmpfs.
const DEFAULT_DISK_DIR: &str = "/var/tmp/tiermem-kv-bench-disk";
/// How long a server may take to answer PING after it is spawned.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit once asked to.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// `tiermem bench kv` options.
#[derive(Args, Clone)]
pub struct KvOpts {
    #[command(flatten)]
    pub bench: BenchOpts,
    /// Storage directory for the servers' data (created, emptied before each start, removed at
    /// the end). Default: $TIERMEM_BENCH_KV_DIR, else $TIERMEM_DIR/kv-bench
    /// (/dev/shm/tiermem/kv-bench).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Only these systems, comma-separated (tiermem-kv-vnvm, tiermem-kv-volatile,
    /// redis-aof-always, redis-aof-everysec). Default: all four.
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub systems: Vec<String>,
    /// YCSB records loaded (default 100000; 20000 with --quick).
    #[arg(long, value_name = "N")]
    pub records: Option<u64>,
    /// YCSB operations per workload run (default 200000; 100000 with --quick).
    #[arg(long, value_name = "N")]
    pub ops: Option<u64>,
    /// redis-benchmark requests per test (default 2000000; 1000000 with --quick).
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,
    /// YCSB client threads, one connection each (default 2: on 2 cores, throughput stops
    /// growing past 2 while p99 grows ten-fold).
    #[arg(long, value_name = "N")]
    pub threads: Option<u32>,
    /// Repetitions, systems in rotating order, medians reported (default 3; 1 with --quick).
    /// The redis-benchmark workloads (tmpfs and disk) run at least 5 times regardless.
    #[arg(long, value_name = "N")]
    pub repetitions: Option<usize>,
    /// Directory on a disk file system for the disk workloads (`disk-set-c50`: redis-benchmark
    /// SET with 50 clients, no pipelining; `disk-set-p16`: with -P 16), both durable systems'
    /// data there. Default: /var/tmp/tiermem-kv-bench-disk (created and removed).
    #[arg(long, value_name = "DIR")]
    pub disk_dir: Option<PathBuf>,
    /// redis-benchmark requests per disk run without pipelining (default 400000; 200000 with
    /// --quick); with -P 16 the tmpfs runs' count.
    #[arg(long, value_name = "N")]
    pub disk_requests: Option<u64>,
}

/// How a system's server is run.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Tiermem {
        engine: &'static str,
        durability: Option<&'static str>,
    },
    Redis {
        appendfsync: &'static str,
    },
}

#[derive(Clone, Copy, Debug)]
struct System {
    name: &'static str,
    kind: Kind,
}

fn system(name: &str) -> Option<System> {
    let kind = match name {
        "tiermem-kv-vnvm" => Kind::Tiermem {
            engine: "vnvm",
            durability: Some("pipeline"),
        },
        "tiermem-kv-volatile" => Kind::Tiermem {
            engine: "volatile",
            durability: None,
        },
        "redis-aof-always" => Kind::Redis {
            appendfsync: "always",
        },
        "redis-aof-everysec" => Kind::Redis {
            appendfsync: "everysec",
        },
        _ => return None,
    };
    let name = SYSTEMS.into_iter().find(|s| *s == name)?;
    Some(System { name, kind })
}

impl System {
    fn command(&self, port: u16, dir: &Path) -> Result<Command> {
        Ok(match self.kind {
            Kind::Tiermem { engine, durability } => {
                let exe = std::env::current_exe().context("locating the tiermem binary")?;
                let mut c = Command::new(exe);
                // Every run starts on a fresh, empty directory (`start`).
                c.args(["kv", "serve", "--engine", engine, "--new", "--dir"])
                    .arg(dir)
                    .args(["--port", &port.to_string()]);
                if let Some(d) = durability {
                    c.args(["--durability", d]);
                }
                c.args(serve_args());
                c
            }
            Kind::Redis { appendfsync } => h::redis_server_command(port, dir, appendfsync),
        })
    }

    fn stop(&self) -> Stop<'static> {
        match self.kind {
            Kind::Tiermem { .. } => Stop::Signal(libc::SIGTERM),
            Kind::Redis { .. } => Stop::Command(&["SHUTDOWN", "NOSAVE"]),
        }
    }

    /// The command line with placeholders, for the report.
    fn describe(&self) -> String {
        let dir = Path::new("DIR");
        match self.command(0, dir) {
            Ok(c) => {
                let mut s = match self.kind {
                    Kind::Tiermem { .. } => "tiermem".to_string(),
                    Kind::Redis { .. } => c.get_program().to_string_lossy().into_owned(),
                };
                for a in c.get_args() {
                    let a = a.to_string_lossy();
                    s.push(' ');
                    if a == "0" {
                        s.push('P');
                    } else if a.is_empty() {
                        s.push_str("\"\"");
                    } else {
                        s.push_str(&a);
                    }
                }
                s
            }
            Err(e) => format!("({e})"),
        }
    }
}

fn serve_args() -> Vec<String> {
    std::env::var(SERVE_ARGS_ENV)
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// One client run of one workload on one system: what the medians are taken over.
struct Run {
    system: &'static str,
    workload: &'static str,
    rep: usize,
    ops_per_s: f64,
    p99_us: f64,
    /// The server's CPU seconds during the run (NaN if unreadable).
    cpu_s: f64,
    /// The operations the run did (for operations per CPU-second).
    ops: f64,
    redis_benchmark: Option<BenchRow>,
    ycsb: Option<YcsbReport>,
}

/// A result row: the JSON `results` entries.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub system: &'static str,
    pub workload: &'static str,
    pub ops_per_s: f64,
    pub p99_us: f64,
    /// The server's CPU seconds for the workload's operations (median over the repetitions).
    pub server_cpu_s: f64,
    /// Operations per second of server CPU (median over the repetitions).
    pub ops_per_cpu_s: f64,
}

/// One repetition's numbers for one (system, workload), with the per-operation detail.
#[derive(Clone, Debug, Serialize)]
pub struct Detail {
    pub system: &'static str,
    pub workload: &'static str,
    pub repetition: usize,
    pub ops_per_s: f64,
    pub p99_us: f64,
    /// The server's CPU seconds during this run.
    pub server_cpu_s: f64,
    /// redis-benchmark's row, for its workloads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_benchmark: Option<BenchRow>,
    /// YCSB's report, for its workloads (and the load).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ycsb: Option<YcsbReport>,
}

/// How the figures were measured.
#[derive(Serialize)]
pub struct Method {
    pub ops_per_s: &'static str,
    pub server_cpu_s: &'static str,
    pub p99_us: &'static str,
    pub statistic: &'static str,
    pub order: &'static str,
    pub servers: &'static str,
}

/// YCSB's parameters.
#[derive(Serialize)]
pub struct YcsbParams {
    pub records: u64,
    pub operations: u64,
    pub threads: u32,
    pub fields: u32,
    pub field_bytes: u32,
    pub request_distribution: &'static str,
    pub workload_a: &'static str,
    pub workload_b: &'static str,
    pub binding: &'static str,
    pub jars: String,
}

/// The run's parameters.
#[derive(Serialize)]
pub struct Params {
    pub quick: bool,
    pub repetitions: usize,
    pub redis_benchmark: RedisBenchmark,
    pub redis_benchmark_defaults: &'static str,
    pub ycsb: YcsbParams,
}

/// How one system's server was run.
#[derive(Serialize)]
pub struct SystemInfo {
    pub name: &'static str,
    pub command: String,
    pub stop: String,
    pub status: String,
}

/// Where the servers' data lived.
#[derive(Serialize)]
pub struct Storage {
    pub dir: String,
    pub filesystem: String,
    pub note: &'static str,
    /// The disk workloads' directory and its file system.
    pub disk_dir: String,
    pub disk_filesystem: String,
}

/// The versions of everything measured.
#[derive(Serialize)]
pub struct Versions {
    pub tiermem: &'static str,
    pub redis_server: String,
    pub redis_benchmark: String,
    pub java: String,
    pub ycsb_core: String,
    pub jedis: String,
}

/// What `bench kv` measured; `--json` prints it as is.
#[derive(Serialize)]
pub struct Report {
    pub results: Vec<Row>,
    /// tiermem-kv-vnvm over redis-aof-always, redis-benchmark -P 16 SET ops/s on the storage
    /// directory (tmpfs by default): medians of at least 5 interleaved runs each.
    pub durable_over_redis_always_set_p16: Option<f64>,
    /// The same for GET.
    pub durable_over_redis_always_get_p16: Option<f64>,
    /// The same for SET of new keys (`redis-benchmark -r 100000000`: an insert per request).
    pub durable_over_redis_always_set_p16_new_keys: Option<f64>,
    /// tiermem-kv-vnvm over redis-aof-always, SET ops/s with both servers' data on the disk
    /// file system of `--disk-dir`: 50 clients without pipelining, and with -P 16.
    pub disk_durable_over_redis_always_set_c50: Option<f64>,
    pub disk_durable_over_redis_always_set_p16: Option<f64>,
    /// tiermem-kv-vnvm ycsb-b ops/s over tiermem-kv-volatile's.
    pub durable_over_volatile_ycsb_b: Option<f64>,
    /// tiermem-kv-vnvm ycsb-a ops/s over redis-aof-always'.
    pub durable_over_redis_always_ycsb_a: Option<f64>,
    /// tiermem-kv-vnvm ycsb-a ops/s over redis-aof-everysec'.
    pub durable_over_redis_everysec_ycsb_a: Option<f64>,
    /// The same three ratios per second of server CPU (`ops_per_cpu_s`).
    pub durable_over_volatile_ycsb_b_per_cpu: Option<f64>,
    pub durable_over_redis_always_ycsb_a_per_cpu: Option<f64>,
    pub durable_over_redis_everysec_ycsb_a_per_cpu: Option<f64>,
    /// Systems that failed: name -> what went wrong.
    pub errors: BTreeMap<&'static str, String>,
    pub warnings: Vec<String>,
    pub systems: Vec<SystemInfo>,
    pub method: Method,
    pub parameters: Params,
    pub storage: Storage,
    pub versions: Versions,
    pub machine: machine::Machine,
    /// YCSB load phase per system and repetition (ops/s, and its insert p99 from YCSB's
    /// HdrHistogram).
    pub ycsb_load: Vec<Detail>,
    pub details: Vec<Detail>,
    pub seconds: f64,
    /// The systems run, in the table's order.
    #[serde(skip)]
    systems_run: Vec<System>,
    /// Where the chart was written, for the table.
    #[serde(skip)]
    pub plot_path: Option<PathBuf>,
}

/// Removes the run's working directory (and the storage root, if this run created it and it is
/// empty) when dropped.
struct Cleanup {
    work: PathBuf,
    root_created: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
        if let Some(root) = &self.root_created {
            let _ = std::fs::remove_dir(root);
        }
    }
}

fn storage_root(o: &KvOpts) -> PathBuf {
    if let Some(d) = &o.dir {
        return d.clone();
    }
    if let Some(d) = std::env::var_os(DIR_ENV) {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("TIERMEM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm/tiermem"));
    base.join("kv-bench")
}

/// Empty `dir` (create it if needed).
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Start `sys` on a fresh storage directory; retries twice with another port if the chosen one
/// was taken in the meantime.
fn start(sys: &System, data: &Path, logs: &Path, tag: &str) -> Result<Server> {
    let mut last = None;
    for attempt in 0..3 {
        fresh_dir(data)?;
        let port = h::free_port()?;
        let log = logs.join(format!("{}-{tag}-{attempt}.log", sys.name));
        match Server::start(
            sys.name,
            sys.command(port, data)?,
            port,
            &log,
            START_TIMEOUT,
        ) {
            Ok(s) => return Ok(s),
            Err(e) => {
                let taken = format!("{e:#}").contains("in use");
                last = Some(e);
                if !taken {
                    break;
                }
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Stop the server; a warning if it had to be killed.
fn stop(sys: &System, server: Server, warnings: &mut Vec<String>) -> Result<()> {
    let log = server.log().to_path_buf();
    let (status, clean) = server.stop(sys.stop(), STOP_TIMEOUT)?;
    if !clean {
        warnings.push(format!(
            "{}: still running {} s after {:?}, killed ({status}); log: {}",
            sys.name,
            STOP_TIMEOUT.as_secs(),
            sys.stop(),
            h::log_tail(&log, 5)
        ));
    }
    Ok(())
}

struct Config {
    rb: RedisBenchmark,
    records: u64,
    ops: u64,
    threads: u32,
    json: bool,
    /// Requests of a disk run without pipelining.
    disk_requests: u64,
}

/// The server's CPU seconds so far (NaN if it cannot be read).
fn cpu_of(server: &Server) -> f64 {
    server
        .pid()
        .and_then(cpu::process_cpu_s)
        .unwrap_or(f64::NAN)
}

/// A client's error, with the end of the server's log (which may say why).
fn with_log(e: anyhow::Error, s: &Server) -> anyhow::Error {
    anyhow!("{e:#} (server log: {})", h::log_tail(s.log(), 5))
}

/// redis-benchmark on a fresh server of `sys` in `data`: one client run per `(workload, test,
/// pipeline, requests)`, so that each run's server CPU is its own.
#[allow(clippy::too_many_arguments)]
fn measure_rb(
    sys: &System,
    cfg: &Config,
    runs: &[(&'static str, &str, u32, u64, Option<u64>)],
    data: &Path,
    logs: &Path,
    rep: usize,
    tag: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<Run>> {
    let say = |m: &str| progress(cfg.json, &format!("[{}] {}: {m}", rep + 1, sys.name));
    let server = start(sys, data, logs, &format!("r{rep}-{tag}"))?;
    let mut out = Vec::new();
    for &(workload, test, pipeline, requests, keyspace) in runs {
        let one = RedisBenchmark {
            tests: vec![test.to_string()],
            pipeline,
            requests,
            keyspace,
        };
        say(&format!(
            "{workload}: redis-benchmark -t {test} -P {pipeline} -n {requests} ({})",
            data.display()
        ));
        let c0 = cpu_of(&server);
        let rows = one
            .run(server.port(), logs, Duration::from_secs(300))
            .map_err(|e| with_log(e, &server))?;
        let cpu_s = cpu_of(&server) - c0;
        let row = rows
            .into_iter()
            .find(|r| r.test.eq_ignore_ascii_case(test))
            .ok_or_else(|| anyhow!("redis-benchmark printed no {test} row"))?;
        say(&format!(
            "{workload}: {:.0}/s (p99 {} µs)",
            row.rps, row.p99_us
        ));
        out.push(Run {
            system: sys.name,
            workload,
            rep,
            ops_per_s: row.rps,
            p99_us: row.p99_us,
            cpu_s,
            ops: requests as f64,
            redis_benchmark: Some(row),
            ycsb: None,
        });
    }
    stop(sys, server, warnings)?;
    fresh_dir(data)?;
    Ok(out)
}

/// YCSB on a fresh server of `sys`: load, workload a, workload b on the same data. Returns the
/// load (as a run of workload `ycsb-load`) and the two workload runs.
fn measure_ycsb(
    sys: &System,
    cfg: &Config,
    ycsb: &Ycsb,
    data: &Path,
    logs: &Path,
    rep: usize,
    warnings: &mut Vec<String>,
) -> Result<(Run, Vec<Run>)> {
    let say = |m: &str| progress(cfg.json, &format!("[{}] {}: {m}", rep + 1, sys.name));
    let server = start(sys, data, logs, &format!("r{rep}-ycsb"))?;
    let mut w = YcsbWorkload {
        port: server.port(),
        workload: "a".into(),
        threads: cfg.threads,
        records: cfg.records,
        ops: cfg.ops,
        ..Default::default()
    };
    say(&format!("YCSB load, {} records", cfg.records));
    let c0 = cpu_of(&server);
    let load = ycsb.load(&w, logs).map_err(|e| with_log(e, &server))?;
    let c1 = cpu_of(&server);
    say(&format!(
        "YCSB load {:.0} ops/s; workload a",
        load.throughput
    ));
    let a = ycsb.run(&w, logs).map_err(|e| with_log(e, &server))?;
    let c2 = cpu_of(&server);
    say(&format!(
        "ycsb-a {:.0} ops/s, p99 {} µs; workload b",
        a.throughput,
        a.merged_p99_us.unwrap_or(f64::NAN)
    ));
    w.workload = "b".into();
    let b = ycsb.run(&w, logs).map_err(|e| with_log(e, &server))?;
    let c3 = cpu_of(&server);
    say(&format!(
        "ycsb-b {:.0} ops/s, p99 {} µs",
        b.throughput,
        b.merged_p99_us.unwrap_or(f64::NAN)
    ));
    stop(sys, server, warnings)?;
    fresh_dir(data)?;
    let run = |workload, r: YcsbReport, cpu_s, ops| Run {
        system: sys.name,
        workload,
        rep,
        ops_per_s: r.throughput,
        p99_us: if workload == "ycsb-load" {
            r.max_op_p99_us().unwrap_or(f64::NAN)
        } else {
            r.merged_p99_us.unwrap_or(f64::NAN)
        },
        cpu_s,
        ops,
        redis_benchmark: None,
        ycsb: Some(r),
    };
    Ok((
        run("ycsb-load", load, c1 - c0, cfg.records as f64),
        vec![
            run("ycsb-a", a, c2 - c1, cfg.ops as f64),
            run("ycsb-b", b, c3 - c2, cfg.ops as f64),
        ],
    ))
}

fn first_line_of(cmd: &str, args: &[&str]) -> String {
    match Command::new(cmd).args(args).output() {
        Ok(o) => {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(e) => format!("unavailable: {e}"),
    }
}

/// The version in a jar's file name in `lib` (`jedis-5.2.0.jar` -> `5.2.0`).
fn jar_version(lib: &Path, stem: &str) -> String {
    let prefix = format!("{stem}-");
    std::fs::read_dir(lib)
        .ok()
        .and_then(|d| {
            d.flatten().find_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.strip_prefix(&prefix)?
                    .strip_suffix(".jar")
                    .map(String::from)
            })
        })
        .unwrap_or_else(|| "?".into())
}

fn filesystem(dir: &Path) -> String {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return "?".into();
    };
    // SAFETY: statfs fills a plain-data struct from a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "?".into();
    }
    match st.f_type {
        0x0102_1994 => "tmpfs".into(),
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        t => format!("0x{t:x}"),
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `bench kv`'s options.
pub type Options = KvOpts;

/// Run the benchmark: every system, every repetition, and the chart to `o.bench.plot` when
/// set. A system that fails is recorded in `Report::errors` (see [`crate::Report::outcome`]).
pub fn run(o: &Options) -> Result<Report> {
    if let Some(p) = &o.bench.plot {
        crate::plot::check_path(p)?;
    }
    let t0 = Instant::now();
    let quick = o.bench.quick;
    let json = o.bench.json;
    let systems: Vec<System> = if o.systems.is_empty() {
        SYSTEMS.iter().filter_map(|n| system(n)).collect()
    } else {
        o.systems
            .iter()
            .map(|n| {
                system(n).ok_or_else(|| {
                    anyhow!(
                        "--systems: unknown system {n:?} (known: {})",
                        SYSTEMS.join(", ")
                    )
                })
            })
            .collect::<Result<_>>()?
    };
    let reps = o.repetitions.unwrap_or(if quick { 1 } else { 3 });
    if reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    let cfg = Config {
        rb: RedisBenchmark {
            tests: vec!["set".into(), "get".into()],
            pipeline: 16,
            requests: o
                .requests
                .unwrap_or(if quick { 1_000_000 } else { 2_000_000 }),
            keyspace: None,
        },
        records: o.records.unwrap_or(if quick { 20_000 } else { 100_000 }),
        ops: o.ops.unwrap_or(if quick { 100_000 } else { 200_000 }),
        threads: o.threads.unwrap_or(2),
        json,
        disk_requests: o
            .disk_requests
            .unwrap_or(if quick { 200_000 } else { 400_000 }),
    };
    if cfg.records == 0
        || cfg.ops == 0
        || cfg.rb.requests == 0
        || cfg.threads == 0
        || cfg.disk_requests == 0
    {
        bail!("--records, --ops, --requests, --disk-requests and --threads must be at least 1");
    }

    // The clients every system needs: fail early, before any server starts.
    if Command::new("redis-benchmark")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!(
            "redis-benchmark not found on PATH: install the Debian package redis-tools \
             (scripts/setup.sh does)"
        );
    }
    let ycsb = Ycsb::locate()?;
    progress(
        json,
        "YCSB binding: checking the build (Maven, first time only)",
    );
    ycsb.build()?;

    let root = storage_root(o);
    let root_created = (!root.exists()).then(|| root.clone());
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let work = root.join(format!("run-{}", std::process::id()));
    let _cleanup = Cleanup {
        work: work.clone(),
        root_created,
    };
    let (data, logs) = (work.join("data"), work.join("logs"));
    // The disk runs' directory, on its own file system (removed at the end like `work`).
    let disk_root = o
        .disk_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DISK_DIR));
    let disk_root_created = (!disk_root.exists()).then(|| disk_root.clone());
    std::fs::create_dir_all(&disk_root)
        .with_context(|| format!("creating {}", disk_root.display()))?;
    let disk_work = disk_root.join(format!("run-{}", std::process::id()));
    let _disk_cleanup = Cleanup {
        work: disk_work.clone(),
        root_created: disk_root_created,
    };
    let disk_data = disk_work.join("data");
    fresh_dir(&logs)?;
    h::catch_interrupts();

    let mut errors: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    let mut loads: Vec<Run> = Vec::new();
    let rb = &cfg.rb;
    // SET of new keys: nearly every request inserts (an allocation, a dict insert), where
    // redis-benchmark's default overwrites one key in place.
    let tmpfs_runs = [
        ("redis-benchmark-set", "set", rb.pipeline, rb.requests, None),
        ("redis-benchmark-get", "get", rb.pipeline, rb.requests, None),
        (
            "redis-benchmark-set-new-keys",
            "set",
            rb.pipeline,
            rb.requests,
            Some(NEW_KEYS),
        ),
    ];
    let disk_runs = [
        ("disk-set-c50", "set", 1, cfg.disk_requests, None),
        ("disk-set-p16", "set", rb.pipeline, rb.requests, None),
    ];
    // Every round runs each system in rotating order: redis-benchmark on tmpfs, YCSB (the
    // first `reps` rounds), then the disk runs (durable systems only).
    let rounds = reps.max(RATIO_RUNS);
    for rep in 0..rounds {
        let n = systems.len();
        for i in 0..n {
            let sys = &systems[(i + rep) % n];
            if errors.contains_key(sys.name) {
                continue;
            }
            let mut one = || -> Result<()> {
                runs.extend(measure_rb(
                    sys,
                    &cfg,
                    &tmpfs_runs,
                    &data,
                    &logs,
                    rep,
                    "rb",
                    &mut warnings,
                )?);
                if rep < reps {
                    let (load, rs) =
                        measure_ycsb(sys, &cfg, &ycsb, &data, &logs, rep, &mut warnings)?;
                    loads.push(load);
                    runs.extend(rs);
                }
                if DURABLE.contains(&sys.name) {
                    runs.extend(measure_rb(
                        sys,
                        &cfg,
                        &disk_runs,
                        &disk_data,
                        &logs,
                        rep,
                        "disk",
                        &mut warnings,
                    )?);
                }
                Ok(())
            };
            if let Err(e) = one() {
                if h::interrupted() {
                    bail!("interrupted: servers stopped, {} removed", work.display());
                }
                let msg = format!("{e:#}");
                let prefix = format!("{}: ", sys.name);
                let msg = msg.strip_prefix(&prefix).unwrap_or(&msg).to_string();
                progress(json, &format!("{}: FAILED: {msg}", sys.name));
                errors.insert(sys.name, msg);
            }
            let _ = fresh_dir(&data);
            let _ = fresh_dir(&disk_data);
        }
    }

    // Medians; failed systems' partial runs are dropped.
    let mut results = Vec::new();
    let mut details = Vec::new();
    let detail = |r: &Run| Detail {
        system: r.system,
        workload: r.workload,
        repetition: r.rep + 1,
        ops_per_s: round1(r.ops_per_s),
        p99_us: r.p99_us,
        server_cpu_s: round3(r.cpu_s),
        redis_benchmark: r.redis_benchmark.clone(),
        ycsb: r.ycsb.clone(),
    };
    let med = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            percentile(v, 50.0)
        }
    };
    for sys in &systems {
        if errors.contains_key(sys.name) {
            continue;
        }
        for wl in WORKLOADS {
            let mine: Vec<&Run> = runs
                .iter()
                .filter(|r| r.system == sys.name && r.workload == wl)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let ops: Vec<f64> = mine.iter().map(|r| r.ops_per_s).collect();
            let p99: Vec<f64> = mine.iter().map(|r| r.p99_us).collect();
            let cpus: Vec<f64> = mine
                .iter()
                .map(|r| r.cpu_s)
                .filter(|c| c.is_finite())
                .collect();
            let per_cpu: Vec<f64> = mine
                .iter()
                .filter(|r| r.cpu_s.is_finite())
                .filter_map(|r| cpu::per_cpu(r.ops, r.cpu_s))
                .collect();
            details.extend(mine.iter().map(|r| detail(r)));
            results.push(Row {
                system: sys.name,
                workload: wl,
                ops_per_s: round1(percentile(&ops, 50.0)),
                p99_us: round1(percentile(&p99, 50.0)),
                server_cpu_s: round3(med(&cpus)),
                ops_per_cpu_s: round1(med(&per_cpu)),
            });
        }
    }
    let ycsb_load: Vec<Detail> = loads
        .iter()
        .filter(|r| !errors.contains_key(r.system))
        .map(detail)
        .collect();
    let ops_of = |s: &str, w: &str| {
        results
            .iter()
            .find(|r| r.system == s && r.workload == w)
            .map(|r| r.ops_per_s)
    };
    let per_cpu_of = |s: &str, w: &str| {
        results
            .iter()
            .find(|r| r.system == s && r.workload == w)
            .map(|r| r.ops_per_cpu_s)
            .filter(|v| v.is_finite())
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(round3(a / b)),
        _ => None,
    };
    let vnvm = "tiermem-kv-vnvm";
    let lib = ycsb.dir.join("target/lib");
    let always = "redis-aof-always";
    let report = Report {
        durable_over_redis_always_set_p16: ratio(
            ops_of(vnvm, "redis-benchmark-set"),
            ops_of(always, "redis-benchmark-set"),
        ),
        durable_over_redis_always_get_p16: ratio(
            ops_of(vnvm, "redis-benchmark-get"),
            ops_of(always, "redis-benchmark-get"),
        ),
        durable_over_redis_always_set_p16_new_keys: ratio(
            ops_of(vnvm, "redis-benchmark-set-new-keys"),
            ops_of(always, "redis-benchmark-set-new-keys"),
        ),
        disk_durable_over_redis_always_set_c50: ratio(
            ops_of(vnvm, "disk-set-c50"),
            ops_of(always, "disk-set-c50"),
        ),
        disk_durable_over_redis_always_set_p16: ratio(
            ops_of(vnvm, "disk-set-p16"),
            ops_of(always, "disk-set-p16"),
        ),
        durable_over_volatile_ycsb_b: ratio(
            ops_of(vnvm, "ycsb-b"),
            ops_of("tiermem-kv-volatile", "ycsb-b"),
        ),
        durable_over_redis_always_ycsb_a: ratio(
            ops_of(vnvm, "ycsb-a"),
            ops_of("redis-aof-always", "ycsb-a"),
        ),
        durable_over_redis_everysec_ycsb_a: ratio(
            ops_of(vnvm, "ycsb-a"),
            ops_of("redis-aof-everysec", "ycsb-a"),
        ),
        durable_over_volatile_ycsb_b_per_cpu: ratio(
            per_cpu_of(vnvm, "ycsb-b"),
            per_cpu_of("tiermem-kv-volatile", "ycsb-b"),
        ),
        durable_over_redis_always_ycsb_a_per_cpu: ratio(
            per_cpu_of(vnvm, "ycsb-a"),
            per_cpu_of("redis-aof-always", "ycsb-a"),
        ),
        durable_over_redis_everysec_ycsb_a_per_cpu: ratio(
            per_cpu_of(vnvm, "ycsb-a"),
            per_cpu_of("redis-aof-everysec", "ycsb-a"),
        ),
        results,
        systems: systems
            .iter()
            .map(|s| SystemInfo {
                name: s.name,
                command: s.describe(),
                stop: match s.stop() {
                    Stop::Command(c) => c.join(" "),
                    Stop::Signal(_) => "SIGTERM".into(),
                },
                status: match errors.get(s.name) {
                    Some(_) => "error".into(),
                    None => "measured".into(),
                },
            })
            .collect(),
        errors,
        warnings,
        method: Method {
            ops_per_s: "redis-benchmark: its requests/s per test; YCSB: [OVERALL] \
                        Throughput(ops/sec) of the run phase",
            server_cpu_s: "the server process's CPU time (user + system, all threads, \
                           /proc/PID/stat) across the client run, one redis-benchmark run per \
                           test; ops_per_cpu_s = the run's operations / that CPU time. The \
                           clients' CPU (redis-benchmark, YCSB's JVM) is not counted",
            p99_us: "redis-benchmark: its p99_latency_ms per test (per request, pipelined), in \
                     µs; YCSB: 99th percentile (nearest rank) of every operation of the run \
                     phase, all operation types merged, from YCSB's raw per-operation samples \
                     (measurementtype=hdrhistogram+raw); per-type HdrHistogram p99s in details",
            statistic: "median over the repetitions, ops/s and p99 each taken separately; the \
                        redis-benchmark workloads (tmpfs and disk) run max(repetitions, 3) \
                        times, so every durable_over_redis_always ratio is a ratio of medians \
                        of at least 5 interleaved runs",
            order: "systems in rotating order each repetition",
            servers: "each server started fresh on an empty storage directory for \
                      redis-benchmark (set, then get), again for YCSB (load once, run \
                      workload a, then workload b on the same data), and for the durable \
                      systems again in the disk directory (set without pipelining, then set \
                      -P 16); stopped after each",
        },
        parameters: Params {
            quick,
            repetitions: reps,
            redis_benchmark: cfg.rb.clone(),
            redis_benchmark_defaults: "50 clients, 3-byte values, one key per test (no -r)",
            ycsb: YcsbParams {
                records: cfg.records,
                operations: cfg.ops,
                threads: cfg.threads,
                fields: 10,
                field_bytes: 100,
                request_distribution: "zipfian",
                workload_a: "read 0.5, update 0.5",
                workload_b: "read 0.95, update 0.05",
                binding: "tiermem.ycsb.RespClient (bench/ycsb): records as hashes (HMSET, \
                          HGETALL), keys indexed in the sorted set _indices (ZADD on insert)",
                jars: ycsb.dir.join("target").display().to_string(),
            },
        },
        storage: Storage {
            dir: root.display().to_string(),
            filesystem: filesystem(&root),
            note: "every system keeps its data, log or append-only file here; on tmpfs an \
                   fsync costs almost nothing, so redis-aof-always pays for its write(2)s, not \
                   for a device flush",
            disk_dir: disk_root.display().to_string(),
            disk_filesystem: filesystem(&disk_root),
        },
        versions: Versions {
            tiermem: env!("CARGO_PKG_VERSION"),
            redis_server: first_line_of("redis-server", &["--version"]),
            redis_benchmark: first_line_of("redis-benchmark", &["--version"]),
            java: first_line_of("java", &["-version"]),
            ycsb_core: jar_version(&lib, "core"),
            jedis: jar_version(&lib, "jedis"),
        },
        machine: machine::describe(),
        ycsb_load,
        details,
        seconds: round1(t0.elapsed().as_secs_f64()),
        systems_run: systems,
        plot_path: o.bench.plot.clone(),
    };

    if let Some(path) = &o.bench.plot {
        plot(&report, path)?;
    }
    Ok(report)
}

impl crate::Report for Report {
    fn print_table(&self) {
        print_table(self, &self.systems_run);
        if let Some(path) = &self.plot_path {
            println!("plot: {}", path.display());
        }
    }

    fn outcome(&self) -> Result<()> {
        if !self.errors.is_empty() {
            let names: Vec<&str> = self.errors.keys().copied().collect();
            bail!(
                "{} system(s) failed: {} (see errors in the report)",
                names.len(),
                names.join(", ")
            );
        }
        Ok(())
    }
}

/// The throughput chart: one group of bars per workload, one bar per system.
fn plot(r: &Report, path: &Path) -> Result<()> {
    let values: Vec<(String, Vec<Option<f64>>)> = r
        .systems
        .iter()
        .map(|s| {
            (
                if r.errors.contains_key(s.name) {
                    format!("{} (failed)", s.name)
                } else {
                    s.name.to_string()
                },
                WORKLOADS
                    .iter()
                    .map(|w| {
                        r.results
                            .iter()
                            .find(|x| x.system == s.name && x.workload == *w)
                            .map(|x| x.ops_per_s)
                    })
                    .collect(),
            )
        })
        .collect();
    let bars: Vec<crate::plot::Bars<'_>> = values
        .iter()
        .map(|(label, v)| crate::plot::Bars { label, values: v })
        .collect();
    crate::plot::bars(
        path,
        &format!(
            "tiermem bench kv: throughput (median of {}+, {}; disk-*: {})",
            r.parameters.repetitions, r.storage.filesystem, r.storage.disk_filesystem
        ),
        "operations/s (log scale)",
        // Short labels: the full names overlap under their bars.
        &WORKLOADS.map(|w| w.strip_prefix("redis-benchmark-").unwrap_or(w)),
        &bars,
    )
}

fn print_table(r: &Report, systems: &[System]) {
    let p = &r.parameters;
    println!("tiermem bench kv — tiermem-kv against redis-server, same clients, same machine");
    println!("machine: {}", r.machine.one_line());
    println!(
        "storage: {} ({}); {}, median of {} repetition(s), systems in rotating order",
        r.storage.dir, r.storage.filesystem, r.versions.redis_server, p.repetitions
    );
    println!(
        "redis-benchmark -t set,get -P {} -n {} ({}); YCSB {} (Jedis {}): {} records of 10 × \
         100 B, {} operations, {} threads, zipfian",
        p.redis_benchmark.pipeline,
        p.redis_benchmark.requests,
        p.redis_benchmark_defaults,
        r.versions.ycsb_core,
        r.versions.jedis,
        p.ycsb.records,
        p.ycsb.operations,
        p.ycsb.threads
    );
    println!("ops/s and p99 latency (µs; YCSB: all operations merged)\n");
    print!("{:<21}", "system");
    for w in WORKLOADS {
        print!(" {:>22}", w);
    }
    println!();
    print!("{:<21}", "");
    for _ in WORKLOADS {
        print!(" {:>12} {:>9}", "ops/s", "p99 µs");
    }
    println!();
    for s in systems {
        print!("{:<21}", s.name);
        if let Some(e) = r.errors.get(s.name) {
            // The first part (before the log excerpt), shortened; the whole error follows.
            let e: String = e
                .split(" | ")
                .next()
                .unwrap_or(e)
                .chars()
                .take(100)
                .collect();
            println!(" error: {e}");
            continue;
        }
        for w in WORKLOADS {
            match r
                .results
                .iter()
                .find(|x| x.system == s.name && x.workload == w)
            {
                Some(x) => print!(" {:>12.0} {:>9.0}", x.ops_per_s, x.p99_us),
                None => print!(" {:>12} {:>9}", "—", "—"),
            }
        }
        println!();
    }
    let f = |x: Option<f64>| x.map_or_else(|| "—".to_string(), |x| format!("{x:.3}"));
    println!(
        "\ndisk runs: {} ({}): redis-benchmark -t set -c 50 (no pipelining), and -P {}",
        r.storage.disk_dir, r.storage.disk_filesystem, p.redis_benchmark.pipeline
    );
    println!(
        "durable_over_redis_always_set_p16 (vnvm / redis-aof-always, SET -P 16): {}",
        f(r.durable_over_redis_always_set_p16)
    );
    println!(
        "durable_over_redis_always_get_p16 (vnvm / redis-aof-always, GET -P 16): {}",
        f(r.durable_over_redis_always_get_p16)
    );
    println!(
        "durable_over_redis_always_set_p16_new_keys (SET -P 16 -r {NEW_KEYS}): {}",
        f(r.durable_over_redis_always_set_p16_new_keys)
    );
    println!(
        "disk_durable_over_redis_always_set_c50 (on disk, SET, 50 clients): {}",
        f(r.disk_durable_over_redis_always_set_c50)
    );
    println!(
        "disk_durable_over_redis_always_set_p16 (on disk, SET -P 16): {}",
        f(r.disk_durable_over_redis_always_set_p16)
    );
    println!(
        "durable_over_volatile_ycsb_b (vnvm / volatile, ycsb-b ops/s): {}",
        f(r.durable_over_volatile_ycsb_b)
    );
    println!(
        "durable_over_redis_always_ycsb_a (vnvm / redis-aof-always, ycsb-a ops/s): {}",
        f(r.durable_over_redis_always_ycsb_a)
    );
    println!(
        "durable_over_redis_everysec_ycsb_a (vnvm / redis-aof-everysec, ycsb-a ops/s): {}",
        f(r.durable_over_redis_everysec_ycsb_a)
    );
    println!(
        "per second of server CPU (the same ratios of ops_per_cpu_s): {}, {}, {}",
        f(r.durable_over_volatile_ycsb_b_per_cpu),
        f(r.durable_over_redis_always_ycsb_a_per_cpu),
        f(r.durable_over_redis_everysec_ycsb_a_per_cpu)
    );
    println!("server CPU seconds per workload (median):");
    for s in systems {
        let cells: Vec<String> = WORKLOADS
            .iter()
            .filter_map(|w| {
                let x = r
                    .results
                    .iter()
                    .find(|x| x.system == s.name && x.workload == *w)?;
                Some(format!(
                    "{w} {:.2} s ({:.0} ops per CPU-second)",
                    x.server_cpu_s, x.ops_per_cpu_s
                ))
            })
            .collect();
        if !cells.is_empty() {
            println!("  {:<21} {}", s.name, cells.join(", "));
        }
    }
    let loads: Vec<String> = r
        .ycsb_load
        .iter()
        .filter(|d| d.repetition == 1)
        .map(|d| format!("{} {:.0}", d.system, d.ops_per_s))
        .collect();
    if !loads.is_empty() {
        println!("YCSB load ops/s (repetition 1): {}", loads.join(", "));
    }
    for (s, e) in &r.errors {
        println!("error: {s}: {e}");
    }
    for w in &r.warnings {
        println!("warning: {w}");
    }
    println!("total {:.1} s", r.seconds);
}
