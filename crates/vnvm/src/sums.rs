//! Checksums of the backing files' pages: a sidecar table `<backing file>.vnvm-crc` next to
//! each private region's file, with the CRC32C of each 4 KiB unit of the file as vnvm last wrote
//! it, and of what the unit held before that write (writeback worker, recovery, reaping of a dead
//! user: every writer goes through [`SumTable::put_run`] before its data, and recovery and
//! reaping through [`rebuild`]).
//!
//! Why a sidecar and not `meta.pool`: the table must cover a region of any size (meta.pool has a
//! fixed geometry) and it belongs to the file's contents, not to one instance — it follows the
//! file when the instance is moved and stays true when the file is later used by another
//! instance. A file changed outside vnvm must have its table removed with it.
//!
//! Layout: a 64-byte header (`VNVMCRC2`, unit size, CRC32C of the header) then 16 bytes per
//! unit `u`: `{crc: u32, len: u32 | PREV, check: u32, prev: u32}` where `crc` covers the `len`
//! bytes at `u × 4096`, `prev` (present when the `PREV` bit is set) is the CRC of the same bytes
//! before vnvm's last write of them, and `check` = CRC32C of (u, crc, len field[, prev]).
//! 16 zero bytes: no checksum (vnvm never wrote the unit).
//!
//! The protocol that makes every crash point verifiable: a writer stores and syncs
//! `{new, prev = what the file holds now}` *before* it writes the unit's data, and writes a
//! unit's data with one `pwrite` of the whole unit (a killed process cannot tear it: the kernel
//! copies page by page and stops only between pages). So after any process crash each unit holds
//! exactly one of its two recorded contents, and recovery verifies every byte it keeps — those
//! outside the valid chunks of a dirty cache page included — against them. Once a writeback has
//! synced its data the cache page is marked clean; from then on only `crc` is right, and opening
//! the file ([`verify_file`]) accepts nothing else.
//!
//! Format 1 (`VNVMCRC1`, before the `prev` field) wrote the entry after the data: its entries are
//! read as having no `prev`, and the units of dirty cache pages (and everything after a crashed
//! recovery) of such a table cannot be verified; the header becomes format 2 once the file is
//! consistent with the table again (opened by a live process, or rebuilt).

use crate::error::{io_err, Result, VnvmError};
use crate::layout::u32_at;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes per checksummed unit of a backing file.
pub(crate) const UNIT: u64 = 4096;
/// Suffix of the sidecar table.
pub const SUFFIX: &str = ".vnvm-crc";
const MAGIC_V1: &[u8; 8] = b"VNVMCRC1";
const MAGIC: &[u8; 8] = b"VNVMCRC2";
const HDR: u64 = 64;
const ENTRY: u64 = 16;
/// Bit of the length field: the entry has a `prev` CRC.
const PREV: u32 = 1 << 31;
/// Units a rebuild reads, patches and writes at a time.
const REBUILD_BATCH: usize = 256;

/// The sidecar table of the backing file `backing`.
pub fn sidecar_path(backing: &Path) -> PathBuf {
    let mut s = backing.as_os_str().to_os_string();
    s.push(SUFFIX);
    PathBuf::from(s)
}

/// CRC32C of a unit's bytes.
pub(crate) fn unit_crc(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

fn entry(unit: u64, crc: u32, len: u32, prev: Option<u32>) -> [u8; ENTRY as usize] {
    let mut b = [0u8; ENTRY as usize];
    b[0..4].copy_from_slice(&crc.to_le_bytes());
    let lf = len | if prev.is_some() { PREV } else { 0 };
    b[4..8].copy_from_slice(&lf.to_le_bytes());
    let mut c = crate::crc::append(crate::crc::crc32c(&unit.to_le_bytes()), &b[0..8]);
    if let Some(p) = prev {
        b[12..16].copy_from_slice(&p.to_le_bytes());
        c = crate::crc::append(c, &b[12..16]);
    }
    b[8..12].copy_from_slice(&c.to_le_bytes());
    b
}

fn header(magic: &[u8; 8]) -> [u8; HDR as usize] {
    let mut b = [0u8; HDR as usize];
    b[0..8].copy_from_slice(magic);
    b[8..12].copy_from_slice(&(UNIT as u32).to_le_bytes());
    let c = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&c.to_le_bytes());
    b
}

