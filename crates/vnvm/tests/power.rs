//! Power failure with the media layer's persistence-domain model: cut the power after every
//! fence of a small workload, and during every fence (the lines it waits for land in any
//! subset), reopen the pools' crash images, recover, and check atomicity.

mod common;
use common::*;
use std::path::Path;
use tiermem_media::{CrashPolicy, CutPoint, PowerDomain};
use tiermem_vnvm::{nv_init, recover, Mode};

const SLOTS: usize = 2048; // 32 KiB region, 8 pages; the cache (32 pages) never writes back
const KS: [usize; 4] = [3, 300, 5, 40];
const SEED: u64 = 0x90e7;

fn expected(init: &[u8], n: usize) -> Vec<u8> {
    let mut v = init.to_vec();
    for (i, &k) in KS.iter().enumerate().take(n) {
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
    let mut in_flight = 0;
    for (ci, (cut, policies)) in cuts.into_iter().enumerate() {
        let run_dir = work.path().join(format!("run{ci}"));
        std::fs::create_dir(&run_dir).unwrap();
        std::fs::write(run_dir.join("data"), &init).unwrap();
        let (acked, _, _, d) = run(&run_dir, Some(cut));
        in_flight += d.in_flight_lines();
        for (pi, policy) in policies.into_iter().enumerate() {
            // The backing file held its initial content at the cut (no writeback ran).
            std::fs::write(run_dir.join("data"), &init).unwrap();
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
