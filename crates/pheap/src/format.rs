//! On-NVM format of the checkpoint space (inside the data area of a `media::Pool`).
//!
//! ```text
//! data offset  0      heap header, copy A (256 B used of 4 KiB)
//!              4 KiB  heap header, copy B
//!              8 KiB  metadata area 0   (meta_size bytes)
//!                     metadata area 1   (meta_size bytes)
//!                     redo log          (log_size bytes)
//!                     checkpoint image  (capacity bytes: the heap as of the last checkpoint)
//! ```
//!
//! * **Header**: two copies; a write goes to the copy not holding the newest valid header, so a
//!   torn header write leaves the other one intact. The valid copy with the highest `seq` wins.
//!   Each carries a CRC-32 over its first 252 bytes.
//! * **Metadata**: an append-only journal of [`MetaRec`]s in the active area; the header commits
//!   its length and CRC. When the journal would overflow, a full snapshot of the object table is
//!   written to the other area and the header switches to it (same commit).
//! * **Redo log**: records `[off u64][len u64][bytes]` of the objects copied by one checkpoint.
//!   The header commits its length and CRC; then the records are applied to the image and a
//!   second header write marks the log empty (also when the log is empty, so that after a
//!   complete checkpoint both header copies describe it). Recovery replays a committed,
//!   non-empty log.
//! * **Image checksums**: every *part* a checkpoint copies into, or whose objects changed, gets
//!   a `Crc` record in the journal: the CRC-32 of the part's live bytes (its objects' bytes in
//!   that part, in offset order; see [`live_in_part`]). A part is what one user view's page
//!   tracks: `4096 / views` bytes ([`crc_unit`]; a whole page with one view). `open` and
//!   `inspect` verify the image against them, so a damaged image is refused rather than served.
//!   (Version 3 had one per page: a checkpoint that copied the written half of a page had to
//!   read the other half back from the image to checksum the page. Version 2 had a record per
//!   object; a checkpoint of 100 k small objects wrote 1.7 MB of them.)

use crate::alloc::{MetaRec, Obj, PAGE};
use std::collections::BTreeMap;

/// Magic of the heap header.
pub const HEAP_MAGIC: [u8; 8] = *b"TMPHEAP1";
/// Format version. 5: objects of the medium classes (slots of 4608 to 7168 bytes packed across
/// pages, `crate::alloc::CLASSES`). 4 added a CRC-32 of the live bytes of each checkpointed
/// part of a page ([`MetaRec::Crc`], [`crc_unit`]). Heaps of version 4 (which a version-4
/// library would misread once they hold medium objects), 3 (one CRC per page), 2 (a CRC per
/// object chunk) and 1 are refused (`VersionMismatch`).
pub const HEAP_VERSION: u32 = 5;

/// Bytes covered by one image checksum in a heap of `views` user views: the part of a page one
/// user view tracks (`4096 / views`; a page with one view).
pub fn crc_unit(views: usize) -> usize {
    PAGE / views.clamp(1, MAX_VIEWS)
}
/// Bytes of a header covered by its CRC (the CRC sits right after them).
pub const HDR_CRC_AT: usize = 252;
/// Maximum number of user views.
pub const MAX_VIEWS: usize = 8;
/// Data offset of the first metadata area.
pub const META0: usize = 2 * PAGE;

/// Decoded heap header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Format version.
    pub version: u32,
    /// Number of user views.
    pub views: u32,
    /// Heap capacity in bytes.
    pub capacity: u64,
    /// Superblock size in bytes.
    pub sb_size: u64,
    /// Address of the library view.
    pub lib_base: u64,
    /// Addresses of the user views (unused entries 0).
    pub view_base: [u64; MAX_VIEWS],
    /// Header write counter (the newest valid copy wins).
    pub seq: u64,
    /// Number of complete checkpoints.
    pub epoch: u64,
    /// Committed redo-log length (0: nothing to replay).
    pub log_len: u64,
    /// CRC-32 of the committed redo log.
    pub log_crc: u32,
    /// Active metadata area (0 or 1).
    pub meta_active: u32,
    /// Committed length of the active metadata journal.
    pub meta_len: u64,
    /// CRC-32 of the committed metadata journal.
    pub meta_crc: u32,
    /// Size of each metadata area.
    pub meta_size: u64,
    /// Size of the redo log area.
    pub log_size: u64,
}

