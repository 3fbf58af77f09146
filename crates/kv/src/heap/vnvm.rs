//! The durable engine: the heap is one private vnvm region (its backing file `heap.data` in
//! the data directory, the instance's NVM log and write-cache pools in `DIR/vnvm`). Every write
//! command is one vnvm transaction; `nv_commit` returns once it is durable.
//!
//! # Creating and opening
//!
//! [`VnvmEngine::create`] makes a new instance, only in an empty or nonexistent directory;
//! [`VnvmEngine::open`] opens an existing one and never creates anything: a directory holding
//! only part of an instance (a file of [`INSTANCE_FILES`] missing, empty, or a heap file whose
//! header is zero or foreign) is refused before anything in it is written, naming the file and
//! saying how to recover or start afresh. (vnvm's `nv_init` alone would create missing pools,
//! and the heap would format a zeroed heap file: a damaged instance would come up empty.)

use super::{Engine, EngineInfo, HeapError, Result, TxMemory};
use std::path::{Path, PathBuf};
use tiermem_vnvm::alloc::VnvmMemory;
use tiermem_vnvm::{nv_init, Mode, Region, Tid, Vnvm, VnvmConfig, VnvmError};

/// Sizes of the durable engine.
#[derive(Clone, Debug)]
pub struct VnvmEngineConfig {
    /// Data directory: `heap.data` (the backing file) and `vnvm/` (the pools).
    pub dir: PathBuf,
    /// Bytes of the heap (the region); the backing file is sparse.
    pub heap_size: u64,
    /// Bytes of NVM log (default 64 MiB).
    pub log_size: u64,
    /// Bytes of NVM write cache (default 64 MiB).
    pub cache_size: u64,
}

/// What `open` found and did, for the start-up log.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    /// The recovery run before opening (`None`: a new instance). `was_clean == false` means
    /// the last run ended without a clean shutdown (kill -9, crash) and its dirty cache pages
    /// and committed logs were applied to the heap file.
    pub recovery: Option<tiermem_vnvm::RecoveryReport>,
    /// The heap file existed (data from an earlier run).
    pub existing: bool,
}

/// The files of an instance, relative to its data directory: the heap file, its checksum
/// table (without it vnvm could not tell a damaged heap page from a good one) and vnvm's pools.
pub const INSTANCE_FILES: [&str; 5] = [
    "heap.data",
    "heap.data.vnvm-crc",
    "vnvm/meta.pool",
    "vnvm/log.pool",
    "vnvm/cache.pool",
];

/// How to start afresh, for refusals.
fn afresh(dir: &Path) -> String {
    format!(
        "to start afresh instead, move {} away (or choose another directory), then start with \
         --new (setting `new yes`)",
        dir.display()
    )
}

/// The durable engine.
pub struct VnvmEngine {
    // Field order: the region must go before the instance releases.
    region: Region,
    vn: Option<Vnvm>,
    cfg: VnvmEngineConfig,
    report: OpenReport,
}

