//! # tiermem-media — devices, persistence, delay and crash models
//!
//! The bottom layer of tiermem. Everything that moves pages between DRAM, persistent or pooled
//! memory and SSD goes through the types here.
//!
//! ## Layers
//!
//! * **Devices.** A [`Pool`] is an NVM or FAM pool: a file mapped `MAP_SHARED` (by default on
//!   tmpfs under `/dev/shm/tiermem`, see [`default_dir`]) with a checksummed 4 KiB header and a
//!   data area addressed by *offsets* (nothing persistent ever holds a virtual address). An
//!   [`SsdDevice`] is a fixed-size file used with `O_DIRECT` where the file system allows it,
//!   single requests through pread/pwrite and batches through io_uring.
//! * **The flush indirection** ([`persist`]). One place decides how bytes become durable:
//!   [`PersistMethod::DaxSync`] on a real DAX mapping (detected by trying `MAP_SYNC`),
//!   [`PersistMethod::CacheFlush`] on tmpfs (clwb/clflushopt + sfence — the ordering of real
//!   persistent memory, even though the medium is DRAM), [`PersistMethod::Msync`] on block-backed
//!   files. [`nt_copy`] copies with non-temporal stores.
//! * **Delay model** ([`delay`]). `delay = latency + bytes / bandwidth`, separately for reads and
//!   writes, injected by a TSC busy-wait on every device access. Off by default ([`DelayModel::NONE`]);
//!   set per device, or process-wide with `TIERMEM_DELAY` (preset names `pcm-fam`, `nvmm`,
//!   `ethernet-10g`, or e.g. `read=1us,write=1us,bw=2GB/s`).
//! * **Crash model** ([`crash`]). A [`PowerDomain`] tracks, for the pools attached to it, which
//!   cache lines were flushed and fenced; power can be cut after any fence, or during one (its
//!   pending lines land in any subset), and the pool's post-crash image produced
//!   ([`CrashPolicy::Strict`], [`CrashPolicy::Torn`] or [`CrashPolicy::RandomEviction`]) and
//!   reopened, so tests can check recovery at every [`CutPoint`] of a workload.
//!
//! ## Environment
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TIERMEM_DIR` | directory for pools named without a path | `/dev/shm/tiermem`, or `/dev/shm/tiermem-<uid>` when the shared one is not writable (see [`default_dir`]) |
//! | `TIERMEM_DELAY` | delay model of devices opened without an explicit one | `none` |
//!
//! ## Caveats
//!
//! * x86-64 only (clwb/clflushopt, non-temporal stores, RDTSC).
//! * `Pool::write` issues non-temporal stores but does not fence: data is durable only after
//!   `persist`/`fence` (or `write_persist`).
//! * Stores made through [`Pool::data_ptr`] are seen by the crash model only when a later
//!   `flush`/`persist` covers them — as on hardware — and are charged no delay unless the caller
//!   uses `charge_read`/`charge_write`.
//! * The crash model keeps a full copy of each attached pool: use it with small pools in tests.

#![warn(missing_docs)]

#[cfg(not(target_arch = "x86_64"))]
compile_error!("tiermem-media supports x86-64 only (clwb/clflushopt, non-temporal stores, RDTSC)");

pub mod bench;
pub mod crash;
pub mod delay;
pub mod error;
pub mod memory;
pub mod persist;
pub mod pool;
pub mod ssd;
pub mod stats;

pub use crash::{CrashPolicy, CutPoint, FenceRecord, PowerDomain};
pub use delay::{
    busy_wait_ns, delay_ns, delay_sleep_margin_ns, now_ns, pace_ns, tsc_ghz, DelayModel, Pacer,
    DELAY_SLEEP_ENV,
};
pub use error::{MediaError, Result};
pub use memory::{mem_available, on_tmpfs, populate_write};
pub use persist::{
    cpu_features, cpu_has_tsc_invariant, fence, flush_lines, flush_slice, nt_copy, nt_copy_slice,
    CpuFeatures, PersistMethod, CACHE_LINE,
};
pub use pool::{
    default_dir, ensure_default_dir, parse_size, user_dir, OpenOptions, Pool, PoolHeader, PoolKind,
    PoolOptions,
};
pub use ssd::{AlignedBuf, DioAlign, IoOp, SsdDevice};
pub use stats::{DeviceStats, StatsSnapshot};
