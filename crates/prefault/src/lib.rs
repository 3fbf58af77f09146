//! # tiermem-prefault — POE on a stock kernel: first touches that do not fault
//!
//! A first touch of anonymous memory makes the kernel allocate and zero a page, build page
//! tables and update rmap, LRU and memcg counters, all on the application's critical path
//! (1.2–1.9 µs here). POE (thesis 000, ch. 4) moves that work off the path with a modified
//! kernel and page walker. On a stock kernel, anything that lets the access fault first loses
//! to the kernel's own fault (userfaultfd adds a signal and an ioctl), so this crate makes the
//! page *present before the first touch*: a [`Service`] thread, SCHED_IDLE, populates
//! registered regions ahead of use with `MADV_POPULATE_WRITE` (or `_READ`), so page tables,
//! zeroing, rmap, LRU and memcg accounting happen on its core. Populate never changes a page's
//! contents, so racing the application's own fault is harmless: no PTE lock, legal-PTE bit or
//! exit cleanup is needed.
//!
//! Each region has the paper's **window table** ([`window`]): up to 64 entries of one chunk
//! (default 16 pages), each populated in one call but for one **tripwire** page left to the
//! kernel. A pass (every 2 ms, down to 100 µs while entries get used) reads presence
//! (`PAGEMAP_SCAN`, `mincore` as fallback) of the tripwires and of the region past the window:
//! hits mark entries used; pages the application faulted itself (the footprint) give the
//! order — ascending, descending, a stride, or none ("whole") — and show when it overtook the
//! window (the service then jumps ≥ 2 MiB ahead, into another page table). A process-wide
//! **budget** bounds the bytes populated and not known to be used; the service backs off near
//! the memory cgroup's limit and keeps each call short (≤ 256 KiB, or one huge page), so an
//! unregistering caller waits little. In a THP-eligible region the chunk is a whole 2 MiB unit
//! and the tripwire is the unit past the window (see [`window`] for why).
//!
//! Entry points: [`Service::start`], [`Service::register`] (checked against
//! `/proc/self/maps`), [`Service::register_engine`] (a `tiermem-fault` region, filled with
//! `install`/`install_zero`), [`Service::register_trusted`] + [`Service::unregister_range`]
//! (no lock, no allocation: for `mmap`/`munmap` hooks), [`Registration::hint`],
//! [`Service::stats`].
//!
//! ## Caveats
//!
//! * The budget bounds what the service cannot see used: pages of a chunk whose tripwire was
//!   hit count as used, though the application may touch only some of them (at most one chunk
//!   per region in a sequential pattern). In a random pattern the footprint cannot tell which
//!   populated pages were touched; the service populates while the budget allows.
//! * Pages populated ahead and never touched stay resident until the application unmaps them:
//!   the service never discards memory (it cannot know whether the application wrote it).
//! * The work moves to another core: on a machine whose cores are all busy, a SCHED_IDLE
//!   service falls behind and the application faults as it would without it.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![allow(clippy::manual_is_multiple_of, clippy::unnecessary_map_or)]

mod busy;
pub mod os;
pub mod policy;
mod service;
mod table;
pub mod window;

pub use policy::{Options, Order, Policy, Populate, Thp, MAX_CHUNK, MAX_ENTRIES};
pub use service::{Mapped, RawRegistration, RegionStats, Registration, Service, Stats};
pub use table::MAX_SLOTS;
pub use window::RAMP_START;

/// Errors of registration and start-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed argument (alignment, length, policy numbers).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The range is not private anonymous read-write memory (unmapped, PROT_NONE, read-only,
    /// shared, a file).
    #[error("cannot prefault {0}")]
    BadRange(String),
    /// The range overlaps a live registration.
    #[error("{0}")]
    Overlap(String),
    /// Every slot of the registration table is taken.
    #[error("the prefault registration table is full ({0} regions)")]
    Full(usize),
    /// A system call failed.
    #[error("{0}")]
    Os(String),
}
