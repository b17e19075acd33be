//! What `wharf serve` warms up at start (seed 000; the mechanism is
//! [`wharf_host::warm_up`]): a twin of the config's first proxy and of its first route,
//! each fetching from a testbed of its own on loopback (`wharf_testbed`, the seeds'
//! backends) and nothing else.
//!
//! One twin per service type is enough: services of one type run the same code, and what
//! the warm-up is for is that code's first run (and the host's), not any service's state.
//! The proxy twin is called three times, for the paths a first client call can take:
//! pass-through, a cache fill, and a hit on what it filled. Queues have no twin (they
//! need their broker, which a warm-up must not write to).

use std::net::Ipv4Addr;

use url::Url;
use wharf_config::{Config, ServiceConfig, ServiceKind};
use wharf_host::{Mount, WarmUp};
use wharf_proxy::ProxyService;
use wharf_route::RouteService;
use wharf_testbed::TestbedHandle;

/// Cache duration of the proxy twin's fill and hit calls, in seconds (any non-zero value).
const TWIN_CACHE_SECONDS: u32 = 60;

/// The warm-up for `config`, and the testbed its twins fetch from (keep it until the
/// warm-up has run; dropping it stops it). With neither a proxy nor a route in the config,
/// or when the testbed cannot bind 127.0.0.1, the warm-up has no twins, only the host's own
/// call.
pub async fn plan(config: &Config) -> (WarmUp, Option<TestbedHandle>) {
    let mut warm = WarmUp::new();
    let proxy = first_of(config, |kind| match kind {
        ServiceKind::Proxy(proxy) => Some(proxy),
        _ => None,
    });
    let route = first_of(config, |kind| match kind {
        ServiceKind::Route(route) => Some(route),
        _ => None,
    });
    if proxy.is_none() && route.is_none() {
        return (warm, None);
    }
    let origin = match wharf_testbed::spawn((Ipv4Addr::LOCALHOST, 0).into()).await {
        Ok(origin) => origin,
        Err(error) => {
            tracing::debug!(error = %error, "no warm-up origin; services are not warmed up");
            return (warm, None);
        }
    };
    let origin_url = origin.url("");
    if let Some((service, proxy)) = proxy {
        let mut twin = proxy.clone();
        twin.allow_private_networks = true;
        twin.allow_hosts = vec![origin.addr().to_string()];
        twin.shared_cache = None;
        let built = ProxyService::with_shared_tier("warm-up", &twin, warm.metrics(), None);
        let target = format!("{}?url={origin_url}/bytes/1024&cacheDuration=", proxy.path);
        let call = |ttl: u32| format!("{target}{ttl}");
        // Pass-through beside fill-then-hit.
        let chains = [
            vec![call(0)],
            vec![call(TWIN_CACHE_SECONDS), call(TWIN_CACHE_SECONDS)],
        ];
        warm.mount(
            "warm-up-proxy",
            Mount::Exact(proxy.path.clone()),
            &service.limits,
            built.into_host_service(),
            chains,
        );
    }
    if let Some((service, route)) = route {
        let mut twin = route.clone();
        twin.methods.clear();
        twin.match_headers.clear();
        twin.strip_prefix = true;
        match Url::parse(&origin_url) {
            Ok(backend) => twin.backends = vec![backend],
            Err(error) => {
                tracing::debug!(error = %error, "no warm-up route: bad origin url");
                return (warm, Some(origin));
            }
        }
        match RouteService::new("warm-up", &twin, warm.metrics()) {
            Ok(built) => {
                // The testbed's `/fast`, once the twin has stripped the prefix.
                let path = format!("{}/fast", route.path_prefix.trim_end_matches('/'));
                warm.mount(
                    "warm-up-route",
                    Mount::Prefix(route.path_prefix.clone()),
                    &service.limits,
                    built.into_host_service(),
                    [[path]],
                );
            }
            Err(error) => tracing::debug!(error = %error, "no warm-up route"),
        }
    }
    (warm, Some(origin))
}

/// The first service of `config` whose type `pick` takes, with its type's table.
fn first_of<'a, T>(
    config: &'a Config,
    pick: impl Fn(&'a ServiceKind) -> Option<&'a T>,
) -> Option<(&'a ServiceConfig, &'a T)> {
    config
        .services
        .iter()
        .find_map(|service| pick(&service.kind).map(|table| (service, table)))
}
