//! Where the URL proxy may go: parsing of the `url` parameter and the SSRF address policy.
//!
//! [`parse_target`] turns the raw (already percent-decoded) `url` query value into a normalised
//! [`url::Url`] or a [`TargetError`] (400). [`DestinationPolicy`] holds one proxy service's
//! destination rules (SPEC §3, "Safety"): [`DestinationPolicy::check_url`] refuses local names,
//! special-purpose IP literals and hosts outside `allow_hosts` before any resolution;
//! [`DestinationPolicy::check_addr`] refuses special-purpose addresses after resolution.
//! [`special_range`] names the special-purpose range an address belongs to.
//!
//! Resolving names and connecting to the checked addresses is left to
//! [`crate::connector::GuardedConnector`], which calls back into this module for every address.
//!
//! Every IPv4 spelling (decimal `2130706433`, hex `0x7f.1`, octal `0177.0.0.1`, short `127.1`)
//! is normalised by the WHATWG host parser before it is classified, and numeric hosts that parser
//! rejects fail to parse: no numeric-looking name ever reaches DNS.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Why a request's `url` parameter is unusable (→ 400).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TargetError {
    /// The parameter is absent or empty.
    #[error("missing url parameter")]
    Missing,
    /// The value is not an absolute URL (the parser's message, or the syntax rule broken).
    #[error("invalid url: {0}")]
    Invalid(String),
    /// The scheme is neither `http` nor `https`.
    #[error("unsupported scheme {0:?}: only http and https are proxied")]
    Scheme(String),
    /// The URL carries userinfo (`user@host`, `user:pw@host`, even an empty `@host`).
    #[error("url carries userinfo (user@host), which is refused")]
    UserInfo,
    /// The URL has no host (`http:///x`).
    #[error("url has no host")]
    NoHost,
}

/// Why a destination was refused (→ 403).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    /// `localhost` or a name under `.localhost` (RFC 6761), refused by name.
    #[error("host {0} is a local name")]
    LocalName(String),
    /// An address (literal or resolved) in a special-purpose range.
    #[error("address {ip} is in a refused range ({range})")]
    Address {
        /// The refused address, as written or resolved.
        ip: IpAddr,
        /// The range it belongs to, as named by [`special_range`].
        range: &'static str,
    },
    /// The destination (`host:port`) matches no `allow_hosts` entry.
    #[error("destination {0} is not in allow_hosts")]
    NotAllowed(String),
}

/// Parses and normalises the raw (already percent-decoded) `url` query value.
///
/// The URL must be absolute, `http` or `https`, with an explicit `//host` authority and no
/// userinfo. Parsing is WHATWG's ([`url::Url`]), so hosts come back lowercased, IDNA-mapped and,
/// for numeric IPv4 spellings, as [`Host::Ipv4`]. The fragment is dropped. Spellings the WHATWG
/// parser would silently repair (`http:x`, `http:///x`, `http:\\x`, embedded tabs or newlines,
/// surrounding spaces) are refused instead.
///
/// ```
/// use wharf_proxy::destination::{parse_target, DestinationPolicy};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let url = parse_target("http://0x7f.1/status#top")?;
/// assert_eq!(url.as_str(), "http://127.0.0.1/status");
/// assert!(DestinationPolicy::new(false, &[]).check_url(&url).is_err());
/// # Ok(())
/// # }
/// ```
pub fn parse_target(raw: &str) -> Result<Url, TargetError> {
    if raw.is_empty() {
        return Err(TargetError::Missing);
    }
    // The WHATWG parser strips these silently; a value that needs such repair is not taken.
    if raw.bytes().any(|b| b.is_ascii_control()) {
        return Err(TargetError::Invalid(
            "contains control characters (tab, newline, ...)".to_owned(),
        ));
    }
    if raw.starts_with(' ') || raw.ends_with(' ') {
        return Err(TargetError::Invalid(
            "leading or trailing spaces".to_owned(),
        ));
    }
    let mut url = Url::parse(raw).map_err(|e| TargetError::Invalid(e.to_string()))?;
    match url.scheme() {
        "http" | "https" => {}
        other => return Err(TargetError::Scheme(other.to_owned())),
    }
    // The parse succeeded without stripping anything, so `raw` starts with `scheme:`.
    let rest = raw.split_once(':').map_or("", |(_, rest)| rest);
    let Some(after_slashes) = rest.strip_prefix("//") else {
        return Err(TargetError::Invalid(
            "expected // and a host after the scheme".to_owned(),
        ));
    };
    // For http(s), WHATWG ends the authority at `/`, `\`, `?` or `#`.
    let authority_end = after_slashes
        .find(['/', '\\', '?', '#'])
        .unwrap_or(after_slashes.len());
    let authority = &after_slashes[..authority_end];
    if authority.is_empty() {
        return Err(TargetError::NoHost);
    }
    if authority.contains('@') || !url.username().is_empty() || url.password().is_some() {
        return Err(TargetError::UserInfo);
    }
    if url.host().is_none() {
        return Err(TargetError::NoHost);
    }
    url.set_fragment(None);
    Ok(url)
}

