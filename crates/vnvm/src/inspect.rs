//! Read-only inspection of a vnvm instance (`tiermem vnvm info` and `tiermem vnvm stats`):
//! geometry, state, file records, committed-list occupancy and NVM-cache occupancy.
//!
//! [`inspect`] maps the pools **read-only** and never writes anything: not the pools, not the
//! backing files, not the instance's `lock` file (it does not even open it). It validates every
//! structure it reports exactly as [`recover`](crate::recover) does, so a damaged instance gives
//! the same [`VnvmError::Damaged`] (pool, structure, offset) that recovery would give.
//!
//! It works on a stopped instance (shut down cleanly or crashed) and on a live one. On a live
//! instance the persistent structures change while they are read: the committed lists are read
//! until two reads of the list words agree around a complete walk, and a structure that fails
//! validation is read again a few times before it is reported damaged (a file record being
//! written by `nv_allocate` at that moment would otherwise look torn). The numbers are then a
//! snapshot that may be out of date by the time they are printed.

use crate::error::{Result, VnvmError};
use crate::layout::FileRecord;
use crate::recovery::{
    cache_obj, check_cache_page, check_entry, committed_list, damaged, listed_writes, load_records,
    load_word, open_pools_with, read_clean, resolve, tx_entries, Pools, META,
};
use crate::Mode;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tiermem_media::OpenOptions;

/// Reads of a live instance before a validation failure is reported as damage.
const ATTEMPTS: u32 = 5;
/// Pause between two reads of a live instance.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Whether the instance was shut down cleanly (its persistent state word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Shut down cleanly by `nv_release` (or recovered, or never started): the files hold every
    /// committed transaction except those still listed in the committed lists.
    Clean,
    /// Started and not shut down cleanly: either a process is using it right now, or that
    /// process died (then the next `nv_init` or `tiermem vnvm recover` recovers it). The
    /// persistent state cannot tell the two apart; [`InstanceInfo::live`] can, once it is
    /// implemented.
    RunningOrCrashed,
}

/// The geometry of an instance (from its validated superblock) and the sizes of its pool files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceGeometry {
    /// On-disk format version of the instance (3: CRC32C of log entries, cache page records
    /// and contents, committed-list words; paths relative to the instance directory).
    pub format_version: u32,
    /// Bytes per log page and per cache page (4096 or 8192).
    pub page_size: u32,
    /// Log pages in `log.pool`.
    pub log_pages: u32,
    /// NVM write-cache pages in `cache.pool`.
    pub cache_pages: u32,
    /// Slots of the file-record table (regions the instance can have allocated at once).
    pub max_files: u32,
    /// Committed-list slots (log domains) in `meta.pool`.
    pub max_domains: u32,
    /// Log-object slots in `meta.pool` (committed transactions the lists can hold at once).
    pub log_objects: u32,
    /// Size of the `meta.pool` file in bytes (4 KiB pool header included).
    pub meta_pool_bytes: u64,
    /// Size of the `log.pool` file in bytes (4 KiB pool header included).
    pub log_pool_bytes: u64,
    /// Size of the `cache.pool` file in bytes (4 KiB pool header included).
    pub cache_pool_bytes: u64,
}

/// One valid file record: a region's backing file as the instance knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// The file id (slot in the record table; log entries and cache pages name files by it).
    pub id: u32,
    /// The mode the region was allocated with.
    pub mode: Mode,
    /// The region size in bytes.
    pub size: u64,
    /// The backing file (resolved against the instance directory when stored relative).
    pub path: PathBuf,
    /// True when the record stores the path relative to the instance directory (the file
    /// moves with the instance).
    pub relative: bool,
    /// The file's checksum table (`<file>.vnvm-crc`), when it exists (private regions).
    pub checksum_table: Option<PathBuf>,
}

/// One non-empty committed list: transactions committed (durable) but not yet applied to the
/// NVM cache by a redo worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomainInfo {
    /// The log domain (committed-list slot).
    pub domain: u32,
    /// Committed transactions in the list.
    pub transactions: usize,
    /// Log pages those transactions hold.
    pub log_pages: u32,
}

/// Occupancy of the NVM write cache (from the cache page objects).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheInfo {
    /// Cache pages in the pool (same as [`InstanceGeometry::cache_pages`]).
    pub pages: u32,
    /// Pages whose page object names a file page (nonzero page word). `mapped ≤ pages`.
    pub mapped: u32,
    /// Mapped pages with the dirty bit set: newer in NVM than in their file. `dirty ≤ mapped`.
    pub dirty: u32,
    /// Bytes of the mapped pages that hold data: set bits of their valid-chunk masks × chunk
    /// size (page size / 64). At most `mapped × page size`.
    pub valid_bytes: u64,
    /// `dirty / pages` (0.0 ..= 1.0).
    pub dirty_ratio: f64,
    /// The dirty pages, as (file id, page index in the file), in cache page order. After a
    /// crash these file pages are rebuilt from the cache by recovery; their backing-file bytes
    /// outside the page's valid chunks are not verified (see docs/vnvm.md, "Checksums").
    pub dirty_pages: Vec<(u32, u64)>,
    /// The NVM cache page holding each of [`dirty_pages`](Self::dirty_pages) (same order).
    pub dirty_cache_pages: Vec<u32>,
}

