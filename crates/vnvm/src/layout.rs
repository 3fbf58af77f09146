//! Persistent layout of a vnvm instance (format version [`FORMAT_VERSION`]).
//!
//! Everything is little-endian and addressed by pool *data offsets* and page *indices*; nothing
//! persistent holds a virtual address.
//!
//! `meta.pool` data area:
//!
//! | offset | size | contents |
//! |---|---|---|
//! | 0 | 256 | superblock: magic `VNVMSUPR`, version, page size, log pages, cache pages, max files, max domains, log objects, CRC-32 at 252 |
//! | 256 | 8 | state word: [`STATE_CLEAN`], [`STATE_RUNNING`] or [`STATE_RECOVERING`] (8-byte atomic update) |
//! | 512 | 64 × domains | committed-list word per log domain: head index + 1 (low 32 bits), tail index + 1 (high 32 bits); 0 = empty; at +8 its CRC32C ([`domain_crc`]); a second copy (word, CRC) at +16 |
//! | files_off | 512 × max files | file records |
//! | cache_obj_off | 64 × cache pages | cache page records ([`CacheRec`]), two 32-byte copies each: a packed 8-byte word (file id, page index, dirty), an 8-byte mask of the page's valid chunks (chunk = page size / 64), the CRC32C of the whole cache page, the CRC32C of the copy, 8 reserved bytes; 32 zero bytes = never used |
//!
//! Two-copy words (domain words, cache page records): an update stores copy A, then copy B,
//! and persists the cache line. A kill -9 between stores leaves one copy torn (its CRC fails)
//! and the other intact — the old value (A torn) or the new one (B torn) — both states the
//! crash protocol tolerates. Readers take A when it checks, else B; damage is both failing.
//! A single flip is thus detected (scrub reports it) and outvoted, never served.
//! | logobj_off | 64 × log objects | log objects |
//!
//! `log.pool` data area: log pages of `page_size` bytes: header `{used: u32, next: u32 (page
//! index + 1, 0 = last), tid: u64, crc: u32 (CRC32C of the 16 bytes before), pad: u32}` then
//! entries `{len: u32, file_id: u32, offset: u64, crc: u32 (CRC32C of the 16 bytes before and
//! of data), pad: u32, data[len]}` each 8-byte aligned. `cache.pool` data area: cache pages.
//!
//! Format 3 added the CRC32C fields (log page headers, log entries, domain words, cache page
//! records and contents) and relative backing-file paths (a record's path is relative to the
//! instance directory when the file lies inside it); format 2 instances are refused.
//!
//! The committed list of a domain is a FIFO of log objects; each log object stores the index of
//! its predecessor (`prev`), written before the commit fence, so linking a transaction is one
//! 8-byte atomic store of the (head, tail) word plus its persist, and popping the head is one
//! such store. Recovery walks `prev` from the tail back to the head. This is the order of the
//! thesis' Fig. 2.10 folded into one word: an object is in the list exactly when the word says so.

pub const SB_MAGIC: [u8; 8] = *b"VNVMSUPR";
pub const FORMAT_VERSION: u32 = 3;
pub const SB_SIZE: usize = 256;
pub const SB_CRC_OFF: usize = 252;
pub const STATE_OFF: u64 = 256;
pub const STATE_CLEAN: u64 = 0x434c_4541_4e00_0001; // "CLEAN" tag
pub const STATE_RUNNING: u64 = 0x5255_4e4e_0000_0002; // "RUNN" tag
/// Recovery has started writing the backing files (format 3): the backing-file pages it writes
/// may be newer than their checksums until it finishes.
pub const STATE_RECOVERING: u64 = 0x5245_434f_0000_0003; // "RECO" tag
pub const DOMAIN_OFF: u64 = 512;
pub const DOMAIN_STRIDE: u64 = 64;
pub const MAX_DOMAINS: u32 = 64;
pub const FILE_REC_SIZE: u64 = 512;
pub const FILE_MAGIC: u64 = 0x5245_4c49_464d_4e56; // "VNMFILER"
pub const FILE_PATH_MAX: usize = 472;
pub const LOGOBJ_SIZE: u64 = 64;
pub const LOGOBJ_MAGIC: u32 = 0x4a42_4f4c; // "LOBJ"
pub const LOG_HDR: usize = 24;
pub const ENTRY_HDR: usize = 24;
pub const CACHE_DIRTY: u64 = 1 << 63;
/// Bytes of one copy of a cache page record; a record slot holds two copies.
pub const CACHE_REC_SIZE: u64 = 32;
/// Bytes of a cache page record slot (copy A, then copy B; one cache line).
pub const CACHE_OBJ_SIZE: u64 = 64;
/// Page indices of backing files must fit 40 bits.
pub const MAX_FILE_PAGE: u64 = (1 << 40) - 1;

