//! Typed errors of vnvm. Every variant says what went wrong and, where there is one, where.

use std::path::PathBuf;
use tiermem_media::MediaError;

/// Everything a vnvm call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum VnvmError {
    /// An error of the media layer (pool creation, opening, validation, persistence).
    #[error(transparent)]
    Media(#[from] MediaError),

    /// A system call on a backing file, memfd or mapping failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },

    /// The configuration is unusable.
    #[error("invalid vnvm configuration: {0}")]
    Config(String),

    /// The directory holds no vnvm instance (no `meta.pool`).
    #[error("{} holds no vnvm instance (meta.pool is missing): check the directory", dir.display())]
    NoInstance {
        /// The directory.
        dir: PathBuf,
    },

    /// `nv_write`'s destination range is not entirely inside one region of this instance.
    #[error(
        "destination {addr:#x}..+{len} is not inside any region of this vnvm instance \
         (nv_write only writes into regions returned by nv_allocate)"
    )]
    OutOfRegion {
        /// Start address of the rejected range.
        addr: usize,
        /// Length of the rejected range.
        len: usize,
    },

    /// The transaction id was never handed out by `nv_txbegin` of this instance.
    #[error("transaction {0} is unknown: it was never begun on this instance")]
    UnknownTx(u64),

    /// The transaction was already committed.
    #[error("transaction {0} is already committed")]
    TxCommitted(u64),

    /// The transaction was aborted (by `nv_abort`, or by the redo worker because it was older
    /// than the configured maximum age).
    #[error("transaction {tid} was aborted{}", if *by_age { " because it exceeded the maximum transaction age" } else { "" })]
    TxAborted {
        /// The transaction.
        tid: u64,
        /// True when the redo worker aborted it for its age.
        by_age: bool,
    },

    /// The transaction is finished but its outcome is no longer remembered.
    #[error("transaction {0} is no longer open (committed or aborted long ago)")]
    TxNotOpen(u64),

    /// No free log page: nothing could be logged. Wait with `nv_wait_log_space` and retry the
    /// rest of the write, or abort the transaction.
    #[error(
        "log full: no free log page ({logged} bytes of this write were logged); \
         wait with nv_wait_log_space or abort the transaction"
    )]
    LogFull {
        /// Bytes of the current write that were logged before the log filled up.
        logged: usize,
    },

    /// The NVM write cache cannot make progress (too small for the work, or a writeback
    /// failed).
    #[error("cache full: {0}")]
    CacheFull(String),

    /// A persistent structure failed validation. Nothing was written.
    #[error(
        "damaged {what} in {} at offset {offset}: {detail} (nothing was written; the data \
         are untouched)",
        path.display()
    )]
    Damaged {
        /// The pool file holding the structure.
        path: PathBuf,
        /// Which structure.
        what: String,
        /// Byte offset of the structure in the pool's data area.
        offset: u64,
        /// What is wrong with it.
        detail: String,
    },

    /// The instance is in use: recovery of a live instance, or every user slot taken.
    #[error("vnvm instance {} is in use by live processes (or all user slots are taken)", .0.display())]
    Busy(PathBuf),

    /// The instance lives on a disk file system (its pools are msync-backed, and its commit
    /// journal orders one process's writes) and another process uses it.
    #[error(
        "vnvm instance {} is on a disk file system and in use by another process: such an \
         instance (its commit journal) takes one process at a time",
        .0.display()
    )]
    SingleProcess(PathBuf),

    /// One transaction wrote into a shared region and into another region: the writes of a
    /// transaction that touches a shared region must all lie in that one region (thesis
    /// §2.4.4: each shared region has its own committed list).
    #[error(
        "transaction {tid} cannot write into {} as well: a transaction that writes a shared \
         region writes only that region",
        path.display()
    )]
    CrossRegion {
        /// The transaction.
        tid: u64,
        /// The region of the rejected write.
        path: PathBuf,
    },

    /// `nv_free` of a region into which an open transaction has written.
    #[error("region {} has open transactions that wrote into it: commit or abort them first", .0.display())]
    RegionBusy(PathBuf),

    /// The region was freed (or is being freed).
    #[error("region {} was freed", .0.display())]
    RegionFreed(PathBuf),

    /// `nv_commit` found no free log object within its wait: every log object belongs to a
    /// committed transaction not yet applied (private) or flushed (shared). Nothing was
    /// committed; the transaction is still open: retry `nv_commit`, or abort it.
    #[error(
        "transaction {tid} not committed: no free log object within {waited_ms} ms (committed \
         transactions await their redo or flush); it is still open: retry nv_commit or abort it"
    )]
    NoLogObject {
        /// The transaction.
        tid: u64,
        /// How long the commit waited.
        waited_ms: u64,
    },

    /// vnvm found its own volatile or shared state contradicting itself (a bug, or a process
    /// that scribbled over the shared-memory object). The committed logs are durable; recovery
    /// replays them.
    #[error("vnvm internal inconsistency: {0}")]
    Inconsistent(String),

    /// The file-record table is full or the path is unusable.
    #[error("cannot allocate region {}: {reason}", path.display())]
    Allocate {
        /// The backing file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Result type of vnvm.
pub type Result<T> = std::result::Result<T, VnvmError>;

pub(crate) fn io_err(
    op: &'static str,
    path: &std::path::Path,
    source: std::io::Error,
) -> VnvmError {
    VnvmError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}
