//! Damaged kv heaps (issue #13, defect 3): random bit flips and byte changes in a heap holding
//! every data type in every encoding, then every read command over every key. Zero panics,
//! zero torn replies (each reply is one complete RESP value), and every reply is the undamaged
//! one, an error, or what a flip in stored *data* explains (see `judge`).
//!
//! Seeded and bounded: `TIERMEM_KV_FLIP_CASES` cases (default 300), `TIERMEM_KV_FLIP_SEED`.

mod common;

use common::{Eng, Fixture, Rng};
use tiermem_kv::commands::{Durability, KvService};
use tiermem_kv::ds::{Store, Wtx};
use tiermem_kv::heap::Heap;
use tiermem_kv::server::Service;

/// One parsed RESP value, reduced to its shape: what a flip in stored bytes (a value, a
/// member, a score, a counter) may change without a checksum to notice is the contents of
/// bulk strings, integers and simple strings; never the structure.
#[derive(Debug, PartialEq)]
enum Shape {
    Simple,
    Error,
    Int,
    Bulk,
    Null,
    Array(Vec<Shape>),
}

/// Parse one RESP value at `b[*i..]`; `None` if incomplete or malformed.
fn parse(b: &[u8], i: &mut usize) -> Option<Shape> {
    let t = *b.get(*i)?;
    let end = (*i..b.len().saturating_sub(1)).find(|&j| b[j] == b'\r' && b[j + 1] == b'\n')?;
    let line = std::str::from_utf8(&b[*i + 1..end]).ok()?;
    *i = end + 2;
    match t {
        b'+' => Some(Shape::Simple),
        b'-' => Some(Shape::Error),
        b':' => line.parse::<i64>().ok().map(|_| Shape::Int),
        b'$' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                return Some(Shape::Null);
            }
            let n = n as usize;
            if b.len() < *i + n + 2 || &b[*i + n..*i + n + 2] != b"\r\n" {
                return None;
            }
            *i += n + 2;
            Some(Shape::Bulk)
        }
        b'*' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                return Some(Shape::Null);
            }
            let mut v = Vec::new();
            for _ in 0..n {
                v.push(parse(b, i)?);
            }
            Some(Shape::Array(v))
        }
        _ => None,
    }
}

/// The shape of a whole reply, which must be exactly one complete RESP value.
fn shape(reply: &[u8]) -> Option<Shape> {
    let mut i = 0;
    let s = parse(reply, &mut i)?;
    (i == reply.len()).then_some(s)
}

fn words(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|w| w.as_bytes().to_vec()).collect()
}

fn exec(svc: &KvService, s: &mut <KvService as Service>::Session, cmd: &[Vec<u8>]) -> Vec<u8> {
    let req: Vec<&[u8]> = cmd.iter().map(|w| w.as_slice()).collect();
    let mut out = Vec::new();
    svc.execute(s, &[req], &mut out, usize::MAX);
    out
}

/// Every data type in every encoding.
fn populate(svc: &KvService) {
    let mut s = svc.open_session("populate");
    let mut run = |cmd: Vec<Vec<u8>>| {
        let r = exec(svc, &mut s, &cmd);
        assert!(
            !r.starts_with(b"-"),
            "{:?}: {}",
            cmd[0],
            String::from_utf8_lossy(&r)
        );
    };
    run(words("SET s:small hello"));
    run(words("SET s:int 12345"));
    run(vec![b"SET".to_vec(), b"s:mid".to_vec(), vec![b'm'; 3000]]);
    run(vec![
        b"SET".to_vec(),
        b"s:blob".to_vec(),
        vec![b'B'; 66_000],
    ]);
    for i in 0..12 {
        run(words(&format!("SET f:{i} v{i}")));
    }
    run(words("RPUSH l:small a b c d e"));
    let mut big = vec![b"RPUSH".to_vec(), b"l:big".to_vec()];
    big.extend((0..1500).map(|i| format!("element-{i:05}").into_bytes()));
    run(big);
    run(words("LPUSH l:big head1 head2"));
    let mut long = vec![b"RPUSH".to_vec(), b"l:long".to_vec()];
    long.extend((0..6).map(|i| vec![b'a' + i as u8; 300]));
    run(long);
    run(words("SADD set:small m1 m2 m3 m4 m5 m6"));
    let mut sbig = vec![b"SADD".to_vec(), b"set:big".to_vec()];
    sbig.extend((0..300).map(|i| format!("m{i}").into_bytes()));
    run(sbig);
    run(vec![
        b"SADD".to_vec(),
        b"set:long".to_vec(),
        vec![b'x'; 300],
        b"m1".to_vec(),
    ]);
    run(words("HSET h:small f1 v1 f2 v2 f3 v3"));
    let mut hbig = vec![b"HSET".to_vec(), b"h:big".to_vec()];
    for i in 0..300 {
        hbig.push(format!("f{i}").into_bytes());
        hbig.push(format!("value-{i}").into_bytes());
    }
    run(hbig);
    run(vec![
        b"HSET".to_vec(),
        b"h:long".to_vec(),
        b"f1".to_vec(),
        vec![b'v'; 300],
    ]);
    run(words("ZADD z:small 1 m1 2 m2 3 m3 4.5 m4"));
    let mut zbig = vec![b"ZADD".to_vec(), b"z:big".to_vec()];
    for i in 0..400 {
        zbig.push(format!("{}", (i * 7919) % 1000).into_bytes());
        zbig.push(format!("m{i}").into_bytes());
    }
    run(zbig);
}

