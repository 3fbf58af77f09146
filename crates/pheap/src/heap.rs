//! [`Heap`]: aliased views over a memfd, write tracking per user view, checkpoints into a pool.

use crate::alloc::{Alloc, CLASSES, PAGE};
use crate::error::{Error, Result};
use crate::format::{self, encode_meta, Header, HEAP_VERSION, MAX_VIEWS};
use crate::tcache::{self, Shared};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiermem_fault::safepoint;
use tiermem_fault::{PageRange, TrackerOptions, TrackingMethod, WriteTracker};
use tiermem_media::{OpenOptions, Pool, PoolOptions, PowerDomain};

/// Options of [`Heap::create`] (all fields) and [`Heap::open_with`] (`force_mprotect` and
/// `domain` only: the geometry of an existing heap comes from its pool).
#[derive(Debug, Clone)]
pub struct HeapOptions {
    /// Heap capacity in bytes (a multiple of `sb_size`). Fixed for the heap's life. Default 64 MiB.
    pub capacity: usize,
    /// User views per superblock: 1 (PGCK: whole written pages copied), 2 (the paper's FGCK),
    /// 4 or 8 (finer tracking units of `4096 / views` bytes). Default 2.
    pub views: usize,
    /// Superblock size in bytes (a multiple of the page size). Default 64 KiB.
    pub sb_size: usize,
    /// Track writes with mprotect + SIGSEGV instead of userfaultfd WP_ASYNC (for comparison;
    /// kernel writes such as `read(2)` into a protected page then fail with EFAULT).
    pub force_mprotect: bool,
    /// Attach the checkpoint pool to this crash-model domain (tests of crash consistency at
    /// every fence; see `tiermem_media::crash`). Default none.
    pub domain: Option<PowerDomain>,
}

impl Default for HeapOptions {
    fn default() -> Self {
        HeapOptions {
            capacity: 64 << 20,
            views: 2,
            sb_size: 64 << 10,
            force_mprotect: false,
            domain: None,
        }
    }
}

/// What one checkpoint did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CkStats {
    /// Checkpoint number after this checkpoint (complete checkpoints since creation).
    pub epoch: u64,
    /// User-view pages reported written since the previous checkpoint (all views).
    pub pages_written: usize,
    /// Distinct objects (wholly or partly) copied.
    pub objects_copied: usize,
    /// Bytes copied from the working copy into the checkpoint (FGCK: object bytes; PGCK: whole
    /// pages), after merging overlapping ranges.
    pub bytes_copied: usize,
    /// Bytes of metadata journal (or snapshot) written.
    pub meta_bytes: usize,
    /// Wall time of the checkpoint in nanoseconds.
    pub nanos: u64,
    /// Where that time went, in nanoseconds ([`CkStats::PHASES`] names each): collecting the
    /// written pages and the ranges to copy, building and writing the redo log, the metadata
    /// journal and its fence, the commit header, applying the log to the image and the final
    /// header.
    pub phase_ns: [u64; 5],
}

impl CkStats {
    /// Names of the entries of [`CkStats::phase_ns`], in order.
    pub const PHASES: [&'static str; 5] = ["scan", "log", "meta", "commit", "apply"];
}

struct Views {
    memfd: OwnedFd,
    len: usize,
    bases: Vec<usize>,
    /// `log2(len)` when the views are adjacent in order (`bases[i] = bases[0] + i * len`, as
    /// `pick_addresses` places them) and `len` is a power of two (the usual capacities): an
    /// address's view and offset by a shift and a mask, not a search.
    adjacent_shift: Option<u32>,
}

impl Views {
    /// Maps the memfd at each address in `bases` with MAP_FIXED_NOREPLACE (index 0 = library
    /// view). On failure unmaps what it mapped and says which view failed.
    fn map(memfd: OwnedFd, len: usize, bases: &[usize]) -> Result<Views> {
        let mut v = Views {
            memfd,
            len,
            bases: Vec::new(),
            adjacent_shift: None,
        };
        for (i, &b) in bases.iter().enumerate() {
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the kernel
            // validates the fd and range.
            let p = unsafe {
                libc::mmap(
                    b as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                    v.memfd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED || p as usize != b {
                let reason = if p == libc::MAP_FAILED {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::EEXIST) {
                        "the range is already mapped".to_string()
                    } else {
                        e.to_string()
                    }
                } else {
                    // SAFETY: unmapping the mapping we just got at the wrong address.
                    unsafe { libc::munmap(p, len) };
                    "kernel ignored MAP_FIXED_NOREPLACE (Linux < 4.17)".to_string()
                };
                return Err(Error::AddressTaken {
                    view: i,
                    addr: b,
                    len,
                    reason,
                });
            }
            v.bases.push(b);
        }
        let adjacent = bases
            .iter()
            .enumerate()
            .all(|(i, &b)| Some(b) == bases[0].checked_add(i * len));
        v.adjacent_shift = (adjacent && len.is_power_of_two()).then(|| len.trailing_zeros());
        Ok(v)
    }
}

impl Drop for Views {
    fn drop(&mut self) {
        for &b in &self.bases {
            // SAFETY: each base is a live mapping of `len` bytes created by `Views::map`.
            unsafe { libc::munmap(b as *mut libc::c_void, self.len) };
        }
    }
}

struct Inner {
    trackers: Vec<WriteTracker>,
    alloc: Alloc,
    pool: Pool,
    hdr: Header,
    meta_hasher: crc32fast::Hasher,
    scan_buf: Vec<PageRange>,
    last_copied: Vec<usize>,
    totals: CkStats,
    reserved: Reserved,
    /// The redo log's DRAM stage ([`STAGE`] bytes), kept between checkpoints.
    stage: Vec<u8>,
    /// A checkpoint's working vectors, kept between checkpoints.
    bufs: CkBuffers,
    /// A checkpoint failed after it had consumed the write tracking: the next `ckall` copies
    /// every live object.
    resync: bool,
}

/// A checkpoint's table changes, the checksum parts they touch, the objects it copies whole
/// and its encoded metadata: kept between checkpoints for their capacity (a checkpoint of
/// 200 k new objects spent a fifth of its time faulting in new vectors of 11 MB and more).
#[derive(Default)]
struct CkBuffers {
    changes: Vec<crate::alloc::Change>,
    parts: Vec<usize>,
    extra: Vec<(usize, usize, usize)>,
    mbuf: Vec<u8>,
}

/// Bytes of object data a checkpoint gathers in DRAM before writing them to the redo log (and
/// reads back at a time when applying it): small enough to stay in the cache.
const STAGE: usize = 256 << 10;

/// Largest gap between two ranges a checkpoint copies as one (see `checkpoint_locked`). The
/// bytes in a gap are slack or free slots, or a live object whose view page was not written
/// (so its working copy still equals its image): copying them changes nothing recovered.
const MERGE_GAP: usize = 256;

/// Which parts of the pool's data area have their blocks allocated ([`Pool::reserve`]): the
/// pool is created sparse, and a checkpoint reserves what it will write before its commit, so
/// that a full file system fails the checkpoint with an error (the previous one stays) instead
/// of a `SIGBUS` in a store. Creating the pool sparse saves allocating `3 × capacity` up
/// front (~110 ms for a 128 MiB heap on tmpfs here).
#[derive(Default)]
struct Reserved {
    /// Reserved prefix of each metadata area, bytes.
    meta: [usize; 2],
    /// Reserved prefix of the redo log, bytes.
    log: usize,
    /// The image pages reserved.
    image: PageBits,
    /// One bit per image page that may hold committed data: a page a checkpoint wrote (set
    /// before its commit, so a failed one errs on the safe side), and at open every page of
    /// the committed table's objects. A checkpoint writes the pages without the bit straight
    /// into the image, before its commit, without a redo record: the committed checkpoint has
    /// nothing there (a growing heap's new pages skip the log, half its copying).
    committed: PageBits,
}

/// One bit per heap page.
#[derive(Default)]
struct PageBits(Vec<u64>);

impl PageBits {
    fn new(capacity: usize) -> PageBits {
        PageBits(vec![0; (capacity / PAGE).div_ceil(64)])
    }

