//! What the data commands share, and their dispatch. The commands themselves are handler
//! functions in one file per Redis command group — `keys`, `strings`, `bitmaps`, `lists`,
//! `sets`, `hashes`, `zsets`, `pops` — registered in the command table (`table`): readers
//! generic over [`Mem`] (the committed view, or the group-commit transaction), writers on a
//! [`Wtx`]. Here: argument parsing, typed lookups, the collection-object updates, the
//! expiry arguments, SSCAN/HSCAN/ZSCAN, and [`read`] / [`write`], which run a command's handler.
//!
//! Every writer validates its arguments and the key's type before its first write, so a client
//! error (syntax, WRONGTYPE, not an integer) never leaves a half-done change, even inside a
//! group-commit transaction shared with other commands. Only heap errors (out of memory,
//! transaction too large) can stop a writer midway; the caller then aborts the transaction.

use super::reply::{self, array, bulk, not_int, null, syntax, wrongtype};
use super::table::{Flags, Handler, Id, ReadMem, Spec};
use crate::ds::hash::HashObj;
use crate::ds::keyspace::{self as ks, Entry, T_HASH, T_SET, T_ZSET};
use crate::ds::set::SetObj;
use crate::ds::{dict, expire, hash, set, zset, Mem, Store, Wtx};
use crate::heap::HeapError;

/// What a writer returns: `Err` only for a heap error (the caller aborts the transaction).
pub(super) type HResult = std::result::Result<(), HeapError>;

/// Per-batch counters, added to the service's statistics once per batch.
#[derive(Default, Debug)]
pub struct Counters {
    /// Lookups of read commands that found their key.
    pub hits: u64,
    /// Lookups of read commands that did not.
    pub misses: u64,
}

/// Redis' string2ll: optional `-`, digits, no leading zeros, no `+`, no spaces, fits i64.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    if b == b"0" {
        return Some(0);
    }
    let (neg, d) = if b[0] == b'-' {
        (true, &b[1..])
    } else {
        (false, b)
    };
    if d.is_empty() || !(b'1'..=b'9').contains(&d[0]) {
        return None;
    }
    let mut v: u64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    if neg {
        if v > i64::MAX as u64 + 1 {
            None
        } else {
            Some((v as i64).wrapping_neg())
        }
    } else if v > i64::MAX as u64 {
        None
    } else {
        Some(v as i64)
    }
}

/// A float argument (strtod-like: `inf`, `-inf`, exponents; never NaN, no spaces).
pub fn parse_f64(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.starts_with(|c: char| c.is_whitespace()) {
        return None;
    }
    let v: f64 = s.parse().ok()?;
    (!v.is_nan()).then_some(v)
}

/// Case-insensitive equality with an upper-case ASCII keyword.
#[inline]
pub fn is(a: &[u8], kw: &str) -> bool {
    a.eq_ignore_ascii_case(kw.as_bytes())
}

/// Redis' glob (`*`, `?`, `[...]` with `^` and ranges, `\` escapes), case-sensitive.
pub fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pi < p.len() {
            if p[pi] == b'*' {
                while pi < p.len() && p[pi] == b'*' {
                    pi += 1;
                }
                if pi == p.len() {
                    return true;
                }
                star = Some((pi, si));
                continue;
            }
            if si < s.len() {
                let c = s[si];
                let step = match p[pi] {
                    b'?' => Some(pi + 1),
                    b'[' => {
                        let (m, np) = class(p, pi + 1, c);
                        m.then_some(np)
                    }
                    b'\\' if pi + 1 < p.len() => (p[pi + 1] == c).then_some(pi + 2),
                    x => (x == c).then_some(pi + 1),
                };
                if let Some(np) = step {
                    pi = np;
                    si += 1;
                    continue;
                }
            }
        } else if si == s.len() {
            return true;
        }
        match star {
            Some((sp, ss)) if ss < s.len() => {
                star = Some((sp, ss + 1));
                pi = sp;
                si = ss + 1;
            }
            _ => return false,
        }
    }
}

/// Match `c` against the class starting at `p[i..]` (after `[`); (matched, index after `]`).
fn class(p: &[u8], mut i: usize, c: u8) -> (bool, usize) {
    let not = i < p.len() && p[i] == b'^';
    if not {
        i += 1;
    }
    let mut m = false;
    while i < p.len() && p[i] != b']' {
        if p[i] == b'\\' && i + 1 < p.len() {
            m |= p[i + 1] == c;
            i += 2;
        } else if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
            let (a, b) = (p[i].min(p[i + 2]), p[i].max(p[i + 2]));
            m |= (a..=b).contains(&c);
            i += 3;
        } else {
            m |= p[i] == c;
            i += 1;
        }
    }
    (m != not, (i + 1).min(p.len()))
}

