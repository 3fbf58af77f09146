//! The persistence-domain model: cut power at every fence (after it, and during it) of a small
//! workload, reopen the crash image, check the workload's invariant — and show that a missing
//! persist, and a missing fence between two persists, are caught.

use std::path::Path;
use tiermem_media::{
    CrashPolicy, CutPoint, MediaError, OpenOptions, Pool, PoolOptions, PowerDomain,
};

const RECORDS: u64 = 2;
const REC_SIZE: usize = 128;
/// The commit count lives on its own cache line, far from the records.
const COUNT_OFF: u64 = 4096;

fn record(i: u64) -> [u8; REC_SIZE] {
    let mut r = [0u8; REC_SIZE];
    for (j, b) in r.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(j as u8) | 1;
    }
    r
}

/// The append log: for each record, store it with plain stores through the raw pointer, persist
/// it (unless `skip_record_persist`), then store the commit count and persist that.
fn workload(pool: &Pool, skip_record_persist: bool) {
    for i in 0..RECORDS {
        let off = i * REC_SIZE as u64;
        // SAFETY: [off, off + REC_SIZE) and [COUNT_OFF, COUNT_OFF + 8) lie in the data area.
        unsafe {
            pool.data_ptr()
                .add(off as usize)
                .copy_from_nonoverlapping(record(i).as_ptr(), REC_SIZE)
        };
        if !skip_record_persist {
            pool.persist(off, REC_SIZE).unwrap();
        }
        let count = i + 1;
        // SAFETY: as above; COUNT_OFF is 8-byte aligned.
        unsafe { (pool.data_ptr().add(COUNT_OFF as usize) as *mut u64).write_volatile(count) };
        pool.persist(COUNT_OFF, 8).unwrap();
    }
}

/// Reopen an image and check: count ≤ RECORDS and every committed record is intact.
/// Returns the count, or a description of the violation.
fn check(path: &Path) -> Result<u64, String> {
    let p = Pool::open(path, &OpenOptions::default()).map_err(|e| format!("reopen failed: {e}"))?;
    let mut c = [0u8; 8];
    p.read(COUNT_OFF, &mut c).unwrap();
    let count = u64::from_le_bytes(c);
    if count > RECORDS {
        return Err(format!("count {count} > {RECORDS}"));
    }
    for i in 0..count {
        let mut r = [0u8; REC_SIZE];
        p.read(i * REC_SIZE as u64, &mut r).unwrap();
        if r != record(i) {
            return Err(format!(
                "record {i} is committed (count {count}) but not intact"
            ));
        }
    }
    Ok(count)
}

/// Run the workload with power cut after `extra` fences past pool creation; return the check
/// result of the crash image under `policy`, and the total fences of the workload.
fn run_cut(
    dir: &Path,
    extra: u64,
    policy: CrashPolicy,
    skip: bool,
    tag: &str,
) -> (Result<u64, String>, u64) {
    run_cut_at(dir, CutPoint::After(extra), policy, skip, tag)
}

/// [`run_cut`] at any cut point; its fence number counts from pool creation (`During(1)` is
/// the workload's first fence).
fn run_cut_at(
    dir: &Path,
    cut: CutPoint,
    policy: CrashPolicy,
    skip: bool,
    tag: &str,
) -> (Result<u64, String>, u64) {
    let d = PowerDomain::new();
    let extra = cut.fence();
    let path = dir.join(format!("log-{tag}-{extra}"));
    let pool = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    let base = d.fence_count();
    assert_eq!(
        base, 1,
        "creating a pool persists its header with exactly one fence"
    );
    match cut {
        CutPoint::After(n) => d.cut_power_after(base + n).unwrap(),
        CutPoint::During(n) => d.cut_power_during(base + n).unwrap(),
    }
    workload(&pool, skip);
    let total = d.fence_count() - base;
    let img = dir.join(format!("img-{tag}-{extra}"));
    d.write_image(&path, policy, &img).unwrap();
    drop(pool);
    let r = check(&img);
    std::fs::remove_file(&img).unwrap();
    std::fs::remove_file(&path).unwrap();
    (r, total)
}

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tiermem-crash")
        .tempdir_in("/dev/shm")
        .unwrap()
}

#[test]
fn append_log_survives_power_loss_at_every_fence() {
    every_fence(&tmp());
}

