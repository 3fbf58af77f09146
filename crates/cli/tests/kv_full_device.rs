//! tiermem-kv on a full device (issue #13, defect 4), with the real `tiermem kv serve`: the
//! instance directory lives on a small private tmpfs that a filler file fills up. Writes must
//! then be refused with a `-MISCONF` error naming the file and `No space left on device`
//! (logged once, shown by INFO persistence), reads go on, every acknowledged write stays
//! readable, writes resume by themselves once space returns, SHUTDOWN works (and, while the
//! device is still full, plain SHUTDOWN refuses naming the cause and SHUTDOWN NOSAVE stops),
//! and a restart finds every acknowledged write.
//!
//! Needs root (mount); a non-root run says so and skips.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
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

/// A running `tiermem kv serve` (killed on drop if still running).
struct Server {
    child: Child,
    port: u16,
    log: Arc<Mutex<String>>,
}

/// Start `tiermem kv serve` on instance directory `dir` (the one place that starts servers
/// here: an instance is created by the first start).
fn start_server(dir: &Path) -> Server {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args([
            "kv",
            "serve",
            "--engine",
            "vnvm",
            "--port",
            &port.to_string(),
        ])
        .arg("--dir")
        .arg(dir)
        .args([
            "--set",
            "heap-size=128mb",
            "--set",
            "log-size=4mb",
            "--set",
            "cache-size=4mb",
        ])
        .env("TIERMEM_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tiermem kv serve");
    let log = Arc::new(Mutex::new(String::new()));
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        });
    }
    let mut s = Server { child, port, log };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(st)) = s.child.try_wait() {
            panic!("tiermem kv serve exited ({st}):\n{}", s.log());
        }
        if let Ok(mut c) = Conn::connect(port) {
            if c.cmd(&["PING"]) == Reply::Simple("PONG".into()) {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "no PONG:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Wait up to `secs` for the server to exit; its status.
    fn wait_exit(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, PartialEq, Clone)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// A minimal RESP2 client.
struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    fn connect(port: u16) -> std::io::Result<Conn> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn send(&mut self, args: &[&str]) -> std::io::Result<()> {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.w.write_all(&b)
    }

    fn read(&mut self) -> std::io::Result<Reply> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches("\r\n");
        let (t, rest) = line.split_at(1);
        let n = || rest.parse::<i64>().unwrap();
        Ok(match t {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(n()),
            "$" if n() < 0 => Reply::Bulk(None),
            "$" => {
                let mut b = vec![0u8; n() as usize + 2];
                self.r.read_exact(&mut b)?;
                b.truncate(n() as usize);
                Reply::Bulk(Some(b))
            }
            "*" if n() < 0 => Reply::Array(None),
            "*" => Reply::Array(Some(
                (0..n()).map(|_| self.read()).collect::<Result<_, _>>()?,
            )),
            _ => panic!("not RESP: {line:?}"),
        })
    }

    fn cmd(&mut self, args: &[&str]) -> Reply {
        self.send(args).unwrap();
        self.read().unwrap()
    }

    fn info(&mut self, section: &str) -> String {
        match self.cmd(&["INFO", section]) {
            Reply::Bulk(Some(b)) => String::from_utf8(b).unwrap(),
            r => panic!("INFO {section}: {r:?}"),
        }
    }
}

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
fn fill_and_check(fs: &Tmpfs) -> (Server, Vec<usize>, PathBuf) {
    let dir = fs.dir.join("inst");
    let s = start_server(&dir);
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
    let log = s.log();
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
    assert!(s.log().contains("writes resumed"), "{}", s.log());
    verify(&mut c, &acked);
    let _ = c.send(&["SHUTDOWN"]);
    let st = s.wait_exit(60).expect("SHUTDOWN stops the server");
    assert!(st.success(), "{st}:\n{}", s.log());
    drop(s);
    let s = start_server(&fs.dir.join("inst"));
    let mut c = Conn::connect(s.port).unwrap();
    verify(&mut c, &acked);
    let _ = c.send(&["SHUTDOWN"]);
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
    assert!(!s.log().contains("panicked"), "{}", s.log());
    drop(s);
    // Space back; the restart recovers every acknowledged write from the log and cache.
    std::fs::remove_file(&filler).unwrap();
    let s = start_server(&fs.dir.join("inst"));
    let mut c = Conn::connect(s.port).unwrap();
    verify(&mut c, &acked);
    let _ = c.send(&["SHUTDOWN"]);
}
