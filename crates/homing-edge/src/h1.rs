//! HTTP/1.1 on the wire, both sides of the router, sans-IO: toward
//! clients, a request head parsed (httparse) straight out of the
//! connection's read buffer, its body framed (RFC 9112 §6.1–6.3) and, if
//! chunked, decoded, and a response head written straight into the write
//! buffer; toward actors, a request head written straight into the
//! connection's write buffer, a response head parsed out of its read buffer,
//! and the response body framed and decoded as the client's connection
//! task reads it. The router's HTTP/1.1 server side (client connections)
//! and its actor pool (actor connections) do the reads and writes; both use
//! the one body [`Decoder`] and the one head writer [`encode_request`].
//!
//! Bounds toward clients (hyper's, kept): a request head over
//! [`REQUEST_HEAD_BYTES_MAX`] or with more than [`REQUEST_HEADERS_MAX`]
//! headers is answered 431, a target over [`REQUEST_TARGET_BYTES_MAX`]
//! 414, anything else malformed 400. Toward actors: a response head over
//! [`RESPONSE_HEAD_BYTES_MAX`] or with more than [`RESPONSE_HEADERS_MAX`]
//! headers fails the forward. In either direction a chunk-size line over
//! [`CHUNK_LINE_BYTES_MAX`] and trailers over [`TRAILER_BYTES_MAX`] are
//! errors, never buffered further; trailers are read and dropped, not
//! forwarded.

use std::fmt::Write as _;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
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

/// Hop-by-hop headers (RFC 9110 §7.6.1), with `upgrade`: never forwarded.
pub(crate) const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A request's end-to-end headers, as the router forwards them.
#[derive(Clone, Copy)]
pub(crate) enum Headers<'a> {
    /// Parsed by hyper (HTTP/2), hop-by-hop headers already removed.
    Map(&'a HeaderMap),
    /// As an HTTP/1.1 client wrote them: hop-by-hop headers (and those the
    /// `connection` header names) are skipped here, as they are written.
    Raw(&'a [httparse::Header<'a>]),
}

impl Headers<'_> {
    /// Calls `f` with each end-to-end header's name and value.
    fn each(&self, mut f: impl FnMut(&[u8], &[u8])) {
        match self {
            Headers::Map(map) => {
                for (name, value) in *map {
                    f(name.as_str().as_bytes(), value.as_bytes());
                }
            }
            Headers::Raw(headers) => {
                for h in *headers {
                    if !is_hop_by_hop(h.name, headers) {
                        f(h.name.as_bytes(), h.value);
                    }
                }
            }
        }
    }

    /// The first value of the header `name` (lowercase).
    pub(crate) fn get(&self, name: &str) -> Option<&[u8]> {
        match self {
            Headers::Map(map) => map.get(name).map(HeaderValue::as_bytes),
            Headers::Raw(headers) => headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value),
        }
    }
}

/// Whether `name` is hop-by-hop in a message with these headers: one of
/// [`HOP_BY_HOP`] or named by a `connection` header.
fn is_hop_by_hop(name: &str, headers: &[httparse::Header<'_>]) -> bool {
    HOP_BY_HOP.iter().any(|hop| name.eq_ignore_ascii_case(hop))
        || headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .flat_map(|h| h.value.split(|b| *b == b','))
            .any(|token| token.trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
}

/// A header the router adds to a request: its name, and its value as
/// pieces written one after another (no formatting per request).
pub(crate) type Extra<'a> = (&'a HeaderName, &'a [&'a [u8]]);

/// Most digits of a `u64` in decimal.
pub(crate) const DECIMAL_BYTES_MAX: usize = 20;

/// `n` in decimal, written at the end of `buffer`.
pub(crate) fn decimal(n: u64, buffer: &mut [u8; DECIMAL_BYTES_MAX]) -> &[u8] {
    let mut at = DECIMAL_BYTES_MAX;
    let mut rest = n;
    loop {
        at -= 1;
        buffer[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            return &buffer[at..];
        }
    }
}

