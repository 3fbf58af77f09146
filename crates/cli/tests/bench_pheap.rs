//! `tiermem bench pheap --quick --json`: the report's shape (no timing thresholds here): every
//! workload × size × rate/interval × system row, the headline figures, and no heap files left.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn quick_json_has_every_row_and_the_headline_figures() {
    let dir = PathBuf::from("/dev/shm").join(format!("tiermem-benchpheap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(["bench", "pheap", "--quick", "--json"])
        .env("TIERMEM_DIR", &dir)
        .env_remove("TIERMEM_DELAY")
        .output()
        .expect("run tiermem");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "tiermem failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(left.is_empty(), "heap files left behind: {left:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Progress is drawn only on a terminal: into this pipe, nothing.
    assert!(
        !stderr.contains("update 64 B"),
        "progress printed into a pipe: {stderr}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    // Percentages of one system over another may be negative in a noisy run (bars are the
    // benchmark's, not the test's); times and rates are positive by construction.
    for k in [
        "bytes_saved_pct",
        "speedup_pct",
        "tracking_overhead_pct",
        "speedup_pct_per_cpu",
        "tracking_overhead_pct_per_cpu",
    ] {
        let x = v[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {v}"));
        assert!(x.is_finite(), "{k} = {x}");
    }
    for k in [
        "ckpt_fixed_us",
        "ckpt_gb_per_s",
        "memcpy_gb_per_s",
        "alloc_ratio_vs_glibc",
    ] {
        let x = v[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {v}"));
        assert!(x.is_finite() && x > 0.0, "{k} = {x}");
    }
    for k in ["ckpt_fixed_phase_us", "ckpt_dense_phase_ms"] {
        for p in ["scan", "log", "meta", "commit", "apply"] {
            assert!(v[k][p].as_f64().is_some(), "{k}.{p} missing: {}", v[k]);
        }
    }
    // jemalloc is installed by setup.sh (libjemalloc2): its arm ran.
    assert!(
        v["alloc"]["jemalloc"]["run_ms"].as_f64().is_some(),
        "{}",
        v["alloc"]
    );
    let progs = &v["programs"];
    assert!(
        progs.get("skipped").is_some() || progs["rows"].is_array(),
        "programs: skipped reason or rows: {progs}"
    );
    if progs.get("skipped").is_none() {
        let s = progs["preload_slowdown"]["sqlite3"].as_f64();
        assert!(
            s.is_some_and(|x| x > 0.0),
            "sqlite3 preload_slowdown: {progs}"
        );
        // The multi-threaded servers (issue #21 part 4): checkpointed at safepoints, every
        // checkpoint of the verified run equal to the heap, the heap verifying and reopening
        // after kill -9. Installed by setup.sh; a machine without them says so.
        let mut ran = false;
        for server in ["redis-server", "memcached"] {
            let sd = &progs["preload_slowdown"][server];
            if sd.get("skipped").is_some() && std::env::var_os("TIERMEM_REQUIRE_CLIENTS").is_none()
            {
                eprintln!("{server}: {sd}");
                continue;
            }
            assert!(sd.as_f64().is_some_and(|x| x > 0.0), "{server}: {progs}");
            ran = true;
            assert!(
                progs["safepoint_pause_p99_us"][server]
                    .as_f64()
                    .is_some_and(|x| x > 0.0),
                "{server} safepoint_pause_p99_us: {progs}"
            );
            let row = progs["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["program"] == server)
                .unwrap_or_else(|| panic!("no {server} row: {progs}"));
            let ve = &row["verify_each_run"];
            assert_eq!(ve["verify_failed"].as_u64(), Some(0), "{server}: {ve}");
            assert!(
                ve["verified"].as_u64().is_some_and(|n| n >= 1),
                "{server}: {ve}"
            );
            assert_eq!(ve["verified"], ve["checkpoints"], "{server}: {ve}");
            for k in row["kill9"].as_array().expect("kill9 rows") {
                assert_eq!(k["verify_ok"], true, "{server}: {k}");
                assert_eq!(k["reopened"], true, "{server}: {k}");
            }
        }
        if ran {
            assert!(v["safepoint_pause_p99_us"].as_f64().is_some(), "{v}");
        }
    }
    let rows = v["results"].as_array().expect("results array");
    for r in rows {
        let c = r["cpu_ms"]
            .as_f64()
            .unwrap_or_else(|| panic!("cpu_ms missing: {r}"));
        assert!(c.is_finite() && c >= 0.0, "cpu_ms = {c}: {r}");
    }
    let ckpt = ["pgck", "fgck", "fgck4", "fgck8"];
    let base = ["heap-nockpt", "malloc"];
    let has = |f: &dyn Fn(&Value) -> bool| rows.iter().filter(|r| f(r)).count();
    for size in [64, 128] {
        for pct in [1, 10, 50] {
            for sys in ckpt.iter().chain(base.iter()) {
                let n = has(&|r| {
                    r["workload"] == "update"
                        && r["object_size"] == size
                        && r["update_pct"] == pct
                        && r["system"] == *sys
                });
                assert_eq!(n, 1, "update {size} B {pct} % {sys}");
            }
        }
    }
    for size in [64, 128, 1024] {
        for secs in [5, 10, 15] {
            for sys in ckpt {
                let n = has(&|r| {
                    r["workload"] == "insert"
                        && r["object_size"] == size
                        && r["interval_s"] == secs
                        && r["system"] == sys
                });
                assert_eq!(n, 1, "insert {size} B {secs} s {sys}");
            }
        }
        for sys in base {
            let n = has(&|r| {
                r["workload"] == "insert" && r["object_size"] == size && r["system"] == sys
            });
            assert_eq!(n, 1, "insert {size} B {sys}");
        }
    }
    assert_eq!(rows.len(), 6 * 6 + 3 * (3 * 4 + 2));
    for r in rows {
        let sys = r["system"].as_str().unwrap();
        let ckpts = r["checkpoints"].as_u64().unwrap();
        let bytes = r["bytes_copied_total"].as_u64().unwrap();
        let run_ms = r["run_ms"].as_f64().unwrap();
        assert!(run_ms > 0.0, "{r}");
        assert!(r["minor_faults"].as_u64().is_some(), "{r}");
        if base.contains(&sys) {
            assert_eq!((ckpts, bytes), (0, 0), "{r}");
        } else {
            assert!(ckpts > 0 && bytes > 0, "{r}");
            assert!(r["ckpt_ms_mean"].as_f64().unwrap() >= 0.0, "{r}");
            let views = r["views"].as_u64().unwrap();
            assert_eq!(
                views,
                [1, 2, 4, 8][ckpt.iter().position(|s| *s == sys).unwrap()]
            );
        }
    }
}
