//! SORT and SORT_RO, as Redis 7.0's sortCommandGeneric: the options (BY, LIMIT, GET, ASC/DESC,
//! ALPHA, STORE), the elements of a list, set or sorted set ordered by themselves or by the
//! keys or hash fields a pattern names, and the result as a reply or stored as a list.

use super::data::{is, parse_i64, Counters};
use super::rdb::Value;
use super::reply::{self, array, bulk, int, not_int, null, syntax, wrongtype};
use super::value;
use crate::ds::hash::HashObj;
use crate::ds::keyspace::{self as ks, T_HASH, T_LIST, T_SET, T_STRING, T_ZSET};
use crate::ds::set::SetObj;
use crate::ds::{hash, list, set, zset, Mem, Store, Wtx};
use crate::heap::HeapError;
use std::cmp::Ordering;

/// The parsed options.
struct Opts<'a> {
    desc: bool,
    alpha: bool,
    start: i64,
    count: i64,
    store: Option<&'a [u8]>,
    by: Option<&'a [u8]>,
    /// BY a pattern without `*`: nothing to sort.
    dontsort: bool,
    gets: Vec<&'a [u8]>,
}

/// Parse `a[2..]`; on an error its reply is in `out` and `None` returned. `readonly`
/// (SORT_RO): STORE is a syntax error.
fn parse<'a>(a: &[&'a [u8]], readonly: bool, out: &mut Vec<u8>) -> Option<Opts<'a>> {
    let mut o = Opts {
        desc: false,
        alpha: false,
        start: 0,
        count: -1,
        store: None,
        by: None,
        dontsort: false,
        gets: Vec::new(),
    };
    let mut j = 2;
    while j < a.len() {
        let left = a.len() - j - 1;
        if is(a[j], "asc") {
            o.desc = false;
        } else if is(a[j], "desc") {
            o.desc = true;
        } else if is(a[j], "alpha") {
            o.alpha = true;
        } else if is(a[j], "limit") && left >= 2 {
            match (parse_i64(a[j + 1]), parse_i64(a[j + 2])) {
                (Some(s), Some(c)) => (o.start, o.count) = (s, c),
                _ => {
                    not_int(out);
                    return None;
                }
            }
            j += 2;
        } else if !readonly && is(a[j], "store") && left >= 1 {
            o.store = Some(a[j + 1]);
            j += 1;
        } else if is(a[j], "by") && left >= 1 {
            o.by = Some(a[j + 1]);
            o.dontsort = !cstr(a[j + 1]).contains(&b'*');
            j += 1;
        } else if is(a[j], "get") && left >= 1 {
            o.gets.push(a[j + 1]);
            j += 1;
        } else {
            syntax(out);
            return None;
        }
        j += 1;
    }
    Some(o)
}

/// The bytes C's string functions see: up to the first NUL.
fn cstr(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |n| &b[..n])
}

/// Redis's lookupKeyByPattern: `#` is the element itself; else the first `*` of the pattern
/// replaced by the element names a string key, or with `->field` after the `*`, a hash
/// field. A pattern without `*`, a missing key or field, or a key of another type: `None`.
fn by_pattern<M: Mem>(m: &M, st: &Store, pat: &[u8], elem: &[u8]) -> Option<Vec<u8>> {
    let c = cstr(pat);
    if c == b"#" {
        return Some(elem.to_vec());
    }
    let star = c.iter().position(|&x| x == b'*')?;
    let arrow = c[star + 1..]
        .windows(2)
        .position(|w| w == b"->")
        .map(|i| star + 1 + i)
        .filter(|&f| f + 2 < c.len());
    let field = arrow.map(|f| &pat[f + 2..]);
    let fieldlen = field.map_or(0, |f| f.len());
    let postfix = pat.len() - (star + 1) - if fieldlen > 0 { fieldlen + 2 } else { 0 };
    let mut key = Vec::with_capacity(pat.len() + elem.len());
    key.extend_from_slice(&pat[..star]);
    key.extend_from_slice(elem);
    key.extend_from_slice(&pat[star + 1..star + 1 + postfix]);
    let e = ks::lookup(m, st, &key)?;
    match field.filter(|f| !f.is_empty()) {
        Some(f) => {
            if e.ty() != T_HASH {
                return None;
            }
            let h = HashObj {
                enc: e.enc(),
                obj: e.obj(),
            };
            hash::get(m, st, h, f).map(|v| v.into_owned())
        }
        None => (e.ty() == T_STRING).then(|| ks::string_value(m, &e).into_owned()),
    }
}

