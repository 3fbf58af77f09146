//! The library's contracts, checked by a small C program (tests/data/prefault_check.c,
//! compiled here with `cc`) run under `LD_PRELOAD`: after munmap, mremap, MADV_DONTNEED,
//! mprotect(PROT_NONE) or a MAP_FIXED file mapping over part of a region the service is
//! populating, nothing is populated there; writers racing the populate lose no byte; untouched
//! populated pages read zero; forks while the service populates never deadlock a child (a
//! plain one or one restarting its service); `[heap]` is followed and a trim ends its
//! registrations; a malformed variable gives one warning naming it and a plain run.
//!
//! The checker waits for the service in its passes, never in time; the service thread runs
//! at normal priority here (TIERMEM_PREFAULT_SCHED_IDLE=0) so that the checks progress on a
//! machine whose cores are busy. A run that does not end within its deadline is a deadlock.

mod common;

use common::{command, n, preload_lib, read_stats, run, Outcome};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

/// The checker, compiled once per test binary.
fn checker() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/prefault_check.c");
        // The run-time value first: the suite runs this binary again as another user, with
        // a scratch directory of its own (the compile-time one belongs to root).
        let dir = PathBuf::from(
            std::env::var_os("CARGO_TARGET_TMPDIR")
                .unwrap_or_else(|| env!("CARGO_TARGET_TMPDIR").into()),
        );
        let bin = dir.join(format!("prefault_check-{}", std::process::id()));
        let out = std::process::Command::new("cc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
            .arg(&bin)
            .arg(&src)
            .arg("-ldl")
            .output()
            .expect("run cc (a C compiler is needed)");
        assert!(
            out.status.success(),
            "cc {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
    .clone()
}

/// Runs the checker with `args` under the library with `env`.
fn check(args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut c = command(checker());
    c.args(args)
        .env("LD_PRELOAD", preload_lib())
        .env("TIERMEM_PREFAULT_SCHED_IDLE", "0");
    for (k, v) in env {
        c.env(k, v);
    }
    run(c, None, DEADLINE)
}

fn assert_ok(o: &Outcome, what: &str) {
    assert_eq!(
        o.code,
        Some(0),
        "{what}: the checker failed:\nstdout: {}\nstderr: {}",
        o.stdout,
        o.stderr
    );
    assert!(o.stdout.starts_with("ok"), "{what}: {}", o.stdout);
    println!("{what}: {}", o.stdout.trim());
}

#[test]
fn ranges_unmapped_moved_purged_protected_or_replaced_mid_pass_are_not_populated_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    // Ascending with a 2 MiB window (8 entries of 64 pages): the service populates the region's
    // start, the checker changes its upper half, then touches the lower half, which would draw
    // the window of a registration left over the upper half into it.
    let o = check(
        &["ops", dir.path().to_str().unwrap()],
        &[
            ("TIERMEM_PREFAULT_ORDER", "ascending"),
            ("TIERMEM_PREFAULT_CHUNK", "64"),
            ("TIERMEM_PREFAULT_ENTRIES", "8"),
            ("TIERMEM_PREFAULT_BUDGET", "256m"),
            ("TIERMEM_PREFAULT_THP", "off"),
        ],
    );
    assert_ok(&o, "ops");
}

#[test]
fn writers_racing_the_populate_lose_no_byte() {
    let o = check(
        &["writers"],
        &[
            ("TIERMEM_PREFAULT_ORDER", "whole"),
            ("TIERMEM_PREFAULT_CHUNK", "64"),
            ("TIERMEM_PREFAULT_BUDGET", "256m"),
            ("TIERMEM_PREFAULT_INTERVAL_US", "100"),
            ("TIERMEM_PREFAULT_THP", "off"),
        ],
    );
    assert_ok(&o, "writers");
}

#[test]
fn untouched_populated_pages_read_zero() {
    let o = check(
        &["zero"],
        &[
            ("TIERMEM_PREFAULT_ORDER", "whole"),
            ("TIERMEM_PREFAULT_CHUNK", "64"),
            ("TIERMEM_PREFAULT_BUDGET", "256m"),
            ("TIERMEM_PREFAULT_THP", "off"),
        ],
    );
    assert_ok(&o, "zero");
}

