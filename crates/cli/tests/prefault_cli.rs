//! `tiermem prefault run`: the options become the library's TIERMEM_PREFAULT_* variables and
//! LD_PRELOAD names libtiermem_prefault_preload.so next to the binary; the command's exit
//! status and output are its own; its exit report is written by the command, not by the
//! programs it starts; bad options are refused before anything runs; the help lists every
//! variable. Needs the library built in the same target directory (a workspace build does it;
//! alone: `cargo build --release -p tiermem-prefault-preload`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);
impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("prefault-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs tiermem; returns its pid (the command's after exec) and what it printed.
fn tiermem_pid(args: &[&str]) -> (u32, Output) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tiermem"));
    c.args(args)
        .env_remove("TIERMEM_DELAY")
        .env_remove("LD_PRELOAD")
        .env_remove("TIERMEM_PREFAULT_PRELOAD")
        // The service at normal priority: it progresses while other tests load the cores.
        .env("TIERMEM_PREFAULT_SCHED_IDLE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("run tiermem");
    let pid = child.id();
    (pid, child.wait_with_output().expect("wait for tiermem"))
}

fn tiermem(args: &[&str]) -> Output {
    tiermem_pid(args).1
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stats(path: &Path) -> serde_json::Value {
    let t = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("stats file {}: {e}", path.display()));
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"))
}

#[test]
fn prefault_run_sets_the_variables_and_keeps_the_commands_status_and_output() {
    let dir = Scratch::new("vars");
    let f = dir.path().join("report.json");
    let (pid, o) = tiermem_pid(&[
        "prefault",
        "run",
        "--budget",
        "1m",
        "--min",
        "512k",
        "--chunk",
        "8",
        "--entries",
        "4",
        "--order",
        "stride",
        "--populate",
        "read",
        "--thp",
        "off",
        "--interval-us",
        "500",
        "--no-heap",
        "--child",
        "restart",
        "--stats",
        f.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo \"$TIERMEM_PREFAULT_BUDGET $TIERMEM_PREFAULT_MIN $TIERMEM_PREFAULT_CHUNK \
         $TIERMEM_PREFAULT_ENTRIES $TIERMEM_PREFAULT_ORDER $TIERMEM_PREFAULT_POPULATE \
         $TIERMEM_PREFAULT_THP $TIERMEM_PREFAULT_INTERVAL_US $TIERMEM_PREFAULT_HEAP \
         $TIERMEM_PREFAULT_CHILD\"; echo \"$LD_PRELOAD\"; ls / > /dev/null; exit 3",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("1048576 524288 8 4 stride read off 500 0 restart"),
        "{out}"
    );
    assert!(
        lines
            .next()
            .is_some_and(|l| l.contains("libtiermem_prefault_preload.so")),
        "{out}"
    );
    // Written by the shell (the command: tiermem's pid, kept across exec), not by `ls`.
    let v = stats(&f);
    assert_eq!(v["budget_bytes"], 1048576, "{v}");
    assert_eq!(v["min_bytes"], 524288, "{v}");
    assert_eq!(v["heap_top_pad"], 0, "{v}");
    assert_eq!(v["pid"].as_u64(), Some(u64::from(pid)), "{v}");
}

#[test]
fn prefault_run_a_program_prints_the_same_and_reports() {
    let dir = Scratch::new("sort");
    let nums = dir.path().join("n.txt");
    let body: String = (0..300_000u64)
        .map(|i| format!("{}\n", i.wrapping_mul(2654435761) % 1_000_003))
        .collect();
    std::fs::write(&nums, body).unwrap();
    let f = dir.path().join("sort.json");
    let plain = Command::new("sort")
        .arg("-n")
        .arg(&nums)
        .output()
        .expect("sort");
    let o = tiermem(&[
        "prefault",
        "run",
        "--stats",
        f.to_str().unwrap(),
        "--",
        "sort",
        "-n",
        nums.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout == plain.stdout, "sort printed something else");
    let v = stats(&f);
    assert!(v["registered_bytes"].as_u64().unwrap() > 0, "{v}");
    println!("sort under tiermem prefault run: {v}");
}

#[test]
fn prefault_run_refuses_bad_options_before_running_anything() {
    let dir = Scratch::new("bad");
    let marker = dir.path().join("ran");
    let cmd = format!("touch {}", marker.display());
    for bad in [
        &["--budget", "12x"][..],
        &["--budget", "100"][..],
        &["--min", "lots"][..],
        &["--chunk", "65"][..],
        &["--entries", "0"][..],
        &["--order", "sideways"][..],
        &["--populate", "execute"][..],
        &["--thp", "maybe"][..],
    ] {
        let mut args = vec!["prefault", "run"];
        args.extend_from_slice(bad);
        args.extend_from_slice(&["--", "sh", "-c", &cmd]);
        let o = tiermem(&args);
        assert!(!o.status.success(), "{bad:?} accepted");
        assert!(text(&o).contains(bad[0]), "{bad:?}: {}", text(&o));
        assert!(!marker.exists(), "{bad:?}: the command ran");
    }
    let o = tiermem(&["prefault", "run", "--", "/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(text(&o).contains("/nonexistent/program"), "{}", text(&o));
}

#[test]
fn prefault_run_help_lists_every_variable() {
    let o = tiermem(&["prefault", "run", "--help"]);
    assert!(o.status.success());
    let h = text(&o);
    for v in [
        "TIERMEM_PREFAULT_BUDGET",
        "TIERMEM_PREFAULT_MIN",
        "TIERMEM_PREFAULT_CHUNK",
        "TIERMEM_PREFAULT_ENTRIES",
        "TIERMEM_PREFAULT_ORDER",
        "TIERMEM_PREFAULT_POPULATE",
        "TIERMEM_PREFAULT_THP",
        "TIERMEM_PREFAULT_INTERVAL_US",
        "TIERMEM_PREFAULT_HEAP",
        "TIERMEM_PREFAULT_STATS",
        "TIERMEM_PREFAULT_STATS_PID",
        "TIERMEM_PREFAULT_CHILD",
        "TIERMEM_PREFAULT_SCHED_IDLE",
        "TIERMEM_PREFAULT_DISABLE",
        "TIERMEM_PREFAULT_PRELOAD",
    ] {
        assert!(h.contains(v), "{v} missing from the help:\n{h}");
    }
}
