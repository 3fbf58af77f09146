//! `tiermem bench snapshot`: point-in-time snapshots of a key-value server's memory taken while
//! a writer load runs (thesis 002, chapter 5: MDC, memory-bounded checkpoints), tiermem-kv's
//! three snapshot methods against Redis's fork-based BGSAVE, side by side in one run.
//!
//! Systems, each a server process of its own in a memory cgroup (v1) of its own, created for it
//! (`/sys/fs/cgroup/memory/tiermem-bench-snapshot-<pid>-<system>`; the server enters it between
//! fork and exec, so everything it and its children allocate is charged there; the cgroup is
//! removed at the end, processes killed first, also on an error or Ctrl-C):
//!
//! * **wp**, **fork-mdc**, **fork** — `tiermem kv serve --engine volatile --heap-size H --port P
//!   --bind 127.0.0.1 --dir D --set dbfilename=dump.tmsnap --set snapshot-method=M --set save=`
//!   (this same binary);
//! * **redis** — `redis-server` 7 with `--save "" --appendonly no --rdbcompression no
//!   --rdbchecksum yes --dir D --dbfilename dump.rdb` (BGSAVE forks).
//!
//! Per system: N keys of 1 KB (`key:` + 12 digits, the names `redis-benchmark -r N` gives
//! `key:__rand_int__`, so the load below rewrites existing keys) are loaded by a pipelined SET
//! loader (two connections); `DBSIZE` must be N. Then for 50 % and then 100 % updates, on the
//! same server: `redis-benchmark -P 16 -d 1024 -r N` runs (100 %: `-t set`, 50 clients; 50 %: a
//! `-t set` and a `-t get`, 25 clients each, concurrently), 2 s to reach a steady state, then
//! `BGSAVE`, and `INFO persistence` every 5 ms until `rdb_bgsave_in_progress:0` (the snapshot's
//! wall time), `rdb_last_bgsave_status` must be `ok`. Meanwhile a thread samples the cgroup's
//! `memory.stat` `total_rss` every 5 ms (anonymous memory of the server and any child it forks;
//! the page cache apart): extra memory = (peak during the snapshot − the value just before
//! BGSAVE) / that value. Throughput during = `total_commands_processed` over the snapshot
//! (`INFO stats` before and after, this harness's own INFO commands subtracted) / its wall time;
//! p99 of four probe clients' single GETs of random existing keys (each one GET at a time, 1 ms
//! apart) over the snapshot; pause = tiermem's `snapshot_last_pause_us` or Redis's
//! `latest_fork_usec`; file bytes = the snapshot file's size; CPU = the server's utime + stime +
//! cutime + cstime (`/proc/PID/stat`: a forked child's once reaped) over the snapshot. After
//! the last snapshot the load stops, the server is killed (SIGKILL) and restarted on the same
//! directory: restore = wall time from the spawn until it answers PING and `DBSIZE` is N;
//! random keys must hold 1 KB values.
//!
//! Sizes: 256 MB of values (262,144 keys) with `--quick`, 2 GB (2,097,152 keys) otherwise. Files
//! go to `--dir`, else `$TIERMEM_BENCH_SNAPSHOT_DIR`, else `/var/tmp/tiermem-bench-snapshot`
//! (refused on tmpfs: a snapshot goes to disk), a directory per run removed at the end
//! (`TIERMEM_BENCH_KEEP_LOGS` keeps it). A system that fails is reported in `errors` and the
//! command exits non-zero naming it; the others are still measured. The hidden `--systems`
//! option runs some systems only (development).

use crate::kv_harness::{self as h, Server, Stop};
use crate::{machine, plot, progress, BenchOpts};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};
use tiermem_kv::client::{Client, Reply};

/// The systems, in the order they run and are reported.
pub const SYSTEMS: [&str; 4] = ["wp", "fork-mdc", "fork", "redis"];
/// The update percentages of the load, in the order they run on one server.
pub const UPDATE_PCTS: [u32; 2] = [50, 100];
/// Bytes per value.
const VALUE_LEN: usize = 1024;
/// Keys with `--quick` (256 MB of values) and without (2 GB).
const QUICK_KEYS: u64 = 262_144;
const FULL_KEYS: u64 = 2_097_152;
/// tiermem-kv volatile heap bytes per key of 1 KB: `tiermem_heap_used_bytes` / `DBSIZE` after
/// loading 200,000 keys was 2,074.6 (the value's block is a 2 KiB size class), unchanged by
/// 2 M random rewrites. The heap is sized at 1.5 times this, plus 64 MiB.
const HEAP_BYTES_PER_KEY: u64 = 2075;
/// The load runs this long before the snapshot.
const WARMUP: Duration = Duration::from_secs(2);
/// ... and this long after it (for the chart).
const TAIL: Duration = Duration::from_millis(500);
/// Memory samples and INFO persistence polls.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// INFO stats samples (the throughput timeline).
const STATS_EVERY: Duration = Duration::from_millis(50);
/// Probe clients (a connection and a thread each), and each one's pause between two GETs.
const PROBES: u64 = 4;
const PROBE_GAP: Duration = Duration::from_millis(1);
/// redis-benchmark: connections in all, requests pipelined per connection.
const CLIENTS: u32 = 50;
const PIPELINE: u32 = 16;
/// Requests per redis-benchmark run: more than any snapshot needs (it is killed after).
const REQUESTS: u64 = 2_000_000_000;
/// Random keys checked after a restore.
const VERIFY_KEYS: usize = 16;
const START_TIMEOUT: Duration = Duration::from_secs(60);
const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(900);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Where cgroup v1's memory controller is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup/memory";
/// Environment variable: the storage directory (`--dir` wins).
const DIR_ENV: &str = "TIERMEM_BENCH_SNAPSHOT_DIR";
/// The default storage directory (on disk, not tmpfs).
const DEFAULT_DIR: &str = "/var/tmp/tiermem-bench-snapshot";

/// `tiermem bench snapshot` options.
#[derive(Args, Clone, Debug, Default)]
pub struct SnapshotOpts {
    /// --quick, --json, --plot.
    #[command(flatten)]
    pub bench: BenchOpts,
    /// Storage directory for the servers' data and snapshot files (not tmpfs; a directory per
    /// run inside it, removed at the end). Default: $TIERMEM_BENCH_SNAPSHOT_DIR, else
    /// /var/tmp/tiermem-bench-snapshot.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Only these systems, comma-separated (wp, fork-mdc, fork, redis): development only, the
    /// ratios need all four.
    #[arg(long, value_delimiter = ',', value_name = "NAME,...", hide = true)]
    pub systems: Vec<String>,
}

/// A system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    /// tiermem-kv, volatile engine, with this `snapshot-method`.
    Tiermem(&'static str),
    /// redis-server, BGSAVE by fork.
    Redis,
}

impl System {
    fn of(name: &str) -> Option<System> {
        Some(match name {
            "wp" => System::Tiermem("wp"),
            "fork-mdc" => System::Tiermem("fork-mdc"),
            "fork" => System::Tiermem("fork"),
            "redis" => System::Redis,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            System::Tiermem(m) => m,
            System::Redis => "redis",
        }
    }

    fn dbfilename(self) -> &'static str {
        match self {
            System::Tiermem(_) => "dump.tmsnap",
            System::Redis => "dump.rdb",
        }
    }

    /// The server's command line: port `port` on 127.0.0.1, data and snapshot in `dir`;
    /// `heap` bytes of tiermem heap.
    fn command(self, port: u16, dir: &Path, heap: u64) -> Result<Command> {
        Ok(match self {
            System::Tiermem(method) => {
                let exe = std::env::current_exe().context("locating the tiermem binary")?;
                let mut c = Command::new(exe);
                c.args(["kv", "serve", "--engine", "volatile"])
                    .args(["--heap-size", &heap.to_string()])
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .arg("--dir")
                    .arg(dir);
                for kv in [
                    format!("dbfilename={}", self.dbfilename()),
                    format!("snapshot-method={method}"),
                    "save=".to_string(),
                ] {
                    c.args(["--set", &kv]);
                }
                c
            }
            System::Redis => {
                // The shared baseline command line, its append-only file turned off again and
                // RDB snapshots set up (redis-server takes the last of repeated options).
                let mut c = h::redis_server_command(port, dir, "everysec");
                c.args(["--appendonly", "no"])
                    .args(["--rdbcompression", "no", "--rdbchecksum", "yes"])
                    .args(["--dbfilename", self.dbfilename()]);
                c
            }
        })
    }

