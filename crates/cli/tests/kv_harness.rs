//! The client harness of `tiermem bench kv` (`tiermem_bench::kv_harness`, which the tiermem-kv
//! tests use too): its parsers on outputs captured from YCSB 0.17.0 and redis-benchmark
//! 7.0 (`tests/data`), and one small real run against redis-server where it and the YCSB binding
//! are installed (scripts/setup.sh installs both; without them that test says it skipped, or
//! fails under `TIERMEM_REQUIRE_CLIENTS=1`).

mod kv_common;
use tiermem_bench::kv_harness;

use kv_harness::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn data(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn redis_benchmark_csv_rows_in_microseconds() {
    let rows = parse_redis_benchmark_csv(&data("redis-benchmark.csv")).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].test, "SET");
    assert_eq!(rows[0].rps, 555555.56);
    assert_eq!(rows[0].p99_us, 3039.0);
    assert_eq!(rows[0].p50_us, 1111.0);
    assert_eq!(rows[1].test, "GET");
    assert_eq!(rows[1].rps, 740740.75);
    assert_eq!(rows[1].p99_us, 1535.0);
    assert_eq!(rows[1].max_us, 2031.0);

    // Lines before the header (warnings) are skipped; columns are found by name.
    let shuffled = "WARNING: Could not fetch server CONFIG\n\
                    \"test\",\"p99_latency_ms\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\
                    \"p50_latency_ms\",\"p95_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"0.500\",\"1000.00\",\"0.1\",\"0.1\",\"0.2\",\"0.3\",\"0.9\"\n";
    let rows = parse_redis_benchmark_csv(shuffled).unwrap();
    assert_eq!((rows[0].rps, rows[0].p99_us), (1000.0, 500.0));

    assert!(parse_redis_benchmark_csv("").is_err(), "no header");
    assert!(
        parse_redis_benchmark_csv("\"test\",\"rps\"\n\"SET\",\"1\"\n").is_err(),
        "no latency columns"
    );
    let header = data("redis-benchmark.csv")
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert!(parse_redis_benchmark_csv(&header).is_err(), "no rows");
    assert!(
        parse_redis_benchmark_csv(&format!(
            "{header}\n\"SET\",\"x\",\"1\",\"1\",\"1\",\"1\",\"1\",\"1\"\n"
        ))
        .is_err(),
        "a field that is not a number"
    );
}

#[test]
fn ycsb_run_report_with_hdr_and_raw_measurements() {
    let r = parse_ycsb(&data("ycsb-run-a.txt")).unwrap();
    assert_eq!(r.runtime_ms, 137.0);
    assert!((r.throughput - 2189.78102189781).abs() < 1e-9);
    assert_eq!(
        r.ops.keys().map(String::as_str).collect::<Vec<_>>(),
        ["READ", "UPDATE"],
        "CLEANUP, GC and the [Raw...] summaries are left out"
    );
    let read = &r.ops["READ"];
    assert_eq!(read.operations, 145);
    assert_eq!(
        (read.p95_us, read.p99_us, read.max_us),
        (433.0, 1682.0, 1752.0)
    );
    assert_eq!(read.returns.get("OK"), Some(&145));
    assert_eq!(r.ops["UPDATE"].operations, 155);
    assert_eq!(r.ops["UPDATE"].p99_us, 508.0);
    assert_eq!((r.operations(), r.errors()), (300, 0));
    assert_eq!(r.max_op_p99_us(), Some(1682.0));
    assert_eq!(r.merged_p99_us, None, "set by Ycsb::run from the raw file");

    // Every read and update merged: 300 samples, the 297th smallest.
    assert_eq!(merged_p99(&data("ycsb-run-a.raw")), Some((1682.0, 300)));
    let raw = "RawREAD latency raw data: op, timestamp(ms), latency(us)\n\
               RawREAD,1,10\nRawREAD,2,30\n\
               RawCLEANUP latency raw data: op, timestamp(ms), latency(us)\nRawCLEANUP,3,9999\n\
               RawUPDATE latency raw data: op, timestamp(ms), latency(us)\nRawUPDATE,4,20\n";
    assert_eq!(
        merged_p99(raw),
        Some((30.0, 3)),
        "CLEANUP and headers skipped"
    );
    assert_eq!(merged_p99("RawREAD latency raw data: op\n"), None);
}

#[test]
fn ycsb_load_report_and_failed_operations() {
    let r = parse_ycsb(&data("ycsb-load.txt")).unwrap();
    assert_eq!(
        r.ops.keys().map(String::as_str).collect::<Vec<_>>(),
        ["INSERT"]
    );
    assert_eq!((r.operations(), r.errors()), (200, 0));
    assert!(r.throughput > 0.0);

    let failing = "[OVERALL], RunTime(ms), 10\n[OVERALL], Throughput(ops/sec), 100.0\n\
                   [READ], Operations, 5\n[READ], 99thPercentileLatency(us), 7\n\
                   [READ], Return=OK, 2\n[READ], Return=NOT_FOUND, 3\n\
                   [UPDATE], Operations, 1\n[UPDATE], Return=ERROR, 1\n";
    let r = parse_ycsb(failing).unwrap();
    assert_eq!((r.operations(), r.errors()), (6, 4));
    assert!(
        parse_ycsb("[READ], Operations, 5\n").is_err(),
        "no [OVERALL]"
    );
    assert!(
        parse_ycsb("[OVERALL], RunTime(ms), x\n").is_err(),
        "bad number"
    );
}

