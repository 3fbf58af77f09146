//! The generic key commands (Redis' "keyspace" group): DEL, UNLINK, EXISTS, TOUCH, TYPE,
//! RANDOMKEY, KEYS, SCAN, RENAME, RENAMENX, COPY, MOVE, OBJECT, the EXPIRE and TTL families and
//! PERSIST; and the commands over whole databases: DBSIZE, FLUSHALL, FLUSHDB, SWAPDB.

use super::data::{glob, invalid_expire, is, parse_i64, set_ttl, Counters, HResult};
use super::reply::{self, array, bulk, int, not_int, null, syntax};
use super::table::Id;
use super::value;
use crate::ds::hash::HashObj;
use crate::ds::keyspace::{self as ks, Entry, T_HASH, T_LIST, T_SET, T_STRING, T_ZSET};
use crate::ds::set::SetObj;
use crate::ds::{dict, expire, garbage, hash, set, zset, Mem, Store, Wtx};

/// OBJECT ENCODING|FREQ|IDLETIME|REFCOUNT|HELP, with Redis 7.0's replies and errors.
pub(super) fn object<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    const HELP: [&str; 15] = [
        "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "ENCODING <key>",
        "    Return the kind of internal representation used in order to store the value",
        "    associated with a <key>.",
        "FREQ <key>",
        "    Return the access frequency index of the <key>. The returned integer is",
        "    proportional to the logarithm of the recent access frequency of the key.",
        "IDLETIME <key>",
        "    Return the idle time of the <key>, that is the approximated number of",
        "    seconds elapsed since the last access to the key.",
        "REFCOUNT <key>",
        "    Return the number of references of the value associated with the specified",
        "    <key>.",
        "HELP",
        "    Prints this help.",
    ];
    let sub = a[1].to_ascii_lowercase();
    let want = match sub.as_slice() {
        b"help" => 2,
        b"encoding" | b"freq" | b"idletime" | b"refcount" => 3,
        _ => {
            return reply::error(
                out,
                &format!(
                    "ERR unknown subcommand '{}'. Try OBJECT HELP.",
                    String::from_utf8_lossy(a[1])
                ),
            )
        }
    };
    if a.len() != want {
        return reply::error(
            out,
            &format!(
                "ERR wrong number of arguments for 'object|{}' command",
                String::from_utf8_lossy(&sub)
            ),
        );
    }
    if want == 2 {
        array(out, HELP.len());
        for l in HELP {
            crate::resp::simple_string(out, l.as_bytes());
        }
        return;
    }
    let Some(e) = ks::lookup(m, st, a[2]) else {
        return null(out);
    };
    match sub.as_slice() {
        b"encoding" => bulk(out, encoding_name(m, &e).as_bytes()),
        // What Redis replies under its default maxmemory-policy (the only one here).
        b"freq" => reply::error(
            out,
            "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please \
             note that when switching between policies at runtime LRU and LFU data will take \
             some time to adjust.",
        ),
        b"idletime" => int(out, super::access::idle_seconds(st.db, a[2]) as i64),
        _ => {
            // Redis shares the objects of the integers 0..9999: their refcount is INT_MAX.
            let shared = e.ty() == T_STRING
                && parse_canonical_i64(&ks::string_value(m, &e))
                    .is_some_and(|v| (0..10_000).contains(&v));
            int(out, if shared { i32::MAX as i64 } else { 1 })
        }
    }
}

/// `b` as Redis's string2ll accepts it for an integer encoding: a canonical decimal i64 (no
/// sign on 0, no leading zeros or blanks, at most 20 characters).
fn parse_canonical_i64(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    let v: i64 = std::str::from_utf8(b).ok()?.parse().ok()?;
    (v.to_string().as_bytes() == b).then_some(v)
}

