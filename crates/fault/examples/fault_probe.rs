//! Prints the fault-cost probes (what `tiermem doctor` reports): `cargo run --release
//! --example fault_probe -p tiermem-fault`. Needs root (userfaultfd).

use tiermem_fault::probe::{self, percentile};

fn show(name: &str, r: tiermem_fault::Result<Vec<f64>>) {
    match r {
        Ok(s) => println!(
            "{name:<34} p50 {:>8.0} ns   p99 {:>8.0} ns   (n={})",
            percentile(&s, 50.0),
            percentile(&s, 99.0),
            s.len()
        ),
        Err(e) => println!("{name:<34} unavailable: {e}"),
    }
}

fn main() {
    show("first touch (kernel)", probe::first_touch_ns(20_000));
    show(
        "uffd in-thread (SIGBUS + COPY)",
        probe::uffd_in_thread_ns(20_000),
    );
    show(
        "uffd handler thread, blocking",
        probe::uffd_handler_thread_ns(2_000),
    );
    show(
        "uffd handler thread, spin 100us",
        probe::uffd_handler_thread_spin_ns(2_000, 100),
    );
    show(
        "mprotect + SIGSEGV + mprotect",
        probe::mprotect_fault_ns(20_000),
    );
    show(
        "write under WP_ASYNC",
        probe::write_fault_wp_async_ns(20_000),
    );
    show("memcpy 4 KiB warm", probe::memcpy_4k_ns(20_000));
    match probe::copy_gbps(256 << 20) {
        Ok(g) => println!("{:<34} {g:.1} GB/s", "memcpy bandwidth"),
        Err(e) => println!("memcpy bandwidth unavailable: {e}"),
    }
    match probe::scan_written(1 << 30, 0.01, 9, Default::default()) {
        Ok(b) => println!(
            "{:<34} median {:.3} ms over {} rounds ({} of {} pages written, {:?}, verified exact)",
            "PAGEMAP_SCAN 1 GiB, 1 % written",
            b.median_ms,
            b.scan_ms.len(),
            b.written_pages,
            b.region_pages,
            b.method
        ),
        Err(e) => println!("scan 1 GiB failed: {e}"),
    }
}
