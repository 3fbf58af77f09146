//! `tiermem-tpcc`: the TPC-C-like driver's command line — `load` builds a database, `run`
//! drives the mix through the `tiermem` VFS (pool settings from `TIERMEM_IOCACHE_*` or the
//! options), `check` verifies integrity and the consistency conditions.

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tiermem_iocache_vfs::{config, tpcc};

#[derive(Parser)]
#[command(
    name = "tiermem-tpcc",
    about = "TPC-C-like workload on SQLite through the tiermem iocache VFS",
    after_help = "Pool settings: TIERMEM_IOCACHE_MODE=buffered|direct|dbio (default dbio), \
                  TIERMEM_IOCACHE_POOL (default 16M), TIERMEM_IOCACHE_BUDGET (default 4x pool); \
                  --mode/--pool/--budget override them."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a database (replacing the file).
    Load {
        /// The database file (a block file system for direct and dbio).
        #[arg(long, default_value_os_t = tpcc::default_db())]
        db: PathBuf,
        /// Warehouses.
        #[arg(long, default_value_t = 1)]
        warehouses: u32,
        /// Fraction of TPC-C's items and customers, in (0, 1].
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the transaction mix and report tpmC.
    Run {
        /// The database file.
        #[arg(long, default_value_os_t = tpcc::default_db())]
        db: PathBuf,
        /// Seconds to run (default 60 unless --txns is given).
        #[arg(long)]
        seconds: Option<f64>,
        /// Transactions to run per connection.
        #[arg(long)]
        txns: Option<u64>,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Pool mode: buffered, direct or dbio (default: $TIERMEM_IOCACHE_MODE, else dbio).
        #[arg(long)]
        mode: Option<String>,
        /// Pool bytes, e.g. 16M (default: $TIERMEM_IOCACHE_POOL, else 16M).
        #[arg(long)]
        pool: Option<String>,
        /// Budget bytes (default: $TIERMEM_IOCACHE_BUDGET, else 4x pool).
        #[arg(long)]
        budget: Option<String>,
        /// VFS: tiermem, or unix for plain SQLite.
        #[arg(long, default_value = "tiermem")]
        vfs: String,
        /// SQLite's own page cache, KiB.
        #[arg(long, default_value_t = 256)]
        sqlite_cache_kib: u32,
        /// PRAGMA synchronous: off, normal, full.
        #[arg(long, default_value = "normal")]
        sync: String,
        /// PRAGMA journal_mode (delete, truncate, persist, wal).
        #[arg(long, default_value = "delete")]
        journal: String,
        /// Connections, one thread each.
        #[arg(long, default_value_t = 1)]
        threads: u32,
        /// PRAGMA locking_mode=EXCLUSIVE (one connection keeps its lock: no write-back of the
        /// pool at each unlock).
        #[arg(long)]
        exclusive: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// PRAGMA integrity_check and TPC-C's consistency conditions 1-4.
    Check {
        /// The database file.
        #[arg(long, default_value_os_t = tpcc::default_db())]
        db: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn size(opt: Option<String>, what: &str) -> Result<Option<u64>> {
    opt.map(|s| config::parse_size(&s).map_err(|e| anyhow::anyhow!("--{what}: {e}")))
        .transpose()
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tiermem-tpcc: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Load {
            db,
            warehouses,
            scale,
            seed,
            json,
        } => {
            if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let s = tpcc::load_with(
                &db,
                &tpcc::LoadOptions {
                    warehouses,
                    seed,
                    scale,
                    progress: true,
                },
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!(
                    "{}: {} warehouse(s), {} items, {} customers/district, {:.1} MB in {:.1} s",
                    db.display(),
                    s.scale.warehouses,
                    s.scale.items,
                    s.scale.customers,
                    s.bytes as f64 / 1e6,
                    s.seconds
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            db,
            seconds,
            txns,
            seed,
            mode,
            pool,
            budget,
            vfs,
            sqlite_cache_kib,
            sync,
            journal,
            threads,
            exclusive,
            json,
        } => {
            if seconds.is_some_and(|s| s.is_nan() || s <= 0.0) {
                bail!("--seconds must be positive");
            }
            let opts = tpcc::RunOptions {
                duration: seconds.map(Duration::from_secs_f64),
                txns,
                seed,
                vfs,
                mode: mode
                    .map(|m| config::parse_mode(&m).map_err(anyhow::Error::msg))
                    .transpose()?,
                pool_bytes: size(pool, "pool")?,
                budget: size(budget, "budget")?,
                sqlite_cache_kib,
                synchronous: tpcc::Synchronous::parse(&sync)?,
                journal_mode: journal,
                threads,
                exclusive,
                progress: true,
            };
            let r = tpcc::run(&db, &opts)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                let mode = r.pool.as_ref().map_or("-", |p| p.mode);
                println!(
                    "vfs {} mode {mode}: {} txns in {:.1} s ({:.0}/s), tpmC {:.0}, aborted {}, \
                     errors {}",
                    r.vfs, r.txns, r.elapsed_s, r.tps, r.tpmc, r.aborted, r.errors
                );
                if let Some(p) = &r.pool {
                    println!(
                        "pool {} KiB of budget {} KiB: hits {} misses {} (page cache {}, \
                         direct {}, buffered {}), writes direct {} buffered {}",
                        p.pool_bytes >> 10,
                        p.budget >> 10,
                        p.pool_hits,
                        p.pool_misses,
                        p.cache_hits,
                        p.direct_reads,
                        p.buffered_reads,
                        p.direct_writes,
                        p.buffered_writes
                    );
                }
                if let Some(e) = &r.first_error {
                    println!("first error: {e}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Check { db, json } => {
            let c = tpcc::check(&db, None)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                println!("integrity: {}", c.integrity.join("; "));
                for v in &c.violations {
                    println!("violation {v}");
                }
                println!(
                    "{} orders; {}",
                    c.orders,
                    if c.ok() {
                        "consistent"
                    } else {
                        "NOT consistent"
                    }
                );
            }
            Ok(if c.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