/// C's strtod on `b` as Redis calls it: the whole string (up to a NUL) must parse, not to
/// NaN, not out of range. `None`: "One or more scores can't be converted into double".
fn strtod(b: &[u8]) -> Option<f64> {
    let mut z = Vec::with_capacity(b.len() + 1);
    z.extend_from_slice(cstr(b));
    z.push(0);
    let mut end: *mut libc::c_char = std::ptr::null_mut();
    // SAFETY: `z` is NUL-terminated and outlives the call; errno is this thread's.
    let (v, err) = unsafe {
        *libc::__errno_location() = 0;
        let v = libc::strtod(z.as_ptr() as *const libc::c_char, &mut end);
        (v, *libc::__errno_location())
    };
    // SAFETY: strtod leaves `end` inside `z` (at most at its NUL).
    let rest = unsafe { *end };
    (rest == 0 && err != libc::ERANGE && !v.is_nan()).then_some(v)
}

/// One element to sort and what it sorts by.
struct Item {
    elem: Vec<u8>,
    score: f64,
    cmp: Option<Vec<u8>>,
}

/// The rows SORT outputs (a missing GET target is `None`), or `Err(())` when a score does not
/// convert (the reply is then that error). The WRONGTYPE case is the caller's.
fn rows<M: Mem>(m: &M, st: &Store, key: &[u8], o: &mut Opts) -> Result<Vec<Option<Vec<u8>>>, ()> {
    let e = ks::lookup(m, st, key);
    let ty = e.as_ref().map_or(T_LIST, |e| e.ty());
    if o.dontsort && ty == T_SET && o.store.is_some() {
        // A set has no order of its own: stored results are sorted, as Redis does.
        o.dontsort = false;
        o.alpha = true;
        o.by = None;
    }
    let len = match &e {
        None => 0,
        Some(e) => match ty {
            T_LIST => list::len(m, e.obj()),
            T_ZSET => zset::len(m, e.obj()),
            _ => set::card(
                m,
                SetObj {
                    enc: e.enc(),
                    obj: e.obj(),
                },
            ),
        },
    } as i64;
    let mut start = o.start.max(0);
    let mut end = if o.count < 0 {
        len - 1
    } else {
        start.saturating_add(o.count - 1)
    };
    if start >= len {
        start = len - 1;
        end = len - 2;
    }
    end = end.min(len - 1);
    let mut elems: Vec<Vec<u8>> = Vec::new();
    if let Some(e) = &e {
        let ranged = o.dontsort && ty != T_SET;
        match ty {
            T_LIST if ranged => {
                if end >= start {
                    let all = list::to_vec(m, e.obj());
                    let n = (end - start + 1) as usize;
                    elems = if o.desc {
                        all.into_iter().rev().skip(start as usize).take(n).collect()
                    } else {
                        all.into_iter().skip(start as usize).take(n).collect()
                    };
                }
            }
            T_LIST => elems = list::to_vec(m, e.obj()),
            T_ZSET if ranged => {
                if end >= start {
                    zset::range_by_rank(m, e.obj(), start as u64, end as u64, o.desc, |x, _| {
                        elems.push(x.to_vec())
                    });
                }
            }
            T_ZSET => {
                if len > 0 {
                    zset::range_by_rank(m, e.obj(), 0, len as u64 - 1, false, |x, _| {
                        elems.push(x.to_vec())
                    });
                }
            }
            _ => {
                let s = SetObj {
                    enc: e.enc(),
                    obj: e.obj(),
                };
                set::for_each(m, s, |x| elems.push(x.to_vec()));
            }
        }
        if ranged && end >= start {
            end -= start;
            start = 0;
        }
    }
    let mut items: Vec<Item> = elems
        .into_iter()
        .map(|elem| Item {
            elem,
            score: 0.0,
            cmp: None,
        })
        .collect();
    if !o.dontsort {
        let mut bad = false;
        for it in &mut items {
            let by = match o.by {
                Some(p) => match by_pattern(m, st, p, &it.elem) {
                    Some(v) => Some(v),
                    None => continue,
                },
                None => None,
            };
            if o.alpha {
                it.cmp = by;
            } else {
                match strtod(by.as_deref().unwrap_or(&it.elem)) {
                    Some(s) => it.score = s,
                    None => bad = true,
                }
            }
        }
        if bad {
            return Err(());
        }
        let (alpha, by, desc) = (o.alpha, o.by.is_some(), o.desc);
        items.sort_by(|x, y| {
            let c = if !alpha {
                x.score
                    .partial_cmp(&y.score)
                    .unwrap_or(Ordering::Equal)
                    .then_with(|| x.elem.cmp(&y.elem))
            } else if by {
                match (&x.cmp, &y.cmp) {
                    (None, None) => Ordering::Equal,
                    (None, _) => Ordering::Less,
                    (_, None) => Ordering::Greater,
                    (Some(p), Some(q)) => p.cmp(q),
                }
            } else {
                x.elem.cmp(&y.elem)
            };
            if desc {
                c.reverse()
            } else {
                c
            }
        });
    }
    let mut rows = Vec::new();
    if end >= start {
        // `get`: a damaged heap may yield fewer elements than its counts say (recorded by the
        // walk; the command then replies with the damage), never an out-of-bounds panic.
        for it in items.get(start as usize..=end as usize).unwrap_or_default() {
            if o.gets.is_empty() {
                rows.push(Some(it.elem.clone()));
            }
            for g in &o.gets {
                rows.push(by_pattern(m, st, g, &it.elem));
            }
        }
    }
    Ok(rows)
}

