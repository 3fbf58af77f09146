//! `tiermem bench pheap`: FGCK (object-granular checkpoints, 2 user views) against PGCK
//! (page-granular, 1 view), plus 4 and 8 views, on the paper's workloads (paper 004 §4,
//! Tables 3–5) scaled to this machine, and the tracking overhead against glibc malloc.
//!
//! Workloads (each run on a fresh heap in `$TIERMEM_DIR`, default `/dev/shm/tiermem`):
//!
//! * **update** (the paper's STAMP-like regime): N objects of 64 B or 128 B are allocated and
//!   written, then checkpointed once (the *load*); then R rounds, each updating X % of the N
//!   objects chosen at random (X = 1, 10, 50; whole-object writes) followed by `ckall` (the
//!   *steady* phase, which is what bytes, checkpoint time, run time and faults describe).
//!   Every system sees the same random objects (same seeds).
//! * **insert** (Tokyo Cabinet-style): a chained hash table built in the heap (a bucket array
//!   plus one record of 64 B, 128 B or 1 KiB per key: next pointer, key, value), N random keys
//!   inserted, `ckall` at every interval and at the end. The paper's intervals of 5, 10 and 15 s
//!   are scaled by operation count: a "second" is `tick` inserts (quick 400, full 4000), so the
//!   intervals are 5, 10 and 15 ticks; counting operations instead of wall time gives every
//!   system the same work between checkpoints.
//!
//! Systems: `pgck` (1 view), `fgck` (2 views), `fgck4`, `fgck8`; and, without checkpoints,
//! `heap-nockpt` (2 views, writes tracked, never checkpointed) and `malloc` (glibc) doing the
//! same allocations and writes: their ratio is the tracking (+ allocator) overhead.
//!
//! Headline figures come from the sparse update workload (1 % of 64 B and 128 B objects):
//! `bytes_saved_pct` = 1 − FGCK/PGCK bytes copied per steady checkpoint; `speedup_pct` =
//! 1 − FGCK/PGCK steady-phase time (updates + checkpoints); `tracking_overhead_pct` =
//! `heap-nockpt`/`malloc` − 1 on the whole work (allocation, initial writes, updates); the two
//! `*_per_cpu` figures are the same on the benchmark thread's CPU time (`cpu_ms`; the heap has
//! no thread of its own).
//! Times and faults are medians over several runs; bytes are deterministic.
//!
//! One process per run (issue #22): every run of every system — the heaps and the glibc
//! `malloc` baseline — happens in a fresh worker process (this binary re-executed as the hidden
//! `tiermem bench pheap-run`, `bench/worker.rs`), so that no system allocates from a glibc arena
//! another system's run has shaped (the heap's own index vectors, the baseline's records), and
//! each starts from the same state; the parent only orders the runs and computes the medians.

use crate::machine;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tiermem_pheap::{Heap, HeapOptions};

use crate::worker::{self, Worker};
use crate::{cpu, BenchOpts};

/// Sizes of one benchmark run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
struct Plan {
    /// Objects of the update workload.
    update_n: usize,
    /// Rounds (checkpoints) of the steady phase.
    rounds: usize,
    /// Records of the insert workload.
    insert_n: usize,
    /// Inserts per scaled "second".
    tick: usize,
    /// Repetitions (medians).
    runs: usize,
}

/// One result row.
#[derive(Serialize, Clone)]
pub struct Row {
    pub workload: &'static str,
    pub object_size: usize,
    /// Update workload: % of objects updated per round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_pct: Option<usize>,
    /// Insert workload: checkpoint interval in scaled seconds and in inserts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ops: Option<usize>,
    pub system: &'static str,
    /// User views (0 for glibc malloc).
    pub views: usize,
    pub objects: usize,
    /// Checkpoints measured (update: steady rounds; insert: all).
    pub checkpoints: usize,
    pub bytes_copied_per_ckpt: f64,
    pub bytes_copied_total: u64,
    pub objects_copied_per_ckpt: f64,
    pub view_pages_written_per_ckpt: f64,
    pub ckpt_ms_mean: f64,
    pub ckpt_ms_total: f64,
    /// Measured phase: update → steady phase (updates + checkpoints); insert → whole run.
    /// For `malloc` / `heap-nockpt` → the whole work (allocation, initial writes, updates).
    pub run_ms: f64,
    /// CPU milliseconds of the measured phase (the benchmark thread; the heap has no thread of
    /// its own), median.
    pub cpu_ms: f64,
    /// Minor page faults (getrusage) during the measured phase.
    pub minor_faults: u64,
    pub runs: usize,
}

/// What `bench pheap` measured; `--json` prints it as is.
#[derive(Serialize)]
pub struct Report {
    pub machine: machine::Machine,
    pub compared: &'static str,
    pub scaling: String,
    pub results: Vec<Row>,
    pub bytes_saved_pct: f64,
    pub speedup_pct: f64,
    pub tracking_overhead_pct: f64,
    /// The same two figures on CPU time (`cpu_ms`) instead of wall time.
    pub speedup_pct_per_cpu: f64,
    pub tracking_overhead_pct_per_cpu: f64,
    /// FGCK with 4 and 8 views on the sparse workload: bytes saved against PGCK.
    pub bytes_saved_pct_views4: f64,
    pub bytes_saved_pct_views8: f64,
    /// Median time of a checkpoint after one 8-byte write, 128 MiB heap half full of 256 B
    /// objects (µs), and its phases (µs, [`tiermem_pheap::CkStats::PHASES`]).
    pub ckpt_fixed_us: f64,
    pub ckpt_fixed_phase_us: Value,
    /// Checkpoint throughput when every object of that heap was rewritten: bytes copied over
    /// checkpoint time (GB/s, median), and the phases of the median checkpoint (ms).
    pub ckpt_gb_per_s: f64,
    pub ckpt_dense_phase_ms: Value,
    /// The machine's single-thread memcpy bandwidth (GB/s, 64 MiB), beside `ckpt_gb_per_s`.
    pub memcpy_gb_per_s: f64,
    /// The allocation loop (see `alloc_run`): heap (tracked, no checkpoints) time over glibc
    /// malloc's, and over jemalloc's (NaN when libjemalloc.so.2 is absent); each system's
    /// median wall and CPU ms.
    pub alloc_ratio_vs_glibc: f64,
    pub alloc_ratio_vs_jemalloc: f64,
    pub alloc: Value,
    /// Unmodified programs under the preload library (FGCK 2 views vs PGCK 1 view), or why
    /// they were skipped; `preload_slowdown` per program (preload with checkpoints every
    /// 100 ms over plain, medians); `safepoint_pause_p99_us` per multi-threaded server.
    pub programs: Value,
    /// The largest of the servers' safepoint pause p99s (µs; first signal to resume, a
    /// checkpoint every 100 ms under load), NaN when no server ran.
    pub safepoint_pause_p99_us: f64,
}

