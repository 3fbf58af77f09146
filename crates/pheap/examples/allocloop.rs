//! The allocation loop of `tiermem bench pheap` (`alloc_ratio_vs_glibc`) for profiling: free +
//! malloc of 16–1023 B over 64 k slots, 8 bytes written into each new object, on a heap (tracked, no checkpoints) and on glibc
//! malloc, alternated, ns per round each.
//! `cargo run --release -p tiermem-pheap --example allocloop -- [DIR] [OPS] [REPS]`
use std::time::Instant;
use tiermem_pheap::{Heap, HeapOptions};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let dir = a.get(1).map_or("/dev/shm", |s| s.as_str());
    let ops: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let reps: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    const SLOTS: usize = 1 << 16;
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
                h.free(slots[k]).expect("free");
            }
            slots[k] = h.malloc(size, None).expect("malloc");
            // SAFETY: a fresh object of at least 16 bytes (as the bench's loop writes).
            unsafe { (slots[k] as *mut u64).write_unaligned(x) };
        }
        let heap_ns = t0.elapsed().as_nanos() as f64 / ops as f64;
        drop(h);
        let _ = std::fs::remove_file(&path);
        let mut slots = vec![std::ptr::null_mut::<u8>(); SLOTS];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let t0 = Instant::now();
        for _ in 0..ops {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = (x as usize) % SLOTS;
            let size = 16 + ((x >> 32) as usize) % 1008;
            // SAFETY: plain malloc/free of this loop's own pointers.
            unsafe {
                libc::free(slots[k].cast());
                slots[k] = libc::malloc(size).cast();
                (slots[k] as *mut u64).write_unaligned(x);
            }
        }
        let glibc_ns = t0.elapsed().as_nanos() as f64 / ops as f64;
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
