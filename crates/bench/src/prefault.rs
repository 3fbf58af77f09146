//! `tiermem bench prefault`: the first-touch critical path of anonymous memory with the prefault
//! service (`tiermem-prefault`, issue #18) against the kernel's demand fault and the other ways
//! to a page, side by side in one run; the time to first touch of a large mapping; unmodified
//! programs plain and under `tiermem prefault run`.
//!
//! **Microbenchmark** (thesis 000 §4.5, the paper's): an anonymous mapping (256 MiB, quick
//! 64 MiB), one byte per page touched by a write or a read, in ascending, descending, stride (every
//! 4th page) or random order, with a compute gap of 0, 1, 5 or 20 µs per page (a busy loop of
//! integer work calibrated once by the parent, so every arm does the same work). Each access is
//! timed as `lfence; rdtsc; access; mfence; rdtscp` into an HdrHistogram (TSC ticks converted
//! with the TSC frequency calibrated once by the parent); each run's total time (from before the
//! mmap to after the last touch: a MAP_POPULATE is paid there) and time to its first touch.
//! Arms, each run in a fresh process (the project's rule: a baseline never shares a process,
//! allocator or background thread with the system it is compared with; this binary re-executed
//! as the hidden `tiermem bench prefault-run`), alternated within a repetition, medians over
//! repetitions:
//!
//! * `kernel`: demand faults (the baseline; 4 KiB: MADV_NOHUGEPAGE and PR_SET_THP_DISABLE);
//! * `populate_all`: MAP_POPULATE (THP on: MADV_HUGEPAGE then MADV_POPULATE_WRITE, the same);
//! * `prefault`: the service with its defaults (`Options::default()`, `Policy::default()`: order
//!   Auto, so the service is given no hint of the order);
//! * `prefault_paper`: the paper's parameters taken literally, one page per entry, 64 entries,
//!   a fixed 2 ms pass (`Policy { chunk: 1, entries: 64 }`, `Options { adaptive: false }`);
//! * `uffd_move_pool`: the literal POE as a user-space baseline: the fault goes to userfaultfd
//!   (the fault engine's in-thread SIGBUS resolution) and takes a pre-zeroed page from a pool of
//!   64 with UFFDIO_MOVE; a thread refills the pool every 2 ms (MADV_POPULATE_WRITE); a fault
//!   that finds the pool empty is served by UFFDIO_COPY of a zero page (counted as a miss). The
//!   benchmark has one application thread, so one pool (the paper's is per CPU/thread);
//! * `uffd_copy`: UFFDIO_COPY of a zero page at the fault; `uffd_zeropage`: UFFDIO_ZEROPAGE at
//!   the fault (a write then faults again, for the copy-on-write of the zero page).
//!
//! The service is started (and the fault engine's runtime thread and the move pool's refill
//! thread are running) before the clock starts: in a program they start once, with the process.
//! THP off (4 KiB) for every arm, THP on (MADV_HUGEPAGE, which `always` and `madvise` honour)
//! for `kernel`, `populate_all`, `prefault`, `prefault_paper` (userfaultfd maps 4 KiB pages only).
//!
//! **10 % of 1 GiB**: the same measurement on a 1 GiB mapping of which the first 10 % of the
//! pages are touched (ascending, 5 µs gap), `kernel`, `populate_all`, `prefault` (4 KiB): time
//! to first touch (mmap, + MAP_POPULATE or registration, + the first access) and RSS over the
//! touched bytes; the service's `peak_unused_bytes` against its budget.
//!
//! **Programs**: sqlite3 building an in-memory database, `sort` of a 1 GiB file (quick 96 MiB),
//! python3 building a big list, redis-server under redis-benchmark, memcached under memcslap,
//! and the PARSEC members Debian packages (x264 encoding a generated video, vips sharpening a
//! generated image), each plain and under `tiermem prefault run`, alternated, medians, with
//! 4 KiB pages (PR_SET_THP_DISABLE set in the child before exec: the prctl is inherited
//! across exec) and with the system's THP setting; the outputs must be the same.
//!
//! Figures (the names): `critical_path_ratio_write` = prefault p50 / kernel p50
//! (ascending, 5 µs gap, write, 4 KiB); `_read` the same with reads; `_write_mean` the same on
//! means (tripwire faults and misses included); `critical_path_ratio_uffd_move` =
//! uffd_move_pool p50 / kernel p50 (same cell); `gap0_time_ratio` = prefault total time /
//! kernel total time (ascending, gap 0, write, 4 KiB); `thp_p99_ratio` = prefault p99 with THP
//! on / kernel p99 with 4 KiB pages (the Metric's baseline; same cell) — with THP on only one
//! touch in 512 faults, which a p99 does not see, so `thp_p999_ratio_vs_kernel_thp` compares
//! p99.9 with the kernel's own THP faults; `startup_ratio_populate_over_prefault` = time to
//! first touch of populate_all / prefault (10 % of 1 GiB); `pool_peak_bytes` = the most
//! `peak_unused_bytes` of those prefault runs, `pool_budget_bytes` their budget;
//! `app_speedup_pct` = mean `speedup_pct` of sqlite3, sort, python3 and redis with 4 KiB pages,
//! where `speedup_pct` = 100 × (1 − prefault time / plain time) and `est_speedup_pct` is the
//! paper's estimate: application-thread faults of the plain run × (kernel fault p50 − prefault
//! touch p50, from the microbenchmark's write cell) / plain run time.

use crate::worker::{self, Worker};
use crate::{cpu, machine, BenchOpts};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::arch::x86_64::{__rdtscp, _mm_lfence, _mm_mfence, _rdtsc};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem_fault::{Engine, Fault, FaultOps, RegionSpec, ResolveError, Resolver, PAGE_SIZE};

/// `bench prefault`'s options: the common ones (`plot` writes the per-touch CDFs).
pub type Options = BenchOpts;

/// A way to get the pages of the touched region.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Arm {
    /// The kernel's demand fault (the baseline).
    Kernel,
    /// Everything populated at mmap (MAP_POPULATE).
    PopulateAll,
    /// The prefault service with its defaults.
    Prefault,
    /// The service with the paper's parameters (1-page entries, 64 entries, fixed 2 ms).
    PrefaultPaper,
    /// userfaultfd, pre-zeroed pages moved in from a pool of 64 (UFFDIO_MOVE).
    UffdMovePool,
    /// userfaultfd, UFFDIO_COPY of a zero page.
    UffdCopy,
    /// userfaultfd, UFFDIO_ZEROPAGE.
    UffdZeropage,
}

const ALL_ARMS: [Arm; 7] = [
    Arm::Kernel,
    Arm::PopulateAll,
    Arm::Prefault,
    Arm::PrefaultPaper,
    Arm::UffdMovePool,
    Arm::UffdCopy,
    Arm::UffdZeropage,
];
/// The arms measured with THP on as well (userfaultfd maps 4 KiB pages only).
const THP_ARMS: [Arm; 4] = [
    Arm::Kernel,
    Arm::PopulateAll,
    Arm::Prefault,
    Arm::PrefaultPaper,
];

impl Arm {
    /// The arm's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Kernel => "kernel",
            Arm::PopulateAll => "populate_all",
            Arm::Prefault => "prefault",
            Arm::PrefaultPaper => "prefault_paper",
            Arm::UffdMovePool => "uffd_move_pool",
            Arm::UffdCopy => "uffd_copy",
            Arm::UffdZeropage => "uffd_zeropage",
        }
    }
    fn is_uffd(self) -> bool {
        matches!(self, Arm::UffdMovePool | Arm::UffdCopy | Arm::UffdZeropage)
    }
    fn is_prefault(self) -> bool {
        matches!(self, Arm::Prefault | Arm::PrefaultPaper)
    }
}

/// The order of the first touches.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum TouchOrder {
    /// Low addresses first.
    Ascending,
    /// High addresses first.
    Descending,
    /// Every 4th page, ascending (a quarter of the pages).
    Stride,
    /// Every page, in a fixed random permutation.
    Random,
}

/// Stride of [`TouchOrder::Stride`], in pages.
const STRIDE: usize = 4;

/// The access that first touches a page.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A one-byte store.
    Write,
    /// A one-byte load.
    Read,
}