/// The destination rules of one proxy service.
///
/// Unless `allow_private_networks`, local names and addresses in [`special_range`]s are refused;
/// a non-empty `allow_hosts` list restricts destinations further, whatever the other setting.
#[derive(Debug, Clone)]
pub struct DestinationPolicy {
    /// When true, nothing is refused by name or range (test rigs run origins on 127.0.0.1).
    allow_private_networks: bool,
    /// The `allow_hosts` entries; empty means any host passes this rule.
    allow_hosts: Vec<AllowedHost>,
}

/// One `allow_hosts` entry, its host normalised by the same parser as request URLs.
#[derive(Debug, Clone)]
struct AllowedHost {
    host: Host<String>,
    /// Matched against the URL's explicit-or-default port when present.
    port: Option<u16>,
}

impl AllowedHost {
    /// Parses `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address. An entry that is
    /// no valid host is kept verbatim as a name, so it matches nothing odd (validation is the
    /// config crate's job).
    fn parse(entry: &str) -> Self {
        let entry = entry.trim().to_ascii_lowercase();
        let (host, port) = split_host_port(&entry);
        let host = match host.parse::<Ipv6Addr>() {
            Ok(v6) => Host::Ipv6(v6),
            Err(_) => Host::parse(host).unwrap_or_else(|_| Host::Domain(host.to_owned())),
        };
        Self { host, port }
    }

    fn matches<S: AsRef<str>>(&self, host: &Host<S>, port: Option<u16>) -> bool {
        let host_matches = match (&self.host, host) {
            (Host::Domain(a), Host::Domain(b)) => a.eq_ignore_ascii_case(b.as_ref()),
            (Host::Ipv4(a), Host::Ipv4(b)) => a == b,
            (Host::Ipv6(a), Host::Ipv6(b)) => a == b,
            _ => false,
        };
        host_matches && self.port.is_none_or(|p| Some(p) == port)
    }
}

