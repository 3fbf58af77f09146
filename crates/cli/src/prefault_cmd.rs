//! `tiermem prefault run [opts] -- CMD ARGS...`: runs an unmodified program under
//! `libtiermem_prefault_preload.so` (crates/prefault-preload), which populates its anonymous
//! memory ahead of its first touches. This file only turns the options into the library's
//! `TIERMEM_PREFAULT_*` variables, finds the library next to the `tiermem` binary (or at
//! `$TIERMEM_PREFAULT_PRELOAD`) and `exec`s the command, so its exit status is the command's.

use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

/// The library's file name.
const PRELOAD: &str = "libtiermem_prefault_preload.so";

/// Every variable the library reads (also in the crate documentation of
/// crates/prefault-preload).
const ENV_HELP: &str = "\
Environment (the options set these; any other is passed on as it is):
  TIERMEM_PREFAULT_BUDGET       bytes populated ahead and not yet used, at most (k/m/g) [64m]
  TIERMEM_PREFAULT_MIN          smallest mmap or malloc request registered (k/m/g) [256k]
  TIERMEM_PREFAULT_CHUNK        pages per window entry, 1..=64 [16]
  TIERMEM_PREFAULT_ENTRIES      window entries per region, 1..=64 [64]
  TIERMEM_PREFAULT_ORDER        auto|ascending|descending|stride|whole [auto]
  TIERMEM_PREFAULT_POPULATE     auto|write|read [auto]
  TIERMEM_PREFAULT_THP          auto|on|off [auto]
  TIERMEM_PREFAULT_INTERVAL_US  microseconds between the service's passes while idle [2000]
  TIERMEM_PREFAULT_HEAP         1: follow [heap] (and tune glibc's top pad and trim threshold); 0: not [1]
  TIERMEM_PREFAULT_STATS        file the exit report (one JSON object) is written to; %p: the pid
  TIERMEM_PREFAULT_STATS_PID    the process that writes it (run sets CMD's: programs CMD starts do not)
  TIERMEM_PREFAULT_CHILD        plain|restart: a forked child runs plain or starts its own service [plain]
  TIERMEM_PREFAULT_SCHED_IDLE   1: the service thread runs SCHED_IDLE; 0: normal priority [1]
  TIERMEM_PREFAULT_DISABLE      1: run the program plain
  TIERMEM_PREFAULT_PRELOAD      the library to use (default: next to the tiermem binary)
A malformed variable makes the library print one warning naming it; the program then runs plain.";

/// Touch orders.
#[derive(Clone, Copy, ValueEnum)]
pub enum OrderArg {
    /// Learned from the footprint.
    Auto,
    /// Low addresses first.
    Ascending,
    /// High addresses first.
    Descending,
    /// Every n-th page (n learned).
    Stride,
    /// No order: whole regions, as the budget allows.
    Whole,
}

/// Populate kinds.
#[derive(Clone, Copy, ValueEnum)]
pub enum PopulateArg {
    /// Learned per region: the zero page while the program reads first, else private pages.
    Auto,
    /// Private zeroed pages (first writes do not fault).
    Write,
    /// The shared zero page (first reads do not fault).
    Read,
}

/// Huge-page handling.
#[derive(Clone, Copy, ValueEnum)]
pub enum ThpArg {
    /// As the kernel maps the region.
    Auto,
    /// Whole 2 MiB units.
    On,
    /// 4 KiB chunks with tripwires.
    Off,
}

/// What a forked child does.
#[derive(Clone, Copy, ValueEnum)]
pub enum ChildArg {
    /// Runs without prefaulting.
    Plain,
    /// Starts its own service.
    Restart,
}

/// prefault subcommands.
#[derive(Subcommand)]
pub enum PrefaultCommand {
    /// Run CMD with its anonymous memory (large private mappings, glibc's large blocks,
    /// [heap]) populated ahead of its first touches by a background thread; the exit status is
    /// CMD's. Options not given keep the environment's TIERMEM_PREFAULT_* values.
    #[command(after_help = ENV_HELP)]
    Run {
        /// Budget: bytes populated ahead and not yet used, at most (e.g. 64m).
        #[arg(long, value_name = "BYTES")]
        budget: Option<String>,
        /// Smallest mapping or malloc request registered (e.g. 256k).
        #[arg(long, value_name = "BYTES")]
        min: Option<String>,
        /// Pages per window entry, 1..=64.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
        chunk: Option<u32>,
        /// Window entries per region, 1..=64.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
        entries: Option<u32>,
        /// Touch order the service follows.
        #[arg(long, value_enum)]
        order: Option<OrderArg>,
        /// How pages are populated.
        #[arg(long, value_enum)]
        populate: Option<PopulateArg>,
        /// Transparent huge pages.
        #[arg(long, value_enum)]
        thp: Option<ThpArg>,
        /// Microseconds between the service's passes while idle.
        #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        interval_us: Option<u64>,
        /// Do not follow [heap] (nor tune glibc's malloc).
        #[arg(long)]
        no_heap: bool,
        /// What a forked child does.
        #[arg(long, value_enum)]
        child: Option<ChildArg>,
        /// Write the exit report (one JSON object: the service's figures, the minor faults of
        /// the application's threads and of the service thread) to FILE (%p: the pid).
        #[arg(long, value_name = "FILE")]
        stats: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<OsString>,
    },
}

/// Run one prefault subcommand (`run` does not return when the command starts).
pub fn run(cmd: PrefaultCommand) -> Result<()> {
    match cmd {
        PrefaultCommand::Run {
            budget,
            min,
            chunk,
            entries,
            order,
            populate,
            thp,
            interval_us,
            no_heap,
            child,
            stats,
            cmd,
        } => {
            let mut env: Vec<(&str, String)> = Vec::new();
            if let Some(b) = budget {
                let n = crate::pool_cmd::parse_size(&b).context("--budget")?;
                if n < 4096 {
                    bail!("--budget {b}: at least one page (4096 bytes)");
                }
                env.push(("TIERMEM_PREFAULT_BUDGET", n.to_string()));
            }
            if let Some(m) = min {
                let n = crate::pool_cmd::parse_size(&m).context("--min")?;
                env.push(("TIERMEM_PREFAULT_MIN", n.to_string()));
            }
            if let Some(c) = chunk {
                env.push(("TIERMEM_PREFAULT_CHUNK", c.to_string()));
            }
            if let Some(e) = entries {
                env.push(("TIERMEM_PREFAULT_ENTRIES", e.to_string()));
            }
            if let Some(o) = order {
                env.push(("TIERMEM_PREFAULT_ORDER", o.name()));
            }
            if let Some(p) = populate {
                env.push(("TIERMEM_PREFAULT_POPULATE", p.name()));
            }
            if let Some(t) = thp {
                env.push(("TIERMEM_PREFAULT_THP", t.name()));
            }
            if let Some(us) = interval_us {
                env.push(("TIERMEM_PREFAULT_INTERVAL_US", us.to_string()));
            }
            if no_heap {
                env.push(("TIERMEM_PREFAULT_HEAP", "0".into()));
            }
            if let Some(c) = child {
                env.push(("TIERMEM_PREFAULT_CHILD", c.name()));
            }
            if let Some(s) = stats {
                let s = std::path::absolute(&s).unwrap_or(s);
                env.push(("TIERMEM_PREFAULT_STATS", s.display().to_string()));
                // CMD keeps this process's pid (exec): the programs it starts do not write.
                env.push(("TIERMEM_PREFAULT_STATS_PID", std::process::id().to_string()));
            }
            let lib = crate::preload::find(
                PRELOAD,
                "TIERMEM_PREFAULT_PRELOAD",
                "tiermem-prefault-preload",
            )?;
            crate::preload::exec(&lib, &cmd, &env)
        }
    }
}

/// A value's name as clap spells it.
trait ValueEnumName {
    fn name(&self) -> String;
}

impl<T: ValueEnum> ValueEnumName for T {
    fn name(&self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}
