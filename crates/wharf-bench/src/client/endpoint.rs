//! [`Endpoint`]: a target URL resolved once and its request bytes built up front; [`Req`]: the
//! bytes of one request.
//!
//! A request is `GET target HTTP/1.1`, `host` and `user-agent`: nothing else is sent. For a
//! plain URL the whole request is serialised once and every call shares it (a reference-count
//! increment); for a `{n}` template the pieces around each `{n}` are kept, and a call's request
//! is those pieces with its number in decimal, in one allocation.

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use http::uri::InvalidUri;
use http::Uri;
use tokio::net::TcpStream;

use crate::client::{CallError, Conn, CALL_NUMBER};
use crate::BenchError;

/// The bytes of one request, ready to write.
#[derive(Debug, Clone)]
pub(crate) struct Req(Bytes);

impl Req {
    /// The request as sent on the wire.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// How requests are made.
#[derive(Debug)]
enum Requests {
    /// The same request for every call.
    Fixed(Bytes),
    /// The request's pieces around each `{n}` (at least two).
    Numbered(Vec<Vec<u8>>),
}

/// A target URL resolved and pre-built for calls.
#[derive(Debug)]
pub(crate) struct Endpoint {
    url: String,
    addr: SocketAddr,
    requests: Requests,
}

impl Endpoint {
    /// Parses `url` (an `http://` URL, `{n}` allowed in its path and query) and resolves its
    /// host once. `target` names the target in errors.
    pub(crate) async fn resolve(target: &str, url: &str) -> Result<Endpoint, BenchError> {
        let bad = |why: &str| BenchError::Url {
            target: target.to_owned(),
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let probe: Uri = url
            .replace(CALL_NUMBER, "0")
            .parse()
            .map_err(|e: InvalidUri| bad(&e.to_string()))?;
        match probe.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(bad("https is not supported, use http://")),
            _ => return Err(bad("not an http:// URL")),
        }
        let authority = probe.authority().ok_or_else(|| bad("no host"))?;
        let with_one: Uri = url
            .replace(CALL_NUMBER, "1")
            .parse()
            .map_err(|e: InvalidUri| bad(&e.to_string()))?;
        if with_one.authority() != Some(authority) {
            return Err(bad("{n} is allowed in the path and query only"));
        }
        if authority.as_str().contains('@') {
            return Err(bad("user:password@ is not supported"));
        }
        let host = authority.host();
        let port = port(authority.as_str()).map_err(|why| bad(&why))?;
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = tokio::net::lookup_host((bare_host, port))
            .await
            .and_then(|mut addrs| {
                addrs
                    .next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
            })
            .map_err(|source| BenchError::Resolve {
                target: target.to_owned(),
                host: host.to_owned(),
                source,
            })?;
        // The origin form: everything after the authority, without the fragment.
        let after_scheme = url.find("://").map_or(url, |i| &url[i + 3..]);
        let rest = match after_scheme.find(['/', '?', '#']) {
            Some(i) if after_scheme[i..].starts_with('/') => after_scheme[i..].to_owned(),
            Some(i) => format!("/{}", &after_scheme[i..]),
            None => "/".to_owned(),
        };
        let rest = rest.split('#').next().unwrap_or("/");
        // The same check `http` makes of any request target: no spaces or control bytes,
        // so the request line cannot be split or extended.
        rest.replace(CALL_NUMBER, "0")
            .parse::<Uri>()
            .map_err(|e: InvalidUri| bad(&e.to_string()))?;
        let head =
            format!("GET {rest} HTTP/1.1\r\nhost: {authority}\r\nuser-agent: wharf-bench\r\n\r\n");
        let requests = if rest.contains(CALL_NUMBER) {
            Requests::Numbered(
                head.split(CALL_NUMBER)
                    .map(|p| p.as_bytes().to_vec())
                    .collect(),
            )
        } else {
            Requests::Fixed(Bytes::from(head.into_bytes()))
        };
        Ok(Endpoint {
            url: url.to_owned(),
            addr,
            requests,
        })
    }

    /// The URL (template) as given.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The address calls connect to.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The request for call number `n` (`n` only matters for a template with `{n}`).
    pub(crate) fn request(&self, n: u64) -> Req {
        match &self.requests {
            Requests::Fixed(bytes) => Req(bytes.clone()),
            Requests::Numbered(parts) => {
                let len: usize = parts.iter().map(Vec::len).sum();
                let mut text = Vec::with_capacity(len + 20 * (parts.len() - 1));
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        push_decimal(&mut text, n);
                    }
                    text.extend_from_slice(part);
                }
                Req(Bytes::from(text))
            }
        }
    }

    /// Opens a new connection (TCP connect, `TCP_NODELAY`).
    pub(crate) async fn connect(&self) -> Result<Conn, CallError> {
        let stream = TcpStream::connect(self.addr)
            .await
            .map_err(|source| CallError::Connect {
                addr: self.addr,
                source,
            })?;
        // Small requests must leave at once, as a browser's do.
        let _ = stream.set_nodelay(true);
        Ok(Conn::new(stream))
    }
}

