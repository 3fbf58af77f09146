//! Several processes share one instance (thesis §2.4.1, §2.4.4): four processes each write a
//! private region (disjoint files) and one shared region (a disjoint stripe each plus one block
//! they all overwrite), through pools small enough that the equal-share policy, eviction,
//! writeback and shared-region flushes all run. Then one of the four is killed (kill -9) at
//! random points: the others must neither block nor lose anything, and the victim's
//! acknowledged transactions must be in its files once the survivors have reaped it.
//!
//! The test re-executes its own binary as the workers (the ignored `mp_child`, run with
//! `--ignored --exact` and `TIERMEM_VNVM_MP_CHILD` set). `TIERMEM_VNVM_MP_KILLS` sets the
//! number of kill rounds (default 3).

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tiermem_vnvm::{nv_init, recover, Mode, Vnvm, VnvmError};

const CHILD_ENV: &str = "TIERMEM_VNVM_MP_CHILD";
const PRIV_SIZE: usize = 16 * 4096;
const SHARED_SIZE: usize = 16 * 4096;
const STRIPE: usize = 8192;
const PRIV_SLOTS: u64 = 16;
const SHARED_SLOTS: u64 = 64;
/// The block every process overwrites: 256 bytes across the boundary of pages 8 and 9.
const OVERLAP: usize = 9 * 4096 - 128;
const OVERLAP_LEN: usize = 256;

fn cfg(dir: &Path) -> tiermem_vnvm::VnvmConfig {
    // 64 log pages and 32 cache pages for four users: 16 and 8 each.
    small_cfg(dir, 64, 32)
}

/// Log `data` at `dst`, waiting for log space as long as needed.
fn write_all(vn: &Vnvm, tid: u64, dst: *const u8, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: the callers keep dst..dst + data.len() inside their regions.
        match vn.nv_write(tid, unsafe { dst.add(done) }, &data[done..]) {
            Ok(n) => done += n,
            Err(VnvmError::LogFull { .. }) => {
                vn.nv_wait_log_space(Duration::from_millis(20));
            }
            Err(e) => panic!("nv_write: {e}"),
        }
    }
}

fn words(v: u64, n: usize) -> Vec<u8> {
    (0..n).flat_map(|_| v.to_le_bytes()).collect()
}

/// A worker process: `dir;idx;n` (n = 0: run until killed). Transaction i of the private
/// region writes i at 0 and a 64-byte record of i at slot i % 16; of the shared region, i at
/// its stripe's start, a record at stripe slot i % 64, and the shared block tagged (idx, i).
/// After each commit, the pair of last committed numbers goes to `ack<idx>`. Run only as a
/// child process of the tests below (with `--ignored --exact`).
#[test]
#[ignore = "helper: run only as a child process"]
fn mp_child() {
    let spec = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("helper only: run by the tests of this file with {CHILD_ENV} set")
    });
    let mut it = spec.split(';');
    let dir = Path::new(it.next().unwrap());
    let idx: usize = it.next().unwrap().parse().unwrap();
    let n: u64 = it.next().unwrap().parse().unwrap();
    let ack = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(format!("ack{idx}")))
        .unwrap();
    let vn = nv_init(&cfg(dir)).unwrap();
    let p = vn
        .nv_allocate(dir.join(format!("priv{idx}")), PRIV_SIZE, Mode::Private)
        .unwrap();
    let s = vn
        .nv_allocate(dir.join("shared"), SHARED_SIZE, Mode::Shared)
        .unwrap();
    let stripe = idx * STRIPE;
    let mut i = 1u64;
    while n == 0 || i <= n {
        let tid = vn.nv_txbegin();
        write_all(&vn, tid, p.as_ptr(), &i.to_le_bytes());
        let slot = (i % PRIV_SLOTS) as usize * 4096 + 64;
        // SAFETY: slot + 64 ≤ PRIV_SIZE.
        write_all(&vn, tid, unsafe { p.as_ptr().add(slot) }, &words(i, 8));
        vn.nv_commit(tid).unwrap();
        ack.write_all_at(&i.to_le_bytes(), 0).unwrap();
        let tid = vn.nv_txbegin();
        // SAFETY: every offset below stays inside the 64 KiB shared region.
        unsafe {
            write_all(&vn, tid, s.as_ptr().add(stripe), &i.to_le_bytes());
            let slot = stripe + 64 + 64 * (i % SHARED_SLOTS) as usize;
            write_all(&vn, tid, s.as_ptr().add(slot), &words(i, 8));
            let tag = (idx as u64) << 56 | i;
            write_all(
                &vn,
                tid,
                s.as_ptr().add(OVERLAP),
                &words(tag, OVERLAP_LEN / 8),
            );
        }
        vn.nv_commit(tid).unwrap();
        ack.write_all_at(&i.to_le_bytes(), 8).unwrap();
        i += 1;
    }
    vn.nv_release().unwrap();
}

