//! tiermem snapshot: MDC's memory-bounded point-in-time snapshots on a stock kernel.
//!
//! MDC (paper 002, Chapter 5) dumps a forked child's memory in address order in 64-page units
//! and gives each dumped unit back to the OS, so that the parent's later writes copy nothing;
//! it needs three kernel changes. This crate takes the snapshot without fork, on the live
//! process, with userfaultfd write protection: a page is copied only when it is written before
//! its unit was dumped, into one of a fixed number of staging slots, so the extra memory is a
//! constant (`wp`), not a fraction of the data set.
//!
//! * [`format`]: the file (header, unit index with bitmaps and CRCs, pages, application
//!   state, trailer), its writer and its checked reader.
//! * [`job`]: [`Options`] (method, staging slots), [`begin`] in the caller's pause or
//!   [`begin_paused`] around it, and the [`Job`] handle with its [`Report`].
//! * [`wp`]: [`Memory`] to snapshot, and the fork-less method: the dumper and the
//!   copy-before-write fault path.
//! * [`fork`]: the forked-child baselines, `fork` (Redis's way) and `fork-mdc` (MDC's child
//!   dropping each unit once written).

pub mod error;
pub mod fork;
pub mod format;
pub mod job;
pub mod wp;

pub use error::{Result, SnapshotError};
pub use format::{
    Info, Layout, Method, RegionInfo, Reservation, SnapshotFile, Target, Writer, PAGE, UNIT_BYTES,
    UNIT_PAGES,
};
pub use job::{begin, begin_paused, begin_paused_owned, Job, Options, OwnedJob, Report, MAX_SLOTS};
pub use wp::Memory;
