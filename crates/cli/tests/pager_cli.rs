//! `tiermem pager calibrate` and `tiermem bench pager`'s report shape at a tiny size (no timing
//! thresholds here): every system row, every must-have key, no verify error or leaked slot, and
//! no swap file, swap device or cgroup left behind.

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

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn calibrate_reports_both_zones() {
    let dir = scratch("pager-calibrate");
    let out = tiermem(&[
        "pager",
        "calibrate",
        "--json",
        "--ms",
        "50",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["ssd_iops"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["nvm_iops"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["ssd_iops_by_threads"].as_array().unwrap().len(), 5);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "calibration left a file"
    );
    let out = tiermem(&["pager", "calibrate", "--dir", "/dev/shm", "--ms", "10"]);
    assert!(!out.status.success());
}

#[test]
fn bench_pager_reports_every_key_and_cleans_up() {
    if !is_root() {
        eprintln!("skipped: bench pager needs root (swapon, a memory cgroup)");
        return;
    }
    let dir = scratch("pager-bench");
    let png = dir.join("cdf.png");
    let out = tiermem(&[
        "bench",
        "pager",
        "--quick",
        "--json",
        "--data-mib",
        "64",
        "--seconds",
        "1",
        "--dir",
        dir.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let systems: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["system"].as_str().unwrap())
        .collect();
    assert_eq!(systems, ["kernel-swap", "pager-lru-ssd", "pager"], "{v}");
    for r in v["results"].as_array().unwrap() {
        for k in [
            "case",
            "system",
            "process",
            "bound_us",
            "pagein_p50_us",
            "pagein_p99_us",
            "pageout_p99_us",
            "op_p99_us",
            "ops_per_s",
            "bound_met",
            "nvm_served_frac",
            "budget_respected",
        ] {
            assert!(r.get(k).is_some(), "row lacks {k}: {r}");
        }
        assert_eq!(r["budget_respected"], true, "{r}");
    }
    for k in [
        "kernel_p99_us",
        "ssd_iops",
        "nvm_iops",
        "p99_ratio_vs_kernel_swap",
        "p99_ratio_vs_kernel_zram",
        "p50_ratio_vs_kernel_swap",
        "p99_ratio_vs_lru_ssd",
        "pageout_p99_ratio_vs_lru_ssd",
        "throughput_ratio_vs_kernel_swap",
        "app_p99_ratio_vs_kernel_swap",
        "bounds_met",
        "verify_errors",
        "leaked_slots",
        "cdf_png",
    ] {
        assert!(v.get(k).is_some(), "report lacks {k}");
    }
    assert_eq!(v["verify_errors"], 0);
    assert_eq!(v["leaked_slots"], 0);
    assert!(png.is_file(), "no CDF chart");
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    assert!(
        !swaps.contains(dir.to_str().unwrap()),
        "swap left on: {swaps}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path() != png)
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    let cg = Path::new("/sys/fs/cgroup/memory");
    if cg.is_dir() {
        let stale: Vec<_> = std::fs::read_dir(cg)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("tiermem-pager-bench")
            })
            .collect();
        assert!(stale.is_empty(), "cgroups left behind: {stale:?}");
    }
}
