//! # tiermem-vnvm — vNVML: virtual NVM with redo-logged transactions
//!
//! An implementation of vNVML (thesis 000, chapter 2) over tiermem's media layer. Applications
//! get regions backed by ordinary files; they **read with plain loads** through a read-only
//! DRAM view and **write through transactions** whose redo logs go to an NVM log pool. A redo
//! worker applies committed logs to an NVM write cache; a writeback worker writes dirty cache
//! pages to the files. The NVM pools can be much smaller than the regions.
//!
//! This is phase 1: private mode, one process, many threads. See `docs/vnvm.md` for the design.
//!
//! ```no_run
//! use tiermem_vnvm::{nv_init, Mode, VnvmConfig};
//! let vn = nv_init(&VnvmConfig::default())?;
//! let r = vn.nv_allocate("/tmp/data.bin", 1 << 20, Mode::Private)?;
//! let tid = vn.nv_txbegin();
//! vn.nv_write(tid, r.as_ptr(), b"hello")?;
//! vn.nv_commit(tid)?;
//! // SAFETY: the region is 1 MiB long; reads see committed data.
//! assert_eq!(unsafe { *r.as_ptr() }, b'h');
//! vn.nv_release()?;
//! # Ok::<(), tiermem_vnvm::VnvmError>(())
//! ```
//!
//! ## Contract
//!
//! * **Read committed.** The region's memory shows only committed data: `nv_commit` makes the
//!   transaction durable (log fenced, linked into the persistent committed list) *before* it
//!   copies the data into the DRAM view. Uncommitted and aborted writes are never visible.
//! * **Direct stores fault.** The pointer of a region is a `PROT_READ` mapping: a store through
//!   it raises SIGSEGV. It could never persist.
//! * **Ordering.** Transactions are replayed in commit order; the transaction that writes an
//!   object first must commit first (the thesis' rule). Commits of one instance are serialized
//!   on their log domain.
//! * **Durability.** When `nv_commit` returns the transaction survives a crash (kill -9 or
//!   power failure, as far as the pools' persistence domain goes): [`recover`] (automatic in
//!   [`nv_init`] after an unclean shutdown) writes dirty cache pages back, replays the committed
//!   lists in order and fdatasyncs the files.
//! * **Workers.** The redo worker applies committed logs in batches. While commits keep coming
//!   it polls every [`REDO_POLL`] (1 ms) and takes whatever was committed meanwhile; after
//!   [`REDO_IDLE_AFTER`] (10 ms) without work it sleeps on a futex (thread park) for the
//!   periodic interval (a quarter of the maximum transaction age, 1–200 ms), so an idle
//!   instance uses no CPU. A commit wakes it only when [`REDO_BATCH`] committed transactions
//!   are waiting; a writer short of log space (`nv_wait_log_space`) and `drain` wake it too.
//!   So a commit makes no system call (a futex wake costs 2–10 µs on a VM, the most when the
//!   woken vCPU was idle), and a committed transaction is applied to the NVM cache within a
//!   poll under load, or within the periodic interval after an idle spell — durability does
//!   not wait for that (the log is durable at commit).
//!
//! ## Implementation notes (phase 1)
//!
//! * `nv_write` copies the entry header and data into the transaction's current log page with
//!   ordinary stores (no syscall, no allocation, no global lock: the open list of `tid % 32` and
//!   the page are the transaction's own). `nv_commit` writes the used lines of the
//!   transaction's log pages and its log object back (clwb) and fences once, then links the log
//!   object with one 8-byte store + persist, then copies the entries into the DRAM caches. The
//!   media layer's non-temporal copy uses ordinary stores + a line write-back below 256 bytes
//!   anyway, and batching the write-backs before one fence avoids a stall per entry.
//! * The committed list of a log domain is one persistent 8-byte word (head, tail) plus a `prev`
//!   index in each log object (written before the commit fence). Linking and popping are each
//!   one atomic store of that word: the crash semantics of the thesis' Fig. 2.10 (an object is
//!   in the list exactly after the last update) with one persisted store per operation.
//!   Recovery walks `prev` from the tail to the head.
//! * A cache page object is a packed 8-byte word (file id, page index, dirty), so it never
//!   tears, plus an 8-byte mask of the page's *valid chunks* (page size / 64 bytes each). The
//!   redo worker does not fill a missed page: an entry makes the chunks it touches valid, and a
//!   chunk it covers only in part gets its other bytes from the DRAM cache (which holds exactly
//!   the committed data). The worker takes a *batch* — every committed transaction queued, up
//!   to 64 — and applies its entries in commit order with stores only: whole cache lines with
//!   streaming (non-temporal) stores, partial lines with ordinary stores whose lines are
//!   collected. Then one pass of line write-backs, one fence, the grown masks (stored, then
//!   written back once per run of neighbouring page objects), a fence, the dirty words of newly
//!   dirty pages (likewise), a fence, and only then one store unlinks the whole batch from the
//!   committed list. Nothing between the stores and the fence takes a lock or touches a shared
//!   counter (a locked instruction waits for earlier line write-backs), and no line is written
//!   back twice (a write-back of a line another write-back is still writing stalls).
//!   A crash mid-batch leaves the whole batch in the committed list: replay is idempotent.
//!   The (file, page) → cache-page map is a direct table per file (one load per entry).
//!   Recovery writes back only the valid chunks of dirty pages.
//! * The writeback worker picks dirty pages under the cache lock and pwrites them (contiguous
//!   pages coalesced) **from the DRAM cache**, which holds every byte the NVM page holds plus
//!   possibly newer committed data whose logs are still in the committed list; then fdatasync,
//!   and it clears a page's dirty flag only if the redo worker has not touched the page since
//!   (generation count). It runs as `SCHED_IDLE` (only on a CPU nothing else wants; fallback
//!   nice 19): when the redo worker needs space it waits, and its CPU goes to the writeback.
//!   [`Vnvm::quiesce`] waits until it is idle (benchmarks).
//! * Allocation state that processes will share later (free log pages, log-object slots, tid
//!   counter) lives in one `SharedState`; the committed list is per `CommitDomain`.

#![warn(missing_docs)]

pub mod alloc;
mod chunksum;
mod crc;
mod dram;
mod error;
pub mod inspect;
mod layout;
mod members;
mod recovery;
pub mod scrub;
mod shared;
mod shm;
mod sums;

pub use error::{Result, VnvmError};
pub use inspect::{inspect, InstanceInfo, InstanceState, LiveInfo};
pub use recovery::{recover, RecoveryReport};
pub use scrub::{scrub, ScrubReport};
pub use sums::{sidecar_path as checksum_table_path, SUFFIX as CHECKSUM_TABLE_SUFFIX};

use crate::dram::DramCache;
use crate::error::io_err;
use crate::layout::*;
use crate::recovery::*;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiermem_media::{Pool, PoolKind, PoolOptions, PowerDomain};

/// A transaction id, unique within an instance's life.
pub type Tid = u64;

/// Processes (or `Vnvm` handles) that can use one instance at the same time.
pub const MAX_USERS: usize = shm::MAX_APPS;
/// Shared regions an instance can have allocated at the same time.
pub const MAX_SHARED_REGIONS: usize = shm::MAX_SHARED;

/// Committed transactions the redo worker applies at most per batch (one publish, one pop);
/// a commit that finds this many waiting wakes the worker at once.
pub const REDO_BATCH: usize = 64;

/// How often the redo worker looks for committed work while commits keep coming.
pub const REDO_POLL: Duration = Duration::from_millis(1);

/// Without work for this long, the redo worker goes to its long sleep, from which the next
/// commit wakes it.
pub const REDO_IDLE_AFTER: Duration = Duration::from_millis(10);

/// Number of open lists (the thesis' `tid % 32`).
pub const OPEN_LISTS: usize = 32;

/// How long `nv_commit` waits for a free log object before it gives up with
/// [`VnvmError::NoLogObject`] (the transaction stays open). There are as many log objects as
/// log pages and every committed transaction holds a page, so a healthy instance never waits.
pub const COMMIT_WAIT: Duration = Duration::from_secs(10);

/// How a region is mapped (the thesis' modes, not POSIX's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The region's DRAM cache is private to this process (a memfd filled from the file).
    Private,
    /// The region is shared between processes (thesis §2.4.4): its DRAM cache is the file
    /// mapped `MAP_SHARED`, it has its own committed list, and a transaction that writes it
    /// writes no other region ([`VnvmError::CrossRegion`]).
    Shared,
}

impl Mode {
    fn to_raw(self) -> u32 {
        match self {
            Mode::Private => 1,
            Mode::Shared => 2,
        }
    }
}

/// Configuration of an instance. `Default` gives the documented defaults.
#[derive(Clone, Debug)]
pub struct VnvmConfig {
    /// Directory of the instance's pools. Default `$TIERMEM_DIR/vnvm` (`/dev/shm/tiermem/vnvm`).
    pub dir: PathBuf,
    /// Bytes of NVM log (rounded down to pages; at least 2 pages). Default 64 MiB.
    pub log_size: u64,
    /// Bytes of NVM write cache (rounded down to pages; at least 2 pages). Default 64 MiB.
    pub cache_size: u64,
    /// Log and cache page size: 4096 (default) or 8192.
    pub page_size: u32,
    /// The writeback worker starts above this percentage of dirty cache pages. Default 30.
    pub writeback_start_pct: u32,
    /// The writeback worker stops below this percentage. Default 10.
    pub writeback_stop_pct: u32,
    /// The redo worker aborts open transactions older than this. Default 60 s.
    pub max_tx_age: Duration,
    /// Size of the file-record table (regions an instance can have allocated). Default 256.
    pub max_files: u32,
    /// Attach the pools to this crash-model domain (tests).
    pub domain: Option<PowerDomain>,
    /// Let the owner's group use the instance too: pools, lock file, shared-memory objects and
    /// newly created backing files get mode 0660 and the instance directory 0770 (default:
    /// 0600 / 0700, the owner only; thesis §2.4.7). Users that join a live instance follow its
    /// creator's choice.
    pub group_shared: bool,
    /// Start with the redo worker paused: committed logs stay in the committed list (tests of
    /// recovery). Not part of the stable API.
    #[doc(hidden)]
    pub redo_paused: bool,
    /// Make every writeback to a backing file fail with this errno, as a full or failing
    /// device would (tests of the cache-full path). Not part of the stable API.
    #[doc(hidden)]
    pub writeback_fault: Option<i32>,
}

impl Default for VnvmConfig {
    fn default() -> Self {
        VnvmConfig {
            dir: tiermem_media::default_dir().join("vnvm"),
            log_size: 64 << 20,
            cache_size: 64 << 20,
            page_size: 4096,
            writeback_start_pct: 30,
            writeback_stop_pct: 10,
            max_tx_age: Duration::from_secs(60),
            max_files: 256,
            domain: None,
            group_shared: false,
            redo_paused: false,
            writeback_fault: None,
        }
    }
}

impl VnvmConfig {
    /// Defaults overridden by the environment: `TIERMEM_VNVM_DIR`, `TIERMEM_VNVM_LOG_SIZE`,
    /// `TIERMEM_VNVM_CACHE_SIZE` (e.g. `256MiB`), `TIERMEM_VNVM_PAGE_SIZE` (4096 | 8192),
    /// `TIERMEM_VNVM_WB_START`, `TIERMEM_VNVM_WB_STOP` (percent), `TIERMEM_VNVM_MAX_TX_AGE_MS`,
    /// `TIERMEM_VNVM_GROUP` (1: group sharing).
    /// An unparsable value is a [`VnvmError::Config`] naming the variable.
    pub fn from_env() -> Result<VnvmConfig> {
        let mut c = VnvmConfig::default();
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let bad = |k: &str, v: &str| VnvmError::Config(format!("{k}={v:?} is not valid"));
        if let Some(v) = get("TIERMEM_VNVM_DIR") {
            c.dir = PathBuf::from(v);
        }
        for (k, slot) in [
            ("TIERMEM_VNVM_LOG_SIZE", &mut c.log_size),
            ("TIERMEM_VNVM_CACHE_SIZE", &mut c.cache_size),
        ] {
            if let Some(v) = get(k) {
                *slot = tiermem_media::parse_size(&v).map_err(|_| bad(k, &v))?;
            }
        }
        for (k, slot) in [
            ("TIERMEM_VNVM_PAGE_SIZE", &mut c.page_size),
            ("TIERMEM_VNVM_WB_START", &mut c.writeback_start_pct),
            ("TIERMEM_VNVM_WB_STOP", &mut c.writeback_stop_pct),
        ] {
            if let Some(v) = get(k) {
                *slot = v.parse().map_err(|_| bad(k, &v))?;
            }
        }
        if let Some(v) = get("TIERMEM_VNVM_GROUP") {
            c.group_shared = match v.as_str() {
                "1" | "yes" | "true" => true,
                "0" | "no" | "false" => false,
                _ => return Err(bad("TIERMEM_VNVM_GROUP", &v)),
            };
        }
        if let Some(v) = get("TIERMEM_VNVM_MAX_TX_AGE_MS") {
            c.max_tx_age = Duration::from_millis(
                v.parse()
                    .map_err(|_| bad("TIERMEM_VNVM_MAX_TX_AGE_MS", &v))?,
            );
        }
        Ok(c)
    }

    fn geometry(&self) -> Result<Geometry> {
        if self.page_size != 4096 && self.page_size != 8192 {
            return Err(VnvmError::Config(format!(
                "page size {} (must be 4096 or 8192)",
                self.page_size
            )));
        }
        let ps = self.page_size as u64;
        let log_pages = self.log_size / ps;
        let cache_pages = self.cache_size / ps;
        if log_pages < 2 || cache_pages < 2 {
            return Err(VnvmError::Config(format!(
                "log ({} B) and cache ({} B) need at least two {ps}-byte pages each",
                self.log_size, self.cache_size
            )));
        }
        if log_pages > u32::MAX as u64 / 2 || cache_pages > u32::MAX as u64 / 2 {
            return Err(VnvmError::Config("log or cache too large".into()));
        }
        if self.writeback_stop_pct > self.writeback_start_pct || self.writeback_start_pct > 100 {
            return Err(VnvmError::Config(format!(
                "writeback thresholds start {} % / stop {} % (need stop ≤ start ≤ 100)",
                self.writeback_start_pct, self.writeback_stop_pct
            )));
        }
        if self.max_files == 0 || self.max_files > 0xfffe {
            return Err(VnvmError::Config(format!(
                "max_files {} (must be 1..=65534)",
                self.max_files
            )));
        }
        Ok(Geometry {
            page_size: self.page_size,
            log_pages: log_pages as u32,
            cache_pages: cache_pages as u32,
            max_files: self.max_files,
            max_domains: MAX_DOMAINS,
            log_objs: log_pages as u32,
        })
    }
}

