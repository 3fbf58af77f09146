//! `tiermem pager calibrate`: the paging capacity of this machine's two zones (NVSwap Ch. 5),
//! which admission weighs page-in bounds against: 4 KiB random reads of the disk that would hold
//! the swap file at 1 to 16 threads, and 4 KiB copies out of an NVM pool with the `nvmm` delay.
//! The result is kept in [`CAPACITY_FILE`] for `run`.
//!
//! `tiermem pager run --budget 1G [--bound p99=300us] [--nvm 512M] -- CMD`: an unmodified
//! program under `libtiermem_pager_preload.so` (crates/pager-preload). This file checks the
//! options (the pager's own checks, the swap directory, admission of the bound against the
//! calibrated capacity), turns them into the library's `TIERMEM_PAGER_*` variables and `exec`s
//! the command.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The library's file name.
const PRELOAD: &str = "libtiermem_pager_preload.so";

/// Where `calibrate` keeps its result for `run`'s admission check, per swap directory device.
const CAPACITY_FILE: &str = "/var/tmp/tiermem-pager-capacity.json";

/// pager subcommands.
#[derive(Subcommand, Debug)]
pub enum PagerCommand {
    /// Measure the zones' capacity (swap-file IOPS at rising concurrency, NVM buffer copies per
    /// second) and the demand of a bound (Eq. 2: 1/bound).
    Calibrate {
        /// Directory the swap file would live in (a disk; default /var/tmp).
        #[arg(long, default_value = "/var/tmp")]
        dir: PathBuf,
        /// Milliseconds at each concurrency level.
        #[arg(long, default_value_t = 500)]
        ms: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Run CMD with its large allocations (malloc-family blocks and anonymous mmaps of at
    /// least --min) in a paged arena: at most --budget of them in DRAM, the rest in the NVM
    /// paging buffer (--nvm) or a swap file in --dir. CMD's exit status is returned. A --bound
    /// is admitted against the capacity `calibrate` measured (calibrated now, briefly, if it
    /// never ran); one that does not fit is refused with the numbers, or run best effort with
    /// --best-effort.
    Run {
        /// DRAM budget of the arena (e.g. 1G; at least 256K, one latency group).
        #[arg(long)]
        budget: String,
        /// NVM paging buffer (e.g. 512M; 0: none).
        #[arg(long, default_value = "0")]
        nvm: String,
        /// Page-in bound, pNN=LATENCY (e.g. p99=300us, p95=1ms).
        #[arg(long)]
        bound: Option<String>,
        /// Run without the bound when admission refuses it (instead of failing).
        #[arg(long)]
        best_effort: bool,
        /// Arena size, virtual (default: 8 × the budget, at least 1G).
        #[arg(long)]
        arena: Option<String>,
        /// Smallest request served from the arena.
        #[arg(long, default_value = "128K")]
        min: String,
        /// Directory of the swap file (a disk, not tmpfs).
        #[arg(long, default_value = "/var/tmp")]
        dir: PathBuf,
        /// File the exit report (one JSON line per paging process) is appended to; %p: pid.
        #[arg(long)]
        stats: Option<PathBuf>,
        /// Be a tenant of the shared pager pool at this path (`tiermem pager daemon`) instead
        /// of having a buffer and swap file of its own (--nvm and --dir are then unused).
        #[arg(long)]
        pool: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<OsString>,
    },
    /// Serve a pager pool shared by processes: create it (an NVM buffer, a swap file and the
    /// control segment), run the latency controller over every tenant each window, and free
    /// the slots of tenants that died (pidfd). Runs until SIGINT/SIGTERM; then removes the pool
    /// and swap file when no tenant is left.
    Daemon {
        /// The pool file (default: pager.pool in the media directory, tmpfs).
        #[arg(long)]
        pool: Option<PathBuf>,
        /// NVM paging buffer size (e.g. 512M; 0: none).
        #[arg(long, default_value = "256M")]
        nvm: String,
        /// The swap file (on a disk).
        #[arg(long, default_value = "/var/tmp/tiermem-pager-pool.swap")]
        swap: PathBuf,
        /// Swap file size.
        #[arg(long, default_value = "4G")]
        swap_size: String,
        /// Control window (ms).
        #[arg(long, default_value_t = 1000)]
        window_ms: u64,
        /// Latency control off: a fixed queue of 128 and every page through the buffer.
        #[arg(long)]
        no_control: bool,
        /// One line per window on stderr.
        #[arg(long)]
        verbose: bool,
    },
    /// Show a pager pool: slots in use, S(t), and each tenant's bound, tail and pages.
    Status {
        /// The pool file.
        #[arg(long)]
        pool: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Set (or with `none`, clear) the page-in bound of a tenant process: PID pNN=LATENCY.
    SetBound {
        /// The tenant's process id.
        pid: u32,
        /// pNN=LATENCY (e.g. p99=300us), or `none` for best effort.
        bound: String,
        /// The pool file.
        #[arg(long)]
        pool: Option<PathBuf>,
        /// Set it even when admission (Eq. 2 against `calibrate`'s capacity) refuses it.
        #[arg(long)]
        force: bool,
    },
    /// Free the slots and entries of tenants that died (what the daemon does each window).
    Gc {
        /// The pool file.
        #[arg(long)]
        pool: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

fn pool_path(p: Option<PathBuf>) -> PathBuf {
    p.unwrap_or_else(tiermem_pager::default_pool_path)
}

/// Set by SIGINT/SIGTERM: the daemon stops after its window.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// `tiermem pager daemon`: see [`PagerCommand::Daemon`].
fn daemon(pool: PathBuf, spec: tiermem_pager::PoolSpec, verbose: bool) -> Result<()> {
    use std::sync::atomic::Ordering;
    let p = if pool.exists() {
        // A pool left by a daemon that died: serve it again if its tenants still use it.
        let p = tiermem_pager::PagerPool::open(&pool)
            .with_context(|| format!("{} exists and cannot be served again", pool.display()))?;
        eprintln!(
            "tiermem pager daemon: serving the existing pool {} (swap file {})",
            pool.display(),
            p.swap_path().display()
        );
        p
    } else {
        if let Some(d) = pool.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        tiermem_pager::PagerPool::create(&pool, &spec)?
    };
    p.claim_daemon()?;
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
    }
    let st = p.status();
    println!(
        "tiermem pager daemon: pid {}, pool {}, buffer {} slots, swap {} slots ({}), window {} ms",
        std::process::id(),
        pool.display(),
        st.buffer_slots,
        st.swap_slots,
        st.swap_path.display(),
        p.control().window.as_millis()
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut ctl = tiermem_pager::PoolController::new(&p);
    let window = p.control().window;
    let mut pidfds: std::collections::HashMap<u32, std::os::fd::OwnedFd> = Default::default();
    while !STOP.load(Ordering::Relaxed) {
        // Wait out the window, woken early by a tenant's exit (its pidfd turns readable).
        let live: Vec<u32> = p.status().tenants.iter().map(|t| t.pid).collect();
        pidfds.retain(|pid, _| live.contains(pid));
        for pid in live {
            if let std::collections::hash_map::Entry::Vacant(e) = pidfds.entry(pid) {
                // SAFETY: plain syscall; the returned fd is checked.
                let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
                if fd >= 0 {
                    // SAFETY: a fresh fd we own.
                    e.insert(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
                }
            }
        }
        let mut fds: Vec<libc::pollfd> = pidfds
            .values()
            .map(|fd| libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(fd),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of pollfds.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                window.as_millis().min(60_000) as i32,
            )
        };
        let g = p.gc();
        if g.tenants > 0 {
            eprintln!(
                "tiermem pager daemon: {} dead tenant(s): {} buffer and {} swap slots freed",
                g.tenants, g.buffer_slots, g.swap_slots
            );
        }
        let w = ctl.window(&p);
        if verbose {
            eprintln!(
                "tiermem pager daemon: ssd p99 {:?} µs, queue {}, tenants (pid, bound µs, tail µs, ns) {:?}",
                w.ssd_p99_ns.map(|v| v / 1000),
                w.queue,
                w.tenants
                    .iter()
                    .map(|(pid, b, o, ns)| (pid, b / 1000, o.map(|v| v / 1000), ns))
                    .collect::<Vec<_>>()
            );
        }
    }
    p.release_daemon();
    p.gc();
    if p.live_tenants() == 0 {
        p.remove()?;
        eprintln!("tiermem pager daemon: stopped; pool and swap file removed");
    } else {
        eprintln!(
            "tiermem pager daemon: stopped; {} tenant(s) still use the pool, left in place (a              new daemon serves it again)",
            p.live_tenants()
        );
    }
    Ok(())
}

fn print_status(st: &tiermem_pager::PoolStatus) {
    println!(
        "pool {} (swap file {}), daemon {}, leader {}",
        st.path.display(),
        st.swap_path.display(),
        if st.daemon == 0 {
            "none".to_string()
        } else {
            st.daemon.to_string()
        },
        if st.leader == 0 {
            "none".to_string()
        } else {
            st.leader.to_string()
        }
    );
    println!(
        "buffer {}/{} slots, swap {}/{} slots, queue S(t) {}, {} windows, last SSD page-in p99 {} µs",
        st.buffer_used,
        st.buffer_slots,
        st.swap_used,
        st.swap_slots,
        st.queue,
        st.windows,
        st.last_ssd_p99_ns / 1000
    );
    println!(
        "{:>8} {:>5} {:>12} {:>9} {:>3} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10}",
        "pid",
        "alive",
        "bound",
        "tail µs",
        "ns",
        "budget",
        "resident",
        "buffer",
        "swap",
        "in buffer",
        "in ssd"
    );
    for t in &st.tenants {
        println!(
            "{:>8} {:>5} {:>12} {:>9} {:>3} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10}",
            t.pid,
            if t.alive { "yes" } else { "no" },
            t.bound
                .map(|(p, ns)| format!("p{}={}us", p * 100.0, ns / 1000))
                .unwrap_or_else(|| "-".into()),
            t.last_p99_ns
                .map(|v| (v / 1000).to_string())
                .unwrap_or_else(|| "-".into()),
            if t.ns { "yes" } else { "no" },
            t.budget_pages,
            t.resident_pages,
            t.buffer_pages,
            t.swap_pages,
            t.pageins_buffer,
            t.pageins_ssd
        );
    }
}

/// `pNN=LATENCY` (`p99=300us`, `p99.9=2ms`, `p95=150000ns`): the percentile as a fraction and
/// the latency in ns.
pub fn parse_bound(s: &str) -> Result<(f64, u64)> {
    let bad = || {
        anyhow::anyhow!(
            "bound {s:?}: expected pNN=LATENCY with a unit ns, us or ms (e.g. p99=300us)"
        )
    };
    let (p, lat) = s.split_once('=').ok_or_else(bad)?;
    let pct: f64 = p
        .strip_prefix('p')
        .and_then(|x| x.parse().ok())
        .ok_or_else(bad)?;
    if !(pct > 0.0 && pct < 100.0) {
        bail!("bound {s:?}: the percentile must be above 0 and below 100");
    }
    let lat = lat.trim();
    let (num, mul) = if let Some(x) = lat.strip_suffix("ns") {
        (x, 1.0)
    } else if let Some(x) = lat.strip_suffix("us").or_else(|| lat.strip_suffix("µs")) {
        (x, 1e3)
    } else if let Some(x) = lat.strip_suffix("ms") {
        (x, 1e6)
    } else {
        return Err(bad());
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let ns = v * mul;
    if !(1.0..1e15).contains(&ns) {
        bail!("bound {s:?}: the latency must be at least 1 ns");
    }
    Ok((pct / 100.0, ns as u64))
}

/// The calibrated capacity for swap files in `dir`: [`CAPACITY_FILE`] when it was measured for
/// the same device, else measured now (100 ms a level) and saved.
fn capacity_for(dir: &Path) -> Result<tiermem_pager::Capacity> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir)
        .with_context(|| format!("swap directory {}", dir.display()))?
        .dev();
    if let Ok(text) = std::fs::read_to_string(CAPACITY_FILE) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            if v["dev"].as_u64() == Some(dev) {
                if let Ok(c) = serde_json::from_value(v["capacity"].clone()) {
                    return Ok(c);
                }
            }
        }
    }
    eprintln!(
        "tiermem pager run: calibrating {} for admission (once)",
        dir.display()
    );
    let cap = tiermem_pager::calibrate(
        dir,
        tiermem_media::DelayModel::NVMM,
        Duration::from_millis(100),
    )?;
    save_capacity(dev, &cap);
    Ok(cap)
}

/// Keeps `cap` in [`CAPACITY_FILE`] (best effort: a read-only /var/tmp only costs a
/// recalibration next time).
fn save_capacity(dev: u64, cap: &tiermem_pager::Capacity) {
    let v = serde_json::json!({ "dev": dev, "capacity": cap });
    let tmp = format!("{CAPACITY_FILE}.{}", std::process::id());
    if std::fs::write(&tmp, v.to_string()).is_ok() && std::fs::rename(&tmp, CAPACITY_FILE).is_err()
    {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Run one pager subcommand.
pub fn run(cmd: PagerCommand) -> Result<()> {
    match cmd {
        PagerCommand::Calibrate { dir, ms, json } => {
            if ms == 0 {
                bail!("--ms must be at least 1");
            }
            let cap = tiermem_pager::calibrate(
                &dir,
                tiermem_media::DelayModel::NVMM,
                Duration::from_millis(ms),
            )?;
            {
                use std::os::unix::fs::MetadataExt;
                if let Ok(m) = std::fs::metadata(&dir) {
                    save_capacity(m.dev(), &cap);
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&cap)?);
            } else {
                println!("regular zone ({}): 4 KiB random reads", dir.display());
                for (t, iops) in &cap.ssd_iops_by_threads {
                    println!("  {t:>2} threads: {iops:>9.0} IOPS");
                }
                println!("  capacity: {:.0} IOPS", cap.ssd_iops);
                println!(
                    "NVM buffer (nvmm delay): {:.0} 4 KiB copies per second",
                    cap.nvm_iops
                );
                println!(
                    "together {:.0} page-ins per second; a p99 bound of B µs asks for 10^6/B \
                     (Eq. 2: 300 µs asks for 3333)",
                    cap.ssd_iops + cap.nvm_iops
                );
            }
            Ok(())
        }
        PagerCommand::Run {
            budget,
            nvm,
            bound,
            best_effort,
            arena,
            min,
            dir,
            stats,
            pool,
            cmd,
        } => {
            let size = |v: &str, what: &str| {
                crate::pool_cmd::parse_size(v).with_context(|| format!("--{what}"))
            };
            let budget_b = size(&budget, "budget")?;
            let nvm_b = size(&nvm, "nvm")?;
            let min_b = size(&min, "min")?;
            let arena_b = match &arena {
                Some(a) => size(a, "arena")?,
                None => (8 * budget_b).max(1 << 30),
            };
            let mut opts = tiermem_pager::PagerOptions::new(budget_b, nvm_b);
            let shared = match &pool {
                Some(p) => {
                    let p = std::path::absolute(p).unwrap_or(p.clone());
                    opts.pool = Some(p.clone());
                    Some(tiermem_pager::PagerPool::open(&p)?)
                }
                None => None,
            };
            opts.validate()?;
            if arena_b < budget_b {
                bail!("--arena ({arena_b} bytes) is smaller than --budget ({budget_b} bytes)");
            }
            let dir = std::path::absolute(&dir).unwrap_or(dir);
            if !dir.is_dir() {
                bail!("--dir {}: not a directory", dir.display());
            }
            if tiermem_media::on_tmpfs(&dir)? {
                bail!(
                    "--dir {} is on tmpfs: the swap file would live in the memory it pages out \
                     of (use a disk, e.g. /var/tmp)",
                    dir.display()
                );
            }
            let mut env: Vec<(&str, String)> = vec![
                ("TIERMEM_PAGER_BUDGET", budget_b.to_string()),
                ("TIERMEM_PAGER_NVM", nvm_b.to_string()),
                ("TIERMEM_PAGER_ARENA", arena_b.to_string()),
                ("TIERMEM_PAGER_MIN", min_b.to_string()),
                ("TIERMEM_PAGER_DIR", dir.display().to_string()),
            ];
            if let Some(b) = &bound {
                let (pct, ns) = parse_bound(b)?;
                let swap_dir = shared
                    .as_ref()
                    .and_then(|p| p.swap_path().parent().map(Path::to_path_buf))
                    .unwrap_or(dir.clone());
                let cap = capacity_for(&swap_dir)?;
                // In a shared pool, the bounds already admitted are the other tenants'.
                let admitted = shared.as_ref().map(|p| p.bounds_ns()).unwrap_or_default();
                match tiermem_pager::admit(&cap, &admitted, ns) {
                    Ok(()) => {
                        env.push(("TIERMEM_PAGER_BOUND_NS", ns.to_string()));
                        env.push(("TIERMEM_PAGER_BOUND_PCT", pct.to_string()));
                    }
                    Err(e) if best_effort => {
                        eprintln!("tiermem pager run: {e}; running best effort (--best-effort)")
                    }
                    Err(e) => bail!("{e} (--best-effort runs it without the bound)"),
                }
            }
            if let Some(s) = stats {
                let s = std::path::absolute(&s).unwrap_or(s);
                env.push(("TIERMEM_PAGER_STATS", s.display().to_string()));
            }
            if let Some(p) = &opts.pool {
                env.push(("TIERMEM_PAGER_POOL", p.display().to_string()));
            }
            let lib =
                crate::preload::find(PRELOAD, "TIERMEM_PAGER_PRELOAD", "tiermem-pager-preload")?;
            crate::preload::exec(&lib, &cmd, &env)
        }
        PagerCommand::Daemon {
            pool,
            nvm,
            swap,
            swap_size,
            window_ms,
            no_control,
            verbose,
        } => {
            let nvm = crate::pool_cmd::parse_size(&nvm).context("--nvm")?;
            let swap_size = crate::pool_cmd::parse_size(&swap_size).context("--swap-size")?;
            if window_ms == 0 {
                bail!("--window-ms must be at least 1");
            }
            let swap = std::path::absolute(&swap).unwrap_or(swap);
            let control = tiermem_pager::ControlParams {
                enabled: !no_control,
                window: Duration::from_millis(window_ms),
                ..Default::default()
            };
            let spec = tiermem_pager::PoolSpec {
                nvm,
                nvm_delay: tiermem_media::DelayModel::NVMM,
                swap_path: swap,
                swap_size,
                control,
            };
            daemon(pool_path(pool), spec, verbose)
        }
        PagerCommand::Status { pool, json } => {
            let p = tiermem_pager::PagerPool::open(&pool_path(pool))?;
            let st = p.status();
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print_status(&st);
            }
            Ok(())
        }
        PagerCommand::SetBound {
            pid,
            bound,
            pool,
            force,
        } => {
            let p = tiermem_pager::PagerPool::open(&pool_path(pool))?;
            let b = if bound == "none" {
                None
            } else {
                Some(parse_bound(&bound)?)
            };
            if let (Some((_, ns)), false) = (b, force) {
                let swap_dir = p.swap_path().parent().map(Path::to_path_buf);
                let cap = capacity_for(&swap_dir.unwrap_or_else(|| PathBuf::from("/var/tmp")))?;
                let others: Vec<u64> = p
                    .status()
                    .tenants
                    .iter()
                    .filter(|t| t.alive && t.pid != pid)
                    .filter_map(|t| t.bound.map(|(_, ns)| ns))
                    .collect();
                tiermem_pager::admit(&cap, &others, ns)
                    .map_err(|e| anyhow::anyhow!("{e} (--force sets it anyway)"))?;
            }
            p.set_bound(pid, b)?;
            println!(
                "tenant {pid}: {}",
                match b {
                    Some((pct, ns)) => format!("p{} ≤ {} µs", pct * 100.0, ns as f64 / 1000.0),
                    None => "best effort".into(),
                }
            );
            Ok(())
        }
        PagerCommand::Gc { pool, json } => {
            let p = tiermem_pager::PagerPool::open(&pool_path(pool))?;
            let r = p.gc();
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{} dead tenant(s) removed: {} buffer and {} swap slots freed",
                    r.tenants, r.buffer_slots, r.swap_slots
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bound;

    #[test]
    fn bounds_parse_with_their_units_and_bad_ones_are_refused() {
        assert_eq!(parse_bound("p99=300us").unwrap(), (0.99, 300_000));
        assert_eq!(parse_bound("p95=1ms").unwrap(), (0.95, 1_000_000));
        assert_eq!(parse_bound("p99.9=2500ns").unwrap().1, 2500);
        assert!((parse_bound("p99.9=1us").unwrap().0 - 0.999).abs() < 1e-12);
        for bad in [
            "99=300us", "p99=300", "p100=1us", "p0=1us", "p99=0us", "p99=-3us", "x",
        ] {
            assert!(parse_bound(bad).is_err(), "{bad}");
        }
    }
}
