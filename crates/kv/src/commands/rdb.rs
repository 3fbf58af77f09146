//! The DUMP payload format of Redis 7.0 (an RDB object serialization, then the RDB version
//! and a CRC-64): encoding a value for DUMP, decoding one for RESTORE. Pure functions over
//! bytes; the heap is not touched here (`commands/value.rs` moves values in and out of it).
//!
//! Encoding writes the plain RDB types every Redis since 2.x loads (string, list, set,
//! hash, and ZSET_2 with binary scores), so a payload of ours RESTOREs into Redis 7.0 as well.
//! Decoding reads what Redis 7.0 and older versions write: those plain types, and the compact
//! encodings (intset, ziplist, listpack, quicklist 1 and 2), with LZF-compressed strings.
//! Anything else (streams, modules, zipmaps, or a payload that does not parse) is
//! [`DumpError::BadFormat`], never a panic: the input comes from clients.

/// The RDB version Redis 7.0 writes and the newest it accepts.
pub const RDB_VERSION: u16 = 10;
/// The largest string a payload may hold (Redis's `proto-max-bulk-len` default).
const MAX_STRING: u64 = 512 << 20;

const T_STRING: u8 = 0;
const T_LIST: u8 = 1;
const T_SET: u8 = 2;
const T_ZSET: u8 = 3;
const T_HASH: u8 = 4;
const T_ZSET_2: u8 = 5;
const T_LIST_ZIPLIST: u8 = 10;
const T_SET_INTSET: u8 = 11;
const T_ZSET_ZIPLIST: u8 = 12;
const T_HASH_ZIPLIST: u8 = 13;
const T_LIST_QUICKLIST: u8 = 14;
const T_HASH_LISTPACK: u8 = 16;
const T_ZSET_LISTPACK: u8 = 17;
const T_LIST_QUICKLIST_2: u8 = 18;

/// A value as DUMP and RESTORE see it: the elements of one key, in the order they go.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A string.
    Str(Vec<u8>),
    /// A list, head first.
    List(Vec<Vec<u8>>),
    /// A set's members.
    Set(Vec<Vec<u8>>),
    /// A hash's field-value pairs.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A sorted set's members with their scores.
    Zset(Vec<(Vec<u8>, f64)>),
}

/// Why a payload is refused, with Redis 7.0's reply for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpError {
    /// Too short, a newer RDB version, or a CRC-64 mismatch.
    VersionOrChecksum,
    /// The serialization does not parse, is of a type not supported, or is empty.
    BadFormat,
}

impl DumpError {
    /// The error reply's text, as Redis 7.0 words it.
    pub fn message(self) -> &'static str {
        match self {
            DumpError::VersionOrChecksum => "ERR DUMP payload version or checksum are wrong",
            DumpError::BadFormat => "ERR Bad data format",
        }
    }
}

fn crc64(bytes: &[u8]) -> u64 {
    crc::Crc::<u64>::new(&crc::CRC_64_REDIS).checksum(bytes)
}

/// The DUMP payload of `v`: its RDB type and serialization, the RDB version (2 bytes, little
/// endian) and the CRC-64 of everything before (8 bytes, little endian).
pub fn encode(v: &Value) -> Vec<u8> {
    let mut o = Vec::new();
    match v {
        Value::Str(s) => {
            o.push(T_STRING);
            put_string(&mut o, s);
        }
        Value::List(items) | Value::Set(items) => {
            o.push(if matches!(v, Value::List(_)) {
                T_LIST
            } else {
                T_SET
            });
            put_len(&mut o, items.len() as u64);
            for s in items {
                put_string(&mut o, s);
            }
        }
        Value::Hash(pairs) => {
            o.push(T_HASH);
            put_len(&mut o, pairs.len() as u64);
            for (f, x) in pairs {
                put_string(&mut o, f);
                put_string(&mut o, x);
            }
        }
        Value::Zset(members) => {
            o.push(T_ZSET_2);
            put_len(&mut o, members.len() as u64);
            for (m, sc) in members {
                put_string(&mut o, m);
                o.extend_from_slice(&sc.to_le_bytes());
            }
        }
    }
    o.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let c = crc64(&o);
    o.extend_from_slice(&c.to_le_bytes());
    o
}

