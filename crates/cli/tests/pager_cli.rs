//! `tiermem pager calibrate` and `tiermem bench pager`'s report shape at a tiny size (no timing
//! thresholds here): every system row, every must-have key, no verify error or leaked slot, and
//! no swap file, swap device or cgroup left behind. `tiermem pager run`: an unmodified `sort`
//! paged through a budget a sixteenth of its buffer prints what it prints plain; the command's
//! exit status is its own; bad options and an infeasible bound are refused before anything
//! runs. Needs libtiermem_pager_preload.so in the same target directory (a workspace build).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tiermem(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .output()
        .expect("run tiermem")
}

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn calibrate_reports_both_zones() {
    let dir = scratch("pager-calibrate");
    let out = tiermem(&[
        "pager",
        "calibrate",
        "--json",
        "--ms",
        "50",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["ssd_iops"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["nvm_iops"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["ssd_iops_by_threads"].as_array().unwrap().len(), 5);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "calibration left a file"
    );
    let out = tiermem(&["pager", "calibrate", "--dir", "/dev/shm", "--ms", "10"]);
    assert!(!out.status.success());
}

#[test]
fn bench_pager_reports_every_key_and_cleans_up() {
    if !is_root() {
        eprintln!("skipped: bench pager needs root (swapon, a memory cgroup)");
        return;
    }
    let dir = scratch("pager-bench");
    let png = dir.join("cdf.png");
    let out = tiermem(&[
        "bench",
        "pager",
        "--quick",
        "--json",
        "--data-mib",
        "64",
        "--seconds",
        "1",
        "--dir",
        dir.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let systems: Vec<String> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["case"].as_str().unwrap(),
                r["system"].as_str().unwrap()
            )
        })
        .collect();
    let mut want = vec![
        "single/kernel-swap",
        "single/pager-lru-ssd",
        "single/pager",
        // Three probe processes in one pool under a pager daemon.
        "concurrent/pager",
        "concurrent/pager",
        "concurrent/pager",
    ];
    // The application cases run where their programs are installed (scripts/setup.sh installs
    // them).
    let have = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    for (app, program) in [("memcached", "memcached"), ("redis", "redis-server")] {
        if have(program) {
            want.push(if app == "redis" {
                "app-redis/kernel-swap"
            } else {
                "app-memcached/kernel-swap"
            });
            want.push(if app == "redis" {
                "app-redis/pager"
            } else {
                "app-memcached/pager"
            });
            assert!(
                v["app_p99_ratio_vs_kernel_swap"][app].as_f64().is_some(),
                "{v}"
            );
        }
    }
    assert_eq!(systems, want, "{v}");
    for r in v["results"].as_array().unwrap() {
        for k in [
            "case",
            "system",
            "process",
            "bound_us",
            "pagein_p50_us",
            "pagein_p99_us",
            "pageout_p99_us",
            "op_p99_us",
            "ops_per_s",
            "bound_met",
            "nvm_served_frac",
            "budget_respected",
        ] {
            assert!(r.get(k).is_some(), "row lacks {k}: {r}");
        }
        assert_eq!(r["budget_respected"], true, "{r}");
    }
    for k in [
        "kernel_p99_us",
        "ssd_iops",
        "nvm_iops",
        "p99_ratio_vs_kernel_swap",
        "p99_ratio_vs_kernel_zram",
        "p50_ratio_vs_kernel_swap",
        "p99_ratio_vs_lru_ssd",
        "pageout_p99_ratio_vs_lru_ssd",
        "throughput_ratio_vs_kernel_swap",
        "app_p99_ratio_vs_kernel_swap",
        "bounds_met",
        "verify_errors",
        "leaked_slots",
        "cdf_png",
    ] {
        assert!(v.get(k).is_some(), "report lacks {k}");
    }
    assert_eq!(v["verify_errors"], 0);
    assert_eq!(v["leaked_slots"], 0);
    assert!(v["bounds_met"]["concurrent"].is_boolean(), "{v}");
    assert!(png.is_file(), "no CDF chart");
    // The concurrent case's daemon removed its pool.
    let pools: Vec<_> = std::fs::read_dir(tiermem_media::default_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("bench-pager-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(pools.is_empty(), "pools left behind: {pools:?}");
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    assert!(
        !swaps.contains(dir.to_str().unwrap()),
        "swap left on: {swaps}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path() != png)
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    let cg = Path::new("/sys/fs/cgroup/memory");
    if cg.is_dir() {
        let stale: Vec<_> = std::fs::read_dir(cg)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("tiermem-pager-bench")
            })
            .collect();
        assert!(stale.is_empty(), "cgroups left behind: {stale:?}");
    }
}

/// Runs tiermem without any preload or delay of the caller's environment.
fn tiermem_clean(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("TIERMEM_PAGER_PRELOAD")
        .env_remove("TIERMEM_DELAY")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run tiermem")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn pager_run_pages_an_unmodified_sort_and_keeps_its_output_and_status() {
    if !is_root() {
        eprintln!("SKIPPED: the pager needs root (userfaultfd in-thread mode)");
        return;
    }
    let dir = scratch("pager-run-sort");
    let input = dir.join("in.txt");
    // ~8 MB of lines; sort's 32 MiB buffer (-S) is one malloc: the arena, 4 × the budget.
    let body: String = (0..600_000u64)
        .map(|i| format!("{:012}\n", i.wrapping_mul(2654435761) % 1_000_000_007))
        .collect();
    std::fs::write(&input, body).unwrap();
    let plain = Command::new("sort")
        .args(["-S", "32M", "--parallel=1"])
        .arg(&input)
        .output()
        .expect("sort");
    assert!(plain.status.success());
    let stats = dir.join("report.json");
    let o = tiermem_clean(&[
        "pager",
        "run",
        "--budget",
        "8M",
        "--nvm",
        "4M",
        "--bound",
        "p99=5ms",
        "--dir",
        dir.to_str().unwrap(),
        "--stats",
        stats.to_str().unwrap(),
        "--",
        "sort",
        "-S",
        "32M",
        "--parallel=1",
        input.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stdout == plain.stdout,
        "sort printed something else when paged"
    );
    let r: Value = serde_json::from_str(
        std::fs::read_to_string(&stats)
            .expect("exit report")
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert!(n("arena_allocs") > 0, "{r}");
    assert!(n("pageins_buffer") + n("pageins_ssd") > 0, "{r}");
    assert!(n("pinned_calls") > 0, "sort read into the arena: {r}");
    assert!(n("max_resident_pages") <= n("budget_pages") + 32, "{r}");
    assert_eq!(n("io_errors"), 0, "{r}");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".swap"))
        .collect();
    assert!(left.is_empty(), "swap files left behind: {left:?}");
    // The exit status is the command's.
    let o = tiermem_clean(&["pager", "run", "--budget", "4M", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    let o = tiermem_clean(&["pager", "run", "--budget", "4M", "--", "/nonexistent/cmd"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pager_run_refuses_bad_options_and_infeasible_bounds_before_running() {
    let dir = scratch("pager-run-bad");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let cases: [(&[&str], &str); 7] = [
        (&["--budget", "100K"], "latency group"),
        (&["--budget", "64T"], "memory"),
        (&["--budget", "4M", "--nvm", "10K"], "latency group"),
        (&["--budget", "4M", "--dir", "/dev/shm"], "tmpfs"),
        (&["--budget", "4M", "--bound", "p99=300"], "pNN=LATENCY"),
        (&["--budget", "4M", "--bound", "p100=3us"], "percentile"),
        (&["--budget", "lots"], "--budget"),
    ];
    for (opts, want) in cases {
        let mut args = vec!["pager", "run"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&["--", "sh", "-c", &touch]);
        let o = tiermem_clean(&args);
        assert!(!o.status.success(), "{opts:?} was accepted");
        assert!(text(&o).contains(want), "{opts:?}: {}", text(&o));
        assert!(!marker.exists(), "{opts:?} ran the command");
    }
    // Eq. 2: a 1 ns bound asks for 10^9 page-ins a second.
    let d = dir.to_str().unwrap();
    let o = tiermem_clean(&[
        "pager", "run", "--budget", "4M", "--dir", d, "--bound", "p99=1ns", "--", "sh", "-c",
        &touch,
    ]);
    assert!(!o.status.success(), "an infeasible bound was admitted");
    assert!(
        text(&o).contains("page-ins per second"),
        "no numbers: {}",
        text(&o)
    );
    assert!(!marker.exists());
    let o = tiermem_clean(&[
        "pager",
        "run",
        "--budget",
        "4M",
        "--dir",
        d,
        "--bound",
        "p99=1ns",
        "--best-effort",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("best effort"), "{}", text(&o));
    assert!(marker.exists(), "--best-effort did not run the command");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits up to 20 s for `cond`.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..400 {
        if cond() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

fn status_json(pool: &str) -> Value {
    let o = tiermem_clean(&["pager", "status", "--pool", pool, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_daemon_serves_several_programs_and_collects_a_killed_one() {
    if !is_root() {
        eprintln!("SKIPPED: the pager needs root (userfaultfd in-thread mode)");
        return;
    }
    let shm = tempfile::Builder::new()
        .prefix("tiermem-pager-daemon")
        .tempdir_in("/dev/shm")
        .unwrap();
    let dir = scratch("pager-daemon");
    let pool = shm.path().join("pager.pool");
    let pool_s = pool.to_str().unwrap().to_string();
    let swap = dir.join("pool.swap");
    let daemon = Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args([
            "pager",
            "daemon",
            "--pool",
            &pool_s,
            "--nvm",
            "4M",
            "--swap-size",
            "256M",
        ])
        .args(["--window-ms", "100", "--swap", swap.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the pool", || pool.exists() && swap.exists());
    wait_for("the daemon to claim it", || {
        tiermem_clean(&["pager", "status", "--pool", &pool_s, "--json"])
            .status
            .success()
    });
    let st = status_json(&pool_s);
    assert_eq!(st["daemon"].as_u64(), Some(daemon.id() as u64), "{st}");
    assert_eq!(st["buffer_slots"].as_u64(), Some(1024), "{st}");

    // Two sorts share the pool; each prints what it prints plain.
    let input = dir.join("in.txt");
    let body: String = (0..400_000u64)
        .map(|i| format!("{:012}\n", i.wrapping_mul(2654435761) % 1_000_000_007))
        .collect();
    std::fs::write(&input, body).unwrap();
    let plain = Command::new("sort")
        .args(["-S", "24M", "--parallel=1"])
        .arg(&input)
        .output()
        .unwrap();
    let run = |bound: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tiermem"));
        c.args(["pager", "run", "--pool", &pool_s, "--budget", "6M"]);
        if let Some(b) = bound {
            c.args(["--bound", b]);
        }
        c.args(["--", "sort", "-S", "24M", "--parallel=1"])
            .arg(&input)
            .env_remove("LD_PRELOAD")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (run(Some("p99=20ms")), run(None));
    for c in [a, b] {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            o.stdout == plain.stdout,
            "a sort in the pool printed something else"
        );
    }

    // A tenant killed with pages out: the daemon frees its slots (pidfd wakes it).
    // sort holds what it read in its arena and waits for the rest of its input.
    let mut victim = Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(["pager", "run", "--pool", &pool_s, "--budget", "4M", "--"])
        .args(["sort", "-S", "24M", "--parallel=1"])
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut w = victim.stdin.take().unwrap();
        w.write_all(&std::fs::read(&input).unwrap()).unwrap();
        w.flush().unwrap();
        // Kept open (leaked) until the kill: sort waits for more.
        std::mem::forget(w);
    }
    let pid = victim.id() as u64;
    wait_for("the victim's pages out", || {
        let st = status_json(&pool_s);
        st["tenants"].as_array().unwrap().iter().any(|t| {
            t["pid"].as_u64() == Some(pid)
                && t["buffer_pages"].as_u64().unwrap() + t["swap_pages"].as_u64().unwrap() > 0
        })
    });
    // set-bound reaches it and status shows it.
    let o = tiermem_clean(&[
        "pager",
        "set-bound",
        &pid.to_string(),
        "p99=30ms",
        "--pool",
        &pool_s,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let st = status_json(&pool_s);
    let t = st["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["pid"].as_u64() == Some(pid))
        .cloned()
        .unwrap();
    assert_eq!(t["bound"][1].as_u64(), Some(30_000_000), "{t}");
    let o = tiermem_clean(&["pager", "set-bound", "1", "p99=30ms", "--pool", &pool_s]);
    assert!(
        !o.status.success() && text(&o).contains("no process 1"),
        "{}",
        text(&o)
    );
    let o = tiermem_clean(&[
        "pager",
        "set-bound",
        &pid.to_string(),
        "p99",
        "--pool",
        &pool_s,
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    // SAFETY: plain syscall.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    victim.wait().unwrap();
    wait_for("the daemon to collect it", || {
        let st = status_json(&pool_s);
        st["tenants"].as_array().unwrap().is_empty()
            && st["buffer_used"].as_u64() == Some(0)
            && st["swap_used"].as_u64() == Some(0)
    });
    // gc has nothing left to do.
    let o = tiermem_clean(&["pager", "gc", "--pool", &pool_s, "--json"]);
    let g: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(g["tenants"].as_u64(), Some(0), "{g}");

    // A second daemon on the same pool is refused; SIGTERM stops the first, which removes
    // the pool and the swap file (no tenant left).
    let o = tiermem_clean(&["pager", "daemon", "--pool", &pool_s]);
    assert!(
        !o.status.success() && text(&o).contains("already"),
        "{}",
        text(&o)
    );
    // SAFETY: plain syscall.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let o = daemon.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(!pool.exists() && !swap.exists(), "{}", text(&o));
    // Status of a pool that is not there says how to start one.
    let o = tiermem_clean(&["pager", "status", "--pool", &pool_s]);
    assert!(
        !o.status.success() && text(&o).contains("pager daemon"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
