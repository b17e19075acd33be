//! Starting wharf and the testbed for a test.

use wharf_config::Config;
pub(crate) use wharf_test_support::*;

/// A testbed and a wharf whose `proxy` service may fetch from it.
pub(crate) struct Stack {
    pub(crate) testbed: TestbedHandle,
    pub(crate) wharf: RunningHost,
}

impl Stack {
    /// The proxy URL for `path` on the testbed, with `cacheDuration`.
    pub(crate) fn proxy_url(&self, path: &str, cache_duration: Option<u64>) -> String {
        let target = encode(&self.testbed.url(path));
        match cache_duration {
            Some(seconds) => self
                .wharf
                .url(&format!("/proxy?url={target}&cacheDuration={seconds}")),
            None => self.wharf.url(&format!("/proxy?url={target}")),
        }
    }
}

/// Starts wharf from a TOML document (listen/admin_listen default to port 0).
pub(crate) async fn start_wharf(toml: &str) -> RunningHost {
    let text = if toml.contains("[server]") {
        toml.to_owned()
    } else {
        format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{toml}")
    };
    let config = Config::from_toml_str(&text, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    spawn_host(wharf::build_host(&config).unwrap()).await
}

/// A testbed plus a proxy at /proxy allowed to reach it; `extra` adds keys
/// to the proxy's table.
pub(crate) async fn stack(extra: &str) -> Stack {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let wharf = start_wharf(&format!(
        "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\nallow_hosts = [\"127.0.0.1:{}\"]\n{extra}\n",
        testbed.addr().port()
    ))
    .await;
    Stack { testbed, wharf }
}
