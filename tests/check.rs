//! `wharf check` as a user runs it: the built binary on a file.

use std::path::{Path, PathBuf};
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
    check_file(&config_file(toml))
}

/// `wharf check --config path`.
fn check_file(path: &Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["check", "--config"])
        .arg(path)
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

/// Runs `wharf serve --config path args` until it exits (killed after 20 s: a serve that
/// should have refused to start).
fn serve_until_exit(path: &Path, args: &[&str]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["serve", "--config"])
        .arg(path)
        .args(args)
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
    output_text(&child.wait_with_output().unwrap())
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
    let (ok, text) = serve_until_exit(
        &path,
        &[
            "--listen",
            "127.0.0.1:21062",
            "--admin-listen",
            "127.0.0.1:21062",
        ],
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains(
            "--listen 127.0.0.1:21062 and --admin-listen 127.0.0.1:21062 take the same port"
        ),
        "{text}"
    );
}

/// A self-signed certificate for localhost and its key, as PEM text.
fn pem_pair() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A config whose `[server]` names `cert.pem` and `key.pem` beside it, holding `cert` and
/// `key` (`None`: the file is not written). Returns the config and the two paths.
fn tls_config(cert: Option<&str>, key: Option<&str>) -> (PathBuf, PathBuf, PathBuf) {
    let path = config_file("");
    let dir = path.parent().unwrap();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    for (file, text) in [(&cert_path, cert), (&key_path, key)] {
        if let Some(text) = text {
            std::fs::write(file, text).unwrap();
        }
    }
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         tls_cert = {:?}\ntls_key = {:?}\n\n\
         [services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n",
        cert_path.display().to_string(),
        key_path.display().to_string(),
    );
    std::fs::write(&path, toml).unwrap();
    (path, cert_path, key_path)
}

#[test]
fn check_accepts_a_matching_tls_pair() {
    let (cert, key) = pem_pair();
    let (path, _, _) = tls_config(Some(&cert), Some(&key));
    let (ok, text) = check_file(&path);
    assert!(ok, "{text}");
    assert!(text.contains(": ok (1 service)"), "{text}");
}

