//! Hash tables in the heap: chained buckets, grown by **linear hashing**.
//!
//! Why not Redis' two tables with incremental rehash: a second table of 2× buckets must be
//! allocated *and zeroed* in one transaction (for 16 M keys, 256 MiB of zeros through a 64 MiB
//! log), and every lookup during the rehash probes two tables. Linear hashing grows one bucket
//! at a time: each insert that takes the load factor above 1 splits the bucket at `split` into
//! itself and `split + B·2^level` (moving about one entry), so the table doubles gradually with
//! O(1) work per insert, never a big transaction, and one probe per lookup. Buckets live in
//! segments of doubling size (segment 0: buckets 0..B, segment k ≥ 1: buckets B·2^(k-1)..B·2^k),
//! whose offsets sit in the header: the table never moves, and a new segment needs no zeroing
//! because a bucket is written when the split that creates it runs, before anything reads it.
//! If the heap cannot hold a new segment, the table simply stops growing (longer chains, no
//! error). Tables do not shrink (a dict that empties is freed with its value).
//!
//! Header ([`DICT_HDR`] bytes): `0 count, 8 level, 16 split, 24 segment offsets [29]`.
//! Buckets: words holding the first entry's offset (0: empty).
//! Entries (allocated by the user of the dict, any layout after this prefix):
//! `0 next, 8 hash, 16 meta` where the low 32 bits of `meta` are the key's length and
//! [`Kind::key_at`] says where the key's bytes are.

use super::{damaged, has_damage, intact, walk_bound, Mem, Wtx};
use crate::heap::{HeapError, Off, Result};

/// Bytes of a dict header.
pub const DICT_HDR: u64 = 256;
const B_LOG: u32 = 4;
const B: u64 = 1 << B_LOG;
/// Segments of a table (up to B·2^28 = 2^32 buckets).
pub const MAX_SEGS: usize = 29;
const D_COUNT: u64 = 0;
const D_LEVEL: u64 = 8;
const D_SEGS: u64 = 24;

/// Offset of an entry's next link.
pub const E_NEXT: u64 = 0;
/// Offset of an entry's hash.
pub const E_HASH: u64 = 8;
/// Offset of an entry's meta word (low 32 bits: key length).
pub const E_META: u64 = 16;

/// Where an entry kind keeps its key.
pub trait Kind {
    /// Offset of the key's bytes from the entry, given its meta word.
    fn key_at(meta: u64) -> u64;
}

/// Write an empty dict header at `d` (with its first segment).
pub fn init(w: &mut Wtx, d: Off) -> Result<()> {
    let (seg0, _) = w.alloc(B * 8)?;
    w.write(seg0, &[0u8; (B * 8) as usize])?;
    let mut hdr = [0u8; DICT_HDR as usize];
    hdr[D_SEGS as usize..D_SEGS as usize + 8].copy_from_slice(&seg0.to_le_bytes());
    w.write(d, &hdr)
}

#[inline]
fn seg_of(i: u64) -> (u64, u64) {
    if i < B {
        (0, i)
    } else {
        let k = 64 - (i >> B_LOG).leading_zeros() as u64;
        (k, i - (B << (k - 1)))
    }
}

/// Buckets of segment `k`.
fn seg_buckets(k: u64) -> u64 {
    if k == 0 {
        B
    } else {
        B << (k - 1)
    }
}

#[inline]
fn bucket_of(h: u64, level: u64, split: u64) -> u64 {
    let i = h & ((B << level) - 1);
    if i < split {
        h & ((B << (level + 1)) - 1)
    } else {
        i
    }
}

/// Entries in the dict.
#[inline]
pub fn len<M: Mem>(m: &M, d: Off) -> u64 {
    m.u64(d + D_COUNT)
}

/// The table's (level, split), checked: a level past the last segment or a split past the
/// level's buckets is damage (recorded) and reads as an empty table's (0, 0).
#[inline]
fn geometry<M: Mem>(m: &M, d: Off) -> (u64, u64) {
    let level = m.u64(d + D_LEVEL);
    let split = m.u64(d + D_LEVEL + 8);
    if level + 1 >= MAX_SEGS as u64 || split >= B << level {
        damaged(d + D_LEVEL);
        return (0, 0);
    }
    (level, split)
}

/// Buckets of the table (entries live in buckets `0..nbuckets`).
pub fn nbuckets<M: Mem>(m: &M, d: Off) -> u64 {
    let (level, split) = geometry(m, d);
    (B << level) + split
}

/// Offset of bucket `i`'s word (0, recorded as damage, when its segment is missing).
#[inline]
pub fn slot<M: Mem>(m: &M, d: Off, i: u64) -> Off {
    let (k, j) = seg_of(i);
    if k >= MAX_SEGS as u64 {
        damaged(d + D_SEGS);
        return 0;
    }
    match m.link(d + D_SEGS + 8 * k) {
        0 => {
            damaged(d + D_SEGS + 8 * k);
            0
        }
        seg => seg + 8 * j,
    }
}

