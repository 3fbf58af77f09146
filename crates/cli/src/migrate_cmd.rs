//! `tiermem migrate run|inspect|rm`.
//!
//! `run`: migrate a running synthetic application (a region it keeps updating) between two
//! hosts (network namespaces created for the run, sharing a FAM directory) by one method, and
//! print the metrics (what `tiermem bench migrate` does for every method at once).
//!
//! `inspect|rm FAM_DIR`: the migrations (`mig-<id>/`) of a FAM directory.
//!
//! `inspect`: read-only: each migration's checkpoint (validity, blob length, region lengths)
//! and lazy-page files (region length, watermark, completion flag, journal ranges); a corrupt,
//! truncated or missing file is reported with its error, and the command then fails.
//!
//! `rm`: remove one migration's directory; an incomplete migration (a target may still need
//! its source's pages) only with `--force`.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use tiermem_media::{DelayModel, Pool};
use tiermem_migrate::checkpoint::Checkpoint;
use tiermem_migrate::fam::migration_dir;
use tiermem_migrate::lazyfile::LazyFile;

/// migrate subcommands.
#[derive(Subcommand)]
pub enum MigrateCommand {
    /// Migrate a running synthetic application between two hosts (network namespaces joined
    /// by a veth pair, sharing a FAM directory) by one method; print downtime, busy time,
    /// total time, degradation and page counts. Every byte is checked at the target.
    Run {
        /// The application's updates: sequential, uniform or zipfian.
        #[arg(long, default_value = "uniform")]
        workload: String,
        /// Region size (e.g. 256m, 1g).
        #[arg(long, default_value = "256m")]
        size: String,
        /// fam, socket, stop-and-copy or pre-copy.
        #[arg(long, default_value = "fam")]
        method: String,
        /// Delay model of the medium: none or pcm-fam (default) on FAM; veth or ethernet-10g
        /// (default) for socket. (The global --delay sets devices' models; this one is the
        /// migration's.)
        #[arg(long)]
        delay_model: Option<String>,
        /// Socket post-copy's expiration timer, ms.
        #[arg(long, default_value_t = 100)]
        expiration_ms: u64,
        /// The FAM directory (default: a fresh one under /dev/shm, removed afterwards).
        #[arg(long)]
        fam: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List the migrations in a FAM directory: checkpoint, lazy-page files, completion
    /// (read-only). Fails when a file is corrupt, truncated or missing.
    #[command(after_help = INSPECT_JSON_KEYS)]
    Inspect {
        /// The FAM directory shared by the source and the target.
        fam_dir: PathBuf,
        /// Only this migration (its id in hex, as in `mig-<id>`).
        #[arg(long, value_name = "HEX", value_parser = parse_id)]
        id: Option<u64>,
        /// Print one JSON object (keys below).
        #[arg(long)]
        json: bool,
    },
    /// Remove a migration's directory (`mig-<id>`); refuses an incomplete one without --force.
    Rm {
        /// The FAM directory shared by the source and the target.
        fam_dir: PathBuf,
        /// The migration id in hex, as in `mig-<id>`.
        #[arg(long, value_name = "HEX", value_parser = parse_id)]
        id: u64,
        /// Remove it even when the dump is incomplete or a file is corrupt.
        #[arg(long)]
        force: bool,
    },
}

/// The keys of `migrate inspect --json` (stable).
const INSPECT_JSON_KEYS: &str = "\
JSON keys (--json):
  fam_dir              the FAM directory
  migrations           [{id (hex), dir, complete, errors, checkpoint, regions}] by id
    checkpoint         {ok, blob_len, regions (count)} or {ok: false, error}
    regions            [{index, file, ok, length, watermark, complete, journal_ranges}]
                       or [{index, file, ok: false, error}]";

/// Parse a migration id: hex digits, with or without `0x`.
fn parse_id(s: &str) -> std::result::Result<u64, String> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16)
        .map_err(|e| format!("{s:?} is not a hex migration id (1 to 16 hex digits): {e}"))
}

/// Run a migrate subcommand.
pub fn run(cmd: MigrateCommand) -> Result<()> {
    match cmd {
        MigrateCommand::Run {
            workload,
            size,
            method,
            delay_model,
            expiration_ms,
            fam,
            json,
        } => run_one(
            &workload,
            &size,
            &method,
            delay_model,
            expiration_ms,
            fam,
            json,
        ),
        MigrateCommand::Inspect { fam_dir, id, json } => inspect(&fam_dir, id, json),
        MigrateCommand::Rm { fam_dir, id, force } => rm(&fam_dir, id, force),
    }
}

