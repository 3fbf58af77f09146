//! iocache: DBIO on a stock kernel — a database buffer pool whose victim cache is the page cache.
//!
//! A database with its own buffer pool either reads through the page cache (every pooled page
//! held twice) or with `O_DIRECT` (the memory its pool leaves unused by the file). DBIO (paper
//! `002`, Ch. 3) makes the page cache hold what the pool evicts, so that memory serves as a
//! second-level cache. The paper patches the kernel (`O_DBIO`, an evict-clean path that caches a
//! clean page without I/O); [`Pool`] does it with stock calls: `cachestat(2)` or
//! `preadv2(RWF_NOWAIT)` to learn whether a miss is cached, `O_DIRECT` for what is not,
//! buffered writes plus `sync_file_range` for dirty victims, a choice of [`EvictClean`] paths
//! for clean ones, and `POSIX_FADV_DONTNEED` trimming to keep the page cache's share of the
//! budget when no memory cgroup does.
//!
//! Files: [`sys`] (the system calls), [`file`] (the data file, buffered and direct),
//! [`pool`] (frames, table, replacement, the modes' I/O paths), [`error`].

pub mod error;
pub mod file;
pub mod pool;
pub mod sys;

pub use error::{Error, Result};
pub use file::DataFile;
pub use pool::{
    Access, AfterHit, ColdRead, EvictClean, Mode, Options, PageGuard, Pool, Probe, RawPin, Stats,
};
pub use sys::CacheStat;