/// The result of looking a key up: where it is, or where it would go.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// The entry holding the key and the offset of the word that links to it (a bucket, or
    /// the previous entry's next field).
    pub found: Option<(Off, Off)>,
    /// The bucket the key hashes to.
    pub slot: Off,
    /// That bucket's first entry (the next link of a new entry inserted there).
    pub head: Off,
    /// The key's hash.
    pub hash: u64,
}

/// Look `key` (hash `h`) up. The chain walked is checked: each entry's hash must belong to
/// the bucket, an entry with the key's hash must hold the key (64-bit hashes do not collide),
/// and the chain must not be longer than the dict; anything else is recorded as damage and
/// ends the walk (the key reads as absent, and the command fails).
pub fn probe<M: Mem, K: Kind>(m: &M, d: Off, h: u64, key: &[u8]) -> Probe {
    let (level, split) = geometry(m, d);
    let bucket = bucket_of(h, level, split);
    let slot = slot(m, d, bucket);
    let head = if slot == 0 { 0 } else { m.link(slot) };
    let (mut link, mut e) = (slot, head);
    let mut steps = walk_bound(m, len(m, d));
    while e != 0 {
        let (next, eh, meta) = (m.link(e + E_NEXT), m.u64(e + E_HASH), m.u64(e + E_META));
        if steps == 0 || bucket_of(eh, level, split) != bucket {
            damaged(e);
            break;
        }
        steps -= 1;
        if eh == h {
            if meta as u32 as usize == key.len() && *m.bytes(e + K::key_at(meta), key.len()) == *key
            {
                return Probe {
                    found: Some((e, link)),
                    slot,
                    head,
                    hash: h,
                };
            }
            damaged(e);
            break;
        }
        link = e + E_NEXT;
        e = next;
    }
    Probe {
        found: None,
        slot,
        head,
        hash: h,
    }
}

/// Link `entry` (its key absent, its next field already written as `p.head`, its hash as
/// `p.hash`) into the bucket of probe `p` (taken with no dict change since), then grow the
/// table by one bucket if the load factor went above 1.
pub fn insert(w: &mut Wtx, d: Off, p: &Probe, entry: Off) -> Result<()> {
    insert_at(w, d, p.slot, entry)
}

/// [`insert`] by bucket word.
pub fn insert_at(w: &mut Wtx, d: Off, slot: Off, entry: Off) -> Result<()> {
    w.write_u64(slot, entry)?;
    let count = w.u64(d + D_COUNT) + 1;
    w.write_u64(d + D_COUNT, count)?;
    if count > nbuckets(w, d) {
        split_one(w, d)?;
    }
    Ok(())
}

/// Unlink `entry` whose link word is `link` (as found by [`probe`]); the caller frees it.
pub fn unlink(w: &mut Wtx, d: Off, link: Off, entry: Off) -> Result<()> {
    let next = w.u64(entry + E_NEXT);
    w.write_u64(link, next)?;
    let count = w.u64(d + D_COUNT).wrapping_sub(1);
    w.write_u64(d + D_COUNT, count)
}

/// Make `link` point to `new` instead of the entry it links to now (same key, same hash;
/// the caller wrote `new`'s next as the old entry's next and frees the old one).
pub fn replace(w: &mut Wtx, link: Off, new: Off) -> Result<()> {
    w.write_u64(link, new)
}

