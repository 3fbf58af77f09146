//! `tiermem doctor`: which kernel features tiermem relies on are present, and what the basic
//! operations cost on this machine (the floor every subsystem's performance is judged against).

use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use tiermem_bench::machine;
use tiermem_bench::stats::P50P99;
use tiermem_fault::{access, probe, probe_features, sys, Pagemap, UffdAccess};
use tiermem_media::{persist, PersistMethod, Pool, PoolOptions};

/// The JSON report (`tiermem doctor --json`).
#[derive(Serialize)]
pub struct DoctorReport {
    pub kernel: String,
    pub machine: machine::Machine,
    pub features: BTreeMap<&'static str, bool>,
    pub costs_us: BTreeMap<&'static str, P50P99>,
    pub copy_gbps: f64,
    /// How early the delay model's sleeps end (`tiermem_media::delay_ns`): waits shorter than
    /// twice this spin, longer ones sleep to this margin before the deadline, µs.
    pub delay_sleep_margin_us: f64,
    /// Fresh anonymous memory filled by `MAP_POPULATE` (2 GiB once; 256 MiB, median of 3,
    /// with `--quick`), GB/s: the floor of anything that fills gigabytes of new memory.
    pub fresh_memory_gbps: f64,
    /// The effective uid the report was made as.
    pub uid: u32,
    /// The way tiermem obtains userfaultfds here (`syscall`, `dev_userfaultfd`,
    /// `user_mode_only`), the first that works in that order; null when none does.
    pub userfaultfd_mode: Option<&'static str>,
    /// Each of the three ways: whether it works and, if not, what it would need.
    pub userfaultfd_access: Vec<AccessRow>,
    /// Human-readable notes on anything missing or degraded.
    pub notes: Vec<String>,
}

/// One way of obtaining a userfaultfd, as `tiermem doctor` reports it.
#[derive(Serialize)]
pub struct AccessRow {
    /// `syscall`, `dev_userfaultfd` or `user_mode_only`.
    pub way: &'static str,
    pub works: bool,
    /// The error it failed with (null when it works).
    pub error: Option<String>,
    /// What it would need on this machine (null when it works).
    pub needs: Option<String>,
}

/// Try the three ways of obtaining a userfaultfd; returns the rows and the one tiermem uses.
pub fn userfaultfd_access(notes: &mut Vec<String>) -> (Vec<AccessRow>, Option<UffdAccess>) {
    let attempts = access::probe();
    let used = attempts
        .iter()
        .find(|a| a.errno.is_none())
        .map(|a| a.access);
    let rows = attempts
        .into_iter()
        .map(|a| AccessRow {
            way: a.access.name(),
            works: a.errno.is_none(),
            error: a
                .errno
                .map(|e| std::io::Error::from_raw_os_error(e).to_string()),
            needs: a.needs,
        })
        .collect();
    match used {
        Some(UffdAccess::UserModeOnly) => notes.push(
            "userfaultfd is user-mode only here (UFFD_USER_MODE_ONLY): in-thread regions and \
             write tracking work as usual; a kernel access (read(2), recv(2), a futex) to a \
             missing page of a handler-thread region fails with EFAULT instead of waiting for \
             the resolver. For kernel-mode faults too: root, vm.unprivileged_userfaultfd=1, or \
             access to /dev/userfaultfd (see userfaultfd access above)"
                .into(),
        ),
        Some(_) => {}
        None => notes.push(
            "no way to obtain a userfaultfd works: the fault engine, vnvm's fault paths, pheap's \
             WP_ASYNC tracking (it falls back to mprotect) and tiermem-kv's volatile engine need \
             one"
            .into(),
        ),
    }
    (rows, used)
}