    fn get(&self, p: usize) -> bool {
        self.0[p / 64] & (1 << (p % 64)) != 0
    }

    /// Sets page `p`'s bit; true when it was clear.
    fn set(&mut self, p: usize) -> bool {
        let (w, b) = (&mut self.0[p / 64], 1u64 << (p % 64));
        let was_clear = *w & b == 0;
        *w |= b;
        was_clear
    }
}

impl Reserved {
    fn new(capacity: usize) -> Reserved {
        Reserved {
            image: PageBits::new(capacity),
            committed: PageBits::new(capacity),
            ..Default::default()
        }
    }

    /// True when image page `p` may hold committed data (see `committed`).
    fn holds_committed(&self, p: usize) -> bool {
        self.committed.get(p)
    }

    /// Marks image pages `[first, end)` as possibly holding committed data.
    fn mark_committed(&mut self, first: usize, end: usize) {
        for p in first..end {
            self.committed.set(p);
        }
    }

    /// Reserves `[0, len)` of the area at `area_off` whose reserved prefix is `*have`.
    fn prefix(pool: &Pool, area_off: usize, have: &mut usize, len: usize) -> Result<()> {
        if len > *have {
            let end = len.div_ceil(PAGE) * PAGE;
            pool.reserve((area_off + *have) as u64, end - *have)?;
            // Mapped now, in one call, rather than by a page fault per page as the checkpoint
            // writes it (sqlite3's checkpoints, growing the image: 28 -> 23 ms).
            pool.populate_range((area_off + *have) as u64, end - *have)?;
            *have = end;
        }
        Ok(())
    }

    /// Reserves the image pages under `ranges` (heap offset, length), one call per run of
    /// pages not yet reserved.
    fn image(&mut self, pool: &Pool, image_off: usize, ranges: &[(usize, usize)]) -> Result<()> {
        let mut run: Option<(usize, usize)> = None;
        let flush = |run: Option<(usize, usize)>| -> Result<()> {
            if let Some((s, n)) = run {
                pool.reserve((image_off + s * PAGE) as u64, n * PAGE)?;
                pool.populate_range((image_off + s * PAGE) as u64, n * PAGE)?; // as in prefix
            }
            Ok(())
        };
        for &(o, l) in ranges {
            if l == 0 {
                continue;
            }
            for p in o / PAGE..=(o + l - 1) / PAGE {
                if !self.image.set(p) {
                    continue;
                }
                run = match run {
                    Some((s, n)) if s + n == p => Some((s, n + 1)),
                    r => {
                        flush(r)?;
                        Some((p, 1))
                    }
                };
            }
        }
        flush(run)
    }
}

/// A persistent heap with object-granular incremental checkpoints (FGCK).
///
/// The working copy lives in a memfd (DRAM) mapped `1 + views` times at fixed addresses: one
/// library view (never tracked, used for copies) and `views` user views. Every pointer handed
/// out is in a user view; the view is chosen by [`Alloc::view_of`](crate::alloc::Alloc::view_of)
/// so that a first write after a checkpoint marks only the view page of that object's part of
/// the page. The checkpoint space is a `media::Pool` (see [`crate::format`]).
///
/// Thread safety: all methods take `&self`. Small objects without a name are allocated, freed
/// and resized through a per-thread cache without the heap's lock (`crate::tcache`); everything
/// else serializes on one lock, and a checkpoint holds cache operations off while it reads the
/// table, so allocator calls may run in any thread at any time. **Contract**: while
/// [`Heap::ckall`] / [`Heap::ckone`] run, no thread may write heap objects (the caller quiesces
/// its writers, as the paper's explicit checkpoint calls assume, or uses
/// [`Heap::checkpoint_stopping_threads`]); writes racing a checkpoint may or may not be in it.
pub struct Heap {
    // Field order matters for Drop: `inner` (holding the trackers) goes before the views, so
    // tracking stops before the views are unmapped.
    inner: Mutex<Inner>,
    /// What the threads' allocation caches share with the heap (`crate::tcache`).
    shared: Arc<Shared>,
    views: Views,
    path: PathBuf,
    nviews: usize,
    /// `log2(PAGE / nviews)`: an in-page offset's part (its view) by a shift.
    part_shift: u32,
    capacity: usize,
}

/// The allocator under the heap's lock ([`Locked`]), as the threads' caches need it.
struct LockedAlloc<'a>(Locked<'a>);

impl std::ops::Deref for LockedAlloc<'_> {
    type Target = Alloc;
    fn deref(&self) -> &Alloc {
        &self.0.alloc
    }
}

impl std::ops::DerefMut for LockedAlloc<'_> {
    fn deref_mut(&mut self) -> &mut Alloc {
        &mut self.0.alloc
    }
}

/// The heap's lock held inside a safepoint section (`tiermem_fault::safepoint`): a thread
/// signalled by [`Heap::checkpoint_stopping_threads`] while it holds (or waits for) the lock
/// parks only after releasing it. Field order: the lock is released before the section ends.
struct Locked<'a> {
    g: parking_lot::MutexGuard<'a, Inner>,
    _s: safepoint::Section,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.g
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.g
    }
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap")
            .field("path", &self.path)
            .field("views", &self.nviews)
            .field("capacity", &self.capacity)
            .field("bases", &self.views.bases)
            .finish()
    }
}

fn memfd(len: usize) -> Result<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"tiermem-pheap".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
        return Err(Error::last_os("ftruncate(memfd)"));
    }
    Ok(fd)
}

/// Finds `n` free, adjacent ranges of `len` bytes for the views of a new heap.
///
/// The span is placed at a random 1 GiB-aligned address in `[16 TiB, 96 TiB)`, below the
/// region where the kernel's top-down mmap allocator puts ordinary mappings (near 128 TiB), so
/// the same addresses are very likely free again when the heap is reopened by another process
/// or after a close in this one. Up to 32 random tries (each an `MAP_FIXED_NOREPLACE`
/// reservation), then a kernel-chosen address.
fn pick_addresses(n: usize, len: usize) -> Result<Vec<usize>> {
    use std::hash::{BuildHasher, Hasher};
    let span = n * len;
    const LO: usize = 16 << 40;
    const HI: usize = 96 << 40;
    const ALIGN: usize = 1 << 30;
    let try_at = |hint: usize, flags: libc::c_int| -> Option<usize> {
        // SAFETY: an anonymous PROT_NONE reservation; MAP_FIXED_NOREPLACE never replaces an
        // existing mapping.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: releasing the reservation made just above.
        unsafe { libc::munmap(p, span) };
        if hint != 0 && p as usize != hint {
            return None;
        }
        Some(p as usize)
    };
    let mut found = None;
    if span < HI - LO {
        for _ in 0..32 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(span);
            let r = h.finish() as usize;
            let hint = LO + (r % ((HI - LO - span) / ALIGN)) * ALIGN;
            if let Some(p) = try_at(hint, libc::MAP_FIXED_NOREPLACE) {
                found = Some(p);
                break;
            }
        }
    }
    let p = match found {
        Some(p) => p,
        None => try_at(0, 0).ok_or_else(|| Error::last_os("mmap(address reservation)"))?,
    };
    Ok((0..n).map(|i| p + i * len).collect())
}

