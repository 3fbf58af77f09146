//! The lazy-page file of one region in the FAM directory, and the dumper that fills it.
//!
//! Design: `docs/migrate.md`, "Files in the FAM directory" and "Source" steps 4–6.
//!
//! ## File format (`region-<n>.lazy`, version [`LAZY_VERSION`])
//!
//! A media FAM pool (tag `mig-lazy`; pool header of [`tiermem_media::pool::HEADER_SIZE`] bytes
//! first), whose data area is `[migrate header, 4 KiB][region image, region length bytes]`.
//! Offsets below are within the migrate header (data offset 0); little-endian.
//!
//! | offset | size | field | updated |
//! |---|---|---|---|
//! | 0 | 8 | magic `TMMIGLZY` | at creation |
//! | 8 | 4 | version | at creation |
//! | 12 | 4 | page size | at creation |
//! | 16 | 8 | region length (page multiple) | at creation |
//! | 24 | 8 | image offset in the data area (4096) | at creation |
//! | 32 | 4 | journal capacity ([`JOURNAL_SLOTS`]) | at creation |
//! | 36 | 4 | zero | |
//! | 40 | 4 | CRC-32 of bytes `[0, 40)` | at creation |
//! | 64 | 8 | watermark: every byte of the image below it is dumped and persisted | 8-byte atomic |
//! | 72 | 8 | completion flag (0 or 1): the whole image is dumped and persisted | 8-byte atomic |
//! | 128 | 8 × 256 | journal of out-of-order dumped ranges; slot = 0 (empty) or `1<<63 \| len_pages<<40 \| start_page` | 8-byte atomic each |
//!
//! **Trust rule.** The writer persists image bytes before it stores (and persists) the
//! watermark, the completion flag or a journal slot that covers them, so a reader that sees
//! one of those values may trust the pages it covers. A journal slot whose range is entirely
//! below the watermark is redundant and may be reused (either value is true for a reader).
//!
//! **How image bytes become durable.** The image is written with `pwritev` from the frozen
//! region straight into the pool file (no intermediate copy). Then, per medium
//! ([`Pool::medium`]): on tmpfs (`CacheFlush`, emulated NVM) the kernel's copy went through the
//! cache into the same page-cache pages the mapping shows, so the range is persisted with
//! [`Pool::persist`] (clwb + sfence), as a persistent-memory program would; on a block-backed
//! file (`Msync`) [`Pool::persist`] is `msync(MS_SYNC)` of the range, which also writes back
//! page-cache pages dirtied by `write`; on a real DAX file system (`DaxSync`) the kernel's
//! write path already copies with cache-bypassing stores, but the preallocated (unwritten)
//! extents become written extents through file-system metadata, so we `fdatasync` the file.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tiermem_media::pool::HEADER_SIZE as POOL_HEADER_SIZE;
use tiermem_media::{
    DelayModel, MediaError, OpenOptions, PersistMethod, Pool, PoolKind, PoolOptions,
};

/// Magic at offset 0 of the migrate header.
pub const LAZY_MAGIC: [u8; 8] = *b"TMMIGLZY";
/// The lazy-file format version this build reads and writes.
pub const LAZY_VERSION: u32 = 1;
/// Pool tag of lazy files.
pub const LAZY_TAG: &str = "mig-lazy";
/// Size of the migrate header at the start of the pool's data area (the image follows it).
pub const MIG_HEADER_SIZE: u64 = 4096;
/// Number of journal slots for out-of-order (on-demand) dumped ranges.
pub const JOURNAL_SLOTS: usize = 256;
/// Largest I/O vector: 2 MiB of contiguous region offsets, 2 MiB aligned.
pub const VECTOR_SIZE: u64 = 2 << 20;
/// Largest byte count of one `pwritev` (Linux `MAX_RW_COUNT`, 2 GiB − 4 KiB).
pub const MAX_WRITE_BYTES: u64 = 0x7fff_f000;
/// Largest number of iovecs per `pwritev` (Linux `IOV_MAX`).
pub const MAX_IOVECS: usize = 1024;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_PAGE: usize = 12;
const OFF_LEN: usize = 16;
const OFF_IMAGE: usize = 24;
const OFF_JCAP: usize = 32;
const OFF_CRC: usize = 40;
const OFF_WATERMARK: usize = 64;
const OFF_COMPLETE: usize = 72;
const OFF_JOURNAL: usize = 128;
const ENTRY_VALID: u64 = 1 << 63;
const ENTRY_LEN_SHIFT: u32 = 40;
const ENTRY_START_MASK: u64 = (1 << 40) - 1;
const ENTRY_LEN_MASK: u64 = (1 << 22) - 1;

