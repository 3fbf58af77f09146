//! tiermem-kv on a full device (issue #13, defect 4), with the real `tiermem kv serve`: the
//! instance directory lives on a small private tmpfs that a filler file fills up. Writes must
//! then be refused with a `-MISCONF` error naming the file and `No space left on device`
//! (logged once, shown by INFO persistence), reads go on, every acknowledged write stays
//! readable, writes resume by themselves once space returns, SHUTDOWN works (and, while the
//! device is still full, plain SHUTDOWN refuses naming the cause and SHUTDOWN NOSAVE stops),
//! and a restart finds every acknowledged write.
//!
//! Needs root (mount); a non-root run says so and skips.

mod kv_common;

use kv_common::{create_server, start_server, Conn, Reply, Server};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted (lazily) and removed on drop,
/// whatever happened.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(name: &str, mib: u64) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("note: not root: cannot mount a tmpfs, skipping");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("tiermem-full-{name}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount -t tmpfs on {}", dir.display());
        Some(Tmpfs { dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Fill the file system holding `path` with the file `path` (until ENOSPC).
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5au8; 256 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
}

/// A small instance: its pools fit the small tmpfs.
const SIZES: &[&str] = &[
    "--set",
    "heap-size=128mb",
    "--set",
    "log-size=4mb",
    "--set",
    "cache-size=4mb",
];

fn value(i: usize) -> String {
    format!("{i:08}-{}", "v".repeat(16 << 10))
}

/// Write until the writes are refused; every acknowledged key (and its value's index) and the
/// first refusal.
fn write_until_refused(c: &mut Conn, acked: &mut Vec<usize>, from: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in from.. {
        assert!(
            Instant::now() < deadline,
            "writes still accepted after {} of them",
            i - from
        );
        match c.cmd(&["SET", &format!("key:{i}"), &value(i)]) {
            Reply::Simple(ok) if ok == "OK" => acked.push(i),
            Reply::Error(e) => return e,
            r => panic!("SET: {r:?}"),
        }
    }
    unreachable!()
}

/// The server's output once it contains `needle` (or after 10 s: the caller's check fails).
fn wait_log(s: &Server, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = s.log();
        if log.contains(needle) || Instant::now() > deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn verify(c: &mut Conn, acked: &[usize]) {
    for &i in acked {
        let got = c.cmd(&["GET", &format!("key:{i}")]);
        assert!(
            got == Reply::Bulk(Some(value(i).into_bytes())),
            "key:{i} (acknowledged) reads {:?}",
            match &got {
                Reply::Bulk(Some(b)) => format!("{} bytes", b.len()),
                r => format!("{r:?}"),
            }
        );
    }
}

/// The device fills up under a writer; checks common to both variants. Returns the server,
/// the acknowledged writes and the filler file.
/// Restart the instance and check every acknowledged write, then stop it.
fn restart_and_verify(fs: &Tmpfs, acked: &[usize]) {
    let s = start_server(&fs.dir.join("inst"), SIZES);
    let mut c = Conn::connect(s.port).unwrap();
    verify(&mut c, acked);
    let _ = c.send(&["SHUTDOWN"]);
    drop(s);
}

fn fill_and_check(fs: &Tmpfs) -> (Server, Vec<usize>, PathBuf) {
    let dir = fs.dir.join("inst");
    let s = create_server(&dir, SIZES);
    let mut c = Conn::connect(s.port).unwrap();
    let mut acked = Vec::new();
    for i in 0..20 {
        assert_eq!(
            c.cmd(&["SET", &format!("key:{i}"), &value(i)]),
            Reply::Simple("OK".into())
        );
        acked.push(i);
    }
    let filler = fs.dir.join("filler");
    fill(&filler);
    let err = write_until_refused(&mut c, &mut acked, 20);
    eprintln!("{} writes acknowledged, then: {err}", acked.len());
    assert!(
        err.starts_with("MISCONF")
            && err.contains("No space left on device")
            && err.contains("heap.data"),
        "the refusal names the cause and the file: {err}"
    );
    // Later writes are refused the same way, at once; reads go on.
    match c.cmd(&["SET", "another", "x"]) {
        Reply::Error(e) => assert!(e.starts_with("MISCONF"), "{e}"),
        r => panic!("a write on a full device: {r:?}"),
    }
    let info = c.info("persistence");
    for want in [
        "last_write_status:err",
        "writes_refused:1",
        "No space left on device",
    ] {
        assert!(
            info.contains(want),
            "INFO persistence lacks {want}:\n{info}"
        );
    }
    verify(&mut c, &acked);
    let log = wait_log(&s, "cannot persist writes");
    assert_eq!(
        log.matches("cannot persist writes").count(),
        1,
        "the failure is logged once:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    (s, acked, filler)
}

#[test]
fn a_full_device_refuses_writes_clearly_and_resumes_when_space_returns() {
    let Some(fs) = Tmpfs::mount("resume", 40) else {
        return;
    };
    let (mut s, mut acked, filler) = fill_and_check(&fs);
    let mut c = Conn::connect(s.port).unwrap();
    std::fs::remove_file(&filler).unwrap();
    // Writes resume by themselves (the writeback retries every second).
    let deadline = Instant::now() + Duration::from_secs(30);
    let n = *acked.last().unwrap() + 1;
    loop {
        match c.cmd(&["SET", &format!("key:{n}"), &value(n)]) {
            Reply::Simple(_) => break,
            Reply::Error(e) => assert!(e.starts_with("MISCONF"), "{e}"),
            r => panic!("{r:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "writes did not resume:\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    acked.push(n);
    for i in n + 1..n + 50 {
        assert_eq!(
            c.cmd(&["SET", &format!("key:{i}"), &value(i)]),
            Reply::Simple("OK".into())
        );
        acked.push(i);
    }
    let info = c.info("persistence");
    assert!(
        info.contains("last_write_status:ok") && info.contains("writes_refused:0"),
        "{info}"
    );
    assert!(wait_log(&s, "writes resumed").contains("writes resumed"));
    verify(&mut c, &acked);
    let _ = c.send(&["SHUTDOWN"]);
    let st = s.wait_exit(60).expect("SHUTDOWN stops the server");
    assert!(st.success(), "{st}:\n{}", s.log());
    drop(s);
    restart_and_verify(&fs, &acked);
}

#[test]
fn a_full_device_refuses_shutdown_with_the_cause_and_shutdown_nosave_stops() {
    let Some(fs) = Tmpfs::mount("nosave", 40) else {
        return;
    };
    let (mut s, acked, filler) = fill_and_check(&fs);
    let mut c = Conn::connect(s.port).unwrap();
    match c.cmd(&["SHUTDOWN"]) {
        Reply::Error(e) => assert!(
            e.contains("No space left on device") && e.contains("NOSAVE"),
            "SHUTDOWN names the cause: {e}"
        ),
        r => panic!("SHUTDOWN on a full device: {r:?}"),
    }
    assert!(s.child.try_wait().unwrap().is_none(), "still serving");
    verify(&mut c, &acked);
    let _ = c.send(&["SHUTDOWN", "NOSAVE"]);
    s.wait_exit(60)
        .unwrap_or_else(|| panic!("SHUTDOWN NOSAVE stops the server:\n{}", s.log()));
    std::thread::sleep(std::time::Duration::from_millis(100)); // the output threads finish
    assert!(!s.log().contains("panicked"), "{}", s.log());
    assert!(
        s.log().contains("without the final flush") && !s.log().contains("shut down cleanly"),
        "NOSAVE must not claim a clean shutdown:\n{}",
        s.log()
    );
    drop(s);
    // Space back; the restart recovers every acknowledged write from the log and cache.
    std::fs::remove_file(&filler).unwrap();
    restart_and_verify(&fs, &acked);
}

#[test]
fn sigterm_stops_a_server_on_a_full_device() {
    let Some(fs) = Tmpfs::mount("sigterm", 40) else {
        return;
    };
    let (mut s, acked, filler) = fill_and_check(&fs);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(s.child.id() as libc::pid_t, libc::SIGTERM) };
    s.wait_exit(60)
        .unwrap_or_else(|| panic!("SIGTERM stops the server:\n{}", s.log()));
    let log = s.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        log.contains("No space left on device"),
        "the failed flush is reported:\n{log}"
    );
    drop(s);
    std::fs::remove_file(&filler).unwrap();
    restart_and_verify(&fs, &acked);
}