// ---- volatile state ----------------------------------------------------------------------

/// A backing file's region.
struct RegionInner {
    file_id: u32,
    /// Shared mode: the region's slot in the shared-memory object.
    shared: Option<shared::SharedRef>,
    path: PathBuf,
    size: u64,
    file: File,
    /// Private regions: the checksum table of the backing file's pages (`sums`).
    sums: Option<sums::SumTable>,
    /// A writeback of this region failed after its table write: the table's last CRC of a unit
    /// may not be what the file holds, so later writebacks read the file for `prev`.
    sums_unsure: AtomicBool,
    dram: DramCache,
    /// Open transactions that wrote into this region.
    open_writers: AtomicU32,
    closing: AtomicBool,
}

impl RegionInner {
    fn base(&self) -> usize {
        self.dram.rview as usize
    }
}

/// A region returned by [`Vnvm::nv_allocate`]. Cloning shares the region. The mapping stays
/// valid while any handle lives, even after `nv_free` or `nv_release` (it then no longer
/// changes).
#[derive(Clone)]
pub struct Region(Arc<RegionInner>);

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.0.path)
            .field("size", &self.0.size)
            .field("file_id", &self.0.file_id)
            .finish()
    }
}

impl Region {
    /// Start of the region: a **read-only** view of its DRAM cache holding committed data.
    /// Plain loads read committed data; a store through it raises SIGSEGV.
    pub fn as_ptr(&self) -> *const u8 {
        self.0.dram.rview
    }
    /// Length of the region in bytes (the size given to `nv_allocate`).
    pub fn len(&self) -> usize {
        self.0.size as usize
    }
    /// True when the region is empty (never: sizes are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }
    /// The backing file.
    pub fn path(&self) -> &Path {
        &self.0.path
    }
    /// The file-record id of the region within its instance.
    pub fn file_id(&self) -> u32 {
        self.0.file_id
    }
    /// Copy `buf.len()` committed bytes at region offset `off` into `buf`. Panics when the range
    /// is outside the region.
    pub fn read(&self, off: usize, buf: &mut [u8]) {
        assert!(
            off.checked_add(buf.len()).is_some_and(|e| e <= self.len()),
            "read {off}+{} outside the {}-byte region",
            buf.len(),
            self.len()
        );
        // SAFETY: in bounds of the read-only mapping, which lives as long as self. Concurrent
        // commits may change the bytes while they are copied (a racy read of plain memory).
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(off), buf.as_mut_ptr(), buf.len())
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Committed,
    Aborted { by_age: bool },
}

struct Tx {
    start_ns: u64,
    /// Log pages, in order.
    pages: Vec<u32>,
    /// Bytes used in the last page.
    used: u32,
    /// Regions written (pins them).
    regions: Vec<Arc<RegionInner>>,
    aborted_by_age: bool,
}

#[derive(Default)]
struct OpenList {
    txs: HashMap<Tid, Tx>,
    recent: VecDeque<(Tid, Outcome)>,
}

const RECENT: usize = 128;

impl OpenList {
    fn finish(&mut self, tid: Tid, o: Outcome) {
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((tid, o));
    }
}

struct Committed {
    idx: u32,
    pages: Vec<u32>,
}

/// [`COMMIT_WAIT`] (unit tests may shorten it).
fn commit_wait() -> Duration {
    #[cfg(test)]
    {
        let ms = tests::COMMIT_WAIT_MS.load(Ordering::Relaxed);
        if ms > 0 {
            return Duration::from_millis(ms);
        }
    }
    COMMIT_WAIT
}

/// Why a commit into a shared region failed.
enum CommitFail {
    /// Before the link: the transaction's pages and log object are still the committer's.
    NotLinked(VnvmError),
    /// The link's persist failed after its store: the transaction is in the list (and
    /// applied), as if committed.
    Linked(VnvmError),
}

/// A log domain: one persistent committed list (private regions of a process; later one per
/// shared region).
struct CommitDomain {
    id: u32,
    head: u32,
    tail: u32,
    queue: VecDeque<Committed>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PState {
    Free,
    Clean,
    Dirty,
    /// Touched by the transaction the redo worker is applying; not yet marked dirty.
    Pinned,
    /// Being written back.
    Writing,
}

const NIL: u32 = u32::MAX;

#[derive(Default, Clone, Copy)]
struct Lru {
    head: u32,
    tail: u32,
    len: u32,
}

/// Hasher for (file id, page index) keys: one multiply-xorshift per word (the keys are not
/// attacker-controlled across a trust boundary; SipHash costs more than the rest of a lookup).
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let z = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z ^ (z >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(23) ^ v).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    }
}

type KeyMap = HashMap<(u32, u64), u32, std::hash::BuildHasherDefault<KeyHasher>>;

/// Page indices below this are mapped through a direct per-file table (4 bytes per page of the
/// region: 0.1 % of it); higher ones (regions above 16 GiB) through a hash map.
const DIRECT_PAGES: u64 = 1 << 22;

/// (file id, page index) → cache page. A direct table per file: a lookup is one load from an
/// array indexed by the page, which stays in the CPU cache for neighbouring pages (a hash
/// table probe was a cache miss per entry, the largest cost of applying a small write).
#[derive(Default)]
struct PageMap {
    direct: Vec<Vec<u32>>,
    far: KeyMap,
}

impl PageMap {
    fn get(&self, k: &(u32, u64)) -> Option<&u32> {
        if k.1 < DIRECT_PAGES {
            self.direct
                .get(k.0 as usize)
                .and_then(|t| t.get(k.1 as usize))
                .filter(|&&p| p != NIL)
        } else {
            self.far.get(k)
        }
    }
    fn insert(&mut self, k: (u32, u64), p: u32) {
        if k.1 < DIRECT_PAGES {
            let (f, i) = (k.0 as usize, k.1 as usize);
            if self.direct.len() <= f {
                self.direct.resize_with(f + 1, Vec::new);
            }
            let t = &mut self.direct[f];
            if t.len() <= i {
                t.resize((i + 1).max(t.len() * 2).min(DIRECT_PAGES as usize), NIL);
            }
            t[i] = p;
        } else {
            self.far.insert(k, p);
        }
    }
    fn remove(&mut self, k: &(u32, u64)) {
        if k.1 < DIRECT_PAGES {
            if let Some(slot) = self
                .direct
                .get_mut(k.0 as usize)
                .and_then(|t| t.get_mut(k.1 as usize))
            {
                *slot = NIL;
            }
        } else {
            self.far.remove(k);
        }
    }
    /// Drop file `f`'s direct table (its pages have been removed).
    fn forget_file(&mut self, f: u32) {
        if let Some(t) = self.direct.get_mut(f as usize) {
            *t = Vec::new();
        }
    }
    /// The cache pages mapped for file `f`.
    fn pages_of(&self, f: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .direct
            .get(f as usize)
            .map(|t| t.iter().copied().filter(|&p| p != NIL).collect())
            .unwrap_or_default();
        v.extend(self.far.iter().filter(|(k, _)| k.0 == f).map(|(_, &p)| p));
        v
    }
}

struct CacheState {
    map: PageMap,
    key: Vec<Option<(u32, u64)>>,
    state: Vec<PState>,
    gen: Vec<u64>,
    /// Valid chunks of each mapped page (bit i: bytes [i·chunk, (i+1)·chunk)).
    mask: Vec<u64>,
    /// The [`chunksum::chunk_sum`] of every valid chunk of every page (64 per page, page `p`'s
    /// at `64·p..`), set by the redo worker from the bytes it stores: a page's contents
    /// checksum ([`recovery::cache_page_sum`]) is the XOR of its valid chunks' entries, so
    /// neither a write nor a publish reads a cache page back (they are cold in the CPU cache:
    /// the stores are non-temporal). 4 bytes per 64-byte chunk: 1/16 of the cache's size, in
    /// DRAM.
    sums: Vec<u32>,
    /// Chunks of each page written since the last publish (a page joins the batch's records
    /// with its first write).
    open: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    dirty: Lru,
    clean: Lru,
    free: Vec<u32>,
    /// Dirty + Writing pages (their words say dirty).
    ndirty: u32,
    /// Redo is waiting for a page: write back regardless of thresholds.
    need_space: bool,
    /// The writeback worker is waiting for work (below the start threshold, no space request).
    wb_idle: bool,
}

impl CacheState {
    fn new(n: u32) -> Self {
        CacheState {
            map: PageMap::default(),
            key: vec![None; n as usize],
            state: vec![PState::Free; n as usize],
            gen: vec![0; n as usize],
            mask: vec![0; n as usize],
            sums: huge_table(n as usize * 64),
            open: vec![0; n as usize],
            prev: vec![NIL; n as usize],
            next: vec![NIL; n as usize],
            dirty: Lru {
                head: NIL,
                tail: NIL,
                len: 0,
            },
            clean: Lru {
                head: NIL,
                tail: NIL,
                len: 0,
            },
            // A reserve refilled from the shared free list (`Inner::refill_cache`).
            free: Vec::new(),
            ndirty: 0,
            need_space: false,
            wb_idle: false,
        }
    }
    fn list(&mut self, s: PState) -> &mut Lru {
        match s {
            PState::Dirty => &mut self.dirty,
            PState::Clean => &mut self.clean,
            // cannot fail: pages are unlinked only from, and pushed only onto, the dirty or the
            // clean list, in the state of that list (every caller checks or sets it).
            _ => unreachable!("not a list state"),
        }
    }
    fn unlink(&mut self, p: u32) {
        let s = self.state[p as usize];
        let (pr, nx) = (self.prev[p as usize], self.next[p as usize]);
        if pr != NIL {
            self.next[pr as usize] = nx;
        }
        if nx != NIL {
            self.prev[nx as usize] = pr;
        }
        let l = self.list(s);
        if l.head == p {
            l.head = nx;
        }
        if l.tail == p {
            l.tail = pr;
        }
        l.len -= 1;
        self.prev[p as usize] = NIL;
        self.next[p as usize] = NIL;
    }
    /// Insert at the head (most recently used) of list `s`.
    fn push_head(&mut self, p: u32, s: PState) {
        self.state[p as usize] = s;
        let old = self.list(s).head;
        self.next[p as usize] = old;
        self.prev[p as usize] = NIL;
        if old != NIL {
            self.prev[old as usize] = p;
        }
        let l = self.list(s);
        l.head = p;
        if l.tail == NIL {
            l.tail = p;
        }
        l.len += 1;
    }
    /// A page for a miss: a free page, else the clean LRU tail (unmapped).
    fn take(&mut self) -> Option<u32> {
        if let Some(p) = self.free.pop() {
            self.forget_contents(p);
            return Some(p);
        }
        let p = self.clean.tail;
        if p == NIL {
            return None;
        }
        self.unlink(p);
        if let Some(k) = self.key[p as usize].take() {
            self.map.remove(&k);
        }
        self.state[p as usize] = PState::Free;
        self.forget_contents(p);
        Some(p)
    }
    /// A page taken for new contents: no valid chunk (so no chunk sum counts) and nothing open.
    fn forget_contents(&mut self, p: u32) {
        self.mask[p as usize] = 0;
        self.open[p as usize] = 0;
    }
}

/// A zeroed table of `n` u32s whose memory the kernel may back with transparent huge pages
/// (MADV_HUGEPAGE): the redo worker touches one entry row per page it writes, scattered over
/// the whole table, and with 4 KiB pages each row was a TLB miss of its own.
fn huge_table(n: usize) -> Vec<u32> {
    let v = vec![0u32; n];
    let (start, len) = (v.as_ptr() as usize, n * 4);
    let first = start.next_multiple_of(2 << 20);
    if first < start + len {
        // SAFETY: advising (not changing) the table's own mapping, which `v` owns; a hint
        // only, and failure (no THP support) is harmless.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                (start + len - first) / (2 << 20) * (2 << 20),
                libc::MADV_HUGEPAGE,
            )
        };
    }
    v
}

/// Hint that the cache line holding `p` will be read or written soon. A hint only: any address
/// is allowed (a prefetch never faults).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch instructions do not access memory architecturally and never fault.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
}

/// Add the `len` bytes at `off` to `runs`, extending the last run when they lie in it or
/// start at most 8 bytes after it (neighbouring page records).
fn add_run(runs: &mut Vec<(u64, u64)>, off: u64, len: u64) {
    match runs.last_mut() {
        Some((s, e)) if off >= *s && off <= *e + 8 => *e = (*e).max(off + len),
        _ => runs.push((off, off + len)),
    }
}