/// An RDB length: 6 bits, 14 bits, or a 32- or 64-bit big-endian word after a marker byte.
fn put_len(o: &mut Vec<u8>, n: u64) {
    if n < 1 << 6 {
        o.push(n as u8);
    } else if n < 1 << 14 {
        o.push(0x40 | (n >> 8) as u8);
        o.push(n as u8);
    } else if n <= u32::MAX as u64 {
        o.push(0x80);
        o.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        o.push(0x81);
        o.extend_from_slice(&n.to_be_bytes());
    }
}

/// An RDB string as Redis writes one: a short canonical integer in 8, 16 or 32 bits; a
/// string longer than 20 bytes LZF-compressed when that saves at least 4 bytes; else raw.
fn put_string(o: &mut Vec<u8>, s: &[u8]) {
    if s.len() <= 11 {
        if let Some(i) = canonical_int(s) {
            if let Ok(b) = i8::try_from(i) {
                o.extend_from_slice(&[0xC0, b as u8]);
                return;
            }
            if let Ok(h) = i16::try_from(i) {
                o.push(0xC1);
                o.extend_from_slice(&h.to_le_bytes());
                return;
            }
            if let Ok(w) = i32::try_from(i) {
                o.push(0xC2);
                o.extend_from_slice(&w.to_le_bytes());
                return;
            }
        }
    }
    if s.len() > 20 {
        if let Ok(c) = lzf::compress(s) {
            if c.len() + 4 <= s.len() {
                o.push(0xC3);
                put_len(o, c.len() as u64);
                put_len(o, s.len() as u64);
                o.extend_from_slice(&c);
                return;
            }
        }
    }
    put_len(o, s.len() as u64);
    o.extend_from_slice(s);
}

/// `s` as an i64 when it is the canonical decimal form of one (what Redis encodes as an int).
fn canonical_int(s: &[u8]) -> Option<i64> {
    let t = std::str::from_utf8(s).ok()?;
    let i: i64 = t.parse().ok()?;
    (i.to_string().as_bytes() == s).then_some(i)
}

/// The value a DUMP payload holds, checked as Redis 7.0's RESTORE checks it: the footer's
/// version and CRC-64 first, then a serialization that parses to its last byte.
pub fn decode(p: &[u8]) -> Result<Value, DumpError> {
    if p.len() < 10 {
        return Err(DumpError::VersionOrChecksum);
    }
    let (body, footer) = p.split_at(p.len() - 8);
    let ver = u16::from_le_bytes([body[body.len() - 2], body[body.len() - 1]]);
    let want = u64::from_le_bytes(footer.try_into().map_err(|_| DumpError::BadFormat)?);
    if ver > RDB_VERSION || crc64(body) != want {
        return Err(DumpError::VersionOrChecksum);
    }
    let mut r = Reader {
        b: &body[..body.len() - 2],
        at: 0,
    };
    let v = r.object().ok_or(DumpError::BadFormat)?;
    let empty = match &v {
        Value::Str(_) => false,
        Value::List(x) | Value::Set(x) => x.is_empty(),
        Value::Hash(x) => x.is_empty(),
        Value::Zset(x) => x.is_empty(),
    };
    if empty || r.at != r.b.len() || has_duplicates(&v) {
        return Err(DumpError::BadFormat);
    }
    Ok(v)
}

/// Sets, hashes and sorted sets with a member twice are corrupt (Redis refuses them).
fn has_duplicates(v: &Value) -> bool {
    let mut seen = std::collections::HashSet::new();
    match v {
        Value::Set(x) => x.iter().any(|m| !seen.insert(m.as_slice())),
        Value::Hash(x) => x.iter().any(|(f, _)| !seen.insert(f.as_slice())),
        Value::Zset(x) => x.iter().any(|(m, _)| !seen.insert(m.as_slice())),
        _ => false,
    }
}

