//! `tiermem`: the command-line front end of the tiermem toolkit.
//!
//! Every subsystem has a subcommand here; the foundation provides `doctor` (what this machine can
//! do and what it costs), `pool` (emulated NVM/FAM pools), `bench` (side-by-side benchmarks) and
//! `tour` (the quick-start job: every subsystem at work, each result checked).

mod bench;
mod iocache_cmd;
mod kv_cmd;
mod migrate_cmd;
mod pager_cmd;
mod pheap_cmd;
mod pool_cmd;
mod prefault_cmd;
mod preload;
mod snapshot_cmd;
mod vnvm_cmd;

use tiermem_tour::{self as tour, doctor};

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Top-level command line.
#[derive(Parser)]
#[command(
    name = "tiermem",
    version,
    about = "Tiered, persistent and pooled memory in user space"
)]
struct Cli {
    /// Delay model for every device this command opens without an explicit one (same as
    /// TIERMEM_DELAY): none, pcm-fam, nvmm, ethernet-10g, or e.g. read=1us,write=1us,bw=2GB/s.
    #[arg(long, global = true, value_name = "MODEL")]
    delay: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Report the kernel features tiermem uses and measure this machine's fault and copy costs.
    Doctor {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Fewer samples (faster, noisier).
        #[arg(long)]
        quick: bool,
    },
    /// Create, inspect and remove emulated NVM / FAM pools.
    Pool {
        #[command(subcommand)]
        action: pool_cmd::PoolCommand,
    },
    /// Benchmarks that run their baseline side by side and print the ratio.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
    /// vnvm (virtual NVM with transactions): recover, inspect and monitor an instance.
    Vnvm {
        #[command(subcommand)]
        action: vnvm_cmd::VnvmCommand,
    },
    /// tiermem-kv: a Redis-protocol key-value server whose data lives in tiermem memory.
    Kv {
        #[command(subcommand)]
        action: kv_cmd::KvCommand,
    },
    /// Migration of memory regions through a shared FAM directory: inspect and remove the
    /// migrations a FAM directory holds.
    Migrate {
        #[command(subcommand)]
        action: migrate_cmd::MigrateCommand,
    },
    /// Persistent heaps with object-granular checkpoints (FGCK): describe, verify and remove
    /// a heap's checkpoint file.
    Pheap {
        #[command(subcommand)]
        action: pheap_cmd::PheapCommand,
    },
    /// snapshot (MDC without fork): inspect, verify and remove snapshot files.
    Snapshot {
        #[command(subcommand)]
        action: snapshot_cmd::SnapshotCommand,
    },
    /// Prefault: run an unmodified program with its anonymous memory populated ahead of its
    /// first touches (libtiermem_prefault_preload.so).
    Prefault {
        #[command(subcommand)]
        action: prefault_cmd::PrefaultCommand,
    },
    /// iocache (the DBIO buffer pool's data files): what of a file the page cache holds, and
    /// dropping it from there.
    Iocache {
        #[command(subcommand)]
        action: iocache_cmd::IocacheCommand,
    },
    /// The pager (NVSwap: paging past a DRAM budget through an NVM buffer and a swap file):
    /// calibrate the zones' capacity, run an unmodified program paged.
    Pager {
        #[command(subcommand)]
        action: pager_cmd::PagerCommand,
    },
    /// The quick-start job: every subsystem at work, each result checked (doctor, media, fault,
    /// vnvm, kv, migrate, pheap, prefault, snapshot, iocache, pager, zread), then a table of what
    /// ran. Steps
    /// whose prerequisites are missing are skipped; the exit status is non-zero when a step
    /// failed.
    Tour {
        /// Directory for the demo files (default: $TIERMEM_DIR or /dev/shm/tiermem).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Run only these steps (comma-separated), in the tour's order.
        #[arg(long, value_name = "STEPS", value_delimiter = ',',
              value_parser = clap::builder::PossibleValuesParser::new(tour::STEP_NAMES))]
        only: Vec<String>,
    },
}

/// Ends the process quietly when stdout's reader has gone (`tiermem doctor | head`): `println!`
/// panics on EPIPE because Rust ignores SIGPIPE, which the servers and migrations rely on (a peer
/// that hangs up must be an error, not a silent death). Exit status 141 is what a shell reports
/// for a process killed by SIGPIPE. Every other panic keeps the default report.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    if let Some(model) = &cli.delay {
        if let Err(e) = model.parse::<tiermem_media::DelayModel>() {
            eprintln!("tiermem: error: --delay: {e}");
            return ExitCode::FAILURE;
        }
        // Still single-threaded here: nothing else reads the environment concurrently.
        std::env::set_var("TIERMEM_DELAY", model);
    }
    let result = match cli.command {
        Command::Doctor { json, quick } => doctor::run(json, quick),
        Command::Pool { action } => pool_cmd::run(action),
        Command::Bench { which } => bench::run(which),
        Command::Vnvm { action } => vnvm_cmd::run(action),
        Command::Kv { action } => kv_cmd::run(action),
        Command::Migrate { action } => migrate_cmd::run(action),
        Command::Pheap { action } => pheap_cmd::run(action),
        Command::Snapshot { action } => snapshot_cmd::run(action),
        Command::Iocache { action } => iocache_cmd::run(action),
        Command::Pager { action } => pager_cmd::run(action),
        Command::Prefault { action } => prefault_cmd::run(action),
        Command::Tour { dir, only } => tour::run(dir, &only),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tiermem: error: {}", tiermem_bench::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
