//! The benchmarks called as a library, as the CLI calls them: a small case through
//! `run(&Options) -> Report`, with the report's ratios read as fields and its JSON checked.

use tiermem_bench::{fault, media, BenchOpts};

fn quick() -> BenchOpts {
    BenchOpts {
        quick: true,
        json: true,
        plot: None,
    }
}

#[test]
fn media_quick_report_has_its_ratios_as_fields() {
    let r = media::run(&quick()).expect("bench media --quick");
    let delays: Vec<&str> = r.bandwidth.iter().map(|b| b.delay.as_str()).collect();
    assert_eq!(delays, ["none", "pcm-fam", "nvmm", "ethernet-10g"]);
    assert_eq!(r.bandwidth[0].ratio_vs_none, 1.0);
    assert!(r.bandwidth.iter().all(|b| b.copy_gbps > 0.0));
    // The three delay presets at 4 KB and 2 MB.
    assert_eq!(r.accuracy.len(), 6);
    assert!(r.delay_model_error_pct >= 0.0);
    let v = serde_json::to_value(&r).unwrap();
    for key in [
        "machine",
        "compared",
        "pool_medium",
        "bandwidth",
        "accuracy",
    ] {
        assert!(v.get(key).is_some(), "JSON key {key}");
    }
    assert!(v["delay_model_error_pct"].is_number());
    assert!(
        v.get("pool_path").is_none() && v.get("reps").is_none(),
        "table-only fields stay out of the JSON"
    );
}

#[test]
fn a_chart_name_without_png_or_svg_is_refused_before_measuring() {
    let o = BenchOpts {
        plot: Some("latency.pdf".into()),
        ..quick()
    };
    let t0 = std::time::Instant::now();
    let e = fault::run(&o).expect_err("a .pdf chart is refused");
    assert!(e.to_string().contains(".png or .svg"), "{e}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(1),
        "refused up front"
    );
    assert!(media::run(&BenchOpts {
        plot: Some("x.png".into()),
        ..quick()
    })
    .is_err());
}