/// A key looked up for a command that wants one type.
pub(super) enum Look {
    /// No such (live) key.
    Missing,
    /// A key of another type.
    Wrong,
    /// The key's entry, of the wanted type.
    Found(Entry),
}

/// Look `key` up as a value of type `ty`.
pub(super) fn look<M: Mem>(m: &M, st: &Store, key: &[u8], ty: u8) -> Look {
    match ks::lookup(m, st, key) {
        None => Look::Missing,
        Some(e) if e.ty() != ty => Look::Wrong,
        Some(e) => Look::Found(e),
    }
}

/// Resolve a Redis index range over `len` elements; `None` when empty.
pub(super) fn resolve(start: i64, stop: i64, len: u64) -> Option<(u64, u64)> {
    let len = len as i64;
    let mut s = if start < 0 { start + len } else { start };
    let mut e = if stop < 0 { stop + len } else { stop };
    if s < 0 {
        s = 0;
    }
    if s > e || s >= len {
        return None;
    }
    if e >= len {
        e = len - 1;
    }
    Some((s as u64, e as u64))
}

/// The set object of set entry `e`.
pub(super) fn set_obj(e: &Entry) -> SetObj {
    SetObj {
        enc: e.enc(),
        obj: e.obj(),
    }
}

/// The hash object of hash entry `e`.
pub(super) fn hash_obj(e: &Entry) -> HashObj {
    HashObj {
        enc: e.enc(),
        obj: e.obj(),
    }
}

/// A positive count argument (LPOP, SPOP, ZPOPMIN): `Err` after writing Redis' error.
pub(super) fn count_arg(b: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    match parse_i64(b) {
        Some(n) if n >= 0 => Some(n as usize),
        _ => {
            reply::error(out, "ERR value is out of range, must be positive");
            None
        }
    }
}

/// SRANDMEMBER, HRANDFIELD and ZRANDMEMBER's reply over `all`, as Redis chooses: no count, one
/// element's bulk (nil when empty); a negative count, that many with repeats; a positive one,
/// that many distinct ones (all when there are not more). `emit` writes one element's `per`
/// bulks (its member alone without a count).
pub(super) fn random_reply<T>(
    out: &mut Vec<u8>,
    all: &mut [T],
    count: Option<i64>,
    per: usize,
    emit: impl Fn(&mut Vec<u8>, &T),
) {
    let pick = |k: usize| (crate::ds::rand_u64() % k as u64) as usize;
    match count {
        None => match all.len() {
            0 => null(out),
            k => emit(out, &all[pick(k)]),
        },
        Some(c) if c < 0 => {
            let c = if all.is_empty() {
                0
            } else {
                c.unsigned_abs() as usize
            };
            array(out, c * per);
            for _ in 0..c {
                emit(out, &all[pick(all.len())]);
            }
        }
        Some(c) => {
            let c = (c as usize).min(all.len());
            for i in 0..c {
                let j = i + pick(all.len() - i);
                all.swap(i, j);
            }
            array(out, c * per);
            for x in &all[..c] {
                emit(out, x);
            }
        }
    }
}

/// The arguments of SRANDMEMBER, HRANDFIELD and ZRANDMEMBER — `key [count [flag]]`, `flag`
/// (`withvalues`, `withscores`) `None` for SRANDMEMBER, which takes none — checked in Redis
/// 7.0's order, and the key's entry of type `ty`. `None` after replying: an error, or the
/// empty reply of a missing key (nil without a count, an empty array with one).
pub(super) fn random_args<M: Mem>(
    m: &M,
    st: &Store,
    a: &[&[u8]],
    ty: u8,
    flag: Option<&str>,
    out: &mut Vec<u8>,
) -> Option<(Entry, Option<i64>, bool)> {
    if flag.is_none() && a.len() > 3 {
        syntax(out);
        return None;
    }
    let count = match a.get(2) {
        Some(c) => match parse_i64(c) {
            Some(c) => Some(c),
            None => {
                not_int(out);
                return None;
            }
        },
        None => None,
    };
    let with = match (a.get(3), flag) {
        (None, _) => false,
        (Some(w), Some(f)) if is(w, f) && a.len() == 4 => true,
        (Some(_), _) => {
            syntax(out);
            return None;
        }
    };
    match look(m, st, a[1], ty) {
        Look::Wrong => wrongtype(out),
        Look::Missing if count.is_some() => array(out, 0),
        Look::Missing => null(out),
        Look::Found(e) => return Some((e, count, with)),
    }
    None
}