/// Copy `len` bytes (a multiple of 64) to the 64-byte aligned `dst` with non-temporal stores
/// (no fence: a later `sfence` orders them).
///
/// # Safety
/// `src` valid for reads and `dst` (64-byte aligned) valid for writes of `len` bytes, not
/// overlapping.
#[inline]
unsafe fn stream_lines(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(dst as usize % 64 == 0 && len % 64 == 0);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let mut i = 0;
        while i < len {
            // SAFETY: i + 16 <= len; SSE2 is part of x86_64; dst + i is 16-byte aligned.
            unsafe {
                let v = _mm_loadu_si128(src.add(i) as *const __m128i);
                _mm_stream_si128(dst.add(i) as *mut __m128i, v);
            }
            i += 16;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded caller contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}

struct Inner {
    dir: PathBuf,
    cfg: VnvmConfig,
    geo: Geometry,
    meta: Pool,
    log: Pool,
    cache: Pool,
    /// The instance's shared-memory object (free stacks, users, tids, shared regions).
    shm: shm::Shm,
    /// This process's user slot; its app id is `slot + 1`.
    slot: usize,
    /// The instance `lock` file; holds this user's liveness lock (OFD lock on byte 1 + slot).
    lockf: File,
    /// Mode of the files and objects this user creates (0600, or 0660 with group sharing).
    perm: u32,
    /// Shared regions want a flush (set by commits past the threshold and log waiters).
    flush_req: AtomicBool,
    open: Vec<Mutex<OpenList>>,
    domains: Vec<Mutex<CommitDomain>>,
    /// Signalled when a committed transaction has been applied (drain waiters).
    applied_cv: Condvar,
    /// Regions by file id.
    regions: RwLock<Vec<Option<Arc<RegionInner>>>>,
    cstate: Mutex<CacheState>,
    /// Signalled when pages become clean (redo waiting for space).
    space_cv: Condvar,
    /// Wakes the writeback worker.
    wb_cv: Condvar,
    /// Signalled when the writeback worker goes idle (quiesce waiters).
    wb_idle_cv: Condvar,
    redo_thread: std::sync::OnceLock<std::thread::Thread>,
    stop_redo: AtomicBool,
    stop_wb: AtomicBool,
    kill: AtomicBool,
    worker_error: Mutex<Option<String>>,
    /// The last writeback failed with an I/O error (a full or failing device): its text
    /// (operation, file, OS error). The writeback worker retries every [`WB_RETRY`] and clears
    /// it once a writeback succeeds; `wb_failing` mirrors `is_some()` for cheap checks.
    wb_error: Mutex<Option<String>>,
    wb_failing: AtomicBool,
}

/// How often a failing writeback is retried (a full device may get space back).
const WB_RETRY: Duration = Duration::from_secs(1);

/// Counters of this process's use of an instance, and the instance's occupancy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VnvmStats {
    /// This process's application id (user slot + 1).
    pub app_id: u32,
    /// Processes using the instance now.
    pub users: u32,
    /// Committed transactions with at least one write.
    pub commits: u64,
    /// Committed transactions applied to the NVM cache by the redo worker (private regions)
    /// or dropped from a shared region's committed list by a flush this process ran.
    pub applied: u64,
    /// Shared-region flushes this process ran.
    pub flushes: u64,
    /// Log pages this process holds (open and unapplied committed transactions).
    pub log_pages_held: u32,
    /// Cache pages this process holds (equal share: cache pages / users).
    pub cache_pages_held: u32,
    /// Cache pages written back to files.
    pub pages_written_back: u64,
    /// Transactions aborted for their age.
    pub age_aborts: u64,
    /// Free log pages.
    pub free_log_pages: usize,
    /// Dirty cache pages.
    pub dirty_pages: u32,
    /// Clean cache pages.
    pub clean_pages: u32,
    /// Total log pages.
    pub log_pages: u32,
    /// Total cache pages.
    pub cache_pages: u32,
}

/// A vnvm instance (the thesis' process-wide library state). `Send + Sync`: call it from any
/// number of threads. Dropping it without [`Vnvm::nv_release`] releases it too (errors are
/// then ignored).
pub struct Vnvm {
    inner: Arc<Inner>,
    redo: Option<JoinHandle<()>>,
    wb: Option<JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for Vnvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vnvm")
            .field("dir", &self.inner.dir)
            .field("geometry", &self.inner.geo)
            .finish()
    }
}

fn create_pools(
    dir: &Path,
    geo: &Geometry,
    domain: Option<&PowerDomain>,
    group: bool,
) -> Result<Pools> {
    for n in [META, LOG, CACHE, "meta.pool.tmp"] {
        let p = dir.join(n);
        if p.exists() {
            Pool::remove(&p)
                .or_else(|_| std::fs::remove_file(&p).map_err(|e| io_err("remove", &p, e)))?;
        }
    }
    let opts = |size: u64, tag: &str| {
        let mut o = PoolOptions::new(size + 4096)
            .kind(PoolKind::Nvm)
            .tag(tag)
            .group_shared(group);
        if let Some(d) = domain {
            o = o.domain(d);
        }
        o
    };
    let log = Pool::create(dir.join(LOG), &opts(geo.log_len(), "vnvm-log"))?;
    let cache = Pool::create(dir.join(CACHE), &opts(geo.cache_len(), "vnvm-cache"))?;
    let tmp = dir.join("meta.pool.tmp");
    {
        let meta = Pool::create(&tmp, &opts(geo.meta_len(), "vnvm-meta"))?;
        meta.write(0, &geo.encode())?;
        zero_persist(&meta, SB_SIZE as u64, geo.meta_len() - SB_SIZE as u64)?;
        store_word_persist(&meta, STATE_OFF, STATE_CLEAN)?;
    }
    std::fs::rename(&tmp, dir.join(META)).map_err(|e| io_err("rename", &tmp, e))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    let mut oo = tiermem_media::OpenOptions::default();
    if let Some(d) = domain {
        oo = oo.domain(d);
    }
    let meta = Pool::open(dir.join(META), &oo)?;
    Ok(Pools {
        dir: dir.to_path_buf(),
        meta,
        log,
        cache,
        geo: *geo,
    })
}

/// File mode for an instance's files: 0600, or 0660 with group sharing.
fn perm_of(group: bool) -> u32 {
    if group {
        0o660
    } else {
        0o600
    }
}

/// pwrite `len` bytes at `ptr` to `file` at `off`, retrying short writes and EINTR.
///
/// # Safety
/// `ptr..ptr + len` must be mapped and readable for the duration of the call.
unsafe fn pwrite_all(file: &File, ptr: *const u8, len: usize, off: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < len {
        // SAFETY: the caller guarantees the source range is mapped.
        let n = unsafe {
            libc::pwrite(
                file.as_raw_fd(),
                ptr.add(done) as *const libc::c_void,
                len - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}

/// Pre-fault a pool's data area (`MADV_POPULATE_WRITE`, Linux ≥ 5.14; a hint: failure is
/// ignored).
fn populate(pool: &Pool) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: the data area is a live, writable mapping of data_len bytes starting at a page
    // boundary (after the 4 KiB pool header); populating does not change its contents.
    unsafe {
        libc::madvise(
            pool.data_ptr() as *mut libc::c_void,
            pool.data_len(),
            MADV_POPULATE_WRITE,
        )
    };
}

/// Start using an instance (the thesis' `nv_init`) and start this process's redo and writeback
/// workers. The first user creates the pools (or opens them, recovering automatically if the
/// last run did not shut down cleanly) and the shared-memory object; later users — other
/// processes, or other `Vnvm`s of this one — join them, taking the live instance's geometry
/// (their `cfg` sizes are then ignored) and reclaiming what dead users left.
///
/// Errors: [`VnvmError::Config`] for a bad configuration; [`VnvmError::Busy`] when all
/// [`MAX_USERS`] user slots are taken; every error of [`recover`] (a damaged instance is
/// reported and left untouched); media errors.
pub fn nv_init(cfg: &VnvmConfig) -> Result<Vnvm> {
    let dir = cfg.dir.clone();
    cfg.geometry()?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(if cfg.group_shared { 0o770 } else { 0o700 })
            .create(&dir)
            .map_err(|e| io_err("create directory", &dir, e))?;
        if cfg.group_shared {
            use std::os::unix::fs::PermissionsExt;
            // 0770 regardless of the umask (only the owner can; others keep what they find).
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770));
        }
    }
    let lockf = open_lock_file(&dir, perm_of(cfg.group_shared))?;
    flock_exclusive(&lockf, true);
    let r = join(cfg, &dir, lockf);
    if let Ok(vn) = &r {
        flock_release(&vn.inner.lockf);
    }
    r
}

/// The part of [`nv_init`] that runs under the instance flock (released by the caller on
/// success; on failure the lock file is closed, which releases it).
fn join(cfg: &VnvmConfig, dir: &Path, lockf: File) -> Result<Vnvm> {
    let existing = if dir.join(META).exists() {
        Some(open_pools(dir, None)?.geo)
    } else {
        None
    };
    // Live users? Then join them (their geometry wins over `cfg`'s sizes).
    let live_geo = existing.filter(|g| live_users(dir, g, &lockf) > 0);
    let live = live_geo.is_some();
    let (pools, shm) = if let Some(geo) = live_geo {
        let shm = shm::Shm::open(dir, &geo)?.ok_or_else(|| VnvmError::Busy(dir.to_path_buf()))?;
        (open_pools(dir, cfg.domain.as_ref())?, shm)
    } else {
        // First user: recover what the last run left, then start from empty structures.
        let geo = cfg.geometry()?;
        let pools = if existing.is_some() {
            let clean = {
                let p = open_pools(dir, None)?;
                read_clean(&p)?
            };
            if !clean {
                recover_locked(dir)?;
            }
            if open_pools(dir, None)?.geo == geo {
                let p = open_pools(dir, cfg.domain.as_ref())?;
                reset(&p)?;
                p
            } else {
                create_pools(dir, &geo, cfg.domain.as_ref(), cfg.group_shared)?
            }
        } else {
            create_pools(dir, &geo, cfg.domain.as_ref(), cfg.group_shared)?
        };
        for s in 0..shm::MAX_SHARED {
            // Stale bitmaps of a previous run's shared regions.
            shm::Bitmaps::unlink_name(dir, s);
        }
        let shm = shm::Shm::create(dir, &geo, perm_of(cfg.group_shared))?;
        store_word_persist(&pools.meta, STATE_OFF, STATE_RUNNING)?;
        (pools, shm)
    };
    let geo = pools.geo;
    // The instance's creator decided who may use it: follow the mode of its pools.
    let perm = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(pools.meta.path())
            .map(|m| m.permissions().mode() & 0o660)
            .unwrap_or(0o600)
    };
    let slot = (0..shm::MAX_APPS)
        .find(|&s| {
            shm.app(s).state.load(Ordering::Acquire) == shm::SLOT_FREE
                && shm::lock_slot(&lockf, s)
                && shm.join(s)
        })
        .ok_or_else(|| VnvmError::Busy(dir.to_path_buf()))?;
    // Map the log and cache pages now, so that no page fault lands on a commit or a redo.
    populate(&pools.log);
    populate(&pools.cache);
    let Pools {
        meta, log, cache, ..
    } = pools;
    let inner = Arc::new(Inner {
        dir: dir.to_path_buf(),
        cfg: cfg.clone(),
        geo,
        meta,
        log,
        cache,
        shm,
        slot,
        lockf,
        perm,
        flush_req: AtomicBool::new(false),
        open: (0..OPEN_LISTS)
            .map(|_| Mutex::new(OpenList::default()))
            .collect(),
        domains: vec![Mutex::new(CommitDomain {
            id: slot as u32,
            head: 0,
            tail: 0,
            queue: VecDeque::new(),
        })],
        applied_cv: Condvar::new(),
        regions: RwLock::new(vec![None; geo.max_files as usize]),
        cstate: Mutex::new(CacheState::new(geo.cache_pages)),
        space_cv: Condvar::new(),
        wb_cv: Condvar::new(),
        wb_idle_cv: Condvar::new(),
        redo_thread: std::sync::OnceLock::new(),
        stop_redo: AtomicBool::new(false),
        stop_wb: AtomicBool::new(false),
        kill: AtomicBool::new(false),
        worker_error: Mutex::new(None),
        wb_error: Mutex::new(None),
        wb_failing: AtomicBool::new(false),
    });
    // Whatever dead users left is reclaimed before we start (we hold the flock).
    if live {
        if let Err(e) = inner.reap_dead_locked() {
            inner.shm.leave(slot);
            return Err(e);
        }
    }
    let i2 = inner.clone();
    let redo = std::thread::Builder::new()
        .name("vnvm-redo".into())
        .spawn(move || i2.run_worker("redo", |i| i.redo_loop()))
        .map_err(|e| io_err("spawn redo worker", dir, e))?;
    let _ = inner.redo_thread.set(redo.thread().clone());
    let i3 = inner.clone();
    let wb = std::thread::Builder::new()
        .name("vnvm-writeback".into())
        .spawn(move || i3.run_worker("writeback", |i| i.wb_loop()))
        .map_err(|e| io_err("spawn writeback worker", dir, e))?;
    Ok(Vnvm {
        inner,
        redo: Some(redo),
        wb: Some(wb),
        released: false,
    })
}

impl Vnvm {
    /// Why writing dirty cache pages back to their backing files fails, while it does (e.g.
    /// `write back cache pages /d/heap.data: No space left on device (os error 28)`); `None`
    /// when the last writeback succeeded. While it fails, committed data stay in the NVM log
    /// and cache (durable, recovered after a crash), the cache and then the log fill up, and
    /// [`Vnvm::drain`], [`Vnvm::quiesce`] and [`Vnvm::nv_release`] fail instead of waiting; the
    /// writeback worker retries every second and clears this when a writeback succeeds.
    pub fn writeback_error(&self) -> Option<String> {
        if !self.inner.wb_failing.load(Ordering::Relaxed) {
            return None;
        }
        self.inner.wb_error.lock().clone()
    }

    /// The instance directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The path of the instance's shared-memory object (`/dev/shm/tiermem-vnvm-…`).
    pub fn shm_path(&self) -> PathBuf {
        let n = shm::shm_name(&self.inner.dir);
        Path::new("/dev/shm").join(n.to_str().unwrap_or("?").trim_start_matches('/'))
    }

