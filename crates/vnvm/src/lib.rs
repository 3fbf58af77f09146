//! # tiermem-vnvm — vNVML: virtual NVM with redo-logged transactions
//!
//! An implementation of vNVML (thesis 000, chapter 2) over tiermem's media layer. Applications
//! get regions backed by ordinary files; they **read with plain loads** through a read-only
//! DRAM view and **write through transactions** whose redo logs go to an NVM log pool. A redo
//! worker applies committed logs to an NVM write cache; a writeback worker writes dirty cache
//! pages to the files. The NVM pools can be much smaller than the regions.
//!
//! Private and shared regions, many threads, up to [`MAX_USERS`] processes per instance. See
//! `docs/vnvm.md` for the design; the source is split by concern (`config`, `instance`, `region`,
//! `tx`, `cache`, `redo`, `writeback`, `recovery`, `members`, `shared`, `sums`, …).
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
//! * **Group commit.** `nv_commit_staged` commits without waiting for durability (visible at
//!   once, logs written) and returns a ticket; `nv_sync(ticket)` links every transaction
//!   staged so far into the committed list with one log write-back and one persisted store.
//!   `nv_commit` is the two in a row. A crash loses a suffix of the unsynced transactions,
//!   never part of one. On msync-backed pools (a disk file system) a sync appends one record
//!   to the commit journal (`journal`: the staged log bytes, log objects and the new list
//!   word) with one fdatasync; the pools themselves are made durable only at checkpoints,
//!   and recovery replays the journal first. Such an instance takes one process at a time.
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
//! ## Implementation notes
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
mod cache;
mod chunksum;
mod config;
mod crc;
mod dram;
mod error;
pub mod inspect;
mod instance;
mod journal;
mod layout;
mod members;
mod recovery;
mod redo;
mod region;
pub mod scrub;
mod shared;
mod shm;
mod sums;
mod tx;
mod writeback;

pub use config::{Mode, VnvmConfig};
pub use error::{Result, VnvmError};
pub use inspect::{inspect, InstanceInfo, InstanceState, LiveInfo};
pub use instance::nv_init;
pub use recovery::{recover, RecoveryReport};
pub use region::Region;
pub use scrub::{scrub, ScrubReport};
pub use sums::{sidecar_path as checksum_table_path, SUFFIX as CHECKSUM_TABLE_SUFFIX};

use crate::cache::*;
use crate::dram::DramCache;
use crate::error::io_err;
use crate::instance::*;
use crate::layout::*;
use crate::recovery::*;
use crate::region::*;
use crate::tx::*;
use crate::writeback::*;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiermem_media::{Pool, PoolKind, PoolOptions, PowerDomain};

/// The path of the shared-memory object of the instance in directory `dir`
/// (`/dev/shm/tiermem-vnvm-<hash of the directory>`), whether the instance exists or not. Its
/// last process removes it at release; one killed leaves it, and a later open of the same
/// directory takes it over. A supervisor that killed every process of an instance it then
/// deletes removes it with this path.
pub fn shm_object_path(dir: &Path) -> PathBuf {
    let n = shm::shm_name(dir);
    Path::new("/dev/shm").join(n.to_str().unwrap_or("?").trim_start_matches('/'))
}

/// A transaction id, unique within an instance's life.
pub type Tid = u64;

/// Processes (or `Vnvm` handles) that can use one instance at the same time.
pub const MAX_USERS: usize = shm::MAX_APPS;
/// Shared regions an instance can have allocated at the same time.
pub const MAX_SHARED_REGIONS: usize = shm::MAX_SHARED;

/// Committed transactions the redo worker applies at most per batch (one publish, one pop);
/// a commit that finds this many waiting wakes the worker at once.
pub const REDO_BATCH: usize = 64;

/// [`REDO_BATCH`] on msync-backed pools (a disk file system): a batch there costs a few device
/// cache flushes (fdatasync of the cache and meta pools, the list word's msync), so the worker
/// takes many more transactions per batch, and polls every [`REDO_POLL_MSYNC`].
pub const REDO_BATCH_MSYNC: usize = 4096;

