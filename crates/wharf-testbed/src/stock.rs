//! `/stock/CODE?ms=6000`: seed 002's slow stock service, a JSON quote after a delay.
//!
//! The price is a fixed function of the code ([`stock_price`]), so a test can tell which
//! quote it got; the time is when the quote was made, RFC 3339 in UTC.

use std::time::{SystemTime, UNIX_EPOCH};

use http::StatusCode;
use serde::Serialize;

use crate::error::RequestError;
use crate::query::Query;
use crate::respond::{json, Resp};

/// Longest stock code accepted.
const MAX_CODE_LEN: usize = 32;

/// The price `/stock/{code}` quotes: between 10.00 and 999.99, two decimals, fixed per code
/// (FNV-1a of the code's bytes).
///
/// ```
/// let p = wharf_testbed::stock_price("MSFT");
/// assert_eq!(p, wharf_testbed::stock_price("MSFT"));
/// assert!((10.0..1000.0).contains(&p));
/// ```
pub fn stock_price(code: &str) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in code.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (1000 + hash % 99_000) as f64 / 100.0
}

/// The JSON `/stock` answers with.
#[derive(Debug, Serialize)]
struct Quote<'a> {
    code: &'a str,
    price: f64,
    time: String,
}

/// `/stock/CODE?ms=6000`. The code is 1 to 32 of `A-Z a-z 0-9 . _ -`.
pub(crate) async fn stock(query: Query<'_>, code: &str) -> Result<Resp, RequestError> {
    let valid = (1..=MAX_CODE_LEN).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !valid {
        return Err(RequestError::Invalid {
            name: "/stock/CODE".to_owned(),
            value: code.to_owned(),
            reason: "is not a stock code (1 to 32 of A-Z a-z 0-9 . _ -)",
        });
    }
    let delay = query.millis("ms", 6000)?;
    tokio::time::sleep(delay).await;
    let quote = Quote {
        code,
        price: stock_price(code),
        time: rfc3339(SystemTime::now()),
    };
    Ok(json(StatusCode::OK, &quote))
}

/// `2024-01-01T00:00:00.000Z` (times before 1970 print as 1970).
fn rfc3339(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since_epoch.subsec_millis()
    )
}

/// Year, month, day of the `days`-th day after 1970-01-01 (Howard Hinnant's `civil_from_days`,
/// <https://howardhinnant.github.io/date_algorithms.html>, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_rfc3339() {
        let at =
            |secs: u64, ms: u64| UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms);
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(at(951_782_400, 5)), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(at(1_704_067_199, 999)), "2023-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(at(4_102_444_800, 0)), "2100-01-01T00:00:00.000Z");
    }

    #[test]
    fn prices_have_two_decimals() {
        for code in ["A", "MSFT", "GOOG", "x.y-z_1"] {
            let p = stock_price(code);
            let cents = p * 100.0;
            assert!((cents - cents.round()).abs() < 1e-6, "{code}: {p}");
        }
        assert_ne!(stock_price("MSFT"), stock_price("GOOG"));
    }
}
