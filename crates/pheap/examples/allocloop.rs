//! The allocation loop of `tiermem bench pheap` (`alloc_ratio_vs_glibc`) for profiling: free +
//! malloc of 16–1023 B over 64 k slots, 8 bytes written into each new object, on a heap
//! (tracked, no checkpoints) and on glibc malloc, alternated, ns per round each.
//! `cargo run --release -p tiermem-pheap --example allocloop -- [DIR] [OPS] [REPS]`
use std::time::Instant;
use tiermem_pheap::{Heap, HeapOptions};

const SLOTS: usize = 1 << 16;

/// Runs `ops` rounds of "free the slot's object, allocate a new one, write 8 bytes into it"
/// over `SLOTS` slots with `free`/`malloc`; returns ns per round and the live slots.
fn rounds(
    ops: usize,
    mut free: impl FnMut(*mut u8),
    mut malloc: impl FnMut(usize) -> *mut u8,
) -> (f64, Vec<*mut u8>) {
    let mut slots = vec![std::ptr::null_mut::<u8>(); SLOTS];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let t0 = Instant::now();
    for _ in 0..ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = (x as usize) % SLOTS;
        let size = 16 + ((x >> 32) as usize) % 1008;
        if !slots[k].is_null() {
            free(slots[k]);
        }
        slots[k] = malloc(size);
        // SAFETY: a fresh block of at least 16 bytes (as the bench's loop writes).
        unsafe { (slots[k] as *mut u64).write_unaligned(x) };
    }
    (t0.elapsed().as_nanos() as f64 / ops as f64, slots)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let dir = a.get(1).map_or("/dev/shm", |s| s.as_str());
    let ops: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let reps: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let path = std::path::Path::new(dir).join(format!("allocloop-{}.heap", std::process::id()));
    for _ in 0..reps {
        let _ = std::fs::remove_file(&path);
        let h = Heap::create(
            &path,
            &HeapOptions {
                capacity: 256 << 20,
                ..HeapOptions::default()
            },
        )
        .expect("create");
        let (heap_ns, _) = rounds(
            ops,
            |p| h.free(p).expect("free"),
            |n| h.malloc(n, None).expect("malloc"),
        );
        drop(h);
        let _ = std::fs::remove_file(&path);
        let (glibc_ns, slots) = rounds(
            ops,
            // SAFETY: `p` came from the libc::malloc below (this loop's own blocks).
            |p| unsafe { libc::free(p.cast()) },
            // SAFETY: plain malloc; glibc does not fail at these sizes here.
            |n| unsafe { libc::malloc(n).cast() },
        );
        for &p in &slots {
            // SAFETY: as above.
            unsafe { libc::free(p.cast()) };
        }
        println!(
            "heap {heap_ns:.1} ns/round, glibc {glibc_ns:.1} ns/round, ratio {:.2}",
            heap_ns / glibc_ns
        );
    }
}
