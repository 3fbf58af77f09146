//! Multi-process soak: four worker processes run random private and shared transactions of
//! random sizes over overlapping ranges through one small instance (log and cache pressure,
//! equal shares, shared-region flushes, LogFull waits), abort some, leave and rejoin the shared
//! region now and then, and are killed (kill -9) at random — one at a time (a live user reaps
//! the victim) or all at once (then `recover`). After every recovery — in each restarted worker
//! and in the parent after a kill of all — and at the end, every acknowledged transaction must
//! be there and nothing uncommitted.
//!
//! What is checked, per worker `k` (its acknowledgements go to `ack<k>` after each commit):
//!
//! * its private region `priv<k>` equals the replay of its first `c` private transactions,
//!   where `c` (a counter the transactions write) is at least the acknowledged count and at
//!   most the count it had entered `nv_commit` for;
//! * its stripe of the shared region likewise (only `k` writes there);
//! * the overlap area of the shared region (every worker writes random runs of 64-byte slots
//!   there) holds only whole, checksummed slots of committed transactions (tag ≤ the writer's
//!   counter), never bytes of an aborted or uncommitted one.
//!
//! The test re-executes its own binary as the workers (`soak_child` with
//! `TIERMEM_VNVM_SOAK_CHILD` set). Runs ~20 s by default; `TIERMEM_VNVM_SOAK_S` sets the
//! duration (hours are fine), `TIERMEM_VNVM_SOAK_SEED` the seed.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tiermem_vnvm::{nv_init, recover, Mode, Region, Vnvm, VnvmError};

const CHILD_ENV: &str = "TIERMEM_VNVM_SOAK_CHILD";
const WORKERS: usize = 4;
const PRIV_SIZE: usize = 96 << 10;
const STRIPE: usize = 32 << 10;
const OVERLAP: usize = WORKERS * STRIPE;
const SLOTS: usize = 1024;
const SHARED_SIZE: usize = OVERLAP + SLOTS * 64;
/// Data writes start after the counter's cache line.
const DATA: usize = 64;

fn cfg(dir: &Path) -> tiermem_vnvm::VnvmConfig {
    // 64 log pages and 32 cache pages for four users: 16 and 8 each.
    small_cfg(dir, 64, 32)
}

/// Fill `buf` with the pseudo-random bytes of `key`.
fn fill(buf: &mut [u8], key: u64) {
    for (c, ch) in buf.chunks_mut(8).enumerate() {
        let w = mix(key ^ (c as u64) << 32).to_le_bytes();
        ch.copy_from_slice(&w[..ch.len()]);
    }
}

/// One write of a transaction: region offset and bytes.
type Write = (usize, Vec<u8>);

/// The data writes of transaction `i` (1-based) of worker `k` into `[lo, hi)`; `shared`
/// selects the stream. Random count (1–4), sizes (1 byte – 6 KiB, often small) and offsets,
/// overlapping each other and earlier transactions.
fn tx_writes(seed: u64, k: usize, i: u64, shared: bool, lo: usize, hi: usize) -> Vec<Write> {
    let base = mix(seed ^ (k as u64) << 56 ^ i << 8 ^ shared as u64);
    let n = 1 + base % 4;
    (0..n)
        .map(|w| {
            let r = mix(base ^ w);
            let max = if r % 3 == 0 { 6144 } else { 256 };
            let len = 1 + (mix(r) % max) as usize;
            let off = lo + (mix(r ^ 1) % (hi - lo - len) as u64) as usize;
            let mut b = vec![0u8; len];
            fill(&mut b, mix(r ^ 2));
            (off, b)
        })
        .collect()
}

/// The overlap-area slot runs of shared transaction `j` of worker `k`: 1–3 runs of 1–8 slots.
fn overlap_writes(seed: u64, k: usize, j: u64) -> Vec<Write> {
    let base = mix(seed ^ 0x0ff ^ (k as u64) << 56 ^ j << 8);
    (0..1 + base % 3)
        .map(|w| {
            let r = mix(base ^ w);
            let first = (r % SLOTS as u64) as usize;
            let n = (1 + (r >> 20) % 8).min((SLOTS - first) as u64) as usize;
            let mut b = vec![0u8; n * 64];
            for (s, slot) in b.chunks_mut(64).enumerate() {
                make_slot(slot, k, j, first + s, mix(r ^ s as u64));
            }
            (OVERLAP + first * 64, b)
        })
        .collect()
}

