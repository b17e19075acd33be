//! `[telemetry]` as a user sets it up: the built binary exporting its `call` spans to a fake
//! OTLP/HTTP collector, the log format from the config or the flag, and `wharf check`
//! refusing bad telemetry keys.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::support::*;

/// Longest wait for the binary to start, to exit, or for an export to arrive.
const LIMIT: Duration = Duration::from_secs(30);

/// One request the fake collector received.
#[derive(Debug, Clone)]
struct Export {
    method: String,
    path: String,
    content_type: String,
    body: Bytes,
}

impl Export {
    fn contains(&self, needle: &[u8]) -> bool {
        self.body.windows(needle.len()).any(|w| w == needle)
    }
}

/// A fake OTLP/HTTP collector on 127.0.0.1:0 that records every request and answers 200
/// with an empty (valid) `ExportTraceServiceResponse`.
struct Collector {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Export>>>,
}

impl Collector {
    async fn spawn() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let store = received.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let store = store.clone();
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let store = store.clone();
                            async move {
                                let method = request.method().to_string();
                                let path = request.uri().path().to_owned();
                                let content_type = request
                                    .headers()
                                    .get(http::header::CONTENT_TYPE)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("")
                                    .to_owned();
                                let body = request.into_body().collect().await?.to_bytes();
                                store.lock().unwrap().push(Export {
                                    method,
                                    path,
                                    content_type,
                                    body,
                                });
                                let mut response = http::Response::new(Full::new(Bytes::new()));
                                response.headers_mut().insert(
                                    http::header::CONTENT_TYPE,
                                    http::HeaderValue::from_static("application/x-protobuf"),
                                );
                                Ok::<_, hyper::Error>(response)
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Collector { addr, received }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn received(&self) -> Vec<Export> {
        self.received.lock().unwrap().clone()
    }
}

/// The built binary running `serve`, with its stderr read line by line on a thread.
struct Wharf {
    child: Child,
    lines: Receiver<String>,
    log: Vec<String>,
}

impl Wharf {
    /// Runs `wharf [flags] serve --config FILE` with `RUST_LOG` unset.
    fn serve(config: &PathBuf, flags: &[&str]) -> Wharf {
        Self::serve_with_env(config, flags, &[])
    }

    /// As [`Wharf::serve`], with `env` added to the environment.
    fn serve_with_env(config: &PathBuf, flags: &[&str], env: &[(&str, String)]) -> Wharf {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
            .args(flags)
            .args(["serve", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Wharf {
            child,
            lines,
            log: Vec::new(),
        }
    }

    /// The first log line containing `needle`, waiting at most [`LIMIT`].
    fn wait_for_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no log line with {needle:?}:\n{}", self.log.join("\n")),
            }
        }
    }