impl Heap {
    /// Creates a new heap whose checkpoint space is a new pool file at `path` (fails with a
    /// media error if it exists), maps the views at fresh addresses and starts tracking.
    /// The pool gets `capacity * 8.5 + ~2 MiB` bytes (see [`format::area_sizes`]), sparse: a
    /// checkpoint reserves what it writes.
    pub fn create(path: impl AsRef<Path>, opts: &HeapOptions) -> Result<Heap> {
        let path = path.as_ref().to_path_buf();
        if ![1, 2, 4, 8].contains(&opts.views) {
            return Err(Error::InvalidArgument(format!(
                "views must be 1, 2, 4 or 8, not {}",
                opts.views
            )));
        }
        if opts.sb_size == 0 || opts.sb_size % PAGE != 0 || opts.sb_size > crate::alloc::MAX_SB_SIZE
        {
            return Err(Error::InvalidArgument(
                "sb_size must be a positive multiple of 4096 of at most 16 MiB".into(),
            ));
        }
        if opts.capacity == 0 || opts.capacity % opts.sb_size != 0 || opts.capacity >= 1 << 40 {
            return Err(Error::InvalidArgument(format!(
                "capacity {} must be a positive multiple of sb_size {} below 1 TiB",
                opts.capacity, opts.sb_size
            )));
        }
        let cap = opts.capacity;
        let fd = memfd(cap)?;
        let bases = pick_addresses(1 + opts.views, cap)?;
        let views = Views::map(fd, cap, &bases)?;
        let (meta_size, log_size) = format::area_sizes(cap);
        let mut view_base = [0u64; MAX_VIEWS];
        for (i, b) in bases[1..].iter().enumerate() {
            view_base[i] = *b as u64;
        }
        let hdr = Header {
            version: HEAP_VERSION,
            views: opts.views as u32,
            capacity: cap as u64,
            sb_size: opts.sb_size as u64,
            lib_base: bases[0] as u64,
            view_base,
            seq: 1,
            meta_size: meta_size as u64,
            log_size: log_size as u64,
            ..Default::default()
        };
        let mut popts =
            PoolOptions::new((tiermem_media::pool::HEADER_SIZE as usize + hdr.data_len()) as u64)
                .tag("pheap")
                .reserve_all(false);
        popts.domain = opts.domain.clone();
        let pool = Pool::create(&path, &popts)?;
        pool.reserve(0, format::META0)?;
        // Both copies, so that a valid heap never has an invalid copy (verify flags one).
        let mut hdr = hdr;
        for _ in 0..2 {
            pool.write_persist((hdr.seq % 2) * PAGE as u64, &hdr.encode())?;
            hdr.seq += 1;
        }
        hdr.seq -= 1;
        let mut alloc = Alloc::new(cap, opts.sb_size);
        alloc.crcs = crate::alloc::PartCrcs::new(cap, format::crc_unit(opts.views));
        let trackers = Self::track(&bases[1..], cap, opts.force_mprotect, &mut alloc)?;
        Ok(Heap {
            shared: Shared::new(&alloc),
            inner: Mutex::new(Inner {
                trackers,
                alloc,
                pool,
                hdr,
                meta_hasher: crc32fast::Hasher::new(),
                scan_buf: Vec::new(),
                last_copied: Vec::new(),
                totals: CkStats::default(),
                reserved: Reserved::new(cap),
                stage: Vec::new(),
                bufs: CkBuffers::default(),
                resync: false,
            }),
            views,
            path,
            nviews: opts.views,
            part_shift: (PAGE / opts.views).trailing_zeros(),
            capacity: cap,
        })
    }

    /// One tracker per user view, lazy (nothing write-protected at the start): a checkpoint
    /// scans each view only below the allocator's extent (`Alloc::extent`: no pointer was ever
    /// handed out beyond it), where every page is write-protected by a scan once it is used,
    /// so the cost of tracking follows the memory used, not the capacity. The pages `alloc`
    /// already uses (a reopened heap's) are protected here: written from now on, not before.
    /// With userfaultfd, `alloc` backs fresh pages ahead of their first write.
    fn track(
        bases: &[usize],
        len: usize,
        force_mprotect: bool,
        alloc: &mut Alloc,
    ) -> Result<Vec<WriteTracker>> {
        let opts = TrackerOptions {
            force_mprotect,
            lazy: true,
        };
        let mut trackers = Vec::with_capacity(bases.len());
        for &b in bases {
            let mut t = WriteTracker::new(b as *mut u8, len, opts)?;
            t.protect(0, alloc.extent())?;
            trackers.push(t);
        }
        if trackers.first().map(WriteTracker::method) == Some(TrackingMethod::UffdWpAsync) {
            alloc.back_fresh_pages(bases);
        }
        Ok(trackers)
    }

    /// Opens an existing heap: validates the pool (media header: magic, version, CRC) and the
    /// heap header (two copies, magic, CRC, version), replays a committed redo log left by a
    /// crash, rebuilds the object table, maps the views at their recorded addresses
    /// ([`Error::AddressTaken`] if any is in use) and restores the working copy from the last
    /// complete checkpoint. Writes are tracked with userfaultfd WP_ASYNC when available.
    pub fn open(path: impl AsRef<Path>) -> Result<Heap> {
        Self::open_with(path, &HeapOptions::default())
    }