impl Header {
    /// Encodes into 256 bytes with magic and CRC.
    pub fn encode(&self) -> [u8; 256] {
        let mut b = [0u8; 256];
        let mut w = Writer(&mut b, 0);
        w.bytes(&HEAP_MAGIC);
        w.u32(self.version);
        w.u32(self.views);
        w.u64(self.capacity);
        w.u64(self.sb_size);
        w.u64(self.lib_base);
        for v in self.view_base {
            w.u64(v);
        }
        w.u64(self.seq);
        w.u64(self.epoch);
        w.u64(self.log_len);
        w.u32(self.log_crc);
        w.u32(self.meta_active);
        w.u64(self.meta_len);
        w.u32(self.meta_crc);
        w.u32(0);
        w.u64(self.meta_size);
        w.u64(self.log_size);
        let crc = crc32fast::hash(&b[..HDR_CRC_AT]);
        b[HDR_CRC_AT..HDR_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one header copy: `Err` says why it is not a valid header (magic, CRC). The
    /// version is returned as decoded; the caller compares it.
    pub fn decode(b: &[u8]) -> Result<Header, String> {
        if b.len() < 256 {
            return Err("header truncated".into());
        }
        if b[..8] != HEAP_MAGIC {
            return Err("bad magic (not a tiermem persistent heap)".into());
        }
        // b.len() >= 256 (checked above), so the 4-byte CRC slice exists and converts.
        let crc = u32::from_le_bytes(b[HDR_CRC_AT..HDR_CRC_AT + 4].try_into().unwrap_or([0; 4]));
        if crc != crc32fast::hash(&b[..HDR_CRC_AT]) {
            return Err("header checksum mismatch".into());
        }
        let mut r = Reader(b, 8);
        let mut h = Header {
            version: r.u32(),
            views: r.u32(),
            capacity: r.u64(),
            sb_size: r.u64(),
            lib_base: r.u64(),
            ..Default::default()
        };
        for v in h.view_base.iter_mut() {
            *v = r.u64();
        }
        h.seq = r.u64();
        h.epoch = r.u64();
        h.log_len = r.u64();
        h.log_crc = r.u32();
        h.meta_active = r.u32();
        h.meta_len = r.u64();
        h.meta_crc = r.u32();
        r.u32();
        h.meta_size = r.u64();
        h.log_size = r.u64();
        Ok(h)
    }

    /// Data offset of metadata area `i`.
    pub fn meta_off(&self, i: u32) -> usize {
        META0 + i as usize * self.meta_size as usize
    }

    /// Data offset of the redo log.
    pub fn log_off(&self) -> usize {
        META0 + 2 * self.meta_size as usize
    }

    /// Data offset of the checkpoint image.
    pub fn image_off(&self) -> usize {
        self.log_off() + self.log_size as usize
    }

    /// Bytes of pool data area needed.
    pub fn data_len(&self) -> usize {
        self.image_off() + self.capacity as usize
    }
}

/// Sizes of the metadata areas and the log for a heap of `capacity` bytes (page multiples).
///
/// The log holds the worst case of one checkpoint: every byte of the heap dirty, in ranges of
/// at least 16 bytes separated by gaps of at least 16 bytes (adjacent ranges are merged), so at
/// most `capacity / 32` records of 16 header bytes: `capacity * 3 / 2` suffices.
///
/// A metadata area holds a snapshot of the whole table: for a heap full of 16 B objects, an
/// `Alloc` record (28 bytes) and a `Crc` record (17 bytes) per object, `capacity * 45 / 16`;
/// `capacity * 3` plus 1 MiB for names. (The pool is sparse: an area costs what is written.)
pub fn area_sizes(capacity: usize) -> (usize, usize) {
    let round = |x: usize| x.div_ceil(PAGE) * PAGE;
    (
        round(capacity * 3 + (1 << 20)),
        round(capacity + capacity / 2 + PAGE),
    )
}

/// The metadata area size heaps created before issue #21 have (`capacity / 4 + 1 MiB`: a
/// snapshot of 64 B objects with checksums did not fit). They still open; their size is valid
/// next to [`area_sizes`]'s.
pub fn legacy_meta_size(capacity: usize) -> usize {
    (capacity / 4 + (1 << 20)).div_ceil(PAGE) * PAGE
}

/// Appends the encodings of the part checksums `(offset, live bytes, CRC-32)` (ascending by
/// offset, offsets multiples of `unit`) to `out`: each run of consecutive parts as one record
/// (tag 5: first offset, count, then per part its live bytes as a `u16` and its CRC: 6 bytes a
/// part where a `Crc` record takes 17; a dense checkpoint of 64 MiB has 32 k parts).
pub fn encode_crcs(
    crcs: impl IntoIterator<Item = (usize, usize, u32)>,
    unit: usize,
    out: &mut Vec<u8>,
) {
    let mut run: Option<(usize, usize, usize)> = None; // (first offset, count, count's position)
    for (off, len, crc) in crcs {
        match &mut run {
            Some((first, n, _)) if *first + *n * unit == off && *n < u32::MAX as usize => *n += 1,
            r => {
                if let Some((_, n, at)) = r.take() {
                    out[at..at + 4].copy_from_slice(&(n as u32).to_le_bytes());
                }
                out.push(5);
                out.extend_from_slice(&(off as u64).to_le_bytes());
                *r = Some((off, 1, out.len()));
                out.extend_from_slice(&[0; 4]);
            }
        }
        // A part's live bytes are at most `unit` ≤ 4096.
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
    }
    if let Some((_, n, at)) = run {
        out[at..at + 4].copy_from_slice(&(n as u32).to_le_bytes());
    }
}

/// Appends the encoding of `r` to `out`.
pub fn encode_meta(r: &MetaRec, out: &mut Vec<u8>) {
    match r {
        MetaRec::Alloc { off, obj } => {
            encode_alloc(*off, obj.size, obj.slot, obj.name.as_deref(), out)
        }
        MetaRec::Free { off } => encode_free(*off, out),
        MetaRec::Crc { off, len, crc } => {
            out.push(4);
            out.extend_from_slice(&(*off as u64).to_le_bytes());
            out.extend_from_slice(&(*len as u32).to_le_bytes());
            out.extend_from_slice(&crc.to_le_bytes());
        }
    }
}

/// Appends the encoding of `MetaRec::Alloc` of an object of `size` bytes in a slot of `slot`
/// at `off`, named `name` ([`encode_meta`] without building the record).
pub fn encode_alloc(off: usize, size: usize, slot: usize, name: Option<&str>, out: &mut Vec<u8>) {
    out.push(1);
    out.extend_from_slice(&(off as u64).to_le_bytes());
    out.extend_from_slice(&(size as u64).to_le_bytes());
    out.extend_from_slice(&(slot as u64).to_le_bytes());
    let n = name.unwrap_or("");
    out.push(name.is_some() as u8);
    out.extend_from_slice(&(n.len() as u16).to_le_bytes());
    out.extend_from_slice(n.as_bytes());
}

/// Appends the encoding of `MetaRec::Free` at `off`.
pub fn encode_free(off: usize, out: &mut Vec<u8>) {
    out.push(2);
    out.extend_from_slice(&(off as u64).to_le_bytes());
}

/// Appends to `out` the live byte ranges `(offset, len)` of the part `[start, start + unit)` in
/// `table`, ascending: each object's first `size` bytes clipped to the part. The bytes a
/// checksum covers.
pub fn live_in_part(
    table: &BTreeMap<usize, Obj>,
    start: usize,
    unit: usize,
    out: &mut Vec<(usize, usize)>,
) {
    // Saturating: `start` may come from a damaged file (a record at the top of the address
    // space).
    let (ps, pe) = (start, start.saturating_add(unit));
    let start = out.len();
    for (&o, obj) in table.range(..pe).rev() {
        let end = o.saturating_add(obj.size).min(pe);
        if end > o.max(ps) {
            out.push((o.max(ps), end - o.max(ps)));
        }
        if o < ps {
            // Objects do not overlap: every earlier one ends before this one starts.
            break;
        }
    }
    out[start..].reverse();
}

/// Drops the checksums of the parts (of `unit` bytes) overlapping `[off, off+slot)`.
fn forget(crcs: &mut BTreeMap<usize, (usize, u32)>, off: usize, slot: usize, unit: usize) {
    let keys: Vec<usize> = crcs
        .range(off / unit * unit..off.saturating_add(slot.max(1)))
        .map(|(&k, _)| k)
        .collect();
    for k in keys {
        crcs.remove(&k);
    }
}

/// Applies an encoded journal to `table` (offset → object) and `crcs` (part offset → (live
/// bytes, CRC-32) of the checkpoint image; parts of `unit` bytes, [`crc_unit`]). `Err`
/// describes the first malformed record, including a checksum whose length is not the part's
/// live bytes in the table.
pub fn replay_meta(
    mut b: &[u8],
    table: &mut BTreeMap<usize, Obj>,
    crcs: &mut BTreeMap<usize, (usize, u32)>,
    unit: usize,
) -> Result<(), String> {
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
        if b.len() < n {
            return Err("metadata journal truncated".into());
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h.to_vec())
    };
    // `take(n)` returns exactly n bytes, so the conversions below cannot fail.
    let u64_of = |v: Vec<u8>| u64::from_le_bytes(v.try_into().unwrap_or([0; 8])) as usize;
    let u32_of = |v: Vec<u8>| u32::from_le_bytes(v.try_into().unwrap_or([0; 4]));
    while !b.is_empty() {
        let tag = take(&mut b, 1)?[0];
        match tag {
            1 => {
                let off = u64_of(take(&mut b, 8)?);
                let size = u64_of(take(&mut b, 8)?);
                let slot = u64_of(take(&mut b, 8)?);
                let has = take(&mut b, 1)?[0];
                let nl = u16::from_le_bytes(take(&mut b, 2)?.try_into().unwrap_or([0; 2])) as usize;
                let name = take(&mut b, nl)?;
                let name = if has == 1 {
                    Some(String::from_utf8(name).map_err(|_| "object name is not UTF-8")?)
                } else {
                    None
                };
                if let Some(old) = table.insert(off, Obj { size, slot, name }) {
                    forget(crcs, off, old.slot, unit);
                }
                forget(crcs, off, slot, unit);
            }
            2 => {
                let off = u64_of(take(&mut b, 8)?);
                match table.remove(&off) {
                    Some(old) => forget(crcs, off, old.slot, unit),
                    None => return Err(format!("metadata journal frees unknown object {off:#x}")),
                }
            }
            4 => {
                let off = u64_of(take(&mut b, 8)?);
                let len = u32_of(take(&mut b, 4)?) as usize;
                let crc = u32_of(take(&mut b, 4)?);
                add_crc(table, crcs, unit, off, len, crc)?;
            }
            5 => {
                let off = u64_of(take(&mut b, 8)?);
                let n = u32_of(take(&mut b, 4)?) as usize;
                if n == 0 || n > b.len() / 6 {
                    return Err(format!(
                        "metadata journal: checksum run at {off:#x} of {n} parts does not fit the journal"
                    ));
                }
                for i in 0..n {
                    let len =
                        u16::from_le_bytes(take(&mut b, 2)?.try_into().unwrap_or([0; 2])) as usize;
                    let crc = u32_of(take(&mut b, 4)?);
                    let at = off
                        .checked_add(i.saturating_mul(unit))
                        .ok_or("metadata journal: checksum run beyond the address space")?;
                    add_crc(table, crcs, unit, at, len, crc)?;
                }
            }
            t => return Err(format!("metadata journal: unknown record tag {t}")),
        }
    }
    Ok(())
}

/// Records the checksum of the part at `off` after checking it against the table: the part
/// must be one (a multiple of `unit`) holding live bytes, `len` of them.
fn add_crc(
    table: &BTreeMap<usize, Obj>,
    crcs: &mut BTreeMap<usize, (usize, u32)>,
    unit: usize,
    off: usize,
    len: usize,
    crc: u32,
) -> Result<(), String> {
    let mut live = Vec::new();
    if off % unit == 0 {
        live_in_part(table, off, unit, &mut live);
    }
    let have: usize = live.iter().map(|r| r.1).sum();
    if live.is_empty() || have != len {
        return Err(format!(
            "metadata journal: checksum record at {off:#x} ({len} bytes) does not match the live objects there ({have} bytes)"
        ));
    }
    crcs.insert(off, (len, crc));
    Ok(())
}

struct Writer<'a>(&'a mut [u8], usize);
impl Writer<'_> {
    fn bytes(&mut self, v: &[u8]) {
        self.0[self.1..self.1 + v.len()].copy_from_slice(v);
        self.1 += v.len();
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes())
    }
}

