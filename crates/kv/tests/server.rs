//! The network front end against a small test service (PING/ECHO/SET/GET over a mutex-protected
//! map, QUIT, SHUTDOWN, PANIC), driven with std sockets: pipelining, many clients, every limit,
//! QUIT, SHUTDOWN, a Unix socket, and redis-cli when it is installed.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiermem_kv::config::ServerConfig;
use tiermem_kv::resp;
use tiermem_kv::server::{start, Control, Executed, ServerHandle, ServerStats, Service};

#[derive(Default)]
struct TestService {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    sessions: AtomicI64,
    rounds: AtomicU64,
    /// Rounds whose replies must not be sent (a failed durability barrier), counted down.
    fail_rounds: AtomicU64,
}

impl Service for TestService {
    type Session = ();

    fn open_session(&self, peer: &str) {
        assert!(!peer.is_empty());
        self.sessions.fetch_add(1, Ordering::SeqCst);
    }

    fn execute(
        &self,
        _: &mut (),
        requests: &[Vec<&[u8]>],
        out: &mut Vec<u8>,
        _: usize,
    ) -> Executed {
        let n = requests.len();
        for (i, r) in requests.iter().enumerate() {
            match r[0].to_ascii_uppercase().as_slice() {
                b"PING" if r.len() == 1 => resp::simple_string(out, b"PONG"),
                b"PING" | b"ECHO" if r.len() == 2 => resp::bulk(out, r[1]),
                b"SET" if r.len() == 3 => {
                    self.map
                        .lock()
                        .unwrap()
                        .insert(r[1].to_vec(), r[2].to_vec());
                    resp::ok(out);
                }
                b"GET" if r.len() == 2 => match self.map.lock().unwrap().get(r[1]) {
                    Some(v) => resp::bulk(out, v),
                    None => resp::null_bulk(out),
                },
                b"QUIT" => {
                    resp::ok(out);
                    return Executed::new(Control::Close, i + 1);
                }
                b"SHUTDOWN" => return Executed::new(Control::Shutdown, i + 1),
                b"PANIC" => panic!("the test service was asked to panic"),
                _ => resp::error(out, b"ERR unknown command or wrong number of arguments"),
            }
        }
        Executed::new(Control::Continue, n)
    }

    fn round_end(&self) -> bool {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.fail_rounds
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
    }

    fn close_session(&self, _: ()) {
        self.sessions.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Server {
    handle: ServerHandle,
    stats: Arc<ServerStats>,
    service: Arc<TestService>,
    addr: SocketAddr,
}

fn test_config() -> ServerConfig {
    ServerConfig {
        port: 0,
        threads: 2,
        ..ServerConfig::default()
    }
}

fn serve_with(config: ServerConfig) -> Server {
    let stats = Arc::new(ServerStats::default());
    let service = Arc::new(TestService::default());
    let handle = start(&config, Arc::clone(&service), Arc::clone(&stats)).expect("server starts");
    let addr = handle.tcp_addrs()[0];
    Server {
        handle,
        stats,
        service,
        addr,
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn multibulk(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    resp::array_len(&mut out, args.len());
    for a in args {
        resp::bulk(&mut out, a);
    }
    out
}

#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    assert!(line.ends_with(b"\r\n"), "{line:?}");
    line.truncate(line.len() - 2);
    Ok(String::from_utf8(line).unwrap())
}

fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(r)?;
    let (kind, rest) = line.split_at(1);
    Ok(match kind {
        "+" => Reply::Simple(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Int(rest.parse().unwrap()),
        "$" => {
            let n: i64 = rest.parse().unwrap();
            if n < 0 {
                Reply::Bulk(None)
            } else {
                let mut data = vec![0; n as usize + 2];
                r.read_exact(&mut data)?;
                data.truncate(n as usize);
                Reply::Bulk(Some(data))
            }
        }
        _ => panic!("unexpected reply line {line:?}"),
    })
}

/// True when the server closed the connection (EOF or reset) with nothing more to read.
fn closed(r: &mut impl Read) -> bool {
    let mut b = [0u8; 1];
    match r.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
        ),
    }
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(Some(s.as_bytes().to_vec()))
}

/// Polls `f` until it holds or `limit` passes.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

#[test]
fn commands_inline_and_multibulk() {
    let srv = serve_with(test_config());
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("PONG".into()));
    w.write_all(b"set greeting \"hello world\"\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("OK".into()));
    w.write_all(&multibulk(&[b"GET", b"greeting"])).unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), bulk("hello world"));
    w.write_all(&multibulk(&[b"GET", b"missing"])).unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Bulk(None));
    // A request delivered a byte at a time.
    for b in multibulk(&[b"ECHO", b"slowly"]) {
        w.write_all(&[b]).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(read_reply(&mut r).unwrap(), bulk("slowly"));
    assert!(srv.service.rounds.load(Ordering::Relaxed) >= 5);
    let st = srv.stats.snapshot();
    assert_eq!(st.total_commands_processed, 5);
    assert_eq!(st.connected_clients, 1);
    assert!(st.total_net_input_bytes > 0 && st.total_net_output_bytes > 0);
}

