//! An instance's life: creating or opening its pools, joining the shared-memory object as a user,
//! starting the workers ([`nv_init`]), and the process-wide state they share (`Inner`).

use super::*;

pub(crate) struct Inner {
    pub(crate) dir: PathBuf,
    pub(crate) cfg: VnvmConfig,
    pub(crate) geo: Geometry,
    pub(crate) meta: Pool,
    pub(crate) log: Pool,
    pub(crate) cache: Pool,
    /// The instance's shared-memory object (free stacks, users, tids, shared regions).
    pub(crate) shm: shm::Shm,
    /// This process's user slot; its app id is `slot + 1`.
    pub(crate) slot: usize,
    /// The instance `lock` file; holds this user's liveness lock (OFD lock on byte 1 + slot).
    pub(crate) lockf: File,
    /// Mode of the files and objects this user creates (0600, or 0660 with group sharing).
    pub(crate) perm: u32,
    /// Shared regions want a flush (set by commits past the threshold and log waiters).
    pub(crate) flush_req: AtomicBool,
    pub(crate) open: Vec<Mutex<OpenList>>,
    pub(crate) domains: Vec<Mutex<CommitDomain>>,
    /// The last ticket handed out by a staged commit, and the last one made durable.
    pub(crate) staged_seq: AtomicU64,
    pub(crate) durable_seq: AtomicU64,
    /// One `sync_to` at a time.
    pub(crate) sync_lock: Mutex<()>,
    /// The commit journal (msync-backed pools only; see `journal`).
    pub(crate) journal: Option<Mutex<crate::journal::Journal>>,
    /// A `drain` waits: the redo worker takes batches at once, however small.
    pub(crate) drain_wanted: AtomicBool,
    /// Signalled when a committed transaction has been applied (drain waiters).
    pub(crate) applied_cv: Condvar,
    /// Applied transactions unlinked from the queue whose log pages and objects are still
    /// being freed: `drain` waits for them too.
    pub(crate) freeing: std::sync::atomic::AtomicUsize,
    /// Regions by file id.
    pub(crate) regions: RwLock<Vec<Option<Arc<RegionInner>>>>,
    pub(crate) cstate: Mutex<CacheState>,
    /// Signalled when pages become clean (redo waiting for space).
    pub(crate) space_cv: Condvar,
    /// Wakes the writeback worker.
    pub(crate) wb_cv: Condvar,
    /// Signalled when the writeback worker goes idle (quiesce waiters).
    pub(crate) wb_idle_cv: Condvar,
    pub(crate) redo_thread: std::sync::OnceLock<std::thread::Thread>,
    pub(crate) stop_redo: AtomicBool,
    pub(crate) stop_wb: AtomicBool,
    pub(crate) kill: AtomicBool,
    pub(crate) worker_error: Mutex<Option<String>>,
    /// The last writeback failed with an I/O error (a full or failing device): its text
    /// (operation, file, OS error). The writeback worker retries every [`WB_RETRY`] and clears
    /// it once a writeback succeeds; `wb_failing` mirrors `is_some()` for cheap checks.
    pub(crate) wb_error: Mutex<Option<String>>,
    pub(crate) wb_failing: AtomicBool,
    /// Tests only: run by a journal barrier between its append and taking the domain lock
    /// again (where the redo worker may pop), to make that interleaving happen on purpose.
    #[cfg(test)]
    pub(crate) after_journal_append: Mutex<Option<AfterAppend>>,
}

/// See [`Inner::after_journal_append`].
#[cfg(test)]
pub(crate) type AfterAppend = Box<dyn Fn(&Inner) + Send + Sync>;

pub(crate) fn create_pools(
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
pub(crate) fn perm_of(group: bool) -> u32 {
    if group {
        0o660
    } else {
        0o600
    }
}

/// Pre-fault a pool's data area ([`Pool::populate`]; a hint: failure is ignored).
pub(crate) fn populate(pool: &Pool) {
    let _ = pool.populate();
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
pub(crate) fn join(cfg: &VnvmConfig, dir: &Path, lockf: File) -> Result<Vnvm> {
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
        let pools = open_pools(dir, cfg.domain.as_ref())?;
        if pools.log.persist_method().is_msync() {
            // The live user's commit journal orders its pools' writes on its own.
            return Err(VnvmError::SingleProcess(dir.to_path_buf()));
        }
        (pools, shm)
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
        shm::forget_moved(dir, perm_of(cfg.group_shared));
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
    // Disk-backed pools: group commit writes a commit journal (see `journal`), started over
    // here (recovery replayed the last one). Its records assume a single user.
    let journal = if pools.log.persist_method().is_msync() {
        Some(Mutex::new(crate::journal::Journal::create(dir)?))
    } else {
        None
    };
    let Pools {
        meta, log, cache, ..
    } = pools;
    let inner = Arc::new(Inner {
        journal,
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
            staged: Vec::new(),
            staged_tail: 0,
            staged_ticket: 0,
            pending_free: Vec::new(),
            barriers: 0,
        })],
        staged_seq: AtomicU64::new(0),
        durable_seq: AtomicU64::new(0),
        sync_lock: Mutex::new(()),
        drain_wanted: AtomicBool::new(false),
        applied_cv: Condvar::new(),
        freeing: std::sync::atomic::AtomicUsize::new(0),
        regions: RwLock::new(vec![None; geo.max_files as usize]),
        cstate: Mutex::new(CacheState::new(geo.cache_pages)),
        space_cv: Condvar::new(),
        wb_cv: Condvar::new(),
        wb_idle_cv: Condvar::new(),
        redo_thread: std::sync::OnceLock::new(),
        stop_redo: AtomicBool::new(false),
        stop_wb: AtomicBool::new(false),
        kill: AtomicBool::new(false),
        #[cfg(test)]
        after_journal_append: Mutex::new(None),
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