fn spawn(dir: &Path, idx: usize, n: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "mp_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{};{idx};{n}", dir.display()))
        .spawn()
        .unwrap()
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn acked(dir: &Path, idx: usize) -> (u64, u64) {
    let b = std::fs::read(dir.join(format!("ack{idx}"))).unwrap_or_default();
    if b.len() < 16 {
        return (if b.len() >= 8 { u64_at(&b, 0) } else { 0 }, 0);
    }
    (u64_at(&b, 0), u64_at(&b, 8))
}

/// The latest i ≤ last with i % slots == k (0: none).
fn latest(last: u64, slots: u64, k: u64) -> u64 {
    if last < k || (k == 0 && last < slots) {
        return 0;
    }
    (last - k) / slots * slots + k
}

/// Check worker `idx`'s files: a prefix of its transactions at least as long as acknowledged.
/// Returns its last shared transaction.
fn verify(dir: &Path, idx: usize, at_least: (u64, u64)) -> u64 {
    let b = std::fs::read(dir.join(format!("priv{idx}"))).unwrap();
    let f = u64_at(&b, 0);
    assert!(
        f >= at_least.0,
        "worker {idx}: private counter {f} < acknowledged {}",
        at_least.0
    );
    for k in 0..PRIV_SLOTS {
        let want = words(latest(f, PRIV_SLOTS, k), 8);
        let off = k as usize * 4096 + 64;
        assert_eq!(
            &b[off..off + 64],
            &want[..],
            "worker {idx}: private slot {k} (counter {f})"
        );
    }
    let s = std::fs::read(dir.join("shared")).unwrap();
    let stripe = idx * STRIPE;
    let g = u64_at(&s, stripe);
    assert!(
        g >= at_least.1,
        "worker {idx}: shared counter {g} < acknowledged {}",
        at_least.1
    );
    for k in 0..SHARED_SLOTS {
        let want = words(latest(g, SHARED_SLOTS, k), 8);
        let off = stripe + 64 + 64 * k as usize;
        assert_eq!(
            &s[off..off + 64],
            &want[..],
            "worker {idx}: shared slot {k} (counter {g})"
        );
    }
    g
}

/// The shared block is one transaction's, entirely, and a committed one.
fn verify_overlap(dir: &Path, last: &[u64]) {
    let s = std::fs::read(dir.join("shared")).unwrap();
    let block = &s[OVERLAP..OVERLAP + OVERLAP_LEN];
    let w = u64_at(block, 0);
    assert_eq!(
        block,
        &words(w, OVERLAP_LEN / 8)[..],
        "the shared block is torn"
    );
    let (who, i) = ((w >> 56) as usize, w & ((1 << 56) - 1));
    assert!(
        who < last.len() && i >= 1 && i <= last[who],
        "block tag {who}/{i} was never committed"
    );
}

