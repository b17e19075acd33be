//! The proxy must not be an SSRF hole: every spelling of a refused
//! destination gets 403 (or 400 when malformed) and the origin never sees
//! a request.

use crate::support::*;

/// Spellings of the testbed's own address (127.0.0.1:PORT) and other
/// refused places; `{p}` is the testbed's port.
const REFUSED: &[&str] = &[
    "http://127.0.0.1:{p}/fast",
    "http://2130706433:{p}/fast",
    "http://0x7f.1:{p}/fast",
    "http://0x7f000001:{p}/fast",
    "http://0177.0.0.1:{p}/fast",
    "http://017700000001:{p}/fast",
    "http://127.1:{p}/fast",
    "http://127.0.1:{p}/fast",
    "http://127.000.000.001:{p}/fast",
    "http://0x7F.0x00.0x00.0x01:{p}/fast",
    "http://localhost:{p}/fast",
    "http://LOCALHOST:{p}/fast",
    "http://localhost.:{p}/fast",
    "http://app.localhost:{p}/fast",
    "http://[::1]:{p}/fast",
    "http://[0:0:0:0:0:0:0:1]:{p}/fast",
    "http://[::ffff:127.0.0.1]:{p}/fast",
    "http://[::ffff:7f00:1]:{p}/fast",
    "http://[::127.0.0.1]:{p}/fast",
    "http://[64:ff9b::7f00:1]:{p}/fast",
    "http://[2002:7f00:1::]:{p}/fast",
    "http://[2001::1]:{p}/fast",
    "http://0.0.0.0:{p}/fast",
    "http://0:{p}/fast",
    "http://[::]:{p}/fast",
    "http://10.0.0.1:{p}/fast",
    "http://172.16.0.1:{p}/fast",
    "http://192.168.0.1:{p}/fast",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1:{p}/fast",
    "http://192.0.2.1:{p}/fast",
    "http://198.18.0.1:{p}/fast",
    "http://224.0.0.1:{p}/fast",
    "http://255.255.255.255:{p}/fast",
    "http://[fe80::1]:{p}/fast",
    "http://[fc00::1]:{p}/fast",
    "http://[fd00::1]:{p}/fast",
    "http://[ff02::1]:{p}/fast",
    "http://[2001:db8::1]:{p}/fast",
    "https://127.0.0.1:{p}/fast",
];

/// Malformed or forbidden-by-form targets: 400, origin untouched.
const BAD_REQUEST: &[&str] = &[
    "http://user@127.0.0.1:{p}/fast",
    "http://user:secret@example.com/",
    "ftp://127.0.0.1:{p}/fast",
    "file:///etc/passwd",
    "gopher://127.0.0.1:{p}/_",
    "//127.0.0.1:{p}/fast",
    "127.0.0.1:{p}/fast",
    "http://[::1:{p}/fast",
    "http://",
];

#[tokio::test]
async fn refused_destinations_get_403_and_the_origin_is_never_contacted() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    // Default rules: private networks refused, no allow list.
    let wharf = start_wharf("[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\n").await;
    let port = testbed.addr().port().to_string();
    assert!(REFUSED.len() >= 25);
    for spelling in REFUSED {
        let target = spelling.replace("{p}", &port);
        for duration in ["0", "60"] {
            let url = wharf.url(&format!(
                "/proxy?url={}&cacheDuration={duration}",
                encode(&target)
            ));
            let response = get(&url).await;
            assert_eq!(response.status, 403, "{target}: {:?}", response.body);
            let json = response.json();
            assert_eq!(json["error"], "forbidden", "{target}");
            assert!(
                json["message"].as_str().unwrap().contains("refused"),
                "{target}: {json}"
            );
        }
    }
    for spelling in BAD_REQUEST {
        let target = spelling.replace("{p}", &port);
        let url = wharf.url(&format!("/proxy?url={}&cacheDuration=60", encode(&target)));
        let response = get(&url).await;
        assert_eq!(response.status, 400, "{target}: {:?}", response.body);
        assert_eq!(response.json()["error"], "bad_request", "{target}");
    }
    assert_eq!(testbed.total_hits(), 0, "the origin was contacted");
}

#[tokio::test]
async fn allow_hosts_restricts_even_allowed_networks() {
    let testbed = spawn_testbed("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = testbed.addr().port();
    let wharf = start_wharf(&format!(
        "[services.proxy]\ntype = \"proxy\"\npath = \"/proxy\"\nallow_private_networks = true\nallow_hosts = [\"127.0.0.1:{}\"]\n",
        port + 1
    ))
    .await;
    let url = wharf.url(&format!("/proxy?url={}", encode(&testbed.url("/fast"))));
    let response = get(&url).await;
    assert_eq!(response.status, 403);
    assert!(
        response.json()["message"]
            .as_str()
            .unwrap()
            .contains("allow"),
        "{:?}",
        response.body
    );
    assert_eq!(testbed.total_hits(), 0);
}

#[tokio::test]
async fn the_origin_gets_no_client_credentials() {
    let stack = stack("").await;
    let response = get_with(
        &stack.proxy_url("/echo", None),
        &[
            ("cookie", "session=secret"),
            ("authorization", "Bearer secret"),
            ("x-api-key", "secret"),
        ],
    )
    .await;
    assert_eq!(response.status, 200);
    let echoed = String::from_utf8_lossy(response.bytes()).to_lowercase();
    assert!(
        !echoed.contains("secret"),
        "client credentials reached the origin: {echoed}"
    );
}
