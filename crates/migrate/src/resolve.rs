//! The target's fault resolver for FAM-aware post-copy (paper 003 Fig. 4): a fault on a page
//! known to be dumped is served from the mapped lazy-page file with one `UFFDIO_COPY` and no
//! message; any other fault asks the source's page-server to dump the vector holding it, learns
//! the dump progress and the vector's range from the reply (both go into the [`DumpedLookup`]),
//! then copies from the file.
//!
//! The resolver runs wherever the fault engine runs it — in the faulting thread's SIGBUS handler
//! for in-thread regions — so everything on its path is async-signal-safe: the lookup table
//! (atomics), the mapped file, and the [`PageServerLink`] (which must be, too: raw socket I/O
//! under a spin lock). Prefetching uses the same path: a thread that touches every page
//! ([`prefetch`]) faults them in through this resolver.

use crate::lookup::DumpedLookup;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiermem_fault::{Fault, FaultOps, ResolveError, Resolver, PAGE_SIZE};

/// The dumped image of one region, mapped (the lazy-page file's data).
pub trait DumpedImage: Send + Sync {
    /// The region's bytes `off..off + len` as dumped. Only meaningful where the lookup says
    /// dumped. Must not allocate or lock (called in signal context).
    fn image(&self, off: u64, len: usize) -> &[u8];
    /// Charge the delay model for reading `bytes` from FAM (busy-wait; signal-safe).
    fn charge_read(&self, bytes: u64) {
        let _ = bytes;
    }
    /// Whether the image itself says `off` is dumped (a shared file's header, read with
    /// atomics). Default: it does not say.
    fn dumped(&self, off: u64) -> bool {
        let _ = off;
        false
    }
    /// The image's own dump watermark (0 if it keeps none).
    fn watermark(&self) -> u64 {
        0
    }
}

/// What the page-server answered to a fault request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpReply {
    /// The background dump's watermark (every offset below is dumped).
    pub progress: u64,
    /// Start of the vector dumped for the request.
    pub vec_start: u64,
    /// Its length.
    pub vec_len: u64,
}

/// The connection to the source's page-server. `request` must be async-signal-safe when the
/// region resolves in-thread, and must fail — never block forever — when the source is dead.
pub trait PageServerLink: Send + Sync {
    /// Ask the source to dump the vector holding `off` of region `region`; wait for the reply.
    fn request(&self, region: u32, off: u64) -> Result<DumpReply, &'static str>;
}

/// Counters of a [`FamResolver`].
#[derive(Debug, Default)]
pub struct ResolverStats {
    /// Faults served from FAM with no message (the page was known to be dumped).
    pub from_fam: AtomicU64,
    /// Faults that asked the page-server first.
    pub on_demand: AtomicU64,
    /// Bytes copied into the region.
    pub bytes: AtomicU64,
    /// Faults that failed (source gone, ...).
    pub failed: AtomicU64,
    /// Runs mapped as zero pages (their bytes in FAM were all zero).
    pub zero_runs: AtomicU64,
}

/// Whether every byte of `b` is zero (word at a time; signal-safe).
pub(crate) fn is_zero(b: &[u8]) -> bool {
    if b.is_empty() {
        return false;
    }
    let (head, words, tail) = {
        // SAFETY: reinterpreting initialized bytes as u64 words (any bit pattern is valid).
        unsafe { b.align_to::<u64>() }
    };
    head.iter().all(|&x| x == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&x| x == 0)
}

/// The FAM-aware post-copy resolver of one region (see the module documentation).
pub struct FamResolver {
    region: u32,
    lookup: Arc<DumpedLookup>,
    image: Arc<dyn DumpedImage>,
    link: Arc<dyn PageServerLink>,
    /// Most bytes copied per fault (the known-dumped run from the faulting page on).
    max_run: u64,
    region_len: u64,
    stats: Arc<ResolverStats>,
    /// The region's reserved target memory, if any: runs are moved in from it.
    reserved: Option<Arc<crate::targetmem::TargetMemory>>,
}

impl FamResolver {
    /// A resolver for region number `region` of `region_len` bytes, copying up to `max_run`
    /// bytes (rounded to pages, at least one) of a known-dumped run per fault.
    pub fn new(
        region: u32,
        region_len: u64,
        lookup: Arc<DumpedLookup>,
        image: Arc<dyn DumpedImage>,
        link: Arc<dyn PageServerLink>,
        max_run: u64,
    ) -> FamResolver {
        FamResolver {
            region,
            lookup,
            image,
            link,
            max_run: (max_run / PAGE_SIZE as u64).max(1) * PAGE_SIZE as u64,
            region_len,
            stats: Arc::default(),
            reserved: None,
        }
    }

