//! `tiermem iocache stat|drop FILE`: what of a file the page cache holds (`cachestat(2)`: cached,
//! dirty, under write-back, evicted and recently evicted pages), and dropping it from there
//! (dirty pages written first, then `POSIX_FADV_DONTNEED`) — the two views a user of the DBIO
//! buffer pool needs of its data file. `tiermem iocache run`: a command (e.g. the `sqlite3`
//! shell loading the `tiermem` VFS) inside a v1 memory cgroup holding it to the budget, with
//! the pool settings in its environment.

use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
use serde_json::json;
use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use tiermem_bench::snapshot::Cgroup;
use tiermem_iocache::sys;

/// The VFS extension's file name (crates/iocache-vfs), looked for next to this executable.
const VFS_LIB: &str = "libtiermem_iocache_vfs.so";

/// Pool modes for `run`.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Reads and writes through the page cache.
    Buffered,
    /// O_DIRECT.
    Direct,
    /// The page cache as the pool's victim cache.
    Dbio,
}

impl ModeArg {
    fn name(self) -> &'static str {
        match self {
            ModeArg::Buffered => "buffered",
            ModeArg::Direct => "direct",
            ModeArg::Dbio => "dbio",
        }
    }
}

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
    /// Run CMD in a temporary v1 memory cgroup limited to the budget (page cache included),
    /// with TIERMEM_IOCACHE_MODE/POOL/BUDGET set (and TIERMEM_IOCACHE_ENFORCE=0: the cgroup
    /// keeps the budget) and TIERMEM_IOCACHE_VFS naming libtiermem_iocache_vfs.so when it is
    /// next to this binary, e.g.
    /// `tiermem iocache run --pool 8M -- sqlite3 :memory: ".load $TIERMEM_IOCACHE_VFS" ...`
    /// (through `sh -c`). Prints the group's peak memory and OOM kills to stderr; the exit
    /// status is CMD's (128 + N when a signal N ended it). The group is removed when CMD exits.
    Run {
        /// Pool mode.
        #[arg(long, value_enum, default_value = "dbio")]
        mode: ModeArg,
        /// Memory budget of the command: the cgroup's limit and the pool's budget (e.g. 64M).
        #[arg(long, default_value = "64M")]
        budget: String,
        /// Pool size (e.g. 16M; default a quarter of the budget).
        #[arg(long)]
        pool: Option<String>,
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

/// Run one iocache subcommand.
pub fn run(cmd: IocacheCommand) -> Result<()> {
    match cmd {
        IocacheCommand::Stat { path, json } => stat(&path, json),
        IocacheCommand::Drop { path } => drop_cache(&path),
        IocacheCommand::Run {
            mode,
            budget,
            pool,
            cmd,
        } => {
            let code = run_cmd(mode, &budget, pool.as_deref(), &cmd)?;
            std::process::exit(code)
        }
    }
}

/// The child's pid while it runs (0: none), for the signal forwarder.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A signal that arrived before the child's pid was known (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; the pid is our own child's.
        unsafe { libc::kill(pid, sig) };
    } else {
        PENDING.store(sig, Ordering::SeqCst);
    }
}

const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Installs [`forward`] for [`FORWARDED`] (this process then outlives such a signal and
/// cleans up after the child instead).
fn install_forwarders() {
    for sig in FORWARDED {
        // SAFETY: a handler that only calls async-signal-safe functions and touches atomics.
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
}

/// `run`: returns CMD's exit status (after the cgroup is gone).
fn run_cmd(mode: ModeArg, budget: &str, pool: Option<&str>, cmd: &[OsString]) -> Result<i32> {
    let budget_b = crate::pool_cmd::parse_size(budget).context("--budget")?;
    let pool_b = match pool {
        Some(p) => crate::pool_cmd::parse_size(p).context("--pool")?,
        None => budget_b / 4,
    };
    if pool_b < 8192 {
        bail!("--pool {pool_b}: at least two 4 KiB pages");
    }
    if pool_b > budget_b {
        bail!("--pool ({pool_b} bytes) is larger than --budget ({budget_b} bytes)");
    }
    let cg = Cgroup::create(&format!("tiermem-iocache-run-{}", std::process::id()))
        .context("tiermem iocache run needs a cgroup v1 memory controller")?;
    cg.set_limit(budget_b)?;
    let mut c = std::process::Command::new(&cmd[0]);
    c.args(&cmd[1..])
        .env("TIERMEM_IOCACHE_MODE", mode.name())
        .env("TIERMEM_IOCACHE_POOL", pool_b.to_string())
        .env("TIERMEM_IOCACHE_BUDGET", budget_b.to_string())
        .env("TIERMEM_IOCACHE_ENFORCE", "0");
    if let Some(lib) = std::env::current_exe()
        .ok()
        .map(|e| e.with_file_name(VFS_LIB))
        .filter(|p| p.exists())
    {
        c.env("TIERMEM_IOCACHE_VFS", lib);
    }
    cg.enter_at_exec(&mut c);
    // (exec resets caught signals to their defaults: CMD does not inherit the forwarder.)
    install_forwarders();
    let status = match c.spawn() {
        Ok(mut child) => {
            CHILD.store(child.id() as i32, Ordering::SeqCst);
            let pending = PENDING.swap(0, Ordering::SeqCst);
            if pending != 0 {
                // SAFETY: our own child's pid.
                unsafe { libc::kill(child.id() as i32, pending) };
            }
            let st = child.wait();
            CHILD.store(0, Ordering::SeqCst);
            st.context("waiting for the command")?
        }
        Err(e) => {
            drop(cg);
            eprintln!(
                "tiermem: error: cannot run {}: {e}",
                cmd[0].to_string_lossy()
            );
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let peak = cg.max_usage().unwrap_or(0);
    let ooms = cg.oom_kills();
    drop(cg);
    eprintln!(
        "tiermem iocache run: mode {}, pool {:.1} MiB, budget {:.1} MiB: max_usage {:.1} MiB, \
         oom kills {ooms}",
        mode.name(),
        pool_b as f64 / 1048576.0,
        budget_b as f64 / 1048576.0,
        peak as f64 / 1048576.0
    );
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    })
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