    /// [`Heap::open`] honouring [`HeapOptions::force_mprotect`] and [`HeapOptions::domain`]
    /// (the other fields are ignored).
    pub fn open_with(path: impl AsRef<Path>, opts: &HeapOptions) -> Result<Heap> {
        let force_mprotect = opts.force_mprotect;
        let path = path.as_ref().to_path_buf();
        let corrupt = |what: String| Error::Corrupt {
            path: path.clone(),
            what,
        };
        let oo = OpenOptions {
            domain: opts.domain.clone(),
            ..OpenOptions::default()
        };
        let pool = Pool::open(&path, &oo)?;
        if pool.tag() != "pheap" {
            return Err(corrupt(format!(
                "pool tag is {:?}, not \"pheap\": not a persistent heap",
                pool.tag()
            )));
        }
        let mut best: Option<Header> = None;
        let mut why = Vec::new();
        for i in 0..2u64 {
            let mut b = [0u8; 256];
            pool.read(i * PAGE as u64, &mut b)?;
            match Header::decode(&b) {
                Ok(h) if best.map_or(true, |x| h.seq > x.seq) => best = Some(h),
                Ok(_) => {}
                Err(e) => why.push(format!("copy {}: {e}", if i == 0 { 'A' } else { 'B' })),
            }
        }
        let mut hdr =
            best.ok_or_else(|| corrupt(format!("no valid heap header ({})", why.join("; "))))?;
        if hdr.version != HEAP_VERSION {
            return Err(Error::VersionMismatch {
                path,
                found: hdr.version,
                expected: HEAP_VERSION,
            });
        }
        let cap = hdr.capacity as usize;
        // Bound the capacity by the file first: every size derived from it below (area sizes,
        // data_len, the allocator's page table) then cannot overflow or exhaust memory.
        if cap == 0 || cap % PAGE != 0 || cap >= 1 << 40 || cap > pool.data_len() {
            return Err(corrupt(format!(
                "heap capacity {cap} is impossible for a pool of {} data bytes",
                pool.data_len()
            )));
        }
        let (ms, ls) = format::area_sizes(cap);
        if ![1, 2, 4, 8].contains(&hdr.views)
            || hdr.sb_size == 0
            || hdr.sb_size as usize % PAGE != 0
            || cap % hdr.sb_size as usize != 0
            || (hdr.meta_size as usize != ms
                && hdr.meta_size as usize != format::legacy_meta_size(cap))
            || hdr.log_size as usize != ls
            || hdr.data_len() > pool.data_len()
            || hdr.meta_active > 1
            || hdr.meta_len > hdr.meta_size
            || hdr.log_len > hdr.log_size
        {
            return Err(corrupt(format!("inconsistent heap header {hdr:?}")));
        }
        // Redo a committed checkpoint whose log was not applied.
        if hdr.log_len > 0 {
            let mut log = vec![0u8; hdr.log_len as usize];
            pool.read(hdr.log_off() as u64, &mut log)?;
            if crc32fast::hash(&log) != hdr.log_crc {
                return Err(corrupt("committed redo log fails its checksum".into()));
            }
            let mut p = 0;
            while p < log.len() {
                if p + 16 > log.len() {
                    return Err(corrupt("redo log record truncated".into()));
                }
                // p + 16 <= log.len() (checked above): 8-byte slices, the conversions hold.
                let off = u64::from_le_bytes(log[p..p + 8].try_into().unwrap_or([0; 8])) as usize;
                let len =
                    u64::from_le_bytes(log[p + 8..p + 16].try_into().unwrap_or([0; 8])) as usize;
                p += 16;
                if p.saturating_add(len) > log.len() || off.saturating_add(len) > cap {
                    return Err(corrupt(format!(
                        "redo log record {off:#x}+{len} out of range"
                    )));
                }
                pool.write((hdr.image_off() + off) as u64, &log[p..p + len])?;
                p += len;
            }
            pool.fence();
            hdr.log_len = 0;
            hdr.seq += 1;
            pool.write_persist((hdr.seq % 2) * PAGE as u64, &hdr.encode())?;
        }
        let mut journal = vec![0u8; hdr.meta_len as usize];
        pool.read(hdr.meta_off(hdr.meta_active) as u64, &mut journal)?;
        let mut meta_hasher = crc32fast::Hasher::new();
        meta_hasher.update(&journal);
        if meta_hasher.clone().finalize() != hdr.meta_crc {
            return Err(corrupt(
                "committed metadata journal fails its checksum".into(),
            ));
        }
        let mut table = std::collections::BTreeMap::new();
        let mut crcs = std::collections::BTreeMap::new();
        let unit = format::crc_unit(hdr.views as usize);
        format::replay_meta(&journal, &mut table, &mut crcs, unit).map_err(corrupt)?;
        let mut alloc = Alloc::rebuild(cap, hdr.sb_size as usize, table).map_err(corrupt)?;
        alloc.crcs = crate::alloc::PartCrcs::new(cap, unit);
        for (off, e) in crcs {
            if !alloc.crcs.insert(off, e) {
                return Err(corrupt(format!(
                    "image checksum of a part outside the heap: {off:#x}"
                )));
            }
        }
        let nviews = hdr.views as usize;
        let mut bases = vec![hdr.lib_base as usize];
        bases.extend(hdr.view_base[..nviews].iter().map(|&b| b as usize));
        if bases.iter().any(|&b| b == 0 || b % PAGE != 0) {
            return Err(corrupt("view address 0 or unaligned".into()));
        }
        let views = Views::map(memfd(cap)?, cap, &bases)?;
        // Restore the working copy (only pages the object table uses).
        let img = hdr.image_off();
        let alloc_pages: Vec<usize> = alloc.used_pages().collect();
        for &p in &alloc_pages {
            // SAFETY: page p < capacity lies inside the library view mapping (cap bytes).
            let dst =
                unsafe { std::slice::from_raw_parts_mut((bases[0] + p * PAGE) as *mut u8, PAGE) };
            pool.read((img + p * PAGE) as u64, dst)?;
        }
        // Verify the restored objects against the image checksums of the journal.
        let (mut page, mut live) = (Vec::new(), Vec::new());
        for (c, (len, crc)) in alloc.crcs.iter() {
            page.clear();
            alloc.visible(1, 0, c / PAGE, &mut page);
            live.clear();
            clip_into(&page, c, c + unit, &mut live);
            let mut h = crc32fast::Hasher::new();
            for &(o, l, _) in &live {
                // SAFETY: `visible` returns parts of live objects, which `rebuild` checked lie
                // below capacity: [o, o+l) is inside the library view.
                h.update(unsafe { std::slice::from_raw_parts((bases[0] + o) as *const u8, l) });
            }
            let have: usize = live.iter().map(|r| r.1).sum();
            if have != len || h.finalize() != crc {
                let o = live.first().map_or(c, |r| r.2);
                return Err(corrupt(format!(
                    "checkpoint image damaged: the {len} live bytes at {c:#x} (objects from {o:#x}) fail their checksum"
                )));
            }
        }
        let trackers = Self::track(&bases[1..], cap, force_mprotect, &mut alloc)?;
        Ok(Heap {
            shared: Shared::new(&alloc),
            inner: Mutex::new(Inner {
                trackers,
                alloc,
                pool,
                hdr,
                meta_hasher,
                scan_buf: Vec::new(),
                last_copied: Vec::new(),
                totals: CkStats {
                    epoch: hdr.epoch,
                    ..Default::default()
                },
                reserved: {
                    // The pages of the committed table's objects hold committed image data.
                    let mut r = Reserved::new(cap);
                    for p in alloc_pages {
                        r.mark_committed(p, p + 1);
                    }
                    r
                },
                stage: Vec::new(),
                bufs: CkBuffers::default(),
                resync: false,
            }),
            views,
            path,
            nviews,
            part_shift: (PAGE / nviews).trailing_zeros(),
            capacity: cap,
        })
    }

