//! The application cases of `tiermem bench pager`: Debian's memcached and redis-server,
//! unmodified, each under kernel swap and under `tiermem pager run` (the LD_PRELOAD shim),
//! driven by YCSB-A through tiermem's bindings (`bench/ycsb`: `ycsb.sh --db memcached`, and
//! `--db resp` for redis, a record a hash) with `dataintegrity=true`, so every value read back
//! is checked by YCSB itself.
//!
//! redis-server runs without persistence (`save ""`, no AOF) and with hashes of up to 128-byte
//! values kept as listpacks (a YCSB record, ten 100-byte fields, is then one ~1.1 KB block, the
//! paper's 1 KB value); under the shim its jemalloc keeps every allocation and the arena pages
//! jemalloc's extents.
//!
//! Per system: start the server (memcached: `-m` twice the data, so it evicts nothing), load
//! the records (about `data` bytes of items), an untimed YCSB-A warm-up of a quarter of the
//! operations, then the timed YCSB-A run. The application's p99 is YCSB's `[READ]`
//! 99th-percentile latency (the paper's "DB reads"); UPDATE (a get and a set here) is reported
//! beside it.
//! * `kernel-swap`: memcached in a v1 memory cgroup; once it listens, the limit becomes the
//!   budget plus what it holds then plus the same slack the probe gets (16 MiB + budget/32).
//!   The caller provides the swap file and zswap's setting.
//! * `pager`: `tiermem pager run --budget B --nvm N [--bound p99=…] -- memcached …` (the
//!   caller passes the kernel's budget + slack as B, so both hold the same item memory): its item
//!   memory (1 MiB slab pages and the hash table, all `malloc`s of at least 128 KiB) is the
//!   arena; its exit report gives the page-ins and the resident peak.

use crate::kv_harness::{die_with_parent, free_port, Server, Stop, Ycsb, YcsbReport, YcsbWorkload};
use crate::snapshot::Cgroup;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    /// Debian's memcached (`-L`-free defaults; 1 MiB slab pages from `malloc`).
    Memcached,
    /// Debian's redis-server (jemalloc).
    Redis,
}

impl App {
    /// Its name in rows, `--systems` and JSON keys.
    pub fn name(self) -> &'static str {
        match self {
            App::Memcached => "memcached",
            App::Redis => "redis",
        }
    }

    /// Its executable.
    pub fn program(self) -> &'static str {
        match self {
            App::Memcached => "memcached",
            App::Redis => "redis-server",
        }
    }

    /// Bytes of server memory one YCSB record takes. memcached: 10 fields of 100 bytes in the
    /// binding's encoding, 1,120 bytes, with key and item header, in its 1,184-byte slab
    /// class. redis: a listpack hash of ten ~107-byte entries, key, object and dict entry, in
    /// jemalloc's 1,280-byte class.
    fn record_bytes(self) -> u64 {
        match self {
            App::Memcached => 1184,
            App::Redis => 1280,
        }
    }

    /// The YCSB binding (`ycsb.sh --db`).
    fn db(self) -> &'static str {
        match self {
            App::Memcached => "memcached",
            App::Redis => "resp",
        }
    }

    /// Its arguments on 127.0.0.1:`port` for `data` bytes of records.
    fn args(self, port: u16, data: u64) -> Vec<String> {
        match self {
            App::Memcached => memcached_args(port, 2 * data.div_ceil(1 << 20)),
            App::Redis => [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                "",
                "--hash-max-listpack-value",
                "128",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        }
    }

    /// Whether it serves on `port` yet.
    fn ready(self, port: u16) -> std::result::Result<(), String> {
        match self {
            App::Memcached => memcached_ready(port),
            App::Redis => crate::kv_harness::resp_ready(port),
        }
    }
}

/// What one application run is asked to do.
pub struct AppSpec {
    /// The application.
    pub app: App,
    /// Bytes of item memory to load (records = data / [`RECORD_BYTES`]).
    pub data: u64,
    /// DRAM budget (the cgroup's base for kernel swap, the arena's budget for the pager).
    pub budget: u64,
    /// NVM paging buffer of the pager.
    pub nvm: u64,
    /// The pager's page-in bound (p99), ns.
    pub bound_ns: Option<u64>,
    /// Timed YCSB-A operations.
    pub ops: u64,
    /// Directory for the pager's swap file.
    pub dir: PathBuf,
    /// Directory for this run's logs (memcached's, YCSB's, the shim's report).
    pub logs: PathBuf,
}

impl AppSpec {
    /// Records loaded.
    pub fn records(&self) -> u64 {
        (self.data / self.app.record_bytes()).max(1000)
    }
}