/// One measured run, as sent to a worker.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct TouchRequest {
    pub arm: Arm,
    /// Huge pages allowed (MADV_HUGEPAGE) or not (MADV_NOHUGEPAGE, and PR_SET_THP_DISABLE in a
    /// worker process).
    pub thp: bool,
    pub order: TouchOrder,
    pub op: Op,
    pub gap_us: f64,
    /// Size of the mapping.
    pub region_bytes: usize,
    /// Touch the first `touch_pct` % of the order's pages (100: all).
    pub touch_pct: u32,
    /// The parent's calibrations: TSC GHz, gap-loop iterations per µs.
    pub tsc_ghz: f64,
    pub iters_per_us: f64,
}

/// What a worker is asked.
#[derive(Serialize, Deserialize, Debug)]
enum Request {
    Touch(TouchRequest),
    /// The doctor's floor: kernel first touches, µs p50/p99.
    Floor {
        pages: usize,
    },
}

/// The prefault service's figures at the end of a run.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct ServiceFigures {
    pub service_cpu_ms: f64,
    pub populated_bytes: u64,
    pub populate_calls: u64,
    pub tripwire_hits: u64,
    pub footprint_pages: u64,
    pub peak_unused_bytes: u64,
    pub unused_bytes: u64,
    pub budget_bytes: u64,
    pub passes: u64,
    pub backoffs: u64,
    /// Passes cut short or put off because the service waited in the run queue (starved).
    pub starved_passes: u64,
    pub cpu_hops: u64,
    pub failures: u64,
    pub sched_idle: bool,
    pub sensing: String,
    /// The order the region's window followed at the end ("Auto": still learning).
    pub learned_order: String,
    pub learned_stride: usize,
}

/// The move pool's figures at the end of a run.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct PoolFigures {
    /// Faults served by a page moved in from the pool.
    pub moves: u64,
    /// Faults that found the pool empty (served by UFFDIO_COPY of a zero page).
    pub misses: u64,
    /// UFFDIO_MOVE calls that failed (then served as misses).
    pub move_errors: u64,
    /// Pages the refill thread populated.
    pub refilled: u64,
    pub refill_cpu_ms: f64,
}

/// One run's measurements.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Sample {
    pub touches: u64,
    pub p50_ns: f64,
    pub p90_ns: f64,
    pub p99_ns: f64,
    pub p999_ns: f64,
    pub mean_ns: f64,
    pub max_ns: f64,
    /// Per-touch quantiles (ns) for the CDF: 0.25 %, 0.75 %, … 99.75 %, then 99.9, 99.99, max.
    pub quantiles_ns: Vec<f64>,
    /// mmap (+ populate or registration) before the first touch (a median like
    /// `first_touch_ms`).
    pub setup_ms: f64,
    /// From before the mmap to the end of the first touch (in the 10 % case, for the arms
    /// kernel and prefault: the median of [`START_CYCLES`] such sequences on fresh mappings
    /// (prefault: with `Service::map`) and, for kernel, the measured run's).
    pub first_touch_ms: f64,
    /// The prefault arm in the 10 % case: the same with mmap and `register` (its range check),
    /// [`START_CYCLES`] sequences and the measured run's.
    pub first_touch_register_ms: Option<f64>,
    /// From before the mmap to the end of the last touch.
    pub total_ms: f64,
    /// Resident bytes of the mapping after the last touch (mincore).
    pub rss_bytes: u64,
    pub touched_bytes: u64,
    /// AnonHugePages of the mapping after the last touch (smaps).
    pub huge_bytes: u64,
    /// CPU of the whole process over the run (every thread: application, service, engine).
    pub process_cpu_ms: f64,
    /// CPU of the application thread over the run.
    pub app_cpu_ms: f64,
    /// Page faults the application thread took during the run (getrusage RUSAGE_THREAD).
    pub app_faults: u64,
    /// A timed access to a cached, mapped byte: what the timing itself costs (ns, median).
    pub timer_overhead_ns: f64,
    pub service: Option<ServiceFigures>,
    pub pool: Option<PoolFigures>,
}

/// One row of the report: a cell's medians over its repetitions.
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    /// "micro" (the paper's microbenchmark) or "startup" (10 % of 1 GiB).
    pub case: &'static str,
    pub arm: &'static str,
    /// "off" (4 KiB pages) or "on" (MADV_HUGEPAGE).
    pub thp: &'static str,
    pub order: TouchOrder,
    pub op: Op,
    pub gap_us: f64,
    pub region_mib: usize,
    pub touches: u64,
    pub reps: usize,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub p999_ns: f64,
    pub mean_ns: f64,
    pub max_ns: f64,
    pub total_ms: f64,
    pub first_touch_ms: f64,
    /// Time to first touch with mmap and `register` (prefault, 10 % case; see [`Sample`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_touch_register_ms: Option<f64>,
    pub setup_ms: f64,
    /// Resident bytes of the mapping over the bytes touched.
    pub rss_over_touched: f64,
    pub huge_fraction: f64,
    /// CPU of the prefault service thread (prefault arms) or the move pool's refill thread.
    pub service_cpu_ms: Option<f64>,
    pub process_cpu_ms: f64,
    pub app_cpu_ms: f64,
    pub app_faults: u64,
    /// The service's or the pool's figures of the median run (by total time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolFigures>,
    /// The median run's per-touch quantiles (for the chart; not in the JSON).
    #[serde(skip)]
    pub quantiles_ns: Vec<f64>,
}

/// The doctor's floor on this machine: the kernel's first touch of a 4 KiB page.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct Floor {
    pub first_touch_p50_us: f64,
    pub first_touch_p99_us: f64,
    pub pages: usize,
}

/// A must-have figure of the issue and whether this run meets it.
#[derive(Serialize, Clone, Debug)]
pub struct Check {
    pub figure: &'static str,
    pub value: Option<f64>,
    pub target: &'static str,
    pub met: Option<bool>,
}

/// What `bench prefault` measured; `--json` prints it as is.
#[derive(Serialize)]
pub struct Report {
    pub machine: machine::Machine,
    pub compared: &'static str,
    /// /sys/kernel/mm/transparent_hugepage/enabled (the "default THP" of the programs).
    pub thp_system_setting: String,
    pub scaling: String,
    pub isolation: &'static str,
    pub tsc_ghz: f64,
    /// The 1-minute load average before and after the run: the service runs SCHED_IDLE, so on
    /// a machine kept busy by other work it falls behind (its `passes` show it).
    pub load_average: [Option<f64>; 2],
    /// Median cost of the timing itself on a cached access, ns (not subtracted).
    pub timer_overhead_ns: f64,
    pub floor: Floor,
    pub results: Vec<Row>,
    pub programs: Value,
    pub critical_path_ratio_write: Option<f64>,
    pub critical_path_ratio_read: Option<f64>,
    pub critical_path_ratio_write_mean: Option<f64>,
    pub critical_path_ratio_uffd_move: Option<f64>,
    pub gap0_time_ratio: Option<f64>,
    pub thp_p99_ratio: Option<f64>,
    pub thp_p999_ratio_vs_kernel_thp: Option<f64>,
    pub startup_ratio_populate_over_prefault: Option<f64>,
    /// prefault's time to first touch over kernel's (10 % of 1 GiB; the issue asks ≤ 1.2),
    /// memory from `Service::map`.
    pub startup_first_touch_ratio_prefault_over_kernel: Option<f64>,
    /// The same with the application's own mmap and `register` (its PROCMAP_QUERY check).
    pub startup_first_touch_ratio_register_over_kernel: Option<f64>,
    pub pool_peak_bytes: Option<u64>,
    pub pool_budget_bytes: u64,
    /// The most `peak_unused_bytes` of any run of the service with the default budget.
    pub pool_peak_bytes_all_runs: Option<u64>,
    pub app_speedup_pct: Option<f64>,
    /// The lowest `speedup_pct` of any program in either THP setting (the issue: ≥ −2).
    pub min_program_speedup_pct: Option<f64>,
    /// The must-have figures against their targets.
    pub must: Vec<Check>,
}

// ---------------------------------------------------------------------------------------------
// What runs: the plan.
// ---------------------------------------------------------------------------------------------

