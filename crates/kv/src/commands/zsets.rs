//! The sorted-set commands: ZADD, ZINCRBY, ZREM, ZSCORE, ZMSCORE, ZCARD, ZCOUNT, ZLEXCOUNT,
//! ZRANK, ZREVRANK, the ZRANGE family and ZRANGESTORE, the ZREMRANGE family, ZPOPMIN,
//! ZPOPMAX, ZRANDMEMBER, ZUNION, ZINTER, ZDIFF, their STORE forms and ZINTERCARD. ZSCAN is in
//! `data`; ZMPOP and the blocking pops in `pops`.

use super::data::{
    count_arg, found, is, look, parse_f64, parse_i64, probe_typed, random_args, random_reply,
    resolve, set_obj, Counters, HResult, Look,
};
use super::reply::{self, array, bulk, int, not_int, null, syntax, wrongtype};
use super::table::Id;
use crate::ds::keyspace::{self as ks, T_SET, T_ZSET};
use crate::ds::zset::{AddFlags, Added, Bound, Lex, ScoreRange};
use crate::ds::{set, zset, Mem, Store, Wtx};

fn parse_bound(b: &[u8]) -> Option<Bound> {
    let (excl, s) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    Some(Bound {
        score: parse_f64(s)?,
        excl,
    })
}

/// ZRANK / ZREVRANK: the member's rank (O(log n), by the skiplist's spans).
fn rank_of<M: Mem>(m: &M, st: &Store, z: u64, member: &[u8], rev: bool) -> Option<u64> {
    let r = zset::rank(m, st, z, member)?;
    Some(if rev { zset::len(m, z) - 1 - r } else { r })
}

/// Members with their scores, in order.
type Scored = Vec<(Vec<u8>, f64)>;

/// ZRANGE, ZREVRANGE, ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZRANGEBYLEX and ZREVRANGEBYLEX (`id` says
/// which).
pub(super) fn zrange<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some((sel, withscores)) = zrange_select(cx, st, m, id, a, false, out) else {
        return;
    };
    array(out, if withscores { 2 * sel.len() } else { sel.len() });
    for (mem, s) in &sel {
        bulk(out, mem);
        if withscores {
            reply::double(out, *s);
        }
    }
}

