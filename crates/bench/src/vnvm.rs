//! `tiermem bench vnvm`: the vNVML paper's microbenchmark (§2.5.3, Fig. 2.16), every system side
//! by side in one run, each in a process of its own.
//!
//! An array of `bytes` (2 GiB; 256 MiB with `--quick`; `TIERMEM_BENCH_VNVM_BYTES` overrides both,
//! for tests) is cut into 4 KiB pages. A cell (P, S) writes S bytes at the start of every page,
//! sequentially, 32 page writes per transaction, over the whole array P times (P = 1: Fig.
//! 2.16(a); P = 16: Fig. 2.16(b)). Each cell is repeated (3 times quick, 5 full) with the systems
//! interleaved in rotating order; the median transactions/s is reported.
//!
//! Systems ([`TxSystem`]):
//! * **vnvm** — the tiermem library (`crates/vnvm`): `nv_txbegin`, 32 × `nv_write`, `nv_commit`;
//!   log and cache pools as large as the array; its time ends when the redo worker has drained.
//! * **pmdk** — libpmemobj (crate `tiermem-pmdk`): `pmemobj_tx_add_range` + `memcpy` per page
//!   write in one transaction, pool on the same tmpfs directory, `PMEM_IS_PMEM_FORCE=1` set before
//!   the pool is created (as the paper does; otherwise every flush is an `msync`).
//! * **memcpy** — plain `memcpy` into a DRAM array: not durable, the upper bound.
//!
//! One process per system (issue #22): each system runs in a worker process of its own (this
//! binary re-executed as the hidden `tiermem bench vnvm-worker`, same environment, directory and
//! CPU affinity; `bench/worker.rs`), set up once, then driven over a pipe one request at a time
//! ([`Request`]: setup, cell, read pass, ...), so the cells stay interleaved and only one system
//! works at a time. vnvm's redo and writeback threads make its process multi-threaded, which
//! sends glibc's allocator and stdio down their locked paths for good: PMDK measured 14-20 %
//! slower in vnvm's process than alone. Each worker times its own cells and reports its own
//! process's CPU (`*_cpu_s`: every thread, user + system, over the cell and its untimed
//! quiesce); the parent only keeps the absorber and the read pass's plain-memory baseline, which
//! are no system, and computes the medians and ratios.
//!
//! Setup — pool creation, allocation of the array and first population (every page resident) —
//! is outside the timed part for every system. Before each system's setup an absorber takes the
//! free memory the kernel has scattered in blocks below 2 MiB, so that the system set up first
//! does not get all of it (see `Absorber`); the report gives each system's working memory's
//! spread over 2 MiB physical blocks (`placement`; page frame numbers need root). A system's
//! time ends when its `drain` returns: everything committed is durable and applied (for vnvm:
//! the redo worker has applied every committed log), so background work is counted, not
//! hidden. After each timed cell the harness
//! calls the system's untimed `quiesce` (vnvm: wait until its writeback worker, lazy writeback
//! to the backing file that durability does not need, is idle), so that no system's background
//! work runs into another system's timed cell.
//!
//! Read pass (`read_overhead_ratio`): after the cells, the median time of a read pass (every
//! 8-byte word of the first 256 MiB summed) over the vnvm region's read-only DRAM view, divided by
//! the same pass over plain memory. See `PlainMemory` for what the baseline is and why it is
//! not the memcpy system's array; the report says what each measured mapping is (kind, page size,
//! resident bytes, physical spread) next to the ratio.
//!
//! Commit latency (`commit_latency`): vnvm's `nv_commit` of one 64-byte write, back to back and
//! after a pause that lets the redo worker fall asleep; see `CommitLatency`.
//!
//! Delay model (`--delay`, default none): each system charges it for what it writes to the
//! (emulated) NVM, with one `write_delay_ns(bytes)` busy-wait per transaction:
//! * memcpy: the data, `32 × S` bytes;
//! * pmdk: per page write, the undo-log entry libpmemobj 1.12 writes (24-byte header + the S-byte
//!   snapshot, rounded up to a 64-byte cache line) plus the S new bytes;
//! * vnvm: charged by the media layer itself — its pools are created with the model in
//!   `TIERMEM_DELAY` (the same variable `--delay` sets and the other systems read; vnvm has no
//!   delay option of its own), so every pool write is charged where it happens: per transaction
//!   in `nv_commit`, on the timed critical path, one write of the log bytes and one read of the
//!   bytes copied from the log to the DRAM cache; in the redo worker, one write (and one log
//!   read) per batch of applied transactions. The worker's charges run on another CPU and count
//!   only as far as the final `drain` waits for them.
//!
//! Under `nvmm` a vnvm commit is charged 0.37-2.4 µs for S = 16-512 (PMDK's transaction 0.4-3.6
//! µs, memcpy's 0.2-1.8 µs): about the same microseconds per transaction as the others, but on
//! transactions of 4-11 µs rather than memcpy's 0.6-2.5 µs, hence a smaller relative change.

use crate::cpu;
use crate::machine;
use crate::stats::percentile;
use crate::worker::{self, Worker};
use crate::{progress, BenchOpts};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tiermem_media::{busy_wait_ns, DelayModel};

/// Page size of the array (the paper's, and vnvm's default cache page).
const PAGE: usize = 4096;
/// Page writes per transaction.
const WRITES_PER_TX: usize = 32;
/// Bytes written per page, the x-axis of Fig. 2.16.
const SIZES: [usize; 6] = [16, 32, 64, 128, 256, 512];
/// Passes over the array: Fig. 2.16(a) and (b).
const PASSES: [usize; 2] = [1, 16];
/// The read pass that measures `read_overhead_ratio` covers at most this much of the array.
const READ_PASS_MAX: usize = 256 << 20;
/// Environment variable that overrides the array size (e.g. `8MiB`, for tests).
const BYTES_ENV: &str = "TIERMEM_BENCH_VNVM_BYTES";
/// Layout name of the PMDK pool.
const PMDK_LAYOUT: &str = "tiermem-bench-vnvm";

/// A transactional system under test.
///
/// The harness calls `setup` once (untimed), then for each cell times a sequence of `run_tx`
/// calls followed by one `drain`, then (untimed) `quiesce`.
pub trait TxSystem {
    /// Short name, the column header (`vnvm`, `pmdk`, `memcpy`).
    fn name(&self) -> &'static str;
    /// Create the array of `bytes` bytes (a multiple of 4 KiB) and make every page resident.
    /// Untimed.
    fn setup(&mut self, bytes: usize) -> Result<()>;
    /// One transaction: apply every `(offset, data)` write atomically and durably (or, for the
    /// non-durable baseline, just apply it). Writes never cross the array's end.
    fn run_tx(&mut self, writes: &[(usize, &[u8])]) -> Result<()>;
    /// Wait until everything committed so far is durable and applied (background work done).
    fn drain(&mut self) -> Result<()>;
    /// Untimed, after `drain`: wait until the system's remaining background work (which is not
    /// needed for durability, e.g. vnvm's lazy writeback to the backing file) is idle, so that
    /// it does not run into the next system's timed cell. Default: nothing to wait for.
    fn quiesce(&mut self) -> Result<()> {
        Ok(())
    }
    /// Background pages written back (vnvm: to the backing file) while timed cells ran and
    /// during `quiesce`, for the report; `None` for systems without such background work.
    fn background_pages(&self) -> Option<BackgroundPages> {
        None
    }
    /// The array as the application reads it (plain loads), for the read pass; `None` when the
    /// system cannot lend it out.
    fn region(&self) -> Option<&[u8]> {
        None
    }
    /// What this system charges to the delay model, for the report.
    fn charges(&self) -> &'static str;
    /// The system's working memory, for the placement report: (what, its `(address, length)`
    /// ranges). Default: nothing.
    fn memory(&self) -> Vec<(&'static str, Vec<(usize, usize)>)> {
        Vec::new()
    }
}

/// The directory of the vnvm system's instance, array and backing file: a fresh one in the
/// benchmark's directory `dir`, named after this (the parent) process; an error (vnvm is then
/// reported unavailable) when `dir` does not exist.
fn vnvm_dir(dir: &Path) -> std::result::Result<PathBuf, String> {
    if !dir.is_dir() {
        return Err(format!(
            "benchmark directory {} does not exist",
            dir.display()
        ));
    }
    Ok(dir.join(format!("vnvm-{}", std::process::id())))
}

impl VnvmSystem {
    /// The vnvm system: log and cache pools as large as the array (the paper's fairness rule),
    /// in `dir` (created by `setup`, removed on drop), one private region over a backing file
    /// there. vnvm has no delay setting of its own: its pools take the model from
    /// `TIERMEM_DELAY` when they are created (`PoolOptions` without a delay), which is where the
    /// global `--delay` puts it and where the other systems read their model from.
    fn new(dir: PathBuf) -> VnvmSystem {
        VnvmSystem {
            dir,
            vn: None,
            region: None,
            wb_mark: 0,
            wb: BackgroundPages::default(),
        }
    }
}

/// vnvm through its Rust API (`nv_txbegin`, `nv_write` × 32, `nv_commit`).
struct VnvmSystem {
    dir: PathBuf,
    vn: Option<tiermem_vnvm::Vnvm>,
    region: Option<tiermem_vnvm::Region>,
    /// `pages_written_back` at the end of the last quiesce.
    wb_mark: u64,
    wb: BackgroundPages,
}

/// Pages a system's background worker wrote back, split by when (the JSON `vnvm_writeback`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct BackgroundPages {
    /// During timed cells (up to the start of the following quiesce).
    pub timed: u64,
    /// During the untimed quiesce after each cell.
    pub quiesce: u64,
}

