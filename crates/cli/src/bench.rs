//! `tiermem bench <name>`: the command line of the benchmarks (tiermem-bench holds them, one
//! module per subsystem); this module parses arguments and dispatches, hidden worker
//! subcommands included.

use anyhow::Result;
use clap::Subcommand;
/// `bench migrate`'s harness; `migrate run` shares its size syntax (`crate::bench::migrate`).
pub use tiermem_bench::migrate;
use tiermem_bench::{
    fault, iocache, kv, media, pheap, prefault, print_report, snapshot, vnvm, BenchOpts,
};

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Copy bandwidth into a pool under each delay preset, and how exactly the injected delay
    /// matches the model at 4 KB and 2 MB transfers.
    Media(BenchOpts),
    /// Fault resolution costs per mode, and written-page scans (PAGEMAP_SCAN against mprotect).
    Fault(BenchOpts),
    /// The vNVML microbenchmark: 32 page writes of S bytes per transaction, vnvm against PMDK
    /// libpmemobj and a non-durable memcpy, transactions/s and the ratio vnvm/PMDK.
    Vnvm(BenchOpts),
    /// tiermem-kv (vnvm with durable commits, volatile) against redis-server (AOF fsync always,
    /// everysec): redis-benchmark SET/GET and YCSB workloads A and B, ops/s and p99, the ratios
    /// durable/volatile and durable/Redis. Needs redis-server, redis-tools and the YCSB binding
    /// (bench/ycsb, built by scripts/setup.sh).
    Kv(kv::KvOpts),
    /// Live migration through a shared FAM pool against its baselines, side by side: synthetic
    /// applications (sequential, uniform, zipfian updates) and tiermem-kv migrated between two
    /// network namespaces by FAM-aware post-copy, socket post-copy (CRIU-like; expiration 0,
    /// 3, 100, 150 ms), stop-and-copy and pre-copy; downtime, busy, total time, degradation,
    /// the paper's ratios and a timeline PNG.
    Migrate(migrate::MigrateOpts),
    /// The persistent heap: FGCK (2 user views, object-granular checkpoints) against PGCK (1
    /// view, whole pages), plus 4 and 8 views, on sparse/dense random updates of 64 B and
    /// 128 B objects and Tokyo Cabinet-style hash-table inserts (64 B, 128 B, 1 KiB records,
    /// checkpoint intervals 5/10/15 scaled seconds): bytes copied per checkpoint, checkpoint
    /// time, run time, minor faults, and the tracking overhead against glibc malloc.
    Pheap(BenchOpts),
    /// The prefault service (POE on a stock kernel): the first-touch critical path per access
    /// (lfence; rdtsc; access; mfence; rdtscp) and total time of the paper's microbenchmark
    /// against the kernel's demand fault, MAP_POPULATE and userfaultfd (POE's move pool,
    /// UFFDIO_COPY, UFFDIO_ZEROPAGE), THP off and on; time to first touch of 10 % of 1 GiB;
    /// programs (sqlite3, sort, python3, redis, memcached, x264, vips) plain and under
    /// `tiermem prefault run`. Per-touch CDFs with --plot.
    Prefault(BenchOpts),
    /// Point-in-time snapshots of a key-value server's memory under a writer load (MDC):
    /// tiermem-kv's wp, fork-mdc and fork methods against redis-server's BGSAVE (fork), each
    /// server in a memory cgroup of its own, 1 KB values (256 MB with --quick, else 2 GB),
    /// redis-benchmark at 50 % and 100 % updates: extra memory (cgroup total_rss), snapshot time,
    /// pause, throughput and p99 during the snapshot, file size, restore time after kill -9,
    /// the paper's ratios; memory and throughput over time with --plot.
    Snapshot(snapshot::SnapshotOpts),
    /// The DBIO buffer pool (iocache) in buffered, direct and dbio modes side by side: YCSB-B
    /// (and, without --quick, YCSB-A and a smaller data file) over 4 KiB pages, zipfian 0.99, a
    /// data file twice the budget on a disk, each run in a memory cgroup limited to the budget,
    /// pools of 25/50/75 % of it: ops/s, pool and page-cache hit ratios, device I/O per
    /// operation, peak memory, pages held twice, and the ratios dbio/buffered and dbio/direct.
    Iocache(iocache::IocacheOpts),
    /// The pager (NVSwap) against kernel swap: a probe owning D bytes of 1 KB records runs
    /// YCSB-A, timing every operation; page-in p50/p99 per system (kernel-swap in a memory
    /// cgroup with a swap file of its own, pager-lru-ssd, pager-nolc, pager bounded at half of
    /// kernel swap's p99), page-out p99, throughput, CPU, the ratios, and a page-in CDF (PNG).
    /// D = 2 GiB (256 MiB with --quick), budget D/2, NVM buffer D/4.
    Pager(tiermem_bench::pager::PagerBenchOpts),
    /// Internal: the probe process of `bench pager`.
    #[command(hide = true)]
    PagerRun,
    /// Internal: the process one system of `bench vnvm` runs in, driven by `bench vnvm` over
    /// its stdin and stdout (one JSON request and one reply per line).
    #[command(hide = true)]
    VnvmWorker(vnvm::WorkerArgs),
    /// Internal: the process one synthetic case run of `bench migrate` runs in, driven by
    /// `bench migrate` over its stdin and stdout.
    #[command(hide = true)]
    MigrateCase,
    /// Internal: the process one run of `bench pheap` runs in.
    #[command(hide = true)]
    PheapRun,
    /// Internal: the process one run of `bench prefault` runs in.
    #[command(hide = true)]
    PrefaultRun,
    /// Internal: the process one run of `bench iocache` runs in.
    #[command(hide = true)]
    IocacheRun,
    /// Internal: the process one z-READ method of `bench iocache` runs in.
    #[command(hide = true)]
    ZreadRun,
}

