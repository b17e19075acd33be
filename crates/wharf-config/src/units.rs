//! Units: durations (`"250ms"`, `"5s"`, `"1d"`) and sizes (`"64KiB"`, `"1MB"`).
//!
//! Parsing only: which key a value belongs to, its default and its allowed range are the
//! validator's business. [`UnitError`] says why a spelling was refused; the caller adds the
//! value and the key.

use std::time::Duration;

/// Duration units, as listed in error messages.
const DURATION_UNITS: &str = "ms, s, m, h or d";
/// Size units, as listed in error messages.
const SIZE_UNITS: &str = "B, KiB, MiB, GiB, TiB, KB, MB, GB or TB";

/// Why a duration or size spelling was refused.
///
/// `Display` gives the reason only (`unknown unit "dy", use ms, s, m, h or d`); the config
/// validator prefixes the offending value and key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The string is empty.
    #[error("empty string")]
    Empty,
    /// The string contains spaces or other whitespace (`"5 s"`).
    #[error("remove the whitespace")]
    Whitespace,
    /// A minus sign: durations and sizes are never negative.
    #[error("negative values are not allowed")]
    Negative,
    /// No digits before the unit (`"ms"`, `"abc"`).
    #[error("no number before the unit")]
    NoNumber,
    /// A decimal point (`"1.5s"`): only whole numbers are accepted.
    #[error("only whole numbers are accepted, use a smaller unit")]
    Fraction,
    /// A number without a unit (`"5"`).
    #[error("missing unit, use {expected}")]
    MissingUnit {
        /// The units that would have been accepted.
        expected: &'static str,
    },
    /// A unit that is not known (`"1dy"`).
    #[error("unknown unit {unit:?}, use {expected}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The units that would have been accepted.
        expected: &'static str,
    },
    /// The value does not fit in 64 bits (milliseconds for durations, bytes for sizes).
    #[error("too large")]
    Overflow,
}

/// Parses a duration: a whole number followed by `ms`, `s`, `m`, `h` or `d`.
///
/// `"0s"` is a valid zero duration; whether zero is allowed is up to the key. A bare number,
/// an empty string, whitespace, fractions, negative values and values over `u64::MAX`
/// milliseconds are refused.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(wharf_config::parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(wharf_config::parse_duration("1d"), Ok(Duration::from_secs(86_400)));
/// assert!(wharf_config::parse_duration("1dy").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let (number, unit) = split_number(s, DURATION_UNITS)?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(UnitError::UnknownUnit {
                unit: other.to_owned(),
                expected: DURATION_UNITS,
            })
        }
    };
    let millis = number
        .checked_mul(millis_per_unit)
        .ok_or(UnitError::Overflow)?;
    Ok(Duration::from_millis(millis))
}

/// Parses a size in bytes: a whole number followed by a unit.
///
/// Binary units `KiB`, `MiB`, `GiB`, `TiB` are powers of 1024; decimal units `KB`, `MB`, `GB`,
/// `TB` are powers of 1000; `B` is bytes. Units are matched without regard to case
/// (`"64kib"` is `"64KiB"`). A bare number in a string is refused (a plain TOML integer is
/// accepted as bytes by the config, not by this function).
///
/// ```
/// assert_eq!(wharf_config::parse_size("64KiB"), Ok(65_536));
/// assert_eq!(wharf_config::parse_size("1MB"), Ok(1_000_000));
/// assert!(wharf_config::parse_size("64").is_err());
/// ```
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(s, SIZE_UNITS)?;
    const UNITS: [(&str, u64); 9] = [
        ("B", 1),
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
        ("KB", 1_000),
        ("MB", 1_000_000),
        ("GB", 1_000_000_000),
        ("TB", 1_000_000_000_000),
    ];
    let factor = UNITS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|&(_, factor)| factor)
        .ok_or_else(|| UnitError::UnknownUnit {
            unit: unit.to_owned(),
            expected: SIZE_UNITS,
        })?;
    number.checked_mul(factor).ok_or(UnitError::Overflow)
}

