//! Which requests a route takes: its methods and `match_headers` (the
//! host already matched the path prefix on whole segments).

use http::{HeaderName, HeaderValue, Method, Request};

use crate::error::RouteError;

/// Method and header conditions of one route.
#[derive(Debug, Clone)]
pub struct Matcher {
    methods: Vec<Method>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Matcher {
    /// `methods` empty means any method; every header must be present and
    /// equal (names are case-insensitive by construction, values exact).
    pub fn new(methods: Vec<Method>, headers: Vec<(HeaderName, HeaderValue)>) -> Self {
        Self { methods, headers }
    }

    /// Whether the route takes `request`, or why not.
    pub fn check<B>(&self, request: &Request<B>) -> Result<(), RouteError> {
        if !self.methods.is_empty() && !self.methods.contains(request.method()) {
            return Err(RouteError::Method {
                method: request.method().clone(),
                allowed: self.allowed(),
            });
        }
        for (name, expected) in &self.headers {
            if request.headers().get(name) != Some(expected) {
                return Err(RouteError::HeaderMismatch(name.to_string()));
            }
        }
        Ok(())
    }

    /// The allowed methods, for the `allow` header of a 405.
    pub fn allowed(&self) -> String {
        self.methods
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ")
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
        assert!(matcher.check(&request(Method::POST, None)).is_err());
        assert!(Matcher::new(vec![], vec![])
            .check(&request(Method::PATCH, None))
            .is_ok());
    }
}
