//! Snapshots of the volatile engine (issue #17): BGSAVE while a client writes keeps exactly a
//! prefix of its writes holding every write acknowledged before BGSAVE was sent, for each
//! method, and a restart serves it; save points; a full disk; files that are not snapshots.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiermem_kv::client::{encode, Client, Reply};
use tiermem_kv::config::KvConfig;
use tiermem_kv::instance::{KvError, KvInstance};

fn config(dir: &Path, method: &str) -> KvConfig {
    let mut cfg = KvConfig::default();
    for (k, v) in [
        ("engine", "volatile"),
        ("port", "0"),
        ("threads", "2"),
        ("heap-size", "64mb"),
        ("snapshot-method", method),
    ] {
        cfg.set(k, v).expect("setting");
    }
    cfg.dir = Some(dir.to_path_buf());
    cfg
}

fn start(dir: &Path, method: &str) -> Result<KvInstance, KvError> {
    KvInstance::start(&config(dir, method), Path::new("/nonexistent"), &mut |_| {})
}

fn client(kv: &KvInstance) -> Client {
    Client::connect(kv.tcp_addrs()[0], Duration::from_secs(20)).expect("connect")
}

fn cmd(c: &mut Client, args: &[&str]) -> Reply {
    c.command(args).expect("command")
}

/// INFO `section` as a map.
fn info(c: &mut Client, section: &str) -> HashMap<String, String> {
    let Reply::Bulk(Some(b)) = cmd(c, &["INFO", section]) else {
        panic!("INFO reply")
    };
    String::from_utf8_lossy(&b)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Waits until no snapshot runs; INFO persistence then.
fn wait_saved(c: &mut Client) -> HashMap<String, String> {
    let t = Instant::now();
    loop {
        let i = info(c, "persistence");
        if i["rdb_bgsave_in_progress"] == "0" {
            return i;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "snapshot never ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn value(i: u64) -> String {
    // ~200 bytes, so the heap has pages enough for the dump to overlap the writes.
    format!("{i:0>200}")
}

#[test]
fn bgsave_keeps_a_prefix_of_the_acknowledged_writes_and_a_restart_serves_it() {
    for method in ["wp", "fork-mdc", "fork"] {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let kv = start(dir.path(), method).unwrap();
        // Key i = i, one acknowledged SET at a time on one connection.
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (acked, stop) = (acked.clone(), stop.clone());
            let mut c = client(&kv);
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(SeqCst) {
                    let r = c.command(&["SET", &format!("k:{i}"), &value(i)]).unwrap();
                    assert_eq!(r, Reply::Simple("OK".into()));
                    i += 1;
                    acked.store(i, SeqCst);
                }
                i
            })
        };
        while acked.load(SeqCst) < 20_000 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut c = client(&kv);
        let before = acked.load(SeqCst);
        assert_eq!(
            cmd(&mut c, &["BGSAVE"]),
            Reply::Simple("Background saving started".into())
        );
        let i = wait_saved(&mut c);
        assert_eq!(i["rdb_last_bgsave_status"], "ok", "{method}: {i:?}");
        assert_eq!(i["snapshot_last_method"], method);
        // Writes went on during the snapshot (else the prefix proves little).
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, SeqCst);
        let written = writer.join().unwrap();
        assert!(written > before, "{method}");
        kv.stop().unwrap();

        let kv = start(dir.path(), method).unwrap();
        let mut c = client(&kv);
        let Reply::Int(n) = cmd(&mut c, &["DBSIZE"]) else {
            panic!("DBSIZE")
        };
        let n = n as u64;
        assert!(
            n >= before && n <= written,
            "{method}: {n} keys restored; {before} acknowledged before BGSAVE, {written} written"
        );
        // Exactly keys 0..n, each with its value (pipelined in chunks).
        for chunk in (0..=n).collect::<Vec<u64>>().chunks(1000) {
            let mut out = Vec::new();
            for k in chunk {
                encode(&mut out, &["GET", &format!("k:{k}")]);
            }
            c.send_raw(&out).unwrap();
            for &k in chunk {
                let want = if k < n {
                    Reply::Bulk(Some(value(k).into_bytes()))
                } else {
                    Reply::Bulk(None)
                };
                assert_eq!(c.read().unwrap(), want, "{method}: key {k} of {n}");
            }
        }
        let i = info(&mut c, "persistence");
        assert_eq!(i["rdb_changes_since_last_save"], "0");
        kv.stop().unwrap();
    }
}

#[test]
fn snapshots_into_an_nvm_pool_load_at_start_too() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let kv = start(dir.path(), "fork-mdc").unwrap();
    let mut c = client(&kv);
    assert_eq!(
        cmd(&mut c, &["CONFIG", "SET", "snapshot-target", "nvm-pool"]),
        Reply::Simple("OK".into())
    );
    for i in 0..3000 {
        cmd(&mut c, &["SET", &format!("k{i}"), &value(i)]);
    }
    assert_eq!(
        cmd(&mut c, &["BGSAVE"]),
        Reply::Simple("Background saving started".into())
    );
    let i = wait_saved(&mut c);
    assert_eq!(i["rdb_last_bgsave_status"], "ok", "{i:?}");
    assert_eq!(i["snapshot_target"], "nvm-pool");
    kv.stop().unwrap();
    let f = tiermem_snapshot::SnapshotFile::open(&dir.path().join("dump.tmsnap")).unwrap();
    assert_eq!(f.info().target, tiermem_snapshot::Target::NvmPool);
    let kv = start(dir.path(), "wp").unwrap();
    let mut c = client(&kv);
    assert_eq!(cmd(&mut c, &["DBSIZE"]), Reply::Int(3000));
    assert_eq!(
        cmd(&mut c, &["GET", "k2999"]),
        Reply::Bulk(Some(value(2999).into_bytes()))
    );
    kv.stop().unwrap();
}