/// Run one benchmark.
pub fn run(cmd: BenchCommand) -> Result<()> {
    // Progress on stderr while it runs (a terminal only; a benchmark may plan its steps).
    // Workers (hidden subcommands) draw nothing: their parent shows the progress.
    let Some(name) = cmd.name() else {
        return run_inner(cmd);
    };
    tiermem_bench::progress::plan(name, None);
    let r = run_inner(cmd);
    tiermem_bench::progress::done();
    r
}

impl BenchCommand {
    /// `bench NAME` of a benchmark; `None` for the hidden worker subcommands.
    fn name(&self) -> Option<&'static str> {
        Some(match self {
            BenchCommand::Media(_) => "bench media",
            BenchCommand::Fault(_) => "bench fault",
            BenchCommand::Vnvm(_) => "bench vnvm",
            BenchCommand::Kv(_) => "bench kv",
            BenchCommand::Migrate(_) => "bench migrate",
            BenchCommand::Pheap(_) => "bench pheap",
            BenchCommand::Prefault(_) => "bench prefault",
            BenchCommand::Snapshot(_) => "bench snapshot",
            BenchCommand::Iocache(_) => "bench iocache",
            BenchCommand::Pager(_) => "bench pager",
            BenchCommand::VnvmWorker(_)
            | BenchCommand::MigrateCase
            | BenchCommand::PheapRun
            | BenchCommand::PrefaultRun
            | BenchCommand::IocacheRun
            | BenchCommand::PagerRun
            | BenchCommand::ZreadRun => return None,
        })
    }
}

fn run_inner(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Media(o) => print_report(&media::run(&o)?, o.json),
        BenchCommand::Fault(o) => print_report(&fault::run(&o)?, o.json),
        BenchCommand::Vnvm(o) => print_report(&vnvm::run(&o)?, o.json),
        BenchCommand::Kv(o) => print_report(&kv::run(&o)?, o.bench.json),
        BenchCommand::Migrate(o) => print_report(&migrate::run(&o)?, o.common.json),
        BenchCommand::Pheap(o) => print_report(&pheap::run(&o)?, o.json),
        BenchCommand::Prefault(o) => print_report(&prefault::run(&o)?, o.json),
        BenchCommand::Snapshot(o) => print_report(&snapshot::run(&o)?, o.bench.json),
        BenchCommand::VnvmWorker(a) => vnvm::worker_main(a),
        BenchCommand::MigrateCase => migrate::case_worker_main(),
        BenchCommand::PheapRun => pheap::run_worker_main(),
        BenchCommand::PrefaultRun => prefault::run_worker_main(),
        BenchCommand::Iocache(o) => print_report(&iocache::run(&o)?, o.bench.json),
        BenchCommand::IocacheRun => iocache::run_worker_main(),
        BenchCommand::ZreadRun => tiermem_bench::zread::run_worker_main(),
        BenchCommand::Pager(o) => print_report(&tiermem_bench::pager::run(&o)?, o.bench.json),
        BenchCommand::PagerRun => tiermem_bench::pager::run_worker_main(),
    }
}
