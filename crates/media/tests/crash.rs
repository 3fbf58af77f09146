//! The persistence-domain model: cut power at every fence of a small workload, reopen the crash
//! image, check the workload's invariant — and show that a missing persist is caught.

use std::path::Path;
use tiermem_media::{CrashPolicy, MediaError, OpenOptions, Pool, PoolOptions, PowerDomain};

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
    let d = PowerDomain::new();
    let path = dir.join(format!("log-{tag}-{extra}"));
    let pool = Pool::create(&path, &PoolOptions::new(64 << 10).domain(&d)).unwrap();
    let base = d.fence_count();
    assert_eq!(
        base, 1,
        "creating a pool persists its header with exactly one fence"
    );
    d.cut_power_after(base + extra).unwrap();
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
