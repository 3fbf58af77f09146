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

    /// Allocate every page now (`MADV_POPULATE_WRITE`; 4 KiB pages, `MADV_NOHUGEPAGE`), so
    /// that later stores cost a store rather than a page allocation (and, on a VM, no host
    /// backing of new guest memory). Errors: the populate failing (ENOMEM).
    pub(crate) fn populate(&self) -> std::io::Result<()> {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: our mapping of `len` bytes; advice changes no contents.
        unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_NOHUGEPAGE) };
        // SAFETY: as above; populating allocates zero pages and changes no contents.
        if unsafe { libc::madvise(self.ptr.cast(), self.len, MADV_POPULATE_WRITE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
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
