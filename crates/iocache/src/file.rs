//! The data file: one path opened twice, buffered (through the page cache) and `O_DIRECT`
//! (around it), with the direct-I/O alignment checked once at open. Every read and write of page
//! data goes through here, so the I/O path each mode takes is visible in one place.

use crate::error::{Error, Result};
use crate::sys;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A data file open for buffered and (where wanted) direct I/O.
#[derive(Debug)]
pub struct DataFile {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
}

impl DataFile {
    /// Opens (or, with `create`, creates) `path`; with `want_direct` also an `O_DIRECT`
    /// descriptor, refused with [`Error::NoDirectIo`] where the file system has no direct I/O
    /// or needs an alignment `page_size` does not meet.
    pub fn open(
        path: &Path,
        create: bool,
        want_direct: bool,
        page_size: usize,
    ) -> Result<DataFile> {
        let io = |op, e| Error::Io {
            op,
            path: path.to_path_buf(),
            source: e,
        };
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .open(path)
            .map_err(|e| io("open", e))?;
        let meta = buffered.metadata().map_err(|e| io("stat", e))?;
        if !meta.file_type().is_file() {
            return Err(Error::NotRegular {
                path: path.to_path_buf(),
            });
        }
        // A buffer pool reads pages in its own order and prefetches itself: the kernel's
        // readahead only adds device reads to random misses (measured: 0.16 device reads per
        // operation against 0.12 pool misses under YCSB-B, buffered).
        sys::fadvise(buffered.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM)
            .map_err(|e| io("posix_fadvise(RANDOM)", e))?;
        let direct = if want_direct {
            // tmpfs takes O_DIRECT since Linux 6.6, but its "device" is the page cache itself:
            // there is nothing for DBIO to go around.
            if sys::on_tmpfs(buffered.as_raw_fd()).map_err(|e| io("fstatfs", e))? {
                return Err(Error::NoDirectIo {
                    path: path.to_path_buf(),
                });
            }
            let align = tiermem_media::ssd::statx_dio_align(path).ok().flatten();
            let ok = match align {
                Some(a) => {
                    a.offset != 0
                        && a.mem != 0
                        && page_size % a.offset as usize == 0
                        && 4096 % a.mem as usize == 0
                }
                None => true,
            };
            if !ok {
                return Err(Error::NoDirectIo {
                    path: path.to_path_buf(),
                });
            }
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => Some(f),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return Err(Error::NoDirectIo {
                        path: path.to_path_buf(),
                    })
                }
                Err(e) => return Err(io("open O_DIRECT", e)),
            }
        } else {
            None
        };
        Ok(DataFile {
            path: path.to_path_buf(),
            buffered,
            direct,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The buffered descriptor (for cachestat, fadvise and the like).
    pub fn fd(&self) -> RawFd {
        self.buffered.as_raw_fd()
    }

    /// The file's length in bytes.
    pub fn len(&self) -> Result<u64> {
        self.buffered
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.err("stat", e))
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    fn err(&self, op: &'static str, e: std::io::Error) -> Error {
        Error::Io {
            op,
            path: self.path.clone(),
            source: e,
        }
    }

    fn direct_fd(&self) -> RawFd {
        // Direct I/O is only asked of files opened with it (the pool's modes guarantee it); a
        // buffered fallback keeps the bytes right if that ever changes.
        self.direct.as_ref().map_or(self.fd(), |f| f.as_raw_fd())
    }

    /// Reads `buf.len()` bytes at `off` through the page cache (zeros past end of file).
    pub fn read_buffered(&self, buf: &mut [u8], off: u64) -> Result<()> {
        sys::pread_full(self.fd(), buf, off, 0)
            .map(|_| ())
            .map_err(|e| self.err("pread", e))
    }

    /// Reads through the page cache only if every byte is cached there: `Ok(false)` (and no I/O
    /// waited for) when it is not (`preadv2(RWF_NOWAIT)`).
    pub fn read_cached(&self, buf: &mut [u8], off: u64) -> Result<bool> {
        match sys::pread_full(self.fd(), buf, off, libc::RWF_NOWAIT) {
            Ok(n) if n == buf.len() => Ok(true),
            // Short: past end of file (then all there was) or not all cached. Only this rare
            // case pays the fstat.
            Ok(n) => Ok(n as u64 >= self.len()?.saturating_sub(off).min(buf.len() as u64)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(self.err("preadv2(RWF_NOWAIT)", e)),
        }
    }

    /// Reads `buf.len()` bytes at `off` with `O_DIRECT` (`buf` and `off` aligned by the caller).
    pub fn read_direct(&self, buf: &mut [u8], off: u64) -> Result<()> {
        sys::pread_full(self.direct_fd(), buf, off, 0)
            .map(|_| ())
            .map_err(|e| self.err("pread O_DIRECT", e))
    }

    /// Writes `buf` at `off` through the page cache.
    pub fn write_buffered(&self, buf: &[u8], off: u64) -> Result<()> {
        sys::pwrite_full(self.fd(), buf, off).map_err(|e| self.err("pwrite", e))
    }

    /// Writes `buf` at `off` with `O_DIRECT` (the kernel drops cached copies of the range).
    pub fn write_direct(&self, buf: &[u8], off: u64) -> Result<()> {
        sys::pwrite_full(self.direct_fd(), buf, off).map_err(|e| self.err("pwrite O_DIRECT", e))
    }

    /// Pages of `[off, off+len)` the page cache holds.
    pub fn cached_pages(&self, off: u64, len: u64) -> Result<u64> {
        sys::cachestat(self.fd(), off, len)
            .map(|s| s.nr_cache)
            .map_err(|e| self.err("cachestat", e))
    }

    /// Drops `[off, off+len)` from the page cache (`POSIX_FADV_DONTNEED`).
    pub fn drop_cached(&self, off: u64, len: u64) -> Result<()> {
        sys::fadvise(self.fd(), off, len, libc::POSIX_FADV_DONTNEED)
            .map_err(|e| self.err("posix_fadvise(DONTNEED)", e))
    }

    /// Writes `[off, off+len)`'s dirty pages and waits for them (`sync_file_range`), so that a
    /// following [`DataFile::drop_cached`] can drop them.
    pub fn settle(&self, off: u64, len: u64) -> Result<()> {
        sys::write_and_wait(self.fd(), off, len).map_err(|e| self.err("sync_file_range", e))
    }

    /// Asks for `[off, off+len)` to be read into the page cache asynchronously
    /// (`POSIX_FADV_WILLNEED`).
    pub fn read_ahead(&self, off: u64, len: u64) -> Result<()> {
        sys::fadvise(self.fd(), off, len, libc::POSIX_FADV_WILLNEED)
            .map_err(|e| self.err("posix_fadvise(WILLNEED)", e))
    }

    /// Starts write-back of `[off, off+len)` (`sync_file_range(WRITE)`), not waiting for it.
    pub fn start_writeback(&self, off: u64, len: u64) -> Result<()> {
        sys::start_writeback(self.fd(), off, len).map_err(|e| self.err("sync_file_range", e))
    }

    /// `fdatasync`: everything written (either way) is durable.
    pub fn sync(&self) -> Result<()> {
        sys::fdatasync(self.fd()).map_err(|e| self.err("fdatasync", e))
    }
}
