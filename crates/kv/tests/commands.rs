//! The command layer through `Service::execute`: exact RESP2 replies (errors included), both
//! durability modes, restart, transactions too large for the log, a full heap.

mod common;

use common::{Eng, Fixture, Rng, ENGINES};
use tiermem_kv::commands::{Durability, KvService, Session};
use tiermem_kv::server::{Control, Service};

fn exec(svc: &KvService, s: &mut Session, reqs: &[&[&[u8]]]) -> (String, Control) {
    let reqs: Vec<Vec<&[u8]>> = reqs.iter().map(|r| r.to_vec()).collect();
    let mut out = Vec::new();
    let c = svc.execute(s, &reqs, &mut out, usize::MAX).control;
    (String::from_utf8_lossy(&out).into_owned(), c)
}

/// One command given as words.
fn cmd(svc: &KvService, s: &mut Session, line: &str) -> String {
    let words: Vec<&[u8]> = line.split(' ').map(|w| w.as_bytes()).collect();
    exec(svc, s, &[&words]).0
}

fn check(svc: &KvService, s: &mut Session, cases: &[(&str, &str)]) {
    for (line, want) in cases {
        assert_eq!(cmd(svc, s, line), *want, "{line}");
    }
}

fn service(f: &mut Fixture, d: Durability) -> KvService {
    KvService::new(f.take(), d).unwrap()
}

/// Runs `f` on a fresh service of each engine (commit durability) with one session.
fn on_each_engine(f: impl Fn(&KvService, &mut Session)) {
    for eng in ENGINES {
        let mut fx = Fixture::new(eng);
        let svc = service(&mut fx, Durability::Commit);
        let mut s = svc.open_session("test");
        f(&svc, &mut s);
    }
}

const WRONGTYPE: &str = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";

#[test]
fn replies() {
    for eng in ENGINES {
        for d in [Durability::Commit, Durability::Pipeline] {
            let mut f = Fixture::new(eng);
            let svc = service(&mut f, d);
            let mut s = svc.open_session("test");
            replies_on(&svc, &mut s);
        }
    }
}

fn replies_on(svc: &KvService, s: &mut Session) {
    check(svc, s, &[
        ("PING", "+PONG\r\n"),
        ("ping hello", "$5\r\nhello\r\n"),
        ("PING a b", "-ERR wrong number of arguments for 'ping' command\r\n"),
        ("ECHO hi", "$2\r\nhi\r\n"),
        ("NOSUCH a b", "-ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' \r\n"),
        ("NOSUCH", "-ERR unknown command 'NOSUCH', with args beginning with: \r\n"),
        ("GET", "-ERR wrong number of arguments for 'get' command\r\n"),
        ("SELECT 0", "+OK\r\n"),
        ("SELECT 16", "-ERR DB index is out of range\r\n"),
        ("SELECT x", "-ERR value is not an integer or out of range\r\n"),
        // Strings.
        ("GET k", "$-1\r\n"),
        ("SET k v1", "+OK\r\n"),
        ("GET k", "$2\r\nv1\r\n"),
        ("SET k v2 NX", "$-1\r\n"),
        ("SET k v2 XX GET", "$2\r\nv1\r\n"),
        ("SET nx v XX", "$-1\r\n"),
        ("SET k v NX XX", "-ERR syntax error\r\n"),
        ("SET k v EX 10", "+OK\r\n"),
        ("SET k v EX 0", "-ERR invalid expire time in 'set' command\r\n"),
        ("SET k v EX x", "-ERR value is not an integer or out of range\r\n"),
        ("SET k v KEEPTTL", "+OK\r\n"),
        ("SET k v2", "+OK\r\n"),
        ("STRLEN k", ":2\r\n"),
        ("APPEND k xyz", ":5\r\n"),
        ("GET k", "$5\r\nv2xyz\r\n"),
        ("SETNX k q", ":0\r\n"),
        ("SETNX k2 q", ":1\r\n"),
        ("GETSET k2 r", "$1\r\nq\r\n"),
        ("GETDEL k2", "$1\r\nr\r\n"),
        ("EXISTS k k2 k", ":2\r\n"),
        ("INCR n", ":1\r\n"),
        ("INCRBY n 41", ":42\r\n"),
        ("DECR n", ":41\r\n"),
        ("DECRBY n -9", ":50\r\n"),
        ("GET n", "$2\r\n50\r\n"),
        ("INCR k", "-ERR value is not an integer or out of range\r\n"),
        ("INCRBY n x", "-ERR value is not an integer or out of range\r\n"),
        ("SET big 9223372036854775807", "+OK\r\n"),
        ("INCR big", "-ERR increment or decrement would overflow\r\n"),
        ("MSET a 1 b 2", "+OK\r\n"),
        ("MSET a 1 b", "-ERR wrong number of arguments for 'mset' command\r\n"),
        ("MGET a b nope", "*3\r\n$1\r\n1\r\n$1\r\n2\r\n$-1\r\n"),
        ("TYPE a", "+string\r\n"),
        ("TYPE nope", "+none\r\n"),
        ("TTL a", ":-1\r\n"),
        ("TTL nope", ":-2\r\n"),
        ("OBJECT ENCODING a", "$3\r\nint\r\n"),
        ("DEL a b nope", ":2\r\n"),
        // Lists.
        ("RPUSH l a b c", ":3\r\n"),
        ("LPUSH l z", ":4\r\n"),
        ("LRANGE l 0 -1", "*4\r\n$1\r\nz\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"),
        ("LRANGE l -2 100", "*2\r\n$1\r\nb\r\n$1\r\nc\r\n"),
        ("LRANGE l 5 10", "*0\r\n"),
        ("LRANGE l x 1", "-ERR value is not an integer or out of range\r\n"),
        ("LLEN l", ":4\r\n"),
        ("LINDEX l -1", "$1\r\nc\r\n"),
        ("LPOP l", "$1\r\nz\r\n"),
        ("RPOP l 2", "*2\r\n$1\r\nc\r\n$1\r\nb\r\n"),
        ("LPOP l 0", "*0\r\n"),
        ("LPOP l -1", "-ERR value is out of range, must be positive\r\n"),
        ("LPOP l 5", "*1\r\n$1\r\na\r\n"),
        ("EXISTS l", ":0\r\n"),
        ("LPOP l", "$-1\r\n"),
        ("LPOP l 2", "*-1\r\n"),
        ("LPUSHX l a", ":0\r\n"),
        ("GET l", "$-1\r\n"),
        ("LPUSH k a", WRONGTYPE),
        ("LRANGE k 0 1", WRONGTYPE),
        // Sets.
        ("SADD s a b c a", ":3\r\n"),
        ("SADD s c d", ":1\r\n"),
        ("SCARD s", ":4\r\n"),
        ("SISMEMBER s b", ":1\r\n"),
        ("SISMEMBER s x", ":0\r\n"),
        ("SMISMEMBER s a x", "*2\r\n:1\r\n:0\r\n"),
        ("SREM s a x", ":1\r\n"),
        ("SMEMBERS s", "*3\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n"),
        ("TYPE s", "+set\r\n"),
        ("SPOP nope", "$-1\r\n"),
        ("SPOP nope 2", "*0\r\n"),
        ("SPOP s -1", "-ERR value is out of range, must be positive\r\n"),
        ("SREM s b c d", ":3\r\n"),
        ("EXISTS s", ":0\r\n"),
        ("SADD k a", WRONGTYPE),
        ("GET s", "$-1\r\n"),
        // Hashes.
        ("HSET h f1 v1 f2 v2", ":2\r\n"),
        ("HSET h f1 w1", ":0\r\n"),
        ("HSET h f1", "-ERR wrong number of arguments for 'hset' command\r\n"),
        ("HMSET h f3 v3", "+OK\r\n"),
        ("HGET h f1", "$2\r\nw1\r\n"),
        ("HGET h nope", "$-1\r\n"),
        ("HMGET h f2 nope f3", "*3\r\n$2\r\nv2\r\n$-1\r\n$2\r\nv3\r\n"),
        ("HMGET nope a", "*1\r\n$-1\r\n"),
        ("HGETALL h", "*6\r\n$2\r\nf1\r\n$2\r\nw1\r\n$2\r\nf2\r\n$2\r\nv2\r\n$2\r\nf3\r\n$2\r\nv3\r\n"),
        ("HKEYS h", "*3\r\n$2\r\nf1\r\n$2\r\nf2\r\n$2\r\nf3\r\n"),
        ("HLEN h", ":3\r\n"),
        ("HEXISTS h f2", ":1\r\n"),
        ("HSETNX h f2 x", ":0\r\n"),
        ("HINCRBY h n 5", ":5\r\n"),
        ("HINCRBY h f1 1", "-ERR hash value is not an integer\r\n"),
        ("HDEL h f1 f2 nope", ":2\r\n"),
        ("HDEL h f3 n", ":2\r\n"),
        ("EXISTS h", ":0\r\n"),
        ("HGETALL h", "*0\r\n"),
        ("HGET k f", WRONGTYPE),
        ("OBJECT ENCODING k", "$6\r\nembstr\r\n"),
        // Sorted sets.
        ("ZADD z 1 a 2 b 3 c", ":3\r\n"),
        ("ZADD z 1.5 b", ":0\r\n"),
        ("ZADD z CH 1.5 b 4 d", ":1\r\n"),
        ("ZADD z CH 0 b 5 e", ":2\r\n"),
        ("ZADD z NX XX 1 a", "-ERR XX and NX options at the same time are not compatible\r\n"),
        ("ZADD z GT LT 1 a", "-ERR GT, LT, and/or NX options at the same time are not compatible\r\n"),
        ("ZADD z x a", "-ERR value is not a valid float\r\n"),
        ("ZADD z 1", "-ERR wrong number of arguments for 'zadd' command\r\n"),
        ("ZADD z NX 1", "-ERR syntax error\r\n"),
        ("ZADD z INCR 1 a 2 b", "-ERR INCR option supports a single increment-element pair\r\n"),
        ("ZADD z INCR 2.5 a", "$3\r\n3.5\r\n"),
        ("ZADD z XX INCR 1 nope", "$-1\r\n"),
        ("ZADD z GT 1 a", ":0\r\n"),
        ("ZSCORE z a", "$3\r\n3.5\r\n"),
        ("ZSCORE z nope", "$-1\r\n"),
        ("ZINCRBY z -0.5 a", "$1\r\n3\r\n"),
        ("ZCARD z", ":5\r\n"),
        ("ZRANGE z 0 -1", "*5\r\n$1\r\nb\r\n$1\r\na\r\n$1\r\nc\r\n$1\r\nd\r\n$1\r\ne\r\n"),
        ("ZRANGE z 0 1 WITHSCORES", "*4\r\n$1\r\nb\r\n$1\r\n0\r\n$1\r\na\r\n$1\r\n3\r\n"),
        ("ZREVRANGE z 0 1", "*2\r\n$1\r\ne\r\n$1\r\nd\r\n"),
        ("ZRANGE z 0 0 REV", "*1\r\n$1\r\ne\r\n"),
        ("ZRANGEBYSCORE z (0 3", "*2\r\n$1\r\na\r\n$1\r\nc\r\n"),
        ("ZRANGEBYSCORE z -inf +inf LIMIT 1 2", "*2\r\n$1\r\na\r\n$1\r\nc\r\n"),
        ("ZRANGEBYSCORE z 4 inf WITHSCORES", "*4\r\n$1\r\nd\r\n$1\r\n4\r\n$1\r\ne\r\n$1\r\n5\r\n"),
        ("ZRANGEBYSCORE z x 1", "-ERR min or max is not a float\r\n"),
        ("ZREVRANGEBYSCORE z 4 (0", "*3\r\n$1\r\nd\r\n$1\r\nc\r\n$1\r\na\r\n"),
        ("ZRANGE z 5 +inf BYSCORE", "*1\r\n$1\r\ne\r\n"),
        ("ZRANGE z 0 1 LIMIT 0 1", "-ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX\r\n"),
        ("ZCOUNT z 1 4", ":3\r\n"),
        ("ZREM z a nope", ":1\r\n"),
        ("ZPOPMIN z", "*2\r\n$1\r\nb\r\n$1\r\n0\r\n"),
        ("ZPOPMAX z 2", "*4\r\n$1\r\ne\r\n$1\r\n5\r\n$1\r\nd\r\n$1\r\n4\r\n"),
        ("ZPOPMIN z -1", "-ERR value is out of range, must be positive\r\n"),
        ("ZPOPMIN z 10", "*2\r\n$1\r\nc\r\n$1\r\n3\r\n"),
        ("EXISTS z", ":0\r\n"),
        ("ZPOPMIN z", "*0\r\n"),
        ("ZRANGE z 0 -1", "*0\r\n"),
        ("ZADD k 1 a", WRONGTYPE),
        ("ZADD inf -inf a", ":1\r\n"),
        ("ZSCORE inf a", "$4\r\n-inf\r\n"),
        ("ZINCRBY inf +inf a", "-ERR resulting score is not a number (NaN)\r\n"),
        // Keyspace.
        ("DBSIZE", ":4\r\n"),
        ("KEYS n*", "*1\r\n$1\r\nn\r\n"),
        ("EXPIRE k 10", ":1\r\n"),
        ("FLUSHALL BAD", "-ERR syntax error\r\n"),
        ("FLUSHALL", "+OK\r\n"),
        ("DBSIZE", ":0\r\n"),
        ("GET k", "$-1\r\n"),
        // Server.
        ("CONFIG GET save", "*2\r\n$4\r\nsave\r\n$0\r\n\r\n"),
        ("CONFIG GET appendonly", "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"),
        ("CONFIG GET databases", "*2\r\n$9\r\ndatabases\r\n$2\r\n16\r\n"),
        ("CONFIG GET nothing", "*0\r\n"),
        ("COMMAND DOCS", "*0\r\n"),
        ("CLIENT SETNAME me", "+OK\r\n"),
        ("CLIENT GETNAME", "$2\r\nme\r\n"),
        ("HELLO 3", "-NOPROTO sorry, this protocol version is not supported\r\n"),
        ("AUTH x", "-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n"),
        ("WAIT 0 0", ":0\r\n"),
    ]);
    let hello = cmd(svc, s, "HELLO 2");
    assert!(
        hello.starts_with("*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n"),
        "{hello}"
    );
    let count = cmd(svc, s, "COMMAND COUNT");
    assert!(count.starts_with(':'));
    let all = cmd(svc, s, "COMMAND");
    assert!(
        all.starts_with('*')
            && all.contains("$3\r\nget\r\n:2\r\n*1\r\n+readonly\r\n:1\r\n:1\r\n:1\r\n")
    );
    let id = cmd(svc, s, "CLIENT ID");
    assert!(id.starts_with(':'));
    // SCAN visits every key.
    for i in 0..100 {
        cmd(svc, s, &format!("SET scan:{i} x"));
    }
    let mut seen = std::collections::HashSet::new();
    let mut cursor = "0".to_string();
    loop {
        let r = cmd(svc, s, &format!("SCAN {cursor} MATCH scan:* COUNT 7"));
        let lines: Vec<&str> = r.split("\r\n").collect();
        cursor = lines[2].to_string();
        for l in lines[4..].iter().filter(|l| l.starts_with("scan:")) {
            seen.insert(l.to_string());
        }
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 100);
    let info = cmd(svc, s, "INFO");
    for field in [
        "# Server\r\n",
        "redis_version:",
        "tiermem_engine:",
        "# Memory\r\n",
        "used_memory:",
        "maxmemory:",
        "tiermem_heap_bytes:",
        "# Persistence\r\n",
        "aof_enabled:0\r\n",
        "tiermem_durability:",
        "# Stats\r\n",
        "keyspace_hits:",
        "# Keyspace\r\n",
        "db0:keys=100,expires=0,avg_ttl=0\r\n",
    ] {
        assert!(info.contains(field), "INFO lacks {field:?}:\n{info}");
    }
    let mem = cmd(svc, s, "INFO memory");
    assert!(mem.contains("# Memory") && !mem.contains("# Server"));
    assert_eq!(
        exec(svc, s, &[&[b"QUIT"]]),
        ("+OK\r\n".into(), Control::Close)
    );
}

