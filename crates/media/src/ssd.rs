//! SSD devices: a file accessed with `O_DIRECT` where the file system allows it (buffered
//! otherwise), single requests through pread/pwrite and batches through io_uring.
//!
//! Direct-I/O alignment comes from `statx(STATX_DIOALIGN)`: `stx_dio_mem_align` and
//! `stx_dio_offset_align` are the `u32`s at byte offsets 0x98 and 0x9C of the 256-byte
//! `struct statx` (right after `stx_mnt_id` at 0x90; see `include/uapi/linux/stat.h`), decoded
//! here from a raw buffer because libc's glibc `statx` does not name them. A file system that reports the
//! attribute with zero alignment does not support direct I/O: the device is then opened buffered
//! and [`SsdDevice::direct`] is false. A kernel that does not know the attribute gets a direct
//! open attempt with a conservative 4096-byte alignment, falling back to buffered on EINVAL.

use crate::delay::{delay_ns, DelayCell, DelayModel};
use crate::error::{parent_dir, MediaError, Result};
use crate::stats::DeviceStats;
use parking_lot::Mutex;
use std::alloc::Layout;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const STATX_DIOALIGN: u32 = 0x2000;
/// Byte offset of `stx_dio_mem_align` in `struct statx` (uapi: after `stx_mnt_id` at 0x90).
const STX_DIO_MEM_ALIGN: usize = 0x98;
/// Byte offset of `stx_dio_offset_align` in `struct statx`.
const STX_DIO_OFFSET_ALIGN: usize = 0x9C;
/// Ring size for batched I/O; larger batches are submitted in chunks of this many operations.
const RING_ENTRIES: u32 = 64;
/// Alignment assumed when the kernel does not report STATX_DIOALIGN.
const FALLBACK_ALIGN: u32 = 4096;

/// Direct-I/O alignment requirements of a device. Buffered devices report 1/1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DioAlign {
    /// Required alignment of user buffer addresses (and lengths are multiples of `offset`).
    pub mem: u32,
    /// Required alignment of file offsets and transfer lengths.
    pub offset: u32,
}

/// The raw `struct statx` (256 bytes); only the fields we need are decoded.
#[repr(C, align(8))]
struct RawStatx([u8; 256]);

impl RawStatx {
    fn u32_at(&self, off: usize) -> u32 {
        // cannot fail: callers pass constant offsets of struct statx fields (< 252); a 4-byte
        // slice converts to a 4-byte array.
        u32::from_le_bytes(self.0[off..off + 4].try_into().expect("4 bytes"))
    }
}

/// What statx says about direct I/O on `path`: `None` when the kernel does not report
/// STATX_DIOALIGN, `Some(align)` otherwise (0/0 means unsupported).
pub fn statx_dio_align(path: &Path) -> Result<Option<DioAlign>> {
    let c = cpath(path)?;
    let mut st = RawStatx([0u8; 256]);
    // SAFETY: raw statx(2) with a valid path, a 256-byte out-buffer (the size of struct statx).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_statx,
            libc::AT_FDCWD,
            c.as_ptr(),
            0,
            STATX_DIOALIGN,
            st.0.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(MediaError::from_io(
            "statx",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    let mask = st.u32_at(0);
    if mask & STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    Ok(Some(DioAlign {
        mem: st.u32_at(STX_DIO_MEM_ALIGN),
        offset: st.u32_at(STX_DIO_OFFSET_ALIGN),
    }))
}

fn cpath(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        MediaError::InvalidArgument(format!("path {} contains a NUL byte", path.display()))
    })
}

/// A zeroed heap buffer with a chosen alignment, for direct I/O.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocate `len` zeroed bytes aligned to `align` (a power of two). `len` may be 0.
    pub fn new(len: usize, align: usize) -> Result<AlignedBuf> {
        let layout = Layout::from_size_align(len.max(1), align.max(1)).map_err(|_| {
            MediaError::InvalidArgument(format!(
                "buffer alignment {align} is not a power of two (or {len} bytes is too large)"
            ))
        })?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Ok(AlignedBuf { ptr, len, layout })
    }

    /// A zeroed buffer of `len` bytes aligned for direct I/O on `dev`.
    pub fn for_device(dev: &SsdDevice, len: usize) -> Result<AlignedBuf> {
        Self::new(len, dev.alignment().mem.max(1) as usize)
    }

    /// The buffer's alignment.
    pub fn align(&self) -> usize {
        self.layout.align()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of at least len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.layout.align())
            .finish()
    }
}

