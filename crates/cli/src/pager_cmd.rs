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
            let opts = tiermem_pager::PagerOptions::new(budget_b, nvm_b);
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
                let cap = capacity_for(&dir)?;
                match tiermem_pager::admit(&cap, &[], ns) {
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
            let lib =
                crate::preload::find(PRELOAD, "TIERMEM_PAGER_PRELOAD", "tiermem-pager-preload")?;
            crate::preload::exec(&lib, &cmd, &env)
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