    /// The allocator under the heap's lock (for the threads' caches).
    fn lock_alloc(&self) -> LockedAlloc<'_> {
        LockedAlloc(self.lock())
    }

    /// The heap's lock, taken inside a safepoint section (see [`Locked`]).
    fn lock(&self) -> Locked<'_> {
        let s = safepoint::section();
        Locked {
            g: self.inner.lock(),
            _s: s,
        }
    }

    /// Path of the heap's pool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of user views (1 = PGCK).
    pub fn views(&self) -> usize {
        self.nviews
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How writes are tracked (all user views use the same method).
    pub fn tracking_method(&self) -> TrackingMethod {
        // One tracker per user view, and there is at least one view (1, 2, 4 or 8).
        self.lock().trackers[0].method()
    }

    /// Base addresses: `[library view, user view 0, user view 1, ...]`.
    pub fn view_bases(&self) -> Vec<usize> {
        self.views.bases.clone()
    }

    #[inline]
    fn user_ptr(&self, off: usize, slot: usize) -> *mut u8 {
        // Alloc::view_of with fewer tests (views is 1, 2, 4 or 8): the part of the page.
        let v = if slot <= PAGE {
            (off % PAGE) >> self.part_shift
        } else {
            Alloc::view_of(self.nviews, off, slot)
        };
        debug_assert_eq!(v, Alloc::view_of(self.nviews, off, slot));
        if let Some(sh) = self.views.adjacent_shift {
            return (self.views.bases[0] + ((1 + v) << sh) + off) as *mut u8;
        }
        // view_of returns a view below nviews, and bases holds 1 + nviews entries.
        (self.views.bases[1 + v] + off) as *mut u8
    }

    /// Heap offset of an address in any view (library or user), if it lies in one.
    #[inline]
    fn offset_of(&self, addr: usize) -> Option<usize> {
        if let Some(sh) = self.views.adjacent_shift {
            let rel = addr.checked_sub(self.views.bases[0])?;
            return (rel >> sh < self.views.bases.len()).then_some(rel & ((1 << sh) - 1));
        }
        self.views
            .bases
            .iter()
            .find(|&&b| addr >= b && addr - b < self.capacity)
            .map(|&b| addr - b)
    }

    /// Allocates `size` bytes (0 is treated as 1) and returns a pointer in the user view that
    /// tracks the object's part of its page. `name`, if given, must be unique; the object can
    /// then be found with [`Heap::get`] after a restart. Memory is not zeroed. Errors:
    /// [`Error::NameTaken`], [`Error::OutOfMemory`].
    #[inline]
    pub fn malloc(&self, size: usize, name: Option<&str>) -> Result<*mut u8> {
        // A section: a stop never parks this thread inside a cache operation, which the
        // checkpoint would wait for.
        let s = safepoint::section();
        self.malloc_in(&s, size, name)
    }

    /// [`Heap::malloc`] for a caller already in a safepoint section on this thread (`_s`, not
    /// `Send`, proves it): no second section is entered.
    #[inline]
    pub fn malloc_in(
        &self,
        _s: &safepoint::Section,
        size: usize,
        name: Option<&str>,
    ) -> Result<*mut u8> {
        if name.is_none() {
            if let Some(c) = crate::alloc::class_for(size) {
                let size = size.max(1);
                if let Some(off) = tcache::malloc(&self.shared, c, size, || self.lock_alloc()) {
                    return Ok(self.user_ptr(off, CLASSES[c]));
                }
            }
        }
        let mut g = self.lock();
        let off = g.alloc.alloc(size, name)?;
        if name.is_some() {
            self.shared
                .names
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(self.user_ptr(off, crate::alloc::slot_for(size)))
    }

    /// Frees the object starting at `ptr` (an address in any view: user or library).
    /// [`Error::InvalidPointer`] when no live object starts there (double free included).
    #[inline]
    pub fn free(&self, ptr: *mut u8) -> Result<()> {
        let s = safepoint::section(); // as in malloc
        self.free_in(&s, ptr)
    }

    /// [`Heap::free`] for a caller already in a safepoint section on this thread (`_s`).
    #[inline]
    pub fn free_in(&self, _s: &safepoint::Section, ptr: *mut u8) -> Result<()> {
        let addr = ptr as usize;
        let Some(off) = self.offset_of(addr) else {
            return Err(Error::InvalidPointer(addr));
        };
        // A small slot freed is the first its class hands out next (the thread's cache is a
        // stack): warm its line and TLB entry in the view it will be returned through, so the
        // new owner's first write does not miss (glibc's free touches the chunk header beside
        // the data for the same effect). Issued first, so that it overlaps the slot entry's
        // miss below; harmless when the pointer turns out to be no small object. Measured: the
        // allocation loop's write to a new object 150 -> 60 ns; issued first, 76 -> 68 ns a
        // round.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint; it never faults, whatever the address.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
            _mm_prefetch::<_MM_HINT_ET0>(self.user_ptr(off, CLASSES[0]) as *const i8)
        };
        self.free_in_section(off, addr)
    }

    /// Frees the object at heap offset `off` (`addr` is the address it was given as, for the
    /// error), for a caller already in a safepoint section.
    #[inline]
    fn free_in_section(&self, off: usize, addr: usize) -> Result<()> {
        if tcache::free(&self.shared, off, || self.lock_alloc()).is_none() {
            let mut g = self.lock();
            g.alloc.free(off, addr)?;
            self.shared
                .names
                .store(g.alloc.has_names(), std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Resizes the object at `ptr` (any view; null behaves as `malloc(size, None)`), keeping
    /// its contents up to the smaller size and its name. Grows or shrinks in place when the
    /// slot allows, else moves (the copy goes through the library view and the moved object is
    /// checkpointed in full at the next checkpoint). Returns the user pointer.
    pub fn realloc(&self, ptr: *mut u8, size: usize) -> Result<*mut u8> {
        let s = safepoint::section(); // as in malloc
        self.realloc_in(&s, ptr, size)
    }

    /// [`Heap::realloc`] for a caller already in a safepoint section on this thread (`_s`).
    pub fn realloc_in(&self, s: &safepoint::Section, ptr: *mut u8, size: usize) -> Result<*mut u8> {
        if ptr.is_null() {
            return self.malloc_in(s, size, None);
        }
        let addr = ptr as usize;
        let Some(off) = self.offset_of(addr) else {
            return Err(Error::InvalidPointer(addr));
        };
        let size = size.max(1);
        if let Some((old, c)) = tcache::small_object(&self.shared, off) {
            if size <= CLASSES[c] {
                if tcache::resize(&self.shared, off, c, size).is_some() {
                    return Ok(self.user_ptr(off, CLASSES[c]));
                }
            } else {
                // Through the threads' caches. The bytes are copied between the user views
                // (the new object is copied whole by the next checkpoint anyway): the
                // library view's pages would each fault in once more.
                // Already in a section; the old object's offset is known.
                let new = self.malloc_in(s, size, None)?;
                // SAFETY: `old` live bytes at the old object's user address, `size > old`
                // bytes at the new one; distinct live objects do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(self.user_ptr(off, CLASSES[c]), new, old) };
                self.free_in_section(off, addr)?;
                return Ok(new);
            }
        }
        let mut g = self.lock();
        let Some(obj) = g.alloc.get(off) else {
            return Err(Error::InvalidPointer(addr));
        };
        let fits = size <= obj.slot && (obj.is_large() == (size > crate::alloc::MEDIUM_MAX));
        if fits {
            g.alloc.resize_in_place(off, size);
            return Ok(self.user_ptr(off, obj.slot));
        }
        let new = g.alloc.alloc(size, None)?;
        let lib = self.views.bases[0];
        // SAFETY: both ranges lie in the library view (offsets of live objects with at least
        // min(size, obj.size) bytes) and are distinct objects, so they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (lib + off) as *const u8,
                (lib + new) as *mut u8,
                size.min(obj.size),
            )
        };
        if obj.name.is_some() {
            g.alloc.set_name(off, None);
        }
        g.alloc.free(off, addr)?;
        if obj.name.is_some() {
            g.alloc.set_name(new, obj.name.clone());
        }
        Ok(self.user_ptr(new, crate::alloc::slot_for(size)))
    }

    /// The user pointer of the object named `name`, if any.
    pub fn get(&self, name: &str) -> Option<*mut u8> {
        let g = self.lock();
        let off = *g.alloc.names.get(name)?;
        let (_, slot) = g.alloc.size_slot(off)?; // names only map live objects
        Some(self.user_ptr(off, slot))
    }

    /// Requested size of the object starting at `ptr` (any view), if it is live.
    pub fn size_of(&self, ptr: *const u8) -> Option<usize> {
        let off = self.offset_of(ptr as usize)?;
        self.lock().alloc.size_slot(off).map(|o| o.0)
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        let g = self.lock();
        self.shared.live(&g.alloc)
    }

    /// True when no object is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checkpoints the heap: collects the user-view pages written since the previous
    /// checkpoint (re-protecting them), copies the objects visible through each written view
    /// page (PGCK, `views == 1`: the whole page) and every object created or moved since, plus
    /// the object-table changes, into the redo log; commits with one header write (the atomic
    /// point); applies the log to the checkpoint image; marks the log empty. A crash before the
    /// commit leaves the previous checkpoint; after it, [`Heap::open`] replays the log.
    /// See the type's contract about concurrent writers.
    pub fn ckall(&self) -> Result<CkStats> {
        self.checkpoint(None)
    }

    /// Checkpoints one named object (its current bytes in full) plus the object-table changes,
    /// with the same atomicity as [`Heap::ckall`]. Write tracking is not consumed: the pages
    /// stay recorded as written for the next `ckall`. Other objects created since the last
    /// checkpoint are recorded in the table but keep their previously checkpointed bytes until
    /// the next `ckall`. [`Error::NoSuchName`] if no object has that name.
    pub fn ckone(&self, name: &str) -> Result<CkStats> {
        let off = *self
            .inner
            .lock()
            .alloc
            .names
            .get(name)
            .ok_or_else(|| Error::NoSuchName(name.to_string()))?;
        self.checkpoint(Some(off))
    }

    /// Totals over all checkpoints of this open heap (`epoch` is the last epoch).
    pub fn totals(&self) -> CkStats {
        self.lock().totals
    }

    /// User pointers of the objects copied by the last checkpoint, ascending by heap offset
    /// (for tests and diagnostics).
    pub fn last_copied(&self) -> Vec<*mut u8> {
        let g = self.lock();
        g.last_copied
            .iter()
            .filter_map(|off| g.alloc.size_slot(*off).map(|o| self.user_ptr(*off, o.1)))
            .collect()
    }

    fn checkpoint(&self, only: Option<usize>) -> Result<CkStats> {
        let t0 = std::time::Instant::now();
        let mut g = self.lock();
        // No thread's cache changes a slot entry while the checkpoint reads them.
        let _x = self.shared.exclude();
        self.shared.drain_returned(&mut g.alloc);
        let r = self.checkpoint_locked(&mut g, only, t0);
        // What the failed checkpoint consumed (write tracking, the fresh set) is not lost:
        // the next `ckall` copies every live object.
        if r.is_err() {
            g.resync = true;
        } else if only.is_none() {
            g.resync = false;
        }
        r
    }

    fn checkpoint_locked(
        &self,
        g: &mut Inner,
        only: Option<usize>,
        t0: std::time::Instant,
    ) -> Result<CkStats> {
        let mut pages_written = 0;
        // The ranges to copy, (offset, length, object offset or usize::MAX for a PGCK page),
        // produced in ascending order of offset and merged as they come into disjoint copy
        // ranges, bridging gaps of up to MERGE_GAP bytes (the slack of slots, a free slot): a
        // record per object costs more than copying a few hundred bytes more, and one long
        // copy streams where many short ones each pay a flush. No list of every object's range
        // is built: a dense checkpoint's quarter million ranges made four passes over 6 MB.
        let mut merged: Vec<(usize, usize)> = Vec::new();
        let mut copied = std::mem::take(&mut g.last_copied);
        copied.clear();
        let mut add = |merged: &mut Vec<(usize, usize)>, (o, l, obj): (usize, usize, usize)| {
            if obj != usize::MAX {
                copied.push(obj);
            }
            if l == 0 {
                return;
            }
            match merged.last_mut() {
                Some((mo, ml)) if o <= *mo + *ml + MERGE_GAP => *ml = (*ml).max(o + l - *mo),
                _ => merged.push((o, l)),
            }
        };
        match only {
            Some(off) => {
                let Some((size, _)) = g.alloc.size_slot(off) else {
                    return Err(Error::InvalidPointer(off));
                };
                add(&mut merged, (off, size, off));
                g.alloc.unfresh(off);
            }
            None => {
                // The written pages of every view, in page order (within a page, view v's part
                // precedes view v+1's, so a page's objects come out ascending).
                let mut written: Vec<(usize, usize)> = Vec::new();
                let extent = g.alloc.extent();
                for v in 0..g.trackers.len() {
                    g.trackers[v].scan_upto(&mut g.scan_buf, extent)?;
                    for r in &g.scan_buf {
                        written
                            .extend((r.offset / PAGE..(r.offset + r.len) / PAGE).map(|p| (p, v)));
                    }
                }
                written.sort(); // one ascending run per view: the stable sort merges them
                pages_written = written.len();
                g.alloc.sort_changes();
                // Plus every object created or moved since the last checkpoint (only live
                // objects are fresh: free clears the flag), and after a failed checkpoint every
                // object: sorted, and fed in between the pages.
                let mut extra = std::mem::take(&mut g.bufs.extra);
                extra.clear();
                extra.extend(
                    g.alloc
                        .fresh()
                        .filter_map(|off| g.alloc.size_slot(off).map(|(size, _)| (off, size, off))),
                );
                if g.resync {
                    extra.extend(g.alloc.iter().map(|(off, o)| (off, o.size, off)));
                }
                if !extra.windows(2).all(|w| w[0].0 <= w[1].0) {
                    extra.sort_unstable_by_key(|r| r.0);
                }
                let mut ei = 0;
                let mut page: Vec<(usize, usize, usize)> = Vec::new();
                let mut wi = 0;
                while wi < written.len() {
                    let p = written[wi].0;
                    while ei < extra.len() && extra[ei].0 < p * PAGE {
                        add(&mut merged, extra[ei]);
                        ei += 1;
                    }
                    page.clear();
                    if self.nviews == 1 {
                        page.push((p * PAGE, PAGE, usize::MAX));
                    }
                    while wi < written.len() && written[wi].0 == p {
                        g.alloc.visible(self.nviews, written[wi].1, p, &mut page);
                        wi += 1;
                    }
                    let before = page.len();
                    while ei < extra.len() && extra[ei].0 < (p + 1) * PAGE {
                        page.push(extra[ei]);
                        ei += 1;
                    }
                    if page.len() > before {
                        page.sort_by_key(|r| r.0);
                    }
                    for &r in &page {
                        add(&mut merged, r);
                    }
                }
                for &r in &extra[ei..] {
                    add(&mut merged, r);
                }
                g.bufs.extra = extra;
            }
        }
        let t_scan = std::time::Instant::now();
        // Ascending already (the ranges came in order of offset; a large object's parts and an
        // object both written and fresh repeat next to each other).
        debug_assert!(copied.windows(2).all(|w| w[0] <= w[1]));
        copied.dedup();
        g.last_copied = copied;
        let lib = self.views.bases[0];
        let hdr = g.hdr;
        let pool = &g.pool;
        // 1. Redo log, streamed through a small DRAM stage: the merged ranges are cut into
        // pieces of at most STAGE bytes at page boundaries (a checksummed chunk never crosses
        // a page, so no chunk is cut), a record per piece; pieces are gathered into the stage
        // (kept from one checkpoint to the next, so its pages stay in the cache and are never
        // faulted in again), and each full stage is checksummed and written to the pool in one
        // streaming copy.
        // A piece is also cut where the image pages turn from holding committed data to not
        // (or back): a piece on pages without committed data is written straight into the
        // image before the commit and gets no redo record (`Reserved::committed`).
        let mut pieces: Vec<(usize, usize, bool)> = Vec::with_capacity(merged.len());
        for &(o, l) in &merged {
            let mut at = o;
            while at < o + l {
                let direct = !g.reserved.holds_committed(at / PAGE);
                let mut cut = if o + l - at <= STAGE {
                    o + l
                } else {
                    (at + STAGE) / PAGE * PAGE
                };
                let mut p = at / PAGE + 1;
                while p * PAGE < cut {
                    if g.reserved.holds_committed(p) == direct {
                        cut = p * PAGE;
                        break;
                    }
                    p += 1;
                }
                pieces.push((at, cut - at, direct));
                at = cut;
            }
        }
        let bytes: usize = pieces.iter().map(|&(_, l, _)| l).sum();
        let pos: usize = pieces
            .iter()
            .filter(|p| !p.2)
            .map(|&(_, l, _)| 16 + l)
            .sum();
        if pos > hdr.log_size as usize {
            return Err(Error::Corrupt {
                path: self.path.clone(),
                what: "redo log overflow (internal error: log sized for the worst case)".into(),
            });
        }
        // Space for everything this checkpoint writes, before anything is written.
        Reserved::prefix(pool, hdr.log_off(), &mut g.reserved.log, pos)?;
        g.reserved.image(pool, hdr.image_off(), &merged)?;
        for &(o, l, _) in &pieces {
            g.reserved.mark_committed(o / PAGE, (o + l).div_ceil(PAGE));
        }
        // Page checksums: every page the log writes into and every page whose objects changed
        // gets the CRC-32 of its live bytes as the image will hold them after the apply: the
        // staged bytes where a piece covers them, the image's current bytes elsewhere (this
        // checkpoint does not write those). Computed when the stage holding the page's pieces
        // is flushed: a stage load ends only where a new page starts, so a page's pieces are in
        // one load.
        let mut journal = std::mem::take(&mut g.bufs.changes);
        g.alloc.journal_into(&mut journal);
        // The checksum parts (`format::crc_unit` bytes: what one user view's page tracks), by
        // index, ascending and once each, from two runs merged: the merged ranges' parts
        // (ascending), and the journal's (sorted by offset, so ascending too unless a `Free`
        // of an orphaned offset lies under a large object placed since: then sorted). The
        // work stays proportional to what changed; a sort of every entry cost a checkpoint
        // of 200 k freed objects 4 ms. A `Free` record carries no slot size: every part of its
        // page, and of a medium slot's further pages (`Alloc::freed_end`).
        let unit = g.alloc.crcs.unit();
        let from_ranges = merged
            .iter()
            .flat_map(|&(o, l)| o / unit..(o + l).div_ceil(unit));
        let mut from_journal = std::mem::take(&mut g.bufs.parts);
        from_journal.clear();
        from_journal.extend(journal.iter().flat_map(|c| match c.slot {
            0 => c.off / PAGE * PAGE / unit..g.alloc.freed_end(c.off).div_ceil(unit),
            slot => c.off / unit..(c.off + slot).div_ceil(unit),
        }));
        if !from_journal.windows(2).all(|w| w[0] <= w[1]) {
            from_journal.sort_unstable();
        }
        let mut crc_parts: Vec<usize> = Vec::with_capacity(merged.len() + from_journal.len());
        let (mut a, mut b) = (
            from_ranges.peekable(),
            from_journal.iter().copied().peekable(),
        );
        loop {
            let p = match (a.peek(), b.peek()) {
                (Some(&x), Some(&y)) if x <= y => a.next(),
                (Some(_), Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, _) => b.next(),
            };
            let Some(p) = p else { break };
            if crc_parts.last() != Some(&p) {
                crc_parts.push(p);
            }
        }
        let mut new_crcs: Vec<(usize, usize, Option<u32>)> = Vec::with_capacity(crc_parts.len());
        let mut next_crc = 0usize;
        let mut live: Vec<(usize, usize, usize)> = Vec::new();
        let mut img_buf: Vec<u8> = Vec::new();
        // One part's live bytes in order: (start, end, where they start in the stage, or None:
        // from the image).
        let mut segs: Vec<(usize, usize, Option<usize>)> = Vec::new();
        // The live ranges of the page of the last part checksummed (its other parts need them
        // too).
        let mut page_live: (usize, Vec<(usize, usize, usize)>) = (usize::MAX, Vec::new());
        // Checksums the parts in crc_parts[next_crc..] below heap offset `upto` (exclusive);
        // `load`: the pieces in the stage and where each one's bytes start in it.
        let mut part_crcs = |upto: usize,
                             stage: &[u8],
                             load: &[(usize, usize, usize, bool)],
                             next_crc: &mut usize,
                             new_crcs: &mut Vec<(usize, usize, Option<u32>)>|
         -> Result<()> {
            let mut pj = 0usize;
            while let Some(&u) = crc_parts.get(*next_crc) {
                let start = u * unit;
                if start >= upto {
                    break;
                }
                *next_crc += 1;
                if page_live.0 != start / PAGE {
                    page_live.0 = start / PAGE;
                    page_live.1.clear();
                    g.alloc.visible(1, 0, start / PAGE, &mut page_live.1);
                }
                live.clear();
                clip_into(&page_live.1, start, start + unit, &mut live);
                if live.is_empty() {
                    new_crcs.push((start, 0, None));
                    continue;
                }
                let mut h = crc32fast::Hasher::new();
                let total: usize = live.iter().map(|r| r.1).sum();
                while pj < load.len() && load[pj].0 + load[pj].1 <= start {
                    pj += 1;
                }
                // Adjacent objects (no slack between them) are one run of bytes: one update.
                let mut w = 0;
                for r in 0..live.len() {
                    if w > 0 && live[w - 1].0 + live[w - 1].1 == live[r].0 {
                        live[w - 1].1 += live[r].1;
                    } else {
                        live[w] = live[r];
                        w += 1;
                    }
                }
                live.truncate(w);
                // The part's live bytes in order, each from the stage where a piece covers it,
                // else from the image (this checkpoint does not write there), read once and
                // only from the first to the last byte needed.
                segs.clear();
                for &(lo, ll, _) in &live {
                    let (mut at, end) = (lo, lo + ll);
                    let mut k = pj;
                    while at < end {
                        // The piece covering `at`, or the next one starting after it.
                        while k < load.len() && load[k].0 + load[k].1 <= at {
                            k += 1;
                        }
                        match load.get(k) {
                            Some(&(o, l, sp, _)) if o <= at => {
                                let e = end.min(o + l);
                                segs.push((at, e, Some(sp + (at - o))));
                                at = e;
                            }
                            next => {
                                let e = next.map_or(end, |&(o, _, _, _)| end.min(o));
                                segs.push((at, e, None));
                                at = e;
                            }
                        }
                    }
                }
                let from_image = segs.iter().filter(|g| g.2.is_none());
                let lo = from_image.clone().map(|g| g.0).min();
                let hi = from_image.map(|g| g.1).max();
                if let (Some(lo), Some(hi)) = (lo, hi) {
                    img_buf.resize(hi - lo, 0);
                    pool.read((hdr.image_off() + lo) as u64, &mut img_buf)?;
                }
                let base = lo.unwrap_or(0);
                for &(at, e, sp) in &segs {
                    match sp {
                        Some(sp) => h.update(&stage[sp..sp + (e - at)]),
                        None => h.update(&img_buf[at - base..e - base]),
                    }
                }
                new_crcs.push((start, total, Some(h.finalize())));
            }
            Ok(())
        };
        let mut stage = std::mem::take(&mut g.stage);
        stage.clear();
        stage.reserve(STAGE + 16);
        let mut crc = crc32fast::Hasher::new();
        let mut written = 0usize;
        // The pieces that went to the log: (offset, length, log position of the record),
        // replayed by the apply.
        let mut log_pieces: Vec<(usize, usize, usize)> = Vec::new();
        // The pieces of the stage now: (offset, length, where its bytes start in the stage,
        // straight to the image).
        let mut load: Vec<(usize, usize, usize, bool)> = Vec::new();
        let mut flush = |stage: &mut Vec<u8>,
                         load: &mut Vec<(usize, usize, usize, bool)>,
                         written: &mut usize,
                         crc: &mut crc32fast::Hasher,
                         upto: usize,
                         next_crc: &mut usize,
                         new_crcs: &mut Vec<(usize, usize, Option<u32>)>|
         -> Result<()> {
            part_crcs(upto, stage, load, next_crc, new_crcs)?;
            let mut direct: Vec<(u64, &[u8])> = Vec::new();
            let mut logged: Vec<(u64, &[u8])> = Vec::new();
            for &(o, l, sp, d) in load.iter() {
                if d {
                    direct.push(((hdr.image_off() + o) as u64, &stage[sp..sp + l]));
                } else {
                    let rec = &stage[sp - 16..sp + l];
                    crc.update(rec);
                    logged.push(((hdr.log_off() + *written) as u64, rec));
                    log_pieces.push((o, l, *written));
                    *written += rec.len();
                }
            }
            pool.write_many(&direct)?;
            pool.write_many(&logged)?;
            stage.clear();
            load.clear();
            Ok(())
        };
        for &(o, l, d) in pieces.iter() {
            // A load ends only where a new page starts (see above).
            let new_page = load
                .last()
                .map_or(true, |&(po, pl, _, _)| (po + pl - 1) / PAGE < o / PAGE);
            if new_page && !stage.is_empty() && stage.len() + 16 + l > STAGE + 16 {
                flush(
                    &mut stage,
                    &mut load,
                    &mut written,
                    &mut crc,
                    o / PAGE * PAGE,
                    &mut next_crc,
                    &mut new_crcs,
                )?;
            }
            stage.extend_from_slice(&(o as u64).to_le_bytes());
            stage.extend_from_slice(&(l as u64).to_le_bytes());
            load.push((o, l, stage.len(), d));
            // SAFETY: [lib+o, lib+o+l) lies inside the library view (object ranges and whole
            // pages are below capacity).
            stage.extend_from_slice(unsafe {
                std::slice::from_raw_parts((lib + o) as *const u8, l)
            });
        }
        if !stage.is_empty() {
            flush(
                &mut stage,
                &mut load,
                &mut written,
                &mut crc,
                usize::MAX,
                &mut next_crc,
                &mut new_crcs,
            )?;
        }
        // Pages with no piece at all after the last load (changed objects only).
        part_crcs(usize::MAX, &[], &[], &mut next_crc, &mut new_crcs)?;
        debug_assert_eq!(written, pos);
        let t_log = std::time::Instant::now();
        // 2. Metadata journal (append) or snapshot (switch areas).
        // Sized up front: an Alloc record is at most 28 bytes and its name, a Crc one 17.
        let mut mbuf = std::mem::take(&mut g.bufs.mbuf);
        mbuf.clear();
        mbuf.reserve(journal.len() * 28 + new_crcs.len() * 17);
        for c in &journal {
            match c.slot {
                0 => format::encode_free(c.off, &mut mbuf),
                slot => format::encode_alloc(c.off, c.size, slot, g.alloc.name(c.off), &mut mbuf),
            }
        }
        format::encode_crcs(
            new_crcs
                .iter()
                .filter_map(|&(off, len, sum)| sum.map(|crc| (off, len, crc))),
            unit,
            &mut mbuf,
        );
        let mut nh = hdr;
        let mut hasher;
        if hdr.meta_len as usize + mbuf.len() <= hdr.meta_size as usize {
            let a = hdr.meta_active as usize & 1;
            let need = hdr.meta_len as usize + mbuf.len();
            Reserved::prefix(pool, hdr.meta_off(a as u32), &mut g.reserved.meta[a], need)?;
            pool.write(
                (hdr.meta_off(hdr.meta_active) + hdr.meta_len as usize) as u64,
                &mbuf,
            )?;
            hasher = g.meta_hasher.clone();
            hasher.update(&mbuf);
            nh.meta_len += mbuf.len() as u64;
        } else {
            mbuf.clear();
            let mut table: Vec<(usize, crate::alloc::Obj)> = g.alloc.iter().collect();
            table.sort_unstable_by_key(|(o, _)| *o);
            for (off, obj) in table {
                encode_meta(&crate::alloc::MetaRec::Alloc { off, obj }, &mut mbuf);
            }
            let mut all = g.alloc.crcs.clone();
            for &(off, len, sum) in &new_crcs {
                match sum {
                    Some(crc) => {
                        all.insert(off, (len, crc));
                    }
                    None => all.remove(off),
                };
            }
            format::encode_crcs(
                all.iter().map(|(off, (len, crc))| (off, len, crc)),
                unit,
                &mut mbuf,
            );
            if mbuf.len() > hdr.meta_size as usize {
                return Err(Error::MetadataFull {
                    needed: mbuf.len(),
                    available: hdr.meta_size as usize,
                });
            }
            nh.meta_active = 1 - hdr.meta_active;
            let a = nh.meta_active as usize & 1;
            Reserved::prefix(
                pool,
                hdr.meta_off(a as u32),
                &mut g.reserved.meta[a],
                mbuf.len(),
            )?;
            pool.write(hdr.meta_off(nh.meta_active) as u64, &mbuf)?;
            hasher = crc32fast::Hasher::new();
            hasher.update(&mbuf);
            nh.meta_len = mbuf.len() as u64;
        }
        pool.fence();
        let t_meta = std::time::Instant::now();
        fail_point("before-commit");
        // 3. Commit.
        nh.meta_crc = hasher.clone().finalize();
        nh.log_len = pos as u64;
        nh.log_crc = crc.finalize();
        nh.epoch += 1;
        nh.seq += 1;
        pool.write_persist((nh.seq % 2) * PAGE as u64, &nh.encode())?;
        fail_point("after-commit");
        let t_commit = std::time::Instant::now();
        // 4. Apply to the image, 5. mark the log empty.
        if pos > 0 {
            // From the pool's log (the committed bytes) straight to the image, in one batch
            // (the fail point halfway through the records, as a crash there would find them).
            let half = log_pieces.len() / 2;
            let copies: Vec<(u64, u64, usize)> = log_pieces
                .iter()
                .map(|&(o, l, at)| {
                    (
                        (hdr.log_off() + at + 16) as u64,
                        (hdr.image_off() + o) as u64,
                        l,
                    )
                })
                .collect();
            pool.copy_many(&copies[..half])?;
            fail_point("mid-apply");
            pool.copy_many(&copies[half..])?;
            pool.fence();
        }
        // The other header copy too (also with nothing to apply): after a complete checkpoint
        // both copies describe it, so one damaged copy never falls back to an older one.
        nh.log_len = 0;
        nh.seq += 1;
        pool.write_persist((nh.seq % 2) * PAGE as u64, &nh.encode())?;
        g.hdr = nh;
        for &(off, len, sum) in &new_crcs {
            match sum {
                Some(crc) => {
                    g.alloc.crcs.insert(off, (len, crc));
                }
                None => g.alloc.crcs.remove(off),
            };
        }
        g.meta_hasher = hasher;
        g.alloc.committed(only.is_some());
        stage.clear();
        g.stage = stage;
        let meta_bytes = mbuf.len();
        (g.bufs.changes, g.bufs.parts, g.bufs.mbuf) = (journal, from_journal, mbuf);
        let st = CkStats {
            epoch: nh.epoch,
            pages_written,
            objects_copied: g.last_copied.len(),
            bytes_copied: bytes,
            meta_bytes,
            nanos: t0.elapsed().as_nanos() as u64,
            phase_ns: [
                (t_scan - t0).as_nanos() as u64,
                (t_log - t_scan).as_nanos() as u64,
                (t_meta - t_log).as_nanos() as u64,
                (t_commit - t_meta).as_nanos() as u64,
                t_commit.elapsed().as_nanos() as u64,
            ],
        };
        let t = &mut g.totals;
        t.epoch = st.epoch;
        t.pages_written += st.pages_written;
        t.objects_copied += st.objects_copied;
        t.bytes_copied += st.bytes_copied;
        t.meta_bytes += st.meta_bytes;
        t.nanos += st.nanos;
        for (a, b) in t.phase_ns.iter_mut().zip(st.phase_ns) {
            *a += b;
        }
        Ok(st)
    }

    /// Compares the last checkpoint with the heap: every live object's bytes in the checkpoint
    /// image against its bytes in memory. Right after [`Heap::ckall`], with no writer running
    /// (under [`Heap::checkpoint_stopping_threads`]'s stop), they must be equal. Reads the
    /// whole live heap from the pool: a test and diagnostic, not a per-checkpoint cost to pay
    /// in production. Errors: [`Error::Corrupt`] naming the first differing object and how
    /// many differ; pool read errors.
    pub fn verify_checkpoint(&self) -> Result<()> {
        let g = self.lock();
        let img = g.hdr.image_off();
        let lib = self.views.bases[0];
        let mut buf = Vec::new();
        let mut bad = 0usize;
        let mut first = None;
        for (off, o) in g.alloc.iter() {
            buf.resize(o.size, 0);
            g.pool.read((img + off) as u64, &mut buf)?;
            // SAFETY: a live object's `size` bytes at its offset in the library view.
            let mem = unsafe { std::slice::from_raw_parts((lib + off) as *const u8, o.size) };
            if buf != mem {
                bad += 1;
                first = Some(first.map_or(off, |f: usize| f.min(off)));
            }
        }
        match first {
            None => Ok(()),
            Some(off) => Err(Error::Corrupt {
                path: self.path.clone(),
                what: format!(
                    "{bad} of {} live objects differ from the checkpoint (the lowest at heap \
                     offset {off:#x})",
                    self.shared.live(&g.alloc)
                ),
            }),
        }
    }

    /// [`Heap::ckall`] with every other thread of the process stopped at a safepoint
    /// (`tiermem_fault::safepoint`): each is signalled, parks in the signal handler (a thread
    /// inside a heap call first finishes it), the checkpoint runs, and all resume when it
    /// returns. The checkpoint is therefore a consistent image of the heap at one instant, for
    /// programs whose threads write heap objects at any time. Returns the checkpoint's stats and
    /// the pause (from the first signal until the threads resume). Errors: [`Error::Safepoint`]
    /// when the threads cannot be stopped within `opts.timeout` (nothing was checkpointed and
    /// every thread runs again), or the checkpoint's own errors.
    pub fn checkpoint_stopping_threads(
        &self,
        opts: &safepoint::StopOptions,
    ) -> Result<(CkStats, std::time::Duration)> {
        let t0 = std::time::Instant::now();
        let held = safepoint::stop_others(opts).map_err(|e| Error::Safepoint(e.to_string()))?;
        let r = self.ckall();
        drop(held);
        r.map(|st| (st, t0.elapsed()))
    }

    /// Takes a final checkpoint ([`Heap::ckall`]) and closes the heap (stops tracking, unmaps
    /// the views). Dropping a heap without `close` does not checkpoint.
    pub fn close(self) -> Result<CkStats> {
        self.ckall()
    }
}

/// Appends to `out` the parts of the ranges `(offset, len, object)` of `src` that lie in
/// `[s, e)`, clipped to it (a page's live bytes → one checksum part's).
fn clip_into(
    src: &[(usize, usize, usize)],
    s: usize,
    e: usize,
    out: &mut Vec<(usize, usize, usize)>,
) {
    for &(o, l, x) in src {
        let (a, b) = (o.max(s), (o + l).min(e));
        if a < b {
            out.push((a, b - a, x));
        }
    }
}

/// Test hook: when `TIERMEM_PHEAP_FAIL_AT` names this point, the process aborts here
/// (simulates a crash at a precise step of a checkpoint).
fn fail_point(name: &str) {
    if std::env::var("TIERMEM_PHEAP_FAIL_AT").map_or(false, |v| v == name) {
        std::process::abort();
    }
}
