//! Which service a request goes to: exact paths first, then the longest
//! prefix that matches on whole path segments.

use foldhash::HashMap;

use crate::service::HostService;

/// Which request paths reach a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// Exactly this path (the query is ignored), e.g. the proxy's `/proxy`.
    Exact(String),
    /// This path and everything below it on segment boundaries: `/orders`
    /// matches `/orders` and `/orders/7`, never `/ordersX`.
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

/// A service with its name, as dispatched to.
#[derive(Clone)]
pub(crate) struct Mounted {
    pub(crate) name: String,
    pub(crate) service: HostService,
}

/// The services of a host, looked up by path.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    exact: HashMap<String, Mounted>,
    /// Sorted longest prefix first, so the most specific mount wins.
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
                self.prefixes
                    .sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
            }
        }
    }

    pub(crate) fn find(&self, path: &str) -> Option<&Mounted> {
        if let Some(mounted) = self.exact.get(path) {
            return Some(mounted);
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| matches_prefix(prefix, path))
            .map(|(_, mounted)| mounted)
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.exact
            .values()
            .chain(self.prefixes.iter().map(|(_, m)| m))
            .map(|m| m.name.as_str())
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
    use super::*;
    use crate::{body, handler};

    fn named(name: &str) -> Mounted {
        Mounted {
            name: name.into(),
            service: handler(|_| async { http::Response::new(body::empty()) }),
        }
    }

    #[test]
    fn exact_then_longest_prefix_on_segment_boundaries() {
        let mut registry = Registry::default();
        registry.insert(Mount::Exact("/proxy".into()), named("proxy"));
        registry.insert(Mount::Prefix("/orders".into()), named("orders"));
        registry.insert(Mount::Prefix("/orders/eu/".into()), named("eu"));
        registry.insert(Mount::Prefix("/".into()), named("root"));
        let find = |path: &str| registry.find(path).map(|m| m.name.clone());
        assert_eq!(find("/proxy").as_deref(), Some("proxy"));
        assert_eq!(find("/proxy/x").as_deref(), Some("root"));
        assert_eq!(find("/orders").as_deref(), Some("orders"));
        assert_eq!(find("/orders/7").as_deref(), Some("orders"));
        assert_eq!(find("/ordersX").as_deref(), Some("root"));
        assert_eq!(find("/orders/eu/1").as_deref(), Some("eu"));
        assert_eq!(find("/orders/europe").as_deref(), Some("orders"));
    }

    #[test]
    fn nothing_matches_without_a_root_mount() {
        let mut registry = Registry::default();
        registry.insert(Mount::Prefix("/a".into()), named("a"));
        assert!(registry.find("/b").is_none());
        assert!(registry.find("/").is_none());
    }
}
