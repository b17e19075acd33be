//! The range of every count a run takes (calls, connections, rounds): a typo such as
//! `--slow-calls 10000000000` is refused before the run, instead of running for ever or
//! allocating without end.
//!
//! Each [`CountLimit`] is generous (what this lab could ever use, with room to spare) and its
//! comment says why there is no use for more. [`CountLimit::parse`] reads a count on the
//! command line (negative numbers included, so that their message is ours, not clap's); the
//! scenarios' checks refuse a larger value given through the API (`CountLimit::check`).
//! Durations are not bounded here.

use crate::BenchError;

/// The range a count may take, and why no more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountLimit {
    /// The smallest value a run can use (the scenarios' own checks say why less cannot run).
    pub min: u32,
    /// The largest value accepted.
    pub max: u32,
    /// Why there is no use for more, shown with a refusal.
    pub why: &'static str,
}

/// `--rounds` (and `--runs` of `cold-start`, whose runs are rounds).
///
/// Every round's latency histograms (about 190 KB each, computed from hdrhistogram's layout:
/// some 23,500 counters of 8 bytes for 1 µs to 1 h at 3 digits; not measured) are kept
/// until the report, one per class, target and round, so memory grows with rounds: 1000
/// rounds of a four-class scenario hold about 750 MB per target. The lab's own runs use at
/// most 27 (bench/compare.sh's burst); a median needs far fewer.
pub const ROUNDS: CountLimit = CountLimit {
    min: 1,
    max: 1000,
    why: "every round's histograms are kept for the report",
};

/// Calls started at once, each on a connection of its own: `burst --connections`,
/// `responsiveness --slow-calls` and `--fast-calls`.
///
/// One client address can hold at most about 64k connections to one target address (its
/// ephemeral ports: 28k by default on Linux), and each needs an open file. 100,000 leaves
/// room for targets on several ports or addresses; the lab's largest run holds 10,000 slow
/// calls (bench/compare.sh). Each call costs a task and its buffers, a few KB.
pub const CONNECTIONS_AT_ONCE: CountLimit = CountLimit {
    min: 1,
    max: 100_000,
    why: "each call holds a connection open at the same time",
};

/// `throughput --concurrency`: workers, each with a keep-alive connection.
///
/// Each worker keeps a latency histogram of its own until the round ends (about 190 KB), so
/// 10,000 workers hold about 1.9 GB. A closed loop needs enough connections to keep the
/// target busy: the lab uses 64; wrk's users rarely go past a few thousand.
pub const CONCURRENCY: CountLimit = CountLimit {
    min: 1,
    max: 10_000,
    why: "each worker holds a connection and a histogram of its own",
};

/// Warm calls made one after another on one keep-alive connection: `first-call
/// --warm-calls`, `idle --warm-calls` (per warm phase, two a round).
///
/// They go into one histogram, so the cost is time: at a local call's 50-100 µs a million
/// take 50-100 s (calls that time out, far longer). The lab's baselines use 20
/// to 50.
pub const WARM_CALLS: CountLimit = CountLimit {
    min: 1,
    max: 1_000_000,
    why: "the calls run one after another",
};

/// `first-call --prime-calls`: calls before the timed one, on one connection (0: none).
/// As [`WARM_CALLS`]; the lab uses 1 (a cache fill).
pub const PRIME_CALLS: CountLimit = CountLimit {
    min: 0,
    ..WARM_CALLS
};

/// Warm calls on a new connection each, one after another: `warm_new_connections` of
/// `first-call` and `idle` (no flag; 5 by default).
///
/// A connection the client closes keeps its port in TIME_WAIT for a minute, and one client
/// address has 28k ports to a target by default: much past 10,000 a phase and the next
/// calls could fail to connect.
pub const WARM_NEW_CONNECTIONS: CountLimit = CountLimit {
    min: 1,
    max: 10_000,
    why: "each new connection leaves a port in TIME_WAIT",
};

impl CountLimit {
    /// Reads a count given on the command line (the flag and the text are clap's to show).
    ///
    /// ```
    /// use wharf_bench::limits::ROUNDS;
    /// assert_eq!(ROUNDS.parse("3"), Ok(3));
    /// assert_eq!(ROUNDS.parse("-3").unwrap_err(), "must be a whole number from 1 to 1000");
    /// assert!(ROUNDS.parse("1001").unwrap_err().starts_with("too many: at most 1000"));
    /// ```
    pub fn parse(&self, text: &str) -> Result<u32, String> {
        match text.parse::<u32>() {
            Ok(n) if n > self.max => Err(self.too_many()),
            Ok(n) if n >= self.min => Ok(n),
            // Past u32: a count far above any maximum, not a malformed one.
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Err(self.too_many()),
            // Negative, below the minimum, or not a whole number.
            _ => Err(format!(
                "must be a whole number from {} to {}",
                self.min, self.max
            )),
        }
    }

    /// Refuses `value` above the maximum, naming `option`, its command-line flag.
    pub(crate) fn check(&self, option: &str, value: u32) -> Result<(), BenchError> {
        if value > self.max {
            return Err(BenchError::Settings(format!(
                "{option} {value} is {}",
                self.too_many()
            )));
        }
        Ok(())
    }

    fn too_many(&self) -> String {
        format!("too many: at most {} ({})", self.max, self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_within_their_range() {
        assert_eq!(CONNECTIONS_AT_ONCE.parse("100000"), Ok(100_000));
        assert_eq!(PRIME_CALLS.parse("0"), Ok(0));
        let in_range = "must be a whole number from 1 to 100000";
        for text in ["-5", "0", "", "1.5", "5k", " 5", "-99999999999999999999"] {
            assert_eq!(
                CONNECTIONS_AT_ONCE.parse(text).unwrap_err(),
                in_range,
                "{text:?}"
            );
        }
        let too_many =
            "too many: at most 100000 (each call holds a connection open at the same time)";
        for text in ["100001", "10000000000", "99999999999999999999999"] {
            assert_eq!(
                CONNECTIONS_AT_ONCE.parse(text).unwrap_err(),
                too_many,
                "{text:?}"
            );
        }
        assert_eq!(
            PRIME_CALLS.parse("-1").unwrap_err(),
            "must be a whole number from 0 to 1000000"
        );
    }

    #[test]
    fn a_count_above_its_maximum_is_refused_with_the_flag() {
        assert!(ROUNDS.check("--rounds", 1000).is_ok());
        let error = ROUNDS.check("--rounds", 1001).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--rounds 1001 is too many: at most 1000 (every round's histograms are kept for \
             the report)"
        );
    }
}