/// One region's lazy-page file as read now.
struct RegionView {
    index: usize,
    file: PathBuf,
    state: std::result::Result<LazyState, String>,
}

struct LazyState {
    length: u64,
    watermark: u64,
    complete: bool,
    journal_ranges: usize,
}

/// One migration as read now.
struct MigrationView {
    id: u64,
    dir: PathBuf,
    /// `(blob length, region lengths)`, or the error.
    checkpoint: std::result::Result<(usize, Vec<u64>), String>,
    regions: Vec<RegionView>,
}

impl MigrationView {
    fn errors(&self) -> usize {
        usize::from(self.checkpoint.is_err())
            + self.regions.iter().filter(|r| r.state.is_err()).count()
    }
    /// Every file valid and every region dumped and persisted.
    fn complete(&self) -> bool {
        self.errors() == 0
            && !self.regions.is_empty()
            && self
                .regions
                .iter()
                .all(|r| r.state.as_ref().is_ok_and(|s| s.complete))
    }
}

/// The index `n` of a file named `region-<n>.lazy`.
fn lazy_index(name: &str) -> Option<usize> {
    name.strip_prefix("region-")?
        .strip_suffix(".lazy")?
        .parse()
        .ok()
}

/// The id of a directory named `mig-<hex>`.
fn migration_id(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("mig-")?;
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Read migration `id` in `dir`: the checkpoint, then every lazy file the checkpoint names or
/// the directory holds (a missing one is an error).
fn read_migration(id: u64, dir: &Path) -> Result<MigrationView> {
    let checkpoint = Checkpoint::read(&dir.join("checkpoint"))
        .map(|c| (c.blob.len(), c.region_lens))
        .map_err(|e| e.to_string());
    let mut indexes: Vec<usize> = match &checkpoint {
        Ok((_, lens)) => (0..lens.len()).collect(),
        Err(_) => Vec::new(),
    };
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        if let Some(i) = e.file_name().to_str().and_then(lazy_index) {
            if !indexes.contains(&i) {
                indexes.push(i);
            }
        }
    }
    indexes.sort_unstable();
    let regions = indexes
        .into_iter()
        .map(|index| {
            let file = dir.join(format!("region-{index}.lazy"));
            let expected = checkpoint.as_ref().ok().map(|(_, l)| l.get(index).copied());
            let state = if !file.exists() {
                Err(format!(
                    "{} is missing (the checkpoint names region {index})",
                    file.display()
                ))
            } else {
                match LazyFile::open(&file, DelayModel::NONE) {
                    Err(e) => Err(e.to_string()),
                    Ok(f) => match expected {
                        Some(None) => Err(format!(
                            "{} is not named by the checkpoint, which has {} region(s)",
                            file.display(),
                            checkpoint.as_ref().map_or(0, |c| c.1.len())
                        )),
                        Some(Some(len)) if len != f.region_len() => Err(format!(
                            "{} holds {} bytes but the checkpoint says {len}",
                            file.display(),
                            f.region_len()
                        )),
                        _ => Ok(LazyState {
                            length: f.region_len(),
                            watermark: if f.is_complete() {
                                f.region_len()
                            } else {
                                f.watermark()
                            },
                            complete: f.is_complete(),
                            journal_ranges: f.journal().len(),
                        }),
                    },
                }
            };
            RegionView { index, file, state }
        })
        .collect();
    Ok(MigrationView {
        id,
        dir: dir.to_path_buf(),
        checkpoint,
        regions,
    })
}

/// The migrations of `fam` (only `only` when given), by id.
fn list_migrations(fam: &Path, only: Option<u64>) -> Result<Vec<MigrationView>> {
    if let Some(id) = only {
        let dir = migration_dir(fam, id);
        if !dir.is_dir() {
            bail!(
                "no migration {id:016x} in {} ({} does not exist)",
                fam.display(),
                dir.display()
            );
        }
        return Ok(vec![read_migration(id, &dir)?]);
    }
    let mut ids = Vec::new();
    for e in std::fs::read_dir(fam).with_context(|| format!("listing {}", fam.display()))? {
        let e = e.with_context(|| format!("listing {}", fam.display()))?;
        if let Some(id) = e.file_name().to_str().and_then(migration_id) {
            if e.path().is_dir() {
                ids.push((id, e.path()));
            }
        }
    }
    ids.sort();
    ids.into_iter()
        .map(|(id, dir)| read_migration(id, &dir))
        .collect()
}

