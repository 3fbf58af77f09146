//! Driving Redis-protocol servers with real clients: start a server process and wait until it
//! answers `PING`, stop it, run `redis-benchmark` and YCSB against it, and parse what they print.
//!
//! Used by `tiermem bench kv` and, as `tiermem_bench::kv_harness`, by the integration tests of
//! `crates/cli`. It depends on nothing else of the crate: only `std`, `libc`, `anyhow` and
//! `serde`.
//!
//! # Example (a test)
//!
//! ```ignore
//! let port = kv_harness::free_port()?;
//! let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tiermem"));
//! cmd.args(["kv", "serve", "--engine", "volatile", "--dir"]).arg(&dir).args(["--port", &port.to_string()]);
//! let server = kv_harness::Server::start("tiermem-kv", cmd, port, &logs.join("server.log"),
//!                                         std::time::Duration::from_secs(30))?;
//! let ycsb = kv_harness::Ycsb::locate()?;          // bench/ycsb, built by scripts/setup.sh
//! let w = kv_harness::YcsbWorkload { port, workload: "a".into(), records: 1000, ops: 5000,
//!                                     threads: 2, ..Default::default() };
//! let load = ycsb.load(&w, &logs)?;                 // the insert phase (YCSB -load)
//! let run = ycsb.run(&w, &logs)?;                   // the transaction phase (YCSB -t)
//! assert_eq!(run.errors(), 0);
//! println!("{} ops/s, p99 {} µs", run.throughput, run.p99_us);
//! server.stop(kv_harness::Stop::Signal(libc::SIGTERM), std::time::Duration::from_secs(10))?;
//! ```
//!
//! The equivalent shell commands (what [`Ycsb::load`] and [`Ycsb::run`] execute):
//!
//! ```text
//! bench/ycsb/ycsb.sh load --host 127.0.0.1 --port P --workload a --threads 2 --records 1000
//! bench/ycsb/ycsb.sh run  --host 127.0.0.1 --port P --workload a --threads 2 --records 1000 \
//!     --ops 5000 -- -p measurementtype=hdrhistogram+raw -p measurement.raw.output_file=RAW.csv
//! ```

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// From now on, SIGINT, SIGTERM and SIGHUP do not kill this process: they set a flag that the
/// waits of this module ([`Server::start`], [`run_with_timeout`], hence every client run) check
/// every few milliseconds, failing with "interrupted", so that the caller's clean-up (drop guards:
/// servers stopped, directories removed) runs. Children are in sessions of their own
/// ([`die_with_parent`]): a terminal's Ctrl-C reaches only this process.
pub fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                sig,
                on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

/// Whether a signal caught by [`catch_interrupts`] has arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// The loopback address every server is started on and every client connects to.
pub const HOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released). Another
/// process can take it before the server binds it: [`Server::start`] reports that as a start-up
/// failure whose message contains the server's log (e.g. "Address already in use").
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind((HOST, 0)).context("binding a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

/// Make `cmd`'s process die with SIGKILL when the *thread* that spawned it exits (so a benchmark
/// or test killed mid-run leaves no server or client behind), and put it in a session of its own
/// (so a terminal's Ctrl-C reaches only the harness, whose clean-up then stops it in order).
///
/// Mind the thread: a server started by one `#[test]` (each runs in a thread of its own) and
/// shared with others through a static dies when that test's thread ends. Start a server in the
/// thread that uses it (or in a thread that outlives every user).
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl and setsid are async-signal-safe and touch only the child's own state.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            libc::setsid();
            Ok(())
        })
    }
}

