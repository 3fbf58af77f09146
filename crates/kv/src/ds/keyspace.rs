//! The keyspace: a dict of typed entries; string values live inline in their entry.
//!
//! Entry (one block):
//!
//! ```text
//! 0   next (dict chain)          8   hash of the key
//! 16  meta: key length (u32) | type << 32 | encoding << 40 | size class of this block << 48
//!     | F_VOLATILE (bit 56: the key has a deadline, see `expire`)
//! 24  value word: inline string → its length; otherwise the value object's offset
//! 32  key bytes, then (inline string) the value bytes
//! ```
//!
//! A string is inline when its entry fits a small block (≤ 64 KiB); larger ones are a blob
//! object (`0 length, 8 capacity, 16 bytes`). A SET of a value that fits the entry's block
//! rewrites it in place (one write); otherwise a new entry replaces the old one in its chain.

use super::dict::{self, Kind, Probe, E_META, E_NEXT};
use super::expire::{self, F_VOLATILE};
use super::{class_of, class_size, damaged, garbage, Mem, OpError, Store, Wtx, CLASS_LARGE};
use crate::heap::{Off, Result};
use std::borrow::Cow;
use tiermem_vnvm::alloc::{HEAP_HEADER, MAX_SMALL, SMALL_CLASSES};

/// String type.
pub const T_STRING: u8 = 0;
/// List type.
pub const T_LIST: u8 = 1;
/// Set type.
pub const T_SET: u8 = 2;
/// Hash type.
pub const T_HASH: u8 = 3;
/// Sorted set type.
pub const T_ZSET: u8 = 4;

/// String stored in the entry.
pub const ENC_INLINE: u8 = 0;
/// String stored in a blob object.
pub const ENC_BLOB: u8 = 1;
/// Set or hash stored as one pack (`pack`).
pub const ENC_PACK: u8 = 0;
/// Set or hash stored as a dict.
pub const ENC_DICT: u8 = 1;
/// List (quicklist) and zset (skiplist): their only encoding.
pub const ENC_DEFAULT: u8 = 0;

const KS_VAL: u64 = 24;
const KS_KEY: u64 = 32;
const BLOB_HDR: u64 = 16;

/// Keyspace entries keep their key at offset 32.
pub struct KsKind;

impl Kind for KsKind {
    #[inline]
    fn key_at(_meta: u64) -> u64 {
        KS_KEY
    }
}

/// The Redis name of a type (TYPE's reply).
pub fn type_name(t: u8) -> &'static str {
    match t {
        T_STRING => "string",
        T_LIST => "list",
        T_SET => "set",
        T_HASH => "hash",
        T_ZSET => "zset",
        _ => "unknown",
    }
}

/// A key found in the keyspace.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// The entry's offset.
    pub off: Off,
    /// The word that links to it (valid until the keyspace changes).
    pub link: Off,
    /// Its meta word.
    pub meta: u64,
    /// Its value word.
    pub val: u64,
}

impl Entry {
    /// The value's type.
    #[inline]
    pub fn ty(&self) -> u8 {
        (self.meta >> 32) as u8
    }
    /// The value's encoding.
    #[inline]
    pub fn enc(&self) -> u8 {
        (self.meta >> 40) as u8
    }
    /// Key length.
    #[inline]
    pub fn klen(&self) -> usize {
        self.meta as u32 as usize
    }
    /// Whether the key has a deadline (see `expire`).
    #[inline]
    pub fn volatile(&self) -> bool {
        self.meta & F_VOLATILE != 0
    }
    /// Size class of the entry's block.
    #[inline]
    pub fn class(&self) -> u8 {
        (self.meta >> 48) as u8
    }
    /// The entry's value object (for non-inline values).
    #[inline]
    pub fn obj(&self) -> Off {
        self.val
    }
    /// This entry as it would read with value object `obj` in encoding `enc` (nothing written;
    /// e.g. to delete a key whose value object just moved).
    pub fn with_obj(&self, enc: u8, obj: Off) -> Entry {
        Entry {
            meta: (self.meta & !(0xff << 40)) | (enc as u64) << 40,
            val: obj,
            ..*self
        }
    }

    /// `Err(WrongType)` unless the value has type `t`.
    #[inline]
    pub fn expect(&self, t: u8) -> std::result::Result<(), OpError> {
        if self.ty() == t {
            Ok(())
        } else {
            Err(OpError::WrongType)
        }
    }
}