/// Worker activity of one process (app) using a live instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppLive {
    /// The app id the instance gave the process.
    pub app_id: u32,
    /// Its process id.
    pub pid: u32,
    /// Transactions it committed (with at least one write).
    pub commits: u64,
    /// Committed transactions its redo worker applied to the NVM cache.
    pub applied: u64,
    /// Cache pages its writeback worker wrote back to files.
    pub pages_written_back: u64,
    /// Transactions its redo worker aborted for their age.
    pub age_aborts: u64,
    /// Shared-region flushes it ran.
    pub flushes: u64,
    /// Log pages it holds (open and committed transactions).
    pub log_pages_held: u32,
    /// Cache pages it holds.
    pub cache_pages_held: u32,
}

/// The volatile state of a live instance (its shared-memory object): who uses it and how
/// busy its workers are. The counters are kept per running process and vanish with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveInfo {
    /// Processes attached to the instance.
    pub users: u32,
    /// One entry per attached process.
    pub apps: Vec<AppLive>,
    /// Log pages on the free list.
    pub free_log_pages: u32,
    /// Cache pages on the free list.
    pub free_cache_pages: u32,
}

/// What [`inspect`] found in an instance directory.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceInfo {
    /// The instance directory, as given.
    pub dir: PathBuf,
    /// The persistent state word.
    pub state: InstanceState,
    /// Geometry and pool sizes.
    pub geometry: InstanceGeometry,
    /// The valid file records, by id.
    pub files: Vec<FileInfo>,
    /// The non-empty committed lists, by domain.
    pub domains: Vec<DomainInfo>,
    /// Committed-but-unapplied transactions in all committed lists.
    pub committed_transactions: usize,
    /// Log pages held by those transactions. `≤ log_pages`.
    pub committed_log_pages: u32,
    /// The file pages (file id, page index) those transactions write, sorted: recovery
    /// replays them over what the files and dirty cache pages hold.
    pub listed_pages: Vec<(u32, u64)>,
    /// NVM write-cache occupancy.
    pub cache: CacheInfo,
    /// The live processes' view, when a process uses the instance and its shared-memory object
    /// can be read; `None` when no process uses it.
    pub live: Option<LiveInfo>,
}

