//! Checksums of the backing files' pages: a sidecar table `<backing file>.vnvm-crc` next to
//! each private region's file, with one CRC32C per 4 KiB unit of the file as vnvm last wrote it
//! (writeback worker, recovery, reaping of a dead user).
//!
//! Why a sidecar and not `meta.pool`: the table must cover a region of any size (meta.pool has a
//! fixed geometry) and it belongs to the file's contents, not to one instance — it follows the
//! file when the instance is moved and stays true when the file is later used by another
//! instance. A file changed outside vnvm must have its table removed with it.
//!
//! Layout: a 64-byte header (`VNVMCRC1`, unit size, CRC32C of the header) then 16 bytes per
//! unit `u`: `{crc: u32, len: u32, check: u32, 0: u32}` where `crc` covers the `len` bytes at
//! `u × 4096` and `check` = CRC32C of (u, crc, len). 16 zero bytes: no checksum (vnvm never
//! wrote the unit). A unit's table entry is written (and synced) only after its data are
//! synced, and before the cache page that held it is marked clean; recovery rewrites and
//! re-checksums every unit a dirty cache page or a committed log touches, so a crash between
//! the two never leaves a stale entry behind a clean page.

use crate::error::{io_err, Result, VnvmError};
use crate::layout::u32_at;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes per checksummed unit of a backing file.
pub(crate) const UNIT: u64 = 4096;
/// Suffix of the sidecar table.
pub const SUFFIX: &str = ".vnvm-crc";
const MAGIC: &[u8; 8] = b"VNVMCRC1";
const HDR: u64 = 64;
const ENTRY: u64 = 16;

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

fn entry(unit: u64, crc: u32, len: u32) -> [u8; ENTRY as usize] {
    let mut b = [0u8; ENTRY as usize];
    b[0..4].copy_from_slice(&crc.to_le_bytes());
    b[4..8].copy_from_slice(&len.to_le_bytes());
    let c = crate::crc::append(crate::crc::crc32c(&unit.to_le_bytes()), &b[0..8]);
    b[8..12].copy_from_slice(&c.to_le_bytes());
    b
}

fn header() -> [u8; HDR as usize] {
    let mut b = [0u8; HDR as usize];
    b[0..8].copy_from_slice(MAGIC);
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
}