fn meta(klen: usize, ty: u8, enc: u8, class: u8) -> u64 {
    klen as u64 | (ty as u64) << 32 | (enc as u64) << 40 | (class as u64) << 48
}

/// The entry at `off`, checked: a known type and encoding, an inline string inside its
/// block, a value object inside the heap. An entry that fails is recorded as damage (its
/// reader's command fails; see `crate::ds::Mem`).
fn entry_of<M: Mem>(m: &M, off: Off, link: Off) -> Entry {
    let e = Entry {
        off,
        link,
        meta: m.u64(off + E_META),
        val: m.u64(off + KS_VAL),
    };
    let ok = match (e.ty(), e.enc()) {
        (T_STRING, ENC_INLINE) => {
            class_size(e.class()).is_some_and(|cap| KS_KEY + e.klen() as u64 + e.val <= cap)
        }
        (T_STRING, ENC_BLOB) | (T_SET | T_HASH, ENC_PACK | ENC_DICT) | (T_LIST | T_ZSET, 0) => {
            e.val >= HEAP_HEADER && e.val < m.heap_len() && e.val % 8 == 0
        }
        _ => false,
    };
    if !ok || (e.class() != CLASS_LARGE && e.class() as usize >= SMALL_CLASSES) {
        damaged(off);
    }
    e
}

/// Look `key` up (readers and writers). A key whose deadline has passed at this command's
/// time reads as absent.
pub fn lookup<M: Mem>(m: &M, st: &Store, key: &[u8]) -> Option<Entry> {
    probe(m, st, key).1
}

/// Look `key` up, keeping where it would be inserted. An expired key reads as absent (`None`)
/// while `Probe::found` still holds its entry: [`insert_string`] and [`insert_object`] delete
/// it before they insert.
pub fn probe<M: Mem>(m: &M, st: &Store, key: &[u8]) -> (Probe, Option<Entry>) {
    let (p, e) = probe_raw(m, st, key);
    let e = e.filter(|e| !expire::expired_hashed(m, st, e, p.hash));
    (p, e)
}

/// Look `key` up whether or not it has expired.
pub fn probe_raw<M: Mem>(m: &M, st: &Store, key: &[u8]) -> (Probe, Option<Entry>) {
    let p = dict::probe::<M, KsKind>(m, st.keyspace(), st.hash(key), key);
    let e = p.found.map(|(off, link)| entry_of(m, off, link));
    (p, e)
}

/// The entry at `off`, linked from `link` (from a probe's `found`).
pub fn entry_linked<M: Mem>(m: &M, off: Off, link: Off) -> Entry {
    entry_of(m, off, link)
}

/// The probe `p` of `key` with its entry gone: an expired key still in the keyspace is
/// deleted first (and `key` probed again).
fn vacate(w: &mut Wtx, st: &Store, p: &Probe, key: &[u8]) -> Result<Probe> {
    match p.found {
        None => Ok(*p),
        Some((off, link)) => {
            let e = entry_of(w, off, link);
            delete(w, st, &e)?;
            Ok(probe_raw(w, st, key).0)
        }
    }
}

/// Number of keys.
pub fn len<M: Mem>(m: &M, st: &Store) -> u64 {
    dict::len(m, st.keyspace())
}

/// The key of the entry at `off`.
pub fn key_of<'a, M: Mem>(m: &'a M, off: Off) -> Cow<'a, [u8]> {
    let klen = m.u64(off + E_META) as u32 as usize;
    m.bytes(off + KS_KEY, klen)
}

/// The entry at `off` (for iteration; its link is not known: 0).
pub fn entry_at<M: Mem>(m: &M, off: Off) -> Entry {
    entry_of(m, off, 0)
}

/// The string value of `e` (a string entry).
pub fn string_value<'a, M: Mem>(m: &'a M, e: &Entry) -> Cow<'a, [u8]> {
    if e.enc() == ENC_INLINE {
        m.bytes(e.off + KS_KEY + e.klen() as u64, e.val as usize)
    } else {
        m.bytes(e.val + BLOB_HDR, blob_len(m, e.val) as usize)
    }
}

/// Bytes `at..at + n` of the string value of `e`, clamped to its length.
pub fn string_range<'a, M: Mem>(m: &'a M, e: &Entry, at: u64, n: u64) -> Cow<'a, [u8]> {
    let len = string_len(m, e);
    let at = at.min(len);
    let n = n.min(len - at);
    if e.enc() == ENC_INLINE {
        m.bytes(e.off + KS_KEY + e.klen() as u64 + at, n as usize)
    } else {
        m.bytes(e.val + BLOB_HDR + at, n as usize)
    }
}

