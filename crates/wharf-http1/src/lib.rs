//! HTTP/1.1 on the wire, for wharf's own server and upstream client: heads parsed and
//! written, body framing decided (RFC 9112 §6), the chunked coding decoded. No I/O: callers
//! bring the bytes.
//!
//! - [`request`]: request heads, written by the client ([`request::encode_request_head`])
//!   and read strictly by the server ([`request::parse_request_head`]), where smuggling is
//!   refused;
//! - [`response`]: response heads, read by the client ([`response::parse_response_head`])
//!   and written by the server ([`response::encode_response_head`]);
//! - [`chunked`]: the chunked coding, decoded in place ([`chunked::ChunkedDecoder`]);
//! - [`recycle`]: header maps kept per thread between messages, and the threads' numbers
//!   for state sharded by thread;
//! - [`relay`]: response fields kept as wire lines for a proxy that only passes them on;
//! - [`MessageError`]: what is wrong with a message, for a 400/431 or a 502.
//!
//! Parsing is `httparse`'s (hyper's own parser); every header value of a parsed head points
//! into one copy of that head, exactly its size.

pub mod chunked;
mod error;
mod fields;
pub mod recycle;
pub mod relay;
pub mod request;
pub mod response;

pub use error::MessageError;
pub use fields::parse_content_length;

/// Appends `value` in decimal to `out`, without allocating.
pub fn write_decimal(value: u64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Takes `written` bytes off the front of `parts`, the queue of a vectored write, and
/// returns how many parts went out whole: they are the first ones, now empty, for the caller
/// to drop. A part written in part keeps its rest; the parts after it are untouched.
pub fn advance_parts(parts: &mut [bytes::Bytes], written: usize) -> usize {
    let mut left = written;
    let mut whole = 0;
    for part in parts.iter_mut() {
        let take = left.min(part.len());
        bytes::Buf::advance(part, take);
        left -= take;
        if !part.is_empty() {
            break;
        }
        whole += 1;
    }
    whole
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    #[test]
    fn a_written_count_empties_whole_parts_and_trims_the_next() {
        let queue = || {
            vec![
                Bytes::from_static(b"abc"),
                Bytes::from_static(b"de"),
                Bytes::from_static(b"fgh"),
            ]
        };
        let cases: [(usize, usize, &[&[u8]]); 6] = [
            (0, 0, &[b"abc", b"de", b"fgh"]),
            (2, 0, &[b"c", b"de", b"fgh"]),
            (3, 1, &[b"", b"de", b"fgh"]),
            (4, 1, &[b"", b"e", b"fgh"]),
            (5, 2, &[b"", b"", b"fgh"]),
            (8, 3, &[b"", b"", b""]),
        ];
        for (written, whole, rest) in cases {
            let mut parts = queue();
            assert_eq!(
                super::advance_parts(&mut parts, written),
                whole,
                "{written} bytes written"
            );
            let left: Vec<&[u8]> = parts.iter().map(|p| p.as_ref()).collect();
            assert_eq!(left, rest, "{written} bytes written");
        }
    }

    #[test]
    fn decimals() {
        for value in [0, 7, 10, 1024, 99_999, u64::MAX] {
            let mut out = b"x".to_vec();
            super::write_decimal(value, &mut out);
            assert_eq!(out, format!("x{value}").as_bytes());
        }
    }
}
