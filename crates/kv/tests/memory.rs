//! The server's memory under hostile clients (issue #13, defect 1), measured on the real server
//! (`KvInstance`) running in this test process: its RSS (`/proc/self/status`) is sampled while
//! a client pipelines GETs it never reads, and after a flood of big unfinished requests. The
//! tests of this file take one lock, so only one of them runs at a time in the process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiermem_kv::config::KvConfig;
use tiermem_kv::instance::KvInstance;

static SERIAL: Mutex<()> = Mutex::new(());

const MIB: u64 = 1 << 20;

/// This process's resident set, bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("a VmRSS line");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in kB");
    kb * 1024
}

/// The highest RSS seen by a thread sampling every 2 ms until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Sampler {
    fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut max = rss();
            while !s.load(Ordering::Relaxed) {
                max = max.max(rss());
                std::thread::sleep(Duration::from_millis(2));
            }
            max.max(rss())
        });
        Sampler { stop, thread }
    }

    fn max(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("sampler")
    }
}

fn server(extra: &[(&str, &str)]) -> (KvInstance, SocketAddr) {
    let mut cfg = KvConfig::default();
    for (k, v) in [
        ("engine", "volatile"),
        ("port", "0"),
        ("threads", "2"),
        ("heap-size", "64mb"),
    ]
    .iter()
    .chain(extra)
    {
        cfg.set(k, v).expect("setting");
    }
    let kv = KvInstance::start(&cfg, Path::new("/nonexistent"), &mut |_| {}).expect("server");
    let addr = kv.tcp_addrs()[0];
    (kv, addr)
}

fn multibulk(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

/// One command on a fresh connection; the reply's raw bytes (read until a complete reply:
/// enough for the simple, integer and bulk replies used here).
fn command(addr: SocketAddr, args: &[&[u8]]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&multibulk(args)).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = s.read(&mut buf).expect("reply");
        assert!(n > 0, "connection closed before a reply");
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(2).position(|w| w == b"\r\n") {
            if got[0] != b'$' {
                return got;
            }
            let len: i64 = std::str::from_utf8(&got[1..end]).unwrap().parse().unwrap();
            if len < 0 || got.len() >= end + 2 + len as usize + 2 {
                return got;
            }
        }
    }
}

/// INFO's `tiermem_cut_output_buffer_limit`.
fn output_cuts(addr: SocketAddr) -> u64 {
    let info = String::from_utf8(command(addr, &[b"INFO", b"stats"])).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("tiermem_cut_output_buffer_limit:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("tiermem_cut_output_buffer_limit in INFO")
}

/// Reads until the server closes the connection; the bytes received.
fn drain_until_closed(s: &mut TcpStream) -> usize {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("reading from the cut client: {e}"),
        }
    }
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// 1,500 pipelined GETs of a 1 MiB value, never read: the server stops executing them once the
/// client's pending replies reach client-output-buffer-limit (32 MiB here) and cuts the client;
/// its RSS never grows by more than 1.2 × the limit (the old server grew by ~1.5 GB).
#[test]
fn pipelined_gets_never_read_cost_at_most_the_output_limit() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limit = 32 * MIB;
    let (kv, addr) = server(&[("client-output-buffer-limit", "32mb")]);
    let value = vec![b'v'; MIB as usize];
    assert_eq!(command(addr, &[b"SET", b"v", &value]), b"+OK\r\n");
    for _ in 0..3 {
        assert_eq!(command(addr, &[b"GET", b"v"]).len(), value.len() + 12);
    }
    let before = rss();
    let sampler = Sampler::start();
    let mut attacker = TcpStream::connect(addr).expect("connect");
    let mut batch = Vec::new();
    for _ in 0..1500 {
        batch.extend_from_slice(&multibulk(&[b"GET", b"v"]));
    }
    attacker.write_all(&batch).unwrap();
    wait_for("the output-limit cut", Duration::from_secs(30), || {
        output_cuts(addr) >= 1
    });
    let max = sampler.max();
    let got = drain_until_closed(&mut attacker);
    assert_eq!(output_cuts(addr), 1);
    assert!((got as u64) < limit, "the cut client received {got} bytes");
    let grew = max.saturating_sub(before);
    assert!(
        grew <= limit * 12 / 10,
        "RSS grew by {} MiB during the attack (limit {} MiB)",
        grew / MIB,
        limit / MIB
    );
    // The server still serves.
    assert_eq!(command(addr, &[b"GET", b"v"]).len(), value.len() + 12);
    kv.stop().expect("stop");
}

