//! `tiermem vnvm recover|info|stats|scrub DIR`.
//!
//! `recover`: recovery of a vnvm instance after an unclean shutdown (thesis §2.4.6): dirty NVM
//! cache pages are written back first, then the committed logs are replayed in order, the files
//! synced and the instance reset. Idempotent; a damaged instance is reported with the location
//! of the damage and nothing is written.
//!
//! `info` and `stats`: read-only views of an instance (stopped or live) through
//! [`tiermem_vnvm::inspect`]: geometry, state, file records, pool files; committed-list and
//! NVM-cache occupancy, and per-process worker activity when a process uses the instance.
//!
//! `scrub`: read and verify everything the instance holds ([`tiermem_vnvm::scrub`]); exit 0
//! when clean, 1 when damage was found, 2 when the instance cannot be opened.

use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use tiermem_vnvm::inspect::{InstanceInfo, InstanceState, LiveInfo};
use tiermem_vnvm::Mode;

/// vnvm subcommands.
#[derive(Subcommand)]
pub enum VnvmCommand {
    /// Recover an instance directory (meta.pool, log.pool, cache.pool) into its backing files.
    Recover {
        /// The instance directory (default: $TIERMEM_DIR/vnvm).
        dir: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show an instance: state, geometry, pool files and file records (read-only).
    #[command(after_help = INFO_JSON_KEYS)]
    Info {
        /// The instance directory (default: $TIERMEM_DIR/vnvm).
        dir: Option<PathBuf>,
        /// Print one JSON object (keys below).
        #[arg(long)]
        json: bool,
    },
    /// Read and verify everything an instance holds (checksums of logs, cache pages and
    /// records, backing-file pages) without writing anything. Exit 0 when clean, 1 when
    /// damage was found, 2 when the instance cannot be opened.
    #[command(after_help = SCRUB_JSON_KEYS)]
    Scrub {
        /// The instance directory (default: $TIERMEM_DIR/vnvm).
        dir: Option<PathBuf>,
        /// Print one JSON object (keys below).
        #[arg(long)]
        json: bool,
    },
    /// Show an instance's occupancy: committed logs, NVM cache, dirty ratio, worker activity
    /// (read-only; works on a live instance).
    #[command(after_help = STATS_JSON_KEYS)]
    Stats {
        /// The instance directory (default: $TIERMEM_DIR/vnvm).
        dir: Option<PathBuf>,
        /// Print one JSON object (keys below).
        #[arg(long)]
        json: bool,
    },
}

/// The keys of `vnvm info --json` (stable).
const INFO_JSON_KEYS: &str = "\
JSON keys (--json):
  dir                  instance directory
  state                \"clean\" or \"running_or_crashed\"
  geometry             {format_version, page_size, log_pages, cache_pages, max_files,
                       max_domains, log_objects}
  pools                [{name, path, bytes}] for meta.pool, log.pool, cache.pool
  files                [{id, mode (\"private\" | \"shared\"), size, path, relative,
                       checksum_table (path or null)}] by id";

/// The keys of `vnvm scrub --json` (stable).
const SCRUB_JSON_KEYS: &str = "\
JSON keys (--json):
  dir                  instance directory
  clean                true when nothing bad was found
  areas                [{name, checked, skipped, bad: [{file, what, offset, detail}]}]
                       (skipped: pages a crashed instance's recovery rewrites and checksums
                       again, which cannot be verified before)";

/// The keys of `vnvm stats --json` (stable).
const STATS_JSON_KEYS: &str = "\
JSON keys (--json):
  dir                  instance directory
  state                \"clean\" or \"running_or_crashed\"
  log                  {pages, committed_pages, committed_transactions, committed_pct}
                       (committed = durable, not yet applied to the NVM cache)
  domains              [{domain, transactions, log_pages}] non-empty committed lists
  cache                {pages, mapped, dirty, valid_bytes, dirty_pct}
  live                 null when no process uses the instance, else {users, free_log_pages,
                       free_cache_pages, apps: [{app_id, pid, commits, applied,
                       pages_written_back, age_aborts, flushes, log_pages_held,
                       cache_pages_held}]}";

/// The instance directory argument, or the default one (`$TIERMEM_DIR/vnvm`).
fn instance_dir(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| tiermem_media::default_dir().join("vnvm"))
}

fn inspect(dir: &Path) -> Result<InstanceInfo> {
    tiermem_vnvm::inspect(dir)
        .with_context(|| format!("inspecting the vnvm instance in {}", dir.display()))
}

/// Run a vnvm subcommand.
pub fn run(cmd: VnvmCommand) -> Result<()> {
    match cmd {
        VnvmCommand::Recover { dir, json } => {
            let dir = instance_dir(dir);
            let progress = tiermem_bench::progress::show("vnvm recover");
            tiermem_bench::progress::step(&format!("recovering {}", dir.display()));
            let r = tiermem_vnvm::recover(&dir)
                .with_context(|| format!("recovering the vnvm instance in {}", dir.display()))?;
            drop(progress);
            if json {
                let v = serde_json::json!({
                    "dir": dir.display().to_string(),
                    "was_clean": r.was_clean,
                    "dirty_pages_written": r.dirty_pages_written,
                    "transactions_replayed": r.transactions_replayed,
                    "entries_replayed": r.entries_replayed,
                    "bytes_replayed": r.bytes_replayed,
                    "files": r.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if r.was_clean {
                println!("{}: shut down cleanly, nothing to recover", dir.display());
            } else {
                println!(
                    "{}: wrote back {} dirty cache pages, replayed {} committed transactions ({} entries, {} bytes) into {} files",
                    dir.display(),
                    r.dirty_pages_written,
                    r.transactions_replayed,
                    r.entries_replayed,
                    r.bytes_replayed,
                    r.files.len()
                );
                for f in &r.files {
                    println!("  synced {}", f.display());
                }
            }
            Ok(())
        }
        VnvmCommand::Info { dir, json } => {
            let info = inspect(&instance_dir(dir))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&info_json(&info))?);
            } else {
                print_info(&info);
            }
            Ok(())
        }
        VnvmCommand::Scrub { dir, json } => {
            let dir = instance_dir(dir);
            let r = match tiermem_vnvm::scrub(&dir) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!(
                        "tiermem: error: scrubbing the vnvm instance in {}: {e}",
                        dir.display()
                    );
                    std::process::exit(2);
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&scrub_json(&r))?);
            } else {
                print_scrub(&r);
            }
            if !r.clean() {
                std::process::exit(1);
            }
            Ok(())
        }
        VnvmCommand::Stats { dir, json } => {
            let info = inspect(&instance_dir(dir))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&stats_json(&info))?);
            } else {
                print_stats(&info);
            }
            Ok(())
        }
    }
}

