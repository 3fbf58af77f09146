//! Power failure with the media layer's persistence-domain model: cut the power after every
//! fence of a small workload, and during every fence (the lines it waits for land in any
//! subset), reopen the pools' crash images, recover, and check atomicity — for a private
//! region (`atomic_at_every_fence`) and for a shared one (`shared_atomic_at_every_fence`).

mod common;
use common::*;
use std::path::Path;
use tiermem_media::{CrashPolicy, CutPoint, PowerDomain};
use tiermem_vnvm::{nv_init, recover, Mode, RecoveryReport};

const SLOTS: usize = 2048; // 32 KiB region, 8 pages; the cache (32 pages) never writes back
const KS: [usize; 4] = [3, 300, 5, 40];
const SEED: u64 = 0x90e7;

fn expected(init: &[u8], n: usize) -> Vec<u8> {
    expected_ks(init, &KS, n)
}

/// The region after the first `n` transactions of a workload whose transaction `i` writes
/// `ks[i]` records.
fn expected_ks(init: &[u8], ks: &[usize], n: usize) -> Vec<u8> {
    let mut v = init.to_vec();
    for (i, &k) in ks.iter().enumerate().take(n) {
        for s in tx_slots(SEED, i as u64, SLOTS, k) {
            v[s * SLOT..(s + 1) * SLOT].copy_from_slice(&record(SEED, i as u64, s));
        }
    }
    v
}

/// Run the workload with power cut at `cut` (None: never). Returns the number of commits that
/// returned while the power was on, and the total fence count.
fn run(dir: &Path, cut: Option<CutPoint>) -> (usize, u64, u64, PowerDomain) {
    let d = PowerDomain::new();
    if let Some(c) = cut {
        d.cut_power_at(c).unwrap();
    }
    let mut cfg = small_cfg(dir, 16, 32);
    cfg.domain = Some(d.clone());
    let vn = nv_init(&cfg).unwrap();
    let init_fences = d.fence_count();
    let r = vn
        .nv_allocate(dir.join("data"), SLOTS * SLOT, Mode::Private)
        .unwrap();
    let mut acked = 0;
    for (i, &k) in KS.iter().enumerate() {
        let tid = vn.nv_txbegin();
        for s in tx_slots(SEED, i as u64, SLOTS, k) {
            let rec = record(SEED, i as u64, s);
            // SAFETY: slot s is inside the region.
            let dst = unsafe { r.as_ptr().add(s * SLOT) };
            assert_eq!(vn.nv_write(tid, dst, &rec).unwrap(), SLOT);
        }
        vn.nv_commit(tid).unwrap();
        if !d.is_power_cut() {
            acked += 1;
        }
        // Let the redo worker apply it now: the fence sequence is then the same in every run,
        // so each cut point means the same thing (kill -9 tests cover the interleavings).
        vn.drain().unwrap();
    }
    vn.drain().unwrap();
    vn.abandon();
    let total = d.fence_count();
    (acked, init_fences, total, d)
}

/// Every cut point from the last fence of nv_init to two fences past the end, each with the
/// crash policies to take images with: after a fence, Strict and three eviction seeds; during a
/// fence (while it waits for its write-backs), two seeds each of Torn and RandomEviction (each
/// line pending at it lands or not).
fn cut_points(init_fences: u64, total: u64) -> Vec<(CutPoint, Vec<CrashPolicy>)> {
    let mut cuts = Vec::new();
    for n in init_fences - 1..=total + 2 {
        cuts.push((
            CutPoint::After(n),
            vec![
                CrashPolicy::Strict,
                CrashPolicy::RandomEviction { seed: n },
                CrashPolicy::RandomEviction { seed: 1000 + n },
                CrashPolicy::RandomEviction { seed: 2000 + n },
            ],
        ));
        if n >= init_fences {
            cuts.push((
                CutPoint::During(n),
                vec![
                    CrashPolicy::Torn { seed: n },
                    CrashPolicy::Torn { seed: 3000 + n },
                    CrashPolicy::RandomEviction { seed: 4000 + n },
                    CrashPolicy::RandomEviction { seed: 5000 + n },
                ],
            ));
        }
    }
    cuts
}

