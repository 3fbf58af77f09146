//! kill -9 at random points (during nv_write, commit, redo, writeback, shared-region flush),
//! then recover: every acknowledged transaction is present entirely, every never-committed one
//! entirely absent — for private regions and for shared ones.
//!
//! The test re-executes its own binary as the victim (`crash_child` with
//! `TIERMEM_VNVM_CRASH_CHILD` set). `TIERMEM_VNVM_CRASH_ITERS` sets the number of crash points
//! (default 50), `TIERMEM_VNVM_CRASH_SEED` the base seed. Crash point `k` uses
//!
//! * `k` even: a private region, killed with SIGKILL at a random time;
//! * `k` odd: a shared region (`Mode::Shared`: the backing file itself is the DRAM cache, each
//!   commit links into the region's own committed list, flushes msync and drop the logs),
//!   killed with SIGKILL at a random time (`k % 4 == 1`), or (`k % 4 == 3`) by a seccomp
//!   filter the victim arms after a random delay that kills it at its next `msync` — which only
//!   a shared-region flush issues (the pools on tmpfs persist with cache flushes; private
//!   writeback uses fdatasync) — so the crash lands inside a flush, after it marked the list's
//!   tail and before it dropped the logs.
//!
//! and 1, 2 or 3 threads (`1 + k % 3`), so six consecutive points cover every combination.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tiermem_vnvm::{nv_init, recover, Mode, VnvmError};

const SLOTS: usize = 4096; // 64 KiB region, 16 pages: 4/3 of the cache
const CHILD_ENV: &str = "TIERMEM_VNVM_CRASH_CHILD";

fn child_cfg(dir: &Path) -> tiermem_vnvm::VnvmConfig {
    // 24 log pages, 12 cache pages: writeback and eviction run all the time (private mode);
    // a shared region's flush threshold is a quarter of the log share (6 pages, two or three
    // transactions), and writers that run out of log pages ask for flushes too.
    small_cfg(dir, 24, 12)
}

fn init_content(seed: u64) -> Vec<u8> {
    (0..SLOTS * SLOT)
        .map(|i| (mix(seed ^ i as u64 ^ 0x5555) as u8) & 0x7f)
        .collect()
}

/// How the victim dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    /// SIGKILL from the parent after a random delay.
    Random,
    /// Killed by seccomp at its first `msync` after a random delay (inside a shared flush).
    AtFlush,
}

/// The ack file: per thread `t`, at `8 * t` the number of transactions whose `nv_commit`
/// returned, at `8 * (threads + t)` the number of the transaction whose `nv_commit` it entered
/// last (1-based). A thread was killed inside a commit iff the second is larger.
fn ack_off(threads: usize, t: usize, entering: bool) -> u64 {
    8 * (t + if entering { threads } else { 0 }) as u64
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
    let mode = match it.next().unwrap() {
        "private" => Mode::Private,
        "shared" => Mode::Shared,
        m => panic!("mode {m}"),
    };
    // Microseconds after which to arm the kill-at-next-msync trap; 0: never.
    let trap_us: u64 = it.next().unwrap().parse().unwrap();
    let ack = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("ack"))
        .unwrap();
    let vn = nv_init(&child_cfg(dir)).unwrap();
    let r = vn
        .nv_allocate(dir.join("data"), SLOTS * SLOT, mode)
        .unwrap();
    std::thread::scope(|sc| {
        if trap_us > 0 {
            sc.spawn(move || {
                std::thread::sleep(Duration::from_micros(trap_us));
                kill_at_next_msync();
            });
        }
        for t in 0..threads {
            let (vn, r, ack) = (&vn, &r, &ack);
            sc.spawn(move || worker(vn, r, ack, seed, t, threads));
        }
    });
}

/// Install a seccomp filter on every thread of this process that kills the whole process
/// (SECCOMP_RET_KILL_PROCESS: like SIGKILL, no user code runs) when any thread calls `msync`.
/// The architecture is not checked: a foreign-ABI syscall with the same number would only kill
/// the victim early.
fn kill_at_next_msync() {
    let nr = libc::SYS_msync as u32;
    let mut prog = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: nr,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_KILL_PROCESS,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls with valid arguments; the filter program outlives the call (the
    // kernel copies it).
    let ok = unsafe {
        // The kill is reported as SIGSYS, whose default action dumps core: not here.
        libc::setrlimit(libc::RLIMIT_CORE, &no_core) == 0
            && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_TSYNC,
                &fprog as *const libc::sock_fprog,
            ) == 0
    };
    if !ok {
        // No seccomp here (a sandbox that forbids it): the parent falls back to SIGKILL after
        // its wait and counts the point as a missed trap.
        eprintln!(
            "crash_child: cannot arm the msync trap ({}); the parent will SIGKILL instead",
            std::io::Error::last_os_error()
        );
    }
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
        ack.write_all_at(&(i + 1).to_le_bytes(), ack_off(threads, t, true))
            .unwrap();
        vn.nv_commit(tid).unwrap();
        ack.write_all_at(&(i + 1).to_le_bytes(), ack_off(threads, t, false))
            .unwrap();
    }
}

/// Counters of one mode.
#[derive(Default)]
struct Stats {
    iters: u64,
    /// Acknowledged transactions checked.
    acked: u64,
    /// Transactions committed but not acknowledged that recovery kept (complete).
    in_flight_present: u64,
    /// Crash points where some thread was inside nv_commit.
    killed_in_commit: u64,
    /// Crash points killed by the msync trap (inside a shared flush).
    killed_in_flush: u64,
    /// Crash points where the msync trap did not fire in time (SIGKILL instead).
    trap_missed: u64,
    /// Crash points before the pools existed (nothing to recover).
    no_instance: u64,
    dirty_pages_written: u64,
    replayed: u64,
    /// Crash points where recovery replayed at least one transaction.
    iters_replayed: u64,
    /// Crash points where recovery changed the backing file.
    file_changed: u64,
}

