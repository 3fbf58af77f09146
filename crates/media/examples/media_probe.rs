//! Prints what the media layer sees on this machine: CPU features, TSC rate, pool medium, SSD
//! direct-I/O support, non-temporal copy bandwidth against memcpy, and delay-model accuracy for
//! every preset at 4 KB and 2 MB (reads and writes). A benchmark, not a test: run with
//! `cargo run --release -p tiermem-media --example media_probe`.

use tiermem_media::bench::{copy_bandwidth_gbps, delay_accuracy_op, AccessOp};
use tiermem_media::{cpu_features, now_ns, tsc_ghz, DelayModel, Pool, PoolOptions, SsdDevice};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cpu: {:?}", cpu_features());
    println!("tsc: {:.4} GHz", tsc_ghz());
    let dir = tempfile::Builder::new()
        .prefix("tiermem-probe")
        .tempdir_in("/dev/shm")?;
    let mut pool = Pool::create(dir.path().join("p"), &PoolOptions::new(72 << 20))?;
    println!("pool medium on /dev/shm: {:?}", pool.medium());
    for (d, name) in [("/dev/shm", "tmpfs"), ("/var/tmp", "/var/tmp")] {
        let t = tempfile::Builder::new()
            .prefix("tiermem-probe")
            .tempdir_in(d)?;
        let s = SsdDevice::create(t.path().join("ssd"), 1 << 20)?;
        println!(
            "ssd on {name}: direct={} align={:?} io_uring={}",
            s.direct(),
            s.alignment(),
            s.uses_io_uring()
        );
    }

    let n = 64 << 20;
    let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let memcpy = median(
        (0..9)
            .map(|_| {
                let t = now_ns();
                dst.copy_from_slice(std::hint::black_box(&src));
                n as f64 / (now_ns() - t) as f64
            })
            .collect(),
    );
    let nt = median(
        (0..9)
            .map(|_| {
                let t = now_ns();
                tiermem_media::nt_copy_slice(&mut dst, std::hint::black_box(&src));
                n as f64 / (now_ns() - t) as f64
            })
            .collect(),
    );
    println!(
        "64 MiB copy: memcpy {memcpy:.2} GB/s, nt_copy {nt:.2} GB/s, pool.write {:.2} GB/s",
        copy_bandwidth_gbps(&pool, n, 9)?
    );

    let mut worst: f64 = 0.0;
    for name in ["pcm-fam", "nvmm", "ethernet-10g"] {
        let m = DelayModel::preset(name).unwrap();
        for bytes in [4096usize, 2 << 20] {
            for op in [AccessOp::Read, AccessOp::Write] {
                let a = delay_accuracy_op(op, &m, bytes, 201, &mut pool)?;
                worst = worst.max(a.error_pct.abs());
                println!("{name:>13} {bytes:>8} B {op:?}: model {:>10.0} ns, injected {:>10.1} ns, error {:+.2} %", a.expected_ns, a.measured_ns, a.error_pct);
            }
        }
    }
    println!("worst delay error: {worst:.2} %");
    Ok(())
}