#[derive(Clone, Copy)]
enum Sys {
    Heap { views: usize, ckpt: bool },
    Malloc,
}

impl Sys {
    fn name(self) -> &'static str {
        match self {
            Sys::Heap {
                views: 1,
                ckpt: true,
            } => "pgck",
            Sys::Heap {
                views: 2,
                ckpt: true,
            } => "fgck",
            Sys::Heap {
                views: 4,
                ckpt: true,
            } => "fgck4",
            Sys::Heap {
                views: 8,
                ckpt: true,
            } => "fgck8",
            Sys::Heap { ckpt: false, .. } => "heap-nockpt",
            _ => "malloc",
        }
    }
    fn views(self) -> usize {
        match self {
            Sys::Heap { views, .. } => views,
            Sys::Malloc => 0,
        }
    }
}

const CKPT_SYSTEMS: [Sys; 4] = [
    Sys::Heap {
        views: 1,
        ckpt: true,
    },
    Sys::Heap {
        views: 2,
        ckpt: true,
    },
    Sys::Heap {
        views: 4,
        ckpt: true,
    },
    Sys::Heap {
        views: 8,
        ckpt: true,
    },
];
const BASELINES: [Sys; 2] = [
    Sys::Heap {
        views: 2,
        ckpt: false,
    },
    Sys::Malloc,
];

/// Measurements of one run.
#[derive(Default, Clone, Copy, Serialize, Deserialize, Debug)]
struct Sample {
    run_ns: u64,
    /// CPU of the benchmark thread (the heap has no thread of its own) over the same phase.
    cpu_ns: u64,
    ckpt_ns: u64,
    ckpts: usize,
    bytes: u64,
    objects: u64,
    pages: u64,
    minflt: u64,
}

fn minflt() -> u64 {
    // SAFETY: getrusage fills the zeroed struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_minflt as u64
    }
}

/// xorshift64*: deterministic, fast, good enough for picking objects.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Allocation backend of one run: a heap (tracked views) or glibc malloc.
struct Backend {
    heap: Option<Heap>,
    path: PathBuf,
    malloced: Vec<*mut u8>,
}

impl Backend {
    /// The backend of `sys`; a heap is created at `path` (removed on drop).
    fn new(sys: Sys, path: &Path, capacity: usize) -> Result<Backend> {
        let path = path.to_path_buf();
        let _ = std::fs::remove_file(&path);
        // SAFETY: malloc_trim only returns free arena memory to the kernel (also pages in the
        // middle of the arena), so that each run, the malloc baseline included, pays its
        // first-touch faults instead of reusing memory freed by the previous run.
        unsafe { libc::malloc_trim(0) };
        let heap = match sys {
            Sys::Heap { views, .. } => Some(
                Heap::create(
                    &path,
                    &HeapOptions {
                        capacity,
                        views,
                        ..HeapOptions::default()
                    },
                )
                .with_context(|| format!("creating heap {}", path.display()))?,
            ),
            Sys::Malloc => None,
        };
        Ok(Backend {
            heap,
            path,
            malloced: Vec::new(),
        })
    }

    fn alloc(&mut self, size: usize) -> Result<*mut u8> {
        match &self.heap {
            Some(h) => Ok(h.malloc(size, None)?),
            None => {
                // SAFETY: plain malloc; the pointer is freed in Drop.
                let p = unsafe { libc::malloc(size) } as *mut u8;
                anyhow::ensure!(!p.is_null(), "malloc({size}) failed");
                self.malloced.push(p);
                Ok(p)
            }
        }
    }

    /// Checkpoint (heap with checkpoints only); adds to `s`.
    fn ckall(&self, s: &mut Sample) -> Result<()> {
        if let Some(h) = &self.heap {
            let st = h.ckall()?;
            s.ckpts += 1;
            s.ckpt_ns += st.nanos;
            s.bytes += st.bytes_copied as u64;
            s.objects += st.objects_copied as u64;
            s.pages += st.pages_written as u64;
        }
        Ok(())
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        for &p in &self.malloced {
            // SAFETY: each pointer came from libc::malloc in `alloc` and is freed once.
            unsafe { libc::free(p.cast()) };
        }
        drop(self.heap.take());
        let _ = std::fs::remove_file(&self.path);
    }
}

fn capacity_for(bytes: usize) -> usize {
    let sb = 64 << 10;
    (bytes * 2 + (4 << 20)).div_ceil(sb) * sb
}