/// What Redis 7.0 with the configured thresholds (`config::thresholds`, CONFIG SET; Redis's
/// defaults shown) would call a value like `e`'s: strings `int` (a canonical integer),
/// `embstr` (up to 44 bytes) or `raw`; lists `quicklist`; sets `intset` (at most 512 integer
/// members) or `hashtable`; hashes `listpack` (at most 512 fields, each field and value at
/// most 64 bytes) or `hashtable`; sorted sets `listpack` (at most 128 members of at most 64
/// bytes) or `skiplist`. Judged from the value as it is now:
/// unlike Redis, a value that shrinks back under a threshold reads as compact again.
fn encoding_name<M: Mem>(m: &M, e: &Entry) -> &'static str {
    let t = crate::config::thresholds();
    match e.ty() {
        T_STRING => {
            let v = ks::string_value(m, e);
            if parse_canonical_i64(&v).is_some() {
                "int"
            } else if v.len() <= 44 {
                "embstr"
            } else {
                "raw"
            }
        }
        T_LIST => "quicklist",
        T_SET => {
            let s = SetObj {
                enc: e.enc(),
                obj: e.obj(),
            };
            let mut ints = set::card(m, s) <= t.set_max_intset_entries;
            if ints {
                set::for_each(m, s, |x| ints &= parse_canonical_i64(x).is_some());
            }
            if ints {
                "intset"
            } else {
                "hashtable"
            }
        }
        T_HASH => {
            let h = HashObj {
                enc: e.enc(),
                obj: e.obj(),
            };
            let mut small = hash::len(m, h) <= t.hash_max_listpack_entries;
            if small {
                hash::for_each(m, h, |f, v| {
                    small &= f.len() as u64 <= t.hash_max_listpack_value
                        && v.len() as u64 <= t.hash_max_listpack_value
                });
            }
            if small {
                "listpack"
            } else {
                "hashtable"
            }
        }
        T_ZSET => {
            let n = zset::len(m, e.obj());
            let mut small = n <= t.zset_max_listpack_entries;
            if small && n > 0 {
                zset::range_by_rank(m, e.obj(), 0, n - 1, false, |x, _| {
                    small &= x.len() as u64 <= t.zset_max_listpack_value
                });
            }
            if small {
                "listpack"
            } else {
                "skiplist"
            }
        }
        _ => "unknown",
    }
}

