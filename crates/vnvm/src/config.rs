//! What an application configures: the region [`Mode`]s and [`VnvmConfig`] (sizes, thresholds,
//! worker periods, from code or `TIERMEM_VNVM_*` variables) and the pool geometry it implies.

use super::*;

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
    pub(crate) fn to_raw(self) -> u32 {
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

    pub(crate) fn geometry(&self) -> Result<Geometry> {
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
