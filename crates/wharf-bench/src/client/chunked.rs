//! [`ChunkedDecoder`]: walks a `Transfer-Encoding: chunked` body (RFC 9112 §7.1) without
//! keeping any of it.
//!
//! The decoder is a state machine fed whatever bytes have arrived, in pieces of any size: it
//! says how many it consumed and whether the body (last chunk, trailers, final CRLF) is
//! complete. Chunk data is skipped in one step per piece; only the framing is read byte by
//! byte. Extensions and trailer fields are checked for their line structure, bounded in
//! length and dropped. Reading the socket and the buffer are the reader's job
//! (`response.rs`).

use crate::client::ResponseError;

/// Longest chunk-size line (size, extensions) accepted, CRLF excluded.
const MAX_SIZE_LINE: usize = 4096;

/// Longest trailer section accepted (as the head's bound).
const MAX_TRAILERS: usize = super::response::MAX_HEAD;

/// Where the decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the hex digits of a chunk size.
    Size,
    /// In whitespace after the size, before `;` or CR.
    SizeSpace,
    /// In a chunk extension (`;name=value`), up to CR.
    Extension,
    /// After the CR of the size line.
    SizeLf,
    /// In chunk data.
    Data,
    /// After the chunk data, expecting CR.
    DataCr,
    /// After the chunk data's CR.
    DataLf,
    /// At the start of a trailer line (or of the final CRLF).
    TrailerStart,
    /// In a trailer field line.
    Trailer,
    /// After a trailer line's CR.
    TrailerLf,
    /// After the final CR.
    EndLf,
    /// The body is complete.
    Done,
}

/// Decodes one chunked body; make a new one per response.
#[derive(Debug)]
pub(crate) struct ChunkedDecoder {
    state: State,
    /// The size being parsed, then the data bytes of the current chunk still to skip.
    size: u64,
    /// Bytes of the current size line so far.
    line: usize,
    /// Bytes of the trailer section so far.
    trailers: usize,
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub(crate) fn new() -> Self {
        ChunkedDecoder {
            state: State::Size,
            size: 0,
            line: 0,
            trailers: 0,
        }
    }

