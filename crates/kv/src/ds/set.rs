//! Sets: a pack of members while small, a dict of member entries above that.
//!
//! Dict entry: `0 next, 8 hash, 16 meta (member length | size class << 48), 24 member`.
//! The dict's header is its own block ([`DICT_HDR`](super::dict::DICT_HDR) bytes), which is
//! the set's value object in the dict encoding.

use super::dict::{self, Kind};
use super::keyspace::{free_classed, ENC_DICT, ENC_PACK};
use super::{class_of, intact, pack, Mem, Store, Wtx};
use crate::heap::{HeapError, Off, Result};
use std::borrow::Cow;

const S_KEY: u64 = 24;

/// Set entries keep their member at offset 24.
pub struct SetKind;

impl Kind for SetKind {
    #[inline]
    fn key_at(_meta: u64) -> u64 {
        S_KEY
    }
}

/// A set value: its encoding and object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetObj {
    /// [`ENC_PACK`] or [`ENC_DICT`].
    pub enc: u8,
    /// The pack, or the dict header.
    pub obj: Off,
}

/// Members of the set.
pub fn card<M: Mem>(m: &M, s: SetObj) -> u64 {
    if s.enc == ENC_PACK {
        pack::count(m, s.obj)
    } else {
        dict::len(m, s.obj)
    }
}

/// Whether `member` is in the set.
pub fn contains<M: Mem>(m: &M, st: &Store, s: SetObj, member: &[u8]) -> bool {
    if s.enc == ENC_PACK {
        pack::find(&pack::body(m, s.obj), member, false, s.obj).is_some()
    } else {
        dict::probe::<M, SetKind>(m, s.obj, st.hash(member), member)
            .found
            .is_some()
    }
}

fn member_of<M: Mem>(m: &M, e: Off) -> Cow<'_, [u8]> {
    let len = m.u64(e + dict::E_META) as u32 as usize;
    m.bytes(e + S_KEY, len)
}

/// Visit every member.
pub fn for_each<M: Mem>(m: &M, s: SetObj, mut f: impl FnMut(&[u8])) {
    if s.enc == ENC_PACK {
        let n = pack::count(m, s.obj);
        pack::for_each(&pack::body(m, s.obj), false, n, s.obj, |k, _| f(k));
    } else {
        dict::for_each(m, s.obj, |e| {
            f(&member_of(m, e));
            true
        });
    }
}

/// SSCAN's walk: the members of dict buckets `cursor..` until at least `count` were seen;
/// returns the next cursor (0: done). A packed set is one step: everything, cursor 0. Buckets
/// of the linear-hashing dict only ever split upward, so a full walk meets every member present
/// throughout (maybe some twice), as Redis's SSCAN promises.
pub fn scan<M: Mem>(m: &M, s: SetObj, cursor: u64, count: u64, mut f: impl FnMut(&[u8])) -> u64 {
    if s.enc == ENC_PACK {
        for_each(m, s, f);
        return 0;
    }
    dict::scan(m, s.obj, cursor, count, |e| f(&member_of(m, e)))
}

fn new_entry(w: &mut Wtx, next: Off, h: u64, member: &[u8]) -> Result<Off> {
    let size = S_KEY + member.len() as u64;
    let (e, cap) = w.alloc(size)?;
    let mut buf = Vec::with_capacity(size as usize);
    buf.extend_from_slice(&next.to_le_bytes());
    buf.extend_from_slice(&h.to_le_bytes());
    buf.extend_from_slice(&(member.len() as u64 | (class_of(cap) as u64) << 48).to_le_bytes());
    buf.extend_from_slice(member);
    w.write(e, &buf)?;
    Ok(e)
}

/// Add to dict `d`; true if new.
fn dict_add(w: &mut Wtx, st: &Store, d: Off, member: &[u8]) -> Result<bool> {
    let p = dict::probe::<_, SetKind>(w, d, st.hash(member), member);
    if p.found.is_some() {
        return Ok(false);
    }
    let e = new_entry(w, p.head, p.hash, member)?;
    dict::insert(w, d, &p, e)?;
    Ok(true)
}

/// A new dict holding `members` (distinct).
fn dict_from(w: &mut Wtx, st: &Store, members: &[&[u8]]) -> Result<Off> {
    let (d, _) = w.alloc(dict::DICT_HDR)?;
    dict::init(w, d)?;
    for m in members {
        dict_add(w, st, d, m)?;
    }
    Ok(d)
}