#[test]
fn atomic_at_every_fence() {
    let work = tmp();
    let init: Vec<u8> = (0..SLOTS * SLOT).map(|i| (i % 251) as u8).collect();
    let probe = work.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    std::fs::write(probe.join("data"), &init).unwrap();
    let (acked, init_fences, total, _) = run(&probe, None);
    assert_eq!(acked, KS.len());
    let mut seen = vec![0usize; KS.len() + 1];
    // Cuts before the last fence of nv_init fall into pool creation, where the model cannot
    // express the rename that publishes meta.pool; every later fence is tried, after it
    // completed (Strict and three eviction seeds) and while it waits for its write-backs (two
    // seeds each of Torn and RandomEviction: each line pending at it lands or not).
    let cuts = cut_points(init_fences, total);
    let mut in_flight = 0;
    for (ci, (cut, policies)) in cuts.into_iter().enumerate() {
        let run_dir = work.path().join(format!("run{ci}"));
        std::fs::create_dir(&run_dir).unwrap();
        std::fs::write(run_dir.join("data"), &init).unwrap();
        let (acked, _, _, d) = run(&run_dir, Some(cut));
        in_flight += d.in_flight_lines();
        for (pi, policy) in policies.into_iter().enumerate() {
            // The backing file held its initial content at the cut (no writeback ran), and its
            // checksum table no entry (the previous image's recovery wrote some).
            std::fs::write(run_dir.join("data"), &init).unwrap();
            let _ = std::fs::remove_file(run_dir.join("data.vnvm-crc"));
            let img = run_dir.join(format!("img{pi}"));
            std::fs::create_dir(&img).unwrap();
            let inst = run_dir.join("inst");
            let mut have_meta = true;
            for name in ["meta.pool", "log.pool", "cache.pool"] {
                if d.write_image(inst.join(name), policy, img.join(name))
                    .is_err()
                {
                    have_meta = false;
                }
            }
            if have_meta {
                recover(&img).unwrap_or_else(|e| panic!("cut {cut} ({policy:?}): {e}"));
            }
            let got = std::fs::read(run_dir.join("data")).unwrap();
            let n = (acked..=(acked + 1).min(KS.len()))
                .find(|&n| expected(&init, n) == got)
                .unwrap_or_else(|| {
                    panic!(
                        "cut {cut} ({policy:?}): the file is not the state after the \
                         {acked} durable commits (or one more)"
                    )
                });
            if policy == CrashPolicy::Strict {
                seen[n] += 1;
            }
        }
        std::fs::remove_dir_all(&run_dir).unwrap();
    }
    eprintln!(
        "fences: nv_init {init_fences}, total {total}; strict prefixes seen {seen:?}; \
         {in_flight} lines in flight over the during-fence cuts"
    );
    // Every prefix, from nothing to everything, occurs at some cut.
    assert!(seen.iter().all(|&c| c > 0), "prefixes seen: {seen:?}");
    // The during-fence cuts did interrupt write-backs.
    assert!(in_flight > 0);
}

// ---- shared mode ---------------------------------------------------------------------------

/// The shared workload: transaction `i` writes `SHARED_KS[i]` records.
const SHARED_KS: [usize; 5] = [3, 300, 5, 40, 17];
/// The region is flushed (nv_free, then nv_allocate again) after this many transactions.
const FLUSH_AFTER: [usize; 2] = [2, 4];

/// What a shared-mode run with a power cut saw.
struct SharedRun {
    /// Commits that returned while the power was on. Their entries were applied to the shared
    /// mapping (the page cache of the file) before the cut; no later transaction's were (a
    /// commit applies after its last fence, so a commit interrupted by the cut applies after it).
    acked: usize,
    /// Transactions msynced before the cut: those committed before the last flush whose msync
    /// ran with the power on.
    synced: usize,
    init_fences: u64,
    total: u64,
    /// Flushes the process ran; more than `FLUSH_AFTER.len()` means the redo worker flushed on
    /// its own (its 200 ms period expired), at a time the test does not know.
    flushes: u64,
    d: PowerDomain,
}