/// A pipeline gives the same replies in both durability modes, and reads in a group see the
/// group's writes.
/// SINTER, SUNION, SDIFF, their STORE forms, SINTERCARD, SMOVE and SRANDMEMBER: replies as
/// redis-server 7.0 gave them for the same commands (results of one member, so that no order
/// is involved; larger results are checked as sets).
#[test]
fn set_algebra_replies() {
    on_each_engine(|svc, s| {
        check(
            svc,
            s,
            &[
                ("SADD s1 a b c", ":3\r\n"),
                ("SADD s2 b c d", ":3\r\n"),
                ("SADD s3 c", ":1\r\n"),
                ("SET str x", "+OK\r\n"),
                ("SINTER s1 s2 s3", "*1\r\n$1\r\nc\r\n"),
                ("SINTER s1 nokey", "*0\r\n"),
                ("SINTER s1 str", WRONGTYPE),
                ("SINTER nokey str", WRONGTYPE),
                (
                    "SINTER",
                    "-ERR wrong number of arguments for 'sinter' command\r\n",
                ),
                ("SUNION s3 nokey", "*1\r\n$1\r\nc\r\n"),
                ("SDIFF s1 s2", "*1\r\n$1\r\na\r\n"),
                ("SDIFF nokey s1", "*0\r\n"),
                ("SDIFF s1 str", WRONGTYPE),
                ("SINTERCARD 2 s1 s2", ":2\r\n"),
                ("SINTERCARD 2 s1 s2 LIMIT 1", ":1\r\n"),
                ("SINTERCARD 2 s1 s2 limit 0", ":2\r\n"),
                ("SINTERCARD 1 str", WRONGTYPE),
                (
                    "SINTERCARD 2 s1 s2 LIMIT x",
                    "-ERR LIMIT can't be negative\r\n",
                ),
                (
                    "SINTERCARD 2 s1 s2 LIMIT -1",
                    "-ERR LIMIT can't be negative\r\n",
                ),
                ("SINTERCARD 2 s1 s2 FOO 3", "-ERR syntax error\r\n"),
                (
                    "SINTERCARD x s1",
                    "-ERR numkeys should be greater than 0\r\n",
                ),
                (
                    "SINTERCARD 0 s1",
                    "-ERR numkeys should be greater than 0\r\n",
                ),
                (
                    "SINTERCARD 3 s1 s2",
                    "-ERR Number of keys can't be greater than number of args\r\n",
                ),
                ("SINTERSTORE dst s1 s2 s3", ":1\r\n"),
                ("TYPE dst", "+set\r\n"),
                ("SMEMBERS dst", "*1\r\n$1\r\nc\r\n"),
                ("SINTERSTORE str s1 s3", ":1\r\n"),
                ("TYPE str", "+set\r\n"),
                ("SDIFFSTORE dst s1 s2 s3", ":1\r\n"),
                ("SMEMBERS dst", "*1\r\n$1\r\na\r\n"),
                ("SUNIONSTORE dst s3 nokey", ":1\r\n"),
                ("SINTERSTORE dst s1 nokey", ":0\r\n"),
                ("EXISTS dst", ":0\r\n"),
                ("SDIFFSTORE dst s1 str2", ":3\r\n"),
                ("SMOVE s1 s3 a", ":1\r\n"),
                ("SMOVE s1 s3 zz", ":0\r\n"),
                ("SMOVE nokey str a", ":0\r\n"),
                ("SET str2 y", "+OK\r\n"),
                ("SMOVE s1 str2 b", WRONGTYPE),
                ("SMOVE str2 s1 b", WRONGTYPE),
                ("SMOVE s3 s3 a", ":1\r\n"),
                ("SMOVE s3 s3 q", ":0\r\n"),
                ("SMOVE s1 newset b", ":1\r\n"),
                ("SMEMBERS newset", "*1\r\n$1\r\nb\r\n"),
                ("SMOVE s1 newset c", ":1\r\n"),
                ("EXISTS s1", ":0\r\n"),
                ("SRANDMEMBER nokey", "$-1\r\n"),
                ("SRANDMEMBER nokey 3", "*0\r\n"),
                ("SRANDMEMBER nokey -3", "*0\r\n"),
                ("SRANDMEMBER s3 0", "*0\r\n"),
                ("SRANDMEMBER str2", WRONGTYPE),
                (
                    "SRANDMEMBER s3 x",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("SRANDMEMBER s3 1 2", "-ERR syntax error\r\n"),
                ("SADD one only", ":1\r\n"),
                ("SRANDMEMBER one", "$4\r\nonly\r\n"),
                ("SRANDMEMBER one 5", "*1\r\n$4\r\nonly\r\n"),
                (
                    "SRANDMEMBER one -3",
                    "*3\r\n$4\r\nonly\r\n$4\r\nonly\r\n$4\r\nonly\r\n",
                ),
            ],
        );
        // Larger results, compared as sets: 0..300 and 200..500 (hash-table sets).
        let a: Vec<String> = (0..300).map(|i| i.to_string()).collect();
        let b: Vec<String> = (200..500).map(|i| i.to_string()).collect();
        cmd(svc, s, &format!("SADD big1 {}", a.join(" ")));
        cmd(svc, s, &format!("SADD big2 {}", b.join(" ")));
        let members = |reply: String| -> std::collections::BTreeSet<u32> {
            reply
                .split("\r\n")
                .filter(|l| !l.is_empty() && !l.starts_with('*') && !l.starts_with('$'))
                .map(|l| l.parse().unwrap())
                .collect()
        };
        assert_eq!(
            members(cmd(svc, s, "SINTER big1 big2")),
            (200..300).collect()
        );
        assert_eq!(members(cmd(svc, s, "SUNION big1 big2")), (0..500).collect());
        assert_eq!(members(cmd(svc, s, "SDIFF big1 big2")), (0..200).collect());
        assert_eq!(cmd(svc, s, "SDIFFSTORE big3 big2 big1"), ":200\r\n");
        assert_eq!(members(cmd(svc, s, "SMEMBERS big3")), (300..500).collect());
        assert_eq!(cmd(svc, s, "SINTERCARD 2 big1 big2 LIMIT 7"), ":7\r\n");
        // SRANDMEMBER with a positive count: distinct members of the set.
        let r = members(cmd(svc, s, "SRANDMEMBER big1 50"));
        assert_eq!(r.len(), 50);
        assert!(r.iter().all(|&x| x < 300));
        assert_eq!(members(cmd(svc, s, "SRANDMEMBER big1 1000")).len(), 300);
    });
}

/// RENAME, RENAMENX, TOUCH, RANDOMKEY: replies as redis-server 7.0 gave them; a renamed
/// value of every type and encoding keeps its contents, and the old key is gone.
#[test]
fn rename_and_generic_replies() {
    on_each_engine(|svc, s| {
        let long = "v".repeat(3000);
        check(
            svc,
            s,
            &[
                ("RANDOMKEY", "$-1\r\n"),
                ("RENAME nokey x", "-ERR no such key\r\n"),
                ("RENAME nokey nokey", "-ERR no such key\r\n"),
                ("RENAMENX nokey x", "-ERR no such key\r\n"),
                ("SET a 1", "+OK\r\n"),
                ("RANDOMKEY", "$1\r\na\r\n"),
                ("RENAME a a", "+OK\r\n"),
                ("RENAMENX a a", ":0\r\n"),
                ("TOUCH a b a", ":2\r\n"),
                ("SADD s x", ":1\r\n"),
                ("RENAMENX a s", ":0\r\n"),
                ("RENAME a s", "+OK\r\n"),
                ("TYPE s", "+string\r\n"),
                ("GET s", "$1\r\n1\r\n"),
                ("EXISTS a", ":0\r\n"),
                ("RENAMENX s t", ":1\r\n"),
                ("GET t", "$1\r\n1\r\n"),
                (
                    "RENAME t",
                    "-ERR wrong number of arguments for 'rename' command\r\n",
                ),
                (&format!("SET big {long}"), "+OK\r\n"),
                ("RENAME big big2", "+OK\r\n"),
                ("STRLEN big2", ":3000\r\n"),
                ("SADD set m1 m2", ":2\r\n"),
                ("HSET h f1 v1 f2 v2", ":2\r\n"),
                ("RPUSH l e1 e2 e3", ":3\r\n"),
                ("ZADD z 1 one 2 two", ":2\r\n"),
                ("RENAME set set2", "+OK\r\n"),
                ("RENAME h h2", "+OK\r\n"),
                ("RENAME l l2", "+OK\r\n"),
                ("RENAME z z2", "+OK\r\n"),
                ("SISMEMBER set2 m2", ":1\r\n"),
                ("SCARD set2", ":2\r\n"),
                ("HGET h2 f2", "$2\r\nv2\r\n"),
                (
                    "LRANGE l2 0 -1",
                    "*3\r\n$2\r\ne1\r\n$2\r\ne2\r\n$2\r\ne3\r\n",
                ),
                ("ZSCORE z2 two", "$1\r\n2\r\n"),
                ("EXISTS set h l z", ":0\r\n"),
                // Onto a key of another type: replaced.
                ("RENAME set2 h2", "+OK\r\n"),
                ("TYPE h2", "+set\r\n"),
                ("DBSIZE", ":5\r\n"),
            ],
        );
        // Many keys in few buckets: renames among them keep every key reachable.
        for i in 0..200 {
            cmd(svc, s, &format!("SET k{i} {i}"));
        }
        for i in 0..200 {
            assert_eq!(cmd(svc, s, &format!("RENAME k{i} r{i}")), "+OK\r\n");
        }
        for i in 0..200 {
            assert_eq!(
                cmd(svc, s, &format!("GET r{i}")),
                format!("${}\r\n{i}\r\n", i.to_string().len())
            );
        }
        assert_eq!(cmd(svc, s, "DBSIZE"), ":205\r\n");
    });
}

/// GETRANGE/SUBSTR, SETRANGE, HSTRLEN, HRANDFIELD, LPOS, LMOVE, RPOPLPUSH, LTRIM: replies as
/// redis-server 7.0 gave them for the same commands.
#[test]
fn string_hash_and_list_extras() {
    on_each_engine(|svc, s| {
        check(svc, s, &[
            ("GETRANGE nokey 0 5", "$0\r\n\r\n"),
            ("SET s Hello", "+OK\r\n"),
            ("GETRANGE s 0 -1", "$5\r\nHello\r\n"),
            ("GETRANGE s -3 -1", "$3\r\nllo\r\n"),
            ("GETRANGE s -1 -3", "$0\r\n\r\n"),
            ("GETRANGE s 10 20", "$0\r\n\r\n"),
            ("GETRANGE s 3 1", "$0\r\n\r\n"),
            ("GETRANGE s -100 2", "$3\r\nHel\r\n"),
            ("GETRANGE s x 1", "-ERR value is not an integer or out of range\r\n"),
            ("SUBSTR s 1 2", "$2\r\nel\r\n"),
            ("SETRANGE nk 3 ab", ":5\r\n"),
            ("GET nk", "$5\r\n\0\0\0ab\r\n"),
            ("SETRANGE s -1 x", "-ERR offset is out of range\r\n"),
            ("SETRANGE s 7 XY", ":9\r\n"),
            ("GET s", "$9\r\nHello\0\0XY\r\n"),
            ("SETRANGE s 536870912 x", "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n"),
            ("SETRANGE s x y", "-ERR value is not an integer or out of range\r\n"),
            ("HSET h f1 hello f2 w", ":2\r\n"),
            ("HSTRLEN h f1", ":5\r\n"),
            ("HSTRLEN h nof", ":0\r\n"),
            ("HSTRLEN nokey f", ":0\r\n"),
            ("HSTRLEN s f", WRONGTYPE),
            ("HRANDFIELD nokey", "$-1\r\n"),
            ("HRANDFIELD nokey 2", "*0\r\n"),
            ("HRANDFIELD nokey 2 WITHVALUES", "*0\r\n"),
            ("HRANDFIELD h 0", "*0\r\n"),
            ("HRANDFIELD h 1 foo", "-ERR syntax error\r\n"),
            ("HRANDFIELD h x", "-ERR value is not an integer or out of range\r\n"),
            ("HRANDFIELD s", WRONGTYPE),
            ("HSET h1 only v", ":1\r\n"),
            ("HRANDFIELD h1", "$4\r\nonly\r\n"),
            ("HRANDFIELD h1 -2 WITHVALUES", "*4\r\n$4\r\nonly\r\n$1\r\nv\r\n$4\r\nonly\r\n$1\r\nv\r\n"),
            ("HRANDFIELD h1 5 withvalues", "*2\r\n$4\r\nonly\r\n$1\r\nv\r\n"),
            ("RPUSH l a b c a", ":4\r\n"),
            ("LPOS l a", ":0\r\n"),
            ("LPOS l a RANK 2", ":3\r\n"),
            ("LPOS l a RANK -1", ":3\r\n"),
            ("LPOS l a COUNT 0", "*2\r\n:0\r\n:3\r\n"),
            ("LPOS l a COUNT 2 MAXLEN 3", "*1\r\n:0\r\n"),
            ("LPOS l z", "$-1\r\n"),
            ("LPOS l z COUNT 1", "*0\r\n"),
            ("LPOS l a RANK 0", "-ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list\r\n"),
            ("LPOS l a COUNT -1", "-ERR COUNT can't be negative\r\n"),
            ("LPOS l a MAXLEN -1", "-ERR MAXLEN can't be negative\r\n"),
            ("LPOS nokey a", "$-1\r\n"),
            ("LPOS nokey a COUNT 1", "*0\r\n"),
            ("LPOS l a FOO 1", "-ERR syntax error\r\n"),
            ("LPOS s a", WRONGTYPE),
            ("LMOVE l l2 LEFT RIGHT", "$1\r\na\r\n"),
            ("LMOVE l l2 MIDDLE RIGHT", "-ERR syntax error\r\n"),
            ("LRANGE l2 0 -1", "*1\r\n$1\r\na\r\n"),
            ("RPOPLPUSH l l2", "$1\r\na\r\n"),
            ("LRANGE l2 0 -1", "*2\r\n$1\r\na\r\n$1\r\na\r\n"),
            ("LMOVE nokey l2 LEFT LEFT", "$-1\r\n"),
            ("LMOVE l s LEFT LEFT", WRONGTYPE),
            ("LMOVE l2 l2 LEFT RIGHT", "$1\r\na\r\n"),
            ("LLEN l2", ":2\r\n"),
            ("LTRIM l 0 0", "+OK\r\n"),
            ("LRANGE l 0 -1", "*1\r\n$1\r\nb\r\n"),
            ("LTRIM l 5 10", "+OK\r\n"),
            ("EXISTS l", ":0\r\n"),
            ("LTRIM nokey 0 1", "+OK\r\n"),
            ("LTRIM s 0 1", WRONGTYPE),
            ("LTRIM l2 x 1", "-ERR value is not an integer or out of range\r\n"),
            ("RPUSH one x", ":1\r\n"),
            ("RPOPLPUSH one other", "$1\r\nx\r\n"),
            ("EXISTS one", ":0\r\n"),
            ("LRANGE other 0 -1", "*1\r\n$1\r\nx\r\n"),
            // Floats in Redis' long double, printed as Redis prints them.
            ("INCRBYFLOAT f 0.1", "$3\r\n0.1\r\n"),
            ("INCRBYFLOAT f 0.2", "$3\r\n0.3\r\n"),
            ("INCRBYFLOAT f x", "-ERR value is not a valid float\r\n"),
            ("INCRBYFLOAT s 1", "-ERR value is not a valid float\r\n"),
            ("INCRBYFLOAT f inf", "-ERR increment would produce NaN or Infinity\r\n"),
            ("INCRBYFLOAT g 5.0e3", "$4\r\n5000\r\n"),
            ("INCRBYFLOAT g 1.5e-5", "$22\r\n5000.00001499999999988\r\n"),
            ("INCRBYFLOAT h 1", WRONGTYPE),
            ("INCRBYFLOAT n -1", "$2\r\n-1\r\n"),
            ("INCRBYFLOAT n 1", "$1\r\n0\r\n"),
            ("HINCRBYFLOAT hf a 0.1", "$3\r\n0.1\r\n"),
            ("HINCRBYFLOAT hf a 0.2", "$3\r\n0.3\r\n"),
            ("HINCRBYFLOAT hf a x", "-ERR value is not a valid float\r\n"),
            ("HINCRBYFLOAT hf a inf", "-ERR value is NaN or Infinity\r\n"),
            ("HSET hf b notf", ":1\r\n"),
            ("HINCRBYFLOAT hf b 1", "-ERR hash value is not a float\r\n"),
            ("HINCRBYFLOAT s a 1", WRONGTYPE),
            ("HINCRBYFLOAT hf c 10.50", "$4\r\n10.5\r\n"),
            ("HSET hf d 5", ":1\r\n"),
            ("HINCRBYFLOAT hf d 1.5", "$3\r\n6.5\r\n"),
            ("HGET hf d", "$3\r\n6.5\r\n"),
        ]);
        // LTRIM of a long list keeps exactly the range.
        let items: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
        cmd(svc, s, &format!("RPUSH long {}", items.join(" ")));
        assert_eq!(cmd(svc, s, "LTRIM long 100 -101"), "+OK\r\n");
        assert_eq!(cmd(svc, s, "LLEN long"), ":800\r\n");
        assert_eq!(cmd(svc, s, "LINDEX long 0"), "$3\r\n100\r\n");
        assert_eq!(cmd(svc, s, "LINDEX long -1"), "$3\r\n899\r\n");
        assert_eq!(cmd(svc, s, "LPOS long 500"), ":400\r\n");
    });
}

/// LSET, LINSERT, LREM: replies as redis-server 7.0 gave them, and a long random sequence of
/// them (elements up to 6 KiB, so nodes split and empty) against a model of the list.
#[test]
fn list_edits() {
    on_each_engine(|svc, s| {
        check(svc, s, &[
            ("LSET nokey 0 x", "-ERR no such key\r\n"),
            ("RPUSH l a b c b a", ":5\r\n"),
            ("LSET l 0 A", "+OK\r\n"),
            ("LSET l -1 Z", "+OK\r\n"),
            ("LSET l 5 x", "-ERR index out of range\r\n"),
            ("LSET l x y", "-ERR value is not an integer or out of range\r\n"),
            ("SET s x", "+OK\r\n"),
            ("LSET s 0 x", WRONGTYPE),
            ("LINSERT l BEFORE b B1", ":6\r\n"),
            ("LINSERT l AFTER b B2", ":7\r\n"),
            ("LINSERT l MIDDLE b x", "-ERR syntax error\r\n"),
            ("LINSERT l BEFORE nope x", ":-1\r\n"),
            ("LINSERT nokey BEFORE a x", ":0\r\n"),
            ("LINSERT s BEFORE a x", WRONGTYPE),
            ("LRANGE l 0 -1", "*7\r\n$1\r\nA\r\n$2\r\nB1\r\n$1\r\nb\r\n$2\r\nB2\r\n$1\r\nc\r\n$1\r\nb\r\n$1\r\nZ\r\n"),
            ("LREM l 0 b", ":2\r\n"),
            ("LREM l -1 A", ":1\r\n"),
            ("LREM l 1 nope", ":0\r\n"),
            ("LREM nokey 1 a", ":0\r\n"),
            ("LREM s 1 a", WRONGTYPE),
            ("LREM l x a", "-ERR value is not an integer or out of range\r\n"),
            ("LRANGE l 0 -1", "*4\r\n$2\r\nB1\r\n$2\r\nB2\r\n$1\r\nc\r\n$1\r\nZ\r\n"),
            ("LREM l 0 B1", ":1\r\n"),
            ("LREM l 0 B2", ":1\r\n"),
            ("LREM l 0 c", ":1\r\n"),
            ("LREM l 0 Z", ":1\r\n"),
            ("EXISTS l", ":0\r\n"),
        ]);
        let mut model: Vec<String> = Vec::new();
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let elem = |r: u64, len: u64| format!("{}{}", r % 7, "e".repeat(len as usize));
        for _ in 0..300 {
            cmd(svc, s, &format!("RPUSH m {}", elem(rnd(7), rnd(40))));
        }
        model.extend((0..300).map(|i| {
            let v = cmd(svc, s, &format!("LINDEX m {i}"));
            v.split("\r\n").nth(1).unwrap().to_string()
        }));
        for step in 0..600 {
            let len = model.len() as u64;
            match rnd(4) {
                0 if len > 0 => {
                    let i = rnd(len) as i64 - if rnd(2) == 0 { len as i64 } else { 0 };
                    let big = if rnd(10) == 0 {
                        5000 + rnd(1200)
                    } else {
                        rnd(60)
                    };
                    let v = elem(rnd(7), big);
                    assert_eq!(cmd(svc, s, &format!("LSET m {i} {v}")), "+OK\r\n");
                    let k = if i < 0 {
                        (i + len as i64) as usize
                    } else {
                        i as usize
                    };
                    model[k] = v;
                }
                1 if len > 0 => {
                    let pivot = model[rnd(len) as usize].clone();
                    let before = rnd(2) == 0;
                    let big = if rnd(10) == 0 {
                        4100 + rnd(2000)
                    } else {
                        rnd(60)
                    };
                    let v = elem(rnd(7), big);
                    let k = model.iter().position(|e| *e == pivot).unwrap();
                    model.insert(if before { k } else { k + 1 }, v.clone());
                    let want = format!(":{}\r\n", model.len());
                    let side = if before { "BEFORE" } else { "AFTER" };
                    assert_eq!(
                        cmd(svc, s, &format!("LINSERT m {side} {pivot} {v}")),
                        want,
                        "step {step}"
                    );
                }
                2 if len > 0 => {
                    let target = model[rnd(len) as usize].clone();
                    let count = rnd(5) as i64 - 2;
                    let quota = if count == 0 {
                        usize::MAX
                    } else {
                        count.unsigned_abs() as usize
                    };
                    let mut removed = 0;
                    if count >= 0 {
                        model.retain(|e| {
                            if removed < quota && *e == target {
                                removed += 1;
                                false
                            } else {
                                true
                            }
                        });
                    } else {
                        let mut keep = vec![true; model.len()];
                        for k in (0..model.len()).rev() {
                            if removed < quota && model[k] == target {
                                keep[k] = false;
                                removed += 1;
                            }
                        }
                        let mut it = keep.iter();
                        model.retain(|_| *it.next().unwrap());
                    }
                    assert_eq!(
                        cmd(svc, s, &format!("LREM m {count} {target}")),
                        format!(":{removed}\r\n"),
                        "step {step}"
                    );
                }
                _ => {
                    let v = elem(rnd(7), rnd(60));
                    cmd(svc, s, &format!("LPUSH m {v}"));
                    model.insert(0, v);
                }
            }
            if step % 50 == 49 || model.is_empty() {
                let got = cmd(svc, s, "LRANGE m 0 -1");
                let got: Vec<&str> = got
                    .split("\r\n")
                    .skip(2)
                    .step_by(2)
                    .filter(|l| !l.is_empty())
                    .collect();
                assert_eq!(got.len(), model.len(), "step {step}");
                assert!(got.iter().zip(&model).all(|(a, b)| a == b), "step {step}");
                assert_eq!(cmd(svc, s, "LLEN m"), format!(":{}\r\n", model.len()));
            }
        }
    });
}

/// COPY: replies as redis-server 7.0 gave them (one database here: DB 0 only), and a copy of
/// every type is a value of its own (changing it leaves the source as it was).
#[test]
fn copy_replies() {
    on_each_engine(|svc, s| {
        check(
            svc,
            s,
            &[
                (
                    "COPY a a",
                    "-ERR source and destination objects are the same\r\n",
                ),
                ("COPY nokey b", ":0\r\n"),
                ("SET a 1", "+OK\r\n"),
                ("COPY a b", ":1\r\n"),
                ("COPY a b", ":0\r\n"),
                ("COPY a b REPLACE", ":1\r\n"),
                ("COPY a c DB 0", ":1\r\n"),
                ("COPY a d DB 16", "-ERR DB index is out of range\r\n"),
                (
                    "COPY a c DB x",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("COPY a c FOO", "-ERR syntax error\r\n"),
                (
                    "COPY a a DB 0",
                    "-ERR source and destination objects are the same\r\n",
                ),
                ("COPY a c REPLACE REPLACE", ":1\r\n"),
                ("SADD st m1 m2", ":2\r\n"),
                ("HSET h f1 v1 f2 v2", ":2\r\n"),
                ("RPUSH l e1 e2 e3", ":3\r\n"),
                ("ZADD z 1 one 2.5 two", ":2\r\n"),
                ("COPY st st2", ":1\r\n"),
                ("COPY h h2", ":1\r\n"),
                ("COPY l l2", ":1\r\n"),
                ("COPY z z2", ":1\r\n"),
                ("COPY z a REPLACE", ":1\r\n"),
                ("TYPE a", "+zset\r\n"),
                ("SREM st2 m1", ":1\r\n"),
                ("SCARD st", ":2\r\n"),
                ("SCARD st2", ":1\r\n"),
                ("HDEL h2 f1", ":1\r\n"),
                ("HGET h f1", "$2\r\nv1\r\n"),
                ("HGET h2 f2", "$2\r\nv2\r\n"),
                ("RPOP l2", "$2\r\ne3\r\n"),
                (
                    "LRANGE l 0 -1",
                    "*3\r\n$2\r\ne1\r\n$2\r\ne2\r\n$2\r\ne3\r\n",
                ),
                ("LRANGE l2 0 -1", "*2\r\n$2\r\ne1\r\n$2\r\ne2\r\n"),
                ("ZINCRBY z2 1 one", "$1\r\n2\r\n"),
                ("ZSCORE z one", "$1\r\n1\r\n"),
                ("ZSCORE z2 two", "$3\r\n2.5\r\n"),
                (
                    "ZRANGE a 0 -1 WITHSCORES",
                    "*4\r\n$3\r\none\r\n$1\r\n1\r\n$3\r\ntwo\r\n$3\r\n2.5\r\n",
                ),
            ],
        );
        // A large set (hash-table encoded) and a long list copy whole.
        let m: Vec<String> = (0..500).map(|i| format!("m{i}")).collect();
        cmd(svc, s, &format!("SADD bigs {}", m.join(" ")));
        cmd(svc, s, &format!("RPUSH bigl {}", m.join(" ")));
        assert_eq!(cmd(svc, s, "COPY bigs bigs2"), ":1\r\n");
        assert_eq!(cmd(svc, s, "COPY bigl bigl2"), ":1\r\n");
        assert_eq!(cmd(svc, s, "SCARD bigs2"), ":500\r\n");
        assert_eq!(cmd(svc, s, "SINTERCARD 2 bigs bigs2"), ":500\r\n");
        assert_eq!(
            cmd(svc, s, "LRANGE bigl2 0 -1"),
            cmd(svc, s, "LRANGE bigl 0 -1")
        );
    });
}

/// SETBIT, GETBIT, BITCOUNT (BYTE/BIT ranges), BITOP: replies as redis-server 7.0 gave them.
#[test]
fn bitmap_replies() {
    on_each_engine(|svc, s| {
        check(
            svc,
            s,
            &[
                ("GETBIT nokey 5", ":0\r\n"),
                ("SETBIT b 7 1", ":0\r\n"),
                ("GET b", "$1\r\n\u{1}\r\n"),
                ("SETBIT b 7 0", ":1\r\n"),
                ("SETBIT b 100 1", ":0\r\n"),
                ("STRLEN b", ":13\r\n"),
                ("GETBIT b 100", ":1\r\n"),
                ("GETBIT b 1000", ":0\r\n"),
                (
                    "SETBIT b -1 1",
                    "-ERR bit offset is not an integer or out of range\r\n",
                ),
                (
                    "SETBIT b x 1",
                    "-ERR bit offset is not an integer or out of range\r\n",
                ),
                (
                    "SETBIT b 1 2",
                    "-ERR bit is not an integer or out of range\r\n",
                ),
                (
                    "SETBIT b 4294967296 1",
                    "-ERR bit offset is not an integer or out of range\r\n",
                ),
                (
                    "GETBIT b -1",
                    "-ERR bit offset is not an integer or out of range\r\n",
                ),
                ("BITCOUNT nokey", ":0\r\n"),
                ("BITCOUNT nokey x y", ":0\r\n"),
                ("BITCOUNT nokey 1", ":0\r\n"),
                ("SET s foobar", "+OK\r\n"),
                ("BITCOUNT s", ":26\r\n"),
                ("BITCOUNT s 0 0", ":4\r\n"),
                ("BITCOUNT s 1 1", ":6\r\n"),
                ("BITCOUNT s 1 1 BYTE", ":6\r\n"),
                ("BITCOUNT s 5 30 BIT", ":17\r\n"),
                ("BITCOUNT s -1 -2", ":0\r\n"),
                ("BITCOUNT s 0 -1 FOO", "-ERR syntax error\r\n"),
                (
                    "BITCOUNT s x 1",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("BITCOUNT s 1", "-ERR syntax error\r\n"),
                ("BITOP AND dest s nokey", ":6\r\n"),
                ("GET dest", "$6\r\n\0\0\0\0\0\0\r\n"),
                ("BITOP OR dest s b", ":13\r\n"),
                ("STRLEN dest", ":13\r\n"),
                ("BITOP XOR dest nokey nokey2", ":0\r\n"),
                ("EXISTS dest", ":0\r\n"),
                (
                    "BITOP NOT dest s b",
                    "-ERR BITOP NOT must be called with a single source key.\r\n",
                ),
                ("BITOP NOT dest s", ":6\r\n"),
                ("BITOP FOO dest s", "-ERR syntax error\r\n"),
                ("SADD st x", ":1\r\n"),
                ("BITOP OR dest st", WRONGTYPE),
                ("GETBIT st 1", WRONGTYPE),
                ("SETBIT st 1 1", WRONGTYPE),
                ("BITCOUNT st", WRONGTYPE),
            ],
        );
        // BITPOS on s = ff f0 00, o = 00 ff f0, ones = ff ff (built with SETBIT), against the
        // replies redis-server 7.0 gave for the same strings.
        for i in 0..12 {
            cmd(svc, s, &format!("SETBIT bs {i} 1"));
        }
        cmd(svc, s, "SETBIT bs 23 0");
        for i in 8..20 {
            cmd(svc, s, &format!("SETBIT bo {i} 1"));
        }
        for i in 0..16 {
            cmd(svc, s, &format!("SETBIT bones {i} 1"));
        }
        check(
            svc,
            s,
            &[
                ("BITPOS nokey 0", ":0\r\n"),
                ("BITPOS nokey 1", ":-1\r\n"),
                ("BITPOS bs 0", ":12\r\n"),
                ("BITPOS bs 1", ":0\r\n"),
                ("BITPOS bs 0 1", ":12\r\n"),
                ("BITPOS bs 1 2", ":-1\r\n"),
                ("BITPOS bs 1 2 -1", ":-1\r\n"),
                ("BITPOS bs 0 0 0", ":-1\r\n"),
                ("BITPOS bones 0", ":16\r\n"),
                ("BITPOS bones 0 0 -1", ":-1\r\n"),
                ("BITPOS bones 1 1", ":8\r\n"),
                ("BITPOS bo 1", ":8\r\n"),
                ("BITPOS bo 0", ":0\r\n"),
                ("BITPOS bo 1 0 -1 BIT", ":8\r\n"),
                ("BITPOS bo 1 7 15 BIT", ":8\r\n"),
                ("BITPOS bo 0 8 15 BIT", ":-1\r\n"),
                ("BITPOS bo 0 8 11 BIT", ":-1\r\n"),
                ("BITPOS bo 1 17 23 BIT", ":17\r\n"),
                ("BITPOS bo 0 20 23 BIT", ":20\r\n"),
                ("BITPOS bs 0 3 1", ":-1\r\n"),
                ("BITPOS bo 1 -1 -1 BIT", ":-1\r\n"),
                ("BITPOS bo 0 -3 -1 BIT", ":21\r\n"),
                ("BITPOS bones 0 0 15 BIT", ":-1\r\n"),
                ("BITPOS bo 0 1", ":20\r\n"),
                ("BITPOS bo 0 1 -1", ":20\r\n"),
                ("BITPOS bo 1 2 2 BYTE", ":16\r\n"),
                ("BITPOS bo 0 10 12 BIT", ":-1\r\n"),
                ("BITPOS bo 1 3 100 BIT", ":8\r\n"),
                ("BITPOS bo 0 -100 100 BIT", ":0\r\n"),
                ("BITPOS bs 2", "-ERR The bit argument must be 1 or 0.\r\n"),
                (
                    "BITPOS bs x",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                (
                    "BITPOS bs 1 x",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("BITPOS bs 1 0 1 FOO", "-ERR syntax error\r\n"),
                ("BITPOS st 1", WRONGTYPE),
            ],
        );
        // A bitmap of 64 KiB set bit by bit, in place after it has grown: counts agree.
        for i in (0..524_288u64).step_by(1021) {
            assert_eq!(cmd(svc, s, &format!("SETBIT big {i} 1")), ":0\r\n");
        }
        let n = (0..524_288u64).step_by(1021).count();
        assert_eq!(cmd(svc, s, "BITCOUNT big"), format!(":{n}\r\n"));
        assert_eq!(cmd(svc, s, "GETBIT big 1021"), ":1\r\n");
        assert_eq!(cmd(svc, s, "GETBIT big 1022"), ":0\r\n");
        assert_eq!(cmd(svc, s, "SETBIT big 1021 0"), ":1\r\n");
        assert_eq!(cmd(svc, s, "BITCOUNT big"), format!(":{}\r\n", n - 1));
    });
}

/// ZMSCORE, ZRANDMEMBER, ZREMRANGEBYSCORE, ZREMRANGEBYRANK: replies as redis-server 7.0
/// gave them.
#[test]
fn sorted_set_extras() {
    on_each_engine(|svc, s| {
        check(
            svc,
            s,
            &[
                ("ZMSCORE nokey a b", "*2\r\n$-1\r\n$-1\r\n"),
                ("ZADD z 1 a 2 b 3.5 c", ":3\r\n"),
                ("ZMSCORE z a x c", "*3\r\n$1\r\n1\r\n$-1\r\n$3\r\n3.5\r\n"),
                ("SET s x", "+OK\r\n"),
                ("ZMSCORE s a", WRONGTYPE),
                (
                    "ZMSCORE z",
                    "-ERR wrong number of arguments for 'zmscore' command\r\n",
                ),
                ("ZRANDMEMBER nokey", "$-1\r\n"),
                ("ZRANDMEMBER nokey 2", "*0\r\n"),
                ("ZRANDMEMBER z 0", "*0\r\n"),
                (
                    "ZRANDMEMBER z x",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("ZRANDMEMBER z 1 foo", "-ERR syntax error\r\n"),
                ("ZRANDMEMBER s", WRONGTYPE),
                ("ZADD one 1.5 only", ":1\r\n"),
                ("ZRANDMEMBER one", "$4\r\nonly\r\n"),
                (
                    "ZRANDMEMBER one -2 WITHSCORES",
                    "*4\r\n$4\r\nonly\r\n$3\r\n1.5\r\n$4\r\nonly\r\n$3\r\n1.5\r\n",
                ),
                (
                    "ZRANDMEMBER one 3 withscores",
                    "*2\r\n$4\r\nonly\r\n$3\r\n1.5\r\n",
                ),
                (
                    "ZREMRANGEBYSCORE z x 1",
                    "-ERR min or max is not a float\r\n",
                ),
                ("ZREMRANGEBYSCORE nokey 0 1", ":0\r\n"),
                ("ZREMRANGEBYSCORE s 0 1", WRONGTYPE),
                ("ZREMRANGEBYSCORE z (1 2", ":1\r\n"),
                ("ZRANGE z 0 -1", "*2\r\n$1\r\na\r\n$1\r\nc\r\n"),
                ("ZADD z 2 b", ":1\r\n"),
                (
                    "ZREMRANGEBYRANK z x 1",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("ZREMRANGEBYRANK nokey 0 1", ":0\r\n"),
                ("ZREMRANGEBYRANK z 5 10", ":0\r\n"),
                ("ZREMRANGEBYRANK z -1 -1", ":1\r\n"),
                ("ZRANGE z 0 -1", "*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
                ("ZREMRANGEBYRANK z 0 -1", ":2\r\n"),
                ("EXISTS z", ":0\r\n"),
                ("ZADD w 1 a 2 b 3 c 4 d", ":4\r\n"),
                ("ZREMRANGEBYSCORE w -inf +inf", ":4\r\n"),
                ("EXISTS w", ":0\r\n"),
            ],
        );
        // Distinct members of a 300-member set.
        let args: Vec<String> = (0..300).map(|i| format!("{i} m{i}")).collect();
        cmd(svc, s, &format!("ZADD big {}", args.join(" ")));
        let r = cmd(svc, s, "ZRANDMEMBER big 100");
        let got: std::collections::BTreeSet<&str> =
            r.split("\r\n").filter(|l| l.starts_with('m')).collect();
        assert_eq!(got.len(), 100);
        assert_eq!(cmd(svc, s, "ZREMRANGEBYRANK big 0 99"), ":100\r\n");
        assert_eq!(cmd(svc, s, "ZCARD big"), ":200\r\n");
        assert_eq!(cmd(svc, s, "ZREMRANGEBYSCORE big 100 149"), ":50\r\n");
        assert_eq!(cmd(svc, s, "ZSCORE big m150"), "$3\r\n150\r\n");
    });
}

/// SSCAN, HSCAN, ZSCAN: a small (packed) collection answers whole with cursor 0; a large one
/// is walked to cursor 0 and every element is met; MATCH filters; errors as Redis's.
#[test]
fn collection_scans() {
    on_each_engine(|svc, s| {
        check(
            svc,
            s,
            &[
                ("SSCAN nokey 0", "*2\r\n$1\r\n0\r\n*0\r\n"),
                ("SADD small a", ":1\r\n"),
                ("SSCAN small 0", "*2\r\n$1\r\n0\r\n*1\r\n$1\r\na\r\n"),
                ("HSET hs f v", ":1\r\n"),
                (
                    "HSCAN hs 0",
                    "*2\r\n$1\r\n0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
                ),
                ("ZADD zs 1.5 m", ":1\r\n"),
                (
                    "ZSCAN zs 0",
                    "*2\r\n$1\r\n0\r\n*2\r\n$1\r\nm\r\n$3\r\n1.5\r\n",
                ),
                ("SSCAN small x", "-ERR invalid cursor\r\n"),
                ("SSCAN small 0 COUNT 0", "-ERR syntax error\r\n"),
                (
                    "SSCAN small 0 COUNT x",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("SSCAN small 0 FOO 1", "-ERR syntax error\r\n"),
                ("SSCAN hs 0", WRONGTYPE),
                ("HSCAN small 0", WRONGTYPE),
                ("ZSCAN small 0", WRONGTYPE),
            ],
        );
        let m: Vec<String> = (0..500).map(|i| format!("m{i}")).collect();
        cmd(svc, s, &format!("SADD bs {}", m.join(" ")));
        let pairs: Vec<String> = (0..500).map(|i| format!("m{i} v{i}")).collect();
        cmd(svc, s, &format!("HSET bh {}", pairs.join(" ")));
        let scored: Vec<String> = (0..500).map(|i| format!("{i} m{i}")).collect();
        cmd(svc, s, &format!("ZADD bz {}", scored.join(" ")));
        for (c, key, per) in [("SSCAN", "bs", 1), ("HSCAN", "bh", 2), ("ZSCAN", "bz", 2)] {
            for pat in [None, Some("m1*")] {
                let mut seen = std::collections::BTreeSet::new();
                let mut cursor = "0".to_string();
                let mut calls = 0;
                loop {
                    let line = match pat {
                        Some(p) => format!("{c} {key} {cursor} COUNT 20 MATCH {p}"),
                        None => format!("{c} {key} {cursor} COUNT 20"),
                    };
                    let r = cmd(svc, s, &line);
                    let parts: Vec<&str> = r.split("\r\n").collect();
                    cursor = parts[2].to_string();
                    // The items: bulk strings after the inner array's header.
                    let items: Vec<&str> = parts[4..].iter().skip(1).step_by(2).copied().collect();
                    for (k, it) in items.iter().enumerate() {
                        if k % per == 0 {
                            seen.insert(it.to_string());
                        } else if c == "HSCAN" {
                            assert_eq!(*it, format!("v{}", &items[k - 1][1..]));
                        } else {
                            assert_eq!(*it, &items[k - 1][1..]);
                        }
                    }
                    calls += 1;
                    if cursor == "0" {
                        break;
                    }
                    assert!(calls < 1000, "{c} never ends");
                }
                let want: std::collections::BTreeSet<String> = (0..500)
                    .map(|i| format!("m{i}"))
                    .filter(|x| pat.is_none() || x.starts_with("m1"))
                    .collect();
                assert_eq!(seen, want, "{c} {pat:?}");
                assert!(
                    calls > 1,
                    "{c}: a large collection is walked in several calls"
                );
            }
        }
    });
}

#[test]
fn pipelines_and_group_commit() {
    for eng in ENGINES {
        let mut outs = Vec::new();
        for d in [Durability::Commit, Durability::Pipeline] {
            let mut f = Fixture::new(eng);
            let svc = service(&mut f, d);
            let mut s = svc.open_session("p");
            let script: Vec<Vec<&[u8]>> = vec![
                vec![b"SET", b"a", b"1"],
                vec![b"INCR", b"a"],
                vec![b"GET", b"a"],
                vec![b"LPUSH", b"a", b"x"],
                vec![b"RPUSH", b"l", b"x", b"y"],
                vec![b"LRANGE", b"l", b"0", b"-1"],
                vec![b"NOSUCH"],
                vec![b"HSET", b"h", b"f", b"v"],
                vec![b"HGETALL", b"h"],
                vec![b"DEL", b"l"],
                vec![b"EXISTS", b"l", b"h"],
            ];
            let mut out = Vec::new();
            assert_eq!(
                svc.execute(&mut s, &script, &mut out, usize::MAX).control,
                Control::Continue
            );
            outs.push(String::from_utf8(out).unwrap());
            let info = cmd(&svc, &mut s, "INFO stats");
            let commits: u64 = info
                .split("\r\n")
                .find_map(|l| l.strip_prefix("tiermem_commits:"))
                .unwrap()
                .parse()
                .unwrap();
            match d {
                Durability::Commit => assert_eq!(commits, 5),
                Durability::Pipeline => assert_eq!(commits, 1, "one group commit"),
            }
        }
        assert_eq!(outs[0], outs[1]);
        assert_eq!(
            outs[0],
            "+OK\r\n:2\r\n$1\r\n2\r\n".to_string()
                + WRONGTYPE
                + ":2\r\n*2\r\n$1\r\nx\r\n$1\r\ny\r\n-ERR unknown command 'NOSUCH', with args beginning with: \r\n:1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n:1\r\n:1\r\n"
        );
    }
}

/// Everything acknowledged comes back after a restart (vnvm), found from the heap's root.
#[test]
fn restart_keeps_the_keyspace() {
    let mut f = Fixture::new(Eng::Vnvm);
    let mut rng = Rng(7);
    let mut model: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for round in 0..3 {
        let svc = service(
            &mut f,
            if round == 1 {
                Durability::Pipeline
            } else {
                Durability::Commit
            },
        );
        let mut s = svc.open_session("r");
        for (k, v) in &model {
            assert_eq!(
                cmd(&svc, &mut s, &format!("GET {k}")),
                format!("${}\r\n{v}\r\n", v.len())
            );
        }
        for i in 0..300 {
            let k = format!("k{}", rng.below(200));
            let v = format!("v{round}-{i}");
            assert_eq!(cmd(&svc, &mut s, &format!("SET {k} {v}")), "+OK\r\n");
            model.insert(k, v);
        }
        cmd(&svc, &mut s, "RPUSH list a b c");
        cmd(&svc, &mut s, "ZADD zs 1 one 2 two");
        cmd(&svc, &mut s, "HSET hh f v");
        assert_eq!(
            cmd(&svc, &mut s, "DBSIZE"),
            format!(":{}\r\n", model.len() + 3)
        );
        // SHUTDOWN: no reply, the server stops.
        assert_eq!(
            exec(&svc, &mut s, &[&[b"SHUTDOWN", b"NOSAVE"]]),
            (String::new(), Control::Shutdown)
        );
        svc.shutdown().unwrap();
        let heap = into_heap(svc);
        assert!(f.reopen_from(heap));
    }
    let svc = service(&mut f, Durability::Commit);
    let mut s = svc.open_session("r");
    assert_eq!(
        cmd(&svc, &mut s, "LRANGE list 0 -1").matches('$').count(),
        9
    );
    assert_eq!(cmd(&svc, &mut s, "ZSCORE zs two"), "$1\r\n2\r\n");
}

fn into_heap(svc: KvService) -> tiermem_kv::heap::Heap {
    svc.into_heap()
}

/// A command whose transaction cannot fit the log fails at once with a clean error and
/// changes nothing.
#[test]
fn too_large_for_the_log_changes_nothing() {
    // 8 MiB log: transactions up to 4 MiB.
    let mut f = Fixture::sized(Eng::Vnvm, 64 << 20, 8 << 20);
    for d in [Durability::Commit, Durability::Pipeline] {
        let svc = service(&mut f, d);
        let mut s = svc.open_session("t");
        assert_eq!(cmd(&svc, &mut s, "SET keep old"), "+OK\r\n");
        let big = vec![b'x'; 6 << 20];
        let t = std::time::Instant::now();
        let (r, _) = exec(&svc, &mut s, &[&[b"SET", b"keep", &big]]);
        assert!(
            r.starts_with("-ERR command too large for one transaction"),
            "{r}"
        );
        assert!(r.ends_with("nothing was changed\r\n"));
        assert!(t.elapsed().as_secs() < 5, "fails fast");
        assert_eq!(cmd(&svc, &mut s, "GET keep"), "$3\r\nold\r\n");
        // MSET of many keys: the same, and none of them appears.
        let keys: Vec<Vec<u8>> = (0..60_000)
            .map(|i| format!("key:{i:08}").into_bytes())
            .collect();
        let val = vec![b'v'; 64];
        let mut req: Vec<&[u8]> = vec![b"MSET"];
        for k in &keys {
            req.push(k);
            req.push(&val);
        }
        let (r, _) = exec(&svc, &mut s, &[&req]);
        assert!(r.starts_with("-ERR command too large"), "{r}");
        assert_eq!(cmd(&svc, &mut s, "DBSIZE"), ":1\r\n");
        assert_eq!(cmd(&svc, &mut s, "EXISTS key:00000000"), ":0\r\n");
        // In a pipeline (group commit in async mode) only the big command fails.
        let (r, _) = exec(
            &svc,
            &mut s,
            &[
                &[b"SET", b"p1", b"1"],
                &[b"SET", b"p2", &big],
                &[b"SET", b"p3", b"3"],
            ],
        );
        assert!(
            r.starts_with("+OK\r\n-ERR command too large") && r.ends_with("+OK\r\n"),
            "{r}"
        );
        assert_eq!(
            cmd(&svc, &mut s, "MGET p1 p2 p3"),
            "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n3\r\n"
        );
        let info = cmd(&svc, &mut s, "INFO stats");
        assert!(info.contains("tiermem_tx_too_large:"));
        cmd(&svc, &mut s, "FLUSHALL");
        while svc.collect_garbage(100_000).unwrap() > 0 {}
        svc.shutdown().unwrap();
        assert!(f.reopen_from(svc.into_heap()));
    }
}

/// A full heap answers -OOM, keeps its data, and works again after a DEL (the garbage of a
/// big value is freed at once when memory runs out).
#[test]
fn full_heap_is_oom_and_recovers() {
    for eng in ENGINES {
        let mut f = Fixture::sized(eng, 4 << 20, 8 << 20);
        let svc = service(&mut f, Durability::Commit);
        let mut s = svc.open_session("o");
        let val = "x".repeat(10_000);
        let mut n = 0;
        loop {
            let r = cmd(&svc, &mut s, &format!("SET k{n} {val}"));
            if r.starts_with("-OOM") {
                assert!(r.contains("nothing was changed"), "{r}");
                break;
            }
            assert_eq!(r, "+OK\r\n");
            n += 1;
            assert!(n < 1000);
        }
        assert!(n > 100);
        assert_eq!(cmd(&svc, &mut s, &format!("EXISTS k{n}")), ":0\r\n");
        assert_eq!(cmd(&svc, &mut s, "DBSIZE"), format!(":{n}\r\n"));
        assert_eq!(cmd(&svc, &mut s, "GET k0"), format!("$10000\r\n{val}\r\n"));
        // Make a big list out of the last key's space... simply delete half the keys.
        for i in 0..n / 2 {
            cmd(&svc, &mut s, &format!("DEL k{i}"));
        }
        assert_eq!(cmd(&svc, &mut s, &format!("SET k{n} {val}")), "+OK\r\n");
        // A big list filling a fresh heap, deleted (-> garbage), then pushes that need its
        // blocks (no other 4 KiB blocks are free).
        drop(svc);
        let mut f = Fixture::sized(eng, 4 << 20, 8 << 20);
        let svc = service(&mut f, Durability::Commit);
        let mut s = svc.open_session("o");
        let mut m = 0;
        loop {
            let r = cmd(&svc, &mut s, &format!("RPUSH biglist {}", "y".repeat(1000)));
            if r.starts_with("-OOM") {
                break;
            }
            m += 1;
        }
        assert!(m > 1000, "{m}");
        assert_eq!(cmd(&svc, &mut s, "DEL biglist"), ":1\r\n");
        assert!(svc.has_garbage());
        // New 4 KiB nodes need the blocks waiting on the garbage list: the OOM is retried after
        // freeing the garbage.
        assert_eq!(
            cmd(&svc, &mut s, &format!("RPUSH list2 {}", "y".repeat(1000))),
            ":1\r\n"
        );
        assert!(!svc.has_garbage());
        let info = cmd(&svc, &mut s, "INFO stats");
        assert!(info.contains("tiermem_oom_errors:"), "{info}");
    }
}

/// Per-command cost of an in-process loop (no network), both engines, both durability modes.
/// `cargo test -p tiermem-kv --release --test commands -- --ignored --nocapture per_command`
#[test]
#[ignore]
fn per_command_cost() {
    for eng in ENGINES {
        for d in [Durability::Commit, Durability::Pipeline] {
            let mut f = Fixture::sized(eng, 512 << 20, 64 << 20);
            let svc = service(&mut f, d);
            let mut s = svc.open_session("b");
            let n = 100_000u64;
            let keys: Vec<Vec<u8>> = (0..n)
                .map(|i| format!("key:{i:012}").into_bytes())
                .collect();
            let fields: Vec<Vec<u8>> = (0..10).map(|i| format!("field{i}").into_bytes()).collect();
            let v100 = vec![b'v'; 100];
            let filter = std::env::var("KV_BENCH").unwrap_or_default();
            let mut time = |name: &str, batch: usize, mk: &mut dyn FnMut(u64) -> Vec<Vec<u8>>| {
                let label = format!("{eng:?} {} {name}", d.name());
                if !label.contains(&filter) && !name.starts_with("SET (new") {
                    return;
                }
                let owned: Vec<Vec<Vec<u8>>> = (0..n).map(&mut *mk).collect();
                let rq: Vec<Vec<&[u8]>> = owned
                    .iter()
                    .map(|r| r.iter().map(|a| &a[..]).collect())
                    .collect();
                let mut out = Vec::with_capacity(1 << 16);
                let t = std::time::Instant::now();
                for chunk in rq.chunks(batch) {
                    out.clear();
                    svc.execute(&mut s, chunk, &mut out, usize::MAX);
                }
                let ns = t.elapsed().as_nanos() as f64 / n as f64;
                println!("{eng:?} {:6} {name:28} {ns:8.0} ns/command", d.name());
            };
            time("SET (new keys)", 1, &mut |i| {
                vec![b"SET".to_vec(), keys[i as usize].clone(), b"xxx".to_vec()]
            });
            time("SET (overwrite)", 1, &mut |i| {
                vec![b"SET".to_vec(), keys[i as usize].clone(), b"yyy".to_vec()]
            });
            time("SET (overwrite) -P 16", 16, &mut |i| {
                vec![b"SET".to_vec(), keys[i as usize].clone(), b"zzz".to_vec()]
            });
            time("GET", 1, &mut |i| {
                vec![b"GET".to_vec(), keys[i as usize].clone()]
            });
            time("GET -P 16", 16, &mut |i| {
                vec![b"GET".to_vec(), keys[i as usize].clone()]
            });
            time("INCR", 1, &mut |i| {
                vec![b"INCR".to_vec(), format!("ctr{}", i % 100).into_bytes()]
            });
            time("LPUSH", 1, &mut |_| {
                vec![b"LPUSH".to_vec(), b"mylist".to_vec(), b"xxx".to_vec()]
            });
            time("LRANGE 0 99", 1, &mut |_| {
                vec![
                    b"LRANGE".to_vec(),
                    b"mylist".to_vec(),
                    b"0".to_vec(),
                    b"99".to_vec(),
                ]
            });
            time("RPOP", 1, &mut |_| {
                vec![b"RPOP".to_vec(), b"mylist".to_vec()]
            });
            time("SADD", 1, &mut |i| {
                vec![
                    b"SADD".to_vec(),
                    b"myset".to_vec(),
                    keys[i as usize].clone(),
                ]
            });
            time("ZADD", 1, &mut |i| {
                vec![
                    b"ZADD".to_vec(),
                    b"myzset".to_vec(),
                    (i % 1000).to_string().into_bytes(),
                    keys[i as usize].clone(),
                ]
            });
            time("ZPOPMIN", 1, &mut |_| {
                vec![b"ZPOPMIN".to_vec(), b"myzset".to_vec()]
            });
            let ycsb_keys = 10_000u64;
            time("HSET 10x100 B (YCSB insert)", 1, &mut |i| {
                let mut r = vec![
                    b"HSET".to_vec(),
                    format!("user{}", i % ycsb_keys).into_bytes(),
                ];
                for f in &fields {
                    r.push(f.clone());
                    r.push(v100.clone());
                }
                r
            });
            time("HSET 1 field (YCSB update)", 1, &mut |i| {
                // A value that differs from the stored one (same size).
                let mut v = v100.clone();
                v[(i % 100) as usize] = b'0' + (i % 10) as u8;
                vec![
                    b"HSET".to_vec(),
                    format!("user{}", i % ycsb_keys).into_bytes(),
                    fields[(i % 10) as usize].clone(),
                    v,
                ]
            });
            time("HGETALL (YCSB read)", 1, &mut |i| {
                vec![
                    b"HGETALL".to_vec(),
                    format!("user{}", i % ycsb_keys).into_bytes(),
                ]
            });
            time("HMGET 3 fields", 1, &mut |i| {
                vec![
                    b"HMGET".to_vec(),
                    format!("user{}", i % ycsb_keys).into_bytes(),
                    b"field1".to_vec(),
                    b"field5".to_vec(),
                    b"field9".to_vec(),
                ]
            });
            time("DEL", 1, &mut |i| {
                vec![b"DEL".to_vec(), keys[i as usize].clone()]
            });
        }
    }
}

/// Two threads share the service: a writer pipelines INCRs, a reader sees a counter that never
/// goes back (committed state only, never half a transaction).
#[test]
fn concurrent_readers_and_writers() {
    for eng in ENGINES {
        for d in [Durability::Commit, Durability::Pipeline] {
            let mut f = Fixture::new(eng);
            let svc = std::sync::Arc::new(service(&mut f, d));
            let w = {
                let svc = svc.clone();
                std::thread::spawn(move || {
                    let mut s = svc.open_session("w");
                    for _ in 0..500 {
                        let r: Vec<Vec<&[u8]>> = vec![vec![b"INCR", b"c"]; 4];
                        let mut out = Vec::new();
                        svc.execute(&mut s, &r, &mut out, usize::MAX);
                        svc.round_end();
                    }
                    svc.close_session(s);
                })
            };
            let mut s = svc.open_session("r");
            let mut last = 0i64;
            // The writer's 2000 increments take well under a second; a reader still short of
            // them after a minute waits for a writer that stopped (or a counter that sticks).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while last < 2000 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{eng:?} {d:?}: the reader still sees {last} of 2000 increments after 60 s \
                     (writer finished: {})",
                    w.is_finished()
                );
                let r = cmd(&svc, &mut s, "GET c");
                if r == "$-1\r\n" {
                    continue;
                }
                let v: i64 = r.split("\r\n").nth(1).unwrap().parse().unwrap();
                assert!(v >= last, "{v} after {last}");
                if d == Durability::Pipeline {
                    assert_eq!(v % 4, 0, "a group commits whole");
                }
                last = v;
            }
            w.join().unwrap();
            assert_eq!(cmd(&svc, &mut s, "GET c"), "$4\r\n2000\r\n");
        }
    }
}

/// FLUSHALL of many keys answers at once; the event loop's rounds free the old keyspace.
#[test]
fn flushall_garbage_drains_in_rounds() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let svc = service(&mut f, Durability::Commit);
        let mut s = svc.open_session("g");
        let base = used(&svc, &mut s);
        let mut req: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
        for i in 0..5000 {
            req.push(format!("key:{i}").into_bytes());
            req.push(b"some value".to_vec());
        }
        let r: Vec<&[u8]> = req.iter().map(|x| &x[..]).collect();
        assert_eq!(exec(&svc, &mut s, &[&r]).0, "+OK\r\n");
        cmd(&svc, &mut s, "RPUSH l a b c");
        assert!(used(&svc, &mut s) > base + 5000 * 64);
        assert_eq!(cmd(&svc, &mut s, "FLUSHALL"), "+OK\r\n");
        assert_eq!(cmd(&svc, &mut s, "DBSIZE"), ":0\r\n");
        assert!(svc.has_garbage());
        let mut rounds = 0;
        while svc.has_garbage() {
            svc.round_end();
            rounds += 1;
            assert!(rounds < 1000);
        }
        assert!(rounds > 5, "{rounds} rounds");
        assert_eq!(used(&svc, &mut s), base);
    }
}

fn used(svc: &KvService, s: &mut Session) -> u64 {
    let info = cmd(svc, s, "INFO memory");
    info.split("\r\n")
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn freeze_stops_every_command_and_closes_connections() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let svc = std::sync::Arc::new(service(&mut f, Durability::Commit));
        let mut s = svc.open_session("test");
        assert_eq!(cmd(&svc, &mut s, "SET k v1"), "+OK\r\n");
        // A writer keeps going until the freeze; after it, nothing changes the heap.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = {
            let (svc, stop) = (svc.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut s = svc.open_session("writer");
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (out, c) = exec(&svc, &mut s, &[&[b"INCR", b"ctr"]]);
                    if c == Control::Close {
                        assert_eq!(out, "", "no reply once frozen");
                        break;
                    }
                    n += 1;
                }
                n
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        svc.freeze();
        assert!(svc.is_frozen());
        let snapshot = svc.heap().view().to_vec();
        let (out, c) = exec(&svc, &mut s, &[&[b"SET", b"k", b"v2"]]);
        assert_eq!((out.as_str(), c), ("", Control::Close));
        let (out, c) = exec(&svc, &mut s, &[&[b"GET", b"k"]]);
        assert_eq!((out.as_str(), c), ("", Control::Close));
        assert_eq!(svc.collect_garbage(1000).unwrap(), 0);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = w.join().unwrap();
        assert!(n > 0, "{eng:?}: the writer ran before the freeze");
        assert!(
            svc.heap().view() == &snapshot[..],
            "{eng:?}: the heap changed after freeze"
        );
    }
}

/// LCS: replies as redis-server 7.0 gave them for the same commands (its documentation's
/// example, the classic ABCBDAB/BDCABA pair, missing keys, options and their errors).
#[test]
fn lcs_as_redis_7_0() {
    on_each_engine(|svc, s| {
        let idx = "*4\r\n$7\r\nmatches\r\n*2\r\n*2\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n*2\r\n*2\r\n:2\r\n:3\r\n*2\r\n:0\r\n:1\r\n$3\r\nlen\r\n:6\r\n";
        let idx_len = "*4\r\n$7\r\nmatches\r\n*2\r\n*3\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n:4\r\n*3\r\n*2\r\n:2\r\n:3\r\n*2\r\n:0\r\n:1\r\n:2\r\n$3\r\nlen\r\n:6\r\n";
        check(svc, s, &[
            ("SET key1 ohmytext", "+OK\r\n"),
            ("SET key2 mynewtext", "+OK\r\n"),
            ("LCS key1 key2", "$6\r\nmytext\r\n"),
            ("LCS key1 key2 LEN", ":6\r\n"),
            ("LCS key1 key2 len", ":6\r\n"),
            ("LCS key1 key2 IDX", idx),
            ("LCS key1 key2 IDX IDX", idx),
            ("LCS key1 key2 IDX MINMATCHLEN -5", idx),
            ("LCS key1 key2 IDX MINMATCHLEN 4", "*4\r\n$7\r\nmatches\r\n*1\r\n*2\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n$3\r\nlen\r\n:6\r\n"),
            ("LCS key1 key2 IDX MINMATCHLEN 4 WITHMATCHLEN", "*4\r\n$7\r\nmatches\r\n*1\r\n*3\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n:4\r\n$3\r\nlen\r\n:6\r\n"),
            ("LCS key1 key2 IDX WITHMATCHLEN", idx_len),
            ("LCS key1 key2 idx minmatchlen 2 withmatchlen", idx_len),
            ("LCS key1 key2 WITHMATCHLEN", "$6\r\nmytext\r\n"),
            ("LCS key1 key2 MINMATCHLEN 3", "$6\r\nmytext\r\n"),
            ("LCS key1 key2 LEN MINMATCHLEN 3", ":6\r\n"),
            ("LCS key1 key2 LEN IDX", "-ERR If you want both the length and indexes, please just use IDX.\r\n"),
            ("LCS key1 key2 FOO", "-ERR syntax error\r\n"),
            ("LCS key1 key2 MINMATCHLEN", "-ERR syntax error\r\n"),
            ("LCS key1 key2 MINMATCHLEN x", "-ERR value is not an integer or out of range\r\n"),
            ("LCS nokey key2", "$0\r\n\r\n"),
            ("LCS nokey nokey2", "$0\r\n\r\n"),
            ("LCS nokey nokey2 LEN", ":0\r\n"),
            ("LCS nokey nokey2 IDX", "*4\r\n$7\r\nmatches\r\n*0\r\n$3\r\nlen\r\n:0\r\n"),
            ("RPUSH l a", ":1\r\n"),
            ("LCS l key1", "-ERR The specified keys must contain string values\r\n"),
            ("LCS key1 l", "-ERR The specified keys must contain string values\r\n"),
            ("LCS key1", "-ERR wrong number of arguments for 'lcs' command\r\n"),
            ("SET a ABCBDAB", "+OK\r\n"),
            ("SET b BDCABA", "+OK\r\n"),
            ("LCS a b", "$4\r\nBDAB\r\n"),
            ("LCS a b IDX WITHMATCHLEN", "*4\r\n$7\r\nmatches\r\n*2\r\n*3\r\n*2\r\n:5\r\n:6\r\n*2\r\n:3\r\n:4\r\n:2\r\n*3\r\n*2\r\n:3\r\n:4\r\n*2\r\n:0\r\n:1\r\n:2\r\n$3\r\nlen\r\n:4\r\n"),
            ("LCS a a IDX", "*4\r\n$7\r\nmatches\r\n*1\r\n*2\r\n*2\r\n:0\r\n:6\r\n*2\r\n:0\r\n:6\r\n$3\r\nlen\r\n:7\r\n"),
        ]);
        // A table past proto-max-bulk-len (11 601² cells of 4 bytes) is refused.
        let big_a = format!("SET x {}", "a".repeat(11_600));
        let big_b = format!("SET y {}", "b".repeat(11_600));
        check(svc, s, &[
            (big_a.as_str(), "+OK\r\n"),
            (big_b.as_str(), "+OK\r\n"),
            ("LCS x y LEN", "-ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len\r\n"),
        ]);
    });
}

/// BITFIELD and BITFIELD_RO: replies as redis-server 7.0 gave them for the same commands
/// (signed and unsigned fields up to 64 bits, `#N` offsets, WRAP/SAT/FAIL on SET and INCRBY,
/// a key created zero-padded, the errors), in order on one key.
#[test]
fn bitfield_as_redis_7_0() {
    on_each_engine(|svc, s| {
        check(svc, s, &[
            ("BITFIELD bf SET i8 0 -100 GET u4 0 GET i4 4", "*3\r\n:0\r\n:9\r\n:-4\r\n"),
            ("BITFIELD bf INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1", "*2\r\n:1\r\n:1\r\n"),
            ("BITFIELD bf INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1", "*2\r\n:2\r\n:2\r\n"),
            ("BITFIELD bf INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1", "*2\r\n:3\r\n:3\r\n"),
            ("BITFIELD bf INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1", "*2\r\n:0\r\n:3\r\n"),
            ("BITFIELD bf OVERFLOW FAIL INCRBY u2 102 1", "*1\r\n$-1\r\n"),
            ("BITFIELD bf OVERFLOW FAIL INCRBY i8 #0 200", "*1\r\n:100\r\n"),
            ("BITFIELD bf OVERFLOW WRAP INCRBY i8 #0 200", "*1\r\n:44\r\n"),
            ("BITFIELD bf OVERFLOW SAT INCRBY i8 #0 -300", "*1\r\n:-128\r\n"),
            ("BITFIELD bf OVERFLOW SAT INCRBY i8 #0 300", "*1\r\n:127\r\n"),
            ("BITFIELD bf SET u8 #1 255 GET u8 #1 GET i8 #1", "*3\r\n:0\r\n:255\r\n:-1\r\n"),
            ("BITFIELD bf SET i64 0 -1 GET u63 0 GET i64 0", "*3\r\n:9223090561878065152\r\n:9223372036854775807\r\n:-1\r\n"),
            ("BITFIELD bf INCRBY i64 0 -9223372036854775807", "*1\r\n:-9223372036854775808\r\n"),
            ("BITFIELD bf OVERFLOW SAT INCRBY i64 0 -10", "*1\r\n:-9223372036854775808\r\n"),
            ("BITFIELD bf OVERFLOW WRAP INCRBY i64 0 -10", "*1\r\n:9223372036854775798\r\n"),
            ("BITFIELD bf OVERFLOW FAIL INCRBY i64 0 -9223372036854775800", "*1\r\n:-2\r\n"),
            ("BITFIELD bf GET u64 0", "-ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.\r\n"),
            ("BITFIELD bf GET i65 0", "-ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.\r\n"),
            ("BITFIELD bf GET i0 0", "-ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.\r\n"),
            ("BITFIELD bf GET x8 0", "-ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.\r\n"),
            ("BITFIELD bf GET u8 -1", "-ERR bit offset is not an integer or out of range\r\n"),
            ("BITFIELD bf GET u8 x", "-ERR bit offset is not an integer or out of range\r\n"),
            ("BITFIELD bf GET u8 #x", "-ERR bit offset is not an integer or out of range\r\n"),
            ("BITFIELD bf SET u8 0 x", "-ERR value is not an integer or out of range\r\n"),
            ("BITFIELD bf INCRBY u8 0 x", "-ERR value is not an integer or out of range\r\n"),
            ("BITFIELD bf OVERFLOW FOO GET u8 0", "-ERR Invalid OVERFLOW type specified\r\n"),
            ("BITFIELD bf FOO", "-ERR syntax error\r\n"),
            ("BITFIELD bf GET u8", "-ERR syntax error\r\n"),
            ("BITFIELD bf SET u8 0", "-ERR syntax error\r\n"),
            ("BITFIELD bf", "*0\r\n"),
            ("BITFIELD nokey GET u8 0 GET i16 100", "*2\r\n:0\r\n:0\r\n"),
            ("EXISTS nokey", ":0\r\n"),
            ("BITFIELD nokey2", "*0\r\n"),
            ("EXISTS nokey2", ":0\r\n"),
            ("BITFIELD nk3 SET u1 100 1", "*1\r\n:0\r\n"),
            ("STRLEN nk3", ":13\r\n"),
            ("BITFIELD_RO bf GET u8 0 GET i4 4", "*2\r\n:255\r\n:-1\r\n"),
            ("BITFIELD_RO bf SET u8 0 1", "-ERR BITFIELD_RO only supports the GET subcommand\r\n"),
            ("BITFIELD_RO bf INCRBY u8 0 1", "-ERR BITFIELD_RO only supports the GET subcommand\r\n"),
            ("BITFIELD_RO bf", "*0\r\n"),
            ("BITFIELD_RO nokey GET u8 0", "*1\r\n:0\r\n"),
            ("RPUSH l a", ":1\r\n"),
            ("BITFIELD l GET u8 0", "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            ("BITFIELD_RO l GET u8 0", "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            ("BITFIELD l", "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            ("BITFIELD bf GET u8 4294967296", "-ERR bit offset is not an integer or out of range\r\n"),
            ("BITFIELD bf GET u8 4294967287", "*1\r\n:0\r\n"),
            ("BITFIELD bf SET u8 0 256", "*1\r\n:255\r\n"),
            ("BITFIELD bf SET u8 0 -1", "*1\r\n:0\r\n"),
            ("BITFIELD bf GET u8 0", "*1\r\n:255\r\n"),
            ("BITFIELD bf SET i8 0 200", "*1\r\n:-1\r\n"),
            ("BITFIELD bf GET i8 0", "*1\r\n:-56\r\n"),
            ("BITFIELD bf SET i8 0 -129 GET i8 0", "*2\r\n:-56\r\n:127\r\n"),
            ("BITFIELD bf SET u8 0 9999999999999999999999", "-ERR value is not an integer or out of range\r\n"),
            ("BITFIELD bf SET u3 5 7 GET u8 0 GET u3 5 GET u3 6", "*4\r\n:7\r\n:127\r\n:7\r\n:7\r\n"),
            ("BITFIELD bf OVERFLOW FAIL SET u2 0 7 GET u2 0", "*2\r\n$-1\r\n:1\r\n"),
            ("BITFIELD bf OVERFLOW SAT SET u2 0 7 GET u2 0", "*2\r\n:1\r\n:3\r\n"),
            ("BITFIELD bf OVERFLOW SAT SET i4 0 -20 GET i4 0", "*2\r\n:-1\r\n:-8\r\n"),
            ("BITFIELD bf OVERFLOW FAIL SET i4 0 -20 GET i4 0", "*2\r\n$-1\r\n:-8\r\n"),
            ("BITFIELD bf overflow sat incrby u8 0 1000 get u8 0", "*2\r\n:255\r\n:255\r\n"),
            ("BITFIELD bf GET u63 0 GET i63 1", "*2\r\n:9223372036854775807\r\n:-2\r\n"),
            ("BITFIELD bf INCRBY u63 0 -1 GET u63 0", "*2\r\n:9223372036854775806\r\n:9223372036854775806\r\n"),
            ("BITFIELD bf OVERFLOW SAT INCRBY u63 0 -9223372036854775808", "*1\r\n:0\r\n"),
            ("BITFIELD bf GET u8 #536870912", "-ERR bit offset is not an integer or out of range\r\n"),
            ("BITFIELD bf GET u8 #-1", "-ERR bit offset is not an integer or out of range\r\n"),
            // The u2 fields at bits 100 and 102 grew it to 13 bytes.
            ("STRLEN bf", ":13\r\n"),
        ]);
    });
}

/// Expiry: replies as redis-server 7.0 gave them for the same commands (EXPIRE's options and
/// their errors, overflow, SET's EX/PX/EXAT/PXAT/KEEPTTL/GET, SETEX, PSETEX, GETEX, and which
/// writes keep or drop a time to live). TTLs here are whole seconds a few milliseconds after
/// they were set, so they read exactly.
#[test]
fn expiry_as_redis_7_0() {
    on_each_engine(|svc, s| {
        let now = tiermem_kv::ds::expire::wall_ms() / 1000;
        let far = now + 1000;
        let far_ms = far * 1000;
        check(
            svc,
            s,
            &[
                ("SET k v", "+OK\r\n"),
                ("TTL k", ":-1\r\n"),
                ("PTTL k", ":-1\r\n"),
                ("EXPIRETIME k", ":-1\r\n"),
                ("TTL nokey", ":-2\r\n"),
                ("PEXPIRETIME nokey", ":-2\r\n"),
                ("EXPIRE k 100", ":1\r\n"),
                ("TTL k", ":100\r\n"),
                ("EXPIRE k 100 NX", ":0\r\n"),
                ("EXPIRE k 200 XX", ":1\r\n"),
                ("TTL k", ":200\r\n"),
                ("EXPIRE k 50 GT", ":0\r\n"),
                ("EXPIRE k 500 GT", ":1\r\n"),
                ("EXPIRE k 600 LT", ":0\r\n"),
                ("EXPIRE k 60 LT", ":1\r\n"),
                ("TTL k", ":60\r\n"),
                (
                    "EXPIRE k 10 NX XX",
                    "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n",
                ),
                (
                    "EXPIRE k 10 nx gt",
                    "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n",
                ),
                (
                    "EXPIRE k 10 GT LT",
                    "-ERR GT and LT options at the same time are not compatible\r\n",
                ),
                ("EXPIRE k 10 foo", "-ERR Unsupported option foo\r\n"),
                (
                    "EXPIRE k abc",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                (
                    "EXPIRE k 9223372036854775807",
                    "-ERR invalid expire time in 'expire' command\r\n",
                ),
                (
                    "PEXPIRE k 9223372036854775807",
                    "-ERR invalid expire time in 'pexpire' command\r\n",
                ),
                (
                    "EXPIRE k -9223372036854775807",
                    "-ERR invalid expire time in 'expire' command\r\n",
                ),
                (
                    "EXPIREAT k 9223372036854775807",
                    "-ERR invalid expire time in 'expireat' command\r\n",
                ),
                ("PERSIST k", ":1\r\n"),
                ("PERSIST k", ":0\r\n"),
                ("PERSIST nokey", ":0\r\n"),
                ("EXPIRE k 10 XX", ":0\r\n"),
                ("EXPIRE k 10 GT", ":0\r\n"),
                ("EXPIRE k 10 LT", ":1\r\n"),
                ("EXPIRE k -1", ":1\r\n"),
                ("EXISTS k", ":0\r\n"),
                ("EXPIRE nokey 10", ":0\r\n"),
                // SET's options.
                ("SET a 1 EX 100", "+OK\r\n"),
                ("TTL a", ":100\r\n"),
                ("SET a 2 KEEPTTL", "+OK\r\n"),
                ("TTL a", ":100\r\n"),
                ("SET a 3", "+OK\r\n"),
                ("TTL a", ":-1\r\n"),
                (
                    "SET a 1 EX 0",
                    "-ERR invalid expire time in 'set' command\r\n",
                ),
                (
                    "SET a 1 EX -5",
                    "-ERR invalid expire time in 'set' command\r\n",
                ),
                (
                    "SET a 1 EX x",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("SET a 1 EX", "-ERR syntax error\r\n"),
                ("SET a 1 EX 10 PX 100", "-ERR syntax error\r\n"),
                ("SET a 1 EX 10 KEEPTTL", "-ERR syntax error\r\n"),
                ("SET a 1 KEEPTTL EX 10", "-ERR syntax error\r\n"),
                ("SET a 1 EX 10 EX 20", "+OK\r\n"),
                ("TTL a", ":20\r\n"),
                (&format!("SET a 1 EXAT {far}"), "+OK\r\n"),
                ("EXPIRETIME a", &format!(":{far}\r\n")),
                (&format!("SET a 1 PXAT {far_ms}"), "+OK\r\n"),
                ("PEXPIRETIME a", &format!(":{far_ms}\r\n")),
                ("SET a 1 EXAT 1", "+OK\r\n"),
                ("EXISTS a", ":0\r\n"),
                ("GET a", "$-1\r\n"),
                (
                    "SET a 1 EX 9223372036854775807",
                    "-ERR invalid expire time in 'set' command\r\n",
                ),
                (
                    "SET a 1 PX 9223372036854775807",
                    "-ERR invalid expire time in 'set' command\r\n",
                ),
                ("SET b x EX 100 GET", "$-1\r\n"),
                ("SET b y GET NX", "$1\r\nx\r\n"),
                ("SET b z XX GET PX 5000", "$1\r\nx\r\n"),
                ("TTL b", ":5\r\n"),
                // SETEX, PSETEX, GETEX.
                ("SETEX c 100 v", "+OK\r\n"),
                ("TTL c", ":100\r\n"),
                (
                    "SETEX c 0 v",
                    "-ERR invalid expire time in 'setex' command\r\n",
                ),
                (
                    "SETEX c x v",
                    "-ERR value is not an integer or out of range\r\n",
                ),
                ("PSETEX c 100000 v", "+OK\r\n"),
                ("TTL c", ":100\r\n"),
                (
                    "PSETEX c 0 v",
                    "-ERR invalid expire time in 'psetex' command\r\n",
                ),
                ("GETEX c", "$1\r\nv\r\n"),
                ("GETEX c PERSIST", "$1\r\nv\r\n"),
                ("TTL c", ":-1\r\n"),
                ("GETEX c EX 100", "$1\r\nv\r\n"),
                ("TTL c", ":100\r\n"),
                ("GETEX c PX 100000 PERSIST", "-ERR syntax error\r\n"),
                ("GETEX c PERSIST EX 10", "-ERR syntax error\r\n"),
                ("GETEX c KEEPTTL", "-ERR syntax error\r\n"),
                ("GETEX c NX", "-ERR syntax error\r\n"),
                (
                    "GETEX c EX 0",
                    "-ERR invalid expire time in 'getex' command\r\n",
                ),
                ("GETEX nokey EX abc", "$-1\r\n"),
                ("LPUSH l 1", ":1\r\n"),
                ("GETEX l EX 10", WRONGTYPE),
                ("GETEX c EXAT 1", "$1\r\nv\r\n"),
                ("EXISTS c", ":0\r\n"),
                // Which writes keep a time to live.
                ("SET d 1", "+OK\r\n"),
                ("EXPIRE d 100", ":1\r\n"),
                ("GETSET d 2", "$1\r\n1\r\n"),
                ("TTL d", ":-1\r\n"),
                ("EXPIRE d 100", ":1\r\n"),
                ("INCR d", ":3\r\n"),
                ("APPEND d x", ":2\r\n"),
                ("SETRANGE d 0 z", ":2\r\n"),
                ("TTL d", ":100\r\n"),
                ("MSET d 5 e 6", "+OK\r\n"),
                ("TTL d", ":-1\r\n"),
                ("EXPIRE d 100", ":1\r\n"),
                ("RENAME d f", "+OK\r\n"),
                ("TTL f", ":100\r\n"),
                ("EXISTS d", ":0\r\n"),
                ("COPY f g", ":1\r\n"),
                ("TTL g", ":100\r\n"),
                ("RPUSH L a b", ":2\r\n"),
                ("EXPIRE L 100", ":1\r\n"),
                ("RENAME L M", "+OK\r\n"),
                ("TTL M", ":100\r\n"),
                ("LPOP M", "$1\r\na\r\n"),
                ("TTL M", ":100\r\n"),
                ("LPOP M", "$1\r\nb\r\n"),
                ("TTL M", ":-2\r\n"),
                ("SET bd x EX 100", "+OK\r\n"),
                ("BITOP NOT bd g", ":1\r\n"),
                ("TTL bd", ":-1\r\n"),
                ("GETDEL f", "$1\r\n5\r\n"),
                ("TTL f", ":-2\r\n"),
                ("SET h 1", "+OK\r\n"),
                ("PEXPIREAT h 1", ":1\r\n"),
                ("EXISTS h", ":0\r\n"),
            ],
        );
        // Deadlines go with FLUSHALL and come back after it.
        check(
            svc,
            s,
            &[
                ("FLUSHALL", "+OK\r\n"),
                ("SET n 1 EX 100", "+OK\r\n"),
                ("TTL n", ":100\r\n"),
                ("DBSIZE", ":1\r\n"),
            ],
        );
        assert!(cmd(svc, s, "INFO keyspace").contains("db0:keys=1,expires=1,"));
    });
}

/// A key past its deadline reads as absent everywhere at once (lazy expiry), is deleted by the
/// first write that names it or by the active expiry, and counts in INFO's expired_keys.
#[test]
fn expired_keys_vanish() {
    on_each_engine(|svc, s| {
        for i in 0..50 {
            assert_eq!(cmd(svc, s, &format!("SET v{i} x PX 30")), "+OK\r\n");
        }
        check(
            svc,
            s,
            &[
                ("SET p x", "+OK\r\n"),
                ("RPUSH vl a", ":1\r\n"),
                ("PEXPIRE vl 30", ":1\r\n"),
                ("SET w x PX 30", "+OK\r\n"),
            ],
        );
        std::thread::sleep(std::time::Duration::from_millis(60));
        check(
            svc,
            s,
            &[
                ("GET v1", "$-1\r\n"),
                ("EXISTS v1 v2 p", ":1\r\n"),
                ("TTL v3", ":-2\r\n"),
                ("TYPE vl", "+none\r\n"),
                ("LRANGE vl 0 -1", "*0\r\n"),
                ("KEYS v*", "*0\r\n"),
                ("SCAN 0 COUNT 1000", "*2\r\n$1\r\n0\r\n*1\r\n$1\r\np\r\n"),
                ("RANDOMKEY", "$1\r\np\r\n"),
                // Not yet deleted: DBSIZE counts them, as Redis' does.
                ("DBSIZE", ":53\r\n"),
                // A write deletes the expired key it names before it runs.
                ("SET w y NX", "+OK\r\n"),
                ("TTL w", ":-1\r\n"),
                ("RPUSH vl b", ":1\r\n"),
                ("LRANGE vl 0 -1", "*1\r\n$1\r\nb\r\n"),
                ("DBSIZE", ":53\r\n"),
            ],
        );
        // The active expiry deletes the rest.
        let mut deleted = 0;
        for _ in 0..20 {
            deleted += svc
                .active_expire(std::time::Duration::from_millis(50))
                .unwrap();
        }
        assert_eq!(deleted, 50);
        check(svc, s, &[("DBSIZE", ":3\r\n"), ("GET p", "$1\r\nx\r\n")]);
        let info = cmd(svc, s, "INFO stats");
        assert!(info.contains("expired_keys:52\r\n"), "{info}");
        assert!(cmd(svc, s, "INFO keyspace").contains("db0:keys=3,expires=0,"));
    });
}

/// Deadlines are in the heap: after a restart (SHUTDOWN NOSAVE: only the engine's log and
/// cache), a key whose deadline passed while the server was down is gone and one whose
/// deadline did not pass is there, with its time to live counted from the same clock.
#[test]
fn deadlines_survive_restart() {
    let mut f = Fixture::new(Eng::Vnvm);
    let svc = service(&mut f, Durability::Commit);
    let mut s = svc.open_session("r");
    check(
        &svc,
        &mut s,
        &[
            ("SET short x PX 200", "+OK\r\n"),
            ("SET long y EX 1000", "+OK\r\n"),
            ("RPUSH list a", ":1\r\n"),
            ("PEXPIRE list 200", ":1\r\n"),
            ("SET forever z", "+OK\r\n"),
        ],
    );
    assert_eq!(
        exec(&svc, &mut s, &[&[b"SHUTDOWN", b"NOSAVE"]]),
        (String::new(), Control::Shutdown)
    );
    svc.shutdown().unwrap();
    assert!(f.reopen_from(into_heap(svc)));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let svc = service(&mut f, Durability::Commit);
    let mut s = svc.open_session("r");
    check(
        &svc,
        &mut s,
        &[
            ("GET short", "$-1\r\n"),
            ("LRANGE list 0 -1", "*0\r\n"),
            ("GET long", "$1\r\ny\r\n"),
            ("TTL forever", ":-1\r\n"),
        ],
    );
    // Counted from the same clock: 1000 s less the time since it was set (rounded).
    let ttl = cmd(&svc, &mut s, "TTL long");
    assert!(ttl == ":1000\r\n" || ttl == ":999\r\n", "{ttl}");
    assert_eq!(
        svc.active_expire(std::time::Duration::from_millis(50))
            .unwrap(),
        2
    );
    check(&svc, &mut s, &[("DBSIZE", ":2\r\n")]);
}

/// MULTI/EXEC/DISCARD/WATCH/UNWATCH: replies as redis-server 7.0 gave them for the same
/// commands from two connections (nesting, errors while queueing, commands not allowed,
/// runtime errors inside EXEC, WATCH against the other connection's writes, a no-op write, a
/// key that expires, UNWATCH, FLUSHALL of a watched key that exists and of one that does not).
#[test]
fn transactions_as_redis_7_0() {
    for eng in ENGINES {
        for d in [Durability::Commit, Durability::Pipeline] {
            let mut fx = Fixture::new(eng);
            let svc = service(&mut fx, d);
            let mut a = svc.open_session("a");
            let mut b = svc.open_session("b");
            let nil = "*-1\r\n";
            let steps: &[(bool, &str, &str)] = &[
                (true, "MULTI", "+OK\r\n"),
                (true, "MULTI", "-ERR MULTI calls can not be nested\r\n"),
                (true, "SET k 1", "+QUEUED\r\n"),
                (true, "EXEC", "*1\r\n+OK\r\n"),
                (true, "EXEC", "-ERR EXEC without MULTI\r\n"),
                (true, "DISCARD", "-ERR DISCARD without MULTI\r\n"),
                (
                    true,
                    "WATCH",
                    "-ERR wrong number of arguments for 'watch' command\r\n",
                ),
                (true, "MULTI", "+OK\r\n"),
                (
                    true,
                    "WATCH x",
                    "-ERR WATCH inside MULTI is not allowed\r\n",
                ),
                (true, "EXEC", "*0\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (
                    true,
                    "NOSUCH",
                    "-ERR unknown command 'NOSUCH', with args beginning with: \r\n",
                ),
                (
                    true,
                    "SET k",
                    "-ERR wrong number of arguments for 'set' command\r\n",
                ),
                (
                    true,
                    "EXEC",
                    "-EXECABORT Transaction discarded because of previous errors.\r\n",
                ),
                (true, "MULTI", "+OK\r\n"),
                (true, "GET k", "+QUEUED\r\n"),
                (true, "LPUSH k x", "+QUEUED\r\n"),
                (true, "INCR k", "+QUEUED\r\n"),
                (true, "EXEC", &format!("*3\r\n$1\r\n1\r\n{WRONGTYPE}:2\r\n")),
                (true, "MULTI", "+OK\r\n"),
                (
                    true,
                    "SAVE",
                    "-ERR Command not allowed inside a transaction\r\n",
                ),
                (
                    true,
                    "EXEC",
                    "-EXECABORT Transaction discarded because of previous errors.\r\n",
                ),
                (true, "MULTI", "+OK\r\n"),
                (
                    true,
                    "SHUTDOWN",
                    "-ERR Command not allowed inside a transaction\r\n",
                ),
                (
                    true,
                    "EXEC",
                    "-EXECABORT Transaction discarded because of previous errors.\r\n",
                ),
                (true, "MULTI", "+OK\r\n"),
                (true, "SELECT 0", "+QUEUED\r\n"),
                (true, "PING", "+QUEUED\r\n"),
                (true, "EXEC", "*2\r\n+OK\r\n+PONG\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "DISCARD", "+OK\r\n"),
                (true, "DISCARD", "-ERR DISCARD without MULTI\r\n"),
                // WATCH.
                (true, "SET w 1", "+OK\r\n"),
                (true, "WATCH w", "+OK\r\n"),
                (false, "SET w 2", "+OK\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "GET w", "+QUEUED\r\n"),
                (true, "EXEC", nil),
                (true, "WATCH w", "+OK\r\n"),
                (false, "SETNX w 3", ":0\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "GET w", "+QUEUED\r\n"),
                (true, "EXEC", "*1\r\n$1\r\n2\r\n"),
                (true, "WATCH nokey2", "+OK\r\n"),
                (false, "SET nokey2 1", "+OK\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "PING", "+QUEUED\r\n"),
                (true, "EXEC", nil),
                (true, "WATCH w", "+OK\r\n"),
                (true, "UNWATCH", "+OK\r\n"),
                (false, "SET w 9", "+OK\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "GET w", "+QUEUED\r\n"),
                (true, "EXEC", "*1\r\n$1\r\n9\r\n"),
                (true, "WATCH w", "+OK\r\n"),
                (true, "SET w 10", "+OK\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "GET w", "+QUEUED\r\n"),
                (true, "EXEC", nil),
                (true, "WATCH w", "+OK\r\n"),
                (false, "FLUSHALL", "+OK\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "PING", "+QUEUED\r\n"),
                (true, "EXEC", nil),
                (true, "WATCH w", "+OK\r\n"),
                (false, "FLUSHALL", "+OK\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "PING", "+QUEUED\r\n"),
                (true, "EXEC", "*1\r\n+PONG\r\n"),
                (true, "MULTI", "+OK\r\n"),
                (true, "WAIT 0 0", "+QUEUED\r\n"),
                (true, "EXEC", "*1\r\n:0\r\n"),
                // A watched key that expires fails the EXEC.
                (true, "SET e 1 PX 30", "+OK\r\n"),
                (true, "WATCH e", "+OK\r\n"),
            ];
            for (on_a, line, want) in steps {
                let s = if *on_a { &mut a } else { &mut b };
                assert_eq!(cmd(&svc, s, line), *want, "{line} ({eng:?}, {d:?})");
            }
            std::thread::sleep(std::time::Duration::from_millis(60));
            check(
                &svc,
                &mut a,
                &[("MULTI", "+OK\r\n"), ("PING", "+QUEUED\r\n"), ("EXEC", nil)],
            );
            // A pipeline: the writes inside EXEC are one transaction, reads see them.
            let (out, _) = exec(
                &svc,
                &mut a,
                &[
                    &[b"MULTI"],
                    &[b"SET", b"p", b"1"],
                    &[b"INCR", b"p"],
                    &[b"GET", b"p"],
                    &[b"EXEC"],
                    &[b"GET", b"p"],
                ],
            );
            assert_eq!(
                out,
                "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n:2\r\n$1\r\n2\r\n$1\r\n2\r\n"
            );
        }
    }
}

/// An EXEC that cannot fit the log fails whole: nothing it queued is changed.
#[test]
fn an_exec_too_large_changes_nothing() {
    let mut fx = Fixture::new(Eng::Volatile);
    let mut heap = fx.take();
    heap.set_max_tx_bytes(64 << 10);
    let svc = KvService::new(heap, Durability::Commit).unwrap();
    let mut s = svc.open_session("t");
    check(
        &svc,
        &mut s,
        &[
            ("SET a old", "+OK\r\n"),
            ("MULTI", "+OK\r\n"),
            ("SET a new", "+QUEUED\r\n"),
        ],
    );
    let big = "x".repeat(40 << 10);
    for i in 0..4 {
        assert_eq!(
            cmd(&svc, &mut s, &format!("SET big{i} {big}")),
            "+QUEUED\r\n"
        );
    }
    let r = cmd(&svc, &mut s, "EXEC");
    assert!(
        r.starts_with("-ERR command too large for one transaction"),
        "{r}"
    );
    check(
        &svc,
        &mut s,
        &[("GET a", "$3\r\nold\r\n"), ("EXISTS big0", ":0\r\n")],
    );
}

/// SELECT, MOVE, SWAPDB, COPY ... DB, FLUSHDB against FLUSHALL, and WATCH across databases:
/// replies as redis-server 7.0.15 gave them for the same commands from two connections.
#[test]
fn databases_as_redis_7_0() {
    for eng in ENGINES {
        let mut fx = Fixture::new(eng);
        let svc = service(&mut fx, Durability::Commit);
        let mut a = svc.open_session("a");
        let mut b = svc.open_session("b");
        let steps: &[(bool, &str, &str)] = &[
            (true, "flushall", "+OK\r\n"),
            (true, "select 1", "+OK\r\n"),
            (true, "set k one", "+OK\r\n"),
            (true, "get k", "$3\r\none\r\n"),
            (true, "select 0", "+OK\r\n"),
            (true, "get k", "$-1\r\n"),
            (true, "set k zero", "+OK\r\n"),
            (true, "select 16", "-ERR DB index is out of range\r\n"),
            (true, "select -1", "-ERR DB index is out of range\r\n"),
            (
                true,
                "select x",
                "-ERR value is not an integer or out of range\r\n",
            ),
            (true, "select 15", "+OK\r\n"),
            (true, "dbsize", ":0\r\n"),
            (true, "select 0", "+OK\r\n"),
            (true, "move k 1", ":0\r\n"),
            (true, "move k 2", ":1\r\n"),
            (true, "get k", "$-1\r\n"),
            (true, "select 2", "+OK\r\n"),
            (true, "get k", "$4\r\nzero\r\n"),
            (true, "select 0", "+OK\r\n"),
            (
                true,
                "move k 0",
                "-ERR source and destination objects are the same\r\n",
            ),
            (true, "move nokey 1", ":0\r\n"),
            (true, "move k 16", "-ERR DB index is out of range\r\n"),
            (
                true,
                "move k x",
                "-ERR value is not an integer or out of range\r\n",
            ),
            (true, "set m 1 EX 100", "+OK\r\n"),
            (true, "move m 3", ":1\r\n"),
            (true, "select 3", "+OK\r\n"),
            (true, "ttl m", ":100\r\n"),
            (true, "get m", "$1\r\n1\r\n"),
            (true, "select 0", "+OK\r\n"),
            (true, "rpush L a b", ":2\r\n"),
            (true, "move L 4", ":1\r\n"),
            (true, "select 4", "+OK\r\n"),
            (true, "lrange L 0 -1", "*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
            (true, "select 0", "+OK\r\n"),
            (true, "exists L", ":0\r\n"),
            (true, "swapdb 0 1", "+OK\r\n"),
            (true, "get k", "$3\r\none\r\n"),
            (true, "select 1", "+OK\r\n"),
            (true, "get k", "$-1\r\n"),
            (true, "select 0", "+OK\r\n"),
            (true, "swapdb 0 16", "-ERR DB index is out of range\r\n"),
            (true, "swapdb x 1", "-ERR invalid first DB index\r\n"),
            (true, "swapdb 1 x", "-ERR invalid second DB index\r\n"),
            (true, "swapdb -1 0", "-ERR DB index is out of range\r\n"),
            (true, "swapdb 5 5", "+OK\r\n"),
            (true, "set c v EX 100", "+OK\r\n"),
            (true, "copy c c db 1", ":1\r\n"),
            (
                true,
                "copy c c",
                "-ERR source and destination objects are the same\r\n",
            ),
            (true, "copy c c2 db 7", ":1\r\n"),
            (true, "select 7", "+OK\r\n"),
            (true, "get c2", "$1\r\nv\r\n"),
            (true, "ttl c2", ":100\r\n"),
            (true, "select 0", "+OK\r\n"),
            (true, "copy c c db 1", ":0\r\n"),
            (true, "copy c c db 1 replace", ":1\r\n"),
            (true, "copy c x db 16", "-ERR DB index is out of range\r\n"),
            (
                true,
                "copy c x db y",
                "-ERR value is not an integer or out of range\r\n",
            ),
            (true, "select 1", "+OK\r\n"),
            (true, "flushdb", "+OK\r\n"),
            (true, "dbsize", ":0\r\n"),
            (true, "select 0", "+OK\r\n"),
            (true, "dbsize", ":2\r\n"),
            (true, "select 2", "+OK\r\n"),
            (true, "set w 1", "+OK\r\n"),
            (true, "watch w", "+OK\r\n"),
            (false, "set w x", "+OK\r\n"),
            (true, "multi", "+OK\r\n"),
            (true, "ping", "+QUEUED\r\n"),
            (true, "exec", "*1\r\n+PONG\r\n"),
            (true, "watch w", "+OK\r\n"),
            (false, "select 2", "+OK\r\n"),
            (false, "set w y", "+OK\r\n"),
            (true, "multi", "+OK\r\n"),
            (true, "ping", "+QUEUED\r\n"),
            (true, "exec", "*-1\r\n"),
            (true, "watch w", "+OK\r\n"),
            (false, "swapdb 2 9", "+OK\r\n"),
            (true, "multi", "+OK\r\n"),
            (true, "ping", "+QUEUED\r\n"),
            (true, "exec", "*-1\r\n"),
            (true, "multi", "+OK\r\n"),
            (true, "select 5", "+QUEUED\r\n"),
            (true, "set in5 v", "+QUEUED\r\n"),
            (true, "exec", "*2\r\n+OK\r\n+OK\r\n"),
            (true, "get in5", "$1\r\nv\r\n"),
            (true, "select 5", "+OK\r\n"),
            (true, "get in5", "$1\r\nv\r\n"),
            (true, "flushall", "+OK\r\n"),
            (true, "select 9", "+OK\r\n"),
            (true, "dbsize", ":0\r\n"),
        ];
        for (on_a, line, want) in steps {
            let s = if *on_a { &mut a } else { &mut b };
            assert_eq!(cmd(&svc, s, line), *want, "{line} ({eng:?})");
        }
    }
}

/// Databases and their deadlines live in the heap: after a restart each key is back in its
/// database with its time to live, and SWAPDB's exchange stays made.
#[test]
fn databases_survive_restart() {
    let mut f = Fixture::new(Eng::Vnvm);
    let svc = service(&mut f, Durability::Commit);
    let mut s = svc.open_session("r");
    check(
        &svc,
        &mut s,
        &[
            ("SELECT 3", "+OK\r\n"),
            ("SET k three EX 1000", "+OK\r\n"),
            ("SELECT 4", "+OK\r\n"),
            ("RPUSH l a b", ":2\r\n"),
            ("SWAPDB 4 12", "+OK\r\n"),
        ],
    );
    svc.shutdown().unwrap();
    assert!(f.reopen_from(into_heap(svc)));
    let svc = service(&mut f, Durability::Commit);
    let mut s = svc.open_session("r");
    check(
        &svc,
        &mut s,
        &[
            ("GET k", "$-1\r\n"),
            ("SELECT 3", "+OK\r\n"),
            ("GET k", "$5\r\nthree\r\n"),
            ("SELECT 4", "+OK\r\n"),
            ("EXISTS l", ":0\r\n"),
            ("SELECT 12", "+OK\r\n"),
            ("LRANGE l 0 -1", "*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
        ],
    );
    let info = cmd(&svc, &mut s, "INFO keyspace");
    assert!(
        info.contains("db3:keys=1,expires=1,") && info.contains("db12:keys=1,expires=0,"),
        "{info}"
    );
    assert!(cmd(&svc, &mut s, "TTL k").starts_with(":-2"));
}

/// A server session's replies may leave before the round ends (`replies_ready`) only while no
/// write waits for durability: after a vnvm write, not until `round_end` made it durable — a
/// GET that read it waits too; the volatile engine has nothing to wait for.
#[test]
fn replies_wait_for_the_round_only_while_a_write_is_not_durable() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let svc = service(&mut f, Durability::Pipeline);
        let mut s = svc.open_session_with("r", tiermem_kv::server::ConnHandle::detached());
        assert!(svc.replies_ready(), "{eng:?}: nothing written yet");
        assert_eq!(cmd(&svc, &mut s, "SET k v"), "+OK\r\n");
        assert_eq!(cmd(&svc, &mut s, "GET k"), "$1\r\nv\r\n");
        let volatile = matches!(eng, Eng::Volatile);
        assert_eq!(svc.replies_ready(), volatile, "{eng:?}: after a write");
        assert!(svc.round_end());
        assert!(svc.replies_ready(), "{eng:?}: after the round's barrier");
        assert_eq!(cmd(&svc, &mut s, "GET k"), "$1\r\nv\r\n");
        assert!(svc.replies_ready(), "{eng:?}: a read writes nothing");
    }
}