/// Appends a request head to `out`: `METHOD path HTTP/1.1`, `host`, the
/// headers of `headers` except `host`, `content-length` and the names in
/// `extra`, then `extra` and the body's `content-length`. Header values
/// hold no CR or LF (httparse and hyper's `HeaderValue` refuse them; the
/// router's own are DC names, reservation IDs and numbers).
pub(crate) fn encode_request(
    out: &mut Vec<u8>,
    method: &Method,
    path_and_query: &str,
    host: &HeaderValue,
    headers: Headers<'_>,
    extra: &[Extra<'_>],
    body_len: usize,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path_and_query.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    headers.each(|name, value| {
        if name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"content-length")
            || extra
                .iter()
                .any(|(n, _)| name.eq_ignore_ascii_case(n.as_str().as_bytes()))
        {
            return;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    });
    for (name, value) in extra {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        for piece in *value {
            out.extend_from_slice(piece);
        }
        out.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || states_empty_length(method) {
        out.extend_from_slice(b"content-length: ");
        let mut digits = [0; DECIMAL_BYTES_MAX];
        out.extend_from_slice(decimal(body_len as u64, &mut digits));
        out.extend_from_slice(b"\r\n");
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

/// A parsed response head: the final response's head bytes (1xx answers
/// before it skipped), taken out of the connection's buffer whole, and
/// what the router needs of it. Its headers are read from `head` again by
/// whoever forwards them ([`ResponseHead::headers`] into a hyper
/// `HeaderMap` for HTTP/2 clients, [`ResponseHead::parse`] for the
/// router's own HTTP/1.1 server side, which writes them on as they are).
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub(crate) status: StatusCode,
    /// The status line and the headers, up to the blank line.
    head: Bytes,
    pub(crate) framing: Framing,
    /// Whether the connection can carry another request after this body.
    pub(crate) keep_alive: bool,
}

/// Header slots of one response head, to parse into.
pub(crate) type ResponseSlots<'h> = [MaybeUninit<httparse::Header<'h>>; RESPONSE_HEADERS_MAX];

/// Fresh header slots (uninitialised: nothing to clear per response).
pub(crate) fn response_slots<'h>() -> ResponseSlots<'h> {
    [const { MaybeUninit::uninit() }; RESPONSE_HEADERS_MAX]
}

impl ResponseHead {
    /// The headers, parsed from the head again (it parsed once already, so
    /// this does not fail), as a client sees them: hop-by-hop headers are
    /// skipped by [`Headers::each`], and a body framed by
    /// `transfer-encoding` loses the `content-length` it may also claim.
    pub(crate) fn parse<'h>(
        &'h self,
        slots: &'h mut ResponseSlots<'h>,
    ) -> &'h [httparse::Header<'h>] {
        let mut response = httparse::Response::new(&mut []);
        let config = httparse::ParserConfig::default();
        match config.parse_response_with_uninit_headers(&mut response, &self.head, slots) {
            Ok(httparse::Status::Complete(_)) => response.headers,
            // The same bytes parsed complete once: not reached.
            _ => &mut [],
        }
    }

    /// Whether the `content-length` header passes on (the body is not
    /// framed by `transfer-encoding` nor by the close).
    pub(crate) fn keeps_length(&self) -> bool {
        !matches!(self.framing, Framing::Chunked | Framing::Close)
    }

    /// The end-to-end headers as a hyper `HeaderMap`, for HTTP/2 clients.
    pub(crate) fn headers(&self) -> HeaderMap {
        let mut slots = response_slots();
        let parsed = self.parse(&mut slots);
        let mut headers = HeaderMap::with_capacity(parsed.len());
        let keeps_length = self.keeps_length();
        Headers::Raw(parsed).each(|name, value| {
            if !keeps_length && name.eq_ignore_ascii_case(b"content-length") {
                return;
            }
            // httparse admits only what these admit too (tokens; visible
            // ASCII, space, tab and obs-text): nothing is skipped.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(self.head.slice_ref(value)),
            ) {
                headers.append(name, value);
            }
        });
        headers
    }
}

