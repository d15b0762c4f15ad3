//! The router's side of HTTP/1.1 toward actors, without a dispatcher task:
//! a request head written straight into the connection's write buffer, a
//! response head parsed (httparse) straight out of its read buffer, and the
//! response body framed (RFC 9112 §6.3) and, if chunked, decoded as the
//! client's connection task reads it. Sans-IO: [`crate::pool`] does the
//! reads and writes.
//!
//! Bounds: a response head over [`RESPONSE_HEAD_BYTES_MAX`] or with more
//! than [`RESPONSE_HEADERS_MAX`] headers, a chunk-size line over
//! [`CHUNK_LINE_BYTES_MAX`] and trailers over [`TRAILER_BYTES_MAX`] are
//! errors (the forward fails), never buffered further. Trailers are read
//! and dropped, not forwarded.

use std::fmt::Write as _;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, StatusCode};

/// Largest response head (status line and headers) read from an actor, in bytes.
pub(crate) const RESPONSE_HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most headers of one response from an actor.
pub(crate) const RESPONSE_HEADERS_MAX: usize = 128;
/// Longest chunk-size line (with extensions) of a chunked body, in bytes.
pub(crate) const CHUNK_LINE_BYTES_MAX: usize = 4 * 1024;
/// Most trailer bytes after a chunked body (read and dropped), in bytes.
pub(crate) const TRAILER_BYTES_MAX: usize = 16 * 1024;

/// A malformed or oversized response: the forward fails, the connection closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ParseError(pub(crate) String);

fn error(text: impl Into<String>) -> ParseError {
    ParseError(text.into())
}

/// Whether a request with this method and no body still says `content-length: 0`
/// (the methods whose requests are expected to have a body).
fn states_empty_length(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET
            | Method::HEAD
            | Method::DELETE
            | Method::OPTIONS
            | Method::TRACE
            | Method::CONNECT
    )
}

/// Appends a request head to `out`: `METHOD path HTTP/1.1`, `host`, the
/// headers of `headers` except `host`, `content-length` and the names in
/// `extra`, then `extra` and the body's `content-length`. `headers` holds no
/// hop-by-hop header any more (the router stripped them) and its values
/// hold no CR or LF (hyper's `HeaderValue` refuses them).
pub(crate) fn encode_request(
    out: &mut Vec<u8>,
    method: &Method,
    path_and_query: &str,
    host: &HeaderValue,
    headers: &HeaderMap,
    extra: &[(&HeaderName, &(dyn std::fmt::Display + Sync))],
    body_len: usize,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path_and_query.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == header::HOST
            || name == header::CONTENT_LENGTH
            || extra.iter().any(|(n, _)| *n == name)
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let mut text = Text(out);
    for (name, value) in extra {
        let _ = write!(text, "{}: {value}\r\n", name.as_str());
    }
    if body_len > 0 || states_empty_length(method) {
        let _ = write!(text, "content-length: {body_len}\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// `fmt::Write` into a byte buffer.
struct Text<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (HEAD, 204, 304) or `content-length: 0`.
    Empty,
    /// `content-length` bytes.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Until the actor closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// Whether the connection can carry another request after this body.
    pub(crate) keep_alive: bool,
}

/// Parses the response head at the start of `buf`, skipping informational
/// (1xx) responses, and takes it out of `buf` (the values share its bytes).
/// `Ok(None)`: not complete yet; `head_request`: the request was HEAD.
pub(crate) fn parse_response(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<ResponseHead>, ParseError> {
    let config = httparse::ParserConfig::default();
    loop {
        // Uninitialised header slots: nothing to clear per response.
        let mut slots =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; RESPONSE_HEADERS_MAX];
        let mut response = httparse::Response::new(&mut []);
        let len = match config.parse_response_with_uninit_headers(&mut response, buf, &mut slots) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                if buf.len() > RESPONSE_HEAD_BYTES_MAX {
                    return Err(error("response head too large"));
                }
                return Ok(None);
            }
            Err(e) => return Err(error(format!("bad response head: {e}"))),
        };
        if len > RESPONSE_HEAD_BYTES_MAX {
            return Err(error("response head too large"));
        }
        let code = response.code.unwrap_or(0);
        let http11 = response.version == Some(1);
        let status = StatusCode::from_u16(code).map_err(|_| error(format!("bad status {code}")))?;
        if status.is_informational() {
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(error("101 without an upgrade asked for"));
            }
            buf.advance(len);
            continue;
        }
        // The head leaves the buffer, and is parsed once more where it now
        // lies, so each value is a slice of it: no copy.
        let head = buf.split_to(len).freeze();
        let mut slots =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; RESPONSE_HEADERS_MAX];
        let mut response = httparse::Response::new(&mut []);
        if !matches!(
            config.parse_response_with_uninit_headers(&mut response, &head, &mut slots),
            Ok(httparse::Status::Complete(_))
        ) {
            return Err(error("response head changed between two parses"));
        }
        let mut headers = HeaderMap::with_capacity(response.headers.len());
        for h in response.headers.iter() {
            let name =
                HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| error("bad header name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice_ref(h.value))
                .map_err(|_| error("bad header value"))?;
            headers.append(name, value);
        }
        let (framing, keep_alive) = framing(&headers, status, head_request, http11)?;
        // A body framed by transfer-encoding goes on without the length it
        // may also claim (the router sends it chunked or to its close).
        if matches!(framing, Framing::Chunked | Framing::Close) {
            headers.remove(header::CONTENT_LENGTH);
        }
        return Ok(Some(ResponseHead {
            status,
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// The body framing of a response (RFC 9112 §6.3) and whether its
/// connection can be kept. A response framed by `transfer-encoding` loses
/// any `content-length`.
fn framing(
    headers: &HeaderMap,
    status: StatusCode,
    head_request: bool,
    http11: bool,
) -> Result<(Framing, bool), ParseError> {
    let close_asked = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("close"));
    let keep_alive = http11 && !close_asked;
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Empty, keep_alive));
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        let last = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .rfind(|c| !c.is_empty());
        // Both framings given: the length is not to be trusted, nor the connection.
        let both = headers.contains_key(header::CONTENT_LENGTH);
        return Ok(match last {
            Some(c) if c.eq_ignore_ascii_case("chunked") => (Framing::Chunked, keep_alive && !both),
            _ => (Framing::Close, false),
        });
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|b| *b == b',') {
            let part = part.trim_ascii();
            let parsed = std::str::from_utf8(part)
                .ok()
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u64>().ok())
                .ok_or_else(|| error("bad content-length"))?;
            if length.is_some_and(|l| l != parsed) {
                return Err(error("conflicting content-length values"));
            }
            length = Some(parsed);
        }
    }
    Ok(match length {
        Some(0) => (Framing::Empty, keep_alive),
        Some(n) => (Framing::Length(n), keep_alive),
        None => (Framing::Close, false),
    })
}

