//! The paged arena: one [`tiermem_pager::PagedRegion`] and a page-granular extent allocator
//! over it, for the program's large blocks and large anonymous mappings.
//!
//! Extents are whole pages. Free extents are kept by start page and merged with their
//! neighbours; a block's extent is found by its start (free, realloc) or by any address inside
//! it (a partial `munmap`). A freed range is dropped with `MADV_DONTNEED` before it is reused:
//! the pager frees its buffer and swap slots, and the memory reads as zeros again, which is what
//! `calloc` and `mmap` promise.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use tiermem_pager::{PagedRegion, Pager, PagerOptions};

/// Bytes in a page.
pub const PAGE: usize = 4096;

struct Extents {
    /// Free extents: start page → pages.
    free: BTreeMap<usize, usize>,
    /// Blocks in use: start page → pages.
    used: BTreeMap<usize, usize>,
}

/// The pager, its one region, and the extents of that region.
pub struct Arena {
    // Field order: the region drops before the pager (it never does: the arena is static).
    region: PagedRegion,
    pager: Pager,
    ext: Mutex<Extents>,
    base: usize,
    len: usize,
}

impl Arena {
    /// A pager with `opts` and a region of `len` bytes (whole pages) for the program's blocks;
    /// `bound`: an optional page-in bound (percentile, ns) for the region.
    pub fn new(
        opts: &PagerOptions,
        len: usize,
        bound: Option<(f64, u64)>,
    ) -> Result<Arena, String> {
        let pager = Pager::new(opts).map_err(|e| e.to_string())?;
        let region = pager.map(len).map_err(|e| e.to_string())?;
        if let Some((pct, ns)) = bound {
            region.set_bound(pct, ns).map_err(|e| e.to_string())?;
        }
        let base = region.as_ptr() as usize;
        let len = region.len();
        let mut free = BTreeMap::new();
        free.insert(0, len / PAGE);
        Ok(Arena {
            region,
            pager,
            ext: Mutex::new(Extents {
                free,
                used: BTreeMap::new(),
            }),
            base,
            len,
        })
    }

    /// First byte of the arena.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Length of the arena in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (the arena has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pager (for its statistics).
    pub fn pager(&self) -> &Pager {
        &self.pager
    }

    /// A block of at least `bytes` bytes whose address is a multiple of `align` (a power of
    /// two; at least a page is always given), zeroed; `None` when no free extent is big enough.
    pub fn alloc(&self, bytes: usize, align: usize) -> Option<*mut u8> {
        let pages = bytes.max(1).div_ceil(PAGE);
        let align_pages = (align / PAGE).max(1);
        let mut e = self.ext.lock();
        // First fit by address: low addresses are reused first, the arena's tail stays whole.
        let (start, have, at) = e.free.iter().find_map(|(&s, &n)| {
            let first = (self.base / PAGE + s).next_multiple_of(align_pages) - self.base / PAGE;
            (first + pages <= s + n).then_some((s, n, first))
        })?;
        e.free.remove(&start);
        if at > start {
            e.free.insert(start, at - start);
        }
        if at + pages < start + have {
            e.free.insert(at + pages, start + have - at - pages);
        }
        e.used.insert(at, pages);
        Some((self.base + at * PAGE) as *mut u8)
    }

    /// Whether `addr` is inside the arena.
    #[inline]
    pub fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.base) < self.len
    }

    /// The length in bytes of the block that starts at `addr`, if one does.
    pub fn block_len(&self, addr: usize) -> Option<usize> {
        let p = (addr - self.base) / PAGE;
        if addr % PAGE != 0 {
            return None;
        }
        self.ext.lock().used.get(&p).map(|&n| n * PAGE)
    }

    /// Frees the block that starts at `addr`; false if no block starts there.
    pub fn free(&self, addr: usize) -> bool {
        let Some(len) = self.block_len(addr) else {
            return false;
        };
        self.release(addr, len);
        true
    }

    /// Gives back every page of `[addr, addr + len)` that belongs to a block (a partial
    /// `munmap`): blocks are cut around the range. Returns the bytes released.
    pub fn release(&self, addr: usize, len: usize) -> usize {
        let lo = (addr.max(self.base) - self.base) / PAGE;
        let hi = ((addr.saturating_add(len)).min(self.base + self.len) - self.base).div_ceil(PAGE);
        if lo >= hi {
            return 0;
        }
        let mut cut: Vec<(usize, usize)> = Vec::new();
        {
            let mut e = self.ext.lock();
            // Blocks that overlap [lo, hi): the one starting before lo, and those inside.
            let overlapping: Vec<(usize, usize)> = e
                .used
                .range(..hi)
                .rev()
                .take_while(|(&s, &n)| s + n > lo)
                .map(|(&s, &n)| (s, n))
                .collect();
            for (s, n) in overlapping {
                e.used.remove(&s);
                let (a, b) = (s.max(lo), (s + n).min(hi));
                if s < a {
                    e.used.insert(s, a - s);
                }
                if b < s + n {
                    e.used.insert(b, s + n - b);
                }
                cut.push((a, b - a));
            }
        }
        // Drop the pages (the pager frees their slots; they read as zeros again), then make
        // them free extents.
        let mut total = 0;
        for &(s, n) in &cut {
            crate::hooks::drop_pages(self.base + s * PAGE, n * PAGE);
            total += n * PAGE;
        }
        let mut e = self.ext.lock();
        for (s, n) in cut {
            insert_free(&mut e.free, s, n);
        }
        total
    }

    /// Pins `[addr, addr + len)` ∩ the arena in DRAM (see [`PagedRegion::pin`]); returns the
    /// pinned offset range for [`Arena::unpin`].
    pub fn pin(&self, addr: usize, len: usize) -> Option<(usize, usize)> {
        let lo = addr.max(self.base);
        let hi = addr.saturating_add(len).min(self.base + self.len);
        if lo >= hi {
            return None;
        }
        self.region.pin(lo - self.base, hi - lo);
        Some((lo - self.base, hi - lo))
    }

    /// Drops pins taken by [`Arena::pin`].
    pub fn unpin(&self, r: (usize, usize)) {
        self.region.unpin(r.0, r.1);
    }

    /// Blocks in use and their pages.
    pub fn usage(&self) -> (usize, usize) {
        let e = self.ext.lock();
        (e.used.len(), e.used.values().sum())
    }
}

/// Adds the free extent `[s, s + n)`, merged with free neighbours.
fn insert_free(free: &mut BTreeMap<usize, usize>, mut s: usize, mut n: usize) {
    if let Some((&ps, &pn)) = free.range(..s).next_back() {
        if ps + pn == s {
            free.remove(&ps);
            s = ps;
            n += pn;
        }
    }
    if let Some(&nn) = free.get(&(s + n)) {
        free.remove(&(s + n));
        n += nn;
    }
    free.insert(s, n);
}
