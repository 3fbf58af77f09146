//! `bench prefault`'s unmodified programs: each run plain and under `tiermem prefault run`
//! (the LD_PRELOAD library and its service), alternated, medians, with 4 KiB pages
//! (PR_SET_THP_DISABLE set in the child between fork and exec: the prctl is inherited across
//! exec, so it also holds for the program `tiermem prefault run` starts) and with the system's
//! THP setting; every run's output must be the same.
//!
//! Repetitions: see [`MIN_REPS`]. Programs (sizes quick / full): sqlite3 building an in-memory database with an index
//! (200 k / 2 M rows); `sort` (LC_ALL=C, in memory) of a generated file (96 MiB / 1 GiB);
//! python3 building a big list (3 M / 30 M ints); redis-server under redis-benchmark (SET of
//! 1 KiB values, random keys, pipelined; 200 k / 1 M requests); memcached under memcslap (SET,
//! 2 threads; 50 k / 150 k keys); and the PARSEC members Debian packages: x264 encoding a
//! generated 640x360 video (96 / 240 frames) and vips sharpening a generated image (3000² /
//! 6000², written raw: vips's PPM carries a timestamp). The quick sizes keep every batch
//! program near 0.4 s or more: the launcher and the library cost a fixed ~1.5 ms a run
//! (`start_cost_ms`, measured on `true`), 0.8 % of the 0.18 s vips took at 2000². Servers are timed by their client; their faults and CPU are the server's.
//!
//! Output checks: batch programs' stdout and output files are hashed and must match across all
//! runs of a program; memcached must hold every key (`curr_items`); redis-benchmark picks random
//! keys seeded by the time, so redis is checked for completeness instead (every request
//! answered, `DBSIZE` within 0.2 % of the distinct keys N random SETs leave in a 10 M key space).
//!
//! Figures per program and THP setting: `plain_ms`, `prefault_ms` (medians), `speedup_pct` =
//! 100 × (1 − prefault / plain) on the medians (`speedup_pct_paired`: the median of the
//! repetitions' own ratios, the two runs of a repetition being adjacent in time);
//! `app_faults_plain` (minor + major faults of the program, all its threads, from wait4);
//! `app_faults_prefault` (the application threads' faults under the
//! library, as its exit report counts them per thread; without that count, the process's minus
//! the pages the service populated, which the kernel counts as the service thread's faults);
//! `est_speedup_pct` = app_faults_plain × (kernel fault − prefault touch, the microbenchmark's
//! p50s) / plain time, the paper's formula; `service_cpu_pct` = the service's CPU over the
//! prefault run's wall time (a server's whole life).

use super::Costs;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Repetitions of every (program, THP setting, arm): at least [`MIN_REPS`]; then more, one
/// pair (plain, prefault; order alternated) at a time, until the 95 % confidence half-width
/// of the paired speed-up is at most [`TARGET_HALF_WIDTH_PCT`] points, or [`MAX_REPS`] pairs,
/// or the (program, setting) has run for [`time_cap`]. Stopping on precision, never on the
/// value, leaves the estimate unbiased. A run varies by ±3-5 % from run to run on this 2-core
/// VM (a client and a server sharing it, a short multi-threaded vips): the median of five
/// runs does not settle the 1-20 % effects measured, nor a −2 % bound.
const MIN_REPS: usize = 5;
/// See [`MIN_REPS`].
/// (30 pairs left vips's paired speed-up, 0.18 s a run in `--quick`, with a half-width of
/// 4 points where the bound is −2 %; the time cap, not this, now ends a short program's pairs.)
const MAX_REPS: usize = 100;
/// See [`MIN_REPS`].
const TARGET_HALF_WIDTH_PCT: f64 = 1.0;

/// See [`MIN_REPS`]: the time one (program, THP setting) may take, both arms.
fn time_cap(quick: bool) -> Duration {
    Duration::from_secs(if quick { 40 } else { 120 })
}

/// 95 % confidence half-width (percentage points) of the median of paired speed-ups `d`
/// (normal approximation: 1.96 × 1.2533 σ/√n).
fn half_width(d: &[f64]) -> f64 {
    let n = d.len() as f64;
    if d.len() < 2 {
        return f64::INFINITY;
    }
    let mean = d.iter().sum::<f64>() / n;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    1.96 * 1.2533 * var.sqrt() / n.sqrt()
}

/// Paired speed-ups (%) of the repetitions of one (program, setting): plain `a`, prefault `b`.
fn paired(a: &[RunOut], b: &[RunOut]) -> Vec<f64> {
    a.iter()
        .zip(b.iter())
        .map(|(a, b)| 100.0 * (1.0 - b.wall_ms / a.wall_ms))
        .collect()
}

/// What a program is and how its output is checked.
#[derive(Clone)]
enum Kind {
    /// Runs to completion; stdout (and `out`, when set) must be the same in every run.
    Batch {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        stdin: Option<PathBuf>,
        out: Option<PathBuf>,
    },
    /// redis-server loaded by redis-benchmark.
    Redis { requests: usize },
    /// memcached loaded by memcslap.
    Memcached { keys: usize },
}

