//! `tiermem iocache stat|drop FILE`: what of a file the page cache holds (`cachestat(2)`: cached,
//! dirty, under write-back, evicted and recently evicted pages), and dropping it from there
//! (dirty pages written first, then `POSIX_FADV_DONTNEED`) — the two views a user of the DBIO
//! buffer pool needs of its data file.

use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::json;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use tiermem_iocache::sys;

/// iocache subcommands.
#[derive(Subcommand)]
pub enum IocacheCommand {
    /// The file's pages in the page cache (cached, dirty, write-back, evicted, recently
    /// evicted) out of its length.
    Stat {
        /// The file.
        path: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Drop the file from the page cache (dirty pages are written first); prints the cached
    /// pages before and after.
    Drop {
        /// The file.
        path: PathBuf,
    },
}

/// Run one iocache subcommand.
pub fn run(cmd: IocacheCommand) -> Result<()> {
    match cmd {
        IocacheCommand::Stat { path, json } => stat(&path, json),
        IocacheCommand::Drop { path } => drop_cache(&path),
    }
}

fn open(path: &Path) -> Result<std::fs::File> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let m = f
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?;
    anyhow::ensure!(m.is_file(), "{}: not a regular file", path.display());
    Ok(f)
}

fn stat(path: &Path, as_json: bool) -> Result<()> {
    let f = open(path)?;
    let len = f.metadata()?.len();
    let s = sys::cachestat(f.as_raw_fd(), 0, 0)
        .with_context(|| format!("cachestat of {} (Linux 6.5 or later)", path.display()))?;
    let pages = len.div_ceil(4096);
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "path": path,
                "bytes": len,
                "pages": pages,
                "cached": s.nr_cache,
                "dirty": s.nr_dirty,
                "writeback": s.nr_writeback,
                "evicted": s.nr_evicted,
                "recently_evicted": s.nr_recently_evicted,
            }))?
        );
    } else {
        let pct = 100.0 * s.nr_cache as f64 / pages.max(1) as f64;
        println!(
            "{}: {} of {} pages cached ({pct:.1} %), {} dirty, {} under write-back, {} evicted \
             ({} recently)",
            path.display(),
            s.nr_cache,
            pages,
            s.nr_dirty,
            s.nr_writeback,
            s.nr_evicted,
            s.nr_recently_evicted
        );
    }
    Ok(())
}

fn drop_cache(path: &Path) -> Result<()> {
    let f = open(path)?;
    let fd = f.as_raw_fd();
    let before = sys::cachestat(fd, 0, 0).context("cachestat")?.nr_cache;
    sys::write_and_wait(fd, 0, 0).context("writing dirty pages")?;
    sys::fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED).context("posix_fadvise(DONTNEED)")?;
    let after = sys::cachestat(fd, 0, 0).context("cachestat")?.nr_cache;
    println!(
        "{}: {before} pages cached before, {after} after",
        path.display()
    );
    Ok(())
}
