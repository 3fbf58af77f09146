//! Where a checkpoint's time goes: a heap of CAP MiB (default 128) filled with N objects of
//! SIZE bytes, then rounds of "write K objects, checkpoint", printing each phase's median.
//! `cargo run --release -p tiermem-pheap --example ckcost -- [DIR] [CAP_MIB] [K] [VIEWS]`
use tiermem_pheap::{CkStats, Heap, HeapOptions};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let dir = a.get(1).cloned().unwrap_or_else(|| "/dev/shm".into());
    let cap: usize = a.get(2).and_then(|x| x.parse().ok()).unwrap_or(128);
    let k: usize = a.get(3).and_then(|x| x.parse().ok()).unwrap_or(1);
    let views: usize = a.get(4).and_then(|x| x.parse().ok()).unwrap_or(2);
    let path = std::path::Path::new(&dir).join(format!("ckcost-{}.heap", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let t = std::time::Instant::now();
    let h = Heap::create(
        &path,
        &HeapOptions {
            capacity: cap << 20,
            views,
            ..HeapOptions::default()
        },
    )
    .unwrap();
    eprintln!("create {:?}", t.elapsed());
    let size = 256;
    let n = (cap << 20) / 2 / size;
    let mut objs = Vec::with_capacity(n);
    for i in 0..n {
        let p = h.malloc(size, None).unwrap();
        // SAFETY: a fresh object of `size` bytes.
        unsafe { std::ptr::write_bytes(p, i as u8, size) };
        objs.push(p);
    }
    let t = std::time::Instant::now();
    let st = h.ckall().unwrap();
    eprintln!(
        "first checkpoint {:?} ({} bytes)",
        t.elapsed(),
        st.bytes_copied
    );
    let mut rows: Vec<CkStats> = Vec::new();
    for r in 0..41 {
        for j in 0..k {
            let p = objs[(r * 7919 + j * 104729) % n];
            // SAFETY: a live object of `size` bytes.
            unsafe { *p = r as u8 };
        }
        rows.push(h.ckall().unwrap());
    }
    let med = |f: &dyn Fn(&CkStats) -> u64| {
        let mut v: Vec<u64> = rows.iter().map(f).collect();
        v.sort();
        v[v.len() / 2]
    };
    println!(
        "cap {cap} MiB, {n} objects, {k} written: total {} us, bytes {}",
        med(&|s| s.nanos) / 1000,
        med(&|s| s.bytes_copied as u64)
    );
    for (i, name) in CkStats::PHASES.iter().enumerate() {
        println!("  {name:7} {:>8} us", med(&|s| s.phase_ns[i]) / 1000);
    }
    drop(h);
    let _ = std::fs::remove_file(&path);
}