/// A bounds-checked cursor: every read past the end is `None`.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }

    /// A length, or `Err(kind)` for a special string encoding (0xC0 | kind).
    fn len_or_enc(&mut self) -> Option<Result<u64, u8>> {
        let b = self.byte()?;
        Some(match b >> 6 {
            0 => Ok((b & 0x3F) as u64),
            1 => Ok((((b & 0x3F) as u64) << 8) | self.byte()? as u64),
            2 => match b {
                0x80 => Ok(u32::from_be_bytes(self.take(4)?.try_into().ok()?) as u64),
                0x81 => Ok(u64::from_be_bytes(self.take(8)?.try_into().ok()?)),
                _ => return None,
            },
            _ => Err(b & 0x3F),
        })
    }

    fn len(&mut self) -> Option<u64> {
        self.len_or_enc()?.ok()
    }

    fn string(&mut self) -> Option<Vec<u8>> {
        match self.len_or_enc()? {
            Ok(n) => {
                let n = usize::try_from(n).ok()?;
                Some(self.take(n)?.to_vec())
            }
            Err(0) => Some((self.byte()? as i8).to_string().into_bytes()),
            Err(1) => Some(
                i16::from_le_bytes(self.take(2)?.try_into().ok()?)
                    .to_string()
                    .into_bytes(),
            ),
            Err(2) => Some(
                i32::from_le_bytes(self.take(4)?.try_into().ok()?)
                    .to_string()
                    .into_bytes(),
            ),
            Err(3) => {
                let clen = usize::try_from(self.len()?).ok()?;
                let ulen = self.len()?;
                let c = self.take(clen)?;
                // An LZF back-reference of 3 bytes expands to at most 264: a claimed length
                // beyond that is corrupt (and must not size an allocation).
                if ulen == 0 || ulen > MAX_STRING || ulen > clen as u64 * 88 + 8 {
                    return None;
                }
                let out = lzf::decompress(c, ulen as usize).ok()?;
                (out.len() as u64 == ulen).then_some(out)
            }
            Err(_) => None,
        }
    }

    /// A count of elements that each take at least one byte: no larger than what is left.
    fn count(&mut self) -> Option<usize> {
        let n = usize::try_from(self.len()?).ok()?;
        (n <= self.b.len() - self.at).then_some(n)
    }

    /// An old-style ZSET score: a length byte, or 253/254/255 for nan/+inf/-inf.
    fn text_double(&mut self) -> Option<f64> {
        match self.byte()? {
            253 => Some(f64::NAN),
            254 => Some(f64::INFINITY),
            255 => Some(f64::NEG_INFINITY),
            n => std::str::from_utf8(self.take(n as usize)?)
                .ok()?
                .parse()
                .ok(),
        }
    }

    fn object(&mut self) -> Option<Value> {
        let ty = self.byte()?;
        Some(match ty {
            T_STRING => Value::Str(self.string()?),
            T_LIST | T_SET => {
                let n = self.count()?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string()?);
                }
                if ty == T_LIST {
                    Value::List(v)
                } else {
                    Value::Set(v)
                }
            }
            T_ZSET | T_ZSET_2 => {
                let n = self.count()?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let m = self.string()?;
                    let sc = if ty == T_ZSET_2 {
                        f64::from_le_bytes(self.take(8)?.try_into().ok()?)
                    } else {
                        self.text_double()?
                    };
                    if sc.is_nan() {
                        return None;
                    }
                    v.push((m, sc));
                }
                Value::Zset(v)
            }
            T_HASH => {
                let n = self.count()?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let f = self.string()?;
                    v.push((f, self.string()?));
                }
                Value::Hash(v)
            }
            T_SET_INTSET => Value::Set(intset(&self.string()?)?),
            T_LIST_ZIPLIST => Value::List(ziplist(&self.string()?)?),
            T_HASH_ZIPLIST => Value::Hash(pairs(ziplist(&self.string()?)?)?),
            T_ZSET_ZIPLIST => Value::Zset(scored(ziplist(&self.string()?)?)?),
            T_HASH_LISTPACK => Value::Hash(pairs(listpack(&self.string()?)?)?),
            T_ZSET_LISTPACK => Value::Zset(scored(listpack(&self.string()?)?)?),
            T_LIST_QUICKLIST | T_LIST_QUICKLIST_2 => {
                let nodes = self.count()?;
                let mut v = Vec::new();
                for _ in 0..nodes {
                    if ty == T_LIST_QUICKLIST {
                        v.extend(ziplist(&self.string()?)?);
                        continue;
                    }
                    match self.len()? {
                        // PLAIN: the node is one element.
                        1 => v.push(self.string()?),
                        // PACKED: a listpack of elements, never empty.
                        2 => {
                            let items = listpack(&self.string()?)?;
                            if items.is_empty() {
                                return None;
                            }
                            v.extend(items);
                        }
                        _ => return None,
                    }
                }
                Value::List(v)
            }
            _ => return None,
        })
    }
}

