//! The benchmarks' charts, drawn with `plotters`: cumulative distributions of latency samples on
//! a logarithmic axis (`bench fault`), grouped bars on a logarithmic axis (`bench kv`) and
//! stacked timeline panels (`bench migrate`; with a y axis per panel, `bench snapshot`). A chart
//! is written as PNG when its file name ends in `.png` and as SVG when it ends in `.svg`.
//!
//! Text is laid out with plotters' `ab_glyph` feature, which needs no system library: the font
//! is DejaVu Sans, read at the first chart from `$TIERMEM_FONT` or the Debian package
//! fonts-dejavu-core (installed by scripts/setup.sh); a missing font is a clear error.

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::OnceLock;

/// One curve: a label and its samples (any unit; the axis label says which).
pub struct Series<'a> {
    pub label: &'a str,
    pub samples: &'a [f64],
}

/// One system's bars in a grouped bar chart: a label and one value per group (`None`: no bar,
/// e.g. the system failed).
pub struct Bars<'a> {
    pub label: &'a str,
    pub values: &'a [Option<f64>],
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

const COLORS: [RGBColor; 11] = [
    RGBColor(0x1b, 0x9e, 0x77),
    RGBColor(0xd9, 0x5f, 0x02),
    RGBColor(0x75, 0x70, 0xb3),
    RGBColor(0xe7, 0x29, 0x8a),
    RGBColor(0x66, 0xa6, 0x1e),
    RGBColor(0xe6, 0xab, 0x02),
    RGBColor(0xa6, 0x76, 0x1d),
    RGBColor(0x1f, 0x78, 0xb4),
    // bench prefault draws up to 11 curves in one chart.
    RGBColor(0xe3, 0x1a, 0x1c),
    RGBColor(0x66, 0x66, 0x66),
    RGBColor(0x00, 0x00, 0x00),
];

/// The font family every chart uses (registered under this name).
const FONT: &str = "sans-serif";
/// Where fonts-dejavu-core puts DejaVu Sans.
const DEJAVU: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Register the charts' font once per process; the error says how to get one.
fn ensure_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = std::env::var_os("TIERMEM_FONT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| DEJAVU.into());
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "charts need a TrueType font: cannot read {} ({e}); install Debian's \
                 fonts-dejavu-core (scripts/setup.sh does) or set TIERMEM_FONT to a .ttf file",
                path.display()
            )
        })?;
        // Registered fonts live for the whole process (plotters keeps a &'static).
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        for style in [FontStyle::Normal, FontStyle::Bold] {
            plotters::style::register_font(FONT, style, bytes)
                .map_err(|_| format!("{} is not a usable TrueType font", path.display()))?;
        }
        Ok(())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// Check that `path` names a chart format (.png or .svg) before a benchmark measures anything.
pub fn check_path(path: &Path) -> Result<()> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
    {
        Some(e) if e == "png" || e == "svg" => Ok(()),
        _ => bail!(
            "{}: a chart is written as .png or .svg (name the file so)",
            path.display()
        ),
    }
}

fn draw_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// Draw with `$draw(&root, args...)` on a PNG or SVG backend chosen by `$path`'s extension,
/// then write the file.
macro_rules! render {
    ($path:expr, $size:expr, $draw:ident ( $($arg:expr),* )) => {{
        let path: &Path = $path;
        check_path(path)?;
        ensure_font()?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase());
        match ext.as_deref() {
            Some("png") => {
                let root = BitMapBackend::new(path, $size).into_drawing_area();
                $draw(&root, $($arg),*)?;
                root.present().map_err(draw_err)
            }
            _ => {
                // (check_path let through .svg only)
                let root = SVGBackend::new(path, $size).into_drawing_area();
                $draw(&root, $($arg),*)?;
                root.present().map_err(draw_err)
            }
        }
        .with_context(|| format!("writing {}", path.display()))
    }};
}