/// SSCAN, HSCAN, ZSCAN: `key cursor [MATCH pattern] [COUNT count]` over one collection, the
/// cursor a bucket of its dict (a packed collection answers whole, cursor 0).
pub(super) fn coll_scan<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(cursor) = std::str::from_utf8(a[2])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return reply::error(out, "ERR invalid cursor");
    };
    let (mut pat, mut count): (Option<&[u8]>, u64) = (None, 10);
    let mut i = 3;
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
        } else {
            return syntax(out);
        }
        i += 2;
    }
    let ty = match id {
        Id::Sscan => T_SET,
        Id::Hscan => T_HASH,
        _ => T_ZSET,
    };
    let e = match look(m, st, a[1], ty) {
        Look::Wrong => return wrongtype(out),
        Look::Missing => {
            array(out, 2);
            bulk(out, b"0");
            return array(out, 0);
        }
        Look::Found(e) => e,
    };
    let ok = |k: &[u8]| pat.map_or(true, |p| glob(p, k));
    let mut items = Vec::new();
    let mut n = 0usize;
    let next = match id {
        Id::Sscan => set::scan(m, set_obj(&e), cursor, count, |v| {
            if ok(v) {
                bulk(&mut items, v);
                n += 1;
            }
        }),
        Id::Hscan => hash::scan(m, hash_obj(&e), cursor, count, |f, v| {
            if ok(f) {
                bulk(&mut items, f);
                bulk(&mut items, v);
                n += 2;
            }
        }),
        _ => zset::scan(m, e.obj(), cursor, count, |mem, sc| {
            if ok(mem) {
                bulk(&mut items, mem);
                reply::double(&mut items, sc);
                n += 2;
            }
        }),
    };
    array(out, 2);
    bulk(out, next.to_string().as_bytes());
    array(out, n);
    out.extend_from_slice(&items);
}

/// The probe and entry of `key` if it has type `ty`; `Err(())` after replying WRONGTYPE.
pub(super) fn probe_typed(
    w: &Wtx,
    st: &Store,
    key: &[u8],
    ty: u8,
    out: &mut Vec<u8>,
) -> std::result::Result<(dict::Probe, Option<Entry>), ()> {
    let (p, e) = ks::probe(w, st, key);
    match e {
        Some(e) if e.ty() != ty => {
            wrongtype(out);
            Err(())
        }
        _ => Ok((p, e)),
    }
}

/// Store a (possibly moved or re-encoded) value object in its entry, if it changed.
pub(super) fn update_obj(w: &mut Wtx, e: &Entry, enc: u8, obj: u64) -> HResult {
    if enc != e.enc() || obj != e.obj() {
        ks::set_value(w, e, e.ty(), enc, obj)?;
    }
    Ok(())
}

/// After adding to the collection of key `key` (probed as `p`, entry `e` if it existed):
/// point the entry at the collection's new object, or insert the key with it.
#[allow(clippy::too_many_arguments)]
pub(super) fn upsert_obj(
    w: &mut Wtx,
    st: &Store,
    p: &dict::Probe,
    key: &[u8],
    e: Option<Entry>,
    ty: u8,
    enc: u8,
    obj: u64,
) -> HResult {
    match e {
        Some(e) => update_obj(w, &e, enc, obj),
        None => ks::insert_object(w, st, p, key, ty, enc, obj),
    }
}

/// After removing from the collection of entry `e`: delete the key when the collection is
/// `empty` (Redis keeps no empty collections), else point it at the new object.
pub(super) fn shrink_obj(
    w: &mut Wtx,
    st: &Store,
    e: &Entry,
    empty: bool,
    enc: u8,
    obj: u64,
) -> HResult {
    if empty {
        ks::delete(w, st, &e.with_obj(enc, obj))
    } else {
        update_obj(w, e, enc, obj)
    }
}

/// How an expiry argument counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ttl {
    /// Seconds from now.
    Ex,
    /// Milliseconds from now.
    Px,
    /// Unix time in seconds.
    Exat,
    /// Unix time in milliseconds.
    Pxat,
}

/// Redis' error for an expiry time out of range, in command `cmd`.
pub(super) fn invalid_expire(out: &mut Vec<u8>, cmd: &str) {
    reply::error(out, &format!("ERR invalid expire time in '{cmd}' command"));
}