impl VnvmEngine {
    /// Create a new instance in `cfg.dir`, which must be empty or not exist (it is created).
    ///
    /// Errors: the directory holds anything (nothing in it is touched), cannot be created or
    /// read; vnvm errors.
    pub fn create(cfg: &VnvmEngineConfig) -> Result<VnvmEngine> {
        let dir = &cfg.dir;
        match std::fs::read_dir(dir) {
            Ok(mut entries) => {
                if let Some(entry) = entries.next() {
                    let name = entry
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .unwrap_or_else(|e| format!("(unreadable: {e})"));
                    return Err(HeapError::Engine(format!(
                        "{} is not empty (it holds {name}): a new instance is created only in \
                         an empty directory, and nothing was changed. To open the instance it \
                         holds, start without --new; {}",
                        dir.display(),
                        afresh(dir)
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    HeapError::Engine(format!(
                        "cannot create data directory {}: {e}",
                        dir.display()
                    ))
                })?;
            }
            Err(e) => {
                return Err(HeapError::Engine(format!(
                    "cannot read data directory {}: {e}",
                    dir.display()
                )))
            }
        }
        Self::start(cfg, None)
    }

    /// Open the existing instance in `cfg.dir`; never creates one. After an unclean shutdown
    /// it recovers the instance first (dirty cache pages, then committed logs), so the heap
    /// file holds every acknowledged write.
    ///
    /// Errors (nothing in the directory is changed by a refusal): the directory does not
    /// exist or is empty (start with `--new`); a file of [`INSTANCE_FILES`] is missing or
    /// empty; the heap file's header is all zero or not a tiermem heap's (checked after
    /// recovery); every error of vnvm's recovery (a damaged pool).
    pub fn open(cfg: &VnvmEngineConfig) -> Result<VnvmEngine> {
        check_instance(&cfg.dir)?;
        let pools = cfg.dir.join("vnvm");
        // Recover explicitly (nv_init would do it too) to report what was recovered.
        let recovery = tiermem_vnvm::recover(&pools).map_err(|e| {
            HeapError::Engine(format!(
                "recovering the vnvm instance in {}: {e}. Nothing was served. `tiermem vnvm \
                 info {}` shows what the pools hold; {}",
                pools.display(),
                pools.display(),
                afresh(&cfg.dir)
            ))
        })?;
        check_heap_header(&cfg.dir, recovery.was_clean)?;
        Self::start(cfg, Some(recovery))
    }

    fn start(
        cfg: &VnvmEngineConfig,
        recovery: Option<tiermem_vnvm::RecoveryReport>,
    ) -> Result<VnvmEngine> {
        let pools = cfg.dir.join("vnvm");
        let vcfg = VnvmConfig {
            dir: pools.clone(),
            log_size: cfg.log_size,
            cache_size: cfg.cache_size,
            ..VnvmConfig::default()
        };
        let vn = nv_init(&vcfg)?;
        let path = heap_path(&cfg.dir);
        let existing = path.exists();
        let size = if existing {
            std::fs::metadata(&path)
                .map_err(|e| HeapError::Engine(format!("{}: {e}", path.display())))?
                .len()
        } else {
            cfg.heap_size
        };
        if existing && size != cfg.heap_size {
            eprintln!(
                "tiermem-kv: {} holds a {}-byte heap; keeping that size (heap-size {} ignored)",
                path.display(),
                size,
                cfg.heap_size
            );
        }
        let region = vn.nv_allocate(&path, size as usize, Mode::Private)?;
        Ok(VnvmEngine {
            region,
            vn: Some(vn),
            cfg: cfg.clone(),
            report: OpenReport { recovery, existing },
        })
    }

    /// What opening found.
    pub fn report(&self) -> &OpenReport {
        &self.report
    }

    /// The region as vnvm's allocator adapter ([`VnvmMemory`]).
    fn mem(&self) -> VnvmMemory<'_> {
        VnvmMemory {
            vn: self.vn(),
            region: &self.region,
        }
    }

    fn vn(&self) -> &Vnvm {
        // (`vn` is taken only in Drop: every other method runs while it is set.)
        self.vn.as_ref().expect("vnvm instance released")
    }
}

/// Refuses a data directory that does not hold a whole instance (see [`VnvmEngine::open`]);
/// reads only file metadata.
fn check_instance(dir: &Path) -> Result<()> {
    let new_hint = "to create a new instance there, start with --new (setting `new yes`)";
    let mut entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(HeapError::Engine(format!(
                "{} does not exist: there is no instance to open; {new_hint}",
                dir.display()
            )))
        }
        Err(e) => {
            return Err(HeapError::Engine(format!(
                "cannot read data directory {}: {e}",
                dir.display()
            )))
        }
    };
    if entries.next().is_none() {
        return Err(HeapError::Engine(format!(
            "{} is empty: there is no instance to open; {new_hint}",
            dir.display()
        )));
    }
    let mut problems = Vec::new();
    for f in INSTANCE_FILES {
        let p = dir.join(f);
        match std::fs::metadata(&p) {
            Ok(m) if !m.is_file() => problems.push(format!("{} is not a file", p.display())),
            Ok(m) if m.len() == 0 => problems.push(format!("{} is empty (0 bytes)", p.display())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                problems.push(format!("{} is missing", p.display()))
            }
            Err(e) => problems.push(format!("{}: {e}", p.display())),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(HeapError::Engine(format!(
        "{} holds part of a tiermem-kv instance, but {}: refusing to start over it (nothing \
         was changed). If the file was moved away, put it back and start again (a crashed \
         instance is recovered at start, or by `tiermem vnvm recover {}`); {}",
        dir.display(),
        problems.join(", "),
        dir.join("vnvm").display(),
        afresh(dir)
    )))
}

/// Refuses a heap file whose header is all zero (the heap would be formatted: an empty
/// database over a lost one) or is not a tiermem heap's. Run after recovery, when the file
/// holds every committed write (`was_clean`: recovery found a clean shutdown, wrote nothing).
fn check_heap_header(dir: &Path, was_clean: bool) -> Result<()> {
    use std::io::Read;
    let path = heap_path(dir);
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(&path)
        .and_then(|f| f.take(4096).read_to_end(&mut head))
        .map_err(|e| HeapError::Engine(format!("reading {}: {e}", path.display())))?;
    let damaged = |what: String| {
        Err(HeapError::Engine(format!(
            "{} is damaged: {what}; refusing to serve it as an empty database ({}). If a good \
             copy of it exists, put it back and start again; {}",
            path.display(),
            if was_clean {
                "nothing was changed"
            } else {
                "only vnvm's recovery of the crashed instance wrote to it"
            },
            afresh(dir)
        )))
    };
    if head.iter().all(|&b| b == 0) {
        return damaged(format!(
            "its first {} bytes, which hold the heap header, are all zero",
            head.len()
        ));
    }
    let magic = head
        .get(..8)
        .and_then(|m| <[u8; 8]>::try_from(m).ok())
        .map(u64::from_le_bytes);
    if magic != Some(tiermem_vnvm::alloc::HEAP_MAGIC) {
        return damaged(format!(
            "it does not start with a tiermem heap's magic number (found {:#018x})",
            magic.unwrap_or(0)
        ));
    }
    Ok(())
}

/// The heap's backing file in data directory `dir`.
pub fn heap_path(dir: &Path) -> PathBuf {
    dir.join("heap.data")
}

impl Engine for VnvmEngine {
    fn memory(&self) -> &dyn TxMemory {
        self
    }
    fn writes_visible_before_commit(&self) -> bool {
        false
    }
    fn max_tx_bytes(&self) -> Option<u64> {
        // Half the log (the rest holds committed transactions the redo worker has not applied
        // yet, and the allocator's metadata writes) and at most half the write cache.
        Some(self.cfg.log_size.min(self.cfg.cache_size) / 2)
    }
    fn info(&self) -> EngineInfo {
        let s = self.vn().stats();
        EngineInfo {
            name: "vnvm",
            durable: true,
            location: format!(
                "heap {} ({} MiB, vnvm private region); NVM log and write cache pools in {}",
                heap_path(&self.cfg.dir).display(),
                self.region.len() >> 20,
                self.vn().dir().display()
            ),
            heap_bytes: self.region.len() as u64,
            fields: vec![
                ("vnvm_dir".into(), self.vn().dir().display().to_string()),
                ("vnvm_log_pages".into(), s.log_pages.to_string()),
                ("vnvm_free_log_pages".into(), s.free_log_pages.to_string()),
                ("vnvm_cache_pages".into(), s.cache_pages.to_string()),
                ("vnvm_dirty_pages".into(), s.dirty_pages.to_string()),
                ("vnvm_commits".into(), s.commits.to_string()),
                ("vnvm_applied".into(), s.applied.to_string()),
                (
                    "vnvm_pages_written_back".into(),
                    s.pages_written_back.to_string(),
                ),
                (
                    "vnvm_recovered_at_start".into(),
                    self.report
                        .recovery
                        .as_ref()
                        .map_or(0, |r| u8::from(!r.was_clean))
                        .to_string(),
                ),
            ],
        }
    }
    fn persist_error(&self) -> Option<String> {
        self.vn().writeback_error()
    }
    fn sync(&self) -> Result<()> {
        if let Some(e) = self.vn().writeback_error() {
            return Err(HeapError::Persist(e));
        }
        self.vn()
            .drain()
            .map_err(|e| match self.vn().writeback_error() {
                Some(w) => HeapError::Persist(w),
                None => e.into(),
            })
    }
    fn close(&self) -> Result<()> {
        self.vn().quiesce()?;
        Ok(())
    }
}

/// The heap's memory is the region as vnvm's own adapter sees it; every call goes through it.
impl TxMemory for VnvmEngine {
    fn base(&self) -> *const u8 {
        self.mem().base()
    }
    fn len(&self) -> usize {
        self.mem().len()
    }
    fn describe(&self) -> String {
        self.mem().describe()
    }
    fn begin(&self) -> Tid {
        self.mem().begin()
    }
    fn write(&self, tid: Tid, off: u64, src: &[u8]) -> std::result::Result<usize, VnvmError> {
        self.mem().write(tid, off, src)
    }
    fn wait_space(&self, timeout: std::time::Duration) -> bool {
        self.mem().wait_space(timeout)
    }
    fn commit(&self, tid: Tid) -> std::result::Result<(), VnvmError> {
        self.mem().commit(tid)
    }
    fn commit_staged(&self, tid: Tid) -> std::result::Result<u64, VnvmError> {
        self.mem().commit_staged(tid)
    }
    fn sync_to(&self, ticket: u64) -> std::result::Result<(), VnvmError> {
        self.mem().sync_to(ticket)
    }
    fn staged_ticket(&self) -> u64 {
        self.mem().staged_ticket()
    }
    fn durable_ticket(&self) -> u64 {
        self.mem().durable_ticket()
    }
    fn abort(&self, tid: Tid) -> std::result::Result<(), VnvmError> {
        self.mem().abort(tid)
    }
}

impl Drop for VnvmEngine {
    fn drop(&mut self) {
        if let Some(vn) = self.vn.take() {
            let _ = vn.nv_release();
        }
    }
}
