//! The string commands: GET, SET and its variants (SETNX, SETEX, PSETEX, GETSET, GETDEL,
//! GETEX, MGET, MSET, MSETNX), INCR, DECR, INCRBY, DECRBY, INCRBYFLOAT, APPEND, STRLEN,
//! GETRANGE, SUBSTR, SETRANGE and LCS. The bit commands are in `bitmaps`.

use super::data::{
    deadline_arg, found, is, look, parse_i64, probe_typed, set_ttl, without_ttl, Counters, HResult,
    Look, Ttl,
};
use super::reply::{self, array, bulk, int, not_int, null, syntax, wrongtype};
use super::table::Id;
use crate::ds::keyspace::{self as ks, T_STRING};
use crate::ds::{expire, Mem, Store, Wtx};

/// LCS's reply for strings `a` and `b` (Redis 7.0's table of LCS lengths and its walk back
/// from the end): the common subsequence, its length (`getlen`), or with `getidx` the matched
/// ranges, last first, each as `[[a_start, a_end], [b_start, b_end]]` (plus its length with
/// `withmatchlen`) when at least `minmatchlen` long, and the length. A table larger than
/// proto-max-bulk-len (512 MiB of 4-byte cells) is refused, as Redis does.
fn lcs_reply(
    out: &mut Vec<u8>,
    a: &[u8],
    b: &[u8],
    getlen: bool,
    getidx: bool,
    withmatchlen: bool,
    minmatchlen: u64,
) {
    let (alen, blen) = (a.len(), b.len());
    let cells = (alen as u64 + 1).saturating_mul(blen as u64 + 1);
    if cells.saturating_mul(4) > 512 << 20 {
        return reply::error(
            out,
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
        );
    }
    let w = blen + 1;
    let mut dp = vec![0u32; cells as usize];
    for i in 1..=alen {
        for j in 1..=blen {
            dp[i * w + j] = if a[i - 1] == b[j - 1] {
                dp[(i - 1) * w + j - 1] + 1
            } else {
                dp[(i - 1) * w + j].max(dp[i * w + j - 1])
            };
        }
    }
    let total = dp[alen * w + blen] as usize;
    if getlen {
        return int(out, total as i64);
    }
    let mut result = vec![0u8; total];
    let mut ranges: Vec<[u64; 5]> = Vec::new();
    let (mut i, mut j, mut idx) = (alen, blen, total);
    let (mut a_start, mut a_end, mut b_start, mut b_end) = (alen, 0usize, 0usize, 0usize);
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            result[idx - 1] = a[i - 1];
            if a_start == alen {
                (a_start, a_end, b_start, b_end) = (i - 1, i - 1, j - 1, j - 1);
            } else if a_start == i && b_start == j {
                a_start -= 1;
                b_start -= 1;
            } else {
                emit = true;
            }
            if a_start == 0 || b_start == 0 {
                emit = true;
            }
            idx -= 1;
            i -= 1;
            j -= 1;
        } else {
            if dp[(i - 1) * w + j] > dp[i * w + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            if a_start != alen {
                emit = true;
            }
        }
        if emit {
            let len = (a_end - a_start + 1) as u64;
            if minmatchlen == 0 || len >= minmatchlen {
                ranges.push([
                    a_start as u64,
                    a_end as u64,
                    b_start as u64,
                    b_end as u64,
                    len,
                ]);
            }
            a_start = alen;
        }
    }
    if !getidx {
        return bulk(out, &result);
    }
    array(out, 4);
    bulk(out, b"matches");
    array(out, ranges.len());
    for r in &ranges {
        array(out, 2 + withmatchlen as usize);
        array(out, 2);
        int(out, r[0] as i64);
        int(out, r[1] as i64);
        array(out, 2);
        int(out, r[2] as i64);
        int(out, r[3] as i64);
        if withmatchlen {
            int(out, r[4] as i64);
        }
    }
    bulk(out, b"len");
    int(out, total as i64);
}

/// GETRANGE's slice of a `len`-byte string, Redis 7.0's rules: `None` for the empty reply.
fn getrange_span(start: i64, end: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    if start < 0 && end < 0 && start > end {
        return None;
    }
    let mut s = if start < 0 { len + start } else { start };
    let mut e = if end < 0 { len + end } else { end };
    s = s.max(0);
    e = e.max(0);
    if e >= len {
        e = len - 1;
    }
    if s > e || len == 0 {
        return None;
    }
    Some((s as usize, e as usize + 1))
}

