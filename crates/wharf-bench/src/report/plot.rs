//! SVG plots for the HTML report, drawn with `plotters` (SVG backend, no fonts needed: text
//! is left to the browser).
//!
//! - [`percentiles`]: one class's latency by percentile, a line per target. The x axis is in
//!   "nines" (0 = p0, 1 = p90, 2 = p99, 3 = p99.9), the max at the right end; the y axis is
//!   logarithmic, so targets a thousand times apart still both show.
//! - [`timeline`]: successful calls completed over time in the first round, a line per target
//!   and class: a fast class that finishes only after the slow one shows at a glance.

use plotters::prelude::*;

use crate::report::{figure, Report, TimelinePoint};
use crate::stats::PercentilePoint;
use crate::BenchError;

/// Plot size in pixels.
const SIZE: (u32, u32) = (760, 380);

/// Distinct, readable line colours.
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

fn plot_error(e: impl std::fmt::Display) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// "Nines" of a percentile: -log10(1 - p/100).
fn nines(percentile: f64) -> f64 {
    -(1.0 - percentile / 100.0).log10()
}

/// The axis label at `x` nines: `0`, `90`, `99`, `99.9`.
fn nines_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    let text = format!("{p:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("p{text}")
}

/// The latency-by-percentile plot of class `class`, or `None` when no target has at least
/// two successful calls in it.
pub(crate) fn percentiles(report: &Report, class: &str) -> Result<Option<String>, BenchError> {
    let curves: Vec<(&str, &[PercentilePoint])> = report
        .targets
        .iter()
        .filter_map(|t| {
            t.classes
                .iter()
                .find(|c| c.name == class && c.total.ok >= 2)
                .map(|c| (t.name.as_str(), c.percentiles.as_slice()))
        })
        .collect();
    if curves.is_empty() {
        return Ok(None);
    }
    let finite_max = curves
        .iter()
        .flat_map(|(_, pts)| pts.iter())
        .filter(|p| p.percentile < 100.0)
        .map(|p| nines(p.percentile))
        .fold(1.0, f64::max);
    let x_max = finite_max.ceil() + 0.5;
    let to_xy = |p: &PercentilePoint| {
        let x = if p.percentile >= 100.0 {
            x_max
        } else {
            nines(p.percentile)
        };
        (x, p.ms.max(0.001))
    };
    let values = || {
        curves
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|p| p.ms.max(0.001)))
    };
    let y_min = values().fold(f64::INFINITY, f64::min) / 1.5;
    let y_max = values().fold(0.0, f64::max) * 1.5;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{class}: latency by percentile (all rounds)"),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())
            .map_err(plot_error)?;
        let x_labels = |x: &f64| {
            if (*x - x_max).abs() < 0.26 {
                "max".to_owned()
            } else if x.fract() == 0.0 {
                nines_label(*x)
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc("percentile (the max at the right end)")
            .y_desc("latency, ms (log scale)")
            .x_labels((x_max * 2.0) as usize + 1)
            .x_label_formatter(&x_labels)
            .y_labels(12)
            .y_label_formatter(&|y| figure(Some(*y)))
            .draw()
            .map_err(plot_error)?;
        for (i, (name, points)) in curves.iter().enumerate() {
            let style = colour(i).stroke_width(2);
            chart
                .draw_series(LineSeries::new(points.iter().map(to_xy), style).point_size(3))
                .map_err(plot_error)?
                .label(*name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour(i)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(Some(svg))
}

/// Successful calls over time in the first round, a line per target and class; `None` when
/// the scenario records no timelines.
pub(crate) fn timeline(report: &Report) -> Result<Option<String>, BenchError> {
    let lines: Vec<(String, &[TimelinePoint])> = report
        .targets
        .iter()
        .flat_map(|t| {
            t.timelines
                .iter()
                .map(move |l| (format!("{} {}", t.name, l.name), l.points.as_slice()))
        })
        .filter(|(_, points)| points.len() > 1)
        .collect();
    if lines.is_empty() {
        return Ok(None);
    }
    let points = || lines.iter().flat_map(|(_, pts)| pts.iter());
    let x_max = points().map(|p| p.seconds).fold(0.001, f64::max) * 1.05;
    let y_max = points().map(|p| p.completed).max().unwrap_or(1) as f64 * 1.1;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "successful calls completed over time (first round)",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the round started")
            .y_desc("calls completed")
            .draw()
            .map_err(plot_error)?;
        for (i, (name, points)) in lines.iter().enumerate() {
            // A step line: the count rises at each completion.
            let steps = points.windows(2).flat_map(|w| {
                [
                    (w[1].seconds, w[0].completed as f64),
                    (w[1].seconds, w[1].completed as f64),
                ]
            });
            let start = points
                .first()
                .map(|p| (p.seconds, p.completed as f64))
                .into_iter();
            chart
                .draw_series(LineSeries::new(
                    start.chain(steps),
                    colour(i).stroke_width(2),
                ))
                .map_err(plot_error)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour(i)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(Some(svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_axis() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines_label(0.0), "p0");
        assert_eq!(nines_label(1.0), "p90");
        assert_eq!(nines_label(3.0), "p99.9");
    }
}
