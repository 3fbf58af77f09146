//! The SQLite part of `tiermem bench iocache`: the TPC-C-like driver (`tiermem-tpcc`, on the
//! system libsqlite3) with the database file going through the iocache SQLite VFS in buffered,
//! direct and dbio mode, at the same pool size, each run a process of its own inside a v1
//! memory cgroup limited to the budget (the paper's MySQL TPC-C, §3.4, scaled down).
//!
//! One database is loaded, then every run starts from a copy of it with the copy's page cache
//! dropped. The runs use `PRAGMA locking_mode=EXCLUSIVE` (the pool keeps dirty pages between
//! transactions, as a database's buffer pool does; otherwise every commit writes the pool back
//! so that other processes could see it) and `synchronous=OFF` (commits do not wait for the
//! device: on this VM an fsync costs 3–8× more from one run to the next and would measure the
//! disk, not the buffer pool). SQLite's own cache is 256 KiB in every mode.

use crate::progress;
use crate::snapshot::Cgroup;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One mode's median run.
#[derive(Serialize, Debug, Clone)]
pub struct TpccRow {
    /// `buffered`, `direct` or `dbio`.
    pub mode: String,
    /// Pool bytes over the budget.
    pub pool_fraction: f64,
    /// New-Order transactions committed per minute (median of the repetitions).
    pub tpmc: f64,
    /// Smallest and largest of the repetitions.
    pub tpmc_min: f64,
    /// See `tpmc_min`.
    pub tpmc_max: f64,
    /// Transactions of the median run (all types).
    pub txns: u64,
    /// Transactions that failed (median run).
    pub errors: u64,
    /// The cgroup's peak charge (median run).
    pub max_usage_bytes: u64,
    /// OOM kills in the cgroup (all runs).
    pub oom_kills: u64,
}

/// What the SQLite part reports.
#[derive(Default)]
pub struct TpccResult {
    /// One row per mode.
    pub rows: Vec<TpccRow>,
    /// The database, budget, pool, run length.
    pub config: serde_json::Value,
    /// Why it did not run, if it did not.
    pub note: Option<String>,
}

/// One run: tpmC, transactions, errors, the cgroup's peak, its OOM kills.
type Run = (f64, u64, u64, u64, u64);

fn driver() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join("tiermem-tpcc");
    p.exists().then_some(p)
}

/// Runs the three modes `reps` times each, interleaved. `quick`: 1 warehouse at half scale,
/// 16 MiB budget, 5 s runs; else 2 warehouses, 64 MiB budget, 30 s runs. Pool: half the budget.
pub fn run(dir: &Path, quick: bool, reps: usize) -> Result<TpccResult> {
    let Some(bin) = driver() else {
        return Ok(TpccResult {
            note: Some(
                "sqlite TPC-C: tiermem-tpcc not found next to this executable (cargo build \
                 --release --workspace builds it)"
                    .into(),
            ),
            ..TpccResult::default()
        });
    };
    let (warehouses, scale, budget, seconds) = if quick {
        (1u32, 0.5f64, 16u64 << 20, 5u32)
    } else {
        (2, 1.0, 64 << 20, 30)
    };
    let fraction = 0.5;
    let pool = ((budget as f64 * fraction) as u64) & !4095;
    std::fs::create_dir_all(dir)?;
    let base = dir.join(format!("tpcc-base-{}.db", std::process::id()));
    let runf = dir.join(format!("tpcc-run-{}.db", std::process::id()));
    let _rm = Remove(vec![base.clone(), runf.clone(), journal(&runf)]);
    progress::note(&format!(
        "sqlite TPC-C: loading {warehouses} warehouse(s) at scale {scale} into {}",
        base.display()
    ));
    let out = std::process::Command::new(&bin)
        .args(["load", "--warehouses", &warehouses.to_string()])
        .args(["--scale", &scale.to_string()])
        .arg("--db")
        .arg(&base)
        .output()
        .context("running tiermem-tpcc load")?;
    if !out.status.success() {
        bail!(
            "tiermem-tpcc load failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let db_bytes = std::fs::metadata(&base)?.len();
    let modes = ["buffered", "direct", "dbio"];
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); modes.len()];
    progress::grow((reps * modes.len()) as u64);
    for rep in 0..reps {
        for k in 0..modes.len() {
            let mi = (k + rep) % modes.len();
            let mode = modes[mi];
            progress::step(&format!("sqlite TPC-C {mode} (rep {})", rep + 1));
            std::fs::copy(&base, &runf).context("copying the loaded database")?;
            let _ = std::fs::remove_file(journal(&runf));
            crate::iocache::drop_cache(&runf)?;
            let cg = Cgroup::create(&format!("tiermem-iocache-{}", std::process::id()))?;
            cg.set_limit(budget)?;
            let mut c = std::process::Command::new(&bin);
            c.arg("run")
                .arg("--db")
                .arg(&runf)
                .args(["--seconds", &seconds.to_string()])
                .args(["--mode", mode])
                .args(["--pool", &pool.to_string()])
                .args(["--budget", &budget.to_string()])
                .args(["--sync", "off", "--exclusive", "--json"])
                .args(["--seed", &(11 + rep).to_string()])
                // The cgroup holds the budget: the library need not trim.
                .env("TIERMEM_IOCACHE_ENFORCE", "0")
                .stderr(std::process::Stdio::null());
            cg.enter_at_exec(&mut c);
            let out = c.output().context("running tiermem-tpcc run")?;
            let peak = cg.max_usage().unwrap_or(0);
            let ooms = cg.oom_kills();
            drop(cg);
            if !out.status.success() {
                bail!("tiermem-tpcc run ({mode}) failed: {}", out.status);
            }
            let j: serde_json::Value =
                serde_json::from_slice(&out.stdout).context("tiermem-tpcc's JSON")?;
            runs[mi].push((
                j["tpmc"].as_f64().unwrap_or(0.0),
                j["txns"].as_u64().unwrap_or(0),
                j["errors"].as_u64().unwrap_or(0),
                peak,
                ooms,
            ));
        }
    }
    let mut rows = Vec::new();
    for (mode, mut r) in modes.iter().zip(runs) {
        r.sort_by(|a, b| a.0.total_cmp(&b.0));
        let m = r[r.len() / 2];
        rows.push(TpccRow {
            mode: mode.to_string(),
            pool_fraction: fraction,
            tpmc: m.0.round(),
            tpmc_min: r[0].0.round(),
            tpmc_max: r[r.len() - 1].0.round(),
            txns: m.1,
            errors: m.2,
            max_usage_bytes: m.3,
            oom_kills: r.iter().map(|x| x.4).sum(),
        });
    }
    Ok(TpccResult {
        rows,
        config: serde_json::json!({
            "warehouses": warehouses,
            "scale": scale,
            "database_bytes": db_bytes,
            "budget_bytes": budget,
            "pool_bytes": pool,
            "seconds_per_run": seconds,
            "repetitions": reps,
            "sqlite": "locking_mode=EXCLUSIVE, synchronous=OFF, journal_mode=DELETE, cache 256 KiB",
        }),
        note: None,
    })
}

fn journal(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-journal");
    PathBuf::from(s)
}

struct Remove(Vec<PathBuf>);

impl Drop for Remove {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}