/// One operation of a batch for [`SsdDevice::submit_batch`]. The borrows guarantee the buffers
/// outlive the I/O.
#[derive(Debug)]
pub enum IoOp<'a> {
    /// Read `buf.len()` bytes at `offset` into `buf`.
    Read {
        /// Device offset.
        offset: u64,
        /// Destination.
        buf: &'a mut [u8],
    },
    /// Write `buf` at `offset`.
    Write {
        /// Device offset.
        offset: u64,
        /// Source.
        buf: &'a [u8],
    },
}

impl<'a> IoOp<'a> {
    /// A read of `buf.len()` bytes at `offset`.
    pub fn read(offset: u64, buf: &'a mut [u8]) -> Self {
        IoOp::Read { offset, buf }
    }
    /// A write of `buf` at `offset`.
    pub fn write(offset: u64, buf: &'a [u8]) -> Self {
        IoOp::Write { offset, buf }
    }
    fn parts(&self) -> (bool, u64, *const u8, usize) {
        match self {
            IoOp::Read { offset, buf } => (false, *offset, buf.as_ptr(), buf.len()),
            IoOp::Write { offset, buf } => (true, *offset, buf.as_ptr(), buf.len()),
        }
    }
}

/// A file used as an SSD: fixed size, direct I/O where possible, delay model and counters.
pub struct SsdDevice {
    path: PathBuf,
    fd: OwnedFd,
    direct: bool,
    align: DioAlign,
    /// Bytes usable (raised by [`SsdDevice::grow`]).
    size: std::sync::atomic::AtomicU64,
    ring: Option<Mutex<io_uring::IoUring>>,
    delay: DelayCell,
    stats: DeviceStats,
}

impl std::fmt::Debug for SsdDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsdDevice")
            .field("path", &self.path)
            .field("size", &self.len())
            .field("direct", &self.direct)
            .field("align", &self.align)
            .field("io_uring", &self.ring.is_some())
            .finish()
    }
}

/// True unless `/proc/sys/kernel/io_uring_disabled` says io_uring is disabled for everyone (2).
/// Value 1 (restricted to a group) is left to io_uring_setup to decide.
pub fn io_uring_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|s| s.trim() != "2")
        .unwrap_or(true)
}