    /// The configuration the instance was started with.
    pub fn config(&self) -> &VnvmConfig {
        &self.inner.cfg
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> VnvmStats {
        let i = &self.inner;
        let c = i.cstate.lock();
        let me = i.me();
        VnvmStats {
            app_id: i.slot as u32 + 1,
            users: i.shm.users(),
            commits: me.commits.load(Ordering::Relaxed),
            applied: me.applied.load(Ordering::Relaxed),
            flushes: me.flushes.load(Ordering::Relaxed),
            log_pages_held: me.log_held.load(Ordering::Relaxed),
            cache_pages_held: me.cache_held.load(Ordering::Relaxed),
            pages_written_back: me.pages_written_back.load(Ordering::Relaxed),
            age_aborts: me.age_aborts.load(Ordering::Relaxed),
            free_log_pages: i.shm.free_count(shm::Res::Log) as usize,
            dirty_pages: c.ndirty,
            clean_pages: c.clean.len,
            log_pages: i.geo.log_pages,
            cache_pages: i.geo.cache_pages,
        }
    }

    /// Map the file at `path` as a region of `size` bytes (the thesis' `nv_allocate`). The file
    /// is created (mode 0600) if missing and extended to `size` if shorter; a persistent file
    /// record is written before the region is returned. The region's pointer is a read-only
    /// view of its DRAM cache: for [`Mode::Private`] a cache of this process filled from the
    /// file; for [`Mode::Shared`] the file itself mapped `MAP_SHARED`, so every process that
    /// allocates the same path in shared mode (same size) sees the same committed data.
    ///
    /// Errors: [`VnvmError::Config`] for size 0; [`VnvmError::Allocate`] when the path is
    /// already allocated (by this process, privately by another, or shared with another size),
    /// too long, or the record table or the shared slots are full; I/O errors on the file.
    pub fn nv_allocate(&self, path: impl AsRef<Path>, size: usize, mode: Mode) -> Result<Region> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let i = &self.inner;
        if size == 0 {
            return Err(VnvmError::Config("region size 0".into()));
        }
        let path = std::path::absolute(path.as_ref())
            .map_err(|e| io_err("resolve path", path.as_ref(), e))?;
        // Stored relative to the instance directory when inside it (a movable instance).
        let pstr = record_path(&i.dir, &path)
            .to_str()
            .ok_or_else(|| VnvmError::Allocate {
                path: path.clone(),
                reason: "path is not UTF-8".into(),
            })?
            .to_string();
        if pstr.len() > FILE_PATH_MAX {
            return Err(VnvmError::Allocate {
                path,
                reason: format!("path longer than {FILE_PATH_MAX} bytes"),
            });
        }
        if (size as u64).div_ceil(i.geo.page_size as u64) > MAX_FILE_PAGE {
            return Err(VnvmError::Allocate {
                path,
                reason: "region too large".into(),
            });
        }
        let mut regions = i.regions.write();
        if regions.iter().flatten().any(|r| r.path == path) {
            return Err(VnvmError::Allocate {
                path,
                reason: "already allocated by this process".into(),
            });
        }
        let ps = i.geo.page_size as usize;
        let map_len = size.div_ceil(ps) * ps;
        let region_pages = map_len as u64 / ps as u64;
        // The file-record table and the shared-region slots are shared by every user.
        let (id, join, sslot) = {
            let _g = i.shm.lock();
            let records = load_records(&i.meta, &i.geo)?;
            let found = records.values().find(|r| r.path == pstr);
            match (found, mode) {
                (Some(r), Mode::Shared) if r.mode == Mode::Shared.to_raw() => {
                    if r.size != size as u64 {
                        return Err(VnvmError::Allocate {
                            path,
                            reason: format!(
                                "shared by other processes with size {} (asked {size})",
                                r.size
                            ),
                        });
                    }
                    let s = (0..shm::MAX_SHARED)
                        .find(|&s| i.shm.shared(s).file.load(Ordering::Acquire) == r.id + 1)
                        .ok_or_else(|| VnvmError::Allocate {
                            path: path.clone(),
                            reason: "shared record without a shared slot".into(),
                        })?;
                    i.shm
                        .shared(s)
                        .users
                        .fetch_or(1 << i.slot, Ordering::AcqRel);
                    (r.id, true, Some(s))
                }
                (Some(r), _) => {
                    return Err(VnvmError::Allocate {
                        path,
                        reason: if r.mode == Mode::Shared.to_raw() {
                            "already allocated in this instance in shared mode".into()
                        } else {
                            format!("already allocated in this instance by app {}", r.owner)
                        },
                    })
                }
                (None, _) => {
                    let id = (0..i.geo.max_files)
                        .find(|id| !records.contains_key(id) && regions[*id as usize].is_none())
                        .ok_or_else(|| VnvmError::Allocate {
                            path: path.clone(),
                            reason: format!("file-record table full ({} regions)", i.geo.max_files),
                        })?;
                    let sslot = if mode == Mode::Shared {
                        let s = (0..shm::MAX_SHARED)
                            .find(|&s| i.shm.shared(s).file.load(Ordering::Acquire) == 0)
                            .ok_or_else(|| VnvmError::Allocate {
                                path: path.clone(),
                                reason: format!(
                                    "shared-region slots full ({} regions)",
                                    shm::MAX_SHARED
                                ),
                            })?;
                        let sl = i.shm.shared(s);
                        sl.users.store(1 << i.slot, Ordering::Relaxed);
                        sl.pending_pages.store(0, Ordering::Relaxed);
                        sl.flushing.store(0, Ordering::Relaxed);
                        sl.pages.store(region_pages, Ordering::Relaxed);
                        sl.file.store(id + 1, Ordering::Release);
                        Some(s)
                    } else {
                        None
                    };
                    // File record: body first, then the magic (one 8-byte store), each
                    // persisted.
                    let rec = FileRecord {
                        id,
                        mode: mode.to_raw(),
                        size: size as u64,
                        path: pstr.clone(),
                        owner: if mode == Mode::Shared {
                            0
                        } else {
                            i.slot as u32 + 1
                        },
                        domain: match sslot {
                            Some(s) => shared::shared_domain(s),
                            None => i.slot as u32,
                        },
                    }
                    .encode();
                    let off = i.geo.file_off(id);
                    i.meta.write(off + 8, &rec[8..])?;
                    i.meta.persist(off + 8, rec.len() - 8)?;
                    store_word_persist(&i.meta, off, FILE_MAGIC)?;
                    (id, false, sslot)
                }
            }
        };
        type Opened = (
            File,
            Option<sums::SumTable>,
            DramCache,
            Option<shared::SharedRef>,
        );
        let opened = (|| -> Result<Opened> {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(i.perm)
                .open(&path)
                .map_err(|e| io_err("open backing file", &path, e))?;
            let len = file
                .metadata()
                .map_err(|e| io_err("fstat", &path, e))?
                .len();
            // Private regions: every page vnvm wrote back is checked against its checksum
            // before it is served (the whole file, eagerly: reads through the mapped view
            // cannot fail later). Shared regions keep no table (msync writes them): a stale
            // one would condemn good pages later, so it goes.
            let sums = if sslot.is_none() {
                let mut t = sums::SumTable::open(&path, true, true, i.perm)?;
                if let Some(t) = &mut t {
                    sums::verify_file(&path, &file, t, u64::MAX)?;
                    // Consistent with the file now: the writebacks' protocol from here on.
                    t.upgrade()?;
                }
                t
            } else {
                if !join {
                    let sp = sums::sidecar_path(&path);
                    if sp.exists() {
                        std::fs::remove_file(&sp)
                            .map_err(|e| io_err("remove checksum table", &sp, e))?;
                    }
                }
                None
            };
            if len < size as u64 {
                // SAFETY: fd is open; the range is checked by the kernel.
                let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
                if rc != 0 {
                    file.set_len(size as u64)
                        .map_err(|e| io_err("extend backing file", &path, e))?;
                }
                file.sync_all().map_err(|e| io_err("fsync", &path, e))?;
            }
            match sslot {
                None => {
                    let dram = DramCache::new(&path, &file, map_len, size)?;
                    Ok((file, sums, dram, None))
                }
                Some(s) => {
                    let dram = DramCache::new_shared(&path, &file, map_len)?;
                    let bm = shm::Bitmaps::open(&i.dir, s, region_pages, !join, i.perm)?;
                    Ok((file, sums, dram, Some(shared::SharedRef::new(s, bm))))
                }
            }
        })();
        let (file, sums, dram, shared) = match opened {
            Ok(x) => x,
            Err(e) => {
                // Undo what the record table says.
                let _g = i.shm.lock();
                match sslot {
                    Some(s) if join => {
                        i.shm
                            .shared(s)
                            .users
                            .fetch_and(!(1 << i.slot), Ordering::AcqRel);
                    }
                    Some(s) => {
                        i.shm.shared(s).users.store(0, Ordering::Relaxed);
                        i.shm.shared(s).file.store(0, Ordering::Release);
                        let _ = store_word_persist(&i.meta, i.geo.file_off(id), 0);
                    }
                    None => {
                        let _ = store_word_persist(&i.meta, i.geo.file_off(id), 0);
                    }
                }
                return Err(e);
            }
        };
        let r = Arc::new(RegionInner {
            file_id: id,
            shared,
            path,
            size: size as u64,
            file,
            sums,
            sums_unsure: AtomicBool::new(false),
            dram,
            open_writers: AtomicU32::new(0),
            closing: AtomicBool::new(false),
        });
        regions[id as usize] = Some(r.clone());
        Ok(Region(r))
    }

    /// Unmap a region (the thesis' `nv_free`): wait until every committed transaction is
    /// applied, write the region's dirty cache pages back, fdatasync the file, drop its cache
    /// pages and delete its file record. The region's handles stay readable but no longer
    /// change.
    ///
    /// Errors: [`VnvmError::RegionBusy`] when an open transaction wrote into it (commit or abort
    /// it first); [`VnvmError::RegionFreed`] if already freed; I/O errors of the writeback.
    pub fn nv_free(&self, region: Region) -> Result<()> {
        let i = &self.inner;
        let r = region.0;
        {
            let regions = i.regions.read();
            match &regions[r.file_id as usize] {
                Some(x) if Arc::ptr_eq(x, &r) => {}
                _ => return Err(VnvmError::RegionFreed(r.path.clone())),
            }
        }
        r.closing.store(true, Ordering::SeqCst);
        if r.open_writers.load(Ordering::SeqCst) > 0 {
            r.closing.store(false, Ordering::SeqCst);
            return Err(VnvmError::RegionBusy(r.path.clone()));
        }
        if r.shared.is_some() {
            i.leave_shared(&r)?;
            i.regions.write()[r.file_id as usize] = None;
            return Ok(());
        }
        i.drain()?;
        i.writeback(WbTarget::File(r.file_id))?;
        {
            let mut c = i.cstate.lock();
            let pages = c.map.pages_of(r.file_id);
            for p in pages {
                let s = c.state[p as usize];
                debug_assert!(
                    s == PState::Clean,
                    "page of a drained, written-back file is {s:?}"
                );
                if s == PState::Clean {
                    c.unlink(p);
                }
                if let Some(k) = c.key[p as usize].take() {
                    c.map.remove(&k);
                }
                c.state[p as usize] = PState::Free;
                clear_cache_rec(&i.meta, &i.geo, p);
                i.meta
                    .flush(i.geo.cache_word_off(p), CACHE_OBJ_SIZE as usize)?;
                c.free.push(p);
            }
            c.map.forget_file(r.file_id);
            i.meta.fence();
        }
        store_word_persist(&i.meta, i.geo.file_off(r.file_id), 0)?;
        i.regions.write()[r.file_id as usize] = None;
        Ok(())
    }

    /// Begin a transaction (the thesis' `nv_txbegin`): returns a new unique id.
    pub fn nv_txbegin(&self) -> Tid {
        let i = &self.inner;
        let tid = i.shm.next_tid().fetch_add(1, Ordering::Relaxed);
        let tx = Tx {
            start_ns: tiermem_media::now_ns(),
            pages: Vec::new(),
            used: 0,
            regions: Vec::new(),
            aborted_by_age: false,
        };
        i.open[tid as usize % OPEN_LISTS].lock().txs.insert(tid, tx);
        tid
    }

    /// Log `src` as a write of transaction `tid` to the region bytes starting at `dst` (the
    /// thesis' `nv_write`). The data go to the NVM log with non-temporal stores; nothing is
    /// visible in the region until `nv_commit`. Returns the bytes logged: all of `src`, or fewer
    /// when the log ran out of pages (call [`Vnvm::nv_wait_log_space`] and write the rest, or
    /// abort).
    ///
    /// Errors: [`VnvmError::OutOfRegion`] unless `dst..dst + src.len()` lies inside one region
    /// of this instance; [`VnvmError::UnknownTx`], [`VnvmError::TxCommitted`],
    /// [`VnvmError::TxAborted`], [`VnvmError::TxNotOpen`] for a tid that is not open;
    /// [`VnvmError::LogFull`] when not a single byte could be logged;
    /// [`VnvmError::RegionFreed`] when the region is being freed.
    pub fn nv_write(&self, tid: Tid, dst: *const u8, src: &[u8]) -> Result<usize> {
        self.inner.write(tid, dst as usize, src)
    }

