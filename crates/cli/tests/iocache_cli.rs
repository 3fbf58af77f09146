//! `tiermem iocache stat|drop` on a real file, their errors, and `tiermem bench iocache`'s report
//! shape at a tiny budget (no timing thresholds here): every mode and pool fraction, the
//! must-have keys, no data file or cgroup left behind.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tiermem(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .output()
        .expect("run tiermem")
}

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn stat_and_drop_report_and_empty_the_page_cache() {
    let dir = scratch("iocache-cli");
    let f = dir.join("data");
    std::fs::write(&f, vec![7u8; 1 << 20]).unwrap();
    let p = f.to_str().unwrap();
    let out = tiermem(&["iocache", "stat", "--json", p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pages"], 256);
    assert_eq!(v["cached"], 256, "{v}");
    let out = tiermem(&["iocache", "drop", p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("256 pages cached before, 0 after"));
    let v: Value =
        serde_json::from_slice(&tiermem(&["iocache", "stat", "--json", p]).stdout).unwrap();
    assert_eq!(v["cached"], 0, "{v}");
    // A directory and a missing file: clear errors, non-zero status.
    let out = tiermem(&["iocache", "stat", dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
    let out = tiermem(&["iocache", "drop", dir.join("missing").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_iocache_reports_every_mode_and_the_ratios() {
    if !Path::new("/sys/fs/cgroup/memory/memory.stat").exists() {
        eprintln!("SKIPPED: no cgroup v1 memory controller");
        return;
    }
    let dir = scratch("iocache-bench");
    let out = tiermem(&[
        "bench",
        "iocache",
        "--quick",
        "--json",
        "--budget-mib",
        "8",
        "--reps",
        "1",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "tiermem failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(left.is_empty(), "data files left behind: {left:?}");
    let groups: Vec<_> = std::fs::read_dir("/sys/fs/cgroup/memory")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("tiermem-iocache-")
        })
        .collect();
    assert!(groups.is_empty(), "cgroups left behind: {groups:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    for k in [
        "dbio_over_buffered",
        "dbio_over_direct",
        "dbio_best_over_best",
        "zread_over_read_4k",
        "zread_over_read_16k",
        "zread_over_read_16k_consumed",
        "zread_into_min_over_read",
        "device_read_4k_us",
    ] {
        assert!(v.get(k).is_some(), "{k} missing");
    }
    assert!(v["dbio_over_buffered"].as_f64().unwrap() > 0.0);
    let rows = v["dbio"].as_array().unwrap();
    for mode in ["buffered", "direct", "dbio"] {
        for f in [0.25, 0.5, 0.75] {
            let r = rows
                .iter()
                .find(|r| r["mode"] == mode && r["pool_fraction"].as_f64() == Some(f))
                .unwrap_or_else(|| panic!("no {mode} row at {f}"));
            assert!(r["ops_per_s"].as_f64().unwrap() > 0.0);
            assert!(r["max_usage_bytes"].as_u64().unwrap() <= 8 << 20, "{r}");
            assert_eq!(r["oom_kills"], 0, "{r}");
        }
    }
}

/// `tiermem iocache run`: the unmodified sqlite3 shell, in the cgroup, loads the VFS named by
/// TIERMEM_IOCACHE_VFS and opens a database through an 8 MiB dbio pool (integrity ok, the pool's
/// settings from the options, the budget left to the cgroup); the exit status is the command's
/// (128 + N for a signal); bad sizes are refused before anything runs; no cgroup is left. Needs
/// libtiermem_iocache_vfs.so built next to the binary (a workspace build does it; alone:
/// `cargo build -p tiermem-iocache-vfs`).
#[test]
fn iocache_run_holds_the_sqlite_shell_in_a_cgroup_with_the_vfs() {
    if !Path::new("/sys/fs/cgroup/memory/memory.stat").exists() {
        eprintln!("SKIPPED: no cgroup v1 memory controller");
        return;
    }
    if Command::new("sqlite3").arg("-version").output().is_err() {
        eprintln!("SKIPPED: no sqlite3 shell on PATH");
        return;
    }
    let lib = Path::new(env!("CARGO_BIN_EXE_tiermem")).with_file_name("libtiermem_iocache_vfs.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo build -p tiermem-iocache-vfs",
        lib.display()
    );
    let dir = scratch("iocache-run");
    let db = dir.join("t.db");
    let made = Command::new("sqlite3")
        .arg(&db)
        .arg(
            "CREATE TABLE t(id INTEGER PRIMARY KEY, pad TEXT);
             WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 50000)
             INSERT INTO t SELECT i, printf('%0200d', i) FROM s;",
        )
        .output()
        .unwrap();
    assert!(made.status.success());
    assert!(std::fs::metadata(&db).unwrap().len() > 8 << 20);
    let script = format!(
        "sqlite3 :memory: \".load $TIERMEM_IOCACHE_VFS\" \".open '{}'\" .vfsname \
         'PRAGMA cache_size=-256' 'SELECT count(*), sum(id) FROM t' 'PRAGMA integrity_check' \
         'PRAGMA tiermem_iocache'",
        db.display()
    );
    let out = tiermem(&[
        "iocache", "run", "--mode", "dbio", "--budget", "64M", "--pool", "8M", "--", "sh", "-c",
        &script,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[..3],
        ["tiermem(dbio)", "50000|1250025000", "ok"],
        "{stdout}"
    );
    let report: Value = serde_json::from_str(lines[3]).unwrap();
    assert_eq!(report["pool_bytes"], 8 << 20, "{report}");
    assert_eq!(report["budget"], 64 << 20, "{report}");
    assert_eq!(report["enforce_budget"], false, "{report}");
    assert!(report["pool_misses"].as_u64().unwrap() > 0, "{report}");
    assert!(
        stderr.contains("max_usage") && stderr.contains("oom kills 0"),
        "{stderr}"
    );
    // The exit status is the command's, a signal's as a shell reports it.
    let code = |args: &[&str]| tiermem(args).status.code();
    assert_eq!(
        code(&["iocache", "run", "--", "sh", "-c", "exit 3"]),
        Some(3)
    );
    assert_eq!(
        code(&["iocache", "run", "--", "sh", "-c", "kill -KILL $$"]),
        Some(137)
    );
    assert_eq!(
        code(&["iocache", "run", "--", "/nonexistent/cmd"]),
        Some(127)
    );
    // Bad sizes: refused before anything runs.
    let out = tiermem(&[
        "iocache", "run", "--budget", "8M", "--pool", "16M", "--", "true",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("larger than --budget"));
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup/memory")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tiermem-iocache-run-"))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
