//! `tiermem vnvm recover DIR`: recovery of a vnvm instance after an unclean shutdown (thesis
//! §2.4.6): dirty NVM cache pages are written back first, then the committed logs are replayed in
//! order, the files synced and the instance reset. Idempotent; a damaged instance is reported with
//! the location of the damage and nothing is written.

use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;

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
}

/// Run a vnvm subcommand.
pub fn run(cmd: VnvmCommand) -> Result<()> {
    match cmd {
        VnvmCommand::Recover { dir, json } => {
            let dir = dir.unwrap_or_else(|| tiermem_media::default_dir().join("vnvm"));
            let r = tiermem_vnvm::recover(&dir)
                .with_context(|| format!("recovering the vnvm instance in {}", dir.display()))?;
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
    }
}
