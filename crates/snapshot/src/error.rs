//! Typed errors of the snapshot subsystem. A corrupt or foreign file names the check it failed.

use std::path::PathBuf;

/// Everything that can go wrong taking, reading or restoring a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file is not a complete, intact snapshot; `check` names what failed.
    #[error("{}: not a valid snapshot: {check}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The failed check, e.g. "trailer magic (the file is truncated or was never finished)".
        check: String,
    },

    /// A caller's argument is unusable; the message says which and why.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The media layer refused (no space, missing directory, permissions, I/O error).
    #[error(transparent)]
    Media(#[from] tiermem_media::MediaError),

    /// The fault engine refused (userfaultfd unavailable, a missing feature, overlap).
    #[error(transparent)]
    Fault(#[from] tiermem_fault::Error),

    /// A system call failed.
    #[error("{op} on {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },

    /// The snapshot was aborted before it completed; the previous file at the target is intact.
    #[error("snapshot aborted: {0}")]
    Aborted(String),
}

/// Result alias of the crate.
pub type Result<T, E = SnapshotError> = std::result::Result<T, E>;

impl SnapshotError {
    pub(crate) fn corrupt(path: &std::path::Path, check: impl Into<String>) -> SnapshotError {
        SnapshotError::Corrupt {
            path: path.to_path_buf(),
            check: check.into(),
        }
    }

    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        SnapshotError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The errno a C caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            SnapshotError::Corrupt { .. } => libc::EBADMSG,
            SnapshotError::InvalidArgument(_) => libc::EINVAL,
            SnapshotError::Media(m) => m.errno(),
            SnapshotError::Fault(_) => libc::ENOTSUP,
            SnapshotError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            SnapshotError::Aborted(_) => libc::ECANCELED,
        }
    }
}