fn one_crash(seed: u64, threads: usize, mode: Mode, kill: Kill, st: &mut Stats) {
    let d = tmp();
    let dir = d.path();
    let init = init_content(seed);
    std::fs::write(dir.join("data"), &init).unwrap();
    std::fs::write(dir.join("ack"), vec![0u8; 16 * threads]).unwrap();
    let delay_us = 500 + mix(seed) % 150_000;
    let spec = format!(
        "{};{seed};{threads};{};{}",
        dir.display(),
        if mode == Mode::Shared {
            "shared"
        } else {
            "private"
        },
        if kill == Kill::AtFlush { delay_us } else { 0 }
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = match kill {
        Kill::Random => {
            std::thread::sleep(Duration::from_micros(delay_us));
            // SAFETY: sending SIGKILL to our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            child.wait().unwrap()
        }
        Kill::AtFlush => {
            // The child arms the trap itself after `delay_us` (from its start, not ours); a
            // flush follows within a few milliseconds (threshold, log waiters, or the
            // 200 ms period at the latest).
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break s;
                }
                if Instant::now() > deadline {
                    // SAFETY: sending SIGKILL to our own child.
                    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                    break child.wait().unwrap();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    match (kill, status.signal()) {
        (Kill::Random, Some(libc::SIGKILL)) => {}
        (Kill::AtFlush, Some(libc::SIGSYS)) => st.killed_in_flush += 1,
        (Kill::AtFlush, Some(libc::SIGKILL)) => st.trap_missed += 1,
        _ => panic!("child did not die as planned ({kill:?}): {status:?} (seed {seed})"),
    }
    st.iters += 1;
    let acks = std::fs::read(dir.join("ack")).unwrap();
    let word = |off: u64| {
        let o = off as usize;
        u64::from_le_bytes(acks[o..o + 8].try_into().unwrap())
    };
    let acked: Vec<u64> = (0..threads)
        .map(|t| word(ack_off(threads, t, false)))
        .collect();
    let entered: Vec<u64> = (0..threads)
        .map(|t| word(ack_off(threads, t, true)))
        .collect();
    if acked.iter().zip(&entered).any(|(a, e)| e > a) {
        st.killed_in_commit += 1;
    }
    let inst = dir.join("inst");
    let before = std::fs::read(dir.join("data")).unwrap();
    if inst.join("meta.pool").exists() {
        let rep = recover(&inst).unwrap_or_else(|e| panic!("recover failed (seed {seed}): {e}"));
        // Recovery is idempotent: running it again changes nothing.
        let after = std::fs::read(dir.join("data")).unwrap();
        let again = recover(&inst).unwrap();
        assert!(again.was_clean);
        assert_eq!(std::fs::read(dir.join("data")).unwrap(), after);
        st.dirty_pages_written += rep.dirty_pages_written as u64;
        st.replayed += rep.transactions_replayed as u64;
        st.iters_replayed += (rep.transactions_replayed > 0) as u64;
        st.file_changed += (after != before) as u64;
    } else {
        st.no_instance += 1;
    }
    let got = std::fs::read(dir.join("data")).unwrap();
    assert_eq!(got.len(), init.len());
    let per = SLOTS / threads;
    for (t, &acked_t) in acked.iter().enumerate() {
        let tseed = seed ^ ((t as u64) << 40);
        let range = t * per * SLOT..(t + 1) * per * SLOT;
        let (init_t, got_t) = (&init[range.clone()], &got[range]);
        match matching_prefix(init_t, got_t, tseed, acked_t, acked_t + 1, per, 0) {
            Some(n) => st.in_flight_present += (n > acked_t) as u64,
            None => {
                let near = matching_prefix(init_t, got_t, tseed, 0, acked_t + 50, per, 0);
                panic!(
                    "seed {seed} ({mode:?}, {kill:?}), thread {t}/{threads}: after recovery its \
                     slots are not the state after its {acked_t} acknowledged transactions (or \
                     one more); closest exact prefix: {near:?}"
                );
            }
        }
    }
    st.acked += acked.iter().sum::<u64>();
    // The instance starts again after recovery (and removes the stale shared-memory objects a
    // killed user leaves).
    if inst.join("meta.pool").exists() {
        let vn = nv_init(&child_cfg(dir)).unwrap();
        vn.nv_release().unwrap();
    }
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
    let mut private = Stats::default();
    let mut shared = Stats::default();
    for k in 0..iters {
        let threads = 1 + (k % 3) as usize;
        let (mode, kill, st) = match k % 4 {
            0 | 2 => (Mode::Private, Kill::Random, &mut private),
            1 => (Mode::Shared, Kill::Random, &mut shared),
            _ => (Mode::Shared, Kill::AtFlush, &mut shared),
        };
        one_crash(mix(base + k), threads, mode, kill, st);
    }
    for (name, s) in [("private", &private), ("shared", &shared)] {
        eprintln!(
            "{name}: {} crash points ({} in a commit, {} in a flush, {} flush traps missed, {} \
             before the pools existed): {} acknowledged transactions checked, {} in-flight \
             transactions found complete; recovery wrote {} dirty pages, replayed {} \
             transactions (at {} crash points) and changed the file at {} crash points",
            s.iters,
            s.killed_in_commit,
            s.killed_in_flush,
            s.trap_missed,
            s.no_instance,
            s.acked,
            s.in_flight_present,
            s.dirty_pages_written,
            s.replayed,
            s.iters_replayed,
            s.file_changed,
        );
    }
}
