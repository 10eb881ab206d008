//! PNG plots with plotters' bitmap backend, on the axes of the thesis' figures: Fig. 4.8 (gang
//! request latency per design) and Fig. 4.9 a/b/c (per-resource creation latency against the
//! number created; makespan against resources present; scheduling latency against resources
//! requested).
//!
//! Text needs a TrueType font, read at run time (no system library is linked): DejaVu Sans or
//! Liberation Sans from the usual places, or the file named by `ESCHER_BENCH_FONT`. Without
//! one, plots are skipped with a note; the JSON and the table do not need them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, anyhow};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::report::{Line, Plot, PlotData, WorkloadReport};
use crate::stats::Summary;

/// The family name the font is registered under.
const FAMILY: &str = "sans-serif";
/// Plot size in pixels.
const SIZE: (u32, u32) = (1000, 640);

/// Where fonts usually are.
const FONT_PATHS: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
];

/// Registers a font once; the error says why there is none.
fn font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Ok(path) = std::env::var("ESCHER_BENCH_FONT") {
            candidates.push(path.into());
        }
        candidates.extend(FONT_PATHS.iter().map(PathBuf::from));
        let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| {
            "no TrueType font found (set ESCHER_BENCH_FONT to a .ttf file)".to_string()
        })?;
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font(FAMILY, FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable font", path.display()))
    })
    .clone()
}

/// Draws every plot of `reports` into `out`; returns the files written and the problems met.
pub fn draw_all(reports: &[WorkloadReport], out: &Path) -> (Vec<PathBuf>, Vec<String>) {
    let mut written = Vec::new();
    let mut problems = Vec::new();
    if let Err(why) = font() {
        problems.push(format!("plots skipped: {why}"));
        return (written, problems);
    }
    for plot in reports.iter().flat_map(|r| r.plots.iter()) {
        let path = out.join(&plot.file);
        match draw(plot, &path) {
            Ok(()) => written.push(path),
            Err(e) => problems.push(format!("{}: {e:#}", plot.file)),
        }
    }
    (written, problems)
}

fn draw(plot: &Plot, path: &Path) -> anyhow::Result<()> {
    match &plot.data {
        PlotData::Lines { lines, x_log } => {
            let points: Vec<(f64, f64)> = lines.iter().flat_map(|l| l.points.clone()).collect();
            if points.is_empty() {
                return Err(anyhow!("no points"));
            }
            let (xmin, xmax) = bounds(points.iter().map(|p| p.0));
            let (_, ymax) = bounds(points.iter().map(|p| p.1));
            // Head room above the data for the legend.
            let y = 0.0..(ymax * 1.45).max(1e-9);
            if *x_log {
                let lo = (xmin / 1.5).max(1e-9);
                let hi = (xmax * 1.5).max(lo * 10.0);
                lines_chart(plot, path, (lo..hi).log_scale(), y, lines)
            } else {
                let pad = ((xmax - xmin) * 0.05).max(0.5);
                lines_chart(plot, path, (xmin - pad)..(xmax + pad), y, lines)
            }
        }
        PlotData::Distributions { categories } => distributions_chart(plot, path, categories),
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

/// Line colours that read well on white (Tableau's first five), then black.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(0, 0, 0),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// An axis label: 3 significant digits, no trailing zeros.
fn tick(v: f64) -> String {
    let text = crate::report::num(v);
    if text.contains('.') && !text.contains(',') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn style(size: u32) -> TextStyle<'static> {
    (FAMILY, size).into_font().into()
}

fn lines_chart<X>(
    plot: &Plot,
    path: &Path,
    x: X,
    y: std::ops::Range<f64>,
    lines: &[Line],
) -> anyhow::Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).context("fill")?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&plot.title, style(22))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(x, y)
        .context("axes")?;
    chart
        .configure_mesh()
        .x_desc(plot.x_label.as_str())
        .y_desc(plot.y_label.as_str())
        .axis_desc_style(style(18))
        .label_style(style(15))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .context("mesh")?;
    for (i, line) in lines.iter().enumerate() {
        // Reference lines (the thesis, a peer) are black and dashed.
        let reference = line.name.starts_with("thesis") || line.name.starts_with("Ray");
        let color = if reference { BLACK } else { color(i) };
        let pts = line.points.clone();
        if reference {
            chart
                .draw_series(DashedLineSeries::new(
                    pts.clone(),
                    10,
                    6,
                    color.stroke_width(2),
                ))
                .context("line")?
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
                .context("line")?
        }
        .label(line.name.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 5, color.filled())))
            .context("points")?;
    }
    chart
        .configure_series_labels()
        .label_font(style(15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .context("legend")?;
    root.present().context("write PNG")?;
    Ok(())
}

fn distributions_chart(
    plot: &Plot,
    path: &Path,
    categories: &[(String, Summary)],
) -> anyhow::Result<()> {
    if categories.is_empty() {
        return Err(anyhow!("no categories"));
    }
    // Latencies span orders of magnitude across designs and peers: a logarithmic axis.
    let ymax = categories
        .iter()
        .map(|(_, s)| s.max)
        .fold(0.0_f64, f64::max)
        .max(1e-3)
        * 3.0;
    let ymin = categories
        .iter()
        .map(|(_, s)| s.min)
        .fold(f64::INFINITY, f64::min)
        .max(1e-3)
        / 2.0;
    let n = categories.len();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).context("fill")?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&plot.title, style(22))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), (ymin..ymax).log_scale())
        .context("axes")?;
    let names: Vec<String> = categories.iter().map(|(c, _)| c.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 0.01 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| tick(*v))
        .x_desc(plot.x_label.as_str())
        .y_desc(plot.y_label.as_str())
        .axis_desc_style(style(18))
        .label_style(style(15))
        .draw()
        .context("mesh")?;
    for (i, (_, s)) in categories.iter().enumerate() {
        let x = i as f64;
        let color = color(i);
        // Whisker from min to max, box from p50 to p95, a bar at p50, a cross at the max.
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, s.min), (x, s.max)],
                BLACK.stroke_width(2),
            )))
            .context("whisker")?;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x - 0.25, s.p50), (x + 0.25, s.p95)],
                color.mix(0.6).filled(),
            )))
            .context("box")?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x - 0.3, s.p50), (x + 0.3, s.p50)],
                BLACK.stroke_width(4),
            )))
            .context("median")?;
        chart
            .draw_series(std::iter::once(Cross::new(
                (x, s.max),
                7,
                BLACK.stroke_width(2),
            )))
            .context("max")?;
        let label = format!(
            "p50 {} / p95 {} / max {} ms",
            crate::report::num(s.p50),
            crate::report::num(s.p95),
            crate::report::num(s.max)
        );
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (x - 0.45, s.max * 1.6),
                style(14),
            )))
            .context("label")?;
    }
    root.present().context("write PNG")?;
    Ok(())
}
