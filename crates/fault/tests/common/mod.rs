//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tiermem_fault::*;

pub const PS: usize = PAGE_SIZE;

/// Fails (never skips) when the kernel lacks what the engine needs. Any way of obtaining a
/// userfaultfd will do (an unprivileged user gets `UFFD_USER_MODE_ONLY` descriptors, which serve
/// every user-mode fault); tests that depend on the way check `f.access` themselves.
pub fn require_uffd() -> UffdFeatures {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    probe_features().unwrap_or_else(|e| {
        panic!("userfaultfd is required for this test (running as uid {euid}): {e}")
    })
}

/// Prints, visibly, that (part of) `test` is skipped because the process lacks `privilege`.
/// Only for what truly needs a privilege; `scripts/test.sh` lists these lines. Written to stderr
/// directly, past the test harness's output capture, so that it shows for a passing test too.
pub fn skip_unprivileged(test: &str, privilege: &str) {
    use std::io::Write;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED as uid {euid}: {test}: needs {privilege}"
    );
}

/// Panics with a message naming `name` when `ok` is false.
pub fn require(ok: bool, name: &str) {
    assert!(ok, "the running kernel lacks {name}, which this test needs");
}

/// An mmap'd area unmapped on drop (unless `leak`ed).
pub struct Area {
    pub ptr: *mut u8,
    pub len: usize,
}
unsafe impl Send for Area {}
unsafe impl Sync for Area {}

impl Area {
    pub fn anon(pages: usize) -> Area {
        Self::map(pages, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    }
    pub fn shared_anon(pages: usize) -> Area {
        Self::map(pages, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1)
    }
    pub fn map(pages: usize, flags: i32, fd: i32) -> Area {
        let len = pages * PS;
        // SAFETY: fresh mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        Area {
            ptr: p as *mut u8,
            len,
        }
    }
    pub fn page(&self, i: usize) -> *mut u8 {
        assert!(i * PS < self.len);
        unsafe { self.ptr.add(i * PS) }
    }
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }
    pub fn leak(self) {
        std::mem::forget(self)
    }
}
impl Drop for Area {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The byte pattern a [`PatternResolver`] writes at byte `i` of page `page`.
pub fn pattern(page: usize, i: usize) -> u8 {
    (page.wrapping_mul(131) ^ i.wrapping_mul(7) ^ 0xa5) as u8
}

/// Fills missing pages with `pattern(page, i)` from pre-built per-page sources (no allocation
/// in resolve: in-thread safe). Counts fills.
pub struct PatternResolver {
    pub srcs: Vec<Box<[u8]>>,
    pub fills: AtomicUsize,
    pub copied: AtomicUsize,
}
impl PatternResolver {
    pub fn new(pages: usize) -> Arc<PatternResolver> {
        let srcs = (0..pages)
            .map(|p| {
                (0..PS)
                    .map(|i| pattern(p, i))
                    .collect::<Vec<u8>>()
                    .into_boxed_slice()
            })
            .collect();
        Arc::new(PatternResolver {
            srcs,
            fills: AtomicUsize::new(0),
            copied: AtomicUsize::new(0),
        })
    }
}
impl Resolver for PatternResolver {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        let p = f.offset / PS;
        self.fills.fetch_add(1, Ordering::Relaxed);
        let n = ops.copy(f.offset, &self.srcs[p], false)?;
        self.copied.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

/// Checks every byte of page `page` of `a` equals the pattern of region page `rpage`.
pub fn check_page(base: *const u8, page: usize, rpage: usize) {
    for i in (0..PS).step_by(61).chain([PS - 1]) {
        let v = unsafe { std::ptr::read_volatile(base.add(page * PS + i)) };
        assert_eq!(v, pattern(rpage, i), "page {page} byte {i}");
    }
}

/// Waits (up to 10 s) until `f` is true; panics with `what` otherwise.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed().as_secs() < 10, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