/// [`REDO_POLL`] on msync-backed pools.
pub const REDO_POLL_MSYNC: Duration = Duration::from_millis(50);

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
        shm_object_path(&self.inner.dir)
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
            // Staged commits hold log pages the redo worker cannot free until they are linked.
            if i.sync_all().is_err() {
                return false;
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

    /// Group commit, first half: commit `tid` as [`Vnvm::nv_commit`] does — its writes are
    /// visible on return, in commit order with every other commit — but **not yet durable**:
    /// it is linked into the persistent committed list by [`Vnvm::nv_sync`] of the returned
    /// ticket (or of a later one), which links every transaction staged before it with one
    /// log write-back and one persisted store. So N commits followed by one `nv_sync` pay one
    /// durability barrier (on a disk-backed instance one fdatasync of the log files and one of
    /// the list word, where N `nv_commit`s pay N of each). A crash before the sync loses the
    /// transaction and every one staged after it, never a part of one. Whoever reports the
    /// transaction's outcome (or anything read after it) must `nv_sync` first. Staged
    /// transactions are synced anyway when log space runs short, by [`Vnvm::drain`] and
    /// release, and by the redo worker once they have waited a poll ([`REDO_POLL`]) unsynced.
    /// Returns the ticket; 0 means durable already (nothing logged, or a shared region's
    /// commit, which is always synchronous).
    ///
    /// Errors: those of [`Vnvm::nv_commit`] before the link.
    pub fn nv_commit_staged(&self, tid: Tid) -> Result<u64> {
        self.inner.commit_staged(tid)
    }

    /// Group commit, second half: make every transaction staged up to `ticket` durable (see
    /// [`Vnvm::nv_commit_staged`]). A caller whose ticket is durable already returns at once;
    /// one that a sync in progress covers waits for it.
    ///
    /// Errors: the write-back or the list word's persist failing ([`VnvmError::Media`]); the
    /// transactions then stay staged (visible, not durable) and a later call retries.
    pub fn nv_sync(&self, ticket: u64) -> Result<()> {
        self.inner.sync_to(ticket)
    }

    /// The ticket of the last transaction staged so far by this handle (0: none): `nv_sync`
    /// of it makes everything committed so far durable.
    pub fn nv_staged_ticket(&self) -> u64 {
        self.inner.staged_ticket()
    }

    /// The highest ticket known durable (every ticket up to it is): `nv_sync` of a ticket at
    /// or below it returns at once, and when it is at least [`Vnvm::nv_staged_ticket`]
    /// nothing this handle committed waits for durability. One atomic load.
    pub fn nv_durable_ticket(&self) -> u64 {
        self.inner
            .durable_seq
            .load(std::sync::atomic::Ordering::SeqCst)
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
        // Staged commits become durable (and then applied) like every other one.
        let synced = i.sync_all();
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
        synced?;
        if !i
            .domains
            .iter()
            .all(|d| d.lock().queue.is_empty() && d.lock().staged.is_empty())
        {
            return Err(VnvmError::CacheFull(
                "redo worker stopped before applying every committed log".into(),
            ));
        }
        if let Some(j) = &i.journal {
            // Journal mode: release the last unlinked log space, then a checkpoint, so that
            // the pools are durable before the instance is marked clean (a clean instance's
            // journal is not replayed).
            i.sync_all()?;
            i.log.persist(0, i.log.data_len())?;
            i.meta.persist(0, i.meta.data_len())?;
            j.lock().restart()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Overrides [`COMMIT_WAIT`] when not 0.
    pub(crate) static COMMIT_WAIT_MS: std::sync::atomic::AtomicU64 =
        std::sync::atomic::AtomicU64::new(0);

    /// A small instance's configuration on a disk file system (msync-backed pools, so the
    /// commit journal and the slow redo poll): 16 log pages, 16 cache pages, the redo worker
    /// paused or not. Returns the temporary directory (the instance is its `inst`), the
    /// configuration and the path of a data file beside the instance.
    pub(crate) fn small_disk_instance(
        prefix: &str,
        redo_paused: bool,
    ) -> (tempfile::TempDir, VnvmConfig, std::path::PathBuf) {
        let d = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/var/tmp")
            .unwrap();
        let cfg = VnvmConfig {
            dir: d.path().join("inst"),
            log_size: 16 * 4096,
            cache_size: 16 * 4096,
            redo_paused,
            ..VnvmConfig::default()
        };
        let file = d.path().join("data");
        (d, cfg, file)
    }

    /// Log `len` bytes of `byte` at offset `off` of region `r` in transaction `tid` (in one
    /// `nv_write`: the tests keep them within one log page).
    pub(crate) fn write_fill(vn: &Vnvm, r: &Region, tid: Tid, off: usize, byte: u8, len: usize) {
        assert!(off + len <= r.len(), "the write lies in the region");
        // SAFETY: off + len lies within the region (asserted above).
        let n = vn
            .nv_write(tid, unsafe { r.as_ptr().add(off) }, &vec![byte; len])
            .unwrap();
        assert_eq!(n, len);
    }

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
