//! The snapshot file: its layout, the writer that fills it unit by unit at final offsets, and
//! the reader that checks every field before trusting one.
//!
//! Layout (little-endian; every part starts on a 4 KiB boundary, so pages and the index can be
//! written with O_DIRECT from aligned buffers):
//!
//! | part | size | contents |
//! |---|---|---|
//! | header | 4 KiB | magic `TMSNAP\0\0`, version, page size, unit pages, method, uuid, creation time, regions {length, name}, CRC32C of the rest |
//! | index | 16 B per unit, padded | bitmap of the unit's pages with frames (bit i: page i), the unit's checksum ([`unit_checksum`]: XOR of its pages' [`page_crc`]) |
//! | pages | 4 KiB per set bit | the present pages, units in address order, regions in order |
//! | app state | padded | an opaque blob the application saves beside its memory |
//! | spill area | (1 + n) pages per batch | pages written before their unit was dumped: batches of a header ([`encode_spill_header`]: magic `TMSPILL\0`, n ≤ 63, uuid, per page unit/page/`page_crc`, CRC32C) and n pages; they override their units' bytes |
//! | trailer | 4 KiB | magic `TMSNAPEN`, uuid, file length, unit and page counts, app-state length and CRC, index CRC, spill area length, its own CRC |
//!
//! A unit's place follows from the bitmaps alone (prefix sums of their popcounts), which the
//! pause computes before any page is written: the dumper and a faulting thread can each write
//! any unit at its final offset, in any order, with no shared cursor. No addresses are stored:
//! the snapshot restores into regions of the same lengths, wherever they are mapped.
//!
//! The writer creates `NAME.tmp-<uuid>` of the final length up front (a full disk refuses
//! before the pause), and [`Writer::finish`] writes index, app state and trailer, fdatasyncs,
//! renames over `NAME` and fsyncs the directory: a crash at any point leaves the previous
//! snapshot in place, and a file without its trailer is refused.

use crate::error::{Result, SnapshotError};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use tiermem_media::{AlignedBuf, Pool, PoolKind, PoolOptions, SsdDevice};

/// Bytes of a media pool's header before its data area.
const POOL_HEADER: u64 = 4096;

/// Bytes of a page; the only page size this build writes and reads.
pub const PAGE: usize = 4096;
/// Pages of a dump unit (64: one 64-bit bitmap per unit, 256 KiB, MDC's unit).
pub const UNIT_PAGES: usize = 64;
/// Bytes of a dump unit.
pub const UNIT_BYTES: usize = PAGE * UNIT_PAGES;
/// The format version this build writes (it reads 1 too: sequential unit CRCs, no spill).
pub const VERSION: u32 = 2;
/// A spill batch header's magic.
pub const SPILL_MAGIC: [u8; 8] = *b"TMSPILL\0";
/// Pages after one spill batch header, at most.
pub const SPILL_PAGES: usize = 63;
/// Bytes of a spill entry in its header: unit (u32, `u32::MAX`: no page here), page in the
/// unit (u32), the page's [`page_crc`] (u32).
const SPILL_ENTRY: usize = 12;
/// First spill entry in a spill header (after magic, count and uuid).
const SPILL_ENTRIES_AT: usize = 32;
/// The header's magic.
pub const MAGIC: [u8; 8] = *b"TMSNAP\0\0";
/// The trailer's magic.
pub const TRAILER_MAGIC: [u8; 8] = *b"TMSNAPEN";
/// Longest region name, bytes.
pub const MAX_NAME: usize = 255;
/// Threads of a restore.
const RESTORE_THREADS: usize = 4;
/// Most iovecs one `preadv` takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;
/// Index entry bytes.
const ENTRY: usize = 16;
/// Where the header's CRC sits (it covers the bytes before it).
const HEADER_CRC_AT: usize = PAGE - 4;
/// First byte of the region table in the header.
const REGIONS_AT: usize = 56;
/// Bytes of the trailer covered by its CRC (the CRC follows them): version 2 (with the spill
/// area's length) and version 1.
const TRAILER_BODY: usize = 72;
const TRAILER_BODY_V1: usize = 64;

/// The checksum of page `p` (0..64) of a unit: CRC32C of `p` (u32, little-endian) and the
/// page's bytes. A unit's index checksum (version 2) is the XOR of its stored pages'
/// `page_crc`: pages can be added in any order by whoever writes them (the dumper, a faulting
/// thread, a spilled page), and a page moved within its unit changes it. Async-signal-safe.
pub fn page_crc(p: usize, page: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&(p as u32).to_le_bytes()), page)
}

/// The version-2 checksum of a unit with bitmap `bm` whose stored pages are `data`, in order,
/// skipping the pages in `skip` (their bytes in `data` are not the snapshot's: spilled).
/// Async-signal-safe.
pub fn unit_checksum(bm: u64, data: &[u8], skip: u64) -> u32 {
    let mut c = 0u32;
    let mut k = 0usize;
    for p in 0..UNIT_PAGES {
        if bm >> p & 1 == 1 {
            if skip >> p & 1 == 0 {
                c ^= page_crc(p, &data[k * PAGE..(k + 1) * PAGE]);
            }
            k += 1;
        }
    }
    c
}

/// Fills `h` (one page) as a spill batch header of snapshot `uuid` for `entries`
/// ((unit, page, page_crc) per page after it; unit `u32::MAX`: the position holds no page).
pub fn encode_spill_header(h: &mut [u8], uuid: &[u8; 16], entries: &[(u32, u32, u32)]) {
    h[..PAGE].fill(0);
    h[..8].copy_from_slice(&SPILL_MAGIC);
    put32(h, 8, entries.len() as u32);
    h[16..32].copy_from_slice(uuid);
    for (i, &(g, p, c)) in entries.iter().enumerate() {
        let at = SPILL_ENTRIES_AT + i * SPILL_ENTRY;
        put32(h, at, g);
        put32(h, at + 4, p);
        put32(h, at + 8, c);
    }
    let c = crc32c::crc32c(&h[..HEADER_CRC_AT]);
    put32(h, HEADER_CRC_AT, c);
}

/// How a snapshot was taken (recorded in the header; the file is the same for all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Fork-less copy-before-write on the live process (userfaultfd write protection).
    Wp,
    /// A forked child dumps units in address order and drops each once written (MDC).
    ForkMdc,
    /// A forked child dumps; the kernel's copy-on-write keeps the parent's writes out (Redis).
    Fork,
}

impl Method {
    /// The method's name as the CLI and the bench spell it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Wp => "wp",
            Method::ForkMdc => "fork-mdc",
            Method::Fork => "fork",
        }
    }

    /// Parses [`Method::name`].
    pub fn parse(s: &str) -> Option<Method> {
        match s {
            "wp" => Some(Method::Wp),
            "fork-mdc" => Some(Method::ForkMdc),
            "fork" => Some(Method::Fork),
            _ => None,
        }
    }

    fn code(self) -> u32 {
        match self {
            Method::Wp => 0,
            Method::ForkMdc => 1,
            Method::Fork => 2,
        }
    }

    fn from_code(c: u32) -> Option<Method> {
        match c {
            0 => Some(Method::Wp),
            1 => Some(Method::ForkMdc),
            2 => Some(Method::Fork),
            _ => None,
        }
    }
}

/// One region of a snapshot: a name and a length (a multiple of the page size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// The application's name for it (≤ [`MAX_NAME`] bytes of UTF-8).
    pub name: String,
    /// Bytes.
    pub len: u64,
}

/// Units of a region of `len` bytes (the last may be partial).
pub fn units_of(len: u64) -> usize {
    (len as usize).div_ceil(UNIT_BYTES)
}

/// Pages of unit `u` of a region of `len` bytes.
pub fn pages_in_unit(len: u64, u: usize) -> usize {
    let pages = (len as usize) / PAGE;
    (pages - u * UNIT_PAGES).min(UNIT_PAGES)
}

fn pad(n: u64) -> u64 {
    n.div_ceil(PAGE as u64) * PAGE as u64
}

/// Where everything of one snapshot lies: fixed once the bitmaps are known.
#[derive(Debug, Clone)]
pub struct Layout {
    regions: Vec<RegionInfo>,
    /// First unit of each region in the global unit numbering, and one past the last.
    first_unit: Vec<usize>,
    bitmaps: Vec<u64>,
    /// Offset of each unit's first page; `unit_off[units]` is the end of the pages.
    unit_off: Vec<u64>,
    pages_at: u64,
    app_len: u64,
}

