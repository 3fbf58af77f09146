//! The data commands: readers generic over [`Mem`] (the committed view, or the group-commit
//! transaction), writers on a [`Wtx`].
//!
//! Every writer validates its arguments and the key's type before its first write, so a client
//! error (syntax, WRONGTYPE, not an integer) never leaves a half-done change, even inside a
//! group-commit transaction shared with other commands. Only heap errors (out of memory,
//! transaction too large) can stop a writer midway; the caller then aborts the transaction.

use super::bitfield;
use super::reply::{self, array, bulk, int, not_int, null, null_array, syntax, wrongtype};
use super::table::{Id, Spec};
use crate::ds::hash::HashObj;
use crate::ds::keyspace::{
    self as ks, Entry, ENC_INLINE, ENC_PACK, T_HASH, T_LIST, T_SET, T_STRING, T_ZSET,
};
use crate::ds::set::SetObj;
use crate::ds::zset::{AddFlags, Added, Bound, ScoreRange};
use crate::ds::{dict, expire, garbage, hash, list, set, zset, Mem, Store, Wtx};
use crate::heap::HeapError;

type HResult = std::result::Result<(), HeapError>;

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

enum Look {
    Missing,
    Wrong,
    Found(Entry),
}

fn look<M: Mem>(m: &M, st: &Store, key: &[u8], ty: u8) -> Look {
    match ks::lookup(m, st, key) {
        None => Look::Missing,
        Some(e) if e.ty() != ty => Look::Wrong,
        Some(e) => Look::Found(e),
    }
}