/// Whether `key` holds a type SORT refuses (its WRONGTYPE reply is then in `out`).
fn wrong<M: Mem>(m: &M, st: &Store, key: &[u8], out: &mut Vec<u8>) -> bool {
    match ks::lookup(m, st, key) {
        Some(e) if !matches!(e.ty(), T_LIST | T_SET | T_ZSET) => {
            wrongtype(out);
            true
        }
        _ => false,
    }
}

fn conversion_error(out: &mut Vec<u8>) {
    reply::error(out, "ERR One or more scores can't be converted into double");
}

fn reply_rows(rows: &[Option<Vec<u8>>], out: &mut Vec<u8>) {
    array(out, rows.len());
    for r in rows {
        match r {
            Some(v) => bulk(out, v),
            None => null(out),
        }
    }
}

/// SORT_RO key [BY pattern] [LIMIT offset count] [GET pattern ...] [ASC|DESC] [ALPHA].
pub fn sort_ro<M: Mem>(_: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(mut o) = parse(a, true, out) else {
        return;
    };
    if wrong(m, st, a[1], out) {
        return;
    }
    match rows(m, st, a[1], &mut o) {
        Ok(r) => reply_rows(&r, out),
        Err(()) => conversion_error(out),
    }
}

/// SORT, the same options and STORE destination: the rows (a missing GET target as an empty
/// string) replace the destination as a list, or delete it when there are none; the reply is
/// their count.
pub fn sort(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> Result<(), HeapError> {
    let Some(mut o) = parse(a, false, out) else {
        return Ok(());
    };
    if wrong(w, st, a[1], out) {
        return Ok(());
    }
    let rows = match rows(w, st, a[1], &mut o) {
        Ok(r) => r,
        Err(()) => {
            conversion_error(out);
            return Ok(());
        }
    };
    let Some(dst) = o.store else {
        reply_rows(&rows, out);
        return Ok(());
    };
    if let Some(d) = ks::lookup(w, st, dst) {
        ks::delete(w, st, &d)?;
    }
    if !rows.is_empty() {
        let items = rows.iter().map(|r| r.clone().unwrap_or_default()).collect();
        value::insert(w, st, dst, &Value::List(items))?;
    }
    int(out, rows.len() as i64);
    Ok(())
}