fn open_fd(path: &Path, flags: libc::c_int, mode: libc::mode_t) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a valid NUL-terminated path; the fd is checked.
    let raw = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: freshly opened descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl SsdDevice {
    /// Create a new device file of `size` bytes (mode 0600, never overwriting: an existing file
    /// is [`MediaError::AlreadyExists`]), allocate it (ENOSPC → [`MediaError::NoSpace`], file
    /// removed) and open it as [`SsdDevice::open`] does.
    pub fn create(path: impl AsRef<Path>, size: u64) -> Result<SsdDevice> {
        let path = path.as_ref();
        let dir = parent_dir(path);
        if !dir.is_dir() {
            return Err(MediaError::MissingDirectory { path: dir });
        }
        if size == 0 {
            return Err(MediaError::InvalidSize {
                size,
                reason: "an SSD device needs at least one byte".into(),
            });
        }
        let fd = open_fd(path, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600)
            .map_err(|e| MediaError::from_io("create", path, e))?;
        // SAFETY: fd is open; posix_fallocate returns an errno value.
        let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, size as libc::off_t) };
        let res = match rc {
            0 => Ok(()),
            libc::ENOSPC | libc::EFBIG => {
                // SAFETY: zeroed statvfs is a valid out-buffer; fd is open.
                let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let avail = if unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut sv) } == 0 {
                    sv.f_bavail as u64 * sv.f_frsize as u64
                } else {
                    0
                };
                Err(MediaError::NoSpace {
                    path: path.to_path_buf(),
                    requested: size,
                    available: avail,
                })
            }
            // SAFETY: fd is open.
            _ if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } == 0 => Ok(()),
            e => Err(MediaError::from_io(
                "posix_fallocate",
                path,
                std::io::Error::from_raw_os_error(e),
            )),
        };
        drop(fd);
        if let Err(e) = res {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Self::open(path).inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })
    }

    /// Allocates the file up to `new_len` bytes (`posix_fallocate`; ENOSPC/EFBIG →
    /// [`MediaError::NoSpace`]) and makes them usable; a smaller `new_len` does nothing. Safe
    /// beside I/O in flight: bytes below the old length are untouched. Concurrent calls are
    /// the caller's to serialise (the length only grows, to the last caller's value).
    pub fn grow(&self, new_len: u64) -> Result<()> {
        if new_len <= self.len() {
            return Ok(());
        }
        // SAFETY: the descriptor is open; posix_fallocate returns an errno value.
        let rc = unsafe { libc::posix_fallocate(self.fd.as_raw_fd(), 0, new_len as libc::off_t) };
        match rc {
            0 => {
                self.size
                    .fetch_max(new_len, std::sync::atomic::Ordering::AcqRel);
                Ok(())
            }
            libc::ENOSPC | libc::EFBIG => Err(MediaError::NoSpace {
                path: self.path.clone(),
                requested: new_len,
                available: 0,
            }),
            e => Err(MediaError::from_io(
                "posix_fallocate",
                &self.path,
                std::io::Error::from_raw_os_error(e),
            )),
        }
    }

    /// Open an existing device file read-write: direct I/O when the file system supports it,
    /// buffered otherwise; io_uring for batches when the kernel allows it. The delay model is
    /// `TIERMEM_DELAY` (else none).
    pub fn open(path: impl AsRef<Path>) -> Result<SsdDevice> {
        Self::open_inner(path.as_ref(), true)
    }

    /// Open an existing device file with buffered (page-cache) I/O, even where direct I/O works.
    pub fn open_buffered(path: impl AsRef<Path>) -> Result<SsdDevice> {
        Self::open_inner(path.as_ref(), false)
    }

    fn open_inner(path: &Path, want_direct: bool) -> Result<SsdDevice> {
        let delay = DelayModel::from_env()?;
        let dio = statx_dio_align(path)?;
        let try_align = match dio {
            None => Some(DioAlign {
                mem: FALLBACK_ALIGN,
                offset: FALLBACK_ALIGN,
            }),
            Some(a) if a.mem == 0 || a.offset == 0 => None,
            Some(a) => Some(a),
        };
        let mut direct = None;
        if let (true, Some(a)) = (want_direct, try_align) {
            match open_fd(path, libc::O_RDWR | libc::O_DIRECT, 0) {
                Ok(fd) => direct = Some((fd, a)),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(MediaError::from_io("open", path, e)),
            }
        }
        let (fd, direct, align) = match direct {
            Some((fd, a)) => (fd, true, a),
            None => (
                open_fd(path, libc::O_RDWR, 0).map_err(|e| MediaError::from_io("open", path, e))?,
                false,
                DioAlign { mem: 1, offset: 1 },
            ),
        };
        // SAFETY: zeroed stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd open, st valid.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(MediaError::from_io(
                "fstat",
                path,
                std::io::Error::last_os_error(),
            ));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(MediaError::InvalidArgument(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        let ring = if io_uring_allowed() {
            io_uring::IoUring::new(RING_ENTRIES).ok().map(Mutex::new)
        } else {
            None
        };
        Ok(SsdDevice {
            path: path.to_path_buf(),
            fd,
            direct,
            align,
            size: std::sync::atomic::AtomicU64::new(st.st_size as u64),
            ring,
            delay: DelayCell::new(delay),
            stats: DeviceStats::new(),
        })
    }

    /// The device file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Size in bytes (fixed at open).
    pub fn len(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }
    /// True for a zero-length device.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// True when the file is open with O_DIRECT.
    pub fn direct(&self) -> bool {
        self.direct
    }
    /// Alignment every request must satisfy (1/1 when buffered).
    pub fn alignment(&self) -> DioAlign {
        self.align
    }
    /// True when batches go through io_uring (false: pread/pwrite fallback).
    pub fn uses_io_uring(&self) -> bool {
        self.ring.is_some()
    }
    /// The raw file descriptor (owned by the device).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// The current delay model.
    pub fn delay(&self) -> DelayModel {
        self.delay.get()
    }
    /// Replace the delay model.
    pub fn set_delay(&self, d: DelayModel) {
        self.delay.set(d)
    }
    /// The access counters.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    fn validate(&self, offset: u64, ptr: *const u8, len: usize) -> Result<()> {
        match offset.checked_add(len as u64) {
            Some(e) if e <= self.len() => {}
            _ => {
                return Err(MediaError::OutOfBounds {
                    offset,
                    len: len as u64,
                    limit: self.len(),
                    what: "device",
                })
            }
        }
        if len > u32::MAX as usize {
            return Err(MediaError::InvalidArgument(format!(
                "a single request is limited to {} bytes",
                u32::MAX
            )));
        }
        if self.direct {
            let (m, o) = (self.align.mem as u64, self.align.offset as u64);
            // Cloned only on the error paths: read_at and write_at allocate nothing when they
            // succeed (the pager reads from its SIGBUS handler).
            let path = || self.path.clone();
            if ptr as u64 % m != 0 {
                return Err(MediaError::Unaligned {
                    path: path(),
                    what: "buffer address",
                    value: ptr as u64,
                    align: m,
                });
            }
            if offset % o != 0 {
                return Err(MediaError::Unaligned {
                    path: path(),
                    what: "offset",
                    value: offset,
                    align: o,
                });
            }
            if len as u64 % o != 0 {
                return Err(MediaError::Unaligned {
                    path: path(),
                    what: "length",
                    value: len as u64,
                    align: o,
                });
            }
        }
        Ok(())
    }

    fn charge(&self, write: bool, bytes: u64) {
        let m = self.delay.get();
        let d = if write {
            m.write_delay_ns(bytes)
        } else {
            m.read_delay_ns(bytes)
        };
        delay_ns(d);
        if write {
            self.stats.record_write(bytes, d);
        } else {
            self.stats.record_read(bytes, d);
        }
    }

    /// Read exactly `buf.len()` bytes at `offset`. In direct mode the buffer address, offset and
    /// length must be aligned ([`MediaError::Unaligned`]); the range must lie inside the device.
    /// A successful read allocates nothing and takes no lock (async-signal-safe).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.validate(offset, buf.as_ptr(), buf.len())?;
        pread_exact(self.fd.as_raw_fd(), buf, offset, &self.path)?;
        self.charge(false, buf.len() as u64);
        Ok(())
    }

    /// Write all of `data` at `offset` (same alignment and bounds rules as [`SsdDevice::read_at`]).
    /// Durable only after [`SsdDevice::sync`].
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.validate(offset, data.as_ptr(), data.len())?;
        let mut done = 0usize;
        while done < data.len() {
            // SAFETY: reading from the unwritten tail of data.
            let n = unsafe {
                libc::pwrite(
                    self.fd.as_raw_fd(),
                    data.as_ptr().add(done) as *const _,
                    data.len() - done,
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(MediaError::from_io("pwrite", &self.path, e));
            }
            done += n as usize;
        }
        self.charge(true, data.len() as u64);
        Ok(())
    }

    /// fdatasync the device file: every completed write is durable on return.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: fd is open.
        if unsafe { libc::fdatasync(self.fd.as_raw_fd()) } != 0 {
            return Err(MediaError::from_io(
                "fdatasync",
                &self.path,
                std::io::Error::last_os_error(),
            ));
        }
        self.stats.record_persist();
        Ok(())
    }

    /// Submit every operation, wait for all of them, and return one result per operation in
    /// order: the bytes transferred (a short count is possible and reported, not retried) or
    /// the error. Every operation is validated (bounds, alignment) before anything is submitted;
    /// a validation failure fails the whole batch. Uses io_uring (in chunks of 64) when
    /// available, else pread/pwrite one by one. Each successful operation is charged its delay
    /// (the device is modelled as serving operations one after another).
    pub fn submit_batch(&self, ops: &mut [IoOp<'_>]) -> Result<Vec<Result<usize>>> {
        for op in ops.iter() {
            let (_, off, ptr, len) = op.parts();
            self.validate(off, ptr, len)?;
        }
        let raw: Vec<std::result::Result<usize, std::io::Error>> = match &self.ring {
            Some(ring) => self.batch_uring(&mut ring.lock(), ops),
            None => ops.iter_mut().map(|op| self.one_sync(op)).collect(),
        };
        let mut out = Vec::with_capacity(raw.len());
        for (op, r) in ops.iter().zip(raw) {
            let (write, ..) = op.parts();
            out.push(match r {
                Ok(n) => {
                    self.charge(write, n as u64);
                    Ok(n)
                }
                Err(e) => Err(MediaError::from_io(
                    if write {
                        "io_uring write"
                    } else {
                        "io_uring read"
                    },
                    &self.path,
                    e,
                )),
            });
        }
        Ok(out)
    }

    fn one_sync(&self, op: &mut IoOp<'_>) -> std::result::Result<usize, std::io::Error> {
        loop {
            let n = match op {
                // SAFETY: buf is a live exclusive buffer of buf.len() bytes.
                IoOp::Read { offset, buf } => unsafe {
                    libc::pread(
                        self.fd.as_raw_fd(),
                        buf.as_mut_ptr() as *mut _,
                        buf.len(),
                        *offset as libc::off_t,
                    )
                },
                // SAFETY: buf is a live buffer of buf.len() bytes.
                IoOp::Write { offset, buf } => unsafe {
                    libc::pwrite(
                        self.fd.as_raw_fd(),
                        buf.as_ptr() as *const _,
                        buf.len(),
                        *offset as libc::off_t,
                    )
                },
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    fn batch_uring(
        &self,
        ring: &mut io_uring::IoUring,
        ops: &mut [IoOp<'_>],
    ) -> Vec<std::result::Result<usize, std::io::Error>> {
        use io_uring::{opcode, types};
        let mut results: Vec<Option<std::result::Result<usize, std::io::Error>>> =
            (0..ops.len()).map(|_| None).collect();
        let fd = types::Fd(self.fd.as_raw_fd());
        let mut start = 0usize;
        while start < ops.len() {
            let end = (start + RING_ENTRIES as usize).min(ops.len());
            let mut queued = 0usize;
            {
                let mut sq = ring.submission();
                for (i, op) in ops[start..end].iter_mut().enumerate() {
                    let entry = match op {
                        IoOp::Read { offset, buf } => {
                            opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32)
                                .offset(*offset)
                                .build()
                        }
                        IoOp::Write { offset, buf } => {
                            opcode::Write::new(fd, buf.as_ptr(), buf.len() as u32)
                                .offset(*offset)
                                .build()
                        }
                    }
                    .user_data((start + i) as u64);
                    // SAFETY: the buffers are borrowed for the whole call and we do not return
                    // before every submitted entry has completed (loop below).
                    if unsafe { sq.push(&entry) }.is_err() {
                        break;
                    }
                    queued += 1;
                }
            }
            let mut completed = 0usize;
            while completed < queued {
                match ring.submit_and_wait(queued - completed) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                        ) => {}
                    Err(e) => {
                        // The kernel may still own buffers of entries it accepted; returning
                        // would let it write into freed memory. There is no safe way out.
                        eprintln!("tiermem-media: io_uring_enter failed while I/O was in flight: {e}; aborting");
                        std::process::abort();
                    }
                }
                for cqe in ring.completion() {
                    let idx = cqe.user_data() as usize;
                    let r = cqe.result();
                    results[idx] = Some(if r >= 0 {
                        Ok(r as usize)
                    } else {
                        Err(std::io::Error::from_raw_os_error(-r))
                    });
                    completed += 1;
                }
            }
            start += queued.max(1).min(end - start);
            if queued == 0 {
                // The submission queue was unexpectedly full: finish this op synchronously.
                let i = start - 1;
                results[i] = Some(self.one_sync(&mut ops[i]));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(std::io::Error::from_raw_os_error(libc::EIO))))
            .collect()
    }
}

/// Read exactly `buf.len()` bytes of `fd` at `offset` with `pread(2)`, retrying short reads
/// and EINTR; EOF before the end is an error. `path` names the file in errors.
pub(crate) fn pread_exact(
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
    offset: u64,
    path: &std::path::Path,
) -> Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        // SAFETY: writing into the unfilled tail of buf; fd is the caller's open descriptor.
        let n = unsafe {
            libc::pread(
                fd,
                buf.as_mut_ptr().add(done) as *mut _,
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(MediaError::from_io("pread", path, e));
        }
        if n == 0 {
            return Err(MediaError::from_io(
                "pread",
                path,
                std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            ));
        }
        done += n as usize;
    }
    Ok(())
}
