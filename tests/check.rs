//! `wharf check` as a user runs it: the built binary on a file.

use std::process::Command;

fn check(toml: &str) -> (bool, String) {
    let dir =
        std::env::temp_dir().join(format!("wharf-check-{}-{}", std::process::id(), toml.len()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wharf.toml");
    std::fs::write(&path, toml).unwrap();
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