#[test]
fn pipelining_keeps_order() {
    let srv = serve_with(test_config());
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut batch = Vec::new();
    for i in 0..1000 {
        if i % 3 == 0 {
            batch.extend_from_slice(format!("ECHO {i}\r\n").as_bytes());
        } else {
            batch.extend_from_slice(&multibulk(&[b"ECHO", i.to_string().as_bytes()]));
        }
    }
    w.write_all(&batch).unwrap();
    for i in 0..1000 {
        assert_eq!(read_reply(&mut r).unwrap(), bulk(&i.to_string()));
    }
    assert_eq!(srv.stats.snapshot().total_commands_processed, 1000);
}

#[test]
fn many_concurrent_clients() {
    let srv = serve_with(test_config());
    let addr = srv.addr;
    let threads: Vec<_> = (0..200)
        .map(|t| {
            std::thread::spawn(move || {
                let s = connect(addr);
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                for i in 0..10 {
                    let key = format!("k{t}-{i}");
                    let val = format!("v{t}-{i}");
                    w.write_all(&multibulk(&[b"SET", key.as_bytes(), val.as_bytes()]))
                        .unwrap();
                    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("OK".into()));
                    w.write_all(&multibulk(&[b"GET", key.as_bytes()])).unwrap();
                    assert_eq!(read_reply(&mut r).unwrap(), bulk(&val));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(eventually(Duration::from_secs(5), || srv
        .stats
        .connected_clients
        .load(Ordering::Relaxed)
        == 0));
    let st = srv.stats.snapshot();
    assert_eq!(st.total_connections_received, 200);
    assert_eq!(st.total_commands_processed, 4000);
    assert_eq!(srv.service.sessions.load(Ordering::SeqCst), 0);
}

#[test]
fn big_values_cross_many_reads_and_writes() {
    let srv = serve_with(test_config());
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let value: Vec<u8> = (0..8 << 20).map(|i| (i * 7 % 251) as u8).collect();
    w.write_all(&multibulk(&[b"SET", b"big", &value])).unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("OK".into()));
    w.write_all(&multibulk(&[b"GET", b"big"])).unwrap();
    w.write_all(&multibulk(&[b"GET", b"big"])).unwrap();
    assert_eq!(
        read_reply(&mut r).unwrap(),
        Reply::Bulk(Some(value.clone()))
    );
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Bulk(Some(value)));
}

#[test]
fn protocol_errors_reply_then_close() {
    let srv = serve_with(test_config());
    // Requests before the error are answered, then the error, then the connection closes.
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PING\r\n*1\r\n%3\r\nfoo\r\nPING\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("PONG".into()));
    assert_eq!(
        read_reply(&mut r).unwrap(),
        Reply::Error("ERR Protocol error: expected '$', got '%'".into())
    );
    assert!(closed(&mut r));

    // A bulk length beyond proto-max-bulk-len is refused on sight, without its data.
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let t = Instant::now();
    w.write_all(b"*2\r\n$3\r\nGET\r\n$67108865\r\n").unwrap();
    assert_eq!(
        read_reply(&mut r).unwrap(),
        Reply::Error("ERR Protocol error: invalid bulk length".into())
    );
    assert!(closed(&mut r));
    assert!(t.elapsed() < Duration::from_secs(2));

    // Unbalanced quotes in an inline request.
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"SET k \"v\r\n").unwrap();
    assert_eq!(
        read_reply(&mut r).unwrap(),
        Reply::Error("ERR Protocol error: unbalanced quotes in request".into())
    );
    assert!(closed(&mut r));
    assert_eq!(srv.stats.snapshot().protocol_errors, 3);
}