#[test]
fn append_log_survives_power_loss_at_every_fence_on_msync_medium() {
    let dir = tempfile::Builder::new()
        .prefix("tiermem-crash")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = Pool::create(dir.path().join("probe"), &PoolOptions::new(64 << 10)).unwrap();
    assert_eq!(
        p.medium(),
        tiermem_media::PersistMethod::Msync,
        "/var/tmp should be block-backed"
    );
    drop(p);
    std::fs::remove_file(dir.path().join("probe")).unwrap();
    every_fence(&dir);
}

fn every_fence(dir: &tempfile::TempDir) {
    let (_, total) = run_cut(dir.path(), 0, CrashPolicy::Strict, false, "probe");
    assert_eq!(total, 2 * RECORDS, "two persists per record");
    let mut counts = Vec::new();
    for extra in 0..=total {
        for policy in [
            CrashPolicy::Strict,
            CrashPolicy::RandomEviction { seed: extra },
            CrashPolicy::RandomEviction { seed: 99 + extra },
        ] {
            let (r, _) = run_cut(dir.path(), extra, policy, false, "ok");
            match r {
                Ok(c) => {
                    if policy == CrashPolicy::Strict {
                        counts.push(c)
                    }
                }
                Err(e) => panic!("power cut after workload fence {extra} ({policy:?}): {e}"),
            }
        }
    }
    // Strict images advance exactly with the commit persists: 0,0,1,1,2.
    assert_eq!(counts, vec![0, 0, 1, 1, 2]);
    // Power failing while a fence waits: each persist is flush + fence, so whatever subset of
    // its lines landed, the invariant holds.
    for n in 1..=total + 1 {
        for seed in 0..4 {
            for policy in [
                CrashPolicy::Torn { seed },
                CrashPolicy::RandomEviction { seed },
            ] {
                let cut = CutPoint::During(n);
                if let Err(e) = run_cut_at(dir.path(), cut, policy, false, "ok").0 {
                    panic!("power cut {cut} of the workload ({policy:?}): {e}");
                }
            }
        }
    }
}

#[test]
fn a_missing_persist_is_caught() {
    let dir = tmp();
    let (_, total) = run_cut(dir.path(), 0, CrashPolicy::Strict, true, "probe");
    assert_eq!(total, RECORDS);
    let failures: Vec<String> = (0..=total)
        .filter_map(|extra| {
            run_cut(dir.path(), extra, CrashPolicy::Strict, true, "bug")
                .0
                .err()
        })
        .collect();
    assert!(
        !failures.is_empty(),
        "dropping the record persist must break the invariant at some cut"
    );
    assert!(failures[0].contains("not intact"), "{failures:?}");
}

#[test]
fn unfenced_flush_is_lost_and_random_eviction_may_keep_it() {
    let dir = tmp();
    let d = PowerDomain::new();
    let path = dir.path().join("p");
    let pool = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    // Many lines written and flushed, but never fenced.
    let data = vec![0xABu8; 64 * 64];
    pool.write(0, &data).unwrap();
    pool.flush(0, data.len()).unwrap();
    assert_eq!(d.pending_lines(), 64);
    d.cut_power_after(d.fence_count()).unwrap();
    assert!(d.is_power_cut());
    pool.fence(); // after the cut: no effect
    assert!(!d.fences().last().unwrap().applied);
    let strict = d.crash_image(&path, CrashPolicy::Strict).unwrap();
    assert!(
        strict[4096..4096 + data.len()].iter().all(|&b| b == 0),
        "unfenced data must not survive Strict"
    );
    // The header did survive (it was fenced at creation).
    assert_eq!(&strict[..8], b"TMEMPOOL");
    let random = d
        .crash_image(&path, CrashPolicy::RandomEviction { seed: 7 })
        .unwrap();
    let kept = random[4096..4096 + data.len()]
        .chunks(64)
        .filter(|l| l.iter().all(|&b| b == 0xAB))
        .count();
    let lost = random[4096..4096 + data.len()]
        .chunks(64)
        .filter(|l| l.iter().all(|&b| b == 0))
        .count();
    assert_eq!(
        kept + lost,
        64,
        "each line is wholly one version or the other"
    );
    assert!(
        kept > 0 && lost > 0,
        "64 fair coin flips gave kept={kept} lost={lost}"
    );
    // Deterministic per seed.
    assert_eq!(
        random,
        d.crash_image(&path, CrashPolicy::RandomEviction { seed: 7 })
            .unwrap()
    );
}