/// Which parts run, at which sizes, and where: [`Scope::of`] gives the CLI's (`--quick` or
/// full, every run in a worker process); [`Scope::smallest`] the library test's.
#[derive(Clone, Debug)]
pub struct Scope {
    pub region_mib: usize,
    pub reps: usize,
    /// Microbenchmark cells: (order, op, gap µs, thp, arms).
    pub cells: Vec<(TouchOrder, Op, f64, bool, Vec<Arm>)>,
    /// The 10 %-of-a-mapping case: its size in MiB (0: not run).
    pub startup_mib: usize,
    pub startup_reps: usize,
    pub programs: bool,
    /// Run every measurement in this process instead of a worker each (the library test only:
    /// the CLI's runs each get a process of their own).
    pub in_process: bool,
    pub floor_pages: usize,
}

impl Scope {
    /// The CLI's scope: `--quick` keeps the cells every must-have figure needs plus a few
    /// others; the full run is the paper's whole matrix.
    pub fn of(o: &Options) -> Scope {
        use Op::*;
        use TouchOrder::*;
        let mut cells = Vec::new();
        if o.quick {
            for gap in [0.0, 5.0] {
                cells.push((Ascending, Write, gap, false, ALL_ARMS.to_vec()));
            }
            cells.push((Ascending, Read, 5.0, false, ALL_ARMS.to_vec()));
            cells.push((Ascending, Write, 5.0, true, THP_ARMS.to_vec()));
            cells.push((
                Ascending,
                Write,
                0.0,
                true,
                vec![Arm::Kernel, Arm::Prefault],
            ));
            for order in [Descending, Stride, Random] {
                cells.push((
                    order,
                    Write,
                    5.0,
                    false,
                    vec![Arm::Kernel, Arm::PopulateAll, Arm::Prefault],
                ));
            }
        } else {
            for op in [Write, Read] {
                for order in [Ascending, Descending, Stride, Random] {
                    for gap in [0.0, 1.0, 5.0, 20.0] {
                        cells.push((order, op, gap, false, ALL_ARMS.to_vec()));
                        cells.push((order, op, gap, true, THP_ARMS.to_vec()));
                    }
                }
            }
        }
        Scope {
            region_mib: if o.quick { 64 } else { 256 },
            reps: 3,
            cells,
            startup_mib: 1024,
            startup_reps: 5,
            programs: true,
            in_process: false,
            floor_pages: if o.quick { 2000 } else { 5000 },
        }
    }

    /// The smallest part of the quick case, for the library test: the cells the must-have
    /// figures come from on an 8 MiB mapping, the 10 % case on 64 MiB, one repetition, no
    /// programs, everything in this process.
    pub fn smallest() -> Scope {
        use Op::*;
        use TouchOrder::*;
        Scope {
            region_mib: 8,
            reps: 1,
            cells: vec![
                (Ascending, Write, 5.0, false, ALL_ARMS.to_vec()),
                (
                    Ascending,
                    Write,
                    0.0,
                    false,
                    vec![Arm::Kernel, Arm::Prefault],
                ),
                (
                    Ascending,
                    Read,
                    5.0,
                    false,
                    vec![Arm::Kernel, Arm::Prefault],
                ),
                (
                    Ascending,
                    Write,
                    5.0,
                    true,
                    vec![Arm::Kernel, Arm::Prefault],
                ),
            ],
            startup_mib: 64,
            startup_reps: 1,
            programs: false,
            in_process: true,
            floor_pages: 200,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The measurement (worker side).
// ---------------------------------------------------------------------------------------------

/// Integer work for the compute gap: `iters` dependent xorshift steps.
#[inline(never)]
fn spin(iters: u64) -> u64 {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// Iterations of [`spin`] per microsecond on this CPU (the fastest of a few tries).
fn calibrate_spin() -> f64 {
    let n = 2_000_000u64;
    spin(n / 10);
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            spin(n);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    n as f64 / (best * 1e6)
}

/// One timed access: `lfence; rdtsc; access; mfence; rdtscp`, in TSC ticks.
#[inline(always)]
fn timed<const WRITE: bool>(p: *mut u8, sink: &mut u8) -> u64 {
    // SAFETY: `p` is inside a live read-write mapping of the caller (a fault there is resolved
    // by the kernel or the fault engine); the fences and TSC reads have no memory effects.
    unsafe {
        _mm_lfence();
        let t0 = _rdtsc();
        if WRITE {
            std::ptr::write_volatile(p, 1);
        } else {
            *sink ^= std::ptr::read_volatile(p);
        }
        _mm_mfence();
        let mut aux = 0u32;
        let t1 = __rdtscp(&mut aux);
        t1.wrapping_sub(t0)
    }
}

/// Touches `idx` (page indices of `base`) in order, one timed access each and `gap_iters` of
/// work after it; returns the instant the first touch ended.
/// Extra mmap → register → first-touch sequences per run for the time to first touch.
pub const START_CYCLES: usize = 20;

fn touch_loop<const WRITE: bool>(
    base: *mut u8,
    idx: &[u32],
    ticks: &mut [u32],
    gap_iters: u64,
    sink: &mut u8,
) -> Instant {
    let mut first = Instant::now();
    for (k, &i) in idx.iter().enumerate() {
        // SAFETY: every index is below the mapping's page count.
        let p = unsafe { base.add(i as usize * PAGE_SIZE) };
        let t = timed::<WRITE>(p, sink);
        ticks[k] = t.min(u32::MAX as u64) as u32;
        if k == 0 {
            first = Instant::now();
        }
        spin(gap_iters);
    }
    first
}

/// The pages an order touches: all of `pages` (a quarter for stride), the first `pct` % of
/// them.
fn order_indices(order: TouchOrder, pages: usize, pct: u32) -> Vec<u32> {
    let mut v: Vec<u32> = match order {
        TouchOrder::Ascending => (0..pages as u32).collect(),
        TouchOrder::Descending => (0..pages as u32).rev().collect(),
        TouchOrder::Stride => (0..pages as u32).step_by(STRIDE).collect(),
        TouchOrder::Random => {
            let mut v: Vec<u32> = (0..pages as u32).collect();
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for i in (1..v.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.swap(i, (x % (i as u64 + 1)) as usize);
            }
            v
        }
    };
    let keep = (v.len() as u64 * pct.min(100) as u64 / 100).max(1) as usize;
    v.truncate(keep);
    v
}

/// An anonymous read-write mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

const HUGE: usize = 2 << 20;

/// A 2 MiB-aligned address where `len` bytes are free now (reserved and released), so that
/// every arm's mapping has the same alignment and THP can map whole units.
fn aligned_hole(len: usize) -> Option<usize> {
    // SAFETY: a PROT_NONE reservation, released right away.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + HUGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: releasing the reservation just made.
    unsafe { libc::munmap(p, len + HUGE) };
    Some((p as usize).next_multiple_of(HUGE))
}

/// Maps the arm's region at `hint` (when free): private anonymous, THP advice, MAP_POPULATE
/// for populate_all.
fn map_region(arm: Arm, thp: bool, hint: Option<usize>, len: usize) -> Result<Mapping> {
    let populate_at_mmap = arm == Arm::PopulateAll && !thp;
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if populate_at_mmap {
        flags |= libc::MAP_POPULATE;
    }
    let map = |flags: i32, at: usize| {
        // SAFETY: an anonymous mapping; MAP_FIXED_NOREPLACE never replaces an existing one.
        unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        }
    };
    let mut p = match hint {
        Some(h) => map(flags | libc::MAP_FIXED_NOREPLACE, h),
        None => libc::MAP_FAILED,
    };
    if p == libc::MAP_FAILED {
        p = map(flags, 0);
    }
    if p == libc::MAP_FAILED {
        bail!(
            "mmap of {} MiB: {}",
            len >> 20,
            std::io::Error::last_os_error()
        );
    }
    let m = Mapping {
        ptr: p as *mut u8,
        len,
    };
    let advice = if thp {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: advice on our own fresh mapping.
    unsafe { libc::madvise(p, len, advice) };
    if arm == Arm::PopulateAll && thp {
        // SAFETY: populating our own mapping (MADV_POPULATE_WRITE, Linux 5.14).
        let r = unsafe { libc::madvise(p, len, tiermem_prefault::os::MADV_POPULATE_WRITE) };
        if r != 0 {
            bail!("MADV_POPULATE_WRITE: {}", std::io::Error::last_os_error());
        }
    }
    Ok(m)
}

/// Resident pages of `[ptr, ptr+len)` (mincore), into `vec` (one byte per page).
fn resident_pages(ptr: *mut u8, len: usize, vec: &mut [u8]) -> u64 {
    // SAFETY: vec has one byte per page of the range, which is our mapping.
    let r = unsafe { libc::mincore(ptr.cast(), len, vec.as_mut_ptr()) };
    if r != 0 {
        return 0;
    }
    vec.iter().filter(|b| **b & 1 == 1).count() as u64
}

/// AnonHugePages of the mapping starting at `base`, from /proc/self/smaps.
fn huge_bytes(base: usize) -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let head = format!("{base:x}-");
    let mut inside = false;
    for l in s.lines() {
        if l.contains('-') && l.split_whitespace().next().is_some_and(|a| a.contains('-')) {
            inside = l.starts_with(&head);
            continue;
        }
        if inside {
            if let Some(v) = l.strip_prefix("AnonHugePages:") {
                return v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0)
                    * 1024;
            }
        }
    }
    0
}

/// Page faults of the calling thread so far (minor + major).
fn thread_faults() -> u64 {
    // SAFETY: getrusage fills the zeroed plain-data struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    (ru.ru_minflt + ru.ru_majflt) as u64
}

/// A zero page for UFFDIO_COPY.
static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];

/// `uffd_copy`: UFFDIO_COPY of a zero page at the fault.
struct CopyZero;
impl Resolver for CopyZero {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        ops.copy(f.offset, &ZERO_PAGE, false).map(|_| ())
    }
}

