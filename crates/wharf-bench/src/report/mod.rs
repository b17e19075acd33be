//! The results of a run: [`Report`] and its parts, and how rounds are combined into it.
//!
//! A report holds, per target, each latency class (the median over rounds of each figure,
//! every round's figures, all rounds merged, the percentile curve) and each metric (median,
//! min, max, every round), with ratios to the first target, plus the client's own load and
//! notes the reader must see. It is rendered as a text table ([`table`]), JSON ([`json`],
//! the serde form of these types) or a self-contained HTML page with SVG plots ([`html`]).

pub mod html;
pub mod json;
mod plot;
pub mod table;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rusage::ClientLoad;
use crate::scenarios::Round;
use crate::stats::{median, ErrorCounts, Latency, LatencyHistogram, PercentilePoint};

/// Everything one `wharf bench` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The scenario's name (`responsiveness`, ...).
    pub scenario: String,
    /// The scenario's settings, in display order.
    pub settings: Vec<Setting>,
    /// Rounds run; each round measured every target once, in order.
    pub rounds: u32,
    /// When the run started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// The client's (this process's) load over the whole run.
    pub client: ClientLoad,
    /// One entry per target, in the order given; ratios are to the first.
    pub targets: Vec<TargetReport>,
    /// What the reader must know to trust (or not) the figures.
    pub notes: Vec<String>,
}

/// One setting of the scenario.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Setting {
    /// Its name, as in `--json`.
    pub name: String,
    /// Its value, as written on the command line.
    pub value: String,
}

/// The results for one target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    /// The target's name.
    pub name: String,
    /// Its URLs (templates) as given: the main one, then the fast one of `responsiveness`.
    pub urls: Vec<String>,
    /// The command started for it (`cold-start`, `first-call --cmd`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Latency classes, in the scenario's order.
    pub classes: Vec<ClassReport>,
    /// Scalar results, in the scenario's order.
    pub metrics: Vec<MetricReport>,
    /// The client's load during this target's rounds.
    pub client: ClientLoad,
    /// Completions over time in the first round, for the plots.
    pub timelines: Vec<Timeline>,
    /// What its rounds noted (each text once, with its rounds), as in the run's `notes`;
    /// kept here too so that a reader can tell a target's notes from the run's own.
    pub notes: Vec<String>,
}

/// One latency class of one target (e.g. `fast`).
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    /// The class's name.
    pub name: String,
    /// Successful calls per round (median over rounds).
    pub ok: u64,
    /// Failed calls per round, by kind (median over rounds).
    pub errors: ErrorCounts,
    /// Latency of successful calls in ms, each figure the median over rounds.
    pub latency_ms: Latency,
    /// Each latency figure over the same figure of the first target (absent for the first
    /// target and when a class is missing there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_first: Option<Latency>,
    /// All rounds together: calls summed, latencies of the merged histograms.
    pub total: RoundSummary,
    /// The percentile curve of all rounds together.
    pub percentiles: Vec<PercentilePoint>,
    /// Each round's figures, in order.
    pub per_round: Vec<RoundSummary>,
}

/// One latency class of one round, or of all rounds together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundSummary {
    /// Successful calls.
    pub ok: u64,
    /// Failed calls by kind.
    pub errors: ErrorCounts,
    /// Latency of the successful calls, in ms.
    pub latency_ms: Latency,
}

/// One scalar result of one target (e.g. `slow_responses`).
#[derive(Debug, Clone, Serialize)]
pub struct MetricReport {
    /// Its name.
    pub name: String,
    /// What it counts.
    pub unit: Unit,
    /// Which direction is better.
    pub better: Better,
    /// The median over the rounds that have it.
    pub value: Option<f64>,
    /// The smallest round value.
    pub min: Option<f64>,
    /// The largest round value.
    pub max: Option<f64>,
    /// Over the first target's value (absent for the first target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_first: Option<f64>,
    /// Each round's value, in order (`null`: not measured in that round).
    pub per_round: Vec<Option<f64>>,
}

/// What a metric counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
    /// A number of calls or events.
    Count,
    /// Events per second.
    PerSecond,
    /// A quotient of two times.
    Ratio,
    /// 1 for yes, 0 for no.
    Flag,
}