/// Update workload, one run (a heap at `heap`). Measured: the steady phase (heap with
/// checkpoints) or the whole work (baselines).
fn update_run(
    sys: Sys,
    heap: &Path,
    size: usize,
    pct: usize,
    p: &Plan,
    seed: u64,
) -> Result<Sample> {
    let n = p.update_n;
    let mut be = Backend::new(sys, heap, capacity_for(n * size))?;
    let ckpt = matches!(sys, Sys::Heap { ckpt: true, .. });
    let mut s = Sample::default();
    let t_all = Instant::now();
    let c_all = cpu::this_thread_ns();
    let f_all = minflt();
    let mut ptrs = Vec::with_capacity(n);
    for i in 0..n {
        let q = be.alloc(size)?;
        // SAFETY: q points to `size` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(q, i as u8, size) };
        ptrs.push(q);
    }
    if ckpt {
        let mut load = Sample::default();
        be.ckall(&mut load)?;
    }
    let t0 = Instant::now();
    let c0 = cpu::this_thread_ns();
    let f0 = minflt();
    let k = (n * pct / 100).max(1);
    let mut rng = Rng(seed | 1);
    let mut idx: Vec<usize> = (0..n).collect();
    for round in 0..p.rounds {
        // Partial Fisher-Yates: k distinct random objects.
        for j in 0..k {
            let r = j + rng.below(n - j);
            idx.swap(j, r);
            // SAFETY: every pointer is a live allocation of `size` bytes.
            unsafe { std::ptr::write_bytes(ptrs[idx[j]], (round + 7) as u8, size) };
        }
        if ckpt {
            be.ckall(&mut s)?;
        }
    }
    let (t_from, f_from, c_from) = if ckpt {
        (t0, f0, c0)
    } else {
        (t_all, f_all, c_all)
    };
    s.run_ns = t_from.elapsed().as_nanos() as u64;
    s.cpu_ns = cpu::this_thread_ns().saturating_sub(c_from);
    s.minflt = minflt() - f_from;
    Ok(s)
}

/// Insert workload (chained hash table in the heap at `heap`), one run. Measured: the whole
/// run.
fn insert_run(
    sys: Sys,
    heap: &Path,
    size: usize,
    interval_ops: usize,
    p: &Plan,
    seed: u64,
) -> Result<Sample> {
    let n = p.insert_n;
    let nbuckets = (n / 2).next_power_of_two();
    let mut be = Backend::new(sys, heap, capacity_for(n * size + nbuckets * 8))?;
    let ckpt = matches!(sys, Sys::Heap { ckpt: true, .. });
    let mut s = Sample::default();
    let t0 = Instant::now();
    let c0 = cpu::this_thread_ns();
    let f0 = minflt();
    let buckets = be.alloc(nbuckets * 8)? as *mut *mut u8;
    // SAFETY: the bucket array has nbuckets pointer slots.
    unsafe { std::ptr::write_bytes(buckets, 0, nbuckets) };
    let mut rng = Rng(seed | 1);
    let mut since = 0;
    for _ in 0..n {
        let key = rng.next();
        let rec = be.alloc(size)?;
        let b = (key as usize) & (nbuckets - 1);
        // SAFETY: rec has `size` ≥ 64 bytes: [next ptr][key][value...]; b < nbuckets.
        unsafe {
            let head = *buckets.add(b);
            (rec as *mut *mut u8).write(head);
            (rec.add(8) as *mut u64).write(key);
            std::ptr::write_bytes(rec.add(16), (key >> 8) as u8, size - 16);
            *buckets.add(b) = rec;
        }
        since += 1;
        if ckpt && since == interval_ops {
            be.ckall(&mut s)?;
            since = 0;
        }
    }
    if ckpt && since > 0 {
        be.ckall(&mut s)?;
    }
    s.run_ns = t0.elapsed().as_nanos() as u64;
    s.cpu_ns = cpu::this_thread_ns().saturating_sub(c0);
    s.minflt = minflt() - f0;
    Ok(s)
}

/// One run for a `bench pheap-run` worker: the workload (`update`: `param` = % of objects per
/// round; `insert`: `param` = inserts per checkpoint), the system by name, the heap file.
#[derive(Serialize, Deserialize, Debug)]
struct RunRequest {
    workload: String,
    system: String,
    size: usize,
    param: usize,
    seed: u64,
    plan: Plan,
    heap: PathBuf,
}

/// Sets glibc's mmap threshold once per process that measures: glibc otherwise raises it after
/// large frees (the index vectors), so the malloc baseline would reuse resident memory and skip
/// the first-touch faults the heap pays; with it, malloc_trim before each run returns the
/// memory.
fn fix_mmap_threshold() {
    // SAFETY: mallopt only changes allocator tuning.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) };
}

/// The worker process of one run (`tiermem bench pheap-run`, hidden): answers [`RunRequest`]s
/// read from stdin with a [`Sample`], until EOF; the parent starts one per run.
pub fn run_worker_main() -> Result<()> {
    fix_mmap_threshold();
    worker::serve(|r: RunRequest| {
        let Some(sys) = CKPT_SYSTEMS
            .iter()
            .chain(BASELINES.iter())
            .copied()
            .find(|s| s.name() == r.system)
        else {
            bail!("unknown system {:?}", r.system);
        };
        let s = match r.workload.as_str() {
            "update" => update_run(sys, &r.heap, r.size, r.param, &r.plan, r.seed)?,
            "insert" => insert_run(sys, &r.heap, r.size, r.param, &r.plan, r.seed)?,
            "ckcost" => return Ok(Some(ckcost_run(&r.heap, r.param, r.size)?)),
            "alloc" => return Ok(Some(alloc_run(sys, &r.heap, r.param, r.seed)?)),
            w => bail!("unknown workload {w:?}"),
        };
        Ok(Some(serde_json::to_value(s)?))
    })
}

/// Heap capacity of the checkpoint-cost runs (the 128 MiB).
const CKCOST_CAPACITY: usize = 128 << 20;

