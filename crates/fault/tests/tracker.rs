//! WriteTracker: exactly the written pages, across rounds, for both methods.

mod common;
use common::*;
use std::collections::BTreeSet;
use tiermem_fault::*;

fn expand(v: &[PageRange]) -> BTreeSet<usize> {
    let mut s = BTreeSet::new();
    for r in v {
        assert_eq!(r.offset % PS, 0);
        assert!(r.len > 0 && r.len % PS == 0);
        for p in r.offset / PS..(r.offset + r.len) / PS {
            assert!(s.insert(p), "page {p} reported twice in one scan");
        }
    }
    s
}

fn exact_rounds(opts: TrackerOptions, expect: TrackingMethod) {
    use rand::{Rng, SeedableRng};
    let pages = 1024;
    let a = Area::anon(pages);
    // Half the pages populated before tracking starts, half never touched.
    for p in 0..pages / 2 {
        unsafe { *a.page(p) = 1 };
    }
    let mut t = WriteTracker::new(a.ptr, a.len, opts).unwrap();
    assert_eq!(t.method(), expect);
    let mut out = Vec::new();
    assert_eq!(t.scan(&mut out).unwrap(), 0, "nothing written yet");
    assert!(out.is_empty());
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for round in 0..8 {
        let n = rng.gen_range(1..200);
        let mut want = BTreeSet::new();
        for _ in 0..n {
            let p = rng.gen_range(0..pages);
            want.insert(p);
            // Write some pages twice.
            let times = if rng.gen_bool(0.3) { 2 } else { 1 };
            for k in 0..times {
                unsafe { std::ptr::write_volatile(a.page(p).add(k * 8 + round), round as u8) };
            }
        }
        // Reads never count.
        for _ in 0..100 {
            let p = rng.gen_range(0..pages);
            unsafe { std::ptr::read_volatile(a.page(p)) };
        }
        let got_n = t.scan(&mut out).unwrap();
        let got = expand(&out);
        assert_eq!(got, want, "{expect:?} round {round}");
        assert_eq!(got_n, want.len());
        // Adjacent pages are merged into one range.
        assert!(
            out.windows(2).all(|w| w[0].offset + w[0].len < w[1].offset),
            "ranges sorted and merged"
        );
        // A scan right after reports nothing.
        assert_eq!(
            t.scan(&mut out).unwrap(),
            0,
            "{expect:?} round {round}: rescan"
        );
    }
    // Contents survived tracking.
    drop(t);
    unsafe { std::ptr::write_volatile(a.page(3), 9) };
    assert_eq!(unsafe { *a.page(3) }, 9);
}

#[test]
fn tracker_uffd_wp_async_exact() {
    let f = require_uffd();
    require(f.wp_async, "UFFD_FEATURE_WP_ASYNC");
    exact_rounds(TrackerOptions::default(), TrackingMethod::UffdWpAsync);
}

#[test]
fn tracker_mprotect_exact() {
    exact_rounds(
        TrackerOptions {
            force_mprotect: true,
            ..Default::default()
        },
        TrackingMethod::Mprotect,
    );
}

#[test]
fn tracker_many_ranges_cross_output_chunks() {
    // More written runs than one PAGEMAP_SCAN output chunk (4096): walk_end looping.
    let f = require_uffd();
    require(f.wp_async, "UFFD_FEATURE_WP_ASYNC");
    let pages = 20_000;
    let a = Area::anon(pages);
    let mut t = WriteTracker::new(a.ptr, a.len, TrackerOptions::default()).unwrap();
    let mut out = Vec::new();
    for round in 0..2 {
        for p in (round..pages).step_by(2) {
            unsafe { std::ptr::write_volatile(a.page(p), 1) };
        }
        let n = t.scan(&mut out).unwrap();
        assert_eq!(n, (round..pages).step_by(2).count());
        assert_eq!(
            expand(&out),
            (round..pages).step_by(2).collect::<BTreeSet<_>>()
        );
    }
}