impl TxSystem for VnvmSystem {
    fn name(&self) -> &'static str {
        "vnvm"
    }

    fn setup(&mut self, bytes: usize) -> Result<()> {
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let cfg = tiermem_vnvm::VnvmConfig {
            dir: self.dir.join("instance"),
            log_size: bytes as u64,
            cache_size: bytes as u64,
            ..Default::default()
        };
        let vn = tiermem_vnvm::nv_init(&cfg).context("vnvm: nv_init")?;
        let region = vn
            .nv_allocate(
                self.dir.join("array.dat"),
                bytes,
                tiermem_vnvm::Mode::Private,
            )
            .context("vnvm: nv_allocate")?;
        // Map the read-only view's pages too (they are resident already, in the DRAM cache's
        // memfd; reading faults them in), so that the placement report sees them. A hint:
        // MADV_POPULATE_READ needs Linux 5.14, and the read pass's warm-up maps them anyway.
        const MADV_POPULATE_READ: libc::c_int = 22;
        // SAFETY: advising the region's own live read-only mapping; populating changes no data.
        unsafe {
            libc::madvise(
                region.as_ptr() as *mut libc::c_void,
                region.len().div_ceil(PAGE) * PAGE,
                MADV_POPULATE_READ,
            )
        };
        self.wb_mark = vn.stats().pages_written_back;
        self.vn = Some(vn);
        self.region = Some(region);
        Ok(())
    }

    fn run_tx(&mut self, writes: &[(usize, &[u8])]) -> Result<()> {
        let (Some(vn), Some(region)) = (&self.vn, &self.region) else {
            bail!("vnvm: run_tx before setup");
        };
        let tid = vn.nv_txbegin();
        for (off, data) in writes {
            vnvm_write(vn, tid, region, *off, data)?;
        }
        vn.nv_commit(tid).context("vnvm: nv_commit")
    }

    fn drain(&mut self) -> Result<()> {
        match &self.vn {
            Some(vn) => vn.drain().context("vnvm: drain"),
            None => Ok(()),
        }
    }

    fn quiesce(&mut self) -> Result<()> {
        let Some(vn) = &self.vn else {
            return Ok(());
        };
        let before = vn.stats().pages_written_back;
        vn.quiesce().context("vnvm: quiesce")?;
        let after = vn.stats().pages_written_back;
        self.wb.timed += before - self.wb_mark;
        self.wb.quiesce += after - before;
        self.wb_mark = after;
        Ok(())
    }

    fn background_pages(&self) -> Option<BackgroundPages> {
        Some(self.wb)
    }

    fn region(&self) -> Option<&[u8]> {
        let r = self.region.as_ref()?;
        // SAFETY: the region's read-only view stays mapped while `self.region` lives, and the
        // returned slice borrows `self`.
        Some(unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) })
    }

    fn charges(&self) -> &'static str {
        "charged by its media pools, with the model in TIERMEM_DELAY: per transaction, in \
         nv_commit (timed, on the critical path), one write of the log bytes (32 x (16-byte \
         entry header + S rounded up to 8) + 16 bytes per 4 KiB log page) and one read of the 32 x S \
         bytes it copies from the log into the DRAM cache; per batch of up to 64 transactions, \
         in the redo worker (on another CPU, timed until drain), one write of the bytes applied \
         to the NVM cache (>= 32 x S) and one log read"
    }

    fn memory(&self) -> Vec<(&'static str, Vec<(usize, usize)>)> {
        let mut v = Vec::new();
        if let Some(r) = self.region() {
            v.push(("DRAM cache", vec![(r.as_ptr() as usize, r.len())]));
        }
        let inst = self.dir.join("instance");
        v.push(("log pool", mapped_file_ranges(&inst.join("log.pool"))));
        v.push(("cache pool", mapped_file_ranges(&inst.join("cache.pool"))));
        v
    }
}

/// Log `data` for region offset `off` in transaction `tid`, waiting for log space if needed.
fn vnvm_write(
    vn: &tiermem_vnvm::Vnvm,
    tid: tiermem_vnvm::Tid,
    region: &tiermem_vnvm::Region,
    off: usize,
    data: &[u8],
) -> Result<()> {
    let mut done = 0;
    while done < data.len() {
        // Pointer arithmetic only: nv_write refuses destinations outside the region.
        let dst = region.as_ptr().wrapping_add(off + done);
        match vn.nv_write(tid, dst, &data[done..]) {
            Ok(n) => done += n,
            Err(tiermem_vnvm::VnvmError::LogFull { logged }) => {
                done += logged;
                if !vn.nv_wait_log_space(std::time::Duration::from_secs(10)) {
                    let _ = vn.nv_abort(tid);
                    bail!("vnvm: the log stayed full for 10 s");
                }
            }
            Err(e) => return Err(e).context("vnvm: nv_write"),
        }
    }
    Ok(())
}

/// Bytes of the one `nv_write` of a commit-latency transaction.
const LAT_WRITE: usize = 64;
/// Pause before each transaction of the "asleep" series: longer than the redo worker polls
/// before it goes to its long sleep (`tiermem_vnvm::REDO_IDLE_AFTER`, 10 ms).
const LAT_PAUSE_NS: u64 = 15_000_000;

/// vnvm's commit latency with its redo worker awake or asleep (JSON `commit_latency`).
///
/// While commits keep coming the redo worker polls every `REDO_POLL` (1 ms) and commits make
/// no system call; after `REDO_IDLE_AFTER` (10 ms) without work it sleeps in `thread::park` (a
/// futex) and the next `nv_commit` wakes it with `unpark`: a `futex(FUTEX_WAKE)` system call
/// and an idle vCPU to wake (the thesis' worker polled every 10 µs forever instead, so its
/// commits never made a system call but a core was never idle). One thread, transactions of
/// one 64-byte `nv_write`, only `nv_commit` timed (TSC clock, `now_ns`): back to back, and each
/// after a 15 ms busy-wait (untimed; the committing CPU stays busy, only the worker's goes
/// idle). `worker_sleeps_*`: voluntary context switches of the redo worker per commit over each
/// series (its polls count too). `unpark_*`: `Thread::unpark` alone, on a thread parked for
/// 15 ms and on one spinning (never parked).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CommitLatency {
    pub awake_p50_ns: u64,
    pub awake_p99_ns: u64,
    pub asleep_p50_ns: u64,
    pub asleep_p99_ns: u64,
    /// asleep - awake, at p50 and p99.
    pub wake_cost_p50_ns: i64,
    pub wake_cost_p99_ns: i64,
    pub awake_commits: usize,
    pub asleep_commits: usize,
    pub pause_us: u64,
    pub worker_sleeps_per_commit_awake: Option<f64>,
    pub worker_sleeps_per_commit_asleep: Option<f64>,
    pub unpark_sleeping_p50_ns: u64,
    pub unpark_sleeping_p99_ns: u64,
    pub unpark_running_p50_ns: u64,
    pub unpark_running_p99_ns: u64,
    /// Median cost of one `now_ns` pair with nothing between (included in every sample).
    pub timer_overhead_ns: u64,
    pub method: String,
}

impl VnvmSystem {
    /// `n` transactions of one 64-byte write each at the start of pages `first..`, each after
    /// `pause_ns` of busy-waiting; returns the nv_commit times and the redo worker's voluntary
    /// context switches meanwhile.
    fn commit_series(
        &self,
        n: usize,
        pause_ns: u64,
        first: usize,
    ) -> Result<(Vec<u64>, Option<u64>)> {
        let (Some(vn), Some(region)) = (&self.vn, &self.region) else {
            bail!("vnvm: commit latency before setup");
        };
        let pages = region.len() / PAGE;
        let data = [0x5a_u8; LAT_WRITE];
        let worker = thread_tid("vnvm-redo");
        let sw0 = worker.and_then(voluntary_switches);
        let mut out = Vec::with_capacity(n);
        for k in 0..n {
            busy_wait_ns(pause_ns);
            let tid = vn.nv_txbegin();
            let off = ((first + k) % pages) * PAGE;
            vnvm_write(vn, tid, region, off, &data)?;
            let t0 = tiermem_media::now_ns();
            vn.nv_commit(tid).context("vnvm: nv_commit")?;
            out.push(tiermem_media::now_ns() - t0);
        }
        let sw = sw0.zip(worker.and_then(voluntary_switches));
        vn.drain().context("vnvm: drain")?;
        Ok((out, sw.map(|(a, b)| b.saturating_sub(a))))
    }

    /// The commit-latency measurement: `n` back-to-back commits, `n_asleep` after a pause.
    fn commit_latency(&self, n: usize, n_asleep: usize) -> Result<CommitLatency> {
        let Some(vn) = &self.vn else {
            bail!("vnvm: commit latency before setup");
        };
        vn.quiesce().context("vnvm: quiesce")?;
        self.commit_series(n / 10, 0, 0)?; // warm-up
        let (awake, sw_awake) = self.commit_series(n, 0, n / 10)?;
        let (asleep, sw_asleep) = self.commit_series(n_asleep, LAT_PAUSE_NS, n / 10 + n)?;
        vn.quiesce().context("vnvm: quiesce")?;
        // The redo worker's park timeout (vnvm's redo_loop: a quarter of the maximum
        // transaction age, within 1..200 ms): the helper thread parks the same way.
        let period = (vn.config().max_tx_age / 4).clamp(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(200),
        );
        let (unpark_sleeping, unpark_running) = unpark_costs(n_asleep.div_ceil(2), period);
        let timer = (0..1001)
            .map(|_| {
                let t0 = tiermem_media::now_ns();
                tiermem_media::now_ns() - t0
            })
            .collect::<Vec<_>>();
        let pct = |v: &[u64], p: f64| {
            let f: Vec<f64> = v.iter().map(|x| *x as f64).collect();
            percentile(&f, p) as u64
        };
        let per = |sw: Option<u64>, n: usize| sw.map(|s| round2(s as f64 / n.max(1) as f64));
        let (a50, a99, s50, s99) = (
            pct(&awake, 50.0),
            pct(&awake, 99.0),
            pct(&asleep, 50.0),
            pct(&asleep, 99.0),
        );
        Ok(CommitLatency {
            awake_p50_ns: a50,
            awake_p99_ns: a99,
            asleep_p50_ns: s50,
            asleep_p99_ns: s99,
            wake_cost_p50_ns: s50 as i64 - a50 as i64,
            wake_cost_p99_ns: s99 as i64 - a99 as i64,
            awake_commits: awake.len(),
            asleep_commits: asleep.len(),
            pause_us: LAT_PAUSE_NS / 1000,
            worker_sleeps_per_commit_awake: per(sw_awake, awake.len()),
            worker_sleeps_per_commit_asleep: per(sw_asleep, asleep.len()),
            unpark_sleeping_p50_ns: pct(&unpark_sleeping, 50.0),
            unpark_sleeping_p99_ns: pct(&unpark_sleeping, 99.0),
            unpark_running_p50_ns: pct(&unpark_running, 50.0),
            unpark_running_p99_ns: pct(&unpark_running, 99.0),
            timer_overhead_ns: pct(&timer, 50.0),
            method: "one thread; per transaction nv_txbegin + one 64-byte nv_write (untimed) and \
                     nv_commit timed with the TSC clock; awake: back to back; asleep: each after \
                     a 15 ms busy-wait (untimed; the worker goes to its long sleep after 10 ms \
                     idle); worker sleeps: voluntary context switches of \
                     the redo worker per commit"
                .to_string(),
        })
    }
}

/// `Thread::unpark` timed alone, `n` times on a thread parked (`park_timeout(period)`, as the
/// redo worker) for 15 ms and `n` times on a thread that spins and never parks; nanoseconds.
fn unpark_costs(n: usize, period: std::time::Duration) -> (Vec<u64>, Vec<u64>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let time_unparks = |park: bool, pause_ns: u64| {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let h = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                if park {
                    std::thread::park_timeout(period);
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            busy_wait_ns(pause_ns);
            let t0 = tiermem_media::now_ns();
            h.thread().unpark();
            v.push(tiermem_media::now_ns() - t0);
        }
        stop.store(true, Ordering::Release);
        h.thread().unpark();
        let _ = h.join();
        v
    };
    (time_unparks(true, LAT_PAUSE_NS), time_unparks(false, 2_000))
}

