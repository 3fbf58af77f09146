//! Hashes: a pack of (field, value) pairs while small, a dict of field entries above that.
//! "Small": at most [`pack::MAX_ENTRIES`] fields (fewer when `hash-max-listpack-entries` says
//! so: [`crate::config::thresholds`]) and [`pack::MAX_BYTES`] bytes; a write that leaves a
//! hash bigger makes it a dict, which stays one.
//!
//! Dict entry: `0 next, 8 hash, 16 meta (field length | size class << 48), 24 value length,
//! 32 field, value`. A value that still fits the entry's block is rewritten in place.
//!
//! A YCSB record (10 fields × 100 bytes, ~1.1 KB) is one pack: HGETALL / HMGET scan it
//! straight from the view, and a same-size HSET of one field writes just that value.

use super::dict::{self, Kind, E_META};
use super::keyspace::{free_classed, ENC_DICT, ENC_PACK};
use super::{class_of, class_size, intact, pack, Mem, Store, Wtx};
use crate::heap::{Off, Result};
use std::borrow::Cow;

const H_VLEN: u64 = 24;
const H_KEY: u64 = 32;

/// Hash entries keep their field at offset 32.
pub struct HashKind;

impl Kind for HashKind {
    #[inline]
    fn key_at(_meta: u64) -> u64 {
        H_KEY
    }
}

/// A hash value: its encoding and object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashObj {
    /// [`ENC_PACK`] or [`ENC_DICT`].
    pub enc: u8,
    /// The pack, or the dict header.
    pub obj: Off,
}

/// Fields of the hash.
pub fn len<M: Mem>(m: &M, h: HashObj) -> u64 {
    if h.enc == ENC_PACK {
        pack::count(m, h.obj)
    } else {
        dict::len(m, h.obj)
    }
}

fn sub<'a>(c: &Cow<'a, [u8]>, r: std::ops::Range<usize>) -> Cow<'a, [u8]> {
    // (Callers pass a range inside `c`, checked by `pack::item`.)
    match c {
        Cow::Borrowed(b) => Cow::Borrowed(&b[r]),
        Cow::Owned(v) => Cow::Owned(v[r].to_vec()),
    }
}

fn entry_value<M: Mem>(m: &M, e: Off) -> Cow<'_, [u8]> {
    let klen = m.u64(e + E_META) as u32 as u64;
    let vlen = m.u64(e + H_VLEN);
    m.bytes(e + H_KEY + klen, vlen.min(usize::MAX as u64) as usize)
}

/// The value of `field`.
pub fn get<'a, M: Mem>(m: &'a M, st: &Store, h: HashObj, field: &[u8]) -> Option<Cow<'a, [u8]>> {
    if h.enc == ENC_PACK {
        let body = pack::body(m, h.obj);
        let p = pack::find(&body, field, true, h.obj)?;
        let (v, end) = pack::item(&body, p.value, h.obj)?;
        let start = end - v.len();
        Some(sub(&body, start..end))
    } else {
        let (e, _) = dict::probe::<M, HashKind>(m, h.obj, st.hash(field), field).found?;
        Some(entry_value(m, e))
    }
}

/// Visit every (field, value).
pub fn for_each<M: Mem>(m: &M, h: HashObj, mut f: impl FnMut(&[u8], &[u8])) {
    if h.enc == ENC_PACK {
        let n = pack::count(m, h.obj);
        pack::for_each(&pack::body(m, h.obj), true, n, h.obj, f);
    } else {
        dict::for_each(m, h.obj, |e| {
            let klen = m.u64(e + E_META) as u32 as usize;
            f(&m.bytes(e + H_KEY, klen), &entry_value(m, e));
            true
        });
    }
}

/// HSCAN's walk: (field, value) of dict buckets `cursor..` until at least `count` were seen;
/// returns the next cursor (0: done); a packed hash in one step (as `set::scan`).
pub fn scan<M: Mem>(
    m: &M,
    h: HashObj,
    cursor: u64,
    count: u64,
    mut f: impl FnMut(&[u8], &[u8]),
) -> u64 {
    if h.enc == ENC_PACK {
        for_each(m, h, f);
        return 0;
    }
    dict::scan(m, h.obj, cursor, count, |e| {
        let klen = m.u64(e + E_META) as u32 as usize;
        f(&m.bytes(e + H_KEY, klen), &entry_value(m, e));
    })
}

fn entry_bytes(next: Off, h: u64, class: u8, field: &[u8], value: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(H_KEY as usize + field.len() + value.len());
    buf.extend_from_slice(&next.to_le_bytes());
    buf.extend_from_slice(&h.to_le_bytes());
    buf.extend_from_slice(&(field.len() as u64 | (class as u64) << 48).to_le_bytes());
    buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    buf.extend_from_slice(field);
    buf.extend_from_slice(value);
    buf
}

fn new_entry(w: &mut Wtx, next: Off, h: u64, field: &[u8], value: &[u8]) -> Result<Off> {
    let (e, cap) = w.alloc(H_KEY + (field.len() + value.len()) as u64)?;
    w.write(e, &entry_bytes(next, h, class_of(cap), field, value))?;
    Ok(e)
}