/// Resolve a Redis index range over `len` elements; `None` when empty.
fn resolve(start: i64, stop: i64, len: u64) -> Option<(u64, u64)> {
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

fn set_obj(e: &Entry) -> SetObj {
    SetObj {
        enc: e.enc(),
        obj: e.obj(),
    }
}

fn hash_obj(e: &Entry) -> HashObj {
    HashObj {
        enc: e.enc(),
        obj: e.obj(),
    }
}

/// OBJECT ENCODING|FREQ|IDLETIME|REFCOUNT|HELP, with Redis 7.0's replies and errors.
fn object<M: Mem>(st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
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
        b"encoding" => {
            // A string that is a canonical 64-bit integer is "int" to Redis (stored as one).
            if e.ty() == T_STRING && parse_canonical_i64(&ks::string_value(m, &e)).is_some() {
                return bulk(out, b"int");
            }
            bulk(out, encoding_name(&e).as_bytes())
        }
        // What Redis replies under its default maxmemory-policy (the only one here).
        b"freq" => reply::error(
            out,
            "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please \
             note that when switching between policies at runtime LRU and LFU data will take \
             some time to adjust.",
        ),
        b"idletime" => reply::error(
            out,
            "ERR OBJECT IDLETIME is not supported: tiermem-kv does not track access times",
        ),
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

fn encoding_name(e: &Entry) -> &'static str {
    match (e.ty(), e.enc()) {
        (T_STRING, ENC_INLINE) => "embstr",
        (T_STRING, _) => "raw",
        (T_LIST, _) => "quicklist",
        (T_SET | T_HASH, ENC_PACK) => "listpack",
        (T_SET | T_HASH, _) => "hashtable",
        (T_ZSET, _) => "skiplist",
        _ => "unknown",
    }
}

/// A positive count argument (LPOP, SPOP, ZPOPMIN): `Err` after writing Redis' error.
fn count_arg(b: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    match parse_i64(b) {
        Some(n) if n >= 0 => Some(n as usize),
        _ => {
            reply::error(out, "ERR value is out of range, must be positive");
            None
        }
    }
}

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

/// SRANDMEMBER, HRANDFIELD and ZRANDMEMBER's reply over `all`, as Redis chooses: no count, one
/// element's bulk (nil when empty); a negative count, that many with repeats; a positive one,
/// that many distinct ones (all when there are not more). `emit` writes one element's `per`
/// bulks (its member alone without a count).
fn random_reply<T>(
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

/// Writes `members` as an array reply.
fn members_reply(out: &mut Vec<u8>, members: &[Vec<u8>]) {
    array(out, members.len());
    for v in members {
        bulk(out, v);
    }
}

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

/// Redis's `redisBitpos`: the first bit equal to `bit` in `s`, from its first byte's most
/// significant bit; looking for 0 in all ones gives the bit past the end, for 1 in all zeros
/// -1.
fn first_bit(s: &[u8], bit: bool) -> i64 {
    for (i, &b) in s.iter().enumerate() {
        let x = if bit { b } else { !b };
        if x != 0 {
            return (i * 8) as i64 + x.leading_zeros() as i64;
        }
    }
    if bit {
        -1
    } else {
        (s.len() * 8) as i64
    }
}

/// A bit offset argument (SETBIT, GETBIT): 0 ≤ offset < 2^32 (Redis' 512 MB strings); `None`
/// after Redis' error.
fn bit_offset(b: &[u8], out: &mut Vec<u8>) -> Option<u64> {
    match parse_i64(b) {
        Some(v) if (0..1 << 32).contains(&v) => Some(v as u64),
        _ => {
            reply::error(out, "ERR bit offset is not an integer or out of range");
            None
        }
    }
}

/// The arguments of SRANDMEMBER, HRANDFIELD and ZRANDMEMBER — `key [count [flag]]`, `flag`
/// (`withvalues`, `withscores`) `None` for SRANDMEMBER, which takes none — checked in Redis
/// 7.0's order, and the key's entry of type `ty`. `None` after replying: an error, or the
/// empty reply of a missing key (nil without a count, an empty array with one).
fn random_args<M: Mem>(
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

/// BITFIELD's GET-only replies over string entry `e` (missing: zeros), each op reading only
/// its own few bytes.
fn bitfield_reads<M: Mem>(m: &M, e: Option<&Entry>, ops: &[bitfield::Op], out: &mut Vec<u8>) {
    array(out, ops.len());
    for op in ops {
        let (lo, hi) = bitfield::bytes(op);
        let mut buf = e
            .map(|e| ks::string_range(m, e, lo, hi + 1 - lo).into_owned())
            .unwrap_or_default();
        buf.resize((hi + 1 - lo) as usize, 0);
        bitfield::apply_one(op, &mut buf, lo, out);
    }
}

// ------------------------------------------------------------------------------------------
// Readers.

/// Execute read command `id` against `m`.
pub fn read<M: Mem>(cx: &mut Counters, st: &Store, m: &M, id: Id, a: &[&[u8]], out: &mut Vec<u8>) {
    macro_rules! found {
        ($key:expr, $ty:expr, $missing:expr) => {
            match look(m, st, $key, $ty) {
                Look::Missing => {
                    cx.misses += 1;
                    $missing;
                    return;
                }
                Look::Wrong => {
                    cx.hits += 1;
                    wrongtype(out);
                    return;
                }
                Look::Found(e) => {
                    cx.hits += 1;
                    e
                }
            }
        };
    }
    match id {
        Id::Get => {
            let e = found!(a[1], T_STRING, null(out));
            bulk(out, &ks::string_value(m, &e));
        }
        Id::Strlen => {
            let e = found!(a[1], T_STRING, int(out, 0));
            int(out, ks::string_len(m, &e) as i64);
        }
        Id::Mget => {
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
        Id::Exists => {
            let n = a[1..]
                .iter()
                .filter(|k| ks::lookup(m, st, k).is_some())
                .count();
            int(out, n as i64);
        }
        Id::Touch => {
            // No access clock to update: the count of keys that exist, as Redis replies.
            let n = a[1..]
                .iter()
                .filter(|k| ks::lookup(m, st, k).is_some())
                .count();
            int(out, n as i64);
        }
        Id::Lcs => {
            // Redis 7.0's lcsCommand, step for step: both keys strings (a missing one is
            // empty), then the options, then the table's size against proto-max-bulk-len.
            let mut v: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
            for (k, slot) in [a[1], a[2]].into_iter().zip(v.iter_mut()) {
                match look(m, st, k, T_STRING) {
                    Look::Wrong => {
                        return reply::error(
                            out,
                            "ERR The specified keys must contain string values",
                        )
                    }
                    Look::Found(e) => *slot = ks::string_value(m, &e).into_owned(),
                    Look::Missing => {}
                }
            }
            let (mut getlen, mut getidx, mut withmatchlen, mut minmatchlen) =
                (false, false, false, 0u64);
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
        Id::Getrange | Id::Substr => {
            let (Some(s), Some(e)) = (parse_i64(a[2]), parse_i64(a[3])) else {
                return not_int(out);
            };
            let ent = found!(a[1], T_STRING, bulk(out, b""));
            let v = ks::string_value(m, &ent);
            match getrange_span(s, e, v.len()) {
                Some((s, e)) => bulk(out, &v[s..e]),
                None => bulk(out, b""),
            }
        }
        Id::BitfieldRo => {
            let Ok(ops) = bitfield::parse(&a[2..], out) else {
                return;
            };
            if ops.iter().any(bitfield::Op::writes) {
                return reply::error(out, "ERR BITFIELD_RO only supports the GET subcommand");
            }
            let e = match look(m, st, a[1], T_STRING) {
                Look::Wrong => return wrongtype(out),
                Look::Found(e) => Some(e),
                Look::Missing => None,
            };
            bitfield_reads(m, e.as_ref(), &ops, out);
        }
        Id::Getbit => {
            let Some(bit) = bit_offset(a[2], out) else {
                return;
            };
            let e = found!(a[1], T_STRING, int(out, 0));
            let b = ks::string_range(m, &e, bit / 8, 1);
            int(
                out,
                b.first().map_or(0, |x| (x >> (7 - bit % 8)) & 1) as i64,
            );
        }
        Id::Bitpos => {
            // Redis 7.0's bitposCommand, step for step.
            let bit = match parse_i64(a[2]) {
                Some(0) => false,
                Some(1) => true,
                Some(_) => return reply::error(out, "ERR The bit argument must be 1 or 0."),
                None => return not_int(out),
            };
            let e = match look(m, st, a[1], T_STRING) {
                Look::Wrong => return wrongtype(out),
                // An infinite run of zeros.
                Look::Missing => return int(out, if bit { -1 } else { 0 }),
                Look::Found(e) => e,
            };
            let p = ks::string_value(m, &e);
            let strlen = p.len() as i64;
            let (mut start, mut end, mut end_given, mut isbit) = (0i64, strlen - 1, false, false);
            let (mut first_mask, mut last_mask) = (0u8, 0u8);
            match a.len() {
                3 => {}
                4..=6 => {
                    let Some(s0) = parse_i64(a[3]) else {
                        return not_int(out);
                    };
                    start = s0;
                    if a.len() >= 5 {
                        let Some(e0) = parse_i64(a[4]) else {
                            return not_int(out);
                        };
                        end = e0;
                        end_given = true;
                    }
                    if a.len() == 6 {
                        if is(a[5], "bit") {
                            isbit = true;
                        } else if !is(a[5], "byte") {
                            return syntax(out);
                        }
                    }
                    let totlen = if isbit { strlen * 8 } else { strlen };
                    if !end_given {
                        end = totlen - 1;
                    }
                    if start < 0 {
                        start += totlen;
                    }
                    if end < 0 {
                        end += totlen;
                    }
                    start = start.max(0);
                    end = end.max(0);
                    if end >= totlen {
                        end = totlen - 1;
                    }
                    if isbit && start <= end {
                        first_mask = !((1u16 << (8 - (start & 7))) - 1) as u8;
                        last_mask = ((1u16 << (7 - (end & 7))) - 1) as u8;
                        start >>= 3;
                        end >>= 3;
                    }
                }
                _ => return syntax(out),
            }
            if start > end {
                return int(out, -1);
            }
            let mut bytes = end - start + 1;
            let pos: i64 = 'result: {
                if first_mask != 0 {
                    let mut t = if bit {
                        p[start as usize] & !first_mask
                    } else {
                        p[start as usize] | first_mask
                    };
                    if last_mask != 0 && bytes == 1 {
                        t = if bit { t & !last_mask } else { t | last_mask };
                    }
                    let pos = first_bit(&[t], bit);
                    if bytes == 1 || (pos != -1 && pos != 8) {
                        break 'result pos;
                    }
                    start += 1;
                    bytes -= 1;
                }
                let cur = bytes - i64::from(last_mask != 0);
                if cur > 0 {
                    let pos = first_bit(&p[start as usize..(start + cur) as usize], bit);
                    if bytes == cur || (pos != -1 && pos != cur * 8) {
                        break 'result pos;
                    }
                    start += cur;
                    bytes -= cur;
                }
                let t = if bit {
                    p[end as usize] & !last_mask
                } else {
                    p[end as usize] | last_mask
                };
                first_bit(&[t], bit)
            };
            if end_given && !bit && pos == bytes * 8 {
                return int(out, -1);
            }
            int(out, if pos != -1 { pos + start * 8 } else { pos });
        }
        Id::Bitcount => {
            let e = found!(a[1], T_STRING, int(out, 0));
            let v = ks::string_value(m, &e);
            let len = v.len() as i64;
            let (mut s, mut t, bits) = match a.len() {
                2 => (0, len - 1, false),
                4 | 5 => {
                    let (Some(s), Some(t)) = (parse_i64(a[2]), parse_i64(a[3])) else {
                        return not_int(out);
                    };
                    let bits = match a.get(4) {
                        None => false,
                        Some(u) if is(u, "byte") => false,
                        Some(u) if is(u, "bit") => true,
                        Some(_) => return syntax(out),
                    };
                    (s, t, bits)
                }
                _ => return syntax(out),
            };
            if a.len() > 2 {
                if s < 0 && t < 0 && s > t {
                    return int(out, 0);
                }
                let total = if bits { len * 8 } else { len };
                if s < 0 {
                    s += total;
                }
                if t < 0 {
                    t += total;
                }
                s = s.max(0);
                t = t.max(0);
                if t >= total {
                    t = total - 1;
                }
            }
            if s > t {
                return int(out, 0);
            }
            let count = if bits {
                // Whole bytes, then the bits outside the range at both ends taken off.
                let (sb, tb) = ((s / 8) as usize, (t / 8) as usize);
                let mut c: u64 = v[sb..=tb].iter().map(|x| x.count_ones() as u64).sum();
                let first_out = !((1u16 << (8 - (s & 7))) - 1) as u8;
                let last_out = ((1u16 << (7 - (t & 7))) - 1) as u8;
                c -= (v[sb] & first_out).count_ones() as u64;
                c -= (v[tb] & last_out).count_ones() as u64;
                c
            } else {
                v[s as usize..=t as usize]
                    .iter()
                    .map(|x| x.count_ones() as u64)
                    .sum()
            };
            int(out, count as i64);
        }
        Id::Hstrlen => {
            let e = found!(a[1], T_HASH, int(out, 0));
            let n = hash::get(m, st, hash_obj(&e), a[2]).map_or(0, |v| v.len());
            int(out, n as i64);
        }
        Id::Hrandfield => {
            let Some((e, count, withvalues)) =
                random_args(m, st, a, T_HASH, Some("withvalues"), out)
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
        Id::Lpos => {
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
        Id::Zunion | Id::Zinter | Id::Zdiff | Id::Zintercard => {
            let (name, op) = match id {
                Id::Zunion => ("zunion", ZOp::Union),
                Id::Zinter => ("zinter", ZOp::Inter),
                Id::Zdiff => ("zdiff", ZOp::Diff),
                _ => ("zintercard", ZOp::Inter),
            };
            let card = id == Id::Zintercard;
            let Ok((res, withscores, limit)) = zsetop(st, m, name, a, 1, op, false, card, out)
            else {
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
        Id::Randomkey => {
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
        Id::Type => match ks::lookup(m, st, a[1]) {
            Some(e) => reply::simple(out, ks::type_name(e.ty())),
            None => reply::simple(out, "none"),
        },
        Id::Ttl | Id::Pttl | Id::Expiretime | Id::Pexpiretime => {
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
        Id::Object => object(st, m, a, out),
        Id::Keys => {
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
        Id::Scan => scan(st, m, a, out),
        Id::Dbsize => int(out, ks::len(m, st) as i64),
        Id::Lrange => {
            let (Some(s), Some(e)) = (parse_i64(a[2]), parse_i64(a[3])) else {
                return not_int(out);
            };
            let ent = found!(a[1], T_LIST, array(out, 0));
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
        Id::Llen => {
            let e = found!(a[1], T_LIST, int(out, 0));
            int(out, list::len(m, e.obj()) as i64);
        }
        Id::Lindex => {
            let Some(i) = parse_i64(a[2]) else {
                return not_int(out);
            };
            let e = found!(a[1], T_LIST, null(out));
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
        Id::Smembers => {
            let e = found!(a[1], T_SET, array(out, 0));
            let s = set_obj(&e);
            array(out, set::card(m, s) as usize);
            set::for_each(m, s, |v| bulk(out, v));
        }
        Id::Sismember => {
            let e = found!(a[1], T_SET, int(out, 0));
            int(out, set::contains(m, st, set_obj(&e), a[2]) as i64);
        }
        Id::Smismember => {
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
        Id::Scard => {
            let e = found!(a[1], T_SET, int(out, 0));
            int(out, set::card(m, set_obj(&e)) as i64);
        }
        Id::Sinter | Id::Sunion | Id::Sdiff => {
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
        Id::Sintercard => {
            let Some((keys, limit)) = sintercard_args(a, out) else {
                return;
            };
            match set_algebra(m, st, SetOp::Inter, &keys, limit) {
                Ok(v) => int(out, v.len() as i64),
                Err(()) => wrongtype(out),
            }
        }
        Id::Srandmember => {
            let Some((e, count, _)) = random_args(m, st, a, T_SET, None, out) else {
                return;
            };
            let s = set_obj(&e);
            let n = set::card(m, s) as usize;
            let mut all = Vec::with_capacity(n);
            set::for_each(m, s, |v| all.push(v.to_vec()));
            random_reply(out, &mut all, count, 1, |out, v| bulk(out, v));
        }
        Id::Hget => {
            let e = found!(a[1], T_HASH, null(out));
            match hash::get(m, st, hash_obj(&e), a[2]) {
                Some(v) => bulk(out, &v),
                None => null(out),
            }
        }
        Id::Hmget => {
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
        Id::Hgetall | Id::Hkeys | Id::Hvals => {
            let e = found!(a[1], T_HASH, array(out, 0));
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
        Id::Hlen => {
            let e = found!(a[1], T_HASH, int(out, 0));
            int(out, hash::len(m, hash_obj(&e)) as i64);
        }
        Id::Hexists => {
            let e = found!(a[1], T_HASH, int(out, 0));
            int(out, hash::get(m, st, hash_obj(&e), a[2]).is_some() as i64);
        }
        Id::Zscore => {
            let e = found!(a[1], T_ZSET, null(out));
            match zset::score_of(m, st, e.obj(), a[2]) {
                Some(s) => reply::double(out, s),
                None => null(out),
            }
        }
        Id::Zmscore => {
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
        Id::Zrandmember => {
            let Some((e, count, withscores)) =
                random_args(m, st, a, T_ZSET, Some("withscores"), out)
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
        Id::Sscan | Id::Hscan | Id::Zscan => coll_scan(st, m, id, a, out),
        Id::Zcard => {
            let e = found!(a[1], T_ZSET, int(out, 0));
            int(out, zset::len(m, e.obj()) as i64);
        }
        Id::Zrank | Id::Zrevrank => {
            let e = found!(a[1], T_ZSET, null(out));
            match zrank(m, e.obj(), a[2], id == Id::Zrevrank) {
                Some(r) => int(out, r as i64),
                None => null(out),
            }
        }
        Id::Zlexcount => {
            let (Some(min), Some(max)) = (parse_lex(a[2]), parse_lex(a[3])) else {
                return reply::error(out, "ERR min or max not valid string range item");
            };
            let e = found!(a[1], T_ZSET, int(out, 0));
            int(out, lex_members(m, e.obj(), &min, &max, false).len() as i64);
        }
        Id::Zcount => {
            let (Some(min), Some(max)) = (parse_bound(a[2]), parse_bound(a[3])) else {
                return reply::error(out, "ERR min or max is not a float");
            };
            let e = found!(a[1], T_ZSET, int(out, 0));
            let mut n = 0;
            let r = ScoreRange {
                min,
                max,
                rev: false,
                offset: 0,
                limit: -1,
            };
            zset::range_by_score(m, e.obj(), r, |_, _| n += 1);
            int(out, n);
        }
        Id::Zrange
        | Id::Zrevrange
        | Id::Zrangebyscore
        | Id::Zrevrangebyscore
        | Id::Zrangebylex
        | Id::Zrevrangebylex => zrange(cx, st, m, id, a, out),
        _ => reply::error(out, "ERR internal: not a read command"),
    }
}

fn scan<M: Mem>(st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
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

/// SSCAN, HSCAN, ZSCAN: `key cursor [MATCH pattern] [COUNT count]` over one collection, the
/// cursor a bucket of its dict (a packed collection answers whole, cursor 0).
fn coll_scan<M: Mem>(st: &Store, m: &M, id: Id, a: &[&[u8]], out: &mut Vec<u8>) {
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

/// One end of a lexicographic range (Redis' zslParseLexRangeItem): `-`, `+`, `[x`, `(x`.
#[derive(Clone, Debug)]
enum Lex {
    Min,
    Max,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

fn parse_lex(b: &[u8]) -> Option<Lex> {
    match b.first() {
        Some(b'-') if b.len() == 1 => Some(Lex::Min),
        Some(b'+') if b.len() == 1 => Some(Lex::Max),
        Some(b'[') => Some(Lex::Incl(b[1..].to_vec())),
        Some(b'(') => Some(Lex::Excl(b[1..].to_vec())),
        _ => None,
    }
}

/// Whether `mem` lies in the lexicographic range `min..max`.
fn in_lex(mem: &[u8], min: &Lex, max: &Lex) -> bool {
    let above = match min {
        Lex::Min => true,
        Lex::Max => false,
        Lex::Incl(x) => mem >= x.as_slice(),
        Lex::Excl(x) => mem > x.as_slice(),
    };
    let below = match max {
        Lex::Min => false,
        Lex::Max => true,
        Lex::Incl(x) => mem <= x.as_slice(),
        Lex::Excl(x) => mem < x.as_slice(),
    };
    above && below
}

/// The members of zset `z` in the lexicographic range, in order (`rev`: descending). Lex
/// ranges mean something only when all scores are equal (Redis' rule); here the elements are
/// walked in rank order and filtered: O(n).
fn lex_members<M: Mem>(m: &M, z: u64, min: &Lex, max: &Lex, rev: bool) -> Vec<(Vec<u8>, f64)> {
    let n = zset::len(m, z);
    let mut v = Vec::new();
    if n > 0 {
        zset::range_by_rank(m, z, 0, n - 1, rev, |mem, s| {
            if in_lex(mem, min, max) {
                v.push((mem.to_vec(), s));
            }
        });
    }
    v
}

/// ZRANK / ZREVRANK: the member's rank, walking the sorted set (O(rank): the skip list keeps
/// no spans).
fn zrank<M: Mem>(m: &M, z: u64, member: &[u8], rev: bool) -> Option<u64> {
    let n = zset::len(m, z);
    let mut found = None;
    let mut r = 0;
    if n > 0 {
        zset::range_by_rank(m, z, 0, n - 1, rev, |mem, _| {
            if found.is_none() {
                if mem == member {
                    found = Some(r);
                }
                r += 1;
            }
        });
    }
    found
}

/// Members with their scores, in order.
type Scored = Vec<(Vec<u8>, f64)>;

fn zrange<M: Mem>(cx: &mut Counters, st: &Store, m: &M, id: Id, a: &[&[u8]], out: &mut Vec<u8>) {
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
        let (Some(min), Some(max)) = (parse_lex(lo), parse_lex(hi)) else {
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
        let take = if count < 0 {
            usize::MAX
        } else {
            count as usize
        };
        sel = lex_members(m, e.obj(), &min, &max, rev)
            .into_iter()
            .skip(offset as usize)
            .take(take)
            .collect();
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

// ------------------------------------------------------------------------------------------
// Writers.

/// The probe and entry of `key` if it has type `ty`; `Err(())` after replying WRONGTYPE.
fn probe_typed(
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

/// Store a (possibly moved or re-encoded) value object in its entry, if it changed.
fn update_obj(w: &mut Wtx, e: &Entry, enc: u8, obj: u64) -> HResult {
    if enc != e.enc() || obj != e.obj() {
        ks::set_value(w, e, e.ty(), enc, obj)?;
    }
    Ok(())
}

/// After adding to the collection of key `key` (probed as `p`, entry `e` if it existed):
/// point the entry at the collection's new object, or insert the key with it.
#[allow(clippy::too_many_arguments)]
fn upsert_obj(
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
fn shrink_obj(w: &mut Wtx, st: &Store, e: &Entry, empty: bool, enc: u8, obj: u64) -> HResult {
    if empty {
        ks::delete(w, st, &e.with_obj(enc, obj))
    } else {
        update_obj(w, e, enc, obj)
    }
}

/// Execute write command `id` in `w`.
pub fn write(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
    match id {
        Id::Set => set_cmd(st, w, a, out),
        Id::Setnx => {
            let (p, e) = ks::probe(w, st, a[1]);
            if e.is_some() {
                int(out, 0);
            } else {
                ks::insert_string(w, st, &p, a[1], a[2])?;
                int(out, 1);
            }
            Ok(())
        }
        Id::Setex | Id::Psetex => {
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
        Id::Getex => {
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
        Id::Persist => {
            let n = match ks::lookup(w, st, a[1]) {
                Some(e) => expire::remove(w, st, &e, true)? as i64,
                None => 0,
            };
            int(out, n);
            Ok(())
        }
        Id::Expire | Id::Pexpire | Id::Expireat | Id::Pexpireat => expire_cmd(st, w, id, a, out),
        Id::Getset => {
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
        Id::Getdel => {
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
        Id::Mset | Id::Msetnx => {
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
        Id::Incr | Id::Decr | Id::Incrby | Id::Decrby => {
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
        Id::Append => {
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
        Id::Del | Id::Unlink => {
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
        Id::Flushall | Id::Flushdb => {
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
        Id::Swapdb => {
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
        Id::Move => {
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
        Id::Lpush | Id::Rpush | Id::Lpushx | Id::Rpushx => {
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
        id if super::blocking::is_blocking(id) => blocking_try(st, w, id, a, out),
        Id::Lmpop | Id::Zmpop => {
            if !mpop(st, w, id == Id::Zmpop, a, 1, out)? {
                null_array(out);
            }
            Ok(())
        }
        Id::Zunionstore | Id::Zinterstore | Id::Zdiffstore => {
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
        Id::Zrangestore => {
            // ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]: ZRANGE's
            // selection of src (its arguments shifted by one), stored as dst.
            let mut cx = Counters::default();
            let Some((sel, _)) = zrange_select(&mut cx, st, &*w, Id::Zrange, &a[1..], true, out)
            else {
                return Ok(());
            };
            store_zset(w, st, a[1], &sel)?;
            int(out, sel.len() as i64);
            Ok(())
        }
        Id::Lpop | Id::Rpop => {
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
        Id::Sadd => {
            let Ok((p, e)) = probe_typed(w, st, a[1], T_SET, out) else {
                return Ok(());
            };
            let (n, s) = set::add(w, st, e.as_ref().map(set_obj), &a[2..])?;
            upsert_obj(w, st, &p, a[1], e, T_SET, s.enc, s.obj)?;
            int(out, n as i64);
            Ok(())
        }
        Id::Bitfield => {
            let Ok(ops) = bitfield::parse(&a[2..], out) else {
                return Ok(());
            };
            let Ok((p, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
                return Ok(());
            };
            let Some(high) = ops
                .iter()
                .filter(|o| o.writes())
                .map(|o| (o.offset + o.bits - 1) >> 3)
                .max()
            else {
                // GETs only: nothing is created or written.
                bitfield_reads(w, e.as_ref(), &ops, out);
                return Ok(());
            };
            let len = e.as_ref().map_or(0, |e| ks::string_len(w, e));
            match e {
                Some(e) if high < len => {
                    // Inside the string: each op reads its few bytes and writes back what
                    // it changed, in order (a later GET sees an earlier SET).
                    array(out, ops.len());
                    for op in &ops {
                        let (lo, hi) = bitfield::bytes(op);
                        let mut buf = ks::string_range(w, &e, lo, hi + 1 - lo).into_owned();
                        buf.resize((hi + 1 - lo) as usize, 0);
                        let before = buf.clone();
                        bitfield::apply_one(op, &mut buf, lo, out);
                        if op.writes() && buf != before {
                            ks::string_overwrite(w, &e, lo, &buf)?;
                        }
                    }
                }
                e => {
                    // Past its end: the string grows, zero-padded, as Redis's lookup for bit
                    // commands does (even when every op then fails).
                    let mut v = e
                        .as_ref()
                        .map(|e| ks::string_value(w, e).into_owned())
                        .unwrap_or_default();
                    v.resize(high as usize + 1, 0);
                    array(out, ops.len());
                    for op in &ops {
                        // Bytes past the new end read as zeros; no write reaches them.
                        bitfield::apply_one(op, &mut v, 0, out);
                    }
                    match e {
                        Some(e) => ks::set_string(w, st, &e, &v)?,
                        None => ks::insert_string(w, st, &p, a[1], &v)?,
                    }
                }
            }
            Ok(())
        }
        Id::Setbit => {
            let Some(bit) = bit_offset(a[2], out) else {
                return Ok(());
            };
            let on = match a[3] {
                b"0" => false,
                b"1" => true,
                _ => {
                    reply::error(out, "ERR bit is not an integer or out of range");
                    return Ok(());
                }
            };
            let Ok((p, e)) = probe_typed(w, st, a[1], T_STRING, out) else {
                return Ok(());
            };
            let (byte, mask) = (bit / 8, 0x80u8 >> (bit % 8));
            let len = e.as_ref().map_or(0, |e| ks::string_len(w, e));
            let old = match &e {
                // Inside the string: one byte rewritten in place.
                Some(e) if byte < len => {
                    let b = *ks::string_range(w, e, byte, 1)
                        .first()
                        .ok_or(HeapError::Damaged(e.off))?;
                    let nb = if on { b | mask } else { b & !mask };
                    if nb != b {
                        ks::string_overwrite(w, e, byte, &[nb])?;
                    }
                    b & mask != 0
                }
                // Past its end: the string grows, zero-padded.
                _ => {
                    let mut v = e
                        .as_ref()
                        .map(|e| ks::string_value(w, e).into_owned())
                        .unwrap_or_default();
                    v.resize(byte as usize + 1, 0);
                    if on {
                        v[byte as usize] |= mask;
                    }
                    match e {
                        Some(e) => ks::set_string(w, st, &e, &v)?,
                        None => ks::insert_string(w, st, &p, a[1], &v)?,
                    }
                    false
                }
            };
            int(out, old as i64);
            Ok(())
        }
        Id::Bitop => {
            #[derive(PartialEq)]
            enum Op {
                And,
                Or,
                Xor,
                Not,
            }
            let op = if is(a[1], "and") {
                Op::And
            } else if is(a[1], "or") {
                Op::Or
            } else if is(a[1], "xor") {
                Op::Xor
            } else if is(a[1], "not") {
                Op::Not
            } else {
                syntax(out);
                return Ok(());
            };
            if op == Op::Not && a.len() != 4 {
                reply::error(
                    out,
                    "ERR BITOP NOT must be called with a single source key.",
                );
                return Ok(());
            }
            let mut srcs: Vec<Vec<u8>> = Vec::with_capacity(a.len() - 3);
            for k in &a[3..] {
                match look(w, st, k, T_STRING) {
                    Look::Wrong => {
                        wrongtype(out);
                        return Ok(());
                    }
                    Look::Missing => srcs.push(Vec::new()),
                    Look::Found(e) => srcs.push(ks::string_value(w, &e).into_owned()),
                }
            }
            let n = srcs.iter().map(|v| v.len()).max().unwrap_or(0);
            let byte = |v: &Vec<u8>, i: usize| v.get(i).copied().unwrap_or(0);
            let res: Vec<u8> = (0..n)
                .map(|i| match op {
                    Op::Not => !byte(&srcs[0], i),
                    Op::And => srcs.iter().fold(0xff, |acc, v| acc & byte(v, i)),
                    Op::Or => srcs.iter().fold(0, |acc, v| acc | byte(v, i)),
                    Op::Xor => srcs.iter().fold(0, |acc, v| acc ^ byte(v, i)),
                })
                .collect();
            if let Some(d) = ks::lookup(w, st, a[2]) {
                ks::delete(w, st, &d)?;
            }
            if n > 0 {
                let (p, _) = ks::probe(w, st, a[2]);
                ks::insert_string(w, st, &p, a[2], &res)?;
            }
            int(out, n as i64);
            Ok(())
        }
        Id::Incrbyfloat => {
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
        Id::Hincrbyfloat => {
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
        Id::Setrange => {
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
        Id::Lmove | Id::Rpoplpush => {
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
        Id::Lset => {
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
        Id::Linsert => {
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
        Id::Lrem => {
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
        Id::Ltrim => {
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
        Id::Copy => {
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
            match src.ty() {
                T_STRING => {
                    let v = ks::string_value(w, &src).into_owned();
                    let (p, _) = ks::probe(w, &dst, a[2]);
                    ks::insert_string(w, &dst, &p, a[2], &v)?;
                }
                T_SET => {
                    let mut all = Vec::new();
                    set::for_each(w, set_obj(&src), |v| all.push(v.to_vec()));
                    let refs: Vec<&[u8]> = all.iter().map(|v| v.as_slice()).collect();
                    let (_, s) = set::add(w, st, None, &refs)?;
                    let (p, _) = ks::probe(w, &dst, a[2]);
                    ks::insert_object(w, &dst, &p, a[2], T_SET, s.enc, s.obj)?;
                }
                T_HASH => {
                    let mut all = Vec::new();
                    hash::for_each(w, hash_obj(&src), |f, v| all.push((f.to_vec(), v.to_vec())));
                    let pairs: Vec<(&[u8], &[u8])> = all
                        .iter()
                        .map(|(f, v)| (f.as_slice(), v.as_slice()))
                        .collect();
                    let (_, h) = hash::set(w, st, None, &pairs)?;
                    let (p, _) = ks::probe(w, &dst, a[2]);
                    ks::insert_object(w, &dst, &p, a[2], T_HASH, h.enc, h.obj)?;
                }
                T_LIST => {
                    let all = list::to_vec(w, src.obj());
                    let refs: Vec<&[u8]> = all.iter().map(|v| v.as_slice()).collect();
                    let l = list::create(w)?;
                    list::push(w, l, &refs, false)?;
                    let (p, _) = ks::probe(w, &dst, a[2]);
                    ks::insert_object(w, &dst, &p, a[2], T_LIST, 0, l)?;
                }
                T_ZSET => {
                    let mut all = Vec::new();
                    let n = zset::len(w, src.obj());
                    if n > 0 {
                        zset::range_by_rank(w, src.obj(), 0, n - 1, false, |m, sc| {
                            all.push((m.to_vec(), sc))
                        });
                    }
                    let z = zset::create(w)?;
                    for (m, sc) in &all {
                        zset::add(w, st, z, *sc, m, AddFlags::default())?;
                    }
                    let (p, _) = ks::probe(w, &dst, a[2]);
                    ks::insert_object(w, &dst, &p, a[2], T_ZSET, 0, z)?;
                }
                _ => return Err(HeapError::Damaged(src.off)),
            }
            set_ttl(w, &dst, a[2], ttl)?;
            int(out, 1);
            Ok(())
        }
        Id::Rename | Id::Renamenx => {
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
        Id::Sinterstore | Id::Sunionstore | Id::Sdiffstore => {
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
        Id::Smove => {
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
        Id::Srem => {
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
        Id::Spop => {
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
        Id::Hset | Id::Hmset | Id::Hsetnx => {
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
        Id::Hdel => {
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
        Id::Hincrby => {
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
        Id::Zadd | Id::Zincrby => zadd(st, w, id, a, out),
        Id::Zremrangebylex => {
            let (Some(min), Some(max)) = (parse_lex(a[2]), parse_lex(a[3])) else {
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
            let gone = lex_members(w, e.obj(), &min, &max, false);
            for (mem, _) in &gone {
                zset::remove(w, st, e.obj(), mem)?;
            }
            if zset::len(w, e.obj()) == 0 {
                ks::delete(w, st, &e)?;
            }
            int(out, gone.len() as i64);
            Ok(())
        }
        Id::Zremrangebyscore | Id::Zremrangebyrank => {
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
                        zset::range_by_rank(w, e.obj(), s, t, false, |mem, _| {
                            doomed.push(mem.to_vec())
                        });
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
        Id::Zrem => {
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
        Id::Zpopmin | Id::Zpopmax => {
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
        _ => {
            reply::error(out, "ERR internal: not a write command");
            Ok(())
        }
    }
}

fn set_cmd(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
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

/// LMPOP / ZMPOP (and the attempt of BLMPOP / BZMPOP): `numkeys key ... LEFT|RIGHT (MIN|MAX)
/// [COUNT n]` from `a[nk]`, Redis 7.0's checks in its order; pops up to `count` from the first
/// key that holds something and replies `[key, elements]` (ZMPOP: `[member, score]` pairs).
/// Returns whether it replied (false: every key empty; nothing written).
fn mpop(
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
        write(st, w, pid, &[name, k, count.as_bytes()], &mut popped)?;
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
fn blocking_try(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
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
        mpop(st, w, id == Id::Bzmpop, a, 2, out)?;
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
                write(st, w, pid, &[name, k], &mut one)?;
                array(out, 2);
                bulk(out, k);
                out.extend_from_slice(&one);
            }
            Id::Brpoplpush => write(st, w, Id::Rpoplpush, &[b"RPOPLPUSH", a[1], a[2]], out)?,
            Id::Blmove => write(st, w, Id::Lmove, &[b"LMOVE", a[1], a[2], a[3], a[4]], out)?,
            _ => {
                let (pid, name): (Id, &[u8]) = if id == Id::Bzpopmin {
                    (Id::Zpopmin, b"ZPOPMIN")
                } else {
                    (Id::Zpopmax, b"ZPOPMAX")
                };
                let mut one = Vec::new();
                write(st, w, pid, &[name, k], &mut one)?;
                array(out, 3);
                bulk(out, k);
                out.extend_from_slice(one.strip_prefix(b"*2\r\n").unwrap_or(&one));
            }
        }
        return Ok(());
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Expiry (the deadlines themselves: `crate::ds::expire`).

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
        return a[(nk + 1).min(end)..end].iter().copied().step_by(1);
    }
    let (first, last, step) = spec.keys;
    let n = a.len() as i32;
    let last = if last < 0 { n + last } else { last.min(n - 1) };
    let range = if first <= 0 || step <= 0 || last < first {
        0..0
    } else {
        first as usize..last as usize + 1
    };
    a[range].iter().copied().step_by(step.max(1) as usize)
}

/// Delete the expired keys among write command `spec`'s key arguments, before it runs (Redis'
/// lookupKeyWrite), so that its own lookups never meet one. Returns how many were deleted.
pub fn purge_expired(st: &Store, w: &mut Wtx, spec: &Spec, a: &[&[u8]]) -> Result<u64, HeapError> {
    expire::purge(w, st, key_args(spec, a))
}

/// How an expiry argument counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ttl {
    /// Seconds from now.
    Ex,
    /// Milliseconds from now.
    Px,
    /// Unix time in seconds.
    Exat,
    /// Unix time in milliseconds.
    Pxat,
}

fn invalid_expire(out: &mut Vec<u8>, cmd: &str) {
    reply::error(out, &format!("ERR invalid expire time in '{cmd}' command"));
}

/// Redis' getExpireMillisecondsOrReply: the deadline (ms since the epoch) that `arg` says in
/// `unit`, or `None` after the error reply (not an integer; not positive; overflow).
fn deadline_arg(arg: &[u8], unit: Ttl, cmd: &str, out: &mut Vec<u8>) -> Option<u64> {
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

/// The live entry `e` without its deadline (SET, GETSET, MSET and SETEX give a key a new
/// value and drop its time to live; most other writes keep it).
fn without_ttl(w: &mut Wtx, st: &Store, e: Entry) -> Result<Entry, HeapError> {
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
fn set_ttl(w: &mut Wtx, st: &Store, key: &[u8], at: Option<u64>) -> HResult {
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

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (Redis 7.0's expireGenericCommand): options first,
/// then the time (overflow is an error), then the key; NX/XX/GT/LT against its current
/// deadline (none counts as infinite); a time already past deletes the key.
fn expire_cmd(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
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

fn zadd(st: &Store, w: &mut Wtx, id: Id, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
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