/// Parses the response head at the start of `buf`, skipping informational
/// (1xx) responses, and takes it out of `buf`. `Ok(None)`: not complete
/// yet; `head_request`: the request was HEAD.
pub(crate) fn parse_response(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<ResponseHead>, ParseError> {
    let config = httparse::ParserConfig::default();
    loop {
        let mut slots = response_slots();
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
        let (framing, keep_alive) = framing(response.headers, status, head_request, http11)?;
        // The head leaves the buffer whole: its headers are slices of it.
        let head = buf.split_to(len).freeze();
        return Ok(Some(ResponseHead {
            status,
            head,
            framing,
            keep_alive,
        }));
    }
}

/// The body framing of a response (RFC 9112 §6.3) and whether its
/// connection can be kept.
fn framing(
    headers: &[httparse::Header<'_>],
    status: StatusCode,
    head_request: bool,
    http11: bool,
) -> Result<(Framing, bool), ParseError> {
    let named = |name: &'static str| {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let close_asked = named("connection").any(|v| lists(v, "close"));
    let keep_alive = http11 && !close_asked;
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Empty, keep_alive));
    }
    if named("transfer-encoding").next().is_some() {
        let last = named("transfer-encoding")
            .flat_map(|v| v.split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .rfind(|c| !c.is_empty());
        // Both framings given: the length is not to be trusted, nor the connection.
        let both = named("content-length").next().is_some();
        return Ok(match last {
            Some(c) if c.eq_ignore_ascii_case(b"chunked") => {
                (Framing::Chunked, keep_alive && !both)
            }
            _ => (Framing::Close, false),
        });
    }
    Ok(match content_length(named("content-length"))? {
        Some(0) => (Framing::Empty, keep_alive),
        Some(n) => (Framing::Length(n), keep_alive),
        None => (Framing::Close, false),
    })
}

/// The body length `content-length` values state, if any: the same value
/// may repeat (`5, 5` or in several headers), different ones conflict.
fn content_length<'v>(values: impl Iterator<Item = &'v [u8]>) -> Result<Option<u64>, ParseError> {
    let mut length = None;
    for value in values {
        for part in value.split(|b| *b == b',') {
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
    Ok(length)
}

/// Whether a `transfer-encoding` or `connection` value lists `token`.
fn lists(value: &[u8], token: &str) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Largest request head (request line and headers) read from a client, in
/// bytes: hyper's read buffer bound, kept. Longer: 431.
pub(crate) const REQUEST_HEAD_BYTES_MAX: usize = 8192 + 4096 * 100;
/// Most headers of one request from a client (hyper's). More: 431.
pub(crate) const REQUEST_HEADERS_MAX: usize = 100;
/// Longest request target, in bytes (hyper's). Longer: 414.
pub(crate) const REQUEST_TARGET_BYTES_MAX: usize = 65_534;

/// Why a client's request head is refused: answered with [`HeadError::status`],
/// then the connection closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    /// Not HTTP/1.x, or a framing the router cannot trust (400).
    #[error("bad request head: {0}")]
    Malformed(String),
    /// Over [`REQUEST_HEAD_BYTES_MAX`] or [`REQUEST_HEADERS_MAX`] (431).
    #[error("request head too large")]
    TooLarge,
    /// A target over [`REQUEST_TARGET_BYTES_MAX`] (414).
    #[error("request target too long")]
    TargetTooLong,
}

impl HeadError {
    /// The status the client is answered with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            HeadError::Malformed(_) => StatusCode::BAD_REQUEST,
            HeadError::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::TargetTooLong => StatusCode::URI_TOO_LONG,
        }
    }
}

impl From<ParseError> for HeadError {
    fn from(e: ParseError) -> HeadError {
        HeadError::Malformed(e.0)
    }
}

/// Header slots of one request head, to parse into.
pub(crate) type RequestSlots<'h> = [MaybeUninit<httparse::Header<'h>>; REQUEST_HEADERS_MAX];

/// Fresh header slots (uninitialised: nothing to clear per request).
pub(crate) fn request_slots<'h>() -> RequestSlots<'h> {
    [const { MaybeUninit::uninit() }; REQUEST_HEADERS_MAX]
}

/// A client's request head, borrowing the bytes it was parsed from.
#[derive(Debug)]
pub(crate) struct RequestHead<'h> {
    pub(crate) method: Method,
    /// As written: origin form (`/path?query`) unless the client chose another.
    pub(crate) target: &'h str,
    pub(crate) http11: bool,
    pub(crate) headers: &'h [httparse::Header<'h>],
    /// How the body ends: `Empty`, `Length` or `Chunked`, never `Close`.
    pub(crate) body: Framing,
    /// Whether the connection can carry another request after this one.
    pub(crate) keep_alive: bool,
    /// `expect: 100-continue`: the client waits for a 100 before its body.
    pub(crate) expect_continue: bool,
}