    /// SIGTERM, then the exit status (bounded wait) and every log line.
    async fn terminate(mut self) -> (std::process::ExitStatus, String) {
        send_signal(self.child.id(), "TERM");
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("wharf did not exit after SIGTERM:\n{}", self.log.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // The pipe closes at exit, so this ends.
        self.log.extend(self.lines.iter());
        (status, self.log.join("\n"))
    }
}

/// A test that fails before [`Wharf::terminate`] leaves no wharf running behind it.
impl Drop for Wharf {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The value of `key=` in a pretty log line (`addr=127.0.0.1:8080`).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let start = line
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        + key.len()
        + 2;
    line[start..].split_whitespace().next().unwrap_or_default()
}

const LISTENERS: &str = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n";
const PROXY: &str = "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n";

#[tokio::test]
async fn call_spans_are_exported_over_otlp_http() {
    let collector = Collector::spawn().await;
    let config = config_file(
        "telemetry-export",
        &format!(
            "{LISTENERS}{PROXY}\n[telemetry]\notlp_endpoint = \"{}\"\nservice_name = \"wharf-telemetry-test\"\n",
            collector.endpoint()
        ),
    );
    let mut wharf = Wharf::serve(&config, &[]);
    let listening = wharf.wait_for_line("wharf listening");
    let addr = field(&listening, "addr");
    // A call that needs no origin: no `url` → 400, still a whole `call` span.
    let response = get(&format!("http://{addr}/proxy")).await;
    assert_eq!(response.status, 400, "{:?}", response.body);

    let (status, log) = wharf.terminate().await;
    assert!(status.success(), "exit {status:?}\n{log}");
    // The guard flushes before exit, so the export has arrived; poll anyway, bounded.
    let exported = poll_until(LIMIT, || async {
        collector
            .received()
            .iter()
            .any(|e| e.contains(b"call") && e.contains(b"wharf-telemetry-test"))
    })
    .await;
    let received = collector.received();
    assert!(
        exported,
        "no export with the call span: {received:?}\n{log}"
    );
    let export = received
        .iter()
        .find(|e| e.contains(b"call") && e.contains(b"wharf-telemetry-test"))
        .unwrap();
    assert_eq!(export.method, "POST");
    assert_eq!(export.path, "/v1/traces");
    assert_eq!(export.content_type, "application/x-protobuf");
    // Phase events are debug-level, below log_level ("info"), and exported all the same.
    assert!(export.contains(b"phase"), "{export:?}");
    assert!(
        !log.contains(" phase "),
        "phase events are not logged at info:\n{log}"
    );
}

/// Every phase event is logged inside its call's span, the host's own
/// (`queued`, `processing`, `body`) too, and every call passes `queued`.
#[tokio::test]
async fn phase_events_are_inside_the_call_span() {
    let config = config_file(
        "telemetry-phases",
        &format!("{LISTENERS}{PROXY}\n[telemetry]\nlog_level = \"info,wharf_host::call=debug\"\n"),
    );
    let mut wharf = Wharf::serve(&config, &["--log-format", "pretty"]);
    let listening = wharf.wait_for_line("wharf listening");
    let addr = field(&listening, "addr");
    // Answered at once (no `url`): the ready path, which skips the service's future.
    assert_eq!(get(&format!("http://{addr}/proxy")).await.status, 400);
    wharf.wait_for_line("target=/proxy}: wharf_host::call: phase phase=\"body_done\"");
    let (status, log) = wharf.terminate().await;
    assert!(status.success(), "exit {status:?}\n{log}");
    let phases: Vec<&str> = log
        .lines()
        .filter(|line| line.contains(" phase phase="))
        .collect();
    for line in &phases {
        assert!(
            line.contains("call{call_id="),
            "a phase outside its call span: {line}"
        );
    }
    // The start-up warm-up's calls (service warm-up-proxy) are left out.
    let names: Vec<&str> = phases
        .iter()
        .filter(|line| line.contains(" service=proxy "))
        .map(|line| field(line, "phase"))
        .collect();
    assert_eq!(
        names,
        ["\"queued\"", "\"processing\"", "\"body\"", "\"body_done\""],
        "{log}"
    );
}

#[tokio::test]
async fn log_format_comes_from_the_config_unless_the_flag_says_otherwise() {
    let config = config_file(
        "telemetry-format",
        &format!("{LISTENERS}{PROXY}\n[telemetry]\nlog_format = \"json\"\n"),
    );

    let mut wharf = Wharf::serve(&config, &[]);
    let line = wharf.wait_for_line("wharf listening");
    let event: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
    assert!(event["fields"]["addr"].is_string(), "{event}");
    let (status, log) = wharf.terminate().await;
    assert!(status.success(), "exit {status:?}\n{log}");

    let mut wharf = Wharf::serve(&config, &["--log-format", "pretty"]);
    let line = wharf.wait_for_line("wharf listening");
    assert!(
        serde_json::from_str::<serde_json::Value>(&line).is_err(),
        "{line}"
    );
    assert!(field(&line, "addr").starts_with("127.0.0.1:"), "{line}");
    let (status, log) = wharf.terminate().await;
    assert!(status.success(), "exit {status:?}\n{log}");
}

/// `wharf check FILE`: (success, stdout + stderr).
fn check(test: &str, toml: &str) -> (bool, String) {
    let path = config_file(&format!("telemetry-check-{test}"), toml);
    let output = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn check_refuses_a_bad_otlp_endpoint_or_sample_ratio_naming_the_key() {
    let cases = [
        (
            "endpoint",
            "[telemetry]\notlp_endpoint = \"127.0.0.1:4318\"\n",
            "wharf.toml:2: telemetry.otlp_endpoint: \"127.0.0.1:4318\" is not a URL",
        ),
        (
            "scheme",
            "[telemetry]\nservice_name = \"w\"\notlp_endpoint = \"grpc://127.0.0.1:4317\"\n",
            "wharf.toml:3: telemetry.otlp_endpoint: \"grpc://127.0.0.1:4317\": unsupported scheme",
        ),
        (
            "ratio",
            "[telemetry]\nsample_ratio = 1.5\n",
            "wharf.toml:2: telemetry.sample_ratio: 1.5 is out of range",
        ),
        (
            "level",
            "[telemetry]\nlog_level = \"wharf=chatty\"\n",
            "wharf.toml:2: telemetry.log_level: \"wharf=chatty\" is not a log level",
        ),
    ];
    for (test, toml, want) in cases {
        let (ok, text) = check(test, toml);
        assert!(!ok, "{toml:?} was accepted: {text}");
        assert!(text.contains(want), "{toml:?}\n got: {text}\nwant: {want}");
    }
    let (ok, text) = check(
        "good",
        "[telemetry]\notlp_endpoint = \"https://collector.example:4318\"\nsample_ratio = 0.5\nlog_format = \"json\"\n",
    );
    assert!(ok, "{text}");
}

/// The proxy variables other clients honour change nothing (SPEC §3: none is
/// honoured silently), and each one set is named in a warning at start.
#[tokio::test]
async fn proxy_environment_variables_are_ignored_and_said_to_be() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    // Where a client honouring the variables would connect instead.
    let decoy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let decoy_url = format!("http://{}", decoy.local_addr().unwrap());
    let config = config_file(
        "telemetry-proxy-env",
        &format!("{LISTENERS}{PROXY}allow_private_networks = true\n"),
    );
    let env = [
        ("HTTP_PROXY", decoy_url.clone()),
        ("https_proxy", decoy_url.clone()),
        ("ALL_PROXY", decoy_url),
    ];
    let mut wharf = Wharf::serve_with_env(&config, &[], &env);
    let listening = wharf.wait_for_line("wharf listening");
    let addr = field(&listening, "addr");
    let target = encode(&testbed.url("/fast"));
    let response = get(&format!("http://{addr}/proxy?url={target}")).await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    assert_eq!(testbed.hits("/fast"), 1);
    let decoy_used = tokio::time::timeout(Duration::from_millis(50), decoy.accept()).await;
    assert!(decoy_used.is_err(), "a proxy variable was honoured");
    let (status, log) = wharf.terminate().await;
    assert!(status.success(), "exit {status:?}\n{log}");
    for (name, _) in &env {
        assert!(
            log.contains(&format!("{name} is set and ignored")),
            "{name}:\n{log}"
        );
    }
}
