//! What the integration tests share: the preload library's path, running a program under it
//! with a deadline (a hang is a deadlock, reported as such) and reading its exit report.

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
    let so = profile_dir().join("libtiermem_prefault_preload.so");
    assert!(
        so.exists(),
        "{} is missing: build it with cargo build --release -p tiermem-prefault-preload",
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

/// What a run left.
#[derive(Debug)]
pub struct Outcome {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// A command with no TIERMEM_PREFAULT_* variable from the test's own environment.
pub fn command(prog: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(prog);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TIERMEM_PREFAULT_") || k == "LD_PRELOAD" {
            c.env_remove(k);
        }
    }
    c
}

/// Runs `c` (stdin from `input`), failing the test when it takes longer than `deadline` (it
/// is then killed: a deadlock, not a slow machine, at these sizes).
pub fn run(mut c: Command, input: Option<&Path>, deadline: Duration) -> Outcome {
    c.stdin(match input {
        Some(f) => Stdio::from(std::fs::File::open(f).expect("open stdin file")),
        None => Stdio::null(),
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let what = format!("{c:?}");
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
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

/// The exit report's JSON object.
pub fn read_stats(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("stats file {}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("stats file {} is not JSON ({e}): {text}", path.display()));
    for k in [
        "regions",
        "passes",
        "populate_calls",
        "populated_bytes",
        "tripwire_hits",
        "footprint_pages",
        "unused_bytes",
        "peak_unused_bytes",
        "budget_bytes",
        "backoffs",
        "failures",
        "service_cpu_ns",
        "process_minflt",
        "service_minflt",
        "app_minflt",
        "mmap_regions",
        "malloc_blocks",
        "heap_growths",
        "registered_bytes",
        "dropped",
        "purged",
    ] {
        assert!(v[k].is_u64(), "stats key {k} missing in {text}");
    }
    assert!(v["sched_idle"].is_boolean(), "sched_idle in {text}");
    assert!(v["sensing"].is_string(), "sensing in {text}");
    v
}

/// A u64 field of the report.
pub fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}
