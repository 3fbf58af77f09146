//! Tour step `migrate`: FAM-aware post-copy migration of a running application (a 64 MiB region
//! it keeps updating) from one "host" to another — two network namespaces joined by a veth pair
//! — through a FAM directory both see: the harness of `tiermem migrate run` and `tiermem bench
//! migrate` (`tiermem_migrate::harness`), which checks every byte at the target. Skipped when
//! not root or when network namespaces cannot be created.

use super::{is_root, which, Ctx, Outcome};
use anyhow::{ensure, Result};
use std::time::Duration;
use tiermem_migrate::harness::{run_case, CaseSpec, Method};
use tiermem_migrate::netns::{Host, TwoHosts};
use tiermem_migrate::workload::Workload;

/// Run the step; the namespaces and the FAM directory are removed before it returns.
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    if !is_root() {
        return Ok(Outcome::Skipped(
            "needs root (it creates two network namespaces)".into(),
        ));
    }
    if which("ip").is_none() {
        return Ok(Outcome::Skipped(
            "`ip` is not installed (Debian package iproute2; scripts/setup.sh installs it)".into(),
        ));
    }
    let hosts = match TwoHosts::create("tmtour") {
        Ok(h) => h,
        Err(e) => {
            return Ok(Outcome::Skipped(format!(
                "cannot create network namespaces here: {e}"
            )))
        }
    };
    let fam = ctx.file("fam");
    let _cleanup = super::RemoveOnDrop::dir(&fam);
    std::fs::create_dir_all(&fam)?;
    let method = Method::parse("fam", "pcm-fam", 100).map_err(anyhow::Error::msg)?;
    let id = u64::from(ctx.tag) << 20 | 0x70;
    let spec = CaseSpec {
        workload: Workload::Uniform,
        region_len: 64 << 20,
        method: method.clone(),
        steady: Duration::from_millis(300),
        tail: Duration::from_millis(50),
        seed: id,
        id,
    };
    say!(
        "a 64 MiB region under uniform random updates in {} migrates to {} by {} (FAM directory {})",
        hosts.name(Host::Src),
        hosts.name(Host::Dst),
        method.label(),
        fam.display()
    );
    let r = run_case(&hosts, &fam, &spec).map_err(anyhow::Error::msg)?;
    drop(hosts);
    ensure!(r.verified, "the target's region differs from the source's");
    let m = &r.metrics;
    let ms = |ns: u64| ns as f64 / 1e6;
    say!(
        "downtime {:.2} ms, source busy {:.1} ms, every page at the target after {:.1} ms; {} pages read from FAM by the target's fault handler, {} asked of the source; the application kept running ({:.0} % of its steady rate during the migration); every byte checked at the target",
        ms(m.downtime_ns),
        ms(m.busy_ns),
        ms(m.total_ns),
        m.faults_from_fam,
        m.pages_on_demand,
        r.degradation * 100.0
    );
    Ok(Outcome::Ok(format!(
        "a running 64 MiB region moved between two network namespaces through FAM: downtime {:.2} ms, busy {:.1} ms, every byte checked",
        ms(m.downtime_ns),
        ms(m.busy_ns)
    )))
}