/// What [`Decoder::decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// More bytes are needed.
    More,
    /// The body is complete.
    Done,
}

/// Where a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk: bytes left.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// Reading the trailer section: bytes read so far.
    Trailers(usize),
}

/// Takes a response body out of the connection's read buffer, bounded.
#[derive(Debug)]
pub(crate) enum Decoder {
    Length(u64),
    Chunked(Chunk),
    Close,
    Done,
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Decoder {
        match framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Chunk::Size),
            Framing::Close => Decoder::Close,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// Body bytes left, if known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    /// The next body bytes out of `buf`, `More` if `buf` holds none yet.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ParseError> {
        loop {
            match self {
                Decoder::Done => return Ok(Decoded::Done),
                Decoder::Length(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= n as u64;
                    if *left == 0 {
                        *self = Decoder::Done;
                    }
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                Decoder::Close => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    return Ok(Decoded::Data(buf.split().freeze()));
                }
                Decoder::Chunked(chunk) => match *chunk {
                    Chunk::Size => {
                        let Some(line) = take_line(buf, CHUNK_LINE_BYTES_MAX)? else {
                            return Ok(Decoded::More);
                        };
                        let size = chunk_size(&line)?;
                        *chunk = if size == 0 {
                            Chunk::Trailers(0)
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Chunk::Data(left) => {
                        if buf.is_empty() {
                            return Ok(Decoded::More);
                        }
                        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                        *chunk = if left == n as u64 {
                            Chunk::DataEnd
                        } else {
                            Chunk::Data(left - n as u64)
                        };
                        return Ok(Decoded::Data(buf.split_to(n).freeze()));
                    }
                    Chunk::DataEnd => {
                        if buf.len() < 2 {
                            return Ok(Decoded::More);
                        }
                        if &buf[..2] != b"\r\n" {
                            return Err(error("chunk data not followed by CRLF"));
                        }
                        buf.advance(2);
                        *chunk = Chunk::Size;
                    }
                    Chunk::Trailers(read) => {
                        // Bytes, not lines: short lines (a bare LF each)
                        // count too, so the section ends within the bound.
                        let left = TRAILER_BYTES_MAX.checked_sub(read).filter(|n| *n > 0);
                        let Some(left) = left else {
                            return Err(error("trailers longer than the bound"));
                        };
                        let before = buf.len();
                        let Some(line) = take_line(buf, left)? else {
                            return Ok(Decoded::More);
                        };
                        if line.is_empty() {
                            *self = Decoder::Done;
                        } else {
                            *chunk = Chunk::Trailers(read + (before - buf.len()));
                        }
                    }
                },
            }
        }
    }

    /// The actor closed the connection: the end of a `Close` body, an
    /// error for any other unfinished one.
    pub(crate) fn eof(&mut self) -> Result<(), ParseError> {
        match self {
            Decoder::Close | Decoder::Done => {
                *self = Decoder::Done;
                Ok(())
            }
            _ => Err(error(
                "the actor closed the connection before the body's end",
            )),
        }
    }
}

/// One line (without its CRLF or LF) taken out of `buf`; `None` if it is
/// not complete yet; an error if it is longer than `max`.
fn take_line(buf: &mut BytesMut, max: usize) -> Result<Option<BytesMut>, ParseError> {
    let Some(end) = buf.iter().take(max + 2).position(|b| *b == b'\n') else {
        if buf.len() > max + 1 {
            return Err(error("line too long in a chunked body"));
        }
        return Ok(None);
    };
    let mut line = buf.split_to(end + 1);
    line.truncate(end);
    if line.last() == Some(&b'\r') {
        line.truncate(end - 1);
    }
    Ok(Some(line))
}

/// The size of a chunk-size line (hex digits, then optional extensions).
fn chunk_size(line: &[u8]) -> Result<u64, ParseError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = line[digits..].trim_ascii_start();
    if digits == 0 || digits > 15 || !(rest.is_empty() || rest[0] == b';') {
        return Err(error("bad chunk size"));
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| error("bad chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| error("bad chunk size"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, head_request: bool) -> Result<Option<ResponseHead>, ParseError> {
        parse_response(&mut BytesMut::from(text.as_bytes()), head_request)
    }

    fn body(decoder: &mut Decoder, wire: &[u8], step: usize) -> Result<Vec<u8>, ParseError> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match decoder.decode(&mut buf)? {
                    Decoded::Data(d) => out.extend_from_slice(&d),
                    Decoded::More => break,
                    Decoded::Done => return Ok(out),
                }
            }
        }
        decoder.eof()?;
        Ok(out)
    }

    #[test]
    fn a_request_head_carries_host_identity_and_length_but_not_the_clients() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("router"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        headers.insert("x-homing-dc", HeaderValue::from_static("forged"));
        headers.insert("x-end", HeaderValue::from_static("kept"));
        let dc = HeaderName::from_static("x-homing-dc");
        let mut out = Vec::new();
        encode_request(
            &mut out,
            &Method::POST,
            "/a?b",
            &HeaderValue::from_static("127.0.0.1:9"),
            &headers,
            &[(&dc, &"iad")],
            3,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a?b HTTP/1.1\r\nhost: 127.0.0.1:9\r\nx-end: kept\r\nx-homing-dc: iad\r\ncontent-length: 3\r\n\r\n"
        );
        let mut out = Vec::new();
        encode_request(
            &mut out,
            &Method::GET,
            "/",
            &HeaderValue::from_static("h"),
            &HeaderMap::new(),
            &[],
            0,
        );
        assert_eq!(out, b"GET / HTTP/1.1\r\nhost: h\r\n\r\n");
    }

    #[test]
    fn response_heads_are_framed_as_rfc_9112_says() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                false,
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
                false,
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
                false,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                true,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                false,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
                false,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                false,
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
                false,
                Framing::Chunked,
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                false,
                Framing::Close,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false, Framing::Close, false),
            (
                "HTTP/1.1 200 OK\r\nconnection: x, close\r\ncontent-length: 1\r\n\r\n",
                false,
                Framing::Length(1),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
                false,
                Framing::Length(1),
                false,
            ),
            (
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 1\r\n\r\n",
                false,
                Framing::Length(1),
                true,
            ),
        ];
        for (text, head_request, framing, keep_alive) in cases {
            let head = parse(text, head_request).unwrap().unwrap();
            assert_eq!(
                (head.framing, head.keep_alive),
                (framing, keep_alive),
                "{text}"
            );
        }
        let head = parse(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            head.headers.get(header::CONTENT_LENGTH),
            None,
            "the length goes"
        );
        let head = parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nx-a: b\r\ncontent-length: 1\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!(head.status, StatusCode::CREATED);
        assert_eq!(head.headers.get("x-a").unwrap(), "b");
    }

    #[test]
    fn bad_oversized_and_partial_response_heads() {
        assert!(
            parse("HTTP/1.1 200 OK\r\ncontent-le", false)
                .unwrap()
                .is_none()
        );
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "SMTP ready\r\n\r\n",
        ] {
            assert!(parse(bad, false).is_err(), "{bad}");
        }
        let huge = format!(
            "HTTP/1.1 200 OK\r\nx: {}",
            "a".repeat(RESPONSE_HEAD_BYTES_MAX)
        );
        assert!(parse(&huge, false).is_err(), "an endless head is refused");
        let many: String = (0..=RESPONSE_HEADERS_MAX)
            .map(|i| format!("x{i}: 1\r\n"))
            .collect();
        assert!(parse(&format!("HTTP/1.1 200 OK\r\n{many}\r\n"), false).is_err());
    }

    #[test]
    fn bodies_decode_whatever_the_reads_cut() {
        let chunked = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\ntrailer: x\r\n\r\n";
        for step in [1, 2, 3, 7, 100] {
            let mut d = Decoder::new(Framing::Chunked);
            assert_eq!(
                body(&mut d, chunked, step).unwrap(),
                b"hello world",
                "step {step}"
            );
            assert!(d.is_done());
            let mut d = Decoder::new(Framing::Length(11));
            assert_eq!(body(&mut d, b"hello world", step).unwrap(), b"hello world");
            let mut d = Decoder::new(Framing::Close);
            assert_eq!(body(&mut d, b"until eof", step).unwrap(), b"until eof");
        }
        let mut d = Decoder::new(Framing::Length(20));
        assert!(body(&mut d, b"short", 5).is_err(), "EOF before the length");
        let mut d = Decoder::new(Framing::Chunked);
        assert!(body(&mut d, b"5\r\nhel", 3).is_err(), "EOF inside a chunk");
        let mut d = Decoder::new(Framing::Chunked);
        assert!(body(&mut d, b"zz\r\n", 4).is_err(), "a bad size");
        let mut d = Decoder::new(Framing::Chunked);
        assert!(
            body(&mut d, b"5\r\nhelloXX", 10).is_err(),
            "data without CRLF"
        );
        let long = vec![b'1'; CHUNK_LINE_BYTES_MAX + 8];
        let mut d = Decoder::new(Framing::Chunked);
        assert!(body(&mut d, &long, 512).is_err(), "an endless size line");
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(
            std::iter::repeat_n(b"t: 1\r\n".as_slice(), TRAILER_BYTES_MAX / 6 + 2).flatten(),
        );
        let mut d = Decoder::new(Framing::Chunked);
        assert!(body(&mut d, &trailers, 512).is_err(), "endless trailers");
        // Past the bound, one-byte lines ending in a bare LF end it too.
        let mut sneaky = b"0\r\n".to_vec();
        sneaky.extend(
            std::iter::repeat_n(b"t: 1\r\n".as_slice(), TRAILER_BYTES_MAX / 6 + 1).flatten(),
        );
        sneaky.extend(std::iter::repeat_n(b"x\n".as_slice(), 100_000).flatten());
        sneaky.extend(b"\r\n");
        let mut d = Decoder::new(Framing::Chunked);
        assert!(
            body(&mut d, &sneaky, 512).is_err(),
            "trailers of bare-LF lines"
        );
    }

    proptest::proptest! {
        /// Any body, cut into any chunks, read in any pieces, decodes to itself.
        #[test]
        fn a_chunked_body_decodes_to_itself_however_it_is_chunked_and_read(
            sent in proptest::collection::vec(proptest::num::u8::ANY, 0..2048),
            chunk in 1usize..300,
            step in 1usize..64,
        ) {
            let mut wire = Vec::new();
            for piece in sent.chunks(chunk) {
                wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                wire.extend_from_slice(piece);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let mut d = Decoder::new(Framing::Chunked);
            proptest::prop_assert_eq!(body(&mut d, &wire, step).unwrap(), sent);
            proptest::prop_assert!(d.is_done());
        }
    }
}