/// A self-describing overlap slot: tag (writer, tx), slot index, payload, CRC of the rest.
fn make_slot(b: &mut [u8], k: usize, j: u64, slot: usize, key: u64) {
    b[..8].copy_from_slice(&((k as u64) << 56 | j).to_le_bytes());
    b[8..16].copy_from_slice(&(slot as u64).to_le_bytes());
    fill(&mut b[16..60], key);
    let c = crc(&b[..60]);
    b[60..64].copy_from_slice(&c.to_le_bytes());
}

fn crc(b: &[u8]) -> u32 {
    // FNV-1a: enough to tell a torn or foreign slot.
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ x as u32).wrapping_mul(0x0100_0193)
    })
}

/// Bounds of worker `k`'s data in region kind `shared`.
fn span(k: usize, shared: bool) -> (usize, usize, usize) {
    if shared {
        (k * STRIPE, k * STRIPE + DATA, (k + 1) * STRIPE)
    } else {
        (0, DATA, PRIV_SIZE)
    }
}

/// Expected bytes `[ctr_off, hi)` of worker `k`'s area after its first `n` transactions.
/// Extends the replay cached in `dir` (counters only grow), so that checks stay cheap in runs
/// of hours.
fn replay(dir: &Path, seed: u64, k: usize, shared: bool, n: u64) -> Vec<u8> {
    let (c, lo, hi) = span(k, shared);
    let cache = dir.join(format!("replay{k}{}", if shared { 's' } else { 'p' }));
    let (mut at, mut v) = match std::fs::read(&cache) {
        Ok(b) if b.len() == 8 + hi - c && u64_at(&b, 0) <= n => (u64_at(&b, 0), b[8..].to_vec()),
        _ => (0, vec![0u8; hi - c]),
    };
    let start = at;
    while at < n {
        at += 1;
        for (off, b) in tx_writes(seed, k, at, shared, lo, hi) {
            v[off - c..off - c + b.len()].copy_from_slice(&b);
        }
    }
    v[..8].copy_from_slice(&n.to_le_bytes());
    if n > start {
        let tmp = dir.join(format!("replay.tmp{}", std::process::id()));
        let mut b = n.to_le_bytes().to_vec();
        b.extend_from_slice(&v);
        std::fs::write(&tmp, &b).unwrap();
        std::fs::rename(&tmp, &cache).unwrap();
    }
    v
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Acknowledgements of worker `k`: (private acked, private entered, shared acked, shared
/// entered).
fn acks(dir: &Path, k: usize) -> [u64; 4] {
    let b = std::fs::read(dir.join(format!("ack{k}"))).unwrap_or_default();
    let mut a = [0u64; 4];
    for (x, v) in a.iter_mut().enumerate() {
        if b.len() >= 8 * (x + 1) {
            *v = u64_at(&b, 8 * x);
        }
    }
    a
}

/// Check worker `k`'s area of `bytes` (a region's content): counter between acknowledged and
/// entered, data equal to the replay. Returns the counter.
fn check_area(
    dir: &Path,
    seed: u64,
    k: usize,
    shared: bool,
    bytes: &[u8],
    acked: u64,
    entered: u64,
) -> u64 {
    let (c, _, hi) = span(k, shared);
    let n = u64_at(bytes, c);
    let what = if shared {
        "shared stripe"
    } else {
        "private region"
    };
    assert!(
        n >= acked,
        "worker {k}: {what} counter {n} < acknowledged {acked} (seed {seed})"
    );
    assert!(
        n <= entered,
        "worker {k}: {what} counter {n} > committed-entered {entered} (seed {seed})"
    );
    let want = replay(dir, seed, k, shared, n);
    if bytes[c..hi] != want[..] {
        let at = (0..want.len()).find(|&x| bytes[c + x] != want[x]).unwrap();
        let last = (0..want.len()).rfind(|&x| bytes[c + x] != want[x]).unwrap();
        let count = (0..want.len()).filter(|&x| bytes[c + x] != want[x]).count();
        panic!(
            "worker {k}: {what} after {n} transactions differs at +{at}: {:#04x} != {:#04x} \
             ({count} bytes differ in +{at}..=+{last}; {}; acked {acked}, entered {entered}; \
             events: {}) (seed {seed})",
            bytes[c + at],
            want[at],
            writers_of(seed, k, shared, n, c + at, bytes[c + at]),
            std::fs::read_to_string(dir.join("events"))
                .unwrap_or_default()
                .lines()
                .rev()
                .take(12)
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    n
}

/// Diagnosis of a mismatch at region offset `off`: the last transactions (up to `n`) that wrote
/// it, with the byte each wrote, and which of them (up to `n + 4`: uncommitted ones too) wrote
/// `found`.
fn writers_of(seed: u64, k: usize, shared: bool, n: u64, off: usize, found: u8) -> String {
    let (_, lo, hi) = span(k, shared);
    let mut hist = Vec::new();
    for i in 1..=n + 4 {
        for (o, b) in tx_writes(seed, k, i, shared, lo, hi) {
            if (o..o + b.len()).contains(&off) {
                hist.push((i, b[off - o]));
            }
        }
    }
    let found_by: Vec<u64> = hist
        .iter()
        .filter(|h| h.1 == found)
        .map(|h| h.0)
        .rev()
        .take(3)
        .collect();
    let tail: Vec<String> = hist
        .iter()
        .rev()
        .take(6)
        .map(|(i, b)| format!("tx {i} wrote {b:#04x}"))
        .collect();
    format!(
        "last writers: {}; the found byte was written by tx {found_by:?}",
        tail.join(", ")
    )
}

/// Append a line to the run's event log (kills and restarts), shown when a check fails.
fn event(dir: &Path, what: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("events"))
    {
        let _ = writeln!(f, "{} {what}", tiermem_media::now_ns() / 1_000_000);
    }
}

/// The overlap area holds only whole slots of committed transactions.
fn check_overlap(seed: u64, shared: &[u8], counters: &[u64]) {
    for s in 0..SLOTS {
        let b = &shared[OVERLAP + s * 64..OVERLAP + (s + 1) * 64];
        if b.iter().all(|&x| x == 0) {
            continue;
        }
        let tag = u64_at(b, 0);
        let (k, j) = ((tag >> 56) as usize, tag & ((1 << 56) - 1));
        let ok = u64_at(b, 8) == s as u64
            && crc(&b[..60]).to_le_bytes() == b[60..64]
            && k < counters.len()
            && (1..=counters[k]).contains(&j);
        assert!(
            ok,
            "overlap slot {s} is torn or from an uncommitted transaction: tag {k}/{j}, \
             counters {counters:?} (seed {seed})"
        );
        let mut want = [0u8; 64];
        let runs = overlap_writes(seed, k, j);
        // The last run of the transaction that covers the slot wrote it.
        let mine = runs
            .iter()
            .rev()
            .find(|(off, w)| (*off..off + w.len()).contains(&(OVERLAP + s * 64)))
            .map(|(off, w)| &w[OVERLAP + s * 64 - off..OVERLAP + s * 64 - off + 64]);
        want.copy_from_slice(mine.unwrap_or(&[0u8; 64]));
        assert_eq!(b, &want[..], "overlap slot {s}: not what {k}/{j} wrote");
    }
}

/// Verify every worker's files against the acknowledgements (no worker running).
fn verify_all(dir: &Path, seed: u64) {
    let shared = std::fs::read(dir.join("shared")).unwrap_or_else(|_| vec![0u8; SHARED_SIZE]);
    let mut counters = Vec::new();
    for k in 0..WORKERS {
        let a = acks(dir, k);
        let p =
            std::fs::read(dir.join(format!("priv{k}"))).unwrap_or_else(|_| vec![0u8; PRIV_SIZE]);
        check_area(dir, seed, k, false, &p, a[0], a[1]);
        counters.push(check_area(dir, seed, k, true, &shared, a[2], a[3]));
    }
    check_overlap(seed, &shared, &counters);
}

/// Log `data` at region offset `off`, waiting for log space as long as needed.
fn write_all(vn: &Vnvm, tid: u64, r: &Region, off: usize, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: the callers keep off..off + data.len() inside the region.
        match vn.nv_write(tid, unsafe { r.as_ptr().add(off + done) }, &data[done..]) {
            Ok(n) => done += n,
            Err(VnvmError::LogFull { .. }) => {
                vn.nv_wait_log_space(Duration::from_millis(20));
            }
            Err(e) => panic!("nv_write: {e}"),
        }
    }
}

/// Run one transaction of worker `k` (number `i` in its stream) into `r`; with `junk`, write
/// garbage and abort it instead.
fn run_tx(vn: &Vnvm, r: &Region, seed: u64, k: usize, i: u64, shared: bool, junk: bool) {
    let (c, lo, hi) = span(k, shared);
    let tid = vn.nv_txbegin();
    let mut ws = tx_writes(seed, k, i, shared, lo, hi);
    if shared {
        ws.extend(overlap_writes(seed, k, i));
    }
    if junk {
        for (_, b) in ws.iter_mut() {
            b.iter_mut().for_each(|x| *x = 0xee);
        }
    }
    ws.push((c, if junk { u64::MAX } else { i }.to_le_bytes().to_vec()));
    for (off, b) in &ws {
        write_all(vn, tid, r, *off, b);
    }
    if junk {
        vn.nv_abort(tid).unwrap();
    } else {
        vn.nv_commit(tid).unwrap();
    }
}

/// A worker: `dir;k;seed`. Checks what the previous incarnations left (after the reaping or
/// recovery its `nv_init` ran), then runs transactions until `dir/stop` exists.
#[test]
#[ignore = "helper: run only as a child process"]
fn soak_child() {
    let spec = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("helper only: run by the soak test with {CHILD_ENV} set"));
    let mut it = spec.split(';');
    let dir = Path::new(it.next().unwrap());
    let k: usize = it.next().unwrap().parse().unwrap();
    let seed: u64 = it.next().unwrap().parse().unwrap();
    let ack = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(format!("ack{k}")))
        .unwrap();
    let a = acks(dir, k);
    let vn = nv_init(&cfg(dir)).unwrap();
    let p = vn
        .nv_allocate(dir.join(format!("priv{k}")), PRIV_SIZE, Mode::Private)
        .unwrap();
    let mut s = Some(
        vn.nv_allocate(dir.join("shared"), SHARED_SIZE, Mode::Shared)
            .unwrap(),
    );
    // After the reaping (a live user) or recovery (none), everything acknowledged is here.
    let mut pi = check_area(dir, seed, k, false, &region_bytes(&p), a[0], a[1]);
    let mut si = check_area(
        dir,
        seed,
        k,
        true,
        &region_bytes(s.as_ref().unwrap()),
        a[2],
        a[3],
    );
    event(
        dir,
        &format!(
            "worker {k} (pid {}) started: private {pi}, shared {si}, acks {a:?}",
            std::process::id()
        ),
    );
    let put = |x: usize, v: u64| ack.write_all_at(&v.to_le_bytes(), 8 * x as u64).unwrap();
    // The counters are the truth now (a transaction that entered commit may be there or not).
    put(0, pi);
    put(1, pi);
    put(2, si);
    put(3, si);
    let mut step = mix(seed ^ k as u64 ^ tiermem_media::now_ns());
    while !dir.join("stop").exists() {
        step = mix(step);
        let shared = step % 2 == 0;
        let junk = (step >> 8) % 16 == 0;
        if shared {
            if (step >> 16) % 256 == 0 {
                // Leave the shared region and join it again (perhaps as its last user, which
                // finalizes it, while others join).
                vn.nv_free(s.take().unwrap()).unwrap();
                s = Some(
                    vn.nv_allocate(dir.join("shared"), SHARED_SIZE, Mode::Shared)
                        .unwrap(),
                );
            }
            let r = s.as_ref().unwrap();
            if !junk {
                put(3, si + 1);
            }
            run_tx(&vn, r, seed, k, si + 1, true, junk);
            if !junk {
                si += 1;
                put(2, si);
            }
        } else {
            if !junk {
                put(1, pi + 1);
            }
            run_tx(&vn, &p, seed, k, pi + 1, false, junk);
            if !junk {
                pi += 1;
                put(0, pi);
            }
        }
    }
    vn.nv_release().unwrap();
}