/// A backing file's checksum table.
pub(crate) struct SumTable {
    file: File,
    /// The sidecar's path.
    pub path: PathBuf,
    /// The table's format: 1 (entries written after the data) or 2 (see the module docs).
    pub version: u8,
}

/// One stored checksum: the unit, its CRC, the bytes it covers and the CRC of what the unit
/// held before vnvm's last write of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sum {
    pub unit: u64,
    pub crc: u32,
    pub len: u32,
    pub prev: Option<u32>,
}

impl Sum {
    /// Whether bytes of CRC `c` are one of the unit's two recorded contents (what a crash in
    /// the middle of a write may leave).
    pub fn either(&self, c: u32) -> bool {
        c == self.crc || self.prev == Some(c)
    }
}

impl SumTable {
    /// Open the table of `backing`, creating it (mode `perm`) when missing and `create`;
    /// `Ok(None)` when missing and not `create`. A damaged header is [`VnvmError::Damaged`].
    pub fn open(backing: &Path, create: bool, writable: bool, perm: u32) -> Result<Option<Self>> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = sidecar_path(backing);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .create(create && writable)
            .truncate(false)
            .mode(perm)
            .open(&path);
        let file = match f {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
            Err(e) => return Err(io_err("open checksum table", &path, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| io_err("fstat checksum table", &path, e))?
            .len();
        let mut t = SumTable {
            file,
            path,
            version: 2,
        };
        if len == 0 && writable {
            t.file
                .write_all_at(&header(MAGIC), 0)
                .map_err(|e| io_err("write checksum table", &t.path, e))?;
            return Ok(Some(t));
        }
        let mut h = [0u8; HDR as usize];
        if len < HDR {
            return Err(t.damaged(0, format!("{len}-byte file has no complete header")));
        }
        t.file
            .read_exact_at(&mut h, 0)
            .map_err(|e| io_err("read checksum table", &t.path, e))?;
        if h == header(MAGIC_V1) {
            t.version = 1;
        } else if h != header(MAGIC) {
            return Err(t.damaged(0, "bad header (magic, unit size or checksum)"));
        }
        Ok(Some(t))
    }

    fn damaged(&self, offset: u64, detail: impl Into<String>) -> VnvmError {
        VnvmError::Damaged {
            path: self.path.clone(),
            what: "backing-file checksum table".into(),
            offset,
            detail: detail.into(),
        }
    }

    /// Mark a format-1 table as format 2 (not synced). Only once the backing file is
    /// consistent with the table: verified by a live open, or rebuilt and synced.
    pub fn upgrade(&mut self) -> Result<()> {
        if self.version == 1 {
            self.file
                .write_all_at(&header(MAGIC), 0)
                .map_err(|e| io_err("write checksum table", &self.path, e))?;
            self.version = 2;
        }
        Ok(())
    }

    /// Decode the entry of `unit` (`None`: all zero, no checksum).
    fn decode(&self, unit: u64, e: &[u8]) -> Result<Option<Sum>> {
        if e.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let (crc, lf) = (u32_at(e, 0), u32_at(e, 4));
        let len = lf & !PREV;
        let prev = (lf & PREV != 0).then(|| u32_at(e, 12));
        if e[..] != entry(unit, crc, len, prev) || len == 0 || len as u64 > UNIT {
            return Err(self.damaged(
                HDR + unit * ENTRY,
                format!("entry of page {unit} fails its own check (damaged table)"),
            ));
        }
        Ok(Some(Sum {
            unit,
            crc,
            len,
            prev,
        }))
    }

    /// Every stored checksum, by unit; a damaged entry is [`VnvmError::Damaged`].
    pub fn read_all(&self) -> Result<Vec<Sum>> {
        let mut b = Vec::new();
        {
            use std::io::Read;
            let mut f = &self.file;
            std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(HDR))
                .map_err(|e| io_err("read checksum table", &self.path, e))?;
            f.read_to_end(&mut b)
                .map_err(|e| io_err("read checksum table", &self.path, e))?;
        }
        let mut out = Vec::new();
        for (u, e) in b.chunks(ENTRY as usize).enumerate() {
            let unit = u as u64;
            if e.len() < ENTRY as usize {
                if e.iter().any(|&x| x != 0) {
                    return Err(self.damaged(
                        HDR + unit * ENTRY,
                        format!("entry of page {unit} truncated"),
                    ));
                }
                break;
            }
            if let Some(s) = self.decode(unit, e)? {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// The stored checksums of the units `first .. first + n` (`None` where there is none).
    pub fn read_run(&self, first: u64, n: usize) -> Result<Vec<Option<Sum>>> {
        let mut b = vec![0u8; n * ENTRY as usize];
        let mut got = 0;
        while got < b.len() {
            match self
                .file
                .read_at(&mut b[got..], HDR + first * ENTRY + got as u64)
            {
                Ok(0) => break, // beyond the end: no entries (zeros)
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("read checksum table", &self.path, e)),
            }
        }
        b.chunks(ENTRY as usize)
            .enumerate()
            .map(|(k, e)| self.decode(first + k as u64, e))
            .collect()
    }

    /// Store the entries of the consecutive units `first`, `first + 1`, … (`(crc, len, prev)`
    /// each) with one write (not synced): a writeback's pages come in runs, and one system call
    /// per page was most of what the tables cost.
    pub fn put_run(&self, first: u64, sums: &[(u32, u32, Option<u32>)]) -> Result<()> {
        let mut buf = Vec::with_capacity(sums.len() * ENTRY as usize);
        for (k, &(crc, len, prev)) in sums.iter().enumerate() {
            buf.extend_from_slice(&entry(first + k as u64, crc, len, prev));
        }
        self.file
            .write_all_at(&buf, HDR + first * ENTRY)
            .map_err(|e| io_err("write checksum table", &self.path, e))
    }

    /// fdatasync the table.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| io_err("fdatasync checksum table", &self.path, e))
    }
}

/// The error of a backing-file page whose bytes do not match their checksum.
pub(crate) fn page_damaged(backing: &Path, s: &Sum, computed: u32, table: &Path) -> VnvmError {
    let stored = match s.prev {
        Some(p) => format!("stored {:#010x}, or {p:#010x} before the last write", s.crc),
        None => format!("stored {:#010x}", s.crc),
    };
    VnvmError::Damaged {
        path: backing.to_path_buf(),
        what: format!("backing-file page {} (4 KiB unit)", s.unit),
        offset: s.unit * UNIT,
        detail: format!(
            "checksum mismatch ({stored}, computed {computed:#010x}; table {}): the file was \
             damaged or changed outside vnvm",
            table.display()
        ),
    }
}

fn truncated(path: &Path, unit: u64, len: u64, want: u64, table: &Path) -> VnvmError {
    VnvmError::Damaged {
        path: path.to_path_buf(),
        what: format!("backing-file page {unit} (4 KiB unit)"),
        offset: unit * UNIT,
        detail: format!(
            "the file is {len} bytes, its checksum table {} records {want} bytes there \
             (truncated or replaced)",
            table.display()
        ),
    }
}

/// Verify every checksummed unit of `file` (`path`) that starts below `limit` (all of them
/// with `u64::MAX`) against the CRC of its last write only — for a file nobody is writing whose
/// instance is consistent (nothing dirty: every write synced), so a unit that holds its previous
/// contents is a lost write — reading the file; a unit that lies beyond the end of the file is
/// damage too (truncated). Returns the units checked.
pub(crate) fn verify_file(path: &Path, file: &File, t: &SumTable, limit: u64) -> Result<u64> {
    let len = file.metadata().map_err(|e| io_err("fstat", path, e))?.len();
    let mut buf = vec![0u8; UNIT as usize];
    let mut n = 0;
    for s in t.read_all()? {
        let start = s.unit * UNIT;
        if start >= limit {
            continue;
        }
        if start + s.len as u64 > len {
            return Err(truncated(path, s.unit, len, s.len as u64, &t.path));
        }
        let b = &mut buf[..s.len as usize];
        file.read_exact_at(b, start)
            .map_err(|e| io_err("read backing file", path, e))?;
        let c = unit_crc(b);
        if c != s.crc {
            return Err(page_damaged(path, &s, c, &t.path));
        }
        n += 1;
    }
    Ok(n)
}

/// The units of `[off, off + len)`.
pub(crate) fn units_of(off: u64, len: u64) -> std::ops::RangeInclusive<u64> {
    off / UNIT..=(off + len.max(1) - 1) / UNIT
}

/// One write of a [`rebuild`]: `data` lands at byte `offset` of the file.
pub(crate) struct Patch<'a> {
    pub offset: u64,
    pub data: &'a [u8],
}

