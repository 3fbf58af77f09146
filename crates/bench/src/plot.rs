//! Minimal SVG charts for benchmark results (no dependencies): cumulative distributions of
//! latency samples on a logarithmic time axis, and grouped bar charts on a logarithmic value axis.

use std::fmt::Write;

/// One curve: a label and its samples (any unit; the axis label says which).
pub struct Series<'a> {
    pub label: &'a str,
    pub samples: &'a [f64],
}

const COLORS: [&str; 8] = [
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1f78b4",
];

/// Render the empirical CDF of each series as an SVG document (x: log10 scale).
pub fn cdf_svg(title: &str, x_label: &str, series: &[Series<'_>]) -> String {
    let (w, h) = (860.0, 480.0);
    let (left, right, top, bottom) = (70.0, 250.0, 40.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let (lo, llo, lhi) = log_axis(series.iter().flat_map(|s| s.samples.iter().copied()));
    let xmap = |x: f64| left + (x.max(lo).log10() - llo) / (lhi - llo) * pw;
    let ymap = |q: f64| top + (1.0 - q) * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>
"#,
        left + pw / 2.0,
        esc(title)
    );
    // Grid: decades on x, quartiles on y.
    let mut d = llo;
    while d <= lhi + 1e-9 {
        let x = left + (d - llo) / (lhi - llo) * pw;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 16.0,
            fmt_decade(d)
        );
        d += 1.0;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 0.99] {
        let y = ymap(q);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{q}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="18" y="{:.1}" transform="rotate(-90 18 {:.1})" text-anchor="middle">fraction of samples ≤ x</text>"#,
        left + pw / 2.0,
        h - 18.0,
        esc(x_label),
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (i, ser) in series.iter().enumerate() {
        let mut v: Vec<f64> = ser.samples.iter().copied().filter(|x| *x > 0.0).collect();
        if v.is_empty() {
            continue;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len() as f64;
        let step = (v.len() / 400).max(1);
        let mut pts = String::new();
        for (k, x) in v
            .iter()
            .enumerate()
            .step_by(step)
            .chain(std::iter::once((v.len() - 1, &v[v.len() - 1])))
        {
            let _ = write!(pts, "{:.1},{:.1} ", xmap(*x), ymap((k + 1) as f64 / n));
        }
        let c = COLORS[i % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>"#
        );
        let ly = top + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            w - right + 15.0,
            w - right + 40.0,
            w - right + 46.0,
            ly + 4.0,
            esc(ser.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One system's bars in a grouped bar chart: a label and one value per group (`None`: no bar,
/// e.g. the system failed).
pub struct Bars<'a> {
    pub label: &'a str,
    pub values: &'a [Option<f64>],
}

/// Render a grouped bar chart as an SVG document: one group per entry of `groups` (x axis), one
/// bar per series in each group, heights on a log10 axis (values spanning decades, e.g. pipelined
/// and unpipelined throughput, stay readable), each bar labelled with its value. Non-positive and
/// missing values draw no bar.
pub fn bars_svg(title: &str, y_label: &str, groups: &[&str], series: &[Bars<'_>]) -> String {
    let (w, h) = (860.0, 480.0);
    let (left, right, top, bottom) = (80.0, 200.0, 40.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let (_, llo, lhi) = log_axis(
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied()),
    );
    let ymap = |v: f64| top + ph - (v.log10() - llo) / (lhi - llo) * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>
"#,
        left + pw / 2.0,
        esc(title)
    );
    let mut d = llo;
    while d <= lhi + 1e-9 {
        let y = top + ph - (d - llo) / (lhi - llo) * ph;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            fmt_si(10f64.powf(d))
        );
        d += 1.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" transform="rotate(-90 18 {:.1})" text-anchor="middle">{}</text>"#,
        top + ph / 2.0,
        top + ph / 2.0,
        esc(y_label)
    );
    let gw = pw / groups.len().max(1) as f64;
    let bw = gw * 0.8 / series.len().max(1) as f64;
    for (g, name) in groups.iter().enumerate() {
        let gx = left + g as f64 * gw;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + gw / 2.0,
            top + ph + 18.0,
            esc(name)
        );
        for (i, ser) in series.iter().enumerate() {
            let Some(v) = ser.values.get(g).copied().flatten().filter(|v| *v > 0.0) else {
                continue;
            };
            let x = gx + gw * 0.1 + i as f64 * bw;
            let y = ymap(v);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                bw * 0.9,
                top + ph - y,
                COLORS[i % COLORS.len()],
                x + bw * 0.45,
                y - 3.0,
                fmt_si(v)
            );
        }
    }
    for (i, ser) in series.iter().enumerate() {
        let ly = top + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="10" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            w - right + 15.0,
            ly - 5.0,
            COLORS[i % COLORS.len()],
            w - right + 35.0,
            ly + 4.0,
            esc(ser.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// 1234567 -> "1.2M", 28100 -> "28.1k", 10000 -> "10k", 950 -> "950".
fn fmt_si(v: f64) -> String {
    let (x, unit) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if x >= 100.0 || (unit.is_empty() && x >= 1.0) || (x - x.round()).abs() < 0.05 {
        format!("{x:.0}{unit}")
    } else {
        format!("{x:.1}{unit}")
    }
}

/// A log axis for `values` (non-positive ones ignored): the smallest value, and the decades
/// (log10) the axis starts and ends at, at least one decade apart; 1..10 when nothing is left.
fn log_axis(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() || hi <= 0.0 {
        lo = 1.0;
        hi = 10.0;
    }
    let llo = lo.log10().floor();
    (lo, llo, hi.log10().ceil().max(llo + 1.0))
}

fn fmt_decade(d: f64) -> String {
    let v = 10f64.powf(d);
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One line of a timeline panel: a label, a colour index, solid or dashed, and its points
/// (x, y).
pub struct Line<'a> {
    pub label: &'a str,
    pub color: usize,
    pub dashed: bool,
    pub points: &'a [(f64, f64)],
}

/// One panel of a timeline chart (shared x range across panels).
pub struct Panel<'a> {
    pub title: &'a str,
    pub lines: Vec<Line<'a>>,
}

/// Render stacked timeline panels as one SVG document: x linear (`x_label`, shared range), y
/// linear from 0 to `y_max` (`y_label`), one legend per panel; a vertical line at x = 0.
pub fn timeline_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    y_max: f64,
    panels: &[Panel<'_>],
) -> String {
    let (w, ph) = (1060.0, 220.0);
    let (left, right, top, gap) = (70.0, 340.0, 46.0, 50.0);
    let pw = w - left - right;
    let h = top + panels.len() as f64 * (ph + gap) + 10.0;
    let xs = panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.0)));
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    for x in xs {
        x0 = x0.min(x);
        x1 = x1.max(x);
    }
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    let span = (x1 - x0).max(1e-9);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="22" font-size="14">{}</text>
"#,
        esc(title)
    );
    // Round x ticks: a step of 1, 2 or 5 × 10^k giving 5 to 10 ticks.
    let raw = span / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|st| span / st <= 10.0)
        .unwrap_or(10.0 * mag);
    for (pi, p) in panels.iter().enumerate() {
        let pt = top + pi as f64 * (ph + gap);
        let xmap = |x: f64| left + (x - x0) / span * pw;
        let ymap = |y: f64| pt + ph - (y.clamp(0.0, y_max) / y_max) * ph;
        let _ = writeln!(
            s,
            r##"<text x="{left}" y="{:.1}" font-size="13">{}</text><rect x="{left}" y="{pt:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#999"/>"##,
            pt - 6.0,
            esc(p.title)
        );
        for i in 0..=4 {
            let y = y_max * i as f64 / 4.0;
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.1}</text>"##,
                ymap(y),
                left + pw,
                ymap(y),
                left - 6.0,
                ymap(y) + 4.0,
                y
            );
        }
        let mut x = (x0 / step).ceil() * step;
        while x <= x1 + 1e-9 {
            let _ = writeln!(
                s,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                xmap(x),
                pt + ph,
                xmap(x),
                pt + ph + 4.0,
                xmap(x),
                pt + ph + 16.0,
                // (+ 0.0: no "-0" label)
                (x * 1e6).round() / 1e6 + 0.0
            );
            x += step;
        }
        if x0 < 0.0 && x1 > 0.0 {
            let _ = writeln!(
                s,
                r##"<line x1="{:.1}" y1="{pt:.1}" x2="{:.1}" y2="{:.1}" stroke="#444" stroke-dasharray="2,2"/>"##,
                xmap(0.0),
                xmap(0.0),
                pt + ph
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="18" y="{:.1}" transform="rotate(-90 18 {:.1})" text-anchor="middle">{}</text>"#,
            pt + ph / 2.0,
            pt + ph / 2.0,
            esc(y_label)
        );
        for (li, l) in p.lines.iter().enumerate() {
            let color = COLORS[l.color % COLORS.len()];
            let dash = if l.dashed {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            };
            let mut d = String::new();
            for (i, &(x, y)) in l.points.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1} ",
                    if i == 0 { "M" } else { "L" },
                    xmap(x),
                    ymap(y)
                );
            }
            let _ = writeln!(
                s,
                r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.4"{dash}/>"#
            );
            let ly = pt + 10.0 + li as f64 * 18.0;
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
                w - right + 15.0,
                w - right + 40.0,
                w - right + 46.0,
                ly + 4.0,
                esc(l.label)
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        h - 4.0,
        esc(x_label)
    );
    s.push_str("</svg>\n");
    s
}

