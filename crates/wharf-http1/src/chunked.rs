//! The chunked transfer coding of a response body (RFC 9112 §7.1), decoded in place.
//!
//! [`ChunkedDecoder`] consumes control bytes (sizes, extensions, line ends, trailers) from the
//! front of the read buffer and hands chunk data out as `Bytes` split off that buffer, so no
//! body byte is copied. It is strict where laxness lets two parsers disagree on where a
//! message ends (the root of response splitting on a reused connection): every line ends in
//! CRLF, sizes are hex digits only (at most 16), extensions and trailers hold no control
//! characters, and the extension and trailer sections are bounded.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::MessageError;

/// Longest chunk-size line, extensions included.
const MAX_SIZE_LINE: usize = 4096;
/// Longest trailer section (trailers are read and dropped, not relayed).
const MAX_TRAILERS: usize = 16 * 1024;

/// What the decoder produced from the bytes at hand.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The buffer ran out inside the framing: read more.
    NeedMore,
    /// The last chunk and the trailer section are through: the body is complete.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size.
    Size { value: u64, digits: u8 },
    /// Whitespace after the size, before `;`.
    SizeSpace { value: u64 },
    /// Inside chunk extensions, until CR.
    Extension { value: u64 },
    /// CR seen at the end of the size line.
    SizeLf { value: u64 },
    /// Chunk data still to come.
    Data { remaining: u64 },
    /// Expecting the CR after chunk data.
    DataCr,
    /// Expecting the LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer line, until CR.
    Trailer,
    /// CR seen at the end of a trailer line.
    TrailerLf,
    /// CR of the final empty line seen.
    EndLf,
    /// The body is complete.
    Done,
}

/// A chunked body's decoding state.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    /// Bytes of the current size line, or of the trailer section.
    line_bytes: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self {
            state: State::Size {
                value: 0,
                digits: 0,
            },
            line_bytes: 0,
        }
    }

    /// Whether the whole body (last chunk and trailers) has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes from the front of `buf`: data is split off it, framing bytes are consumed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, MessageError> {
        loop {
            if let State::Data { remaining } = self.state {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let take = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                let left = remaining - take as u64;
                self.state = if left == 0 {
                    State::DataCr
                } else {
                    State::Data { remaining: left }
                };
                return Ok(Decoded::Data(buf.split_to(take).freeze()));
            }
            if self.state == State::Done {
                return Ok(Decoded::End);
            }
            let Some(&byte) = buf.first() else {
                return Ok(Decoded::NeedMore);
            };
            buf.advance(1);
            self.state = self.step(byte)?;
        }
    }

    /// One framing byte.
    fn step(&mut self, byte: u8) -> Result<State, MessageError> {
        let next = match self.state {
            State::Size { value, digits } => {
                self.count_line_byte(MAX_SIZE_LINE, "chunk size line too long")?;
                match byte {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if digits == 16 {
                            return Err(MessageError::Chunked("chunk size too large"));
                        }
                        let digit = u64::from(hex_value(byte));
                        State::Size {
                            value: (value << 4) | digit,
                            digits: digits + 1,
                        }
                    }
                    _ if digits == 0 => {
                        return Err(MessageError::Chunked("chunk size is not a hex number"))
                    }
                    b'\r' => State::SizeLf { value },
                    b';' => State::Extension { value },
                    b' ' | b'\t' => State::SizeSpace { value },
                    _ => return Err(MessageError::Chunked("invalid byte after chunk size")),
                }
            }
            State::SizeSpace { value } => {
                self.count_line_byte(MAX_SIZE_LINE, "chunk size line too long")?;
                match byte {
                    b' ' | b'\t' => State::SizeSpace { value },
                    b';' => State::Extension { value },
                    _ => return Err(MessageError::Chunked("invalid byte after chunk size")),
                }
            }
            State::Extension { value } => {
                self.count_line_byte(MAX_SIZE_LINE, "chunk extensions too long")?;
                match byte {
                    b'\r' => State::SizeLf { value },
                    b'\t' => State::Extension { value },
                    0..=0x1f | 0x7f => {
                        return Err(MessageError::Chunked(
                            "control character in chunk extension",
                        ))
                    }
                    _ => State::Extension { value },
                }
            }
            State::SizeLf { value } => {
                if byte != b'\n' {
                    return Err(MessageError::Chunked("chunk size line not ended by CRLF"));
                }
                self.line_bytes = 0;
                if value == 0 {
                    State::TrailerStart
                } else {
                    State::Data { remaining: value }
                }
            }
            State::DataCr => match byte {
                b'\r' => State::DataLf,
                _ => return Err(MessageError::Chunked("chunk data not followed by CRLF")),
            },
            State::DataLf => match byte {
                b'\n' => State::Size {
                    value: 0,
                    digits: 0,
                },
                _ => return Err(MessageError::Chunked("chunk data not followed by CRLF")),
            },
            State::TrailerStart => match byte {
                b'\r' => State::EndLf,
                _ => self.trailer_byte(byte)?,
            },
            State::Trailer => match byte {
                b'\r' => State::TrailerLf,
                _ => self.trailer_byte(byte)?,
            },
            State::TrailerLf => match byte {
                b'\n' => State::TrailerStart,
                _ => return Err(MessageError::Chunked("trailer line not ended by CRLF")),
            },
            State::EndLf => match byte {
                b'\n' => State::Done,
                _ => return Err(MessageError::Chunked("last chunk not ended by CRLF")),
            },
            State::Data { .. } | State::Done => self.state,
        };
        Ok(next)
    }

    fn trailer_byte(&mut self, byte: u8) -> Result<State, MessageError> {
        self.count_line_byte(MAX_TRAILERS, "trailer section too long")?;
        match byte {
            b'\t' => Ok(State::Trailer),
            0..=0x1f | 0x7f => Err(MessageError::Chunked("control character in trailer")),
            _ => Ok(State::Trailer),
        }
    }

    fn count_line_byte(&mut self, limit: usize, what: &'static str) -> Result<(), MessageError> {
        self.line_bytes += 1;
        if self.line_bytes > limit {
            return Err(MessageError::Chunked(what));
        }
        Ok(())
    }
}

