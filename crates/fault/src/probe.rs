//! Measurements for `tiermem doctor` and `tiermem bench fault`. These are library functions that
//! return raw samples (nanoseconds) — not tests, and they assert no timing.
//!
//! Timing uses `clock_gettime(CLOCK_MONOTONIC)` through the vDSO (tens of ns with the TSC
//! clocksource), small next to the ~1 µs events measured. Each function maps its own memory and
//! registers its own regions, so it can run while the engine serves other regions.

use crate::engine::Engine;
use crate::error::{Error, ResolveError, Result};
use crate::policy::{Fault, FaultOps, Resolver};
use crate::region::{RegionSpec, Resolution};
use crate::sys::PAGE_SIZE;
use crate::tracker::{PageRange, TrackerOptions, TrackingMethod, WriteTracker};
use std::sync::Arc;
use std::time::Instant;

/// An anonymous private mapping, unmapped on drop.
pub(crate) struct Map {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

impl Map {
    pub(crate) fn anon(len: usize, populate: bool) -> Result<Map> {
        let flags =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: anonymous mapping, no fd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last("mmap"));
        }
        // Measure 4 KiB faults, not THP allocation.
        // SAFETY: advice on our own fresh mapping.
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        Ok(Map {
            ptr: p as *mut u8,
            len,
        })
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[inline]
fn touch(p: *mut u8) {
    // SAFETY: callers pass addresses inside a live mapping of theirs.
    unsafe { std::ptr::write_volatile(p, 1) };
}

fn time_writes(base: *mut u8, pages: usize) -> Vec<f64> {
    let mut v = Vec::with_capacity(pages);
    for i in 0..pages {
        // SAFETY: i < pages, inside the caller's mapping.
        let p = unsafe { base.add(i * PAGE_SIZE) };
        let t0 = Instant::now();
        touch(p);
        v.push(t0.elapsed().as_nanos() as f64);
    }
    v
}

/// The `p`-th percentile (0..=100, nearest rank) of `samples`; NaN when empty.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p.clamp(0.0, 100.0) / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// First write to each of `pages` fresh anonymous pages (kernel page fault + zeroing), ns each.
pub fn first_touch_ns(pages: usize) -> Result<Vec<f64>> {
    let m = Map::anon(pages * PAGE_SIZE, false)?;
    Ok(time_writes(m.ptr, pages))
}

/// Bandwidth of fresh anonymous memory, GB/s: `bytes` mapped with `MAP_POPULATE` (the kernel
/// allocates and zeroes every page in one call), timed, unmapped; the median of `reps`. Where
/// a VM's balloon reports freed pages to its host (free page reporting), memory the guest
/// freed is unbacked again and this is the host's fault rate too: the floor of anything that
/// fills gigabytes of new memory (a migration target, a file on tmpfs).
pub fn fresh_memory_gbps(bytes: usize, reps: usize) -> Result<f64> {
    let len = bytes.max(PAGE_SIZE).div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let mut t = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let m = Map::anon(len, true)?;
        t.push(t0.elapsed().as_secs_f64());
        drop(m);
    }
    let med = percentile(&t, 50.0);
    Ok(len as f64 / med / 1e9)
}

/// A resolver that UFFDIO_COPYs one source page into every faulting page.
struct CopyPage {
    src: Box<[u8]>,
}

impl Resolver for CopyPage {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        ops.copy(f.offset, &self.src, false).map(|_| ())
    }
}

fn uffd_ns(pages: usize, resolution: Resolution) -> Result<Vec<f64>> {
    let m = Map::anon(pages * PAGE_SIZE, false)?;
    let src = vec![0x5au8; PAGE_SIZE].into_boxed_slice();
    let h = Engine::global().register(
        RegionSpec::new(m.ptr, m.len).resolution(resolution),
        Arc::new(CopyPage { src }),
    )?;
    let v = time_writes(m.ptr, pages);
    h.unregister()?;
    Ok(v)
}

/// Missing fault resolved in the faulting thread by the engine (SIGBUS + one UFFDIO_COPY of a
/// source page), ns per first write.
pub fn uffd_in_thread_ns(pages: usize) -> Result<Vec<f64>> {
    uffd_ns(pages, Resolution::InThread)
}

