//! Every method and delay model moves a region that a running application keeps updating,
//! between two network namespaces: the application resumes on the target's copy, and at the
//! end every pattern byte is intact and the counters sum to every operation done on both
//! hosts (no update lost, no page overwritten by a stale copy).

use std::time::Duration;
use tiermem_migrate::harness::{run_case, CaseSpec, Method};
use tiermem_migrate::netns::TwoHosts;
use tiermem_migrate::workload::Workload;

fn case(hosts: &TwoHosts, workload: Workload, method: Method, id: u64) {
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let spec = CaseSpec {
        workload,
        region_len: 32 << 20,
        method: method.clone(),
        steady: Duration::from_millis(50),
        tail: Duration::from_millis(10),
        seed: id,
        id,
    };
    let r =
        run_case(hosts, fam.path(), &spec).unwrap_or_else(|e| panic!("{}: {e}", method.label()));
    assert!(r.verified);
    let m = &r.metrics;
    eprintln!(
        "{:<10} {:<28} downtime {:>7.2} ms busy {:>8.2} ms total {:>8.2} ms degradation {:.2} \
         (on demand {}, from FAM {}, pushed {})",
        workload.name(),
        method.label(),
        m.downtime_ns as f64 / 1e6,
        m.busy_ns as f64 / 1e6,
        m.total_ns as f64 / 1e6,
        r.degradation,
        m.pages_on_demand,
        m.faults_from_fam,
        m.pages_pushed
    );
    assert!(m.total_ns >= m.downtime_ns && m.total_ns > 0);
    assert!(r.steady_ops_per_s > 0.0);
    assert!(!r.timeline.is_empty());
    assert!(
        r.timeline.last().unwrap().present > 0.99,
        "every page is present at the end"
    );
}

#[test]
fn every_method_moves_a_region_under_updates() {
    let hosts = TwoHosts::create("tmmeth").expect("network namespaces (root)");
    let methods = [
        Method::parse("fam", "none", 0).unwrap(),
        Method::parse("fam", "pcm-fam", 0).unwrap(),
        Method::parse("socket", "veth", 0).unwrap(),
        Method::parse("socket", "ethernet-10g", 3).unwrap(),
        Method::parse("socket", "veth", 100).unwrap(),
        Method::parse("stop-and-copy", "pcm-fam", 0).unwrap(),
        Method::parse("pre-copy", "pcm-fam", 0).unwrap(),
    ];
    for (i, m) in methods.into_iter().enumerate() {
        case(&hosts, Workload::Uniform, m, 0x100 + i as u64);
    }
    for (i, w) in [Workload::Sequential, Workload::Zipfian]
        .into_iter()
        .enumerate()
    {
        case(
            &hosts,
            w,
            Method::parse("fam", "pcm-fam", 0).unwrap(),
            0x200 + i as u64,
        );
        case(
            &hosts,
            w,
            Method::parse("socket", "ethernet-10g", 0).unwrap(),
            0x300 + i as u64,
        );
        case(
            &hosts,
            w,
            Method::parse("fam+hot", "pcm-fam", 0).unwrap(),
            0x280 + i as u64,
        );
    }
}

#[test]
fn method_names_and_delays_are_checked() {
    assert!(Method::parse("ftp", "none", 0).is_err());
    assert!(Method::parse("fam", "warp-drive", 0).is_err());
    assert_eq!(
        Method::parse("socket", "ethernet-10g", 3).unwrap().label(),
        "socket/ethernet-10g/3ms"
    );
}