#[test]
fn save_points_save_in_the_background_and_shutdown_saves_with_them() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let kv = start(dir.path(), "wp").unwrap();
    let mut c = client(&kv);
    assert_eq!(
        cmd(&mut c, &["CONFIG", "SET", "save", "1 2"]),
        Reply::Simple("OK".into())
    );
    let Reply::Array(Some(v)) = cmd(&mut c, &["CONFIG", "GET", "save"]) else {
        panic!("CONFIG GET")
    };
    assert_eq!(v[1], Reply::Bulk(Some(b"1 2".to_vec())));
    assert!(matches!(
        cmd(&mut c, &["CONFIG", "SET", "save", "1"]),
        Reply::Error(_)
    ));
    assert!(matches!(
        cmd(&mut c, &["CONFIG", "SET", "port", "1"]),
        Reply::Error(_)
    ));
    let Reply::Int(last) = cmd(&mut c, &["LASTSAVE"]) else {
        panic!("LASTSAVE")
    };
    cmd(&mut c, &["SET", "a", "1"]);
    cmd(&mut c, &["SET", "b", "2"]);
    let t = Instant::now();
    while info(&mut c, "persistence")["rdb_saves"] == "0" {
        assert!(t.elapsed() < Duration::from_secs(10), "no save point fired");
        std::thread::sleep(Duration::from_millis(20));
    }
    let i = wait_saved(&mut c);
    assert_eq!(i["rdb_last_bgsave_status"], "ok");
    let Reply::Int(now) = cmd(&mut c, &["LASTSAVE"]) else {
        panic!("LASTSAVE")
    };
    assert!(now >= last);
    // A write after the save; stopping with save points saves it.
    cmd(&mut c, &["SET", "c", "3"]);
    kv.stop().unwrap();
    let kv = start(dir.path(), "wp").unwrap();
    let mut c = client(&kv);
    assert_eq!(cmd(&mut c, &["GET", "c"]), Reply::Bulk(Some(b"3".to_vec())));
    assert_eq!(cmd(&mut c, &["DBSIZE"]), Reply::Int(3));
    kv.stop().unwrap();
}

#[test]
fn a_file_that_is_not_a_good_snapshot_refuses_the_start_and_stays() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let kv = start(dir.path(), "wp").unwrap();
    let mut c = client(&kv);
    for i in 0..1000 {
        cmd(&mut c, &["SET", &format!("k{i}"), &value(i)]);
    }
    assert_eq!(cmd(&mut c, &["SAVE"]), Reply::Simple("OK".into()));
    kv.stop().unwrap();
    let path = dir.path().join("dump.tmsnap");
    let good = std::fs::read(&path).unwrap();
    // Truncated mid-page, a flipped byte in the pages, a foreign file.
    let mut flipped = good.clone();
    let at = 2 * 4096 + 17;
    flipped[at] ^= 1;
    for (what, bytes) in [
        ("truncated", good[..good.len() - 100].to_vec()),
        ("flipped", flipped),
        ("foreign", b"REDIS0011 not ours".to_vec()),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        let e = match start(dir.path(), "wp") {
            Ok(kv) => {
                let _ = kv.stop();
                panic!("{what}: the server started")
            }
            Err(e) => e.to_string(),
        };
        assert!(e.contains("dump.tmsnap"), "{what}: {e}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{what}: the file changed"
        );
    }
    // The good file loads.
    std::fs::write(&path, &good).unwrap();
    let kv = start(dir.path(), "wp").unwrap();
    assert_eq!(cmd(&mut client(&kv), &["DBSIZE"]), Reply::Int(1000));
    kv.stop().unwrap();
}

#[test]
fn a_full_disk_fails_the_snapshot_and_the_server_keeps_serving() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    struct Umount<'a>(&'a Path);
    impl Drop for Umount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Umount(dir.path());
    for method in ["wp", "fork-mdc"] {
        let kv = start(dir.path(), method).unwrap();
        let mut c = client(&kv);
        for i in 0..20_000 {
            cmd(&mut c, &["SET", &format!("k{i}"), &value(i)]);
        }
        match cmd(&mut c, &["BGSAVE"]) {
            Reply::Error(e) => assert!(e.contains("space"), "{method}: {e}"),
            r => panic!("{method}: BGSAVE on a full disk answered {r:?}"),
        }
        let i = wait_saved(&mut c);
        assert_eq!(i["rdb_last_bgsave_status"], "err", "{method}");
        assert!(!i["snapshot_last_error"].is_empty());
        // Nothing stays protected or half-written: writes go on, no file is left.
        for k in 0..20_000 {
            assert_eq!(
                cmd(&mut c, &["SET", &format!("k{k}"), "x"]),
                Reply::Simple("OK".into())
            );
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        kv.stop().unwrap();
    }
}
