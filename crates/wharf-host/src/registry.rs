//! Which service a request goes to: exact paths first, then the longest
//! prefix that matches on whole path segments, and among the services sharing
//! that prefix, the first whose conditions (a route's `methods` and
//! `match_headers`) take the request.

use std::sync::Arc;

use foldhash::HashMap;
use http::{HeaderMap, Method};

use crate::service::HostService;

/// Which request paths reach a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// Exactly this path (the query is ignored), e.g. the proxy's `/proxy`.
    Exact(String),
    /// This path and everything below it on segment boundaries: `/orders`
    /// matches `/orders` and `/orders/7`, never `/ordersX`. The longest prefix that
    /// matches a path takes the request.
    ///
    /// Several services may share a prefix when they take only some requests
    /// ([`HostService::taking_only`]). A request goes to the first of them that takes it:
    /// the services with the higher [`RequestFilter::rank`] first, then in the order they
    /// were mounted. When none takes it, the first service whose conditions fail only on
    /// the method answers (its 405 names its methods), else the first (its 404). A request
    /// never goes on to a shorter prefix: conditions that fail under `/admin` do not send
    /// the request to a `/` catch-all.
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

    /// The methods it takes; empty for any. A 405 answered for services sharing a prefix
    /// lists those of every service whose other conditions held ([`AllowedMethods`]).
    fn methods(&self) -> &[Method];
}

/// Set on a request that no service sharing its prefix takes only because of its method:
/// every method one of them would take it with, in the order they are asked, for the
/// `allow` field of the 405 the chosen one answers (RFC 9110 §15.5.6: all the methods the
/// target supports, not one service's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedMethods(pub Vec<Method>);

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
    /// The first of these services that takes the request, judged from its head.
    FirstTaking(&'a Arc<[HostService]>),
}

/// The services sharing one prefix.
#[derive(Clone)]
struct PrefixMount {
    /// Without a trailing slash; "" for the root.
    prefix: String,
    /// The higher rank first, then in the order mounted: the order they are asked in.
    mounted: Vec<Mounted>,
    /// Their services in that order, when there are several: shared by every call that
    /// has to choose, so that a choice allocates nothing.
    choice: Arc<[HostService]>,
}

/// The services of a host, looked up by path.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    exact: HashMap<String, Mounted>,
    /// Longest prefix first, so the most specific mount wins.
    prefixes: Vec<PrefixMount>,
}

impl Registry {
    pub(crate) fn insert(&mut self, mount: Mount, mounted: Mounted) {
        match mount {
            Mount::Exact(path) => {
                self.exact.insert(path, mounted);
            }
            Mount::Prefix(prefix) => {
                let prefix = prefix.trim_end_matches('/').to_owned();
                let at = match self.prefixes.iter().position(|p| p.prefix == prefix) {
                    Some(at) => at,
                    None => {
                        // After every longer or equally long prefix.
                        let at = self
                            .prefixes
                            .partition_point(|p| p.prefix.len() >= prefix.len());
                        let group = PrefixMount {
                            prefix,
                            mounted: Vec::new(),
                            choice: Arc::new([]),
                        };
                        self.prefixes.insert(at, group);
                        at
                    }
                };
                let group = &mut self.prefixes[at];
                group.mounted.push(mounted);
                // Stable: equal ranks keep the order they were mounted in.
                group.mounted.sort_by_key(|mounted| {
                    std::cmp::Reverse(mounted.service.filter().map_or(0, |f| f.rank()))
                });
                group.choice = if group.mounted.len() > 1 {
                    group.mounted.iter().map(|m| m.service.clone()).collect()
                } else {
                    Arc::new([])
                };
            }
        }
    }

    pub(crate) fn find(&self, path: &str) -> Option<Found<'_>> {
        if let Some(mounted) = self.exact.get(path) {
            return Some(Found::One(mounted));
        }
        let group = self
            .prefixes
            .iter()
            .find(|group| matches_prefix(&group.prefix, path))?;
        match group.mounted.as_slice() {
            // The common case: one service under its prefix, which answers whatever its
            // own conditions say (its own 404 or 405).
            [one] => Some(Found::One(one)),
            _ => Some(Found::FirstTaking(&group.choice)),
        }
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.exact
            .values()
            .chain(self.prefixes.iter().flat_map(|p| &p.mounted))
            .map(|m| m.name.as_str())
    }
}

