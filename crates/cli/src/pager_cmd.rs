//! `tiermem pager calibrate`: the paging capacity of this machine's two zones (NVSwap Ch. 5),
//! which admission weighs page-in bounds against: 4 KiB random reads of the disk that would hold
//! the swap file at 1 to 16 threads, and 4 KiB copies out of an NVM pool with the `nvmm` delay.

use anyhow::{bail, Result};
use clap::Subcommand;
use std::path::PathBuf;
use std::time::Duration;

/// pager subcommands.
#[derive(Subcommand, Debug)]
pub enum PagerCommand {
    /// Measure the zones' capacity (swap-file IOPS at rising concurrency, NVM buffer copies per
    /// second) and the demand of a bound (Eq. 2: 1/bound).
    Calibrate {
        /// Directory the swap file would live in (a disk; default /var/tmp).
        #[arg(long, default_value = "/var/tmp")]
        dir: PathBuf,
        /// Milliseconds at each concurrency level.
        #[arg(long, default_value_t = 500)]
        ms: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Run one pager subcommand.
pub fn run(cmd: PagerCommand) -> Result<()> {
    match cmd {
        PagerCommand::Calibrate { dir, ms, json } => {
            if ms == 0 {
                bail!("--ms must be at least 1");
            }
            let cap = tiermem_pager::calibrate(
                &dir,
                tiermem_media::DelayModel::NVMM,
                Duration::from_millis(ms),
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&cap)?);
            } else {
                println!("regular zone ({}): 4 KiB random reads", dir.display());
                for (t, iops) in &cap.ssd_iops_by_threads {
                    println!("  {t:>2} threads: {iops:>9.0} IOPS");
                }
                println!("  capacity: {:.0} IOPS", cap.ssd_iops);
                println!(
                    "NVM buffer (nvmm delay): {:.0} 4 KiB copies per second",
                    cap.nvm_iops
                );
                println!(
                    "together {:.0} page-ins per second; a p99 bound of B µs asks for 10^6/B \
                     (Eq. 2: 300 µs asks for 3333)",
                    cap.ssd_iops + cap.nvm_iops
                );
            }
            Ok(())
        }
    }
}