/// Errors of lazy files and the dumper. Messages name the file and, for format errors, the
/// header field.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    /// The media layer refused (pool header corrupt, truncated file — `SizeMismatch` —,
    /// no space at reservation — `NoSpace` —, missing directory, ...).
    #[error(transparent)]
    Media(#[from] MediaError),
    /// The migrate header does not start with [`LAZY_MAGIC`], or the pool is not a lazy file.
    #[error("{} is not a migration lazy-page file: {reason}", path.display())]
    NotLazyFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The migrate header has another format version.
    #[error(
        "{} has lazy-file format version {found} (field `version`), but this build supports \
         version {supported}: migrate between matching tiermem releases",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Version this build supports.
        supported: u32,
    },
    /// The CRC of the fixed migrate-header fields does not match.
    #[error(
        "corrupt migrate header in {}: field `crc` is {stored:#010x} but the fixed fields hash \
         to {computed:#010x}; the file cannot be trusted",
        path.display()
    )]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// A header field is out of range or inconsistent with the file.
    #[error("bad migrate header in {}: field `{field}`: {reason}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The header field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A request outside the region, or not page aligned.
    #[error(
        "offset {offset} (length {len}) is outside the {region_len}-byte region or misaligned"
    )]
    OutOfRange {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Region length.
        region_len: u64,
    },
    /// [`LazyFile::page`] of a page the file does not (yet) show as dumped.
    #[error("page at offset {offset} of {} is not dumped yet", path.display())]
    NotDumped {
        /// The file.
        path: PathBuf,
        /// Page offset.
        offset: u64,
    },
    /// An argument is unacceptable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A system call failed.
    #[error("{op} on {} failed: {source}", path.display())]
    Io {
        /// The call.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, LazyError>;

fn encode_entry(start: u64, len: u64, page: u64) -> u64 {
    ENTRY_VALID | ((len / page) << ENTRY_LEN_SHIFT) | (start / page)
}

fn decode_entry(e: u64, page: u64) -> Option<(u64, u64)> {
    if e & ENTRY_VALID == 0 {
        return None;
    }
    let start = (e & ENTRY_START_MASK) * page;
    let len = ((e >> ENTRY_LEN_SHIFT) & ENTRY_LEN_MASK) * page;
    Some((start, len))
}

/// One region's lazy-page file: a FAM pool holding the migrate header and the region image.
///
/// Created writable by the source ([`LazyFile::create`]) or opened read-only by the target
/// ([`LazyFile::open`]). Send + Sync; header fields are read and written as 8-byte atomics.
#[derive(Debug)]
pub struct LazyFile {
    pool: Pool,
    region_len: u64,
    page: u64,
}

impl LazyFile {
    /// Create `dir/name` for a region of `region_len` bytes (a positive multiple of the page
    /// size), reserving the whole file up front (the media layer's statvfs check and
    /// `posix_fallocate`): a directory without room fails here with
    /// `LazyError::Media(MediaError::NoSpace)` and leaves no file, before anything is dumped.
    /// The header (watermark 0, not complete, empty journal) is persisted on return. `delay`
    /// is charged on every dump write.
    pub fn create(dir: &Path, name: &str, region_len: u64, delay: DelayModel) -> Result<LazyFile> {
        let page = tiermem_media::persist::page_size() as u64;
        if region_len == 0 || region_len % page != 0 {
            return Err(LazyError::InvalidArgument(format!(
                "region length {region_len} must be a positive multiple of the {page}-byte page"
            )));
        }
        if region_len / page > ENTRY_START_MASK {
            return Err(LazyError::InvalidArgument(format!(
                "region length {region_len} is too large for the journal encoding"
            )));
        }
        let size = POOL_HEADER_SIZE + MIG_HEADER_SIZE + region_len;
        let path = dir.join(name);
        let pool = Pool::create(
            &path,
            &PoolOptions::new(size)
                .kind(PoolKind::Fam)
                .tag(LAZY_TAG)
                .delay(delay),
        )?;
        let mut h = vec![0u8; MIG_HEADER_SIZE as usize];
        h[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&LAZY_MAGIC);
        h[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&LAZY_VERSION.to_le_bytes());
        h[OFF_PAGE..OFF_PAGE + 4].copy_from_slice(&(page as u32).to_le_bytes());
        h[OFF_LEN..OFF_LEN + 8].copy_from_slice(&region_len.to_le_bytes());
        h[OFF_IMAGE..OFF_IMAGE + 8].copy_from_slice(&MIG_HEADER_SIZE.to_le_bytes());
        h[OFF_JCAP..OFF_JCAP + 4].copy_from_slice(&(JOURNAL_SLOTS as u32).to_le_bytes());
        let crc = crc32fast::hash(&h[..OFF_CRC]);
        h[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        let cleanup = |e: MediaError| {
            let _ = std::fs::remove_file(&path);
            LazyError::from(e)
        };
        pool.write_persist(0, &h).map_err(cleanup)?;
        Ok(LazyFile {
            pool,
            region_len,
            page,
        })
    }

    /// Open a lazy file read-only (the target side), mapped, with the delay model charged on
    /// page reads. Validates the pool header (media layer: magic, version, checksum, size =
    /// file size, so a truncated file fails with `MediaError::SizeMismatch`), then the migrate
    /// header: magic ([`LazyError::NotLazyFile`]), version ([`LazyError::Version`]), CRC
    /// ([`LazyError::Checksum`]), then page size, image offset, journal capacity, region length
    /// against the file size, watermark, completion flag and journal entries
    /// ([`LazyError::Field`], naming the field).
    pub fn open(path: &Path, delay: DelayModel) -> Result<LazyFile> {
        let pool = Pool::open(path, &OpenOptions::default().writable(false).delay(delay))?;
        Self::validate(pool)
    }

    /// Open read-write (for tests and tools that repair or extend a file); same checks as
    /// [`LazyFile::open`].
    pub fn open_writable(path: &Path, delay: DelayModel) -> Result<LazyFile> {
        let pool = Pool::open(path, &OpenOptions::default().writable(true).delay(delay))?;
        Self::validate(pool)
    }

    fn validate(pool: Pool) -> Result<LazyFile> {
        let path = pool.path().to_path_buf();
        let not = |reason: String| LazyError::NotLazyFile {
            path: path.clone(),
            reason,
        };
        if pool.kind() != PoolKind::Fam || pool.tag() != LAZY_TAG {
            return Err(not(format!(
                "pool kind {:?} tag {:?} (expected Fam, {LAZY_TAG:?})",
                pool.kind(),
                pool.tag()
            )));
        }
        if (pool.data_len() as u64) < MIG_HEADER_SIZE {
            return Err(not("data area smaller than the migrate header".into()));
        }
        // SAFETY: the data area is at least MIG_HEADER_SIZE bytes of the live mapping, which
        // lives as long as `pool`; the slice is dropped before `pool` moves. It covers only the
        // fixed fields, never written after creation (the mutable ones are read as atomics).
        let h = unsafe { std::slice::from_raw_parts(pool.data_ptr(), OFF_WATERMARK) };
        if h[OFF_MAGIC..OFF_MAGIC + 8] != LAZY_MAGIC {
            return Err(not("field `magic` is not \"TMMIGLZY\"".into()));
        }
        // Only called with the fixed OFF_* constants below OFF_WATERMARK = h.len().
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(OFF_VERSION);
        if version != LAZY_VERSION {
            return Err(LazyError::Version {
                path,
                found: version,
                supported: LAZY_VERSION,
            });
        }
        let stored = u32_at(OFF_CRC);
        let computed = crc32fast::hash(&h[..OFF_CRC]);
        if stored != computed {
            return Err(LazyError::Checksum {
                path,
                stored,
                computed,
            });
        }
        let field = |field: &'static str, reason: String| LazyError::Field {
            path: path.clone(),
            field,
            reason,
        };
        let page = u32_at(OFF_PAGE) as u64;
        let sys_page = tiermem_media::persist::page_size() as u64;
        if page != sys_page {
            return Err(field(
                "page_size",
                format!("{page}, but this host's page size is {sys_page}"),
            ));
        }
        if u64_at(OFF_IMAGE) != MIG_HEADER_SIZE {
            return Err(field(
                "image_offset",
                format!("{} (expected {MIG_HEADER_SIZE})", u64_at(OFF_IMAGE)),
            ));
        }
        if u32_at(OFF_JCAP) as usize != JOURNAL_SLOTS {
            return Err(field(
                "journal_capacity",
                format!("{} (expected {JOURNAL_SLOTS})", u32_at(OFF_JCAP)),
            ));
        }
        let region_len = u64_at(OFF_LEN);
        let image_room = pool.data_len() as u64 - MIG_HEADER_SIZE;
        if region_len == 0 || region_len % page != 0 || region_len != image_room {
            return Err(field(
                "region_length",
                format!(
                    "{region_len} bytes, but the file holds a {image_room}-byte image (or it is \
                     not a positive page multiple)"
                ),
            ));
        }
        let f = LazyFile {
            pool,
            region_len,
            page,
        };
        let field = |field: &'static str, reason: String| LazyError::Field {
            path: f.path().to_path_buf(),
            field,
            reason,
        };
        let wm = f.watermark();
        if wm > region_len || wm % page != 0 {
            return Err(field(
                "watermark",
                format!("{wm} is beyond the {region_len}-byte region or not page aligned"),
            ));
        }
        let done = f.hdr_atomic(OFF_COMPLETE).load(Ordering::Acquire);
        if done > 1 || (done == 1 && wm != region_len) {
            return Err(field(
                "complete",
                format!("{done} with watermark {wm} of {region_len}"),
            ));
        }
        for i in 0..JOURNAL_SLOTS {
            let e = f.hdr_atomic(OFF_JOURNAL + 8 * i).load(Ordering::Acquire);
            if e == 0 {
                continue;
            }
            match decode_entry(e, page) {
                Some((s, l)) if l > 0 && l <= VECTOR_SIZE && s + l <= region_len => {}
                _ => {
                    return Err(field(
                        "journal",
                        format!("slot {i} holds {e:#018x}, not a range inside the region"),
                    ))
                }
            }
        }
        Ok(f)
    }

    fn hdr_atomic(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= MIG_HEADER_SIZE as usize);
        // SAFETY: `off` is an 8-aligned offset inside the header page of the live mapping
        // (page aligned, so the address is 8-aligned); the bytes are only ever accessed as
        // this atomic by this crate (the fixed fields, read as bytes, are never written after
        // creation). The reference lives no longer than `self`, which owns the mapping.
        unsafe { &*(self.pool.data_ptr().add(off) as *const AtomicU64) }
    }

    fn publish(&self, off: usize, value: u64) -> Result<()> {
        self.hdr_atomic(off).store(value, Ordering::Release);
        self.pool.persist(off as u64, 8)?;
        Ok(())
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.pool.path()
    }
    /// The region length in bytes.
    pub fn region_len(&self) -> u64 {
        self.region_len
    }
    /// The page size recorded in the header.
    pub fn page_size(&self) -> u64 {
        self.page
    }
    /// The underlying pool (stats, delay model).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
    /// File offset of region offset 0 (pool header + migrate header).
    pub fn image_file_offset(&self) -> u64 {
        self.pool.header().data_offset + MIG_HEADER_SIZE
    }
    /// Every image byte below this region offset is dumped and persisted (read now from the
    /// file; a page multiple, at most the region length).
    pub fn watermark(&self) -> u64 {
        self.hdr_atomic(OFF_WATERMARK).load(Ordering::Acquire)
    }
    /// True once the whole image is dumped and persisted (the source may be gone).
    pub fn is_complete(&self) -> bool {
        self.hdr_atomic(OFF_COMPLETE).load(Ordering::Acquire) == 1
    }
    /// The journal's valid ranges `(offset, length)` as the file shows them now.
    pub fn journal(&self) -> Vec<(u64, u64)> {
        (0..JOURNAL_SLOTS)
            .filter_map(|i| {
                decode_entry(
                    self.hdr_atomic(OFF_JOURNAL + 8 * i).load(Ordering::Acquire),
                    self.page,
                )
            })
            .collect()
    }
    /// True when the page holding region offset `offset` is dumped and persisted according to
    /// the file: complete, below the watermark, or inside a journal range. False for offsets
    /// outside the region. Never true for a page that is not yet persisted.
    pub fn dumped(&self, offset: u64) -> bool {
        if offset >= self.region_len {
            return false;
        }
        if self.is_complete() || offset < self.watermark() {
            return true;
        }
        (0..JOURNAL_SLOTS).any(|i| {
            let e = self.hdr_atomic(OFF_JOURNAL + 8 * i).load(Ordering::Acquire);
            matches!(decode_entry(e, self.page), Some((s, l)) if offset >= s && offset < s + l)
        })
    }
    /// The mapped page holding region offset `offset`, after checking [`LazyFile::dumped`]
    /// ([`LazyError::NotDumped`] otherwise); charges the read delay for one page.
    pub fn page(&self, offset: u64) -> Result<&[u8]> {
        if !self.dumped(offset) {
            if offset >= self.region_len {
                return Err(self.out_of_range(offset, self.page));
            }
            return Err(LazyError::NotDumped {
                path: self.path().to_path_buf(),
                offset: offset / self.page * self.page,
            });
        }
        self.range_trusted(offset / self.page * self.page, self.page)
    }
    /// The mapped bytes `[offset, offset + len)` of the image without consulting the header —
    /// for a caller that learned from the page-server that the range is dumped (a journal that
    /// was full). Page-aligned; charges the read delay for `len` bytes.
    pub fn range_trusted(&self, offset: u64, len: u64) -> Result<&[u8]> {
        let r = self.range_uncharged(offset, len)?;
        self.pool.charge_read(len);
        Ok(r)
    }

    /// As [`LazyFile::range_trusted`] with no read delay charged: the caller copies out of the
    /// range and then charges the read as pacing ([`LazyFile::charge_read_paced`]), so the
    /// copy counts as part of the medium's time, the rule of the dump's writes.
    pub fn range_uncharged(&self, offset: u64, len: u64) -> Result<&[u8]> {
        if offset % self.page != 0
            || len % self.page != 0
            || !matches!(offset.checked_add(len), Some(e) if e <= self.region_len)
        {
            return Err(self.out_of_range(offset, len));
        }
        // SAFETY: bounds checked against the image inside the live mapping owned by `self`;
        // the lifetime of the slice is tied to `&self`. The source may still write other
        // pages of the file, never these (they are dumped, the region is frozen).
        Ok(unsafe {
            std::slice::from_raw_parts(
                self.pool
                    .data_ptr()
                    .add((MIG_HEADER_SIZE + offset) as usize),
                len as usize,
            )
        })
    }

    /// Copy image bytes `offset..offset + buf.len()` into `buf` with `pread(2)`, charging
    /// nothing ([`Pool::pread_uncharged`]: no page-table entries of this mapping are built, as
    /// a bulk copy through [`LazyFile::range_uncharged`] would). Only meaningful for dumped
    /// pages. Errors: out of range, the read failing.
    pub fn read_uncharged(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        if offset % self.page != 0
            || len % self.page != 0
            || !matches!(offset.checked_add(len), Some(e) if e <= self.region_len)
        {
            return Err(self.out_of_range(offset, len));
        }
        Ok(self.pool.pread_uncharged(MIG_HEADER_SIZE + offset, buf)?)
    }

    /// Charges a read of `len` bytes that started at `since_ns` (`tiermem_media::now_ns`) as
    /// pacing: it ends no earlier than the medium's time for it after its start.
    pub fn charge_read_paced(&self, len: u64, since_ns: u64) {
        self.pool.charge_read_paced(len, since_ns);
    }

    fn out_of_range(&self, offset: u64, len: u64) -> LazyError {
        LazyError::OutOfRange {
            offset,
            len,
            region_len: self.region_len,
        }
    }

    /// Pre-copy: write `src` (a page-aligned range of a region that may still be running) at
    /// image offset `offset` and persist it. It publishes nothing: pages written this way
    /// count as dumped only once [`LazyFile::mark_complete`] is called, after the region was
    /// frozen and its last written pages were copied (a running region may change them again).
    pub fn write_image(&self, offset: u64, src: &[u8]) -> Result<()> {
        let len = src.len() as u64;
        if offset % self.page != 0
            || len % self.page != 0
            || !matches!(offset.checked_add(len), Some(e) if e <= self.region_len)
        {
            return Err(self.out_of_range(offset, len));
        }
        if len == 0 {
            return Ok(());
        }
        let mut iov = [libc::iovec {
            iov_base: src.as_ptr() as *mut libc::c_void,
            iov_len: src.len(),
        }];
        pwritev_all(
            self.pool.as_raw_fd(),
            &mut iov,
            self.image_file_offset() + offset,
            self.path(),
        )?;
        self.persist_image(offset, len)?;
        self.pool.charge_write(len);
        Ok(())
    }

    /// Pre-copy: every page of the image is final (the region is frozen and its last written
    /// pages were written with [`LazyFile::write_image`]): publish the watermark and the
    /// completion flag.
    pub fn mark_complete(&self) -> Result<()> {
        self.publish(OFF_WATERMARK, self.region_len)?;
        self.publish(OFF_COMPLETE, 1)
    }

    /// Make image range `[offset, offset + len)` durable after it was written with `pwritev`
    /// (see the module docs for the choice per medium).
    fn persist_image(&self, offset: u64, len: u64) -> Result<()> {
        match self.pool.medium() {
            PersistMethod::DaxSync => {
                // SAFETY: the fd is open for the pool's life.
                if unsafe { libc::fdatasync(self.pool.as_raw_fd()) } != 0 {
                    return Err(LazyError::Io {
                        op: "fdatasync",
                        path: self.path().to_path_buf(),
                        source: std::io::Error::last_os_error(),
                    });
                }
                Ok(())
            }
            PersistMethod::CacheFlush | PersistMethod::Msync => self
                .pool
                .persist(MIG_HEADER_SIZE + offset, len as usize)
                .map_err(LazyError::from),
        }
    }

    /// Append `[start, start + len)` to the journal (reusing a slot made redundant by the
    /// watermark if all are taken) and persist it. The data must already be persisted.
    /// Returns false (nothing written) when every slot holds a range above the watermark.
    fn journal_append(&self, start: u64, len: u64) -> Result<bool> {
        let wm = self.watermark();
        for i in 0..JOURNAL_SLOTS {
            let off = OFF_JOURNAL + 8 * i;
            let e = self.hdr_atomic(off).load(Ordering::Acquire);
            let free = match decode_entry(e, self.page) {
                None => true,
                Some((s, l)) => s + l <= wm,
            };
            if free {
                self.publish(off, encode_entry(start, len, self.page))?;
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// How the background dumper groups vectors into `pwritev` calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    /// One `pwritev` per 2 MiB vector (as CRIU dumps).
    PerVector,
    /// One `pwritev` per batch of consecutive not-yet-dumped vectors, at most `max_bytes`
    /// (clamped to [`MAX_WRITE_BYTES`]) and [`MAX_IOVECS`] iovecs per call (thesis §3.3.3).
    /// A page-server request waits for the whole batch in flight, so large batches lengthen
    /// on-demand latency (up to ~1 s for a 2 GiB batch at 2 GB/s).
    Batched {
        /// Bytes per call; clamped to `[VECTOR_SIZE, MAX_WRITE_BYTES]`.
        max_bytes: u64,
    },
}

impl Batching {
    /// `Batched` with the largest batch one call can take.
    pub const MAX: Batching = Batching::Batched {
        max_bytes: MAX_WRITE_BYTES,
    };
}

/// Dumper counters (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DumpStats {
    /// Image bytes written.
    pub bytes: u64,
    /// Vectors written (background and on demand).
    pub vectors: u64,
    /// Of which on demand.
    pub demand_vectors: u64,
    /// `pwritev` calls.
    pub syscalls: u64,
    /// Persist operations on the image (one per write batch or on-demand vector).
    pub persists: u64,
    /// Seconds spent writing, persisting and in the delay model (background and on demand).
    pub secs: f64,
    /// Of which in `pwritev`.
    pub write_secs: f64,
    /// Of which persisting the image.
    pub persist_secs: f64,
}

/// The pause/resume handshake between the background dumper and the page-server.
///
/// The background dumper brackets every batch with `begin`/`end`; a [`DumpControl::pause`]
/// waits for the batch in flight to finish, then holds the dumper off until the returned guard
/// drops. Pause requests take priority over the dumper's next batch.
#[derive(Debug, Default)]
pub struct DumpControl {
    state: Mutex<Ctl>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct Ctl {
    busy: bool,
    waiting: usize,
}

/// Holds the background dumper paused (and gives its holder exclusive write access to the
/// lazy file) until dropped.
#[derive(Debug)]
pub struct PauseGuard<'a> {
    ctl: &'a DumpControl,
}

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.ctl.state.lock();
        s.busy = false;
        self.ctl.cv.notify_all();
    }
}