/// Which direction of a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// Smaller is better (times, errors).
    Lower,
    /// Larger is better (throughput, calls served).
    Higher,
    /// Neither (informative only).
    Neither,
}

/// Cumulative successful calls over time, for a plot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// The class it belongs to.
    pub name: String,
    /// Points in time order.
    pub points: Vec<TimelinePoint>,
}

/// One point of a [`Timeline`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// Seconds since the round started.
    pub seconds: f64,
    /// Successful calls finished by then.
    pub completed: u64,
}

/// One target's rounds, as the runner collected them.
#[derive(Debug)]
pub(crate) struct TargetRounds {
    pub(crate) name: String,
    pub(crate) urls: Vec<String>,
    pub(crate) command: Option<String>,
    pub(crate) rounds: Vec<(Round, ClientLoad)>,
}

impl TargetRounds {
    /// The client's load over all of this target's rounds (`None` before any round).
    pub(crate) fn client_load(&self) -> Option<ClientLoad> {
        self.rounds
            .iter()
            .map(|(_, load)| *load)
            .reduce(|a, b| a.plus(&b))
    }
}

/// Combines every target's rounds into a report (medians, merged histograms, ratios, notes).
pub(crate) fn build(
    mut report: Report,
    targets: Vec<TargetRounds>,
    mut notes: Vec<String>,
) -> Report {
    for target in targets {
        let built = build_target(target);
        notes.extend(built.notes.iter().cloned());
        report.targets.push(built);
    }
    add_ratios(&mut report.targets);
    report.notes = notes;
    report
}

fn build_target(target: TargetRounds) -> TargetReport {
    // Class and metric names in first-seen order; a missing one in a round is skipped.
    let mut class_names: Vec<String> = Vec::new();
    let mut metric_names: Vec<String> = Vec::new();
    for (round, _) in &target.rounds {
        for c in &round.classes {
            if !class_names.contains(&c.name) {
                class_names.push(c.name.clone());
            }
        }
        for m in &round.metrics {
            if !metric_names.contains(&m.name) {
                metric_names.push(m.name.clone());
            }
        }
    }
    let classes = class_names
        .iter()
        .map(|name| {
            let mut merged = LatencyHistogram::new();
            let mut total_errors = ErrorCounts::default();
            let mut per_round = Vec::new();
            for class in target
                .rounds
                .iter()
                .flat_map(|(r, _)| r.classes.iter().filter(|c| &c.name == name))
            {
                merged.merge(&class.latencies);
                total_errors.add(&class.errors);
                per_round.push(RoundSummary {
                    ok: class.latencies.len(),
                    errors: class.errors.clone(),
                    latency_ms: class.latencies.latency(),
                });
            }
            let latencies: Vec<Latency> = per_round.iter().map(|r| r.latency_ms).collect();
            let errors: Vec<ErrorCounts> = per_round.iter().map(|r| r.errors.clone()).collect();
            ClassReport {
                name: name.clone(),
                ok: crate::stats::median_u64(per_round.iter().map(|r| r.ok)),
                errors: ErrorCounts::median_of(&errors),
                latency_ms: Latency::median_of(&latencies),
                ratio_to_first: None,
                total: RoundSummary {
                    ok: merged.len(),
                    errors: total_errors,
                    latency_ms: merged.latency(),
                },
                percentiles: merged.curve(),
                per_round,
            }
        })
        .collect();
    let metrics = metric_names
        .iter()
        .filter_map(|name| {
            let found: Vec<_> = target
                .rounds
                .iter()
                .map(|(r, _)| r.metrics.iter().find(|m| &m.name == name))
                .collect();
            let first = found.iter().flatten().next()?;
            let per_round: Vec<Option<f64>> =
                found.iter().map(|m| m.and_then(|m| m.value)).collect();
            let values = || per_round.iter().flatten().copied();
            Some(MetricReport {
                name: name.clone(),
                unit: first.unit,
                better: first.better,
                value: median(values()),
                min: values().reduce(f64::min),
                max: values().reduce(f64::max),
                ratio_to_first: None,
                per_round,
            })
        })
        .collect();
    let client = target.client_load().unwrap_or_default();
    // The same note in several rounds is given once, with its rounds.
    let mut by_text: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for (i, (round, _)) in target.rounds.iter().enumerate() {
        for note in &round.notes {
            let rounds = by_text.entry(note.as_str()).or_default();
            if rounds.is_empty() {
                order.push(note.as_str());
            }
            rounds.push(i + 1);
        }
    }
    let many = target.rounds.len() > 1;
    let notes = order
        .iter()
        .map(|text| {
            let rounds: Vec<String> = by_text[text].iter().map(ToString::to_string).collect();
            if many {
                format!("{} (round {}): {text}", target.name, rounds.join(", "))
            } else {
                format!("{}: {text}", target.name)
            }
        })
        .collect();
    let timelines = target
        .rounds
        .first()
        .map(|(r, _)| r.timelines.clone())
        .unwrap_or_default();
    TargetReport {
        name: target.name,
        urls: target.urls,
        command: target.command,
        classes,
        metrics,
        client,
        timelines,
        notes,
    }
}

