//! The durable engine: the heap is one private vnvm region (its backing file `heap.data` in
//! the data directory, the instance's NVM log and write-cache pools in `DIR/vnvm`). Every write
//! command is one vnvm transaction; `nv_commit` returns once it is durable.

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

/// The durable engine.
pub struct VnvmEngine {
    // Field order: the region must go before the instance releases.
    region: Region,
    vn: Option<Vnvm>,
    cfg: VnvmEngineConfig,
    report: OpenReport,
}

impl VnvmEngine {
    /// Open (or create) the engine in `cfg.dir`. After an unclean shutdown `nv_init` recovers
    /// the instance first (dirty cache pages, then committed logs), so the heap file holds
    /// every acknowledged write.
    pub fn open(cfg: &VnvmEngineConfig) -> Result<VnvmEngine> {
        std::fs::create_dir_all(&cfg.dir).map_err(|e| {
            HeapError::Engine(format!(
                "cannot create data directory {}: {e}",
                cfg.dir.display()
            ))
        })?;
        let pools = cfg.dir.join("vnvm");
        // Recover explicitly (nv_init would do it too) to report what was recovered.
        let recovery = if pools.join("meta.pool").exists() {
            Some(tiermem_vnvm::recover(&pools)?)
        } else {
            None
        };
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