fn scratch(name: &str) -> PathBuf {
    let d =
        PathBuf::from("/dev/shm").join(format!("tiermem-kvharness-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// redis-server (appendfsync everysec) driven by redis-benchmark and YCSB through the harness, as
/// `tiermem bench kv` and the tiermem-kv tests do; and the harness' failures.
#[test]
fn real_redis_server_with_redis_benchmark_and_ycsb() {
    let Some(_) = kv_common::client("redis-server") else {
        return;
    };
    let ycsb = match Ycsb::locate() {
        Ok(y) if y.dir.join("target/tiermem-ycsb.jar").is_file() => y,
        Ok(y) => {
            kv_common::skip_unless_required(&format!(
                "the YCSB binding is not built (no {})",
                y.dir.join("target/tiermem-ycsb.jar").display()
            ));
            return;
        }
        Err(e) => {
            kv_common::skip_unless_required(&format!("the YCSB binding: {e:#}"));
            return;
        }
    };
    ycsb.build().unwrap();
    let dir = scratch("redis");
    let (data_dir, logs) = (dir.join("data"), dir.join("logs"));
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::create_dir_all(&logs).unwrap();

    // A server that exits at once: its log is in the error.
    let port = free_port().unwrap();
    let mut bad = redis_server_command(port, &data_dir, "everysec");
    bad.arg("--no-such-option");
    let err = Server::start(
        "bad",
        bad,
        port,
        &logs.join("bad.log"),
        Duration::from_secs(10),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("exited during start-up") && err.contains("no-such-option"),
        "{err}"
    );

    let port = free_port().unwrap();
    let cmd = redis_server_command(port, &data_dir, "everysec");
    let server = Server::start(
        "redis",
        cmd,
        port,
        &logs.join("redis.log"),
        Duration::from_secs(20),
    )
    .unwrap();
    assert_eq!(
        command_line(port, &["PING"], Duration::from_secs(2)).unwrap(),
        "+PONG"
    );

    let rb = RedisBenchmark {
        tests: vec!["set".into(), "get".into()],
        pipeline: 16,
        requests: 20_000,
        keyspace: None,
    };
    let rows = rb.run(port, &logs, Duration::from_secs(60)).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.test.as_str()).collect::<Vec<_>>(),
        ["SET", "GET"]
    );
    assert!(
        rows.iter().all(|r| r.rps > 0.0 && r.p99_us > 0.0),
        "{rows:?}"
    );

    // redis-benchmark's keys go: YCSB starts on an empty keyspace.
    assert_eq!(
        command_line(port, &["FLUSHALL"], Duration::from_secs(5)).unwrap(),
        "+OK"
    );

    let w = YcsbWorkload {
        port,
        workload: "a".into(),
        threads: 2,
        records: 300,
        ops: 1000,
        ..Default::default()
    };
    let load = ycsb.load(&w, &logs).unwrap();
    assert_eq!(load.ops["INSERT"].operations, 300);
    // 300 hashes and the _indices sorted set.
    assert_eq!(
        command_line(port, &["DBSIZE"], Duration::from_secs(2)).unwrap(),
        ":301"
    );
    assert_eq!(
        command_line(port, &["ZCARD", "_indices"], Duration::from_secs(2)).unwrap(),
        ":300"
    );
    let run = ycsb.run(&w, &logs).unwrap();
    assert_eq!(
        (run.operations(), run.errors(), run.raw_samples),
        (1000, 0, 1000)
    );
    let p99 = run.merged_p99_us.expect("merged p99");
    // A latency that was measured: between the smallest minimum and the largest maximum.
    let min = run.ops.values().map(|o| o.min_us).fold(f64::MAX, f64::min);
    let max = run.ops.values().map(|o| o.max_us).fold(0.0, f64::max);
    assert!(p99 > 0.0 && min <= p99 && p99 <= max, "{run:?}");
    assert!(run.throughput > 0.0);
    // Workload E scans (ZRANGEBYSCORE on _indices, then a read per key) and inserts.
    let e = YcsbWorkload {
        workload: "e".into(),
        ops: 200,
        ..w.clone()
    };
    let run_e = ycsb.run(&e, &logs).unwrap();
    assert!(run_e.ops.contains_key("SCAN"), "{run_e:?}");

    let (status, clean) = server
        .stop(
            Stop::Command(&["SHUTDOWN", "NOSAVE"]),
            Duration::from_secs(10),
        )
        .unwrap();
    assert!(clean && status.success(), "{status}");

    // Nothing listens any more: YCSB fails with a clear error, it does not hang.
    let err = format!(
        "{:#}",
        ycsb.run(&YcsbWorkload { ops: 10, ..w }, &logs).unwrap_err()
    );
    assert!(
        err.contains("YCSB run: a client thread failed") && err.contains("cannot connect"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
