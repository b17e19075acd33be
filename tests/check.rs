//! `wharf check` as a user runs it: the built binary on a file.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Writes `toml` to a `wharf.toml` of its own (tests run in parallel).
fn config_file(toml: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "wharf-check-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wharf.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

fn check(toml: &str) -> (bool, String) {
    let path = config_file(toml);
    let output = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    output_text(&output)
}

fn output_text(output: &Output) -> (bool, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn check_names_an_unknown_key_and_its_line() {
    let (ok, text) = check("[server]\nlisten = \"127.0.0.1:8080\"\n\n[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\ncache_max_byte = \"1MiB\"\n");
    assert!(!ok, "{text}");
    assert!(text.contains("cache_max_byte"), "{text}");
    assert!(text.contains("wharf.toml:7"), "{text}");
}

#[test]
fn check_names_a_bad_value() {
    let (ok, text) =
        check("[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nmax_ttl = \"1dy\"\n");
    assert!(!ok);
    assert!(text.contains("wharf.toml:4"), "{text}");
    assert!(text.contains("max_ttl"), "{text}");
    assert!(text.contains("1dy"), "{text}");
}

#[test]
fn check_accepts_a_good_file() {
    let (ok, text) = check("[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n");
    assert!(ok, "{text}");
}

/// Each case: the file, then what the error line must contain after `wharf.toml:`.
#[test]
fn check_locates_values_of_the_wrong_shape() {
    for (toml, expected) in [
        // An array where a table belongs: never read by position.
        (
            "[[server]]\nlisten = \"127.0.0.1:1\"\n",
            "1: server: expected a table ([server]), found an array",
        ),
        (
            "telemetry = [\"json\", \"debug\", \"http://127.0.0.1:4318\", \"svc\", 0.5]\n",
            "1: telemetry: expected a table ([telemetry]), found an array",
        ),
        (
            "[services.q]\ntype = \"queue\"\n[[services.q.deliver]]\nbackend = \"x\"\n",
            "3: services.q.deliver: expected a table ([services.q.deliver]), found an array",
        ),
        // An integer beyond 64 bits names its key.
        (
            "[server]\nmax_connections = 99999999999999999999\n",
            "2: server.max_connections: 99999999999999999999 is too large",
        ),
        // Syntax errors: line, column, key, and the quotes a bare word needs.
        (
            "[server]\nlisten = 127.0.0.1:1\n",
            "2:15: server.listen: expected newline, `#`; strings need quotes: listen = \"127.0.0.1:1\"",
        ),
        ("this is { not toml\n", "1:6: expected `.`, `=`"),
    ] {
        let (ok, text) = check(toml);
        assert!(!ok, "{toml:?}: {text}");
        assert!(text.contains(&format!("wharf.toml:{expected}")), "{toml:?}: {text}");
    }
}

#[test]
fn check_refuses_an_admin_port_taken_by_a_wildcard_listen() {
    let (ok, text) =
        check("[server]\nlisten = \"0.0.0.0:21060\"\nadmin_listen = \"127.0.0.1:21060\"\n");
    assert!(!ok, "{text}");
    assert!(
        text.contains("wharf.toml:3: server.admin_listen: 127.0.0.1:21060 collides with `listen`"),
        "{text}"
    );
}

/// `serve` re-checks the listeners after `--listen`/`--admin-listen` and refuses before
/// binding anything, naming the flags.
#[test]
fn serve_refuses_address_flags_that_collide() {
    let path = config_file("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["serve", "--config"])
        .arg(&path)
        .args([
            "--listen",
            "127.0.0.1:21062",
            "--admin-listen",
            "127.0.0.1:21062",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, text) = output_text(&child.wait_with_output().unwrap());
    assert!(!ok, "{text}");
    assert!(
        text.contains(
            "--listen 127.0.0.1:21062 and --admin-listen 127.0.0.1:21062 take the same port"
        ),
        "{text}"
    );
}