const KEYS: &[&str] = &[
    "s:small",
    "s:int",
    "s:mid",
    "s:blob",
    "f:3",
    "l:small",
    "l:big",
    "l:long",
    "set:small",
    "set:big",
    "set:long",
    "h:small",
    "h:big",
    "h:long",
    "z:small",
    "z:big",
];

/// Read commands over one key `K`. Those marked `~` select by stored data (a score range, a
/// member or field looked up): a flip in a score or a member legitimately changes which
/// elements they return, so their reply may also be any subset-shaped answer (see `judge`).
const PER_KEY: &[&str] = &[
    "GET K",
    "STRLEN K",
    "TYPE K",
    "EXISTS K",
    "TTL K",
    "OBJECT ENCODING K",
    "~MGET K s:small",
    "LRANGE K 0 -1",
    "LRANGE K 3 40",
    "LRANGE K -30 -1",
    "LLEN K",
    "~LINDEX K 0",
    "~LINDEX K -1",
    "~LINDEX K 700",
    "SMEMBERS K",
    "SCARD K",
    "~SISMEMBER K m5",
    "~SMISMEMBER K m1 m2 nope",
    "HGETALL K",
    "HKEYS K",
    "HVALS K",
    "HLEN K",
    "~HGET K f3",
    "~HMGET K f1 f2 nope",
    "~HEXISTS K f1",
    "ZRANGE K 0 -1 WITHSCORES",
    "ZREVRANGE K 0 5",
    "ZRANGE K 10 20",
    "~ZRANGEBYSCORE K -inf +inf WITHSCORES",
    "~ZREVRANGEBYSCORE K +inf -inf LIMIT 0 10",
    "~ZRANGEBYSCORE K 100 300",
    "ZCARD K",
    "~ZSCORE K m3",
    "~ZCOUNT K 0 500",
];

/// Commands over the whole keyspace (`~` as for [`PER_KEY`]: a flipped key byte changes what
/// a pattern matches).
const GLOBAL: &[&str] = &[
    "DBSIZE",
    "KEYS *",
    "SCAN 0 COUNT 100000",
    "~SCAN 0 MATCH s:* COUNT 100000",
    "SCAN 0 COUNT 3",
];

/// A read command: its words, its words over a missing key (`None` for global ones), and
/// whether it selects by stored data (`~`).
struct Cmd {
    words: Vec<Vec<u8>>,
    missing: Option<Vec<Vec<u8>>>,
    by_data: bool,
}

/// Every read command over every key.
fn commands() -> Vec<Cmd> {
    let mut v = Vec::new();
    for k in KEYS {
        for c in PER_KEY {
            let (by_data, c) = match c.strip_prefix('~') {
                Some(c) => (true, c),
                None => (false, *c),
            };
            v.push(Cmd {
                words: words(&c.replace('K', k)),
                missing: Some(words(&c.replace('K', "missing:key"))),
                by_data,
            });
        }
    }
    for c in GLOBAL {
        let (by_data, c) = match c.strip_prefix('~') {
            Some(c) => (true, c),
            None => (false, *c),
        };
        v.push(Cmd {
            words: words(c),
            missing: None,
            by_data,
        });
    }
    v
}

/// Whether `got`, a complete reply that differs from the undamaged `want` and is no error,
/// is what a flip in stored data explains: the same shape (a value, member, score, counter
/// changed), the reply for a missing key (a key's hash or bytes changed), or for commands that
/// select by data, an array of the reference's element shapes (another subset selected) or a
/// nil/integer where the reference had a value.
fn judge(got: &Shape, want: &Shape, missing: Option<&Shape>, by_data: bool) -> bool {
    if got == want || Some(got) == missing {
        return true;
    }
    if !by_data {
        return false;
    }
    subset_shaped(got, want)
}

