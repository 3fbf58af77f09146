//! What the integration tests share: the preload library's path, a scratch directory on a
//! block file system, running a program under the library with a deadline, and reading its exit
//! reports.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The target directory holding this test binary's profile (…/target/<profile>).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // …/target/<profile>/deps/<test>-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The library cargo built for these tests.
pub fn preload_lib() -> PathBuf {
    let so = profile_dir().join("libtiermem_zread_preload.so");
    assert!(
        so.exists(),
        "{} is missing: build it with cargo build -p tiermem-zread-preload",
        so.display()
    );
    so
}

/// Whether `prog` is on PATH.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A fresh scratch directory under `/var/tmp` (a block file system: leases and the page cache
/// as a database would see them), removed when dropped.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tiermem-zread-preload-{name}-"))
        .tempdir_in("/var/tmp")
        .expect("scratch directory in /var/tmp")
}

/// A command with no TIERMEM_ZREAD* variable or LD_PRELOAD from the test's own environment.
pub fn command(prog: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(prog);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TIERMEM_ZREAD") || k == "LD_PRELOAD" {
            c.env_remove(k);
        }
    }
    c
}

/// `c` under the library, serving `served` and reporting to `stats`, with `env` on top.
pub fn preloaded(mut c: Command, served: &Path, stats: &Path, env: &[(&str, &str)]) -> Command {
    c.env("LD_PRELOAD", preload_lib())
        .env("TIERMEM_ZREAD", served)
        .env("TIERMEM_ZREAD_STATS", stats);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// What a run left.
#[derive(Debug)]
pub struct Outcome {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: String,
}

impl Outcome {
    /// Standard output as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Runs `c`, failing the test when it takes longer than `deadline` (it is then killed: a
/// deadlock, not a slow machine, at these sizes).
pub fn run(mut c: Command, deadline: Duration) -> Outcome {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let what = format!("{c:?}");
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {deadline:?}: hung (deadlock?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        code: status.code(),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// The exit reports in `path` (one JSON object per line, one line per process that read a
/// served fd); empty when the file does not exist.
pub fn reports(path: &Path) -> Vec<serde_json::Value> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {l}", path.display()));
            for k in [
                "pid",
                "files",
                "routed",
                "passed",
                "fallbacks",
                "into_calls",
                "into_remapped_pages",
                "into_copied_bytes",
                "model_copies",
                "lease_breaks",
            ] {
                assert!(v[k].is_u64(), "report key {k} missing in {l}");
            }
            v
        })
        .collect()
}

/// A counter of a report.
pub fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}
