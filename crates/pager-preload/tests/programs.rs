//! Unmodified programs under `LD_PRELOAD=libtiermem_pager_preload.so` with a DRAM budget far
//! below what they allocate: `tests/heap.c` (the malloc family, mmap and partial munmap,
//! system calls on evicted memory, every byte checked), Debian's memcached (`-L`: its whole
//! cache is one aligned block in the arena; every value read back over the network),
//! stress-ng's `--vm` stressor with `--verify`, and sqlite3 (an in-memory database whose page
//! cache is in the arena) printing what it prints without the library, and redis-server with
//! its own jemalloc, every value read back over RESP. Each run's exit report
//! must show page-ins, a resident peak within the budget, and no I/O error. Without root
//! (userfaultfd) or the programs, a test prints why and passes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The library: the newer of target/<profile>/ (what `cargo build` leaves) and
/// target/<profile>/deps/ (what this `cargo test` built; cargo does not copy it up), so a test
/// never runs a stale build.
fn preload_lib() -> PathBuf {
    let name = "libtiermem_pager_preload.so";
    let dir = profile_dir();
    let newest = [dir.join(name), dir.join("deps").join(name)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max();
    match newest {
        Some((_, p)) => p,
        None => panic!(
            "{name} is missing in {} (cargo build --release)",
            dir.display()
        ),
    }
}

fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tiermem-pager-preload-{name}-"))
        .tempdir_in("/var/tmp")
        .expect("scratch directory in /var/tmp")
}

/// `prog` under the library with a DRAM budget of `budget` bytes, NVM `nvm`, its swap file
/// and exit report in `dir`.
fn paged(prog: impl AsRef<std::ffi::OsStr>, dir: &Path, budget: u64, nvm: u64) -> Command {
    let mut c = Command::new(prog);
    c.env("LD_PRELOAD", preload_lib())
        .env("TIERMEM_PAGER_BUDGET", budget.to_string())
        .env("TIERMEM_PAGER_NVM", nvm.to_string())
        .env("TIERMEM_PAGER_ARENA", (1u64 << 30).to_string())
        .env("TIERMEM_PAGER_DIR", dir)
        .env("TIERMEM_PAGER_STATS", dir.join("report.%p"));
    c
}

/// The exit reports in `dir` (one per process that started the pager).
fn reports(dir: &Path) -> Vec<serde_json::Value> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("report.") {
            for l in std::fs::read_to_string(e.path()).unwrap().lines() {
                v.push(serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")));
            }
        }
    }
    v
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// The checks every paged run must pass: paged in, within the budget, no I/O error.
fn check_report(r: &serde_json::Value) {
    assert!(
        n(r, "pageins_buffer") + n(r, "pageins_ssd") > 0,
        "nothing was paged in: {r}"
    );
    assert!(
        n(r, "max_resident_pages") <= n(r, "budget_pages") + 32,
        "resident above the budget's cap: {r}"
    );
    assert_eq!(n(r, "io_errors"), 0, "{r}");
    assert!(n(r, "arena_allocs") > 0, "{r}");
}

fn run(mut c: Command, deadline: Duration) -> (Option<i32>, String, String) {
    let what = format!("{c:?}");
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {deadline:?} (hung?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), t_out.join().unwrap(), t_err.join().unwrap())
}

#[test]
fn a_c_program_allocating_far_beyond_its_budget_reads_every_byte_back() {
    if !is_root() {
        eprintln!("SKIPPED: the pager needs root (userfaultfd in-thread mode)");
        return;
    }
    let dir = scratch("heap");
    let exe = dir.path().join("heap");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/heap.c");
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "compiling {}", src.display());
    // Plain first: the program itself is right.
    let (code, out, err) = run(
        {
            let mut c = Command::new(&exe);
            c.arg(dir.path());
            c
        },
        Duration::from_secs(60),
    );
    assert_eq!((code, out.trim()), (Some(0), "ok"), "plain run: {err}");
    for nvm in [0u64, 4 << 20] {
        let mut c = paged(&exe, dir.path(), 8 << 20, nvm);
        c.arg(dir.path());
        let (code, out, err) = run(c, Duration::from_secs(300));
        assert_eq!(
            (code, out.trim()),
            (Some(0), "ok"),
            "paged run (NVM {nvm}): {err}"
        );
        let rs = reports(dir.path());
        assert_eq!(rs.len(), 1, "one exit report: {rs:?}");
        let r = &rs[0];
        check_report(r);
        assert!(n(r, "pinned_calls") > 0, "no system call was pinned: {r}");
        assert!(n(r, "mmaps") > 0 && n(r, "munmaps") > 0, "{r}");
        if nvm > 0 {
            assert!(n(r, "pageins_buffer") > 0, "{r}");
        }
        for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.ends_with(".swap"), "swap file {name} left behind");
            if name.starts_with("report.") {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
    }
}