/// Checkpoint cost, one worker run: a 2-view heap of [`CKCOST_CAPACITY`] half filled with
/// 256 B objects and checkpointed; then `fixed_reps` checkpoints each after one 8-byte write
/// to a random object (the fixed cost) and `dense_reps` checkpoints each after rewriting every
/// object (throughput). Returns each checkpoint's time, bytes and phases.
fn ckcost_run(heap: &Path, fixed_reps: usize, dense_reps: usize) -> Result<Value> {
    let _ = std::fs::remove_file(heap);
    let h = Heap::create(
        heap,
        &HeapOptions {
            capacity: CKCOST_CAPACITY,
            views: 2,
            ..HeapOptions::default()
        },
    )
    .with_context(|| format!("creating heap {}", heap.display()))?;
    let size = 256;
    let n = CKCOST_CAPACITY / 2 / size;
    let mut objs = Vec::with_capacity(n);
    for i in 0..n {
        let p = h.malloc(size, None)?;
        // SAFETY: a fresh object of `size` bytes.
        unsafe { std::ptr::write_bytes(p, i as u8, size) };
        objs.push(p);
    }
    h.ckall()?;
    let mut rng = Rng(0x5eed);
    let one = |st: tiermem_pheap::CkStats| json!({"ns": st.nanos, "bytes": st.bytes_copied, "phase_ns": st.phase_ns});
    let mut fixed = Vec::new();
    for r in 0..fixed_reps {
        let p = objs[rng.below(n)];
        // SAFETY: a live object of 256 bytes, 8-byte aligned (a 256 B slot).
        unsafe { (p as *mut u64).write_volatile(r as u64) };
        fixed.push(one(h.ckall()?));
    }
    let mut dense = Vec::new();
    for r in 0..dense_reps {
        for &p in &objs {
            // SAFETY: every pointer is a live object of `size` bytes.
            unsafe { std::ptr::write_bytes(p, r as u8 ^ 0x5a, size) };
        }
        dense.push(one(h.ckall()?));
    }
    drop(h);
    let _ = std::fs::remove_file(heap);
    Ok(json!({"fixed": fixed, "dense": dense, "objects": n, "object_size": size}))
}

/// Extra environment of a worker process.
type Env = Vec<(String, String)>;

/// Live slots of the allocation loop.
const ALLOC_SLOTS: usize = 1 << 16;

/// The allocation-heavy loop, one worker run: `ops` times, a random one of
/// [`ALLOC_SLOTS`] slots is freed (if full) and refilled with a new object of 16–1023 bytes
/// whose first 8 bytes are written. `heap-nockpt` allocates from a heap (2 views, tracked,
/// never checkpointed); `malloc` from this process's malloc (glibc, or jemalloc when the
/// parent preloaded it into this worker). Returns wall and CPU time of the loop.
fn alloc_run(sys: Sys, heap: &Path, ops: usize, seed: u64) -> Result<Value> {
    let h = match sys {
        Sys::Heap { views, .. } => {
            let _ = std::fs::remove_file(heap);
            Some(
                Heap::create(
                    heap,
                    &HeapOptions {
                        capacity: 256 << 20,
                        views,
                        ..HeapOptions::default()
                    },
                )
                .with_context(|| format!("creating heap {}", heap.display()))?,
            )
        }
        Sys::Malloc => None,
    };
    let mut slots: Vec<*mut u8> = vec![std::ptr::null_mut(); ALLOC_SLOTS];
    let mut rng = Rng(seed | 1);
    let t0 = Instant::now();
    let c0 = cpu::this_thread_ns();
    for i in 0..ops {
        let k = rng.below(ALLOC_SLOTS);
        let size = 16 + rng.below(1008);
        let old = slots[k];
        let p = match &h {
            Some(h) => {
                if !old.is_null() {
                    h.free(old)?;
                }
                h.malloc(size, None)?
            }
            None => {
                // SAFETY: plain malloc/free of pointers this loop got from malloc.
                unsafe {
                    libc::free(old.cast());
                    let p = libc::malloc(size) as *mut u8;
                    anyhow::ensure!(!p.is_null(), "malloc({size}) failed");
                    p
                }
            }
        };
        // SAFETY: p has at least 16 writable bytes.
        unsafe { (p as *mut u64).write_unaligned(i as u64) };
        slots[k] = p;
    }
    let run_ns = t0.elapsed().as_nanos() as u64;
    let cpu_ns = cpu::this_thread_ns().saturating_sub(c0);
    if h.is_none() {
        for p in slots {
            // SAFETY: pointers from malloc above (null is allowed).
            unsafe { libc::free(p.cast()) };
        }
    }
    drop(h);
    let _ = std::fs::remove_file(heap);
    Ok(json!({"run_ns": run_ns, "cpu_ns": cpu_ns}))
}

/// Run one run of `sys` in a fresh worker process (see the module doc); its heap file is
/// `heap`, removed whatever happens.
fn run_in_worker(
    workload: &str,
    sys: Sys,
    heap: &Path,
    size: usize,
    param: usize,
    plan: &Plan,
    seed: u64,
) -> Result<Sample> {
    let v = run_in_worker_env(workload, sys, heap, size, param, plan, seed, &[])?;
    Ok(serde_json::from_value(v)?)
}

/// [`run_in_worker`] returning the worker's answer as it is, the worker started with `env`.
#[allow(clippy::too_many_arguments)]
fn run_in_worker_env(
    workload: &str,
    sys: Sys,
    heap: &Path,
    size: usize,
    param: usize,
    plan: &Plan,
    seed: u64,
    env: &[(String, String)],
) -> Result<Value> {
    let req = RunRequest {
        workload: workload.to_string(),
        system: sys.name().to_string(),
        size,
        param,
        seed,
        plan: *plan,
        heap: heap.to_path_buf(),
    };
    let mut w = Worker::spawn_env(
        &format!("pheap-run {workload} {}", sys.name()),
        &["bench".to_string(), "pheap-run".to_string()],
        env,
        Duration::from_secs(600),
        vec![heap.to_path_buf()],
    )?;
    let s = w.call(&req, &format!("{workload} {size} B run"))?;
    w.finish()?;
    Ok(s)
}

