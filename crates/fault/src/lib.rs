//! # tiermem-fault — one userfaultfd / mprotect fault engine
//!
//! Every tiermem subsystem that moves pages (pager, snapshot, migrate, vnvm, pheap, prefault)
//! needs to run code when the application touches a page that is not where it should be. This
//! crate is the one place that talks to the kernel for that:
//!
//! * [`Engine`]: a process-global runtime. A subsystem registers a region ([`RegionSpec`]) with a
//!   small policy object ([`Resolver`]); the engine delivers MISSING, WP and MINOR faults to it as
//!   [`Fault`]s addressed by *region offset*, and lets it resolve them through [`FaultOps`]
//!   (UFFDIO_COPY / ZEROPAGE / CONTINUE / WRITEPROTECT / MOVE / WAKE).
//! * [`WriteTracker`]: which pages were written since the last scan (UFFD_FEATURE_WP_ASYNC +
//!   one PAGEMAP_SCAN per chunk, or an mprotect + SIGSEGV fallback).
//! * [`probe`]: measurements for `tiermem doctor` and `tiermem bench fault`.
//! * [`access`]: how the process gets a userfaultfd — `userfaultfd(2)`, `/dev/userfaultfd`, or
//!   `userfaultfd(2)` with `UFFD_USER_MODE_ONLY` for unprivileged users — and which one it used
//!   ([`UffdAccess`], [`Engine::access`]).
//! * [`sys`]: the raw uapi (userfaultfd.h, PAGEMAP_SCAN from fs.h) and a safe [`Uffd`] wrapper.
//!
//! ## Two resolution modes, and why both exist
//!
//! Measured on the reference VM (Linux 6.18, 2 vCPUs; re-measure with `tiermem doctor`):
//!
//! | path | p50 | p99 |
//! |---|---|---|
//! | kernel first touch of an anonymous page (baseline) | 1.2 µs | 2.7 µs |
//! | **in-thread**: UFFD_FEATURE_SIGBUS, resolver runs in the SIGBUS handler, one UFFDIO_COPY | 2.2 µs | 4.0 µs |
//! | mprotect + SIGSEGV + mprotect back | 3.1 µs | 3.7 µs |
//! | **handler thread**, blocking (poll + read + UFFDIO_COPY + wake) | 70–80 µs | 110–140 µs |
//!
//! [`Resolution::InThread`] is the fast path: the faulting thread takes a SIGBUS, the engine finds
//! the region with a lock-free lookup, classifies the fault from the page-fault error code in the
//! signal context and calls the resolver right there; when the handler returns the access
//! restarts and succeeds. No context switch, no wake-up of another vCPU. Its costs: the resolver
//! runs in signal context (async-signal-safe code only), and **kernel accesses to a missing page
//! (`read(2)` into it, `write(2)` from it, futexes...) fail with EFAULT** instead of faulting,
//! because the kernel cannot deliver a signal in the middle of a system call.
//!
//! [`Resolution::HandlerThread`] resolves on the engine's runtime thread: kernel accesses work
//! (the syscall sleeps until the page is filled), the resolver may lock and allocate, and the
//! runtime also handles the non-cooperative events (REMOVE, UNMAP, REMAP, FORK — a forked child's
//! faults are served too, see [`ForkPolicy`]). A blocking handler is ~30× slower on a VM because
//! waking an idle vCPU is expensive; `spin_us` keeps the runtime polling after each fault to cut
//! that, at the price of a busy core. Use it off the critical path, for memory the kernel itself
//! touches, and for regions that must survive fork.
//!
//! Each region says which mode it uses ([`RegionHandle::resolution`]); [`Engine::stats`] counts
//! faults per mode and events seen.
//!
//! ## Caveats
//!
//! * The engine owns SIGBUS (in-thread regions) and the tracker owns SIGSEGV (mprotect fallback);
//!   both chain to the handler installed before them for addresses that are not theirs. Code that
//!   installs its own handler afterwards without chaining breaks them.
//! * In-thread resolvers: async-signal-safe only; see [`Resolver`].
//! * Resolvers must not munmap/madvise/mremap registered memory or fork (see [`engine`]).
//! * 4 KiB pages (x86-64) are assumed and checked.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// The workspace targets Rust 1.80: keep `%` and `map_or` instead of newer helpers.
#![allow(clippy::manual_is_multiple_of, clippy::unnecessary_map_or)]

pub mod access;
pub mod engine;
pub mod error;
mod fork_guard;
pub mod policy;
pub mod probe;
pub mod region;
pub mod safepoint;
pub mod scope;
pub mod sig;
pub mod sys;
pub mod tracker;

pub use access::UffdAccess;
pub use engine::{Engine, EngineStats, RegionHandle};
pub use error::{Error, ResolveError, Result};
pub use policy::{Fault, FaultKind, FaultOps, RegionEvent, Resolver};
pub use region::{Backing, ForkPolicy, Modes, RegionSpec, Resolution, MAX_REGIONS};
pub use sys::{probe_features, Pagemap, Uffd, UffdFeatures, PAGE_SIZE};
pub use tracker::{PageRange, TrackerOptions, TrackingMethod, WriteTracker};