/// Run the shared workload with power cut at `cut` (None: never). Single-threaded and below the
/// flush threshold (64 log pages: 16; a segment between flushes holds at most 4), so every
/// flush is one the test asked for and the fence sequence is the same in every run.
fn run_shared(dir: &Path, cut: Option<CutPoint>) -> SharedRun {
    let d = PowerDomain::new();
    if let Some(c) = cut {
        d.cut_power_at(c).unwrap();
    }
    let mut cfg = small_cfg(dir, 64, 32);
    cfg.domain = Some(d.clone());
    let vn = nv_init(&cfg).unwrap();
    let init_fences = d.fence_count();
    let alloc = || {
        vn.nv_allocate(dir.join("data"), SLOTS * SLOT, Mode::Shared)
            .unwrap()
    };
    let mut r = alloc();
    let (mut acked, mut synced) = (0, 0);
    for (i, &k) in SHARED_KS.iter().enumerate() {
        let tid = vn.nv_txbegin();
        for s in tx_slots(SEED, i as u64, SLOTS, k) {
            let rec = record(SEED, i as u64, s);
            // SAFETY: slot s is inside the region.
            let dst = unsafe { r.as_ptr().add(s * SLOT) };
            assert_eq!(vn.nv_write(tid, dst, &rec).unwrap(), SLOT);
        }
        vn.nv_commit(tid).unwrap();
        if !d.is_power_cut() {
            acked += 1;
        }
        if FLUSH_AFTER.contains(&(i + 1)) {
            // The flush (the last user's nv_free) msyncs before its first fence, the one that
            // drops the logs from the committed list: if the power is still on now, the msync
            // ran before the cut.
            let on = !d.is_power_cut();
            vn.nv_free(r).unwrap();
            if on {
                synced = i + 1;
            }
            r = alloc();
        }
    }
    let flushes = vn.stats().flushes;
    drop(r);
    vn.abandon();
    SharedRun {
        acked,
        synced,
        init_fences,
        total: d.fence_count(),
        flushes,
        d,
    }
}

/// [`run_shared`] again until no flush of the redo worker's own came in between (a loaded
/// machine can stretch a run past the worker's 200 ms period).
fn run_shared_deterministic(dir: &Path, cut: Option<CutPoint>) -> SharedRun {
    for attempt in 0.. {
        let _ = std::fs::remove_dir_all(dir.join("inst"));
        let run = run_shared(dir, cut);
        if run.flushes == FLUSH_AFTER.len() as u64 {
            return run;
        }
        assert!(attempt < 5, "the redo worker flushed on its own in 6 runs");
    }
    unreachable!()
}