/// Geometry of an instance, stored in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub page_size: u32,
    pub log_pages: u32,
    pub cache_pages: u32,
    pub max_files: u32,
    pub max_domains: u32,
    pub log_objs: u32,
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Geometry {
    pub fn files_off(&self) -> u64 {
        align(DOMAIN_OFF + DOMAIN_STRIDE * self.max_domains as u64, 4096)
    }
    pub fn file_off(&self, id: u32) -> u64 {
        self.files_off() + FILE_REC_SIZE * id as u64
    }
    pub fn cache_obj_off(&self) -> u64 {
        self.files_off() + FILE_REC_SIZE * self.max_files as u64
    }
    pub fn cache_word_off(&self, page: u32) -> u64 {
        self.cache_obj_off() + CACHE_OBJ_SIZE * page as u64
    }
    /// Bytes per valid-mask bit.
    pub fn chunk(&self) -> u64 {
        self.page_size as u64 / 64
    }
    pub fn logobj_base(&self) -> u64 {
        align(
            self.cache_obj_off() + CACHE_OBJ_SIZE * self.cache_pages as u64,
            64,
        )
    }
    pub fn logobj_off(&self, idx: u32) -> u64 {
        self.logobj_base() + LOGOBJ_SIZE * idx as u64
    }
    pub fn domain_off(&self, d: u32) -> u64 {
        DOMAIN_OFF + DOMAIN_STRIDE * d as u64
    }
    /// Data bytes `meta.pool` needs.
    pub fn meta_len(&self) -> u64 {
        align(
            self.logobj_base() + LOGOBJ_SIZE * self.log_objs as u64,
            4096,
        )
    }
    pub fn log_len(&self) -> u64 {
        self.page_size as u64 * self.log_pages as u64
    }
    pub fn cache_len(&self) -> u64 {
        self.page_size as u64 * self.cache_pages as u64
    }

    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        b[0..8].copy_from_slice(&SB_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.page_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.log_pages.to_le_bytes());
        b[20..24].copy_from_slice(&self.cache_pages.to_le_bytes());
        b[24..28].copy_from_slice(&self.max_files.to_le_bytes());
        b[28..32].copy_from_slice(&self.max_domains.to_le_bytes());
        b[32..36].copy_from_slice(&self.log_objs.to_le_bytes());
        let c = crc32fast::hash(&b[..SB_CRC_OFF]);
        b[SB_CRC_OFF..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decode and validate a superblock; `Err` holds a description of the problem.
    pub fn decode(b: &[u8]) -> Result<Geometry, String> {
        if b.len() < SB_SIZE {
            return Err("superblock truncated".into());
        }
        if b[0..8] != SB_MAGIC {
            return Err("bad superblock magic (expected \"VNVMSUPR\")".into());
        }
        let version = u32_at(b, 8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "format version {version}, this build reads only version {FORMAT_VERSION}{}",
                if version < FORMAT_VERSION {
                    " (an instance of an older tiermem: recover it with that build's `tiermem \
                     vnvm recover`, then remove the pools to start afresh with this one)"
                } else {
                    " (written by a newer tiermem)"
                }
            ));
        }
        let stored = u32_at(b, SB_CRC_OFF);
        let computed = crc32fast::hash(&b[..SB_CRC_OFF]);
        if stored != computed {
            return Err(format!(
                "superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let g = Geometry {
            page_size: u32_at(b, 12),
            log_pages: u32_at(b, 16),
            cache_pages: u32_at(b, 20),
            max_files: u32_at(b, 24),
            max_domains: u32_at(b, 28),
            log_objs: u32_at(b, 32),
        };
        if !(g.page_size == 4096 || g.page_size == 8192)
            || g.log_pages == 0
            || g.cache_pages == 0
            || g.max_files == 0
            || g.max_files > 0xfffe
            || g.max_domains == 0
            || g.max_domains > MAX_DOMAINS
            || g.log_objs == 0
        {
            return Err(format!("implausible geometry {g:?}"));
        }
        Ok(g)
    }
}

/// Little-endian word at `o`. Panics when `b` is shorter than `o + 4` (callers bound `o`).
pub fn u32_at(b: &[u8], o: usize) -> u32 {
    // cannot fail (the expect): a 4-byte slice converts to a 4-byte array.
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
/// Little-endian word at `o`. Panics when `b` is shorter than `o + 8` (callers bound `o`).
pub fn u64_at(b: &[u8], o: usize) -> u64 {
    // cannot fail (the expect): an 8-byte slice converts to an 8-byte array.
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// A file record: the identity of a backing file (Fig. 2.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRecord {
    pub id: u32,
    pub mode: u32,
    pub size: u64,
    pub path: String,
    /// App id (slot + 1) of the process that allocated a private region; 0 for shared regions.
    pub owner: u32,
    /// Committed-list domain of the region's transactions.
    pub domain: u32,
}

impl FileRecord {
    /// The full 512-byte record, magic included.
    pub fn encode(&self) -> [u8; FILE_REC_SIZE as usize] {
        let mut b = [0u8; FILE_REC_SIZE as usize];
        b[0..8].copy_from_slice(&FILE_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&self.id.to_le_bytes());
        b[12..16].copy_from_slice(&self.mode.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        let p = self.path.as_bytes();
        b[24..28].copy_from_slice(&(p.len() as u32).to_le_bytes());
        b[32..32 + p.len()].copy_from_slice(p);
        b[504..508].copy_from_slice(&self.owner.to_le_bytes());
        b[508..512].copy_from_slice(&self.domain.to_le_bytes());
        let c = Self::crc(&b);
        b[28..32].copy_from_slice(&c.to_le_bytes());
        b
    }

    fn crc(b: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&b[8..28]);
        h.update(&b[32..FILE_REC_SIZE as usize]);
        h.finalize()
    }

    /// `Ok(None)`: empty slot. `Err`: a damaged record.
    pub fn decode(b: &[u8], expect_id: u32) -> Result<Option<FileRecord>, String> {
        let magic = u64_at(b, 0);
        if magic == 0 {
            return Ok(None);
        }
        if magic != FILE_MAGIC {
            return Err(format!("bad file-record magic {magic:#018x}"));
        }
        let stored = u32_at(b, 28);
        let computed = Self::crc(b);
        if stored != computed {
            return Err(format!(
                "file-record checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let id = u32_at(b, 8);
        if id != expect_id {
            return Err(format!("record in slot {expect_id} claims id {id}"));
        }
        let len = u32_at(b, 24) as usize;
        if len == 0 || len > FILE_PATH_MAX {
            return Err(format!("path length {len} out of range"));
        }
        let path = std::str::from_utf8(&b[32..32 + len])
            .map_err(|_| "path is not UTF-8".to_string())?
            .to_string();
        Ok(Some(FileRecord {
            id,
            mode: u32_at(b, 12),
            size: u64_at(b, 16),
            path,
            owner: u32_at(b, 504),
            domain: u32_at(b, 508),
        }))
    }
}

/// A log object (one committed transaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogObj {
    pub tid: u64,
    /// Predecessor in the committed list: index + 1, 0 = none.
    pub prev: u32,
    pub first_page: u32,
    pub npages: u32,
    pub domain: u32,
    pub app_id: u32,
    pub start_ns: u64,
}

impl LogObj {
    pub fn encode(&self) -> [u8; LOGOBJ_SIZE as usize] {
        let mut b = [0u8; LOGOBJ_SIZE as usize];
        b[0..4].copy_from_slice(&LOGOBJ_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.npages.to_le_bytes());
        b[8..16].copy_from_slice(&self.tid.to_le_bytes());
        b[16..20].copy_from_slice(&self.prev.to_le_bytes());
        b[20..24].copy_from_slice(&self.first_page.to_le_bytes());
        b[24..28].copy_from_slice(&self.domain.to_le_bytes());
        b[28..32].copy_from_slice(&self.app_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.start_ns.to_le_bytes());
        let c = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<LogObj, String> {
        if u32_at(b, 0) != LOGOBJ_MAGIC {
            return Err(format!("bad log-object magic {:#010x}", u32_at(b, 0)));
        }
        let stored = u32_at(b, 60);
        let computed = crc32fast::hash(&b[..60]);
        if stored != computed {
            return Err(format!(
                "log-object checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        Ok(LogObj {
            npages: u32_at(b, 4),
            tid: u64_at(b, 8),
            prev: u32_at(b, 16),
            first_page: u32_at(b, 20),
            domain: u32_at(b, 24),
            app_id: u32_at(b, 28),
            start_ns: u64_at(b, 32),
        })
    }
}

/// Pack a cache page object: page index (40 bits), file id + 1 (16 bits), dirty (bit 63).
pub fn cache_word(file_id: u32, page_index: u64, dirty: bool) -> u64 {
    (page_index & MAX_FILE_PAGE)
        | (((file_id as u64 + 1) & 0xffff) << 40)
        | if dirty { CACHE_DIRTY } else { 0 }
}

/// Unpack a cache page object: `None` for a free page, else (file id, page index, dirty).
pub fn cache_unword(w: u64) -> Option<(u32, u64, bool)> {
    let f = (w >> 40) & 0xffff;
    if f == 0 {
        return None;
    }
    Some(((f - 1) as u32, w & MAX_FILE_PAGE, w & CACHE_DIRTY != 0))
}

/// A cache page record (32 bytes, one cache line half): word, valid mask, CRC32C of the page
/// contents, CRC32C of the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheRec {
    /// [`cache_word`]: (file id, page index, dirty); 0 = no file page.
    pub word: u64,
    /// Valid 64ths of the page.
    pub mask: u64,
    /// Contents checksum of the page: the XOR of its valid chunks' seeded CRC32Cs
    /// (`recovery::cache_page_sum`; meaningful for dirty pages) — of the page as it is, or,
    /// while a redo batch stores into it, as the listed transactions will make it (written
    /// ahead: `Inner::store_staged`).
    pub page_crc: u32,
}

impl CacheRec {
    /// The 32 bytes of one copy of the record, its CRC included.
    pub fn encode(&self) -> [u8; CACHE_REC_SIZE as usize] {
        let mut b = [0u8; CACHE_REC_SIZE as usize];
        b[0..8].copy_from_slice(&self.word.to_le_bytes());
        b[8..16].copy_from_slice(&self.mask.to_le_bytes());
        b[16..20].copy_from_slice(&self.page_crc.to_le_bytes());
        let c = Self::crc(&b);
        b[20..24].copy_from_slice(&c.to_le_bytes());
        b
    }

    fn crc(b: &[u8]) -> u32 {
        crate::crc::append(crate::crc::crc32c(&b[0..20]), &b[24..32])
    }

    /// Decode and check a record; all zero bytes is the record of a never-used page.
    pub fn decode(b: &[u8]) -> Result<CacheRec, String> {
        if b.len() < CACHE_REC_SIZE as usize {
            return Err("cache page record truncated".into());
        }
        let b = &b[..CACHE_REC_SIZE as usize];
        if b.iter().all(|&x| x == 0) {
            return Ok(CacheRec::default());
        }
        let stored = u32_at(b, 20);
        let computed = Self::crc(b);
        if stored != computed {
            return Err(format!(
                "cache page record checksum mismatch (stored {stored:#010x}, computed \
                 {computed:#010x})"
            ));
        }
        if u64_at(b, 24) != 0 {
            return Err("reserved bytes set".into());
        }
        Ok(CacheRec {
            word: u64_at(b, 0),
            mask: u64_at(b, 8),
            page_crc: u32_at(b, 16),
        })
    }
}

/// Resolve the two copies of a two-copy word (see the module docs): `Ok((value, note))` with a
/// note naming a copy that failed its check, `Err` when both fail.
pub fn pick_copy<T: PartialEq>(
    a: Result<T, String>,
    b: Result<T, String>,
) -> Result<(T, Option<String>), String> {
    match (a, b) {
        (Ok(a), Ok(_)) => Ok((a, None)),
        (Ok(a), Err(e)) => Ok((a, Some(format!("copy B: {e}")))),
        (Err(e), Ok(b)) => Ok((b, Some(format!("copy A: {e}")))),
        (Err(ea), Err(eb)) => Err(format!("both copies fail: A: {ea}; B: {eb}")),
    }
}

/// CRC32C of the committed-list word of domain `d` (stored at +8 of its slot). An empty list
/// (word 0) has CRC 0.
pub fn domain_crc(d: u32, word: u64) -> u32 {
    if word == 0 {
        return 0;
    }
    crate::crc::append(crate::crc::crc32c(&d.to_le_bytes()), &word.to_le_bytes())
}

pub fn domain_word(head: u32, tail: u32) -> u64 {
    head as u64 | ((tail as u64) << 32)
}
pub fn domain_unword(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

/// Log page header, with the CRC32C of its first 16 bytes.
pub fn log_hdr(used: u32, next: u32, tid: u64) -> [u8; LOG_HDR] {
    let mut b = [0u8; LOG_HDR];
    b[0..4].copy_from_slice(&used.to_le_bytes());
    b[4..8].copy_from_slice(&next.to_le_bytes());
    b[8..16].copy_from_slice(&tid.to_le_bytes());
    let c = crate::crc::crc32c(&b[..16]);
    b[16..20].copy_from_slice(&c.to_le_bytes());
    b
}

/// Log entry header for `data` (its CRC32C covers the first 16 header bytes and the data):
/// computed while the entry is written, so a commit pays one pass over its bytes.
pub fn entry_hdr(file_id: u32, offset: u64, data: &[u8]) -> [u8; ENTRY_HDR] {
    let mut b = [0u8; ENTRY_HDR];
    b[0..4].copy_from_slice(&(data.len() as u32).to_le_bytes());
    b[4..8].copy_from_slice(&file_id.to_le_bytes());
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    let c = crate::crc::append(crate::crc::crc32c(&b[..16]), data);
    b[16..20].copy_from_slice(&c.to_le_bytes());
    b
}

pub fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// One parsed log entry: (file id, offset, data offset within the log pool, len).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub file_id: u32,
    pub offset: u64,
    pub log_off: u64,
    pub len: u32,
}

/// Walk the entries of one log page image `page` (whose data-area offset is `page_off`),
/// validating them. `check(file_id, offset, len)` validates the destination. With `verify`,
/// the header's and every entry's CRC32C are checked too.
pub fn parse_page(
    page: &[u8],
    page_off: u64,
    page_size: u32,
    out: &mut Vec<Entry>,
    check: &dyn Fn(u32, u64, u32) -> Result<(), String>,
    verify: bool,
) -> Result<(), String> {
    if page.len() < LOG_HDR || page.len() < page_size as usize {
        return Err("log page truncated".into());
    }
    if verify {
        let (stored, computed) = (u32_at(page, 16), crate::crc::crc32c(&page[..16]));
        if stored != computed {
            return Err(format!(
                "log page header checksum mismatch (stored {stored:#010x}, computed \
                 {computed:#010x})"
            ));
        }
    }
    let used = u32_at(page, 0) as usize;
    if used < LOG_HDR || used > page_size as usize {
        return Err(format!("log page 'used' {used} out of range"));
    }
    // With `verify`, entries are checked three at a time (see `crc::crc32c_3`): (at, len).
    let mut pending: [(usize, usize); 3] = [(0, 0); 3];
    let mut npending = 0;
    let mut at = LOG_HDR;
    while at < used {
        if at + ENTRY_HDR > used {
            return Err(format!("entry header at {at} overruns used {used}"));
        }
        let len = u32_at(page, at);
        let file_id = u32_at(page, at + 4);
        let offset = u64_at(page, at + 8);
        if len == 0 || at + ENTRY_HDR + len as usize > used {
            return Err(format!("entry at {at}: length {len} out of range"));
        }
        if offset / page_size as u64 != (offset + len as u64 - 1) / page_size as u64 {
            return Err(format!(
                "entry at {at}: offset {offset} len {len} crosses a cache-page boundary"
            ));
        }
        check(file_id, offset, len).map_err(|e| format!("entry at {at}: {e}"))?;
        if verify {
            pending[npending] = (at, len as usize);
            npending += 1;
            if npending == 3 {
                verify_entries(page, &pending)?;
                npending = 0;
            }
        }
        out.push(Entry {
            file_id,
            offset,
            log_off: page_off + (at + ENTRY_HDR) as u64,
            len,
        });
        at += ENTRY_HDR + pad8(len as usize);
    }
    verify_entries(page, &pending[..npending])
}

/// Check the CRC32Cs of up to three entries `(at, len)` of a parsed log page (in bounds: the
/// caller checked them), side by side.
fn verify_entries(page: &[u8], entries: &[(usize, usize)]) -> Result<(), String> {
    let Some(&last) = entries.last() else {
        return Ok(());
    };
    // Fewer than three: the last one again fills the lanes (checked twice, harmless).
    let e = [0, 1, 2].map(|k| entries.get(k).copied().unwrap_or(last));
    let msg = |(at, len): (usize, usize)| {
        let d = at + ENTRY_HDR;
        (&page[at..at + 16], &page[d..d + len])
    };
    let computed = crate::crc::crc32c_3(e.map(msg));
    for (k, &(at, len)) in e.iter().enumerate() {
        let stored = u32_at(page, at + 16);
        if stored != computed[k] {
            let (file_id, offset) = (u32_at(page, at + 4), u64_at(page, at + 8));
            return Err(format!(
                "entry at {at} ({len} bytes for file {file_id} at offset {offset}): payload \
                 checksum mismatch (stored {stored:#010x}, computed {:#010x})",
                computed[k]
            ));
        }
    }
    Ok(())
}

/// Maximal runs of set bits of `mask`: (first chunk, number of chunks).
pub fn mask_runs(mask: u64) -> impl Iterator<Item = (u32, u32)> {
    let mut m = mask;
    let mut base = 0u32;
    std::iter::from_fn(move || {
        if m == 0 {
            return None;
        }
        let tz = m.trailing_zeros();
        m >>= tz;
        base += tz;
        let ones = (!m).trailing_zeros();
        let run = (base, ones);
        m = if ones >= 64 { 0 } else { m >> ones };
        base += ones;
        Some(run)
    })
}

/// Mask of chunks `first..=last`.
pub fn mask_range(first: u64, last: u64) -> u64 {
    let hi = if last >= 63 {
        u64::MAX
    } else {
        (1u64 << (last + 1)) - 1
    };
    hi & !((1u64 << first) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            page_size: 4096,
            log_pages: 10,
            cache_pages: 7,
            max_files: 16,
            max_domains: MAX_DOMAINS,
            log_objs: 10,
        }
    }

    #[test]
    fn superblock_round_trip_and_damage() {
        let g = geo();
        let mut b = g.encode();
        assert_eq!(Geometry::decode(&b).unwrap(), g);
        b[17] ^= 1;
        assert!(Geometry::decode(&b).unwrap_err().contains("checksum"));
    }

    #[test]
    fn records_and_words() {
        let r = FileRecord {
            id: 3,
            mode: 1,
            size: 12345,
            path: "/x/y".into(),
            owner: 2,
            domain: 17,
        };
        let mut b = r.encode();
        assert_eq!(FileRecord::decode(&b, 3).unwrap(), Some(r));
        assert!(FileRecord::decode(&b, 4).is_err());
        b[40] ^= 1;
        assert!(FileRecord::decode(&b, 3).is_err());
        assert_eq!(FileRecord::decode(&[0u8; 512], 0).unwrap(), None);
        let w = cache_word(65533, MAX_FILE_PAGE, true);
        assert_eq!(cache_unword(w), Some((65533, MAX_FILE_PAGE, true)));
        assert_eq!(cache_unword(0), None);
        assert_eq!(domain_unword(domain_word(5, 9)), (5, 9));
        let o = LogObj {
            tid: 7,
            prev: 2,
            first_page: 4,
            npages: 1,
            domain: 0,
            app_id: 1,
            start_ns: 99,
        };
        assert_eq!(LogObj::decode(&o.encode()).unwrap(), o);
    }

    #[test]
    fn checksummed_structures_detect_flips() {
        let r = CacheRec {
            word: cache_word(3, 9, true),
            mask: 0b1011,
            page_crc: 0xdead_beef,
        };
        let b = r.encode();
        assert_eq!(CacheRec::decode(&b).unwrap(), r);
        assert_eq!(CacheRec::decode(&[0u8; 32]).unwrap(), CacheRec::default());
        for bit in 0..256 {
            let mut x = b;
            x[bit / 8] ^= 1 << (bit % 8);
            assert!(CacheRec::decode(&x).is_err(), "flip of bit {bit} passed");
            let mut z = [0u8; 32];
            z[bit / 8] ^= 1 << (bit % 8);
            assert!(
                CacheRec::decode(&z).is_err(),
                "flip of zero bit {bit} passed"
            );
        }
        let mut page = vec![0u8; 4096];
        let h = entry_hdr(1, 40, b"hello");
        page[LOG_HDR..LOG_HDR + ENTRY_HDR].copy_from_slice(&h);
        page[LOG_HDR + ENTRY_HDR..LOG_HDR + ENTRY_HDR + 5].copy_from_slice(b"hello");
        let used = (LOG_HDR + ENTRY_HDR + 8) as u32;
        page[..LOG_HDR].copy_from_slice(&log_hdr(used, 0, 7));
        let ok = |_: u32, _: u64, _: u32| Ok(());
        let mut out = Vec::new();
        parse_page(&page, 0, 4096, &mut out, &ok, true).unwrap();
        assert_eq!(out.len(), 1);
        for at in [
            3usize,
            10,
            LOG_HDR + 2,
            LOG_HDR + 9,
            LOG_HDR + 17,
            LOG_HDR + ENTRY_HDR + 1,
        ] {
            let mut p = page.clone();
            p[at] ^= 4;
            assert!(
                parse_page(&p, 0, 4096, &mut Vec::new(), &ok, true).is_err(),
                "flip at {at} passed"
            );
        }
        assert_eq!(domain_crc(1, 0), 0);
        assert_ne!(domain_crc(1, 5), domain_crc(2, 5));
    }

    #[test]
    fn masks() {
        assert_eq!(mask_runs(0).count(), 0);
        assert_eq!(mask_runs(u64::MAX).collect::<Vec<_>>(), vec![(0, 64)]);
        assert_eq!(
            mask_runs(0b1110_0110 | 1 << 63).collect::<Vec<_>>(),
            vec![(1, 2), (5, 3), (63, 1)]
        );
        assert_eq!(mask_range(0, 63), u64::MAX);
        assert_eq!(mask_range(2, 4), 0b11100);
        assert_eq!(mask_range(63, 63), 1 << 63);
    }

    #[test]
    fn layout_regions_do_not_overlap() {
        let g = geo();
        assert!(g.files_off() >= DOMAIN_OFF + DOMAIN_STRIDE * g.max_domains as u64);
        assert!(g.cache_obj_off() >= g.file_off(g.max_files - 1) + FILE_REC_SIZE);
        assert!(g.logobj_base() >= g.cache_word_off(g.cache_pages - 1) + CACHE_OBJ_SIZE);
        assert_eq!(g.cache_obj_off() % 64, 0);
        assert!(g.meta_len() >= g.logobj_off(g.log_objs - 1) + LOGOBJ_SIZE);
    }
}
