//! Errors of the persistent heap.

use std::path::PathBuf;

/// Everything that can go wrong in `tiermem-pheap`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller-supplied argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The heap has no free pages left for this request.
    #[error("out of heap memory: {requested} bytes requested, heap capacity {capacity} bytes")]
    OutOfMemory {
        /// Bytes requested.
        requested: usize,
        /// Heap capacity in bytes.
        capacity: usize,
    },
    /// The pointer is not the start of a live object of this heap (in any view).
    #[error("pointer {0:#x} is not the start of a live object of this heap")]
    InvalidPointer(usize),
    /// A named object with this name already exists.
    #[error("an object named {0:?} already exists")]
    NameTaken(String),
    /// No object has this name.
    #[error("no object named {0:?}")]
    NoSuchName(String),
    /// The virtual addresses the heap was created at are taken in this process.
    #[error(
        "cannot map heap view {view} at its recorded address {addr:#x} (+{len:#x}): {reason}; \
         the heap must be mapped at the same virtual addresses it was created at — open it in a \
         process where that range is free"
    )]
    AddressTaken {
        /// View index (0 = library view, 1.. = user views).
        view: usize,
        /// Recorded address.
        addr: usize,
        /// Length of the view.
        len: usize,
        /// Why the mapping failed.
        reason: String,
    },
    /// The pool holds no valid heap header, or the checkpoint data is inconsistent.
    #[error("persistent heap {}: {what}", path.display())]
    Corrupt {
        /// Pool path.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The heap was written by an incompatible version of this library.
    #[error("persistent heap {}: format version {found}, this library reads version {expected}", path.display())]
    VersionMismatch {
        /// Pool path.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Version supported.
        expected: u32,
    },
    /// The metadata area of the checkpoint space cannot hold the object table.
    #[error("metadata area full: {needed} bytes needed, {available} available (too many objects for this heap's capacity)")]
    MetadataFull {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// No process-global heap is open (`nvh_open` first).
    #[error("no persistent heap is open: call nvh_open first")]
    NotOpen,
    /// A process-global heap is already open.
    #[error("a persistent heap is already open: call nvh_close first")]
    AlreadyOpen,
    /// The other threads could not be stopped for a checkpoint (nothing was checkpointed).
    #[error("{0}")]
    Safepoint(String),
    /// Media layer (pool) error.
    #[error(transparent)]
    Media(#[from] tiermem_media::MediaError),
    /// Fault engine (write tracking) error.
    #[error(transparent)]
    Fault(#[from] tiermem_fault::Error),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// The failing call.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn last_os(what: &'static str) -> Error {
        Error::Os {
            what,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
