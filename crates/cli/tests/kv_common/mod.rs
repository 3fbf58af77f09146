//! What the kv end-to-end tests share: starting `tiermem kv serve` (one place), a small RESP2
//! client that reports malformed or torn replies as errors, and finding the real clients (a
//! missing one skips the test, or fails it under `TIERMEM_REQUIRE_CLIENTS=1`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiermem_kv::client::Client;

/// A client program on PATH, or `None` (and a note) when it is missing and not required.
pub fn client(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    });
    if found.is_none() {
        skip_unless_required(&format!("{name} is not installed"));
    }
    found
}

/// A test cannot run because of `what` (a client or tool that is missing): a failure under
/// `TIERMEM_REQUIRE_CLIENTS=1` (set by `scripts/test.sh`), else a note; the caller then skips.
pub fn skip_unless_required(what: &str) {
    assert!(
        std::env::var("TIERMEM_REQUIRE_CLIENTS").as_deref() != Ok("1"),
        "{what}: scripts/setup.sh installs it"
    );
    eprintln!("note: {what} (scripts/setup.sh installs it): skipping");
}

/// A running `tiermem kv serve` (killed on drop if still running).
pub struct Server {
    pub child: Child,
    pub port: u16,
    log: Arc<Mutex<String>>,
}

/// Create a new instance in the (missing or empty) directory `dir` and serve it: the one
/// place where the kv tests create instances (a server that requires an explicit flag to
/// create one gets it here).
pub fn create_server(dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--new"];
    args.extend_from_slice(extra);
    start_server(dir, &args)
}

/// Start `tiermem kv serve --engine vnvm` on the existing instance in `dir` with `extra` flags
/// and wait until it answers PING. The one place where the kv tests start servers.
pub fn start_server(dir: &Path, extra: &[&str]) -> Server {
    try_start_server(dir, extra).unwrap_or_else(|log| panic!("tiermem kv serve exited:\n{log}"))
}

/// [`start_server`], or the server's output if it exits instead of serving.
pub fn try_start_server(dir: &Path, extra: &[&str]) -> Result<Server, String> {
    try_start(&|_| {}, "vnvm", dir, extra)
}

/// [`try_start_server`] with engine `engine`, its command first given to `prepare` (e.g. to
/// enter a cgroup at exec).
pub fn try_start(
    prepare: &dyn Fn(&mut Command),
    engine: &str,
    dir: &Path,
    extra: &[&str],
) -> Result<Server, String> {
    // The free port is probed, then bound by the server: another process (tests run in
    // parallel) may take it in between. Then a new port, a few times.
    let mut tries = 0;
    loop {
        match try_start_once(prepare, engine, dir, extra) {
            Err(log) if log.contains("Address already in use") && tries < 3 => tries += 1,
            r => return r,
        }
    }
}

fn try_start_once(
    prepare: &dyn Fn(&mut Command),
    engine: &str,
    dir: &Path,
    extra: &[&str],
) -> Result<Server, String> {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tiermem"));
    prepare(&mut cmd);
    let mut child = cmd
        .args([
            "kv",
            "serve",
            "--engine",
            engine,
            "--port",
            &port.to_string(),
        ])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .env("TIERMEM_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tiermem kv serve");
    let log = Arc::new(Mutex::new(String::new()));
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        });
    }
    let mut s = Server { child, port, log };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(st)) = s.child.try_wait() {
            // (Let the output threads finish.)
            std::thread::sleep(Duration::from_millis(100));
            return Err(format!("exit status {st}\n{}", s.log()));
        }
        if let Ok(mut c) = Conn::connect(port) {
            // PONG, or NOAUTH from a server with a password: it serves.
            match c.try_cmd(&["PING"]) {
                Ok(Reply::Simple(p)) if p == "PONG" => return Ok(s),
                Ok(Reply::Error(e)) if e.starts_with("NOAUTH") => return Ok(s),
                _ => {}
            }
        }
        assert!(Instant::now() < deadline, "no PONG:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Wait up to `secs` for the server to exit; its status.
    pub fn wait_exit(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    /// A server still running is stopped as an operator would (SIGTERM: it releases its
    /// instance, whose shared-memory object in /dev/shm goes with it), and killed if it has
    /// not exited within 10 s. A test that means kill -9 does it itself.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child's pid (not yet reaped: try_wait saw it running).
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            if self.wait_exit(10).is_none() {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

pub use tiermem_kv::client::Reply;

/// The shared RESP2 client (`tiermem_kv::client`) with the tests' conveniences: string
/// arguments, a port on 127.0.0.1 and panicking variants.
pub struct Conn(pub Client);

impl Conn {
    pub fn connect(port: u16) -> std::io::Result<Conn> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        Ok(Conn(Client::new(s, Some(Duration::from_secs(60)))?))
    }

    pub fn send(&mut self, args: &[&str]) -> std::io::Result<()> {
        self.0.send(args)
    }

    /// One reply; an I/O error, or `InvalidData` for anything that is not RESP.
    pub fn read(&mut self) -> std::io::Result<Reply> {
        self.0.read()
    }

    /// Send a command and read its reply.
    pub fn try_cmd(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        self.send(args)?;
        self.read()
    }

    /// [`Conn::try_cmd`], panicking on errors.
    pub fn cmd(&mut self, args: &[&str]) -> Reply {
        self.send(args).unwrap();
        self.read().unwrap()
    }

    pub fn info(&mut self, section: &str) -> String {
        match self.cmd(&["INFO", section]) {
            Reply::Bulk(Some(b)) => String::from_utf8(b).unwrap(),
            r => panic!("INFO {section}: {r:?}"),
        }
    }
}