/// What needs a privilege an unprivileged user lacks, for the notes (empty as root).
fn privileged_notes(uid: u32, notes: &mut Vec<String>) {
    if uid == 0 {
        return;
    }
    notes.push(format!(
        "running as uid {uid}: pools (in {}), the fault engine, vnvm, pheap and tiermem-kv work \
         unprivileged; `tiermem migrate`/`bench migrate` need root (CAP_SYS_ADMIN for network \
         namespaces), memory cgroups and swap set-up need root",
        tiermem_media::default_dir().display()
    ));
}

/// Detect features; never fails (a probe that cannot run reports `false` and a note).
pub fn features(notes: &mut Vec<String>) -> BTreeMap<&'static str, bool> {
    let mut f = BTreeMap::new();
    match probe_features() {
        Ok(u) => {
            f.insert("userfaultfd", true);
            f.insert("uffd_sigbus", u.sigbus);
            f.insert("uffd_wp", u.wp);
            f.insert("uffd_wp_async", u.wp_async);
            f.insert("uffd_wp_unpopulated", u.wp_unpopulated);
            f.insert("uffd_wp_shmem", u.wp_hugetlbfs_shmem);
            f.insert("uffd_missing_shmem", u.missing_shmem);
            f.insert("uffd_minor_shmem", u.minor_shmem);
            f.insert("uffd_move", u.move_);
            f.insert("uffd_event_fork", u.event_fork);
            if u.event_fork_denied {
                notes.push(
                    "UFFD_FEATURE_EVENT_FORK is offered by the kernel but needs CAP_SYS_PTRACE: \
                     regions shared with forked children (ForkPolicy::ShareWithChild) need root"
                        .into(),
                );
            }
            f.insert("uffd_event_remap", u.event_remap);
            f.insert("uffd_event_remove", u.event_remove);
            f.insert("uffd_event_unmap", u.event_unmap);
            f.insert("uffd_thread_id", u.thread_id);
        }
        Err(e) => {
            f.insert("userfaultfd", false);
            notes.push(format!("userfaultfd unavailable: {e}"));
        }
    }
    f.insert("pagemap_scan", pagemap_scan_works());
    f.insert("io_uring", io_uring_works());
    let dax = dax_mounts();
    f.insert("dax_mount", !dax.is_empty());
    if !dax.is_empty() {
        notes.push(format!("DAX mounts: {}", dax.join(", ")));
    }
    f.insert("map_sync_in_tiermem_dir", map_sync_in_default_dir(notes));
    let cpu = persist::cpu_features();
    f.insert("clwb", cpu.clwb);
    f.insert("clflushopt", cpu.clflushopt);
    f.insert("avx2", cpu.avx2);
    f.insert("avx512f", cpu.avx512f);
    f.insert("invariant_tsc", cpu.invariant_tsc);
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .map(|s| s.split_whitespace().any(|c| c == "memory"))
        .unwrap_or(false);
    f.insert("memcg_v1", v1);
    f.insert("memcg_v2", v2);
    let swap = std::fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().count() > 1)
        .unwrap_or(false);
    f.insert("swap_enabled", swap);
    f
}

/// One PAGEMAP_SCAN ioctl over a page of our own memory: does the kernel know the ioctl?
fn pagemap_scan_works() -> bool {
    let Ok(pm) = Pagemap::open() else {
        return false;
    };
    let page = vec![1u8; 2 * sys::PAGE_SIZE];
    let start = (page.as_ptr() as u64 + sys::PAGE_SIZE as u64 - 1) & !(sys::PAGE_SIZE as u64 - 1);
    let mut out = [sys::PageRegion::default(); 4];
    let mut arg = sys::PmScanArg {
        start,
        end: start + sys::PAGE_SIZE as u64,
        vec: out.as_mut_ptr() as u64,
        vec_len: out.len() as u64,
        category_mask: 0,
        return_mask: sys::PAGE_IS_PRESENT,
        category_anyof_mask: sys::PAGE_IS_PRESENT,
        ..Default::default()
    };
    pm.scan(&mut arg).is_ok()
}

