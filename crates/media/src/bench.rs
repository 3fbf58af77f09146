//! Measurement functions the `tiermem bench media` command calls. They time real work with
//! [`now_ns`](crate::delay::now_ns) and report medians; they are not run as tests.

use crate::delay::{busy_wait_ns, now_ns, DelayModel};

/// Pause between timed accesses in [`delay_accuracy_op`].
const SETTLE_NS: u64 = 5_000;
use crate::error::{MediaError, Result};
use crate::pool::Pool;

pub use crate::persist::cpu_has_tsc_invariant;

/// Which access [`delay_accuracy_op`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessOp {
    /// `Pool::read`.
    Read,
    /// `Pool::write`.
    Write,
}

/// How closely the injected delay matches the model for one transfer size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DelayAccuracy {
    /// The access measured.
    pub op: AccessOp,
    /// Transfer size in bytes.
    pub bytes: usize,
    /// Delay the model prescribes for one access, ns.
    pub expected_ns: f64,
    /// Median over repetitions of (time of the access under the model − time of the same access
    /// with no delay model), ns.
    pub measured_ns: f64,
    /// `(measured − expected) / expected × 100` (0 when expected is 0 and nothing was measured).
    pub error_pct: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// [`delay_accuracy_op`] for writes (`Pool::write` of `bytes` bytes), the access the media
/// benchmark reports.
pub fn delay_accuracy(
    model: &DelayModel,
    bytes: usize,
    reps: usize,
    pool: &mut Pool,
) -> Result<DelayAccuracy> {
    delay_accuracy_op(AccessOp::Write, model, bytes, reps, pool)
}

/// Measure the delay injected by `model` for `op` of `bytes` bytes at data offset 0 of `pool`:
/// `reps` pairs of (access with no delay, access with `model`), interleaved, after one warm-up
/// pair, with a fence and a 5 µs pause after each timed access; the median of the per-pair differences is compared with the model. The pool's delay
/// model is restored afterwards (the `&mut` keeps other users away meanwhile).
pub fn delay_accuracy_op(
    op: AccessOp,
    model: &DelayModel,
    bytes: usize,
    reps: usize,
    pool: &mut Pool,
) -> Result<DelayAccuracy> {
    if bytes > pool.data_len() {
        return Err(MediaError::InvalidSize {
            size: bytes as u64,
            reason: format!("larger than the pool's {}-byte data area", pool.data_len()),
        });
    }
    let saved = pool.delay();
    let mut buf = vec![0xA5u8; bytes];
    let timed = |pool: &Pool, m: DelayModel, buf: &mut [u8]| -> Result<f64> {
        pool.set_delay(m);
        let t0 = now_ns();
        match op {
            AccessOp::Read => pool.read(0, buf)?,
            AccessOp::Write => pool.write(0, buf)?,
        }
        let dt = (now_ns() - t0) as f64;
        // Let non-temporal stores still draining from this access finish outside the timed
        // region, so they do not slow down the next access (which would bias the difference).
        crate::persist::fence();
        busy_wait_ns(SETTLE_NS);
        Ok(dt)
    };
    let run = |pool: &Pool, buf: &mut [u8]| -> Result<Vec<f64>> {
        let mut diffs = Vec::with_capacity(reps);
        timed(pool, DelayModel::NONE, buf)?;
        timed(pool, *model, buf)?;
        for _ in 0..reps.max(1) {
            let base = timed(pool, DelayModel::NONE, buf)?;
            let with = timed(pool, *model, buf)?;
            diffs.push(with - base);
        }
        Ok(diffs)
    };
    let res = run(pool, &mut buf);
    pool.set_delay(saved);
    let mut diffs = res?;
    let measured_ns = median(&mut diffs);
    let expected_ns = match op {
        AccessOp::Read => model.read_delay_ns(bytes as u64),
        AccessOp::Write => model.write_delay_ns(bytes as u64),
    } as f64;
    let error_pct = if expected_ns > 0.0 {
        (measured_ns - expected_ns) / expected_ns * 100.0
    } else {
        0.0
    };
    Ok(DelayAccuracy {
        op,
        bytes,
        expected_ns,
        measured_ns,
        error_pct,
    })
}

/// Median bandwidth in GB/s (10^9 bytes per second) of `reps` `Pool::write`s of `bytes` bytes at
/// data offset 0, under the pool's current delay model, after one warm-up write.
pub fn copy_bandwidth_gbps(pool: &Pool, bytes: usize, reps: usize) -> Result<f64> {
    copy_bandwidth(pool, bytes, reps).map(|b| b.gbps)
}

/// What [`copy_bandwidth`] measured.
#[derive(Clone, Copy, Debug)]
pub struct CopyBandwidth {
    /// Median wall-clock bandwidth of the timed copies, GB/s (bytes per nanosecond).
    pub gbps: f64,
    /// Bytes of the timed copies per nanosecond of the calling thread's CPU time over all of
    /// them (the copy and the delay model's busy-wait both run on it).
    pub cpu_gbps: f64,
}

/// [`copy_bandwidth_gbps`] with the calling thread's CPU time beside it.
pub fn copy_bandwidth(pool: &Pool, bytes: usize, reps: usize) -> Result<CopyBandwidth> {
    if bytes == 0 || bytes > pool.data_len() {
        return Err(MediaError::InvalidSize {
            size: bytes as u64,
            reason: format!(
                "must be between 1 and the pool's {}-byte data area",
                pool.data_len()
            ),
        });
    }
    let src: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    pool.write(0, &src)?;
    let mut rates = Vec::with_capacity(reps);
    // The clock's first use calibrates it (milliseconds of spinning): not inside the CPU count.
    let _ = now_ns();
    let cpu0 = thread_cpu_ns();
    for _ in 0..reps.max(1) {
        let t0 = now_ns();
        pool.write(0, &src)?;
        crate::persist::fence();
        let dt = (now_ns() - t0).max(1) as f64;
        rates.push(bytes as f64 / dt);
    }
    let cpu = (thread_cpu_ns() - cpu0).max(1) as f64;
    let cpu_gbps = (bytes * reps.max(1)) as f64 / cpu;
    Ok(CopyBandwidth {
        gbps: median(&mut rates),
        cpu_gbps,
    })
}

/// The calling thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ns() -> u64 {
    crate::delay::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}