/// What ZRANGE (and ZREVRANGE, Z(REV)RANGEBYSCORE, Z(REV)RANGEBYLEX; `a` as theirs: the key at
/// 1, the range at 2 and 3, options after) selects: the members with their scores in reply
/// order, and whether WITHSCORES was given. `None` after replying an error. `store`
/// (ZRANGESTORE): WITHSCORES is a syntax error, as in Redis.
fn zrange_select<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    store: bool,
    out: &mut Vec<u8>,
) -> Option<(Scored, bool)> {
    let (mut withscores, mut rev, mut byscore, mut bylex) = (false, false, false, false);
    let mut limit: Option<(i64, i64)> = None;
    rev |= matches!(
        id,
        Id::Zrevrange | Id::Zrevrangebyscore | Id::Zrevrangebylex
    );
    byscore |= matches!(id, Id::Zrangebyscore | Id::Zrevrangebyscore);
    bylex |= matches!(id, Id::Zrangebylex | Id::Zrevrangebylex);
    let mut i = 4;
    while i < a.len() {
        if is(a[i], "WITHSCORES") && !store {
            withscores = true;
        } else if is(a[i], "LIMIT") && !matches!(id, Id::Zrevrange) && i + 2 < a.len() {
            let (Some(o), Some(c)) = (parse_i64(a[i + 1]), parse_i64(a[i + 2])) else {
                not_int(out);
                return None;
            };
            limit = Some((o, c));
            i += 2;
        } else if id == Id::Zrange && is(a[i], "REV") {
            rev = true;
        } else if id == Id::Zrange && is(a[i], "BYSCORE") {
            byscore = true;
        } else if id == Id::Zrange && is(a[i], "BYLEX") {
            bylex = true;
        } else {
            syntax(out);
            return None;
        }
        i += 1;
    }
    // As Redis: a LIMIT that selects everything (0 -1) is no LIMIT.
    if limit.is_some_and(|l| l != (0, -1)) && !byscore && !bylex {
        reply::error(
            out,
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
        return None;
    }
    if withscores && bylex {
        reply::error(
            out,
            "ERR syntax error, WITHSCORES not supported in combination with BYLEX",
        );
        return None;
    }
    let mut sel: Scored = Vec::new();
    // The source: a missing key selects nothing (ZRANGE replies an empty array, ZRANGESTORE
    // stores nothing); another type is WRONGTYPE. Checked after the arguments, as Redis does.
    let source = |cx: &mut Counters, out: &mut Vec<u8>| match look(m, st, a[1], T_ZSET) {
        Look::Missing => {
            cx.misses += 1;
            Ok(None)
        }
        Look::Wrong => {
            wrongtype(out);
            Err(())
        }
        Look::Found(e) => {
            cx.hits += 1;
            Ok(Some(e))
        }
    };
    if bylex {
        let (lo, hi) = if rev { (a[3], a[2]) } else { (a[2], a[3]) };
        let (Some(min), Some(max)) = (Lex::parse(lo), Lex::parse(hi)) else {
            reply::error(out, "ERR min or max not valid string range item");
            return None;
        };
        let Some(e) = source(cx, out).ok()? else {
            return Some((sel, withscores));
        };
        let (offset, count) = limit.unwrap_or((0, -1));
        if offset < 0 {
            return Some((sel, withscores));
        }
        zset::range_by_lex(
            m,
            e.obj(),
            &min,
            &max,
            rev,
            offset as u64,
            count,
            |mem, sc| sel.push((mem.to_vec(), sc)),
        );
        return Some((sel, withscores));
    }
    if byscore {
        // ZRANGEBYSCORE min max / ZREVRANGEBYSCORE max min / ZRANGE BYSCORE (REV: max min).
        let (lo, hi) = if rev { (a[3], a[2]) } else { (a[2], a[3]) };
        let (Some(min), Some(max)) = (parse_bound(lo), parse_bound(hi)) else {
            reply::error(out, "ERR min or max is not a float");
            return None;
        };
        let (offset, count) = limit.unwrap_or((0, -1));
        let Some(e) = source(cx, out).ok()? else {
            return Some((sel, withscores));
        };
        if offset < 0 {
            return Some((sel, withscores));
        }
        let r = ScoreRange {
            min,
            max,
            rev,
            offset: offset as u64,
            limit: count,
        };
        zset::range_by_score(m, e.obj(), r, |mem, s| sel.push((mem.to_vec(), s)));
        return Some((sel, withscores));
    }
    let (Some(s), Some(t)) = (parse_i64(a[2]), parse_i64(a[3])) else {
        not_int(out);
        return None;
    };
    let Some(e) = source(cx, out).ok()? else {
        return Some((sel, withscores));
    };
    if let Some((s, t)) = resolve(s, t, zset::len(m, e.obj())) {
        zset::range_by_rank(m, e.obj(), s, t, rev, |mem, sc| {
            sel.push((mem.to_vec(), sc))
        });
    }
    Some((sel, withscores))
}

/// The STORE of a sorted-set command: `key` becomes the sorted set of `members` whatever it
/// held, and is deleted when `members` is empty (Redis keeps no empty sets).
fn store_zset(w: &mut Wtx, st: &Store, key: &[u8], members: &[(Vec<u8>, f64)]) -> HResult {
    if let Some(e) = ks::lookup(w, st, key) {
        ks::delete(w, st, &e)?;
    }
    if !members.is_empty() {
        let z = zset::create(w)?;
        for (mem, sc) in members {
            zset::add(w, st, z, *sc, mem, AddFlags::default())?;
        }
        let (p, _) = ks::probe(w, st, key);
        ks::insert_object(w, st, &p, key, T_ZSET, 0, z)?;
    }
    Ok(())
}

/// How ZUNION/ZINTER/ZDIFF combine.
#[derive(Clone, Copy, PartialEq)]
enum ZOp {
    Union,
    Inter,
    Diff,
}

/// ZUNION, ZINTER, ZDIFF (`dst` None), their STORE forms (`dst` Some) and ZINTERCARD
/// (`card`): Redis 7.0's zunionInterDiffGenericCommand step for step — numkeys, the keys'
/// types (zsets, or sets with score 1), then WEIGHTS, AGGREGATE, WITHSCORES or LIMIT. The
/// result as (member, score) sorted as ZRANGE sorts, or the error reply written (`Err`).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn zsetop<M: Mem>(
    st: &Store,
    m: &M,
    name: &str,
    a: &[&[u8]],
    nk: usize,
    op: ZOp,
    store: bool,
    card: bool,
    out: &mut Vec<u8>,
) -> std::result::Result<(Vec<(Vec<u8>, f64)>, bool, usize), ()> {
    let Some(n) = parse_i64(a[nk]) else {
        not_int(out);
        return Err(());
    };
    if n < 1 {
        reply::error(
            out,
            &format!("ERR at least 1 input key is needed for '{name}' command"),
        );
        return Err(());
    }
    if n as usize > a.len() - (nk + 1) {
        syntax(out);
        return Err(());
    }
    let n = n as usize;
    let keys = &a[nk + 1..nk + 1 + n];
    // The inputs: members with their scores (sets: 1), or None for a missing key.
    let mut inputs: Vec<Option<Vec<(Vec<u8>, f64)>>> = Vec::with_capacity(n);
    for k in keys {
        match ks::lookup(m, st, k) {
            None => inputs.push(None),
            Some(e) if e.ty() == T_ZSET => {
                let mut v = Vec::new();
                let len = zset::len(m, e.obj());
                if len > 0 {
                    zset::range_by_rank(m, e.obj(), 0, len - 1, false, |mem, sc| {
                        v.push((mem.to_vec(), sc))
                    });
                }
                inputs.push(Some(v));
            }
            Some(e) if e.ty() == T_SET => {
                let mut v = Vec::new();
                set::for_each(m, set_obj(&e), |mem| v.push((mem.to_vec(), 1.0)));
                inputs.push(Some(v));
            }
            Some(_) => {
                wrongtype(out);
                return Err(());
            }
        }
    }
    let mut weights = vec![1.0f64; n];
    #[derive(Clone, Copy)]
    enum Agg {
        Sum,
        Min,
        Max,
    }
    let mut agg = Agg::Sum;
    let (mut withscores, mut limit) = (false, 0usize);
    let mut j = nk + 1 + n;
    while j < a.len() {
        let left = a.len() - j;
        if op != ZOp::Diff && !card && left > n && is(a[j], "WEIGHTS") {
            for (i, w) in weights.iter_mut().enumerate() {
                match parse_f64(a[j + 1 + i]) {
                    Some(v) if !v.is_nan() => *w = v,
                    _ => {
                        reply::error(out, "ERR weight value is not a float");
                        return Err(());
                    }
                }
            }
            j += 1 + n;
        } else if op != ZOp::Diff && !card && left >= 2 && is(a[j], "AGGREGATE") {
            agg = if is(a[j + 1], "SUM") {
                Agg::Sum
            } else if is(a[j + 1], "MIN") {
                Agg::Min
            } else if is(a[j + 1], "MAX") {
                Agg::Max
            } else {
                syntax(out);
                return Err(());
            };
            j += 2;
        } else if !store && !card && is(a[j], "WITHSCORES") {
            withscores = true;
            j += 1;
        } else if card && left >= 2 && is(a[j], "LIMIT") {
            match parse_i64(a[j + 1]) {
                Some(l) if l >= 0 => limit = l as usize,
                _ => {
                    reply::error(out, "ERR LIMIT can't be negative");
                    return Err(());
                }
            }
            j += 2;
        } else {
            syntax(out);
            return Err(());
        }
    }
    let aggregate = |t: &mut f64, v: f64| match agg {
        Agg::Sum => {
            *t += v;
            if t.is_nan() {
                *t = 0.0;
            }
        }
        Agg::Min => *t = t.min(v),
        Agg::Max => *t = t.max(v),
    };
    // A weighted value (NaN, from 0 × inf, counts 0): every value of a union, the first of an
    // intersection, whose later ones are aggregated raw (SUM zeroes a NaN sum; MIN and MAX
    // keep what they had), as Redis 7.0 does.
    let first = |s: f64, w: f64| {
        let v = s * w;
        if v.is_nan() {
            0.0
        } else {
            v
        }
    };
    // Redis' order of the inputs: by increasing size (a stable sort, as glibc's qsort of a
    // few elements), the difference's first kept first; it matters only where infinities
    // meet.
    let size = |i: &Option<Vec<(Vec<u8>, f64)>>| i.as_ref().map_or(0, |v| v.len());
    let mut order: Vec<usize> = (0..n).collect();
    match op {
        ZOp::Union | ZOp::Inter => order.sort_by_key(|&i| size(&inputs[i])),
        ZOp::Diff => {}
    }
    let inputs: Vec<Option<Vec<(Vec<u8>, f64)>>> =
        order.iter().map(|&i| inputs[i].clone()).collect();
    let weights: Vec<f64> = order.iter().map(|&i| weights[i]).collect();
    let mut res: Vec<(Vec<u8>, f64)> = match op {
        ZOp::Union => {
            let mut acc: std::collections::HashMap<Vec<u8>, f64> = Default::default();
            for (inp, &w) in inputs.iter().zip(&weights) {
                for (mem, sc) in inp.iter().flatten() {
                    match acc.get_mut(mem) {
                        Some(t) => aggregate(t, first(*sc, w)),
                        None => {
                            acc.insert(mem.clone(), first(*sc, w));
                        }
                    }
                }
            }
            acc.into_iter().collect()
        }
        ZOp::Inter => {
            if inputs
                .iter()
                .any(|i| i.as_ref().map_or(true, |v| v.is_empty()))
            {
                Vec::new()
            } else {
                let maps: Vec<std::collections::HashMap<&[u8], f64>> = inputs[1..]
                    .iter()
                    .flatten()
                    .map(|v| v.iter().map(|(m, s)| (m.as_slice(), *s)).collect())
                    .collect();
                let mut r = Vec::new();
                for (mem, sc) in inputs[0].iter().flatten() {
                    let mut t = first(*sc, weights[0]);
                    let mut all = true;
                    for (i, mp) in maps.iter().enumerate() {
                        match mp.get(mem.as_slice()) {
                            Some(&s2) => aggregate(&mut t, s2 * weights[i + 1]),
                            None => {
                                all = false;
                                break;
                            }
                        }
                    }
                    if all {
                        r.push((mem.clone(), t));
                        if card && limit > 0 && r.len() >= limit {
                            break;
                        }
                    }
                }
                r
            }
        }
        ZOp::Diff => {
            let others: std::collections::HashSet<&[u8]> = inputs[1..]
                .iter()
                .flatten()
                .flat_map(|v| v.iter().map(|(m, _)| m.as_slice()))
                .collect();
            inputs[0]
                .iter()
                .flatten()
                .filter(|(m, _)| !others.contains(m.as_slice()))
                .cloned()
                .collect()
        }
    };
    // By score, -0 equal to 0 (Redis prints it as -0 but sorts it as 0), then by member.
    res.sort_by(|x, y| {
        x.1.partial_cmp(&y.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| x.0.cmp(&y.0))
    });
    Ok((res, withscores, limit))
}