/// The kernel id of this process's thread named `name` (`/proc/self/task/*/comm`).
fn thread_tid(name: &str) -> Option<u32> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })?
        .file_name()
        .to_str()?
        .parse()
        .ok()
}

/// `voluntary_ctxt_switches` of thread `tid` of this process.
fn voluntary_switches(tid: u32) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    t.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

impl Drop for VnvmSystem {
    fn drop(&mut self) {
        self.region = None;
        if let Some(vn) = self.vn.take() {
            if let Err(e) = vn.nv_release() {
                eprintln!("tiermem bench vnvm: nv_release failed: {e}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Plain memcpy into a DRAM array: no durability at all, the upper bound.
struct MemcpySystem {
    array: Vec<u8>,
    delay: DelayModel,
}

impl TxSystem for MemcpySystem {
    fn name(&self) -> &'static str {
        "memcpy"
    }

    fn setup(&mut self, bytes: usize) -> Result<()> {
        // A non-zero fill: touches every page (calloc'd zero pages could stay unmapped).
        self.array = vec![0xa5; bytes];
        Ok(())
    }

    fn run_tx(&mut self, writes: &[(usize, &[u8])]) -> Result<()> {
        let mut bytes = 0u64;
        for (off, data) in writes {
            let Some(dst) = self.array.get_mut(*off..*off + data.len()) else {
                bail!("memcpy: write at {off} outside the array");
            };
            dst.copy_from_slice(data);
            bytes += data.len() as u64;
        }
        charge(&self.delay, bytes);
        Ok(())
    }

    fn drain(&mut self) -> Result<()> {
        Ok(())
    }

    fn charges(&self) -> &'static str {
        "the data: 32 x S bytes per transaction"
    }

    fn memory(&self) -> Vec<(&'static str, Vec<(usize, usize)>)> {
        vec![(
            "array",
            vec![(self.array.as_ptr() as usize, self.array.len())],
        )]
    }
}

/// libpmemobj: one undo-log transaction per call, pool on the benchmark's tmpfs directory.
struct PmdkSystem {
    path: PathBuf,
    pool: Option<tiermem_pmdk::Pool>,
    delay: DelayModel,
}

impl PmdkSystem {
    /// NVM bytes libpmemobj writes for one page write of `s` bytes: its undo-log entry (24-byte
    /// header + snapshot, cache-line aligned) and the new data.
    fn nvm_bytes(s: usize) -> u64 {
        (((24 + s).div_ceil(64) * 64) + s) as u64
    }
}

impl TxSystem for PmdkSystem {
    fn name(&self) -> &'static str {
        "pmdk"
    }

    fn setup(&mut self, bytes: usize) -> Result<()> {
        self.pool = None;
        let _ = std::fs::remove_file(&self.path);
        // pmemobj_root allocates the root object zeroed: every page is written, hence resident.
        let pool = tiermem_pmdk::Pool::create(
            &self.path,
            PMDK_LAYOUT,
            tiermem_pmdk::pool_size_for(bytes),
            bytes,
        )
        .with_context(|| format!("creating the PMDK pool for a {bytes}-byte array"))?;
        self.pool = Some(pool);
        Ok(())
    }

    fn run_tx(&mut self, writes: &[(usize, &[u8])]) -> Result<()> {
        let pool = self.pool.as_mut().context("pmdk: setup not called")?;
        pool.transaction(writes)?;
        if !self.delay.is_none() {
            let bytes = writes.iter().map(|(_, d)| Self::nvm_bytes(d.len())).sum();
            charge(&self.delay, bytes);
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<()> {
        // A committed libpmemobj transaction is already durable and in place.
        Ok(())
    }

    fn region(&self) -> Option<&[u8]> {
        self.pool.as_ref().map(|p| p.as_slice())
    }

    fn charges(&self) -> &'static str {
        "per page write: the undo-log entry (24-byte header + S-byte snapshot, rounded up to 64 \
         bytes) + the S new bytes; one write_delay_ns(sum) per transaction"
    }

    fn memory(&self) -> Vec<(&'static str, Vec<(usize, usize)>)> {
        match self.region() {
            Some(r) => vec![("pool (array)", vec![(r.as_ptr() as usize, r.len())])],
            None => Vec::new(),
        }
    }
}

impl Drop for PmdkSystem {
    fn drop(&mut self) {
        self.pool = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Busy-wait the model's cost of writing `bytes` (nothing under the `none` model).
fn charge(delay: &DelayModel, bytes: u64) {
    if !delay.is_none() {
        busy_wait_ns(delay.write_delay_ns(bytes));
    }
}

/// One row of the result table (the JSON shape of issue #3).
#[derive(Serialize)]
pub struct Row {
    pub passes: usize,
    pub bytes_per_page: usize,
    pub vnvm_tps: Option<f64>,
    pub pmdk_tps: f64,
    pub memcpy_tps: f64,
    pub ratio_vs_pmdk: Option<f64>,
    /// CPU seconds each system used for the cell (median over the repetitions; see
    /// `Report::cpu_method`).
    pub vnvm_cpu_s: Option<f64>,
    /// vnvm's CPU seconds within the timed window alone (without the quiesce, where its
    /// writeback worker writes the cell's pages to the backing file), median.
    pub vnvm_cpu_timed_s: Option<f64>,
    pub pmdk_cpu_s: f64,
    pub memcpy_cpu_s: f64,
    /// Transactions per CPU-second (median over the repetitions).
    pub vnvm_tps_per_cpu: Option<f64>,
    pub pmdk_tps_per_cpu: Option<f64>,
    /// vnvm's transactions per CPU-second over PMDK's: the wall-clock ratio's counterpart when
    /// vnvm's background threads use the second CPU.
    pub ratio_vs_pmdk_per_cpu: Option<f64>,
    pub transactions: usize,
}

/// The delay model and what each system is charged.
#[derive(Serialize)]
pub struct DelayInfo {
    pub model: String,
    pub memcpy_charged: String,
    pub pmdk_charged: String,
    pub vnvm_charged: String,
}

/// The PMDK baseline's library and pool.
#[derive(Serialize)]
pub struct PmdkInfo {
    pub libpmemobj: &'static str,
    pub pool: String,
    pub pool_bytes: u64,
    pub pmem_is_pmem_force: String,
}

/// Sequential read bandwidth over each system's memory.
#[derive(Serialize)]
pub struct ReadPass {
    pub bytes: usize,
    pub repetitions: usize,
    pub method: &'static str,
    pub plain_gbps: f64,
    pub pmdk_gbps: Option<f64>,
    pub vnvm_gbps: Option<f64>,
    pub plain_memory: MemoryInfo,
    pub pmdk_memory: Option<MemoryInfo>,
    pub vnvm_memory: Option<MemoryInfo>,
}

/// What `bench vnvm` measured; `--json` prints it as is.
#[derive(Serialize)]
pub struct Report {
    pub machine: machine::Machine,
    pub compared: &'static str,
    pub quick: bool,
    pub array_bytes: usize,
    pub page_bytes: usize,
    pub writes_per_tx: usize,
    pub passes: [usize; 2],
    pub repetitions: usize,
    pub statistic: &'static str,
    /// How the systems were kept apart: "one process per system".
    pub isolation: &'static str,
    /// What that means, and how the parent drives the workers.
    pub isolation_method: &'static str,
    /// How `*_cpu_s` is measured.
    pub cpu_method: &'static str,
    pub delay: DelayInfo,
    pub pmdk: PmdkInfo,
    pub vnvm: String,
    /// vnvm's writeback worker (lazy writeback of NVM-cache pages to the backing file, not
    /// needed for durability): pages written back while timed cells ran and during the
    /// untimed quiesce after them.
    pub vnvm_writeback: Option<BackgroundPages>,
    pub results: Vec<Row>,
    pub read_overhead_ratio: Option<f64>,
    /// vnvm's nv_commit latency with the redo worker awake and asleep; `None` without vnvm.
    pub commit_latency: Option<CommitLatency>,
    /// Physical placement of every system's working memory after setup.
    pub placement: Placement,
    pub read_pass: ReadPass,
    pub seconds: f64,
}

/// The array size: the env override, or 2 GiB / 256 MiB; whole pages, at least one.
fn array_bytes(quick: bool) -> Result<usize> {
    let bytes = match std::env::var(BYTES_ENV) {
        Ok(v) if !v.trim().is_empty() => {
            crate::parse_size(&v).with_context(|| format!("{BYTES_ENV}={v}"))? as usize
        }
        _ if quick => 256 << 20,
        _ => 2 << 30,
    };
    if bytes < PAGE {
        bail!("{BYTES_ENV}: the array needs at least one 4 KiB page, got {bytes} bytes");
    }
    Ok(bytes / PAGE * PAGE)
}

/// Time one cell on one system: `passes` sequential passes of S-byte writes at the start of every
/// page, 32 per transaction, then `drain`. Returns (transactions, seconds).
fn time_cell(
    sys: &mut dyn TxSystem,
    pages: usize,
    s: usize,
    passes: usize,
    seed: u8,
) -> Result<(usize, f64)> {
    let mut src = vec![0u8; WRITES_PER_TX * s];
    let mut txs = 0;
    let start = Instant::now();
    for pass in 0..passes {
        // New bytes every pass, so no pass rewrites what is already there.
        let v = seed
            .wrapping_mul(17)
            .wrapping_add(pass as u8)
            .wrapping_add(1);
        src.fill(v);
        let mut writes: Vec<(usize, &[u8])> = Vec::with_capacity(WRITES_PER_TX);
        for first in (0..pages).step_by(WRITES_PER_TX) {
            writes.clear();
            writes.extend(
                (first..(first + WRITES_PER_TX).min(pages))
                    .zip(src.chunks_exact(s))
                    .map(|(page, data)| (page * PAGE, data)),
            );
            sys.run_tx(&writes)
                .with_context(|| format!("{}: transaction at page {first}", sys.name()))?;
            txs += 1;
        }
    }
    sys.drain()
        .with_context(|| format!("{}: drain", sys.name()))?;
    Ok((txs, start.elapsed().as_secs_f64()))
}

/// The plain-memory baseline of the read pass: an anonymous private mapping of its own,
/// page-aligned, with every page written (a non-zero fill) as soon as it is mapped.
///
/// It used to be the first 256 MiB of the memcpy system's array, which read 15-25% *slower*
/// than vnvm's view (ratio 0.73-0.91) for a reason that has nothing to do with vnvm: the array
/// is the process's first large allocation, and the page allocator serves order-0 faults from
/// the smallest free blocks first, so that allocation soaks up the free memory left scattered by
/// earlier processes (and by the tmpfs files of earlier runs). Its 65536 4 KiB pages lay in
/// ~1600-2100 distinct 2 MiB physical blocks (pagemap PFNs), against ~140-700 for the buffers
/// allocated after it; on a 2-vCPU KVM guest (AMD EPYC) a read pass over such scattered pages
/// runs 10-25% slower, with the same code, page size (4 KiB, no THP), population and data,
/// whatever the alignment or the order of the passes. So the baseline is allocated right after
/// vnvm's region, from the same state of free memory, and the report shows each mapping's
/// physical spread (`phys_2mib_blocks`, root only) so that a remaining difference is visible.
///
/// Page size: vnvm's view is a memfd (shmem), whose huge pages follow `shmem_enabled`, while
/// anonymous memory follows `enabled`; the two differ by default (`never` vs `madvise`, or
/// `always` on some distributions). The baseline is given the same page size as the view can
/// have — `MADV_HUGEPAGE` if the view's mapping is THP-eligible, `MADV_NOHUGEPAGE` otherwise — so
/// the ratio compares the access path, not the page size (both are reported).
struct PlainMemory {
    ptr: *mut u8,
    len: usize,
}

impl PlainMemory {
    /// Map `len` bytes (`huge`: advise 2 MiB pages, else forbid them) and write every page.
    fn new(len: usize, huge: bool) -> Result<PlainMemory> {
        // SAFETY: a fresh anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mmap of {len} bytes for the read pass failed: {}",
                std::io::Error::last_os_error()
            );
        }
        let advice = if huge {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: advising our own mapping. A hint: on failure (a kernel without THP) the
        // default stays, and the report shows the page size the mapping really has.
        unsafe { libc::madvise(p, len, advice) };
        // SAFETY: p..p+len is our writable mapping. Written now, so that no page is left to the
        // shared zero page or to a first-touch fault in a timed pass.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0xa5, len) };
        Ok(PlainMemory { ptr: p.cast(), len })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: our mapping, alive while self is; the slice borrows self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PlainMemory {
    fn drop(&mut self) {
        // SAFETY: we own this mapping.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Size of one absorber chunk: 16 blocks of 2 MiB, enough to tell scattered from contiguous.
const ABSORB_CHUNK: usize = 32 << 20;
/// Movable free memory in blocks below 2 MiB that the absorber may leave.
const ABSORB_LEFT: u64 = 16 << 20;
/// Environment variable: `0` turns the absorber off (to see the unequal placement it prevents).
const ABSORB_ENV: &str = "TIERMEM_BENCH_VNVM_ABSORB";

/// Soaks up the scattered free memory before each system is set up, so that no system's working
/// memory gets it (see `PlainMemory` for why scattered pages are slower on this kind of VM).
///
/// The page allocator serves 4 KiB faults from the smallest free blocks first: whatever is set
/// up first gets the free fragments below 2 MiB, the rest get pages split from large free
/// blocks. Measured before this existed (256 MiB array, setup order memcpy, pmdk, vnvm): the
/// memcpy array lay in ~1,900-2,300 distinct 2 MiB physical blocks and the PMDK pool in
/// ~1,450-2,300, for a minimum of 128; vnvm's memory in 130-2,300 depending on how much
/// scattered memory was left for it (1.2-2.4 GiB of free memory was in blocks below 2 MiB).
/// [`Absorber::fill`] maps `ABSORB_CHUNK`s of anonymous 4 KiB pages and writes them, one after
/// the other, until the movable free memory in blocks below 2 MiB (`/proc/pagetypeinfo`) is
/// down to `ABSORB_LEFT` and the last chunk came out physically contiguous (its pages in at most
/// 1.25 x the minimum number of 2 MiB blocks); without root (neither that file nor page frame
/// numbers readable), until it holds the free memory `/proc/buddyinfo` lists in blocks below
/// 2 MiB. `run` fills it before each system's setup (other processes may free scattered memory
/// meanwhile) and frees it once every system and the read pass's baseline are set up, before
/// the timed cells.
struct Absorber {
    chunks: Vec<PlainMemory>,
    cap: usize,
    info: AbsorberInfo,
}

/// What the absorber did (JSON `placement.absorber`).
#[derive(Serialize, Clone, Debug, Default)]
pub struct AbsorberInfo {
    pub enabled: bool,
    pub bytes: u64,
    /// Fills: one before each system's setup and one before the read pass's baseline.
    pub fills: u32,
    /// Free memory in blocks below 2 MiB before the first fill and after the last (movable
    /// pages from `/proc/pagetypeinfo` when readable, else every free block of
    /// `/proc/buddyinfo`).
    pub small_free_before_bytes: Option<u64>,
    pub small_free_after_bytes: Option<u64>,
    /// Distinct 2 MiB physical blocks of the first and the last chunk (minimum: 16).
    pub first_chunk_2mib_blocks: Option<u64>,
    pub last_chunk_2mib_blocks: Option<u64>,
    /// Why the last fill stopped.
    pub stopped: String,
    pub seconds: f64,
}

impl Absorber {
    /// An empty absorber that will map at most `cap` bytes.
    fn new(cap: usize) -> Absorber {
        Absorber {
            chunks: Vec::new(),
            cap,
            info: AbsorberInfo {
                enabled: true,
                small_free_before_bytes: small_free_bytes().map(|(f, _)| f),
                ..Default::default()
            },
        }
    }

    /// Map chunks until the movable free memory in blocks below 2 MiB is down to
    /// `ABSORB_LEFT` and the last chunk came out contiguous (root: page frames and
    /// `/proc/pagetypeinfo` visible), or until the chunks hold the free memory `/proc/buddyinfo`
    /// lists in blocks below 2 MiB (otherwise), or the cap is reached.
    fn fill(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let min_blocks = (ABSORB_CHUNK / (2 << 20)) as u64;
        let target = small_free_bytes().map(|(f, _)| f + f / 8);
        let mut added = 0u64;
        self.info.stopped = loop {
            if (self.chunks.len() + 1) * ABSORB_CHUNK > self.cap {
                break format!("it reached its cap of {} MiB", self.cap >> 20);
            }
            let c = PlainMemory::new(ABSORB_CHUNK, false)?;
            let blocks = pagemap_scan(&[(c.ptr as usize, c.len)]).and_then(|(_, b)| b);
            self.chunks.push(c);
            added += ABSORB_CHUNK as u64;
            if self.chunks.len() == 1 {
                self.info.first_chunk_2mib_blocks = blocks;
            }
            self.info.last_chunk_2mib_blocks = blocks;
            // A contiguous chunk alone proves nothing: the first chunks may come from the
            // per-CPU lists, i.e. from pages an exiting process just freed.
            let contiguous = blocks.map_or(true, |b| b * 4 <= min_blocks * 5);
            match small_free_bytes() {
                None => break "the free lists are not visible".to_string(),
                Some((f, true)) if f <= ABSORB_LEFT && contiguous => {
                    break "the movable free memory in blocks below 2 MiB was used up".to_string();
                }
                Some((_, true)) => {}
                Some((_, false)) if target.is_some_and(|t| added >= t) => {
                    break "it held the free memory listed in blocks below 2 MiB".to_string();
                }
                Some((_, false)) => {}
            }
        };
        self.info.bytes = (self.chunks.len() * ABSORB_CHUNK) as u64;
        self.info.fills += 1;
        self.info.small_free_after_bytes = small_free_bytes().map(|(f, _)| f);
        self.info.seconds = round2(self.info.seconds + t0.elapsed().as_secs_f64());
        Ok(())
    }
}

/// Free memory in blocks below 2 MiB and whether it counts movable pages only (the ones user
/// memory is taken from: `/proc/pagetypeinfo`, readable by root) or every free block
/// (`/proc/buddyinfo`).
fn small_free_bytes() -> Option<(u64, bool)> {
    if let Ok(t) = std::fs::read_to_string("/proc/pagetypeinfo") {
        if let Some(b) = parse_small_free(&t, true) {
            return Some((b, true));
        }
    }
    let b = parse_small_free(&std::fs::read_to_string("/proc/buddyinfo").ok()?, false)?;
    Some((b, false))
}

/// Sum of `count << order` over orders 0..=8 of the free-list lines of `/proc/pagetypeinfo`
/// (`movable`: only the `type Movable` lines) or `/proc/buddyinfo`, in bytes.
fn parse_small_free(text: &str, movable: bool) -> Option<u64> {
    let mut found = false;
    let mut pages = 0u64;
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.first() != Some(&"Node") {
            continue;
        }
        let typed = t.iter().position(|w| *w == "type");
        if movable != typed.is_some() {
            continue;
        }
        if movable && typed.and_then(|i| t.get(i + 1)) != Some(&"Movable") {
            continue;
        }
        let counts: Vec<u64> = t
            .iter()
            .rev()
            .map_while(|w| w.parse::<u64>().ok())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if counts.len() < 11 {
            continue;
        }
        found = true;
        pages += counts[..9]
            .iter()
            .enumerate()
            .map(|(order, n)| n << order)
            .sum::<u64>();
    }
    found.then_some(pages * PAGE as u64)
}

/// The `(start, len)` of every mapping of `path` in this process (`/proc/self/maps`).
fn mapped_file_ranges(path: &Path) -> Vec<(usize, usize)> {
    let Ok(path) = std::fs::canonicalize(path) else {
        return Vec::new();
    };
    let Some(path) = path.to_str() else {
        return Vec::new();
    };
    let Ok(text) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            if f.nth(4)? != path || f.next().is_some() {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            Some((a, b - a))
        })
        .collect()
}

/// Where one piece of a system's working memory lies physically (JSON `placement.memory`).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct PlacementEntry {
    pub system: String,
    pub memory: String,
    pub bytes: u64,
    pub resident_bytes: u64,
    /// Distinct 2 MiB physical blocks of its pages (`None`: page frames hidden, not root).
    pub phys_2mib_blocks: Option<u64>,
    /// The minimum: bytes / 2 MiB, rounded up.
    pub min_2mib_blocks: u64,
}

/// The physical placement of every system's working memory, after setup (JSON `placement`).
#[derive(Serialize)]
pub struct Placement {
    pub method: &'static str,
    pub setup_order: Vec<&'static str>,
    pub absorber: AbsorberInfo,
    pub memory: Vec<PlacementEntry>,
}

impl Placement {
    fn measure(systems: &[&dyn TxSystem]) -> Vec<PlacementEntry> {
        let mut out = Vec::new();
        for sys in systems {
            for (what, ranges) in sys.memory() {
                let bytes: usize = ranges.iter().map(|r| r.1).sum();
                let (resident, blocks) = pagemap_scan(&ranges).unwrap_or((0, None));
                out.push(PlacementEntry {
                    system: sys.name().to_string(),
                    memory: what.to_string(),
                    bytes: bytes as u64,
                    resident_bytes: resident,
                    phys_2mib_blocks: blocks,
                    min_2mib_blocks: bytes.div_ceil(2 << 20) as u64,
                });
            }
        }
        out
    }
}

/// What a measured read-pass mapping is, from `/proc/self/smaps` (its VMA) and
/// `/proc/self/pagemap` (the measured range), read after the timed passes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemoryInfo {
    /// Kind, sharing and access of the mapping, e.g. "anonymous, private, read-write".
    pub mapping: String,
    /// `KernelPageSize` of the mapping, in KiB.
    pub kernel_page_kib: u64,
    /// `THPeligible` of the mapping.
    pub thp_eligible: bool,
    /// Bytes of the whole mapping mapped with 2 MiB pages (`AnonHugePages` + `ShmemPmdMapped` +
    /// `FilePmdMapped`).
    pub huge_mapped_bytes: u64,
    /// Bytes of the measured range whose pages are present in the page table.
    pub resident_bytes: u64,
    /// Distinct 2 MiB physical blocks the measured range's pages lie in (the minimum is the
    /// range / 2 MiB); `None` when the page frame numbers are hidden (they need CAP_SYS_ADMIN).
    pub phys_2mib_blocks: Option<u64>,
}

impl MemoryInfo {
    /// Describe the mapping holding `range` (best effort: fields stay default if /proc is not
    /// readable).
    fn of(range: &[u8]) -> MemoryInfo {
        let mut m = MemoryInfo::default();
        let addr = range.as_ptr() as usize;
        if let Ok(text) = std::fs::read_to_string("/proc/self/smaps") {
            parse_smaps(&text, addr, &mut m);
        }
        if let Some((resident, blocks)) = pagemap_scan(&[(addr, range.len())]) {
            m.resident_bytes = resident;
            m.phys_2mib_blocks = blocks;
        }
        m
    }

    /// One line for the table, e.g. "anonymous, private, read-write, 4 KiB pages, 256/256 MiB
    /// resident, physical pages in 131 2-MiB blocks (≥128)".
    fn summary(&self, bytes: usize) -> String {
        let pages = if self.huge_mapped_bytes > 0 {
            format!(
                "{} MiB of the mapping in 2 MiB pages, the rest {} KiB",
                self.huge_mapped_bytes >> 20,
                self.kernel_page_kib
            )
        } else {
            format!("{} KiB pages", self.kernel_page_kib)
        };
        let phys = self.phys_2mib_blocks.map_or_else(String::new, |b| {
            format!(
                ", physical pages in {b} 2-MiB blocks (≥{})",
                bytes.div_ceil(2 << 20)
            )
        });
        format!(
            "{}, {pages}, {}/{} MiB resident{phys}",
            self.mapping,
            self.resident_bytes >> 20,
            bytes >> 20
        )
    }
}

/// Fill `m` from the smaps entry of the mapping that contains `addr`.
fn parse_smaps(text: &str, addr: usize, m: &mut MemoryInfo) {
    let mut inside = false;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                // A VMA header: start-end perms offset dev inode [path].
                inside = a <= addr && addr < b;
                if inside {
                    let perms = fields.next().unwrap_or("");
                    let path = fields.skip(3).collect::<Vec<_>>().join(" ");
                    let kind = if path.is_empty() {
                        "anonymous".to_string()
                    } else if path.starts_with("/memfd:") {
                        format!("memfd ({path})")
                    } else {
                        format!("file {path}")
                    };
                    let shared = if perms.as_bytes().get(3) == Some(&b's') {
                        "shared"
                    } else {
                        "private"
                    };
                    let access = if perms.as_bytes().get(1) == Some(&b'w') {
                        "read-write"
                    } else {
                        "read-only"
                    };
                    m.mapping = format!("{kind}, {shared}, {access}");
                }
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kib = || fields.clone().next().and_then(|v| v.parse::<u64>().ok());
        match first {
            "KernelPageSize:" => m.kernel_page_kib = kib().unwrap_or(0),
            "AnonHugePages:" | "ShmemPmdMapped:" | "FilePmdMapped:" => {
                m.huge_mapped_bytes += kib().unwrap_or(0) << 10
            }
            "THPeligible:" => m.thp_eligible = kib() == Some(1),
            _ => {}
        }
    }
}

/// (bytes of the `(addr, len)` ranges whose pages are present, distinct 2 MiB physical blocks
/// of those pages if the page frame numbers are visible) from `/proc/self/pagemap`.
fn pagemap_scan(ranges: &[(usize, usize)]) -> Option<(u64, Option<u64>)> {
    use std::os::unix::fs::FileExt;
    const PRESENT: u64 = 1 << 63;
    const PFN_MASK: u64 = (1 << 55) - 1;
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut bytes = 0u64;
    let mut blocks = Vec::new();
    // In pieces of 64 Ki pages (512 KiB of entries): a 2 GiB range needs no 4 MiB buffer.
    let mut buf = vec![0u8; 8 << 16];
    for &(addr, len) in ranges.iter().filter(|r| r.1 > 0) {
        let (first, last) = (addr / PAGE, (addr + len - 1) / PAGE);
        let mut present = 0u64;
        let mut page = first;
        while page <= last {
            let n = (last + 1 - page).min(1 << 16);
            let b = &mut buf[..n * 8];
            f.read_exact_at(b, page as u64 * 8).ok()?;
            for e in b.chunks_exact(8) {
                let e = u64::from_ne_bytes(e.try_into().unwrap());
                if e & PRESENT != 0 {
                    present += 1;
                    let pfn = e & PFN_MASK;
                    if pfn != 0 {
                        blocks.push(pfn / 512);
                    }
                }
            }
            page += n;
        }
        bytes += (present * PAGE as u64).min(len as u64);
    }
    let blocks = (!blocks.is_empty()).then(|| {
        blocks.sort_unstable();
        blocks.dedup();
        blocks.len() as u64
    });
    Some((bytes, blocks))
}

/// Seconds of one read pass over `region`: the wrapping sum of every 8-byte word, plain loads.
/// Never inlined, so that every region is read by the very same machine code; `black_box` on the
/// input and the sum, so that the loop can be neither elided nor specialised.
#[inline(never)]
fn read_pass_secs(region: &[u8]) -> f64 {
    let region = std::hint::black_box(region);
    let start = Instant::now();
    let sum = region.chunks_exact(8).fold(0u64, |acc, w| {
        acc.wrapping_add(u64::from_ne_bytes(w.try_into().unwrap()))
    });
    std::hint::black_box(sum);
    start.elapsed().as_secs_f64()
}

/// Median seconds of a read pass over each region whose `present` entry is true (the others
/// stay `None`); `pass(i)` times one pass over region `i` (which may live in another process).
/// One untimed warm-up pass over every region first (it maps the pages of a view that was never
/// read, e.g. vnvm's read-only view, whose first pass takes minor faults); then `reps` rounds,
/// each reading every region once, the order rotating by one each round so that no region is
/// always first.
fn read_pass_medians(
    present: &[bool],
    reps: usize,
    mut pass: impl FnMut(usize) -> Result<f64>,
) -> Result<Vec<Option<f64>>> {
    let idx: Vec<usize> = (0..present.len()).filter(|i| present[*i]).collect();
    for i in &idx {
        pass(*i)?;
    }
    let mut samples = vec![Vec::with_capacity(reps); present.len()];
    for rep in 0..reps {
        for k in 0..idx.len() {
            let i = idx[(rep + k) % idx.len()];
            samples[i].push(pass(i)?);
        }
    }
    Ok(samples
        .iter()
        .map(|v| (!v.is_empty()).then(|| percentile(v, 50.0)))
        .collect())
}

/// A request from `bench vnvm` to one system's worker process: one JSON object per line,
/// `{"cmd": "<kind>", ...}` (see `bench/worker.rs` for the framing and the replies).
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "cmd", rename_all = "snake_case")]
enum Request {
    /// Set the system up with an array of `bytes` bytes (untimed). Reply: [`SetupReply`]
    /// (`read_bytes`: the part of the array the read pass covers).
    Setup { bytes: usize, read_bytes: usize },
    /// The physical placement of the system's working memory. Reply: `Vec<PlacementEntry>`.
    Placement,
    /// Time one cell ([`time_cell`]), then the untimed quiesce. Reply: [`CellReply`].
    Cell {
        pages: usize,
        s: usize,
        passes: usize,
        seed: u8,
    },
    /// One read pass over the first `bytes` of the array. Reply: seconds, `null` without one.
    ReadPass { bytes: usize },
    /// [`MemoryInfo`] of the first `bytes` of the array. Reply: it, `null` without an array.
    MemoryInfo { bytes: usize },
    /// Write the first `bytes` of the array to the file `path`. Reply: `true` if written,
    /// `false` without an array.
    DumpRegion { bytes: usize, path: PathBuf },
    /// vnvm only: [`VnvmSystem::commit_latency`]. Reply: [`CommitLatency`].
    CommitLatency { n: usize, n_asleep: usize },
    /// The system's background writeback counts. Reply: `Option<BackgroundPages>`.
    Background,
}

impl Request {
    /// The request's `cmd`, for messages and the fault-injection hook.
    fn kind(&self) -> &'static str {
        match self {
            Request::Setup { .. } => "setup",
            Request::Placement => "placement",
            Request::Cell { .. } => "cell",
            Request::ReadPass { .. } => "read_pass",
            Request::MemoryInfo { .. } => "memory_info",
            Request::DumpRegion { .. } => "dump_region",
            Request::CommitLatency { .. } => "commit_latency",
            Request::Background => "background",
        }
    }
}