impl DumpControl {
    /// Wait for the vector (or batch) being written to finish, then keep the dumper paused
    /// until the guard drops. Concurrent pausers are serialised.
    pub fn pause(&self) -> PauseGuard<'_> {
        let mut s = self.state.lock();
        s.waiting += 1;
        while s.busy {
            self.cv.wait(&mut s);
        }
        s.waiting -= 1;
        s.busy = true;
        PauseGuard { ctl: self }
    }

    fn begin(&self) {
        let mut s = self.state.lock();
        while s.busy || s.waiting > 0 {
            self.cv.wait(&mut s);
        }
        s.busy = true;
    }

    fn end(&self) {
        let mut s = self.state.lock();
        s.busy = false;
        self.cv.notify_all();
    }
}

/// What [`Dumper::dump_vector_containing`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DemandOutcome {
    /// Region offset of the vector holding the requested offset.
    pub start: u64,
    /// Its length.
    pub len: u64,
    /// True when it had been dumped before (nothing written).
    pub already: bool,
    /// False when the journal had no free slot: the vector is persisted but only the reply
    /// tells the target (it must trust it with [`LazyFile::range_trusted`]).
    pub journaled: bool,
    /// The watermark at the time of the reply (the dumper's progress).
    pub watermark: u64,
}

/// The source-side dumper of one frozen region into its [`LazyFile`].
///
/// Vectors are the 2 MiB-aligned, at most 2 MiB ranges of region offsets. The background dump
/// ([`Dumper::run_background`], once) writes them in ascending order, skipping vectors
/// already dumped on demand ([`Dumper::dump_vector_containing`], from page-server threads).
pub struct Dumper {
    file: Arc<LazyFile>,
    base: *const u8,
    len: u64,
    batching: Batching,
    control: DumpControl,
    vec_done: Vec<AtomicBool>,
    started: AtomicBool,
    bytes: AtomicU64,
    vectors: AtomicU64,
    demand: AtomicU64,
    syscalls: AtomicU64,
    persists: AtomicU64,
    nanos: AtomicU64,
    write_nanos: AtomicU64,
    persist_nanos: AtomicU64,
    next: AtomicUsize,
    /// Skip vectors whose pages were never touched (see [`Dumper::set_skip_untouched`]).
    skip_untouched: AtomicBool,
    /// Discard the source's pages of each run once it is dumped and persisted.
    release_dumped: AtomicBool,
    /// Vectors skipped that way.
    skipped: AtomicU64,
    /// Vectors to dump before the ascending sweep (see [`Dumper::set_hot_vectors`]).
    hot: Mutex<Vec<usize>>,
    /// Hot vectors dumped (and journaled) first.
    hot_dumped: AtomicU64,
}