/// One application run's results.
#[derive(Debug, Clone)]
pub struct AppRun {
    /// YCSB `[READ]` p99, µs.
    pub read_p99_us: f64,
    /// YCSB `[UPDATE]` p99, µs.
    pub update_p99_us: f64,
    /// YCSB run throughput, operations per second.
    pub ops_per_s: f64,
    /// The server's CPU seconds over load, warm-up and run.
    pub cpu_s: f64,
    /// Page-ins: the server's major faults (kernel swap) or the pager's page-ins.
    pub pageins: u64,
    /// The pager's page-in p50 and p99 over the whole run, µs.
    pub pagein_p50_us: Option<f64>,
    pub pagein_p99_us: Option<f64>,
    /// Share of the pager's page-ins served by the NVM buffer.
    pub nvm_served_frac: Option<f64>,
    /// Peak bytes: the cgroup's (kernel swap) or the arena's resident pages (pager).
    pub peak_bytes: u64,
    /// Whether the peak stayed within the budget as each system defines it.
    pub budget_ok: bool,
    /// Bytes the kernel's cgroup allowed over the budget (0 for the pager).
    pub limit_over_budget: u64,
}

/// `version` answered with `VERSION …`: memcached serves.
fn memcached_ready(port: u16) -> std::result::Result<(), String> {
    let addr = std::net::SocketAddr::from((crate::kv_harness::HOST, port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"version\r\n").map_err(|e| e.to_string())?;
    let mut b = [0u8; 64];
    let n = s.read(&mut b).map_err(|e| e.to_string())?;
    if b[..n].starts_with(b"VERSION ") {
        Ok(())
    } else {
        Err(format!(
            "version answered {:?}",
            String::from_utf8_lossy(&b[..n])
        ))
    }
}

/// memcached's arguments: 127.0.0.1:`port`, no UDP, two worker threads, a cache of `cache_mib`.
fn memcached_args(port: u16, cache_mib: u64) -> Vec<String> {
    [
        "-u",
        "root",
        "-l",
        "127.0.0.1",
        "-U",
        "0",
        "-t",
        "2",
        "-c",
        "64",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "-p".into(),
        port.to_string(),
        "-m".into(),
        cache_mib.to_string(),
    ])
    .collect()
}

/// Load, warm up, run; returns the timed run's report. `say` reports progress.
fn drive(
    ycsb: &Ycsb,
    port: u16,
    spec: &AppSpec,
    logs: &Path,
    say: &dyn Fn(&str),
) -> Result<YcsbReport> {
    let w = YcsbWorkload {
        db: spec.app.db().into(),
        port,
        workload: "a".into(),
        threads: 1,
        records: spec.records(),
        ops: spec.ops,
        timeout_ms: 20_000,
        extra: vec!["-p".into(), "dataintegrity=true".into()],
    };
    say(&format!("YCSB load, {} records", w.records));
    ycsb.load(&w, logs)?;
    say(&format!("YCSB-A warm-up, {} operations", spec.ops / 4));
    ycsb.run(
        &YcsbWorkload {
            ops: (spec.ops / 4).max(1),
            ..w.clone()
        },
        logs,
    )?;
    say(&format!("YCSB-A, {} operations", spec.ops));
    ycsb.run(&w, logs)
}

fn p99(r: &YcsbReport, op: &str) -> Result<f64> {
    r.ops
        .get(op)
        .map(|o| o.p99_us)
        .with_context(|| format!("YCSB reported no {op} operations"))
}

/// The context of a [`run_kernel`] error whose server its memory cgroup OOM-killed: memcg v1
/// has no dirty throttling, and a server is sometimes killed while swap writeback lags behind
/// its faults (seen with other disk traffic beside it), as the probes are (`bench pager`
/// reruns those too).
#[derive(Debug, Clone, Copy)]
pub struct KernelOomKill;

impl std::fmt::Display for KernelOomKill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OOM-killed by its memory cgroup")
    }
}

/// The application under kernel swap (the caller has the swap file on and zswap off).
pub fn run_kernel(
    spec: &AppSpec,
    ycsb: &Ycsb,
    cgroup_name: &str,
    say: &dyn Fn(&str),
) -> Result<AppRun> {
    let cg = Cgroup::create(cgroup_name)?;
    let port = free_port()?;
    let app = spec.app;
    let mut c = Command::new(app.program());
    c.args(app.args(port, spec.data));
    cg.enter_at_exec(&mut c);
    let log = spec.logs.join(format!("{}-kernel.log", app.name()));
    let server = Server::start_until(
        app.program(),
        c,
        port,
        &log,
        Duration::from_secs(30),
        move |p| app.ready(p),
    )?;
    let pid = server.pid().context("server pid")?;
    let base = cg.max_usage()?;
    let limit = spec.budget + base + crate::pager::kernel_slack(spec.budget);
    cg.set_limit(limit)?;
    let r = drive(ycsb, port, spec, &spec.logs, say);
    let cpu_s = crate::cpu::process_cpu_s(pid).unwrap_or(0.0);
    let majflt = crate::cpu::process_major_faults(pid).unwrap_or(0);
    let ooms = cg.oom_kills();
    let _ = server.stop(Stop::Signal(libc::SIGTERM), Duration::from_secs(10));
    let r = r
        .with_context(|| {
            format!(
                "{} under kernel swap (OOM kills {ooms}; log: {})",
                app.program(),
                crate::kv_harness::log_tail(&log, 5)
            )
        })
        .map_err(|e| {
            if ooms > 0 {
                e.context(KernelOomKill)
            } else {
                e
            }
        })?;
    let peak = cg.max_usage()?;
    Ok(AppRun {
        read_p99_us: p99(&r, "READ")?,
        update_p99_us: p99(&r, "UPDATE")?,
        ops_per_s: r.throughput,
        cpu_s,
        pageins: majflt,
        pagein_p50_us: None,
        pagein_p99_us: None,
        nvm_served_frac: None,
        peak_bytes: peak,
        budget_ok: peak <= limit,
        limit_over_budget: limit - spec.budget,
    })
}

