//! The forked-child methods, baselines of `wp`: `fork` (Redis's BGSAVE: a child dumps, the
//! kernel's copy-on-write keeps the parent's later writes out of its view) and `fork-mdc` (MDC
//! on a stock kernel: the child also drops each unit once written, `MADV_DONTNEED`, so a
//! parent write to a dumped unit finds its page no longer shared and copies nothing; pages
//! written before their unit is dumped are still copied).
//!
//! The pause is the `fork` itself (the page-table copy). The child, a copy of a threaded
//! process, does async-signal-safe work only, with buffers allocated before the fork: it scans
//! its own page tables (`PAGEMAP_SCAN`, as `wp` does in its pause), lays the units out, writes
//! each unit's present pages from a private buffer at its final offset (O_DIRECT from the
//! shared pages themselves would make the kernel unshare, i.e. copy, each one it pins), and
//! leaves the bitmaps and CRCs in a shared mapping. The parent reaps it and writes the index,
//! the application state and the trailer: the same file as `wp`.
//!
//! A killed child fails the job (the previous snapshot stays); a killed parent leaves the
//! child to finish a temporary file that nobody renames.

use crate::error::{Result, SnapshotError};
use crate::format::{self, Layout, Method, Reservation, Target, PAGE, UNIT_BYTES, UNIT_PAGES};
use crate::job::{region_infos, reserve_estimate, Report};
use crate::wp::{scan_runs, Memory};
use std::path::Path;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};
use std::time::{Duration, Instant};
use tiermem_fault::sys::PageRegion;
use tiermem_fault::{Pagemap, Resolution};
use tiermem_media::AlignedBuf;

/// The child's outcome in the shared header.
const RUNNING: u32 = 0;
const OK: u32 = 1;
const FAILED: u32 = 2;

/// What the child failed at (with its errno).
const STEP_PAGEMAP: u32 = 1;
const STEP_ALLOCATE: u32 = 2;
const STEP_WRITE: u32 = 3;
const STEP_DROP: u32 = 4;

fn step_name(s: u32) -> &'static str {
    match s {
        STEP_PAGEMAP => "scanning its page tables (PAGEMAP_SCAN)",
        STEP_ALLOCATE => "growing the file (posix_fallocate)",
        STEP_WRITE => "writing a unit (pwrite)",
        STEP_DROP => "dropping a written unit (madvise MADV_DONTNEED)",
        _ => "an unknown step",
    }
}

/// The head of the mapping shared with the child; bitmaps (`u64` per unit) and CRCs (`u32`
/// per unit) follow it.
#[repr(C)]
struct Head {
    status: AtomicU32,
    step: AtomicU32,
    errno: AtomicI32,
    done_units: AtomicU64,
}

const HEAD: usize = 64;
const _: () = assert!(std::mem::size_of::<Head>() <= HEAD);

/// A `MAP_SHARED` anonymous mapping: what the child leaves for the parent.
struct SharedMap {
    ptr: *mut u8,
    len: usize,
    units: usize,
}

impl SharedMap {
    fn new(units: usize) -> Result<SharedMap> {
        let len = (HEAD + units * 12).div_ceil(PAGE) * PAGE;
        // SAFETY: a fresh shared anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SnapshotError::io(
                "mmap (shared with the snapshot child)",
                Path::new("[anonymous]"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(SharedMap {
            ptr: p.cast(),
            len,
            units,
        })
    }

    fn head(&self) -> &Head {
        // SAFETY: the mapping starts with HEAD zeroed bytes, a valid Head of atomics.
        unsafe { &*(self.ptr as *const Head) }
    }

    fn bitmaps(&self) -> &[AtomicU64] {
        // SAFETY: `units` u64s after the head, 8-aligned (HEAD is), inside the mapping.
        unsafe { std::slice::from_raw_parts(self.ptr.add(HEAD) as *const AtomicU64, self.units) }
    }

    fn crcs(&self) -> &[AtomicU32] {
        // SAFETY: `units` u32s after the bitmaps, inside the mapping.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.add(HEAD + self.units * 8) as *const AtomicU32,
                self.units,
            )
        }
    }
}

// SAFETY: the mapping is owned by the SharedMap; all access goes through atomics.
unsafe impl Send for SharedMap {}
// SAFETY: as above.
unsafe impl Sync for SharedMap {}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the child is gone (reaped) before the job drops it.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The file the child writes: descriptor, where the snapshot starts in it, its capacity,
/// and whether it can grow (an NVM pool cannot).
#[derive(Clone, Copy)]
struct ChildFile {
    fd: i32,
    base: u64,
    capacity: u64,
    growable: bool,
}

/// One region as the child walks it.
#[derive(Clone, Copy)]
struct ChildRegion {
    base: usize,
    len: usize,
    first_unit: usize,
}