/// Power failure on a shared region, at every fence.
///
/// The model covers the pools only. The backing file is the region's DRAM cache itself
/// (`MAP_SHARED`) and lives in tmpfs: a "power cut" does not revert it, and the process keeps
/// running after the cut (applying later commits, msyncing), so the file as it is after a run
/// is not what a medium would hold after a real power failure, and the test cannot use it.
/// Instead it constructs the files a real failure could leave and recovers each of them:
///
/// * data a flush msynced before the cut is durable: every transaction up to `synced`;
/// * data only in the page cache may or may not have been written back by the kernel (at any
///   time, page by page, a page possibly torn into sectors, even in the middle of a commit's
///   apply); the page cache at the cut held exactly the first `acked` transactions.
///
/// So at the cut each byte of the medium holds its value after some prefix `j` with
/// `synced ≤ j ≤ acked`, chosen independently per byte in the worst case. The test tries
/// `j = synced` everywhere (nothing written back), `j = acked` everywhere (everything written
/// back) and two random choices per 16-byte slot in between. Recovery of every one of them,
/// under every crash image of the pools, must leave the state after the first `n`
/// transactions with `acked ≤ n ≤ acked + 1`: every acknowledged transaction present in full,
/// the one in flight all or nothing, no later one.
///
/// What this cannot check: the page cache is not observed at the cut, only derived from the
/// protocol. Whether and when the flush's msync ran is invisible (msync on tmpfs does
/// nothing, and the model has no page cache): `synced` relies on the flush's order msync →
/// drop (`flush_shared`), so a flush that dropped its logs before its msync would go
/// unnoticed here. Likewise `acked` relies on a commit applying only after its link is
/// durable: a commit that applied first would go unnoticed here (`crash_kill` can see that
/// one: a killed process leaves its page cache behind).
#[test]
fn shared_atomic_at_every_fence() {
    let work = tmp();
    let init: Vec<u8> = (0..SLOTS * SLOT).map(|i| (i % 251) as u8).collect();
    let nks = SHARED_KS.len();
    let exp: Vec<Vec<u8>> = (0..=nks)
        .map(|n| expected_ks(&init, &SHARED_KS, n))
        .collect();
    let probe = work.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    std::fs::write(probe.join("data"), &init).unwrap();
    let p = run_shared_deterministic(&probe, None);
    assert_eq!(
        (p.acked, p.synced),
        (nks, FLUSH_AFTER[FLUSH_AFTER.len() - 1])
    );
    let (init_fences, total) = (p.init_fences, p.total);
    let sequence: Vec<String> =
        p.d.fences()
            .iter()
            .skip(init_fences as usize)
            .map(|f| {
                format!(
                    "{}:{}",
                    f.caller.file().rsplit('/').next().unwrap(),
                    f.caller.line()
                )
            })
            .collect();
    let mut seen = vec![0usize; nks + 1];
    let mut in_flight = 0;
    let mut recoveries = 0;
    for (ci, (cut, policies)) in cut_points(init_fences, total).into_iter().enumerate() {
        let run_dir = work.path().join(format!("run{ci}"));
        std::fs::create_dir(&run_dir).unwrap();
        std::fs::write(run_dir.join("data"), &init).unwrap();
        let run = run_shared_deterministic(&run_dir, Some(cut));
        let (acked, synced) = (run.acked, run.synced);
        assert!(synced <= acked);
        in_flight += run.d.in_flight_lines();
        // The files a real power failure at this cut could leave (see above).
        let mut files = vec![
            ("synced", exp[synced].clone()),
            ("acked", exp[acked].clone()),
        ];
        if synced < acked {
            for m in 0..2u64 {
                let mut f = exp[synced].clone();
                for s in 0..SLOTS {
                    let j = synced
                        + (mix(SEED ^ ((ci as u64) << 20) ^ (m << 40) ^ s as u64) as usize)
                            % (acked - synced + 1);
                    f[s * SLOT..(s + 1) * SLOT].copy_from_slice(&exp[j][s * SLOT..(s + 1) * SLOT]);
                }
                files.push(("mixed", f));
            }
        }
        for (pi, policy) in policies.into_iter().enumerate() {
            for (fi, (fname, file)) in files.iter().enumerate() {
                std::fs::write(run_dir.join("data"), file).unwrap();
                let img = run_dir.join(format!("img{pi}-{fi}"));
                std::fs::create_dir(&img).unwrap();
                let inst = run_dir.join("inst");
                let mut have_meta = true;
                for name in ["meta.pool", "log.pool", "cache.pool"] {
                    if run
                        .d
                        .write_image(inst.join(name), policy, img.join(name))
                        .is_err()
                    {
                        have_meta = false;
                    }
                }
                let what = || {
                    format!(
                        "cut {cut} ({policy:?}, {fname} file: {synced} msynced, {acked} \
                         acknowledged)"
                    )
                };
                let rep = if have_meta {
                    recoveries += 1;
                    recover(&img).unwrap_or_else(|e| panic!("{}: {e}", what()))
                } else {
                    RecoveryReport::default()
                };
                let got = std::fs::read(run_dir.join("data")).unwrap();
                let n = (acked..=(acked + 1).min(nks))
                    .find(|&n| exp[n] == got)
                    .unwrap_or_else(|| {
                        let near = (0..=nks).find(|&n| exp[n] == got);
                        panic!(
                            "{}: recovery replayed {} transactions and the file is not the \
                             state after the {acked} acknowledged commits (or one more); it is \
                             the state after {near:?}; fences after nv_init: {sequence:?}",
                            what(),
                            rep.transactions_replayed
                        )
                    });
                if policy == CrashPolicy::Strict {
                    seen[n] += 1;
                }
                // A cut after the last fence: the flushes' drops are durable, only the
                // transactions after the last flush are still listed.
                if cut == CutPoint::After(total) {
                    assert_eq!(rep.transactions_replayed, nks - synced, "{}", what());
                }
            }
        }
        std::fs::remove_dir_all(&run_dir).unwrap();
    }
    eprintln!(
        "shared: fences: nv_init {init_fences}, total {total} ({sequence:?}); strict prefixes \
         seen {seen:?}; {in_flight} lines in flight over the during-fence cuts; {recoveries} \
         recoveries"
    );
    assert!(seen.iter().all(|&c| c > 0), "prefixes seen: {seen:?}");
    assert!(in_flight > 0);
}