fn state_key(s: InstanceState) -> &'static str {
    match s {
        InstanceState::Clean => "clean",
        InstanceState::RunningOrCrashed => "running_or_crashed",
    }
}

fn state_text(s: InstanceState) -> &'static str {
    match s {
        InstanceState::Clean => "clean (shut down cleanly)",
        InstanceState::RunningOrCrashed => "running or crashed (not shut down cleanly)",
    }
}

fn mode_key(m: Mode) -> &'static str {
    match m {
        Mode::Private => "private",
        Mode::Shared => "shared",
    }
}

/// The pool files: (name, path, bytes).
fn pools(i: &InstanceInfo) -> [(&'static str, PathBuf, u64); 3] {
    let g = &i.geometry;
    [
        ("meta.pool", i.dir.join("meta.pool"), g.meta_pool_bytes),
        ("log.pool", i.dir.join("log.pool"), g.log_pool_bytes),
        ("cache.pool", i.dir.join("cache.pool"), g.cache_pool_bytes),
    ]
}

/// `part / whole` in percent (0 when `whole` is 0).
fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Bytes with a binary unit: `512 B`, `4.0 KiB`, `64.0 MiB`.
fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

fn info_json(i: &InstanceInfo) -> serde_json::Value {
    let g = &i.geometry;
    serde_json::json!({
        "dir": i.dir.display().to_string(),
        "state": state_key(i.state),
        "geometry": {
            "format_version": g.format_version,
            "page_size": g.page_size,
            "log_pages": g.log_pages,
            "cache_pages": g.cache_pages,
            "max_files": g.max_files,
            "max_domains": g.max_domains,
            "log_objects": g.log_objects,
        },
        "pools": pools(i).iter().map(|(name, path, bytes)| serde_json::json!({
            "name": name,
            "path": path.display().to_string(),
            "bytes": bytes,
        })).collect::<Vec<_>>(),
        "files": i.files.iter().map(|f| serde_json::json!({
            "id": f.id,
            "mode": mode_key(f.mode),
            "size": f.size,
            "path": f.path.display().to_string(),
            "relative": f.relative,
            "checksum_table": f.checksum_table.as_ref().map(|t| t.display().to_string()),
        })).collect::<Vec<_>>(),
    })
}

fn scrub_json(r: &tiermem_vnvm::ScrubReport) -> serde_json::Value {
    serde_json::json!({
        "dir": r.dir.display().to_string(),
        "clean": r.clean(),
        "areas": r.areas.iter().map(|a| serde_json::json!({
            "name": a.name,
            "checked": a.checked,
            "skipped": a.skipped,
            "bad": a.bad.iter().map(|b| serde_json::json!({
                "file": b.file.display().to_string(),
                "what": b.what,
                "offset": b.offset,
                "detail": b.detail,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn print_scrub(r: &tiermem_vnvm::ScrubReport) {
    println!("instance   {}", r.dir.display());
    println!(
        "  {:<20} {:>9} {:>9} {:>5}",
        "area", "checked", "skipped", "bad"
    );
    for a in &r.areas {
        println!(
            "  {:<20} {:>9} {:>9} {:>5}",
            a.name,
            a.checked,
            a.skipped,
            a.bad.len()
        );
    }
    for (area, b) in r.findings() {
        println!(
            "BAD {area}: {} in {} at offset {}: {}",
            b.what,
            b.file.display(),
            b.offset,
            b.detail
        );
    }
    println!(
        "{}",
        if r.clean() {
            "clean: every checksum matches"
        } else {
            "DAMAGED: see the lines above (recovery refuses what it cannot trust)"
        }
    );
}

fn live_json(l: &LiveInfo) -> serde_json::Value {
    serde_json::json!({
        "users": l.users,
        "free_log_pages": l.free_log_pages,
        "free_cache_pages": l.free_cache_pages,
        "apps": l.apps.iter().map(|a| serde_json::json!({
            "app_id": a.app_id,
            "pid": a.pid,
            "commits": a.commits,
            "applied": a.applied,
            "pages_written_back": a.pages_written_back,
            "age_aborts": a.age_aborts,
            "flushes": a.flushes,
            "log_pages_held": a.log_pages_held,
            "cache_pages_held": a.cache_pages_held,
        })).collect::<Vec<_>>(),
    })
}

fn stats_json(i: &InstanceInfo) -> serde_json::Value {
    let g = &i.geometry;
    let c = &i.cache;
    serde_json::json!({
        "dir": i.dir.display().to_string(),
        "state": state_key(i.state),
        "log": {
            "pages": g.log_pages,
            "committed_pages": i.committed_log_pages,
            "committed_transactions": i.committed_transactions,
            "committed_pct": pct(i.committed_log_pages as u64, g.log_pages as u64),
        },
        "domains": i.domains.iter().map(|d| serde_json::json!({
            "domain": d.domain,
            "transactions": d.transactions,
            "log_pages": d.log_pages,
        })).collect::<Vec<_>>(),
        "cache": {
            "pages": c.pages,
            "mapped": c.mapped,
            "dirty": c.dirty,
            "valid_bytes": c.valid_bytes,
            "dirty_pct": c.dirty_ratio * 100.0,
        },
        "live": i.live.as_ref().map(live_json),
    })
}

fn print_info(i: &InstanceInfo) {
    let g = &i.geometry;
    let ps = g.page_size as u64;
    println!("instance   {}", i.dir.display());
    println!("state      {}", state_text(i.state));
    println!("format     version {}", g.format_version);
    println!("page size  {} B", g.page_size);
    println!(
        "log        {} pages ({})",
        g.log_pages,
        human_bytes(ps * g.log_pages as u64)
    );
    println!(
        "cache      {} pages ({})",
        g.cache_pages,
        human_bytes(ps * g.cache_pages as u64)
    );
    println!(
        "tables     {} file records, {} log objects, {} log domains",
        g.max_files, g.log_objects, g.max_domains
    );
    for (n, (name, path, bytes)) in pools(i).iter().enumerate() {
        println!(
            "{:<10} {name:<10} {:>10}  {}",
            if n == 0 { "pools" } else { "" },
            human_bytes(*bytes),
            path.display()
        );
    }
    if i.files.is_empty() {
        println!("files      none");
        return;
    }
    println!("files      {} of {}", i.files.len(), g.max_files);
    println!("  {:>5}  {:<7}  {:>10}  path", "id", "mode", "size");
    for f in &i.files {
        println!(
            "  {:>5}  {:<7}  {:>10}  {}{}{}",
            f.id,
            mode_key(f.mode),
            human_bytes(f.size),
            f.path.display(),
            if f.relative {
                " (inside the instance)"
            } else {
                ""
            },
            if f.checksum_table.is_some() {
                " [checksummed]"
            } else {
                ""
            }
        );
    }
}

fn print_stats(i: &InstanceInfo) {
    let g = &i.geometry;
    let c = &i.cache;
    println!("instance     {}", i.dir.display());
    println!("state        {}", state_text(i.state));
    println!(
        "log          {} of {} pages in committed lists ({:.1} %), {} transactions not yet applied",
        i.committed_log_pages,
        g.log_pages,
        pct(i.committed_log_pages as u64, g.log_pages as u64),
        i.committed_transactions
    );
    for d in &i.domains {
        println!(
            "  domain {:<4} {} transactions, {} log pages",
            d.domain, d.transactions, d.log_pages
        );
    }
    println!(
        "cache        {} pages: {} mapped, {} dirty, {} valid",
        c.pages,
        c.mapped,
        c.dirty,
        human_bytes(c.valid_bytes)
    );
    println!("dirty ratio  {:.1} %", c.dirty_ratio * 100.0);
    let Some(l) = &i.live else {
        println!("workers      no live users (counters are kept per running process)");
        return;
    };
    println!(
        "live         {} users, {} free log pages, {} free cache pages",
        l.users, l.free_log_pages, l.free_cache_pages
    );
    println!(
        "  {:>5} {:>8} {:>10} {:>10} {:>12} {:>10} {:>8} {:>9} {:>10}",
        "app",
        "pid",
        "commits",
        "applied",
        "written back",
        "age aborts",
        "flushes",
        "log held",
        "cache held"
    );
    for a in &l.apps {
        println!(
            "  {:>5} {:>8} {:>10} {:>10} {:>12} {:>10} {:>8} {:>9} {:>10}",
            a.app_id,
            a.pid,
            a.commits,
            a.applied,
            a.pages_written_back,
            a.age_aborts,
            a.flushes,
            a.log_pages_held,
            a.cache_pages_held
        );
    }
}