/// Splits an `allow_hosts` entry into host and optional port.
fn split_host_port(entry: &str) -> (&str, Option<u16>) {
    if entry.starts_with('[') {
        if let Some(close) = entry.find(']') {
            let port = entry[close + 1..]
                .strip_prefix(':')
                .and_then(|p| p.parse().ok());
            return (&entry[..=close], port);
        }
        return (entry, None);
    }
    match entry.split_once(':') {
        // Exactly one colon: host:port. More than one: a bare IPv6 address.
        Some((host, port)) if !port.contains(':') => match port.parse() {
            Ok(port) => (host, Some(port)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

impl DestinationPolicy {
    /// Builds the rules of one service. `allow_hosts` entries are `host` or `host:port`
    /// (IPv6 as `[addr]` or `[addr]:port`), already lowercased; an empty list allows any host.
    pub fn new(allow_private_networks: bool, allow_hosts: &[String]) -> Self {
        Self {
            allow_private_networks,
            allow_hosts: allow_hosts.iter().map(|e| AllowedHost::parse(e)).collect(),
        }
    }

    /// Checks that can be made before resolution: local names (`localhost`, `*.localhost`, any
    /// case, trailing dot or not), IP-literal hosts (classified by [`special_range`]), and
    /// `allow_hosts` (the URL's host, and its explicit-or-default port when the entry has one).
    pub fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        match url.host() {
            Some(host) => self.check_host(&host, url.port_or_known_default()),
            None => Err(Refusal::NotAllowed(format!("{url} (no host)"))),
        }
    }

    /// Checks one resolved address (the connector calls it for every address of a name).
    pub fn check_addr(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.allow_private_networks {
            return Ok(());
        }
        match special_range(ip) {
            Some(range) => Err(Refusal::Address { ip, range }),
            None => Ok(()),
        }
    }

    /// The pre-resolution checks for a parsed host and the port the connection would use.
    pub(crate) fn check_host<S: AsRef<str>>(
        &self,
        host: &Host<S>,
        port: Option<u16>,
    ) -> Result<(), Refusal> {
        match host {
            Host::Domain(name) => {
                let name = name.as_ref();
                let bare = name.trim_end_matches('.');
                if !self.allow_private_networks && is_local_name(bare) {
                    return Err(Refusal::LocalName(name.to_owned()));
                }
                // The WHATWG parser turns every numeric host into Host::Ipv4/Ipv6; this only
                // guards hosts that reach us by another road.
                if let Ok(ip) = bare.parse::<IpAddr>() {
                    self.check_addr(ip)?;
                }
            }
            Host::Ipv4(ip) => self.check_addr(IpAddr::V4(*ip))?,
            Host::Ipv6(ip) => self.check_addr(IpAddr::V6(*ip))?,
        }
        if self.allow_hosts.is_empty() || self.allow_hosts.iter().any(|a| a.matches(host, port)) {
            return Ok(());
        }
        let host = match host {
            Host::Domain(name) => name.as_ref().to_owned(),
            Host::Ipv4(ip) => ip.to_string(),
            Host::Ipv6(ip) => format!("[{ip}]"),
        };
        Err(Refusal::NotAllowed(match port {
            Some(port) => format!("{host}:{port}"),
            None => host,
        }))
    }
}

/// `localhost` and every name under it (RFC 6761 §6.3), given without trailing dots.
/// `.localhost` itself (an empty label under it) counts as under it.
fn is_local_name(name: &str) -> bool {
    const SUFFIX: &str = ".localhost";
    name.eq_ignore_ascii_case("localhost")
        || (name.len() >= SUFFIX.len()
            && name.is_char_boundary(name.len() - SUFFIX.len())
            && name[name.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX))
}

/// The special-purpose range an address belongs to, or `None` for a global unicast address.
///
/// IPv4 follows the IANA special-purpose registry (RFC 6890 and successors). For IPv6, an
/// IPv4-mapped (`::ffff:0:0/96`), NAT64 (`64:ff9b::/96`) or 6to4 (`2002::/16`) address is
/// classified by its embedded IPv4 address, so `::ffff:127.0.0.1` is refused and
/// `::ffff:8.8.8.8` is not. IPv4-compatible (`::/96`, deprecated), Teredo (`2001::/32`, the
/// client address is obfuscated), local-use NAT64 (`64:ff9b:1::/48`) and everything outside the
/// global unicast block `2000::/3` are refused outright.
///
/// ```
/// use std::net::IpAddr;
/// use wharf_proxy::destination::special_range;
/// let ip = |s: &str| s.parse::<IpAddr>().expect("test literal");
/// assert_eq!(special_range(ip("169.254.169.254")), Some("link-local"));
/// assert_eq!(special_range(ip("::ffff:10.0.0.1")), Some("ipv4-mapped"));
/// assert_eq!(special_range(ip("8.8.8.8")), None);
/// ```
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_range_v4(v4),
        IpAddr::V6(v6) => special_range_v6(v6),
    }
}

/// IPv4 special-purpose ranges; the first match names the range, so order matters.
#[rustfmt::skip]
const V4_RANGES: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 32, "unspecified"),
    (Ipv4Addr::new(0, 0, 0, 0), 8, "this-network"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "cgnat"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "ietf-protocol-assignments"),
    (Ipv4Addr::new(192, 0, 2, 0), 24, "documentation"),
    (Ipv4Addr::new(192, 88, 99, 0), 24, "6to4-relay"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking"),
    (Ipv4Addr::new(198, 51, 100, 0), 24, "documentation"),
    (Ipv4Addr::new(203, 0, 113, 0), 24, "documentation"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(255, 255, 255, 255), 32, "broadcast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved"),
];

