//! Unmodified programs under `LD_PRELOAD=libtiermem_prefault_preload.so`: sqlite3 building an
//! in-memory database, `sort` of a few MB and python3 building a big list print exactly what
//! they print without the library, and their exit reports show the service at work (populated
//! bytes > 0 for at least one; the figures of each are printed: application faults against the
//! service thread's). No timing is asserted.
//!
//! Needs the cdylib built in the same target directory (cargo builds it for this test) and the
//! programs (`scripts/setup.sh` installs them); a missing program is skipped with a message
//! unless `TIERMEM_REQUIRE_CLIENTS` is set.

mod common;

use common::{command, have, n, preload_lib, read_stats, run};
use std::path::{Path, PathBuf};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

struct Prog {
    name: &'static str,
    argv: Vec<String>,
    stdin: Option<PathBuf>,
}

/// Minor faults of the children reaped so far (this binary runs one test: no other thread
/// reaps children meanwhile).
fn children_minflt() -> u64 {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru.ru_minflt as u64
    }
}

/// Runs `p` plain, then under the library (with `env`); returns the exit report and the
/// plain run's minor faults.
fn compare(p: &Prog, dir: &Path, env: &[(&str, &str)]) -> (serde_json::Value, u64) {
    let go = |preload: bool| {
        let mut c = command(&p.argv[0]);
        c.args(&p.argv[1..]);
        let stats = dir.join(format!("{}.json", p.name));
        if preload {
            c.env("LD_PRELOAD", preload_lib())
                .env("TIERMEM_PREFAULT_STATS", &stats)
                .env("TIERMEM_PREFAULT_SCHED_IDLE", "0");
            for (k, v) in env {
                c.env(k, v);
            }
        }
        let o = run(c, p.stdin.as_deref(), DEADLINE);
        assert_eq!(
            o.code,
            Some(0),
            "{} (preload: {preload}) failed:\n{}",
            p.name,
            o.stderr
        );
        assert!(
            !o.stderr.contains("tiermem-prefault-preload"),
            "{}: {}",
            p.name,
            o.stderr
        );
        (o.stdout, stats)
    };
    let before = children_minflt();
    let (plain, _) = go(false);
    let plain_faults = children_minflt() - before;
    let (preloaded, stats) = go(true);
    assert!(!plain.is_empty(), "{} printed nothing", p.name);
    assert_eq!(
        preloaded, plain,
        "{} printed something else under the library",
        p.name
    );
    (read_stats(&stats), plain_faults)
}

fn programs(dir: &Path) -> Vec<Prog> {
    let sql = dir.join("build.sql");
    std::fs::write(
        &sql,
        "CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<200000)\n\
         INSERT INTO t SELECT x, printf('value-%08d-%s', x, hex(zeroblob(20))) FROM c;\n\
         CREATE INDEX tv ON t(v);\n\
         UPDATE t SET v = 'updated' WHERE k % 100 = 0;\n\
         SELECT count(*), sum(length(v)), min(v), max(v) FROM t;\n",
    )
    .unwrap();
    // ~6 MB of numbers in a fixed pseudo-random order.
    let nums = dir.join("numbers.txt");
    let mut text = String::new();
    let mut x: u64 = 88172645463325252;
    for _ in 0..600_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("{}\n", x % 1_000_000_000));
    }
    std::fs::write(&nums, text).unwrap();
    let mut v = vec![
        Prog {
            name: "sqlite3",
            argv: vec!["sqlite3".into(), ":memory:".into()],
            stdin: Some(sql),
        },
        Prog {
            name: "sort",
            argv: vec!["sort".into(), "-n".into(), nums.display().to_string()],
            stdin: None,
        },
    ];
    // The interpreter itself, not a wrapper script (pyenv's shims run other programs first).
    if let Some(py) = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty())
    {
        v.push(Prog {
            name: "python3",
            argv: vec![
                py,
                "-c".into(),
                "l = [i * 3 for i in range(3000000)]\n\
                 d = {i: str(i) for i in range(0, 3000000, 7)}\n\
                 print(sum(l), len(l), l[123457], len(d), d[700007])"
                    .into(),
            ],
            stdin: None,
        });
    }
    v
}

#[test]
fn sqlite3_sort_and_python3_print_the_same_and_get_populated_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let require = std::env::var_os("TIERMEM_REQUIRE_CLIENTS").is_some();
    let mut populated = 0;
    let mut ran = 0;
    for p in programs(dir.path()) {
        if !have(&p.argv[0]) && !Path::new(&p.argv[0]).is_absolute() {
            assert!(!require, "{} is not installed", p.name);
            println!("SKIP {}: not installed", p.name);
            continue;
        }
        ran += 1;
        // Defaults, then a second setting: whole regions, read-populated, 4 KiB pages.
        for env in [
            &[][..],
            &[
                ("TIERMEM_PREFAULT_ORDER", "whole"),
                ("TIERMEM_PREFAULT_POPULATE", "read"),
                ("TIERMEM_PREFAULT_THP", "off"),
                ("TIERMEM_PREFAULT_BUDGET", "16m"),
            ][..],
        ] {
            let (v, plain_faults) = compare(&p, dir.path(), env);
            println!(
                "{:8} {:?}: populated {:.1} MiB in {} calls ({} mappings, {} malloc blocks, {} heap growths registered); faults: plain run {plain_faults}, application {}, service {}; service CPU {:.1} ms; peak unused {:.1} MiB of {:.0} MiB budget",
                p.name,
                env,
                n(&v, "populated_bytes") as f64 / 1048576.0,
                n(&v, "populate_calls"),
                n(&v, "mmap_regions"),
                n(&v, "malloc_blocks"),
                n(&v, "heap_growths"),
                n(&v, "app_minflt"),
                n(&v, "service_minflt"),
                n(&v, "service_cpu_ns") as f64 / 1e6,
                n(&v, "peak_unused_bytes") as f64 / 1048576.0,
                n(&v, "budget_bytes") as f64 / 1048576.0,
            );
            assert!(
                n(&v, "registered_bytes") > 0,
                "{}: nothing registered: {v}",
                p.name
            );
            assert!(
                n(&v, "peak_unused_bytes") <= n(&v, "budget_bytes") + (4 << 20),
                "{}: the budget was not kept: {v}",
                p.name
            );
            populated += n(&v, "populated_bytes");
        }
    }
    assert!(ran > 0, "none of sqlite3, sort, python3 is installed");
    assert!(
        populated > 0,
        "the service populated nothing in any program"
    );
}
