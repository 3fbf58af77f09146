//! A quick look at the first-touch critical path with and without the service: maps a region
//! (4 KiB pages), touches one byte per page in a given order with a compute gap, and prints
//! p50/p99/mean of the per-touch time in TSC ticks and the service's figures.
//! `cargo run --release -p tiermem-prefault --example touch -- [MiB] [gap_us] [asc|desc|stride4|random] [thp|4k] [write|read]`

use std::arch::x86_64::{_mm_lfence, _mm_mfence, _rdtsc};
use std::time::Instant;
use tiermem_prefault::{Options, Policy, Service};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mib: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let gap_us: f64 = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let order = a.get(3).cloned().unwrap_or_else(|| "asc".into());
    let thp = a.get(4).is_some_and(|s| s == "thp");
    let read = a.get(5).is_some_and(|s| s == "read");
    let len = mib << 20;
    for arm in ["kernel", "prefault", "kernel", "prefault"] {
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut u8;
        // SAFETY: our mapping.
        unsafe {
            libc::madvise(
                p as *mut _,
                len,
                if thp {
                    libc::MADV_HUGEPAGE
                } else {
                    libc::MADV_NOHUGEPAGE
                },
            )
        };
        let pages = len / 4096;
        let mut idx: Vec<usize> = match order.as_str() {
            "desc" => (0..pages).rev().collect(),
            "stride4" => (0..pages).step_by(4).collect(),
            "random" => {
                let mut v: Vec<usize> = (0..pages).collect();
                let mut x = 88172645463325252u64;
                for i in (1..v.len()).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    v.swap(i, (x % (i as u64 + 1)) as usize);
                }
                v
            }
            _ => (0..pages).collect(),
        };
        idx.shrink_to_fit();
        let svc = (arm == "prefault").then(|| Service::start(Options::default()).unwrap());
        let reg = svc
            .as_ref()
            .map(|s| s.register(p, len, Policy::default()).unwrap());
        let gap_ticks = (gap_us * 2000.0) as u64;
        let mut t = Vec::with_capacity(idx.len());
        let start = Instant::now();
        for &i in &idx {
            // SAFETY: touching our mapping.
            unsafe {
                let s0 = _rdtsc();
                while _rdtsc() - s0 < gap_ticks {}
                _mm_lfence();
                let t0 = _rdtsc();
                if read {
                    std::hint::black_box(std::ptr::read_volatile(p.add(i * 4096)));
                } else {
                    std::ptr::write_volatile(p.add(i * 4096), 1);
                }
                _mm_mfence();
                let mut aux = 0;
                let t1 = std::arch::x86_64::__rdtscp(&mut aux);
                t.push(t1 - t0);
            }
        }
        let wall = start.elapsed();
        t.sort_unstable();
        let mean = t.iter().sum::<u64>() as f64 / t.len() as f64;
        print!(
            "{arm:9} {order} gap {gap_us}us: p50 {} p99 {} mean {:.0} ticks, total {:?}",
            t[t.len() / 2],
            t[t.len() * 99 / 100],
            mean,
            wall
        );
        if let (Some(s), Some(r)) = (&svc, &reg) {
            let st = s.stats();
            print!("  | {:?}/{} hits {} fp {} populated {} MiB calls {} peak_unused {} KiB cpu {:?} idle {}", r.stats().order, r.stats().stride, st.tripwire_hits, st.footprint_pages, st.populated_bytes >> 20, st.populate_calls, st.peak_unused_bytes >> 10, st.service_cpu, st.sched_idle);
        }
        println!();
        drop(reg);
        drop(svc);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut _, len) };
    }
}
