//! z-READ on a stock kernel (paper 002, Ch. 4): reads served from the page cache without a copy.
//!
//! * [`ZFile::zread`] returns a [`View`]: read-only bytes inside one shared mapping of the whole
//!   file (a *generation*), its pages populated with `MADV_POPULATE_READ` at most
//!   [`BATCH_PAGES`] per call (an unmappable page is an error, not a `SIGBUS`). Released views
//!   leave their pages mapped; once more than `zap_after` bytes are mapped and unreferenced,
//!   they are zapped in bulk (`MADV_DONTNEED` over runs): no `munmap` or TLB shootdown per
//!   call, and a later view of a page still mapped costs no system call at all.
//! * [`ZFile::zread_into`] is the paper's transparent form: the page-aligned part of the
//!   caller's buffer is remapped `MAP_PRIVATE|MAP_FIXED` onto the file (the kernel's
//!   copy-on-write is z-READ's write protection), ≤ 32 pages per call, head and tail copied.
//!   The loss model ([`crate::model`]) chooses copy or remap per request from `P(cow)`: the
//!   writes per file page, and how much of this buffer was copied-on-write since its last
//!   remap (`PAGEMAP_SCAN`, pages no longer `PAGE_IS_FILE`).
//! * Consistency: zero copy only under a read lease ([`ZeroCopy::Lease`]; [`crate::lease`]) or
//!   when the caller declares all writes go through [`ZFile::write_at`]
//!   ([`ZeroCopy::Exclusive`]). When the lease breaks, live views are made private (copied
//!   and `mremap`ed over themselves) and remapped buffers become anonymous memory with their
//!   bytes (a truncation discards even copied-on-write pages of a private file mapping)
//!   before the lease is released; until a lease can be retaken every read copies. A page that still vanishes hits the SIGBUS guard ([`crate::guard`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Deref;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::guard::{self, Guard};
use crate::lease::{self, OnBreak};
use crate::model::{Decision, Model};
use crate::sys;

/// The page size z-READ remaps and populates in.
pub const PAGE: usize = 4096;
/// Pages per populate or remap call (the paper's batch, Linux's single-page flush ceiling).
pub const BATCH_PAGES: usize = 32;
/// How often a file in copy mode tries to retake its lease.
const RETRY_LEASE_MS: u64 = 10;

/// When a [`ZFile`] may hand out zero-copy views and buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroCopy {
    /// Under a read lease (taken at open, retaken after a break): nobody else can open the file
    /// for writing or truncate it without first waiting for the views to be made private.
    Lease,
    /// The caller declares that the file changes only through [`ZFile::write_at`] (no lease;
    /// the file is opened read-write).
    Exclusive,
    /// Always copy (the baseline `read(2)` behaviour through the same API).
    Never,
}

/// Options of a [`ZFile`].
#[derive(Clone, Debug)]
pub struct ZOptions {
    /// When zero copy is allowed.
    pub zero_copy: ZeroCopy,
    /// Mapped, unreferenced view bytes above which released pages are zapped in bulk.
    pub zap_after: usize,
    /// Make live views and buffers private on a lease break (off only to test the guard).
    pub privatise: bool,
    /// `zread_into` asks the loss model (off: always remap when aligned).
    pub model: bool,
}

impl Default for ZOptions {
    fn default() -> Self {
        ZOptions {
            zero_copy: ZeroCopy::Lease,
            zap_after: 256 << 20,
            privatise: true,
            model: true,
        }
    }
}

/// Counters of a [`ZFile`] since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ZStats {
    /// `zread` calls.
    pub zreads: u64,
    /// Views returned without a copy.
    pub zero_copy_views: u64,
    /// Views that are copies (no lease, or the page could not be mapped).
    pub copied_views: u64,
    /// `MADV_POPULATE_READ` calls and the pages they mapped.
    pub populate_calls: u64,
    /// Pages mapped by those calls.
    pub populated_pages: u64,
    /// Bulk zaps and the pages they unmapped.
    pub zaps: u64,
    /// Pages unmapped by zaps.
    pub zapped_pages: u64,
    /// `zread_into` calls.
    pub into_calls: u64,
    /// Pages `zread_into` remapped.
    pub into_remapped_pages: u64,
    /// Bytes `zread_into` copied (head, tail, unaligned, model's choice, no lease).
    pub into_copied_bytes: u64,
    /// Requests the loss model sent to the copy path.
    pub model_copies: u64,
    /// Leases broken by another opener or truncation.
    pub lease_breaks: u64,
    /// View pages made private on breaks or exclusive writes.
    pub privatised_pages: u64,
    /// Buffer mappings copied-on-write in place on breaks or exclusive writes.
    pub privatised_buffers: u64,
    /// Writes through [`ZFile::write_at`].
    pub writes: u64,
}