/// The port of `authority` (`host`, `host:port`, `[v6]:port`), 80 when none is written.
///
/// `http` parses any digits after the colon but `port_u16` gives `None` for what does not fit
/// a `u16`, which would silently be port 80: a port that cannot be connected to is refused
/// instead, so a typo is an error before any call, not a run against another server.
fn port(authority: &str) -> Result<u16, String> {
    // After the last `]` (an IPv6 literal's colons are not a port's), the last `:`.
    let after_host = authority
        .rfind(']')
        .map_or(authority, |i| &authority[i + 1..]);
    let Some((_, digits)) = after_host.rsplit_once(':') else {
        return Ok(80);
    };
    // RFC 3986 §3.2.3: an empty port means the scheme's default.
    if digits.is_empty() {
        return Ok(80);
    }
    match digits.parse::<u16>() {
        Ok(0) => Err("port 0 cannot be called, give a port from 1 to 65535".to_owned()),
        Ok(port) => Ok(port),
        Err(_) if !digits.bytes().all(|b| b.is_ascii_digit()) => Err(format!(
            "port {digits:?} is not a number, give a port from 1 to 65535"
        )),
        Err(_) => Err(format!(
            "port {digits} is out of range, give a port from 1 to 65535"
        )),
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builds_origin_form_requests_with_host() {
        let ep = Endpoint::resolve("t", "http://127.0.0.1:9/a/b?x=1&n={n}#frag")
            .await
            .unwrap();
        assert_eq!(
            ep.request(42).as_bytes(),
            b"GET /a/b?x=1&n=42 HTTP/1.1\r\nhost: 127.0.0.1:9\r\nuser-agent: wharf-bench\r\n\r\n"
        );
        assert_eq!(ep.addr().port(), 9);
        let fixed = Endpoint::resolve("t", "http://127.0.0.1").await.unwrap();
        assert_eq!(
            fixed.request(0).as_bytes(),
            b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nuser-agent: wharf-bench\r\n\r\n"
        );
        assert_eq!(fixed.addr().port(), 80);
        let query = Endpoint::resolve("t", "http://[::1]:8080?q={n}/{n}")
            .await
            .unwrap();
        assert!(query.request(u64::MAX).as_bytes().starts_with(
            b"GET /?q=18446744073709551615/18446744073709551615 HTTP/1.1\r\nhost: [::1]:8080\r\n"
        ));
    }

    #[test]
    fn ports_as_written_or_80() {
        for (authority, expected) in [
            ("127.0.0.1", Ok(80)),
            ("127.0.0.1:", Ok(80)),
            ("127.0.0.1:9000", Ok(9000)),
            ("h:65535", Ok(65535)),
            ("[::1]", Ok(80)),
            ("[::1]:8080", Ok(8080)),
            (
                "h:99999",
                Err("port 99999 is out of range, give a port from 1 to 65535"),
            ),
            (
                "[::1]:65536",
                Err("port 65536 is out of range, give a port from 1 to 65535"),
            ),
            (
                "h:0",
                Err("port 0 cannot be called, give a port from 1 to 65535"),
            ),
        ] {
            assert_eq!(
                port(authority),
                expected.map_err(str::to_owned),
                "{authority}"
            );
        }
    }

    #[tokio::test]
    async fn an_out_of_range_port_names_the_port() {
        let error = Endpoint::resolve("a", "http://127.0.0.1:99999/fast")
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "target a: \"http://127.0.0.1:99999/fast\" is not a usable URL: \
             port 99999 is out of range, give a port from 1 to 65535"
        );
    }

    #[test]
    fn decimals() {
        for n in [0, 7, 10, 99, 1234567890, u64::MAX] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").as_bytes());
        }
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_call() {
        for url in [
            "https://127.0.0.1/",
            "ftp://127.0.0.1/",
            "127.0.0.1:80/x",
            "http://127.0.0.{n}/",
            "http://u:p@127.0.0.1/",
            "not a url",
            "http://127.0.0.1/a b",
            "http://127.0.0.1/a\r\nx-evil: 1",
            // Out of range or unusable ports are refused, not taken for port 80.
            "http://127.0.0.1:99999/fast",
            "http://127.0.0.1:65536/",
            "http://127.0.0.1:0/",
            "http://[::1]:70000/",
            "http://127.0.0.1:abc/",
        ] {
            let result = Endpoint::resolve("t", url).await;
            assert!(
                matches!(result, Err(BenchError::Url { .. })),
                "{url}: {result:?}"
            );
        }
    }
}
