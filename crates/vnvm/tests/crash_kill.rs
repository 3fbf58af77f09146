//! kill -9 at random points (during nv_write, commit, redo, writeback, shared-region flush),
//! then recover: every acknowledged transaction is present entirely, every never-committed one
//! entirely absent — for private regions and for shared ones.
//!
//! The test re-executes its own binary as the victim (the ignored `crash_child`, run with
//! `--ignored --exact` and `TIERMEM_VNVM_CRASH_CHILD` set). `TIERMEM_VNVM_CRASH_ITERS` sets the
//! number of crash points (default 50), `TIERMEM_VNVM_CRASH_SEED` the base seed. Crash point `k`
//! uses, by `k % 8`:
//!
//! * 0, 4: a private region, killed with SIGKILL at a random time; at 4 the victim commits in
//!   staged groups of 4 (`nv_commit_staged` ×4, then one `nv_sync`: group commit) on a disk
//!   file system (/var/tmp: msync-backed pools, so the commit journal and its replay), and
//!   recovery must find each thread at a transaction boundary between its acknowledged ones
//!   and the last one of the group in flight;
//! * 2: a private region, killed inside a commit: after a random delay, the victim SIGKILLs
//!   itself from a signal handler that interrupted a worker inside `nv_commit` (a timer each
//!   worker sets for a few microseconds later as it enters a commit);
//! * 1: a shared region (`Mode::Shared`: the backing file itself is the DRAM cache, each commit
//!   links into the region's own committed list, flushes msync and drop the logs), killed with
//!   SIGKILL at a random time;
//! * 5: a shared region killed inside a commit, as at 2;
//! * 6: a shared region killed outside every commit: after a random delay, the victim SIGKILLs
//!   itself from a signal handler (signals every 100 µs) that finds no worker in a commit;
//! * 3, 7: a shared region killed by a seccomp filter the victim arms after a random delay that
//!   kills it at its next `msync` — which only a shared-region flush issues (the pools on tmpfs
//!   persist with cache flushes; private writeback uses fdatasync) — so the crash lands inside
//!   a flush, after it marked the list's tail and before it dropped the logs;
//!
//! and 1, 2 or 3 threads (`1 + k % 3`), so 24 consecutive points cover every combination.
//! Whether a thread was inside a commit is read from the ack file after the kill, whatever the
//! kill aimed at. Each mode must have been killed outside a commit and inside one, and the
//! shared mode inside a flush: a category the points missed (only 1 to 7 points, or a flush
//! trap that did not fire) gets up to 12 more points aimed at it, then the test fails.

mod common;
use common::*;
use std::cell::Cell;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
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
    /// SIGKILLed by itself, after a random delay, at a point where one of its workers is
    /// inside a commit (between the two acknowledgements: most often inside `nv_commit`).
    InCommit,
    /// SIGKILLed by itself, after a random delay, at a point where none of its workers is
    /// inside a commit.
    OutsideCommit,
}

/// The ack file: per thread `t`, at `8 * t` the number of transactions whose `nv_commit`
/// returned, at `8 * (threads + t)` the number of the transaction whose `nv_commit` it entered
/// last (1-based). A thread was killed inside a commit iff the second is larger.
fn ack_off(threads: usize, t: usize, entering: bool) -> u64 {
    8 * (t + if entering { threads } else { 0 }) as u64
}

/// The kills aimed at a commit or away from one (`Kill::InCommit`, `Kill::OutsideCommit`):
/// armed after a delay, they send workers [`AIM_SIGNAL`], and a worker whose handler finds
/// itself where the kill is aimed SIGKILLs the process from there, so it dies at the very
/// instruction the signal interrupted; otherwise the handler returns and the kill tries again.
/// Aimed at a commit, each worker entering a commit sets a timer of its own to signal it a few
/// microseconds later (inside `nv_commit` unless it was faster); aimed away from the commits,
/// a killer thread signals every worker every 100 µs, and the handler kills only when no
/// worker is inside a commit.
const AIM_SIGNAL: libc::c_int = libc::SIGUSR1;
/// Aim at a commit (else away from every commit).
static AIM_IN_COMMIT: AtomicBool = AtomicBool::new(false);
static AIM_ARMED: AtomicBool = AtomicBool::new(false);
/// The workers' thread ids (0: not started).
static WORKER_TIDS: [AtomicI32; 3] = [const { AtomicI32::new(0) }; 3];
/// Workers from just before their first acknowledgement of a commit to just after the second.
static COMMITTING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This worker is between the two acknowledgements of a commit.
    static IN_COMMIT: Cell<bool> = const { Cell::new(false) };
}