    /// Install runs through `reserved` (the region's memory reserved before the freeze: a
    /// copy into existing pages and a `UFFDIO_MOVE`) instead of `UFFDIO_COPY` into new pages.
    pub fn with_reserved(mut self, reserved: Arc<crate::targetmem::TargetMemory>) -> FamResolver {
        self.reserved = Some(reserved);
        self
    }

    /// The resolver's counters (shared; read them while it runs).
    pub fn stats(&self) -> Arc<ResolverStats> {
        self.stats.clone()
    }
}

impl Resolver for FamResolver {
    fn resolve(&self, fault: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        let off = fault.offset as u64;
        if !self.lookup.contains(off) && self.image.dumped(off) {
            // The shared file says more than the replies did (the source kept dumping).
            self.lookup.advance(self.image.watermark());
            if !self.lookup.contains(off) {
                self.lookup
                    .insert(off / PAGE_SIZE as u64 * PAGE_SIZE as u64, PAGE_SIZE as u64);
            }
        }
        if self.lookup.contains(off) {
            self.stats.from_fam.fetch_add(1, Ordering::Relaxed);
        } else {
            match self.link.request(self.region, off) {
                Ok(r) => {
                    self.lookup.advance(r.progress);
                    self.lookup.insert(r.vec_start, r.vec_len);
                    self.stats.on_demand.fetch_add(1, Ordering::Relaxed);
                }
                // The source may have finished the dump and left between our look at the
                // file and the request (it persists the completion before it tells anyone):
                // look again before failing.
                Err(_) if self.image.dumped(off) => {
                    self.lookup.advance(self.image.watermark());
                    if !self.lookup.contains(off) {
                        self.lookup
                            .insert(off / PAGE_SIZE as u64 * PAGE_SIZE as u64, PAGE_SIZE as u64);
                    }
                    self.stats.from_fam.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(ResolveError::Resolver(e));
                }
            }
            if !self.lookup.contains(off) {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                return Err(ResolveError::Resolver(
                    "the page-server's reply does not cover the faulting page",
                ));
            }
        }
        let (_, run_end) = self
            .lookup
            .run_around(off, self.max_run)
            .unwrap_or((off, off + PAGE_SIZE as u64));
        let end = run_end
            .min(off + self.max_run)
            .min(self.region_len)
            .max(off + PAGE_SIZE as u64);
        let len = ((end - off) as usize).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let src = self.image.image(off, len);
        self.image.charge_read(len as u64);
        // A run of zeros (never-touched memory the dump skipped, or plain zeros) is mapped as
        // the shared zero page: no copy and no memory at the target until it is written.
        let n = if is_zero(src) {
            self.stats.zero_runs.fetch_add(1, Ordering::Relaxed);
            ops.zero(fault.offset, len)?
        } else if let Some(st) = &self.reserved {
            st.resolve(ops, fault.offset, src)?
        } else {
            ops.copy(fault.offset, src, false)?
        };
        self.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Touch one byte of every page of `base..base + len` (reads), so that every page not yet
/// present faults in through the region's resolver; returns the pages touched. Run it on a
/// thread of its own to complete a migration in the background.
///
/// # Safety
/// `base..base + len` must be a live mapping of this process (a registered region).
pub unsafe fn prefetch(base: *const u8, len: usize) -> usize {
    let mut pages = 0;
    let mut off = 0;
    while off < len {
        // SAFETY: inside the live mapping (caller's contract); a volatile read so it happens.
        unsafe { std::ptr::read_volatile(base.add(off)) };
        pages += 1;
        off += PAGE_SIZE;
    }
    pages
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use tiermem_fault::{Engine, RegionSpec};

    struct VecImage(Vec<u8>);
    impl DumpedImage for VecImage {
        fn image(&self, off: u64, len: usize) -> &[u8] {
            &self.0[off as usize..off as usize + len]
        }
    }

    /// A page-server stand-in: dumps 2 MiB vectors on request, logs the requests.
    struct FakeServer {
        progress: u64,
        log: Mutex<Vec<u64>>,
        dead: bool,
    }
    impl PageServerLink for FakeServer {
        fn request(&self, _region: u32, off: u64) -> Result<DumpReply, &'static str> {
            if self.dead {
                return Err("the source is gone");
            }
            // (A test stand-in: a real link must not lock or allocate in signal context.)
            self.log.lock().push(off);
            let v = off & !((2 << 20) - 1);
            Ok(DumpReply {
                progress: self.progress,
                vec_start: v,
                vec_len: 2 << 20,
            })
        }
    }

    fn map(len: usize) -> *mut u8 {
        // SAFETY: a fresh private anonymous mapping; checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as *mut u8
    }

    /// An image whose dump completes while the resolver asks a source that just left.
    struct LateImage {
        bytes: Vec<u8>,
        complete: std::sync::atomic::AtomicBool,
    }
    impl DumpedImage for LateImage {
        fn image(&self, off: u64, len: usize) -> &[u8] {
            &self.bytes[off as usize..off as usize + len]
        }
        fn dumped(&self, _off: u64) -> bool {
            self.complete.load(Ordering::Acquire)
        }
        fn watermark(&self) -> u64 {
            if self.complete.load(Ordering::Acquire) {
                self.bytes.len() as u64
            } else {
                0
            }
        }
    }
    /// A source that finishes the dump and closes the connection instead of replying.
    struct LeavingServer(Arc<LateImage>);
    impl PageServerLink for LeavingServer {
        fn request(&self, _region: u32, _off: u64) -> Result<DumpReply, &'static str> {
            self.0.complete.store(true, Ordering::Release);
            Err("the source is gone (connection closed)")
        }
    }