// SAFETY: `base` points at a frozen memory range that the creator of the Dumper promised (in
// `Dumper::new`) stays mapped and unmodified for the Dumper's life; the Dumper only reads it
// (as the source of pwritev). All other state is atomics, a mutex, or the Sync LazyFile.
unsafe impl Send for Dumper {}
// SAFETY: see above.
unsafe impl Sync for Dumper {}

impl std::fmt::Debug for Dumper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dumper")
            .field("file", &self.file.path())
            .field("len", &self.len)
            .field("batching", &self.batching)
            .finish()
    }
}

impl Dumper {
    /// A dumper of the `len` bytes at `base` into `file` (writable, `len` = its region length).
    ///
    /// # Safety
    /// `[base, base + len)` must be readable memory of this process that stays mapped and is
    /// not modified (the region is frozen) for the whole life of the Dumper.
    pub unsafe fn new(
        file: Arc<LazyFile>,
        base: *const u8,
        len: u64,
        batching: Batching,
    ) -> Result<Dumper> {
        if len != file.region_len() {
            return Err(LazyError::InvalidArgument(format!(
                "region is {len} bytes but {} holds {} bytes",
                file.path().display(),
                file.region_len()
            )));
        }
        if !file.pool().is_writable() {
            return Err(LazyError::InvalidArgument(format!(
                "{} is opened read-only",
                file.path().display()
            )));
        }
        let nvec = len.div_ceil(VECTOR_SIZE) as usize;
        let wm = file.watermark();
        Ok(Dumper {
            vec_done: (0..nvec)
                .map(|i| AtomicBool::new((i as u64 + 1) * VECTOR_SIZE <= wm))
                .collect(),
            next: AtomicUsize::new((wm / VECTOR_SIZE) as usize),
            file,
            base,
            len,
            batching,
            control: DumpControl::default(),
            started: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            vectors: AtomicU64::new(0),
            demand: AtomicU64::new(0),
            syscalls: AtomicU64::new(0),
            persists: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            write_nanos: AtomicU64::new(0),
            persist_nanos: AtomicU64::new(0),
            skip_untouched: AtomicBool::new(false),
            release_dumped: AtomicBool::new(false),
            skipped: AtomicU64::new(0),
            hot: Mutex::new(Vec::new()),
            hot_dumped: AtomicU64::new(0),
        })
    }

