//! kill -9 mid-transaction: a child process (this test binary re-run as `child`) commits
//! through the VFS with a 256 KiB pool — a counter workload whose transactions evict dirty
//! pages before they commit, or the TPC-C mix — and is killed at a random moment; the database
//! then reopens (in another mode: the hot journal is rolled back through the pool) with
//! `PRAGMA integrity_check` ok and every transaction the child reported committed intact.

use rand::{Rng, SeedableRng};
use rusqlite::{Connection, OpenFlags};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiermem_iocache_vfs::tpcc;

const CHILD_ENV: &str = "TIERMEM_VFS_CRASH_CHILD";
const MODES: [&str; 3] = ["buffered", "direct", "dbio"];
/// Rows a counter transaction inserts (and, 40 transactions later, deletes): ~100 dirty pages,
/// more than the pool's 64 frames, so dirty pages are evicted before the commit.
const ROWS: i64 = 160;
const KEEP: i64 = 40;

fn open_vfs(db: &Path, mode: &str) -> Connection {
    tiermem_iocache_vfs::register(false).unwrap();
    let c = Connection::open_with_flags(
        format!(
            "file:{}?vfs=tiermem&iocache_mode={mode}&iocache_pool=256K&iocache_budget=1M",
            db.display()
        ),
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    c.execute_batch("PRAGMA cache_size=-64; PRAGMA synchronous=NORMAL; PRAGMA journal_mode=DELETE")
        .unwrap();
    c
}

/// The child's side: `counter DB MODE` or `tpcc DB MODE`, until killed. The counter prints
/// each commit and, every 5, its pool's dirty evictions so far.
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // an ordinary run: nothing to do
    };
    let args: Vec<&str> = spec.split('|').collect();
    let (what, db, mode) = (args[0], Path::new(args[1]), args[2]);
    if what == "tpcc" {
        let opts = tpcc::RunOptions {
            duration: Some(Duration::from_secs(60)),
            mode: Some(tiermem_iocache_vfs::config::parse_mode(mode).unwrap()),
            pool_bytes: Some(256 << 10),
            budget: Some(1 << 20),
            ..tpcc::RunOptions::default()
        };
        println!("started");
        tpcc::run(db, &opts).unwrap();
        return;
    }
    let c = open_vfs(db, mode);
    let mut n: i64 = c
        .query_row("SELECT n FROM counter", [], |r| r.get(0))
        .unwrap();
    println!("started");
    loop {
        n += 1;
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        c.execute("UPDATE counter SET n = ?", [n]).unwrap();
        for k in 0..ROWS {
            c.execute(
                "INSERT INTO rows(tx, k, pad) VALUES(?, ?, randomblob(500))",
                [n, k],
            )
            .unwrap();
        }
        c.execute("DELETE FROM rows WHERE tx = ?", [n - KEEP])
            .unwrap();
        c.execute_batch("COMMIT").unwrap();
        println!("committed {n}");
        if n % 5 == 0 {
            let r = tiermem_iocache_vfs::pool_report(db).unwrap();
            println!("evict_dirty {}", r.evict_dirty);
        }
    }
}

/// Starts the child on `spec`; returns it and the last number it reported committed.
/// What the parent saw of the child: started, last commit reported, dirty evictions reported.
type Seen = Arc<Mutex<(bool, i64, u64)>>;

fn spawn(spec: &str) -> (std::process::Child, Seen) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = Arc::new(Mutex::new((false, 0i64, 0u64)));
    let s2 = seen.clone();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let mut g = s2.lock().unwrap();
            // The harness may print "test child ... " before the child's first line.
            if line.ends_with("started") {
                g.0 = true;
            } else if let Some(i) = line.find("committed ") {
                g.1 = line[i + 10..].trim().parse().unwrap();
            } else if let Some(v) = line.strip_prefix("evict_dirty ") {
                g.2 = v.parse().unwrap();
            }
        }
    });
    (child, seen)
}