/// The service that answers a request, chosen by [`first_taking`].
pub(crate) enum Choice<'a> {
    /// The first that takes it.
    Takes(&'a HostService),
    /// None takes it, but these methods would have been taken: the first service that
    /// failed only on the method answers (its 405), listing them.
    WrongMethod(&'a HostService, AllowedMethods),
    /// None takes it with any method: the first answers (its 404).
    First(&'a HostService),
}

/// Of services that may take a request, the one that answers it: the first that takes
/// it; else the first that fails only on its method (for its 405), with the methods all
/// of those take; else the first. `None` when there are no candidates.
pub(crate) fn first_taking<'a>(
    candidates: &'a [HostService],
    method: &Method,
    headers: &HeaderMap,
) -> Option<Choice<'a>> {
    let mut wrong_method: Option<(&HostService, Vec<Method>)> = None;
    for service in candidates {
        let Some(filter) = service.filter() else {
            return Some(Choice::Takes(service));
        };
        match filter.admits(method, headers) {
            Admission::Takes => return Some(Choice::Takes(service)),
            Admission::WrongMethod => {
                let (_, allowed) = wrong_method.get_or_insert((service, Vec::new()));
                for method in filter.methods() {
                    if !allowed.contains(method) {
                        allowed.push(method.clone());
                    }
                }
            }
            Admission::Declines => {}
        }
    }
    match wrong_method {
        Some((service, allowed)) => Some(Choice::WrongMethod(service, AllowedMethods(allowed))),
        None => candidates.first().map(Choice::First),
    }
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

        fn methods(&self) -> &[Method] {
            &self.methods
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
            Some(Found::FirstTaking(services)) => {
                services.iter().map(|s| name_of(registry, s)).collect()
            }
        }
    }

    /// The name `service` was mounted under.
    fn name_of(registry: &Registry, service: &HostService) -> String {
        registry
            .prefixes
            .iter()
            .flat_map(|p| &p.mounted)
            .find(|m| m.service.is(service))
            .map(|m| m.name.clone())
            .unwrap_or_default()
    }

    /// The name of the service that answers a request to `path`.
    fn chosen(
        registry: &Registry,
        path: &str,
        method: Method,
        tenant: Option<&'static str>,
    ) -> String {
        let mut headers = HeaderMap::new();
        if let Some(tenant) = tenant {
            headers.insert(
                HeaderName::from_static("x-tenant"),
                HeaderValue::from_static(tenant),
            );
        }
        match registry.find(path) {
            Some(Found::One(m)) => m.name.clone(),
            Some(Found::FirstTaking(services)) => match first_taking(services, &method, &headers) {
                Some(Choice::Takes(s) | Choice::WrongMethod(s, _) | Choice::First(s)) => {
                    name_of(registry, s)
                }
                None => String::new(),
            },
            None => String::new(),
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
    fn services_sharing_a_prefix_are_asked_by_rank_then_mount_order() {
        let mut registry = Registry::default();
        registry.insert(Mount::Prefix("/".into()), named("root"));
        registry.insert(Mount::Prefix("/orders".into()), named("orders-any"));
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("acme", "acme", vec![]),
        );
        registry.insert(
            Mount::Prefix("/orders/".into()),
            for_tenant("beta-get", "beta", vec![Method::GET]),
        );
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("beta", "beta", vec![]),
        );
        registry.insert(Mount::Prefix("/a".into()), named("a"));
        assert_eq!(
            candidates(&registry, "/orders/1"),
            ["beta-get", "acme", "beta", "orders-any"]
        );
        assert_eq!(candidates(&registry, "/other"), ["root"]);
        assert_eq!(candidates(&registry, "/a/b"), ["a"]);
        assert_eq!(registry.names().count(), 6);
    }

    #[test]
    fn a_request_goes_to_the_first_taker_else_a_wrong_method_else_the_first() {
        let mut registry = Registry::default();
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("beta", "beta", vec![]),
        );
        registry.insert(
            Mount::Prefix("/orders".into()),
            for_tenant("acme-get", "acme", vec![Method::GET]),
        );
        registry.insert(Mount::Prefix("/".into()), named("root"));
        let chosen = |method, tenant| chosen(&registry, "/orders", method, tenant);
        assert_eq!(chosen(Method::GET, Some("acme")), "acme-get");
        assert_eq!(chosen(Method::POST, Some("beta")), "beta");
        // Only the method failed: that route's 405.
        assert_eq!(chosen(Method::POST, Some("acme")), "acme-get");
        let Some(Found::FirstTaking(services)) = registry.find("/orders") else {
            panic!("a choice");
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", HeaderValue::from_static("acme"));
        let Some(Choice::WrongMethod(_, allowed)) = first_taking(services, &Method::POST, &headers)
        else {
            panic!("a wrong method");
        };
        assert_eq!(allowed, AllowedMethods(vec![Method::GET]));
        // Nothing matched: the first route's 404, never the shorter prefix's catch-all.
        assert_eq!(chosen(Method::POST, Some("zeta")), "acme-get");
        assert_eq!(chosen(Method::GET, None), "acme-get");
    }
}
