//! `tiermem bench vnvm`: the vNVML paper's microbenchmark (§2.5.3, Fig. 2.16), every system side
//! by side in one run.
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
//! Setup — pool creation, allocation of the array and first population (every page resident) —
//! is outside the timed part for every system. A system's time ends when its `drain` returns:
//! everything committed is durable and applied (for vnvm: the redo worker has applied every
//! committed log), so background work is counted, not hidden. After each timed cell the harness
//! calls the system's untimed `quiesce` (vnvm: wait until its writeback worker, lazy writeback
//! to the backing file that durability does not need, is idle), so that no system's background
//! work runs into another system's timed cell.
//!
//! Delay model (`--delay`, default none): each system charges it for what it writes to the
//! (emulated) NVM, with one `write_delay_ns(bytes)` busy-wait per transaction:
//! * memcpy: the data, `32 × S` bytes;
//! * pmdk: per page write, the undo-log entry libpmemobj 1.12 writes (24-byte header + the S-byte
//!   snapshot, rounded up to a 64-byte cache line) plus the S new bytes;
//! * vnvm: charged by the media layer itself — its log and cache pools are opened with the model,
//!   so every pool write (log append, redo apply) is charged where it happens.

use super::{progress, BenchOpts};
use crate::machine;
use crate::stats::percentile;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;
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
}