/// Redis' getExpireMillisecondsOrReply: the deadline (ms since the epoch) that `arg` says in
/// `unit`, or `None` after the error reply (not an integer; not positive; overflow).
pub(super) fn deadline_arg(arg: &[u8], unit: Ttl, cmd: &str, out: &mut Vec<u8>) -> Option<u64> {
    let Some(v) = parse_i64(arg) else {
        not_int(out);
        return None;
    };
    let secs = matches!(unit, Ttl::Ex | Ttl::Exat);
    if v <= 0 || secs && v > i64::MAX / 1000 {
        invalid_expire(out, cmd);
        return None;
    }
    let ms = if secs { v * 1000 } else { v };
    let ms = if matches!(unit, Ttl::Ex | Ttl::Px) {
        ms.checked_add(expire::now_ms() as i64)
    } else {
        Some(ms)
    };
    match ms {
        Some(ms) if ms > 0 => Some(ms as u64),
        _ => {
            invalid_expire(out, cmd);
            None
        }
    }
}

/// The live entry `e` without its deadline (SET, GETSET, MSET and SETEX give a key a new
/// value and drop its time to live; most other writes keep it).
pub(super) fn without_ttl(w: &mut Wtx, st: &Store, e: Entry) -> Result<Entry, HeapError> {
    if expire::remove(w, st, &e, true)? {
        Ok(Entry {
            meta: e.meta & !expire::F_VOLATILE,
            ..e
        })
    } else {
        Ok(e)
    }
}

/// Give `key` (live, just written) deadline `at`, if any.
pub(super) fn set_ttl(w: &mut Wtx, st: &Store, key: &[u8], at: Option<u64>) -> HResult {
    if let Some(at) = at {
        match ks::probe_raw(w, st, key).1 {
            Some(e) => {
                expire::set(w, st, &e, at)?;
            }
            None => return Err(HeapError::Damaged(st.keyspace())),
        }
    }
    Ok(())
}

/// Look `key` up for a reader, counting a hit (found, or another type) or a miss: its entry
/// of type `ty`, or `None` after replying — WRONGTYPE, or `missing`'s reply for a missing key.
#[inline]
pub(super) fn found<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    key: &[u8],
    ty: u8,
    out: &mut Vec<u8>,
    missing: impl FnOnce(&mut Vec<u8>),
) -> Option<Entry> {
    match look(m, st, key, ty) {
        Look::Missing => {
            cx.misses += 1;
            missing(out);
            None
        }
        Look::Wrong => {
            cx.hits += 1;
            wrongtype(out);
            None
        }
        Look::Found(e) => {
            cx.hits += 1;
            Some(e)
        }
    }
}

/// Execute read command `spec` against `m`: its handler in the command table.
#[inline]
pub fn read<M: ReadMem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    spec: &Spec,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    touch(st, spec, a);
    match &spec.handler {
        Handler::Read(f) => M::reader(f)(cx, st, m, a, out),
        _ => reply::error(out, "ERR internal: not a read command"),
    }
}

/// Execute write command `spec` in `w`: its handler in the command table.
#[inline]
pub fn write(st: &Store, w: &mut Wtx, spec: &Spec, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    touch(st, spec, a);
    match spec.handler {
        Handler::Write(f) => f(st, w, a, out),
        _ => {
            reply::error(out, "ERR internal: not a write command");
            Ok(())
        }
    }
}

/// A command's use of its keys, for OBJECT IDLETIME (not for NO_TOUCH commands).
#[inline]
fn touch(st: &Store, spec: &Spec, a: &[&[u8]]) {
    if !spec.flags.contains(Flags::NO_TOUCH) {
        for k in key_args(spec, a) {
            super::access::touch(st.db, k);
        }
    }
}

