//! BITFIELD and BITFIELD_RO as Redis 7.0 does them (`bitfieldGeneric` in bitops.c): the
//! subcommands parsed first (GET, SET, INCRBY, OVERFLOW WRAP|SAT|FAIL; types `i1`–`i64` and
//! `u1`–`u63`; offsets in bits or `#N` times the width), then the operations applied in order to
//! a window of the string's bytes, with Redis's overflow arithmetic. The storage side (which
//! bytes to read, how to write them back) is the caller's, in `data.rs`.

use super::reply;

/// One parsed subcommand that replies (OVERFLOW only changes the ones after it).
#[derive(Clone, Copy, Debug)]
pub(super) struct Op {
    kind: Kind,
    /// Bit offset from the string's start.
    pub(super) offset: u64,
    /// Width in bits, 1..=64.
    pub(super) bits: u64,
    signed: bool,
    /// SET's value or INCRBY's increment.
    value: i64,
    overflow: Overflow,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Get,
    Set,
    Incrby,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

impl Op {
    /// SET or INCRBY.
    pub(super) fn writes(&self) -> bool {
        self.kind != Kind::Get
    }
}

/// Parse BITFIELD's subcommands (`args` after the key). `Err(())` after replying Redis's error.
pub(super) fn parse(args: &[&[u8]], out: &mut Vec<u8>) -> Result<Vec<Op>, ()> {
    let mut ops = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut j = 0;
    while j < args.len() {
        let rem = args.len() - j - 1;
        let sub = args[j];
        let kind = if sub.eq_ignore_ascii_case(b"get") && rem >= 2 {
            Kind::Get
        } else if sub.eq_ignore_ascii_case(b"set") && rem >= 3 {
            Kind::Set
        } else if sub.eq_ignore_ascii_case(b"incrby") && rem >= 3 {
            Kind::Incrby
        } else if sub.eq_ignore_ascii_case(b"overflow") && rem >= 1 {
            let t = args[j + 1];
            overflow = if t.eq_ignore_ascii_case(b"wrap") {
                Overflow::Wrap
            } else if t.eq_ignore_ascii_case(b"sat") {
                Overflow::Sat
            } else if t.eq_ignore_ascii_case(b"fail") {
                Overflow::Fail
            } else {
                reply::error(out, "ERR Invalid OVERFLOW type specified");
                return Err(());
            };
            j += 2;
            continue;
        } else {
            reply::error(out, "ERR syntax error");
            return Err(());
        };
        let Some((signed, bits)) = parse_type(args[j + 1]) else {
            reply::error(
                out,
                "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not \
                 supported but i64 is.",
            );
            return Err(());
        };
        let Some(offset) = parse_offset(args[j + 2], bits) else {
            reply::error(out, "ERR bit offset is not an integer or out of range");
            return Err(());
        };
        let mut value = 0;
        if kind != Kind::Get {
            let Some(v) = super::data::parse_i64(args[j + 3]) else {
                reply::error(out, "ERR value is not an integer or out of range");
                return Err(());
            };
            value = v;
        }
        ops.push(Op {
            kind,
            offset,
            bits,
            signed,
            value,
            overflow,
        });
        j += if kind == Kind::Get { 3 } else { 4 };
    }
    Ok(ops)
}

/// `i1`..`i64` or `u1`..`u63` (either case of the letter).
fn parse_type(t: &[u8]) -> Option<(bool, u64)> {
    let signed = match t.first()? {
        b'i' | b'I' => true,
        b'u' | b'U' => false,
        _ => return None,
    };
    let bits = super::data::parse_i64(&t[1..])?;
    let max = if signed { 64 } else { 63 };
    (1..=max).contains(&bits).then_some((signed, bits as u64))
}

/// A bit offset, or `#N` (N × `bits`); below 2^32 bits (512 MiB, proto-max-bulk-len).
fn parse_offset(o: &[u8], bits: u64) -> Option<u64> {
    let (hash, num) = match o.first() {
        Some(b'#') => (true, &o[1..]),
        _ => (false, o),
    };
    let mut v = super::data::parse_i64(num)?;
    if hash {
        v = v.checked_mul(bits as i64)?;
    }
    (v >= 0 && (v >> 3) < 512 << 20).then_some(v as u64)
}

/// The bytes (first, last) of the string `op` reads or writes.
pub(super) fn bytes(op: &Op) -> (u64, u64) {
    (op.offset >> 3, (op.offset + op.bits - 1) >> 3)
}

/// Apply `op` to `buf`, the string's bytes from byte `base` on (zeros beyond its end), and
/// reply to it. `buf` must cover the op's bits ([`bytes`]).
pub(super) fn apply_one(op: &Op, buf: &mut [u8], base: u64, out: &mut Vec<u8>) {
    {
        let at = op.offset - base * 8;
        let old = get_unsigned(buf, at, op.bits);
        match (op.kind, op.signed) {
            (Kind::Get, false) => reply::int(out, old as i64),
            (Kind::Get, true) => reply::int(out, sign_extend(old, op.bits)),
            (kind, true) => {
                let oldv = sign_extend(old, op.bits);
                let (new, over, ret) = if kind == Kind::Incrby {
                    let (w, over) = signed_overflow(oldv, op.value, op.bits, op.overflow);
                    let n = if over { w } else { oldv.wrapping_add(op.value) };
                    (n, over, n)
                } else {
                    let (w, over) = signed_overflow(op.value, 0, op.bits, op.overflow);
                    (if over { w } else { op.value }, over, oldv)
                };
                if over && op.overflow == Overflow::Fail {
                    reply::null(out);
                } else {
                    reply::int(out, ret);
                    set_unsigned(buf, at, op.bits, new as u64);
                }
            }
            (kind, false) => {
                let (new, over, ret) = if kind == Kind::Incrby {
                    let (w, over) = unsigned_overflow(old, op.value, op.bits, op.overflow);
                    let n = if over {
                        w
                    } else {
                        old.wrapping_add(op.value as u64)
                    };
                    (n, over, n)
                } else {
                    let v = op.value as u64;
                    let (w, over) = unsigned_overflow(v, 0, op.bits, op.overflow);
                    (if over { w } else { v }, over, old)
                };
                if over && op.overflow == Overflow::Fail {
                    reply::null(out);
                } else {
                    reply::int(out, ret as i64);
                    set_unsigned(buf, at, op.bits, new);
                }
            }
        }
    }
}

/// `bits` bits of `p` from bit `offset`, most significant first.
fn get_unsigned(p: &[u8], offset: u64, bits: u64) -> u64 {
    let mut v = 0u64;
    for k in offset..offset + bits {
        let byte = p.get((k >> 3) as usize).copied().unwrap_or(0);
        v = (v << 1) | ((byte >> (7 - (k & 7))) & 1) as u64;
    }
    v
}

/// Store the low `bits` bits of `v` at bit `offset` of `p`, most significant first.
fn set_unsigned(p: &mut [u8], offset: u64, bits: u64, v: u64) {
    for j in 0..bits {
        let k = offset + j;
        let bit = (v >> (bits - 1 - j)) & 1;
        if let Some(b) = p.get_mut((k >> 3) as usize) {
            let mask = 0x80u8 >> (k & 7);
            *b = if bit == 1 { *b | mask } else { *b & !mask };
        }
    }
}

fn sign_extend(v: u64, bits: u64) -> i64 {
    if bits < 64 && v & (1 << (bits - 1)) != 0 {
        (v | (u64::MAX << bits)) as i64
    } else {
        v as i64
    }
}

/// Redis's checkUnsignedBitfieldOverflow: whether `value + incr` leaves `bits` bits, and the
/// value WRAP or SAT gives then.
fn unsigned_overflow(value: u64, incr: i64, bits: u64, ow: Overflow) -> (u64, bool) {
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let maxincr = max.wrapping_sub(value) as i64;
    let minincr = (value as i64).wrapping_neg();
    let wrap = || value.wrapping_add(incr as u64) & !(u64::MAX << bits);
    if value > max || (incr > 0 && incr > maxincr) {
        (if ow == Overflow::Wrap { wrap() } else { max }, true)
    } else if incr < 0 && incr < minincr {
        (if ow == Overflow::Wrap { wrap() } else { 0 }, true)
    } else {
        (0, false)
    }
}

/// Redis's checkSignedBitfieldOverflow, as above for signed fields.
fn signed_overflow(value: i64, incr: i64, bits: u64, ow: Overflow) -> (i64, bool) {
    let max = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let maxincr = (max as u64).wrapping_sub(value as u64) as i64;
    let minincr = min.wrapping_sub(value);
    let wrap = || {
        let mut c = (value as u64).wrapping_add(incr as u64);
        if bits < 64 {
            let mask = u64::MAX << bits;
            if c & (1 << (bits - 1)) != 0 {
                c |= mask;
            } else {
                c &= !mask;
            }
        }
        c as i64
    };
    if value > max || (bits != 64 && incr > maxincr) || (value >= 0 && incr > 0 && incr > maxincr) {
        (if ow == Overflow::Wrap { wrap() } else { max }, true)
    } else if value < min
        || (bits != 64 && incr < minincr)
        || (value < 0 && incr < 0 && incr < minincr)
    {
        (if ow == Overflow::Wrap { wrap() } else { min }, true)
    } else {
        (0, false)
    }
}
