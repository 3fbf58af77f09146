//! kill -9 at random points (during nv_write, commit, redo, writeback), then recover: every
//! acknowledged transaction is present entirely, every never-committed one entirely absent.
//!
//! The test re-executes its own binary as the victim (`crash_child` with
//! `TIERMEM_VNVM_CRASH_CHILD` set). `TIERMEM_VNVM_CRASH_ITERS` sets the number of crash points
//! (default 50).

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tiermem_vnvm::{nv_init, recover, Mode, VnvmError};

const SLOTS: usize = 4096; // 64 KiB region, 16 pages: 4/3 of the cache
const CHILD_ENV: &str = "TIERMEM_VNVM_CRASH_CHILD";

fn child_cfg(dir: &Path) -> tiermem_vnvm::VnvmConfig {
    // 24 log pages, 12 cache pages: writeback and eviction run all the time.
    small_cfg(dir, 24, 12)
}

fn init_content(seed: u64) -> Vec<u8> {
    (0..SLOTS * SLOT)
        .map(|i| (mix(seed ^ i as u64 ^ 0x5555) as u8) & 0x7f)
        .collect()
}

/// The victim: runs the workload forever, acknowledging each commit in `ack`.
#[test]
fn crash_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut it = spec.split(';');
    let dir = Path::new(it.next().unwrap());
    let seed: u64 = it.next().unwrap().parse().unwrap();
    let threads: usize = it.next().unwrap().parse().unwrap();
    let ack = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("ack"))
        .unwrap();
    let vn = nv_init(&child_cfg(dir)).unwrap();
    let r = vn
        .nv_allocate(dir.join("data"), SLOTS * SLOT, Mode::Private)
        .unwrap();
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (vn, r, ack) = (&vn, &r, &ack);
            sc.spawn(move || worker(vn, r, ack, seed, t, threads));
        }
    });
}

/// Thread `t` of `threads` owns slots `t * SLOTS / threads ..` and runs its own sequence.
fn worker(
    vn: &tiermem_vnvm::Vnvm,
    r: &tiermem_vnvm::Region,
    ack: &std::fs::File,
    seed: u64,
    t: usize,
    threads: usize,
) {
    let per = SLOTS / threads;
    let tseed = seed ^ ((t as u64) << 40);
    for i in 0u64.. {
        let tid = vn.nv_txbegin();
        for s in tx_slots(tseed, i, per, 0) {
            let rec = record(tseed, i, s);
            let s = t * per + s;
            loop {
                // SAFETY: slot s lies inside the region.
                match vn.nv_write(tid, unsafe { r.as_ptr().add(s * SLOT) }, &rec) {
                    Ok(n) => {
                        assert_eq!(n, SLOT);
                        break;
                    }
                    Err(VnvmError::LogFull { .. }) => {
                        vn.nv_wait_log_space(Duration::from_millis(50));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        vn.nv_commit(tid).unwrap();
        ack.write_all_at(&(i + 1).to_le_bytes(), 8 * t as u64)
            .unwrap();
    }
}

fn one_crash(seed: u64, threads: usize, totals: &mut [u64; 2]) -> (u64, u64) {
    let d = tmp();
    let dir = d.path();
    let init = init_content(seed);
    std::fs::write(dir.join("data"), &init).unwrap();
    std::fs::write(dir.join("ack"), vec![0u8; 8 * threads]).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{};{seed};{threads}", dir.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_micros(500 + mix(seed) % 150_000));
    // SAFETY: sending SIGKILL to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let st = child.wait().unwrap();
    assert!(
        st.code().is_none(),
        "child exited by itself: {st:?} (seed {seed})"
    );
    let acks = std::fs::read(dir.join("ack")).unwrap();
    let acked: Vec<u64> = (0..threads)
        .map(|t| u64::from_le_bytes(acks[8 * t..8 * t + 8].try_into().unwrap()))
        .collect();
    let inst = dir.join("inst");
    if inst.join("meta.pool").exists() {
        let rep = recover(&inst).unwrap_or_else(|e| panic!("recover failed (seed {seed}): {e}"));
        // Recovery is idempotent: running it again changes nothing.
        let after = std::fs::read(dir.join("data")).unwrap();
        let again = recover(&inst).unwrap();
        assert!(again.was_clean);
        assert_eq!(std::fs::read(dir.join("data")).unwrap(), after);
        totals[0] += rep.dirty_pages_written as u64;
        totals[1] += rep.transactions_replayed as u64;
    }
    let got = std::fs::read(dir.join("data")).unwrap();
    assert_eq!(got.len(), init.len());
    let per = SLOTS / threads;
    let mut found = 0;
    for (t, &acked_t) in acked.iter().enumerate() {
        let tseed = seed ^ ((t as u64) << 40);
        let range = t * per * SLOT..(t + 1) * per * SLOT;
        let (init_t, got_t) = (&init[range.clone()], &got[range]);
        match matching_prefix(init_t, got_t, tseed, acked_t, acked_t + 1, per, 0) {
            Some(n) => found += (n > acked_t) as u64,
            None => {
                let near = matching_prefix(init_t, got_t, tseed, 0, acked_t + 50, per, 0);
                panic!(
                    "seed {seed}, thread {t}/{threads}: after recovery its slots are not the state \
                     after its {} acknowledged transactions (or one more); closest exact prefix: \
                     {near:?}",
                    acked_t
                );
            }
        }
    }
    // The instance starts again after recovery.
    if inst.join("meta.pool").exists() {
        let vn = nv_init(&child_cfg(dir)).unwrap();
        vn.nv_release().unwrap();
    }
    (acked.iter().sum(), found)
}

#[test]
fn kill9_at_random_points_then_recover() {
    let iters: u64 = std::env::var("TIERMEM_VNVM_CRASH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let base: u64 = std::env::var("TIERMEM_VNVM_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7e57);
    let mut acked_total = 0;
    let mut in_flight_present = 0;
    let mut totals = [0u64; 2];
    // 1, 2 or 3 threads, each on its own slots with its own sequence.
    for k in 0..iters {
        let (acked, found) = one_crash(mix(base + k), 1 + (k % 3) as usize, &mut totals);
        acked_total += acked;
        in_flight_present += found;
    }
    eprintln!(
        "{iters} crash points: {acked_total} acknowledged transactions checked, \
         {in_flight_present} in-flight transactions found complete; recovery wrote {} dirty \
         pages and replayed {} transactions",
        totals[0], totals[1]
    );
}