fn inspect(fam: &Path, only: Option<u64>, json: bool) -> Result<()> {
    let migs = list_migrations(fam, only)?;
    if json {
        let v = serde_json::json!({
            "fam_dir": fam.display().to_string(),
            "migrations": migs.iter().map(|m| serde_json::json!({
                "id": format!("{:016x}", m.id),
                "dir": m.dir.display().to_string(),
                "complete": m.complete(),
                "errors": m.errors(),
                "checkpoint": match &m.checkpoint {
                    Ok((blob, lens)) => serde_json::json!({
                        "ok": true, "blob_len": blob, "regions": lens.len()
                    }),
                    Err(e) => serde_json::json!({"ok": false, "error": e}),
                },
                "regions": m.regions.iter().map(|r| match &r.state {
                    Ok(s) => serde_json::json!({
                        "index": r.index,
                        "file": r.file.display().to_string(),
                        "ok": true,
                        "length": s.length,
                        "watermark": s.watermark,
                        "complete": s.complete,
                        "journal_ranges": s.journal_ranges,
                    }),
                    Err(e) => serde_json::json!({
                        "index": r.index,
                        "file": r.file.display().to_string(),
                        "ok": false,
                        "error": e,
                    }),
                }).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if migs.is_empty() {
        println!("no migrations in {}", fam.display());
    } else {
        for m in &migs {
            let state = if m.errors() > 0 {
                "CORRUPT"
            } else if m.complete() {
                "complete"
            } else {
                "incomplete"
            };
            println!("migration {:016x}  {state}  ({})", m.id, m.dir.display());
            match &m.checkpoint {
                Ok((blob, lens)) => println!(
                    "  checkpoint  ok, blob {blob} bytes, {} region(s)",
                    lens.len()
                ),
                Err(e) => println!("  checkpoint  ERROR: {e}"),
            }
            for r in &m.regions {
                match &r.state {
                    Ok(s) => println!(
                        "  region {}    {} bytes, watermark {} ({:.1}%), {}, {} journal range(s)",
                        r.index,
                        s.length,
                        s.watermark,
                        100.0 * s.watermark as f64 / s.length.max(1) as f64,
                        if s.complete { "complete" } else { "incomplete" },
                        s.journal_ranges
                    ),
                    Err(e) => println!("  region {}    ERROR: {e}", r.index),
                }
            }
        }
    }
    let bad: usize = migs.iter().map(MigrationView::errors).sum();
    if bad > 0 {
        bail!(
            "{bad} corrupt, truncated or missing file(s) in {} (see above)",
            fam.display()
        );
    }
    Ok(())
}

fn rm(fam: &Path, id: u64, force: bool) -> Result<()> {
    let dir = migration_dir(fam, id);
    if !dir.is_dir() {
        bail!(
            "no migration {id:016x} in {} ({} does not exist)",
            fam.display(),
            dir.display()
        );
    }
    // Only remove what a migration writes: anything else in the directory stops us.
    let mut files = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let name = e.file_name();
        let ours = name
            .to_str()
            .is_some_and(|n| n == "checkpoint" || lazy_index(n).is_some());
        if !ours || !e.file_type().is_ok_and(|t| t.is_file()) {
            bail!(
                "{} is not a migration file; refusing to remove {} (remove it by hand)",
                e.path().display(),
                dir.display()
            );
        }
        files.push(e.path());
    }
    let m = read_migration(id, &dir)?;
    if !m.complete() && !force {
        let why = if m.errors() > 0 {
            format!("{} file(s) are corrupt, truncated or missing", m.errors())
        } else {
            "its dump has not finished and a target may still need the source's pages".to_string()
        };
        bail!(
            "migration {id:016x} in {} is not complete: {why}; pass --force to remove it anyway",
            fam.display()
        );
    }
    for f in &files {
        match Pool::remove(f) {
            Ok(()) => {}
            // A damaged file that is not a pool any more: --force removes it all the same.
            Err(_) if force => {
                std::fs::remove_file(f).with_context(|| format!("removing {}", f.display()))?
            }
            Err(e) => return Err(e).with_context(|| format!("removing {}", f.display())),
        }
    }
    std::fs::remove_dir(&dir).with_context(|| format!("removing {}", dir.display()))?;
    println!("removed migration {id:016x} ({})", dir.display());
    Ok(())
}

/// `tiermem migrate run`.
fn run_one(
    workload: &str,
    size: &str,
    method: &str,
    delay: Option<String>,
    expiration_ms: u64,
    fam: Option<PathBuf>,
    json: bool,
) -> Result<()> {
    use tiermem_migrate::harness::{run_case, CaseSpec, Method};
    use tiermem_migrate::workload::Workload;
    let w = Workload::parse(workload)
        .with_context(|| format!("unknown workload {workload:?} (sequential, uniform, zipfian)"))?;
    let region_len = crate::bench::migrate::parse_size(size)?;
    let delay = delay.unwrap_or_else(|| {
        if method == "socket" {
            "ethernet-10g".into()
        } else {
            "pcm-fam".into()
        }
    });
    let m = Method::parse(method, &delay, expiration_ms).map_err(anyhow::Error::msg)?;
    let own = fam.is_none();
    let fam = fam.unwrap_or_else(|| {
        PathBuf::from(format!(
            "/dev/shm/tiermem-migrate-run-{}",
            std::process::id()
        ))
    });
    std::fs::create_dir_all(&fam).with_context(|| format!("creating {}", fam.display()))?;
    let hosts = tiermem_migrate::netns::TwoHosts::create("tmrun")
        .context("creating the two hosts (network namespaces; needs root and iproute2)")?;
    let id = (std::process::id() as u64) << 20 | 1;
    let _progress = tiermem_bench::progress::show("migrate run");
    tiermem_bench::progress::step(&format!(
        "migrating a {} MiB region under {} updates by {} between {} and {} (FAM {})",
        region_len >> 20,
        w.name(),
        m.label(),
        hosts.name(tiermem_migrate::netns::Host::Src),
        hosts.name(tiermem_migrate::netns::Host::Dst),
        fam.display()
    ));
    let spec = CaseSpec {
        workload: w,
        region_len,
        method: m.clone(),
        steady: std::time::Duration::from_millis(300),
        tail: std::time::Duration::from_millis(50),
        seed: id,
        id,
    };
    let r = run_case(&hosts, &fam, &spec);
    let _ = std::fs::remove_dir_all(migration_dir(&fam, id));
    if own {
        let _ = std::fs::remove_dir_all(&fam);
    }
    let r = r.map_err(anyhow::Error::msg)?;
    let x = &r.metrics;
    let ms = |ns: u64| ns as f64 / 1e6;
    if json {
        let v = serde_json::json!({
            "workload": w.name(),
            "region_bytes": region_len,
            "method": m.name(),
            "delay": m.delay(),
            "expiration_ms": m.expiration_ms(),
            "downtime_ms": ms(x.downtime_ns),
            "resume_ms": ms(x.resume_ns),
            "busy_ms": ms(x.busy_ns),
            "total_ms": ms(x.total_ns),
            "reserve_ms": ms(x.reserve_ns),
            "degradation": r.degradation,
            "steady_ops_per_s": r.steady_ops_per_s,
            "during_ops_per_s": r.during_ops_per_s,
            "faults_on_demand": x.pages_on_demand,
            "faults_from_fam": x.faults_from_fam,
            "pages_pushed": x.pages_pushed,
            "bytes": x.bytes,
            "verified": r.verified,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{} {} MiB {}: downtime {:.2} ms, busy {:.1} ms, total {:.1} ms (resume {:.1} ms); \
             degradation {:.3} ({:.0} ops/s during, {:.0} steady); faults on demand {}, from \
             FAM {}, pages pushed {}; every byte verified at the target",
            w.name(),
            region_len >> 20,
            m.label(),
            ms(x.downtime_ns),
            ms(x.busy_ns),
            ms(x.total_ns),
            ms(x.resume_ns),
            r.degradation,
            r.during_ops_per_s,
            r.steady_ops_per_s,
            x.pages_on_demand,
            x.faults_from_fam,
            x.pages_pushed
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_parse() {
        assert_eq!(parse_id("5eed"), Ok(0x5eed));
        assert_eq!(parse_id("0x5EED"), Ok(0x5eed));
        assert!(parse_id("xyz").is_err());
        assert!(parse_id("1ffffffffffffffff").is_err());
        assert_eq!(migration_id("mig-0000000000005eed"), Some(0x5eed));
        assert_eq!(migration_id("mig-"), None);
        assert_eq!(migration_id("mig-zz"), None);
        assert_eq!(migration_id("pool"), None);
        assert_eq!(lazy_index("region-12.lazy"), Some(12));
        assert_eq!(lazy_index("region-x.lazy"), None);
        assert_eq!(lazy_index("checkpoint"), None);
    }
}
