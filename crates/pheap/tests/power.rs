//! Power failure at every fence of a small run (the media layer's persistence-domain model):
//! the post-crash pool either is refused cleanly (power failed while the heap was being
//! created) or opens to exactly one complete checkpoint — the last one whose `ckall` returned
//! before the cut, or the one in progress.

use tiermem_media::{CrashPolicy, CutPoint, PowerDomain};
use tiermem_pheap::{Heap, HeapOptions};

fn opts(d: &PowerDomain) -> HeapOptions {
    HeapOptions {
        capacity: 256 << 10,
        domain: Some(d.clone()),
        ..HeapOptions::default()
    }
}

fn fill(p: *mut u8, len: usize, v: u8) {
    // SAFETY: p is a live object of at least len bytes.
    unsafe { std::ptr::write_bytes(p, v, len) }
}

/// Runs the workload; returns, per checkpoint k = 1..=3, whether power was still on when
/// `ckall` number k returned (so that checkpoint must survive).
fn workload(path: &std::path::Path, d: &PowerDomain) -> Vec<bool> {
    let h = Heap::create(path, &opts(d)).unwrap();
    let mut done = Vec::new();
    let a = h.malloc(100, Some("a")).unwrap();
    let b = h.malloc(6000, Some("b")).unwrap();
    let c = h.malloc(40, Some("c")).unwrap();
    for k in 1..=3u8 {
        fill(a, 100, k);
        fill(b, 6000, k);
        if k == 3 {
            h.free(c).unwrap();
            let e = h.malloc(30, Some("e")).unwrap();
            fill(e, 30, k);
        } else {
            fill(c, 40, k);
        }
        h.ckall().unwrap();
        done.push(!d.is_power_cut());
    }
    done
}

/// The checkpoint number the heap at `path` holds (0: created, no checkpoint), checking that
/// every object agrees with it.
fn state(path: &std::path::Path) -> Result<u8, String> {
    let h = Heap::open(path).map_err(|e| e.to_string())?;
    let Some(a) = h.get("a") else {
        assert_eq!(h.len(), 0, "objects without the first checkpoint");
        return Ok(0);
    };
    // SAFETY: live objects of the recorded sizes.
    let (va, vb) = unsafe {
        (
            std::slice::from_raw_parts(a, 100),
            std::slice::from_raw_parts(h.get("b").unwrap(), 6000),
        )
    };
    let k = va[0];
    assert!(
        va.iter().all(|&x| x == k) && vb.iter().all(|&x| x == k),
        "torn objects at {k}"
    );
    if k == 3 {
        assert!(h.get("c").is_none());
        // SAFETY: live 30-byte object.
        assert!(
            unsafe { std::slice::from_raw_parts(h.get("e").unwrap(), 30) }
                .iter()
                .all(|&x| x == 3)
        );
    } else {
        assert!(h.get("e").is_none());
        // SAFETY: live 40-byte object.
        assert!(
            unsafe { std::slice::from_raw_parts(h.get("c").unwrap(), 40) }
                .iter()
                .all(|&x| x == k)
        );
    }
    Ok(k)
}

#[test]
fn every_fence_recovers_one_complete_checkpoint() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let probe = PowerDomain::new();
    let fences = {
        let p = dir.path().join("probe");
        let done = workload(&p, &probe);
        assert_eq!(done, vec![true; 3]);
        probe.fence_count()
    };
    let mut checked = 0;
    let mut refused = 0;
    for (i, cut) in CutPoint::all(fences).enumerate() {
        let d = PowerDomain::new();
        d.cut_power_at(cut).unwrap();
        let path = dir.path().join(format!("run{i}"));
        let done = workload(&path, &d);
        let must = done.iter().rposition(|&x| x).map_or(0, |k| k as u8 + 1);
        let policies = [
            CrashPolicy::Strict,
            CrashPolicy::Torn { seed: 1 },
            CrashPolicy::Torn { seed: 2 },
            CrashPolicy::RandomEviction { seed: 3 },
            CrashPolicy::RandomEviction { seed: 4 },
        ];
        for pol in policies {
            let img = dir
                .path()
                .join(format!("img{i}-{pol:?}").replace([' ', '{', '}', ':'], ""));
            d.write_image(&path, pol, &img).unwrap();
            match state(&img) {
                Ok(k) => {
                    assert!(
                        k == must || k == must + 1,
                        "{cut} {pol:?}: recovered {k}, must be {must} or {}",
                        must + 1
                    );
                    checked += 1;
                }
                Err(e) => {
                    // Only acceptable before the heap's creation was durable.
                    assert_eq!(
                        must, 0,
                        "{cut} {pol:?}: refused after a complete checkpoint: {e}"
                    );
                    refused += 1;
                }
            }
            std::fs::remove_file(&img).unwrap();
        }
        std::fs::remove_file(&path).unwrap();
    }
    eprintln!("{fences} fences; {checked} crash images recovered, {refused} refused (heap not yet created)");
    assert!(checked > 0);
}