/// `got` could be `want` with other elements selected: arrays whose elements are each nil or
/// subset-shaped like one of `want`'s, nil or a value where a value was.
fn subset_shaped(got: &Shape, want: &Shape) -> bool {
    match (got, want) {
        (Shape::Array(g), Shape::Array(w)) => g
            .iter()
            .all(|e| *e == Shape::Null || w.is_empty() || w.iter().any(|x| subset_shaped(e, x))),
        (Shape::Null | Shape::Bulk, Shape::Null | Shape::Bulk) => true,
        (g, w) => g == w,
    }
}

/// The heap's used extent: past its last non-zero byte.
fn used_extent(heap: &Heap) -> u64 {
    let v = heap.view();
    let last = v.iter().rposition(|&b| b != 0).unwrap_or(0);
    (last as u64 + 64).min(v.len() as u64)
}

/// Write `bytes` at `off` in one committed transaction (the flip, or its undoing).
fn poke(heap: &Heap, root: u64, off: u64, bytes: &[u8]) {
    let mut w = Wtx::new(heap, root);
    w.write(off, bytes).unwrap();
    w.commit().unwrap();
}

#[test]
fn flipped_heap_bytes_give_errors_or_data_never_panics_or_torn_replies() {
    let cases: u64 = std::env::var("TIERMEM_KV_FLIP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let seed: u64 = std::env::var("TIERMEM_KV_FLIP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xf11b_5eed);
    // A reproducible layout: the hash seed and the skiplist levels follow `seed`.
    tiermem_kv::ds::set_creation_seed(seed);
    tiermem_kv::ds::seed_rand(seed);
    let mut f = Fixture::sized(Eng::Volatile, 8 << 20, 4 << 20);
    let svc = KvService::new(f.take(), Durability::Commit).unwrap();
    populate(&svc);
    let cmds = commands();
    let mut s = svc.open_session("reference");
    let reference: Vec<(Vec<u8>, Option<Shape>)> = cmds
        .iter()
        .map(|c| {
            let r = exec(&svc, &mut s, &c.words);
            assert!(
                shape(&r).is_some(),
                "reference reply of {:?} is not RESP",
                c.words
            );
            let missing = c
                .missing
                .as_ref()
                .map(|m| shape(&exec(&svc, &mut s, m)).unwrap());
            (r, missing)
        })
        .collect();
    drop(s);
    let root = svc.store().root;
    let mut heap = Some(svc.into_heap());
    let hi = used_extent(heap.as_ref().unwrap());
    let lo = tiermem_vnvm::alloc::HEAP_HEADER;
    let mut rng = Rng(seed);
    let (mut refused, mut errors, mut same, mut data_changes) = (0u64, 0u64, 0u64, 0u64);
    let mut wrong = Vec::new();
    for case in 0..cases {
        let h = heap.take().unwrap();
        let off = lo + rng.below(hi - lo);
        let old = h.view()[off as usize];
        let new = if rng.chance(50) {
            old ^ (1 << rng.below(8))
        } else {
            match rng.below(4) {
                0 => 0,
                1 => 0xff,
                _ => (rng.next() as u8).max(1) ^ old,
            }
        };
        if new == old {
            heap = Some(h);
            continue;
        }
        poke(&h, root, off, &[new]);
        if Store::open(&h).is_err() {
            // A damaged root object: refused at open, with a clear error.
            refused += 1;
            poke(&h, root, off, &[old]);
            heap = Some(h);
            continue;
        }
        let svc = KvService::new(h, Durability::Commit).unwrap();
        let mut s = svc.open_session("flip");
        for (c, (want, want_missing)) in cmds.iter().zip(&reference) {
            let got = exec(&svc, &mut s, &c.words);
            let Some(sh) = shape(&got) else {
                panic!(
                    "case {case}: flip at {off} ({old:#04x} -> {new:#04x}): torn or malformed \
                     reply to {:?}: {:?}",
                    String::from_utf8_lossy(&c.words.join(&b' ')),
                    String::from_utf8_lossy(&got[..got.len().min(300)])
                );
            };
            if got == *want {
                same += 1;
            } else if sh == Shape::Error {
                errors += 1;
                let text = String::from_utf8_lossy(&got);
                assert!(
                    text.starts_with("-ERR damaged heap at offset ")
                        || text.starts_with("-WRONGTYPE"),
                    "case {case}: unexpected error {text}"
                );
            } else if judge(&sh, &shape(want).unwrap(), want_missing.as_ref(), c.by_data) {
                // A flip in stored data: undetectable without checksums over the heap's
                // objects (on disk, vnvm's page checksums find it).
                data_changes += 1;
            } else {
                eprintln!(
                    "case {case}: flip at {off} ({old:#04x} -> {new:#04x}): wrong reply to {:?}",
                    String::from_utf8_lossy(&c.words.join(&b' '))
                );
                wrong.push(format!(
                    "case {case}: flip at {off} ({old:#04x} -> {new:#04x}): {:?} gave {:?}, \
                     undamaged {:?}",
                    String::from_utf8_lossy(&c.words.join(&b' ')),
                    String::from_utf8_lossy(&got[..got.len().min(200)]),
                    String::from_utf8_lossy(&want[..want.len().min(200)]),
                ));
            }
        }
        drop(s);
        let h = svc.into_heap();
        poke(&h, root, off, &[old]);
        heap = Some(h);
    }
    eprintln!(
        "{cases} flips over {} heap bytes: {refused} refused at open; replies: {same} as \
         undamaged, {errors} errors, {data_changes} explained by changed data, {} wrong",
        hi - lo,
        wrong.len()
    );
    assert!(wrong.is_empty(), "wrong replies:\n{}", wrong.join("\n"));
}

