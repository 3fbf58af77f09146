//! The set commands: SADD, SREM, SMEMBERS, SISMEMBER, SMISMEMBER, SCARD, SPOP, SRANDMEMBER,
//! SMOVE, SINTER, SUNION, SDIFF, their STORE forms and SINTERCARD. SSCAN is in `data`.

use super::data::{
    count_arg, found, is, look, parse_i64, probe_typed, random_args, random_reply, set_obj,
    shrink_obj, upsert_obj, Counters, HResult, Look,
};
use super::reply::{self, array, bulk, int, null, syntax, wrongtype};
use super::table::Id;
use crate::ds::keyspace::{self as ks, T_SET};
use crate::ds::set::SetObj;
use crate::ds::{set, Mem, Store, Wtx};

/// A set operation over several keys (SINTER, SUNION, SDIFF and their STORE and CARD forms).
#[derive(Clone, Copy, PartialEq, Eq)]
enum SetOp {
    Inter,
    Union,
    Diff,
}

/// The members of `op` over the sets at `keys`, as Redis computes them: every key's type is
/// checked first (`Err(())`: one holds another type, the reply is WRONGTYPE), a missing key is
/// an empty set. An intersection walks its smallest set and asks the others (it stops after
/// `limit` members when `limit` > 0); a difference walks the first and asks the rest.
fn set_algebra<M: Mem>(
    m: &M,
    st: &Store,
    op: SetOp,
    keys: &[&[u8]],
    limit: usize,
) -> std::result::Result<Vec<Vec<u8>>, ()> {
    let mut sets = Vec::with_capacity(keys.len());
    for k in keys {
        match look(m, st, k, T_SET) {
            Look::Wrong => return Err(()),
            Look::Missing => sets.push(None),
            Look::Found(e) => sets.push(Some(set_obj(&e))),
        }
    }
    let mut out = Vec::new();
    match op {
        SetOp::Inter => {
            let Some(mut sets) = sets.into_iter().collect::<Option<Vec<SetObj>>>() else {
                return Ok(out);
            };
            sets.sort_by_key(|s| set::card(m, *s));
            let (first, rest) = sets.split_first().expect("at least one key");
            set::for_each(m, *first, |v| {
                if (limit == 0 || out.len() < limit)
                    && rest.iter().all(|o| set::contains(m, st, *o, v))
                {
                    out.push(v.to_vec());
                }
            });
        }
        SetOp::Union => {
            let mut seen = std::collections::HashSet::new();
            for s in sets.into_iter().flatten() {
                set::for_each(m, s, |v| {
                    if seen.insert(v.to_vec()) {
                        out.push(v.to_vec());
                    }
                });
            }
        }
        SetOp::Diff => {
            let (first, rest) = sets.split_first().expect("at least one key");
            if let Some(first) = first {
                let rest: Vec<SetObj> = rest.iter().flatten().copied().collect();
                set::for_each(m, *first, |v| {
                    if !rest.iter().any(|o| set::contains(m, st, *o, v)) {
                        out.push(v.to_vec());
                    }
                });
            }
        }
    }
    Ok(out)
}

/// SINTERCARD's `numkeys key [key ...] [LIMIT limit]`: the keys and the limit (0: none), or
/// `None` after Redis' error reply.
fn sintercard_args<'a>(a: &[&'a [u8]], out: &mut Vec<u8>) -> Option<(Vec<&'a [u8]>, usize)> {
    let n = match parse_i64(a[1]) {
        Some(n) if n > 0 => n as usize,
        _ => {
            reply::error(out, "ERR numkeys should be greater than 0");
            return None;
        }
    };
    if n > a.len() - 2 {
        reply::error(
            out,
            "ERR Number of keys can't be greater than number of args",
        );
        return None;
    }
    let keys = a[2..2 + n].to_vec();
    let mut limit = 0usize;
    let mut i = 2 + n;
    while i < a.len() {
        if is(a[i], "limit") && i + 1 < a.len() {
            match parse_i64(a[i + 1]) {
                Some(l) if l >= 0 => limit = l as usize,
                // Redis answers a non-integer limit the same way.
                _ => {
                    reply::error(out, "ERR LIMIT can't be negative");
                    return None;
                }
            }
            i += 2;
        } else {
            syntax(out);
            return None;
        }
    }
    Some((keys, limit))
}

/// Writes `members` as an array reply.
fn members_reply(out: &mut Vec<u8>, members: &[Vec<u8>]) {
    array(out, members.len());
    for v in members {
        bulk(out, v);
    }
}

/// SMEMBERS.
pub(super) fn smembers<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(e) = found(cx, st, m, a[1], T_SET, out, |o| array(o, 0)) else {
        return;
    };
    let s = set_obj(&e);
    array(out, set::card(m, s) as usize);
    set::for_each(m, s, |v| bulk(out, v));
}

/// SISMEMBER.
pub(super) fn sismember<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(e) = found(cx, st, m, a[1], T_SET, out, |o| int(o, 0)) else {
        return;
    };
    int(out, set::contains(m, st, set_obj(&e), a[2]) as i64);
}

/// SMISMEMBER.
pub(super) fn smismember<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let e = match look(m, st, a[1], T_SET) {
        Look::Wrong => return wrongtype(out),
        Look::Missing => None,
        Look::Found(e) => Some(e),
    };
    array(out, a.len() - 2);
    for mem in &a[2..] {
        int(
            out,
            e.is_some_and(|e| set::contains(m, st, set_obj(&e), mem)) as i64,
        );
    }
}

