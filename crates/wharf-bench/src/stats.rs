//! Latency and error statistics: `LatencyHistogram`, [`Latency`], [`ErrorCounts`], medians.
//!
//! Latencies go into an HDR histogram (the `hdrhistogram` crate) in microseconds, from 1 µs to
//! one hour at 3 significant digits, so recording costs no allocation and percentiles are
//! exact to 0.1 %. Only successful calls are recorded; failed ones are counted by kind in
//! [`ErrorCounts`], so an error can never pull a percentile down. Several rounds are combined
//! by [`median`] of each figure (what the reports show) and by merging histograms (the
//! percentile curves of the plots).

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::CallError;

/// The largest latency recorded, in microseconds (one hour); longer ones count as this.
const MAX_MICROS: u64 = 3_600_000_000;

/// Percentiles on the curves of the plots and of `--json`.
const CURVE: [f64; 14] = [
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999, 100.0,
];

/// An HDR histogram of call latencies in microseconds.
#[derive(Debug, Clone)]
pub(crate) struct LatencyHistogram {
    hist: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram for 1 µs to 1 h at 3 significant digits.
    pub(crate) fn new() -> Self {
        let hist = Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("constant bounds are valid");
        LatencyHistogram { hist }
    }

    /// Records one successful call's latency (clamped to 1 µs ..= 1 h).
    pub(crate) fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros())
            .unwrap_or(MAX_MICROS)
            .clamp(1, MAX_MICROS);
        self.hist.saturating_record(micros);
    }

    /// How many latencies were recorded.
    pub(crate) fn len(&self) -> u64 {
        self.hist.len()
    }

    /// Adds every value of `other` (same bounds, so nothing is lost).
    pub(crate) fn merge(&mut self, other: &LatencyHistogram) {
        // Same bounds on both sides: `add` cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    /// The median latency in milliseconds, if anything was recorded.
    pub(crate) fn p50_ms(&self) -> Option<f64> {
        (!self.hist.is_empty()).then(|| ms(self.hist.value_at_quantile(0.5)))
    }

    /// Average, percentiles and extremes in milliseconds (`None` when empty).
    pub(crate) fn latency(&self) -> Latency {
        if self.hist.is_empty() {
            return Latency::default();
        }
        let q = |quantile: f64| Some(ms(self.hist.value_at_quantile(quantile)));
        Latency {
            avg: Some(self.hist.mean() / 1000.0),
            min: Some(ms(self.hist.min())),
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
            max: Some(ms(self.hist.max())),
        }
    }

    /// The percentile curve: (percentile, ms) points, up to the finest percentile the number
    /// of samples can tell apart (99.9 needs about 1000 calls), always with 100 (the max).
    pub(crate) fn curve(&self) -> Vec<PercentilePoint> {
        let count = self.hist.len() as f64;
        if count == 0.0 {
            return Vec::new();
        }
        CURVE
            .iter()
            .filter(|&&p| p == 100.0 || 100.0 / (100.0 - p) <= count)
            .map(|&percentile| PercentilePoint {
                percentile,
                ms: ms(self.hist.value_at_quantile(percentile / 100.0)),
            })
            .collect()
    }
}

/// Microseconds to milliseconds.
fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

/// One point of a percentile curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PercentilePoint {
    /// The percentile, 0 to 100.
    pub percentile: f64,
    /// The latency at that percentile, in milliseconds.
    pub ms: f64,
}

/// Latency figures of successful calls, in milliseconds; all `None` when none succeeded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Mean.
    pub avg: Option<f64>,
    /// Fastest.
    pub min: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Slowest.
    pub max: Option<f64>,
}

impl Latency {
    /// The figures with their names, in display order.
    pub fn fields(&self) -> [(&'static str, Option<f64>); 6] {
        [
            ("avg", self.avg),
            ("p50", self.p50),
            ("p95", self.p95),
            ("p99", self.p99),
            ("max", self.max),
            ("min", self.min),
        ]
    }

    /// Each figure is the median of that figure over `rounds` (rounds without it are skipped).
    pub(crate) fn median_of(rounds: &[Latency]) -> Latency {
        let m = |f: fn(&Latency) -> Option<f64>| median(rounds.iter().filter_map(f));
        Latency {
            avg: m(|l| l.avg),
            min: m(|l| l.min),
            p50: m(|l| l.p50),
            p95: m(|l| l.p95),
            p99: m(|l| l.p99),
            max: m(|l| l.max),
        }
    }
}

/// Failed calls, by kind. Every failure is counted here and nowhere else.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ErrorCounts {
    /// All failed calls.
    pub total: u64,
    /// Connection not made (refused, unreachable, out of ports or file descriptors).
    pub connect: u64,
    /// No complete response within the per-call timeout.
    pub timeout: u64,
    /// A complete response whose status was not 2xx.
    pub status: u64,
    /// A broken exchange: socket errors (reset, broken pipe) and broken responses (closed
    /// early, malformed head, bad chunked framing, truncated body).
    pub other: u64,
    /// The first failure seen, with its causes, to tell what went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
}

