//! Which service a request goes to: exact paths first, then the longest
//! prefix that matches on whole path segments, and among the services under
//! prefixes, the first whose conditions (a route's `methods` and
//! `match_headers`) take the request.

use foldhash::HashMap;
use http::{HeaderMap, Method};

use crate::service::HostService;

/// Which request paths reach a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// Exactly this path (the query is ignored), e.g. the proxy's `/proxy`.
    Exact(String),
    /// This path and everything below it on segment boundaries: `/orders`
    /// matches `/orders` and `/orders/7`, never `/ordersX`.
    ///
    /// Several services may share a prefix when they take only some requests
    /// ([`HostService::taking_only`]). A request goes to the first that takes it, trying
    /// longer prefixes first, then under one prefix the services with the higher
    /// [`RequestFilter::rank`], then the order they were mounted in. When none takes it,
    /// the first service whose conditions fail only on the method answers (its 405 names
    /// its methods), else the first candidate (its 404).
    Prefix(String),
}

impl Mount {
    /// The configured path of the mount.
    pub fn path(&self) -> &str {
        match self {
            Mount::Exact(path) | Mount::Prefix(path) => path,
        }
    }
}

/// Which requests under its mount a service takes, judged from the request's method and
/// header fields once its head has been read.
pub trait RequestFilter: Send + Sync + 'static {
    /// Whether the service takes a request with this method and these header fields.
    fn admits(&self, method: &Method, headers: &HeaderMap) -> Admission;

    /// How specific the conditions are: under one prefix, a service of a higher rank is
    /// asked first (so that a route for `x-tenant: acme` is tried before a catch-all).
    fn rank(&self) -> usize;
}

/// A [`RequestFilter`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The service takes the request.
    Takes,
    /// Everything but the method matched: this service's answer, a 405 with its methods,
    /// is the one to give if no other service takes the request.
    WrongMethod,
    /// The service does not take the request.
    Declines,
}

/// A service with its name, as dispatched to.
#[derive(Clone)]
pub(crate) struct Mounted {
    pub(crate) name: String,
    pub(crate) service: HostService,
}

/// What a path leads to.
pub(crate) enum Found<'a> {
    /// This service, whatever the rest of the request.
    One(&'a Mounted),
    /// The first of these that takes the request, judged from its head (the last one
    /// takes every request, or all have filters).
    FirstTaking(Vec<&'a Mounted>),
}

/// The services of a host, looked up by path.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    exact: HashMap<String, Mounted>,
    /// Longest prefix first, so the most specific mount wins; under one prefix, the
    /// higher rank first, then in the order mounted.
    prefixes: Vec<(String, Mounted)>,
}

impl Registry {
    pub(crate) fn insert(&mut self, mount: Mount, mounted: Mounted) {
        match mount {
            Mount::Exact(path) => {
                self.exact.insert(path, mounted);
            }
            Mount::Prefix(prefix) => {
                let prefix = prefix.trim_end_matches('/').to_owned();
                self.prefixes.push((prefix, mounted));
                // Stable: equal keys keep the order they were mounted in.
                self.prefixes.sort_by_key(|(prefix, mounted)| {
                    let rank = mounted.service.filter().map_or(0, |f| f.rank());
                    std::cmp::Reverse((prefix.len(), rank))
                });
            }
        }
    }

    pub(crate) fn find(&self, path: &str) -> Option<Found<'_>> {
        if let Some(mounted) = self.exact.get(path) {
            return Some(Found::One(mounted));
        }
        let mut under = self
            .prefixes
            .iter()
            .filter(|(prefix, _)| matches_prefix(prefix, path))
            .map(|(_, mounted)| mounted);
        let first = under.next()?;
        if first.service.filter().is_none() {
            // The common case: one service takes everything under its prefix.
            return Some(Found::One(first));
        }
        // A lone service answers whatever its filter says: its own 404 or 405.
        let second = under.next();
        let Some(second) = second else {
            return Some(Found::One(first));
        };
        let mut candidates = vec![first, second];
        if second.service.filter().is_none() {
            return Some(Found::FirstTaking(candidates));
        }
        for mounted in under {
            candidates.push(mounted);
            if mounted.service.filter().is_none() {
                // It takes every request: nothing after it can be reached.
                break;
            }
        }
        Some(Found::FirstTaking(candidates))
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.exact
            .values()
            .chain(self.prefixes.iter().map(|(_, m)| m))
            .map(|m| m.name.as_str())
    }
}

/// Of services that may take a request, the one that answers it: the first that takes
/// it; else the first that fails only on its method (for its 405); else the first.
pub(crate) fn first_taking<'a>(
    candidates: &'a [HostService],
    method: &Method,
    headers: &HeaderMap,
) -> Option<&'a HostService> {
    let mut wrong_method = None;
    for service in candidates {
        match service
            .filter()
            .map_or(Admission::Takes, |f| f.admits(method, headers))
        {
            Admission::Takes => return Some(service),
            Admission::WrongMethod => {
                wrong_method.get_or_insert(service);
            }
            Admission::Declines => {}
        }
    }
    wrong_method.or(candidates.first())
}

