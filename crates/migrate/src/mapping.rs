//! An owned private anonymous mapping (`MAP_NORESERVE`), unmapped on drop: the memory a
//! migration target restores a region into, and the socket baseline's staging buffer.

/// A private anonymous read-write mapping, unmapped on drop unless handed over with
/// [`Mapping::into_raw`].
pub(crate) struct Mapping {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: the mapping is owned (unmapped once, on drop) and valid from any thread; who may
// read or write its bytes is governed by its owners (a staging protocol, a region's fault
// engine registration).
unsafe impl Send for Mapping {}
// SAFETY: as above; `Mapping` itself offers no access to the bytes.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes (page aligned by the caller).
    pub(crate) fn new(len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// Allocate the first pages now (`MADV_POPULATE_WRITE`; 4 KiB pages, `MADV_NOHUGEPAGE`),
    /// so that later stores there cost a store rather than a page allocation (and, on a VM, no
    /// host backing of new guest memory): all of them, or as many as leave
    /// [`POPULATE_HEADROOM`] of the machine's available memory (a populate past it would
    /// wake the OOM killer, not fail). Returns the bytes populated (a page multiple). Errors:
    /// the populate failing.
    pub(crate) fn populate(&self) -> std::io::Result<usize> {
        let fits = tiermem_media::mem_available()
            .map_or(self.len as u64, |a| a.saturating_sub(POPULATE_HEADROOM));
        let len = (self.len as u64).min(fits) as usize / 4096 * 4096;
        // SAFETY: our mapping of `self.len` bytes; advice changes no contents.
        unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_NOHUGEPAGE) };
        if len > 0 {
            // SAFETY: the first `len` bytes of our page-aligned, writable mapping.
            unsafe { tiermem_media::populate_write(self.ptr, len) }?;
        }
        Ok(len)
    }

    /// Give up ownership: the caller unmaps `(ptr, len)` when done with it.
    pub(crate) fn into_raw(self) -> (*mut u8, usize) {
        let r = (self.ptr, self.len);
        std::mem::forget(self);
        r
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping and nothing references it any more (its users are
        // dropped before it).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Memory a populate leaves to the rest of the machine, bytes.
pub const POPULATE_HEADROOM: u64 = 1 << 30;
