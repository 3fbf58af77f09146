//! One benchmarked system per process (issue #22): the parent side ([`Worker`]: start a child
//! that re-executes this binary, send it requests, read its replies with a deadline, reap it)
//! and the child side ([`serve`]: answer requests read from stdin until EOF).
//!
//! A system's background threads make its process multi-threaded, and glibc's allocator and
//! stdio take their locked paths in a multi-threaded process for good: a baseline sharing that
//! process would pay for threads that are not its own. So a benchmark starts one child per
//! system (`/proc/self/exe`, the very binary that runs, even if the file was rebuilt meanwhile,
//! with a hidden subcommand), which sets its system up once and is then driven step by step, so
//! that the parent can keep interleaving the systems per cell. A child inherits the parent's
//! environment, working directory and CPU affinity; its stderr is the parent's.
//!
//! Protocol: one JSON object per line. Requests (parent → child's stdin) are whatever the
//! benchmark defines; every request gets exactly one reply line (child's stdout → parent),
//! `{"ok": <value>}` or `{"error": "<message>"}`. The child exits at EOF on stdin (after
//! releasing its system). Nothing else may be written to the child's stdout.
//!
//! Failure: a child that exits, closes its stdout, answers garbage or does not answer within the
//! deadline gives the parent an error naming the system and the request (never a panic or a
//! hang); a [`Worker`] dropped (an error anywhere in the parent) closes the child's stdin, gives
//! it a few seconds to release its system, then kills and reaps it and removes the files the
//! parent named for it.

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a dropped worker may take to exit on its own (EOF on stdin) before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(20);

/// A child process running one benchmarked system, driven over its stdin and stdout.
pub struct Worker {
    /// The system's name, for messages.
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    /// Bytes read from stdout and not yet returned as a line.
    buf: Vec<u8>,
    /// Deadline of one request's reply.
    timeout: Duration,
    /// Files and directories the parent named for the child, removed once it is gone.
    cleanup: Vec<PathBuf>,
    /// Set once the child has been reaped.
    reaped: bool,
}

impl Worker {
    /// Start `tiermem <args>` (this very binary) as the worker of system `name`; `timeout`
    /// bounds each request, `cleanup` lists paths to remove once the child is gone (whatever
    /// happens). Fails if the process cannot be started.
    pub fn spawn(
        name: &str,
        args: &[String],
        timeout: Duration,
        cleanup: Vec<PathBuf>,
    ) -> Result<Worker> {
        Self::spawn_env(name, args, &[], timeout, cleanup)
    }