/// `uffd_zeropage`: UFFDIO_ZEROPAGE at the fault.
struct ZeroPage;
impl Resolver for ZeroPage {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        ops.zero(f.offset, PAGE_SIZE).map(|_| ())
    }
}

/// Pages of the move pool (the paper's 64-entry table).
const POOL_PAGES: usize = 64;
const EMPTY: u8 = 0;
const READY: u8 = 1;
const BUSY: u8 = 2;

/// `uffd_move_pool`'s state, shared by the resolver (in the SIGBUS handler: atomics and ioctls
/// only) and the refill thread.
struct PoolState {
    base: usize,
    slots: [AtomicU8; POOL_PAGES],
    next: AtomicUsize,
    moves: AtomicU64,
    misses: AtomicU64,
    move_errors: AtomicU64,
    refilled: AtomicU64,
    refill_cpu_ns: AtomicU64,
    stop: AtomicBool,
}

/// The literal POE baseline: a pool of pre-zeroed pages moved in at the fault.
struct MovePool {
    state: Arc<PoolState>,
    _map: Mapping,
    refill: Option<std::thread::JoinHandle<()>>,
}

struct MoveResolver(Arc<PoolState>);

impl Resolver for MoveResolver {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        let s = &self.0;
        let start = s.next.load(Ordering::Relaxed);
        for k in 0..POOL_PAGES {
            let i = (start + k) % POOL_PAGES;
            if s.slots[i]
                .compare_exchange(READY, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let r = ops.move_in(f.offset, (s.base + i * PAGE_SIZE) as *const u8, PAGE_SIZE);
            s.slots[i].store(EMPTY, Ordering::Release);
            s.next.store(i + 1, Ordering::Relaxed);
            match r {
                Ok(_) => {
                    s.moves.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(_) => {
                    s.move_errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        s.misses.fetch_add(1, Ordering::Relaxed);
        ops.copy(f.offset, &ZERO_PAGE, false).map(|_| ())
    }
}

impl MovePool {
    /// Maps and fills the pool and starts its refill thread (every 2 ms).
    fn start() -> Result<MovePool> {
        let len = POOL_PAGES * PAGE_SIZE;
        let map = map_region(Arm::Kernel, false, None, len)?;
        // SAFETY: populating our own fresh mapping.
        let r = unsafe {
            libc::madvise(
                map.ptr.cast(),
                len,
                tiermem_prefault::os::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            bail!(
                "populating the move pool: {}",
                std::io::Error::last_os_error()
            );
        }
        let state = Arc::new(PoolState {
            base: map.ptr as usize,
            slots: std::array::from_fn(|_| AtomicU8::new(READY)),
            next: AtomicUsize::new(0),
            moves: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            move_errors: AtomicU64::new(0),
            refilled: AtomicU64::new(0),
            refill_cpu_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s2 = state.clone();
        let refill = std::thread::Builder::new()
            .name("move-pool-refill".into())
            .spawn(move || {
                while !s2.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(2));
                    for (i, slot) in s2.slots.iter().enumerate() {
                        if slot
                            .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Relaxed)
                            .is_err()
                        {
                            continue;
                        }
                        // SAFETY: a page of the pool mapping, which lives until this thread
                        // is joined; the slot is ours (BUSY) so no fault moves it meanwhile.
                        let r = unsafe {
                            libc::madvise(
                                (s2.base + i * PAGE_SIZE) as *mut libc::c_void,
                                PAGE_SIZE,
                                tiermem_prefault::os::MADV_POPULATE_WRITE,
                            )
                        };
                        if r == 0 {
                            s2.refilled.fetch_add(1, Ordering::Relaxed);
                            slot.store(READY, Ordering::Release);
                        } else {
                            slot.store(EMPTY, Ordering::Release);
                        }
                    }
                    s2.refill_cpu_ns
                        .store(cpu::this_thread_ns(), Ordering::Relaxed);
                }
            })
            .context("starting the move pool's refill thread")?;
        Ok(MovePool {
            state,
            _map: map,
            refill: Some(refill),
        })
    }

    fn figures(&self) -> PoolFigures {
        let s = &self.state;
        PoolFigures {
            moves: s.moves.load(Ordering::Relaxed),
            misses: s.misses.load(Ordering::Relaxed),
            move_errors: s.move_errors.load(Ordering::Relaxed),
            refilled: s.refilled.load(Ordering::Relaxed),
            refill_cpu_ms: s.refill_cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

impl Drop for MovePool {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.refill.take() {
            let _ = j.join();
        }
    }
}

fn service_options(arm: Arm) -> tiermem_prefault::Options {
    match arm {
        Arm::PrefaultPaper => tiermem_prefault::Options {
            adaptive: false,
            interval: Duration::from_millis(2),
            ..tiermem_prefault::Options::default()
        },
        _ => tiermem_prefault::Options::default(),
    }
}

fn service_policy(arm: Arm) -> tiermem_prefault::Policy {
    match arm {
        Arm::PrefaultPaper => tiermem_prefault::Policy {
            chunk: 1,
            entries: 64,
            ..tiermem_prefault::Policy::default()
        },
        _ => tiermem_prefault::Policy::default(),
    }
}

/// The arm's mapping (see [`map_region`]), registered with the service when there is one.
fn map_registered(
    svc: Option<&tiermem_prefault::Service>,
    req: &TouchRequest,
    hint: Option<usize>,
    len: usize,
) -> Result<(Mapping, Option<tiermem_prefault::Registration>)> {
    let m = map_region(req.arm, req.thp, hint, len)?;
    let reg = match svc {
        Some(s) => Some(
            s.register(m.ptr, len, service_policy(req.arm))
                .context("registering the region with the prefault service")?,
        ),
        None => None,
    };
    Ok((m, reg))
}

/// Measures one run in this process (a worker's whole job).
pub fn measure(req: &TouchRequest) -> Result<Sample> {
    let len = req.region_bytes;
    anyhow::ensure!(
        len >= PAGE_SIZE && len % PAGE_SIZE == 0,
        "region of {len} bytes"
    );
    let pages = len / PAGE_SIZE;
    let idx = order_indices(req.order, pages, req.touch_pct);
    let n = idx.len();
    // Written now, so that recording a sample never faults.
    let mut ticks = vec![1u32; n];
    let mut mc = vec![1u8; pages];
    let gap_iters = (req.gap_us * req.iters_per_us).round() as u64;
    let mut sink = 0u8;

    // What runs before the clock starts: the service, the engine's runtime thread, the pool.
    let svc = if req.arm.is_prefault() {
        Some(
            tiermem_prefault::Service::start(service_options(req.arm))
                .context("starting the prefault service")?,
        )
    } else {
        None
    };
    let pool = if req.arm == Arm::UffdMovePool {
        Some(MovePool::start()?)
    } else {
        None
    };
    if req.arm.is_uffd() {
        // The engine's runtime thread starts with its first region: start it now.
        let warm = map_region(Arm::Kernel, false, None, PAGE_SIZE)?;
        let h = Engine::global()
            .register(
                RegionSpec::new(warm.ptr, warm.len).in_thread(),
                Arc::new(CopyZero),
            )
            .context("registering with the fault engine")?;
        h.unregister()?;
    }
    // The cost of the timing itself: a cached access to a mapped byte.
    let mut oh: Vec<u64> = (0..101)
        .map(|_| {
            if req.op == Op::Write {
                timed::<true>(mc.as_mut_ptr(), &mut sink)
            } else {
                timed::<false>(mc.as_mut_ptr(), &mut sink)
            }
        })
        .collect();
    oh.sort_unstable();
    let timer_overhead_ns = oh[oh.len() / 2] as f64 / req.tsc_ghz;
    let hole = aligned_hole(len);
    // Every arm waits the same before its clock starts (the service's and the pool's threads
    // settle meanwhile): a vCPU that idled comes back with cold caches, and only some arms
    // sleeping would charge that to them alone.
    std::thread::sleep(Duration::from_millis(5));

    // Time to first touch (the 10 % case): one mmap → register → first touch is ~10-40 µs and
    // varies by 2× between runs on this VM, so the arms kernel and prefault also repeat the
    // sequence on fresh mappings before the measured run, the same way in both arms, and
    // report the median (MAP_POPULATE's hundreds of ms need no repeating).
    // The prefault arm's sequences map with `Service::map` (mmap and a registration that
    // needs no range check, as an application asking the service for fresh memory does); the
    // same number map and `register` (checked with PROCMAP_QUERY), reported beside them, with
    // the measured run, which registers too.
    let mut first_touch_cycles: Vec<f64> = Vec::new();
    let mut setup_cycles: Vec<f64> = Vec::new();
    let mut register_cycles: Vec<f64> = Vec::new();
    if req.touch_pct < 100 && matches!(req.arm, Arm::Kernel | Arm::Prefault) {
        let first_touch = |p: *mut u8, sink: &mut u8| {
            if req.op == Op::Write {
                timed::<true>(p, sink);
            } else {
                timed::<false>(p, sink);
            }
        };
        let at = idx[0] as usize * PAGE_SIZE;
        for _ in 0..START_CYCLES {
            let t = Instant::now();
            match svc.as_ref() {
                Some(s) => {
                    let mut policy = service_policy(req.arm);
                    policy.thp = if req.thp {
                        tiermem_prefault::Thp::On
                    } else {
                        tiermem_prefault::Thp::Off
                    };
                    let c = s.map(len, policy).context("Service::map")?;
                    setup_cycles.push(t.elapsed().as_secs_f64() * 1e3);
                    // SAFETY: the first page of the order is inside the fresh mapping.
                    first_touch(unsafe { c.as_ptr().add(at) }, &mut sink);
                    first_touch_cycles.push(t.elapsed().as_secs_f64() * 1e3);
                    drop(c);
                    std::thread::sleep(Duration::from_millis(1));
                    let t = Instant::now();
                    let (c, r) = map_registered(svc.as_ref(), req, None, len)?;
                    // SAFETY: as above.
                    first_touch(unsafe { c.ptr.add(at) }, &mut sink);
                    register_cycles.push(t.elapsed().as_secs_f64() * 1e3);
                    drop(r);
                    drop(c);
                }
                None => {
                    let (c, r) = map_registered(None, req, None, len)?;
                    setup_cycles.push(t.elapsed().as_secs_f64() * 1e3);
                    // SAFETY: as above.
                    first_touch(unsafe { c.ptr.add(at) }, &mut sink);
                    first_touch_cycles.push(t.elapsed().as_secs_f64() * 1e3);
                    drop(r);
                    drop(c);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    let f0 = thread_faults();
    let c0 = cpu::process_ns();
    let a0 = cpu::this_thread_ns();
    let t0 = Instant::now();
    let (m, reg) = map_registered(svc.as_ref(), req, hole, len)?;
    let handle = if req.arm.is_uffd() {
        let r: Arc<dyn Resolver> = match req.arm {
            Arm::UffdCopy => Arc::new(CopyZero),
            Arm::UffdZeropage => Arc::new(ZeroPage),
            _ => Arc::new(MoveResolver(
                pool.as_ref().map(|p| p.state.clone()).context("no pool")?,
            )),
        };
        Some(
            Engine::global()
                .register(RegionSpec::new(m.ptr, len).in_thread(), r)
                .context("registering the region with the fault engine")?,
        )
    } else {
        None
    };
    let setup = t0.elapsed();
    let first = match req.op {
        Op::Write => touch_loop::<true>(m.ptr, &idx, &mut ticks, gap_iters, &mut sink),
        Op::Read => touch_loop::<false>(m.ptr, &idx, &mut ticks, gap_iters, &mut sink),
    };
    let total = t0.elapsed();
    let app_cpu = cpu::this_thread_ns().saturating_sub(a0);
    let faults = thread_faults().saturating_sub(f0);
    let service = match (&svc, &reg) {
        (Some(s), Some(r)) => {
            let st = s.stats();
            let rs = r.stats();
            Some(ServiceFigures {
                service_cpu_ms: st.service_cpu.as_secs_f64() * 1e3,
                populated_bytes: st.populated_bytes,
                populate_calls: st.populate_calls,
                tripwire_hits: st.tripwire_hits,
                footprint_pages: st.footprint_pages,
                peak_unused_bytes: st.peak_unused_bytes,
                unused_bytes: st.unused_bytes,
                budget_bytes: st.budget_bytes,
                passes: st.passes,
                backoffs: st.backoffs,
                starved_passes: st.starved_passes,
                cpu_hops: st.cpu_hops,
                failures: st.failures,
                sched_idle: st.sched_idle,
                sensing: st.sensing.to_string(),
                learned_order: format!("{:?}", rs.order),
                learned_stride: rs.stride,
            })
        }
        _ => None,
    };
    let pool_figures = pool.as_ref().map(|p| p.figures());
    let process_cpu = cpu::process_ns().saturating_sub(c0);
    let rss = resident_pages(m.ptr, len, &mut mc) * PAGE_SIZE as u64;
    let huge = huge_bytes(m.ptr as usize);
    // The registrations end before the mapping goes.
    drop(reg);
    if let Some(h) = handle {
        h.unregister()?;
    }
    drop(m);
    drop(svc);
    drop(pool);
    std::hint::black_box(sink);

    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .context("histogram")?;
    for &t in &ticks {
        h.saturating_record(((t as f64 / req.tsc_ghz).round() as u64).max(1));
    }
    let mut quantiles_ns: Vec<f64> = (0..200)
        .map(|i| h.value_at_quantile((i as f64 + 0.5) / 200.0) as f64)
        .collect();
    quantiles_ns.extend([
        h.value_at_quantile(0.999) as f64,
        h.value_at_quantile(0.9999) as f64,
        h.max() as f64,
    ]);
    // The measured run's setup and first touch join the sequences it was made like: the
    // `register` ones in the prefault arm of the 10 % case, the others everywhere else.
    let first_ms = first.duration_since(t0).as_secs_f64() * 1e3;
    let first_touch_register_ms = if register_cycles.is_empty() {
        setup_cycles.push(setup.as_secs_f64() * 1e3);
        first_touch_cycles.push(first_ms);
        None
    } else {
        register_cycles.push(first_ms);
        Some(median(register_cycles))
    };
    Ok(Sample {
        touches: n as u64,
        p50_ns: h.value_at_quantile(0.5) as f64,
        p90_ns: h.value_at_quantile(0.9) as f64,
        p99_ns: h.value_at_quantile(0.99) as f64,
        p999_ns: h.value_at_quantile(0.999) as f64,
        mean_ns: h.mean(),
        max_ns: h.max() as f64,
        quantiles_ns,
        // The same sequences as first_touch_ms: each one's setup ends before its first touch,
        // so the median setup is at most the median time to first touch.
        setup_ms: median(setup_cycles),
        first_touch_register_ms,
        first_touch_ms: median(first_touch_cycles),
        total_ms: total.as_secs_f64() * 1e3,
        rss_bytes: rss,
        touched_bytes: (n * PAGE_SIZE) as u64,
        huge_bytes: huge,
        process_cpu_ms: process_cpu as f64 / 1e6,
        app_cpu_ms: app_cpu as f64 / 1e6,
        app_faults: faults,
        timer_overhead_ns,
        service,
        pool: pool_figures,
    })
}

/// Turns THP off for this whole process (inherited by children, kept across exec).
fn disable_thp_for_process() -> Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r != 0 {
        bail!("PR_SET_THP_DISABLE: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The worker process of one run (`tiermem bench prefault-run`, hidden): answers one request
/// (or more) read from stdin; the parent starts one per run.
pub fn run_worker_main() -> Result<()> {
    worker::serve(|r: Request| {
        let v = match r {
            Request::Touch(t) => {
                if !t.thp {
                    disable_thp_for_process()?;
                }
                serde_json::to_value(measure(&t)?)?
            }
            Request::Floor { pages } => serde_json::to_value(floor(pages)?)?,
        };
        Ok(Some(v))
    })
}

fn floor(pages: usize) -> Result<Floor> {
    let v = tiermem_fault::probe::first_touch_ns(pages)?;
    let s = crate::stats::P50P99::from_ns_as_us(&v);
    Ok(Floor {
        first_touch_p50_us: s.p50,
        first_touch_p99_us: s.p99,
        pages,
    })
}

// ---------------------------------------------------------------------------------------------
// The parent: plan, alternate, take medians, compute the figures.
// ---------------------------------------------------------------------------------------------

fn call<T: serde::de::DeserializeOwned>(req: &Request, what: &str, in_process: bool) -> Result<T> {
    if in_process {
        let v = match req {
            Request::Touch(t) => serde_json::to_value(measure(t)?)?,
            Request::Floor { pages } => serde_json::to_value(floor(*pages)?)?,
        };
        return Ok(serde_json::from_value(v)?);
    }
    let mut w = Worker::spawn(
        what,
        &["bench".to_string(), "prefault-run".to_string()],
        Duration::from_secs(600),
        Vec::new(),
    )?;
    let r = w.call(req, what)?;
    w.finish()?;
    Ok(r)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `x` to three significant digits (ratios span decades: 0.0000668 stays readable).
fn sig3(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// The 1-minute load average (/proc/loadavg): how busy the machine was around the run (the
/// service is SCHED_IDLE: it only gets a core nobody else wants).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Four decimals (0.1 µs): times to first touch are ~10 µs, and a ratio of values rounded to
/// the microsecond is off by up to ~10 % (a quick run printed 0.009 against 0.012 ms: 1.33).
fn r4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

#[allow(clippy::too_many_arguments)]
fn row(
    case: &'static str,
    arm: Arm,
    thp: bool,
    order: TouchOrder,
    op: Op,
    gap_us: f64,
    region_mib: usize,
    samples: &[Sample],
) -> Row {
    let m = |f: &dyn Fn(&Sample) -> f64| median(samples.iter().map(f).collect());
    // The run of median total time stands for the cell where a figure is not a number.
    let mut by_total: Vec<&Sample> = samples.iter().collect();
    by_total.sort_by(|a, b| a.total_ms.total_cmp(&b.total_ms));
    let rep = by_total[by_total.len() / 2];
    let service_cpu = if arm.is_prefault() {
        finite(m(&|s| {
            s.service.as_ref().map_or(f64::NAN, |v| v.service_cpu_ms)
        }))
    } else if arm == Arm::UffdMovePool {
        finite(m(&|s| {
            s.pool.as_ref().map_or(f64::NAN, |v| v.refill_cpu_ms)
        }))
    } else {
        None
    };
    Row {
        case,
        arm: arm.name(),
        thp: if thp { "on" } else { "off" },
        order,
        op,
        gap_us,
        region_mib,
        touches: rep.touches,
        reps: samples.len(),
        p50_ns: r2(m(&|s| s.p50_ns)),
        p99_ns: r2(m(&|s| s.p99_ns)),
        p999_ns: r2(m(&|s| s.p999_ns)),
        mean_ns: r2(m(&|s| s.mean_ns)),
        max_ns: r2(m(&|s| s.max_ns)),
        total_ms: r3(m(&|s| s.total_ms)),
        first_touch_ms: r4(m(&|s| s.first_touch_ms)),
        first_touch_register_ms: {
            let v: Vec<f64> = samples
                .iter()
                .filter_map(|s| s.first_touch_register_ms)
                .collect();
            (!v.is_empty()).then(|| r4(median(v)))
        },
        setup_ms: r4(m(&|s| s.setup_ms)),
        rss_over_touched: r3(m(&|s| s.rss_bytes as f64 / s.touched_bytes.max(1) as f64)),
        huge_fraction: r3(m(&|s| s.huge_bytes as f64 / s.rss_bytes.max(1) as f64)),
        service_cpu_ms: service_cpu.map(r3),
        process_cpu_ms: r3(m(&|s| s.process_cpu_ms)),
        app_cpu_ms: r3(m(&|s| s.app_cpu_ms)),
        app_faults: m(&|s| s.app_faults as f64) as u64,
        service: rep.service.clone(),
        pool: rep.pool.clone(),
        quantiles_ns: rep.quantiles_ns.clone(),
    }
}

/// The THP setting of the system (the bracketed word), or what could be read.
fn thp_setting() -> String {
    let s =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    s.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(['[', ']']).to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Run `bench prefault` (the CLI's scope for `o`).
pub fn run(o: &Options) -> Result<Report> {
    run_scoped(o, &Scope::of(o))
}

/// Run `bench prefault` with an explicit scope (see [`Scope`]).
pub fn run_scoped(o: &Options, sc: &Scope) -> Result<Report> {
    if let Some(p) = &o.plot {
        crate::plot::check_path(p)?;
    }
    let load_before = load_average();
    let tsc_ghz = tiermem_media::tsc_ghz();
    let iters_per_us = calibrate_spin();
    let runs_micro: usize = sc.cells.iter().map(|c| c.4.len()).sum::<usize>() * sc.reps;
    let runs_startup = if sc.startup_mib > 0 {
        3 * sc.startup_reps
    } else {
        0
    };
    let programs_planned = if sc.programs {
        programs::planned_runs(o.quick)
    } else {
        0
    };
    crate::progress::plan(
        "bench prefault",
        Some((1 + runs_micro + runs_startup + programs_planned) as u64),
    );
    crate::progress::step("the floor: kernel first touches");
    let floor: Floor = call(
        &Request::Floor {
            pages: sc.floor_pages,
        },
        "prefault floor",
        sc.in_process,
    )?;

    // The microbenchmark: repetitions outermost, arms alternated (rotated) within each cell.
    let region_bytes = sc.region_mib << 20;
    let mut samples: Vec<Vec<Vec<Sample>>> = sc
        .cells
        .iter()
        .map(|c| vec![Vec::new(); c.4.len()])
        .collect();
    for rep in 0..sc.reps {
        for (ci, (order, op, gap, thp, arms)) in sc.cells.iter().enumerate() {
            for k in 0..arms.len() {
                let ai = (k + rep) % arms.len();
                let arm = arms[ai];
                let what = format!(
                    "{} {:?} {:?} gap {gap} µs THP {} (rep {})",
                    arm.name(),
                    order,
                    op,
                    if *thp { "on" } else { "off" },
                    rep + 1
                );
                crate::progress::step(&what);
                let req = Request::Touch(TouchRequest {
                    arm,
                    thp: *thp,
                    order: *order,
                    op: *op,
                    gap_us: *gap,
                    region_bytes,
                    touch_pct: 100,
                    tsc_ghz,
                    iters_per_us,
                });
                let s: Sample = call(&req, &what, sc.in_process)
                    .with_context(|| format!("measuring {what}"))?;
                samples[ci][ai].push(s);
            }
        }
    }
    let mut results = Vec::new();
    for ((order, op, gap, thp, arms), per_arm) in sc.cells.iter().zip(&samples) {
        for (arm, ss) in arms.iter().zip(per_arm) {
            results.push(row(
                "micro",
                *arm,
                *thp,
                *order,
                *op,
                *gap,
                sc.region_mib,
                ss,
            ));
        }
    }

    // 10 % of a large mapping.
    let startup_arms = [Arm::Kernel, Arm::PopulateAll, Arm::Prefault];
    let mut startup: Vec<Vec<Sample>> = vec![Vec::new(); startup_arms.len()];
    if sc.startup_mib > 0 {
        for rep in 0..sc.startup_reps {
            for k in 0..startup_arms.len() {
                let ai = (k + rep) % startup_arms.len();
                let arm = startup_arms[ai];
                let what = format!(
                    "10 % of {} MiB: {} (rep {})",
                    sc.startup_mib,
                    arm.name(),
                    rep + 1
                );
                crate::progress::step(&what);
                let req = Request::Touch(TouchRequest {
                    arm,
                    thp: false,
                    order: TouchOrder::Ascending,
                    op: Op::Write,
                    gap_us: 5.0,
                    region_bytes: sc.startup_mib << 20,
                    touch_pct: 10,
                    tsc_ghz,
                    iters_per_us,
                });
                let s: Sample = call(&req, &what, sc.in_process)
                    .with_context(|| format!("measuring {what}"))?;
                startup[ai].push(s);
            }
        }
        for (arm, ss) in startup_arms.iter().zip(&startup) {
            results.push(row(
                "startup",
                *arm,
                false,
                TouchOrder::Ascending,
                Op::Write,
                5.0,
                sc.startup_mib,
                ss,
            ));
        }
    }

    // The figures.
    let find = |case: &str, arm: Arm, thp: bool, order: TouchOrder, op: Op, gap: f64| {
        results.iter().find(|r| {
            r.case == case
                && r.arm == arm.name()
                && (r.thp == "on") == thp
                && r.order == order
                && r.op == op
                && r.gap_us == gap
        })
    };
    use Op::*;
    use TouchOrder::*;
    let ratio = |a: Option<&Row>, b: Option<&Row>, f: &dyn Fn(&Row) -> f64| match (a, b) {
        (Some(a), Some(b)) => finite(f(a) / f(b)).map(sig3),
        _ => None,
    };
    let micro = |arm, thp, op, gap| find("micro", arm, thp, Ascending, op, gap);
    let k_w5 = micro(Arm::Kernel, false, Write, 5.0);
    let critical_path_ratio_write =
        ratio(micro(Arm::Prefault, false, Write, 5.0), k_w5, &|r| r.p50_ns);
    let critical_path_ratio_read = ratio(
        micro(Arm::Prefault, false, Read, 5.0),
        micro(Arm::Kernel, false, Read, 5.0),
        &|r| r.p50_ns,
    );
    let critical_path_ratio_write_mean =
        ratio(micro(Arm::Prefault, false, Write, 5.0), k_w5, &|r| {
            r.mean_ns
        });
    let critical_path_ratio_uffd_move =
        ratio(micro(Arm::UffdMovePool, false, Write, 5.0), k_w5, &|r| {
            r.p50_ns
        });
    let gap0_time_ratio = ratio(
        micro(Arm::Prefault, false, Write, 0.0),
        micro(Arm::Kernel, false, Write, 0.0),
        &|r| r.total_ms,
    );
    let thp_p99_ratio = ratio(micro(Arm::Prefault, true, Write, 5.0), k_w5, &|r| r.p99_ns);
    let thp_p999_ratio_vs_kernel_thp = ratio(
        micro(Arm::Prefault, true, Write, 5.0),
        micro(Arm::Kernel, true, Write, 5.0),
        &|r| r.p999_ns,
    );
    let st = |arm| find("startup", arm, false, Ascending, Write, 5.0);
    let startup_ratio_populate_over_prefault =
        ratio(st(Arm::PopulateAll), st(Arm::Prefault), &|r| {
            r.first_touch_ms
        });
    let startup_first_touch_ratio_prefault_over_kernel =
        ratio(st(Arm::Prefault), st(Arm::Kernel), &|r| r.first_touch_ms);
    let startup_first_touch_ratio_register_over_kernel = match (st(Arm::Prefault), st(Arm::Kernel))
    {
        (Some(p), Some(k)) => p
            .first_touch_register_ms
            .and_then(|r| finite(r / k.first_touch_ms))
            .map(sig3),
        _ => None,
    };
    let pool_peak_bytes = startup[2]
        .iter()
        .filter_map(|s| s.service.as_ref().map(|v| v.peak_unused_bytes))
        .max();
    let budget = tiermem_prefault::Options::default().budget_bytes as u64;
    let pool_peak_bytes_all_runs = samples
        .iter()
        .zip(&sc.cells)
        .flat_map(|(per_arm, c)| c.4.iter().zip(per_arm))
        .filter(|(a, _)| **a == Arm::Prefault || **a == Arm::PrefaultPaper)
        .flat_map(|(_, ss)| ss.iter())
        .chain(startup[2].iter())
        .filter_map(|s| s.service.as_ref().map(|v| v.peak_unused_bytes))
        .max();

    // Programs.
    let costs = Costs {
        kernel_fault_ns: k_w5.map_or(f64::NAN, |r| r.p50_ns),
        prefault_touch_ns: micro(Arm::Prefault, false, Write, 5.0).map_or(f64::NAN, |r| r.p50_ns),
    };
    let (programs, app_speedup_pct) = if sc.programs {
        programs::run(o.quick, &costs)
    } else {
        (
            json!({"skipped": "not in this scope (the library test's smallest part)"}),
            None,
        )
    };

    let min_program_speedup_pct = programs["min_speedup_pct"].as_f64();
    let chk = |figure, value: Option<f64>, target, ok: &dyn Fn(f64) -> bool| Check {
        figure,
        value,
        target,
        met: value.map(ok),
    };
    let must = vec![
        chk(
            "critical_path_ratio_write",
            critical_path_ratio_write,
            "<= 0.15",
            &|v| v <= 0.15,
        ),
        chk(
            "critical_path_ratio_read",
            critical_path_ratio_read,
            "<= 0.40",
            &|v| v <= 0.40,
        ),
        chk(
            "critical_path_ratio_write_mean",
            critical_path_ratio_write_mean,
            "<= 0.30",
            &|v| v <= 0.30,
        ),
        chk(
            "gap0_time_ratio",
            gap0_time_ratio,
            "<= 1.0 (target 0.8)",
            &|v| v <= 1.0,
        ),
        chk(
            "startup_ratio_populate_over_prefault",
            startup_ratio_populate_over_prefault,
            ">= 10",
            &|v| v >= 10.0,
        ),
        chk(
            "startup_first_touch_ratio_prefault_over_kernel",
            startup_first_touch_ratio_prefault_over_kernel,
            "<= 1.2",
            &|v| v <= 1.2,
        ),
        chk(
            "pool_peak_bytes / pool_budget_bytes",
            pool_peak_bytes.map(|p| r3(p as f64 / budget as f64)),
            "<= 1",
            &|v| v <= 1.0,
        ),
        chk("app_speedup_pct", app_speedup_pct, ">= 3", &|v| v >= 3.0),
        chk(
            "min_program_speedup_pct",
            min_program_speedup_pct,
            ">= -2",
            &|v| v >= -2.0,
        ),
        chk(
            "critical_path_ratio_uffd_move (report)",
            critical_path_ratio_uffd_move,
            "> 1 expected",
            &|v| v > 1.0,
        ),
        chk(
            "thp_p99_ratio (report)",
            thp_p99_ratio,
            "<= 0.1 (target)",
            &|v| v <= 0.1,
        ),
    ];
    let timer_overhead_ns = r2(median(
        samples
            .iter()
            .flatten()
            .flatten()
            .map(|s| s.timer_overhead_ns)
            .collect(),
    ));
    let report = Report {
        machine: machine::describe(),
        compared: "first-touch critical path of anonymous memory: the prefault service (defaults; \
                   the paper's parameters) against the kernel's demand fault, MAP_POPULATE and \
                   userfaultfd (POE's move pool, UFFDIO_COPY, UFFDIO_ZEROPAGE); programs plain \
                   and under `tiermem prefault run`",
        thp_system_setting: thp_setting(),
        scaling: format!(
            "microbenchmark: {} MiB mapping, {} cells, {} repetitions (medians), arms alternated; \
             10 % case: {} MiB, {} repetitions; gap loop {:.1} iterations/µs",
            sc.region_mib,
            sc.cells.len(),
            sc.reps,
            sc.startup_mib,
            sc.startup_reps,
            iters_per_us
        ),
        isolation: if sc.in_process {
            "every run in this process (library test scope)"
        } else {
            "every run in a fresh worker process (tiermem bench prefault-run)"
        },
        tsc_ghz: r3(tsc_ghz),
        load_average: [load_before, load_average()],
        timer_overhead_ns,
        floor,
        results,
        programs,
        critical_path_ratio_write,
        critical_path_ratio_read,
        critical_path_ratio_write_mean,
        critical_path_ratio_uffd_move,
        gap0_time_ratio,
        thp_p99_ratio,
        thp_p999_ratio_vs_kernel_thp,
        startup_ratio_populate_over_prefault,
        startup_first_touch_ratio_prefault_over_kernel,
        startup_first_touch_ratio_register_over_kernel,
        pool_peak_bytes,
        pool_budget_bytes: budget,
        pool_peak_bytes_all_runs,
        app_speedup_pct,
        min_program_speedup_pct,
        must,
    };
    if let Some(path) = &o.plot {
        plot(&report, path)?;
        crate::progress::step(&format!("per-touch CDFs written to {}", path.display()));
    }
    Ok(report)
}

/// The per-touch CDFs of every arm in the headline cell (ascending, 5 µs gap, writes), THP off
/// and on.
fn plot(r: &Report, path: &std::path::Path) -> Result<()> {
    let rows: Vec<&Row> = r
        .results
        .iter()
        .filter(|x| {
            x.case == "micro"
                && x.order == TouchOrder::Ascending
                && x.op == Op::Write
                && x.gap_us == 5.0
        })
        .collect();
    let labels: Vec<String> = rows
        .iter()
        .map(|x| {
            if x.thp == "on" {
                format!("{} THP", x.arm)
            } else {
                x.arm.to_string()
            }
        })
        .collect();
    let series: Vec<crate::plot::Series> = rows
        .iter()
        .zip(&labels)
        .map(|(x, l)| crate::plot::Series {
            label: l,
            samples: &x.quantiles_ns,
        })
        .collect();
    crate::plot::cdf(
        path,
        &format!(
            "First touch, ascending, 5 µs gap, writes, {} MiB ({})",
            rows.first().map_or(0, |x| x.region_mib),
            r.machine.cpu_model
        ),
        "ns per touch (log scale)",
        &series,
    )
}

impl crate::Report for Report {
    fn print_table(&self) {
        println!("tiermem bench prefault — {}", self.compared);
        println!(
            "machine: {}\nTHP (system): {} · TSC {:.3} GHz · timing overhead {:.0} ns · floor: kernel first touch p50 {:.2} µs p99 {:.2} µs · load average {} → {}\n{}\n{}\n",
            self.machine.one_line(),
            self.thp_system_setting,
            self.tsc_ghz,
            self.timer_overhead_ns,
            self.floor.first_touch_p50_us,
            self.floor.first_touch_p99_us,
            self.load_average[0].map_or("?".to_string(), |v| format!("{v:.2}")),
            self.load_average[1].map_or("?".to_string(), |v| format!("{v:.2}")),
            self.scaling,
            self.isolation
        );
        println!(
            "{:<7} {:<15} {:<4} {:<10} {:<5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>6} {:>8} {:>9}",
            "case", "arm", "THP", "order", "op", "gap", "p50 ns", "p99 ns", "p99.9 ns", "mean ns",
            "total ms", "setup ms", "first ms", "RSS/t", "faults", "svc CPU"
        );
        for r in &self.results {
            println!(
                "{:<7} {:<15} {:<4} {:<10} {:<5} {:>5} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.2} {:>9.3} {:>9.3} {:>6.2} {:>8} {:>9}",
                r.case,
                r.arm,
                r.thp,
                format!("{:?}", r.order).to_lowercase(),
                format!("{:?}", r.op).to_lowercase(),
                r.gap_us,
                r.p50_ns,
                r.p99_ns,
                r.p999_ns,
                r.mean_ns,
                r.total_ms,
                r.setup_ms,
                r.first_touch_ms,
                r.rss_over_touched,
                r.app_faults,
                r.service_cpu_ms
                    .map_or("-".to_string(), |v| format!("{v:.1} ms"))
            );
        }
        println!("\nservice figures (median run of each prefault cell):");
        for r in &self.results {
            if let Some(s) = &r.service {
                println!(
                    "  {:<7} {:<15} THP {:<3} {:<10} {:<5} gap {:>4}: {} passes, populated {} MiB in {} calls, tripwire hits {}, footprint {} pages, peak unused {} KiB, order {} {}",
                    r.case,
                    r.arm,
                    r.thp,
                    format!("{:?}", r.order).to_lowercase(),
                    format!("{:?}", r.op).to_lowercase(),
                    r.gap_us,
                    s.passes,
                    s.populated_bytes >> 20,
                    s.populate_calls,
                    s.tripwire_hits,
                    s.footprint_pages,
                    s.peak_unused_bytes >> 10,
                    s.learned_order,
                    if s.learned_stride > 0 { format!("({})", s.learned_stride) } else { String::new() }
                );
            }
            if let Some(p) = &r.pool {
                println!(
                    "  {:<7} {:<15} {:<10} {:<5} gap {:>4}: {} moves, {} misses, {} move errors, {} refilled",
                    r.case,
                    r.arm,
                    format!("{:?}", r.order).to_lowercase(),
                    format!("{:?}", r.op).to_lowercase(),
                    r.gap_us,
                    p.moves,
                    p.misses,
                    p.move_errors,
                    p.refilled
                );
            }
        }
        match self.programs.get("rows") {
            None => println!(
                "\nprograms: skipped ({})",
                self.programs["skipped"].as_str().unwrap_or("")
            ),
            Some(rows) => {
                println!(
                    "\n{:<10} {:<8} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9} {:<6}",
                    "program",
                    "pages",
                    "plain ms",
                    "pref ms",
                    "speedup%",
                    "est %",
                    "faults",
                    "svc CPU%",
                    "same"
                );
                for p in rows.as_array().into_iter().flatten() {
                    let f = |k: &str| p[k].as_f64().map_or("-".to_string(), |v| format!("{v:.2}"));
                    println!(
                        "{:<10} {:<8} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9} {:<6} {}",
                        p["program"].as_str().unwrap_or("?"),
                        p["pages"].as_str().unwrap_or("?"),
                        f("plain_ms"),
                        f("prefault_ms"),
                        f("speedup_pct"),
                        f("est_speedup_pct"),
                        p["app_faults_plain"]
                            .as_u64()
                            .map_or("-".into(), |v| v.to_string()),
                        f("service_cpu_pct"),
                        p["same_output"]
                            .as_bool()
                            .map_or("-", |b| if b { "yes" } else { "NO" }),
                        p["error"].as_str().unwrap_or("")
                    );
                }
            }
        }
        println!("\nfigures against the issue's targets:");
        for c in &self.must {
            println!(
                "  {:<48} {:>10} {:<20} {}",
                c.figure,
                c.value.map_or("-".to_string(), |v| format!("{v:.3}")),
                c.target,
                match c.met {
                    Some(true) => "met",
                    Some(false) => "MISSED",
                    None => "not measured",
                }
            );
        }
        println!(
            "pool_peak_bytes {} of pool_budget_bytes {}",
            self.pool_peak_bytes
                .map_or("-".to_string(), |v| v.to_string()),
            self.pool_budget_bytes
        );
    }
}

mod programs;

/// The microbenchmark's per-touch costs the paper's estimate uses (ns, p50 of the ascending,
/// 5 µs gap, write cell with 4 KiB pages).
pub struct Costs {
    pub kernel_fault_ns: f64,
    pub prefault_touch_ns: f64,
}
