//! The server's request-head parser, both ways: `parse_request_head` (with the
//! field map) against `parse_request_head_for` told that no fields are wanted.
//!
//! Input: any bytes, parsed as the front of a connection's buffer. Properties:
//! both give the same answer (partial, the same error text, or a complete head
//! of the same length whose method, target, version, framing, persistence and
//! `expect` agree); without the map, a head either has an empty map or, when a
//! field the framing rules read is there, the same map as with it. The reader
//! is asked once for every complete head, at most once otherwise.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wharf_http1::request::{parse_request_head, parse_request_head_for, RequestParse};

const LIMIT: usize = 8 * 1024;

fuzz_target!(|data: &[u8]| {
    let full = parse_request_head(data, LIMIT);
    let mut asked = 0;
    let bare = parse_request_head_for(data, LIMIT, |_path| {
        asked += 1;
        false
    });
    assert!(asked <= 1);
    match (full, bare) {
        (Ok(RequestParse::Partial), Ok(RequestParse::Partial)) => {}
        (Ok(RequestParse::Complete(n, a)), Ok(RequestParse::Complete(m, b))) => {
            assert_eq!(n, m);
            assert_eq!(asked, 1);
            assert_eq!(
                (&a.method, &a.uri, a.version, a.framing, a.keep_alive, a.expect_continue),
                (&b.method, &b.uri, b.version, b.framing, b.keep_alive, b.expect_continue)
            );
            assert!(b.headers.is_empty() || b.headers == a.headers);
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (a, b) => panic!("with the map {a:?}, without {b:?}"),
    }
});
