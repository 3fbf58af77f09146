//! Typed errors of the media layer.
//!
//! Every variant names the file it concerns and, where there is one, what the caller can do about
//! it. [`MediaError::errno`] maps each variant to the errno a C caller should see.

use std::path::PathBuf;

/// Everything that can go wrong in the media layer.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// The directory that should contain a pool or device file does not exist.
    #[error(
        "directory {} does not exist: create it first (for the default pool directory call \
         tiermem_media::ensure_default_dir, or point TIERMEM_DIR at an existing directory)",
        path.display()
    )]
    MissingDirectory {
        /// The missing directory.
        path: PathBuf,
    },

    /// Neither default pool directory can be used (`TIERMEM_DIR` unset): the shared one is not
    /// writable and the per-user fallback cannot be created or is not safely this user's.
    #[error(
        "no usable default pool directory: {} {shared_why}, and the per-user fallback {} \
         {user_why}; set TIERMEM_DIR to a directory you can write, or pass pool paths",
        shared.display(),
        user.display()
    )]
    NoPoolDirectory {
        /// The shared default directory (`/dev/shm/tiermem`).
        shared: PathBuf,
        /// Why it cannot be used.
        shared_why: String,
        /// The per-user fallback (`/dev/shm/tiermem-<uid>`).
        user: PathBuf,
        /// Why it cannot be used.
        user_why: String,
    },

    /// The file to open does not exist (its directory does).
    #[error("{} does not exist: create it first (Pool::create / SsdDevice::create) or check the path", path.display())]
    NotFound {
        /// The missing file.
        path: PathBuf,
    },

    /// The kernel refused access (EACCES / EPERM).
    #[error(
        "permission denied on {} while trying to {op}: check the file's owner and mode \
         (pools are created 0600, or 0660 when group_shared) and the directory's permissions",
        path.display()
    )]
    PermissionDenied {
        /// The file or directory.
        path: PathBuf,
        /// What was being attempted ("open", "create", ...).
        op: &'static str,
    },

    /// Not enough free space on the file system to allocate the file.
    #[error(
        "no space for {}: requested {requested} bytes but only {available} bytes are available \
         on its file system; choose a smaller size or free space",
        path.display()
    )]
    NoSpace {
        /// The file that could not be allocated (it has been removed again).
        path: PathBuf,
        /// Bytes requested.
        requested: u64,
        /// Bytes the file system reported available to us.
        available: u64,
    },

    /// Creating a file that already exists (creation never overwrites).
    #[error("{} already exists: open it instead, or remove it first (Pool::remove)", path.display())]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },

    /// The file is not a tiermem pool (bad magic, too small, not a regular file, bad layout).
    #[error("{} is not a tiermem pool: {reason}", path.display())]
    NotAPool {
        /// The file.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },

    /// The pool was written by an incompatible format version.
    #[error(
        "{} has pool format version {found}, but this build supports version {supported}: \
         open it with a matching tiermem release or recreate the pool",
        path.display()
    )]
    VersionMismatch {
        /// The file.
        path: PathBuf,
        /// Version found in the header.
        found: u32,
        /// Version this build reads and writes.
        supported: u32,
    },

    /// The header checksum does not match its contents.
    #[error(
        "corrupt header in {}: the checksum stored at byte offset {offset} is {stored:#010x} but \
         the header hashes to {computed:#010x}; the pool cannot be trusted (restore it from a \
         copy or recreate it)",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the checksum field within the file.
        offset: u64,
        /// Checksum stored in the header.
        stored: u32,
        /// Checksum computed over the header.
        computed: u32,
    },

    /// The header's recorded size disagrees with the file's size (truncated or extended file).
    #[error(
        "size mismatch for {}: the header says the pool is {header_size} bytes but the file is \
         {file_size} bytes (was it truncated or extended?)",
        path.display()
    )]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// Size recorded in the header.
        header_size: u64,
        /// Actual size of the file.
        file_size: u64,
    },

    /// A size or alignment argument is not acceptable.
    #[error("invalid size {size}: {reason}")]
    InvalidSize {
        /// The rejected value.
        size: u64,
        /// What is required instead.
        reason: String,
    },

    /// Some other argument is not acceptable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An access falls outside the device or data area.
    #[error("out of bounds: offset {offset} + length {len} exceeds the {limit}-byte {what}")]
    OutOfBounds {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Size of the addressed area.
        limit: u64,
        /// Which area ("pool data area", "device").
        what: &'static str,
    },

    /// A mutating call on a pool opened read-only.
    #[error("{} was opened read-only: reopen it with OpenOptions {{ writable: true, .. }} to modify it", path.display())]
    ReadOnly {
        /// The pool.
        path: PathBuf,
    },

    /// A delay-model string could not be parsed.
    #[error(
        "invalid delay model {input:?}: {reason}; expected a preset (none, pcm-fam, nvmm, \
         ethernet-10g) or a list such as read=1us,write=1us,bw=2GB/s (keys read, write, lat, \
         bw, rbw, wbw; units ns/us/ms/s and B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s)"
    )]
    InvalidDelayModel {
        /// The rejected string.
        input: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A direct-I/O request violates the device's alignment.
    #[error(
        "unaligned direct I/O on {}: {what} {value} is not a multiple of {align}; use an \
         AlignedBuf and offsets/lengths that are multiples of SsdDevice::alignment()",
        path.display()
    )]
    Unaligned {
        /// The device file.
        path: PathBuf,
        /// Which quantity is misaligned ("buffer address", "offset", "length").
        what: &'static str,
        /// The misaligned value.
        value: u64,
        /// The required alignment.
        align: u64,
    },

    /// The crash model was asked about a file it does not know.
    #[error("the power domain has no pool attached at {0}: create or open the pool with this domain first")]
    UnknownPool(String),

    /// Any other I/O error, with the operation and file.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The operation ("open", "mmap", "fsync", ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The media layer's result type.