/// SET's and GETEX's options (Redis 7.0's parseExtendedStringArgumentsOrReply).
#[derive(Default)]
struct SetOptions<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    ttl: Option<(Ttl, &'a [u8])>,
}

/// Parse `a[from..]` as SET's options (`set`) or GETEX's; `None` after a syntax error reply.
/// As Redis: a repeated EX (PX, EXAT, PXAT) takes the last value; mixing units, or a time with
/// KEEPTTL or PERSIST, is a syntax error.
fn set_options<'a>(
    a: &[&'a [u8]],
    from: usize,
    set: bool,
    out: &mut Vec<u8>,
) -> Option<SetOptions<'a>> {
    let mut o = SetOptions::default();
    let mut i = from;
    while i < a.len() {
        let opt = a[i];
        let next = a.get(i + 1).copied();
        let unit = [
            ("EX", Ttl::Ex),
            ("PX", Ttl::Px),
            ("EXAT", Ttl::Exat),
            ("PXAT", Ttl::Pxat),
        ]
        .into_iter()
        .find(|(n, _)| is(opt, n))
        .map(|(_, u)| u);
        if set && is(opt, "NX") && !o.xx {
            o.nx = true;
        } else if set && is(opt, "XX") && !o.nx {
            o.xx = true;
        } else if set && is(opt, "GET") {
            o.get = true;
        } else if set && is(opt, "KEEPTTL") && !o.persist && o.ttl.is_none() {
            o.keepttl = true;
        } else if !set && is(opt, "PERSIST") && o.ttl.is_none() && !o.keepttl {
            o.persist = true;
        } else if let (Some(u), Some(v)) = (unit, next) {
            if o.keepttl || o.persist || o.ttl.is_some_and(|(t, _)| t != u) {
                syntax(out);
                return None;
            }
            o.ttl = Some((u, v));
            i += 1;
        } else {
            syntax(out);
            return None;
        }
        i += 1;
    }
    Some(o)
}

/// SET.
pub(super) fn set(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    // Redis 7.0's setCommand and setGenericCommand, step for step.
    let Some(o) = set_options(a, 3, true, out) else {
        return Ok(());
    };
    let at = match o.ttl {
        Some((unit, arg)) => match deadline_arg(arg, unit, "set", out) {
            Some(t) => Some(t),
            None => return Ok(()),
        },
        None => None,
    };
    let (p, e) = ks::probe(w, st, a[1]);
    if o.get {
        match e {
            Some(e) if e.ty() != T_STRING => {
                wrongtype(out);
                return Ok(());
            }
            Some(e) => bulk(out, &ks::string_value(w, &e)),
            None => null(out),
        }
    }
    if o.nx && e.is_some() || o.xx && e.is_none() {
        if !o.get {
            null(out);
        }
        return Ok(());
    }
    match e {
        Some(e) => {
            let e = if o.keepttl { e } else { without_ttl(w, st, e)? };
            ks::set_string(w, st, &e, a[2])?
        }
        None => ks::insert_string(w, st, &p, a[1], a[2])?,
    }
    set_ttl(w, st, a[1], at)?;
    if !o.get {
        reply::ok(out);
    }
    Ok(())
}

/// GET.
pub(super) fn get<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_STRING, out, null) else {
        return;
    };
    bulk(out, &ks::string_value(m, &e));
}

/// STRLEN.
pub(super) fn strlen<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_STRING, out, |o| int(o, 0)) else {
        return;
    };
    int(out, ks::string_len(m, &e) as i64);
}

/// MGET.
pub(super) fn mget<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    array(out, a.len() - 1);
    for k in &a[1..] {
        match ks::lookup(m, st, k) {
            Some(e) if e.ty() == T_STRING => {
                cx.hits += 1;
                bulk(out, &ks::string_value(m, &e));
            }
            _ => {
                cx.misses += 1;
                null(out);
            }
        }
    }
}

