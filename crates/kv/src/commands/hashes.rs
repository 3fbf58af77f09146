//! The hash commands: HSET, HMSET, HSETNX, HGET, HMGET, HGETALL, HKEYS, HVALS, HDEL, HLEN,
//! HEXISTS, HSTRLEN, HINCRBY, HINCRBYFLOAT, HRANDFIELD. HSCAN is in `data`.

use super::data::{
    found, hash_obj, look, parse_i64, probe_typed, random_args, random_reply, shrink_obj,
    upsert_obj, Counters, HResult, Look,
};
use super::reply::{self, array, bulk, int, not_int, null, wrongtype};
use super::table::Id;
use crate::ds::keyspace::{ENC_PACK, T_HASH};
use crate::ds::{hash, Mem, Store, Wtx};

/// HSTRLEN.
pub(super) fn hstrlen<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(e) = found(cx, st, m, a[1], T_HASH, out, |o| int(o, 0)) else {
        return;
    };
    let n = hash::get(m, st, hash_obj(&e), a[2]).map_or(0, |v| v.len());
    int(out, n as i64);
}

/// HRANDFIELD.
pub(super) fn hrandfield<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some((e, count, withvalues)) = random_args(m, st, a, T_HASH, Some("withvalues"), out)
    else {
        return;
    };
    let mut all: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    hash::for_each(m, hash_obj(&e), |f, v| all.push((f.to_vec(), v.to_vec())));
    let per = if withvalues { 2 } else { 1 };
    random_reply(out, &mut all, count, per, |out, (f, v)| {
        bulk(out, f);
        if withvalues {
            bulk(out, v);
        }
    });
}

/// HGET.
pub(super) fn hget<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_HASH, out, null) else {
        return;
    };
    match hash::get(m, st, hash_obj(&e), a[2]) {
        Some(v) => bulk(out, &v),
        None => null(out),
    }
}

/// HMGET.
pub(super) fn hmget<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let e = match look(m, st, a[1], T_HASH) {
        Look::Wrong => return wrongtype(out),
        Look::Missing => {
            cx.misses += 1;
            None
        }
        Look::Found(e) => {
            cx.hits += 1;
            Some(e)
        }
    };
    array(out, a.len() - 2);
    match e {
        None => (2..a.len()).for_each(|_| null(out)),
        Some(e) => {
            let h = hash_obj(&e);
            if h.enc == ENC_PACK {
                // One scan of the pack per field, from the view.
                let body = crate::ds::pack::body(m, h.obj);
                for f in &a[2..] {
                    let v = crate::ds::pack::find(&body, f, true, h.obj)
                        .and_then(|p| crate::ds::pack::item(&body, p.value, h.obj));
                    match v {
                        Some((v, _)) => bulk(out, v),
                        None => null(out),
                    }
                }
            } else {
                for f in &a[2..] {
                    match hash::get(m, st, h, f) {
                        Some(v) => bulk(out, &v),
                        None => null(out),
                    }
                }
            }
        }
    }
}

/// HGETALL, HKEYS and HVALS (`id` says which).
pub(super) fn hgetall_keys_vals<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(e) = found(cx, st, m, a[1], T_HASH, out, |o| array(o, 0)) else {
        return;
    };
    let h = hash_obj(&e);
    let n = hash::len(m, h) as usize;
    array(out, if id == Id::Hgetall { 2 * n } else { n });
    hash::for_each(m, h, |f, v| {
        if id != Id::Hvals {
            bulk(out, f);
        }
        if id != Id::Hkeys {
            bulk(out, v);
        }
    });
}

/// HLEN.
pub(super) fn hlen<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_HASH, out, |o| int(o, 0)) else {
        return;
    };
    int(out, hash::len(m, hash_obj(&e)) as i64);
}

/// HEXISTS.
pub(super) fn hexists<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(e) = found(cx, st, m, a[1], T_HASH, out, |o| int(o, 0)) else {
        return;
    };
    int(out, hash::get(m, st, hash_obj(&e), a[2]).is_some() as i64);
}