/// SCARD.
pub(super) fn scard<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_SET, out, |o| int(o, 0)) else {
        return;
    };
    int(out, set::card(m, set_obj(&e)) as i64);
}

/// SINTER, SUNION and SDIFF (`id` says which).
pub(super) fn sinter_union_diff<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let op = match id {
        Id::Sinter => SetOp::Inter,
        Id::Sunion => SetOp::Union,
        _ => SetOp::Diff,
    };
    match set_algebra(m, st, op, &a[1..], 0) {
        Ok(v) => members_reply(out, &v),
        Err(()) => wrongtype(out),
    }
}

/// SINTERCARD.
pub(super) fn sintercard<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some((keys, limit)) = sintercard_args(a, out) else {
        return;
    };
    match set_algebra(m, st, SetOp::Inter, &keys, limit) {
        Ok(v) => int(out, v.len() as i64),
        Err(()) => wrongtype(out),
    }
}

/// SRANDMEMBER.
pub(super) fn srandmember<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some((e, count, _)) = random_args(m, st, a, T_SET, None, out) else {
        return;
    };
    let s = set_obj(&e);
    let n = set::card(m, s) as usize;
    let mut all = Vec::with_capacity(n);
    set::for_each(m, s, |v| all.push(v.to_vec()));
    random_reply(out, &mut all, count, 1, |out, v| bulk(out, v));
}

/// SADD.
pub(super) fn sadd(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((p, e)) = probe_typed(w, st, a[1], T_SET, out) else {
        return Ok(());
    };
    let (n, s) = set::add(w, st, e.as_ref().map(set_obj), &a[2..])?;
    upsert_obj(w, st, &p, a[1], e, T_SET, s.enc, s.obj)?;
    int(out, n as i64);
    Ok(())
}

/// SINTERSTORE, SUNIONSTORE and SDIFFSTORE (`id` says which).
pub(super) fn sinter_union_diff_store(
    st: &Store,
    w: &mut Wtx,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) -> HResult {
    let op = match id {
        Id::Sinterstore => SetOp::Inter,
        Id::Sunionstore => SetOp::Union,
        _ => SetOp::Diff,
    };
    let Ok(res) = set_algebra(w, st, op, &a[2..], 0) else {
        wrongtype(out);
        return Ok(());
    };
    // The destination is replaced whatever it held, and deleted for an empty result.
    if let Some(e) = ks::lookup(w, st, a[1]) {
        ks::delete(w, st, &e)?;
    }
    if !res.is_empty() {
        let (p, _) = ks::probe(w, st, a[1]);
        let refs: Vec<&[u8]> = res.iter().map(|v| v.as_slice()).collect();
        let (_, s) = set::add(w, st, None, &refs)?;
        ks::insert_object(w, st, &p, a[1], T_SET, s.enc, s.obj)?;
    }
    int(out, res.len() as i64);
    Ok(())
}

/// SMOVE.
pub(super) fn smove(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    // Redis' order: a missing source answers 0 before any type check.
    let Some(src) = ks::lookup(w, st, a[1]) else {
        int(out, 0);
        return Ok(());
    };
    let dst = ks::lookup(w, st, a[2]);
    if src.ty() != T_SET || dst.as_ref().is_some_and(|d| d.ty() != T_SET) {
        wrongtype(out);
        return Ok(());
    }
    if a[1] == a[2] {
        int(out, set::contains(w, st, set_obj(&src), a[3]) as i64);
        return Ok(());
    }
    let (n, s) = set::remove(w, st, set_obj(&src), &a[3..4])?;
    if n == 0 {
        int(out, 0);
        return Ok(());
    }
    shrink_obj(w, st, &src, set::card(w, s) == 0, s.enc, s.obj)?;
    let (p, d) = ks::probe(w, st, a[2]);
    let (_, s) = set::add(w, st, d.as_ref().map(set_obj), &a[3..4])?;
    upsert_obj(w, st, &p, a[2], d, T_SET, s.enc, s.obj)?;
    int(out, 1);
    Ok(())
}

/// SREM.
pub(super) fn srem(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((_, e)) = probe_typed(w, st, a[1], T_SET, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        int(out, 0);
        return Ok(());
    };
    let (n, s) = set::remove(w, st, set_obj(&e), &a[2..])?;
    shrink_obj(w, st, &e, set::card(w, s) == 0, s.enc, s.obj)?;
    int(out, n as i64);
    Ok(())
}

/// SPOP.
pub(super) fn spop(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    if a.len() > 3 {
        syntax(out);
        return Ok(());
    }
    let count = match a.get(2) {
        Some(c) => match count_arg(c, out) {
            Some(c) => Some(c),
            None => return Ok(()),
        },
        None => None,
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_SET, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        if count.is_some() {
            array(out, 0);
        } else {
            null(out);
        }
        return Ok(());
    };
    let (vals, s) = set::pop(w, st, set_obj(&e), count.unwrap_or(1))?;
    shrink_obj(w, st, &e, set::card(w, s) == 0, s.enc, s.obj)?;
    match count {
        None => match vals.first() {
            Some(v) => bulk(out, v),
            None => null(out),
        },
        Some(_) => {
            array(out, vals.len());
            vals.iter().for_each(|v| bulk(out, v));
        }
    }
    Ok(())
}
