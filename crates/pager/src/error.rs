//! Typed errors of the pager: each names the value or file it concerns and what to do about it.

use std::path::PathBuf;

/// Everything that can go wrong in the pager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An option is out of range (budget, buffer size, batch...).
    #[error("invalid pager option: {0}")]
    InvalidOption(String),

    /// The DRAM budget is more than the machine can give.
    #[error(
        "the DRAM budget of {budget} bytes is more than the {available} bytes of memory \
         available: a budget the kernel cannot honour would swap behind the pager's back"
    )]
    BudgetAboveMemory {
        /// Requested budget.
        budget: u64,
        /// MemAvailable.
        available: u64,
    },

    /// The swap file (regular zone) would be on tmpfs, which is memory, not a disk.
    #[error(
        "{}: the regular zone must be on a disk, and this is tmpfs (memory): give a swap file \
         path on ext4 or xfs (--ssd)",
        path.display()
    )]
    SwapOnTmpfs {
        /// The swap file.
        path: PathBuf,
    },

    /// A region could not be mapped or registered.
    #[error("mapping a paged region of {len} bytes: {source}")]
    Map {
        /// Requested length.
        len: usize,
        /// Why.
        source: std::io::Error,
    },

    /// The fault engine refused.
    #[error(transparent)]
    Fault(#[from] tiermem_fault::Error),

    /// A device (the NVM pool or the swap file) failed.
    #[error(transparent)]
    Media(#[from] tiermem_media::MediaError),

    /// A page-in bound that the zones cannot serve beside the ones admitted (Eq. 2).
    #[error(
        "a page-in bound of {bound_ns} ns does not fit: with it the bounds ask for {demand_iops:.0} \
         page-ins per second and the swap file and the NVM buffer serve {capacity_iops:.0} \
         (tiermem pager calibrate); loosen it or run best effort"
    )]
    Infeasible {
        /// The bound asked for.
        bound_ns: u64,
        /// Eq. 2's demand with it.
        demand_iops: f64,
        /// The zones' calibrated capacity.
        capacity_iops: f64,
    },

    /// A pager pool file that cannot be used: not one, another layout version, a swap file gone.
    #[error("{}: not a usable pager pool: {why}", path.display())]
    BadPool {
        /// The pool file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },

    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

impl Error {
    /// `op` failed with the current `errno`.
    pub(crate) fn last(op: &'static str) -> Error {
        Error::Sys {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Result with the pager's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