fn spawn(dir: &Path, k: usize, seed: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "soak_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{};{k};{seed}", dir.display()))
        .spawn()
        .unwrap()
}

/// A worker that exited by itself failed (workers run until killed or told to stop).
fn check_running(kids: &mut [Child]) {
    for (k, c) in kids.iter_mut().enumerate() {
        if let Some(st) = c.try_wait().unwrap() {
            panic!("worker {k} exited: {st}");
        }
    }
}

fn kill(c: &mut Child, k: usize) {
    let _ = c.kill();
    let st = c.wait().unwrap();
    assert!(
        st.signal() == Some(libc::SIGKILL) || st.success(),
        "worker {k} failed before the kill: {st}"
    );
}

#[test]
fn soak_processes_private_and_shared_with_kills() {
    let secs: u64 = std::env::var("TIERMEM_VNVM_SOAK_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("TIERMEM_VNVM_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(tiermem_media::now_ns);
    eprintln!("soak: {secs} s, seed {seed}");
    let d = tmp();
    let dir = d.path();
    let mut kids: Vec<Child> = (0..WORKERS).map(|k| spawn(dir, k, seed)).collect();
    let t0 = Instant::now();
    let (mut kills, mut all_kills) = (0u64, 0u64);
    let mut rng = seed;
    while t0.elapsed() < Duration::from_secs(secs) {
        rng = mix(rng);
        std::thread::sleep(Duration::from_millis(20 + rng % 400));
        check_running(&mut kids);
        if (rng >> 20) % 8 == 0 {
            // Everyone dies: recovery replays what they left, and the files are checked.
            for (k, c) in kids.iter_mut().enumerate() {
                kill(c, k);
            }
            event(dir, "killed all");
            let rep = recover(cfg(dir).dir).unwrap();
            verify_all(dir, seed);
            eprintln!(
                "soak: kill of all #{all_kills} at {:?}: recovery replayed {} transactions; \
                 acks {:?}",
                t0.elapsed(),
                rep.transactions_replayed,
                (0..WORKERS).map(|k| acks(dir, k)).collect::<Vec<_>>()
            );
            all_kills += 1;
            for (k, c) in kids.iter_mut().enumerate() {
                *c = spawn(dir, k, seed);
            }
        } else {
            // One dies: a live user reaps it; its next incarnation checks its data.
            let k = (rng >> 8) as usize % WORKERS;
            kill(&mut kids[k], k);
            event(dir, &format!("killed worker {k} acks {:?}", acks(dir, k)));
            kills += 1;
            kids[k] = spawn(dir, k, seed);
        }
    }
    std::fs::write(dir.join("stop"), b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    for (k, c) in kids.iter_mut().enumerate() {
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "worker {k} failed: {st}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "workers did not stop within 120 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // The last worker to leave shut the instance down cleanly.
    let rep = recover(cfg(dir).dir).unwrap();
    verify_all(dir, seed);
    let a: Vec<[u64; 4]> = (0..WORKERS).map(|k| acks(dir, k)).collect();
    eprintln!(
        "soak: {kills} single kills, {all_kills} kills of all; clean at the end: {}; \
         acknowledged (private, shared) per worker: {:?}",
        rep.was_clean,
        a.iter().map(|a| (a[0], a[2])).collect::<Vec<_>>()
    );
    assert!(rep.was_clean, "the last worker did not shut down cleanly");
}