#[derive(Default)]
struct Counters {
    zreads: AtomicU64,
    zero_copy_views: AtomicU64,
    copied_views: AtomicU64,
    populate_calls: AtomicU64,
    populated_pages: AtomicU64,
    zaps: AtomicU64,
    zapped_pages: AtomicU64,
    into_calls: AtomicU64,
    into_remapped_pages: AtomicU64,
    into_copied_bytes: AtomicU64,
    model_copies: AtomicU64,
    lease_breaks: AtomicU64,
    privatised_pages: AtomicU64,
    privatised_buffers: AtomicU64,
    writes: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One shared read-only mapping of the whole file, the pages views point into.
struct Gen {
    guard: Option<Guard>,
    base: *mut u8,
    map_len: usize,
    file_len: u64,
    refcnt: Box<[AtomicU32]>,
    populated: Box<[AtomicU64]>,
    zeroed: Box<[AtomicU64]>,
    populated_count: AtomicUsize,
    zapping: Mutex<()>,
    /// Some `zread` made a view of this generation: until then `write_at` need not look for
    /// live views (per-page counts it would read, each a cache miss, for a `zread_into` user).
    viewed: AtomicBool,
}

// SAFETY: the mapping is read-only shared memory; the bookkeeping is atomics and a mutex.
unsafe impl Send for Gen {}
// SAFETY: as above.
unsafe impl Sync for Gen {}

fn bitmap(pages: usize) -> Box<[AtomicU64]> {
    (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect()
}

fn bit(b: &[AtomicU64], i: usize) -> bool {
    b[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
}

impl Gen {
    fn new(fd: RawFd, file_len: u64) -> std::io::Result<Gen> {
        let pages = (file_len as usize).div_ceil(PAGE);
        let map_len = pages * PAGE;
        let base = if map_len == 0 {
            std::ptr::null_mut()
        } else {
            let b = sys::map_shared_ro(fd, map_len)?;
            // No fault read-around (it would read 128 KiB around every page a view misses):
            // `populate` asks for exactly the pages it maps, in one read.
            let _ = sys::madvise(b, map_len, libc::MADV_RANDOM);
            b
        };
        let mut g = Gen {
            guard: None,
            base,
            map_len,
            file_len,
            refcnt: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            populated: bitmap(pages),
            zeroed: bitmap(pages),
            populated_count: AtomicUsize::new(0),
            zapping: Mutex::new(()),
            viewed: AtomicBool::new(false),
        };
        if map_len > 0 {
            g.guard = guard::register(base, map_len, &g.zeroed);
            if g.guard.is_none() {
                return Err(std::io::Error::other(
                    "no SIGBUS guard slot is free for another view mapping",
                ));
            }
        }
        Ok(g)
    }

    /// Copies every page some view holds into private memory moved over it (`mremap`), so the
    /// views keep their bytes whatever happens to the file. Returns the pages made private.
    fn privatise_live(&self) -> u64 {
        let pages = self.refcnt.len();
        let mut done = 0;
        let mut p = 0;
        while p < pages {
            if self.refcnt[p].load(Ordering::Acquire) == 0 {
                p += 1;
                continue;
            }
            let mut q = p;
            while q < pages && self.refcnt[q].load(Ordering::Acquire) > 0 {
                q += 1;
            }
            let len = (q - p) * PAGE;
            // SAFETY: p..q lies inside this generation's mapping.
            let at = unsafe { self.base.add(p * PAGE) };
            if let Ok(tmp) = sys::AnonMap::new(len) {
                // SAFETY: both ranges are mapped and len long; the source is read-only memory
                // nobody writes (a truncated page reads as the guard's zero page).
                unsafe { std::ptr::copy_nonoverlapping(at, tmp.as_ptr(), len) };
                // SAFETY: moves the private copy over the view pages (same bytes), atomically
                // for concurrent readers; then forgets the temporary (it no longer exists).
                let r = unsafe {
                    libc::mprotect(tmp.as_ptr().cast(), len, libc::PROT_READ);
                    libc::mremap(
                        tmp.as_ptr().cast(),
                        len,
                        len,
                        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                        at.cast::<libc::c_void>(),
                    )
                };
                if r != libc::MAP_FAILED {
                    std::mem::forget(tmp);
                    done += (q - p) as u64;
                }
            }
            p = q;
        }
        done
    }

    /// Unmaps (`MADV_DONTNEED`) every populated page no view holds, in runs.
    fn zap(&self, c: &Counters) {
        let Some(_z) = self.zapping.try_lock() else {
            return;
        };
        let pages = self.refcnt.len();
        let mut left = 0usize;
        let mut zapped = 0u64;
        let mut p = 0;
        while p < pages {
            let word = self.populated[p / 64].load(Ordering::Relaxed);
            if word == 0 && p % 64 == 0 {
                p += 64;
                continue;
            }
            if !bit(&self.populated, p) {
                p += 1;
                continue;
            }
            if self.refcnt[p].load(Ordering::Relaxed) > 0 {
                left += 1;
                p += 1;
                continue;
            }
            let mut q = p;
            while q < pages
                && bit(&self.populated, q)
                && self.refcnt[q].load(Ordering::Relaxed) == 0
            {
                self.populated[q / 64].fetch_and(!(1 << (q % 64)), Ordering::Relaxed);
                q += 1;
            }
            // SAFETY: p..q lies inside the mapping; dropping a shared file mapping's PTEs loses
            // nothing (a later access maps the page-cache page again).
            let _ = sys::madvise(
                unsafe { self.base.add(p * PAGE) },
                (q - p) * PAGE,
                libc::MADV_DONTNEED,
            );
            zapped += (q - p) as u64;
            p = q;
        }
        self.populated_count.store(left, Ordering::Relaxed);
        add(&c.zaps, 1);
        add(&c.zapped_pages, zapped);
    }
}

impl Drop for Gen {
    fn drop(&mut self) {
        // The guard goes first: no SIGBUS may be resolved into a range about to be unmapped.
        self.guard = None;
        if self.map_len > 0 {
            // SAFETY: the mapping made in `new`; no view refers to it (views hold the Arc).
            unsafe { libc::munmap(self.base.cast(), self.map_len) };
        }
    }
}

/// Bytes read by [`ZFile::zread`]: a zero-copy window into the page cache, or a private copy.
/// The bytes do not change while the view lives (the lease or exclusive mode guarantees it;
/// a page truncated out from under an unguarded view reads as zeros and [`View::check`] fails).
pub struct View {
    inner: ViewInner,
}

enum ViewInner {
    Mapped {
        gen: Arc<Gen>,
        ptr: *const u8,
        len: usize,
        p0: usize,
        p1: usize,
    },
    Owned(Vec<u8>),
}

// SAFETY: a mapped view is read-only memory kept alive by its Arc<Gen>.
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

impl View {
    /// Whether the bytes are the page cache's own pages (no copy was made).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.inner, ViewInner::Mapped { .. })
    }

    /// `Err(Truncated)` when the SIGBUS guard had to zero-fill one of the view's pages (the file
    /// shrank under an unprotected view): the bytes read as zeros there are not the file's.
    pub fn check(&self) -> Result<()> {
        if let ViewInner::Mapped { gen, p0, p1, .. } = &self.inner {
            if (*p0..*p1).any(|p| bit(&gen.zeroed, p)) {
                return Err(Error::Truncated);
            }
        }
        Ok(())
    }
}

impl Deref for View {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            // SAFETY: ptr..ptr+len lies in the generation's mapping, which the Arc keeps mapped.
            ViewInner::Mapped { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            ViewInner::Owned(v) => v,
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if let ViewInner::Mapped { gen, p0, p1, .. } = &self.inner {
            for p in *p0..*p1 {
                gen.refcnt[p].fetch_sub(1, Ordering::Release);
            }
        }
    }
}

struct Shared {
    path: PathBuf,
    fd: OwnedFd,
    dev: u64,
    ino: u64,
    opts: ZOptions,
    cur: RwLock<Option<Arc<Gen>>>,
    /// Exclusive mode: the file's length as written through `write_at`.
    size: AtomicU64,
    last_try_ms: AtomicU64,
    started: Instant,
    /// Why zero copy is off, if it is (for `zero_copy_reason`).
    off_reason: Mutex<Option<String>>,
    /// zread_into reads and write_at writes per file page (the data side of P(cow)).
    reads: Box<[AtomicU32]>,
    writes: Box<[AtomicU32]>,
    /// Exclusive mode: remapped buffer pages by file page, and the reverse.
    buffers: Mutex<BufferMap>,
    c: Counters,
    me: OnceLock<Weak<Shared>>,
}

#[derive(Default)]
struct BufferMap {
    by_file: HashMap<u64, Vec<usize>>,
    by_buf: HashMap<usize, u64>,
}

/// A file opened for z-READ. Cheap to clone (shared state).
#[derive(Clone)]
pub struct ZFile {
    sh: Arc<Shared>,
}

impl ZFile {
    /// Opens `path` for z-READ with `opts`. Refuses what is not a regular file. In
    /// [`ZeroCopy::Lease`] mode a lease that cannot be taken now (the file is open for writing
    /// somewhere) leaves the file in copy mode, retried every 10 ms on later reads.
    pub fn open(path: impl AsRef<Path>, opts: ZOptions) -> Result<ZFile> {
        let path = path.as_ref();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(opts.zero_copy == ZeroCopy::Exclusive)
            .open(path)
            .map_err(|e| Error::Io {
                op: "open",
                path: path.to_path_buf(),
                source: e,
            })?;
        ZFile::from_owned(OwnedFd::from(f), path.to_path_buf(), opts)
    }

    /// Opens the file behind the caller's `fd` (which stays the caller's) for z-READ: a new
    /// open file description of the same file, so that the lease is z-READ's own. Refuses a
    /// write-only fd, pipes, sockets and directories.
    pub fn from_fd(fd: RawFd, opts: ZOptions) -> Result<ZFile> {
        let path = PathBuf::from(format!("/proc/self/fd/{fd}"));
        // SAFETY: F_GETFL on a caller-owned fd.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if fl < 0 {
            return Err(Error::Io {
                op: "fcntl(F_GETFL)",
                path,
                source: std::io::Error::last_os_error(),
            });
        }
        if fl & libc::O_ACCMODE == libc::O_WRONLY {
            return Err(Error::NotReadable { path });
        }
        let st = sys::fstat(fd).map_err(|e| Error::Io {
            op: "fstat",
            path: path.clone(),
            source: e,
        })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::NotRegular { path });
        }
        ZFile::open(&path, opts)
    }

    fn from_owned(fd: OwnedFd, path: PathBuf, opts: ZOptions) -> Result<ZFile> {
        let st = sys::fstat(fd.as_raw_fd()).map_err(|e| Error::Io {
            op: "fstat",
            path: path.clone(),
            source: e,
        })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::NotRegular { path });
        }
        let pages = (st.st_size as usize).div_ceil(PAGE);
        let sh = Arc::new(Shared {
            path,
            fd,
            dev: st.st_dev,
            ino: st.st_ino,
            opts,
            cur: RwLock::new(None),
            size: AtomicU64::new(st.st_size as u64),
            last_try_ms: AtomicU64::new(0),
            started: Instant::now(),
            off_reason: Mutex::new(None),
            reads: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            writes: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            buffers: Mutex::new(BufferMap::default()),
            c: Counters::default(),
            me: OnceLock::new(),
        });
        let _ = sh.me.set(Arc::downgrade(&sh));
        let z = ZFile { sh };
        z.sh.enable(true);
        Ok(z)
    }

    /// The file's path (as opened).
    pub fn path(&self) -> &Path {
        &self.sh.path
    }

    /// Whether reads are zero-copy now; if not, why (`None` when they are).
    pub fn zero_copy_reason(&self) -> Option<String> {
        if self.sh.cur.read().is_some() {
            return None;
        }
        Some(
            self.sh
                .off_reason
                .lock()
                .clone()
                .unwrap_or_else(|| "no lease".into()),
        )
    }

    /// Counters since open.
    pub fn stats(&self) -> ZStats {
        let c = &self.sh.c;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ZStats {
            zreads: l(&c.zreads),
            zero_copy_views: l(&c.zero_copy_views),
            copied_views: l(&c.copied_views),
            populate_calls: l(&c.populate_calls),
            populated_pages: l(&c.populated_pages),
            zaps: l(&c.zaps),
            zapped_pages: l(&c.zapped_pages),
            into_calls: l(&c.into_calls),
            into_remapped_pages: l(&c.into_remapped_pages),
            into_copied_bytes: l(&c.into_copied_bytes),
            model_copies: l(&c.model_copies),
            lease_breaks: l(&c.lease_breaks),
            privatised_pages: l(&c.privatised_pages),
            privatised_buffers: l(&c.privatised_buffers),
            writes: l(&c.writes),
        }
    }

    /// Reads `len` bytes at `off` (fewer at end of file) as a [`View`]: zero-copy when allowed
    /// (see [`ZeroCopy`]), else a copy. Never raises `SIGBUS`.
    pub fn zread(&self, off: u64, len: usize) -> Result<View> {
        let sh = &self.sh;
        add(&sh.c.zreads, 1);
        if len == 0 {
            return Ok(View {
                inner: ViewInner::Owned(Vec::new()),
            });
        }
        loop {
            let g = sh.cur.read();
            let Some(gen) = g.as_ref() else {
                drop(g);
                if sh.enable(false) {
                    continue;
                }
                return sh.copy_view(off, len);
            };
            // Exclusive mode: the file grew past this mapping under a read reaching past it.
            if sh.opts.zero_copy == ZeroCopy::Exclusive
                && off + len as u64 > gen.file_len
                && sh.size.load(Ordering::Acquire) > gen.file_len
            {
                drop(g);
                sh.retire();
                continue;
            }
            if off >= gen.file_len {
                return Ok(View {
                    inner: ViewInner::Owned(Vec::new()),
                });
            }
            let end = (off + len as u64).min(gen.file_len);
            let p0 = (off / PAGE as u64) as usize;
            let p1 = (end as usize).div_ceil(PAGE);
            // Under the generation's read lock, as write_at's check is under its write lock.
            if !gen.viewed.load(Ordering::Relaxed) {
                gen.viewed.store(true, Ordering::Relaxed);
            }
            for p in p0..p1 {
                gen.refcnt[p].fetch_add(1, Ordering::Relaxed);
            }
            if let Err(()) = sh.populate(gen, p0, p1) {
                for p in p0..p1 {
                    gen.refcnt[p].fetch_sub(1, Ordering::Relaxed);
                }
                drop(g);
                return sh.copy_view(off, len);
            }
            let zap = gen.populated_count.load(Ordering::Relaxed) * PAGE > sh.opts.zap_after;
            let gen = gen.clone();
            drop(g);
            if zap {
                gen.zap(&sh.c);
            }
            add(&sh.c.zero_copy_views, 1);
            // SAFETY: off < file_len ≤ map_len: inside the mapping.
            let ptr = unsafe { gen.base.add(off as usize) };
            return Ok(View {
                inner: ViewInner::Mapped {
                    gen,
                    ptr,
                    len: (end - off) as usize,
                    p0,
                    p1,
                },
            });
        }
    }

    /// Reads `buf.len()` bytes at `off` into `buf` (fewer at end of file: returns the count;
    /// the rest of `buf` is zeroed). When `buf` and `off` are equally page-aligned, the
    /// whole pages are remapped onto the page cache copy-on-write where the loss model expects
    /// that to pay (and zero copy is allowed); everything else is copied.
    ///
    /// The remapped pages become a private file mapping: keep such buffers for I/O (as one
    /// would for `O_DIRECT`), and do not hand their memory back to an allocator that assumes
    /// `MADV_DONTNEED` zero-fills it.
    pub fn zread_into(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.zread_into_as(off, buf, None)
    }

    /// [`ZFile::zread_into`] without asking the loss model again: for a caller that just asked
    /// [`ZFile::would_remap`] and was told yes (the preload library). Still copies what is
    /// unaligned, past the end of the file, or while zero copy is off.
    pub fn zread_into_remapping(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.zread_into_as(off, buf, Some(Decision::Remap))
    }

    fn zread_into_as(&self, off: u64, buf: &mut [u8], decided: Option<Decision>) -> Result<usize> {
        let sh = &self.sh;
        add(&sh.c.into_calls, 1);
        let len = buf.len();
        let addr = buf.as_mut_ptr() as usize;
        let head = ((PAGE - addr % PAGE) % PAGE).min(len);
        let whole = (len - head) / PAGE;
        if (addr as u64 ^ off) % PAGE as u64 != 0 || whole == 0 {
            return sh.copy_into(off, buf);
        }
        let g = {
            let g = sh.cur.read();
            if g.is_some() {
                g
            } else {
                drop(g);
                if !sh.enable(false) {
                    return sh.copy_into(off, buf);
                }
                sh.cur.read()
            }
        };
        let Some(gen) = g.as_ref() else {
            drop(g);
            return sh.copy_into(off, buf);
        };
        let file_len = gen.file_len;
        if off >= file_len {
            drop(g);
            buf.fill(0);
            return Ok(0);
        }
        let first = off + head as u64;
        // Whole buffer pages that start inside the file (the last may run past its end: the
        // kernel maps the rest of that page as zeros).
        let in_file = if first < file_len {
            ((file_len - first) as usize).div_ceil(PAGE)
        } else {
            0
        };
        let n = whole.min(in_file);
        let fp0 = first / PAGE as u64;
        let bufp = addr + head;
        let decision = if n == 0 {
            Decision::Copy
        } else if let Some(d) = decided {
            d
        } else if sh.opts.model && Model::global().copy_certain(n) {
            // The remap costs more than the copy even without writes: no need to work out
            // P(cow) (per-page counts, the buffer's history) for this request.
            Decision::Copy
        } else if sh.opts.model {
            sh.decide(bufp, fp0, n)
        } else {
            Decision::Remap
        };
        if decision == Decision::Copy {
            drop(g);
            if n == 0 {
                return sh.copy_into(off, buf);
            }
            add(&sh.c.model_copies, 1);
            // One copy in 64 is timed: the model's observed LAT_read (each observation writes a
            // line every thread reads; one in 16 showed in profiles at two threads).
            let timed = COPIES.with(|c| {
                let v = c.get().wrapping_add(1);
                c.set(v);
                v % 64 == 0
            });
            let t = timed.then(Instant::now);
            let r = sh.copy_into_quiet(off, buf);
            if let Some(t) = t {
                let ns = t.elapsed().as_nanos() as f64 * (n * PAGE) as f64 / len as f64;
                Model::global().observe(n, false, false, ns);
            }
            return r;
        }
        let t = Instant::now();
        let mut done = 0;
        while done < n {
            let k = (n - done).min(BATCH_PAGES);
            let at = (bufp + done * PAGE) as *mut u8;
            let foff = first + (done * PAGE) as u64;
            // SAFETY: at..at+k pages are whole pages inside `buf`, which the caller lent us
            // mutably: replacing them with a copy-on-write view of the file changes only bytes
            // of `buf`.
            let mapped = unsafe { sys::map_private_fixed(at, k * PAGE, sh.fd.as_raw_fd(), foff) };
            let ok = mapped.is_ok() && sys::madvise(at, k * PAGE, sys::MADV_POPULATE_READ).is_ok();
            if ok {
                add(&sh.c.into_remapped_pages, k as u64);
                if sh.opts.zero_copy == ZeroCopy::Exclusive {
                    sh.note_buffers(at as usize, foff / PAGE as u64, k);
                }
            } else {
                if mapped.is_err() {
                    // Before Linux 6.12 a failed MAP_FIXED may have unmapped the old pages
                    // already: put memory back under the buffer before copying into it.
                    // SAFETY: the same whole pages of `buf`, ours to replace (see above).
                    unsafe {
                        libc::mmap(
                            at.cast(),
                            k * PAGE,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                            -1,
                            0,
                        )
                    };
                }
                // SAFETY: the same whole pages of `buf` (now file-backed or still the
                // caller's): a copy into them is an ordinary write.
                let s = unsafe { std::slice::from_raw_parts_mut(at, k * PAGE) };
                sys::pread_full(sh.fd.as_raw_fd(), s, foff, 0).map_err(|e| sh.io("pread", e))?;
                add(&sh.c.into_copied_bytes, (k * PAGE) as u64);
            }
            done += k;
        }
        drop(g);
        if sh.opts.model {
            let ns = t.elapsed().as_nanos() as f64;
            Model::global().observe(n, true, decision == Decision::Explore, ns);
        }
        let fd = sh.fd.as_raw_fd();
        if head > 0 {
            sys::pread_full(fd, &mut buf[..head], off, 0).map_err(|e| sh.io("pread", e))?;
        }
        let tail = head + n * PAGE;
        if tail < len {
            sys::pread_full(fd, &mut buf[tail..], off + tail as u64, 0)
                .map_err(|e| sh.io("pread", e))?;
        }
        add(&sh.c.into_copied_bytes, (head + len - tail) as u64);
        Ok(((file_len - off) as usize).min(len))
    }

    /// Unmaps now every page of the view mapping that no live view holds (what happens by
    /// itself once `zap_after` bytes are mapped and unreferenced): the pages stay in the page
    /// cache, and nothing of this process keeps them there any more.
    pub fn zap_now(&self) {
        let g = self.sh.cur.read().clone();
        if let Some(g) = g {
            g.zap(&self.sh.c);
        }
    }

    /// Whether [`ZFile::zread_into`] would remap (some of) a `len`-byte buffer at `buf` for a
    /// read at `off` now — aligned alike, zero copy on, and the loss model for it — rather than
    /// copy. A caller that can copy more cheaply by itself (the preload library, with the
    /// program's own `pread`) asks first and copies when the answer is no.
    pub fn would_remap(&self, off: u64, buf: *const u8, len: usize) -> bool {
        let sh = &self.sh;
        let addr = buf as usize;
        let head = ((PAGE - addr % PAGE) % PAGE).min(len);
        let n = (len - head) / PAGE;
        if (addr as u64 ^ off) % PAGE as u64 != 0 || n == 0 {
            return false;
        }
        let g = sh.cur.read();
        let Some(gen) = g.as_ref() else {
            drop(g);
            // Copy mode: try to retake the lease (rate-limited) for the next read.
            sh.enable(false);
            return false;
        };
        let first = off + head as u64;
        if first >= gen.file_len {
            return false;
        }
        drop(g);
        !sh.opts.model
            || (!Model::global().copy_certain(n)
                && sh.decide(addr + head, first / PAGE as u64, n) != Decision::Copy)
    }

    /// Writes `data` at `off` ([`ZeroCopy::Exclusive`] only: the file's one writer). Live views
    /// of the written pages are made private first and remapped buffers holding them are
    /// copied-on-write in place, so both keep the bytes they had.
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<()> {
        let sh = &self.sh;
        if sh.opts.zero_copy != ZeroCopy::Exclusive {
            return Err(Error::InvalidOption(
                "write_at needs ZeroCopy::Exclusive (the file's writes must go through z-READ)"
                    .into(),
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        let p0 = (off / PAGE as u64) as usize;
        let p1 = ((off + data.len() as u64) as usize).div_ceil(PAGE);
        let mut g = sh.cur.write();
        if let Some(gen) = g.as_ref() {
            let hi = p1.min(gen.refcnt.len());
            if gen.viewed.load(Ordering::Relaxed)
                && (p0..hi).any(|p| gen.refcnt[p].load(Ordering::Acquire) > 0)
            {
                add(&sh.c.privatised_pages, gen.privatise_live());
                *g = None;
            }
        }
        {
            let mut b = sh.buffers.lock();
            let none = b.by_file.is_empty();
            for fp in (p0 as u64..p1 as u64).filter(|_| !none) {
                if let Some(bufs) = b.by_file.remove(&fp) {
                    for a in bufs {
                        b.by_buf.remove(&a);
                        // Stale entries (memory since unmapped or reused) fail harmlessly.
                        let _ = sys::madvise(a as *mut u8, PAGE, sys::MADV_POPULATE_WRITE);
                        add(&sh.c.privatised_buffers, 1);
                    }
                }
            }
        }
        for p in p0..p1 {
            if let Some(c) = sh.writes.get(p) {
                bump_count(c);
            }
        }
        sys::pwrite_full(sh.fd.as_raw_fd(), data, off).map_err(|e| sh.io("pwrite", e))?;
        sh.size.fetch_max(off + data.len() as u64, Ordering::AcqRel);
        add(&sh.c.writes, 1);
        drop(g);
        Ok(())
    }
}

thread_local! {
    /// Copies chosen by the model on this thread (one in 64 is timed).
    static COPIES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Per buffer address: estimated P(cow) and whether its last read remapped it.
    static BUFFERS: RefCell<rustc_hash::FxHashMap<usize, (f32, bool, u32)>> =
        RefCell::new(rustc_hash::FxHashMap::default());
}

/// Adds one to a per-page statistic and returns the new count: a plain load and store, not a
/// locked increment (a count lost to a race skews an estimate by one; the locked instruction
/// cost ~1 % of a 16 KiB read-and-write-back in profiles).
fn bump_count(c: &AtomicU32) -> u32 {
    let v = c.load(Ordering::Relaxed).saturating_add(1);
    c.store(v, Ordering::Relaxed);
    v
}

fn remember(buf: usize, pages: usize, remapped: bool) {
    BUFFERS.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() > 4096 && !b.contains_key(&buf) {
            b.clear();
        }
        let e = b.entry(buf).or_insert((0.0, false, 0));
        e.1 = remapped;
        e.2 = pages as u32;
    });
}

