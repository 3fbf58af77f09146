//! The machine's memory as the media layer's users need it: how much is available
//! ([`mem_available`]), backing a range of a mapping ahead of use ([`populate_write`]), and
//! whether a directory is memory rather than a disk ([`on_tmpfs`]).

/// `MemAvailable` of `/proc/meminfo`, bytes (`None` when unreadable).
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|k| k << 10)
}

/// `MADV_POPULATE_WRITE` (Linux ≥ 5.14; libc does not name it yet).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Back every page of `[ptr, ptr + len)` now (`MADV_POPULATE_WRITE`): page tables built and
/// pages allocated (and, on a VM, backed by the host), so later stores cost a store. Contents
/// are unchanged. Errors: the `madvise` failing (ENOMEM, EINVAL for a range it cannot write).
///
/// # Safety
/// `[ptr, ptr + len)` must be a page-aligned, writable mapping of this process.
pub unsafe fn populate_write(ptr: *mut u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's contract; populating changes no contents.
    if unsafe { libc::madvise(ptr.cast(), len, MADV_POPULATE_WRITE) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `TMPFS_MAGIC` of `statfs(2)`.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether `path` (a file or directory) is on tmpfs, i.e. memory and not a disk: what a swap
/// file, a benchmark's "disk" directory or a direct-I/O data file must not be. Errors: the path
/// cannot be `statfs`ed (missing, a NUL in it).
pub fn on_tmpfs(path: &std::path::Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: statfs is plain old data; statfs fills it from a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `c` and `st` outlive the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == TMPFS_MAGIC)
}