/// Alternating field, value.
fn pairs(items: Vec<Vec<u8>>) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if items.len() % 2 != 0 {
        return None;
    }
    let mut it = items.into_iter();
    let mut v = Vec::new();
    while let (Some(f), Some(x)) = (it.next(), it.next()) {
        v.push((f, x));
    }
    Some(v)
}

/// Alternating member, score (a score is an integer entry or a decimal string).
fn scored(items: Vec<Vec<u8>>) -> Option<Vec<(Vec<u8>, f64)>> {
    pairs(items)?
        .into_iter()
        .map(|(m, s)| {
            let sc: f64 = std::str::from_utf8(&s).ok()?.parse().ok()?;
            (!sc.is_nan()).then_some((m, sc))
        })
        .collect()
}

/// An intset: encoding (2, 4 or 8 bytes per element), count, then the sorted integers.
fn intset(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let enc = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
    let n = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?) as usize;
    if !matches!(enc, 2 | 4 | 8) || b.len() != 8 + n.checked_mul(enc)? {
        return None;
    }
    Some(
        b[8..]
            .chunks_exact(enc)
            .map(|c| {
                let i = match enc {
                    2 => i16::from_le_bytes([c[0], c[1]]) as i64,
                    4 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64,
                    _ => i64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
                };
                i.to_string().into_bytes()
            })
            .collect(),
    )
}

/// Sign-extend the low `bits` of `v`.
fn sext(v: u64, bits: u32) -> i64 {
    let s = 64 - bits;
    ((v << s) as i64) >> s
}

fn le(b: &[u8]) -> u64 {
    b.iter().rev().fold(0, |a, &x| (a << 8) | x as u64)
}

/// A listpack: total bytes, count (u16, 65535 = unknown), entries each followed by its
/// back-length, and 0xFF.
fn listpack(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let total = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
    if total != b.len() || b.last() != Some(&0xFF) {
        return None;
    }
    let mut at = 6;
    let mut v = Vec::new();
    while *b.get(at)? != 0xFF {
        let e = b[at];
        let (hdr, data_len, item): (usize, usize, Option<Vec<u8>>) = match e {
            0x00..=0x7F => (1, 0, Some((e as i64).to_string().into_bytes())),
            0x80..=0xBF => (1, (e & 0x3F) as usize, None),
            0xC0..=0xDF => {
                let x = (((e & 0x1F) as u64) << 8) | *b.get(at + 1)? as u64;
                (2, 0, Some(sext(x, 13).to_string().into_bytes()))
            }
            0xE0..=0xEF => (
                2,
                (((e & 0x0F) as usize) << 8) | *b.get(at + 1)? as usize,
                None,
            ),
            0xF0 => (5, le(b.get(at + 1..at + 5)?) as usize, None),
            0xF1..=0xF4 => {
                let w = [2usize, 3, 4, 8][(e - 0xF1) as usize];
                let x = le(b.get(at + 1..at + 1 + w)?);
                let i = sext(x, 8 * w as u32);
                (1 + w, 0, Some(i.to_string().into_bytes()))
            }
            _ => return None,
        };
        let item = match item {
            Some(i) => i,
            None => b.get(at + hdr..at + hdr + data_len)?.to_vec(),
        };
        let l = hdr + data_len;
        let backlen = match l {
            0..=127 => 1,
            128..=16382 => 2,
            16383..=2097150 => 3,
            2097151..=268435454 => 4,
            _ => 5,
        };
        at += l + backlen;
        v.push(item);
    }
    let n = u16::from_le_bytes(b.get(4..6)?.try_into().ok()?);
    (at + 1 == b.len() && (n == u16::MAX || n as usize == v.len())).then_some(v)
}

