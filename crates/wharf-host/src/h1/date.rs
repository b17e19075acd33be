//! The `date` of responses, formatted once a second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    /// The second last formatted, and its IMF-fixdate.
    static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Calls `f` with the current time as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub(crate) fn with_http_date<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now();
    let second = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second {
            *cached = (second, httpdate::fmt_http_date(now));
        }
        f(cached.1.as_bytes())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_an_imf_fixdate() {
        let date = super::with_http_date(|date| String::from_utf8(date.to_vec()).unwrap());
        assert_eq!(date.len(), 29, "{date}");
        assert!(date.ends_with(" GMT"), "{date}");
        assert!(httpdate::parse_http_date(&date).is_ok(), "{date}");
    }
}
