//! The human table: [`render`] a [`Report`] as aligned text, one column per target.
//!
//! Rows are each class's calls, errors and latency figures (medians over rounds; a class of
//! one call per round gets one time), then each
//! metric (median, with the min–max over rounds when there are several), then the client's
//! load. Targets after the first carry their ratio to the first (`×1.23`). The notes and the
//! first error of each failing class follow the table.

use std::fmt::Write as _;

use crate::report::{figure, times, ClassReport, MetricReport, Report, Unit};
use crate::stats::ErrorCounts;

/// One row: a label and a cell per target.
pub(crate) type Row = (String, Vec<String>);

/// The rows of the table (shared with the HTML report).
pub(crate) fn rows(report: &Report) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let Some(first) = report.targets.first() else {
        return rows;
    };
    for class in &first.classes {
        let classes: Vec<Option<&ClassReport>> = report
            .targets
            .iter()
            .map(|t| t.classes.iter().find(|c| c.name == class.name))
            .collect();
        let cells = |f: &dyn Fn(&ClassReport) -> String| -> Vec<String> {
            classes
                .iter()
                .map(|c| c.map_or_else(|| "-".to_owned(), f))
                .collect()
        };
        rows.push((format!("{} ok", class.name), cells(&|c| c.ok.to_string())));
        rows.push((
            format!("{} errors", class.name),
            cells(&|c| errors(&c.errors)),
        ));
        // One call per round (a first call, a cold start): one time, not six equal figures.
        let single = classes
            .iter()
            .flatten()
            .all(|c| c.per_round.iter().all(|r| r.ok <= 1));
        if single {
            rows.push((
                format!("{} ms", class.name),
                cells(&|c| {
                    let ratio = c.ratio_to_first.and_then(|r| r.p50);
                    join(figure(c.latency_ms.p50), times(ratio))
                }),
            ));
            continue;
        }
        for (i, (field, _)) in class.latency_ms.fields().iter().enumerate() {
            rows.push((
                format!("{} {field} ms", class.name),
                cells(&|c| {
                    let value = c.latency_ms.fields()[i].1;
                    let ratio = c.ratio_to_first.and_then(|r| r.fields()[i].1);
                    join(figure(value), times(ratio))
                }),
            ));
        }
    }
    let many_rounds = report.rounds > 1;
    for metric in &first.metrics {
        let cells = report
            .targets
            .iter()
            .map(|t| {
                t.metrics
                    .iter()
                    .find(|m| m.name == metric.name)
                    .map_or_else(|| "-".to_owned(), |m| metric_cell(m, many_rounds))
            })
            .collect();
        rows.push((metric.name.clone(), cells));
    }
    rows.push((
        "client cpu avg/peak".to_owned(),
        report
            .targets
            .iter()
            .map(|t| {
                format!(
                    "{:.0}%/{:.0}%",
                    t.client.busy * 100.0,
                    t.client.peak_busy * 100.0
                )
            })
            .collect(),
    ));
    rows.push((
        "client cores busy".to_owned(),
        report
            .targets
            .iter()
            .map(|t| {
                t.client
                    .cores_busy
                    .map_or_else(|| "-".to_owned(), |b| format!("{:.0}%", b * 100.0))
            })
            .collect(),
    ));
    rows
}

/// `value` then `ratio`, with a space when there is a ratio.
fn join(value: String, ratio: String) -> String {
    if ratio.is_empty() {
        value
    } else {
        format!("{value} {ratio}")
    }
}

/// The error total, with the kinds when there are any.
fn errors(e: &ErrorCounts) -> String {
    if e.total == 0 {
        return "0".to_owned();
    }
    let kinds: Vec<String> = [
        ("connect", e.connect),
        ("timeout", e.timeout),
        ("status", e.status),
        ("other", e.other),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(kind, n)| format!("{kind} {n}"))
    .collect();
    format!("{} ({})", e.total, kinds.join(", "))
}

/// A metric's cell: median, [min–max] over several rounds, ratio.
fn metric_cell(m: &MetricReport, many_rounds: bool) -> String {
    let value = match (m.unit, m.value) {
        (Unit::Flag, Some(v)) if m.min == m.max => if v >= 1.0 { "yes" } else { "no" }.to_owned(),
        _ => figure(m.value),
    };
    let spread = match (m.min, m.max) {
        (Some(lo), Some(hi)) if many_rounds && lo != hi => {
            format!(" [{}–{}]", figure(Some(lo)), figure(Some(hi)))
        }
        _ => String::new(),
    };
    let ratio = if m.unit == Unit::Flag {
        String::new()
    } else {
        times(m.ratio_to_first)
    };
    join(format!("{value}{spread}"), ratio)
}

/// The first line: scenario, rounds, targets.
pub(crate) fn title(report: &Report) -> String {
    let names: Vec<&str> = report.targets.iter().map(|t| t.name.as_str()).collect();
    format!(
        "wharf bench {}: {} round{} interleaved over {}",
        report.scenario,
        report.rounds,
        if report.rounds == 1 { "" } else { "s" },
        names.join(", ")
    )
}

/// The first error of each class that had errors, per target.
pub(crate) fn first_errors(report: &Report) -> Vec<String> {
    report
        .targets
        .iter()
        .flat_map(|t| {
            t.classes.iter().filter_map(move |c| {
                c.total
                    .errors
                    .first
                    .as_ref()
                    .map(|e| format!("{} {}: {e}", t.name, c.name))
            })
        })
        .collect()
}

/// The report as a text table, settings, notes and first errors.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", title(report));
    let settings: Vec<String> = report
        .settings
        .iter()
        .map(|s| format!("{}={}", s.name, s.value))
        .collect();
    let _ = writeln!(out, "settings: {}", settings.join(" "));
    for t in &report.targets {
        let _ = write!(out, "  {}: {}", t.name, t.urls.join(" then "));
        if let Some(cmd) = &t.command {
            let _ = write!(out, " (command: {cmd})");
        }
        out.push('\n');
    }
    out.push('\n');
    let rows = rows(report);
    let label_width = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let widths: Vec<usize> = report
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            rows.iter()
                .map(|(_, cells)| cells.get(i).map_or(0, |c| c.chars().count()))
                .chain(std::iter::once(t.name.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |out: &mut String, label: &str, cells: &[String]| {
        let _ = write!(out, "{label:<label_width$}");
        for (cell, width) in cells.iter().zip(&widths) {
            let _ = write!(out, "  {cell:<width$}");
        }
        let trimmed = out.trim_end_matches(' ').len();
        out.truncate(trimmed);
        out.push('\n');
    };
    let names: Vec<String> = report.targets.iter().map(|t| t.name.clone()).collect();
    line(&mut out, "", &names);
    for (label, cells) in &rows {
        line(&mut out, label, cells);
    }
    let errors = first_errors(report);
    if !errors.is_empty() {
        out.push_str("\nfirst errors:\n");
        for e in errors {
            let _ = writeln!(out, "- {e}");
        }
    }
    if !report.notes.is_empty() {
        out.push_str("\nnotes:\n");
        for note in &report.notes {
            let _ = writeln!(out, "- {note}");
        }
    }
    out
}
