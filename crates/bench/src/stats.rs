//! Small order statistics for reports: medians and percentiles of samples (few samples: sorted
//! copies; YCSB's raw samples, the many-sample case, go through an HdrHistogram in kv_harness).

use serde::Serialize;

/// The p-th percentile (0..=100) of `samples` by nearest rank; NaN for an empty slice. One
/// definition for the project: the fault crate's, which `doctor`'s probes use.
pub use tiermem_fault::probe::percentile;

/// p50 and p99 of a set of latency samples, in the unit of the samples.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct P50P99 {
    pub p50: f64,
    pub p99: f64,
}

impl P50P99 {
    /// Summarise samples given in nanoseconds as microseconds, rounded to 0.01 µs.
    pub fn from_ns_as_us(samples_ns: &[f64]) -> Self {
        let r = |x: f64| (x / 10.0).round() / 100.0;
        P50P99 {
            p50: r(percentile(samples_ns, 50.0)),
            p99: r(percentile(samples_ns, 99.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn summary_converts_ns_to_us() {
        let s = P50P99::from_ns_as_us(&[1000.0, 2000.0, 3000.0]);
        assert_eq!(s.p50, 2.0);
        assert_eq!(s.p99, 3.0);
    }
}
