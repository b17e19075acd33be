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

#[cfg(test)]
mod tests {
    #[test]
    fn decimals() {
        for value in [0, 7, 10, 1024, 99_999, u64::MAX] {
            let mut out = b"x".to_vec();
            super::write_decimal(value, &mut out);
            assert_eq!(out, format!("x{value}").as_bytes());
        }
    }
}