impl Layout {
    /// The layout of `regions` with one bitmap per unit (region order, then address order),
    /// and `app_len` bytes of application state. Errors on names, lengths or a bitmap with
    /// bits past its unit's pages.
    pub fn new(regions: Vec<RegionInfo>, bitmaps: Vec<u64>, app_len: u64) -> Result<Layout> {
        let bad = |m: String| Err(SnapshotError::InvalidArgument(m));
        let mut first_unit = Vec::with_capacity(regions.len() + 1);
        let mut units = 0usize;
        let mut table = 0usize;
        for r in &regions {
            if r.len == 0 || r.len % PAGE as u64 != 0 {
                return bad(format!(
                    "region {:?}: length {} is not a positive multiple of {PAGE}",
                    r.name, r.len
                ));
            }
            if r.name.len() > MAX_NAME {
                return bad(format!(
                    "region name of {} bytes (at most {MAX_NAME})",
                    r.name.len()
                ));
            }
            table += 10 + r.name.len();
            first_unit.push(units);
            units += units_of(r.len);
        }
        first_unit.push(units);
        if regions.is_empty() {
            return bad("a snapshot needs at least one region".into());
        }
        if REGIONS_AT + table > HEADER_CRC_AT {
            return bad(format!(
                "{} regions with these names do not fit the 4 KiB header",
                regions.len()
            ));
        }
        if bitmaps.len() != units {
            return bad(format!("{} bitmaps for {units} units", bitmaps.len()));
        }
        for (ri, r) in regions.iter().enumerate() {
            for u in 0..units_of(r.len) {
                let n = pages_in_unit(r.len, u);
                let b = bitmaps[first_unit[ri] + u];
                if n < 64 && b >> n != 0 {
                    return bad(format!(
                        "region {:?} unit {u}: bitmap {b:#x} has bits past its {n} pages",
                        r.name
                    ));
                }
            }
        }
        let pages_at = pages_at(units);
        let mut unit_off = Vec::with_capacity(units + 1);
        let mut off = pages_at;
        for b in &bitmaps {
            unit_off.push(off);
            off += b.count_ones() as u64 * PAGE as u64;
        }
        unit_off.push(off);
        Ok(Layout {
            regions,
            first_unit,
            bitmaps,
            unit_off,
            pages_at,
            app_len,
        })
    }

    /// The regions.
    pub fn regions(&self) -> &[RegionInfo] {
        &self.regions
    }

    /// Units in all.
    pub fn units(&self) -> usize {
        self.bitmaps.len()
    }

    /// Global number of unit `u` of region `r`.
    pub fn unit(&self, r: usize, u: usize) -> usize {
        self.first_unit[r] + u
    }

    /// Region and unit within it of global unit `g`.
    pub fn locate(&self, g: usize) -> (usize, usize) {
        let r = self.first_unit.partition_point(|&f| f <= g) - 1;
        (r, g - self.first_unit[r])
    }

    /// Bitmap of global unit `g`.
    pub fn bitmap(&self, g: usize) -> u64 {
        self.bitmaps[g]
    }

    /// File offset of global unit `g`'s first page, and its dumped bytes.
    pub fn unit_extent(&self, g: usize) -> (u64, usize) {
        (
            self.unit_off[g],
            (self.unit_off[g + 1] - self.unit_off[g]) as usize,
        )
    }

    /// Present pages in all.
    pub fn present_pages(&self) -> u64 {
        (self.unit_off[self.units()] - self.pages_at) / PAGE as u64
    }

    fn app_at(&self) -> u64 {
        self.unit_off[self.units()]
    }

    /// Where the spill area starts (after the app state; the trailer follows it).
    pub fn spill_at(&self) -> u64 {
        self.app_at() + pad(self.app_len)
    }

    #[cfg(test)]
    fn trailer_at(&self) -> u64 {
        self.spill_at()
    }

    /// The file's length without spilled pages.
    pub fn file_len(&self) -> u64 {
        file_len_of(self.units(), self.present_pages(), self.app_len)
    }
}

/// Offset of the first page of a file with `units` units: after the header and the index.
/// Allocates nothing (a forked child computes its offsets with it).
pub fn pages_at(units: usize) -> u64 {
    PAGE as u64 + pad((units * ENTRY) as u64)
}

/// The length of a file with `units` units, `present_pages` pages and `app_len` bytes of
/// application state (what [`Layout::file_len`] is for its layout). Allocates nothing.
pub fn file_len_of(units: usize, present_pages: u64, app_len: u64) -> u64 {
    pages_at(units) + present_pages * PAGE as u64 + pad(app_len) + PAGE as u64
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn get64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A fresh random identifier (getrandom; the clock and pid if that fails).
pub fn new_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into u.
    let n = unsafe { libc::getrandom(u.as_mut_ptr().cast(), 16, 0) };
    if n != 16 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        u[..8].copy_from_slice(&t.to_le_bytes());
        u[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    u
}

/// Hex of a uuid (file names, messages).
pub fn uuid_hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a snapshot is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Target {
    /// A file, written with O_DIRECT where the file system has it (`SsdDevice`).
    #[default]
    File,
    /// A media NVM pool file (`tiermem_media::Pool`, kind NVM: emulated persistent memory, or
    /// a DAX file): the snapshot is stored into its mapping and persisted (flush + fence, or
    /// msync), inside the pool's data area.
    NvmPool,
}

impl Target {
    /// The target's name as the CLI and tiermem-kv spell it (`file`, `nvm-pool`).
    pub fn name(self) -> &'static str {
        match self {
            Target::File => "file",
            Target::NvmPool => "nvm-pool",
        }
    }

    /// Parses [`Target::name`].
    pub fn parse(s: &str) -> Option<Target> {
        match s {
            "file" => Some(Target::File),
            "nvm-pool" => Some(Target::NvmPool),
            _ => None,
        }
    }
}

/// The device a snapshot is written to: a file or an NVM pool.
enum Dev {
    Ssd(SsdDevice),
    Pool(Pool),
}

impl Dev {
    /// Where the snapshot's byte 0 lies in the underlying file.
    fn base(&self) -> u64 {
        match self {
            Dev::Ssd(_) => 0,
            Dev::Pool(p) => p.header().data_offset,
        }
    }

    fn raw_fd(&self) -> i32 {
        match self {
            Dev::Ssd(d) => d.as_raw_fd(),
            Dev::Pool(p) => p.as_raw_fd(),
        }
    }

    fn direct(&self) -> bool {
        match self {
            Dev::Ssd(d) => d.direct(),
            Dev::Pool(_) => false,
        }
    }

    fn write_at(&self, off: u64, data: &[u8]) -> Result<()> {
        match self {
            Dev::Ssd(d) => d.write_at(off, data)?,
            Dev::Pool(p) => p.write(off, data)?,
        }
        Ok(())
    }

    /// Writes every `(offset, data)`; an SSD file has them in flight together (io_uring).
    fn write_batch(&self, ops: &[(u64, &[u8])]) -> Result<()> {
        match self {
            Dev::Ssd(d) => {
                let mut io: Vec<tiermem_media::IoOp<'_>> = ops
                    .iter()
                    .map(|&(off, data)| tiermem_media::IoOp::write(off, data))
                    .collect();
                for (r, &(off, data)) in d.submit_batch(&mut io)?.into_iter().zip(ops) {
                    let n = r?;
                    if n < data.len() {
                        // A short write: the rest, synchronously.
                        d.write_at(off + n as u64, &data[n..])?;
                    }
                }
            }
            Dev::Pool(p) => {
                for &(off, data) in ops {
                    p.write(off, data)?;
                }
            }
        }
        Ok(())
    }

    /// Makes everything written so far durable.
    fn sync(&self) -> Result<()> {
        match self {
            Dev::Ssd(d) => d.sync()?,
            Dev::Pool(p) => p.persist(0, p.data_len())?,
        }
        Ok(())
    }
}

/// A snapshot's temporary file, created (`NAME.tmp-<uuid>`, same directory) and allocated
/// before the layout is known: what `wp::begin_paused` does outside the application's pause,
/// from an estimate. [`Reservation::into_writer`] grows it when the exact layout needs more
/// and [`Writer::finish`] truncates what was not used. Dropped, it removes the file.
pub struct Reservation {
    dev: Option<Dev>,
    tmp: PathBuf,
    target: PathBuf,
    uuid: [u8; 16],
    capacity: u64,
}

impl Reservation {
    /// Creates the temporary file of `capacity` bytes, allocated: a full file system refuses
    /// here ([`tiermem_media::MediaError::NoSpace`]).
    pub fn new(target: &Path, capacity: u64) -> Result<Reservation> {
        Reservation::new_in(target, capacity, Target::File)
    }

    /// As [`Reservation::new`] on `kind`: an NVM pool's data area of `capacity` bytes (a pool
    /// cannot grow: [`Reservation::into_writer`] refuses a layout longer than it).
    pub fn new_in(target: &Path, capacity: u64, kind: Target) -> Result<Reservation> {
        let name = target.file_name().ok_or_else(|| {
            SnapshotError::InvalidArgument(format!("{}: not a file path", target.display()))
        })?;
        let uuid = new_uuid();
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp-{}", uuid_hex(&uuid)));
        let tmp = target.with_file_name(tmp_name);
        let capacity = pad(capacity.max(3 * PAGE as u64));
        let dev = match kind {
            Target::File => Dev::Ssd(SsdDevice::create(&tmp, capacity)?),
            Target::NvmPool => {
                let opts = PoolOptions::new(POOL_HEADER + capacity)
                    .kind(PoolKind::Nvm)
                    .tag("tiermem-snapshot");
                Dev::Pool(Pool::create(&tmp, &opts)?)
            }
        };
        Ok(Reservation {
            dev: Some(dev),
            tmp,
            target: target.to_path_buf(),
            uuid,
            capacity,
        })
    }