/// A worker's answer to `setup`.
#[derive(Serialize, Deserialize, Debug)]
struct SetupReply {
    /// What the system charges to the delay model.
    charges: String,
    /// Whether the mapping of the array's first `read_bytes` may get transparent huge pages
    /// (`None`: the system does not lend its array out).
    region_thp_eligible: Option<bool>,
}

/// A worker's measurement of one cell, in its own process.
#[derive(Serialize, Deserialize, Debug)]
struct CellReply {
    transactions: usize,
    /// Wall-clock seconds of the timed part (transactions and drain).
    secs: f64,
    /// CPU seconds of the worker process (every thread, user + system) over the timed part and
    /// the untimed quiesce after it.
    cpu_s: f64,
    /// The same over the timed part alone.
    cpu_timed_s: f64,
}

/// Arguments of the hidden `tiermem bench vnvm-worker`: the process one system of
/// `tiermem bench vnvm` runs in.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    /// The system: memcpy, pmdk or vnvm.
    #[arg(long)]
    system: String,
    /// Where the system keeps its files (pmdk: the pool file; vnvm: its directory; memcpy:
    /// unused), named by the parent, which removes it if the worker cannot.
    #[arg(long)]
    path: PathBuf,
}

/// Environment variable (tests): `SYSTEM:CMD:ACTION` makes the worker of SYSTEM, on request
/// CMD, `exit` (status 70, no answer), answer an `error`, or `hang`.
const FAULT_ENV: &str = "TIERMEM_BENCH_VNVM_WORKER_FAULT";
/// Environment variable: seconds the parent waits for a worker's answer (default 1200).
const TIMEOUT_ENV: &str = "TIERMEM_BENCH_VNVM_WORKER_TIMEOUT";