/// Pages of `buf..buf+pages` that are present and no longer file pages: written since they were
/// remapped (each a copy-on-write fault). `None` when `PAGEMAP_SCAN` is unavailable.
fn cowed_pages(buf: usize, pages: usize) -> Option<usize> {
    use tiermem_fault::sys::{PageRegion, PmScanArg, PAGE_IS_FILE, PAGE_IS_PRESENT};
    static PM: OnceLock<Option<tiermem_fault::Pagemap>> = OnceLock::new();
    let pm = PM
        .get_or_init(|| tiermem_fault::Pagemap::open().ok())
        .as_ref()?;
    let mut regions = [PageRegion::default(); 8];
    let mut arg = PmScanArg {
        start: buf as u64,
        end: (buf + pages * PAGE) as u64,
        vec: regions.as_mut_ptr() as u64,
        vec_len: regions.len() as u64,
        category_inverted: PAGE_IS_FILE,
        category_mask: PAGE_IS_FILE | PAGE_IS_PRESENT,
        return_mask: PAGE_IS_PRESENT,
        ..Default::default()
    };
    let n = pm.scan(&mut arg).ok()?;
    Some(
        regions[..n]
            .iter()
            .map(|r| ((r.end - r.start) as usize) / PAGE)
            .sum(),
    )
}