/// ZADD and ZINCRBY (`id` says which).
pub(super) fn zadd(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let mut f = AddFlags::default();
    let mut ch = false;
    let mut i = 2;
    if id == Id::Zadd {
        while i < a.len() {
            let o = a[i];
            if is(o, "NX") {
                f.nx = true;
            } else if is(o, "XX") {
                f.xx = true;
            } else if is(o, "GT") {
                f.gt = true;
            } else if is(o, "LT") {
                f.lt = true;
            } else if is(o, "CH") {
                ch = true;
            } else if is(o, "INCR") {
                f.incr = true;
            } else {
                break;
            }
            i += 1;
        }
    } else {
        f.incr = true;
    }
    let rest = &a[i..];
    if rest.is_empty() || rest.len() % 2 != 0 {
        syntax(out);
        return Ok(());
    }
    if f.nx && f.xx {
        reply::error(
            out,
            "ERR XX and NX options at the same time are not compatible",
        );
        return Ok(());
    }
    if (f.nx && (f.gt || f.lt)) || (f.gt && f.lt) {
        reply::error(
            out,
            "ERR GT, LT, and/or NX options at the same time are not compatible",
        );
        return Ok(());
    }
    if f.incr && rest.len() > 2 {
        reply::error(
            out,
            "ERR INCR option supports a single increment-element pair",
        );
        return Ok(());
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for c in rest.chunks(2) {
        let Some(s) = parse_f64(c[0]) else {
            reply::error(out, "ERR value is not a valid float");
            return Ok(());
        };
        pairs.push((s, c[1]));
    }
    let Ok((p, e)) = probe_typed(w, st, a[1], T_ZSET, out) else {
        return Ok(());
    };
    let z = match e {
        Some(e) => e.obj(),
        None if f.xx => {
            if f.incr {
                null(out);
            } else {
                int(out, 0);
            }
            return Ok(());
        }
        None => {
            let z = zset::create(w)?;
            ks::insert_object(w, st, &p, a[1], T_ZSET, 0, z)?;
            z
        }
    };
    let (mut added, mut changed) = (0, 0);
    let mut last = Added::Skipped;
    for (s, mem) in pairs {
        last = zset::add(w, st, z, s, mem, f)?;
        match last {
            Added::New(_) => added += 1,
            Added::Changed(_) => changed += 1,
            _ => {}
        }
    }
    if f.incr {
        match last {
            Added::New(s) | Added::Changed(s) | Added::Same(s) => reply::double(out, s),
            Added::Skipped => null(out),
            Added::Nan => reply::error(out, "ERR resulting score is not a number (NaN)"),
        }
    } else {
        int(out, if ch { added + changed } else { added });
    }
    Ok(())
}

/// ZUNION, ZINTER, ZDIFF and ZINTERCARD (`id` says which).
pub(super) fn zunion_inter_diff<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let (name, op) = match id {
        Id::Zunion => ("zunion", ZOp::Union),
        Id::Zinter => ("zinter", ZOp::Inter),
        Id::Zdiff => ("zdiff", ZOp::Diff),
        _ => ("zintercard", ZOp::Inter),
    };
    let card = id == Id::Zintercard;
    let Ok((res, withscores, limit)) = zsetop(st, m, name, a, 1, op, false, card, out) else {
        return;
    };
    if card {
        let n = if limit > 0 {
            res.len().min(limit)
        } else {
            res.len()
        };
        return int(out, n as i64);
    }
    array(out, if withscores { 2 * res.len() } else { res.len() });
    for (mem, sc) in &res {
        bulk(out, mem);
        if withscores {
            reply::double(out, *sc);
        }
    }
}