    fn stop(self) -> Stop<'static> {
        match self {
            System::Tiermem(_) => Stop::Signal(libc::SIGTERM),
            System::Redis => Stop::Command(&["SHUTDOWN", "NOSAVE"]),
        }
    }

    /// The command line with placeholders, for the report.
    fn describe(self) -> String {
        match self.command(0, Path::new("D"), 0) {
            Ok(c) => {
                let mut s = match self {
                    System::Tiermem(_) => "tiermem".to_string(),
                    System::Redis => c.get_program().to_string_lossy().into_owned(),
                };
                let mut prev = String::new();
                for a in c.get_args() {
                    let a = a.to_string_lossy().into_owned();
                    s.push(' ');
                    match (prev.as_str(), a.as_str()) {
                        ("--port", _) => s.push('P'),
                        ("--heap-size", _) => s.push('H'),
                        (_, "") => s.push_str("\"\""),
                        _ => s.push_str(&a),
                    }
                    prev = a;
                }
                s
            }
            Err(e) => format!("({e})"),
        }
    }
}

/// The tiermem heap for `keys` keys of 1 KB: 1.5 times what they take (see
/// [`HEAP_BYTES_PER_KEY`]), rounded up to 64 MiB, plus 64 MiB.
fn heap_bytes(keys: u64) -> u64 {
    const MIB64: u64 = 64 << 20;
    (keys * HEAP_BYTES_PER_KEY * 3 / 2).div_ceil(MIB64) * MIB64 + MIB64
}

/// The name `redis-benchmark -r N` gives `key:__rand_int__` for the number `i` (`i` < N): the
/// placeholder's 12 characters become `i` zero-padded to 12 digits.
pub fn key(i: u64) -> String {
    format!("key:{i:012}")
}

// ---------------------------------------------------------------------------------------------
// Parsing (pure).
// ---------------------------------------------------------------------------------------------

/// The value of field `name` in an `INFO` reply (`name:value` lines, CRLF or LF).
pub fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// Field `name` of `INFO section`'s reply as a number; a missing or malformed field is an error
/// naming it.
fn info_u64(text: &str, section: &str, name: &str) -> Result<u64> {
    let v = info_field(text, name).ok_or_else(|| {
        anyhow!("INFO {section} has no {name} field (the server does not report it)")
    })?;
    v.parse()
        .map_err(|_| anyhow!("INFO {section}: {name}:{v} is not a number"))
}

/// The value of `name` in a cgroup v1 `memory.stat` (`name value` lines), e.g. `total_rss`.
pub fn memory_stat_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok())?
    })
}

/// utime + stime + cutime + cstime (clock ticks) from the text of `/proc/PID/stat`: the
/// process's CPU and that of its children it has waited for.
pub fn proc_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // Fields after the command name (which may hold spaces and parentheses) start at ") ".
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime, cutime, cstime are fields 14-17 of the line: 11-14 here.
    (11..=14).try_fold(0u64, |sum, i| Some(sum + f.get(i)?.parse::<u64>().ok()?))
}

/// CPU seconds of process `pid` and its reaped children (see [`proc_stat_cpu_ticks`]).
fn server_cpu_s(pid: Option<u32>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(proc_stat_cpu_ticks(&stat)? as f64 / hz)
}

// ---------------------------------------------------------------------------------------------
// The cgroup.
// ---------------------------------------------------------------------------------------------

/// A memory cgroup (v1) created for one system: the server enters it at exec
/// ([`Cgroup::enter_at_exec`]); dropping it kills every process left in it and removes it.
/// (The kv snapshot tests use it too.)
pub struct Cgroup {
    path: PathBuf,
    procs: CString,
}

impl Cgroup {
    /// Creates `/sys/fs/cgroup/memory/NAME` (an earlier one of that name is emptied and
    /// replaced); an error without a v1 memory controller.
    pub fn create(name: &str) -> Result<Cgroup> {
        let root = Path::new(CGROUP_ROOT);
        if !root.join("memory.stat").is_file() {
            bail!(
                "no cgroup v1 memory controller at {CGROUP_ROOT} (bench snapshot measures each \
                 server's memory in a cgroup of its own)"
            );
        }
        let path = root.join(name);
        let procs = CString::new(path.join("cgroup.procs").as_os_str().as_bytes())
            .context("cgroup path")?;
        let cg = Cgroup { path, procs };
        if cg.path.exists() {
            // A leftover of an earlier run with the same process id: empty it and start over.
            cg.kill_all();
            std::fs::remove_dir(&cg.path)
                .with_context(|| format!("removing the stale cgroup {}", cg.path.display()))?;
        }
        std::fs::create_dir(&cg.path)
            .with_context(|| format!("creating the cgroup {}", cg.path.display()))?;
        Ok(cg)
    }

