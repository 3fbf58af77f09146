//! Quick throughput probe (not a benchmark harness): transactions of 32 page writes of S bytes,
//! sequential over the pages of a region, log and cache pools each as large as the region.
//! Time ends when the redo worker has applied every committed log (drain). Prints the CPU time
//! of each thread over the timed part, and the redo worker's per applied entry.
//!
//! `cargo run --release -p tiermem-vnvm --example tx_rate -- [region MiB] [bytes per page] [passes]
//! [untimed warm-up passes]`

use std::time::Instant;
use tiermem_vnvm::{nv_init, Mode, VnvmConfig, VnvmError};

fn main() -> Result<(), VnvmError> {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let s: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64);
    let passes: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1);
    let warm: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(0);
    let size = mib << 20;
    let base = std::env::temp_dir().join(format!("vnvm-tx-rate-{}", std::process::id()));
    let dir = std::path::Path::new("/dev/shm").join(base.file_name().unwrap());
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = VnvmConfig {
        dir: dir.join("inst"),
        log_size: size as u64,
        cache_size: size as u64,
        ..VnvmConfig::from_env()?
    };
    let vn = nv_init(&cfg)?;
    let r = vn.nv_allocate(dir.join("array"), size, Mode::Private)?;
    let pages = size / 4096;
    let buf = vec![0x5au8; s];
    let mut cpu0 = thread_cpu();
    let mut t0 = Instant::now();
    let mut txs = 0u64;
    for pass in 0..warm + passes {
        if pass == warm {
            // Warm-up passes (untimed): every page mapped in the cache, then background work
            // done, as between the cells of `tiermem bench vnvm`.
            vn.quiesce()?;
            cpu0 = thread_cpu();
            t0 = Instant::now();
            txs = 0;
        }
        let mut p = 0;
        while p < pages {
            let tid = vn.nv_txbegin();
            for q in p..(p + 32).min(pages) {
                // SAFETY: page q is inside the region.
                let dst = unsafe { r.as_ptr().add(q * 4096) };
                loop {
                    match vn.nv_write(tid, dst, &buf) {
                        Ok(_) => break,
                        Err(VnvmError::LogFull { .. }) => {
                            vn.nv_wait_log_space(std::time::Duration::from_millis(10));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            vn.nv_commit(tid)?;
            txs += 1;
            p += 32;
        }
    }
    let commit_done = t0.elapsed();
    vn.drain()?;
    let total = t0.elapsed();
    // CPU time of each thread over the timed part (commits and drain), and the redo worker's
    // per applied entry: on 2 cores, what the workers use the application cannot.
    let entries = txs as f64 * 32.0;
    let used: Vec<String> = thread_cpu()
        .into_iter()
        .map(|(name, ns)| {
            let d = ns - cpu0.iter().find(|c| c.0 == name).map_or(0, |c| c.1);
            let per = if name == "vnvm-redo" {
                format!(" ({:.0} ns per entry)", d as f64 / entries)
            } else {
                String::new()
            };
            format!("{name} {:.1} ms{per}", d as f64 / 1e6)
        })
        .collect();
    println!(
        "{txs} transactions of 32 x {s} B over {mib} MiB x {passes}: {:.0} tx/s with drain \
         ({:.0} tx/s commit only); {:?}",
        txs as f64 / total.as_secs_f64(),
        txs as f64 / commit_done.as_secs_f64(),
        vn.stats()
    );
    println!("cpu: {}", used.join(", "));
    // Idle: the workers sleep on futexes; report the CPU the process burns in one second.
    let cpu = || {
        // SAFETY: zeroed rusage is a valid out-buffer for getrusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a rusage.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
        t(ru.ru_utime) + t(ru.ru_stime)
    };
    let (c0, w0) = (cpu(), Instant::now());
    std::thread::sleep(std::time::Duration::from_secs(1));
    println!(
        "idle: {:.2} % of one core",
        100.0 * (cpu() - c0) / w0.elapsed().as_secs_f64()
    );
    vn.nv_release()?;
    std::fs::remove_dir_all(&dir).unwrap();
    Ok(())
}

/// CPU time (ns) of each of this process's threads by name, from `/proc/self/task/*/schedstat`
/// (threads of one name summed).
fn thread_cpu() -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return v;
    };
    for t in tasks.flatten() {
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let name = name.trim().to_string();
        match v.iter_mut().find(|x| x.0 == name) {
            Some(x) => x.1 += ns,
            None => v.push((name, ns)),
        }
    }
    v
}
