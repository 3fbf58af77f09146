//! Admission (NVSwap Ch. 5): the capacity of the two zones, calibrated on this machine, and
//! Eq. 2's demand `Σ 1/Lat_i` of the bounds already admitted plus a new one.
//!
//! The regular zone's capacity is its 4 KiB random-read IOPS at rising concurrency (1 to 16
//! threads, `O_DIRECT`, on a scratch file in the swap file's directory; the best level counts);
//! the buffer's is the rate of 4 KiB copies out of an NVM pool with its delay model (the paper
//! measured 7,900 and 215,000).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem_fault::PAGE_SIZE;
use tiermem_media::{AlignedBuf, DelayModel, Pool, PoolOptions, SsdDevice};

/// Paging capacity of this machine's two zones.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Capacity {
    /// Best 4 KiB random-read IOPS of the disk (the regular zone).
    pub ssd_iops: f64,
    /// IOPS at each concurrency tried.
    pub ssd_iops_by_threads: Vec<(usize, f64)>,
    /// 4 KiB copies per second out of the NVM buffer (its delay model included).
    pub nvm_iops: f64,
}

/// Measures [`Capacity`]: `dir` is where the swap file would go (a disk), `nvm_delay` the
/// buffer's delay model, `per_level` the time spent at each concurrency.
pub fn calibrate(dir: &Path, nvm_delay: DelayModel, per_level: Duration) -> Result<Capacity> {
    if crate::zones::is_tmpfs(dir)? {
        return Err(Error::SwapOnTmpfs {
            path: dir.to_path_buf(),
        });
    }
    let path = dir.join(format!(
        "tiermem-pager-calibrate-{}.tmp",
        std::process::id()
    ));
    let dev = Arc::new(SsdDevice::create(&path, 256 << 20)?);
    let _ = std::fs::remove_file(&path);
    // Write it once so reads hit allocated blocks.
    {
        let chunk = AlignedBuf::for_device(&dev, 1 << 20)?;
        for i in 0..256u64 {
            dev.write_at(i << 20, &chunk)?;
        }
        dev.sync()?;
    }
    let pages = dev.len() / PAGE_SIZE as u64;
    let mut by = Vec::new();
    for threads in [1usize, 2, 4, 8, 16] {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (dev, stop, done) = (dev.clone(), stop.clone(), done.clone());
                std::thread::spawn(move || -> Result<()> {
                    let mut buf = AlignedBuf::for_device(&dev, PAGE_SIZE)?;
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        dev.read_at((x % pages) * PAGE_SIZE as u64, &mut buf)?;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        let t0 = Instant::now();
        std::thread::sleep(per_level);
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join()
                .map_err(|_| Error::InvalidOption("a calibration thread panicked".into()))??;
        }
        by.push((
            threads,
            done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64(),
        ));
    }
    let ssd_iops = by.iter().map(|x| x.1).fold(0.0, f64::max);
    // The buffer: copies out of a pool with its delay model.
    let dir = tiermem_media::ensure_default_dir()?;
    let ppath = dir.join(format!("pager-calibrate-{}.pool", std::process::id()));
    let pool = Pool::create(&ppath, &PoolOptions::new(17 << 20).delay(nvm_delay));
    let _ = std::fs::remove_file(&ppath);
    let pool = pool?;
    let slots = pool.data_len() / PAGE_SIZE;
    let mut page = vec![0u8; PAGE_SIZE];
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < per_level {
        for _ in 0..256 {
            let s = (n as usize * 7919) % slots;
            // SAFETY: inside the pool's data area.
            let src = unsafe {
                std::slice::from_raw_parts(pool.data_ptr().add(s * PAGE_SIZE), PAGE_SIZE)
            };
            page.copy_from_slice(src);
            pool.charge_read(PAGE_SIZE as u64);
            n += 1;
        }
    }
    std::hint::black_box(&page);
    let nvm_iops = n as f64 / t0.elapsed().as_secs_f64();
    Ok(Capacity {
        ssd_iops,
        ssd_iops_by_threads: by,
        nvm_iops,
    })
}

/// Eq. 2: the paging demand, in IOPS, of bounds `bounds_ns` (`Σ 1/Lat_i`).
pub fn demand_iops(bounds_ns: &[u64]) -> f64 {
    bounds_ns.iter().map(|&b| 1e9 / b.max(1) as f64).sum()
}

/// Whether a new bound fits beside the admitted ones: the demand with it must not exceed the
/// two zones' capacity together. The error gives the numbers.
pub fn admit(cap: &Capacity, admitted_ns: &[u64], new_ns: u64) -> Result<()> {
    let mut all = admitted_ns.to_vec();
    all.push(new_ns);
    let demand = demand_iops(&all);
    let capacity = cap.ssd_iops + cap.nvm_iops;
    if demand > capacity {
        return Err(Error::Infeasible {
            bound_ns: new_ns,
            demand_iops: demand,
            capacity_iops: capacity,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq2_adds_the_rates_the_bounds_ask_for() {
        assert!((demand_iops(&[1_000_000, 500_000]) - 3000.0).abs() < 1e-6);
        let cap = Capacity {
            ssd_iops: 7900.0,
            ssd_iops_by_threads: vec![],
            nvm_iops: 215_000.0,
        };
        assert!(admit(&cap, &[300_000, 1_000_000], 500_000).is_ok());
        // 5 µs asks for 200,000 IOPS; with two more that is more than 222,900.
        let e = admit(&cap, &[5_000, 10_000], 20_000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("page-ins per second"), "{e}");
    }
}
