//! `tiermem bench media`: copy bandwidth into a pool with each delay preset (against the same copy
//! with no delay model), and the accuracy of the injected delay at 4 KB and 2 MB transfers.

use crate::machine;
use crate::{progress, BenchOpts};
use anyhow::{Context, Result};
use serde::Serialize;
use tiermem_media::bench::{copy_bandwidth, delay_accuracy};
use tiermem_media::{DelayModel, Pool, PoolKind, PoolOptions};

const PRESETS: [&str; 4] = ["none", "pcm-fam", "nvmm", "ethernet-10g"];

/// `bench media`'s options: the common ones (it has no chart, so `plot` is refused).
pub type Options = BenchOpts;

/// Copy bandwidth under one delay preset.
#[derive(Debug, Clone, Serialize)]
pub struct BandwidthRow {
    pub delay: String,
    pub model: String,
    pub copy_gbps: f64,
    pub ratio_vs_none: f64,
    /// Bytes copied per nanosecond of the copying thread's CPU (the delay model busy-waits on
    /// it), and its ratio to the no-delay preset's.
    pub cpu_gbps: f64,
    pub ratio_vs_none_per_cpu: f64,
}

/// The injected delay against the model for one preset and transfer size.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyRow {
    pub delay: String,
    pub bytes: usize,
    pub expected_us: f64,
    pub measured_us: f64,
    pub error_pct: f64,
}

/// What `bench media` measured; `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: machine::Machine,
    pub compared: &'static str,
    pub pool_medium: String,
    pub bandwidth: Vec<BandwidthRow>,
    pub accuracy: Vec<AccuracyRow>,
    /// The worst |error| of the accuracy rows, in percent.
    pub delay_model_error_pct: f64,
    /// The pool file the copies went to (removed at the end), for the table.
    #[serde(skip)]
    pub pool_path: std::path::PathBuf,
    /// Repetitions per accuracy cell, for the table.
    #[serde(skip)]
    pub reps: usize,
}

/// Run `bench media`: copy bandwidth under every delay preset and the delay model's accuracy.
/// Errors if `o.plot` is set (no chart) or the benchmark pool cannot be created.
pub fn run(o: &Options) -> Result<Report> {
    let dir = tiermem_media::ensure_default_dir()?;
    let path = dir.join(format!("bench-media-{}.pool", std::process::id()));
    if o.plot.is_some() {
        anyhow::bail!("bench media has no chart; its two tables are the result");
    }
    let copy_bytes: usize = if o.quick { 2 << 20 } else { 64 << 20 };
    let pool_size = (copy_bytes as u64 + (4 << 20)).max(8 << 20);
    let _ = std::fs::remove_file(&path);
    let mut pool = Pool::create(
        &path,
        &PoolOptions {
            size: pool_size,
            kind: PoolKind::Fam,
            tag: "bench-media".into(),
            ..PoolOptions::default()
        },
    )
    .with_context(|| format!("creating the benchmark pool {}", path.display()))?;
    // Remove the pool file whatever happens below.
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _cleanup = Cleanup(path.clone());

    let reps = if o.quick { 15 } else { 41 };
    let mut bandwidth = Vec::new();
    let mut base_gbps = f64::NAN;
    let mut base_cpu_gbps = f64::NAN;
    for name in PRESETS {
        let model: DelayModel = name.parse()?;
        pool.set_delay(model);
        progress(o.json, &format!("copy bandwidth, delay {name}"));
        let bw = copy_bandwidth(&pool, copy_bytes, if o.quick { 5 } else { 9 })?;
        let gbps = bw.gbps;
        if name == "none" {
            base_gbps = gbps;
            base_cpu_gbps = bw.cpu_gbps;
        }
        bandwidth.push(BandwidthRow {
            delay: name.into(),
            model: model.to_string(),
            copy_gbps: round2(gbps),
            ratio_vs_none: round3(gbps / base_gbps),
            cpu_gbps: round2(bw.cpu_gbps),
            ratio_vs_none_per_cpu: round3(bw.cpu_gbps / base_cpu_gbps),
        });
    }

    let mut accuracy = Vec::new();
    let mut worst: f64 = 0.0;
    for name in PRESETS.iter().filter(|n| **n != "none") {
        let model: DelayModel = name.parse()?;
        for bytes in [4096usize, 2 << 20] {
            progress(o.json, &format!("delay accuracy, {name}, {bytes} B"));
            let a = delay_accuracy(&model, bytes, reps, &mut pool)?;
            worst = worst.max(a.error_pct.abs());
            accuracy.push(AccuracyRow {
                delay: name.to_string(),
                bytes,
                expected_us: round3(a.expected_ns / 1e3),
                measured_us: round3(a.measured_ns / 1e3),
                error_pct: round2(a.error_pct),
            });
        }
    }
    pool.set_delay(DelayModel::default());

    let report = Report {
        machine: machine::describe(),
        compared: "pool writes (non-temporal copy) under each delay preset vs the same copy with delay 'none'",
        pool_medium: format!("{:?}", pool.persist_method()),
        bandwidth,
        accuracy,
        delay_model_error_pct: round2(worst),
        pool_path: path.clone(),
        reps,
    };
    Ok(report)
}

impl crate::Report for Report {
    fn print_table(&self) {
        let report = self;
        let reps = self.reps;
        println!("tiermem bench media — {}", report.compared);
        println!("machine: {}", report.machine.one_line());
        println!(
            "pool: {} ({})\n",
            report.pool_path.display(),
            report.pool_medium
        );
        println!(
            "{:<14} {:>12} {:>10} {:>16}  model",
            "delay", "copy GB/s", "vs none", "GB per CPU-s"
        );
        for r in &report.bandwidth {
            println!(
                "{:<14} {:>12.2} {:>9.3}× {:>16.2}  {}",
                r.delay, r.copy_gbps, r.ratio_vs_none, r.cpu_gbps, r.model
            );
        }
        println!(
            "\n{:<14} {:>9} {:>13} {:>13} {:>8}",
            "delay", "bytes", "model µs", "injected µs", "error"
        );
        for r in &report.accuracy {
            println!(
                "{:<14} {:>9} {:>13.3} {:>13.3} {:>7.2}%",
                r.delay, r.bytes, r.expected_us, r.measured_us, r.error_pct
            );
        }
        println!(
            "\nworst delay-model error: {:.2} % (median of {reps} repetitions per cell)",
            report.delay_model_error_pct
        );
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
