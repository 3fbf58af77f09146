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
