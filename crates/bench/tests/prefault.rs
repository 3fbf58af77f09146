//! `bench prefault` called as a library: the smallest part of its quick case (the cells the
//! must-have figures come from, on a small mapping, and the 10 % case), every JSON key present
//! and every figure sane. No timing thresholds: what is fast enough is the report's business.

use tiermem_bench::{prefault, BenchOpts};

#[test]
fn smallest_part_has_every_key_and_sane_figures() {
    let o = BenchOpts {
        quick: true,
        json: true,
        plot: None,
    };
    let sc = prefault::Scope::smallest();
    let r = prefault::run_scoped(&o, &sc).expect("bench prefault, smallest part");
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "machine",
        "floor",
        "results",
        "programs",
        "critical_path_ratio_write",
        "critical_path_ratio_read",
        "critical_path_ratio_write_mean",
        "critical_path_ratio_uffd_move",
        "gap0_time_ratio",
        "thp_p99_ratio",
        "startup_ratio_populate_over_prefault",
        "pool_peak_bytes",
        "pool_budget_bytes",
        "app_speedup_pct",
    ] {
        assert!(v.get(key).is_some(), "JSON key {key}");
    }
    // Every ratio the smallest part measures is a positive number.
    for key in [
        "critical_path_ratio_write",
        "critical_path_ratio_read",
        "critical_path_ratio_write_mean",
        "critical_path_ratio_uffd_move",
        "gap0_time_ratio",
        "thp_p99_ratio",
        "startup_ratio_populate_over_prefault",
    ] {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} = {}", v[key]));
        assert!(x > 0.0 && x.is_finite(), "{key} = {x}");
    }
    assert!(v["programs"]["skipped"].is_string(), "no programs here");
    assert!(v["app_speedup_pct"].is_null());
    assert_eq!(
        r.pool_budget_bytes,
        64 << 20,
        "the service's default budget"
    );
    assert!(r.pool_peak_bytes.is_some(), "the 10 % case's prefault runs");
    assert!(r.floor.first_touch_p50_us > 0.0);
    assert!(r.floor.first_touch_p99_us >= r.floor.first_touch_p50_us);

    let micro_touches = ((sc.region_mib << 20) / 4096) as u64;
    let arms: Vec<&str> = r.results.iter().map(|x| x.arm).collect();
    for a in [
        "kernel",
        "populate_all",
        "prefault",
        "prefault_paper",
        "uffd_move_pool",
        "uffd_copy",
        "uffd_zeropage",
    ] {
        assert!(arms.contains(&a), "arm {a} measured");
    }
    for x in &r.results {
        let what = format!(
            "{} {} THP {} {:?} {:?}",
            x.case, x.arm, x.thp, x.order, x.op
        );
        assert!(x.p50_ns > 0.0, "{what}: p50 {}", x.p50_ns);
        assert!(
            x.p50_ns <= x.p99_ns && x.p99_ns <= x.p999_ns && x.p999_ns <= x.max_ns,
            "{what}: percentiles out of order"
        );
        assert!(x.mean_ns > 0.0 && x.mean_ns <= x.max_ns, "{what}: mean");
        assert!(
            x.first_touch_ms > 0.0 && x.first_touch_ms <= x.total_ms,
            "{what}: first touch {} ms of {} ms",
            x.first_touch_ms,
            x.total_ms
        );
        assert!(x.setup_ms <= x.first_touch_ms, "{what}: setup");
        // Every touched page is resident afterwards.
        assert!(
            x.rss_over_touched >= 1.0,
            "{what}: RSS/touched {}",
            x.rss_over_touched
        );
        if x.case == "micro" {
            assert_eq!(x.touches, micro_touches, "{what}: one touch per page");
        } else {
            assert_eq!(
                x.touches,
                micro_touches * 64 / 8 / 10,
                "{what}: 10 % of the pages"
            );
        }
        let prefault_arm = x.arm.starts_with("prefault");
        assert_eq!(x.service.is_some(), prefault_arm, "{what}: service figures");
        if let Some(s) = &x.service {
            assert!(x.service_cpu_ms.is_some(), "{what}: service CPU");
            assert_eq!(s.budget_bytes, 64 << 20);
            assert_eq!(s.failures, 0, "{what}: failed populates");
        }
        if x.arm == "kernel" && x.thp == "off" && x.op == prefault::Op::Write {
            // The baseline: each first write is a fault of the application thread.
            assert!(x.app_faults >= x.touches, "{what}: {} faults", x.app_faults);
            assert_eq!(x.rss_over_touched, 1.0, "{what}");
        }
        if let Some(p) = &x.pool {
            assert_eq!(p.moves + p.misses, x.touches, "{what}: every fault served");
            assert_eq!(p.move_errors, 0, "{what}");
        }
    }
    assert!(r
        .must
        .iter()
        .any(|c| c.figure == "critical_path_ratio_write"));
}
