//! # tiermem-pager — NVSwap in user space
//!
//! Paging with a DRAM budget, an NVM paging buffer and an SSD regular zone, after NVSwap
//! (`../shared/papers/001_1e107f9c0b6a8cc5.txt`, Ch. 3), on a stock kernel.
//!
//! A [`Pager`] owns a DRAM budget, an NVM paging buffer (a `media` pool with the `nvmm` delay
//! model) and a swap file on a disk (`O_DIRECT`). [`Pager::map`] gives [`PagedRegion`]s: private
//! anonymous memory registered with the fault engine. A first touch is a zero fill; beyond the
//! budget the evictor thread moves pages out, in fault order, into the buffer, or to the swap
//! file when the buffer is full; a touch of an evicted page copies it back in the faulting
//! thread. The buffer keeps pages in latency groups of 64 of one bound and destages whole
//! groups to the swap file, best effort first.
//!
//! | file | owns |
//! |---|---|
//! | `pager.rs` | options, the shared state, counters, [`Pager`] |
//! | `region.rs` | [`PagedRegion`], the page-in path (in the SIGBUS handler) |
//! | `evict.rs` | the evictor: page-out by `UFFDIO_MOVE`, latency groups, destaging, prefetch |
//! | `control.rs` | latency control: Eq. 1, Algorithm 1, the tail monitor |
//! | `admission.rs` | admission: the zones' calibrated capacity, Eq. 2's demand |
//! | `shadow.rs` | the shadow mapping table ([`Place`] of every page) |
//! | `segment.rs` | [`PagerPool`]: the buffer, swap file and control segment several processes share |
//! | `zones.rs` | the NVM buffer pool and the swap file |
//! | `slots.rs` | lock-free slot bitmaps |
//! | `hist.rs` | a lock-free latency histogram |
//!
//! **Several processes.** With [`PagerOptions::pool`] a process is one tenant of a
//! [`PagerPool`] (`tiermem pager daemon`): the buffer, the swap file, the SSD queue and the
//! controller are shared, each process keeps its own budget, evictor, shadow table and
//! page-in path. Without it, a pager's tenants are its regions.
//!
//! ## Caveats
//! * Faults are resolved in the faulting thread: a system call that reads or writes an evicted
//!   page of a region fails with `EFAULT`.
//! * Regions are not inherited by `fork` (`MADV_DONTFORK`).
//! * Needs `UFFDIO_MOVE` (Linux 6.8+).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![allow(clippy::manual_is_multiple_of)]

pub mod admission;
pub mod control;
pub mod error;
mod evict;
pub mod hist;
mod pager;
mod region;
pub mod segment;
pub mod shadow;
pub mod slots;
mod zones;

pub use admission::{admit, calibrate, demand_iops, Capacity};
pub use control::{ControlParams, Decision, TenantWindow};
pub use error::{Error, Result};
pub use pager::{Pager, PagerOptions, PagerStats, GROUP_PAGES};
pub use region::{thread_pageins, PagedRegion};
pub use segment::{
    default_pool_path, GcReport, PagerPool, PoolController, PoolSpec, PoolStatus, PoolWindow,
    TenantStatus, MAX_TENANTS,
};
pub use shadow::Place;
