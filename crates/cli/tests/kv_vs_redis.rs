//! tiermem-kv against redis-server 7.0, side by side: the same commands from the same number
//! of connections go to Debian's `redis-server` and to `tiermem kv serve` (the durable vnvm
//! engine), and every reply must be the same (times to live within the second, or 1.5 ms in
//! milliseconds, that separates the two sends). Expiry (options, errors, which writes keep a
//! TTL, lazy and active expiry), MULTI/EXEC/WATCH from two connections, and databases.
//!
//! `redis-server` comes from `scripts/setup.sh`; without it the test skips, unless
//! `TIERMEM_REQUIRE_CLIENTS=1` (set by `scripts/test.sh`).

mod kv_common;

use kv_common::{client, create_server, Conn, Reply};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server of our own on a free port, nothing persisted; killed on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Option<Redis> {
        Redis::start_with(&[])
    }

    /// [`Redis::start`] with more arguments; `bind` is 127.0.0.1 unless they say otherwise.
    fn start_with(extra: &[&str]) -> Option<Redis> {
        let exe = client("redis-server")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(exe)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let r = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = Conn::connect(port) {
                if let Ok(Reply::Simple(_) | Reply::Error(_)) = c.try_cmd(&["PING"]) {
                    return Some(r);
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes a test's server directory however the test ends (a failed assertion included):
/// an engine's heap in /dev/shm is memory.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Three connections to each server.
struct Pair {
    redis: Vec<Conn>,
    ours: Vec<Conn>,
    steps: usize,
}

impl Pair {
    /// `line` (words split on spaces) on connection `c` of both servers: the same reply.
    fn same(&mut self, c: usize, line: &str) -> Reply {
        let args: Vec<&str> = line.split(' ').collect();
        self.same_args(c, &args)
    }

    fn same_args(&mut self, c: usize, args: &[&str]) -> Reply {
        let want = self.redis[c].cmd(args);
        let got = self.ours[c].cmd(args);
        self.steps += 1;
        let cmd = args[0].to_ascii_lowercase();
        let timed = ["ttl", "pttl", "expiretime", "pexpiretime"].contains(&cmd.as_str());
        let close = match (&want, &got) {
            (Reply::Int(a), Reply::Int(b)) if timed => {
                (a - b).abs() <= if cmd.starts_with('p') { 1500 } else { 1 }
            }
            _ => false,
        };
        assert!(
            want == got || close,
            "{args:?} on connection {c}: redis-server {want:?}, tiermem-kv {got:?}"
        );
        // (P)(UN)SUBSCRIBE confirm each name with a reply of its own.
        let subs = ["subscribe", "psubscribe", "unsubscribe", "punsubscribe"];
        if subs.contains(&cmd.as_str()) {
            for _ in 2..args.len() {
                self.same_push(c);
            }
        }
        got
    }

    /// Send `line` on connection `c` of both servers without reading a reply (a blocking
    /// command; [`Pair::same_push`] reads it).
    fn send(&mut self, c: usize, line: &str) {
        let args: Vec<&str> = line.split(' ').collect();
        self.redis[c].send(&args).unwrap();
        self.ours[c].send(&args).unwrap();
    }

    /// The next message pushed to connection `c` of both servers: the same.
    fn same_push(&mut self, c: usize) {
        let want = self.redis[c].read().unwrap();
        let got = self.ours[c].read().unwrap();
        self.steps += 1;
        assert_eq!(want, got, "message pushed to connection {c}");
    }
}

#[test]
fn replies_match_redis_server_7_0() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let dir = std::path::PathBuf::from("/dev/shm")
        .join(format!("tiermem-kv-vs-redis-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let ours = create_server(&dir, &[]);
    let mut p = Pair {
        redis: (0..3).map(|_| Conn::connect(redis.port).unwrap()).collect(),
        ours: (0..3).map(|_| Conn::connect(ours.port).unwrap()).collect(),
        steps: 0,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();

    // Expiry: EXPIRE's options and errors, SET's, SETEX, PSETEX, GETEX.
    let far = (now + 1000).to_string();
    let far_ms = ((now + 1000) * 1000).to_string();
    for line in [
        "FLUSHALL",
        "SET k v",
        "TTL k",
        "PTTL k",
        "EXPIRETIME k",
        "TTL nokey",
        "PEXPIRETIME nokey",
        "EXPIRE k 100",
        "TTL k",
        "EXPIRE k 100 NX",
        "EXPIRE k 200 XX",
        "TTL k",
        "EXPIRE k 50 GT",
        "EXPIRE k 500 GT",
        "EXPIRE k 600 LT",
        "EXPIRE k 60 LT",
        "PTTL k",
        "EXPIRE k 10 NX XX",
        "EXPIRE k 10 GT LT",
        "EXPIRE k 10 foo",
        "EXPIRE k abc",
        "EXPIRE k 10 nx gt",
        "EXPIRE k 9223372036854775807",
        "PEXPIRE k 9223372036854775807",
        "EXPIRE k -9223372036854775807",
        "EXPIREAT k 9223372036854775807",
        "PERSIST k",
        "PERSIST k",
        "TTL k",
        "EXPIRE k 10 XX",
        "EXPIRE k 10 GT",
        "EXPIRE k 10 LT",
        "EXPIRE k -1",
        "EXISTS k",
        "GET k",
        "EXPIRE nokey 10",
        "SET a 1 EX 100",
        "SET a 2 KEEPTTL",
        "TTL a",
        "SET a 3",
        "TTL a",
        "SET a 1 PX 100000",
        "PTTL a",
        "SET a 1 EX 0",
        "SET a 1 EX -5",
        "SET a 1 EX x",
        "SET a 1 EX",
        "SET a 1 EX 10 PX 100",
        "SET a 1 EX 10 EX 20",
        "TTL a",
        "SET a 1 EX 10 KEEPTTL",
        "SET a 1 KEEPTTL EX 10",
        &format!("SET a 1 EXAT {far}"),
        "EXPIRETIME a",
        &format!("SET a 1 PXAT {far_ms}"),
        "PEXPIRETIME a",
        "SET a 1 EXAT 1",
        "EXISTS a",
        "SET a 1 EX 9223372036854775807",
        "SET a 1 PX 9223372036854775807",
        "SET a 1 EX 9223372036854775",
        "SET b x EX 100 GET",
        "SET b y GET NX",
        "SET b z XX GET PX 5000",
        "PTTL b",
        "GET b",
        "SETEX c 100 v",
        "TTL c",
        "SETEX c 0 v",
        "SETEX c -1 v",
        "SETEX c x v",
        "PSETEX c 100000 v",
        "PTTL c",
        "PSETEX c 0 v",
        "GETEX c",
        "GETEX c PERSIST",
        "TTL c",
        "GETEX c EX 100",
        "TTL c",
        "GETEX c PX 100000 PERSIST",
        "GETEX c PERSIST EX 10",
        "GETEX c KEEPTTL",
        "GETEX c NX",
        "GETEX c EX 0",
        "GETEX c EX abc",
        "GETEX nokey EX abc",
        "LPUSH l 1",
        "GETEX l EX 10",
        "GETEX c EXAT 1",
        "EXISTS c",
        // Which writes keep a time to live, which drop it, which carry it.
        "SET d 1",
        "EXPIRE d 100",
        "GETSET d 2",
        "TTL d",
        "EXPIRE d 100",
        "INCR d",
        "TTL d",
        "APPEND d x",
        "SETRANGE d 0 z",
        "TTL d",
        "MSET d 5 e 6",
        "TTL d",
        "EXPIRE d 100",
        "RENAME d f",
        "TTL f",
        "EXISTS d",
        "COPY f g",
        "TTL g",
        "RPUSH L a b",
        "EXPIRE L 100",
        "RENAME L M",
        "TTL M",
        "LPOP M",
        "TTL M",
        "LPOP M",
        "TTL M",
        "SADD S a",
        "PEXPIRE S 100000",
        "SADD S b",
        "TTL S",
        "GETDEL f",
        "TTL f",
        "SET bd x EX 100",
        "BITOP NOT bd g",
        "TTL bd",
        "SET h 1",
        "PEXPIREAT h 1",
        "EXISTS h",
        "HSET H f v",
        "EXPIRE H 100",
        "HDEL H f",
        "TTL H",
        "EXISTS H",
    ] {
        p.same(0, line);
    }
    // Lazy and active expiry: 200 keys of 3 s among 100 without. The TTL outlasts setting the
    // 300 keys on both servers (a slow CI machine took over 100 ms), so DBSIZE is 300 on both.
    p.same(0, "FLUSHALL");
    for i in 0..200 {
        p.same(0, &format!("SET v{i} x PX 3000"));
    }
    for i in 0..100 {
        p.same(0, &format!("SET p{i} x"));
    }
    p.same(0, "DBSIZE");
    std::thread::sleep(Duration::from_millis(3100));
    for line in [
        "EXISTS v1 v2 p1",
        "GET v3",
        "TTL v4",
        "KEYS v*",
        "SET v5 y NX",
        "TTL v5",
    ] {
        p.same(0, line);
    }
    // Both servers' active expiry runs ten times a second: within 2 s only the 101 are left.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let r = p.redis[0].cmd(&["DBSIZE"]);
        let o = p.ours[0].cmd(&["DBSIZE"]);
        if r == Reply::Int(101) && o == Reply::Int(101) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "active expiry: redis-server {r:?}, tiermem-kv {o:?} keys after 2 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Transactions from two connections.
    for (c, line) in [
        (0, "FLUSHALL"),
        (0, "MULTI"),
        (0, "MULTI"),
        (0, "SET k 1"),
        (0, "EXEC"),
        (0, "EXEC"),
        (0, "DISCARD"),
        (0, "MULTI"),
        (0, "WATCH x"),
        (0, "EXEC"),
        (0, "MULTI"),
        (0, "SET k"),
        (0, "EXEC"),
        (0, "MULTI"),
        (0, "GET k"),
        (0, "LPUSH k x"),
        (0, "INCR k"),
        (0, "EXEC"),
        (0, "MULTI"),
        (0, "SAVE"),
        (0, "EXEC"),
        (0, "MULTI"),
        (0, "SELECT 0"),
        (0, "PING"),
        (0, "EXEC"),
        (0, "MULTI"),
        (0, "DISCARD"),
        (0, "DISCARD"),
        (0, "SET w 1"),
        (0, "WATCH w"),
        (1, "SET w 2"),
        (0, "MULTI"),
        (0, "GET w"),
        (0, "EXEC"),
        (0, "WATCH w"),
        (1, "SETNX w 3"),
        (0, "MULTI"),
        (0, "GET w"),
        (0, "EXEC"),
        (0, "WATCH nokey2"),
        (1, "SET nokey2 1"),
        (0, "MULTI"),
        (0, "PING"),
        (0, "EXEC"),
        (0, "WATCH w"),
        (0, "UNWATCH"),
        (1, "SET w 9"),
        (0, "MULTI"),
        (0, "GET w"),
        (0, "EXEC"),
        (0, "WATCH w"),
        (0, "SET w 10"),
        (0, "MULTI"),
        (0, "GET w"),
        (0, "EXEC"),
        (0, "WATCH w"),
        (1, "FLUSHALL"),
        (0, "MULTI"),
        (0, "PING"),
        (0, "EXEC"),
        (0, "WATCH w"),
        (1, "FLUSHALL"),
        (0, "MULTI"),
        (0, "PING"),
        (0, "EXEC"),
        (0, "SET e 1 PX 50"),
        (0, "WATCH e"),
    ] {
        p.same(c, line);
    }
    std::thread::sleep(Duration::from_millis(100));
    for line in ["MULTI", "PING", "EXEC"] {
        p.same(0, line);
    }

    // Databases.
    for (c, line) in [
        (0, "FLUSHALL"),
        (0, "SELECT 1"),
        (0, "SET k one"),
        (0, "SELECT 0"),
        (0, "GET k"),
        (0, "SET k zero"),
        (0, "SELECT 16"),
        (0, "SELECT -1"),
        (0, "SELECT x"),
        (0, "MOVE k 1"),
        (0, "MOVE k 2"),
        (0, "SELECT 2"),
        (0, "GET k"),
        (0, "SELECT 0"),
        (0, "MOVE k 0"),
        (0, "MOVE nokey 1"),
        (0, "MOVE k 16"),
        (0, "MOVE k x"),
        (0, "SET m 1 EX 100"),
        (0, "MOVE m 3"),
        (0, "SELECT 3"),
        (0, "TTL m"),
        (0, "SELECT 0"),
        (0, "RPUSH L a b"),
        (0, "MOVE L 4"),
        (0, "SELECT 4"),
        (0, "LRANGE L 0 -1"),
        (0, "SELECT 0"),
        (0, "SWAPDB 0 1"),
        (0, "GET k"),
        (0, "SWAPDB 0 16"),
        (0, "SWAPDB x 1"),
        (0, "SWAPDB 1 x"),
        (0, "SWAPDB 5 5"),
        (0, "SET c v EX 100"),
        (0, "COPY c c DB 1"),
        (0, "COPY c c"),
        (0, "COPY c c2 DB 7"),
        (0, "SELECT 7"),
        (0, "TTL c2"),
        (0, "SELECT 0"),
        (0, "COPY c c DB 1 REPLACE"),
        (0, "COPY c x DB 16"),
        (0, "SELECT 1"),
        (0, "FLUSHDB"),
        (0, "DBSIZE"),
        (0, "SELECT 0"),
        (0, "DBSIZE"),
        (0, "SELECT 2"),
        (0, "SET w 1"),
        (0, "WATCH w"),
        (1, "SELECT 2"),
        (1, "SET w y"),
        (0, "MULTI"),
        (0, "PING"),
        (0, "EXEC"),
        (0, "WATCH w"),
        (1, "SWAPDB 2 9"),
        (0, "MULTI"),
        (0, "PING"),
        (0, "EXEC"),
        (0, "MULTI"),
        (0, "SELECT 5"),
        (0, "SET in5 v"),
        (0, "EXEC"),
        (0, "GET in5"),
    ] {
        p.same(c, line);
    }
    // Pub/sub: 0 subscribes to channels, 1 to patterns, 2 publishes.
    for (c, line) in [
        (0, "SELECT 0"),
        (2, "PUBSUB NUMPAT"),
        (2, "PUBLISH ch1 nobody"),
        (0, "SUBSCRIBE ch1 ch2"),
        (0, "SUBSCRIBE ch1"),
        (1, "PSUBSCRIBE ch* x?"),
        (2, "PUBSUB CHANNELS *1"),
        (2, "PUBSUB NUMSUB ch1 ch3"),
        (2, "PUBSUB NUMPAT"),
        (2, "PUBLISH ch1 hello"),
    ] {
        p.same(c, line);
    }
    p.same_push(0);
    p.same_push(1);
    p.same(2, "PUBLISH xy m2");
    p.same_push(1);
    p.same(2, "PUBLISH ch2 m3");
    p.same_push(0);
    p.same_push(1);
    for (c, line) in [
        (0, "GET k"),
        (0, "PING"),
        (0, "PING x"),
        (0, "UNSUBSCRIBE ch1"),
        (0, "UNSUBSCRIBE nosuch"),
        (2, "PUBLISH ch1 m4"),
    ] {
        p.same(c, line);
    }
    p.same_push(1);
    for (c, line) in [
        (0, "UNSUBSCRIBE"),
        (0, "UNSUBSCRIBE"),
        (0, "PING"),
        (1, "PUNSUBSCRIBE x?"),
        (1, "PUNSUBSCRIBE"),
        (1, "PUNSUBSCRIBE"),
        (2, "PUBSUB NUMPAT"),
        (2, "PUBSUB CHANNELS"),
        (2, "PUBSUB FOO"),
        (2, "PUBSUB NUMPAT x"),
        (2, "PUBSUB CHANNELS a b"),
        (2, "PUBLISH ch1 x"),
    ] {
        p.same(c, line);
    }
    // A message larger than a read, and many in a row, arrive whole and in order.
    p.same(0, "SUBSCRIBE big");
    let big = "m".repeat(200_000);
    for i in 0..50 {
        p.same_args(2, &["PUBLISH", "big", &format!("{i}{big}")]);
    }
    for _ in 0..50 {
        p.same_push(0);
    }
    // A subscriber's connection closes: its subscriptions end with it.
    p.redis[0] = Conn::connect(redis.port).unwrap();
    p.ours[0] = Conn::connect(ours.port).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    p.same(2, "PUBSUB NUMSUB big");
    p.same(2, "PUBLISH big gone");

    // Blocking pops: time-outs, wake-ups from another connection, arrival order, the
    // non-list twins, errors, MULTI, a pipelined command behind a blocked one.
    // (Fresh connections: database 0, no subscription.)
    for c in 0..3 {
        p.redis[c] = Conn::connect(redis.port).unwrap();
        p.ours[c] = Conn::connect(ours.port).unwrap();
    }
    p.same(2, "FLUSHALL");
    let t0 = Instant::now();
    let r = p.same(0, "BLPOP k 0.1");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(180),
        "both servers wait 100 ms, one after the other: {waited:?} ({r:?})"
    );
    let settle = || std::thread::sleep(Duration::from_millis(50));
    p.send(0, "BLPOP k 0");
    settle();
    p.same(2, "RPUSH k x");
    p.same_push(0);
    p.send(0, "BLPOP q 0");
    settle();
    p.send(1, "BRPOP q 0");
    settle();
    p.same(2, "RPUSH q 1 2");
    p.same_push(0);
    p.same_push(1);
    p.send(0, "BLMOVE src dst LEFT RIGHT 0");
    settle();
    p.same(2, "RPUSH src m");
    p.same_push(0);
    p.same(2, "LRANGE dst 0 -1");
    p.send(0, "BRPOPLPUSH src dst 0");
    settle();
    p.same(2, "LPUSH src n");
    p.same_push(0);
    p.send(0, "BZPOPMIN z1 z2 0");
    settle();
    p.same(2, "ZADD z2 5 m5 3 m3");
    p.same_push(0);
    for line in [
        "BZPOPMAX z2 0",
        "BZPOPMIN z2 0.05",
        "BLPOP k -1",
        "BLPOP k x",
        "BLPOP k inf",
        "BLPOP k 1e30",
        "BLMOVE a b UP LEFT 0",
        "BLMOVE a b LEFT LEFT -1",
        "SET str v",
        "BLPOP str 0",
        "BLPOP nothing str 0",
        "RPUSH lst 1",
        "BLPOP str lst 0",
        "MULTI",
        "BLPOP empty 0",
        "EXEC",
    ] {
        p.same(0, line);
    }
    p.send(0, "BLMPOP 0 2 q1 q2 LEFT COUNT 2");
    settle();
    p.same(2, "RPUSH q2 x y z");
    p.same_push(0);
    p.send(0, "BZMPOP 0 1 zq MAX");
    settle();
    p.same(2, "ZADD zq 3 c 4 d");
    p.same_push(0);
    p.send(0, "BLPOP k2 0");
    p.send(0, "PING");
    settle();
    p.same(2, "RPUSH k2 v");
    p.same_push(0);
    p.same_push(0);
    // A blocked client that leaves takes nothing.
    p.redis[1] = Conn::connect(redis.port).unwrap();
    p.ours[1] = Conn::connect(ours.port).unwrap();
    p.send(1, "BLPOP gone 0");
    settle();
    p.redis[1] = Conn::connect(redis.port).unwrap();
    p.ours[1] = Conn::connect(ours.port).unwrap();
    settle();
    p.same(2, "RPUSH gone v");
    p.same(2, "LRANGE gone 0 -1");

    // CLIENT KILL: a subscriber by type, then the errors.
    p.same(1, "SUBSCRIBE kch");
    p.same(0, "CLIENT KILL TYPE pubsub");
    for line in [
        "CLIENT KILL 1.2.3.4:5",
        "CLIENT KILL ID 0",
        "CLIENT KILL TYPE x",
        "CLIENT KILL foo bar",
        "CLIENT LIST TYPE x",
        "CLIENT KILL ID 999999",
    ] {
        p.same(0, line);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        p.ours[1].try_cmd(&["PING"]).is_err(),
        "the killed subscriber is closed"
    );
    eprintln!("{} commands, the same replies from both servers", p.steps);
    drop(ours);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `requirepass` and AUTH, and protected mode, side by side with redis-server.
#[test]
fn auth_and_protected_mode_match_redis_server_7_0() {
    let Some(redis) = Redis::start_with(&["--requirepass", "secret"]) else {
        return;
    };
    let dir = std::path::PathBuf::from("/dev/shm")
        .join(format!("tiermem-kv-vs-redis-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let ours = create_server(&dir, &["--requirepass", "secret"]);
    let mut p = Pair {
        redis: vec![Conn::connect(redis.port).unwrap()],
        ours: vec![Conn::connect(ours.port).unwrap()],
        steps: 0,
    };
    for line in [
        "GET k",
        "PING",
        "MULTI",
        "AUTH wrong",
        "AUTH default wrong",
        "AUTH a b c",
        "AUTH secret",
        "GET k",
        "CONFIG GET requirepass",
        "CONFIG SET requirepass",
        "CONFIG SET requirepass other",
        "AUTH secret",
        "AUTH other",
    ] {
        p.same(0, line);
    }
    // A connection opened after the password changed must AUTH; one without a password
    // left needs none.
    p.redis[0] = Conn::connect(redis.port).unwrap();
    p.ours[0] = Conn::connect(ours.port).unwrap();
    for line in ["GET k", "AUTH default other", "SET k v", "GET k"] {
        p.same(0, line);
    }
    p.same_args(0, &["CONFIG", "SET", "requirepass", ""]);
    p.redis[0] = Conn::connect(redis.port).unwrap();
    p.ours[0] = Conn::connect(ours.port).unwrap();
    for line in ["GET k", "AUTH x", "AUTH default x"] {
        p.same(0, line);
    }
    drop(ours);
    drop(redis);

    // Protected mode: with no password, a client from another address of this host is
    // refused (the loopback one is served).
    let ip = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").map(|()| u))
        .and_then(|u| u.local_addr())
        .map(|a| a.ip());
    let ip = match ip {
        Ok(ip) if !ip.is_loopback() && !ip.is_unspecified() => ip,
        _ => {
            eprintln!("note: no non-loopback address on this host: protected mode not checked");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    };
    let redis = Redis::start_with(&["--bind", "0.0.0.0"]).expect("redis-server");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let ours = create_server(&dir, &["--bind", "0.0.0.0"]);
    let first = |port: u16| {
        let s = std::net::TcpStream::connect((ip, port)).unwrap();
        let mut c =
            Conn(tiermem_kv::client::Client::new(s, Some(Duration::from_secs(10))).unwrap());
        let r = c.cmd(&["PING"]);
        let closed = c.try_cmd(&["PING"]).is_err();
        (r, closed)
    };
    let (want, want_closed) = first(redis.port);
    let (got, got_closed) = first(ours.port);
    assert!(
        matches!(&want, Reply::Error(e) if e.starts_with("DENIED")),
        "{want:?}"
    );
    assert_eq!(want, got, "protected mode's refusal");
    assert_eq!(want_closed, got_closed, "the refused connection is closed");
    let mut local = Conn::connect(ours.port).unwrap();
    assert_eq!(local.cmd(&["PING"]), Reply::Simple("PONG".into()));
    drop(ours);
    let _ = std::fs::remove_dir_all(&dir);
}

/// ZUNION, ZINTER, ZDIFF, ZINTERCARD and their STORE forms on random inputs (zsets with
/// infinite and zero scores, sets, missing keys, a string), random WEIGHTS, AGGREGATE,
/// WITHSCORES and LIMIT, and malformed calls: the same replies and stored results as
/// redis-server's.
#[test]
fn sorted_set_algebra_matches_redis_server_7_0() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let dir = std::path::PathBuf::from("/dev/shm")
        .join(format!("tiermem-kv-vs-redis-zops-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let ours = create_server(&dir, &[]);
    let mut p = Pair {
        redis: vec![Conn::connect(redis.port).unwrap()],
        ours: vec![Conn::connect(ours.port).unwrap()],
        steps: 0,
    };
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let pick = |r: &mut dyn FnMut(usize) -> usize, v: &[&'static str]| v[r(v.len())];
    for k in ["z1", "z2", "z3"] {
        for i in 0..3 + rnd(7) {
            let sc = pick(&mut rnd, &["1", "2", "2.5", "-3", "0", "inf", "-inf", "7"]);
            p.same(0, &format!("ZADD {k} {sc} m{}", (i * 5 + rnd(3)) % 12));
        }
    }
    for k in ["s1", "s2"] {
        for i in 0..2 + rnd(6) {
            p.same(0, &format!("SADD {k} m{}", (i * 7 + rnd(2)) % 12));
        }
    }
    p.same(0, "SET str x");
    let keys = ["z1", "z2", "z3", "s1", "s2", "nokey"];
    let ops = [
        "ZUNION",
        "ZINTER",
        "ZDIFF",
        "ZINTERCARD",
        "ZUNIONSTORE",
        "ZINTERSTORE",
        "ZDIFFSTORE",
    ];
    for _ in 0..300 {
        let op = pick(&mut rnd, &ops);
        let store = op.ends_with("STORE");
        let n = 1 + rnd(3);
        let mut args: Vec<String> = vec![op.into()];
        if store {
            args.push(pick(&mut rnd, &["dst", "dst", "z3"]).into());
        }
        args.push(n.to_string());
        for _ in 0..n {
            args.push(pick(&mut rnd, &keys).into());
        }
        if !["ZDIFF", "ZDIFFSTORE", "ZINTERCARD"].contains(&op) {
            if rnd(10) < 4 {
                args.push("WEIGHTS".into());
                for _ in 0..n {
                    args.push(pick(&mut rnd, &["1", "2", "0", "-1", "0.5", "inf"]).into());
                }
            }
            if rnd(10) < 4 {
                args.push("AGGREGATE".into());
                args.push(pick(&mut rnd, &["SUM", "MIN", "MAX", "avg"]).into());
            }
        }
        if !store && op != "ZINTERCARD" && rnd(2) == 0 {
            args.push("WITHSCORES".into());
        }
        if op == "ZINTERCARD" && rnd(2) == 0 {
            args.push("LIMIT".into());
            args.push(pick(&mut rnd, &["0", "1", "2", "-1", "x"]).into());
        }
        if rnd(20) == 0 {
            let at = if store { 2 } else { 1 };
            args[at] = pick(&mut rnd, &["0", "x", "9"]).into();
        }
        if rnd(30) == 0 {
            args.push("str".into());
        }
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        p.same_args(0, &refs);
        if store {
            p.same_args(0, &["ZRANGE", refs[1], "0", "-1", "WITHSCORES"]);
        }
    }
    for line in [
        "ZUNION 1 str",
        "ZINTER 2 z1 str",
        "ZUNIONSTORE d 0 z1",
        "ZUNION 2 z1",
        "ZUNION 1 z1 WEIGHTS x",
        "ZDIFF 1 z1 WEIGHTS 1",
        "ZADD zz -0 m",
        "ZSCORE zz m",
    ] {
        p.same(0, line);
    }
    // Ranks and lexicographic ranges.
    p.same(0, "ZADD lz 0 ab 0 ba 0 c 0 cz 0 dd 0 e 0 ea 0 j");
    let bounds = [
        "-", "+", "[a", "(a", "[c", "(cz", "[j", "(b", "[", "(", "x", "[dd",
    ];
    for i in 0..60 {
        let (lo, hi) = (bounds[rnd(bounds.len())], bounds[rnd(bounds.len())]);
        let c = ["ZRANGEBYLEX", "ZREVRANGEBYLEX", "ZLEXCOUNT"][i % 3];
        p.same(0, &format!("{c} lz {lo} {hi}"));
        if c != "ZLEXCOUNT" {
            p.same(
                0,
                &format!("{c} lz {lo} {hi} LIMIT {} {}", rnd(3), rnd(4) as i64 - 1),
            );
        }
        p.same(0, &format!("ZRANGE lz {lo} {hi} BYLEX REV LIMIT 0 2"));
    }
    // ZRANGESTORE: ZRANGE's selections (rank, BYSCORE, BYLEX, REV, LIMIT) stored, over
    // missing and wrong-typed sources and destinations, and its errors.
    p.same(0, "SET str2 y");
    let ranks = ["0", "-1", "1", "-2", "5", "x"];
    let scores = ["-inf", "+inf", "1", "(1", "2.5", "(0", "7", "x"];
    for i in 0..60 {
        let src = pick(&mut rnd, &["z1", "z2", "z3", "lz", "nokey", "str"]);
        let dst = pick(&mut rnd, &["dst", "dst", "z3", "str2"]);
        let mut line = format!("ZRANGESTORE {dst} {src}");
        match i % 4 {
            0 => line += &format!(" {} {}", pick(&mut rnd, &ranks), pick(&mut rnd, &ranks)),
            1 => {
                let (lo, hi) = (pick(&mut rnd, &scores), pick(&mut rnd, &scores));
                line += &format!(" {lo} {hi} BYSCORE");
            }
            2 => {
                line += &format!(
                    " {} {} BYLEX",
                    pick(&mut rnd, &bounds),
                    pick(&mut rnd, &bounds)
                )
            }
            _ => {
                line += " 0 -1";
                line += pick(
                    &mut rnd,
                    &[" WITHSCORES", " LIMIT 0 1", " BYSCORE LIMIT x 1", ""],
                );
            }
        }
        if rnd(3) == 0 {
            line += " REV";
        }
        if i % 4 != 0 && rnd(3) == 0 {
            line += &format!(" LIMIT {} {}", rnd(3), rnd(4) as i64 - 1);
        }
        p.same(0, &line);
        p.same(0, &format!("ZRANGE {dst} 0 -1 WITHSCORES"));
        p.same(0, &format!("TYPE {dst}"));
    }
    for line in [
        "ZRANGESTORE dst z1",
        "ZRANGESTORE dst z1 0",
        "ZRANGESTORE dst",
    ] {
        p.same(0, line);
    }
    for line in [
        "ZRANGEBYLEX lz - + WITHSCORES",
        "ZRANGE lz - + BYLEX WITHSCORES",
        "ZRANGEBYLEX str - +",
        "ZRANK lz c",
        "ZREVRANK lz c",
        "ZRANK lz nosuch",
        "ZRANK nokey c",
        "ZRANK str c",
        "ZRANK z1 m3",
        "ZREVRANK z1 m5",
        "ZREMRANGEBYLEX lz [b (dd",
        "ZRANGE lz 0 -1",
        "ZREMRANGEBYLEX lz - +",
        "EXISTS lz",
        "ZREMRANGEBYLEX lz x +",
    ] {
        p.same(0, line);
    }
    // LMPOP and ZMPOP.
    for line in [
        "LMPOP 0 a LEFT",
        "LMPOP x a LEFT",
        "LMPOP 2 a LEFT",
        "LMPOP 1 a UP",
        "LMPOP 1 a LEFT COUNT 0",
        "LMPOP 1 a LEFT COUNT 1 COUNT 2",
        "LMPOP 1 a LEFT COUNT",
        "ZMPOP 1 a MIN COUNT -1",
        "LMPOP 1 a left count x",
        "LMPOP 3 a b LEFT",
        "LMPOP 1 a LEFT",
        "RPUSH L 1 2 3",
        "ZADD Z 1 a 2 b",
        "LMPOP 2 nokey L RIGHT COUNT 2",
        "ZMPOP 1 Z MAX COUNT 5",
        "LMPOP 2 nokey str LEFT",
        "LMPOP 1 L LEFT COUNT 9",
        "EXISTS L",
        "ZMPOP 2 z1 str min COUNT 2",
    ] {
        p.same(0, line);
    }
    // OBJECT: encodings (integers included), refcounts (shared integers), FREQ, HELP, errors.
    for line in [
        "SET n 5",
        "SET n2 10000",
        "SET n3 -1",
        "SET n4 05",
        "SET n5 9223372036854775807",
        "SET n6 9223372036854775808",
        "SET s abc",
        "RPUSH l a",
        "OBJECT ENCODING n",
        "OBJECT ENCODING n3",
        "OBJECT ENCODING n4",
        "OBJECT ENCODING n5",
        "OBJECT ENCODING n6",
        "OBJECT ENCODING s",
        "OBJECT ENCODING nokey",
        "OBJECT REFCOUNT n",
        "OBJECT REFCOUNT n2",
        "OBJECT REFCOUNT n3",
        "OBJECT REFCOUNT s",
        "OBJECT REFCOUNT l",
        "OBJECT REFCOUNT nokey",
        "OBJECT FREQ l",
        "OBJECT FREQ nokey",
        "OBJECT HELP",
        "OBJECT help x",
        "OBJECT FREQ",
        "OBJECT refcount k extra",
        "OBJECT foo k",
        "OBJECT",
    ] {
        p.same(0, line);
    }
    eprintln!("{} commands, the same replies from both servers", p.steps);
    drop(ours);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SORT and SORT_RO (every option, the errors, STORE), DUMP and RESTORE with payloads moving
/// both ways between the two servers (every type, in the encodings Redis 7.0 writes: intset,
/// listpack, quicklist, skiplist, hashtable, integers, LZF-compressed strings), and MIGRATE
/// from each server to the other.
#[test]
fn sort_dump_restore_and_migrate_match_redis_server_7_0() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let dir = std::path::PathBuf::from("/dev/shm")
        .join(format!("tiermem-kv-vs-redis-sort-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let ours = create_server(&dir, &[]);
    let mut p = Pair {
        redis: vec![Conn::connect(redis.port).unwrap()],
        ours: vec![Conn::connect(ours.port).unwrap()],
        steps: 0,
    };
    // SORT.
    for line in [
        "RPUSH l 3 1 2 10 -5 2.5 1e2",
        "RPUSH la banana apple cherry 10 9",
        "SADD s 5 3 9 1",
        "ZADD z 1 c 2 b 3 a 4 d",
        "MSET w_3 30 w_1 10 w_2 20 w_10 5 w_-5 100 w_2.5 1",
        "MSET n_1 one n_2 two n_3 three",
        "HSET h_1 f 3 g x",
        "HSET h_2 f 1",
        "HSET h_3 f 2 g y",
        "RPUSH l3 1 2 3",
        "SET str x",
        "RPUSH bad 1 x 2",
        "RPUSH sp 1 2 3",
        "SET sp_1 abc",
        // Not 1e400: Redis 7.0 does not clear errno before its strtod, so after an ERANGE
        // every later numeric SORT of that server fails until errno changes.
        "SET sp_2 1x",
        "SET sp_3 nan",
    ] {
        p.same(0, line);
    }
    for line in [
        "SORT l",
        "SORT l DESC",
        "SORT l LIMIT 1 3",
        "SORT l LIMIT -2 3",
        "SORT l LIMIT 0 -1",
        "SORT l LIMIT 100 3",
        "SORT l LIMIT 2 0",
        "SORT l LIMIT x 1",
        "SORT l LIMIT 1",
        "SORT la ALPHA",
        "SORT la ALPHA DESC LIMIT 1 2",
        "SORT la",
        "SORT s",
        "SORT s DESC",
        "SORT z",
        "SORT z ALPHA",
        "SORT z BY nosort",
        "SORT z BY nosort DESC",
        "SORT z BY nosort LIMIT 1 2",
        "SORT z BY nosort DESC LIMIT 1 2",
        "SORT l BY nosort",
        "SORT l BY nosort DESC LIMIT 1 3",
        "SORT l BY w_*",
        "SORT l BY w_* DESC",
        "SORT l BY w_* ALPHA",
        "SORT l BY w_* LIMIT 0 2",
        "SORT l3 BY h_*->f",
        "SORT l3 BY h_*->g ALPHA",
        "SORT l3 BY h_*->",
        "SORT l3 GET n_*",
        "SORT l3 GET # GET n_* GET h_*->f GET h_*->g GET missing_*",
        "SORT l3 GET nostar",
        "SORT l3 BY w_* GET # GET n_*",
        "SORT l3 BY nosort GET n_* DESC",
        "SORT l3 DESC STORE dst",
        "LRANGE dst 0 -1",
        "SORT l3 GET n_* GET h_*->g STORE dst",
        "LRANGE dst 0 -1",
        "SORT s BY nosort STORE dst",
        "LRANGE dst 0 -1",
        "SORT nokey",
        "SORT nokey STORE dst",
        "EXISTS dst",
        "SORT str",
        "SORT bad",
        "SORT bad ALPHA",
        "SORT sp BY sp_*",
        "SORT l STORE",
        "SORT l FOO",
        "SORT_RO l DESC LIMIT 0 3",
        "SORT_RO l3 GET # GET n_*",
        "SORT_RO l STORE dst",
        "SORT_RO str",
        "SORT_RO nokey",
    ] {
        p.same(0, line);
    }
    // DUMP and RESTORE errors, side by side.
    p.same(0, "SET k v");
    for line in [
        "DUMP nokey",
        "RESTORE k 0 xxxxxxxxxxxxxxxxx",
        "RESTORE k2 0 xxxxxxxxxxxxxxxxx",
        "RESTORE k2 0 short",
        "RESTORE k2 -1 xxxxxxxxxxxxxxxxx",
        "RESTORE k2 x xxxxxxxxxxxxxxxxx",
        "RESTORE k2 0 xxxxxxxxxxxxxxxxx FOO",
        "RESTORE k2 0 xxxxxxxxxxxxxxxxx IDLETIME -1",
        "RESTORE k2 0 xxxxxxxxxxxxxxxxx FREQ 256",
        "RESTORE k2 0 xxxxxxxxxxxxxxxxx IDLETIME 1 FREQ 2",
    ] {
        p.same(0, line);
    }
    // Payloads both ways: every type, small (compact encodings) and large.
    let many = |f: &dyn Fn(usize) -> String| (0..300).map(f).collect::<Vec<_>>().join(" ");
    let setup = [
        "SET d_s1 hello".to_string(),
        "SET d_s2 12345".into(),
        "SET d_s3 -100000".into(),
        "SET d_s4 99999999999".into(),
        format!("SET d_s5 {}", "abc".repeat(100)),
        "RPUSH d_l1 a b 1 -5 300 70000 -70000 5000000000 zzz".into(),
        format!("RPUSH d_l2 {}", many(&|i| format!("e{i}"))),
        "SADD d_i1 1 2 3 -4 100000 5000000000".into(),
        "SADD d_i2 a b c".into(),
        format!("SADD d_i3 {}", many(&|i| format!("e{i}"))),
        "HSET d_h1 f 1 g two".into(),
        format!("HSET d_h2 {}", many(&|i| format!("f{i} {i}"))),
        "ZADD d_z1 1 a 2.5 b -3 c 1e6 d inf e".into(),
        format!("ZADD d_z2 {}", many(&|i| format!("{i}.25 m{i}"))),
    ];
    for s in &setup {
        p.same(0, s);
    }
    let dumps = |c: &mut Conn, k: &str| match c.cmd(&["DUMP", k]) {
        Reply::Bulk(Some(b)) => b,
        r => panic!("DUMP {k}: {r:?}"),
    };
    let keys = [
        "d_s1", "d_s2", "d_s3", "d_s4", "d_s5", "d_l1", "d_l2", "d_i1", "d_i2", "d_i3", "d_h1",
        "d_h2", "d_z1", "d_z2",
    ];
    for k in keys {
        // Redis's payload into tiermem-kv, and tiermem-kv's into Redis, under new names.
        let theirs = dumps(&mut p.redis[0], k);
        let mine = dumps(&mut p.ours[0], k);
        let from_redis = format!("{k}_r");
        let from_ours = format!("{k}_o");
        for (payload, name) in [(&theirs, &from_redis), (&mine, &from_ours)] {
            for c in [&mut p.redis[0], &mut p.ours[0]] {
                c.0.send(&[b"RESTORE".as_slice(), name.as_bytes(), b"0", payload])
                    .unwrap();
                assert_eq!(c.read().unwrap(), Reply::Simple("OK".into()), "{name}");
            }
        }
        for name in [k, &from_redis, &from_ours] {
            for line in [
                format!("TYPE {name}"),
                format!("OBJECT ENCODING {name}"),
                format!("SORT {name} ALPHA"),
                format!("GET {name}"),
                format!("LRANGE {name} 0 -1"),
                format!("ZRANGE {name} 0 -1 WITHSCORES"),
                format!("HLEN {name}"),
                format!("SORT {name} BY nosort GET # GET {name}_nothing"),
            ] {
                if !line.contains("BY nosort") || !k.starts_with("d_i") {
                    p.same(0, &line);
                }
            }
        }
        // A payload damaged anywhere is refused with Redis's error.
        let mut bad = theirs.clone();
        let at = bad.len() / 2;
        bad[at] ^= 0x20;
        for c in [&mut p.redis[0], &mut p.ours[0]] {
            c.0.send(&[b"RESTORE".as_slice(), b"bad_payload", b"0", &bad])
                .unwrap();
        }
        let want = p.redis[0].read().unwrap();
        let got = p.ours[0].read().unwrap();
        assert_eq!(want, got, "a damaged payload of {k}");
    }
    // REPLACE, BUSYKEY, a TTL, ABSTTL in the past.
    let payload = dumps(&mut p.redis[0], "d_l1");
    for args in [
        vec!["RESTORE", "d_s1", "0", "P"],
        vec!["RESTORE", "d_s1", "0", "P", "REPLACE"],
        vec!["RESTORE", "t1", "100000", "P"],
        vec!["RESTORE", "t2", "1", "P", "ABSTTL"],
        vec!["RESTORE", "d_s2", "1", "P", "ABSTTL", "REPLACE"],
        vec!["RESTORE", "t3", "0", "P", "IDLETIME", "10"],
    ] {
        for c in [&mut p.redis[0], &mut p.ours[0]] {
            let a: Vec<&[u8]> = args
                .iter()
                .map(|x| {
                    if *x == "P" {
                        &payload[..]
                    } else {
                        x.as_bytes()
                    }
                })
                .collect();
            c.0.send(&a).unwrap();
        }
        let want = p.redis[0].read().unwrap();
        let got = p.ours[0].read().unwrap();
        assert_eq!(want, got, "{args:?}");
    }
    for line in [
        "TYPE d_s1",
        "PTTL t1",
        "EXISTS t2",
        "EXISTS d_s2",
        "OBJECT IDLETIME nokey",
    ] {
        p.same(0, line);
    }
    // OBJECT IDLETIME: RESTORE's IDLETIME, then a use (TYPE and OBJECT are not uses), within
    // the second the two sends may straddle.
    let idle = |p: &mut Pair, k: &str| -> (i64, i64) {
        let get = |c: &mut Conn| match c.cmd(&["OBJECT", "IDLETIME", k]) {
            Reply::Int(i) => i,
            r => panic!("OBJECT IDLETIME {k}: {r:?}"),
        };
        (get(&mut p.redis[0]), get(&mut p.ours[0]))
    };
    let (r, o) = idle(&mut p, "t3");
    assert!(
        (9..=11).contains(&r) && (r - o).abs() <= 1,
        "after IDLETIME 10: {r} {o}"
    );
    p.same(0, "TYPE t3");
    let (r, o) = idle(&mut p, "t3");
    assert!(r >= 9 && (r - o).abs() <= 1, "TYPE is no use: {r} {o}");
    p.same(0, "LRANGE t3 0 -1");
    let (r, o) = idle(&mut p, "t3");
    assert!(r <= 1 && o <= 1, "LRANGE is a use: {r} {o}");
    // OBJECT ENCODING follows the thresholds CONFIG SET changes.
    for line in [
        "CONFIG SET zset-max-listpack-entries 2 set-max-intset-entries 2",
        "ZADD cfg_z 1 a 2 b 3 c",
        "SADD cfg_s 1 2 3",
        "OBJECT ENCODING cfg_z",
        "OBJECT ENCODING cfg_s",
        "CONFIG SET zset-max-listpack-entries 128 set-max-intset-entries 512",
    ] {
        p.same(0, line);
    }
    // INFO commandstats: calls, rejected and failed calls as Redis counts them.
    let stats = |c: &mut Conn| -> Vec<String> {
        let text = c.info("commandstats");
        let mut v: Vec<String> = text
            .lines()
            .filter(|l| {
                ["cmdstat_get:", "cmdstat_set:", "cmdstat_lpush:"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .map(|l| {
                l.split(',')
                    .filter(|f| !f.contains("usec"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        v.sort();
        v
    };
    for line in [
        "CONFIG RESETSTAT",
        "SET cs_a 1",
        "GET cs_a",
        "GET cs_a",
        "LPUSH cs_a x",
        "GET",
        "GET cs_a b",
    ] {
        p.same(0, line);
    }
    assert_eq!(stats(&mut p.redis[0]), stats(&mut p.ours[0]));
    assert_eq!(
        stats(&mut p.ours[0]),
        [
            "cmdstat_get:calls=2,rejected_calls=2,failed_calls=0",
            "cmdstat_lpush:calls=1,rejected_calls=0,failed_calls=1",
            "cmdstat_set:calls=1,rejected_calls=0,failed_calls=0",
        ]
    );
    // WATCH sees only the keys a command changes: the sources of COPY, SINTERSTORE, BITOP and
    // SORT ... STORE stay watched; their destinations do not.
    p.redis.push(Conn::connect(redis.port).unwrap());
    p.ours.push(Conn::connect(ours.port).unwrap());
    for (write, watched) in [
        ("COPY l3 copy_dst REPLACE", "l3"),
        ("COPY l3 copy_dst REPLACE", "copy_dst"),
        ("SINTERSTORE inter_dst s s", "s"),
        ("SINTERSTORE inter_dst s s", "inter_dst"),
        ("BITOP OR bit_dst d_s1 d_s1", "d_s1"),
        ("BITOP OR bit_dst d_s1 d_s1", "bit_dst"),
        ("SORT l3 STORE sort_dst", "l3"),
        ("SORT l3 DESC STORE sort_dst", "sort_dst"),
        ("ZRANGESTORE zr_dst d_z1 0 1", "d_z1"),
    ] {
        p.same(0, &format!("WATCH {watched}"));
        p.same(0, "MULTI");
        p.same(0, "PING");
        p.same(1, write);
        p.same(0, "EXEC");
    }
    // MIGRATE: the errors side by side, then each server's keys into the other's database 3.
    for line in [
        "MIGRATE 127.0.0.1 1 nokey 0 100",
        "MIGRATE 127.0.0.1 1 d_s1 0 100",
        "MIGRATE 127.0.0.1 1 d_s1 x 100",
        "MIGRATE 127.0.0.1 1 d_s1 0 100 FOO",
        "MIGRATE 127.0.0.1 1 d_s1 0 100 KEYS a b",
    ] {
        p.same(0, line);
    }
    let (rport, oport) = (redis.port.to_string(), ours.port.to_string());
    p.ours[0].cmd(&["SET", "mig_o", "from-ours"]);
    p.ours[0].cmd(&["EXPIRE", "mig_o", "1000"]);
    p.redis[0].cmd(&["RPUSH", "mig_r", "a", "b"]);
    let moved = p.ours[0].cmd(&["MIGRATE", "127.0.0.1", &rport, "mig_o", "3", "5000"]);
    assert_eq!(moved, Reply::Simple("OK".into()));
    let moved = p.redis[0].cmd(&["MIGRATE", "127.0.0.1", &oport, "mig_r", "3", "5000", "COPY"]);
    assert_eq!(moved, Reply::Simple("OK".into()));
    let moved = p.ours[0].cmd(&[
        "MIGRATE",
        "127.0.0.1",
        &rport,
        "",
        "3",
        "5000",
        "COPY",
        "KEYS",
        "d_h1",
        "d_z1",
    ]);
    assert_eq!(moved, Reply::Simple("OK".into()));
    // A key that exists on the target without REPLACE: the target's error, the key stays.
    p.ours[0].cmd(&["SET", "mig_o", "again"]);
    let refused = p.ours[0].cmd(&["MIGRATE", "127.0.0.1", &rport, "mig_o", "3", "5000"]);
    assert!(
        matches!(&refused, Reply::Error(e) if e.starts_with("ERR Target instance replied with error: BUSYKEY")),
        "{refused:?}"
    );
    assert_eq!(p.ours[0].cmd(&["EXISTS", "mig_o"]), Reply::Int(1));
    for c in [&mut p.redis[0], &mut p.ours[0]] {
        c.cmd(&["SELECT", "3"]);
    }
    assert_eq!(p.ours[0].cmd(&["SELECT", "0"]), Reply::Simple("OK".into()));
    p.ours[0].cmd(&["SELECT", "3"]);
    assert_eq!(
        p.redis[0].cmd(&["GET", "mig_o"]),
        Reply::Bulk(Some(b"from-ours".to_vec()))
    );
    assert!(matches!(p.redis[0].cmd(&["TTL", "mig_o"]), Reply::Int(t) if t > 990));
    assert_eq!(
        p.ours[0].cmd(&["LRANGE", "mig_r", "0", "-1"]),
        Reply::Array(Some(vec![
            Reply::Bulk(Some(b"a".to_vec())),
            Reply::Bulk(Some(b"b".to_vec()))
        ]))
    );
    assert_eq!(
        p.redis[0].cmd(&["HGET", "d_h1", "g"]),
        Reply::Bulk(Some(b"two".to_vec()))
    );
    assert_eq!(
        p.redis[0].cmd(&["ZSCORE", "d_z1", "d"]),
        Reply::Bulk(Some(b"1000000".to_vec()))
    );
    for c in [&mut p.redis[0], &mut p.ours[0]] {
        c.cmd(&["SELECT", "0"]);
    }
    // MIGRATE without COPY removed the source; with COPY it stayed.
    assert_eq!(p.redis[0].cmd(&["EXISTS", "mig_r"]), Reply::Int(1));
    assert_eq!(p.ours[0].cmd(&["EXISTS", "d_h1", "d_z1"]), Reply::Int(2));
    eprintln!("{} commands, the same replies from both servers", p.steps);
    drop(ours);
    let _ = std::fs::remove_dir_all(&dir);
}

/// CONFIG side by side (issue #14): SET's errors for the keys that change at run time (Redis's
/// integer and memory syntax, bounds, unknown, immutable and duplicate keys, all or nothing),
/// GET after SET, the encoding thresholds and their aliases, the other subcommands' replies;
/// then what the settings do: `maxclients 1` refuses a second connection with Redis's error,
/// `timeout 1` closes an idle connection within about two seconds but neither a subscriber nor
/// a blocked client.
#[test]
fn config_set_and_get_match_redis_server_7_0() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let dir = std::path::PathBuf::from("/dev/shm")
        .join(format!("tiermem-kv-vs-redis-config-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = RemoveOnDrop(dir.clone());
    let ours = create_server(&dir, &["--heap-size", "64mb"]);
    let mut p = Pair {
        redis: vec![Conn::connect(redis.port).unwrap()],
        ours: vec![Conn::connect(ours.port).unwrap()],
        steps: 0,
    };
    for line in [
        // Syntax, bounds and unknown keys.
        "CONFIG SET maxclients abc",
        "CONFIG SET maxclients 0",
        "CONFIG SET maxclients -1",
        "CONFIG SET maxclients 1k",
        "CONFIG SET maxclients 99999999999999999999",
        "CONFIG SET timeout abc",
        "CONFIG SET timeout -1",
        "CONFIG SET timeout 2147483648",
        "CONFIG SET proto-max-bulk-len abc",
        "CONFIG SET proto-max-bulk-len -1",
        "CONFIG SET proto-max-bulk-len 0",
        "CONFIG SET proto-max-bulk-len 1k",
        "CONFIG SET proto-max-bulk-len 99999999999999999999",
        "CONFIG SET client-query-buffer-limit 1",
        "CONFIG SET client-query-buffer-limit 1.5mb",
        "CONFIG SET hash-max-listpack-entries x",
        "CONFIG SET hash-max-listpack-entries -1",
        "CONFIG SET hash-max-ziplist-entries 1k",
        "CONFIG SET hash-max-listpack-value -1",
        "CONFIG SET hash-max-listpack-value 18446744073709551615",
        "CONFIG SET zset-max-listpack-entries -5",
        "CONFIG SET zset-max-ziplist-value abc",
        "CONFIG SET set-max-intset-entries -1",
        "CONFIG SET list-max-listpack-size 2147483648",
        "CONFIG SET list-max-ziplist-size 1mb",
        "CONFIG SET list-compress-depth -1",
        "CONFIG SET protected-mode maybe",
        "CONFIG SET nosuchkey 1",
        "CONFIG SET NoSuch 1 maxclients 5",
        "CONFIG SET databases 16",
        "CONFIG SET unixsocket /tmp/x",
        "CONFIG SET maxclients 5 MAXCLIENTS 6",
        "CONFIG SET maxclients 5 maxclients",
        "CONFIG SET maxclients",
        "CONFIG SET MAXCLIENTS x",
        "CONFIG SET maxclients x databases 16",
        // All or nothing: the first pair is not applied when the second fails.
        "CONFIG SET maxclients 50 timeout x",
        "CONFIG GET maxclients",
        "CONFIG GET timeout",
        // Values set, then read back.
        "CONFIG SET maxclients 100 TIMEOUT 7",
        "CONFIG GET maxclients",
        "CONFIG GET timeout",
        "CONFIG SET proto-max-bulk-len 2mb",
        "CONFIG GET proto-max-bulk-len",
        "CONFIG SET client-query-buffer-limit 4mb",
        "CONFIG GET client-query-buffer-limit",
        "CONFIG GET hash-max-listpack-entries",
        "CONFIG GET hash-max-ziplist-value",
        "CONFIG GET zset-max-listpack-entries",
        "CONFIG GET set-max-intset-entries",
        "CONFIG GET list-max-ziplist-size",
        "CONFIG GET list-compress-depth",
        "CONFIG SET hash-max-ziplist-entries 100",
        "CONFIG GET hash-max-listpack-entries",
        "CONFIG GET hash-max-ziplist-entries",
        "CONFIG SET hash-max-listpack-value 1k zset-max-listpack-value 1kb",
        "CONFIG GET hash-max-ziplist-value",
        "CONFIG GET zset-max-ziplist-value",
        "CONFIG SET zset-max-listpack-entries 64 set-max-intset-entries 1000",
        "CONFIG GET zset-max-ziplist-entries",
        "CONFIG GET set-max-intset-entries",
        "CONFIG SET list-max-listpack-size -3 list-compress-depth 2",
        "CONFIG GET list-max-ziplist-size",
        "CONFIG GET list-compress-depth",
        "CONFIG SET protected-mode YES",
        "CONFIG GET protected-mode",
        // The other subcommands.
        "CONFIG HELP",
        "CONFIG HELP x",
        "CONFIG GET",
        "CONFIG FOO",
        "CONFIG RESETSTAT x",
        "CONFIG REWRITE x",
        "CONFIG REWRITE",
        "CONFIG RESETSTAT",
        "CONFIG SET timeout 0",
    ] {
        p.same(0, line);
    }
    // Values of several words: Redis's class groups of client-output-buffer-limit.
    for value in [
        "1mb 0",
        "foo 1mb 0 0",
        "normal x 0 0",
        "normal 1mb 0 -1",
        "normal 1mb 0 0",
        "normal 1mb 0 0 pubsub 32mb 8mb 60",
        "",
        "normal 0 0 0",
    ] {
        p.same_args(0, &["CONFIG", "SET", "client-output-buffer-limit", value]);
    }

    // maxclients 1: this connection is the one; a second gets Redis's error and is closed.
    p.same(0, "CONFIG SET maxclients 1");
    for port in [redis.port, ours.port] {
        let mut c = Conn::connect(port).unwrap();
        assert_eq!(
            c.read().unwrap(),
            Reply::Error("ERR max number of clients reached".into()),
            "port {port}"
        );
        assert!(c.read().is_err(), "closed after the error");
    }
    p.same(0, "CONFIG SET maxclients 10000");
    let info = p.ours[0].info("stats");
    assert!(info.contains("rejected_connections:1\r\n"), "{info}");

    // timeout 1: an idle connection is closed; a subscriber and a blocked client are not.
    p.same(0, "CONFIG SET timeout 1");
    for (port, within) in [(ours.port, 2.5), (redis.port, 3.5)] {
        let mut sub = Conn::connect(port).unwrap();
        sub.cmd(&["SUBSCRIBE", "ch"]);
        let mut blocked = Conn::connect(port).unwrap();
        blocked.send(&["BLPOP", "config-q", "0"]).unwrap();
        let mut idle = Conn::connect(port).unwrap();
        assert_eq!(idle.cmd(&["PING"]), Reply::Simple("PONG".into()));
        let t = Instant::now();
        assert!(
            idle.read().is_err(),
            "port {port}: the idle client is closed"
        );
        let secs = t.elapsed().as_secs_f64();
        assert!(
            (0.9..within).contains(&secs),
            "port {port}: closed after {secs:.2} s"
        );
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            sub.cmd(&["PING"]),
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"pong".to_vec())),
                Reply::Bulk(Some(Vec::new()))
            ])),
            "port {port}: the subscriber stays"
        );
        // The timeout is switched off before the blocked client is served: Redis does not
        // count blocked time as interaction, so a served client whose reply is not yet written
        // when its cron runs is closed as idle (seen with Redis 7.0 under a parallel suite).
        let mut c = Conn::connect(port).unwrap();
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "timeout", "0"]),
            Reply::Simple("OK".into())
        );
        assert_eq!(c.cmd(&["RPUSH", "config-q", "x"]), Reply::Int(1));
        assert_eq!(
            blocked
                .read()
                .unwrap_or_else(|e| panic!("port {port}: the blocked client: {e}")),
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"config-q".to_vec())),
                Reply::Bulk(Some(b"x".to_vec()))
            ])),
            "port {port}: the blocked client stays"
        );
    }
    let info = Conn::connect(ours.port).unwrap().info("stats");
    assert!(info.contains("tiermem_cut_idle_timeout:"), "{info}");
    eprintln!(
        "{} CONFIG commands, the same replies from both servers",
        p.steps
    );
    // A clean stop (a killed vnvm server leaves its shared-memory object behind).
    let mut ours = ours;
    let _ = Conn::connect(ours.port)
        .unwrap()
        .send(&["SHUTDOWN", "NOSAVE"]);
    assert!(
        ours.wait_exit(30).is_some_and(|st| st.success()),
        "{}",
        ours.log()
    );
    drop(ours);
    let _ = std::fs::remove_dir_all(&dir);
}