fn wait_all(children: &mut [Child], limit: Duration) {
    let deadline = Instant::now() + limit;
    for c in children.iter_mut() {
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "a worker failed: {st}");
                break;
            }
            if Instant::now() > deadline {
                for c in children.iter_mut() {
                    let _ = c.kill();
                }
                panic!("workers blocked for {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn four_processes_private_and_shared_regions() {
    let d = tmp();
    let n = 300;
    let mut kids: Vec<Child> = (0..4).map(|k| spawn(d.path(), k, n)).collect();
    wait_all(&mut kids, Duration::from_secs(120));
    let last: Vec<u64> = (0..4).map(|k| verify(d.path(), k, (n, n))).collect();
    assert!(last.iter().all(|&g| g == n));
    verify_overlap(d.path(), &last);
    // The last user shut the instance down cleanly.
    assert!(recover(cfg(d.path()).dir).unwrap().was_clean);
}

#[test]
fn kill_one_of_four_processes() {
    let rounds: u64 = std::env::var("TIERMEM_VNVM_MP_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let seed = std::env::var("TIERMEM_VNVM_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(tiermem_media::now_ns);
    eprintln!("kill rounds {rounds}, seed {seed}");
    for round in 0..rounds {
        let d = tmp();
        let dir = d.path();
        // The victim runs until killed; the others run a fixed number of transactions.
        let mut victim = spawn(dir, 0, 0);
        let n = 3000;
        let mut kids: Vec<Child> = (1..4).map(|k| spawn(dir, k, n)).collect();
        let kill_after = 5 + mix(seed ^ round) % 150;
        let t0 = Instant::now();
        while acked(dir, 0).1 < kill_after {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "victim made no progress"
            );
            if let Some(st) = victim.try_wait().unwrap() {
                panic!("victim exited: {st}");
            }
            std::thread::sleep(Duration::from_micros(200 + mix(seed ^ round ^ 7) % 2000));
        }
        victim.kill().unwrap();
        victim.wait().unwrap();
        let ack0 = acked(dir, 0);
        eprintln!("round {round}: killed the victim after {ack0:?} acknowledged");
        // The survivors finish: the victim blocks nobody.
        wait_all(&mut kids, Duration::from_secs(120));
        // Normally a survivor reaped the victim (its committed logs reached its file) and the
        // last one to leave shut the instance down cleanly. On a loaded machine the survivors
        // may all have left before the victim died: nobody was there to reap it, and its
        // committed logs wait in NVM for the next nv_init or recover. Either way, after
        // recovery every acknowledged transaction is in the files.
        let rep = recover(cfg(dir).dir).unwrap();
        eprintln!(
            "round {round}: {}",
            if rep.was_clean {
                "reaped by a survivor".to_string()
            } else {
                format!(
                    "the survivors had left before the victim died; recovery replayed {} \
                     transactions",
                    rep.transactions_replayed
                )
            }
        );
        let mut last = vec![verify(dir, 0, ack0)];
        last.extend((1..4).map(|k| verify(dir, k, (n, n))));
        verify_overlap(dir, &last);
    }
}

#[test]
fn a_dead_user_is_reaped_by_a_live_one() {
    // In-process: a user abandoned as a crash leaves it (its liveness lock is gone) is reaped
    // by the other user's next nv_init-free pass: its log pages return and its committed data
    // reach its file.
    let d = tmp();
    let c = cfg(d.path());
    let a = nv_init(&c).unwrap();
    let b = nv_init(&c).unwrap();
    let rb = b
        .nv_allocate(d.path().join("b"), PRIV_SIZE, Mode::Private)
        .unwrap();
    let tid = b.nv_txbegin();
    write_all(&b, tid, rb.as_ptr(), b"committed by b");
    b.nv_commit(tid).unwrap();
    let open = b.nv_txbegin();
    write_all(&b, open, rb.as_ptr(), b"never committed");
    let free_before = a.stats().free_log_pages;
    b.abandon();
    drop(rb);
    let t0 = Instant::now();
    while a.stats().users != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the dead user was not reaped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(a.stats().free_log_pages > free_before);
    let f = std::fs::read(d.path().join("b")).unwrap();
    assert_eq!(&f[..14], b"committed by b");
    // Its path can be allocated again.
    let again = a
        .nv_allocate(d.path().join("b"), PRIV_SIZE, Mode::Private)
        .unwrap();
    assert_eq!(&region_bytes(&again)[..14], b"committed by b");
    a.nv_release().unwrap();
}

#[test]
fn equal_shares_of_log_and_cache() {
    let d = tmp();
    let c = small_cfg(d.path(), 16, 32);
    let a = nv_init(&c).unwrap();
    let ra = a
        .nv_allocate(d.path().join("a"), 64 * 4096, Mode::Private)
        .unwrap();
    // Alone, a may fill the whole cache: one byte into each of 64 pages, committed.
    for p in 0..64usize {
        let t = a.nv_txbegin();
        // SAFETY: p * 4096 < 64 pages.
        write_all(&a, t, unsafe { ra.as_ptr().add(p * 4096) }, &[1]);
        a.nv_commit(t).unwrap();
    }
    a.drain().unwrap();
    assert!(a.stats().cache_pages_held > 16, "{:?}", a.stats());
    // A second user halves the shares; a's writeback worker gives the surplus back.
    let b = nv_init(&c).unwrap();
    let t0 = Instant::now();
    while a.stats().cache_pages_held > 16 {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", a.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    // An open transaction of a cannot take more than its half of the log.
    let t = a.nv_txbegin();
    let big = vec![7u8; 64 * 4096];
    let mut logged = 0;
    loop {
        // SAFETY: logged < 64 pages.
        match a.nv_write(t, unsafe { ra.as_ptr().add(logged) }, &big[logged..]) {
            Ok(n) => logged += n,
            Err(VnvmError::LogFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(a.stats().log_pages_held, 8);
    // b still gets its share.
    let rb = b
        .nv_allocate(d.path().join("b"), 4096, Mode::Private)
        .unwrap();
    let tb = b.nv_txbegin();
    write_all(&b, tb, rb.as_ptr(), b"b's share");
    b.nv_commit(tb).unwrap();
    a.nv_abort(t).unwrap();
    b.nv_release().unwrap();
    assert_eq!(a.stats().users, 1);
    a.nv_release().unwrap();
}

const SHARED_RUN_ENV: &str = "TIERMEM_VNVM_MP_SHARED_RUN";

/// A worker of `four_processes_long_runs_of_shared_commits`: `dir;idx;n`. Transaction i writes
/// i at its stripe's start and 1–12 KiB of i's bytes after it (up to three log pages), and
/// every 500 transactions it leaves the region and joins it again.
#[test]
#[ignore = "helper: run only as a child process"]
fn mp_shared_run_child() {
    let spec = std::env::var(SHARED_RUN_ENV).unwrap_or_else(|_| {
        panic!(
            "helper only: run by four_processes_long_runs_of_shared_commits with \
             {SHARED_RUN_ENV} set"
        )
    });
    let mut it = spec.split(';');
    let dir = Path::new(it.next().unwrap());
    let idx: usize = it.next().unwrap().parse().unwrap();
    let n: u64 = it.next().unwrap().parse().unwrap();
    let vn = nv_init(&cfg(dir)).unwrap();
    let path = dir.join("shared");
    let mut s = vn.nv_allocate(&path, SHARED_SIZE, Mode::Shared).unwrap();
    let stripe = idx * STRIPE;
    for i in 1..=n {
        if i % 500 == 0 {
            vn.nv_free(s).unwrap();
            s = vn.nv_allocate(&path, SHARED_SIZE, Mode::Shared).unwrap();
        }
        let len = 1 + (mix(i ^ (idx as u64) << 32) % (STRIPE as u64 - 9)) as usize;
        let tid = vn.nv_txbegin();
        // SAFETY: stripe + 8 + len ≤ stripe + STRIPE, inside the region.
        unsafe {
            write_all(&vn, tid, s.as_ptr().add(stripe), &i.to_le_bytes());
            write_all(&vn, tid, s.as_ptr().add(stripe + 8), &vec![i as u8; len]);
        }
        vn.nv_commit(tid).unwrap();
    }
    vn.nv_release().unwrap();
}

/// Four processes, each with a long run of shared-region commits of up to three log pages
/// through a 64-page log, leaving and rejoining the region now and then: the log objects never
/// run out (every committed transaction holds a log page, and flushes return both), nobody
/// blocks, and every stripe ends with its last transaction.
#[test]
fn four_processes_long_runs_of_shared_commits() {
    let d = tmp();
    let n = 3000;
    let mut kids: Vec<Child> = (0..4)
        .map(|k| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "mp_shared_run_child", "--nocapture"])
                .env(SHARED_RUN_ENV, format!("{};{k};{n}", d.path().display()))
                .spawn()
                .unwrap()
        })
        .collect();
    wait_all(&mut kids, Duration::from_secs(120));
    let s = std::fs::read(d.path().join("shared")).unwrap();
    for k in 0..4 {
        assert_eq!(u64_at(&s, k * STRIPE), n, "stripe {k}");
        let len = 1 + (mix(n ^ (k as u64) << 32) % (STRIPE as u64 - 9)) as usize;
        let data = &s[k * STRIPE + 8..k * STRIPE + 8 + len];
        assert!(data.iter().all(|&b| b == n as u8), "stripe {k} data");
    }
    assert!(recover(cfg(d.path()).dir).unwrap().was_clean);
}