/// A running fork snapshot.
pub(crate) struct ForkJob {
    /// The child until it is reaped (0 then).
    pid: libc::pid_t,
    map: SharedMap,
    reservation: Option<Reservation>,
    infos: Vec<crate::format::RegionInfo>,
    app: Vec<u8>,
    method: Method,
    started: Instant,
    pause: Duration,
}

/// Begins a fork snapshot (`method` is `Fork` or `ForkMdc`; see [`crate::begin`]).
pub(crate) fn start<G>(
    mem: &[&Memory],
    target: &Path,
    app: Vec<u8>,
    method: Method,
    kind: Target,
    pause: Option<impl FnOnce() -> G>,
) -> Result<ForkJob> {
    let t0 = Instant::now();
    for m in mem {
        if m.resolution() != Resolution::InThread {
            return Err(SnapshotError::InvalidArgument(format!(
                "memory {:?}: the fork methods need in-thread memory (handler-thread memory \
                 is not given to a child)",
                m.name()
            )));
        }
    }
    let pm = Pagemap::open()?;
    let reservation = reserve_estimate(mem, &pm, target, app.len() as u64, kind)?;
    drop(pm);
    let mut regions = Vec::with_capacity(mem.len());
    let mut units = 0;
    for m in mem {
        regions.push(ChildRegion {
            base: m.as_ptr() as usize,
            len: m.len(),
            first_unit: units,
        });
        units += format::units_of(m.len() as u64);
    }
    let map = SharedMap::new(units)?;
    let mut buf = AlignedBuf::new(UNIT_BYTES, PAGE)?;
    let mut scan_buf = vec![PageRegion::default(); 512];
    let fd = reservation.raw_fd();
    let file = ChildFile {
        fd,
        base: reservation.raw_base(),
        capacity: reservation.capacity(),
        growable: reservation.growable(),
    };
    let app_len = app.len() as u64;
    let guard = pause.map(|p| p());
    let tp = if guard.is_some() { Instant::now() } else { t0 };
    // SAFETY: fork; the child runs `child` (async-signal-safe, never returns).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        child(
            &regions,
            &map,
            &mut buf,
            &mut scan_buf,
            file,
            app_len,
            method,
        );
    }
    let pause_time = tp.elapsed();
    drop(guard);
    if pid < 0 {
        return Err(SnapshotError::io(
            "fork",
            reservation.tmp_path(),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(ForkJob {
        pid,
        map,
        reservation: Some(reservation),
        infos: region_infos(mem),
        app,
        method,
        started: t0,
        pause: pause_time,
    })
}

/// The child: dumps every unit and exits. Async-signal-safe throughout (no allocation, no
/// lock): it is a copy of a threaded process.
#[allow(clippy::too_many_arguments)]
fn child(
    regions: &[ChildRegion],
    map: &SharedMap,
    buf: &mut AlignedBuf,
    scan_buf: &mut [PageRegion],
    file: ChildFile,
    app_len: u64,
    method: Method,
) -> ! {
    let h = map.head();
    let fail = |step: u32, errno: i32| -> ! {
        h.step.store(step, Release);
        h.errno.store(errno, Release);
        h.status.store(FAILED, Release);
        // SAFETY: _exit is async-signal-safe and runs no destructors or atexit handlers.
        unsafe { libc::_exit(1) }
    };
    let bitmaps = map.bitmaps();
    let crcs = map.crcs();
    let pm = match Pagemap::open_signal_safe() {
        Ok(p) => p,
        Err(e) => fail(STEP_PAGEMAP, e),
    };
    let mut present = 0u64;
    for r in regions {
        let res = scan_runs(&pm, r.base, r.len, scan_buf, |s, e| {
            for p in s / PAGE..e / PAGE {
                let b = &bitmaps[r.first_unit + p / UNIT_PAGES];
                b.store(b.load(Acquire) | 1 << (p % UNIT_PAGES), Release);
            }
            present += ((e - s) / PAGE) as u64;
        });
        if let Err(e) = res {
            fail(STEP_PAGEMAP, e);
        }
    }
    let units = map.units;
    let need = format::file_len_of(units, present, app_len);
    let fd = file.fd;
    if need > file.capacity {
        if !file.growable {
            // An NVM pool cannot grow: the memory grew past the reservation's headroom.
            fail(STEP_ALLOCATE, libc::ENOSPC);
        }
        // SAFETY: the reservation's descriptor, inherited; a plain syscall.
        let rc = unsafe { libc::posix_fallocate(fd, 0, need as libc::off_t) };
        if rc != 0 {
            fail(STEP_ALLOCATE, rc);
        }
    }
    let mut off = format::pages_at(units);
    for r in regions {
        for u in 0..format::units_of(r.len as u64) {
            let g = r.first_unit + u;
            let bm = bitmaps[g].load(Acquire);
            let addr = r.base + u * UNIT_BYTES;
            let mut n = 0;
            for p in 0..UNIT_PAGES {
                if bm >> p & 1 == 1 {
                    // SAFETY: page p of the unit lies inside the region (its bit came from a
                    // scan of it); buf holds UNIT_PAGES pages.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            (addr + p * PAGE) as *const u8,
                            buf.as_mut_ptr().add(n * PAGE),
                            PAGE,
                        )
                    };
                    n += 1;
                }
            }
            let bytes = n * PAGE;
            crcs[g].store(format::unit_checksum(bm, &buf[..bytes], 0), Release);
            let mut done = 0;
            while done < bytes {
                // SAFETY: buf[done..bytes] is readable; fd is the inherited, open file.
                let w = unsafe {
                    libc::pwrite(
                        fd,
                        buf.as_ptr().add(done).cast(),
                        bytes - done,
                        (file.base + off + done as u64) as libc::off_t,
                    )
                };
                if w < 0 {
                    // SAFETY: reading errno.
                    let e = unsafe { *libc::__errno_location() };
                    if e == libc::EINTR {
                        continue;
                    }
                    fail(STEP_WRITE, e);
                }
                if w == 0 {
                    fail(STEP_WRITE, libc::EIO);
                }
                done += w as usize;
            }
            off += bytes as u64;
            if method == Method::ForkMdc && bm != 0 {
                let len = format::pages_in_unit(r.len as u64, u) * PAGE;
                // SAFETY: the unit's range inside the region; dropping the child's view of
                // pages it has written (the parent keeps its own mapping).
                if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) }
                    != 0
                {
                    // SAFETY: reading errno.
                    fail(STEP_DROP, unsafe { *libc::__errno_location() });
                }
            }
            h.done_units.fetch_add(1, Release);
        }
    }
    h.status.store(OK, Release);
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