impl Shared {
    fn io(&self, op: &'static str, e: std::io::Error) -> Error {
        Error::Io {
            op,
            path: self.path.clone(),
            source: e,
        }
    }

    /// Makes zero copy possible if it is not: takes the lease and maps a new generation
    /// (lease mode; at most every 10 ms unless `force`), or maps one (exclusive mode).
    fn enable(&self, force: bool) -> bool {
        if self.opts.zero_copy == ZeroCopy::Never {
            *self.off_reason.lock() = Some("zero copy is off (ZeroCopy::Never)".into());
            return false;
        }
        let force = force || self.opts.zero_copy == ZeroCopy::Exclusive;
        let now = self.started.elapsed().as_millis() as u64 + RETRY_LEASE_MS;
        let last = self.last_try_ms.load(Ordering::Relaxed);
        if !force && now < last + RETRY_LEASE_MS {
            return false;
        }
        if self
            .last_try_ms
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
            && !force
        {
            return false;
        }
        let mut g = self.cur.write();
        if g.is_some() {
            return true;
        }
        let fd = self.fd.as_raw_fd();
        if self.opts.zero_copy == ZeroCopy::Lease {
            let me = self.me.get().cloned().expect("set at open");
            let hook: Weak<dyn OnBreak> = me;
            if let Err(e) = lease::take(fd, hook) {
                *self.off_reason.lock() = Some(match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        "no read lease: the file is open for writing (copying until it is not)"
                            .into()
                    }
                    _ => format!("no read lease: {e}"),
                });
                return false;
            }
        }
        let len = match sys::fstat(fd) {
            Ok(st) => st.st_size as u64,
            Err(e) => {
                *self.off_reason.lock() = Some(format!("fstat: {e}"));
                return false;
            }
        };
        self.size.store(len, Ordering::Release);
        match Gen::new(fd, len) {
            Ok(gen) => {
                *g = Some(Arc::new(gen));
                *self.off_reason.lock() = None;
                true
            }
            Err(e) => {
                if self.opts.zero_copy == ZeroCopy::Lease {
                    let _ = sys::release_lease(fd);
                }
                *self.off_reason.lock() = Some(format!("cannot map the file: {e}"));
                false
            }
        }
    }

    /// Exclusive mode, the file grew: live views keep the old generation; the next read maps
    /// a new one.
    fn retire(&self) {
        let mut g = self.cur.write();
        *g = None;
        drop(g);
        self.enable(true);
    }

    /// Maps the generation's pages p0..p1 that are not mapped yet, ≤ 32 per call.
    fn populate(&self, gen: &Gen, p0: usize, p1: usize) -> std::result::Result<(), ()> {
        let mut p = p0;
        while p < p1 {
            if bit(&gen.populated, p) {
                p += 1;
                continue;
            }
            let mut q = p + 1;
            while q < p1 && q - p < BATCH_PAGES && !bit(&gen.populated, q) {
                q += 1;
            }
            // SAFETY: p..q lies inside the mapping.
            let at = unsafe { gen.base.add(p * PAGE) };
            // Pages not in the page cache are read with one request for the run (readahead of
            // exactly it), not one fault at a time.
            let _ = sys::madvise(at, (q - p) * PAGE, libc::MADV_WILLNEED);
            if sys::madvise(at, (q - p) * PAGE, sys::MADV_POPULATE_READ).is_err() {
                return Err(());
            }
            let mut new = 0;
            for i in p..q {
                let old = gen.populated[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
                if old & (1 << (i % 64)) == 0 {
                    new += 1;
                }
            }
            gen.populated_count.fetch_add(new, Ordering::Relaxed);
            add(&self.c.populate_calls, 1);
            add(&self.c.populated_pages, (q - p) as u64);
            p = q;
        }
        Ok(())
    }

    fn copy_view(&self, off: u64, len: usize) -> Result<View> {
        let mut v = vec![0u8; len];
        let n = sys::pread_full(self.fd.as_raw_fd(), &mut v, off, 0)
            .map_err(|e| self.io("pread", e))?;
        v.truncate(n);
        add(&self.c.copied_views, 1);
        Ok(View {
            inner: ViewInner::Owned(v),
        })
    }

    /// Copies, and notes the buffer as copied for the model's history of it.
    fn copy_into(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        let n = self.copy_into_quiet(off, buf)?;
        let addr = buf.as_ptr() as usize;
        let head = (PAGE - addr % PAGE) % PAGE;
        if head < buf.len() {
            remember(addr + head, (buf.len() - head) / PAGE, false);
        }
        Ok(n)
    }

    /// Copies (the model has already noted its decision).
    fn copy_into_quiet(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        let n =
            sys::pread_full(self.fd.as_raw_fd(), buf, off, 0).map_err(|e| self.io("pread", e))?;
        add(&self.c.into_copied_bytes, n as u64);
        Ok(n)
    }

    /// The loss model's verdict for remapping `n` buffer pages at `bufp` onto file pages from
    /// `fp0`, with P(cow) the larger of the data's write share and the buffer's history.
    fn decide(&self, bufp: usize, fp0: u64, n: usize) -> Decision {
        let (mut r, mut w) = (0u64, 0u64);
        for p in fp0..fp0 + n as u64 {
            if let (Some(a), Some(b)) = (self.reads.get(p as usize), self.writes.get(p as usize)) {
                // This read counts too: the paper's per-page read and write counts.
                r += bump_count(a) as u64;
                w += b.load(Ordering::Relaxed) as u64;
            }
        }
        let p_data = if r + w == 0 {
            0.0
        } else {
            w as f64 / (r + w) as f64
        };
        let model = Model::global();
        BUFFERS.with(|b| {
            let mut b = b.borrow_mut();
            if b.len() > 4096 && !b.contains_key(&bufp) {
                b.clear();
            }
            let e = b.entry(bufp).or_insert((0.0, false, 0));
            if e.1 && e.2 > 0 {
                // Last read remapped it: how much of it has been written since?
                if let Some(c) = cowed_pages(bufp, e.2 as usize) {
                    e.0 = 0.5 * e.0 + 0.5 * (c as f32 / e.2 as f32);
                }
            } else {
                // Copied last time: forget slowly, so the remap is tried again.
                e.0 *= 0.8;
            }
            let d = model.decide(n, p_data.max(e.0 as f64));
            e.1 = d != Decision::Copy;
            e.2 = n as u32;
            d
        })
    }

    fn note_buffers(&self, at: usize, fp: u64, k: usize) {
        let mut b = self.buffers.lock();
        for i in 0..k {
            let a = at + i * PAGE;
            let f = fp + i as u64;
            if let Some(old) = b.by_buf.insert(a, f) {
                if let Some(v) = b.by_file.get_mut(&old) {
                    v.retain(|&x| x != a);
                }
            }
            b.by_file.entry(f).or_default().push(a);
        }
    }

    /// Makes every writable private mapping of this file in the process (the buffers
    /// `zread_into` remapped, found in `/proc/self/maps`) anonymous memory with the same bytes,
    /// so that a truncation cannot take them (it discards even copied-on-write pages of a
    /// private file mapping past the new end). Writers to a buffer wait for those microseconds
    /// ([`guard::hold_writes`]).
    fn privatise_buffers(&self) -> u64 {
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return 0;
        };
        let (maj, min) = (libc::major(self.dev), libc::minor(self.dev));
        let mut n = 0;
        for line in maps.lines() {
            let mut it = line.split_ascii_whitespace();
            let (Some(range), Some(perms), Some(_off), Some(dev), Some(ino)) =
                (it.next(), it.next(), it.next(), it.next(), it.next())
            else {
                continue;
            };
            if ino.parse::<u64>().ok() != Some(self.ino) || !perms.starts_with("rw") {
                continue;
            }
            if perms.as_bytes().get(3) != Some(&b'p') {
                continue;
            }
            let mut d = dev.split(':');
            let ok_dev = d.next().and_then(|x| u32::from_str_radix(x, 16).ok()) == Some(maj)
                && d.next().and_then(|x| u32::from_str_radix(x, 16).ok()) == Some(min);
            if !ok_dev {
                continue;
            }
            let mut r = range.split('-');
            let (Some(a), Some(b)) = (
                r.next().and_then(|x| usize::from_str_radix(x, 16).ok()),
                r.next().and_then(|x| usize::from_str_radix(x, 16).ok()),
            ) else {
                continue;
            };
            if make_anonymous(a, b - a) {
                n += 1;
            }
        }
        n
    }
}