/// One stored checksum: the unit, its CRC and the bytes it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sum {
    pub unit: u64,
    pub crc: u32,
    pub len: u32,
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
        let t = SumTable { file, path };
        if len == 0 && writable {
            t.file
                .write_all_at(&header(), 0)
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
        if h != header() {
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
            let off = HDR + unit * ENTRY;
            if e.len() < ENTRY as usize {
                if e.iter().any(|&x| x != 0) {
                    return Err(self.damaged(off, format!("entry of page {unit} truncated")));
                }
                break;
            }
            if e.iter().all(|&x| x == 0) {
                continue;
            }
            let (crc, len) = (u32_at(e, 0), u32_at(e, 4));
            if e[..] != entry(unit, crc, len) || len == 0 || len as u64 > UNIT {
                return Err(self.damaged(
                    off,
                    format!("entry of page {unit} fails its own check (damaged table)"),
                ));
            }
            out.push(Sum { unit, crc, len });
        }
        Ok(out)
    }

    /// Store the checksum of `unit` (not synced).
    pub fn put(&self, unit: u64, crc: u32, len: u32) -> Result<()> {
        self.file
            .write_all_at(&entry(unit, crc, len), HDR + unit * ENTRY)
            .map_err(|e| io_err("write checksum table", &self.path, e))
    }

    /// Store the checksums of the consecutive units `first`, `first + 1`, … (`(crc, len)` each)
    /// with one write (not synced): a writeback's pages come in runs, and one system call per
    /// page was most of what the tables cost.
    pub fn put_run(&self, first: u64, sums: &[(u32, u32)]) -> Result<()> {
        let mut buf = Vec::with_capacity(sums.len() * ENTRY as usize);
        for (k, &(crc, len)) in sums.iter().enumerate() {
            buf.extend_from_slice(&entry(first + k as u64, crc, len));
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
    VnvmError::Damaged {
        path: backing.to_path_buf(),
        what: format!("backing-file page {} (4 KiB unit)", s.unit),
        offset: s.unit * UNIT,
        detail: format!(
            "checksum mismatch (stored {:#010x}, computed {computed:#010x}; table {}): the file \
             was damaged or changed outside vnvm",
            s.crc,
            table.display()
        ),
    }
}

/// Verify every checksummed unit of `file` (`path`) that starts below `limit` (all of them
/// with `u64::MAX`), reading the file; a unit that lies beyond the end of the file is damage too
/// (truncated). Returns the units checked.
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
            return Err(VnvmError::Damaged {
                path: path.to_path_buf(),
                what: format!("backing-file page {} (4 KiB unit)", s.unit),
                offset: start,
                detail: format!(
                    "the file is {len} bytes, its checksum table {} records {} bytes there \
                     (truncated or replaced)",
                    t.path.display(),
                    s.len
                ),
            });
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

/// Verify the checksummed units of `file` (`path`) among `units`.
pub(crate) fn verify_units(
    path: &Path,
    file: &File,
    t: &SumTable,
    units: &std::collections::HashSet<u64>,
) -> Result<()> {
    if units.is_empty() {
        return Ok(());
    }
    let mut buf = vec![0u8; UNIT as usize];
    for s in t.read_all()? {
        if !units.contains(&s.unit) {
            continue;
        }
        let b = &mut buf[..s.len as usize];
        file.read_exact_at(b, s.unit * UNIT)
            .map_err(|e| io_err("read backing file", path, e))?;
        let c = unit_crc(b);
        if c != s.crc {
            return Err(page_damaged(path, &s, c, &t.path));
        }
    }
    Ok(())
}

/// Re-checksum `units` of `file` (region of `size` bytes) from what the file holds now (after
/// recovery wrote and synced them) and sync the table.
pub(crate) fn rechecksum(
    path: &Path,
    file: &File,
    t: &SumTable,
    units: &[u64],
    size: u64,
) -> Result<()> {
    let mut buf = vec![0u8; UNIT as usize];
    for &u in units {
        let start = u * UNIT;
        if start >= size {
            continue;
        }
        let len = (size - start).min(UNIT) as usize;
        file.read_exact_at(&mut buf[..len], start)
            .map_err(|e| io_err("read back recovered page", path, e))?;
        t.put(u, unit_crc(&buf[..len]), len as u32)?;
    }
    t.sync()
}

/// The units of `[off, off + len)`.
pub(crate) fn units_of(off: u64, len: u64) -> std::ops::RangeInclusive<u64> {
    off / UNIT..=(off + len.max(1) - 1) / UNIT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trip_and_damage() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("f");
        std::fs::write(&data, vec![7u8; 10000]).unwrap();
        let f = File::open(&data).unwrap();
        let t = SumTable::open(&data, true, true, 0o600).unwrap().unwrap();
        rechecksum(&data, &f, &t, &[0, 1, 2], 10000).unwrap();
        assert_eq!(t.read_all().unwrap().len(), 3);
        assert_eq!(verify_file(&data, &f, &t, u64::MAX).unwrap(), 3);
        // A flip in the data.
        let mut b = std::fs::read(&data).unwrap();
        b[5000] ^= 1;
        std::fs::write(&data, &b).unwrap();
        let e = verify_file(&data, &f, &t, u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("backing-file page 1"), "{e}");
        b[5000] ^= 1;
        std::fs::write(&data, &b).unwrap();
        // A flip in the table.
        let mut tb = std::fs::read(&t.path).unwrap();
        tb[HDR as usize + 17] ^= 2;
        std::fs::write(&t.path, &tb).unwrap();
        assert!(t.read_all().unwrap_err().to_string().contains("own check"));
        // Truncation.
        tb[HDR as usize + 17] ^= 2;
        std::fs::write(&t.path, &tb).unwrap();
        std::fs::write(&data, vec![7u8; 5000]).unwrap();
        let e = verify_file(&data, &f, &t, u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
    }
}
