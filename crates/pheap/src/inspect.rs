//! Read-only inspection of a heap's checkpoint space (for `tiermem pheap info|verify`).
//!
//! [`inspect`] opens the pool read-only, never maps the views and never replays or writes
//! anything: it decodes both header copies, checks the committed metadata journal and redo log
//! against their CRCs, rebuilds the object table and checks it (bounds, slot classes,
//! overlaps, unique names) with the same rules [`crate::Heap::open`] applies.

use crate::alloc::{Alloc, Obj, PAGE};
use crate::format::{self, Header, HEAP_VERSION};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tiermem_media::{DelayModel, OpenOptions, Pool};

/// State of one header copy.
#[derive(Debug, Clone)]
pub struct HeaderCopy {
    /// The decoded header, or why the copy is not a valid header.
    pub header: std::result::Result<Header, String>,
}

/// State of the redo log as committed by the newest header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogState {
    /// `log_len == 0`: the last checkpoint was fully applied to the image.
    Empty,
    /// A committed, non-empty log (a crash after the commit, before the apply finished): the
    /// next open replays it. `records` records, `bytes` payload bytes.
    Committed {
        /// Number of records.
        records: usize,
        /// Payload bytes.
        bytes: usize,
    },
}

/// What [`inspect`] found. `problems` empty means the image is internally consistent.
#[derive(Debug, Clone)]
pub struct Report {
    /// Pool path.
    pub path: PathBuf,
    /// Pool file size in bytes.
    pub file_size: u64,
    /// Header copy A and copy B.
    pub copies: [HeaderCopy; 2],
    /// The header in force (the valid copy with the highest `seq`), if any.
    pub header: Option<Header>,
    /// Which copy is in force (0 = A, 1 = B).
    pub active_copy: Option<usize>,
    /// Redo-log state (None when no valid header).
    pub log: Option<LogState>,
    /// The committed object table (offset → object), when it could be read.
    pub objects: BTreeMap<usize, Obj>,
    /// Pages in use by superblocks and large objects (when the table rebuilt).
    pub pages_in_use: usize,
    /// Every inconsistency found, in order (empty = consistent).
    pub problems: Vec<String>,
    /// Notes that are not errors (e.g. a committed log awaiting replay).
    pub notes: Vec<String>,
    /// Warnings: the heap opens to its last checkpoint, but something is damaged (one header
    /// copy invalid). `tiermem pheap verify` exits 1 on them too.
    pub warnings: Vec<String>,
    /// Pages whose live bytes have an image checksum in the committed journal.
    pub checksummed_pages: usize,
    /// True when the objects' image bytes were read and checked against their checksums
    /// ([`inspect`]; not [`inspect_metadata`]).
    pub data_checked: bool,
}

impl Report {
    /// Number of named objects.
    pub fn named(&self) -> usize {
        self.objects.values().filter(|o| o.name.is_some()).count()
    }

    /// Sum of the requested sizes of all objects.
    pub fn bytes_in_use(&self) -> usize {
        self.objects.values().map(|o| o.size).sum()
    }

    /// Sum of the slot sizes of all objects.
    pub fn slot_bytes(&self) -> usize {
        self.objects.values().map(|o| o.slot).sum()
    }
}

/// Inspects the checkpoint space at `path` without modifying it. `Err` only when the file
/// cannot be opened as a media pool at all (missing, wrong magic, bad pool header: the media
/// error's text); every heap-level inconsistency is a `problems` entry of the report.
pub fn inspect(path: impl AsRef<Path>) -> std::result::Result<Report, String> {
    inspect_impl(path.as_ref(), true)
}

/// [`inspect`] without reading the objects' bytes from the checkpoint image (their checksums
/// are not verified): headers, redo log and object table only. Cheap enough for a program's
/// start (the preload library uses it before replacing a previous run's heap).
pub fn inspect_metadata(path: impl AsRef<Path>) -> std::result::Result<Report, String> {
    inspect_impl(path.as_ref(), false)
}

