//! The list commands: LPUSH, RPUSH, LPUSHX, RPUSHX, LPOP, RPOP, LRANGE, LLEN, LINDEX, LPOS,
//! LSET, LINSERT, LREM, LTRIM, LMOVE, RPOPLPUSH. LMPOP and the blocking pops are in `pops`.

use super::data::{
    count_arg, found, is, look, parse_i64, probe_typed, resolve, Counters, HResult, Look,
};
use super::reply::{self, array, bulk, int, not_int, null, null_array, syntax, wrongtype};
use super::table::Id;
use crate::ds::keyspace::{self as ks, T_LIST};
use crate::ds::{list, Mem, Store, Wtx};
use crate::heap::HeapError;

/// LPOS's options after `key element`: (rank, count, maxlen); `None` after Redis' error.
fn lpos_args(a: &[&[u8]], out: &mut Vec<u8>) -> Option<(i64, Option<usize>, usize)> {
    let (mut rank, mut count, mut maxlen) = (1i64, None, 0usize);
    let mut i = 3;
    while i < a.len() {
        if i + 1 >= a.len() {
            syntax(out);
            return None;
        }
        let Some(v) = parse_i64(a[i + 1]) else {
            not_int(out);
            return None;
        };
        if is(a[i], "rank") {
            if v == 0 {
                reply::error(
                    out,
                    "ERR RANK can't be zero: use 1 to start from the first match, 2 from the \
                     second ... or use negative to start from the end of the list",
                );
                return None;
            }
            if v == i64::MIN {
                reply::error(out, "ERR value is out of range");
                return None;
            }
            rank = v;
        } else if is(a[i], "count") {
            if v < 0 {
                reply::error(out, "ERR COUNT can't be negative");
                return None;
            }
            count = Some(v as usize);
        } else if is(a[i], "maxlen") {
            if v < 0 {
                reply::error(out, "ERR MAXLEN can't be negative");
                return None;
            }
            maxlen = v as usize;
        } else {
            syntax(out);
            return None;
        }
        i += 2;
    }
    Some((rank, count, maxlen))
}

/// LPOS.
pub(super) fn lpos<M: Mem>(_cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some((rank, count, maxlen)) = lpos_args(a, out) else {
        return;
    };
    let e = match look(m, st, a[1], T_LIST) {
        Look::Wrong => return wrongtype(out),
        Look::Missing => {
            return match count {
                Some(_) => array(out, 0),
                None => null(out),
            };
        }
        Look::Found(e) => e,
    };
    let n = list::len(m, e.obj());
    // Walk from the head (positive rank) or the tail, at most `maxlen` elements.
    let elems = list::to_vec(m, e.obj());
    let order: Box<dyn Iterator<Item = usize>> = if rank > 0 {
        Box::new(0..n as usize)
    } else {
        Box::new((0..n as usize).rev())
    };
    let mut skip = rank.unsigned_abs() - 1;
    let want = match count {
        Some(0) => usize::MAX,
        Some(c) => c,
        None => 1,
    };
    let mut found = Vec::new();
    for (seen, i) in order.enumerate() {
        if maxlen != 0 && seen >= maxlen {
            break;
        }
        if elems[i] == a[2] {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            found.push(i as i64);
            if found.len() >= want {
                break;
            }
        }
    }
    match count {
        None => match found.first() {
            Some(&i) => int(out, i),
            None => null(out),
        },
        Some(_) => {
            array(out, found.len());
            for i in found {
                int(out, i);
            }
        }
    }
}

/// LRANGE.
pub(super) fn lrange<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let (Some(s), Some(e)) = (parse_i64(a[2]), parse_i64(a[3])) else {
        return not_int(out);
    };
    let Some(ent) = found(cx, st, m, a[1], T_LIST, out, |o| array(o, 0)) else {
        return;
    };
    match resolve(s, e, list::len(m, ent.obj())) {
        None => array(out, 0),
        Some((s, e)) => {
            array(out, (e - s + 1) as usize);
            list::range(m, ent.obj(), s, e, |v| {
                bulk(out, v);
                true
            });
        }
    }
}