impl ForkJob {
    pub(crate) fn progress(&self) -> (usize, usize) {
        (
            self.map.head().done_units.load(Acquire) as usize,
            self.map.units,
        )
    }

    pub(crate) fn pause(&self) -> Duration {
        self.pause
    }

    pub(crate) fn child_pid(&self) -> Option<u32> {
        (self.pid > 0).then_some(self.pid as u32)
    }

    /// Waits for the child; returns its wait status.
    fn reap(&mut self) -> i32 {
        let mut status = 0;
        while self.pid > 0 {
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            // SAFETY: reading errno.
            if r < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            self.pid = 0;
        }
        status
    }

    pub(crate) fn wait(mut self) -> Result<Report> {
        let status = self.reap();
        let tmp = self
            .reservation
            .as_ref()
            .map(|r| r.tmp_path().to_path_buf())
            .unwrap_or_default();
        let h = self.map.head();
        if h.status.load(Acquire) != OK || !libc::WIFEXITED(status) {
            if h.status.load(Acquire) == FAILED {
                let e = std::io::Error::from_raw_os_error(h.errno.load(Acquire));
                return Err(if h.errno.load(Acquire) == libc::ENOSPC {
                    tiermem_media::MediaError::NoSpace {
                        path: tmp,
                        requested: 0,
                        available: 0,
                    }
                    .into()
                } else {
                    SnapshotError::io(step_name(h.step.load(Acquire)), &tmp, e)
                });
            }
            return Err(SnapshotError::Aborted(if libc::WIFSIGNALED(status) {
                format!(
                    "the snapshot child was killed by signal {}",
                    libc::WTERMSIG(status)
                )
            } else {
                format!("the snapshot child ended with status {status:#x}")
            }));
        }
        let bitmaps: Vec<u64> = self.map.bitmaps().iter().map(|b| b.load(Acquire)).collect();
        let layout = Layout::new(
            std::mem::take(&mut self.infos),
            bitmaps,
            self.app.len() as u64,
        )?;
        let units = layout.units();
        let present = layout.present_pages();
        let writer = self
            .reservation
            .take()
            .expect("fork job reservation")
            .into_writer(layout, self.method)?;
        for (g, c) in self.map.crcs().iter().enumerate() {
            writer.record_unit(g, c.load(Acquire));
        }
        let direct = writer.direct();
        let dumped = (0..units)
            .filter(|&g| writer.layout().bitmap(g) != 0)
            .count() as u64;
        let file_bytes = writer.finish(&self.app)?;
        Ok(Report {
            file_bytes,
            present_pages: present,
            units,
            pause: self.pause,
            total: self.started.elapsed(),
            dumped_units: dumped,
            extra_bytes_bound: present * PAGE as u64 + UNIT_BYTES as u64 + units as u64 * 16,
            direct,
            ..Report::default()
        })
    }

    pub(crate) fn abort(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        if self.pid > 0 {
            // SAFETY: signalling our own, unreaped child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            self.reap();
        }
    }
}

impl Drop for ForkJob {
    fn drop(&mut self) {
        // Unfinished: kill and reap the child; the reservation removes the temporary file.
        self.kill();
    }
}

// The status a child that never wrote one has: `RUNNING` (it was killed).
const _: () = assert!(RUNNING == 0);