    /// [`Worker::spawn`] with extra environment variables for the child (for instance an
    /// `LD_PRELOAD` allocator that only this system's process gets).
    pub fn spawn_env(
        name: &str,
        args: &[String],
        env: &[(String, String)],
        timeout: Duration,
        cleanup: Vec<PathBuf>,
    ) -> Result<Worker> {
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("tiermem"));
        // /proc/self/exe is resolved in the forked child: the inode this process runs, even if
        // target/release/tiermem was rebuilt since (a newer binary might speak another protocol).
        let program = if std::path::Path::new("/proc/self/exe").exists() {
            PathBuf::from("/proc/self/exe")
        } else {
            exe.clone()
        };
        let mut child = Command::new(&program)
            .arg0(&exe)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting the {name} worker ({})", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the {name} worker has no pipes");
        };
        Ok(Worker {
            name: name.to_string(),
            child,
            stdin: Some(stdin),
            stdout,
            buf: Vec::new(),
            timeout,
            cleanup,
            reaped: false,
        })
    }

    /// The system's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Send `req` and return the child's reply, decoded as `T`. `what` names the request in
    /// errors. An error reply, a malformed one, the child's exit or silence past the deadline
    /// is an error (after which the worker is of no further use: the child is killed on drop).
    pub fn call<T: DeserializeOwned>(&mut self, req: &impl Serialize, what: &str) -> Result<T> {
        let who = format!("the {} worker (pid {})", self.name, self.child.id());
        let mut line = serde_json::to_string(req).context("encoding a worker request")?;
        line.push('\n');
        let sent = match self.stdin.as_mut() {
            Some(w) => w.write_all(line.as_bytes()).and_then(|_| w.flush()),
            None => Err(std::io::Error::other("its stdin is closed")),
        };
        if let Err(e) = sent {
            let status = self.reap_briefly();
            bail!("{who}: cannot send it {what}: {e}{}", describe_exit(status));
        }
        let deadline = Instant::now() + self.timeout;
        let reply = match self.read_line(deadline) {
            Ok(Some(l)) => l,
            Ok(None) => {
                let status = self.reap_briefly();
                bail!(
                    "{who} closed its output before answering {what}{} (its own messages, if \
                     any, are on stderr above)",
                    describe_exit(status)
                );
            }
            Err(LineError::Timeout) => {
                self.kill();
                bail!(
                    "{who} did not answer {what} within {} s; killed",
                    self.timeout.as_secs()
                );
            }
            Err(LineError::Io(e)) => {
                self.kill();
                bail!("{who}: reading its answer to {what}: {e}");
            }
        };
        let v: serde_json::Value = serde_json::from_str(&reply)
            .with_context(|| format!("{who} answered {what} with a malformed line: {reply:?}"))?;
        if let Some(e) = v.get("error") {
            bail!(
                "{} worker, {what}: {}",
                self.name,
                e.as_str().unwrap_or("?")
            );
        }
        let Some(ok) = v.get("ok") else {
            bail!("{who} answered {what} with neither ok nor error: {reply}");
        };
        serde_json::from_value(ok.clone())
            .with_context(|| format!("{who} answered {what} with an unexpected value: {ok}"))
    }

    /// Close the child's stdin (it releases its system and exits) and reap it; an error if it
    /// does not exit within the grace period (it is killed then) or exits unsuccessfully.
    pub fn finish(mut self) -> Result<()> {
        self.stdin = None;
        let status = self.wait_for(EXIT_GRACE);
        match status {
            Some(s) if s.success() => Ok(()),
            Some(s) => bail!("the {} worker exited with {s}", self.name),
            None => {
                self.kill();
                bail!(
                    "the {} worker did not exit within {} s of its input closing; killed",
                    self.name,
                    EXIT_GRACE.as_secs()
                )
            }
        }
    }

    /// One line of the child's stdout (without the newline), `None` at EOF.
    fn read_line(&mut self, deadline: Instant) -> std::result::Result<Option<String>, LineError> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..i]).into_owned()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LineError::Timeout);
            }
            let mut pfd = libc::pollfd {
                fd: self.stdout.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            // SAFETY: one valid pollfd for a descriptor this worker owns.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(LineError::Io(e));
            }
            if r == 0 {
                continue;
            }
            // Readable or hung up: this read does not block.
            match self.stdout.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(LineError::Io(e)),
            }
        }
    }

    /// After the child closed its output: wait a moment for its exit status (killing it if it
    /// lingers), for the error message.
    fn reap_briefly(&mut self) -> Option<ExitStatus> {
        self.stdin = None;
        let s = self.wait_for(Duration::from_secs(2));
        if s.is_none() {
            self.kill();
        }
        s
    }

    /// Wait up to `limit` for the child to exit; its status, `None` if it is still running.
    fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => {
                    self.reaped = true;
                    return Some(s);
                }
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return None,
                Err(_) => return None,
            }
        }
    }

    /// Kill the child (SIGKILL) and reap it.
    fn kill(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.reaped = true;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.reaped {
            // EOF on its stdin: a healthy child releases its system and exits.
            self.stdin = None;
            if self.wait_for(EXIT_GRACE).is_none() {
                self.kill();
            }
        }
        for p in &self.cleanup {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Why no line was read.
enum LineError {
    Timeout,
    Io(std::io::Error),
}

/// ", exited with …" / ", killed by signal …" for an error message ("" when unknown).
fn describe_exit(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!(" (it exited with status {c})"),
            (None, Some(sig)) => format!(" (it was killed by signal {sig})"),
            _ => format!(" ({s})"),
        },
        None => String::new(),
    }
}

/// The child side: read one JSON request per line from stdin, answer each with
/// `{"ok": handler's value}` or `{"error": message}` on stdout, until EOF (then `Ok`) or until
/// the handler returns `Ok(None)` (a request to stop; answered with `{"ok": null}`).
pub fn serve<R, F>(mut handler: F) -> Result<()>
where
    R: DeserializeOwned,
    F: FnMut(R) -> Result<Option<serde_json::Value>>,
{
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut line = String::new();
    loop {
        line.clear();
        if stdin
            .lock()
            .read_line(&mut line)
            .context("reading a request")?
            == 0
        {
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        let (reply, stop) = match serde_json::from_str::<R>(&line) {
            Err(e) => (
                serde_json::json!({ "error": format!("malformed request {:?}: {e}", line.trim()) }),
                false,
            ),
            Ok(req) => match handler(req) {
                Ok(Some(v)) => (serde_json::json!({ "ok": v }), false),
                Ok(None) => (serde_json::json!({ "ok": null }), true),
                Err(e) => (
                    serde_json::json!({ "error": crate::error_chain(&e) }),
                    false,
                ),
            },
        };
        writeln!(out, "{reply}").context("writing a reply")?;
        out.flush().context("writing a reply")?;
        if stop {
            return Ok(());
        }
    }
}