/// Overwrites bytes of the string value of `e` from `at` in place; `at + bytes.len()` must be
/// within its length (what SETBIT does to a bit it does not grow the string for).
pub fn string_overwrite(w: &mut Wtx, e: &Entry, at: u64, bytes: &[u8]) -> Result<()> {
    let len = string_len(w, e);
    if at + bytes.len() as u64 > len {
        return Err(crate::heap::HeapError::Damaged(e.off));
    }
    if e.enc() == ENC_INLINE {
        w.write(e.off + KS_KEY + e.klen() as u64 + at, bytes)
    } else {
        w.write(e.val + BLOB_HDR + at, bytes)
    }
}

/// Length of the blob at `b`, checked against its capacity (damage, recorded, reads as 0).
fn blob_len<M: Mem>(m: &M, b: Off) -> u64 {
    let (len, cap) = (m.u64(b), m.u64(b + 8));
    if len.checked_add(BLOB_HDR).map_or(true, |n| n > cap) || cap > m.heap_len() {
        damaged(b);
        return 0;
    }
    len
}

/// Length of the string value of `e`.
pub fn string_len<M: Mem>(m: &M, e: &Entry) -> u64 {
    if e.enc() == ENC_INLINE {
        e.val
    } else {
        blob_len(m, e.val)
    }
}

/// Usable bytes of the entry's block.
fn entry_cap(w: &mut Wtx, e: &Entry) -> Result<u64> {
    match class_size(e.class()) {
        Some(c) => Ok(c),
        None => w.usable_size(e.off),
    }
}

/// Write a new entry for `key` with next link `next` and hash `h`: an inline string value
/// (`Some`), or a typed value object. Returns its offset.
#[allow(clippy::too_many_arguments)]
fn new_entry(
    w: &mut Wtx,
    next: Off,
    h: u64,
    key: &[u8],
    ty: u8,
    enc: u8,
    val: u64,
    inline: Option<&[u8]>,
) -> Result<Off> {
    let size = KS_KEY + key.len() as u64 + inline.map_or(0, |v| v.len() as u64);
    let (off, cap) = w.alloc(size)?;
    let mut buf = Vec::with_capacity(size as usize);
    buf.extend_from_slice(&next.to_le_bytes());
    buf.extend_from_slice(&h.to_le_bytes());
    buf.extend_from_slice(&meta(key.len(), ty, enc, class_of(cap)).to_le_bytes());
    buf.extend_from_slice(&val.to_le_bytes());
    buf.extend_from_slice(key);
    if let Some(v) = inline {
        buf.extend_from_slice(v);
    }
    w.write(off, &buf)?;
    Ok(off)
}

/// A blob object holding `v`.
fn new_blob(w: &mut Wtx, v: &[u8]) -> Result<Off> {
    let (off, cap) = w.alloc(BLOB_HDR + v.len() as u64)?;
    let mut buf = Vec::with_capacity(BLOB_HDR as usize + v.len());
    buf.extend_from_slice(&(v.len() as u64).to_le_bytes());
    buf.extend_from_slice(&cap.to_le_bytes());
    buf.extend_from_slice(v);
    w.write(off, &buf)?;
    Ok(off)
}

fn inline_fits(klen: usize, vlen: usize) -> bool {
    KS_KEY + klen as u64 + vlen as u64 <= MAX_SMALL
}

/// A new string entry (not yet linked) with next link `next`.
fn new_string(w: &mut Wtx, next: Off, h: u64, key: &[u8], value: &[u8]) -> Result<Off> {
    if inline_fits(key.len(), value.len()) {
        new_entry(
            w,
            next,
            h,
            key,
            T_STRING,
            ENC_INLINE,
            value.len() as u64,
            Some(value),
        )
    } else {
        let blob = new_blob(w, value)?;
        new_entry(w, next, h, key, T_STRING, ENC_BLOB, blob, None)
    }
}

/// Add `key` (absent: `p` from [`probe`] with no keyspace change since) with string `value`.
pub fn insert_string(w: &mut Wtx, st: &Store, p: &Probe, key: &[u8], value: &[u8]) -> Result<()> {
    let p = &vacate(w, st, p, key)?;
    let e = new_string(w, p.head, p.hash, key, value)?;
    dict::insert(w, st.keyspace(), p, e)
}