/// SCAN.
pub(super) fn scan<M: Mem>(_cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(cursor) = std::str::from_utf8(a[1])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return reply::error(out, "ERR invalid cursor");
    };
    let (mut pat, mut count, mut ty): (Option<&[u8]>, u64, Option<&[u8]>) = (None, 10, None);
    let mut i = 2;
    while i < a.len() {
        if i + 1 >= a.len() {
            return syntax(out);
        }
        if is(a[i], "MATCH") {
            pat = Some(a[i + 1]);
        } else if is(a[i], "COUNT") {
            match parse_i64(a[i + 1]) {
                Some(c) if c >= 1 => count = c as u64,
                Some(_) => return syntax(out),
                None => return not_int(out),
            }
        } else if is(a[i], "TYPE") {
            ty = Some(a[i + 1]);
        } else {
            return syntax(out);
        }
        i += 2;
    }
    // The cursor is a bucket index (`dict::scan`).
    let d = st.keyspace();
    let mut keys = Vec::new();
    let mut n = 0;
    let mut stale = 0;
    let next = dict::scan(m, d, cursor, count, |e| {
        let k = ks::key_of(m, e);
        let ent = ks::entry_at(m, e);
        if expire::expired(m, st, &ent) {
            stale += 1;
            return;
        }
        let ok_pat = pat.map_or(true, |p| glob(p, &k));
        let ok_ty = ty.map_or(true, |t| {
            t.eq_ignore_ascii_case(ks::type_name(ent.ty()).as_bytes())
        });
        if ok_pat && ok_ty {
            bulk(&mut keys, &k);
            n += 1;
        }
    });
    if cursor == 0
        && next == 0
        && pat.is_none()
        && ty.is_none()
        && n + stale != ks::len(m, st) as usize
    {
        // One call walked the whole keyspace: it must have found every key.
        crate::ds::damaged(d);
    }
    array(out, 2);
    bulk(out, next.to_string().as_bytes());
    array(out, n);
    out.extend_from_slice(&keys);
}

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (Redis 7.0's expireGenericCommand): options first,
/// then the time (overflow is an error), then the key; NX/XX/GT/LT against its current
/// deadline (none counts as infinite); a time already past deletes the key.
pub(super) fn expire(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let (name, secs, relative) = match id {
        Id::Expire => ("expire", true, true),
        Id::Pexpire => ("pexpire", false, true),
        Id::Expireat => ("expireat", true, false),
        _ => ("pexpireat", false, false),
    };
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in &a[3..] {
        if is(o, "NX") {
            nx = true;
        } else if is(o, "XX") {
            xx = true;
        } else if is(o, "GT") {
            gt = true;
        } else if is(o, "LT") {
            lt = true;
        } else {
            reply::error(
                out,
                &format!("ERR Unsupported option {}", String::from_utf8_lossy(o)),
            );
            return Ok(());
        }
    }
    if nx && (xx || gt || lt) {
        reply::error(
            out,
            "ERR NX and XX, GT or LT options at the same time are not compatible",
        );
        return Ok(());
    }
    if gt && lt {
        reply::error(
            out,
            "ERR GT and LT options at the same time are not compatible",
        );
        return Ok(());
    }
    let Some(mut when) = parse_i64(a[2]) else {
        not_int(out);
        return Ok(());
    };
    if secs {
        if !(i64::MIN / 1000..=i64::MAX / 1000).contains(&when) {
            invalid_expire(out, name);
            return Ok(());
        }
        when *= 1000;
    }
    let now = expire::now_ms() as i64;
    let base = if relative { now } else { 0 };
    if when > i64::MAX - base {
        invalid_expire(out, name);
        return Ok(());
    }
    when += base;
    let Some(e) = ks::lookup(w, st, a[1]) else {
        int(out, 0);
        return Ok(());
    };
    if nx || xx || gt || lt {
        let cur = expire::deadline(w, st, &e).map(|t| t.min(i64::MAX as u64) as i64);
        if nx && cur.is_some()
            || xx && cur.is_none()
            || gt && cur.map_or(true, |c| when <= c)
            || lt && cur.is_some_and(|c| when >= c)
        {
            int(out, 0);
            return Ok(());
        }
    }
    if when <= now {
        ks::delete(w, st, &e)?;
    } else {
        expire::set(w, st, &e, when as u64)?;
    }
    int(out, 1);
    Ok(())
}

/// EXISTS.
pub(super) fn exists<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let n = a[1..]
        .iter()
        .filter(|k| ks::lookup(m, st, k).is_some())
        .count();
    int(out, n as i64);
}

/// TOUCH.
pub(super) fn touch<M: Mem>(_cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    // No access clock to update: the count of keys that exist, as Redis replies.
    let n = a[1..]
        .iter()
        .filter(|k| ks::lookup(m, st, k).is_some())
        .count();
    int(out, n as i64);
}

/// RANDOMKEY.
pub(super) fn randomkey<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    _a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    // Expired keys not yet deleted are skipped (a reader cannot delete them, where
    // Redis' RANDOMKEY deletes as it draws): a few random draws, then a walk to the
    // first live key, so that one live key among many expired ones is still found.
    let is_live = |e: u64| !expire::expired(m, st, &ks::entry_at(m, e));
    let mut found = (0..16)
        .map_while(|_| dict::random(m, st.keyspace()))
        .map(|(e, _)| e)
        .find(|&e| is_live(e));
    if found.is_none() && expire::count(m, st) > 0 {
        dict::for_each(m, st.keyspace(), |e| {
            if is_live(e) {
                found = Some(e);
            }
            found.is_none()
        });
    }
    match found {
        Some(e) => bulk(out, &ks::key_of(m, e)),
        None => null(out),
    }
}

