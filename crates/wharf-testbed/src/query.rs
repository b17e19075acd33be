//! Query-string parameters, parsed on demand and checked against their ranges.
//!
//! [`Query`] wraps the raw query and decodes (`application/x-www-form-urlencoded`) only the
//! parameter asked for; unknown parameters are ignored, and the first of repeated ones wins.
//! Every bad value becomes a [`RequestError`] naming the parameter.

use std::borrow::Cow;
use std::time::Duration;

use url::form_urlencoded;

use crate::error::RequestError;

/// Longest delay any endpoint accepts: 10 minutes.
pub(crate) const MAX_MS: u64 = 600_000;

/// Largest body any endpoint produces: 1 TiB (streamed, never allocated).
pub(crate) const MAX_BYTES: u64 = 1 << 40;

/// The query string of one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query<'a> {
    raw: &'a str,
}

impl<'a> Query<'a> {
    /// The query of a request (`None`: no `?`).
    pub(crate) fn new(raw: Option<&'a str>) -> Self {
        Self {
            raw: raw.unwrap_or(""),
        }
    }

    /// Every parameter, decoded, in order.
    pub(crate) fn pairs(&self) -> form_urlencoded::Parse<'a> {
        form_urlencoded::parse(self.raw.as_bytes())
    }

    /// The first value of `name`, decoded.
    pub(crate) fn get(&self, name: &str) -> Option<Cow<'a, str>> {
        self.pairs().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// `name` as a whole number in `min..=max`, `default` when absent.
    pub(crate) fn number(
        &self,
        name: &'static str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, RequestError> {
        match self.get(name) {
            Some(value) => parse_number(name, &value, min, max),
            None => Ok(default),
        }
    }

    /// `name` as milliseconds up to [`MAX_MS`], `default_ms` when absent.
    pub(crate) fn millis(
        &self,
        name: &'static str,
        default_ms: u64,
    ) -> Result<Duration, RequestError> {
        self.number(name, default_ms, 0, MAX_MS)
            .map(Duration::from_millis)
    }

    /// `name` as a byte count up to [`MAX_BYTES`], `default` when absent.
    pub(crate) fn bytes(&self, name: &'static str, default: u64) -> Result<u64, RequestError> {
        self.number(name, default, 0, MAX_BYTES)
    }

    /// `name` as a flag (`1`/`true`/`yes` or `0`/`false`/`no`; present but empty means true),
    /// `false` when absent.
    pub(crate) fn flag(&self, name: &'static str) -> Result<bool, RequestError> {
        match self.get(name).as_deref() {
            None => Ok(false),
            Some("" | "1" | "true" | "yes") => Ok(true),
            Some("0" | "false" | "no") => Ok(false),
            Some(other) => Err(RequestError::Invalid {
                name: name.to_owned(),
                value: other.to_owned(),
                reason: "is not a flag (use 1 or 0)",
            }),
        }
    }
}

/// `value` as a whole number in `min..=max`; errors name the parameter `name`.
pub(crate) fn parse_number(
    name: &'static str,
    value: &str,
    min: u64,
    max: u64,
) -> Result<u64, RequestError> {
    // `u64::from_str` accepts a leading `+`; the testbed takes digits only.
    let parsed = if value.bytes().all(|b| b.is_ascii_digit()) {
        value.parse::<u64>().ok()
    } else {
        None
    };
    match parsed {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        Some(n) => Err(RequestError::OutOfRange {
            name,
            value: n,
            min,
            max,
        }),
        // Digits that overflow u64 are out of range too, but cannot be shown as a number.
        None => Err(RequestError::NotANumber {
            name,
            value: value.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_checked() {
        let q = Query::new(Some(
            "ms=250&bytes=abc&big=99999999999999999999999&neg=-1&plus=+5",
        ));
        assert_eq!(q.millis("ms", 6000).unwrap(), Duration::from_millis(250));
        assert_eq!(
            q.millis("absent", 6000).unwrap(),
            Duration::from_millis(6000)
        );
        for name in ["bytes", "big", "neg", "plus"] {
            let err = q.number(name, 0, 0, 10).unwrap_err();
            assert!(err.to_string().starts_with(name), "{err}");
        }
        let err = q.number("ms", 0, 0, 100).unwrap_err();
        assert_eq!(err.to_string(), "ms: 250 is outside 0..=100");
    }

    #[test]
    fn flags_and_decoding() {
        let q = Query::new(Some("a=1&b=0&c&d=maybe&e=x%20y&a=0"));
        assert!(q.flag("a").unwrap());
        assert!(!q.flag("b").unwrap());
        assert!(q.flag("c").unwrap());
        assert!(q.flag("d").is_err());
        assert!(!q.flag("z").unwrap());
        assert_eq!(q.get("e").as_deref(), Some("x y"));
    }
}
