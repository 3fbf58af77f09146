//! `tiermem snapshot info|verify|rm`: snapshot files written by `tiermem-snapshot`.
//!
//! All three open the file with the checked reader first (`SnapshotFile::open`: header,
//! trailer and index); `verify` also reads every unit and the application state against
//! their CRCs. A corrupt file is reported with the check it failed and exit status 1.

use anyhow::{bail, Result};
use clap::Subcommand;
use serde_json::json;
use std::path::{Path, PathBuf};
use tiermem_snapshot::SnapshotFile;

/// snapshot subcommands.
#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Describe a snapshot file: method, uuid, creation time, regions, units, stored pages,
    /// application-state and file sizes (header, trailer and index checked).
    Info {
        /// The snapshot file.
        path: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check a snapshot file completely: header, trailer, index and every unit's and the
    /// application state's CRC. Exit status 0 when intact, 1 with the failed check otherwise.
    Verify {
        /// The snapshot file.
        path: PathBuf,
        /// Print one JSON object (`ok`, `error`).
        #[arg(long)]
        json: bool,
    },
    /// Remove a snapshot file (refuses a file that is not a snapshot unless --force).
    Rm {
        /// The snapshot file.
        path: PathBuf,
        /// Remove it even when it is not a valid snapshot.
        #[arg(long)]
        force: bool,
    },
}

/// Run one snapshot subcommand.
pub fn run(cmd: SnapshotCommand) -> Result<()> {
    match cmd {
        SnapshotCommand::Info { path, json } => info(&path, json),
        SnapshotCommand::Verify { path, json } => verify(&path, json),
        SnapshotCommand::Rm { path, force } => rm(&path, force),
    }
}

fn info(path: &Path, as_json: bool) -> Result<()> {
    let f = SnapshotFile::open(path)?;
    let i = f.info();
    if as_json {
        let v = json!({
            "path": i.path.display().to_string(),
            "method": i.method.name(),
            "target": i.target.name(),
            "uuid": i.uuid,
            "created_ns": i.created_ns,
            "regions": i.regions.iter().map(|r| json!({"name": r.name, "bytes": r.len})).collect::<Vec<_>>(),
            "units": i.units,
            "present_pages": i.present_pages,
            "app_state_bytes": i.app_len,
            "file_bytes": i.file_len,
            "format_version": i.version,
            "spill_bytes": i.spill_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{}", i.path.display());
    println!("  method        {}", i.method.name());
    println!("  target        {}", i.target.name());
    println!("  uuid          {}", i.uuid);
    println!("  created       {} ns since the epoch", i.created_ns);
    for r in &i.regions {
        println!("  region        {:?}: {} bytes", r.name, r.len);
    }
    println!(
        "  units         {} of 256 KiB; {} pages stored ({} bytes)",
        i.units,
        i.present_pages,
        i.present_pages * 4096
    );
    println!("  app state     {} bytes", i.app_len);
    println!(
        "  file          {} bytes (format {}; spill area {} bytes: pages written before their unit)",
        i.file_len, i.version, i.spill_bytes
    );
    Ok(())
}

fn verify(path: &Path, as_json: bool) -> Result<()> {
    let r = SnapshotFile::open(path).and_then(|f| f.verify());
    if as_json {
        println!(
            "{}",
            json!({"path": path.display().to_string(), "ok": r.is_ok(),
                   "error": r.as_ref().err().map(|e| e.to_string())})
        );
    } else if r.is_ok() {
        println!("{}: intact", path.display());
    }
    if let Err(e) = r {
        if as_json {
            std::process::exit(1);
        }
        bail!("{e}");
    }
    Ok(())
}

fn rm(path: &Path, force: bool) -> Result<()> {
    if !force {
        SnapshotFile::open(path)?;
    }
    std::fs::remove_file(path).map_err(|e| anyhow::anyhow!("removing {}: {e}", path.display()))?;
    println!("removed {}", path.display());
    Ok(())
}