/// TTL, PTTL, EXPIRETIME and PEXPIRETIME (`id` says which).
pub(super) fn ttl<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    // Redis' ttlGenericCommand: -2 no key, -1 no deadline; seconds rounded.
    let v = match ks::lookup(m, st, a[1]) {
        None => -2,
        Some(e) => match expire::deadline(m, st, &e) {
            None => -1,
            Some(t) => {
                let abs = matches!(id, Id::Expiretime | Id::Pexpiretime);
                let ms = if abs {
                    t
                } else {
                    t.saturating_sub(expire::now_ms())
                }
                .min(i64::MAX as u64) as i64;
                if matches!(id, Id::Pttl | Id::Pexpiretime) {
                    ms
                } else {
                    ms.saturating_add(500) / 1000
                }
            }
        },
    };
    int(out, v);
}

/// KEYS.
pub(super) fn keys<M: Mem>(_cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let mut tmp = Vec::new();
    let mut n = 0;
    dict::for_each(m, st.keyspace(), |e| {
        let k = ks::key_of(m, e);
        if glob(a[1], &k) && !expire::expired(m, st, &ks::entry_at(m, e)) {
            bulk(&mut tmp, &k);
            n += 1;
        }
        true
    });
    array(out, n);
    out.extend_from_slice(&tmp);
}

/// PERSIST.
pub(super) fn persist(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let n = match ks::lookup(w, st, a[1]) {
        Some(e) => expire::remove(w, st, &e, true)? as i64,
        None => 0,
    };
    int(out, n);
    Ok(())
}

/// DEL and UNLINK.
pub(super) fn del(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let mut n = 0;
    for k in &a[1..] {
        if let Some(e) = ks::lookup(w, st, k) {
            ks::delete(w, st, &e)?;
            n += 1;
        }
    }
    int(out, n);
    Ok(())
}

/// FLUSHALL and FLUSHDB (`id` says which).
pub(super) fn flush(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    if a.len() > 2 || (a.len() == 2 && !is(a[1], "ASYNC") && !is(a[1], "SYNC")) {
        syntax(out);
        return Ok(());
    }
    if id == Id::Flushall {
        for db in 0..crate::ds::DATABASES {
            let st = st.db(w, db);
            garbage::flush(w, &st)?;
        }
    } else {
        garbage::flush(w, st)?;
    }
    reply::ok(out);
    Ok(())
}

/// SWAPDB.
pub(super) fn swapdb(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    // Redis 7.0's swapdbCommand.
    let db_arg = |b: &[u8]| parse_i64(b).and_then(|v| i32::try_from(v).ok());
    let Some(a1) = db_arg(a[1]) else {
        reply::error(out, "ERR invalid first DB index");
        return Ok(());
    };
    let Some(a2) = db_arg(a[2]) else {
        reply::error(out, "ERR invalid second DB index");
        return Ok(());
    };
    let n = crate::ds::DATABASES as i32;
    if !(0..n).contains(&a1) || !(0..n).contains(&a2) {
        reply::error(out, "ERR DB index is out of range");
        return Ok(());
    }
    if a1 != a2 {
        st.swap_dbs(w, a1 as usize, a2 as usize)?;
    }
    reply::ok(out);
    Ok(())
}

/// MOVE.
pub(super) fn move_key(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    // Redis 7.0's moveCommand: the database, then the key; the time to live moves too.
    let Some(db) = parse_i64(a[2]) else {
        not_int(out);
        return Ok(());
    };
    if !(0..crate::ds::DATABASES as i64).contains(&db) {
        reply::error(out, "ERR DB index is out of range");
        return Ok(());
    }
    let dst = st.db(w, db as usize);
    if dst.db == st.db {
        reply::error(out, "ERR source and destination objects are the same");
        return Ok(());
    }
    let Some(src) = ks::lookup(w, st, a[1]) else {
        int(out, 0);
        return Ok(());
    };
    let (p, there) = ks::probe(w, &dst, a[1]);
    if there.is_some() {
        int(out, 0);
        return Ok(());
    }
    let ttl = expire::deadline(w, st, &src);
    if src.ty() == T_STRING {
        let v = ks::string_value(w, &src).into_owned();
        ks::insert_string(w, &dst, &p, a[1], &v)?;
        let src = ks::lookup(w, st, a[1]).unwrap_or(src);
        ks::delete(w, st, &src)?;
    } else {
        // The value object moves as it is.
        expire::remove(w, st, &src, false)?;
        dict::unlink(w, st.keyspace(), src.link, src.off)?;
        ks::free_entry(w, &src)?;
        ks::insert_object(w, &dst, &p, a[1], src.ty(), src.enc(), src.obj())?;
    }
    set_ttl(w, &dst, a[1], ttl)?;
    int(out, 1);
    Ok(())
}