fn inspect_impl(path: &Path, data: bool) -> std::result::Result<Report, String> {
    let path = path.to_path_buf();
    let file_size = std::fs::metadata(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    let oo = OpenOptions {
        delay: Some(DelayModel::NONE),
        writable: false,
        ..OpenOptions::default()
    };
    let pool = Pool::open(&path, &oo).map_err(|e| e.to_string())?;
    let mut r = Report {
        path: path.clone(),
        file_size,
        copies: [
            HeaderCopy {
                header: Err("not read".into()),
            },
            HeaderCopy {
                header: Err("not read".into()),
            },
        ],
        header: None,
        active_copy: None,
        log: None,
        objects: BTreeMap::new(),
        pages_in_use: 0,
        problems: Vec::new(),
        notes: Vec::new(),
        warnings: Vec::new(),
        checksummed_pages: 0,
        data_checked: false,
    };
    if pool.tag() != "pheap" {
        r.problems.push(format!(
            "pool tag is {:?}, not \"pheap\": not a persistent heap",
            pool.tag()
        ));
        return Ok(r);
    }
    for i in 0..2 {
        let mut b = [0u8; 256];
        let dec = match pool.read((i * PAGE) as u64, &mut b) {
            Ok(()) => Header::decode(&b),
            Err(e) => Err(e.to_string()),
        };
        if let Ok(h) = &dec {
            if r.header.map_or(true, |x| h.seq > x.seq) {
                r.header = Some(*h);
                r.active_copy = Some(i);
            }
        }
        r.copies[i].header = dec;
    }
    let Some(hdr) = r.header else {
        let why = |c: &HeaderCopy| c.header.as_ref().err().cloned().unwrap_or_default();
        r.problems.push(format!(
            "no valid heap header (copy A: {}; copy B: {})",
            why(&r.copies[0]),
            why(&r.copies[1])
        ));
        return Ok(r);
    };
    for (i, c) in r.copies.iter().enumerate() {
        if let Err(e) = &c.header {
            r.warnings.push(format!(
                "header copy {} is damaged ({e}); the heap opens from copy {} (its last checkpoint is intact, but one more damaged copy would lose it)",
                if i == 0 { 'A' } else { 'B' },
                if i == 0 { 'B' } else { 'A' }
            ));
        }
    }
    if hdr.version != HEAP_VERSION {
        r.problems.push(format!(
            "format version {}, this library reads version {HEAP_VERSION}",
            hdr.version
        ));
        return Ok(r);
    }
    let cap = hdr.capacity as usize;
    if cap == 0 || cap % PAGE != 0 || cap >= 1 << 40 || cap > pool.data_len() {
        r.problems.push(format!(
            "inconsistent header: heap capacity {cap} is impossible for a pool of {} data bytes",
            pool.data_len()
        ));
        return Ok(r);
    }
    let (ms, ls) = format::area_sizes(cap);
    let mut geo = Vec::new();
    if ![1, 2, 4, 8].contains(&hdr.views) {
        geo.push(format!("views {} is not 1, 2, 4 or 8", hdr.views));
    }
    if hdr.sb_size == 0 || hdr.sb_size as usize % PAGE != 0 || cap % hdr.sb_size as usize != 0 {
        geo.push(format!(
            "superblock size {} does not divide capacity {cap} in pages",
            hdr.sb_size
        ));
    }
    let meta_ok =
        hdr.meta_size as usize == ms || hdr.meta_size as usize == format::legacy_meta_size(cap);
    if !meta_ok || hdr.log_size as usize != ls {
        geo.push(format!(
            "area sizes meta {} / log {} differ from the ones capacity {cap} implies ({ms} / {ls})",
            hdr.meta_size, hdr.log_size
        ));
    }
    if geo.is_empty() && hdr.data_len() > pool.data_len() {
        geo.push(format!(
            "pool data area {} bytes is smaller than the heap needs ({})",
            pool.data_len(),
            hdr.data_len()
        ));
    }
    if hdr.meta_active > 1 {
        geo.push(format!("active metadata area {} (0 or 1)", hdr.meta_active));
    }
    if hdr.meta_len > hdr.meta_size {
        geo.push(format!(
            "metadata journal length {} exceeds its area ({})",
            hdr.meta_len, hdr.meta_size
        ));
    }
    if hdr.log_len > hdr.log_size {
        geo.push(format!(
            "redo log length {} exceeds its area ({})",
            hdr.log_len, hdr.log_size
        ));
    }
    let mut bases = vec![hdr.lib_base];
    bases.extend(hdr.view_base[..(hdr.views as usize).min(format::MAX_VIEWS)].iter());
    if bases.iter().any(|&b| b == 0 || b as usize % PAGE != 0) {
        geo.push("a view address is 0 or not page aligned".into());
    }
    if !geo.is_empty() {
        r.problems
            .extend(geo.into_iter().map(|g| format!("inconsistent header: {g}")));
        return Ok(r);
    }
    // Redo log.
    let mut log: Vec<u8> = Vec::new();
    if hdr.log_len == 0 {
        r.log = Some(LogState::Empty);
    } else {
        log = vec![0u8; hdr.log_len as usize];
        match pool.read(hdr.log_off() as u64, &mut log) {
            Err(e) => r.problems.push(format!("reading the redo log: {e}")),
            Ok(()) if crc32fast::hash(&log) != hdr.log_crc => r
                .problems
                .push("committed redo log fails its checksum".into()),
            Ok(()) => {
                let (mut p, mut records, mut bytes) = (0usize, 0usize, 0usize);
                let mut bad = None;
                while p < log.len() {
                    if p + 16 > log.len() {
                        bad = Some(format!("redo log record at {p} truncated"));
                        break;
                    }
                    // p + 16 <= log.len() (checked above): the conversions hold.
                    let off =
                        u64::from_le_bytes(log[p..p + 8].try_into().unwrap_or([0; 8])) as usize;
                    let len = u64::from_le_bytes(log[p + 8..p + 16].try_into().unwrap_or([0; 8]))
                        as usize;
                    p += 16;
                    if p.saturating_add(len) > log.len() || off.saturating_add(len) > cap {
                        bad = Some(format!("redo log record {off:#x}+{len} out of range"));
                        break;
                    }
                    p += len;
                    records += 1;
                    bytes += len;
                }
                match bad {
                    Some(b) => r.problems.push(b),
                    None => {
                        r.log = Some(LogState::Committed { records, bytes });
                        r.notes.push(format!(
                            "a committed checkpoint ({records} records, {bytes} bytes) is not yet applied to the image: the next open replays it"
                        ));
                    }
                }
            }
        }
    }
    // Metadata journal and object table.
    let mut journal = vec![0u8; hdr.meta_len as usize];
    if let Err(e) = pool.read(hdr.meta_off(hdr.meta_active) as u64, &mut journal) {
        r.problems
            .push(format!("reading the metadata journal: {e}"));
        return Ok(r);
    }
    if crc32fast::hash(&journal) != hdr.meta_crc {
        r.problems
            .push("committed metadata journal fails its checksum".into());
        return Ok(r);
    }
    let mut table = BTreeMap::new();
    let mut crcs = BTreeMap::new();
    let unit = format::crc_unit(hdr.views as usize);
    if let Err(e) = format::replay_meta(&journal, &mut table, &mut crcs, unit) {
        r.problems.push(e);
        return Ok(r);
    }
    r.objects = table.clone();
    r.checksummed_pages = crcs.len();
    match Alloc::rebuild(cap, hdr.sb_size as usize, table) {
        Ok(a) => r.pages_in_use = a.used_pages().count(),
        Err(e) => {
            r.problems.push(format!("object table: {e}"));
            return Ok(r);
        }
    }
    if data {
        // The image as the next open will see it: a committed log is applied first.
        let mut overlay: Vec<(usize, &[u8])> = Vec::new();
        let mut p = 0;
        while p + 16 <= log.len() {
            let off = u64::from_le_bytes(log[p..p + 8].try_into().unwrap_or([0; 8])) as usize;
            let len = u64::from_le_bytes(log[p + 8..p + 16].try_into().unwrap_or([0; 8])) as usize;
            // The log was validated above (every record in range) or is empty.
            let Some(b) = log.get(p + 16..p.saturating_add(16).saturating_add(len)) else {
                break;
            };
            overlay.push((off, b));
            p += 16 + len;
        }
        let mut bad = 0usize;
        let mut buf = Vec::new();
        let mut live = Vec::new();
        for (&c, &(len, crc)) in &crcs {
            live.clear();
            format::live_in_part(&r.objects, c, unit, &mut live);
            let mut h = crc32fast::Hasher::new();
            for &(lo, ll) in &live {
                buf.resize(ll, 0);
                if let Err(e) = pool.read((hdr.image_off() + lo) as u64, &mut buf) {
                    r.problems
                        .push(format!("reading the checkpoint image: {e}"));
                    return Ok(r);
                }
                for &(o, b) in &overlay {
                    let (s, e) = (o.max(lo), (o + b.len()).min(lo + ll));
                    if s < e {
                        buf[s - lo..e - lo].copy_from_slice(&b[s - o..e - o]);
                    }
                }
                h.update(&buf);
            }
            let have: usize = live.iter().map(|r| r.1).sum();
            if have != len || h.finalize() != crc {
                bad += 1;
                if bad <= 10 {
                    let o = live.first().map_or(c, |r| r.0);
                    r.problems.push(format!(
                        "checkpoint image damaged: the {len} live bytes at {c:#x} (objects from {o:#x}) fail their checksum"
                    ));
                }
            }
        }
        if bad > 10 {
            r.problems
                .push(format!("... {} more damaged parts", bad - 10));
        }
        r.data_checked = true;
    }
    Ok(r)
}