fn hex_value(byte: u8) -> u8 {
    match byte {
        b'0'..=b'9' => byte - b'0',
        b'a'..=b'f' => byte - b'a' + 10,
        _ => byte - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in pieces of `step` bytes: the body, or the error.
    #[derive(Debug)]
    enum Outcome {
        Bad(MessageError),
        Truncated,
    }

    impl std::fmt::Display for Outcome {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Outcome::Bad(error) => error.fmt(f),
                Outcome::Truncated => f.write_str("truncated"),
            }
        }
    }

    fn decode_in_steps(wire: &[u8], step: usize) -> Result<Vec<u8>, Outcome> {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut fed = 0;
        loop {
            match decoder.decode(&mut buf).map_err(Outcome::Bad)? {
                Decoded::Data(data) => body.extend_from_slice(&data),
                Decoded::End => {
                    assert!(decoder.is_done());
                    return Ok(body);
                }
                Decoded::NeedMore => {
                    if fed == wire.len() {
                        return Err(Outcome::Truncated);
                    }
                    let end = (fed + step).min(wire.len());
                    buf.extend_from_slice(&wire[fed..end]);
                    fed = end;
                }
            }
        }
    }

    #[test]
    fn decodes_at_every_split() {
        let cases: [(&[u8], &[u8]); 6] = [
            (b"5\r\nhello\r\n0\r\n\r\n", b"hello"),
            (b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world"),
            (b"A\r\n0123456789\r\n0\r\n\r\n", b"0123456789"),
            (b"5;name=value;x=\"q\"\r\nhello\r\n0;end\r\n\r\n", b"hello"),
            (
                b"5 ;ext\r\nhello\r\n0\r\nx-trailer: 1\r\nmore: 2\r\n\r\n",
                b"hello",
            ),
            (b"0\r\n\r\n", b""),
        ];
        for (wire, body) in cases {
            for step in 1..=wire.len() {
                let got = decode_in_steps(wire, step).unwrap_or_else(|e| {
                    panic!("{:?} step {step}: {e}", String::from_utf8_lossy(wire))
                });
                assert_eq!(got, body, "{:?} step {step}", String::from_utf8_lossy(wire));
            }
        }
    }

    #[test]
    fn leaves_the_next_message_in_the_buffer() {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n"[..]);
        assert_eq!(
            decoder.decode(&mut buf).unwrap(),
            Decoded::Data(Bytes::from_static(b"abc"))
        );
        assert_eq!(decoder.decode(&mut buf).unwrap(), Decoded::End);
        assert_eq!(&buf[..], b"HTTP/1.1 200 OK\r\n");
    }

    #[test]
    fn refuses_malformed_framing() {
        let cases: [(&[u8], &str); 11] = [
            (b"x\r\n", "not a hex number"),
            (b"\r\n", "not a hex number"),
            (b"-1\r\n", "not a hex number"),
            (b"5\nhello\r\n0\r\n\r\n", "invalid byte after chunk size"),
            (b"5\r\rhello", "not ended by CRLF"),
            (b"5\r\nhelloX\r\n", "not followed by CRLF"),
            (b"5\r\nhello\n0\r\n\r\n", "not followed by CRLF"),
            (b"11111111111111111\r\n", "too large"),
            (b"5;a\x01b\r\nhello\r\n", "control character"),
            (b"0\r\nx: \x00\r\n\r\n", "control character"),
            (b"0\r\n\r\r", "last chunk not ended"),
        ];
        for (wire, expected) in cases {
            let error = decode_in_steps(wire, wire.len()).unwrap_err();
            assert!(
                error.to_string().contains(expected),
                "{:?}: {error}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn bounds_extensions_and_trailers() {
        let mut long_ext = b"1;".to_vec();
        long_ext.extend(std::iter::repeat_n(b'a', MAX_SIZE_LINE));
        long_ext.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
        let error = decode_in_steps(&long_ext, 512).unwrap_err();
        assert!(error.to_string().contains("too long"), "{error}");

        let mut long_trailer = b"0\r\n".to_vec();
        for _ in 0..MAX_TRAILERS / 12 + 1 {
            long_trailer.extend_from_slice(b"x-a: 12345678\r\n"); // 12 bytes counted
        }
        long_trailer.extend_from_slice(b"\r\n");
        let error = decode_in_steps(&long_trailer, 512).unwrap_err();
        assert!(
            error.to_string().contains("trailer section too long"),
            "{error}"
        );
    }

    #[test]
    fn eof_inside_the_body_is_truncation() {
        for wire in [&b"5\r\nhel"[..], b"5\r\nhello\r\n", b"5\r\nhello\r\n0\r\n"] {
            let error = decode_in_steps(wire, 3).unwrap_err();
            assert!(matches!(error, Outcome::Truncated), "{error}");
        }
    }
}
