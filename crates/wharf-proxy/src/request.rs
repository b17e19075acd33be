//! Reads a proxy call's query: the target `url` and `cacheDuration`.

use url::Url;

use crate::destination::parse_target;
use crate::error::ProxyError;

/// What a client asked the proxy for.
#[derive(Debug, Clone)]
pub struct ProxyRequest {
    /// The normalised target; its serialisation is the cache key.
    pub target: Url,
    /// Seconds to cache for; 0 means pass-through.
    pub cache_duration: u64,
}

impl ProxyRequest {
    /// Parses `url` and `cacheDuration` from a raw query string.
    /// Other parameters are ignored, as clients add cache-busters.
    pub fn from_query(query: Option<&str>) -> Result<ProxyRequest, ProxyError> {
        let raw = RawQuery::parse(query)?;
        Ok(ProxyRequest {
            target: raw.target()?,
            cache_duration: raw.cache_duration,
        })
    }

    /// The cache key: the normalised URL (cacheDuration is not part of it).
    pub fn cache_key(&self) -> &str {
        self.target.as_str()
    }
}

/// The query read but `url` not yet decoded nor parsed: the first, cheap step, after which
/// the proxy looks the raw `url` up among targets it has already checked.
#[derive(Debug, Clone, Copy)]
pub struct RawQuery<'q> {
    /// The `url` value as sent (still percent-encoded).
    pub url: &'q str,
    /// Seconds to cache for; 0 means pass-through.
    pub cache_duration: u64,
}

impl<'q> RawQuery<'q> {
    /// Finds `url` and `cacheDuration` (each at most once) and reads `cacheDuration`.
    pub fn parse(query: Option<&'q str>) -> Result<RawQuery<'q>, ProxyError> {
        let mut raw_url = None;
        let mut raw_duration = None;
        for pair in pairs(query.unwrap_or("")) {
            let (name, value) = match memchr::memchr(b'=', pair.as_bytes()) {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, ""),
            };
            let (slot, name) = match name {
                "url" => (&mut raw_url, "url"),
                "cacheDuration" => (&mut raw_duration, "cacheDuration"),
                _ => continue,
            };
            if slot.is_some() {
                return Err(ProxyError::Repeated(name));
            }
            *slot = Some(value);
        }
        let url = raw_url.ok_or(ProxyError::MissingUrl)?;
        let cache_duration = match raw_duration {
            None => 0,
            // Plain digits need no decoding (the common case).
            Some(text) if !text.contains(['%', '+']) => parse_duration(text)?,
            Some(text) => parse_duration(&decode("cacheDuration", text)?)?,
        };
        Ok(RawQuery {
            url,
            cache_duration,
        })
    }

    /// Decodes and parses `url` into a normalised target (not yet checked against the
    /// destination policy).
    pub fn target(&self) -> Result<Url, ProxyError> {
        let decoded = decode("url", self.url)?;
        parse_target(&decoded).map_err(|source| ProxyError::Target {
            url: decoded.clone(),
            source,
        })
    }
}

/// The `&`-separated pieces of `query`, found with `memchr` (`&` is ASCII, so each piece is
/// still a `str`): `str::split`'s `char` searcher cost ~600 instructions a proxy call, most
/// of it setting up a search per piece, and a plain byte loop ~550 (callgrind, a 1 KiB
/// pass-through).
fn pairs(query: &str) -> impl Iterator<Item = &str> {
    let ends = memchr::memchr_iter(b'&', query.as_bytes()).chain(std::iter::once(query.len()));
    let mut start = 0;
    ends.map(move |end| {
        let pair = &query[start..end];
        start = end + 1;
        pair
    })
}

/// Whole seconds, up to 10 digits. An empty value (`cacheDuration=`) is refused rather than
/// read as 0: it is more often a template's unset variable than a
/// wish not to cache, and "no caching" has two spellings already (0, or no parameter).
fn parse_duration(text: &str) -> Result<u64, ProxyError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ProxyError::CacheDuration(text.to_owned()));
    }
    if text.len() > 10 {
        return Err(ProxyError::CacheDurationTooLarge(text.to_owned()));
    }
    // Ten digits or fewer always fit a u64.
    text.parse()
        .map_err(|_| ProxyError::CacheDuration(text.to_owned()))
}

/// Decodes a query value: `+` is a space, `%XX` a byte; the result must be UTF-8.
fn decode(name: &'static str, value: &str) -> Result<String, ProxyError> {
    let bytes: Vec<u8> = value
        .bytes()
        .map(|b| if b == b'+' { b' ' } else { b })
        .collect();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(ProxyError::BadEncoding { name })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ProxyError::BadEncoding { name })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_url_and_duration() {
        let request = ProxyRequest::from_query(Some(
            "url=http%3A%2F%2FExample.org%2Fa%3Fb%3D1&cacheDuration=60",
        ))
        .unwrap();
        assert_eq!(request.target.as_str(), "http://example.org/a?b=1");
        assert_eq!(request.cache_duration, 60);
        assert_eq!(request.cache_key(), "http://example.org/a?b=1");
    }

    #[test]
    fn query_pieces_split_at_every_ampersand() {
        let split = |query| pairs(query).collect::<Vec<_>>();
        assert_eq!(split(""), [""]);
        assert_eq!(split("a=1"), ["a=1"]);
        assert_eq!(split("&a=1&&b=é=2&"), ["", "a=1", "", "b=é=2", ""]);
        let raw = RawQuery::parse(Some("x&&url=http://a.example/?q=1&cacheDuration=7&")).unwrap();
        assert_eq!((raw.url, raw.cache_duration), ("http://a.example/?q=1", 7));
    }

    #[test]
    fn duration_absent_or_zero_is_pass_through() {
        for query in [
            "url=http://a.example/",
            "url=http://a.example/&cacheDuration=0",
        ] {
            assert_eq!(
                ProxyRequest::from_query(Some(query))
                    .unwrap()
                    .cache_duration,
                0,
                "{query}"
            );
        }
    }

    #[test]
    fn bad_queries_are_refused_with_the_reason() {
        let cases = [
            (None, "missing query parameter `url`"),
            (Some("cacheDuration=5"), "missing query parameter `url`"),
            (
                Some("url=http://a.example/&cacheDuration=-1"),
                "cacheDuration \"-1\"",
            ),
            (
                Some("url=http://a.example/&cacheDuration="),
                "cacheDuration \"\" is not a whole number",
            ),
            (
                Some("url=http://a.example/&cacheDuration"),
                "cacheDuration \"\" is not a whole number",
            ),
            (
                Some("url=http://a.example/&cacheDuration=1.5"),
                "cacheDuration \"1.5\"",
            ),
            (
                Some("url=http://a.example/&cacheDuration=99999999999"),
                "cacheDuration \"99999999999\" is too large",
            ),
            (
                Some("url=http://a.example/&cacheDuration=abc"),
                "cacheDuration \"abc\"",
            ),
            (Some("url=%zz"), "not valid percent-encoded"),
            (Some("url=%ff%fe"), "not valid percent-encoded UTF-8"),
            (
                Some("url=http://a.example/&url=http://b.example/"),
                "more than once",
            ),
            (
                Some("url=ftp%3A%2F%2Fa.example%2F"),
                "url \"ftp://a.example/\"",
            ),
        ];
        for (query, expected) in cases {
            let error = ProxyRequest::from_query(query).unwrap_err();
            assert!(error.to_string().contains(expected), "{query:?}: {error}");
            assert_eq!(error.status(), http::StatusCode::BAD_REQUEST);
        }
    }
}