/// The worker process of one system (`tiermem bench vnvm-worker`): the system is created here,
/// set up on the parent's `setup` request and measured on its requests, in this process alone;
/// it is released at EOF on stdin. See [`Request`] and `bench/worker.rs`.
pub fn worker_main(a: WorkerArgs) -> Result<()> {
    let delay = DelayModel::from_env()?;
    let mut vnvm: Option<VnvmSystem> = None;
    let mut other: Option<Box<dyn TxSystem>> = None;
    match a.system.as_str() {
        "vnvm" => vnvm = Some(VnvmSystem::new(a.path.clone())),
        "pmdk" => {
            other = Some(Box::new(PmdkSystem {
                path: a.path.clone(),
                pool: None,
                delay,
            }))
        }
        "memcpy" => {
            other = Some(Box::new(MemcpySystem {
                array: Vec::new(),
                delay,
            }))
        }
        s => bail!("bench vnvm-worker: unknown system {s:?} (memcpy, pmdk, vnvm)"),
    }
    let fault = std::env::var(FAULT_ENV).unwrap_or_default();
    let fault: Vec<&str> = fault.splitn(3, ':').collect();
    worker::serve(|req: Request| {
        if fault.len() == 3 && fault[0] == a.system && fault[1] == req.kind() {
            match fault[2] {
                "exit" => std::process::exit(70),
                "hang" => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
                _ => bail!("{FAULT_ENV}: injected failure of {}", req.kind()),
            }
        }
        let sys: &mut dyn TxSystem = match (vnvm.as_mut(), other.as_mut()) {
            (Some(v), _) => v,
            (None, Some(o)) => o.as_mut(),
            (None, None) => bail!("no system"),
        };
        let v = match req {
            Request::Setup { bytes, read_bytes } => {
                sys.setup(bytes)
                    .with_context(|| format!("{}: setup", sys.name()))?;
                serde_json::to_value(SetupReply {
                    charges: sys.charges().to_string(),
                    region_thp_eligible: sys
                        .region()
                        .map(|r| MemoryInfo::of(&r[..read_bytes.min(r.len())]).thp_eligible),
                })?
            }
            Request::Placement => serde_json::to_value(Placement::measure(&[&*sys]))?,
            Request::Cell {
                pages,
                s,
                passes,
                seed,
            } => {
                let c0 = cpu::process_ns();
                let (transactions, secs) = time_cell(sys, pages, s, passes, seed)?;
                let c_timed = cpu::process_ns();
                // Untimed: no background work of this system runs into the next cell (of this
                // or another system: the parent waits for this answer).
                sys.quiesce()
                    .with_context(|| format!("{}: quiesce", sys.name()))?;
                let c1 = cpu::process_ns();
                serde_json::to_value(CellReply {
                    transactions,
                    secs,
                    cpu_s: c1.saturating_sub(c0) as f64 / 1e9,
                    cpu_timed_s: c_timed.saturating_sub(c0) as f64 / 1e9,
                })?
            }
            Request::ReadPass { bytes } => serde_json::to_value(
                sys.region()
                    .map(|r| read_pass_secs(&r[..bytes.min(r.len())])),
            )?,
            Request::MemoryInfo { bytes } => serde_json::to_value(
                sys.region()
                    .map(|r| MemoryInfo::of(&r[..bytes.min(r.len())])),
            )?,
            Request::DumpRegion { bytes, path } => match sys.region() {
                Some(r) => {
                    std::fs::write(&path, &r[..bytes.min(r.len())])
                        .with_context(|| format!("writing {}", path.display()))?;
                    serde_json::Value::Bool(true)
                }
                None => serde_json::Value::Bool(false),
            },
            Request::CommitLatency { n, n_asleep } => match vnvm.as_ref() {
                Some(v) => serde_json::to_value(v.commit_latency(n, n_asleep)?)?,
                None => bail!("commit latency is measured on vnvm only"),
            },
            Request::Background => serde_json::to_value(sys.background_pages())?,
        };
        Ok(Some(v))
    })
}

