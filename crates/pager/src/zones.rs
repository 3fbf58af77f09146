//! The two places an evicted page can be: the NVM paging buffer (a `media` pool, slots of one
//! page) and the regular zone (an SSD swap file, `O_DIRECT`). Each owns its device and its
//! [`SlotMap`]; neither knows about regions or groups (the evictor does).

use crate::error::{Error, Result};
use crate::segment::PagerPool;
use crate::slots::SlotMap;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tiermem_fault::PAGE_SIZE;
use tiermem_media::{DelayModel, Pool, PoolOptions, SsdDevice};

/// The media pool a buffer's slots are in: its own, or a pager pool shared by processes.
pub(crate) enum PoolRef {
    Own(Box<Pool>),
    Shared(Arc<PagerPool>),
}

impl std::ops::Deref for PoolRef {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        match self {
            PoolRef::Own(p) => p,
            PoolRef::Shared(s) => s.media(),
        }
    }
}

/// The NVM paging buffer.
pub struct Buffer {
    pub(crate) pool: PoolRef,
    /// Slot 0's address.
    base: *mut u8,
    pub(crate) slots: SlotMap,
}

// SAFETY: `base` points into the pool mapping `pool` keeps alive; slots are handed out by the
// lock-free map, and a slot's bytes are only touched by whoever holds it.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Creates a pool of `bytes` (rounded down to pages, plus its header page) at `path` with
    /// the delay model `delay`, and unlinks the file at once: the buffer lives exactly as long
    /// as its mapping, so a process killed with pages in it leaves nothing behind on tmpfs.
    pub fn create(path: &Path, bytes: u64, delay: DelayModel) -> Result<Buffer> {
        let pages = bytes / PAGE_SIZE as u64;
        let opts = PoolOptions::new((pages + 1) * PAGE_SIZE as u64)
            .delay(delay)
            .tag("pager-buffer");
        let pool = Pool::create(path, &opts)?;
        let _ = std::fs::remove_file(path);
        let slots = pool.data_len() / PAGE_SIZE;
        Ok(Buffer {
            base: pool.data_ptr(),
            pool: PoolRef::Own(Box::new(pool)),
            slots: SlotMap::new(slots),
        })
    }

    /// The buffer of a shared pager pool, taking slots under owner tag `tag`.
    pub(crate) fn shared(pool: Arc<PagerPool>, tag: u32) -> Buffer {
        Buffer {
            base: pool.buffer_base(),
            slots: pool.buffer_map(tag),
            pool: PoolRef::Shared(pool),
        }
    }

    /// Address of slot `s` in the mapped pool.
    #[inline]
    pub(crate) fn slot_ptr(&self, s: u64) -> *mut u8 {
        // SAFETY: slots are < capacity, so the offset stays inside the pool's data area.
        unsafe { self.base.add(s as usize * PAGE_SIZE) }
    }

    /// Slots in the buffer.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }
}

/// The regular zone: a swap file on a disk.
pub struct Swap {
    pub(crate) dev: SsdDevice,
    pub(crate) slots: SlotMap,
    /// The FIFO key (region key | page) last written to each slot: prefetch finds a cluster's
    /// pages through it, and trusts it only where the shadow table agrees.
    pub(crate) owner: Box<[AtomicU64]>,
}

impl Swap {
    /// Creates a swap file of `bytes` (rounded down to pages) at `path`, opened `O_DIRECT`,
    /// refusing tmpfs. The file is unlinked at once: it lives as long as the pager.
    pub fn create(path: &Path, bytes: u64, delay: Option<DelayModel>) -> Result<Swap> {
        let (dev, pages) = Swap::create_kept(path, bytes)?;
        let _ = std::fs::remove_file(path);
        if let Some(d) = delay {
            dev.set_delay(d);
        }
        Ok(Swap {
            dev,
            slots: SlotMap::new(pages),
            owner: owners(pages),
        })
    }

    /// The swap file of a shared pager pool, taking slots under owner tag `tag`.
    pub(crate) fn shared(pool: &PagerPool, tag: u32, delay: Option<DelayModel>) -> Result<Swap> {
        let dev = SsdDevice::open(pool.swap_path())?;
        if let Some(d) = delay {
            dev.set_delay(d);
        }
        let slots = pool.swap_map(tag);
        let pages = slots.capacity();
        Ok(Swap {
            dev,
            slots,
            owner: owners(pages),
        })
    }

    /// Creates the swap file (refusing tmpfs) and keeps it: the device and its pages.
    pub(crate) fn create_kept(path: &Path, bytes: u64) -> Result<(SsdDevice, usize)> {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        if is_tmpfs(dir)? {
            return Err(Error::SwapOnTmpfs {
                path: path.to_path_buf(),
            });
        }
        let pages = bytes / PAGE_SIZE as u64;
        if pages == 0 {
            return Err(Error::InvalidOption(format!(
                "the swap file must hold at least one page (got {bytes} bytes)"
            )));
        }
        let dev = SsdDevice::create(path, pages * PAGE_SIZE as u64)?;
        Ok((dev, pages as usize))
    }
}

/// The per-slot FIFO keys of a swap file of `pages` slots, none yet.
fn owners(pages: usize) -> Box<[AtomicU64]> {
    (0..pages).map(|_| AtomicU64::new(u64::MAX)).collect()
}

/// Whether `dir` is on tmpfs (the media layer's check, with the pager's error).
pub(crate) fn is_tmpfs(dir: &Path) -> Result<bool> {
    tiermem_media::on_tmpfs(dir).map_err(|source| Error::Sys {
        op: "statfs of the swap file's directory",
        source,
    })
}