#[test]
fn forks_while_the_service_populates_never_deadlock_a_plain_child() {
    let o = check(
        &["fork", "150", "0"],
        &[
            ("TIERMEM_PREFAULT_ORDER", "whole"),
            ("TIERMEM_PREFAULT_CHUNK", "64"),
            ("TIERMEM_PREFAULT_INTERVAL_US", "100"),
        ],
    );
    assert_ok(&o, "fork, children plain");
}

#[test]
fn forks_while_the_service_populates_never_deadlock_a_restarting_child() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("child-%p.json");
    let o = check(
        &["fork", "150", "1"],
        &[
            ("TIERMEM_PREFAULT_ORDER", "whole"),
            ("TIERMEM_PREFAULT_CHUNK", "64"),
            ("TIERMEM_PREFAULT_INTERVAL_US", "100"),
            ("TIERMEM_PREFAULT_CHILD", "restart"),
            ("TIERMEM_PREFAULT_STATS", stats.to_str().unwrap()),
        ],
    );
    assert_ok(&o, "fork, children restart");
    // Every child wrote its own report (the path has %p), from its own service.
    let reports: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        reports.len() >= 150,
        "{} reports for 150 children and their parent",
        reports.len()
    );
    let mut tids = std::collections::HashSet::new();
    for r in &reports {
        let v = read_stats(r);
        if let Some(t) = v["service_tid"].as_u64() {
            tids.insert(t);
        }
    }
    assert!(
        tids.len() > 1,
        "the children's reports name no service thread of their own"
    );
}

#[test]
fn heap_growth_is_followed_and_a_trim_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("heap.json");
    let o = check(
        &["heap"],
        &[("TIERMEM_PREFAULT_STATS", stats.to_str().unwrap())],
    );
    assert_ok(&o, "heap");
    let v = read_stats(&stats);
    println!("heap: {v}");
    assert!(
        n(&v, "heap_growths") >= 2,
        "[heap] growth not registered: {v}"
    );
    assert!(
        n(&v, "purged") >= 1,
        "malloc_trim did not end the heap's registrations: {v}"
    );
    assert!(n(&v, "populated_bytes") > 0, "nothing populated: {v}");
    assert!(
        v["service_tid"].is_u64() && n(&v, "service_minflt") > 0,
        "the service thread's faults are not reported: {v}"
    );
    assert!(
        n(&v, "process_minflt") == n(&v, "app_minflt") + n(&v, "service_minflt"),
        "{v}"
    );
}

#[test]
fn malformed_variables_warn_once_and_the_program_runs_plain() {
    let cases = [
        ("TIERMEM_PREFAULT_BUDGET", "12x"),
        ("TIERMEM_PREFAULT_BUDGET", "100"),
        ("TIERMEM_PREFAULT_MIN", "-1"),
        ("TIERMEM_PREFAULT_CHUNK", "65"),
        ("TIERMEM_PREFAULT_ENTRIES", "0"),
        ("TIERMEM_PREFAULT_ORDER", "sideways"),
        ("TIERMEM_PREFAULT_POPULATE", "execute"),
        ("TIERMEM_PREFAULT_THP", "maybe"),
        ("TIERMEM_PREFAULT_INTERVAL_US", "0"),
        ("TIERMEM_PREFAULT_HEAP", "2"),
        ("TIERMEM_PREFAULT_CHILD", "zombie"),
        ("TIERMEM_PREFAULT_SCHED_IDLE", "x"),
        ("TIERMEM_PREFAULT_STATS_PID", "me"),
        ("TIERMEM_PREFAULT_DISABLE", "perhaps"),
    ];
    for (k, v) in cases {
        let o = check(&["plain"], &[(k, v)]);
        assert_ok(&o, &format!("{k}={v}"));
        let lines: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{k}={v}: stderr {:?}", o.stderr);
        assert!(
            lines[0].contains(k) && lines[0].contains("without prefaulting"),
            "{k}={v}: {}",
            lines[0]
        );
    }
    // Disabled: plain, and silent.
    let o = check(&["plain"], &[("TIERMEM_PREFAULT_DISABLE", "1")]);
    assert_ok(&o, "TIERMEM_PREFAULT_DISABLE=1");
    assert!(o.stderr.is_empty(), "{}", o.stderr);
}