/// ZSCORE.
pub(super) fn zscore<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_ZSET, out, null) else {
        return;
    };
    match zset::score_of(m, st, e.obj(), a[2]) {
        Some(s) => reply::double(out, s),
        None => null(out),
    }
}

/// ZMSCORE.
pub(super) fn zmscore<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let e = match look(m, st, a[1], T_ZSET) {
        Look::Wrong => return wrongtype(out),
        Look::Missing => None,
        Look::Found(e) => Some(e),
    };
    array(out, a.len() - 2);
    for mem in &a[2..] {
        match e.as_ref().and_then(|e| zset::score_of(m, st, e.obj(), mem)) {
            Some(sc) => reply::double(out, sc),
            None => null(out),
        }
    }
}

/// ZRANDMEMBER.
pub(super) fn zrandmember<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some((e, count, withscores)) = random_args(m, st, a, T_ZSET, Some("withscores"), out)
    else {
        return;
    };
    let n = zset::len(m, e.obj());
    let mut all: Vec<(Vec<u8>, f64)> = Vec::with_capacity(n.min(1 << 16) as usize);
    if n > 0 {
        zset::range_by_rank(m, e.obj(), 0, n - 1, false, |mem, sc| {
            all.push((mem.to_vec(), sc))
        });
    }
    let per = if withscores { 2 } else { 1 };
    random_reply(out, &mut all, count, per, |out, (mem, sc)| {
        bulk(out, mem);
        if withscores {
            reply::double(out, *sc);
        }
    });
}

