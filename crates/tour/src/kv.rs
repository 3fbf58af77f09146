//! Tour step `kv`: `tiermem kv serve` on the durable vnvm engine, driven by the real `redis-cli`
//! and a short `redis-benchmark` run; then a client keeps writing while the server is killed
//! with SIGKILL, and a restarted server must hold every write that was acknowledged (checked
//! with a small RESP2 client and with `redis-cli`). Skipped when redis-tools is missing.

use super::{which, Ctx, Outcome};
use anyhow::{bail, ensure, Context, Result};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run the step in a directory of its own under `ctx`'s (removed, servers killed and reaped,
/// before it returns).
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    let (Some(cli), Some(bench)) = (which("redis-cli"), which("redis-benchmark")) else {
        return Ok(Outcome::Skipped(
            "redis-cli or redis-benchmark is not installed (Debian package redis-tools; \
             scripts/setup.sh installs it)"
                .into(),
        ));
    };
    let kdir = ctx.file("kv");
    let _cleanup = super::RemoveOnDrop::dir(&kdir);
    std::fs::create_dir_all(&kdir).with_context(|| format!("creating {}", kdir.display()))?;
    let data = kdir.join("data");

    let mut server = Server::start(&ctx.exe, &data, true, &kdir.join("server-1.log"))?;
    let port = server.port;
    say!(
        "started `tiermem kv serve --engine vnvm --durability commit --new` on 127.0.0.1:{port} (data in {})",
        data.display()
    );

    let out = redis_cli(
        &cli,
        port,
        "SET tour:hello \"stored by redis-cli\"\nRPUSH tour:list a b c\nINCRBY tour:counter 42\n\
         GET tour:hello\nLRANGE tour:list 0 -1\n",
    )?;
    let want = "OK\n3\n42\nstored by redis-cli\na\nb\nc\n";
    ensure!(out == want, "redis-cli got {out:?}, expected {want:?}");
    say!("redis-cli: SET, RPUSH, INCRBY, GET, LRANGE answered as Redis would");

    let (set, get) = redis_benchmark(&bench, port)?;
    say!(
        "redis-benchmark -t set,get -n 20000 -c 8 -r 10000: SET {set:.0} req/s (each durable before its reply), GET {get:.0} req/s"
    );

    let mut conn = Conn::connect(port)?;
    let base = conn.dbsize()?;

    // A client writes as fast as it can; the server is killed (SIGKILL) in the middle.
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        let mut c = Conn::connect(port)?;
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ok = c
                    .cmd(&[b"SET", ack_key(i).as_bytes(), ack_value(i).as_bytes()])
                    .is_ok_and(|r| r == Reply::Simple("OK".into()));
                if !ok {
                    break;
                }
                i += 1;
                acked.store(i, Ordering::Release);
            }
        })
    };
    let t = Instant::now();
    while acked.load(Ordering::Acquire) < 3000 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.kill9()?;
    let n = acked.load(Ordering::Acquire);
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    let n = n.max(acked.load(Ordering::Acquire));
    ensure!(n > 0, "no write was acknowledged before the kill");
    say!(
        "a client wrote keys as fast as the server acknowledged them; kill -9 of the server after {n} acknowledged SETs (the server was reaped)"
    );
    drop(conn);

    let t = Instant::now();
    let mut server = Server::start(&ctx.exe, &data, false, &kdir.join("server-2.log"))?;
    let restart_ms = t.elapsed().as_secs_f64() * 1e3;
    let port = server.port;
    let mut conn = Conn::connect(port)?;
    // Every acknowledged write, read back in pipelined batches.
    let mut i = 0;
    while i < n {
        let end = (i + 1000).min(n);
        for k in i..end {
            conn.send(&[b"GET", ack_key(k).as_bytes()])?;
        }
        for k in i..end {
            let r = conn.read()?;
            ensure!(
                r == Reply::Bulk(Some(ack_value(k).into_bytes())),
                "after the restart, acknowledged key {} holds {r:?}",
                ack_key(k)
            );
        }
        i = end;
    }
    // The write in flight at the kill: absent or whole.
    let inflight = match conn.cmd(&[b"GET", ack_key(n).as_bytes()])? {
        Reply::Bulk(None) => 0,
        Reply::Bulk(Some(v)) if v == ack_value(n).into_bytes() => 1,
        r => bail!("the write in flight at the kill came back torn: {r:?}"),
    };
    let size = conn.dbsize()?;
    ensure!(
        size == base + n + inflight,
        "after the restart the database holds {size} keys; {base} before the writer + {n} acknowledged (+ {inflight} in flight)"
    );
    let out = redis_cli(
        &cli,
        port,
        "GET tour:hello\nLRANGE tour:list 0 -1\nGET tour:counter\n",
    )?;
    let want = "stored by redis-cli\na\nb\nc\n42\n";
    ensure!(
        out == want,
        "after the restart redis-cli got {out:?}, expected {want:?}"
    );
    say!(
        "restarted on the same data (recovery included: {restart_ms:.0} ms to the first PONG): all {n} acknowledged writes read back, {size} keys as before the kill, redis-cli's keys intact"
    );
    drop(conn);
    server.stop()?;
    Ok(Outcome::Ok(format!(
        "redis-cli and redis-benchmark (SET {set:.0}/s durable, GET {get:.0}/s) against tiermem-kv; \
         after kill -9 and a restart every one of the {n} acknowledged writes was there"
    )))
}