/// Convert an SVG document to a PNG file with `rsvg-convert` (Debian's librsvg2-bin, installed
/// by scripts/setup.sh). The SVG is written next to it (`.svg`) either way.
pub fn write_png(svg: &str, png: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let svg_path = png.with_extension("svg");
    std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
    let out = std::process::Command::new("rsvg-convert")
        .arg("-o")
        .arg(png)
        .arg(&svg_path)
        .output()
        .context(
            "running rsvg-convert (Debian package librsvg2-bin; scripts/setup.sh installs it)",
        )?;
    if !out.status.success() {
        anyhow::bail!(
            "rsvg-convert failed on {}: {}",
            svg_path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_has_one_polyline_per_nonempty_series() {
        let a = [1.0, 2.0, 3.0];
        let b = [10.0, 20.0];
        let svg = cdf_svg(
            "t <x>",
            "µs",
            &[
                Series {
                    label: "a",
                    samples: &a,
                },
                Series {
                    label: "b",
                    samples: &b,
                },
                Series {
                    label: "empty",
                    samples: &[],
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;x&gt;"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn bars_skip_missing_values_and_label_the_rest() {
        let a = [Some(1_200_000.0), Some(28_100.0)];
        let b = [None, Some(950.0)];
        let svg = bars_svg(
            "kv <ops>",
            "ops/s",
            &["set", "ycsb-a"],
            &[
                Bars {
                    label: "a",
                    values: &a,
                },
                Bars {
                    label: "b",
                    values: &b,
                },
            ],
        );
        // 3 bars + 2 legend swatches + the background.
        assert_eq!(svg.matches("<rect").count(), 6);
        assert!(svg.contains(">1.2M<") && svg.contains(">28.1k<") && svg.contains(">950<"));
        assert!(
            svg.contains(">10k<"),
            "decade labels without a needless decimal"
        );
        assert!(svg.contains("kv &lt;ops&gt;"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
