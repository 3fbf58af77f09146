//! Regions: a backing file's mapping ([`Region`], the application's handle; `RegionInner`, its
//! state: file, checksum table, DRAM cache, shared slot) and reads through it.

use super::*;

/// A backing file's region.
pub(crate) struct RegionInner {
    pub(crate) file_id: u32,
    /// Shared mode: the region's slot in the shared-memory object.
    pub(crate) shared: Option<shared::SharedRef>,
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
    pub(crate) file: File,
    /// Private regions: the checksum table of the backing file's pages (`sums`).
    pub(crate) sums: Option<sums::SumTable>,
    /// A writeback of this region failed after its table write: the table's last CRC of a unit
    /// may not be what the file holds, so later writebacks read the file for `prev`.
    pub(crate) sums_unsure: AtomicBool,
    pub(crate) dram: DramCache,
    /// Open transactions that wrote into this region.
    pub(crate) open_writers: AtomicU32,
    pub(crate) closing: AtomicBool,
}

impl RegionInner {
    pub(crate) fn base(&self) -> usize {
        self.dram.rview as usize
    }
}

/// A region returned by [`Vnvm::nv_allocate`]. Cloning shares the region. The mapping stays
/// valid while any handle lives, even after `nv_free` or `nv_release` (it then no longer
/// changes).
#[derive(Clone)]
pub struct Region(pub(crate) Arc<RegionInner>);

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.0.path)
            .field("size", &self.0.size)
            .field("file_id", &self.0.file_id)
            .finish()
    }
}

impl Region {
    /// Start of the region: a **read-only** view of its DRAM cache holding committed data.
    /// Plain loads read committed data; a store through it raises SIGSEGV.
    pub fn as_ptr(&self) -> *const u8 {
        self.0.dram.rview
    }
    /// Length of the region in bytes (the size given to `nv_allocate`).
    pub fn len(&self) -> usize {
        self.0.size as usize
    }
    /// True when the region is empty (never: sizes are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }
    /// The backing file.
    pub fn path(&self) -> &Path {
        &self.0.path
    }
    /// The file-record id of the region within its instance.
    pub fn file_id(&self) -> u32 {
        self.0.file_id
    }
    /// Copy `buf.len()` committed bytes at region offset `off` into `buf`. Panics when the range
    /// is outside the region.
    pub fn read(&self, off: usize, buf: &mut [u8]) {
        assert!(
            off.checked_add(buf.len()).is_some_and(|e| e <= self.len()),
            "read {off}+{} outside the {}-byte region",
            buf.len(),
            self.len()
        );
        // SAFETY: in bounds of the read-only mapping, which lives as long as self. Concurrent
        // commits may change the bytes while they are copied (a racy read of plain memory).
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(off), buf.as_mut_ptr(), buf.len())
        }
    }
}
