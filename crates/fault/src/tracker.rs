//! Written-page tracking: which pages of a range were written since the last scan.
//!
//! Primary method ([`TrackingMethod::UffdWpAsync`]): a private userfaultfd with
//! UFFD_FEATURE_WP_ASYNC (+WP_UNPOPULATED), the range registered in WP mode and write-protected
//! (or, [`TrackerOptions::lazy`], protected by the scans themselves, bounded by the caller).
//! A write to a protected page is resolved by the kernel itself (~0.8 µs, no message, no
//! signal): it just clears the PTE's uffd-wp bit. A scan is one `PAGEMAP_SCAN` ioctl per output
//! chunk with `PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC` and `PAGE_IS_WRITTEN` as category and
//! return mask: the kernel reports the written pages and write-protects them again in the same
//! page-table walk, under the page-table lock, so no write between "report" and "re-protect" can
//! be lost.
//!
//! Fallback ([`TrackingMethod::Mprotect`]): the range is `mprotect(PROT_READ)`; a SIGSEGV handler
//! (async-signal-safe, chaining to the previous handler for other addresses) makes the page
//! writable and sets its bit in an atomic bitmap. A scan swaps each bitmap word with zero and
//! re-protects the pages it found. Ordering: the handler unprotects *before* setting the bit and
//! the scan clears the bit *before* re-protecting, so a write is either reported by this scan or
//! faults again after it (never lost). Each unprotected page splits the VMA: with many written
//! pages this approaches `vm.max_map_count`.
//!
//! Huge pages: under WP_ASYNC the kernel splits a write-faulting THP, so tracking stays at 4 KiB
//! granularity.

use crate::error::{Error, Result};
use crate::sig::Chain;
use crate::sys::{self, *};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Options of [`WriteTracker::new`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackerOptions {
    /// Use the mprotect fallback even when userfaultfd WP_ASYNC is available.
    pub force_mprotect: bool,
    /// userfaultfd only: write-protect nothing at the start. Meant for a range whose caller
    /// knows which prefix can have been written and scans only that ([`WriteTracker::
    /// scan_upto`]): a scan reports every page of its range that is not write-protected,
    /// including pages never mapped (`PAGEMAP_SCAN` counts an empty entry as written, which is
    /// also what keeps a written page whose entry reclaim zapped from being missed), and
    /// protects them. Protect what already holds data with [`WriteTracker::protect`]. A heap
    /// then pays for the pages it uses, not for its capacity: write-protecting two 128 MiB
    /// views at the start and scanning them whole was ~3 ms of a short program's life.
    /// Ignored by the mprotect fallback, which protects the whole range at the start.
    pub lazy: bool,
}

/// How a [`WriteTracker`] observes writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackingMethod {
    /// userfaultfd WP_ASYNC + PAGEMAP_SCAN.
    UffdWpAsync,
    /// mprotect(PROT_READ) + SIGSEGV handler.
    Mprotect,
}

/// A run of written pages, as an offset from the tracked base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRange {
    /// Byte offset from the tracker's base (page aligned).
    pub offset: usize,
    /// Length in bytes (a multiple of the page size).
    pub len: usize,
}

impl PageRange {
    /// Number of pages in the range.
    pub fn pages(&self) -> usize {
        self.len / PAGE_SIZE
    }
}

/// Reports exactly the pages of `[base, base+len)` written since the previous scan (or since
/// creation). Dropping it stops tracking (unregisters / restores PROT_READ|PROT_WRITE).
pub struct WriteTracker {
    base: usize,
    len: usize,
    imp: Imp,
}

impl std::fmt::Debug for WriteTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTracker")
            .field("base", &(self.base as *const u8))
            .field("len", &self.len)
            .field("method", &self.method())
            .finish()
    }
}

enum Imp {
    Uffd {
        uffd: Uffd,
        pagemap: Pagemap,
        buf: Vec<PageRegion>,
    },
    Mprotect {
        slot: usize,
        bitmap: Box<[AtomicU64]>,
    },
}

/// Output-vector entries per PAGEMAP_SCAN call (96 KiB, allocated once per tracker).
const SCAN_CHUNK: usize = 4096;

