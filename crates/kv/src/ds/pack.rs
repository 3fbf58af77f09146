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

use super::{damaged, get_len, len_size, put_len, Mem, Wtx};
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

/// Entries of the pack at `p` (more than [`MAX_ENTRIES`]: damage, recorded, read as 0).
#[inline]
pub fn count<M: Mem>(m: &M, p: Off) -> u64 {
    let n = m.u32(p) as u64;
    if n > MAX_ENTRIES as u64 {
        damaged(p);
        return 0;
    }
    n
}

/// The body of the pack at `p`. A header that cannot be right (body larger than
/// [`MAX_BYTES`] or its block) is recorded as damage and read as an empty body.
pub fn body<M: Mem>(m: &M, p: Off) -> Cow<'_, [u8]> {
    let h = m.bytes(p + 4, 8);
    let (used, cap) = match (h.get(0..4), h.get(4..8)) {
        (Some(u), Some(c)) => (
            u32::from_le_bytes(u.try_into().unwrap_or([0; 4])) as u64,
            u32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as u64,
        ),
        _ => (0, 0),
    };
    if used > MAX_BYTES as u64 || PACK_HDR + used > cap {
        damaged(p);
        return Cow::Borrowed(&[]);
    }
    m.bytes(p + PACK_HDR, used as usize)
}

/// The item at `b[i..]` and the index after it; `None` (damage at `at`, the pack, recorded)
/// if it runs past the body.
#[inline]
pub fn item(b: &[u8], i: usize, at: Off) -> Option<(&[u8], usize)> {
    match get_len(b, i) {
        // (get_len checked that the `n` bytes after the prefix are inside `b`.)
        Some((n, h)) => Some((&b[i + h..i + h + n], i + h + n)),
        None => {
            damaged(at);
            None
        }
    }
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

/// Find `key` among the entries of `body` (`pairs`: hash entries of field and value) of the
/// pack at `at` (damage there is recorded and ends the search).
pub fn find(body: &[u8], key: &[u8], pairs: bool, at: Off) -> Option<Pos> {
    let mut i = 0;
    while i < body.len() {
        let (k, j) = item(body, i, at)?;
        let end = if pairs { item(body, j, at)?.1 } else { j };
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

/// Visit every entry: (key, value) — value empty for sets — of the body of the pack at `at`
/// holding `count` entries. A body that does not hold exactly `count` whole entries is
/// recorded as damage at `at` (the entries before the damage have been visited).
pub fn for_each<'a>(
    body: &'a [u8],
    pairs: bool,
    count: u64,
    at: Off,
    mut f: impl FnMut(&'a [u8], &'a [u8]),
) {
    let (mut i, mut n) = (0, 0u64);
    while i < body.len() {
        let Some((k, j)) = item(body, i, at) else {
            return;
        };
        if pairs {
            let Some((v, e)) = item(body, j, at) else {
                return;
            };
            f(k, v);
            i = e;
        } else {
            f(k, &[]);
            i = j;
        }
        n += 1;
    }
    if n != count {
        damaged(at);
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
        let p = find(&b, &[7u8; 300], true, 4096).unwrap();
        assert_eq!(item(&b, p.value, 4096).unwrap().0, b"v2");
        assert_eq!(p.end, b.len());
        assert!(find(&b, b"v1", true, 4096).is_none());
        assert!(find(&b, b"v1", false, 4096).is_some());
        let mut n = 0;
        for_each(&b, true, 2, 4096, |_, _| n += 1);
        assert_eq!(n, 2);
        assert!(!super::super::has_damage());
        // A truncated body: the search stops and the damage is recorded at the pack.
        assert!(find(&b[..b.len() - 1], b"zz", true, 4096).is_none());
        assert_eq!(super::super::take_damage(), Some(4096));
    }
}
