//! Dependency-free SVG charts: a run's completed requests and p50/p99 latency per second, and any
//! series sampled over a run (such as a server's memory).

use crate::Report;
use std::fmt::Write as _;

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 220.0;
const MARGIN: f64 = 80.0;

fn polyline(points: &[(f64, f64)], x_max: f64, y_max: f64, top: f64, color: &str) -> String {
    let plot_width = WIDTH - 2.0 * MARGIN;
    let coordinates: Vec<String> = points
        .iter()
        .map(|(x, y)| {
            let px = MARGIN + x / x_max.max(1.0) * plot_width;
            let py = top + PANEL_HEIGHT - y / y_max.max(f64::MIN_POSITIVE) * PANEL_HEIGHT;
            format!("{px:.1},{py:.1}")
        })
        .collect();
    format!(
        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
        coordinates.join(" ")
    )
}

fn panel(
    svg: &mut String,
    top: f64,
    title: &str,
    y_max: f64,
    unit: &str,
    decimals: usize,
    x_max: f64,
) {
    let _ = writeln!(
        svg,
        "<rect x=\"{MARGIN}\" y=\"{top}\" width=\"{}\" height=\"{PANEL_HEIGHT}\" fill=\"none\" stroke=\"#999\"/>",
        WIDTH - 2.0 * MARGIN
    );
    let _ = writeln!(
        svg,
        "<text x=\"{MARGIN}\" y=\"{}\" font-size=\"14\">{title}</text>",
        top - 8.0
    );
    for fraction in [0.0, 0.5, 1.0] {
        let y = top + PANEL_HEIGHT * (1.0 - fraction);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{y:.1}\" font-size=\"11\" text-anchor=\"end\">{:.decimals$} {unit}</text>",
            MARGIN - 4.0,
            y_max * fraction
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{x_max:.0} s</text>",
        WIDTH - MARGIN,
        top + PANEL_HEIGHT + 14.0
    );
}

/// The chart as an SVG document.
pub fn write_svg(report: &Report) -> String {
    let points = &report.per_second;
    let x_max = points.last().map_or(1.0, |p| p.second as f64 + 1.0);
    let rate: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.second as f64, (p.ok + p.errors) as f64))
        .collect();
    let p50: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.second as f64, p.p50_us as f64 / 1000.0))
        .collect();
    let p99: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.second as f64, p.p99_us as f64 / 1000.0))
        .collect();
    let rate_max = rate.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let latency_max = p99.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let height = 2.0 * PANEL_HEIGHT + 3.0 * MARGIN;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let top_rate = MARGIN;
    let top_latency = 2.0 * MARGIN + PANEL_HEIGHT;
    panel(
        &mut svg,
        top_rate,
        &format!("{}: completed requests per second", report.scenario),
        rate_max,
        "/s",
        0,
        x_max,
    );
    svg += &polyline(&rate, x_max, rate_max, top_rate, "#1f77b4");
    panel(
        &mut svg,
        top_latency,
        "latency per second: p50 (green), p99 (red)",
        latency_max,
        "ms",
        1,
        x_max,
    );
    svg += &polyline(&p50, x_max, latency_max, top_latency, "#2ca02c");
    svg += &polyline(&p99, x_max, latency_max, top_latency, "#d62728");
    svg += "</svg>\n";
    svg
}

/// One line of [`write_series_svg`]: its colour, its name, and its (seconds, value) points.
pub struct Series<'a> {
    pub color: &'a str,
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// A chart of series sampled over time, in one panel.
pub fn write_series_svg(title: &str, unit: &str, series: &[Series<'_>]) -> String {
    let points = series.iter().flat_map(|line| &line.points);
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = points.map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let height = PANEL_HEIGHT + 2.0 * MARGIN;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let legend: Vec<String> = (series.iter())
        .map(|line| format!("{} ({})", line.name, line.color))
        .collect();
    let title = format!("{title}: {}", legend.join(", "));
    panel(&mut svg, MARGIN, &title, y_max, unit, 0, x_max);
    for line in series {
        svg += &polyline(&line.points, x_max, y_max, MARGIN, line.color);
    }
    svg += "</svg>\n";
    svg
}