/// Split bucket `split`, moving the entries that belong to its new sibling.
fn split_one(w: &mut Wtx, d: Off) -> Result<()> {
    let (level, split) = geometry(w, d);
    intact()?;
    let k = level + 1;
    if k as usize >= MAX_SEGS {
        return Ok(());
    }
    if split == 0 && w.u64(d + D_SEGS + 8 * k) == 0 {
        // The new segment holds as many buckets as the table has now. No zeroing: each of its
        // buckets is written by the split that creates it.
        match w.alloc(seg_buckets(k) * 8) {
            Ok((seg, _)) => w.write_u64(d + D_SEGS + 8 * k, seg)?,
            Err(HeapError::OutOfMemory(_)) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    let old = split;
    let new = split + (B << level);
    let mask = (B << (level + 1)) - 1;
    let (so, sn) = (slot(w, d, old), slot(w, d, new));
    // (entry, its current next) in chain order, partitioned by the new hash bit (chains are
    // short: the load factor stays at most 1).
    let mut stay: smallvec::SmallVec<[(Off, Off); 8]> = smallvec::SmallVec::new();
    let mut go: smallvec::SmallVec<[(Off, Off); 8]> = smallvec::SmallVec::new();
    let first = w.link(so);
    let mut e = first;
    let mut steps = walk_bound(w, len(w, d));
    while e != 0 {
        let (next, h) = (w.link(e + E_NEXT), w.u64(e + E_HASH));
        if steps == 0 {
            damaged(e);
            break;
        }
        steps -= 1;
        if h & mask == new {
            go.push((e, next));
        } else {
            stay.push((e, next));
        }
        e = next;
    }
    intact()?;
    // Rewrite only the links whose value changes; the new bucket is always written.
    let want_o = stay.first().map_or(0, |x| x.0);
    if want_o != first {
        w.write_u64(so, want_o)?;
    }
    w.write_u64(sn, go.first().map_or(0, |x| x.0))?;
    for list in [&stay, &go] {
        for (i, &(e, next)) in list.iter().enumerate() {
            let want = list.get(i + 1).map_or(0, |x| x.0);
            if want != next {
                w.write_u64(e + E_NEXT, want)?;
            }
        }
    }
    let (nl, ns) = if split + 1 == B << level {
        (level + 1, 0)
    } else {
        (level, split + 1)
    };
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&nl.to_le_bytes());
    b[8..16].copy_from_slice(&ns.to_le_bytes());
    w.write(d + D_LEVEL, &b)
}

/// A cursor walk (SCAN and its collection forms): the entries of buckets `cursor..` until at
/// least `count` were met; returns the next cursor (0: done). Buckets of linear hashing only
/// ever split upward, so a full walk meets every entry present throughout (some maybe twice).
pub fn scan<M: Mem>(m: &M, d: Off, cursor: u64, count: u64, mut f: impl FnMut(Off)) -> u64 {
    let nb = nbuckets(m, d);
    let (mut b, mut seen) = (cursor, 0u64);
    while b < nb && seen < count {
        for_bucket(m, d, b, |e| {
            seen += 1;
            f(e);
            true
        });
        b += 1;
    }
    if b >= nb {
        0
    } else {
        b
    }
}

/// Visit the entries of bucket `i` (in chain order) until `f` returns false; returns false if
/// stopped (or if the chain is damaged: recorded, see [`probe`]).
pub fn for_bucket<M: Mem>(m: &M, d: Off, i: u64, mut f: impl FnMut(Off) -> bool) -> bool {
    let (level, split) = geometry(m, d);
    let s = slot(m, d, i);
    let mut e = if s == 0 { 0 } else { m.link(s) };
    let mut steps = walk_bound(m, len(m, d));
    while e != 0 {
        let next = m.link(e + E_NEXT);
        if steps == 0 || bucket_of(m.u64(e + E_HASH), level, split) != i {
            damaged(e);
            return false;
        }
        steps -= 1;
        if !f(e) {
            return false;
        }
        e = next;
    }
    true
}

/// Visit every entry until `f` returns false. A walk that finds another number of entries
/// than the dict's count is recorded as damage.
pub fn for_each<M: Mem>(m: &M, d: Off, mut f: impl FnMut(Off) -> bool) {
    let nb = nbuckets(m, d);
    let mut seen = 0u64;
    for i in 0..nb {
        let go = for_bucket(m, d, i, |e| {
            seen += 1;
            f(e)
        });
        if !go || has_damage() {
            return;
        }
    }
    if seen != len(m, d) {
        damaged(d);
    }
}

/// A random entry and its link word (`None` for an empty dict, or a damaged one: recorded):
/// a random non-empty bucket, then a random entry of its chain.
pub fn random<M: Mem>(m: &M, d: Off) -> Option<(Off, Off)> {
    let n = len(m, d);
    if n == 0 {
        return None;
    }
    let nb = nbuckets(m, d);
    let mut i = super::rand_u64() % nb;
    // Every bucket once after the random probes: a dict whose count says entries but whose
    // buckets are empty is damaged.
    for tries in 0..32 + nb {
        let s = slot(m, d, i);
        let head = if s == 0 { 0 } else { m.link(s) };
        if has_damage() {
            return None;
        }
        if head != 0 {
            let mut chain = vec![(head, s)];
            let mut e = head;
            let mut steps = walk_bound(m, n);
            loop {
                let nx = m.link(e + E_NEXT);
                if nx == 0 {
                    break;
                }
                if steps == 0 {
                    damaged(e);
                    return None;
                }
                steps -= 1;
                chain.push((nx, e + E_NEXT));
                e = nx;
            }
            // (`chain` holds the head at least: the index is in range.)
            return Some(chain[(super::rand_u64() % chain.len() as u64) as usize]);
        }
        // After a few random probes (a sparse table), walk on from there.
        i = if tries < 32 {
            super::rand_u64() % nb
        } else {
            (i + 1) % nb
        };
    }
    damaged(d);
    None
}

/// Free the table's segments (not its entries, not the header).
pub fn free_table(w: &mut Wtx, d: Off) -> Result<()> {
    for k in 0..MAX_SEGS as u64 {
        let seg = w.link(d + D_SEGS + 8 * k);
        if seg != 0 {
            w.free(seg, seg_buckets(k) * 8)?;
        }
    }
    Ok(())
}