/// `value / base` when both exist and `base` is not zero.
fn quotient(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b != 0.0 => Some(v / b),
        _ => None,
    }
}

/// Fills `ratio_to_first` of every target after the first.
fn add_ratios(targets: &mut [TargetReport]) {
    let Some((first, rest)) = targets.split_first_mut() else {
        return;
    };
    for target in rest {
        for class in &mut target.classes {
            if let Some(base) = first.classes.iter().find(|c| c.name == class.name) {
                let (l, b) = (class.latency_ms, base.latency_ms);
                class.ratio_to_first = Some(Latency {
                    avg: quotient(l.avg, b.avg),
                    min: quotient(l.min, b.min),
                    p50: quotient(l.p50, b.p50),
                    p95: quotient(l.p95, b.p95),
                    p99: quotient(l.p99, b.p99),
                    max: quotient(l.max, b.max),
                });
            }
        }
        for metric in &mut target.metrics {
            if let Some(base) = first.metrics.iter().find(|m| m.name == metric.name) {
                metric.ratio_to_first = quotient(metric.value, base.value);
            }
        }
    }
}

/// Formats a figure for people: 3 significant digits or so, `-` when missing.
pub(crate) fn figure(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// Formats a ratio to the first target: `×1.23`.
pub(crate) fn times(ratio: Option<f64>) -> String {
    match ratio {
        None => String::new(),
        Some(r) if r >= 100.0 => format!("×{r:.0}"),
        Some(r) if r >= 10.0 => format!("×{r:.1}"),
        Some(r) => format!("×{r:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_well() {
        assert_eq!(figure(None), "-");
        assert_eq!(figure(Some(25.0)), "25");
        assert_eq!(figure(Some(6003.14)), "6003");
        assert_eq!(figure(Some(12.34)), "12.3");
        assert_eq!(figure(Some(0.123)), "0.12");
        assert_eq!(times(Some(2.0)), "×2.00");
        assert_eq!(times(Some(153.08)), "×153");
        assert_eq!(times(None), "");
    }

    #[test]
    fn a_targets_notes_are_its_rounds_own_and_the_run_lists_them_after_its_own() {
        let noted = |notes: &[&str]| Round {
            notes: notes.iter().map(|n| (*n).to_owned()).collect(),
            ..Round::default()
        };
        let target = |name: &str, rounds: Vec<Round>| TargetRounds {
            name: name.to_owned(),
            urls: vec![format!("http://{name}/")],
            command: None,
            rounds: rounds
                .into_iter()
                .map(|r| (r, ClientLoad::default()))
                .collect(),
        };
        let report = build(
            Report {
                scenario: "idle".to_owned(),
                settings: Vec::new(),
                rounds: 2,
                started_unix_ms: 0,
                client: ClientLoad::default(),
                targets: Vec::new(),
                notes: Vec::new(),
            },
            vec![
                target("a", vec![noted(&["slow"]), noted(&["slow", "closed"])]),
                target("b", vec![noted(&[]), noted(&[])]),
            ],
            vec!["client (this process) CPU: 1%".to_owned()],
        );
        assert_eq!(
            report.targets[0].notes,
            ["a (round 1, 2): slow", "a (round 2): closed"]
        );
        assert!(report.targets[1].notes.is_empty());
        assert_eq!(
            report.notes,
            [
                "client (this process) CPU: 1%",
                "a (round 1, 2): slow",
                "a (round 2): closed"
            ]
        );
    }
}