/// Add `key` (absent: `p` as for [`insert_string`]) holding value object `obj`.
pub fn insert_object(
    w: &mut Wtx,
    st: &Store,
    p: &Probe,
    key: &[u8],
    ty: u8,
    enc: u8,
    obj: Off,
) -> Result<()> {
    let p = &vacate(w, st, p, key)?;
    let e = new_entry(w, p.head, p.hash, key, ty, enc, obj, None)?;
    dict::insert(w, st.keyspace(), p, e)
}

/// Make the existing key of `e` hold string `value` (whatever it held before); its deadline,
/// if any, stays (SET without KEEPTTL removes it itself).
pub fn set_string(w: &mut Wtx, st: &Store, e: &Entry, value: &[u8]) -> Result<()> {
    let klen = e.klen();
    if e.ty() == T_STRING && e.enc() == ENC_INLINE && inline_fits(klen, value.len()) {
        let cap = entry_cap(w, e)?;
        if KS_KEY + (klen + value.len()) as u64 <= cap {
            // In place: the length word, the key (unchanged), the value, in one write, built
            // on the stack (two heap allocations here were a tenth of a SET's malloc time).
            let mut buf = smallvec::SmallVec::<[u8; 256]>::new();
            buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
            buf.extend_from_slice(&w.bytes(e.off + KS_KEY, klen));
            buf.extend_from_slice(value);
            return w.write(e.off + KS_VAL, &buf);
        }
    }
    if e.ty() == T_STRING && e.enc() == ENC_BLOB && !inline_fits(klen, value.len()) {
        // Reuse the blob when the value fits and does not waste more than half of it.
        let cap = w.u64(e.val + 8);
        if BLOB_HDR + value.len() as u64 <= cap && 2 * (BLOB_HDR + value.len() as u64) >= cap {
            w.write_u64(e.val, value.len() as u64)?;
            return w.write(e.val + BLOB_HDR, value);
        }
    }
    // A new entry in the old one's place.
    let key = w.bytes(e.off + KS_KEY, klen).into_owned();
    let h = w.u64(e.off + 8);
    let next = w.u64(e.off + E_NEXT);
    let new = new_string(w, next, h, &key, value)?;
    if e.volatile() {
        // The deadline is the key's, not the block's: the new entry keeps it.
        let m = w.u64(new + E_META);
        w.write_u64(new + E_META, m | F_VOLATILE)?;
    }
    dict::replace(w, e.link, new)?;
    drop_entry_value(w, st, e)?;
    free_entry(w, e)
}

/// Set the value word (and type/encoding) of the existing entry `e` (its deadline stays).
pub fn set_value(w: &mut Wtx, e: &Entry, ty: u8, enc: u8, val: u64) -> Result<()> {
    let m = meta(e.klen(), ty, enc, e.class()) | (e.meta & F_VOLATILE);
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&m.to_le_bytes());
    b[8..16].copy_from_slice(&val.to_le_bytes());
    w.write(e.off + E_META, &b)
}

/// Delete the key of `e` (found with no keyspace change since): unlink it, remove its
/// deadline, drop its value (freed now if small, else put on the garbage list), free the entry.
pub fn delete(w: &mut Wtx, st: &Store, e: &Entry) -> Result<()> {
    expire::remove(w, st, e, false)?;
    dict::unlink(w, st.keyspace(), e.link, e.off)?;
    drop_entry_value(w, st, e)?;
    free_entry(w, e)
}

/// Drop the value object of entry `e` (nothing for an inline string).
pub fn drop_entry_value(w: &mut Wtx, st: &Store, e: &Entry) -> Result<()> {
    if e.ty() == T_STRING && e.enc() == ENC_INLINE {
        return Ok(());
    }
    garbage::drop_value(w, st, e.ty(), e.enc(), e.val)
}

/// Free the block of a dict entry whose meta word keeps its size class in bits 48..56.
pub fn free_entry(w: &mut Wtx, e: &Entry) -> Result<()> {
    free_classed(w, e.off, e.meta)
}

/// Free the block at `off` whose meta word keeps its size class in bits 48..56.
pub fn free_classed(w: &mut Wtx, off: Off, meta: u64) -> Result<()> {
    let class = (meta >> 48) as u8;
    if class != CLASS_LARGE && class as usize >= SMALL_CLASSES {
        return Err(crate::heap::HeapError::Damaged(off));
    }
    let cap = class_size(class).unwrap_or(MAX_SMALL + 1);
    w.free(off, cap)
}

/// Free a blob object.
pub fn free_blob(w: &mut Wtx, blob: Off) -> Result<()> {
    let cap = w.u64(blob + 8);
    w.free(blob, cap)
}