/// ZCARD.
pub(super) fn zcard<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_ZSET, out, |o| int(o, 0)) else {
        return;
    };
    int(out, zset::len(m, e.obj()) as i64);
}

/// ZRANK and ZREVRANK (`id` says which).
pub(super) fn zrank<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(e) = found(cx, st, m, a[1], T_ZSET, out, null) else {
        return;
    };
    match rank_of(m, st, e.obj(), a[2], id == Id::Zrevrank) {
        Some(r) => int(out, r as i64),
        None => null(out),
    }
}

/// ZLEXCOUNT.
pub(super) fn zlexcount<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let (Some(min), Some(max)) = (Lex::parse(a[2]), Lex::parse(a[3])) else {
        return reply::error(out, "ERR min or max not valid string range item");
    };
    let Some(e) = found(cx, st, m, a[1], T_ZSET, out, |o| int(o, 0)) else {
        return;
    };
    int(out, zset::count_by_lex(m, e.obj(), &min, &max) as i64);
}

/// ZCOUNT.
pub(super) fn zcount<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let (Some(min), Some(max)) = (parse_bound(a[2]), parse_bound(a[3])) else {
        return reply::error(out, "ERR min or max is not a float");
    };
    let Some(e) = found(cx, st, m, a[1], T_ZSET, out, |o| int(o, 0)) else {
        return;
    };
    int(out, zset::count_by_score(m, e.obj(), min, max) as i64);
}

