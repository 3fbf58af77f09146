//! The DRAM cache of a region, mapped twice: read-only for the application, writable for vnvm.
//! Private regions: a memfd filled from the backing file. Shared regions (§2.4.4): the backing
//! file itself (`MAP_SHARED`), so every process sees one page cache.

use crate::error::{io_err, Result};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Two views of one memfd (private) or of the backing file (shared).
pub(crate) struct DramCache {
    _fd: Option<OwnedFd>,
    pub rview: *mut u8,
    pub wview: *mut u8,
    pub map_len: usize,
}

// SAFETY: the mappings are owned by the DramCache and unmapped only in Drop; concurrent access
// to their bytes is ordered by vnvm's locks (writers) or is a racy read the API documents.
unsafe impl Send for DramCache {}
// SAFETY: see above.
unsafe impl Sync for DramCache {}

impl DramCache {
    /// Create a cache of `map_len` bytes (a multiple of the OS page size) filled with the first
    /// `fill_len` bytes of `file`.
    pub fn new(path: &Path, file: &File, map_len: usize, fill_len: usize) -> Result<DramCache> {
        let name = c"tiermem-vnvm";
        // SAFETY: name is a valid C string; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io_err(
                "memfd_create",
                path,
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is open.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), map_len as libc::off_t) } != 0 {
            return Err(io_err(
                "ftruncate memfd",
                path,
                std::io::Error::last_os_error(),
            ));
        }
        let map = |prot| {
            // SAFETY: mapping an fd we own with a checked result.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    prot,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                Err(io_err("mmap memfd", path, std::io::Error::last_os_error()))
            } else {
                Ok(p as *mut u8)
            }
        };
        let wview = map(libc::PROT_READ | libc::PROT_WRITE)?;
        let rview = match map(libc::PROT_READ) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: unmapping the mapping made just above.
                unsafe { libc::munmap(wview as *mut _, map_len) };
                return Err(e);
            }
        };
        let dc = DramCache {
            _fd: Some(fd),
            rview,
            wview,
            map_len,
        };
        // Only the file's data segments are read (SEEK_DATA / SEEK_HOLE): a hole is zeros,
        // which the fresh memfd already is, and reading it would allocate DRAM for nothing (a
        // new 1 GiB region would cost 1 GiB at nv_allocate).
        let mut pos = 0usize;
        while pos < fill_len {
            let (data, hole) = match data_segment(file, pos) {
                Ok(Some(seg)) => seg,
                Ok(None) => break,
                Err(e) => return Err(io_err("seek backing file", path, e)),
            };
            let (start, end) = (data.max(pos), hole.min(fill_len));
            let mut done = start;
            while done < end {
                // SAFETY: wview + done .. + (end - done) lies in the writable mapping
                // (end ≤ fill_len ≤ map_len).
                let n = unsafe {
                    libc::pread(
                        file.as_raw_fd(),
                        dc.wview.add(done) as *mut libc::c_void,
                        end - done,
                        done as libc::off_t,
                    )
                };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(io_err("read backing file", path, e));
                }
                if n == 0 {
                    break;
                }
                done += n as usize;
            }
            if done < end {
                break; // the file ended early (truncated meanwhile): the rest stays zero
            }
            pos = end;
        }
        Ok(dc)
    }
}

/// The data segment of `file` at or after `pos`: `Some((data start, hole start))`, `None` past
/// the last data. Falls back to "everything is data" where SEEK_DATA is not supported.
fn data_segment(file: &File, pos: usize) -> std::io::Result<Option<(usize, usize)>> {
    let fd = file.as_raw_fd();
    // SAFETY: lseek on a descriptor we borrow; the results are checked.
    let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(Some((pos, usize::MAX))),
            _ => Err(e),
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
    if hole < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((data as usize, hole as usize)))
}

impl DramCache {
    /// The DRAM cache of a shared region: `file` mapped twice (`MAP_SHARED`). `map_len` may
    /// exceed the file only within its last page.
    pub fn new_shared(path: &Path, file: &File, map_len: usize) -> Result<DramCache> {
        let map = |prot| {
            // SAFETY: mapping an open file with a checked result.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    prot,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                Err(io_err(
                    "mmap shared region",
                    path,
                    std::io::Error::last_os_error(),
                ))
            } else {
                Ok(p as *mut u8)
            }
        };
        let wview = map(libc::PROT_READ | libc::PROT_WRITE)?;
        let rview = match map(libc::PROT_READ) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: unmapping the mapping made just above.
                unsafe { libc::munmap(wview as *mut _, map_len) };
                return Err(e);
            }
        };
        Ok(DramCache {
            _fd: None,
            rview,
            wview,
            map_len,
        })
    }

    /// msync(MS_SYNC) `len` bytes of the writable view from `off` (page-aligned).
    pub fn sync_range(&self, off: usize, len: usize) -> std::io::Result<()> {
        let len = len.min(self.map_len - off);
        // SAFETY: the range lies within the writable mapping.
        if unsafe { libc::msync(self.wview.add(off) as *mut _, len, libc::MS_SYNC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for DramCache {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the two mappings made in new().
        unsafe {
            libc::munmap(self.rview as *mut _, self.map_len);
            libc::munmap(self.wview as *mut _, self.map_len);
        }
    }
}
