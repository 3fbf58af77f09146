//! The pops from the first non-empty of several keys: LMPOP and ZMPOP, and the non-blocking
//! attempt of every blocking command (BLPOP, BRPOP, BRPOPLPUSH, BLMOVE, BLMPOP, BZPOPMIN,
//! BZPOPMAX, BZMPOP; the blocking itself: `blocking`).

use super::data::{is, parse_i64, HResult};
use super::reply::{self, array, bulk, null_array, syntax, wrongtype};
use super::table::Id;
use super::{lists, zsets};
use crate::ds::keyspace::{self as ks, T_LIST, T_ZSET};
use crate::ds::{Store, Wtx};
use crate::heap::HeapError;

/// LMPOP / ZMPOP (and the attempt of BLMPOP / BZMPOP): `numkeys key ... LEFT|RIGHT (MIN|MAX)
/// [COUNT n]` from `a[nk]`, Redis 7.0's checks in its order; pops up to `count` from the first
/// key that holds something and replies `[key, elements]` (ZMPOP: `[member, score]` pairs).
/// Returns whether it replied (false: every key empty; nothing written).
fn pop_first(
    st: &Store,
    w: &mut Wtx,
    zset: bool,
    a: &[&[u8]],
    nk: usize,
    out: &mut Vec<u8>,
) -> Result<bool, HeapError> {
    let n = match parse_i64(a[nk]) {
        Some(n) if n > 0 => n as usize,
        _ => {
            reply::error(out, "ERR numkeys should be greater than 0");
            return Ok(true);
        }
    };
    if n > a.len() - nk - 1 {
        syntax(out);
        return Ok(true);
    }
    let keys = &a[nk + 1..nk + 1 + n];
    let mut j = nk + 1 + n;
    let (lo, hi) = if zset {
        ("MIN", "MAX")
    } else {
        ("LEFT", "RIGHT")
    };
    let first = match a.get(j) {
        Some(x) if is(x, lo) => true,
        Some(x) if is(x, hi) => false,
        _ => {
            syntax(out);
            return Ok(true);
        }
    };
    j += 1;
    let mut count: Option<i64> = None;
    while j < a.len() {
        if is(a[j], "COUNT") && j + 1 < a.len() && count.is_none() {
            match parse_i64(a[j + 1]) {
                Some(c) if c > 0 => count = Some(c),
                _ => {
                    reply::error(out, "ERR count should be greater than 0");
                    return Ok(true);
                }
            }
            j += 2;
        } else {
            syntax(out);
            return Ok(true);
        }
    }
    let count = count.unwrap_or(1).to_string();
    let ty = if zset { T_ZSET } else { T_LIST };
    for k in keys {
        let Some(e) = ks::lookup(w, st, k) else {
            continue;
        };
        if e.ty() != ty {
            wrongtype(out);
            return Ok(true);
        }
        let (pid, name): (Id, &[u8]) = match (zset, first) {
            (false, true) => (Id::Lpop, b"LPOP"),
            (false, false) => (Id::Rpop, b"RPOP"),
            (true, true) => (Id::Zpopmin, b"ZPOPMIN"),
            (true, false) => (Id::Zpopmax, b"ZPOPMAX"),
        };
        let mut popped = Vec::new();
        let args: [&[u8]; 3] = [name, k, count.as_bytes()];
        if zset {
            zsets::zpop(st, w, pid, &args, &mut popped)?;
        } else {
            lists::pop(st, w, pid, &args, &mut popped)?;
        }
        array(out, 2);
        bulk(out, k);
        if !zset {
            out.extend_from_slice(&popped);
        } else {
            // ZPOPMIN's flat member, score, ... as [member, score] pairs.
            let items = flat_bulks(&popped);
            array(out, items.len() / 2);
            for pair in items.chunks(2) {
                array(out, 2);
                bulk(out, pair[0]);
                bulk(out, pair.get(1).copied().unwrap_or_default());
            }
        }
        return Ok(true);
    }
    Ok(false)
}

/// The bulk strings of a flat RESP array reply (`*n` then `$len` items) this layer wrote.
fn flat_bulks(b: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    let mut i = match b.iter().position(|&c| c == b'\n') {
        Some(p) => p + 1,
        None => return v,
    };
    while i < b.len() && b[i] == b'$' {
        let Some(nl) = b[i..].iter().position(|&c| c == b'\n') else {
            break;
        };
        let len: usize = std::str::from_utf8(&b[i + 1..i + nl - 1])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let start = i + nl + 1;
        let end = (start + len).min(b.len());
        v.push(&b[start..end]);
        i = end + 2;
    }
    v
}

/// The non-blocking attempt of a blocking command (see `super::blocking`): validates its
/// arguments (an error reply, as Redis 7.0: BLMOVE's directions, then the timeout), then serves
/// from the first of its keys that holds something, as its non-blocking twin would; writes
/// nothing when every key is empty (the caller then blocks or, inside MULTI, answers a null
/// array). A key of the wrong type met before a served one is WRONGTYPE.
pub(super) fn blocking_try(
    st: &Store,
    w: &mut Wtx,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) -> HResult {
    if id == Id::Blmove && !a[3..5].iter().all(|p| is(p, "LEFT") || is(p, "RIGHT")) {
        syntax(out);
        return Ok(());
    }
    if let Err(e) = super::blocking::deadline(
        super::blocking::timeout_arg(id, a),
        std::time::Instant::now(),
    ) {
        reply::error(out, e);
        return Ok(());
    }
    if matches!(id, Id::Blmpop | Id::Bzmpop) {
        // Served, or an error: a reply; nothing to pop: none (the caller blocks).
        pop_first(st, w, id == Id::Bzmpop, a, 2, out)?;
        return Ok(());
    }
    let ty = if matches!(id, Id::Bzpopmin | Id::Bzpopmax) {
        T_ZSET
    } else {
        T_LIST
    };
    for k in super::blocking::wait_keys(id, a) {
        let Some(e) = ks::lookup(w, st, k) else {
            continue;
        };
        if e.ty() != ty {
            wrongtype(out);
            return Ok(());
        }
        match id {
            Id::Blpop | Id::Brpop => {
                let (pid, name): (Id, &[u8]) = if id == Id::Blpop {
                    (Id::Lpop, b"LPOP")
                } else {
                    (Id::Rpop, b"RPOP")
                };
                let mut one = Vec::new();
                lists::pop(st, w, pid, &[name, k], &mut one)?;
                array(out, 2);
                bulk(out, k);
                out.extend_from_slice(&one);
            }
            Id::Brpoplpush => lists::lmove(st, w, Id::Rpoplpush, &[b"RPOPLPUSH", a[1], a[2]], out)?,
            Id::Blmove => lists::lmove(st, w, Id::Lmove, &[b"LMOVE", a[1], a[2], a[3], a[4]], out)?,
            _ => {
                let (pid, name): (Id, &[u8]) = if id == Id::Bzpopmin {
                    (Id::Zpopmin, b"ZPOPMIN")
                } else {
                    (Id::Zpopmax, b"ZPOPMAX")
                };
                let mut one = Vec::new();
                zsets::zpop(st, w, pid, &[name, k], &mut one)?;
                array(out, 3);
                bulk(out, k);
                out.extend_from_slice(one.strip_prefix(b"*2\r\n").unwrap_or(&one));
            }
        }
        return Ok(());
    }
    Ok(())
}

/// LMPOP and ZMPOP (`id` says which).
pub(super) fn mpop(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    if !pop_first(st, w, id == Id::Zmpop, a, 1, out)? {
        null_array(out);
    }
    Ok(())
}