/// A ziplist: total bytes, tail offset, count (u16), entries (previous length, encoding,
/// data), and 0xFF.
fn ziplist(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let total = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
    if total != b.len() || b.last() != Some(&0xFF) {
        return None;
    }
    let mut at = 10;
    let mut v = Vec::new();
    while *b.get(at)? != 0xFF {
        at += if b[at] == 0xFE { 5 } else { 1 };
        let e = *b.get(at)?;
        let (hdr, len, int): (usize, usize, Option<i64>) = match e >> 6 {
            0 => (1, (e & 0x3F) as usize, None),
            1 => (
                2,
                (((e & 0x3F) as usize) << 8) | *b.get(at + 1)? as usize,
                None,
            ),
            2 => {
                let n = u32::from_be_bytes(b.get(at + 1..at + 5)?.try_into().ok()?);
                (5, n as usize, None)
            }
            _ => match e {
                0xC0 => (3, 0, Some(sext(le(b.get(at + 1..at + 3)?), 16))),
                0xD0 => (5, 0, Some(sext(le(b.get(at + 1..at + 5)?), 32))),
                0xE0 => (9, 0, Some(le(b.get(at + 1..at + 9)?) as i64)),
                0xF0 => (4, 0, Some(sext(le(b.get(at + 1..at + 4)?), 24))),
                0xFE => (2, 0, Some(*b.get(at + 1)? as i8 as i64)),
                0xF1..=0xFD => (1, 0, Some((e & 0x0F) as i64 - 1)),
                _ => return None,
            },
        };
        v.push(match int {
            Some(i) => i.to_string().into_bytes(),
            None => b.get(at + hdr..at + hdr + len)?.to_vec(),
        });
        at += hdr + len;
    }
    let n = u16::from_le_bytes(b.get(8..10)?.try_into().ok()?);
    (at + 1 == b.len() && (n == u16::MAX || n as usize == v.len())).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let big = vec![b'x'; 1000];
        for v in [
            Value::Str(b"hello".to_vec()),
            Value::Str(b"12345".to_vec()),
            Value::Str(b"-7".to_vec()),
            Value::Str(b"007".to_vec()),
            Value::Str(big.clone()),
            Value::List(vec![b"a".to_vec(), big.clone(), b"300".to_vec()]),
            Value::Set(vec![b"a".to_vec(), b"b".to_vec()]),
            Value::Hash(vec![(b"f".to_vec(), b"v".to_vec())]),
            Value::Zset(vec![(b"m".to_vec(), 1.5), (b"n".to_vec(), f64::INFINITY)]),
        ] {
            assert_eq!(decode(&encode(&v)), Ok(v));
        }
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        let p = encode(&Value::List(vec![b"abc".to_vec(); 40]));
        assert_eq!(decode(&p[..5]), Err(DumpError::VersionOrChecksum));
        for i in 0..p.len() {
            let mut q = p.clone();
            q[i] ^= 0x10;
            assert!(decode(&q).is_err());
        }
        // Well-checksummed garbage of every length: parsed, refused, no panic.
        for n in 0..300usize {
            let mut body: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            for ty in [0u8, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 16, 17, 18] {
                if let Some(b) = body.first_mut() {
                    *b = ty;
                }
                let mut q = body.clone();
                q.extend_from_slice(&RDB_VERSION.to_le_bytes());
                let c = crc64(&q);
                q.extend_from_slice(&c.to_le_bytes());
                let _ = decode(&q);
            }
        }
    }

    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let bytes = || prop::collection::vec(any::<u8>(), 0..40);
        let ints = || (-100_000i64..100_000).prop_map(|i| i.to_string().into_bytes());
        let elem = move || prop_oneof![bytes(), ints()];
        let score = prop_oneof![
            any::<f64>().prop_filter("not NaN", |f| !f.is_nan()),
            Just(1.5)
        ];
        prop_oneof![
            elem().prop_map(Value::Str),
            prop::collection::vec(elem(), 1..50).prop_map(Value::List),
            prop::collection::btree_set(elem(), 1..50)
                .prop_map(|s| Value::Set(s.into_iter().collect())),
            prop::collection::btree_map(elem(), elem(), 1..50)
                .prop_map(|m| Value::Hash(m.into_iter().collect())),
            prop::collection::btree_map(elem(), score, 1..50)
                .prop_map(|m| Value::Zset(m.into_iter().collect())),
        ]
    }

    proptest::proptest! {
        #[test]
        fn any_value_round_trips(v in value()) {
            proptest::prop_assert_eq!(decode(&encode(&v)), Ok(v));
        }

        #[test]
        fn any_checksummed_bytes_parse_or_are_refused(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let mut q = body;
            q.extend_from_slice(&RDB_VERSION.to_le_bytes());
            let c = crc64(&q);
            q.extend_from_slice(&c.to_le_bytes());
            let _ = decode(&q);
        }
    }
}