pub type Result<T> = std::result::Result<T, MediaError>;

impl MediaError {
    /// Classify an I/O error from `op` on `path`: EACCES/EPERM become
    /// [`MediaError::PermissionDenied`], EEXIST [`MediaError::AlreadyExists`], ENOENT
    /// [`MediaError::MissingDirectory`] or [`MediaError::NotFound`] depending on whether the
    /// parent directory exists; anything else is [`MediaError::Io`].
    pub fn from_io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => MediaError::PermissionDenied { path, op },
            Some(libc::EEXIST) => MediaError::AlreadyExists { path },
            Some(libc::ENOENT) => {
                let parent = parent_dir(&path);
                if parent.is_dir() {
                    MediaError::NotFound { path }
                } else {
                    MediaError::MissingDirectory { path: parent }
                }
            }
            _ => MediaError::Io { op, path, source },
        }
    }

    /// The errno a C caller should see for this error (always positive).
    pub fn errno(&self) -> i32 {
        match self {
            MediaError::MissingDirectory { .. } | MediaError::NotFound { .. } => libc::ENOENT,
            MediaError::PermissionDenied { .. } | MediaError::NoPoolDirectory { .. } => {
                libc::EACCES
            }
            MediaError::NoSpace { .. } => libc::ENOSPC,
            MediaError::AlreadyExists { .. } => libc::EEXIST,
            MediaError::NotAPool { .. } => libc::EINVAL,
            MediaError::VersionMismatch { .. } => libc::EPROTO,
            MediaError::Corrupt { .. } => libc::EBADMSG,
            MediaError::SizeMismatch { .. } => libc::EBADMSG,
            MediaError::InvalidSize { .. }
            | MediaError::InvalidArgument(_)
            | MediaError::InvalidDelayModel { .. }
            | MediaError::Unaligned { .. } => libc::EINVAL,
            MediaError::OutOfBounds { .. } => libc::ERANGE,
            MediaError::ReadOnly { .. } => libc::EROFS,
            MediaError::UnknownPool(_) => libc::ENOENT,
            MediaError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// The directory containing `path` ("." for a bare file name).
pub(crate) fn parent_dir(path: &std::path::Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_classified_by_errno() {
        let e = MediaError::from_io(
            "open",
            "/x",
            std::io::Error::from_raw_os_error(libc::EACCES),
        );
        assert!(matches!(e, MediaError::PermissionDenied { op: "open", .. }));
        let e = MediaError::from_io(
            "open",
            "/x",
            std::io::Error::from_raw_os_error(libc::EEXIST),
        );
        assert!(matches!(e, MediaError::AlreadyExists { .. }));
        let e = MediaError::from_io(
            "open",
            "/nonexistent-dir-tiermem/x",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        match e {
            MediaError::MissingDirectory { path } => {
                assert_eq!(path, PathBuf::from("/nonexistent-dir-tiermem"))
            }
            other => panic!("expected MissingDirectory, got {other:?}"),
        }
        let e = MediaError::from_io(
            "open",
            "/tmp/nope-tiermem",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert!(matches!(e, MediaError::NotFound { .. }));
        let e = MediaError::from_io("read", "/x", std::io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(e.errno(), libc::EIO);
        assert!(e.to_string().contains("read /x"));
    }

    #[test]
    fn no_space_message_names_both_sizes() {
        let e = MediaError::NoSpace {
            path: "/p".into(),
            requested: 10,
            available: 3,
        };
        let s = e.to_string();
        assert!(
            s.contains("requested 10 bytes") && s.contains("only 3 bytes"),
            "{s}"
        );
        assert_eq!(e.errno(), libc::ENOSPC);
    }
}
