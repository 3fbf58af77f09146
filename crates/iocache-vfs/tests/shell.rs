//! The unmodified `sqlite3` shell loads libtiermem_iocache_vfs.so and runs through the pool in
//! every mode: 50 000 rows inserted with a 1 MiB pool (the database is several times larger),
//! `PRAGMA integrity_check` ok, the same query results in every mode and in the plain shell
//! without the extension, and a database built in one mode reopened and changed in another.
//! Needs `sqlite3` on PATH (skipped without it) and the library built in the same target
//! directory (`cargo test -p tiermem-iocache-vfs` builds it).

use std::path::{Path, PathBuf};
use std::process::Command;

const MODES: [&str; 3] = ["buffered", "direct", "dbio"];

/// The extension library next to this test binary (target/<profile>/ or its deps/).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libtiermem_iocache_vfs.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libtiermem_iocache_vfs.so is not in {} nor its parent: build the crate first",
        deps.display()
    );
}

fn have_shell() -> bool {
    Command::new("sqlite3")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the shell on `:memory:`, loads the extension, opens `db` through it (with `mode` and a
/// 1 MiB pool) and runs `cmds`; returns stdout. Panics on a non-zero exit or anything on
/// stderr.
fn shell(db: &Path, mode: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("sqlite3");
    c.arg(":memory:")
        .arg(format!(".load {}", library().display()))
        .arg(format!(".open {}", db.display()))
        .arg("PRAGMA cache_size=-256")
        .args(cmds)
        .env("TIERMEM_IOCACHE_MODE", mode)
        .env("TIERMEM_IOCACHE_POOL", "1M")
        .env_remove("TIERMEM_IOCACHE_BUDGET");
    let out = c.output().expect("run sqlite3");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.is_empty(), "mode {mode}: {err}");
    String::from_utf8(out.stdout).unwrap()
}

/// The plain shell, no extension.
fn plain(db: &Path, cmds: &[&str]) -> String {
    let out = Command::new("sqlite3").arg(db).args(cmds).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const CREATE: &[&str] = &[
    "PRAGMA page_size=4096",
    "CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, val INTEGER, pad TEXT)",
    "CREATE INDEX t_grp ON t(grp, val)",
    "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 50000)
     INSERT INTO t SELECT i, i % 37, (i * 7919) % 100003, printf('%060d', i * 31337) FROM s",
];

const QUERIES: &[&str] = &[
    "SELECT count(*), sum(val), min(pad), max(pad) FROM t",
    "SELECT grp, count(*), sum(val) FROM t GROUP BY grp ORDER BY grp",
    "SELECT id, val FROM t WHERE grp = 5 AND val BETWEEN 1000 AND 30000 ORDER BY val LIMIT 20",
    "PRAGMA integrity_check",
];

const CHANGE: &[&str] = &[
    "UPDATE t SET val = val + 1 WHERE id % 3 = 0",
    "DELETE FROM t WHERE id % 11 = 0",
    "INSERT INTO t SELECT id + 100000, grp, val, pad FROM t WHERE id % 13 = 0",
];

#[test]
fn the_unmodified_shell_runs_through_the_pool_in_every_mode() {
    if !have_shell() {
        eprintln!("SKIPPED: no sqlite3 shell on PATH");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut expected: Option<String> = None;
    for mode in MODES {
        let db = dir.path().join(format!("{mode}.db"));
        let mut cmds: Vec<&str> = CREATE.to_vec();
        cmds.extend_from_slice(QUERIES);
        cmds.push(".vfsname");
        cmds.push("PRAGMA tiermem_iocache");
        let out = shell(&db, mode, &cmds);
        let mut lines: Vec<&str> = out.lines().collect();
        let report: serde_json::Value = serde_json::from_str(lines.pop().unwrap()).unwrap();
        assert_eq!(lines.pop(), Some(format!("tiermem({mode})").as_str()));
        let results = lines.join("\n");
        assert!(results.ends_with("\nok"), "{mode}: {results}");
        // The pool did the work: a 1 MiB pool, a larger database, misses and evictions.
        let size = std::fs::metadata(&db).unwrap().len();
        assert!(size > 4 << 20, "{size}");
        assert_eq!(report["mode"], mode, "{report}");
        assert_eq!(report["pool_bytes"], 1 << 20, "{report}");
        assert!(report["pool_misses"].as_u64().unwrap() > 0, "{report}");
        assert!(report["evict_dirty"].as_u64().unwrap() > 0, "{report}");
        match &expected {
            None => expected = Some(results),
            Some(e) => assert_eq!(&results, e, "mode {mode} differs"),
        }
        // The plain shell reads the same file the same way.
        assert_eq!(plain(&db, QUERIES).trim_end(), expected.as_ref().unwrap());
    }
    // Each database reopened in the next mode, changed there, then read in a third mode and
    // by the plain shell: all alike.
    let mut changed: Option<String> = None;
    for (i, made) in MODES.iter().enumerate() {
        let db = dir.path().join(format!("{made}.db"));
        let (m2, m3) = (MODES[(i + 1) % 3], MODES[(i + 2) % 3]);
        assert_eq!(
            shell(&db, m2, QUERIES).trim_end(),
            expected.as_ref().unwrap(),
            "{made} read in {m2}"
        );
        shell(&db, m2, CHANGE);
        let after = shell(&db, m3, QUERIES);
        assert!(after.trim_end().ends_with("ok"), "{after}");
        assert_eq!(plain(&db, QUERIES), after);
        match &changed {
            None => changed = Some(after),
            Some(c) => assert_eq!(&after, c, "{made} changed in {m2} read in {m3}"),
        }
    }
}

#[test]
fn the_shell_without_the_pool_settings_uses_dbio_and_refuses_bad_ones() {
    if !have_shell() {
        eprintln!("SKIPPED: no sqlite3 shell on PATH");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = dir.path().join("d.db");
    let out = Command::new("sqlite3")
        .arg(":memory:")
        .arg(format!(".load {}", library().display()))
        .arg(format!(".open {}", db.display()))
        .args([".vfsname", "CREATE TABLE x(a)", "PRAGMA tiermem_iocache"])
        .env_remove("TIERMEM_IOCACHE_MODE")
        .env_remove("TIERMEM_IOCACHE_POOL")
        .env_remove("TIERMEM_IOCACHE_BUDGET")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("tiermem(dbio)\n"), "{text}");
    assert!(text.contains("\"pool_bytes\":16777216") && text.contains("\"budget\":67108864"));
    // A malformed setting: the open fails with a message naming it, nothing panics.
    let out = Command::new("sqlite3")
        .arg(":memory:")
        .arg(format!(".load {}", library().display()))
        .arg(format!(".open {}", db.display()))
        .arg("SELECT count(*) FROM x")
        .env("TIERMEM_IOCACHE_MODE", "mmap")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TIERMEM_IOCACHE_MODE=mmap"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