impl WriteTracker {
    /// Starts tracking `[base, base+len)` (page aligned, mapped read-write, private anonymous or
    /// shmem). With userfaultfd: registers WP mode and write-protects the range. Falls back to
    /// mprotect when userfaultfd or WP_ASYNC/PAGEMAP_SCAN is unavailable (or when forced);
    /// returns [`Error::TrackingUnavailable`] when neither works.
    pub fn new(base: *mut u8, len: usize, opts: TrackerOptions) -> Result<WriteTracker> {
        let b = base as usize;
        if b == 0 || b % PAGE_SIZE != 0 || len == 0 || len % PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(format!(
                "tracked range {b:#x}+{len:#x} must be non-empty and page aligned"
            )));
        }
        if opts.force_mprotect {
            return Self::new_mprotect(b, len);
        }
        match Self::new_uffd(b, len, opts.lazy) {
            Ok(t) => Ok(t),
            Err(
                e @ (Error::UffdUnavailable { .. }
                | Error::MissingFeature { .. }
                | Error::Unsupported(_)),
            ) => Self::new_mprotect(b, len).map_err(|m| Error::TrackingUnavailable {
                uffd: e.to_string(),
                mprotect: m.to_string(),
            }),
            Err(e) => Err(e),
        }
    }

    fn new_uffd(base: usize, len: usize, lazy: bool) -> Result<WriteTracker> {
        let uffd = Uffd::open(
            UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
            "written-page tracking",
        )?;
        let pagemap = Pagemap::open()?;
        let ioctls = uffd.register(base, len, UFFDIO_REGISTER_MODE_WP).map_err(|e| {
            if e == libc::EBUSY {
                Error::InvalidArgument(format!(
                    "tracked range {base:#x}+{len:#x} is already registered with another userfaultfd"
                ))
            } else {
                Error::errno("UFFDIO_REGISTER(MODE_WP) for write tracking", e)
            }
        })?;
        if ioctls & (1 << _UFFDIO_WRITEPROTECT) == 0 {
            let _ = uffd.unregister(base, len);
            return Err(Error::Unsupported(
                "UFFDIO_WRITEPROTECT is not allowed on this mapping".into(),
            ));
        }
        if !lazy {
            uffd.writeprotect(base, len, true, true).map_err(|e| {
                let _ = uffd.unregister(base, len);
                Error::errno("UFFDIO_WRITEPROTECT", e)
            })?;
        }
        let mut t = WriteTracker {
            base,
            len,
            imp: Imp::Uffd {
                uffd,
                pagemap,
                buf: vec![PageRegion::default(); SCAN_CHUNK],
            },
        };
        // Probe PAGEMAP_SCAN (Linux 6.7+) now, so a missing ioctl selects the fallback: a
        // report of the first page without write-protecting anything.
        if let Err(e) = t.probe() {
            if let Imp::Uffd { uffd, .. } = &t.imp {
                let _ = uffd.unregister(base, len);
            }
            // Prevent Drop from unregistering twice.
            t.len = 0;
            return Err(match e {
                Error::Syscall { source, .. }
                    if matches!(
                        source.raw_os_error(),
                        Some(libc::ENOTTY) | Some(libc::EINVAL) | Some(libc::EPERM)
                    ) =>
                {
                    Error::MissingFeature {
                        feature: "PAGEMAP_SCAN ioctl (Linux 6.7)",
                        needed_for: "written-page tracking",
                    }
                }
                e => e,
            });
        }
        Ok(t)
    }

    fn new_mprotect(base: usize, len: usize) -> Result<WriteTracker> {
        install_sigsegv()?;
        let pages = len / PAGE_SIZE;
        let bitmap: Box<[AtomicU64]> = (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        let slot = mp_publish(base, len, bitmap.as_ptr() as *mut AtomicU64)?;
        // SAFETY: mprotect on the caller's range; the kernel validates it.
        if unsafe { libc::mprotect(base as *mut libc::c_void, len, libc::PROT_READ) } < 0 {
            let e = Error::last("mprotect(PROT_READ)");
            mp_retire(slot);
            return Err(e);
        }
        Ok(WriteTracker {
            base,
            len,
            imp: Imp::Mprotect { slot, bitmap },
        })
    }

    /// Write-protects `[offset, offset + len)` of the tracked range (page aligned, clipped to
    /// it), mapped pages and unmapped ones alike: a write there is reported by the next scan,
    /// and nothing there is until written. For a [`TrackerOptions::lazy`] tracker's pages that
    /// already hold data; a no-op under the mprotect fallback, which protects everything from
    /// the start.
    pub fn protect(&mut self, offset: usize, len: usize) -> Result<()> {
        let end = offset.saturating_add(len).min(self.len);
        if offset >= end {
            return Ok(());
        }
        if offset % PAGE_SIZE != 0 || end % PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(format!(
                "protected range {offset:#x}+{len:#x} must be page aligned"
            )));
        }
        match &self.imp {
            Imp::Uffd { uffd, .. } => uffd
                .writeprotect(self.base + offset, end - offset, true, true)
                .map_err(|e| Error::errno("UFFDIO_WRITEPROTECT", e)),
            Imp::Mprotect { .. } => Ok(()),
        }
    }

    /// The method in use.
    pub fn method(&self) -> TrackingMethod {
        match self.imp {
            Imp::Uffd { .. } => TrackingMethod::UffdWpAsync,
            Imp::Mprotect { .. } => TrackingMethod::Mprotect,
        }
    }

    /// Tracked base.
    pub fn base(&self) -> *mut u8 {
        self.base as *mut u8
    }

    /// Tracked length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the tracked range is empty (never, for a live tracker).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Replaces the contents of `out` with the pages written since the last scan (ascending,
    /// adjacent pages merged) and re-arms tracking for them. Returns the number of pages.
    /// Allocation-free when `out` has enough capacity.
    pub fn scan(&mut self, out: &mut Vec<PageRange>) -> Result<usize> {
        self.scan_upto(out, self.len)
    }

    /// One `PAGEMAP_SCAN` of the first page that changes nothing (no `PM_SCAN_WP_MATCHING`):
    /// fails where the ioctl is missing.
    fn probe(&mut self) -> Result<()> {
        if let Imp::Uffd { pagemap, buf, .. } = &mut self.imp {
            let mut arg = PmScanArg {
                flags: 0,
                start: self.base as u64,
                end: (self.base + PAGE_SIZE) as u64,
                vec: buf.as_mut_ptr() as u64,
                vec_len: buf.len() as u64,
                category_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
                ..Default::default()
            };
            pagemap
                .scan(&mut arg)
                .map_err(|e| Error::errno("ioctl(PAGEMAP_SCAN)", e))?;
        }
        Ok(())
    }

    /// [`WriteTracker::scan`] of the first `limit` bytes of the range only (a page multiple,
    /// clipped to the range).
    pub fn scan_upto(&mut self, out: &mut Vec<PageRange>, limit: usize) -> Result<usize> {
        out.clear();
        let (base, len) = (self.base, limit.min(self.len) / PAGE_SIZE * PAGE_SIZE);
        match &mut self.imp {
            Imp::Uffd { pagemap, buf, .. } => {
                let end = (base + len) as u64;
                let mut start = base as u64;
                let mut pages = 0usize;
                loop {
                    let mut arg = PmScanArg {
                        flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                        start,
                        end,
                        vec: buf.as_mut_ptr() as u64,
                        vec_len: buf.len() as u64,
                        category_mask: PAGE_IS_WRITTEN,
                        return_mask: PAGE_IS_WRITTEN,
                        ..Default::default()
                    };
                    let n = pagemap
                        .scan(&mut arg)
                        .map_err(|e| Error::errno("ioctl(PAGEMAP_SCAN)", e))?;
                    for r in &buf[..n] {
                        let off = r.start as usize - base;
                        let l = (r.end - r.start) as usize;
                        pages += l / PAGE_SIZE;
                        match out.last_mut() {
                            Some(last) if last.offset + last.len == off => last.len += l,
                            _ => out.push(PageRange {
                                offset: off,
                                len: l,
                            }),
                        }
                    }
                    if arg.walk_end >= end || (n < buf.len() && arg.walk_end <= start) {
                        break;
                    }
                    start = arg.walk_end;
                }
                Ok(pages)
            }
            Imp::Mprotect { bitmap, .. } => {
                let mut pages = 0usize;
                let words = (len / PAGE_SIZE).div_ceil(64);
                for (wi, w) in bitmap.iter().enumerate().take(words) {
                    if w.load(Ordering::Relaxed) == 0 {
                        continue;
                    }
                    // Clear first, then re-protect (see the module comment for why).
                    let mut bits = w.swap(0, Ordering::AcqRel);
                    while bits != 0 {
                        let b = bits.trailing_zeros() as usize;
                        // Run of consecutive set bits starting at b.
                        let run = (!(bits >> b)).trailing_zeros() as usize;
                        let off = (wi * 64 + b) * PAGE_SIZE;
                        let l = run * PAGE_SIZE;
                        // SAFETY: the run lies inside the tracked range.
                        let r = unsafe {
                            libc::mprotect((base + off) as *mut libc::c_void, l, libc::PROT_READ)
                        };
                        if r < 0 {
                            return Err(Error::last("mprotect(PROT_READ)"));
                        }
                        pages += run;
                        match out.last_mut() {
                            Some(last) if last.offset + last.len == off => last.len += l,
                            _ => out.push(PageRange {
                                offset: off,
                                len: l,
                            }),
                        }
                        if b + run >= 64 {
                            break;
                        }
                        bits &= !(((1u64 << run) - 1) << b);
                    }
                }
                Ok(pages)
            }
        }
    }
}