extern "C" fn on_aim_signal(_: libc::c_int) {
    let here = if AIM_IN_COMMIT.load(Ordering::SeqCst) {
        IN_COMMIT.with(Cell::get)
    } else {
        COMMITTING.load(Ordering::SeqCst) == 0
    };
    if here {
        // SAFETY: kill(2) is async-signal-safe; SIGKILL to this very process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Arm the aimed kill after `delay`; aimed away from the commits, then signal the workers until
/// the process dies.
fn arm_aimed_kill(delay: Duration, in_commit: bool) {
    AIM_IN_COMMIT.store(in_commit, Ordering::SeqCst);
    // SAFETY: installing a handler that only reads atomics and a thread-local and calls
    // kill(2); SA_RESTART so that a signal the handler ignores fails no system call.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_aim_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(AIM_SIGNAL, &sa, std::ptr::null_mut()), 0);
    }
    std::thread::sleep(delay);
    AIM_ARMED.store(true, Ordering::SeqCst);
    if in_commit {
        return;
    }
    loop {
        std::thread::sleep(Duration::from_micros(100));
        for tid in &WORKER_TIDS {
            let tid = tid.load(Ordering::SeqCst);
            if tid != 0 {
                // SAFETY: signalling a thread of this process.
                unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, AIM_SIGNAL) };
            }
        }
    }
}

/// A one-shot timer that signals the calling thread with [`AIM_SIGNAL`] (timer slack 1 ns, so
/// that it fires when asked, not up to 50 µs later).
struct ThreadTimer(libc::timer_t);

impl ThreadTimer {
    fn new() -> ThreadTimer {
        // SAFETY: a zeroed sigevent is valid; the fields set make it signal this thread; the
        // timer id is written by timer_create.
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0), 0);
            let mut ev: libc::sigevent = std::mem::zeroed();
            ev.sigev_notify = libc::SIGEV_THREAD_ID;
            ev.sigev_signo = AIM_SIGNAL;
            ev.sigev_notify_thread_id = libc::gettid();
            let mut id: libc::timer_t = std::ptr::null_mut();
            assert_eq!(
                libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut id),
                0
            );
            ThreadTimer(id)
        }
    }

    fn fire_in(&self, ns: i64) {
        let t = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: ns,
            },
        };
        // SAFETY: a timer of this process and a valid itimerspec.
        assert_eq!(
            unsafe { libc::timer_settime(self.0, 0, &t, std::ptr::null_mut()) },
            0
        );
    }
}

