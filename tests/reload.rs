//! Live reload: services, routes and limits swapped under load with zero
//! failed calls; an invalid config refused with the reason, the old one
//! kept; unchanged services keep their state.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf::{assemble, ConfigReloader, ServerOverrides};
use wharf_config::Config;

use crate::support::*;

fn config_text(testbed: &TestbedHandle, version: &str) -> String {
    format!(
        "{}\n\
         [services.echo]\ntype = \"route\"\npath_prefix = \"/echo\"\nbackends = [\"http://{addr}\"]\n\
         set_headers = {{ \"x-version\" = \"{version}\" }}\n\n\
         [services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\n",
        server_table(""),
        addr = testbed.addr()
    )
}

struct Reloadable {
    wharf: RunningHost,
    reloader: Arc<ConfigReloader>,
    path: PathBuf,
}

async fn start(testbed: &TestbedHandle, name: &str) -> Reloadable {
    let dir = std::env::temp_dir().join(format!("wharf-reload-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wharf.toml");
    std::fs::write(&path, config_text(testbed, "1")).unwrap();
    let config = Config::load(&path).unwrap();
    let (builder, catalogue) = assemble(&config).unwrap();
    let host = builder.bind().await.unwrap();
    let reloader = ConfigReloader::new(
        path.clone(),
        &config,
        catalogue,
        host.reloader(),
        ServerOverrides::default(),
    );
    assert!(host.on_reload(reloader.hook()));
    Reloadable {
        wharf: spawn_bound(host),
        reloader,
        path,
    }
}

async fn version_seen(wharf: &RunningHost) -> String {
    version_at(&wharf.url("/echo")).await
}

/// The `x-version` header the backend saw for a call to `url`.
async fn version_at(url: &str) -> String {
    let echo = get(url).await.json();
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pair| pair[0] == "x-version")
        .map(|pair| pair[1].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn reload_under_load_fails_no_call() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let stack = start(&testbed, "load").await;
    assert_eq!(version_seen(&stack.wharf).await, "1");

    let failures = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_millis(1500);
    let load: Vec<_> = (0..4)
        .map(|_| {
            let url = stack.wharf.url("/echo");
            let (failures, calls) = (failures.clone(), calls.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let response = get(&url).await;
                    calls.fetch_add(1, Ordering::Relaxed);
                    if response.status != 200 || response.body.is_err() {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for version in ["2", "3", "4", "5", "6"] {
        std::fs::write(&stack.path, config_text(&testbed, version)).unwrap();
        let summary = stack.reloader.reload().await.unwrap();
        assert!(summary.contains("built [\"echo\"]"), "{summary}");
        assert!(summary.contains("kept [\"proxy\"]"), "{summary}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for task in load {
        task.await.unwrap();
    }
    assert!(
        calls.load(Ordering::Relaxed) > 20,
        "too little load to mean anything"
    );
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "calls failed during reloads"
    );
    assert_eq!(version_seen(&stack.wharf).await, "6");
}

#[tokio::test]
async fn invalid_reload_is_refused_and_the_old_config_stays() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let stack = start(&testbed, "invalid").await;
    std::fs::write(
        &stack.path,
        config_text(&testbed, "2").replace(
            "path_prefix = \"/echo\"",
            "path_prefix = \"/echo\"\ntimeout = \"soon\"",
        ),
    )
    .unwrap();
    let refused = stack.reloader.reload().await.unwrap_err();
    assert!(refused.contains("wharf.toml:"), "{refused}");
    assert!(refused.contains("timeout"), "{refused}");
    assert_eq!(
        version_seen(&stack.wharf).await,
        "1",
        "the refused config was applied"
    );

    // The same through the admin endpoint.
    let response = send(
        "POST",
        &stack.wharf.admin_url("/reload"),
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(response.status, 400);
    assert_eq!(response.json()["error"], "invalid_config");
    std::fs::write(&stack.path, config_text(&testbed, "7")).unwrap();
    let response = send(
        "POST",
        &stack.wharf.admin_url("/reload"),
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    assert_eq!(version_seen(&stack.wharf).await, "7");

    // Reloading takes POST; a GET is told which method to use.
    let response = get(&stack.wharf.admin_url("/reload")).await;
    assert_eq!(response.status, 405);
    assert_eq!(response.header("allow"), "POST");
    assert_eq!(version_seen(&stack.wharf).await, "7");
}

#[tokio::test]
async fn an_unchanged_proxy_keeps_its_cache_across_reloads() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let stack = start(&testbed, "cache").await;
    let url = stack.wharf.url(&format!(
        "/proxy?url={}&cacheDuration=60",
        encode(&testbed.url("/bytes/100"))
    ));
    assert_eq!(get(&url).await.header("x-cache"), "miss");
    std::fs::write(&stack.path, config_text(&testbed, "2")).unwrap();
    stack.reloader.reload().await.unwrap();
    assert_eq!(get(&url).await.header("x-cache"), "hit");
    assert_eq!(testbed.hits("/bytes/100"), 1);
}

#[tokio::test]
async fn sighup_reloads_the_running_binary_and_refuses_a_broken_file() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("wharf-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wharf.toml");
    std::fs::write(&path, config_text(&testbed, "1")).unwrap();
    let wharf = WharfProcess::start(&path);
    let version = |wharf: &WharfProcess| {
        let url = wharf.url("/echo");
        async move { version_at(&url).await }
    };
    assert_eq!(version(&wharf).await, "1");
    std::fs::write(&path, config_text(&testbed, "2")).unwrap();
    wharf.signal("HUP");
    assert!(
        poll_until(Duration::from_secs(10), || async {
            version(&wharf).await == "2"
        })
        .await,
        "SIGHUP did not apply the new config"
    );
    // A broken file, under load: refused, and no call fails meanwhile.
    let failures = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_millis(800);
    let load: Vec<_> = (0..4)
        .map(|_| {
            let url = wharf.url("/echo");
            let failures = failures.clone();
            tokio::spawn(async move {
                while Instant::now() < until {
                    let response = get(&url).await;
                    if response.status != 200 || response.body.is_err() {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::fs::write(&path, "[services.broken\n").unwrap();
    wharf.signal("HUP");
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "calls failed around a refused reload"
    );
    assert_eq!(
        version(&wharf).await,
        "2",
        "a broken file replaced the running config"
    );
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "{logs}");
    assert!(logs.contains("reload refused"), "{logs}");
}

/// SIGHUP is "reload the config file" (log rotators send it too): without a
/// file it is logged and ignored, never the default action that ends the process.
#[tokio::test]
async fn sighup_without_a_config_file_is_ignored() {
    let wharf = WharfProcess::start_embedded();
    wharf.signal("HUP");
    // Still serving (the default action would have ended it at delivery).
    assert_eq!(get(&wharf.url("/nothing")).await.status, 404);
    wharf.signal("TERM");
    let (status, logs) = wharf.wait().await;
    assert!(status.success(), "ended by SIGHUP? {status:?} {logs}");
    assert!(logs.contains("nothing to reload"), "{logs}");
}