/// LLEN.
pub(super) fn llen<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(e) = found(cx, st, m, a[1], T_LIST, out, |o| int(o, 0)) else {
        return;
    };
    int(out, list::len(m, e.obj()) as i64);
}

/// LINDEX.
pub(super) fn lindex<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(i) = parse_i64(a[2]) else {
        return not_int(out);
    };
    let Some(e) = found(cx, st, m, a[1], T_LIST, out, null) else {
        return;
    };
    let n = list::len(m, e.obj()) as i64;
    let i = if i < 0 { i + n } else { i };
    match (i >= 0 && i < n)
        .then(|| list::index(m, e.obj(), i as u64))
        .flatten()
    {
        Some(v) => bulk(out, &v),
        None => null(out),
    }
}

/// LPUSH, RPUSH, LPUSHX and RPUSHX (`id` says which).
pub(super) fn push(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Ok((p, e)) = probe_typed(w, st, a[1], T_LIST, out) else {
        return Ok(());
    };
    let front = matches!(id, Id::Lpush | Id::Lpushx);
    let n = match e {
        Some(e) => list::push(w, e.obj(), &a[2..], front)?,
        None if matches!(id, Id::Lpushx | Id::Rpushx) => 0,
        None => {
            let l = list::create(w)?;
            let n = list::push(w, l, &a[2..], front)?;
            ks::insert_object(w, st, &p, a[1], T_LIST, 0, l)?;
            n
        }
    };
    int(out, n as i64);
    Ok(())
}

