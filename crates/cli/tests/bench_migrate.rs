//! `tiermem bench migrate` and `tiermem migrate run`: the report's shape on a small region
//! (every method, the paper's ratios, a timeline PNG; no timing thresholds here), and bad input.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let d =
        PathBuf::from("/dev/shm").join(format!("tiermem-benchmig-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiermem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
}

#[test]
fn bench_reports_every_method_the_ratios_and_a_timeline_png() {
    let dir = scratch("bench");
    let png = dir.join("timeline.png");
    let out = tiermem()
        .args([
            "bench",
            "migrate",
            "--quick",
            "--json",
            "--no-kv",
            "--sizes",
            "16m",
            "--workloads",
            "uniform,zipfian",
            "--reps",
            "2",
            "--timeline",
        ])
        .arg(&png)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    // 2 workloads × (FAM ×2, FAM + hot-page manifest, socket ×8, stop-and-copy, pre-copy).
    assert_eq!(results.len(), 26, "{v:#}");
    for r in results {
        for k in ["downtime_ms", "busy_ms", "total_ms", "degradation", "cpu_s"] {
            let x = r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
            assert!(x.is_finite() && x >= 0.0, "{k} = {x} in {r}");
        }
        assert!(r["total_ms"].as_f64().unwrap() >= r["downtime_ms"].as_f64().unwrap());
        // Two runs each: the median between their min and max.
        assert_eq!(r["runs"], 2, "{r}");
        for k in ["total_ms", "busy_ms"] {
            let (lo, med, hi) = (
                r[format!("{k}_min")].as_f64().unwrap(),
                r[k].as_f64().unwrap(),
                r[format!("{k}_max")].as_f64().unwrap(),
            );
            assert!(lo <= med && med <= hi, "{k}: {lo} {med} {hi} in {r}");
        }
        // Each run's worker process did the whole case: some CPU, at least the application's
        // warm-up and steady phase on one thread (50 + 150 ms with --quick) minus slack.
        assert!(r["cpu_s"].as_f64().unwrap() > 0.1, "{r}");
        let m = r["method"].as_str().unwrap();
        assert!(["fam", "fam+hot", "socket", "stop-and-copy", "pre-copy"].contains(&m));
        assert_eq!(r["expiration_ms"].is_null(), m != "socket", "{r}");
        assert!(r["workload"].is_string() && r["delay"].is_string());
    }
    let exp: Vec<u64> = results
        .iter()
        .filter(|r| {
            r["method"] == "socket" && r["delay"] == "ethernet-10g" && r["workload"] == "uniform"
        })
        .map(|r| r["expiration_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(exp, [0, 3, 100, 150]);
    for k in [
        "busy_ratio_socket_over_fam_100ms",
        "total_gain_fam2gbs_vs_socket10g_0ms_pct",
        "busy_gain_fam2gbs_vs_socket10g_0ms_pct",
        "downtime_gain_vs_socket_pct",
    ] {
        assert!(v[k].as_f64().unwrap().is_finite(), "{k}: {}", v[k]);
        // Each headline ratio has its per-CPU counterpart, overall and per case.
        let pc = format!("{k}_per_cpu");
        assert!(v[&pc].as_f64().unwrap().is_finite(), "{pc}: {}", v[&pc]);
        for c in v["ratios_by_case"].as_array().unwrap() {
            assert!(c[&pc].as_f64().unwrap().is_finite(), "{pc} in {c}");
        }
    }
    // The total-time gain of each round, smallest and largest, per case.
    for c in v["ratios_by_case"].as_array().unwrap() {
        let k = "total_gain_fam2gbs_vs_socket10g_0ms_pct";
        let (lo, hi) = (
            c[format!("{k}_min")].as_f64().unwrap(),
            c[format!("{k}_max")].as_f64().unwrap(),
        );
        assert!(lo.is_finite() && lo <= hi, "{c}");
    }
    assert_eq!(v["isolation"], "one process per system");
    assert!(v["cpu_method"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(v.get("kv_throughput_gain_3ms_pct_per_cpu").is_some());
    assert!(v.get("kv_throughput_gain_3ms_pct").is_some());
    assert_eq!(v["hot_manifest"].as_array().unwrap().len(), 2);
    let b = v["batching"].as_array().unwrap();
    assert_eq!(b.len(), 2);
    assert!(b
        .iter()
        .all(|x| x["per_vector_ms"].as_f64().unwrap() > 0.0
            && x["batched_ms"].as_f64().unwrap() > 0.0));
    let bytes = std::fs::read(&png).expect("the timeline PNG");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(dir.join("timeline.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_migrates_one_case_and_refuses_bad_input() {
    let out = tiermem()
        .args([
            "migrate",
            "run",
            "--size",
            "8m",
            "--method",
            "stop-and-copy",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verified"], true);
    assert_eq!(v["method"], "stop-and-copy");
    for (args, want) in [
        (&["--method", "carrier-pigeon"][..], "unknown method"),
        (&["--workload", "bursty"][..], "unknown workload"),
        (&["--size", "3k"][..], "at least 4 MiB"),
        (
            &["--method", "fam", "--delay-model", "warp"][..],
            "unknown delay model",
        ),
    ] {
        let out = tiermem()
            .args(["migrate", "run"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}