    #[test]
    fn a_source_that_completes_and_leaves_mid_request_is_not_an_error() {
        let len = 1 << 20;
        let image = Arc::new(LateImage {
            bytes: (0..len).map(|i| (i / 4096 + i) as u8).collect(),
            complete: Default::default(),
        });
        let r = Arc::new(FamResolver::new(
            0,
            len as u64,
            Arc::new(DumpedLookup::new()),
            image.clone(),
            Arc::new(LeavingServer(image.clone())),
            64 << 10,
        ));
        let stats = r.stats();
        let base = map(len);
        let h = Engine::global()
            .register(RegionSpec::new(base, len).missing(true).in_thread(), r)
            .expect("register (needs root or vm.unprivileged_userfaultfd)");
        // SAFETY: the registered mapping; the first fault's request fails but the file has it.
        unsafe { prefetch(base, len) };
        // SAFETY: every page is present now.
        let got = unsafe { std::slice::from_raw_parts(base, len) };
        assert!(got == &image.bytes[..]);
        assert_eq!(stats.failed.load(Ordering::Relaxed), 0);
        h.unregister().unwrap();
        // SAFETY: our mapping.
        unsafe { libc::munmap(base as *mut libc::c_void, len) };
    }

    #[test]
    fn dumped_pages_come_from_fam_others_ask_the_source() {
        let len = 8 << 20;
        let image: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let lookup = Arc::new(DumpedLookup::new());
        lookup.advance(4 << 20); // the first half is dumped already
        let server = Arc::new(FakeServer {
            progress: 4 << 20,
            log: Mutex::new(Vec::new()),
            dead: false,
        });
        let r = Arc::new(FamResolver::new(
            0,
            len as u64,
            lookup,
            Arc::new(VecImage(image.clone())),
            server.clone(),
            64 << 10,
        ));
        let stats = r.stats();
        let base = map(len);
        let h = Engine::global()
            .register(RegionSpec::new(base, len).missing(true).in_thread(), r)
            .expect("register (needs root or vm.unprivileged_userfaultfd)");
        // SAFETY: the registered mapping.
        let pages = unsafe { prefetch(base, len) };
        assert_eq!(pages, len / 4096);
        // SAFETY: every page is present now.
        let got = unsafe { std::slice::from_raw_parts(base, len) };
        assert!(got == &image[..], "every byte arrived");
        // Two vectors above the watermark: one request each; the rest came from FAM.
        assert_eq!(server.log.lock().len(), 2, "{:?}", server.log.lock());
        assert_eq!(stats.on_demand.load(Ordering::Relaxed), 2);
        assert_eq!(
            stats.from_fam.load(Ordering::Relaxed) + 2,
            (len / (64 << 10)) as u64,
            "one fault per 64 KiB run"
        );
        h.unregister().unwrap();
        // SAFETY: our mapping.
        unsafe { libc::munmap(base as *mut libc::c_void, len) };
    }
}
