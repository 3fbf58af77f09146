//! The VFS in process (rusqlite on the system libsqlite3): URI settings pick the mode; two
//! connections of one process share one pool; a change by another process (the plain shell)
//! between transactions is seen (the pool revalidates) and ours reach the file at unlock
//! even without syncs; WAL mode with checkpoints; database
//! pages smaller and larger than the pool's; shrinking (VACUUM) keeps the logical size and the
//! file in step; a bad setting fails the open without a panic.

use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::process::Command;
use tiermem_iocache_vfs::{pool_report, register};

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Opens `db` through the tiermem VFS with `mode` and a `pool`-byte pool.
fn open(db: &Path, mode: &str, pool: &str) -> Connection {
    register(false).unwrap();
    let uri = format!(
        "file:{}?vfs=tiermem&iocache_mode={mode}&iocache_pool={pool}",
        db.display()
    );
    let c = Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    c.execute_batch("PRAGMA cache_size=-64").unwrap();
    c
}

fn integrity(c: &Connection) -> String {
    c.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

fn fill(c: &Connection, rows: u32) {
    c.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v INTEGER, pad BLOB);
         WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {rows})
         INSERT INTO t(v, pad) SELECT i, zeroblob(200) FROM s;"
    ))
    .unwrap();
}

fn sum(c: &Connection) -> (i64, i64) {
    c.query_row("SELECT count(*), coalesce(sum(v), 0) FROM t", [], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .unwrap()
}

#[test]
fn uri_settings_pick_the_mode_and_connections_share_one_pool() {
    let dir = scratch();
    for mode in ["buffered", "direct", "dbio"] {
        let db = dir.path().join(format!("{mode}.db"));
        let a = open(&db, mode, "512K");
        fill(&a, 20_000);
        let b = open(&db, "buffered", "64M"); // the pool exists: its settings stay
        assert_eq!(sum(&b), (20_000, 200_010_000));
        b.execute("UPDATE t SET v = v + 1 WHERE id <= 100", [])
            .unwrap();
        assert_eq!(sum(&a), (20_000, 200_010_100));
        let vfs: String = a
            .query_row("PRAGMA tiermem_iocache", [], |r| r.get(0))
            .unwrap();
        let r = pool_report(&db).expect("a pool for the open file");
        assert_eq!(r.mode, mode, "{vfs}");
        assert_eq!(r.pool_bytes, 512 << 10);
        assert!(r.evict_dirty > 0 && r.pool_misses > 0, "{r:?}");
        assert_eq!(integrity(&a), "ok");
        drop((a, b));
        assert!(
            pool_report(&db).is_none(),
            "the pool closes with its last connection"
        );
    }
}

#[test]
fn another_process_changes_between_transactions_are_seen() {
    let have_shell = Command::new("sqlite3").arg("-version").output().is_ok();
    if !have_shell {
        eprintln!("SKIPPED: no sqlite3 shell on PATH");
        return;
    }
    let dir = scratch();
    for mode in ["buffered", "direct", "dbio"] {
        let db = dir.path().join(format!("{mode}.db"));
        let c = open(&db, mode, "1M");
        // No syncs: only the write-back at unlock puts our commits in the file.
        c.execute_batch("PRAGMA synchronous=OFF").unwrap();
        fill(&c, 10_000);
        assert_eq!(sum(&c).0, 10_000); // the pool now holds the table's pages
        for round in 1..=3 {
            // The plain shell (unix VFS, another process) changes it while we hold no lock.
            let out = Command::new("sqlite3")
                .arg(&db)
                .arg(format!(
                    "UPDATE t SET v = v + {round}; DELETE FROM t WHERE id % 10 = {round};"
                ))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let expect: (i64, i64) = Connection::open(&db)
                .unwrap()
                .query_row("SELECT count(*), sum(v) FROM t", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .unwrap();
            assert_eq!(sum(&c), expect, "{mode} round {round}");
            // And our own change is what the other process sees.
            c.execute("UPDATE t SET v = v - 1 WHERE id % 7 = 0", [])
                .unwrap();
            let theirs = Command::new("sqlite3")
                .arg(&db)
                .arg("SELECT count(*) || ',' || sum(v) FROM t; PRAGMA integrity_check;")
                .output()
                .unwrap();
            let (n, s) = sum(&c);
            assert_eq!(
                String::from_utf8_lossy(&theirs.stdout),
                format!("{n},{s}\nok\n")
            );
        }
        let r = pool_report(&db).unwrap();
        assert!(r.invalidations >= 3, "{r:?}");
        assert_eq!(integrity(&c), "ok");
    }
}

#[test]
fn wal_mode_with_checkpoints_and_two_connections() {
    let dir = scratch();
    for mode in ["direct", "dbio"] {
        let db = dir.path().join(format!("{mode}.db"));
        let a = open(&db, mode, "256K");
        let jm: String = a
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(jm, "wal");
        a.execute_batch("PRAGMA wal_autocheckpoint=100").unwrap();
        let b = open(&db, mode, "256K");
        for i in 0..20 {
            fill(&a, 1_000);
            assert_eq!(sum(&b).0, 1_000 * (i + 1));
        }
        a.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        assert_eq!(integrity(&b), "ok");
        drop((a, b));
        // Plain SQLite reads what the checkpoints wrote.
        let p = Connection::open(&db).unwrap();
        assert_eq!(sum(&p).0, 20_000);
        assert_eq!(integrity(&p), "ok");
    }
}

#[test]
fn page_sizes_other_than_the_pools_and_shrinking_files() {
    let dir = scratch();
    for (mode, ps) in [
        ("dbio", 1024),
        ("direct", 8192),
        ("buffered", 65536),
        ("dbio", 16384),
    ] {
        let db = dir.path().join(format!("{mode}-{ps}.db"));
        let c = open(&db, mode, "512K");
        c.execute_batch(&format!("PRAGMA page_size={ps}")).unwrap();
        fill(&c, 30_000);
        assert_eq!(integrity(&c), "ok");
        let big = std::fs::metadata(&db).unwrap().len();
        c.execute_batch("DELETE FROM t WHERE id > 1000; VACUUM;")
            .unwrap();
        let small = std::fs::metadata(&db).unwrap().len();
        let logical: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        assert!(small < big / 10, "{ps}: {big} -> {small}");
        assert_eq!(small, logical as u64 * ps, "{mode} {ps}");
        assert_eq!(sum(&c), (1000, 500_500));
        drop(c);
        let p = Connection::open(&db).unwrap();
        assert_eq!(integrity(&p), "ok");
        assert_eq!(sum(&p), (1000, 500_500));
        let got: i64 = p.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
        assert_eq!(got as u64, ps);
    }
}

#[test]
fn a_bad_setting_fails_the_open_cleanly() {
    register(false).unwrap();
    let dir = scratch();
    let db = dir.path().join("bad.db");
    for q in [
        "iocache_mode=mmap",
        "iocache_pool=1M&iocache_budget=512K",
        "iocache_pool=4K1",
    ] {
        let r = Connection::open_with_flags(
            format!("file:{}?vfs=tiermem&{q}", db.display()),
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .and_then(|c| c.execute_batch("CREATE TABLE x(a)"));
        let e = r.expect_err(q).to_string();
        assert!(e.contains("unable to open"), "{q}: {e}");
    }
}