/// ZUNIONSTORE, ZINTERSTORE and ZDIFFSTORE (`id` says which).
pub(super) fn zunion_inter_diff_store(
    st: &Store,
    w: &mut Wtx,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) -> HResult {
    let (name, op) = match id {
        Id::Zunionstore => ("zunionstore", ZOp::Union),
        Id::Zinterstore => ("zinterstore", ZOp::Inter),
        _ => ("zdiffstore", ZOp::Diff),
    };
    let Ok((res, _, _)) = zsetop(st, &*w, name, a, 2, op, true, false, out) else {
        return Ok(());
    };
    store_zset(w, st, a[1], &res)?;
    int(out, res.len() as i64);
    Ok(())
}

/// ZRANGESTORE.
pub(super) fn zrangestore(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    // ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]: ZRANGE's
    // selection of src (its arguments shifted by one), stored as dst.
    let mut cx = Counters::default();
    let Some((sel, _)) = zrange_select(&mut cx, st, &*w, Id::Zrange, &a[1..], true, out) else {
        return Ok(());
    };
    store_zset(w, st, a[1], &sel)?;
    int(out, sel.len() as i64);
    Ok(())
}

/// ZREMRANGEBYLEX.
pub(super) fn zremrangebylex(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let (Some(min), Some(max)) = (Lex::parse(a[2]), Lex::parse(a[3])) else {
        reply::error(out, "ERR min or max not valid string range item");
        return Ok(());
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_ZSET, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        int(out, 0);
        return Ok(());
    };
    let mut gone = Vec::new();
    zset::range_by_lex(w, e.obj(), &min, &max, false, 0, -1, |mem, _| {
        gone.push(mem.to_vec())
    });
    for mem in &gone {
        zset::remove(w, st, e.obj(), mem)?;
    }
    if zset::len(w, e.obj()) == 0 {
        ks::delete(w, st, &e)?;
    }
    int(out, gone.len() as i64);
    Ok(())
}