#[test]
fn unfinished_frame_times_out_but_idle_client_does_not() {
    let srv = serve_with(ServerConfig {
        unfinished_frame_timeout: Duration::from_millis(300),
        ..test_config()
    });
    let idle = connect(srv.addr);
    let mut idle_r = BufReader::new(idle.try_clone().unwrap());
    let mut idle_w = idle;
    idle_w.write_all(b"PING\r\n").unwrap();
    assert_eq!(
        read_reply(&mut idle_r).unwrap(),
        Reply::Simple("PONG".into())
    );

    let mut half = connect(srv.addr);
    let t = Instant::now();
    half.write_all(b"*2\r\n$4\r\nECHO\r\n$5\r\nhe").unwrap();
    assert!(closed(&mut half));
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(srv.stats.snapshot().cut_unfinished_frame_timeout, 1);

    // The idle client (idle far longer than the timeout by now) still works.
    std::thread::sleep(Duration::from_millis(400));
    idle_w.write_all(b"PING\r\n").unwrap();
    assert_eq!(
        read_reply(&mut idle_r).unwrap(),
        Reply::Simple("PONG".into())
    );
}

#[test]
fn output_buffer_limit_closes_a_client_that_does_not_read() {
    let srv = serve_with(ServerConfig {
        client_output_buffer_limit: 1 << 20,
        ..test_config()
    });
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let value = vec![b'x'; 256 << 10];
    w.write_all(&multibulk(&[b"SET", b"v", &value])).unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("OK".into()));
    // 64 GETs of 256 KiB in one batch: 16 MiB of replies, beyond the 1 MiB limit.
    let mut batch = Vec::new();
    for _ in 0..64 {
        batch.extend_from_slice(&multibulk(&[b"GET", b"v"]));
    }
    w.write_all(&batch).unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(got < 2 << 20, "read {got} bytes");
    assert_eq!(srv.stats.snapshot().cut_output_buffer_limit, 1);
    // A client within the limit is unaffected.
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(&multibulk(&[b"GET", b"v"])).unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Bulk(Some(value)));
}

#[test]
fn query_buffer_limit_and_total_budget() {
    let srv = serve_with(ServerConfig {
        proto_max_bulk_len: 4 << 20,
        client_query_buffer_limit: 4 << 20,
        total_query_buffer_budget: 5 << 20,
        ..test_config()
    });
    let mib = vec![b'y'; 1 << 20];

    // One client's unfinished request beyond client-query-buffer-limit: several 1 MiB arguments.
    let mut big = connect(srv.addr);
    let mut req = b"*7\r\n$3\r\nSET\r\n".to_vec();
    for _ in 0..5 {
        req.extend_from_slice(b"$1048576\r\n");
        req.extend_from_slice(&mib);
        req.extend_from_slice(b"\r\n");
    }
    let _ = big.write_all(&req); // may fail once the server closes it
    assert!(closed(&mut big));
    assert_eq!(srv.stats.snapshot().cut_query_buffer_limit, 1);

    // Two clients (on different threads: connections are dealt round-robin) with unfinished
    // requests: 3 MiB, then 2.5 MiB > the 5 MiB budget: the larger one is closed.
    let before = srv.stats.snapshot().total_net_input_bytes;
    let mut a = connect(srv.addr);
    a.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$4000000\r\n")
        .unwrap();
    for _ in 0..3 {
        a.write_all(&mib).unwrap();
    }
    assert!(eventually(Duration::from_secs(5), || srv
        .stats
        .total_net_input_bytes
        .load(Ordering::Relaxed)
        >= before + (3 << 20)));
    let b = connect(srv.addr);
    let mut b_r = BufReader::new(b.try_clone().unwrap());
    let mut b_w = b;
    b_w.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$2621440\r\n")
        .unwrap();
    b_w.write_all(&mib).unwrap();
    b_w.write_all(&mib).unwrap();
    b_w.write_all(&mib[..1 << 19]).unwrap();
    assert!(closed(&mut a));
    assert_eq!(srv.stats.snapshot().cut_query_buffer_budget, 1);
    // b finishes its request and is served.
    b_w.write_all(b"\r\n").unwrap();
    assert_eq!(read_reply(&mut b_r).unwrap(), Reply::Simple("OK".into()));
}