/// Missing fault resolved by the engine's runtime thread, blocking (no spin), ns per first write.
pub fn uffd_handler_thread_ns(pages: usize) -> Result<Vec<f64>> {
    uffd_ns(pages, Resolution::HandlerThread { spin_us: 0 })
}

/// Missing fault resolved by the runtime thread spinning `spin_us` after each fault, ns each.
pub fn uffd_handler_thread_spin_ns(pages: usize, spin_us: u32) -> Result<Vec<f64>> {
    uffd_ns(pages, Resolution::HandlerThread { spin_us })
}

/// userfaultfd descriptor and source page of [`uffd_sigbus_bare_ns`]'s child (its signal handler
/// cannot take arguments).
static BARE_UFFD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static BARE_SRC: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn bare_sigbus(_sig: i32, info: *mut libc::siginfo_t, _uc: *mut libc::c_void) {
    use std::sync::atomic::Ordering::Relaxed;
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as u64 & !(PAGE_SIZE as u64 - 1);
    let mut c = crate::sys::UffdioCopy {
        dst: addr,
        src: BARE_SRC.load(Relaxed) as u64,
        len: PAGE_SIZE as u64,
        mode: 0,
        copy: 0,
    };
    // SAFETY: one UFFDIO_COPY ioctl on the child's own userfaultfd with a valid uffdio_copy.
    unsafe {
        libc::ioctl(
            BARE_UFFD.load(Relaxed),
            crate::sys::UFFDIO_COPY as libc::c_ulong,
            &mut c,
        )
    };
}

/// The bare mechanism in-thread resolution stands on, without the engine: a forked child with its
/// own userfaultfd (UFFD_FEATURE_SIGBUS) and a minimal SIGBUS handler that does one UFFDIO_COPY,
/// ns per first write. The difference to [`uffd_in_thread_ns`] is what the engine adds (region
/// lookup, classification, dispatch, accounting); this is the floor of the mode on this machine.
pub fn uffd_sigbus_bare_ns(pages: usize) -> Result<Vec<f64>> {
    if pages == 0 {
        return Err(Error::InvalidArgument("no pages to measure".into()));
    }
    // The child opens its descriptor the way this process can (an unprivileged user may have
    // only UFFD_USER_MODE_ONLY, which is all this user-mode probe needs).
    let (_fd, access) = crate::access::open(libc::O_CLOEXEC | libc::O_NONBLOCK)?;
    let region = Map::anon(pages * PAGE_SIZE, false)?;
    let src = Map::anon(PAGE_SIZE, true)?;
    // Results travel back through a shared mapping: the child writes, the parent reads after
    // waitpid. Everything is allocated before fork, so the child never allocates or locks.
    let out_len = (pages * 8).div_ceil(PAGE_SIZE) * PAGE_SIZE;
    // SAFETY: a fresh shared anonymous mapping; checked below.
    let out = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            out_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if out == libc::MAP_FAILED {
        return Err(Error::last("mmap"));
    }
    let out = out as *mut f64;
    // SAFETY: fork; the child runs only async-signal-safe code (syscalls, stores) and _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(out.cast(), out_len) };
        return Err(Error::last("fork"));
    }
    if pid == 0 {
        // SAFETY: child side: raw syscalls on memory it owns; never returns.
        unsafe {
            let code = bare_child(access, region.ptr, pages, src.ptr, out);
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    // SAFETY: the child has exited; `out` holds `pages` f64 values it wrote.
    let v = unsafe { std::slice::from_raw_parts(out, pages) }.to_vec();
    // SAFETY: unmapping our own mapping.
    unsafe { libc::munmap(out.cast(), out_len) };
    if !ok {
        return Err(Error::Verification(format!(
            "bare SIGBUS probe child failed (wait status {status:#x}): userfaultfd with \
             UFFD_FEATURE_SIGBUS unavailable?"
        )));
    }
    Ok(v)
}

/// Child side of [`uffd_sigbus_bare_ns`]: returns the exit code.
///
/// # Safety
/// Call only in a freshly forked child; `region` (unpopulated), `src` and `out` must be mappings
/// of `pages` pages, one page and `pages` f64 values.
unsafe fn bare_child(
    access: crate::access::UffdAccess,
    region: *mut u8,
    pages: usize,
    src: *mut u8,
    out: *mut f64,
) -> i32 {
    use crate::sys::{UffdioApi, UffdioRange, UffdioRegister, UFFDIO_API, UFFDIO_REGISTER};
    use std::sync::atomic::Ordering::Relaxed;
    // SAFETY (whole body): raw syscalls with valid arguments on memory this child owns.
    unsafe {
        let Ok(fd) = crate::access::open_raw(access, libc::O_CLOEXEC | libc::O_NONBLOCK) else {
            return 2;
        };
        let mut api = UffdioApi {
            api: crate::sys::UFFD_API,
            features: crate::sys::UFFD_FEATURE_SIGBUS,
            ioctls: 0,
        };
        if libc::ioctl(fd, UFFDIO_API as libc::c_ulong, &mut api) != 0 {
            return 3;
        }
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: region as u64,
                len: (pages * PAGE_SIZE) as u64,
            },
            mode: crate::sys::UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        if libc::ioctl(fd, UFFDIO_REGISTER as libc::c_ulong, &mut reg) != 0 {
            return 4;
        }
        BARE_UFFD.store(fd, Relaxed);
        BARE_SRC.store(src as usize, Relaxed);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = bare_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
            return 5;
        }
        for i in 0..pages {
            let p = region.add(i * PAGE_SIZE);
            let t0 = Instant::now();
            touch(p);
            *out.add(i) = t0.elapsed().as_nanos() as f64;
        }
        0
    }
}