/// The parent's handle on one system's worker process.
struct SystemWorker {
    w: Worker,
}

impl SystemWorker {
    /// Start the worker of `system` (its files at `path`, removed when it is gone).
    fn spawn(system: &str, path: &Path, timeout: Duration) -> Result<SystemWorker> {
        let args = [
            "bench".to_string(),
            "vnvm-worker".to_string(),
            "--system".to_string(),
            system.to_string(),
            "--path".to_string(),
            path.display().to_string(),
        ];
        let cleanup = match system {
            "memcpy" => Vec::new(),
            // A vnvm worker killed (hung, or past the grace period) leaves its instance's
            // shared-memory object, named after the instance directory.
            "vnvm" => vec![
                path.to_path_buf(),
                tiermem_vnvm::shm_object_path(&path.join("instance")),
            ],
            _ => vec![path.to_path_buf()],
        };
        Ok(SystemWorker {
            w: Worker::spawn(system, &args, timeout, cleanup)?,
        })
    }

    /// Send `req`, decode the answer.
    fn call<T: serde::de::DeserializeOwned>(&mut self, req: &Request, what: &str) -> Result<T> {
        self.w.call(req, what)
    }
}

/// Run the benchmark: start one worker process per system, set every system up, time every
/// (P, S) cell with the systems interleaved, print the table or JSON.
/// `bench vnvm`'s options: the common ones (no chart: `plot` is refused).
pub type Options = BenchOpts;

