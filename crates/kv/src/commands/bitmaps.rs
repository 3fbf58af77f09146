//! The bitmap commands: GETBIT, SETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD, BITFIELD_RO (the
//! BITFIELD subcommands themselves: `bitfield`).

use super::bitfield;
use super::data::{found, is, look, parse_i64, probe_typed, Counters, HResult, Look};
use super::reply::{self, array, int, not_int, syntax, wrongtype};
use crate::ds::keyspace::{self as ks, Entry, T_STRING};
use crate::ds::{Mem, Store, Wtx};
use crate::heap::HeapError;

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

/// BITFIELD_RO.
pub(super) fn bitfield_ro<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
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

/// GETBIT.
pub(super) fn getbit<M: Mem>(cx: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    let Some(bit) = bit_offset(a[2], out) else {
        return;
    };
    let Some(e) = found(cx, st, m, a[1], T_STRING, out, |o| int(o, 0)) else {
        return;
    };
    let b = ks::string_range(m, &e, bit / 8, 1);
    int(
        out,
        b.first().map_or(0, |x| (x >> (7 - bit % 8)) & 1) as i64,
    );
}

/// BITPOS.
pub(super) fn bitpos<M: Mem>(
    _cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
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

/// BITCOUNT.
pub(super) fn bitcount<M: Mem>(
    cx: &mut Counters,
    st: &Store,
    m: &M,
    a: &[&[u8]],
    out: &mut Vec<u8>,
) {
    let Some(e) = found(cx, st, m, a[1], T_STRING, out, |o| int(o, 0)) else {
        return;
    };
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

/// BITFIELD.
pub(super) fn bitfield(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
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

/// SETBIT.
pub(super) fn setbit(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
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

/// BITOP.
pub(super) fn bitop(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> HResult {
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