/// The length of the request head at the start of `buf`; `Ok(None)` if it
/// is not complete yet (and within the bound).
pub(crate) fn request_head_len(buf: &[u8]) -> Result<Option<usize>, HeadError> {
    let mut slots = request_slots();
    let mut request = httparse::Request::new(&mut []);
    let config = httparse::ParserConfig::default();
    match config.parse_request_with_uninit_headers(&mut request, buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) if len > REQUEST_HEAD_BYTES_MAX => {
            Err(HeadError::TooLarge)
        }
        Ok(httparse::Status::Complete(len)) => Ok(Some(len)),
        Ok(httparse::Status::Partial) if buf.len() >= REQUEST_HEAD_BYTES_MAX => {
            Err(HeadError::TooLarge)
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooLarge),
        Err(e) => Err(HeadError::Malformed(e.to_string())),
    }
}

/// Parses the complete request head `head` (as [`request_head_len`] found
/// it) and frames its body as RFC 9112 §6.3 says for requests, the way
/// hyper did: `transfer-encoding` only on HTTP/1.1 and ending in `chunked`
/// (it then wins over `content-length`, and the connection closes after);
/// `content-length` values that agree; neither: no body.
pub(crate) fn parse_request<'h>(
    head: &'h [u8],
    slots: &'h mut RequestSlots<'h>,
) -> Result<RequestHead<'h>, HeadError> {
    let mut request = httparse::Request::new(&mut []);
    let config = httparse::ParserConfig::default();
    match config.parse_request_with_uninit_headers(&mut request, head, slots) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(HeadError::Malformed("partial".into())),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    }
    // Complete: httparse filled method, path and version.
    let (Some(method), Some(target), Some(version)) =
        (request.method, request.path, request.version)
    else {
        return Err(HeadError::Malformed("incomplete request line".into()));
    };
    if target.len() > REQUEST_TARGET_BYTES_MAX {
        return Err(HeadError::TargetTooLong);
    }
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| HeadError::Malformed("bad method".into()))?;
    let http11 = version == 1;
    let headers: &'h [httparse::Header<'h>] = request.headers;
    let mut keep_alive = http11;
    let mut close = false;
    let mut expect_continue = false;
    let mut chunked = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("connection") {
            close |= lists(h.value, "close");
            keep_alive |= lists(h.value, "keep-alive");
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return Err(HeadError::Malformed("transfer-encoding in HTTP/1.0".into()));
            }
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect_continue = h.value.eq_ignore_ascii_case(b"100-continue");
        }
    }
    let body = match chunked {
        Some(false) => {
            return Err(HeadError::Malformed(
                "transfer-encoding not ending in chunked".into(),
            ));
        }
        Some(true) => {
            // Both framings given: the length is not trusted, nor the connection.
            if headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("content-length"))
            {
                close = true;
            }
            Framing::Chunked
        }
        None => {
            let lengths = headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| h.value);
            match content_length(lengths)? {
                None | Some(0) => Framing::Empty,
                Some(n) => Framing::Length(n),
            }
        }
    };
    Ok(RequestHead {
        method,
        target,
        http11,
        headers,
        body,
        keep_alive: keep_alive && !close,
        expect_continue,
    })
}

/// The interim answer to `expect: 100-continue`.
pub(crate) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How a response body goes to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    /// No body (HEAD, 1xx, 204, 304): the head's own headers say the rest.
    None,
    /// The head carries `content-length`: the bytes as they come.
    Length,
    /// `transfer-encoding: chunked`: each piece framed as a chunk.
    Chunked,
    /// Until the router closes the connection (an HTTP/1.0 client).
    Close,
}