/// io_uring_setup with one entry: the real test (the sysctl alone does not say about seccomp).
fn io_uring_works() -> bool {
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(entries, params) with a zeroed 120-byte io_uring_params; the returned
    // fd (if any) is closed immediately.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: fd was just returned to us.
        unsafe { libc::close(fd as i32) };
        true
    } else {
        false
    }
}

/// Mount points whose options say DAX (pmem / CXL file systems mounted with -o dax).
fn dax_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (_dev, mnt, _fs, opts) = (it.next()?, it.next()?, it.next()?, it.next()?);
            opts.split(',')
                .any(|o| o == "dax" || o == "dax=always")
                .then(|| mnt.to_string())
        })
        .collect()
}

/// Create a tiny pool in the default directory and see whether it mapped with MAP_SYNC.
fn map_sync_in_default_dir(notes: &mut Vec<String>) -> bool {
    let dir = match tiermem_media::ensure_default_dir() {
        Ok(d) => d,
        Err(e) => {
            notes.push(format!("default pool directory unusable: {e}"));
            return false;
        }
    };
    let path = dir.join(format!(".doctor-{}.pool", std::process::id()));
    let r = Pool::create(&path, &PoolOptions::new(2 << 20).tag("doctor"));
    let out = match &r {
        Ok(p) => {
            notes.push(format!(
                "pools in {} persist with {:?}",
                dir.display(),
                p.persist_method()
            ));
            p.persist_method() == PersistMethod::DaxSync
        }
        Err(e) => {
            notes.push(format!("cannot create a pool in {}: {e}", dir.display()));
            false
        }
    };
    drop(r);
    let _ = std::fs::remove_file(&path);
    out
}

