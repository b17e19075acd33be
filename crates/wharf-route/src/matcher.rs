//! Which requests a route takes: its methods and `match_headers` (the
//! host already matched the path prefix on whole segments). The host asks the same
//! conditions to choose among routes that share a prefix ([`RequestFilter`]).

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use wharf_host::{Admission, AllowedMethods, RequestFilter};

use crate::error::RouteError;

/// Method and header conditions of one route.
#[derive(Debug, Clone)]
pub struct Matcher {
    methods: Vec<Method>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Matcher {
    /// `methods` empty means any method; allowing GET allows HEAD (a HEAD is a GET without
    /// the body, RFC 9110 §9.3.2; nginx's `limit_except` does the same). Every header must
    /// be present and equal (names are case-insensitive by construction, values exact).
    pub fn new(methods: Vec<Method>, headers: Vec<(HeaderName, HeaderValue)>) -> Self {
        Self {
            methods: wharf_config::methods_taken(&methods),
            headers,
        }
    }

    /// The first header that is missing or different in `headers`, if any.
    fn header_mismatch(&self, headers: &HeaderMap) -> Option<&HeaderName> {
        self.headers
            .iter()
            .find(|(name, expected)| headers.get(name) != Some(expected))
            .map(|(name, _)| name)
    }

    /// Whether the route takes `request`, or why not. The headers are checked first: a 405
    /// says that the same request with another method would be taken.
    pub fn check<B>(&self, request: &Request<B>) -> Result<(), RouteError> {
        if let Some(name) = self.header_mismatch(request.headers()) {
            return Err(RouteError::HeaderMismatch(name.to_string()));
        }
        if !self.methods.is_empty() && !self.methods.contains(request.method()) {
            // Routes sharing the prefix: the methods any of them takes (the host's choice).
            let allowed = match request.extensions().get::<AllowedMethods>() {
                Some(AllowedMethods(all)) => join(all),
                None => self.allowed(),
            };
            return Err(RouteError::Method {
                method: request.method().clone(),
                allowed,
            });
        }
        Ok(())
    }

    /// Whether it has any condition (else it takes every request under its prefix).
    pub fn is_conditional(&self) -> bool {
        !self.methods.is_empty() || !self.headers.is_empty()
    }

    /// The allowed methods, for the `allow` header of a 405.
    pub fn allowed(&self) -> String {
        join(&self.methods)
    }
}

/// `methods` as an `allow` field's value: `GET, HEAD`.
fn join(methods: &[Method]) -> String {
    methods
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

impl RequestFilter for Matcher {
    fn admits(&self, method: &Method, headers: &HeaderMap) -> Admission {
        if self.header_mismatch(headers).is_some() {
            Admission::Declines
        } else if !self.methods.is_empty() && !self.methods.contains(method) {
            Admission::WrongMethod
        } else {
            Admission::Takes
        }
    }

    /// [`wharf_config::route_rank`], the order `wharf check` judges hidden routes by.
    fn rank(&self) -> usize {
        wharf_config::route_rank(self.headers.len(), !self.methods.is_empty())
    }

    fn methods(&self) -> &[Method] {
        &self.methods
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_headers() {
        let matcher = Matcher::new(
            vec![Method::GET, Method::POST],
            vec![(
                HeaderName::from_static("x-tenant"),
                HeaderValue::from_static("acme"),
            )],
        );
        let request = |method: Method, tenant: Option<&'static str>| {
            let mut builder = Request::builder().method(method).uri("/orders");
            if let Some(tenant) = tenant {
                builder = builder.header("X-Tenant", tenant);
            }
            builder.body(()).unwrap()
        };
        assert!(matcher.check(&request(Method::GET, Some("acme"))).is_ok());
        assert!(matches!(
            matcher.check(&request(Method::DELETE, Some("acme"))),
            Err(RouteError::Method { .. })
        ));
        assert!(matches!(
            matcher.check(&request(Method::GET, Some("other"))),
            Err(RouteError::HeaderMismatch(_))
        ));
        // The headers first: with the wrong method too, no 405 (another method would
        // not be taken either).
        assert!(matches!(
            matcher.check(&request(Method::POST, None)),
            Err(RouteError::HeaderMismatch(_))
        ));
        assert!(
            matcher.check(&request(Method::HEAD, Some("acme"))).is_ok(),
            "GET allows HEAD"
        );
        assert_eq!(matcher.allowed(), "GET, POST, HEAD");
        assert!(Matcher::new(vec![], vec![])
            .check(&request(Method::PATCH, None))
            .is_ok());
    }

    #[test]
    fn as_a_filter_headers_decline_and_a_method_alone_is_a_wrong_method() {
        let matcher = Matcher::new(
            vec![Method::GET],
            vec![(
                HeaderName::from_static("x-tenant"),
                HeaderValue::from_static("acme"),
            )],
        );
        let mut acme = HeaderMap::new();
        acme.insert("x-tenant", HeaderValue::from_static("acme"));
        assert_eq!(matcher.admits(&Method::GET, &acme), Admission::Takes);
        assert_eq!(matcher.admits(&Method::POST, &acme), Admission::WrongMethod);
        assert_eq!(
            matcher.admits(&Method::GET, &HeaderMap::new()),
            Admission::Declines
        );
        assert_eq!(
            matcher.admits(&Method::POST, &HeaderMap::new()),
            Admission::Declines
        );
        assert_eq!(matcher.rank(), 3);
        assert!(matcher.is_conditional());
        let any = Matcher::new(vec![], vec![]);
        assert!(!any.is_conditional());
        assert_eq!(any.rank(), 0);
        assert_eq!(Matcher::new(vec![Method::PUT], vec![]).rank(), 1);
    }
}