    /// Make `cmd`'s process join this cgroup between fork and exec (it writes 0 — itself — to
    /// `cgroup.procs`), so that everything it allocates after exec is charged here.
    pub fn enter_at_exec(&self, cmd: &mut Command) {
        let procs = self.procs.clone();
        // SAFETY: open, write and close are async-signal-safe; the path was allocated before the
        // fork, and the error value is built from errno without allocating.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
                Ok(())
            })
        };
    }

    /// Sets `memory.limit_in_bytes` (the group's memory, page cache included).
    pub fn set_limit(&self, bytes: u64) -> Result<()> {
        let p = self.path.join("memory.limit_in_bytes");
        std::fs::write(&p, bytes.to_string()).with_context(|| format!("writing {}", p.display()))
    }

    /// `memory.max_usage_in_bytes`: the group's peak charge, bytes.
    pub fn max_usage(&self) -> Result<u64> {
        let p = self.path.join("memory.max_usage_in_bytes");
        let t = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        t.trim()
            .parse()
            .with_context(|| format!("{} holds {:?}", p.display(), t.trim()))
    }

    /// The group's `cgroup.procs` file: a process joins by writing its pid (or 0) there.
    pub fn procs_path(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The `oom_kill` count of `memory.oom_control` (0 where the kernel does not report it).
    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.path.join("memory.oom_control"))
            .ok()
            .and_then(|t| memory_stat_field(&t, "oom_kill"))
            .unwrap_or(0)
    }

    /// `total_rss` of the cgroup's `memory.stat`, bytes.
    pub fn total_rss(&self) -> Result<u64> {
        let p = self.path.join("memory.stat");
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        memory_stat_field(&text, "total_rss")
            .ok_or_else(|| anyhow!("{} has no total_rss line", p.display()))
    }

    fn pids(&self) -> Vec<libc::pid_t> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// SIGKILL every process in the cgroup until none is left (at most ~5 s); whether it is
    /// empty.
    fn kill_all(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            for pid in pids {
                // SAFETY: kill has no memory effects; these are the benchmark's own servers
                // (and any child they forked), the only processes put in this cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.kill_all() {
            progress::note(&format!(
                "warning: processes {:?} still in {} after SIGKILL",
                self.pids(),
                self.path.display()
            ));
        }
        // A cgroup whose last process just exited may refuse rmdir for a moment (EBUSY).
        for _ in 0..100 {
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        progress::note(&format!(
            "warning: could not remove the cgroup {}",
            self.path.display()
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Clients: the loader, the load, the monitors.
// ---------------------------------------------------------------------------------------------

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from((h::HOST, port))
}

fn connect(port: u16) -> Result<Client> {
    Client::connect(addr(port), CLIENT_TIMEOUT)
        .with_context(|| format!("connecting to port {port}"))
}

/// `INFO section`'s text; `sent` counts the INFO commands this harness sends (to subtract
/// them from the server's command count).
fn info(c: &mut Client, section: &str, sent: &AtomicU64) -> Result<String> {
    sent.fetch_add(1, Ordering::Relaxed);
    match c
        .command(&["INFO", section])
        .with_context(|| format!("INFO {section}"))?
    {
        Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
        other => bail!("INFO {section} answered {other:?}"),
    }
}

fn dbsize(c: &mut Client) -> Result<Reply> {
    c.command(&["DBSIZE"]).context("DBSIZE")
}

/// Load keys 0..`keys` with 1 KB values: pipelined SETs of 256 keys, two connections each
/// loading half of the range.
fn fill(port: u16, keys: u64) -> Result<()> {
    const BATCH: u64 = 256;
    const CONNECTIONS: u64 = 2;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|t| {
                let (lo, hi) = (keys * t / CONNECTIONS, keys * (t + 1) / CONNECTIONS);
                s.spawn(move || -> Result<()> {
                    let mut c = connect(port)?;
                    let value = vec![b'v'; VALUE_LEN];
                    let mut i = lo;
                    while i < hi {
                        if h::interrupted() {
                            bail!("interrupted");
                        }
                        let names: Vec<String> = (i..(i + BATCH).min(hi)).map(key).collect();
                        let batch: Vec<[&[u8]; 3]> = names
                            .iter()
                            .map(|k| [b"SET".as_slice(), k.as_bytes(), value.as_slice()])
                            .collect();
                        c.pipeline(&batch)
                            .with_context(|| format!("loading keys {i}.."))?;
                        i += BATCH;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| anyhow!("a loader thread panicked"))?)
    })?;
    match dbsize(&mut connect(port)?)? {
        Reply::Int(n) if n as u64 == keys => Ok(()),
        other => bail!("DBSIZE after loading {keys} keys answered {other:?}"),
    }
}

/// The redis-benchmark processes of the load; killed when dropped.
struct Load {
    children: Vec<(String, Child, PathBuf)>,
}

impl Load {
    /// `redis-benchmark -P 16 -d 1024 -r keys`: `-t set` with 50 clients for 100 % updates; a
    /// `-t set` and a `-t get` with 25 clients each for 50 %. Outputs in `logs`.
    fn start(port: u16, keys: u64, pct: u32, logs: &Path, tag: &str) -> Result<Load> {
        let tests: Vec<(&str, u32)> = if pct == 100 {
            vec![("set", CLIENTS)]
        } else {
            vec![("set", CLIENTS / 2), ("get", CLIENTS / 2)]
        };
        let mut load = Load {
            children: Vec::new(),
        };
        for (test, clients) in tests {
            let mut c = Command::new("redis-benchmark");
            c.args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(["-t", test, "-P", &PIPELINE.to_string()])
                .args(["-d", &VALUE_LEN.to_string(), "-r", &keys.to_string()])
                .args(["-c", &clients.to_string(), "-n", &REQUESTS.to_string()])
                .arg("-q");
            let base = logs.join(format!("redis-benchmark-{tag}-{test}"));
            let (out, err) = (base.with_extension("out"), base.with_extension("err"));
            c.stdin(Stdio::null())
                .stdout(std::fs::File::create(&out)?)
                .stderr(std::fs::File::create(&err)?);
            h::die_with_parent(&mut c);
            let child = c.spawn().context(
                "running redis-benchmark (install the Debian package redis-tools: \
                 scripts/setup.sh does)",
            )?;
            load.children
                .push((format!("redis-benchmark -t {test}"), child, err));
        }
        Ok(load)
    }

    /// Fail if a client exited: the load would no longer be the one measured.
    fn check(&mut self) -> Result<()> {
        for (what, child, err) in &mut self.children {
            if let Some(st) = child.try_wait()? {
                bail!(
                    "{what} exited ({st}) during the run: {}",
                    h::log_tail(err, 5)
                );
            }
        }
        Ok(())
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sleep `d` in small steps, failing on an interrupt or a load client that exited.
fn wait(d: Duration, load: &mut Load) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if h::interrupted() {
            bail!("interrupted");
        }
        load.check()?;
        std::thread::sleep(
            Duration::from_millis(20).min(end.saturating_duration_since(Instant::now())),
        );
    }
    Ok(())
}

/// (ns since the epoch, value) samples.
type Samples = Vec<(u64, u64)>;

/// The threads that watch a server under load: the cgroup's `total_rss` every 5 ms, `INFO
/// stats`' `total_commands_processed` every 50 ms, and [`PROBES`] probe clients' GET
/// latencies. They stop when told to or when this is dropped.
struct Monitors {
    stop: Arc<AtomicBool>,
    mem: Option<JoinHandle<Result<Samples>>>,
    stats: Option<JoinHandle<Result<Samples>>>,
    probes: Vec<JoinHandle<Result<Samples>>>,
}

/// What the monitors collected: memory (ns, bytes), commands (ns, count), probe GETs (ns at
/// the reply, latency ns).
struct Collected {
    mem: Samples,
    stats: Samples,
    probe: Samples,
}

impl Monitors {
    fn start(
        cg_stat: PathBuf,
        port: u16,
        keys: u64,
        epoch: Instant,
        sent: Arc<AtomicU64>,
    ) -> Result<Monitors> {
        let stop = Arc::new(AtomicBool::new(false));
        let ns = move || epoch.elapsed().as_nanos() as u64;
        let mem = {
            let stop = stop.clone();
            std::thread::spawn(move || -> Result<Samples> {
                let mut v = Vec::new();
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let text = std::fs::read_to_string(&cg_stat)
                        .with_context(|| format!("reading {}", cg_stat.display()))?;
                    let rss = memory_stat_field(&text, "total_rss")
                        .ok_or_else(|| anyhow!("{} has no total_rss", cg_stat.display()))?;
                    v.push((ns(), rss));
                    next += SAMPLE_EVERY;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
                Ok(v)
            })
        };
        let mut stats_c = connect(port)?;
        let stats = {
            let stop = stop.clone();
            std::thread::spawn(move || -> Result<Samples> {
                let mut v = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let text = info(&mut stats_c, "stats", &sent)?;
                    v.push((ns(), info_u64(&text, "stats", "total_commands_processed")?));
                    std::thread::sleep(STATS_EVERY);
                }
                Ok(v)
            })
        };
        let mut probes = Vec::new();
        for p in 0..PROBES {
            let mut probe_c = connect(port)?;
            let stop = stop.clone();
            probes.push(std::thread::spawn(move || -> Result<Samples> {
                let mut v = Vec::new();
                let mut rng =
                    (0x9e37_79b9_7f4a_7c15u64 * (p + 1)) ^ epoch.elapsed().as_nanos() as u64;
                while !stop.load(Ordering::Relaxed) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let k = key(rng % keys);
                    let t = Instant::now();
                    let r = probe_c.command(&["GET", k.as_str()]).context("probe GET")?;
                    let lat = t.elapsed().as_nanos() as u64;
                    match r {
                        Reply::Bulk(Some(b)) if b.len() == VALUE_LEN => v.push((ns(), lat)),
                        Reply::Bulk(b) => bail!(
                            "probe: GET {k} answered {} bytes, {VALUE_LEN} expected",
                            b.map_or(-1, |b| b.len() as i64)
                        ),
                        other => bail!("probe: GET {k} answered {other:?}"),
                    }
                    std::thread::sleep(PROBE_GAP);
                }
                Ok(v)
            }));
        }
        Ok(Monitors {
            stop,
            mem: Some(mem),
            stats: Some(stats),
            probes,
        })
    }

    /// Stop the threads and collect their samples (the first thread's error, if any).
    fn finish(mut self) -> Result<Collected> {
        self.stop.store(true, Ordering::Relaxed);
        let join = |handle: Option<JoinHandle<Result<Samples>>>, what: &str| -> Result<Samples> {
            handle
                .expect("joined once")
                .join()
                .map_err(|_| anyhow!("the {what} thread panicked"))?
                .with_context(|| format!("the {what} thread"))
        };
        let mem = join(self.mem.take(), "memory sampler")?;
        let stats = join(self.stats.take(), "INFO stats sampler")?;
        let mut probe = Vec::new();
        for handle in std::mem::take(&mut self.probes) {
            probe.extend(join(Some(handle), "probe client")?);
        }
        Ok(Collected { mem, stats, probe })
    }
}

impl Drop for Monitors {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// One snapshot, one restore, one system.
// ---------------------------------------------------------------------------------------------

/// One snapshot's figures: a `results` entry.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// wp, fork-mdc, fork or redis.
    pub system: &'static str,
    /// The load's share of SETs: 50 or 100.
    pub update_pct: u32,
    /// (peak total_rss during the snapshot − before) / before × 100.
    pub extra_memory_pct: f64,
    /// From BGSAVE to the poll that saw `rdb_bgsave_in_progress:0`.
    pub snapshot_ms: f64,
    /// tiermem: `snapshot_last_pause_us`; redis: `latest_fork_usec`.
    pub pause_ms: Option<f64>,
    /// Commands the server processed during the snapshot (this harness's INFO commands
    /// subtracted) per second.
    pub ops_per_s_during: f64,
    /// p99 of the probe clients' single GETs during the snapshot.
    pub p99_us_during: Option<f64>,
    /// The snapshot file's size.
    pub file_bytes: u64,
    /// Restart after kill -9 until PING and DBSIZE == keys: measured once per system, after
    /// its last snapshot (the 100 % one), so set on that row only.
    pub restore_ms: Option<f64>,
    /// total_rss just before BGSAVE.
    pub before_rss_bytes: u64,
    /// The largest total_rss sample during the snapshot.
    pub peak_rss_bytes: u64,
    /// The server's CPU (its threads and reaped children) during the snapshot.
    pub cpu_s: f64,
    /// The snapshot's wall time, for comparison with `cpu_s`.
    pub wall_s: f64,
    /// Commands per second over the last second before BGSAVE.
    pub ops_per_s_before: Option<f64>,
    /// The probe's p99 over the last second before BGSAVE.
    pub p99_us_before: Option<f64>,
    /// Probe GETs answered during the snapshot (the p99's samples).
    pub probe_samples_during: u64,
    /// total_rss samples taken during the snapshot.
    pub memory_samples_during: u64,
    /// The largest gap between two memory samples during the snapshot (a starved sampler
    /// could miss a short peak).
    pub max_sample_gap_ms: f64,
    /// The server's own account (`INFO memory` `used_memory`) before BGSAVE.
    pub used_memory_bytes: Option<u64>,
    /// tiermem: `snapshot_extra_bytes_bound`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_extra_bytes_bound: Option<u64>,
    /// tiermem: `snapshot_last_file_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_last_file_bytes: Option<u64>,
}

/// Memory and throughput over time around one snapshot, for the chart: (ms since BGSAVE, MB)
/// and (ms since BGSAVE, thousand commands/s).
struct Trace {
    system: &'static str,
    pct: u32,
    mem: Vec<(f64, f64)>,
    ops: Vec<(f64, f64)>,
    end_ms: f64,
}

/// What one system's runs share.
struct Ctx<'a> {
    sys: System,
    keys: u64,
    cg: &'a Cgroup,
    data: PathBuf,
    logs: PathBuf,
    heap: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The p99 (µs) of the latencies (ns) of `probe` samples taken in `[a, b]` ns, and their count.
fn p99_us(probe: &Samples, a: u64, b: u64) -> (Option<f64>, u64) {
    let Ok(mut hist) = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3) else {
        return (None, 0);
    };
    for &(_, lat) in probe.iter().filter(|(t, _)| (a..=b).contains(t)) {
        hist.saturating_record((lat / 1000).max(1));
    }
    if hist.is_empty() {
        (None, 0)
    } else {
        (Some(hist.value_at_quantile(0.99) as f64), hist.len())
    }
}