/// Measure the floor of this machine: per-operation costs, copy bandwidth, fresh-memory
/// bandwidth.
pub fn measure(quick: bool, notes: &mut Vec<String>) -> (BTreeMap<&'static str, P50P99>, f64, f64) {
    let n = if quick { 400 } else { 2000 };
    let mut costs = BTreeMap::new();
    type Probe = fn(usize) -> tiermem_fault::Result<Vec<f64>>;
    let probes: [(&'static str, Probe, usize); 8] = [
        ("first_touch", probe::first_touch_ns, n),
        ("mprotect_fault", probe::mprotect_fault_ns, n),
        ("uffd_in_thread", probe::uffd_in_thread_ns, n),
        ("uffd_in_thread_bare", probe::uffd_sigbus_bare_ns, n),
        ("uffd_handler_thread", probe::uffd_handler_thread_ns, n),
        (
            "uffd_handler_thread_spin",
            |p| probe::uffd_handler_thread_spin_ns(p, 200),
            n,
        ),
        (
            "uffd_wp_async_first_write",
            probe::write_fault_wp_async_ns,
            n,
        ),
        ("memcpy_4k", probe::memcpy_4k_ns, n * 5),
    ];
    for (name, f, count) in probes {
        match f(count) {
            Ok(samples) => {
                costs.insert(name, P50P99::from_ns_as_us(&samples));
            }
            Err(e) => notes.push(format!("{name}: not measured: {e}")),
        }
    }
    if let (Some(eng), Some(bare)) = (
        costs.get("uffd_in_thread"),
        costs.get("uffd_in_thread_bare"),
    ) {
        notes.push(format!(
            "in-thread resolution: {:.2} µs p50 through the engine, {:.2} µs for the bare mechanism \
             (SIGBUS + one UFFDIO_COPY, no engine) on this machine: the engine adds {:+.2} µs",
            eng.p50,
            bare.p50,
            eng.p50 - bare.p50
        ));
    }
    let gbps = match probe::copy_gbps(if quick { 64 << 20 } else { 256 << 20 }) {
        Ok(g) => (g * 100.0).round() / 100.0,
        Err(e) => {
            notes.push(format!("copy bandwidth not measured: {e}"));
            f64::NAN
        }
    };
    // 2 GiB once: past what a VM's host keeps backed, where new memory costs the host's
    // faults too (256 MiB, three times, with --quick).
    let (fresh_bytes, fresh_reps) = if quick { (256 << 20, 3) } else { (2 << 30, 1) };
    let fresh = match probe::fresh_memory_gbps(fresh_bytes, fresh_reps) {
        Ok(g) => (g * 100.0).round() / 100.0,
        Err(e) => {
            notes.push(format!("fresh memory bandwidth not measured: {e}"));
            f64::NAN
        }
    };
    (costs, gbps, fresh)
}

/// Build the whole report.
pub fn report(quick: bool) -> DoctorReport {
    let mut notes = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let (userfaultfd_access, used) = userfaultfd_access(&mut notes);
    privileged_notes(uid, &mut notes);
    let features = features(&mut notes);
    let (costs_us, copy_gbps, fresh_memory_gbps) = measure(quick, &mut notes);
    let m = machine::describe();
    DoctorReport {
        kernel: m.kernel.clone(),
        machine: m,
        features,
        costs_us,
        copy_gbps,
        delay_sleep_margin_us: tiermem_media::delay_sleep_margin_ns() as f64 / 1e3,
        fresh_memory_gbps,
        uid,
        userfaultfd_mode: used.map(UffdAccess::name),
        userfaultfd_access,
        notes,
    }
}

/// Print the report as a table (or JSON).
pub fn print(r: &DoctorReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    println!("tiermem doctor");
    println!("machine: {}\n", r.machine.one_line());
    println!("userfaultfd access (as uid {}, tried in this order)", r.uid);
    for a in &r.userfaultfd_access {
        let used = r.userfaultfd_mode == Some(a.way);
        let state = match (a.works, used) {
            (true, true) => "yes  <- used".to_string(),
            (true, false) => "yes".to_string(),
            (false, _) => format!(
                "no   {}; needs {}",
                a.error.as_deref().unwrap_or("?"),
                a.needs.as_deref().unwrap_or("?")
            ),
        };
        println!("  {:<18} {}", a.way, state);
    }
    println!();
    println!("features");
    for (k, v) in &r.features {
        println!("  {:<26} {}", k, if *v { "yes" } else { "no" });
    }
    println!("\ncosts on this machine (µs)          p50      p99   floor (DESIGN.md)");
    let floor = |k: &str| match k {
        "first_touch" => "1.2 / 2.7",
        "mprotect_fault" => "3.1 / 3.7",
        "uffd_in_thread" => "2.2 / 4.0",
        "uffd_in_thread_bare" => "(the mechanism alone)",
        "uffd_handler_thread" => "70-80 / 110-140",
        "uffd_wp_async_first_write" => "~0.8",
        "memcpy_4k" => "0.34 / 0.75",
        _ => "",
    };
    for (k, v) in &r.costs_us {
        println!("  {:<30} {:>8.2} {:>8.2}   {}", k, v.p50, v.p99, floor(k));
    }
    println!(
        "  {:<30} {:>8.2} GB/s        12.6",
        "copy bandwidth (one core)", r.copy_gbps
    );
    println!(
        "  {:<30} {:>8.2} GB/s        (new memory, MAP_POPULATE of 2 GiB; 256 MiB with --quick)",
        "fresh memory", r.fresh_memory_gbps
    );
    println!(
        "  {:<30} {:>8.1} µs          (delay model: waits under twice this spin, longer ones sleep)",
        "sleep margin (late wake-ups)", r.delay_sleep_margin_us
    );
    if !r.notes.is_empty() {
        println!("\nnotes");
        for n in &r.notes {
            println!("  - {n}");
        }
    }
    Ok(())
}

/// `tiermem doctor [--json] [--quick]`.
pub fn run(json: bool, quick: bool) -> Result<()> {
    let r = report(quick);
    print(&r, json)
}
