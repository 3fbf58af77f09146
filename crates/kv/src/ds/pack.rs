//! Packs: small sets and hashes as one blob scanned linearly (Redis' listpack idea).
//!
//! ```text
//! 0  entries (u32)   4  bytes of the body (u32)   8  usable bytes of the block (u32)   12 pad
//! 16 body: entries, each one item (set member) or two (hash field, value); an item is a
//!    length (1 byte below 255, else 0xff + u32) and its bytes
//! ```
//!
//! A change is made on a DRAM copy of the body and written back as the byte range that
//! differs (a same-size HSET of one field writes just the value), or into a new block when it
//! outgrows the old one. Packs convert to dicts above [`MAX_ENTRIES`] entries or
//! [`MAX_BYTES`] bytes of body.

use super::{get_len, len_size, put_len, Mem, Wtx};
use crate::heap::{Off, Result};
use std::borrow::Cow;

/// Bytes of a pack header.
pub const PACK_HDR: u64 = 16;
/// Most entries of a pack (more: a dict).
pub const MAX_ENTRIES: usize = 128;
/// Most body bytes of a pack (more: a dict).
pub const MAX_BYTES: usize = 8192;

/// Whether a pack of `entries` entries and `bytes` body bytes stays a pack.
pub fn fits(entries: usize, bytes: usize) -> bool {
    entries <= MAX_ENTRIES && bytes <= MAX_BYTES
}

/// Entries of the pack at `p`.
#[inline]
pub fn count<M: Mem>(m: &M, p: Off) -> u64 {
    m.u32(p) as u64
}

/// The body of the pack at `p`.
pub fn body<M: Mem>(m: &M, p: Off) -> Cow<'_, [u8]> {
    let used = m.u32(p + 4) as usize;
    m.bytes(p + PACK_HDR, used)
}

/// The item at `b[i..]` and the index after it.
#[inline]
pub fn item(b: &[u8], i: usize) -> (&[u8], usize) {
    let (n, h) = get_len(b, i);
    (&b[i + h..i + h + n], i + h + n)
}

/// Append an item to a body.
#[inline]
pub fn put_item(body: &mut Vec<u8>, v: &[u8]) {
    put_len(body, v.len());
    body.extend_from_slice(v);
}

/// Encoded size of an item.
#[inline]
pub fn item_size(v: &[u8]) -> usize {
    len_size(v.len()) + v.len()
}

/// Where a key is in a body.
#[derive(Clone, Copy, Debug)]
pub struct Pos {
    /// Start of the entry.
    pub start: usize,
    /// End of the entry.
    pub end: usize,
    /// Start of the value item (hashes; `end` for sets).
    pub value: usize,
}

/// Find `key` among the entries of `body` (`pairs`: hash entries of field and value).
pub fn find(body: &[u8], key: &[u8], pairs: bool) -> Option<Pos> {
    let mut i = 0;
    while i < body.len() {
        let (k, j) = item(body, i);
        let end = if pairs { item(body, j).1 } else { j };
        if k == key {
            return Some(Pos {
                start: i,
                end,
                value: j,
            });
        }
        i = end;
    }
    None
}

/// Visit every entry: (key, value) — value empty for sets.
pub fn for_each<'a>(body: &'a [u8], pairs: bool, mut f: impl FnMut(&'a [u8], &'a [u8])) {
    let mut i = 0;
    while i < body.len() {
        let (k, j) = item(body, i);
        if pairs {
            let (v, e) = item(body, j);
            f(k, v);
            i = e;
        } else {
            f(k, &[]);
            i = j;
        }
    }
}

/// A new pack holding `body` (`count` entries).
pub fn create(w: &mut Wtx, body: &[u8], count: usize) -> Result<Off> {
    let (p, cap) = w.alloc(PACK_HDR + body.len() as u64)?;
    let mut buf = Vec::with_capacity(PACK_HDR as usize + body.len());
    buf.extend_from_slice(&(count as u32).to_le_bytes());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&(cap as u32).to_le_bytes());
    buf.extend_from_slice(&[0u8; 4]);
    buf.extend_from_slice(body);
    w.write(p, &buf)?;
    Ok(p)
}

/// Make the pack at `p` (body `old`, as read in this transaction) hold `new` with `count`
/// entries: in place, writing only what changed, if it fits its block; else in a new block
/// (the old one is freed). Returns the pack's (possibly new) offset.
pub fn store(w: &mut Wtx, p: Off, old: &[u8], new: &[u8], count: usize) -> Result<Off> {
    let cap = w.u32(p + 8) as u64;
    if PACK_HDR + new.len() as u64 > cap {
        let np = create(w, new, count)?;
        w.free(p, cap)?;
        return Ok(np);
    }
    let old_count = w.u32(p) as usize;
    if old_count != count || old.len() != new.len() {
        let mut h = [0u8; 8];
        h[0..4].copy_from_slice(&(count as u32).to_le_bytes());
        h[4..8].copy_from_slice(&(new.len() as u32).to_le_bytes());
        w.write(p, &h)?;
    }
    let cp = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let end = if old.len() == new.len() {
        new.len()
            - old[cp..]
                .iter()
                .rev()
                .zip(new[cp..].iter().rev())
                .take_while(|(a, b)| a == b)
                .count()
    } else {
        new.len()
    };
    if cp < end {
        w.write(p + PACK_HDR + cp as u64, &new[cp..end])?;
    }
    Ok(p)
}

/// Free the pack at `p`.
pub fn free(w: &mut Wtx, p: Off) -> Result<()> {
    let cap = w.u32(p + 8) as u64;
    w.free(p, cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_items() {
        let mut b = Vec::new();
        put_item(&mut b, b"f1");
        put_item(&mut b, b"v1");
        put_item(&mut b, &[7u8; 300]);
        put_item(&mut b, b"v2");
        let p = find(&b, &[7u8; 300], true).unwrap();
        assert_eq!(item(&b, p.value).0, b"v2");
        assert_eq!(p.end, b.len());
        assert!(find(&b, b"v1", true).is_none());
        assert!(find(&b, b"v1", false).is_some());
        let mut n = 0;
        for_each(&b, true, |_, _| n += 1);
        assert_eq!(n, 2);
    }
}