/// One snapshot under a load of `pct` % updates on the running `server`.
fn snapshot_once(cx: &Ctx<'_>, server: &Server, pct: u32) -> Result<(Row, Trace)> {
    let name = cx.sys.name();
    let port = server.port();
    let sent = Arc::new(AtomicU64::new(0));
    let mut ctl = connect(port)?;
    // No snapshot may be running already.
    let text = info(&mut ctl, "persistence", &sent)?;
    if info_u64(&text, "persistence", "rdb_bgsave_in_progress")? != 0 {
        bail!("a snapshot is in progress before BGSAVE was sent");
    }
    let mut load = Load::start(port, cx.keys, pct, &cx.logs, &format!("{name}-{pct}"))?;
    let epoch = Instant::now();
    let ns = |t: Instant| t.duration_since(epoch).as_nanos() as u64;
    let monitors = Monitors::start(
        cx.cg.path.join("memory.stat"),
        port,
        cx.keys,
        epoch,
        sent.clone(),
    )?;
    wait(WARMUP, &mut load)?;

    let used_memory = info_u64(&info(&mut ctl, "memory", &sent)?, "memory", "used_memory").ok();
    let before = cx.cg.total_rss()?;
    let cpu0 = server_cpu_s(server.pid());
    let n0 = sent.load(Ordering::Relaxed);
    let c0 = info_u64(
        &info(&mut ctl, "stats", &sent)?,
        "stats",
        "total_commands_processed",
    )?;
    let wall0 = SystemTime::now();
    let t_bg = Instant::now();
    match ctl.command(&["BGSAVE"]).context("BGSAVE")? {
        Reply::Simple(s) if s.starts_with("Background saving") => {}
        other => bail!("BGSAVE answered {other:?}"),
    }
    let deadline = t_bg + SNAPSHOT_TIMEOUT;
    let (t_done, persistence) = loop {
        let text = info(&mut ctl, "persistence", &sent)?;
        let now = Instant::now();
        if info_u64(&text, "persistence", "rdb_bgsave_in_progress")? == 0 {
            break (now, text);
        }
        if now > deadline {
            bail!(
                "the snapshot was still in progress after {} s",
                SNAPSHOT_TIMEOUT.as_secs()
            );
        }
        if h::interrupted() {
            bail!("interrupted");
        }
        load.check()?;
        std::thread::sleep(SAMPLE_EVERY);
    };
    let n1 = sent.load(Ordering::Relaxed);
    let stats = info(&mut ctl, "stats", &sent)?;
    let c1 = info_u64(&stats, "stats", "total_commands_processed")?;
    let cpu1 = server_cpu_s(server.pid());
    let window = t_done - t_bg;
    match info_field(&persistence, "rdb_last_bgsave_status") {
        Some("ok") => {}
        Some(s) => bail!(
            "the snapshot failed: rdb_last_bgsave_status:{s} (log: {})",
            h::log_tail(server.log(), 5)
        ),
        None => bail!("INFO persistence has no rdb_last_bgsave_status field"),
    }
    let pause_us = match cx.sys {
        System::Tiermem(_) => info_u64(&persistence, "persistence", "snapshot_last_pause_us")?,
        System::Redis => info_u64(&stats, "stats", "latest_fork_usec")?,
    };
    let (bound, last_file) = match cx.sys {
        System::Tiermem(_) => (
            Some(info_u64(
                &persistence,
                "persistence",
                "snapshot_extra_bytes_bound",
            )?),
            Some(info_u64(
                &persistence,
                "persistence",
                "snapshot_last_file_bytes",
            )?),
        ),
        System::Redis => (None, None),
    };
    if let Some(m) = info_field(&persistence, "snapshot_method") {
        if let System::Tiermem(method) = cx.sys {
            if m != method {
                bail!("INFO persistence says snapshot_method:{m}, {method} was configured");
            }
        }
    }
    let file = cx.data.join(cx.sys.dbfilename());
    let meta = std::fs::metadata(&file)
        .with_context(|| format!("the snapshot file {} after BGSAVE", file.display()))?;
    let written = meta.modified()?;
    if written + Duration::from_secs(2) < wall0 {
        bail!(
            "the snapshot file {} was not rewritten by this BGSAVE",
            file.display()
        );
    }
    wait(TAIL, &mut load)?;
    let got = monitors.finish()?;
    drop(load);

    // Memory: the peak during the snapshot (a sample just after its end included: the 5 ms
    // polls may see the end up to 5 ms late, but not early).
    let (a, b) = (ns(t_bg), ns(t_done));
    let during: Vec<&(u64, u64)> = got
        .mem
        .iter()
        .filter(|(t, _)| (a..=b).contains(t))
        .collect();
    let peak = during
        .iter()
        .map(|x| x.1)
        .chain(got.mem.iter().find(|(t, _)| *t > b).map(|x| x.1))
        .max()
        .unwrap_or(before)
        .max(before);
    let max_gap_ns = during
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or(0);
    // Throughput: the server's commands over the window, this harness's INFO commands (and the
    // BGSAVE) taken out.
    let mine = (n1 - n0) + 1;
    let ops_during = (c1.saturating_sub(c0).saturating_sub(mine)) as f64 / window.as_secs_f64();
    let second = 1_000_000_000u64;
    let before_pts: Vec<&(u64, u64)> = got
        .stats
        .iter()
        .filter(|(t, _)| *t <= a && *t + second >= a)
        .collect();
    let ops_before = match (before_pts.first(), before_pts.last()) {
        (Some(x), Some(y)) if y.0 > x.0 => {
            Some(y.1.saturating_sub(x.1) as f64 / ((y.0 - x.0) as f64 / 1e9))
        }
        _ => None,
    };
    let (p99, probes) = p99_us(&got.probe, a, b);
    let (p99_before, _) = p99_us(&got.probe, a.saturating_sub(second), a);
    let cpu_s = match (cpu0, cpu1) {
        (Some(x), Some(y)) => y - x,
        _ => f64::NAN,
    };
    let rel_ms = |t: u64| (t as f64 - a as f64) / 1e6;
    let ops_trace: Vec<(f64, f64)> = got
        .stats
        .windows(2)
        .filter(|w| w[1].0 > w[0].0)
        .map(|w| {
            (
                rel_ms(w[1].0),
                w[1].1.saturating_sub(w[0].1) as f64 / ((w[1].0 - w[0].0) as f64 / 1e6),
            )
        })
        .collect();
    let row = Row {
        system: name,
        update_pct: pct,
        extra_memory_pct: round((peak - before) as f64 / before.max(1) as f64 * 100.0, 2),
        snapshot_ms: round(ms(window), 1),
        pause_ms: Some(round(pause_us as f64 / 1e3, 3)),
        ops_per_s_during: round(ops_during, 0),
        p99_us_during: p99,
        file_bytes: meta.len(),
        restore_ms: None,
        before_rss_bytes: before,
        peak_rss_bytes: peak,
        cpu_s: round(cpu_s, 2),
        wall_s: round(window.as_secs_f64(), 3),
        ops_per_s_before: ops_before.map(|x| round(x, 0)),
        p99_us_before: p99_before,
        probe_samples_during: probes,
        memory_samples_during: during.len() as u64,
        max_sample_gap_ms: round(max_gap_ns as f64 / 1e6, 1),
        used_memory_bytes: used_memory,
        snapshot_extra_bytes_bound: bound,
        snapshot_last_file_bytes: last_file,
    };
    let trace = Trace {
        system: name,
        pct,
        mem: got
            .mem
            .iter()
            .map(|&(t, v)| (rel_ms(t), v as f64 / 1e6))
            .collect(),
        ops: ops_trace,
        end_ms: ms(window),
    };
    Ok((row, trace))
}