/// `check` loads the TLS files as `serve` does: each case must fail naming the key, the
/// file and why. Each case: cert.pem, key.pem (`None`: absent), the key blamed, the file
/// blamed and what the message must say.
#[test]
fn check_refuses_tls_files_serve_would_refuse() {
    let (cert, key) = pem_pair();
    let (_, other_key) = pem_pair();
    let not_pem = "this is not a PEM file\n";
    let cert_bytes = cert
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<String>();
    let bad_der = "-----BEGIN CERTIFICATE-----\nAAECAwQFBgcI\n-----END CERTIFICATE-----\n";
    let bad_key = "-----BEGIN PRIVATE KEY-----\nAAECAwQFBgcI\n-----END PRIVATE KEY-----\n";
    // The label is what matters: rustls skips the block unread.
    let encrypted_key =
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAECAwQFBgcI\n-----END ENCRYPTED PRIVATE KEY-----\n";
    // Throwaway P-521 keys (`openssl genpkey -algorithm EC -pkeyopt
    // ec_paramgen_curve:P-521`, and `openssl ecparam -name secp521r1 -genkey -noout`):
    // valid keys that ring cannot sign with.
    let p521_pkcs8 = "-----BEGIN PRIVATE KEY-----
MIHuAgEAMBAGByqGSM49AgEGBSuBBAAjBIHWMIHTAgEBBEIBLvN9NoOp59+Aen9U
u3VA4lLJ9xCIXIJYARjWOuDSqDeBB3OIKtpFkVeWsPNpRj3VKbDatOG/ZrgKrcxH
2AKhHYGhgYkDgYYABAHXXgYcPfr0ufLBwWM6bgxeyNKXLW8QXNogDipDBSTdnXE0
k+zpN/b+5GBVU6WGLughrpoQayyAuRym7HeFUj9d9wAfLAhI7WM34/1rQMRkakte
P6QExaRwtZDSF2XbhZ0zw1UjnlSQgCICybK2treDuyTVccvZ33C94lrX63xzTfRN
rg==
-----END PRIVATE KEY-----
";
    let p521_sec1 = "-----BEGIN EC PRIVATE KEY-----
MIHcAgEBBEIAIvxFvnHo4zQgtJGR9yXyf7PIXNc9X4H294mzH16U+l5U7OYh2B1+
XGctDxkTKxuBdsw6C3I2hjdsrsksJTJR2jmgBwYFK4EEACOhgYkDgYYABAA0i+bh
t2JoYy+MfBOeZ4R3KIi5hPo/Oi9idUFt706qhfggBvT1Stv7raxMTILkCBNCg/5s
0MiwzqCYo/vcNNUpxAH1JY2T3n6eBxpJLw4mYl7ZXcA9SUmoco54nINvrcum0F7H
vg2z3S8taTNzg4FAKa/yhpSUsyTVm/KS1gy6AKDtfQ==
-----END EC PRIVATE KEY-----
";
    for (case, cert, key, blamed, file, why) in [
        (
            "missing cert",
            None,
            Some(key.as_str()),
            "server.tls_cert",
            "cert.pem",
            "is not a readable file",
        ),
        (
            "missing key",
            Some(cert.as_str()),
            None,
            "server.tls_key",
            "key.pem",
            "is not a readable file",
        ),
        (
            "cert not PEM",
            Some(not_pem),
            Some(&key),
            "server.tls_cert",
            "cert.pem",
            "no certificate in the file",
        ),
        (
            "cert as bare base64",
            Some(&cert_bytes),
            Some(&key),
            "server.tls_cert",
            "cert.pem",
            "no certificate in the file",
        ),
        (
            "key in the cert file",
            Some(&key),
            Some(&key),
            "server.tls_cert",
            "cert.pem",
            "no certificate in the file",
        ),
        (
            "cert not X.509",
            Some(bad_der),
            Some(&key),
            "server.tls_cert",
            "cert.pem",
            "not a valid X.509 certificate",
        ),
        (
            "key not PEM",
            Some(&cert),
            Some(not_pem),
            "server.tls_key",
            "key.pem",
            "no private key in the file",
        ),
        (
            "cert in the key file",
            Some(&cert),
            Some(&cert),
            "server.tls_key",
            "key.pem",
            "no private key in the file",
        ),
        (
            "key encrypted",
            Some(&cert),
            Some(encrypted_key),
            "server.tls_key",
            "key.pem",
            "an encrypted private key, which wharf cannot read",
        ),
        (
            "key not a key",
            Some(&cert),
            Some(bad_key),
            "server.tls_key",
            "key.pem",
            "not a usable private key",
        ),
        (
            "key on P-521, PKCS#8",
            Some(&cert),
            Some(p521_pkcs8),
            "server.tls_key",
            "key.pem",
            "a key on P-521 (secp521r1), which wharf's TLS cannot use; wharf takes RSA keys of 2048 to 4096 bits",
        ),
        (
            "key on P-521, SEC1",
            Some(&cert),
            Some(p521_sec1),
            "server.tls_key",
            "key.pem",
            "a key on P-521 (secp521r1), which wharf's TLS cannot use; wharf takes RSA keys of 2048 to 4096 bits",
        ),
        (
            "another key",
            Some(&cert),
            Some(&other_key),
            "server.tls_key",
            "key.pem",
            "does not match the certificate in",
        ),
    ] {
        let (path, _, _) = tls_config(cert, key);
        let file = path.parent().unwrap().join(file).display().to_string();
        let (ok, text) = check_file(&path);
        assert!(!ok, "{case}: {text}");
        // `wharf.toml:LINE: key: "file" ...` from the config's own checks (a missing file),
        // `wharf.toml: key: "file": ...` from loading the files.
        assert!(text.contains(&path.display().to_string()), "{case}: {text}");
        let expected = format!("{blamed}: {file:?}");
        assert!(
            text.contains(&expected),
            "{case}: expected {expected:?} in {text}"
        );
        assert!(text.contains(why), "{case}: expected {why:?} in {text}");
    }
}

/// What `check` refuses, `serve` refuses at start with the same reason.
#[test]
fn serve_refuses_the_tls_file_check_refuses() {
    let (_, key) = pem_pair();
    let (path, cert_path, _) = tls_config(Some("this is not a PEM file\n"), Some(&key));
    let (ok, text) = check_file(&path);
    assert!(!ok, "{text}");
    let (ok, text) = serve_until_exit(&path, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "tls_cert {}: no certificate in the file",
            cert_path.display()
        )),
        "{text}"
    );
}