/// LPOP and RPOP (`id` says which).
pub(super) fn pop(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    if a.len() > 3 {
        reply::error(
            out,
            &format!(
                "ERR wrong number of arguments for '{}' command",
                if id == Id::Lpop { "lpop" } else { "rpop" }
            ),
        );
        return Ok(());
    }
    let count = match a.get(2) {
        Some(c) => match count_arg(c, out) {
            Some(c) => Some(c),
            None => return Ok(()),
        },
        None => None,
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_LIST, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        if count.is_some() {
            null_array(out);
        } else {
            null(out);
        }
        return Ok(());
    };
    if count == Some(0) {
        array(out, 0);
        return Ok(());
    }
    let vals = list::pop(w, e.obj(), count.unwrap_or(1), id == Id::Lpop)?;
    if list::len(w, e.obj()) == 0 {
        ks::delete(w, st, &e)?;
    }
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

/// LMOVE and RPOPLPUSH (`id` says which).
pub(super) fn lmove(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let (from_left, to_left) = if id == Id::Rpoplpush {
        (false, true)
    } else {
        let side = |x: &[u8]| {
            if is(x, "left") {
                Some(true)
            } else if is(x, "right") {
                Some(false)
            } else {
                None
            }
        };
        match (side(a[3]), side(a[4])) {
            (Some(f), Some(t)) => (f, t),
            _ => {
                syntax(out);
                return Ok(());
            }
        }
    };
    let Ok((_, src)) = probe_typed(w, st, a[1], T_LIST, out) else {
        return Ok(());
    };
    let Some(src) = src else {
        null(out);
        return Ok(());
    };
    let Ok((_, dst)) = probe_typed(w, st, a[2], T_LIST, out) else {
        return Ok(());
    };
    let vals = list::pop(w, src.obj(), 1, from_left)?;
    let Some(v) = vals.into_iter().next() else {
        null(out);
        return Ok(());
    };
    if a[1] == a[2] {
        // A rotation: the same list, never empty in between as far as the keyspace
        // is concerned.
        list::push(w, src.obj(), &[&v], to_left)?;
    } else {
        if list::len(w, src.obj()) == 0 {
            ks::delete(w, st, &src)?;
        }
        match dst {
            Some(_) => {
                // The source's deletion may have moved the destination's links.
                let d = ks::lookup(w, st, a[2]).ok_or(HeapError::Damaged(src.off))?;
                list::push(w, d.obj(), &[&v], to_left)?;
            }
            None => {
                let l = list::create(w)?;
                list::push(w, l, &[&v], to_left)?;
                let (p, _) = ks::probe(w, st, a[2]);
                ks::insert_object(w, st, &p, a[2], T_LIST, 0, l)?;
            }
        }
    }
    bulk(out, &v);
    Ok(())
}

/// LSET.
pub(super) fn lset(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Some(idx) = parse_i64(a[2]) else {
        not_int(out);
        return Ok(());
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_LIST, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        reply::error(out, "ERR no such key");
        return Ok(());
    };
    let n = list::len(w, e.obj()) as i64;
    let i = if idx < 0 { idx + n } else { idx };
    if i < 0 || i >= n {
        reply::error(out, "ERR index out of range");
        return Ok(());
    }
    // From the nearer end; `left` counts elements before the target in that direction.
    let rev = i >= n / 2;
    let mut left = if rev {
        (n - 1 - i) as usize
    } else {
        i as usize
    };
    list::edit(w, e.obj(), rev, |els| {
        if left >= els.len() {
            left -= els.len();
            return list::Edited {
                changed: false,
                stop: false,
            };
        }
        let k = if rev { els.len() - 1 - left } else { left };
        els[k] = a[3].to_vec();
        list::Edited {
            changed: true,
            stop: true,
        }
    })?;
    reply::simple(out, "OK");
    Ok(())
}

/// LINSERT.
pub(super) fn linsert(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let before = if is(a[2], "before") {
        true
    } else if is(a[2], "after") {
        false
    } else {
        syntax(out);
        return Ok(());
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_LIST, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        int(out, 0);
        return Ok(());
    };
    let mut found = false;
    let n = list::edit(w, e.obj(), false, |els| {
        match els.iter().position(|v| v.as_slice() == a[3]) {
            Some(k) => {
                found = true;
                els.insert(if before { k } else { k + 1 }, a[4].to_vec());
                list::Edited {
                    changed: true,
                    stop: true,
                }
            }
            None => list::Edited {
                changed: false,
                stop: false,
            },
        }
    })?;
    int(out, if found { n as i64 } else { -1 });
    Ok(())
}

/// LREM.
pub(super) fn lrem(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let Some(count) = parse_i64(a[2]) else {
        not_int(out);
        return Ok(());
    };
    let Ok((_, e)) = probe_typed(w, st, a[1], T_LIST, out) else {
        return Ok(());
    };
    let Some(e) = e else {
        int(out, 0);
        return Ok(());
    };
    // count > 0 from the head, < 0 from the tail, 0 every match.
    let rev = count < 0;
    let quota = if count == 0 {
        usize::MAX
    } else {
        count.unsigned_abs() as usize
    };
    let mut removed = 0usize;
    let left = list::edit(w, e.obj(), rev, |els| {
        let before = removed;
        let mut out_els = Vec::with_capacity(els.len());
        let order: Vec<usize> = if rev {
            (0..els.len()).rev().collect()
        } else {
            (0..els.len()).collect()
        };
        let mut keep = vec![true; els.len()];
        for k in order {
            if removed < quota && els[k].as_slice() == a[3] {
                keep[k] = false;
                removed += 1;
            }
        }
        for (k, v) in els.drain(..).enumerate() {
            if keep[k] {
                out_els.push(v);
            }
        }
        *els = out_els;
        list::Edited {
            changed: removed > before,
            stop: removed >= quota,
        }
    })?;
    if left == 0 {
        ks::delete(w, st, &e)?;
    }
    int(out, removed as i64);
    Ok(())
}

/// LTRIM.
pub(super) fn ltrim(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    let (Some(s), Some(e)) = (parse_i64(a[2]), parse_i64(a[3])) else {
        not_int(out);
        return Ok(());
    };
    let Ok((_, ent)) = probe_typed(w, st, a[1], T_LIST, out) else {
        return Ok(());
    };
    if let Some(ent) = ent {
        let n = list::len(w, ent.obj());
        // Pops from both ends: the work is what is removed.
        let (front, back) = match resolve(s, e, n) {
            None => (n, 0),
            Some((s, e)) => (s, n - 1 - e),
        };
        if front > 0 {
            list::pop(w, ent.obj(), front as usize, true)?;
        }
        if back > 0 {
            list::pop(w, ent.obj(), back as usize, false)?;
        }
        if list::len(w, ent.obj()) == 0 {
            ks::delete(w, st, &ent)?;
        }
    }
    reply::simple(out, "OK");
    Ok(())
}