impl Drop for WriteTracker {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        match &self.imp {
            Imp::Uffd { uffd, .. } => {
                let _ = uffd.unregister(self.base, self.len);
            }
            Imp::Mprotect { slot, .. } => {
                mp_retire(*slot);
                // SAFETY: restoring the protection the range had before tracking.
                unsafe {
                    libc::mprotect(
                        self.base as *mut libc::c_void,
                        self.len,
                        libc::PROT_READ | libc::PROT_WRITE,
                    )
                };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// mprotect fallback: signal-safe tracker table and SIGSEGV handler
// ---------------------------------------------------------------------------------------------

const MP_SLOTS: usize = 64;
/// `SEGV_ACCERR` (asm-generic/siginfo.h): invalid permissions for a mapped object.
const SEGV_ACCERR: i32 = 2;

struct MpSlot {
    /// 0 free, 1 active, 2 retiring.
    state: AtomicU32,
    base: AtomicUsize,
    len: AtomicUsize,
    bitmap: AtomicPtr<AtomicU64>,
    inflight: AtomicU32,
}

static MP: [MpSlot; MP_SLOTS] = [const {
    MpSlot {
        state: AtomicU32::new(0),
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        bitmap: AtomicPtr::new(std::ptr::null_mut()),
        inflight: AtomicU32::new(0),
    }
}; MP_SLOTS];
static MP_LOCK: parking_lot::Mutex<()> = parking_lot::const_mutex(());
static SEGV_CHAIN: Chain = Chain::new();

fn install_sigsegv() -> Result<()> {
    // SA_ONSTACK: keep Rust's stack-overflow reporting working (it runs on the sigaltstack);
    // our handler needs only a few hundred bytes.
    SEGV_CHAIN
        .install(
            libc::SIGSEGV,
            sigsegv_handler,
            libc::SA_ONSTACK | libc::SA_RESTART,
        )
        .map_err(|e| Error::errno("sigaction(SIGSEGV)", e))
}

fn mp_publish(base: usize, len: usize, bitmap: *mut AtomicU64) -> Result<usize> {
    let _g = MP_LOCK.lock();
    for (i, s) in MP.iter().enumerate() {
        let (sb, sl) = (
            s.base.load(Ordering::Acquire),
            s.len.load(Ordering::Acquire),
        );
        if s.state.load(Ordering::Acquire) == 1 && base < sb + sl && sb < base + len {
            return Err(Error::Overlap {
                base,
                len,
                other_base: sb,
                other_len: sl,
            });
        }
        let _ = i;
    }
    for (i, s) in MP.iter().enumerate() {
        if s.state.load(Ordering::Acquire) == 0 && s.inflight.load(Ordering::SeqCst) == 0 {
            s.base.store(base, Ordering::Release);
            s.len.store(len, Ordering::Release);
            s.bitmap.store(bitmap, Ordering::Release);
            s.state.store(1, Ordering::SeqCst);
            return Ok(i);
        }
    }
    Err(Error::TooManyRegions(MP_SLOTS))
}

fn mp_retire(i: usize) {
    let _g = MP_LOCK.lock();
    let s = &MP[i];
    s.state.store(2, Ordering::SeqCst);
    while s.inflight.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    s.bitmap.store(std::ptr::null_mut(), Ordering::Release);
    s.state.store(0, Ordering::SeqCst);
}

extern "C" fn sigsegv_handler(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let saved = sys::errno();
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == SEGV_ACCERR {
        for s in MP.iter() {
            if s.state.load(Ordering::Acquire) != 1 {
                continue;
            }
            let (b, l) = (
                s.base.load(Ordering::Acquire),
                s.len.load(Ordering::Acquire),
            );
            if addr < b || addr - b >= l {
                continue;
            }
            s.inflight.fetch_add(1, Ordering::SeqCst);
            if s.state.load(Ordering::SeqCst) != 1 {
                s.inflight.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let page = (addr - b) / PAGE_SIZE;
            // Unprotect first, then publish the bit (see the module comment).
            // SAFETY: the page lies in the tracked range.
            let r = unsafe {
                libc::mprotect(
                    (b + page * PAGE_SIZE) as *mut libc::c_void,
                    PAGE_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            let bm = s.bitmap.load(Ordering::Acquire);
            if r == 0 && !bm.is_null() {
                // SAFETY: bm points to a bitmap of len/PAGE_SIZE bits kept alive while the slot
                // is active and we hold an in-flight count.
                unsafe { (*bm.add(page / 64)).fetch_or(1 << (page % 64), Ordering::AcqRel) };
            }
            s.inflight.fetch_sub(1, Ordering::SeqCst);
            if r == 0 {
                sys::set_errno(saved);
                return;
            }
            // mprotect failed (e.g. vm.max_map_count reached): fall through and crash loudly.
            let mut m = crate::sig::StackBuf::new();
            let _ = std::fmt::Write::write_fmt(
                &mut m,
                format_args!(
                    "tiermem-fault: write tracker could not unprotect page {addr:#x} (errno {}); \
                     crashing\n",
                    sys::errno()
                ),
            );
            m.flush_stderr();
            crate::sig::reset_default(libc::SIGSEGV);
            return;
        }
    }
    SEGV_CHAIN.forward(sig, info, uctx);
    sys::set_errno(saved);
}