/// Add `members` to set `s` (`None`: a new set). Returns the number added and the set's
/// (possibly changed) encoding and object; the caller stores them in the keyspace entry.
pub fn add(w: &mut Wtx, st: &Store, s: Option<SetObj>, members: &[&[u8]]) -> Result<(u64, SetObj)> {
    match s {
        Some(s) if s.enc == ENC_DICT => {
            let mut added = 0;
            for m in members {
                added += dict_add(w, st, s.obj, m)? as u64;
            }
            Ok((added, s))
        }
        _ => {
            let old: Vec<u8> = match s {
                Some(s) => pack::body(w, s.obj).into_owned(),
                None => Vec::new(),
            };
            let mut count = s.map_or(0, |s| pack::count(w, s.obj) as usize);
            let at = s.map_or(0, |s| s.obj);
            let mut body = old.clone();
            let mut added = 0;
            for m in members {
                if pack::find(&body, m, false, at).is_none() {
                    pack::put_item(&mut body, m);
                    count += 1;
                    added += 1;
                }
            }
            intact()?;
            if pack::fits(count, body.len()) {
                let obj = match s {
                    Some(s) => pack::store(w, s.obj, &old, &body, count)?,
                    None => pack::create(w, &body, count)?,
                };
                return Ok((added, SetObj { enc: ENC_PACK, obj }));
            }
            intact()?;
            let mut all: Vec<&[u8]> = Vec::with_capacity(count);
            pack::for_each(&body, false, count as u64, at, |k, _| all.push(k));
            intact()?;
            let d = dict_from(w, st, &all)?;
            if let Some(s) = s {
                pack::free(w, s.obj)?;
            }
            Ok((
                added,
                SetObj {
                    enc: ENC_DICT,
                    obj: d,
                },
            ))
        }
    }
}

/// Remove `members`; returns the number removed and the set (its object may change). An
/// empty set is left for the caller to delete.
pub fn remove(w: &mut Wtx, st: &Store, s: SetObj, members: &[&[u8]]) -> Result<(u64, SetObj)> {
    if s.enc == ENC_DICT {
        let mut removed = 0;
        for m in members {
            let p = dict::probe::<_, SetKind>(w, s.obj, st.hash(m), m);
            if let Some((e, link)) = p.found {
                let meta = w.u64(e + dict::E_META);
                dict::unlink(w, s.obj, link, e)?;
                free_classed(w, e, meta)?;
                removed += 1;
            }
        }
        return Ok((removed, s));
    }
    let old = pack::body(w, s.obj).into_owned();
    let mut body = old.clone();
    let mut count = pack::count(w, s.obj) as usize;
    let mut removed = 0;
    for m in members {
        if let Some(p) = pack::find(&body, m, false, s.obj) {
            body.drain(p.start..p.end);
            count = count.saturating_sub(1);
            removed += 1;
        }
    }
    if removed == 0 {
        return Ok((0, s));
    }
    intact()?;
    let obj = pack::store(w, s.obj, &old, &body, count)?;
    Ok((removed, SetObj { enc: ENC_PACK, obj }))
}

/// Remove and return up to `count` random members.
pub fn pop(w: &mut Wtx, st: &Store, s: SetObj, count: usize) -> Result<(Vec<Vec<u8>>, SetObj)> {
    let mut out = Vec::new();
    if s.enc == ENC_DICT {
        while out.len() < count {
            let Some((e, link)) = dict::random(w, s.obj) else {
                break;
            };
            out.push(member_of(w, e).into_owned());
            let meta = w.u64(e + dict::E_META);
            dict::unlink(w, s.obj, link, e)?;
            free_classed(w, e, meta)?;
        }
        let _ = st;
        return Ok((out, s));
    }
    let old = pack::body(w, s.obj).into_owned();
    let mut body = old.clone();
    let mut n = pack::count(w, s.obj) as usize;
    while out.len() < count && n > 0 {
        let k = (super::rand_u64() % n as u64) as usize;
        let mut i = 0;
        for _ in 0..k {
            i = pack::item(&body, i, s.obj)
                .ok_or(HeapError::Damaged(s.obj))?
                .1;
        }
        let (v, end) = pack::item(&body, i, s.obj).ok_or(HeapError::Damaged(s.obj))?;
        out.push(v.to_vec());
        body.drain(i..end);
        n -= 1;
    }
    intact()?;
    let obj = pack::store(w, s.obj, &old, &body, n)?;
    Ok((out, SetObj { enc: ENC_PACK, obj }))
}

/// Blocks to free to drop this set now (pack: 1; dict: entries + segments + header).
pub fn blocks<M: Mem>(m: &M, s: SetObj) -> u64 {
    if s.enc == ENC_PACK {
        1
    } else {
        dict::len(m, s.obj) + 2
    }
}

/// Free the set entirely (callers bound its size first: see `garbage`).
pub fn free_all(w: &mut Wtx, s: SetObj) -> Result<()> {
    if s.enc == ENC_PACK {
        return pack::free(w, s.obj);
    }
    free_dict(w, s.obj)
}

/// Free a dict of plain entries (class in meta), its table and its header block.
pub fn free_dict(w: &mut Wtx, d: Off) -> Result<()> {
    let mut entries = Vec::new();
    dict::for_each(w, d, |e| {
        entries.push(e);
        true
    });
    for e in entries {
        let meta = w.u64(e + dict::E_META);
        free_classed(w, e, meta)?;
    }
    dict::free_table(w, d)?;
    w.free(d, dict::DICT_HDR)
}