/// LCS.
pub(super) fn lcs<M: Mem>(_cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    // Redis 7.0's lcsCommand, step for step: both keys strings (a missing one is
    // empty), then the options, then the table's size against proto-max-bulk-len.
    let mut v: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    for (k, slot) in [a[1], a[2]].into_iter().zip(v.iter_mut()) {
        match look(m, st, k, T_STRING) {
            Look::Wrong => {
                return reply::error(out, "ERR The specified keys must contain string values")
            }
            Look::Found(e) => *slot = ks::string_value(m, &e).into_owned(),
            Look::Missing => {}
        }
    }
    let (mut getlen, mut getidx, mut withmatchlen, mut minmatchlen) = (false, false, false, 0u64);
    let mut j = 3;
    while j < a.len() {
        let opt = a[j];
        if opt.eq_ignore_ascii_case(b"IDX") {
            getidx = true;
        } else if opt.eq_ignore_ascii_case(b"LEN") {
            getlen = true;
        } else if opt.eq_ignore_ascii_case(b"WITHMATCHLEN") {
            withmatchlen = true;
        } else if opt.eq_ignore_ascii_case(b"MINMATCHLEN") && j + 1 < a.len() {
            let Some(n) = parse_i64(a[j + 1]) else {
                return not_int(out);
            };
            minmatchlen = n.max(0) as u64;
            j += 1;
        } else {
            return reply::error(out, "ERR syntax error");
        }
        j += 1;
    }
    if getidx && getlen {
        return reply::error(
            out,
            "ERR If you want both the length and indexes, please just use IDX.",
        );
    }
    lcs_reply(out, &v[0], &v[1], getlen, getidx, withmatchlen, minmatchlen);
}

/// GETRANGE and SUBSTR.
pub(super) fn getrange<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let (Some(s), Some(e)) = (parse_i64(a[2]), parse_i64(a[3])) else {
        return not_int(out);
    };
    let Some(ent) = found(cx, st, m, a[1], T_STRING, out, |o| bulk(o, b"")) else {
        return;
    };
    let v = ks::string_value(m, &ent);
    match getrange_span(s, e, v.len()) {
        Some((s, e)) => bulk(out, &v[s..e]),
        None => bulk(out, b""),
    }
}

/// SETNX.
pub(super) fn setnx(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let (p, e) = ks::probe(w, st, a[1]);
    if e.is_some() {
        int(out, 0);
    } else {
        ks::insert_string(w, st, &p, a[1], a[2])?;
        int(out, 1);
    }
    Ok(())
}

/// SETEX and PSETEX (`id` says which).
pub(super) fn setex(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let (unit, name) = if id == Id::Setex {
        (Ttl::Ex, "setex")
    } else {
        (Ttl::Px, "psetex")
    };
    let Some(at) = deadline_arg(a[2], unit, name, out) else {
        return Ok(());
    };
    let (p, e) = ks::probe(w, st, a[1]);
    match e {
        Some(e) => {
            let e = without_ttl(w, st, e)?;
            ks::set_string(w, st, &e, a[3])?;
        }
        None => ks::insert_string(w, st, &p, a[1], a[3])?,
    }
    set_ttl(w, st, a[1], Some(at))?;
    reply::ok(out);
    Ok(())
}

/// GETEX.
pub(super) fn getex(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    // Redis 7.0's getexCommand: options, the key (nil) and its type, the time, then
    // the value's reply before the key's deadline changes.
    let Some(o) = set_options(a, 2, false, out) else {
        return Ok(());
    };
    let Some(e) = ks::lookup(w, st, a[1]) else {
        null(out);
        return Ok(());
    };
    if e.ty() != T_STRING {
        wrongtype(out);
        return Ok(());
    }
    let at = match o.ttl {
        Some((unit, arg)) => match deadline_arg(arg, unit, "getex", out) {
            Some(t) => Some(t),
            None => return Ok(()),
        },
        None => None,
    };
    bulk(out, &ks::string_value(w, &e));
    match (o.ttl, at) {
        (Some((Ttl::Exat | Ttl::Pxat, _)), Some(t)) if t <= expire::now_ms() => {
            ks::delete(w, st, &e)?
        }
        (_, Some(t)) => {
            expire::set(w, st, &e, t)?;
        }
        _ if o.persist => {
            expire::remove(w, st, &e, true)?;
        }
        _ => {}
    }
    Ok(())
}

