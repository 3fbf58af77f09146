//! The threads' allocation caches (issue #21 part 3): checkpoints taken while other threads
//! allocate and free through their caches are each a consistent, verifiable image; the slots
//! cached by a thread that exits go back to the heap; frees are still checked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiermem_pheap::{Error, Heap, HeapOptions};

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap()
}

fn opts(capacity: usize) -> HeapOptions {
    HeapOptions {
        capacity,
        ..HeapOptions::default()
    }
}

/// Three threads allocate, write and free small objects without pause while the main thread
/// checkpoints; a copy of the pool taken after each checkpoint must pass `inspect` (its object
/// table replays and every page's live bytes match their checksum). A checkpoint that read the
/// slot entries while a cache changed them would record a table whose pages do not match the
/// checksums it computed (checked: with `Shared::exclude` a no-op, copies fail).
#[test]
fn checkpoints_taken_while_threads_allocate_and_free_all_verify() {
    let d = dir();
    let path = d.path().join("churn");
    let h = Arc::new(Heap::create(&path, &opts(2 << 20)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let ts: Vec<_> = (0..3u8)
        .map(|t| {
            let (h, stop) = (h.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut mine: Vec<(usize, usize)> = Vec::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(t);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let s = 1 + (x as usize >> 8) % 700;
                    if mine.len() < 400 {
                        let p = h.malloc(s, None).unwrap();
                        // SAFETY: a fresh object of `s` bytes.
                        unsafe { std::ptr::write_bytes(p, t, s) };
                        mine.push((p as usize, s));
                    }
                    if x % 2 == 0 && !mine.is_empty() {
                        let (p, _) = mine.swap_remove((x >> 20) as usize % mine.len());
                        h.free(p as *mut u8).unwrap();
                    }
                    n += 1;
                }
                (mine, n)
            })
        })
        .collect();
    let copy = d.path().join("copy");
    for round in 0..30 {
        h.ckall().unwrap();
        // No other checkpoint runs until the next round: the file holds this one.
        std::fs::copy(&path, &copy).unwrap();
        let r = tiermem_pheap::inspect::inspect(&copy).unwrap();
        assert!(
            r.problems.is_empty(),
            "checkpoint {round}: {:?}",
            r.problems
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    let mut live = 0;
    let mut ops = 0;
    for j in ts {
        let (mine, n) = j.join().unwrap();
        live += mine.len();
        ops += n;
    }
    assert!(ops > 3000, "the threads ran ({ops} operations)");
    assert_eq!(h.len(), live);
    h.ckall().unwrap();
    let h = Arc::try_unwrap(h).ok().unwrap();
    drop(h);
    let h = Heap::open(&path).unwrap();
    assert_eq!(h.len(), live);
}

/// Each of 40 threads in turn allocates and frees 16 objects of 2 KiB, leaving them in its
/// cache, and exits; the heap (256 KiB: 128 such slots) must still serve 100 of them. Without
/// the exiting threads' slots going back, the eighth thread finds the heap full.
#[test]
fn exited_threads_give_their_cached_slots_back() {
    let d = dir();
    let h = Arc::new(Heap::create(d.path().join("exit"), &opts(256 << 10)).unwrap());
    for _ in 0..40 {
        let h = h.clone();
        std::thread::spawn(move || {
            let ps: Vec<_> = (0..16).map(|_| h.malloc(2000, None).unwrap()).collect();
            for p in ps {
                h.free(p).unwrap();
            }
        })
        .join()
        .unwrap();
    }
    assert_eq!(h.len(), 0);
    let ps: Vec<_> = (0..100).map(|_| h.malloc(2000, None).unwrap()).collect();
    assert_eq!(h.len(), 100);
    for p in ps {
        h.free(p).unwrap();
    }
}

/// A double free is refused whichever threads allocated and freed, and the object freed by
/// another thread's cache is reused.
#[test]
fn frees_through_caches_are_checked() {
    let d = dir();
    let h = Arc::new(Heap::create(d.path().join("check"), &opts(1 << 20)).unwrap());
    let p = h.malloc(100, None).unwrap() as usize;
    let h2 = h.clone();
    std::thread::spawn(move || {
        h2.free(p as *mut u8).unwrap();
        assert!(matches!(
            h2.free(p as *mut u8),
            Err(Error::InvalidPointer(_))
        ));
        // Not the start of an object.
        let q = h2.malloc(100, None).unwrap();
        assert!(matches!(
            h2.free(q.wrapping_add(16)),
            Err(Error::InvalidPointer(_))
        ));
        h2.free(q).unwrap();
    })
    .join()
    .unwrap();
    assert!(matches!(
        h.free(p as *mut u8),
        Err(Error::InvalidPointer(_))
    ));
    assert_eq!(h.len(), 0);
}

/// One thread alternates between two heaps: each switch gives the other heap's cached slots
/// back (the thread has one cache at a time), so a 256 KiB heap (128 slots of 2000 bytes) still
/// serves 100 objects after 40 switches that each cached some of its slots; counts and frees
/// stay right on both heaps.
#[test]
fn a_thread_moving_between_heaps_gives_each_its_slots_back() {
    let d = dir();
    let a = Heap::create(d.path().join("a"), &opts(256 << 10)).unwrap();
    let b = Heap::create(d.path().join("b"), &opts(256 << 10)).unwrap();
    for _ in 0..40 {
        for h in [&a, &b] {
            let ps: Vec<_> = (0..16).map(|_| h.malloc(2000, None).unwrap()).collect();
            for p in ps {
                h.free(p).unwrap();
            }
        }
    }
    assert_eq!((a.len(), b.len()), (0, 0));
    for h in [&a, &b] {
        let ps: Vec<_> = (0..100).map(|_| h.malloc(2000, None).unwrap()).collect();
        assert_eq!(h.len(), 100);
        for &p in &ps {
            h.free(p).unwrap();
        }
        assert!(matches!(h.free(ps[0]), Err(Error::InvalidPointer(_))));
        assert_eq!(h.len(), 0);
    }
}