/// Replaces the writable mapping `a..a+len` by anonymous memory holding the same bytes.
fn make_anonymous(a: usize, len: usize) -> bool {
    let Some(hold) = guard::hold_writes(a, len) else {
        return false;
    };
    let Ok(tmp) = sys::AnonMap::new(len) else {
        return false;
    };
    // SAFETY: a..a+len is a mapping of this process (read from /proc/self/maps): making it
    // read-only for the copy parks its writers in the SIGSEGV handler (the hold) until the
    // private copy, writable, replaces it; the copy reads every byte while nothing can write.
    unsafe {
        if libc::mprotect(a as *mut libc::c_void, len, libc::PROT_READ) != 0 {
            return false;
        }
        std::ptr::copy_nonoverlapping(a as *const u8, tmp.as_ptr(), len);
        let r = libc::mremap(
            tmp.as_ptr().cast(),
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            a as *mut libc::c_void,
        );
        if r == libc::MAP_FAILED {
            libc::mprotect(
                a as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            );
            return false;
        }
    }
    std::mem::forget(tmp);
    drop(hold);
    true
}

impl OnBreak for Shared {
    fn lease_broken(&self) {
        let mut g = self.cur.write();
        if let Some(gen) = g.take() {
            if self.opts.privatise {
                add(&self.c.privatised_pages, gen.privatise_live());
            }
        }
        if self.opts.privatise {
            add(&self.c.privatised_buffers, self.privatise_buffers());
        }
        *self.off_reason.lock() = Some(
            "the lease was broken by a writer or truncation (copying until it is retaken)".into(),
        );
        let _ = sys::release_lease(self.fd.as_raw_fd());
        self.last_try_ms.store(
            self.started.elapsed().as_millis() as u64 + RETRY_LEASE_MS,
            Ordering::Relaxed,
        );
        add(&self.c.lease_breaks, 1);
        drop(g);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.opts.zero_copy == ZeroCopy::Lease {
            lease::forget(self.fd.as_raw_fd());
        }
    }
}