    /// Wait up to `timeout` until this process may take at least one log page (one is free
    /// and its equal share is not used up); true if it may. Waiting asks every user's
    /// workers to flush shared regions, whose logs are freed only by a flush.
    pub fn nv_wait_log_space(&self, timeout: Duration) -> bool {
        let i = &self.inner;
        let deadline = Instant::now() + timeout;
        loop {
            let seen = i.shm.log_seq();
            if i.log_page_available() {
                return true;
            }
            if i.worker_error.lock().is_some() || i.wb_failing.load(Ordering::SeqCst) {
                return false;
            }
            i.flush_req.store(true, Ordering::SeqCst);
            if let Some(t) = i.redo_thread.get() {
                t.unpark();
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            i.shm
                .wait_log(seen, (deadline - now).min(Duration::from_millis(50)));
        }
    }

    /// Commit transaction `tid` (the thesis' `nv_commit`): fence its log, link it at the tail
    /// of the persistent committed list (durable on return), then apply it to the regions'
    /// DRAM caches, and wake the redo worker.
    ///
    /// Errors: the tid errors of [`Vnvm::nv_write`]; [`VnvmError::NoLogObject`] when no log
    /// object came free within [`COMMIT_WAIT`] (the transaction stays open: retry or abort);
    /// [`VnvmError::Damaged`] when its log pages no longer hold what it wrote (it is aborted);
    /// media errors (persist failures: before the link the transaction is aborted, after it
    /// the transaction is committed and applied).
    pub fn nv_commit(&self, tid: Tid) -> Result<()> {
        self.inner.commit(tid)
    }

    /// Abort transaction `tid` (the thesis' `nv_abort`): its logs are discarded and its log
    /// pages freed; none of its writes ever becomes visible.
    ///
    /// Errors: the tid errors of [`Vnvm::nv_write`] (aborting a transaction the redo worker
    /// aborted for its age reports [`VnvmError::TxAborted`] with `by_age`).
    pub fn nv_abort(&self, tid: Tid) -> Result<()> {
        let i = &self.inner;
        let mut ol = i.open[tid as usize % OPEN_LISTS].lock();
        let tx = i.take_tx(&mut ol, tid)?;
        ol.finish(tid, Outcome::Aborted { by_age: false });
        drop(ol);
        i.discard(tx);
        Ok(())
    }

    /// Wait until the redo worker has applied every transaction committed so far.
    pub fn drain(&self) -> Result<()> {
        self.inner.drain()
    }

    /// Wait until the instance's background work is done: [`Vnvm::drain`], then until the
    /// writeback worker is idle (the dirty ratio is at or below its start threshold and no
    /// page is being written back). For benchmarks, so that one measurement's background work
    /// does not run into the next; correctness never needs it.
    pub fn quiesce(&self) -> Result<()> {
        let i = &self.inner;
        i.drain()?;
        let mut c = i.cstate.lock();
        loop {
            let total = i.shm.share(shm::Res::Cache) as u64;
            if let Some(e) = i.worker_error.lock().clone() {
                return Err(VnvmError::CacheFull(format!("a worker failed: {e}")));
            }
            if let Some(e) = i.wb_error.lock().clone() {
                return Err(VnvmError::CacheFull(format!("the writeback fails: {e}")));
            }
            let above =
                c.need_space || c.ndirty as u64 * 100 > i.cfg.writeback_start_pct as u64 * total;
            if (c.wb_idle && !above) || i.stop_wb.load(Ordering::SeqCst) {
                return Ok(());
            }
            i.wb_cv.notify_all();
            i.wb_idle_cv.wait_for(&mut c, Duration::from_millis(50));
        }
    }

    /// Release the instance (the thesis' `nv_release`): abort open transactions, let the redo
    /// worker apply every committed log, write every dirty cache page back, fdatasync the
    /// files and mark the instance cleanly shut down.
    pub fn nv_release(mut self) -> Result<()> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let i = self.inner.clone();
        for ol in &i.open {
            let txs: Vec<Tx> = ol.lock().txs.drain().map(|(_, t)| t).collect();
            for t in txs {
                i.discard(t);
            }
        }
        i.stop_redo.store(true, Ordering::SeqCst);
        if let Some(t) = i.redo_thread.get() {
            t.unpark();
        }
        if let Some(h) = self.redo.take() {
            let _ = h.join();
        }
        i.stop_wb.store(true, Ordering::SeqCst);
        {
            let _g = i.cstate.lock();
            i.wb_cv.notify_all();
        }
        if let Some(h) = self.wb.take() {
            let _ = h.join();
        }
        if let Some(e) = i.worker_error.lock().clone() {
            return Err(VnvmError::CacheFull(format!("a worker failed: {e}")));
        }
        if !i.domains.iter().all(|d| d.lock().queue.is_empty()) {
            return Err(VnvmError::CacheFull(
                "redo worker stopped before applying every committed log".into(),
            ));
        }
        flock_exclusive(&i.lockf, true);
        let r = i.leave();
        flock_release(&i.lockf);
        r
    }

    /// Stop the workers without writing anything back, leaving the instance as a crash would
    /// (state running, logs and dirty pages in NVM). For crash tests.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.released = true;
        let i = self.inner.clone();
        i.kill.store(true, Ordering::SeqCst);
        i.stop_redo.store(true, Ordering::SeqCst);
        i.stop_wb.store(true, Ordering::SeqCst);
        if let Some(t) = i.redo_thread.get() {
            t.unpark();
        }
        {
            let _g = i.cstate.lock();
            i.wb_cv.notify_all();
            i.space_cv.notify_all();
        }
        if let Some(h) = self.redo.take() {
            let _ = h.join();
        }
        if let Some(h) = self.wb.take() {
            let _ = h.join();
        }
        // Keep /dev/shm tidy for tests: the name of a shared-memory object nobody else uses
        // goes (a real crash leaves it; the next first user replaces it anyway).
        if i.shm.users() <= 1 {
            i.shm.unlink();
            for s in 0..shm::MAX_SHARED {
                if i.shm.shared(s).file.load(Ordering::Relaxed) != 0 {
                    shm::Bitmaps::unlink_name(&i.dir, s);
                }
            }
        }
    }
}

