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
        let mut raw_url = None;
        let mut raw_duration = None;
        for pair in query.unwrap_or("").split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match name {
                "url" => &mut raw_url,
                "cacheDuration" => &mut raw_duration,
                _ => continue,
            };
            let name = if name == "url" {
                "url"
            } else {
                "cacheDuration"
            };
            if slot.is_some() {
                return Err(ProxyError::Repeated(name));
            }
            *slot = Some(decode(name, value)?);
        }
        let raw_url = raw_url.ok_or(ProxyError::MissingUrl)?;
        let target = parse_target(&raw_url).map_err(|source| ProxyError::Target {
            url: raw_url.clone(),
            source,
        })?;
        let cache_duration = match raw_duration.as_deref() {
            None | Some("") => 0,
            Some(text) if text.bytes().all(|b| b.is_ascii_digit()) && text.len() <= 10 => text
                .parse()
                .map_err(|_| ProxyError::CacheDuration(text.to_owned()))?,
            Some(text) => return Err(ProxyError::CacheDuration(text.to_owned())),
        };
        Ok(ProxyRequest {
            target,
            cache_duration,
        })
    }

    /// The cache key: the normalised URL (cacheDuration is not part of it).
    pub fn cache_key(&self) -> &str {
        self.target.as_str()
    }
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
    fn duration_absent_or_zero_is_pass_through() {
        for query in [
            "url=http://a.example/",
            "url=http://a.example/&cacheDuration=0",
            "url=http://a.example/&cacheDuration=",
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
                Some("url=http://a.example/&cacheDuration=1.5"),
                "cacheDuration \"1.5\"",
            ),
            (
                Some("url=http://a.example/&cacheDuration=99999999999"),
                "cacheDuration",
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
