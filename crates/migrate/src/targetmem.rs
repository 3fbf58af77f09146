//! Target memory reserved before the freeze ([`TargetMemory`]): one private anonymous mapping the
//! size of a region, every page allocated up front (`MADV_POPULATE_WRITE`) while the
//! application still runs at the source. Installing migrated bytes is then a copy into memory
//! that exists plus a `UFFDIO_MOVE` of the page-table entries into the registered region: no
//! page allocation or clearing inside the migration and, on a VM, no host backing of new guest
//! memory (here 0.3–2.5 GB/s, against 10 GB/s for a copy; `tiermem doctor`'s *fresh memory*).
//! QEMU's `-mem-prealloc` reserves a destination's memory the same way. A region's pages are
//! the reserved pages moved, so the reservation costs no memory beyond the region's own. FAM
//! post-copy and the socket baseline reserve alike.
//!
//! Where the kernel refuses a move (source pages shared with a forked child, a hole) the bytes
//! are copied with `UFFDIO_COPY` instead, as without a reservation. [`TargetMemory::release`]
//! frees what was not moved (pages the region got as zero pages, or before the move) once the
//! migration is complete; installs after that copy.

use crate::mapping::Mapping;
pub use crate::mapping::POPULATE_HEADROOM;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;
use tiermem_fault::{FaultOps, RegionHandle, ResolveError, PAGE_SIZE};

/// A region's reserved target memory (see the module documentation).
pub struct TargetMemory {
    map: Mapping,
    /// Bytes populated from the start (all, or what the machine had room for): installs
    /// beyond it copy.
    populated: usize,
    /// Set by [`TargetMemory::release`]: installs copy instead.
    released: AtomicBool,
    /// Installs in flight (a release waits for them before freeing pages).
    users: AtomicU32,
    reserve_ns: u64,
}

impl TargetMemory {
    /// Map `len` bytes (rounded up to pages) of private anonymous memory, 4 KiB pages
    /// (`MADV_NOHUGEPAGE`: a region's pages move one by one), and populate them — all, or as
    /// many as leave 1 GiB of the machine's available memory ([`TargetMemory::populated`]).
    /// Errors: the mapping or the populate failing.
    pub fn reserve(len: usize) -> std::io::Result<TargetMemory> {
        let t = Instant::now();
        let map = Mapping::new(len.div_ceil(PAGE_SIZE) * PAGE_SIZE)?;
        let populated = map.populate()?;
        Ok(TargetMemory {
            map,
            populated,
            released: AtomicBool::new(false),
            users: AtomicU32::new(0),
            reserve_ns: t.elapsed().as_nanos() as u64,
        })
    }

    /// Bytes actually reserved (populated) from the start of the region: less than
    /// [`TargetMemory::len`] when the machine had no room for all of it (installs past it
    /// copy into new pages).
    pub fn populated(&self) -> usize {
        self.populated
    }

    /// Bytes reserved.
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// `true` for an empty reservation.
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// How long [`TargetMemory::reserve`] took, ns (before the freeze: not migration time).
    pub fn reserve_ns(&self) -> u64 {
        self.reserve_ns
    }

