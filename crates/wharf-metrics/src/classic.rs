//! The classic Prometheus text format (version 0.0.4), made from the
//! OpenMetrics text `prometheus_client` writes.
//!
//! A scraper that asks for neither format, or for the classic one, parses
//! the body as 0.0.4. There a counter's `# TYPE` names its samples
//! (`wharf_calls_total`), where OpenMetrics names the family
//! (`wharf_calls`); read as 0.0.4, an OpenMetrics body loses every
//! counter's type. `# UNIT` and `# EOF` have no place in 0.0.4 either.
//! Histograms and gauges read the same in both.

use std::collections::HashSet;

/// `openmetrics` (as [`crate::Metrics::encode`] writes it) in the 0.0.4
/// text format.
pub(crate) fn from_openmetrics(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len() + 16 * counters.len());
    // `# TYPE`/`# HELP` and the family's name as 0.0.4 writes it: a counter's samples' name.
    let push_family = |text: &mut String, line_kind: &str, name: &str| {
        text.push_str(line_kind);
        text.push_str(name);
        if counters.contains(name) {
            text.push_str("_total");
        }
        text.push(' ');
    };
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = if kind == "unknown" { "untyped" } else { kind };
            push_family(&mut text, "# TYPE ", name);
            text.push_str(kind);
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            push_family(&mut text, "# HELP ", name);
            // OpenMetrics allows `\"` in help text, 0.0.4 only `\\` and `\n` (wharf's own
            // help strings have none; prometheus_client writes them as given).
            text.push_str(&help.replace("\\\"", "\""));
        } else {
            text.push_str(line);
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_typed_by_their_sample_name_and_openmetrics_lines_go() {
        let openmetrics = "# HELP wharf_calls Calls \\\"answered\\\".\n\
            # TYPE wharf_calls counter\n\
            wharf_calls_total{code=\"200\"} 3\n\
            # HELP wharf_up Up.\n\
            # TYPE wharf_up gauge\n\
            wharf_up 1\n\
            # HELP wharf_d_seconds D.\n\
            # TYPE wharf_d_seconds histogram\n\
            # UNIT wharf_d_seconds seconds\n\
            wharf_d_seconds_sum 0.5\n\
            wharf_d_seconds_count 1\n\
            wharf_d_seconds_bucket{le=\"+Inf\"} 1\n\
            # TYPE wharf_x unknown\n\
            wharf_x 2\n\
            # EOF\n";
        let expected = "# HELP wharf_calls_total Calls \"answered\".\n\
            # TYPE wharf_calls_total counter\n\
            wharf_calls_total{code=\"200\"} 3\n\
            # HELP wharf_up Up.\n\
            # TYPE wharf_up gauge\n\
            wharf_up 1\n\
            # HELP wharf_d_seconds D.\n\
            # TYPE wharf_d_seconds histogram\n\
            wharf_d_seconds_sum 0.5\n\
            wharf_d_seconds_count 1\n\
            wharf_d_seconds_bucket{le=\"+Inf\"} 1\n\
            # TYPE wharf_x untyped\n\
            wharf_x 2\n";
        assert_eq!(from_openmetrics(openmetrics), expected);
    }
}