/// First write to a read-only page whose SIGSEGV handler mprotects it back (the tracker's
/// mprotect fallback), ns per access.
pub fn mprotect_fault_ns(pages: usize) -> Result<Vec<f64>> {
    let m = Map::anon(pages * PAGE_SIZE, true)?;
    let _t = WriteTracker::new(
        m.ptr,
        m.len,
        TrackerOptions {
            force_mprotect: true,
            ..Default::default()
        },
    )?;
    Ok(time_writes(m.ptr, pages))
}

/// First write to a populated page under userfaultfd async write-protect (WP_ASYNC), ns each.
pub fn write_fault_wp_async_ns(pages: usize) -> Result<Vec<f64>> {
    let m = Map::anon(pages * PAGE_SIZE, true)?;
    let t = WriteTracker::new(m.ptr, m.len, TrackerOptions::default())?;
    if t.method() != TrackingMethod::UffdWpAsync {
        return Err(Error::MissingFeature {
            feature: "UFFD_FEATURE_WP_ASYNC",
            needed_for: "write_fault_wp_async_ns",
        });
    }
    Ok(time_writes(m.ptr, pages))
}

/// Warm 4 KiB memcpy between two page-aligned pages (the shape of a page copy), ns per copy.
///
/// Note: on AMD EPYC hosts glibc's memcpy is ~20x slower when source and destination are a few
/// bytes apart modulo 4 KiB (e.g. two `vec![0u8; 4096]` from malloc); page-aligned buffers avoid
/// that case, so this measures the page-copy cost resolvers actually pay.
pub fn memcpy_4k_ns(samples: usize) -> Result<Vec<f64>> {
    let m = Map::anon(2 * PAGE_SIZE, true)?;
    let (src, dst) = (m.ptr, m.ptr.wrapping_add(PAGE_SIZE));
    let copy = || {
        // SAFETY: two distinct, populated pages of our mapping.
        unsafe { std::ptr::copy_nonoverlapping(std::hint::black_box(src), dst, PAGE_SIZE) };
        std::hint::black_box(dst);
    };
    for _ in 0..100 {
        copy();
    }
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        copy();
        v.push(t0.elapsed().as_nanos() as f64);
    }
    Ok(v)
}