#[test]
fn fence_records_name_the_caller_and_count_lines() {
    let dir = tmp();
    let d = PowerDomain::new();
    let path = dir.path().join("p");
    let pool = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    pool.write(0, &[1u8; 200]).unwrap(); // lines 0..4 of the data area (offset 0..200)
    let line = line!() + 1;
    pool.fence();
    pool.write_persist(1000, &[2u8; 10]).unwrap();
    let f = d.fences();
    assert_eq!(f.len(), 3);
    assert_eq!(f[0].seq, 1);
    assert_eq!(
        f[0].caller.file(),
        file!(),
        "Pool::create is #[track_caller]"
    );
    assert_eq!((f[1].caller.file(), f[1].caller.line()), (file!(), line));
    assert_eq!(f[1].lines, 4);
    assert_eq!(f[2].lines, 1);
    assert!(f
        .iter()
        .all(|r| r.applied && r.pool == pool.domain_id().unwrap()));
}

#[test]
fn fence_on_one_pool_makes_another_pools_flushes_durable() {
    let dir = tmp();
    let d = PowerDomain::new();
    let a = Pool::create(dir.path().join("a"), &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    let b = Pool::create(dir.path().join("b"), &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    a.write(0, b"from a").unwrap();
    a.flush(0, 6).unwrap();
    b.fence();
    let img = d
        .crash_image(dir.path().join("a"), CrashPolicy::Strict)
        .unwrap();
    assert_eq!(&img[4096..4102], b"from a");
    assert!(matches!(
        d.crash_image(dir.path().join("zzz"), CrashPolicy::Strict),
        Err(MediaError::UnknownPool(_))
    ));
}

#[test]
fn power_cut_before_the_header_fence_leaves_no_pool() {
    let dir = tmp();
    let d = PowerDomain::new();
    d.cut_power_after(0).unwrap();
    let path = dir.path().join("p");
    let _pool = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    let img = dir.path().join("img");
    d.write_image(&path, CrashPolicy::Strict, &img).unwrap();
    assert!(matches!(
        Pool::open(&img, &OpenOptions::default()),
        Err(MediaError::NotAPool { .. })
    ));
    // Arming again, or arming in the past, is refused.
    assert!(d.cut_power_after(5).is_err());
    let d2 = PowerDomain::new();
    let _p2 = Pool::create(
        dir.path().join("q"),
        &PoolOptions::new(64 << 10).domain(&d2),
    )
    .unwrap();
    assert!(matches!(
        d2.cut_power_after(0),
        Err(MediaError::InvalidArgument(_))
    ));
}

#[test]
fn reopened_pool_keeps_its_shadow() {
    let dir = tmp();
    let d = PowerDomain::new();
    let path = dir.path().join("p");
    {
        let p = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
        // Plain stores, never flushed: only in the (volatile) cache.
        // SAFETY: 13 bytes at the start of the data area.
        unsafe {
            p.data_ptr()
                .copy_from_nonoverlapping(b"volatile only".as_ptr(), 13)
        };
    }
    // Reopening in the same domain must not promote the unfenced bytes to durable.
    let p = Pool::open(&path, &OpenOptions::default().domain(&d)).unwrap();
    p.write_persist(100, b"durable").unwrap();
    let img = d.crash_image(&path, CrashPolicy::Strict).unwrap();
    assert!(img[4096..4096 + 13].iter().all(|&b| b == 0));
    assert_eq!(&img[4196..4203], b"durable");
}

// ---- cuts during a fence -------------------------------------------------------------------

const DATA_OFF: u64 = 0;
const DATA_LEN: usize = 4 * 64;
const FLAG_OFF: u64 = 4096;

/// `write(data); flush(data); [fence]; write(flag); flush(flag); fence()` on a pool opened (not
/// created) in `d`, so the workload's fences are the domain's fences 1, 2 (1 without the first).
fn publish(pool: &Pool, first_fence: bool) {
    // SAFETY: [DATA_OFF, DATA_OFF + DATA_LEN) and [FLAG_OFF, FLAG_OFF + 8) lie in the data area.
    unsafe {
        pool.data_ptr()
            .add(DATA_OFF as usize)
            .write_bytes(0xDA, DATA_LEN)
    };
    pool.flush(DATA_OFF, DATA_LEN).unwrap();
    if first_fence {
        pool.fence();
    }
    // SAFETY: as above; FLAG_OFF is 8-byte aligned.
    unsafe { (pool.data_ptr().add(FLAG_OFF as usize) as *mut u64).write_volatile(1) };
    pool.flush(FLAG_OFF, 8).unwrap();
    pool.fence();
}

/// The invariant of [`publish`]: flag set ⇒ data complete. Returns the flag.
fn check_publish(img: &[u8]) -> Result<bool, String> {
    let data = &img[4096 + DATA_OFF as usize..][..DATA_LEN];
    let flag = u64::from_le_bytes(img[4096 + FLAG_OFF as usize..][..8].try_into().unwrap());
    match flag {
        0 => Ok(false),
        1 if data.iter().all(|&b| b == 0xDA) => Ok(true),
        1 => Err("flag set but data missing".into()),
        f => Err(format!("flag {f} is neither 0 nor 1")),
    }
}

/// Run [`publish`] with power cut at `cut` (None: never) and check the crash image under every
/// policy of `policies`. Returns the fence count and, per policy, the check result.
fn run_publish(
    dir: &Path,
    first_fence: bool,
    cut: Option<CutPoint>,
    policies: &[CrashPolicy],
) -> (u64, Vec<Result<bool, String>>) {
    let path = dir.join("publish");
    let _ = std::fs::remove_file(&path);
    drop(Pool::create(&path, &PoolOptions::new(64 << 10)).unwrap());
    let d = PowerDomain::new();
    if let Some(c) = cut {
        d.cut_power_at(c).unwrap();
    }
    let pool = Pool::open(&path, &OpenOptions::default().domain(&d)).unwrap();
    publish(&pool, first_fence);
    let results = policies
        .iter()
        .map(|&p| check_publish(&d.crash_image(&path, p).unwrap()))
        .collect();
    (d.fence_count(), results)
}

/// Strict, then Torn and RandomEviction with seeds 0..8.
fn policies() -> Vec<CrashPolicy> {
    let mut v = vec![CrashPolicy::Strict];
    for seed in 0..8 {
        v.push(CrashPolicy::Torn { seed });
        v.push(CrashPolicy::RandomEviction { seed });
    }
    v
}

/// Every (cut, policy) at which the invariant of [`publish`] breaks, and whether each cut kind
/// saw the flag both unset and set.
fn publish_failures(first_fence: bool) -> Vec<(CutPoint, CrashPolicy, String)> {
    let dir = tmp();
    let (fences, _) = run_publish(dir.path(), first_fence, None, &[]);
    assert_eq!(fences, 1 + first_fence as u64);
    let policies = policies();
    let mut failures = Vec::new();
    let mut flags = [false; 2];
    for cut in CutPoint::all(fences) {
        let (_, results) = run_publish(dir.path(), first_fence, Some(cut), &policies);
        for (r, &policy) in results.into_iter().zip(&policies) {
            match r {
                Ok(flag) => flags[flag as usize] = true,
                Err(e) => failures.push((cut, policy, e)),
            }
        }
    }
    assert_eq!(flags, [true, true], "some image shows each outcome");
    failures
}

#[test]
fn ordered_publish_survives_every_cut_after_and_during_fences() {
    let failures = publish_failures(true);
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn a_missing_fence_between_two_persists_is_caught_by_during_cuts() {
    let failures = publish_failures(false);
    eprintln!(
        "missing fence caught by {} of {} (cut, policy) pairs: {:?}",
        failures.len(),
        CutPoint::all(1).count() * policies().len(),
        failures
            .iter()
            .map(|(c, p, _)| format!("{c} {p:?}"))
            .collect::<Vec<_>>()
    );
    assert!(
        !failures.is_empty(),
        "without the fence, the flag can be written back before the data: some cut during the \
         fence must show it"
    );
    for (cut, policy, e) in &failures {
        assert_eq!(e, "flag set but data missing");
        // Only a cut during the single fence tears the two flushes apart; Strict never does.
        assert_eq!(*cut, CutPoint::During(1), "{policy:?}");
        assert_ne!(*policy, CrashPolicy::Strict);
    }
    // Both seeded policies catch it, with deterministic seeds.
    assert!(failures
        .iter()
        .any(|(_, p, _)| matches!(p, CrashPolicy::Torn { .. })));
    assert!(failures
        .iter()
        .any(|(_, p, _)| matches!(p, CrashPolicy::RandomEviction { .. })));
    // The cut-after model alone cannot see the bug (this is the gap the during cuts close).
    let dir = tmp();
    for n in 0..=1 {
        let (_, results) = run_publish(dir.path(), false, Some(CutPoint::After(n)), &policies());
        assert!(
            results.iter().all(|r| r.is_ok()),
            "after fence {n}: {results:?}"
        );
    }
}

#[test]
fn cut_during_a_fence_leaves_its_lines_in_flight() {
    let dir = tmp();
    let path = dir.path().join("p");
    let d = PowerDomain::new();
    let pool = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    assert_eq!(d.fence_count(), 1);
    // Arming during a fence already seen, or during fence 0, is refused.
    assert!(matches!(
        d.cut_power_during(1),
        Err(MediaError::InvalidArgument(_))
    ));
    assert!(matches!(
        d.cut_power_during(0),
        Err(MediaError::InvalidArgument(_))
    ));
    d.cut_power_during(2).unwrap();
    assert!(d.cut_power_after(3).is_ok(), "re-arming before the cut");
    let d = PowerDomain::new();
    drop(pool);
    let pool = Pool::open(&path, &OpenOptions::default().domain(&d)).unwrap();
    d.cut_power_during(1).unwrap();
    // 64 lines, each flushed twice with different contents (A then B) before the fence.
    let len = 64 * 64;
    pool.write(0, &vec![0xA1; len]).unwrap();
    pool.flush(0, len).unwrap(); // same content again: no new version
    pool.write(0, &vec![0xB2; len]).unwrap();
    assert!(!d.is_power_cut());
    pool.fence();
    assert!(d.is_power_cut());
    assert_eq!(d.in_flight_lines(), 64);
    assert_eq!(d.pending_lines(), 0);
    let f = d.fences();
    assert_eq!(f.len(), 1);
    assert!(!f[0].applied && f[0].interrupted && f[0].lines == 64);
    pool.write_persist(0, &[0xEE; 64]).unwrap(); // after the cut: no effect
    assert!(!d.fences()[1].applied && !d.fences()[1].interrupted);

    let strict = d.crash_image(&path, CrashPolicy::Strict).unwrap();
    assert!(strict[4096..4096 + len].iter().all(|&b| b == 0));
    let torn = d.crash_image(&path, CrashPolicy::Torn { seed: 3 }).unwrap();
    let mut seen = [0usize; 3];
    for line in torn[4096..4096 + len].chunks(64) {
        let v = line[0];
        assert!(line.iter().all(|&b| b == v), "a line is never torn inside");
        seen[match v {
            0 => 0,
            0xA1 => 1,
            0xB2 => 2,
            _ => panic!("unexpected content {v:#x}"),
        }] += 1;
    }
    assert!(
        seen.iter().all(|&c| c > 0),
        "each line keeps the old content or one of its two flushed versions: {seen:?}"
    );
    assert_eq!(
        torn,
        d.crash_image(&path, CrashPolicy::Torn { seed: 3 }).unwrap(),
        "deterministic per seed"
    );
    assert_ne!(
        torn,
        d.crash_image(&path, CrashPolicy::Torn { seed: 4 }).unwrap()
    );
    // RandomEviction may also keep the volatile content (B, the last store) of a line whose
    // write-back did not land; it never shows the post-cut 0xEE.
    let re = d
        .crash_image(&path, CrashPolicy::RandomEviction { seed: 3 })
        .unwrap();
    assert!(re[4096..4096 + len]
        .iter()
        .all(|&b| b == 0 || b == 0xA1 || b == 0xB2));
}

#[test]
fn after_cuts_have_nothing_in_flight_and_trailing_flushes_are_in_flight_while_powered() {
    let dir = tmp();
    let path = dir.path().join("p");
    let d = PowerDomain::new();
    let pool = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    pool.write(0, &[7u8; 64 * 32]).unwrap();
    // Power on, 32 lines pending after the last fence: a failure now leaves them in flight.
    assert_eq!(d.pending_lines(), 32);
    let torn = d.crash_image(&path, CrashPolicy::Torn { seed: 1 }).unwrap();
    let kept = torn[4096..4096 + 64 * 32]
        .chunks(64)
        .filter(|l| l[0] == 7)
        .count();
    assert!(kept > 0 && kept < 32, "kept {kept} of 32");
    // Cut after the last fence: nothing is in flight, Torn is Strict.
    d.cut_power_after(d.fence_count()).unwrap();
    assert_eq!(d.in_flight_lines(), 0);
    assert_eq!(
        d.crash_image(&path, CrashPolicy::Torn { seed: 1 }).unwrap(),
        d.crash_image(&path, CrashPolicy::Strict).unwrap()
    );
    // The enumeration helper, in time order.
    assert_eq!(
        CutPoint::all(2).collect::<Vec<_>>(),
        [
            CutPoint::After(0),
            CutPoint::During(1),
            CutPoint::After(1),
            CutPoint::During(2),
            CutPoint::After(2),
            CutPoint::During(3)
        ]
    );
    assert_eq!(CutPoint::During(3).to_string(), "during fence 3");
}