/// Set one field of dict `d`; true if the field is new.
fn dict_set(w: &mut Wtx, st: &Store, d: Off, field: &[u8], value: &[u8]) -> Result<bool> {
    let p = dict::probe::<_, HashKind>(w, d, st.hash(field), field);
    match p.found {
        None => {
            let e = new_entry(w, p.head, p.hash, field, value)?;
            dict::insert(w, d, &p, e)?;
            Ok(true)
        }
        Some((e, link)) => {
            let meta = w.u64(e + E_META);
            let cap = match class_size((meta >> 48) as u8) {
                Some(c) => c,
                None => w.usable_size(e)?,
            };
            if H_KEY + (field.len() + value.len()) as u64 <= cap {
                let mut buf = Vec::with_capacity(8 + field.len() + value.len());
                buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
                buf.extend_from_slice(field);
                buf.extend_from_slice(value);
                w.write(e + H_VLEN, &buf)?;
            } else {
                let next = w.u64(e);
                let ne = new_entry(w, next, p.hash, field, value)?;
                dict::replace(w, link, ne)?;
                free_classed(w, e, meta)?;
            }
            Ok(false)
        }
    }
}

/// Set `pairs` (later pairs win) in hash `h` (`None`: a new hash). Returns the number of new
/// fields and the hash's (possibly changed) encoding and object.
pub fn set(
    w: &mut Wtx,
    st: &Store,
    h: Option<HashObj>,
    pairs: &[(&[u8], &[u8])],
) -> Result<(u64, HashObj)> {
    match h {
        Some(h) if h.enc == ENC_DICT => {
            let mut added = 0;
            for (f, v) in pairs {
                added += dict_set(w, st, h.obj, f, v)? as u64;
            }
            Ok((added, h))
        }
        _ => {
            let old: Vec<u8> = match h {
                Some(h) => pack::body(w, h.obj).into_owned(),
                None => Vec::new(),
            };
            let mut count = h.map_or(0, |h| pack::count(w, h.obj) as usize);
            let at = h.map_or(0, |h| h.obj);
            let mut body = old.clone();
            let mut added = 0;
            for (f, v) in pairs {
                match pack::find(&body, f, true, at) {
                    Some(p) => {
                        let mut item = Vec::with_capacity(v.len() + 5);
                        pack::put_item(&mut item, v);
                        body.splice(p.value..p.end, item);
                    }
                    None => {
                        pack::put_item(&mut body, f);
                        pack::put_item(&mut body, v);
                        count += 1;
                        added += 1;
                    }
                }
            }
            intact()?;
            // Redis's `hash-max-listpack-entries` lowers the pack's own ceiling.
            let max = crate::config::thresholds().hash_max_listpack_entries;
            if pack::fits(count, body.len()) && count as u64 <= max {
                let obj = match h {
                    Some(h) => pack::store(w, h.obj, &old, &body, count)?,
                    None => pack::create(w, &body, count)?,
                };
                return Ok((added, HashObj { enc: ENC_PACK, obj }));
            }
            let (d, _) = w.alloc(dict::DICT_HDR)?;
            dict::init(w, d)?;
            intact()?;
            let mut all: Vec<(&[u8], &[u8])> = Vec::with_capacity(count);
            pack::for_each(&body, true, count as u64, at, |f, v| all.push((f, v)));
            intact()?;
            for (f, v) in all {
                dict_set(w, st, d, f, v)?;
            }
            if let Some(h) = h {
                pack::free(w, h.obj)?;
            }
            Ok((
                added,
                HashObj {
                    enc: ENC_DICT,
                    obj: d,
                },
            ))
        }
    }
}

/// Delete `fields`; returns the number deleted and the hash (its object may change). An empty
/// hash is left for the caller to delete.
pub fn del(w: &mut Wtx, st: &Store, h: HashObj, fields: &[&[u8]]) -> Result<(u64, HashObj)> {
    if h.enc == ENC_DICT {
        let mut n = 0;
        for f in fields {
            let p = dict::probe::<_, HashKind>(w, h.obj, st.hash(f), f);
            if let Some((e, link)) = p.found {
                let meta = w.u64(e + E_META);
                dict::unlink(w, h.obj, link, e)?;
                free_classed(w, e, meta)?;
                n += 1;
            }
        }
        return Ok((n, h));
    }
    let old = pack::body(w, h.obj).into_owned();
    let mut body = old.clone();
    let mut count = pack::count(w, h.obj) as usize;
    let mut n = 0;
    for f in fields {
        if let Some(p) = pack::find(&body, f, true, h.obj) {
            body.drain(p.start..p.end);
            count = count.saturating_sub(1);
            n += 1;
        }
    }
    if n == 0 {
        return Ok((0, h));
    }
    intact()?;
    let obj = pack::store(w, h.obj, &old, &body, count)?;
    Ok((n, HashObj { enc: ENC_PACK, obj }))
}

/// Blocks to free to drop this hash now.
pub fn blocks<M: Mem>(m: &M, h: HashObj) -> u64 {
    if h.enc == ENC_PACK {
        1
    } else {
        dict::len(m, h.obj) + 2
    }
}

/// Free the hash entirely (callers bound its size first: see `garbage`).
pub fn free_all(w: &mut Wtx, h: HashObj) -> Result<()> {
    if h.enc == ENC_PACK {
        pack::free(w, h.obj)
    } else {
        super::set::free_dict(w, h.obj)
    }
}