/// A free TCP port on localhost.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A connection to `child` on 127.0.0.1:`port`, retried for 20 s (killed, with its stdout if
/// piped, when it never listens).
fn connect(child: &mut std::process::Child, port: u16, what: &str) -> TcpStream {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => {
                let _ = child.kill();
                let mut out = String::new();
                if let Some(mut o) = child.stdout.take() {
                    o.read_to_string(&mut out).ok();
                }
                panic!("{what} did not listen: {e}: {out}");
            }
        }
    }
}

#[test]
fn memcached_with_its_cache_paged_serves_every_value_back() {
    if !is_root() || !have("memcached") {
        eprintln!("SKIPPED: needs root and memcached (scripts/setup.sh installs it)");
        return;
    }
    let dir = scratch("memcached");
    let port = free_port();
    // 96 MiB cache preallocated in one block (-L), 24 MiB budget.
    let mut c = paged("memcached", dir.path(), 24 << 20, 8 << 20);
    c.args([
        "-u",
        "root",
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
    ])
    .args(["-m", "96", "-L", "-t", "2"])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("memcached");
    let mut s = connect(&mut child, port, "memcached");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // One write per request and no Nagle: otherwise each set waits out a delayed ACK.
    s.set_nodelay(true).unwrap();
    let keys = 60_000usize; // ~60 MiB of 1 KB values: most of the cache is out of DRAM
    let value = |k: usize| -> Vec<u8> {
        (0..1000)
            .map(|i| b'a' + ((k * 31 + i * 7) % 26) as u8)
            .collect()
    };
    let mut rd = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    for k in 0..keys {
        let v = value(k);
        let mut req = format!("set key{k} 0 0 {}\r\n", v.len()).into_bytes();
        req.extend_from_slice(&v);
        req.extend_from_slice(b"\r\n");
        s.write_all(&req).unwrap();
        line.clear();
        rd.read_line(&mut line).unwrap();
        assert_eq!(line, "STORED\r\n", "set key{k}");
    }
    let mut bad = 0;
    let mut missing = 0;
    for k in (0..keys).step_by(7).chain((0..keys).rev().step_by(13)) {
        write!(s, "get key{k}\r\n").unwrap();
        line.clear();
        rd.read_line(&mut line).unwrap();
        if line == "END\r\n" {
            missing += 1; // evicted by memcached's own LRU: allowed, counted
            continue;
        }
        assert!(line.starts_with(&format!("VALUE key{k} 0 ")), "{line}");
        let mut v = vec![0u8; 1002];
        rd.read_exact(&mut v).unwrap();
        if v[..1000] != value(k)[..] {
            bad += 1;
        }
        line.clear();
        rd.read_line(&mut line).unwrap();
        assert_eq!(line, "END\r\n");
    }
    s.write_all(b"shutdown\r\n").ok();
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    assert_eq!(bad, 0, "values read back wrong: {bad}");
    assert!(
        missing < keys / 10,
        "memcached lost {missing} values: {err}"
    );
    assert!(
        status.success() || status.code().is_none(),
        "memcached: {status}: {err}"
    );
    let rs = reports(dir.path());
    assert_eq!(rs.len(), 1, "one exit report: {rs:?}; stderr: {err}");
    check_report(&rs[0]);
    assert!(n(&rs[0], "pinned_calls") > 0, "{}", rs[0]);
}

#[test]
fn stress_ng_vm_verifies_its_memory_under_the_pager() {
    if !is_root() || !have("stress-ng") {
        eprintln!("SKIPPED: needs root and stress-ng (scripts/setup.sh installs it)");
        return;
    }
    let dir = scratch("stress");
    let mut c = paged("stress-ng", dir.path(), 16 << 20, 8 << 20);
    c.args(["--vm", "1", "--vm-bytes", "64M", "--vm-keep", "--verify"])
        .args(["--vm-method", "all", "--timeout", "8s", "--metrics-brief"]);
    let (code, out, err) = run(c, Duration::from_secs(120));
    assert_eq!(code, Some(0), "stress-ng: {out}\n{err}");
    assert!(!err.contains("fail"), "stress-ng reported a failure: {err}");
    let rs = reports(dir.path());
    assert!(!rs.is_empty(), "no exit report (stderr: {err})");
    for r in rs.iter().filter(|r| n(r, "arena_allocs") > 0) {
        check_report(r);
    }
}