/// Inspect the instance in `dir` without writing anything (see the module docs): validate its
/// pools and persistent structures like [`recover`](crate::recover) does and report its
/// geometry, state, file records, committed lists and cache occupancy.
///
/// Works on a stopped or a live instance; never locks the `lock` file (it only reads the users' liveness), so it neither waits for
/// nor blocks a process that uses the instance.
///
/// Errors: [`VnvmError::NoInstance`] if `dir` has no `meta.pool`; media errors for a missing,
/// truncated, foreign or other-version pool; [`VnvmError::Damaged`] naming the pool, the
/// structure and its offset when validation fails (on a live instance: only if it still fails
/// after a few re-reads).
pub fn inspect(dir: impl AsRef<Path>) -> Result<InstanceInfo> {
    let dir = dir.as_ref();
    if !dir.join(META).exists() {
        return Err(VnvmError::NoInstance {
            dir: dir.to_path_buf(),
        });
    }
    let p = open_pools_with(dir, &OpenOptions::default().writable(false))?;
    let mut fallback = None;
    let mut last_err = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(RETRY_PAUSE);
        }
        let words_before = list_words(&p);
        match read_once(dir, &p) {
            // A clean instance has no writer; a live one is consistent if the lists stood still.
            Ok(info) if info.state == InstanceState::Clean || list_words(&p) == words_before => {
                return Ok(info)
            }
            Ok(info) => fallback = Some(info),
            Err(e @ VnvmError::Damaged { .. }) => {
                // Damage on a clean instance is real; on a running one it may be a torn read.
                if read_clean(&p)? {
                    return Err(e);
                }
                last_err = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    match (fallback, last_err) {
        (Some(info), _) => Ok(info),
        (None, Some(e)) => Err(e),
        (None, None) => unreachable!("every attempt returns or records a result"),
    }
}

/// The committed-list words of every domain.
fn list_words(p: &Pools) -> Vec<u64> {
    (0..p.geo.max_domains)
        .map(|d| load_word(&p.meta, p.geo.domain_off(d)))
        .collect()
}

/// One complete read and validation of the instance.
fn read_once(dir: &Path, p: &Pools) -> Result<InstanceInfo> {
    crate::recovery::check_domains(p)?;
    let g = &p.geo;
    let state = if read_clean(p)? {
        InstanceState::Clean
    } else {
        InstanceState::RunningOrCrashed
    };
    let records = load_records(&p.meta, &p.geo)?;
    let files = file_infos(p, &records)?;

    let check = |f: u32, o: u64, l: u32| check_entry(&records, f, o, l);
    let mut seen = HashSet::new();
    let mut listed = Vec::new();
    let mut domains = Vec::new();
    for d in 0..g.max_domains {
        let list = committed_list(&p.meta, &p.geo, d)?;
        if list.is_empty() {
            continue;
        }
        let mut log_pages = 0u32;
        for (idx, obj) in &list {
            // Validates the transaction's pages and entries (and that no page is used twice).
            listed.extend(tx_entries(
                &p.meta, &p.log, &p.geo, *idx, obj, &mut seen, &check,
            )?);
            log_pages += obj.npages;
        }
        domains.push(DomainInfo {
            domain: d,
            transactions: list.len(),
            log_pages,
        });
    }

    let mut mapped = 0u32;
    let mut dirty = 0u32;
    let mut dirty_pages = Vec::new();
    let mut dirty_cache_pages = Vec::new();
    let mut valid_chunks = 0u64;
    let writes = listed_writes(&p.log, &listed, g.page_size);
    for page in 0..g.cache_pages {
        if let Some((f, idx, d, rec)) = cache_obj(p, &records, page)? {
            mapped += 1;
            dirty += d as u32;
            valid_chunks += rec.mask.count_ones() as u64;
            if d {
                check_cache_page(&p.cache, &p.geo, page, (f, idx), &rec, &writes)?;
                dirty_pages.push((f, idx));
                dirty_cache_pages.push(page);
            }
        }
    }

    Ok(InstanceInfo {
        dir: dir.to_path_buf(),
        state,
        geometry: InstanceGeometry {
            format_version: crate::layout::FORMAT_VERSION,
            page_size: g.page_size,
            log_pages: g.log_pages,
            cache_pages: g.cache_pages,
            max_files: g.max_files,
            max_domains: g.max_domains,
            log_objects: g.log_objs,
            meta_pool_bytes: p.meta.header().pool_size,
            log_pool_bytes: p.log.header().pool_size,
            cache_pool_bytes: p.cache.header().pool_size,
        },
        files,
        committed_transactions: domains.iter().map(|d| d.transactions).sum(),
        committed_log_pages: domains.iter().map(|d| d.log_pages).sum(),
        listed_pages: {
            let mut v: Vec<(u32, u64)> = writes.keys().copied().collect();
            v.sort_unstable();
            v
        },
        domains,
        cache: CacheInfo {
            pages: g.cache_pages,
            mapped,
            dirty,
            valid_bytes: valid_chunks * g.chunk(),
            dirty_ratio: dirty as f64 / g.cache_pages as f64,
            dirty_pages,
            dirty_cache_pages,
        },
        live: live_info(dir, &p.geo),
    })
}

/// The records as [`FileInfo`]s sorted by id; a record with an unknown mode is damaged.
fn file_infos(p: &Pools, records: &HashMap<u32, FileRecord>) -> Result<Vec<FileInfo>> {
    let mut files = records
        .values()
        .map(|r| {
            let mode = match r.mode {
                1 => Mode::Private,
                2 => Mode::Shared,
                m => {
                    return Err(damaged(
                        &p.meta,
                        format!("file record {}", r.id),
                        p.geo.file_off(r.id),
                        format!("unknown mode {m}"),
                    ))
                }
            };
            let path = resolve(&p.dir, &r.path);
            let table = crate::sums::sidecar_path(&path);
            Ok(FileInfo {
                id: r.id,
                mode,
                size: r.size,
                relative: !Path::new(&r.path).is_absolute(),
                checksum_table: table.exists().then_some(table),
                path,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    files.sort_by_key(|f| f.id);
    Ok(files)
}

/// The live state of the instance in `dir` from its shared-memory object, or `None` when no
/// process uses it (or the object cannot be read). Must not write or create anything.
pub(crate) fn live_info(dir: &Path, geo: &crate::layout::Geometry) -> Option<LiveInfo> {
    use crate::shm::{Res, Shm, MAX_APPS, SLOT_LIVE};
    use std::sync::atomic::Ordering::Relaxed;
    // Read-only, never locked: only to probe the users' liveness locks.
    let lockf = std::fs::File::open(dir.join(crate::recovery::LOCK)).ok()?;
    let shm = Shm::open(dir, geo).ok()??;
    let apps: Vec<AppLive> = (0..MAX_APPS)
        .filter(|&s| {
            shm.app(s).state.load(Relaxed) == SLOT_LIVE && crate::shm::slot_alive(&lockf, s)
        })
        .map(|s| {
            let a = shm.app(s);
            AppLive {
                app_id: s as u32 + 1,
                pid: a.pid.load(Relaxed),
                commits: a.commits.load(Relaxed),
                applied: a.applied.load(Relaxed),
                pages_written_back: a.pages_written_back.load(Relaxed),
                age_aborts: a.age_aborts.load(Relaxed),
                flushes: a.flushes.load(Relaxed),
                log_pages_held: a.log_held.load(Relaxed),
                cache_pages_held: a.cache_held.load(Relaxed),
            }
        })
        .collect();
    if apps.is_empty() {
        return None;
    }
    Some(LiveInfo {
        users: apps.len() as u32,
        apps,
        free_log_pages: shm.free_count(Res::Log),
        free_cache_pages: shm.free_count(Res::Cache),
    })
}
