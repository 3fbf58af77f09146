//! # tiermem-migrate — post-copy migration of tiermem regions through a shared FAM pool
//!
//! FAM-aware, checkpoint-based post-copy (paper 003; thesis 000 ch. 3) and its baselines
//! (socket post-copy as CRIU does it, stop-and-copy, pre-copy). Design: `docs/migrate.md`.
//!
//! Modules:
//! * [`fam`]: FAM-aware post-copy — [`fam::FamSource`] and [`fam::FamTarget`];
//! * [`hot`]: the hot-page manifest (recorded at the source, dumped and prefetched first);
//! * [`precopy`]: the pre-copy baseline (rounds of written pages, then a short freeze);
//! * [`checkpoint`]: the non-page checkpoint (region geometry, the application's blob);
//! * [`lazyfile`]: the checkpoint and lazy-page files in the FAM directory, and the dumper;
//! * [`proto`]: the page-server wire protocol;
//! * [`sigsafe`]: spin lock and socket loops a resolver in a signal handler may use;
//! * [`link`]: the target's signal-safe page-server link (for in-thread resolution);
//! * [`metrics`]: downtime, resume, busy and total time, pages by path;
//! * [`lookup`]: the target's lock-free table of dumped offsets (watermark + ranges);
//! * [`resolve`]: the target's fault resolver (FAM first, the page-server on a miss);
//! * [`netns`]: two "hosts" as network namespaces joined by a veth pair (tests, benchmarks);
//! * [`socket`]: socket post-copy as CRIU does it (pages held in pipes at freeze, fault
//!   page-server, expiration timer and push of the remaining pages);
//! * [`workload`]: synthetic applications updating a region (sequential, uniform, zipfian);
//! * [`harness`]: one migration of a running application by any method, measured;
//! * [`sockpage`]: a minimal socket page-server and fault client (socket post-copy baseline);
//! * [`targetmem`]: target memory reserved before the freeze, installed by moving page-table
//!   entries rather than copying into new pages.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// The workspace targets Rust 1.80: keep `map_or` and `%` instead of newer helpers.
#![allow(clippy::manual_is_multiple_of, clippy::unnecessary_map_or)]

pub mod checkpoint;
pub mod fam;
pub mod harness;
pub mod hot;
pub mod lazyfile;
pub mod link;
pub mod lookup;
mod mapping;
pub mod metrics;
pub mod netns;
pub mod precopy;
pub mod proto;
pub mod resolve;
pub mod sigsafe;
pub mod socket;
pub mod sockpage;
pub mod targetmem;
pub mod workload;

/// The source of a migration: FAM-aware post-copy, the product's method ([`fam::FamSource`]).
pub use fam::FamSource as Source;
/// The target of a migration: FAM-aware post-copy ([`fam::FamTarget`]).
pub use fam::FamTarget as Target;
