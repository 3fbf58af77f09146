//! tiermem-bench: the benchmark harnesses behind `tiermem bench <name>`. Each module owns one
//! subsystem's benchmark, which runs its baseline side by side in the same run and reports
//! medians and ratios, the delay model in force and the machine it ran on. The `tiermem` binary
//! only parses arguments and dispatches here, including the hidden worker subcommands whose
//! entry points (`vnvm::worker_main`, `migrate::case_worker_main`, `pheap::run_worker_main`,
//! `prefault::run_worker_main`, `iocache::run_worker_main`)
//! the benchmarks re-execute the binary for.
//!
//! Shared pieces live here once: `machine` (what a report ran on), `stats` (percentiles),
//! `plot` (charts), `cpu` (CPU-time accounting) and `worker` (worker processes).

pub mod cpu;
pub mod fault;
pub mod iocache;
pub mod kv;
pub mod kv_harness;
pub mod machine;
pub mod media;
pub mod migrate;
pub mod migrate_kv;
pub mod pager;
pub mod pager_app;
pub mod pager_multi;
pub mod pheap;
pub mod pheap_servers;
pub mod plot;
pub mod prefault;
pub mod progress;
pub mod snapshot;
pub mod stats;
pub mod tpcc;
pub mod vnvm;
pub mod worker;
pub mod zread;

use clap::Args;

/// Options every benchmark takes.
#[derive(Args, Clone, Debug, Default)]
pub struct BenchOpts {
    /// Small sizes and few repetitions: finishes in seconds.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object (for machines) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write the benchmark's chart to this file, where it has one: PNG when the name ends
    /// in .png, SVG when it ends in .svg.
    #[arg(long, value_name = "FILE.png|FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

/// A benchmark's report: `--json` prints its serialisation, otherwise its tables.
pub trait Report: serde::Serialize {
    /// Print the report as human-readable tables on stdout.
    fn print_table(&self);

    /// Whether the run as a whole failed although it produced a report (printed first), e.g.
    /// a system of several that could not be measured.
    fn outcome(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Print a report: one pretty JSON object when `json`, else its tables; then its
/// [`Report::outcome`].
pub fn print_report<R: Report>(report: &R, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        report.print_table();
    }
    report.outcome()
}

/// Show `msg` as the step of long work now running (see [`progress`](mod@progress): a bar or
/// spinner on stderr when it is a terminal, nothing otherwise; never into --json output). `json`
/// is kept for the callers' sake: stdout is never written either way.
pub fn progress(_json: bool, msg: &str) {
    progress::step(msg);
}

/// The error and its causes as one line, skipping a cause whose text the message before it
/// already contains (typed errors often include their source in their own message).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Parse a byte size such as `4096`, `64k`, `1m` or `2GiB` (the media layer's syntax).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    Ok(tiermem_media::parse_size(s)?)
}

/// Whether `exe` (an absolute path, or a name looked up in `$PATH`) exists.
pub fn on_path(exe: &str) -> bool {
    if exe.starts_with('/') {
        return std::path::Path::new(exe).exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|ps| std::env::split_paths(&ps).any(|d| d.join(exe).exists()))
}
