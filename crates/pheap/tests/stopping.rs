//! `Heap::checkpoint_stopping_threads`: a thread that writes heap objects without pause is
//! stopped while the checkpoint runs, so the checkpoint is a snapshot of one instant: an object
//! the writer fills with one byte value after another reopens as at most two runs (the fill it
//! was stopped in), and counters written after each fill reopen consistent with it. Its own
//! test binary: the safepoint is process-wide.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiermem_fault::safepoint::StopOptions;
use tiermem_pheap::{Heap, HeapOptions};

const BIG: usize = 1 << 20;

#[test]
fn checkpoint_with_writers_stopped_is_a_snapshot() {
    let d = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = d.path().join("stop.heap");
    let opts = HeapOptions {
        capacity: 16 << 20,
        ..HeapOptions::default()
    };
    for round in 0..8 {
        let h = Arc::new(Heap::create(&path, &opts).unwrap());
        let big = h.malloc(BIG, Some("big")).unwrap() as usize;
        let pair = h.malloc(16, Some("pair")).unwrap() as usize;
        // SAFETY: fresh objects of BIG and 16 bytes.
        unsafe {
            std::ptr::write_bytes(big as *mut u8, 0, BIG);
            std::ptr::write_bytes(pair as *mut u8, 0, 16);
        }
        h.ckall().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    v += 1;
                    // SAFETY: live objects (freed only after this thread is joined).
                    unsafe {
                        std::ptr::write_bytes(big as *mut u8, v as u8, BIG);
                        // Second counter first, then the first: a snapshot has first >= second.
                        std::ptr::write_volatile((pair as *mut u64).add(1), v);
                        std::ptr::write_volatile(pair as *mut u64, v);
                    }
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (st, pause) = h
            .checkpoint_stopping_threads(&StopOptions::default())
            .unwrap();
        assert!(st.bytes_copied >= BIG, "round {round}: {st:?}");
        assert!(pause.as_nanos() > 0);
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        // Reopen from the checkpoint (dropping does not checkpoint).
        drop(Arc::try_unwrap(h).unwrap());
        let h = Heap::open(&path).unwrap();
        let big = h.get("big").unwrap();
        // SAFETY: the reopened objects.
        let img = unsafe { std::slice::from_raw_parts(big as *const u8, BIG) };
        // One instant: the writer may have been stopped inside a fill, so the object is the
        // new value up to some byte and the previous value after it, never more pieces.
        let (hi, lo) = (img[0], img[BIG - 1]);
        let changes = img.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(
            changes == 0 || (changes == 1 && hi == lo.wrapping_add(1)),
            "round {round}: {changes} value changes in the object ({hi} .. {lo})"
        );
        let pair = h.get("pair").unwrap() as *const u64;
        // SAFETY: as above.
        let (first, second) = unsafe { (*pair, *pair.add(1)) };
        // The writer's round v: fill with v, then second = v, then first = v. An instant is
        // inside the fill (second = first = the old value = lo), after it (second = lo - 1,
        // object uniform), after the second store (first = second - 1), or after both.
        let s = second as u8;
        assert!(
            s == lo || (s == lo.wrapping_sub(1) && hi == lo),
            "round {round}: second {second} with the object at {hi}..{lo}: different instants"
        );
        assert!(
            first == second || (first + 1 == second && s == lo && hi == lo),
            "round {round}: first {first}, second {second}, object {hi}..{lo}"
        );
        drop(h);
        std::fs::remove_file(&path).unwrap();
    }
}