/// Splits `"250ms"` into `(250, "ms")`, refusing what neither unit kind accepts.
fn split_number<'a>(s: &'a str, expected: &'static str) -> Result<(u64, &'a str), UnitError> {
    if s.is_empty() {
        return Err(UnitError::Empty);
    }
    if s.chars().any(char::is_whitespace) {
        return Err(UnitError::Whitespace);
    }
    if s.starts_with('-') {
        return Err(UnitError::Negative);
    }
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    if unit.starts_with('.') || unit.starts_with(',') {
        return Err(UnitError::Fraction);
    }
    if digits.is_empty() {
        return Err(UnitError::NoNumber);
    }
    if unit.is_empty() {
        return Err(UnitError::MissingUnit { expected });
    }
    // Only ASCII digits remain, so the sole way this parse fails is overflow.
    let number = digits.parse::<u64>().map_err(|_| UnitError::Overflow)?;
    Ok((number, unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accepted() {
        let cases: &[(&str, Duration)] = &[
            ("0s", Duration::ZERO),
            ("0ms", Duration::ZERO),
            ("250ms", Duration::from_millis(250)),
            ("5s", Duration::from_secs(5)),
            ("300s", Duration::from_secs(300)),
            ("10m", Duration::from_secs(600)),
            ("2h", Duration::from_secs(7_200)),
            ("1d", Duration::from_secs(86_400)),
            ("007s", Duration::from_secs(7)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(*want), "{text:?}");
        }
    }

    #[test]
    fn durations_refused() {
        let cases: &[(&str, UnitError)] = &[
            ("", UnitError::Empty),
            (
                "5",
                UnitError::MissingUnit {
                    expected: DURATION_UNITS,
                },
            ),
            ("1dy", unknown("dy", DURATION_UNITS)),
            ("5S", unknown("S", DURATION_UNITS)),
            ("5sec", unknown("sec", DURATION_UNITS)),
            ("1h30m", unknown("h30m", DURATION_UNITS)),
            ("-5s", UnitError::Negative),
            ("+5s", UnitError::NoNumber),
            ("s", UnitError::NoNumber),
            ("lots", UnitError::NoNumber),
            ("1.5s", UnitError::Fraction),
            ("5 s", UnitError::Whitespace),
            (" 5s", UnitError::Whitespace),
            ("18446744073709551616ms", UnitError::Overflow),
            ("18446744073709551615s", UnitError::Overflow),
            ("99999999999999999999999d", UnitError::Overflow),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text).as_ref(), Err(want), "{text:?}");
        }
    }

    #[test]
    fn sizes_accepted() {
        let cases: &[(&str, u64)] = &[
            ("0B", 0),
            ("512B", 512),
            ("64KiB", 64 * 1024),
            ("256MiB", 256 * 1024 * 1024),
            ("1GiB", 1 << 30),
            ("2TiB", 2 << 40),
            ("64KB", 64_000),
            ("1MB", 1_000_000),
            ("3GB", 3_000_000_000),
            ("1TB", 1_000_000_000_000),
            ("64kib", 64 * 1024),
            ("1mb", 1_000_000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(*want), "{text:?}");
        }
    }

    #[test]
    fn sizes_refused() {
        let cases: &[(&str, UnitError)] = &[
            ("", UnitError::Empty),
            (
                "64",
                UnitError::MissingUnit {
                    expected: SIZE_UNITS,
                },
            ),
            ("64K", unknown("K", SIZE_UNITS)),
            ("64KiBs", unknown("KiBs", SIZE_UNITS)),
            ("16EiB", unknown("EiB", SIZE_UNITS)),
            ("KiB", UnitError::NoNumber),
            ("junk", UnitError::NoNumber),
            ("-1KiB", UnitError::Negative),
            ("1.5MiB", UnitError::Fraction),
            ("64 KiB", UnitError::Whitespace),
            ("16777216TiB", UnitError::Overflow),
            ("18446744073709551616B", UnitError::Overflow),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text).as_ref(), Err(want), "{text:?}");
        }
    }

    #[test]
    fn errors_name_the_unit_and_the_choices() {
        let err = parse_duration("1dy").expect_err("dy is not a unit");
        assert_eq!(
            err.to_string(),
            r#"unknown unit "dy", use ms, s, m, h or d"#
        );
        let err = parse_size("64").expect_err("a size needs a unit");
        assert_eq!(
            err.to_string(),
            "missing unit, use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
        );
    }

    fn unknown(unit: &str, expected: &'static str) -> UnitError {
        UnitError::UnknownUnit {
            unit: unit.to_owned(),
            expected,
        }
    }
}