/// memcpy bandwidth over `bytes`-sized populated buffers, GB/s (median of 5 copies).
pub fn copy_gbps(bytes: usize) -> Result<f64> {
    let len = bytes.max(PAGE_SIZE).div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let a = Map::anon(len, true)?;
    let b = Map::anon(len, true)?;
    let mut t = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        // SAFETY: both mappings are len bytes and distinct.
        unsafe { std::ptr::copy_nonoverlapping(a.ptr, b.ptr, len) };
        std::hint::black_box(b.ptr);
        t.push(t0.elapsed().as_secs_f64());
    }
    let med = percentile(&t, 50.0);
    Ok(len as f64 / med / 1e9)
}

/// Result of [`scan_written`].
#[derive(Debug, Clone)]
pub struct ScanBench {
    /// Tracking method measured.
    pub method: TrackingMethod,
    /// Pages in the tracked region.
    pub region_pages: usize,
    /// Pages written (randomly) before each scan.
    pub written_pages: usize,
    /// Time of each scan (ms), every one verified exact.
    pub scan_ms: Vec<f64>,
    /// Median of `scan_ms`.
    pub median_ms: f64,
}

/// Builds a populated anonymous region of `region_bytes`, tracks it, and for `rounds` rounds
/// writes a random `fraction` of its pages, scans once (timed), and checks that the scan
/// returned exactly the written set ([`Error::Verification`] otherwise).
pub fn scan_written(
    region_bytes: usize,
    fraction: f64,
    rounds: usize,
    opts: TrackerOptions,
) -> Result<ScanBench> {
    let pages = region_bytes / PAGE_SIZE;
    if pages == 0 || rounds == 0 {
        return Err(Error::InvalidArgument("empty region or no rounds".into()));
    }
    let m = Map::anon(pages * PAGE_SIZE, true)?;
    let mut t = WriteTracker::new(m.ptr, m.len, opts)?;
    let nwrite = ((pages as f64 * fraction).round() as usize).clamp(1, pages);
    let mut out: Vec<PageRange> = Vec::with_capacity(nwrite + 16);
    t.scan(&mut out)?; // baseline: nothing written yet, arms everything
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (m.ptr as u64);
    let mut mark = vec![false; pages];
    let mut chosen = Vec::with_capacity(nwrite);
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        chosen.clear();
        mark.iter_mut().for_each(|x| *x = false);
        while chosen.len() < nwrite {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let p = (rng % pages as u64) as usize;
            if !mark[p] {
                mark[p] = true;
                chosen.push(p);
            }
        }
        for &p in &chosen {
            // SAFETY: p < pages.
            touch(unsafe { m.ptr.add(p * PAGE_SIZE + 8) });
        }
        let t0 = Instant::now();
        let n = t.scan(&mut out)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        let mut got = 0usize;
        for r in &out {
            let first = r.offset / PAGE_SIZE;
            for (i, &m) in mark[first..(r.offset + r.len) / PAGE_SIZE]
                .iter()
                .enumerate()
            {
                let p = first + i;
                if !m {
                    return Err(Error::Verification(format!(
                        "round {round}: page {p} reported written but was not"
                    )));
                }
                got += 1;
            }
        }
        if got != nwrite || n != nwrite {
            return Err(Error::Verification(format!(
                "round {round}: {nwrite} pages written, scan reported {got} (returned {n})"
            )));
        }
    }
    let median_ms = percentile(&times, 50.0);
    Ok(ScanBench {
        method: t.method(),
        region_pages: pages,
        written_pages: nwrite,
        scan_ms: times,
        median_ms,
    })
}

/// The reference scenario: a populated 1 GiB anonymous region, 1 % of pages written at random,
/// `rounds` verified scans with userfaultfd WP_ASYNC; returns the median scan time in ms
/// (target ≤ 2 ms on the reference VM; the bare ioctl is ~0.5 ms).
pub fn scan_1gib_ms(rounds: usize) -> Result<f64> {
    let b = scan_written(1 << 30, 0.01, rounds, TrackerOptions::default())?;
    if b.method != TrackingMethod::UffdWpAsync {
        return Err(Error::MissingFeature {
            feature: "UFFD_FEATURE_WP_ASYNC / PAGEMAP_SCAN",
            needed_for: "scan_1gib_ms",
        });
    }
    Ok(b.median_ms)
}