/// The registry behind the fd-based calls: one [`ZFile`] per caller fd, checked against the
/// fd's current file (device and inode) on every call, so a closed and reused fd number is
/// never read as the old file.
static REGISTRY: OnceLock<RwLock<HashMap<RawFd, Registered>>> = OnceLock::new();

/// A registered fd's device, inode and file.
type Registered = (u64, u64, ZFile);

fn by_fd(fd: RawFd) -> Result<ZFile> {
    let st = sys::fstat(fd).map_err(|e| Error::Io {
        op: "fstat",
        path: PathBuf::from(format!("fd {fd}")),
        source: e,
    })?;
    let reg = REGISTRY.get_or_init(|| RwLock::new(HashMap::new()));
    if let Some((d, i, z)) = reg.read().get(&fd) {
        if *d == st.st_dev && *i == st.st_ino {
            return Ok(z.clone());
        }
    }
    let z = ZFile::from_fd(fd, ZOptions::default())?;
    reg.write().insert(fd, (st.st_dev, st.st_ino, z.clone()));
    Ok(z)
}

/// `zread(fd, off, len)`: [`ZFile::zread`] on the file behind a caller's fd, with default
/// options (lease mode). Costs an `fstat` per call to recognise the fd's file; hold a
/// [`ZFile`] for the fast path.
pub fn zread(fd: RawFd, off: u64, len: usize) -> Result<View> {
    by_fd(fd)?.zread(off, len)
}

/// `zread_into(fd, off, buf)`: [`ZFile::zread_into`] on the file behind a caller's fd.
pub fn zread_into(fd: RawFd, off: u64, buf: &mut [u8]) -> Result<usize> {
    by_fd(fd)?.zread_into(off, buf)
}

/// Forgets the [`ZFile`] of a caller's fd (call before closing it to release the lease at
/// once; otherwise it goes when the fd number is next used for another file).
pub fn zforget(fd: RawFd) {
    if let Some(reg) = REGISTRY.get() {
        reg.write().remove(&fd);
    }
}

/// Pages the SIGBUS guard zero-filled in this process (see [`crate::guard`]).
pub fn guard_hits() -> u64 {
    guard::hits()
}
