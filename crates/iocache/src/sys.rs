//! The system calls iocache is built on, each wrapped once: `cachestat(2)` (what of a file range
//! the page cache holds), `posix_fadvise`, `sync_file_range`, and whole-buffer `pread`/`pwrite`/
//! `preadv2` that retry interrupted and short transfers; for z-READ the mappings (`mmap`,
//! `MADV_POPULATE_*`), read leases and `fstat`.

use std::io;
use std::os::fd::RawFd;

/// `cachestat(2)` (Linux 6.5): x86-64 and aarch64 share the generic number.
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct cachestat_range` of the uapi.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// What the page cache holds of a file range, in pages (`struct cachestat` of the uapi).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages of the range in the page cache.
    pub nr_cache: u64,
    /// Of those, dirty pages.
    pub nr_dirty: u64,
    /// Of those, pages under writeback.
    pub nr_writeback: u64,
    /// Pages evicted from the range (shadow entries).
    pub nr_evicted: u64,
    /// Evicted pages that were recently active.
    pub nr_recently_evicted: u64,
}

/// `cachestat(fd, off, len)`: how many of the range's pages the page cache holds. `len == 0`
/// means to the end of the file.
pub fn cachestat(fd: RawFd, off: u64, len: u64) -> io::Result<CacheStat> {
    let range = CachestatRange { off, len };
    let mut out = CacheStat::default();
    // SAFETY: raw cachestat(2) with a valid range struct and a properly sized out struct.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd,
            &range as *const CachestatRange,
            &mut out as *mut CacheStat,
            0u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(out)
}

/// `posix_fadvise(fd, off, len, advice)`.
pub fn fadvise(fd: RawFd, off: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall on a caller-owned fd.
    let rc = unsafe { libc::posix_fadvise(fd, off as libc::off_t, len as libc::off_t, advice) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// `sync_file_range(fd, off, len, SYNC_FILE_RANGE_WRITE)`: start write-back of the range's dirty
/// pages without waiting for it.
pub fn start_writeback(fd: RawFd, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a caller-owned fd.
    let rc = unsafe {
        libc::sync_file_range(
            fd,
            off as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `sync_file_range(fd, off, len, WAIT_BEFORE | WRITE | WAIT_AFTER)`: the range's dirty pages are
/// written and clean when it returns (data only: no metadata, no device flush).
pub fn write_and_wait(fd: RawFd, off: u64, len: u64) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain syscall on a caller-owned fd.
    let rc =
        unsafe { libc::sync_file_range(fd, off as libc::off64_t, len as libc::off64_t, flags) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` lives on tmpfs (`fstatfs`'s `f_type` is `TMPFS_MAGIC`).
pub fn on_tmpfs(fd: RawFd) -> io::Result<bool> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: statfs is plain old data; fstatfs fills it for a valid fd.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    if unsafe { libc::fstatfs(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == TMPFS_MAGIC)
}

/// `fdatasync(fd)`.
pub fn fdatasync(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall on a caller-owned fd.
    if unsafe { libc::fdatasync(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads `buf.len()` bytes at `off` with `preadv2(flags)`, retrying EINTR and short reads; the
/// part past end of file is zero-filled. Returns the bytes the file had (≤ `buf.len()`).
/// `RWF_NOWAIT` reads fail with `WouldBlock` when the data is not cached.
pub fn pread_full(fd: RawFd, buf: &mut [u8], off: u64, flags: libc::c_int) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        let at = (off + done as u64) as libc::off_t;
        let n = if flags == 0 {
            // Plain pread: no iovec to import (cheaper per call than preadv2).
            // SAFETY: the pointer and length describe the live, writable remainder of `buf`.
            unsafe { libc::pread64(fd, rest.as_mut_ptr().cast(), rest.len(), at) }
        } else {
            let iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            // SAFETY: one iovec over the live, writable remainder of `buf`.
            unsafe { libc::preadv2(fd, &iov, 1, at, flags) }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    if done < buf.len() {
        buf[done..].fill(0);
    }
    Ok(done)
}

/// Writes all of `buf` at `off`, retrying EINTR and short writes.
pub fn pwrite_full(fd: RawFd, buf: &[u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the live remainder of `buf`.
        let n = unsafe {
            libc::pwrite(
                fd,
                buf[done..].as_ptr().cast(),
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwrite wrote nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Mappings (z-READ)
// ---------------------------------------------------------------------------------------------

/// `MADV_POPULATE_READ` (Linux 5.14): map the range's pages readable; an unmappable page is an
/// error (`EFAULT`), not a `SIGBUS`.
pub const MADV_POPULATE_READ: libc::c_int = 22;
/// `MADV_POPULATE_WRITE` (Linux 5.14): fault the range's pages writable (breaking
/// copy-on-write of a private file mapping).
pub const MADV_POPULATE_WRITE: libc::c_int = 23;

/// `mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0)`: a read-only shared mapping of a file.
pub fn map_shared_ro(fd: RawFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh mapping chosen by the kernel; nothing existing is replaced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// `mmap(addr, len, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_FIXED, fd, off)`: replaces the pages at
/// `addr` with a copy-on-write view of the file.
///
/// # Safety
/// `addr..addr+len` must be page-aligned memory the caller owns and may replace: whatever was
/// mapped there is discarded.
pub unsafe fn map_private_fixed(addr: *mut u8, len: usize, fd: RawFd, off: u64) -> io::Result<()> {
    // SAFETY: the caller owns the range (this function's contract).
    let p = unsafe {
        libc::mmap(
            addr.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            fd,
            off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A private anonymous mapping owned by its value (unmapped on drop): the pool's frames, the
/// loss model's scratch buffer.
pub struct AnonMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; its users synchronise access to its bytes.
unsafe impl Send for AnonMap {}
// SAFETY: as above.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    /// Maps `len` bytes of zeroed, private, anonymous memory.
    pub fn new(len: usize) -> io::Result<AnonMap> {
        // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AnonMap {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pins it in memory (`mlock`); false when `RLIMIT_MEMLOCK` refuses (it stays usable).
    pub fn lock(&self) -> bool {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::mlock(self.ptr.cast(), self.len) == 0 }
    }

    /// Makes it fresh anonymous memory again, whatever was mapped over parts of it since.
    pub fn reset(&self) -> io::Result<()> {
        // SAFETY: replaces this value's own range with fresh anonymous memory.
        let p = unsafe {
            libc::mmap(
                self.ptr.cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `new`; no reference into it outlives the value.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// `madvise(addr, len, advice)`, retrying `EINTR` (populate can be interrupted).
pub fn madvise(addr: *mut u8, len: usize, advice: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: madvise validates the range itself; the advice values used here (populate,
        // DONTNEED on a file mapping) do not change what the memory holds.
        let rc = unsafe { libc::madvise(addr.cast(), len, advice) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Leases (z-READ consistency)
// ---------------------------------------------------------------------------------------------

/// `fcntl(fd, F_SETLEASE, F_RDLCK)` with the lease-break signal `sig` sent to thread `tid`
/// (`F_SETSIG`, `F_SETOWN_EX` `F_OWNER_TID`). Fails with `EAGAIN` while anyone has the file
/// open for writing (this process included).
pub fn take_read_lease(fd: RawFd, sig: libc::c_int, tid: libc::pid_t) -> io::Result<()> {
    #[repr(C)]
    struct FOwnerEx {
        kind: libc::c_int,
        pid: libc::pid_t,
    }
    const F_OWNER_TID: libc::c_int = 0;
    // include/uapi/asm-generic/fcntl.h
    const F_SETSIG: libc::c_int = 10;
    const F_SETOWN_EX: libc::c_int = 15;
    let own = FOwnerEx {
        kind: F_OWNER_TID,
        pid: tid,
    };
    // SAFETY: fcntl on a caller-owned fd with a properly laid out f_owner_ex.
    unsafe {
        if libc::fcntl(fd, F_SETSIG, sig) < 0
            || libc::fcntl(fd, F_SETOWN_EX, &own as *const FOwnerEx) < 0
            || libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `fcntl(fd, F_SETLEASE, F_UNLCK)`: lets a blocked opener or truncater proceed.
pub fn release_lease(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain fcntl on a caller-owned fd.
    if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fstat(fd)`.
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data; fstat fills it for a valid fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn cachestat_sees_written_pages_and_fadvise_drops_them() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        let fd = f.as_raw_fd();
        pwrite_full(fd, &vec![7u8; 8 * 4096], 0).unwrap();
        let s = cachestat(fd, 0, 8 * 4096).unwrap();
        assert_eq!(s.nr_cache, 8);
        fdatasync(fd).unwrap();
        // The whole file: a range inside one large folio (ext4 makes them) is not dropped.
        fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED).unwrap();
        assert_eq!(cachestat(fd, 0, 0).unwrap().nr_cache, 0);
        let mut b = vec![1u8; 3 * 4096];
        // Past end of file: the tail reads as zeros.
        assert_eq!(pread_full(fd, &mut b, 6 * 4096, 0).unwrap(), 2 * 4096);
        assert!(b[..2 * 4096].iter().all(|&x| x == 7) && b[2 * 4096..].iter().all(|&x| x == 0));
    }
}