/// COPY.
pub(super) fn copy(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let mut replace = false;
    let mut target = st.db;
    let mut i = 3;
    while i < a.len() {
        if is(a[i], "replace") {
            replace = true;
            i += 1;
        } else if is(a[i], "db") && i + 1 < a.len() {
            match parse_i64(a[i + 1]) {
                Some(d) if (0..crate::ds::DATABASES as i64).contains(&d) => {
                    target = d as usize;
                }
                Some(_) => {
                    reply::error(out, "ERR DB index is out of range");
                    return Ok(());
                }
                None => {
                    not_int(out);
                    return Ok(());
                }
            }
            i += 2;
        } else {
            syntax(out);
            return Ok(());
        }
    }
    if a[1] == a[2] && target == st.db {
        reply::error(out, "ERR source and destination objects are the same");
        return Ok(());
    }
    let Some(src) = ks::lookup(w, st, a[1]) else {
        int(out, 0);
        return Ok(());
    };
    let dst = st.db(w, target);
    if let Some(d) = ks::lookup(w, &dst, a[2]) {
        if !replace {
            int(out, 0);
            return Ok(());
        }
        ks::delete(w, &dst, &d)?;
    }
    // The source's links may have moved with the deletion: look it up again. Its value
    // is copied element by element into a new object of the same type.
    let src = ks::lookup(w, st, a[1]).unwrap_or(src);
    let ttl = expire::deadline(w, st, &src);
    let v = value::read(w, &src)?;
    value::insert(w, &dst, a[2], &v)?;
    set_ttl(w, &dst, a[2], ttl)?;
    int(out, 1);
    Ok(())
}

/// RENAME and RENAMENX (`id` says which).
pub(super) fn rename(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let nx = id == Id::Renamenx;
    let Some(src) = ks::lookup(w, st, a[1]) else {
        reply::error(out, "ERR no such key");
        return Ok(());
    };
    if a[1] == a[2] {
        if nx {
            int(out, 0);
        } else {
            reply::simple(out, "OK");
        }
        return Ok(());
    }
    if let Some(d) = ks::lookup(w, st, a[2]) {
        if nx {
            int(out, 0);
            return Ok(());
        }
        ks::delete(w, st, &d)?;
    }
    // The source's links may have moved with the deletion (one bucket chain). Its
    // deadline goes with it (Redis' RENAME keeps the time to live).
    let src = ks::lookup(w, st, a[1]).unwrap_or(src);
    let ttl = expire::deadline(w, st, &src);
    if src.ty() == T_STRING {
        let v = ks::string_value(w, &src).into_owned();
        ks::delete(w, st, &src)?;
        let (p, _) = ks::probe(w, st, a[2]);
        ks::insert_string(w, st, &p, a[2], &v)?;
    } else {
        // The value object moves to a new entry as it is: no copy of the collection.
        expire::remove(w, st, &src, false)?;
        dict::unlink(w, st.keyspace(), src.link, src.off)?;
        ks::free_entry(w, &src)?;
        let (p, _) = ks::probe(w, st, a[2]);
        ks::insert_object(w, st, &p, a[2], src.ty(), src.enc(), src.obj())?;
    }
    set_ttl(w, st, a[2], ttl)?;
    if nx {
        int(out, 1);
    } else {
        reply::simple(out, "OK");
    }
    Ok(())
}

/// TYPE.
pub(super) fn key_type<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    match ks::lookup(m, st, a[1]) {
        Some(e) => reply::simple(out, ks::type_name(e.ty())),
        None => reply::simple(out, "none"),
    }
}

/// DBSIZE.
pub(super) fn dbsize<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    _a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    int(out, ks::len(m, st) as i64)
}