/// Write the empirical CDF of each series (x: log10 scale) to `path` (.png or .svg).
pub fn cdf(path: &Path, title: &str, x_label: &str, series: &[Series<'_>]) -> Result<()> {
    render!(path, (860, 480), draw_cdf(title, x_label, series))
}

fn draw_cdf<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    series: &[Series<'_>],
) -> Result<()> {
    root.fill(&WHITE).map_err(draw_err)?;
    let (lo, hi) = log_range(series.iter().flat_map(|s| s.samples.iter().copied()));
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 17))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("fraction of samples ≤ x")
        .label_style((FONT, 13))
        .x_label_formatter(&|v| fmt_si(*v))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(draw_err)?;
    for (i, ser) in series.iter().enumerate() {
        let mut v: Vec<f64> = ser.samples.iter().copied().filter(|x| *x > 0.0).collect();
        if v.is_empty() {
            continue;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len() as f64;
        // At most ~400 points per curve, the last one always.
        let step = (v.len() / 400).max(1);
        let last = v.len() - 1;
        let pts: Vec<(f64, f64)> = (0..v.len())
            .step_by(step)
            .chain((last % step != 0).then_some(last))
            .map(|k| (v[k], (k + 1) as f64 / n))
            .collect();
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(draw_err)?
            .label(ser.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0x99, 0x99, 0x99))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Write a grouped bar chart to `path` (.png or .svg): one group per entry of `groups` (x axis),
/// one bar per series in each group, heights on a log10 axis (values spanning decades stay
/// readable), each bar labelled with its value. Non-positive and missing values draw no bar.
pub fn bars(
    path: &Path,
    title: &str,
    y_label: &str,
    groups: &[&str],
    series: &[Bars<'_>],
) -> Result<()> {
    render!(path, (860, 480), draw_bars(title, y_label, groups, series))
}

fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    groups: &[&str],
    series: &[Bars<'_>],
) -> Result<()> {
    root.fill(&WHITE).map_err(draw_err)?;
    let (lo, hi) = log_range(
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied()),
    );
    let ng = groups.len().max(1);
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 17))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..ng as f64, (lo..hi).log_scale())
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(ng * 2 + 1)
        .x_label_formatter(&|x| {
            // Group names at the groups' centres only.
            let g = x - 0.5;
            if (g - g.round()).abs() < 1e-6 && g >= 0.0 {
                groups.get(g.round() as usize).unwrap_or(&"").to_string()
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .y_label_formatter(&|v| fmt_si(*v))
        .label_style((FONT, 13))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(draw_err)?;
    let bw = 0.8 / series.len().max(1) as f64;
    for (i, ser) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let bars: Vec<(f64, f64)> = (0..groups.len())
            .filter_map(|g| {
                let v = ser.values.get(g).copied().flatten().filter(|v| *v > 0.0)?;
                Some((g as f64 + 0.1 + i as f64 * bw, v))
            })
            .collect();
        chart
            .draw_series(
                bars.iter()
                    .map(|&(x, v)| Rectangle::new([(x, lo), (x + bw * 0.9, v)], c.filled())),
            )
            .map_err(draw_err)?
            .label(ser.label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Text::new(
                    fmt_si(v),
                    (x + bw * 0.45, v),
                    (FONT, 10)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )
            }))
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0x99, 0x99, 0x99))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Write stacked timeline panels to `path` (.png or .svg): x linear (`x_label`, the same range
/// in every panel), y linear from 0 to `y_max` (`y_label`), one legend per panel, a dotted
/// vertical line at x = 0 when the range spans it.
pub fn timeline(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    y_max: f64,
    panels: &[Panel<'_>],
) -> Result<()> {
    let axes: Vec<(&Panel<'_>, &str, f64)> = panels.iter().map(|p| (p, y_label, y_max)).collect();
    let h = 60 + panels.len().max(1) as u32 * 270;
    render!(path, (1060, h), draw_timeline(title, x_label, &axes))
}

/// A panel of [`timeline_axes`] with a y axis of its own: its label and its upper bound (the
/// axis starts at 0).
pub struct AxisPanel<'a> {
    /// The panel's title and lines.
    pub panel: Panel<'a>,
    /// Its y axis's label.
    pub y_label: &'a str,
    /// Its y axis's upper bound.
    pub y_max: f64,
}

/// [`timeline`] with a y axis per panel (panels of different quantities, e.g. memory in MB
/// and throughput in ops/s, over the same time range).
pub fn timeline_axes(
    path: &Path,
    title: &str,
    x_label: &str,
    panels: &[AxisPanel<'_>],
) -> Result<()> {
    let axes: Vec<(&Panel<'_>, &str, f64)> = panels
        .iter()
        .map(|p| (&p.panel, p.y_label, p.y_max))
        .collect();
    let h = 60 + panels.len().max(1) as u32 * 270;
    render!(path, (1060, h), draw_timeline(title, x_label, &axes))
}

/// Draw panels, each with its y label and y maximum.
fn draw_timeline<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    panels: &[(&Panel<'_>, &str, f64)],
) -> Result<()> {
    root.fill(&WHITE).map_err(draw_err)?;
    let root = root.titled(title, (FONT, 15)).map_err(draw_err)?;
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    for x in panels
        .iter()
        .flat_map(|p| p.0.lines.iter().flat_map(|l| l.points.iter().map(|q| q.0)))
        .filter(|x| x.is_finite())
    {
        x0 = x0.min(x);
        x1 = x1.max(x);
    }
    if x0 >= x1 {
        (x0, x1) = (0.0, 1.0);
    }
    let areas = root.split_evenly((panels.len().max(1), 1));
    for (&(p, y_label, y_max), area) in panels.iter().zip(areas.iter()) {
        // The legend to the right of the plot, as long labels would cover the curves.
        let (plot_area, legend_area) = area.split_horizontally(area.dim_in_pixel().0 as i32 - 330);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(p.title, (FONT, 14))
            .margin(8)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(x0..x1, 0.0..y_max)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .y_labels(5)
            .x_label_formatter(&|x| format!("{}", (x * 1e3).round() / 1e3 + 0.0))
            .label_style((FONT, 12))
            .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
            .draw()
            .map_err(draw_err)?;
        if x0 < 0.0 && x1 > 0.0 {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, 0.0), (0.0, y_max)],
                    2,
                    2,
                    RGBColor(0x44, 0x44, 0x44).into(),
                ))
                .map_err(draw_err)?;
        }
        for (li, l) in p.lines.iter().enumerate() {
            let c = COLORS[l.color % COLORS.len()];
            let pts = l
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&(x, y)| (x, y.clamp(0.0, y_max)));
            let style = c.stroke_width(2);
            if l.dashed {
                chart.draw_series(DashedLineSeries::new(pts, 6, 4, style))
            } else {
                chart.draw_series(LineSeries::new(pts, style))
            }
            .map_err(draw_err)?;
            let y = 40 + li as i32 * 18;
            let sample: Vec<(i32, i32)> = vec![(10, y), (36, y)];
            if l.dashed {
                legend_area.draw(&DashedPathElement::new(sample, 5, 3, style))
            } else {
                legend_area.draw(&PathElement::new(sample, style))
            }
            .map_err(draw_err)?;
            legend_area
                .draw(&Text::new(
                    l.label.to_string(),
                    (44, y),
                    (FONT, 12)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Left, VPos::Center)),
                ))
                .map_err(draw_err)?;
        }
    }
    Ok(())
}