/// ZREMRANGEBYSCORE and ZREMRANGEBYRANK (`id` says which).
pub(super) fn zremrange(
    st: &Store,
    w: &mut Wtx,
    id: Id,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) -> HResult {
    // The range first (Redis' errors), then the key.
    let by_score = id == Id::Zremrangebyscore;
    let bounds = if by_score {
        match (parse_bound(a[2]), parse_bound(a[3])) {
            (Some(min), Some(max)) => Ok((min, max)),
            _ => {
                reply::error(out, "ERR min or max is not a float");
                return Ok(());
            }
        }
    } else {
        match (parse_i64(a[2]), parse_i64(a[3])) {
            (Some(s), Some(t)) => Err((s, t)),
            _ => {
                not_int(out);
                return Ok(());
            }
        }
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_ZSET, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        int(out, 0);
        return Ok(());
    };
    let mut doomed: Vec<Vec<u8>> = Vec::new();
    match bounds {
        Ok((min, max)) => {
            let r = ScoreRange {
                min,
                max,
                rev: false,
                offset: 0,
                limit: -1,
            };
            zset::range_by_score(w, e.obj(), r, |mem, _| doomed.push(mem.to_vec()));
        }
        Err((s, t)) => {
            if let Some((s, t)) = resolve(s, t, zset::len(w, e.obj())) {
                zset::range_by_rank(w, e.obj(), s, t, false, |mem, _| doomed.push(mem.to_vec()));
            }
        }
    }
    for mem in &doomed {
        zset::remove(w, st, e.obj(), mem)?;
    }
    if !doomed.is_empty() && zset::len(w, e.obj()) == 0 {
        ks::delete(w, st, &e)?;
    }
    int(out, doomed.len() as i64);
    Ok(())
}

/// ZREM.
pub(super) fn zrem(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((_, e)) = probe_typed(w, st, a[1], T_ZSET, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        int(out, 0);
        return Ok(());
    };
    let mut n = 0;
    for mem in &a[2..] {
        n += zset::remove(w, st, e.obj(), mem)? as i64;
    }
    if zset::len(w, e.obj()) == 0 {
        ks::delete(w, st, &e)?;
    }
    int(out, n);
    Ok(())
}

/// ZPOPMIN and ZPOPMAX (`id` says which).
pub(super) fn zpop(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    if a.len() > 3 {
        syntax(out);
        return Ok(());
    }
    let count = match a.get(2) {
        Some(c) => match count_arg(c, out) {
            Some(c) => c,
            None => return Ok(()),
        },
        None => 1,
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_ZSET, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        array(out, 0);
        return Ok(());
    };
    let vals = zset::pop(w, st, e.obj(), count, id == Id::Zpopmax)?;
    if zset::len(w, e.obj()) == 0 {
        ks::delete(w, st, &e)?;
    }
    array(out, 2 * vals.len());
    for (m, s) in vals {
        bulk(out, &m);
        reply::double(out, s);
    }
    Ok(())
}