impl ErrorCounts {
    /// Counts one failure.
    pub(crate) fn record(&mut self, error: &CallError) {
        self.total += 1;
        match error {
            CallError::Connect { .. } => self.connect += 1,
            CallError::Timeout(_) => self.timeout += 1,
            CallError::Status(_) => self.status += 1,
            CallError::Io { .. } | CallError::Response(_) | CallError::Lost => self.other += 1,
        }
        if self.first.is_none() {
            self.first = Some(error.chain());
        }
    }

    /// Adds `other`'s counts (keeping the first failure already seen).
    pub(crate) fn add(&mut self, other: &ErrorCounts) {
        self.total += other.total;
        self.connect += other.connect;
        self.timeout += other.timeout;
        self.status += other.status;
        self.other += other.other;
        if self.first.is_none() {
            self.first.clone_from(&other.first);
        }
    }

    /// Each count is the median over `rounds` (rounded down); `first` is the first seen.
    pub(crate) fn median_of(rounds: &[ErrorCounts]) -> ErrorCounts {
        let m = |f: fn(&ErrorCounts) -> u64| median_u64(rounds.iter().map(f));
        ErrorCounts {
            total: m(|e| e.total),
            connect: m(|e| e.connect),
            timeout: m(|e| e.timeout),
            status: m(|e| e.status),
            other: m(|e| e.other),
            first: rounds.iter().find_map(|e| e.first.clone()),
        }
    }
}

/// The median of `values` (the mean of the two middle ones for an even count); `None` when
/// there are none. NaNs are skipped.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// The median of counts, rounded down; 0 when there are none.
pub(crate) fn median_u64(values: impl IntoIterator<Item = u64>) -> u64 {
    median(values.into_iter().map(|v| v as f64)).map_or(0, |m| m.floor() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(std::iter::empty()), None);
        assert_eq!(median_u64([1, 2]), 1);
    }

    #[test]
    fn histogram_figures_and_curve() {
        let mut h = LatencyHistogram::new();
        assert_eq!(h.latency(), Latency::default());
        assert!(h.curve().is_empty());
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let l = h.latency();
        assert!((l.p50.unwrap() - 50.0).abs() < 0.1, "{l:?}");
        assert!((l.p95.unwrap() - 95.0).abs() < 0.1, "{l:?}");
        assert!((l.max.unwrap() - 100.0).abs() < 0.1, "{l:?}");
        assert!((l.avg.unwrap() - 50.5).abs() < 0.1, "{l:?}");
        let curve = h.curve();
        // 100 samples tell percentiles up to 99 apart, plus the max.
        assert_eq!(curve.last().unwrap().percentile, 100.0);
        assert!(curve
            .iter()
            .all(|p| p.percentile <= 99.0 || p.percentile == 100.0));
        let mut other = LatencyHistogram::new();
        other.record(Duration::from_secs(7200));
        h.merge(&other);
        assert_eq!(h.len(), 101);
        assert!((h.latency().max.unwrap() - 3_600_000.0).abs() < 3600.0);
    }

    #[test]
    fn error_counts_by_kind() {
        let mut e = ErrorCounts::default();
        e.record(&CallError::Timeout(Duration::from_secs(1)));
        e.record(&CallError::Status(http::StatusCode::BAD_GATEWAY));
        e.record(&CallError::Lost);
        assert_eq!((e.total, e.timeout, e.status, e.other), (3, 1, 1, 1));
        assert!(e.first.as_deref().unwrap().contains("within"));
        let m = ErrorCounts::median_of(&[e.clone(), ErrorCounts::default(), e]);
        assert_eq!(m.total, 3);
    }
}