impl Drop for Vnvm {
    fn drop(&mut self) {
        let _ = self.release_inner();
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum WbTarget {
    /// Until the dirty ratio is below the stop threshold (or space is found for redo).
    Threshold,
    /// Every dirty page.
    All,
    /// Every dirty page of one file.
    File(u32),
}

impl Inner {
    fn take_tx(&self, ol: &mut OpenList, tid: Tid) -> Result<Tx> {
        match ol.txs.remove(&tid) {
            Some(tx) if tx.aborted_by_age => {
                ol.finish(tid, Outcome::Aborted { by_age: true });
                Err(VnvmError::TxAborted { tid, by_age: true })
            }
            Some(tx) => Ok(tx),
            None => Err(self.tid_error(ol, tid)),
        }
    }

    fn tid_error(&self, ol: &OpenList, tid: Tid) -> VnvmError {
        if tid == 0 || tid >= self.shm.next_tid().load(Ordering::Relaxed) {
            return VnvmError::UnknownTx(tid);
        }
        match ol.recent.iter().rev().find(|(t, _)| *t == tid) {
            Some((_, Outcome::Committed)) => VnvmError::TxCommitted(tid),
            Some((_, Outcome::Aborted { by_age })) => VnvmError::TxAborted {
                tid,
                by_age: *by_age,
            },
            None => VnvmError::TxNotOpen(tid),
        }
    }

    /// Free an uncommitted transaction's log pages and unpin its regions.
    fn discard(&self, tx: Tx) {
        self.free_log_pages(&tx.pages);
        for r in &tx.regions {
            r.open_writers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn free_log_pages(&self, pages: &[u32]) {
        if pages.is_empty() {
            return;
        }
        self.shm.free(shm::Res::Log, self.slot as u8 + 1, pages);
    }

    fn find_region(&self, addr: usize, len: usize) -> Option<Arc<RegionInner>> {
        let regions = self.regions.read();
        regions
            .iter()
            .flatten()
            .find(|r| addr >= r.base() && addr + len <= r.base() + r.size as usize)
            .cloned()
    }

    fn write(&self, tid: Tid, dst: usize, src: &[u8]) -> Result<usize> {
        let ps = self.geo.page_size as usize;
        let mut ol = self.open[tid as usize % OPEN_LISTS].lock();
        let ol = &mut *ol;
        let tx = match ol.txs.get_mut(&tid) {
            Some(t) if t.aborted_by_age => return Err(VnvmError::TxAborted { tid, by_age: true }),
            Some(t) => t,
            None => return Err(self.tid_error(ol, tid)),
        };
        if src.is_empty() {
            return Ok(0);
        }
        let end = dst.checked_add(src.len()).ok_or(VnvmError::OutOfRegion {
            addr: dst,
            len: src.len(),
        })?;
        // The region: the transaction's most recent one, else a lookup.
        let region = match tx
            .regions
            .iter()
            .rev()
            .find(|r| dst >= r.base() && end <= r.base() + r.size as usize)
        {
            Some(r) => r.clone(),
            None => {
                let r = self
                    .find_region(dst, src.len())
                    .ok_or(VnvmError::OutOfRegion {
                        addr: dst,
                        len: src.len(),
                    })?;
                if tx
                    .regions
                    .first()
                    .is_some_and(|f| f.shared.is_some() || r.shared.is_some())
                {
                    return Err(VnvmError::CrossRegion {
                        tid,
                        path: r.path.clone(),
                    });
                }
                r.open_writers.fetch_add(1, Ordering::SeqCst);
                if r.closing.load(Ordering::SeqCst) {
                    r.open_writers.fetch_sub(1, Ordering::SeqCst);
                    return Err(VnvmError::RegionFreed(r.path.clone()));
                }
                tx.regions.push(r.clone());
                r
            }
        };
        let mut off = (dst - region.base()) as u64;
        let mut done = 0usize;
        while done < src.len() {
            // A new page when this one cannot take the rest or at least 64 bytes of it (a
            // small write is never split into crumbs).
            let want = (src.len() - done).min(64);
            if tx.pages.is_empty() || tx.used as usize + ENTRY_HDR + want > ps {
                let Some(np) = self.take_log_page() else {
                    break;
                };
                if let Some(&last) = tx.pages.last() {
                    self.log_store(last as u64 * ps as u64, &log_hdr(tx.used, np + 1, tid));
                }
                tx.pages.push(np);
                tx.used = LOG_HDR as u32;
            }
            // cannot fail: the branch above pushed a page or left the loop.
            let page = *tx.pages.last().expect("a page");
            let room = ps - tx.used as usize - ENTRY_HDR;
            let to_boundary = ps - (off % ps as u64) as usize;
            let n = (src.len() - done).min(room).min(to_boundary);
            let at = page as u64 * ps as u64 + tx.used as u64;
            let data = &src[done..done + n];
            // The entry's CRC32C is computed here, while its bytes are hot (one pass).
            self.log_store(at, &entry_hdr(region.file_id, off, data));
            self.log_store(at + ENTRY_HDR as u64, data);
            tx.used += (ENTRY_HDR + pad8(n)) as u32;
            done += n;
            off += n as u64;
        }
        if done == 0 {
            return Err(VnvmError::LogFull { logged: 0 });
        }
        Ok(done)
    }

    /// Store bytes into the log pool's data area (ordinary stores; `commit` writes the lines
    /// back and fences). `at..at + data.len()` must lie in a log page the caller owns.
    #[inline]
    fn log_store(&self, at: u64, data: &[u8]) {
        debug_assert!(at as usize + data.len() <= self.log.data_len());
        // SAFETY: in bounds of the log pool's data area (checked by the callers' page
        // arithmetic); the page belongs to the calling transaction alone.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.log.data_ptr().add(at as usize),
                data.len(),
            )
        }
    }

    /// Store bytes into a cache page and note what needs a write-back in `lines` (merged with
    /// the previous range when they touch) for one write-back pass before the fence. With
    /// `stream`, whole cache lines go out with non-temporal stores: the destination lines are
    /// not read first (a cache page is rarely in the CPU cache) and need no write-back, only
    /// the fence of `publish`; partial lines (and everything without `stream`: an edge chunk,
    /// which later entries of a batch often write again) use ordinary stores and are noted.
    /// (With a crash-model domain attached, the streamed lines are noted too, so that the
    /// model sees the stores.)
    fn cache_store(&self, at: u64, data: &[u8], stream: bool, lines: &mut Vec<(u64, u64)>) {
        const LINE: usize = 64;
        // cannot fail: callers store within one cache page (< cache_pages) of the pool.
        assert!(at as usize + data.len() <= self.cache.data_len());
        let dst = self.cache.data_ptr() as usize + at as usize;
        let len = data.len();
        let head = ((LINE - dst % LINE) % LINE).min(len);
        let body = if stream {
            (len - head) / LINE * LINE
        } else {
            0
        };
        let mut note = |from: usize, to: usize| {
            if from == to {
                return;
            }
            let (from, to) = (at + from as u64, at + to as u64);
            match lines.last_mut() {
                Some((s, e)) if from <= *e && to >= *s => {
                    *s = (*s).min(from);
                    *e = (*e).max(to);
                }
                _ => lines.push((from, to)),
            }
        };
        // SAFETY: bounds checked above (dst..dst + len lies in the cache pool's data area); the
        // page is owned by the redo worker under the cache lock; the body destination is
        // 64-byte aligned by construction of `head`; the source is a live slice.
        unsafe {
            let (d, src) = (dst as *mut u8, data.as_ptr());
            std::ptr::copy_nonoverlapping(src, d, head);
            if body > 0 {
                stream_lines(d.add(head), src.add(head), body);
            }
            std::ptr::copy_nonoverlapping(
                src.add(head + body),
                d.add(head + body),
                len - head - body,
            );
        }
        note(0, head);
        if self.cache.domain_id().is_some() {
            note(head, head + body);
        }
        note(head + body, len);
    }

    /// The entries of transaction `tid`'s log pages, each checked by `check(file, offset,
    /// len)`; with `verify` (the redo worker) their CRC32Cs are checked too. Errors:
    /// [`VnvmError::Damaged`] when a page does not parse, is stamped with another tid, an entry
    /// fails `check` or (with `verify`) its checksum (never for pages written by this
    /// process's `nv_write`, unless something else wrote into them).
    fn entries_of(
        &self,
        tid: Tid,
        pages: &[u32],
        out: &mut Vec<Entry>,
        check: &dyn Fn(u32, u64, u32) -> std::result::Result<(), String>,
        verify: bool,
    ) -> Result<()> {
        let ps = self.geo.page_size;
        for &p in pages {
            let off = p as u64 * ps as u64;
            if p >= self.geo.log_pages {
                return Err(damaged(
                    &self.log,
                    format!("log page {p}"),
                    off,
                    "out of range",
                ));
            }
            let b = pool_slice(&self.log, off, ps as usize);
            let owner = u64_at(b, 8);
            if owner != tid {
                return Err(damaged(
                    &self.log,
                    format!("log page {p}"),
                    off,
                    format!("belongs to tid {owner}, not to tid {tid}"),
                ));
            }
            parse_page(b, off, ps, out, check, verify)
                .map_err(|e| damaged(&self.log, format!("log page {p} (tid {tid})"), off, e))?;
        }
        Ok(())
    }

    /// A free log object for transaction `tid`'s commit, waiting (up to [`COMMIT_WAIT`]) as
    /// `nv_wait_log_space` waits for log pages: redo workers and shared-region flushes free
    /// them. Errors: [`VnvmError::NoLogObject`] after the wait; the failure of a worker.
    fn take_log_obj(&self, tid: Tid) -> Result<u32> {
        let t0 = Instant::now();
        loop {
            let seen = self.shm.log_seq();
            if let Some(i) = self.shm.take_one(shm::Res::Obj, self.slot) {
                return Ok(i);
            }
            if let Some(e) = self.worker_error.lock().clone() {
                return Err(VnvmError::CacheFull(format!(
                    "no free log object and a worker failed: {e}"
                )));
            }
            let waited = t0.elapsed();
            let limit = commit_wait();
            if waited >= limit {
                return Err(VnvmError::NoLogObject {
                    tid,
                    waited_ms: waited.as_millis() as u64,
                });
            }
            // Ask every user's workers to apply and flush (as a writer short of log space).
            self.flush_req.store(true, Ordering::SeqCst);
            if let Some(t) = self.redo_thread.get() {
                t.unpark();
            }
            self.shm
                .wait_log(seen, (limit - waited).min(Duration::from_millis(50)));
        }
    }

    /// Give back a transaction whose commit failed before it was linked: its log object, and
    /// the transaction itself, aborted (pages freed, regions unpinned, outcome recorded).
    fn unwind_commit(&self, tid: Tid, tx: Tx, idx: u32) {
        self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &[idx]);
        self.open[tid as usize % OPEN_LISTS]
            .lock()
            .finish(tid, Outcome::Aborted { by_age: false });
        self.discard(tx);
    }

    fn commit(&self, tid: Tid) -> Result<()> {
        let ps = self.geo.page_size as u64;
        // A transaction with logs needs a log object: take one first (waiting if need be), so
        // that a commit that cannot get one leaves the transaction open.
        let logged_any = self.open[tid as usize % OPEN_LISTS]
            .lock()
            .txs
            .get(&tid)
            .is_some_and(|t| !t.pages.is_empty() && !t.aborted_by_age);
        let mut idx = if logged_any {
            Some(self.take_log_obj(tid)?)
        } else {
            None
        };
        let tx = {
            let mut ol = self.open[tid as usize % OPEN_LISTS].lock();
            let tx = match self.take_tx(&mut ol, tid) {
                Ok(tx) => tx,
                Err(e) => {
                    drop(ol);
                    if let Some(i) = idx {
                        self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &[i]);
                    }
                    return Err(e);
                }
            };
            if idx.is_none() && !tx.pages.is_empty() {
                // Another thread logged into it since we looked: take one without waiting.
                idx = self.shm.take_one(shm::Res::Obj, self.slot);
                if idx.is_none() {
                    ol.txs.insert(tid, tx);
                    return Err(VnvmError::NoLogObject { tid, waited_ms: 0 });
                }
            }
            ol.finish(tid, Outcome::Committed);
            tx
        };
        let (Some(&last), Some(idx)) = (tx.pages.last(), idx) else {
            if let Some(i) = idx {
                self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &[i]);
            }
            self.discard(tx);
            return Ok(());
        };
        self.log_store(last as u64 * ps, &log_hdr(tx.used, 0, tid));
        let mut logged = 0u64;
        for &p in &tx.pages {
            let used = if p == last {
                tx.used
            } else {
                u32_at(pool_slice(&self.log, p as u64 * ps, LOG_HDR), 0)
            };
            if let Err(e) = self.log.flush(p as u64 * ps, used as usize) {
                self.unwind_commit(tid, tx, idx);
                return Err(e.into());
            }
            logged += used as u64;
        }
        // Every entry must land in a region the transaction pinned (so the copies below stay
        // in bounds whatever the log pages hold).
        let regions: Vec<(u32, u64)> = tx.regions.iter().map(|r| (r.file_id, r.size)).collect();
        let check = |f: u32, o: u64, l: u32| -> std::result::Result<(), String> {
            match regions.iter().find(|(id, _)| *id == f) {
                Some((_, size)) if o.checked_add(l as u64).is_some_and(|e| e <= *size) => Ok(()),
                _ => Err(format!(
                    "entry {f}:{o}+{l} outside the transaction's regions"
                )),
            }
        };
        let mut entries = Vec::new();
        // Our own pages, just written: parsed, not re-verified (the redo worker verifies).
        if let Err(e) = self.entries_of(tid, &tx.pages, &mut entries, &check, false) {
            self.unwind_commit(tid, tx, idx);
            return Err(e);
        }
        let mut bytes = 0u64;
        let mut queued = REDO_BATCH;
        let mut linked_err = None;
        if tx.regions.first().is_some_and(|r| r.shared.is_some()) {
            match self.commit_shared(&tx, tid, idx, &entries) {
                Ok(b) => bytes = b,
                Err(CommitFail::NotLinked(e)) => {
                    self.unwind_commit(tid, tx, idx);
                    return Err(e);
                }
                Err(CommitFail::Linked(e)) => linked_err = Some(e),
            }
        } else {
            let mut d = self.domains[0].lock();
            let obj = LogObj {
                tid,
                prev: d.tail,
                first_page: tx.pages[0],
                npages: tx.pages.len() as u32,
                domain: d.id,
                app_id: self.slot as u32 + 1,
                start_ns: tx.start_ns,
            };
            let ooff = self.geo.logobj_off(idx);
            let ob = obj.encode();
            // SAFETY: the log-object slot lies in the meta data area and is ours (popped from
            // the free list).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    ob.as_ptr(),
                    self.meta.data_ptr().add(ooff as usize),
                    ob.len(),
                )
            };
            if let Err(e) = self.meta.flush(ooff, ob.len()) {
                drop(d);
                self.unwind_commit(tid, tx, idx);
                return Err(e.into());
            }
            // (1)+(2): every log entry and the log object are durable after this fence.
            self.meta.fence();
            // (3): link with one 8-byte atomic store, persisted. The store links it even if
            // the persist fails: then it is committed as far as this process is concerned.
            let head = if d.head == 0 { idx + 1 } else { d.head };
            linked_err =
                store_domain_persist(&self.meta, &self.geo, d.id, domain_word(head, idx + 1)).err();
            d.head = head;
            d.tail = idx + 1;
            // (4): only now is the data visible in DRAM.
            for e in &entries {
                // cannot fail: `check` accepted only entries of the transaction's regions.
                let Some(r) = tx.regions.iter().find(|r| r.file_id == e.file_id) else {
                    continue;
                };
                // SAFETY: the entry lies in the log pool (parsed from our own pages) and in the
                // region (checked above); the DRAM writable view is mapped.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.log.data_ptr().add(e.log_off as usize),
                        r.dram.wview.add(e.offset as usize),
                        e.len as usize,
                    )
                };
                bytes += e.len as u64;
            }
            d.queue.push_back(Committed {
                idx,
                pages: tx.pages,
            });
            queued = d.queue.len();
        }
        self.log.charge_write(logged);
        self.log.charge_read(bytes);
        self.me().commits.fetch_add(1, Ordering::Relaxed);
        for r in &tx.regions {
            r.open_writers.fetch_sub(1, Ordering::SeqCst);
        }
        // Wake the redo worker only for a full batch: while commits keep coming it polls and
        // finds this transaction within REDO_POLL; after an idle spell, within its periodic
        // interval. Nothing waits for it: the log is durable already.
        if queued >= REDO_BATCH {
            if let Some(t) = self.redo_thread.get() {
                t.unpark();
            }
        }
        match linked_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn drain(&self) -> Result<()> {
        for d in &self.domains {
            let mut g = d.lock();
            while !g.queue.is_empty() {
                if let Some(e) = self.worker_error.lock().clone() {
                    return Err(VnvmError::CacheFull(format!("redo worker failed: {e}")));
                }
                if let Some(e) = self.wb_error.lock().clone() {
                    return Err(VnvmError::CacheFull(format!("the writeback fails: {e}")));
                }
                if self.stop_redo.load(Ordering::SeqCst) && self.kill.load(Ordering::SeqCst) {
                    return Err(VnvmError::CacheFull("instance abandoned".into()));
                }
                if let Some(t) = self.redo_thread.get() {
                    t.unpark();
                }
                self.applied_cv.wait_for(&mut g, Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Run a worker's loop; if it panics, record why in `worker_error` and wake every waiter, so
    /// `drain`, `quiesce` and committers report the failure instead of waiting forever.
    fn run_worker(self: &Arc<Self>, name: &str, body: impl FnOnce(&Arc<Self>)) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(self)));
        if let Err(p) = r {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            *self.worker_error.lock() = Some(format!("{name} worker panicked: {msg}"));
            self.applied_cv.notify_all();
            self.space_cv.notify_all();
            self.wb_idle_cv.notify_all();
        }
    }

    // ---- redo worker -------------------------------------------------------------------------

    fn redo_loop(self: &Arc<Self>) {
        let period =
            (self.cfg.max_tx_age / 4).clamp(Duration::from_millis(1), Duration::from_millis(200));
        let period_ns = period.as_nanos() as u64;
        let mut last_scan = tiermem_media::now_ns();
        let mut last_work = last_scan;
        let idle_after_ns = REDO_IDLE_AFTER.as_nanos() as u64;
        let mut entries = Vec::new();
        let mut jobs: Vec<(u32, Vec<u32>)> = Vec::new();
        loop {
            if self.kill.load(Ordering::SeqCst) {
                return;
            }
            // A batch: every committed transaction queued now (up to REDO_BATCH), applied
            // with one publish (fence, masks, dirty words) and unlinked with one store.
            jobs.clear();
            if !self.cfg.redo_paused {
                let d = self.domains[0].lock();
                jobs.extend(
                    d.queue
                        .iter()
                        .take(REDO_BATCH)
                        .map(|c| (c.idx, c.pages.clone())),
                );
            }
            if !jobs.is_empty() {
                last_work = tiermem_media::now_ns();
                entries.clear();
                // Checked at commit (entries of the transaction's regions); parsed again here.
                let any = |_: u32, _: u64, _: u32| Ok(());
                let parsed = jobs.iter().try_for_each(|(_, pages)| {
                    // cannot fail: a committed transaction has at least one page, in range.
                    let first = pool_slice(
                        &self.log,
                        pages[0] as u64 * self.geo.page_size as u64,
                        LOG_HDR,
                    );
                    // Verified: a damaged committed log stops the worker (recovery refuses it).
                    self.entries_of(u64_at(first, 8), pages, &mut entries, &any, true)
                });
                // cannot fail: `jobs` is not empty here.
                let last = jobs.last().map_or(0, |j| j.0);
                if let Err(e) = parsed
                    .and_then(|()| self.apply(&entries))
                    .and_then(|()| self.pop(jobs.len(), last))
                {
                    if !self.kill.load(Ordering::SeqCst) {
                        // Keep the first cause (a writeback failure explains this one).
                        self.worker_error.lock().get_or_insert(e.to_string());
                    }
                    let _g = self.domains[0].lock();
                    self.applied_cv.notify_all();
                    return;
                }
            } else {
                if self.stop_redo.load(Ordering::SeqCst) {
                    if self.cfg.redo_paused {
                        *self.worker_error.lock() =
                            Some("redo worker paused (test configuration)".into());
                        let _g = self.domains[0].lock();
                        self.applied_cv.notify_all();
                    }
                    return;
                }
                if tiermem_media::now_ns().saturating_sub(last_work) < idle_after_ns {
                    // Commits are coming: poll, so that they need not wake us.
                    std::thread::park_timeout(REDO_POLL.min(period));
                } else {
                    // Idle: the long sleep (a full batch, a writer short of log space, drain
                    // or release wake it).
                    std::thread::park_timeout(period);
                }
            }
            let now = tiermem_media::now_ns();
            let periodic = now.saturating_sub(last_scan) >= period_ns;
            let wanted =
                self.flush_req.swap(false, Ordering::AcqRel) | self.shm.take_flush_wanted();
            if periodic || wanted {
                // Shared regions: flush past the threshold, or whatever is pending when a
                // writer waits for log space or a period has passed.
                if let Err(e) = self.flush_shared_regions(true) {
                    *self.worker_error.lock() = Some(e.to_string());
                    return;
                }
            }
            if periodic {
                last_scan = now;
                self.abort_old();
                if let Err(e) = self.reap_dead() {
                    *self.worker_error.lock() = Some(format!("reaping a dead user: {e}"));
                }
            }
        }
    }

    fn abort_old(&self) {
        let max = self.cfg.max_tx_age.as_nanos().min(u64::MAX as u128) as u64;
        let now = tiermem_media::now_ns();
        for ol in &self.open {
            let mut g = ol.lock();
            let mut freed = Vec::new();
            for tx in g.txs.values_mut() {
                if !tx.aborted_by_age && now.saturating_sub(tx.start_ns) > max {
                    tx.aborted_by_age = true;
                    freed.append(&mut tx.pages);
                    for r in tx.regions.drain(..) {
                        r.open_writers.fetch_sub(1, Ordering::SeqCst);
                    }
                    self.me().age_aborts.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Freed before the open list is unlocked: whoever sees the abort sees the pages free.
            self.free_log_pages(&freed);
            drop(g);
        }
    }

    /// Apply committed transactions' entries (in commit order) to the NVM cache, then mark the
    /// touched pages dirty (data fenced first).
    ///
    /// The loop only stores: the cache lines it wrote are collected (adjacent ranges merged)
    /// and written back in one pass before the single fence of `publish`. A locked instruction
    /// (an `Arc` count, a lock) right after a line write-back waits for it to complete, so
    /// nothing between the stores and the fence takes a lock or touches a shared counter
    /// except a page miss that has to wait for space (which publishes first).
    fn apply(&self, entries: &[Entry]) -> Result<()> {
        let ps = self.geo.page_size as u64;
        let cs = self.geo.chunk();
        // Page and chunk sizes are powers of two (4 or 8 KiB; a 64th of that): shifts, not
        // divisions, per entry.
        let (ps_shift, cs_shift) = (ps.trailing_zeros(), cs.trailing_zeros());
        debug_assert!(ps.is_power_of_two() && cs.is_power_of_two());
        // Pages that become dirty with this batch, and every page it writes (their records
        // get a new mask and contents CRC).
        let mut touched: Vec<u32> = Vec::new();
        let mut grown: Vec<u32> = Vec::new();
        // Cache-pool ranges stored into and not yet written back.
        let mut dirty_lines: Vec<(u64, u64)> = Vec::new();
        // Regions whose DRAM caches fill edge chunks, looked up once per batch.
        let mut regions: Vec<Arc<RegionInner>> = Vec::new();
        for e in entries {
            if !regions.iter().any(|r| r.file_id == e.file_id) {
                let r = self
                    .regions
                    .read()
                    .get(e.file_id as usize)
                    .cloned()
                    .flatten();
                regions.push(r.ok_or_else(|| {
                    VnvmError::Inconsistent(format!(
                        "a committed log entry names file {}, which this process has not \
                         allocated",
                        e.file_id
                    ))
                })?);
            }
        }
        let mut written = 0u64;
        // An edge chunk being put together (a chunk is at most 128 bytes: 8 KiB pages).
        let mut chunk_buf = [0u8; 128];
        let mut c = self.cstate.lock();
        for (i, e) in entries.iter().enumerate() {
            // Ask for what entry i + AHEAD will touch now, so that its cache misses overlap
            // this entry's work: the first and last cache line it stores into (an edge chunk's
            // line is read) and its chunk sums. Entries mostly write cache pages that are not
            // in the CPU cache, and a read of one stalls the worker for a memory round trip.
            const AHEAD: usize = 8;
            if let Some(n) = entries.get(i + AHEAD) {
                if let Some(&p) = c.map.get(&(n.file_id, n.offset >> ps_shift)) {
                    let at = p as u64 * ps + (n.offset & (ps - 1));
                    let last = at + n.len.max(1) as u64 - 1;
                    let row = (p as usize * 64 + ((n.offset & (ps - 1)) >> cs_shift) as usize)
                        .min(c.sums.len().saturating_sub(1));
                    if last < self.cache.data_len() as u64 {
                        prefetch(self.cache.data_ptr().wrapping_add(at as usize));
                        prefetch(self.cache.data_ptr().wrapping_add(last as usize));
                    }
                    prefetch(c.sums.as_ptr().wrapping_add(row) as *const u8);
                }
            }
            let pidx = e.offset >> ps_shift;
            let key = (e.file_id, pidx);
            let page = loop {
                if let Some(&p) = c.map.get(&key) {
                    match c.state[p as usize] {
                        PState::Dirty => {
                            if c.dirty.head != p {
                                c.unlink(p);
                                c.push_head(p, PState::Dirty);
                            }
                        }
                        PState::Clean => {
                            c.unlink(p);
                            c.state[p as usize] = PState::Pinned;
                            touched.push(p);
                        }
                        PState::Pinned | PState::Writing => {}
                        PState::Free => {
                            return Err(VnvmError::Inconsistent(format!(
                                "cache page {p} is mapped but free"
                            )))
                        }
                    }
                    break p;
                }
                self.refill_cache(&mut c);
                if let Some(p) = c.take() {
                    // No fill: only the chunks the entries touch become valid.
                    c.key[p as usize] = Some(key);
                    c.map.insert(key, p);
                    c.state[p as usize] = PState::Pinned;
                    c.gen[p as usize] += 1;
                    touched.push(p);
                    break p;
                }
                // No page: publish this batch's pages so that they can be written back, then
                // wait for the writeback worker.
                self.flush_ranges(&mut dirty_lines)?;
                self.publish(&mut c, &mut touched, &mut grown)?;
                if self.kill.load(Ordering::SeqCst) {
                    return Err(VnvmError::CacheFull("instance abandoned".into()));
                }
                let wb = if self.stop_redo.load(Ordering::SeqCst) {
                    self.wb_error.lock().clone()
                } else {
                    None // (still failing: wait, the writeback worker retries)
                };
                if let Some(e) = self.worker_error.lock().clone().or(wb) {
                    // The writeback cannot make room (a failing or full device) and the
                    // instance is being released: stop here; the committed logs stay in the
                    // committed list for recovery.
                    return Err(VnvmError::CacheFull(format!(
                        "no free cache page and the writeback cannot make room: {e}"
                    )));
                }
                c.need_space = true;
                self.wb_cv.notify_all();
                self.space_cv.wait_for(&mut c, Duration::from_millis(100));
            };
            let in_page = e.offset & (ps - 1);
            let end = in_page + e.len as u64;
            let base = page as u64 * ps;
            let pu = page as usize;
            let (first, last) = (in_page >> cs_shift, (end - 1) >> cs_shift);
            // A page joins `grown` (the records to publish) with its first write of the batch:
            // its `open` mask is empty until then (a flag, not a search: a batch writes up to
            // thousands of pages, and `Vec::contains` per entry made the redo worker quadratic).
            if c.open[pu] == 0 {
                grown.push(page);
            }
            let range = mask_range(first, last);
            c.open[pu] |= range;
            let valid = c.mask[pu];
            c.mask[pu] |= range;
            let data = pool_slice(&self.log, e.log_off, e.len as usize);
            let row = pu * 64;
            // The chunks the entry covers whole: one store of the log bytes, and their sums
            // hashed from those bytes (warm: just read).
            let (whole_from, whole_to) = ((in_page + cs - 1) >> cs_shift, end >> cs_shift);
            if whole_from < whole_to {
                let bytes =
                    &data[(whole_from * cs - in_page) as usize..(whole_to * cs - in_page) as usize];
                self.cache_store(base + whole_from * cs, bytes, true, &mut dirty_lines);
                chunksum::chunk_sums(
                    whole_from,
                    bytes,
                    cs as usize,
                    &mut c.sums[row + whole_from as usize..row + whole_to as usize],
                );
                written += bytes.len() as u64;
            }
            // An edge chunk (covered in part): a valid one gets the entry's bytes with
            // ordinary stores and is hashed from the cache page (its lines are in the CPU
            // cache now, as the stores read them); an invalid one is put together from the
            // DRAM cache's bytes, which hold exactly the committed data (possibly newer
            // committed data too, harmless: see docs/vnvm.md), with the entry's bytes over
            // them, and stored whole.
            let edges = [first, last];
            let edges = if first == last {
                &edges[..1]
            } else {
                &edges[..]
            };
            for &ch in edges {
                let (cstart, cend) = (ch * cs, (ch + 1) * cs);
                if in_page <= cstart && end >= cend {
                    continue; // covered whole: stored and hashed above
                }
                let (lo, hi) = (in_page.max(cstart), end.min(cend));
                let part = &data[(lo - in_page) as usize..(hi - in_page) as usize];
                if valid & (1 << ch) != 0 {
                    self.cache_store(base + lo, part, false, &mut dirty_lines);
                    c.sums[row + ch as usize] = chunksum::chunk_sum(
                        ch,
                        pool_slice(&self.cache, base + cstart, cs as usize),
                    );
                    written += part.len() as u64;
                    continue;
                }
                let region = regions
                    .iter()
                    .find(|r| r.file_id == e.file_id)
                    // cannot fail: every entry's region was looked up above.
                    .expect("looked up above");
                let buf = &mut chunk_buf[..cs as usize];
                // SAFETY: the chunk lies within the region's DRAM cache (page-rounded mapping);
                // concurrent commits may change it (harmless, see docs).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        region.dram.wview.add((pidx * ps + cstart) as usize),
                        buf.as_mut_ptr(),
                        cs as usize,
                    )
                };
                buf[(lo - cstart) as usize..(hi - cstart) as usize].copy_from_slice(part);
                self.cache_store(base + cstart, buf, false, &mut dirty_lines);
                c.sums[row + ch as usize] = chunksum::chunk_sum(ch, buf);
                written += cs;
            }
            c.gen[page as usize] += 1;
        }
        self.flush_ranges(&mut dirty_lines)?;
        self.publish(&mut c, &mut touched, &mut grown)?;
        drop(c);
        self.cache.charge_write(written);
        self.log
            .charge_read(entries.iter().map(|e| e.len as u64).sum());
        let total = self.shm.share(shm::Res::Cache) as u64;
        let ndirty = self.cstate.lock().ndirty as u64;
        if ndirty * 100 > self.cfg.writeback_start_pct as u64 * total {
            self.wb_cv.notify_all();
        }
        Ok(())
    }

    /// Write back the lines of the collected cache-pool ranges `(start, end)` (no fence).
    fn flush_ranges(&self, ranges: &mut Vec<(u64, u64)>) -> Result<()> {
        for (start, end) in ranges.drain(..) {
            self.cache.flush(start, (end - start) as usize)?;
        }
        Ok(())
    }

    /// Make the applied data durable, then the records of every page the batch wrote: dirty
    /// word, valid mask and the CRC32C of the page's contents, each record rewritten whole in
    /// its cache line (a line is written back as a unit, so a record never tears; a page object
    /// never says dirty with a mask or a CRC that is not its own). Until the batch is unlinked
    /// from the committed list, a crash may leave a page newer than its CRC: recovery accepts
    /// that only for pages the listed transactions write (it overwrites their bytes).
    fn publish(
        &self,
        c: &mut CacheState,
        touched: &mut Vec<u32>,
        grown: &mut Vec<u32>,
    ) -> Result<()> {
        self.cache.fence();
        if touched.is_empty() && grown.is_empty() {
            return Ok(());
        }
        // Stores first, then one write-back per run of neighbouring records (a cache line
        // holds two; a write-back right after each store would write a line twice).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for p in grown.drain(..) {
            let Some((f, idx)) = c.key[p as usize] else {
                continue; // cannot happen: a page written by this batch is mapped
            };
            c.open[p as usize] = 0;
            let row = p as usize * 64;
            let rec = CacheRec {
                word: cache_word(f, idx, true),
                mask: c.mask[p as usize],
                page_crc: chunksum::xor_masked(&c.sums[row..row + 64], c.mask[p as usize]),
            };
            let off = self.geo.cache_word_off(p);
            store_cache_rec(&self.meta, &self.geo, p, &rec);
            add_run(&mut runs, off, CACHE_OBJ_SIZE);
        }
        self.flush_meta_runs(&mut runs)?;
        self.meta.fence();
        for p in touched.drain(..) {
            c.push_head(p, PState::Dirty);
            c.ndirty += 1;
        }
        Ok(())
    }

    /// Write back the meta-pool runs `(start, end)` (no fence).
    fn flush_meta_runs(&self, runs: &mut Vec<(u64, u64)>) -> Result<()> {
        for (start, end) in runs.drain(..) {
            self.meta.flush(start, (end - start) as usize)?;
        }
        Ok(())
    }

    /// Unlink the first `n` transactions of the committed list (they have been applied, the
    /// last of them is log object `last`) with one persisted store, and free their log pages.
    fn pop(&self, n: usize, last: u32) -> Result<()> {
        let mut pages = Vec::new();
        let mut idxs = Vec::with_capacity(n);
        {
            let mut d = self.domains[0].lock();
            debug_assert!(d.queue.len() >= n && d.queue[n - 1].idx == last);
            let (head, tail) = if d.queue.len() == n {
                (0, 0)
            } else {
                (d.queue[n].idx + 1, d.tail)
            };
            store_domain_persist(&self.meta, &self.geo, d.id, domain_word(head, tail))?;
            d.head = head;
            d.tail = tail;
            for c in d.queue.drain(..n) {
                idxs.push(c.idx);
                pages.extend_from_slice(&c.pages);
            }
            self.me().applied.fetch_add(n as u64, Ordering::Relaxed);
            self.applied_cv.notify_all();
        }
        self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &idxs);
        self.free_log_pages(&pages);
        Ok(())
    }

    // ---- writeback worker ----------------------------------------------------------------------

    fn wb_loop(self: &Arc<Self>) {
        // Background work: yield the CPU to the application and the redo worker. SCHED_IDLE
        // runs it only on an otherwise idle CPU (nice 10 still took a share of a CPU the
        // application and the redo worker wanted); when the redo worker waits for space it is
        // idle itself, so the writeback worker then gets its CPU. Fallback: nice 19.
        // SAFETY: sched_setscheduler / setpriority on this thread's own id; failure is harmless.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) != 0 {
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
            }
        }
        loop {
            if self.wb_failing.load(Ordering::SeqCst) {
                // The last writeback failed (full or failing device): retry everything every
                // WB_RETRY until it succeeds (or the instance stops).
                {
                    let mut c = self.cstate.lock();
                    if self.kill.load(Ordering::SeqCst) || self.stop_wb.load(Ordering::SeqCst) {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                        return;
                    }
                    self.wb_cv.wait_for(&mut c, WB_RETRY);
                    if self.kill.load(Ordering::SeqCst) || self.stop_wb.load(Ordering::SeqCst) {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                        return;
                    }
                }
                match self.writeback(WbTarget::All) {
                    Ok(()) => {
                        *self.wb_error.lock() = None;
                        self.wb_failing.store(false, Ordering::SeqCst);
                    }
                    Err(e @ VnvmError::Io { .. }) => *self.wb_error.lock() = Some(e.to_string()),
                    Err(e) => {
                        *self.worker_error.lock() = Some(e.to_string());
                        return;
                    }
                }
                let c = self.cstate.lock();
                self.space_cv.notify_all();
                self.wb_idle_cv.notify_all();
                drop(c);
                continue;
            }
            // Pages beyond the equal share (a user joined) go back to the shared free list.
            self.release_over_share();
            let mut write = false;
            {
                let mut c = self.cstate.lock();
                loop {
                    if self.kill.load(Ordering::SeqCst) || self.stop_wb.load(Ordering::SeqCst) {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                        return;
                    }
                    if self.over_share() > 0 && (c.clean.len > 0 || !c.free.is_empty()) {
                        break; // give pages back first (top of the loop)
                    }
                    // Thresholds are fractions of this user's cache share (thesis §2.4.3).
                    let total = self.shm.share(shm::Res::Cache) as u64;
                    if c.need_space
                        || c.ndirty as u64 * 100 > self.cfg.writeback_start_pct as u64 * total
                        || (self.over_share() > 0 && c.clean.len == 0 && c.free.is_empty())
                    {
                        c.wb_idle = false;
                        write = true;
                        break;
                    }
                    if !c.wb_idle {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                    }
                    self.wb_cv.wait_for(&mut c, Duration::from_millis(200));
                }
            }
            if !write {
                continue;
            }
            if let Err(e) = self.writeback(WbTarget::Threshold) {
                if matches!(e, VnvmError::Io { .. }) {
                    // An I/O error (full device...): the pages stay dirty; retry later.
                    *self.wb_error.lock() = Some(e.to_string());
                    self.wb_failing.store(true, Ordering::SeqCst);
                    let mut c = self.cstate.lock();
                    c.wb_idle = true;
                    self.wb_idle_cv.notify_all();
                    self.space_cv.notify_all();
                    drop(c);
                    let _d = self.domains[0].lock();
                    self.applied_cv.notify_all();
                    continue;
                }
                *self.worker_error.lock() = Some(e.to_string());
                let mut c = self.cstate.lock();
                c.wb_idle = true;
                self.wb_idle_cv.notify_all();
                self.space_cv.notify_all();
                return;
            }
        }
    }

    /// Write dirty pages back (pwrite + fdatasync), then clear their dirty flags (persisted) and
    /// move them to the clean list.
    fn writeback(&self, target: WbTarget) -> Result<()> {
        const BATCH: usize = 64;
        // The copy of a run of pages being written (reused: a fresh one per batch was up to
        // 256 KiB, above malloc's mmap threshold, so every batch mapped, faulted in and
        // unmapped it).
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let total = self.shm.share(shm::Res::Cache) as u64;
            // Pick a batch from the LRU tail of the dirty list.
            let mut batch: Vec<(u32, (u32, u64), u64)> = Vec::new();
            {
                let mut c = self.cstate.lock();
                let enough = match target {
                    WbTarget::Threshold => {
                        c.ndirty as u64 * 100 <= self.cfg.writeback_stop_pct as u64 * total
                            && (!c.need_space || !c.free.is_empty() || c.clean.len > 0)
                            && (self.over_share() == 0 || c.clean.len > 0)
                    }
                    _ => false,
                };
                if enough {
                    c.need_space = false;
                    self.space_cv.notify_all();
                    return Ok(());
                }
                let mut p = c.dirty.tail;
                while p != NIL && batch.len() < BATCH {
                    let prev = c.prev[p as usize];
                    // cannot fail: a page is keyed before it becomes dirty, and unkeyed only
                    // when clean.
                    let key = c.key[p as usize].expect("dirty pages are mapped");
                    if match target {
                        WbTarget::File(f) => key.0 == f,
                        _ => true,
                    } {
                        batch.push((p, key, c.gen[p as usize]));
                    }
                    p = prev;
                }
                for &(p, _, _) in &batch {
                    c.unlink(p);
                    c.state[p as usize] = PState::Writing;
                }
                if batch.is_empty() {
                    let writing = |c: &CacheState| {
                        (0..c.state.len()).any(|p| {
                            c.state[p] == PState::Writing
                                && match (target, c.key[p]) {
                                    (WbTarget::File(f), Some(k)) => k.0 == f,
                                    (WbTarget::All, _) => true,
                                    _ => false,
                                }
                        })
                    };
                    if writing(&c) {
                        // Another writer has pages of this target in flight: wait for it.
                        self.space_cv.wait_for(&mut c, Duration::from_millis(20));
                        continue;
                    }
                    c.need_space = false;
                    self.space_cv.notify_all();
                    return Ok(());
                }
                // Sorted by (file, page) so that neighbours go out in one pwrite.
                batch.sort_unstable_by_key(|b| b.1);
            }
            // Write outside the lock.
            let res = self.write_batch(&batch, &mut buf);
            let mut c = self.cstate.lock();
            let mut cleaned = 0;
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for &(p, (f, idx), gen) in &batch {
                if res.is_ok() && c.gen[p as usize] == gen {
                    let off = self.geo.cache_word_off(p);
                    // The record as published (mask, contents CRC) with the dirty bit cleared.
                    let mut rec = load_cache_rec(&self.meta, &self.geo, p)?;
                    rec.word = cache_word(f, idx, false);
                    store_cache_rec(&self.meta, &self.geo, p, &rec);
                    add_run(&mut runs, off, CACHE_OBJ_SIZE);
                    cleaned += 1;
                } else {
                    c.push_head(p, PState::Dirty);
                }
            }
            self.flush_meta_runs(&mut runs)?;
            if cleaned > 0 {
                self.meta.fence();
            }
            for &(p, _, gen) in &batch {
                if res.is_ok() && c.gen[p as usize] == gen {
                    c.push_head(p, PState::Clean);
                    c.ndirty -= 1;
                }
            }
            self.me()
                .pages_written_back
                .fetch_add(cleaned, Ordering::Relaxed);
            self.space_cv.notify_all();
            drop(c);
            res?;
        }
    }

    /// Write one writeback batch's pages (sorted by (file, page)) to their backing files and
    /// sync them. Runs of neighbouring pages go out with one `pwrite`. A private region's pages
    /// are copied first (`buf`, reused), so that the checksums are of exactly the bytes
    /// written (commits may change the DRAM page meanwhile), and the checksum table gets
    /// `{new, prev}` for each unit and is synced *before* the data are written (see `sums`: a
    /// crash anywhere leaves each unit at one of its two recorded contents).
    fn write_batch(&self, batch: &[(u32, (u32, u64), u64)], buf: &mut Vec<u8>) -> Result<()> {
        let ps = self.geo.page_size as u64;
        // (region, first byte, bytes, where the copy is in `buf` if copied)
        let mut runs: Vec<(Arc<RegionInner>, u64, usize, Option<usize>)> = Vec::new();
        buf.clear();
        let mut k = 0;
        while k < batch.len() {
            let (f, idx) = batch[k].1;
            let mut run = 1;
            while k + run < batch.len() && batch[k + run].1 == (f, idx + run as u64) {
                run += 1;
            }
            let Some(r) = self.regions.read().get(f as usize).cloned().flatten() else {
                return Err(VnvmError::Inconsistent(format!(
                    "dirty cache page of file {f}, which this process has not allocated"
                )));
            };
            let start = idx * ps;
            let n = (ps * run as u64).min(r.size - start) as usize;
            // The pages go out from the DRAM cache: it holds every byte the NVM pages hold
            // (commit fills DRAM before the redo worker sees a transaction), plus possibly
            // newer committed data whose logs are still in the committed list.
            let at = r.sums.is_some().then(|| {
                let at = buf.len();
                // SAFETY: start + n lies within the region's DRAM mapping, which `r` keeps
                // alive (concurrent commits may change it: harmless, the copy is what is
                // written and checksummed). One copy, no zero-fill first.
                buf.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(r.dram.wview.add(start as usize), n)
                });
                at
            });
            runs.push((r, start, n, at));
            k += run;
        }
        // The checksum tables first: `{crc of the copy, prev = crc of what the file holds}`.
        let mut tables: Vec<&RegionInner> = Vec::new();
        for (r, start, n, at) in &runs {
            let (Some(t), Some(at)) = (r.sums.as_ref(), at) else {
                continue;
            };
            let res = (|| {
                let data = &buf[*at..*at + *n];
                let first = start / sums::UNIT;
                let nunits = data.len().div_ceil(sums::UNIT as usize);
                let old = t.read_run(first, nunits)?;
                let unsure = r.sums_unsure.load(Ordering::Relaxed);
                let mut entries = Vec::with_capacity(nunits);
                let mut fb = [0u8; sums::UNIT as usize];
                for (u, b) in data.chunks(sums::UNIT as usize).enumerate() {
                    // What the file holds: the last entry's crc, which its writer synced (a
                    // unit is written back by one writer at a time) — unless a write failed
                    // since, or vnvm never wrote the unit: then read it.
                    let prev = match old[u] {
                        Some(s) if !unsure && s.len as usize == b.len() => s.crc,
                        _ => {
                            let fb = &mut fb[..b.len()];
                            let off = start + (u as u64) * sums::UNIT;
                            std::os::unix::fs::FileExt::read_exact_at(&r.file, fb, off)
                                .map_err(|e| io_err("read backing file", &r.path, e))?;
                            sums::unit_crc(fb)
                        }
                    };
                    entries.push((sums::unit_crc(b), b.len() as u32, Some(prev)));
                }
                t.put_run(first, &entries)
            })();
            if let Err(e) = res {
                r.sums_unsure.store(true, Ordering::Relaxed);
                return Err(e);
            }
            if !tables.iter().any(|x| x.file_id == r.file_id) {
                tables.push(r);
            }
        }
        for r in &tables {
            if let Some(t) = &r.sums {
                if let Err(e) = t.sync() {
                    r.sums_unsure.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        // Then the data, then fdatasync.
        let mut files: Vec<&RegionInner> = Vec::new();
        let mut res = Ok(());
        for (r, start, n, at) in &runs {
            let src: *const u8 = match at {
                Some(at) => buf[*at..].as_ptr(),
                // SAFETY: start lies within the region's DRAM mapping.
                None => unsafe { r.dram.wview.add(*start as usize) },
            };
            let wr = match self.cfg.writeback_fault {
                Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
                // SAFETY: src..src + n is mapped: the copy in `buf`, or the region's DRAM
                // mapping (which `r` keeps alive; the kernel reads it while commits may change
                // it: harmless).
                None => unsafe { pwrite_all(&r.file, src, *n, *start) },
            };
            if let Err(e) = wr {
                res = Err(io_err("write back cache pages", &r.path, e));
                break;
            }
            if !files.iter().any(|x| x.file_id == r.file_id) {
                files.push(r);
            }
        }
        if res.is_ok() {
            for r in &files {
                if let Err(e) = r.file.sync_data() {
                    res = Err(io_err("fdatasync", &r.path, e));
                    break;
                }
            }
        }
        if res.is_err() {
            // The file may hold either contents, or a mix across a run: the next writeback
            // of this region reads what the file holds instead of trusting the table.
            for (r, ..) in &runs {
                r.sums_unsure.store(true, Ordering::Relaxed);
            }
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Overrides [`COMMIT_WAIT`] when not 0.
    pub(crate) static COMMIT_WAIT_MS: std::sync::atomic::AtomicU64 =
        std::sync::atomic::AtomicU64::new(0);

    /// A commit that finds no free log object (here: all taken, as a leak would) waits for
    /// one, and after its wait fails with a typed error, leaving the transaction open.
    #[test]
    fn a_commit_short_of_log_objects_waits_then_fails_with_an_error() {
        let d = tempfile::Builder::new()
            .prefix("tiermem-vnvm-objtest")
            .tempdir_in("/dev/shm")
            .unwrap();
        let cfg = VnvmConfig {
            dir: d.path().join("inst"),
            log_size: 16 * 4096,
            cache_size: 16 * 4096,
            max_files: 4,
            ..VnvmConfig::default()
        };
        let vn = Arc::new(nv_init(&cfg).unwrap());
        let r = vn
            .nv_allocate(d.path().join("f"), 4096, Mode::Private)
            .unwrap();
        let me = vn.inner.slot as u8 + 1;
        let mut hog = Vec::new();
        vn.inner
            .shm
            .take(shm::Res::Obj, vn.inner.slot, u32::MAX, &mut hog);
        assert_eq!(vn.inner.shm.free_count(shm::Res::Obj), 0);
        // One comes back while the commit waits: it commits.
        let t = vn.nv_txbegin();
        vn.nv_write(t, r.as_ptr(), b"waited").unwrap();
        let back = hog.pop().unwrap();
        let v2 = vn.clone();
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            v2.inner.shm.free(shm::Res::Obj, me, &[back]);
        });
        vn.nv_commit(t).unwrap();
        giver.join().unwrap();
        let mut b = [0u8; 6];
        r.read(0, &mut b);
        assert_eq!(&b, b"waited");
        vn.drain().unwrap();
        // The redo worker returns the applied transaction's object just after drain sees it.
        let t0 = Instant::now();
        while vn.inner.shm.free_count(shm::Res::Obj) == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "object not returned"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // None comes: a typed error after the wait, and the transaction is still open.
        vn.inner
            .shm
            .take(shm::Res::Obj, vn.inner.slot, u32::MAX, &mut hog);
        COMMIT_WAIT_MS.store(200, Ordering::Relaxed);
        let t = vn.nv_txbegin();
        // SAFETY: offset 8 + 5 bytes lies in the 4 KiB region.
        vn.nv_write(t, unsafe { r.as_ptr().add(8) }, b"later")
            .unwrap();
        match vn.nv_commit(t) {
            Err(VnvmError::NoLogObject { tid, .. }) => assert_eq!(tid, t),
            other => panic!("commit without log objects: {other:?}"),
        }
        vn.inner.shm.free(shm::Res::Obj, me, &hog);
        vn.nv_commit(t).unwrap();
        r.read(8, &mut b[..5]);
        assert_eq!(&b[..5], b"later");
        Arc::try_unwrap(vn).unwrap().nv_release().unwrap();
    }

    #[test]
    fn page_map_direct_and_far() {
        let mut m = PageMap::default();
        assert_eq!(m.get(&(0, 0)), None);
        m.insert((3, 5), 7);
        m.insert((3, DIRECT_PAGES + 9), 8);
        m.insert((0, 0), 1);
        assert_eq!(m.get(&(3, 5)), Some(&7));
        assert_eq!(m.get(&(3, 4)), None);
        assert_eq!(m.get(&(3, 1000)), None);
        assert_eq!(m.get(&(2, 5)), None);
        assert_eq!(m.get(&(3, DIRECT_PAGES + 9)), Some(&8));
        let mut p = m.pages_of(3);
        p.sort();
        assert_eq!(p, vec![7, 8]);
        m.remove(&(3, 5));
        m.remove(&(3, DIRECT_PAGES + 9));
        m.remove(&(9, 9));
        assert_eq!(m.get(&(3, 5)), None);
        assert!(m.pages_of(3).is_empty());
        assert_eq!(m.pages_of(0), vec![1]);
        m.forget_file(0);
        assert_eq!(m.get(&(0, 0)), None);
    }

    #[test]
    fn meta_runs_merge_neighbouring_objects() {
        let mut r = Vec::new();
        for off in [64u64, 80, 96, 112, 128, 512, 520] {
            add_run(&mut r, off, 8);
        }
        assert_eq!(r, vec![(64, 136), (512, 528)]);
    }
}