#[derive(Clone)]
struct Prog {
    name: &'static str,
    /// The executable that must be installed (checked on PATH).
    needs: &'static [&'static str],
    kind: Kind,
}

/// The programs that count in `app_speedup_pct`.
const APP_MEAN: [&str; 4] = ["sqlite3", "sort", "python3", "redis"];
const NPROGS: usize = 7;

/// Runs the harness plans at first (for the progress bar): programs × THP settings × (arms ×
/// [`MIN_REPS`] + [`STATS_RUNS`]); the plan grows once the first repetitions have shown which
/// programs are short.
pub fn planned_runs(_quick: bool) -> usize {
    NPROGS * 2 * (2 * MIN_REPS + STATS_RUNS)
}

/// The `tiermem` binary whose `prefault run` is measured: `$TIERMEM_BIN`, else this
/// executable's path. Not `/proc/self/exe`: the launcher finds its library next to itself, and
/// when `target/release/tiermem` is rebuilt during a run the link reads "… (deleted)" — the
/// path then names the new binary, which is what a user would run.
fn tiermem_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TIERMEM_BIN") {
        return PathBuf::from(p);
    }
    match std::env::current_exe() {
        Ok(p) => {
            let s = p.to_string_lossy();
            match s.strip_suffix(" (deleted)") {
                Some(live) => PathBuf::from(live),
                None => p,
            }
        }
        Err(_) => PathBuf::from("tiermem"),
    }
}

/// A deterministic generator for the inputs (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A fast 64-bit hash of a file's bytes (equality checks only).
fn hash_file(p: &Path) -> Result<u64> {
    let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        let mut chunks = buf[..n].chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            h = (h.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    Ok(h ^ total)
}

/// `sort`'s input: lines of a random 16-hex-digit key and a 40-byte payload, `bytes` in all.
fn gen_sort_input(p: &Path, bytes: usize) -> Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(p)?);
    let mut r = Rng(0x5151_7e57);
    let mut written = 0;
    while written < bytes {
        let k = r.next();
        let v = r.next();
        let line = format!("{k:016x} {v:020}-payload-of-the-line\n");
        w.write_all(line.as_bytes())?;
        written += line.len();
    }
    w.flush()?;
    Ok(())
}

/// x264's input: a YUV4MPEG2 video, 640x360, `frames` frames of moving gradients and noise.
fn gen_video(p: &Path, frames: usize) -> Result<()> {
    let (w, h) = (640usize, 360usize);
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(p)?);
    writeln!(out, "YUV4MPEG2 W{w} H{h} F25:1 Ip A1:1 C420jpeg")?;
    let mut r = Rng(0x0264);
    let mut y = vec![0u8; w * h];
    let mut c = vec![0u8; w * h / 4];
    for f in 0..frames {
        for (i, px) in y.iter_mut().enumerate() {
            let (x, yy) = (i % w, i / w);
            let g = (x + 2 * f) ^ (yy + f);
            *px = (g as u8).wrapping_add((r.next() >> 61) as u8);
        }
        out.write_all(b"FRAME\n")?;
        out.write_all(&y)?;
        for plane in 0..2 {
            for (i, px) in c.iter_mut().enumerate() {
                *px = (128 + ((i / (w / 2) + f * (plane + 1)) % 64)) as u8;
            }
            out.write_all(&c)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// vips's input: a binary PPM, `side`² pixels of gradients and noise.
fn gen_image(p: &Path, side: usize) -> Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(p)?);
    write!(out, "P6\n{side} {side}\n255\n")?;
    let mut r = Rng(0x0919);
    let mut line = vec![0u8; side * 3];
    for y in 0..side {
        for x in 0..side {
            let n = r.next();
            line[3 * x] = ((x * 255 / side) as u8).wrapping_add((n & 15) as u8);
            line[3 * x + 1] = ((y * 255 / side) as u8).wrapping_add((n >> 8 & 15) as u8);
            line[3 * x + 2] = (((x ^ y) & 255) as u8).wrapping_add((n >> 16 & 15) as u8);
        }
        out.write_all(&line)?;
    }
    out.flush()?;
    Ok(())
}