/// The key arguments of a command, by its table entry's (first, last, step).
pub fn key_args<'a>(spec: &Spec, a: &'a [&'a [u8]]) -> impl Iterator<Item = &'a [u8]> + 'a {
    // Commands whose keys follow a count (Redis' "keynum" key specs).
    let counted = match spec.id {
        Id::Lmpop | Id::Zmpop => Some(1),
        Id::Blmpop | Id::Bzmpop => Some(2),
        _ => None,
    };
    if let Some(nk) = counted {
        let n = a
            .get(nk)
            .and_then(|b| parse_i64(b))
            .unwrap_or(0)
            .clamp(0, a.len() as i64) as usize;
        let end = (nk + 1 + n).min(a.len());
        return a[(nk + 1).min(end)..end]
            .iter()
            .copied()
            .step_by(1)
            .chain(None);
    }
    // Keys found by keyword: SORT's STORE destination, MIGRATE's KEYS.
    match spec.id {
        Id::Sort => return a[1..2].iter().copied().step_by(1).chain(sort_store(a)),
        Id::MigrateKeys => {
            let at = (a.len() > 3 && a[3].is_empty())
                .then(|| a.iter().skip(6).position(|x| is(x, "keys")))
                .flatten()
                .map_or(3..4.min(a.len()), |k| 6 + k + 1..a.len());
            return a[at].iter().copied().step_by(1).chain(None);
        }
        _ => {}
    }
    let (first, last, step) = spec.keys;
    let n = a.len() as i32;
    let last = if last < 0 { n + last } else { last.min(n - 1) };
    let range = if first <= 0 || step <= 0 || last < first {
        0..0
    } else {
        first as usize..last as usize + 1
    };
    a[range]
        .iter()
        .copied()
        .step_by(step.max(1) as usize)
        .chain(None)
}

/// The keys write command `spec` may change: [`key_args`] but for the commands that only
/// read some of theirs (the sources of COPY, BITOP, the set STOREs, ZRANGESTORE and SORT).
/// What a change signals to WATCH and to blocked clients: reading a key must not fail
/// another client's WATCH of it.
pub fn written_keys<'a>(spec: &Spec, a: &'a [&'a [u8]]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let only = match spec.id {
        Id::Copy | Id::Bitop => Some(a.get(2).copied()),
        Id::Sinterstore | Id::Sunionstore | Id::Sdiffstore | Id::Zrangestore => {
            Some(a.get(1).copied())
        }
        Id::Sort => Some(sort_store(a)),
        _ => None,
    };
    let (all, one) = match only {
        Some(k) => (None, k),
        None => (Some(key_args(spec, a)), None),
    };
    all.into_iter().flatten().chain(one)
}

/// SORT's STORE destination (the last one), skipping the arguments of LIMIT, GET and BY as
/// Redis's sortGetKeys does.
fn sort_store<'a>(a: &[&'a [u8]]) -> Option<&'a [u8]> {
    let mut dst = None;
    let mut j = 2;
    while j < a.len() {
        if is(a[j], "limit") {
            j += 2;
        } else if is(a[j], "get") || is(a[j], "by") {
            j += 1;
        } else if is(a[j], "store") && j + 1 < a.len() {
            dst = Some(a[j + 1]);
            j += 1;
        }
        j += 1;
    }
    dst
}

/// Delete the expired keys among write command `spec`'s key arguments, before it runs (Redis'
/// lookupKeyWrite), so that its own lookups never meet one. Returns how many were deleted.
pub fn purge_expired(st: &Store, w: &mut Wtx, spec: &Spec, a: &[&[u8]]) -> Result<u64, HeapError> {
    expire::purge(w, st, key_args(spec, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"9223372036854775808"[..],
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"-",
            b"",
            b"-0",
            b"1a",
        ] {
            assert_eq!(parse_i64(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse_f64(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_f64(b"+inf"), Some(f64::INFINITY));
        assert_eq!(parse_f64(b"1e3"), Some(1000.0));
        assert_eq!(parse_f64(b"nan"), None);
        assert_eq!(parse_f64(b" 1"), None);
    }

    #[test]
    fn globs() {
        assert!(glob(b"*", b"anything"));
        assert!(glob(b"key:*", b"key:1"));
        assert!(!glob(b"key:*", b"kex:1"));
        assert!(glob(b"h?llo", b"hello"));
        assert!(glob(b"h[ae]llo", b"hallo"));
        assert!(!glob(b"h[^e]llo", b"hello"));
        assert!(glob(b"h[a-b]llo", b"hbllo"));
        assert!(glob(b"a*b*c", b"axxbyyc"));
        assert!(!glob(b"a*b*c", b"axxbyy"));
        assert!(glob(b"\\*x", b"*x"));
        assert!(!glob(b"\\*x", b"ax"));
        assert!(glob(b"", b""));
        assert!(!glob(b"", b"a"));
    }

    #[test]
    fn ranges() {
        assert_eq!(resolve(0, -1, 5), Some((0, 4)));
        assert_eq!(resolve(-2, -1, 5), Some((3, 4)));
        assert_eq!(resolve(-100, 1, 5), Some((0, 1)));
        assert_eq!(resolve(3, 100, 5), Some((3, 4)));
        assert_eq!(resolve(5, 10, 5), None);
        assert_eq!(resolve(3, 2, 5), None);
        assert_eq!(resolve(0, -1, 0), None);
    }
}
