//! `tiermem bench pager`'s cases with several probe processes sharing one pager pool (issue
//! #16): a real `tiermem pager daemon` serves a pool (the NVM buffer, D/4, and one swap file);
//! each probe is a worker process of its own, a tenant of the pool with its own DRAM budget,
//! running at the same time as the others.
//!
//! * `concurrent`: three probes of D/3 each, budget D/6 each (D/2 together, as the single
//!   case), YCSB-A, bounded at 3 K, 1.5 K and 0.9 K (K: this run's kernel-swap page-in p99;
//!   the paper's 1000/500/300 µs against its 345 µs). Full runs then repeat it with the three
//!   running YCSB-A, -B and -C (`concurrent-abc`).
//! * `dynamic` (full runs): probe A (YCSB-A) bounded at 0.3 K beside probe C (YCSB-C) whose
//!   bound moves 3 K → 2.4 K → 1.8 K in thirds of the timed part; each phase is a row, and A
//!   must hold its bound in every one of C's phases.
//!
//! The probes together spend one core's worth of time in operations (each sleeps after a batch
//! for the rest of its share, [`duty`]); the other core is left to the evictors and the daemon.
//! With every probe spinning, three probes and three evictors on 2 cores measure the scheduler:
//! the first quick run had page-in p99s of 3.7–4.3 ms, a time slice, with the SSD's ~1 ms.
//!
//! After the probes leave, every slot of the pool must be free again (`leaked_slots`).

use crate::pager::{Row, RunReply, RunSpec};
use crate::progress;
use crate::worker::Worker;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `tiermem pager daemon` of this run, stopped (SIGTERM, then SIGKILL) on drop, its pool and
/// swap file removed even if it could not.
struct Daemon {
    child: Child,
    pool: PathBuf,
    swap: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, nvm: u64, swap_size: u64) -> Result<Daemon> {
        let shm = tiermem_media::ensure_default_dir()?;
        let pool = shm.join(format!("bench-pager-{}.pool", std::process::id()));
        let swap = dir.join(format!("bench-pool-{}.swap", std::process::id()));
        let _ = std::fs::remove_file(&pool);
        let _ = std::fs::remove_file(&swap);
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("tiermem"));
        let child = Command::new(exe)
            .args(["pager", "daemon", "--pool"])
            .arg(&pool)
            .args([
                "--nvm",
                &nvm.to_string(),
                "--swap-size",
                &swap_size.to_string(),
            ])
            .arg("--swap")
            .arg(&swap)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting tiermem pager daemon")?;
        let mut d = Daemon { child, pool, swap };
        for _ in 0..200 {
            if let Ok(p) = tiermem_pager::PagerPool::open(&d.pool) {
                if p.status().daemon == d.child.id() {
                    return Ok(d);
                }
            }
            if let Ok(Some(st)) = d.child.try_wait() {
                bail!("tiermem pager daemon exited at start: {st}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "tiermem pager daemon did not serve {} within 10 s",
            d.pool.display()
        )
    }

    fn open(&self) -> Result<tiermem_pager::PagerPool> {
        Ok(tiermem_pager::PagerPool::open(&self.pool)?)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: plain syscall to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.pool);
        let _ = std::fs::remove_file(&self.swap);
    }
}

/// One probe of a case.
pub(crate) struct Probe {
    /// Its name in the rows (`A1`, `B`, ...).
    pub(crate) name: String,
    /// Reads among its operations, percent.
    pub(crate) read_pct: u32,
    /// (start fraction, bound ns) of its phases; one phase for a fixed bound.
    pub(crate) phases: Vec<(f64, u64)>,
}

/// What a case gives the report.
pub(crate) struct CaseResult {
    pub(crate) rows: Vec<Row>,
    pub(crate) verify_errors: u64,
    pub(crate) leaked_slots: u64,
    /// Every probe phase in its bound.
    pub(crate) bounds_met: bool,
    /// Page-in samples (µs) per probe, for the CDF chart.
    pub(crate) cdf: Vec<(String, Vec<f64>)>,
}