/// Run `bench vnvm`: every system in a worker process of its own, cell by cell.
pub fn run(o: &Options) -> Result<Report> {
    if o.plot.is_some() {
        bail!("bench vnvm has no chart yet; its table is the result");
    }
    let t0 = Instant::now();
    let bytes = array_bytes(o.quick)?;
    let pages = bytes / PAGE;
    let reps = if o.quick { 3 } else { 5 };
    // Progress: the setup, every (passes, size, repetition) cell, the read pass, the commit
    // latency.
    crate::progress::plan(
        "bench vnvm",
        Some((PASSES.len() * SIZES.len() * reps) as u64 + 3),
    );
    let delay = DelayModel::from_env()?;
    // libpmem reads this once, at the first pool, in the pmdk worker, which inherits it; we are
    // still single-threaded here. An explicit value in the environment is kept (and reported),
    // to allow comparing the msync path.
    if std::env::var_os(tiermem_pmdk::PMEM_IS_PMEM_FORCE).is_none() {
        tiermem_pmdk::force_pmem();
    }
    let force = std::env::var(tiermem_pmdk::PMEM_IS_PMEM_FORCE).unwrap_or_default();
    let dir = tiermem_media::ensure_default_dir()?;
    let timeout = match std::env::var(TIMEOUT_ENV) {
        Ok(v) if !v.trim().is_empty() => Duration::from_secs_f64(
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .with_context(|| format!("{TIMEOUT_ENV}={v}: not a number of seconds"))?,
        ),
        _ => Duration::from_secs(1200),
    };

    // One process per system, started before any setup (each set up once, then driven cell by
    // cell); slots: 0 vnvm, 1 pmdk, 2 memcpy. The parent hosts no system.
    let pmdk_path = dir.join(format!("bench-vnvm-pmdk-{}.pool", std::process::id()));
    let vnvm_path = vnvm_dir(&dir);
    let mut workers: [Option<SystemWorker>; 3] = [None, None, None];
    workers[2] = Some(SystemWorker::spawn("memcpy", &dir, timeout)?);
    workers[1] = Some(SystemWorker::spawn("pmdk", &pmdk_path, timeout)?);
    if let Ok(p) = &vnvm_path {
        workers[0] = Some(SystemWorker::spawn("vnvm", p, timeout)?);
    }

    // Before each system's setup, soak up the free memory scattered in blocks below 2 MiB, so
    // that whichever system is set up first does not get it (see Absorber); the absorber lives
    // in this process and is freed once everything is set up, before the timed cells.
    let absorb = std::env::var(ABSORB_ENV).map_or(true, |v| v.trim() != "0");
    let mut absorber = absorb.then(|| {
        // Leave room for what the systems map (array, PMDK pool, vnvm's log, cache, DRAM cache
        // and backing file, the read baseline): about 6 arrays.
        let need = 6 * bytes as u64 + (512 << 20);
        let cap = tiermem_media::mem_available().map_or(2 << 30, |a| a.saturating_sub(need) / 2);
        Absorber::new(cap.min(8 << 30) as usize)
    });
    let mut fill_absorber = |what: &str| -> Result<()> {
        match absorber.as_mut() {
            Some(a) => a
                .fill()
                .with_context(|| format!("absorbing scattered free memory before {what}")),
            None => Ok(()),
        }
    };
    progress(
        o.json,
        &format!(
            "setting up a {} MiB array per system, each in a process of its own (untimed){}",
            bytes >> 20,
            if absorb {
                ", each after absorbing the scattered free memory"
            } else {
                ""
            }
        ),
    );
    let read_bytes = bytes.min(READ_PASS_MAX);
    let mut setups: [Option<SetupReply>; 3] = [None, None, None];
    let mut setup_order = Vec::new();
    for slot in [2, 1, 0] {
        let Some(w) = workers[slot].as_mut() else {
            continue;
        };
        let name = w.w.name().to_string();
        fill_absorber(&name)?;
        setups[slot] = Some(w.call(&Request::Setup { bytes, read_bytes }, "setup")?);
        setup_order.push(match slot {
            0 => "vnvm",
            1 => "pmdk",
            _ => "memcpy",
        });
    }
    // The read pass's plain-memory baseline, allocated (here: it is no system) right after
    // vnvm's region, from the same state of free memory, with the page size vnvm's view can
    // have; see PlainMemory.
    let view_thp = setups[0]
        .as_ref()
        .and_then(|s| s.region_thp_eligible)
        .unwrap_or(false);
    fill_absorber("the read baseline")?;
    let mut plain_mem = PlainMemory::new(read_bytes, view_thp)?;
    let pmdk_pool = pmdk_path.display().to_string();
    let mut memory = Vec::new();
    for slot in [2, 1, 0] {
        if let Some(w) = workers[slot].as_mut() {
            memory.extend(w.call::<Vec<PlacementEntry>>(&Request::Placement, "placement")?);
        }
    }
    let placement = Placement {
        method: "distinct 2 MiB physical blocks (pagemap page frame numbers) of each system's \
                 working memory right after setup, read by the system's own process; an \
                 absorber first took the free memory scattered in blocks below 2 MiB",
        setup_order,
        absorber: absorber
            .as_ref()
            .map(|a| a.info.clone())
            .unwrap_or_default(),
        memory,
    };
    drop(absorber);

    let mut results = Vec::new();
    for passes in PASSES {
        for s in SIZES {
            // [vnvm, pmdk, memcpy] samples in tx/s, CPU seconds, and tx per CPU-second.
            let mut samples: [Vec<f64>; 3] = Default::default();
            let mut cpu: [Vec<f64>; 3] = Default::default();
            let mut cpu_timed: [Vec<f64>; 3] = Default::default();
            let mut per_cpu: [Vec<f64>; 3] = Default::default();
            let mut transactions = 0;
            for rep in 0..reps {
                let mut systems: Vec<usize> = vec![1, 2];
                if workers[0].is_some() {
                    systems.insert(0, 0);
                }
                // Rotate the order each repetition: no system always runs first (or last).
                let k = rep % systems.len();
                systems.rotate_left(k);
                for slot in systems {
                    let Some(w) = workers[slot].as_mut() else {
                        continue;
                    };
                    let seed = (rep * 8 + slot) as u8;
                    // The worker times the cell and counts its own process's CPU over it and
                    // its untimed quiesce (the background work the cell left would otherwise
                    // run in the next cell); the others wait idle meanwhile.
                    let c: CellReply = w.call(
                        &Request::Cell {
                            pages,
                            s,
                            passes,
                            seed,
                        },
                        &format!("cell P={passes} S={s} rep {}", rep + 1),
                    )?;
                    transactions = c.transactions;
                    samples[slot].push(c.transactions as f64 / c.secs);
                    cpu[slot].push(c.cpu_s);
                    cpu_timed[slot].push(c.cpu_timed_s);
                    if let Some(v) = cpu::per_cpu(c.transactions as f64, c.cpu_s) {
                        per_cpu[slot].push(v);
                    }
                }
                progress(
                    o.json,
                    &format!(
                        "P={passes:<2} S={s:<3} rep {}/{reps}: pmdk {:.0} tx/s, memcpy {:.0} tx/s{}",
                        rep + 1,
                        samples[1][rep],
                        samples[2][rep],
                        match samples[0].get(rep) {
                            Some(v) => format!(", vnvm {v:.0} tx/s"),
                            None => String::new(),
                        }
                    ),
                );
            }
            let med = |v: &[f64]| (!v.is_empty()).then(|| percentile(v, 50.0).round());
            let pmdk_tps = med(&samples[1]).unwrap_or(f64::NAN);
            let vnvm_tps = med(&samples[0]);
            // Microseconds kept: a small array's cell takes well under a millisecond of CPU.
            let med_cpu =
                |v: &[f64]| (!v.is_empty()).then(|| (percentile(v, 50.0) * 1e6).round() / 1e6);
            let (vnvm_pc, pmdk_pc) = (med(&per_cpu[0]), med(&per_cpu[1]));
            results.push(Row {
                passes,
                bytes_per_page: s,
                vnvm_tps,
                pmdk_tps,
                memcpy_tps: med(&samples[2]).unwrap_or(f64::NAN),
                ratio_vs_pmdk: vnvm_tps.map(|v| round3(v / pmdk_tps)),
                vnvm_cpu_s: med_cpu(&cpu[0]),
                vnvm_cpu_timed_s: med_cpu(&cpu_timed[0]),
                pmdk_cpu_s: med_cpu(&cpu[1]).unwrap_or(f64::NAN),
                memcpy_cpu_s: med_cpu(&cpu[2]).unwrap_or(f64::NAN),
                vnvm_tps_per_cpu: vnvm_pc,
                pmdk_tps_per_cpu: pmdk_pc,
                ratio_vs_pmdk_per_cpu: vnvm_pc.zip(pmdk_pc).map(|(v, p)| round3(v / p)),
                transactions,
            });
        }
    }

    progress(o.json, "read pass over committed data");
    // A pass is ~20 ms: repetitions are cheap, and a 2-vCPU machine's neighbours are noisy.
    let read_reps = if o.quick { 11 } else { 15 };
    let gbps = |secs: f64| round2(read_bytes as f64 / secs / 1e9);
    // The same data in the baseline as in vnvm's region (untimed), through a file the vnvm
    // worker writes next to its pools.
    if let Some(w) = workers[0].as_mut() {
        let copy = dir.join(format!("bench-vnvm-read-{}.dat", std::process::id()));
        let wrote: Result<bool> = w.call(
            &Request::DumpRegion {
                bytes: read_bytes,
                path: copy.clone(),
            },
            "dump of the region for the read baseline",
        );
        let filled = wrote.and_then(|wrote| {
            if wrote {
                use std::io::Read;
                std::fs::File::open(&copy)
                    .and_then(|mut f| f.read_exact(plain_mem.as_mut_slice()))
                    .with_context(|| format!("reading {}", copy.display()))?;
            }
            Ok(())
        });
        let _ = std::fs::remove_file(&copy);
        filled?;
    }
    // Regions: 0 plain memory (here), 1 pmdk's pool, 2 vnvm's view (in their workers).
    let lends = |slot: usize| {
        setups[slot]
            .as_ref()
            .is_some_and(|s| s.region_thp_eligible.is_some())
    };
    let present = [true, lends(1), lends(0)];
    let medians = read_pass_medians(&present, read_reps, |i| match i {
        0 => Ok(read_pass_secs(plain_mem.as_slice())),
        _ => {
            let slot = if i == 1 { 1 } else { 0 };
            let w = workers[slot].as_mut().context("no worker")?;
            let secs: Option<f64> =
                w.call(&Request::ReadPass { bytes: read_bytes }, "read pass")?;
            secs.context("the system has no region to read")
        }
    })?;
    let (plain, pmdk_read, vnvm_read) = (medians[0].unwrap_or(f64::NAN), medians[1], medians[2]);
    let mut mem_info = |slot: usize| -> Result<Option<MemoryInfo>> {
        match workers[slot].as_mut() {
            Some(w) if present[if slot == 1 { 1 } else { 2 }] => w.call(
                &Request::MemoryInfo { bytes: read_bytes },
                "memory information",
            ),
            _ => Ok(None),
        }
    };
    let (pmdk_memory, vnvm_memory) = (mem_info(1)?, mem_info(0)?);
    let read_pass = ReadPass {
        bytes: read_bytes,
        repetitions: read_reps,
        method: "median time of a pass summing every 8-byte word, after one untimed warm-up \
                 pass per region; regions read in rotating order each repetition, each by its \
                 own process (plain memory by the parent, the pool and the view by their \
                 system's worker)",
        plain_gbps: gbps(plain),
        pmdk_gbps: pmdk_read.map(gbps),
        vnvm_gbps: vnvm_read.map(gbps),
        plain_memory: MemoryInfo::of(plain_mem.as_slice()),
        pmdk_memory,
        vnvm_memory,
    };
    drop(plain_mem);

    // The baselines are done: their workers release their systems and exit before vnvm's
    // commit latency is measured.
    let charges = |slot: usize| {
        setups[slot]
            .as_ref()
            .map_or_else(|| "n/a".to_string(), |s| s.charges.clone())
    };
    for slot in [2, 1] {
        if let Some(w) = workers[slot].take() {
            w.w.finish()?;
        }
    }
    progress(o.json, "vnvm commit latency, redo worker awake and asleep");
    let (commit_latency, vnvm_writeback) = match workers[0].take() {
        Some(mut w) => {
            let (n, n_asleep) = if o.quick { (5000, 200) } else { (20000, 600) };
            let c: CommitLatency =
                w.call(&Request::CommitLatency { n, n_asleep }, "commit latency")?;
            let b: Option<BackgroundPages> = w.call(&Request::Background, "writeback counts")?;
            w.w.finish()?;
            (Some(c), b)
        }
        None => (None, None),
    };

    let report = Report {
        machine: machine::describe(),
        compared: "vnvm vs PMDK libpmemobj vs non-durable memcpy: 32 page writes of S bytes per \
                   transaction, sequentially over the array, P passes (vNVML paper §2.5.3)",
        quick: o.quick,
        array_bytes: bytes,
        page_bytes: PAGE,
        writes_per_tx: WRITES_PER_TX,
        passes: PASSES,
        repetitions: reps,
        statistic: "median transactions/s over the repetitions, systems interleaved",
        isolation: "one process per system",
        isolation_method: "each system runs in a worker process of its own (this binary, `bench \
                           vnvm-worker`, same directory, environment and CPU affinity), set up \
                           once and driven over a pipe one request at a time, so that the cells \
                           stay interleaved and only one system works at a time; no system's \
                           threads or allocator state are in another's process, and the parent \
                           hosts none",
        cpu_method: "per cell and system: CPU time (user + system, every thread, the process \
                     CPU-time clock) of the system's own worker process while it ran the cell \
                     and its untimed quiesce (vnvm: its redo and writeback workers included); \
                     median over the repetitions",
        delay: DelayInfo {
            model: delay.to_string(),
            memcpy_charged: charges(2),
            pmdk_charged: charges(1),
            vnvm_charged: charges(0),
        },
        pmdk: PmdkInfo {
            libpmemobj: tiermem_pmdk::LIBPMEMOBJ_VERSION,
            pool: pmdk_pool,
            pool_bytes: tiermem_pmdk::pool_size_for(bytes),
            pmem_is_pmem_force: force,
        },
        vnvm_writeback,
        vnvm: match &vnvm_path {
            Ok(_) => "measured".to_string(),
            Err(e) => format!("unavailable: {e}"),
        },
        results,
        read_overhead_ratio: vnvm_read.map(|v| round3(v / plain)),
        commit_latency,
        placement,
        read_pass,
        seconds: round2(t0.elapsed().as_secs_f64()),
    };
    Ok(report)
}

impl crate::Report for Report {
    fn print_table(&self) {
        print_table(self)
    }
}