/// The victim: runs the workload forever, acknowledging each commit in `ack`. Run only as a
/// child process of `kill9_at_random_points_then_recover` (with `--ignored --exact`).
#[test]
#[ignore = "helper: run only as a child process"]
fn crash_child() {
    let spec = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("helper only: run by kill9_at_random_points_then_recover with {CHILD_ENV} set")
    });
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
    // Microseconds after which to arm the aimed kill (0: never), and its aim.
    let aim_us: u64 = it.next().unwrap().parse().unwrap();
    let aim_in_commit = match it.next().unwrap() {
        "in" => true,
        "out" => false,
        a => panic!("aim {a}"),
    };
    // Transactions per staged group (1: plain nv_commit).
    let group: u64 = it.next().unwrap().parse().unwrap();
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
        if aim_us > 0 {
            sc.spawn(move || arm_aimed_kill(Duration::from_micros(aim_us), aim_in_commit));
        }
        for t in 0..threads {
            let (vn, r, ack) = (&vn, &r, &ack);
            sc.spawn(move || worker(vn, r, ack, seed, t, threads, group));
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
    group: u64,
) {
    let per = SLOTS / threads;
    let tseed = seed ^ ((t as u64) << 40);
    // SAFETY: gettid(2) has no arguments.
    WORKER_TIDS[t].store(unsafe { libc::gettid() }, Ordering::SeqCst);
    let mut timer = None;
    // With `group > 1`, transactions go in groups of `group`: staged (`nv_commit_staged`) one
    // by one, then one `nv_sync` of the last ticket; the ack's "entering" word names the
    // group's last transaction before the first is staged, "left" after the sync.
    for i in 0u64.. {
        let (first, last) = (i % group == 0, i % group == group - 1);
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
        if first {
            COMMITTING.fetch_add(1, Ordering::SeqCst);
            ack.write_all_at(&(i + group).to_le_bytes(), ack_off(threads, t, true))
                .unwrap();
        }
        IN_COMMIT.with(|c| c.set(true));
        if AIM_ARMED.load(Ordering::SeqCst) && AIM_IN_COMMIT.load(Ordering::SeqCst) {
            // 2 to 30 µs into the commit (a private one takes about 15 µs, a shared one 30).
            timer
                .get_or_insert_with(ThreadTimer::new)
                .fire_in(2_000 + (mix(i) % 29) as i64 * 1_000);
        }
        if group == 1 {
            vn.nv_commit(tid).unwrap();
        } else {
            let ticket = vn.nv_commit_staged(tid).unwrap();
            if !last {
                continue;
            }
            vn.nv_sync(ticket).unwrap();
        }
        IN_COMMIT.with(|c| c.set(false));
        ack.write_all_at(&(i + 1).to_le_bytes(), ack_off(threads, t, false))
            .unwrap();
        COMMITTING.fetch_sub(1, Ordering::SeqCst);
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
    /// Crash points after the pools existed where no thread was inside nv_commit (and no
    /// flush trap fired).
    killed_outside_commit: u64,
    /// Crash points where some thread was inside nv_commit.
    killed_in_commit: u64,
    /// Crash points with a kill aimed at a commit or away from one, those that landed where
    /// aimed, and those where the victim did not kill itself in time (SIGKILL instead).
    aimed: u64,
    aimed_landed: u64,
    aimed_missed: u64,
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
    /// Crash points added after the schedule to hit a category it missed.
    top_up: u64,
}

fn one_crash(seed: u64, threads: usize, mode: Mode, kill: Kill, group: u64, st: &mut Stats) {
    // Staged groups run on a disk file system: msync-backed pools, the commit journal.
    let d = if group > 1 {
        tempfile::Builder::new()
            .prefix("tiermem-vnvm-test")
            .tempdir_in("/var/tmp")
            .unwrap()
    } else {
        tmp()
    };
    let dir = d.path();
    let init = init_content(seed);
    std::fs::write(dir.join("data"), &init).unwrap();
    std::fs::write(dir.join("ack"), vec![0u8; 16 * threads]).unwrap();
    let delay_us = 500 + mix(seed) % 150_000;
    let aimed = matches!(kill, Kill::InCommit | Kill::OutsideCommit);
    let spec = format!(
        "{};{seed};{threads};{};{};{};{};{}",
        dir.display(),
        if mode == Mode::Shared {
            "shared"
        } else {
            "private"
        },
        if kill == Kill::AtFlush { delay_us } else { 0 },
        if aimed { delay_us } else { 0 },
        if kill == Kill::InCommit { "in" } else { "out" },
        group
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
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
        Kill::AtFlush | Kill::InCommit | Kill::OutsideCommit => {
            // The child arms its trap itself after `delay_us` (from its start, not ours); a
            // flush follows within a few milliseconds (threshold, log waiters, or the
            // 200 ms period at the latest), a commit within a millisecond.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break s;
                }
                if Instant::now() > deadline {
                    // SAFETY: sending SIGKILL to our own child.
                    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                    let s = child.wait().unwrap();
                    if aimed && s.signal() == Some(libc::SIGKILL) {
                        st.aimed_missed += 1;
                    }
                    break s;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    let mut in_flush = false;
    match (kill, status.signal()) {
        (Kill::Random | Kill::InCommit | Kill::OutsideCommit, Some(libc::SIGKILL)) => {}
        (Kill::AtFlush, Some(libc::SIGSYS)) => in_flush = true,
        (Kill::AtFlush, Some(libc::SIGKILL)) => st.trap_missed += 1,
        _ => panic!("child did not die as planned ({kill:?}): {status:?} (seed {seed})"),
    }
    st.killed_in_flush += in_flush as u64;
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
    let in_commit = acked.iter().zip(&entered).any(|(a, e)| e > a);
    st.killed_in_commit += in_commit as u64;
    if aimed {
        st.aimed += 1;
        st.aimed_landed += (in_commit == (kill == Kill::InCommit)) as u64;
    }
    let inst = dir.join("inst");
    st.killed_outside_commit += (!in_commit && !in_flush && inst.join("meta.pool").exists()) as u64;
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
        // Any prefix from the acknowledged transactions to the last one entered (one more
        // with plain commits, up to a whole staged group): never a part of a transaction.
        let upto = entered[t].max(acked_t + 1);
        match matching_prefix(init_t, got_t, tseed, acked_t, upto, per, 0) {
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
        // k % 8 == 4: staged commits synced in groups of 4 (group commit).
        let group = if k % 8 == 4 { 4 } else { 1 };
        let (mode, kill, st) = match k % 8 {
            0 | 4 => (Mode::Private, Kill::Random, &mut private),
            2 => (Mode::Private, Kill::InCommit, &mut private),
            1 => (Mode::Shared, Kill::Random, &mut shared),
            5 => (Mode::Shared, Kill::InCommit, &mut shared),
            6 => (Mode::Shared, Kill::OutsideCommit, &mut shared),
            _ => (Mode::Shared, Kill::AtFlush, &mut shared),
        };
        one_crash(mix(base + k), threads, mode, kill, group, st);
    }
    // Each crash category must have been hit in each mode (a flush only in shared mode). The
    // schedule above normally hits them all; a category it missed (an unlucky timing) gets up
    // to TOP_UP more crash points of the kind aimed at it.
    const TOP_UP: u64 = 12;
    let mut k = iters;
    for (mode, st) in [(Mode::Private, &mut private), (Mode::Shared, &mut shared)] {
        let aims = [
            (
                Kill::OutsideCommit,
                (|s: &Stats| s.killed_outside_commit) as fn(&Stats) -> u64,
            ),
            (Kill::InCommit, |s: &Stats| s.killed_in_commit),
            (Kill::AtFlush, |s: &Stats| s.killed_in_flush),
        ];
        for (kill, hits) in aims {
            if kill == Kill::AtFlush && mode == Mode::Private {
                continue;
            }
            for _ in 0..TOP_UP {
                if hits(st) > 0 {
                    break;
                }
                eprintln!("{mode:?}: no crash point hit by {kill:?} yet: one more");
                one_crash(mix(base + k), 1 + (k % 3) as usize, mode, kill, 1, st);
                st.top_up += 1;
                k += 1;
            }
        }
    }
    for (name, s) in [("private", &private), ("shared", &shared)] {
        eprintln!(
            "{name}: {} crash points ({} added; {} outside a commit, {} in a commit, {} in a \
             flush, {} flush traps missed, {} of {} aimed kills landed where aimed and {} \
             missed, {} before the pools existed): \
             {} acknowledged transactions checked, {} in-flight transactions found complete; \
             recovery wrote {} dirty pages, replayed {} transactions (at {} crash points) and \
             changed the file at {} crash points",
            s.iters,
            s.top_up,
            s.killed_outside_commit,
            s.killed_in_commit,
            s.killed_in_flush,
            s.trap_missed,
            s.aimed_landed,
            s.aimed,
            s.aimed_missed,
            s.no_instance,
            s.acked,
            s.in_flight_present,
            s.dirty_pages_written,
            s.replayed,
            s.iters_replayed,
            s.file_changed,
        );
    }
    for (name, s) in [("private", &private), ("shared", &shared)] {
        assert!(
            s.killed_outside_commit > 0,
            "{name}: no crash point killed the victim outside a commit"
        );
        assert!(
            s.killed_in_commit > 0,
            "{name}: no crash point killed the victim inside a commit"
        );
    }
    assert!(
        shared.killed_in_flush > 0,
        "shared: no crash point killed the victim inside a flush"
    );
}
