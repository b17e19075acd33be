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

/// A `[server]` table on ephemeral loopback ports, with `keys` (whole lines) added to it.
pub(crate) fn server_table(keys: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{keys}")
}

/// Starts wharf from a TOML document (listen/admin_listen default to port 0).
pub(crate) async fn start_wharf(toml: &str) -> RunningHost {
    let text = if toml.contains("[server]") {
        toml.to_owned()
    } else {
        format!("{}{toml}", server_table(""))
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

/// Writes `toml` to `wharf.toml` in a fresh directory named after the test (and this
/// process), for the built binary to read; returns the file's path.
pub(crate) fn config_file(test: &str, toml: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wharf-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wharf.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Removes the directory `config_file` made for `path`.
pub(crate) fn remove_config_file(path: &std::path::Path) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The built `wharf serve` binary running with JSON logs. Dropped before [`WharfProcess::wait`]
/// (a test that failed on the way), it kills the process: no wharf outlives its test.
pub(crate) struct WharfProcess {
    /// `None` once [`WharfProcess::wait`] took it.
    child: Option<std::process::Child>,
    /// The service listener's address, read from the "wharf listening" log line.
    pub(crate) addr: String,
    /// The admin listener's address, from the same line.
    pub(crate) admin: String,
    logs: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Drop for WharfProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl WharfProcess {
    /// Starts `wharf --log-format json serve --config PATH` and waits (bounded)
    /// for it to log its address.
    pub(crate) fn start(config: &std::path::Path) -> WharfProcess {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wharf"));
        command
            .args(["--log-format", "json", "serve", "--config"])
            .arg(config);
        Self::spawn(command)
    }

    /// Starts `wharf --log-format json serve` with the embedded default config, on
    /// ports of the system's choosing, and waits (bounded) for its address.
    pub(crate) fn start_embedded() -> WharfProcess {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wharf"));
        command.args([
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ]);
        Self::spawn(command)
    }

    /// As [`WharfProcess::start`], with the open-files limit (soft and hard) set to
    /// `open_files` by the shell that execs it (the same process id).
    pub(crate) fn start_with_open_files(config: &std::path::Path, open_files: u64) -> WharfProcess {
        let mut command = std::process::Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {open_files} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_wharf"))
            .args(["--log-format", "json", "serve", "--config"])
            .arg(config);
        Self::spawn(command)
    }

    /// Runs `command` (a `wharf serve`) with its stderr read here and waits (bounded) for
    /// its address.
    fn spawn(mut command: std::process::Command) -> WharfProcess {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let mut child = command
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let logs = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
                    if event["fields"]["message"] == "wharf listening" {
                        let field =
                            |name: &str| event["fields"][name].as_str().unwrap_or("").to_owned();
                        let _ = addr_tx.send((field("addr"), field("admin")));
                    }
                }
                lines.push(line);
            }
            lines
        });
        let (addr, admin) = addr_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("wharf logs its address");
        WharfProcess {
            child: Some(child),
            addr,
            admin,
            logs: Some(logs),
        }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child().id()
    }

    fn child(&self) -> &std::process::Child {
        self.child
            .as_ref()
            .expect("only `wait`, which consumes the process, takes the child")
    }

    /// `http://ADDR` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends a signal by name (`TERM`, `HUP`, …).
    pub(crate) fn signal(&self, name: &str) {
        send_signal(self.pid(), name);
    }

    /// Waits for the process to exit; returns its status and every log line.
    pub(crate) async fn wait(mut self) -> (std::process::ExitStatus, String) {
        let mut child = self
            .child
            .take()
            .expect("set until `wait` consumes the process");
        let logs = self
            .logs
            .take()
            .expect("set until `wait` consumes the process");
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        let logs = logs.join().unwrap().join("\n");
        (status, logs)
    }
}

/// Sends the signal `name` (`TERM`, `HUP`, …) to process `pid` with kill(1).
pub(crate) fn send_signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{name} {pid} failed");
}

/// An HTTP/1.1 server on 127.0.0.1:0 that answers every request with `body`
/// and counts the TCP connections it accepts (to check connection reuse).
pub(crate) async fn counting_server(
    body: &'static [u8],
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_request| async move {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(body)),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, accepted)
}

/// 2 MB of the testbed's pattern (`wharf_testbed::expected_body`: a 251-byte period, so a
/// chunk relayed out of place shows), for the large-body tests.
pub(crate) fn large_patterned_body() -> &'static [u8] {
    Vec::leak(wharf_testbed::expected_body(2_000_000))
}

/// Asserts that a relayed body is `expected` byte for byte: its length first, so that a
/// short body says so without printing megabytes.
pub(crate) fn assert_body_is(received: &[u8], expected: &[u8], what: &str) {
    assert_eq!(received.len(), expected.len(), "{what}: the body's length");
    assert!(received == expected, "{what}: the body's bytes");
}

/// The value of the sample `series` (name and labels) in a Prometheus text page.
pub(crate) fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line[series.len()..].trim().parse().ok())
}