/// 1234567 -> "1.2M", 28100 -> "28.1k", 10000 -> "10k", 950 -> "950", 0.5 -> "0.5".
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
    } else if x >= 0.01 {
        format!("{x:.1}{unit}")
    } else {
        format!("{x:.0e}")
    }
}

/// A log axis for `values` (non-positive ones ignored): from the decade at or below the
/// smallest to the one at or above the largest, at least one decade apart; 1..10 when nothing
/// is left.
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() || hi <= 0.0 {
        return (1.0, 10.0);
    }
    let llo = lo.log10().floor();
    let lhi = hi.log10().ceil().max(llo + 1.0);
    (10f64.powf(llo), 10f64.powf(lhi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("tiermem-plot-{}-{name}", std::process::id()))
    }

    #[test]
    fn si_labels_without_a_needless_decimal() {
        assert_eq!(fmt_si(1_200_000.0), "1.2M");
        assert_eq!(fmt_si(28_100.0), "28.1k");
        assert_eq!(fmt_si(10_000.0), "10k");
        assert_eq!(fmt_si(950.0), "950");
        assert_eq!(log_range([3.0, 250.0].into_iter()), (1.0, 1000.0));
        assert_eq!(log_range(std::iter::empty()), (1.0, 10.0));
    }

    #[test]
    fn every_chart_writes_png_and_svg_and_refuses_other_names() {
        if ensure_font().is_err() {
            eprintln!("note: no font ({DEJAVU}): skipping");
            return;
        }
        let a = [1.0, 2.0, 3.0];
        let b = [10.0, 20.0];
        let series = [
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
        ];
        let va = [Some(1_200_000.0), Some(28_100.0)];
        let vb = [None, Some(950.0)];
        let bars_ = [
            Bars {
                label: "a",
                values: &va,
            },
            Bars {
                label: "b",
                values: &vb,
            },
        ];
        let pts = [(-5.0, 1.0), (0.0, 0.2), (10.0, 1.1)];
        let panels = [Panel {
            title: "p",
            lines: vec![
                Line {
                    label: "t",
                    color: 0,
                    dashed: false,
                    points: &pts,
                },
                Line {
                    label: "present",
                    color: 0,
                    dashed: true,
                    points: &pts,
                },
            ],
        }];
        for ext in ["png", "svg"] {
            let p = scratch(&format!("c.{ext}"));
            cdf(&p, "t <x>", "µs", &series).unwrap();
            bars(
                &scratch(&format!("b.{ext}")),
                "kv",
                "ops/s",
                &["set", "get"],
                &bars_,
            )
            .unwrap();
            timeline(
                &scratch(&format!("t.{ext}")),
                "tl",
                "ms",
                "rel",
                1.2,
                &panels,
            )
            .unwrap();
            timeline_axes(
                &scratch(&format!("a.{ext}")),
                "axes",
                "ms",
                &[
                    AxisPanel {
                        panel: Panel {
                            title: "MB",
                            lines: vec![Line {
                                label: "m",
                                color: 1,
                                dashed: false,
                                points: &pts,
                            }],
                        },
                        y_label: "MB",
                        y_max: 2.0,
                    },
                    AxisPanel {
                        panel: Panel {
                            title: "ops/s",
                            lines: vec![],
                        },
                        y_label: "ops/s",
                        y_max: 5e5,
                    },
                ],
            )
            .unwrap();
            for n in ["c", "b", "t", "a"] {
                let f = scratch(&format!("{n}.{ext}"));
                let bytes = std::fs::read(&f).unwrap();
                if ext == "png" {
                    assert!(bytes.starts_with(b"\x89PNG"), "{}", f.display());
                } else {
                    assert!(bytes.starts_with(b"<svg"), "{}", f.display());
                }
                let _ = std::fs::remove_file(&f);
            }
        }
        let svg = std::fs::read_to_string({
            let p = scratch("x.svg");
            cdf(&p, "t <x>", "µs", &series).unwrap();
            p
        })
        .unwrap();
        assert!(svg.contains("t &lt;x&gt;"));
        let _ = std::fs::remove_file(scratch("x.svg"));
        assert!(cdf(&scratch("c.pdf"), "t", "µs", &series).is_err());
    }
}