/// IPv6 special-purpose ranges checked after the embedded-IPv4 forms; first match wins.
#[rustfmt::skip]
const V6_RANGES: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48, "nat64-local"),
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64, "discard"),
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32, "teredo"),
    (Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0), 48, "benchmarking"),
    (Ipv6Addr::new(0x2001, 0x10, 0, 0, 0, 0, 0, 0), 28, "orchid"),
    (Ipv6Addr::new(0x2001, 0x20, 0, 0, 0, 0, 0, 0), 28, "orchid"),
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23, "ietf-protocol-assignments"),
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32, "documentation"),
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, "documentation"),
    (Ipv6Addr::new(0x5f00, 0, 0, 0, 0, 0, 0, 0), 16, "srv6-sid"),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, "unique-local"),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, "link-local"),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, "site-local"),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "multicast"),
    (Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3, "global"),
];

fn special_range_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let bits = u32::from(ip);
    V4_RANGES
        .iter()
        .find(|(net, len, _)| {
            prefix_matches(u128::from(bits), u128::from(u32::from(*net)), 32, *len)
        })
        .map(|(_, _, name)| *name)
}

fn special_range_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_range_v4(v4).map(|_| "ipv4-mapped");
    }
    if s[..6] == [0; 6] {
        // IPv4-compatible (RFC 4291 §2.5.5.1, deprecated): refused whatever it embeds.
        return Some("ipv4-compatible");
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return special_range_v4(embedded(s[6], s[7])).map(|_| "nat64");
    }
    if s[0] == 0x2002 {
        return special_range_v4(embedded(s[1], s[2])).map(|_| "6to4");
    }
    let bits = u128::from(ip);
    match V6_RANGES
        .iter()
        .find(|(net, len, _)| prefix_matches(bits, u128::from(*net), 128, *len))
    {
        Some((_, _, "global")) => None,
        Some((_, _, name)) => Some(name),
        // Outside 2000::/3 nothing is allocated for global unicast.
        None => Some("reserved"),
    }
}

/// Whether the top `len` bits of `addr` and `net` (both `width` bits wide) agree.
fn prefix_matches(addr: u128, net: u128, width: u32, len: u8) -> bool {
    let shift = width - u32::from(len);
    shift >= width || addr >> shift == net >> shift
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_zero_matches_everything() {
        assert!(prefix_matches(0xffff_ffff, 0, 32, 0));
        assert!(prefix_matches(1, 0, 128, 0));
        assert!(!prefix_matches(1, 0, 32, 32));
    }

    #[test]
    fn allow_entry_forms() {
        for (entry, host, port) in [
            ("example.com", "example.com", None),
            ("example.com:8080", "example.com", Some(8080)),
            ("[::1]", "[::1]", None),
            ("[::1]:443", "[::1]", Some(443)),
            ("2606:4700::1111", "2606:4700::1111", None),
            ("weird:port", "weird:port", None),
        ] {
            assert_eq!(split_host_port(entry), (host, port), "{entry}");
        }
    }

    #[test]
    fn local_names() {
        for name in ["localhost", "LOCALHOST", "a.localhost", "x.y.LocalHost"] {
            assert!(is_local_name(name), "{name}");
        }
        for name in [
            "localhost.com",
            "notlocalhost",
            ".localhostx",
            "localhos",
            "",
        ] {
            assert!(!is_local_name(name), "{name}");
        }
    }

    /// Regression (issue 7, found by the `target_url` fuzz target):
    /// `http://.localhost.:/=jjj` parsed to the host `.localhost.`, which the
    /// name check let through (only names longer than `.localhost` counted).
    #[test]
    fn fuzz_dot_localhost_is_refused_by_name() {
        assert!(is_local_name(".localhost"));
        assert!(is_local_name(".LocalHost"));
        let strict = DestinationPolicy::new(false, &[]);
        for raw in [
            "http://.localhost.:/=jjj",
            "http://.localhost/",
            "http://.LOCALHOST:80/",
        ] {
            let url = parse_target(raw).unwrap();
            assert!(
                matches!(strict.check_url(&url), Err(Refusal::LocalName(_))),
                "{raw} ({url}) was not refused by name"
            );
        }
    }
}
