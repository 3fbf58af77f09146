//! `tiermem bench vnvm`: the report's shape on a small array (no timing thresholds here), and
//! what a failing system worker process does to the run.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let d =
        PathBuf::from("/dev/shm").join(format!("tiermem-benchvnvm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bench(args: &[&str], dir: &std::path::Path, bytes: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(["bench", "vnvm", "--quick"])
        .args(args)
        .env("TIERMEM_DIR", dir)
        .env("TIERMEM_BENCH_VNVM_BYTES", bytes)
        .env_remove("TIERMEM_DELAY")
        .env_remove("PMEM_IS_PMEM_FORCE")
        .output()
        .expect("run tiermem")
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "tiermem failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn finite_positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

#[test]
fn quick_json_has_every_cell_for_every_system() {
    let dir = scratch("json");
    let v = json(&bench(&["--json"], &dir, "8MiB"));
    let rows = v["results"].as_array().expect("results array");
    assert_eq!(rows.len(), 12, "2 pass counts x 6 sizes");
    let mut cells = Vec::new();
    for r in rows {
        let p = r["passes"].as_u64().expect("passes");
        let s = r["bytes_per_page"].as_u64().expect("bytes_per_page");
        cells.push((p, s));
        let what = format!("P={p} S={s}");
        finite_positive(&r["pmdk_tps"], &format!("{what} pmdk_tps"));
        finite_positive(&r["memcpy_tps"], &format!("{what} memcpy_tps"));
        let vnvm = finite_positive(&r["vnvm_tps"], &format!("{what} vnvm_tps"));
        let pmdk = r["pmdk_tps"].as_f64().unwrap();
        let ratio = finite_positive(&r["ratio_vs_pmdk"], &format!("{what} ratio_vs_pmdk"));
        assert!(
            (ratio - vnvm / pmdk).abs() <= 0.01 * ratio.max(1.0),
            "{what}: ratio {ratio} is not vnvm/pmdk = {}",
            vnvm / pmdk
        );
        // CPU beside wall time: each system used some, and the per-CPU ratio is the ratio of
        // the per-CPU throughputs.
        finite_positive(&r["vnvm_cpu_s"], &format!("{what} vnvm_cpu_s"));
        finite_positive(&r["pmdk_cpu_s"], &format!("{what} pmdk_cpu_s"));
        finite_positive(&r["memcpy_cpu_s"], &format!("{what} memcpy_cpu_s"));
        let vpc = finite_positive(&r["vnvm_tps_per_cpu"], &format!("{what} vnvm_tps_per_cpu"));
        let ppc = finite_positive(&r["pmdk_tps_per_cpu"], &format!("{what} pmdk_tps_per_cpu"));
        let rpc = finite_positive(
            &r["ratio_vs_pmdk_per_cpu"],
            &format!("{what} ratio_vs_pmdk_per_cpu"),
        );
        assert!(
            (rpc - vpc / ppc).abs() <= 0.01 * rpc.max(1.0),
            "{what}: per-CPU ratio {rpc} is not {vpc}/{ppc}"
        );
        // 8 MiB = 2048 pages = 64 transactions of 32 page writes per pass.
        assert_eq!(r["transactions"].as_u64(), Some(64 * p), "{what}");
    }
    let mut expect = Vec::new();
    for p in [1, 16] {
        for s in [16, 32, 64, 128, 256, 512] {
            expect.push((p, s));
        }
    }
    assert_eq!(cells, expect);
    finite_positive(&v["read_overhead_ratio"], "read_overhead_ratio");
    finite_positive(&v["read_pass"]["plain_gbps"], "read_pass.plain_gbps");
    assert_eq!(v["array_bytes"].as_u64(), Some(8 << 20));
    assert_eq!(v["repetitions"].as_u64(), Some(3));
    assert_eq!(v["delay"]["model"], "none");
    assert_eq!(v["pmdk"]["pmem_is_pmem_force"], "1");
    assert!(v["pmdk"]["libpmemobj"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert!(v["machine"]["cpus"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(v["vnvm"], "measured");
    // Every system in a process of its own (issue #22).
    assert_eq!(v["isolation"], "one process per system");
    assert!(v["cpu_method"]
        .as_str()
        .is_some_and(|s| s.contains("worker process")));

    // vnvm's commit latency, worker awake and asleep (no thresholds: only the shape).
    let c = &v["commit_latency"];
    for k in ["awake", "asleep"] {
        let p50 = finite_positive(&c[format!("{k}_p50_ns")], &format!("{k}_p50_ns"));
        let p99 = finite_positive(&c[format!("{k}_p99_ns")], &format!("{k}_p99_ns"));
        assert!(p99 >= p50, "{k}: p99 {p99} < p50 {p50}");
    }
    assert_eq!(c["pause_us"].as_u64(), Some(15_000));
    assert!(c["wake_cost_p50_ns"].is_i64());
    finite_positive(&c["unpark_sleeping_p50_ns"], "unpark_sleeping_p50_ns");

    // Placement: every system's working memory, resident after setup, behind an absorber.
    let pl = &v["placement"];
    assert_eq!(
        pl["setup_order"],
        serde_json::json!(["memcpy", "pmdk", "vnvm"])
    );
    assert_eq!(pl["absorber"]["enabled"], true);
    assert!(pl["absorber"]["bytes"].as_u64().is_some_and(|b| b > 0));
    let mem = pl["memory"].as_array().expect("placement.memory");
    let find = |sys: &str, what: &str| {
        mem.iter()
            .find(|m| m["system"] == sys && m["memory"] == what)
            .unwrap_or_else(|| panic!("no {sys} {what} in {mem:?}"))
    };
    for (sys, what) in [
        ("memcpy", "array"),
        ("pmdk", "pool (array)"),
        ("vnvm", "DRAM cache"),
    ] {
        let m = find(sys, what);
        assert_eq!(m["bytes"].as_u64(), Some(8 << 20), "{sys} {what}");
        assert_eq!(m["resident_bytes"].as_u64(), Some(8 << 20), "{sys} {what}");
        assert_eq!(m["min_2mib_blocks"].as_u64(), Some(4), "{sys} {what}");
    }
    for what in ["log pool", "cache pool"] {
        let m = find("vnvm", what);
        assert!(
            m["bytes"].as_u64().is_some_and(|b| b > 8 << 20),
            "vnvm {what}: {m}"
        );
    }

    // The PMDK pool and the vnvm instance are removed afterwards.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn delay_model_is_reported_and_charged_for_both_baselines() {
    let dir = scratch("delay");
    let out = Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(["--delay", "nvmm", "bench", "vnvm", "--quick", "--json"])
        .env("TIERMEM_DIR", &dir)
        .env("TIERMEM_BENCH_VNVM_BYTES", "1MiB")
        .env("TIERMEM_BENCH_VNVM_ABSORB", "0")
        .output()
        .expect("run tiermem");
    let v = json(&out);
    assert_eq!(v["delay"]["model"], "nvmm");
    for k in ["memcpy_charged", "pmdk_charged"] {
        assert!(
            v["delay"][k].as_str().is_some_and(|s| s.contains("S")),
            "{k}"
        );
    }
    assert_eq!(v["results"].as_array().map(Vec::len), Some(12));
    assert_eq!(v["placement"]["absorber"]["enabled"], false);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn table_has_every_column_and_bad_sizes_are_refused() {
    let dir = scratch("table");
    let out = bench(&[], &dir, "4MiB");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("vnvm tx/s") && text.contains("vnvm/PMDK"),
        "{text}"
    );
    assert!(
        text.contains("PMDK tx/s") && text.contains("memcpy tx/s"),
        "{text}"
    );
    assert!(
        text.contains("2-MiB physical blocks: memcpy array")
            && text.contains("nv_commit latency")
            && text.contains("wake cost"),
        "{text}"
    );

    let out = bench(&["--json"], &dir, "12 bananas");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TIERMEM_BENCH_VNVM_BYTES"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bench(&["--json"], &dir, "100");
    assert!(!out.status.success(), "less than a page");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker that dies, reports an error or hangs gives a clear error, no worker is left running
/// and no pool file is left behind.
#[test]
fn a_failing_worker_is_a_clear_error_and_nothing_is_left_behind() {
    for (fault, want) in [
        ("pmdk:cell:exit", "the pmdk worker"),
        ("vnvm:setup:error", "injected failure of setup"),
        ("vnvm:read_pass:hang", "did not answer read pass within 2 s"),
    ] {
        let dir = scratch(&fault.replace(':', "-"));
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_tiermem"))
            .args(["bench", "vnvm", "--quick", "--json"])
            .env("TIERMEM_DIR", &dir)
            .env("TIERMEM_BENCH_VNVM_BYTES", "1MiB")
            .env("TIERMEM_BENCH_VNVM_ABSORB", "0")
            .env("TIERMEM_BENCH_VNVM_WORKER_FAULT", fault)
            .env("TIERMEM_BENCH_VNVM_WORKER_TIMEOUT", "2")
            .env_remove("TIERMEM_DELAY")
            .output()
            .expect("run tiermem");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{fault}: succeeded");
        assert!(err.contains(want), "{fault}: {err}");
        assert!(!err.contains("panicked"), "{fault}: {err}");
        assert!(out.stdout.is_empty(), "{fault}: no report on failure");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{fault}: took {:?}",
            started.elapsed()
        );
        // The workers are reaped: no process has this test's directory in its environment.
        let needle = format!("TIERMEM_DIR={}", dir.display());
        let alive: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .filter(|e| {
                std::fs::read(e.path().join("environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(alive.is_empty(), "{fault}: workers left running: {alive:?}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{fault}: left behind: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