fn ack_key(i: u64) -> String {
    format!("tour:ack:{i}")
}

fn ack_value(i: u64) -> String {
    format!("acknowledged write {i} {}", "v".repeat((i % 64) as usize))
}

/// `redis-cli -p PORT` with `script` (one command a line) on stdin; its stdout (raw replies,
/// one a line).
fn redis_cli(cli: &Path, port: u16, script: &str) -> Result<String> {
    let mut child = Command::new(cli)
        .args(["-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", cli.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "redis-cli failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A short `redis-benchmark` run of SET and GET; (SET, GET) requests per second.
fn redis_benchmark(bench: &Path, port: u16) -> Result<(f64, f64)> {
    let out = Command::new(bench)
        .args(["-p", &port.to_string(), "-t", "set,get", "-n", "20000"])
        .args(["-c", "8", "-r", "10000", "--csv"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", bench.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "redis-benchmark failed ({}): {}{}",
        out.status,
        text.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    // `"SET","34129.69",...`: the test's name, then requests per second.
    let rps = |test: &str| -> Result<f64> {
        text.lines()
            .find_map(|l| {
                let mut f = l.split(',').map(|s| s.trim_matches('"'));
                (f.next() == Some(test)).then(|| f.next()?.parse::<f64>().ok())?
            })
            .filter(|r| *r > 0.0)
            .with_context(|| format!("no {test} result in redis-benchmark's output:\n{text}"))
    };
    Ok((rps("SET")?, rps("GET")?))
}

/// A `tiermem kv serve` child process; killed with SIGKILL and reaped on drop.
struct Server {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Server {
    /// Start the server on `data` (a new instance when `new`), its output in `log`, and wait
    /// until it answers PING on the port it printed.
    fn start(exe: &Path, data: &Path, new: bool, log: &Path) -> Result<Server> {
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.args(["kv", "serve", "--engine", "vnvm", "--durability", "commit"])
            .args(["--port", "0", "--heap-size", "64mb"])
            .arg("--dir")
            .arg(data)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        if new {
            cmd.arg("--new");
        }
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent: the server
        // gets SIGKILL if the tour dies without reaching its cleanup (e.g. kill -9 of the tour).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().context("starting tiermem kv serve")?;
        let mut s = Server {
            child: Some(child),
            port: 0,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(c) = s.child.as_mut() {
                if let Some(st) = c.try_wait()? {
                    s.child = None;
                    bail!("tiermem kv serve exited ({st}):\n{}", s.log_text());
                }
            }
            if s.port == 0 {
                s.port = s
                    .log_text()
                    .lines()
                    .find_map(|l| l.split("listening on 127.0.0.1:").nth(1))
                    .and_then(|p| p.trim().parse().ok())
                    .unwrap_or(0);
            }
            if s.port != 0 {
                if let Ok(mut c) = Conn::connect(s.port) {
                    if c.cmd(&[b"PING"]).ok() == Some(Reply::Simple("PONG".into())) {
                        return Ok(s);
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "tiermem kv serve did not answer PING within 60 s:\n{}",
                    s.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, then reap.
    fn kill9(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill().context("kill -9 of the server")?;
            c.wait().context("reaping the server")?;
        }
        Ok(())
    }

    /// SIGTERM (a clean shutdown), then reap; SIGKILL after 10 s.
    fn stop(&mut self) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let pid = c.id() as libc::pid_t;
        // SAFETY: plain kill(2) of our own child, which has not been reaped (no pid reuse).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = c.try_wait()? {
                ensure!(
                    st.success(),
                    "the server exited with {st} after SIGTERM:\n{}",
                    self.log_text()
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                bail!("the server did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
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

/// A RESP2 reply.
use tiermem_kv::client::{Client, Reply};

/// The tour's connection: the project's RESP2 client (`tiermem_kv::client`) with errors as
/// `anyhow` and a DBSIZE helper.
struct Conn(Client);

impl Conn {
    fn connect(port: u16) -> Result<Conn> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        Ok(Conn(
            Client::connect(addr, Duration::from_secs(30))
                .with_context(|| format!("connecting to {addr}"))?,
        ))
    }

    fn send(&mut self, args: &[&[u8]]) -> Result<()> {
        Ok(self.0.send(args)?)
    }

    fn cmd(&mut self, args: &[&[u8]]) -> Result<Reply> {
        Ok(self.0.command(args)?)
    }

    fn dbsize(&mut self) -> Result<u64> {
        match self.cmd(&[b"DBSIZE"])? {
            Reply::Int(n) if n >= 0 => Ok(n as u64),
            r => bail!("DBSIZE answered {r:?}"),
        }
    }

    /// One reply; an error for anything that is not RESP2.
    fn read(&mut self) -> Result<Reply> {
        Ok(self.0.read()?)
    }
}