    /// Bytes allocated.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The temporary file's descriptor (a forked child writes pages through it, at
    /// [`Reservation::raw_base`] + the snapshot's offset).
    pub fn raw_fd(&self) -> i32 {
        self.dev.as_ref().map_or(-1, |d| d.raw_fd())
    }

    /// Where the snapshot's byte 0 lies in the file (an NVM pool's data area: after its
    /// header).
    pub fn raw_base(&self) -> u64 {
        self.dev.as_ref().map_or(0, |d| d.base())
    }

    /// Whether the file can grow (a pool cannot).
    pub fn growable(&self) -> bool {
        matches!(self.dev, Some(Dev::Ssd(_)))
    }

    /// The temporary file's path.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The writer of `layout` into this file, grown first when the layout is longer than the
    /// capacity (no space: [`tiermem_media::MediaError::NoSpace`], the file removed).
    pub fn into_writer(mut self, layout: Layout, method: Method) -> Result<Writer> {
        let need = layout.file_len();
        if need > self.capacity && !self.growable() {
            return Err(tiermem_media::MediaError::NoSpace {
                path: self.tmp.clone(),
                requested: need,
                available: self.capacity,
            }
            .into());
        }
        if need > self.capacity {
            let Some(Dev::Ssd(dev)) = self.dev.take() else {
                unreachable!("growable: an SSD file")
            };
            // SAFETY: the device's descriptor is open; posix_fallocate returns an errno value.
            let rc = unsafe { libc::posix_fallocate(dev.as_raw_fd(), 0, need as libc::off_t) };
            drop(dev);
            if rc != 0 {
                let e = std::io::Error::from_raw_os_error(rc);
                return Err(if rc == libc::ENOSPC || rc == libc::EFBIG {
                    tiermem_media::MediaError::NoSpace {
                        path: self.tmp.clone(),
                        requested: need,
                        available: 0,
                    }
                    .into()
                } else {
                    SnapshotError::io("posix_fallocate", &self.tmp, e)
                });
            }
            // The device checks bounds against the length it opened with: open it again.
            self.dev = Some(Dev::Ssd(SsdDevice::open(&self.tmp)?));
            self.capacity = need;
        }
        let units = layout.units();
        let w = Writer {
            dev: self.dev.take().expect("reservation device"),
            tmp: std::mem::take(&mut self.tmp),
            target: std::mem::take(&mut self.target),
            layout,
            method,
            uuid: self.uuid,
            capacity: self.capacity,
            crcs: (0..units).map(|_| AtomicU32::new(0)).collect(),
            written: (0..units).map(|_| AtomicU8::new(0)).collect(),
            spill_len: AtomicU64::new(0),
            finished: false,
        };
        Ok(w)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Moved into a writer: nothing left to remove here.
        if self.dev.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes one snapshot file (see the module doc). Units may be written from several threads
/// at once ([`Writer::write_unit`] takes `&self`); the file becomes the snapshot only in
/// [`Writer::finish`]. Dropped unfinished, it removes its temporary file.
pub struct Writer {
    dev: Dev,
    tmp: PathBuf,
    target: PathBuf,
    layout: Layout,
    method: Method,
    uuid: [u8; 16],
    /// Bytes allocated at creation (≥ the layout's length; the rest is truncated at finish).
    capacity: u64,
    crcs: Vec<AtomicU32>,
    /// Per unit: 0 not written, 1 written.
    written: Vec<AtomicU8>,
    /// Bytes of spill batches written after [`Layout::spill_at`].
    spill_len: AtomicU64,
    finished: bool,
}

impl Writer {
    /// Creates `target`'s temporary file (`NAME.tmp-<uuid>`, same directory) of the final
    /// length, allocated: a full file system refuses here ([`tiermem_media::MediaError::NoSpace`]),
    /// before anything is paused or protected.
    pub fn create(target: &Path, layout: Layout, method: Method) -> Result<Writer> {
        Reservation::new(target, layout.file_len())?.into_writer(layout, method)
    }

    /// The layout being written.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The snapshot's identifier (spill headers carry it).
    pub fn uuid(&self) -> &[u8; 16] {
        &self.uuid
    }

    /// The temporary file's path.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Whether writes bypass the page cache (O_DIRECT).
    pub fn direct(&self) -> bool {
        self.dev.direct()
    }

    /// The file descriptor (for a writer that must not allocate: see [`Writer::record_unit`]);
    /// the snapshot's byte 0 is at [`Writer::raw_base`] in it.
    pub fn raw_fd(&self) -> i32 {
        self.dev.raw_fd()
    }

    /// Where the snapshot's byte 0 lies in [`Writer::raw_fd`]'s file (0 for a file target).
    pub fn raw_base(&self) -> u64 {
        self.dev.base()
    }

    /// Writes global unit `g`: `data` is its present pages in order (`popcount × 4 KiB`
    /// bytes, page-aligned when the file is direct). Each unit is written once.
    pub fn write_unit(&self, g: usize, data: &[u8]) -> Result<()> {
        self.write_units(&[(g, data)])
    }

    /// Writes several units at once (`(g, data)` as in [`Writer::write_unit`]), all in flight
    /// together (io_uring where the media layer has it): what keeps a queue of writes at the
    /// device instead of one at a time.
    pub fn write_units(&self, units: &[(usize, &[u8])]) -> Result<()> {
        let mut ops = Vec::with_capacity(units.len());
        for &(g, data) in units {
            let (off, len) = self.layout.unit_extent(g);
            if data.len() != len {
                return Err(SnapshotError::InvalidArgument(format!(
                    "unit {g}: {} bytes for {} present pages",
                    data.len(),
                    len / PAGE
                )));
            }
            if len > 0 {
                ops.push((off, data));
            }
        }
        self.dev.write_batch(&ops)?;
        for &(g, data) in units {
            self.record_unit(g, unit_checksum(self.layout.bitmap(g), data, 0));
        }
        Ok(())
    }

    /// Writes every `(offset, data)` (snapshot offsets), all in flight together; records
    /// nothing: the caller records its units ([`Writer::record_unit`]).
    pub fn write_raw(&self, ops: &[(u64, &[u8])]) -> Result<()> {
        self.dev.write_batch(ops)
    }

    /// Records that global unit `g` was written, its pages outside any spilled ones having
    /// checksum `crc` ([`unit_checksum`]), by the caller itself where it wrote them (a
    /// `pwrite` of its bytes at [`Layout::unit_extent`] on [`Writer::raw_fd`] is what a thread
    /// in a signal handler does, where the media layer's error path would allocate).
    /// Async-signal-safe.
    pub fn record_unit(&self, g: usize, crc: u32) {
        self.crcs[g].fetch_xor(crc, Ordering::AcqRel);
        self.written[g].store(1, Ordering::Release);
    }

    /// Adds a spilled page's [`page_crc`] to unit `g`'s checksum. Async-signal-safe.
    pub fn record_spilled_page(&self, g: usize, crc: u32) {
        self.crcs[g].fetch_xor(crc, Ordering::AcqRel);
    }

    /// Whether spill batches can be written (a file grows; a pool cannot).
    pub fn can_spill(&self) -> bool {
        matches!(self.dev, Dev::Ssd(_))
    }

    /// Bytes of spill batches so far.
    pub fn spill_len(&self) -> u64 {
        self.spill_len.load(Ordering::Acquire)
    }

    /// Makes room for `more` bytes of spill beyond what is written (allocating ahead; no
    /// space: [`tiermem_media::MediaError::NoSpace`]).
    pub fn reserve_spill(&self, more: u64) -> Result<()> {
        let Dev::Ssd(d) = &self.dev else {
            return Err(SnapshotError::InvalidArgument(
                "an NVM pool target cannot hold spilled pages".into(),
            ));
        };
        let end = self.layout.spill_at() + self.spill_len() + more + PAGE as u64;
        if end > d.len() {
            // In steps of 64 MiB: few allocations.
            d.grow(end.max(d.len() + (64 << 20)))?;
        }
        Ok(())
    }

    /// Writes spill batches (each a header page from [`encode_spill_header`] and its pages,
    /// contiguous) at the end of the spill area, in flight together, together with `units`
    /// (snapshot offset, bytes) writes; the caller reserved the room.
    pub fn write_spill_and(&self, batches: &[&[u8]], units: &[(u64, &[u8])]) -> Result<()> {
        let mut at = self.layout.spill_at() + self.spill_len();
        let mut ops: Vec<(u64, &[u8])> = Vec::with_capacity(batches.len() + units.len());
        for b in batches {
            ops.push((at, b));
            at += b.len() as u64;
        }
        ops.extend_from_slice(units);
        self.dev.write_batch(&ops)?;
        self.spill_len
            .store(at - self.layout.spill_at(), Ordering::Release);
        Ok(())
    }

    /// Whether every unit has been written.
    pub fn complete(&self) -> bool {
        self.written.iter().all(|w| w.load(Ordering::Acquire) == 1)
    }

    /// Writes index, app state and trailer, makes the file durable and renames it over the
    /// target; returns the file's length. Errors if a unit is missing or `app` is not the
    /// length the layout was made for.
    pub fn finish(mut self, app: &[u8]) -> Result<u64> {
        if !self.complete() {
            let missing = self
                .written
                .iter()
                .filter(|w| w.load(Ordering::Acquire) == 0)
                .count();
            return Err(SnapshotError::InvalidArgument(format!(
                "{missing} of {} units were not written",
                self.layout.units()
            )));
        }
        let l = &self.layout;
        if app.len() as u64 != l.app_len {
            return Err(SnapshotError::InvalidArgument(format!(
                "application state of {} bytes, {} expected",
                app.len(),
                l.app_len
            )));
        }
        // Header.
        let mut h = AlignedBuf::new(PAGE, PAGE)?;
        h[..8].copy_from_slice(&MAGIC);
        put32(&mut h, 8, VERSION);
        put32(&mut h, 12, PAGE as u32);
        put32(&mut h, 16, UNIT_PAGES as u32);
        put32(&mut h, 20, self.method.code());
        h[24..40].copy_from_slice(&self.uuid);
        put32(&mut h, 40, l.regions.len() as u32);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        put64(&mut h, 48, now);
        let mut at = REGIONS_AT;
        for r in &l.regions {
            put64(&mut h, at, r.len);
            h[at + 8..at + 10].copy_from_slice(&(r.name.len() as u16).to_le_bytes());
            h[at + 10..at + 10 + r.name.len()].copy_from_slice(r.name.as_bytes());
            at += 10 + r.name.len();
        }
        let c = crc32c::crc32c(&h[..HEADER_CRC_AT]);
        put32(&mut h, HEADER_CRC_AT, c);
        self.dev.write_at(0, &h)?;
        // Index.
        let index_len = (l.pages_at - PAGE as u64) as usize;
        let mut ix = AlignedBuf::new(index_len, PAGE)?;
        for g in 0..l.units() {
            put64(&mut ix, g * ENTRY, l.bitmaps[g]);
            put32(&mut ix, g * ENTRY + 8, self.crcs[g].load(Ordering::Acquire));
        }
        let index_crc = crc32c::crc32c(&ix[..l.units() * ENTRY]);
        self.dev.write_at(PAGE as u64, &ix)?;
        // Application state.
        let app_padded = pad(app.len() as u64) as usize;
        if app_padded > 0 {
            let mut a = AlignedBuf::new(app_padded, PAGE)?;
            a[..app.len()].copy_from_slice(app);
            self.dev.write_at(l.app_at(), &a)?;
        }
        // What the estimate reserved beyond the layout goes (the trailer is the last block);
        // a pool keeps its size, its trailer is its data area's last block.
        let spill = self.spill_len();
        let total = match &self.dev {
            Dev::Ssd(_) => l.file_len() + spill,
            Dev::Pool(_) => self.capacity,
        };
        let allocated = match &self.dev {
            Dev::Ssd(d) => d.len(),
            Dev::Pool(_) => self.capacity,
        };
        if matches!(self.dev, Dev::Ssd(_)) && allocated > total {
            // SAFETY: the descriptor is open; a plain syscall.
            if unsafe { libc::ftruncate(self.dev.raw_fd(), total as libc::off_t) } != 0 {
                return Err(SnapshotError::io(
                    "ftruncate",
                    &self.tmp,
                    std::io::Error::last_os_error(),
                ));
            }
        }
        // Trailer, after everything else is durable.
        self.dev.sync()?;
        let mut t = AlignedBuf::new(PAGE, PAGE)?;
        t[..8].copy_from_slice(&TRAILER_MAGIC);
        t[8..24].copy_from_slice(&self.uuid);
        put64(&mut t, 24, total);
        put64(&mut t, 32, l.units() as u64);
        put64(&mut t, 40, l.present_pages());
        put64(&mut t, 48, app.len() as u64);
        put32(&mut t, 56, crc32c::crc32c(app));
        put32(&mut t, 60, index_crc);
        put64(&mut t, 64, spill);
        let c = crc32c::crc32c(&t[..TRAILER_BODY]);
        put32(&mut t, TRAILER_BODY, c);
        self.dev.write_at(total - PAGE as u64, &t)?;
        self.dev.sync()?;
        std::fs::rename(&self.tmp, &self.target)
            .map_err(|e| SnapshotError::io("rename", &self.target, e))?;
        self.finished = true;
        sync_dir(&self.target)?;
        Ok(total)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// fsyncs the directory holding `path` (makes a rename durable).
fn sync_dir(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let f = std::fs::File::open(dir).map_err(|e| SnapshotError::io("open", dir, e))?;
    f.sync_all().map_err(|e| SnapshotError::io("fsync", dir, e))
}

/// An opened snapshot file whose header, trailer and index passed every check.
#[derive(Debug)]
pub struct SnapshotFile {
    path: PathBuf,
    file: std::fs::File,
    /// Where the snapshot starts in the file (an NVM pool's data area) and what holds it.
    base: u64,
    target: Target,
    /// The snapshot's length (the file's, or the pool's data area).
    len: u64,
    layout: Layout,
    method: Method,
    uuid: [u8; 16],
    created_ns: u64,
    crcs: Vec<u32>,
    app_crc: u32,
    /// Format version (1: sequential unit CRCs; 2: XOR of page CRCs, spill area).
    version: u32,
    /// Bytes of the spill area.
    spill_len: u64,
}

/// Pages stored in a snapshot's spill area (version 2): written by faulting threads before
/// their unit was dumped; they override the unit's bytes at their place.
#[derive(Default)]
struct Spill {
    /// Per unit: its spilled pages.
    mask: Vec<u64>,
    /// Per unit: XOR of its spilled pages' recorded `page_crc`.
    xor: Vec<u32>,
    /// (unit, page in unit, snapshot offset, recorded page_crc).
    pages: Vec<(usize, usize, u64, u32)>,
}

/// What [`SnapshotFile::info`] reports.
#[derive(Debug, Clone)]
pub struct Info {
    /// The file's path.
    pub path: PathBuf,
    /// How it was taken.
    pub method: Method,
    /// Its identifier (hex).
    pub uuid: String,
    /// Creation time, ns since the epoch.
    pub created_ns: u64,
    /// The regions.
    pub regions: Vec<RegionInfo>,
    /// Units in all.
    pub units: usize,
    /// Pages stored (pages with frames at the snapshot).
    pub present_pages: u64,
    /// Bytes of application state.
    pub app_len: u64,
    /// The snapshot's length (a pool's: its data area).
    pub file_len: u64,
    /// What holds it: a file or an NVM pool.
    pub target: Target,
    /// Format version.
    pub version: u32,
    /// Bytes of spilled pages with their batch headers (pages written before their unit).
    pub spill_bytes: u64,
}

impl SnapshotFile {
    /// Opens `path` and checks, in order: length, header magic, version, page size, unit size,
    /// method, region table, header CRC, trailer magic, uuid, recorded length, trailer CRC,
    /// unit and page counts, index CRC. The error names the first check that failed.
    pub fn open(path: &Path) -> Result<SnapshotFile> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(path).map_err(|e| SnapshotError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| SnapshotError::io("stat", path, e))?
            .len();
        let bad = |c: String| Err(SnapshotError::corrupt(path, c));
        // An NVM pool holds the snapshot in its data area (after the pool's header).
        let mut base = 0u64;
        let mut target = Target::File;
        let mut len = len;
        if len >= POOL_HEADER {
            let mut first = vec![0u8; POOL_HEADER as usize];
            file.read_exact_at(&mut first, 0)
                .map_err(|e| SnapshotError::io("read", path, e))?;
            if first[..8] != MAGIC {
                if let Ok(h) = tiermem_media::PoolHeader::decode(path, &first) {
                    if h.data_offset
                        .checked_add(h.data_size)
                        .map_or(true, |e| e > len)
                    {
                        return bad(format!(
                            "NVM pool: data area {}+{} past the file's {len} bytes",
                            h.data_offset, h.data_size
                        ));
                    }
                    base = h.data_offset;
                    len = h.data_size;
                    target = Target::NvmPool;
                }
            }
        }
        if len < 3 * PAGE as u64 || len % PAGE as u64 != 0 {
            return bad(format!(
                "length {len} is not a whole number of 4 KiB blocks of at least header, index and trailer (truncated?)"
            ));
        }
        let read = |off: u64, n: usize| -> Result<Vec<u8>> {
            let mut b = vec![0u8; n];
            file.read_exact_at(&mut b, base + off)
                .map_err(|e| SnapshotError::io("read", path, e))?;
            Ok(b)
        };
        let h = read(0, PAGE)?;
        if h[..8] != MAGIC {
            return bad("header magic (not a tiermem snapshot)".into());
        }
        let version = get32(&h, 8);
        if version != VERSION && version != 1 {
            return bad(format!(
                "version {version} (this build reads 1 and {VERSION})"
            ));
        }
        let ps = get32(&h, 12);
        if ps as usize != PAGE {
            return bad(format!("page size {ps} (this build uses {PAGE})"));
        }
        let up = get32(&h, 16);
        if up as usize != UNIT_PAGES {
            return bad(format!("unit of {up} pages (this build uses {UNIT_PAGES})"));
        }
        let Some(method) = Method::from_code(get32(&h, 20)) else {
            return bad(format!("method code {}", get32(&h, 20)));
        };
        let crc = crc32c::crc32c(&h[..HEADER_CRC_AT]);
        if crc != get32(&h, HEADER_CRC_AT) {
            return bad("header CRC".into());
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&h[24..40]);
        let created_ns = get64(&h, 48);
        let nreg = get32(&h, 40) as usize;
        let mut regions = Vec::new();
        let mut at = REGIONS_AT;
        for i in 0..nreg {
            if at + 10 > HEADER_CRC_AT {
                return bad(format!("region table: entry {i} of {nreg} past the header"));
            }
            let rl = get64(&h, at);
            let nl = u16::from_le_bytes([h[at + 8], h[at + 9]]) as usize;
            if nl > MAX_NAME || at + 10 + nl > HEADER_CRC_AT {
                return bad(format!("region table: name of entry {i} ({nl} bytes)"));
            }
            let Ok(name) = std::str::from_utf8(&h[at + 10..at + 10 + nl]) else {
                return bad(format!("region table: name of entry {i} is not UTF-8"));
            };
            if rl == 0 || rl % PAGE as u64 != 0 || rl > len.saturating_mul(1 << 20) {
                return bad(format!("region table: length {rl} of entry {i}"));
            }
            regions.push(RegionInfo {
                name: name.to_string(),
                len: rl,
            });
            at += 10 + nl;
        }
        if regions.is_empty() {
            return bad("region table: no regions".into());
        }
        let t = read(len - PAGE as u64, PAGE)?;
        if t[..8] != TRAILER_MAGIC {
            return bad("trailer magic (the file is truncated or was never finished)".into());
        }
        if t[8..24] != uuid {
            return bad("trailer uuid differs from the header's (parts of two snapshots)".into());
        }
        if get64(&t, 24) != len {
            return bad(format!(
                "recorded length {} differs from the file's {len}",
                get64(&t, 24)
            ));
        }
        let body = if version == 1 {
            TRAILER_BODY_V1
        } else {
            TRAILER_BODY
        };
        if crc32c::crc32c(&t[..body]) != get32(&t, body) {
            return bad("trailer CRC".into());
        }
        let spill_len = if version == 1 { 0 } else { get64(&t, 64) };
        if spill_len % PAGE as u64 != 0 || spill_len > len {
            return bad(format!("spill area of {spill_len} bytes"));
        }
        let units: usize = regions.iter().map(|r| units_of(r.len)).sum();
        if get64(&t, 32) != units as u64 {
            return bad(format!(
                "trailer counts {} units, the regions have {units}",
                get64(&t, 32)
            ));
        }
        let index_len = pad((units * ENTRY) as u64);
        if PAGE as u64 + index_len + PAGE as u64 > len {
            return bad("index runs past the end of the file".into());
        }
        let ix = read(PAGE as u64, (units * ENTRY).max(1))?;
        let ix = &ix[..units * ENTRY];
        if crc32c::crc32c(ix) != get32(&t, 60) {
            return bad("index CRC".into());
        }
        let bitmaps: Vec<u64> = (0..units).map(|g| get64(ix, g * ENTRY)).collect();
        let crcs: Vec<u32> = (0..units).map(|g| get32(ix, g * ENTRY + 8)).collect();
        let app_len = get64(&t, 48);
        if app_len > len {
            return bad(format!("application state of {app_len} bytes"));
        }
        let layout = Layout::new(regions, bitmaps, app_len)
            .map_err(|e| SnapshotError::corrupt(path, format!("index: {e}")))?;
        if layout.present_pages() != get64(&t, 40) {
            return bad(format!(
                "trailer counts {} pages, the index {}",
                get64(&t, 40),
                layout.present_pages()
            ));
        }
        // A file is exactly its layout; a pool's data area may be longer (zeros before the
        // trailer in its last block).
        let want = layout.file_len() + spill_len;
        if want != len && (target == Target::File || want > len) {
            return bad(format!(
                "the index, state and spill area make a file of {want} bytes, it has {len}"
            ));
        }
        Ok(SnapshotFile {
            path: path.to_path_buf(),
            file,
            base,
            target,
            len,
            layout,
            method,
            uuid,
            created_ns,
            crcs,
            app_crc: get32(&t, 56),
            version,
            spill_len,
        })
    }

    /// Reads and checks the spill area's batch headers (magic, CRC, uuid, counts, each entry
    /// naming a stored page of a unit once).
    fn spill(&self) -> Result<Spill> {
        use std::os::unix::fs::FileExt;
        let units = self.layout.units();
        let mut sp = Spill {
            mask: vec![0; units],
            xor: vec![0; units],
            pages: Vec::new(),
        };
        if self.spill_len == 0 {
            return Ok(sp);
        }
        let start = self.layout.spill_at();
        let end = start + self.spill_len;
        let mut at = start;
        let mut h = vec![0u8; PAGE];
        while at < end {
            let bad = |c: String| {
                Err(SnapshotError::corrupt(
                    &self.path,
                    format!("spill batch at byte {at}: {c}"),
                ))
            };
            self.file
                .read_exact_at(&mut h, self.base + at)
                .map_err(|e| SnapshotError::io("read", &self.path, e))?;
            if h[..8] != SPILL_MAGIC {
                return bad("magic".into());
            }
            if crc32c::crc32c(&h[..HEADER_CRC_AT]) != get32(&h, HEADER_CRC_AT) {
                return bad("header CRC".into());
            }
            if h[16..32] != self.uuid {
                return bad("uuid differs from the snapshot's".into());
            }
            let n = get32(&h, 8) as usize;
            if n == 0 || n > SPILL_PAGES || at + ((1 + n) * PAGE) as u64 > end {
                return bad(format!("{n} pages"));
            }
            for i in 0..n {
                let e = SPILL_ENTRIES_AT + i * SPILL_ENTRY;
                let (g, p, c) = (get32(&h, e), get32(&h, e + 4) as usize, get32(&h, e + 8));
                if g == u32::MAX {
                    continue;
                }
                let g = g as usize;
                if g >= units || p >= UNIT_PAGES || self.layout.bitmaps[g] >> p & 1 == 0 {
                    return bad(format!("entry {i}: unit {g} page {p} is not a stored page"));
                }
                if sp.mask[g] >> p & 1 == 1 {
                    return bad(format!("entry {i}: unit {g} page {p} spilled twice"));
                }
                sp.mask[g] |= 1 << p;
                sp.xor[g] ^= c;
                sp.pages.push((g, p, at + ((1 + i) * PAGE) as u64, c));
            }
            at += ((1 + n) * PAGE) as u64;
        }
        Ok(sp)
    }

    /// Reads spilled page (g, p) at `off` into `dst` (one page) and checks its CRC.
    fn read_spilled(&self, g: usize, p: usize, off: u64, crc: u32, dst: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .read_exact_at(dst, self.base + off)
            .map_err(|e| SnapshotError::io("read", &self.path, e))?;
        if page_crc(p, dst) != crc {
            return Err(self.bad_spilled(g, p, off));
        }
        Ok(())
    }

    fn bad_spilled(&self, g: usize, p: usize, off: u64) -> SnapshotError {
        let (r, u) = self.layout.locate(g);
        SnapshotError::corrupt(
            &self.path,
            format!(
                "CRC of spilled page {p} of unit {u} of region {:?} (bytes {off}..{})",
                self.layout.regions[r].name,
                off + PAGE as u64
            ),
        )
    }

    /// Whether unit `g` with main-area bytes `main` (its stored pages in order) and spilled
    /// pages `sp` matches its index checksum.
    fn unit_ok(&self, g: usize, main: &[u8], sp: &Spill) -> bool {
        let bm = self.layout.bitmaps[g];
        if self.version == 1 {
            crc32c::crc32c(main) == self.crcs[g]
        } else {
            unit_checksum(bm, main, sp.mask[g]) ^ sp.xor[g] == self.crcs[g]
        }
    }

    /// What the file holds.
    pub fn info(&self) -> Info {
        Info {
            path: self.path.clone(),
            method: self.method,
            uuid: uuid_hex(&self.uuid),
            created_ns: self.created_ns,
            regions: self.layout.regions.clone(),
            units: self.layout.units(),
            present_pages: self.layout.present_pages(),
            app_len: self.layout.app_len,
            file_len: self.len,
            target: self.target,
            version: self.version,
            spill_bytes: self.spill_len,
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn read_unit(&self, g: usize, buf: &mut Vec<u8>, sp: &Spill) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let (off, n) = self.layout.unit_extent(g);
        buf.resize(n, 0);
        self.file
            .read_exact_at(buf, self.base + off)
            .map_err(|e| SnapshotError::io("read", &self.path, e))?;
        if !self.unit_ok(g, buf, sp) {
            return Err(self.bad_unit_crc(g));
        }
        Ok(())
    }

    fn bad_unit_crc(&self, g: usize) -> SnapshotError {
        let (r, u) = self.layout.locate(g);
        let (off, n) = self.layout.unit_extent(g);
        SnapshotError::corrupt(
            &self.path,
            format!(
                "CRC of unit {u} of region {:?} (bytes {off}..{})",
                self.layout.regions[r].name,
                off + n as u64
            ),
        )
    }

    /// Reads `len` bytes at `off` into the pages `iov` lists, in order (`preadv`, retried on
    /// short reads and EINTR). Errors carry the errno.
    fn preadv_all(fd: i32, iov: &mut [libc::iovec], off: u64, len: usize) -> std::io::Result<()> {
        let mut done = 0usize;
        let mut first = 0usize;
        while done < len {
            // SAFETY: iov[first..] describe writable memory the caller borrows exclusively.
            let r = unsafe {
                libc::preadv(
                    fd,
                    iov[first..].as_ptr(),
                    (iov.len() - first).min(IOV_MAX) as i32,
                    (off + done as u64) as libc::off_t,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            done += r as usize;
            // Skip the pages filled; a partly filled page continues from its middle.
            let mut left = r as usize;
            while left > 0 {
                let l = iov[first].iov_len;
                if left >= l {
                    left -= l;
                    first += 1;
                } else {
                    // SAFETY: advancing inside the same page.
                    iov[first].iov_base =
                        unsafe { iov[first].iov_base.cast::<u8>().add(left) }.cast();
                    iov[first].iov_len = l - left;
                    left = 0;
                }
            }
        }
        Ok(())
    }

    /// [`SnapshotFile::preadv_all`] through `fd` (the direct descriptor, or the file's own); a
    /// file system that refuses the direct read (EINVAL) has it read buffered, and `fd` becomes
    /// the buffered descriptor from here on.
    fn read_pages(
        &self,
        fd: &mut i32,
        iov: &mut [libc::iovec],
        off: u64,
        len: usize,
    ) -> std::io::Result<()> {
        let res = Self::preadv_all(*fd, &mut iov.to_vec(), off, len);
        if res
            .as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL))
            && *fd != self.file.as_raw_fd()
        {
            *fd = self.file.as_raw_fd();
            return Self::preadv_all(*fd, iov, off, len);
        }
        res
    }

    /// Reads every unit and the application state and checks their CRCs.
    pub fn verify(&self) -> Result<()> {
        let sp = self.spill()?;
        let mut page = vec![0u8; PAGE];
        for &(g, p, off, c) in &sp.pages {
            self.read_spilled(g, p, off, c, &mut page)?;
        }
        let mut buf = Vec::new();
        for g in 0..self.layout.units() {
            self.read_unit(g, &mut buf, &sp)?;
        }
        self.app_state().map(|_| ())
    }

    /// The application state, CRC checked.
    pub fn app_state(&self) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; self.layout.app_len as usize];
        self.file
            .read_exact_at(&mut b, self.base + self.layout.app_at())
            .map_err(|e| SnapshotError::io("read", &self.path, e))?;
        if crc32c::crc32c(&b) != self.app_crc {
            return Err(SnapshotError::corrupt(&self.path, "application state CRC"));
        }
        Ok(b)
    }

    /// Writes region `r`'s snapshot into `dst` (its length): stored pages copied, the others
    /// zeroed. Every unit's CRC is checked before its bytes are used; on a failed check `dst`
    /// may hold part of the snapshot.
    pub fn restore_into(&self, r: usize, dst: &mut [u8]) -> Result<()> {
        self.restore(r, dst, false)
    }

    /// As [`SnapshotFile::restore_into`] into memory known to be all zeros (fresh anonymous
    /// memory): pages the snapshot does not store are left alone, so they stay unallocated.
    pub fn restore_into_zeroed(&self, r: usize, dst: &mut [u8]) -> Result<()> {
        self.restore(r, dst, true)
    }

    /// Restores units `us` of region `r` into `dst`, which starts at unit `us.start`.
    fn restore_units(
        &self,
        r: usize,
        us: std::ops::Range<usize>,
        dst: &mut [u8],
        mut fd: i32,
        zeroed: bool,
        sp: &Spill,
    ) -> Result<()> {
        let len = self.layout.regions[r].len;
        let base = us.start;
        let mut u = us.start;
        while u < us.end {
            let mut v = u;
            let mut pages = 0usize;
            while v < us.end {
                let c = self.layout.bitmaps[self.layout.unit(r, v)].count_ones() as usize;
                if v > u && pages + c > IOV_MAX {
                    break;
                }
                pages += c;
                v += 1;
            }
            let mut iov = Vec::with_capacity(pages);
            for w in u..v {
                let bm = self.layout.bitmaps[self.layout.unit(r, w)];
                for p in 0..UNIT_PAGES {
                    if bm >> p & 1 == 1 {
                        let at = (w - base) * UNIT_BYTES + p * PAGE;
                        iov.push(libc::iovec {
                            iov_base: dst[at..at + PAGE].as_mut_ptr().cast(),
                            iov_len: PAGE,
                        });
                    }
                }
            }
            let off = self.base + self.layout.unit_extent(self.layout.unit(r, u)).0;
            self.read_pages(&mut fd, &mut iov, off, pages * PAGE)
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        SnapshotError::corrupt(
                            &self.path,
                            "length (the file ends inside the pages)",
                        )
                    } else {
                        SnapshotError::io("preadv", &self.path, e)
                    }
                })?;
            for w in u..v {
                let g = self.layout.unit(r, w);
                let bm = self.layout.bitmaps[g];
                let start = (w - base) * UNIT_BYTES;
                let end = start + pages_in_unit(len, w) * PAGE;
                let unit = &mut dst[start..end];
                let mut crc = 0;
                for (p, page) in unit.chunks_mut(PAGE).enumerate() {
                    if bm >> p & 1 == 1 {
                        if self.version == 1 {
                            crc = crc32c::crc32c_append(crc, page);
                        } else if sp.mask[g] >> p & 1 == 0 {
                            crc ^= page_crc(p, page);
                        }
                    } else if !zeroed {
                        page.fill(0);
                    }
                }
                // Spilled pages count with their recorded CRCs here; the caller reads them
                // over the unit's and checks each against its record.
                if self.version != 1 {
                    crc ^= sp.xor[g];
                }
                if crc != self.crcs[g] {
                    return Err(self.bad_unit_crc(g));
                }
            }
            u = v;
        }
        Ok(())
    }

    fn restore(&self, r: usize, dst: &mut [u8], zeroed: bool) -> Result<()> {
        let Some(info) = self.layout.regions.get(r) else {
            return Err(SnapshotError::InvalidArgument(format!(
                "region {r} of {}",
                self.layout.regions.len()
            )));
        };
        if dst.len() as u64 != info.len {
            return Err(SnapshotError::InvalidArgument(format!(
                "region {:?} is {} bytes, the destination {}",
                info.name,
                info.len,
                dst.len()
            )));
        }
        // Stored pages go straight to their place: one `preadv` per run of units holding up
        // to IOV_MAX pages (consecutive units are consecutive in the file), with O_DIRECT
        // where the file system has it (large reads at the device's speed, no page cache), by
        // RESTORE_THREADS threads over contiguous shares of the units (a queue of reads at
        // the device; page faults and CRCs on every CPU).
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&self.path)
                .ok()
        };
        let fd = direct
            .as_ref()
            .map_or(self.file.as_raw_fd(), |f| f.as_raw_fd());
        let sp = self.spill()?;
        let sp = &sp;
        let units = units_of(info.len);
        let total: usize = (0..units)
            .map(|u| self.layout.bitmaps[self.layout.unit(r, u)].count_ones() as usize)
            .sum();
        // Shares of about equal pages.
        let mut cuts = vec![0usize];
        let mut acc = 0usize;
        for u in 0..units {
            acc += self.layout.bitmaps[self.layout.unit(r, u)].count_ones() as usize;
            if acc * RESTORE_THREADS >= total * cuts.len() && cuts.len() < RESTORE_THREADS {
                cuts.push(u + 1);
            }
        }
        if *cuts.last().expect("cuts") != units {
            cuts.push(units);
        }
        let mut shares = Vec::new();
        let mut rest = &mut *dst;
        for w in cuts.windows(2) {
            let (u0, u1) = (w[0], w[1]);
            let bytes = (u1 * UNIT_BYTES).min(info.len as usize) - u0 * UNIT_BYTES;
            let (mine, more) = rest.split_at_mut(bytes);
            rest = more;
            shares.push((u0, u1, mine));
        }
        std::thread::scope(|sc| {
            let handles: Vec<_> = shares
                .into_iter()
                .map(|(u0, u1, mine)| {
                    sc.spawn(move || self.restore_units(r, u0..u1, mine, fd, zeroed, sp))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(SnapshotError::Aborted("a restore thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<()>>>()
        })?;
        // Spilled pages over their units' bytes, each checked against its record (the units'
        // checks above counted the records): the spill area read in runs of up to IOV_MAX
        // pages, each page into its place or, for headers and other regions' pages, a scratch
        // page.
        let first = self.layout.unit(r, 0);
        let mine: Vec<(usize, usize, u64, u32)> = sp
            .pages
            .iter()
            .copied()
            .filter(|&(g, ..)| g >= first && g < first + units)
            .collect();
        let (Some(lo), Some(hi)) = (mine.first(), mine.last()) else {
            return Ok(());
        };
        let mut scratch = AlignedBuf::new(PAGE, PAGE)?;
        let scratch_ptr = scratch.as_mut_ptr();
        let (lo, hi) = (lo.2, hi.2 + PAGE as u64);
        let mut next = 0usize;
        let mut at = lo;
        let mut fd = fd;
        while at < hi {
            let n = (((hi - at) / PAGE as u64) as usize).min(IOV_MAX);
            let mut iov = Vec::with_capacity(n);
            let mut placed = Vec::new();
            for k in 0..n {
                let off = at + (k * PAGE) as u64;
                let base = match mine.get(next) {
                    Some(&(g, p, o, c)) if o == off => {
                        next += 1;
                        let d = (g - first) * UNIT_BYTES + p * PAGE;
                        placed.push((g, p, o, c, d));
                        dst[d..d + PAGE].as_mut_ptr()
                    }
                    _ => scratch_ptr,
                };
                iov.push(libc::iovec {
                    iov_base: base.cast(),
                    iov_len: PAGE,
                });
            }
            let len = n * PAGE;
            self.read_pages(&mut fd, &mut iov, self.base + at, len)
                .map_err(|e| SnapshotError::io("preadv", &self.path, e))?;
            for (g, p, o, c, d) in placed {
                if page_crc(p, &dst[d..d + PAGE]) != c {
                    return Err(self.bad_spilled(g, p, o));
                }
            }
            at += len as u64;
        }
        drop(scratch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(name: &str, pages: usize) -> RegionInfo {
        RegionInfo {
            name: name.into(),
            len: (pages * PAGE) as u64,
        }
    }

    /// Writes a snapshot of `mem` (one buffer per region) where pages that are all zero count
    /// as absent; returns the file.
    fn write(dir: &Path, regions: &[(&str, Vec<u8>)], app: &[u8]) -> PathBuf {
        let infos: Vec<RegionInfo> = regions
            .iter()
            .map(|(n, m)| region(n, m.len() / PAGE))
            .collect();
        let mut bitmaps = Vec::new();
        for (_, m) in regions {
            for u in 0..units_of(m.len() as u64) {
                let mut b = 0u64;
                for p in 0..pages_in_unit(m.len() as u64, u) {
                    let at = u * UNIT_BYTES + p * PAGE;
                    if m[at..at + PAGE].iter().any(|&x| x != 0) {
                        b |= 1 << p;
                    }
                }
                bitmaps.push(b);
            }
        }
        let layout = Layout::new(infos, bitmaps, app.len() as u64).unwrap();
        let target = dir.join("snap");
        let w = Writer::create(&target, layout, Method::Wp).unwrap();
        // Units in reverse order: offsets do not depend on the order of writes.
        let mut g = w.layout().units();
        for (_, m) in regions.iter().rev() {
            for u in (0..units_of(m.len() as u64)).rev() {
                g -= 1;
                let bm = w.layout().bitmap(g);
                let mut data = AlignedBuf::new(bm.count_ones() as usize * PAGE, PAGE).unwrap();
                let mut k = 0;
                for p in 0..64 {
                    if bm >> p & 1 == 1 {
                        let at = u * UNIT_BYTES + p * PAGE;
                        data[k * PAGE..(k + 1) * PAGE].copy_from_slice(&m[at..at + PAGE]);
                        k += 1;
                    }
                }
                w.write_unit(g, &data).unwrap();
            }
        }
        w.finish(app).unwrap();
        target
    }

    fn sample() -> Vec<(&'static str, Vec<u8>)> {
        let mut a = vec![0u8; 130 * PAGE];
        for p in [0usize, 1, 63, 64, 100, 129] {
            a[p * PAGE..(p + 1) * PAGE].fill(p as u8 + 1);
        }
        let mut b = vec![0u8; 3 * PAGE];
        b[PAGE + 17] = 9;
        vec![("heap", a), ("index", b)]
    }

    #[test]
    fn a_written_snapshot_restores_byte_for_byte() {
        let d = tempfile::tempdir().unwrap();
        let regions = sample();
        let p = write(d.path(), &regions, b"app state");
        let f = SnapshotFile::open(&p).unwrap();
        f.verify().unwrap();
        assert_eq!(f.app_state().unwrap(), b"app state");
        let info = f.info();
        assert_eq!(info.present_pages, 7);
        assert_eq!(info.regions.len(), 2);
        for (r, (_, m)) in regions.iter().enumerate() {
            let mut out = vec![0xeeu8; m.len()];
            f.restore_into(r, &mut out).unwrap();
            assert!(out == *m, "region {r} differs");
        }
        // Nothing but the file is left in the directory.
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn every_truncation_and_every_sampled_bit_flip_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), &sample(), b"state");
        let good = std::fs::read(&p).unwrap();
        let bad = d.path().join("bad");
        let refused = |bytes: &[u8]| -> bool {
            std::fs::write(&bad, bytes).unwrap();
            match SnapshotFile::open(&bad) {
                Err(SnapshotError::Corrupt { .. }) => true,
                Err(e) => panic!("not a corrupt-file error: {e}"),
                Ok(f) => f.verify().is_err(),
            }
        };
        // Truncated at every 4 KiB boundary and mid-page.
        let mut cut = 0;
        while cut < good.len() {
            assert!(refused(&good[..cut]), "truncated at {cut} accepted");
            assert!(
                refused(&good[..cut + 100]),
                "truncated at {} accepted",
                cut + 100
            );
            cut += PAGE;
        }
        // One flipped bit in the header, the index, each page, the app state and the trailer
        // (all but the padding, which no check covers: a flip there changes nothing read).
        let l = SnapshotFile::open(&p).unwrap().layout().clone();
        let mut spots = vec![0, 9, 13, 17, 21, 30, 60, 4000, PAGE + 3, PAGE + 9];
        for g in 0..l.units() {
            let (off, n) = l.unit_extent(g);
            if n > 0 {
                spots.push(off as usize + n / 2);
            }
        }
        spots.push(l.app_at() as usize + 2);
        let t = l.trailer_at() as usize;
        spots.extend([
            t,
            t + 9,
            t + 25,
            t + 33,
            t + 41,
            t + 49,
            t + 57,
            t + 61,
            t + 65,
        ]);
        for s in spots {
            let mut b = good.clone();
            b[s] ^= 0x10;
            assert!(refused(&b), "bit flip at {s} accepted");
        }
        // The good file still opens.
        assert!(!refused(&good));
    }

    /// A file whose unit 0 page 3 and unit 1 page 0 are spilled: the main area holds other
    /// bytes there; returns (path, the true image).
    fn write_spilled(dir: &Path) -> (PathBuf, Vec<u8>) {
        let pages = 100;
        let img: Vec<u8> = (0..pages * PAGE)
            .map(|i| (i / PAGE * 7 + i % 251) as u8)
            .collect();
        let l = Layout::new(vec![region("a", pages)], vec![u64::MAX, (1 << 36) - 1], 0).unwrap();
        let target = dir.join("spilled");
        let w = Writer::create(&target, l, Method::Wp).unwrap();
        let spilled = [(0usize, 3usize), (1, 0)];
        w.reserve_spill((3 * PAGE) as u64).unwrap();
        let mut batch = AlignedBuf::new(3 * PAGE, PAGE).unwrap();
        let mut entries = Vec::new();
        for (i, &(g, p)) in spilled.iter().enumerate() {
            let at = (g * UNIT_PAGES + p) * PAGE;
            batch[(1 + i) * PAGE..(2 + i) * PAGE].copy_from_slice(&img[at..at + PAGE]);
            let c = page_crc(p, &img[at..at + PAGE]);
            w.record_spilled_page(g, c);
            entries.push((g as u32, p as u32, c));
        }
        let uuid = *w.uuid();
        encode_spill_header(&mut batch[..PAGE], &uuid, &entries);
        let mut units = Vec::new();
        for (g, n) in [(0usize, 64usize), (1, 36)] {
            let mut b = AlignedBuf::new(n * PAGE, PAGE).unwrap();
            b.copy_from_slice(&img[g * UNIT_BYTES..g * UNIT_BYTES + n * PAGE]);
            let skip = spilled
                .iter()
                .filter(|s| s.0 == g)
                .fold(0u64, |m, s| m | 1 << s.1);
            for &(_, p) in spilled.iter().filter(|s| s.0 == g) {
                b[p * PAGE..(p + 1) * PAGE].fill(0xEE);
            }
            units.push((g, b, skip));
        }
        let ops: Vec<(u64, &[u8])> = units
            .iter()
            .map(|(g, b, _)| (w.layout().unit_extent(*g).0, &b[..]))
            .collect();
        w.write_spill_and(&[&batch[..]], &ops).unwrap();
        for (g, b, skip) in &units {
            w.record_unit(*g, unit_checksum(w.layout().bitmap(*g), b, *skip));
        }
        w.finish(&[]).unwrap();
        (target, img)
    }

    #[test]
    fn spilled_pages_override_their_units_and_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let (p, img) = write_spilled(d.path());
        let f = SnapshotFile::open(&p).unwrap();
        assert_eq!(f.info().spill_bytes, 3 * PAGE as u64);
        f.verify().unwrap();
        for zeroed in [false, true] {
            let mut out = vec![0u8; img.len()];
            f.restore(0, &mut out, zeroed).unwrap();
            assert!(out == img, "restored image differs (zeroed: {zeroed})");
        }
        let good = std::fs::read(&p).unwrap();
        let spill_at = f.layout().spill_at() as usize;
        let try_bytes = |b: &[u8]| -> String {
            let x = d.path().join("x");
            std::fs::write(&x, b).unwrap();
            let f = match SnapshotFile::open(&x) {
                Ok(f) => f,
                Err(e) => return e.to_string(),
            };
            let v = f.verify().map_err(|e| e.to_string());
            let mut out = vec![0u8; img.len()];
            let r = f.restore(0, &mut out, false).map_err(|e| e.to_string());
            assert_eq!(v.is_err(), r.is_err(), "verify {v:?}, restore {r:?}");
            v.err().unwrap_or_default()
        };
        // A flipped bit in a spilled page, its header's entries, magic or count.
        for (at, want) in [
            (spill_at + PAGE + 100, "spilled page 3 of unit 0"),
            (spill_at + 2 * PAGE + 7, "spilled page 0 of unit 1"),
            (spill_at + SPILL_ENTRIES_AT + 1, "spill batch"),
            (spill_at + 2, "spill batch"),
            (spill_at + 8, "spill batch"),
        ] {
            let mut b = good.clone();
            b[at] ^= 0x10;
            let e = try_bytes(&b);
            assert!(e.contains(want), "flip at {at}: {e:?} does not name {want}");
        }
        // A header that lists a page twice, or a page the unit does not store, CRC kept right.
        for (entry, want) in [
            ((0u32, 3u32), "spilled twice"),
            ((1, 40), "not a stored page"),
        ] {
            let mut b = good.clone();
            let e = spill_at + SPILL_ENTRIES_AT + SPILL_ENTRY;
            b[e..e + 4].copy_from_slice(&entry.0.to_le_bytes());
            b[e + 4..e + 8].copy_from_slice(&entry.1.to_le_bytes());
            let c = crc32c::crc32c(&b[spill_at..spill_at + HEADER_CRC_AT]);
            b[spill_at + HEADER_CRC_AT..spill_at + PAGE].copy_from_slice(&c.to_le_bytes());
            let e = try_bytes(&b);
            assert!(e.contains(want), "{e:?} does not name {want}");
        }
        // The main area's bytes at a spilled page are not the snapshot's: changing them
        // changes nothing.
        let mut b = good.clone();
        let at = f.layout().unit_extent(0).0 as usize + 3 * PAGE + 5;
        b[at] ^= 0xFF;
        assert_eq!(try_bytes(&b), "");
        // Cut inside the spill area: the trailer is gone.
        assert!(!try_bytes(&good[..spill_at + PAGE]).is_empty());
    }

    #[test]
    fn foreign_fields_are_named() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), &sample(), b"");
        let good = std::fs::read(&p).unwrap();
        let check = |patch: &dyn Fn(&mut Vec<u8>), want: &str| {
            let mut b = good.clone();
            patch(&mut b);
            // Keep the header's CRC right so that the field's own check is the one that fails.
            let c = crc32c::crc32c(&b[..HEADER_CRC_AT]);
            b[HEADER_CRC_AT..PAGE].copy_from_slice(&c.to_le_bytes());
            let bad = d.path().join("x");
            std::fs::write(&bad, &b).unwrap();
            let e = SnapshotFile::open(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{e} does not name {want}");
        };
        check(&|b| b[0] = b'X', "magic");
        check(&|b| b[8] = 7, "version 7");
        check(&|b| b[13] = 0x20, "page size 8192");
        check(&|b| b[16] = 32, "unit of 32 pages");
        check(&|b| b[REGIONS_AT] = 1, "region table");
        check(&|b| b[24] ^= 1, "uuid");
    }

    #[test]
    fn a_reservation_grows_or_is_truncated_to_the_layout() {
        let d = tempfile::tempdir().unwrap();
        for cap in [3 * PAGE as u64, 1 << 20] {
            let target = d.path().join(format!("s{cap}"));
            let l = Layout::new(vec![region("a", 64)], vec![u64::MAX], 0).unwrap();
            let r = Reservation::new(&target, cap).unwrap();
            let w = r.into_writer(l, Method::Wp).unwrap();
            let data = AlignedBuf::new(UNIT_BYTES, PAGE).unwrap();
            w.write_unit(0, &data).unwrap();
            let len = w.finish(&[]).unwrap();
            assert_eq!(std::fs::metadata(&target).unwrap().len(), len);
            SnapshotFile::open(&target).unwrap().verify().unwrap();
        }
        // A dropped reservation leaves nothing.
        drop(Reservation::new(&d.path().join("x"), 1 << 20).unwrap());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }

    #[test]
    fn layouts_refuse_what_cannot_be_written() {
        assert!(Layout::new(vec![], vec![], 0).is_err());
        assert!(Layout::new(vec![region("a", 1)], vec![0b10], 0).is_err());
        assert!(Layout::new(vec![region("a", 1)], vec![], 0).is_err());
        let odd = RegionInfo {
            name: "odd".into(),
            len: 100,
        };
        assert!(Layout::new(vec![odd], vec![0], 0).is_err());
        let long = RegionInfo {
            name: "n".repeat(MAX_NAME + 1),
            len: PAGE as u64,
        };
        assert!(Layout::new(vec![long], vec![0], 0).is_err());
        let l = Layout::new(
            vec![region("a", 65), region("b", 1)],
            vec![u64::MAX, 1, 1],
            5,
        )
        .unwrap();
        assert_eq!(l.units(), 3);
        assert_eq!(l.locate(2), (1, 0));
        assert_eq!(l.present_pages(), 66);
        assert_eq!(l.unit_extent(1).0, l.unit_extent(0).0 + 64 * PAGE as u64);
    }

    #[test]
    fn an_unfinished_writer_leaves_nothing_and_a_full_disk_refuses_first() {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::new(vec![region("a", 4)], vec![0b1111], 0).unwrap();
        let w = Writer::create(&d.path().join("s"), l.clone(), Method::Wp).unwrap();
        let tmp = w.tmp_path().to_path_buf();
        assert!(tmp.exists());
        drop(w);
        assert!(!tmp.exists());
        assert!(!d.path().join("s").exists());
        // A missing unit is refused at finish.
        let w = Writer::create(&d.path().join("s"), l, Method::Wp).unwrap();
        assert!(w.finish(&[]).is_err());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        // A file larger than the file system (1 PiB of application state).
        let huge = Layout::new(vec![region("h", 1)], vec![1], 1 << 50).unwrap();
        match Writer::create(&d.path().join("h"), huge, Method::Wp) {
            Err(SnapshotError::Media(tiermem_media::MediaError::NoSpace { .. })) => {}
            Err(e) => panic!("expected no space, got {e}"),
            Ok(_) => panic!("a 1 PiB file was allocated"),
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