    /// Whether the whole body, trailers included, has been seen.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes body bytes from the front of `input`; returns how many. Stops at the end of
    /// the body, so the rest of `input` (if any) follows the body.
    pub(crate) fn feed(&mut self, input: &[u8]) -> Result<usize, ResponseError> {
        let mut at = 0;
        while at < input.len() {
            if self.state == State::Data {
                let left = input.len() - at;
                let take = usize::try_from(self.size).map_or(left, |size| size.min(left));
                at += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            if self.state == State::Done {
                break;
            }
            self.step(input[at])?;
            at += 1;
        }
        Ok(at)
    }

    /// Moves on by one framing byte.
    fn step(&mut self, byte: u8) -> Result<(), ResponseError> {
        self.state = match self.state {
            State::Size | State::SizeSpace | State::Extension => {
                self.line += 1;
                if self.line > MAX_SIZE_LINE {
                    return Err(ResponseError::Chunked("chunk size line too long"));
                }
                self.size_line(byte)?
            }
            State::SizeLf => match byte {
                b'\n' if self.size == 0 => State::TrailerStart,
                b'\n' => State::Data,
                _ => return Err(ResponseError::Chunked("chunk size line not ended by CRLF")),
            },
            State::DataCr => match byte {
                b'\r' => State::DataLf,
                _ => return Err(ResponseError::Chunked("chunk data longer than its size")),
            },
            State::DataLf => match byte {
                b'\n' => {
                    self.line = 0;
                    State::Size
                }
                _ => return Err(ResponseError::Chunked("chunk data not ended by CRLF")),
            },
            State::TrailerStart | State::Trailer => {
                self.trailers += 1;
                if self.trailers > MAX_TRAILERS {
                    return Err(ResponseError::Chunked("trailers too long"));
                }
                match (self.state, byte) {
                    (State::TrailerStart, b'\r') => State::EndLf,
                    (_, b'\r') => State::TrailerLf,
                    (_, b'\n') => {
                        return Err(ResponseError::Chunked("trailer line not ended by CRLF"))
                    }
                    _ => State::Trailer,
                }
            }
            State::TrailerLf => match byte {
                b'\n' => State::TrailerStart,
                _ => return Err(ResponseError::Chunked("trailer line not ended by CRLF")),
            },
            State::EndLf => match byte {
                b'\n' => State::Done,
                _ => return Err(ResponseError::Chunked("chunked body not ended by CRLF")),
            },
            State::Data | State::Done => self.state,
        };
        Ok(())
    }

    /// The next state after `byte` of a size line (`1*HEXDIG [ BWS ";" ext ] CRLF`).
    fn size_line(&mut self, byte: u8) -> Result<State, ResponseError> {
        let digits = self.line > 1;
        Ok(match (self.state, byte) {
            (State::Size, _) if byte.is_ascii_hexdigit() => {
                let digit = match byte {
                    b'0'..=b'9' => byte - b'0',
                    _ => (byte | 0x20) - b'a' + 10,
                };
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(u64::from(digit)))
                    .ok_or(ResponseError::Chunked("chunk size overflows 64 bits"))?;
                State::Size
            }
            // A size line needs at least one digit before anything else.
            (State::Size, _) if !digits => {
                return Err(ResponseError::Chunked("invalid chunk size"))
            }
            (State::Size | State::SizeSpace, b' ' | b'\t') => State::SizeSpace,
            (State::Size | State::SizeSpace, b';') => State::Extension,
            (State::Size | State::SizeSpace | State::Extension, b'\r') => State::SizeLf,
            (State::Extension, b'\n') => {
                return Err(ResponseError::Chunked("chunk size line not ended by CRLF"))
            }
            (State::Extension, _) => State::Extension,
            _ => return Err(ResponseError::Chunked("invalid chunk size")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `body` in pieces split at `splits`; the bytes consumed and whether done.
    fn decode(body: &[u8], splits: &[usize]) -> Result<(usize, bool), ResponseError> {
        let mut decoder = ChunkedDecoder::new();
        let mut consumed = 0;
        let mut from = 0;
        for &to in splits.iter().chain(std::iter::once(&body.len())) {
            let piece = &body[from..to];
            let used = decoder.feed(piece)?;
            consumed += used;
            if decoder.is_done() {
                return Ok((consumed, true));
            }
            assert_eq!(used, piece.len(), "an unfinished body consumes all input");
            from = to;
        }
        Ok((consumed, decoder.is_done()))
    }

    const GOOD: &[&[u8]] = &[
        b"0\r\n\r\n",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"A\r\n0123456789\r\n1\r\n!\r\n0\r\n\r\n",
        b"a;name=value;q=\"x;y\"\r\n0123456789\r\n0;last\r\n\r\n",
        b"5 ;ext\r\nhello\r\n0\t\r\n\r\n",
        b"0005\r\nhello\r\n000\r\nexpires: never\r\nx-sum: 12\r\n\r\n",
        b"ffffffff\r\n",
    ];

    #[test]
    fn decodes_at_every_split() {
        for body in GOOD {
            let complete = !body.ends_with(b"ffffffff\r\n");
            for split in 0..=body.len() {
                let (used, done) = decode(body, &[split]).unwrap();
                assert_eq!(done, complete, "{:?} split at {split}", body);
                assert_eq!(used, body.len());
            }
            // One byte at a time.
            let all: Vec<usize> = (1..body.len()).collect();
            assert_eq!(decode(body, &all).unwrap(), (body.len(), complete));
        }
    }

    #[test]
    fn stops_at_the_end_of_the_body() {
        let mut decoder = ChunkedDecoder::new();
        let input = b"2\r\nok\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n";
        assert_eq!(decoder.feed(input).unwrap(), 12);
        assert!(decoder.is_done());
        assert_eq!(decoder.feed(b"more").unwrap(), 0);
    }

    #[test]
    fn refuses_bad_framing() {
        for body in [
            &b"\r\n"[..],
            b"x\r\n",
            b";ext\r\n",
            b" 5\r\nhello\r\n",
            b"5\nhello\r\n",
            b"5\r\nhello!\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5 5\r\nhello\r\n",
            b"5;ext\nhello",
            b"-1\r\n",
            b"0x5\r\n",
            b"10000000000000000\r\n",
            b"0\r\nbad\ntrailer\r\n\r\n",
            b"0\r\n\rx",
            b"0\r\nt: 1\rx",
        ] {
            let result = decode(body, &[]);
            assert!(
                matches!(result, Err(ResponseError::Chunked(_))),
                "{:?}: {result:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn bounds_size_lines_and_trailers() {
        let mut long_ext = b"1;".to_vec();
        long_ext.resize(MAX_SIZE_LINE + 10, b'x');
        assert!(decode(&long_ext, &[]).is_err());
        let mut long_trailer = b"0\r\nx: ".to_vec();
        long_trailer.resize(MAX_TRAILERS + 10, b'y');
        assert!(decode(&long_trailer, &[]).is_err());
        // Many short chunks are fine: the bound is per line.
        let many = b"1;e\r\nx\r\n".repeat(2 * MAX_SIZE_LINE);
        assert_eq!(decode(&many, &[]).unwrap(), (many.len(), false));
    }
}