/// Write commands over every type, run after the flip: no panic, each reply one complete RESP
/// value (an error or the command's reply); then every read command again.
const WRITES: &[&str] = &[
    "SET w:new v",
    "SET s:small longer-value-than-before",
    "APPEND s:mid x",
    "INCR s:int",
    "LPUSH l:big x",
    "RPOP l:long",
    "LPOP l:big 3",
    "LSET l:small 1 q",
    "SADD set:big q",
    "SREM set:small m1",
    "SPOP set:small",
    "SPOP set:big 2",
    "HSET h:small f9 v",
    "HDEL h:big f1 f2",
    "HSET h:long f1 short",
    "ZADD z:big 5 q",
    "ZINCRBY z:small 10 m1",
    "ZREM z:big m5",
    "ZPOPMIN z:small",
    "DEL l:small",
    "DEL z:big",
    "FLUSHALL",
];

#[test]
fn writes_over_a_flipped_heap_never_panic() {
    let cases: u64 = std::env::var("TIERMEM_KV_FLIP_CASES")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(60, |n| n / 5);
    let seed: u64 = std::env::var("TIERMEM_KV_FLIP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x3e17_5eed);
    let mut rng = Rng(seed);
    let cmds = commands();
    let (mut refused, mut errors) = (0u64, 0u64);
    for case in 0..cases {
        tiermem_kv::ds::set_creation_seed(seed ^ case);
        tiermem_kv::ds::seed_rand(seed ^ case);
        let mut f = Fixture::sized(Eng::Volatile, 8 << 20, 4 << 20);
        let svc = KvService::new(f.take(), Durability::Commit).unwrap();
        populate(&svc);
        let root = svc.store().root;
        let h = svc.into_heap();
        let (lo, hi) = (tiermem_vnvm::alloc::HEAP_HEADER, used_extent(&h));
        // A few flips at once.
        for _ in 0..1 + rng.below(3) {
            let off = lo + rng.below(hi - lo);
            let old = h.view()[off as usize];
            poke(&h, root, off, &[old ^ (1 << rng.below(8))]);
        }
        if Store::open(&h).is_err() {
            refused += 1;
            continue;
        }
        // Odd cases: group commit, the writes as one pipeline (one transaction).
        let group = case % 2 == 1;
        let d = if group {
            Durability::Pipeline
        } else {
            Durability::Commit
        };
        let svc = KvService::new(h, d).unwrap();
        let mut s = svc.open_session("flip");
        if group {
            let cmds: Vec<Vec<Vec<u8>>> = WRITES.iter().map(|w| words(w)).collect();
            let reqs: Vec<Vec<&[u8]>> = cmds
                .iter()
                .map(|c| c.iter().map(|w| w.as_slice()).collect())
                .collect();
            let mut out = Vec::new();
            svc.execute(&mut s, &reqs, &mut out, usize::MAX);
            let mut i = 0;
            for c in &cmds {
                let start = i;
                if parse(&out, &mut i).is_none() {
                    panic!(
                        "case {case}: torn or malformed reply to {:?} in a pipeline: {:?}",
                        String::from_utf8_lossy(&c.join(&b' ')),
                        String::from_utf8_lossy(&out[start..out.len().min(start + 300)])
                    );
                }
                errors += (out[start] == b'-') as u64;
            }
            assert_eq!(i, out.len(), "case {case}: one reply per command");
        }
        let all = WRITES
            .iter()
            .map(|w| words(w))
            .chain(cmds.iter().map(|c| c.words.clone()));
        for c in all {
            let got = exec(&svc, &mut s, &c);
            if shape(&got).is_none() {
                panic!(
                    "case {case}: torn or malformed reply to {:?}: {:?}",
                    String::from_utf8_lossy(&c.join(&b' ')),
                    String::from_utf8_lossy(&got[..got.len().min(300)])
                );
            }
            errors += got.starts_with(b"-") as u64;
        }
    }
    eprintln!("{cases} cases of writes over flipped heaps: {refused} refused at open, {errors} error replies");
}
