//! The TPC-C-like driver at a small scale (2 warehouses, 2 % of TPC-C's items and customers,
//! ~4 MB) through the VFS in each mode with a 256 KiB pool: every transaction type commits,
//! the database stays sound (`PRAGMA integrity_check`) and TPC-C's consistency conditions 1–4
//! hold after each mode's run, read back through another mode and by plain SQLite.

use std::time::Duration;
use tiermem_iocache::Mode;
use tiermem_iocache_vfs::tpcc::{self, LoadOptions, RunOptions, Synchronous};

#[test]
fn the_mix_runs_in_every_mode_and_keeps_the_database_consistent() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = dir.path().join("tpcc.db");
    let loaded = tpcc::load_with(
        &db,
        &LoadOptions {
            warehouses: 2,
            seed: 7,
            scale: 0.02,
            progress: false,
        },
    )
    .unwrap();
    assert_eq!((loaded.scale.items, loaded.scale.customers), (2000, 60));
    assert!(loaded.bytes > 4 * (256 << 10), "{}", loaded.bytes);
    let c = tpcc::check(&db, None).unwrap();
    assert!(c.ok(), "after load: {c:?}");
    let mut orders = c.orders;
    let modes = [Mode::Buffered, Mode::Direct, Mode::Dbio];
    for (i, mode) in modes.into_iter().enumerate() {
        let r = tpcc::run(
            &db,
            &RunOptions {
                txns: Some(400),
                duration: Some(Duration::from_secs(120)),
                seed: 11 + i as u64,
                mode: Some(mode),
                pool_bytes: Some(256 << 10),
                budget: Some(1 << 20),
                synchronous: if i == 1 {
                    Synchronous::Off
                } else {
                    Synchronous::Normal
                },
                ..RunOptions::default()
            },
        )
        .unwrap();
        assert_eq!(r.errors, 0, "{mode:?}: {:?}", r.first_error);
        assert_eq!(r.txns + r.aborted, 400, "{r:?}");
        let b = r.by_type;
        assert!(
            b.new_order > 100
                && b.payment > 100
                && b.order_status > 0
                && b.delivery > 0
                && b.stock_level > 0,
            "{b:?}"
        );
        assert!(r.tpmc > 0.0);
        let p = r.pool.as_ref().expect("pool counters");
        assert_eq!(p.mode, tiermem_iocache_vfs::config::mode_name(mode));
        assert_eq!(p.frames, 64);
        assert!(p.pool_misses > 1000 && p.evict_clean > 1000, "{p:?}");
        eprintln!(
            "{mode:?}: {} txns in {:.2} s, tpmC {:.0}, misses {}",
            r.txns, r.elapsed_s, r.tpmc, p.pool_misses
        );
        // Checked through the next mode's pool, then by plain SQLite.
        let next = tiermem_iocache_vfs::config::mode_name(modes[(i + 1) % 3]);
        std::env::set_var("TIERMEM_IOCACHE_MODE", next);
        std::env::set_var("TIERMEM_IOCACHE_POOL", "256K");
        let c = tpcc::check(&db, Some("tiermem")).unwrap();
        assert!(c.ok(), "{mode:?} read in {next}: {c:?}");
        assert_eq!(c.orders, orders + b.new_order, "{mode:?}");
        orders = c.orders;
        let c = tpcc::check(&db, Some("unix")).unwrap();
        assert!(c.ok(), "{mode:?} read by plain SQLite: {c:?}");
    }
}

/// Two processes (the `tiermem-tpcc` binary), each with its own pool in its own mode, run the
/// mix on one database at once: SQLite's locks (the unix file's) serialise them, each pool
/// drops what the other process changed, and the result is consistent, with every committed
/// NewOrder's order present.
#[test]
fn two_processes_with_their_own_pools_share_one_database() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = dir.path().join("shared.db");
    tpcc::load_with(
        &db,
        &LoadOptions {
            warehouses: 1,
            seed: 5,
            scale: 0.02,
            progress: false,
        },
    )
    .unwrap();
    let before = tpcc::check(&db, Some("unix")).unwrap().orders;
    let spawn = |mode: &str, seed: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tiermem-tpcc"))
            .args([
                "run",
                "--db",
                db.to_str().unwrap(),
                "--txns",
                "250",
                "--json",
            ])
            .args([
                "--mode", mode, "--pool", "256K", "--budget", "1M", "--seed", seed,
            ])
            .stderr(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let a = spawn("dbio", "1");
    let b = spawn("direct", "2");
    let mut new_orders = 0;
    let mut invalidations = 0;
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["errors"], 0, "{r}");
        new_orders += r["new_orders"].as_u64().unwrap();
        invalidations += r["pool"]["invalidations"].as_u64().unwrap();
    }
    assert!(
        invalidations > 0,
        "neither pool saw the other process's writes"
    );
    let c = tpcc::check(&db, Some("unix")).unwrap();
    assert!(c.ok(), "{c:?}");
    assert_eq!(c.orders, before + new_orders);
}