/// GETSET.
pub(super) fn getset(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((p, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
        return Ok(());
    };
    match e {
        Some(e) => {
            let old = ks::string_value(w, &e).into_owned();
            let e = without_ttl(w, st, e)?;
            ks::set_string(w, st, &e, a[2])?;
            bulk(out, &old);
        }
        None => {
            ks::insert_string(w, st, &p, a[1], a[2])?;
            null(out);
        }
    }
    Ok(())
}

/// GETDEL.
pub(super) fn getdel(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((_, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
        return Ok(());
    };
    match e {
        Some(e) => {
            let old = ks::string_value(w, &e).into_owned();
            ks::delete(w, st, &e)?;
            bulk(out, &old);
        }
        None => null(out),
    }
    Ok(())
}

/// MSET and MSETNX (`id` says which).
pub(super) fn mset(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    if a.len() % 2 == 0 {
        reply::error(
            out,
            &format!(
                "ERR wrong number of arguments for '{}' command",
                if id == Id::Mset { "mset" } else { "msetnx" }
            ),
        );
        return Ok(());
    }
    if id == Id::Msetnx
        && a[1..]
            .chunks(2)
            .any(|kv| ks::lookup(w, st, kv[0]).is_some())
    {
        int(out, 0);
        return Ok(());
    }
    for kv in a[1..].chunks(2) {
        let (p, e) = ks::probe(w, st, kv[0]);
        match e {
            Some(e) => {
                let e = without_ttl(w, st, e)?;
                ks::set_string(w, st, &e, kv[1])?
            }
            None => ks::insert_string(w, st, &p, kv[0], kv[1])?,
        }
    }
    if id == Id::Mset {
        reply::ok(out);
    } else {
        int(out, 1);
    }
    Ok(())
}

/// INCR, DECR, INCRBY and DECRBY (`id` says which).
pub(super) fn incr(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let by = match id {
        Id::Incr => 1,
        Id::Decr => -1,
        _ => match parse_i64(a[2]) {
            Some(v) if id == Id::Incrby => v,
            Some(v) if v != i64::MIN => -v,
            Some(_) => {
                reply::error(out, "ERR decrement would overflow");
                return Ok(());
            }
            None => {
                not_int(out);
                return Ok(());
            }
        },
    };
    let Ok((p, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
        return Ok(());
    };
    let cur = match &e {
        Some(e) => match parse_i64(&ks::string_value(w, e)) {
            Some(v) => v,
            None => {
                not_int(out);
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
    match e {
        Some(e) => ks::set_string(w, st, &e, &buf)?,
        None => ks::insert_string(w, st, &p, a[1], &buf)?,
    }
    int(out, new);
    Ok(())
}

/// APPEND.
pub(super) fn append(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((p, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
        return Ok(());
    };
    let n = match e {
        Some(e) => {
            let mut v = ks::string_value(w, &e).into_owned();
            v.extend_from_slice(a[2]);
            ks::set_string(w, st, &e, &v)?;
            v.len()
        }
        None => {
            ks::insert_string(w, st, &p, a[1], a[2])?;
            a[2].len()
        }
    };
    int(out, n as i64);
    Ok(())
}

/// INCRBYFLOAT.
pub(super) fn incrbyfloat(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((p, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
        return Ok(());
    };
    let cur = e
        .as_ref()
        .map_or_else(|| b"0".to_vec(), |e| ks::string_value(w, e).into_owned());
    let v = match super::ldfloat::add(&cur, a[2]) {
        super::ldfloat::LdSum::Sum(v) => v,
        super::ldfloat::LdSum::NotFinite => {
            reply::error(out, "ERR increment would produce NaN or Infinity");
            return Ok(());
        }
        _ => {
            reply::error(out, "ERR value is not a valid float");
            return Ok(());
        }
    };
    match e {
        Some(e) => ks::set_string(w, st, &e, &v)?,
        None => ks::insert_string(w, st, &p, a[1], &v)?,
    }
    bulk(out, &v);
    Ok(())
}

/// SETRANGE.
pub(super) fn setrange(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Some(off) = parse_i64(a[2]) else {
        not_int(out);
        return Ok(());
    };
    if off < 0 {
        reply::error(out, "ERR offset is out of range");
        return Ok(());
    }
    let off = off as usize;
    let Ok((p, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
        return Ok(());
    };
    let cur = e
        .as_ref()
        .map(|e| ks::string_len(w, e) as usize)
        .unwrap_or(0);
    if a[3].is_empty() {
        // Nothing to write: the length as it is (no key created).
        int(out, cur as i64);
        return Ok(());
    }
    if off + a[3].len() > 512 << 20 {
        reply::error(
            out,
            "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        );
        return Ok(());
    }
    let mut v = e
        .as_ref()
        .map(|e| ks::string_value(w, e).into_owned())
        .unwrap_or_default();
    if v.len() < off + a[3].len() {
        v.resize(off + a[3].len(), 0);
    }
    v[off..off + a[3].len()].copy_from_slice(a[3]);
    match e {
        Some(e) => ks::set_string(w, st, &e, &v)?,
        None => ks::insert_string(w, st, &p, a[1], &v)?,
    }
    int(out, v.len() as i64);
    Ok(())
}