fn programs(dir: &Path, quick: bool) -> Result<Vec<Prog>> {
    let q = |a: usize, b: usize| if quick { a } else { b };
    let rows = q(200_000, 2_000_000);
    let sql = dir.join("build.sql");
    std::fs::write(
        &sql,
        format!(
            "CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT, w INTEGER);\n\
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{rows})\n\
             INSERT INTO t SELECT x, printf('value-%08d-%s', x, hex(zeroblob(16))), \
             (x * 2654435761) % 1000003 FROM c;\n\
             CREATE INDEX tw ON t(w);\n\
             SELECT count(*), sum(w), sum(length(v)) FROM t;\n\
             SELECT k, w FROM t WHERE w > 500000 ORDER BY w LIMIT 3;\n"
        ),
    )?;
    let sort_in = dir.join("sort.in");
    let sort_out = dir.join("sort.out");
    let video = dir.join("video.y4m");
    let image = dir.join("image.ppm");
    let v = vec![
        Prog {
            name: "sqlite3",
            needs: &["sqlite3"],
            kind: Kind::Batch {
                argv: vec!["sqlite3".into(), ":memory:".into()],
                env: vec![],
                stdin: Some(sql),
                out: None,
            },
        },
        Prog {
            name: "sort",
            needs: &["sort"],
            kind: Kind::Batch {
                argv: vec![
                    "sort".into(),
                    "-S".into(),
                    q(256, 2048).to_string() + "M",
                    "-o".into(),
                    sort_out.display().to_string(),
                    sort_in.display().to_string(),
                ],
                env: vec![("LC_ALL".into(), "C".into())],
                stdin: None,
                out: Some(sort_out),
            },
        },
        Prog {
            name: "python3",
            needs: &["/usr/bin/python3"],
            kind: Kind::Batch {
                argv: vec![
                    "/usr/bin/python3".into(),
                    "-c".into(),
                    "import sys\nn = int(sys.argv[1])\nl = [i * 3 for i in range(n)]\n\
                     d = [str(x) for x in l[::5]]\nprint(len(l), sum(l), len(d), d[-1])"
                        .into(),
                    q(3_000_000, 30_000_000).to_string(),
                ],
                env: vec![],
                stdin: None,
                out: None,
            },
        },
        Prog {
            name: "redis",
            needs: &["redis-server", "redis-benchmark"],
            kind: Kind::Redis {
                requests: q(200_000, 1_000_000),
            },
        },
        Prog {
            name: "memcached",
            needs: &["memcached", "memcslap"],
            kind: Kind::Memcached {
                keys: q(50_000, 150_000),
            },
        },
        Prog {
            name: "x264",
            needs: &["x264"],
            kind: Kind::Batch {
                argv: vec![
                    "x264".into(),
                    "--quiet".into(),
                    "--preset".into(),
                    "medium".into(),
                    "-o".into(),
                    dir.join("video.264").display().to_string(),
                    video.display().to_string(),
                ],
                env: vec![],
                stdin: None,
                out: Some(dir.join("video.264")),
            },
        },
        Prog {
            name: "vips",
            needs: &["vips"],
            kind: Kind::Batch {
                argv: vec![
                    "vips".into(),
                    "sharpen".into(),
                    image.display().to_string(),
                    dir.join("sharp.raw").display().to_string(),
                ],
                env: vec![],
                stdin: None,
                out: Some(dir.join("sharp.raw")),
            },
        },
    ];
    debug_assert_eq!(v.len(), NPROGS);
    // Inputs only for the programs that will run.
    if crate::on_path("sort") {
        gen_sort_input(&sort_in, q(96 << 20, 1 << 30))?;
    }
    if crate::on_path("x264") {
        gen_video(&video, q(96, 240))?;
    }
    if crate::on_path("vips") {
        gen_image(&image, q(3000, 6000))?;
    }
    Ok(v)
}

/// One run's measurements.
#[derive(Clone, Debug, Default)]
struct RunOut {
    wall_ms: f64,
    /// Minor + major faults of the program (all its threads and waited-for children).
    faults: u64,
    /// Hash of what must be the same in every run, or the completeness check's verdict.
    output: String,
    /// The library's statistics files (prefault runs), merged: the first file's object plus
    /// `service_cpu_ms` summed over them.
    stats: Option<Value>,
    /// For servers: the server's whole life (the denominator of `service_cpu_pct`).
    life_ms: f64,
}

/// How a program runs: plain, under `tiermem prefault run` as a user runs it (the timed
/// runs), or with the library's exit report (`--stats`; untimed, for the service's figures:
/// writing the report cost vips 0.4 % of its 0.18 s).
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    Plain,
    Prefault,
    PrefaultStats,
}

impl How {
    fn prefault(self) -> bool {
        self != How::Plain
    }
}

/// Untimed `--stats` runs per program and setting (see [`How`]).
const STATS_RUNS: usize = 3;