/// The median of `v` (the upper one of an even count; NaN when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// `x` rounded to two decimals.
pub(crate) fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[allow(clippy::too_many_arguments)]
fn row(
    workload: &'static str,
    size: usize,
    update_pct: Option<usize>,
    interval: Option<(usize, usize)>,
    sys: Sys,
    objects: usize,
    samples: &[Sample],
) -> Row {
    let last = samples[samples.len() - 1];
    let c = last.ckpts.max(1) as f64;
    Row {
        workload,
        object_size: size,
        update_pct,
        interval_s: interval.map(|i| i.0),
        interval_ops: interval.map(|i| i.1),
        system: sys.name(),
        views: sys.views(),
        objects,
        checkpoints: last.ckpts,
        bytes_copied_per_ckpt: r2(last.bytes as f64 / c),
        bytes_copied_total: last.bytes,
        objects_copied_per_ckpt: r2(last.objects as f64 / c),
        view_pages_written_per_ckpt: r2(last.pages as f64 / c),
        ckpt_ms_mean: r2(median(samples.iter().map(|s| s.ckpt_ns as f64 / 1e6).collect()) / c),
        ckpt_ms_total: r2(median(
            samples.iter().map(|s| s.ckpt_ns as f64 / 1e6).collect(),
        )),
        run_ms: r2(median(
            samples.iter().map(|s| s.run_ns as f64 / 1e6).collect(),
        )),
        cpu_ms: r2(median(
            samples.iter().map(|s| s.cpu_ns as f64 / 1e6).collect(),
        )),
        minor_faults: median(samples.iter().map(|s| s.minflt as f64).collect()) as u64,
        runs: samples.len(),
    }
}

fn find<'a>(rows: &'a [Row], w: &str, size: usize, pct: usize, sys: &str) -> &'a Row {
    rows.iter()
        .find(|r| {
            r.workload == w && r.object_size == size && r.update_pct == Some(pct) && r.system == sys
        })
        .expect("row measured")
}

/// Run the benchmark.
/// `bench pheap`'s options: the common ones (no chart).
pub type Options = BenchOpts;