/// Start `cx.sys` on `cx.data` (in its cgroup) on a free port; retries with another port if
/// the one chosen was taken in the meantime.
fn start(cx: &Ctx<'_>, tag: &str, timeout: Duration) -> Result<Server> {
    let mut last = None;
    for attempt in 0..3 {
        let port = h::free_port()?;
        let mut cmd = cx.sys.command(port, &cx.data, cx.heap)?;
        cx.cg.enter_at_exec(&mut cmd);
        let log = cx
            .logs
            .join(format!("{}-{tag}-{attempt}.log", cx.sys.name()));
        match Server::start(cx.sys.name(), cmd, port, &log, timeout) {
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

/// Stop `server` as the system wants; a warning if it had to be killed.
fn stop(sys: System, server: Server, warnings: &mut Vec<String>) -> Result<()> {
    let log = server.log().to_path_buf();
    let (status, clean) = server.stop(sys.stop(), STOP_TIMEOUT)?;
    if !clean {
        warnings.push(format!(
            "{}: still running {} s after {:?}, killed ({status}); log: {}",
            sys.name(),
            STOP_TIMEOUT.as_secs(),
            sys.stop(),
            h::log_tail(&log, 5)
        ));
    }
    Ok(())
}

/// Restart the system on its directory (its server killed before) and time it until it
/// answers PING and holds every key; then check random keys and stop it.
fn restore(cx: &Ctx<'_>, warnings: &mut Vec<String>) -> Result<f64> {
    // Both systems read their file from the disk: redis writes its RDB through the page
    // cache, tiermem with O_DIRECT, so a warm cache would favour redis. Per file, no global
    // setting touched.
    drop_file_caches(&cx.data);
    let t0 = Instant::now();
    let server = start(cx, "restore", RESTORE_TIMEOUT)?;
    let mut c = connect(server.port())?;
    loop {
        match dbsize(&mut c)? {
            Reply::Int(n) if n as u64 == cx.keys => break,
            // Still loading (`-LOADING`), or not every key yet.
            Reply::Int(_) | Reply::Error(_) => {}
            other => bail!("restore: DBSIZE answered {other:?}"),
        }
        if t0.elapsed() > RESTORE_TIMEOUT {
            bail!(
                "restore: DBSIZE is not {} {} s after the start",
                cx.keys,
                RESTORE_TIMEOUT.as_secs()
            );
        }
        if h::interrupted() {
            bail!("interrupted");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let restore_ms = ms(t0.elapsed());
    let mut rng = 0x2545_f491_4f6c_dd1du64 ^ t0.elapsed().as_nanos() as u64;
    for _ in 0..VERIFY_KEYS {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = key(rng % cx.keys);
        match c
            .command(&["GET", k.as_str()])
            .context("GET after the restore")?
        {
            Reply::Bulk(Some(v)) if v.len() == VALUE_LEN => {}
            other => bail!(
                "restore: GET {k} answered {}, a {VALUE_LEN}-byte value expected",
                match other {
                    Reply::Bulk(Some(v)) => format!("{} bytes", v.len()),
                    o => format!("{o:?}"),
                }
            ),
        }
    }
    drop(c);
    stop(cx.sys, server, warnings)?;
    Ok(restore_ms)
}

/// Writes back and drops from the page cache every file in `dir` (`fdatasync`, then
/// `POSIX_FADV_DONTNEED`); errors are ignored (a file that stays cached only makes its
/// restore faster).
fn drop_file_caches(dir: &Path) {
    use std::os::fd::AsRawFd;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if let Ok(f) = std::fs::File::open(e.path()) {
            let _ = f.sync_data();
            // SAFETY: advice on an open descriptor; no memory is involved.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// Everything measured on one system.
struct SystemRun {
    rows: Vec<Row>,
    traces: Vec<Trace>,
}

fn run_system(
    sys: System,
    keys: u64,
    work: &Path,
    json: bool,
    warnings: &mut Vec<String>,
) -> Result<SystemRun> {
    let name = sys.name();
    // Four steps per system (load, 50 %, 100 %, restore); what each measured as a note.
    let say = |m: &str| progress(json, &format!("{name}: {m}"));
    let tell = |m: &str| progress::note(&format!("{name}: {m}"));
    let cg = Cgroup::create(&format!(
        "tiermem-bench-snapshot-{}-{name}",
        std::process::id()
    ))?;
    let cx = Ctx {
        sys,
        keys,
        cg: &cg,
        data: work.join(name),
        logs: work.join("logs"),
        heap: heap_bytes(keys),
    };
    std::fs::create_dir_all(&cx.data).with_context(|| format!("creating {}", cx.data.display()))?;
    say(&format!("loading {keys} keys of {VALUE_LEN} B"));
    let server = start(&cx, "run", START_TIMEOUT)?;
    let with_log =
        |e: anyhow::Error, s: &Server| anyhow!("{e:#} (server log: {})", h::log_tail(s.log(), 5));
    let t = Instant::now();
    fill(server.port(), keys).map_err(|e| with_log(e, &server))?;
    let rss = cg.total_rss()?;
    tell(&format!(
        "loaded in {:.1} s, total_rss {} MiB",
        t.elapsed().as_secs_f64(),
        rss >> 20
    ));
    if let System::Tiermem(_) = sys {
        let text = info(&mut connect(server.port())?, "memory", &AtomicU64::new(0))?;
        if let Ok(used) = info_u64(&text, "memory", "tiermem_heap_used_bytes") {
            if used > cx.heap / 10 * 8 {
                warnings.push(format!(
                    "{name}: the loaded keys take {used} B of the {} B heap (over 80 %): \
                     HEAP_BYTES_PER_KEY is out of date",
                    cx.heap
                ));
            }
        }
    }
    let mut rows = Vec::new();
    let mut traces = Vec::new();
    for pct in UPDATE_PCTS {
        say(&format!("snapshot under {pct} % updates"));
        let (row, trace) = snapshot_once(&cx, &server, pct).map_err(|e| with_log(e, &server))?;
        tell(&format!(
            "{pct} %: extra memory {:.1} %, {:.0} ms, {:.0} ops/s",
            row.extra_memory_pct, row.snapshot_ms, row.ops_per_s_during
        ));
        rows.push(row);
        traces.push(trace);
    }
    say("restore: kill -9, restart on the same directory");
    // Dropping the server kills it (SIGKILL) and reaps it; nothing else may be left behind.
    drop(server);
    if !cg.kill_all() {
        bail!("processes left in {} after kill -9", cg.path.display());
    }
    let restore_ms = restore(&cx, warnings)?;
    tell(&format!("restored in {restore_ms:.0} ms"));
    if let Some(last) = rows.last_mut() {
        last.restore_ms = Some(round(restore_ms, 1));
    }
    let _ = std::fs::remove_dir_all(&cx.data);
    Ok(SystemRun { rows, traces })
}

// ---------------------------------------------------------------------------------------------
// The report.
// ---------------------------------------------------------------------------------------------

/// A figure at 50 % and at 100 % updates.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ByPct {
    /// At 50 % updates.
    #[serde(rename = "50")]
    pub p50: Option<f64>,
    /// At 100 % updates.
    #[serde(rename = "100")]
    pub p100: Option<f64>,
}

impl ByPct {
    fn get(&self, pct: u32) -> Option<f64> {
        if pct == 50 {
            self.p50
        } else {
            self.p100
        }
    }
}

/// A figure per system.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PerSystem {
    /// tiermem-kv, snapshot-method wp.
    pub wp: ByPct,
    /// tiermem-kv, snapshot-method fork-mdc.
    #[serde(rename = "fork-mdc")]
    pub fork_mdc: ByPct,
    /// tiermem-kv, snapshot-method fork.
    pub fork: ByPct,
    /// redis-server's BGSAVE.
    pub redis: ByPct,
}

/// A must-have or should-have figure against its target.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// The figure's key in the report (and what it is compared with).
    pub figure: String,
    /// Its value; `None` when not measured.
    pub value: Option<f64>,
    /// The target, e.g. `<= 0.2`.
    pub target: String,
    /// "must" or "should".
    pub level: &'static str,
    /// "met", "MISSED", "not measured", or "invalid: why".
    pub status: String,
}

/// How one system was run.
#[derive(Serialize)]
pub struct SystemInfo {
    /// wp, fork-mdc, fork or redis.
    pub name: &'static str,
    /// Its server's command line (P: port, H: heap bytes, D: data directory).
    pub command: String,
    /// "measured" or "error".
    pub status: &'static str,
}

/// The run's parameters.
#[derive(Serialize)]
pub struct Params {
    /// Whether --quick was given.
    pub quick: bool,
    /// Keys loaded (each server holds all of them).
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// The load's update percentages, in the order run.
    pub update_pcts: [u32; 2],
    /// The load's clients.
    pub load: String,
    /// How long the load runs before BGSAVE.
    pub warmup_s: f64,
    /// `--heap-size` of the tiermem-kv servers.
    pub tiermem_heap_bytes: u64,
    /// total_rss sampling interval.
    pub memory_sample_ms: f64,
    /// INFO persistence polling interval.
    pub info_poll_ms: f64,
    /// The latency probe.
    pub probe: String,
    /// Where the data and snapshot files were.
    pub storage_dir: String,
    /// /sys/kernel/mm/transparent_hugepage/enabled.
    pub transparent_hugepages: String,
}

/// How the figures were measured: one sentence per figure of [`Row`].
#[derive(Serialize)]
pub struct Method {
    pub extra_memory_pct: &'static str,
    pub snapshot_ms: &'static str,
    pub pause_ms: &'static str,
    pub ops_per_s_during: &'static str,
    pub p99_us_during: &'static str,
    pub file_bytes: &'static str,
    pub restore_ms: &'static str,
    pub cpu_s: &'static str,
}

/// What `bench snapshot` measured; `--json` prints it as is.
#[derive(Serialize)]
pub struct Report {
    /// One row per system and update percentage.
    pub results: Vec<Row>,
    /// Every system's extra memory at 50 % and 100 % updates.
    pub extra_memory_pct: PerSystem,
    /// tiermem's `snapshot_extra_bytes_bound` over wp's total_rss before its 100 % snapshot.
    pub extra_memory_bound_pct: Option<f64>,
    /// wp / fork extra memory.
    pub extra_memory_ratio_vs_fork: ByPct,
    /// wp / redis extra memory.
    pub extra_memory_ratio_vs_redis: ByPct,
    /// fork-mdc / fork extra memory.
    pub mdc_extra_memory_ratio_vs_fork: ByPct,
    /// wp / fork snapshot time at 100 % updates.
    pub snapshot_time_ratio_vs_fork: Option<f64>,
    /// wp / fork ops/s during the snapshot at 100 % updates.
    pub throughput_during_snapshot_ratio_vs_fork: Option<f64>,
    /// wp / fork pause at 100 % updates.
    pub pause_ratio_vs_fork: Option<f64>,
    /// wp / redis restore time.
    pub restore_time_ratio_vs_redis: Option<f64>,
    /// The issue's must- and should-have figures against their targets.
    pub must: Vec<Check>,
    /// Systems that failed: name -> what went wrong.
    pub errors: BTreeMap<&'static str, String>,
    /// Things worth knowing that did not stop the run.
    pub warnings: Vec<String>,
    /// How each system was run.
    pub systems: Vec<SystemInfo>,
    /// The run's parameters.
    pub parameters: Params,
    /// How each figure was measured.
    pub method: Method,
    /// What it ran on.
    pub machine: machine::Machine,
    /// The whole run's wall time.
    pub seconds: f64,
    /// Where the chart was written, for the table.
    #[serde(skip)]
    pub plot_path: Option<PathBuf>,
}

/// Removes the run's working directory (and the storage root, if this run created it and it is
/// empty) when dropped, unless `TIERMEM_BENCH_KEEP_LOGS` is set.
struct Cleanup {
    work: PathBuf,
    root_created: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::env::var_os("TIERMEM_BENCH_KEEP_LOGS").is_some() {
            progress::note(&format!("logs kept in {}", self.work.display()));
            return;
        }
        let _ = std::fs::remove_dir_all(&self.work);
        if let Some(root) = &self.root_created {
            let _ = std::fs::remove_dir(root);
        }
    }
}

fn is_tmpfs(dir: &Path) -> Result<bool> {
    tiermem_media::on_tmpfs(dir).with_context(|| format!("statfs {}", dir.display()))
}

fn storage_root(o: &SnapshotOpts) -> PathBuf {
    o.dir
        .clone()
        .or_else(|| std::env::var_os(DIR_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// `bench snapshot`'s options.
pub type Options = SnapshotOpts;

/// Run the benchmark: every system, both update percentages, the restores, and the chart to
/// `o.bench.plot` when set. A system that fails is recorded in `Report::errors` (see
/// [`crate::Report::outcome`]).
pub fn run(o: &Options) -> Result<Report> {
    if let Some(p) = &o.bench.plot {
        plot::check_path(p)?;
    }
    let t0 = Instant::now();
    let (quick, json) = (o.bench.quick, o.bench.json);
    let systems: Vec<System> = if o.systems.is_empty() {
        SYSTEMS.iter().filter_map(|n| System::of(n)).collect()
    } else {
        o.systems
            .iter()
            .map(|n| {
                System::of(n).ok_or_else(|| {
                    anyhow!(
                        "--systems: unknown system {n:?} (known: {})",
                        SYSTEMS.join(", ")
                    )
                })
            })
            .collect::<Result<_>>()?
    };
    let keys = if quick { QUICK_KEYS } else { FULL_KEYS };
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
    if !Path::new(CGROUP_ROOT).join("memory.stat").is_file() {
        bail!("no cgroup v1 memory controller mounted at {CGROUP_ROOT}");
    }
    let root = storage_root(o);
    let root_created = (!root.exists()).then(|| root.clone());
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    if is_tmpfs(&root)? {
        if let Some(r) = &root_created {
            let _ = std::fs::remove_dir(r);
        }
        bail!(
            "{} is on tmpfs: snapshots must go to disk (give --dir or ${DIR_ENV})",
            root.display()
        );
    }
    let work = root.join(format!("run-{}", std::process::id()));
    let _cleanup = Cleanup {
        work: work.clone(),
        root_created,
    };
    std::fs::create_dir_all(work.join("logs"))
        .with_context(|| format!("creating {}", work.display()))?;
    h::catch_interrupts();
    progress::plan(
        "bench snapshot",
        Some(systems.len() as u64 * 4 + o.bench.plot.is_some() as u64),
    );

    let mut errors: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut results: Vec<Row> = Vec::new();
    let mut traces: Vec<Trace> = Vec::new();
    for &sys in &systems {
        match run_system(sys, keys, &work, json, &mut warnings) {
            Ok(r) => {
                results.extend(r.rows);
                traces.extend(r.traces);
            }
            Err(e) => {
                if h::interrupted() {
                    bail!(
                        "interrupted: servers killed, cgroups and {} removed",
                        work.display()
                    );
                }
                let msg = crate::error_chain(&e);
                let prefix = format!("{}: ", sys.name());
                let msg = msg.strip_prefix(&prefix).unwrap_or(&msg).to_string();
                progress::note(&format!("{}: FAILED: {msg}", sys.name()));
                errors.insert(sys.name(), msg);
            }
        }
    }

    let row = |s: &str, pct: u32| {
        results
            .iter()
            .find(|r| r.system == s && r.update_pct == pct)
    };
    let by_pct = |f: &dyn Fn(u32) -> Option<f64>| ByPct {
        p50: f(50),
        p100: f(100),
    };
    let extra = |s: &str| by_pct(&|p| row(s, p).map(|r| r.extra_memory_pct));
    let extra_memory_pct = PerSystem {
        wp: extra("wp"),
        fork_mdc: extra("fork-mdc"),
        fork: extra("fork"),
        redis: extra("redis"),
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(round(a / b, 3)),
        _ => None,
    };
    let extra_memory_bound_pct = row("wp", 100).and_then(|r| {
        let b = r.snapshot_extra_bytes_bound? as f64;
        Some(round(b / r.before_rss_bytes.max(1) as f64 * 100.0, 3))
    });
    let vs = |a: &ByPct, b: &ByPct| by_pct(&|p| ratio(a.get(p), b.get(p)));
    let e = &extra_memory_pct;
    let extra_memory_ratio_vs_fork = vs(&e.wp, &e.fork);
    let extra_memory_ratio_vs_redis = vs(&e.wp, &e.redis);
    let mdc_extra_memory_ratio_vs_fork = vs(&e.fork_mdc, &e.fork);
    let at100 = |s: &str, f: fn(&Row) -> Option<f64>| row(s, 100).and_then(f);
    let snapshot_time_ratio_vs_fork = ratio(
        at100("wp", |r| Some(r.snapshot_ms)),
        at100("fork", |r| Some(r.snapshot_ms)),
    );
    let throughput_during_snapshot_ratio_vs_fork = ratio(
        at100("wp", |r| Some(r.ops_per_s_during)),
        at100("fork", |r| Some(r.ops_per_s_during)),
    );
    let pause_ratio_vs_fork = ratio(at100("wp", |r| r.pause_ms), at100("fork", |r| r.pause_ms));
    let restore_time_ratio_vs_redis = ratio(
        at100("wp", |r| r.restore_ms),
        at100("redis", |r| r.restore_ms),
    );

    let chk = |level: &'static str,
               figure: &str,
               value: Option<f64>,
               target: String,
               ok: &dyn Fn(f64) -> bool,
               invalid: Option<String>| Check {
        figure: figure.to_string(),
        value,
        target,
        level,
        status: match (value, invalid) {
            (None, _) => "not measured".into(),
            (Some(_), Some(why)) => format!("invalid: {why}"),
            (Some(v), None) if ok(v) => "met".into(),
            (Some(_), None) => "MISSED".into(),
        },
    };
    // A ratio against a forking baseline means something only if that baseline copied much.
    let baseline_invalid = |s: &str, x: &ByPct| match x.p100 {
        Some(v) if v < 50.0 => Some(format!("{s}'s extra memory at 100 % is {v:.1} % (< 50 %)")),
        _ => None,
    };
    let bound1 = extra_memory_bound_pct.map(|b| b + 1.0);
    let mut must = Vec::new();
    for pct in UPDATE_PCTS {
        must.push(chk(
            "must",
            &format!("extra_memory_pct.wp.{pct}"),
            e.wp.get(pct),
            "<= 10".into(),
            &|v| v <= 10.0,
            None,
        ));
    }
    for pct in UPDATE_PCTS {
        must.push(chk(
            "must",
            &format!("extra_memory_pct.wp.{pct} vs extra_memory_bound_pct + 1"),
            e.wp.get(pct),
            bound1.map_or("<= bound + 1 (bound not measured)".into(), |b| {
                format!("<= {b:.2}")
            }),
            &|v| bound1.is_some_and(|b| v <= b),
            None,
        ));
    }
    must.push(chk(
        "must",
        "extra_memory_ratio_vs_fork.100",
        extra_memory_ratio_vs_fork.p100,
        "<= 0.2 (valid if fork's extra at 100 % >= 50 %)".into(),
        &|v| v <= 0.2,
        baseline_invalid("fork", &e.fork),
    ));
    must.push(chk(
        "must",
        "extra_memory_ratio_vs_redis.100",
        extra_memory_ratio_vs_redis.p100,
        "<= 0.2 (valid if redis's extra at 100 % >= 50 %)".into(),
        &|v| v <= 0.2,
        baseline_invalid("redis", &e.redis),
    ));
    must.push(chk(
        "must",
        "snapshot_time_ratio_vs_fork",
        snapshot_time_ratio_vs_fork,
        "<= 1.10".into(),
        &|v| v <= 1.10,
        None,
    ));
    must.push(chk(
        "must",
        "throughput_during_snapshot_ratio_vs_fork",
        throughput_during_snapshot_ratio_vs_fork,
        ">= 0.90".into(),
        &|v| v >= 0.90,
        None,
    ));
    must.push(chk(
        "should",
        "mdc_extra_memory_ratio_vs_fork.50",
        mdc_extra_memory_ratio_vs_fork.p50,
        "<= 0.6".into(),
        &|v| v <= 0.6,
        None,
    ));
    must.push(chk(
        "should",
        "pause_ratio_vs_fork",
        pause_ratio_vs_fork,
        "<= 1.0".into(),
        &|v| v <= 1.0,
        None,
    ));
    must.push(chk(
        "should",
        "restore_time_ratio_vs_redis",
        restore_time_ratio_vs_redis,
        "<= 1.0".into(),
        &|v| v <= 1.0,
        None,
    ));

    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let report = Report {
        results,
        extra_memory_pct,
        extra_memory_bound_pct,
        extra_memory_ratio_vs_fork,
        extra_memory_ratio_vs_redis,
        mdc_extra_memory_ratio_vs_fork,
        snapshot_time_ratio_vs_fork,
        throughput_during_snapshot_ratio_vs_fork,
        pause_ratio_vs_fork,
        restore_time_ratio_vs_redis,
        must,
        systems: systems
            .iter()
            .map(|s| SystemInfo {
                name: s.name(),
                command: s.describe(),
                status: if errors.contains_key(s.name()) {
                    "error"
                } else {
                    "measured"
                },
            })
            .collect(),
        errors,
        warnings,
        parameters: Params {
            quick,
            keys,
            value_bytes: VALUE_LEN,
            update_pcts: UPDATE_PCTS,
            load: format!(
                "redis-benchmark -P {PIPELINE} -d {VALUE_LEN} -r {keys} -n {REQUESTS} -q: 100 %: \
                 -t set -c {CLIENTS}; 50 %: -t set -c {h} and -t get -c {h} concurrently; killed \
                 {:.1} s after the snapshot",
                TAIL.as_secs_f64(),
                h = CLIENTS / 2
            ),
            warmup_s: WARMUP.as_secs_f64(),
            tiermem_heap_bytes: heap_bytes(keys),
            memory_sample_ms: ms(SAMPLE_EVERY),
            info_poll_ms: ms(SAMPLE_EVERY),
            probe: format!(
                "{PROBES} connections, each a GET of a random existing key at a time, {} ms \
                 apart",
                ms(PROBE_GAP)
            ),
            storage_dir: root.display().to_string(),
            transparent_hugepages: thp,
        },
        method: Method {
            extra_memory_pct: "(peak of the server cgroup's memory.stat total_rss, sampled every \
                               5 ms from BGSAVE until rdb_bgsave_in_progress:0 was seen, the \
                               next sample included − total_rss just before BGSAVE) / the \
                               latter × 100; anonymous memory of the server and any child it \
                               forked, page cache excluded",
            snapshot_ms: "wall time from sending BGSAVE to the INFO persistence poll (every \
                          5 ms) that saw rdb_bgsave_in_progress:0 (redis reaps its child in \
                          serverCron, hz 10: up to 100 ms after the child exited)",
            pause_ms: "tiermem: INFO persistence snapshot_last_pause_us; redis: INFO stats \
                       latest_fork_usec",
            ops_per_s_during: "INFO stats total_commands_processed after − before the \
                               snapshot, minus this harness's INFO commands and the BGSAVE, \
                               over snapshot_ms (the probe's GETs are counted: they are \
                               served)",
            p99_us_during: "99th percentile (HdrHistogram, 3 digits) of the probe clients' \
                            single GETs answered during the snapshot",
            file_bytes: "size of the snapshot file (dbfilename in the data directory) after \
                         the snapshot",
            restore_ms: "after the 100 % snapshot, with the load stopped: the server killed \
                         (SIGKILL) and restarted on the same directory; from the spawn until \
                         PING answered +PONG (polled every 25 ms) and DBSIZE equals the keys \
                         (polled every 1 ms); the file is in the page cache, as just written; \
                         16 random keys checked to hold 1 KB values",
            cpu_s: "the server process's utime + stime + cutime + cstime (/proc/PID/stat: a \
                    forked child's CPU once it is reaped) over the snapshot; the clients' \
                    CPU is not counted",
        },
        machine: machine::describe(),
        seconds: round(t0.elapsed().as_secs_f64(), 1),
        plot_path: o.bench.plot.clone(),
    };
    if let Some(path) = &o.bench.plot {
        draw(&traces, &systems, path)?;
        progress::step(&format!("chart written to {}", path.display()));
    }
    Ok(report)
}

/// The chart: total_rss (MB) and throughput over time around the snapshots, one line per
/// system, a panel per quantity and update percentage (the paper's Fig. 5.5).
fn draw(traces: &[Trace], systems: &[System], path: &Path) -> Result<()> {
    /// One trace cut to the chart's range, with its colour.
    struct Cut {
        pct: u32,
        color: usize,
        label: String,
        mem: Vec<(f64, f64)>,
        ops: Vec<(f64, f64)>,
    }
    // From a second before BGSAVE to the end of the tail.
    let keep = |pts: &[(f64, f64)]| -> Vec<(f64, f64)> {
        pts.iter().copied().filter(|p| p.0 >= -1000.0).collect()
    };
    let data: Vec<Cut> = traces
        .iter()
        .map(|t| Cut {
            pct: t.pct,
            color: systems
                .iter()
                .position(|s| s.name() == t.system)
                .unwrap_or(0),
            label: format!("{} (snapshot {:.0} ms)", t.system, t.end_ms),
            mem: keep(&t.mem),
            ops: keep(&t.ops),
        })
        .collect();
    fn series(d: &Cut, mem: bool) -> &[(f64, f64)] {
        if mem {
            &d.mem
        } else {
            &d.ops
        }
    }
    let max_of = |pct: u32, mem: bool| {
        data.iter()
            .filter(|d| d.pct == pct)
            .flat_map(|d| series(d, mem).iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            * 1.1
    };
    let titles: Vec<(u32, bool, String)> = UPDATE_PCTS
        .iter()
        .flat_map(|&p| {
            [
                (p, true, format!("memory (cgroup total_rss), {p} % updates")),
                (
                    p,
                    false,
                    format!("throughput (thousand commands/s), {p} % updates"),
                ),
            ]
        })
        .collect();
    let panels: Vec<plot::AxisPanel<'_>> = titles
        .iter()
        .map(|(pct, mem, title)| plot::AxisPanel {
            panel: plot::Panel {
                title,
                lines: data
                    .iter()
                    .filter(|d| d.pct == *pct)
                    .map(|d| plot::Line {
                        label: &d.label,
                        color: d.color,
                        dashed: false,
                        points: series(d, *mem),
                    })
                    .collect(),
            },
            y_label: if *mem { "MB" } else { "k commands/s" },
            y_max: max_of(*pct, *mem).max(1.0),
        })
        .collect();
    plot::timeline_axes(
        path,
        "tiermem bench snapshot: BGSAVE at 0 under a redis-benchmark SET (and GET) load",
        "ms since BGSAVE",
        &panels,
    )
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "—".to_string(), |v| format!("{v:.digits$}"))
}

impl crate::Report for Report {
    fn print_table(&self) {
        let p = &self.parameters;
        println!(
            "tiermem bench snapshot — BGSAVE under a writer load: tiermem-kv (wp, fork-mdc, fork) \
             against redis-server's fork"
        );
        println!("machine: {}", self.machine.one_line());
        println!(
            "{} keys × {} B, {}; storage {}; THP {}",
            p.keys, p.value_bytes, p.load, p.storage_dir, p.transparent_hugepages
        );
        println!(
            "warm-up {:.0} s; total_rss every {} ms; INFO persistence every {} ms; probe: {}; \
             tiermem heap {} MiB\n",
            p.warmup_s,
            p.memory_sample_ms,
            p.info_poll_ms,
            p.probe,
            p.tiermem_heap_bytes >> 20
        );
        println!("results:");
        println!(
            "{:<9} {:>4} {:>8} {:>9} {:>8} {:>10} {:>9} {:>10} {:>9} {:>8} {:>8} {:>6} {:>6} {:>10} {:>8}",
            "system", "upd%", "extra%", "snap ms", "pause", "ops/s", "p99 µs", "file MB",
            "restore", "before", "peak", "cpu s", "wall s", "ops/s pre", "p99 pre"
        );
        for r in &self.results {
            println!(
                "{:<9} {:>4} {:>8.2} {:>9.1} {:>8} {:>10.0} {:>9} {:>10.1} {:>9} {:>8} {:>8} {:>6.2} {:>6.2} {:>10} {:>8}",
                r.system,
                r.update_pct,
                r.extra_memory_pct,
                r.snapshot_ms,
                opt(r.pause_ms, 2),
                r.ops_per_s_during,
                opt(r.p99_us_during, 0),
                r.file_bytes as f64 / 1e6,
                opt(r.restore_ms, 0),
                format!("{}M", r.before_rss_bytes >> 20),
                format!("{}M", r.peak_rss_bytes >> 20),
                r.cpu_s,
                r.wall_s,
                opt(r.ops_per_s_before, 0),
                opt(r.p99_us_before, 0)
            );
        }
        println!(
            "(columns: system, update_pct, extra_memory_pct, snapshot_ms, pause_ms, \
             ops_per_s_during, p99_us_during, file_bytes in MB (10^6 B), restore_ms, \
             before_rss_bytes and peak_rss_bytes in MiB, cpu_s, wall_s, ops_per_s_before, \
             p99_us_before)"
        );
        for r in &self.results {
            println!(
                "  {:<9} {:>3} %: probe_samples_during {}, memory_samples_during {} \
                 (max_sample_gap_ms {}), used_memory_bytes {}{}{}",
                r.system,
                r.update_pct,
                r.probe_samples_during,
                r.memory_samples_during,
                r.max_sample_gap_ms,
                r.used_memory_bytes
                    .map_or("—".to_string(), |v| v.to_string()),
                r.snapshot_extra_bytes_bound
                    .map_or(String::new(), |v| format!(
                        ", snapshot_extra_bytes_bound {v}"
                    )),
                r.snapshot_last_file_bytes
                    .map_or(String::new(), |v| format!(", snapshot_last_file_bytes {v}"))
            );
        }
        let e = &self.extra_memory_pct;
        println!("\nextra_memory_pct (50 % / 100 % updates):");
        for (name, x) in [
            ("wp", &e.wp),
            ("fork-mdc", &e.fork_mdc),
            ("fork", &e.fork),
            ("redis", &e.redis),
        ] {
            println!("  {:<9} {} / {}", name, opt(x.p50, 2), opt(x.p100, 2));
        }
        let pair = |x: &ByPct| format!("{} / {}", opt(x.p50, 3), opt(x.p100, 3));
        println!(
            "extra_memory_bound_pct (snapshot_extra_bytes_bound / wp's total_rss before): {}",
            opt(self.extra_memory_bound_pct, 3)
        );
        println!(
            "extra_memory_ratio_vs_fork (wp / fork, 50 / 100): {}",
            pair(&self.extra_memory_ratio_vs_fork)
        );
        println!(
            "extra_memory_ratio_vs_redis (wp / redis, 50 / 100): {}",
            pair(&self.extra_memory_ratio_vs_redis)
        );
        println!(
            "mdc_extra_memory_ratio_vs_fork (fork-mdc / fork, 50 / 100): {}",
            pair(&self.mdc_extra_memory_ratio_vs_fork)
        );
        println!(
            "snapshot_time_ratio_vs_fork (wp / fork, 100 %): {}",
            opt(self.snapshot_time_ratio_vs_fork, 3)
        );
        println!(
            "throughput_during_snapshot_ratio_vs_fork (wp / fork, 100 %): {}",
            opt(self.throughput_during_snapshot_ratio_vs_fork, 3)
        );
        println!(
            "pause_ratio_vs_fork (wp / fork, 100 %): {}",
            opt(self.pause_ratio_vs_fork, 3)
        );
        println!(
            "restore_time_ratio_vs_redis (wp / redis): {}",
            opt(self.restore_time_ratio_vs_redis, 3)
        );
        println!("\nfigures against the issue's targets (must / should):");
        for c in &self.must {
            println!(
                "  {:<6} {:<58} {:>9} {:<48} {}",
                c.level,
                c.figure,
                opt(c.value, 3),
                c.target,
                c.status
            );
        }
        println!("\nsystems:");
        for s in &self.systems {
            println!("  {:<9} {:<9} {}", s.name, s.status, s.command);
        }
        for (s, e) in &self.errors {
            println!("error: {s}: {e}");
        }
        for w in &self.warnings {
            println!("warning: {w}");
        }
        if let Some(path) = &self.plot_path {
            println!("plot: {}", path.display());
        }
        println!("total {:.1} s", self.seconds);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_redis_benchmark_rand_int_names() {
        assert_eq!(key(0), "key:000000000000");
        assert_eq!(key(262_143), "key:000000262143");
        assert_eq!(key(2_097_151).len(), "key:__rand_int__".len());
    }

    #[test]
    fn info_fields_by_name() {
        let t = "# Persistence\r\nloading:0\r\nrdb_bgsave_in_progress:1\r\n\
                 rdb_last_bgsave_status:ok\r\nrdb_bgsave_in_progress_x:7\r\n";
        assert_eq!(info_field(t, "rdb_bgsave_in_progress"), Some("1"));
        assert_eq!(info_field(t, "rdb_last_bgsave_status"), Some("ok"));
        assert_eq!(info_field(t, "rdb_bgsave_in_progress_x"), Some("7"));
        assert_eq!(info_field(t, "snapshot_last_pause_us"), None);
        assert_eq!(info_u64(t, "persistence", "loading").unwrap(), 0);
        let e = info_u64(t, "persistence", "snapshot_last_pause_us").unwrap_err();
        assert!(e.to_string().contains("no snapshot_last_pause_us"), "{e}");
        assert!(info_u64(t, "persistence", "rdb_last_bgsave_status").is_err());
    }

    #[test]
    fn memory_stat_total_rss_not_rss() {
        let t = "cache 9289728\nrss 4476928\nrss_huge 0\ntotal_cache 3152084992\n\
                 total_rss 460402688\ntotal_rss_huge 0\n";
        assert_eq!(memory_stat_field(t, "total_rss"), Some(460_402_688));
        assert_eq!(memory_stat_field(t, "rss"), Some(4_476_928));
        assert_eq!(memory_stat_field(t, "total_swap"), None);
    }

    #[test]
    fn proc_stat_counts_reaped_children() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime ...
        let s = "1234 (redis-server *:6) S 1 1234 1234 0 -1 4194560 100 5 0 0 \
                 70 30 12 8 20 0 5 0 1000 0 0";
        assert_eq!(proc_stat_cpu_ticks(s), Some(120));
        assert_eq!(proc_stat_cpu_ticks("1 (x) S 1 2"), None);
    }

    #[test]
    fn heap_fits_the_keys_with_margin() {
        for keys in [QUICK_KEYS, FULL_KEYS] {
            let h = heap_bytes(keys);
            assert_eq!(h % (64 << 20), 0);
            assert!(h as f64 >= keys as f64 * HEAP_BYTES_PER_KEY as f64 * 1.5);
        }
    }
}