/// `prefix` (without trailing slash; "" for the root) matches `path` on a
/// segment boundary.
fn matches_prefix(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::{HeaderName, HeaderValue};

    use super::*;
    use crate::{body, handler};

    fn named(name: &str) -> Mounted {
        Mounted {
            name: name.into(),
            service: handler(|_| async { http::Response::new(body::empty()) }),
        }
    }

    /// Takes requests with `x-tenant: <tenant>`, and the `methods` if any.
    struct Tenant {
        tenant: &'static str,
        methods: Vec<Method>,
    }

    impl RequestFilter for Tenant {
        fn admits(&self, method: &Method, headers: &HeaderMap) -> Admission {
            if headers.get("x-tenant").map(HeaderValue::as_bytes) != Some(self.tenant.as_bytes()) {
                Admission::Declines
            } else if !self.methods.is_empty() && !self.methods.contains(method) {
                Admission::WrongMethod
            } else {
                Admission::Takes
            }
        }

        fn rank(&self) -> usize {
            2 + usize::from(!self.methods.is_empty())
        }
    }

    fn for_tenant(name: &str, tenant: &'static str, methods: Vec<Method>) -> Mounted {
        let mut mounted = named(name);
        mounted.service = mounted
            .service
            .taking_only(Arc::new(Tenant { tenant, methods }));
        mounted
    }

    /// The names of the services a path may go to, in the order they are asked.
    fn candidates(registry: &Registry, path: &str) -> Vec<String> {
        match registry.find(path) {
            None => vec![],
            Some(Found::One(m)) => vec![m.name.clone()],
            Some(Found::FirstTaking(ms)) => ms.iter().map(|m| m.name.clone()).collect(),
        }
    }

    #[test]
    fn exact_then_longest_prefix_on_segment_boundaries() {
        let mut registry = Registry::default();
        registry.insert(Mount::Exact("/proxy".into()), named("proxy"));
        registry.insert(Mount::Prefix("/orders".into()), named("orders"));
        registry.insert(Mount::Prefix("/orders/eu/".into()), named("eu"));
        registry.insert(Mount::Prefix("/".into()), named("root"));
        let find = |path: &str| candidates(&registry, path);
        assert_eq!(find("/proxy"), ["proxy"]);
        assert_eq!(find("/proxy/x"), ["root"]);
        assert_eq!(find("/orders"), ["orders"]);
        assert_eq!(find("/orders/7"), ["orders"]);
        assert_eq!(find("/ordersX"), ["root"]);
        assert_eq!(find("/orders/eu/1"), ["eu"]);
        assert_eq!(find("/orders/europe"), ["orders"]);
    }

    #[test]
    fn nothing_matches_without_a_root_mount() {
        let mut registry = Registry::default();
        registry.insert(Mount::Prefix("/a".into()), named("a"));
        assert!(registry.find("/b").is_none());
        assert!(registry.find("/").is_none());
    }

    #[test]
    fn filtered_services_are_asked_by_rank_then_mount_order_down_to_a_catch_all() {
        let mut registry = Registry::default();
        registry.insert(Mount::Prefix("/".into()), named("root"));
        registry.insert(Mount::Prefix("/orders".into()), named("orders-any"));
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("acme", "acme", vec![]),
        );
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("beta-get", "beta", vec![Method::GET]),
        );
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("beta", "beta", vec![]),
        );
        // The catch-all under `/orders` ends the list: `/` cannot be reached from there.
        assert_eq!(
            candidates(&registry, "/orders/1"),
            ["beta-get", "acme", "beta", "orders-any"]
        );
        assert_eq!(candidates(&registry, "/other"), ["root"]);
    }

    #[test]
    fn a_request_goes_to_the_first_taker_else_a_wrong_method_else_the_first() {
        let mut registry = Registry::default();
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("acme-get", "acme", vec![Method::GET]),
        );
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("beta", "beta", vec![]),
        );
        registry.insert(Mount::Prefix("/".into()), named("root"));
        let Some(Found::FirstTaking(found)) = registry.find("/orders/1") else {
            panic!("filtered services give a choice");
        };
        assert_eq!(found.len(), 3, "down to the root's catch-all");
        let services: Vec<HostService> = found.iter().map(|m| m.service.clone()).collect();
        let name_of = |method: Method, tenant: Option<&'static str>| {
            let mut headers = HeaderMap::new();
            if let Some(tenant) = tenant {
                headers.insert(
                    HeaderName::from_static("x-tenant"),
                    HeaderValue::from_static(tenant),
                );
            }
            let chosen = first_taking(&services, &method, &headers).map(|s| s as *const _);
            found
                .iter()
                .zip(&services)
                .find(|(_, s)| Some(*s as *const _) == chosen)
                .map(|(m, _)| m.name.clone())
        };
        assert_eq!(
            name_of(Method::GET, Some("acme")).as_deref(),
            Some("acme-get")
        );
        assert_eq!(name_of(Method::POST, Some("beta")).as_deref(), Some("beta"));
        // No filter declines the root's catch-all.
        assert_eq!(name_of(Method::GET, None).as_deref(), Some("root"));

        // Without a catch-all: a method-only miss answers for its 405, else the first.
        let mut registry = Registry::default();
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("beta", "beta", vec![]),
        );
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("acme-get", "acme", vec![Method::GET]),
        );
        let Some(Found::FirstTaking(found)) = registry.find("/orders") else {
            panic!("filtered services give a choice");
        };
        let services: Vec<HostService> = found.iter().map(|m| m.service.clone()).collect();
        let chosen = |method: Method, tenant: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-tenant", HeaderValue::from_static(tenant));
            let chosen = first_taking(&services, &method, &headers).map(|s| s as *const _);
            services.iter().position(|s| Some(s as *const _) == chosen)
        };
        assert_eq!(found[0].name, "acme-get", "the higher rank first");
        assert_eq!(chosen(Method::POST, "acme"), Some(0));
        assert_eq!(chosen(Method::POST, "zeta"), Some(0));
        assert_eq!(chosen(Method::POST, "beta"), Some(1));
    }
}