#[test]
fn sqlite3_prints_what_it_prints_without_the_pager() {
    if !is_root() || !have("sqlite3") {
        eprintln!("SKIPPED: needs root and sqlite3 (scripts/setup.sh installs it)");
        return;
    }
    let dir = scratch("sqlite3");
    // An in-memory database of ~10 MB in 8 KiB pages (each page's cache entry one malloc of
    // a little over 8 KiB: the arena with TIERMEM_PAGER_MIN=8192), an index, queries over it.
    let script = "PRAGMA page_size=8192;
PRAGMA cache_size=-200000;
CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT, w BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<30000)
INSERT INTO t SELECT x, printf('%.*c', 200, char(65 + x % 26)), zeroblob(100) FROM c;
CREATE INDEX tv ON t(v, k);
SELECT count(*), sum(length(v)), sum(k % 977) FROM t;
SELECT v, count(*) FROM t GROUP BY v ORDER BY v LIMIT 5;
SELECT k FROM t WHERE v LIKE 'Q%' ORDER BY k DESC LIMIT 3;
DELETE FROM t WHERE k % 3 = 0;
SELECT count(*), max(k) FROM t;
";
    let sql = dir.path().join("script.sql");
    std::fs::write(&sql, script).unwrap();
    let plain = Command::new("sqlite3")
        .arg(":memory:")
        .stdin(std::fs::File::open(&sql).unwrap())
        .output()
        .expect("sqlite3");
    assert!(plain.status.success());
    assert!(!plain.stdout.is_empty());
    let mut c = paged("sqlite3", dir.path(), 4 << 20, 2 << 20);
    c.env("TIERMEM_PAGER_MIN", "8192")
        .arg(":memory:")
        .stdin(std::fs::File::open(&sql).unwrap());
    let o = c.output().expect("sqlite3 under the pager");
    let (code, out, err) = (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.as_bytes(),
        &plain.stdout[..],
        "paged output differs: {err}"
    );
    let rs = reports(dir.path());
    assert_eq!(rs.len(), 1, "{rs:?}");
    check_report(&rs[0]);
}

/// One RESP command.
fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

/// Debian's redis-server links jemalloc: the program keeps it (the malloc family goes to it),
/// and its extents, anonymous mmaps, are the arena. 64,000 values of 1 KB (~70 MiB with
/// redis's overhead) at a 16 MiB budget, every seventh and eleventh read back over RESP; its
/// `epoll_wait` array is in the arena too (pinned by the hook).
#[test]
fn redis_server_with_jemalloc_paged_serves_every_value_back() {
    if !is_root() || !have("redis-server") {
        eprintln!("SKIPPED: needs root and redis-server (scripts/setup.sh installs it)");
        return;
    }
    let dir = scratch("redis");
    let port = free_port();
    // jemalloc's extents are anonymous mmaps: the arena. ~70 MiB of values, 16 MiB budget.
    let mut c = paged("redis-server", dir.path(), 16 << 20, 8 << 20);
    c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--dir", dir.path().to_str().unwrap()])
        .env("TIERMEM_PAGER_MIN", (64u64 << 10).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("redis-server");
    let mut s = connect(&mut child, port, "redis-server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_nodelay(true).unwrap();
    let keys = 64_000usize;
    let value = |k: usize| -> Vec<u8> {
        (0..1000)
            .map(|i| b'a' + ((k * 31 + i * 7) % 26) as u8)
            .collect()
    };
    let mut rd = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    // Pipelined in batches of 100.
    for b in (0..keys).step_by(100) {
        let mut req = Vec::new();
        for k in b..(b + 100).min(keys) {
            req.extend(resp(&[b"SET", format!("key{k}").as_bytes(), &value(k)]));
        }
        s.write_all(&req).unwrap();
        for k in b..(b + 100).min(keys) {
            line.clear();
            rd.read_line(&mut line).unwrap();
            assert_eq!(line, "+OK\r\n", "SET key{k}");
        }
    }
    let mut bad = 0;
    for k in (0..keys).step_by(7).chain((0..keys).rev().step_by(11)) {
        s.write_all(&resp(&[b"GET", format!("key{k}").as_bytes()]))
            .unwrap();
        line.clear();
        rd.read_line(&mut line).unwrap();
        assert_eq!(line, "$1000\r\n", "GET key{k}");
        let mut v = vec![0u8; 1002];
        rd.read_exact(&mut v).unwrap();
        if v[..1000] != value(k)[..] {
            bad += 1;
        }
    }
    s.write_all(&resp(&[b"SHUTDOWN", b"NOSAVE"])).ok();
    drop(s);
    let t1 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t1.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("redis-server did not shut down");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).ok();
    assert_eq!(bad, 0, "values read back wrong: {bad}");
    assert!(status.success(), "redis-server: {status}: {out}");
    let rs = reports(dir.path());
    assert_eq!(rs.len(), 1, "one exit report: {rs:?}; output: {out}");
    check_report(&rs[0]);
    // jemalloc's extents are in the arena: the values were paged, not only tables.
    assert!(n(&rs[0], "mmaps") > 0, "{}", rs[0]);
    assert!(
        n(&rs[0], "pageins_ssd") + n(&rs[0], "pageins_buffer") > 1000,
        "{}",
        rs[0]
    );
}