/// Appends a response head for a client to `out`: the status line,
/// `headers` (hop-by-hop ones skipped, `content-length` too unless
/// `sending` is `Length` or `None`), a `date` if they have none (RFC 9110
/// §6.6.1: a proxy adds one to a response without; so did hyper), the
/// framing header `sending` needs, `connection: close` unless
/// `keep_alive` (HTTP/1.0: `connection: keep-alive` if it is kept), and
/// the blank line.
pub(crate) fn encode_response(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: Headers<'_>,
    sending: Sending,
    keep_alive: bool,
    http11: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let keeps_length = matches!(sending, Sending::Length | Sending::None);
    let mut dated = false;
    headers.each(|name, value| {
        if !keeps_length && name.eq_ignore_ascii_case(b"content-length") {
            return;
        }
        dated |= name.eq_ignore_ascii_case(b"date");
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    });
    if !dated {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if sending == Sending::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if !http11 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends `data` framed as one chunk (nothing for no data: an empty chunk ends the body).
pub(crate) fn encode_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let _ = write!(Text(out), "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body (no trailers).
pub(crate) const CHUNKED_END: &[u8] = b"0\r\n\r\n";

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

/// One line (without its CRLF) taken out of `buf`; `None` if it is not
/// complete yet; an error if it is longer than `max`, ends in a bare LF or
/// holds a CR or another control byte. Chunk lines are read as strictly as
/// hyper reads them: a proxy in front that reads a lax line differently
/// would disagree with the router on where a body ends (request
/// smuggling), so none is accepted.
fn take_line(buf: &mut BytesMut, max: usize) -> Result<Option<BytesMut>, ParseError> {
    let Some(end) = buf.iter().take(max + 2).position(|b| *b == b'\n') else {
        if buf.len() > max + 1 {
            return Err(error("line too long in a chunked body"));
        }
        return Ok(None);
    };
    if end == 0 || buf[end - 1] != b'\r' {
        return Err(error("chunked body line not ended by CRLF"));
    }
    let mut line = buf.split_to(end + 1);
    line.truncate(end - 1);
    if line
        .iter()
        .any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f)
    {
        return Err(error("control byte in a chunked body line"));
    }
    Ok(Some(line))
}

/// The size of a chunk-size line (hex digits, optional spaces or tabs,
/// then optional extensions).
fn chunk_size(line: &[u8]) -> Result<u64, ParseError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let spaces = line[digits..]
        .iter()
        .take_while(|b| **b == b' ' || **b == b'\t')
        .count();
    let rest = &line[digits + spaces..];
    if digits == 0 || digits > 15 || !(rest.is_empty() || rest[0] == b';') {
        return Err(error("bad chunk size"));
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| error("bad chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| error("bad chunk size"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header;

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
    fn numbers_are_written_in_decimal() {
        let mut digits = [0; DECIMAL_BYTES_MAX];
        for n in [0, 7, 10, 99, 1_000_000, u64::MAX] {
            assert_eq!(decimal(n, &mut digits), n.to_string().as_bytes());
        }
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
            Headers::Map(&headers),
            &[(&dc, &[b"iad"])],
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
            Headers::Map(&HeaderMap::new()),
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
            head.headers().get(header::CONTENT_LENGTH),
            None,
            "the length goes"
        );
        let head = parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nx-a: b\r\ncontent-length: 1\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!(head.status, StatusCode::CREATED);
        assert_eq!(head.headers().get("x-a").unwrap(), "b");
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

    /// Chunk lines a lax reader would take, which a proxy in front may read
    /// otherwise (the "funky chunks" smuggling pattern): each refused, as
    /// hyper refuses them; spaces before an extension are fine.
    #[test]
    fn lax_chunk_lines_are_refused() {
        for (wire, what) in [
            (
                &b"2;\nxx\r\n0\r\n\r\n"[..],
                "a size line ended by a bare LF",
            ),
            (b"2;a\rb\r\nxx\r\n0\r\n\r\n", "a bare CR in an extension"),
            (b"2\r\r\nxx\r\n0\r\n\r\n", "CR CR LF after the size"),
            (
                b"2;a\x01\r\nxx\r\n0\r\n\r\n",
                "a control byte in an extension",
            ),
            (
                b"2\r\nxx\r\n0\r\nt: 1\n\r\n",
                "a trailer ended by a bare LF",
            ),
        ] {
            let mut d = Decoder::new(Framing::Chunked);
            assert!(body(&mut d, wire, 64).is_err(), "{what}");
        }
        let mut d = Decoder::new(Framing::Chunked);
        let spaced = b"2 \t;ext=1\r\nxx\r\n0\r\n\r\n";
        assert_eq!(body(&mut d, spaced, 64).unwrap(), b"xx");
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

    /// The request head at the start of `wire` and its body, read as a
    /// client connection reads them: `step` bytes at a time.
    fn read_request(wire: &[u8], step: usize) -> Result<(String, Vec<u8>, Framing), HeadError> {
        let mut buf = BytesMut::new();
        let mut pieces = wire.chunks(step);
        let len = loop {
            if let Some(len) = request_head_len(&buf)? {
                break len;
            }
            match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => return Err(HeadError::Malformed("eof in head".into())),
            }
        };
        assert!(len <= buf.len() && len <= REQUEST_HEAD_BYTES_MAX);
        let head = buf.split_to(len).freeze();
        let mut slots = request_slots();
        let request = parse_request(&head, &mut slots)?;
        let mut decoder = Decoder::new(request.body);
        let mut body = Vec::new();
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(d) => body.extend_from_slice(&d),
                Decoded::Done => break,
                Decoded::More => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => return Err(HeadError::Malformed("eof in body".into())),
                },
            }
        }
        let line = format!("{} {}", request.method, request.target);
        Ok((line, body, request.body))
    }

    fn head(text: &str) -> Result<(Framing, bool, bool), HeadError> {
        let len = request_head_len(text.as_bytes())?.expect("complete");
        let mut slots = request_slots();
        let request = parse_request(&text.as_bytes()[..len], &mut slots)?;
        Ok((request.body, request.keep_alive, request.expect_continue))
    }

    #[test]
    fn request_heads_are_framed_as_hyper_framed_them() {
        let cases = [
            ("GET / HTTP/1.1\r\nhost: a\r\n\r\n", Framing::Empty, true),
            (
                "POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "POST / HTTP/1.1\r\ncontent-length: 5, 5\r\n\r\n",
                Framing::Length(5),
                true,
            ),
            (
                "POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
                Framing::Empty,
                true,
            ),
            (
                "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
                Framing::Chunked,
                true,
            ),
            // Both framings: chunked wins, the connection closes after.
            (
                "POST / HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
                Framing::Chunked,
                false,
            ),
            (
                "GET / HTTP/1.1\r\nconnection: x, Close\r\n\r\n",
                Framing::Empty,
                false,
            ),
            ("GET / HTTP/1.0\r\n\r\n", Framing::Empty, false),
            (
                "GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n",
                Framing::Empty,
                true,
            ),
            ("\r\nGET / HTTP/1.1\r\n\r\n", Framing::Empty, true),
        ];
        for (text, framing, keep_alive) in cases {
            let (got, keep, _) = head(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((got, keep), (framing, keep_alive), "{text}");
        }
        let (_, _, expect) =
            head("POST / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n").unwrap();
        assert!(expect);
    }

    #[test]
    fn bad_oversized_and_partial_request_heads_are_refused_with_their_status() {
        assert_eq!(request_head_len(b"GET / HTTP/1.1\r\nhost: a"), Ok(None));
        for bad in [
            "POST / HTTP/1.1\r\ncontent-length: 1, 2\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: \r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert!(
                matches!(head(bad), Err(HeadError::Malformed(_))),
                "{bad}: {:?}",
                head(bad)
            );
        }
        for bad in [
            "HELLO\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "GET / HTTP/1.1\r\nbad header\r\n\r\n",
        ] {
            assert!(
                matches!(
                    request_head_len(bad.as_bytes()),
                    Err(HeadError::Malformed(_))
                ),
                "{bad}"
            );
        }
        let many: String = (0..=REQUEST_HEADERS_MAX)
            .map(|i| format!("x{i}: 1\r\n"))
            .collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(request_head_len(many.as_bytes()), Err(HeadError::TooLarge));
        let endless = format!(
            "GET / HTTP/1.1\r\nx: {}",
            "a".repeat(REQUEST_HEAD_BYTES_MAX)
        );
        assert_eq!(
            request_head_len(endless.as_bytes()),
            Err(HeadError::TooLarge)
        );
        let long = format!(
            "GET /{} HTTP/1.1\r\n\r\n",
            "a".repeat(REQUEST_TARGET_BYTES_MAX)
        );
        assert_eq!(head(&long), Err(HeadError::TargetTooLong));
        assert_eq!(HeadError::TooLarge.status(), 431);
        assert_eq!(HeadError::TargetTooLong.status(), 414);
    }

    #[test]
    fn raw_headers_are_forwarded_without_hop_by_hop_ones_or_those_connection_names() {
        let text = b"GET / HTTP/1.1\r\nHost: router\r\nConnection: keep-alive, X-Hop\r\nx-hop: 1\r\nUpgrade: h2c\r\nTE: trailers\r\nX-Kept: yes\r\nContent-Length: 0\r\nx-homing-dc: forged\r\n\r\n";
        let mut slots = request_slots();
        let request = parse_request(text, &mut slots).expect("parsed");
        let dc = HeaderName::from_static("x-homing-dc");
        let mut out = Vec::new();
        encode_request(
            &mut out,
            &request.method,
            request.target,
            &HeaderValue::from_static("127.0.0.1:9"),
            Headers::Raw(request.headers),
            &[(&dc, &[b"i", b"ad"])],
            0,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nhost: 127.0.0.1:9\r\nX-Kept: yes\r\nx-homing-dc: iad\r\n\r\n"
        );
        assert_eq!(
            Headers::Raw(request.headers).get("x-kept"),
            Some(&b"yes"[..])
        );
    }

    proptest::proptest! {
        /// A request of any headers and body, framed by length or chunks,
        /// read in any pieces, reads back as sent.
        #[test]
        fn a_request_reads_back_as_sent_however_it_is_framed_and_read(
            method in proptest::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH"]),
            path in "/[a-zA-Z0-9/._~%-]{0,40}",
            headers in proptest::collection::vec(("x-[a-z]{1,10}", "[ -~]{0,30}"), 0..8),
            sent in proptest::collection::vec(proptest::num::u8::ANY, 0..1024),
            chunk in proptest::option::of(1usize..300),
            step in 1usize..64,
        ) {
            let mut wire = format!("{method} {path} HTTP/1.1\r\nhost: h\r\n");
            for (name, value) in &headers {
                wire.push_str(&format!("{name}: {}\r\n", value.trim()));
            }
            let mut wire = wire.into_bytes();
            match chunk {
                Some(chunk) => {
                    wire.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                    for piece in sent.chunks(chunk) {
                        wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                        wire.extend_from_slice(piece);
                        wire.extend_from_slice(b"\r\n");
                    }
                    wire.extend_from_slice(b"0\r\n\r\n");
                }
                None => {
                    wire.extend_from_slice(format!("content-length: {}\r\n\r\n", sent.len()).as_bytes());
                    wire.extend_from_slice(&sent);
                }
            }
            let (line, body, _) = read_request(&wire, step).expect("a well-formed request");
            proptest::prop_assert_eq!(line, format!("{method} {path}"));
            proptest::prop_assert_eq!(body, sent);
        }

        /// Any bytes, alone or spliced into a well-formed request: refused
        /// with an error or read within the bounds, never a panic, and a
        /// head is never taken longer than the bytes or the bound.
        #[test]
        fn malformed_requests_are_refused_or_read_within_the_bounds(
            noise in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            at in 0usize..200,
            step in 1usize..64,
        ) {
            let valid = b"POST /a HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
            let at = at.min(valid.len());
            let mut spliced = valid[..at].to_vec();
            spliced.extend_from_slice(&noise);
            spliced.extend_from_slice(&valid[at..]);
            for wire in [&noise[..], &spliced[..]] {
                if let Ok((_, body, framing)) = read_request(wire, step) {
                    let bound = match framing {
                        Framing::Length(n) => n as usize,
                        _ => wire.len(),
                    };
                    proptest::prop_assert!(body.len() <= bound.min(wire.len()));
                }
            }
        }

        /// A chunk-size line or trailers that never end are refused within
        /// their bounds, however they are read.
        #[test]
        fn endless_chunk_lines_and_trailers_in_a_request_are_refused(
            step in 1usize..4096,
            trailers in proptest::bool::ANY,
        ) {
            let mut wire = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            if trailers {
                wire.extend_from_slice(b"0\r\n");
                wire.extend(std::iter::repeat_n(b"t: 1\r\n".as_slice(), TRAILER_BYTES_MAX / 6 + 2).flatten());
            } else {
                wire.extend(std::iter::repeat_n(b'1', CHUNK_LINE_BYTES_MAX + 8));
            }
            let refused = read_request(&wire, step);
            proptest::prop_assert!(
                matches!(&refused, Err(HeadError::Malformed(why)) if why.contains("long")),
                "{:?}", refused
            );
        }
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