/// Send one command (as a RESP array of bulk strings) and read the first line of the reply:
/// `+OK`, `-ERR ...`, `:1`, `$5` (the header of a bulk reply: its body is not read), etc. Enough
/// for `PING`, `DBSIZE`, `SHUTDOWN`, `CONFIG SET`; not a general client.
pub fn command_line(port: u16, args: &[&str], timeout: Duration) -> Result<String> {
    let addr = SocketAddr::from((HOST, port));
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {
                if b[0] == b'\n' {
                    break;
                }
                line.push(b[0]);
            }
            Err(e) => return Err(e).with_context(|| format!("reading the reply from {addr}")),
        }
        if line.len() > 4096 {
            bail!("reply line from {addr} longer than 4 KiB");
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// How [`Server::stop`] asks a server to exit.
#[derive(Clone, Copy, Debug)]
pub enum Stop<'a> {
    /// Send this command (e.g. `["SHUTDOWN", "NOSAVE"]` for redis-server); the reply, if any, is
    /// ignored (redis closes the connection without one).
    Command(&'a [&'a str]),
    /// Send this signal (e.g. `libc::SIGTERM`).
    Signal(libc::c_int),
}

/// A server process started by [`Server::start`]. Dropping it kills the process (SIGKILL) and
/// reaps it; [`Server::stop`] is the orderly way.
pub struct Server {
    name: String,
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Server {
    /// Spawn `cmd` (stdout and stderr to the file `log`, stdin closed; the process dies with the
    /// calling thread, see [`die_with_parent`]) and wait until it answers `PING` with `+PONG` on
    /// 127.0.0.1:`port` (replies such as `-LOADING` are retried). Fails, with the last lines of
    /// its log, if the process exits first or `timeout` passes (the process is then killed).
    pub fn start(
        name: &str,
        cmd: Command,
        port: u16,
        log: &Path,
        timeout: Duration,
    ) -> Result<Server> {
        Server::start_until(name, cmd, port, log, timeout, resp_ready)
    }

    /// [`Server::start`] for a server of another protocol: `ready(port)` says whether it serves
    /// yet (`Err` holds why not, for the time-out message); e.g. memcached's `version`.
    pub fn start_until(
        name: &str,
        mut cmd: Command,
        port: u16,
        log: &Path,
        timeout: Duration,
        ready: impl Fn(u16) -> std::result::Result<(), String>,
    ) -> Result<Server> {
        let out = std::fs::File::create(log)
            .with_context(|| format!("{name}: creating its log {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("{name}: cannot run {:?}", cmd.get_program()))?;
        let mut server = Server {
            name: name.to_string(),
            child: Some(child),
            port,
            log: log.to_path_buf(),
        };
        let start = Instant::now();
        loop {
            check_interrupted()?;
            if let Some(status) = server.child_mut().try_wait()? {
                server.child = None;
                bail!(
                    "{name}: the server exited during start-up ({status}): {}",
                    log_tail(log, 15)
                );
            }
            let last = match ready(port) {
                Ok(()) => return Ok(server),
                Err(why) => why,
            };
            if start.elapsed() > timeout {
                bail!(
                    "{name}: not serving on port {port} within {:.0} s (last: {last}); log: {}",
                    timeout.as_secs_f64(),
                    log_tail(log, 15)
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("server child present")
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its log file (stdout and stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Ask the server to exit as `how` says and wait up to `timeout` for it. Returns its exit
    /// status and whether it exited by itself; if it did not, it has been killed (SIGKILL) and
    /// reaped, and `Ok((status, false))` is returned: the caller decides whether that matters.
    pub fn stop(mut self, how: Stop<'_>, timeout: Duration) -> Result<(ExitStatus, bool)> {
        let mut child = self.child.take().expect("server child present");
        match how {
            Stop::Command(args) => {
                // Redis closes the connection without a reply: a read error is expected.
                let _ = command_line(self.port, args, Duration::from_secs(2));
            }
            Stop::Signal(sig) => {
                // SAFETY: signalling our own child, which has not been reaped yet.
                unsafe { libc::kill(child.id() as libc::pid_t, sig) };
            }
        }
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok((status, true));
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                let status = child.wait()?;
                return Ok((status, false));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Server({}, port {}, pid {:?})",
            self.name,
            self.port,
            self.pid()
        )
    }
}

/// The last `n` lines of a log file, on one line (` | `-separated), for error messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = lines[lines.len().saturating_sub(n)..].join(" | ");
            if tail.is_empty() {
                format!("(its log {} is empty)", path.display())
            } else {
                tail
            }
        }
        Err(e) => format!("(cannot read its log {}: {e})", path.display()),
    }
}

/// Whether a Redis-protocol server on 127.0.0.1:`port` answers `PING` with `+PONG` yet
/// (`Err` says why not).
pub fn resp_ready(port: u16) -> std::result::Result<(), String> {
    match command_line(port, &["PING"], Duration::from_millis(500)) {
        Ok(reply) if reply == "+PONG" => Ok(()),
        Ok(reply) => Err(format!("PING answered {reply:?}")),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// The `redis-server` command line of a baseline: port `port` on 127.0.0.1, data in `dir`, RDB
/// snapshots off (`save ""`), the append-only file on with `appendfsync` (`always`, `everysec` or
/// `no`), everything else Redis' defaults, logging to stdout, in the foreground.
pub fn redis_server_command(port: u16, dir: &Path, appendfsync: &str) -> Command {
    let mut c = Command::new("redis-server");
    c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .args(["--save", "", "--appendonly", "yes"])
        .args(["--appendfsync", appendfsync])
        .args(["--daemonize", "no", "--logfile", ""]);
    c
}

/// Run `cmd` to completion with stdout to `out` and stderr to `err` (files), killing it after
/// `timeout`. Returns its exit status.
pub fn run_with_timeout(
    what: &str,
    mut cmd: Command,
    out: &Path,
    err: &Path,
    timeout: Duration,
) -> Result<ExitStatus> {
    let o = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let e = std::fs::File::create(err).with_context(|| format!("creating {}", err.display()))?;
    cmd.stdin(Stdio::null()).stdout(o).stderr(e);
    die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("{what}: cannot run {:?}", cmd.get_program()))?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if interrupted() || start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            check_interrupted()?;
            bail!(
                "{what}: still running after {:.0} s, killed; stderr: {}",
                timeout.as_secs_f64(),
                log_tail(err, 10)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One test of `redis-benchmark --csv` (its latencies are in milliseconds as printed, here
/// converted to microseconds).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchRow {
    /// The test, as printed: `SET`, `GET`, ...
    pub test: String,
    /// Requests per second.
    pub rps: f64,
    pub avg_us: f64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Parse `redis-benchmark --csv` output (Redis 7: a header line
/// `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
/// "p99_latency_ms","max_latency_ms"`, then one quoted line per test). Columns are found by
/// name; lines before the header (warnings) are skipped. Fails without a header or rows.
pub fn parse_redis_benchmark_csv(text: &str) -> Result<Vec<BenchRow>> {
    let split = |l: &str| -> Vec<String> {
        l.trim()
            .split(',')
            .map(|f| f.trim().trim_matches('"').to_string())
            .collect()
    };
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("\"test\""));
    let header = split(
        lines
            .next()
            .ok_or_else(|| anyhow!("redis-benchmark --csv: no header line in {text:?}"))?,
    );
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| anyhow!("redis-benchmark --csv: no column {name} in {header:?}"))
    };
    let cols = [
        col("rps")?,
        col("avg_latency_ms")?,
        col("min_latency_ms")?,
        col("p50_latency_ms")?,
        col("p95_latency_ms")?,
        col("p99_latency_ms")?,
        col("max_latency_ms")?,
    ];
    let mut rows = Vec::new();
    for l in lines.filter(|l| !l.trim().is_empty()) {
        let f = split(l);
        let num = |i: usize| -> Result<f64> {
            f.get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .ok_or_else(|| anyhow!("redis-benchmark --csv: bad field {i} in {l:?}"))
        };
        let us = |i: usize| num(i).map(|ms| (ms * 1000.0 * 10.0).round() / 10.0);
        rows.push(BenchRow {
            test: f[0].clone(),
            rps: num(cols[0])?,
            avg_us: us(cols[1])?,
            min_us: us(cols[2])?,
            p50_us: us(cols[3])?,
            p95_us: us(cols[4])?,
            p99_us: us(cols[5])?,
            max_us: us(cols[6])?,
        });
    }
    if rows.is_empty() {
        bail!("redis-benchmark --csv: a header but no result line in {text:?}");
    }
    Ok(rows)
}

/// Parameters of one `redis-benchmark` run (`-q --csv`; everything not here is its default:
/// 50 clients, 3-byte values, one key per test since no `-r`).
#[derive(Clone, Debug, Serialize)]
pub struct RedisBenchmark {
    /// `-t`: the tests, e.g. `["set", "get"]`.
    pub tests: Vec<String>,
    /// `-P`: requests pipelined per client.
    pub pipeline: u32,
    /// `-n`: requests per test.
    pub requests: u64,
    /// `-r`: random keys from a keyspace of this size (`key:000000012345`); `None`: one key.
    pub keyspace: Option<u64>,
}

impl RedisBenchmark {
    /// Run it against 127.0.0.1:`port`, its outputs in `scratch` (`redis-benchmark.out`,
    /// `.err`), killed after `timeout`. Fails on a non-zero exit or unparsable output.
    pub fn run(&self, port: u16, scratch: &Path, timeout: Duration) -> Result<Vec<BenchRow>> {
        let mut c = Command::new("redis-benchmark");
        c.args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-t", &self.tests.join(",")])
            .args(["-P", &self.pipeline.to_string()])
            .args(["-n", &self.requests.to_string()])
            .args(["-q", "--csv"]);
        if let Some(r) = self.keyspace {
            c.args(["-r", &r.to_string()]);
        }
        let (out, err) = (
            scratch.join("redis-benchmark.out"),
            scratch.join("redis-benchmark.err"),
        );
        let status = run_with_timeout("redis-benchmark", c, &out, &err, timeout)?;
        let text = std::fs::read_to_string(&out)?;
        if !status.success() {
            bail!(
                "redis-benchmark failed ({status}): {} {}",
                log_tail(&err, 5),
                log_tail(&out, 5)
            );
        }
        parse_redis_benchmark_csv(&text).with_context(|| format!("stderr: {}", log_tail(&err, 5)))
    }
}

/// Statistics YCSB printed for one operation type (`[READ]`, `[UPDATE]`, `[INSERT]`, ...).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct YcsbOp {
    pub operations: u64,
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    /// `Return=STATUS` counts: `OK`, and `ERROR`, `NOT_FOUND`, ... when operations failed.
    pub returns: BTreeMap<String, u64>,
}

/// What a YCSB phase printed, parsed ([`parse_ycsb`]), plus the merged p99 of its raw samples
/// when it was run with raw measurements ([`Ycsb::run`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct YcsbReport {
    /// `[OVERALL], RunTime(ms)`.
    pub runtime_ms: f64,
    /// `[OVERALL], Throughput(ops/sec)`: all operations of the phase over its run time.
    pub throughput: f64,
    /// Per operation type, from the HdrHistogram measurement (`[READ]` or `[HdrREAD]`);
    /// `CLEANUP` (closing connections) is left out.
    pub ops: BTreeMap<String, YcsbOp>,
    /// The 99th percentile of every operation's latency, all types merged (over YCSB's raw
    /// per-operation samples through an HdrHistogram, µs); `None` without raw samples.
    pub merged_p99_us: Option<f64>,
    /// The number of raw samples `merged_p99_us` was computed from.
    pub raw_samples: u64,
}

impl YcsbReport {
    /// Operations counted over every type but `VERIFY` (`dataintegrity=true`'s check of each
    /// read, which YCSB reports as a type of its own, with its failures as `Return=` lines).
    pub fn operations(&self) -> u64 {
        self.ops
            .iter()
            .filter(|(op, _)| op.as_str() != "VERIFY")
            .map(|(_, o)| o.operations)
            .sum()
    }

    /// Operations whose return status was not `OK`, over every type.
    pub fn errors(&self) -> u64 {
        self.ops
            .values()
            .flat_map(|o| o.returns.iter())
            .filter(|(k, _)| k.as_str() != "OK")
            .map(|(_, v)| *v)
            .sum()
    }

    /// The largest per-type p99 (µs): a bound on the merged p99 from YCSB's summary alone.
    pub fn max_op_p99_us(&self) -> Option<f64> {
        self.ops.values().map(|o| o.p99_us).reduce(f64::max)
    }
}

/// Parse YCSB's report (`[SECTION], metric, value` lines, as printed to stdout by
/// `site.ycsb.Client` with the text exporter). Understands the `hdrhistogram` measurement's
/// names (`[READ], 99thPercentileLatency(us), N`) and the `hdrhistogram+raw` ones
/// (`[HdrREAD]`; the `[RawREAD]` summaries are skipped: [`merged_p99`] reads the raw samples).
/// Fails without `[OVERALL]` lines.
pub fn parse_ycsb(text: &str) -> Result<YcsbReport> {
    let mut r = YcsbReport::default();
    let (mut have_runtime, mut have_tp) = (false, false);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((section, rest)) = rest.split_once(']') else {
            continue;
        };
        let mut parts = rest.trim_start_matches(',').splitn(2, ',');
        let (Some(metric), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let (metric, value) = (metric.trim(), value.trim());
        let num = || -> Result<f64> {
            value
                .parse::<f64>()
                .with_context(|| format!("YCSB: bad number in {line:?}"))
        };
        if section == "OVERALL" {
            match metric {
                "RunTime(ms)" => (r.runtime_ms, have_runtime) = (num()?, true),
                "Throughput(ops/sec)" => (r.throughput, have_tp) = (num()?, true),
                _ => {}
            }
            continue;
        }
        if section.starts_with("TOTAL_GC") || section.starts_with("Raw") {
            continue;
        }
        let op = section.strip_prefix("Hdr").unwrap_or(section);
        if op == "CLEANUP" {
            continue;
        }
        let e = r.ops.entry(op.to_string()).or_default();
        match metric {
            "Operations" => e.operations = num()? as u64,
            "AverageLatency(us)" => e.avg_us = num()?,
            "MinLatency(us)" => e.min_us = num()?,
            "MaxLatency(us)" => e.max_us = num()?,
            "95thPercentileLatency(us)" => e.p95_us = num()?,
            "99thPercentileLatency(us)" => e.p99_us = num()?,
            m => {
                if let Some(status) = m.strip_prefix("Return=") {
                    *e.returns.entry(status.to_string()).or_default() += num()? as u64;
                }
            }
        }
    }
    if !(have_runtime && have_tp) {
        bail!("YCSB printed no [OVERALL] RunTime/Throughput lines");
    }
    Ok(r)
}

/// The p99 (nearest rank) of the latencies in YCSB's raw measurement file
/// (`measurementtype=...raw`, `measurement.raw.output_file`: a header line per operation type,
/// then `RawOP,timestamp_ms,latency_us` lines), every operation type merged except `CLEANUP`
/// and `VERIFY` (the client's own check of a read, not an operation).
/// Returns (p99 µs, samples); `None` when there is no sample.
pub fn merged_p99(raw: &str) -> Option<(f64, u64)> {
    // A full run holds hundreds of thousands of samples: they stream into an HdrHistogram (3
    // significant digits: exact below 2,048 µs, within 0.1 % above) instead of being collected
    // and sorted. Fixed bounds (1 µs to an hour; longer saturates): the auto-resizing
    // constructor (`new(3)`) answered a lower rank for the same samples (1,339 for 1,682 here).
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).ok()?;
    for l in raw.lines() {
        let mut f = l.split(',');
        let Some(op) = f.next().and_then(|o| o.strip_prefix("Raw")) else {
            continue;
        };
        if op.is_empty() || op == "CLEANUP" || op == "VERIFY" || op.contains(' ') {
            continue;
        }
        if let Some(us) = f.nth(1).and_then(|v| v.trim().parse::<u64>().ok()) {
            h.saturating_record(us);
        }
    }
    (!h.is_empty()).then(|| (h.value_at_quantile(0.99) as f64, h.len()))
}

/// One YCSB phase's parameters. [`Default`]: the RESP binding, 127.0.0.1:6379, workload a, 1 thread, 1000
/// records, 1000 operations, 2 s timeout, no extra arguments.
#[derive(Clone, Debug, Serialize)]
pub struct YcsbWorkload {
    /// The binding: `resp` (tiermem-kv, redis-server) or `memcached` (`ycsb.sh --db`).
    pub db: String,
    pub port: u16,
    /// `a`..`f` (bench/ycsb/workloads/workloadX) or a workload file's path.
    pub workload: String,
    /// Client threads, one connection each.
    pub threads: u32,
    /// Records: inserted by `load`, chosen from by `run` (give both the same).
    pub records: u64,
    /// Operations of `run`.
    pub ops: u64,
    /// `redis.timeout`: connect and socket timeout (ms).
    pub timeout_ms: u64,
    /// More arguments for `site.ycsb.Client` (e.g. `-p`, `k=v`).
    pub extra: Vec<String>,
}

impl Default for YcsbWorkload {
    fn default() -> Self {
        YcsbWorkload {
            db: "resp".into(),
            port: 6379,
            workload: "a".into(),
            threads: 1,
            records: 1000,
            ops: 1000,
            timeout_ms: 2000,
            extra: Vec::new(),
        }
    }
}

/// tiermem's YCSB binding (`bench/ycsb`: `ycsb.sh`, the Maven-built jars).
#[derive(Clone, Debug)]
pub struct Ycsb {
    /// The `bench/ycsb` directory.
    pub dir: PathBuf,
}

impl Ycsb {
    /// Find `bench/ycsb`: `$TIERMEM_YCSB_DIR`, else `$TIERMEM_ROOT/bench/ycsb`, else the source
    /// tree this binary was built from, else `../../bench/ycsb` from the running executable
    /// (`target/release/tiermem`). The binding is not built here: see [`Ycsb::build`].
    pub fn locate() -> Result<Ycsb> {
        let mut tried = Vec::new();
        let mut candidates = Vec::new();
        if let Some(d) = std::env::var_os("TIERMEM_YCSB_DIR") {
            candidates.push(PathBuf::from(d));
        }
        if let Some(d) = std::env::var_os("TIERMEM_ROOT") {
            candidates.push(PathBuf::from(d).join("bench/ycsb"));
        }
        candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/ycsb"));
        if let Ok(exe) = std::env::current_exe() {
            if let Some(root) = exe.parent().and_then(Path::parent).and_then(Path::parent) {
                candidates.push(root.join("bench/ycsb"));
            }
        }
        for d in candidates {
            if d.join("ycsb.sh").is_file() {
                return Ok(Ycsb {
                    dir: d.canonicalize().unwrap_or(d),
                });
            }
            tried.push(d.display().to_string());
        }
        bail!(
            "YCSB binding not found (no ycsb.sh in {}); set TIERMEM_YCSB_DIR to the repository's \
             bench/ycsb",
            tried.join(", ")
        )
    }

    /// Build the binding if its jar is missing or stale (`bench/ycsb/build.sh`: Maven, quiet;
    /// a no-op when up to date). Fails with the script's message (e.g. Maven Central
    /// unreachable, Maven not installed).
    pub fn build(&self) -> Result<()> {
        let out = Command::new("bash")
            .arg(self.dir.join("build.sh"))
            .stdin(Stdio::null())
            .output()
            .context("running bench/ycsb/build.sh")?;
        if !out.status.success() {
            bail!(
                "building the YCSB binding failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// `ycsb.sh load`: insert `w.records` records. Outputs in `scratch`
    /// (`ycsb-load-<workload>.out/.err`). Fails if YCSB fails, prints no report, or any insert
    /// did not return OK.
    pub fn load(&self, w: &YcsbWorkload, scratch: &Path) -> Result<YcsbReport> {
        let r = self.phase("load", w, scratch, &[])?;
        check_ops(&r, w.records, "load")?;
        Ok(r)
    }

    /// `ycsb.sh run` with `measurementtype=hdrhistogram+raw` (raw samples to
    /// `scratch/ycsb-run-<workload>.raw`, read back for [`YcsbReport::merged_p99_us`], then
    /// deleted). Fails if YCSB fails, prints no report, did not perform `w.ops` operations, or any
    /// operation did not return OK.
    pub fn run(&self, w: &YcsbWorkload, scratch: &Path) -> Result<YcsbReport> {
        let raw = scratch.join(format!("ycsb-run-{}.raw", file_tag(&w.workload)));
        let _ = std::fs::remove_file(&raw);
        let raw_arg = format!("measurement.raw.output_file={}", raw.display());
        let mut r = self.phase(
            "run",
            w,
            scratch,
            &["-p", "measurementtype=hdrhistogram+raw", "-p", &raw_arg],
        )?;
        let text = std::fs::read_to_string(&raw)
            .with_context(|| format!("YCSB run: reading its raw samples {}", raw.display()))?;
        let _ = std::fs::remove_file(&raw);
        if let Some((p99, n)) = merged_p99(&text) {
            r.merged_p99_us = Some(p99);
            r.raw_samples = n;
        }
        check_ops(&r, w.ops, "run")?;
        Ok(r)
    }

    fn phase(
        &self,
        phase: &str,
        w: &YcsbWorkload,
        scratch: &Path,
        extra: &[&str],
    ) -> Result<YcsbReport> {
        let tag = format!("ycsb-{phase}-{}", file_tag(&w.workload));
        let (out, err) = (
            scratch.join(format!("{tag}.out")),
            scratch.join(format!("{tag}.err")),
        );
        let mut c = Command::new("bash");
        c.arg(self.dir.join("ycsb.sh"))
            .arg(phase)
            .args(["--db", &w.db])
            .args(["--host", &HOST.to_string(), "--port", &w.port.to_string()])
            .args(["--workload", &w.workload])
            .args(["--threads", &w.threads.to_string()])
            .args(["--records", &w.records.to_string()])
            .args(["--timeout", &w.timeout_ms.to_string()]);
        if phase == "run" {
            c.args(["--ops", &w.ops.to_string()]);
        }
        c.arg("--").args(extra).args(&w.extra);
        // Generous: YCSB itself gives up on a dead server after redis.timeout per operation.
        let limit = Duration::from_secs(120 + (w.records.max(w.ops) / 200));
        let status = run_with_timeout(&format!("YCSB {phase}"), c, &out, &err, limit)?;
        let stdout = std::fs::read_to_string(&out)?;
        if !status.success() {
            bail!("YCSB {phase} failed ({status}): {}", log_tail(&err, 8));
        }
        // A client thread whose init() failed (e.g. no server) prints the exception and YCSB
        // goes on without it: report the binding's own message.
        let stderr = std::fs::read_to_string(&err).unwrap_or_default();
        if let Some(l) = stdout
            .lines()
            .chain(stderr.lines())
            .find(|l| l.contains("DBException:"))
        {
            bail!("YCSB {phase}: a client thread failed: {}", l.trim());
        }
        parse_ycsb(&stdout).with_context(|| format!("YCSB {phase}: {}", log_tail(&err, 8)))
    }
}

fn check_ops(r: &YcsbReport, expected: u64, phase: &str) -> Result<()> {
    let errors = r.errors();
    if errors > 0 {
        let detail: Vec<String> = r
            .ops
            .iter()
            .flat_map(|(op, o)| {
                o.returns
                    .iter()
                    .filter(|(k, _)| k.as_str() != "OK")
                    .map(move |(k, v)| format!("{op} {k}: {v}"))
            })
            .collect();
        bail!(
            "YCSB {phase}: {errors} operations failed ({})",
            detail.join(", ")
        );
    }
    if r.operations() != expected {
        bail!(
            "YCSB {phase}: {} operations done, {expected} expected",
            r.operations()
        );
    }
    Ok(())
}

fn file_tag(workload: &str) -> String {
    Path::new(workload)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "w".into())
}