/// HINCRBYFLOAT.
pub(super) fn hincrbyfloat(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    use super::ldfloat::{add, LdSum};
    // Redis' order: the increment first (a float, and finite), then the key's type.
    match add(b"0", a[3]) {
        LdSum::Sum(_) => {}
        LdSum::NotFinite => {
            reply::error(out, "ERR value is NaN or Infinity");
            return Ok(());
        }
        _ => {
            reply::error(out, "ERR value is not a valid float");
            return Ok(());
        }
    }
    let Ok((p, e)) = probe_typed(w, st, a[1], T_HASH, out) else {
        return Ok(());
    };
    let cur = e
        .as_ref()
        .and_then(|e| hash::get(w, st, hash_obj(e), a[2]))
        .map_or_else(|| b"0".to_vec(), |v| v.into_owned());
    let v = match add(&cur, a[3]) {
        LdSum::Sum(v) => v,
        LdSum::NotFinite => {
            reply::error(out, "ERR increment would produce NaN or Infinity");
            return Ok(());
        }
        _ => {
            reply::error(out, "ERR hash value is not a float");
            return Ok(());
        }
    };
    let (_, h) = hash::set(w, st, e.as_ref().map(hash_obj), &[(a[2], &v)])?;
    upsert_obj(w, st, &p, a[1], e, T_HASH, h.enc, h.obj)?;
    bulk(out, &v);
    Ok(())
}

/// HSET, HMSET and HSETNX (`id` says which).
pub(super) fn hset(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    if a.len() % 2 != 0 {
        reply::error(
            out,
            &format!(
                "ERR wrong number of arguments for '{}' command",
                if id == Id::Hset { "hset" } else { "hmset" }
            ),
        );
        return Ok(());
    }
    let Ok((p, e)) = probe_typed(w, st, a[1], T_HASH, out) else {
        return Ok(());
    };
    if id == Id::Hsetnx {
        if let Some(e) = &e {
            if hash::get(w, st, hash_obj(e), a[2]).is_some() {
                int(out, 0);
                return Ok(());
            }
        }
    }
    let pairs: Vec<(&[u8], &[u8])> = a[2..].chunks(2).map(|c| (c[0], c[1])).collect();
    let (n, h) = hash::set(w, st, e.as_ref().map(hash_obj), &pairs)?;
    upsert_obj(w, st, &p, a[1], e, T_HASH, h.enc, h.obj)?;
    if id == Id::Hmset {
        reply::ok(out);
    } else {
        int(out, n as i64);
    }
    Ok(())
}

/// HDEL.
pub(super) fn hdel(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((_, e)) = probe_typed(w, st, a[1], T_HASH, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        int(out, 0);
        return Ok(());
    };
    let (n, h) = hash::del(w, st, hash_obj(&e), &a[2..])?;
    shrink_obj(w, st, &e, hash::len(w, h) == 0, h.enc, h.obj)?;
    int(out, n as i64);
    Ok(())
}

/// HINCRBY.
pub(super) fn hincrby(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Some(by) = parse_i64(a[3]) else {
        not_int(out);
        return Ok(());
    };
    let Ok((p, e)) = probe_typed(w, st, a[1], T_HASH, out) else {
        return Ok(());
    };
    let cur = match e.as_ref().and_then(|e| hash::get(w, st, hash_obj(e), a[2])) {
        Some(v) => match parse_i64(&v) {
            Some(v) => v,
            None => {
                reply::error(out, "ERR hash value is not an integer");
                return Ok(());
            }
        },
        None => 0,
    };
    let Some(new) = cur.checked_add(by) else {
        reply::error(out, "ERR increment or decrement would overflow");
        return Ok(());
    };
    let mut buf = Vec::with_capacity(20);
    reply::push_int(&mut buf, new);
    let (_, h) = hash::set(w, st, e.as_ref().map(hash_obj), &[(a[2], &buf)])?;
    upsert_obj(w, st, &p, a[1], e, T_HASH, h.enc, h.obj)?;
    int(out, new);
    Ok(())
}