/// The application under `tiermem pager run` (`tiermem` is this executable).
pub fn run_pager(spec: &AppSpec, ycsb: &Ycsb, say: &dyn Fn(&str)) -> Result<AppRun> {
    let app = spec.app;
    let port = free_port()?;
    let stats = spec.logs.join(format!("{}-pager-{port}.json", app.name()));
    let _ = std::fs::remove_file(&stats);
    let exe = std::env::current_exe().context("locating the tiermem executable")?;
    let mut c = Command::new(exe);
    c.args(["pager", "run", "--budget"])
        .arg(spec.budget.to_string())
        .arg("--nvm")
        .arg(spec.nvm.to_string())
        .arg("--dir")
        .arg(&spec.dir)
        .arg("--stats")
        .arg(&stats);
    if let Some(b) = spec.bound_ns {
        c.arg("--bound")
            .arg(format!("p99={b}ns"))
            .arg("--best-effort");
    }
    c.arg("--")
        .arg(app.program())
        .args(app.args(port, spec.data));
    die_with_parent(&mut c);
    let log = spec.logs.join(format!("{}-pager.log", app.name()));
    let server = Server::start_until(
        &format!("{} (pager)", app.program()),
        c,
        port,
        &log,
        Duration::from_secs(60),
        move |p| app.ready(p),
    )?;
    let pid = server.pid().context("server pid")?;
    let r = drive(ycsb, port, spec, &spec.logs, say);
    let cpu_s = crate::cpu::process_cpu_s(pid).unwrap_or(0.0);
    let (_, clean) = server.stop(Stop::Signal(libc::SIGTERM), Duration::from_secs(30))?;
    let r = r.with_context(|| {
        format!(
            "{} under the pager (log: {})",
            app.program(),
            crate::kv_harness::log_tail(&log, 5)
        )
    })?;
    if !clean {
        bail!(
            "{} under the pager did not exit on SIGTERM within 30 s",
            app.program()
        );
    }
    let text = std::fs::read_to_string(&stats)
        .with_context(|| format!("the shim's exit report {}", stats.display()))?;
    let _ = std::fs::remove_file(&stats);
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or(""))
        .with_context(|| format!("the shim's exit report: {text:?}"))?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    if n("io_errors") > 0 {
        bail!("the pager reported {} I/O errors: {v}", n("io_errors"));
    }
    let pageins = n("pageins_buffer") + n("pageins_ssd");
    let page = 4096u64;
    let peak = n("max_resident_pages") * page;
    Ok(AppRun {
        read_p99_us: p99(&r, "READ")?,
        update_p99_us: p99(&r, "UPDATE")?,
        ops_per_s: r.throughput,
        cpu_s,
        pageins,
        pagein_p50_us: Some(n("pagein_p50_ns") as f64 / 1000.0),
        pagein_p99_us: Some(n("pagein_p99_ns") as f64 / 1000.0),
        nvm_served_frac: (pageins > 0).then(|| n("pageins_buffer") as f64 / pageins as f64),
        peak_bytes: peak,
        // The pager's hard cap: the budget plus one eviction batch (32 pages).
        budget_ok: peak <= spec.budget + 32 * page,
        limit_over_budget: 0,
    })
}

#[cfg(test)]
mod oom_tests {
    use super::KernelOomKill;

    /// `bench pager` tells an OOM-killed kernel-swap run (rerun it) from any other failure by
    /// this context.
    #[test]
    fn an_oom_kill_is_told_from_other_failures() {
        let killed = anyhow::anyhow!("YCSB run: a client thread failed")
            .context("redis-server under kernel swap (OOM kills 1)")
            .context(KernelOomKill);
        assert!(killed.downcast_ref::<KernelOomKill>().is_some());
        let other = anyhow::anyhow!("YCSB run failed").context("redis-server under kernel swap");
        assert!(other.downcast_ref::<KernelOomKill>().is_none());
    }
}