fn print_table(r: &Report) {
    println!("tiermem bench vnvm — {}", r.compared);
    println!("machine: {}", r.machine.one_line());
    println!(
        "array: {} MiB ({} pages of {} B), {}; delay model: {}",
        r.array_bytes >> 20,
        r.array_bytes / r.page_bytes,
        r.page_bytes,
        r.statistic
            .replace("repetitions", &format!("{} repetitions", r.repetitions)),
        r.delay.model
    );
    println!(
        "pmdk: libpmemobj {}, pool {} ({} MiB), PMEM_IS_PMEM_FORCE={}",
        r.pmdk.libpmemobj,
        r.pmdk.pool,
        r.pmdk.pool_bytes >> 20,
        if r.pmdk.pmem_is_pmem_force.is_empty() {
            "(unset)"
        } else {
            &r.pmdk.pmem_is_pmem_force
        }
    );
    if r.vnvm != "measured" {
        println!("vnvm: {} — its columns are left empty", r.vnvm);
    }
    let fmt = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |x| format!("{x:.0}"));
    println!(
        "\n{:>3} {:>5} {:>8} {:>12} {:>12} {:>13} {:>10} {:>9} {:>9} {:>14}",
        "P",
        "S",
        "tx",
        "vnvm tx/s",
        "PMDK tx/s",
        "memcpy tx/s",
        "vnvm/PMDK",
        "vnvm CPU",
        "PMDK CPU",
        "per CPU-second"
    );
    for row in &r.results {
        println!(
            "{:>3} {:>5} {:>8} {:>12} {:>12.0} {:>13.0} {:>10} {:>9} {:>9} {:>14}",
            row.passes,
            row.bytes_per_page,
            row.transactions,
            fmt(row.vnvm_tps),
            row.pmdk_tps,
            row.memcpy_tps,
            row.ratio_vs_pmdk
                .map_or_else(|| "—".to_string(), |x| format!("{x:.2}×")),
            row.vnvm_cpu_s
                .map_or_else(|| "—".to_string(), |x| format!("{x:.3} s")),
            format!("{:.3} s", row.pmdk_cpu_s),
            row.ratio_vs_pmdk_per_cpu
                .map_or_else(|| "—".to_string(), |x| format!("{x:.2}×"))
        );
    }
    let rp = &r.read_pass;
    println!(
        "\nread pass over {} MiB (median of {} repetitions): plain memory {:.2} GB/s, pmdk pool \
         {}, vnvm {}; read_overhead_ratio (vnvm / plain time) {}",
        rp.bytes >> 20,
        rp.repetitions,
        rp.plain_gbps,
        rp.pmdk_gbps
            .map_or_else(|| "—".to_string(), |x| format!("{x:.2} GB/s")),
        rp.vnvm_gbps
            .map_or_else(|| "—".to_string(), |x| format!("{x:.2} GB/s")),
        r.read_overhead_ratio
            .map_or_else(|| "—".to_string(), |x| format!("{x:.3}"))
    );
    println!("  plain memory: {}", rp.plain_memory.summary(rp.bytes));
    if let Some(m) = &rp.vnvm_memory {
        println!("  vnvm view:    {}", m.summary(rp.bytes));
    }
    if let Some(m) = &rp.pmdk_memory {
        println!("  pmdk pool:    {}", m.summary(rp.bytes));
    }
    println!(
        "delay charged — memcpy: {}; pmdk: {}; vnvm: {}",
        r.delay.memcpy_charged, r.delay.pmdk_charged, r.delay.vnvm_charged
    );
    if let Some(w) = &r.vnvm_writeback {
        println!(
            "vnvm writeback worker (lazy writeback to the backing file, not needed for \
             durability): {} pages during timed cells, {} during the untimed quiesce",
            w.timed, w.quiesce
        );
    }
    let pl = &r.placement;
    let a = &pl.absorber;
    let mib = |b: Option<u64>| b.map_or_else(|| "?".to_string(), |b| format!("{}", b >> 20));
    println!(
        "placement after setup (order {}): {}",
        pl.setup_order.join(", "),
        if a.enabled {
            format!(
                "absorber took {} MiB in {} fills, one before each setup (free memory in blocks \
                 < 2 MiB: {} MiB before, {} after; last fill stopped when {}), freed before the \
                 timed cells",
                a.bytes >> 20,
                a.fills,
                mib(a.small_free_before_bytes),
                mib(a.small_free_after_bytes),
                a.stopped
            )
        } else {
            format!("no absorber ({ABSORB_ENV}=0)")
        }
    );
    let blocks: Vec<String> = pl
        .memory
        .iter()
        .map(|m| {
            format!(
                "{} {} {}",
                m.system,
                m.memory,
                m.phys_2mib_blocks.map_or_else(
                    || "? (page frames hidden)".to_string(),
                    |b| format!("{b} (≥{})", m.min_2mib_blocks)
                )
            )
        })
        .collect();
    println!("  2-MiB physical blocks: {}", blocks.join(", "));
    if let Some(c) = &r.commit_latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        let sleeps = |x: Option<f64>| x.map_or_else(|| "?".to_string(), |x| format!("{x:.2}"));
        println!(
            "vnvm nv_commit latency (one 64-byte write): back to back p50 {:.2} µs, p99 {:.2} µs \
             (worker slept {}× per commit); after a {} µs pause p50 {:.2} µs, p99 {:.2} µs ({}×); \
             wake cost p50 {:+.2} µs, p99 {:+.2} µs; Thread::unpark of a sleeping thread p50 {:.2} \
             µs, of a running one {} ns",
            us(c.awake_p50_ns),
            us(c.awake_p99_ns),
            sleeps(c.worker_sleeps_per_commit_awake),
            c.pause_us,
            us(c.asleep_p50_ns),
            us(c.asleep_p99_ns),
            sleeps(c.worker_sleeps_per_commit_asleep),
            c.wake_cost_p50_ns as f64 / 1000.0,
            c.wake_cost_p99_ns as f64 / 1000.0,
            us(c.unpark_sleeping_p50_ns),
            c.unpark_running_p50_ns
        );
    }
    println!("total {:.1} s", r.seconds);
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmdk_charge_counts_undo_entry_and_data() {
        assert_eq!(PmdkSystem::nvm_bytes(16), 64 + 16);
        assert_eq!(PmdkSystem::nvm_bytes(40), 64 + 40);
        assert_eq!(PmdkSystem::nvm_bytes(64), 128 + 64);
        assert_eq!(PmdkSystem::nvm_bytes(512), 576 + 512);
    }

    #[test]
    fn cells_write_every_page_once_per_pass() {
        let mut m = MemcpySystem {
            array: Vec::new(),
            delay: DelayModel::NONE,
        };
        m.setup(70 * PAGE).unwrap();
        let (txs, _) = time_cell(&mut m, 70, 16, 2, 0).unwrap();
        assert_eq!(txs, 2 * 3, "70 pages = 32 + 32 + 6 writes per pass");
        let last = 0u8.wrapping_mul(17).wrapping_add(1).wrapping_add(1);
        for p in 0..70 {
            let page = &m.array[p * PAGE..(p + 1) * PAGE];
            assert!(page[..16].iter().all(|b| *b == last), "page {p}");
            assert!(page[16..].iter().all(|b| *b == 0xa5), "page {p}");
        }
    }

    #[test]
    fn smaps_entry_of_the_mapping_holding_the_address() {
        let text = "\
7f0000000000-7f0000200000 rw-p 00000000 00:00 0
Size:               2048 kB
KernelPageSize:        4 kB
AnonHugePages:      2048 kB
THPeligible:           1
7f0000200000-7f0000400000 r--s 00000000 00:01 13640                      /memfd:tiermem-vnvm (deleted)
Size:               2048 kB
KernelPageSize:        4 kB
AnonHugePages:         0 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
THPeligible:           0
";
        let mut m = MemoryInfo::default();
        parse_smaps(text, 0x7f0000200000 + 4096, &mut m);
        assert_eq!(
            m.mapping,
            "memfd (/memfd:tiermem-vnvm (deleted)), shared, read-only"
        );
        assert_eq!((m.kernel_page_kib, m.huge_mapped_bytes), (4, 0));
        assert!(!m.thp_eligible);
        let mut m = MemoryInfo::default();
        parse_smaps(text, 0x7f0000000000, &mut m);
        assert_eq!(m.mapping, "anonymous, private, read-write");
        assert_eq!(m.huge_mapped_bytes, 2 << 20);
        assert!(m.thp_eligible);
    }

    #[test]
    fn plain_memory_is_anonymous_populated_and_4k_without_thp() {
        let p = PlainMemory::new(4 << 20, false).unwrap();
        assert!(p.as_slice().iter().all(|b| *b == 0xa5));
        let m = MemoryInfo::of(p.as_slice());
        assert_eq!(m.mapping, "anonymous, private, read-write");
        assert_eq!(m.resident_bytes, 4 << 20, "every page written at creation");
        assert_eq!((m.kernel_page_kib, m.huge_mapped_bytes), (4, 0));
        assert!(!m.thp_eligible, "MADV_NOHUGEPAGE");
        assert!(m.summary(4 << 20).contains("4 KiB pages, 4/4 MiB resident"));
    }

    #[test]
    fn read_pass_medians_skip_absent_regions() {
        let a = vec![1u8; 1 << 16];
        let regions = [Some(&a[..]), None, Some(&a[..4096])];
        let mut calls = [0usize; 3];
        let present: Vec<bool> = regions.iter().map(Option::is_some).collect();
        let m = read_pass_medians(&present, 3, |i| {
            calls[i] += 1;
            Ok(read_pass_secs(regions[i].unwrap()))
        })
        .unwrap();
        assert!(m[0].is_some_and(|x| x > 0.0));
        assert!(m[1].is_none());
        assert!(m[2].is_some_and(|x| x > 0.0));
        assert_eq!(
            calls,
            [4, 0, 4],
            "one warm-up pass and three timed ones each"
        );
        assert!(read_pass_medians(&present, 3, |_| bail!("worker gone")).is_err());
    }

    #[test]
    fn vnvm_without_a_directory_is_reported_unavailable() {
        assert!(vnvm_dir(Path::new("/nonexistent")).is_err());
    }

    #[test]
    fn requests_are_one_tagged_json_object_each() {
        let r = Request::Cell {
            pages: 3,
            s: 16,
            passes: 1,
            seed: 9,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(
            line,
            r#"{"cmd":"cell","pages":3,"s":16,"passes":1,"seed":9}"#
        );
        assert_eq!(r.kind(), "cell");
        let back: Request = serde_json::from_str(&line).unwrap();
        assert!(matches!(back, Request::Cell { seed: 9, .. }));
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"launch"}"#).is_err());
    }

    #[test]
    fn small_free_memory_from_pagetypeinfo_and_buddyinfo() {
        let pagetypeinfo = "\
Page block order: 9
Pages per block:  512

Free pages count per migrate type at order       0      1      2      3      4      5      6      7      8      9     10
Node    0, zone      DMA, type    Unmovable      0      0      0      0      0      0      0      0      1      0      0
Node    0, zone   Normal, type      Movable     10      2      0      0      0      0      0      0      1      7    900
Node    0, zone   Normal, type  Reclaimable    222     90    125     17     10      6      1      3      1      1      0

Number of blocks type     Unmovable      Movable  Reclaimable   HighAtomic      Isolate
Node 0, zone      DMA            1            7            0            0            0
";
        // Movable only: 10 + 2 * 2 + 1 * 256 pages; orders 9 and 10 are not scattered.
        assert_eq!(
            parse_small_free(pagetypeinfo, true),
            Some((10 + 4 + 256) * 4096)
        );
        let buddyinfo = "\
Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3
Node 0, zone   Normal      3      1      0      0      0      0      0      0      0    116   2736
";
        assert_eq!(
            parse_small_free(buddyinfo, false),
            Some((256 + 3 + 2) * 4096)
        );
        assert_eq!(parse_small_free("nothing here", false), None);
    }

    #[test]
    fn mapped_file_ranges_finds_a_mapping_and_pagemap_counts_it() {
        let path = std::env::temp_dir().join(format!("tiermem-maps-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 3 * PAGE]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: a fresh read-only shared mapping of our own file, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let ranges = mapped_file_ranges(&path);
        assert_eq!(ranges, vec![(p as usize, 3 * PAGE)]);
        let (resident, _) = pagemap_scan(&ranges).unwrap();
        assert_eq!(resident, 3 * PAGE as u64);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, 3 * PAGE) };
        let _ = std::fs::remove_file(&path);
        assert!(mapped_file_ranges(&path).is_empty());
    }
}