/// The vnvm system: log and cache pools as large as the array (the paper's fairness rule), in
/// the benchmark's directory, one private region over a backing file there. Its pools take the
/// delay model from `TIERMEM_DELAY` (which the global `--delay` sets), so the media layer charges
/// every log append and redo apply where it happens.
fn vnvm_system(dir: &Path, delay: DelayModel) -> std::result::Result<Box<dyn TxSystem>, String> {
    let _ = delay;
    if !dir.is_dir() {
        return Err(format!(
            "benchmark directory {} does not exist",
            dir.display()
        ));
    }
    Ok(Box::new(VnvmSystem {
        dir: dir.join(format!("vnvm-{}", std::process::id())),
        vn: None,
        region: None,
        wb_mark: 0,
        wb: BackgroundPages::default(),
    }))
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
#[derive(Clone, Copy, Debug, Default, Serialize)]
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
        self.wb_mark = vn.stats().pages_written_back;
        self.vn = Some(vn);
        self.region = Some(region);
        Ok(())
    }

    fn run_tx(&mut self, writes: &[(usize, &[u8])]) -> Result<()> {
        let (Some(vn), Some(region)) = (&self.vn, &self.region) else {
            bail!("vnvm: run_tx before setup");
        };
        let base = region.as_ptr();
        let tid = vn.nv_txbegin();
        for (off, data) in writes {
            let mut done = 0;
            while done < data.len() {
                // SAFETY (pointer arithmetic only): off + done < region.len(), checked by
                // nv_write itself, which refuses destinations outside the region.
                let dst = base.wrapping_add(off + done);
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
        "charged by its media pools (log appends, redo applies) with the model in TIERMEM_DELAY"
    }
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

    fn region(&self) -> Option<&[u8]> {
        Some(&self.array)
    }

    fn charges(&self) -> &'static str {
        "the data: 32 x S bytes per transaction"
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
struct Row {
    passes: usize,
    bytes_per_page: usize,
    vnvm_tps: Option<f64>,
    pmdk_tps: f64,
    memcpy_tps: f64,
    ratio_vs_pmdk: Option<f64>,
    transactions: usize,
}

#[derive(Serialize)]
struct DelayInfo {
    model: String,
    memcpy_charged: &'static str,
    pmdk_charged: &'static str,
    vnvm_charged: &'static str,
}

#[derive(Serialize)]
struct PmdkInfo {
    libpmemobj: &'static str,
    pool: String,
    pool_bytes: u64,
    pmem_is_pmem_force: String,
}

#[derive(Serialize)]
struct ReadPass {
    bytes: usize,
    plain_gbps: f64,
    pmdk_gbps: Option<f64>,
    vnvm_gbps: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    machine: machine::Machine,
    compared: &'static str,
    quick: bool,
    array_bytes: usize,
    page_bytes: usize,
    writes_per_tx: usize,
    passes: [usize; 2],
    repetitions: usize,
    statistic: &'static str,
    delay: DelayInfo,
    pmdk: PmdkInfo,
    vnvm: String,
    /// vnvm's writeback worker (lazy writeback of NVM-cache pages to the backing file, not
    /// needed for durability): pages written back while timed cells ran and during the
    /// untimed quiesce after them.
    vnvm_writeback: Option<BackgroundPages>,
    results: Vec<Row>,
    read_overhead_ratio: Option<f64>,
    read_pass: ReadPass,
    seconds: f64,
}

/// The array size: the env override, or 2 GiB / 256 MiB; whole pages, at least one.
fn array_bytes(quick: bool) -> Result<usize> {
    let bytes = match std::env::var(BYTES_ENV) {
        Ok(v) if !v.trim().is_empty() => {
            crate::pool_cmd::parse_size(&v).with_context(|| format!("{BYTES_ENV}={v}"))? as usize
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

/// Seconds of one read pass (plain loads of every 8-byte word) over `region`.
fn read_pass_secs(region: &[u8]) -> f64 {
    let start = Instant::now();
    let sum = region.chunks_exact(8).fold(0u64, |acc, w| {
        acc.wrapping_add(u64::from_ne_bytes(w.try_into().unwrap()))
    });
    std::hint::black_box(sum);
    start.elapsed().as_secs_f64()
}

/// Median seconds of a read pass over each region (`None` stays `None`), the regions
/// interleaved repetition by repetition so that drift hits them alike.
fn read_pass_medians(regions: &[Option<&[u8]>], reps: usize) -> Vec<Option<f64>> {
    let mut samples = vec![Vec::with_capacity(reps); regions.len()];
    for _ in 0..reps {
        for (region, out) in regions.iter().zip(samples.iter_mut()) {
            if let Some(r) = region {
                out.push(read_pass_secs(r));
            }
        }
    }
    samples
        .iter()
        .map(|v| (!v.is_empty()).then(|| percentile(v, 50.0)))
        .collect()
}

/// Run the benchmark: set every system up, time every (P, S) cell, print the table or JSON.
pub fn run(o: BenchOpts) -> Result<()> {
    if o.plot.is_some() {
        bail!("bench vnvm has no chart yet; its table is the result");
    }
    let t0 = Instant::now();
    let bytes = array_bytes(o.quick)?;
    let pages = bytes / PAGE;
    let reps = if o.quick { 3 } else { 5 };
    let delay = DelayModel::from_env()?;
    // libpmem reads this once, at the first pool; we are still single-threaded here. An explicit
    // value in the environment is kept (and reported), to allow comparing the msync path.
    if std::env::var_os(tiermem_pmdk::PMEM_IS_PMEM_FORCE).is_none() {
        tiermem_pmdk::force_pmem();
    }
    let force = std::env::var(tiermem_pmdk::PMEM_IS_PMEM_FORCE).unwrap_or_default();
    let dir = tiermem_media::ensure_default_dir()?;

    let mut memcpy = MemcpySystem {
        array: Vec::new(),
        delay,
    };
    let mut pmdk = PmdkSystem {
        path: dir.join(format!("bench-vnvm-pmdk-{}.pool", std::process::id())),
        pool: None,
        delay,
    };
    let mut vnvm = vnvm_system(&dir, delay);

    progress(
        o.json,
        &format!(
            "setting up a {} MiB array per system (untimed)",
            bytes >> 20
        ),
    );
    memcpy.setup(bytes).context("memcpy: setup")?;
    pmdk.setup(bytes).context("pmdk: setup")?;
    if let Ok(v) = vnvm.as_mut() {
        v.setup(bytes).context("vnvm: setup")?;
    }
    let pmdk_pool = pmdk.path.display().to_string();

    let mut results = Vec::new();
    for passes in PASSES {
        for s in SIZES {
            // [vnvm, pmdk, memcpy] samples in tx/s.
            let mut samples: [Vec<f64>; 3] = Default::default();
            let mut transactions = 0;
            for rep in 0..reps {
                let mut systems: Vec<(usize, &mut dyn TxSystem)> =
                    vec![(1, &mut pmdk), (2, &mut memcpy)];
                if let Ok(v) = vnvm.as_mut() {
                    systems.insert(0, (0, v.as_mut()));
                }
                // Rotate the order each repetition: no system always runs first (or last).
                let k = rep % systems.len();
                systems.rotate_left(k);
                for (slot, sys) in systems {
                    let seed = (rep * 8 + slot) as u8;
                    let (txs, secs) = time_cell(sys, pages, s, passes, seed)?;
                    // Untimed: no background work of this system runs into the next cell.
                    sys.quiesce()
                        .with_context(|| format!("{}: quiesce", sys.name()))?;
                    transactions = txs;
                    samples[slot].push(txs as f64 / secs);
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
            results.push(Row {
                passes,
                bytes_per_page: s,
                vnvm_tps,
                pmdk_tps,
                memcpy_tps: med(&samples[2]).unwrap_or(f64::NAN),
                ratio_vs_pmdk: vnvm_tps.map(|v| round3(v / pmdk_tps)),
                transactions,
            });
        }
    }

    progress(o.json, "read pass over committed data");
    let read_bytes = bytes.min(READ_PASS_MAX);
    let read_reps = if o.quick { 5 } else { 9 };
    let gbps = |secs: f64| round2(read_bytes as f64 / secs / 1e9);
    let vnvm_region = vnvm.as_ref().ok().and_then(|v| v.region());
    let medians = read_pass_medians(
        &[
            Some(&memcpy.array[..read_bytes]),
            pmdk.region().map(|r| &r[..read_bytes]),
            vnvm_region.map(|r| &r[..read_bytes]),
        ],
        read_reps,
    );
    let (plain, pmdk_read, vnvm_read) = (medians[0].unwrap_or(f64::NAN), medians[1], medians[2]);
    let read_pass = ReadPass {
        bytes: read_bytes,
        plain_gbps: gbps(plain),
        pmdk_gbps: pmdk_read.map(gbps),
        vnvm_gbps: vnvm_read.map(gbps),
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
        delay: DelayInfo {
            model: delay.to_string(),
            memcpy_charged: memcpy.charges(),
            pmdk_charged: pmdk.charges(),
            vnvm_charged: match &vnvm {
                Ok(v) => v.charges(),
                Err(_) => "n/a",
            },
        },
        pmdk: PmdkInfo {
            libpmemobj: tiermem_pmdk::LIBPMEMOBJ_VERSION,
            pool: pmdk_pool,
            pool_bytes: tiermem_pmdk::pool_size_for(bytes),
            pmem_is_pmem_force: force,
        },
        vnvm_writeback: vnvm.as_ref().ok().and_then(|v| v.background_pages()),
        vnvm: match &vnvm {
            Ok(_) => "measured".to_string(),
            Err(e) => format!("unavailable: {e}"),
        },
        results,
        read_overhead_ratio: vnvm_read.map(|v| round3(v / plain)),
        read_pass,
        seconds: round2(t0.elapsed().as_secs_f64()),
    };
    drop(pmdk);
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_table(&report);
    Ok(())
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
        "\n{:>3} {:>5} {:>8} {:>12} {:>12} {:>13} {:>10}",
        "P", "S", "tx", "vnvm tx/s", "PMDK tx/s", "memcpy tx/s", "vnvm/PMDK"
    );
    for row in &r.results {
        println!(
            "{:>3} {:>5} {:>8} {:>12} {:>12.0} {:>13.0} {:>10}",
            row.passes,
            row.bytes_per_page,
            row.transactions,
            fmt(row.vnvm_tps),
            row.pmdk_tps,
            row.memcpy_tps,
            row.ratio_vs_pmdk
                .map_or_else(|| "—".to_string(), |x| format!("{x:.2}×"))
        );
    }
    let rp = &r.read_pass;
    println!(
        "\nread pass over {} MiB: plain memory {:.2} GB/s, pmdk pool {}, vnvm {}; \
         read_overhead_ratio (vnvm / plain time) {}",
        rp.bytes >> 20,
        rp.plain_gbps,
        rp.pmdk_gbps
            .map_or_else(|| "—".to_string(), |x| format!("{x:.2} GB/s")),
        rp.vnvm_gbps
            .map_or_else(|| "—".to_string(), |x| format!("{x:.2} GB/s")),
        r.read_overhead_ratio
            .map_or_else(|| "—".to_string(), |x| format!("{x:.3}"))
    );
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
    fn vnvm_without_a_directory_is_reported_unavailable() {
        assert!(vnvm_system(Path::new("/nonexistent"), DelayModel::NONE).is_err());
    }
}
