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
//! z-READ (Ch. 4) is the other half: [`ZFile::zread`] returns views into the page cache without
//! a copy, [`ZFile::zread_into`] remaps a caller's buffer onto it copy-on-write where the loss
//! model expects that to pay, under a read lease that keeps both consistent.
//!
//! Files: [`sys`] (the system calls), [`file`] (the data file, buffered and direct),
//! [`pool`] (frames, table, replacement, the modes' I/O paths), [`zread`] (views, remapped
//! buffers, privatisation), [`model`] (the loss model), [`lease`] (the lease-break watcher),
//! [`guard`] (the SIGBUS guard), [`error`].

pub mod error;
pub mod file;
pub mod guard;
pub mod lease;
pub mod model;
pub mod pool;
pub mod sys;
pub mod zread;

pub use error::{Error, Result};
pub use file::DataFile;
pub use model::Model;
pub use pool::{
    Access, AfterHit, ColdRead, EvictClean, Mode, Options, PageGuard, Pool, Probe, RawPin, Stats,
};
pub use sys::CacheStat;
pub use zread::{zforget, zread, zread_into, View, ZFile, ZOptions, ZStats, ZeroCopy};