/// Run `bench pheap`: every run in a worker process of its own, then the unmodified programs
/// under the preload library where they are installed.
pub fn run(o: &Options) -> Result<Report> {
    let plan = if o.quick {
        Plan {
            update_n: 20_000,
            rounds: 5,
            insert_n: 20_000,
            tick: 400,
            runs: 3,
        }
    } else {
        Plan {
            update_n: 200_000,
            rounds: 20,
            insert_n: 200_000,
            tick: 4_000,
            runs: 5,
        }
    };
    let dir = std::env::var_os("TIERMEM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm/tiermem"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The heap file of every run (one run at a time, each in its worker process).
    let heap = dir.join(format!("bench-pheap-{}.heap", std::process::id()));
    let mut rows = Vec::new();
    // Update workload: 64 B and 128 B objects, 1 / 10 / 50 % per round.
    for size in [64usize, 128] {
        for pct in [1usize, 10, 50] {
            let systems: Vec<Sys> = CKPT_SYSTEMS
                .iter()
                .chain(BASELINES.iter())
                .copied()
                .collect();
            let mut all = vec![Vec::new(); systems.len()];
            // Runs interleave the systems, so that background load spreads over all of them.
            for r in 0..plan.runs {
                for (i, sys) in systems.iter().enumerate() {
                    all[i].push(run_in_worker(
                        "update",
                        *sys,
                        &heap,
                        size,
                        pct,
                        &plan,
                        0x9e37 + r as u64,
                    )?);
                }
            }
            for (sys, samples) in systems.iter().zip(all) {
                let rw = row(
                    "update",
                    size,
                    Some(pct),
                    None,
                    *sys,
                    plan.update_n,
                    &samples,
                );
                crate::progress::step(&format!(
                    "update {size} B {pct:>2} %: {:<11} {:>10.0} B/ckpt {:>8.3} ms/ckpt {:>9.2} ms run {:>7} faults",
                    rw.system, rw.bytes_copied_per_ckpt, rw.ckpt_ms_mean, rw.run_ms, rw.minor_faults
                ));
                rows.push(rw);
            }
        }
    }
    // Insert workload: 64 B, 128 B, 1 KiB records; intervals 5 / 10 / 15 scaled seconds.
    for size in [64usize, 128, 1024] {
        for secs in [5usize, 10, 15] {
            let ops = secs * plan.tick;
            let mut all = vec![Vec::new(); CKPT_SYSTEMS.len()];
            for r in 0..plan.runs {
                for (i, sys) in CKPT_SYSTEMS.iter().enumerate() {
                    all[i].push(run_in_worker(
                        "insert",
                        *sys,
                        &heap,
                        size,
                        ops,
                        &plan,
                        0x51ed + r as u64,
                    )?);
                }
            }
            for (sys, samples) in CKPT_SYSTEMS.into_iter().zip(all) {
                let rw = row(
                    "insert",
                    size,
                    None,
                    Some((secs, ops)),
                    sys,
                    plan.insert_n,
                    &samples,
                );
                crate::progress::step(&format!(
                    "insert {size:>4} B every {secs:>2} s ({ops} ops): {:<6} {:>10.0} B/ckpt {:>8.3} ms/ckpt {:>9.2} ms run {:>7} faults",
                    rw.system, rw.bytes_copied_per_ckpt, rw.ckpt_ms_mean, rw.run_ms, rw.minor_faults
                ));
                rows.push(rw);
            }
        }
        let mut all = vec![Vec::new(); BASELINES.len()];
        for r in 0..plan.runs {
            for (i, sys) in BASELINES.iter().enumerate() {
                all[i].push(run_in_worker(
                    "insert",
                    *sys,
                    &heap,
                    size,
                    usize::MAX,
                    &plan,
                    0x51ed + r as u64,
                )?);
            }
        }
        for (sys, samples) in BASELINES.into_iter().zip(all) {
            let rw = row("insert", size, None, None, sys, plan.insert_n, &samples);
            crate::progress::step(&format!(
                "insert {size:>4} B, no checkpoints: {:<11} {:>9.2} ms run {:>7} faults",
                rw.system, rw.run_ms, rw.minor_faults
            ));
            rows.push(rw);
        }
    }
    // Checkpoint cost on a 128 MiB heap.
    crate::progress::step(
        "checkpoint cost: 128 MiB heap, one small write / every object rewritten",
    );
    let (fixed_reps, dense_reps) = if o.quick { (15, 3) } else { (41, 7) };
    let ck: Value = run_in_worker_env(
        "ckcost",
        Sys::Heap {
            views: 2,
            ckpt: true,
        },
        &heap,
        dense_reps,
        fixed_reps,
        &plan,
        1,
        &[],
    )?;
    let med_of = |list: &Value, f: &dyn Fn(&Value) -> f64| -> f64 {
        median(
            list.as_array()
                .map(|a| a.iter().map(f).collect())
                .unwrap_or_default(),
        )
    };
    let ns = |v: &Value| v["ns"].as_f64().unwrap_or(f64::NAN);
    let phases = |list: &Value, scale: f64| -> Value {
        let mut m = serde_json::Map::new();
        for (i, name) in tiermem_pheap::CkStats::PHASES.iter().enumerate() {
            let v = med_of(list, &|x: &Value| {
                x["phase_ns"][i].as_f64().unwrap_or(f64::NAN)
            });
            m.insert(name.to_string(), json!(r2(v / scale)));
        }
        Value::Object(m)
    };
    let ckpt_fixed_us = r2(med_of(&ck["fixed"], &ns) / 1e3);
    let ckpt_gb_per_s = r2(med_of(&ck["dense"], &|v: &Value| {
        v["bytes"].as_f64().unwrap_or(f64::NAN) / ns(v)
    }));
    let memcpy_gb_per_s = {
        let len = 64 << 20;
        let a = vec![1u8; len];
        let mut b = vec![0u8; len];
        b.copy_from_slice(&a);
        let t = Instant::now();
        for _ in 0..3 {
            b.copy_from_slice(std::hint::black_box(&a));
        }
        r2(3.0 * len as f64 / t.elapsed().as_nanos() as f64)
    };
    crate::progress::step(&format!(
        "checkpoint cost: {ckpt_fixed_us} us after one small write, {ckpt_gb_per_s} GB/s dense (memcpy {memcpy_gb_per_s} GB/s)"
    ));
    // The allocation loop: heap, glibc malloc, jemalloc (preloaded into its worker).
    let jemalloc = [
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib/libjemalloc.so.2",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    // The same 4 M rounds in a quick run (~0.3 s a system): with 1 M, the first 64 k
    // allocations' page faults (each heap page first written through two views) were a third
    // of the heap's time, and the quick ratio said more about the fill than the allocator.
    let alloc_ops = 4_000_000;
    let mut arms: Vec<(&str, Sys, Env)> = vec![
        (
            "heap-nockpt",
            Sys::Heap {
                views: 2,
                ckpt: false,
            },
            vec![],
        ),
        ("glibc", Sys::Malloc, vec![]),
    ];
    if let Some(j) = &jemalloc {
        arms.push((
            "jemalloc",
            Sys::Malloc,
            vec![("LD_PRELOAD".into(), j.display().to_string())],
        ));
    }
    let mut times: Vec<Vec<(f64, f64)>> = vec![Vec::new(); arms.len()];
    for r in 0..plan.runs {
        for (i, (name, sys, env)) in arms.iter().enumerate() {
            crate::progress::step(&format!("allocation loop, {name}, run {}", r + 1));
            let v = run_in_worker_env(
                "alloc",
                *sys,
                &heap,
                0,
                alloc_ops,
                &plan,
                77 + r as u64,
                env,
            )?;
            times[i].push((
                v["run_ns"].as_f64().unwrap_or(f64::NAN) / 1e6,
                v["cpu_ns"].as_f64().unwrap_or(f64::NAN) / 1e6,
            ));
        }
    }
    let mut alloc = serde_json::Map::new();
    let mut alloc_ms = std::collections::HashMap::new();
    for ((name, _, _), t) in arms.iter().zip(&times) {
        let wall = median(t.iter().map(|x| x.0).collect());
        let cpu = median(t.iter().map(|x| x.1).collect());
        alloc_ms.insert(*name, wall);
        alloc.insert(
            name.to_string(),
            json!({"run_ms": r2(wall), "cpu_ms": r2(cpu)}),
        );
    }
    alloc.insert("ops".into(), json!(alloc_ops));
    alloc.insert("live_slots".into(), json!(ALLOC_SLOTS));
    let ratio = |b: &str| {
        alloc_ms
            .get(b)
            .map_or(f64::NAN, |&x| r2(alloc_ms["heap-nockpt"] / x))
    };
    // Headline figures: sparse updates (1 % of 64 B and 128 B objects).
    let sum = |sys: &str, f: &dyn Fn(&Row) -> f64| -> f64 {
        [64, 128]
            .iter()
            .map(|&s| f(find(&rows, "update", s, 1, sys)))
            .sum()
    };
    let bytes = |r: &Row| r.bytes_copied_per_ckpt;
    let time = |r: &Row| r.run_ms;
    let cpu_time = |r: &Row| r.cpu_ms;
    let saved = |sys: &str| r2(100.0 * (1.0 - sum(sys, &bytes) / sum("pgck", &bytes)));
    let report = Report {
        machine: machine::describe(),
        compared: "FGCK (2 user views, object-granular) against PGCK (1 view, page-granular); \
                   4 and 8 views; tracking without checkpoints against glibc malloc",
        scaling: format!(
            "update: {} objects, {} rounds (one checkpoint each), {} runs (medians); insert: {} \
             records, a scaled second = {} inserts (intervals 5/10/15 s = {}/{}/{} inserts)",
            plan.update_n,
            plan.rounds,
            plan.runs,
            plan.insert_n,
            plan.tick,
            5 * plan.tick,
            10 * plan.tick,
            15 * plan.tick
        ),
        bytes_saved_pct: saved("fgck"),
        speedup_pct: r2(100.0 * (1.0 - sum("fgck", &time) / sum("pgck", &time))),
        tracking_overhead_pct: r2(100.0 * (sum("heap-nockpt", &time) / sum("malloc", &time) - 1.0)),
        speedup_pct_per_cpu: r2(100.0 * (1.0 - sum("fgck", &cpu_time) / sum("pgck", &cpu_time))),
        tracking_overhead_pct_per_cpu: r2(
            100.0 * (sum("heap-nockpt", &cpu_time) / sum("malloc", &cpu_time) - 1.0)
        ),
        bytes_saved_pct_views4: saved("fgck4"),
        bytes_saved_pct_views8: saved("fgck8"),
        results: rows,
        ckpt_fixed_us,
        ckpt_fixed_phase_us: phases(&ck["fixed"], 1e3),
        ckpt_gb_per_s,
        ckpt_dense_phase_ms: phases(&ck["dense"], 1e6),
        memcpy_gb_per_s,
        alloc_ratio_vs_glibc: ratio("glibc"),
        alloc_ratio_vs_jemalloc: ratio("jemalloc"),
        alloc: Value::Object(alloc),
        safepoint_pause_p99_us: f64::NAN,
        programs: programs(&dir, o.quick, plan.runs),
    };
    let mut report = report;
    report.safepoint_pause_p99_us = report.programs["safepoint_pause_p99_us"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values().filter_map(Value::as_f64))
        .fold(f64::NAN, f64::max);
    Ok(report)
}

impl crate::Report for Report {
    fn print_table(&self) {
        let report = self;
        println!("tiermem bench pheap — {}", report.machine.one_line());
        println!("{}", report.compared);
        println!("scaling: {}", report.scaling);
        println!();
        println!(
            "{:<7} {:>5} {:>12} {:<12} {:>6} {:>12} {:>10} {:>10} {:>10} {:>9}",
            "work",
            "size",
            "pct/interval",
            "system",
            "ckpts",
            "B/ckpt",
            "ms/ckpt",
            "run ms",
            "faults",
            "pages/ck"
        );
        for r in &report.results {
            let what = match (r.update_pct, r.interval_s) {
                (Some(p), _) => format!("{p} %"),
                (None, Some(s)) => format!("{s} s"),
                _ => "-".into(),
            };
            println!(
                "{:<7} {:>5} {:>12} {:<12} {:>6} {:>12.0} {:>10.3} {:>10.2} {:>10} {:>9.1}",
                r.workload,
                r.object_size,
                what,
                r.system,
                r.checkpoints,
                r.bytes_copied_per_ckpt,
                r.ckpt_ms_mean,
                r.run_ms,
                r.minor_faults,
                r.view_pages_written_per_ckpt
            );
        }
        println!();
        println!(
        "sparse updates (1 % of 64 B and 128 B objects): FGCK copies {:.1} % fewer bytes than PGCK \
         (4 views {:.1} %, 8 views {:.1} %); steady-phase speedup {:.1} % (CPU time {:.1} %); \
         tracking overhead without checkpoints against glibc malloc {:.1} % (CPU time {:.1} %)",
        report.bytes_saved_pct,
        report.bytes_saved_pct_views4,
        report.bytes_saved_pct_views8,
        report.speedup_pct,
        report.speedup_pct_per_cpu,
        report.tracking_overhead_pct,
        report.tracking_overhead_pct_per_cpu
    );
        println!(
            "checkpoints, 128 MiB heap: {:.1} us after one small write ({}); {:.2} GB/s with every \
             object rewritten ({}; memcpy {:.2} GB/s)",
            report.ckpt_fixed_us,
            report.ckpt_fixed_phase_us,
            report.ckpt_gb_per_s,
            report.ckpt_dense_phase_ms,
            report.memcpy_gb_per_s
        );
        println!(
            "allocation loop: heap {:.2}x glibc malloc, {:.2}x jemalloc ({})",
            report.alloc_ratio_vs_glibc, report.alloc_ratio_vs_jemalloc, report.alloc
        );
        match report.programs.get("skipped") {
            Some(why) => println!(
                "unmodified programs: skipped ({})",
                why.as_str().unwrap_or("")
            ),
            None => println!(
                "unmodified programs under the preload library:\n{}",
                serde_json::to_string_pretty(&report.programs).unwrap_or_default()
            ),
        }
    }
}

/// The preload library: `$TIERMEM_PHEAP_PRELOAD`, else `libtiermem_pheap_preload.so` next to
/// this executable (the same target directory).
fn preload_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIERMEM_PHEAP_PRELOAD") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join("libtiermem_pheap_preload.so");
    p.exists().then_some(p)
}

/// Runs Tokyo Cabinet's on-memory database test (`tcutest mdb`) and sqlite3 on an in-memory
/// database under the preload library with checkpoints every 100 ms, views 2 (FGCK) then 1
/// (PGCK), and reports what the library's exit statistics say. Skips cleanly (a `skipped`
/// reason) when the library or the programs are absent; a failing run is reported in its row.
fn programs(dir: &Path, quick: bool, runs: usize) -> Value {
    let Some(lib) = preload_lib() else {
        return json!({"skipped": "libtiermem_pheap_preload.so not found next to this executable (set TIERMEM_PHEAP_PRELOAD)"});
    };
    let n = if quick { 20_000 } else { 200_000 };
    let sql = format!(
        "CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{n})\n\
         INSERT INTO t SELECT x, printf('value-%08d-%s', x, hex(zeroblob(20))) FROM c;\n\
         UPDATE t SET v = 'updated' WHERE k % 100 = 0;\n\
         SELECT count(*), sum(length(v)) FROM t;\n"
    );
    let progs: Vec<(&str, Vec<String>, Option<String>)> = vec![
        (
            "tcutest",
            vec!["mdb".into(), "-rd".into(), n.to_string()],
            None,
        ),
        ("sqlite3", vec![":memory:".into()], Some(sql)),
    ];
    let mut rows = Vec::new();
    let mut saved = serde_json::Map::new();
    let mut slowdown = serde_json::Map::new();
    for (prog, args, stdin) in progs {
        if !crate::on_path(prog) {
            rows.push(json!({"program": prog, "skipped": format!("{prog} not installed")}));
            continue;
        }
        // Plain against the preload (2 views, checkpoints every 100 ms), alternated.
        let (mut plain, mut pre) = (Vec::new(), Vec::new());
        for r in 0..runs {
            crate::progress::step(&format!(
                "{prog}: plain and under the preload, run {}",
                r + 1
            ));
            match plain_run(prog, &args, stdin.as_deref()) {
                Ok(ms) => plain.push(ms),
                Err(e) => {
                    rows.push(json!({"program": prog, "error": format!("plain run: {e}")}));
                    break;
                }
            }
            let row = program_run(dir, &lib, prog, &args, stdin.as_deref(), 2);
            match row["wall_ms"].as_f64() {
                Some(ms) if row.get("error").is_none() => pre.push(ms),
                _ => {
                    rows.push(row);
                    break;
                }
            }
        }
        if !plain.is_empty() && plain.len() == pre.len() {
            let (p, q) = (median(plain.clone()), median(pre.clone()));
            slowdown.insert(prog.to_string(), json!(r2(q / p)));
            rows.push(
                json!({"program": prog, "plain_ms": r2(p), "preload_ckpt100_ms": r2(q),
                "plain_runs_ms": plain, "preload_runs_ms": pre}),
            );
        }
        let mut bytes = [0f64; 2];
        for (i, views) in [2usize, 1].into_iter().enumerate() {
            crate::progress::step(&format!(
                "{prog} under the preload library, {views} view(s)"
            ));
            let r = program_run(dir, &lib, prog, &args, stdin.as_deref(), views);
            bytes[i] = r["bytes_copied"].as_f64().unwrap_or(f64::NAN);
            rows.push(r);
        }
        saved.insert(
            prog.to_string(),
            json!(r2(100.0 * (1.0 - bytes[0] / bytes[1]))),
        );
    }
    let sv = crate::pheap_servers::servers(dir, &lib, quick, runs);
    slowdown.extend(sv.slowdown);
    rows.extend(sv.rows);
    json!({"preload": lib, "ckpt_ms": 100, "rows": rows, "bytes_saved_pct": saved,
           "preload_slowdown": slowdown, "safepoint_pause_p99_us": sv.pause_p99_us})
}

/// Wall time of one plain run of `prog` (stdin fed, output discarded), in ms.
fn plain_run(prog: &str, args: &[String], stdin: Option<&str>) -> Result<f64> {
    use std::io::Write;
    let t0 = Instant::now();
    let mut c = std::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {prog}"))?;
    if let (Some(text), Some(mut si)) = (stdin, c.stdin.take()) {
        si.write_all(text.as_bytes())?;
    }
    let o = c.wait_with_output()?;
    anyhow::ensure!(o.status.success(), "{prog} failed ({})", o.status);
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

fn program_run(
    dir: &Path,
    lib: &Path,
    prog: &str,
    args: &[String],
    stdin: Option<&str>,
    views: usize,
) -> Value {
    use std::io::Write;
    let tag = format!("{prog}-v{views}-{}", std::process::id());
    let stats = dir.join(format!("{tag}.stats.json"));
    let heap = dir.join(format!("{tag}.heap"));
    let _ = std::fs::remove_file(&stats);
    let t0 = Instant::now();
    let child = std::process::Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", lib)
        .env("TIERMEM_CKPT_MS", "100")
        .env("TIERMEM_PHEAP_VIEWS", views.to_string())
        .env("TIERMEM_PHEAP_PATH", &heap)
        .env("TIERMEM_PHEAP_STATS", &stats)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let out = child.and_then(|mut c| {
        if let (Some(text), Some(mut si)) = (stdin, c.stdin.take()) {
            si.write_all(text.as_bytes())?;
        }
        c.wait_with_output()
    });
    let wall_ms = r2(t0.elapsed().as_secs_f64() * 1e3);
    let mut row = json!({"program": prog, "views_requested": views, "wall_ms": wall_ms});
    match out {
        Err(e) => row["error"] = json!(format!("running {prog}: {e}")),
        Ok(o) if !o.status.success() => {
            row["error"] = json!(format!(
                "{prog} failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ))
        }
        Ok(_) => match std::fs::read(&stats)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        {
            None => row["error"] = json!("no statistics written to TIERMEM_PHEAP_STATS"),
            Some(st) => {
                for k in [
                    "views",
                    "checkpoints",
                    "bytes_copied",
                    "objects_copied",
                    "pages_written",
                    "ckpt_ns_total",
                    "allocs",
                    "frees",
                    "fallback_allocs",
                ] {
                    row[k] = st[k].clone();
                }
                if st["views"].as_u64() != Some(views as u64) {
                    row["error"] = json!("the library did not honour TIERMEM_PHEAP_VIEWS");
                }
                if let Some(p) = st["heap_path"].as_str() {
                    let _ = std::fs::remove_file(p);
                }
            }
        },
    }
    let _ = std::fs::remove_file(&stats);
    let _ = std::fs::remove_file(&heap);
    row
}