#[test]
fn tracker_concurrent_writers_lose_nothing() {
    // Writers keep writing while scans run: every page written after a scan started shows up in
    // that scan or a later one.
    let f = require_uffd();
    require(f.wp_async, "UFFD_FEATURE_WP_ASYNC");
    for opts in [
        TrackerOptions::default(),
        TrackerOptions {
            force_mprotect: true,
            ..Default::default()
        },
    ] {
        let pages = 512;
        let a = Area::anon(pages);
        let mut t = WriteTracker::new(a.ptr, a.len, opts).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        std::thread::scope(|s| {
            let base = a.addr();
            let stop = &stop;
            s.spawn(move || {
                // 20 full passes over all pages, interleaved with the scans below.
                let mut p = 0;
                for _ in 0..20 * pages {
                    unsafe { std::ptr::write_volatile((base + p * PS) as *mut u8, 1) };
                    p = (p + 7) % pages;
                }
                stop.store(true, std::sync::atomic::Ordering::Release);
            });
            let mut scans = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                t.scan(&mut out).unwrap();
                seen.extend(expand(&out));
                scans += 1;
            }
            let _ = scans;
        });
        t.scan(&mut out).unwrap();
        seen.extend(expand(&out));
        assert_eq!(
            seen.len(),
            pages,
            "{:?}: all pages were written at least once",
            t.method()
        );
    }
}

#[test]
fn tracker_bad_input() {
    let a = Area::anon(2);
    let e = WriteTracker::new(unsafe { a.ptr.add(8) }, PS, TrackerOptions::default()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = WriteTracker::new(a.ptr, 0, TrackerOptions::default()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Two trackers over the same range: the second is refused.
    let _t = WriteTracker::new(a.ptr, a.len, TrackerOptions::default()).unwrap();
    let e = WriteTracker::new(a.ptr, a.len, TrackerOptions::default()).unwrap_err();
    assert!(e.to_string().contains("already registered"), "{e}");
}

#[test]
fn scan_bench_function_verifies_exactness() {
    let f = require_uffd();
    require(f.wp_async, "UFFD_FEATURE_WP_ASYNC");
    let b = probe::scan_written(16 << 20, 0.01, 3, TrackerOptions::default()).unwrap();
    assert_eq!(b.method, TrackingMethod::UffdWpAsync);
    assert_eq!(b.scan_ms.len(), 3);
    let b = probe::scan_written(
        4 << 20,
        0.02,
        2,
        TrackerOptions {
            force_mprotect: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(b.method, TrackingMethod::Mprotect);
}

/// A lazy tracker (nothing write-protected at the start) over shared memory: a bounded scan
/// reports the pages below its limit that are not protected — written ones, and ones never
/// mapped (which `PAGEMAP_SCAN` counts as written) — protects them, and nothing above the
/// limit; after that, and after `protect`, exactly the written pages come back.
#[test]
fn lazy_tracker_scans_up_to_its_limit_and_is_exact_once_protected() {
    let f = require_uffd();
    require(f.wp_async, "UFFD_FEATURE_WP_ASYNC");
    let pages = 256;
    let a = Area::shared_anon(pages);
    let opts = TrackerOptions {
        lazy: true,
        ..Default::default()
    };
    let mut t = WriteTracker::new(a.ptr, a.len, opts).unwrap();
    if t.method() != TrackingMethod::UffdWpAsync {
        eprintln!("skipped: no userfaultfd WP_ASYNC on shared memory here");
        return;
    }
    for p in [3, 100, 200] {
        unsafe { std::ptr::write_volatile(a.page(p), 1) };
    }
    let mut out = Vec::new();
    // The first 128 pages: all reported (never protected), none above.
    t.scan_upto(&mut out, 128 * PS).unwrap();
    assert_eq!(expand(&out), (0..128).collect::<BTreeSet<_>>());
    // Now protected: only what is written again comes back.
    unsafe { std::ptr::write_volatile(a.page(7), 1) };
    t.scan_upto(&mut out, 128 * PS).unwrap();
    assert_eq!(expand(&out), [7].into_iter().collect::<BTreeSet<_>>());
    // The upper half, protected explicitly: page 200's earlier write is forgotten, as for
    // data the caller already holds; a new write is reported.
    t.protect(128 * PS, 128 * PS).unwrap();
    unsafe { std::ptr::write_volatile(a.page(150), 1) };
    t.scan(&mut out).unwrap();
    assert_eq!(expand(&out), [150].into_iter().collect::<BTreeSet<_>>());
}
