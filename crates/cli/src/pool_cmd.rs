//! `tiermem pool create|info|rm`: emulated NVM and FAM pools over the media layer.

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use std::path::PathBuf;
use tiermem_media::{DelayModel, OpenOptions, Pool, PoolKind, PoolOptions};

/// Pool subcommands.
#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool file (mode 0600, or 0660 with --group) and print its header.
    Create {
        /// A path, or a bare name created in $TIERMEM_DIR (default /dev/shm/tiermem).
        pool: String,
        /// Total size including the 4 KiB header: bytes or with a suffix (K, M, G, KiB, MiB, GiB).
        #[arg(long, default_value = "64MiB")]
        size: String,
        /// NVM (one process) or FAM (shared by processes and hosts).
        #[arg(long, value_enum, default_value_t = KindArg::Nvm)]
        kind: KindArg,
        /// Let the owning group open the pool too (mode 0660).
        #[arg(long)]
        group: bool,
        /// A short label stored in the header (≤ 32 bytes).
        #[arg(long, default_value = "")]
        tag: String,
    },
    /// Validate a pool and print its header, medium and persistence method.
    Info {
        pool: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove a pool (refuses files that are not tiermem pools).
    Rm { pool: String },
}

/// The pool kinds on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum KindArg {
    Nvm,
    Fam,
}

/// Resolve a pool argument: a path when it contains '/', else a name in the default directory.
pub fn resolve_pool_path(arg: &str) -> Result<PathBuf> {
    if arg.contains('/') {
        return Ok(PathBuf::from(arg));
    }
    let dir =
        tiermem_media::ensure_default_dir().context("preparing the default pool directory")?;
    Ok(dir.join(arg))
}

/// Parse a byte count (`4096`, `64M`, `64MiB`, `1G`): the media layer's one size parser.
pub fn parse_size(s: &str) -> Result<u64> {
    Ok(tiermem_media::parse_size(s)?)
}

/// Run a pool subcommand.
pub fn run(cmd: PoolCommand) -> Result<()> {
    match cmd {
        PoolCommand::Create {
            pool,
            size,
            kind,
            group,
            tag,
        } => {
            let path = resolve_pool_path(&pool)?;
            let opts = PoolOptions {
                size: parse_size(&size)?,
                kind: match kind {
                    KindArg::Nvm => PoolKind::Nvm,
                    KindArg::Fam => PoolKind::Fam,
                },
                group_shared: group,
                tag,
                ..PoolOptions::default()
            };
            let p = Pool::create(&path, &opts)?;
            print_info(&p, false)?;
            Ok(())
        }
        PoolCommand::Info { pool, json } => {
            let path = resolve_pool_path(&pool)?;
            let p = Pool::open(&path, &OpenOptions::default())?;
            print_info(&p, json)
        }
        PoolCommand::Rm { pool } => {
            let path = resolve_pool_path(&pool)?;
            Pool::remove(&path)?;
            println!("removed {}", path.display());
            Ok(())
        }
    }
}

fn print_info(p: &Pool, json: bool) -> Result<()> {
    let h = p.header();
    let delay: DelayModel = p.delay();
    if json {
        let v = serde_json::json!({
            "path": p.path().display().to_string(),
            "kind": format!("{:?}", p.kind()).to_lowercase(),
            "version": h.version,
            "pool_size": h.pool_size,
            "data_offset": h.data_offset,
            "data_size": p.data_len(),
            "uuid": uuid_hex(&p.uuid()),
            "tag": p.tag(),
            "medium": format!("{:?}", p.persist_method()),
            "delay": delay.to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("pool      {}", p.path().display());
        println!("kind      {:?}", p.kind());
        println!("version   {}", h.version);
        println!(
            "size      {} bytes ({} data bytes at offset {})",
            h.pool_size,
            p.data_len(),
            h.data_offset
        );
        println!("uuid      {}", uuid_hex(&p.uuid()));
        println!(
            "tag       {}",
            if p.tag().is_empty() { "-" } else { p.tag() }
        );
        println!("persist   {:?}", p.persist_method());
        println!("delay     {delay}");
    }
    Ok(())
}

fn uuid_hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