    /// The reserved bytes for `off..off + len`, if inside and not released; the caller holds
    /// a use (`users`) while it writes them.
    fn enter(&self, off: usize, len: usize) -> Option<*mut u8> {
        self.users.fetch_add(1, Ordering::SeqCst);
        if self.released.load(Ordering::SeqCst)
            || off % PAGE_SIZE != 0
            || off.checked_add(len).map_or(true, |e| e > self.populated)
        {
            self.users.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        // SAFETY: off + len is inside the mapping (checked above).
        Some(unsafe { self.map.ptr.add(off) })
    }

    fn leave(&self) {
        self.users.fetch_sub(1, Ordering::SeqCst);
    }

    /// Install `src` at region offset `off` outside any fault: copy it into the reserved pages
    /// at `off` and move them into the region (one `UFFDIO_MOVE`); pages present in the region
    /// keep their contents. Falls back to [`RegionHandle::install`] (a copy into new pages)
    /// when released, out of range, or refused by the kernel. Returns the bytes installed.
    pub fn install(
        &self,
        h: &RegionHandle,
        off: usize,
        src: &[u8],
    ) -> tiermem_fault::Result<usize> {
        if let Some(p) = self.enter(off, src.len()) {
            // SAFETY: `p..p + len` is our mapping (checked in `enter`), never the caller's
            // `src`; concurrent installs of one offset write the same bytes (the dumped image).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
            // SAFETY: the reserved pages are this process's private anonymous memory, used by
            // nothing but installs (which copy into them before moving).
            let r = unsafe { h.install_move(off, p, src.len()) };
            self.leave();
            if let Ok(n) = r {
                return Ok(n);
            }
        }
        h.install(off, src)
    }

    /// Install `len` bytes at region offset `off` outside any fault, written by `fill`
    /// straight into the reserved pages (e.g. a `pread` of the dumped image: one copy in all),
    /// then moved in; bytes that are all zero are mapped as zero pages instead (the reserved
    /// pages stay, freed at release). `None` when the reservation cannot take it (released,
    /// out of range) or `fill` failed: the caller installs some other way.
    pub fn install_with(
        &self,
        h: &RegionHandle,
        off: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Option<tiermem_fault::Result<usize>> {
        let p = self.enter(off, len)?;
        // SAFETY: `p..p + len` is our mapping (checked in `enter`). A fault on the same
        // offset may copy into it meanwhile (raw copies, never a Rust reference); both write
        // the dumped image, so the bytes read back are those.
        let buf = unsafe { std::slice::from_raw_parts_mut(p, len) };
        if !fill(buf) {
            self.leave();
            return None;
        }
        let r = if crate::resolve::is_zero(buf) {
            h.install_zero(off, len)
        } else {
            // SAFETY: as in `install`.
            match unsafe { h.install_move(off, p, len) } {
                Ok(n) => Ok(n),
                Err(_) => h.install(off, buf),
            }
        };
        self.leave();
        Some(r)
    }

    /// [`TargetMemory::install`] inside a fault (async-signal-safe: a copy, atomics, ioctls).
    pub fn resolve(
        &self,
        ops: &FaultOps<'_>,
        off: usize,
        src: &[u8],
    ) -> Result<usize, ResolveError> {
        if let Some(p) = self.enter(off, src.len()) {
            // SAFETY: as in `install`.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
            let r = ops.move_in(off, p, src.len());
            self.leave();
            if let Ok(n) = r {
                return Ok(n);
            }
        }
        ops.copy(off, src, false)
    }

    /// The migration is complete: installs copy from now on, and the pages that were never
    /// moved are freed (after any install in flight finished).
    pub fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
        while self.users.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        // SAFETY: our mapping; no install uses it any more (released, and none in flight).
        unsafe { libc::madvise(self.map.ptr.cast(), self.map.len, libc::MADV_DONTNEED) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tiermem_fault::{Engine, Fault, RegionSpec, Resolver};

    /// Faults install the image's page through the reservation.
    struct ViaStaging {
        image: Vec<u8>,
        mem: Arc<TargetMemory>,
    }
    impl Resolver for ViaStaging {
        fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
            let src = &self.image[f.offset..f.offset + PAGE_SIZE];
            self.mem.resolve(ops, f.offset, src).map(|_| ())
        }
    }

    /// Pages of `st` still mapped (not moved out).
    fn resident(st: &TargetMemory) -> usize {
        let mut v = vec![0u8; st.len() / PAGE_SIZE];
        // SAFETY: mincore reads the page tables of our live mapping.
        assert_eq!(
            unsafe { libc::mincore(st.map.ptr.cast(), st.len(), v.as_mut_ptr()) },
            0
        );
        v.iter().filter(|b| **b & 1 != 0).count()
    }

    #[test]
    fn installs_move_reserved_pages_in_and_keep_what_the_region_has() {
        let len = 8 << 20;
        let image: Vec<u8> = (0..len).map(|i| (i / 4096 * 31 + i) as u8).collect();
        let st = Arc::new(TargetMemory::reserve(len).unwrap());
        assert_eq!(st.len(), len);
        let map = Mapping::new(len).unwrap();
        let h = Engine::global()
            .register(
                RegionSpec::new(map.ptr, len).missing(true).in_thread(),
                Arc::new(ViaStaging {
                    image: image.clone(),
                    mem: st.clone(),
                }),
            )
            .expect("register (needs root or vm.unprivileged_userfaultfd)");
        // The application writes page 3 first (a fault through the reservation), then its
        // own byte; the background install of the first 2 MiB must keep that byte.
        // SAFETY: inside the registered mapping.
        unsafe { *map.ptr.add(3 * 4096 + 5) = 0xEE };
        let n = st.install(&h, 0, &image[..2 << 20]).unwrap();
        assert_eq!(n, (2 << 20) - 4096, "every page but the present one moved");
        for off in (2 << 20..len).step_by(2 << 20) {
            st.install(&h, off, &image[off..off + (2 << 20)]).unwrap();
        }
        // The pages changed hands: only page 3's second reserved page (the install copied
        // into the hole the fault's move left, then found the region's page present) stayed.
        assert_eq!(resident(&st), 1);
        // SAFETY: every page is present now.
        let got = unsafe { std::slice::from_raw_parts(map.ptr, len) };
        for (i, (&g, &w)) in got.iter().zip(&image).enumerate() {
            let want = if i == 3 * 4096 + 5 { 0xEE } else { w };
            assert_eq!(g, want, "byte {i}");
        }
        // Released: installs copy instead, and what stayed in the reservation is freed.
        st.release();
        assert!(st.enter(0, 4096).is_none());
        assert_eq!(resident(&st), 0);
        h.unregister().unwrap();
    }
}