/// Runs `probes` at once as tenants of one pool served by a daemon of this run. `base` is the
/// single case's spec (data, budget, times, swap directory), each probe getting `data_each`
/// and `budget_each`.
pub(crate) fn run_case(
    case: &str,
    probes: &[Probe],
    base: &RunSpec,
    data_each: u64,
    budget_each: u64,
    nvm: u64,
    timeout: Duration,
) -> Result<CaseResult> {
    let dir = base.swap_dir.clone();
    let swap_size = data_each * probes.len() as u64 + (64 << 20);
    let daemon = Daemon::start(&dir, nvm, swap_size)?;
    let meet = dir.join(format!("rendezvous-{case}-{}", std::process::id()));
    // A directory left by an earlier run with this pid would count its arrivals.
    let _ = std::fs::remove_dir_all(&meet);
    std::fs::create_dir_all(&meet).with_context(|| format!("creating {}", meet.display()))?;
    let rendezvous = crate::pager::Rendezvous {
        dir: meet.clone(),
        n: probes.len(),
        timeout_s: timeout.as_secs_f64(),
    };
    let replies: Vec<Result<RunReply>> = std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut spec = base.clone();
                spec.system = format!("{case}-{}", p.name);
                spec.data = data_each;
                spec.budget = budget_each;
                spec.nvm = 0;
                spec.control = true;
                spec.bound_ns = None;
                spec.seed = base.seed + i as u64;
                spec.pool = Some(daemon.pool.clone());
                spec.read_pct = Some(p.read_pct);
                spec.phases = p.phases.clone();
                // The probes together busy about one of the machine's cores, leaving the
                // other to the evictors and the daemon: with every probe spinning, 3 probes
                // and 3 evictors on 2 cores time the scheduler (page-in p99 ≈ a time slice).
                spec.duty = Some(duty(probes.len()));
                spec.rendezvous = Some(rendezvous.clone());
                s.spawn(move || -> Result<RunReply> {
                    let mut w = Worker::spawn(
                        &spec.system,
                        &["bench".into(), "pager-run".into()],
                        timeout,
                        vec![],
                    )?;
                    let r: RunReply = w.call(&crate::pager::probe_request(spec), "run")?;
                    w.finish()?;
                    Ok(r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a probe thread panicked"))
            })
            .collect()
    });
    let _ = std::fs::remove_dir_all(&meet);
    let mut ok = Vec::new();
    for (p, r) in probes.iter().zip(replies) {
        ok.push(r.with_context(|| format!("{case}: probe {}", p.name))?);
    }
    // Every probe left: the daemon collects any tenant that did not unregister; then every
    // slot must be free.
    let pool = daemon.open()?;
    pool.gc();
    let st = pool.status();
    let leaked = (st.buffer_used + st.swap_used) as u64 + st.tenants.len() as u64;
    drop(pool);
    drop(daemon);
    progress::note(&format!("{case}: {} probes done", probes.len()));
    let mut rows = Vec::new();
    let mut met = true;
    let mut verify = 0;
    let mut cdf = Vec::new();
    for (p, r) in probes.iter().zip(&ok) {
        verify += r.verify_errors;
        cdf.push((format!("{case} {}", p.name), r.cdf_us.clone()));
        let budget_ok = r
            .max_resident_bytes
            .is_some_and(|b| b <= budget_each + 32 * 4096);
        for (k, &(start, bound)) in p.phases.iter().enumerate() {
            let p99 = r.phase_p99_us.get(k).copied().flatten();
            // A phase without page-ins holds its bound trivially.
            let in_bound = p99.map_or(true, |v| v * 1000.0 <= bound as f64);
            met &= in_bound;
            let process = if p.phases.len() == 1 {
                p.name.clone()
            } else {
                format!("{}@{:.0}%", p.name, start * 100.0)
            };
            rows.push(Row {
                case: case.into(),
                system: "pager".into(),
                process,
                bound_us: Some(bound as f64 / 1000.0),
                pagein_p50_us: r.pagein_p50_us,
                pagein_p99_us: p99.unwrap_or(0.0),
                pageout_p99_us: r.pageout_p99_us,
                op_p99_us: r.op_p99_us,
                ops_per_s: r.ops as f64 / r.wall_s.max(1e-9),
                cpu_s: r.cpu_s,
                pageins: r.phase_pageins.get(k).copied().unwrap_or(0),
                bound_met: Some(in_bound),
                nvm_served_frac: r.nvm_served_frac,
                budget_respected: budget_ok,
                peak_bytes: r.max_resident_bytes.unwrap_or(0),
                ssd_pagein_p99_us: r.ssd_pagein_p99_us,
                buffer_pagein_p99_us: r.buffer_pagein_p99_us,
                over_budget_waits: r.over_budget_waits,
                swap_write_pages: r.swap_write_pages,
                clean_pageout_frac: r.clean_pageout_frac,
                update_p99_us: None,
            });
        }
    }
    Ok(CaseResult {
        rows,
        verify_errors: verify,
        leaked_slots: leaked,
        bounds_met: met,
        cdf,
    })
}

/// Each probe's share of wall time in operations when `n` run at once: one core's worth
/// together (of `available_parallelism`, less one for the pager's threads).
pub(crate) fn duty(n: usize) -> f64 {
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    ((cores.saturating_sub(1)).max(1) as f64 / n.max(1) as f64).min(1.0)
}

/// The probes of the concurrent case: three, bounded at 3 K, 1.5 K and 0.9 K, running YCSB
/// `workloads` (read percentages).
pub(crate) fn concurrent_probes(k_ns: f64, workloads: [(&str, u32); 3]) -> Vec<Probe> {
    workloads
        .iter()
        .zip([3.0, 1.5, 0.9])
        .map(|(&(name, read_pct), m)| Probe {
            name: name.into(),
            read_pct,
            phases: vec![(0.0, (m * k_ns) as u64)],
        })
        .collect()
}

/// The probes of the dynamic case: A at 0.3 K throughout (its phases follow C's, to compare),
/// C moving 3 K → 2.4 K → 1.8 K.
pub(crate) fn dynamic_probes(k_ns: f64) -> Vec<Probe> {
    let thirds = [0.0, 1.0 / 3.0, 2.0 / 3.0];
    vec![
        Probe {
            name: "A".into(),
            read_pct: 50,
            phases: thirds.iter().map(|&f| (f, (0.3 * k_ns) as u64)).collect(),
        },
        Probe {
            name: "C".into(),
            read_pct: 100,
            phases: thirds
                .iter()
                .zip([3.0, 2.4, 1.8])
                .map(|(&f, m)| (f, (m * k_ns) as u64))
                .collect(),
        },
    ]
}