/// Reads fixed-width fields; only used by `Header::decode` on a buffer of at least 256 bytes
/// whose fields end at byte 252, so the slices are in range.
struct Reader<'a>(&'a [u8], usize);
impl Reader<'_> {
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.0[self.1..self.1 + 4].try_into().unwrap_or([0; 4]));
        self.1 += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.0[self.1..self.1 + 8].try_into().unwrap_or([0; 8]));
        self.1 += 8;
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_crc() {
        let h = Header {
            version: HEAP_VERSION,
            views: 2,
            capacity: 1 << 20,
            seq: 7,
            ..Default::default()
        };
        let mut b = h.encode();
        assert_eq!(Header::decode(&b).unwrap(), h);
        b[40] ^= 1;
        assert!(Header::decode(&b).unwrap_err().contains("checksum"));
    }

    #[test]
    fn meta_round_trip() {
        let mut out = Vec::new();
        let obj = Obj {
            size: 10,
            slot: 16,
            name: Some("a".into()),
        };
        encode_meta(
            &MetaRec::Alloc {
                off: 32,
                obj: obj.clone(),
            },
            &mut out,
        );
        encode_meta(
            &MetaRec::Alloc {
                off: 48,
                obj: obj.clone(),
            },
            &mut out,
        );
        encode_meta(&MetaRec::Free { off: 48 }, &mut out);
        // Page 0 holds the one live object's 10 bytes.
        encode_meta(
            &MetaRec::Crc {
                off: 0,
                len: 10,
                crc: 7,
            },
            &mut out,
        );
        let mut t = BTreeMap::new();
        let mut c = BTreeMap::new();
        replay_meta(&out, &mut t, &mut c, PAGE).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[&32], obj);
        assert_eq!(c[&0], (10, 7));
        assert!(replay_meta(&out[..out.len() - 1], &mut BTreeMap::new(), &mut c, PAGE).is_err());
        // A checksum that does not match the page's live bytes, or of a page without objects,
        // or not at a page boundary, is refused.
        for (off, len) in [(0, 11), (PAGE, 10), (32, 10)] {
            let mut bad = Vec::new();
            encode_meta(&MetaRec::Crc { off, len, crc: 7 }, &mut bad);
            assert!(
                replay_meta(&bad, &mut t, &mut c, PAGE).is_err(),
                "{off} {len}"
            );
        }
        // Freeing the object drops its page's checksum.
        let mut free = Vec::new();
        encode_meta(&MetaRec::Free { off: 32 }, &mut free);
        replay_meta(&free, &mut t, &mut c, PAGE).unwrap();
        assert!(c.is_empty());
        // With two views a record covers half a page: the object at 2048 + 16 is in the part
        // at 2048, not in the one at 0.
        let mut two = Vec::new();
        let o = Obj {
            size: 20,
            slot: 32,
            name: None,
        };
        encode_meta(&MetaRec::Alloc { off: 2064, obj: o }, &mut two);
        encode_meta(
            &MetaRec::Crc {
                off: 2048,
                len: 20,
                crc: 1,
            },
            &mut two,
        );
        let (mut t2, mut c2) = (BTreeMap::new(), BTreeMap::new());
        replay_meta(&two, &mut t2, &mut c2, crc_unit(2)).unwrap();
        assert_eq!(c2[&2048], (20, 1));
        let mut bad = Vec::new();
        encode_meta(
            &MetaRec::Crc {
                off: 0,
                len: 20,
                crc: 1,
            },
            &mut bad,
        );
        assert!(replay_meta(&bad, &mut t2, &mut c2, crc_unit(2)).is_err());
        // Runs of consecutive parts: one record each; every part checked as a `Crc` record.
        let mut t3 = BTreeMap::new();
        for off in [0usize, 2048, 4096, 3 * 4096] {
            t3.insert(
                off,
                Obj {
                    size: 100,
                    slot: 128,
                    name: None,
                },
            );
        }
        let parts = [
            (0, 100, 1),
            (2048, 100, 2),
            (4096, 100, 3),
            (3 * 4096, 100, 4),
        ];
        let mut runs = Vec::new();
        encode_crcs(parts, 2048, &mut runs);
        assert_eq!(runs.len(), 2 * 13 + 4 * 6, "two runs: 0..=4096 and 12288");
        let mut c3 = BTreeMap::new();
        replay_meta(&runs, &mut t3, &mut c3, 2048).unwrap();
        assert_eq!(c3.len(), 4);
        assert_eq!(c3[&4096], (100, 3));
        let mut wrong = Vec::new();
        encode_crcs([(0, 100, 1), (2048, 99, 2)], 2048, &mut wrong);
        assert!(replay_meta(&wrong, &mut t3, &mut BTreeMap::new(), 2048).is_err());
        // A count beyond the journal is refused before anything is read.
        let mut huge = runs[..13].to_vec();
        huge[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(replay_meta(&huge, &mut t3, &mut BTreeMap::new(), 2048).is_err());
    }
}
