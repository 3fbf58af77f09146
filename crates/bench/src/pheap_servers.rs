//! `bench pheap`'s multi-threaded servers under the pheap preload library (issue #21 part 4):
//! redis-server (Debian's, its jemalloc replaced by the preload) driven by `redis-benchmark`,
//! memcached driven by `memcslap`. Each server runs plain and under the preload with a
//! checkpoint every 100 ms, alternated, in processes of their own; the slowdown is the client's
//! wall time under the preload over plain (medians). The preload's exit statistics give the
//! safepoint pauses (first signal to resume) and stops. One more run compares every checkpoint
//! with the heap while the threads are stopped (`TIERMEM_PHEAP_VERIFY_EACH`), and kill -9
//! rounds kill the server at a random moment under load, then run `tiermem pheap verify` on its
//! heap and reopen it.

use crate::kv_harness::free_port;
use crate::on_path;
use crate::pheap::{median, r2, Rng};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One server and its load generator.
struct Server {
    name: &'static str,
    client: &'static str,
}

const SERVERS: [Server; 2] = [
    Server {
        name: "redis-server",
        client: "redis-benchmark",
    },
    Server {
        name: "memcached",
        client: "memcslap",
    },
];

/// How a server is run: plain, or under the preload (checkpoint period, verify each).
#[derive(Clone, Copy)]
enum Mode {
    Plain,
    Preload { verify: bool },
}

struct Running {
    child: Child,
    port: u16,
}

fn start(s: &Server, lib: &Path, heap: &Path, stats: &Path, mode: Mode) -> Result<Running> {
    let port = free_port()?;
    let mut c = Command::new(s.name);
    match s.name {
        "redis-server" => {
            c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"]);
            c.args(["--save", "", "--appendonly", "no", "--daemonize", "no"]);
            // Its own directory and dump name: a dump.rdb in the working directory would be
            // loaded at start (clients then get LOADING errors) and the numbers not comparable.
            let dir = heap.parent().unwrap_or(Path::new("."));
            c.arg("--dir").arg(dir);
            c.args(["--dbfilename", &format!("pheap-bench-{port}.rdb")]);
        }
        _ => {
            c.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"]);
            c.args(["-t", "4", "-m", "64"]);
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                // Stay root: the statistics file is written at exit.
                c.args(["-u", "root"]);
            }
        }
    }
    if let Mode::Preload { verify } = mode {
        c.env("LD_PRELOAD", lib)
            .env("TIERMEM_CKPT_MS", "100")
            .env("TIERMEM_PHEAP_PATH", heap)
            .env("TIERMEM_PHEAP_STATS", stats);
        if verify {
            c.env("TIERMEM_PHEAP_VERIFY_EACH", "1");
        }
    }
    crate::kv_harness::die_with_parent(&mut c);
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", s.name))?;
    let mut r = Running { child, port };
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(st) = r.child.try_wait()? {
            anyhow::bail!("{} exited at start-up ({st})", s.name);
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = r.child.kill();
            anyhow::bail!("{} did not listen on port {port} within 10 s", s.name);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(r)
}