/// The requests before the one whose reply does not fit run (and stay done); the ones after do
/// not; nothing is sent to the cut client — with one transaction per command and with group
/// commit alike.
#[test]
fn output_limit_stops_a_pipeline_exactly_where_the_replies_stop_fitting() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for durability in ["commit", "pipeline"] {
        let (kv, addr) = server(&[
            ("client-output-buffer-limit", "1mb"),
            ("durability", durability),
        ]);
        let value = vec![b'v'; 256 << 10];
        assert_eq!(command(addr, &[b"SET", b"v", &value]), b"+OK\r\n");
        // INCR c, GET v, INCR c, GET v, ...: three GET replies (3 × 262,155 bytes) and four
        // INCR replies fit in 1 MiB, the fourth GET's does not: INCRs 1-4 run, 5-8 do not.
        let mut batch = Vec::new();
        for _ in 0..8 {
            batch.extend_from_slice(&multibulk(&[b"INCR", b"c"]));
            batch.extend_from_slice(&multibulk(&[b"GET", b"v"]));
        }
        let mut attacker = TcpStream::connect(addr).expect("connect");
        attacker.write_all(&batch).unwrap();
        let got = drain_until_closed(&mut attacker);
        assert_eq!(got, 0, "{durability}: the cut client received {got} bytes");
        assert_eq!(output_cuts(addr), 1, "{durability}");
        assert_eq!(
            command(addr, &[b"GET", b"c"]),
            b"$1\r\n4\r\n",
            "{durability}"
        );
        kv.stop().expect("stop");
    }
}

/// 200 clients each leave a 1 MiB unfinished request, then disconnect: the server gives the
/// memory back to the OS (the old server kept it).
#[test]
fn memory_of_a_flood_of_unfinished_requests_is_given_back() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (kv, addr) = server(&[]);
    let chunk = vec![b'x'; MIB as usize];
    let header = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2097152\r\n";
    // One unfinished request of 4 MiB freed first: glibc then serves buffers up to that size
    // from its arenas rather than from mappings of their own.
    {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$8388608\r\n")
            .unwrap();
        for _ in 0..4 {
            s.write_all(&chunk).unwrap();
        }
        assert_eq!(command(addr, &[b"PING"]), b"+PONG\r\n");
    }
    assert_eq!(command(addr, &[b"PING"]), b"+PONG\r\n");
    std::thread::sleep(Duration::from_millis(300));
    let before = rss();
    let clients = 200u64;
    let mut conns = Vec::new();
    for _ in 0..clients {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(header).unwrap();
        s.write_all(&chunk).unwrap();
        conns.push(s);
    }
    wait_for("the flood to be buffered", Duration::from_secs(30), || {
        rss() >= before + clients * MIB * 9 / 10
    });
    let peak = rss();
    drop(conns);
    assert_eq!(command(addr, &[b"PING"]), b"+PONG\r\n");
    let mut now = rss();
    let t0 = Instant::now();
    while now > before + 16 * MIB && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        now = rss();
    }
    eprintln!(
        "flood: RSS before {} MiB, buffered {} MiB, after {} MiB",
        before / MIB,
        peak / MIB,
        now / MIB
    );
    assert!(
        now <= before + 16 * MIB,
        "after the flood's clients left, RSS is {} MiB above its size before the flood",
        (now - before) / MIB
    );
    kv.stop().expect("stop");
}