fn journal(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-journal");
    PathBuf::from(p)
}

#[test]
fn kill_9_mid_transaction_loses_no_commit_and_corrupts_nothing() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let counter_db = dir.path().join("counter.db");
    {
        let c = open_vfs(&counter_db, "dbio");
        c.execute_batch(
            "CREATE TABLE counter(n INTEGER); INSERT INTO counter VALUES(0);
             CREATE TABLE rows(tx INTEGER, k INTEGER, pad BLOB);
             CREATE INDEX rows_tx ON rows(tx, k);",
        )
        .unwrap();
    }
    let tpcc_db = dir.path().join("tpcc.db");
    tpcc::load_with(
        &tpcc_db,
        &tpcc::LoadOptions {
            warehouses: 1,
            seed: 3,
            scale: 0.02,
            progress: false,
        },
    )
    .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e3779b9);
    let mut hot = 0;
    let rounds = 9;
    for round in 0..rounds {
        let mode = MODES[round % 3];
        let tpcc_round = round / 3 == 1;
        let db = if tpcc_round { &tpcc_db } else { &counter_db };
        let what = if tpcc_round { "tpcc" } else { "counter" };
        let (mut child, seen) = spawn(&format!("{what}|{}|{mode}", db.display()));
        let t0 = Instant::now();
        while !seen.lock().unwrap().0 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the child did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..700)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let (_, reported, evict_dirty) = *seen.lock().unwrap();
        // Hot: the magic is written once the journal is synced, before the first page of the
        // database is (unsynced journals start with zeros).
        let had_journal =
            std::fs::read(journal(db)).is_ok_and(|h| h.len() >= 8 && h[..8] != [0; 8]);
        hot += had_journal as u32;
        // Reopen in the next mode: a hot journal is rolled back through that pool.
        let check_mode = MODES[(round + 1) % 3];
        if tpcc_round {
            std::env::set_var("TIERMEM_IOCACHE_MODE", check_mode);
            std::env::set_var("TIERMEM_IOCACHE_POOL", "256K");
            let c = tpcc::check(db, Some("tiermem")).unwrap();
            assert!(
                c.ok(),
                "round {round} ({mode}, journal {had_journal}): {c:?}"
            );
            eprintln!(
                "round {round}: tpcc in {mode}, hot journal {had_journal}, {} orders",
                c.orders
            );
        } else {
            let c = open_vfs(db, check_mode);
            let integrity: String = c
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(integrity, "ok", "round {round} ({mode})");
            let n: i64 = c
                .query_row("SELECT n FROM counter", [], |r| r.get(0))
                .unwrap();
            assert!(
                n >= reported,
                "round {round}: committed {reported}, found {n}"
            );
            assert!(
                n <= reported + 1,
                "round {round}: committed {reported}, found {n}"
            );
            let (count, lo, hi): (i64, Option<i64>, Option<i64>) = c
                .query_row("SELECT count(*), min(tx), max(tx) FROM rows", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .unwrap();
            let live = n.min(KEEP);
            assert_eq!(count, ROWS * live, "round {round}: n {n}");
            if n > 0 {
                assert_eq!((lo, hi), (Some(n - live + 1), Some(n)), "round {round}");
            }
            eprintln!(
                "round {round}: counter in {mode}, hot journal {had_journal}, reported \
                 {reported}, found {n}, dirty evictions {evict_dirty}"
            );
            if reported >= 5 {
                assert!(evict_dirty > 0, "round {round}: no dirty page was evicted");
            }
        }
        // A journal may stay only if it was never hot: killed before the journal was synced
        // and the first database page written, its header is still zero (SQLite's rule).
        if let Ok(head) = std::fs::read(journal(db)) {
            assert!(
                head.len() < 8 || head[..8] == [0; 8],
                "round {round}: a hot journal was left behind"
            );
        }
    }
    eprintln!("{hot} of {rounds} kills left a hot journal (killed while writing the database)");
    assert!(hot > 0, "no kill landed inside a transaction");
}
