//! Creating and opening a durable instance (issue #13, defect 2): a server creates an instance
//! only when asked (`new yes`, `--new`) and only in an empty directory, and refuses a directory
//! holding part of an instance — naming the missing or damaged file and changing nothing.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tiermem_kv::config::KvConfig;
use tiermem_kv::instance::{KvError, KvInstance};

fn config(dir: &Path, new: bool) -> KvConfig {
    let mut cfg = KvConfig::default();
    for (k, v) in [
        ("engine", "vnvm"),
        ("port", "0"),
        ("threads", "1"),
        ("heap-size", "8mb"),
        ("log-size", "4mb"),
        ("cache-size", "4mb"),
        ("new", if new { "yes" } else { "no" }),
    ] {
        cfg.set(k, v).expect("setting");
    }
    cfg.dir = Some(dir.to_path_buf());
    cfg
}

fn start(dir: &Path, new: bool) -> Result<KvInstance, KvError> {
    KvInstance::start(&config(dir, new), Path::new("/nonexistent"), &mut |_| {})
}

fn refusal(dir: &Path, new: bool) -> String {
    match start(dir, new) {
        Ok(kv) => {
            let _ = kv.stop();
            panic!("the server started over {}", dir.display())
        }
        Err(e) => e.to_string(),
    }
}

/// One command on a fresh connection; the reply's first line.
fn command(kv: &KvInstance, line: &str) -> String {
    let mut s = TcpStream::connect(kv.tcp_addrs()[0]).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("{line}\r\n").as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 256];
    while !got.ends_with(b"\r\n") {
        let n = s.read(&mut b).expect("reply");
        assert!(n > 0, "closed");
        got.extend_from_slice(&b[..n]);
    }
    String::from_utf8_lossy(&got).trim_end().to_string()
}

/// Every file under `dir` with its contents (the instance's files are a few MiB).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut m = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                m.insert(p.clone(), b"(dir)".to_vec());
                todo.push(p);
            } else {
                m.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    m
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// A good instance holding three keys, shut down cleanly.
fn good_instance(dir: &Path) {
    let kv = start(dir, true).expect("--new in an empty directory");
    for k in ["a", "b", "c"] {
        assert_eq!(command(&kv, &format!("SET {k} value-{k}")), "+OK");
    }
    kv.stop().expect("stop");
}

#[test]
fn new_only_in_an_empty_directory_and_open_only_a_whole_instance() {
    let root = tempfile::tempdir_in("/dev/shm").unwrap();
    // Nonexistent or empty, without --new: refused, saying how to create one.
    let missing = root.path().join("nothing-here");
    let msg = refusal(&missing, false);
    assert!(
        msg.contains("does not exist") && msg.contains("--new"),
        "{msg}"
    );
    assert!(
        !missing.exists(),
        "the refusal created {}",
        missing.display()
    );
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let msg = refusal(&empty, false);
    assert!(msg.contains("is empty") && msg.contains("--new"), "{msg}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);

    // --new in an empty directory works; a restart without it finds the data.
    let good = root.path().join("good");
    good_instance(&good);
    let kv = start(&good, false).expect("restart of a good instance");
    assert_eq!(command(&kv, "DBSIZE"), ":3");
    assert_eq!(command(&kv, "GET b"), "$7\r\nvalue-b");
    kv.stop().expect("stop");

    // --new over anything: refused, nothing changed.
    let before = snapshot(&good);
    let msg = refusal(&good, true);
    assert!(
        msg.contains("is not empty") && msg.contains("move"),
        "{msg}"
    );
    assert_eq!(snapshot(&good), before, "--new changed the directory");
    let other = root.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"not an instance").unwrap();
    let msg = refusal(&other, true);
    assert!(msg.contains("notes.txt"), "{msg}");

    // Part of an instance: each case refused, naming the file, with the directory unchanged.
    type Damage = fn(&Path);
    let cases: [(&str, &str, Damage); 7] = [
        ("no-meta", "meta.pool is missing", |d| {
            std::fs::remove_file(d.join("vnvm/meta.pool")).unwrap()
        }),
        ("no-log", "log.pool is missing", |d| {
            std::fs::remove_file(d.join("vnvm/log.pool")).unwrap()
        }),
        ("no-cache", "cache.pool is missing", |d| {
            std::fs::remove_file(d.join("vnvm/cache.pool")).unwrap()
        }),
        ("no-heap", "heap.data is missing", |d| {
            std::fs::remove_file(d.join("heap.data")).unwrap()
        }),
        ("no-checksums", "heap.data.vnvm-crc is missing", |d| {
            std::fs::remove_file(d.join("heap.data.vnvm-crc")).unwrap()
        }),
        ("empty-heap", "heap.data is empty", |d| {
            std::fs::File::create(d.join("heap.data")).unwrap();
        }),
        ("zeroed-heap", "heap.data is damaged", |d| {
            let len = std::fs::metadata(d.join("heap.data")).unwrap().len();
            let f = std::fs::File::create(d.join("heap.data")).unwrap();
            f.set_len(len).unwrap();
        }),
    ];
    for (name, want, damage) in cases {
        let dir = root.path().join(name);
        copy_dir(&good, &dir);
        damage(&dir);
        let before = snapshot(&dir);
        let msg = refusal(&dir, false);
        assert!(msg.contains(want), "{name}: {msg}");
        assert!(
            msg.contains("move") && msg.contains("--new"),
            "{name}: the refusal says how to start afresh: {msg}"
        );
        assert_eq!(
            snapshot(&dir),
            before,
            "{name}: the refusal changed the directory"
        );
        // --new over it: refused too.
        let msg = refusal(&dir, true);
        assert!(msg.contains("is not empty"), "{name}: {msg}");
        assert_eq!(
            snapshot(&dir),
            before,
            "{name}: --new changed the directory"
        );
    }
}