/// What a child did: its status and resource usage.
fn wait4(pid: i32, deadline: Option<Instant>) -> Result<(i32, libc::rusage)> {
    loop {
        let mut status = 0;
        // SAFETY: wait4 fills the zeroed rusage and the status of our own child.
        let (r, ru) = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            let flags = if deadline.is_some() { libc::WNOHANG } else { 0 };
            let r = libc::wait4(pid, &mut status, flags, &mut ru);
            (r, ru)
        };
        if r == pid {
            return Ok((status, ru));
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            bail!("wait4({pid}): {e}");
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            // SAFETY: signalling our own child's process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            deadline_passed(pid)?;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn deadline_passed(pid: i32) -> Result<()> {
    bail!("process {pid} did not exit in time; killed")
}

fn faults_of(ru: &libc::rusage) -> u64 {
    (ru.ru_minflt + ru.ru_majflt) as u64
}

/// The command of a run: the program itself, or `tiermem prefault run --stats … -- program`;
/// with PR_SET_THP_DISABLE set in the child when `small_pages`.
fn command(argv: &[String], how: How, stats: &Path, small_pages: bool) -> Command {
    let mut cmd = match how {
        How::Plain => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
        How::Prefault => {
            let mut c = Command::new(tiermem_bin());
            c.args(["prefault", "run", "--"]).args(argv);
            c
        }
        How::PrefaultStats => {
            let mut c = Command::new(tiermem_bin());
            c.args(["prefault", "run", "--stats"])
                .arg(stats)
                .arg("--")
                .args(argv);
            c
        }
    };
    if small_pages {
        // SAFETY: the closure runs in the child between fork and exec and makes one
        // async-signal-safe system call (prctl with integer arguments).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.process_group(0);
    cmd
}

/// The statistics files a prefault run left (`<prefix>*.json`), merged and removed.
fn collect_stats(dir: &Path, prefix: &str) -> Option<Value> {
    let mut first: Option<Value> = None;
    let mut cpu_ms = 0.0;
    let mut populated = 0.0;
    let mut app_faults: Option<f64> = None;
    let mut app_known = true;
    let mut files = 0;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        let v: Option<Value> = std::fs::read(e.path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let _ = std::fs::remove_file(e.path());
        let Some(v) = v else { continue };
        files += 1;
        cpu_ms += service_cpu_ms(&v).unwrap_or(0.0);
        populated += v["populated_bytes"].as_f64().unwrap_or(0.0);
        match (v["app_minflt"].as_f64(), v["app_majflt"].as_f64()) {
            (Some(a), b) => *app_faults.get_or_insert(0.0) += a + b.unwrap_or(0.0),
            _ => app_known = false,
        }
        first.get_or_insert(v);
    }
    let mut v = first?;
    v["files"] = json!(files);
    v["service_cpu_ms_total"] = json!(cpu_ms);
    v["populated_bytes_total"] = json!(populated);
    // The application threads' faults, as the library counted them (every file has them).
    v["app_faults_total"] = match app_faults {
        Some(a) if app_known => json!(a),
        _ => Value::Null,
    };
    Some(v)
}

/// The service's CPU in a statistics object, in ms, whatever unit its key names.
fn service_cpu_ms(v: &Value) -> Option<f64> {
    let f = |k: &str| v.get(k).and_then(Value::as_f64);
    f("service_cpu_ms")
        .or_else(|| f("service_cpu_ns").map(|x| x / 1e6))
        .or_else(|| f("service_cpu_us").map(|x| x / 1e3))
        .or_else(|| f("service_cpu_s").map(|x| x * 1e3))
        .or_else(|| {
            v.get("stats")
                .or_else(|| v.get("service"))
                .and_then(service_cpu_ms)
        })
}

fn run_batch(dir: &Path, tag: &str, kind: &Kind, how: How, small_pages: bool) -> Result<RunOut> {
    let prefault = how.prefault();
    let Kind::Batch {
        argv,
        env,
        stdin,
        out,
    } = kind
    else {
        bail!("not a batch program");
    };
    let (stdin, out) = (stdin.as_deref(), out.as_deref());
    let stdout_path = dir.join(format!("{tag}.stdout"));
    let stderr_path = dir.join(format!("{tag}.stderr"));
    let stats_prefix = format!("{tag}.stats-");
    let stats = dir.join(format!("{stats_prefix}%p.json"));
    if let Some(o) = out {
        let _ = std::fs::remove_file(o);
    }
    let mut cmd = command(argv, how, &stats, small_pages);
    cmd.envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(std::fs::File::create(&stdout_path)?)
        .stderr(std::fs::File::create(&stderr_path)?)
        .stdin(match stdin {
            Some(p) => Stdio::from(std::fs::File::open(p)?),
            None => Stdio::null(),
        });
    let t0 = Instant::now();
    let child = cmd.spawn().with_context(|| {
        if prefault {
            format!(
                "starting {} prefault run -- {}",
                tiermem_bin().display(),
                argv[0]
            )
        } else {
            format!("starting {}", argv[0])
        }
    })?;
    let (status, ru) = wait4(child.id() as i32, None)?;
    let wall = t0.elapsed();
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        bail!(
            "{} failed (wait status {status:#x}): {}",
            argv[0],
            err.lines().last().unwrap_or("")
        );
    }
    let mut h = format!("{:016x}", hash_file(&stdout_path)?);
    if let Some(o) = out {
        h.push_str(&format!("/{:016x}", hash_file(o)?));
        let _ = std::fs::remove_file(o);
    }
    let _ = std::fs::remove_file(&stdout_path);
    let _ = std::fs::remove_file(&stderr_path);
    Ok(RunOut {
        wall_ms: wall.as_secs_f64() * 1e3,
        faults: faults_of(&ru),
        output: h,
        stats: if how == How::PrefaultStats {
            collect_stats(dir, &stats_prefix)
        } else {
            None
        },
        life_ms: wall.as_secs_f64() * 1e3,
    })
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Sends `req` to 127.0.0.1:`port` and reads until the reply ends with `end` (or EOF).
fn tcp_ask(port: u16, req: &[u8], end: &[u8]) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(req)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.ends_with(end) {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Waits until the server on `port` answers `req` with a reply starting with `expect`.
fn wait_ready(pid: i32, port: u16, req: &[u8], expect: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(r) = tcp_ask(port, req, b"\r\n") {
            if r.starts_with(expect) {
                return Ok(());
            }
        }
        let mut status = 0;
        // SAFETY: a non-blocking check whether our child exited.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            bail!("the server exited before answering (wait status {status:#x})");
        }
        if Instant::now() > deadline {
            // SAFETY: killing our own child's process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let _ = wait4(pid, None);
            bail!("the server did not answer within 15 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A server under its client: the client's wall time; the server's faults and life.
fn run_server(dir: &Path, tag: &str, kind: &Kind, how: How, small_pages: bool) -> Result<RunOut> {
    let port = free_port()?;
    let stats_prefix = format!("{tag}.stats-");
    let stats = dir.join(format!("{stats_prefix}%p.json"));
    let p = port.to_string();
    let argv: Vec<String> = match kind {
        Kind::Redis { .. } => [
            "redis-server",
            "--port",
            &p,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            "--dir",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        Kind::Memcached { .. } => {
            let mut v: Vec<String> = [
                "memcached",
                "-p",
                &p,
                "-U",
                "0",
                "-l",
                "127.0.0.1",
                "-m",
                "4096",
                "-t",
                "2",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            // SAFETY: getuid has no arguments and cannot fail.
            if unsafe { libc::getuid() } == 0 {
                v.extend(["-u".to_string(), "root".to_string()]);
            }
            v
        }
        Kind::Batch { .. } => bail!("not a server"),
    };
    let log = dir.join(format!("{tag}.server.log"));
    let mut cmd = command(&argv, how, &stats, small_pages);
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(&log)?);
    let t_life = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", argv[0]))?;
    let pid = child.id() as i32;
    let kill = |sig| {
        // SAFETY: signalling our own child's process group.
        unsafe { libc::kill(-pid, sig) };
    };
    let result = (|| -> Result<(f64, String)> {
        match kind {
            Kind::Redis { requests } => {
                wait_ready(pid, port, b"PING\r\n", "+PONG")?;
                let t0 = Instant::now();
                let o = Command::new("redis-benchmark")
                    .args(["-h", "127.0.0.1", "-p", &p, "-t", "set", "-d", "1024"])
                    .args(["-P", "16", "-r", "10000000", "-q", "-n"])
                    .arg(requests.to_string())
                    .stdin(Stdio::null())
                    .output()
                    .context("running redis-benchmark")?;
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                let text = String::from_utf8_lossy(&o.stdout);
                if !o.status.success() || !text.contains("requests per second") {
                    bail!("redis-benchmark failed: {}", text.trim());
                }
                let db = tcp_ask(port, b"DBSIZE\r\n", b"\r\n")?;
                let keys: f64 = db.trim().trim_start_matches(':').parse().unwrap_or(0.0);
                // Random keys from a space of K = 10 M: N SETs leave K (1 − e^(−N/K))
                // distinct keys on average (a standard deviation of a few hundred).
                let (n, k) = (*requests as f64, 10_000_000f64);
                let expected = k * (1.0 - (-n / k).exp());
                let ok = (keys - expected).abs() <= (0.002 * n).max(200.0);
                let _ = tcp_ask(port, b"SHUTDOWN NOSAVE\r\n", b"\r\n");
                Ok((
                    ms,
                    if ok {
                        "complete".to_string()
                    } else {
                        format!(
                            "DBSIZE {keys} after {requests} SETs (expected {expected:.0} ± 0.2 %)"
                        )
                    },
                ))
            }
            Kind::Memcached { keys } => {
                wait_ready(pid, port, b"version\r\n", "VERSION")?;
                let t0 = Instant::now();
                let o = Command::new("memcslap")
                    .arg(format!("--servers=127.0.0.1:{port}"))
                    .args(["--test=set", "--concurrency=2"])
                    .arg(format!("--execute-number={keys}"))
                    .stdin(Stdio::null())
                    .output()
                    .context("running memcslap")?;
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                if !o.status.success() {
                    bail!(
                        "memcslap failed: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    );
                }
                let st = tcp_ask(port, b"stats\r\n", b"END\r\n")?;
                let items = st
                    .lines()
                    .find_map(|l| l.strip_prefix("STAT curr_items "))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                kill(libc::SIGTERM);
                Ok((
                    ms,
                    if items == *keys {
                        "complete".to_string()
                    } else {
                        format!("curr_items {items} after {keys} keys")
                    },
                ))
            }
            Kind::Batch { .. } => unreachable!(),
        }
    })();
    if result.is_err() {
        kill(libc::SIGKILL);
    }
    let (status, ru) = wait4(pid, Some(Instant::now() + Duration::from_secs(30)))?;
    let life = t_life.elapsed().as_secs_f64() * 1e3;
    let (ms, output) = result.map_err(|e| {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        e.context(format!(
            "{} (wait status {status:#x}; log: {})",
            argv[0],
            l.lines().last().unwrap_or("")
        ))
    })?;
    let _ = std::fs::remove_file(&log);
    Ok(RunOut {
        wall_ms: ms,
        faults: faults_of(&ru),
        output,
        stats: if how == How::PrefaultStats {
            collect_stats(dir, &stats_prefix)
        } else {
            None
        },
        life_ms: life,
    })
}

fn run_one(dir: &Path, p: &Prog, how: How, small_pages: bool, rep: usize) -> Result<RunOut> {
    let tag = format!(
        "{}-{}-{}-{rep}",
        p.name,
        match how {
            How::Plain => "plain",
            How::Prefault => "prefault",
            How::PrefaultStats => "stats",
        },
        if small_pages { "4k" } else { "thp" }
    );
    match &p.kind {
        k @ Kind::Batch { .. } => run_batch(dir, &tag, k, how, small_pages),
        k => run_server(dir, &tag, k, how, small_pages),
    }
}

fn median(v: Vec<f64>) -> f64 {
    super::median(v)
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Pairs of `true` runs [`start_cost`] times.
const START_PAIRS: usize = 40;

/// The fixed cost of a run under `tiermem prefault run`: the median over [`START_PAIRS`]
/// alternated pairs of (`tiermem prefault run -- true`) − (`true`), in ms, wall and the
/// child's CPU (user + system, all threads: the launcher's exec, loading the library,
/// starting and joining the service). `None` when a run fails (the launcher check reports why).
fn start_cost() -> Option<(f64, f64)> {
    let mut wall = Vec::with_capacity(START_PAIRS);
    let mut cpu = Vec::with_capacity(START_PAIRS);
    let argv = vec!["true".to_string()];
    let none = Path::new("/dev/null");
    for i in 0..START_PAIRS {
        let mut w = [0.0; 2];
        let mut c = [0.0; 2];
        for k in 0..2 {
            let prefault = (k + i) % 2 == 1;
            let how = if prefault { How::Prefault } else { How::Plain };
            let mut cmd = command(&argv, how, none, false);
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let t0 = Instant::now();
            let child = cmd.spawn().ok()?;
            let (status, ru) = wait4(child.id() as i32, None).ok()?;
            if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                return None;
            }
            w[prefault as usize] = t0.elapsed().as_secs_f64() * 1e3;
            let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
            c[prefault as usize] = tv(ru.ru_utime) + tv(ru.ru_stime);
        }
        wall.push(w[1] - w[0]);
        cpu.push(c[1] - c[0]);
    }
    Some((median(wall), median(cpu)))
}

/// Whether `tiermem prefault run` works here: `None` if so, else why not.
fn launcher_problem(dir: &Path) -> Option<String> {
    let bin = tiermem_bin();
    let stats = dir.join("probe.stats-%p.json");
    let o = Command::new(&bin)
        .args(["prefault", "run", "--stats"])
        .arg(&stats)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output();
    match o {
        Err(e) => Some(format!("cannot run {}: {e}", bin.display())),
        Ok(o) if !o.status.success() => Some(format!(
            "`{} prefault run -- true` failed ({}): {}",
            bin.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )),
        Ok(_) => {
            let _ = collect_stats(dir, "probe.stats-");
            None
        }
    }
}

/// Runs every program (see the module doc); returns the `programs` object and
/// `app_speedup_pct`.
pub fn run(quick: bool, costs: &Costs) -> (Value, Option<f64>) {
    let base = std::env::var_os("TIERMEM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm/tiermem"));
    let dir = base.join(format!("bench-prefault-{}", std::process::id()));
    let r = (|| -> Result<(Value, Option<f64>)> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if let Some(why) = launcher_problem(&dir) {
            return Ok((json!({ "skipped": why }), None));
        }
        crate::progress::step("programs: the launcher's fixed cost (true)");
        let start = start_cost();
        crate::progress::step("programs: generating inputs");
        let progs = programs(&dir, quick)?;
        let (mut v, app) = measure_all(&dir, &progs, costs, quick);
        let (wall, cpu) = start.map_or((Value::Null, Value::Null), |(w, c)| {
            (
                json!((w * 1e3).round() / 1e3),
                json!((c * 1e3).round() / 1e3),
            )
        });
        v["start_cost_ms"] = wall;
        v["start_cost_cpu_ms"] = cpu;
        Ok((v, app))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(v) => v,
        Err(e) => (
            json!({ "skipped": format!("programs: {}", crate::error_chain(&e)) }),
            None,
        ),
    }
}

fn measure_all(dir: &Path, progs: &[Prog], costs: &Costs, quick: bool) -> (Value, Option<f64>) {
    // runs[prog][small_pages as usize][prefault as usize]
    let mut runs: Vec<[[Vec<RunOut>; 2]; 2]> = progs.iter().map(|_| Default::default()).collect();
    let mut errors: Vec<[Option<String>; 2]> = progs.iter().map(|_| [None, None]).collect();
    let installed: Vec<bool> = progs
        .iter()
        .map(|p| p.needs.iter().all(|e| crate::on_path(e)))
        .collect();
    // done[prog][setting]: enough repetitions (see MIN_REPS); spent: time taken so far.
    let mut done: Vec<[bool; 2]> = progs.iter().map(|_| [false, false]).collect();
    let mut spent: Vec<[Duration; 2]> = progs.iter().map(|_| Default::default()).collect();
    // stat_runs[prog][small_pages as usize]: the untimed `--stats` runs (see `How`).
    let mut stat_runs: Vec<[Vec<RunOut>; 2]> = progs.iter().map(|_| Default::default()).collect();
    for rep in 0..MAX_REPS {
        if rep >= MIN_REPS {
            let more = done.iter().flatten().filter(|d| !**d).count();
            if more == 0 {
                break;
            }
            crate::progress::grow(2 * more as u64);
        }
        for (pi, p) in progs.iter().enumerate() {
            for small in [true, false] {
                let si = small as usize;
                if done[pi][si] {
                    continue;
                }
                let t0 = Instant::now();
                for k in 0..2 {
                    let prefault = (k + rep) % 2 == 1;
                    crate::progress::step(&format!(
                        "{} {} pages, {} (rep {})",
                        p.name,
                        if small { "4 KiB" } else { "default THP" },
                        if prefault {
                            "tiermem prefault run"
                        } else {
                            "plain"
                        },
                        rep + 1
                    ));
                    if !installed[pi] || errors[pi][si].is_some() {
                        continue;
                    }
                    let how = if prefault { How::Prefault } else { How::Plain };
                    match run_one(dir, p, how, small, rep) {
                        Ok(o) => runs[pi][si][prefault as usize].push(o),
                        Err(e) => {
                            errors[pi][si] = Some(format!(
                                "{}: {}",
                                if prefault {
                                    "prefault run"
                                } else {
                                    "plain run"
                                },
                                crate::error_chain(&e)
                            ))
                        }
                    }
                }
                if rep < STATS_RUNS && installed[pi] && errors[pi][si].is_none() {
                    crate::progress::step(&format!(
                        "{} {} pages, tiermem prefault run --stats (untimed {})",
                        p.name,
                        if small { "4 KiB" } else { "default THP" },
                        rep + 1
                    ));
                    match run_one(dir, p, How::PrefaultStats, small, rep) {
                        Ok(o) => stat_runs[pi][si].push(o),
                        Err(e) => {
                            errors[pi][si] = Some(format!("stats run: {}", crate::error_chain(&e)))
                        }
                    }
                }
                spent[pi][si] += t0.elapsed();
                let [a, b] = &runs[pi][si];
                done[pi][si] = !installed[pi]
                    || errors[pi][si].is_some()
                    || (rep + 1 >= MIN_REPS
                        && (half_width(&paired(a, b)) <= TARGET_HALF_WIDTH_PCT
                            || spent[pi][si] >= time_cap(quick)));
            }
        }
    }
    let mut rows = Vec::new();
    let mut app = Vec::new();
    for (pi, p) in progs.iter().enumerate() {
        for small in [true, false] {
            let si = small as usize;
            let pages = if small { "4k" } else { "default" };
            if !installed[pi] {
                rows.push(json!({"program": p.name, "pages": pages,
                    "skipped": format!("not installed: {}", p.needs.join(", "))}));
                continue;
            }
            if let Some(e) = &errors[pi][si] {
                rows.push(json!({"program": p.name, "pages": pages, "error": e}));
                continue;
            }
            let [plain, pre] = &runs[pi][si];
            let with_stats = &stat_runs[pi][si];
            let plain_ms = median(plain.iter().map(|r| r.wall_ms).collect());
            let pre_ms = median(pre.iter().map(|r| r.wall_ms).collect());
            let faults_plain = median(plain.iter().map(|r| r.faults as f64).collect());
            let faults_pre_raw = median(pre.iter().map(|r| r.faults as f64).collect());
            let populated_pages = median(
                with_stats
                    .iter()
                    .map(|r| {
                        r.stats.as_ref().map_or(0.0, |s| {
                            s["populated_bytes_total"].as_f64().unwrap_or(0.0) / 4096.0
                        })
                    })
                    .collect(),
            );
            let svc_cpu = median(
                with_stats
                    .iter()
                    .map(|r| {
                        r.stats.as_ref().map_or(f64::NAN, |s| {
                            s["service_cpu_ms_total"].as_f64().unwrap_or(f64::NAN)
                        })
                    })
                    .collect(),
            );
            let life = median(with_stats.iter().map(|r| r.life_ms).collect());
            // The application threads' faults under the library: what it counted per thread
            // (/proc/self/task) when it says, else the process's minus the pages populated.
            let lib_app_faults = median(
                with_stats
                    .iter()
                    .map(|r| {
                        r.stats.as_ref().map_or(f64::NAN, |s| {
                            s["app_faults_total"].as_f64().unwrap_or(f64::NAN)
                        })
                    })
                    .collect(),
            );
            let (app_faults_prefault, source) = if lib_app_faults.is_finite() {
                (
                    lib_app_faults,
                    "the library's per-thread count (/proc/self/task/*/stat)",
                )
            } else {
                (
                    (faults_pre_raw - populated_pages).max(0.0),
                    "estimate: the process's faults minus the pages the service populated",
                )
            };
            let outputs: Vec<&str> = plain
                .iter()
                .chain(pre.iter())
                .chain(with_stats.iter())
                .map(|r| r.output.as_str())
                .collect();
            let same = outputs.windows(2).all(|w| w[0] == w[1])
                && !outputs.iter().any(|o| o.contains(' '));
            let speedup = 100.0 * (1.0 - pre_ms / plain_ms);
            // The two runs of a repetition are adjacent in time: the median of their ratios
            // is less sensitive to load that drifts over the whole measurement.
            let pairs = paired(plain, pre);
            let hw = half_width(&pairs);
            let paired = median(pairs);
            let est = 100.0 * faults_plain * (costs.kernel_fault_ns - costs.prefault_touch_ns)
                / (plain_ms * 1e6);
            // A program whose output differs does not count: something went wrong there.
            if small && APP_MEAN.contains(&p.name) && speedup.is_finite() && same {
                app.push(speedup);
            }
            let mut row = json!({
                "program": p.name,
                "pages": pages,
                "reps": plain.len().min(pre.len()),
                "plain_ms": r2(plain_ms),
                "prefault_ms": r2(pre_ms),
                "speedup_pct": r2(speedup),
                "speedup_pct_paired": r2(paired),
                "speedup_ci95_pct": if hw.is_finite() { json!(r2(hw)) } else { Value::Null },
                "time_s": r2(spent[pi][si].as_secs_f64()),
                "est_speedup_pct": if est.is_finite() { json!(r2(est)) } else { Value::Null },
                "app_faults_plain": faults_plain as u64,
                "app_faults_prefault": app_faults_prefault as u64,
                "app_faults_prefault_source": source,
                "faults_prefault_process": faults_pre_raw as u64,
                "service_populated_pages": populated_pages as u64,
                "service_cpu_ms": if svc_cpu.is_finite() { json!(r2(svc_cpu)) } else { Value::Null },
                "service_cpu_pct": if svc_cpu.is_finite() { json!(r2(100.0 * svc_cpu / life)) } else { Value::Null },
                "same_output": same,
                "output": outputs.first().copied().unwrap_or(""),
                "library_stats": with_stats.last().and_then(|r| r.stats.clone()).unwrap_or(Value::Null),
            });
            if !same {
                row["error"] = json!(format!("outputs differ: {outputs:?}"));
            }
            rows.push(row);
        }
    }
    let app_speedup = (!app.is_empty()).then(|| r2(app.iter().sum::<f64>() / app.len() as f64));
    let min_speedup = rows
        .iter()
        .filter_map(|r| r["speedup_pct"].as_f64())
        .fold(f64::INFINITY, f64::min);
    (
        json!({
            "launcher": format!("{} prefault run -- CMD (timed); {STATS_RUNS} more runs per program and setting with --stats FILE, untimed, for the service's figures", tiermem_bin().display()),
            "reps": format!("{MIN_REPS} to {MAX_REPS} pairs per program and setting, until the 95 % half-width of the paired speed-up (`speedup_ci95_pct`) is at most {TARGET_HALF_WIDTH_PCT} points or {} s were spent; `reps` per row", time_cap(quick).as_secs()),
            "kernel_fault_ns": costs.kernel_fault_ns,
            "prefault_touch_ns": costs.prefault_touch_ns,
            "app_speedup_programs": APP_MEAN.iter().filter(|n| rows.iter().any(|r| r["program"] == **n && r["pages"] == "4k" && r["speedup_pct"].is_number() && r["same_output"] == true)).collect::<Vec<_>>(),
            "min_speedup_pct": if min_speedup.is_finite() { json!(min_speedup) } else { Value::Null },
            "rows": rows,
        }),
        app_speedup,
    )
}
