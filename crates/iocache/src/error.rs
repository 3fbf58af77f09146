//! Typed errors of iocache: each names the file or value it concerns and what to do about it.

use std::path::PathBuf;

/// Everything that can go wrong in iocache.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An option is out of range (page size, budget, pool size...).
    #[error("invalid iocache option: {0}")]
    InvalidOption(String),

    /// The file system of the data file cannot do direct I/O (tmpfs): `direct` and `dbio`
    /// modes need a block file system.
    #[error(
        "{}: its file system is tmpfs or has no direct I/O; the direct and dbio modes need a \
         block file system such as ext4 or xfs (or use --mode buffered)",
        path.display()
    )]
    NoDirectIo {
        /// The data file.
        path: PathBuf,
    },

    /// The data file is not a regular file (a directory, a pipe, a device...).
    #[error("{}: not a regular file", path.display())]
    NotRegular {
        /// The offending path.
        path: PathBuf,
    },

    /// Every frame of the pool is pinned: the caller holds more guards than the pool has frames.
    #[error("every one of the pool's {frames} frames is pinned: release a page first")]
    AllPinned {
        /// Frames in the pool.
        frames: usize,
    },

    /// The page is pinned, so it cannot be evicted now.
    #[error("page {pgno} is pinned: it cannot be evicted while a guard holds it")]
    Pinned {
        /// The page.
        pgno: u64,
    },

    /// A page of a zero-copy view vanished (the file was truncated under it without the lease
    /// being able to make the view private): the guard filled it with zeros.
    #[error(
        "the file was truncated under a zero-copy view: the bytes past the new end read as zeros"
    )]
    Truncated,

    /// The fd is open write-only: z-READ needs to read it.
    #[error("{}: open write-only; z-READ needs a readable file", path.display())]
    NotReadable {
        /// The fd's path.
        path: PathBuf,
    },

    /// A system call failed.
    #[error("{op} on {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// iocache's result type.
pub type Result<T> = std::result::Result<T, Error>;