#[test]
fn max_clients() {
    let srv = serve_with(ServerConfig {
        max_clients: 3,
        ..test_config()
    });
    let mut clients: Vec<(BufReader<TcpStream>, TcpStream)> = (0..3)
        .map(|_| {
            let s = connect(srv.addr);
            (BufReader::new(s.try_clone().unwrap()), s)
        })
        .collect();
    for (r, w) in clients.iter_mut() {
        w.write_all(b"PING\r\n").unwrap();
        assert_eq!(read_reply(r).unwrap(), Reply::Simple("PONG".into()));
    }
    let extra = connect(srv.addr);
    let mut er = BufReader::new(extra);
    assert_eq!(
        read_reply(&mut er).unwrap(),
        Reply::Error("ERR max number of clients reached".into())
    );
    assert!(closed(&mut er));
    assert_eq!(srv.stats.snapshot().rejected_connections, 1);
    // One leaves: there is room again.
    clients.pop();
    assert!(eventually(Duration::from_secs(5), || srv
        .stats
        .connected_clients
        .load(Ordering::Relaxed)
        == 2));
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("PONG".into()));
}

#[test]
fn quit_sends_replies_then_closes() {
    let srv = serve_with(test_config());
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PING\r\nQUIT\r\nPING\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("PONG".into()));
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("OK".into()));
    assert!(closed(&mut r));
    assert!(eventually(Duration::from_secs(5), || srv
        .service
        .sessions
        .load(Ordering::SeqCst)
        == 0));

    // A client that half-closes after its request still gets the reply.
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"ECHO bye\r\n").unwrap();
    w.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), bulk("bye"));
    assert!(closed(&mut r));
}

#[test]
fn service_panic_closes_only_that_client() {
    let srv = serve_with(test_config());
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PANIC\r\n").unwrap();
    assert!(closed(&mut r));
    assert_eq!(srv.stats.snapshot().service_panics, 1);
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("PONG".into()));
}

/// A round whose `round_end` says its replies must not go out (the service could not make its
/// writes durable): the server closes the connection without sending them; later rounds work.
#[test]
fn a_failed_round_end_closes_without_replies() {
    let srv = serve_with(test_config());
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("PONG".into()));
    srv.service.fail_rounds.store(1, Ordering::SeqCst);
    w.write_all(b"SET k v\r\n").unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "a reply left: {rest:?}");
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"GET k\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), bulk("v"));
}

#[test]
fn shutdown_command_stops_every_thread() {
    let srv = serve_with(test_config());
    let others: Vec<TcpStream> = (0..4).map(|_| connect(srv.addr)).collect();
    let s = connect(srv.addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(b"PING\r\nSHUTDOWN\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("PONG".into()));
    let t = Instant::now();
    srv.handle.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(closed(&mut r));
    for mut o in others {
        assert!(closed(&mut o));
    }
    assert_eq!(srv.stats.snapshot().connected_clients, 0);
    assert_eq!(srv.service.sessions.load(Ordering::SeqCst), 0);
    assert!(TcpStream::connect(srv.addr).is_err());
}

#[test]
fn unix_socket_with_permissions_and_shutdown_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sock");
    let srv = serve_with(ServerConfig {
        unix_socket: Some(path.clone()),
        unix_socket_perm: Some(0o700),
        ..test_config()
    });
    assert_eq!(srv.handle.unix_path(), Some(path.as_path()));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    w.write_all(&multibulk(&[b"SET", b"u", b"nix"])).unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Reply::Simple("OK".into()));
    w.write_all(b"GET u\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), bulk("nix"));
    // Stop through a trigger (what a signal handler would call).
    let trigger = srv.handle.shutdown_trigger();
    trigger.request();
    srv.handle.join().unwrap();
    assert!(closed(&mut r));
    assert!(!path.exists(), "the socket file is removed at shutdown");
}

/// redis-cli against the front end where it is installed: a missing redis-cli skips the test,
/// or fails it under `TIERMEM_REQUIRE_CLIENTS=1` (set by `scripts/test.sh`), as the tiermem-kv
/// end-to-end tests of the CLI crate do (`crates/cli/tests/kv_common`).
#[test]
fn redis_cli_if_installed() {
    let out = match std::process::Command::new("redis-cli")
        .arg("--version")
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            assert!(
                std::env::var("TIERMEM_REQUIRE_CLIENTS").as_deref() != Ok("1"),
                "redis-cli is not installed ({e}): scripts/setup.sh installs it"
            );
            println!("note: redis-cli is not installed ({e}); skipping the redis-cli test");
            return;
        }
    };
    assert!(out.status.success());
    let srv = serve_with(test_config());
    let port = srv.addr.port().to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(cli(&["PING"]), "PONG");
    assert_eq!(cli(&["SET", "cli", "hello world"]), "OK");
    assert_eq!(cli(&["GET", "cli"]), "hello world");
    assert_eq!(cli(&["ECHO", "multi\nline"]), "multi\nline");
}