/// The bytes of a unit that patches cover, one bit per byte.
struct Cover([u64; UNIT as usize / 64]);

impl Cover {
    fn set(&mut self, a: usize, b: usize) {
        for i in a..b {
            self.0[i / 64] |= 1 << (i % 64);
        }
    }
    fn all(&self, len: usize) -> bool {
        (0..len).all(|i| self.0[i / 64] & (1 << (i % 64)) != 0)
    }
}

/// unit -> (patch, first byte in the unit, end in the unit), in patch order, for the bytes of
/// `patches` below `size`.
type ByUnit = BTreeMap<u64, Vec<(usize, usize, usize)>>;

fn by_unit(patches: &[Patch<'_>], size: u64) -> ByUnit {
    let mut m: ByUnit = BTreeMap::new();
    for (k, p) in patches.iter().enumerate() {
        let end = (p.offset + p.data.len() as u64).min(size);
        if p.offset >= end {
            continue;
        }
        for u in units_of(p.offset, end - p.offset) {
            let a = p.offset.max(u * UNIT);
            let b = end.min((u + 1) * UNIT);
            m.entry(u)
                .or_default()
                .push((k, (a - u * UNIT) as usize, (b - u * UNIT) as usize));
        }
    }
    m
}

/// The first half of [`rebuild`], which writes nothing: check that every unit `patches` touch
/// in the backing file `file` (`path`, a region of `size` bytes) holds one of its two recorded
/// contents in `table` (private regions; `None` for shared ones, which keep none) — unless the
/// patches cover all of its bytes (nothing of them survives), or the table is format 1 and
/// `v1_unverifiable(unit)` (that format could leave a unit newer than its entry: the units of
/// dirty cache pages, everything after a crashed recovery). Also that the file is not shorter
/// than the region.
pub(crate) fn verify_patched(
    path: &Path,
    file: &File,
    size: u64,
    table: Option<&SumTable>,
    patches: &[Patch<'_>],
    v1_unverifiable: &dyn Fn(u64) -> bool,
) -> Result<()> {
    let by_unit = by_unit(patches, size);
    if by_unit.is_empty() {
        return Ok(());
    }
    let flen = file.metadata().map_err(|e| io_err("fstat", path, e))?.len();
    let mut sums: HashMap<u64, Sum> = HashMap::new();
    if let Some(t) = table {
        for s in t.read_all()? {
            if by_unit.contains_key(&s.unit) {
                sums.insert(s.unit, s);
            }
        }
    }
    let mut buf = vec![0u8; UNIT as usize];
    for (&u, ps) in &by_unit {
        let len = (size - u * UNIT).min(UNIT) as usize;
        if u * UNIT + len as u64 > flen {
            return Err(VnvmError::Damaged {
                path: path.to_path_buf(),
                what: format!("backing-file page {u} (4 KiB unit)"),
                offset: u * UNIT,
                detail: format!(
                    "the file is {flen} bytes, shorter than its {size}-byte region (truncated \
                     or replaced)"
                ),
            });
        }
        let (Some(s), Some(t)) = (sums.get(&u), table) else {
            continue;
        };
        if t.version == 1 && v1_unverifiable(u) {
            continue;
        }
        let mut cover = Cover([0; UNIT as usize / 64]);
        for &(_, a, b) in ps {
            cover.set(a, b);
        }
        if cover.all(len) {
            continue;
        }
        if u * UNIT + s.len as u64 > flen {
            return Err(truncated(path, u, flen, s.len as u64, &t.path));
        }
        let b = &mut buf[..s.len as usize];
        file.read_exact_at(b, u * UNIT)
            .map_err(|e| io_err("read backing file", path, e))?;
        let c = unit_crc(b);
        if !s.either(c) {
            return Err(page_damaged(path, s, c, &t.path));
        }
    }
    Ok(())
}

/// Apply `patches`, in order, to the backing file `file` (`path`) of a region of `size` bytes
/// (a crashed instance's dirty cache chunks then its committed log entries, or a dead user's),
/// crash-safely and verified, then fdatasync it; returns the units written.
///
/// First [`verify_patched`] (damage fails the rebuild with the file untouched; a caller with
/// several files verifies them all first). Then, batch by batch: the new entries `{crc of the
/// result, prev = crc of the bytes read}` are written and synced, then each run of units with
/// one `pwrite` of whole units — a rebuild killed at any point leaves every unit at one of its
/// two recorded contents, and running it again gives the same result.
pub(crate) fn rebuild(
    path: &Path,
    file: &File,
    size: u64,
    table: Option<&mut SumTable>,
    patches: &[Patch<'_>],
    v1_unverifiable: &dyn Fn(u64) -> bool,
) -> Result<u64> {
    verify_patched(path, file, size, table.as_deref(), patches, v1_unverifiable)?;
    let by_unit = by_unit(patches, size);
    let unit_len = |u: u64| (size - u * UNIT).min(UNIT) as usize;
    let mut buf = vec![0u8; UNIT as usize * REBUILD_BATCH.min(by_unit.len())];
    let units: Vec<u64> = by_unit.keys().copied().collect();
    for batch in units.chunks(REBUILD_BATCH) {
        let mut entries: Vec<(u64, u32, u32, Option<u32>)> = Vec::with_capacity(batch.len());
        for (k, &u) in batch.iter().enumerate() {
            let len = unit_len(u);
            let b = &mut buf[k * UNIT as usize..k * UNIT as usize + len];
            file.read_exact_at(b, u * UNIT)
                .map_err(|e| io_err("read backing file", path, e))?;
            let before = unit_crc(b);
            for &(p, a, e) in &by_unit[&u] {
                let off = (u * UNIT + a as u64 - patches[p].offset) as usize;
                b[a..e].copy_from_slice(&patches[p].data[off..off + (e - a)]);
            }
            entries.push((u, unit_crc(b), len as u32, Some(before)));
        }
        if let Some(t) = table.as_deref() {
            for run in runs(&entries, |e| e.0) {
                let v: Vec<_> = run.iter().map(|e| (e.1, e.2, e.3)).collect();
                t.put_run(run[0].0, &v)?;
            }
            t.sync()?;
        }
        let mut k = 0;
        for run in runs(batch, |&u| u) {
            let n: usize = run.iter().map(|&u| unit_len(u)).sum();
            file.write_all_at(
                &buf[k * UNIT as usize..k * UNIT as usize + n],
                run[0] * UNIT,
            )
            .map_err(|e| io_err("write recovered pages", path, e))?;
            k += run.len();
        }
    }
    file.sync_data().map_err(|e| io_err("fdatasync", path, e))?;
    if let Some(t) = table {
        if t.version == 1 {
            t.upgrade()?;
            t.sync()?;
        }
    }
    Ok(units.len() as u64)
}

/// The runs of consecutive units of `xs` (sorted by unit).
fn runs<T>(xs: &[T], unit: impl Fn(&T) -> u64) -> impl Iterator<Item = &[T]> {
    let mut rest = xs;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut n = 1;
        while n < rest.len() && unit(&rest[n]) == unit(&rest[0]) + n as u64 {
            n += 1;
        }
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(offset: u64, data: &[u8]) -> Patch<'_> {
        Patch { offset, data }
    }

    #[test]
    fn table_round_trip_and_damage() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("f");
        std::fs::write(&data, vec![7u8; 10000]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&data)
            .unwrap();
        let mut t = SumTable::open(&data, true, true, 0o600).unwrap().unwrap();
        let one = [1u8; 10];
        let ps = [patch(0, &one), patch(5000, &one), patch(9000, &one)];
        assert_eq!(
            rebuild(&data, &f, 10000, Some(&mut t), &ps, &|_| false).unwrap(),
            3
        );
        let all = t.read_all().unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].len, 10000 - 8192);
        assert!(all.iter().all(|s| s.prev.is_some()));
        assert_eq!(verify_file(&data, &f, &t, u64::MAX).unwrap(), 3);
        // A flip in the data.
        let mut b = std::fs::read(&data).unwrap();
        assert_eq!(&b[5000..5010], &one);
        b[5100] ^= 1;
        std::fs::write(&data, &b).unwrap();
        let e = verify_file(&data, &f, &t, u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("backing-file page 1"), "{e}");
        b[5100] ^= 1;
        std::fs::write(&data, &b).unwrap();
        // A flip in the table.
        let mut tb = std::fs::read(&t.path).unwrap();
        tb[HDR as usize + 17] ^= 2;
        std::fs::write(&t.path, &tb).unwrap();
        assert!(t.read_all().unwrap_err().to_string().contains("own check"));
        // Truncation.
        tb[HDR as usize + 17] ^= 2;
        std::fs::write(&t.path, &tb).unwrap();
        std::fs::write(&data, &b[..5000]).unwrap();
        let e = verify_file(&data, &f, &t, u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    /// The writeback's protocol (entry `{new, prev}` synced before the data) leaves a unit at
    /// one of its two recorded contents at every crash point, and a rebuild verifies the bytes
    /// it keeps — those outside what the patches write — against them.
    #[test]
    fn a_rebuild_verifies_the_bytes_it_keeps_at_every_crash_point() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("f");
        std::fs::write(&data, vec![0u8; 8192]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&data)
            .unwrap();
        let mut t = SumTable::open(&data, true, true, 0o600).unwrap().unwrap();
        let five = [5u8; 50];
        rebuild(&data, &f, 8192, Some(&mut t), &[patch(100, &five)], &|_| {
            false
        })
        .unwrap();
        let r1 = std::fs::read(&data).unwrap();
        // A writeback of unit 0 (new contents: all 9s) killed after its table write.
        let old = t.read_run(0, 2).unwrap();
        assert!(old[1].is_none());
        let old = old[0].unwrap();
        assert_eq!(old.crc, unit_crc(&r1[..4096]));
        let d2 = vec![9u8; 4096];
        t.put_run(0, &[(unit_crc(&d2), 4096, Some(old.crc))])
            .unwrap();
        t.sync().unwrap();
        let chunk = [3u8; 64];
        let snapshot = t.read_all().unwrap();
        let reset = |t: &SumTable, file: &[u8]| {
            std::fs::write(&data, file).unwrap();
            let v: Vec<_> = snapshot.iter().map(|s| (s.crc, s.len, s.prev)).collect();
            t.put_run(0, &v).unwrap();
        };
        // Killed before the data: the file holds the previous contents. A flip outside the
        // patch is refused and nothing is written.
        let mut bad = r1.clone();
        bad[2000] ^= 0x10;
        reset(&t, &bad);
        let e = rebuild(&data, &f, 8192, Some(&mut t), &[patch(0, &chunk)], &|_| {
            false
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("backing-file page 0") && e.contains("before the last write"),
            "{e}"
        );
        assert_eq!(std::fs::read(&data).unwrap(), bad);
        // Unflipped, it is accepted.
        reset(&t, &r1);
        rebuild(&data, &f, 8192, Some(&mut t), &[patch(0, &chunk)], &|_| {
            false
        })
        .unwrap();
        let got = std::fs::read(&data).unwrap();
        assert_eq!(&got[..64], &chunk);
        assert_eq!(&got[64..], &r1[64..]);
        // Killed after the data: the new contents are accepted, a flip in them is not.
        let mut file2 = d2.clone();
        file2.extend_from_slice(&r1[4096..]);
        reset(&t, &file2);
        rebuild(&data, &f, 8192, Some(&mut t), &[patch(0, &chunk)], &|_| {
            false
        })
        .unwrap();
        let mut bad2 = file2.clone();
        bad2[3000] ^= 1;
        reset(&t, &bad2);
        assert!(
            rebuild(&data, &f, 8192, Some(&mut t), &[patch(0, &chunk)], &|_| {
                false
            })
            .is_err()
        );
        // Patches that cover the whole unit keep nothing of it: no check needed.
        let full = vec![4u8; 4096];
        rebuild(&data, &f, 8192, Some(&mut t), &[patch(0, &full)], &|_| {
            false
        })
        .unwrap();
        // A rebuild run twice (a recovery killed after its writes) gives the same result.
        let ps = [patch(10, &five), patch(4000, &chunk)];
        rebuild(&data, &f, 8192, Some(&mut t), &ps, &|_| false).unwrap();
        let once = std::fs::read(&data).unwrap();
        rebuild(&data, &f, 8192, Some(&mut t), &ps, &|_| false).unwrap();
        assert_eq!(std::fs::read(&data).unwrap(), once);
        assert_eq!(verify_file(&data, &f, &t, u64::MAX).unwrap(), 1);
    }

    /// A format-1 table is read; its units that format could leave unverifiable are not
    /// checked, and the rebuild upgrades it.
    #[test]
    fn a_format_1_table_is_read_and_upgraded_by_a_rebuild() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("f");
        std::fs::write(&data, vec![1u8; 4096]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&data)
            .unwrap();
        // A format-1 table whose entry is older than the file (a writeback killed between its
        // data and its entry).
        let mut tb = header(MAGIC_V1).to_vec();
        tb.extend_from_slice(&entry(0, unit_crc(&[0u8; 4096]), 4096, None));
        std::fs::write(sidecar_path(&data), &tb).unwrap();
        let mut t = SumTable::open(&data, false, true, 0).unwrap().unwrap();
        assert_eq!(t.version, 1);
        assert_eq!(t.read_all().unwrap()[0].prev, None);
        let x = [2u8; 8];
        assert!(rebuild(&data, &f, 4096, Some(&mut t), &[patch(0, &x)], &|_| false).is_err());
        rebuild(&data, &f, 4096, Some(&mut t), &[patch(0, &x)], &|u| u == 0).unwrap();
        assert_eq!(t.version, 2);
        let t = SumTable::open(&data, false, false, 0).unwrap().unwrap();
        assert_eq!(t.version, 2);
        assert_eq!(verify_file(&data, &f, &t, u64::MAX).unwrap(), 1);
    }
}
