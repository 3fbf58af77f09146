//! Typed errors of the fault engine.

use std::io;

/// Errors returned by the fault crate's setup paths (opening userfaultfd, registering regions,
/// creating trackers). The fault-resolution path uses [`crate::ResolveError`] instead, which never
/// allocates so that it can be built inside a signal handler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// userfaultfd could not be opened at all, none of the three ways (kernel without
    /// CONFIG_USERFAULTFD, a kernel older than 5.11 without permission, a seccomp filter...).
    #[error("userfaultfd is not available: {detail}")]
    UffdUnavailable {
        /// The errno of the first attempt (the plain syscall).
        #[source]
        source: io::Error,
        /// Each way tried, why it failed and what it would need.
        detail: String,
    },

    /// The running kernel does not offer a userfaultfd feature this configuration needs.
    #[error("the running kernel lacks userfaultfd feature {feature} (needed for {needed_for})")]
    MissingFeature {
        /// Name of the UFFD_FEATURE_* flag (or ioctl) that is absent.
        feature: &'static str,
        /// What the caller asked for that needs it.
        needed_for: &'static str,
    },

    /// The caller passed an invalid argument (alignment, length, mode combination...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The combination asked for is valid in principle but the kernel cannot do it.
    #[error("unsupported by the kernel: {0}")]
    Unsupported(String),

    /// The range overlaps a region that is already registered with the engine.
    #[error(
        "range {base:#x}+{len:#x} overlaps the already registered region {other_base:#x}+{other_len:#x}"
    )]
    Overlap {
        /// Base of the rejected range.
        base: usize,
        /// Length of the rejected range.
        len: usize,
        /// Base of the existing region.
        other_base: usize,
        /// Length of the existing region.
        other_len: usize,
    },

    /// The fixed-size, signal-safe region table is full.
    #[error("the fault engine's region table is full ({0} slots); unregister regions first")]
    TooManyRegions(usize),

    /// A system call failed.
    #[error("{op} failed: {source}")]
    Syscall {
        /// The operation (syscall or ioctl name) that failed.
        op: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },

    /// A measurement or self-check found a wrong result.
    #[error("verification failed: {0}")]
    Verification(String),

    /// Neither userfaultfd write-protection nor the mprotect fallback could be set up.
    #[error("write tracking is unavailable: userfaultfd WP_ASYNC failed ({uffd}) and mprotect fallback failed ({mprotect})")]
    TrackingUnavailable {
        /// Why the userfaultfd path failed.
        uffd: String,
        /// Why the mprotect path failed.
        mprotect: String,
    },
}

impl Error {
    /// Builds [`Error::Syscall`] from the current `errno`.
    pub(crate) fn last(op: &'static str) -> Self {
        Error::Syscall {
            op,
            source: io::Error::last_os_error(),
        }
    }

    /// Builds [`Error::Syscall`] from an explicit errno value.
    pub(crate) fn errno(op: &'static str, errno: i32) -> Self {
        Error::Syscall {
            op,
            source: io::Error::from_raw_os_error(errno),
        }
    }
}

/// Result alias of the fault crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Error returned by a [`crate::Resolver`] or by a [`crate::FaultOps`] operation.
///
/// Every variant is `Copy` and built without allocation, because in-thread resolvers run inside
/// a SIGBUS handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// A userfaultfd ioctl failed.
    #[error("{op} at region offset {offset:#x} (+{len:#x}) failed with errno {errno}")]
    Ioctl {
        /// The ioctl name (UFFDIO_COPY, ...).
        op: &'static str,
        /// Region offset of the operation.
        offset: usize,
        /// Length of the operation.
        len: usize,
        /// The errno.
        errno: i32,
    },
    /// The operation addressed bytes outside the region, or was not page aligned.
    #[error("range offset {offset:#x} (+{len:#x}) is unaligned or outside the region of {region_len:#x} bytes")]
    OutOfRange {
        /// Region offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Region length.
        region_len: usize,
    },
    /// The address space behind the fault is gone (the process, e.g. a forked child, exited).
    #[error("the address space that faulted no longer exists")]
    ProcessGone,
    /// The resolver itself failed (its own reason, a static string).
    #[error("resolver failed: {0}")]
    Resolver(&'static str),
}