/// The load: `redis-benchmark` (five commands, 100 k random keys) or `memcslap`.
fn load(s: &Server, port: u16, quick: bool) -> Command {
    let mut c = Command::new(s.client);
    match s.name {
        "redis-server" => {
            let n = if quick { "20000" } else { "100000" };
            c.args(["-p", &port.to_string(), "-q", "-n", n, "-r", "100000"]);
            c.args(["-t", "set,get,incr,lpush,hset", "-c", "50"]);
        }
        _ => {
            let n = if quick { "5000" } else { "20000" };
            c.arg(format!("--servers=127.0.0.1:{port}"));
            c.args(["--concurrency=8", &format!("--execute-number={n}")]);
        }
    }
    crate::kv_harness::die_with_parent(&mut c);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// Stops a server so that it exits normally (its at-exit checkpoint and statistics).
fn stop(s: &Server, mut r: Running) -> Result<()> {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(r.child.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    loop {
        if let Some(st) = r.child.try_wait()? {
            // redis-server and memcached exit 0 on SIGTERM.
            anyhow::ensure!(st.success(), "{} exited with {st} on SIGTERM", s.name);
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = r.child.kill();
            anyhow::bail!("{} did not exit within 20 s of SIGTERM", s.name);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One run: start, drive the load to its end, stop; the client's wall time (ms) and, under the
/// preload, the library's statistics.
fn run(
    s: &Server,
    lib: &Path,
    dir: &Path,
    mode: Mode,
    quick: bool,
) -> Result<(f64, Option<Value>)> {
    let tag = format!("{}-{}", s.name, std::process::id());
    let heap = dir.join(format!("{tag}.heap"));
    let stats = dir.join(format!("{tag}.stats.json"));
    let _ = std::fs::remove_file(&stats);
    let r = start(s, lib, &heap, &stats, mode)?;
    let t0 = Instant::now();
    let out = load(s, r.port, quick).output();
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let stopped = stop(s, r);
    let out = out.with_context(|| format!("running {}", s.client))?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        s.client,
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    stopped?;
    let st = match mode {
        Mode::Plain => None,
        Mode::Preload { .. } => {
            let b =
                std::fs::read(&stats).with_context(|| format!("{}: no statistics file", s.name))?;
            Some(serde_json::from_slice::<Value>(&b).context("statistics JSON")?)
        }
    };
    let _ = std::fs::remove_file(&stats);
    let _ = std::fs::remove_file(&heap);
    Ok((ms, st))
}

/// One kill -9 round: the server under load with checkpoints every 100 ms is killed after
/// `after`; then `tiermem pheap verify` (this executable) and a reopen of its heap.
fn kill_round(s: &Server, lib: &Path, dir: &Path, after: Duration) -> Value {
    let tag = format!("{}-kill-{}", s.name, std::process::id());
    let heap = dir.join(format!("{tag}.heap"));
    let stats = dir.join(format!("{tag}.stats.json"));
    let res = (|| -> Result<Value> {
        let mut r = start(s, lib, &heap, &stats, Mode::Preload { verify: false })?;
        let mut client = load(s, r.port, false).spawn()?;
        std::thread::sleep(after);
        r.child.kill()?; // SIGKILL
        r.child.wait()?;
        let _ = client.kill();
        let _ = client.wait();
        let exe = std::env::current_exe()?;
        let v = Command::new(&exe)
            .args(["pheap", "verify", "--json"])
            .arg(&heap)
            .output()
            .context("running tiermem pheap verify")?;
        let verify: Value = serde_json::from_slice(&v.stdout).unwrap_or(Value::Null);
        let verified = v.status.success();
        let reopen = tiermem_pheap::Heap::open(&heap);
        let (reopened, objects, epoch) = match &reopen {
            Ok(h) => (true, h.len(), h.totals().epoch),
            Err(_) => (false, 0, 0),
        };
        let mut row = json!({"killed_after_ms": after.as_millis() as u64,
            "verify_ok": verified, "reopened": reopened, "objects": objects});
        if let Some(e) = verify
            .get("epoch")
            .or_else(|| verify.pointer("/header/epoch"))
        {
            row["epoch"] = e.clone();
        } else {
            row["epoch"] = json!(epoch);
        }
        if !verified {
            row["verify_output"] = json!(String::from_utf8_lossy(&v.stdout).into_owned());
        }
        if let Err(e) = reopen {
            row["reopen_error"] = json!(e.to_string());
        }
        Ok(row)
    })();
    let _ = std::fs::remove_file(&heap);
    let _ = std::fs::remove_file(&stats);
    res.unwrap_or_else(
        |e| json!({"killed_after_ms": after.as_millis() as u64, "error": format!("{e:#}")}),
    )
}

/// What the servers showed: per server, the slowdown (or a `skipped` / `error` reason), the
/// safepoint pause p99 (µs, median over the runs), the verified run and the kill rounds.
pub struct Servers {
    pub slowdown: serde_json::Map<String, Value>,
    pub pause_p99_us: serde_json::Map<String, Value>,
    pub rows: Vec<Value>,
}

/// Runs both servers (see the module contract); `runs` alternated plain/preload pairs each.
pub fn servers(dir: &Path, lib: &Path, quick: bool, runs: usize) -> Servers {
    let mut out = Servers {
        slowdown: serde_json::Map::new(),
        pause_p99_us: serde_json::Map::new(),
        rows: Vec::new(),
    };
    let kills = if quick { 1 } else { 4 };
    // Kill moments differ from run to run.
    let mut rng = Rng(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1);
    for s in &SERVERS {
        let missing: Vec<&str> = [s.name, s.client]
            .into_iter()
            .filter(|p| !on_path(p))
            .collect();
        if !missing.is_empty() {
            let why = format!("{} not installed", missing.join(" and "));
            out.slowdown
                .insert(s.name.into(), json!({ "skipped": why.clone() }));
            out.rows.push(json!({"program": s.name, "skipped": why}));
            continue;
        }
        let (mut plain, mut pre, mut p99, mut stop_p99) = (vec![], vec![], vec![], vec![]);
        let mut last = Value::Null;
        let mut err = None;
        for r in 0..runs {
            crate::progress::step(&format!(
                "{}: plain and under the preload (checkpoints every 100 ms), run {}",
                s.name,
                r + 1
            ));
            match run(s, lib, dir, Mode::Plain, quick).and_then(|(a, _)| {
                let (b, st) = run(s, lib, dir, Mode::Preload { verify: false }, quick)?;
                Ok((a, b, st.unwrap_or(Value::Null)))
            }) {
                Ok((a, b, st)) => {
                    plain.push(a);
                    pre.push(b);
                    p99.push(st["safepoint_pause_us"]["p99"].as_f64().unwrap_or(f64::NAN));
                    stop_p99.push(st["safepoint_stop_us"]["p99"].as_f64().unwrap_or(f64::NAN));
                    last = st;
                }
                Err(e) => {
                    err = Some(format!("{e:#}"));
                    break;
                }
            }
        }
        if let Some(e) = err {
            out.slowdown
                .insert(s.name.into(), json!({ "error": e.clone() }));
            out.rows.push(json!({"program": s.name, "error": e}));
            continue;
        }
        let (pm, qm) = (median(plain.clone()), median(pre.clone()));
        out.slowdown.insert(s.name.into(), json!(r2(qm / pm)));
        out.pause_p99_us
            .insert(s.name.into(), json!(r2(median(p99.clone()))));
        crate::progress::step(&format!("{}: every checkpoint verified", s.name));
        let verified = match run(s, lib, dir, Mode::Preload { verify: true }, quick) {
            Ok((ms, Some(st))) => json!({"client_ms": r2(ms), "checkpoints": st["checkpoints"],
                "verified": st["verified"], "verify_failed": st["verify_failed"],
                "skipped": st["skipped"]}),
            Ok((_, None)) => Value::Null,
            Err(e) => json!({"error": format!("{e:#}")}),
        };
        let mut kill_rows = Vec::new();
        for k in 0..kills {
            crate::progress::step(&format!("{}: kill -9 round {}", s.name, k + 1));
            let after = Duration::from_millis(300 + rng.below(1200) as u64);
            kill_rows.push(kill_round(s, lib, dir, after));
        }
        out.rows.push(json!({
            "program": s.name, "client": s.client,
            "plain_ms": r2(pm), "preload_ckpt100_ms": r2(qm),
            "plain_runs_ms": plain, "preload_runs_ms": pre,
            "safepoint_pause_p99_us_runs": p99, "safepoint_stop_p99_us_runs": stop_p99,
            "last_run_stats": {
                "checkpoints": last["checkpoints"], "skipped": last["skipped"],
                "threads_stopped_max": last["safepoint_threads_max"],
                "pause_us": last["safepoint_pause_us"], "stop_us": last["safepoint_stop_us"],
                "timeouts": last["safepoint_timeouts"], "bytes_copied": last["bytes_copied"],
                "ckpt_ns_total": last["ckpt_ns_total"], "ckpt_phase_ns": last["ckpt_phase_ns"]},
            "verify_each_run": verified,
            "kill9": kill_rows,
        }));
    }
    out
}