    /// The lazy file.
    pub fn file(&self) -> &Arc<LazyFile> {
        &self.file
    }
    /// The pause/resume handshake (the page-server pauses through it implicitly in
    /// [`Dumper::dump_vector_containing`]; tests and tools may pause explicitly).
    pub fn control(&self) -> &DumpControl {
        &self.control
    }
    /// Number of vectors in the region.
    pub fn vector_count(&self) -> usize {
        self.vec_done.len()
    }
    /// A snapshot of the counters.
    pub fn stats(&self) -> DumpStats {
        DumpStats {
            bytes: self.bytes.load(Ordering::Relaxed),
            vectors: self.vectors.load(Ordering::Relaxed),
            demand_vectors: self.demand.load(Ordering::Relaxed),
            syscalls: self.syscalls.load(Ordering::Relaxed),
            persists: self.persists.load(Ordering::Relaxed),
            secs: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            write_secs: self.write_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            persist_secs: self.persist_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    fn vector(&self, i: usize) -> (u64, u64) {
        let s = i as u64 * VECTOR_SIZE;
        (s, VECTOR_SIZE.min(self.len - s))
    }

    /// Write vectors `[first, first + n)` (contiguous) with pwritev calls, persist, charge.
    /// Caller holds the write slot (busy).
    /// Skip vectors of which no page was ever touched in this process (neither present nor
    /// swapped, per `/proc/self/pagemap`): they are zeros, which the reserved lazy file
    /// already reads as. A sparse region (a big heap mostly unused) then dumps only what it
    /// uses. Off by default; without a readable pagemap nothing is skipped.
    pub fn set_skip_untouched(&self, on: bool) {
        self.skip_untouched.store(on, Ordering::Relaxed);
    }

    /// Discard the source region's pages of each run once it is dumped and persisted
    /// (`MADV_DONTNEED`): FAM holds them from then on, and a source host whose application
    /// left gets its memory back as the dump goes rather than at the end. Every vector is
    /// dumped once (the page-server pauses the sweep and checks what is done), so nothing
    /// reads a discarded page.
    ///
    /// # Safety
    /// Nothing may read the region (given to [`Dumper::new`]) after the checkpoint but this
    /// dumper: its pages read as zeros once dumped.
    pub unsafe fn set_release_dumped(&self, on: bool) {
        self.release_dumped.store(on, Ordering::Relaxed);
    }

    /// Vectors skipped as never touched.
    pub fn skipped_vectors(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Dump the vectors with these indices (in this order) before the ascending sweep, each
    /// recorded in the journal as an out-of-order range so a target sees it at once (the
    /// hot-page manifest, [`crate::hot`]). Indices past the region are ignored; only as many
    /// as the journal has free slots are dumped first (the rest are left to the sweep). Call before [`Dumper::run_background`].
    pub fn set_hot_vectors(&self, vectors: &[u64]) {
        let n = self.vec_done.len() as u64;
        *self.hot.lock() = vectors
            .iter()
            .filter(|&&v| v < n)
            .map(|&v| v as usize)
            .collect();
    }

    /// Hot vectors dumped first (and journaled) so far.
    pub fn hot_vectors_dumped(&self) -> u64 {
        self.hot_dumped.load(Ordering::Relaxed)
    }

    /// The hot vectors, one per batch slot so page-server requests interleave.
    fn dump_hot(&self) -> Result<()> {
        let hot = std::mem::take(&mut *self.hot.lock());
        let mut free = (0..JOURNAL_SLOTS)
            .filter(|&i| {
                decode_entry(
                    self.file
                        .hdr_atomic(OFF_JOURNAL + 8 * i)
                        .load(Ordering::Acquire),
                    self.file.page,
                )
                .is_none()
            })
            .count();
        for i in hot {
            if free == 0 {
                break;
            }
            self.control.begin();
            let r = (|| -> Result<()> {
                if self.vec_done[i].load(Ordering::Acquire) {
                    return Ok(());
                }
                self.write_vectors(i, 1)?;
                let (start, len) = self.vector(i);
                // Without a slot (taken on demand meanwhile) the target learns of the vector
                // when the watermark passes it (or from a page-server reply).
                if self.file.journal_append(start, len)? {
                    self.hot_dumped.fetch_add(1, Ordering::Relaxed);
                    free -= 1;
                } else {
                    free = 0;
                }
                self.vec_done[i].store(true, Ordering::Release);
                Ok(())
            })();
            self.control.end();
            r?;
        }
        Ok(())
    }

    /// Whether any page of vector `i` was ever touched (present or swapped); `true` when that
    /// cannot be known.
    fn touched(&self, i: usize) -> bool {
        use std::os::unix::fs::FileExt;
        static PAGEMAP: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
        let Some(pm) = PAGEMAP.get_or_init(|| std::fs::File::open("/proc/self/pagemap").ok())
        else {
            return true;
        };
        let (s, l) = self.vector(i);
        let first = (self.base as u64 + s) / 4096;
        let pages = l.div_ceil(4096) as usize;
        let mut buf = vec![0u8; pages * 8];
        if pm.read_exact_at(&mut buf, first * 8).is_err() {
            return true;
        }
        buf.chunks_exact(8)
            // chunks_exact(8) yields 8-byte slices only.
            .any(|e| u64::from_le_bytes(e.try_into().unwrap()) & (3 << 62) != 0)
    }

    fn write_vectors(&self, first: usize, n: usize) -> Result<()> {
        if self.skip_untouched.load(Ordering::Relaxed) {
            // Write the runs of touched vectors; untouched ones stay the file's zeros.
            let mut i = first;
            while i < first + n {
                if !self.touched(i) {
                    self.skipped.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                    continue;
                }
                let mut j = i + 1;
                while j < first + n && self.touched(j) {
                    j += 1;
                }
                self.write_run(i, j - i)?;
                i = j;
            }
            return Ok(());
        }
        self.write_run(first, n)
    }

    fn write_run(&self, first: usize, n: usize) -> Result<()> {
        let t0 = Instant::now();
        let since = tiermem_media::now_ns();
        let (start, _) = self.vector(first);
        let mut iovs: Vec<libc::iovec> = (first..first + n)
            .map(|i| {
                let (s, l) = self.vector(i);
                libc::iovec {
                    // SAFETY: s < len, inside the frozen range promised in `new`.
                    iov_base: unsafe { self.base.add(s as usize) } as *mut libc::c_void,
                    iov_len: l as usize,
                }
            })
            .collect();
        let total: u64 = iovs.iter().map(|v| v.iov_len as u64).sum();
        let calls = pwritev_all(
            self.file.pool().as_raw_fd(),
            &mut iovs,
            self.file.image_file_offset() + start,
            self.file.path(),
        )?;
        let t1 = Instant::now();
        self.file.persist_image(start, total)?;
        let t2 = Instant::now();
        if self.release_dumped.load(Ordering::Relaxed) {
            // SAFETY: the run lies in the region given to `new`; `set_release_dumped`'s
            // caller promised nothing else reads it, and this run is never dumped again.
            unsafe {
                libc::madvise(
                    self.base.add(start as usize) as *mut libc::c_void,
                    total as usize,
                    libc::MADV_DONTNEED,
                )
            };
        }
        // The medium's time for the run covers the copy and the persist that stand in for it.
        self.file.pool().charge_write_paced(total, since);
        self.write_nanos
            .fetch_add((t1 - t0).as_nanos() as u64, Ordering::Relaxed);
        self.persist_nanos
            .fetch_add((t2 - t1).as_nanos() as u64, Ordering::Relaxed);
        self.syscalls.fetch_add(calls, Ordering::Relaxed);
        self.persists.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(total, Ordering::Relaxed);
        self.vectors.fetch_add(n as u64, Ordering::Relaxed);
        self.nanos
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Dump the whole region in ascending vectors (see [`Batching`]); after each batch:
    /// persist, charge the delay model, then publish the watermark. Vectors dumped on demand
    /// meanwhile are skipped (the watermark moves over them). Finally sets and persists the
    /// completion flag. Runs once per Dumper (a second call is an error); pauses between
    /// batches while the page-server holds a [`PauseGuard`]. Returns the stats at the end.
    pub fn run_background(&self) -> Result<DumpStats> {
        if self.started.swap(true, Ordering::AcqRel) {
            return Err(LazyError::InvalidArgument(
                "run_background already ran on this dumper".into(),
            ));
        }
        let nvec = self.vec_done.len();
        let max_bytes = match self.batching {
            Batching::PerVector => VECTOR_SIZE,
            Batching::Batched { max_bytes } => max_bytes.clamp(VECTOR_SIZE, MAX_WRITE_BYTES),
        };
        let max_vecs = ((max_bytes / VECTOR_SIZE) as usize).clamp(1, MAX_IOVECS);
        self.dump_hot()?;
        loop {
            self.control.begin();
            let r = (|| -> Result<bool> {
                let mut i = self.next.load(Ordering::Relaxed);
                while i < nvec && self.vec_done[i].load(Ordering::Acquire) {
                    i += 1;
                }
                let mut j = i;
                while j < nvec && j - i < max_vecs && !self.vec_done[j].load(Ordering::Acquire) {
                    j += 1;
                }
                if j > i {
                    self.write_vectors(i, j - i)?;
                    for v in &self.vec_done[i..j] {
                        v.store(true, Ordering::Release);
                    }
                }
                while j < nvec && self.vec_done[j].load(Ordering::Acquire) {
                    j += 1;
                }
                self.next.store(j, Ordering::Relaxed);
                let wm = (j as u64 * VECTOR_SIZE).min(self.len);
                if wm > self.file.watermark() {
                    self.file.publish(OFF_WATERMARK, wm)?;
                }
                Ok(j >= nvec)
            })();
            self.control.end();
            if r? {
                break;
            }
        }
        self.file.publish(OFF_COMPLETE, 1)?;
        Ok(self.stats())
    }

    /// Page-server request: wait for the batch in flight, pause the background dumper, dump
    /// the vector holding region offset `offset` now unless already dumped, persist it, record
    /// it in the journal (after the data), and resume the dumper.
    pub fn dump_vector_containing(&self, offset: u64) -> Result<DemandOutcome> {
        if offset >= self.len {
            return Err(LazyError::OutOfRange {
                offset,
                len: 1,
                region_len: self.len,
            });
        }
        let i = (offset / VECTOR_SIZE) as usize;
        let (start, len) = self.vector(i);
        let _g = self.control.pause();
        if self.vec_done[i].load(Ordering::Acquire) {
            return Ok(DemandOutcome {
                start,
                len,
                already: true,
                journaled: false,
                watermark: self.file.watermark(),
            });
        }
        self.write_vectors(i, 1)?;
        let journaled = self.file.journal_append(start, len)?;
        self.vec_done[i].store(true, Ordering::Release);
        self.demand.fetch_add(1, Ordering::Relaxed);
        Ok(DemandOutcome {
            start,
            len,
            already: false,
            journaled,
            watermark: self.file.watermark(),
        })
    }

    /// Run [`Dumper::run_background`] in a new thread; [`LazyError::Io`] when the thread
    /// cannot be created (resource limits).
    pub fn spawn_background(
        self: &Arc<Self>,
    ) -> Result<std::thread::JoinHandle<Result<DumpStats>>> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("mig-dumper".into())
            .spawn(move || me.run_background())
            .map_err(|source| LazyError::Io {
                op: "spawning the dumper thread",
                path: self.file.path().to_path_buf(),
                source,
            })
    }
}

/// `pwritev` every byte of `iovs` at file offset `off`, retrying on EINTR and short writes
/// (advancing the iovecs). Returns the number of calls that wrote something.
fn pwritev_all(fd: RawFd, iovs: &mut [libc::iovec], mut off: u64, path: &Path) -> Result<u64> {
    let mut idx = 0;
    let mut calls = 0;
    while idx < iovs.len() {
        if iovs[idx].iov_len == 0 {
            idx += 1;
            continue;
        }
        let cnt = (iovs.len() - idx).min(MAX_IOVECS);
        // SAFETY: iovs[idx..idx + cnt] are valid iovecs over readable memory (the frozen
        // region); the fd is open for writing.
        let n = unsafe {
            libc::pwritev(
                fd,
                iovs[idx..].as_ptr(),
                cnt as libc::c_int,
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(LazyError::Io {
                op: "pwritev",
                path: path.to_path_buf(),
                source: e,
            });
        }
        if n == 0 {
            return Err(LazyError::Io {
                op: "pwritev",
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::WriteZero, "wrote 0 bytes"),
            });
        }
        calls += 1;
        off += n as u64;
        let mut left = n as usize;
        while left > 0 {
            let v = &mut iovs[idx];
            if v.iov_len <= left {
                left -= v.iov_len;
                idx += 1;
            } else {
                // SAFETY: advancing within the same iovec's buffer.
                v.iov_base = unsafe { (v.iov_base as *mut u8).add(left) } as *mut libc::c_void;
                v.iov_len -= left;
                left = 0;
            }
        }
    }
    Ok(calls)
}

/// Dump the same `region_len`-byte region (page multiple, filled with a pattern) both ways,
/// [`Batching::PerVector`] and [`Batching::MAX`], `runs` times each (alternating), into fresh
/// lazy files in `dir` with `delay`; returns the median seconds `(per_vector, batched)` of the
/// background dump (write + persist + delay). Files are removed afterwards.
pub fn batching_ratio_in(
    dir: &Path,
    region_len: u64,
    delay: DelayModel,
    runs: usize,
) -> Result<(f64, f64)> {
    let region =
        crate::mapping::Mapping::new(region_len as usize).map_err(|source| LazyError::Io {
            op: "mmap",
            path: PathBuf::from("[anon]"),
            source,
        })?;
    // SAFETY: the region is our own read-write mapping of region_len bytes.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.ptr, region.len) };
    for (i, c) in mem.chunks_mut(8).enumerate() {
        let v = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
    let mut per = Vec::new();
    let mut bat = Vec::new();
    for r in 0..runs.max(1) {
        for (mode, out) in [(Batching::PerVector, &mut per), (Batching::MAX, &mut bat)] {
            let name = format!("bench-{}-{r}-{:?}.lazy", std::process::id(), mode)
                .replace([' ', '{', '}', ':'], "");
            let file = Arc::new(LazyFile::create(dir, &name, region_len, delay)?);
            // SAFETY: `region` outlives the dumper (dropped at the end of this iteration) and
            // is not modified while it runs.
            let d = unsafe { Dumper::new(Arc::clone(&file), region.ptr, region_len, mode)? };
            let t0 = Instant::now();
            let res = d.run_background();
            let secs = t0.elapsed().as_secs_f64();
            let path = file.path().to_path_buf();
            drop(d);
            drop(file);
            let _ = std::fs::remove_file(&path);
            res?;
            out.push(secs);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    Ok((median(&mut per), median(&mut bat)))
}

/// [`batching_ratio_in`] with 3 runs in a scratch directory under the media default directory
/// (`$TIERMEM_DIR`, else `/dev/shm/tiermem`, created if needed).
pub fn batching_ratio(region_len: u64, delay: DelayModel) -> Result<(f64, f64)> {
    let base = tiermem_media::ensure_default_dir()?;
    let dir = base.join(format!("mig-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| LazyError::Io {
        op: "mkdir",
        path: dir.clone(),
        source: e,
    })?;
    let r = batching_ratio_in(&dir, region_len, delay, 3);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

#[cfg(test)]
mod tests;
